/* The decoder layers' memory policy (layer_memory.h): the activations' allocation and carving for
 * each checkpoint mode, FFN chunking, chunk streaming, layer-input offload and bf16 copies, and the
 * policy's points in a forward and backward (offload, kept state, bf16 packing and widening). */
#include "model/layer_memory.h"

#include "model/activations.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "memory/chunk_tier.h"

/* ---------------------------------------------------------------- settings */

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

/* ---------------------------------------------------------------- allocation */

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
 * widened again after the MLP's backward: layer_memory_attention_done, layer_memory_widen), with
 * `wsaved` the strategy's shared `saved`. The MLP's rows' padding is zeroed where each MLP pass starts
 * (layer_memory_ffn_pads_zero): the attention half writes over it. */
static void phases_alloc(LlamaActs *a, size_t N, size_t qd, size_t kvd, int widened, int wsaved) {
    /* forward only: no gradients; dq, dk, dv only as the home of q, k, v under shared_qkv */
    const int grads = !a->forward_only, qkv_home = grads || a->shared_qkv;
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
        if (qkv_home) {
            a->dq = carve(&att, N * qd);
            a->dk = carve(&att, N * kvd);
            a->dv = carve(&att, N * kvd);
        }
        if (grads) a->dout = carve(&att, N * qd);
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
void layer_memory_ffn_pads_zero(const LlamaActs *a, int F) {
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
    /* forward only: x_mid made in place in the one residual buffer, x_out over it (llama.c) */
    L->x_mid = a->x_mid_shared ? a->x_mid_shared : a->forward_only ? a->residual : alloc_floats(Nn * D);
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

LlamaActs *layer_memory_create(const LlamaConfig *c, const SeqAttention *attn, int N, const LlamaActsOptions *opt) {
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
    a->forward_only = opt->forward_only != 0;
    /* forward only: the layers share one set of tensors, as under layer checkpointing */
    a->checkpoint = a->forward_only ? LLAMA_CKPT_LAYER : opt->checkpoint;
    a->precision = opt->precision;
    a->n_layers = c->num_hidden_layers;
    a->D = (int)D;
    a->qd = (int)qd;
    a->kvd = (int)kvd;
    a->stream = llama_streams(attn->stream_chunks, a->checkpoint, opt->no_stream) && attn->forward_chunk &&
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
    a->qkv16_read = llama_reads_qkv16(a->checkpoint, opt->precision, a->stream, attn->keeps_inputs,
                                      attn->backward_bf16 != NULL);
    if (a->forward_only) { /* each layer's output over its input */
        a->residual_single = 1;
        a->residual = alloc_floats(Nn * D);
    } else if (opt->offload_dir && a->checkpoint != LLAMA_CKPT_NONE) {
        a->in_chunks = llama_input_chunks(N);
        a->in_rows = N > 0 ? (N + a->in_chunks - 1) / a->in_chunks : 1;
        a->in_chunks = N > 0 ? (N + a->in_rows - 1) / a->in_rows : 1;
        const size_t sizes[TIER_KINDS] = {(size_t)a->in_rows * D, 0, 0, 0};
        char err[512];
        a->inputs_tier = chunk_tier_disk_create("--offload-dir", opt->offload_dir, opt->rank, a->in_chunks, sizes, 0, err, sizeof err);
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
    if (!a->forward_only) {
        a->dx = alloc_floats(Nn * D);
        a->dxn = alloc_floats((size_t)a->xn_rows * D);
    }
    if (c->qk_norm) {
        const size_t heads = (size_t)(c->num_attention_heads > c->num_key_value_heads ? c->num_attention_heads
                                                                                       : c->num_key_value_heads);
        a->qk_rstd = alloc_floats((size_t)a->xn_rows * heads);
        a->qk_x = alloc_floats((size_t)a->xn_rows * heads * (size_t)c->head_dim);
        if (!a->forward_only) a->qk_dx = alloc_floats((size_t)a->xn_rows * heads * (size_t)c->head_dim);
    }
    a->saved_floats = attn->saved_floats;
    a->saved_bf16 = attn->bf16_floats <= attn->saved_floats - attn->kept_floats ? attn->bf16_floats : 0;
    /* bf16 per-layer copies (none under streaming: no layer keeps q, k, v or o) */
    int low = a->precision == PRECISION_BF16 && a->checkpoint != LLAMA_CKPT_LAYER && !a->stream;
    /* bf16, none (streamed or not): the strategy's copies of q, k, v in bf16, widened into one
     * shared fp32 `saved` (wsaved) */
    const int wsaved = a->precision == PRECISION_BF16 && a->checkpoint == LLAMA_CKPT_NONE && a->saved_bf16 > 0;
    if (a->stream) {
        if (!a->forward_only || a->shared_qkv) {
            a->dq = alloc_floats(Cr * qd);
            a->dk = alloc_floats(Cr * kvd);
            a->dv = alloc_floats(Cr * kvd);
        }
        if (!a->forward_only) a->dout = alloc_floats(Cr * qd);
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
    a->x_mid_kept = a->checkpoint == LLAMA_CKPT_NONE && !llama_rebuilds_x_mid(a->checkpoint, a->precision, a->stream);
    if (a->stream) /* every layer's tensors of one attention chunk are the chunk scratch */
        for (int l = 0; l < a->n_layers; l++) {
            LayerActs *L = &a->layers[l];
            L->q = a->q;
            L->k = a->k;
            L->v = a->v;
            L->o = a->o_c;
            L->x_mid = a->x_mid_c;
            L->rstd1 = a->rstd1_c;
            L->rstd2 = a->rstd2_c;
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
        layer_acts_free(&a->shared, a->shared_qkv, a->forward_only ? a->residual : NULL);
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

/* ---------------------------------------------------------------- queries */

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
int llama_acts_forward_only(const LlamaActs *a) { return a->forward_only; }
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

/* ---------------------------------------------------------------- the residual stream and its offload */

float *layer_memory_input(const LlamaActs *a, int l) {
    size_t slot = a->residual_single ? 0 : a->inputs_tier ? (size_t)(l & 1) : (size_t)l;
    return a->residual + slot * a->N * (size_t)a->D;
}

float *layer_memory_head_rstd(const LlamaActs *a, int r0) { return a->stream ? a->rstd1_c : a->rstd_final + r0; }

/* Layer-input offload: rows of chunk i of a layer input. */
static int input_chunk_rows(const LlamaActs *a, int i) {
    int r0 = i * a->in_rows;
    return a->N - r0 < a->in_rows ? a->N - r0 : a->in_rows;
}

/* Layer l's input to the tier, chunk by chunk (slot() waits only for the write of two chunks ago). */
static void input_store(LlamaActs *a, int l) {
    ChunkTier *t = a->inputs_tier;
    const size_t D = (size_t)a->D;
    const float *x = layer_memory_input(a, l);
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
static void input_fetch(LlamaActs *a, int l) {
    ChunkTier *t = a->inputs_tier;
    const size_t D = (size_t)a->D;
    float *x = layer_memory_input(a, l);
    for (int i = 0; i < a->in_chunks; i++) {
        const float *src = t->fetch(t, &a->in_keys[l], TIER_Q, i, i & 1);
        memcpy(x + (size_t)i * a->in_rows * D, src, sizeof(float) * (size_t)input_chunk_rows(a, i) * D);
        t->release(t, src);
        if (i + 2 < a->in_chunks) t->prefetch(t, &a->in_keys[l], TIER_Q, i + 2, i & 1);
    }
}

/* ---------------------------------------------------------------- bf16 copies */

/* bf16: after layer l's forward its own o (and q, k, v) go to their bf16 copies (exact for
 * q, k, v, which are bf16-rounded already: to_bf16 = 1), and so does the strategy's copy of
 * q, k, v (the prefix of saved: exact too), the rest of saved going to its fp32 buffer; before
 * its backward they come back (to_bf16 = 0), but for q, k, v where the strategy's backward reads
 * the bf16 copies as they are (qkv16_read). */
static void layer_convert(LlamaActs *a, int l, int to_bf16) {
    LayerActs *L = &a->layers[l];
    size_t N = (size_t)a->N, qd = (size_t)a->qd, kvd = (size_t)a->kvd;
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

/* ---------------------------------------------------------------- the policy's points */

void layer_memory_forward_begin(LlamaActs *a, int l, int backward) {
    if (a->inputs_tier && backward) input_store(a, l);
}

void layer_memory_head_begin(LlamaActs *a, int backward) {
    if (a->inputs_tier && backward) input_prefetch(a, a->n_layers - 1); /* read while the loss runs */
}

void layer_memory_backward_begin(LlamaActs *a) {
    if (a->inputs_tier) a->passes++;
}

void layer_memory_layer_backward_begin(LlamaActs *a, int l) {
    if (!a->inputs_tier) return;
    input_fetch(a, l);
    if (l > 0) input_prefetch(a, l - 1);
}

void layer_memory_attention_done(LlamaActs *a, const SeqAttention *attn, int l) {
    LayerActs *L = &a->layers[l];
    if (L->kept)
        memcpy(L->kept, L->saved + (attn->saved_floats - attn->kept_floats), sizeof(float) * attn->kept_floats);
    layer_convert(a, l, 1);
}

void layer_memory_restore_kept(LlamaActs *a, const SeqAttention *attn, int l) {
    LayerActs *L = &a->layers[l];
    if (L->kept)
        memcpy(L->saved + (attn->saved_floats - attn->kept_floats), L->kept, sizeof(float) * attn->kept_floats);
}

int layer_memory_attention_in_backward(const LlamaActs *a) {
    return a->checkpoint == LLAMA_CKPT_LAYER       ? LAYER_MEMORY_ATTENTION_AGAIN
           : a->checkpoint == LLAMA_CKPT_SELECTIVE ? LAYER_MEMORY_ATTENTION_RESTORE
                                                   : LAYER_MEMORY_ATTENTION_KEPT;
}

int layer_memory_keeps_x_mid(const LlamaActs *a) { return a->x_mid_kept; }

void layer_memory_widen(LlamaActs *a, int l, int point) {
    /* whole layers under none: the fp32 set lies in the MLP's buffers (phases_alloc); under layer
     * no layer keeps copies */
    const int late = !a->stream && a->checkpoint == LLAMA_CKPT_NONE;
    if (point == LAYER_MEMORY_BACKWARD_BEGIN ? !late && (a->stream || a->checkpoint == LLAMA_CKPT_SELECTIVE) : late)
        layer_convert(a, l, 0);
}

void layer_memory_o_for_x_mid(LlamaActs *a, int l) {
    LayerActs *L = &a->layers[l];
    /* the MLP's buffers then overwrite the widened o (phases_alloc), which the widening after them
     * makes once more */
    if (!a->stream && a->checkpoint == LLAMA_CKPT_NONE && L->o16) bf16_unpack(L->o, L->o16, (size_t)a->N * a->qd);
}
