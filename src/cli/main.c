/* seqpar: the command-line entry point. Initialises MPI (a single process runs without
 * mpirun) and dispatches to a subcommand. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "train/run_control.h"
#include "parallel/comm.h"
#include "parallel/optimizer_offload.h"
#include "core/common.h"
#include "attention/flash_attention.h"
#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/sgemm.h"

static const char USAGE[] =
    "usage: seqpar <command> [options]\n"
    "\n"
    "Long-context Llama training with sequence parallelism.\n"
    "\n"
    "commands:\n"
    "  train   train a model (default: a small model on the built-in associative-recall task)\n"
    "  grad    one forward and backward on a token file; prints the loss, writes every gradient\n"
    "  bench   attention, training-step and memory benchmarks against same-run sgemm\n"
    "  strategies  the distributed attention strategies, their flags, constraints and formulas\n"
    "  sample  generate text (or tokens) from a trained model: greedy, temperature, top-k\n"
    "  eval    a model's loss and perplexity by position (and recall accuracy) on token data, forward only\n"
    "  memory  the memory one training step with train's flags would hold, per rank and component\n"
    "  plan    the strategy, grid, checkpoint mode and ZeRO stage to train with on a given cluster\n"
    "  calibrate  measure this machine (under mpirun: its ranks and nodes) into a cluster file\n"
    "\n"
    "'seqpar <command> --help' (or -h, or 'seqpar help <command>') describes each command's options.\n"
    "\n"
    "environment (none needed; docs/environment.md):\n"
    "  SEQPAR_ISA=scalar|avx2|avx512|amx   kernel path (default: the best this CPU runs)      tuning\n"
    "  SEQPAR_ATTN_TILES=fq,fk,bk,bq       fp32 attention tiles (default: by the L2 per core) tuning\n"
    "  SEQPAR_ATTN_DQ_SLOTS=N              backward dq slots, 1..1024 (default: 2 per thread) tuning\n"
    "  SEQPAR_SGEMM=onednn|openblas        fp32 GEMM library (default onednn)                 tuning\n"
    "  SEQPAR_BLAS_CORE=keep|auto          OpenBLAS core check off, or over OPENBLAS_CORETYPE  tuning\n"
    "  SEQPAR_PEAK_GFLOPS=X                MFU peak, --peak-gflops' default (default: measured)\n"
    "  SEQPAR_RUNS=DIR                     where run directories go (default runs)\n"
    "  SEQPAR_CACHE=DIR                    make_shards.py's tokenizers venv (~/.cache/seqpar)\n"
    "  SEQPAR_THIS_MACHINE=FILE            calibrate --save's file, the preset this-machine\n"
    "  SEQPAR_ATTN_BWD_ROWS=R              attention backward in passes of R rows         diagnostic\n"
    "  SEQPAR_CHECK_ROUNDED=1              check operands marked as bf16 values           diagnostic\n"
    "  test only: SEQPAR_FAULT_NONFINITE, SEQPAR_FAULT_HANG, SEQPAR_CKPT_NO_RENAME_EXCHANGE,\n"
    "             SEQPAR_COMM_PIECE, SEQPAR_OPT_OFFLOAD_CHUNK, SEQPAR_PLAN_PLAY_ALL\n"
    "  internal: SEQPAR_BLAS_REEXEC (set by seqpar's OpenBLAS re-execution)\n";

/* --comm-timeout's value on the command line before MPI starts (the real parser checks it later):
 * the default where absent or not a number >= 0. */
static double comm_timeout_from_args(int argc, char **argv) {
    double t = COMM_DEFAULT_TIMEOUT_S;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--comm-timeout") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--comm-timeout=", 15)) v = argv[i] + 15;
        if (!v) continue;
        char *end = NULL;
        const double x = strtod(v, &end);
        if (end != v && !*end && x >= 0) t = x;
    }
    return t;
}

/* The arguments after argv[0] but --offload-dir and its value, space-separated (xmalloc'd) */
static char *args_text(int argc, char **argv) {
    size_t n = 1;
    for (int i = 1; i < argc; i++) n += strlen(argv[i]) + 1;
    char *out = xmalloc(n), *p = out;
    *p = '\0';
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--offload-dir")) { i++; continue; }
        if (!strncmp(argv[i], "--offload-dir=", 14)) continue;
        p += sprintf(p, "%s%s", p == out ? "" : " ", argv[i]);
    }
    return out;
}

/* Every rank must run the same command: ranks started with different flags (an MPMD line, a
 * per-node wrapper script) would call different collectives and wait on each other until the
 * watchdog, which can only blame a stopped rank. Compared once after MPI starts, over the
 * arguments but --offload-dir (a node-local path); the first rank that differs from rank 0 ends
 * every rank with one line quoting both command lines. The exchange that finds every rank here
 * runs under the ranks' error-exchange deadline (die_if_any_rank), the rest after it. */
static void die_unless_same_command(int argc, char **argv) {
    int size = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size <= 1) return;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    die_if_any_rank(NULL); /* every rank is here (or the deadline's one line) */
    char *text = args_text(argc, argv);
    unsigned long long h = 1469598103934665603ull, h0; /* FNV-1a */
    for (const char *c = text; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h0 = h;
    MPI_Bcast(&h0, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    int differs = h != h0 ? rank : size;
    MPI_Allreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (differs == size) {
        xfree(text);
        return;
    }
    char first[400], other[400]; /* each quoted up to 399 characters */
    snprintf(first, sizeof first, "%s", text);
    snprintf(other, sizeof other, "%s", text);
    xfree(text);
    MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(other, (int)sizeof other, MPI_CHAR, differs, MPI_COMM_WORLD);
    die_collective("rank %d was started with other arguments than rank 0: every rank must run the same seqpar "
                   "command (--offload-dir alone may differ); rank 0: 'seqpar %s', rank %d: 'seqpar %s'",
                   differs, first, differs, other);
}

/* train's stop signals before any shared library initialises: the dynamic linker runs the
 * executable's .preinit_array before every library's constructors (OpenBLAS, oneDNN, OpenMP, MPI:
 * 5-10 ms per rank here), which all run before main(); a SIGUSR1 or SIGTERM that arrived then took
 * the default action (the rank died by the signal, no checkpoint, no "stopped by" line for a
 * requeueing wrapper). main() installs them again (the same handlers). */
static void stop_signals_preinit(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc >= 2 && argv && argv[1] && !strcmp(argv[1], "train")) stop_signals_install();
}
__attribute__((used, section(".preinit_array"))) static void (*const preinit_stop_signals)(int, char **, char **) =
    stop_signals_preinit;

/* Started without a launcher, seqpar is an MPI singleton that talks to no other process: unless
 * the user set them, Open MPI starts it without forking its daemon first (ess_singleton_isolated:
 * no MPI_Comm_spawn, which seqpar never calls), on the shared-memory point-to-point layer (pml ob1,
 * not UCX's network probe) and without the MTLs that serve only the cm layer (PSM2's library
 * calibrated its timer with ~500 sleeps): 0.3-0.5 s of idle at every start of a one-process
 * train, grad, bench or sample (docs/reliability.md). Under mpirun or srun nothing is changed. */
static void singleton_mpi_defaults(void) {
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
    setenv("OMPI_MCA_mtl", "^ofi,psm,psm2", 0);
}

static int is_help_word(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

int main(int argc, char **argv) {
    int provided = 0;
    /* a write past a file size limit (ulimit -f) fails with EFBIG and takes the writers' error path
     * (one line, no temporary left, the old checkpoint kept) instead of SIGXFSZ killing the rank */
    signal(SIGXFSZ, SIG_IGN);
    /* before MPI starts: OpenBLAS chose its kernels in its constructor; a weak choice is corrected
     * by running this program again with OPENBLAS_CORETYPE set (returns when none is needed) */
    char err[400];
    if (blas_core_reexec_if_weak(argv, err, sizeof err) || sgemm_select_from_env(err, sizeof err) ||
        check_rounded_from_env(err, sizeof err) || isa_env_check(err, sizeof err) || attn_env_check(err, sizeof err) ||
        comm_env_check(err, sizeof err) || optimizer_offload_env_check(err, sizeof err)) {
        fprintf(stderr, "seqpar: error: %s\n", err);
        return 1;
    }
    /* `seqpar memory` and `seqpar plan` run nothing distributed: unless a launcher started them
     * as ranks of a larger world (mpirun, srun: their ranks then share the cores and answer once,
     * for that world) they skip MPI's start-up (a second on a busy machine) */
    int launch_rank;
    const int launch_world = comm_launched_world(&launch_rank);
    /* train's stop signals from the start: one during MPI's start-up, the checkpoint's load or the
     * sgemm trials killed every rank (SIGUSR1's default action), and a Slurm wrapper then found no
     * "stopped by" line and did not requeue; such a stop takes effect after the first step */
    if (argc >= 2 && !strcmp(argv[1], "train")) stop_signals_install();
    int skip_mpi = argc >= 2 && (!strcmp(argv[1], "memory") || !strcmp(argv[1], "plan")) && launch_world <= 1;
    /* and a help text (seqpar, seqpar --help, seqpar help [CMD], seqpar CMD --help): it was 0.3-0.4 s
     * of Open MPI's start-up for a page of text */
    if (launch_world <= 1 && (argc < 2 || is_help_word(argv[1]) || !strcmp(argv[1], "help") ||
                              (argc == 3 && is_help_word(argv[2]))))
        skip_mpi = 1;
    /* Under a launcher, MPI_Init waits for every rank to start (a fence with all of them): under
     * the set-up's guard (comm.h), so that a rank that never starts ends the job with one line */
    const double setup_deadline = comm_timeout_from_args(argc, argv) * COMM_SLOW_PHASE_FACTOR;
    const int guard = !skip_mpi && launch_world > 1;
    if (guard) comm_guard_begin(launch_rank, "MPI_Init (waiting for every rank to start)", setup_deadline);
    if (!skip_mpi && launch_world == 0) singleton_mpi_defaults();
    if (!skip_mpi) MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (guard) comm_guard_end();
    /* the ranks' error exchanges (die_if_any_rank) under the set-up's deadline; --comm-timeout
     * changes it, the watchdog keeps it after the set-up */
    exchange_deadline_set(setup_deadline);
    if (!skip_mpi) die_unless_same_command(argc, argv);
    int status;
    char help_flag[] = "--help", *help_argv[4];
    if (argc == 3 && !strcmp(argv[1], "help")) { /* seqpar help CMD: CMD's own help */
        help_argv[0] = argv[0], help_argv[1] = argv[2], help_argv[2] = help_flag, help_argv[3] = NULL;
        argc = 3;
        argv = help_argv;
    }
    if (argc < 2 || is_help_word(argv[1]) || !strcmp(argv[1], "help")) {
        fputs(USAGE, stdout);
        status = argc < 2 ? 2 : 0;
    } else if (!strcmp(argv[1], "train")) {
        status = cmd_train(argc - 1, argv + 1, argv[0]);
    } else if (!strcmp(argv[1], "grad")) {
        status = cmd_grad(argc - 1, argv + 1);
    } else if (!strcmp(argv[1], "bench")) {
        status = cmd_bench(argc - 1, argv + 1);
    } else if (!strcmp(argv[1], "strategies")) {
        status = cmd_strategies(argc - 1, argv + 1);
    } else if (!strcmp(argv[1], "sample")) {
        status = cmd_sample(argc - 1, argv + 1);
    } else if (!strcmp(argv[1], "eval")) {
        status = cmd_eval(argc - 1, argv + 1, argv[0]);
    } else if (!strcmp(argv[1], "memory")) {
        status = cmd_memory(argc - 1, argv + 1);
    } else if (!strcmp(argv[1], "plan")) {
        status = cmd_plan(argc - 1, argv + 1, argv[0]);
    } else if (!strcmp(argv[1], "calibrate")) {
        status = cmd_calibrate(argc - 1, argv + 1);
    } else {
        die_collective("unknown command '%s': the commands are train, grad, bench, strategies, memory, plan, calibrate, sample and eval (see 'seqpar --help')", argv[1]);
    }
    if (!skip_mpi) MPI_Finalize();
    return status;
}
