# Sourced by bench/vs_pytorch.sh and bench/vs_deepspeed.sh from the repository root:
# bench_venv NAME makes (once) bench/.venv with PyTorch 2.x and transformers from PyPI, then builds
# seqpar if it is missing; sets VENV. For the benchmarks only: the tests and the main job never
# need it.
bench_venv() {
    VENV=bench/.venv
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import torch, transformers' 2>/dev/null; then
        echo "$1: creating $VENV (PyTorch and transformers from PyPI; a few GB, once)" >&2
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --progress-bar off -q torch transformers
    fi
    [ -x build/seqpar ] || make -j2 build/seqpar >/dev/null
}
