/* The model's dense operations as forward/backward pairs with the same argument order.
 * Backward functions ACCUMULATE (+=) into gradient buffers, which the caller zeroes once per
 * step (swiglu_backward alone writes its outputs). All tensors are row-major fp32; shapes are given in comments as (rows, cols).
 * Matrix multiplies go to kernels/sgemm.h (oneDNN or OpenBLAS; bf16: kernels/bf16.h); everything
 * else is our own loops, OpenMP-parallel over tokens. Attention lives in attention/, not here. */
#ifndef SEQPAR_OPS_H
#define SEQPAR_OPS_H

#include <stddef.h>
#include <stdint.h>

/* out (N, n_out) = in (N, n_in) @ W^T, W (n_out, n_in) as Hugging Face Linear stores it. accumulate: out += */
void linear_forward(float *out, const float *in, const float *W, int N, int n_in, int n_out, int accumulate);
/* din (N, n_in) += dout (N, n_out) @ W; dW (n_out, n_in) += dout^T @ in. din or dW may be NULL. */
void linear_backward(float *din, float *dW, const float *dout, const float *in, const float *W,
                     int N, int n_in, int n_out);
/* The same on strided rows: in's and din's rows ld_in floats apart (ld_in >= n_in), out's and
 * dout's ld_out apart (>= n_out); each of those buffers holds N whole rows of its stride. */
void linear_forward_ld(float *out, int ld_out, const float *in, int ld_in, const float *W, int N, int n_in, int n_out,
                       int accumulate);
void linear_backward_ld(float *din, float *dW, const float *dout, int ld_out, const float *in, int ld_in,
                        const float *W, int N, int n_in, int n_out);
/* linear_backward_ld with din overwritten (din_accumulate 0: din = dout @ W, no zeroing pass over
 * din beforehand; the same values as zeroing then accumulating) or accumulated (1). */
void linear_backward_acc_ld(float *din, int din_accumulate, float *dW, const float *dout, int ld_out, const float *in,
                            int ld_in, const float *W, int N, int n_in, int n_out);
/* The row stride for activation rows `width` floats wide: width, plus one cache line (16 floats)
 * where width floats are a multiple of 2 KiB. Rows a multiple of 2 KiB apart fall into the same
 * few L1 sets, and a GEMM that reads down their columns (the weight gradients, whose products
 * run over the tokens) thrashes them: on the MLP's 1024-wide rows (bench/step_gemms: its "packed" lines)
 * oneDNN's weight gradients ran at half speed under AVX2. */
int linear_row_stride(int width);
/* The same two in bf16 mixed precision (kernels/bf16.h): every operand of each product rounded to
 * bf16 (round to nearest even), products accumulated in fp32, results fp32. The bf16 copies of
 * the operands go to `scratch`: one buffer holding a call's two operand copies side by side (so
 * it is as large as the largest call's two operands together, not the largest first operand
 * plus the largest second one), which grows as needed and is kept for the next call (NULL:
 * allocated and freed per call). */
typedef struct {
    uint16_t *buf; /* bf16 operand copies: the first operand, then the second (64-byte aligned) */
    size_t cap;    /* elements */
} Bf16Scratch;
/* Elements a Bf16Scratch holds for a call whose two operand copies have na and nb elements. */
size_t bf16_scratch_elems(size_t na, size_t nb);
/* On the conversion path (no bf16 arithmetic, kernels/bf16.h) the copies are fp32 arrays of bf16
 * values instead, and the fp32 GEMM reads them as they are: the same products as bf16 copies
 * widened again (bf16_gemm_convert) without the widening pass and its transient fp32 copies.
 * Floats a Bf16Scratch then holds for such a call. */
size_t bf16_scratch_f32_elems(size_t na, size_t nb);
void bf16_scratch_free(Bf16Scratch *s);
void linear_forward_bf16(float *out, const float *in, const float *W, int N, int n_in, int n_out, int accumulate,
                         Bf16Scratch *scratch);
void linear_backward_bf16(float *din, float *dW, const float *dout, const float *in, const float *W,
                          int N, int n_in, int n_out, Bf16Scratch *scratch);
/* Operands the caller holds as bf16 values already (`rounded`, a mask of these): made by bf16_round
 * or by one of the *_bf16 producers below, while they were in cache. The conversion path's sgemm
 * reads them where they are (no copy in the scratch, no rounding pass); the bf16 path packs them as
 * it packs any operand (rounding a bf16 value gives itself), so the results are the same bit for
 * bit either way. With SEQPAR_CHECK_ROUNDED=1 in the environment every operand so marked is
 * checked first, and one that is not a bf16 value ends the process naming the call (tests). */
enum { BF16_IN_ROUNDED = 1, BF16_DOUT_ROUNDED = 2 };
/* Reads SEQPAR_CHECK_ROUNDED (1; 0, empty or unset: no check). Returns 0, or -1 with a one-line
 * message in err for any other value. The CLI calls it at start-up; else the first marked operand reads it. */
int check_rounded_from_env(char *err, size_t n);
/* On strided rows as linear_forward_ld / linear_backward_ld; the bf16 copies keep the strides
 * (a row operand's copy is N rows of its stride). */
void linear_forward_bf16_ld(float *out, int ld_out, const float *in, int ld_in, const float *W, int N, int n_in,
                            int n_out, int accumulate, unsigned rounded, Bf16Scratch *scratch);
void linear_backward_bf16_ld(float *din, float *dW, const float *dout, int ld_out, const float *in, int ld_in,
                             const float *W, int N, int n_in, int n_out, unsigned rounded, Bf16Scratch *scratch);
void linear_backward_bf16_acc_ld(float *din, int din_accumulate, float *dW, const float *dout, int ld_out,
                                 const float *in, int ld_in, const float *W, int N, int n_in, int n_out,
                                 unsigned rounded, Bf16Scratch *scratch);

/* A weight held as the bf16 products read it, made once and read by many calls (the LM head's,
 * whose vocabulary-sized matrix is too large to copy per call): bf16 words on the bf16 path, an
 * fp32 array of bf16 values on the conversion path (bf16_products_on_sgemm). The buffer grows as
 * needed and is kept. */
typedef struct {
    void *buf;
    size_t bytes; /* capacity */
    size_t n;     /* elements it holds */
} Bf16Weight;
/* Bytes a Bf16Weight of n elements holds on this process's path. */
size_t bf16_weight_bytes(size_t n);
/* w = W (n elements) rounded to bf16, OpenMP-parallel. */
void bf16_weight_set(Bf16Weight *w, const float *W, size_t n);
void bf16_weight_free(Bf16Weight *w);

/* RMSNorm (HF LlamaRMSNorm): out = x / sqrt(mean(x^2) + eps) * w. rstd (N) is saved. */
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps);
/* The same with out rounded to bf16 values row by row as it is made (an input of bf16 products
 * only: BF16_IN_ROUNDED). */
void rmsnorm_forward_bf16(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps);
/* dx (N, D) += ..., dw (D) += ... from dout (N, D), x, w and the saved rstd. */
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int N, int D);

/* RoPE tables for explicit global positions: cos, sin (N, head_dim/2), angle = pos * theta^(-2i/d). */
void rope_tables(float *cos_t, float *sin_t, const int *positions, int N, int head_dim, double theta);
/* The same tables from given inverse frequencies (head_dim / 2 of them), for scaled RoPE. */
void rope_tables_freq(float *cos_t, float *sin_t, const int *positions, int N, int head_dim, const double *inv_freq);
/* In place on x (N, n_heads, head_dim), HF rotate-half convention:
 * x1 = x[:d/2], x2 = x[d/2:]; out = (x1 c - x2 s, x2 c + x1 s). */
void rope_forward(float *x, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim);
/* In place on the gradient: the transpose of the rotation (rotation by -angle). */
void rope_backward(float *dx, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim);
/* The same two with the result rounded to bf16 values row by row: q and k as attention takes them,
 * the projections' output gradients dq and dk in bf16. */
void rope_forward_bf16(float *x, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim);
void rope_backward_bf16(float *dx, const float *cos_t, const float *sin_t, int N, int n_heads, int head_dim);

/* h (N, F) = silu(gate) * up, element-wise over n elements (rows with a stride: their padding
 * too, which stays 0 where gate's and up's padding is 0) */
void swiglu_forward(float *h, const float *gate, const float *up, size_t n);
/* dgate = dh * up * silu'(gate); dup = dh * silu(gate): written, not accumulated (unlike the other
 * backward functions: the MLP's chunk buffers need no zeroing first). In place allowed: dgate ==
 * gate and dup == up (every element is read before it is written; the MLP does so, needing no
 * gradient buffers of its own); otherwise dgate, dup alias nothing else. */
void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n);
/* The same two with h, and dgate and dup, rounded to bf16 values block by block as they are made
 * (the down projection's input; the gate and up projections' output gradients). */
void swiglu_forward_bf16(float *h, const float *gate, const float *up, size_t n);
void swiglu_backward_bf16(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n);

/* Linear biases (HF nn.Linear's bias: q, k, v of a Qwen2, every attention projection of a Llama or
 * a Qwen3 with attention_bias). bias_add_rows: y[i][j] += b[j] over N rows of `cols` values, rows ld
 * apart. bias_grad_rows: db[j] += sum over the rows of dy[i][j], each column summed in row order
 * (the same sums for any thread count). */
void bias_add_rows(float *y, size_t ld, const float *b, int N, int cols);
void bias_grad_rows(float *db, const float *dy, size_t ld, int N, int cols);

/* out (N, D) = table[tokens[i]] */
void embedding_forward(float *out, const int *tokens, const float *table, int N, int D);
/* dtable[tokens[i]] += dout[i], but for tokens[i] == padding_idx (transformers' nn.Embedding
 * padding_idx: that row gets no gradient from the lookup; -1: every row does) */
void embedding_backward(float *dtable, const float *dout, const int *tokens, int N, int D, int padding_idx);

/* Language-model head and mean cross-entropy, fused and chunked: logits are made for `chunk`
 * tokens at a time (never N x V at once). For each token with targets[i] >= 0 adds
 * -log softmax(x_i W^T)[target] to the returned sum. When dx/dW are non-NULL also does the
 * backward with dloss_i = loss_scale (so the caller passes 1 / the global number of targets):
 * dx (N, D) += ..., dW (V, D) += .... If predictions is non-NULL it gets the argmax per token;
 * if row_losses (N) is non-NULL it gets each token's loss (0 where targets[i] < 0), the values the
 * sum adds. workspace: chunk * V floats, chunk <= 256. Returns the SUM of the per-token losses
 * (double). */
double lm_head_cross_entropy(const float *x, const float *W, const int *targets, int N, int D, int V,
                             float loss_scale, float *dx, float *dW, int *predictions, double *row_losses,
                             int chunk, float *workspace);

/* The same under bf16 mixed precision: the three products (logits, dx, dW) take bf16 operands and
 * accumulate in fp32, as PyTorch's autocast runs an LM head; logits, the softmax and the loss
 * stay fp32. x must hold bf16 values already (rmsnorm_forward_bf16; checked under
 * SEQPAR_CHECK_ROUNDED), W is the head's weight made by bf16_weight_set, and each chunk's logit
 * gradients are rounded to bf16 as they are made. scratch: the bf16 path's copies of a chunk's x
 * and logit gradients (chunk x (D + V) elements; the conversion path uses none; NULL: allocated
 * and freed per call). */
double lm_head_cross_entropy_bf16(const float *x, const Bf16Weight *W, const int *targets, int N, int D, int V,
                                  float loss_scale, float *dx, float *dW, int *predictions, double *row_losses,
                                  int chunk, float *workspace, Bf16Scratch *scratch);
/* Elements of the bf16 path's scratch for lm_head_cross_entropy_bf16 over chunks of `chunk` rows. */
size_t lm_head_bf16_scratch_elems(int chunk, int D, int V);

#endif
