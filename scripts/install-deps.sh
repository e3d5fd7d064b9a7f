#!/usr/bin/env bash
# Installs the Debian 12 packages seqpar needs to build and run; does nothing when they are present.
# zlib1g-dev: CRC-32 checksums of checkpoint files; libdnnl-dev (oneDNN): the bf16 GEMM of --precision bf16; clang + libclang-rt-dev (the compiler-rt
# runtimes: libFuzzer, ASan, UBSan): `make fuzz` and tests/test_fuzz.sh.
set -euo pipefail
need=(build-essential pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin libjansson-dev zlib1g-dev libdnnl-dev
      clang libclang-rt-dev)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing Debian packages: ${missing[*]}; this user is not root and has no sudo: ask an" \
         "administrator to run 'apt-get install ${missing[*]}' (then this script does nothing)" >&2
    exit 1
  fi
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
