#!/usr/bin/env bash
# g4 and llama.cpp on the same 31B-shaped GGUF files, on the same GPU, one right after the other
# (docs/PERF.md). On the GPU machine:
#   tools/gpu/gpu_side_by_side.sh KIT_DIR [all|build|bench]
# KIT_DIR holds llama.cpp's source as llama-src.tar.xz and the kit's run_bench.sh and
# gen_gemma4_gguf.py (copies of ../shared/tools/llamacpp; never committed). `build` builds
# llama-bench (CUDA, sm_90a, in build-llama/) and g4 (build-gpu/) side by side; `bench` then, for
# each type, writes the file (random-looking blocks), runs llama-bench on it, then g4 bench
# --model_path on it, and deletes it; `all` (the default) does both. The two phases fit two calls on
# a machine kept warm (the build folders are git-ignored and stay there between calls).
# fetch.sh's tarball (8 MB) and the tracked tree together exceed the device's 64 MiB carry; a slim
# one (4 MB) builds llama-bench just as well: from the fetched src/, drop .github .devops benches
# docs examples pocs tests tools/ui tools/server media and ggml/src/ggml-<backend> for every backend
# but cpu and cuda, then `tar cJf KIT_DIR/llama-src.tar.xz src`.
# Environment: TYPES (default "q4_0 q4_k q8_0"; "q4_k" gets a Q6_K embedding, like Q4_K_M),
# LLAMA_ARGS (default "-p 512,2048 -n 128 -fa 1 -ngl 99 -r 2"), G4_ARGS (default "--suite --gen 128":
# pp512, pp2048, decode at 1 k and 32 k), OUT (results, default /tmp/side-by-side).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kit=$(cd "$1" && pwd)
phase=${2:-all}
case $phase in all|build|bench) ;; *) echo "phase must be all, build or bench, got $phase"; exit 2 ;; esac
OUT=${OUT:-/tmp/side-by-side}
TYPES=${TYPES:-q4_0 q4_k q8_0}
LLAMA_ARGS=${LLAMA_ARGS:--p 512,2048 -n 128 -fa 1 -ngl 99 -r 2}
G4_ARGS=${G4_ARGS:---suite --gen 128}
mkdir -p "$OUT"
export BUILD_DIR=$root/build-llama
[ -f /tmp/llama-src/src/CMakeLists.txt ] || { mkdir -p /tmp/llama-src && tar xJf "$kit/llama-src.tar.xz" -C /tmp/llama-src; }
export LLAMA_SRC=/tmp/llama-src/src  # gen_gemma4_gguf.py takes gguf-py from there
if [ "$phase" != bench ]; then
  (SRC=/tmp/llama-src/src OUT=$OUT JOBS=12 BUDGET_S=480 bash "$kit/run_bench.sh" build > "$OUT/llama-build.txt" 2>&1) &
  llama_build=$!
  (cmake -S "$root" --preset cuda > "$OUT/g4-build.txt" 2>&1 &&
    cmake --build "$root/build-gpu" -j4 --target g4 >> "$OUT/g4-build.txt" 2>&1) || { tail -20 "$OUT/g4-build.txt"; exit 1; }
  wait "$llama_build" || { tail -20 "$OUT/llama-build.txt"; exit 1; }
  echo "builds done at ${SECONDS}s"
fi
[ "$phase" = build ] && exit 0
[ -x "$BUILD_DIR/bin/llama-bench" ] && [ -x "$root/build-gpu/g4" ] || { echo "no builds: run the build phase first"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
for t in $TYPES; do
  f=/tmp/g4-31b-$t.gguf
  embd=(); [ "$t" = q4_k ] && embd=(--embd-type q6_k)
  python3 "$kit/gen_gemma4_gguf.py" "$f" --type "$t" "${embd[@]}" --fill pattern --threads 12 > "$OUT/gen-$t.txt" 2>&1 ||
    { echo "gen $t failed"; tail -5 "$OUT/gen-$t.txt"; continue; }
  echo "=== $t ($(du -h --apparent-size "$f" | cut -f1)) at ${SECONDS}s"
  # shellcheck disable=SC2086
  "$BUILD_DIR/bin/llama-bench" -m "$f" $LLAMA_ARGS -o json > "$OUT/llama-$t.json" 2> "$OUT/llama-$t.log"
  python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])):
    test = f\"pp{r['n_prompt']}\" if r['n_gen'] == 0 else f\"tg{r['n_gen']}\"
    print(f\"  llama.cpp {test}: {r['avg_ts']:.1f} +- {r['stddev_ts']:.1f} tok/s\")" "$OUT/llama-$t.json"
  # shellcheck disable=SC2086
  "$root/build-gpu/g4" bench --model_path "$f" $G4_ARGS > "$OUT/g4-$t.json" 2> "$OUT/g4-$t.log"
  python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('  g4 prefill tok/s', d['prefill_tok_s'], 'decode tok/s', d['decode_greedy_tok_s'],
      'at %.1f %% of copy (%.2f TB/s)' % (d['achieved_pct_of_copy'], d['copy_tb_s']))" "$OUT/g4-$t.json" ||
    tail -5 "$OUT/g4-$t.json"
  rm -f "$f"
done
echo "total ${SECONDS}s"
