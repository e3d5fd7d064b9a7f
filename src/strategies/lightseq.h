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
 *   r < P/2 and r < t < P/2:       helper block (q_{r+P-t}, kv_r), q received at step t-1, into a
 *                                  fresh (o, lse) that goes back to rank r+P-t at step t+1;
 *   otherwise idle (ranks < P/2 at t = P/2).
 * Ranks >= P/2 compute P/2 + 1 blocks, ranks < P/2 compute P/2: with the diagonal counted as one
 * block, the slowest rank does P/2 + 1 of the P (P+1) / 2 blocks (P = 8: 36 / 5 = 7.2x).
 * Transfers posted at step t (t <= P/2 - 1) feed step t + 1: with s = r + t + 1, rank r sends its
 * kv to s if s < P, else (t < P/2 - 1) its q to s - P; the receives mirror that.
 * Backward routes the same inputs (q travels with dout, lse and delta) and returns one step later
 * what a block produced for another rank: a helper's dq to the query owner, an owner block's dk|dv
 * to the kv owner; the dk|dv of the blocks of step P/2 go back in the epilogue step. */
#ifndef SEQPAR_LIGHTSEQ_H
#define SEQPAR_LIGHTSEQ_H

#include "strategies/context_schedule.h"

/* What rank r does at step t. Every field is a context rank (= slot), or -1 for none. */
typedef struct {
    int q, kv;                      /* the block computed at this step (q slot, kv slot) */
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
