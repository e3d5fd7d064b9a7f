/* The memory model of `seqpar sample` (see sample_memory.h): each term mirrors an allocation of
 * cli/cmd_sample.c, train/dist_generate.c, parallel/kv_shard.c, model/generate.c and, for the
 * prefill, model/layer_memory.c's forward-only activations (whole layers, one shared layer set). */
#include "plan/sample_memory.h"

#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "model/layer_memory.h"
#include "parallel/block_attention.h"
#include "parallel/head_exchange.h"
#include "plan/memory_model.h"
#include "strategies/registry.h"

#define MAX_INTO(x, y) ((x) = (y) > (x) ? (y) : (x))

/* Bytes of the bf16 products' operand copies (ops.c's Bf16Scratch, kept across calls: the largest
 * call's two copies) over calls of n rows (in already rounded: only W is copied on the conversion
 * path), `calls` (rows, n_in, row stride of in, n_out) of them. */
static double mm_scratch(const double (*calls)[4], int n) {
    double b = 0;
    for (int i = 0; i < n; i++) {
        const double rows_in = calls[i][0] * calls[i][2], w = calls[i][1] * calls[i][3];
        if (bf16_products_on_sgemm()) MAX_INTO(b, 4.0 * (double)bf16_scratch_f32_elems(0, (size_t)w));
        else MAX_INTO(b, 2.0 * (double)bf16_scratch_elems((size_t)rows_in, (size_t)w));
    }
    return b;
}

/* A generator's scratch for T rows (model/generate.c's init), its bf16 copies included. */
static double generator_bytes(const LlamaConfig *c, double T, int bf16) {
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, d = c->head_dim;
    const double qd = (double)c->num_attention_heads * d, kvd = (double)c->num_key_value_heads * d;
    double b = 4 * (2 * T * D + 2 * T * qd + d + 2 * T * kvd + 3 * T * F + T * c->num_attention_heads + T * d + T) + 8 * d;
    if (bf16) {
        const double calls[][4] = {{T, D, D, qd}, {T, D, D, kvd}, {T, qd, qd, D}, {T, D, D, F}, {T, F, F, D}, {1, D, D, V}};
        b += mm_scratch(calls, 6);
    }
    return b;
}

char *sample_memory_estimate(const LlamaConfig *c, const ParallelConfig *pc_in, int world, int threads, long prompt,
                             long new_tokens, int precision, SampleMemory *out) {
    memset(out, 0, sizeof *out);
    const int bf16 = precision == PRECISION_BF16;
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, L = c->num_hidden_layers;
    const double d = c->head_dim, H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const double qd = H * d, kvd = Hkv * d, e = bf16 ? 2 : 4; /* bytes of a cached value */
    double E, Lu, Tl;
    memory_model_unit_sizes(c, &E, &Lu, &Tl);
    out->weights = 4 * (E + L * Lu + Tl);
    const double total_len = (double)prompt + (double)new_tokens;
    const double common = 4 * V /* the logits */ + 4 * (total_len + prompt) /* the context, the prompt */;
    if (prompt < 1) return xstrdup_printf("a prompt of %ld tokens: give at least one", prompt);
    if (!pc_in->strategy && world == 1) { /* one process's own generator (model/generate.c) */
        const double T = prompt < 512 ? (double)prompt : 512;
        out->seq_len = out->n_local = prompt;
        out->hp = out->cp = 1;
        out->cache = 2 * L * total_len * kvd * e;
        out->decode = generator_bytes(c, T, bf16) + 8 * total_len /* scores */ + common;
        out->total = out->weights + out->cache + out->decode;
        return NULL;
    }
    const Strategy *s = strategy_named(pc_in->strategy);
    if (!s) return strategy_unknown_message(pc_in->strategy);
    ParallelConfig pc = *pc_in;
    int hp = 1, cp = 1;
    if (!pc.hp && !pc.cp) { /* cmd_sample's rule: a grid leaving ranks over puts them all in the context ring */
        char *err = strategy_grid(s, 0, 0, world, c->num_attention_heads, &hp, &cp);
        if (!err && hp * cp < world) pc.cp = world;
        xfree(err);
    }
    char *err = strategy_grid(s, pc.hp, pc.cp, world, c->num_attention_heads, &hp, &cp);
    if (err) return err;
    if (hp * cp != world)
        return xstrdup_printf("--strategy %s splits the prompt over hp %d x cp %d = %d of the %d ranks: give --hp and --cp "
                              "with hp x cp = %d", s->name, hp, cp, hp * cp, world, world);
    StrategyParams sp;
    /* the padded prompt, as seq_parallel_check_fit pads it */
    const long S = strategy_fit_length(s, &pc, 1, hp, cp, prompt, c->num_attention_heads, c->num_key_value_heads,
                                       c->head_dim, bf16, &sp);
    if (S < 0) {
        strategy_params_init(s, &pc, 1, hp, cp, prompt, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                             bf16, &sp);
        err = strategy_check(s, &sp);
        return err ? err : xstrdup_printf("--strategy %s splits no length near %ld", s->name, prompt);
    }
    sp.attn_bf16 = 0; /* cmd_sample: the prefill's attention keeps fp32 probabilities */
    const int sp_ranks = hp * cp, own = s->own != NULL;
    const double N = (double)(S / sp_ranks);
    out->seq_len = S;
    out->n_local = (long)N;
    out->hp = hp;
    out->cp = cp;
    /* the cache shard: the rank's prompt rows and its share of the new ones (dist_generate.c) */
    const double cap = N + (double)((new_tokens + world - 1) / world) + 1;
    out->cache = 2 * L * cap * kvd * e + 4 * cap + 8 * cap + 8 * H * (d + 2) * (1 + world);
    /* decode: the generator's one row, kept from before the prefill; its bf16 copies, made by the first token */
    const double gen_rows = generator_bytes(c, 1, 0), gen_bf16 = generator_bytes(c, 1, bf16) - gen_rows;
    out->decode = gen_rows + gen_bf16 + common + 4 * N /* the layout's positions (SeqParallel) */;

    /* the prefill: forward-only activations (layer_memory.c), whole layers */
    long rows;
    const long K = llama_ffn_chunks_default(c, (long)N, 0, 1);
    llama_ffn_chunk_count((long)N, K, 1, (long)N, &rows);
    const double Xr = (double)rows, ldF = linear_row_stride(c->intermediate_size);
    double acts = N * D /* the residual stream */ + N * d /* RoPE */ + N /* final rstd */ + Xr * D /* xn */ +
                  (N < 256 ? N : 256) * V /* the loss chunk's workspace */ + 2 * N /* rstd1, rstd2 */ + N * qd /* o */;
    if (c->qk_norm) acts += Xr * (H > Hkv ? H : Hkv) * (1 + d);
    double prefill_most = 0;
    for (int hr = 0; hr < (sp_ranks > 1 || own ? hp : 1); hr++) {
        double saved, attn_buf, nq, group, kv_heads, qkv_layer = 0, qkv_phase = 0;
        if (sp_ranks > 1 || own) {
            AttnMemory am;
            strategy_memory(s, &sp, hr, &am);
            saved = (double)am.saved_per_layer;
            attn_buf = (double)am.workspace + (own ? 0 : (double)S * (double)(sizeof(PosRun) / sizeof(float)));
            nq = (double)am.rows_per_call;
            HeadSplit hs;
            err = head_split_init(&hs, hp, c->num_attention_heads, c->num_key_value_heads);
            if (err) return err;
            kv_heads = hs.hk[hr];
            group = hs.hk[hr] > 0 ? (double)hs.hl[hr] / hs.hk[hr] : 1;
            head_split_free(&hs);
            qkv_phase = N * (qd + 2 * kvd); /* q, k, v in dq, dk, dv (the strategy keeps its own copies) */
        } else { /* local_attention.c */
            saved = N * H;
            attn_buf = N + N * H;
            nq = N;
            kv_heads = Hkv;
            group = H / Hkv;
            qkv_layer = N * (qd + 2 * kvd);
        }
        const double mlp_phase = 3 * Xr * ldF;
        double b = 4 * (acts + saved + qkv_layer + (mlp_phase > qkv_phase ? mlp_phase : qkv_phase) + attn_buf +
                        memory_model_flash_floats(threads, nq, nq, (int)kv_heads, (int)group, c->head_dim));
        if (bf16) {
            const double calls[][4] = {{Xr, D, D, qd}, {Xr, D, D, kvd}, {Xr, qd, qd, D}, {Xr, D, D, F}, {Xr, F, ldF, D},
                                       {1, D, D, V}};
            b += mm_scratch(calls, 6);
        }
        b += 4 * ((double)S + 2 * N) /* the tokens, local tokens, rows */ + 4 * V /* the last row's logits */ + 4 * D;
        MAX_INTO(prefill_most, b);
    }
    out->prefill = prefill_most;
    /* kept throughout: weights, cache, the generator's rows; then the prefill or decode's copies */
    out->total = out->weights + out->cache + gen_rows + common + 4 * N + (prefill_most > gen_bf16 ? prefill_most : gen_bf16);
    return NULL;
}

long sample_memory_longest(const LlamaConfig *c, const ParallelConfig *pc, int world, int threads, long new_tokens,
                           int precision, double budget, long limit) {
    long lo = 0, hi = limit; /* lo fits (0: none yet); find the largest that fits */
    while (lo < hi) {
        const long mid = lo + (hi - lo + 1) / 2;
        SampleMemory m;
        char *err = sample_memory_estimate(c, pc, world, threads, mid, new_tokens, precision, &m);
        const int fits = !err && m.total <= budget;
        xfree(err);
        if (fits) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
