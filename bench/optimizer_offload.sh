#!/usr/bin/env bash
# The step time, memory and I/O of `train --offload-optimizer DIR` (the AdamW moments on disk,
# streamed through each step) against the moments in RAM: a 234M-parameter model (2 layers, hidden
# 2048, ffn 5632, vocab 32000) at 64 tokens a step, on 1 rank (--zero 0: every moment on the rank)
# and on 2 ranks (--zero 3: each rank's shard), STEPS steps each, the two modes alternating REPEATS
# times. Prints per run the median step time of steps 2..STEPS, the tracked peak, the peak RSS of
# the largest rank and the offload's bytes and un-hidden I/O; the extra time is the faster disk
# run's median less the faster RAM run's (the runs of a busy machine vary by seconds). The final
# losses of the two modes are checked equal.
# Not a test (minutes, GBs of RAM and disk): bench/results/2026-12-07-optimizer-offload.md.
# usage: bash bench/optimizer_offload.sh [BUILD_DIR] [OFFLOAD_DIR]   (default: build, a new dir in /tmp)
#        STEPS=6 REPEATS=2
set -u
BUILD=${1:-build}
SEQPAR="$BUILD/seqpar"
OD=${2:-$(mktemp -d)}
STEPS=${STEPS:-6}
REPEATS=${REPEATS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2
export SEQPAR_PEAK_GFLOPS=${SEQPAR_PEAK_GFLOPS:-100}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
MODEL=(--layers 2 --hidden 2048 --heads 16 --kv-heads 16 --ffn 5632 --vocab 32000 --seq-len 64 --batch 2
       --steps "$STEPS" --warmup 1 --eval-every 0 --eval-seqs 1 --seed 5)
lscpu | sed -n 's/^Model name: *//p'
echo "offload directory: $OD ($(df -h "$OD" | awk 'NR == 2 { print $1 ", " $4 " free" }'))"
run() { # name np flags...
    local name=$1 np=$2
    shift 2
    local log="$T/$name.jsonl"
    rm -f "$log"
    if [ "$np" = 1 ]; then "$SEQPAR" train "${MODEL[@]}" --log "$log" "$@" >"$T/$name.out" 2>&1
    else mpirun --oversubscribe -np "$np" "$SEQPAR" train "${MODEL[@]}" --log "$log" "$@" >"$T/$name.out" 2>&1; fi ||
        { echo "$name failed: $(tail -n 2 "$T/$name.out")"; return 1; }
    local med peak rss io
    med=$(sed -nE 's/.*"step": ([0-9]+), .*"step_seconds": ([0-9.]+).*/\1 \2/p' "$log" | awk '$1 > 1 { print $2 }' | sort -n |
        awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    peak=$(sed -nE 's/.*"peak_mem_bytes": ([0-9]+),.*/\1/p' "$log" | tail -n 1)
    rss=$(sed -nE 's/.*"peak_rss_bytes_max": ([0-9]+),.*/\1/p' "$log")
    io=$(sed -nE 's/^rank 0: optimizer offload: (.*); RAM.*/\1/p' "$T/$name.out")
    printf '%-22s median step %7.3f s | tracked peak %8.1f MiB | peak RSS (largest rank) %8.1f MiB | final loss %s%s\n' \
        "$name" "$med" "$(awk -v b="$peak" 'BEGIN { print b / 1048576 }')" "$(awk -v b="$rss" 'BEGIN { print b / 1048576 }')" \
        "$(sed -nE 's/^final loss //p' "$T/$name.out")" "${io:+ | rank 0: $io}"
    echo "$med" >>"$T/$np-$(printf '%s' "$name" | cut -d' ' -f1).times"
    sed -nE 's/^final loss //p' "$T/$name.out" >"$T/$name.loss"
}
for np in 1 2; do
    z=0
    [ "$np" = 2 ] && z=3
    echo "== $np rank(s), --zero $z"
    for r in $(seq 1 "$REPEATS"); do
        run "ram #$r" "$np" --zero $z
        run "disk #$r" "$np" --zero $z --offload-optimizer "$OD"
        if cmp -s "$T/ram #$r.loss" "$T/disk #$r.loss"; then echo "  final losses equal"; else echo "  FINAL LOSSES DIFFER"; fi
    done
    ram=$(sort -n "$T/$np-ram.times" | head -n 1)
    disk=$(sort -n "$T/$np-disk.times" | head -n 1)
    awk -v r="$ram" -v d="$disk" 'BEGIN { printf "  the faster run of each: RAM %.3f s, disk %.3f s: %+.3f s a step (%+.1f%%)\n", r, d, d - r, 100 * (d - r) / r }'
    rm -f "$T/$np-ram.times" "$T/$np-disk.times"
done
