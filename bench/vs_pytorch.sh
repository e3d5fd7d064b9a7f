#!/usr/bin/env bash
# seqpar next to PyTorch in the same run: creates (once) bench/.venv with PyTorch 2.x and
# transformers from PyPI, builds seqpar if needed, then runs bench/vs_pytorch.py, which times
# seqpar's `bench attn` / `bench step` and PyTorch's SDPA attention and transformers'
# LlamaForCausalLM training step (eager and torch.compile) with the same thread count, and prints
# both with their ratios. For the benchmark only: the tests and the main job never need it.
# usage: bench/vs_pytorch.sh [--threads N] [--seq-lens 8192,32768] [--precisions fp32,bf16] [--repeats N] [--rounds N] [--no-compile]
#        [--checkpoints none,selective] [--parts attn,step]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/venv.sh
bench_venv vs_pytorch
exec "$VENV/bin/python" bench/vs_pytorch.py "$@"
