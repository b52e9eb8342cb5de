#!/usr/bin/env bash
# `g4 serve --backend cuda` under many streaming clients, beside `g4 bench --concurrency` on the same
# file and the same GPU (the HTTP overhead, docs/PERF.md "g4 serve under load").
# The GPU machine has no cpp-httplib and no network, so Debian's packages come along unpacked:
#
#   tools/gpu/gpu_serve_check.sh SYSROOT KIT
#
# SYSROOT and KIT: the httplib/ and kit/ of tools/gpu/make_serve_kit.sh's archive (Debian's cpp-httplib,
# its libraries and pkgconf unpacked; the llama.cpp kit's GGUF writer with its gguf-py). Writes a 31B-shaped Q4_0 file, then for each of CLIENTS (default "64"): g4 bench
# --concurrency, then g4 serve with tools/gpu/serve_load.py; BATCH_INVARIANT (default false), PROMPT
# (default 128 tokens), GEN (default 64), TPS (tensor-parallel sizes, default "1"; "1 2" runs each
# pair at --tp 1 and at --tp 2), EXTRA_ARGS (more flags for both, e.g. --cuda_graph), SESSIONS
# (--max_sessions, default the client count), WAITING (--max_waiting, default 64), REQUESTS (in
# total, serve_load.py --requests; default one per client). Logs in $OUT/logs.tgz.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sysroot=$(cd "$1" && pwd)
kit=$(cd "$2" && pwd)
OUT=${OUT:-/tmp/g4-serve}
CLIENTS=${CLIENTS:-64}
BATCH_INVARIANT=${BATCH_INVARIANT:-false}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
TPS=${TPS:-1}
mkdir -p "$OUT/pc"
lib=$sysroot/root/usr/lib/x86_64-linux-gnu
libs=$lib:$sysroot/root/lib/x86_64-linux-gnu
inc=$sysroot/root/usr/include
cat > "$OUT/pc/cpp-httplib.pc" <<EOF
Name: cpp-httplib
Description: Debian's cpp-httplib, unpacked
Version: 0.11.4
Libs: -L$lib -lcpp-httplib -Wl,-rpath-link,$libs
Cflags: -I$inc -I$inc/x86_64-linux-gnu -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT
EOF
pkgconf=$(command -v pkg-config || true)
if [ -z "$pkgconf" ]; then  # the carried pkgconf, wrapped so that only it sees its library
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$sysroot/pkgconf-lib" "$sysroot/root/usr/bin/pkgconf" > "$OUT/pkg-config"
  chmod +x "$OUT/pkg-config" && pkgconf=$OUT/pkg-config
fi
export PKG_CONFIG_PATH=$OUT/pc
started=$SECONDS
cmake -S "$root" --preset gpu-check -DG4_BUILD_TESTS=OFF -DPKG_CONFIG_EXECUTABLE="$pkgconf" \
  > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep -q "cpp-httplib not found" "$OUT/cmake.log" && { echo "cmake did not find the carried cpp-httplib"; exit 1; }
cmake --build "$root/build-gpu" -j16 --target g4 > "$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "built in $((SECONDS - started)) s"
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
G4=$root/build-gpu/g4
model=/tmp/g4-31b-q4_0.gguf
[ -f "$model" ] || LD_LIBRARY_PATH= python3 "$kit/gen_gemma4_gguf.py" "$model" --type q4_0 --fill pattern --threads 14 \
  > "$OUT/gen.log" 2>&1 || { tail -5 "$OUT/gen.log"; exit 1; }
echo "model written at $((SECONDS - started)) s"
seq_len=$((PROMPT + GEN + 16 > 1024 ? PROMPT + GEN + 16 : 1024))  # the 31B needs its sliding window (1 024)
for tp in $TPS; do
for n in $CLIENTS; do
  "$G4" bench --model_path "$model" --concurrency "$n" --batch_invariant "$BATCH_INVARIANT" --prompt_len "$PROMPT" \
    --gen "$GEN" --tp "$tp" ${EXTRA_ARGS:-} > "$OUT/bench_${n}_tp$tp.json" 2> "$OUT/bench_${n}_tp$tp.log"
  echo "bench  $n --tp $tp: $(tr -d ' \n' < "$OUT/bench_${n}_tp$tp.json" | grep -oE '"runs":\[\{[^}]*\}')"
  port=$((18000 + n + 1000 * tp))
  "$G4" serve --model_path "$model" --backend cuda --port $port --max_sessions "${SESSIONS:-$n}" \
    --max_waiting "${WAITING:-64}" --max_seq_len $seq_len \
    --batch_invariant "$BATCH_INVARIANT" --tp "$tp" ${EXTRA_ARGS:-} > "$OUT/serve_${n}_tp$tp.log" 2>&1 &
  server=$!
  get() { LD_LIBRARY_PATH= python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
  for _ in $(seq 120); do get "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break; sleep 1; done
  LD_LIBRARY_PATH= python3 "$root/tools/gpu/serve_load.py" --url "http://127.0.0.1:$port" --clients "$n" --prompt_chars $((PROMPT - 1)) \
    --max_tokens "$GEN" --requests "${REQUESTS:-0}" > "$OUT/serve_load_${n}_tp$tp.json" 2>&1
  echo "serve  $n --tp $tp: $(tr -d ' \n' < "$OUT/serve_load_${n}_tp$tp.json")"
  get "http://127.0.0.1:$port/metrics" > "$OUT/metrics_${n}_tp$tp.txt"
  kill -TERM $server; wait $server; echo "  serve exit $?"
done
done
echo "done in $((SECONDS - started)) s"
(cd "$OUT" && tar czf logs.tgz --remove-files -- *.log *.json *.txt 2>/dev/null)
