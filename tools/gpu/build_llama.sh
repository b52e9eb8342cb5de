#!/usr/bin/env bash
# Builds llama.cpp's TARGETs (CUDA, sm_90a) from the source at SRC into LLAMA_BUILD, log in
# OUT/llama-build.log; on a failure prints the log's tail and exits 1. Runs alone (say, in the
# background of a call whose GPU work needs few cores) or through build_llama_and_g4.sh.
#
#   tools/gpu/build_llama.sh SRC LLAMA_BUILD OUT TARGET...
set -uo pipefail
src=$1 llama_build_dir=$2 out=$3
shift 3
mkdir -p "$out"
noamx=()  # the host compiler may not know AMX, which ggml's -march=native would ask for
echo 'int main(){return 0;}' | cc -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -x c - -o /dev/null 2>/dev/null &&
  noamx=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
(cmake -S "$src" -B "$llama_build_dir" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_CURL=OFF \
   -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
   -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF "${noamx[@]}" > "$out/llama-build.log" 2>&1 &&
 cmake --build "$llama_build_dir" --target "$@" -j 12 >> "$out/llama-build.log" 2>&1) || { tail -20 "$out/llama-build.log"; exit 1; }
echo "llama.cpp built at ${SECONDS}s"
