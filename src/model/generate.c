/* Incremental decoding with a key/value cache and next-token sampling; see generate.h. Every op
 * but attention is the training kernel (ops.h) applied to the new tokens only; attention is each
 * new token's softmax over the cached keys, accumulated in double. */
#include "model/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

/* The scratch of both kinds of generator, and the cache unless `attend`. */
static int init(Generator *g, const LlamaModel *m, int max_len, int max_chunk, GeneratorAttend attend, void *ctx,
                SeqErr *e) {
    memset(g, 0, sizeof *g);
    if (max_len <= 0 || max_chunk <= 0)
        return seq_err(e, "generation needs room for at least one token (got %d tokens, chunks of %d)", max_len,
                       max_chunk);
    const LlamaConfig *c = &m->cfg;
    size_t T = (size_t)(max_chunk < max_len ? max_chunk : max_len);
    size_t D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size;
    size_t qd = (size_t)c->num_attention_heads * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
    g->m = m;
    g->max_len = max_len;
    g->max_chunk = (int)T;
    g->attend = attend;
    g->attend_ctx = ctx;
    if (!attend) {
        size_t cache = (size_t)c->num_hidden_layers * (size_t)max_len * kvd;
        g->k_cache = xmalloc(sizeof(float) * (cache ? cache : 1));
        g->v_cache = xmalloc(sizeof(float) * (cache ? cache : 1));
        g->scores = xmalloc(sizeof(double) * (size_t)max_len);
    }
    g->x = xmalloc(sizeof(float) * T * D);
    g->xn = xmalloc(sizeof(float) * T * D);
    g->q = xmalloc(sizeof(float) * T * qd);
    g->k = xmalloc(sizeof(float) * T * kvd);
    g->v = xmalloc(sizeof(float) * T * kvd);
    g->o = xmalloc(sizeof(float) * (T * qd + (size_t)c->head_dim)); /* + one widened cache row */
    g->gate = xmalloc(sizeof(float) * T * F);
    g->up = xmalloc(sizeof(float) * T * F);
    g->h = xmalloc(sizeof(float) * T * F);
    g->rstd = xmalloc(sizeof(float) * T * (size_t)c->num_attention_heads); /* per head: q/k norms */
    g->rope_cos = xmalloc(sizeof(float) * T * (size_t)(c->head_dim / 2 > 0 ? c->head_dim / 2 : 1));
    g->rope_sin = xmalloc(sizeof(float) * T * (size_t)(c->head_dim / 2 > 0 ? c->head_dim / 2 : 1));
    g->positions = xmalloc(sizeof(int) * T);
    g->acc = xmalloc(sizeof(double) * (size_t)(c->head_dim > 0 ? c->head_dim : 1));
    return 0;
}

int generator_init(Generator *g, const LlamaModel *m, int max_len, int max_chunk, SeqErr *e) {
    return init(g, m, max_len, max_chunk, NULL, NULL, e);
}

int generator_init_attend(Generator *g, const LlamaModel *m, int max_len, int max_chunk, GeneratorAttend attend,
                          void *ctx, SeqErr *e) {
    return init(g, m, max_len, max_chunk, attend, ctx, e);
}

void generator_free(Generator *g) {
    xfree(g->k_cache); xfree(g->v_cache); xfree(g->x); xfree(g->xn); xfree(g->q); xfree(g->k); xfree(g->v);
    xfree(g->o); xfree(g->gate); xfree(g->up); xfree(g->h); xfree(g->rstd); xfree(g->rope_cos); xfree(g->rope_sin);
    xfree(g->scores); xfree(g->positions); xfree(g->acc); xfree(g->k16_cache); xfree(g->v16_cache);
    bf16_scratch_free(&g->mm);
    memset(g, 0, sizeof *g);
}

/* Row j of a layer's cached keys or values (kvd floats a row; `f` fp32 or `h` bf16 words), head kh's
 * d values as floats: in place (fp32) or widened into tmp (bf16, exact). */
static const float *cache_row(const float *f, const bf16_t *h, size_t j, size_t kvd, int kh, int d, float *tmp) {
    if (f) return f + j * kvd + (size_t)kh * d;
    const bf16_t *r = h + j * kvd + (size_t)kh * d;
    for (int i = 0; i < d; i++) tmp[i] = bf16_to_float(r[i]);
    return tmp;
}

int generator_set_precision(Generator *g, int precision, SeqErr *e) {
    if (g->len > 0) return seq_err(e, "internal: a generator's precision is set before its first token");
    g->precision = precision;
    if (g->attend || precision != PRECISION_BF16 || g->k16_cache) return 0;
    const LlamaConfig *c = &g->m->cfg;
    const size_t cache = (size_t)c->num_hidden_layers * (size_t)g->max_len * c->num_key_value_heads * c->head_dim;
    xfree(g->k_cache);
    xfree(g->v_cache);
    g->k_cache = g->v_cache = NULL;
    g->k16_cache = xmalloc(sizeof(bf16_t) * (cache ? cache : 1));
    g->v16_cache = xmalloc(sizeof(bf16_t) * (cache ? cache : 1));
    return 0;
}

/* o (n, H d) = causal softmax attention of the n new queries (at positions len..len+n-1) over the
 * layer's cached keys and values 0..len+n-1 (the new ones already appended); under the layer's
 * sliding window W (llama_layer_window) the query at p over keys p - W + 1 .. p only. Scores,
 * softmax and the weighted sum in double, each value summed over the keys in order. */
static void cached_attention(Generator *g, int layer, int n) {
    const LlamaConfig *c = &g->m->cfg;
    int H = c->num_attention_heads, Hkv = c->num_key_value_heads, d = c->head_dim, group = H / Hkv;
    size_t kvd = (size_t)Hkv * d, at = (size_t)layer * g->max_len * kvd;
    const float *K = g->k_cache ? g->k_cache + at : NULL, *V = g->v_cache ? g->v_cache + at : NULL;
    const bf16_t *K16 = g->k16_cache ? g->k16_cache + at : NULL, *V16 = g->v16_cache ? g->v16_cache + at : NULL;
    float *tmp = g->o + (size_t)n * H * d; /* d floats past the n rows: init allots them */
    double scale = 1.0 / sqrt((double)d);
    const int window = llama_layer_window(c, layer);
    for (int t = 0; t < n; t++) {
        const int last = g->len + t; /* attends to keys first..last */
        const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
        for (int h = 0; h < H; h++) {
            const float *q = g->q + ((size_t)t * H + h) * d;
            int kh = h / group;
            double mx = -INFINITY;
            for (int j = first; j <= last; j++) {
                const float *k = cache_row(K, K16, (size_t)j, kvd, kh, d, tmp);
                double s = 0;
                for (int i = 0; i < d; i++) s += (double)q[i] * k[i];
                s *= scale;
                g->scores[j] = s;
                if (s > mx) mx = s;
            }
            double sum = 0;
            for (int j = first; j <= last; j++) sum += g->scores[j] = exp(g->scores[j] - mx);
            for (int i = 0; i < d; i++) g->acc[i] = 0;
            for (int j = first; j <= last; j++) {
                const float *v = cache_row(V, V16, (size_t)j, kvd, kh, d, tmp);
                for (int i = 0; i < d; i++) g->acc[i] += g->scores[j] * v[i];
            }
            float *o = g->o + ((size_t)t * H + h) * d;
            for (int i = 0; i < d; i++) o[i] = (float)(g->acc[i] / sum);
        }
    }
}

/* The generator's matrix multiplies: out (n, n_out) (+)= in (n, n_in) W^T, in fp32 or on bf16
 * operands (in holds bf16 values already: every input here is made rounded). */
static void mm(Generator *g, float *out, const float *in, const float *W, int n, int n_in, int n_out, int accumulate) {
    if (g->precision == PRECISION_BF16)
        linear_forward_bf16_ld(out, n_out, in, n_in, W, n, n_in, n_out, accumulate, BF16_IN_ROUNDED, &g->mm);
    else linear_forward(out, in, W, n, n_in, n_out, accumulate);
}

/* RMSNorm into an input of the products: rounded to bf16 values under bf16. */
static void norm(Generator *g, float *out, const float *x, const float *w, int n, int D, float eps) {
    if (g->precision == PRECISION_BF16) rmsnorm_forward_bf16(out, g->rstd, x, w, n, D, eps);
    else rmsnorm_forward(out, g->rstd, x, w, n, D, eps);
}

int generator_forward(Generator *g, const int *tokens, int n, float *logits, float *last, SeqErr *e) {
    const LlamaModel *m = g->m;
    const LlamaConfig *c = &m->cfg;
    int D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, H = c->num_attention_heads;
    int Hkv = c->num_key_value_heads, hd = c->head_dim;
    size_t kvd = (size_t)Hkv * hd;
    if (n <= 0) return 0;
    if (n > g->max_chunk) return seq_err(e, "internal: %d tokens in one call, at most %d", n, g->max_chunk);
    if (g->len + n > g->max_len)
        return seq_err(e, "the sequence would reach %d tokens, beyond the %d this generator holds: ask for fewer new "
                       "tokens or a shorter prompt", g->len + n, g->max_len);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return seq_err(e, "token %d is outside the model's vocabulary (vocab_size %d)", tokens[i], V);
        g->positions[i] = g->len + i;
    }
    if (c->rope_type == LLAMA_ROPE_DEFAULT) {
        rope_tables(g->rope_cos, g->rope_sin, g->positions, n, hd, c->rope_theta);
    } else {
        double *inv_freq = xmalloc(sizeof *inv_freq * (size_t)(hd / 2));
        for (int j = 0; j < hd / 2; j++) inv_freq[j] = llama_rope_inv_freq(c, j);
        rope_tables_freq(g->rope_cos, g->rope_sin, g->positions, n, hd, inv_freq);
        xfree(inv_freq);
    }
    embedding_forward(g->x, tokens, m->w.embed, n, D);
    const int bf16 = g->precision == PRECISION_BF16;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const LlamaLayerWeights *w = &m->w.layers[l];
        norm(g, g->xn, g->x, w->input_norm, n, D, c->rms_norm_eps);
        mm(g, g->q, g->xn, w->q_proj, n, D, H * hd, 0);
        mm(g, g->k, g->xn, w->k_proj, n, D, Hkv * hd, 0);
        mm(g, g->v, g->xn, w->v_proj, n, D, Hkv * hd, 0);
        if (w->q_bias) {
            bias_add_rows(g->q, (size_t)H * hd, w->q_bias, n, H * hd);
            bias_add_rows(g->k, (size_t)Hkv * hd, w->k_bias, n, Hkv * hd);
            bias_add_rows(g->v, (size_t)Hkv * hd, w->v_bias, n, Hkv * hd);
        }
        if (w->q_norm) { /* Qwen3: each head of q and k normed before RoPE, in fp32 */
            rmsnorm_forward(g->q, g->rstd, g->q, w->q_norm, n * H, hd, c->rms_norm_eps);
            rmsnorm_forward(g->k, g->rstd, g->k, w->k_norm, n * Hkv, hd, c->rms_norm_eps);
        }
        if (bf16) { /* attention's inputs are bf16 values, as train's (llama.c's qkv_rows) */
            rope_forward_bf16(g->q, g->rope_cos, g->rope_sin, n, H, hd);
            rope_forward_bf16(g->k, g->rope_cos, g->rope_sin, n, Hkv, hd);
            bf16_round(g->v, (size_t)n * kvd);
        } else {
            rope_forward(g->q, g->rope_cos, g->rope_sin, n, H, hd);
            rope_forward(g->k, g->rope_cos, g->rope_sin, n, Hkv, hd);
        }
        if (g->attend) {
            g->attend(g->attend_ctx, l, n, g->positions, g->q, g->k, g->v, g->o);
        } else {
            size_t at = ((size_t)l * g->max_len + (size_t)g->len) * kvd;
            if (bf16) { /* bf16 values: the words hold them exactly */
                bf16_pack(g->k16_cache + at, g->k, (size_t)n * kvd);
                bf16_pack(g->v16_cache + at, g->v, (size_t)n * kvd);
            } else {
                memcpy(g->k_cache + at, g->k, sizeof(float) * (size_t)n * kvd);
                memcpy(g->v_cache + at, g->v, sizeof(float) * (size_t)n * kvd);
            }
            cached_attention(g, l, n);
        }
        if (bf16) bf16_round(g->o, (size_t)n * H * hd); /* o_proj's operand, as train rounds it */
        mm(g, g->x, g->o, w->o_proj, n, H * hd, D, 1); /* x += o_proj(o) */
        if (w->o_bias) bias_add_rows(g->x, (size_t)D, w->o_bias, n, D);
        norm(g, g->xn, g->x, w->post_norm, n, D, c->rms_norm_eps);
        mm(g, g->gate, g->xn, w->gate_proj, n, D, F, 0);
        mm(g, g->up, g->xn, w->up_proj, n, D, F, 0);
        if (bf16) swiglu_forward_bf16(g->h, g->gate, g->up, (size_t)n * F);
        else swiglu_forward(g->h, g->gate, g->up, (size_t)n * F);
        mm(g, g->x, g->h, w->down_proj, n, F, D, 1); /* x += down(h) */
    }
    g->len += n;
    norm(g, g->xn, g->x, m->w.final_norm, n, D, c->rms_norm_eps);
    if (logits) mm(g, logits, g->xn, m->w.lm_head, n, D, V, 0);
    if (last) mm(g, last, g->xn + (size_t)(n - 1) * D, m->w.lm_head, 1, D, V, 0);
    return 0;
}

static int by_logit_desc(const void *a, const void *b) {
    const float *x = *(const float *const *)a, *y = *(const float *const *)b;
    if (*x != *y) return *x > *y ? -1 : 1;
    return x < y ? -1 : x > y; /* ties: the lower id first */
}

int sample_next_token(const float *logits, int V, const SampleParams *sp, const int *ids, long n_ids, Rng *rng) {
    float *l = xmalloc(sizeof(float) * (size_t)V);
    memcpy(l, logits, sizeof(float) * (size_t)V);
    if (sp->repetition_penalty != 1.0) { /* in float32, as transformers on float32 logits; each id once */
        const float r = (float)sp->repetition_penalty;
        unsigned char *seen = xcalloc((size_t)V, 1);
        for (long i = 0; i < n_ids; i++)
            if (ids[i] >= 0 && ids[i] < V && !seen[ids[i]]) {
                seen[ids[i]] = 1;
                l[ids[i]] = l[ids[i]] < 0 ? l[ids[i]] * r : l[ids[i]] / r;
            }
        xfree(seen);
    }
    int id = 0;
    if (sp->temperature <= 0) {
        for (int i = 1; i < V; i++)
            if (l[i] > l[id]) id = i;
        xfree(l);
        return id;
    }
    int k = sp->top_k <= 0 || sp->top_k > V ? V : sp->top_k;
    const float **order = xmalloc(sizeof(float *) * (size_t)V);
    for (int i = 0; i < V; i++) order[i] = l + i;
    qsort(order, (size_t)V, sizeof *order, by_logit_desc);
    double *p = xmalloc(sizeof(double) * (size_t)k), sum = 0, top = *order[0];
    for (int i = 0; i < k; i++) sum += p[i] = exp(((double)*order[i] - top) / sp->temperature);
    if (sp->top_p < 1) { /* keep a token while the more likely ones before it hold less than top_p */
        double before = 0;
        int keep = 0;
        while (keep < k && (keep == 0 || before < sp->top_p * sum)) before += p[keep++];
        k = keep;
        sum = before;
    }
    double r = rng_uniform(rng) * sum;
    int pick = k - 1;
    for (int i = 0; i < k; i++) {
        r -= p[i];
        if (r < 0) {
            pick = i;
            break;
        }
    }
    id = (int)(order[pick] - l);
    xfree(order);
    xfree(p);
    xfree(l);
    return id;
}
