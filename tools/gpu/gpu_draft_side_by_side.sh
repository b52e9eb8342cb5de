#!/usr/bin/env bash
# Speculative decoding with an MTP assistant: g4 beside llama.cpp's `--spec-type draft-mtp` on the
# same target and assistant files, on the same GPU, one after the other (docs/PERF.md). On the GPU
# machine, from the repository root:
#
#   tools/gpu/gpu_draft_side_by_side.sh KIT_DIR
#
# KIT_DIR is what tools/gpu/make_draft_kit.sh makes here (a slim llama-src.tar.xz that builds
# llama-speculative-simple, and the kit's gen_gemma4_gguf.py; never committed). The script builds
# llama-speculative-simple (CUDA, sm_90a) and g4 side by side, writes the 31B-shaped target
# (gen_gemma4_gguf.py) and a random assistant of the 31B assistant's shape for it
# (tools/fixtures/gen_assistant_gguf.py), then for each K in KS: llama.cpp drafting K a round
# (`--spec-draft-p-min 0`: every round drafts K), and g4 bench on the same files drafting K, at its
# own acceptance (a random assistant's drafts hardly ever stand: both runs measure a round's cost)
# and with `--draft_accept ACCEPT` (the published mean for the 31B).
# Environment: TYPE (q4_0), KS ("2 4"), ACCEPT (2.5), GEN (128), OUT (/tmp/draft-side-by-side),
# PYTHON (python3, with numpy);
# BACKEND=cpu TINY=1 LLAMA_BUILD=DIR G4=BINARY run the same steps on the CPU with the kit's tiny
# shape and builds already made (how the script is tried without a GPU).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kit=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/draft-side-by-side}
TYPE=${TYPE:-q4_0}
KS=${KS:-2 4}
ACCEPT=${ACCEPT:-2.5}
GEN=${GEN:-128}
BACKEND=${BACKEND:-cuda}
PYTHON=${PYTHON:-python3}  # with numpy
mkdir -p "$OUT"
src=/tmp/llama-src/src
export LLAMA_SRC=$src PYTHONPATH=$src/gguf-py
[ -f "$src/CMakeLists.txt" ] || { mkdir -p /tmp/llama-src && tar xJf "$kit/llama-src.tar.xz" -C /tmp/llama-src; }
LLAMA_BUILD=${LLAMA_BUILD:-/tmp/llama-build}
G4=${G4:-$root/build-gpu/g4}
if [ "$BACKEND" = cuda ]; then
  bash "$root/tools/gpu/build_llama_and_g4.sh" "$src" "$LLAMA_BUILD" "$OUT" llama-speculative-simple || exit 1
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
fi
target=/tmp/draft-target.gguf assistant=/tmp/draft-assistant.gguf
shape=(); assistant_shape=(); cpu=(); g4_backend=(--backend "$BACKEND")
if [ "${TINY:-0}" = 1 ]; then
  shape=(--tiny); assistant_shape=(--hidden 256 --layers 2 --ff 512 --heads 4); cpu=(-t "$(nproc)")
fi
"$PYTHON" "$kit/gen_gemma4_gguf.py" "$target" --type "$TYPE" "${shape[@]}" > "$OUT/gen-target.txt" 2>&1 ||
  { tail -5 "$OUT/gen-target.txt"; exit 1; }
"$PYTHON" "$root/tools/fixtures/gen_assistant_gguf.py" "$target" "$assistant" --type "$TYPE" "${assistant_shape[@]}" ||
  exit 1
gpu_layers=(); [ "$BACKEND" = cuda ] && gpu_layers=(-ngl 99 -ngld 99 -fa on)
for k in $KS; do
  "$LLAMA_BUILD/bin/llama-speculative-simple" -m "$target" -md "$assistant" --spec-type draft-mtp --spec-draft-n-max "$k" \
    --spec-draft-p-min 0 -p "The quick brown fox" -n "$GEN" --temp 0 --top-k 1 --ignore-eos "${gpu_layers[@]}" "${cpu[@]}" \
    > "$OUT/llama-k$k.txt" 2>&1
  echo "llama.cpp K=$k: $(grep -E 'decoded|n_drafted|n_accept ' "$OUT/llama-k$k.txt" | sed 's/^.* I //' | tr '\n' ' ')"
  for accept in own "$ACCEPT"; do
    forced=()
    if [ "$accept" != own ]; then
      awk "BEGIN { exit !($accept <= $k) }" || continue  # a round holds at most K drafts
      forced=(--draft_accept "$accept")
    fi
    "$G4" bench "${g4_backend[@]}" --model_path "$target" --prompt_len 16 --gen "$GEN" --draft_model "$assistant" \
      --draft_tokens "$k" "${forced[@]}" > "$OUT/g4-k$k-$accept.json" 2> "$OUT/g4-k$k-$accept.log" || { tail -3 "$OUT/g4-k$k-$accept.log"; continue; }
    "$PYTHON" -c "
import json, sys
d = json.load(open(sys.argv[1]))
print('g4 K=%s acceptance %s: drafted %.1f tok/s at %.2f tokens a round (plain %.1f), draft step %.3f ms, verify %.2f ms' % (
    sys.argv[2], sys.argv[3], d['drafted_decode_greedy_tok_s'], d['draft_tokens_per_round'],
    d.get('decode_greedy_graph_tok_s', d['decode_greedy_tok_s']), d['draft_step_ms'], d['verify_ms']))" \
      "$OUT/g4-k$k-$accept.json" "$k" "$accept"
  done
done
rm -f "$target" "$assistant"
echo "total ${SECONDS}s"
