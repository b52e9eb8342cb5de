#!/usr/bin/env bash
# Regenerates tests/fixtures/quant/ from the real llama.cpp (its ggml-base library, CPU only):
#   llama.cpp release v0.5.0 source in .llamacpp/src, kept out of git (e.g. from the npm package
#   node-llama-cpp 3.22.1, which ships it as a git bundle); never committed
#   tools/make_quant_golden.sh [LLAMA_SRC=.llamacpp/src] [BUILD=/tmp/llama-cpu]
# GGML_NATIVE=OFF keeps ggml's reference code free of FMA contractions, as g4's quant code is, so
# the quantizers' float arithmetic is the same on both sides.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-$root/.llamacpp/src}
build=${2:-/tmp/llama-cpu}
out=$root/tests/fixtures/quant
[ -f "$src/ggml/include/ggml.h" ] || { echo "no llama.cpp source at $src (see the comment above)"; exit 1; }
cmake -S "$src" -B "$build" -DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
cmake --build "$build" -j2 --target ggml-base >/dev/null
lib=$(find "$build" -name 'libggml-base.so*' -o -name 'libggml-base.a' | head -n1)
c++ -std=c++17 -O2 -I"$src/ggml/include" -I"$root/tests/support" "$root/tools/llamacpp_golden.cpp" "$lib" -Wl,-rpath,"$(dirname "$lib")" \
  -o "$build/llamacpp_golden"
mkdir -p "$out"
"$build/llamacpp_golden" "$out"
echo "wrote $out from the llama.cpp source in $src"
