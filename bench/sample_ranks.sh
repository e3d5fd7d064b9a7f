#!/usr/bin/env bash
# `seqpar sample` on 1, 2 and 4 ranks (docs/sampling.md): prefill tokens per second of a long prompt
# on 1 rank and on 2 ranks, per-token decode time after it on 1, 2 and 4 ranks, and the key/value cache
# bytes of the largest rank. The model: the benchmarks' reference shape (4 layers, hidden 256, 4 heads
# of 64, 2 KV heads, ffn 1024, vocabulary 256), random weights saved by one training step; the prompt:
# the repository's docs as bytes. Every run's tokens are compared with the 1-rank run's.
#   bash bench/sample_ranks.sh [BUILD] [PROMPT_LENGTHS...]   (default: build 4096 16384)
#   RUNS="1x1:ring 2x1:ring" bash bench/sample_ranks.sh build 65536   (ranks x threads:strategy; the
#   default runs 1x1:ring 1x2:ring 2x1:ring 2x1:ulysses 4x1:ring; the first is the reference)
#   NEW=128 PRECISION=bf16 ...   (new tokens, default 32; --precision, default fp32)
# Prints one line per run: length, ranks, threads per rank, strategy, prefill s, prefill tokens/s,
# ms per new token, cache bytes and tracked peak MiB on the largest rank, same tokens as 1 rank, and
# the 1-minute load average after the run (the machine's other work: timings under load are rough).
set -u
BUILD=${1:-build}
shift
LENS=("$@")
[ ${#LENS[@]} -gt 0 ] || LENS=(4096 16384)
cd "$(dirname "$0")/.."
. bench/sample_model.sh
NEW=${NEW:-32}
PRECISION=${PRECISION:-fp32}
echo "new tokens $NEW, precision $PRECISION"
printf '%-7s %-5s %-7s %-9s %-10s %-12s %-9s %-12s %-9s %-5s %s\n' length ranks threads strategy prefill_s prefill_tok/s \
    ms/token cache_bytes peak_MiB same load
run() { # length np threads strategy flags...
    local S=$1 np=$2 th=$3
    shift 3
    local prompt
    prompt=$(head -c "$S" "$T/text.txt")
    local cmd=("$BUILD/seqpar" sample --model "$T/model" --prompt "$prompt" --max-new-tokens $NEW --temperature 0
               --stop-token -1 --threads "$th" --precision "$PRECISION" --strategy "$@")
    if [ "$np" = 1 ]; then "${cmd[@]}" >"$T/out" 2>"$T/err"
    else mpirun --oversubscribe -np "$np" "${cmd[@]}" >"$T/out" 2>"$T/err"; fi
    local line same=-
    line=$(grep 'ranks: prefill' "$T/err")
    [ -f "$T/ref$S" ] && { cmp -s "$T/out" "$T/ref$S" && same=yes || same=NO; }
    [ -f "$T/ref$S" ] || cp "$T/out" "$T/ref$S"
    printf '%-7s %-5s %-7s %-9s %-10s %-12s %-9s %-12s %-9s %-5s %s\n' "$S" "$np" "$th" "$1" \
        "$(sed -nE 's/.*prefill [0-9]+ tokens in ([0-9.]+) s.*/\1/p' <<<"$line")" \
        "$(sed -nE 's/.*s \(([0-9.]+) tokens\/s\).*/\1/p' <<<"$line")" \
        "$(sed -nE 's/.*\(([0-9.]+) ms\/token\).*/\1/p' <<<"$line")" \
        "$(sed -nE 's/.*cache ([0-9]+) bytes.*/\1/p' <<<"$line")" \
        "$(sed -nE 's/.*peak memory.*: ([0-9.]+) MiB tracked.*/\1/p' "$T/err")" "$same" "$(cut -d' ' -f1 /proc/loadavg)"
}
for S in "${LENS[@]}"; do
    for r in ${RUNS:-1x1:ring 1x2:ring 2x1:ring 2x1:ulysses 4x1:ring}; do
        np=${r%%x*} th=${r#*x}
        run "$S" "$np" "${th%%:*}" "${r#*:}"
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
