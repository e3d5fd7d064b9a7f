#!/usr/bin/env bash
# Hybrid ZeRO (LoongTrain §5.1) under mpirun --oversubscribe, each run with a timeout:
#   - `seqpar grad` under --zero 2 and 3, with and without --zero-group, writes the single-
#     process gradient file (full gradient gathered from the shards) at 2, 4 and 8 ranks;
#   - 20 training steps under every stage (0-3) and several group sizes give --zero 0's losses
#     within 1e-6 relative at 2, 4 (dp 2: two micro-batches per rank) and 8 ranks;
#   - checkpoints saved under one stage resume under another (and bit-identically under the
#     same stage);
#   - with every collective cut into messages of 97 elements (SEQPAR_COMM_PIECE=97) the losses, the
#     saved files and a resume are bit-identical to the default run's (ZeRO-1, 2, 3, groups);
#   - the bytes per kind that --stats counts equal the formulas of data_parallel.h for every
#     stage and group size;
#   - peak tracked memory falls by what zero 2 and 3 free (formulas below);
#   - a NaN gradient is seen (and skipped with --skip-nonfinite) under zero 2 and 3;
#   - bad --zero / --zero-group values: one line on every rank, non-zero exit.
# Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
mpi_test_env

# ---- seqpar grad: the gathered gradient is the single-process one
L=tiny_long
grad_case $L 256 2 --cp 2 --zero 2
grad_case $L 256 2 --cp 2 --zero 3
grad_case $L 256 4 --hp 2 --cp 2 --zero 2 --zero-group 2
grad_case $L 256 4 --dp 2 --cp 2 --zero 3 --zero-group 2
grad_case $L 256 4 --cp 4 --zero 3 --zero-group 1                     # no sharding: replicas only
grad_case tiny_gqa_tied 32 4 --hp 2 --cp 2 --zero 3                   # tied embeddings
grad_case tiny_headdim 40 4 --cp 4 --zero 3 --checkpoint              # recomputation after the gather
grad_case tiny_gqa_tied 32 8 --hp 2 --cp 4 --zero 3 --zero-group 4
grad_case tiny_mha 24 8 --dp 2 --hp 2 --cp 2 --zero 2 --zero-group 4

# ---- 20 training steps: every stage and group size gives --zero 0's losses
TRAIN=(train --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 64 --seq-len 64 --batch 4 --steps 20
       --warmup 3 --eval-every 0 --eval-seqs 4 --quiet --peak-gflops 100 --seed 3)
close() { # a.jsonl b.jsonl: 20 steps each, losses within 1e-6 relative
    [ "$(losses "$1" | wc -l)" -eq 20 ] && [ "$(losses "$2" | wc -l)" -eq 20 ] &&
        paste <(losses "$1") <(losses "$2") | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-6 * $2) bad = 1 } END { exit bad }'
}
train_stages() { # np "grid flags" "zero flags" ...
    local np=$1 grid=$2
    shift 2
    # shellcheck disable=SC2086
    run_shared "$T/base$np.jsonl" "$T/t.out" run_np "$np" "$SEQPAR" "${TRAIN[@]}" $grid --zero 0 --log "$T/base$np.jsonl" ||
        bad "np $np $grid zero 0: $(tail -n 2 "$T/t.out")"
    for z in "$@"; do
        rm -f "$T/t.jsonl"
        # shellcheck disable=SC2086
        run_shared "$T/t.jsonl" "$T/t.out" run_np "$np" "$SEQPAR" "${TRAIN[@]}" $grid --zero $z --log "$T/t.jsonl" ||
            bad "np $np $grid --zero $z: $(tail -n 2 "$T/t.out")"
        if close "$T/base$np.jsonl" "$T/t.jsonl"; then ok; else
            bad "np $np $grid --zero $z: 20 steps differ from --zero 0"; paste <(losses "$T/base$np.jsonl") <(losses "$T/t.jsonl") | head -n 3; fi
        # kept: resume_case's uninterrupted run on the same 4 ranks is this very command
        cp "$T/t.jsonl" "$T/run$np $grid --zero $z.jsonl" 2>/dev/null
    done
    cp "$T/base$np.jsonl" "$T/run$np $grid --zero 0.jsonl" 2>/dev/null
}
train_stages 2 "--cp 2" 1 2 3 "3 --zero-group 1" "2 --zero-group 2"
train_stages 4 "--dp 2 --cp 2" 1 "1 --zero-group 2" 2 "2 --zero-group 2" 3 "3 --zero-group 2" "3 --zero-group 1" "3 --checkpoint"
train_stages 8 "--dp 2 --hp 2 --cp 2" 1 "2 --zero-group 4" 3 "3 --zero-group 2" "3 --zero-group 4"

# ---- checkpoints: saved under one stage, resumed under another
G4=(--dp 2 --cp 2)
resume_case() { # "save zero flags" "resume zero flags" exact(1)|close(0)
    local a=$1 b=$2 exact=$3
    rm -rf "$T/ck" "$T/r.jsonl" "$T/u.jsonl"
    # the checkpoint saved under these flags and its log of steps 1-10: an earlier case's copy where
    # one saved them already (the same command, which writes the same files), else saved now
    local saved
    saved="$T/saved_$(printf '%s' "$a" | tr -c 'A-Za-z0-9-' '_')"
    if [ -f "$saved/trainer_state.json" ] && [ -f "$saved.jsonl" ]; then
        cp -r "$saved" "$T/ck" && cp "$saved.jsonl" "$T/r.jsonl"
    else
        # shellcheck disable=SC2086
        if run_np 4 "$SEQPAR" "${TRAIN[@]}" "${G4[@]}" --zero $a --stop-at 10 --save "$T/ck" --log "$T/r.jsonl" >"$T/r.out" 2>&1; then
            cp -r "$T/ck" "$saved" && cp "$T/r.jsonl" "$saved.jsonl"
        else bad "save under --zero $a: $(tail -n 2 "$T/r.out")"; fi
    fi
    # shellcheck disable=SC2086
    run_np 4 "$SEQPAR" "${TRAIN[@]}" "${G4[@]}" --zero $b --resume "$T/ck" --log "$T/r.jsonl" >"$T/r.out" 2>&1 || bad "resume under --zero $b: $(tail -n 2 "$T/r.out")"
    # the uninterrupted run: train_stages ran this command (TRAIN, --dp 2 --cp 2, --zero b) and kept its log
    local kept="$T/run4 ${G4[*]} --zero $b.jsonl"
    if [ -f "$kept" ]; then cp "$kept" "$T/u.jsonl"; else
        # shellcheck disable=SC2086
        run_np 4 "$SEQPAR" "${TRAIN[@]}" "${G4[@]}" --zero $b --log "$T/u.jsonl" >"$T/r.out" 2>&1 || bad "--zero $b: $(tail -n 2 "$T/r.out")"
    fi
    if [ "$exact" = 1 ]; then
        if [ "$(losses "$T/r.jsonl" | wc -l)" -eq 20 ] && [ "$(losses "$T/r.jsonl")" = "$(losses "$T/u.jsonl")" ]; then ok; else
            bad "--zero $a saved, --zero $b resumed: not bit-identical to the uninterrupted run"; diff <(losses "$T/r.jsonl") <(losses "$T/u.jsonl") | head -n 4; fi
    elif close "$T/r.jsonl" "$T/u.jsonl"; then ok; else
        bad "--zero $a saved, --zero $b resumed: differs from the uninterrupted run"; paste <(losses "$T/r.jsonl") <(losses "$T/u.jsonl") | head -n 4; fi
}
resume_case 2 2 1
resume_case 3 3 1
resume_case "3 --zero-group 2" "3 --zero-group 2" 1
resume_case 3 0 0
resume_case 0 3 0
resume_case 2 "3 --zero-group 2" 0
resume_case "3 --zero-group 1" 1 0

# ---- comm.h's pieces: with SEQPAR_COMM_PIECE=97 every collective of ZeRO (the reduce-scatters, the
# gathers of ZeRO-1/2's update and of ZeRO-3's layers, the cross-group allreduce, a save's fetches)
# runs in messages of at most 97 elements, and nothing moves a bit: the losses of every step, the
# saved model and optimizer files and a resume from them are those of the default run above
pieces_case() { # "zero flags": saved at step 10 and resumed under the knob, against resume_case's files
    local a=$1 saved
    saved="$T/saved_$(printf '%s' "$a" | tr -c 'A-Za-z0-9-' '_')"
    rm -rf "$T/pk" "$T/p.jsonl"
    # shellcheck disable=SC2086
    SEQPAR_COMM_PIECE=97 run_np 4 "$SEQPAR" "${TRAIN[@]}" "${G4[@]}" --zero $a --stop-at 10 --save "$T/pk" --log "$T/p.jsonl" >"$T/p.out" 2>&1 ||
        { bad "pieces of 97: save under --zero $a: $(tail -n 2 "$T/p.out")"; return; }
    local f diff=""
    for f in model.safetensors optimizer.safetensors; do cmp -s "$T/pk/$f" "$saved/$f" || diff="$diff $f"; done
    if [ -z "$diff" ] && [ "$(losses "$T/p.jsonl")" = "$(losses "$saved.jsonl")" ]; then ok; else
        bad "pieces of 97, --zero $a: steps 1-10 or the saved files ($diff) differ from the default run's"; fi
    # shellcheck disable=SC2086
    SEQPAR_COMM_PIECE=97 run_np 4 "$SEQPAR" "${TRAIN[@]}" "${G4[@]}" --zero $a --resume "$T/pk" --log "$T/p.jsonl" >"$T/p.out" 2>&1 ||
        { bad "pieces of 97: resume under --zero $a: $(tail -n 2 "$T/p.out")"; return; }
    if [ "$(losses "$T/p.jsonl" | wc -l)" -eq 20 ] && [ "$(losses "$T/p.jsonl")" = "$(losses "$T/run4 ${G4[*]} --zero $a.jsonl")" ]; then ok; else
        bad "pieces of 97, --zero $a: the resumed run is not bit-identical to the default uninterrupted one"; fi
}
pieces_case 2
pieces_case 3
pieces_case "3 --zero-group 2"
rm -f "$T/p.jsonl"
SEQPAR_COMM_PIECE=97 run_np 4 "$SEQPAR" "${TRAIN[@]}" "${G4[@]}" --zero 1 --log "$T/p.jsonl" >"$T/p.out" 2>&1 || bad "pieces of 97, --zero 1: $(tail -n 2 "$T/p.out")"
if [ "$(losses "$T/p.jsonl")" = "$(losses "$T/run4 ${G4[*]} --zero 1.jsonl")" ]; then ok; else
    bad "pieces of 97, --zero 1: 20 steps not bit-identical to the default run"; fi

# ---- bytes per kind against the formulas (data_parallel.h), seqpar grad: one micro-batch
F=tiny_headdim
cfg() { sed -nE "s/.*\"$1\": *([0-9a-z]+).*/\1/p" "$FIX/$F/config.json"; }
D=$(cfg hidden_size); FF=$(cfg intermediate_size); H=$(cfg num_attention_heads); KV=$(cfg num_key_value_heads)
HD=$(cfg head_dim); NL=$(cfg num_hidden_layers); V=$(cfg vocab_size); TIED=$(cfg tie_word_embeddings)
E=$((V * D)); TAIL=$D; [ "$TIED" = true ] || TAIL=$((D + V * D))
PSI=$((E + NL * (2 * D + 2 * D * H * HD + 2 * D * KV * HD + 3 * D * FF) + TAIL))
# expected "rank grad_reduce param_gather" lines: formula W g zero psi E tail mode(grad|train) steps m evals
formula() {
    awk -v W="$1" -v g="$2" -v z="$3" -v psi="$4" -v E="$5" -v tail="$6" -v mode="$7" -v steps="$8" -v m="$9" -v ev="${10}" '
        function ar(count, P, me, es,   base, rem, mine, p, s) { # allreduce, the direct model
            base = int(count / P); rem = count % P; mine = base + (me < rem); s = 0
            for (p = 0; p < P; p++) if (p != me) s += (base + (p < rem) + mine) * es
            return s }
        function ov(b, e, sb, se) { b = b > sb ? b : sb; e = e < se ? e : se; return e > b ? e - b : 0 }
        BEGIN {
            G = W / g
            for (r = 0; r < W; r++) {
                q = r % g; i = int(r / g)
                sb = int(q * psi / g); se = int((q + 1) * psi / g); n = se - sb
                no = ov(0, E, sb, se) + ov(psi - tail, psi, sb, se)
                gr = 0; pg = 0
                if (z == 0) gr = steps * ar(psi, W, r, 4)
                else {
                    if (g > 1) gr += steps * ((z >= 2 ? m : 1) * 4 * (psi - n) + ar(1, g, q, 8))
                    if (G > 1) gr += steps * ar(n, G, i, 4)
                    if (z == 3 && g > 1) pg += steps * m * 4 * (g - 1) * (2 * n - no) + ev * 4 * (g - 1) * n
                    if (mode == "train" && z <= 2 && g > 1) pg += steps * 4 * (g - 1) * n   # after the update
                    # the gradient file: zero 1 all-gathers it in place, zero 2/3 gather it to rank 0
                    if (mode == "grad" && g > 1 && z == 1) pg += 4 * (g - 1) * n
                    if (mode == "grad" && g > 1 && z >= 2 && i == 0 && q > 0) pg += 4 * n
                }
                printf "%d %d %d\n", r, gr, pg
            } }'
}
check_bytes() { # what out-file want
    local got
    got=$(sed -nE 's/^bytes rank ([0-9]+):.* grad_reduce ([0-9]+) param_gather ([0-9]+).*/\1 \2 \3/p' "$2")
    if [ -n "$got" ] && [ "$got" = "$3" ]; then ok; else
        bad "$1: bytes (rank grad_reduce param_gather) differ from the formulas (want | got)"
        paste <(printf '%s\n' "$3") <(printf '%s\n' "$got") | head -n 8; fi
}
stats_case() { # np zero group(0: world) flags...
    local np=$1 z=$2 g=$3
    shift 3
    local gflag=()
    [ "$g" -gt 0 ] && gflag=(--zero-group "$g")
    run_np "$np" "$SEQPAR" grad --model "$FIX/$F" --tokens "$FIX/$F/tokens.bin" --seq-len 40 --out "$T/s" --zero "$z" "${gflag[@]}" --stats "$@" >"$T/s.out" 2>&1 ||
        { bad "stats np $np zero $z group $g: $(tail -n 2 "$T/s.out")"; return; }
    [ "$g" -gt 0 ] || g=$np
    check_bytes "grad --stats np $np zero $z group $g $*" "$T/s.out" "$(formula "$np" "$g" "$z" "$PSI" "$E" "$TAIL" grad 1 1 0)"
}
stats_case 4 0 0 --cp 4
stats_case 4 1 0 --cp 4
stats_case 4 1 2 --cp 4
stats_case 4 2 0 --cp 4
stats_case 4 2 2 --cp 4
stats_case 4 3 0 --cp 4
stats_case 4 3 2 --cp 4
stats_case 4 3 1 --cp 4
stats_case 8 3 4 --dp 2 --cp 4
stats_case 8 2 2 --dp 2 --cp 4
stats_case 3 3 0 --dp 3                                               # shards of unequal size
# training: 3 steps of 2 micro-batches per rank (dp 2, batch 4) and a final evaluation of 2
# sequences per rank (forward only: zero 3 gathers every unit once)
TD=32; TV=64; TLAY=$((2 * TD + 2 * TD * TD + 2 * TD * 16 + 3 * TD * 64))
TE=$((TV * TD)); TT=$((TD + TV * TD)); TPSI=$((TE + 2 * TLAY + TT))
train_stats() { # np zero group flags...
    local np=$1 z=$2 g=$3
    shift 3
    run_np "$np" "$SEQPAR" "${TRAIN[@]}" --steps 3 --zero "$z" --zero-group "$g" --stats "$@" --log "$T/ts.jsonl" >"$T/ts.out" 2>&1 ||
        { bad "train --stats np $np zero $z group $g: $(tail -n 2 "$T/ts.out")"; return; }
    if grep -q "model: .*: 0.023M parameters" "$T/ts.out"; then :; else bad "train --stats: the model is not the one the formula assumes"; fi
    check_bytes "train --stats np $np zero $z group $g $*" "$T/ts.out" "$(formula "$np" "$g" "$z" "$TPSI" "$TE" "$TT" train 3 2 2)"
}
train_stats 4 1 2 --dp 2 --cp 2
train_stats 4 2 4 --dp 2 --cp 2
train_stats 4 3 4 --dp 2 --cp 2
train_stats 8 3 2 --dp 2 --cp 4
train_stats 8 2 4 --dp 2 --hp 2 --cp 2

# ---- memory: peak tracked bytes per rank (the log's peak_mem_bytes, max over ranks) drop by what
# the stages free. One micro-batch, 4 ranks, Psi parameters, n = Psi / 4 per shard, layer =
# one layer's parameters, the outer units embedding (E) and tail (final norm + head, T), which
# with the untied head here take turns in one buffer of max(E, T) = T floats:
#   zero 2 frees the flat gradient buffer and adds the outer gradients' buffer and two layer slots:
#       peak(1) - peak(2) = 4 (Psi - T - 2 layer)
#   zero 3 frees the flat parameter buffer and keeps the shard, two gathered layers (the one in
#   use and the next, prefetched) and (during a micro-batch) the gathered outer units' buffer:
#       peak(2) - peak(3) = 4 (Psi - n - 2 layer - T)
# (Until 2026-11-29 both outer buffers were E + T: 4 E = 256 KiB less saved by each stage, more
# than the 2% allowed.)
MD=128; MV=512; MF=512
MLAY=$((2 * MD + 2 * MD * MD + 2 * MD * 64 + 3 * MD * MF)); MOUT=$((MV * MD + MD + MV * MD)); MTURN=$((MV * MD + MD))
MPSI=$((4 * MLAY + MOUT)); MN=$((MPSI / 4))
for z in 0 1 2 3; do
    run_np 4 "$SEQPAR" train --layers 4 --hidden $MD --heads 4 --kv-heads 2 --ffn $MF --vocab $MV --seq-len 64 --batch 1 --steps 2 \
        --eval-every 0 --eval-seqs 1 --quiet --peak-gflops 100 --cp 4 --zero $z --log "$T/mem$z.jsonl" >"$T/mem.out" 2>&1 ||
        bad "memory run --zero $z: $(tail -n 2 "$T/mem.out")"
done
peak() { sed -nE 's/.*"step": 2,.*"peak_mem_bytes": ([0-9]+),.*/\1/p' "$T/mem$1.jsonl"; }
mem_step() { # what measured expected
    if [ -n "$2" ] && awk -v a="$2" -v b="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * b) }'; then ok; else
        bad "memory: $1 saves $2 bytes per rank, the formula $3"; fi
}
p0=$(peak 0); p1=$(peak 1); p2=$(peak 2); p3=$(peak 3)
if [ -n "$p0" ] && [ -n "$p3" ] && [ "$p0" -gt "$p1" ] && [ "$p1" -gt "$p2" ] && [ "$p2" -gt "$p3" ]; then ok; else
    bad "memory: peaks per stage do not fall: $p0 $p1 $p2 $p3"; fi
mem_step "zero 2 over zero 1" "$((p1 - p2))" "$((4 * (MPSI - MTURN - 2 * MLAY)))"
mem_step "zero 3 over zero 2" "$((p2 - p3))" "$((4 * (MPSI - MN - 2 * MLAY - MTURN)))"

# ---- a save under ZeRO-3 streams the sharded parameters and moments to rank 0 piece by piece:
# rank 0's peak RSS (the log's run_end) grows by less than a quarter of the parameters' bytes
# with --save than without (18.5 M parameters, 74 MB; until 2026-11-29 rank 0 gathered parameters,
# m and v whole: +185 MB), and a resume reads only each rank's own moments
SV=(train --layers 2 --hidden 256 --ffn 1024 --heads 4 --kv-heads 2 --vocab 32000 --seq-len 64 --batch 1 --cp 2 --zero 3
    --eval-every 0 --eval-seqs 1 --quiet --peak-gflops 100)
rss_of() { sed -nE 's/.*"run_end".*"peak_rss_bytes_max": ([0-9]+).*/\1/p' "$1" | tail -n 1; }
rm -rf "$T/sv_ck" "$T"/sv_*.jsonl
run_np 2 "$SEQPAR" "${SV[@]}" --steps 2 --log "$T/sv_no.jsonl" >"$T/sv.out" 2>&1 || bad "ZeRO-3 run without --save: $(tail -n 2 "$T/sv.out")"
run_np 2 "$SEQPAR" "${SV[@]}" --steps 2 --stop-at 1 --save "$T/sv_ck" --log "$T/sv_yes.jsonl" >"$T/sv.out" 2>&1 ||
    bad "ZeRO-3 run with --save: $(tail -n 2 "$T/sv.out")"
a=$(rss_of "$T/sv_no.jsonl"); b=$(rss_of "$T/sv_yes.jsonl")
if [ -n "$a" ] && [ -n "$b" ] && [ $((b - a)) -lt $((18500000 * 4 / 4)) ]; then ok; else
    bad "a ZeRO-3 save raised the peak RSS from ${a:-?} to ${b:-?} bytes (want less than a quarter of the 74 MB of parameters more)"; fi
run_np 2 "$SEQPAR" "${SV[@]}" --steps 2 --resume "$T/sv_ck" --log "$T/sv_res.jsonl" >"$T/sv.out" 2>&1 || bad "ZeRO-3 resume: $(tail -n 2 "$T/sv.out")"
if [ "$(losses "$T/sv_res.jsonl")" = "$(losses "$T/sv_no.jsonl" | tail -n 1)" ]; then ok; else
    bad "ZeRO-3 saved at step 1 and resumed: step 2 differs from the uninterrupted run"; fi

# ---- the gradient's reduction holds no rank's memory above the others' (comm.h: seqpar's own
# reduce-scatter and allreduce, summed in place; until 2026-12-06 Open MPI's MPI_Ireduce_scatter
# reduced every unit whole on rank 0 and scattered it from there, and rank 0's peak RSS stood 73 to
# 146 MB above the other ranks' in these runs): 4 ranks, a 32000-token vocabulary (its embedding
# 32.8 MB), under every stage every rank's peak RSS (the log's run_end: the largest and the smallest)
# within 8 MB (seen 0.2-1.2). This also checks that ZeRO-3's buffer for the embedding and head units,
# mapped for each pass and unmapped after it, does not come from glibc's heap: there the freed
# 32.8 MB unit stays (the first free raises malloc's mmap threshold to its size), and where a small
# allocation lands in it the next pass grows the heap by a unit (one rank ~32.8 MB above the others
# in about 1 of 5 runs).
BAL=(train --layers 2 --hidden 256 --ffn 1024 --heads 4 --kv-heads 2 --vocab 32000 --seq-len 64 --batch 1 --cp 4 --steps 2
     --eval-every 0 --eval-seqs 1 --quiet --peak-gflops 100 --threads 1)
rss_field() { sed -nE "s/.*\"run_end\".*\"$2\": ([0-9]+).*/\1/p" "$1" | tail -n 1; }
for z in 0 1 2 3; do
    rm -f "$T/bal.jsonl"
    run_np 4 "$SEQPAR" "${BAL[@]}" --zero $z --log "$T/bal.jsonl" >"$T/bal.out" 2>&1 || bad "--zero $z balance run: $(tail -n 2 "$T/bal.out")"
    hi=$(rss_field "$T/bal.jsonl" peak_rss_bytes_max); lo=$(rss_field "$T/bal.jsonl" peak_rss_bytes_min)
    if [ -n "$hi" ] && [ -n "$lo" ] && [ $((hi - lo)) -lt 8000000 ]; then ok; else
        bad "--zero $z on 4 ranks: the largest rank's peak RSS ${hi:-?} bytes, the smallest rank's ${lo:-?} (want within 8 MB)"; fi
done

# ---- ZeRO-3 never holds the whole model on a rank: each rank fills only its shard of the flat
# parameters, whose other pages (and the gradient buffer's) are never written before ZeRO-3 frees
# them. 4 ranks: a 32-layer model's peak RSS (the log's run_end) exceeds a 2-layer one's by less
# than 1.6x the 30 layers' parameter bytes (seen 1.03x; until 2026-11-29 every rank built and
# zeroed the whole parameters and gradients first: 2.3x)
DL=(train --hidden 256 --ffn 704 --heads 4 --kv-heads 2 --vocab 256 --seq-len 64 --batch 1 --cp 4 --zero 3 --steps 1
    --eval-every 0 --eval-seqs 1 --quiet --peak-gflops 100 --threads 1)
run_np 4 "$SEQPAR" "${DL[@]}" --layers 2 --log "$T/dl2.jsonl" >"$T/dl.out" 2>&1 || bad "2-layer ZeRO-3 run: $(tail -n 2 "$T/dl.out")"
run_np 4 "$SEQPAR" "${DL[@]}" --layers 32 --log "$T/dl32.jsonl" >"$T/dl.out" 2>&1 || bad "32-layer ZeRO-3 run: $(tail -n 2 "$T/dl.out")"
a=$(rss_of "$T/dl2.jsonl"); b=$(rss_of "$T/dl32.jsonl"); per_layer=$((2 * 256 + 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 704))
if [ -n "$a" ] && [ -n "$b" ] && [ $((10 * (b - a))) -lt $((16 * 30 * per_layer * 4)) ]; then ok; else
    bad "ZeRO-3 on 4 ranks: 30 more layers raised the peak RSS from ${a:-?} to ${b:-?} bytes (want under 1.6x their $((30 * per_layer * 4)) parameter bytes)"; fi

# ---- a non-finite gradient (test hook: NaN in rank 0's gradient at step 3) is seen under
# every sharded stage: --skip-nonfinite skips exactly that step on every rank
for z in 2 3; do
    rm -f "$T/nf.jsonl"
    SEQPAR_FAULT_NONFINITE=3 run_np 4 "$SEQPAR" "${TRAIN[@]}" --steps 5 --dp 2 --cp 2 --zero $z --skip-nonfinite 1 --log "$T/nf.jsonl" >"$T/nf.out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ "$(losses "$T/nf.jsonl" | wc -l)" -eq 4 ] && grep -q '"step": 3, "nonfinite": true, "action": "skipped"' "$T/nf.jsonl"; then ok; else
        bad "--zero $z: a NaN gradient at step 3 was not skipped (status $rc): $(tail -n 2 "$T/nf.out")"; fi
done

# ---- a recall evaluation whose sequences do not split evenly over the dp replicas (3 over 2):
# every replica makes the same passes (ZeRO-3's gathers span them), and exactly 3 sequences count
rm -f "$T/ev.jsonl"
run_np 2 "$SEQPAR" "${TRAIN[@]}" --steps 2 --dp 2 --zero 3 --eval-seqs 3 --eval-every 1 --comm-timeout 20 --log "$T/ev.jsonl" >"$T/ev.out" 2>&1
rc=$?
q=$(grep -c '"eval": "recall"' "$T/ev.jsonl" 2>/dev/null)
n=$(grep '"eval": "recall"' "$T/ev.jsonl" 2>/dev/null | tail -n 1 | grep -o '"total": [0-9]*' | awk '{ s += $2 } END { print s + 0 }')
per=$(sed -nE 's/.*recall task: [0-9]+ pairs, ([0-9]+) queries per sequence.*/\1/p' "$T/ev.out")
if [ $rc -eq 0 ] && [ "$q" = 2 ] && [ -n "$per" ] && [ "$n" -eq $((3 * per)) ]; then ok; else
    bad "--zero 3 --dp 2 --eval-seqs 3: status $rc, $q evaluations, $n queries counted (want 2 and $((3 * ${per:-0}))): $(tail -n 2 "$T/ev.out")"; fi

# ---- bad input: the same one line on every rank, non-zero exit, no hang
zero_error() { # np words flags...
    local np=$1 words=$2
    shift 2
    local err rc n
    err=$(timeout 60 mpirun --oversubscribe -np "$np" "$SEQPAR" grad --model "$FIX/tiny_long" --tokens "$FIX/tiny_long/tokens.bin" --seq-len 256 --out "$T/x" "$@" 2>&1 >/dev/null)
    rc=$?
    n=$(printf '%s\n' "$err" | grep -c "^seqpar: error: .*$words")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "zero error '$words' ($*): status $rc"; return; fi
    # exactly one line per rank from seqpar (mpirun adds its own report of the failed job)
    if [ "$n" -ne "$np" ] || [ "$(printf '%s\n' "$err" | grep -c '^seqpar')" -ne "$np" ] ||
        [ "$(printf '%s\n' "$err" | grep '^seqpar' | sort -u | wc -l)" -ne 1 ]; then
        bad "zero error '$words' ($*): $n of $np ranks printed it: $(printf '%s' "$err" | head -n 3)"; return; fi
    ok
}
zero_error 2 "--zero must be between 0 and 3, got 4" --cp 2 --zero 4
zero_error 2 "--zero must be between 0 and 3, got -1" --cp 2 --zero -1
zero_error 4 "--zero-group 3 does not divide the 4 ranks" --cp 4 --zero 2 --zero-group 3
zero_error 2 "--zero-group 4 does not divide the 2 ranks" --cp 2 --zero 3 --zero-group 4
zero_error 2 "--zero-group 2 shards nothing under --zero 0" --cp 2 --zero-group 2
zero_error 2 "--zero-group must be between 1 and" --cp 2 --zero 3 --zero-group 0

summary test_zero
