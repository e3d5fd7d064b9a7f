#!/usr/bin/env bash
# What a person following a run relies on: every run without --log gets a directory and log of its
# own (runs/<UTC date-time>/train.jsonl, under $SEQPAR_RUNS here), a run appended to an existing
# --log starts with a run-start record, step lines and records carry the elapsed time and an ETA
# that follows its formula, recall evaluations are logged by distance (and add up), the run ends
# by naming its log, model and trace, --trace-step traces one step, scripts/plot_run.sh draws
# PNGs of a run, and `seqpar train --help` groups its options by topic. Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"

TINY=(--layers 1 --hidden 32 --heads 2 --kv-heads 2 --ffn 64 --seq-len 64 --batch 4 --peak-gflops 100)
FUSED=(--recall-format fused --vocab 81 --recall-pairs 8)

# ---- a directory and log per run
export SEQPAR_RUNS="$T/deep/runs" # parents created as needed
for i in 1 2; do
    timeout 60 "$SEQPAR" train "${TINY[@]}" --steps 3 --eval-every 0 --eval-seqs 2 >"$T/own$i.out" 2>&1 || bad "run $i without --log: $(tail -n 2 "$T/own$i.out")"
done
dirs=$(ls -d "$T"/deep/runs/*/ 2>/dev/null | wc -l)
if [ "$dirs" -eq 2 ]; then ok; else bad "two runs without --log should make two run directories, got $dirs: $(ls "$T/deep/runs")"; fi
for f in "$T"/deep/runs/*/train.jsonl; do
    if [ "$(grep -c '"run_start"' "$f")" -eq 1 ] && [ "$(losses "$f" | wc -l)" -eq 3 ]; then ok; else bad "$f: want 1 run_start and 3 steps: $(cat "$f")"; fi
done
log1=$(sed -nE 's/.*; log: ([^;]+)$/\1/p; s/.*; log: ([^;]+);.*/\1/p' "$T/own1.out")
if [ -n "$log1" ] && [ -f "$log1" ] && case "$log1" in "$T"/deep/runs/*/train.jsonl) true ;; *) false ;; esac; then ok; else
    bad "the run should end by naming its log under \$SEQPAR_RUNS: $(tail -n 1 "$T/own1.out")"; fi
unset SEQPAR_RUNS

# ---- appending to a named log: each run opens with a run-start record
timeout 60 "$SEQPAR" train "${TINY[@]}" --steps 2 --eval-every 0 --eval-seqs 2 --log "$T/two.jsonl" >/dev/null 2>&1
timeout 60 "$SEQPAR" train "${TINY[@]}" --steps 2 --eval-every 0 --eval-seqs 2 --log "$T/two.jsonl" --seed 5 >/dev/null 2>&1
if [ "$(grep -c '"run_start"' "$T/two.jsonl")" -eq 2 ] && [ "$(sed -n 1p "$T/two.jsonl" | grep -c '"run_start"')" -eq 1 ] &&
    grep '"run_start"' "$T/two.jsonl" | tail -n 1 | grep -q '"--seed", "5"'; then ok; else bad "appended runs lack their run_start records: $(cat "$T/two.jsonl")"; fi
# the log is JSON whatever bytes the command line holds: a path that is not UTF-8 is written with
# the replacement character (its byte went into the file raw, and the line did not parse)
bad_name="$T/$(printf 'd\377ta').txt"
printf 'hello world %.0s' $(seq 100) >"$bad_name"
timeout 60 "$SEQPAR" train "${TINY[@]}" --vocab 256 --steps 1 --data "$bad_name" --log "$T/utf.jsonl" >/dev/null 2>&1
if python3 -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]; sys.exit(not any("d\ufffdta.txt" in a for a in r[0]["argv"]))' "$T/utf.jsonl" 2>/dev/null; then ok; else
    bad "a non-UTF-8 argument made the log invalid: $(head -c 300 "$T/utf.jsonl" | od -c | head -n 3)"; fi

# ---- elapsed time and ETA: printed on each step line; in the log eta_s = elapsed_s / done x left
timeout 60 "$SEQPAR" train "${TINY[@]}" "${FUSED[@]}" --steps 6 --eval-every 2 --eval-seqs 3 --recall-queries 10 \
    --log "$T/eta.jsonl" --save "$T/model" >"$T/eta.out" 2>&1
if [ "$(grep -cE '^step +[0-9]+/6 .*\| [0-9hms]+ elapsed, ETA [0-9hms]+$' "$T/eta.out")" -eq 6 ]; then ok; else bad "step lines lack 'elapsed, ETA': $(grep '^step' "$T/eta.out" | head -n 2)"; fi
if awk 'BEGIN { n = 0; bad = 0 } /"eta_s"/ {
        match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
        match($0, /"elapsed_s": [0-9.]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
        match($0, /"eta_s": [-0-9.]+/); a = substr($0, RSTART + 9, RLENGTH - 9) + 0
        want = e / s * (6 - s); d = a - want; if (d < 0) d = -d
        if (d > 0.002 + 1e-6 * want || (s < 6 && a <= 0)) bad++; n++ }
     END { exit !(n == 6 && bad == 0) }' "$T/eta.jsonl"; then ok; else bad "eta_s does not follow elapsed_s / steps done x steps left: $(grep eta_s "$T/eta.jsonl" | head -n 3)"; fi
# evaluations: at steps 2 and 4 (periodic, with an ETA) and 6 (final); the buckets add up to
# --eval-seqs x --recall-queries and to the accuracy
if [ "$(grep -cE '^step [24] \([0-9hms]+ elapsed, ETA [0-9hms]+\): recall accuracy by distance' "$T/eta.out")" -eq 2 ] &&
    grep -qE '^final eval, step 6 \([0-9hms]+ elapsed\): recall accuracy' "$T/eta.out"; then ok; else bad "evaluation lines: $(grep 'recall accuracy' "$T/eta.out")"; fi
if awk 'BEGIN { n = 0; bad = 0 } /"eval": "recall"/ {
        match($0, /"accuracy": [0-9.]+/); acc = substr($0, RSTART + 12, RLENGTH - 12) + 0
        c = 0; t = 0; rest = $0
        while (match(rest, /"correct": [0-9]+, "total": [0-9]+/)) {
            split(substr(rest, RSTART, RLENGTH), f, /[:,] */); c += f[2]; t += f[4]; rest = substr(rest, RSTART + RLENGTH) }
        d = acc - c / t; if (d < 0) d = -d
        if (t != 30 || d > 1e-6) bad++; n++ }
     END { exit !(n == 3 && bad == 0) }' "$T/eta.jsonl"; then ok; else bad "eval records do not add up to 3 x 10 queries: $(grep '"eval"' "$T/eta.jsonl")"; fi
if tail -n 1 "$T/eta.out" | grep -qE "^run took [0-9hms]+; log: $T/eta.jsonl; model: $T/model$" && [ -f "$T/model/config.json" ] &&
    [ -f "$T/model/model.safetensors" ]; then ok; else bad "the run should end naming its log and model: $(tail -n 1 "$T/eta.out")"; fi

# ---- the pictures (gnuplot); without it plot_run.sh says so and draws nothing
png() { [ "$(head -c 8 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
if command -v gnuplot >/dev/null 2>&1; then
    if bash scripts/plot_run.sh -o "$T/pics" "$T/two.jsonl" "$T/eta.jsonl" >"$T/plot.out" 2>&1 && png "$T/pics/loss.png" && png "$T/pics/recall.png"; then ok; else
        bad "plot_run.sh: $(cat "$T/plot.out")"; fi
    # a log without recall evaluations (text data): the loss picture only
    for i in $(seq 40); do printf 'the quick brown fox %d jumps over the lazy dog\n' "$i"; done >"$T/text.txt"
    mkdir -p "$T/text"
    timeout 60 "$SEQPAR" train "${TINY[@]}" --vocab 256 --steps 3 --data "$T/text.txt" --log "$T/text/train.jsonl" >/dev/null 2>&1
    if bash scripts/plot_run.sh "$T/text/train.jsonl" >"$T/plot2.out" 2>&1 && png "$T/text/loss.png" && [ ! -e "$T/text/recall.png" ] &&
        grep -q "no recall evaluations" "$T/plot2.out"; then ok; else bad "plot_run.sh without evaluations: $(cat "$T/plot2.out")"; fi
else
    echo "gnuplot is not installed (bash scripts/install-deps.sh installs it): the PNG checks are replaced by the skip message check"
    if bash scripts/plot_run.sh "$T/eta.jsonl" 2>&1 | grep -q "gnuplot is not installed"; then ok; else bad "plot_run.sh without gnuplot should say so"; fi
fi
if bash scripts/plot_run.sh "$T/nothing.jsonl" >/dev/null 2>&1; then bad "plot_run.sh on a missing log should fail"; else ok; fi

# ---- --trace-step: one step of a 2-rank ring run in the trace, fewer events than every step
mpi_test_env
RING=(train "${TINY[@]}" --steps 3 --eval-every 0 --eval-seqs 2 --strategy ring --log "$T/ring.jsonl")
if run_np 2 "$SEQPAR" "${RING[@]}" --trace "$T/all.json" >/dev/null 2>&1 &&
    run_np 2 "$SEQPAR" "${RING[@]}" --trace "$T/one.json" --trace-step last >"$T/one.out" 2>&1 &&
    "$BUILD/tests/tool_check_trace" "$T/one.json" 2 compute send recv >"$T/trace.out"; then ok; else bad "--trace-step last: $(tail -n 2 "$T/one.out") $(cat "$T/trace.out" 2>/dev/null)"; fi
n_all=$(grep -o '"ph":"X"' "$T/all.json" 2>/dev/null | wc -l)
n_one=$(grep -o '"ph":"X"' "$T/one.json" 2>/dev/null | wc -l)
if [ "$n_one" -gt 0 ] && [ $((3 * n_one)) -le $((n_all + 2)) ] && grep -q "; trace: $T/one.json" "$T/one.out"; then ok; else
    bad "--trace-step last should trace one step of three: $n_one events against $n_all for every step"; fi
expect_one_line() { # what words command...
    local what=$1 words=$2 err
    shift 2
    err=$(timeout 60 "$@" 2>&1 >/dev/null) && { bad "$what: exit status 0"; return; }
    if [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && printf '%s' "$err" | grep -q -- "$words"; then ok; else bad "$what: $err"; fi
}
expect_one_line "--trace-step without --trace" "needs --trace FILE" "$SEQPAR" train "${TINY[@]}" --steps 1 --trace-step 1 --log "$T/x.jsonl"
expect_one_line "--recall-format unknown" "adjacent or fused" "$SEQPAR" train --recall-format mqar --log "$T/x.jsonl"
chmod 500 "$T" 2>/dev/null
if [ ! -w "$T" ]; then # not root: an unwritable runs/ parent is a one-line error
    expect_one_line "unwritable runs directory" "cannot create a run directory" env SEQPAR_RUNS="$T/ro/runs" "$SEQPAR" train "${TINY[@]}" --steps 1
fi
chmod 700 "$T"

# ---- --help groups options by topic
help=$("$SEQPAR" train --help)
missing=""
for topic in "model (" "data:" "recall task" "optimisation:" "checkpoints:" "progress and logs:" "memory:" "parallelism"; do
    printf '%s\n' "$help" | grep -q "^$topic" || missing="$missing '$topic'"
done
if [ -z "$missing" ]; then ok; else bad "seqpar train --help lacks the topics$missing"; fi

summary test_progress
