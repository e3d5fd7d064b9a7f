# Shared by the shell test scripts (sourced, not run): paths, a temporary directory removed on
# exit, pass/fail counters and the closing "N passed, N failed" line. Expects BUILD to be set.
SEQPAR="$BUILD/seqpar"
CMP="$BUILD/tests/tool_compare_safetensors"
FIX=tests/fixtures
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# "step loss" pairs of a training JSONL log
losses() { sed -nE 's/.*"step": ([0-9]+), "loss": ([^,]+),.*/\1 \2/p' "$1"; }
# Prints the closing line for test NAME and returns non-zero on any failure.
summary() {
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}

# For the multi-rank scripts: mpirun as root, more ranks than cores, one thread per rank; every
# mpirun under a timeout so that a hang is a failure. When a rank exits non-zero, mpirun signals the
# others and then waits odls_base_sigkill_timeout (default 1 s) before SIGKILL: a second of idle
# time at each of the ~55 expected one-line errors of the multi-rank tests. Those errors end every
# rank through die_collective, whose MPI_Finalize is a fence: every rank has printed its line before
# any exits, so the wait keeps nothing a test reads (without it a rank that printed only after
# another exited would be caught, not missed). test_reliability, whose watchdog and signal cases end
# ranks otherwise, keeps the default.
# f32_maxdiff A B: two float32 files (little-endian, as --prompt-logits writes them) compared value by
# value: "largest |a - b|, largest |b|, values compared"
f32_maxdiff() {
    paste <(od -An -v -f -w4 "$1") <(od -An -v -f -w4 "$2") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; a = $2 < 0 ? -$2 : $2; if (a > r) r = a }
             END { printf "%g %g %d\n", m, r, NR }'
}
mpi_test_env() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
    export OMP_NUM_THREADS=1
}
run_np() { local np=$1; shift; timeout 240 mpirun --oversubscribe -np "$np" "$@"; }

# run_shared LOG OUT command...: runs the command (its --log is LOG, a new file; its stdout and
# stderr go to OUT) and returns its status. Where the suite runner gave the tests a shared directory
# ($SEQPAR_TEST_SHARED) and another test ran the same command (LOG aside) under the same
# environment to a successful end, its log and output are copied instead: the same command writes
# the same files (a configuration two scripts each check, e.g. test_mpi's and test_zero's 2- and
# 8-rank training runs). Run alone, a script runs every command itself.
run_shared() {
    local log=$1 out=$2 a key d rc
    shift 2
    if [ -z "${SEQPAR_TEST_SHARED:-}" ] || [ ! -d "$SEQPAR_TEST_SHARED" ] || [ -e "$log" ]; then "$@" >"$out" 2>&1; return; fi
    key=$( { for a in "$@"; do [ "$a" = "$log" ] && a=@LOG; printf '%s\n' "$a"; done
             env | grep -E '^(OMP_|OMPI_|SEQPAR_)' | grep -v '^SEQPAR_TEST_SHARED=' | LC_ALL=C sort; } | md5sum | cut -c1-32)
    d="$SEQPAR_TEST_SHARED/$key"
    if [ -f "$d/done" ]; then cp "$d/log" "$log" && cp "$d/out" "$out"; return; fi
    "$@" >"$out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ -f "$log" ] && mkdir -p "$d" && cp "$log" "$d/log" && cp "$out" "$d/out"; then touch "$d/done"; fi
    return $rc
}

# `seqpar grad` on np ranks with the given flags must print the single-process loss (1e-6
# relative) and write the single-process gradient file, and the HF fixture's where it was made at
# this length (a directory without expected.json has none).
# same_sample_on_ranks WHAT ONE "NP STRATEGY FLAGS..."...: `seqpar sample "${SMP[@]}" --strategy
# STRATEGY FLAGS` on NP ranks prints ONE (one process's text, more than 64 bytes), for each case
same_sample_on_ranks() {
    local what=$1 one=$2 c np got
    shift 2
    for c in "$@"; do
        set -- $c
        np=$1
        shift
        got=$(run_np "$np" "$SEQPAR" sample "${SMP[@]}" --strategy "$@" 2>/dev/null)
        if [ ${#one} -gt 64 ] && [ "$got" = "$one" ]; then ok; else bad "$what on $np ranks ($*): '$got', one process '$one'"; fi
    done
}

grad_case() { # fixture seq_len np flags...
    local f=$1 S=$2 np=$3
    shift 3
    local ref="$T/$f.$S.single"
    if [ ! -f "$ref" ]; then
        timeout 60 "$SEQPAR" grad --model "$FIX/$f" --tokens "$FIX/$f/tokens.bin" --seq-len "$S" --out "$ref" >"$ref.out" 2>&1
    fi
    local out
    out=$(run_np "$np" "$SEQPAR" grad --model "$FIX/$f" --tokens "$FIX/$f/tokens.bin" --seq-len "$S" --out "$T/dist" "$@" 2>&1)
    local rc=$?
    local want got
    want=$(sed -nE 's/^loss: (.*)$/\1/p' "$ref.out")
    got=$(printf '%s\n' "$out" | sed -nE 's/^loss: (.*)$/\1/p')
    if [ $rc -ne 0 ]; then bad "grad $f np $np $*: status $rc: $(printf '%s' "$out" | tail -n 2)"; return; fi
    if awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-6 * b) }'; then ok; else
        bad "grad $f np $np $*: loss $got, single process $want"; fi
    # fp32 sums in another order: 1e-4 of each tensor's scale (seen: ~1e-6)
    if "$CMP" "$T/dist" "$ref" 1e-4 1e-7 >/dev/null; then ok; else bad "grad $f np $np $*: $("$CMP" "$T/dist" "$ref" 1e-4 1e-7)"; fi
    # the HF fixture where it was made at this length
    if grep -qs "\"seq_len\": $S," "$FIX/$f/expected.json"; then
        if "$CMP" "$T/dist" "$FIX/$f/grads.safetensors" 1e-4 1e-7 >/dev/null; then ok; else bad "grad $f np $np $*: differs from the HF fixture"; fi
    fi
}
