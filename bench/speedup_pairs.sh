#!/usr/bin/env bash
# Speed-up of each strategy on 2 ranks (one thread each) over one rank with one thread, measured in
# PAIRS: every 2-rank run is preceded by its own 1-rank run, and the speed-up of a strategy is the
# median over the rounds of (1-rank time / 2-rank time) of its pairs. On a shared or virtualised
# machine whose speed drifts by several percent within minutes, a ratio of two runs taken seconds
# apart is far less noisy than a ratio against one baseline taken at the start (bench/strategies.sh).
# Times are `seqpar bench attn`'s forward + backward of one causal attention layer (S = 16384,
# 8 heads, head_dim 64 unless overridden), median of REPEATS timed runs per process.
#
#   bash bench/speedup_pairs.sh [S] [rounds] [repeats] [strategies...]   e.g. bash bench/speedup_pairs.sh 16384 3 1
#
# Not a test: it prints the per-round ratios and their median per strategy.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
S=${1:-16384}
ROUNDS=${2:-3}
REPEATS=${3:-1}
shift 3 2>/dev/null || true
STRATS=${*:-2d ulysses ring lightseq allgather wallfacer fpdt}
make -s -j"$(nproc --all)" build/seqpar
SEQPAR=build/seqpar
echo "CPU: $(lscpu | sed -nE 's/^Model name: *//p'), $(nproc --all) cores; $(date -u '+%Y-%m-%d %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
time_of() { sed -nE 's/^  forward\+backward ([0-9.]+) s.*/\1/p'; }
declare -A ratios
for r in $(seq 1 "$ROUNDS"); do
    for s in $STRATS; do
        extra=()
        [ "$s" = 2d ] && extra=(--hp 1 --cp 2 --ring-inner 1)
        [ "$s" = fpdt ] && extra=(--chunks 4)
        one=$("$SEQPAR" bench attn --seq-len "$S" --repeats "$REPEATS" --threads 1 --cp 1 | time_of)
        two=$(mpirun --oversubscribe -np 2 "$SEQPAR" bench attn --seq-len "$S" --repeats "$REPEATS" --threads 1 \
              --strategy "$s" "${extra[@]}" | time_of)
        ratio=$(echo "$one / $two" | bc -l)
        ratios[$s]="${ratios[$s]:-} $ratio"
        printf 'round %d %-10s 1 rank %6.3f s, 2 ranks %6.3f s: %.3fx\n' "$r" "$s" "$one" "$two" "$ratio"
    done
done
echo
echo "S = $S, one thread per rank, $ROUNDS rounds of pairs; load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| strategy | speed-up per round | median |"
echo "| --- | --- | --- |"
for s in $STRATS; do
    med=$(printf '%s\n' ${ratios[$s]} | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    printf '| %s | %s | %.2fx |\n' "$s" "$(printf '%s\n' ${ratios[$s]} | awk '{ printf "%s%.2fx", (NR > 1 ? ", " : ""), $1 }')" "$med"
done
