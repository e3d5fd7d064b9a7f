/* Whole-model exactness: loss and every parameter gradient of seqpar's Llama against fixtures
 * written once by Hugging Face transformers in float64 (tests/fixtures, see its README), under
 * every checkpoint mode (none, layer, selective: bit-identical to each other for one FFN chunk
 * count) and FFN chunk count (1, 2, 3: within the fixture tolerance of each other), from F32 and
 * BF16 weight files; and the activation memory of each mode and chunk count, byte for byte. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attention/seq_attention.h"
#include "io/param_io.h"
#include "core/common.h"
#include "data/tokens.h"
#include "io/config_json.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/llama.h"
#include "testlib.h"

#ifndef FIXTURES
#define FIXTURES "tests/fixtures"
#endif

static double json_number(const char *path, const char *key) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) die("cannot parse %s: %s", path, err.text);
    json_t *v = json_object_get(root, key);
    double x = v ? json_number_value(v) : NAN;
    json_decref(root);
    return x;
}

/* Runs forward+backward of the fixture's model on its tokens; returns the mean loss. */
/* layer_memory.c's phases_alloc: the MLP's buffers (h, and gate and up unless kept whole) and the
 * attention half's (dq, dk, dv, dout) share one buffer as large as the larger, each part rounded
 * up to 16 floats. Floats, for fp32 on MLP chunks of `rows` rows. */
static size_t r16(size_t n) { return (n + 15) / 16 * 16; }
static size_t phases_floats(size_t rows, int gate_up_whole, size_t F, size_t S, size_t qd, size_t kvd) {
    size_t mlp = r16(rows * F) * (gate_up_whole ? 1 : 3), att = 2 * r16(S * qd) + 2 * r16(S * kvd);
    return mlp > att ? mlp : att;
}

static double run_fixture(const char *dir, const char *weights, int checkpoint, int ffn_chunks, LlamaModel *m,
                          size_t *acts_bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    LlamaConfig cfg;
    config_json_load(path, &cfg);
    llama_build(m, &cfg);
    snprintf(path, sizeof path, "%s/%s", dir, weights);
    params_load_safetensors(path, &m->table, m->params, cfg.tie_word_embeddings);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    int S = (int)json_number(path, "seq_len");
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    TokenData td;
    tokens_load(path, TOKENS_LLMC, &td);
    int in[4096], tg[4096], pos[4096];
    for (int i = 0; i < S; i++) {
        in[i] = (int)td.tokens[i];
        tg[i] = (int)td.tokens[i + 1];
        pos[i] = i;
    }
    SeqAttention *attn = local_attention_create((AttnHeads){.n_local = S, .n_heads = cfg.num_attention_heads,
                                                            .n_kv_heads = cfg.num_key_value_heads,
                                                            .head_dim = cfg.head_dim});
    size_t before = mem_tracked_current();
    LlamaActsOptions ao = {.checkpoint = checkpoint, .ffn_chunks = ffn_chunks};
    LlamaActs *acts = llama_acts_create_opts(m, attn, S, &ao);
    if (acts_bytes) *acts_bytes = mem_tracked_current() - before;
    double loss = llama_forward_backward(m, acts, attn, in, tg, pos, S, 1.0f / S, 1, NULL) / S;
    llama_acts_free(acts);
    seq_attention_destroy(attn);
    tokens_free(&td);
    return loss;
}

/* The forward alone of a fixture's model over its tokens: llama_forward_backward with backward 0 on
 * activations of checkpoint mode `mode`, or (mode < 0) llama_forward_scores on activations made
 * forward only, its per-token losses in token_loss (S). Returns the sum; *acts_bytes the
 * activations' bytes. */
static double forward_fixture(const char *dir, int mode, size_t *acts_bytes, double *token_loss) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    LlamaConfig cfg;
    config_json_load(path, &cfg);
    LlamaModel m;
    llama_build(&m, &cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    params_load_safetensors(path, &m.table, m.params, cfg.tie_word_embeddings);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    int S = (int)json_number(path, "seq_len");
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    TokenData td;
    tokens_load(path, TOKENS_LLMC, &td);
    int in[4096], tg[4096], pos[4096];
    for (int i = 0; i < S; i++) {
        in[i] = (int)td.tokens[i];
        tg[i] = i % 5 == 3 ? -1 : (int)td.tokens[i + 1]; /* some targets ignored */
        pos[i] = i;
    }
    SeqAttention *attn = local_attention_create((AttnHeads){.n_local = S, .n_heads = cfg.num_attention_heads,
                                                            .n_kv_heads = cfg.num_key_value_heads,
                                                            .head_dim = cfg.head_dim});
    size_t before = mem_tracked_current();
    LlamaActsOptions ao = {.checkpoint = mode < 0 ? LLAMA_CKPT_NONE : mode, .forward_only = mode < 0};
    LlamaActs *acts = llama_acts_create_opts(&m, attn, S, &ao);
    *acts_bytes = mem_tracked_current() - before;
    double sum = mode < 0 ? llama_forward_scores(&m, acts, attn, in, tg, pos, NULL, S, token_loss, NULL)
                          : llama_forward_backward(&m, acts, attn, in, tg, pos, S, 1.0f, 0, NULL);
    llama_acts_free(acts);
    seq_attention_destroy(attn);
    tokens_free(&td);
    llama_free(&m);
    return sum;
}

/* Per tensor: |ours - ref| <= 1e-4 * max|ref| + 1e-7 elementwise. The reference is float64
 * rounded to F32; ours accumulates in fp32 over at most a few hundred terms per dot product,
 * whose error is ~1e-6 of the tensor's scale (seen: <= 1.1e-6), so 1e-4 leaves a margin of
 * ~100 while a wrong formula is off by O(1). */
static void compare_grads(const char *name, const LlamaModel *m, const char *grads_path) {
    StFile f;
    st_open(grads_path, &f);
    CHECK(f.n_tensors == m->table.n, "%s: fixture has %d gradient tensors, model %d", name, f.n_tensors, m->table.n);
    for (int i = 0; i < m->table.n; i++) {
        const ParamTensor *p = &m->table.t[i];
        float *ref = xmalloc(sizeof(float) * p->numel);
        st_read_f32(&f, p->name, p->ndim, p->shape, ref);
        const float *ours = m->grads + p->offset;
        double scale = 0, worst = 0;
        for (size_t j = 0; j < p->numel; j++) scale = fmax(scale, fabs(ref[j]));
        for (size_t j = 0; j < p->numel; j++) {
            double e = fabs((double)ours[j] - ref[j]);
            if (!(e <= worst)) worst = e;
        }
        CHECK(worst <= 1e-4 * scale + 1e-7, "%s: gradient of %s off by %.3g (tensor scale %.3g)", name, p->name,
              worst, scale);
        xfree(ref);
    }
    st_close(&f);
}

/* rng_jump(n) leaves the state n calls of rng_u64 would (n below and above the table's 64, powers of
 * two and their neighbours, a jump in two parts), and a jumped stream goes on drawing the same. */
static void test_rng_jump(void) {
    const uint64_t ns[] = {0, 1, 2, 63, 64, 65, 127, 128, 1000, 4096, 65537, (1u << 20) + 3, 2 * 13000003ull};
    int bad = 0;
    for (size_t k = 0; k < ARRAY_LEN(ns); k++) {
        Rng a, b;
        rng_seed(&a, 91 + k);
        rng_seed(&b, 91 + k);
        for (uint64_t i = 0; i < ns[k]; i++) (void)rng_u64(&a);
        if (k % 2) rng_jump(&b, ns[k]);
        else rng_jump(&b, ns[k] / 3), rng_jump(&b, ns[k] - ns[k] / 3);
        bad += memcmp(&a, &b, sizeof a) != 0 || rng_u64(&a) != rng_u64(&b);
    }
    CHECK(bad == 0, "rng_jump: %d of %zu jumps differ from the serial draws", bad, ARRAY_LEN(ns));
}

/* llama_init_random(_part) makes each thread's share from the stream jumped to it (rng_jump): the
 * same values as the plain serial rng_normal loop, bit for bit, whole and in parts that start and
 * end inside its blocks of 65536 elements and inside tensors (the rest left untouched), on one
 * thread and on several. tiny_long's shape with a vocabulary of 5000 (embedding and head 160000
 * elements each). */
static void test_init_random(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tiny_long/config.json", FIXTURES);
    LlamaConfig cfg;
    config_json_load(path, &cfg);
    cfg.vocab_size = 5000;
    LlamaModel m;
    llama_build(&m, &cfg);
    const size_t n = m.table.total;
    float *ref = xmalloc(sizeof(float) * n);
    Rng rng;
    rng_seed(&rng, 77);
    for (int i = 0; i < m.table.n; i++) {
        const ParamTensor *p = &m.table.t[i];
        for (size_t j = 0; j < p->numel; j++)
            ref[p->offset + j] = p->ndim == 1 ? 1.0f : (float)(0.02 * rng_normal(&rng));
    }
    const size_t parts[][2] = {{0, n}, {0, 1}, {70001, 170003}, {n - 65537, n}, {131072, 196608}, {5, 5}};
    const int threads[] = {1, 2, 3};
    int bad_parts = 0, bad_outside = 0;
    for (size_t t = 0; t < ARRAY_LEN(threads); t++) {
        omp_set_num_threads(threads[t]);
        for (size_t k = 0; k < ARRAY_LEN(parts); k++) {
            const size_t lo = parts[k][0], hi = parts[k][1];
            memset(m.params, 0xff, sizeof(float) * n); /* NaN everywhere first */
            if (lo == 0 && hi == n) llama_init_random(&m, 77);
            else llama_init_random_part(&m, 77, lo, hi);
            bad_parts += memcmp(m.params + lo, ref + lo, sizeof(float) * (hi - lo)) != 0;
            for (size_t j = 0; j < n; j++) {
                uint32_t u;
                memcpy(&u, m.params + j, sizeof u);
                if ((j < lo || j >= hi) && u != 0xffffffffu) { bad_outside++; break; }
            }
        }
    }
    omp_set_num_threads(omp_get_num_procs());
    CHECK(bad_parts == 0 && bad_outside == 0 && n > 2 * 160000,
          "random initialisation: %d of %zu parts differ from the serial draws, %d wrote outside their part",
          bad_parts, ARRAY_LEN(parts) * ARRAY_LEN(threads), bad_outside);
    xfree(ref);
    llama_free(&m);
}

int main(void) {
    test_rng_jump();
    test_init_random();
    const char *fixtures[] = {"tiny_mha", "tiny_gqa_tied", "tiny_headdim", "tiny_long", "tiny_llama3", "tiny_linear",
                                "tiny_wide_ffn", "tiny_qwen2", "tiny_attn_bias", "tiny_qwen3", "tiny_qwen3_bias",
                                "tiny_mistral_window", "tiny_qwen2_window"};
    for (size_t k = 0; k < ARRAY_LEN(fixtures); k++) {
        char dir[256], path[512];
        snprintf(dir, sizeof dir, "%s/%s", FIXTURES, fixtures[k]);
        snprintf(path, sizeof path, "%s/expected.json", dir);
        double expected = json_number(path, "loss");
        LlamaModel m;
        size_t bytes1 = 0;
        double loss = run_fixture(dir, "model.safetensors", LLAMA_CKPT_NONE, 1, &m, &bytes1);
        CHECK(fabs(loss - expected) <= 1e-5 * fabs(expected), "%s: loss %.9f, reference %.9f", fixtures[k], loss,
              expected);
        snprintf(path, sizeof path, "%s/grads.safetensors", dir);
        compare_grads(fixtures[k], &m, path);

        snprintf(path, sizeof path, "%s/config.json", dir);
        LlamaConfig cfg;
        config_json_load(path, &cfg);
        snprintf(path, sizeof path, "%s/expected.json", dir);
        size_t S = (size_t)json_number(path, "seq_len"), L = (size_t)cfg.num_hidden_layers;
        size_t qd = (size_t)cfg.num_attention_heads * cfg.head_dim, kvd = (size_t)cfg.num_key_value_heads * cfg.head_dim;
        /* the MLP's rows are laid out ldF floats apart (ops.h linear_row_stride: tiny_wide_ffn's 512
         * wide rows 528 apart; the others' unpadded) */
        const size_t F = (size_t)linear_row_stride(cfg.intermediate_size);
        CHECK((F != (size_t)cfg.intermediate_size) == (cfg.intermediate_size % 512 == 0),
              "%s: F = %d laid out %zu floats apart", fixtures[k], cfg.intermediate_size, F);
        for (int chunks = 1; chunks <= 3; chunks++) {
            /* the chunked MLP: within the HF tolerance (weight gradients sum over tokens chunk by
             * chunk); every checkpoint mode recomputes the same operations in the same order:
             * bit-identical to none at the same chunk count */
            LlamaModel ref;
            size_t bytes[3];
            double loss_ref = run_fixture(dir, "model.safetensors", LLAMA_CKPT_NONE, chunks, &ref, &bytes[0]);
            if (chunks > 1) {
                CHECK(fabs(loss_ref - expected) <= 1e-5 * fabs(expected), "%s: %d FFN chunks: loss %.9f, reference %.9f",
                      fixtures[k], chunks, loss_ref, expected);
                char name[128];
                snprintf(name, sizeof name, "%s (%d FFN chunks)", fixtures[k], chunks);
                snprintf(path, sizeof path, "%s/grads.safetensors", dir);
                compare_grads(name, &ref, path);
                /* gate and up are never kept whole: L x 2 N ldF floats go, and the (N, ldF) h gives
                 * way to 3 chunks of ceil(N / chunks) rows (h, gate, up; their gradients go into gate
                 * and up in place), each sharing its buffer with dq, dk, dv and dout; the normed rows
                 * and their gradient (xn, dxn: every token-wise part runs over the same chunks) to 2
                 * chunks of D */
                size_t rows = (S + (size_t)chunks - 1) / (size_t)chunks, D = (size_t)cfg.hidden_size;
                /* and a Qwen3's per-head q/k norm scratch (rstd, q or k again, its gradient) to chunks */
                const size_t heads = (size_t)(cfg.num_attention_heads > cfg.num_key_value_heads ? cfg.num_attention_heads
                                                                                                 : cfg.num_key_value_heads);
                const size_t qk = cfg.qk_norm ? heads * (1 + 2 * (size_t)cfg.head_dim) : 0;
                size_t want = bytes1 - sizeof(float) * (L * 2 * S * F + phases_floats(S, 1, F, S, qd, kvd) + 2 * S * D + S * qk) +
                              sizeof(float) * (phases_floats(rows, 0, F, S, qd, kvd) + 2 * rows * D + rows * qk);
                CHECK(bytes[0] == want, "%s: %d FFN chunks: activations %zu bytes, expected %zu", fixtures[k], chunks,
                      bytes[0], want);
            }
            for (int mode = LLAMA_CKPT_LAYER; mode <= LLAMA_CKPT_SELECTIVE; mode++) {
                LlamaModel mc;
                double loss_c = run_fixture(dir, "model.safetensors", mode, chunks, &mc, &bytes[mode]);
                CHECK(loss_c == loss_ref, "%s: loss with --checkpoint %s (%d FFN chunks) %.9g differs from %.9g",
                      fixtures[k], llama_checkpoint_name(mode), chunks, loss_c, loss_ref);
                CHECK(memcmp(mc.grads, ref.grads, sizeof(float) * ref.table.total) == 0,
                      "%s: gradients with --checkpoint %s (%d FFN chunks) are not bit-identical to none", fixtures[k],
                      llama_checkpoint_name(mode), chunks);
                llama_free(&mc);
            }
            /* selective keeps, over layer, o and the lse of every layer but one (layer has one
             * such set for its recomputation): (L - 1) (S H d + S H) floats */
            size_t extra = sizeof(float) * (L - 1) * (S * qd + S * (size_t)cfg.num_attention_heads);
            CHECK(bytes[LLAMA_CKPT_SELECTIVE] == bytes[LLAMA_CKPT_LAYER] + extra,
                  "%s: selective keeps %zu bytes more than layer, expected %zu", fixtures[k],
                  bytes[LLAMA_CKPT_SELECTIVE] - bytes[LLAMA_CKPT_LAYER], extra);
            /* (one layer: the same single set either way, but for none keeping gate and up whole
             * with one chunk, its h then alone beside the attention half's buffers) */
            const size_t none_whole = chunks == 1 ? L * 2 * S * F + phases_floats(S, 1, F, S, qd, kvd) : 0;
            const size_t sel_whole = chunks == 1 ? phases_floats(S, 0, F, S, qd, kvd) : 0;
            CHECK(L == 1 ? bytes[LLAMA_CKPT_SELECTIVE] - sizeof(float) * sel_whole ==
                               bytes[LLAMA_CKPT_NONE] - sizeof(float) * none_whole
                         : bytes[LLAMA_CKPT_SELECTIVE] < bytes[LLAMA_CKPT_NONE],
                  "%s: selective keeps %zu bytes, none %zu", fixtures[k], bytes[LLAMA_CKPT_SELECTIVE],
                  bytes[LLAMA_CKPT_NONE]);
            llama_free(&ref);
        }
        llama_free(&m);
        { /* forward only: the training forward's sum bit for bit, each token's loss (0 where ignored)
           * adding up to it, and no layer's activations: at least the L + 1 layer inputs but one,
           * x_mid and dx, L + 2 (N, D) buffers, fewer than layer checkpointing's */
            static double tl[4096];
            size_t b_fwd, b_none, b_layer;
            const double s_fwd = forward_fixture(dir, -1, &b_fwd, tl);
            const double s_none = forward_fixture(dir, LLAMA_CKPT_NONE, &b_none, NULL);
            (void)forward_fixture(dir, LLAMA_CKPT_LAYER, &b_layer, NULL);
            double sum = 0;
            int zeros = 1;
            for (size_t i = 0; i < S; i++) {
                sum += tl[i];
                if (i % 5 == 3) zeros &= tl[i] == 0.0;
                else zeros &= tl[i] > 0.0;
            }
            CHECK(s_fwd == s_none, "%s: forward-only sum %.17g, the training forward's %.17g", fixtures[k], s_fwd, s_none);
            CHECK(fabs(sum - s_fwd) <= 1e-12 * fabs(s_fwd) && zeros, "%s: per-token losses add up to %.17g, the sum "
                  "is %.17g (or an ignored target's loss is not 0)", fixtures[k], sum, s_fwd);
            const size_t fewer = sizeof(float) * (L + 2) * S * (size_t)cfg.hidden_size;
            CHECK(b_fwd + fewer <= b_layer && b_layer <= b_none, "%s: forward-only activations %zu bytes, layer's %zu, "
                  "none's %zu", fixtures[k], b_fwd, b_layer, b_none);
        }
    }
    /* The default FFN chunk count: at least 2 chunks, each of at most LLAMA_FFN_ROWS_MAX tokens
     * and of no more rows than fit, as h, gate and up (3 ldF floats a row), where the attention
     * half's dq, dk, dv, dout go (2 N (H + Hkv) d floats; the two share one buffer), but at least
     * LLAMA_FFN_ROWS_MIN (whole layers); 2u streamed; what a model's activations use when
     * --ffn-chunks is not given. The reference model (hidden 256, 4 / 2 heads of 64, ffn 1024 laid
     * out 1040 apart): 2016 rows fit at N = 8192, 1008 at 4096 and 504 at 2048 (each -> 2048), 4033
     * at 16384, 4096 from 16386; a model with a wide MLP (hidden 64, 2 / 1 heads of 32, ffn 4096
     * laid out 4112 apart) at 2048 rows (until 2026-11-29 the minimum was 512: 5, 5, 4 and 16 chunks
     * where these cases now want 4, 2, 2 and 4). */
    {
        const LlamaConfig ref = llama_reference_config();
        const LlamaConfig wide = {.hidden_size = 64, .intermediate_size = 4096, .num_attention_heads = 2,
                                  .num_key_value_heads = 1, .head_dim = 32};
        const struct { const LlamaConfig *c; long n; int stream, su, want; } cases[] = {
            {&ref, 8192, 0, 1, 4},  {&ref, 1, 0, 1, 2},     {&ref, 4096, 0, 1, 2},  {&ref, 2048, 0, 1, 2},
            {&ref, 16384, 0, 1, 5}, {&ref, 32768, 0, 1, 8}, {&ref, 32768, 1, 4, 8}, {&ref, 1 << 20, 0, 1, 256},
            {&wide, 8192, 0, 1, 4}, {&wide, 600, 0, 1, 2}};
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            const int k = llama_ffn_chunks_default(cases[i].c, cases[i].n, cases[i].stream, cases[i].su);
            CHECK(k == cases[i].want, "default FFN chunks, case %zu (N = %ld%s): %d, expected %d", i, cases[i].n,
                  cases[i].stream ? ", streamed" : "", k, cases[i].want);
        }
        char path[512];
        snprintf(path, sizeof path, "%s/tiny_mha/config.json", FIXTURES);
        LlamaConfig cfg;
        config_json_load(path, &cfg);
        LlamaModel m;
        llama_build(&m, &cfg);
        const int lens[] = {3, 8192, 8193, 20000}, want[] = {2, 2, 3, 5};
        for (size_t i = 0; i < ARRAY_LEN(lens); i++) {
            SeqAttention *attn = local_attention_create((AttnHeads){.n_local = lens[i], .n_heads = cfg.num_attention_heads,
                                                                    .n_kv_heads = cfg.num_key_value_heads,
                                                                    .head_dim = cfg.head_dim});
            LlamaActsOptions ao = {.checkpoint = LLAMA_CKPT_NONE};
            LlamaActs *acts = llama_acts_create_opts(&m, attn, lens[i], &ao);
            CHECK(llama_acts_ffn_chunks(acts) == want[i], "N = %d: %d FFN chunks by default, expected %d", lens[i],
                  llama_acts_ffn_chunks(acts), want[i]);
            llama_acts_free(acts);
            seq_attention_destroy(attn);
        }
        llama_free(&m);
    }
    /* The FFN chunks of --ffn-chunks K (llama_ffn_chunk_count: the one rule of the activations and
     * the memory model) and the K that gives a count back (llama_ffn_chunks_flag, which a resume's
     * refusal names): whole layers of N = 96 rows, K = 9 -> 11 rows -> 9 chunks, K = 11 -> 9 rows ->
     * 11, K = 13 -> 8 rows -> 12; streamed in 3 chunks of 32 rows a K is rounded up to a multiple of
     * 3 (K = 2 -> 3, 4 -> 6), so no K gives 2 or 4 there (the refusal named --ffn-chunks 2 until
     * 2026-11-29); every count a K makes is given back by one K. */
    {
        const struct { long N, K; int su; long want, rows; } cases[] = {
            {96, 9, 1, 9, 11},  {96, 11, 1, 11, 9}, {96, 13, 1, 12, 8}, {96, 200, 1, 96, 1}, {96, 2, 3, 3, 32},
            {96, 4, 3, 6, 24}, {96, 6, 3, 6, 16},  {96, 1, 3, 3, 32},  {96, 8, 2, 8, 12}};
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            long rows = 0, n = llama_ffn_chunk_count(cases[i].N, cases[i].K, cases[i].su, cases[i].N / cases[i].su, &rows);
            CHECK(n == cases[i].want && rows == cases[i].rows, "FFN chunks of K = %ld, N = %ld in %d: %ld of %ld rows, "
                  "expected %ld of %ld", cases[i].K, cases[i].N, cases[i].su, n, rows, cases[i].want, cases[i].rows);
        }
        CHECK(llama_ffn_chunks_flag(96, 2, 3, 32) == 0 && llama_ffn_chunks_flag(96, 4, 3, 32) == 0,
              "2 or 4 FFN chunks given back in 3 streamed chunks");
        CHECK(llama_ffn_chunks_flag(96, 2, 1, 96) == 2 && llama_ffn_chunks_flag(96, 2, 2, 48) == 2 &&
                  llama_ffn_chunks_flag(96, 6, 3, 32) == 6, "the count itself not given back as its K");
        CHECK(llama_ffn_chunks_flag(96, 13, 1, 96) == 0, "13 chunks of 96 rows (no row count makes them) given back");
        int bad = 0;
        for (long N = 1; N <= 40; N++)
            for (int su = 1; su <= 4; su++) {
                if (N % su) continue;
                for (long K = 1; K <= N + 1; K++) {
                    const long want = llama_ffn_chunk_count(N, K, su, N / su, NULL);
                    const long k2 = llama_ffn_chunks_flag(N, want, su, N / su);
                    bad += k2 <= 0 || llama_ffn_chunk_count(N, k2, su, N / su, NULL) != want;
                }
            }
        CHECK(bad == 0, "%d counts a K makes not given back", bad);
    }
    /* BF16 weights load and give the reference loss of the BF16-rounded weights. */
    {
        char dir[256], path[512];
        snprintf(dir, sizeof dir, "%s/tiny_mha", FIXTURES);
        snprintf(path, sizeof path, "%s/expected.json", dir);
        double expected = json_number(path, "loss_bf16_weights");
        LlamaModel m;
        double loss = run_fixture(dir, "model_bf16.safetensors", LLAMA_CKPT_NONE, 0, &m, NULL);
        CHECK(fabs(loss - expected) <= 1e-5 * fabs(expected), "tiny_mha bf16: loss %.9f, reference %.9f", loss, expected);
        llama_free(&m);
    }
    return test_summary("test_model");
}
