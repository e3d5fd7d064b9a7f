/* LightSeq / DistFlashAttn's balanced causal schedule (paper 004 §3.2, notes §7) as a pure
 * function, so that the tests can check the plan for every even P without MPI, and the per-rank
 * communication volume of that plan in closed form. The schedule itself is
 * `lightseq_schedule` (registry.h, lightseq.c).
 *
 * Contiguous layout: slot i holds tokens [i n, (i+1) n), so the causal block pairs are (q_i, kv_j)
 * with i >= j. P even (P = 1 is local). Compute steps t = 0 .. P/2, then one epilogue step
 * t = P/2 + 1 that only returns the last gradients. Rank r at compute step t:
 *   t = 0:                         its own causal block (q_r, kv_r);
 *   t >= 1, r >= min(P/2, t):      owner block (q_r, kv_{r-t}), kv received at step t-1;
 *   r < P/2 and r < t <= P/2:      helper block (q_{r+P-t}, kv_r), q received at step t-1, into a
 *                                  fresh (o, lse) that goes back to rank r+P-t at step t+1.
 * At t = P/2 the owner block of rank r >= P/2 and the helper block of rank r - P/2 are the same
 * pair (q_r, kv_{r-P/2}): the owner computes the first half of its rows (n/2, rounded down), the
 * helper, which holds kv_{r-P/2} itself, the rest. The paper leaves ranks < P/2 idle at that step
 * (rank >= P/2 then does half a block more than the others: total / slowest = P (P+1) / (P+2),
 * 7.2 at P = 8 and 1.33 at P = 2); split, every rank does the same work (P/2 blocks counting the
 * diagonal as half, P/2 + 1/2 counting it whole) and the balance is P.
 * Transfers posted at step t (t <= P/2 - 1) feed step t + 1: with s = r + t + 1, rank r sends its
 * kv to s if s < P, else its q to s - P (at t = P/2 - 1 only the helper's half of the rows); the
 * receives mirror that.
 * Backward routes the same inputs (q travels with dout, lse and delta) and returns one step later
 * what a block produced for another rank: a helper's dq to the query owner, an owner block's dk|dv
 * to the kv owner; the dk|dv of the blocks of step P/2 go back in the epilogue step. */
#ifndef SEQPAR_LIGHTSEQ_H
#define SEQPAR_LIGHTSEQ_H

#include "parallel/context_schedule.h"

/* Which query rows of a slot a block covers or a transfer carries: all n, the first n/2 (rounded
 * down) or the other n - n/2. */
typedef enum { LS_ROWS_ALL = 0, LS_ROWS_FIRST = 1, LS_ROWS_SECOND = 2 } LightseqRows;

/* First row and row count of `rows` in a slot of n rows. */
void lightseq_rows(LightseqRows rows, int n, int *row0, int *count);

/* What rank r does at step t. Every rank field is a context rank (= slot), or -1 for none. */
typedef struct {
    int q, kv;                      /* the block computed at this step (q slot, kv slot) */
    LightseqRows rows;              /* of q_slot, in this block */
    LightseqRows q_rows;            /* carried by send_q_to / recv_q_from */
    LightseqRows ret_rows;          /* carried by ret_to / ret_from */
    int send_kv_to, send_q_to;      /* inputs for step t + 1: my kv or my q (bwd: q|dout|lse|delta) */
    int recv_kv_from, recv_q_from;  /* inputs for my block of step t + 1 */
    int ret_to, ret_from;           /* helper block of step t - 1: o|lse (fwd) or dq (bwd) */
    int dkv_to, dkv_from;           /* backward only: dk|dv of an owner block of step t - 1 */
} LightseqStep;

/* Steps of the plan: compute steps 0 .. P/2 and the epilogue step, i.e. P/2 + 2 (1 for P = 1). */
int lightseq_steps(int P);
/* Rank r (0 <= r < P) at step t (0 <= t < lightseq_steps(P)); P = 1 or even. */
void lightseq_step(int P, int r, int t, LightseqStep *s);

/* Bytes and messages rank r sends per layer (fp32), in closed form (the kinds: COMM_P2P_INNER);
 * lightseq_schedule.volume is this function. */
void lightseq_rank_volume(const StrategyParams *p, int r, AttnVolume *v);

#endif
