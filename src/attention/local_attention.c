/* The single-process SeqAttention: one flash-attention call over the whole local sequence,
 * causal by global position. The saved state is the lse (N, H). */
#include "attention/seq_attention.h"

#include <math.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"

static AttnShape local_shape(int N, int n_heads, int n_kv_heads, int head_dim) {
    AttnShape s = {.n_q = N, .n_kv = N, .n_heads = n_heads, .n_kv_heads = n_kv_heads,
                   .head_dim = head_dim, .scale = 1.0f / sqrtf((float)head_dim), .mask = ATTN_CAUSAL};
    return s;
}

static size_t local_saved_floats(const SeqAttention *sa, int N, int n_heads) {
    (void)sa;
    return (size_t)N * n_heads;
}

static void local_forward(const SeqAttention *sa, int N, int n_heads, int n_kv_heads, int head_dim,
                          const float *q, const float *k, const float *v, const int *positions,
                          float *o, float *saved) {
    (void)sa;
    AttnShape s = local_shape(N, n_heads, n_kv_heads, head_dim);
    attn_state_init(&s, o, saved);
    attn_forward(&s, q, positions, k, v, positions, o, saved);
}

static void local_backward(const SeqAttention *sa, int N, int n_heads, int n_kv_heads, int head_dim,
                           const float *q, const float *k, const float *v, const int *positions,
                           const float *o, const float *saved, const float *dout,
                           float *dq, float *dk, float *dv) {
    (void)sa;
    AttnShape s = local_shape(N, n_heads, n_kv_heads, head_dim);
    float *delta = xmalloc(sizeof(float) * (size_t)N * n_heads);
    attn_backward_delta(&s, o, dout, delta);
    memset(dq, 0, sizeof(float) * (size_t)N * n_heads * head_dim);
    memset(dk, 0, sizeof(float) * (size_t)N * n_kv_heads * head_dim);
    memset(dv, 0, sizeof(float) * (size_t)N * n_kv_heads * head_dim);
    attn_backward(&s, q, positions, k, v, positions, saved, delta, dout, dq, dk, dv);
    xfree(delta);
}

static void local_destroy(SeqAttention *sa) { xfree(sa); }

SeqAttention *local_attention_create(void) {
    SeqAttention *sa = xcalloc(1, sizeof *sa);
    sa->name = "local";
    sa->saved_floats = local_saved_floats;
    sa->forward = local_forward;
    sa->backward = local_backward;
    sa->destroy = local_destroy;
    return sa;
}

void seq_attention_destroy(SeqAttention *sa) {
    if (sa) sa->destroy(sa);
}
