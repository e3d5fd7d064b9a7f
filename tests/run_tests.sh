#!/usr/bin/env bash
# Runs the whole test suite: every build/tests/test_* binary, the CLI, MPI and fuzz-smoke tests, each under a
# timeout (a hang is a failure); the kernel tests once more under every lower kernel path. Sums their
# "N passed, N failed" lines into one closing line and
# exits non-zero on any failure.
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Open MPI's point-to-point layer: ob1 (shared memory between the ranks of one machine) rather than
# probing UCX at every MPI_Init, ~0.2 s a launch here (the suite: 547 s -> 419 s on a 2-core Zen 3).
# The transport does not change what a test checks; a user's run keeps Open MPI's own choice.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
# Every process that calls MPI_Init opens the MTL components too, which only the cm pml uses (not
# ob1): PSM2's library calibrates its timer with ~500 short sleeps, ~0.15 s at each start; and a
# process started without mpirun (every one-process `seqpar train/grad/sample/...`, several hundred
# in the suite) forks a supporting daemon (orted) first, ~0.15 s more, that seqpar never uses (it
# spawns no processes). Together: a `seqpar --help` 0.40 s -> 0.04 s here. Neither changes what a
# test checks; test_readme runs the README's commands without both, as a user's shell would.
export OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2}
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
# No start-up sgemm trials for the MFU peak in every `seqpar train` (~2 s a run alone, several
# seconds a rank under mpirun on 2 cores): --peak-gflops' default. test_cli and test_bf16 unset it
# where they check the measured peaks (fp32 and bf16).
export SEQPAR_PEAK_GFLOPS=${SEQPAR_PEAK_GFLOPS:-100}
# Open MPI's session directories under this run's own temporary directory: every MPI job of a user on
# a host shares /tmp/ompi.HOST.UID, and where two suites (or a suite and another MPI job) run at once
# a start-up now and then fails to make its directory there ("orte_session_dir failed"), which a
# test would read as a refusal. The directory does not change what a test checks.
ompi_tmp=""
if [ -z "${OMPI_MCA_orte_tmpdir_base:-}" ]; then
    ompi_tmp=$(mktemp -d)
    export OMPI_MCA_orte_tmpdir_base=$ompi_tmp
fi
total_pass=0
total_fail=0
marker=$(mktemp) # run directories made after it in the working tree's runs/: a train run without --log
# where a test keeps a run another test makes again with the same command (tests/lib.sh, run_shared)
SEQPAR_TEST_SHARED=$(mktemp -d)
export SEQPAR_TEST_SHARED
trap 'rm -rf "$marker" "$SEQPAR_TEST_SHARED" ${ompi_tmp:+"$ompi_tmp"}' EXIT
run_one() { # name, timeout seconds, command...
    local name=$1 limit=$2
    shift 2
    local out rc t0=$SECONDS
    out=$(timeout "$limit" "$@" 2>&1)
    rc=$?
    local line
    line=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_]*:? ?[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    local p f
    p=$(printf '%s' "$line" | sed -E 's/^(.*[^0-9])?([0-9]+) passed, ([0-9]+) failed$/\2/')
    f=$(printf '%s' "$line" | sed -E 's/^(.*[^0-9])?([0-9]+) passed, ([0-9]+) failed$/\3/')
    [ -n "$p" ] || p=0
    [ -n "$f" ] || f=0
    if [ "$rc" -eq 124 ]; then
        echo "$name: TIMED OUT after ${limit}s"
        f=$((f + 1))
    elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "$name: exited with status $rc"
        f=$((f + 1))
    fi
    if [ "$f" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then printf '%s\n' "$out" | grep -vE 'passed, [0-9]+ failed$' | tail -n 40; fi
    echo "$name: $p passed, $f failed ($((SECONDS - t0)) s)"
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
}
for t in "$BUILD"/tests/test_*; do
    case "$t" in *.d) continue ;; esac
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" 300 "$t"
done
# Every kernel path this CPU runs (kernels/isa.h): the loop above ran the best one; the kernel tests
# run again under each lower path, forced with SEQPAR_ISA. (amx, where the CPU has it, is avx512 plus
# AMX tiles; the AMX kernel on the C emulation of its instructions runs in test_attention_bf16 on
# every CPU with AVX512_BF16.)
paths=$("$BUILD"/tests/test_isa --supported 2>/dev/null)
best=$(printf '%s\n' "$paths" | tail -n 1)
# Where the best path is amx, the avx512 path differs from it in the bf16 kernels alone (the bf16
# attention's AMX tiles, oneDNN's bf16 GEMM): every fp32 kernel, attention tiles included, is the one
# the best run ran. There the avx512 run of the attention tests also takes the first tile set of the
# loop below (SEQPAR_ATTN_TILES sets the fp32 tiles only; the bf16 attention keeps its own), which
# then does not run again under the best path, and test_optim (AdamW, fp32 only) does not run again:
# every pair of kernel and tiles the runs below covered is still covered, by one run fewer each.
merged=
[ "$best" = amx ] && printf '%s\n' "$paths" | grep -qx avx512 && merged=40,24,24,40
for isa in $paths; do
    [ "$isa" = "$best" ] && continue
    for t in test_attention test_packed_attention test_ops test_optim test_model test_bf16; do
        [ -x "$BUILD/tests/$t" ] || continue
        if [ "$isa" = avx512 ] && [ -n "$merged" ]; then
            case $t in
            test_optim) continue ;;
            test_attention | test_packed_attention)
                run_one "${t}[$isa, tiles $merged]" 300 env SEQPAR_ISA="$isa" SEQPAR_ATTN_TILES="$merged" "$BUILD/tests/$t"
                continue ;;
            esac
        fi
        run_one "$t[$isa]" 300 env SEQPAR_ISA="$isa" "$BUILD/tests/$t"
    done
done
# The fp32 attention tiles (kernels/isa.h): the attention tests once more under other tile sizes than this
# CPU's (SEQPAR_ATTN_TILES): small ones that neither micro-kernel shape divides, and the AVX2 path's other set
# (its small-L2 tiles where this L2 is large, its own where it is small)
l2=$(getconf LEVEL2_CACHE_SIZE 2>/dev/null || echo 0)
other=192,120,144,120
[ "${l2:-0}" -gt 0 ] && [ "$l2" -lt 1048576 ] && other=256,192,144,120
for tiles in 40,24,24,40 "$other"; do
    [ "$tiles" = "$merged" ] && continue # run with the avx512 path above
    for t in test_attention test_packed_attention; do
        [ -x "$BUILD/tests/$t" ] && run_one "$t[tiles $tiles]" 300 env SEQPAR_ATTN_TILES="$tiles" "$BUILD/tests/$t"
    done
done
# the C emulation of the AMX instructions runs where the CPU has AVX512_BF16 (the tiles' packers)
amx_note='; the AMX kernel ran emulated in test_attention_bf16'
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null || amx_note='; nor its C emulation, which needs AVX512_BF16'
for isa in scalar avx2 avx512 amx; do
    printf '%s\n' "$paths" | grep -qx "$isa" || echo "kernel path $isa: this CPU cannot run it (not tested here$([ "$isa" = amx ] && echo "$amx_note"))"
done
echo "kernel paths tested: $(printf '%s ' $paths)(best: $best, used by every other test)"
run_one test_cli 600 bash tests/test_cli.sh "$BUILD"
run_one test_mpi 900 bash tests/test_mpi.sh "$BUILD"
run_one test_bf16.sh 600 bash tests/test_bf16.sh "$BUILD"
run_one test_pack 300 bash tests/test_pack.sh "$BUILD"
run_one test_eval 300 bash tests/test_eval.sh "$BUILD"
run_one test_sample_dist 300 bash tests/test_sample_dist.sh "$BUILD"
run_one test_prefix_cache 120 bash tests/test_prefix_cache.sh "$BUILD"
run_one test_sample_bf16 120 bash tests/test_sample_bf16.sh "$BUILD"
run_one test_sample_memory 120 bash tests/test_sample_memory.sh "$BUILD"
run_one test_zero 600 bash tests/test_zero.sh "$BUILD"
run_one test_offload_optimizer 300 bash tests/test_offload_optimizer.sh "$BUILD"
run_one test_memory_model 300 bash tests/test_memory_model.sh "$BUILD"
run_one test_plan 300 bash tests/test_plan.sh "$BUILD"
run_one test_paper_loongtrain 300 bash tests/test_paper_loongtrain.sh "$BUILD"
run_one test_auto 120 bash tests/test_auto.sh "$BUILD"
run_one test_dry_run 120 bash tests/test_dry_run.sh "$BUILD"
run_one test_reliability 300 bash tests/test_reliability.sh "$BUILD"
run_one test_data 600 bash tests/test_data.sh "$BUILD"
run_one test_fuzz 600 bash tests/test_fuzz.sh
run_one test_progress 300 bash tests/test_progress.sh "$BUILD"
run_one test_readme 600 bash tests/test_readme.sh "$BUILD"
run_one test_layers 120 bash tests/test_layers.sh "$BUILD"
# no test may leave a run directory in the working tree (each gives train --log or $SEQPAR_RUNS)
left=$(find runs -mindepth 1 -maxdepth 1 -newer "$marker" 2>/dev/null | wc -l)
if [ "$left" -eq 0 ]; then total_pass=$((total_pass + 1)); echo "working tree: 1 passed, 0 failed"
else total_fail=$((total_fail + 1)); echo "working tree: 0 passed, 1 failed: $left run directories left in runs/ (a train run without --log)"; fi
echo
echo "suite time: $SECONDS s"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
