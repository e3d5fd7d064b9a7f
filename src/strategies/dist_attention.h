/* Distributed causal attention for one sequence-parallel group: LoongTrain's 2D-Attention
 * (head-parallel SeqAlltoAll x context-parallel Double-Ring-Attention) with its corners
 * Ulysses (hp = sp, cp = 1) and Ring attention (hp = 1; a plain ring when W = cp). One code
 * path; dp > 1 just means several independent sp groups (each uses its own communicators).
 *
 * Per layer, forward (N = S/sp local tokens, n = S/cp tokens per context slot):
 *   1. positions of the whole sp group are all-gathered (sp_comm, S ints, "meta" bytes);
 *   2. SeqAlltoAll in head_comm: local q (N, H, d), k, v (N, Hkv, d) -> head-parallel
 *      q_h (n, H/hp, d), k_h, v_h (n, Hk, d), Hk = max(Hkv, hp)/hp, pieces placed in head-member
 *      order so context rank c holds its token set T_c in order. KV replication (LoongTrain
 *      §4.2): when Hkv < hp each KV head is sent to the hp/Hkv members whose query heads use it;
 *   3. Double-Ring-Attention in ctx_comm (inner rings of W = ring_inner members in inner_comm,
 *      outer ring in outer_comm): the outer transfer of the window's starting KV is posted
 *      before the inner ring starts and overlaps it; inside the inner ring the next KV block is
 *      in flight while the current one computes (compute is split in pieces with MPI_Testall
 *      between them, because Open MPI progresses transfers only inside MPI calls);
 *   4. SeqAlltoAll of the output back to (N, H, d).
 * Causal work uses explicit positions: each q block and kv block is cut into runs (arithmetic
 * progressions of positions: a zigzag slot is 2 runs of stride 1, a striped slot 1 run of
 * stride cp) and attn_forward is called only on run pairs that are not fully masked, ATTN_FULL
 * when fully visible, so zigzag off-diagonal steps compute exactly half a block and contiguous
 * skips future blocks.
 *
 * Backward: dout goes through the SeqAlltoAll; with the saved FINAL lse and
 * delta = rowsum(dO * O), KV travels the same double-ring route again and the dK/dV
 * accumulators travel with it and come back to the owner; dQ accumulates locally; dq, dk, dv go
 * back through the SeqAlltoAll (replica gradients SUMMED into their KV head).
 *
 * Bytes each rank sends per layer, Size(q) = 4 N H d, Size(kv) = 8 N Hk hp d (k and v
 * together; = max(Hkv, hp)/H x 8 S D/sp), R = cp/W outer steps:
 *   forward  alltoall  (hp-1)/hp x (2 Size(q) + Size(kv))          (q, k, v in; out back)
 *            p2p_inner R (W-1) x Size(kv)
 *            p2p_outer x Size(kv)
 *   backward alltoall  (hp-1)/hp x (2 Size(q) + Size(kv))          (dout in; dq, dk, dv back)
 *            p2p_inner [R (W-1) + (W>1) R W] x Size(kv)    KV W-1 hops and dKV W hops per window
 *            p2p_outer [(R-1) + (R>1) R] x Size(kv)        KV R-1 hops, the dKV partial R hops
 *   meta (forward only): 4 N (sp-1) bytes of positions.
 * The dKV route: inside a window the accumulator follows its KV around the inner ring and makes
 * the W-th hop back to the window's starting member; that member adds the partial sum of the
 * earlier windows (received over the outer ring while it computed) and sends the total to the
 * same member of the next window; after the last window this hop lands on the owner.
 *
 * `saved` (saved_floats floats per layer), in head-parallel layout:
 *   q_h (n, H/hp, d) | k_h (n, Hk, d) | v_h (n, Hk, d) | o_h (n, H/hp, d) | lse_h (n, H/hp)
 *   | positions of the whole group (S int32, stored bit-for-bit)
 * so backward communicates only dout in and dq, dk, dv out. The local q, k, v, o arguments of
 * backward are not read.
 *
 * Data travels in fp32; all accumulators (o, lse, dq, dk, dv) are fp32. */
#ifndef SEQPAR_DIST_ATTENTION_H
#define SEQPAR_DIST_ATTENTION_H

#include <stddef.h>

#include "attention/seq_attention.h"
#include "comm/comm.h"
#include "comm/topology.h"
#include "strategies/layout.h"

/* The strategy for the sp group of this rank. The head shape must be given with
 * dist_attention_set_heads() before saved_floats/forward/backward are called (the SeqAttention
 * interface does not pass head_dim or the KV head count to saved_floats). t and comm must
 * outlive the strategy. */
SeqAttention *dist_attention_create(const Topology *t, Comm *comm, int seq_len_global);
/* Sets the model's heads; dies (die_collective, naming the valid hp values) when the heads
 * cannot be split over hp. Allocates the ring and all-to-all workspaces. */
void dist_attention_set_heads(SeqAttention *sa, int n_heads, int n_kv_heads, int head_dim);
/* Convenience: create + set_heads. */
SeqAttention *dist_attention_create_for(const Topology *t, Comm *comm, int seq_len_global, int n_heads,
                                        int n_kv_heads, int head_dim);

/* NULL when (hp, cp, H, Hkv, S, layout) can run; otherwise an xmalloc'd one-line message the
 * caller frees with xfree, e.g. naming the hp values that would work for this model. Reads only
 * t->hp and t->cp. Rules: Hkv divides H; hp divides H; hp divides Hkv or Hkv divides hp (KV
 * replication); S divisible by 2 sp (zigzag) or sp. */
char *dist_attention_check(const Topology *t, int n_heads, int n_kv_heads, long seq_len, TokenLayout layout);

/* Where things are inside a layer's `saved` buffer (for tests and diagnostics). */
typedef struct {
    int n_rows;        /* n = S/cp rows of this context slot */
    int heads;         /* H/hp query heads held here */
    int head_offset;   /* global index of the first of them: hp_rank * H/hp */
    int kv_heads;      /* Hk KV heads held here (after replication) */
    const float *q, *k, *v, *o, *lse; /* (n, heads|kv_heads, d) and lse (n, heads) */
    const int *positions;  /* (n) global positions of the rows: T_c */
} DistSavedView;
void dist_attention_saved_view(const SeqAttention *sa, const float *saved, DistSavedView *v);

/* Expected bytes per rank and per layer by the formulas above (for tests and reports). */
typedef struct {
    unsigned long long fwd[COMM_KINDS], bwd[COMM_KINDS];
    unsigned long long fwd_msgs[COMM_KINDS], bwd_msgs[COMM_KINDS];
    unsigned long long meta_fwd;
} DistAttnVolume;
void dist_attention_volume(const Topology *t, int S, int n_heads, int n_kv_heads, int head_dim, DistAttnVolume *v);

/* Attention work of this rank's last forward / backward: kernel calls and score cells
 * (rows x keys of every (query piece, kv run) pair that was not fully masked; a causal pair
 * counts its whole rectangle). Zigzag: (cp-1) n^2/2 off-diagonal + 3 n^2/4 diagonal (n^2 on the
 * last slot, whose two chunks are adjacent and form one causal run). */
typedef struct { unsigned long long fwd_calls, fwd_cells, bwd_calls, bwd_cells; } DistAttnWork;
void dist_attention_work(const SeqAttention *sa, DistAttnWork *w);

/* Tuning and measurement knobs (defaults in brackets): rows of a compute piece between progress
 * tests [256]; compute on/off [on] (off runs the same communication schedule with no attention
 * work, which is how the benchmark measures the communication time to hide). */
void dist_attention_set_piece_rows(SeqAttention *sa, int rows);
void dist_attention_set_compute(SeqAttention *sa, int enabled);

#endif
