/* Kernel-path dispatch (kernels/isa.h): names and parsing, refusal of a path the CPU cannot run
 * (isa_force and SEQPAR_ISA in a child process), and every kernel of every path this CPU runs
 * against double-precision formulas on odd sizes (tails and masks). Prints the paths it ran and
 * those this CPU could not. `test_isa --supported` prints the runnable path names, one a line
 * (tests/run_tests.sh reruns the kernel tests under each with SEQPAR_ISA). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "kernels/isa.h"
#include "testlib.h"

static Rng rng;

static void fill(float *x, size_t n, double s) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(s * rng_normal(&rng));
}

static double rel(double got, double want) { return fabs(got - want) / (1e-6 + fabs(want)); }

/* Runs `isa` in a child with SEQPAR_ISA set; returns its exit status. */
static int child_status(const char *isa) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) { /* a fresh process: this one has already chosen its path */
        setenv("SEQPAR_ISA", isa, 1);
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        execl("/proc/self/exe", "test_isa", "--choose", (char *)NULL);
        _exit(4);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static void check_path(const SimdKernels *k) {
    const char *nm = isa_name(k->level);
    /* tile_gemm: every A layout, odd shapes, accumulate, against double */
    for (int trial = 0; trial < 8; trial++) {
        int M = 1 + (int)rng_below(&rng, 40), N = 1 + (int)rng_below(&rng, 70), K = 1 + (int)rng_below(&rng, 300);
        if (trial >= 6) K = 1700 + trial; /* long K: the packed edge block goes in k-chunks */
        int trans = trial & 1, accumulate = (trial >> 1) & 1;
        size_t lda = (size_t)(trans ? M : K) + 3, ldb = (size_t)N + 5, ldc = (size_t)N + 2;
        float *A = xmalloc(sizeof(float) * lda * (trans ? K : M)), *B = xmalloc(sizeof(float) * ldb * K);
        float *C = xmalloc(sizeof(float) * ldc * M);
        fill(A, lda * (trans ? K : M), 1); fill(B, ldb * K, 1); fill(C, ldc * M, 1);
        float *C0 = xmalloc(sizeof(float) * ldc * M);
        memcpy(C0, C, sizeof(float) * ldc * M);
        size_t ars = trans ? 1 : lda, aks = trans ? lda : 1;
        k->tile_gemm(M, N, K, 0.5f, A, ars, aks, B, ldb, accumulate, C, ldc, NULL);
        double worst = 0;
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int q = 0; q < K; q++) s += (double)A[m * ars + q * aks] * B[(size_t)q * ldb + n];
                s = 0.5 * s + (accumulate ? C0[m * ldc + n] : 0);
                worst = fmax(worst, fabs(s - C[m * ldc + n]) / (1e-4 * sqrt((double)K) + 1e-5 * fabs(s)));
            }
            for (size_t n = (size_t)N; n < ldc; n++) worst = fmax(worst, C[m * ldc + n] != C0[m * ldc + n] ? 1e9 : 0);
        }
        CHECK(worst <= 1, "%s tile_gemm %dx%dx%d trans %d acc %d: violation %.3g", nm, M, N, K, trans, accumulate, worst);
        xfree(A); xfree(B); xfree(C); xfree(C0);
    }
    /* softmax pieces */
    {
        enum { R = 13, NC = 53, LD = 61 };
        float s[R * LD], s0[R * LD], mx[NC], sum[NC], m[NC];
        fill(s0, R * LD, 3);
        s0[2 * LD + 5] = -INFINITY;
        memcpy(s, s0, sizeof s);
        k->col_max(s, R, NC, LD, mx);
        int ok = 1;
        for (int i = 0; i < NC; i++) {
            float w = -INFINITY;
            for (int j = 0; j < R; j++) w = s0[j * LD + i] > w ? s0[j * LD + i] : w;
            ok &= w == mx[i];
            m[i] = mx[i] - 1.0f;
        }
        CHECK(ok, "%s col_max", nm);
        k->col_exp2_sum(s, R, NC, LD, m, sum);
        double worst = 0;
        for (int i = 0; i < NC; i++) {
            double t = 0;
            for (int j = 0; j < R; j++) {
                double e = exp2((double)s0[j * LD + i] - m[i]);
                t += e;
                worst = fmax(worst, rel(s[j * LD + i], e));
            }
            worst = fmax(worst, rel(sum[i], t));
        }
        for (int j = 0; j < R; j++)
            for (int i = NC; i < LD; i++) worst = fmax(worst, s[j * LD + i] != s0[j * LD + i] ? 1 : 0);
        CHECK(worst < 2e-6, "%s col_exp2_sum: relative error %.3g", nm, worst);
        memcpy(s, s0, sizeof s);
        float r = k->row_exp2_sum(s + 2 * LD, NC, 1.5f);
        double t = 0;
        worst = 0;
        for (int i = 0; i < NC; i++) {
            double e = exp2((double)s0[2 * LD + i] - 1.5);
            t += e;
            worst = fmax(worst, rel(s[2 * LD + i], e));
        }
        CHECK(worst < 2e-6 && rel(r, t) < 2e-6 && s[2 * LD + 5] == 0.0f, "%s row_exp2_sum: %.3g", nm, worst);
        float p[NC], dp[NC], p0[NC], y[NC], x[NC];
        fill(p, NC, 1); fill(dp, NC, 1);
        memcpy(p0, p, sizeof p);
        k->ds_row(p, dp, NC, 0.25f);
        ok = 1;
        for (int i = 0; i < NC; i++) ok &= fabsf(p[i] - p0[i] * (dp[i] - 0.25f)) <= 1e-6f * (1 + fabsf(p[i]));
        CHECK(ok, "%s ds_row", nm);
        memcpy(y, p0, sizeof y);
        k->scale_row(y, NC, 3.0f);
        fill(x, NC, 1);
        memcpy(p, y, sizeof p);
        k->add_row(y, x, NC);
        ok = 1;
        for (int i = 0; i < NC; i++) ok &= p[i] == p0[i] * 3.0f && y[i] == p[i] + x[i];
        CHECK(ok, "%s scale_row / add_row", nm);
    }
    /* element-wise model ops against double formulas */
    {
        enum { D = 77 };
        float x[D], w[D], out[D], dout[D], dx[D], dw[D];
        fill(x, D, 1); fill(w, D, 1); fill(dout, D, 1);
        memset(dx, 0, sizeof dx); memset(dw, 0, sizeof dw);
        float r = k->rmsnorm_row(out, x, w, D, 1e-5f);
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)x[j] * x[j];
        double rr = 1 / sqrt(ss / D + 1e-5), worst = rel(r, rr), dot = 0;
        for (int j = 0; j < D; j++) worst = fmax(worst, fabs(out[j] - x[j] * rr * w[j]) / (1 + fabs(out[j])) * 1e6 * 1e-6);
        CHECK(worst < 1e-5, "%s rmsnorm_row: %.3g", nm, worst);
        k->rmsnorm_bwd_row(dx, dw, dout, x, w, r, D);
        for (int j = 0; j < D; j++) dot += (double)dout[j] * w[j] * x[j];
        worst = 0;
        for (int j = 0; j < D; j++) {
            double gx = rr * dout[j] * w[j] - x[j] * rr * rr * rr / D * dot, gw = (double)dout[j] * x[j] * rr;
            worst = fmax(worst, fmax(fabs(dx[j] - gx), fabs(dw[j] - gw)));
        }
        CHECK(worst < 1e-5, "%s rmsnorm_bwd_row: %.3g", nm, worst);
        enum { HALF = 37 };
        float h[2 * HALF], h0[2 * HALF], c[HALF], sn[HALF];
        fill(h, 2 * HALF, 1);
        memcpy(h0, h, sizeof h);
        for (int j = 0; j < HALF; j++) { c[j] = cosf(0.1f * j); sn[j] = sinf(0.1f * j); }
        k->rope_head(h, c, sn, HALF, -1.0f);
        worst = 0;
        for (int j = 0; j < HALF; j++) {
            worst = fmax(worst, fabs(h[j] - (h0[j] * c[j] + h0[j + HALF] * sn[j])));
            worst = fmax(worst, fabs(h[j + HALF] - (h0[j + HALF] * c[j] - h0[j] * sn[j])));
        }
        CHECK(worst < 1e-6, "%s rope_head: %.3g", nm, worst);
        enum { NS = 101 };
        float g[NS], u[NS], hh[NS], dh[NS], dg[NS], du[NS];
        fill(g, NS, 4); fill(u, NS, 1); fill(dh, NS, 1);
        g[0] = 95.0f; g[1] = -95.0f;
        memset(dg, 0, sizeof dg); memset(du, 0, sizeof du);
        k->swiglu_fwd(hh, g, u, NS);
        k->swiglu_bwd(dg, du, dh, g, u, NS);
        worst = 0;
        for (int i = 0; i < NS; i++) {
            double sg = 1 / (1 + exp(-(double)g[i])), silu = g[i] * sg;
            worst = fmax(worst, fabs(hh[i] - silu * u[i]) / (1 + fabs(silu * u[i])));
            worst = fmax(worst, fabs(du[i] - dh[i] * silu) / (1 + fabs(dh[i] * silu)));
            double dgr = (double)dh[i] * u[i] * sg * (1 + g[i] * (1 - sg));
            worst = fmax(worst, fabs(dg[i] - dgr) / (1 + fabs(dgr)));
        }
        CHECK(worst < 2e-6, "%s swiglu: %.3g", nm, worst);
        enum { V = 259 };
        float li[V], l0[V];
        fill(li, V, 3);
        li[100] = 12.0f;
        memcpy(l0, li, sizeof li);
        int arg = -1;
        double loss = k->xent_row(li, V, 7, 0.5f, 1, &arg), mx = -1e30, se = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, l0[j]);
        for (int j = 0; j < V; j++) se += exp(l0[j] - mx);
        double lse = mx + log(se);
        worst = rel(loss, lse - l0[7]);
        for (int j = 0; j < V; j++) worst = fmax(worst, fabs(li[j] - 0.5 * (exp(l0[j] - lse) - (j == 7))) * 10);
        CHECK(worst < 1e-5 && arg == 100, "%s xent_row: %.3g, argmax %d", nm, worst, arg);
        memcpy(li, l0, sizeof li);
        CHECK(k->xent_row(li, V, -1, 0.5f, 1, NULL) == 0.0 && li[3] == 0.0f, "%s xent_row ignored target", nm);
        enum { NA = 45 };
        float p[NA], gr[NA], m[NA], v[NA], p2[NA], m2[NA], v2[NA];
        fill(p, NA, 1); fill(gr, NA, 1); fill(m, NA, 0.1);
        for (int i = 0; i < NA; i++) v[i] = 0.01f * (float)(i + 1);
        memcpy(p2, p, sizeof p); memcpy(m2, m, sizeof m); memcpy(v2, v, sizeof v);
        AdamWConsts kc = {0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 1e-3f, 1.2f, 0.999f, 0.7f};
        k->adamw(p, gr, m, v, NA, &kc);
        worst = 0;
        for (int i = 0; i < NA; i++) {
            double gi = (double)gr[i] * 0.7, mi = 0.9 * m2[i] + 0.1 * gi, vi = 0.95 * v2[i] + 0.05 * gi * gi;
            double pi = p2[i] * 0.999 - 1e-3 * mi / (sqrt(vi) * 1.2 + 1e-8);
            worst = fmax(worst, fmax(fabs(p[i] - pi), fmax(fabs(m[i] - mi), fabs(v[i] - vi))));
        }
        CHECK(worst < 1e-6, "%s adamw: %.3g", nm, worst);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--choose")) { /* child of child_status() */
        simd();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--supported")) {
        for (int l = 0; l <= (int)isa_best(); l++) printf("%s\n", isa_name((IsaLevel)l));
        return 0;
    }
    rng_seed(&rng, 99);
    IsaLevel best = isa_best();
    for (int l = 0; l < ISA_COUNT; l++) CHECK(isa_parse(isa_name((IsaLevel)l)) == l, "name of level %d", l);
    CHECK(isa_parse("sse9") == -1, "unknown names are refused");
    CHECK(isa_active() == best || getenv("SEQPAR_ISA"), "the default path is the best one");
    char line[200];
    isa_describe(line, sizeof line);
    printf("test_isa: active %s\n", line);
    CHECK(child_status("bogus") != 0, "SEQPAR_ISA=bogus is refused");
    for (int l = 0; l < ISA_COUNT; l++) {
        int want = l <= (int)best ? 0 : 1;
        CHECK((child_status(isa_name((IsaLevel)l)) != 0) == want, "SEQPAR_ISA=%s %s", isa_name((IsaLevel)l),
              want ? "must be refused on this CPU" : "must run on this CPU");
    }
    char ran[64] = "", cannot[64] = "";
    IsaLevel saved = isa_active();
    for (int l = 0; l < ISA_COUNT; l++) {
        if (!isa_force((IsaLevel)l)) {
            CHECK(l > (int)best, "isa_force(%s) refused on a CPU that has it", isa_name((IsaLevel)l));
            strcat(cannot, " "), strcat(cannot, isa_name((IsaLevel)l));
            continue;
        }
        CHECK(isa_active() == (IsaLevel)l, "isa_force(%s) took effect", isa_name((IsaLevel)l));
        check_path(simd());
        strcat(ran, " "), strcat(ran, isa_name((IsaLevel)l));
    }
    isa_force(saved);
    printf("test_isa: kernel paths checked:%s; this CPU cannot run:%s\n", ran, *cannot ? cannot : " (none)");
    return test_summary("test_isa");
}
