# `seqpar train --dry-run`: a valid configuration exits 0 on every rank, prints the memory plan
# `seqpar memory` prints for it, writes nothing (no run directory, log or checkpoint) and stays far
# below the memory the run would take (peak RSS under 64 MiB where the plan predicts over 1 GiB);
# each bad configuration gets exactly the one-line refusal `seqpar train` itself gives for the same
# flags, with a non-zero status on every rank, on 1 and on 2 ranks; `--ranks P` checks a 64-rank job
# of a 7B-shaped model from one process (its plan is `seqpar memory --ranks 64`'s) and refuses one
# whose plan exceeds --mem-per-rank; the best configuration `seqpar plan` proposes for the 7B, 13B
# and 70B shapes at 64 to 1024 ranks passes the dry run with the plan's RAM figure.
# usage: bash tests/test_dry_run.sh BUILD_DIR
set -u
BUILD=${1:-build}
. tests/lib.sh
mpi_test_env
export SEQPAR_PEAK_GFLOPS=100 SEQPAR_RUNS="$T/runs"

# the "seqpar: error:" lines of a command's output, sorted and unique (every rank prints its line)
errors() { grep '^seqpar: error:' | sort -u; }
# run_ranks NP TAG command...: runs the command on NP ranks, each rank's status into $T/TAG.rc.RANK
# and its output into $T/TAG.out
run_ranks() {
    local np=$1 tag=$2
    shift 2
    rm -f "$T/$tag".rc.*
    if [ "$np" -eq 1 ]; then # one process: started as a singleton, without mpirun's start-up
        timeout 60 "$@" >"$T/$tag.out" 2>&1
        echo $? >"$T/$tag.rc.0"
        return
    fi
    # shellcheck disable=SC2016
    run_np "$np" sh -c '"$@" 2>&1; echo $? > "$0.rc.${OMPI_COMM_WORLD_RANK:-0}"' "$T/$tag" "$@" >"$T/$tag.out" 2>&1
}
# the distinct statuses of the ranks of TAG, one line
statuses() { cat "$T/$1".rc.* 2>/dev/null | sort -u | tr '\n' ' '; }

# 1. a valid configuration: the plan, nothing written, little memory
MODEL="--layers 2 --hidden 1024 --ffn 4096 --heads 8 --kv-heads 8 --vocab 32000 --seq-len 1024 --batch 2 --threads 1"
for np in 1 2; do
    run_ranks "$np" ok "$SEQPAR" train --dry-run $MODEL --save "$T/ckpt" --log "$T/logdir/train.jsonl"
    if [ "$(statuses ok)" = "0 " ] && [ "$(ls "$T"/ok.rc.* | wc -l)" -eq "$np" ]; then ok; else
        bad "np $np: a valid dry run ended with statuses '$(statuses ok)': $(tail -n 3 "$T/ok.out")"; fi
    grep -v '^dry run:' "$T/ok.out" >"$T/ok.plan"
    "$SEQPAR" memory --ranks "$np" $MODEL >"$T/mem.plan" 2>&1
    if [ -s "$T/ok.plan" ] && cmp -s "$T/ok.plan" "$T/mem.plan"; then ok; else
        bad "np $np: the dry run's plan is not seqpar memory's: $(diff "$T/ok.plan" "$T/mem.plan" | head -n 4)"; fi
    if grep -q "^dry run: every check of seqpar train passed on $np rank" "$T/ok.out"; then ok; else
        bad "np $np: no closing line: $(tail -n 2 "$T/ok.out")"; fi
    if [ ! -e "$T/ckpt" ] && [ ! -e "$T/logdir" ] && [ ! -e "$T/runs" ]; then ok; else
        bad "np $np: the dry run wrote files: $(ls -d "$T/ckpt" "$T/logdir" "$T/runs" 2>/dev/null)"; fi
done
# peak RSS (one process, no mpirun) against the plan: the run would hold the total, the dry run none of it
predicted=$(awk '/^  total / { printf "%.0f\n", $2 }' "$T/mem.plan")
rss_kib=$( { /usr/bin/time -f '%M' "$SEQPAR" train --dry-run $MODEL >/dev/null 2>"$T/rss.err"; } 2>&1; tail -n 1 "$T/rss.err")
if [ "${predicted:-0}" -gt 1024 ] && [ "${rss_kib:-999999}" -lt 65536 ]; then ok; else
    bad "dry run peak RSS ${rss_kib} KiB with a plan of ${predicted} MiB (want < 64 MiB and a plan > 1 GiB)"; fi

# 2. bad configurations: train's own one-line refusal, non-zero on every rank
mkdir -p "$T/noweights"
cp "$FIX/tiny_llama3/config.json" "$T/noweights/"
printf 'hello' >"$T/short.txt"
same_refusal() { # np flags...
    local np=$1
    shift
    run_ranks "$np" real "$SEQPAR" train --steps 1 --eval-every 0 --log "$T/real.jsonl" "$@"
    run_ranks "$np" dry "$SEQPAR" train --dry-run --steps 1 --eval-every 0 --log "$T/real.jsonl" "$@"
    local want got
    want=$(errors <"$T/real.out")
    got=$(errors <"$T/dry.out")
    if [ -z "$want" ]; then bad "np $np $*: seqpar train did not refuse it: $(tail -n 2 "$T/real.out")"; return; fi
    if [ "$want" = "$got" ] && [ "$(printf '%s\n' "$got" | wc -l)" -eq 1 ]; then ok; else
        bad "np $np $*: train said '$want', the dry run '$got'"; fi
    local s
    s=$(statuses dry)
    if [ "$(ls "$T"/dry.rc.* | wc -l)" -eq "$np" ] && ! printf '%s' "$s" | grep -qw 0 && [ "$(printf '%s' "$s" | wc -w)" -eq 1 ]; then ok; else
        bad "np $np $*: the dry run's ranks ended with statuses '$s' (want one non-zero status on each of $np)"; fi
}
for np in 1 2; do
    same_refusal "$np" --strategy ulysses --hp 4
    same_refusal "$np" --strategy ring --team 2
    same_refusal "$np" --strategy nope
    same_refusal "$np" --data "$T/missing.bin"
    same_refusal "$np" --data "$T/short.txt"
    same_refusal "$np" --model "$T/missing-model"
    same_refusal "$np" --model "$T/noweights"
    same_refusal "$np" --resume "$T/noweights"
    same_refusal "$np" --zero 1 --zero-group 3
    same_refusal "$np" --mem-per-rank 0.01
    same_refusal "$np" --log "$T/short.txt"
    same_refusal "$np" --layers 2 --hidden 1024 --ffn 4096 --heads 8 --vocab 32000 --seq-len 4096 --mem-per-rank 0.5
done
same_refusal 2 --strategy ring --seq-len 127
same_refusal 2 --batch 3 --dp 2

# 3. --ranks P: a 64-rank job of a 7B-shaped model from one process
L7="--layers 32 --hidden 4096 --heads 32 --kv-heads 32 --ffn 11008 --vocab 32000 --seq-len 131072 --batch 1"
G="--strategy 2d --hp 8 --cp 8 --zero 3 --checkpoint layer --threads 4"
start=$(date +%s)
"$SEQPAR" train --dry-run $L7 $G --ranks 64 --ranks-per-node 8 --mem-per-rank 256 >"$T/7b.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q '^dry run: every check of seqpar train passed for 64 ranks (checked from one process)' "$T/7b.out" &&
    grep -q '64 ranks: 2d, dp 1 x hp 8 x cp 8' "$T/7b.out"; then ok; else bad "7B on 64 ranks: status $rc: $(tail -n 3 "$T/7b.out")"; fi
[ $(($(date +%s) - start)) -le 10 ] && ok || bad "7B on 64 ranks took more than 10 s"
grep -v '^dry run:' "$T/7b.out" >"$T/7b.plan"
"$SEQPAR" memory --ranks 64 $L7 $G --ranks-per-node 8 >"$T/7b.mem" 2>&1
if cmp -s "$T/7b.plan" "$T/7b.mem"; then ok; else bad "7B --ranks 64: the plan is not seqpar memory's: $(diff "$T/7b.plan" "$T/7b.mem" | head -n 4)"; fi
# the same job where a rank has 4 GiB: refused with the plan's figure
out=$("$SEQPAR" train --dry-run $L7 $G --ranks 64 --mem-per-rank 4 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
    printf '%s' "$out" | grep -q '^seqpar: error: this run needs .* GiB of RAM per rank .* but a rank has 4.00 GiB (--mem-per-rank 4)'; then ok; else
    bad "7B over --mem-per-rank 4: status $rc: $out"; fi
# a grid of 32 ranks for 64: the memory model's refusal, as seqpar memory --ranks gives it
want=$("$SEQPAR" memory --ranks 64 $L7 --strategy 2d --hp 8 --cp 4 2>&1 | errors)
got=$("$SEQPAR" train --dry-run --ranks 64 $L7 --strategy 2d --hp 8 --cp 4 2>&1 | errors)
if [ -n "$want" ] && [ "$want" = "$got" ]; then ok; else bad "--ranks 64 --hp 8 --cp 4: memory said '$want', the dry run '$got'"; fi
# --ranks belongs to --dry-run
out=$("$SEQPAR" train --ranks 4 2>&1)
if [ $? -ne 0 ] && printf '%s' "$out" | grep -q -- '--ranks 4 checks a job of 4 ranks without starting them: add --dry-run'; then ok; else
    bad "train --ranks without --dry-run: $out"; fi

# 4. what seqpar plan proposes, train --dry-run --ranks accepts: the best configuration of the 7B,
# 13B and 70B shapes at 64, 256 and 1024 ranks (rates given: no measuring), checked from one
# process, with the RAM plan printed (its total plus the 64 MiB runtime) equal to the plan's column
plan_case() { # ranks ranks-per-node mem-per-rank model flags...
    local P=$1 R=$2 M=$3
    shift 3
    "$SEQPAR" plan --ranks "$P" --ranks-per-node "$R" --mem-per-rank "$M" --gemm-gflops 50 --attn-gflops 40 --top 1 \
        "$@" >"$T/plan.out" 2>&1
    local best ram
    best=$(sed -nE 's/^best: mpirun -n [0-9]+( --map-by [^ ]+)? [^ ]+ train //p' "$T/plan.out")
    ram=$(awk '$1 == "1" { print $NF }' "$T/plan.out")
    if [ -z "$best" ] || [ -z "$ram" ]; then bad "plan --ranks $P $*: no best configuration: $(tail -n 2 "$T/plan.out")"; return; fi
    # shellcheck disable=SC2086
    "$SEQPAR" train --dry-run --ranks "$P" --ranks-per-node "$R" --mem-per-rank "$M" $best >"$T/planned.out" 2>&1
    local rc=$? total
    total=$(awk '/^  total / { print $2 }' "$T/planned.out")
    if [ $rc -eq 0 ] && awk -v a="$total" -v b="$ram" 'BEGIN { d = a + 64 - b; if (d < 0) d = -d; exit !(a != "" && d <= 0.06) }'; then ok; else
        bad "plan --ranks $P $*: train --dry-run refused or differs (status $rc, total $total + 64 MiB, plan $ram MiB): $best: $(tail -n 1 "$T/planned.out")"; fi
}
plan_case 64 8 64 $L7
plan_case 256 16 64 --layers 40 --hidden 5120 --heads 40 --kv-heads 40 --ffn 13824 --vocab 32000 --seq-len 262144 --batch 1
plan_case 1024 16 64 --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000 --seq-len 262144 --batch 1

summary test_dry_run
