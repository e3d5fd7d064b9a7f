/* Distributed causal attention for one sequence-parallel group: the head exchange of the hp
 * ranks of a head group (head_exchange.h) composed with one context schedule over the cp ranks
 * of a context group (context_schedule.h), as one SeqAttention. Which schedule is the
 * registry's business (registry.h); this file is the composition every strategy shares.
 *
 * Per batch: the positions of the whole sp group are all-gathered once (sp_comm, S ints, "meta"
 * bytes), in sp-rank order, which is slot-major: T_0, T_1, ... (layout.h); for packed documents
 * their document ids the same way (S ints more).
 * Per layer, forward: head exchange of q, k, v (N local tokens, all heads -> n = S/cp rows of the
 * context slot, Hl query heads and Hk KV heads); the schedule's forward writes o_h, lse_h; the
 * head exchange brings o back. Backward: delta = rowsum(dO * O) of the local rows, from the
 * local o the model keeps (for o_proj) and dout; dout and delta through one head exchange (delta
 * exact, 4 bytes per row and head: 1/d of dout's volume); the schedule's backward; dq, dk, dv
 * back (KV replicas summed).
 *
 * `saved` per layer, head-parallel layout, in floats:
 *   q_h (n, Hl, d) | kv_h = k_h | v_h (2, n, Hk, d) | lse_h (n, Hl)
 * so backward communicates only dout (with delta) in and dq, dk, dv out, and the model keeps no
 * local copy of q, k, v (keeps_inputs = 1; it passes o, which it keeps anyway). The head-parallel
 * o_h is not kept: a layer's copy would duplicate the local o (n Hl d floats per layer, a third of
 * the saved state with GQA 2); the schedule writes it into the head exchange's send buffer, which
 * head_exchange_out sends from. Data travels in fp32; every accumulator is fp32.
 * Selective checkpointing keeps only lse_h (kept_floats = n Hl); restore() rebuilds q_h, kv_h by
 * the head exchange of the recomputed q, k, v: one all-to-all, no attention compute. */
#ifndef SEQPAR_DIST_ATTENTION_H
#define SEQPAR_DIST_ATTENTION_H

#include <stddef.h>

#include "attention/seq_attention.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "parallel/block_attention.h"
#include "parallel/context_schedule.h"
#include "parallel/head_exchange.h"

/* The strategy for this rank's sp group. The caller has checked p with strategy_check(); t and
 * comm must outlive the strategy. Collective over the world (schedules may split communicators). */
SeqAttention *dist_attention_create(const ScheduleInfo *schedule, const StrategyParams *p, const Topology *t,
                                    Comm *comm);

/* The head exchange of this rank's head group (t's head_comm) for `rows` local rows a call, on the
 * wire p asks for: the composition's covers the whole local sequence; a strategy of its own that
 * exchanges its sequence in chunks makes one for a chunk. */
void dist_attention_exchange_init(HeadExchange *hx, const StrategyParams *p, const Topology *t, Comm *comm, int rows);

/* What member hp_rank sends per layer outside the context schedule (hs: the split of p's heads):
 * `exchanges` head exchanges of `rows` local rows each (COMM_ALLTOALL: q, k, v in and o back
 * forward; dout in, carrying delta where dout_delta, and dq, dk, dv back backward), and per batch
 * the all-gather of the sp group's positions (meta_batch). Sets those fields of v. */
void dist_attention_exchange_volume(const StrategyParams *p, const HeadSplit *hs, int hp_rank, long rows,
                                    int exchanges, int dout_delta, AttnVolume *v);

/* Where things are inside a layer's `saved` buffer (for tests and diagnostics). */
typedef struct {
    int n_rows;       /* n = S/cp rows of this context slot */
    int heads;        /* query heads held here */
    int head_offset;  /* global index of the first of them */
    int kv_heads;     /* KV heads held here (replicas included) */
    const float *q, *k, *v, *lse; /* (n, heads|kv_heads, d) and lse (n, heads) */
    const int *positions; /* (n) global positions of the rows: T_c */
} DistSavedView;
void dist_attention_saved_view(const SeqAttention *sa, const float *saved, DistSavedView *v);

/* Attention work of this rank's last forward / backward (kernel calls and score cells of every
 * visible (query piece, key run) pair; a causal pair counts its whole rectangle). */
void dist_attention_work(const SeqAttention *sa, AttnWork *w);

/* Tuning and measurement knobs: query rows per kernel call [0: a whole run, the kernel testing
 * the requests in flight between its tiles]; compute on/off [on] (off runs the same communication with no attention work: the benchmark's
 * communication-alone time). */
void dist_attention_set_piece_rows(SeqAttention *sa, int rows);
void dist_attention_set_compute(SeqAttention *sa, int enabled);

#endif
