/* Attention of one block of queries against one block of keys/values, as every distributed
 * schedule calls it: the ONE iterator over visible (query piece, key run) pairs that forward and
 * backward both use.
 *
 * A block's positions are cut into runs (maximal arithmetic progressions: a zigzag slot is two
 * runs of stride 1, a striped slot one run of stride cp, a contiguous block one run). Queries go
 * to the kernel a run at a time (or in pieces of at most piece_rows rows of one run, for tests).
 * Each (piece, key run) pair is classified with
 * attn_visibility() (the rule the kernel uses for its tiles, documents and windows included): hidden
 * pairs are skipped (a key run wholly in other documents, or before the window, too), fully visible
 * ones run unmasked (ATTN_FULL),
 * partial ones causal with the documents' ids. So zigzag off-diagonal steps cost
 * exactly half a block and future blocks cost nothing. The in-flight requests of the caller's
 * ring are tested from inside the kernel between its tiles (AttnShape.progress) and after every
 * call (Open MPI progresses transfers only inside MPI calls): one call per (run, run) pair, not per
 * piece, since a call's fixed cost (transposed key tiles, the dK/dV accumulation) is paid once per
 * key tile and query call: with 256-row pieces it was 12% of a 2-rank ring rank's CPU samples (perf,
 * S = 16K), against under 1% in one call.
 *
 * Work counters record kernel calls and score cells (rows x keys of every pair computed) so the
 * tests can check balance and schedules. */
#ifndef SEQPAR_BLOCK_ATTENTION_H
#define SEQPAR_BLOCK_ATTENTION_H

#include <mpi.h>
#include <stddef.h>

#include "parallel/comm.h"
#include "kernels/bf16.h"

/* Rows [start, start + len) of a block whose positions are an arithmetic progression in [lo, hi],
 * with document ids in [doc_lo, doc_hi] (0 without documents). */
typedef struct { int start, len, lo, hi, doc_lo, doc_hi; } PosRun;

/* A block of rows with positions (and document ids of packed sequences), cut into runs. runs has
 * room for n entries. */
typedef struct {
    const int *pos; /* (n) */
    const int *doc; /* (n) document ids, or NULL: one document */
    int n;
    PosRun *runs;
    int n_runs;
} PosBlock;

/* Cuts pos (n) into runs; `runs` must hold n entries (owned by the caller). doc (n) may be NULL. */
void pos_block_init(PosBlock *b, const int *pos, const int *doc, int n, PosRun *runs);

/* pos_block_init for positions without document ids that are one arithmetic progression within
 * each of n_pieces pieces (piece k starts at index starts[k]): the same runs, found in O(pieces +
 * runs) instead of O(n). */
void pos_block_init_pieces(PosBlock *b, const int *pos, int n, PosRun *runs, const int *starts, int n_pieces);

/* Whether some query of q may see some key of k by position alone (documents not considered) under
 * a sliding window (0: none): some (run, run) pair not hidden by attn_visibility. */
int pos_blocks_meet(const PosBlock *q, const PosBlock *k, int window);

/* The work block_attn_forward / block_attn_backward record for q against k with whole query runs
 * (piece_rows 0): *cells the rows x keys of every pair not hidden, *calls the pairs; and *visible
 * the (query, key) pairs the mask lets through (causal, the window; one document), which a
 * partially visible pair's cells overcount (the kernel skips its hidden tiles). */
void pos_blocks_work(const PosBlock *q, const PosBlock *k, int window, unsigned long long *cells,
                     unsigned long long *calls, unsigned long long *visible);

/* Attention work since the last reset. */
typedef struct { unsigned long long fwd_calls, fwd_cells, bwd_calls, bwd_cells; } AttnWork;

/* Requests to test between pieces (MPI_REQUEST_NULL entries allowed); time goes to `kind`. */
typedef struct {
    MPI_Request *reqs;
    int n;
    CommKind kind;
} Progress;

typedef struct {
    Comm *comm;
    int heads, kv_heads, head_dim; /* of the blocks (after any head exchange) */
    float scale;
    int piece_rows; /* at most this many query rows per kernel call (0, the default: a whole run, the
                       kernel testing the caller's requests between its tiles) */
    int compute;    /* 0: count work but skip the kernel (benchmark of communication alone) */
    Precision precision; /* PRECISION_BF16: the blocks hold bf16 values (--precision bf16): the kernel's
                          * bf16 tiles (flash_attention.h); block_attn_init sets fp32 */
    int window;          /* the sliding window of the layer being computed (AttnShape.window; 0: none):
                          * the strategy sets it from SeqAttention.window before its calls; pairs
                          * wholly before every query's window are hidden like future ones */
    AttnWork work;
} BlockAttn;

void block_attn_init(BlockAttn *b, Comm *comm, int heads, int kv_heads, int head_dim);

/* Merges attention of q (qb.n, heads, d) against k, v (kb.n, kv_heads, d) into (o, lse). */
void block_attn_forward(BlockAttn *b, const float *q, const PosBlock *qb, const float *k, const float *v,
                        const PosBlock *kb, float *o, float *lse, const Progress *pr);

/* Accumulates dq (qb rows) and dk, dv (kb rows) of the pair; lse is the FINAL lse of the query
 * rows and delta = rowsum(dout * o_final). dq or dk/dv may be NULL when not wanted. */
void block_attn_backward(BlockAttn *b, const float *q, const PosBlock *qb, const float *k, const float *v,
                         const PosBlock *kb, const float *lse, const float *delta, const float *dout, float *dq,
                         float *dk, float *dv, const Progress *pr);

#endif
