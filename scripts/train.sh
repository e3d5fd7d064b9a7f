#!/usr/bin/env bash
# The README's main job: installs missing Debian packages, builds, and trains the default model
# (2 layers on the built-in associative-recall task) with any extra arguments passed through,
# e.g. `bash scripts/train.sh --steps 100`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
make -j"$(nproc)" build/seqpar >/dev/null
exec ./build/seqpar train "$@"
