#!/usr/bin/env bash
# Golden data from llama.cpp's own tools, for the interop tests: on the GPU machine
# (torch and transformers, which llama.cpp's converter needs), converts the demo checkpoint and a
# random fixture with convert_hf_to_gguf.py, quantizes them with llama-quantize (Q8_0, Q4_0,
# Q4_K_M), dequantizes each quantized file back to F32 with llama-quantize (llama.cpp's own
# dequantize_row_*), and records with llama.cpp's CPU backend:
#   - the logits of every position of the fixtures' reference tokens (tools/llamacpp_logits.cpp),
#     for each quantized file and for its F32 dequantization;
#   - greedy completions (llama-completion) of the demo files;
#   - llama-perplexity's perplexity on tests/fixtures/demo/heldout.txt and its KL divergence
#     against the converted bf16 file, per type;
#   - llama-tokenize's ids of the held-out text.
# Usage: tools/gpu_llamacpp_golden.sh LLAMA_DIR   (LLAMA_DIR holds src/ or llama-src.tar.xz, made by
# ../shared/tools/llamacpp/fetch.sh; never committed). Results: tarballs in $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
llama=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/llamacpp-golden}
work=/tmp/llamacpp-golden-work
mkdir -p "$OUT" "$work"
log=$work/log.txt
exec > >(tee -a "$log") 2>&1
[ -d "$llama/src" ] || tar xf "$llama/llama-src.tar.xz" -C "$llama" || exit 1
build=/tmp/llama-build
cmake -S "$llama/src" -B "$build" -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_TYPE=Release > "$work/cmake.log" 2>&1 || exit 1
cmake --build "$build" -j"$(nproc)" --target llama-quantize llama-perplexity llama-completion llama-tokenize llama \
  > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
lib=$(dirname "$(find "$build" -name 'libllama.so' | head -n1)")
c++ -std=c++17 -O2 -I"$llama/src/include" -I"$llama/src/ggml/include" "$root/tools/llamacpp_logits.cpp" -L"$lib" -lllama \
  -Wl,-rpath,"$lib" -o "$work/llamacpp_logits" || exit 1
bin=$build/bin
ids_of() { python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['token_ids'])))" "$1"; }

# name, checkpoint dir, converter outtype, reference.json
make_files() {
  local name=$1 dir=$2 outtype=$3 ref=$4 d=$work/$1
  mkdir -p "$d/hf"
  cp "$dir"/config.json "$dir"/model.safetensors "$d/hf/"
  [ -f "$dir/generation_config.json" ] && cp "$dir/generation_config.json" "$d/hf/"
  if [ -f "$dir/tokenizer.json" ]; then cp "$dir/tokenizer.json" "$d/hf/"; else
    vocab=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('vocab_size') or c['text_config']['vocab_size'])" "$dir/config.json")
    python3 "$root/tools/gemma_style_tokenizer.py" "$vocab" "$d/hf/tokenizer.json"
  fi
  python3 "$llama/src/convert_hf_to_gguf.py" "$d/hf" --outfile "$d/$name-$outtype.gguf" --outtype "$outtype" \
    > "$d/convert.log" 2>&1 || { echo "convert $name failed"; tail -20 "$d/convert.log"; return 1; }
  ids_of "$ref" > "$d/ids.txt"
  "$work/llamacpp_logits" "$d/$name-$outtype.gguf" "$d/ids.txt" "$d/$name-$outtype.llama.f32"
  for t in Q8_0 Q4_0 Q4_K_M; do
    local lt=${t,,}
    "$bin/llama-quantize" "$d/$name-$outtype.gguf" "$d/$name-$lt.gguf" "$t" 8 > "$d/quantize-$lt.log" 2>&1 ||
      { echo "quantize $name $t failed"; tail -5 "$d/quantize-$lt.log"; continue; }
    "$bin/llama-quantize" --allow-requantize "$d/$name-$lt.gguf" "$d/$name-$lt-f32.gguf" F32 8 \
      > "$d/dequantize-$lt.log" 2>&1 || { echo "dequantize $name $t failed"; tail -5 "$d/dequantize-$lt.log"; }
    "$work/llamacpp_logits" "$d/$name-$lt.gguf" "$d/ids.txt" "$d/$name-$lt.llama.f32"
    "$work/llamacpp_logits" "$d/$name-$lt-f32.gguf" "$d/ids.txt" "$d/$name-$lt-f32.llama.f32"
  done
}

make_files demo "$root/tests/fixtures/demo/hf" bf16 "$root/tests/fixtures/demo/transformers/reference.json"
make_files tiny "$root/tests/fixtures/hf-gemma4/tiny-31b-style" f32 "$root/tests/fixtures/hf-gemma4/tiny-31b-style/reference.json"

d=$work/demo
text=$root/tests/fixtures/demo/heldout.txt
"$bin/llama-tokenize" -m "$d/demo-bf16.gguf" -f "$text" --ids --log-disable > "$d/heldout.llama-ids.txt" 2>/dev/null
for prompt in "Once upon a time" "The computer" "Tell me"; do
  for t in bf16 q8_0 q4_0 q4_k_m; do
    echo "=== completion [$prompt] $t"
    "$bin/llama-completion" -m "$d/demo-$t.gguf" -p "$prompt" -n 48 --temp 0 --top-k 1 --seed 0 -no-cnv --no-warmup \
      -t 8 2>>"$d/completion.log"
    echo
  done
done > "$d/completions.txt"
cat "$d/completions.txt"
"$bin/llama-perplexity" -m "$d/demo-bf16.gguf" -f "$text" -c 256 -b 256 -t 16 --kl-divergence-base "$d/base.kld" \
  > "$d/ppl-bf16.log" 2>&1
for t in q8_0 q4_0 q4_k_m; do
  "$bin/llama-perplexity" -m "$d/demo-$t.gguf" -c 256 -b 256 -t 16 --kl-divergence-base "$d/base.kld" --kl-divergence \
    > "$d/ppl-$t.log" 2>&1
done
grep -hE "Final estimate|Mean PPL\(Q\)|Mean    KLD|Same top p|calculating perplexity" "$d"/ppl-*.log

cd "$work" || exit 1
tar cf "$OUT/demo-gguf.tar" demo/demo-q8_0.gguf demo/demo-q4_0.gguf demo/demo-q4_k_m.gguf
tar cf "$OUT/demo-logits-native.tar" --exclude='*-f32.llama.f32' demo/*.llama.f32
tar cf "$OUT/demo-logits-f32.tar" demo/*-f32.llama.f32
tar cf "$OUT/tiny.tar" --exclude='*-f32.gguf' tiny/*.gguf tiny/*.llama.f32
tar cf "$OUT/text.tar" log.txt demo/*.txt demo/*.log tiny/*.txt tiny/*.log
ls -la "$OUT"
