#!/usr/bin/env bash
# Every GPU check in one go, for the device machine: build with CUDA, run the GPU tests, compare
# CUDA (with and without graphs) against the CPU on the demo model; with --bench also time the
# sampler and the synthetic 31B model (docs/PERF.md's figures).
# Logs go to $OUT (default /tmp/g4-gpu). Usage: tools/gpu_check.sh [--bench]
set -uo pipefail
OUT=${OUT:-/tmp/g4-gpu}
mkdir -p "$OUT"
# The real-head-dims fixture is too large to commit; carry it in .gpu/fixtures.
[ -d .gpu/fixtures/hf-gemma4/real-head-dims ] && cp -r .gpu/fixtures/hf-gemma4/real-head-dims tests/fixtures/hf-gemma4/
cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j16 --target g4 test_cuda_backend test_sampling_cuda bench_sampling > "$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

./build-gpu/tests/test_cuda_backend > "$OUT/test_cuda_backend.log" 2>&1; echo "test_cuda_backend rc=$?"
grep -E "relative L2|PASSED|FAILED" "$OUT/test_cuda_backend.log" | tail -25
./build-gpu/tests/test_sampling_cuda > "$OUT/test_sampling_cuda.log" 2>&1; echo "test_sampling_cuda rc=$?"
grep -E "PASSED|FAILED|mismatch|cases" "$OUT/test_sampling_cuda.log" | tail -8

G4=./build-gpu/g4
run() { "$G4" run --prompt "Tell me a fortune about computers." --max_new_tokens 48 "$@" 2>>"$OUT/run.log"; }
{
  for args in "--temperature 0" "--seed 42" "--seed 7 --top_k 0 --top_p 0.8 --min_p 0.05"; do
    cpu=$(run --backend cpu --print_token_ids $args | head -1)
    cuda=$(run --backend cuda --print_token_ids $args | head -1)
    graph=$(run --backend cuda --cuda_graph --print_token_ids $args | head -1)
    echo "demo [$args] cpu==cuda: $([ "$cpu" = "$cuda" ] && echo yes || echo NO) cuda==graph: $([ "$cuda" = "$graph" ] && echo yes || echo NO)"
    echo "  cpu:   $cpu"; echo "  cuda:  $cuda"; echo "  graph: $graph"
  done
  run --backend cuda --cuda_graph --seed 5
  tail -8 "$OUT/run.log"
} | tee "$OUT/demo.log"
if [ "${1:-}" = "--bench" ]; then
  ./build-gpu/bench/bench_sampling 2>&1 | tee "$OUT/bench_sampling.log" | tail -20
  "$G4" bench --synthetic 31b --weights bf16 --prompt_len 2048 --gen 128 2>&1 | tee "$OUT/bench_31b.json"
fi
