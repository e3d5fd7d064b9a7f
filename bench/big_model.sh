#!/usr/bin/env bash
# A Llama past 2^31 parameters trained on this machine (issue 52): 2.22 B parameters (27 layers,
# hidden 2048, ffn 8192, 16 heads / 8 KV heads of 128, Llama-3's vocabulary of 128256, untied head)
# on 2 ranks (--cp 2: one 64-token sequence a step split over both) under ZeRO-3 with the AdamW
# moments and each rank's parameter shard on disk (--offload-optimizer --offload-master):
#   1. train --dry-run: the memory model's plan per rank against this node's RAM and disk;
#   2. the initial weights (train --steps 0 --save INIT: random init and a ZeRO-3 save of the
#      shards, 9 GB of weights; its optimizer file of zeros removed);
#   3. one process's loss on the first sequence: seqpar eval --model INIT (forward only: `seqpar
#      grad`'s forward, bit for bit the same loss on the small model checked first), and seqpar grad
#      itself where 17 GiB of RAM are available (it holds the whole 9 GB gradient beside the weights);
#   4. U: 3 steps from INIT; its step 1 loss against 3's (fp32 summation order: the two ranks'
#      halves of the sequence summed in another order, and the GEMMs over 32 rows, not 64);
#   5. A: the same run stopped after step 2 with a checkpoint (ZeRO-3 save, 27 GB);
#   6. B: resumed from A's checkpoint: step 3's loss and gradient norm against U's, bit for bit
#      (steps 1-2 of A against U's too);
#   7. the checkpoint opened in transformers (bench/.venv): its loss on the first sequence against
#      seqpar eval's on the same checkpoint.
# Each run's peak RSS (largest rank), step times and the disk it used are printed. Needs about
# 70 GB free under WORK and 16 GB of free RAM; takes tens of minutes on 2 cores.
# Not a test: bench/results/2026-12-07-big-model.md.
# usage: bash bench/big_model.sh [BUILD_DIR] [WORK_DIR]   (default: build, a new dir in /tmp)
set -u
BUILD=${1:-build}
W=${2:-$(mktemp -d /tmp/big_model.XXXXXX)}
SEQPAR="$BUILD/seqpar"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2
export OMPI_MCA_rmaps_base_oversubscribe=1 SEQPAR_PEAK_GFLOPS=${SEQPAR_PEAK_GFLOPS:-100}
mkdir -p "$W/cfg" "$W/od"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; work directory $W ($(df -h "$W" | awk 'NR == 2 { print $4 }') free)"
cat >"$W/cfg/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 2048,
 "intermediate_size": 8192, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
 "num_hidden_layers": 27, "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0, "rope_scaling": null, "tie_word_embeddings": false, "attention_bias": false,
 "attention_dropout": 0.0, "mlp_bias": false, "pretraining_tp": 1, "torch_dtype": "float32"}
EOF
# an llm.c shard of uint32 tokens (magic 20240801, version 7): 4096 random ids below the vocabulary
python3 - "$W/tokens.bin" <<'EOF'
import random, struct, sys
random.seed(52)
n = 4096
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, n, *([0] * 253)))
    f.write(struct.pack("<%dI" % n, *[random.randrange(128256) for _ in range(n)]))
EOF
COMMON=(--data "$W/tokens.bin" --seq-len 64 --batch 1 --cp 2 --zero 3 --offload-optimizer "$W/od" --offload-master
        --eval-every 0 --seed 1 --warmup 0 --lr 1e-4)
T=(train --steps 3 "${COMMON[@]}")
np2() { mpirun --oversubscribe -np 2 "$SEQPAR" "$@"; }
rss() { sed -nE 's/.*"peak_rss_bytes_max": ([0-9]+).*/\1/p' "$1" | awk '{ printf "%.2f GiB", $1 / 1073741824 }'; }
steps() { sed -nE 's/.*"step": ([0-9]+), "loss": ([^,]+), .*"grad_norm": ([^,]+),.*"step_seconds": ([0-9.]+).*/  step \1: loss \2, grad norm \3, \4 s/p' "$1"; }
du_w() { du -sh --apparent-size "$W" 2>/dev/null | cut -f1; }
fail() { echo "FAILED: $*"; exit 1; }

echo "== 1. the plan (train --dry-run on the 2 ranks)"
np2 "${T[@]}" --model "$W/cfg" --random-init --dry-run 2>&1 | grep -E 'parameters|^  [a-z]|total|checked|RAM per rank|fits' || fail "dry run"

echo "== 0. seqpar grad and eval agree on a small model's first sequence (the check step 3 stands on)"
F=tests/fixtures/tiny_long
g=$("$SEQPAR" grad --model $F --tokens $F/tokens.bin --seq-len 64 --out "$W/g.safetensors" | sed -n 's/^loss: //p')
"$SEQPAR" eval --model $F --data $F/tokens.bin --seq-len 64 --eval-seqs 1 --out "$W/e.json" >/dev/null
e=$(python3 -c "import json,sys; print('%.9f' % json.load(open(sys.argv[1]))['loss'])" "$W/e.json")
echo "  grad $g, eval $e"

echo "== 2. the initial weights (2 ranks, ZeRO-3 save from the shards)"
t0=$SECONDS
np2 train --steps 0 "${COMMON[@]}" --model "$W/cfg" --random-init --save "$W/init" --log "$W/init.jsonl" >"$W/init.out" 2>&1 ||
    fail "init: $(tail -n 3 "$W/init.out")"
echo "  $((SECONDS - t0)) s, peak RSS $(rss "$W/init.jsonl"), the checkpoint $(du -sh --apparent-size "$W/init" | cut -f1)"
rm -f "$W/init/optimizer.safetensors" # zeros; --model reads config.json and the weights only

echo "== 3. one process's loss on the first sequence (seqpar eval --model INIT; seqpar grad too where RAM allows)"
t0=$SECONDS
/usr/bin/time -f "  %e s, peak RSS %M KiB" "$SEQPAR" eval --model "$W/init" --data "$W/tokens.bin" --seq-len 64 --eval-seqs 1 \
    --out "$W/eval0.json" >"$W/eval0.out" 2>"$W/eval0.time" || fail "eval: $(tail -n 3 "$W/eval0.out" "$W/eval0.time")"
cat "$W/eval0.time"
python3 -c "import json,sys; print('  loss %.17g' % json.load(open(sys.argv[1]))['loss'])" "$W/eval0.json"
# seqpar grad holds the whole gradient beside the weights (16 GiB of RSS): only with 17 GiB available
avail=$(awk '/^MemAvailable:/ { print int($2 / 1048576) }' /proc/meminfo)
if [ "$avail" -ge 17 ]; then
    /usr/bin/time -f "  seqpar grad: %e s, peak RSS %M KiB" "$SEQPAR" grad --model "$W/init" --tokens "$W/tokens.bin" \
        --seq-len 64 --out "$W/g.safetensors" >"$W/grad0.out" 2>"$W/grad0.time" || fail "grad: $(tail -n 3 "$W/grad0.out")"
    cat "$W/grad0.time"
    echo "  seqpar grad's $(grep '^loss: ' "$W/grad0.out")"
    rm -f "$W/g.safetensors"
else
    echo "  seqpar grad skipped: $avail GiB of RAM available, it needs 17"
fi

echo "== 4. U: 3 steps from INIT"
t0=$SECONDS
np2 "${T[@]}" --model "$W/init" --log "$W/U.jsonl" >"$W/U.out" 2>&1 || fail "U: $(tail -n 3 "$W/U.out")"
echo "  $((SECONDS - t0)) s, peak RSS $(rss "$W/U.jsonl"), $W holds $(du_w) after the run"
steps "$W/U.jsonl"
grep 'optimizer offload' "$W/U.out" | sed 's/^/  /'

echo "== 5. A: the same run, stopped after step 2 with a checkpoint"
t0=$SECONDS
np2 "${T[@]}" --model "$W/init" --stop-at 2 --save "$W/ck2" --log "$W/A.jsonl" >"$W/A.out" 2>&1 || fail "A: $(tail -n 3 "$W/A.out")"
echo "  $((SECONDS - t0)) s, peak RSS $(rss "$W/A.jsonl"), the checkpoint $(du -sh --apparent-size "$W/ck2" | cut -f1)"
steps "$W/A.jsonl"
rm -rf "$W/init"

echo "== 6. B: resumed from A's checkpoint"
t0=$SECONDS
np2 "${T[@]}" --resume "$W/ck2" --log "$W/B.jsonl" >"$W/B.out" 2>&1 || fail "B: $(tail -n 3 "$W/B.out")"
echo "  $((SECONDS - t0)) s, peak RSS $(rss "$W/B.jsonl")"
steps "$W/B.jsonl"
key() { sed -nE 's/.*"step": ([0-9]+), "loss": ([^,]+), "lr": [^,]+, "grad_norm": ([^,]+),.*/\1 \2 \3/p' "$1"; }
if [ "$( (key "$W/A.jsonl"; key "$W/B.jsonl") | tr '\n' ' ')" = "$(key "$W/U.jsonl" | tr '\n' ' ')" ]; then
    echo "  steps 1-2 (A) and 3 (B): losses and gradient norms equal U's bit for bit"
else
    echo "  DIFFERENT from U:"; paste <(key "$W/U.jsonl") <( (key "$W/A.jsonl"; key "$W/B.jsonl") )
fi
python3 - "$W/eval0.json" "$W/U.jsonl" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["loss"]
u = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"step": 1,')][0]["loss"]
print("  step 1 loss %.17g, one process's %.17g: relative difference %.3g" % (u, e, abs(u - e) / e))
EOF

echo "== 7. the step-2 checkpoint in transformers"
/usr/bin/time -f "  seqpar eval: %e s, peak RSS %M KiB" "$SEQPAR" eval --model "$W/ck2" --data "$W/tokens.bin" --seq-len 64 \
    --eval-seqs 1 --out "$W/eval2.json" >"$W/eval2.out" 2>"$W/eval2.time" || fail "eval ck2: $(tail -n 3 "$W/eval2.out")"
cat "$W/eval2.time"
. bench/venv.sh
bench_venv big_model
/usr/bin/time -f "  transformers: %e s, peak RSS %M KiB" "$VENV/bin/python" - "$W/ck2" "$W/tokens.bin" "$W/eval2.json" <<'EOF'
import json, struct, sys
import torch
from transformers import AutoModelForCausalLM
d, tok, ev = sys.argv[1:4]
m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
n = sum(p.numel() for p in m.parameters())
with open(tok, "rb") as f:
    f.read(1024)
    ids = torch.tensor(struct.unpack("<65I", f.read(4 * 65)), dtype=torch.long)[None]
with torch.no_grad():
    logits = m(input_ids=ids[:, :64]).logits[0].double()
loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:65]).item()
s = json.load(open(ev))["loss"]
print("  transformers opened %s: %s, %d parameters; loss on the first sequence %.9f, seqpar eval's %.9f: relative "
      "difference %.3g" % (d, type(m).__name__, n, loss, s, abs(loss - s) / s))
EOF
echo "disk: $W holds $(du_w) at the end (the checkpoint; the offload files are gone)"
rm -rf "$W/ck2" "$W/g.safetensors"
