#!/usr/bin/env bash
# Two seqpar binaries against each other on the speeds a refactor must keep: `bench step` (one
# process) and `bench attn` of every strategy on 2 ranks, alternating the binaries run by run
# (A B A B ...) so that a shared machine's drift falls on both, and printing each one's runs and
# medians. Not a test: the figures go to bench/results/ with the CPU.
#
#   bash bench/ab_speed.sh A_SEQPAR B_SEQPAR [ROUNDS]    # default 3 rounds
#
# Environment: SEQ_STEP (default 4096) and SEQ_ATTN (8192) are the lengths; STRATEGIES the list
# (default: every registered strategy, as `seqpar strategies --names` of B prints them).
set -u
[ $# -ge 2 ] || { sed -n '6,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
A=$1 B=$2 ROUNDS=${3:-3}
SEQ_STEP=${SEQ_STEP:-4096} SEQ_ATTN=${SEQ_ATTN:-8192}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
STRATEGIES=${STRATEGIES:-$("$B" strategies --names)}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

lscpu | grep -E '^(Model name|CPU\(s\)|L2 cache)' | sed 's/  */ /g'
echo "A = $A"
echo "B = $B"

# bench step: tokens/s of one process
step_of() { OMP_NUM_THREADS=2 "$1" bench step --seq-len "$SEQ_STEP" --repeats 3 2>/dev/null | sed -nE 's/.* ([0-9.]+) tokens\/s.*/\1/p' | head -n 1; }
sa="" sb=""
for r in $(seq "$ROUNDS"); do
    sa="$sa $(step_of "$A")"
    sb="$sb $(step_of "$B")"
done
printf 'bench step --seq-len %s, tokens/s: A %s (median %s), B %s (median %s)\n' "$SEQ_STEP" "$sa" \
    "$(printf '%s\n' $sa | median)" "$sb" "$(printf '%s\n' $sb | median)"

# bench attn on 2 ranks: forward + backward seconds
flags_of() {
    case $1 in
    2d) echo "--hp 2" ;;
    fpdt) echo "--chunks 2" ;;
    lightseq) echo "--layout contiguous" ;;
    *) echo "" ;;
    esac
}
attn_of() { # binary strategy
    timeout 300 mpirun --oversubscribe -np 2 "$1" bench attn --strategy "$2" $(flags_of "$2") --seq-len "$SEQ_ATTN" \
        --repeats 3 2>/dev/null | sed -nE 's/.*forward\+backward ([0-9.]+) s .*/\1/p' | head -n 1
}
for s in $STRATEGIES; do
    aa="" ab=""
    for r in $(seq "$ROUNDS"); do
        aa="$aa $(attn_of "$A" "$s")"
        ab="$ab $(attn_of "$B" "$s")"
    done
    printf 'bench attn --strategy %s (2 ranks, S %s), fwd+bwd s: A %s (median %s), B %s (median %s)\n' "$s" "$SEQ_ATTN" \
        "$aa" "$(printf '%s\n' $aa | median)" "$ab" "$(printf '%s\n' $ab | median)"
done
