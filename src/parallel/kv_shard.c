/* A rank's shard of a key/value cache, its capture from a strategy's forward, and the decode
 * attention merged across ranks; see kv_shard.h. */
#include "parallel/kv_shard.h"

#include <math.h>
#include <string.h>

#include "core/common.h"

void kv_shard_init(KvShard *s, int layers, int heads, int kv_heads, int head_dim, int cap, int ranks) {
    memset(s, 0, sizeof *s);
    s->layers = layers;
    s->heads = heads;
    s->kv_heads = kv_heads;
    s->head_dim = head_dim;
    s->cap = cap > 0 ? cap : 1;
    s->ranks = ranks;
    const size_t rows = (size_t)layers * (size_t)s->cap * (size_t)kv_heads * (size_t)head_dim;
    s->pos = xmalloc(sizeof(int) * (size_t)s->cap);
    s->k = xmalloc(sizeof(float) * (rows ? rows : 1));
    s->v = xmalloc(sizeof(float) * (rows ? rows : 1));
    s->scores = xmalloc(sizeof(double) * (size_t)s->cap);
    s->part = xmalloc(sizeof(double) * (size_t)heads * (size_t)(head_dim + 2));
    s->all = xmalloc(sizeof(double) * (size_t)ranks * (size_t)heads * (size_t)(head_dim + 2));
}

void kv_shard_free(KvShard *s) {
    xfree(s->pos); xfree(s->k); xfree(s->v); xfree(s->part); xfree(s->all); xfree(s->scores);
    memset(s, 0, sizeof *s);
}

size_t kv_shard_bytes(const KvShard *s) {
    return 2 * sizeof(float) * (size_t)s->layers * (size_t)s->cap * (size_t)s->kv_heads * (size_t)s->head_dim;
}

/* ------------------------------------------------------------------ capture */

typedef struct {
    SeqAttention *inner;
    KvShard *s;
    int layer; /* the layer of the next forward */
} Capture;

static void capture_set_positions(SeqAttention *sa, const int *positions, const int *docs) {
    Capture *c = sa->ctx;
    c->layer = 0;
    c->inner->set_positions(c->inner, positions, docs);
}

static void capture_forward(SeqAttention *sa, const float *q, const float *k, const float *v, float *o, float *saved) {
    Capture *c = sa->ctx;
    KvShard *s = c->s;
    const int N = sa->heads.n_local;
    const size_t kvd = (size_t)s->kv_heads * s->head_dim, at = (size_t)c->layer * s->cap * kvd;
    if (c->layer >= s->layers || N > s->cap) die("internal: captured layer %d of %d, %d rows of %d", c->layer, s->layers, N, s->cap);
    memcpy(s->k + at, k, sizeof(float) * (size_t)N * kvd);
    memcpy(s->v + at, v, sizeof(float) * (size_t)N * kvd);
    c->layer++;
    c->inner->window = sa->window;
    c->inner->forward(c->inner, q, k, v, o, saved);
}

static void capture_backward(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                             const float *saved, const float *dout, float *dq, float *dk, float *dv) {
    (void)q; (void)k; (void)v; (void)o; (void)saved; (void)dout; (void)dq; (void)dk; (void)dv;
    die("internal: %s: a captured prefill has no backward", sa->name);
}

static void capture_restore(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                            float *saved) {
    (void)q; (void)k; (void)v; (void)o; (void)saved;
    die("internal: %s: a captured prefill has no backward", sa->name);
}

static void capture_destroy(SeqAttention *sa) {
    xfree(sa->ctx);
    xfree(sa);
}

SeqAttention *kv_capture_create(SeqAttention *inner, KvShard *s) {
    Capture *c = xcalloc(1, sizeof *c);
    c->inner = inner;
    c->s = s;
    SeqAttention *sa = xmalloc(sizeof *sa); /* inner's shape and buffers; no chunk calls, no knobs */
    *sa = (SeqAttention){.name = inner->name, .ctx = c, .heads = inner->heads, .saved_floats = inner->saved_floats,
                         .keeps_inputs = inner->keeps_inputs, .kept_floats = inner->kept_floats,
                         .bf16_floats = inner->bf16_floats, .set_positions = capture_set_positions,
                         .forward = capture_forward, .backward = capture_backward, .restore = capture_restore,
                         .destroy = capture_destroy};
    return sa;
}

void kv_shard_keep(KvShard *s, const int *positions, int N, int keep_below) {
    const size_t kvd = (size_t)s->kv_heads * s->head_dim;
    int n = 0;
    for (int i = 0; i < N; i++) {
        if (positions[i] >= keep_below) continue;
        if (n != i)
            for (int l = 0; l < s->layers; l++) {
                const size_t base = (size_t)l * s->cap * kvd;
                memmove(s->k + base + (size_t)n * kvd, s->k + base + (size_t)i * kvd, sizeof(float) * kvd);
                memmove(s->v + base + (size_t)n * kvd, s->v + base + (size_t)i * kvd, sizeof(float) * kvd);
            }
        s->pos[n++] = positions[i];
    }
    s->n = n;
}

int kv_shard_reserve(KvShard *s, int pos) {
    if (s->n >= s->cap) return -1;
    s->pos[s->n] = pos;
    return s->n++;
}

/* ------------------------------------------------------------------ decode attention */

void kv_shard_attend(KvShard *s, Comm *c, MPI_Comm mc, int layer, int pos, int row, int window, const float *q,
                     const float *k, const float *v, float *o) {
    const int H = s->heads, Hkv = s->kv_heads, d = s->head_dim, group = H / Hkv, stride = d + 2;
    const size_t kvd = (size_t)Hkv * d;
    const float *K = s->k + (size_t)layer * s->cap * kvd, *V = s->v + (size_t)layer * s->cap * kvd;
    if (row >= 0) {
        memcpy(s->k + ((size_t)layer * s->cap + (size_t)row) * kvd, k, sizeof(float) * kvd);
        memcpy(s->v + ((size_t)layer * s->cap + (size_t)row) * kvd, v, sizeof(float) * kvd);
    }
    const int first = window > 0 ? pos - window + 1 : 0; /* the earliest position the query sees */
    const double scale = 1.0 / sqrt((double)d);
    /* this rank's partial result per head: the largest score m, s = sum exp(score - m) and
     * acc = sum exp(score - m) v, in double as one process's attention (model/generate.c) */
    for (int h = 0; h < H; h++) {
        const float *qh = q + (size_t)h * d;
        const int kh = h / group;
        double *p = s->part + (size_t)h * stride, mx = -INFINITY;
        for (int j = 0; j < s->n; j++) {
            if (s->pos[j] < first || s->pos[j] > pos) continue;
            const float *kj = K + (size_t)j * kvd + (size_t)kh * d;
            double dot = 0;
            for (int i = 0; i < d; i++) dot += (double)qh[i] * kj[i];
            s->scores[j] = dot * scale;
            if (s->scores[j] > mx) mx = s->scores[j];
        }
        double sum = 0;
        for (int i = 0; i < d; i++) p[2 + i] = 0;
        if (mx > -INFINITY)
            for (int j = 0; j < s->n; j++) {
                if (s->pos[j] < first || s->pos[j] > pos) continue;
                const float *vj = V + (size_t)j * kvd + (size_t)kh * d;
                const double w = exp(s->scores[j] - mx);
                sum += w;
                for (int i = 0; i < d; i++) p[2 + i] += w * vj[i];
            }
        p[0] = mx;
        p[1] = sum;
    }
    const size_t bytes = sizeof(double) * (size_t)H * stride;
    if (s->ranks > 1) comm_allgather(c, COMM_TEAM, s->part, s->all, bytes, mc);
    else memcpy(s->all, s->part, bytes);
    /* the log-sum-exp merge, in rank order on every rank: o = sum_r acc_r e^(m_r - M) / sum_r s_r e^(m_r - M) */
    for (int h = 0; h < H; h++) {
        double M = -INFINITY;
        for (int r = 0; r < s->ranks; r++) {
            const double m = s->all[((size_t)r * H + h) * stride];
            if (m > M) M = m;
        }
        double sum = 0, *acc = s->part; /* sent already: free for the sum */
        for (int i = 0; i < d; i++) acc[i] = 0;
        for (int r = 0; r < s->ranks; r++) {
            const double *p = s->all + ((size_t)r * H + h) * stride;
            if (!(p[0] > -INFINITY)) continue; /* no key of this rank in reach */
            const double f = exp(p[0] - M);
            sum += p[1] * f;
            for (int i = 0; i < d; i++) acc[i] += p[2 + i] * f;
        }
        for (int i = 0; i < d; i++) o[(size_t)h * d + i] = (float)(acc[i] / sum);
    }
}
