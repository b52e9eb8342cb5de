#!/usr/bin/env bash
# Makes what tools/gpu/gpu_serve_check.sh needs on the GPU machine, which has neither cpp-httplib nor a
# network: Debian's cpp-httplib with the libraries and headers it needs, and pkgconf, unpacked
# (httplib/), beside the llama.cpp kit's GGUF writer and its gguf-py (kit/), in one archive small
# enough to carry (~2.6 MB). Run here (Debian, apt); never commit the result.
#
#   tools/gpu/make_serve_kit.sh LLAMACPP_DIR [OUT]   # LLAMACPP_DIR: a fetch.sh result (../shared/tools/llamacpp)
#   # default OUT: .gpu/serve-kit.tar.xz; then, on the GPU machine (run's carry: [".gpu/serve-kit.tar.xz"]):
#   mkdir -p /tmp/sk && tar xJf .gpu/serve-kit.tar.xz -C /tmp/sk && tools/gpu/gpu_serve_check.sh /tmp/sk/httplib /tmp/sk/kit
set -euo pipefail
llama=$(cd "${1:?usage: make_serve_kit.sh LLAMACPP_DIR [OUT]}" && pwd)
out=$(realpath -m "${2:-.gpu/serve-kit.tar.xz}")
[ -f "$llama/gen_gemma4_gguf.py" ] && [ -d "$llama/src/gguf-py" ] || { echo "no gen_gemma4_gguf.py and src/gguf-py in $llama (run its fetch.sh)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/kit/src" "$work/httplib/pkgconf-lib"
(cd "$work/debs" && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev zlib1g \
  libbrotli-dev libbrotli1 pkgconf pkgconf-bin libpkgconf3 > /dev/null 2>&1)
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/httplib/root"; done
mv "$work"/httplib/root/usr/lib/x86_64-linux-gnu/libpkgconf.so* "$work/httplib/pkgconf-lib/"
rm -rf "$work"/httplib/root/usr/share "$work"/httplib/root/usr/lib/x86_64-linux-gnu/*.a \
  "$work"/httplib/root/usr/lib/x86_64-linux-gnu/engines-3 "$work"/httplib/root/usr/lib/x86_64-linux-gnu/ossl-modules
cp "$llama/gen_gemma4_gguf.py" "$work/kit/" && cp -r "$llama/src/gguf-py" "$work/kit/src/"
mkdir -p "$(dirname "$out")"
tar cJf "$out" -C "$work" httplib kit
echo "$out ($(du -h "$out" | cut -f1))"
