#!/usr/bin/env bash
# FPDT's own measurements (paper 003: nodes of 4 A100, NVLink, 1 TB host memory, PCIe 32 GB/s a
# direction, HDR 200 InfiniBand) replayed by `seqpar plan --cluster fpdt-a100-80g|fpdt-a100-40g`:
# each configuration's attention schedule played on the preset by the step simulator, the GEMMs at
# the preset's rate, the memory model deciding what fits in the GPU's memory (HBM as RAM per rank,
# the host memory as the tier FPDT's idle chunks and the checkpointed layer inputs go to).
#
#   Table 4   MFU at attention sparsity 0.0 (full attention), 256K tokens, 64K chunks (--chunks 4),
#             2.7B GPT on 1 GPU, Llama 3 8B and 13B GPT on 4 GPUs: --strategy fpdt, --checkpoint layer
#             with --offload-dir (activation checkpointing with CPU offload, §5.2), --zero 3.
#   Table 3   Llama 3 8B on 8 GPUs (2 nodes of 4): the Ulysses rows (ZeRO-1/2/3 without checkpointing
#             at their 64K, with checkpointing + offload at their 512K) and FPDT's (ZeRO-3, 4M, 64K
#             chunks): MFU at the row's length, and the longest length (of 64K, 128K, ..., 8M)
#             the planner finds a fitting configuration for, against the row's "Max len.". The
#             tensor-parallel rows are not replayed: seqpar has no tensor parallelism.
#   Table 1   FPDT's longest context, 2.7B / 8B / 13B on 1-8 A100 40G and 4-32 A100 80G (offload,
#             ZeRO-3), against the longest length (128K ... 8M) the planner finds a fitting FPDT
#             configuration for (its choice of chunks).
#
# MFU: FPDT does not state its formula; it is computed here as Megatron-DeepSpeed's throughput
# calculator does (the code FPDT ships in): 24 f L h^2 (1 + S / 6h + V / 16 L h) FLOPs a token, f = 4
# with activation checkpointing (its recomputation counted) and 3 without, over 312 TFLOPS a GPU.
# Models: the GPT-3 paper's shapes for GPT 2.7B (32 layers, hidden 2560, 32 heads) and 13B (40,
# 5120, 40), vocabulary 50257, their GELU MLP of 4h given as seqpar's SwiGLU of the same FLOPs (ffn =
# 8h/3); Llama 3 8B as published (32 layers, 4096, 32 heads, 8 KV heads, ffn 14336, vocabulary
# 128256). bf16, batch 1. The presets' values come from datasheets, published microbenchmarks and the
# paper's setup section (clusters/fpdt-a100-*.json name each source); none was fitted to these
# tables. A benchmark: it prints, it checks nothing.
#
#   bash bench/paper_fpdt.sh [BUILD]
set -u -o pipefail
BUILD=${1:-build}
SEQPAR="$BUILD/seqpar"
[ -x "$SEQPAR" ] || { echo "no $SEQPAR: build first (make -j2)"; exit 2; }
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
OFF=$(mktemp -d)
trap 'rmdir "$OFF"' EXIT

# model name -> "layers hidden heads kv_heads ffn vocab"
shape() {
    case $1 in
        2.7B) echo "32 2560 32 32 6827 50257" ;;
        8B) echo "32 4096 32 8 14336 128256" ;;
        13B) echo "40 5120 40 40 13653 50257" ;;
    esac
}

# one plan's best row: cluster GPUs model S strategy hp chunks checkpoint zero offload(0/1) -> "step tokens/s"
# ("" where nothing fits or the run fails; tried twice: Open MPI's start-up can fail on a busy machine)
plan_row() {
    local out nodes=$(( ($2 + 3) / 4 )) rpn=4 s off=() z=$9
    [ "$2" -lt 4 ] && rpn=$2 && nodes=1
    read -r L D H KV F V <<<"$(shape "$3")"
    [ "${10}" = 1 ] && off=(--offload-dir "$OFF")
    [ "$2" = 1 ] && z=0 # one rank: nothing to shard (seqpar's ZeRO needs two)
    s=(--strategy "$5" --dp 1 --hp "$6" --cp 1)
    [ "$5" = fpdt ] && [ "$7" != 0 ] && s+=(--chunks "$7") # 0: the planner chooses
    for _ in 1 2; do
        out=$("$SEQPAR" plan --cluster "$1" --nodes "$nodes" --ranks-per-node "$rpn" --layers "$L" --hidden "$D" \
            --heads "$H" --kv-heads "$KV" --ffn "$F" --vocab "$V" --seq-len "$4" --batch 1 --precision bf16 \
            "${s[@]}" --checkpoint "$8" --zero "$z" "${off[@]}" --top 1 2>&1)
        grep -q "does not fit" <<<"$out" && return # a real answer: nothing fits (the nearest is listed)
        if awk -v s="$5" '$1 == "1" && $2 == s { found = 1 } END { exit !found }' <<<"$out"; then
            awk -v s="$5" '$1 == "1" && $2 == s { print $14, $15 }' <<<"$out"; return
        fi
    done
}
# MFU (%) as Megatron-DeepSpeed computes it: model S tokens_per_s GPUs factor
mfu() {
    read -r L D _ _ _ V <<<"$(shape "$1")"
    awk -v L="$L" -v D="$D" -v V="$V" -v S="$2" -v tps="$3" -v P="$4" -v f="$5" 'BEGIN {
        printf "%.1f", 100 * tps * 24 * f * L * D * D * (1 + S / (6 * D) + V / (16 * L * D)) / (P * 312e12) }'
}
# MFU (%) as LoongTrain counts it (bench/paper_step.sh): Megatron-LM's FLOPs, no recomputation, causal
# attention halved: model S tokens_per_s GPUs
mfu_causal() {
    read -r L D H KV F V <<<"$(shape "$1")"
    awk -v L="$L" -v D="$D" -v KV="$KV" -v HD=$(($2 > 0 ? D / H : 0)) -v F="$F" -v V="$V" -v S="$2" -v tps="$3" -v P="$4" 'BEGIN {
        tok = 3 * (L * (2 * (2 * D * D + 2 * D * KV * HD) + 2 * 3 * D * F + 2 * S * D) + 2 * D * V)
        printf "%.1f", 100 * tps * tok / (P * 312e12) }'
}
# FPDT's chunks for S tokens: 64K each, as the paper's runs, but at most 64 (the planner lists no
# more: at 8M the chunks are 128K)
fpdt_chunks() { local u=$(($1 / 65536)); [ "$u" -lt 1 ] && u=1; [ "$u" -gt 64 ] && u=64; echo "$u"; }
# the longest of the lengths LIST (ascending; the search stops at the first that does not fit) for
# which the planner finds a fitting configuration, FPDT's chunks its choice (it lists powers of two
# up to 64: 3M tokens in 48 chunks of 64K is not among them) that fits: cluster GPUs model strategy hp checkpoint zero offload LIST...
longest() {
    local c=$1 p=$2 m=$3 st=$4 hp=$5 ck=$6 z=$7 o=$8 best=- S
    shift 8
    for S in "$@"; do
        [ -n "$(plan_row "$c" "$p" "$m" "$S" "$st" "$hp" 0 "$ck" "$z" "$o")" ] || break # longer fits no better
        best=$S
    done
    echo "$best"
}
k() { awk -v s="$1" 'BEGIN { if (s == "-") print "-"; else if (s >= 1048576) printf "%gM", s / 1048576; else printf "%dK", s / 1024 }'; }

rows=$(mktemp)
trap 'rm -f "$rows"; rmdir "$OFF"' EXIT
echo "Table 4, sparsity 0.0: MFU (%), 256K tokens, 64K chunks, FPDT with offload, ZeRO-3, A100 80G"
for spec in "2.7B 1 38.4" "8B 4 47.6" "13B 4 46.1"; do
    read -r m p meas <<<"$spec"
    r=$(plan_row fpdt-a100-80g "$p" "$m" 262144 fpdt "$p" 4 layer 3 1)
    [ -n "$r" ] || { echo "  $m on $p: no fitting configuration (measured $meas%)"; continue; }
    read -r step tps <<<"$r"
    pred=$(mfu "$m" 262144 "$tps" "$p" 4) pc=$(mfu_causal "$m" 262144 "$tps" "$p")
    echo "T4 $m $meas $pred $pc" >>"$rows"
    printf '  %-5s %d GPU  measured %5.1f%%  predicted %5.1f%% (Megatron-DeepSpeed'"'"'s count), %5.1f%% (causal, no recomputation); step %s s, %s tokens/s\n' \
        "$m" "$p" "$meas" "$pred" "$pc" "$step" "$tps"
done
echo
echo "Table 3: Llama 3 8B on 8 GPUs (2 nodes of 4, A100 80G): MFU (%) at the row's length; longest length that fits"
LENS=(65536 131072 262144 524288 1048576 2097152 4194304 8388608)
# strategy zero checkpoint offload S measured_mfu measured_max label
while read -r st z ck o S meas mx lab; do
    f=3; [ "$ck" != none ] && f=4
    r=$(plan_row fpdt-a100-80g 8 8B "$S" "$st" 8 "$(fpdt_chunks "$S")" "$ck" "$z" "$o")
    pred=- pc=-; [ -n "$r" ] && pred=$(mfu 8B "$S" "${r#* }" 8 "$f") && pc=$(mfu_causal 8B "$S" "${r#* }" 8)
    lg=$(longest fpdt-a100-80g 8 8B "$st" 8 "$ck" "$z" "$o" "${LENS[@]}")
    [ "$pred" != - ] && echo "T3 $lab $meas $pred $pc" >>"$rows"
    printf '  %-18s at %-4s measured MFU %5.1f%%  predicted %5s%% / %5s%%   max len measured %-4s planner %s\n' "$lab" \
        "$(k "$S")" "$meas" "$pred" "$pc" "$mx" "$(k "$lg")"
done <<'EOF'
ulysses 1 none 0 65536 15.3 64K UL+ZeRO-1
ulysses 2 none 0 65536 15.3 64K UL+ZeRO-2
ulysses 3 none 0 65536 21.0 64K UL+ZeRO-3
ulysses 1 layer 1 524288 46.8 512K AC+OC+UL+ZeRO-1
ulysses 2 layer 1 524288 46.8 512K AC+OC+UL+ZeRO-2
ulysses 3 layer 1 524288 47.2 512K AC+OC+UL+ZeRO-3
fpdt 3 layer 1 4194304 55.7 4M AC+OC+FPDT+ZeRO-3
EOF
echo
echo "Table 1: FPDT's longest context (offload, ZeRO-3; the planner's chunks): measured / planner"
T1LENS=(131072 262144 524288 1048576 2097152 3145728 4194304 8388608)
# model then the measured maxima on A100 40G x 1 2 4 8 and A100 80G x 4 8 16 32
agree=0 n=0
while read -r m rest; do
    read -r -a meas <<<"$rest"
    line="  $(printf '%-5s' "$m")"
    i=0
    for cfg in 40g:1 40g:2 40g:4 40g:8 80g:4 80g:8 80g:16 80g:32; do
        c=fpdt-a100-${cfg%%:*} p=${cfg##*:}
        lg=$(longest "$c" "$p" "$m" fpdt "$p" layer 3 1 "${T1LENS[@]}")
        line+=$(printf '  %s/%s: %s / %s' "${cfg%%:*}" "$p" "${meas[$i]}" "$(k "$lg")")
        if [ "${meas[$i]}" != - ] || [ "$lg" != - ]; then
            n=$((n + 1))
            mk=${meas[$i]%+}
            [ "$mk" = "$(k "$lg")" ] && agree=$((agree + 1))
        fi
        i=$((i + 1))
    done
    echo "$line"
done <<'EOF'
2.7B 128K 512K 2M 4M 4M 8M+ 8M+ 8M+
8B - - - 1M 2M 4M 8M+ 8M+
13B - - - 256K 512K 3M 4M 8M+
EOF
echo "Table 1: the planner's longest length equals the measured one in $agree of $n cells (8M+: the paper tested no further; the planner's list ends at 8M)"
echo
awk '{ e = ($4 - $3) / $3; err[$1] += e < 0 ? -e : e; e = ($5 - $3) / $3; errc[$1] += e < 0 ? -e : e; n[$1]++ }
     END { for (t in n) printf "%s: %d cells, mean |MFU error| %.0f%% with Megatron-DeepSpeed'"'"'s count, %.0f%% with the causal one (relative)\n",
           t, n[t], 100 * err[t] / n[t], 100 * errc[t] / n[t] }' "$rows" | sort
