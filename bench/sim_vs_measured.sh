#!/usr/bin/env bash
# The step simulator against this machine: `seqpar calibrate` measures the machine (2 ranks, one
# thread each) into a cluster file, then for each strategy on 2 ranks and each length the simulated
# forward and backward of one layer's attention (`seqpar strategies --schedule NAME --cluster FILE`)
# beside what `seqpar bench attn` measures for the same configuration, the error, and Spearman's rank
# correlation of the strategies' simulated and measured times at each length. A benchmark: it prints,
# it checks nothing; run it on an otherwise idle machine.
#
#   bash bench/sim_vs_measured.sh [BUILD] [LENGTHS]    # default: build, "4096 8192"
set -u -o pipefail
BUILD=${1:-build}
LENGTHS=${2:-4096 8192}
SEQPAR="$BUILD/seqpar"
[ -x "$SEQPAR" ] || { echo "no $SEQPAR: build first (make -j2)"; exit 2; }
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2} OMP_NUM_THREADS=1
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
lscpu | grep -E '^(Model name|CPU family|Model:|CPU\(s\)|L2 cache)' | sed 's/  */ /g'

# the strategies on 2 ranks, with the flags both commands take
CASES=("ulysses" "ring" "fpdt --chunks 2" "lightseq" "allgather" "wallfacer")
H=8 D=64

mpirun --oversubscribe -np 2 "$SEQPAR" calibrate --out "$T/me.json" --rows 128,512,2048,4096 --heads $H --head-dim $D \
    >"$T/cal.log" 2>&1 || { echo "calibrate failed: $(tail -n 3 "$T/cal.log")"; exit 1; }
echo "calibrated: $(tr -d ' \n' <"$T/me.json" | grep -o '"points":\[\[[^]]*\]\(,\[[^]]*\]\)*\]' | head -n 1) (attention TFLOP/s by rows)"
printf '%-22s %6s %10s %10s %10s %10s %8s\n' strategy S "sim fwd" "sim bwd" "meas fwd" "meas bwd" "error"
for S in $LENGTHS; do
    : >"$T/rows"
    for c in "${CASES[@]}"; do
        name=${c%% *}
        flags=${c#"$name"}
        sim=0
        for pass in "" --backward; do
            t=$("$SEQPAR" strategies --schedule "$name" --ranks 2 --seq-len "$S" --heads $H --head-dim $D $flags \
                --cluster "$T/me.json" $pass | awk '/attention ends at/ { print $7 / 1000 }')
            [ -n "$t" ] || { echo "simulation failed: $c S $S"; exit 1; }
            sim="$sim $t"
        done
        set -- $sim
        sf=$2 sb=$3
        out=$(mpirun --oversubscribe -np 2 "$SEQPAR" bench attn --strategy "$name" $flags --seq-len "$S" --heads $H \
            --head-dims $D --repeats 3 2>&1) || { echo "bench attn failed: $c S $S: $(printf '%s' "$out" | tail -n 2)"; exit 1; }
        mf=$(printf '%s\n' "$out" | sed -n 's/.*(forward \([0-9.]*\) s, backward \([0-9.]*\) s).*/\1/p' | head -n 1)
        mb=$(printf '%s\n' "$out" | sed -n 's/.*(forward \([0-9.]*\) s, backward \([0-9.]*\) s).*/\2/p' | head -n 1)
        err=$(awk -v a="$sf" -v b="$sb" -v c="$mf" -v d="$mb" 'BEGIN { printf "%+.0f%%", 100 * ((a + b) - (c + d)) / (c + d) }')
        printf '%-22s %6s %10.3f %10.3f %10.3f %10.3f %8s\n' "$c" "$S" "$sf" "$sb" "$mf" "$mb" "$err"
        printf '%s %s\n' "$(awk -v c="$mf" -v d="$mb" 'BEGIN { print c + d }')" "$(awk -v a="$sf" -v b="$sb" 'BEGIN { print a + b }')" >>"$T/rows"
    done
    awk -v S="$S" '{ m[NR] = $1; s[NR] = $2; n = NR }
        function ranks(x, r,   i, j, less, same) {
            for (i = 1; i <= n; i++) { less = 0; same = 0
                for (j = 1; j <= n; j++) { if (x[j] < x[i]) less++; else if (x[j] == x[i]) same++ }
                r[i] = less + (same + 1) / 2 } }
        END { ranks(m, rm); ranks(s, rs); mr = (n + 1) / 2
              for (i = 1; i <= n; i++) { num += (rm[i] - mr) * (rs[i] - mr); dm += (rm[i] - mr) ^ 2; ds += (rs[i] - mr) ^ 2
                                         e = (s[i] - m[i]) / m[i]; err += e < 0 ? -e : e }
              rho = 1
              if (dm > 0 && ds > 0) rho = num / sqrt(dm * ds)
              printf "S %s: mean |error| %.0f%%, Spearman rho %.2f over %d strategies\n", S, 100 * err / n, rho, n }' "$T/rows"
done
