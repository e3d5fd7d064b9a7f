#!/usr/bin/env bash
# The README's test command: installs missing Debian packages, builds with warnings as errors,
# and runs the whole suite (closing line "N passed, N failed"; non-zero exit on any failure).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash scripts/install-deps.sh
make -j"$(nproc)" WERROR=1 all
bash tests/run_tests.sh build
