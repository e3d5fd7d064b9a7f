#!/usr/bin/env bash
# `seqpar eval`: the loss on 2, 3 and 4 ranks under ulysses, ring, 2d, fpdt, allgather and data
# parallelism equal to one process's (1e-6 relative: the same tokens' losses with attention's
# partial results merged in another order, each a few fp32 ulps off; seen: <= 3e-9), per position
# bucket too, with the buckets' token counts summing to the total; equal bit for bit to the
# validation loss `seqpar train --steps 0 --val-data` prints for the same sequences on the same ranks
# (plain, packed and bf16) and to train's recall accuracy by distance; the forward-only activations
# smaller than a training step's; the JSON summary; one-line errors with a non-zero exit on every
# rank for bad input. Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
mpi_test_env
export SEQPAR_PEAK_GFLOPS=${SEQPAR_PEAK_GFLOPS:-100} # train: no start-up sgemm trials (as run_tests.sh)

M="$FIX/tiny_bytes" # byte-level, 2 layers, 4 query and 2 key/value heads, 1M positions
# text: the first 12,000 bytes of the docs (4 sequences of 2400 tokens + 1)
cat README.md docs/*.md | head -c 12000 >"$T/text.txt"
S=2400

# field FILE KEY: a top-level number of a summary
field() { sed -nE "s/^  \"$2\": ([^,]*),?$/\1/p" "$1"; }
# the by-position rows "from to tokens loss" of a summary
buckets() { sed -nE 's/.*"from": ([0-9]+), "to": ([0-9]+), "tokens": ([0-9]+), "loss": ([^,]+),.*/\1 \2 \3 \4/p' "$1"; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= r * (b < 0 ? -b : b)) }'; }

# ---- one process: the reference; the buckets 1-1K and 1K-2400, their tokens adding up
if timeout 60 "$SEQPAR" eval --model "$M" --data "$T/text.txt" --seq-len $S --out "$T/one.json" >"$T/one.out" 2>&1; then ok; else bad "eval, one process: $(tail -n 2 "$T/one.out")"; fi
L1=$(field "$T/one.json" loss)
if [ "$(buckets "$T/one.json" | cut -d' ' -f1-3 | tr '\n' ' ')" = "1 1024 4096 1025 2400 5504 " ] &&
    [ "$(field "$T/one.json" tokens)" = 9600 ] && [ "$(field "$T/one.json" sequences)" = 4 ]; then ok; else
    bad "buckets of one process: $(buckets "$T/one.json" | tr '\n' ' ') / $(field "$T/one.json" tokens) tokens"; fi
if grep -q '^  1K-2400 ' "$T/one.out" && grep -q '^loss .*perplexity' "$T/one.out" && grep -q 'tokens/s' "$T/one.out"; then ok; else
    bad "the printed table: $(cat "$T/one.out")"; fi

# ---- N ranks: the same loss, overall and per bucket, the same token counts
eval_case() { # np flags...
    local np=$1
    shift
    local out="$T/np$np${*// /}.json"
    if ! run_np "$np" "$SEQPAR" eval --model "$M" --data "$T/text.txt" --seq-len $S --out "$out" "$@" >"$T/case.out" 2>&1; then
        bad "eval np $np $*: $(tail -n 2 "$T/case.out")"; return; fi
    local got sum=0 b
    got=$(field "$out" loss)
    if close "$got" "$L1" 1e-6; then ok; else bad "eval np $np $*: loss $got, one process $L1"; fi
    # per bucket: the same token counts, the losses within the same bound; the counts add up
    local ok_b=1
    while read -r a b1 n l; do
        sum=$((sum + n))
        read -r ra rb rn rl <&3
        [ "$a $b1 $n" = "$ra $rb $rn" ] && close "$l" "$rl" 1e-6 || ok_b=0
    done < <(buckets "$out") 3< <(buckets "$T/one.json")
    if [ $ok_b = 1 ] && [ "$sum" = "$(field "$out" tokens)" ] && [ "$sum" = 9600 ]; then ok; else
        bad "eval np $np $*: buckets $(buckets "$out" | tr '\n' ' '), one process $(buckets "$T/one.json" | tr '\n' ' ')"; fi
}
eval_case 2 --strategy ulysses
eval_case 2 --strategy ring
eval_case 3 --strategy ring
eval_case 3 --strategy ulysses
eval_case 4 --strategy 2d --hp 2 --cp 2
eval_case 4 --strategy fpdt --chunks 2
eval_case 4 --strategy allgather --cp 4
eval_case 2 --dp 2

# ---- train's validation loss at step 0 for the same sequences on the same ranks: bit for bit
tail -c 12000 docs/cli.md >"$T/train.txt"
val_case() { # np flags...
    local np=$1
    shift
    local run=(run_np "$np")
    [ "$np" = 1 ] && run=(timeout 120)
    rm -f "$T/val.jsonl"
    "${run[@]}" "$SEQPAR" train --model "$M" --data "$T/train.txt" --val-data "$T/text.txt" --seq-len $S --steps 0 \
        --batch 4 --eval-batches 1 --log "$T/val.jsonl" "$@" >"$T/val.out" 2>&1
    "${run[@]}" "$SEQPAR" eval --model "$M" --data "$T/text.txt" --seq-len $S --out "$T/val.json" "$@" >"$T/ev.out" 2>&1
    local want got
    want=$(sed -nE 's/.*"val_loss": ([^,]+),.*/\1/p' "$T/val.jsonl")
    got=$(field "$T/val.json" loss)
    if [ -n "$want" ] && [ "$want" = "$got" ]; then ok; else bad "eval np $np $*: loss $got, train's validation loss $want: $(tail -n 1 "$T/val.out") $(tail -n 1 "$T/ev.out")"; fi
}
val_case 1
val_case 2 --strategy ring
val_case 4 --strategy ulysses --dp 2
val_case 2 --strategy ring --pack --eot 10 # documents end at a newline
val_case 2 --strategy ring --precision bf16
# packed: each document alone; its positions restart (the 1-1K bucket holds more tokens)
run_np 2 "$SEQPAR" eval --model "$M" --data "$T/text.txt" --seq-len $S --pack --eot 10 --out "$T/pack.json" >"$T/pack.out" 2>&1
n1=$(buckets "$T/pack.json" | head -n 1 | cut -d' ' -f3)
if [ -n "$n1" ] && [ "$n1" -gt 4096 ] && [ "$(buckets "$T/pack.json" | awk '{ s += $3 } END { print s }')" = "$(field "$T/pack.json" tokens)" ]; then ok; else
    bad "packed buckets: $(buckets "$T/pack.json" | tr '\n' ' ') of $(field "$T/pack.json" tokens)"; fi

# ---- the recall task: train's evaluation at step 0, the same accuracy by distance
run_np 2 "$SEQPAR" train --model "$M" --data recall --seq-len 256 --steps 0 --eval-seqs 8 --strategy ring --log "$T/r.jsonl" >"$T/rt.out" 2>&1
run_np 2 "$SEQPAR" eval --model "$M" --data recall --seq-len 256 --eval-seqs 8 --strategy ring --out "$T/r.json" >"$T/re.out" 2>&1
want=$(sed -nE 's/.*(recall accuracy by distance:.*)$/\1/p' "$T/rt.out")
got=$(grep -o 'recall accuracy by distance:.*' "$T/re.out")
if [ -n "$want" ] && [ "$want" = "$got" ] && grep -q '"recall_by_distance": \[{"from"' "$T/r.json"; then ok; else bad "recall: eval '$got', train '$want'"; fi

# ---- memory: eval's forward-only peak below a training step's at the same length (the activations
# of one layer instead of L + 1 layer inputs, no gradients, no optimizer state; at this size the
# MLP's chunk scratch, which both hold, is most of it)
timeout 120 "$SEQPAR" train --model "$M" --data "$T/text.txt" --seq-len $S --steps 1 --batch 1 --checkpoint layer --log "$T/m.jsonl" >"$T/m.out" 2>&1
train_peak=$(sed -nE 's/.*"peak_mem_bytes": ([0-9]+),.*/\1/p' "$T/m.jsonl" | head -n 1)
eval_peak=$(field "$T/one.json" peak_tracked_bytes_max)
if [ -n "$train_peak" ] && [ -n "$eval_peak" ] && [ "$eval_peak" -gt 0 ] && [ "$eval_peak" -lt "$train_peak" ]; then ok; else
    bad "peak memory: eval $eval_peak bytes, a training step $train_peak: $(tail -n 2 "$T/m.out")"; fi

# ---- bad input: one line on every rank, non-zero exit, no hang
rank_error() { # np words flags...
    local np=$1 words=$2
    shift 2
    local err rc n
    if [ "$np" = 1 ]; then err=$(timeout 60 "$SEQPAR" eval "$@" 2>&1 >/dev/null) # one process, no launcher
    else err=$(timeout 60 mpirun --oversubscribe -np "$np" "$SEQPAR" eval "$@" 2>&1 >/dev/null); fi
    rc=$?
    n=$(printf '%s\n' "$err" | grep -c "^seqpar: error: .*$words")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "error '$words' ($*): status $rc"; return; fi
    if [ "$n" -ne "$np" ]; then bad "error '$words' ($*): $n of $np ranks printed it: $(printf '%s' "$err" | head -n 3)"; return; fi
    if [ "$(printf '%s\n' "$err" | grep '^seqpar: error:' | sort -u | wc -l)" -ne 1 ]; then bad "error '$words' ($*): ranks printed different messages"; return; fi
    ok
}
rank_error 1 "--data is required" --model "$M" --seq-len 64
rank_error 2 "cannot open token file" --model "$M" --data "$T/missing.bin" --seq-len 64
rank_error 2 "fewer than one sequence of --seq-len 20000" --model "$M" --data "$T/text.txt" --seq-len 20000
rank_error 2 "past the 512 positions of the model" --model "$FIX/tiny_long" --data "$FIX/tiny_long/tokens.bin" --seq-len 600
rank_error 2 "vocab" --model "$FIX/tiny_long" --data "$T/text.txt" --seq-len 64 # bytes above its 64 ids
rank_error 4 "ulysses puts all 4 ranks in head parallelism" --model "$FIX/tiny_linear" --data "$FIX/tiny_linear/tokens.bin" --seq-len 48 --strategy ulysses
rank_error 1 "drop --zero" --model "$M" --data "$T/text.txt" --seq-len 64 --zero 1
rank_error 1 "--seq-len S is required" --model "$M" --data "$T/text.txt"
rank_error 1 "--pack splits token data" --model "$M" --data recall --seq-len 64 --pack --eot 10
rank_error 1 "cannot write .*no/such/dir" --model "$M" --data "$T/text.txt" --seq-len 64 --out "$T/no/such/dir/x.json"
rank_error 1 "--recall-pairs" --model "$M" --data "$T/text.txt" --seq-len 64 --recall-pairs 3

# ---- help
if "$SEQPAR" eval --help | grep -q -- '--eval-seqs' && "$SEQPAR" --help | grep -q '^  eval '; then ok; else bad "eval --help / seqpar --help"; fi

summary test_eval
