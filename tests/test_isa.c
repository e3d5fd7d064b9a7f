/* Kernel-path dispatch (kernels/isa.h): names and parsing, refusal of a path the CPU cannot run
 * (isa_force and SEQPAR_ISA in a child process), and every kernel of every path this CPU runs
 * against double-precision formulas on odd sizes (tails and masks). Prints the paths it ran and
 * those this CPU could not. `test_isa --supported` prints the runnable path names, one a line
 * (tests/run_tests.sh reruns the kernel tests under each with SEQPAR_ISA).
 * AMX: SEQPAR_ISA=amx accepted exactly where amx_available(), the Linux permission request (on a
 * CPU without AMX: refused with a reason, no fault), isa_force_amx, and the C emulation of the tile
 * instructions (kernels/amx_tiles.h) against hand-computed results: the configuration's byte
 * layout, TILELOADD / TILESTORED of partial tiles (rows and bytes past the configuration read as
 * zero and are not written), TDPBF16PS's pair products with accumulation, denormals as zero, and
 * the faults (a bad configuration, mismatched shapes, a tile operation after TILERELEASE) ending the
 * process instead of computing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "kernels/amx_tiles.h"
#include "kernels/bf16.h"
#include "kernels/blas_core.h"
#include "kernels/exp2_poly.h"
#include "kernels/onednn.h"
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

/* Runs fn in a forked child (no exec: the emulation needs nothing else); returns its exit status
 * (100 for a signal). fn returning means the emulation did not fault: status 0. */
static int fork_status(void (*fn)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static void fault_rows17(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    c.rows[3] = 17;
    amx_emu_ldtilecfg(&c);
}
static void fault_reserved(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    c.reserved[5] = 1;
    amx_emu_ldtilecfg(&c);
}
static void fault_tile8(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    c.rows[8] = 1, c.colsb[8] = 4;
    amx_emu_ldtilecfg(&c);
}
static void fault_shapes(void) { /* A's 16 pair steps against B's 8 rows */
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    c.rows[2] = 8;
    amx_emu_ldtilecfg(&c);
    amx_emu_tdpbf16ps(0, 1, 2);
}
static void fault_same_tile(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    amx_emu_ldtilecfg(&c);
    amx_emu_tdpbf16ps(0, 0, 1);
}
static void fault_released(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    amx_emu_ldtilecfg(&c);
    amx_emu_tilerelease();
    amx_emu_tilezero(0);
}
static void valid_config(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    amx_emu_ldtilecfg(&c);
    amx_emu_tdpbf16ps(0, 1, 2);
    amx_emu_tilerelease();
}

static uint32_t pair_of(float lo, float hi) {
    return (uint32_t)bf16_from_float(lo) | (uint32_t)bf16_from_float(hi) << 16;
}

static void check_amx_emulation(void) {
    AmxTileConfig c;
    amx_config_uniform(&c, 8, 16, 64);
    const unsigned char *raw = (const unsigned char *)&c;
    int layout = raw[0] == 1 && raw[1] == 0;
    for (int t = 0; t < 16; t++) {
        const int want_c = t < 8 ? 64 : 0, want_r = t < 8 ? 16 : 0;
        layout &= raw[16 + 2 * t] == (want_c & 0xff) && raw[17 + 2 * t] == 0 && raw[48 + t] == want_r;
    }
    CHECK(layout, "AMX tile configuration bytes: palette at 0, colsb[] as uint16 from 16, rows[] from 48");

    /* C (3 x 3 fp32) += A (3 rows x 2 pair steps) B (2 pair steps x 3 columns), partial tiles */
    amx_config_uniform(&c, 3, 3, 12); /* tmm0 C: 3 rows of 12 bytes */
    c.rows[1] = 3, c.colsb[1] = 8;    /* tmm1 A: 3 rows of 2 pair words */
    c.rows[2] = 2, c.colsb[2] = 12;   /* tmm2 B: 2 pair steps of 3 words */
    amx_emu_ldtilecfg(&c);
    CHECK(amx_emu_configured(), "LDTILECFG loads a configuration");
    float a[3][4], b[4][3], c0[3][3];
    uint32_t A[3][16], B[2][16]; /* rows padded with garbage past the configured bytes */
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < 4; k++) a[m][k] = (float)(m + 1) * (k % 2 ? -1.0f : 1.0f) + (float)k;
    for (int k = 0; k < 4; k++)
        for (int n = 0; n < 3; n++) b[k][n] = (float)(k - n) * 0.5f;
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 3; n++) c0[m][n] = (float)(10 * m + n);
    for (int i = 0; i < 16; i++) A[0][i] = A[1][i] = A[2][i] = B[0][i] = B[1][i] = 0x7fc07fc0u; /* NaN pairs */
    for (int m = 0; m < 3; m++)
        for (int kk = 0; kk < 2; kk++) A[m][kk] = pair_of(a[m][2 * kk], a[m][2 * kk + 1]);
    for (int kk = 0; kk < 2; kk++)
        for (int n = 0; n < 3; n++) B[kk][n] = pair_of(b[2 * kk][n], b[2 * kk + 1][n]);
    float Cin[3][5], Cout[4][5];
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 5; n++) Cin[m][n] = n < 3 ? c0[m][n] : NAN;
    for (int m = 0; m < 4; m++)
        for (int n = 0; n < 5; n++) Cout[m][n] = -7.0f;
    amx_emu_tileloadd(0, Cin, sizeof Cin[0]);
    amx_emu_tileloadd(1, A, sizeof A[0]);
    amx_emu_tileloadd(2, B, sizeof B[0]);
    amx_emu_tdpbf16ps(0, 1, 2);
    amx_emu_tilestored(0, Cout, sizeof Cout[0]);
    int exact = 1, untouched = 1;
    for (int m = 0; m < 4; m++)
        for (int n = 0; n < 5; n++) {
            if (m == 3 || n >= 3) {
                untouched &= Cout[m][n] == -7.0f;
                continue;
            }
            double want = c0[m][n];
            for (int k = 0; k < 4; k++) want += (double)a[m][k] * b[k][n]; /* small integers and halves: exact */
            exact &= Cout[m][n] == (float)want;
        }
    CHECK(exact, "TDPBF16PS emulation: C += A B over pairs, on partial tiles");
    CHECK(untouched, "TILESTORED emulation wrote past its rows or bytes");
    /* denormal bf16 inputs read as zero; tmm0 zeroed first */
    uint32_t Ad[3][16] = {{0}}, Bd[2][16] = {{0}};
    Ad[0][0] = 0x00010001u;                  /* two denormal bf16 values */
    Bd[0][0] = pair_of(0x1p100f, 0x1p100f); /* their products would be about 2^-33 without DAZ */
    amx_emu_tilezero(0);
    amx_emu_tileloadd(1, Ad, sizeof Ad[0]);
    amx_emu_tileloadd(2, Bd, sizeof Bd[0]);
    amx_emu_tdpbf16ps(0, 1, 2);
    amx_emu_tilestored(0, Cout, sizeof Cout[0]);
    CHECK(Cout[0][0] == 0.0f, "TDPBF16PS emulation: denormal inputs count as zero (got %g)", Cout[0][0]);
    amx_emu_tilerelease();
    CHECK(!amx_emu_configured(), "TILERELEASE returns to the init state");

    CHECK(fork_status(valid_config) == 0, "a valid configuration and product run in the emulation");
    CHECK(fork_status(fault_rows17) != 0, "LDTILECFG with 17 rows faults");
    CHECK(fork_status(fault_reserved) != 0, "LDTILECFG with a reserved byte set faults");
    CHECK(fork_status(fault_tile8) != 0, "LDTILECFG configuring tile 8 of palette 1 faults");
    CHECK(fork_status(fault_shapes) != 0, "TDPBF16PS with A's pair steps != B's rows faults");
    CHECK(fork_status(fault_same_tile) != 0, "TDPBF16PS with dst == src1 faults");
    CHECK(fork_status(fault_released) != 0, "a tile operation after TILERELEASE faults");
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
    /* pack_panels: the layout, zero rows past the last; tile_gemm_panels: the same C as tile_gemm on
     * the rows in place, bit for bit (the same micro-kernel sums in the same order), with and
     * without a prefetch, the columns past N untouched */
    for (int trial = 0; trial < 6; trial++) {
        const int mr = k->gemm_mr, M = 1 + (int)rng_below(&rng, 45), N = 1 + (int)rng_below(&rng, 150);
        const int K = 1 + (int)rng_below(&rng, 90), accumulate = trial & 1, np = (M + mr - 1) / mr;
        const size_t lda = (size_t)K + 7, ldb = (size_t)N + 5, ldc = (size_t)N + 3;
        float *A = xmalloc(sizeof(float) * lda * M), *B = xmalloc(sizeof(float) * ldb * K);
        float *Ap = xmalloc(sizeof(float) * (size_t)np * mr * K), *C = xmalloc(sizeof(float) * ldc * M);
        float *Cr = xmalloc(sizeof(float) * ldc * M);
        fill(A, lda * M, 1); fill(B, ldb * K, 1); fill(C, ldc * M, 1);
        memcpy(Cr, C, sizeof(float) * ldc * M);
        for (size_t i = 0; i < (size_t)np * mr * K; i++) Ap[i] = NAN;
        k->pack_panels(M, K, A, lda, Ap);
        int layout = 1;
        for (int m = 0; m < np * mr; m++)
            for (int q = 0; q < K; q++) {
                const float got = Ap[(size_t)(m / mr) * mr * K + (size_t)q * mr + m % mr];
                layout &= m < M ? got == A[m * lda + q] : got == 0.0f;
            }
        CHECK(layout, "%s pack_panels %d rows x %d (panels of %d rows)", nm, M, K, mr);
        float lines[64 * 16];
        Prefetch pf = {.lines_per_row = 1};
        if (trial >= 3) prefetch_pair(&pf, lines, NULL, sizeof lines);
        k->tile_gemm(M, N, K, 0.25f, A, lda, 1, B, ldb, accumulate, Cr, ldc, NULL);
        k->tile_gemm_panels(M, N, K, 0.25f, Ap, B, ldb, accumulate, C, ldc, trial >= 3 ? &pf : NULL);
        CHECK(!memcmp(C, Cr, sizeof(float) * ldc * M), "%s tile_gemm_panels %dx%dx%d acc %d: not tile_gemm's C", nm,
              M, N, K, accumulate);
        CHECK(trial < 3 || pf.next == pf.total, "%s tile_gemm_panels fetched %d of %d lines", nm, pf.next, pf.total);
        xfree(A); xfree(B); xfree(Ap); xfree(C); xfree(Cr);
    }
    /* transpose32: every word's bits (NaN payloads included) at its transposed place, whole 8 x 8
     * blocks and ragged edges; nothing outside the rows x cols transpose written */
    for (int trial = 0; trial < 6; trial++) {
        const int rows = trial == 0 ? 8 : 1 + (int)rng_below(&rng, 41), cols = trial == 0 ? 16 : 1 + (int)rng_below(&rng, 70);
        const size_t lds = (size_t)cols + (size_t)rng_below(&rng, 5), ldd = (size_t)rows + 3;
        uint32_t *src = xmalloc(sizeof(uint32_t) * lds * rows), *dst = xmalloc(sizeof(uint32_t) * ldd * cols);
        for (size_t i = 0; i < lds * rows; i++) src[i] = (uint32_t)rng_u64(&rng) | (i % 3 ? 0 : 0x7f800001u);
        for (size_t i = 0; i < ldd * cols; i++) dst[i] = 0xdeadbeefu;
        k->transpose32(rows, cols, src, lds, dst, ldd);
        int ok = 1;
        for (int c = 0; c < cols; c++)
            for (size_t r = 0; r < ldd; r++)
                ok &= dst[c * ldd + r] == ((int)r < rows ? src[r * lds + (size_t)c] : 0xdeadbeefu);
        CHECK(ok, "%s transpose32 %d x %d", nm, rows, cols);
        xfree(src); xfree(dst);
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
        { /* the softmax exponentials (no clamps: arguments at most 127) over the whole range: 2^k p(f)
           * with the polynomial's FMAs, bit for bit; 0 below -126 and for -inf, NaN kept; and the
           * column form gives the row form's values */
            enum { NX = 1100 };
            float xs[NX], ys[NX], cs[NX], zero[1] = {0.0f}, colsum[1];
            for (int i = 0; i < NX; i++) xs[i] = -150.0f + 277.0f * (float)i / (NX - 1);
            xs[0] = -INFINITY, xs[1] = -126.0f, xs[2] = nextafterf(-126.0f, -INFINITY), xs[3] = 127.0f, xs[4] = NAN;
            xs[5] = -0.0f, xs[6] = 0.5f, xs[7] = -0.5f, xs[8] = 126.5f, xs[9] = -125.5f;
            memcpy(ys, xs, sizeof xs);
            memcpy(cs, xs, sizeof xs);
            k->row_exp2_sum(ys, NX, 0.0f);
            int same = 1, first = -1;
            for (int i = 0; i < NX; i++) {
                float x = xs[i], want;
                if (x != x) want = x;
                else if (!(x >= -126.0f)) want = 0.0f;
                else {
                    /* the vector paths fuse each step; the scalar one (built for any x86-64) does not */
                    const float c[6] = {EXP2_POLY_P1, EXP2_POLY_P2, EXP2_POLY_P3, EXP2_POLY_P4, EXP2_POLY_P5, 1.0f};
                    float kk = nearbyintf(x), f = x - kk, q = EXP2_POLY_P0;
                    for (int j = 0; j < 6; j++) q = k->level == ISA_SCALAR ? q * f + c[j] : fmaf(q, f, c[j]);
                    want = ldexpf(q, (int)kk);
                }
                int ok = memcmp(&want, &ys[i], sizeof want) == 0 || (want != want && ys[i] != ys[i]);
                if (!ok && first < 0) first = i;
                same &= ok;
            }
            for (int i = 0; i < NX; i++) { /* one column per call: the column form's lane 0 */
                k->col_exp2_sum(cs + i, 1, 1, 1, zero, colsum);
                same &= memcmp(&cs[i], &ys[i], sizeof(float)) == 0 || (cs[i] != cs[i] && ys[i] != ys[i]);
            }
            CHECK(same, "%s softmax exp2 over [-150, 127]: bit for bit 2^k p(f) (first difference at x = %.9g)", nm,
                  first >= 0 ? (double)xs[first] : 0.0);
        }
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
        { /* scale_cols on 3 rows of NC columns (a ragged last vector), stride NC + 5; the gap untouched */
            enum { LDS = NC + 5 };
            float m[3 * LDS], m0[3 * LDS], a[NC];
            fill(m0, 3 * LDS, 3);
            fill(a, NC, 4);
            memcpy(m, m0, sizeof m);
            k->scale_cols(m, 3, NC, LDS, a);
            ok = 1;
            for (int r = 0; r < 3; r++)
                for (int j = 0; j < LDS; j++)
                    ok &= m[r * LDS + j] == (j < NC ? m0[r * LDS + j] * a[j] : m0[r * LDS + j]);
            CHECK(ok, "%s scale_cols", nm);
        }
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
        for (int i = 0; i < NS; i++) dg[i] = du[i] = 7.0f; /* overwritten, not accumulated into */
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
        /* bf16_round against the portable conversion (kernels/bf16.h), bit for bit: every exponent
         * with random mantissas and both signs, the rounding ties and carries, NaN, infinities,
         * denormals, overflow; in place and into another buffer, over a length with a tail */
        enum { NB = 4099 };
        static float src[NB], dst[NB];
        static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                           0xffc00001u, 0x7f800001u, 0x00000001u, 0x807fffffu, 0x00800000u,
                                           0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0x3f808000u,
                                           0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf818000u, 0x7f807fffu};
        const int ns = (int)(sizeof special / sizeof special[0]);
        for (int i = 0; i < NB; i++) {
            uint32_t u = i < ns ? special[i]
                                : (uint32_t)(i & 1) << 31 | (uint32_t)(i % 256) << 23 |
                                      ((uint32_t)(rng_uniform(&rng) * 8388608.0) & 0x7fffffu);
            memcpy(src + i, &u, 4);
        }
        int bad = -1;
        k->bf16_round(dst, src, NB);
        for (int i = 0; i < NB && bad < 0; i++) {
            uint32_t got, want = (uint32_t)bf16_from_float(src[i]) << 16;
            memcpy(&got, dst + i, 4);
            if (got != want) bad = i;
        }
        k->bf16_round(src, src, NB);
        CHECK(bad < 0 && memcmp(src, dst, sizeof src) == 0, "%s bf16_round: element %d differs from bf16_from_float%s",
              nm, bad, memcmp(src, dst, sizeof src) ? " (or in place from a copy)" : "");
    }
}

/* OpenBLAS's core against the CPU (kernels/blas_core.h): ranks, the core each CPU deserves, and
 * the re-execution decision over every case of the variables. */
static void check_blas_core(void) {
    CHECK(blas_core_rank("Prescott") == 0 && blas_core_rank("SANDYBRIDGE") == 0 && blas_core_rank(NULL) == 0,
          "pre-AVX2 cores rank 0");
    CHECK(blas_core_rank("haswell") == 1 && blas_core_rank("Zen") == 1 && blas_core_rank("SkylakeX") == 2 &&
              blas_core_rank("Cooperlake") == 3 && blas_core_rank("SAPPHIRERAPIDS") == 3,
          "core ranks (case-insensitive)");
    const CpuFeatures amx = {1, 1, 1, 1}, skx = {1, 1, 0, 0}, hsw = {1, 0, 0, 0}, old = {0, 0, 0, 0};
    CHECK(!strcmp(blas_core_for(&amx), "Cooperlake") && !strcmp(blas_core_for(&skx), "SkylakeX") &&
              !strcmp(blas_core_for(&hsw), "Haswell") && blas_core_for(&old) == NULL,
          "the core each CPU deserves");
    const char *p = blas_core_plan("Prescott", &amx, NULL, NULL, NULL);
    CHECK(p && !strcmp(p, "Cooperlake"), "Prescott on an AMX Xeon is corrected to Cooperlake");
    p = blas_core_plan("Haswell", &skx, NULL, NULL, NULL);
    CHECK(p && !strcmp(p, "SkylakeX"), "Haswell on an AVX-512 CPU is corrected to SkylakeX");
    CHECK(!blas_core_plan("Zen", &hsw, NULL, NULL, NULL), "Zen on an AVX2 CPU stays");
    CHECK(!blas_core_plan("Cooperlake", &amx, NULL, NULL, NULL), "a right core stays");
    CHECK(!blas_core_plan("Prescott", &old, NULL, NULL, NULL), "a CPU without AVX2 has nothing better");
    CHECK(!blas_core_plan("Prescott", &amx, "Prescott", NULL, NULL), "the user's OPENBLAS_CORETYPE is respected");
    p = blas_core_plan("Prescott", &amx, "Prescott", "auto", NULL);
    CHECK(p && !strcmp(p, "Cooperlake"), "SEQPAR_BLAS_CORE=auto overrides OPENBLAS_CORETYPE");
    CHECK(!blas_core_plan("Prescott", &amx, NULL, "keep", NULL), "SEQPAR_BLAS_CORE=keep keeps OpenBLAS's choice");
    CHECK(!blas_core_plan("Prescott", &amx, NULL, NULL, "Prescott"), "never a second re-execution");
    char line[300];
    blas_describe(line, sizeof line);
    CHECK(strstr(line, blas_core_name()) != NULL, "blas_describe names the core: %s", line);
    printf("test_isa: %s\n", line);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--choose")) { /* child of child_status() */
        simd();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--supported")) {
        for (int l = 0; l <= (int)isa_best(); l++) printf("%s\n", isa_name((IsaLevel)l));
        if (isa_best() == ISA_AVX512 && amx_available(NULL, 0)) printf("amx\n");
        return 0;
    }
    rng_seed(&rng, 99);
    IsaLevel best = isa_best();
    for (int l = 0; l < ISA_COUNT; l++) CHECK(isa_parse(isa_name((IsaLevel)l)) == l, "name of level %d", l);
    CHECK(isa_parse("sse9") == -1, "unknown names are refused");
    CHECK(isa_active() == best || getenv("SEQPAR_ISA"), "the default path is the best one");
    /* oneDNN's bf16 GEMM follows seqpar's AMX switch (capped below AMX when it is off) */
    const char *dnnl_isa = onednn_isa();
    if (!getenv("DNNL_MAX_CPU_ISA") && !getenv("ONEDNN_MAX_CPU_ISA"))
        CHECK((strcmp(dnnl_isa, "avx512_core_amx") == 0) == (isa_amx() != 0), "oneDNN runs %s with seqpar's AMX %s", dnnl_isa,
              isa_amx() ? "on" : "off");
    printf("test_isa: oneDNN %s, effective ISA %s\n", onednn_version(), dnnl_isa);
    char line[320];
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

    /* AMX: available exactly where SEQPAR_ISA=amx runs; the permission request never faults */
    char why[200] = "";
    const int amx = amx_available(why, sizeof why);
    CHECK(amx || *why, "amx_available gives no reason for saying no");
    CHECK((child_status("amx") == 0) == (amx && best == ISA_AVX512), "SEQPAR_ISA=amx %s",
          amx ? "must run on this CPU" : "must be refused on this CPU");
    if (!cpu_features()->amx_bf16) {
        char req[200] = "";
        CHECK(!amx_request_permission(req, sizeof req) && *req,
              "the AMX permission request on a CPU without AMX: refused with a reason (got: %s)", req);
        printf("test_isa: AMX permission request on this CPU: %s\n", req);
    }
    const int amx_was = isa_amx();
    CHECK(isa_force_amx(1) == amx, "isa_force_amx(1) %s", amx ? "refused on an AMX CPU" : "accepted without AMX");
    CHECK(isa_amx() == (amx && isa_active() == ISA_AVX512), "isa_amx() after isa_force_amx(1)");
    CHECK(isa_force_amx(0) && !isa_amx(), "isa_force_amx(0) turns AMX off");
    CHECK(!strcmp(isa_path_name(), isa_name(isa_active())), "isa_path_name without AMX: %s", isa_path_name());
    isa_force_amx(amx_was);
    check_amx_emulation();
    check_blas_core();
    if (amx) strcat(ran, " amx");
    else strcat(cannot, " amx");
    printf("test_isa: amx: %s\n", amx ? "available (AMX-BF16, tile-data permission granted)" : why);
    printf("test_isa: kernel paths checked:%s; this CPU cannot run:%s\n", ran, *cannot ? cannot : " (none)");
    return test_summary("test_isa");
}
