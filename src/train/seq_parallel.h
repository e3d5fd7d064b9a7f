/* The parallel runtime of one training or gradient run: the dp x hp x cp grid, the
 * communication context, the attention strategy (the single-process kernel when sp = 1, the
 * registry's strategy otherwise), this rank's token positions under the
 * layout, and the gradient synchronisation (allreduce or ZeRO-1/2/3). The CLI builds one from its
 * flags; the model code never sees MPI. */
#ifndef SEQPAR_SEQ_PARALLEL_H
#define SEQPAR_SEQ_PARALLEL_H

#include <sched.h>
#include <stddef.h>

#include "attention/seq_attention.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "model/config.h"
#include "parallel/data_parallel.h"
#include "parallel/layout.h"
#include "parallel/parallel_config.h"
#include "strategies/registry.h"


typedef struct {
    ParallelConfig cfg;
    Topology topo;
    Comm *comm;
    const Strategy *strategy;
    StrategyParams params; /* what the strategy was checked and built with */
    SeqAttention *attn;
    int seq_len;    /* global S */
    int n_local;    /* S / sp tokens on this rank */
    int *positions; /* (n_local) global positions of this rank's tokens */
    GradSync sync;
    int threads;    /* threads this rank uses */
    int idle_cpus;  /* default threads only: CPUs of this node no rank may run on (cpus_left_idle) */
} SeqParallel;

/* The default threads per rank from CPU sets: the CPUs this rank may run on (`mine`: its affinity,
 * as a launcher's binding left it) divided by the ranks of its node (`node`, n sets, this rank's
 * included) whose sets overlap it; at least 1. Unbound ranks (every set the whole node) get the
 * node's CPUs / its ranks; ranks bound to cores of their own (`mpirun --map-by slot:PE=k`) get
 * those cores; ranks bound to a socket or NUMA domain (Open MPI's default above 2 ranks) share its
 * CPUs with the ranks bound there. */
int threads_for_cpus(const cpu_set_t *mine, const cpu_set_t *node, int n);
/* The threads a rank of this job runs without --threads (its CPU set and its node's ranks): collective
 * over MPI_COMM_WORLD. */
int seq_parallel_default_threads(void);
/* The MPI ranks sharing this node (MPI_COMM_TYPE_SHARED): collective over MPI_COMM_WORLD. */
int seq_parallel_ranks_on_node(void);
/* The CPUs of `avail` that none of a node's ranks may run on: avail minus the union of the ranks'
 * sets (node, n sets). `avail` is what the ranks' launchers may use themselves (the affinity of
 * each rank's parent process: mpirun's daemon, slurmstepd with the job's CPUs, or the shell), so a
 * container's or allocation's own limit is not counted. Open MPI binds each rank to one core
 * where it starts at most 2: `mpirun -np 1` on a 2-core machine leaves 1 idle; the header says so. */
int cpus_left_idle(const cpu_set_t *node, int n, const cpu_set_t *avail);


/* Builds everything; every configuration error (unknown strategy, product not equal to the
 * ranks, W not dividing cp, S not splitting under the layout, more head ranks than heads, a
 * schedule's own constraint) prints the same one-line error on every rank and exits 1. n_params
 * sizes the gradient synchronisation. */
void seq_parallel_create(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int seq_len,
                         size_t n_params);
/* seq_parallel_create in two halves. seq_parallel_check: every configuration check (the one-line
 * refusals above, grad_sync_init's of --zero and --zero-group among them) and what they resolve (the
 * grid and its communicators, the strategy's parameters, the threads, n_local), without the attention
 * buffers, positions, statistics or gradient synchronisation; collective. Then either
 * seq_parallel_finish (the rest: what seq_parallel_create builds; the trainer checks the memory plan
 * in between) or seq_parallel_check_free (`seqpar train --dry-run`). */
void seq_parallel_check(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int seq_len);
/* seq_parallel_check at the shortest sequence length from min_len on that the strategy and its layout
 * split (p->seq_len): a prompt padded at its end to what the strategy runs (train/dist_generate.h). */
void seq_parallel_check_fit(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int min_len);
void seq_parallel_finish(SeqParallel *p, const LlamaConfig *model, size_t n_params);
void seq_parallel_check_free(SeqParallel *p);
/* Prints stats (if asked) and writes the trace (if asked): collective. Returns 0, or -1 with a
 * one-line message on the rank that could not write the trace file (rank 0): the caller decides
 * (the CLI ends every rank with it, die_if_any_rank). */
int seq_parallel_free(SeqParallel *p, SeqErr *e);

/* local[i] = global[positions[i]] for this rank's n_local tokens. */
void seq_parallel_take_local(const SeqParallel *p, const int *global, int *local);

/* Sum of a double over every rank of the world (control traffic, under the watchdog). */
double seq_parallel_sum(const SeqParallel *p, double local);

/* A one-line description: "dp 2 x hp 2 x cp 2 (ring W 2), zigzag, head-first, zero 1, 1 thread/rank",
 * and, where the default threads leave CPUs of the node to no rank (idle_cpus), how to use them. */
void seq_parallel_describe(const SeqParallel *p, char *buf, size_t n);

#endif
