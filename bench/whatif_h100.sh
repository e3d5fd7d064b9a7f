#!/usr/bin/env bash
# What `seqpar plan` picks on the H100 preset (h100-8x8-ndr400: DGX H100 nodes of 8 GPUs, 8 x NDR
# 400 a node, FlashAttention-3's rates; --nodes N for N x 8 GPUs) for a 7B and a 70B Llama at 128K
# to 4M tokens on 64 to 1024 GPUs, one sequence a step (all GPUs on one sequence: no data
# parallelism): the winning strategy and grid, its checkpointing and ZeRO stage, the predicted
# step and MFU, and where no configuration fits in the 80 GB of a GPU without --offload-dir (the
# host-RAM tier of FPDT's chunks and of checkpointed layers), the pick with it. Predictions from
# specifications, not measurements. Writes a markdown table (with each plan's own CPU time).
#
#   bash bench/whatif_h100.sh SEQPAR [OUT.md]   # MODELS="7b 70b" LENS="131072 ..." GPUS="64 ..."
#
# 7b: LLaMA2-7B (32 layers, hidden 4096, 32 heads, multi-head: --kv-heads 32, FFN 11008, vocab
# 32000); 70b: a Llama-3-70B shape (80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocab
# 128256). MFU: the model's FLOPs a token (Megatron-LM's count, causal attention halved, no
# recomputation) x tokens/s over GPUs x 989 TFLOP/s (H100 SXM's dense bf16 peak, datasheet).
set -u
[ $# -ge 1 ] || { sed -n '10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
SEQPAR=$1 OUT=${2:-/dev/stdout}
MODELS=${MODELS:-7b 70b}
LENS=${LENS:-131072 262144 524288 1048576 2097152 4194304}
GPUS=${GPUS:-64 128 256 512 1024}
PEAK=989e12
off=$(mktemp -d)
tmp=$(mktemp)
trap 'rm -rf "$off" "$tmp"' EXIT
model_flags() {
    case $1 in
    7b) echo "--layers 32 --hidden 4096 --heads 32 --kv-heads 32 --ffn 11008 --vocab 32000" ;;
    70b) echo "--layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 128256" ;;
    esac
}
# model FLOPs of one sequence of S tokens (forward and backward: 3x the forward's)
seq_flops() {
    local L D H KV F V
    case $1 in
    7b) L=32 D=4096 H=32 KV=32 F=11008 V=32000 ;;
    70b) L=80 D=8192 H=64 KV=8 F=28672 V=128256 ;;
    esac
    awk -v S="$2" -v L=$L -v D=$D -v H=$H -v KV=$KV -v F=$F -v V=$V 'BEGIN { HD = D / H
        printf "%.6e", 3 * (L * (2 * S * (2 * D * D + 2 * D * KV * HD) + 2 * S * 3 * D * F + 2 * S * S * D) + 2 * S * D * V) }'
}
{
    echo "# 2026-12-07: what-if on the H100 preset (issue 50 item 7)"
    echo
    echo "\`bash bench/whatif_h100.sh SEQPAR\`: \`seqpar plan --cluster h100-8x8-ndr400 --nodes N MODEL"
    echo "--precision bf16 --seq-len S --batch 1 --top 3\` for every cell (N = GPUs / 8), and where that"
    echo "finds nothing that fits in a GPU's 80 GB, again with \`--offload-dir\` (marked *offload*)."
    echo "Predictions from the preset's specifications (docs/planner.md), not measurements. MFU: the"
    echo "model's FLOPs (Megatron-LM's count, causal attention halved) over GPUs x 989 TFLOP/s."
    echo
    echo "Machine that ran the plans (their CPU time is the last column; user seconds):"
    echo
    lscpu | grep -E '^(Model name|CPU\(s\))' | sed 's/  */ /g; s/^/    /'
    echo "    load before: $(uptime | sed 's/.*load average/load average/')"
    echo
    echo "| model | tokens | GPUs | strategy | hp x cp | knobs | placement, layout | ckpt | ZeRO | step s | tokens/s | MFU | exposed s | GiB a GPU | plan CPU s |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} > "$OUT"
for model in $MODELS; do
    M=$(model_flags "$model")
    for S in $LENS; do
        for G in $GPUS; do
            nodes=$((G / 8)) mark=""
            # shellcheck disable=SC2086
            /usr/bin/time -f "CPU %U" -o "$tmp.t" "$SEQPAR" plan --cluster h100-8x8-ndr400 --nodes "$nodes" $M --precision bf16 \
                --seq-len "$S" --batch 1 --top 3 > "$tmp" 2>&1
            if grep -q "no configuration fits" "$tmp"; then
                mark=" *offload*"
                # shellcheck disable=SC2086
                /usr/bin/time -f "CPU %U" -o "$tmp.t" "$SEQPAR" plan --cluster h100-8x8-ndr400 --nodes "$nodes" $M \
                    --precision bf16 --seq-len "$S" --batch 1 --top 3 --offload-dir "$off" > "$tmp" 2>&1
            fi
            cpu=$(sed -n 's/^CPU //p' "$tmp.t")
            flops=$(seq_flops "$model" "$S")
            # row 1 of the table: its fields named by the header's (the knobs' columns between cp and placement)
            awk -v model="$model" -v S="$S" -v G="$G" -v mark="$mark" -v cpu="$cpu" -v flops="$flops" -v peak=$PEAK '
                $1 == "#" && $2 == "strategy" { nk = 0; for (i = 6; $i != "placement"; i++) knob[++nk] = $i; next }
                $1 == "1" && !done { done = 1
                    k = ""; for (i = 1; i <= nk; i++) if ($(5 + i) != "-") k = k (k ? " " : "") knob[i] "=" $(5 + i)
                    fit = ($0 ~ /does not fit/) ? " (does not fit)" : ""
                    if (fit) { n = NF - 3 } else { n = NF }
                    ram = $n; inter = $(n - 1); expo = $(n - 2); tps = $(n - 4); step = $(n - 5); zero = $(n - 6)
                    ckpt = $(n - 8); lay = $(n - 9); pl = $(n - 10)
                    printf "| %s | %dK | %d | %s%s%s | %s x %s | %s | %s, %s | %s | %s | %s | %s | %.1f%% | %s | %.1f | %s |\n",
                        model, S / 1024, G, $2, mark, fit, $4, $5, k ? k : "-", pl, lay, ckpt, zero, step, tps,
                        100 * tps / S * flops / (G * peak), expo, ram / 1024, cpu }
                END { if (!done) printf "| %s | %dK | %d | nothing runs | | | | | | | | | | | %s |\n", model, S / 1024, G, cpu }
            ' "$tmp" >> "$OUT"
        done
    done
done
echo >> "$OUT"
echo "Load after: $(uptime | sed 's/.*load average/load average/')" >> "$OUT"
