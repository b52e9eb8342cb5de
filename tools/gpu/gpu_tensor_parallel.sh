#!/usr/bin/env bash
# Tensor parallel on a machine with two GPUs (docs/DESIGN.md "Tensor parallel", docs/PERF.md):
#   tools/gpu/gpu_tensor_parallel.sh build [KIT_DIR]   g4 (build-gpu/); with KIT_DIR, llama-bench
#                                                      (build-llama/) too, in a session of its own that
#                                                      outlives the call
#   tools/gpu/gpu_tensor_parallel.sh test              the tensor-parallel tests, the two-GPU ones included
#   tools/gpu/gpu_tensor_parallel.sh bench             g4 bench at --tp 1 and --tp 2 (peer-memory and NCCL
#                                                      all-reduce) on the synthetic 31B model
#   tools/gpu/gpu_tensor_parallel.sh peer KIT_DIR      a 31B-shaped GGUF file (TYPE, default q4_0): llama-bench
#                                                      with --split-mode none, layer and row, then g4 bench
#                                                      --tp 1 and --tp 2 on the same file
# KIT_DIR holds llama.cpp's source as llama-src.tar.xz with the kit's run_bench.sh and
# gen_gemma4_gguf.py (gpu_side_by_side.sh says how to make a slim tarball). Build folders are
# git-ignored and stay on a machine kept warm between calls. Logs and JSON go to OUT
# (default /tmp/g4-tp). Environment: WEIGHTS (bench; default "bf16 q4_0 q4_k_m"), GEN (default 64),
# CONCURRENCY (bench; default "64"), TYPE (peer; default q4_0).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
phase=${1:?usage: gpu_tensor_parallel.sh build|test|bench|peer [KIT_DIR]}
kit=${2:-}
OUT=${OUT:-/tmp/g4-tp}
WEIGHTS=${WEIGHTS:-bf16 q4_0 q4_k_m}
GEN=${GEN:-64}
CONCURRENCY=${CONCURRENCY:-64}
TYPE=${TYPE:-q4_0}
mkdir -p "$OUT"
G4=$root/build-gpu/g4
# One line of a g4 bench report: the keys that say what ran and how fast.
summary() {
  python3 -c "
import json,sys
d=json.loads(sys.stdin.read())
keys=['tp','weights','all_reduce_path','prefill_tok_s','decode_greedy_tok_s','decode_greedy_graph_tok_s',
      'step_ms_greedy_graph','collectives_ms_per_step','all_reduce_pct_of_step','achieved_pct_of_copy']
print('  ' + ', '.join(f'{k} {d[k]:.4g}' if isinstance(d[k], float) else f'{k} {d[k]}' for k in keys if k in d))
for r in d.get('runs', []):
    print('    concurrency', r.get('concurrency'), {k: v for k, v in r.items() if 'tok_s' in k or 'ms' in k})"
}
bench() {  # bench NAME ARGS...: g4 bench ARGS, the JSON to OUT/NAME.json, a summary line
  local name=$1
  shift
  echo "== g4 bench $* (at ${SECONDS}s)"
  "$G4" bench "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" || { echo "  FAILED"; tail -5 "$OUT/$name.log"; return; }
  summary < "$OUT/$name.json"
}

case $phase in
  build)
    if [ -n "$kit" ]; then  # llama-bench builds on in its own session while the next calls run
      [ -f /tmp/llama-src/src/CMakeLists.txt ] || { mkdir -p /tmp/llama-src && tar xJf "$kit/llama-src.tar.xz" -C /tmp/llama-src; }
      BUILD_DIR=$root/build-llama SRC=/tmp/llama-src/src OUT=$OUT JOBS=12 BUDGET_S=580 \
        setsid bash "$kit/run_bench.sh" build > "$OUT/llama-build.txt" 2>&1 < /dev/null &
    fi
    (cmake -S "$root" --preset cuda > "$OUT/g4-build.txt" 2>&1 &&
      cmake --build "$root/build-gpu" -j20 --target g4 test_tensor_parallel >> "$OUT/g4-build.txt" 2>&1) ||
      { grep -E "error|Error" "$OUT/g4-build.txt" | head -20; exit 1; }
    echo "g4 built at ${SECONDS}s"
    ;;
  test)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    nvidia-smi topo -m | head -4
    (cd "$root/build-gpu/tests" && G4_REQUIRE_GPU=1 timeout 540 ./test_tensor_parallel > "$OUT/test.log" 2>&1)
    status=$?
    grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|tests? ran|PASSED|FAILED" "$OUT/test.log" | tail -45
    exit $status
    ;;
  bench)
    for w in $WEIGHTS; do
      bench "tp1-$w" --synthetic 31b --weights "$w" --prompt_len 512 --gen "$GEN"
      bench "tp2-$w" --synthetic 31b --weights "$w" --prompt_len 512 --gen "$GEN" --tp 2
      bench "tp2-nccl-$w" --synthetic 31b --weights "$w" --prompt_len 512 --gen "$GEN" --tp 2 --tp_all_reduce nccl
    done
    for c in $CONCURRENCY; do
      bench "tp1-c$c" --synthetic 31b --weights q4_0 --concurrency "$c" --prompt_len 128 --gen 128 --cuda_graph
      bench "tp2-c$c" --synthetic 31b --weights q4_0 --concurrency "$c" --prompt_len 128 --gen 128 --cuda_graph --tp 2
    done
    ;;
  peer)
    [ -n "$kit" ] || { echo "peer needs KIT_DIR"; exit 1; }
    [ -f /tmp/llama-src/src/CMakeLists.txt ] || { mkdir -p /tmp/llama-src && tar xJf "$kit/llama-src.tar.xz" -C /tmp/llama-src; }
    export LLAMA_SRC=/tmp/llama-src/src  # gen_gemma4_gguf.py takes gguf-py from there
    f=/tmp/g4-31b-$TYPE.gguf
    python3 "$kit/gen_gemma4_gguf.py" "$f" --type "$TYPE" --fill pattern --threads 8 > "$OUT/gen.txt" 2>&1 &
    gen=$!
    if [ ! -x "$root/build-llama/bin/llama-bench" ]; then
      BUILD_DIR=$root/build-llama SRC=/tmp/llama-src/src OUT=$OUT JOBS=24 BUDGET_S=420 bash "$kit/run_bench.sh" build \
        > "$OUT/llama-build.txt" 2>&1 || { tail -5 "$OUT/llama-build.txt"; exit 1; }
      echo "== llama-bench built at ${SECONDS}s"
    fi
    wait "$gen" || { tail -5 "$OUT/gen.txt"; exit 1; }
    echo "== $TYPE file written at ${SECONDS}s"
    for sm in none layer row; do
      "$root/build-llama/bin/llama-bench" -m "$f" -p 512 -n 128 -fa 1 -ngl 99 -r 2 -sm "$sm" -o json \
        > "$OUT/llama-$sm.json" 2> "$OUT/llama-$sm.log"
      python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])):
    test = f\"pp{r['n_prompt']}\" if r['n_gen'] == 0 else f\"tg{r['n_gen']}\"
    print(f\"  llama.cpp -sm {sys.argv[2]} {test}: {r['avg_ts']:.1f} +- {r['stddev_ts']:.1f} tok/s\")" "$OUT/llama-$sm.json" "$sm" ||
        tail -3 "$OUT/llama-$sm.log"
    done
    bench "file-tp1" --model_path "$f" --prompt_len 512 --gen 128
    bench "file-tp2" --model_path "$f" --prompt_len 512 --gen 128 --tp 2
    rm -f "$f"
    ;;
  *) echo "phase must be build, test, bench or peer, got $phase"; exit 2 ;;
esac
echo "total ${SECONDS}s"
