/* Finite-difference checks of every dense op's backward (linear, RMSNorm, RoPE, SwiGLU,
 * embedding, chunked LM-head cross-entropy), plus direct checks against double-precision
 * formulas. The objective is L = sum(out * w) with fixed random w, evaluated in double; central
 * differences with step 1e-3 in fp32 carry errors around 1e-4 of the gradient scale, so the
 * tolerance is 2e-3 of the larger of |numeric| and 1 x the tensor's gradient scale. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/ops.h"
#include "kernels/sgemm.h"
#include "testlib.h"

static Rng rng;

static void fill(float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&rng));
}

/* The op under test, evaluated as L = sum(out * w) in double, closing over static state. */
typedef double (*Objective)(void);

static void check_grad(const char *what, Objective f, float *param, const float *analytic, size_t n) {
    const float eps = 1e-3f;
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(analytic[i]));
    for (size_t i = 0; i < n; i++) {
        float saved = param[i];
        param[i] = saved + eps;
        double lp = f();
        param[i] = saved - eps;
        double lm = f();
        param[i] = saved;
        double numeric = (lp - lm) / (2.0 * eps);
        double err = fabs(numeric - analytic[i]) / fmax(scale, 1e-3);
        if (err > worst) worst = err;
    }
    CHECK(worst <= 2e-3, "%s: finite-difference mismatch %.3g (relative to gradient scale %.3g)", what, worst, scale);
}

static double weighted_sum(const float *out, const float *w, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * w[i];
    return s;
}

/* ---- linear */
enum { LN = 5, LI = 7, LO = 6 };
static float lin_in[LN * LI], lin_W[LO * LI], lin_out[LN * LO], lin_w[LN * LO];
static double lin_obj(void) {
    linear_forward(lin_out, lin_in, lin_W, LN, LI, LO, 0);
    return weighted_sum(lin_out, lin_w, LN * LO);
}
static void test_linear(void) {
    fill(lin_in, LN * LI, 1); fill(lin_W, LO * LI, 1); fill(lin_w, LN * LO, 1);
    lin_obj();
    double worst = 0; /* forward against a double loop */
    for (int i = 0; i < LN; i++)
        for (int o = 0; o < LO; o++) {
            double s = 0;
            for (int k = 0; k < LI; k++) s += (double)lin_in[i * LI + k] * lin_W[o * LI + k];
            worst = fmax(worst, fabs(s - lin_out[i * LO + o]));
        }
    CHECK(worst < 1e-5, "linear forward off by %.3g", worst);
    float din[LN * LI] = {0}, dW[LO * LI] = {0};
    linear_backward(din, dW, lin_w, lin_in, lin_W, LN, LI, LO);
    check_grad("linear d(in)", lin_obj, lin_in, din, LN * LI);
    check_grad("linear d(W)", lin_obj, lin_W, dW, LO * LI);
}

/* linear_forward_ld / linear_backward_ld on rows wider than their data (in's and din's pad_in
 * floats, out's and dout's pad_out): the products against double loops, and the padding (a
 * sentinel) unchanged. */
static void test_linear_ld(int pad_in, int pad_out) {
    const int N = 33, n_in = 19, n_out = 23, li = n_in + pad_in, lo = n_out + pad_out;
    const float SENT = -7777.0f;
    float *in = xmalloc(sizeof(float) * N * li), *W = xmalloc(sizeof(float) * n_out * n_in);
    float *out = xmalloc(sizeof(float) * N * lo), *dout = xmalloc(sizeof(float) * N * lo);
    float *din = xmalloc(sizeof(float) * N * li), *dW = xcalloc((size_t)n_out * n_in, sizeof(float));
    fill(in, (size_t)N * li, 2); fill(W, (size_t)n_out * n_in, 2); fill(dout, (size_t)N * lo, 2);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < lo; j++) out[i * lo + j] = j < n_out ? 0.5f : SENT;
        for (int j = 0; j < li; j++) din[i * li + j] = j < n_in ? 0.0f : SENT;
    }
    linear_forward_ld(out, lo, in, li, W, N, n_in, n_out, 1);
    linear_backward_ld(din, dW, dout, lo, in, li, W, N, n_in, n_out);
    double wf = 0, wi = 0, ww = 0;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < n_out; o++) {
            double s = 0.5;
            for (int k = 0; k < n_in; k++) s += (double)in[i * li + k] * W[o * n_in + k];
            wf = fmax(wf, fabs(s - out[i * lo + o]));
        }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < n_in; k++) {
            double s = 0;
            for (int o = 0; o < n_out; o++) s += (double)dout[i * lo + o] * W[o * n_in + k];
            wi = fmax(wi, fabs(s - din[i * li + k]));
        }
    for (int o = 0; o < n_out; o++)
        for (int k = 0; k < n_in; k++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += (double)dout[i * lo + o] * in[i * li + k];
            ww = fmax(ww, fabs(s - dW[o * n_in + k]));
        }
    int pads = 1;
    for (int i = 0; i < N; i++) {
        for (int j = n_out; j < lo; j++) pads &= out[i * lo + j] == SENT;
        for (int j = n_in; j < li; j++) pads &= din[i * li + j] == SENT;
    }
    CHECK(wf < 1e-4 && wi < 1e-4 && ww < 1e-4 && pads,
          "strided linear (rows %d and %d floats apart): forward off by %.3g, din %.3g, dW %.3g%s", li, lo, wf, wi, ww,
          pads ? "" : ", and it wrote the rows' padding");
    xfree(in); xfree(W); xfree(out); xfree(dout); xfree(din); xfree(dW);
}

/* linear_row_stride: a cache line more exactly where the width is a multiple of 512 floats */
static void test_row_stride(void) {
    const int w[] = {1, 64, 256, 500, 511, 512, 688, 1024, 1536, 11008, 14336, 0};
    const int want[] = {1, 64, 256, 500, 511, 528, 688, 1040, 1552, 11008, 14352, 0};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        CHECK(linear_row_stride(w[i]) == want[i], "linear_row_stride(%d) = %d, expected %d", w[i],
              linear_row_stride(w[i]), want[i]);
}

/* ---- rmsnorm */
enum { RN = 4, RD = 16 };
static float rn_x[RN * RD], rn_g[RD], rn_out[RN * RD], rn_rstd[RN], rn_w[RN * RD];
static double rn_obj(void) {
    rmsnorm_forward(rn_out, rn_rstd, rn_x, rn_g, RN, RD, 1e-5f);
    return weighted_sum(rn_out, rn_w, RN * RD);
}
static void test_rmsnorm(void) {
    fill(rn_x, RN * RD, 1); fill(rn_w, RN * RD, 1);
    for (int j = 0; j < RD; j++) rn_g[j] = 1.0f + 0.3f * (float)rng_normal(&rng);
    rn_obj();
    double worst = 0;
    for (int i = 0; i < RN; i++) {
        double ss = 0;
        for (int j = 0; j < RD; j++) ss += (double)rn_x[i * RD + j] * rn_x[i * RD + j];
        double r = 1.0 / sqrt(ss / RD + 1e-5);
        for (int j = 0; j < RD; j++) worst = fmax(worst, fabs(rn_x[i * RD + j] * r * rn_g[j] - rn_out[i * RD + j]));
    }
    CHECK(worst < 1e-5, "rmsnorm forward off by %.3g", worst);
    float dx[RN * RD] = {0}, dg[RD] = {0};
    rmsnorm_backward(dx, dg, rn_w, rn_x, rn_g, rn_rstd, RN, RD);
    check_grad("rmsnorm d(x)", rn_obj, rn_x, dx, RN * RD);
    check_grad("rmsnorm d(weight)", rn_obj, rn_g, dg, RD);
}

/* ---- rope */
enum { PN = 3, PH = 2, PD = 8 };
static float rp_x[PN * PH * PD], rp_out[PN * PH * PD], rp_w[PN * PH * PD], rp_cos[PN * PD / 2], rp_sin[PN * PD / 2];
static double rp_obj(void) {
    memcpy(rp_out, rp_x, sizeof rp_x);
    rope_forward(rp_out, rp_cos, rp_sin, PN, PH, PD);
    return weighted_sum(rp_out, rp_w, PN * PH * PD);
}
static void test_rope(void) {
    int pos[PN] = {5, 0, 1234};
    rope_tables(rp_cos, rp_sin, pos, PN, PD, 10000.0);
    fill(rp_x, PN * PH * PD, 1); fill(rp_w, PN * PH * PD, 1);
    rp_obj();
    double worst = 0; /* HF rotate-half with angle pos * theta^(-2j/d) */
    for (int i = 0; i < PN; i++)
        for (int h = 0; h < PH; h++)
            for (int j = 0; j < PD / 2; j++) {
                double a = pos[i] * pow(10000.0, -2.0 * j / PD);
                const float *x = rp_x + (i * PH + h) * PD;
                const float *o = rp_out + (i * PH + h) * PD;
                worst = fmax(worst, fabs(x[j] * cos(a) - x[j + PD / 2] * sin(a) - o[j]));
                worst = fmax(worst, fabs(x[j + PD / 2] * cos(a) + x[j] * sin(a) - o[j + PD / 2]));
            }
    CHECK(worst < 1e-5, "rope forward off by %.3g", worst);
    float dx[PN * PH * PD];
    memcpy(dx, rp_w, sizeof dx);
    rope_backward(dx, rp_cos, rp_sin, PN, PH, PD);
    check_grad("rope d(x)", rp_obj, rp_x, dx, PN * PH * PD);
}

/* ---- swiglu */
enum { SN = 40 };
static float sw_g[SN], sw_u[SN], sw_h[SN], sw_w[SN];
static double sw_obj(void) {
    swiglu_forward(sw_h, sw_g, sw_u, SN);
    return weighted_sum(sw_h, sw_w, SN);
}
static void test_swiglu(void) {
    fill(sw_g, SN, 2); fill(sw_u, SN, 1); fill(sw_w, SN, 1);
    sw_obj();
    double worst = 0;
    for (int i = 0; i < SN; i++) worst = fmax(worst, fabs(sw_g[i] / (1 + exp(-(double)sw_g[i])) * sw_u[i] - sw_h[i]));
    CHECK(worst < 1e-5, "swiglu forward off by %.3g", worst);
    float dg[SN], du[SN];
    for (int i = 0; i < SN; i++) dg[i] = du[i] = -3.0f; /* written, not accumulated into */
    swiglu_backward(dg, du, sw_w, sw_g, sw_u, SN);
    check_grad("swiglu d(gate)", sw_obj, sw_g, dg, SN);
    check_grad("swiglu d(up)", sw_obj, sw_u, du, SN);
}

/* ---- embedding */
enum { EV = 10, ED = 6, EN = 8 };
static float em_t[EV * ED], em_out[EN * ED], em_w[EN * ED];
static const int em_tok[EN] = {3, 1, 3, 9, 0, 3, 1, 7};
static double em_obj(void) {
    embedding_forward(em_out, em_tok, em_t, EN, ED);
    return weighted_sum(em_out, em_w, EN * ED);
}
static void test_embedding(void) {
    fill(em_t, EV * ED, 1); fill(em_w, EN * ED, 1);
    float dt[EV * ED] = {0};
    embedding_backward(dt, em_w, em_tok, EN, ED, -1);
    check_grad("embedding d(table)", em_obj, em_t, dt, EV * ED);
    /* with padding_idx 3 (transformers' nn.Embedding): row 3 gets nothing, the others the same */
    float dp[EV * ED] = {0};
    embedding_backward(dp, em_w, em_tok, EN, ED, 3);
    int same = 1;
    for (int r = 0; r < EV; r++)
        for (int j = 0; j < ED; j++) same &= dp[r * ED + j] == (r == 3 ? 0.0f : dt[r * ED + j]);
    CHECK(same && dt[3 * ED] != 0.0f, "embedding backward with padding_idx 3: row 3 not zero or other rows changed");
}

/* ---- lm head + cross-entropy, chunked (chunk 3 over 7 tokens), with ignored targets */
enum { CN = 7, CD = 8, CV = 11 };
static float ce_x[CN * CD], ce_W[CV * CD], ce_ws[3 * CV];
static const int ce_t[CN] = {4, -1, 10, 0, 4, -1, 7};
static double ce_obj(void) {
    return lm_head_cross_entropy(ce_x, ce_W, ce_t, CN, CD, CV, 1.0f, NULL, NULL, NULL, NULL, 3, ce_ws);
}
static void test_cross_entropy(void) {
    fill(ce_x, CN * CD, 1); fill(ce_W, CV * CD, 1);
    double ref = 0; /* double-precision loss */
    for (int i = 0; i < CN; i++) {
        if (ce_t[i] < 0) continue;
        double l[CV], mx = -1e300, s = 0;
        for (int v = 0; v < CV; v++) {
            l[v] = 0;
            for (int k = 0; k < CD; k++) l[v] += (double)ce_x[i * CD + k] * ce_W[v * CD + k];
            mx = fmax(mx, l[v]);
        }
        for (int v = 0; v < CV; v++) s += exp(l[v] - mx);
        ref += mx + log(s) - l[ce_t[i]];
    }
    double got = ce_obj();
    CHECK(fabs(got - ref) < 1e-5 * fabs(ref), "cross-entropy %.9g, reference %.9g", got, ref);
    float dx[CN * CD] = {0}, dW[CV * CD] = {0};
    int pred[CN];
    double again = lm_head_cross_entropy(ce_x, ce_W, ce_t, CN, CD, CV, 1.0f, dx, dW, pred, NULL, 3, ce_ws);
    CHECK(again == got, "cross-entropy with backward returned %.9g, without %.9g", again, got);
    check_grad("cross-entropy d(x)", ce_obj, ce_x, dx, CN * CD);
    check_grad("cross-entropy d(W)", ce_obj, ce_W, dW, CV * CD);
    for (int d = 0; d < CD; d++) CHECK(dx[1 * CD + d] == 0.0f, "ignored target got a gradient");
}

/* Both fp32 GEMM libraries of kernels/sgemm.h, every transposition, beta 0 and 1, alpha 1 and 0.5,
 * odd and tiny shapes and padded leading dimensions, against a double-precision product; then the
 * SEQPAR_SGEMM choice. The error is relative to the sum of the terms' magnitudes (fp32 rounding: about 1e-7). */
static void test_sgemm_libs(void) {
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 48, 256}, {130, 7, 513}};
    for (int lib = 0; lib < SGEMM_LIBS; lib++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
            for (int t = 0; t < 8; t++) {
                const int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2], ta = t & 1, tb = (t >> 1) & 1;
                const float beta = (t >> 2) & 1 ? 1.0f : 0.0f, alpha = sh % 2 ? 0.5f : 1.0f;
                const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
                float *A = xmalloc(sizeof(float) * (size_t)(ta ? K : M) * lda);
                float *B = xmalloc(sizeof(float) * (size_t)(tb ? N : K) * ldb), *C = xmalloc(sizeof(float) * (size_t)M * ldc);
                fill(A, (size_t)(ta ? K : M) * lda, 1);
                fill(B, (size_t)(tb ? N : K) * ldb, 1);
                fill(C, (size_t)M * ldc, 1);
                double *want = xmalloc(sizeof(double) * (size_t)M * N), *mags = xmalloc(sizeof(double) * (size_t)M * N);
                double worst = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double acc = 0, mag = 0;
                        for (int k = 0; k < K; k++) {
                            double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                            double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                            acc += a * b, mag += fabs(a * b);
                        }
                        want[(size_t)i * N + j] = alpha * acc + beta * C[(size_t)i * ldc + j];
                        mags[(size_t)i * N + j] = mag + fabs(C[(size_t)i * ldc + j]);
                    }
                float pad = C[(size_t)(M - 1) * ldc + N]; /* a padding element: never written */
                sgemm_lib_rm((SgemmLib)lib, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++)
                        worst = fmax(worst, fabs(C[(size_t)i * ldc + j] - want[(size_t)i * N + j]) / mags[(size_t)i * N + j]);
                CHECK(worst < 2e-6 && C[(size_t)(M - 1) * ldc + N] == pad, "%s sgemm %dx%dx%d ta %d tb %d beta %g: error %.3g",
                      sgemm_lib_name((SgemmLib)lib), M, N, K, ta, tb, beta, worst);
                xfree(A); xfree(B); xfree(C); xfree(want); xfree(mags);
            }
    char err[200] = "";
    setenv("SEQPAR_SGEMM", "openblas", 1);
    CHECK(sgemm_select_from_env(err, sizeof err) == 0 && sgemm_lib() == SGEMM_OPENBLAS, "SEQPAR_SGEMM=openblas selects OpenBLAS");
    setenv("SEQPAR_SGEMM", "mkl", 1);
    CHECK(sgemm_select_from_env(err, sizeof err) == -1 && strstr(err, "onednn") && strstr(err, "openblas"),
          "SEQPAR_SGEMM=mkl refused naming the choices (got: %s)", err);
    unsetenv("SEQPAR_SGEMM");
    CHECK(sgemm_select_from_env(err, sizeof err) == 0 && sgemm_lib() == SGEMM_ONEDNN, "oneDNN is the default");
    printf("test_ops: fp32 GEMM libraries checked: %s, %s\n", sgemm_lib_name(SGEMM_ONEDNN), sgemm_lib_name(SGEMM_OPENBLAS));
}

int main(void) {
    rng_seed(&rng, 42);
    test_sgemm_libs();
    test_linear();
    test_linear_ld(0, 0);
    test_linear_ld(5, 9);
    test_linear_ld(16, 0);
    test_linear_ld(0, 16);
    test_row_stride();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_embedding();
    test_cross_entropy();
    return test_summary("test_ops");
}
