#!/usr/bin/env bash
# Every distributed attention strategy side by side: forward + backward of one causal attention
# layer (S = 16384, 8 heads, head_dim 64 unless overridden) at 2, 4 and 8 ranks with one thread
# per rank, against one rank with one thread measured in the same run. Prints, per run, what
# `seqpar bench attn` measures (slowest rank's time, compute, exposed wait, bytes and messages by
# kind) and a summary table with the speed-up over one rank.
#
#   bash bench/strategies.sh [S] [repeats] [world sizes...]     e.g. bash bench/strategies.sh 16384 3 2 4 8
#
# Not a test: the timings depend on what else the machine runs (take medians, compare ratios
# from the same run). Oversubscribed runs (more ranks than cores) measure schedules and volumes,
# not speed.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
S=${1:-16384}
REPEATS=${2:-3}
shift 2 2>/dev/null || true
SIZES=${*:-2 4 8}
make -s -j"$(nproc --all)" build/seqpar
SEQPAR=build/seqpar
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "CPU: $(lscpu | sed -nE 's/^Model name: *//p'), $(nproc --all) cores; $(date -u +%Y-%m-%d)"
one() { # label np flags...
    local label=$1 np=$2
    shift 2
    local f="$OUT/$label.txt"
    if [ "$np" -eq 1 ]; then
        "$SEQPAR" bench attn --seq-len "$S" --repeats "$REPEATS" --threads 1 --cp 1 "$@" >"$f" 2>&1
    else
        mpirun --oversubscribe -np "$np" "$SEQPAR" bench attn --seq-len "$S" --repeats "$REPEATS" --threads 1 "$@" >"$f" 2>&1
    fi
    cat "$f"
}
time_of() { sed -nE 's/^  forward\+backward ([0-9.]+) s.*/\1/p' "$OUT/$1.txt"; }
one base 1
base=$(time_of base)
rows=()
for np in $SIZES; do
    for s in 2d ulysses ring lightseq allgather wallfacer fpdt; do
        extra=()
        [ "$s" = 2d ] && { [ "$np" -ge 4 ] && extra=(--hp 2 --cp $((np / 2))) || extra=(--hp 1 --cp "$np" --ring-inner 1); }
        [ "$s" = fpdt ] && extra=(--chunks 4)
        if one "$s.$np" "$np" --strategy "$s" "${extra[@]}" >/dev/null; then
            t=$(time_of "$s.$np")
            line=$(sed -nE 's/^  sent per rank \(most of any rank\), forward \+ backward: (.*)$/\1/p' "$OUT/$s.$np.txt")
            ex=$(sed -nE 's/.*exposed communication ([0-9.]+) s.*/\1/p' "$OUT/$s.$np.txt")
            cs=$(sed -nE 's/^  compute ([0-9.]+) s.*/\1/p' "$OUT/$s.$np.txt")
            grid=$(sed -nE 's/.* on ([a-z0-9]+(, team [0-9]+)?): dp 1 x hp ([0-9]+) x cp ([0-9]+) \(ring W ([0-9]+)\).*/hp \3 x cp \4, W \5\2/p' "$OUT/$s.$np.txt")
            [ "$s" = fpdt ] && grid="$grid, 4 chunks"
            rows+=("$(printf '| %d | %s | %s | %s | %s | %s | %s | %.2fx |' "$np" "$s" "$grid" "$t" "$cs" "$ex" "$line" "$(echo "$base / $t" | bc -l)")")
        else
            rows+=("| $np | $s | cannot run: $(grep -m1 'error' "$OUT/$s.$np.txt") | | | | | |")
        fi
    done
done
echo
echo "S = $S, one thread per rank; 1 rank x 1 thread: $base s"
echo "| ranks | strategy | grid | slowest rank fwd+bwd (s) | compute (s, max rank) | exposed wait (s, max rank) | sent per rank by kind (max rank) | speed-up |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
