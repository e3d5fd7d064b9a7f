#!/usr/bin/env bash
# The step simulator against whole training steps measured here (issue 50, item 4). For each setting
# -- 2, 4 and 8 ranks on this one host, and 2 network-namespace hosts x 2 ranks with the link between
# them shaped (tbf) to each of RATES -- it first runs `seqpar calibrate` on exactly the ranks (and hosts)
# of that setting, so that the cluster file holds the compute rates a rank gets while the others
# compute too (4 or 8 ranks on a 2-core machine share its cores) and the links as that job sees them.
# Then, for every strategy the rank count allows and a few grid / placement / recomputation variants,
# `seqpar plan --cluster FILE --top 1 --explain` with the configuration's flags fixed predicts the step,
# and the configuration `plan` prints as best (that exact command) runs STEPS steps of `train --stats`
# on the same ranks; the measured step is the median of the steps after the first (the slowest
# rank's, as train logs it). Prints per row the error, the predicted and the measured exposed
# communication a step (plan --explain's; the most any rank waited, train --stats, over the steps),
# and per setting the mean and largest |error|, Spearman's rank correlation of predicted and
# measured steps, and whether the predicted best is within 5% of the measured best. A benchmark: it
# prints and writes a table, it asserts nothing. About 15 minutes on the 2-core machine of
# bench/results/2026-12-08-sim-vs-measured-steps.md.
#
#   bash bench/sim_vs_measured.sh [BUILD]     (root for the namespace hosts; else those settings are skipped)
#
# Environment: QUICK=1 (S = 1024, 3 steps, ranks "2 4", rates "50mbit 1gbit"), RANKS (this host's
# settings, default "2 4 8"), RATES (tbf rates of the two-host settings, default "50mbit 200mbit 1gbit";
# empty: none), SEQ (tokens, default 2048), STEPS (default 6), OUT (the markdown table; default
# bench/results/<today>-sim-vs-measured-steps.md, with QUICK=1 none).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
SEQPAR=$ROOT/$BUILD/seqpar
[ -x "$SEQPAR" ] || { echo "no $SEQPAR: build first (make -j2)"; exit 2; }
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
    RANKS=${RANKS-2 4} RATES=${RATES-50mbit 1gbit} SEQ=${SEQ:-1024} STEPS=${STEPS:-3} OUT=${OUT:-}
else
    RANKS=${RANKS-2 4 8} RATES=${RATES-50mbit 200mbit 1gbit} SEQ=${SEQ:-2048} STEPS=${STEPS:-6}
    OUT=${OUT-$ROOT/bench/results/$(date -u +%F)-sim-vs-measured-steps.md}
fi
export SEQ STEPS SEQPAR_PEAK_GFLOPS=${SEQPAR_PEAK_GFLOPS:-100} # (train's MFU line only: no start-up sgemm trials)
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2} OMP_NUM_THREADS=1
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The model: head_dim 32 (calibrate measures attention at the model's heads and head dimension), GQA
# (kv 2 of 8 heads) so that head and context parallelism move different bytes, a small vocabulary.
H=8 D=32
MODEL=(--layers 2 --hidden $((H * D)) --heads $H --kv-heads 2 --ffn 512 --vocab 256 --seq-len "$SEQ" --batch 1)
# every configuration also fixes these (one configuration per plan), unless it names its own
FIXED=(--dp 1 --zero 0 --checkpoint none --ffn-chunks 1)

# the configurations of P ranks, one a line: plan's grid flags
configs() {
    case $1 in
    2) cat <<'EOF'
--strategy ulysses --hp 2
--strategy ring --cp 2
--strategy fpdt --hp 2 --chunks 2
--strategy lightseq --cp 2
--strategy allgather --cp 2
--strategy wallfacer --cp 2 --team 1
--strategy ulysses --hp 2 --checkpoint layer
--strategy ring --cp 2 --checkpoint layer
EOF
    ;;
    4) cat <<'EOF'
--strategy ulysses --hp 4
--strategy ring --cp 4 --ring-inner 4
--strategy ring --cp 4 --ring-inner 2
--strategy 2d --hp 2 --cp 2 --placement head-first
--strategy 2d --hp 2 --cp 2 --placement context-first
--strategy fpdt --hp 4 --chunks 2
--strategy lightseq --cp 4
--strategy allgather --cp 4
--strategy wallfacer --cp 4 --team 2
--strategy ring --cp 4 --ring-inner 4 --checkpoint layer
EOF
    ;;
    8) cat <<'EOF'
--strategy ulysses --hp 8
--strategy ring --cp 8 --ring-inner 8
--strategy 2d --hp 2 --cp 4 --placement head-first
--strategy 2d --hp 4 --cp 2 --placement head-first
--strategy fpdt --hp 8 --chunks 2
--strategy lightseq --cp 8
--strategy allgather --cp 8
--strategy wallfacer --cp 8 --team 2
--strategy ring --cp 8 --ring-inner 8 --checkpoint layer
EOF
    ;;
    esac
}

# fixed flags that a configuration line does not set itself
fixed_for() {
    local line=$1 out=() i
    for ((i = 0; i < ${#FIXED[@]}; i += 2)); do
        case " $line " in *" ${FIXED[i]} "*) ;; *) out+=("${FIXED[i]}" "${FIXED[i + 1]}") ;; esac
    done
    echo "${out[*]}"
}


# calibrate's attention block sizes for P ranks: every power of two from the zigzag half-chunk (S / 2P)
# or 256, the smaller, up to S (the blocks the strategies run: half-chunks of the rings, chunks,
# FPDT's chunks, Ulysses' whole sequence), so that no block's rate is interpolated across a gap
rows_for() {
    local r=256 out=
    [ $((SEQ / (2 * $1))) -lt $r ] && r=$((SEQ / (2 * $1)))
    while [ "$r" -le "$SEQ" ]; do out=${out:+$out,}$r; r=$((r * 2)); done
    echo "$out"
}

# run_setting NAME P LAUNCH...: calibrate with LAUNCH (an mpirun prefix for P ranks), then every
# configuration of P ranks: plan's prediction and the measured median step
run_setting() {
    local name=$1 p=$2
    shift 2
    local cal="$T/cluster-$name.json" line fl best cmd pred meas i
    if ! "$@" "$SEQPAR" calibrate --out "$cal" --rows "$(rows_for "$p")" --heads $H --head-dim $D \
        --gemm-sizes 256,512,1024 --message-mib 4 --repeats 5 --name "$name" >"$T/cal.log" 2>&1 </dev/null; then
        echo "$name: calibrate failed: $(tail -n 3 "$T/cal.log")"
        return 1
    fi
    echo "$name: $(tr -d ' \n' <"$cal" | grep -oE '"(ranks_per_node|device_mem_gbs|intra_gbs|intra_node_gbs|nic_gbs|nic_latency_us|intra_latency_us|attention_backward_factor)":[0-9.e+-]+' | tr '\n' ' ')$(tr -d ' \n' <"$cal" | grep -oE '"nic_flows":\[\[[^]]*\](,\[[^]]*\])*\]' | head -n 1) $(tr -d ' \n' <"$cal" | grep -oE '"gemm":\{"fp32":\[\[[^]]*\](,\[[^]]*\])*\]' | head -n 1) $(tr -d ' \n' <"$cal" | grep -oE '"attention":\[\[[^]]*\](,\[[^]]*\])*\]' | head -n 1)" | tee -a "$T/calibrated"
    printf '%-16s %-66s %9s %9s %7s %9s %9s\n' setting configuration "pred s" "meas s" error "pred exp" "meas exp"
    configs "$p" | while read -r line; do
        fl="$line $(fixed_for "$line")"
        # shellcheck disable=SC2086
        "$SEQPAR" plan --cluster "$cal" "${MODEL[@]}" $fl --top 1 --explain >"$T/plan.out" 2>&1 </dev/null
        best=$(sed -n 's/^best: .* train //p' "$T/plan.out")
        pred=$(sed -nE 's/^ +step ([0-9.e+-]+) s = .*/\1/p' "$T/plan.out" | head -n 1)
        if [ -z "$best" ] || [ -z "$pred" ]; then
            echo "$name: plan gave no prediction for $line: $(tail -n 2 "$T/plan.out")"
            continue
        fi
        # the configuration: plan's best line without the model's flags
        cmd=${best#*--batch 1 }
        rm -f "$T/step.jsonl"
        # shellcheck disable=SC2086
        if ! "$@" "$SEQPAR" train $best --threads 1 --steps "$STEPS" --stats --eval-every 0 --eval-seqs 1 --quiet \
            --log "$T/step.jsonl" >"$T/train.out" 2>&1 </dev/null; then
            echo "$name: train failed: $cmd: $(tail -n 2 "$T/train.out")"
            continue
        fi
        meas=$(sed -nE 's/^\{"step": ([0-9]+), "loss".*"step_seconds": ([0-9.e+-]+).*/\1 \2/p' "$T/step.jsonl" |
            awk '$1 > 1 { print $2 }' | sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
        [ -n "$meas" ] || { echo "$name: no steps logged: $cmd"; continue; }
        # exposed communication a step: predicted (the slowest rank's), measured (the most a rank
        # waited over the run, --stats, over its steps)
        pexp=$(sed -nE 's/^ +step [0-9.e+-]+ s = .* \+ exposed ([0-9.e+-]+) .*/\1/p' "$T/plan.out" | head -n 1)
        mexp=$(sed -nE 's/^rank [0-9]+: .*exposed comm ([0-9.]+) s.*/\1/p' "$T/train.out" | sort -g | tail -n 1)
        mexp=$(awk -v x="${mexp:-0}" -v n="$STEPS" 'BEGIN { print x / n }')
        printf '%-16s %-66s %9.3f %9.3f %+6.0f%% %9.3f %9.3f\n' "$name" "$cmd" "$pred" "$meas" \
            "$(awk -v a="$pred" -v b="$meas" 'BEGIN { print 100 * (a - b) / b }')" "${pexp:-0}" "$mexp"
        printf '%s|%s|%s|%s|%s|%s\n' "$name" "$cmd" "$pred" "$meas" "${pexp:-0}" "$mexp" >>"$T/table"
        grep -E '^#1: |^    step ' "$T/plan.out" | head -n 2 >>"$T/explain-$name"
    done
    # the setting's figures: mean and largest |error|, Spearman rho (average ranks for ties), the
    # measured step of the predicted best against the measured best
    awk -F'|' -v S="$name" '$1 == S { n++; c[n] = $2; s[n] = $3; m[n] = $4 }
        function ranks(x, r,   i, j, less, same) {
            for (i = 1; i <= n; i++) { less = 0; same = 0
                for (j = 1; j <= n; j++) { if (x[j] < x[i]) less++; else if (x[j] == x[i]) same++ }
                r[i] = less + (same + 1) / 2 } }
        END { if (n < 2) exit
              ranks(m, rm); ranks(s, rs); mr = (n + 1) / 2; bs = 1; bm = 1; worst = 0
              for (i = 1; i <= n; i++) { num += (rm[i] - mr) * (rs[i] - mr); dm += (rm[i] - mr) ^ 2; ds += (rs[i] - mr) ^ 2
                                         e = (s[i] - m[i]) / m[i]; e = e < 0 ? -e : e; err += e; if (e > worst) worst = e
                                         if (s[i] < s[bs]) bs = i; if (m[i] < m[bm]) bm = i }
              rho = (dm > 0 && ds > 0) ? num / sqrt(dm * ds) : 0
              gap = 100 * (m[bs] - m[bm]) / m[bm]
              printf "%s: %d configurations, mean |error| %.0f%%, largest %.0f%%; Spearman rho %.2f; predicted best (%s) measured %.3f s, %.1f%% above the measured best (%s, %.3f s): %s\n",
                     S, n, 100 * err / n, 100 * worst, rho, c[bs], m[bs], gap, c[bm], m[bm], gap <= 5 ? "within 5%" : "NOT within 5%" }' \
        "$T/table" | tee -a "$T/summary"
}

# sourced by bench/multihost.sh inside its namespace hosts: one two-host setting at its RATE
if [ "${SIMVM_PART:-}" = net ]; then
    T=$SIMVM_T
    run_setting "2hosts-$RATE" 4 mh_mpirun 600 -x SEQPAR_PEAK_GFLOPS
    return 0
fi

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
: >"$T/table"     # setting|configuration|predicted|measured
: >"$T/summary"
: >"$T/calibrated"
lscpu | grep -E '^(Model name|CPU\(s\))' | sed 's/  */ /g' | tee "$T/cpu"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$T/load0"
echo "model: ${MODEL[*]}; $STEPS steps a run, the median after the first"
t0=$(date +%s)
for p in $RANKS; do
    run_setting "host-${p}r" "$p" timeout 600 mpirun --oversubscribe -np "$p"
done

if [ -n "$RATES" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "two-host settings skipped: network namespaces need root"
    else
        # bench/multihost.sh builds the hosts at each rate and sources this script's net part there,
        # where its mh_mpirun starts the job on both hosts
        export SIMVM_T=$T
        for rate in $RATES; do
            # tbf's bucket: 2 ms of the rate (at least 32 kbit), so that it reaches the rate at 1 Gbit/s
            kbit=$(awk -v r="$rate" 'BEGIN { v = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
                m = u == "gbit" ? 1e6 : u == "mbit" ? 1e3 : u == "kbit" ? 1 : -1; if (m < 0) exit 1
                b = v * m / 500; printf "%d", b < 32 ? 32 : b }') || { echo "RATES: $rate is not N(k|m|g)bit"; exit 2; }
            SIMVM_PART=net RATE=$rate BURST=${kbit}kbit HOSTS=2 SLOTS=2 bash "$ROOT/bench/multihost.sh" "$BUILD" source "$0" 2>&1 |
                grep -v '^multihost: setting up'
        done
    fi
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg); $(($(date +%s) - t0)) s"
echo "summary:"
cat "$T/summary"
if [ -n "$OUT" ]; then
    {
        echo "# $(date -u +%F): the step simulator against measured training steps (issue 50, item 4)"
        echo
        echo "Written by \`bench/sim_vs_measured.sh\` (its header says what it does). Command:"
        echo
        echo "    QUICK=$QUICK RANKS=\"$RANKS\" RATES=\"$RATES\" SEQ=$SEQ STEPS=$STEPS bash bench/sim_vs_measured.sh $BUILD"
        echo
        echo "CPU: $(sed -n 's/^Model name: //p' "$T/cpu"), $(sed -n 's/^CPU(s): //p' "$T/cpu") CPUs; code $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)."
        echo "$(cat "$T/load0"); load average at end: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs share this machine when the load is above the ranks')."
        echo "Model: \`${MODEL[*]}\`, fp32; every run \`--threads 1\`, $STEPS steps, the median step after the first."
        echo
        echo "Calibrated (each setting's \`seqpar calibrate\` on its own ranks):"
        echo
        sed 's/^/    /' "$T/calibrated"
        echo
        echo "| setting | configuration | predicted s | measured s | error | predicted exposed s | measured exposed s |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
        awk -F'|' '{ printf "| %s | `%s` | %.3f | %.3f | %+.0f%% | %.3f | %.3f |\n", $1, $2, $3, $4, 100 * ($3 - $4) / $4, $5, $6 }' "$T/table"
        echo
        echo "Per setting:"
        echo
        sed 's/^/- /' "$T/summary"
    } >"$OUT"
    echo "table written to $OUT"
fi
