#!/usr/bin/env bash
# Nsight Compute's reading of the decode matmuls on the GPU machine (issue 15 asks for ncu numbers
# where a target is missed): the packed GEMV and the bf16 GEMV at batch 1, the packed tensor-core
# matmul at 64 sequences. Builds g4, then for each case profiles a few launches of the kernels named
# (speed of light, occupancy, warp state, memory workload) inside a short `g4 bench` run. ncu reads hardware
# counters only on some of the workplace's machine runtimes: where it cannot, its error is printed.
# Usage: tools/gpu_profile.sh; results in $OUT/ncu_*.csv and a summary on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/g4-profile}
mkdir -p "$OUT"
cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j16 --target g4 > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
G4=./build-gpu/g4
profile() {  # name, kernel regex, launches to skip, g4 arguments...
  local name=$1 kernels=$2 skip=$3
  shift 3
  timeout 240 ncu --clock-control none -k "regex:$kernels" --launch-skip "$skip" --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --csv --page details "$G4" "$@" > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.log" ||
    { echo "$name: ncu failed: $(tail -3 "$OUT/ncu_$name.log")"; return; }
  echo "== $name"
  grep -E '"(DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Duration|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|L1/TEX Hit Rate|L2 Hit Rate|Mem Busy|Max Bandwidth)"' \
    "$OUT/ncu_$name.csv" | awk -F'","' '{print $5 " | " $(NF-2) " " $(NF-1) " " $NF}' | tr -d '"' | sort | uniq | head -40
}
profile packed_gemv_q4_0 "packed_gemv|packed_gated" 400 bench --synthetic 31b --weights q4_0 --prompt_len 64 --gen 4
profile gemv_bf16 "gemv_kernel|gated_gelu_kernel" 400 bench --synthetic 31b --weights bf16 --prompt_len 64 --gen 4
profile packed_matmul_q4_0_64 "packed_matmul_kernel" 200 bench --synthetic 31b --weights q4_0 --batch_invariant false \
  --concurrency 64 --prompt_len 32 --gen 4
(cd "$OUT" && tar czf logs.tgz --remove-files -- *.log *.csv 2>/dev/null)
