/* The planner's inputs from `seqpar plan`'s flags, and its pick as a `seqpar train` command line:
 * the cluster (a preset or file, or this machine with the link and rate flags), the model and run
 * from train's flags, what the user fixed (train's grid flags given), the kernels' rates measured
 * here where neither the flags nor the cluster give them, and the search (planner.h). Shared by
 * `seqpar plan` and `seqpar train --strategy auto` (auto_strategy.h), so that both plan alike. */
#ifndef SEQPAR_PLAN_SETUP_H
#define SEQPAR_PLAN_SETUP_H

#include <stddef.h>

#include "plan/cluster.h"
#include "plan/planner.h"
#include "train/train_options.h"

typedef struct {
    PlanCluster cl;        /* cl.sim points at cx: a PlanSetup is not copied once set up */
    Cluster cx;            /* --cluster's, where given */
    TrainOptions o;        /* train's flags as parse_train_options read them */
    SizeFlags sf;
    MemoryModelInput base; /* the model, S, batch, precision and --offload-dir */
    PlanFixed fx;          /* the grid flags given */
    int ram_given;         /* the RAM per rank came from --mem-per-rank or the cluster (else this machine's / ranks) */
    int measured_gemm;     /* 0 given, 1 measured on the 2048^3 GEMM, 2 on the model's own products */
    int measured_attn;     /* the attention rates were measured here */
    int gemm_tokens;       /* measured_gemm 2: the tokens its products had */
    int bf16_gemm;         /* bf16 on the AVX512_BF16 path's own GEMM (else fp32 sgemm on bf16 values) */
    char load[64];         /* how the rates were measured: "one thread per core on N cores at once" */
    char cluster_gemm[160], cluster_attn[160]; /* where the cluster gave the rates: which and how */
    PlanEntry *list;       /* plan_search's sorted configurations */
    int n, invalid, fit;   /* configurations that run, refused, and fitting in the RAM per rank */
    char *refusal;         /* where none runs: the first refusal (may be NULL) */
} PlanSetup;

/* Takes plan's own flags (--cluster and its overrides, --ranks, --ranks-per-node, --cores-per-node,
 * --mem-per-rank, --runtime-mib, the link and rate flags, --offload-dir) out of argv, reads the rest
 * as train's flags, measures the missing rates and runs the search. who names the command in the
 * one-line errors every rank ends with ("seqpar plan"). exact: the first entries of ps->list the
 * caller reads (plan_search's `exact`: the rest may be bounds; 0: every entry exact). Collective
 * where rates are measured under MPI (each rank measures its share of the cores). Free with
 * plan_setup_free. */
void plan_setup(int *argc, char **argv, const char *who, int exact, PlanSetup *ps);
void plan_setup_free(PlanSetup *ps);

/* Where nothing runs (ps->n == 0): why, as one line (xmalloc'd): train's reason for the flags as
 * given, where it has one, and the grids the search tried around them, where that is another. */
char *plan_setup_refusal(const PlanSetup *ps);

/* The train flags of argv (a train command line, argv[0] the program) but the grid flags the plan
 * chooses (strategy, grid, knobs, placement, layout, ZeRO stage, --checkpoint, --ffn-chunks and,
 * unless keep_offload, --offload-dir), as shell words in buf. Returns 0, or -1 where they do not fit. */
int plan_user_flags(int argc, char **argv, int keep_offload, char *buf, size_t n);

/* The train command that runs configuration e (fitting) of ps: in `launch`, "mpirun -n P
 * [--map-by slot:PE=T] PROG train" (PROG: program_word), and in `flags` the train flags of argv
 * (a train command line: the user's) but its grid flags, then e's (plan_flags), as shell words.
 * Returns 0, or -1 with the one-line reason in `launch` where they do not fit. */
int plan_setup_command(const PlanSetup *ps, const PlanEntry *e, int argc, char **argv, const char *program, char *launch,
                       size_t ln, char *flags, size_t fn);

/* --profile K (a topology scheduler's profiling, docs/planner.md: the configuration of the highest
 * profiled throughput): K training steps of each of the first top_n fitting configurations of ps,
 * run by the training library (train_measure) on the ranks started, with the train flags of argv
 * (argc, argv as for plan_setup_command: the user's, the grid flags replaced by each candidate's);
 * rank 0 prints each measured step (the mean of those after the first; K = 1: the one step) against
 * its prediction and, where label is not NULL, "LABEL: " and the fastest's train command. Returns
 * the fastest's row of ps->list (rank 0's, on every rank). Collective; the ranks must be the job's
 * (ps->cl.ranks). */
int plan_setup_profile(const PlanSetup *ps, long K, int top_n, int argc, char **argv, const char *program,
                       const char *label);

/* Rank 0's text on every rank (xmalloc'd; collective over MPI_COMM_WORLD): the pick that every
 * rank takes. */
char *plan_bcast_text(const char *text);
/* A command's argv from argv0 and a line of train flags as plan_setup_command writes them (shell
 * words, quoted): xmalloc'd, *argc words, free with plan_argv_free; NULL where they do not split. */
char **plan_flags_argv(const char *argv0, const char *flags, int *argc);
void plan_argv_free(char **argv);

#endif
