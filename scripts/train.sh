#!/usr/bin/env bash
# The README's main job: installs missing Debian packages, builds, and trains the default model on
# 2 MPI ranks of ring attention (sequence parallelism: each rank holds half of every sequence):
# a 2-layer Llama on the built-in associative-recall task (fused pairs: 8 keys, 8 values), in two
# stages of growing sequence length:
#   stage 1: 256-token sequences, where the model learns the lookup (query key -> the one earlier
#            token that pairs this key with a value -> that value);
#   stage 2: 2048-token sequences, where the same lookup is learnt across up to 2047 tokens.
# Recall accuracy by key-query distance is printed as it rises. Everything the run writes goes to
# runs/<UTC date-time>/: stage1/ (the first stage's log and model), train.jsonl (the second
# stage's log), model/ (config.json + model.safetensors: the trained model), trace.json (a
# Perfetto trace of the last step), loss.png and recall.png (gnuplot).
#
# Extra arguments go to `seqpar train` in both stages (e.g. --seed 2, or --strategy ulysses for
# DeepSpeed-Ulysses instead of the ring). Environment:
#   RANKS=N         MPI ranks (default 2; the sequence lengths must split into 2 x N pieces)
#   STAGE1_STEPS=N  steps of stage 1 (default 400)   STAGE2_STEPS=N  steps of stage 2 (default 100)
#   STAGE2_SEQ_LEN=S  sequence length of stage 2 (default 2048)
#   SEQPAR_RUNS=DIR   where run directories go (default runs/)
# e.g. `STAGE1_STEPS=20 STAGE2_STEPS=5 bash scripts/train.sh` for a quick look.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
make -j"$(nproc)" build/seqpar >/dev/null
RANKS=${RANKS:-2}
STAGE1_STEPS=${STAGE1_STEPS:-400}
STAGE2_STEPS=${STAGE2_STEPS:-100}
STAGE2_SEQ_LEN=${STAGE2_SEQ_LEN:-2048}
# Open MPI refuses to run as root unless told; more ranks than cores need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe -np "$RANKS")

runs=${SEQPAR_RUNS:-runs}
mkdir -p "$runs" 2>/dev/null || { echo "train.sh: cannot create '$runs': make it writable or set SEQPAR_RUNS" >&2; exit 1; }
stamp=$(date -u +%Y%m%d-%H%M%S)
run=$runs/$stamp
k=2
while ! mkdir "$run" 2>/dev/null; do # a fresh directory per run
    [ -w "$runs" ] && [ $k -lt 100 ] || { echo "train.sh: cannot create a directory in '$runs': make it writable" >&2; exit 1; }
    run=$runs/$stamp-$k; k=$((k + 1))
done
# The task (both stages) and the model (stage 1; stage 2 loads it); fused pairs: vocabulary (8 + 1)^2 = 81
task=(--strategy ring --recall-format fused --recall-pairs 8 --weight-decay 0)
model=(--vocab 81 --layers 2 --hidden 64 --heads 2 --kv-heads 2 --ffn 128)

mkdir "$run/stage1"
echo "== stage 1 of 2: $STAGE1_STEPS steps of 256-token sequences on $RANKS MPI ranks (each holds 1/$RANKS of every" \
     "sequence; ring attention unless --strategy says otherwise); files in $run/"
"${mpi[@]}" build/seqpar train "${task[@]}" "${model[@]}" --seq-len 256 --batch 16 --steps "$STAGE1_STEPS" --lr 3e-3 --warmup 30 \
    --eval-every 100 --log "$run/stage1/train.jsonl" --save "$run/stage1/model" "$@"
echo "== stage 2 of 2: $STAGE2_STEPS steps of $STAGE2_SEQ_LEN-token sequences, from the stage 1 model"
"${mpi[@]}" build/seqpar train "${task[@]}" --model "$run/stage1/model" --seq-len "$STAGE2_SEQ_LEN" --batch 8 \
    --steps "$STAGE2_STEPS" --lr 2e-3 --warmup 10 --eval-every 25 --eval-seqs 16 --log "$run/train.jsonl" \
    --save "$run/model" --trace "$run/trace.json" --trace-step last "$@"
bash scripts/plot_run.sh -o "$run" "$run/stage1/train.jsonl" "$run/train.jsonl"
pictures="pictures $run/loss.png and $run/recall.png"
[ -f "$run/loss.png" ] || pictures="no pictures (gnuplot is missing: bash scripts/install-deps.sh as root installs it)"
echo "== done: log $run/train.jsonl (stage 1: $run/stage1/train.jsonl), model $run/model (config.json +" \
     "model.safetensors), $pictures, trace of the last step $run/trace.json (open it in https://ui.perfetto.dev)"
