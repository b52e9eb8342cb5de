#!/usr/bin/env bash
# The batched-decode checks for the GPU machine: builds, then the parts named
# (default: all; each fits a 10-minute call alone, not all together): `tests` runs the sampler,
# packed-weight and scheduler tests with G4_REQUIRE_GPU=1 and times the sampler (bench_sampling)
# and the packed GEMV's 31B matrices alone (bench_packed_gemv_cuda), and whether prefetching the
# next matrix into L2 across a kernel boundary pays (bench_l2_prefetch_cuda: q/k/v, attention's
# gap, o_proj; gate/up, a quantize launch, down_proj; Q4_0 sizes), and whether a persistent
# cooperative kernel keeps the weight stream going across a layer's matrices (bench_layer_chain_cuda);
# `suite` runs `g4 bench --suite` on the synthetic 31B model (q4_0, q4_k_m, q8_0, bf16);
# `concurrency` runs continuous batching at 1, 8, 32 and 64 sequences (q4_0 batch
# invariant and not, bf16 not); `steady` the steady state of 16 and 64 sequences per weight type,
# not invariant; `crossover` times a layer's Q4_0 GEMVs and packed tensor-core matmul at 2..64
# rows, and the Q4_0 records matmul of bench_q4_0_records_cuda at 1..64 tokens; `graphs` the scheduler's decode steps eager
# and replayed as CUDA graphs (--cuda_graph) at 1, 8 and 64 sequences. Logs in one archive,
# $OUT/logs.tgz. Usage: tools/gpu/gpu_batch_check.sh [tests] [suite] [concurrency] [steady] [crossover] [graphs]
set -uo pipefail
set -f  # the gtest filters below ('*Cuda*') are not file names
parts="$*"
OUT=${OUT:-/tmp/g4-gpu-batch}
mkdir -p "$OUT"
started=$SECONDS
cmake --preset gpu-check > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j16 --target g4 test_cuda_quant test_cuda_backend test_scheduler test_sessions test_sampling_cuda \
  bench_sampling bench_packed_gemv_cuda bench_q4_0_records_cuda bench_l2_prefetch_cuda bench_layer_chain_cuda > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "built in $((SECONDS - started)) s"
want() { [ -z "$parts" ] || [[ " $parts " == *" $1 "* ]]; }
if want tests; then
  for t in "test_sampling_cuda *" "test_cuda_quant *" "test_cuda_backend CudaOps.*:CudaDemoModel.*" "test_scheduler *Cuda*" \
           "test_sessions *Cuda*"; do
    set -- $t
    G4_REQUIRE_GPU=1 timeout 150 "./build-gpu/tests/$1" --gtest_filter="$2" > "$OUT/$1.log" 2>&1; echo "$1 rc=$?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]|FAILED  \]" "$OUT/$1.log" | head -12
  done
  timeout 90 ./build-gpu/bench/bench_sampling 1,8,16,32,64 > "$OUT/bench_sampling.log" 2>&1; head -12 "$OUT/bench_sampling.log"
  timeout 90 ./build-gpu/bench/bench_packed_gemv_cuda > "$OUT/bench_packed_gemv.log" 2>&1; cat "$OUT/bench_packed_gemv.log"
  for shape in "50 25 24 24" "130 65 3 40"; do timeout 30 ./build-gpu/bench/bench_l2_prefetch_cuda $shape; done
  timeout 60 ./build-gpu/bench/bench_layer_chain_cuda 8
fi
# The targets' table per weight type: pp512, pp2048, decode after 1 k and 32 k tokens, % of copy.
if want suite; then
  for w in q4_0 q4_k_m q8_0 bf16; do
    left=$((585 - (SECONDS - started)))
    [ $left -gt 30 ] || { echo "no time left for the suite of $w"; continue; }
    timeout $left ./build-gpu/g4 bench --synthetic 31b --weights $w --suite --gen 64 > "$OUT/suite_$w.json" 2>&1
    tr -d ' \n' < "$OUT/suite_$w.json" | grep -oE '"(prefill_tok_s|decode_greedy_tok_s)":\{[^}]*\}|"achieved_pct_of_copy":[0-9.]+' | tr '\n' ' '
    echo " [$w]"
  done
fi
# Continuous batching, batch invariant (the default) and not (whole forwards: the packed tensor-core
# matmul for quantized weights, cuBLAS for bf16).
if want concurrency; then
  for run in "q4_0 true 1,8,32,64" "q4_0 false 1,8,32,64" "bf16 false 16,64"; do
    set -- $run
    left=$((585 - (SECONDS - started)))
    [ $left -gt 30 ] || { echo "no time left for concurrency $run"; continue; }
    timeout $left ./build-gpu/g4 bench --synthetic 31b --weights $1 --batch_invariant $2 --concurrency $3 \
      --prompt_len 128 --gen 32 > "$OUT/conc_$1_$2.json" 2>&1
    tr -d ' \n' < "$OUT/conc_$1_$2.json" | grep -oE '"(concurrency|full_decode_step_ms|full_decode_tok_s|aggregate_tok_s|ttft_p50_s|sampler_us)":[0-9.]+' | tr '\n' ' '
    echo " [$1 batch_invariant=$2]"
  done
fi
# The steady state of 16 and 64 sequences without invariance (whole forwards: the packed tensor-core
# matmul for quantized weights, cuBLAS for bf16): full decode steps, 256 tokens each.
if want steady; then
  for w in q4_0 q4_k_m q8_0 bf16; do
    left=$((585 - (SECONDS - started)))
    [ $left -gt 30 ] || { echo "no time left for the steady state of $w"; continue; }
    timeout $left ./build-gpu/g4 bench --synthetic 31b --weights $w --batch_invariant false --concurrency 16,64 \
      --prompt_len 128 --gen 256 > "$OUT/steady_$w.json" 2>&1
    tr -d ' \n' < "$OUT/steady_$w.json" | grep -oE '"(concurrency|full_decode_step_ms|full_decode_tok_s|aggregate_tok_s)":[0-9.]+' | tr '\n' ' '
    echo " [$w]"
  done
fi
# Few rows: the GEMVs as the backend runs them against the packed tensor-core matmul.
if want crossover; then
  for t in 2 4 5 8 16 32 64; do
    timeout 60 ./build-gpu/bench/bench_packed_gemv_cuda q4_0 $t > "$OUT/crossover_$t.log" 2>&1
    grep -E " us|error" "$OUT/crossover_$t.log"
  done
  # The Q4_0 records matmul at 1..64 tokens (docs/DESIGN.md §7).
  timeout 120 ./build-gpu/bench/bench_q4_0_records_cuda > "$OUT/q4_0_records.log" 2>&1; cat "$OUT/q4_0_records.log"
fi
# The scheduler's decode steps eager and replayed, alternating, each mode twice (q4_0).
if want graphs; then
  for run in "true 1,8" "false 1,8,64" "true 1,8" "false 1,8,64"; do
    set -- $run
    for graph in "" "--cuda_graph"; do
      left=$((585 - (SECONDS - started)))
      [ $left -gt 30 ] || { echo "no time left for graphs $run $graph"; continue; }
      log="$OUT/graphs_$1_${graph:-eager}_$SECONDS.json"
      timeout $left ./build-gpu/g4 bench --synthetic 31b --weights q4_0 --batch_invariant $1 --concurrency $2 \
        --prompt_len 128 --gen 64 $graph > "$log" 2>&1
      tr -d ' \n' < "$log" | grep -oE '"(concurrency|full_decode_step_ms|full_decode_tok_s|replayed_steps)":[0-9.]+' | tr '\n' ' '
      echo " [batch_invariant=$1 ${graph:-eager}]"
    done
  done
fi
echo "done in $((SECONDS - started)) s"
(set +f; cd "$OUT" && tar czf logs.tgz --remove-files -- *.log *.json 2>/dev/null)  # globs: set -f is for the filters
