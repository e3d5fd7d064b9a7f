#!/usr/bin/env bash
# The README's quick start runs as written: takes the indented command lines of its "## Quick start"
# section (there must be five) and runs each from the repository root, as whoever runs the suite
# (root too: the Open MPI root permission the other tests export is removed first), with few steps:
#   bash scripts/train.sh   gets STAGE1_STEPS=3 STAGE2_STEPS=2 STAGE2_SEQ_LEN=256 in its environment
#   ... seqpar train ...    gets --steps 2 appended (the last --steps wins)
# and SEQPAR_RUNS pointing into a temporary directory (where runs/ is named, it is replaced by it),
# so nothing is left in the working tree; SEQPAR_PEAK_GFLOPS=100 skips the start-up sgemm trials. The default job must leave its model, pictures and trace
# in its run directory. Also checks that "## Two commands" holds exactly two commands.
# Prints "N passed, N failed".
set -u
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"

section() { # the indented lines of README section $1, comments and blank lines removed
    awk -v h="## $1" '$0 == h { on = 1; next } on && /^## / { exit } on && /^    [^ ]/ { print }' README.md |
        sed -E 's/^    //; s/[[:space:]]+#.*$//'
}
mapfile -t quick < <(section "Quick start")
if [ "${#quick[@]}" -eq 5 ]; then ok; else bad "the quick start should hold five commands, found ${#quick[@]}: ${quick[*]}"; fi
mapfile -t two < <(section "Two commands")
if [ "${#two[@]}" -eq 2 ]; then ok; else bad "\"## Two commands\" should hold two commands, found ${#two[@]}: ${two[*]}"; fi
if [ "$(grep -n '^## ' README.md | head -n 1 | cut -d: -f2-)" = "## Quick start" ]; then ok; else bad "the README should open with its quick start"; fi

unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_rmaps_base_oversubscribe
# ... and Open MPI's start-up as a user's gets it (run_tests.sh skips the MTLs and a one-process
# run's daemon for speed): every MTL opened, the daemon forked
unset OMPI_MCA_mtl OMPI_MCA_ess_singleton_isolated
export SEQPAR_RUNS="$T/runs"
export SEQPAR_PEAK_GFLOPS=100 # no start-up sgemm measurement (seconds under load)
for cmd in "${quick[@]}"; do
    run=${cmd//runs\//$SEQPAR_RUNS/}
    envs=()
    case "$run" in
    "bash scripts/train.sh"*) envs=(STAGE1_STEPS=3 STAGE2_STEPS=2 STAGE2_SEQ_LEN=256) ;;
    *"seqpar train"*--help*) ;;
    *"seqpar train"*) run="$run --steps 2" ;;
    esac
    if env "${envs[@]}" timeout 300 bash -c "$run" >"$T/cmd.out" 2>&1; then ok; else
        bad "quick start '$cmd' failed: $(tail -n 3 "$T/cmd.out")"; continue; fi
    case "$cmd" in
    "bash scripts/train.sh"*)
        dir=$(ls -d "$SEQPAR_RUNS"/*/ | head -n 1)
        missing=""
        for f in train.jsonl stage1/train.jsonl model/config.json model/model.safetensors trace.json; do
            [ -s "$dir/$f" ] || missing="$missing $f"
        done
        if command -v gnuplot >/dev/null 2>&1; then
            for f in loss.png recall.png; do [ -s "$dir/$f" ] || missing="$missing $f"; done
        fi
        if [ -z "$missing" ] && grep -q "== done: log $dir" "$T/cmd.out"; then ok; else
            bad "the default job's run directory $dir lacks$missing (or its closing line): $(tail -n 2 "$T/cmd.out")"; fi
        if "$BUILD/tests/tool_check_trace" "$dir/trace.json" 2 compute >"$T/trace.out"; then ok; else bad "default job trace: $(cat "$T/trace.out")"; fi
        ;;
    esac
done
summary test_readme
