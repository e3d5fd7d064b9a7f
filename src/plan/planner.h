/* The planner (`seqpar plan`): which strategy, grid, placement, checkpoint mode and ZeRO stage to
 * train a model at a sequence length on a given cluster. It enumerates every configuration the
 * registry accepts for the ranks, keeps those whose predicted memory (memory_model.h) fits a rank,
 * and ranks them by a predicted step time:
 *
 *   compute   the linear layers' FLOPs (recomputation included, llama.h) at the GEMM rate and the
 *             rank's own causal attention pairs (its layout's share; the balanced schedules even
 *             theirs out) at the attention kernel's forward and backward rates, per thread x threads;
 *   traffic   each strategy's exact bytes per layer (the registry's volume formulas) times layers,
 *             micro-batches and the checkpoint mode's repeated exchanges, plus the gradient
 *             reduction and ZeRO's gathers (data_parallel.h's formulas), split into bytes to peers
 *             on the rank's node and on other nodes from the peers' world ranks;
 *   exposed   the head all-to-alls, team collectives and ZeRO-0/1 reductions wait in full; ring
 *             transfers hide behind the attention compute, ZeRO-2/3's reduce-scatters behind the
 *             backward and ZeRO-3's gathers behind the step, as the code overlaps them.
 *
 * The step is the slowest rank's compute plus its exposed communication. Elementwise work (norms,
 * RoPE, SwiGLU, the loss, AdamW) is not counted. Runs nothing (no MPI, no allocation of the
 * model). */
#ifndef SEQPAR_PLANNER_H
#define SEQPAR_PLANNER_H

#include "parallel/comm.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"

typedef struct {
    int ranks;             /* ranks of the job */
    int ranks_per_node;    /* consecutive world ranks share a node */
    int cores_per_node;    /* threads per rank: cores_per_node / ranks_per_node (at least 1) */
    double ram_bytes;      /* RAM one rank may use; <= 0: no limit */
    double runtime_bytes;  /* per rank beyond the memory model's tracked allocations (C runtime, MPI, stacks) */
    double intra_gbs, inter_gbs;       /* GB/s a rank sends at, to a peer on its node / another node */
    double intra_lat_s, inter_lat_s;   /* per message */
    double gemm_gflops;                /* per thread: the linear layers' GEMMs in the run's precision */
    double attn_fwd_gflops, attn_bwd_gflops; /* per thread: the attention kernel (backward counted as 2.5x
                                                 the forward's FLOPs, as `seqpar bench attn`) */
    /* Optional: the cluster (nodes, ports, NICs, attention rates by block shape) on which the step
     * simulator (simulate.h) plays each configuration's attention schedule, forward and backward,
     * every rank of the job's first replica and of the replicas that share its nodes; its times
     * then replace the attention FLOPs at the rates above and the attention traffic's link times
     * (the head exchange, the rings, the team collectives). The gradient reduction and ZeRO's
     * reduce-scatters and gathers are then the cluster's collectives (simulate_collective: NCCL's
     * ring, a node's NICs shared by the rings crossing it), and the optimizer step (its memory
     * pass at device_mem_gbs) and the cluster's fixed cost a step are added. NULL: the formulas
     * above. */
    const Cluster *sim;
} PlanCluster;

/* Bytes and messages one rank sends in one training step: the totals per kind exact (what `seqpar
 * train --stats` counts), and so is the split into bytes to peers on the rank's node and on other
 * nodes for every strategy with a route of its own (registry.h); the others' point-to-point steps
 * change peers from step to step (an equal share per peer of the context group there); the head exchange's split is an equal share
 * per head-group peer, exact when hp divides the heads. */
typedef struct {
    double bytes[COMM_KINDS], intra[COMM_KINDS], inter[COMM_KINDS], msgs[COMM_KINDS];
} PlanTraffic;

/* What the slowest rank's step is made of (seconds), for `seqpar plan --explain`: compute, the
 * communication left exposed by kind (with the bytes the attention sends by link and whether the
 * collectives cross nodes), and the fixed terms. */
typedef struct {
    double gemm, attention;          /* compute: the linear layers (recomputation included), attention */
    double attn_comm;                /* attention's exposed communication: the head exchange, rings, teams */
    double attn_intra, attn_inter;   /* attention's bytes a step, inside the node / across nodes */
    double grad, gather;             /* exposed: the gradient reduction (and data-parallel sync), ZeRO's gathers */
    int grad_across, gather_across;  /* those rings cross nodes (the cluster's collectives only) */
    double optimizer, fixed;         /* the optimizer step's pass over memory, the cluster's fixed cost */
} PlanTerms;

/* One configuration and its prediction. */
typedef struct {
    ParallelConfig par;   /* strategy, its knobs, dp, hp, cp, placement, zero */
    int checkpoint;       /* LLAMA_CKPT_* */
    int ffn_chunks;       /* --ffn-chunks as train is to get it: 0 its default (mem.ffn_chunks: the count) */
    MemoryEstimate mem;
    double ram;           /* mem.ram_total + the cluster's runtime allowance */
    int fits;             /* ram within the cluster's RAM per rank */
    double t_step, t_compute, t_exposed; /* seconds, the slowest rank's */
    double tokens_per_s;
    double inter_bytes;   /* the most bytes a rank sends to other nodes per step */
    double total_bytes;   /* the most bytes a rank sends per step */
    PlanTerms terms;      /* t_step's parts, the slowest rank's */
    int bound;            /* not played (plan_search with `exact`): t_step is only a lower bound of its step,
                             tokens_per_s an upper bound, and the other times, terms and bytes are not set */
    int order;            /* its place in the search's enumeration: the ranking's last tie-break */
} PlanEntry;

/* The traffic of world rank w in one step of `in` (in->par resolved: memory_model_estimate's
 * grid) under ranks_per_node. NULL, or a one-line message (xmalloc'd) when `in` does not run. */
char *plan_rank_traffic(const MemoryModelInput *in, int ranks_per_node, int w, PlanTraffic *t);

/* Predicts one configuration (in->par as the user would pass it; 0 = the strategy's default).
 * NULL, or the one-line reason it cannot run. */
char *plan_evaluate(const MemoryModelInput *in, const PlanCluster *c, PlanEntry *e);

/* Which choices the search may vary; a field set by the user stays fixed. */
typedef struct {
    const char *strategy;     /* NULL: every registered strategy */
    int dp, hp, cp;           /* 0: every factorisation */
    KnobValues knobs;         /* the strategies' knobs (registry.h); 0: every valid value */
    int placement;            /* -1: every placement the strategy distinguishes */
    int checkpoint;           /* -1: none, selective, layer */
    int zero;                 /* -1: 0 to 3 */
} PlanFixed;

/* Every configuration of base (model, S, batch, precision, offload) on the cluster, evaluated
 * (under --checkpoint none, where base leaves --ffn-chunks to its default, also with one FFN chunk:
 * every layer's gate and up kept instead of recomputed in the backward, for more memory)
 * and sorted: fitting ones first (the others after them, by RAM), by tokens/s in buckets of 1% (within one, the lower ZeRO stage,
 * then less recomputation, then fewer cross-node bytes, then the faster, then less RAM, then the search's order). *n entries (xmalloc'd, free with
 * xfree); *invalid counts those the registry refused; where none runs, *refusal (may be NULL; xfree it)
 * gets the first refused configuration's reason. NULL or a one-line message.
 *
 * exact > 0 (with the step simulator, c->sim): only the first `exact` entries of the ranking must
 * be as a search that plays every configuration gives them (the same entries in the same order,
 * every figure the same), and so must *n, *invalid and the fits. Each configuration then first gets
 * a lower bound of its step without playing its schedule's events (the attention's FLOPs over the
 * members at the cluster's highest attention rate; then, its schedule emitted but not played, each
 * member's blocks exactly and its waits from its blocks step by step and its own bytes through its
 * NIC, port and node medium at their bandwidths; then from each step's transfers, each after its
 * latency), and is played, fastest bound first, only until `exact` played configurations are
 * faster than every bound left by more than the ranking's 1% tie (PLAN_TIE): those left cannot
 * enter the first `exact` (nor share a tie group with them) and stay bounds (PlanEntry.bound). */
char *plan_search(const MemoryModelInput *base, const PlanFixed *fixed, const PlanCluster *c, int exact,
                  PlanEntry **out, int *n, int *invalid, char **refusal);

/* Why `e` ranks where it does against `other` (the next; NULL: alone), in a few lines into buf:
 * its step's parts, the term that differs most and by how much, and the tie rule where the two are
 * within 1% of each other. */
void plan_explain(const PlanEntry *e, const PlanEntry *other, char *buf, size_t n);

/* "--strategy ring --cp 8 --checkpoint none --zero 0 ..." for `seqpar train` (every flag that
 * differs from train's defaults). */
void plan_flags(const PlanEntry *e, char *buf, size_t n);

#endif
