/* The avx512_bf16 path's GEMM (bf16.h): oneDNN's bf16 matmul (bf16 operands, fp32 accumulation
 * and output; its avx512_core_bf16 brgemm kernels use VDPBF16PS). Measured at 2.2-3.5x OpenBLAS
 * sgemm on the model's shapes on the project's CPU (bench/bf16_gemm_libs.c, bench/results/), where
 * Debian's OpenBLAS has no bf16 GEMM. A matmul primitive is made once per shape (transposes,
 * sizes, leading dimensions, beta 0 or 1) and kept in a small cache; operands are passed by
 * pointer, nothing is copied. alpha other than 1 or beta other than 0 and 1 (no caller uses
 * them) go to the conversion path's GEMM. Where the CPU has AMX, oneDNN's matmul uses it (its
 * brgemm avx512_core_amx kernels; oneDNN requests the Linux tile-data permission itself) unless
 * seqpar's AMX is off (kernels/onednn.c caps it). */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "kernels/onednn.h"

#define CHECK_DNNL(call) do { dnnl_status_t st_ = (call); \
    if (st_ != dnnl_success) die("oneDNN: %s failed with status %d", #call, (int)st_); } while (0)

typedef struct {
    int key[9]; /* transA, transB, M, N, K, lda, ldb, ldc, accumulate */
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md;
    unsigned long last_use;
} MatmulEntry;

#define CACHE_SIZE 64
static MatmulEntry g_cache[CACHE_SIZE];
static int g_cached;
static unsigned long g_clock;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void make_entry(MatmulEntry *e, const int key[9]) {
    int tA = key[0], tB = key[1], M = key[2], N = key[3], K = key[4], lda = key[5], ldb = key[6], ldc = key[7];
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {tA ? 1 : lda, tA ? lda : 1}, bs = {tB ? 1 : ldb, tB ? ldb : 1}, cs = {ldc, 1};
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(&e->a_md, 2, ad, dnnl_bf16, as));
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(&e->b_md, 2, bd, dnnl_bf16, bs));
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(&e->c_md, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    CHECK_DNNL(dnnl_matmul_desc_init(&md, &e->a_md, &e->b_md, NULL, &e->c_md));
    dnnl_primitive_attr_t attr;
    CHECK_DNNL(dnnl_primitive_attr_create(&attr));
    if (key[8]) { /* C += A B: a sum post-op */
        dnnl_post_ops_t po;
        CHECK_DNNL(dnnl_post_ops_create(&po));
        CHECK_DNNL(dnnl_post_ops_append_sum(po, 1.0f));
        CHECK_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    CHECK_DNNL(dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL));
    CHECK_DNNL(dnnl_primitive_create(&e->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    memcpy(e->key, key, sizeof e->key);
}

static MatmulEntry *lookup(const int key[9]) {
    if (!g_engine) onednn_engine(&g_engine, &g_stream);
    for (int i = 0; i < g_cached; i++)
        if (!memcmp(g_cache[i].key, key, sizeof g_cache[i].key)) return &g_cache[i];
    MatmulEntry *e;
    if (g_cached < CACHE_SIZE) {
        e = &g_cache[g_cached++];
    } else { /* replace the least recently used */
        e = &g_cache[0];
        for (int i = 1; i < CACHE_SIZE; i++)
            if (g_cache[i].last_use < e->last_use) e = &g_cache[i];
        dnnl_primitive_destroy(e->prim);
    }
    make_entry(e, key);
    return e;
}

void bf16_gemm_onednn(int transA, int transB, int M, int N, int K, float alpha, const bf16_t *A, int lda,
                      const bf16_t *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (alpha != 1.0f || (beta != 0.0f && beta != 1.0f) || K <= 0) {
        bf16_gemm_convert(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int key[9] = {transA != 0, transB != 0, M, N, K, lda, ldb, ldc, beta != 0.0f};
    pthread_mutex_lock(&g_lock);
    MatmulEntry *e = lookup(key);
    e->last_use = ++g_clock;
    dnnl_memory_t ma, mb, mc;
    CHECK_DNNL(dnnl_memory_create(&ma, &e->a_md, g_engine, (void *)A));
    CHECK_DNNL(dnnl_memory_create(&mb, &e->b_md, g_engine, (void *)B));
    CHECK_DNNL(dnnl_memory_create(&mc, &e->c_md, g_engine, C));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    CHECK_DNNL(dnnl_primitive_execute(e->prim, g_stream, 3, args));
    CHECK_DNNL(dnnl_stream_wait(g_stream));
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    pthread_mutex_unlock(&g_lock);
}
