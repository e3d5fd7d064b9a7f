# The memory model (`seqpar memory`) against the peak tracked memory `seqpar train` measures in
# one step (peak_mem_bytes of its JSONL log: the largest rank's), for strategies x checkpoint
# modes x ZeRO stages and groups x ranks 1/2/4 x FPDT chunks (layers streamed or whole) x FFN chunks x offloading,
# in fp32 and in bf16 (--precision bf16): within 5% each (seen 0.997-1.002 on the 2-core Zen 3); and what bf16 adds to or takes from the
# same run's fp32 peak, what the attention backward's passes take from it and its dq slots add, predicted against
# measured, within 10% of that difference. Also: a prediction for other flags than the run's is refused by the same check (the
# test can fail), layer-input offload leaves the losses bit-identical, and `seqpar memory`
# answers bad flags with one line and runs in well under a second.
# usage: bash tests/test_memory_model.sh BUILD_DIR
set -u
BUILD=${1:-build}
. tests/lib.sh
mpi_test_env
MODEL="--layers 3 --hidden 128 --ffn 384 --heads 4 --kv-heads 2 --vocab 256"
S=1024
TOL=0.05

predict() { # np flags... -> predicted bytes (the total line, MiB -> bytes)
    local np=$1
    shift
    "$SEQPAR" memory --ranks "$np" $MODEL --seq-len $S "$@" 2>&1 |
        awk '/^  total / { printf "%.0f\n", $2 * 1048576 }'
}
measure() { # np flags... -> measured peak tracked bytes of step 1 (a configuration measured already: its figure)
    local np=$1
    shift
    local memo
    memo="$T/measured/$(printf '%s' "$np $* ${SEQPAR_ATTN_BWD_ROWS:-} ${SEQPAR_ATTN_DQ_SLOTS:-}" | tr -c 'A-Za-z0-9,.=-' '_')"
    if [ -s "$memo" ]; then cat "$memo"; return; fi
    mkdir -p "$T/measured"
    measure_run "$np" "$@" | tee "$memo"
    [ "$(cat "$memo")" != 0 ] || rm -f "$memo"
}
measure_run() {
    local np=$1
    shift
    rm -f "$T/m.jsonl"
    # unbound (--bind-to none): Open MPI binds a rank to one core where it starts at most 2, so a 1-rank run would
    # get one thread where `seqpar memory` (this machine's cores per rank) predicts the default two. One rank
    # is started without mpirun (unbound too: the same threads, the same peak; mpirun's start-up was a
    # third of such a run, ~0.1 s)
    on_ranks "$np" "$SEQPAR" train $MODEL --seq-len $S --steps 1 --eval-every 0 --eval-seqs 1 --quiet \
        --peak-gflops 100 --log "$T/m.jsonl" "$@" >"$T/m.out" 2>&1 || { tail -n 2 "$T/m.out" >&2; echo 0; return; }
    sed -nE 's/.*"peak_mem_bytes": ([0-9]+),.*/\1/p' "$T/m.jsonl" | head -n 1
}
on_ranks() { # np command...: one rank alone (unbound), more under mpirun --bind-to none
    local np=$1
    shift
    if [ "$np" -eq 1 ]; then timeout 240 "$@"; else OMPI_MCA_hwloc_base_binding_policy=none run_np "$np" "$@"; fi
}
within() { # predicted measured -> status 0 when within TOL
    awk -v p="$1" -v m="$2" -v t=$TOL 'BEGIN { if (m <= 0 || p <= 0) exit 1; r = p / m; exit !(r >= 1 - t && r <= 1 + t) }'
}
ratio() { awk -v p="$1" -v m="$2" 'BEGIN { if (m > 0) printf "%.3f", p / m; else print "n/a" }'; }

n_cases=0
case_() { # np flags...
    local np=$1
    shift
    local p m
    p=$(predict "$np" "$@")
    m=$(measure "$np" "$@")
    n_cases=$((n_cases + 1))
    printf '  np %d %-62s predicted %7.2f MiB measured %7.2f MiB ratio %s\n' "$np" "$*" \
        "$(awk -v x="${p:-0}" 'BEGIN { print x / 1048576 }')" "$(awk -v x="${m:-0}" 'BEGIN { print x / 1048576 }')" \
        "$(ratio "${p:-0}" "${m:-0}")"
    if within "${p:-0}" "${m:-0}"; then ok; else bad "memory model np $np $*: predicted ${p:-none}, measured ${m:-none} bytes"; fi
}

OFF="$T/offload"
mkdir -p "$OFF"
echo "predicted vs measured peak tracked memory of one step (S = $S, batch 1 unless given):"
case_ 1 --checkpoint none --batch 1
case_ 1 --checkpoint layer --batch 1
case_ 1 --checkpoint selective --batch 1
case_ 1 --checkpoint none --ffn-chunks 1 --batch 1
case_ 1 --strategy fpdt --chunks 4 --checkpoint selective --batch 1
case_ 1 --strategy fpdt --chunks 4 --offload-dir "$OFF" --batch 1
case_ 1 --checkpoint layer --offload-dir "$OFF" --ffn-chunks 4 --batch 1
case_ 2 --strategy ring --checkpoint none --batch 1
case_ 2 --strategy ulysses --checkpoint layer --batch 1
case_ 2 --strategy lightseq --checkpoint selective --zero 1 --batch 1
case_ 2 --strategy allgather --checkpoint none --zero 2 --batch 2
case_ 2 --strategy fpdt --chunks 2 --checkpoint selective --zero 3 --batch 1
case_ 2 --strategy ulysses --checkpoint selective --offload-dir "$OFF" --batch 1
case_ 4 --strategy wallfacer --team 2 --checkpoint none --batch 1
case_ 4 --strategy 2d --hp 2 --cp 2 --ring-inner 1 --checkpoint selective --zero 3 --zero-group 2 --batch 1
case_ 4 --strategy ring --ring-inner 2 --checkpoint layer --zero 2 --batch 1
case_ 4 --strategy lightseq --dp 2 --checkpoint none --zero 1 --batch 2
case_ 4 --strategy fpdt --chunks 2 --offload-dir "$OFF" --checkpoint selective --zero 2 --batch 1
# a Qwen3 of MODEL's sizes (per-head q/k norms: their rstd and the backward's q or k made again
# with its gradient, chunk by chunk; with attention_bias its biases in ZeRO's layer units)
Q3="$T/qwen3"; mkdir -p "$Q3"
printf '{"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4, "num_key_value_heads": 2,
 "head_dim": 32, "num_hidden_layers": 3, "vocab_size": 256, "attention_bias": true}\n' >"$Q3/config.json"
case_ 1 --model "$Q3" --random-init --checkpoint none --batch 1
case_ 2 --model "$Q3" --random-init --strategy fpdt --chunks 2 --checkpoint selective --zero 3 --batch 1
case_ 2 --model "$Q3" --random-init --strategy ulysses --checkpoint layer --precision bf16 --batch 1
# FPDT's layers streamed chunk by chunk (llama.h), all memory features together, and whole layers
case_ 1 --strategy fpdt --chunks 8 --checkpoint layer --offload-dir "$OFF" --ffn-chunks 32 --batch 1
case_ 2 --strategy fpdt --chunks 4 --checkpoint layer --offload-dir "$OFF" --batch 1
case_ 2 --strategy fpdt --chunks 4 --checkpoint none --batch 1
case_ 1 --strategy fpdt --chunks 8 --checkpoint layer --offload-dir "$OFF" --no-stream --batch 1
# an untied head's outer units (embedding; final norm + head) take turns in one buffer under ZeRO-2/3
# (data_parallel.h): with a vocabulary of 16384 they are most of the parameters (until 2026-11-29
# both buffers held both units: the model then said E + T for each, and these runs measured 8 and 16 MiB more)
case_ 2 --vocab 16384 --strategy ring --checkpoint none --zero 2 --batch 1
case_ 2 --vocab 16384 --strategy ulysses --checkpoint layer --zero 3 --batch 1
# the AdamW moments on disk (--offload-optimizer): the tier's eight chunk buffers in RAM instead
case_ 2 --vocab 16384 --strategy ulysses --checkpoint layer --zero 3 --batch 1 --offload-optimizer "$OFF"
case_ 2 --vocab 16384 --strategy ulysses --checkpoint layer --zero 3 --batch 1 --offload-optimizer "$OFF" --offload-master
case_ 1 --vocab 16384 --checkpoint none --batch 1 --offload-optimizer "$OFF"
# later micro-batches reduce-scatter into temporaries of each unit's own part, not a second whole
# shard (data_parallel.h): 12 layers on 2 ranks, 4 micro-batches (until 2026-11-29 the whole shard:
# 3.1 MiB more, 0.92 of the measured peak by today's model)
case_ 2 --layers 12 --strategy ring --checkpoint layer --zero 2 --batch 4
case_ 2 --layers 12 --strategy ulysses --checkpoint none --zero 3 --batch 4
# token data: the trainer holds its largest training file's tokens whole, 4 bytes each (the model left
# them out until 2026-11-29: 0.82-0.95 of the measured peak with text files of 38-152 KB); a text of
# 972 KB, and a glob of it and a 300 KB one (the larger read first, so one step holds it)
awk 'BEGIN { srand(3); for (i = 0; i < 12000; i++) { s = ""; for (j = 0; j < 80; j++) s = s sprintf("%c", 97 + int(rand() * 26)); print s } }' >"$T/data_a.txt"
head -c 300000 "$T/data_a.txt" >"$T/data_b.txt"
case_ 1 --data "$T/data_a.txt" --checkpoint none --batch 1
case_ 2 --data "$T/data_*.txt" --strategy ulysses --checkpoint layer --batch 1
# --precision bf16 (layer_memory.c, memory_model.c): per-layer bf16 copies and their shared fp32 sets,
# the bf16 GEMMs' operand copies, the bf16 attention kernel's pair words, the bf16 wire's staging
B="--precision bf16"
case_ 1 $B --checkpoint none --batch 1
case_ 1 $B --checkpoint layer --batch 1
case_ 1 $B --checkpoint selective --ffn-chunks 1 --batch 1
case_ 1 $B --strategy fpdt --chunks 4 --checkpoint selective --batch 1
case_ 1 $B --strategy fpdt --chunks 4 --offload-dir "$OFF" --batch 1
case_ 1 $B --checkpoint layer --offload-dir "$OFF" --ffn-chunks 4 --batch 1
case_ 2 $B --strategy ulysses --checkpoint none --batch 1
case_ 2 $B --strategy ring --checkpoint selective --zero 1 --batch 1
case_ 2 $B --strategy lightseq --checkpoint none --zero 2 --batch 2
case_ 2 $B --strategy allgather --checkpoint layer --batch 1
case_ 2 $B --strategy wallfacer --checkpoint none --zero 3 --batch 1
case_ 2 $B --strategy fpdt --chunks 4 --checkpoint none --batch 1
case_ 2 $B --strategy fpdt --chunks 4 --checkpoint none --no-stream --batch 1
case_ 4 $B --strategy 2d --hp 2 --cp 2 --checkpoint none --zero 1 --batch 1
case_ 4 $B --strategy ring --ring-inner 2 --checkpoint selective --zero 3 --zero-group 2 --batch 1
case_ 4 $B --strategy wallfacer --team 2 --checkpoint none --batch 1
case_ 4 $B --strategy lightseq --dp 2 --checkpoint layer --zero 2 --batch 2
case_ 4 $B --strategy fpdt --chunks 2 --offload-dir "$OFF" --checkpoint selective --zero 2 --batch 1
echo "$n_cases configurations"

# The check can fail: the prediction for --checkpoint layer is not the measured peak of none,
# nor a prediction without ZeRO the peak with ZeRO-3.
p=$(predict 1 --checkpoint layer --batch 1)
m=$(measure 1 --checkpoint none --batch 1)
if within "$p" "$m"; then bad "the check accepts the layer prediction ($p) for a none run ($m)"; else ok; fi
p=$(predict 4 --strategy ring --zero 0 --batch 1)
m=$(measure 4 --strategy ring --zero 3 --batch 1)
if within "$p" "$m"; then bad "the check accepts the zero 0 prediction ($p) for a zero 3 run ($m)"; else ok; fi
# The bf16 terms themselves: what bf16 adds to or takes from the same run's fp32 peak, predicted
# against measured, within 10% of the measured difference (which is 0.7-14 MiB here, inside the
# 10% of the totals: a model that ignored --precision would pass the rows above but not this; with
# a vocabulary of 32768 most of it is the LM head's bf16 copy and its chunks' bf16 operands).
for flags in "1 --threads 1 --checkpoint layer --ffn-chunks 1" "2 --strategy ulysses --checkpoint none --ffn-chunks 8 --layers 12" \
    "1 --threads 1 --checkpoint none --layers 12" "1 --threads 1 --checkpoint layer --vocab 32768"; do
    set -- $flags
    np=$1
    shift
    p32=$(predict "$np" "$@" --batch 1)
    p16=$(predict "$np" "$@" --batch 1 --precision bf16)
    m32=$(measure "$np" "$@" --batch 1)
    m16=$(measure "$np" "$@" --batch 1 --precision bf16)
    if awk -v np="$np" -v p32="${p32:-0}" -v p16="${p16:-0}" -v m32="${m32:-0}" -v m16="${m16:-0}" 'BEGIN {
        dm = m16 - m32; dp = p16 - p32; e = dp - dm; if (e < 0) e = -e; a = dm < 0 ? -dm : dm
        printf "  bf16 - fp32, np %s: predicted %+.2f MiB, measured %+.2f MiB\n", np, dp / 1048576, dm / 1048576
        exit !(m32 > 0 && m16 > 0 && a > 262144 && e <= 0.1 * a) }'; then ok; else
        bad "bf16 - fp32 memory, np $np $*: predicted $p16 - $p32, measured $m16 - $m32 bytes"; fi
done

# bf16 halves the saved activations under --checkpoint none: a layer keeps its input in fp32 and
# q, k, v, o (or the strategy's copies of q, k, v) in bf16, its x_mid made again in backward
# (llama_rebuilds_x_mid); at Llama-3-8B's shape, 128K tokens on 8 ranks (the residual stream's
# L + 1 inputs and the fp32 lse keep it a little above half; keeping x_mid in fp32 gave 0.72x).
# The model's terms are the measured ones above (the bf16 - fp32 rows).
L3="--layers 32 --hidden 4096 --ffn 14336 --heads 32 --kv-heads 8 --vocab 128256 --seq-len 131072 --checkpoint none"
for flags in "--batch 8" "--strategy ulysses --batch 1" "--strategy ring --batch 1"; do
    s32=$("$SEQPAR" memory --ranks 8 $L3 $flags 2>&1 | awk '/^  saved activations / { print $3 }')
    s16=$("$SEQPAR" memory --ranks 8 $L3 $flags --precision bf16 2>&1 | awk '/^  saved activations / { print $3 }')
    if awk -v a="${s16:-0}" -v b="${s32:-0}" -v f="$flags" 'BEGIN {
        printf "  saved activations at Llama-3-8B shape, 8 ranks %s: bf16 %.0f / fp32 %.0f MiB = %.3fx\n", f, a, b, (b > 0 ? a / b : 0)
        exit !(b > 0 && a > 0 && a / b <= 0.51) }'; then ok; else
        bad "bf16 saved activations at Llama-3-8B shape ($flags): ${s16:-none} vs fp32 ${s32:-none} MiB, not half"; fi
done

# One buffer for a layer's two phases (layer_memory.c's phases_alloc): the MLP's h, gate and up chunks
# and the attention half's dq, dk, dv, dout. What --ffn-chunks 8 takes from --ffn-chunks 2's peak
# (none, fp32), predicted against measured within 10%, and below what the smaller MLP chunks (and
# xn, dxn) alone would take with the buffers side by side: there the attention half's buffers
# (larger than 8 chunks' MLP buffers) fill the space the MLP gives up.
p2=$(predict 1 --checkpoint none --ffn-chunks 2 --batch 1)
m2=$(measure 1 --checkpoint none --ffn-chunks 2 --batch 1)
p8=$(predict 1 --checkpoint none --ffn-chunks 8 --batch 1)
m8=$(measure 1 --checkpoint none --ffn-chunks 8 --batch 1)
# side by side: 3 (h, gate, up) x rows x 384 + 2 (xn, dxn) x rows x 128 floats, rows 512 -> 128
apart=$(( (3 * 384 + 2 * 128) * (512 - 128) * 4 ))
if awk -v p2="${p2:-0}" -v m2="${m2:-0}" -v p8="${p8:-0}" -v m8="${m8:-0}" -v apart="$apart" 'BEGIN {
    dm = m2 - m8; dp = p2 - p8; e = dp - dm; if (e < 0) e = -e
    printf "  --ffn-chunks 2 - 8: predicted %.2f MiB, measured %.2f MiB (buffers side by side: %.2f MiB)\n", dp / 1048576, dm / 1048576, apart / 1048576
    exit !(m2 > 0 && m8 > 0 && dm > 262144 && e <= 0.1 * dm && dm < 0.75 * apart) }'; then ok; else
    bad "phases: --ffn-chunks 2 - 8: predicted $p2 - $p8, measured $m2 - $m8 bytes (side by side $apart)"; fi

# The attention backward in passes (attn_backward_pass_rows; forced small with
# SEQPAR_ATTN_BWD_ROWS): what passes of 96 rows take from the same run's peak (dq copies of 3
# threads and Q/dO copies of one query head's rows instead of the kv head's, plus the kv head's dK
# and dV), predicted against measured, within 10% of that difference, fp32 and bf16.
for prec in fp32 bf16; do
    f="--threads 3 --checkpoint layer --batch 1 --precision $prec"
    p1=$(predict 1 $f)
    m1=$(measure 1 $f)
    pp=$(SEQPAR_ATTN_BWD_ROWS=96 predict 1 $f)
    mp=$(SEQPAR_ATTN_BWD_ROWS=96 measure 1 $f)
    if awk -v prec="$prec" -v p1="${p1:-0}" -v pp="${pp:-0}" -v m1="${m1:-0}" -v mp="${mp:-0}" 'BEGIN {
        dm = mp - m1; dp = pp - p1; e = dp - dm; if (e < 0) e = -e; a = dm < 0 ? -dm : dm
        printf "  backward passes - one pass, %s: predicted %+.2f MiB, measured %+.2f MiB\n", prec, dp / 1048576, dm / 1048576
        exit !(m1 > 0 && mp > 0 && dm < -262144 && e <= 0.1 * a) }'; then ok; else
        bad "backward passes memory, $prec: predicted $pp - $p1, measured $mp - $m1 bytes"; fi
done

# The attention backward's dq slots (attn_backward_dq_slots; SEQPAR_ATTN_DQ_SLOTS): 16 slots
# against 1 add 15 dq copies of the pass to the same run's peak, predicted against measured, within
# 10% of that difference.
f="--threads 3 --checkpoint layer --batch 1"
p1=$(SEQPAR_ATTN_DQ_SLOTS=1 predict 1 $f)
m1=$(SEQPAR_ATTN_DQ_SLOTS=1 measure 1 $f)
p16=$(SEQPAR_ATTN_DQ_SLOTS=16 predict 1 $f)
m16=$(SEQPAR_ATTN_DQ_SLOTS=16 measure 1 $f)
if awk -v p1="${p1:-0}" -v p16="${p16:-0}" -v m1="${m1:-0}" -v m16="${m16:-0}" 'BEGIN {
    dm = m16 - m1; dp = p16 - p1; e = dp - dm; if (e < 0) e = -e
    printf "  16 dq slots - 1: predicted %+.2f MiB, measured %+.2f MiB\n", dp / 1048576, dm / 1048576
    exit !(m1 > 0 && m16 > 0 && dm > 262144 && e <= 0.1 * dm) }'; then ok; else
    bad "dq slots memory: predicted $p16 - $p1, measured $m16 - $m1 bytes"; fi

# Layer-input offload is exact: the same losses bit for bit, 1 and 2 ranks, layer and selective.
for np in 1 2; do
    for mode in layer selective; do
        rm -f "$T/a.jsonl" "$T/b.jsonl"
        run_np $np "$SEQPAR" train $MODEL --seq-len 256 --steps 3 --eval-every 0 --eval-seqs 1 --quiet --peak-gflops 100 \
            --checkpoint $mode --log "$T/a.jsonl" >/dev/null 2>&1
        run_np $np "$SEQPAR" train $MODEL --seq-len 256 --steps 3 --eval-every 0 --eval-seqs 1 --quiet --peak-gflops 100 \
            --checkpoint $mode --offload-dir "$OFF" --log "$T/b.jsonl" >"$T/b.out" 2>&1
        if [ -s "$T/a.jsonl" ] && [ "$(losses "$T/a.jsonl")" = "$(losses "$T/b.jsonl")" ]; then ok; else
            bad "layer-input offload np $np $mode: losses differ: $(losses "$T/a.jsonl" | tr '\n' ' ') vs $(losses "$T/b.jsonl" | tr '\n' ' ')"; fi
        if grep -q "layer-input offload: .* MB written" "$T/b.out"; then ok; else bad "no offload report np $np $mode"; fi
    done
done
# the gradient file of `seqpar grad` bit for bit (2 ranks, ring), and a full disk (a 16 KiB file
# size limit, SIGXFSZ ignored; tcp so that shared memory needs no file): one line on every rank
L=tiny_long
run_np 2 "$SEQPAR" grad --model "$FIX/$L" --tokens "$FIX/$L/tokens.bin" --seq-len 256 --out "$T/g0" --strategy ring \
    --checkpoint layer >/dev/null 2>&1
run_np 2 "$SEQPAR" grad --model "$FIX/$L" --tokens "$FIX/$L/tokens.bin" --seq-len 256 --out "$T/g1" --strategy ring \
    --checkpoint layer --offload-dir "$OFF" >/dev/null 2>&1
if [ -s "$T/g0" ] && cmp -s "$T/g0" "$T/g1"; then ok; else bad "grad with layer-input offload: the gradient file differs"; fi
err=$(timeout 60 mpirun --oversubscribe --mca btl self,tcp -np 2 bash -c "trap '' XFSZ; ulimit -f 16; exec \"$SEQPAR\" grad \
      --model \"$FIX/$L\" --tokens \"$FIX/$L/tokens.bin\" --seq-len 256 --out \"$T/x\" --checkpoint selective \
      --offload-dir \"$OFF\"" 2>&1 >/dev/null)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    [ "$(printf '%s\n' "$err" | grep -c '^seqpar: error: --offload-dir .*layer-input file could not be written or read (File too large)')" -eq 2 ]; then ok; else
    bad "full disk under layer-input offload: status $rc: $(printf '%s' "$err" | head -n 3)"; fi
# the offload files are gone after the runs
if [ -z "$(ls -A "$OFF")" ]; then ok; else bad "offload files left in $OFF: $(ls "$OFF")"; fi

# Bad input: one line naming the flag, status 1; --offload-dir needs something to offload.
expect_error() { # text flags...
    local want=$1
    shift
    local out rc
    out=$("$SEQPAR" "$@" 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -q -- "$want"; then ok; else
        bad "seqpar $*: want one line with '$want' and status != 0, got status $rc: $out"; fi
}
expect_error "zero-group 3 does not divide the 4 ranks" memory --ranks 4 --zero 1 --zero-group 3
expect_error "splits heads only: drop --cp 2" memory --ranks 4 --strategy ulysses --cp 2
expect_error "unknown strategy 'nope'" memory --strategy nope
expect_error "is read by --strategy fpdt only" memory --chunks 2
# both problems of a --zero-group in one line, as grad_sync_init (it said "use --zero 1, 2 or 3", then "a divisor of 1")
expect_error "--zero-group 3 shards nothing under --zero 0 and does not divide the 1 ranks: drop it, or use --zero 1, 2 or 3 with a --zero-group dividing 1" memory --ranks 1 --zero-group 3
expect_error "is read by --strategy wallfacer only" memory --ranks 4 --strategy ring --team 2
expect_error "is read by --strategy ring and 2d only" memory --ranks 4 --strategy allgather --ring-inner 2
expect_error "add --checkpoint layer|selective" memory --offload-dir /tmp
# a one-head model: "--hp 1", not "--hp 1 to 1"
expect_error "more than the model's 1 query head: give --hp 1 (the other ranks" memory --ranks 2 --strategy ulysses --heads 1 --kv-heads 1 --hidden 32
# --no-stream where no FPDT layer streams (was accepted and ignored)
expect_error "--no-stream runs FPDT's layers whole .*: it is read by --strategy fpdt only" memory --strategy ring --ranks 2 --no-stream
expect_error "--no-stream runs FPDT's layers whole .*: it is read by --strategy fpdt only" train --no-stream --steps 1
expect_error "add --checkpoint layer|selective" train --offload-dir /tmp --steps 1
expect_error "ranks" memory --ranks 0
# fast: the whole model of a 1M-token, 64-rank run in well under a second
t0=$(date +%s%N)
"$SEQPAR" memory --ranks 64 --strategy wallfacer --seq-len 1048576 --zero 3 --checkpoint selective >/dev/null
t1=$(date +%s%N)
ms=$(((t1 - t0) / 1000000))
if [ "$ms" -lt 1000 ]; then ok; else bad "seqpar memory took $ms ms"; fi
summary test_memory_model
