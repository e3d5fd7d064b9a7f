# Peak RAM per token of one training step of the reference model (4 layers, hidden 256, 4 heads /
# 2 KV heads, ffn 1024, vocab 256) under each memory feature alone and all together, at the given
# lengths on 1 and 2 ranks: the memory model's figure (`seqpar memory`, instant) and, with
# --measure, the measured peak tracked memory and RSS of one real step (`seqpar bench memory`;
# slow: minutes per configuration at S = 16K on 2 cores). FPDT with --chunks > 1 streams its layers
# chunk by chunk under none and layer; "whole layers" rows run them whole (--no-stream), as before
# streaming. Each row in fp32 and in bf16 (--precision bf16: the layers' kept attention tensors and
# the strategies' copies of q, k, v in bf16, bf16 GEMM copies and attention tiles, the bf16 wire).
# Not a test: the README quotes it.
# usage: bash bench/memory_features.sh [--measure] [BUILD_DIR] [S ...]   (default: build 16384 65536)
#        MEASURE_PRECISIONS="bf16" measures only that precision's column (default: "fp32 bf16")
set -u
MEASURE=0
if [ "${1:-}" = "--measure" ]; then MEASURE=1; shift; fi
BUILD=${1:-build}
shift || true
LENS=${*:-16384 65536}
SEQPAR="$BUILD/seqpar"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OFF=$(mktemp -d)
trap 'rm -rf "$OFF"' EXIT
REF="--layers 4 --hidden 256 --ffn 1024 --heads 4 --kv-heads 2 --vocab 256 --batch 1"
# name | flags on 1 rank | flags on 2 ranks (head parallel: the sequence split over both)
CONFIGS=(
    "baseline (none, 1 FFN chunk)|--checkpoint none --ffn-chunks 1|--strategy ulysses --checkpoint none --ffn-chunks 1"
    "chunked FFN (64 chunks)|--ffn-chunks 64|--strategy ulysses --ffn-chunks 64"
    "--checkpoint selective|--checkpoint selective --ffn-chunks 1|--strategy ulysses --checkpoint selective --ffn-chunks 1"
    "--checkpoint layer|--checkpoint layer --ffn-chunks 1|--strategy ulysses --checkpoint layer --ffn-chunks 1"
    "layer + layer-input offload|--checkpoint layer --ffn-chunks 1 --offload-dir $OFF|--strategy ulysses --checkpoint layer --ffn-chunks 1 --offload-dir $OFF"
    "FPDT, 16 chunks, RAM tier|--strategy fpdt --chunks 16 --ffn-chunks 1|--strategy fpdt --chunks 16 --ffn-chunks 1"
    "FPDT, 16 chunks, disk tier|--strategy fpdt --chunks 16 --offload-dir $OFF --ffn-chunks 1|--strategy fpdt --chunks 16 --offload-dir $OFF --ffn-chunks 1"
    "ZeRO-3|-|--strategy ulysses --zero 3 --ffn-chunks 1"
    "FPDT, 16 chunks, RAM tier, whole layers|--strategy fpdt --chunks 16 --ffn-chunks 1 --no-stream|--strategy fpdt --chunks 16 --ffn-chunks 1 --no-stream"
    "all together|--strategy fpdt --chunks 16 --offload-dir $OFF --checkpoint layer --ffn-chunks 64|--strategy fpdt --chunks 16 --offload-dir $OFF --checkpoint layer --ffn-chunks 64 --zero 3"
    "all together, whole layers|--strategy fpdt --chunks 16 --offload-dir $OFF --checkpoint layer --ffn-chunks 64 --no-stream|--strategy fpdt --chunks 16 --offload-dir $OFF --checkpoint layer --ffn-chunks 64 --zero 3 --no-stream"
)
model_kib() { # np S flags... -> "KiB/token (MiB)"
    local np=$1 S=$2
    shift 2
    "$SEQPAR" memory --ranks "$np" $REF --seq-len "$S" "$@" |
        awk -v S="$S" '/^  total / { printf "%.2f (%.0f MiB)", $2 * 1024 / S, $2 }'
}
measure_kib() { # np S flags... -> "KiB/token tracked, RSS MiB"
    local np=$1 S=$2
    shift 2
    # bench memory runs the reference model itself (no size flags)
    mpirun --oversubscribe -np "$np" "$SEQPAR" bench memory --mem-seq-lens "$S" --warmup-steps 0 "$@" 2>&1 |
        awk '/tracked/ { for (i = 1; i <= NF; i++) { if ($i == "tracked") t = $(i + 1); if ($i == "RSS") r = $(i + 1) }
                          printf "%.2f, RSS %.0f MiB", t * 1024 / S, r }' S="$S"
}
echo "| feature | ranks | S | model KiB/token fp32 (per rank, of the global S) | model bf16 | measured fp32 | measured bf16 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for cfg in "${CONFIGS[@]}"; do
    IFS='|' read -r name f1 f2 <<<"$cfg"
    for S in $LENS; do
        for np in 1 2; do
            flags=$f1
            [ "$np" = 2 ] && flags=$f2
            [ "$flags" = "-" ] && continue
            meas="-"
            meas16="-"
            if [ "$MEASURE" = 1 ]; then
                case " ${MEASURE_PRECISIONS:-fp32 bf16} " in *" fp32 "*)
                    meas=$(measure_kib "$np" "$S" $flags 2>/dev/null | head -n 1) ;; esac
                case " ${MEASURE_PRECISIONS:-fp32 bf16} " in *" bf16 "*)
                    meas16=$(measure_kib "$np" "$S" $flags --precision bf16 2>/dev/null | head -n 1) ;; esac
            fi
            echo "| $name | $np | $S | $(model_kib "$np" "$S" $flags) | $(model_kib "$np" "$S" $flags --precision bf16) |" \
                "${meas:--} | ${meas16:--} |"
        done
    done
done
