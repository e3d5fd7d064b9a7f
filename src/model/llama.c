/* The Llama model: parameter table, initialisation, FLOP counts, and the layers' math: the fused
 * forward and backward over a rank's local tokens, as one path. What a layer keeps, recomputes,
 * streams, offloads or rebuilds is the memory policy's (layer_memory.h), called at its points. */
#include "model/llama.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "model/activations.h"

/* ---------------------------------------------------------------- parameters */

static void add_tensor(ParamTable *t, size_t cap, const char *name, int64_t rows, int64_t cols, int no_decay) {
    if ((size_t)t->n >= cap) die("internal: parameter table overflow");
    ParamTensor *p = &t->t[t->n++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    p->offset = t->total;
    p->no_decay = no_decay;
    t->total += p->numel;
}

int llama_layer_tensors(const LlamaConfig *c) {
    return 9 + 3 * (c->qkv_bias != 0) + (c->o_bias != 0) + 2 * (c->qk_norm != 0);
}

void llama_bind_layer(LlamaLayerWeights *w, float *base, size_t origin, const ParamTable *t, const LlamaConfig *c,
                      int l) {
    float **f[15] = {&w->input_norm, &w->q_proj, &w->q_bias, &w->k_proj, &w->k_bias, &w->v_proj, &w->v_bias,
                     &w->o_proj, &w->o_bias, &w->q_norm, &w->k_norm, &w->post_norm, &w->gate_proj, &w->up_proj,
                     &w->down_proj};
    const int has[15] = {1, 1, c->qkv_bias, 1, c->qkv_bias, 1, c->qkv_bias, 1, c->o_bias, c->qk_norm, c->qk_norm,
                         1, 1, 1, 1};
    int i = 1 + l * llama_layer_tensors(c); /* the layer's first tensor in the table */
    for (int k = 0; k < 15; k++) {
        *f[k] = has[k] && base ? base + (t->t[i].offset - origin) : NULL;
        if (has[k]) i++;
    }
}

static void bind_weights(LlamaWeights *w, float *base, const ParamTable *t, const LlamaConfig *c) {
    /* The table was built in a fixed order (llama_layer_tensors) */
    w->embed = base + t->t[0].offset;
    for (int l = 0; l < c->num_hidden_layers; l++) llama_bind_layer(&w->layers[l], base, 0, t, c, l);
    int i = 1 + c->num_hidden_layers * llama_layer_tensors(c);
    w->final_norm = base + t->t[i++].offset;
    w->lm_head = c->tie_word_embeddings ? w->embed : base + t->t[i++].offset;
}

void llama_build(LlamaModel *m, const LlamaConfig *cfg) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    const LlamaConfig *c = cfg;
    int64_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t qd = (int64_t)c->num_attention_heads * c->head_dim, kvd = (int64_t)c->num_key_value_heads * c->head_dim;
    /* size_t: no int overflow for any layer count */
    size_t cap = 3 + (size_t)llama_layer_tensors(c) * (size_t)c->num_hidden_layers;
    m->table.t = xcalloc(cap, sizeof(ParamTensor));
    char name[96];
    add_tensor(&m->table, cap, "model.embed_tokens.weight", V, D, 1);
    for (int l = 0; l < c->num_hidden_layers; l++) {
#define LAYER_TENSOR(suffix, rows, cols, nd) \
        do { snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix); add_tensor(&m->table, cap, name, rows, cols, nd); } while (0)
        LAYER_TENSOR("input_layernorm.weight", D, 0, 1);
        LAYER_TENSOR("self_attn.q_proj.weight", qd, D, 0);
        if (c->qkv_bias) LAYER_TENSOR("self_attn.q_proj.bias", qd, 0, 1);
        LAYER_TENSOR("self_attn.k_proj.weight", kvd, D, 0);
        if (c->qkv_bias) LAYER_TENSOR("self_attn.k_proj.bias", kvd, 0, 1);
        LAYER_TENSOR("self_attn.v_proj.weight", kvd, D, 0);
        if (c->qkv_bias) LAYER_TENSOR("self_attn.v_proj.bias", kvd, 0, 1);
        LAYER_TENSOR("self_attn.o_proj.weight", D, qd, 0);
        if (c->o_bias) LAYER_TENSOR("self_attn.o_proj.bias", D, 0, 1);
        if (c->qk_norm) LAYER_TENSOR("self_attn.q_norm.weight", c->head_dim, 0, 1);
        if (c->qk_norm) LAYER_TENSOR("self_attn.k_norm.weight", c->head_dim, 0, 1);
        LAYER_TENSOR("post_attention_layernorm.weight", D, 0, 1);
        LAYER_TENSOR("mlp.gate_proj.weight", F, D, 0);
        LAYER_TENSOR("mlp.up_proj.weight", F, D, 0);
        LAYER_TENSOR("mlp.down_proj.weight", D, F, 0);
#undef LAYER_TENSOR
    }
    add_tensor(&m->table, cap, "model.norm.weight", D, 0, 1);
    if (!c->tie_word_embeddings) add_tensor(&m->table, cap, "lm_head.weight", V, D, 0);
    m->params = xcalloc(m->table.total, sizeof(float));
    m->grads = xcalloc(m->table.total, sizeof(float));
    m->w.layers = xcalloc((size_t)c->num_hidden_layers, sizeof(LlamaLayerWeights));
    m->g.layers = xcalloc((size_t)c->num_hidden_layers, sizeof(LlamaLayerWeights));
    bind_weights(&m->w, m->params, &m->table, c);
    bind_weights(&m->g, m->grads, &m->table, c);
}

void llama_init_random(LlamaModel *m, uint64_t seed) { llama_init_random_part(m, seed, 0, m->table.total); }

/* The random initialisation: element j of a 2-D tensor is 0.02 rng_normal of the tensor's draws 2j
 * and 2j + 1 of the one stream (seeded by seed) that runs through the tensors in order; only the part
 * [lo, hi) is made, each thread making a contiguous share of it from its own copy of the stream
 * jumped to the share's first draw (rng_jump): no rank draws the stream before its part, no thread
 * waits for another's draws, and the values are the serial loop's bit for bit. */
void llama_init_random_part(LlamaModel *m, uint64_t seed, size_t lo, size_t hi) {
    Rng base;
    rng_seed(&base, seed);
    uint64_t drawn = 0; /* draws of the stream before this tensor */
    for (int i = 0; i < m->table.n; i++) {
        const ParamTensor *p = &m->table.t[i];
        float *w = m->params + p->offset;
        const size_t a = lo > p->offset ? lo - p->offset : 0, b = hi < p->offset ? 0 : hi - p->offset;
        const size_t k1 = b < p->numel ? b : p->numel;
        if (p->ndim == 1) { /* norm weights 1, biases 0 (transformers' _init_weights) */
            const size_t len = strlen(p->name);
            const float v = len > 5 && !strcmp(p->name + len - 5, ".bias") ? 0.0f : 1.0f;
            for (size_t j = a; j < k1; j++) w[j] = v;
            continue;
        }
        if (a < k1) {
            #pragma omp parallel if (k1 - a >= 4096)
            {
                const size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
                const size_t c0 = a + (k1 - a) * t / nt, c1 = a + (k1 - a) * (t + 1) / nt;
                if (c0 < c1) {
                    Rng r = base;
                    rng_jump(&r, drawn + 2 * (uint64_t)c0);
                    for (size_t j = c0; j < c1; j++) {
                        const uint64_t x = rng_u64(&r), y = rng_u64(&r);
                        w[j] = (float)(0.02 * rng_normal_from(x, y));
                    }
                }
            }
        }
        drawn += 2 * (uint64_t)p->numel;
    }
    if (m->cfg.padding_idx1) { /* as transformers' _init_weights: the padding row starts at zero */
        const size_t D = (size_t)m->cfg.hidden_size;
        const size_t r0 = (size_t)(m->w.embed - m->params) + (size_t)(m->cfg.padding_idx1 - 1) * D;
        for (size_t j = r0; j < r0 + D; j++)
            if (j >= lo && j < hi) m->params[j] = 0.0f;
    }
}

void llama_free(LlamaModel *m) {
    xfree(m->params);
    xfree(m->grads);
    xfree(m->table.t);
    xfree(m->w.layers);
    xfree(m->g.layers);
    memset(m, 0, sizeof *m);
}

double llama_layer_matmul_params(const LlamaConfig *c) {
    double D = c->hidden_size, F = c->intermediate_size;
    double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    return D * qd * 2 + D * kvd * 2 + 3 * D * F;
}

double llama_matmul_params(const LlamaConfig *c) {
    return llama_layer_matmul_params(c) * c->num_hidden_layers + (double)c->vocab_size * c->hidden_size;
}

double llama_window_length(double seq_len, int window) {
    if (window <= 0 || seq_len <= window) return seq_len;
    return (double)window * (2.0 * seq_len - window) / seq_len;
}

/* layers x attention length: the windowed layers at len_window, the others at len_full */
static double layer_lengths(const LlamaConfig *c, double len_full, double len_window) {
    const int windowed = llama_windowed_layers(c);
    return (c->num_hidden_layers - windowed) * len_full + windowed * len_window;
}

double llama_train_flops_lengths(const LlamaConfig *c, double len_full, double len_window) {
    return 6.0 * llama_matmul_params(c) +
           6.0 * layer_lengths(c, len_full, len_window) * c->num_attention_heads * c->head_dim;
}

double llama_train_flops_per_token(const LlamaConfig *c, double seq_len) {
    return llama_train_flops_lengths(c, seq_len, llama_window_length(seq_len, c->sliding_window));
}

LlamaConfig llama_reference_config(void) {
    return (LlamaConfig){.hidden_size = 256, .intermediate_size = 1024, .num_attention_heads = 4,
                         .num_key_value_heads = 2, .num_hidden_layers = 4, .vocab_size = 256, .head_dim = 64,
                         .max_position_embeddings = 1 << 20, .tie_word_embeddings = 0, .rms_norm_eps = 1e-5f,
                         .rope_theta = 10000.0};
}

/* ---------------------------------------------------------------- activations (layer_memory.h) */

LlamaActs *llama_acts_create(const LlamaModel *m, const SeqAttention *attn, int N, int checkpoint) {
    LlamaActsOptions o = {.checkpoint = checkpoint, .ffn_chunks = 0};
    return llama_acts_create_opts(m, attn, N, &o);
}

LlamaActs *llama_acts_create_opts(const LlamaModel *m, const SeqAttention *attn, int N, const LlamaActsOptions *opt) {
    return layer_memory_create(&m->cfg, attn, N, opt);
}

void llama_recompute_flops_parts(const LlamaConfig *c, double len_full, double len_window, int checkpoint,
                                 int store_gate_up, int x_mid_again, double *dense, double *attention) {
    double D = c->hidden_size, F = c->intermediate_size;
    double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    double proj = 2.0 * (D * qd * 2 + D * kvd * 2); /* q, k, v, o projections, forward */
    double gate_up = store_gate_up ? 0.0 : 2.0 * 2 * D * F;
    /* attention's forward, the causal half (and the windows), summed over the layers */
    double attn_fwd = 2.0 * layer_lengths(c, len_full, len_window) * c->num_attention_heads * c->head_dim;
    double per_layer = gate_up, attn = 0;
    if (checkpoint == LLAMA_CKPT_LAYER) per_layer += proj, attn = attn_fwd;
    if (checkpoint == LLAMA_CKPT_SELECTIVE) per_layer += proj;
    if (x_mid_again && checkpoint == LLAMA_CKPT_NONE) per_layer += 2.0 * D * qd; /* o_proj's forward again */
    if (c->qk_norm) per_layer += 2.0 * D * (qd + kvd); /* q and k made again for their norms' backward */
    *dense = per_layer * c->num_hidden_layers;
    *attention = attn;
}

double llama_recompute_flops_lengths(const LlamaConfig *c, double len_full, double len_window, const LlamaActs *a) {
    double dense, attn;
    llama_recompute_flops_parts(c, len_full, len_window, a->checkpoint, a->store_gate_up,
                                llama_rebuilds_x_mid(a->checkpoint, a->precision, a->stream), &dense, &attn);
    return dense + attn;
}

double llama_recompute_flops_per_token(const LlamaConfig *c, double seq_len, const LlamaActs *a) {
    return llama_recompute_flops_lengths(c, seq_len, llama_window_length(seq_len, c->sliding_window), a);
}

/* ---------------------------------------------------------------- the layers' operations */

/* The layers' matrix multiplies in the activations' precision (ops.h), on rows n_in and n_out
 * floats apart (the _ld pair: ld_in and ld_out apart, for the MLP's F-wide rows). `rounded`
 * (BF16_IN_ROUNDED, BF16_DOUT_ROUNDED) names the operands that hold bf16 values already under
 * bf16: made so by the *_rounded producers below, or o, rounded in place after the attention. */
static void mm_forward_ld(LlamaActs *a, float *out, int ld_out, const float *in, int ld_in, const float *W, int N,
                          int n_in, int n_out, int accumulate, unsigned rounded) {
    if (a->precision == PRECISION_BF16)
        linear_forward_bf16_ld(out, ld_out, in, ld_in, W, N, n_in, n_out, accumulate, rounded, &a->mm_scratch);
    else linear_forward_ld(out, ld_out, in, ld_in, W, N, n_in, n_out, accumulate);
}

/* din_acc 0: din is overwritten (the first product into it: no zeroing pass), 1: accumulated */
static void mm_backward_ld(LlamaActs *a, float *din, int din_acc, float *dW, const float *dout, int ld_out,
                           const float *in, int ld_in, const float *W, int N, int n_in, int n_out, unsigned rounded) {
    if (a->precision == PRECISION_BF16)
        linear_backward_bf16_acc_ld(din, din_acc, dW, dout, ld_out, in, ld_in, W, N, n_in, n_out, rounded,
                                    &a->mm_scratch);
    else linear_backward_acc_ld(din, din_acc, dW, dout, ld_out, in, ld_in, W, N, n_in, n_out);
}

static void mm_forward(LlamaActs *a, float *out, const float *in, const float *W, int N, int n_in, int n_out,
                       int accumulate, unsigned rounded) {
    mm_forward_ld(a, out, n_out, in, n_in, W, N, n_in, n_out, accumulate, rounded);
}

static void mm_backward(LlamaActs *a, float *din, int din_acc, float *dW, const float *dout, const float *in,
                        const float *W, int N, int n_in, int n_out, unsigned rounded) {
    mm_backward_ld(a, din, din_acc, dW, dout, n_out, in, n_in, W, N, n_in, n_out, rounded);
}

/* The producers of what only the matrix multiplies read (the projections' normed inputs, the
 * MLP's h, the output gradients of the projections): under bf16 their outputs are rounded to
 * bf16 values as they are made, in cache, so that the products take them as they are. */
static void norm_rounded(const LlamaActs *a, float *out, float *rstd, const float *x, const float *w, int n, int D,
                         float eps) {
    if (a->precision == PRECISION_BF16) rmsnorm_forward_bf16(out, rstd, x, w, n, D, eps);
    else rmsnorm_forward(out, rstd, x, w, n, D, eps);
}

static void swiglu_forward_rounded(const LlamaActs *a, float *h, const float *gate, const float *up, size_t n) {
    if (a->precision == PRECISION_BF16) swiglu_forward_bf16(h, gate, up, n);
    else swiglu_forward(h, gate, up, n);
}

static void swiglu_backward_rounded(const LlamaActs *a, float *dgate, float *dup, const float *dh, const float *gate,
                                    const float *up, size_t n) {
    if (a->precision == PRECISION_BF16) swiglu_backward_bf16(dgate, dup, dh, gate, up, n);
    else swiglu_backward(dgate, dup, dh, gate, up, n);
}

/* RoPE's backward on n rows of dq and dk from table row r0; under bf16 dq, dk (and dv, which
 * RoPE does not touch) come out as bf16 values. */
static void rope_backward_rounded(const LlamaModel *m, const LlamaActs *a, int r0, int n) {
    const LlamaConfig *c = &m->cfg;
    const int H = c->num_attention_heads, Hkv = c->num_key_value_heads, hd = c->head_dim;
    const size_t off = (size_t)r0 * (size_t)(hd / 2);
    if (a->precision == PRECISION_BF16) {
        rope_backward_bf16(a->dq, a->rope_cos + off, a->rope_sin + off, n, H, hd);
        rope_backward_bf16(a->dk, a->rope_cos + off, a->rope_sin + off, n, Hkv, hd);
        bf16_round(a->dv, (size_t)n * Hkv * hd);
    } else {
        rope_backward(a->dq, a->rope_cos + off, a->rope_sin + off, n, H, hd);
        rope_backward(a->dk, a->rope_cos + off, a->rope_sin + off, n, Hkv, hd);
    }
}

/* Rows [r0, r0 + n) of layer l's input x_in (n, D): norm (into a->xn, rstd) -> q, k, v
 * projections -> RoPE (the tables' rows r0..) into q, k, v. */
static void qkv_rows(const LlamaModel *m, LlamaActs *a, int l, const float *x_in, float *rstd, int r0, int n,
                     float *q, float *k, float *v) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    int D = c->hidden_size, H = c->num_attention_heads, Hkv = c->num_key_value_heads, hd = c->head_dim;
    const size_t rope_off = (size_t)r0 * (size_t)(hd / 2);
    norm_rounded(a, a->xn, rstd, x_in, w->input_norm, n, D, c->rms_norm_eps);
    mm_forward(a, q, a->xn, w->q_proj, n, D, H * hd, 0, BF16_IN_ROUNDED);
    mm_forward(a, k, a->xn, w->k_proj, n, D, Hkv * hd, 0, BF16_IN_ROUNDED);
    mm_forward(a, v, a->xn, w->v_proj, n, D, Hkv * hd, 0, BF16_IN_ROUNDED);
    if (w->q_bias) { /* before RoPE (and bf16's rounding), as nn.Linear adds it */
        bias_add_rows(q, (size_t)H * hd, w->q_bias, n, H * hd);
        bias_add_rows(k, (size_t)Hkv * hd, w->k_bias, n, Hkv * hd);
        bias_add_rows(v, (size_t)Hkv * hd, w->v_bias, n, Hkv * hd);
    }
    if (w->q_norm) { /* each head of q and k normed in place, in fp32, before RoPE (Qwen3) */
        rmsnorm_forward(q, a->qk_rstd, q, w->q_norm, n * H, hd, c->rms_norm_eps);
        rmsnorm_forward(k, a->qk_rstd, k, w->k_norm, n * Hkv, hd, c->rms_norm_eps);
    }
    if (a->precision == PRECISION_BF16) { /* attention's inputs are bf16: q, k rounded as RoPE writes them */
        rope_forward_bf16(q, a->rope_cos + rope_off, a->rope_sin + rope_off, n, H, hd);
        rope_forward_bf16(k, a->rope_cos + rope_off, a->rope_sin + rope_off, n, Hkv, hd);
        bf16_round(v, (size_t)n * Hkv * hd);
    } else {
        rope_forward(q, a->rope_cos + rope_off, a->rope_sin + rope_off, n, H, hd);
        rope_forward(k, a->rope_cos + rope_off, a->rope_sin + rope_off, n, Hkv, hd);
    }
}

/* The rows of the ffn_rows chunk at r0 (a multiple of ffn_rows) of N rows: how many. */
static int ffn_chunk_rows(const LlamaActs *a, int N, int r0) { return N - r0 < a->ffn_rows ? N - r0 : a->ffn_rows; }

/* The rows of the block of the token-wise parts at t (a multiple of xn_rows) of n rows: how many. */
static int xn_block_rows(const LlamaActs *a, int n, int t) { return n - t < a->xn_rows ? n - t : a->xn_rows; }

/* x (n, D) += o_proj(o) over n rows of o (n, H d), its bias included. */
static void o_proj_onto(const LlamaModel *m, LlamaActs *a, int l, float *x, const float *o, int n) {
    const int D = m->cfg.hidden_size, qd = m->cfg.num_attention_heads * m->cfg.head_dim;
    const LlamaLayerWeights *w = &m->w.layers[l];
    mm_forward(a, x, o, w->o_proj, n, qd, D, 1, BF16_IN_ROUNDED);
    if (w->o_bias) bias_add_rows(x, (size_t)D, w->o_bias, n, D);
}

/* Rows [r0, r0 + n) of gate and up from those rows normed (xn, n rows): into the stored ones, or
 * into the chunk scratch. */
static void mlp_gate_up(const LlamaModel *m, LlamaActs *a, int l, const float *xn, int r0, int n, float **gate,
                        float **up) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    LayerActs *L = &a->layers[l];
    const int D = c->hidden_size, F = c->intermediate_size;
    int store = a->store_gate_up;
    *gate = store ? L->gate + (size_t)r0 * a->ldF : a->gate_c;
    *up = store ? L->up + (size_t)r0 * a->ldF : a->up_c;
    mm_forward_ld(a, *gate, a->ldF, xn, D, w->gate_proj, n, D, F, 0, BF16_IN_ROUNDED);
    mm_forward_ld(a, *up, a->ldF, xn, D, w->up_proj, n, D, F, 0, BF16_IN_ROUNDED);
}

/* The MLP half over N rows: x_out = x_mid + down(swiglu(gate(xn2), up(xn2))), over chunks of
 * ffn_rows tokens, each normed on its own into a->xn (x_out is x_mid itself, each chunk's rows
 * normed before they are written, or does not overlap it). */
static void mlp_forward_rows(const LlamaModel *m, LlamaActs *a, int l, const float *x_mid, float *rstd2, float *x_out,
                             int N) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    int D = c->hidden_size, F = c->intermediate_size;
    layer_memory_ffn_pads_zero(a, F);
    if (x_out != x_mid) memcpy(x_out, x_mid, sizeof(float) * (size_t)N * D);
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows) {
        const int n = ffn_chunk_rows(a, N, r0);
        float *gate, *up;
        norm_rounded(a, a->xn, rstd2 + r0, x_mid + (size_t)r0 * D, w->post_norm, n, D, c->rms_norm_eps);
        mlp_gate_up(m, a, l, a->xn, r0, n, &gate, &up);
        swiglu_forward_rounded(a, a->h, gate, up, (size_t)n * a->ldF);
        mm_forward_ld(a, x_out + (size_t)r0 * D, D, a->h, a->ldF, w->down_proj, n, F, D, 1, BF16_IN_ROUNDED);
    }
}

/* Over N rows: on entry dx_rows = dL/dx_out; on exit dL/dx_mid. gate and up are the stored ones
 * (none, one chunk) or recomputed chunk by chunk from the normed x_mid. */
static void mlp_backward_rows(LlamaModel *m, LlamaActs *a, int l, const float *x_mid, float *rstd2, float *dx_rows,
                              int N) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    LlamaLayerWeights *g = &m->g.layers[l];
    LayerActs *L = &a->layers[l];
    int D = c->hidden_size, F = c->intermediate_size;
    layer_memory_ffn_pads_zero(a, F);
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows) {
        const int n = ffn_chunk_rows(a, N, r0);
        const size_t nF = (size_t)n * a->ldF; /* the chunk's F-wide rows, padding included */
        float *dx = dx_rows + (size_t)r0 * D;
        const float *xn = a->xn, *xm = x_mid + (size_t)r0 * D;
        float *gate, *up;
        norm_rounded(a, a->xn, rstd2 + r0, xm, w->post_norm, n, D, c->rms_norm_eps);
        if (a->store_gate_up) {
            gate = L->gate + (size_t)r0 * a->ldF;
            up = L->up + (size_t)r0 * a->ldF;
        } else {
            mlp_gate_up(m, a, l, xn, r0, n, &gate, &up);
        }
        swiglu_forward_rounded(a, a->h, gate, up, nF);
        mm_backward_ld(a, NULL, 0, g->down_proj, dx, D, a->h, a->ldF, w->down_proj, n, F, D, BF16_IN_ROUNDED);
        mm_backward_ld(a, a->h, 0, NULL, dx, D, NULL, a->ldF, w->down_proj, n, F, D, 0); /* h becomes dh */
        /* dgate, dup into gate, up themselves (each element read before it is written; the
         * stored ones of --ffn-chunks 1 are not read again before the next forward) */
        swiglu_backward_rounded(a, gate, up, a->h, gate, up, nF);
        mm_backward_ld(a, a->dxn, 0, g->gate_proj, gate, a->ldF, xn, D, w->gate_proj, n, D, F,
                       BF16_IN_ROUNDED | BF16_DOUT_ROUNDED);
        mm_backward_ld(a, a->dxn, 1, g->up_proj, up, a->ldF, xn, D, w->up_proj, n, D, F,
                       BF16_IN_ROUNDED | BF16_DOUT_ROUNDED);
        rmsnorm_backward(dx, g->post_norm, a->dxn, xm, w->post_norm, rstd2 + r0, n, D); /* after the rows' last read */
    }
}

/* The backward of the q, k, v projections over n rows: on entry a->xn holds the rows' normed
 * input and dq, dk, dv the gradients of q, k, v as RoPE takes them (RoPE's backward applied);
 * gives the projections' weight (and bias) gradients and a->dxn = their input gradient. With
 * per-head q/k norms (Qwen3) each projection's output is made again from a->xn by the forward's
 * own product (the same call, so the same values) into a->qk_x, its norm's rstd again into
 * a->qk_rstd, and the norm's backward turns dq (dk) into the projection's output gradient in
 * a->qk_dx. */
static void qkv_backward_rows(LlamaModel *m, LlamaActs *a, int l, const float *dq, const float *dk, const float *dv,
                              int n) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    LlamaLayerWeights *g = &m->g.layers[l];
    const int D = c->hidden_size, hd = c->head_dim, H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const unsigned both = BF16_IN_ROUNDED | BF16_DOUT_ROUNDED;
    const struct { const float *d, *W, *bias, *norm; float *gW, *gbias, *gnorm; int heads; } p[3] = {
        {dq, w->q_proj, w->q_bias, w->q_norm, g->q_proj, g->q_bias, g->q_norm, H},
        {dk, w->k_proj, w->k_bias, w->k_norm, g->k_proj, g->k_bias, g->k_norm, Hkv},
        {dv, w->v_proj, w->v_bias, NULL, g->v_proj, g->v_bias, NULL, Hkv}};
    for (int i = 0; i < 3; i++) {
        const int cols = p[i].heads * hd;
        const float *d = p[i].d;
        if (p[i].norm) {
            float *x = a->qk_x, *dx = a->qk_dx;
            mm_forward(a, x, a->xn, p[i].W, n, D, cols, 0, BF16_IN_ROUNDED);
            if (p[i].bias) bias_add_rows(x, (size_t)cols, p[i].bias, n, cols);
            rmsnorm_forward(dx, a->qk_rstd, x, p[i].norm, n * p[i].heads, hd, c->rms_norm_eps); /* its rstd */
            memset(dx, 0, sizeof(float) * (size_t)n * (size_t)cols);
            rmsnorm_backward(dx, p[i].gnorm, d, x, p[i].norm, a->qk_rstd, n * p[i].heads, hd);
            if (a->precision == PRECISION_BF16) bf16_round(dx, (size_t)n * (size_t)cols); /* a bf16 operand */
            d = dx;
        }
        if (p[i].gbias) bias_grad_rows(p[i].gbias, d, (size_t)cols, n, cols);
        mm_backward(a, a->dxn, i > 0, p[i].gW, d, a->xn, p[i].W, n, D, cols, both);
    }
}

/* ---------------------------------------------------------------- the decoder layer */

/* A layer runs over its attention chunks: on whole layers one chunk of all N local rows; under
 * chunk streaming (layer_memory.h) u chunks of c rows through the strategy's chunk calls, with
 * every (rows, .) tensor of LayerActs one chunk's scratch. Inside a chunk the token-wise parts
 * (norms, projections) run over blocks of a->xn_rows rows, the MLP over FFN chunks of ffn_rows.
 * Shapes: N local rows, D hidden, H (Hkv) heads of d, F the MLP's width; a chunk's rows n. */

/* The attention half of chunk i of layer l up to attention's output o (n, H d): per block,
 * x_in (n, D) -> rmsnorm -> xn -> q (n, H d), k, v (n, Hkv d) -> [bias, q/k norm] -> RoPE; then
 * attention's forward (or, with `restore`, selective's restore from the kept o and lse: no
 * attention forward). bf16: o is rounded in place (o_proj takes it rounded anyway, and attention's
 * backward reads the same o for its delta whether the layer kept it or made it again); a chunked
 * strategy's chunk calls hand o back rounded already. */
static void attention_rows(const LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l, int i, int restore) {
    LayerActs *L = &a->layers[l];
    const int n = a->sc, r0 = i * a->sc;
    const size_t D = (size_t)a->D, qd = (size_t)a->qd, kvd = (size_t)a->kvd;
    const float *x_in = layer_memory_input(a, l) + (size_t)r0 * D;
    for (int t = 0; t < n; t += a->xn_rows)
        qkv_rows(m, a, l, x_in + (size_t)t * D, L->rstd1 + t, r0 + t, xn_block_rows(a, n, t),
                 L->q + (size_t)t * qd, L->k + (size_t)t * kvd, L->v + (size_t)t * kvd);
    if (a->stream) {
        attn->forward_chunk(attn, i, L->q, L->k, L->v, L->o, L->saved);
    } else if (restore) {
        layer_memory_restore_kept(a, attn, l);
        attn->restore(attn, L->q, L->k, L->v, L->o, L->saved);
    } else {
        attn->forward(attn, L->q, L->k, L->v, L->o, L->saved);
        if (a->precision == PRECISION_BF16) bf16_round(L->o, (size_t)n * qd);
    }
}

/* x_mid (n, D) = x_in + o_proj(o) over the n rows of chunk i of layer l, per block. */
static void x_mid_rows(const LlamaModel *m, LlamaActs *a, int l, int i) {
    LayerActs *L = &a->layers[l];
    const int n = a->sc;
    const size_t D = (size_t)a->D, qd = (size_t)a->qd;
    const float *x_in = layer_memory_input(a, l) + (size_t)i * a->sc * D;
    if (L->x_mid != x_in) memcpy(L->x_mid, x_in, sizeof(float) * (size_t)n * D); /* else in place (forward only) */
    for (int t = 0; t < n; t += a->xn_rows)
        o_proj_onto(m, a, l, L->x_mid + (size_t)t * D, L->o + (size_t)t * qd, xn_block_rows(a, n, t));
}

/* Layer l: x_out = x_mid + mlp(rmsnorm(x_mid)), x_mid = x_in + o_proj(attention(rope(q, k), v)),
 * chunk by chunk; the output rows may be the input rows themselves (residual_single: each chunk's
 * input rows are read before its output rows are written). */
static void layer_forward(const LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    LayerActs *L = &a->layers[l];
    const size_t D = (size_t)a->D;
    attn->window = llama_layer_window(&m->cfg, l);
    for (int i = 0; i < a->su; i++) {
        attention_rows(m, a, attn, l, i, 0);
        x_mid_rows(m, a, l, i);
        if (i == a->su - 1) layer_memory_attention_done(a, attn, l);
        mlp_forward_rows(m, a, l, L->x_mid, L->rstd2, layer_memory_input(a, l + 1) + (size_t)i * a->sc * D, a->sc);
    }
}

/* On entry a->dx = dL/dx_out of layer l (N, D); on exit dL/dx_in; weight gradients accumulate.
 * Under layer and selective checkpointing the attention half runs again first (selective without
 * attention's forward). Then two passes over the chunks, as a streaming strategy's backward needs
 * every chunk's output gradient before its key/value-outer loop:
 * (a) per chunk: o (the kept one, or again from the strategy), x_mid again unless kept, the MLP's
 *     backward (dx rows become dL/dx_mid), dout (n, H d) = dx_mid o_proj, handed to the strategy;
 * (b) per chunk: attention's backward -> dq, dk, dv (n, .) -> RoPE's backward -> the projections'
 *     and the input norm's backward into dx rows. */
static void layer_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    LlamaLayerWeights *g = &m->g.layers[l];
    LayerActs *L = &a->layers[l];
    const int n = a->sc, D = a->D;
    const size_t qd = (size_t)a->qd, kvd = (size_t)a->kvd;

    const int again = layer_memory_attention_in_backward(a), x_mid_kept = layer_memory_keeps_x_mid(a);
    layer_memory_widen(a, l, LAYER_MEMORY_BACKWARD_BEGIN);
    attn->window = llama_layer_window(c, l);
    if (again != LAYER_MEMORY_ATTENTION_KEPT)
        for (int i = 0; i < a->su; i++) attention_rows(m, a, attn, l, i, again == LAYER_MEMORY_ATTENTION_RESTORE);

    for (int i = 0; i < a->su; i++) { /* (a) */
        float *dx = a->dx + (size_t)i * n * D;
        if (a->stream) attn->output_chunk(attn, i, L->saved, L->o);
        else layer_memory_o_for_x_mid(a, l);
        if (!x_mid_kept) x_mid_rows(m, a, l, i); /* bit for bit as the forward made it */
        mlp_backward_rows(m, a, l, L->x_mid, L->rstd2, dx, n);
        layer_memory_widen(a, l, LAYER_MEMORY_AFTER_MLP_BACKWARD);
        for (int t = 0; t < n; t += a->xn_rows) /* every row of dout, once */
            mm_backward(a, a->dout + (size_t)t * qd, 0, g->o_proj, dx + (size_t)t * D, L->o + (size_t)t * qd,
                        w->o_proj, xn_block_rows(a, n, t), (int)qd, D, BF16_IN_ROUNDED);
        if (g->o_bias) bias_grad_rows(g->o_bias, dx, (size_t)D, n, D);
        if (a->precision == PRECISION_BF16) bf16_round(a->dout, (size_t)n * qd); /* attention's dout is bf16 */
        if (a->stream) attn->dout_chunk(attn, i, L->saved, a->dout);
    }
    for (int i = 0; i < a->su; i++) { /* (b) */
        const int r0 = i * n;
        const float *x_in = layer_memory_input(a, l) + (size_t)r0 * D;
        float *dx = a->dx + (size_t)r0 * D;
        if (a->stream)
            attn->backward_chunk(attn, i, L->saved, a->dq, a->dk, a->dv);
        else if (attn->keeps_inputs) /* its own q, k, v are in `saved`; o is read for delta */
            attn->backward(attn, NULL, NULL, NULL, L->o, L->saved, a->dout, a->dq, a->dk, a->dv);
        else if (a->qkv16_read) /* the layer's bf16 copies, as they are */
            attn->backward_bf16(attn, L->q16, L->k16, L->v16, L->o, L->saved, a->dout, a->dq, a->dk, a->dv);
        else
            attn->backward(attn, L->q, L->k, L->v, L->o, L->saved, a->dout, a->dq, a->dk, a->dv);
        rope_backward_rounded(m, a, r0, n);
        for (int t = 0; t < n; t += a->xn_rows) {
            const int nt = xn_block_rows(a, n, t);
            const float *xr = x_in + (size_t)t * D;
            norm_rounded(a, a->xn, L->rstd1 + t, xr, w->input_norm, nt, D, c->rms_norm_eps);
            qkv_backward_rows(m, a, l, a->dq + (size_t)t * qd, a->dk + (size_t)t * kvd, a->dv + (size_t)t * kvd, nt);
            rmsnorm_backward(dx + (size_t)t * D, g->input_norm, a->dxn, xr, w->input_norm, L->rstd1 + t, nt, D);
        }
    }
}

/* Under bf16 the head's products take a bf16 copy of its weight, made once per forward (after
 * ZeRO-3 has gathered it: the head hook runs first). */
static void head_prepare(const LlamaModel *m, LlamaActs *a) {
    if (a->precision == PRECISION_BF16)
        bf16_weight_set(&a->head16, m->w.lm_head, (size_t)m->cfg.vocab_size * m->cfg.hidden_size);
}

/* The loss (and with dxn its backward) of n normed rows xn: fp32, or bf16 products (ops.h). */
static double head_rows(LlamaModel *m, LlamaActs *a, const int *targets, int n, float loss_scale, int backward,
                        int *predictions, double *token_loss) {
    const int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (a->precision == PRECISION_BF16)
        return lm_head_cross_entropy_bf16(a->xn, &a->head16, targets, n, D, V, loss_scale, backward ? a->dxn : NULL,
                                          backward ? m->g.lm_head : NULL, predictions, token_loss, a->ce_chunk,
                                          a->ce_workspace, &a->mm_scratch);
    return lm_head_cross_entropy(a->xn, m->w.lm_head, targets, n, D, V, loss_scale, backward ? a->dxn : NULL,
                                 backward ? m->g.lm_head : NULL, predictions, token_loss, a->ce_chunk,
                                 a->ce_workspace);
}

/* The final norm and the loss over blocks of xn_rows rows (the normed rows never exist whole):
 * the sum of the local losses; with `backward`, a->dx = dL/d(last layer's output). */
static double head_forward_backward(LlamaModel *m, LlamaActs *a, const int *targets, float loss_scale, int backward,
                                    int *predictions, double *token_loss) {
    const LlamaConfig *c = &m->cfg;
    const int N = a->N, D = c->hidden_size, nL = c->num_hidden_layers;
    double loss = 0;
    if (backward) memset(a->dx, 0, sizeof(float) * (size_t)N * D);
    head_prepare(m, a);
    for (int r0 = 0; r0 < N; r0 += a->xn_rows) {
        const int n = xn_block_rows(a, N, r0);
        const float *x = layer_memory_input(a, nL) + (size_t)r0 * D;
        float *rstd = layer_memory_head_rstd(a, r0);
        norm_rounded(a, a->xn, rstd, x, m->w.final_norm, n, D, c->rms_norm_eps);
        if (backward) memset(a->dxn, 0, sizeof(float) * (size_t)n * D);
        loss += head_rows(m, a, targets + r0, n, loss_scale, backward, predictions ? predictions + r0 : NULL,
                          token_loss ? token_loss + r0 : NULL);
        if (backward) rmsnorm_backward(a->dx + (size_t)r0 * D, m->g.final_norm, a->dxn, x, m->w.final_norm, rstd, n, D);
    }
    return loss;
}

/* ---------------------------------------------------------------- hooks (see llama.h) */

static void hook(LlamaModel *m, LlamaHookPoint p, int layer, int backward) {
    if (m->hooks && m->hooks->fn) m->hooks->fn(m->hooks->ctx, m, p, layer, backward);
}

static double forward_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *targets,
                               const int *positions, const int *docs, int N, float loss_scale, int backward,
                               int *predictions, double *token_loss);

double llama_forward_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                              const int *inputs, const int *targets, const int *positions, int N,
                              float loss_scale, int backward, int *predictions) {
    return llama_forward_backward_docs(m, a, attn, inputs, targets, positions, NULL, N, loss_scale, backward,
                                       predictions);
}

double llama_forward_backward_docs(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                                   const int *inputs, const int *targets, const int *positions, const int *docs,
                                   int N, float loss_scale, int backward, int *predictions) {
    return forward_backward(m, a, attn, inputs, targets, positions, docs, N, loss_scale, backward, predictions, NULL);
}

double llama_forward_scores(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *targets,
                            const int *positions, const int *docs, int N, double *token_loss, int *predictions) {
    return forward_backward(m, a, attn, inputs, targets, positions, docs, N, 1.0f, 0, predictions, token_loss);
}

/* The forward through every decoder layer: on return layer_memory_input(a, nL) holds the last
 * layer's output rows. targets may be NULL (none). */
static void forward_layers(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *targets,
                           const int *positions, const int *docs, int N, int backward) {
    const LlamaConfig *c = &m->cfg;
    if (N != a->N) die("internal: activations were made for %d tokens, called with %d", a->N, N);
    if (backward && a->forward_only) die("internal: a backward pass on activations made forward only");
    int D = c->hidden_size, V = c->vocab_size, nL = c->num_hidden_layers;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && targets[i] >= V))
            die("token %d at position %d is outside the vocabulary (vocab_size %d): use a model whose "
                "vocab_size covers the data", inputs[i] < 0 || inputs[i] >= V ? inputs[i] : targets[i], i, V);

    int *in_doc = NULL; /* (N) RoPE positions inside each document */
    if (docs) {
        in_doc = xmalloc(sizeof(int) * (size_t)(N > 0 ? N : 1));
        for (int i = 0; i < N; i++) {
            if (docs[i] < 0 || docs[i] > positions[i])
                die("internal: token at position %d has document start %d (must be in [0, %d])", positions[i], docs[i],
                    positions[i]);
            in_doc[i] = positions[i] - docs[i];
        }
    }
    const int *rope_pos = docs ? in_doc : positions;
    if (c->rope_type == LLAMA_ROPE_DEFAULT) {
        rope_tables(a->rope_cos, a->rope_sin, rope_pos, N, c->head_dim, c->rope_theta);
    } else {
        double *inv_freq = xmalloc(sizeof *inv_freq * (size_t)(c->head_dim / 2));
        for (int j = 0; j < c->head_dim / 2; j++) inv_freq[j] = llama_rope_inv_freq(c, j);
        rope_tables_freq(a->rope_cos, a->rope_sin, rope_pos, N, c->head_dim, inv_freq);
        xfree(inv_freq);
    }
    xfree(in_doc);
    attn->set_positions(attn, positions, docs);
    hook(m, LLAMA_HOOK_BEGIN, -1, backward);
    embedding_forward(layer_memory_input(a, 0), inputs, m->w.embed, N, D);
    hook(m, LLAMA_HOOK_AFTER_EMBEDDING, -1, backward);
    for (int l = 0; l < nL; l++) {
        hook(m, LLAMA_HOOK_BEFORE_FORWARD, l, backward);
        layer_memory_forward_begin(a, l, backward);
        layer_forward(m, a, attn, l);
        hook(m, LLAMA_HOOK_AFTER_FORWARD, l, backward);
    }
}

void llama_forward_logits(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *positions,
                          int N, const int *rows, int n_rows, float *logits) {
    const LlamaConfig *c = &m->cfg;
    const int D = c->hidden_size, V = c->vocab_size;
    forward_layers(m, a, attn, inputs, NULL, positions, NULL, N, 0);
    layer_memory_head_begin(a, 0);
    hook(m, LLAMA_HOOK_BEFORE_HEAD, -1, 0);
    const float *x = layer_memory_input(a, c->num_hidden_layers);
    float *xn = xmalloc(sizeof(float) * (size_t)D), rstd;
    for (int r = 0; r < n_rows; r++) { /* under bf16 the head's products as train's (bf16 operands) */
        if (rows[r] < 0 || rows[r] >= N) die("internal: logits of row %d of %d", rows[r], N);
        norm_rounded(a, xn, &rstd, x + (size_t)rows[r] * D, m->w.final_norm, 1, D, c->rms_norm_eps);
        mm_forward(a, logits + (size_t)r * V, xn, m->w.lm_head, 1, D, V, 0, BF16_IN_ROUNDED);
    }
    xfree(xn);
    hook(m, LLAMA_HOOK_AFTER_HEAD, -1, 0);
    hook(m, LLAMA_HOOK_END, -1, 0);
}

/* The forward (and with `backward` the backward) of llama_forward_backward_docs; token_loss (N, may
 * be NULL) receives each token's loss. */
static double forward_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *targets,
                               const int *positions, const int *docs, int N, float loss_scale, int backward,
                               int *predictions, double *token_loss) {
    const LlamaConfig *c = &m->cfg;
    const int D = c->hidden_size, nL = c->num_hidden_layers;
    forward_layers(m, a, attn, inputs, targets, positions, docs, N, backward);
    layer_memory_head_begin(a, backward);
    hook(m, LLAMA_HOOK_BEFORE_HEAD, -1, backward);
    double loss = head_forward_backward(m, a, targets, loss_scale, backward, predictions, token_loss);
    hook(m, LLAMA_HOOK_AFTER_HEAD, -1, backward);
    if (!backward) {
        hook(m, LLAMA_HOOK_END, -1, 0);
        return loss;
    }
    layer_memory_backward_begin(a);
    for (int l = nL - 1; l >= 0; l--) {
        hook(m, LLAMA_HOOK_BEFORE_BACKWARD, l, 1);
        layer_memory_layer_backward_begin(a, l);
        layer_backward(m, a, attn, l);
        hook(m, LLAMA_HOOK_AFTER_BACKWARD, l, 1);
    }
    hook(m, LLAMA_HOOK_BEFORE_EMBEDDING_BACKWARD, -1, 1);
    embedding_backward(m->g.embed, a->dx, inputs, N, D, c->padding_idx1 - 1);
    hook(m, LLAMA_HOOK_END, -1, 1);
    return loss;
}
