#!/usr/bin/env bash
# seqpar's Ulysses against DeepSpeed-Ulysses (DeepSpeed's own DistributedAttention in transformers'
# LlamaForCausalLM, torch.distributed on gloo) on the same ranks, in the same run: see
# bench/vs_deepspeed.py. Uses bench/.venv (PyTorch and transformers from PyPI, as vs_pytorch.sh
# makes it) and installs DeepSpeed from PyPI into it once (no compiled ops: DS_BUILD_OPS=0; on a
# CPU it runs with DS_ACCELERATOR=cpu). For the benchmark only: the tests and the main job never
# need it.
# usage: bench/vs_deepspeed.sh [--ranks P] [--threads N] [--seq-len S] [--precision fp32|bf16] [--steps N] [--rounds N] [--compile]
#        [--seqpar-flags '...']
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/venv.sh
bench_venv vs_deepspeed
if ! DS_ACCELERATOR=cpu "$VENV/bin/python" -c 'import deepspeed' 2>/dev/null; then
    echo "vs_deepspeed: installing DeepSpeed from PyPI into $VENV (once)" >&2
    DS_BUILD_OPS=0 "$VENV/bin/pip" install --progress-bar off -q deepspeed
fi
export DS_ACCELERATOR=cpu
exec "$VENV/bin/python" bench/vs_deepspeed.py "$@"
