#!/usr/bin/env bash
# Fuzz smoke test: builds the libFuzzer targets (make fuzz, clang with ASan + UBSan into
# build-fuzz/) and runs each on a copy of its committed seed corpus (tests/fuzz/corpus/<target>/,
# regression inputs included) for FUZZ_SECONDS (default 4) seconds. Any crash, sanitizer report,
# leak, timeout or exit inside a loader fails the target; the finding is kept in $FUZZ_ARTIFACTS
# (default build-fuzz/artifacts/). Each target has a dictionary of its format's words
# (tests/fuzz/<name>.dict). Prints "N passed, N failed". Long runs: see README.
set -u
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-4}
ART=${FUZZ_ARTIFACTS:-build-fuzz/artifacts}
pass=0
fail=0
log=$(mktemp)
if ! make -s -j"$(nproc 2>/dev/null || echo 2)" fuzz >"$log" 2>&1; then
    echo "FAIL: make fuzz: $(tail -n 3 "$log") (scripts/install-deps.sh installs clang and libFuzzer)"
    echo "test_fuzz: 0 passed, 1 failed"
    rm -f "$log"
    exit 1
fi
rm -f "$log"
mkdir -p "$ART"
# Each target is one process on one thread, bounded by its own clock (-max_total_time): two run at
# once (one per core of the 2-core CI machine), each under its own timeout and with its own output,
# reported in order below.
JOBS=${FUZZ_JOBS:-2}
outs=$(mktemp -d)
fuzz_one() { # name: the run's output in $outs/name.out, its status in $outs/name.rc
    local name=$1 work dict rc
    work=$(mktemp -d)
    cp tests/fuzz/corpus/"$name"/* "$work"/ 2>/dev/null
    dict=tests/fuzz/${name#fuzz_}.dict
    timeout $((SECONDS_EACH + 60)) "build-fuzz/$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -dict="$dict" -artifact_prefix="$ART/$name-" -print_final_stats=1 "$work" >"$outs/$name.out" 2>&1
    rc=$?
    rm -rf "$work"
    echo $rc >"$outs/$name.rc"
}
names=()
for src in tests/fuzz/fuzz_*.c; do
    names+=("$(basename "$src" .c)")
    fuzz_one "${names[-1]}" &
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
done
wait
for name in "${names[@]}"; do
    out=$(cat "$outs/$name.out" 2>/dev/null)
    rc=$(cat "$outs/$name.rc" 2>/dev/null || echo 1)
    runs=$(printf '%s\n' "$out" | sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p')
    if [ "$rc" -eq 0 ] && [ -n "$runs" ]; then
        pass=$((pass + 1))
        echo "$name: ${runs} runs in ${SECONDS_EACH}s, no finding"
    else
        fail=$((fail + 1))
        echo "FAIL: $name (status $rc):"
        printf '%s\n' "$out" | grep -E 'ERROR|SUMMARY|runtime error|Test unit written|exited|deadly' | head -n 8
    fi
done
rm -rf "$outs"
echo "test_fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
