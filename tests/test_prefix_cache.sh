#!/usr/bin/env bash
# `seqpar sample --prefix-cache DIR` (train/prefix_cache.h), `--prefill-block N` and pass-KV under a
# sliding window, against one process (`seqpar sample` without mpirun, its own cache, on the whole
# prompt):
#   - a run on 3 ranks saves its prompt's shards and a manifest; a later run whose prompt continues
#     the cached one loads them, prefills only the new tokens (by pass-Q and by pass-KV: the same
#     bits), and generates one process's 64 greedy tokens, its new prompt rows' logits within 1e-5;
#   - without a window (a GQA model), by ring on 3 ranks, ulysses on 2 and 2d on 2 x 2, alike;
#   - the same prompt again reuses all but its last token and keeps the cache as it is; a prompt that
#     differs at token 5 reuses those 5 and replaces the cache; one that differs at its first token
#     prefills from scratch; each says so, and generates one process's tokens;
#   - one process (no --strategy) saves and reuses its own cache alike;
#   - another rank count, another strategy, another model, a damaged or missing shard, a damaged
#     manifest, a file for DIR: one line naming the problem on every rank and a non-zero exit;
#   - a block after a cache run 4 (or 3) tokens at a time: the same bits as one block, the bytes
#     printed the bytes moved;
#   - pass-KV under a Mistral's window of 7: the bytes printed are the formula's with 6 cached rows a
#     layer (not the whole cache), and the bytes moved;
#   - --precision bf16: a cache of bf16 words saved on 2 ranks and continued by both schemes gives
#     one bf16 process's tokens; its shards hold 2 bytes a value; a fp32 run on it is refused.
# Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
mpi_test_env

close_enough() { awk -v m="$1" 'BEGIN { split(m, a, " "); exit !(a[3] > 0 && a[1] <= 1e-5) }'; }

W="$FIX/tiny_mistral_window" # window 7 on both layers; 4 query heads, 2 KV heads of 8; vocab 61
P1=21,21,22,49,32,11,51,16,35,3,9,27,40,8,1,60,13,5,44             # 19 tokens
P2=$P1,7,7,30,12,55,1,19,8,26,41                                   # it continued: 29 tokens
P3=21,21,22,49,32,12,51,16,35,3,9,27,40,8,1,60,13,5,44,2,3         # differs at token 5
P4=2,21,22,49,32,11,51,16,35,3,9,27,40,8,1,60,13,5,44              # differs at token 0
V=61
S=(sample --model "$W" --temperature 0 --max-new-tokens 64 --ids --stop-token -1)
# one process on the whole prompt: greedy ids and every prompt row's logits
for n in 1 2 3 4; do
    eval "p=\$P$n"
    timeout 60 "$SEQPAR" "${S[@]}" --prompt-tokens "$p" --prompt-logits "$T/ref$n.f32" >"$T/ref$n.ids" 2>"$T/ref.err" ||
        bad "one process on prompt $n: status $?: $(tail -n 3 "$T/ref.err")"
done
# the rows of a logits file from row R on (vocabulary $4, else V's)
rows_from() { tail -c +$(($2 * ${4:-$V} * 4 + 1)) "$1" >"$3"; }

D="$T/cache"
# ---- an empty DIR: the prompt prefilled and saved (3 shards, a manifest)
if run_np 3 "$SEQPAR" "${S[@]}" --prompt-tokens "$P1" --strategy ring --prefix-cache "$D" >"$T/a.ids" 2>"$T/a.err" &&
    grep -q "prefix cache $D: empty: prefilled the prompt's 19 tokens; saved" "$T/a.err" &&
    [ "$(ls "$D"/kv-*-of-3.bin | wc -l)" -eq 3 ] && grep -q '^tokens 19$' "$D/manifest.txt" &&
    cmp -s "$T/a.ids" "$T/ref1.ids"; then ok; else bad "saving a cache: $(grep -v '^--' "$T/a.err" | tail -n 2)"; fi
cp -r "$D" "$T/saved"

# ---- a prompt continuing the cached one, by both schemes: one process's tokens, the new rows' logits
rows_from "$T/ref2.f32" 19 "$T/ref2.tail"
for sch in pass-q pass-kv; do
    rm -rf "$D" && cp -r "$T/saved" "$D"
    if ! run_np 3 "$SEQPAR" "${S[@]}" --prompt-tokens "$P2" --strategy ring --prefix-cache "$D" --continue-scheme $sch \
        --prompt-logits "$T/h-$sch.f32" >"$T/h.ids" 2>"$T/h.err"; then bad "$sch hit: $(grep -v '^--' "$T/h.err" | tail -n 2)"; continue; fi
    name=${sch/pass-q/pass-Q}
    if grep -q "the prompt continues the cached 19 tokens: reused their cache, prefilled the 10 new ones" "$T/h.err" &&
        grep -q "prefix cache: 10 new prompt tokens after 19 cached: ${name/pass-kv/pass-KV} " "$T/h.err"; then ok
    else bad "$sch hit: $(grep 'prefix cache' "$T/h.err")"; fi
    if cmp -s "$T/h.ids" "$T/ref2.ids" && [ "$(tr ',' '\n' <"$T/h.ids" | wc -l)" -eq 64 ]; then ok; else
        bad "$sch hit: $(cat "$T/h.ids"), one process $(cat "$T/ref2.ids")"; fi
    m=$(f32_maxdiff "$T/h-$sch.f32" "$T/ref2.tail")
    if close_enough "$m" && [ "$(wc -c <"$T/h-$sch.f32")" -eq $((10 * V * 4)) ]; then ok; else
        bad "$sch hit: logits of the new prompt rows differ from one process's by $m (largest difference, largest value, values)"; fi
done
if cmp -s "$T/h-pass-q.f32" "$T/h-pass-kv.f32"; then ok; else bad "a cache hit: pass-Q's logits are not pass-KV's"; fi
if grep -q '^tokens 29$' "$D/manifest.txt" && [ "$(ls "$D" | wc -l)" -eq 4 ]; then ok; else
    bad "after a hit the cache holds the 29-token prompt in 3 shards: $(ls "$D")"; fi

# ---- no window (every cached row in reach of every new token): GQA (6 query heads, 2 KV) by ring on
# 3 ranks, ulysses on 2, 2d on 2 x 2, each with its own cache: one process's tokens and new rows' logits
G="$FIX/tiny_gqa_tied"
GP1=26,62,6,28,14,13,43,71,1,2,3,4,5
GP2=$GP1,9,17,33,2,40,5,6
GS=(sample --model "$G" --temperature 0 --max-new-tokens 64 --ids --stop-token -1)
timeout 60 "$SEQPAR" "${GS[@]}" --prompt-tokens "$GP2" --prompt-logits "$T/gref.f32" >"$T/gref.ids" 2>/dev/null
rows_from "$T/gref.f32" 13 "$T/gref.tail" 73
for c in "3 ring" "2 ulysses" "4 2d --hp 2 --cp 2"; do
    set -- $c
    np=$1
    shift
    run_np "$np" "$SEQPAR" "${GS[@]}" --prompt-tokens "$GP1" --strategy "$@" --prefix-cache "$T/c-$1" >/dev/null 2>&1
    if run_np "$np" "$SEQPAR" "${GS[@]}" --prompt-tokens "$GP2" --strategy "$@" --prefix-cache "$T/c-$1" \
        --prompt-logits "$T/c.f32" >"$T/c.ids" 2>"$T/c.err" && grep -q "continues the cached 13 tokens" "$T/c.err" &&
        cmp -s "$T/c.ids" "$T/gref.ids"; then ok; else
        bad "a cache hit on $np ranks ($*): $(grep -v '^--' "$T/c.err" | tail -n 2)"; fi
    m=$(f32_maxdiff "$T/c.f32" "$T/gref.tail")
    if close_enough "$m"; then ok; else bad "a cache hit on $np ranks ($*): new rows' logits differ from one process's by $m"; fi
done

# ---- the same prompt again: all but its last token reused, the cache kept as it is
cp "$D/manifest.txt" "$T/m.before"
if run_np 3 "$SEQPAR" "${S[@]}" --prompt-tokens "$P2" --strategy ring --prefix-cache "$D" >"$T/s.ids" 2>"$T/s.err" &&
    grep -q "the prompt is all the cached prompt's 29 tokens: reused the cache of 28, ran the last one again (loaded in [0-9.]* s); the cache kept" "$T/s.err" &&
    cmp -s "$T/s.ids" "$T/ref2.ids" && cmp -s "$D/manifest.txt" "$T/m.before"; then ok; else
    bad "the same prompt: $(grep -v '^--' "$T/s.err" | tail -n 2)"; fi
# ---- a prompt differing at token 5: those 5 reused, the cache replaced; at token 0: from scratch
if run_np 3 "$SEQPAR" "${S[@]}" --prompt-tokens "$P3" --strategy ring --prefix-cache "$D" >"$T/d.ids" 2>"$T/d.err" &&
    grep -q "differs from the cached prompt (29 tokens) at token 5: reused the cache of the 5 before it, prefilled the other 16 (loaded in [0-9.]* s); saved" "$T/d.err" &&
    cmp -s "$T/d.ids" "$T/ref3.ids" && grep -q '^tokens 21$' "$D/manifest.txt" && [ "$(ls "$D" | wc -l)" -eq 4 ]; then ok; else
    bad "a prompt differing at token 5: $(grep -v '^--' "$T/d.err" | tail -n 2)"; fi
if run_np 3 "$SEQPAR" "${S[@]}" --prompt-tokens "$P4" --strategy ring --prefix-cache "$D" >"$T/z.ids" 2>"$T/z.err" &&
    grep -q "at its first token: prefilled all 19 from scratch; saved" "$T/z.err" && cmp -s "$T/z.ids" "$T/ref4.ids"; then ok; else
    bad "a prompt differing at token 0: $(grep -v '^--' "$T/z.err" | tail -n 2)"; fi

# ---- one process: its own cache saved and reused
O="$T/one"
timeout 60 "$SEQPAR" "${S[@]}" --prompt-tokens "$P1" --prefix-cache "$O" >/dev/null 2>"$T/o1.err"
if timeout 60 "$SEQPAR" "${S[@]}" --prompt-tokens "$P2" --prefix-cache "$O" --prefill-block 4 --prompt-logits "$T/o.f32" \
    >"$T/o.ids" 2>"$T/o.err" && grep -q "continues the cached 19 tokens" "$T/o.err" && cmp -s "$T/o.ids" "$T/ref2.ids" &&
    grep -q '^strategy none$' "$O/manifest.txt"; then ok; else bad "one process's cache: $(tail -n 2 "$T/o.err")"; fi
m=$(f32_maxdiff "$T/o.f32" "$T/ref2.tail")
if close_enough "$m"; then ok; else bad "one process's cache hit: logits differ by $m"; fi

# ---- refusals: one line on every rank, a non-zero exit
refuse() { # name pattern np args...
    local name=$1 pat=$2 np=$3
    shift 3
    run_np "$np" "$SEQPAR" "${S[@]}" "$@" >"$T/r.out" 2>&1
    local rc=$? lines
    lines=$(grep -c "^seqpar: error: .*$pat" "$T/r.out")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$lines" -eq "$np" ]; then ok; else bad "$name: status $rc, $lines lines: $(head -n 3 "$T/r.out")"; fi
}
rm -rf "$D" && cp -r "$T/saved" "$D"
refuse "another rank count" "was made by --strategy ring on 3 ranks, this run is --strategy ring on 2 ranks: run as it was made" 2 \
    --prompt-tokens "$P2" --strategy ring --prefix-cache "$D"
refuse "another strategy" "was made by --strategy ring on 3 ranks, this run is --strategy allgather on 3" 3 \
    --prompt-tokens "$P2" --strategy allgather --prefix-cache "$D"
refuse "one process's cache on ranks" "was made by one process without --strategy" 2 --prompt-tokens "$P2" --strategy ring \
    --prefix-cache "$O"
refuse "another model" "holds the cache of another model" 3 --model "$FIX/tiny_gqa_tied" --prompt-tokens 1,2,3 --strategy ring \
    --prefix-cache "$D"
f=$(ls "$D"/kv-*-1-of-3.bin)
printf '\x7f' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
refuse "a damaged shard" "rank 1's shard kv-.* is damaged (its checksum does not match): remove the directory" 3 \
    --prompt-tokens "$P2" --strategy ring --prefix-cache "$D"
rm -rf "$D" && cp -r "$T/saved" "$D"
rm "$D"/kv-*-2-of-3.bin
refuse "a missing shard" "rank 2's shard kv-.* cannot be read" 3 --prompt-tokens "$P2" --strategy ring --prefix-cache "$D"
rm -rf "$D" && cp -r "$T/saved" "$D"
sed -i 's/^ids 21,21,/ids 21,22,/' "$D/manifest.txt"
refuse "a damaged manifest" "manifest.txt is damaged (its checksum does not match its text)" 3 --prompt-tokens "$P2" \
    --strategy ring --prefix-cache "$D"
refuse "a file for DIR" "is not a directory" 2 --prompt-tokens "$P2" --strategy ring --prefix-cache "$W/config.json"

# ---- blocks: a cached prompt's rest and a second turn 4 (3) tokens at a time: the same bits as one
# block, the bytes printed the bytes moved
rm -rf "$D" && cp -r "$T/saved" "$D"
if run_np 3 "$SEQPAR" "${S[@]}" --prompt-tokens "$P2" --strategy ring --prefix-cache "$D" --continue-scheme pass-kv \
    --prefill-block 3 --prompt-logits "$T/b3.f32" >"$T/b3.ids" 2>"$T/b3.err" && cmp -s "$T/b3.f32" "$T/h-pass-kv.f32" &&
    cmp -s "$T/b3.ids" "$T/ref2.ids"; then ok; else bad "a cache hit in blocks of 3: not one block's bits"; fi
C=(--max-new-tokens 24 --continue-tokens 7,7,30,12,55,1,19,8,26,41,3,9,27)
for sch in pass-q pass-kv; do
    run_np 3 "$SEQPAR" "${S[@]}" "${C[@]}" --prompt-tokens "$P1" --strategy ring --continue-scheme $sch \
        --prompt-logits "$T/one-$sch.f32" >"$T/one-$sch.ids" 2>"$T/one-$sch.err"
    run_np 3 "$SEQPAR" "${S[@]}" "${C[@]}" --prompt-tokens "$P1" --strategy ring --continue-scheme $sch --prefill-block 4 \
        --prompt-logits "$T/blk-$sch.f32" >"$T/blk-$sch.ids" 2>"$T/blk-$sch.err"
    if cmp -s "$T/one-$sch.f32" "$T/blk-$sch.f32" && cmp -s "$T/one-$sch.ids" "$T/blk-$sch.ids" &&
        [ "$(wc -l <"$T/blk-$sch.ids")" -eq 2 ] && grep -q "in 4 blocks of at most 4" "$T/blk-$sch.err"; then ok; else
        bad "a second turn by $sch in blocks of 4: not one block's bits ($(grep continue: "$T/blk-$sch.err" | head -n 1))"; fi
    said=$(sed -nE 's/.*continue: [0-9]+ new tokens after [0-9]+ cached: [^ ]+ \(([0-9.]+) MB\).*/\1/p' "$T/blk-$sch.err")
    moved=$(sed -nE 's/.*continue: [0-9]+ tokens by .* s, ([0-9.]+) MB moved.*/\1/p' "$T/blk-$sch.err")
    if [ -n "$said" ] && [ "$said" = "$moved" ]; then ok; else bad "$sch in blocks: printed $said MB, moved $moved MB"; fi
done

# ---- pass-KV under the window: 14 new tokens after 19 + 23 = 42 cached on 3 ranks, window 7: 6
# cached rows a layer sent, (N - 1) L (6 (2 Hkv d 4 + 4) + T H d 4) bytes
want=$(awk 'BEGIN { N = 3; L = 2; Hkv = 2; d = 8; H = 4; T = 14; printf "%.3f", (N - 1) * L * (6 * (2 * Hkv * d * 4 + 4) + T * H * d * 4) / 1e6 }')
said=$(sed -nE 's/.*continue: 14 new tokens after 42 cached: pass-KV \(([0-9.]+) MB\).*/\1/p' "$T/one-pass-kv.err")
if [ "$said" = "$want" ]; then ok; else bad "pass-KV under a window of 7: printed ${said:-nothing} MB, the window's rows give $want MB"; fi
# ---- bf16 (--precision bf16: the cache kept as bf16 words, dtype bf16 in the manifest): a cache
# saved on 2 ranks and continued by pass-Q and pass-KV, one bf16 process's 64 greedy tokens on the
# whole prompt; the shard files half the fp32 ones' value bytes; a fp32 run on the bf16 cache refused
B16=(--precision bf16)
timeout 60 "$SEQPAR" "${GS[@]}" "${B16[@]}" --prompt-tokens "$GP2" >"$T/b16ref.ids" 2>"$T/b16.err" ||
    bad "one bf16 process on the whole prompt: $(tail -n 2 "$T/b16.err")"
DB="$T/cache16"
if run_np 2 "$SEQPAR" "${GS[@]}" "${B16[@]}" --prompt-tokens "$GP1" --strategy ring --prefix-cache "$DB" \
        >"$T/b16a.ids" 2>"$T/b16a.err" && grep -q '^dtype bf16$' "$DB/manifest.txt"; then ok
else bad "saving a bf16 cache: $(grep -v '^--' "$T/b16a.err" | tail -n 2)"; fi
cp -r "$DB" "$T/saved16"
for sch in pass-q pass-kv; do
    rm -rf "$DB" && cp -r "$T/saved16" "$DB"
    if run_np 2 "$SEQPAR" "${GS[@]}" "${B16[@]}" --prompt-tokens "$GP2" --strategy ring --prefix-cache "$DB" \
            --continue-scheme $sch >"$T/b16h.ids" 2>"$T/b16h.err" &&
        grep -q "reused their cache, prefilled the 7 new ones" "$T/b16h.err" && cmp -s "$T/b16h.ids" "$T/b16ref.ids"; then ok
    else bad "bf16 $sch hit: $(cat "$T/b16h.ids"), one bf16 process $(cat "$T/b16ref.ids"); $(grep -v '^--' "$T/b16h.err" | tail -n 2)"; fi
done
# a 13-token bf16 shard pair against fp32's: 2 layers x 2 (keys, values) x 13 rows x 2 KV heads x 8 x 2 bytes fewer
DF="$T/cache32"
run_np 2 "$SEQPAR" "${GS[@]}" --prompt-tokens "$GP1" --strategy ring --prefix-cache "$DF" >/dev/null 2>&1
f32=$(cat "$DF"/kv-*.bin 2>/dev/null | wc -c)
rm -rf "$DB" && cp -r "$T/saved16" "$DB" && b16=$(cat "$DB"/kv-*.bin | wc -c)
L16=$(sed -nE 's/^shape ([0-9]+) ([0-9]+) ([0-9]+)$/\1 \2 \3/p' "$DB/manifest.txt")
want=$(echo "$L16" | awk '{ print 2 * $1 * 13 * $2 * $3 * 2 }')
if [ -n "$want" ] && [ $((f32 - b16)) -eq "$want" ]; then ok; else
    bad "bf16 shards: $b16 bytes against fp32's $f32 (want $want fewer: the values in 2 bytes)"; fi
err=$(run_np 2 "$SEQPAR" "${GS[@]}" --prompt-tokens "$GP2" --strategy ring --prefix-cache "$DB" 2>&1 >/dev/null); rc=$?
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c "holds a bf16 cache and this run computes in f32")" -eq 2 ]; then ok; else
    bad "a fp32 run on a bf16 cache: status $rc: $(printf '%s\n' "$err" | grep -v '^--' | tail -n 2)"; fi
summary test_prefix_cache
