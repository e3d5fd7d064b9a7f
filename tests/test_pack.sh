#!/usr/bin/env bash
# End-to-end tests of packed documents (`--pack`, data/packing.h) on the tiny_packed fixture (S = 64
# tokens, 7 documents ended by eos_token_id 3, one of them only the end-of-text token, the last one
# cut by the window):
#   - `seqpar grad --pack` equals running EACH DOCUMENT SEPARATELY: the window is cut into one
#     token file per document (tool_packed_reference split), `seqpar grad` (no --pack) runs each,
#     and the losses and gradient files combined with weights n_d / n (targets per document) must
#     give the packed loss (1e-6 relative) and gradient file (1e-4 of each tensor's largest entry);
#   - and transformers 5.23 in float64 with position_ids and a per-document causal mask (the
#     fixture's expected.json and grads.safetensors);
#   - at 2, 4 and 8 ranks under every strategy (2d, ring, ulysses, double ring, lightseq,
#     allgather, wallfacer, fpdt), every layout and placement, dp and ZeRO, selective
#     checkpointing: the single-process packed loss and gradient file, and the fixture's;
#   - `seqpar train --pack` on text (one document per line, --eot 10) trains like one process on
#     2 and 4 ranks (10 steps, 2e-4 relative), and differs from unpacked training; a packed run
#     resumed at step 4 is bit-identical, and resuming with --pack switched on or off is refused;
#   - bad input: --eot without --pack, no end-of-text id known, an id outside the vocabulary, a
#     config listing several eos ids, --pack with the recall task: one line, non-zero exit, on every rank.
# Prints "test_pack: N passed, N failed".
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
. tests/lib.sh
mpi_test_env
TOOL="$BUILD/tests/tool_packed_reference"
F="$FIX/tiny_packed"
S=64
loss_of() { sed -nE 's/^loss: (.*)$/\1/p' "$1"; }
close() { # a b rel: |a - b| <= rel |b|
    awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(a != "" && b != "" && d <= r * m) }'
}
want_hf=$(sed -nE 's/.*"loss": ([^,]+),.*/\1/p' "$F/expected.json")

# ---- one process: packed = each document alone = transformers
timeout 60 "$SEQPAR" grad --model "$F" --tokens "$F/tokens.bin" --seq-len $S --out "$T/packed" --pack >"$T/packed.out" 2>&1 ||
    bad "grad --pack: $(tail -n 2 "$T/packed.out")"
single=$(loss_of "$T/packed.out")
if grep -q "packed: 7 documents (end-of-text id 3), 58 of 64 targets" "$T/packed.out"; then ok; else bad "grad --pack did not report 7 documents, 58 targets: $(head -n 1 "$T/packed.out")"; fi
if close "$single" "$want_hf" 1e-6; then ok; else bad "grad --pack loss $single, transformers $want_hf"; fi
if "$CMP" "$T/packed" "$F/grads.safetensors" 1e-4 1e-7 >/dev/null; then ok; else bad "grad --pack vs transformers: $("$CMP" "$T/packed" "$F/grads.safetensors" 1e-4 1e-7)"; fi

mkdir -p "$T/docs"
"$TOOL" split "$F/tokens.bin" $S 3 "$T/docs" >"$T/docs/list" || bad "splitting the window into documents"
total=$(awk '{ n += $3 } END { print n }' "$T/docs/list")
[ "$total" = 58 ] && [ "$(wc -l <"$T/docs/list")" = 6 ] && ok || bad "split: $(cat "$T/docs/list")"
sum_args=() loss_args=()
while read -r k len n; do
    timeout 60 "$SEQPAR" grad --model "$F" --tokens "$T/docs/doc_$k.bin" --seq-len "$len" --out "$T/docs/g_$k" >"$T/docs/o_$k" 2>&1 ||
        bad "grad of document $k alone: $(tail -n 1 "$T/docs/o_$k")"
    w=$(awk -v n="$n" -v t="$total" 'BEGIN { printf "%.17g", n / t }')
    sum_args+=("$w" "$T/docs/g_$k")
    loss_args+=("$w" "$(loss_of "$T/docs/o_$k")")
done <"$T/docs/list"
"$TOOL" sum "$T/docs/combined" "${sum_args[@]}" || bad "combining the documents' gradients"
separate=$("$TOOL" wsum "${loss_args[@]}")
if close "$single" "$separate" 1e-6; then ok; else bad "grad --pack loss $single, documents run separately $separate"; fi
if "$CMP" "$T/packed" "$T/docs/combined" 1e-4 1e-7 >/dev/null; then ok; else
    bad "grad --pack vs documents run separately: $("$CMP" "$T/packed" "$T/docs/combined" 1e-4 1e-7)"; fi
# the test can fail: without --pack the same window gives another loss and other gradients
timeout 60 "$SEQPAR" grad --model "$F" --tokens "$F/tokens.bin" --seq-len $S --out "$T/unpacked" >"$T/unpacked.out" 2>&1
if ! close "$(loss_of "$T/unpacked.out")" "$separate" 1e-3 && ! "$CMP" "$T/unpacked" "$T/docs/combined" 1e-4 1e-7 >/dev/null; then ok; else
    bad "the unpacked window matches the per-document reference: the comparison cannot fail"; fi

# ---- every strategy at 2, 4 and 8 ranks: the single-process packed result and transformers'
pack_case() { # np flags...
    local np=$1
    shift
    local out rc got
    out=$(run_np "$np" "$SEQPAR" grad --model "$F" --tokens "$F/tokens.bin" --seq-len $S --out "$T/dist" --pack "$@" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then bad "grad --pack np $np $*: status $rc: $(printf '%s' "$out" | tail -n 2)"; return; fi
    got=$(printf '%s\n' "$out" | sed -nE 's/^loss: (.*)$/\1/p')
    if close "$got" "$single" 1e-6; then ok; else bad "grad --pack np $np $*: loss $got, one process $single"; fi
    if "$CMP" "$T/dist" "$T/packed" 1e-4 1e-7 >/dev/null; then ok; else bad "grad --pack np $np $*: $("$CMP" "$T/dist" "$T/packed" 1e-4 1e-7)"; fi
    if "$CMP" "$T/dist" "$F/grads.safetensors" 1e-4 1e-7 >/dev/null; then ok; else bad "grad --pack np $np $*: differs from transformers"; fi
}
pack_case 2 --cp 2                                        # 2d = ring, zigzag
pack_case 2 --hp 2                                        # Ulysses
pack_case 2 --cp 2 --layout striped
pack_case 2 --cp 2 --layout contiguous --checkpoint selective
pack_case 2 --dp 2 --zero 1
pack_case 2 --strategy lightseq
pack_case 2 --strategy allgather
pack_case 2 --strategy fpdt --chunks 4
pack_case 2 --strategy wallfacer --team 1
pack_case 4 --strategy ring --layout contiguous
pack_case 4 --strategy ulysses                            # KV replication (2 KV heads over hp 4)
pack_case 4 --hp 2 --cp 2 --placement context-first
pack_case 4 --cp 4 --ring-inner 2 --layout striped        # double ring
pack_case 4 --strategy lightseq
pack_case 4 --strategy lightseq --hp 2
pack_case 4 --strategy allgather --layout striped
pack_case 4 --strategy wallfacer --team 2
pack_case 4 --strategy fpdt --chunks 2 --offload-dir "$T"
pack_case 8 --dp 2 --hp 2 --cp 2 --zero 1
pack_case 8 --cp 8 --ring-inner 4
pack_case 8 --hp 2 --cp 4 --layout contiguous --checkpoint layer
pack_case 8 --strategy lightseq
pack_case 8 --strategy allgather --hp 2
pack_case 8 --strategy wallfacer --team 2 --placement ring-first
pack_case 8 --strategy fpdt --dp 2 --chunks 2

# ---- training: one document per line of text, the newline ends it
awk 'BEGIN { srand(7); for (i = 0; i < 300; i++) { n = 1 + int(rand() * 40); s = ""; for (j = 0; j < n; j++) s = s sprintf("%c", 97 + int(rand() * 26)); print s } }' >"$T/docs.txt"
UNPACKED=(train --data "$T/docs.txt" --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --seq-len 64
          --batch 2 --steps 10 --warmup 2 --quiet --peak-gflops 100 --seed 5)
TRAIN=("${UNPACKED[@]}" --pack --eot 10)
timeout 120 "$SEQPAR" "${TRAIN[@]}" --log "$T/t1.jsonl" >"$T/t1.out" 2>&1 || bad "train --pack: $(tail -n 2 "$T/t1.out")"
for grid in "2 --cp 2" "4 --strategy lightseq" "4 --strategy wallfacer --team 2 --layout striped"; do
    set -- $grid
    np=$1
    shift
    run_np "$np" "$SEQPAR" "${TRAIN[@]}" "$@" --log "$T/tg.jsonl" >"$T/tg.out" 2>&1 || bad "train --pack np $np $*: $(tail -n 2 "$T/tg.out")"
    if [ "$(losses "$T/tg.jsonl" | wc -l)" -eq 10 ] && paste <(losses "$T/t1.jsonl") <(losses "$T/tg.jsonl") |
        awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-4 * $2) bad = 1 } END { exit bad }'; then ok; else
        bad "train --pack np $np $* does not track one process"; paste <(losses "$T/t1.jsonl") <(losses "$T/tg.jsonl") | head -n 3; fi
    rm -f "$T/tg.jsonl"
done
timeout 120 "$SEQPAR" "${UNPACKED[@]}" --log "$T/t0.jsonl" >"$T/t0.out" 2>&1 || bad "unpacked training: $(tail -n 2 "$T/t0.out")"
if [ "$(losses "$T/t0.jsonl" | wc -l)" -eq 10 ] && [ "$(losses "$T/t0.jsonl" | head -n 1)" != "$(losses "$T/t1.jsonl" | head -n 1)" ]; then ok; else
    bad "train --pack gives the unpacked loss (or the unpacked run failed)"; fi
# MFU counts only the attention packed documents compute: flops_per_token is the unpacked one less
# 6 L H d (64 - len) with len the attention length (sum of squared document lengths / 64), which
# documents of 1-41 tokens keep between 1 and 41; unpacked it is the same every step; MFU agrees
fpt() { sed -nE 's/.*"flops_per_token": ([0-9.e+]+).*/\1/p' "$1"; }
if paste <(fpt "$T/t0.jsonl") <(fpt "$T/t1.jsonl") | awk -v a=$((6 * 2 * 4 * 8)) '
    { n++; if (NR > 1 && $1 != u) bad = 1; u = $1; len = 64 - ($1 - $2) / a; if (!(len >= 1 && len <= 41)) bad = 1 }
    END { exit bad || n != 10 }' &&
    awk '{ t = $0; sub(/.*"tokens_per_s_per_rank": /, "", t); sub(/,.*/, "", t); m = $0; sub(/.*"mfu": /, "", m); sub(/,.*/, "", m)
           f = $0; sub(/.*"flops_per_token": /, "", f); sub(/,.*/, "", f); r = t * f / 100e9 / m
           if (m < 1 && (r < 0.999 || r > 1.001)) bad = 1 } END { exit bad }' "$T/t1.jsonl"; then ok; else
    bad "train --pack: flops_per_token / MFU do not count the documents' attention: $(paste <(fpt "$T/t0.jsonl") <(fpt "$T/t1.jsonl") | head -n 3 | tr '\n' ' ')"; fi

# a text of nothing but newlines under --pack --eot 10: nothing to train, said as such (was "use a longer
# --seq-len or more --recall-queries", which helps neither)
awk 'BEGIN { for (i = 0; i < 200; i++) print "" }' >"$T/empty_lines.txt"
err=$(timeout 60 "$SEQPAR" train --data "$T/empty_lines.txt" --layers 1 --hidden 32 --heads 4 --vocab 16 --seq-len 16 --steps 2 \
      --quiet --pack --eot 10 --log "$T/e.jsonl" 2>&1 >/dev/null); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s\n' "$err" | grep -q "^seqpar: error: step 1: every token of the batch is the end-of-text id 10 (--pack), so nothing is trained: check --eot or the data$"; then ok
else bad "train --pack on newlines only: status $rc: $err"; fi

# resuming a packed run is bit-identical; resuming it without --pack (or unpacked with --pack) is refused
timeout 120 "$SEQPAR" "${TRAIN[@]}" --stop-at 4 --save "$T/ck" --log "$T/tr.jsonl" >"$T/tr.out" 2>&1 || bad "train --pack --save: $(tail -n 2 "$T/tr.out")"
timeout 120 "$SEQPAR" "${TRAIN[@]}" --resume "$T/ck" --log "$T/tr.jsonl" >"$T/tr.out" 2>&1 || bad "train --pack --resume: $(tail -n 2 "$T/tr.out")"
if [ "$(losses "$T/tr.jsonl")" = "$(losses "$T/t1.jsonl")" ]; then ok; else bad "train --pack resumed at step 4 differs from the uninterrupted run"; fi
err=$(timeout 60 "$SEQPAR" "${UNPACKED[@]}" --resume "$T/ck" --log "$T/x.jsonl" 2>&1 >/dev/null)
if printf '%s' "$err" | grep -q "trained with pack_eot = 10 but this run uses none"; then ok; else bad "resuming a packed run unpacked: $err"; fi
timeout 120 "$SEQPAR" "${UNPACKED[@]}" --stop-at 2 --save "$T/ck0" --log "$T/x.jsonl" >/dev/null 2>&1 || bad "unpacked --save failed"
err=$(timeout 60 "$SEQPAR" "${TRAIN[@]}" --resume "$T/ck0" --log "$T/x.jsonl" 2>&1 >/dev/null)
if printf '%s' "$err" | grep -q "trained with pack_eot = none but this run uses 10"; then ok; else bad "resuming an unpacked run packed: $err"; fi

# ---- bad input: one line, non-zero exit, every rank
pack_error() { # np words args...
    local np=$1 words=$2
    shift 2
    local err rc n
    if [ "$np" -eq 1 ]; then err=$(timeout 60 "$SEQPAR" "$@" 2>&1 >/dev/null); else
        err=$(timeout 60 mpirun --oversubscribe -np "$np" "$SEQPAR" "$@" 2>&1 >/dev/null); fi
    rc=$?
    n=$(printf '%s\n' "$err" | grep -cF -- "$words")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "'$words' ($*): status $rc"; return; fi
    if [ "$n" -ne "$np" ]; then bad "'$words' ($*): $n of $np ranks printed it: $(printf '%s' "$err" | head -n 3)"; return; fi
    # one line per rank, all the same (mpirun adds its own banner on a non-zero exit)
    if [ "$(printf '%s\n' "$err" | grep '^seqpar' | grep -v '^seqpar: error:' | wc -l)" -ne 0 ] ||
        [ "$(printf '%s\n' "$err" | grep '^seqpar: error:' | sort -u | wc -l)" -ne 1 ]; then bad "'$words' ($*): $err"; return; fi
    [ "$np" -gt 1 ] || [ "$(printf '%s' "$err" | grep -c '')" -eq 1 ] || { bad "'$words' ($*): more than one line: $err"; return; }
    ok
}
G=(grad --tokens "$F/tokens.bin" --seq-len $S --out "$T/x")
pack_error 2 "--eot is read with --pack only" "${G[@]}" --model "$F" --eot 3 --cp 2
pack_error 2 "pass --eot ID (the model's config.json has no eos_token_id)" grad --model "$FIX/tiny_long" --tokens "$FIX/tiny_long/tokens.bin" --seq-len 64 --out "$T/x" --pack --cp 2
pack_error 1 "end-of-text id 64 is outside the vocabulary (vocab_size 64)" "${G[@]}" --model "$F" --pack --eot 64
mkdir -p "$T/multi"
cp "$F/model.safetensors" "$T/multi/"
sed 's/"eos_token_id": 3/"eos_token_id": [3, 5]/' "$F/config.json" >"$T/multi/config.json"
pack_error 2 "lists 2 eos_token_id values: pass the one that ends documents with --eot ID" "${G[@]}" --model "$T/multi" --pack --cp 2
pack_error 1 "--pack splits token data" train --pack --eot 1 --steps 1 --log "$T/x.jsonl"
pack_error 1 "a model from size flags has none" train --data "$T/docs.txt" --pack --steps 1 --log "$T/x.jsonl"
# with --eot the list does not matter
timeout 60 "$SEQPAR" "${G[@]}" --model "$T/multi" --pack --eot 3 >"$T/m.out" 2>&1 && [ "$(loss_of "$T/m.out")" = "$single" ] && ok ||
    bad "--eot 3 with a config listing two eos ids: $(tail -n 1 "$T/m.out")"
# the validation loss of a packed run is packed too (it attended across documents, with positions
# not restarted, and scored the target after each end-of-text: the unpacked loss): with --lr 0 the
# one validation window's loss is grad --pack's, on 1 and 2 ranks (ring), and its targets are counted
cp "$F/tokens.bin" "$T/val_copy.bin"
want=$(timeout 60 "$SEQPAR" grad --model "$F" --tokens "$F/tokens.bin" --seq-len 64 --out "$T/v.st" --pack 2>/dev/null | sed -nE 's/^loss: ([0-9.]+)$/\1/p')
for np in 1 2; do
    VT=(train --model "$F" --data "$F/tokens.bin" --val-data "$T/val_copy.bin" --pack --seq-len 64 --batch 2 --steps 1 --lr 0 --warmup 0 --eval-batches 1 --quiet --log "$T/val$np.jsonl")
    if [ "$np" -eq 1 ]; then out=$(timeout 120 "$SEQPAR" "${VT[@]}" 2>&1); else out=$(timeout 120 mpirun --oversubscribe -np 2 "$SEQPAR" "${VT[@]}" --strategy ring --cp 2 2>&1); fi
    got=$(sed -nE 's/.*"val_loss": ([0-9.eE+-]+), "val_tokens": ([0-9]+).*/\1 \2/p' "$T/val$np.jsonl" | tail -n 1)
    if [ -n "$want" ] && awk -v g="$got" -v w="$want" 'BEGIN { split(g, a, " "); d = a[1] - w; if (d < 0) d = -d; exit !(d <= 1e-6 * w && a[2] == 58) }'; then ok
    else bad "packed validation on $np rank(s): '$got' (loss, tokens), grad --pack $want over 58 targets: $(printf '%s' "$out" | tail -n 1)"; fi
done
summary test_pack
