#!/usr/bin/env bash
# Nsight Compute's reading of decode on the GPU machine (ncu numbers where a
# target is missed). Builds g4, then:
#   step     every kernel of about two batch-1 decode steps of the synthetic 31B in q4_0 (step_bf16:
#            in bf16), speed of light only: time and DRAM throughput per kernel, summed by kernel
#            and shape (tools/profile/ncu_step_summary.py), against the step time `g4 bench` measures (a
#            capture took 7 minutes on the H200: ncu replays each of ~1 000 launches);
#   kernels  the packed GEMV and the bf16 GEMV at batch 1 and the packed tensor-core matmul at 64
#            sequences in detail (speed of light, occupancy, warp state, memory workload).
# ncu reads hardware counters only on some of the workplace's machine runtimes: where it cannot, its
# error is printed. Usage: tools/profile/gpu_profile.sh [step] [step_bf16] [kernels] (step when none is
# named; each part fits one 10-minute call, two do not); results
# in $OUT/logs.tgz and a summary on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/g4-profile}
mkdir -p "$OUT"
modes=${*:-step}
cmake --preset gpu-check > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j16 --target g4 > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
G4=./build-gpu/g4
ncu_csv() {  # name, timeout, ncu arguments... (then the program and its arguments)
  local name=$1 limit=$2
  shift 2
  timeout "$limit" ncu --clock-control none --csv --page details "$@" > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.log" ||
    { echo "$name: ncu failed: $(tail -3 "$OUT/ncu_$name.log")"; return 1; }
}
profile() {  # name, kernel regex, launches to skip, g4 arguments...
  local name=$1 kernels=$2 skip=$3
  shift 3
  ncu_csv "$name" 240 -k "regex:$kernels" --launch-skip "$skip" --launch-count 4 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis "$G4" "$@" || return
  echo "== $name"
  grep -E '"(DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Duration|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|L1/TEX Hit Rate|L2 Hit Rate|Mem Busy|Max Bandwidth)"' \
    "$OUT/ncu_$name.csv" | awk -F'","' '{print $5 " | " $(NF-2) " " $(NF-1) " " $NF}' | tr -d '"' | sort | uniq | head -40
}
# A one-token prompt prefills through the decode kernels, so after the synthetic weights' fills
# every launch belongs to a batch-1 step: skip into the warm-up prefills and take ~2 steps.
step() {  # weights
  local w=$1
  "$G4" bench --synthetic 31b --weights "$w" --prompt_len 1 --gen 64 > "$OUT/bench_step_$w.json" 2>&1
  grep -E '"step_ms_greedy"|"decode_greedy_tok_s"' "$OUT/bench_step_$w.json"
  ncu_csv "step_$w" 400 --launch-skip 2500 --launch-count 1000 --section SpeedOfLight \
    "$G4" bench --synthetic 31b --weights "$w" --prompt_len 1 --gen 2 || return
  echo "== step_$w"
  python3 tools/profile/ncu_step_summary.py "$OUT/ncu_step_$w.csv"
}
for mode in $modes; do
  case $mode in
    step) step q4_0 ;;
    step_bf16) step bf16 ;;
    kernels)
      profile packed_gemv_q4_0 "packed_gemv|packed_gated" 400 bench --synthetic 31b --weights q4_0 --prompt_len 64 --gen 4
      profile gemv_bf16 "gemv_kernel|gated_gelu_kernel" 400 bench --synthetic 31b --weights bf16 --prompt_len 64 --gen 4
      profile packed_matmul_q4_0_64 "packed_matmul_kernel" 200 bench --synthetic 31b --weights q4_0 --batch_invariant false \
        --concurrency 64 --prompt_len 32 --gen 4 ;;
    *) echo "unknown mode $mode (step, step_bf16, kernels)"; exit 2 ;;
  esac
done
(cd "$OUT" && tar czf logs.tgz --remove-files -- *.log *.csv *.json 2>/dev/null)
