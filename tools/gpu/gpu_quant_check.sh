#!/usr/bin/env bash
# The quantized-weights checks for the GPU machine, in under 8 minutes: builds with CUDA, runs the
# packed-weight tests (test_cuda_quant, test_packed_blocks, and test_cuda_backend's op and demo
# tests) with G4_REQUIRE_GPU=1 (no GPU, or a skipped test, is a failure), then benchmarks the
# synthetic 31B model in q4_0, q4_k_m, q8_0 and bf16 (prompt 512, 64 generated tokens). Logs and
# the bench JSON go to $OUT (default /tmp/g4-gpu-quant). Exits non-zero on any failure.
# Usage: tools/gpu/gpu_quant_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/g4-gpu-quant}
mkdir -p "$OUT"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
started=$SECONDS

cmake --preset gpu-check > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j16 --target g4 test_cuda_quant test_packed_blocks test_cuda_backend > "$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "built in $((SECONDS - started)) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"

# gtest binaries directly (ctest would also run every other test of the tree).
run_tests() {  # name, gtest filter
  local log="$OUT/$1.log"
  G4_REQUIRE_GPU=1 timeout 240 "./build-gpu/tests/$1" --gtest_filter="$2" > "$log" 2>&1 || fail "$1 (see $log)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]|relative L2" "$log"
  ! grep -q "^\[  SKIPPED \]" "$log" || fail "$1: skipped tests"
}
run_tests test_packed_blocks "*"
run_tests test_cuda_quant "*"
run_tests test_cuda_backend "CudaOps.*:CudaDemoModel.*"

# Each bench: load_s, prefill, decode (plain and graph), bandwidth against the device's copy bandwidth.
for weights in q4_0 q4_k_m q8_0 bf16; do
  json="$OUT/bench_31b_$weights.json"
  timeout 150 ./build-gpu/g4 bench --synthetic 31b --weights "$weights" --prompt_len 512 --gen 64 > "$json" \
    2> "$OUT/bench_31b_$weights.stderr" || { fail "bench --weights $weights (see $json and .stderr)"; continue; }
  python3 - "$json" <<'EOF' || fail "bench --weights $weights: unreadable JSON"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['weights']:>7} (embedding {r['embedding_type']}): decode {r['decode_greedy_graph_tok_s']:.1f} tok/s "
      f"(graph; plain {r['decode_greedy_tok_s']:.1f}), {r['weight_gb_per_step']:.2f} GB/step, "
      f"{r['achieved_pct_of_copy']:.1f}% of copy; prefill 512: {r['prefill_tok_s']:.0f} tok/s; "
      f"GEMV lm_head {r['gemv_lm_head_tb_s']:.2f} TB/s, gate_proj {r['gemv_gate_proj_tb_s']:.2f}, "
      f"k_proj {r['gemv_k_proj_tb_s']:.2f}; bytes by type {r['weight_bytes_by_type']}")
EOF
done | tee "$OUT/bench_summary.log"
failures=$((failures + $(grep -c "^FAIL" "$OUT/bench_summary.log")))

echo "gpu_quant_check: $failures failure(s) in $((SECONDS - started)) s"
# One archive: the GPU machine returns at most 8 files.
(cd "$OUT" && tar czf logs.tgz --remove-files -- *.log *.json *.stderr gpu.txt 2>/dev/null)
[ "$failures" -eq 0 ]
