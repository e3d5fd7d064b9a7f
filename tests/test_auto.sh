#!/bin/bash
# seqpar train --strategy auto and seqpar plan --profile (docs/planner.md):
#  - on 1 and 2 ranks, auto prints its pick once, as the train command it equals, and runs it: the
#    losses of 2 steps equal, bit for bit, those of the printed command run as printed;
#  - a checkpoint records its configuration; a resume under auto takes it (the losses continue
#    those of the printed command run whole), and on ranks the recorded grid does not fit it ends
#    with train's one line;
#  - eval --strategy auto on 2 ranks: the loss of the printed eval command;
#  - plan --profile 1 on 2 ranks times the 3 best configurations and keeps the fastest; train
#    --strategy auto --profile 1 --profile-top 2 times two and runs the fastest's row;
#  - bad input: --profile 0, --profile on other ranks than --ranks, train --profile without auto,
#    auto with another strategy's knob: one line, non-zero exit.
# Usage: tests/test_auto.sh BUILD_DIR
BUILD=${1:-build}
source tests/lib.sh
mpi_test_env
PROG=$(printf '%s' "$SEQPAR" | sed 's/[][\.*^$#]/\\&/g')
# no calibration file: auto plans with the rates plan measures here; run directories in $T
export SEQPAR_THIS_MACHINE="$T/none.json" SEQPAR_RUNS="$T/runs"
M="--layers 1 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --seq-len 64 --batch 2 --peak-gflops 100 --quiet"

# the pick's train flags in an auto run's output ("" where it printed no single pick)
pick_of() {
    [ "$(grep -c '^strategy auto: ' "$1")" -eq 1 ] || return
    sed -nE "s#^strategy auto: .*: mpirun -n [0-9]+ (--map-by [^ ]+ )?$PROG train ##p" "$1"
}

for np in 1 2; do
    run_np "$np" "$SEQPAR" train --strategy auto $M --steps 2 --log "$T/auto$np.jsonl" >"$T/auto$np.out" 2>&1
    rc=$?
    flags=$(pick_of "$T/auto$np.out")
    if [ $rc -ne 0 ] || [ -z "$flags" ]; then bad "auto on $np ranks: status $rc: $(head -n 3 "$T/auto$np.out")"; continue; fi
    eval "set -- $flags" # the printed words, as a shell reads them
    run_np "$np" "$SEQPAR" train "$@" --log "$T/given$np.jsonl" >"$T/given$np.out" 2>&1
    a=$(losses "$T/auto$np.jsonl"); b=$(losses "$T/given$np.jsonl")
    if [ "$(printf '%s\n' "$a" | wc -l)" -eq 2 ] && [ "$a" = "$b" ]; then ok; else
        bad "auto on $np ranks ($flags): losses $(echo $a) against the printed command's $(echo $b): $(tail -n 1 "$T/given$np.out")"; fi
done

# a resume: 2 of 4 steps under auto, saved; resumed under auto from the checkpoint's record
run_np 2 "$SEQPAR" train --strategy auto $M --steps 4 --stop-at 2 --save "$T/ck" --log "$T/part.jsonl" >"$T/part.out" 2>&1
flags=$(pick_of "$T/part.out")
run_np 2 "$SEQPAR" train --strategy auto $M --steps 4 --resume "$T/ck" --log "$T/rest.jsonl" >"$T/rest.out" 2>&1
rc=$?
eval "set -- $flags"
run_np 2 "$SEQPAR" train "$@" --steps 4 --stop-at 4 --save "$T/ck_whole" --log "$T/whole.jsonl" >"$T/whole.out" 2>&1
a=$(losses "$T/rest.jsonl"); b=$(losses "$T/whole.jsonl" | tail -n 2)
rec=$(sed -nE 's/.*"parallel": "([^"]*)".*/\1/p' "$T/ck/trainer_state.json")
if [ $rc -eq 0 ] && [ -n "$flags" ] && [ -n "$rec" ] && printf '%s' "$flags" | grep -qF -- "$rec" &&
    grep -q "^strategy auto: resuming $T/ck with the configuration it recorded: mpirun -n 2 $PROG train .*$rec" "$T/rest.out" &&
    [ "$(printf '%s\n' "$a" | wc -l)" -eq 2 ] && [ "$a" = "$b" ]; then ok; else
    bad "auto resume: status $rc, recorded '$rec', pick '$flags': losses $(echo $a) against $(echo $b): $(head -n 2 "$T/rest.out")"; fi
# on 1 rank the recorded 2-rank grid is train's to refuse
out=$(timeout 60 "$SEQPAR" train --strategy auto $M --steps 4 --resume "$T/ck" --log "$T/one.jsonl" 2>&1 >/dev/null)
rc=$?
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -q '^seqpar: error: '; then ok; else
    bad "auto resume of a 2-rank checkpoint on 1 rank: status $rc: $out"; fi

# eval --strategy auto on 2 ranks: its loss lines are those of the printed eval command
E="--model $FIX/tiny_long --data $FIX/tiny_long/tokens.bin --seq-len 128 --eval-seqs 2"
run_np 2 "$SEQPAR" eval --strategy auto $E >"$T/eauto.out" 2>&1
rc=$?
flags=$([ "$(grep -c '^strategy auto: ' "$T/eauto.out")" -eq 1 ] &&
    sed -nE "s#^strategy auto: .*: mpirun -n 2 $PROG eval ##p" "$T/eauto.out")
eval "set -- $flags"
run_np 2 "$SEQPAR" eval "$@" >"$T/egiven.out" 2>&1
a=$(grep -E '^loss |^  1-128 ' "$T/eauto.out"); b=$(grep -E '^loss |^  1-128 ' "$T/egiven.out")
if [ $rc -eq 0 ] && [ -n "$flags" ] && [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else
    bad "eval --strategy auto: status $rc ($flags): '$a' against the printed command's '$b': $(tail -n 2 "$T/eauto.out")"; fi

# plan --profile 1 on 2 ranks: the 3 best, each measured, the fastest kept
RATES="--gemm-gflops 10 --attn-gflops 10"
# plan --strategy auto (or =auto) is plan choosing the strategy: the same output as without it
"$SEQPAR" plan --ranks 2 $M $RATES >"$T/pnone.out" 2>&1
"$SEQPAR" plan --strategy auto --ranks 2 $M $RATES >"$T/pauto.out" 2>&1
"$SEQPAR" plan --ranks 2 $M $RATES --strategy=auto >"$T/pauto2.out" 2>&1
if grep -q '^best: ' "$T/pnone.out" && cmp -s "$T/pnone.out" "$T/pauto.out" && cmp -s "$T/pnone.out" "$T/pauto2.out"; then ok
else bad "plan --strategy auto differs from plan: $(diff "$T/pnone.out" "$T/pauto.out" | head -n 4)"; fi
run_np 2 "$SEQPAR" plan --ranks 2 $M $RATES --profile 1 >"$T/prof.out" 2>&1
rc=$?
rows=$(sed -n '/^profile: 1 step of each of the 3 best configurations on the 2 ranks here/,$p' "$T/prof.out" |
    grep -cE '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+  --strategy ')
best=$(sed -n "s#^best measured: mpirun -n 2 $PROG train ##p" "$T/prof.out")
if [ $rc -eq 0 ] && [ "$rows" -eq 3 ] && [ -n "$best" ]; then ok; else bad "plan --profile 1: status $rc, $rows rows: $(tail -n 5 "$T/prof.out")"; fi

# train --strategy auto --profile 1 --profile-top 2: the two timed, the fastest row run
run_np 2 "$SEQPAR" train --strategy auto $M --steps 2 --profile 1 --profile-top 2 --log "$T/tprof.jsonl" >"$T/tprof.out" 2>&1
rc=$?
row=$(sed -nE 's/^strategy auto: .*, the fastest of its 2 best measured \(row ([0-9]+)\).*/\1/p' "$T/tprof.out")
conf=$(awk -v r="$row" '$1 == r && $5 ~ /^--strategy$/ { sub(/^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+  /, ""); print }' "$T/tprof.out")
rows=$(grep -cE '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+  --strategy ' "$T/tprof.out")
if [ $rc -eq 0 ] && [ "$rows" -eq 2 ] && [ -n "$conf" ] && grep -q "^strategy auto: .* train .* $conf$" "$T/tprof.out" &&
    [ "$(losses "$T/tprof.jsonl" | wc -l)" -eq 2 ]; then ok; else
    bad "train --strategy auto --profile 1: status $rc, $rows rows, row '$row' ($conf): $(tail -n 3 "$T/tprof.out")"; fi

# one-line errors, non-zero exit (every rank prints the same line: one distinct line besides mpirun's)
err_case() { # np expected-substring args...
    local np=$1 want=$2
    shift 2
    run_np "$np" "$SEQPAR" "$@" >/dev/null 2>"$T/err"
    local rc=$? out
    out=$(grep '^seqpar: ' "$T/err" | sort -u)
    if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && printf '%s' "$out" | grep -qF -- "$want"; then ok; else
        bad "$* on $np ranks: status $rc: $(cat "$T/err")"; fi
}
err_case 1 "--profile" plan --ranks 2 $M $RATES --profile 0
err_case 1 "--profile times the configurations on the ranks mpirun started (1), not on --ranks 2" plan --ranks 2 $M $RATES --profile 1
err_case 1 "add --strategy auto or drop it" train $M --profile 1 --steps 1 --log "$T/bad.jsonl"
err_case 2 "seqpar train --strategy auto: nothing runs on 2 ranks with the flags given: --team 2 is read by --strategy" train --strategy auto $M --team 2 --steps 1 --log "$T/bad.jsonl"
summary test_auto
