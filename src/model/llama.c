/* The Llama model: parameter table, initialisation, activations, and the fused forward and
 * backward pass over a rank's local tokens. See llama.h. */
#include "model/llama.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "memory/chunk_tier.h"

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

/* ---------------------------------------------------------------- activations */

typedef struct {
    float *rstd1;     /* (N) */
    float *q, *k, *v; /* (N, H*d), (N, Hkv*d), (N, Hkv*d), after RoPE; shared scratch (not kept)
                         when the strategy keeps its own copies (keeps_inputs) */
    float *o;         /* (N, H*d) attention output (o_proj's weight gradient reads it) */
    float *saved;     /* strategy's saved state (lse; head-parallel q, k, v, lse when distributed;
                         a chunked strategy's o_h chunks too) */
    float *kept;      /* selective, when the strategy's saved state has a recomputable part: this
                         layer's copy of the kept suffix (the lse); NULL otherwise */
    float *x_mid;     /* (N, D) residual after attention; or x_mid_shared */
    float *rstd2;     /* (N) */
    float *gate, *up; /* (N, F), only under none with one FFN chunk; NULL otherwise */
    /* bf16: this layer's own q, k, v (none, when not shared) and o (none, selective) are kept
     * here; q, k, v, o above then point at the shared fp32 set a->wq.. (see layer_convert) */
    bf16_t *q16, *k16, *v16, *o16;
    /* bf16, none, a strategy with a bf16 prefix (SeqAttention.bf16_floats: its copies of q, k, v):
     * the prefix as bf16 and the rest (lse_h) as fp32; saved above then points at the shared
     * fp32 buffer a->wsaved */
    bf16_t *saved16;
    float *saved_rest;
} LayerActs;

struct LlamaActs {
    int N, checkpoint, n_layers;
    int precision;        /* PRECISION_FP32 or PRECISION_BF16 */
    float *wq, *wk, *wv, *wo; /* bf16: the shared fp32 set the layers' bf16 copies widen into */
    float *wsaved;            /* bf16: the shared fp32 `saved` the layers' saved16 + saved_rest widen into */
    size_t saved_floats, saved_bf16; /* the strategy's saved floats per layer and their bf16 prefix */
    Bf16Scratch mm_scratch;   /* bf16: operand copies of the matrix multiplies (ops.h) */
    int ffn_chunks, ffn_rows; /* chunks of the MLP and rows per chunk (the last may be shorter); the
                                 whole-layer path runs every token-wise part (norms, projections,
                                 the loss head) over chunks of ffn_rows rows too */
    int xn_rows;          /* rows of xn and dxn: ffn_rows (whole layers) or c (streaming) */
    int store_gate_up;    /* none with one chunk: gate, up kept per layer (else recomputed per chunk) */
    int shared_qkv;       /* q, k, v are one scratch set for all layers: dq, dk, dv */
    float *x_mid_shared;  /* bf16 none on whole layers (llama_rebuilds_x_mid): the one (N, D) x_mid
                             of every layer, made again before each MLP backward; NULL otherwise */
    int qkv16_read;       /* bf16 none: the strategy's backward reads the layers' bf16 q, k, v as they
                             are (backward_bf16): they are never widened, and the fp32 set they are
                             made in (wq, wk, wv) lives only in the forward */
    float *q, *k, *v;     /* that scratch set (aliases, NULL unless shared_qkv) */
    float *residual;      /* (L+1, N, D): input of each layer, then the last layer's output */
    LayerActs *layers;    /* per layer (none); layer: all share `shared`; selective: all share
                             `shared` but o and kept (or saved) */
    LayerActs shared;
    float *rope_cos, *rope_sin; /* (N, d/2) */
    float *rstd_final;    /* (N) */
    /* scratch, shared by all layers */
    float *xn;            /* (xn_rows, D) one chunk's normed input (a layer's or the final norm's),
                             recomputed in backward */
    float *dx;            /* (N, D) */
    float *dxn;           /* (xn_rows, D) its gradient */
    /* per-head q/k norms (cfg.qk_norm): the rstd of a chunk's heads, forward and backward, and the
       backward's projection output made again and its gradient, (xn_rows, max(H, Hkv) d) each */
    float *qk_rstd, *qk_x, *qk_dx;
    float *dq, *dk, *dv, *dout; /* attention gradients */
    /* the MLP's F-wide rows, here and in LayerActs, are ldF floats apart (linear_row_stride(F)),
       their padding zero from the start and forever after (see ffn_rows_alloc) */
    int ldF;
    float *h;             /* (ffn_rows, F) swiglu output, then its gradient */
    float *gate_c, *up_c; /* (ffn_rows, F) one chunk's gate and up (NULL when store_gate_up); in the
                             backward, their gradients in place */
    /* whole layers: one buffer for the two phases of a layer that never overlap (phases_alloc):
     * the MLP's h, gate_c, up_c and the attention half's dq, dk, dv, dout (and under bf16 none
     * the shared fp32 set wq, wk, wv, wo, wsaved) point into it; NULL when streaming */
    float *phases;
    float *ce_workspace;  /* (chunk, V) */
    int ce_chunk;
    Bf16Weight head16;    /* bf16: the LM head's weight as its products read it, made per forward */
    /* layer-input offload (llama.h): residual holds two (N, D) buffers, layer l's in l % 2 */
    ChunkTier *inputs_tier;
    int in_chunks, in_rows; /* chunks of a layer input, rows per chunk (the last may be shorter) */
    float *in_keys;         /* (L) one address per layer: the tier's name for layer l's input */
    long passes;            /* backward passes that read layer inputs back */
    const char *offload_dir;
    /* chunk streaming (llama.h): layers run chunk by chunk through the strategy's chunk calls */
    int stream;             /* 1: the streaming path; the (N, .) scratch above is then chunk-sized */
    int su, sc;             /* the strategy's chunks u and rows per chunk c */
    int residual_single;    /* streaming with layer inputs offloaded: one (N, D) buffer, x_out over x_in */
    float *x_mid_c, *o_c;   /* (c, D), (c, H d): one chunk's x_mid and attention output */
    float *rstd1_c, *rstd2_c; /* (c) */
};

int llama_ffn_chunks_default(const LlamaConfig *c, long N, int stream, int su) {
    if (stream) return 2 * su;
    /* rows whose h, gate and up fit where dq, dk, dv, dout go (phases_alloc) */
    const double grads = 2.0 * (double)N * ((double)c->num_attention_heads + c->num_key_value_heads) * c->head_dim;
    double fit = floor(grads / (3.0 * linear_row_stride(c->intermediate_size)));
    const long rows = fit > LLAMA_FFN_ROWS_MAX ? LLAMA_FFN_ROWS_MAX : fit < LLAMA_FFN_ROWS_MIN ? LLAMA_FFN_ROWS_MIN : (long)fit;
    long k = (N + rows - 1) / rows;
    return k > LLAMA_FFN_CHUNKS_DEFAULT ? (int)k : LLAMA_FFN_CHUNKS_DEFAULT;
}

long llama_ffn_chunk_count(long N, long K, int su, long sc, long *rows) {
    long r = N > 0 && K > 0 ? (N + K - 1) / K : 1; /* K past N: one row a chunk */
    if (su > 1 && r > sc) r = sc > 0 ? sc : 1;
    if (rows) *rows = r;
    if (N <= 0) return 1;
    return su > 1 ? su * ((sc + r - 1) / r) : (N + r - 1) / r;
}

long llama_ffn_chunks_flag(long N, long want, int su, long sc) {
    if (want > 0 && llama_ffn_chunk_count(N, want, su, sc, NULL) == want) return want;
    /* the counts are a function of the rows, ceil(N / K): each row count r <= N is reached by
     * K = ceil(N / r) where any K reaches it, and a smaller r by a larger K */
    long best = 0;
    for (long r = N; r >= 1; r--) {
        const long K = (N + r - 1) / r;
        if ((N + K - 1) / K == r && llama_ffn_chunk_count(N, K, su, sc, NULL) == want) {
            best = K;
            break;
        }
    }
    return best;
}

LlamaConfig llama_reference_config(void) {
    return (LlamaConfig){.hidden_size = 256, .intermediate_size = 1024, .num_attention_heads = 4,
                         .num_key_value_heads = 2, .num_hidden_layers = 4, .vocab_size = 256, .head_dim = 64,
                         .max_position_embeddings = 1 << 20, .tie_word_embeddings = 0, .rms_norm_eps = 1e-5f,
                         .rope_theta = 10000.0};
}

int llama_input_chunks(long N) { return N < 16 ? (N > 0 ? (int)N : 1) : 16; }

int llama_checkpoint_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "none")) return LLAMA_CKPT_NONE;
    if (!strcmp(name, "layer")) return LLAMA_CKPT_LAYER;
    if (!strcmp(name, "selective")) return LLAMA_CKPT_SELECTIVE;
    return -1;
}

const char *llama_checkpoint_name(int mode) {
    return mode == LLAMA_CKPT_LAYER ? "layer" : mode == LLAMA_CKPT_SELECTIVE ? "selective" : "none";
}

static float *alloc_floats(size_t n) { return xmalloc(sizeof(float) * (n ? n : 1)); }
/* rows of the MLP's F-wide buffers, ldF floats apart, zeroed: no product writes the padding, and
 * SwiGLU, which runs over it, keeps it zero (silu(0) 0 = 0, and 0 gradients) */
static float *ffn_rows_alloc(size_t rows, int ldF) { return xcalloc(rows ? rows * (size_t)ldF : 1, sizeof(float)); }
static bf16_t *alloc_bf16(size_t n) { return xmalloc(sizeof(bf16_t) * (n ? n : 1)); }

/* A layer's own `saved`: with a->wsaved (bf16, none) its bf16 prefix and fp32 rest, widened into
 * the shared a->wsaved before its backward (layer_convert); else fp32. */
static void layer_saved_alloc(LayerActs *L, const LlamaActs *a) {
    if (a->wsaved) {
        L->saved16 = alloc_bf16(a->saved_bf16);
        L->saved_rest = alloc_floats(a->saved_floats - a->saved_bf16);
        L->saved = a->wsaved;
    } else {
        L->saved = alloc_floats(a->saved_floats);
    }
}

static void layer_saved_free(LayerActs *L) {
    if (L->saved16) {
        xfree(L->saved16); xfree(L->saved_rest);
    } else {
        xfree(L->saved);
    }
}

/* n floats from a buffer being carved, each part 64-byte aligned; with base NULL only counted. */
typedef struct {
    float *base;
    size_t used;
} Carve;

static float *carve(Carve *c, size_t n) {
    float *p = c->base ? c->base + c->used : NULL;
    c->used += (n + 15) / 16 * 16;
    return p;
}

/* Whole layers: a layer's MLP (h, gate_c, up_c, in its forward and its backward) and its attention
 * half's buffers never hold live data at the same time, so one buffer holds both, as large as the
 * larger. The attention half's: dq, dk, dv, dout (from o_proj's backward to the projections'; in
 * the forward, under shared_qkv, q, k, v projected into dq, dk, dv, which the strategy's forward
 * copies before the MLP runs) and, under bf16 none (`widened`), the shared fp32 set the layer's
 * bf16 copies widen into (written by the attention's forward, packed to bf16 before the MLP runs,
 * widened again after the MLP's backward: layer_forward, layer_backward), with `wsaved` the
 * strategy's shared `saved`. The MLP's rows' padding is zeroed where each MLP pass starts
 * (ffn_pads_zero): the attention half writes over it. */
static void phases_alloc(LlamaActs *a, size_t N, size_t qd, size_t kvd, int widened, int wsaved) {
    const size_t ffn = (size_t)a->ffn_rows * (size_t)a->ldF;
    /* att2: where wq, wk, wv go; with qkv16_read over dq, dk, dv, dout, which the forward (their
     * only time) does not use (no shared_qkv there) */
    Carve mlp = {0}, att = {0}, fwd = {0}, *att2 = a->qkv16_read ? &fwd : &att;
    for (int pass = 0; pass < 2; pass++) {
        a->h = carve(&mlp, ffn);
        if (!a->store_gate_up) {
            a->gate_c = carve(&mlp, ffn);
            a->up_c = carve(&mlp, ffn);
        }
        a->dq = carve(&att, N * qd);
        a->dk = carve(&att, N * kvd);
        a->dv = carve(&att, N * kvd);
        a->dout = carve(&att, N * qd);
        if (widened) {
            a->wo = carve(&att, N * qd);
            if (!a->shared_qkv) {
                a->wq = carve(att2, N * qd);
                a->wk = carve(att2, N * kvd);
                a->wv = carve(att2, N * kvd);
            }
        }
        if (wsaved) a->wsaved = carve(&att, a->saved_floats);
        if (pass == 0) {
            size_t most = mlp.used > att.used ? mlp.used : att.used;
            if (fwd.used > most) die("internal: phases_alloc: q, k, v (%zu floats) outgrow the gradients' place", fwd.used);
            a->phases = alloc_floats(most);
            mlp = (Carve){a->phases, 0};
            att = (Carve){a->phases, 0};
            fwd = (Carve){a->phases, 0};
        }
    }
}

/* The padding of gate_c and up_c's rows (between F and ldF) zero again before an MLP pass: the
 * attention half's buffers share their memory (phases_alloc), and SwiGLU runs over the padding. */
static void ffn_pads_zero(const LlamaActs *a, int F) {
    if (!a->phases || !a->gate_c || a->ldF == F) return;
    for (size_t r = 0; r < (size_t)a->ffn_rows; r++) {
        memset(a->gate_c + r * (size_t)a->ldF + F, 0, sizeof(float) * (size_t)(a->ldF - F));
        memset(a->up_c + r * (size_t)a->ldF + F, 0, sizeof(float) * (size_t)(a->ldF - F));
    }
}

/* One complete set (everything but o and saved when `partial`). */
static void layer_acts_alloc(LayerActs *L, const LlamaConfig *c, const SeqAttention *attn, int N,
                             const LlamaActs *a, int partial, int low) {
    size_t D = (size_t)c->hidden_size, Nn = (size_t)N;
    size_t qd = (size_t)c->num_attention_heads * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
    memset(L, 0, sizeof *L);
    L->rstd1 = alloc_floats(Nn);
    if (a->shared_qkv) {
        L->q = a->q;
        L->k = a->k;
        L->v = a->v;
    } else if (low) {
        L->q16 = alloc_bf16(Nn * qd);
        L->k16 = alloc_bf16(Nn * kvd);
        L->v16 = alloc_bf16(Nn * kvd);
        L->q = a->wq;
        L->k = a->wk;
        L->v = a->wv;
    } else {
        L->q = alloc_floats(Nn * qd);
        L->k = alloc_floats(Nn * kvd);
        L->v = alloc_floats(Nn * kvd);
    }
    if (!partial && low) {
        L->o16 = alloc_bf16(Nn * qd);
        L->o = a->wo;
    } else if (!partial) {
        L->o = alloc_floats(Nn * qd);
    }
    if (!partial) layer_saved_alloc(L, a);
    else if (attn->kept_floats < attn->saved_floats) L->saved = alloc_floats(attn->saved_floats);
    L->x_mid = a->x_mid_shared ? a->x_mid_shared : alloc_floats(Nn * D);
    L->rstd2 = alloc_floats(Nn);
    if (a->store_gate_up) {
        L->gate = ffn_rows_alloc(Nn, a->ldF);
        L->up = ffn_rows_alloc(Nn, a->ldF);
    }
}

static void layer_acts_free(LayerActs *L, int shared_qkv, const float *x_mid_shared) {
    if (L->q16) {
        xfree(L->q16); xfree(L->k16); xfree(L->v16);
    } else if (!shared_qkv) {
        xfree(L->q); xfree(L->k); xfree(L->v);
    }
    if (L->o16) xfree(L->o16); else xfree(L->o);
    layer_saved_free(L);
    xfree(L->rstd1);
    if (L->x_mid != x_mid_shared) xfree(L->x_mid);
    xfree(L->rstd2); xfree(L->gate); xfree(L->up);
}

LlamaActs *llama_acts_create(const LlamaModel *m, const SeqAttention *attn, int N, int checkpoint) {
    LlamaActsOptions o = {.checkpoint = checkpoint, .ffn_chunks = 0};
    return llama_acts_create_opts(m, attn, N, &o);
}

LlamaActs *llama_acts_create_opts(const LlamaModel *m, const SeqAttention *attn, int N, const LlamaActsOptions *opt) {
    const LlamaConfig *c = &m->cfg;
    size_t D = (size_t)c->hidden_size, Nn = (size_t)N;
    size_t qd = (size_t)c->num_attention_heads * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
    if (attn->heads.n_local != N || attn->heads.n_heads != c->num_attention_heads ||
        attn->heads.n_kv_heads != c->num_key_value_heads || attn->heads.head_dim != c->head_dim)
        die("internal: the attention strategy was made for N=%d H=%d Hkv=%d d=%d, the model has N=%d H=%d Hkv=%d d=%d",
            attn->heads.n_local, attn->heads.n_heads, attn->heads.n_kv_heads, attn->heads.head_dim, N,
            c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    if (opt->checkpoint < LLAMA_CKPT_NONE || opt->checkpoint > LLAMA_CKPT_SELECTIVE)
        die("internal: unknown checkpoint mode %d", opt->checkpoint);
    if (attn->kept_floats > attn->saved_floats || !attn->restore)
        die("internal: the attention strategy '%s' does not describe its kept state", attn->name);
    LlamaActs *a = xcalloc(1, sizeof *a);
    if (opt->precision != PRECISION_FP32 && opt->precision != PRECISION_BF16)
        die("internal: unknown precision %d", opt->precision);
    a->N = N;
    a->checkpoint = opt->checkpoint;
    a->precision = opt->precision;
    a->n_layers = c->num_hidden_layers;
    a->stream = llama_streams(attn->stream_chunks, opt->checkpoint, opt->no_stream) && attn->forward_chunk &&
                attn->stream_rows > 0 && (long)attn->stream_chunks * attn->stream_rows == N;
    a->su = a->stream ? attn->stream_chunks : 1;
    a->sc = a->stream ? attn->stream_rows : N;
    int K = opt->ffn_chunks > 0 ? opt->ffn_chunks : llama_ffn_chunks_default(c, N, a->stream, a->su);
    long rows; /* streamed: the MLP runs inside each attention chunk of sc rows */
    a->ffn_chunks = (int)llama_ffn_chunk_count(N, K, a->su, a->sc, &rows);
    a->ffn_rows = (int)rows;
    a->store_gate_up = a->checkpoint == LLAMA_CKPT_NONE && a->ffn_chunks == 1;
    a->ldF = linear_row_stride(c->intermediate_size);
    /* no per-layer q, k, v when each layer's own would never be read again (the strategy keeps
     * copies for its backward, or restore() takes them): forward projects into the gradient
     * scratch dq, dk, dv, which backward only fills after the strategy has taken its copies */
    a->shared_qkv = attn->keeps_inputs;
    a->qkv16_read = llama_reads_qkv16(opt->checkpoint, opt->precision, a->stream, attn->keeps_inputs,
                                      attn->backward_bf16 != NULL);
    if (opt->offload_dir && a->checkpoint != LLAMA_CKPT_NONE) {
        a->in_chunks = llama_input_chunks(N);
        a->in_rows = N > 0 ? (N + a->in_chunks - 1) / a->in_chunks : 1;
        a->in_chunks = N > 0 ? (N + a->in_rows - 1) / a->in_rows : 1;
        const size_t sizes[TIER_KINDS] = {(size_t)a->in_rows * D, 0, 0, 0};
        char err[512];
        a->inputs_tier = chunk_tier_disk_create(opt->offload_dir, opt->rank, a->in_chunks, sizes, 0, err, sizeof err);
        if (!a->inputs_tier) die("%s", err); /* after the set-up's probe: this rank alone (chunk_tier.h) */
        a->in_keys = alloc_floats((size_t)a->n_layers);
        a->offload_dir = opt->offload_dir;
        a->residual_single = a->stream;
        a->residual = alloc_floats((a->residual_single ? 1 : 2) * Nn * D);
    } else {
        a->residual = alloc_floats((size_t)(a->n_layers + 1) * Nn * D);
    }
    a->rope_cos = alloc_floats(Nn * (size_t)(c->head_dim / 2));
    a->rope_sin = alloc_floats(Nn * (size_t)(c->head_dim / 2));
    /* streaming: the layer's scratch holds one chunk of c rows; only dx (N, D) stays whole. The
     * normed rows and their gradient exist one chunk at a time either way (ffn_rows rows on the
     * whole-layer path: at S = 32768 and 4096-row chunks 8 MiB instead of 64) */
    size_t Cr = (size_t)a->sc;
    a->xn_rows = a->stream ? a->sc : a->ffn_rows;
    a->rstd_final = alloc_floats(a->stream ? 1 : Nn);
    a->xn = alloc_floats((size_t)a->xn_rows * D);
    a->dx = alloc_floats(Nn * D);
    a->dxn = alloc_floats((size_t)a->xn_rows * D);
    if (c->qk_norm) {
        const size_t heads = (size_t)(c->num_attention_heads > c->num_key_value_heads ? c->num_attention_heads
                                                                                       : c->num_key_value_heads);
        a->qk_rstd = alloc_floats((size_t)a->xn_rows * heads);
        a->qk_x = alloc_floats((size_t)a->xn_rows * heads * (size_t)c->head_dim);
        a->qk_dx = alloc_floats((size_t)a->xn_rows * heads * (size_t)c->head_dim);
    }
    a->saved_floats = attn->saved_floats;
    a->saved_bf16 = attn->bf16_floats <= attn->saved_floats - attn->kept_floats ? attn->bf16_floats : 0;
    /* bf16 per-layer copies (none under streaming: no layer keeps q, k, v or o) */
    int low = a->precision == PRECISION_BF16 && a->checkpoint != LLAMA_CKPT_LAYER && !a->stream;
    /* bf16, none (streamed or not): the strategy's copies of q, k, v in bf16, widened into one
     * shared fp32 `saved` (wsaved) */
    const int wsaved = a->precision == PRECISION_BF16 && a->checkpoint == LLAMA_CKPT_NONE && a->saved_bf16 > 0;
    if (a->stream) {
        a->dq = alloc_floats(Cr * qd);
        a->dk = alloc_floats(Cr * kvd);
        a->dv = alloc_floats(Cr * kvd);
        a->dout = alloc_floats(Cr * qd);
        a->h = ffn_rows_alloc((size_t)a->ffn_rows, a->ldF);
        if (!a->store_gate_up) {
            a->gate_c = ffn_rows_alloc((size_t)a->ffn_rows, a->ldF);
            a->up_c = ffn_rows_alloc((size_t)a->ffn_rows, a->ldF);
        }
        if (wsaved) a->wsaved = alloc_floats(a->saved_floats);
        a->x_mid_c = alloc_floats(Cr * D);
        a->o_c = alloc_floats(Cr * qd);
        a->rstd1_c = alloc_floats(Cr);
        a->rstd2_c = alloc_floats(Cr);
    } else {
        phases_alloc(a, Nn, qd, kvd, low && a->checkpoint == LLAMA_CKPT_NONE, wsaved);
        /* selective: o is widened before the restore (x_mid again), so it lives across the MLP */
        if (low && a->checkpoint != LLAMA_CKPT_NONE) a->wo = alloc_floats(Nn * qd);
    }
    if (a->shared_qkv) {
        a->q = a->dq;
        a->k = a->dk;
        a->v = a->dv;
    }
    a->layers = xcalloc((size_t)a->n_layers, sizeof(LayerActs));
    if (a->stream) { /* a layer keeps only the strategy's state: each its own (none) or one shared (layer) */
        if (a->checkpoint == LLAMA_CKPT_LAYER) a->shared.saved = alloc_floats(attn->saved_floats);
        for (int l = 0; l < a->n_layers; l++) {
            if (a->checkpoint == LLAMA_CKPT_LAYER) a->layers[l].saved = a->shared.saved;
            else layer_saved_alloc(&a->layers[l], a);
        }
    } else if (a->checkpoint == LLAMA_CKPT_NONE) {
        if (llama_rebuilds_x_mid(a->checkpoint, a->precision, 0)) a->x_mid_shared = alloc_floats(Nn * D);
        for (int l = 0; l < a->n_layers; l++) layer_acts_alloc(&a->layers[l], c, attn, N, a, 0, low);
    } else if (a->checkpoint == LLAMA_CKPT_LAYER) {
        layer_acts_alloc(&a->shared, c, attn, N, a, 0, 0);
        for (int l = 0; l < a->n_layers; l++) a->layers[l] = a->shared;
    } else { /* selective: per layer o and the kept suffix of saved; the rest is shared */
        layer_acts_alloc(&a->shared, c, attn, N, a, 1, 0);
        for (int l = 0; l < a->n_layers; l++) {
            LayerActs *L = &a->layers[l];
            *L = a->shared;
            if (low) {
                L->o16 = alloc_bf16(Nn * qd);
                L->o = a->wo;
            } else {
                L->o = alloc_floats(Nn * qd);
            }
            if (attn->kept_floats < attn->saved_floats)
                L->kept = alloc_floats(attn->kept_floats);
            else
                L->saved = alloc_floats(attn->saved_floats); /* all of it is kept */
        }
    }
    a->ce_chunk = N < 256 ? N : 256;
    a->ce_workspace = alloc_floats((size_t)a->ce_chunk * (size_t)c->vocab_size);
    return a;
}

void llama_acts_free(LlamaActs *a) {
    if (!a) return;
    if (a->stream) {
        if (a->checkpoint == LLAMA_CKPT_LAYER) xfree(a->shared.saved);
        else for (int l = 0; l < a->n_layers; l++) layer_saved_free(&a->layers[l]);
    } else if (a->checkpoint == LLAMA_CKPT_NONE) {
        for (int l = 0; l < a->n_layers; l++) layer_acts_free(&a->layers[l], a->shared_qkv, a->x_mid_shared);
    } else {
        if (a->checkpoint == LLAMA_CKPT_SELECTIVE)
            for (int l = 0; l < a->n_layers; l++) {
                LayerActs *L = &a->layers[l];
                if (L->o16) xfree(L->o16); else xfree(L->o);
                if (L->kept) xfree(L->kept); else xfree(L->saved);
            }
        layer_acts_free(&a->shared, a->shared_qkv, NULL);
    }
    xfree(a->layers);
    if (a->inputs_tier) chunk_tier_destroy(a->inputs_tier);
    xfree(a->in_keys);
    if (a->phases) { /* the parts of one buffer (phases_alloc); wo is its own under selective */
        if (a->checkpoint == LLAMA_CKPT_NONE) a->wo = NULL;
        a->h = a->gate_c = a->up_c = a->dq = a->dk = a->dv = a->dout = NULL;
        a->wq = a->wk = a->wv = a->wsaved = NULL;
        xfree(a->phases);
    }
    xfree(a->wq); xfree(a->wk); xfree(a->wv); xfree(a->wo); xfree(a->wsaved);
    bf16_scratch_free(&a->mm_scratch);
    bf16_weight_free(&a->head16);
    xfree(a->x_mid_shared);
    xfree(a->residual); xfree(a->rope_cos); xfree(a->rope_sin); xfree(a->rstd_final);
    xfree(a->xn); xfree(a->dx); xfree(a->dxn); xfree(a->dq); xfree(a->dk); xfree(a->dv); xfree(a->dout);
    xfree(a->qk_rstd); xfree(a->qk_x); xfree(a->qk_dx);
    xfree(a->x_mid_c); xfree(a->o_c); xfree(a->rstd1_c); xfree(a->rstd2_c);
    xfree(a->h); xfree(a->gate_c); xfree(a->up_c); xfree(a->ce_workspace);
    xfree(a);
}

int llama_acts_checkpoint(const LlamaActs *a) { return a->checkpoint; }
int llama_acts_ffn_chunks(const LlamaActs *a) { return a->ffn_chunks; }
int llama_acts_offloads_inputs(const LlamaActs *a) { return a->inputs_tier != NULL; }

void llama_acts_offload_stats(const LlamaActs *a, unsigned long long *bytes_written, unsigned long long *bytes_read,
                              double *wait_s, long *passes) {
    TierStats st;
    chunk_tier_stats(a->inputs_tier, &st);
    *bytes_written = st.bytes_written;
    *bytes_read = st.bytes_read;
    *wait_s = st.wait_s;
    *passes = a->passes;
}

int llama_acts_io_error(const LlamaActs *a, SeqErr *e) {
    if (!a->inputs_tier || !a->inputs_tier->io_errno) return 0;
    return seq_err(e, "--offload-dir %s: the layer-input file could not be written or read (%s): free space there or "
                   "choose another directory", a->offload_dir, strerror(a->inputs_tier->io_errno));
}
int llama_acts_precision(const LlamaActs *a) { return a->precision; }
int llama_acts_streams(const LlamaActs *a) { return a->stream; }

int llama_streams(int stream_chunks, int checkpoint, int no_stream) {
    return stream_chunks > 1 && checkpoint != LLAMA_CKPT_SELECTIVE && !no_stream;
}

int llama_reads_qkv16(int checkpoint, int precision, int stream, int keeps_inputs, int has_backward_bf16) {
    return precision == PRECISION_BF16 && checkpoint == LLAMA_CKPT_NONE && !stream && !keeps_inputs &&
           has_backward_bf16;
}

int llama_rebuilds_x_mid(int checkpoint, int precision, int stream) {
    return checkpoint == LLAMA_CKPT_NONE && (stream || precision == PRECISION_BF16);
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

/* ---------------------------------------------------------------- forward / backward */

static float *residual_at(const LlamaActs *a, const LlamaConfig *c, int l) {
    size_t slot = a->residual_single ? 0 : a->inputs_tier ? (size_t)(l & 1) : (size_t)l;
    return a->residual + slot * a->N * (size_t)c->hidden_size;
}

/* Layer-input offload: rows of chunk i of a layer input. */
static int input_chunk_rows(const LlamaActs *a, int i) {
    int r0 = i * a->in_rows;
    return a->N - r0 < a->in_rows ? a->N - r0 : a->in_rows;
}

/* Layer l's input to the tier, chunk by chunk (slot() waits only for the write of two chunks ago). */
static void input_store(LlamaActs *a, const LlamaConfig *c, int l) {
    ChunkTier *t = a->inputs_tier;
    const size_t D = (size_t)c->hidden_size;
    const float *x = residual_at(a, c, l);
    for (int i = 0; i < a->in_chunks; i++) {
        float *dst = t->slot(t, &a->in_keys[l], TIER_Q, i);
        size_t n = (size_t)input_chunk_rows(a, i) * D;
        memcpy(dst, x + (size_t)i * a->in_rows * D, sizeof(float) * n);
        if (n < (size_t)a->in_rows * D) memset(dst + n, 0, sizeof(float) * ((size_t)a->in_rows * D - n));
        t->store(t, &a->in_keys[l], TIER_Q, i);
    }
}

/* Hint: layer l's first two chunks into the read buffers (while the layer above runs). */
static void input_prefetch(LlamaActs *a, int l) {
    ChunkTier *t = a->inputs_tier;
    for (int i = 0; i < 2 && i < a->in_chunks; i++) t->prefetch(t, &a->in_keys[l], TIER_Q, i, i & 1);
}

/* Layer l's input back into its working buffer; chunk i + 2 is read while chunk i is copied. */
static void input_fetch(LlamaActs *a, const LlamaConfig *c, int l) {
    ChunkTier *t = a->inputs_tier;
    const size_t D = (size_t)c->hidden_size;
    float *x = residual_at(a, c, l);
    for (int i = 0; i < a->in_chunks; i++) {
        const float *src = t->fetch(t, &a->in_keys[l], TIER_Q, i, i & 1);
        memcpy(x + (size_t)i * a->in_rows * D, src, sizeof(float) * (size_t)input_chunk_rows(a, i) * D);
        t->release(t, src);
        if (i + 2 < a->in_chunks) t->prefetch(t, &a->in_keys[l], TIER_Q, i + 2, i & 1);
    }
}

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

/* bf16: after layer l's forward its own o (and q, k, v) go to their bf16 copies (exact for
 * q, k, v, which are bf16-rounded already: to_bf16 = 1), and so does the strategy's copy of
 * q, k, v (the prefix of saved: exact too), the rest of saved going to its fp32 buffer; before
 * its backward they come back (to_bf16 = 0), but for q, k, v where the strategy's backward reads
 * the bf16 copies as they are (qkv16_read). */
static void layer_convert(LlamaActs *a, const LlamaConfig *c, int l, int to_bf16) {
    LayerActs *L = &a->layers[l];
    size_t N = (size_t)a->N, qd = (size_t)c->num_attention_heads * c->head_dim;
    size_t kvd = (size_t)c->num_key_value_heads * c->head_dim;
    struct { float *f; bf16_t *h; size_t n; } t[5] = {
        {L->o, L->o16, N * qd}, {L->q, L->q16, N * qd}, {L->k, L->k16, N * kvd}, {L->v, L->v16, N * kvd},
        {L->saved, L->saved16, a->saved_bf16}};
    for (int i = 0; i < 5; i++) {
        if (!t[i].h || (!to_bf16 && a->qkv16_read && i >= 1 && i <= 3)) continue; /* q, k, v read as bf16 */
        if (to_bf16) bf16_pack(t[i].h, t[i].f, t[i].n);
        else bf16_unpack(t[i].f, t[i].h, t[i].n);
    }
    if (L->saved_rest) {
        const size_t rest = a->saved_floats - a->saved_bf16;
        if (to_bf16) memcpy(L->saved_rest, L->saved + a->saved_bf16, sizeof(float) * rest);
        else memcpy(L->saved + a->saved_bf16, L->saved_rest, sizeof(float) * rest);
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

/* norm -> q, k, v projections -> RoPE into L->q, L->k, L->v, ffn_rows rows at a time (through a->xn). */
static void qkv_forward(const LlamaModel *m, LlamaActs *a, int l) {
    const LlamaConfig *c = &m->cfg;
    LayerActs *L = &a->layers[l];
    const size_t D = (size_t)c->hidden_size, qd = (size_t)c->num_attention_heads * c->head_dim;
    const size_t kvd = (size_t)c->num_key_value_heads * c->head_dim;
    const float *x_in = residual_at(a, c, l);
    for (int r0 = 0; r0 < a->N; r0 += a->ffn_rows)
        qkv_rows(m, a, l, x_in + (size_t)r0 * D, L->rstd1 + r0, r0, ffn_chunk_rows(a, a->N, r0),
                 L->q + (size_t)r0 * qd, L->k + (size_t)r0 * kvd, L->v + (size_t)r0 * kvd);
}

/* x (n, D) += o_proj(o) over n rows of o (n, H d), its bias included. */
static void o_proj_onto(const LlamaModel *m, LlamaActs *a, int l, float *x, const float *o, int n) {
    const int D = m->cfg.hidden_size, qd = m->cfg.num_attention_heads * m->cfg.head_dim;
    const LlamaLayerWeights *w = &m->w.layers[l];
    mm_forward(a, x, o, w->o_proj, n, qd, D, 1, BF16_IN_ROUNDED);
    if (w->o_bias) bias_add_rows(x, (size_t)D, w->o_bias, n, D);
}

/* x_mid = x_in + o_proj(o), ffn_rows rows at a time */
static void residual_attn(const LlamaModel *m, LlamaActs *a, int l) {
    const LlamaConfig *c = &m->cfg;
    LayerActs *L = &a->layers[l];
    int N = a->N, D = c->hidden_size, qd = c->num_attention_heads * c->head_dim;
    memcpy(L->x_mid, residual_at(a, c, l), sizeof(float) * (size_t)N * D);
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows)
        o_proj_onto(m, a, l, L->x_mid + (size_t)r0 * D, L->o + (size_t)r0 * qd, ffn_chunk_rows(a, N, r0));
}

/* The attention half of layer l: x_mid = x_in + o_proj(attn(rope(q), rope(k), v)). */
static void attn_block_forward(const LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    LayerActs *L = &a->layers[l];
    qkv_forward(m, a, l);
    attn->window = llama_layer_window(&m->cfg, l);
    attn->forward(attn, L->q, L->k, L->v, L->o, L->saved);
    /* bf16: o rounded in place, under every checkpoint mode: o_proj (forward and weight gradient)
     * rounds it anyway, and the attention backward's delta = rowsum(dout * o) then reads the same
     * o whether the layer kept it (as bf16) or recomputed it */
    if (a->precision == PRECISION_BF16) bf16_round(L->o, (size_t)a->N * m->cfg.num_attention_heads * m->cfg.head_dim);
    if (L->kept)
        memcpy(L->kept, L->saved + (attn->saved_floats - attn->kept_floats), sizeof(float) * attn->kept_floats);
    residual_attn(m, a, l);
}

/* Selective checkpointing: q, k, v, the strategy's saved state and x_mid of layer l again, from
 * the layer input, the kept o and lse; attention's forward does not run. */
static void attn_block_restore(const LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    LayerActs *L = &a->layers[l];
    qkv_forward(m, a, l);
    if (L->kept)
        memcpy(L->saved + (attn->saved_floats - attn->kept_floats), L->kept, sizeof(float) * attn->kept_floats);
    attn->restore(attn, L->q, L->k, L->v, L->o, L->saved);
    residual_attn(m, a, l);
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
 * ffn_rows tokens, each normed on its own into a->xn (x_out may not alias x_mid). */
static void mlp_forward_rows(const LlamaModel *m, LlamaActs *a, int l, const float *x_mid, float *rstd2, float *x_out,
                             int N) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    int D = c->hidden_size, F = c->intermediate_size;
    ffn_pads_zero(a, F);
    memcpy(x_out, x_mid, sizeof(float) * (size_t)N * D);
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows) {
        const int n = ffn_chunk_rows(a, N, r0);
        float *gate, *up;
        norm_rounded(a, a->xn, rstd2 + r0, x_mid + (size_t)r0 * D, w->post_norm, n, D, c->rms_norm_eps);
        mlp_gate_up(m, a, l, a->xn, r0, n, &gate, &up);
        swiglu_forward_rounded(a, a->h, gate, up, (size_t)n * a->ldF);
        mm_forward_ld(a, x_out + (size_t)r0 * D, D, a->h, a->ldF, w->down_proj, n, F, D, 1, BF16_IN_ROUNDED);
    }
}

static void mlp_forward(const LlamaModel *m, LlamaActs *a, int l) {
    LayerActs *L = &a->layers[l];
    mlp_forward_rows(m, a, l, L->x_mid, L->rstd2, residual_at(a, &m->cfg, l + 1), a->N);
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
    ffn_pads_zero(a, F);
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

static void mlp_backward(LlamaModel *m, LlamaActs *a, int l) {
    LayerActs *L = &a->layers[l];
    mlp_backward_rows(m, a, l, L->x_mid, L->rstd2, a->dx, a->N);
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

/* Layer l: x_out = layer(x_in), filling L's saved activations (and a->xn, a->h as scratch). */
static void layer_forward(const LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    attn_block_forward(m, a, attn, l);
    layer_convert(a, &m->cfg, l, 1); /* before the MLP, which shares the fp32 set's memory */
    mlp_forward(m, a, l);
}

/* On entry a->dx = dL/dx_out of layer l; on exit a->dx = dL/dx_in. Accumulates weight grads. */
static void layer_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    LlamaLayerWeights *g = &m->g.layers[l];
    LayerActs *L = &a->layers[l];
    int N = a->N, D = c->hidden_size, H = c->num_attention_heads, Hkv = c->num_key_value_heads, hd = c->head_dim;
    const size_t qd = (size_t)H * hd, kvd = (size_t)Hkv * hd;
    const float *x_in = residual_at(a, c, l);

    if (a->x_mid_shared) { /* x_mid again, bit for bit as the forward made it: the same o (its bf16
                               copy: o was rounded in place) through the same o_proj calls onto x_in;
                               the MLP's buffers then overwrite the widened o (phases_alloc), which
                               layer_convert widens once more after them */
        bf16_unpack(L->o, L->o16, (size_t)N * qd);
        residual_attn(m, a, l);
    }
    mlp_backward(m, a, l);
    /* none: the layer's bf16 copies back into the fp32 set, which the MLP's buffers share
     * (selective widened o before its restore; layer keeps no copies) */
    if (a->checkpoint == LLAMA_CKPT_NONE) layer_convert(a, c, l, 0);

    /* attention: x_mid = x_in + o_proj(attn(rope(q), rope(k), v)); the token-wise parts over
     * chunks of ffn_rows rows */
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows) /* every row of dout, once */
        mm_backward(a, a->dout + (size_t)r0 * qd, 0, g->o_proj, a->dx + (size_t)r0 * D, L->o + (size_t)r0 * qd,
                    w->o_proj, ffn_chunk_rows(a, a->N, r0), H * hd, D, BF16_IN_ROUNDED);
    if (g->o_bias) bias_grad_rows(g->o_bias, a->dx, (size_t)D, N, D);
    if (a->precision == PRECISION_BF16) bf16_round(a->dout, (size_t)N * H * hd); /* attention's dout is bf16 */
    attn->window = llama_layer_window(c, l);
    if (attn->keeps_inputs) /* its own q, k, v are in `saved`; o is read for delta */
        attn->backward(attn, NULL, NULL, NULL, L->o, L->saved, a->dout, a->dq, a->dk, a->dv);
    else if (a->qkv16_read) /* the layer's bf16 copies, as they are */
        attn->backward_bf16(attn, L->q16, L->k16, L->v16, L->o, L->saved, a->dout, a->dq, a->dk, a->dv);
    else
        attn->backward(attn, L->q, L->k, L->v, L->o, L->saved, a->dout, a->dq, a->dk, a->dv);
    rope_backward_rounded(m, a, 0, N);
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows) {
        const int n = ffn_chunk_rows(a, a->N, r0);
        const float *xr = x_in + (size_t)r0 * D;
        norm_rounded(a, a->xn, L->rstd1 + r0, xr, w->input_norm, n, D, c->rms_norm_eps);
        qkv_backward_rows(m, a, l, a->dq + (size_t)r0 * qd, a->dk + (size_t)r0 * kvd, a->dv + (size_t)r0 * kvd, n);
        rmsnorm_backward(a->dx + (size_t)r0 * D, g->input_norm, a->dxn, xr, w->input_norm, L->rstd1 + r0, n, D);
    }
}

/* ---------------------------------------------------------------- streaming (llama.h) */

/* Layer l chunk by chunk through the strategy's chunk calls: for each chunk of c rows, norm ->
 * q, k, v -> RoPE -> forward_chunk; with `whole`, also x_mid = x_in + o_proj(o) and the MLP into
 * the layer's output rows (which may be the input rows themselves: each chunk's input rows are
 * read before its output rows are written). Without `whole`: the attention half only, as the
 * recompute of --checkpoint layer needs (backward rebuilds x_mid itself). */
static void stream_layer_forward(const LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l, int whole) {
    const LlamaConfig *c = &m->cfg;
    const size_t D = (size_t)c->hidden_size;
    float *saved = a->layers[l].saved;
    attn->window = llama_layer_window(c, l);
    for (int i = 0; i < a->su; i++) {
        const size_t r0 = (size_t)i * a->sc;
        float *x_in = residual_at(a, c, l) + r0 * D;
        qkv_rows(m, a, l, x_in, a->rstd1_c, (int)r0, a->sc, a->q, a->k, a->v);
        attn->forward_chunk(attn, i, a->q, a->k, a->v, a->o_c, saved);
        if (!whole) continue;
        memcpy(a->x_mid_c, x_in, sizeof(float) * (size_t)a->sc * D);
        o_proj_onto(m, a, l, a->x_mid_c, a->o_c, a->sc);
        mlp_forward_rows(m, a, l, a->x_mid_c, a->rstd2_c, residual_at(a, c, l + 1) + r0 * D, a->sc);
    }
}

/* On entry a->dx = dL/dx_out of layer l (N, D); on exit dL/dx_in. Two passes over the chunks, as
 * the strategy's backward needs every chunk's output gradient before its key/value-outer loop:
 * (a) per chunk: o again from the strategy, x_mid = x_in + o_proj(o) again, the MLP backward of
 * those rows (dx rows become dL/dx_mid), dout = dx_mid o_proj, handed to dout_chunk;
 * (b) per chunk: backward_chunk's final dq, dk, dv of those rows -> RoPE backward -> the
 * projections' and the input norm's backward into dx rows. */
static void stream_layer_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn, int l) {
    const LlamaConfig *c = &m->cfg;
    const LlamaLayerWeights *w = &m->w.layers[l];
    LlamaLayerWeights *g = &m->g.layers[l];
    const int D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim;
    const int n = a->sc;
    const float *saved = a->layers[l].saved;
    if (a->checkpoint == LLAMA_CKPT_LAYER) stream_layer_forward(m, a, attn, l, 0);
    attn->window = llama_layer_window(c, l);
    for (int i = 0; i < a->su; i++) {
        const size_t r0 = (size_t)i * n;
        const float *x_in = residual_at(a, c, l) + r0 * D;
        float *dx = a->dx + r0 * D;
        attn->output_chunk(attn, i, saved, a->o_c);
        memcpy(a->x_mid_c, x_in, sizeof(float) * (size_t)n * D);
        o_proj_onto(m, a, l, a->x_mid_c, a->o_c, n);
        mlp_backward_rows(m, a, l, a->x_mid_c, a->rstd2_c, dx, n);
        mm_backward(a, a->dout, 0, g->o_proj, dx, a->o_c, w->o_proj, n, H * hd, D, BF16_IN_ROUNDED);
        if (g->o_bias) bias_grad_rows(g->o_bias, dx, (size_t)D, n, D);
        if (a->precision == PRECISION_BF16) bf16_round(a->dout, (size_t)n * H * hd); /* attention's dout is bf16 */
        attn->dout_chunk(attn, i, saved, a->dout);
    }
    for (int i = 0; i < a->su; i++) {
        const size_t r0 = (size_t)i * n;
        const float *x_in = residual_at(a, c, l) + r0 * D;
        attn->backward_chunk(attn, i, saved, a->dq, a->dk, a->dv);
        rope_backward_rounded(m, a, (int)r0, n);
        norm_rounded(a, a->xn, a->rstd1_c, x_in, w->input_norm, n, D, c->rms_norm_eps);
        qkv_backward_rows(m, a, l, a->dq, a->dk, a->dv, n);
        rmsnorm_backward(a->dx + r0 * D, g->input_norm, a->dxn, x_in, w->input_norm, a->rstd1_c, n, D);
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
                        int *predictions) {
    const int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (a->precision == PRECISION_BF16)
        return lm_head_cross_entropy_bf16(a->xn, &a->head16, targets, n, D, V, loss_scale, backward ? a->dxn : NULL,
                                          backward ? m->g.lm_head : NULL, predictions, a->ce_chunk, a->ce_workspace,
                                          &a->mm_scratch);
    return lm_head_cross_entropy(a->xn, m->w.lm_head, targets, n, D, V, loss_scale, backward ? a->dxn : NULL,
                                 backward ? m->g.lm_head : NULL, predictions, a->ce_chunk, a->ce_workspace);
}

/* The final norm and the loss over chunks of c rows (the normed rows never exist whole): the
 * sum of the local losses; with `backward`, a->dx = dL/d(last layer's output). */
static double stream_head(LlamaModel *m, LlamaActs *a, const int *targets, float loss_scale, int backward,
                          int *predictions) {
    const LlamaConfig *c = &m->cfg;
    const int D = c->hidden_size, nL = c->num_hidden_layers, n = a->sc;
    double loss = 0;
    if (backward) memset(a->dx, 0, sizeof(float) * (size_t)a->N * D);
    head_prepare(m, a);
    for (int i = 0; i < a->su; i++) {
        const size_t r0 = (size_t)i * n;
        const float *x = residual_at(a, c, nL) + r0 * D;
        norm_rounded(a, a->xn, a->rstd1_c, x, m->w.final_norm, n, D, c->rms_norm_eps);
        if (backward) memset(a->dxn, 0, sizeof(float) * (size_t)n * D);
        loss += head_rows(m, a, targets + r0, n, loss_scale, backward, predictions ? predictions + r0 : NULL);
        if (backward)
            rmsnorm_backward(a->dx + r0 * D, m->g.final_norm, a->dxn, x, m->w.final_norm, a->rstd1_c, n, D);
    }
    return loss;
}

/* The final norm and the loss on the whole-layer path: over chunks of ffn_rows rows, as the
 * layers' token-wise parts (the normed rows never exist whole). */
static double whole_head(LlamaModel *m, LlamaActs *a, const int *targets, float loss_scale, int backward,
                         int *predictions) {
    const LlamaConfig *c = &m->cfg;
    const int N = a->N, D = c->hidden_size, nL = c->num_hidden_layers;
    double loss = 0;
    if (backward) memset(a->dx, 0, sizeof(float) * (size_t)N * D);
    head_prepare(m, a);
    for (int r0 = 0; r0 < N; r0 += a->ffn_rows) {
        const int n = ffn_chunk_rows(a, a->N, r0);
        const float *x = residual_at(a, c, nL) + (size_t)r0 * D;
        norm_rounded(a, a->xn, a->rstd_final + r0, x, m->w.final_norm, n, D, c->rms_norm_eps);
        if (backward) memset(a->dxn, 0, sizeof(float) * (size_t)n * D);
        loss += head_rows(m, a, targets + r0, n, loss_scale, backward, predictions ? predictions + r0 : NULL);
        if (backward)
            rmsnorm_backward(a->dx + (size_t)r0 * D, m->g.final_norm, a->dxn, x, m->w.final_norm, a->rstd_final + r0, n,
                             D);
    }
    return loss;
}

/* ---------------------------------------------------------------- hooks (see llama.h) */

static void hook(LlamaModel *m, LlamaHookPoint p, int layer, int backward) {
    if (m->hooks && m->hooks->fn) m->hooks->fn(m->hooks->ctx, m, p, layer, backward);
}

double llama_forward_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                              const int *inputs, const int *targets, const int *positions, int N,
                              float loss_scale, int backward, int *predictions) {
    return llama_forward_backward_docs(m, a, attn, inputs, targets, positions, NULL, N, loss_scale, backward,
                                       predictions);
}

double llama_forward_backward_docs(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                                   const int *inputs, const int *targets, const int *positions, const int *docs,
                                   int N, float loss_scale, int backward, int *predictions) {
    const LlamaConfig *c = &m->cfg;
    if (N != a->N) die("internal: activations were made for %d tokens, called with %d", a->N, N);
    int D = c->hidden_size, V = c->vocab_size, nL = c->num_hidden_layers;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || targets[i] >= V)
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
    embedding_forward(residual_at(a, c, 0), inputs, m->w.embed, N, D);
    hook(m, LLAMA_HOOK_AFTER_EMBEDDING, -1, backward);
    for (int l = 0; l < nL; l++) {
        hook(m, LLAMA_HOOK_BEFORE_FORWARD, l, backward);
        if (a->inputs_tier && backward) input_store(a, c, l);
        if (a->stream) {
            stream_layer_forward(m, a, attn, l, 1);
            layer_convert(a, c, l, 1);
        } else {
            layer_forward(m, a, attn, l);
        }
        hook(m, LLAMA_HOOK_AFTER_FORWARD, l, backward);
    }
    if (a->inputs_tier && backward) input_prefetch(a, nL - 1); /* read while the loss runs */
    hook(m, LLAMA_HOOK_BEFORE_HEAD, -1, backward);
    double loss = a->stream ? stream_head(m, a, targets, loss_scale, backward, predictions)
                            : whole_head(m, a, targets, loss_scale, backward, predictions);
    hook(m, LLAMA_HOOK_AFTER_HEAD, -1, backward);
    if (!backward) {
        hook(m, LLAMA_HOOK_END, -1, 0);
        return loss;
    }
    if (a->inputs_tier) a->passes++;
    for (int l = nL - 1; l >= 0; l--) {
        hook(m, LLAMA_HOOK_BEFORE_BACKWARD, l, 1);
        if (a->inputs_tier) {
            input_fetch(a, c, l);
            if (l > 0) input_prefetch(a, l - 1);
        }
        if (a->stream) {
            layer_convert(a, c, l, 0);
            stream_layer_backward(m, a, attn, l);
            hook(m, LLAMA_HOOK_AFTER_BACKWARD, l, 1);
            continue;
        }
        /* layer: the attention half again, attention's forward included, into the shared set;
         * selective: q, k, v, the strategy's state and x_mid without attention's forward. The
         * MLP is recomputed chunk by chunk inside its backward. */
        if (a->checkpoint == LLAMA_CKPT_LAYER) attn_block_forward(m, a, attn, l);
        if (a->checkpoint == LLAMA_CKPT_SELECTIVE) {
            layer_convert(a, c, l, 0); /* o for x_mid again */
            attn_block_restore(m, a, attn, l);
        }
        layer_backward(m, a, attn, l);
        hook(m, LLAMA_HOOK_AFTER_BACKWARD, l, 1);
    }
    hook(m, LLAMA_HOOK_BEFORE_EMBEDDING_BACKWARD, -1, 1);
    embedding_backward(m->g.embed, a->dx, inputs, N, D, c->padding_idx1 - 1);
    hook(m, LLAMA_HOOK_END, -1, 1);
    return loss;
}
