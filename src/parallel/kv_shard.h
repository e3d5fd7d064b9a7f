/* A rank's shard of a generation's key/value cache and the decode attention over the shards of
 * every rank (flash-decoding across ranks). A prompt's prefill runs the training strategy's own
 * forward (its layout, zigzag included); kv_capture_create wraps that strategy so that each layer's
 * local keys and values (after RoPE) land in the shard as the model hands them to attention: each
 * rank keeps the cache of its own tokens, which is never gathered. A new token's attention
 * (kv_shard_attend) runs on every rank over its shard, each giving per head its partial result
 * (max score m, sum s of exp(score - m), and the weighted sum of values, in double); the partials
 * are all-gathered and merged in rank order by their log-sum-exp, exactly as one softmax over the
 * whole cache, the same bits on every rank. A block of T new tokens continuing the cache (a second
 * prompt) runs by one of two schemes (kv_shard_attend_block), after the pass-KV and pass-Q of
 * context-parallel inference (Meta, arXiv 2411.01783) adapted to dense ops that run on every rank;
 * both give every query the partials that decode would and merge them in the same order. Not here: the model's other ops (model/generate.h) and
 * the choice of the rank that keeps a new token (train/dist_generate.h). */
#ifndef SEQPAR_KV_SHARD_H
#define SEQPAR_KV_SHARD_H

#include <mpi.h>

#include "attention/seq_attention.h"
#include "kernels/bf16.h"
#include "parallel/comm.h"

typedef struct {
    int layers, heads, kv_heads, head_dim;
    int cap;      /* rows per layer */
    int n;        /* rows held */
    int *pos;     /* (cap) each row's global position */
    float *k, *v; /* (layers, cap, kv_heads * head_dim), after RoPE; NULL under bf16 */
    int bf16;     /* kv_shard_set_bf16: k16 and v16 instead, the same shape in bf16 words */
    bf16_t *k16, *v16;
    double *scores; /* (cap): one query's scores over the rows */
    double *part; /* (heads, head_dim + 2): this rank's partial result of one query */
    double *all;  /* (ranks, heads, head_dim + 2): every rank's */
    int ranks;
} KvShard;

void kv_shard_init(KvShard *s, int layers, int heads, int kv_heads, int head_dim, int cap, int ranks);
void kv_shard_free(KvShard *s);
/* Holds the keys and values as bf16 words (half the bytes): for a forward whose attention takes
 * bf16 values (--precision bf16), which the words hold exactly. Before anything is kept. */
void kv_shard_set_bf16(KvShard *s);
/* Bytes of one cached value: 4 (fp32) or 2 (bf16 words). */
size_t kv_shard_elem(const KvShard *s);
/* Layer `layer`'s keys (values 0) or values (1), cap rows of kv_heads * head_dim values as stored:
 * float * for fp32, bf16_t * under bf16 (for code that saves or loads a shard as it is). */
void *kv_shard_rows(const KvShard *s, int values, int layer);
/* The cache's bytes on this rank (its keys and values as allocated: cap rows). */
size_t kv_shard_bytes(const KvShard *s);

/* A SeqAttention running `inner` (not owned) whose every forward also copies the layer's local k and
 * v into rows 0..N-1 of s (the layer counted from set_positions on, which the model calls before
 * each forward); s->cap >= N. It has no chunk calls (the model runs whole layers) and no backward. */
SeqAttention *kv_capture_create(SeqAttention *inner, KvShard *s);
/* After the captured forward: keeps the rows whose position (positions, N) is below `keep_below`
 * (the prompt's, not its padding), in order; s->n is their count. */
void kv_shard_keep(KvShard *s, const int *positions, int N, int keep_below);
/* Appends an empty row at position pos (its k and v written by kv_shard_attend); -1 when full. */
int kv_shard_reserve(KvShard *s, int pos);

/* One new query of layer `layer` at position pos: q (H d) after RoPE; k, v (Hkv d) its key and value,
 * written to this rank's row `row` (reserved by kv_shard_reserve; -1 where another rank keeps it).
 * Attends to every row of every rank's shard at a position in (pos - window, pos] (window 0: all up
 * to pos) and writes o (H d) on every rank. Collective over mc (s->ranks members; one member: no
 * communication). */
void kv_shard_attend(KvShard *s, Comm *c, MPI_Comm mc, int layer, int pos, int row, int window, const float *q,
                     const float *k, const float *v, float *o);

/* How a block of new tokens attends to the sharded cache. Every rank has every new token's q, k and
 * v (the dense ops run everywhere); what moves is:
 *   pass-Q:  the queries stay, each rank attends all T of them to its shard and the partials
 *            (T x heads x (head_dim + 2) doubles) are all-gathered: N (N - 1) T H (d + 2) 8 bytes
 *            a layer over all ranks;
 *   pass-KV: the cache moves, each rank answers T/N of the queries over every rank's cached rows
 *            (all-gathered: keys, values, positions; under a sliding window W only the rows the
 *            block's first query reaches, min(C, W - 1)) and the new rows, and the outputs (T x H
 *            x d floats) are all-gathered: (N - 1) (C (2 Hkv d e + 4) + T H d 4) bytes a layer, e
 *            the bytes of a cached value (4, or 2 under bf16: the words travel as they are).
 * KV_AUTO: the one that moves fewer bytes (pass-Q on a tie). */
typedef enum { KV_AUTO = 0, KV_PASS_Q, KV_PASS_KV } KvScheme;
const char *kv_scheme_name(KvScheme k); /* "pass-Q", "pass-KV", "auto" */
/* The bytes each scheme moves over all ranks and layers for T new tokens after `cached` rows in all
 * (positions 0 .. cached-1); windows (layers) each layer's sliding window (0: none; NULL: none on
 * any layer): under a window W pass-KV sends only the min(cached, W - 1) rows the block's first
 * query reaches (their counts go as control data, a few ints a layer). */
void kv_scheme_bytes(const KvShard *s, int T, long cached, const int *windows, double *pass_q, double *pass_kv);

/* T new queries of layer `layer` at positions pos (T, consecutive), by `scheme` (not KV_AUTO): q (T,
 * H d) after RoPE; k, v (T, Hkv d) their keys and values, token t's written to this rank's row
 * rows[t] (reserved by kv_shard_reserve; -1 where owner[t], another rank, keeps it); cached (ranks)
 * the rows each shard held before the block. Each query attends (under window) to every earlier
 * row and itself, and o (T, H d) comes out the same on every rank. Collective over mc. */
void kv_shard_attend_block(KvShard *s, Comm *c, MPI_Comm mc, KvScheme scheme, int layer, int T, const int *pos,
                           const int *rows, const int *owner, const int *cached, int window, const float *q,
                           const float *k, const float *v, float *o);

#endif
