#!/usr/bin/env bash
# A second prompt continuing a sharded key/value cache (`seqpar sample --continue-prompt`,
# docs/sampling.md): a cached prefix of CACHED prompt tokens (no tokens generated, so the cache holds
# exactly the prompt), then blocks of NEW tokens prefilled against it by pass-Q and by pass-KV on 1,
# 2 and 4 ranks (ring, zigzag): the scheme's bytes over all ranks (printed = measured by the comm
# layer) and the block's time; both schemes' logits (prompt and block) compared bit for bit. The
# model: the benchmarks' reference shape (4 layers, hidden 256, 4 heads of 64, 2 KV heads, ffn 1024,
# vocabulary 256), random weights saved by one training step; the text: the repository's docs.
#   bash bench/sample_continue.sh [BUILD] [CACHED] [NEW...]   (default: build 4096 64 2048)
set -u
BUILD=${1:-build}
CACHED=${2:-4096}
shift $(($# < 2 ? $# : 2))
NEWS=("$@")
[ ${#NEWS[@]} -gt 0 ] || NEWS=(64 2048)
cd "$(dirname "$0")/.."
. bench/sample_model.sh
printf '%-7s %-6s %-5s %-8s %-10s %-10s %-10s %-9s %s\n' cached new ranks scheme MB_chosen MB_other MB_moved block_s \
    same_as_pass-Q
prompt=$(head -c "$CACHED" "$T/text.txt")
for NEW in "${NEWS[@]}"; do
    cont=$(tail -c +$((CACHED + 1)) "$T/text.txt" | head -c "$NEW")
    for np in 1 2 4; do
        for sch in pass-q pass-kv; do
            cmd=("$BUILD/seqpar" sample --model "$T/model" --prompt "$prompt" --continue-prompt "$cont" --max-new-tokens 0
                 --threads 1 --strategy ring --continue-scheme "$sch" --prompt-logits "$T/$sch.f32")
            if [ "$np" = 1 ]; then "${cmd[@]}" >/dev/null 2>"$T/err"
            else mpirun --oversubscribe -np "$np" "${cmd[@]}" >/dev/null 2>"$T/err"; fi
            said=$(grep 'cached:' "$T/err")
            done_=$(grep 'MB moved' "$T/err")
            same=-
            [ "$sch" = pass-kv ] && { cmp -s "$T/pass-q.f32" "$T/pass-kv.f32" && same=yes || same=NO; }
            printf '%-7s %-6s %-5s %-8s %-10s %-10s %-10s %-9s %s\n' "$CACHED" "$NEW" "$np" "$sch" \
                "$(sed -nE 's/.*cached: [^ ]+ \(([0-9.]+) MB\).*/\1/p' <<<"$said")" \
                "$(sed -nE 's/.* over [^ ]+ \(([0-9.]+) MB\).*/\1/p' <<<"$said")" \
                "$(sed -nE 's/.*, ([0-9.]+) MB moved.*/\1/p' <<<"$done_")" \
                "$(sed -nE 's/.* in ([0-9.]+) s, .*/\1/p' <<<"$done_")" "$same"
        done
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
