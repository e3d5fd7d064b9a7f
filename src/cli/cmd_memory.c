/* seqpar memory: the memory model (plan/memory_model.h) for the flags of `seqpar train`:
 * what one training step would hold per rank, by component and tier (RAM, disk), the total and
 * KiB per token, and the papers' terms, without running anything heavy (no MPI communication, no
 * model allocation). `--ranks P` stands for the ranks mpirun would start. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/cli_common.h"
#include "cli/commands.h"
#include "train/train_options.h"
#include "core/common.h"
#include "io/checkpoint.h"
#include "io/config_json.h"
#include "plan/memory_model.h"
#include "plan/sample_memory.h"

#include <omp.h>

static const char HELP[] =
    "usage: seqpar memory [--ranks P] [--cores C] [every flag of 'seqpar train']\n"
    "\n"
    "Predicts the memory of one training step of 'seqpar train' with the same flags, per rank and\n"
    "tier (RAM, disk): parameters, gradients, AdamW moments, saved activations, one layer's working\n"
    "set with the kernels' transient buffers, the attention strategy's buffers, token buffers.\n"
    "The rank with the most RAM is shown (ranks differ under uneven head splits and ZeRO shards).\n"
    "It counts what seqpar allocates itself (the 'peak mem' train reports); the process's RSS adds\n"
    "the C runtime, MPI and thread stacks. Runs nothing: answers at once.\n"
    "\n"
    "  --ranks P   ranks the run would have (default: this run's MPI ranks)\n"
    "  --cores C   cores of the node, for the default threads per rank (default: this machine's)\n"
    "  --help      this text; 'seqpar train --help' lists the other flags\n"
    "\n"
    "  --sample    instead: 'seqpar sample' on P ranks with a prompt of --seq-len tokens (--strategy as\n"
    "              sample's; none on one rank: one process's own path), per rank: the weights, the\n"
    "              prompt's prefill, the key/value cache shard, decode's scratch, the peak; and the\n"
    "              longest prompt that fits --budget-gib (docs/sampling.md)\n"
    "  --max-new-tokens N  with --sample: tokens generated after the prompt (default 200)\n"
    "  --budget-gib G      with --sample: the memory per rank the longest prompt must fit (default 24)\n";

/* `seqpar memory --sample`: the estimate of plan/sample_memory.h and the longest prompt in the budget. */
static int sample_memory(const MemoryModelInput *in, int world, int cores, long new_tokens, double budget_gib) {
    const int threads = in->par.threads > 0 ? in->par.threads : (cores / world > 1 ? cores / world : 1);
    SampleMemory m;
    char *err = sample_memory_estimate(&in->model, &in->par, world, threads, in->seq_len, new_tokens, in->precision, &m);
    if (err) die_collective("seqpar memory --sample: %s", err);
    const double MiB = 1 << 20;
    const int one = !in->par.strategy && world == 1;
    printf("seqpar sample, per rank: a prompt of %ld tokens%s, %ld new, %s, %d rank%s%s", in->seq_len,
           m.seq_len != in->seq_len ? " (padded to what the strategy splits)" : "", new_tokens,
           in->precision == PRECISION_BF16 ? "bf16 (cache in bf16)" : "fp32", world, world > 1 ? "s" : "",
           one ? " (one process's own path)\n" : "");
    if (!one) printf(" (--strategy %s, hp %d x cp %d, %ld prompt tokens a rank)\n",
                     strategy_named(in->par.strategy)->name, m.hp, m.cp, m.n_local);
    printf("  weights           %12.1f MiB\n", m.weights / MiB);
    if (!one) printf("  prefill           %12.1f MiB  (forward-only activations, strategy buffers, kernel scratch)\n",
                     m.prefill / MiB);
    printf("  key/value cache   %12.1f MiB\n", m.cache / MiB);
    printf("  decode scratch    %12.1f MiB\n", m.decode / MiB);
    printf("  peak              %12.1f MiB  (%.0f bytes: seqpar's own allocations, as `seqpar sample` reports them "
           "tracked)\n", m.total / MiB, m.total);
    const long limit = in->model.max_position_embeddings > 0 ? in->model.max_position_embeddings : 1L << 30;
    const long best = sample_memory_longest(&in->model, &in->par, world, threads, new_tokens, in->precision,
                                            budget_gib * 1024 * MiB, limit - new_tokens > 1 ? limit - new_tokens : 1);
    printf("longest prompt within %g GiB a rank: %ld tokens%s\n", budget_gib, best,
           best >= limit - new_tokens ? " (the model's positions)" : "");
    return 0;
}

/* Removes "--ranks P" / "--ranks=P" and "--cores C" from argv (train's parser does not know them). */
static int take_int_flag(int *argc, char **argv, const char *name, long min, long max, int *value) {
    const char *v = take_flag(argc, argv, "memory", name);
    if (v) *value = (int)parse_long("memory", name + 2, v, min, max);
    return v != NULL;
}


int cmd_memory(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        }
    int world = 1, cores = omp_get_num_procs(), mpi = 0, rank = 0;
    MPI_Initialized(&mpi); /* not under mpirun: main skipped MPI_Init */
    if (mpi) {
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    }
    take_int_flag(&argc, argv, "--ranks", 1, 1 << 20, &world);
    take_int_flag(&argc, argv, "--cores", 1, 1 << 20, &cores);
    int sample = 0;
    for (int i = 1; i < argc; i++) /* --sample: removed before train's parser reads the rest */
        if (!strcmp(argv[i], "--sample")) {
            sample = 1;
            memmove(argv + i, argv + i + 1, sizeof *argv * (size_t)(argc - i));
            argc--;
            i--;
        }
    const char *nv = take_flag(&argc, argv, "memory", "--max-new-tokens"), *bv = take_flag(&argc, argv, "memory", "--budget-gib");
    if ((nv || bv) && !sample)
        die_collective("seqpar memory: --%s is for --sample: add --sample (or drop it)", nv ? "max-new-tokens" : "budget-gib");
    const long new_tokens = nv ? parse_long("memory", "max-new-tokens", nv, 0, 1L << 24) : 200;
    const double budget = bv ? parse_double("memory", "budget-gib", bv, 1e-6, 1e9) : 24;
    TrainOptions o;
    SizeFlags sf;
    parse_train_options(argc, argv, &o, &sf, "memory");

    MemoryModelInput in;
    memory_input_from_options(&o, &sf, "memory", &in);
    in.world = world;
    in.cores = cores;
    if (sample) return rank == 0 ? sample_memory(&in, world, cores, new_tokens, budget) : 0;
    MemoryEstimate m;
    char *err = memory_model_estimate(&in, &m);
    if (err) die_collective("%s", err);

    if (rank != 0) return 0;
    memory_estimate_print(stdout, &in, &m);
    fflush(stdout);
    return 0;
}
