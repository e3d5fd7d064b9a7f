/* Tests of flash attention with bf16 inputs (AttnShape.precision = PRECISION_BF16) on every kernel
 * path this CPU runs: the bf16 tiles (kernels/attn_bf16.h) on the avx512 path of a CPU with
 * AVX512_BF16, the conversion path (the fp32 kernel on the bf16 values) on avx2 and scalar. Every
 * tile table this CPU runs is tested, whichever the dispatch picks: VDPBF16PS, the AMX kernel on
 * the C emulation of its instructions (every CPU with AVX512_BF16: the AMX kernel's indexing,
 * padding, transposition and edges) and the AMX kernel on hardware (a CPU with AMX-BF16 and the
 * Linux tile-data permission); the output names those that ran and those this CPU could not run.
 * Each table's tile_gemm is also checked directly against double products: both orientations of
 * A, ragged M, N and K2 (past 16, 32 and the AMX kernel's 128-word passes), accumulate on and off,
 * alpha, NaN in every word of padding it must not read, C outside M x N untouched, and the two
 * orientations bit-identical.
 * Each is checked against a scalar double-precision reference on the same bf16-rounded q, k, v,
 * dout: forward O and LSE, backward dQ, dK, dV (backward given the reference's lse and delta, so
 * that each direction is measured alone), over MHA / GQA / MQA, head_dim 32, 64, 128 and the odd
 * 17 (a padded pair), causal, full, packed documents and sliding windows (alone, with documents,
 * on a block pair), contiguous / zigzag / random positions, a query block against a key block of
 * other positions, lengths that leave ragged, odd-sized
 * tiles (1, 37, 301, 700), keys in two parts merged by successive calls, and NULL gradients.
 *
 * Tolerances. The bf16 tiles round P (forward, and backward for dV) and dS (backward, for dQ and dK)
 * to bf16 before their products: bf16 keeps 8 significant bits, so each rounding moves an element
 * by at most 2^-8 of itself, and an output by at most 2^-8 of the sum of the absolute terms of its
 * product (q, k, v, dout are bf16 already; their products are exact in fp32). Allowed:
 *   O  : 2^-7 sum_j p_ij |v_jc|              + the fp32 kernel's 1e-5 + 1e-4 |O|
 *   dV : 2^-7 sum_i p_ij |dO_ic|             + the fp32 kernel's 1e-4 + 1e-3 |dV|
 *   dQ : 2^-7 scale sum_j |dS_ij| |k_jc|     + the same
 *   dK : 2^-7 scale sum_i |dS_ij| |q_ic|     + the same
 *   LSE: fp32 (scores and softmax are fp32 in every path; the tiles' softmax exp2, whose values are
 *        rounded to bf16 next, has a relative error of 2.7e-6, within it): 2e-5 + 2e-6 |LSE|
 * i.e. twice the bound of one rounding, plus what the fp32 kernel is allowed against the same
 * reference (tests/test_attention.c). The largest violation (1 = at tolerance) is printed per
 * path. That the tiles really round is checked too: their O differs from the fp32 kernel's on the
 * same inputs (the conversion path's equals it bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "kernels/amx_tiles.h"
#include "kernels/attn_bf16.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "testlib.h"

#define BF16_BOUND 0x1p-7 /* twice the largest relative error of one rounding to bf16 (2^-8) */
#define FWD_ATOL 1e-5
#define FWD_RTOL 1e-4
#define BWD_ATOL 1e-4
#define BWD_RTOL 1e-3
#define LSE_ATOL 2e-5
#define LSE_RTOL 2e-6

enum { POS_CONTIG, POS_ZIGZAG, POS_RANDOM };

typedef struct {
    const char *name;
    int n_q, n_kv, H, Hkv, d;
    AttnMask mask;
    int layout;    /* positions of the query block (the keys are contiguous before or around it) */
    int kv_offset; /* keys at positions kv_offset .. ; queries at 0.. (a block pair of other positions) */
    int doc_every; /* > 0: packed documents, a new one at each token with probability 1/doc_every */
    int window;    /* > 0: a sliding window (AttnShape.window) */
    float ramp;    /* > 0: q times ramp and key j times 1 + ramp j / n_kv (bf16 values again): scores that
                    * grow along the keys by dozens in log2 units, so that a query's maximum grows past
                    * the forward's lazy reference (LAZY_MAX_LOG2) again and again, and below it too */
} Case;

static Rng rng;
static double worst_fwd, worst_lse, worst_bwd; /* of the current path */

static float *bf16_normal(size_t n) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_float(bf16_from_float((float)rng_normal(&rng)));
    return x;
}

static void make_positions(int layout, int n, int *pos) {
    for (int i = 0; i < n; i++) pos[i] = i;
    if (layout == POS_ZIGZAG) { /* 4 chunks, stored as chunks 0, 3, 1, 2 */
        int at = 0;
        const int order[4] = {0, 3, 1, 2};
        for (int c = 0; c < 4; c++)
            for (int t = order[c] * n / 4; t < (order[c] + 1) * n / 4; t++) pos[at++] = t;
    } else if (layout == POS_RANDOM) {
        for (int i = n - 1; i > 0; i--) {
            int j = (int)rng_below(&rng, (uint64_t)i + 1), t = pos[i];
            pos[i] = pos[j];
            pos[j] = t;
        }
    }
}

static int is_visible(const Case *c, const int *qp, const int *qd, const int *kp, const int *kd, int i, int j) {
    if (c->mask == ATTN_FULL) return 1;
    if (qd && qd[i] != kd[j]) return 0;
    if (c->window > 0 && qp[i] - kp[j] >= c->window) return 0;
    return kp[j] <= qp[i];
}

/* The double reference: o, lse and the bound sum_j p |v| of O; backward dq, dk, dv and their bound
 * sums, from lse and delta in double. Layouts as the kernel's. */
typedef struct {
    double *o, *lse, *ob, *dq, *dk, *dv, *dqb, *dkb, *dvb;
    float *lse_f, *delta_f; /* for the kernel's backward */
} Ref;

static void reference(const Case *c, const AttnShape *s, const float *q, const float *k, const float *v,
                      const float *dout, const int *qp, const int *qd, const int *kp, const int *kd, Ref *R) {
    const int H = c->H, Hkv = c->Hkv, d = c->d, G = H / Hkv, nq = c->n_q, nk = c->n_kv;
    const size_t Q = (size_t)nq * H * d, K = (size_t)nk * Hkv * d;
    R->o = xcalloc(Q, sizeof(double)), R->ob = xcalloc(Q, sizeof(double)), R->dq = xcalloc(Q, sizeof(double));
    R->dqb = xcalloc(Q, sizeof(double)), R->lse = xcalloc((size_t)nq * H, sizeof(double));
    R->dk = xcalloc(K, sizeof(double)), R->dv = xcalloc(K, sizeof(double)), R->dkb = xcalloc(K, sizeof(double));
    R->dvb = xcalloc(K, sizeof(double));
    R->lse_f = xmalloc(sizeof(float) * (size_t)(nq * H > 0 ? nq * H : 1));
    R->delta_f = xmalloc(sizeof(float) * (size_t)(nq * H > 0 ? nq * H : 1));
    double *p = xmalloc(sizeof(double) * (size_t)(nk + 1));
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < H; h++) {
            const float *qi = q + ((size_t)i * H + h) * d, *doi = dout + ((size_t)i * H + h) * d;
            const int g = h / G;
            double mx = -INFINITY;
            for (int j = 0; j < nk; j++) {
                p[j] = -INFINITY;
                if (!is_visible(c, qp, qd, kp, kd, i, j)) continue;
                const float *kj = k + ((size_t)j * Hkv + g) * d;
                double dot = 0;
                for (int e = 0; e < d; e++) dot += (double)qi[e] * kj[e];
                p[j] = s->scale * dot;
                mx = fmax(mx, p[j]);
            }
            const size_t row = (size_t)i * H + h;
            double *oi = R->o + row * d, *obi = R->ob + row * d;
            if (mx == -INFINITY) {
                R->lse[row] = -INFINITY;
                R->lse_f[row] = -INFINITY;
                R->delta_f[row] = 0;
                continue;
            }
            double sum = 0;
            for (int j = 0; j < nk; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
            for (int j = 0; j < nk; j++) p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx) / sum;
            for (int j = 0; j < nk; j++) {
                if (p[j] == 0) continue;
                const float *vj = v + ((size_t)j * Hkv + g) * d;
                for (int e = 0; e < d; e++) oi[e] += p[j] * vj[e], obi[e] += p[j] * fabs((double)vj[e]);
            }
            R->lse[row] = mx + log(sum);
            double delta = 0;
            for (int e = 0; e < d; e++) delta += (double)doi[e] * oi[e];
            R->lse_f[row] = (float)R->lse[row];
            R->delta_f[row] = (float)delta;
            for (int j = 0; j < nk; j++) {
                if (p[j] == 0) continue;
                const size_t kr = ((size_t)j * Hkv + g) * d;
                const float *vj = v + kr, *kj = k + kr;
                double dp = 0;
                for (int e = 0; e < d; e++) dp += (double)doi[e] * vj[e];
                const double ds = p[j] * (dp - delta);
                for (int e = 0; e < d; e++) {
                    R->dv[kr + e] += p[j] * doi[e];
                    R->dvb[kr + e] += p[j] * fabs((double)doi[e]);
                    R->dq[row * d + e] += s->scale * ds * kj[e];
                    R->dqb[row * d + e] += s->scale * fabs(ds) * fabs((double)kj[e]);
                    R->dk[kr + e] += s->scale * ds * qi[e];
                    R->dkb[kr + e] += s->scale * fabs(ds) * fabs((double)qi[e]);
                }
            }
        }
    xfree(p);
}

static void ref_free(Ref *R) {
    double *a[] = {R->o, R->lse, R->ob, R->dq, R->dk, R->dv, R->dqb, R->dkb, R->dvb};
    for (size_t i = 0; i < ARRAY_LEN(a); i++) xfree(a[i]);
    xfree(R->lse_f);
    xfree(R->delta_f);
}

/* max over n of |got - want| / (BF16_BOUND bound + atol + rtol |want|); NaN counts as infinite */
static double violation(const float *got, const double *want, const double *bound, size_t n, double atol,
                        double rtol) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = (bound ? BF16_BOUND * bound[i] : 0) + atol + rtol * fabs(want[i]);
        double e = fabs((double)got[i] - want[i]) / tol;
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

static double lse_violation(const float *got, const double *want, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (want[i] == -INFINITY) {
            if (got[i] != -INFINITY) w = INFINITY;
            continue;
        }
        double e = fabs((double)got[i] - want[i]) / (LSE_ATOL + LSE_RTOL * fabs(want[i]));
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

static void run_case(const Case *c, int tiles) {
    const int H = c->H, Hkv = c->Hkv, d = c->d, nq = c->n_q, nk = c->n_kv;
    const size_t Q = (size_t)nq * H * d, K = (size_t)nk * Hkv * d, L = (size_t)nq * H;
    AttnShape s = {.n_q = nq, .n_kv = nk, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d,
                   .scale = 1.0f / sqrtf((float)d), .mask = c->mask, .window = c->window, .precision = PRECISION_BF16};
    float *q = bf16_normal(Q), *k = bf16_normal(K), *v = bf16_normal(K), *dout = bf16_normal(Q);
    if (c->ramp > 0) {
        for (size_t i = 0; i < Q; i++) q[i] = bf16_to_float(bf16_from_float(q[i] * c->ramp));
        for (int j = 0; j < nk; j++)
            for (size_t e = 0; e < (size_t)Hkv * d; e++) {
                float *x = k + (size_t)j * Hkv * d + e;
                *x = bf16_to_float(bf16_from_float(*x * (1.0f + c->ramp * (float)j / (float)nk)));
            }
    }
    int *qp = xmalloc(sizeof(int) * (size_t)(nq + 1)), *kp = xmalloc(sizeof(int) * (size_t)(nk + 1));
    int *qd = NULL, *kd = NULL;
    make_positions(c->layout, nq, qp);
    for (int j = 0; j < nk; j++) kp[j] = c->kv_offset + j;
    if (c->doc_every > 0) { /* ids by position: a new document at each position with probability 1/doc_every */
        const int span = (nq > c->kv_offset + nk ? nq : c->kv_offset + nk) + 1;
        int *doc_of = xmalloc(sizeof(int) * (size_t)span), id = 0;
        for (int t = 0; t < span; t++) doc_of[t] = t > 0 && rng_below(&rng, (uint64_t)c->doc_every) == 0 ? ++id : id;
        qd = xmalloc(sizeof(int) * (size_t)(nq + 1));
        kd = xmalloc(sizeof(int) * (size_t)(nk + 1));
        for (int i = 0; i < nq; i++) qd[i] = doc_of[qp[i]];
        for (int j = 0; j < nk; j++) kd[j] = doc_of[kp[j]];
        xfree(doc_of);
    }
    Ref R;
    reference(c, &s, q, k, v, dout, qp, qd, kp, kd, &R);

    /* forward from a fresh state, keys in one call */
    float *o = xmalloc(sizeof(float) * (Q ? Q : 1)), *lse = xmalloc(sizeof(float) * (L ? L : 1));
    attn_state_init(&s, o, lse);
    attn_forward_docs(&s, q, qp, qd, k, v, kp, kd, o, lse);
    const double vf = violation(o, R.o, R.ob, Q, FWD_ATOL, FWD_RTOL), vl = lse_violation(lse, R.lse, L);
    CHECK(vf <= 1, "%s: O off by %.3g of its tolerance", c->name, vf);
    CHECK(vl <= 1, "%s: LSE off by %.3g of its tolerance", c->name, vl);
    if (getenv("VERBOSE_CASES")) printf("  %s: O %.3f LSE %.3f\n", c->name, vf, vl);
    worst_fwd = fmax(worst_fwd, vf);
    worst_lse = fmax(worst_lse, vl);

    /* keys in two parts merged by successive calls: the same tolerance */
    if (nk >= 2) {
        float *o2 = xmalloc(sizeof(float) * (Q ? Q : 1)), *lse2 = xmalloc(sizeof(float) * (L ? L : 1));
        const int cut = nk / 3 + 1;
        AttnShape a = s, b = s;
        a.n_kv = cut;
        b.n_kv = nk - cut;
        const size_t ko = (size_t)cut * Hkv * d;
        attn_state_init(&s, o2, lse2);
        attn_forward_docs(&a, q, qp, qd, k, v, kp, kd, o2, lse2);
        attn_forward_docs(&b, q, qp, qd, k + ko, v + ko, kp + cut, kd ? kd + cut : NULL, o2, lse2);
        const double v2 = violation(o2, R.o, R.ob, Q, FWD_ATOL, FWD_RTOL);
        CHECK(v2 <= 1 && lse_violation(lse2, R.lse, L) <= 1, "%s: keys in two calls: O off by %.3g", c->name, v2);
        xfree(o2);
        xfree(lse2);
    }

    /* the tiles really round P: O differs from the fp32 kernel's on the same inputs; the
     * conversion path IS the fp32 kernel: bit for bit */
    if (nk > 1 && c->n_q > 1) {
        AttnShape f = s;
        f.precision = PRECISION_FP32;
        float *o3 = xmalloc(sizeof(float) * Q), *lse3 = xmalloc(sizeof(float) * L);
        attn_state_init(&f, o3, lse3);
        attn_forward_docs(&f, q, qp, qd, k, v, kp, kd, o3, lse3);
        const int same = !memcmp(o3, o, sizeof(float) * Q);
        if (tiles) CHECK(!same, "%s: bf16 tiles give the fp32 kernel's O bit for bit: P not rounded?", c->name);
        else CHECK(same, "%s: the conversion path differs from the fp32 kernel", c->name);
        xfree(o3);
        xfree(lse3);
    }

    /* backward from the reference's lse and delta */
    float *dq = xcalloc(Q ? Q : 1, sizeof(float)), *dk = xcalloc(K ? K : 1, sizeof(float));
    float *dv = xcalloc(K ? K : 1, sizeof(float));
    attn_backward_docs(&s, q, qp, qd, k, v, kp, kd, R.lse_f, R.delta_f, dout, dq, dk, dv);
    const double vq = violation(dq, R.dq, R.dqb, Q, BWD_ATOL, BWD_RTOL);
    const double vk = violation(dk, R.dk, R.dkb, K, BWD_ATOL, BWD_RTOL);
    const double vv = violation(dv, R.dv, R.dvb, K, BWD_ATOL, BWD_RTOL);
    CHECK(vq <= 1, "%s: dQ off by %.3g of its tolerance", c->name, vq);
    CHECK(vk <= 1, "%s: dK off by %.3g of its tolerance", c->name, vk);
    CHECK(vv <= 1, "%s: dV off by %.3g of its tolerance", c->name, vv);
    worst_bwd = fmax(worst_bwd, fmax(vq, fmax(vk, vv)));

    /* one gradient at a time: the same values, bit for bit (accumulating into zeros) */
    float *g = xcalloc(Q > K ? Q : K, sizeof(float));
    attn_backward_docs(&s, q, qp, qd, k, v, kp, kd, R.lse_f, R.delta_f, dout, g, NULL, NULL);
    CHECK(!memcmp(g, dq, sizeof(float) * Q), "%s: dQ alone differs from dQ with dK, dV", c->name);
    memset(g, 0, sizeof(float) * (Q > K ? Q : K));
    attn_backward_docs(&s, q, qp, qd, k, v, kp, kd, R.lse_f, R.delta_f, dout, NULL, g, NULL);
    CHECK(!memcmp(g, dk, sizeof(float) * K), "%s: dK alone differs", c->name);
    memset(g, 0, sizeof(float) * (Q > K ? Q : K));
    attn_backward_docs(&s, q, qp, qd, k, v, kp, kd, R.lse_f, R.delta_f, dout, NULL, NULL, g);
    CHECK(!memcmp(g, dv, sizeof(float) * K), "%s: dV alone differs", c->name);

    xfree(g); xfree(dq); xfree(dk); xfree(dv); xfree(o); xfree(lse);
    ref_free(&R);
    xfree(q); xfree(k); xfree(v); xfree(dout); xfree(qp); xfree(kp); xfree(qd); xfree(kd);
}

/* tile_gemm of table t against double products: C (M, N) = alpha A B [+ C0], with A in rows
 * layout (ars = K2 + 3) and transposed (aks = M + 5), over the same logical A. Words of padding
 * hold NaN pairs: a kernel that multiplies one into a result fails. Tolerance: fp32 accumulation
 * of the 2 K2 exact products, (2 K2 + 4) 2^-24 of the sum of the absolute terms (and C0). */
static void check_tile_gemm(const AttnBf16Tiles *t) {
    /* M and K2 of 32: whole row blocks of two whole k-tiles (head_dim 64, AMX's short-contraction
     * rows); alpha 1 too: AMX loads and stores whole tiles of C in place there */
    static const int Ms[] = {1, 16, 17, 32, 33, 50}, Ns[] = {1, 16, 17, 40, 65}, Ks[] = {1, 16, 17, 32, 33, 130};
    const bf16_pair NAN_PAIR = 0x7fc07fc0u;
    double worst = 0;
    int cases = 0;
    for (size_t mi = 0; mi < ARRAY_LEN(Ms); mi++)
        for (size_t ni = 0; ni < ARRAY_LEN(Ns); ni++)
            for (size_t ki = 0; ki < ARRAY_LEN(Ks); ki++)
                for (int acc = 0; acc < 4; acc++) {
                    const int M = Ms[mi], N = Ns[ni], K2 = Ks[ki];
                    const float alpha = acc >= 2 ? 1.0f : acc ? 0.375f : -1.25f;
                    const size_t ars = (size_t)K2 + 3, aks = (size_t)M + 5, ldb = (size_t)N + 2, ldc = (size_t)N + 3;
                    const size_t nr = (size_t)(M - 1) * ars + (size_t)K2, nt = (size_t)(K2 - 1) * aks + (size_t)M + (size_t)t->mr;
                    bf16_pair *Ar = xmalloc(sizeof(bf16_pair) * nr), *At = xmalloc(sizeof(bf16_pair) * nt);
                    bf16_pair *B = xmalloc(sizeof(bf16_pair) * (size_t)K2 * ldb);
                    for (size_t i = 0; i < nr; i++) Ar[i] = NAN_PAIR;
                    for (size_t i = 0; i < nt; i++) At[i] = NAN_PAIR;
                    for (size_t i = 0; i < (size_t)K2 * ldb; i++) B[i] = NAN_PAIR;
                    for (int m = 0; m < M; m++)
                        for (int k = 0; k < K2; k++) {
                            bf16_pair w = (bf16_pair)bf16_from_float((float)rng_normal(&rng)) |
                                          (bf16_pair)bf16_from_float((float)rng_normal(&rng)) << 16;
                            Ar[(size_t)m * ars + k] = w;
                            At[(size_t)k * aks + m] = w;
                        }
                    for (int k = 0; k < K2; k++)
                        for (int n = 0; n < N; n++)
                            B[(size_t)k * ldb + n] = (bf16_pair)bf16_from_float((float)rng_normal(&rng)) |
                                                     (bf16_pair)bf16_from_float((float)rng_normal(&rng)) << 16;
                    const size_t nc = (size_t)(M + 1) * ldc; /* one row past M: must stay untouched */
                    float *C0 = xmalloc(sizeof(float) * nc), *Cr = xmalloc(sizeof(float) * nc);
                    float *Ct = xmalloc(sizeof(float) * nc);
                    for (size_t i = 0; i < nc; i++) C0[i] = (float)rng_normal(&rng);
                    memcpy(Cr, C0, sizeof(float) * nc);
                    memcpy(Ct, C0, sizeof(float) * nc);
                    t->tile_gemm(M, N, K2, alpha, Ar, ars, 1, B, ldb, acc & 1, Cr, ldc, NULL);
                    t->tile_gemm(M, N, K2, alpha, At, 1, aks, B, ldb, acc & 1, Ct, ldc, NULL);
                    double w = 0;
                    int untouched = 1;
                    for (int m = 0; m <= M; m++)
                        for (size_t n = 0; n < ldc; n++) {
                            const size_t i = (size_t)m * ldc + n;
                            if (m == M || n >= (size_t)N) {
                                untouched &= !memcmp(&Cr[i], &C0[i], sizeof(float)) && !memcmp(&Ct[i], &C0[i], sizeof(float));
                                continue;
                            }
                            double ref = 0, mag = 0;
                            for (int k = 0; k < K2; k++) {
                                const bf16_pair a = Ar[(size_t)m * ars + k], b = B[(size_t)k * ldb + n];
                                const double p0 = (double)bf16_to_float((bf16_t)a) * bf16_to_float((bf16_t)b);
                                const double p1 = (double)bf16_to_float((bf16_t)(a >> 16)) * bf16_to_float((bf16_t)(b >> 16));
                                ref += p0 + p1;
                                mag += fabs(p0) + fabs(p1);
                            }
                            ref *= alpha;
                            mag *= fabs(alpha);
                            if (acc & 1) ref += C0[i], mag += fabs(C0[i]);
                            const double tol = (2.0 * K2 + 4) * 0x1p-24 * mag + 1e-30;
                            const double e = fmax(fabs(Cr[i] - ref), fabs(Ct[i] - ref)) / tol;
                            if (!(e <= w)) w = isnan(e) ? INFINITY : e;
                        }
                    CHECK(w <= 1, "%s tile_gemm M %d N %d K2 %d alpha %g accumulate %d: off by %.3g of its tolerance", t->name, M, N,
                          K2, (double)alpha, acc & 1, w);
                    CHECK(untouched, "%s tile_gemm M %d N %d K2 %d: wrote C outside M x N", t->name, M, N, K2);
                    CHECK(!memcmp(Cr, Ct, sizeof(float) * nc), "%s tile_gemm M %d N %d K2 %d: rows and transposed A differ",
                          t->name, M, N, K2);
                    if (t->tile_gemm_panels) { /* A in panels (zero past M): rows layout's C bit for bit */
                        const int pm = t->panel_mr, np = (M + pm - 1) / pm;
                        bf16_pair *Ap = xmalloc(sizeof(bf16_pair) * (size_t)np * pm * K2);
                        for (int m = 0; m < np * pm; m++)
                            for (int k = 0; k < K2; k++)
                                Ap[(size_t)(m / pm) * pm * K2 + (size_t)k * pm + m % pm] =
                                    m < M ? Ar[(size_t)m * ars + k] : 0u;
                        float *Cp = xmalloc(sizeof(float) * nc);
                        memcpy(Cp, C0, sizeof(float) * nc);
                        t->tile_gemm_panels(M, N, K2, alpha, Ap, B, ldb, acc & 1, Cp, ldc, NULL);
                        CHECK(!memcmp(Cp, Cr, sizeof(float) * nc), "%s tile_gemm_panels M %d N %d K2 %d: not the rows layout's C",
                              t->name, M, N, K2);
                        xfree(Ap); xfree(Cp);
                    }
                    worst = fmax(worst, w);
                    cases++;
                    xfree(Ar); xfree(At); xfree(B); xfree(C0); xfree(Cr); xfree(Ct);
                }
    if (t->pack_panels) { /* pack_panels: pack_rows' words laid out in panels, zero rows past the last */
        static const int rows_c[] = {1, 6, 13, 40}, cols_c[] = {1, 64, 77, 200};
        for (size_t ri = 0; ri < ARRAY_LEN(rows_c); ri++)
            for (size_t ci = 0; ci < ARRAY_LEN(cols_c); ci++) {
                const int rows = rows_c[ri], cols = cols_c[ci], k2 = (cols + 1) / 2, pm = t->panel_mr;
                const int np = (rows + pm - 1) / pm;
                const size_t lds = (size_t)cols + 3;
                float *src = xmalloc(sizeof(float) * lds * rows);
                for (size_t i = 0; i < lds * (size_t)rows; i++) src[i] = (float)rng_normal(&rng);
                bf16_pair *rw = xmalloc(sizeof(bf16_pair) * (size_t)rows * k2);
                bf16_pair *pp = xmalloc(sizeof(bf16_pair) * (size_t)np * pm * k2);
                for (size_t i = 0; i < (size_t)np * pm * k2; i++) pp[i] = NAN_PAIR;
                t->pack_rows(rows, cols, src, lds, rw, (size_t)k2);
                t->pack_panels(rows, cols, src, lds, pp);
                int same = 1;
                for (int m = 0; m < np * pm; m++)
                    for (int k = 0; k < k2; k++)
                        same &= pp[(size_t)(m / pm) * pm * k2 + (size_t)k * pm + m % pm] ==
                                (m < rows ? rw[(size_t)m * k2 + k] : 0u);
                CHECK(same, "%s pack_panels %d x %d: not pack_rows' words in panels of %d rows", t->name, rows, cols, pm);
                xfree(src); xfree(rw); xfree(pp);
            }
    }
    /* K2 = 0: C = 0, or unchanged when accumulating */
    float c[6] = {1, 2, 3, 4, 5, 6};
    bf16_pair dummy = 0;
    t->tile_gemm(2, 3, 0, 1.0f, &dummy, 1, 1, &dummy, 3, 1, c, 3, NULL);
    CHECK(c[0] == 1 && c[5] == 6, "%s tile_gemm K2 0 accumulate: C changed", t->name);
    t->tile_gemm(2, 3, 0, 1.0f, &dummy, 1, 1, &dummy, 3, 0, c, 3, NULL);
    CHECK(c[0] == 0 && c[5] == 0, "%s tile_gemm K2 0: C not zeroed", t->name);
    if (t == attn_bf16_tiles_for(ATTN_BF16_AMX_EMULATED))
        CHECK(!amx_emu_configured(), "%s: tile configuration left loaded after tile_gemm (no TILERELEASE)", t->name);
    printf("%s: tile_gemm %d shapes x 2 orientations, largest violation %.3f (1 = at tolerance)\n", t->name, cases, worst);
}

static const Case CASES[] = {
    {"MHA d=64 S=301 causal", 301, 301, 4, 4, 64, ATTN_CAUSAL, POS_CONTIG, 0, 0, 0, 0},
    {"GQA 4/2 d=32 S=301 causal zigzag", 301, 301, 4, 2, 32, ATTN_CAUSAL, POS_ZIGZAG, 0, 0, 0, 0},
    {"MQA 4/1 d=128 S=301 causal random order", 301, 301, 4, 1, 128, ATTN_CAUSAL, POS_RANDOM, 0, 0, 0, 0},
    {"MHA d=64 S=700 causal", 700, 700, 2, 2, 64, ATTN_CAUSAL, POS_CONTIG, 0, 0, 0, 0},
    {"GQA 2/1 d=64 S=200 full", 200, 200, 2, 1, 64, ATTN_FULL, POS_CONTIG, 0, 0, 0, 0},
    {"GQA 4/2 d=64 S=301 packed documents", 301, 301, 4, 2, 64, ATTN_CAUSAL, POS_CONTIG, 0, 60, 0, 0},
    {"MHA d=32 S=301 packed short documents, random order", 301, 301, 2, 2, 32, ATTN_CAUSAL, POS_RANDOM, 0, 7, 0, 0},
    {"MQA 2/1 d=17 (odd) S=257 packed documents", 257, 257, 2, 1, 17, ATTN_CAUSAL, POS_CONTIG, 0, 40, 0, 0},
    {"GQA 6/2 d=128 S=37 causal", 37, 37, 6, 2, 128, ATTN_CAUSAL, POS_CONTIG, 0, 0, 0, 0},
    {"MHA d=64 queries 150 after keys 263 (block pair)", 150, 263, 2, 2, 64, ATTN_CAUSAL, POS_CONTIG, -100, 0, 0, 0},
    {"MHA d=64 S=1", 1, 1, 2, 2, 64, ATTN_CAUSAL, POS_CONTIG, 0, 0, 0, 0},
    {"GQA 4/2 d=64 S=301 causal window 40", 301, 301, 4, 2, 64, ATTN_CAUSAL, POS_CONTIG, 0, 0, 40, 0},
    {"MHA d=32 S=700 causal window 200, zigzag", 700, 700, 2, 2, 32, ATTN_CAUSAL, POS_ZIGZAG, 0, 0, 200, 0},
    {"MQA 4/1 d=17 (odd) S=257 window 5, random order", 257, 257, 4, 1, 17, ATTN_CAUSAL, POS_RANDOM, 0, 0, 5, 0},
    {"GQA 4/2 d=64 S=301 packed documents, window 23", 301, 301, 4, 2, 64, ATTN_CAUSAL, POS_CONTIG, 0, 60, 23, 0},
    {"MHA d=64 queries 150 after keys 263 (block pair), window 120", 150, 263, 2, 2, 64, ATTN_CAUSAL, POS_CONTIG, -100, 0,
     120, 0},
    {"MHA d=64 S=700 causal, scores growing along the keys", 700, 700, 2, 2, 64, ATTN_CAUSAL, POS_CONTIG, 0, 0, 0, 6.0f},
    {"GQA 4/2 d=128 S=500 full, scores growing along the keys", 500, 500, 4, 2, 128, ATTN_FULL, POS_CONTIG, 0, 0, 0, 4.0f},
};

/* The softmax step that packs P (col_exp2_pairs, shared by every table) against double exp2: the
 * fp32 column sums within 3e-6 relative (its exp2's error is 2.7e-6: the LSE stays within the fp32
 * kernel's tolerance), every packed value within one bf16 rounding of 2^(alpha s - m), exactly 0
 * for -inf scores and arguments below -126 (far below, and between -149 and -126, where fp32 has
 * only denormals: the bf16 conversion flushes them), and the pad half of an odd last row 0. 37 rows
 * x 53 columns (ragged vectors), stride 61. */
static void check_softmax_pack(const AttnBf16Tiles *t) {
    enum { R = 37, NC = 53, LD = 61 };
    float s[R * LD], m[NC], sum[NC];
    bf16_pair w[(R + 1) / 2 * LD];
    const float alpha = 0.18033688f; /* 1 / sqrt(64) * log2(e) */
    for (int j = 0; j < R * LD; j++) s[j] = (float)(12.0 * rng_normal(&rng));
    for (int j = 0; j < R; j++) { /* masked keys, arguments far below -126 and just below it */
        s[j * LD + (j * 7) % NC] = -INFINITY;
        s[j * LD + (j * 11 + 3) % NC] = -3000.0f;
        s[j * LD + (j * 13 + 5) % NC] = -750.0f; /* alpha s = -135.3, the column's m about 2-6 above 0 */
    }
    for (int i = 0; i < NC; i++) {
        float mx = -INFINITY;
        for (int j = 0; j < R; j++) mx = fmaxf(mx, alpha * s[j * LD + i]);
        m[i] = mx;
    }
    memset(w, 0xff, sizeof w);
    t->col_exp2_pairs(s, R, NC, LD, alpha, m, sum, w, LD, NULL);
    double worst_sum = 0, worst_p = 0;
    int exact_zero = 1, pad = 1, denormal_band = 0;
    for (int i = 0; i < NC; i++) {
        double want = 0;
        for (int j = 0; j < R; j++) {
            const double x = (double)alpha * s[j * LD + i] - m[i];
            const double e = x == -INFINITY || x < -126.0 ? 0.0 : exp2(x);
            denormal_band += x >= -149.0 && x < -126.0;
            want += e;
            const bf16_pair word = w[(j / 2) * LD + i];
            const double got = bf16_to_float((bf16_t)(j % 2 ? word >> 16 : word & 0xffff));
            if (e == 0) exact_zero &= got == 0;
            else worst_p = fmax(worst_p, fabs(got - e) / (0x1p-8 * e + 1e-30));
        }
        pad &= (w[(R / 2) * LD + i] >> 16) == 0;
        worst_sum = fmax(worst_sum, fabs(sum[i] - want) / want);
    }
    CHECK(worst_sum <= 3e-6, "%s col_exp2_pairs: column sums off by %.3g relative (allowed 3e-6)", t->name, worst_sum);
    CHECK(worst_p <= 1.0, "%s col_exp2_pairs: a packed p off by %.3g bf16 roundings", t->name, worst_p);
    CHECK(exact_zero, "%s col_exp2_pairs: a masked or underflowing p is not exactly 0", t->name);
    CHECK(pad, "%s col_exp2_pairs: the odd last row's pad half is not 0", t->name);
    CHECK(denormal_band > 0, "%s col_exp2_pairs: no argument between -149 and -126 was tried", t->name);
}

/* col_exp2_pairs keeping each column's largest argument (xmax, for the forward's try of the current
 * maxima): xmax[i] the largest fp32 alpha s - m of the column (within one fp32 rounding of the
 * double value), -inf for a column of -inf scores, and P's words and the sums bit for bit those of
 * the call without it. 37 rows x 53 columns, stride 61, one column all -inf. */
static void check_softmax_xmax(const AttnBf16Tiles *t) {
    enum { R = 37, NC = 53, LD = 61 };
    float s[R * LD], m[NC], sum1[NC], sum2[NC], xmax[NC + 3];
    bf16_pair w1[(R + 1) / 2 * LD], w2[(R + 1) / 2 * LD];
    const float alpha = 0.18033688f;
    for (int j = 0; j < R * LD; j++) s[j] = (float)(12.0 * rng_normal(&rng));
    for (int j = 0; j < R; j++) s[j * LD + 5] = -INFINITY, s[j * LD + (j * 7) % NC] = -INFINITY;
    for (int i = 0; i < NC; i++) m[i] = (float)(3.0 * rng_normal(&rng)); /* any reference, as in a try */
    memset(w1, 0xff, sizeof w1);
    memset(w2, 0xff, sizeof w2);
    for (int i = 0; i < NC + 3; i++) xmax[i] = 12345.0f;
    t->col_exp2_pairs(s, R, NC, LD, alpha, m, sum1, w1, LD, NULL);
    t->col_exp2_pairs(s, R, NC, LD, alpha, m, sum2, w2, LD, xmax);
    int same = memcmp(sum1, sum2, sizeof sum1) == 0 && memcmp(w1, w2, sizeof w1) == 0, close = 1;
    for (int i = 0; i < NC; i++) {
        double want = -INFINITY;
        for (int j = 0; j < R; j++) want = fmax(want, (double)alpha * s[j * LD + i] - m[i]);
        if (want == -INFINITY) close &= xmax[i] == -INFINITY;
        else close &= fabs(xmax[i] - want) <= fabs(want) * 0x1p-23 + 1e-30;
    }
    CHECK(same, "%s col_exp2_pairs with xmax: P or the sums differ from the call without it", t->name);
    CHECK(close && xmax[5] == -INFINITY, "%s col_exp2_pairs: a column's largest argument is wrong", t->name);
    CHECK(xmax[NC] == 12345.0f && xmax[NC + 2] == 12345.0f, "%s col_exp2_pairs: xmax written past n", t->name);
}

/* The backward's probabilities (row_exp2_pairs, shared by every table) against double exp2: every
 * fp32 p written back within 3e-6 relative of 2^(alpha s - m) (the forward's exp2), every packed
 * value within one bf16 rounding, exactly 0 for -inf scores, arguments below -126 and a row whose
 * m is +inf (a hidden row), and the pad half of an odd last row 0. 37 rows x 53 columns (ragged
 * vectors), stride 61; the columns past 53 untouched. */
static void check_row_exp2_pairs(const AttnBf16Tiles *t) {
    enum { R = 37, NC = 53, LD = 61 };
    float s[R * LD], p[R * LD], m[R];
    bf16_pair w[(R + 1) / 2 * LD];
    const float alpha = 0.18033688f;
    for (int j = 0; j < R * LD; j++) s[j] = (float)(12.0 * rng_normal(&rng));
    for (int r = 0; r < R; r++) {
        s[r * LD + (r * 7) % NC] = -INFINITY;
        s[r * LD + (r * 11 + 3) % NC] = -3000.0f;
        s[r * LD + (r * 13 + 5) % NC] = -750.0f;
        float mx = -INFINITY;
        for (int j = 0; j < NC; j++) mx = fmaxf(mx, alpha * s[r * LD + j]);
        m[r] = mx + (float)(r % 5); /* an lse lies at or above the row's maximum */
    }
    m[4] = INFINITY; /* a hidden row */
    memcpy(p, s, sizeof p);
    memset(w, 0xff, sizeof w);
    t->row_exp2_pairs(p, R, NC, LD, alpha, m, w, LD);
    double worst_f = 0, worst_w = 0;
    int exact_zero = 1, pad = 1, untouched = 1, hidden = 1;
    for (int r = 0; r < R; r++) {
        for (int j = 0; j < NC; j++) {
            const double x = (double)alpha * s[r * LD + j] - m[r];
            const double e = x == -INFINITY || x < -126.0 || m[r] == INFINITY ? 0.0 : exp2(x);
            const float got = p[r * LD + j];
            const bf16_pair word = w[(r / 2) * LD + j];
            const double gw = bf16_to_float((bf16_t)(r % 2 ? word >> 16 : word & 0xffff));
            if (e == 0) exact_zero &= gw == 0 && (got == 0 || (x < -126.0 && got < 0x1p-126f));
            else {
                worst_f = fmax(worst_f, fabs(got - e) / e);
                worst_w = fmax(worst_w, fabs(gw - e) / (0x1p-8 * e + 1e-30));
            }
            if (m[r] == INFINITY) hidden &= got == 0 && gw == 0;
        }
        for (int j = NC; j < LD; j++) untouched &= memcmp(&p[r * LD + j], &s[r * LD + j], sizeof(float)) == 0;
    }
    for (int j = 0; j < NC; j++) pad &= (w[(R / 2) * LD + j] >> 16) == 0;
    CHECK(worst_f <= 3e-6, "%s row_exp2_pairs: an fp32 p off by %.3g relative (allowed 3e-6)", t->name, worst_f);
    CHECK(worst_w <= 1.0, "%s row_exp2_pairs: a packed p off by %.3g bf16 roundings", t->name, worst_w);
    CHECK(exact_zero, "%s row_exp2_pairs: a masked or underflowing p is not 0", t->name);
    CHECK(hidden, "%s row_exp2_pairs: a row with m = +inf is not all 0", t->name);
    CHECK(pad, "%s row_exp2_pairs: the odd last row's pad half is not 0", t->name);
    CHECK(untouched, "%s row_exp2_pairs: a column past n was written", t->name);
}

static void run_cases(const char *label, int tiles) {
    worst_fwd = worst_lse = worst_bwd = 0;
    double t0 = now_seconds();
    for (size_t i = 0; i < ARRAY_LEN(CASES); i++) run_case(&CASES[i], tiles);
    printf("%s, attention %s: %zu cases in %.1f s; largest violation (1 = at tolerance): O %.3f, LSE %.3f, "
           "gradients %.3f\n", label, attn_kernel_name(PRECISION_BF16), ARRAY_LEN(CASES), now_seconds() - t0, worst_fwd,
           worst_lse, worst_bwd);
}

static void append(char *dst, size_t n, const char *what) {
    snprintf(dst + strlen(dst), n - strlen(dst), "%s%s", *dst ? ", " : "", what);
}

int main(void) {
    rng_seed(&rng, 20261122);
    const IsaLevel best = isa_best(), saved = isa_active();
    const int saved_amx = isa_amx();
    const int has_bf16 = cpu_features()->avx512_bf16;
    char tested[512] = "", missing[512] = "", why[200];

    /* every tile table this CPU runs: tile_gemm directly */
    for (int kd = 0; kd < ATTN_BF16_KINDS; kd++) {
        const AttnBf16Tiles *t = attn_bf16_tiles_for((AttnBf16Kind)kd);
        if (t) check_tile_gemm(t);
        if (t) check_softmax_pack(t);
        if (t) check_softmax_xmax(t);
        if (t) check_row_exp2_pairs(t);
    }

    /* the dispatch on each kernel path, and what it picks there */
    for (int l = ISA_SCALAR; l < ISA_COUNT; l++) {
        if (!isa_force((IsaLevel)l)) {
            char m[64];
            snprintf(m, sizeof m, "%s (%s)", isa_name((IsaLevel)l), l == ISA_AVX512 && has_bf16 ? "bf16 tiles" : "conversion path");
            append(missing, sizeof missing, m);
            continue;
        }
        const AttnBf16Tiles *want = NULL;
        if (l == ISA_AVX512 && has_bf16) want = attn_bf16_tiles_for(isa_amx() ? ATTN_BF16_AMX : ATTN_BF16_VDPBF16PS);
        const AttnBf16Tiles *tiles = attn_bf16_tiles();
        CHECK(tiles == want, "kernel path %s (amx %s): the dispatch chose %s, not %s", isa_name((IsaLevel)l),
              isa_amx() ? "on" : "off", tiles ? tiles->name : "no tiles", want ? want->name : "no tiles");
        CHECK(!strcmp(attn_kernel_name(PRECISION_BF16), tiles ? tiles->name : "fp32 on bf16 inputs (conversion path)"),
              "attn_kernel_name: %s", attn_kernel_name(PRECISION_BF16));
        char label[64];
        snprintf(label, sizeof label, "kernel path %s", isa_path_name());
        run_cases(label, tiles != NULL);
        char t[128];
        snprintf(t, sizeof t, "%s (%s)", isa_path_name(), attn_kernel_name(PRECISION_BF16));
        append(tested, sizeof tested, t);
    }

    /* the tile tables the dispatch did not pick, on the avx512 path through attn_bf16_tiles_use */
    if (isa_force(ISA_AVX512)) {
        const AttnBf16Tiles *picked = attn_bf16_tiles();
        for (int kd = 0; kd < ATTN_BF16_KINDS; kd++) {
            const AttnBf16Tiles *t = attn_bf16_tiles_for((AttnBf16Kind)kd);
            if (!t || t == picked) continue;
            attn_bf16_tiles_use(t);
            CHECK(attn_bf16_tiles() == t, "attn_bf16_tiles_use(%s) took no effect", t->name);
            char label[96];
            snprintf(label, sizeof label, "kernel path avx512, tiles set by the test");
            run_cases(label, 1);
            append(tested, sizeof tested, t->name);
            attn_bf16_tiles_use(NULL);
        }
    }
    isa_force(saved);
    isa_force_amx(saved_amx);

    /* the line the issue asks for: which AMX tables ran, and why not */
    if (!has_bf16 && best == ISA_AVX512) append(missing, sizeof missing, "bf16 tiles (no AVX512_BF16)");
    snprintf(why, sizeof why, "CPU lacks avx512_bf16 (the packers)");
    if (!amx_available(why, sizeof why) || !has_bf16) {
        char m[256];
        snprintf(m, sizeof m, "amx (hardware): %s", why);
        append(missing, sizeof missing, m);
    }
    char hw[240] = "exercised";
    if (!attn_bf16_tiles_for(ATTN_BF16_AMX)) snprintf(hw, sizeof hw, "not run, %s", why);
    printf("amx (emulated): %s; amx (hardware): %s\n",
           attn_bf16_tiles_for(ATTN_BF16_AMX_EMULATED) ? "exercised" : "not run, CPU lacks avx512_bf16 (the packers)", hw);
    printf("bf16 attention paths tested: %s\n", tested);
    printf("bf16 attention paths this CPU cannot run: %s\n", *missing ? missing : "none");
    return test_summary("test_attention_bf16");
}
