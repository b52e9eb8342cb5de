#!/usr/bin/env bash
# Makes the kit tools/gpu/gpu_draft_side_by_side.sh takes to the GPU machine: a slim copy of
# llama.cpp's source that builds llama-speculative-simple (CUDA and CPU backends only, the one
# example) as llama-src.tar.xz (~4 MB; the fetched tarball is 8 MB and the tracked tree leaves no
# room for it), and the kit's gen_gemma4_gguf.py. Run here; never commit the result.
#
#   tools/gpu/make_draft_kit.sh LLAMACPP_DIR [OUT_DIR]   # LLAMACPP_DIR: a fetch.sh result (../shared/tools/llamacpp)
#   # default OUT_DIR: .gpu/draft-kit; then, on the GPU machine (run's carry: [".gpu/draft-kit"]):
#   tools/gpu/gpu_draft_side_by_side.sh .gpu/draft-kit
set -euo pipefail
llama=$(cd "${1:?usage: make_draft_kit.sh LLAMACPP_DIR [OUT_DIR]}" && pwd)
out=$(realpath -m "${2:-.gpu/draft-kit}")
[ -f "$llama/gen_gemma4_gguf.py" ] && [ -f "$llama/src/CMakeLists.txt" ] || { echo "no gen_gemma4_gguf.py and src/ in $llama (run its fetch.sh)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$llama/src" "$work/src"
(cd "$work/src" && rm -rf .git .github .devops benches docs pocs tests tools/ui tools/server media models)
(cd "$work/src/examples" && find . -mindepth 1 -maxdepth 1 ! -name speculative-simple -exec rm -rf {} +)
printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(speculative-simple)\n' \
  > "$work/src/examples/CMakeLists.txt"
mkdir -p "$work/src/pocs" && : > "$work/src/pocs/CMakeLists.txt"  # the top-level CMakeLists.txt adds it with the examples
(cd "$work/src/ggml/src" && find . -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' ! -name ggml-cpu ! -name ggml-cuda -exec rm -rf {} +)
mkdir -p "$out"
tar cJf "$out/llama-src.tar.xz" -C "$work" src
cp "$llama/gen_gemma4_gguf.py" "$out/"
echo "$out: llama-src.tar.xz ($(du -h "$out/llama-src.tar.xz" | cut -f1)), gen_gemma4_gguf.py"
