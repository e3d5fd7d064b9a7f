#!/bin/bash
# How close `seqpar plan`'s predicted step is to a measured one on this machine: for each
# configuration, `seqpar train` runs STEPS steps on text and the median tokens/s of the steps after
# the first is set against what `seqpar plan` (the kernels' rates measured here, one thread per core on every core at once)
# predicts for the same flags. One node, so no cross-node link is exercised.
# Usage: bench/plan_check.sh [BUILD] [SEQ_LEN] [STEPS]
set -u
BUILD=${1:-build}
S=${2:-16384}
STEPS=${3:-3}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SEQPAR="$BUILD/seqpar"
CORES=$(nproc)
M="--layers 4 --hidden 256 --heads 4 --kv-heads 2 --ffn 1024 --vocab 256 --seq-len $S --batch 1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for i in 1 2 3 4 5 6 7 8; do cat README.md; done >"$TMP/text.txt"
echo "CPU: $(lscpu | sed -nE 's/^Model name: +//p'), $CORES cores; S = $S, reference model, $STEPS steps each"
# the rates once, then given to every prediction (the same yardstick for every row)
rates=$("$SEQPAR" plan --ranks 1 $M --top 1 | sed -nE 's/^rates per thread: GEMM ([0-9.]+) GFLOPS.*attention ([0-9.]+) \/ ([0-9.]+) GFLOPS.*/\1 \2 \3/p')
read -r G F B <<<"$rates"
echo "rates per thread (measured by seqpar plan, every core at once): GEMM $G, attention $F / $B GFLOPS"
printf "%-72s %10s %10s %7s\n" "configuration" "predicted" "measured" "ratio"
row() { # np flags...
    local np=$1
    shift
    local pred meas
    # the first row train runs: one FFN chunk (column 11) only where the flags ask for it (the
    # planner lists it under --checkpoint none beside the default's chunks)
    local one=0
    case " $* " in *" --ffn-chunks 1 "*) one=1 ;; esac
    pred=$("$SEQPAR" plan --ranks "$np" --cores-per-node "$CORES" $M --gemm-gflops "$G" --attn-gflops "$F,$B" --top 5 "$@" |
        awk -v one="$one" '/^ +[0-9]+  [a-z0-9]+ / && (one || $12 != 1) { print $15; exit }')
    # one rank: unbound, so that it gets every core (Open MPI binds a lone rank to one core)
    local bind=""
    [ "$np" -eq 1 ] && bind="--bind-to none"
    mpirun --oversubscribe $bind -n "$np" "$SEQPAR" train $M --data "$TMP/text.txt" --tokens-format text --steps "$STEPS" --quiet \
        --log "$TMP/log.jsonl" "$@" >"$TMP/out" 2>&1 || { echo "train failed: $(tail -n 2 "$TMP/out")"; return; }
    meas=$(sed -nE 's/.*"step": ([0-9]+),.*"tokens_per_s": ([0-9.]+),.*/\1 \2/p' "$TMP/log.jsonl" | awk '$1 > 1 { print $2 }' |
        sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    rm -f "$TMP/log.jsonl"
    printf "%-72s %10.0f %10.0f %7.3f\n" "$np rank(s): $*" "$pred" "$meas" "$(awk -v p="$pred" -v m="$meas" 'BEGIN { print p / m }')"
}
row 1 --strategy 2d --dp 1 --hp 1 --cp 1 --checkpoint none --zero 0
row 1 --strategy 2d --dp 1 --hp 1 --cp 1 --checkpoint none --ffn-chunks 1 --zero 0
row 2 --strategy ring --dp 1 --cp 2 --checkpoint none --zero 0
row 2 --strategy ulysses --dp 1 --hp 2 --checkpoint none --zero 0
row 2 --strategy lightseq --dp 1 --cp 2 --checkpoint none --zero 0
row 2 --strategy allgather --dp 1 --cp 2 --checkpoint none --zero 0
row 2 --strategy ring --dp 1 --cp 2 --checkpoint selective --zero 0
row 2 --strategy ring --dp 1 --cp 2 --checkpoint layer --zero 0
row 2 --strategy fpdt --dp 1 --hp 2 --chunks 4 --checkpoint none --zero 0
