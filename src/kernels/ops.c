/* Dense operations of the Llama model: linear layers through kernels/sgemm.h (oneDNN or OpenBLAS), and RMSNorm, RoPE, SwiGLU,
 * embedding and the chunked cross-entropy head as our own OpenMP loops, whose per-row bodies are
 * the run-time dispatched kernels of kernels/isa.h. See ops.h. */
#include "kernels/ops.h"
#include "core/common.h"
#include "core/op_clock.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "kernels/sgemm.h"

#include <omp.h>
#include <pthread.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void linear_forward_ld(float *out, int ld_out, const float *in, int ld_in, const float *W, int N, int n_in, int n_out,
                       int accumulate) {
    sgemm_rm(0, 1, N, n_out, n_in, 1.0f, in, ld_in, W, n_in, accumulate ? 1.0f : 0.0f, out, ld_out);
}

void linear_backward_ld(float *din, float *dW, const float *dout, int ld_out, const float *in, int ld_in,
                        const float *W, int N, int n_in, int n_out) {
    linear_backward_acc_ld(din, 1, dW, dout, ld_out, in, ld_in, W, N, n_in, n_out);
}

void linear_backward_acc_ld(float *din, int din_accumulate, float *dW, const float *dout, int ld_out, const float *in,
                            int ld_in, const float *W, int N, int n_in, int n_out) {
    if (din) sgemm_rm(0, 0, N, n_in, n_out, 1.0f, dout, ld_out, W, n_in, din_accumulate ? 1.0f : 0.0f, din, ld_in);
    if (dW) sgemm_rm(1, 0, n_out, n_in, N, 1.0f, dout, ld_out, in, ld_in, 1.0f, dW, n_in);
}

void linear_forward(float *out, const float *in, const float *W, int N, int n_in, int n_out, int accumulate) {
    linear_forward_ld(out, n_out, in, n_in, W, N, n_in, n_out, accumulate);
}

void linear_backward(float *din, float *dW, const float *dout, const float *in, const float *W,
                     int N, int n_in, int n_out) {
    linear_backward_ld(din, dW, dout, n_out, in, n_in, W, N, n_in, n_out);
}

int linear_row_stride(int width) { return width > 0 && width % 512 == 0 ? width + 16 : width; }

void bf16_scratch_free(Bf16Scratch *s) {
    xfree(s->buf);
    memset(s, 0, sizeof *s);
}

/* The second operand starts at the first's size rounded up to 32 elements (64 bytes). */
static size_t second_offset(size_t na) { return (na + 31) / 32 * 32; }

size_t bf16_scratch_elems(size_t na, size_t nb) { return second_offset(na) + (nb ? nb : 1); }

/* fp32 copies: the second starts at the first's size rounded up to 16 floats (64 bytes) */
static size_t second_offset_f32(size_t na) { return (na + 15) / 16 * 16; }

size_t bf16_scratch_f32_elems(size_t na, size_t nb) { return second_offset_f32(na) + (nb ? nb : 1); }

/* Room for operand copies of na and nb elements (grown when short: nothing in it survives a
 * growth, so a call reserves for both of its operands before packing the first); returns the
 * first's place, *second the second's. */
static bf16_t *scratch_grow(Bf16Scratch *s, size_t need) {
    if (s->cap < need || !s->buf) {
        xfree(s->buf);
        s->cap = need;
        s->buf = xmalloc(sizeof(bf16_t) * s->cap); /* 64-byte aligned */
    }
    return s->buf;
}

static bf16_t *scratch_reserve(Bf16Scratch *s, size_t na, size_t nb, bf16_t **second) {
    bf16_t *b = scratch_grow(s, bf16_scratch_elems(na, nb));
    *second = b + second_offset(na);
    return b;
}

/* The conversion path's room: fp32 copies of na and nb floats (bf16_scratch_f32_elems), as
 * scratch_reserve. */
static float *scratch_reserve_f32(Bf16Scratch *s, size_t na, size_t nb, float **second) {
    float *f = (float *)(void *)scratch_grow(s, 2 * bf16_scratch_f32_elems(na, nb)); /* 2-byte elements */
    *second = f + second_offset_f32(na);
    return f;
}

/* SEQPAR_CHECK_ROUNDED=1: the operands a call marks as rounded are checked (ops.h) */
static int check_rounded;
static pthread_once_t check_rounded_once = PTHREAD_ONCE_INIT;
int check_rounded_from_env(char *err, size_t n) {
    const char *e = getenv("SEQPAR_CHECK_ROUNDED");
    if (!e || !*e || !strcmp(e, "0")) check_rounded = 0;
    else if (!strcmp(e, "1")) check_rounded = 1;
    else { /* any other value was taken as 1 */
        snprintf(err, n, "SEQPAR_CHECK_ROUNDED=%.40s: expected 1 (check the operands made as bf16 values) or 0 (no "
                 "check; also unset)", e);
        return -1;
    }
    return 0;
}
static void read_check_rounded(void) { /* without the CLI's start-up call (the test programs) */
    char err[200];
    if (check_rounded_from_env(err, sizeof err) != 0) die("%s", err);
}

static void check_operand(const char *call, const char *name, const float *x, size_t n) {
    pthread_once(&check_rounded_once, read_check_rounded);
    if (!check_rounded) return;
    const size_t i = bf16_unrounded(x, n);
    if (i < n)
        die("%s: %s is marked BF16_*_ROUNDED but its element %zu (%.9g) is not a bf16 value (SEQPAR_CHECK_ROUNDED)",
            call, name, i, (double)x[i]);
}

void linear_forward_bf16_ld(float *out, int ld_out, const float *in, int ld_in, const float *W, int N, int n_in,
                            int n_out, int accumulate, unsigned rounded, Bf16Scratch *scratch) {
    const double t0 = op_clock_now();
    Bf16Scratch own = {0}, *s = scratch ? scratch : &own;
    const size_t n_x = (size_t)N * ld_in, n_w = (size_t)n_out * n_in;
    const int in_ready = (rounded & BF16_IN_ROUNDED) != 0;
    if (in_ready) check_operand("linear_forward_bf16", "the input", in, n_x);
    if (bf16_products_on_sgemm()) {
        float *W_r, *in_r = scratch_reserve_f32(s, in_ready ? 0 : n_x, n_w, &W_r);
        if (!in_ready) bf16_round_copy(in_r, in, n_x);
        bf16_round_copy(W_r, W, n_w);
        sgemm_lib_rm(sgemm_lib(), 0, 1, N, n_out, n_in, 1.0f, in_ready ? in : in_r, ld_in, W_r, n_in,
                     accumulate ? 1.0f : 0.0f, out, ld_out);
    } else {
        bf16_t *W_h, *in_h = scratch_reserve(s, n_x, n_w, &W_h);
        bf16_pack(in_h, in, n_x);
        bf16_pack(W_h, W, n_w);
        bf16_kernels()->gemm(0, 1, N, n_out, n_in, 1.0f, in_h, ld_in, W_h, n_in, accumulate ? 1.0f : 0.0f, out, ld_out);
    }
    if (!scratch) bf16_scratch_free(&own);
    op_clock_add(OPC_LINEAR, t0);
}

void linear_backward_bf16_ld(float *din, float *dW, const float *dout, int ld_out, const float *in, int ld_in,
                             const float *W, int N, int n_in, int n_out, unsigned rounded, Bf16Scratch *scratch) {
    linear_backward_bf16_acc_ld(din, 1, dW, dout, ld_out, in, ld_in, W, N, n_in, n_out, rounded, scratch);
}

void linear_backward_bf16_acc_ld(float *din, int din_accumulate, float *dW, const float *dout, int ld_out,
                                 const float *in, int ld_in, const float *W, int N, int n_in, int n_out,
                                 unsigned rounded, Bf16Scratch *scratch) {
    const double t0 = op_clock_now();
    const Bf16Kernels *k = bf16_kernels();
    Bf16Scratch own = {0}, *s = scratch ? scratch : &own;
    const size_t n_d = (size_t)N * ld_out, n_w = din ? (size_t)n_out * n_in : 0, n_x = dW ? (size_t)N * ld_in : 0;
    const int dout_ready = (rounded & BF16_DOUT_ROUNDED) != 0, in_ready = dW && (rounded & BF16_IN_ROUNDED);
    if (dout_ready) check_operand("linear_backward_bf16", "the output gradient", dout, n_d);
    if (in_ready) check_operand("linear_backward_bf16", "the input", in, n_x);
    if (bf16_products_on_sgemm()) { /* the same order: dout, then W (input gradient), then the input (weight gradient) */
        const SgemmLib lib = sgemm_lib();
        const size_t n_second = in_ready || n_w > n_x ? n_w : n_x;
        float *second, *dout_r = scratch_reserve_f32(s, dout_ready ? 0 : n_d, n_second, &second);
        const float *d = dout_ready ? dout : dout_r;
        if (!dout_ready) bf16_round_copy(dout_r, dout, n_d);
        if (din) {
            bf16_round_copy(second, W, n_w);
            sgemm_lib_rm(lib, 0, 0, N, n_in, n_out, 1.0f, d, ld_out, second, n_in, din_accumulate ? 1.0f : 0.0f, din,
                         ld_in);
        }
        if (dW) {
            if (!in_ready) bf16_round_copy(second, in, n_x);
            sgemm_lib_rm(lib, 1, 0, n_out, n_in, N, 1.0f, d, ld_out, in_ready ? in : second, ld_in, 1.0f, dW, n_in);
        }
    } else {
        bf16_t *second, *dout_h = scratch_reserve(s, n_d, n_w > n_x ? n_w : n_x, &second);
        bf16_pack(dout_h, dout, n_d);
        if (din) { /* the second place holds W, then (for dW) the input */
            bf16_pack(second, W, n_w);
            k->gemm(0, 0, N, n_in, n_out, 1.0f, dout_h, ld_out, second, n_in, din_accumulate ? 1.0f : 0.0f, din, ld_in);
        }
        if (dW) {
            bf16_pack(second, in, n_x);
            k->gemm(1, 0, n_out, n_in, N, 1.0f, dout_h, ld_out, second, ld_in, 1.0f, dW, n_in);
        }
    }
    if (!scratch) bf16_scratch_free(&own);
    op_clock_add(OPC_LINEAR, t0);
}

void linear_forward_bf16(float *out, const float *in, const float *W, int N, int n_in, int n_out, int accumulate,
                         Bf16Scratch *scratch) {
    linear_forward_bf16_ld(out, n_out, in, n_in, W, N, n_in, n_out, accumulate, 0, scratch);
}

void linear_backward_bf16(float *din, float *dW, const float *dout, const float *in, const float *W,
                          int N, int n_in, int n_out, Bf16Scratch *scratch) {
    linear_backward_bf16_ld(din, dW, dout, n_out, in, n_in, W, N, n_in, n_out, 0, scratch);
}

static void rmsnorm_rows(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps,
                         int round) {
    const SimdKernels *sk = simd();
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        rstd[i] = sk->rmsnorm_row(out + (size_t)i * D, x + (size_t)i * D, w, D, eps);
        if (round) bf16_round_serial(out + (size_t)i * D, (size_t)D);
    }
}

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps) {
    rmsnorm_rows(out, rstd, x, w, N, D, eps, 0);
}

void rmsnorm_forward_bf16(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps) {
    rmsnorm_rows(out, rstd, x, w, N, D, eps, 1);
}

void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int N, int D) {
    /* y = x r w, r = (mean(x^2)+eps)^-1/2: dx = r (dout w) - x r^3 / D * sum(dout w x).
     * dw is reduced through per-thread partials summed in thread order: deterministic for a
     * given thread count, so resumed runs are bit-identical. */
    const SimdKernels *sk = simd();
    int nt = omp_get_max_threads();
    float *partial = dw ? calloc((size_t)nt * (size_t)D, sizeof(float)) : NULL;
    if (dw && !partial) die("out of memory in rmsnorm_backward");
    #pragma omp parallel num_threads(nt)
    {
        float *dw_local = dw ? partial + (size_t)omp_get_thread_num() * D : NULL;
        #pragma omp for schedule(static)
        for (int i = 0; i < N; i++)
            sk->rmsnorm_bwd_row(dx + (size_t)i * D, dw_local, dout + (size_t)i * D, x + (size_t)i * D, w, rstd[i], D);
    }
    if (dw) {
        for (int t = 0; t < nt; t++)
            for (int j = 0; j < D; j++) dw[j] += partial[(size_t)t * D + j];
        free(partial);
    }
}

void rope_tables(float *cos_t, float *sin_t, const int *positions, int N, int head_dim, double theta) {
    int half = head_dim / 2;
    double *inv_freq = xmalloc(sizeof *inv_freq * (size_t)(half > 0 ? half : 1)); /* once per j, not per token */
    for (int j = 0; j < half; j++) inv_freq[j] = pow(theta, -2.0 * j / (double)head_dim);
    rope_tables_freq(cos_t, sin_t, positions, N, head_dim, inv_freq);
    xfree(inv_freq);
}

void rope_tables_freq(float *cos_t, float *sin_t, const int *positions, int N, int head_dim, const double *inv_freq) {
    int half = head_dim / 2;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < half; j++) {
            double a = (double)positions[i] * inv_freq[j];
            cos_t[(size_t)i * half + j] = (float)cos(a);
            sin_t[(size_t)i * half + j] = (float)sin(a);
        }
    }
}

static void rope_rotate(float *x, const float *cos_t, const float *sin_t, int N, int n_heads,
                        int head_dim, float sign, int round) {
    int half = head_dim / 2;
    const SimdKernels *sk = simd();
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *c = cos_t + (size_t)i * half, *s = sin_t + (size_t)i * half;
        float *row = x + (size_t)i * n_heads * head_dim;
        for (int h = 0; h < n_heads; h++) sk->rope_head(row + (size_t)h * head_dim, c, s, half, sign);
        if (round) bf16_round_serial(row, (size_t)n_heads * head_dim);
    }
}

void rope_forward(float *x, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim) {
    rope_rotate(x, cos_t, sin_t, N, n_heads, head_dim, 1.0f, 0);
}

void rope_forward_bf16(float *x, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim) {
    rope_rotate(x, cos_t, sin_t, N, n_heads, head_dim, 1.0f, 1);
}

void rope_backward(float *dx, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim) {
    rope_rotate(dx, cos_t, sin_t, N, n_heads, head_dim, -1.0f, 0);
}

void rope_backward_bf16(float *dx, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim) {
    rope_rotate(dx, cos_t, sin_t, N, n_heads, head_dim, -1.0f, 1);
}

/* Element-wise loops run in blocks of SW_BLOCK elements, one dispatched kernel call per block. */
#define SW_BLOCK 4096

static void swiglu_fwd_blocks(float *h, const float *gate, const float *up, size_t n, int round) {
    const SimdKernels *sk = simd();
    const long long nb = (long long)((n + SW_BLOCK - 1) / SW_BLOCK);
    #pragma omp parallel for schedule(static)
    for (long long b = 0; b < nb; b++) {
        size_t lo = (size_t)b * SW_BLOCK, len = n - lo < SW_BLOCK ? n - lo : SW_BLOCK;
        sk->swiglu_fwd(h + lo, gate + lo, up + lo, len);
        if (round) bf16_round_serial(h + lo, len);
    }
}

static void swiglu_bwd_blocks(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n,
                              int round) {
    const SimdKernels *sk = simd();
    const long long nb = (long long)((n + SW_BLOCK - 1) / SW_BLOCK);
    #pragma omp parallel for schedule(static)
    for (long long b = 0; b < nb; b++) {
        size_t lo = (size_t)b * SW_BLOCK, len = n - lo < SW_BLOCK ? n - lo : SW_BLOCK;
        sk->swiglu_bwd(dgate + lo, dup + lo, dh + lo, gate + lo, up + lo, len);
        if (round) {
            bf16_round_serial(dgate + lo, len);
            bf16_round_serial(dup + lo, len);
        }
    }
}

void swiglu_forward(float *h, const float *gate, const float *up, size_t n) { swiglu_fwd_blocks(h, gate, up, n, 0); }

void swiglu_forward_bf16(float *h, const float *gate, const float *up, size_t n) {
    swiglu_fwd_blocks(h, gate, up, n, 1);
}

void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n) {
    swiglu_bwd_blocks(dgate, dup, dh, gate, up, n, 0);
}

void swiglu_backward_bf16(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n) {
    swiglu_bwd_blocks(dgate, dup, dh, gate, up, n, 1);
}

void embedding_forward(float *out, const int *tokens, const float *table, int N, int D) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * D, table + (size_t)tokens[i] * D, sizeof(float) * (size_t)D);
}

void bias_add_rows(float *y, size_t ld, const float *b, int N, int cols) {
    #pragma omp parallel for schedule(static) if ((size_t)N * (size_t)cols > 65536)
    for (int i = 0; i < N; i++) {
        float *r = y + (size_t)i * ld;
        for (int j = 0; j < cols; j++) r[j] += b[j];
    }
}

void bias_grad_rows(float *db, const float *dy, size_t ld, int N, int cols) {
    /* blocks of 64 columns to threads; inside a block the rows in order, so each column's sum is
     * the same whatever the threads */
    const int blocks = (cols + 63) / 64;
    #pragma omp parallel for schedule(static) if ((size_t)N * (size_t)cols > 65536)
    for (int bk = 0; bk < blocks; bk++) {
        const int j0 = bk * 64, j1 = j0 + 64 < cols ? j0 + 64 : cols;
        float acc[64];
        for (int j = j0; j < j1; j++) acc[j - j0] = db[j];
        for (int i = 0; i < N; i++) {
            const float *r = dy + (size_t)i * ld;
            for (int j = j0; j < j1; j++) acc[j - j0] += r[j];
        }
        for (int j = j0; j < j1; j++) db[j] = acc[j - j0];
    }
}

void embedding_backward(float *dtable, const float *dout, const int *tokens, int N, int D, int padding_idx) {
    /* Rows of the same token collide, so parallelise over the embedding dimension. */
    #pragma omp parallel for schedule(static)
    for (int j = 0; j < D; j++)
        for (int i = 0; i < N; i++)
            if (tokens[i] != padding_idx) dtable[(size_t)tokens[i] * D + j] += dout[(size_t)i * D + j];
}

size_t bf16_weight_bytes(size_t n) { return n * (bf16_products_on_sgemm() ? sizeof(float) : sizeof(bf16_t)); }

void bf16_weight_set(Bf16Weight *w, const float *W, size_t n) {
    const size_t bytes = bf16_weight_bytes(n);
    if (w->bytes < bytes || !w->buf) {
        xfree(w->buf);
        w->buf = xmalloc(bytes ? bytes : 1);
        w->bytes = bytes;
    }
    if (bf16_products_on_sgemm()) bf16_round_copy(w->buf, W, n);
    else bf16_pack(w->buf, W, n);
    w->n = n;
}

void bf16_weight_free(Bf16Weight *w) {
    xfree(w->buf);
    memset(w, 0, sizeof *w);
}

size_t lm_head_bf16_scratch_elems(int chunk, int D, int V) {
    return bf16_scratch_elems((size_t)chunk * D, (size_t)chunk * V);
}

/* The chunked head and cross-entropy of both precisions: fp32 products on W (W16 NULL), or bf16
 * products on W16, as bf16 words with the bf16 path's GEMM or, on the conversion path, as fp32
 * sgemm on its fp32 array of bf16 values; under bf16 each row's logit gradients go to bf16 while
 * the row is in cache. scratch: the bf16 words of a chunk's x and logit gradients. */
static double head_xent(const float *x, const float *W, const Bf16Weight *W16, const int *targets, int N, int D,
                        int V, float loss_scale, float *dx, float *dW, int *predictions, double *row_losses, int chunk,
                        float *workspace, Bf16Scratch *scratch) {
    if (chunk > 256) die("internal: cross-entropy chunk %d exceeds 256", chunk);
    const int words = W16 && !bf16_products_on_sgemm(), grad = dx || dW;
    const float *Wf = W16 ? (words ? NULL : (const float *)W16->buf) : W; /* the products' fp32 operand */
    const SimdKernels *sk = simd();
    const Bf16Kernels *k = words ? bf16_kernels() : NULL;
    double total = 0.0;
    for (int c0 = 0; c0 < N; c0 += chunk) {
        const int n = N - c0 < chunk ? N - c0 : chunk;
        const float *xc = x + (size_t)c0 * D;
        float *logits = workspace; /* (n, V): logits, then dlogits = scale * (softmax - onehot), 0 if ignored */
        bf16_t *x_h = NULL, *dl_h = NULL;
        if (words) {
            const double t0 = op_clock_now();
            x_h = scratch_reserve(scratch, (size_t)n * D, (size_t)n * V, &dl_h);
            bf16_pack(x_h, xc, (size_t)n * D);
            k->gemm(0, 1, n, V, D, 1.0f, x_h, D, W16->buf, D, 0.0f, logits, V);
            op_clock_add(OPC_LINEAR, t0);
        } else {
            linear_forward(logits, xc, Wf, n, D, V, 0);
        }
        double row_loss[256]; /* per-row losses, summed in order below (deterministic) */
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < n; i++) {
            int arg = 0;
            float *row = logits + (size_t)i * V;
            row_loss[i] = sk->xent_row(row, V, targets[c0 + i], loss_scale, grad, &arg);
            if (predictions) predictions[c0 + i] = arg;
            if (grad && words) k->pack(dl_h + (size_t)i * V, row, (size_t)V);
            else if (grad && W16) bf16_round_serial(row, (size_t)V);
        }
        for (int i = 0; i < n; i++) total += row_loss[i];
        if (row_losses) memcpy(row_losses + c0, row_loss, sizeof(double) * (size_t)n);
        if (!grad) continue;
        if (words) {
            const double t0 = op_clock_now();
            if (dx) k->gemm(0, 0, n, D, V, 1.0f, dl_h, V, W16->buf, D, 1.0f, dx + (size_t)c0 * D, D);
            if (dW) k->gemm(1, 0, V, D, n, 1.0f, dl_h, V, x_h, D, 1.0f, dW, D);
            op_clock_add(OPC_LINEAR, t0);
        } else {
            linear_backward(dx ? dx + (size_t)c0 * D : NULL, dW, logits, xc, Wf, n, D, V);
        }
    }
    return total;
}

double lm_head_cross_entropy(const float *x, const float *W, const int *targets, int N, int D, int V,
                             float loss_scale, float *dx, float *dW, int *predictions, double *row_losses,
                             int chunk, float *workspace) {
    return head_xent(x, W, NULL, targets, N, D, V, loss_scale, dx, dW, predictions, row_losses, chunk, workspace,
                     NULL);
}

double lm_head_cross_entropy_bf16(const float *x, const Bf16Weight *W, const int *targets, int N, int D, int V,
                                  float loss_scale, float *dx, float *dW, int *predictions, double *row_losses,
                                  int chunk, float *workspace, Bf16Scratch *scratch) {
    if (W->n != (size_t)V * D) die("internal: the bf16 head holds %zu elements, not %d x %d", W->n, V, D);
    check_operand("lm_head_cross_entropy_bf16", "the input", x, (size_t)N * D);
    Bf16Scratch own = {0};
    const double total = head_xent(x, NULL, W, targets, N, D, V, loss_scale, dx, dW, predictions, row_losses, chunk,
                                   workspace, scratch ? scratch : &own);
    bf16_scratch_free(&own);
    return total;
}
