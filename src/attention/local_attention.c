/* The single-process SeqAttention: one flash-attention call over the whole local sequence,
 * causal by global position (and by document for packed sequences). The saved state is the lse (N, H), all of it kept (restore is a
 * no-op: backward reads q, k, v, o from the model). */
#include "attention/seq_attention.h"

#include <math.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"

typedef struct {
    int *positions; /* (N) */
    int *docs;      /* (N) document ids, or NULL: one document */
    float *delta;   /* (N, H) */
} LocalCtx;

static AttnShape local_shape(const SeqAttention *sa) {
    const AttnHeads *h = &sa->heads;
    AttnShape s = {.n_q = h->n_local, .n_kv = h->n_local, .n_heads = h->n_heads, .n_kv_heads = h->n_kv_heads,
                   .head_dim = h->head_dim, .scale = 1.0f / sqrtf((float)h->head_dim), .mask = ATTN_CAUSAL,
                   .window = sa->window, .precision = h->precision};
    return s;
}

static void local_set_positions(SeqAttention *sa, const int *positions, const int *docs) {
    LocalCtx *x = sa->ctx;
    const size_t bytes = sizeof(int) * (size_t)sa->heads.n_local;
    memcpy(x->positions, positions, bytes);
    xfree(x->docs);
    x->docs = NULL;
    if (docs) {
        x->docs = xmalloc(bytes > 0 ? bytes : sizeof(int));
        memcpy(x->docs, docs, bytes);
    }
}

static void local_forward(SeqAttention *sa, const float *q, const float *k, const float *v, float *o, float *saved) {
    LocalCtx *x = sa->ctx;
    AttnShape s = local_shape(sa);
    attn_state_init(&s, o, saved);
    attn_forward_docs(&s, q, x->positions, x->docs, k, v, x->positions, x->docs, o, saved);
}

/* q, k, v as fp32 arrays, or (q16, k16, v16 non-NULL) as bf16 values */
static void backward_from(SeqAttention *sa, const float *q, const float *k, const float *v, const bf16_t *q16,
                          const bf16_t *k16, const bf16_t *v16, const float *o, const float *saved, const float *dout,
                          float *dq, float *dk, float *dv) {
    LocalCtx *x = sa->ctx;
    const AttnHeads *h = &sa->heads;
    AttnShape s = local_shape(sa);
    s.q16 = q16, s.k16 = k16, s.v16 = v16;
    attn_backward_delta(&s, o, dout, x->delta);
    memset(dq, 0, sizeof(float) * (size_t)h->n_local * h->n_heads * h->head_dim);
    memset(dk, 0, sizeof(float) * (size_t)h->n_local * h->n_kv_heads * h->head_dim);
    memset(dv, 0, sizeof(float) * (size_t)h->n_local * h->n_kv_heads * h->head_dim);
    attn_backward_docs(&s, q, x->positions, x->docs, k, v, x->positions, x->docs, saved, x->delta, dout, dq, dk, dv);
}

static void local_backward(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                           const float *saved, const float *dout, float *dq, float *dk, float *dv) {
    backward_from(sa, q, k, v, NULL, NULL, NULL, o, saved, dout, dq, dk, dv);
}

static void local_backward_bf16(SeqAttention *sa, const bf16_t *q, const bf16_t *k, const bf16_t *v, const float *o,
                                const float *saved, const float *dout, float *dq, float *dk, float *dv) {
    backward_from(sa, NULL, NULL, NULL, q, k, v, o, saved, dout, dq, dk, dv);
}

static void local_restore(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                          float *saved) {
    (void)sa, (void)q, (void)k, (void)v, (void)o, (void)saved; /* everything saved is kept */
}

static void local_destroy(SeqAttention *sa) {
    LocalCtx *x = sa->ctx;
    xfree(x->positions);
    xfree(x->docs);
    xfree(x->delta);
    xfree(x);
    xfree(sa);
}

SeqAttention *local_attention_create(AttnHeads heads) {
    SeqAttention *sa = xcalloc(1, sizeof *sa);
    LocalCtx *x = xcalloc(1, sizeof *x);
    x->positions = xmalloc(sizeof(int) * (size_t)(heads.n_local > 0 ? heads.n_local : 1));
    x->delta = xmalloc(sizeof(float) * (size_t)(heads.n_local > 0 ? heads.n_local : 1) * (size_t)heads.n_heads);
    for (int i = 0; i < heads.n_local; i++) x->positions[i] = i;
    sa->name = "local";
    sa->ctx = x;
    sa->heads = heads;
    sa->saved_floats = (size_t)heads.n_local * heads.n_heads;
    sa->keeps_inputs = 0;
    sa->kept_floats = sa->saved_floats;
    sa->set_positions = local_set_positions;
    sa->forward = local_forward;
    sa->backward = local_backward;
    sa->backward_bf16 = local_backward_bf16;
    sa->restore = local_restore;
    sa->destroy = local_destroy;
    return sa;
}

void seq_attention_destroy(SeqAttention *sa) {
    if (sa) sa->destroy(sa);
}
