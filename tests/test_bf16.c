/* bf16 kernels (kernels/bf16.h) of every path this CPU runs, against double-precision references:
 * fp32 -> bf16 rounding (nearest even, NaN, infinities, denormals, overflow) and each path's
 * conversions bit-identical to the portable one on odd lengths; each path's GEMM (all four
 * transpose cases, padded leading dimensions, alpha, beta) against a double GEMM of the same bf16
 * operands; the bf16 linear layers and the bf16 LM head (ops.h) against double products of
 * bf16-rounded operands.
 * Prints the paths it ran and those this CPU could not. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "testlib.h"

static Rng rng;

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The bf16 nearest to x (ties to even), computed in double from the two candidates. */
static bf16_t reference_round(float x) {
    uint32_t u = bits_of(x);
    if (isnan(x)) return (bf16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0) return (bf16_t)((u >> 16) & 0x8000u); /* denormals flush, as VCVTNE2PS2BF16 */
    if (isinf(x)) return (bf16_t)(u >> 16);
    bf16_t lo = (bf16_t)(u >> 16), hi = (bf16_t)(lo + 1);
    double vlo = fabs((double)bf16_to_float(lo));
    double vhi = (hi & 0x7fffu) == 0x7f80u ? ldexp(1.0, 128) : fabs((double)bf16_to_float(hi)); /* past the top: inf */
    double ax = fabs((double)x);
    if (ax - vlo < vhi - ax) return lo;
    if (ax - vlo > vhi - ax) return hi;
    return (lo & 1u) ? hi : lo;
}

static float special_value(int i) {
    static const uint32_t s[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                 0x7f800001u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu,
                                 0x7f7f7fffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u};
    return float_of(s[(size_t)i % ARRAY_LEN(s)]);
}

static void fill(float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&rng));
}

static void test_rounding(void) {
    int bad = 0;
    for (int i = 0; i < 18; i++) {
        float x = special_value(i);
        bf16_t got = bf16_from_float(x), want = reference_round(x);
        if (got != want && !(isnan(x) && isnan(bf16_to_float(got)))) bad++;
    }
    for (int i = 0; i < 2000000; i++) { /* random bit patterns: every exponent */
        float x = float_of((uint32_t)rng_u64(&rng));
        bf16_t got = bf16_from_float(x), want = reference_round(x);
        if (got != want) { if (bad++ < 5) fprintf(stderr, "  %08x -> %04x, want %04x\n", bits_of(x), got, want); }
    }
    CHECK(bad == 0, "bf16_from_float: %d values not rounded to nearest even", bad);
    CHECK(bf16_from_float(1.00390625f) == 0x3f80 && bf16_from_float(1.01171875f) == 0x3f82, "ties go to even");
    CHECK(isnan(bf16_to_float(bf16_from_float(NAN))) && isinf(bf16_to_float(bf16_from_float(3.4e38f))),
          "NaN stays NaN, overflow rounds to inf");
    int exact = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_float((bf16_t)h);
        if (!isnan(f) && (f == 0 || fpclassify(f) != FP_SUBNORMAL) && bf16_from_float(f) != h) exact = 0;
    }
    CHECK(exact, "every normal bf16 value survives a round trip");
}

static void test_conversions(const Bf16Kernels *k) {
    const char *nm = bf16_path_name(k->path);
    for (int t = 0; t < 40; t++) {
        size_t n = 1 + (size_t)rng_below(&rng, 300);
        float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
        bf16_t *h = xmalloc(sizeof(bf16_t) * (n + 1));
        for (size_t i = 0; i < n; i++)
            x[i] = t % 3 == 0 ? special_value((int)rng_below(&rng, 18)) : t % 3 == 1 ? float_of((uint32_t)rng_u64(&rng))
                                                                                     : (float)rng_normal(&rng);
        h[n] = 0xabcd; /* a guard: tails must not write past n */
        k->pack(h, x, n);
        int same = h[n] == 0xabcd;
        for (size_t i = 0; i < n; i++) {
            bf16_t want = bf16_from_float(x[i]);
            if (h[i] != want && !(isnan(x[i]) && isnan(bf16_to_float(h[i])))) same = 0;
        }
        k->unpack(y, h, n);
        for (size_t i = 0; i < n; i++)
            if (bits_of(y[i]) != (uint32_t)h[i] << 16) same = 0;
        CHECK(same, "%s: pack/unpack of %zu values (case %d) differ from the portable conversion", nm, n, t % 3);
        xfree(x); xfree(y); xfree(h);
    }
}

/* Row-major op(X)(r, c) of a matrix stored (rows, ld). */
static double at(const bf16_t *X, int trans, int ld, int r, int c) {
    return (double)bf16_to_float(trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c]);
}

static void test_gemm(const Bf16Kernels *k) {
    const char *nm = bf16_path_name(k->path);
    for (int t = 0; t < 24; t++) {
        int tA = t & 1, tB = (t >> 1) & 1;
        int M = 1 + (int)rng_below(&rng, 70), N = 1 + (int)rng_below(&rng, 90), K = 1 + (int)rng_below(&rng, 200);
        if (t >= 20) { M = 96 + t; N = 128 + 3 * t; K = 300 + t; } /* larger blocks */
        int lda = (tA ? M : K) + (int)rng_below(&rng, 5), ldb = (tB ? K : N) + (int)rng_below(&rng, 5), ldc = N + 3;
        size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb, nc = (size_t)M * ldc;
        float *af = xmalloc(sizeof(float) * na), *bf = xmalloc(sizeof(float) * nb), *C = xmalloc(sizeof(float) * nc);
        bf16_t *A = xmalloc(sizeof(bf16_t) * na), *B = xmalloc(sizeof(bf16_t) * nb);
        fill(af, na, 1); fill(bf, nb, 1); fill(C, nc, 1);
        bf16_pack(A, af, na);
        bf16_pack(B, bf, nb);
        float *C0 = xmalloc(sizeof(float) * nc);
        memcpy(C0, C, sizeof(float) * nc);
        float alpha = t % 3 == 0 ? 1.0f : 0.75f, beta = t % 4 == 0 ? 0.0f : t % 4 == 1 ? 1.0f : -0.5f;
        k->gemm(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        double worst = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0, mag = 0;
                for (int q = 0; q < K; q++) {
                    double p = at(A, tA, lda, i, q) * at(B, tB, ldb, q, j);
                    s += p;
                    mag += fabs(p);
                }
                double want = alpha * s + (beta != 0 ? beta * C0[(size_t)i * ldc + j] : 0);
                double err = fabs(C[(size_t)i * ldc + j] - want) / (1e-30 + 1e-6 * (fabs(alpha) * mag + fabs(beta * C0[(size_t)i * ldc + j])));
                if (!(err <= worst)) worst = err;
            }
        int pad_ok = 1; /* the padding of C is left alone */
        for (int i = 0; i < M; i++)
            for (int j = N; j < ldc; j++)
                if (bits_of(C[(size_t)i * ldc + j]) != bits_of(C0[(size_t)i * ldc + j])) pad_ok = 0;
        CHECK(worst <= 1 && pad_ok, "%s gemm %c%c M=%d N=%d K=%d alpha %g beta %g: error %.3g of 1e-6 sum|a b|%s", nm,
              tA ? 'T' : 'N', tB ? 'T' : 'N', M, N, K, alpha, beta, worst, pad_ok ? "" : ", wrote C's padding");
        xfree(af); xfree(bf); xfree(C); xfree(C0); xfree(A); xfree(B);
    }
}

/* linear_forward_bf16 / linear_backward_bf16 against double products of the rounded operands;
 * with pad_in / pad_out > 0 the _ld pair on rows that many floats wider than in and out, whose
 * padding (a sentinel) no call may change. */
static void test_linear(int pad_in, int pad_out) {
    const int N = 37, n_in = 53, n_out = 29, li = n_in + pad_in, lo = n_out + pad_out;
    const float SENT = 12345.0f;
    float *in = xmalloc(sizeof(float) * N * li), *W = xmalloc(sizeof(float) * n_out * n_in);
    float *dout = xmalloc(sizeof(float) * N * lo), *out = xmalloc(sizeof(float) * N * lo);
    float *din = xmalloc(sizeof(float) * N * li), *dW = xmalloc(sizeof(float) * n_out * n_in);
    fill(in, (size_t)N * li, 1); fill(W, (size_t)n_out * n_in, 0.1); fill(dout, (size_t)N * lo, 1);
    fill(out, (size_t)N * lo, 1);
    memset(din, 0, sizeof(float) * N * li);
    for (int i = 0; i < N; i++) {
        for (int j = n_out; j < lo; j++) out[i * lo + j] = SENT;
        for (int j = n_in; j < li; j++) din[i * li + j] = SENT;
    }
    float *out0 = xmalloc(sizeof(float) * N * lo);
    memcpy(out0, out, sizeof(float) * N * lo);
    memset(dW, 0, sizeof(float) * n_out * n_in);
    Bf16Scratch scratch = {0};
    if (pad_in || pad_out) {
        linear_forward_bf16_ld(out, lo, in, li, W, N, n_in, n_out, 1, 0, NULL);
        linear_backward_bf16_ld(din, dW, dout, lo, in, li, W, N, n_in, n_out, 0, &scratch);
    } else {
        linear_forward_bf16(out, in, W, N, n_in, n_out, 1, NULL);
        linear_backward_bf16(din, dW, dout, in, W, N, n_in, n_out, &scratch);
    }
    bf16_scratch_free(&scratch);
#define R(x) ((double)bf16_to_float(bf16_from_float(x)))
    double wf = 0, wi = 0, ww = 0;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < n_out; o++) {
            double s = 0, m = 0;
            for (int j = 0; j < n_in; j++) { s += R(in[i * li + j]) * R(W[o * n_in + j]); m += fabs(R(in[i * li + j]) * R(W[o * n_in + j])); }
            double e = fabs(out[i * lo + o] - (out0[i * lo + o] + s)) / (1e-6 * (m + fabs(out0[i * lo + o])));
            if (!(e <= wf)) wf = e;
        }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < n_in; j++) {
            double s = 0, m = 0;
            for (int o = 0; o < n_out; o++) { s += R(dout[i * lo + o]) * R(W[o * n_in + j]); m += fabs(R(dout[i * lo + o]) * R(W[o * n_in + j])); }
            double e = fabs(din[i * li + j] - s) / (1e-30 + 1e-6 * m);
            if (!(e <= wi)) wi = e;
        }
    for (int o = 0; o < n_out; o++)
        for (int j = 0; j < n_in; j++) {
            double s = 0, m = 0;
            for (int i = 0; i < N; i++) { s += R(dout[i * lo + o]) * R(in[i * li + j]); m += fabs(R(dout[i * lo + o]) * R(in[i * li + j])); }
            double e = fabs(dW[o * n_in + j] - s) / (1e-30 + 1e-6 * m);
            if (!(e <= ww)) ww = e;
        }
#undef R
    int pads = 1;
    for (int i = 0; i < N; i++) {
        for (int j = n_out; j < lo; j++) pads &= out[i * lo + j] == SENT;
        for (int j = n_in; j < li; j++) pads &= din[i * li + j] == SENT;
    }
    CHECK(wf <= 1 && wi <= 1 && ww <= 1 && pads, "bf16 linear (rows %d and %d floats apart): forward %.3g, din %.3g, dW %.3g of 1e-6 sum|a b|%s",
          li, lo, wf, wi, ww, pads ? "" : ", wrote the rows' padding");
    xfree(in); xfree(W); xfree(dout); xfree(out); xfree(out0); xfree(din); xfree(dW);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * n) == 0; }

/* Operands marked BF16_*_ROUNDED (ops.h) give the same results bit for bit as the same operands
 * unmarked, on rows with and without padding; the producers that round as they make (the *_bf16
 * functions of ops.h) equal their fp32 forms followed by bf16_round; bf16_unrounded finds the
 * first element that is not a bf16 value and passes NaN. */
static void test_rounded_operands(int pad) {
    const int N = 41, n_in = 48, n_out = 24, li = n_in + pad, lo = n_out + pad;
    const size_t nx = (size_t)N * li, nd = (size_t)N * lo, nw = (size_t)n_out * n_in;
    float *in = xmalloc(sizeof(float) * nx), *dout = xmalloc(sizeof(float) * nd), *W = xmalloc(sizeof(float) * nw);
    float *o1 = xmalloc(sizeof(float) * nd), *o2 = xmalloc(sizeof(float) * nd);
    float *di1 = xmalloc(sizeof(float) * nx), *di2 = xmalloc(sizeof(float) * nx);
    float *dw1 = xmalloc(sizeof(float) * nw), *dw2 = xmalloc(sizeof(float) * nw);
    fill(in, nx, 1); fill(dout, nd, 1); fill(W, nw, 0.1);
    bf16_round(in, nx);
    bf16_round(dout, nd);
    fill(o1, nd, 1); memcpy(o2, o1, sizeof(float) * nd);
    fill(di1, nx, 1); memcpy(di2, di1, sizeof(float) * nx);
    fill(dw1, nw, 1); memcpy(dw2, dw1, sizeof(float) * nw);
    Bf16Scratch s1 = {0}, s2 = {0};
    for (int acc = 0; acc < 2; acc++) {
        linear_forward_bf16_ld(o1, lo, in, li, W, N, n_in, n_out, acc, 0, &s1);
        linear_forward_bf16_ld(o2, lo, in, li, W, N, n_in, n_out, acc, BF16_IN_ROUNDED, &s2);
        linear_backward_bf16_acc_ld(di1, acc, dw1, dout, lo, in, li, W, N, n_in, n_out, 0, &s1);
        linear_backward_bf16_acc_ld(di2, acc, dw2, dout, lo, in, li, W, N, n_in, n_out,
                                    BF16_IN_ROUNDED | BF16_DOUT_ROUNDED, &s2);
    }
    /* the weight gradient alone with a marked input, and the input gradient alone with a marked
     * output gradient (the MLP's down projection) */
    linear_backward_bf16_acc_ld(NULL, 0, dw1, dout, lo, in, li, W, N, n_in, n_out, 0, &s1);
    linear_backward_bf16_acc_ld(NULL, 0, dw2, dout, lo, in, li, W, N, n_in, n_out, BF16_IN_ROUNDED, &s2);
    linear_backward_bf16_acc_ld(di1, 1, NULL, dout, lo, NULL, li, W, N, n_in, n_out, 0, &s1);
    linear_backward_bf16_acc_ld(di2, 1, NULL, dout, lo, NULL, li, W, N, n_in, n_out, BF16_DOUT_ROUNDED, &s2);
    CHECK(same_bits(o1, o2, nd) && same_bits(di1, di2, nx) && same_bits(dw1, dw2, nw),
          "bf16 linear (padding %d): operands marked rounded give other results than unmarked (out %d, din %d, dW %d)",
          pad, same_bits(o1, o2, nd), same_bits(di1, di2, nx), same_bits(dw1, dw2, nw));
    /* on the conversion path a call with every operand but W marked copies W alone */
    if (bf16_kernels()->path == BF16_PATH_CONVERT)
        CHECK(s2.cap < s1.cap, "bf16 linear (padding %d): the scratch of marked calls (%zu) is not below unmarked (%zu)",
              pad, s2.cap, s1.cap);
    bf16_scratch_free(&s1);
    bf16_scratch_free(&s2);

    /* the producers */
    const int D = 40, H = 2, hd = 20;
    float *x = xmalloc(sizeof(float) * nx), *w = xmalloc(sizeof(float) * D), *a = xmalloc(sizeof(float) * nx),
          *b = xmalloc(sizeof(float) * nx), *r1 = xmalloc(sizeof(float) * N), *r2 = xmalloc(sizeof(float) * N);
    fill(x, (size_t)N * D, 1); fill(w, D, 1);
    rmsnorm_forward(a, r1, x, w, N, D, 1e-5f);
    bf16_round(a, (size_t)N * D);
    rmsnorm_forward_bf16(b, r2, x, w, N, D, 1e-5f);
    CHECK(same_bits(a, b, (size_t)N * D) && same_bits(r1, r2, N), "rmsnorm_forward_bf16 is not rmsnorm_forward + bf16_round");
    float *cs = xmalloc(sizeof(float) * N * hd / 2), *sn = xmalloc(sizeof(float) * N * hd / 2);
    fill(cs, (size_t)N * hd / 2, 1); fill(sn, (size_t)N * hd / 2, 1);
    typedef void (*RopeFn)(float *, const float *, const float *, int, int, int);
    const struct { RopeFn plain, rounded; const char *name; } ropes[] = {{rope_forward, rope_forward_bf16, "rope_forward"},
                                                                         {rope_backward, rope_backward_bf16, "rope_backward"}};
    for (int f = 0; f < 2; f++) {
        memcpy(a, x, sizeof(float) * N * H * hd);
        memcpy(b, x, sizeof(float) * N * H * hd);
        ropes[f].plain(a, cs, sn, N, H, hd);
        bf16_round(a, (size_t)N * H * hd);
        ropes[f].rounded(b, cs, sn, N, H, hd);
        CHECK(same_bits(a, b, (size_t)N * H * hd), "%s_bf16 is not %s + bf16_round", ropes[f].name, ropes[f].name);
    }
    const size_t n = 9001; /* over several of swiglu's blocks, the last one partial */
    float *g = xmalloc(sizeof(float) * n), *u = xmalloc(sizeof(float) * n), *dh = xmalloc(sizeof(float) * n);
    float *h1 = xmalloc(sizeof(float) * n), *h2 = xmalloc(sizeof(float) * n), *dg = xmalloc(sizeof(float) * n),
          *du = xmalloc(sizeof(float) * n);
    fill(g, n, 2); fill(u, n, 1); fill(dh, n, 1);
    swiglu_forward(h1, g, u, n);
    bf16_round(h1, n);
    swiglu_forward_bf16(h2, g, u, n);
    CHECK(same_bits(h1, h2, n), "swiglu_forward_bf16 is not swiglu_forward + bf16_round");
    swiglu_backward(dg, du, dh, g, u, n);
    bf16_round(dg, n);
    bf16_round(du, n);
    swiglu_backward_bf16(g, u, dh, g, u, n); /* in place, as the MLP calls it */
    CHECK(same_bits(dg, g, n) && same_bits(du, u, n), "swiglu_backward_bf16 (in place) is not swiglu_backward + bf16_round");

    CHECK(bf16_unrounded(in, nx) == nx, "bf16_unrounded finds an unrounded element in a rounded array");
    in[17] = nextafterf(in[17], INFINITY);
    in[5] = NAN;
    CHECK(bf16_unrounded(in, nx) == 17, "bf16_unrounded: %zu, not 17 (the first element made unrounded)",
          bf16_unrounded(in, nx));
    xfree(in); xfree(dout); xfree(W); xfree(o1); xfree(o2); xfree(di1); xfree(di2); xfree(dw1); xfree(dw2);
    xfree(x); xfree(w); xfree(a); xfree(b); xfree(r1); xfree(r2); xfree(cs); xfree(sn);
    xfree(g); xfree(u); xfree(dh); xfree(h1); xfree(h2); xfree(dg); xfree(du);
}

/* lm_head_cross_entropy_bf16 against double products of the bf16 operands: the loss from double
 * logits of the rounded x and W, the argmax, and dx, dW from the logit gradients rounded to bf16
 * (within one bf16 step of the largest term, where the fp32 gradient and the double one round
 * apart), over chunks with a short last one and ignored targets. */
static void test_head(void) {
    const int N = 37, D = 48, V = 301, chunk = 16;
    const float scale = 1.0f / 30;
    float *x = xmalloc(sizeof(float) * N * D), *W = xmalloc(sizeof(float) * V * D);
    float *dx = xcalloc((size_t)N * D, sizeof(float)), *dW = xcalloc((size_t)V * D, sizeof(float));
    float *ws = xmalloc(sizeof(float) * chunk * V);
    int *t = xmalloc(sizeof(int) * N), *pred = xmalloc(sizeof(int) * N);
    fill(x, (size_t)N * D, 1); fill(W, (size_t)V * D, 0.3);
    bf16_round(x, (size_t)N * D); /* the head's input is made as bf16 values (rmsnorm_forward_bf16) */
    for (int i = 0; i < N; i++) t[i] = i % 7 == 3 ? -1 : (int)rng_below(&rng, V);
    Bf16Weight hw = {0};
    Bf16Scratch s = {0};
    bf16_weight_set(&hw, W, (size_t)V * D);
    double loss = lm_head_cross_entropy_bf16(x, &hw, t, N, D, V, scale, dx, dW, pred, NULL, chunk, ws, NULL);
#define R(v) ((double)bf16_to_float(bf16_from_float((float)(v))))
    double *dl = xmalloc(sizeof(double) * N * V), ref = 0, wl, wx = 0, ww = 0;
    long loose = 0; /* elements past 1e-5 sum|a b|: only where a gradient rounded apart */
    int argmax_ok = 1;
    for (int i = 0; i < N; i++) {
        double *li = dl + (size_t)i * V, mx = -INFINITY, z = 0;
        int am = 0;
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int j = 0; j < D; j++) a += (double)x[i * D + j] * R(W[v * D + j]);
            li[v] = a;
            if (a > mx) mx = a, am = v;
        }
        argmax_ok &= pred[i] == am;
        for (int v = 0; v < V; v++) z += exp(li[v] - mx);
        if (t[i] >= 0) ref += mx + log(z) - li[t[i]];
        for (int v = 0; v < V; v++) li[v] = t[i] < 0 ? 0 : R(scale * (exp(li[v] - mx) / z - (v == t[i])));
    }
    wl = fabs(loss - ref) / (1e-6 * (1 + fabs(ref)));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) {
            double a = 0, m = 0, big = 0;
            for (int v = 0; v < V; v++) {
                const double p = dl[(size_t)i * V + v] * R(W[v * D + j]);
                a += p, m += fabs(p), big = fabs(p) > big ? fabs(p) : big;
            }
            const double e = fabs(dx[i * D + j] - a) / (1e-30 + 1e-5 * m + big / 256);
            if (!(e <= wx)) wx = e;
            loose += !(fabs(dx[i * D + j] - a) <= 1e-5 * m);
        }
    for (int v = 0; v < V; v++)
        for (int j = 0; j < D; j++) {
            double a = 0, m = 0, big = 0;
            for (int i = 0; i < N; i++) {
                const double p = dl[(size_t)i * V + v] * x[i * D + j];
                a += p, m += fabs(p), big = fabs(p) > big ? fabs(p) : big;
            }
            const double e = fabs(dW[v * D + j] - a) / (1e-30 + 1e-5 * m + big / 256);
            if (!(e <= ww)) ww = e;
            loose += !(fabs(dW[v * D + j] - a) <= 1e-5 * m);
        }
#undef R
    const long elems = (long)N * D + (long)V * D;
    CHECK(wl <= 10 && wx <= 1 && ww <= 1 && loose * 50 <= elems && argmax_ok,
          "bf16 LM head (%d rows in chunks of %d, vocabulary %d): loss %.3g of 1e-6, dx %.3g, dW %.3g of 1e-5 sum|a b| + "
          "the largest term / 256, %ld of %ld gradients past 1e-5 sum|a b| (at most 2%%)%s", N, chunk, V, wl, wx, ww, loose,
          elems, argmax_ok ? "" : ", an argmax differs");
    printf("bf16 LM head: loss %.3g of 1e-6, dx %.3g, dW %.3g of their bounds, %ld of %ld gradients past 1e-5 sum|a b|\n", wl,
           wx, ww, loose, elems);
    /* forward only: the same loss and predictions, no gradient written */
    int *pred2 = xmalloc(sizeof(int) * N);
    const double loss2 = lm_head_cross_entropy_bf16(x, &hw, t, N, D, V, scale, NULL, NULL, pred2, NULL, chunk, ws, &s);
    CHECK(loss2 == loss && !memcmp(pred, pred2, sizeof(int) * N), "bf16 LM head forward alone: loss %.17g against %.17g",
          loss2, loss);
    bf16_weight_free(&hw);
    bf16_scratch_free(&s);
    xfree(x); xfree(W); xfree(dx); xfree(dW); xfree(ws); xfree(t); xfree(pred); xfree(dl); xfree(pred2);
}

int main(void) {
    rng_seed(&rng, 99);
    test_rounding();
    char ran[64] = "", missing[64] = "";
    for (int p = 0; p < BF16_PATH_COUNT; p++) {
        const Bf16Kernels *k = bf16_kernels_for((Bf16Path)p);
        char *dst = k ? ran : missing;
        strcat(dst, " ");
        strcat(dst, bf16_path_name((Bf16Path)p));
        if (!k) continue;
        test_conversions(k);
        test_gemm(k);
    }
    /* bf16_round and the parallel conversions over many chunks equal the portable conversion */
    size_t n = 300001;
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    fill(x, n, 3);
    memcpy(y, x, sizeof(float) * n);
    bf16_round(y, n);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        if (bits_of(y[i]) != (uint32_t)bf16_from_float(x[i]) << 16) same = 0;
    CHECK(same, "bf16_round over %zu values differs from the portable conversion", n);
    xfree(x); xfree(y);
    test_linear(0, 0);
    test_linear(11, 5);
    test_linear(16, 0);
    test_linear(0, 16);
    test_rounded_operands(0);
    test_rounded_operands(16);
    test_head();
    printf("bf16 paths tested:%s (used: %s); not available on this CPU:%s\n", ran, bf16_path_name(bf16_kernels()->path),
           *missing ? missing : " none");
    return test_summary("test_bf16");
}
