#!/usr/bin/env bash
# `seqpar sample` on several ranks (train/dist_generate.h): the prompt's prefill by every strategy's
# forward that the registry has (ring, ulysses, 2d, allgather, lightseq, wallfacer, fpdt) on 2, 3 and
# 4 ranks, prompts whose length no rank count divides (padded at their end), GQA with KV heads
# replicated (ulysses on more ranks than KV heads), sliding windows (a Mistral's, a Qwen2's on some
# layers), Qwen3's q/k norms; against one process (`seqpar sample` without mpirun, its own cache):
#   - greedy generations token for token identical over 64 new tokens;
#   - the prompt's logits (--prompt-logits) within 1e-5 of one process's (absolute; the logits here
#     reach 2.2 in size; largest difference seen 8.1e-7: the prefill's attention is the fp32 flash
#     kernel's, one process's a softmax accumulated in double);
#   - sampling (temperature, top-k, top-p, repetition penalty, the same seed) the same text;
#   - transformers' generate (the fixtures' generate.json) the same greedy tokens;
#   - the key/value cache on the largest rank at most 1/N of one rank's (plus the new tokens' share);
#   - a second prompt continuing the sharded cache (--continue-tokens), by pass-Q and by pass-KV: the
#     second turn's greedy tokens as one process's for the concatenated prompt, the bytes printed
#     are the bytes moved, a sampled second turn as one process's text;
#   - bad rank counts, --dp, an empty prompt, a prompt past the positions (with and without RoPE scaling),
#     a token outside the vocabulary: one line on every rank and a non-zero exit.
# fp32 (bf16: test_sample_bf16.sh). Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
mpi_test_env

# the greedy tokens of a fixture's generate.json as "a,b,c"
fixture_greedy() { sed -nE 's/.*"greedy": \[([^]]*)\].*/\1/p' "$1/generate.json" | tr -d ' '; }
fixture_prompt() { sed -nE 's/.*"prompt": \[([^]]*)\].*/\1/p' "$1/generate.json" | tr -d ' '; }

# ref NAME FIXTURE PROMPT NEW: one process's greedy ids and prompt logits
ref() {
    if timeout 60 "$SEQPAR" sample --model "$2" --prompt-tokens "$3" --temperature 0 --max-new-tokens "$4" --ids \
        --prompt-logits "$T/$1.f32" >"$T/$1.ids" 2>"$T/$1.err"; then ok; else bad "one process on $2: $(tail -n 1 "$T/$1.err")"; fi
}
# case NAME FIXTURE PROMPT NEW NP strategy flags...: the same ids, the logits within 1e-5
case_np() {
    local name=$1 fix=$2 prompt=$3 new=$4 np=$5
    shift 5
    if ! run_np "$np" "$SEQPAR" sample --model "$fix" --prompt-tokens "$prompt" --temperature 0 --max-new-tokens "$new" \
        --ids --prompt-logits "$T/d.f32" --strategy "$@" >"$T/d.ids" 2>"$T/d.err"; then
        bad "np $np --strategy $* on $fix: $(grep -v '^--' "$T/d.err" | tail -n 2)"; return; fi
    if cmp -s "$T/d.ids" "$T/$name.ids" && [ "$(tr ',' '\n' <"$T/d.ids" | wc -l)" -eq "$new" ]; then ok; else
        bad "np $np --strategy $* on $fix: $(cat "$T/d.ids"), one process $(cat "$T/$name.ids")"; fi
    local m
    m=$(f32_maxdiff "$T/d.f32" "$T/$name.f32")
    if awk -v m="$m" 'BEGIN { split(m, a, " "); exit !(a[3] > 0 && a[1] <= 1e-5) }'; then ok; else
        bad "np $np --strategy $* on $fix: prompt logits differ from one process's by $m (max diff, max size, count)"; fi
}

# ---- GQA (6 query heads, 2 KV), tied head: 13 prompt tokens, every strategy, 2 to 4 ranks
G="$FIX/tiny_gqa_tied"
PG=26,62,6,28,14,13,43,71,1,2,3,4,5
ref gqa "$G" $PG 64
for np in 2 3 4; do
    case_np gqa "$G" $PG 64 $np ring
    case_np gqa "$G" $PG 64 $np ulysses
    case_np gqa "$G" $PG 64 $np allgather
    case_np gqa "$G" $PG 64 $np fpdt
done
case_np gqa "$G" $PG 64 4 2d --hp 2 --cp 2
case_np gqa "$G" $PG 64 2 2d # neither --hp nor --cp: the context ring takes the ranks
case_np gqa "$G" $PG 64 2 lightseq
case_np gqa "$G" $PG 64 4 lightseq
case_np gqa "$G" $PG 64 2 wallfacer
case_np gqa "$G" $PG 64 4 wallfacer --team 2
case_np gqa "$G" $PG 64 4 fpdt --chunks 2
case_np gqa "$G" $PG 64 4 ring --ring-inner 2
case_np gqa "$G" $PG 64 3 ring --layout striped
case_np gqa "$G" $PG 64 4 2d --hp 2 --cp 2 --layout contiguous
case_np gqa "$G" $PG 64 1 ring
# one prompt token on 4 ranks: three shards start empty (their partials weigh nothing)
ref one "$G" 7 64
case_np one "$G" 7 64 4 ring

# ---- sliding windows: a Mistral (window 7, every layer; 4 query heads, 2 KV) with 19 prompt tokens,
# and a Qwen2 (window 9 on layers 1-2) with 21; the decode's window masks keys of other ranks too
W="$FIX/tiny_mistral_window"
PW=21,21,22,49,32,11,51,16,35,3,9,27,40,8,1,60,13,5,44
ref win "$W" $PW 64
case_np win "$W" $PW 64 3 ring
case_np win "$W" $PW 64 4 ulysses # 2 KV heads over 4 ranks: replicated
case_np win "$W" $PW 64 2 allgather
case_np win "$W" $PW 64 4 2d --hp 2 --cp 2
Q2="$FIX/tiny_qwen2_window"
PQ2=20,23,43,57,39,44,13,28,63,42,19,63,24,49,42,7,30,29,25,42,11
ref q2w "$Q2" $PQ2 64
case_np q2w "$Q2" $PQ2 64 4 ring
case_np q2w "$Q2" $PQ2 64 3 ulysses
# ---- Qwen3 (q/k norms, head_dim 16), 11 prompt tokens
Q3="$FIX/tiny_qwen3"
PQ3=8,31,20,50,48,18,50,7,9,1,2
ref q3 "$Q3" $PQ3 64
case_np q3 "$Q3" $PQ3 64 2 fpdt
case_np q3 "$Q3" $PQ3 64 2 lightseq
case_np q3 "$Q3" $PQ3 64 3 wallfacer

# ---- transformers' generate: the fixtures' greedy continuations on 3 ranks
for f in tiny_gqa_tied tiny_mistral_window tiny_llama3 tiny_bytes; do
    want=$(fixture_greedy "$FIX/$f")
    n=$(printf '%s\n' "$want" | tr ',' '\n' | wc -l)
    got=$(run_np 3 "$SEQPAR" sample --model "$FIX/$f" --prompt-tokens "$(fixture_prompt "$FIX/$f")" --temperature 0 \
        --max-new-tokens "$n" --ids --stop-token -1 --strategy ring 2>/dev/null)
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok; else bad "$f on 3 ranks: $got, transformers' generate $want"; fi
done

# ---- sampling: temperature, top-k, top-p and the repetition penalty with one seed, as one process
B="$FIX/tiny_bytes"
SMP=(--model "$B" --prompt "ROMEO: what light through yonder window" --max-new-tokens 64 --temperature 0.9 --top-k 30
     --top-p 0.9 --repetition-penalty 1.3 --seed 7 --stop-token -1)
one=$(timeout 60 "$SEQPAR" sample "${SMP[@]}" 2>/dev/null)
same_sample_on_ranks "sampling" "$one" "2 ring" "3 ulysses" "4 2d --hp 2 --cp 2"

# ---- the cache is sharded: on N ranks the largest rank's at most 1/N of one rank's, plus its share
# of the new tokens (one row each per layer) and the row a shard keeps free
long=$(head -c 600 README.md | tr -c 'A-Za-z .,' ' ')
cache_bytes() { sed -nE 's/.*key\/value cache ([0-9]+) bytes.*/\1/p' "$1"; }
for np in 1 2 4; do
    if [ "$np" = 1 ]; then
        timeout 60 "$SEQPAR" sample --model "$B" --prompt "$long" --max-new-tokens 8 --temperature 0 --strategy ring >"$T/c$np.out" 2>"$T/c$np.err"
    else
        run_np "$np" "$SEQPAR" sample --model "$B" --prompt "$long" --max-new-tokens 8 --temperature 0 --strategy ring >"$T/c$np.out" 2>"$T/c$np.err"
    fi
done
c1=$(cache_bytes "$T/c1.err") c2=$(cache_bytes "$T/c2.err") c4=$(cache_bytes "$T/c4.err")
# 600 prompt tokens, 8 new: rows per layer 1 rank 609, 2 ranks 300 + 5, 4 ranks 150 + 3
if [ -n "$c1" ] && [ -n "$c2" ] && [ -n "$c4" ] && [ $((c2 * 609)) -eq $((c1 * 305)) ] && [ $((c4 * 609)) -eq $((c1 * 153)) ]; then ok; else
    bad "cache bytes on 1, 2, 4 ranks: $c1, $c2, $c4 (rows 609, 305, 153 expected)"; fi
if cmp -s "$T/c1.out" "$T/c2.out" && cmp -s "$T/c1.out" "$T/c4.out"; then ok; else bad "600-token prompt: 1, 2, 4 ranks differ"; fi

# ---- a second prompt continuing the sharded cache (--continue-tokens): the block (the first turn's
# last token and the continuation, 7 and 11 tokens: no rank count divides them) runs by pass-Q and by
# pass-KV; the second turn's greedy tokens equal one process's given the prompt, the first turn's
# tokens and the continuation as one prompt, and one process's own --continue-tokens; the bytes moved
# (measured by the comm layer) equal the ones printed for the scheme
# cref NAME FIXTURE PROMPT CONT: one process's two turns, and the concatenated prompt's generation
cref() {
    timeout 60 "$SEQPAR" sample --model "$2" --prompt-tokens "$3" --temperature 0 --max-new-tokens 32 --ids --stop-token -1 \
        --continue-tokens "$4" --prompt-logits "$T/$1.cf32" >"$T/$1.c2" 2>/dev/null
    timeout 60 "$SEQPAR" sample --model "$2" --prompt-tokens "$3,$(head -n 1 "$T/$1.c2"),$4" --temperature 0 \
        --max-new-tokens 32 --ids --stop-token -1 >"$T/$1.cat" 2>/dev/null
    if [ "$(sed -n 2p "$T/$1.c2")" = "$(cat "$T/$1.cat")" ] && [ "$(tr ',' '\n' <"$T/$1.cat" | wc -l)" -eq 32 ]; then ok; else
        bad "one process on $2: second turn $(sed -n 2p "$T/$1.c2"), the concatenated prompt's $(cat "$T/$1.cat")"; fi
}
# ccase NAME FIXTURE PROMPT CONT NP strategy flags...: both schemes as one process: the same tokens,
# the logits of the prompt and of the block within 1e-5 of one process's, and the same bits by both
ccase() {
    local name=$1 fix=$2 prompt=$3 cont=$4 np=$5 sch
    shift 5
    for sch in pass-q pass-kv; do
        if ! run_np "$np" "$SEQPAR" sample --model "$fix" --prompt-tokens "$prompt" --temperature 0 --max-new-tokens 32 --ids \
            --stop-token -1 --continue-tokens "$cont" --continue-scheme $sch --prompt-logits "$T/d-$sch.f32" --strategy "$@" \
            >"$T/d.c2" 2>"$T/d.err"; then
            bad "np $np $sch --strategy $* on $fix: $(grep -v '^--' "$T/d.err" | tail -n 2)"; continue; fi
        if cmp -s "$T/d.c2" "$T/$name.c2"; then ok; else
            bad "np $np $sch --strategy $* on $fix: $(tr '\n' ' ' <"$T/d.c2"), one process $(tr '\n' ' ' <"$T/$name.c2")"; fi
        local said moved
        said=$(sed -nE 's/.*continue: [0-9]+ new tokens after [0-9]+ cached: [^ ]+ \(([0-9.]+) MB\).*/\1/p' "$T/d.err")
        moved=$(sed -nE 's/.*continue: [0-9]+ tokens by .* s, ([0-9.]+) MB moved.*/\1/p' "$T/d.err")
        if [ -n "$said" ] && [ "$said" = "$moved" ]; then ok; else bad "np $np $sch --strategy $*: printed $said MB, moved $moved MB"; fi
        local m
        m=$(f32_maxdiff "$T/d-$sch.f32" "$T/$name.cf32")
        if awk -v m="$m" 'BEGIN { split(m, a, " "); exit !(a[3] > 0 && a[1] <= 1e-5) }'; then ok; else
            bad "np $np $sch --strategy $* on $fix: logits differ from one process's by $m (max diff, max size, count)"; fi
    done
    if cmp -s "$T/d-pass-q.f32" "$T/d-pass-kv.f32"; then ok; else bad "np $np --strategy $* on $fix: pass-Q's logits are not pass-KV's"; fi
}
C6=9,17,33,2,40,5
cref gc "$G" $PG $C6
for np in 2 3 4; do ccase gc "$G" $PG $C6 $np ring; done
ccase gc "$G" $PG $C6 3 ulysses
ccase gc "$G" $PG $C6 4 2d --hp 2 --cp 2
ccase gc "$G" $PG $C6 2 lightseq
ccase gc "$G" $PG $C6 4 lightseq
C10=7,7,30,12,55,1,19,8,26,41
cref wc "$W" $PW $C10
ccase wc "$W" $PW $C10 3 ring
ccase wc "$W" $PW $C10 4 ulysses # 2 KV heads over 4 ranks: replicated
ccase wc "$W" $PW $C10 2 2d
# sampling through a second turn (text, temperature, top-k, repetition penalty): one process's text
SC=(--model "$B" --prompt "ROMEO: what light" --max-new-tokens 40 --temperature 0.9 --top-k 30 --repetition-penalty 1.2
    --seed 3 --stop-token -1 --continue-prompt "
JULIET: o Romeo, wherefore")
one=$(timeout 60 "$SEQPAR" sample "${SC[@]}" 2>/dev/null)
for c in "4 pass-q ulysses" "3 pass-kv ring" "2 auto lightseq"; do
    set -- $c
    got=$(run_np "$1" "$SEQPAR" sample "${SC[@]}" --continue-scheme "$2" --strategy "$3" 2>/dev/null)
    if [ ${#one} -gt 100 ] && [ "$got" = "$one" ]; then ok; else bad "a sampled second turn on $1 ranks ($2, $3): '$got', one process '$one'"; fi
done

# ---- refusals: one line on every rank, a non-zero exit
refuse() { # name pattern np args...
    local name=$1 pat=$2 np=$3
    shift 3
    run_np "$np" "$SEQPAR" sample "$@" >"$T/r.out" 2>&1
    local rc=$? lines
    lines=$(grep -c "^seqpar: error: .*$pat" "$T/r.out")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$lines" -eq "$np" ]; then ok; else bad "$name: status $rc, $lines lines: $(head -n 3 "$T/r.out")"; fi
}
refuse "ulysses on more ranks than heads" "heads" 3 --model "$FIX/tiny_llama3" --prompt-tokens 1,2,3 --strategy ulysses
refuse "2d --hp 1 on 2 ranks" "give --hp and --cp" 2 --model "$G" --prompt-tokens 1,2,3 --strategy 2d --hp 1
refuse "--dp 2" "drop --dp" 2 --model "$G" --prompt-tokens 1,2,3 --strategy ring --dp 2
refuse "a token outside the vocabulary" "outside the vocabulary" 2 --model "$G" --prompt-tokens 1,2,99 --strategy ring
refuse "an empty prompt" "give at least one character" 2 --model "$B" --prompt "" --strategy ring
refuse "an empty continuation" "continue-prompt is empty" 2 --model "$B" --prompt "a" --continue-prompt "" --strategy ring
refuse "a continuation outside the vocabulary" "continuation token 99 is outside" 2 --model "$G" --prompt-tokens 1,2 \
    --continue-tokens 3,99 --strategy ring
refuse "an unknown scheme" "continue-scheme 'pass-x'.*auto, pass-q or pass-kv" 2 --model "$G" --prompt-tokens 1,2 \
    --continue-tokens 3 --continue-scheme pass-x --strategy ring
refuse "a continuation past the positions" "reach past the 512 positions" 2 --model "$G" --prompt-tokens 1,2 \
    --max-new-tokens 500 --continue-tokens "$(seq -s, 1 20 | sed -E 's/[0-9]+/1/g')" --strategy ring
refuse "a prompt past the positions" "past the 512 positions.*give a prompt of at most 512" 2 --model "$G" \
    --prompt-tokens "$(seq -s, 1 513 | sed -E 's/[0-9]+/1/g')" --strategy ring
refuse "a prompt past the scaled positions" "past the 512 positions.*llama3 RoPE scaling by 8 included" 3 \
    --model "$FIX/tiny_llama3" --prompt-tokens "$(seq -s, 1 600 | sed -E 's/[0-9]+/2/g')" --strategy ring
summary test_sample_dist
