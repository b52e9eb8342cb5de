#!/usr/bin/env bash
# Installs the demo model that tools/demo/gpu_train_demo.sh trained (docs/DESIGN.md §6, "Demo model"):
#   tools/demo/install_demo.sh RESULTS_DIR [G4_BINARY]
# RESULTS_DIR: the device run's $OUT (demo-chat.tar.part-*, golden.json, train.log, SHA256SUMS).
# G4_BINARY: a built g4 (default build/g4).
#
# - models/demo.gguf: g4's export of the checkpoint, a sampling program with every matrix in Q4_K
#   and the tied embedding in Q8_0 (g4's rule for the embedding under 8 bits), under 16 MB; CMake
#   links it into g4. (Q4_K_M with the embedding at Q8_0 passes 16 MB; a K-quant embedding fits
#   but makes the CPU decode 3x slower: docs/DESIGN.md §6.)
# - tests/fixtures/demo-chat/golden.json and train.log: transformers' greedy continuations with
#   their top-2 margins (tests/test_embedded_demo.cpp), the validation figures and samples.
# - models/demo-corpus-LICENSE: the fortunes' licence (unchanged corpus).
# The Hugging Face checkpoint itself (46 MB in bf16) is not committed; it is left in
# .gpu/demo-chat-hf (git-ignored) for g4 export and for transformers.
# The fortune demo stays the fixture of the oracles (tests/fixtures/demo, tests/fixtures/llamacpp):
# tests export it from tests/fixtures/demo/hf (tests/support/demo_engine.h).
set -euo pipefail
results=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
g4=${2:-$root/build/g4}
[[ -x "$g4" ]] || { echo "no g4 binary at $g4 (build it, or pass its path)" >&2; exit 2; }
(cd "$results" && sha256sum --check --quiet SHA256SUMS) || { echo "$results: checksums do not match" >&2; exit 1; }

hf=$root/.gpu/demo-chat-hf
rm -rf "$hf" "$hf.tmp"
mkdir -p "$hf.tmp"
cat "$results"/demo-chat.tar.part-* | tar -C "$hf.tmp" -xf -
mv "$hf.tmp/demo-chat" "$hf"
rmdir "$hf.tmp"
cmp "$hf/golden.json" "$results/golden.json"

python3 - "$hf/golden.json" <<'EOF'
import json, sys
g = json.load(open(sys.argv[1]))
if g.get("stopped_early_by_time_guard"):
    sys.exit("the training run was cut by its time guard: not the planned run (see train.log)")
if not g.get("paris_tool_call_ok"):
    sys.exit("transformers' greedy reply to the Paris request is not the expected tool call: not installing")
v = g["validation"]
for which in ("old", "new"):
    print(f"validation {which}: fortunes {v[which]['fortunes']['bits_per_byte']:.3f} bits/byte, "
          f"chats {v[which]['chats']['bits_per_byte']:.3f} bits/byte")
print("held-out completions written exactly:", g["held_out_exact"])
EOF

"$g4" export --model-dir "$hf" --output "$root/models/demo.gguf" --sample --weights q4_k
size=$(stat -c %s "$root/models/demo.gguf")
if (( size >= 16000000 )); then
  echo "models/demo.gguf is $size bytes: not under 16 MB" >&2
  exit 1
fi
mkdir -p "$root/tests/fixtures/demo-chat"
cp "$results/golden.json" "$root/tests/fixtures/demo-chat/golden.json"
cp "$results/train.log" "$root/tests/fixtures/demo-chat/train.log"
cp "$hf/CORPUS_LICENSE" "$root/models/demo-corpus-LICENSE"
echo "installed models/demo.gguf ($size bytes) and tests/fixtures/demo-chat; rebuild g4 to embed it"
