#!/usr/bin/env bash
# The single-GPU figures whose targets are set on the H200: many long sequences held at once
# (quantized caches), decode at 131 072 and 262 144 tokens of context, the drafted 31B pair at a
# forced acceptance, many sequences over bf16 weight copies, the GPU tests of the quantized caches and
# the CUDA ops, and the persistent decode kernel's premise (bench_layer_chain_cuda: a launch per
# matrix against one dataflow launch). Builds g4, the two test binaries and the bench in build-gpu
# (gpu-check preset; G4_VALIJSON_INCLUDE: valijson's headers when the machine has none), or unpacks
# them from G4_PREBUILT (an archive of tools/gpu/prebuild_h200_targets.sh), then runs
# the STEPs asked for (all by default), each under its own time limit, JSON and logs under $OUT
# (default /tmp/g4-h200):
#   tests    test_cuda_quantized_kv, test_cuda_backend CudaOps.* (the demo tests read tests/fixtures/demo)
#   chain    bench_layer_chain_cuda 8
#   drafted  g4 bench --synthetic 31b --weights q4_0 --draft_model synthetic --draft_tokens 4|3 --draft_accept 2.5
#   held     g4 bench --synthetic 31b --weights q4_0 --held 1,$HELD --prompt_len 131072 --kv_type tq4 --kv_sliding_type q8_0
#   suite    g4 bench --synthetic 31b --weights q4_0 --suite --suite_contexts 131072,262144 (same caches)
#   copies   g4 bench --synthetic 31b --weights q4_0 --concurrency 32,64,128,256 --batch_invariant false
#            (q8_0 caches) with --bf16_weight_copies, and 64,256 without
# HELD (default 32) and the copies need the H200's memory (run's needs_h200). Steps of one call add
# up to ten minutes at most: tests chain drafted copies in one call, held suite in a second on the
# machine kept warm (build-gpu stays between calls).
# Usage: tools/gpu/gpu_h200_targets.sh [STEP...]
set -uo pipefail
steps=" ${*:-tests chain drafted held suite copies} "
for s in $steps; do
  case $s in tests|chain|drafted|held|suite|copies) ;; *) echo "unknown step $s"; exit 2 ;; esac
done
asked() { [[ $steps == *" $1 "* ]]; }
OUT=${OUT:-/tmp/g4-h200}
HELD=${HELD:-32}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$SECONDS
if [ -n "${G4_PREBUILT:-}" ]; then  # binaries built elsewhere (tools/gpu/prebuild_h200_targets.sh)
  mkdir -p build-gpu && tar xJf "$G4_PREBUILT" -C build-gpu || exit 1
  built_at=$(cat build-gpu/source_dir.txt)  # where the tests look for tests/fixtures
  [ "$built_at" -ef . ] || [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
  ./build-gpu/g4 --version || { echo "the prebuilt g4 does not run here"; exit 1; }
else
  valijson=()
  [ -n "${G4_VALIJSON_INCLUDE:-}" ] && valijson=(-DG4_VALIJSON_INCLUDE="$G4_VALIJSON_INCLUDE")
  (cmake --preset gpu-check -DG4_BUILD_TESTS=ON -DG4_BUILD_BENCH=ON "${valijson[@]}" &&
   cmake --build build-gpu -j"$(nproc)" --target g4 test_cuda_quantized_kv test_cuda_backend bench_layer_chain_cuda) > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head; exit 1; }
fi
echo "built in $((SECONDS - t0)) s"
if asked tests; then
  G4_REQUIRE_GPU=1 ./build-gpu/tests/test_cuda_quantized_kv > "$OUT/test_cuda_quantized_kv.log" 2>&1
  echo "test_cuda_quantized_kv rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_cuda_quantized_kv.log" | tr '\n' ' ')"
  G4_REQUIRE_GPU=1 ./build-gpu/tests/test_cuda_backend --gtest_filter='CudaOps.*' > "$OUT/test_cuda_backend.log" 2>&1
  echo "test_cuda_backend CudaOps.* rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_cuda_backend.log" | tr '\n' ' ')"
  grep -hE "Failure|Expected|Which is|^\[  FAILED" "$OUT"/test_cuda_*.log | head -20
fi
if asked chain; then
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
  tail -2 "$OUT/$name.log"
}
if asked drafted; then
  bench drafted_k4 60 --prompt_len 512 --gen 129 --draft_model synthetic --draft_tokens 4 --draft_accept 2.5
  bench drafted_k3 60 --prompt_len 512 --gen 129 --draft_model synthetic --draft_tokens 3 --draft_accept 2.5
fi
many=(--prompt_len 128 --gen 128 --batch_invariant false --kv_type q8_0 --kv_sliding_type q8_0)
asked copies && bench copies 120 --concurrency 32,64,128,256 "${many[@]}" --bf16_weight_copies
asked copies && bench no_copies 90 --concurrency 64,256 "${many[@]}"
asked held && bench held 160 --held "1,$HELD" --prompt_len 131072 --gen 8 --kv_type tq4 --kv_sliding_type q8_0
asked suite && bench suite_tq4 220 --suite --suite_prompts 512 --suite_contexts 131072,262144 --gen 32 --kv_type tq4 --kv_sliding_type q8_0
echo "done at $((SECONDS - t0)) s"
