#!/usr/bin/env bash
# How long `seqpar plan` takes with the cluster simulator on, at several world sizes of the H100
# preset (h100-8x8-ndr400, --nodes N of 8 ranks), and, given a second binary, whether both print
# the same plan byte for byte (the program's own name in the `best:` line aside). Not a test (a
# 1024-rank plan takes minutes on 2 cores): the figures go to bench/results/ with the CPU.
#
#   bash bench/plan_speed.sh SEQPAR [REF_SEQPAR]     # RANKS="64 256" (default), TIMEOUT=600 s a run
#
# MODEL=7b (default: LLaMA2-7B's layers, hidden and FFN with the default --kv-heads 2) or 70b
# (LLaMA2-70B, GQA 8); SEQ (default 1048576) the tokens.
set -u
[ $# -ge 1 ] || { sed -n '7p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
NEW=$1 REF=${2:-}
RANKS=${RANKS:-64 256} TIMEOUT=${TIMEOUT:-600} SEQ=${SEQ:-1048576} MODEL=${MODEL:-7b}
case $MODEL in
7b) M="--layers 32 --hidden 4096 --heads 32 --ffn 11008 --vocab 32000" ;;
70b) M="--layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000" ;;
*) echo "MODEL=$MODEL: give 7b or 70b" >&2; exit 2 ;;
esac
lscpu | grep -E '^(Model name|CPU\(s\)|L2 cache)' | sed 's/  */ /g'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one plan: its wall seconds (or "timeout"), its output in $tmp/$2.txt with the program's name cut
plan_time() {
    local t0 t1 rc
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    timeout "$TIMEOUT" "$1" plan --cluster h100-8x8-ndr400 --nodes "$3" $M --precision bf16 --seq-len "$SEQ" --batch 1 \
        --top 10 --explain > "$tmp/$2.txt" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    sed -i "s#$1#SEQPAR#" "$tmp/$2.txt"
    if [ $rc = 124 ]; then echo "timeout"; else awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}'; fi
}
fail=0
for P in $RANKS; do
    nodes=$((P / 8))
    a=$(plan_time "$NEW" new "$nodes")
    line="$MODEL S=$SEQ ranks $P: $a s"
    if [ -n "$REF" ]; then
        b=$(plan_time "$REF" ref "$nodes")
        line="$line; ref $b s"
        if [ "$a" = timeout ] || [ "$b" = timeout ]; then line="$line; not compared"
        elif cmp -s "$tmp/new.txt" "$tmp/ref.txt"; then line="$line; the same plan"
        else line="$line; DIFFERENT plans"; fail=1; fi
    fi
    echo "$line"
done
exit $fail
