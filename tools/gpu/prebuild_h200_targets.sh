#!/usr/bin/env bash
# Builds, here, the four binaries tools/gpu/gpu_h200_targets.sh runs (g4, test_cuda_quantized_kv,
# test_cuda_backend, bench_layer_chain_cuda; sm_90a) and packs them for the GPU machine, whose first
# call then skips its two-minute build (G4_PREBUILT). Needs the CUDA compiler of the GPU machine's
# version (13.0). libstdc++ is linked statically and g4 serve is left out (the GPU machine has no
# cpp-httplib); the tests read their fixtures at this checkout's path, which the GPU script links
# to its own checkout when the two differ. Never commit the archive.
#
#   tools/gpu/prebuild_h200_targets.sh [ARCHIVE]   # default .gpu/h200-targets.tar.xz; ~44 MB
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:-$root/.gpu/h200-targets.tar.xz}")
build=${BUILD:-/tmp/g4-prebuilt}
export PATH=/usr/local/cuda/bin:$PATH
PKG_CONFIG_LIBDIR=/nonexistent cmake -S "$root" -B "$build" -DCMAKE_CUDA_ARCHITECTURES=90a -DG4_BUILD_TESTS=ON \
  -DG4_BUILD_BENCH=ON -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" > "$build.log" 2>&1
cmake --build "$build" -j"$(nproc)" --target g4 test_cuda_quantized_kv test_cuda_backend bench_layer_chain_cuda >> "$build.log" 2>&1 ||
  { grep -E "error" "$build.log" | head; exit 1; }
mkdir -p "$(dirname "$out")"
echo "$root" > "$build/source_dir.txt"
tar cf - -C "$build" source_dir.txt g4 tests/test_cuda_quantized_kv tests/test_cuda_backend bench/bench_layer_chain_cuda |
  xz -T"$(nproc)" -6 > "$out"
echo "$out ($(du -h "$out" | cut -f1))"
