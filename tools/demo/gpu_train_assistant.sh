#!/usr/bin/env bash
# Trains the embedded demo model's MTP assistant on the GPU machine (tools/demo/train_assistant.py)
# and packs it into $OUT; tools/demo/install_assistant.sh installs the result. From the repository root:
#
#   device run:  bash tools/demo/gpu_train_assistant.sh      (carry .gpu: llama.cpp's gguf-py in .gpu/gguf-py)
#   install:     tools/demo/install_assistant.sh RESULTS_DIR [G4_BINARY]
#
# $OUT receives train.log, summary.json and assistant.tar in parts of 15 MiB (the device returns
# files of at most 16 MiB), with SHA256SUMS. About six minutes: 240 s of training and the checks.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:?OUT must name the folder that receives the results}
export PYTHONUNBUFFERED=1 PYTHONPATH=$root/.gpu/gguf-py
python3 -c 'import gguf' || { echo "no gguf-py in .gpu/gguf-py: copy llama.cpp's gguf-py there and carry .gpu" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
work=$(mktemp -d)
start=$(date +%s)
python3 "$root/tools/demo/train_assistant.py" "$root/models/demo.gguf" "$work/assistant" 2>&1 | tee "$out/train.log"
cp "$work/assistant/summary.json" "$out/summary.json"
tar -C "$work" -cf - assistant | split -b 15M -d - "$out/assistant.tar.part-"
(cd "$out" && sha256sum assistant.tar.part-* summary.json train.log > SHA256SUMS)
ls -l "$out"
echo "gpu_train_assistant: $(( $(date +%s) - start )) s"
