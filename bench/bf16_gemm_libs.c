/* Which bf16 GEMM --precision bf16 should use (README, bf16): on the model's GEMM shapes, OpenBLAS
 * sgemm (fp32), the conversion path (bf16 widened to fp32, then sgemm) and oneDNN's bf16 matmul
 * (bf16 inputs, fp32 output; Debian libdnnl 2.6), best of 5 wall-clock runs each, same process.
 * (Debian's OpenBLAS 0.3.21 is built without bf16: it has no cblas_sbgemm symbol.)
 * Build: make bench-bf16 (never needed by the tests or the main job). */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"

#define CHECK_DNNL(x) do { dnnl_status_t st_ = (x); if (st_ != dnnl_success) die("%s: oneDNN status %d", #x, (int)st_); } while (0)

static void run(int M, int N, int K, int reps, dnnl_engine_t eng, dnnl_stream_t strm) {
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    float *a = xmalloc(4 * na), *b = xmalloc(4 * nb), *c = xmalloc(4 * nc), *af = xmalloc(4 * na), *bfl = xmalloc(4 * nb);
    bf16_t *ah = xmalloc(2 * na), *bh = xmalloc(2 * nb);
    Rng r;
    rng_seed(&r, 1);
    for (size_t i = 0; i < na; i++) a[i] = (float)rng_normal(&r);
    for (size_t i = 0; i < nb; i++) b[i] = (float)rng_normal(&r);
    bf16_pack(ah, a, na);
    bf16_pack(bh, b, nb);
    /* oneDNN: src (M, K) row-major, weights (K, N) given as B^T stored (N, K) -> strides {1, K} */
    dnnl_memory_desc_t src_md, wei_md, dst_md;
    dnnl_dims_t sd = {M, K}, wd = {K, N}, dd = {M, N}, ss = {K, 1}, ws = {1, K}, ds = {N, 1};
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(&src_md, 2, sd, dnnl_bf16, ss));
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(&wei_md, 2, wd, dnnl_bf16, ws));
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(&dst_md, 2, dd, dnnl_f32, ds));
    dnnl_matmul_desc_t md;
    CHECK_DNNL(dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md));
    dnnl_primitive_desc_t pd;
    CHECK_DNNL(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    dnnl_primitive_t prim;
    CHECK_DNNL(dnnl_primitive_create(&prim, pd));
    dnnl_memory_t ms, mw, mdst;
    CHECK_DNNL(dnnl_memory_create(&ms, &src_md, eng, ah));
    CHECK_DNNL(dnnl_memory_create(&mw, &wei_md, eng, bh));
    CHECK_DNNL(dnnl_memory_create(&mdst, &dst_md, eng, c));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, mdst}};
    double best[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        double t1 = now_seconds();
        bf16_unpack(af, ah, na);
        bf16_unpack(bfl, bh, nb);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, af, K, bfl, K, 0.0f, c, N);
        double t2 = now_seconds();
        CHECK_DNNL(dnnl_primitive_execute(prim, strm, 3, args));
        CHECK_DNNL(dnnl_stream_wait(strm));
        double t3 = now_seconds();
        double t[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int i = 0; i < 3; i++) if (t[i] < best[i]) best[i] = t[i];
    }
    double fl = 2.0 * M * N * K * 1e-9;
    printf("M %5d N %5d K %5d | sgemm %6.1f | convert+sgemm %6.1f | oneDNN bf16 %6.1f GFLOPS (%.2fx sgemm; %s)\n", M, N, K,
           fl / best[0], fl / best[1], fl / best[2], best[0] / best[2], impl);
    dnnl_memory_destroy(ms); dnnl_memory_destroy(mw); dnnl_memory_destroy(mdst);
    dnnl_primitive_destroy(prim); dnnl_primitive_desc_destroy(pd);
    xfree(a); xfree(b); xfree(c); xfree(af); xfree(bfl); xfree(ah); xfree(bh);
}

int main(void) {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    CHECK_DNNL(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CHECK_DNNL(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    run(2048, 2048, 2048, 5, eng, strm);
    run(8192, 1024, 256, 5, eng, strm); /* gate / up at S = 8K */
    run(8192, 256, 1024, 5, eng, strm); /* down */
    run(8192, 256, 256, 5, eng, strm);  /* q, o */
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}
