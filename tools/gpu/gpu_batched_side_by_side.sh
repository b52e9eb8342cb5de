#!/usr/bin/env bash
# Many sequences at once: g4's continuous batching beside llama.cpp's llama-batched-bench on the same
# 31B-shaped GGUF file, on the same GPU, one right after the other (docs/PERF.md). On the GPU
# machine, from the repository root:
#
#   tools/gpu/gpu_batched_side_by_side.sh KIT_DIR [all|build|bench]
#
# KIT_DIR holds llama.cpp's source as llama-src.tar.xz (fetch.sh's tarball of
# ../shared/tools/llamacpp, whose tools/ keep batched-bench) and the kit's gen_gemma4_gguf.py; never
# committed. `build` builds llama-batched-bench (CUDA, sm_90a, /tmp/llama-build) and g4 (build-gpu)
# side by side; `bench` writes the file, then for each N in NS runs llama-batched-bench (prompt 128,
# generate 128, N sequences, f16 caches, or LLAMA_KV's type) and g4 bench --concurrency N on it with
# bf16 caches, and at the largest N also both with q8_0 caches; `all` (the default) does both. The
# phases fit two calls on a machine kept warm (the build folders stay between calls).
# Environment: NS ("64 256"), PROMPT and GEN (128 each), TYPE (q4_0), LLAMA_KV (f16),
# OUT (/tmp/batched-side-by-side), PYTHON (python3, with numpy); COPIES=1 also runs g4 at each N
# without batch invariance, over bf16 weight copies (--bf16_weight_copies; the GPU needs room for
# them: 2 bytes a weight), q8_0 caches;
# FILE: a GGUF file of that shape and TYPE written ahead by the kit's gen_gemma4_gguf.py, taken when
# FILE.done is beside it (else written, /tmp/batched-TYPE.gguf);
# BACKEND=cpu TINY=1 LLAMA_BUILD=DIR G4=BINARY run the bench phase on the CPU with the kit's tiny
# shape and builds already made (how the script is tried without a GPU).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kit=$(cd "${1:?usage: gpu_batched_side_by_side.sh KIT_DIR [all|build|bench]}" && pwd)
phase=${2:-all}
case $phase in all|build|bench) ;; *) echo "phase must be all, build or bench, got $phase"; exit 2 ;; esac
OUT=${OUT:-/tmp/batched-side-by-side}
NS=${NS:-64 256}
TYPE=${TYPE:-q4_0}
LLAMA_KV=${LLAMA_KV:-f16}
PYTHON=${PYTHON:-python3}
PROMPT=${PROMPT:-128} GEN=${GEN:-128}
mkdir -p "$OUT"
src=/tmp/llama-src/src
export LLAMA_SRC=$src PYTHONPATH=$src/gguf-py
[ -f "$src/CMakeLists.txt" ] || { mkdir -p /tmp/llama-src && tar xJf "$kit/llama-src.tar.xz" -C /tmp/llama-src; }
LLAMA_BUILD=${LLAMA_BUILD:-/tmp/llama-build}
G4=${G4:-$root/build-gpu/g4}
BACKEND=${BACKEND:-cuda}
if [ "$phase" != bench ]; then
  bash "$root/tools/gpu/build_llama_and_g4.sh" "$src" "$LLAMA_BUILD" "$OUT" llama-batched-bench || exit 1
fi
[ "$phase" = build ] && exit 0
[ -x "$LLAMA_BUILD/bin/llama-batched-bench" ] && [ -x "$G4" ] || { echo "no builds: run the build phase first"; exit 1; }
shape=(); on_gpu=(-ngl 99 -fa 1); cpu=()
if [ "$BACKEND" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
else
  on_gpu=(); cpu=(-t "$(nproc)")
fi
[ "${TINY:-0}" = 1 ] && shape=(--tiny)
file=${FILE:-/tmp/batched-$TYPE.gguf}
if [ ! -f "$file.done" ]; then  # a file written ahead (FILE, with FILE.done beside it) is taken as it is
  "$PYTHON" "$kit/gen_gemma4_gguf.py" "$file" --type "$TYPE" "${shape[@]}" > "$OUT/gen.txt" 2>&1 || { tail -5 "$OUT/gen.txt"; exit 1; }
fi
largest=$(echo "$NS" | tr ' ' '\n' | sort -n | tail -1)

llama() {  # N KV_TYPE: llama-batched-bench's decode rate (S_TG) at N sequences
  local n=$1 kv=$2 log="$OUT/llama-$1-$2.txt"
  "$LLAMA_BUILD/bin/llama-batched-bench" -m "$file" -c $((n * (PROMPT + GEN) + 64)) -b 2048 -ub 512 -npp $PROMPT \
    -ntg $GEN -npl "$n" "${on_gpu[@]}" "${cpu[@]}" -ctk "$kv" -ctv "$kv" > "$log" 2>&1
  echo "llama.cpp $n sequences, $kv caches (rc $?): $(grep -E "^\|\s+$PROMPT \|" "$log" | tail -1)"
}
g4() {  # N KV_TYPE [MORE_FLAGS...]: g4 bench --concurrency N
  local n=$1 kv=$2 name="$OUT/g4-$1-$2" kv_flags=()
  shift 2
  [ $# -gt 0 ] && name="$name-copies"
  [ "$kv" != bf16 ] && kv_flags=(--kv_type "$kv" --kv_sliding_type "$kv")
  "$G4" bench --backend "$BACKEND" --model_path "$file" --concurrency "$n" --prompt_len $PROMPT --gen $GEN "${kv_flags[@]}" "$@" > "$name.json" 2> "$name.log"
  local rc=$?
  "$PYTHON" -c "
import json, sys
for r in json.load(open(sys.argv[1]))['runs']:
    steady = '%.1f tok/s' % r['full_decode_tok_s'] if 'full_decode_tok_s' in r else r['full_decode_missing']
    print('g4 %s sequences, %s caches%s: steady decode %s, all generated / wall %.1f tok/s, TTFT p50 %.2f s p99 %.2f s' % (
        r['concurrency'], sys.argv[2], sys.argv[3], steady, r['aggregate_tok_s'], r['ttft_p50_s'], r['ttft_p99_s']))" \
    "$name.json" "$kv" "${*:+ ($*)}" 2>/dev/null || { echo "g4 $n sequences, $kv caches: rc $rc"; tail -3 "$name.log"; }
}
for n in $NS; do
  llama "$n" "$LLAMA_KV"
  g4 "$n" bf16
done
llama "$largest" q8_0
g4 "$largest" q8_0
if [ "${COPIES:-0}" = 1 ]; then
  for n in $NS; do g4 "$n" q8_0 --batch_invariant false --bf16_weight_copies; done
fi
rm -f "$file" "$file.done"
echo "done at ${SECONDS}s; logs and JSON in $OUT"
