#!/usr/bin/env bash
# Installs the demo assistant that tools/demo/gpu_train_assistant.sh trained (docs/DESIGN.md §7,
# "Demo assistant"):
#   tools/demo/install_assistant.sh RESULTS_DIR [G4_BINARY]
# RESULTS_DIR: the device run's $OUT (assistant.tar.part-*, summary.json, SHA256SUMS; train.log).
# G4_BINARY: a built g4 (default build-cpu/g4).
#
# - models/demo-assistant.gguf: g4's export of the checkpoint in llama.cpp's gemma4-assistant layout,
#   every matrix Q4_K and the tied embedding (its LM head) Q8_0, as the demo model, with the demo's
#   tokenizer (llama.cpp loads no model without one); CMake links it into g4 beside the demo
#   (`--draft_model demo`).
# - tests/fixtures/demo-chat/assistant-summary.json and assistant-train.log: the checks against the
#   target, the training figures and the validation agreement.
# The float32 checkpoint is left in .gpu/demo-assistant-hf (git-ignored).
set -euo pipefail
results=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
g4=${2:-$root/build-cpu/g4}
[[ -x "$g4" ]] || { echo "no g4 binary at $g4 (build it, or pass its path)" >&2; exit 2; }
(cd "$results" && sha256sum --check --quiet SHA256SUMS) || { echo "$results: checksums do not match" >&2; exit 1; }

hf=$root/.gpu/demo-assistant-hf
rm -rf "$hf" "$hf.tmp"
mkdir -p "$hf.tmp"
cat "$results"/assistant.tar.part-* | tar -C "$hf.tmp" -xf -
mv "$hf.tmp/assistant/hf" "$hf"
rm -rf "$hf.tmp"

python3 - "$results/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for name, v in s["validation"].items():
    if name != "score":
        print(f"validation, {name}: top-1 agreement per step {v['top1_agreement_per_step']}, "
              f"teacher-forced tokens a round {v['teacher_forced_tokens_per_round']}")
if s["validation"]["corpus_chats"]["teacher_forced_tokens_per_round"] < 3.0:
    sys.exit("the assistant keeps fewer than 3 tokens a round on held-out chats: not installing (see train.log)")
PY

"$g4" inspect --full "$root/models/demo.gguf" |
  python3 -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["metadata"]["tokenizer.huggingface.json"])' \
  > "$hf/tokenizer.json"
"$g4" export --model-dir "$hf" --output "$root/models/demo-assistant.gguf" --weights q4_k
mkdir -p "$root/tests/fixtures/demo-chat"
cp "$results/summary.json" "$root/tests/fixtures/demo-chat/assistant-summary.json"
if [[ -f "$results/train.log" ]]; then cp "$results/train.log" "$root/tests/fixtures/demo-chat/assistant-train.log"; fi
echo "installed models/demo-assistant.gguf ($(stat -c %s "$root/models/demo-assistant.gguf") bytes); rebuild g4 to embed it"
