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
    "  --help      this text; 'seqpar train --help' lists the other flags\n";

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
    TrainOptions o;
    SizeFlags sf;
    parse_train_options(argc, argv, &o, &sf, "memory");

    MemoryModelInput in;
    memory_input_from_options(&o, &sf, "memory", &in);
    in.world = world;
    in.cores = cores;
    MemoryEstimate m;
    char *err = memory_model_estimate(&in, &m);
    if (err) die_collective("%s", err);

    if (rank != 0) return 0;
    memory_estimate_print(stdout, &in, &m);
    fflush(stdout);
    return 0;
}
