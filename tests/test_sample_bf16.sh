#!/usr/bin/env bash
# `seqpar sample --precision bf16` (docs/sampling.md, docs/bf16.md): train's bf16 forward in one process
# and on ranks, the key/value cache in bf16 in both. Against one process, both bf16:
#   - greedy generations token for token identical over 64 new tokens, for ring, ulysses, 2d,
#     allgather, lightseq, wallfacer and fpdt on 2, 3 and 4 ranks (GQA, KV heads replicated, a Mistral's
#     window, Qwen3's q/k norms; prompts no rank count divides);
#   - the prompt's logits within 2e-2 (absolute; logits up to 2.2 here) and not within 1e-4 of fp32's. Most runs give one process's
#     bits; the rest differ where the prefill's fp32 flash kernel (one process: a softmax in double)
#     sums in another order and that flips a bf16 rounding of o, h or a normed input: at most 6.7e-3
#     seen (tiny_qwen3 on 2 ranks);
#   - bf16 is in force: its logits differ from fp32's (by more than 1e-4), every operand the model
#     marks as bf16 is one (SEQPAR_CHECK_ROUNDED=1);
#   - the cache on 1 and 4 ranks is half fp32's bytes;
#   - a second turn by pass-Q and by pass-KV (the cache moves as bf16 words): one process's tokens, the
#     two schemes' logits the same bits, the bytes printed the bytes moved;
#   - sampling (temperature, top-k, top-p, repetition penalty, one seed): one process's text;
#   - on the conversion path (SEQPAR_ISA=avx2, as a CPU without AVX512_BF16 runs train's bf16): no
#     refusal, 3 ranks give one process's tokens there too.
# Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
mpi_test_env

# within FILE_A FILE_B BOUND: the files' largest difference is at most BOUND (and they are not empty)
within() { awk -v m="$(f32_maxdiff "$1" "$2")" -v b="$3" 'BEGIN { split(m, a, " "); exit !(a[3] > 0 && a[1] <= b) }'; }

# ref NAME FIXTURE PROMPT: one process's bf16 greedy ids (64) and prompt logits, every marked operand checked
ref() {
    if SEQPAR_CHECK_ROUNDED=1 timeout 60 "$SEQPAR" sample --model "$2" --prompt-tokens "$3" --temperature 0 \
        --max-new-tokens 64 --stop-token -1 --ids --precision bf16 --prompt-logits "$T/$1.f32" >"$T/$1.ids" 2>"$T/$1.err" &&
        [ "$(tr ',' '\n' <"$T/$1.ids" | wc -l)" -eq 64 ]; then ok; else bad "one process bf16 on $2: $(tail -n 1 "$T/$1.err")"; fi
    # fp32's logits, to see that bf16 changed them
    timeout 60 "$SEQPAR" sample --model "$2" --prompt-tokens "$3" --temperature 0 --max-new-tokens 1 --ids \
        --prompt-logits "$T/$1.fp32" >/dev/null 2>&1
    if ! within "$T/$1.f32" "$T/$1.fp32" 1e-4 && within "$T/$1.f32" "$T/$1.fp32" 0.1; then ok; else
        bad "bf16 against fp32 on $2: $(f32_maxdiff "$T/$1.f32" "$T/$1.fp32") (max diff, max size, count), expected above 1e-4"; fi
}
# case_np NAME FIXTURE PROMPT NP strategy flags...: the same ids, the logits within 2e-2
case_np() {
    local name=$1 fix=$2 prompt=$3 np=$4
    shift 4
    if ! SEQPAR_CHECK_ROUNDED=1 run_np "$np" "$SEQPAR" sample --model "$fix" --prompt-tokens "$prompt" --temperature 0 \
        --max-new-tokens 64 --stop-token -1 --ids --precision bf16 --prompt-logits "$T/d.f32" --strategy "$@" \
        >"$T/d.ids" 2>"$T/d.err"; then
        bad "bf16 np $np --strategy $* on $fix: $(grep -v '^--' "$T/d.err" | tail -n 2)"; return; fi
    if cmp -s "$T/d.ids" "$T/$name.ids"; then ok; else
        bad "bf16 np $np --strategy $* on $fix: $(cat "$T/d.ids"), one process $(cat "$T/$name.ids")"; fi
    if within "$T/d.f32" "$T/$name.f32" 2e-2 && ! within "$T/d.f32" "$T/$name.fp32" 1e-4; then ok; else
        bad "bf16 np $np --strategy $* on $fix: prompt logits differ from one process's bf16 by $(f32_maxdiff "$T/d.f32" \
            "$T/$name.f32"), from its fp32 by $(f32_maxdiff "$T/d.f32" "$T/$name.fp32") (max diff, max size, count)"; fi
}

G="$FIX/tiny_gqa_tied" # 6 query heads, 2 KV
PG=26,62,6,28,14,13,43,71,1,2,3,4,5
W="$FIX/tiny_mistral_window" # window 7 on every layer
PW=21,21,22,49,32,11,51,16,35,3,9,27,40,8,1,60,13,5,44
Q3="$FIX/tiny_qwen3"
PQ3=8,31,20,50,48,18,50,7,9,1,2
ref gqa "$G" $PG
ref win "$W" $PW
ref q3 "$Q3" $PQ3
case_np gqa "$G" $PG 2 ring
case_np gqa "$G" $PG 3 ulysses
case_np gqa "$G" $PG 4 2d --hp 2 --cp 2
case_np gqa "$G" $PG 3 allgather
case_np gqa "$G" $PG 4 fpdt
case_np win "$W" $PW 3 ring
case_np win "$W" $PW 4 ulysses # 2 KV heads over 4 ranks: replicated
case_np win "$W" $PW 2 2d
case_np win "$W" $PW 2 lightseq
case_np win "$W" $PW 4 wallfacer --team 2
case_np q3 "$Q3" $PQ3 2 ring
case_np q3 "$Q3" $PQ3 4 2d --hp 2 --cp 2

# ---- a CPU without AVX512_BF16 (SEQPAR_ISA=avx2: train's conversion path, fp32 sgemm on bf16 values):
# no refusal, as train's; ranks against one process on that path alike
SEQPAR_ISA=avx2 timeout 60 "$SEQPAR" sample --model "$W" --prompt-tokens $PW --temperature 0 --max-new-tokens 64 \
    --stop-token -1 --ids --precision bf16 --prompt-logits "$T/cv.f32" >"$T/cv.ids" 2>"$T/cv.err"
SEQPAR_ISA=avx2 run_np 3 "$SEQPAR" sample --model "$W" --prompt-tokens $PW --temperature 0 --max-new-tokens 64 \
    --stop-token -1 --ids --precision bf16 --prompt-logits "$T/cv3.f32" --strategy ring >"$T/cv3.ids" 2>"$T/cv3.err"
if grep -q "bf16 path: convert" "$T/cv.err" && grep -q "bf16 path: convert" "$T/cv3.err" && cmp -s "$T/cv.ids" "$T/cv3.ids" &&
    [ "$(tr ',' '\n' <"$T/cv.ids" | wc -l)" -eq 64 ] && within "$T/cv3.f32" "$T/cv.f32" 2e-2; then ok; else
    bad "the conversion path: $(tail -n 1 "$T/cv3.err"), $(cat "$T/cv3.ids") against $(cat "$T/cv.ids")"; fi

# ---- the cache in bf16: half fp32's bytes on 1 and on 4 ranks
B="$FIX/tiny_bytes"
cache_bytes() { sed -nE 's/.*key\/value cache ([0-9]+) bytes.*/\1/p' "$1"; }
for p in fp32 bf16; do
    timeout 60 "$SEQPAR" sample --model "$B" --prompt "ROMEO: what light" --max-new-tokens 8 --temperature 0 \
        --precision $p --strategy ring >/dev/null 2>"$T/c1$p.err"
    run_np 4 "$SEQPAR" sample --model "$B" --prompt "ROMEO: what light" --max-new-tokens 8 --temperature 0 \
        --precision $p --strategy ring >/dev/null 2>"$T/c4$p.err"
done
a=$(cache_bytes "$T/c1fp32.err") b=$(cache_bytes "$T/c1bf16.err") c=$(cache_bytes "$T/c4fp32.err") d=$(cache_bytes "$T/c4bf16.err")
if [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ] && [ -n "$d" ] && [ $((a)) -eq $((2 * b)) ] && [ $((c)) -eq $((2 * d)) ]; then ok; else
    bad "cache bytes fp32/bf16 on 1 rank $a/$b, on 4 ranks $c/$d: bf16 should be half"; fi

# ---- a second turn on the bf16 cache: one process's tokens by both schemes, the same logits
C10=7,7,30,12,55,1,19,8,26,41
timeout 60 "$SEQPAR" sample --model "$W" --prompt-tokens $PW --temperature 0 --max-new-tokens 32 --ids --stop-token -1 \
    --continue-tokens $C10 --precision bf16 >"$T/wc.c2" 2>/dev/null
for c in "3 ring" "4 ulysses"; do
    set -- $c
    for sch in pass-q pass-kv; do
        run_np "$1" "$SEQPAR" sample --model "$W" --prompt-tokens $PW --temperature 0 --max-new-tokens 32 --ids \
            --stop-token -1 --continue-tokens $C10 --continue-scheme $sch --precision bf16 --prompt-logits "$T/c-$sch.f32" \
            --strategy "$2" >"$T/d.c2" 2>"$T/d.err"
        if [ "$(wc -l <"$T/wc.c2")" -eq 2 ] && cmp -s "$T/d.c2" "$T/wc.c2"; then ok; else
            bad "bf16 second turn on $1 ranks ($2, $sch): $(tr '\n' ' ' <"$T/d.c2"), one process $(tr '\n' ' ' <"$T/wc.c2")"; fi
        said=$(sed -nE 's/.*continue: [0-9]+ new tokens after [0-9]+ cached: [^ ]+ \(([0-9.]+) MB\).*/\1/p' "$T/d.err")
        moved=$(sed -nE 's/.*continue: [0-9]+ tokens by .* s, ([0-9.]+) MB moved.*/\1/p' "$T/d.err")
        if [ -n "$said" ] && [ "$said" = "$moved" ]; then ok; else bad "bf16 $1 ranks $sch: printed $said MB, moved $moved MB"; fi
    done
    if cmp -s "$T/c-pass-q.f32" "$T/c-pass-kv.f32"; then ok; else bad "bf16 $1 ranks ($2): pass-Q's logits are not pass-KV's"; fi
done

# ---- sampling: one process's text on 2 and 4 ranks
SMP=(--model "$B" --prompt "ROMEO: what light through yonder window" --max-new-tokens 64 --temperature 0.9 --top-k 30
     --top-p 0.9 --repetition-penalty 1.3 --seed 7 --stop-token -1 --precision bf16)
one=$(timeout 60 "$SEQPAR" sample "${SMP[@]}" 2>/dev/null)
same_sample_on_ranks "bf16 sampling" "$one" "2 ring" "4 2d --hp 2 --cp 2"

# ---- a bad precision: one line on every rank, a non-zero exit
run_np 2 "$SEQPAR" sample --model "$G" --prompt-tokens 1,2 --precision fp16 --strategy ring >"$T/r.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^seqpar: error: .*--precision expects fp32 or bf16' "$T/r.out")" -eq 2 ]; then ok; else
    bad "--precision fp16: status $rc: $(head -n 3 "$T/r.out")"; fi
summary test_sample_bf16
