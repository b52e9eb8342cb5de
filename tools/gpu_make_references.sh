#!/usr/bin/env bash
# Regenerates every transformers oracle on the GPU machine (torch + transformers there) in one go:
# the fortune demo's float64 reference from its committed checkpoint (tests/fixtures/demo/hf), the
# long-context fixtures, and transformers' own bf16/f32 errors on the committed short fixtures.
# (The embedded chat demo is trained and its goldens made by tools/gpu_train_demo.sh.)
#   tools/gpu_make_references.sh FIXTURES_DIR OUT_DIR
# FIXTURES_DIR: a copy of the committed short fixtures (their references are recomputed in place,
# to compare with the committed ones).
set -u
fixtures=$1 out=$2
export PYTHONUNBUFFERED=1
mkdir -p "$out"
here=$(dirname "$0")
python3 "$here/demo_reference_logits.py" "$here/../tests/fixtures/demo/hf" "$out/demo-ref" 2>&1 | tee "$out/demo-ref.log"
python3 "$here/make_fixtures.py" make "$out/fixtures" 2>&1 | tee "$out/fixtures.log"
python3 "$here/make_fixtures.py" reference "$fixtures"/*/ 2>&1 | tee "$out/short.log"
