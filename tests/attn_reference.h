/* The single-process attention reference the distributed-attention tests compare against: random
 * q, k, v, dout for a whole sequence (same seed on every rank), the kernel's causal forward and
 * backward over positions 0..S-1, and helpers to take a rank's rows and measure its error.
 * Header-only (static inline) so each test stays one .c file. */
#ifndef SEQPAR_TEST_ATTN_REFERENCE_H
#define SEQPAR_TEST_ATTN_REFERENCE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"

/* Tolerances of the distributed-attention tests (fp32 everywhere; inputs ~N(0,1), at most a few
 * hundred keys per row):
 *   O   absolute 2e-5: o is a convex combination of v rows (|o| < ~4); a distributed result differs
 *       from the reference only in the order of the merges and tile sums (~1e-6 seen).
 *   LSE absolute 2e-5 + 2e-6 relative: |lse| < ~12; log1p merges, stored in fp32.
 *   dQ, dK, dV: 1e-4 x max |reference| of the tensor: the same sums in another order give ~S eps;
 *       a missing or doubled block changes entries by ~1/S, 100x above it. */
#define O_ATOL 2e-5
#define LSE_ATOL 2e-5
#define LSE_RTOL 2e-6
#define GRAD_REL 1e-4

/* This process's rank and the world size (set by the test's main), and how many failures it has
 * printed: CHECKQ prints only the first 25 per rank, so a broken build does not flood the log. */
static int g_rank, g_size, g_fail_prints;
#define CHECKQ(cond, ...) do { \
    if (cond) { tl_passed++; } else { \
        tl_failed++; if (g_fail_prints++ < 25) { fprintf(stderr, "FAIL [rank %d] %s:%d: ", g_rank, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } } while (0)

typedef struct { int H, Hkv, d, S; } HeadCase;

typedef struct {
    HeadCase hc;
    float *q, *k, *v, *dout;       /* inputs (S, H|Hkv, d) */
    float *o, *lse, *dq, *dk, *dv; /* reference outputs */
    double scale_dq, scale_dk, scale_dv; /* max |.| of each gradient: the scale of its tolerance */
} Reference;

static inline float *reference_normal(size_t n, Rng *r) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(r);
    return x;
}

static inline double reference_max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* The reference with a sliding window (AttnShape.window; 0: plain causal). */
static inline void reference_build_window(Reference *R, HeadCase hc, uint64_t seed, int window) {
    memset(R, 0, sizeof *R);
    R->hc = hc;
    const int S = hc.S, H = hc.H, Hkv = hc.Hkv, d = hc.d;
    Rng rng;
    rng_seed(&rng, seed);
    size_t nq = (size_t)S * H * d, nk = (size_t)S * Hkv * d;
    R->q = reference_normal(nq, &rng);
    R->k = reference_normal(nk, &rng);
    R->v = reference_normal(nk, &rng);
    R->dout = reference_normal(nq, &rng);
    R->o = xmalloc(nq * sizeof(float));
    R->lse = xmalloc((size_t)S * H * sizeof(float));
    R->dq = xcalloc(nq, sizeof(float));
    R->dk = xcalloc(nk, sizeof(float));
    R->dv = xcalloc(nk, sizeof(float));
    int *pos = xmalloc(sizeof(int) * (size_t)S);
    for (int i = 0; i < S; i++) pos[i] = i;
    AttnShape s = {.n_q = S, .n_kv = S, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d,
                   .scale = 1.0f / sqrtf((float)d), .mask = ATTN_CAUSAL, .window = window};
    attn_state_init(&s, R->o, R->lse);
    attn_forward(&s, R->q, pos, R->k, R->v, pos, R->o, R->lse);
    float *delta = xmalloc((size_t)S * H * sizeof(float));
    attn_backward_delta(&s, R->o, R->dout, delta);
    attn_backward(&s, R->q, pos, R->k, R->v, pos, R->lse, delta, R->dout, R->dq, R->dk, R->dv);
    R->scale_dq = reference_max_abs(R->dq, nq);
    R->scale_dk = reference_max_abs(R->dk, nk);
    R->scale_dv = reference_max_abs(R->dv, nk);
    xfree(delta);
    xfree(pos);
}

static inline void reference_build(Reference *R, HeadCase hc, uint64_t seed) { reference_build_window(R, hc, seed, 0); }

/* Packed documents: doc_start (S) gives each token's document as the position of its first token
 * (data/packing.h). The reference runs EVERY DOCUMENT SEPARATELY through the plain causal kernel
 * (its rows alone, positions 0..L-1), never the document mask: what a distributed strategy
 * computes with document ids must equal attention run on each document by itself. The inputs are
 * reference_build's (same seed, same values). */
static inline void reference_build_docs(Reference *R, HeadCase hc, uint64_t seed, const int *doc_start) {
    reference_build(R, hc, seed);
    const int S = hc.S, H = hc.H, Hkv = hc.Hkv, d = hc.d;
    const size_t nq = (size_t)S * H * d, nk = (size_t)S * Hkv * d;
    memset(R->dq, 0, nq * sizeof(float));
    memset(R->dk, 0, nk * sizeof(float));
    memset(R->dv, 0, nk * sizeof(float));
    int *pos = xmalloc(sizeof(int) * (size_t)S);
    float *delta = xmalloc((size_t)S * H * sizeof(float));
    for (int i = 0; i < S; i++) pos[i] = i;
    for (int s0 = 0; s0 < S;) {
        int e = s0 + 1;
        while (e < S && doc_start[e] == s0) e++;
        const int L = e - s0;
        AttnShape s = {.n_q = L, .n_kv = L, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d,
                       .scale = 1.0f / sqrtf((float)d), .mask = ATTN_CAUSAL};
        const size_t qo = (size_t)s0 * H * d, ko = (size_t)s0 * Hkv * d, lo = (size_t)s0 * H;
        attn_state_init(&s, R->o + qo, R->lse + lo);
        attn_forward(&s, R->q + qo, pos, R->k + ko, R->v + ko, pos, R->o + qo, R->lse + lo);
        attn_backward_delta(&s, R->o + qo, R->dout + qo, delta + lo);
        attn_backward(&s, R->q + qo, pos, R->k + ko, R->v + ko, pos, R->lse + lo, delta + lo, R->dout + qo, R->dq + qo,
                      R->dk + ko, R->dv + ko);
        s0 = e;
    }
    R->scale_dq = reference_max_abs(R->dq, nq);
    R->scale_dk = reference_max_abs(R->dk, nk);
    R->scale_dv = reference_max_abs(R->dv, nk);
    xfree(delta);
    xfree(pos);
}

/* Document starts (S) of a packed test sequence: a new document at each token with probability
 * 1/5 (seeded), so lengths from 1 up, boundaries inside and at the edges of every rank's slot. */
static inline void reference_doc_starts(int S, uint64_t seed, int *doc_start) {
    Rng r;
    rng_seed(&r, seed);
    int start = 0;
    for (int i = 0; i < S; i++) {
        if (i > 0 && rng_below(&r, 5) == 0) start = i;
        doc_start[i] = start;
    }
}

/* The document ids of a rank's N tokens at positions pos: doc_start of each position, in a buffer
 * the caller frees; NULL when the case is not packed (doc_start NULL). */
static inline int *reference_local_docs(const int *doc_start, const int *pos, int N) {
    if (!doc_start) return NULL;
    int *docs = xmalloc(sizeof(int) * (size_t)N);
    for (int i = 0; i < N; i++) docs[i] = doc_start[pos[i]];
    return docs;
}

static inline void reference_free(Reference *R) {
    float *p[] = {R->q, R->k, R->v, R->dout, R->o, R->lse, R->dq, R->dk, R->dv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) xfree(p[i]);
}

/* x (n, width) = rows pos[0..n) of the global g (S, width). */
static inline void gather_rows(float *x, const float *g, const int *pos, int n, int width) {
    for (int i = 0; i < n; i++) memcpy(x + (size_t)i * width, g + (size_t)pos[i] * width, sizeof(float) * (size_t)width);
}

/* max over the rows of |a - ref| / (atol + rtol |ref|), ref rows taken at positions; NaN wins. */
static inline double row_err(const float *a, const float *gref, const int *pos, int n, int width, double atol,
                             double rtol) {
    double e = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < width; c++) {
            double ref = gref[(size_t)pos[i] * width + c];
            double diff = fabs((double)a[(size_t)i * width + c] - ref) / (atol + rtol * fabs(ref));
            if (!(diff <= e)) e = diff;
        }
    return e;
}

#endif
