#!/usr/bin/env bash
# LoongTrain's Table 3 (end-to-end MFU of LLaMA2-7B, MHA and GQA with 8 KV heads, on 64 A800s with
# d_sp = 64, 128K to 1M tokens, with and without Selective Checkpoint++, head-first and
# context-first) against `seqpar plan` on the loongtrain-a800 preset: for each of the table's 16
# columns (a model, a length, SC++ or full checkpointing) it predicts the paper's 12 configurations
# (6 grids hp x cp, 2 placements; 2d with the plain ring) and reports the measured MFU of the
# configuration the planner ranks first against the column's best, Spearman's rank correlation and
# the predicted MFU beside the measured one.
#
# Settings taken from the paper: bf16; SC++ = seqpar's --checkpoint selective (attention's output
# kept, the projections recomputed), without it --checkpoint layer ("activation checkpointing is
# enabled by default", §6.1); ZeRO-1 over the 64 ranks; a global batch of 4M tokens (§2: 4M / S
# sequences a step, one replica); MFU as the paper computes it (Megatron-LM's FLOPs with attention's
# halved for the causal mask, over 312 TFLOPS a GPU). The cluster's values come from datasheets
# and published microbenchmarks; none is fitted to these tables. A benchmark: it prints, it checks
# nothing.
#
#   bash bench/paper_step.sh [BUILD] [CLUSTER]    # default: build, loongtrain-a800
#   FORMULA=1 bash bench/paper_step.sh ...        # the same cluster without the simulator: attention
#                                                 # at the cluster's rate for S/P-row blocks, traffic
#                                                 # by the formulas (planner.h), as before the simulator
set -u -o pipefail
BUILD=${1:-build}
CLUSTER=${2:-loongtrain-a800}
SEQPAR="$BUILD/seqpar"
[ -x "$SEQPAR" ] || { echo "no $SEQPAR: build first (make -j2)"; exit 2; }
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}

# Table 3 as printed: model cp hp, then per length (128K 256K 512K 1M) SC++ HF, SC++ CF, w/o HF, w/o CF
TABLE3="MHA 64 1 0.092 0.092 0.070 0.070 0.159 0.159 0.122 0.122 0.290 0.290 0.221 0.221 0.452 0.452 0.357 0.357
MHA 32 2 0.099 0.158 0.077 0.126 0.173 0.278 0.133 0.219 0.316 0.434 0.243 0.353 0.475 0.486 0.394 0.406
MHA 16 4 0.176 0.245 0.141 0.205 0.314 0.378 0.248 0.317 0.470 0.472 0.384 0.388 0.520 0.509 0.418 0.413
MHA 8 8 0.283 0.321 0.236 0.282 0.434 0.420 0.361 0.357 0.502 0.478 0.409 0.394 0.527 0.521 0.424 0.420
MHA 4 16 0.328 0.327 0.289 0.283 0.436 0.423 0.369 0.359 0.487 0.476 0.399 0.394 0.519 0.520 0.418 0.412
MHA 2 32 0.320 0.329 0.284 0.293 0.421 0.421 0.353 0.357 0.474 0.478 0.388 0.394 0.517 0.517 0.415 0.406
GQA 64 1 0.255 0.255 0.196 0.196 0.379 0.379 0.308 0.308 0.470 0.470 0.378 0.378 0.508 0.508 0.406 0.406
GQA 32 2 0.283 0.317 0.233 0.269 0.419 0.429 0.345 0.354 0.492 0.485 0.398 0.392 0.521 0.516 0.418 0.416
GQA 16 4 0.354 0.338 0.309 0.294 0.466 0.437 0.385 0.373 0.505 0.494 0.410 0.404 0.531 0.526 0.425 0.426
GQA 8 8 0.377 0.354 0.327 0.310 0.480 0.452 0.392 0.380 0.516 0.502 0.419 0.412 0.543 0.536 0.435 0.432
GQA 4 16 0.354 0.341 0.310 0.308 0.457 0.437 0.377 0.373 0.500 0.493 0.409 0.405 0.532 0.529 0.428 0.419
GQA 2 32 0.323 0.333 0.285 0.295 0.424 0.422 0.349 0.360 0.476 0.481 0.389 0.394 0.518 0.518 0.415 0.406"

LENS=(131072 262144 524288 1048576)
NAMES=(128K 256K 512K 1M)
L=32 D=4096 F=11008 V=32000 H=32 HD=128

# predicted tokens/s of one configuration: kv cp hp placement S checkpoint (tried twice: Open MPI's
# start-up can fail on a busy machine); "" where it fails
predict() {
    local t try grid="--strategy 2d --hp $3 --cp $2" rates=""
    [ "$3" = 1 ] && grid="--strategy ring --cp $2" # hp 1: the plan lists 2d's corner as the ring
    local args=(plan --cluster "$CLUSTER" --layers $L --hidden $D --heads $H --kv-heads "$1" --ffn $F --vocab $V
                --seq-len "$5" --batch $((4194304 / $5)) --precision bf16 $grid --ring-inner "$2" --placement "$4"
                --checkpoint "$6" --zero 1 --top 1)
    if [ -n "${FORMULA:-}" ]; then # the rates the cluster gives, as flags: no simulator
        rates=$("$SEQPAR" "${args[@]}" 2>/dev/null | sed -n 's/.*attention \([0-9.]*\) \/ \([0-9.]*\) GFLOPS.*/\1,\2/p')
        args+=(--attn-gflops "$rates")
    fi
    for try in 1 2; do
        t=$("$SEQPAR" "${args[@]}" 2>/dev/null | awk '$1 == "1" && ($2 == "2d" || $2 == "ring") { print $15 }')
        [ -n "$t" ] && break
    done
    echo "$t"
}
# MFU of tokens/s: kv S tokens_per_s (the paper's FLOPs: Megatron-LM's, attention halved; 64 x 312 TFLOPS)
mfu() {
    awk -v kv="$1" -v S="$2" -v tps="$3" -v L=$L -v D=$D -v F=$F -v V=$V -v HD=$HD 'BEGIN {
        per_seq = 3 * (L * (2 * S * (2 * D * D + 2 * D * kv * HD) + 2 * S * 3 * D * F + 2 * S * S * D) + 2 * S * D * V)
        printf "%.3f", tps / S * per_seq / (64 * 312e12) }'
}

rows=$(mktemp)
summary=$(mktemp)
trap 'rm -f "$rows" "$summary"' EXIT
echo "cluster: $CLUSTER; attention $([ -n "${FORMULA:-}" ] && echo "by the formulas (no simulator)" || echo "played by the step simulator")"
for model in MHA GQA; do
    kv=32; [ "$model" = GQA ] && kv=8
    for i in 0 1 2 3; do
        for sc in 0 1; do # 0: SC++ (selective), 1: without (layer)
            ckpt=selective; [ $sc = 1 ] && ckpt=layer
            : >"$rows"
            printf '%s\n' "$TABLE3" | awk -v m="$model" '$1 == m' | while read -r _ cp hp rest; do
                vals=($rest)
                for p in 0 1; do
                    pl=head-first; [ $p = 1 ] && pl=context-first
                    measured=${vals[$((i * 4 + sc * 2 + p))]}
                    tps=$(predict "$kv" "$cp" "$hp" "$pl" "${LENS[$i]}" "$ckpt")
                    [ -n "$tps" ] || { echo "plan failed: $model cp $cp hp $hp $pl S ${LENS[$i]} $ckpt" >&2; exit 1; }
                    pred=$(mfu "$kv" "${LENS[$i]}" "$tps")
                    # the rank columns take times: lower is better, so 1 / MFU
                    printf 'cp%sxhp%s/%sF %s %s %s\n' "$cp" "$hp" "${pl:0:1}" "$measured" "$pred" "$tps" >>"$rows"
                    printf '  %s %-4s %-9s cp%-2s x hp%-2s %-13s measured MFU %.3f  predicted %.3f\n' "$model" \
                        "${NAMES[$i]}" "$ckpt" "$cp" "$hp" "$pl" "$measured" "$pred"
                done
            done || exit 1
            awk -v what="$model ${NAMES[$i]} $([ $sc = 0 ] && echo SC++ || echo 'w/o SC++')" '
            { label[NR] = $1; m[NR] = $2; p[NR] = $3; n = NR }
            function ranks(x, r,   i, j, more, same) {
                for (i = 1; i <= n; i++) { more = 0; same = 0
                    for (j = 1; j <= n; j++) { if (x[j] > x[i]) more++; else if (x[j] == x[i]) same++ }
                    r[i] = more + (same + 1) / 2 }
            }
            END {
                bm = 1; bp = 1
                for (i = 1; i <= n; i++) { if (m[i] > m[bm]) bm = i; if (p[i] > p[bp]) bp = i }
                ranks(m, rm); ranks(p, rp)
                mr = (n + 1) / 2; num = 0; dm = 0; dp = 0
                for (i = 1; i <= n; i++) { num += (rm[i] - mr) * (rp[i] - mr); dm += (rm[i] - mr) ^ 2; dp += (rp[i] - mr) ^ 2 }
                rho = dm > 0 && dp > 0 ? num / sqrt(dm * dp) : 1
                short = 100 * (m[bm] - m[bp]) / m[bm]
                printf "%-20s measured best %-12s (%.3f)  planner pick %-12s (measured %.3f: %.1f%% below, %s)  rho %.2f\n",
                    what, label[bm], m[bm], label[bp], m[bp], short, short <= 3 ? "within 3%" : "NOT within 3%", rho
            }' "$rows" | tee -a "$summary"
        done
    done
done
echo
awk '{ n++; if ($0 ~ /within 3%\)/ && $0 !~ /NOT within/) w++
       for (i = 1; i <= NF; i++) { if ($i == "rho") r += $(i + 1); if ($i == "below,") b += substr($(i - 1), 1, length($(i - 1)) - 1) + 0 } }
     END { printf "Table 3: the planner'"'"'s pick within 3%% of the measured best in %d of %d columns; its measured MFU on average %.1f%% below the best; mean rho %.2f\n", w, n, b / n, r / n }' "$summary"
