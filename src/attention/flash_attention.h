/* Flash attention on the CPU: the one attention operation every seqpar strategy calls.
 *
 * A call computes attention of a block of queries against a block of keys/values, and MERGES the
 * result into a running (o, lse) pair owned by the caller. A single process calls it once with
 * all keys; a ring strategy calls it once per received key/value block; results computed
 * elsewhere are folded in with attn_merge(). Backward takes the FINAL o and lse (after all
 * blocks were merged) and ACCUMULATES (+=) into dq, dk, dv, so it too can be called block by
 * block. Never builds an S x S matrix: memory is O(tiles), independent of the sequence length.
 *
 * Layouts (row-major, token-major, the layout the model's projections produce):
 *   q, o, dq, dout   (n_q,  n_heads,    head_dim)
 *   k, v, dk, dv     (n_kv, n_kv_heads, head_dim)
 *   lse, delta       (n_q,  n_heads)            natural log of the softmax denominator of the
 *                                               scaled scores seen so far; -inf for a row that
 *                                               has seen no key
 * Query head h reads key/value head h / (n_heads / n_kv_heads): grouped-query attention without
 * copying K and V.
 *
 * Masking: with ATTN_CAUSAL, key j is visible to query i iff kv_pos[j] <= q_pos[i], where the
 * positions are GLOBAL token positions given per row. Any layout (contiguous, zigzag, striped,
 * chunk-permuted) therefore needs no special case. With ATTN_FULL every key is visible and the
 * position arrays may be NULL. A row that sees no key in a call is left unchanged.
 *
 * Sliding windows (Mistral, a Qwen's windowed layers): with AttnShape.window = W > 0 (ATTN_CAUSAL
 * only) key j is visible to query i only if also q_pos[i] - kv_pos[j] < W: each query sees its W
 * latest positions, itself included (transformers' sliding_window rule). Tiles wholly before
 * every query's window are skipped like future ones; only tiles across a window's lower edge get
 * the elementwise mask.
 *
 * Documents (packed sequences): the _docs variants also take a document id per row (q_doc,
 * kv_doc); under ATTN_CAUSAL key j is then visible to query i iff kv_doc[j] == q_doc[i] AND
 * kv_pos[j] <= q_pos[i]. NULL doc arrays mean one document (the plain calls). Ids are any ints;
 * the kernel is exact for any, and fast when they do not decrease along the positions (as packing
 * makes them: a document is a contiguous range of positions): a tile inside one document runs as
 * before, a tile whose document range misses the other tile's is skipped, only tiles across a
 * boundary get the elementwise mask. ATTN_FULL takes no doc arrays.
 *
 * Threads: the calls parallelise internally with OpenMP; call them from one thread. */
#ifndef SEQPAR_FLASH_ATTENTION_H
#define SEQPAR_FLASH_ATTENTION_H

#include <stddef.h>

#include "kernels/bf16.h"

typedef enum { ATTN_FULL = 0, ATTN_CAUSAL = 1 } AttnMask;

typedef struct {
    int n_q;        /* query rows in this block */
    int n_kv;       /* key/value rows in this block */
    int n_heads;    /* query heads */
    int n_kv_heads; /* key/value heads; divides n_heads */
    int head_dim;
    float scale;    /* usually 1/sqrt(head_dim) */
    AttnMask mask;
    int window;     /* ATTN_CAUSAL: > 0 hides keys window or more positions before the query (the
                       sliding window above); 0: none */
    /* PRECISION_BF16: q, k, v and dout are bf16 operands (--precision bf16). Where the CPU has
     * AVX512_BF16 (and the kernel path is avx512) the tile products then run on bf16 tiles with
     * fp32 accumulation (VDPBF16PS, kernels/attn_bf16.h): q, k, v, dout rounded to bf16 as they are
     * packed, and P and dS rounded to bf16 before their products, as every bf16 flash attention
     * does; scores, softmax, max, sum, lse, delta and the rescaling stay fp32. Elsewhere the fp32
     * kernel runs on the inputs as given (the conversion path: the model rounds them to bf16
     * values, and P and dS stay fp32). PRECISION_FP32 (0, the default) is the fp32 kernel. */
    Precision precision;
    /* Called now and then while the call runs (by the calling thread, thread 0 of the kernel's
     * OpenMP team, after each of its query tiles forward and key tiles backward: a few ms of work
     * apart), e.g. to progress MPI transfers in flight, which Open MPI moves only inside MPI
     * calls. NULL: never. It must not touch the call's arrays. */
    void (*progress)(void *arg);
    void *progress_arg;
    /* Backward only, optional: q, k, v as bf16 values, laid out as the fp32 arrays would be. When
     * set, attn_backward reads these instead (its q, k, v arguments may be NULL), widening a tile
     * at a time into a per-thread buffer (exact), so a caller that keeps q, k, v as bf16 copies
     * (the model under --precision bf16 --checkpoint none) needs no fp32 set of them: the same
     * gradients bit for bit as from the widened arrays. */
    const bf16_t *q16, *k16, *v16;
} AttnShape;

/* The attention kernel a call with this precision runs in this process (it follows the kernel
 * path, so SEQPAR_ISA and isa_force change it): "fp32", "bf16 tiles (VDPBF16PS)" or
 * "fp32 on bf16 inputs (conversion path)". For run headers and benchmarks. */
const char *attn_kernel_name(Precision precision);

/* A set of rows summarised for the visibility rule: positions in [pos_lo, pos_hi], document ids
 * in [doc_lo, doc_hi] (both 0 when there are no documents). */
typedef struct { int pos_lo, pos_hi, doc_lo, doc_hi; } AttnSpan;

/* The causal (and document, and sliding-window) visibility rule for a set of queries against a set
 * of keys: every key visible to every query (FULL: all keys at or before every query, all in the
 * one document of every query, and with a window W > 0 all less than W positions before every
 * query), none (HIDDEN: every key after every query, or the document ranges do not meet, or every
 * key W or more positions before every query), or some (PARTIAL: needs the elementwise mask). The
 * kernel classifies its tiles with it, and the distributed strategies classify whole blocks and
 * runs with it: one rule, one place. window 0: no window. */
typedef enum { ATTN_VIS_HIDDEN = 0, ATTN_VIS_PARTIAL = 1, ATTN_VIS_FULL = 2 } AttnVisibility;
AttnVisibility attn_visibility(AttnSpan q, AttnSpan k, int window);

/* The span of rows [0, n) of pos and doc (doc NULL: document 0). n > 0. */
AttnSpan attn_span(const int *pos, const int *doc, int n);

/* Sets o = 0 and lse = -inf for n_q rows: the state of rows that have seen no key. */
void attn_state_init(const AttnShape *s, float *o, float *lse);

/* Merges the attention of q against (k, v) into the running (o, lse). */
void attn_forward(const AttnShape *s,
                  const float *q, const int *q_pos,
                  const float *k, const float *v, const int *kv_pos,
                  float *o, float *lse);
/* The same with document ids per row (see Documents above; NULL: one document). */
void attn_forward_docs(const AttnShape *s,
                       const float *q, const int *q_pos, const int *q_doc,
                       const float *k, const float *v, const int *kv_pos, const int *kv_doc,
                       float *o, float *lse);

/* Merges a partial result (o_b, lse_b), computed elsewhere for the same rows, into (o, lse):
 * lse' = max + log1p(exp(-|lse - lse_b|)), o' = exp(lse - lse') o + exp(lse_b - lse') o_b.
 * Rows with lse_b = -inf are unchanged; rows with lse = -inf take (o_b, lse_b). Never NaN. */
void attn_merge(int n_rows, int n_heads, int head_dim,
                float *o, float *lse, const float *o_b, const float *lse_b);

/* delta[i,h] = sum_d dout[i,h,:] * o[i,h,:], computed once from the final o, before any
 * attn_backward call for these rows. */
void attn_backward_delta(const AttnShape *s, const float *o, const float *dout, float *delta);

/* Accumulates the gradients of this (q block, kv block) pair: dq += ..., dk += ..., dv += ...
 * o is not needed beyond delta; lse is the FINAL lse of the rows. dq, dk or dv may be NULL when
 * that gradient is not wanted. */
void attn_backward(const AttnShape *s,
                   const float *q, const int *q_pos,
                   const float *k, const float *v, const int *kv_pos,
                   const float *lse, const float *delta, const float *dout,
                   float *dq, float *dk, float *dv);
void attn_backward_docs(const AttnShape *s,
                        const float *q, const int *q_pos, const int *q_doc,
                        const float *k, const float *v, const int *kv_pos, const int *kv_doc,
                        const float *lse, const float *delta, const float *dout,
                        float *dq, float *dk, float *dv);

/* The dq accumulators ("slots") of attn_backward with this many threads: the key tiles of a pass
 * go to the threads dynamically, heaviest first, as each thread comes free; the tile at place i
 * of that order sums its dq terms into slot i % slots, after the slot's previous tile (a thread
 * waits for that turn), and the slots are added in slot order. So dq, like dK and dV (one writer
 * per key tile), depends on the number of slots only, never on timing or on which thread took
 * what: the same slots give the same gradients bit for bit on any thread count. 1 for one
 * thread (no copies), else 2 per thread (a thread then rarely waits for a turn). Slot 0 is dq
 * itself; each other one a dq copy of the pass. SEQPAR_ATTN_DQ_SLOTS=N (1..1024) sets it (tests,
 * or gradients that must not change with the thread count); anything else is a one-line error. */
int attn_backward_dq_slots(int threads);
/* SEQPAR_ATTN_DQ_SLOTS and SEQPAR_ATTN_BWD_ROWS checked at start-up (the CLI, before MPI starts):
 * 0, or 1 with the one-line message in err (the kernel would end the process with it at its first
 * backward, through MPI_Abort under mpirun). */
int attn_env_check(char *err, size_t n);

/* Query rows per pass of attn_backward (n_q: one pass). The backward's buffers that grow with the
 * query rows (one dq copy per slot beyond the first, and the compact Q and dO copies) cover one
 * kv head's query heads at a time; where they would outgrow the kv head's own dK and dV (2 n_kv d
 * floats, then kept across passes), the backward runs in passes of one query head and this many
 * rows (a multiple of bq, at least 2048 rows) sized so that the per-pass buffers are about that
 * size, which keeps them from growing with the thread count: the same gradients bit for bit
 * (every sum in the same order). threads: of the call's OpenMP team (its dq slots,
 * attn_backward_dq_slots, count); bq: the backward's query
 * tile (isa.h's or attn_bf16.h's bwd_bq); bf16_tiles: the bf16 tiles' copies (Q and dO as rows and
 * pairs) instead of fp32 rows. SEQPAR_ATTN_BWD_ROWS=R forces passes of R rows (rounded up to
 * a multiple of bq; tests, tuning). */
int attn_backward_pass_rows(int n_q, int n_kv, int group, int head_dim, int bq, int bf16_tiles, int threads);

/* Exact floating-point operation counts of a call (for MFU and benchmarks): 4 * d per visible
 * (query, key, head) pair forward, 2.5x that backward, counting only visible pairs (documents and
 * the window included). */
double attn_forward_flops(const AttnShape *s, const int *q_pos, const int *kv_pos);
double attn_forward_flops_docs(const AttnShape *s, const int *q_pos, const int *q_doc, const int *kv_pos,
                               const int *kv_doc);

#endif
