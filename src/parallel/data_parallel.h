/* Gradient synchronisation and Hybrid ZeRO (LoongTrain §5.1) across all dp x sp ranks.
 *
 * Every rank's gradient covers only its own tokens (and, with dp, its own sequences); the loss
 * scale already divides by the global number of targets, so the full gradient is the SUM over
 * every rank of the world.
 *   zero 0: allreduce of the whole gradient; every rank runs AdamW on all parameters.
 *   zero 1: the optimizer state is sharded: a reduce-scatter gives each rank the summed gradient
 *           of its shard (one contiguous range of the flat buffer), it updates that shard, and an
 *           all-gather brings every rank the updated parameters.
 *   zero 2: gradients sharded too. The model's flat gradient buffer is freed: the embedding and
 *           tail gradients get a buffer of their own and the layers two slots used in turn.
 *           As soon as layer l's backward is done (hook AFTER_BACKWARD) its gradient is posted
 *           as a nonblocking reduce-scatter (comm_rs_post: seqpar's own, summed in rank order) to its owners and progressed
 *           while layer l-1 runs; slot l % 2 is reused by layer l-2 only after that reduce-scatter
 *           completed. The tail's (final norm, head) is posted once the head's backward is done
 *           (AFTER_HEAD), the embedding's after its backward. With an untied head the two take
 *           turns in one buffer as large as the larger: the embedding's gradient exists only
 *           from its backward on (the tail's reduce-scatter is waited for first), so the buffer
 *           costs max(E, T) floats instead of E + T. Every micro-batch is reduced this way,
 *           summed into the shard (shard_buf): the first straight into it, each later one per
 *           unit into a temporary of the unit's own part, added to shard_buf as soon as its
 *           reduce-scatter is seen complete (three or four such temporaries, the largest own
 *           part of a layer twice and the outer units', instead of a second whole shard, which
 *           stays where it is no larger; the same additions, so the same sums bit for bit).
 *           Then as zero 1.
 *   zero 3: parameters sharded too. The flat parameter buffer is freed; a rank keeps its shard
 *           (p_shard), two layer buffers used in turn and, during each micro-batch, the gathered
 *           embedding + final norm + head (an untied head: one buffer of max(E, T) holds the
 *           embedding until its forward is done, then the tail, whose gather is posted then and
 *           waited for before the head). Each layer is all-gathered for its forward and again
 *           for its backward, in the order the pass uses the layers (0 .. L-1, then L-1 .. 0):
 *           when a layer starts, its gather (posted one layer earlier) is waited for and the
 *           next layer's is posted (MPI_Iallgatherv) into the other buffer, so it runs while
 *           this layer computes; the first is posted before the outer units' gathers. The
 *           model's pointers are unbound after each use. No all-gather after the update.
 * Sharding groups (--zero-group g, LoongTrain's partial sharding): the world is cut into
 * groups of g consecutive world ranks; the shards are over a group's g ranks, and groups hold
 * replicas. The gradient: reduce-scatter inside the group, then an allreduce of the shard over
 * the world / g ranks that hold the same shard (the cross communicator); parameters are
 * gathered inside the group. g = world (the default) is plain ZeRO over every rank.
 *
 * Shards: rank q of a group of g owns [q Psi / g, (q + 1) Psi / g) of the Psi parameters. A unit
 * (the embedding, each layer, the tail: final norm and head) is a contiguous range of the flat
 * buffer (checked); its reduce-scatter and all-gather give rank q the overlap of the unit with
 * q's shard, so the per-unit collectives of one pass add up to exactly one whole-buffer one.
 *
 * Bytes one rank sends per optimizer step, as the comm layer counts them (4-byte floats; n =
 * own shard, G = world / g groups, m = micro-batches per rank = batch / dp; ar(c, P) = the
 * direct-model allreduce of c elements over P ranks = 4 sum_{p != me} (c_p + c_me) with c split
 * in P near-equal parts, about 8 c (P-1)/P; ar(., 1) = 0; plus one 8-byte norm allreduce over
 * the group when g > 1):
 *   zero 0:   grad_reduce = ar(Psi, world)                              param_gather = 0
 *   zero 1:   grad_reduce = 4 (Psi - n) + ar(n, G)                      param_gather = 4 (g-1) n
 *   zero 2:   grad_reduce = m x 4 (Psi - n) + ar(n, G)                  param_gather = 4 (g-1) n
 *   zero 3:   grad_reduce = m x 4 (Psi - n) + ar(n, G)
 *             param_gather = m x 4 (g-1) (2 n - n_outer)    (n_outer: own part of embedding + tail,
 *                                                             gathered once per micro-batch)
 * (4 (Psi - n) when g > 1, else 0.) An evaluation forward under zero 3 adds 4 (g-1) n per
 * sequence. With g = world, G = 1: zero 1/2 move 4 (Psi - n) + 4 (g-1) n ~ 2 x 4 Psi (g-1)/g,
 * the allreduce's volume; zero 3 moves 1.5x that (LoongTrain §5.1 / ZeRO's 3 Psi vs 2 Psi). */
#ifndef SEQPAR_DATA_PARALLEL_H
#define SEQPAR_DATA_PARALLEL_H

#include <mpi.h>
#include <stddef.h>

#include "parallel/comm.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/optimizer_offload.h"

typedef struct {
    MPI_Comm world;      /* all ranks that share the parameters */
    MPI_Comm shard_comm; /* this rank's sharding group (g ranks); MPI_COMM_NULL when not sharded */
    MPI_Comm cross_comm; /* the ranks holding the same shard in the other groups (world / g) */
    Comm *stats;         /* byte and time accounting (kinds COMM_GRAD_REDUCE, COMM_PARAM_GATHER) */
    int zero;            /* 0 to 3 */
    int group, n_groups; /* g ranks per group, world / g groups */
    int world_rank, world_size;
    int rank, size;      /* in shard_comm */
    size_t total;        /* elements of the flat buffer */
    size_t shard_begin, shard_end; /* this rank's optimizer range ([0, total) with zero 0) */
    size_t *counts, *displs;       /* per group-rank shard sizes and offsets (zero >= 1) */
    float *shard_buf;              /* (shard) the summed gradient of the shard (zero >= 2: accumulated
                                      over the step's micro-batches) */
    /* zero 2/3 (grad_sync_attach): units, buffers and the per-layer hooks */
    LlamaModel *model;
    LlamaHooks hooks;
    int n_units;                   /* 0 embedding, 1 + l layer l, n_layers + 1 the tail */
    size_t *unit_begin, *unit_end;
    size_t *unit_counts;           /* (n_units x size): overlap of unit u with group rank p's shard */
    size_t *unit_displs;           /* (size) scratch */
    CommReduceScatter *rs;         /* (n_units) reduce-scatters (comm.h), unit u's with tag u */
    float *grad_outer;             /* gradients of the embedding and tail units: back to back when the
                                      head is tied to the embedding, else the tail's and then (from
                                      the embedding's backward on) the embedding's in one buffer */
    int outer_turns;               /* the head is not tied: the embedding and tail units take turns in
                                      grad_outer and p_outer (each as large as the larger) */
    float *grad_slot[2];           /* layer gradients, layer l in slot l % 2 */
    int slot_unit[2];              /* the unit whose reduce-scatter reads the slot (-1: none) */
    float *acc_tmp[4];             /* micro-batches after a step's first: a unit's reduce-scatter lands
                                      in the temporary of its slot (0, 1: a layer's parity, 2: the tail
                                      and, taking turns, the embedding, 3: a tied head's embedding),
                                      as large as the largest own part of a unit it takes, and is
                                      added to shard_buf once seen complete */
    float *acc_whole;              /* instead of acc_tmp where those would be no smaller: one of the
                                      whole shard, each unit's part at its place */
    int acc_unit[4];               /* the unit whose reduce-scatter fills slot k (-1: none) */
    int micro;                     /* micro-batches of this step reduced so far */
    int reduced;                   /* this step's reduce-scatters have completed */
    float *p_shard;                /* zero 3: this rank's parameters [shard_begin, shard_end) (NULL: in
                                      the offload's file, --offload-master) */
    float *p_layer[2];             /* zero 3: gathered layers, gather k of the pass in p_layer[k % 2] */
    CommGather gather[2];          /* zero 3: the gather into p_layer[i] in flight */
    int pass_len;                  /* zero 3: gathers in this pass (L forward, L more with backward) */
    float *p_outer;                /* zero 3: the gathered embedding + tail, during a micro-batch
                                      (outer_turns: the embedding until its forward is done, then
                                      the tail, gathered while the layers run) */
    CommGather outer_gather;       /* zero 3, outer_turns: the tail's gather in flight */
    OptOffload *offload;           /* --offload-optimizer: the AdamW moments' file (NULL: in RAM), with
                                      --offload-master the zero-3 parameter shard too (attach writes it
                                      there; the gathers read it); set before grad_sync_attach; freed here */
} GradSync;

/* Plans the shards over groups of `group` ranks (0: the whole world). Errors (zero_flags_error's)
 * are one line on every rank (die_collective). Every count is a size_t and every collective here
 * goes through comm.h's, which split what MPI's int counts cannot carry: no model size is refused. */
void grad_sync_init(GradSync *g, MPI_Comm comm, Comm *stats, size_t total, int zero, int group);
/* --zero and --zero-group (group 0: not given, all ranks) against `world` ranks: NULL, or the one line
 * (newly allocated) whose fix works as given: a group under --zero 0 that also does not divide the
 * ranks names both (grad_sync_init and the memory model refuse alike). */
char *zero_flags_error(int zero, int group, int world);
void grad_sync_free(GradSync *g);

/* zero 2/3 (on more than one rank): installs the hooks on the model (m->hooks) and takes over
 * its buffers: m->grads is freed (NULL; m->g points into this object's buffers while in use)
 * and, for zero 3, m->params is freed too (NULL) after this rank's shard was copied out (m->w
 * points into gathered buffers while in use). Call after the parameters are loaded; a no-op for
 * zero 0/1. Parameters and gradients are then reached through the functions below. */
void grad_sync_attach(GradSync *g, LlamaModel *m);
/* Before micro-batch `index` (0 = the step's first) of a step's forward_backward calls. */
void grad_sync_microbatch(GradSync *g, int index);

/* Sums the gradient over every rank: all of grads (zero 0), this rank's shard (zero 1: written
 * into shard_buf and grads[shard_begin, shard_end); the rest of grads is then stale), or
 * completes the shard reduced during backward (zero 2/3: shard_buf; grads is not read). Returns
 * the squared L2 norm of the full summed gradient (identical on every rank). */
double grad_sync_reduce(GradSync *g, float *grads);

/* The AdamW step on this rank's range (through g->offload where set), then (zero 1/2) the all-gather of the updated shards so
 * that every rank holds all parameters; zero 3 keeps them sharded. */
void grad_sync_update(GradSync *g, AdamW *opt, LlamaModel *m, float lr, float grad_scale);

/* All-gathers a sharded flat buffer in place so that every rank holds all of it; nothing when
 * not sharded. */
void grad_sync_gather_full(GradSync *g, float *buf);

/* Under ZeRO 0/1: the summed gradient (after grad_sync_reduce) whole on world rank 0 (`seqpar
 * grad`'s file), the model's own flat buffer (zero 1 all-gathers it first), so no second copy is
 * made; NULL on the other ranks. Collective. Under ZeRO-2/3 the gradient lives in shards, which
 * rank 0 fetches piece by piece instead (grad_sync_fetch below). */
float *grad_sync_grads_to_root(GradSync *g, LlamaModel *m);

/* Pieces of sharded state for a save on world rank 0 that never holds it whole: arrays[k] (k <
 * n_arrays) are state vectors covering [shard_begin, shard_end) on every rank of the sharding
 * group (the zero-3 parameter shard, the AdamW moments). World rank 0 asks for elements [first,
 * first + n) of array k (grad_sync_fetch: a request broadcast in its group, then a gather of the
 * overlapping parts, counted as param_gather); the group's other ranks answer in grad_sync_serve
 * until rank 0 calls grad_sync_fetch_done, which it must (after a failed write too). Ranks outside
 * group 0 hold replicas and take no part; with one rank in the group nothing is sent. */
typedef struct {
    const float *ram; /* the vector in RAM, or NULL: */
    OptOffload *disk; /* moment `moment` (0 m, 1 v) of the optimizer offload's file */
    int moment;
} ShardArray;
int grad_sync_streams(const GradSync *g); /* 1 when the state is sharded over more than one rank */
void grad_sync_fetch(GradSync *g, const ShardArray *arrays, int k, size_t first, size_t n, float *dst);
void grad_sync_fetch_done(GradSync *g);
void grad_sync_serve(GradSync *g, const ShardArray *arrays, int n_arrays);

#endif
