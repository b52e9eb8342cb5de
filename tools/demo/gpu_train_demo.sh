#!/usr/bin/env bash
# Trains the demo model on the GPU machine (tools/demo/train_demo.py; docs/DESIGN.md §6, "Demo model")
# and packs what tools/demo/install_demo.sh needs into $OUT. Run from the repository root:
#
#   device run:  bash tools/demo/gpu_train_demo.sh        carry: [".gpu/fortunes"]
#
# .gpu/fortunes (git-ignored) holds Debian's fortunes files and their COPYRIGHT; fill it here with
#   tools/demo/gpu_train_demo.sh --fetch-fortunes
# (apt-get download of Debian's `fortunes` and `fortunes-min`; the GPU machine has no network).
#
# $OUT receives train.log, golden.json and demo-chat.tar split into parts of 15 MiB
# (demo-chat.tar.part-00, -01, ...: the device returns files of at most 16 MiB), with SHA256SUMS.
# Budget: about 5 minutes of training (train_demo.py stops at 300 s and says so), 8 minutes in all.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

if [[ "${1:-}" == "--fetch-fortunes" ]]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download fortunes fortunes-min)
  for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/root"; done
  mkdir -p "$root/.gpu/fortunes"
  cp -a "$tmp/root/usr/share/games/fortunes/." "$root/.gpu/fortunes/"
  cp "$tmp/root/usr/share/doc/fortunes/copyright" "$root/.gpu/fortunes/COPYRIGHT"
  rm -rf "$tmp"
  echo "fortunes in $root/.gpu/fortunes"
  exit 0
fi

corpus=${1:-$root/.gpu/fortunes}
out=${OUT:?OUT must name the folder that receives the results}
[[ -f "$corpus/COPYRIGHT" ]] || { echo "no fortunes at $corpus: carry .gpu/fortunes (fill it with $0 --fetch-fortunes)" >&2; exit 2; }
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
start=$(date +%s)
python3 "$root/tools/demo/train_demo.py" "$corpus" "$work/demo-chat" "$root/tests/fixtures/demo/hf" 2>&1 | tee "$out/train.log"
cp "$work/demo-chat/golden.json" "$out/golden.json"
tar -C "$work" -cf - demo-chat | split -b 15M -d - "$out/demo-chat.tar.part-"
(cd "$out" && sha256sum demo-chat.tar.part-* golden.json > SHA256SUMS)
ls -l "$out"
echo "gpu_train_demo: $(( $(date +%s) - start )) s"
