#!/usr/bin/env bash
# Two builds of g4 side by side on one GPU, in one call (a change that must not cost speed or change
# tokens): each figure of the old and the new binary, runs alternating so that both see the same
# clocks, and new/old. Parts:
#   demo         the demo's tokens on cpu, cuda and cuda graph (greedy and two seeds): must be equal
#   suite        g4 bench --synthetic 31b --suite (pp512, tg at 1 k context) for $WEIGHTS (default
#                bf16 q4_0 q4_k_m q8_0)
#   concurrency  g4 bench --synthetic 31b --weights q4_0 --concurrency 1,8,64 (full decode step tok/s)
# Usage: tools/gpu/gpu_ab_bench.sh OLD_G4 NEW_G4 PART...   (logs and JSON under $OUT, default /tmp/g4-ab)
set -uo pipefail
old=$1 new=$2
shift 2
OUT=${OUT:-/tmp/g4-ab}
mkdir -p "$OUT"
failures=0

# The figure at JSON path KEY of file F (python3, which the GPU machine has).
figure() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval('d'+sys.argv[2]))" "$1" "$2"; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{b/a:.4f}' if a else 'n/a')" "$1" "$2"; }

demo() {
  for args in "--temperature 0" "--seed 42" "--seed 7 --top_k 0 --top_p 0.8 --min_p 0.05"; do
    for backend in "--backend cpu" "--backend cuda" "--backend cuda --cuda_graph"; do
      a=$("$old" run --prompt "Tell me a fortune about computers." --max_new_tokens 48 --print_token_ids $backend $args 2>/dev/null | head -1)
      b=$("$new" run --prompt "Tell me a fortune about computers." --max_new_tokens 48 --print_token_ids $backend $args 2>/dev/null | head -1)
      if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "demo [$backend $args]: same tokens"; else
        echo "FAIL demo [$backend $args]: old $a / new $b"; failures=$((failures + 1)); fi
    done
  done
}

suite() {
  echo "weights | pp512 old | pp512 new | new/old | tg1k old | tg1k new | new/old"
  for w in ${WEIGHTS:-bf16 q4_0 q4_k_m q8_0}; do
    for which in old new; do
      bin=$old; [ $which = new ] && bin=$new
      "$bin" bench --synthetic 31b --weights $w --suite --suite_prompts 512 --suite_contexts 1024 --gen 64 \
        > "$OUT/suite-$w-$which.json" 2> "$OUT/suite-$w-$which.log" || { echo "FAIL suite $w $which"; failures=$((failures + 1)); }
    done
    pa=$(figure "$OUT/suite-$w-old.json" '["prefill_tok_s"]["512"]') pb=$(figure "$OUT/suite-$w-new.json" '["prefill_tok_s"]["512"]')
    da=$(figure "$OUT/suite-$w-old.json" '["decode_greedy_tok_s"]["1024"]') db=$(figure "$OUT/suite-$w-new.json" '["decode_greedy_tok_s"]["1024"]')
    echo "$w | $pa | $pb | $(ratio "$pa" "$pb") | $da | $db | $(ratio "$da" "$db")"
  done
}

concurrency() {
  echo "sequences | old tok/s | new tok/s | new/old (full decode step, q4_0, invariant)"
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    "$bin" bench --synthetic 31b --weights q4_0 --concurrency 1,8,64 --prompt_len 128 --gen 48 \
      > "$OUT/concurrency-$which.json" 2> "$OUT/concurrency-$which.log" || { echo "FAIL concurrency $which"; failures=$((failures + 1)); }
  done
  for i in 0 1 2; do
    n=$(figure "$OUT/concurrency-new.json" "[\"runs\"][$i][\"concurrency\"]")
    a=$(figure "$OUT/concurrency-old.json" "[\"runs\"][$i][\"full_decode_tok_s\"]")
    b=$(figure "$OUT/concurrency-new.json" "[\"runs\"][$i][\"full_decode_tok_s\"]")
    echo "$n | $a | $b | $(ratio "$a" "$b")"
  done
}

for part in "$@"; do "$part"; done
echo "gpu_ab_bench: $failures failure(s)"
[ "$failures" -eq 0 ]
