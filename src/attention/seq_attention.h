/* The sequence-attention interface the model calls for every layer. A strategy takes the
 * rank's LOCAL tokens (q, k, v after RoPE, with each token's global position) and returns the
 * local attention output, exactly as if one process had attended over the whole sequence.
 * The single-process strategy is local_attention_create(); the distributed strategies (Ulysses,
 * ring, 2D, double ring, ...) implement the same two calls with their own context.
 *
 * Shapes (local tokens N): q, o, dq, dout (N, H, d); k, v, dk, dv (N, Hkv, d);
 * saved: a per-layer buffer of seq_attention_saved_floats() floats that forward fills and
 * backward reads (the lse, possibly in the strategy's own layout). */
#ifndef SEQPAR_SEQ_ATTENTION_H
#define SEQPAR_SEQ_ATTENTION_H

#include <stddef.h>

typedef struct SeqAttention SeqAttention;

struct SeqAttention {
    const char *name;
    void *ctx;
    /* Floats of per-layer saved state for N local tokens. */
    size_t (*saved_floats)(const SeqAttention *sa, int N, int n_heads);
    void (*forward)(const SeqAttention *sa, int N, int n_heads, int n_kv_heads, int head_dim,
                    const float *q, const float *k, const float *v, const int *positions,
                    float *o, float *saved);
    /* Writes (overwrites) dq, dk, dv. o is the forward's output. */
    void (*backward)(const SeqAttention *sa, int N, int n_heads, int n_kv_heads, int head_dim,
                     const float *q, const float *k, const float *v, const int *positions,
                     const float *o, const float *saved, const float *dout,
                     float *dq, float *dk, float *dv);
    void (*destroy)(SeqAttention *sa);
};

/* Causal attention of all local tokens against all local tokens on this process. */
SeqAttention *local_attention_create(void);
void seq_attention_destroy(SeqAttention *sa);

#endif
