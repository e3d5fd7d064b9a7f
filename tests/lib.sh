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
