#!/usr/bin/env bash
# A prompt's cache kept between runs (`seqpar sample --prefix-cache DIR`) and a long block after a
# cache run in pieces (`--prefill-block N`), on 2 ranks (ring, zigzag), the benchmarks' reference
# model (bench/sample_model.sh):
#   1. a prompt of CACHED tokens saved; then a prompt of CACHED + NEW tokens with the cache (its rows
#      loaded, the NEW tokens prefilled by the continuation) and without (the whole prompt prefilled):
#      the prefill's time both ways, the load and save times, whether the greedy tokens agree;
#   2. a second turn of TURN tokens after the CACHED-token prompt, run as one block and in blocks of
#      each BLOCK: the block's time, the largest rank's peak resident memory, and whether its logits
#      are the one-block run's bit for bit.
#   bash bench/sample_prefix.sh [BUILD] [CACHED] [NEW] [TURN] [BLOCK...]   (default: build 4096 512 2048 512 128)
set -u
BUILD=${1:-build}
CACHED=${2:-4096}
NEW=${3:-512}
TURN=${4:-2048}
shift $(($# < 4 ? $# : 4))
BLOCKS=("$@")
[ ${#BLOCKS[@]} -gt 0 ] || BLOCKS=(512 128)
cd "$(dirname "$0")/.."
. bench/sample_model.sh
run() { timeout 900 mpirun --oversubscribe -np 2 "$BUILD/seqpar" sample --model "$T/model" --threads 1 --strategy ring "$@"; }
prefill_s() { sed -nE 's/.*prefill [0-9]+ tokens in ([0-9.]+) s.*/\1/p' "$1"; }

echo "1. prefix cache: $CACHED cached tokens, $NEW new ones, 16 greedy tokens after them, 2 ranks"
base=$(head -c "$CACHED" "$T/text.txt")
long=$(head -c $((CACHED + NEW)) "$T/text.txt")
G=(--temperature 0 --max-new-tokens 16 --stop-token -1)
run "${G[@]}" --prompt "$base" --prefix-cache "$T/pc" >/dev/null 2>"$T/save.err"
run "${G[@]}" --prompt "$long" --prefix-cache "$T/pc" >"$T/hit.out" 2>"$T/hit.err"
run "${G[@]}" --prompt "$long" >"$T/full.out" 2>"$T/full.err"
grep 'prefix cache' "$T/save.err" "$T/hit.err" | sed 's/^[^:]*://'
same=no
cmp -s "$T/hit.out" "$T/full.out" && same=yes
printf '%-28s %s s\n' "prefill without the cache:" "$(prefill_s "$T/full.err")" \
    "prefill with it (load + new):" "$(prefill_s "$T/hit.err")"
echo "the same generated text: $same"

echo "2. a second turn of $TURN tokens after the $CACHED-token prompt, 2 ranks, pass-Q"
printf '%-8s %-9s %-14s %s\n' block block_s peak_RSS_MiB same_bits_as_one_block
cont=$(tail -c +$((CACHED + 1)) "$T/text.txt" | head -c "$TURN")
for b in "$TURN" "${BLOCKS[@]}"; do
    timeout 900 mpirun --oversubscribe -np 2 /usr/bin/time -f 'rss %M' "$BUILD/seqpar" sample --model "$T/model" --threads 1 \
        --strategy ring --prompt "$base" --continue-prompt "$cont" --max-new-tokens 0 --continue-scheme pass-q \
        --prefill-block "$b" --prompt-logits "$T/b$b.f32" >/dev/null 2>"$T/b.err"
    rss=$(sed -nE 's/^rss ([0-9]+)$/\1/p' "$T/b.err" | sort -n | tail -n 1)
    same=-
    [ "$b" != "$TURN" ] && { cmp -s "$T/b$TURN.f32" "$T/b$b.f32" && same=yes || same=NO; }
    printf '%-8s %-9s %-14s %s\n' "$b" "$(sed -nE 's/.*continue: [0-9]+ tokens by .* in ([0-9.]+) s,.*/\1/p' "$T/b.err")" \
        "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" "$same"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
