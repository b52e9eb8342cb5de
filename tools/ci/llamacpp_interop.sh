#!/usr/bin/env bash
# llama.cpp runs g4's exports: exports a checkpoint in each weight type, runs llama.cpp's
# llama-completion and g4 greedily on the same raw prompt, and prints both texts.
#   llama.cpp release v0.5.0 source in .llamacpp/src, kept out of git (e.g. from the npm package
#   node-llama-cpp 3.22.1, which ships it as a git bundle); never committed
#   tools/ci/llamacpp_interop.sh [LLAMA_SRC=.llamacpp/src] [BUILD=/tmp/llama-cpu] [G4=build/g4]
#                                [MODEL_DIR=tests/fixtures/demo/hf] [TYPES="bf16 q8_0 q4_0"]
# Environment: PROMPT (default below), N (tokens, default 32), OUT (files, default a temp dir),
# JOBS (build jobs, default nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=${1:-$root/.llamacpp/src}
build=${2:-/tmp/llama-cpu}
g4=${3:-$root/build/g4}
model_dir=${4:-$root/tests/fixtures/demo/hf}
types=${5:-bf16 q8_0 q4_0}
prompt=${PROMPT:-Once upon a time}
n=${N:-32}
out=${OUT:-$(mktemp -d)}
[ -f "$src/include/llama.h" ] || { echo "no llama.cpp source at $src (see the comment above)"; exit 1; }
[ -x "$g4" ] || { echo "no g4 binary at $g4"; exit 1; }
if [ ! -x "$build/bin/llama-completion" ]; then
  cmake -S "$src" -B "$build" -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"${JOBS:-$(nproc)}" --target llama-completion >/dev/null
fi
for t in $types; do
  file=$out/model-$t.gguf
  "$g4" export --model-dir "$model_dir" --output "$file" --weights "$t" >/dev/null
  echo "=== $t: llama.cpp ==="
  # --no-warmup and -no-cnv: one plain completion; the prompt is printed before the continuation.
  "$build/bin/llama-completion" -m "$file" -p "$prompt" -n "$n" --temp 0 --top-k 1 --seed 0 -no-cnv \
    --no-warmup -t 2 2>"$out/llama-$t.log" || { echo "llama-completion failed:"; tail -n 20 "$out/llama-$t.log"; }
  echo
  echo "=== $t: g4 ==="
  "$g4" run -m "$file" --raw_prompt --temperature 0 -n "$n" -p "$prompt" 2>&1 | sed '/--- report ---/,$d'
  echo
done
