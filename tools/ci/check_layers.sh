#!/usr/bin/env bash
# Fails when an include in src/ runs back up a layer (docs/DESIGN.md §1):
#   util → quant → format → {sampling, tokenizer} → grammar → backend → model → runtime
# A file may include its own layer and any layer below; sampling and tokenizer are siblings.
#   tools/ci/check_layers.sh [SOURCE_DIR]
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
declare -A rank=([util]=0 [quant]=1 [format]=2 [sampling]=3 [tokenizer]=3 [grammar]=4 [backend]=5 [model]=6 [runtime]=7)
bad=0
while IFS= read -r line; do
  file=${line%%:*}
  layer=${file#"$root"/src/}; layer=${layer%%/*}
  target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
  [ -n "${rank[$layer]:-}" ] || { echo "unknown layer '$layer' ($file)"; bad=1; continue; }
  [ -n "${rank[$target]:-}" ] || { echo "unknown layer '$target' included by $file"; bad=1; continue; }
  if ((rank[$target] > rank[$layer])) || { ((rank[$target] == rank[$layer])) && [ "$target" != "$layer" ]; }; then
    echo "$file includes $target/, a layer above or beside $layer/: ${line#*:}"
    bad=1
  fi
done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' '#include "[a-z_]*/' "$root/src")
[ "$bad" -eq 0 ] && echo "layers: every include in src/ runs down"
exit "$bad"
