#!/usr/bin/env bash
# Issue 9's checks on another CPU in one call, for a machine lent for minutes where nothing can be
# installed (the device machine: x86-64, its own python3 with PyTorch and transformers, no Open MPI,
# OpenBLAS or oneDNN). Run here first: `make all bench-tools bench-amx && bash bench/bundle.sh`;
# then on the other machine, from a copy of the repository with build/ and bench/bundle/:
#   bash bench/other_cpu.sh [OUTDIR] [CPUS] [ROUNDS]
# It unpacks the bundle (bench/bundle.sh; needs root for /opt and Open MPI's paths), then, each
# part's output in OUTDIR (default $OUT where set, else ./other-cpu):
#   1. lscpu, and the kernel tests that exercise every path the CPU has (test_isa, test_bf16,
#      test_ops, test_attention_bf16, test_attention, test_model), each with its closing line;
#   2. bench/vs_pytorch.py with the machine's python3, both programs held to CPUS (default 4,5:
#      two CPUs, as the project's machines have; threads free to move over many CPUs were 1.2-1.7x
#      slower on the AMX Xeon), attention and the step in fp32 and bf16 at S = 8192, ROUNDS rounds
#      (default 1), eager only (torch.compile was slower than eager there and takes minutes);
#   3. `seqpar bench step` in fp32 and bf16 on CPUS (where a step's time goes);
#   4. build/bench/kernel_rates 8192 128 4 1 on one CPU (per CPU-second) and, where AMX runs,
#      build/bench/amx_probe at d = 128 and 64.
# About 3 minutes a round on the AMX Xeon (2026-11-27: 180 s with one round; 71 s on the Zen 3 without
# PyTorch, whose part then ends in an import error). Not a test.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${1:-${OUT:-other-cpu}}
CPUS=${2:-4,5}
ROUNDS=${3:-1}
ONE=${CPUS%%,*}
mkdir -p "$OUTDIR"
if [ ! -x build/seqpar ] || [ ! -x build/bench/kernel_rates ]; then
    echo "other_cpu: build/seqpar or build/bench/kernel_rates is missing: run 'make all bench-tools bench-amx' where the packages are" >&2
    exit 1
fi
if [ ! -f /opt/seqpar-runtime/env.sh ]; then
    [ -f bench/bundle/seqpar-runtime.tar.xz ] || { echo "other_cpu: bench/bundle/seqpar-runtime.tar.xz is missing: run 'bash bench/bundle.sh' where the packages are" >&2; exit 1; }
    tar -C / --no-overwrite-dir -xJf bench/bundle/seqpar-runtime.tar.xz || { echo "other_cpu: cannot unpack the bundle at / (needs root)" >&2; exit 1; }
fi
# shellcheck source=/dev/null
. /opt/seqpar-runtime/env.sh
t0=$(date +%s)
part() { echo "== $* ($(( $(date +%s) - t0 )) s, $(date -u +%H:%M:%S) UTC)"; }
{
    lscpu > "$OUTDIR/lscpu.txt"
    grep -E "^Model name|^CPU\(s\)|^Thread|L2 cache|L3 cache" "$OUTDIR/lscpu.txt"
    echo "flags: $(grep -oE 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16' "$OUTDIR/lscpu.txt" | sort -u | tr '\n' ' ')"
    part "kernel tests"
    for t in test_isa test_bf16 test_ops test_attention_bf16 test_attention test_model; do
        timeout 300 "build/tests/$t" > "$OUTDIR/$t.txt" 2>&1
        echo "$t: exit $?, $(tail -1 "$OUTDIR/$t.txt")"
    done
    grep -h -E "paths tested|cannot run|paths checked|libraries checked" "$OUTDIR"/test_*.txt
    part "vs_pytorch on CPUs $CPUS, $ROUNDS round(s)"
    PYTHONUNBUFFERED=1 timeout $((300 * ROUNDS)) python3 bench/vs_pytorch.py --cpus "$CPUS" --parts attn,step \
        --precisions fp32,bf16 --rounds "$ROUNDS" --repeats 2 --no-compile --seq-lens 8192
    for p in fp32 bf16; do
        part "seqpar bench step --precision $p on CPUs $CPUS"
        taskset -c "$CPUS" timeout 120 build/seqpar bench step --precision "$p" --repeats 2 2>&1 | tail -4
    done
    part "kernel_rates 8192 128 4 1 on CPU $ONE"
    taskset -c "$ONE" timeout 180 build/bench/kernel_rates 8192 128 4 1 2>&1 | tail -8
    if [ -x build/bench/amx_probe ] && grep -q amx_bf16 "$OUTDIR/lscpu.txt"; then
        for d in 128 64; do
            part "amx_probe $d"
            taskset -c "$ONE" timeout 60 build/bench/amx_probe "$d" 2>&1 | tail -20
        done
    fi
    part "done"
} 2>&1 | tee "$OUTDIR/other_cpu.txt"
