#!/usr/bin/env bash
# Regenerates every transformers oracle on the GPU machine (torch + transformers there) in one go:
# retrains the demo model (tools/train_demo.py), its float64 reference from the saved checkpoint,
# the long-context fixtures, and transformers' own bf16/f32 errors on the committed short fixtures.
#   tools/gpu_make_references.sh CORPUS_DIR FIXTURES_DIR OUT_DIR
# CORPUS_DIR: Debian's fortunes files plus their COPYRIGHT; FIXTURES_DIR: a copy of the committed
# short fixtures (their references are recomputed in place, to compare with the committed ones).
set -u
corpus=$1 fixtures=$2 out=$3
export PYTHONUNBUFFERED=1
mkdir -p "$out"
here=$(dirname "$0")
python3 "$here/train_demo.py" "$corpus" "$out/demo-hf" 2>&1 | tee "$out/train.log"
python3 "$here/demo_reference_logits.py" "$out/demo-hf" "$out/demo-ref" 2>&1 | tee "$out/demo-ref.log"
python3 "$here/make_fixtures.py" make "$out/fixtures" 2>&1 | tee "$out/fixtures.log"
python3 "$here/make_fixtures.py" reference "$fixtures"/*/ 2>&1 | tee "$out/short.log"
