#!/usr/bin/env bash
# Builds llama.cpp's TARGETs (build_llama.sh: CUDA, sm_90a, from SRC into LLAMA_BUILD) and g4
# (gpu-check preset, build-gpu/) side by side, logs in OUT (llama-build.log, g4-build.log); on a
# failure prints the failing log's tail and exits 1. The GPU side-by-side scripts share it.
#
#   tools/gpu/build_llama_and_g4.sh SRC LLAMA_BUILD OUT TARGET...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$3
bash "$here/build_llama.sh" "$@" &
llama_build=$!
(cmake -S "$root" --preset gpu-check -DG4_BUILD_TESTS=OFF -DG4_BUILD_BENCH=OFF > "$out/g4-build.log" 2>&1 &&
 cmake --build "$root/build-gpu" -j4 --target g4 >> "$out/g4-build.log" 2>&1) || { tail -20 "$out/g4-build.log"; exit 1; }
wait "$llama_build" || exit 1
echo "builds done at ${SECONDS}s"
