/* seqpar memory: the memory model (strategies/memory_model.h) for the flags of `seqpar train`:
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

static void print_row(const char *name, double ram, double disk, double total) {
    printf("  %-36s %12.2f MiB %6.1f%%", name, ram / 1048576.0, total > 0 ? 100.0 * ram / total : 0.0);
    if (disk > 0) printf("   disk %10.2f MiB", disk / 1048576.0);
    printf("\n");
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
    const LlamaConfig *c = &in.model;
    char groups[48] = "";
    if (m.zero > 0 && m.zero_group < world) snprintf(groups, sizeof groups, " (groups of %d)", m.zero_group);
    printf("memory model of one %s training step: %d layers, hidden %d, heads %d (kv %d), head_dim %d, ffn %d, vocab %d\n",
           precision_name(in.precision), c->num_hidden_layers, c->hidden_size, c->num_attention_heads,
           c->num_key_value_heads, c->head_dim, c->intermediate_size, c->vocab_size);
    printf("S = %ld, batch %d, %d rank%s: %s, dp %d x hp %d x cp %d, %d local tokens, --precision %s, --checkpoint %s, "
           "%d FFN chunk%s, zero %d%s, %d thread%s/rank%s%s\n",
           in.seq_len, in.batch, world, world == 1 ? "" : "s", m.strategy, m.dp, m.hp, m.cp, m.n_local,
           precision_name(in.precision),
           llama_checkpoint_name(in.checkpoint), m.ffn_chunks, m.ffn_chunks == 1 ? "" : "s", m.zero, groups,
           m.threads, m.threads == 1 ? "" : "s", in.par.offload_dir ? ", offload to " : "",
           in.par.offload_dir ? in.par.offload_dir : "");
    printf("rank %d (the largest), RAM by component:\n", m.rank);
    for (int k = 0; k < MEM_COMPONENTS; k++) print_row(memory_component_name((MemComponent)k), m.ram[k], m.disk[k], m.ram_total);
    printf("  %-36s %12.2f MiB          disk %10.2f MiB\n", "total", m.ram_total / 1048576.0, m.disk_total / 1048576.0);
    printf("  RAM per token: %.2f KiB per global token, %.2f KiB per local token\n", m.ram_total / 1024.0 / (double)in.seq_len,
           m.ram_total / 1024.0 / m.n_local);
    if (m.layer_chunks) printf("  layer inputs offloaded in %d chunks each\n", m.layer_chunks);
    const int chunk_calls = strategy_attention_chunks(strategy_named(in.par.strategy), &m.params);
    if (m.streams)
        printf("  layers streamed chunk by chunk: %d chunks of %d rows (--no-stream: whole layers)\n", chunk_calls,
               m.n_local / chunk_calls);
    else if (chunk_calls > 1 && in.checkpoint == LLAMA_CKPT_SELECTIVE)
        printf("  whole layers: --checkpoint selective keeps each layer's output whole, so it does not stream\n");
    printf("papers' terms (fp32, this rank):\n");
    const PaperMemoryInput pin = {.p = &m.params, .D = c->hidden_size, .L = c->num_hidden_layers};
    for (int i = 0; strategy_at(i); i++) {
        PaperMemory pm;
        strategy_paper_memory(strategy_at(i), &pin, &pm);
        for (int k = 0; k < pm.n; k++) printf("%s\n", pm.line[k]);
    }
    fflush(stdout);
    return 0;
}
