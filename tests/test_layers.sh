#!/usr/bin/env bash
# The source tree's architecture, checked (src/README.md):
#   1. every #include "x/y.h" of src/ goes down the floors (or stays in its own folder);
#   2. no circle of includes between modules (x.c and x.h are one module), found by tsort;
#   3. no command of src/cli/ includes another command's file;
#   4. no strategy is named outside src/strategies/ (its own file and the registry's list): no
#      string literal "NAME" and no word NAME, in code or comments, of a registered strategy;
#   5. every SEQPAR_* environment variable the code reads is listed by `seqpar --help` and in
#      docs/environment.md;
#   6. every folder of src/ has a README.md saying what lives there and what it may include;
#   7. no comment in src/ tells history ("until 2026-11-29 it ...": CHANGELOG.md holds it);
#   8. a folder's private header (model/activations.h) is included only inside its folder;
#   9. no layer above the strategies reads a strategy's knob (team, chunks) by name.
# Prints "N passed, N failed"; exits non-zero on any failure.
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

floor_of() { # folder -> floor (bottom = 1)
    case "$1" in
    core) echo 1 ;; kernels) echo 2 ;; memory | attention | optim) echo 3 ;; model) echo 4 ;;
    io) echo 5 ;; data | parallel) echo 6 ;; strategies) echo 7 ;; plan | bench) echo 8 ;;
    train) echo 9 ;; cli) echo 10 ;; *) echo 0 ;;
    esac
}

# 1. includes go down
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for f in src/*/*.c src/*/*.h; do
    dir=${f#src/}
    dir=${dir%%/*}
    from=$(floor_of "$dir")
    if [ "$from" -eq 0 ]; then bad "$f: folder src/$dir/ has no floor in tests/test_layers.sh (add it to floor_of and src/README.md)"; continue; fi
    mod=${f%.*}
    mod=${mod#src/}
    while read -r inc; do
        [ -n "$inc" ] || continue
        tdir=${inc%%/*}
        [ "$tdir" = "$inc" ] && continue # same-folder include without a folder: none in this tree
        to=$(floor_of "$tdir")
        if [ "$tdir" != "$dir" ] && [ "$to" -ge "$from" ]; then
            bad "$f includes $inc: src/$tdir/ (floor $to) is not below src/$dir/ (floor $from)"
        else
            ok
        fi
        tmod=${inc%.h}
        [ "$tmod" != "$mod" ] && printf '%s %s\n' "$tmod" "$mod" >>"$edges"
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
done

# 2. no circles between modules
if loop=$(tsort "$edges" 2>&1 >/dev/null) && [ -z "$loop" ]; then ok
else bad "a circle of includes: $(printf '%s' "$loop" | tr '\n' ' ')"; fi

# 3. commands do not include each other
for f in src/cli/cmd_*.c; do
    if grep -q '#include "cli/cmd_' "$f"; then bad "$f includes another command's file"; else ok; fi
done

# 4. strategy names stay in src/strategies/
#    (names that are also common words of the field, ring, 2d and allgather, only as literals)
names=$("$BUILD"/seqpar strategies --names 2>/dev/null)
[ -n "$names" ] || bad "$BUILD/seqpar strategies --names listed no strategies"
for word in $names; do
    hits=
    case "$word" in ring | 2d | allgather) ;; *)
        hits=$(grep -rniw --include=*.c --include=*.h -- "$word" src | grep -v '^src/strategies/' || true) ;;
    esac
    lits=$(grep -rn --include=*.c --include=*.h -- "\"$word\"" src | grep -v "^src/strategies/" | grep -v "^src/parallel/comm.c:" || true)
    if [ -n "$hits$lits" ]; then
        bad "strategy '$word' named outside src/strategies/: $(printf '%s\n%s' "$hits" "$lits" | grep . | head -n 5 | tr '\n' ' ')"
    else
        ok
    fi
done

# 5. every tuning knob visible: each SEQPAR_* variable the code reads is in `seqpar --help`'s footer
#    and in docs/environment.md's table
help=$("$BUILD"/seqpar --help 2>&1)
for v in $(grep -rhoE 'getenv\("SEQPAR_[A-Z0-9_]+"' src | sed -E 's/.*"(SEQPAR_[A-Z0-9_]+)"/\1/' | sort -u); do
    if printf '%s' "$help" | grep -q "$v" && grep -q "$v" docs/environment.md 2>/dev/null; then ok
    else bad "$v is read by src/ but missing from seqpar --help's footer or docs/environment.md"; fi
done

# 7. comments say what the code does, not when it changed: no "until / before / since <date>" in src/
hist=$(grep -rnE '(until|before|since) 20[0-9]{2}-[01][0-9]-[0-3][0-9]' src --include=*.c --include=*.h || true)
if [ -z "$hist" ]; then ok; else bad "history in comments (CHANGELOG.md holds it): $(printf '%s' "$hist" | head -n 3 | tr '\n' ' ')"; fi

# 6. every folder says what it is for
for d in src/*/; do
    if [ -s "$d/README.md" ]; then ok; else bad "$d has no README.md"; fi
done
[ -s src/README.md ] && ok || bad "src/README.md is missing"

# 8. private headers stay in their folder
for h in model/activations.h; do
    outside=$(grep -rl "#include \"$h\"" src tests | grep -v "^src/${h%%/*}/" || true)
    if [ -z "$outside" ]; then ok; else bad "$h is private to src/${h%%/*}/ but included by: $(printf '%s' "$outside" | tr '\n' ' ')"; fi
done

# 9. a strategy's knobs are read through the registry above the strategies: no file of src/plan,
#    src/bench, src/train or src/cli reads the team or chunk count of StrategyParams or
#    ParallelConfig by name (.team, ->team, .chunks, ->chunks)
knob_reads=$(grep -rnE '(\.|->)(team|chunks)\b' src/plan src/bench src/train src/cli --include='*.c' --include='*.h' || true)
if [ -z "$knob_reads" ]; then ok; else bad "a strategy's knob read by name outside src/strategies/: $(printf '%s' "$knob_reads" | head -n 3)"; fi

echo "test_layers: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
