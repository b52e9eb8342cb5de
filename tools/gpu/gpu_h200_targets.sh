#!/usr/bin/env bash
# The single-GPU figures whose targets are set on the H200, in one call of under ten minutes: many
# long sequences held at once (quantized caches), decode at 131 072 and 262 144 tokens of context,
# the drafted 31B pair at a forced acceptance, the quantized caches' GPU tests, and the persistent
# decode kernel's premise (bench_layer_chain_cuda: a launch per matrix against one dataflow launch).
# Builds g4, the two test binaries and the bench in build-gpu (gpu-check preset; G4_VALIJSON_INCLUDE: valijson's headers when the
# machine has none), then, each under its own time limit, JSON and logs under $OUT (default
# /tmp/g4-h200):
#   g4 bench --synthetic 31b --weights q4_0 --held 1,$HELD --prompt_len 131072 --kv_type tq4 --kv_sliding_type q8_0
#   g4 bench --synthetic 31b --weights q4_0 --suite --suite_contexts 131072,262144 (same caches)
#   g4 bench --synthetic 31b --weights q4_0 --draft_model synthetic --draft_tokens 4|3 --draft_accept 2.5
# HELD (default 32) needs the H200's memory (run's needs_h200); the demo tests read tests/fixtures/demo.
# The phases fit calls of under ten minutes on a machine kept warm (build-gpu stays between calls):
# `short` builds, runs the tests, the bench and the drafted pair; `long` the held sequences and the
# suite; `all` (the default) both.
# Usage: tools/gpu/gpu_h200_targets.sh [all|short|long]
set -uo pipefail
phase=${1:-all}
case $phase in all|short|long) ;; *) echo "phase must be all, short or long, got $phase"; exit 2 ;; esac
OUT=${OUT:-/tmp/g4-h200}
HELD=${HELD:-32}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$SECONDS
valijson=()
[ -n "${G4_VALIJSON_INCLUDE:-}" ] && valijson=(-DG4_VALIJSON_INCLUDE="$G4_VALIJSON_INCLUDE")
(cmake --preset gpu-check -DG4_BUILD_TESTS=ON -DG4_BUILD_BENCH=ON "${valijson[@]}" &&
 cmake --build build-gpu -j"$(nproc)" --target g4 test_cuda_quantized_kv test_cuda_backend bench_layer_chain_cuda) > "$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head; exit 1; }
echo "built in $((SECONDS - t0)) s"
if [ "$phase" != long ]; then
  G4_REQUIRE_GPU=1 ./build-gpu/tests/test_cuda_quantized_kv > "$OUT/test_cuda_quantized_kv.log" 2>&1
  echo "test_cuda_quantized_kv rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_cuda_quantized_kv.log" | tr '\n' ' ')"
  G4_REQUIRE_GPU=1 ./build-gpu/tests/test_cuda_backend --gtest_filter='CudaOps.*' > "$OUT/test_cuda_backend.log" 2>&1
  echo "test_cuda_backend CudaOps.* rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_cuda_backend.log" | tr '\n' ' ')"
  timeout 60 ./build-gpu/bench/bench_layer_chain_cuda 8 > "$OUT/layer_chain.log" 2>&1
  echo "bench_layer_chain_cuda 8 rc=$?:"; cat "$OUT/layer_chain.log"
fi
bench() {  # NAME SECONDS ARGS...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" ./build-gpu/g4 bench --synthetic 31b --weights q4_0 "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
  echo "== $name rc=$? at $((SECONDS - t0)) s"
  tr -d '\n' < "$OUT/$name.json" | head -c 2000
  echo
}
if [ "$phase" != long ]; then
  bench drafted_k4 60 --prompt_len 512 --gen 129 --draft_model synthetic --draft_tokens 4 --draft_accept 2.5
  bench drafted_k3 60 --prompt_len 512 --gen 129 --draft_model synthetic --draft_tokens 3 --draft_accept 2.5
fi
[ "$phase" = short ] && exit 0
bench held 160 --held "1,$HELD" --prompt_len 131072 --gen 8 --kv_type tq4 --kv_sliding_type q8_0
bench suite_tq4 220 --suite --suite_prompts 512 --suite_contexts 131072,262144 --gen 32 --kv_type tq4 --kv_sliding_type q8_0
