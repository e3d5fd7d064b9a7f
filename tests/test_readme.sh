#!/usr/bin/env bash
# The README and docs/ run as written.
# 1. The README's quick start: takes the indented command lines of its "## Quick start" section (there
#    must be five) and runs each from the repository root, as whoever runs the suite (root too: the
#    Open MPI root permission the other tests export is removed first), with few steps:
#      bash scripts/train.sh   gets STAGE1_STEPS=3 STAGE2_STEPS=2 STAGE2_SEQ_LEN=256 in its environment
#      ... seqpar train ...    gets --steps 2 appended (the last --steps wins)
#    and SEQPAR_RUNS pointing into a temporary directory (where runs/ is named, it is replaced by it),
#    so nothing is left in the working tree; SEQPAR_PEAK_GFLOPS=100 skips the start-up sgemm trials.
#    The default job must leave its model, pictures and trace in its run directory. Also checks that
#    "## Two commands" holds exactly two commands.
# 2. Every other command the README and docs/*.md show: the 4-space-indented lines outside ```
#    fences (a line ending in '\' continues on the next; a trailing '# comment' is dropped) run as
#    written, in order (the README, then docs/ by name; a command shown on two pages runs once), in
#    a scratch directory holding links to the checkout's build (the BUILD given), scripts, tests,
#    tools, bench, docs and README.md, so what they write (runs/, data/, checkpoints) stays out of
#    the working tree. Examples not meant to run here (a Slurm
#    script, many nodes) are ```bash fences: every seqpar or make_shards.py line there must name a
#    command and only flags its --help lists.
# 3. The pages hold together: the README at most 400 lines and opening with its quick start, every
#    relative link (and #anchor) resolving, every flag of every `seqpar CMD --help` in docs/cli.md,
#    every SEQPAR_ variable the sources read in docs/environment.md and docs/.help_footer.txt (at
#    most 16 lines of at most 100 columns).
# 4. The README's "Adding a strategy" example is tests/plugin/example.c as it is.
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

# ---- 2. every other command of the README and docs/, as written
ROOT=$(pwd)
BUILD_ABS=$(cd "$BUILD" && pwd)
pages=(README.md docs/*.md)
doc_tool() { # the page helper (python3): commands | examples | pages
    python3 - "$@" <<'PY'
import os, re, subprocess, sys

def blocks(path):
    """(runnable commands, bash-fence example lines) of a page"""
    cmds, examples, fence, lang, section, cur = [], [], False, "", "", None
    skip_sections = {"## Quick start", "## Two commands"} if os.path.basename(path) == "README.md" else set()
    for raw in open(path, encoding="utf-8").read().split("\n"):
        if raw.startswith("```"):
            fence, lang = (not fence), raw[3:].strip()
            cur = None
            continue
        if fence:
            if lang == "bash":
                line = raw.strip()
                if cur is not None:
                    examples[-1] = examples[-1][:-1] + " " + line
                elif line and not line.startswith("#"):
                    examples.append(line)
                cur = 1 if examples and examples[-1].endswith("\\") else None
            continue
        if raw.startswith("## "):
            section = raw
        if section in skip_sections:
            continue
        if raw.startswith("    ") and raw.strip():
            line = re.sub(r"\s+#\s.*$", "", raw.strip())
            if cur is not None:
                cmds[-1] = cmds[-1][:-1].rstrip() + " " + line
            else:
                cmds.append(line)
            cur = 1 if cmds[-1].endswith("\\") else None
        else:
            cur = None
    return cmds, examples

def helptext(seqpar, cmd):
    if cmd == "make_shards.py":
        args = ["python3", "scripts/make_shards.py", "--help"]
    else:
        args = [seqpar] + ([cmd, "--help"] if cmd else ["--help"])
    out = subprocess.run(args, capture_output=True, text=True).stdout
    if cmd in ("memory", "plan"):
        out += subprocess.run([seqpar, "train", "--help"], capture_output=True, text=True).stdout
    return out

def check_example(seqpar, page, line, helps):
    """'' or what is wrong with an example line"""
    for m in re.finditer(r"make_shards\.py([^)|;&]*)", line):
        h = helps.setdefault("make_shards.py", helptext(seqpar, "make_shards.py"))
        for f in re.findall(r"(?:^|\s)(--[a-z0-9-]+)", m.group(1)):
            if not re.search(re.escape(f) + r"(?![a-z0-9-])", h):
                return f"make_shards.py has no {f}"
    bare = re.sub(r"\$\([^)]*\)", "", line)
    m = re.search(r"(?:^|[\s/])seqpar\s+([a-z]+)((?:\s.*)?)$", bare)
    if not m:
        return ""
    cmd, rest = m.group(1), m.group(2)
    if cmd not in ("train", "grad", "sample", "bench", "memory", "plan", "strategies", "calibrate", "help"):
        return f"seqpar has no command '{cmd}'"
    h = helps.setdefault(cmd, helptext(seqpar, cmd))
    for f in re.findall(r"(?:^|\s)(--[a-z0-9-]+)", rest):
        if not re.search(re.escape(f) + r"(?![a-z0-9-])", h):
            return f"'seqpar {cmd}' has no {f}"
    return ""

def slug(h):
    h = re.sub(r"[^\w\- ]", "", h.strip().lower())
    return h.replace(" ", "-")

def anchors(path):
    out, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out

mode, seqpar, pages = sys.argv[1], sys.argv[2], sys.argv[3:]
if mode == "commands":  # NUL-separated: page, command, page, command, ...
    for p in pages:
        for c in blocks(p)[0]:
            sys.stdout.write(p + "\0" + c + "\0")
elif mode == "examples":
    helps = {}
    for p in pages:
        for line in blocks(p)[1]:
            why = check_example(seqpar, p, line, helps)
            print(("BAD " + p + ": example '" + line[:90] + "': " + why) if why else "OK")
elif mode == "pages":
    readme = open("README.md", encoding="utf-8").read().split("\n")
    n = len(readme) - (readme[-1] == "")
    print("OK" if n <= 400 else f"BAD README.md has {n} lines, more than 400")
    for p in pages + ["CHANGELOG.md", "bench/README.md"]:
        text = re.sub(r"```.*?```", "", open(p, encoding="utf-8").read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(p), file)) if file else p
            if not os.path.exists(dest):
                print(f"BAD {p}: link to {target}: no such file")
            elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
                print(f"BAD {p}: link to {target}: no such heading")
            else:
                print("OK")
    cli = open("docs/cli.md", encoding="utf-8").read()
    for cmd in ("", "train", "grad", "sample", "bench", "memory", "plan", "strategies"):
        for f in sorted(set(re.findall(r"--[a-z0-9][a-z0-9-]*", helptext(seqpar, cmd)))):
            if f in ("--tokenizer", "--encode"):  # make_shards.py's, named in sample's help
                continue
            ok = re.search(re.escape(f) + r"(?![a-z0-9-])", cli)
            print("OK" if ok else f"BAD docs/cli.md lacks {f} of 'seqpar {cmd} --help'")
    env_doc = open("docs/environment.md", encoding="utf-8").read()
    footer = open("docs/.help_footer.txt", encoding="utf-8").read()
    lines = footer.rstrip("\n").split("\n")
    print("OK" if len(lines) <= 16 and max(map(len, lines)) <= 100 else
          f"BAD docs/.help_footer.txt: {len(lines)} lines, widest {max(map(len, lines))} columns (at most 16, 100)")
    names = set()
    for d, _, files in os.walk("src"):
        for f in files:
            if f.endswith((".c", ".h")):
                names |= set(re.findall(r'"(SEQPAR_[A-Z0-9_]+)"', open(os.path.join(d, f), encoding="utf-8").read()))
    print("OK" if names else "BAD no SEQPAR_ variable found in src/")
    for v in sorted(names):
        for where, text in (("docs/environment.md", env_doc), ("docs/.help_footer.txt", footer)):
            print("OK" if re.search(v + r"(?![A-Z0-9_])", text) else f"BAD {where} lacks {v}, which src/ reads")
PY
}
tally() { # OK / BAD lines of doc_tool to ok / bad
    while IFS= read -r line; do
        case "$line" in OK) ok ;; BAD*) bad "${line#BAD }" ;; *) bad "doc tool: $line" ;; esac
    done
}
tally < <(doc_tool pages "$BUILD/seqpar" "${pages[@]}" 2>&1)
tally < <(doc_tool examples "$BUILD/seqpar" "${pages[@]}" 2>&1)
mapfile -d '' -t docs_cmds < <(doc_tool commands "$BUILD/seqpar" "${pages[@]}")
if [ "${#docs_cmds[@]}" -ge 40 ]; then ok; else bad "the pages show $((${#docs_cmds[@]} / 2)) commands to run, expected at least 20"; fi
dir="$T/pages"
mkdir -p "$dir"
ln -s "$BUILD_ABS" "$dir/build"
for f in scripts tests tools bench docs README.md CHANGELOG.md; do ln -s "$ROOT/$f" "$dir/$f"; done
declare -A done_cmds=()
for ((i = 0; i < ${#docs_cmds[@]}; i += 2)); do
    page=${docs_cmds[i]} cmd=${docs_cmds[i + 1]}
    [ -n "${done_cmds[$cmd]:-}" ] && continue # shown on two pages: run once (what it made is there)
    done_cmds[$cmd]=1
    if [[ "$cmd" == *plot_run.sh* ]] && ! command -v gnuplot >/dev/null 2>&1; then
        echo "note: $page: '$cmd' not run (no gnuplot here)"
        continue
    fi
    if (cd "$dir" && timeout 120 bash -c "$cmd") >"$T/cmd.out" 2>&1; then ok; else
        bad "$page: '$cmd' failed: $(tail -n 3 "$T/cmd.out")"; fi
done
# 4. The "Adding a strategy" walk-through shows tests/plugin/example.c as it is (after its opening
#    comment): the file test_plugin compiles and checks, so the README's example builds and runs.
shown=$(awk '/^## Adding a strategy/ { on = 1 } on && /^```c$/ { f = 1; next } f && /^```$/ { exit } f { print }' README.md)
file=$(awk 'done || !/^( \*|\/\*)/ { done = 1; print }' tests/plugin/example.c)
if [ -n "$shown" ] && [ "$shown" = "$file" ]; then ok; else
    bad "the README's \"Adding a strategy\" example differs from tests/plugin/example.c: $(diff <(printf '%s\n' "$shown") <(printf '%s\n' "$file") | head -n 6)"; fi
summary test_readme
