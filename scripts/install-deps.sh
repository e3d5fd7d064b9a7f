#!/usr/bin/env bash
# Installs the Debian 12 packages seqpar needs to build and run; does nothing when they are present.
# zlib1g-dev: CRC-32 checksums of checkpoint files; libdnnl-dev (oneDNN): the bf16 GEMM of --precision bf16;
# clang + libclang-rt-dev (the compiler-rt runtimes: libFuzzer, ASan, UBSan): `make fuzz` and
# tests/test_fuzz.sh. gnuplot-nox: the PNG pictures of a training run (scripts/plot_run.sh; the
# cairo-based pngcairo terminal, no X11) — optional: a user who cannot install it gets a note and
# the exit status 0 (the pictures are skipped).
set -euo pipefail
need=(build-essential pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin libjansson-dev zlib1g-dev libdnnl-dev
      clang libclang-rt-dev)
need+=(python3) # scripts/make_shards.py (standard library only; --tokenizer adds the PyPI package on request)
need+=(strace)  # tests/test_cli.sh: which programs a one-process seqpar starts (no Open MPI daemon)
optional=(gnuplot-nox)
missing=()
missing_needed=0
for p in "${need[@]}" "${optional[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
    case " ${optional[*]} " in *" $p "*) ;; *) missing_needed=1 ;; esac
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    if [ "$missing_needed" -eq 0 ]; then
      echo "install-deps: ${missing[*]} (for the PNG pictures of training runs) is not installed and this user is" \
           "not root and has no sudo: the pictures are skipped; ask an administrator to run" \
           "'apt-get install ${missing[*]}' to get them" >&2
      exit 0
    fi
    echo "install-deps: missing Debian packages: ${missing[*]}; this user is not root and has no sudo: ask an" \
         "administrator to run 'apt-get install ${missing[*]}' (then this script does nothing)" >&2
    exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
