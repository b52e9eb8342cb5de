#!/usr/bin/env bash
# Installs a freshly trained demo model (tools/train_demo.py's OUT_DIR) into the tree, on the GPU
# machine: its Hugging Face checkpoint (tests/fixtures/demo/hf), g4's export of it
# (models/demo.gguf), transformers' float64 oracle from the checkpoint (tests/fixtures/demo/
# transformers) and the greedy goldens (tests/fixtures/demo/golden.json).
#   tools/gpu_install_demo.sh TRAINED_DIR G4_BINARY
set -euo pipefail
trained=$1 g4=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
mkdir -p "$root/tests/fixtures/demo/hf"
for f in config.json generation_config.json model.safetensors tokenizer.json; do cp "$trained/$f" "$root/tests/fixtures/demo/hf/"; done
cp "$trained/golden.json" "$root/tests/fixtures/demo/golden.json"
cp "$trained/CORPUS_LICENSE" "$root/models/demo-corpus-LICENSE"
"$g4" export --model-dir "$root/tests/fixtures/demo/hf" --output "$root/models/demo.gguf" --sample --weights bf16
python3 "$here/demo_reference_logits.py" "$root/tests/fixtures/demo/hf" "$root/tests/fixtures/demo/transformers"
