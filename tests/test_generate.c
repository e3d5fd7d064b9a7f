/* Tests for generation (src/model/generate.h): the KV-cache forward's logits equal the training
 * forward's (llama_forward_backward: every log-softmax entry of every prompt position, recovered
 * from its loss with one target at a time, and its argmax), token-by-token and chunked decoding
 * equal one prefill, the prompt logits equal transformers' float64 ones in the committed
 * generate.json fixtures, and greedy / temperature / top-k sampling choose what they should. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/seq_attention.h"
#include "core/common.h"
#include "io/config_json.h"
#include "io/param_io.h"
#include "model/generate.h"
#include "model/llama.h"
#include "testlib.h"

/* logits (n, V) of tokens[0..n) fed in chunks of `chunk` to a fresh generator */
static void generate_logits(const LlamaModel *m, const int *tokens, int n, int chunk, float *logits) {
    Generator g;
    SeqErr e;
    if (generator_init(&g, m, n, chunk, &e) != 0) die("%s", e.msg);
    int V = m->cfg.vocab_size;
    for (int i = 0; i < n; i += chunk) {
        int k = n - i < chunk ? n - i : chunk;
        if (generator_forward(&g, tokens + i, k, logits + (size_t)i * V, NULL, &e) != 0) die("%s", e.msg);
    }
    generator_free(&g);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= w)) w = d;
    }
    return w;
}

/* The generator against the training forward on a random GQA model. */
static void test_against_training(int rope_llama3) {
    LlamaConfig c = {.hidden_size = 32, .intermediate_size = 64, .num_attention_heads = 4, .num_key_value_heads = 2,
                     .num_hidden_layers = 2, .vocab_size = 48, .head_dim = 8, .max_position_embeddings = 4096,
                     .rms_norm_eps = 1e-5f, .rope_theta = 10000.0};
    if (rope_llama3) {
        c.rope_type = LLAMA_ROPE_LLAMA3;
        c.rope_factor = 8;
        c.rope_low_freq_factor = 1;
        c.rope_high_freq_factor = 4;
        c.rope_original_max_position_embeddings = 16;
    }
    LlamaModel m;
    llama_build(&m, &c);
    llama_init_random(&m, 7 + (uint64_t)rope_llama3);
    for (size_t i = 0; i < m.table.total; i++) m.params[i] *= 2; /* larger weights: sharper, more varied logits */
    enum { P = 20 };
    int V = c.vocab_size, tokens[P], targets[P], pos[P], pred[P];
    Rng rng;
    rng_seed(&rng, 3);
    for (int i = 0; i < P; i++) tokens[i] = (int)rng_below(&rng, (uint64_t)V), pos[i] = i;

    float *one = xmalloc(sizeof(float) * P * (size_t)V), *step = xmalloc(sizeof(float) * P * (size_t)V);
    float *chunked = xmalloc(sizeof(float) * P * (size_t)V);
    generate_logits(&m, tokens, P, P, one);
    generate_logits(&m, tokens, P, 1, step);
    generate_logits(&m, tokens, P, 7, chunked);
    /* the cache path and the prefill path are the same arithmetic per token, but BLAS may round a
     * different number of rows differently (fp32: a few 1e-7 of the largest logit, ~30 here) */
    double d1 = max_abs_diff(step, one, (size_t)P * V), d2 = max_abs_diff(chunked, one, (size_t)P * V), scale = 0;
    for (size_t i = 0; i < (size_t)P * V; i++) scale = fmax(scale, fabs(one[i]));
    CHECK(d1 <= 1e-6 * (1 + scale) && d2 <= 1e-6 * (1 + scale), "rope %d: token-by-token / chunked logits differ from one prefill by %.3g / %.3g",
          rope_llama3, d1, d2);

    /* training forward: the loss with a single target v at position i is lse_i - logit_i[v] */
    SeqAttention *attn = local_attention_create((AttnHeads){.n_local = P, .n_heads = c.num_attention_heads,
                                                            .n_kv_heads = c.num_key_value_heads, .head_dim = c.head_dim});
    LlamaActs *acts = llama_acts_create(&m, attn, P, LLAMA_CKPT_NONE);
    double worst = 0;
    int argmax_same = 1;
    for (int i = 0; i < P; i++) {
        const float *row = one + (size_t)i * V;
        double mx = row[0], sum = 0;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > mx) mx = row[v], best = v;
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        double lse = mx + log(sum);
        for (int v = 0; v < V; v++) {
            for (int j = 0; j < P; j++) targets[j] = j == i ? v : -1;
            double loss = llama_forward_backward(&m, acts, attn, tokens, targets, pos, P, 1.0f, 0, pred);
            double d = fabs(loss - (lse - row[v]));
            if (!(d <= worst)) worst = d;
            if (v == 0 && pred[i] != best) argmax_same = 0;
        }
    }
    /* fp32 throughout (flash attention and a float log-sum-exp vs a softmax in double here): 3e-6 of the largest logit (seen: 1.7e-6 with 5x larger weights) */
    CHECK(worst <= 3e-6 * (1 + scale), "rope %d: log-softmax of the generator differs from the training forward's by "
          "%.3g (largest |logit| %.3g)", rope_llama3, worst, scale);
    CHECK(argmax_same, "rope %d: the generator's argmax differs from the training forward's predictions", rope_llama3);
    printf("rope %s: largest |logit| %.3g; KV-cache vs prefill %.2g, vs training forward (log-softmax) %.2g\n",
           rope_llama3 ? "llama3" : "default", scale, d1 > d2 ? d1 : d2, worst);
    llama_acts_free(acts);
    seq_attention_destroy(attn);
    xfree(one); xfree(step); xfree(chunked);
    llama_free(&m);
}

/* The prompt logits of a fixture against transformers' float64 logits (generate.json). */
static void test_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/%s/config.json", name);
    LlamaConfig c;
    config_json_load(path, &c);
    LlamaModel m;
    llama_build(&m, &c);
    snprintf(path, sizeof path, "tests/fixtures/%s/model.safetensors", name);
    params_load_safetensors(path, &m.table, m.params, c.tie_word_embeddings);
    snprintf(path, sizeof path, "tests/fixtures/%s/generate.json", name);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL, "%s: %s", path, err.text);
    if (!root) return;
    json_t *jp = json_object_get(root, "prompt"), *jl = json_object_get(root, "prompt_logits");
    int P = (int)json_array_size(jp), V = c.vocab_size;
    int *tokens = xmalloc(sizeof(int) * (size_t)P);
    for (int i = 0; i < P; i++) tokens[i] = (int)json_integer_value(json_array_get(jp, (size_t)i));
    float *logits = xmalloc(sizeof(float) * (size_t)P * V);
    generate_logits(&m, tokens, P, 3, logits);
    double worst = 0, scale = 0;
    for (int i = 0; i < P; i++)
        for (int v = 0; v < V; v++) {
            double ref = json_real_value(json_array_get(json_array_get(jl, (size_t)i), (size_t)v));
            double d = fabs(logits[(size_t)i * V + v] - ref);
            if (!(d <= worst)) worst = d;
            if (fabs(ref) > scale) scale = fabs(ref);
        }
    CHECK((int)json_array_size(jl) == P && worst <= 1e-5 * (1 + scale),
          "%s: prompt logits differ from transformers' by %.3g (largest logit %.3g)", name, worst, scale);
    printf("%s: prompt logits within %.2g of transformers float64 (largest |logit| %.3g)\n", name, worst, scale);
    xfree(tokens);
    xfree(logits);
    json_decref(root);
    llama_free(&m);
}

/* sample_next_token with temperature T, top-k k, no top-p, no penalty */
static int draw(const float *logits, int V, double T, int k, Rng *rng) {
    const SampleParams sp = {.temperature = T, .top_k = k, .top_p = 1, .repetition_penalty = 1};
    return sample_next_token(logits, V, &sp, NULL, 0, rng);
}

static void test_sampling(void) {
    float logits[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f};
    Rng rng;
    rng_seed(&rng, 11);
    CHECK(draw(logits, 6, 0.0, 0, &rng) == 1, "greedy: the first of two largest logits");
    int ok = 1;
    for (int i = 0; i < 200; i++) ok &= draw(logits, 6, 1.5, 1, &rng) == 1;
    CHECK(ok, "top-k 1 is greedy at any temperature");
    /* frequencies follow softmax(logits / T) over the top 3 (ids 1, 2, 5) */
    enum { DRAWS = 40000 };
    int count[6] = {0};
    for (int i = 0; i < DRAWS; i++) count[draw(logits, 6, 0.7, 3, &rng)]++;
    double z = 2 * exp(3 / 0.7) + exp(2 / 0.7);
    double p1 = exp(3 / 0.7) / z, p5 = exp(2 / 0.7) / z;
    CHECK(count[0] == 0 && count[3] == 0 && count[4] == 0, "top-k 3 drew outside the top 3: %d %d %d", count[0],
          count[3], count[4]);
    CHECK(fabs((double)count[1] / DRAWS - p1) < 0.01 && fabs((double)count[2] / DRAWS - p1) < 0.01 &&
              fabs((double)count[5] / DRAWS - p5) < 0.01,
          "temperature 0.7, top-k 3: frequencies %.3f %.3f %.3f, expected %.3f %.3f %.3f", (double)count[1] / DRAWS,
          (double)count[2] / DRAWS, (double)count[5] / DRAWS, p1, p1, p5);
    /* all tokens (top-k 0), high temperature: every id appears */
    memset(count, 0, sizeof count);
    for (int i = 0; i < DRAWS; i++) count[draw(logits, 6, 5.0, 0, &rng)]++;
    int all = 1;
    for (int v = 0; v < 6; v++) all &= count[v] > 0;
    CHECK(all, "top-k 0 at temperature 5 never drew some id");
}

/* transformers' TopPLogitsWarper as written there, in double: sort ascending, drop the tokens whose
 * cumulative probability (with every less likely one) is at most 1 - top_p, keep the most likely
 * one always; keep[v] = 1 for those left. Returns the distance of the nearest cumulative sum to the
 * 1 - top_p line (a case that close is not a fair test of float rounding). */
static double top_p_reference(const double *prob, int V, double top_p, int *keep) {
    int order[16];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 1; i < V; i++) /* insertion sort, ascending by probability, ties by id descending */
        for (int j = i; j > 0 && (prob[order[j]] < prob[order[j - 1]] ||
                                  (prob[order[j]] == prob[order[j - 1]] && order[j] > order[j - 1])); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double cum = 0, nearest = 1;
    for (int i = 0; i < V; i++) {
        cum += prob[order[i]];
        keep[order[i]] = i == V - 1 || cum > 1 - top_p;
        if (fabs(cum - (1 - top_p)) < nearest) nearest = fabs(cum - (1 - top_p));
    }
    return nearest;
}

/* --top-p (after temperature and top-k, transformers' order) and --repetition-penalty */
static void test_top_p_and_penalty(void) {
    Rng rng, data;
    rng_seed(&rng, 12);
    rng_seed(&data, 13);
    enum { DRAWS = 20000, V = 8 };
    int cases = 0, wrong_set = 0, wrong_freq = 0;
    double worst_freq = 0;
    for (int t = 0; t < 40; t++) {
        float logits[V];
        for (int v = 0; v < V; v++) logits[v] = (float)(2 * rng_normal(&data));
        const double T = 0.5 + rng_uniform(&data), top_p = 0.2 + 0.75 * rng_uniform(&data);
        const int k = t % 3 == 0 ? 5 : 0; /* top-k first where given: top-p then over its tokens */
        double prob[V], z = 0, mx = -1e30;
        for (int v = 0; v < V; v++) mx = fmax(mx, logits[v]);
        int rank_below[V]; /* tokens more likely than v: inside the top k when below k */
        for (int v = 0; v < V; v++) {
            rank_below[v] = 0;
            for (int u = 0; u < V; u++) rank_below[v] += logits[u] > logits[v] || (logits[u] == logits[v] && u < v);
        }
        for (int v = 0; v < V; v++) z += prob[v] = k && rank_below[v] >= k ? 0 : exp((logits[v] - mx) / T);
        for (int v = 0; v < V; v++) prob[v] /= z;
        int keep[V];
        if (top_p_reference(prob, V, top_p, keep) < 1e-6) continue;
        double kept = 0;
        for (int v = 0; v < V; v++) kept += keep[v] ? prob[v] : 0;
        int count[V] = {0};
        const SampleParams sp = {.temperature = T, .top_k = k, .top_p = top_p, .repetition_penalty = 1};
        for (int i = 0; i < DRAWS; i++) count[sample_next_token(logits, V, &sp, NULL, 0, &rng)]++;
        cases++;
        for (int v = 0; v < V; v++) {
            const double want = keep[v] ? prob[v] / kept : 0, got = (double)count[v] / DRAWS;
            if ((count[v] > 0) != (want > 0) && (want > 2e-3 || count[v] > 0)) wrong_set++;
            worst_freq = fmax(worst_freq, fabs(got - want));
            if (fabs(got - want) > 0.015) wrong_freq++;
        }
    }
    CHECK(cases >= 30 && wrong_set == 0 && wrong_freq == 0,
          "top-p: %d of %d cases drew outside (or never drew inside) transformers' set, %d frequencies off by > "
          "0.015 (worst %.4f)", wrong_set, cases, wrong_freq, worst_freq);
    printf("top-p: %d random cases (8 tokens, temperatures 0.5-1.5, p 0.2-0.95, a third after top-k 5): the set "
           "transformers keeps, frequencies within %.4f\n", cases, worst_freq);
    const float logits[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f};
    int ok = 1;
    const SampleParams tiny = {.temperature = 3, .top_k = 0, .top_p = 1e-9, .repetition_penalty = 1};
    for (int i = 0; i < 200; i++) ok &= sample_next_token(logits, 6, &tiny, NULL, 0, &rng) == 1;
    CHECK(ok, "top-p 1e-9 keeps only the most likely token (the first of two equal)");
    /* the penalty: a positive logit divided, a negative one multiplied, each id once however often
     * it occurs, before the greedy choice too */
    const SampleParams greedy = {.temperature = 0, .top_k = 0, .top_p = 1, .repetition_penalty = 2};
    const int seen12[] = {1, 2}, seen1112[] = {1, 1, 1, 2}, seen5[] = {5, 5};
    CHECK(sample_next_token(logits, 6, &greedy, seen12, 2, &rng) == 5,
          "penalty 2 on ids 1, 2 (logits 3 -> 1.5): greedy id 5 (logit 2)");
    const SampleParams greedy14 = {.temperature = 0, .top_k = 0, .top_p = 1, .repetition_penalty = 1.4};
    CHECK(sample_next_token(logits, 6, &greedy14, seen1112, 4, &rng) == 1,
          "penalty 1.4 on id 1 three times and id 2 once: both 3 / 1.4 (applied once each), greedy the first");
    const float neg[3] = {-1.0f, -1.5f, -3.0f};
    const SampleParams greedy2 = {.temperature = 0, .top_k = 0, .top_p = 1, .repetition_penalty = 2};
    const int seen0[] = {0};
    CHECK(sample_next_token(neg, 3, &greedy2, seen0, 1, &rng) == 1, "penalty 2 on a negative logit: -1 -> -2");
    CHECK(sample_next_token(logits, 6, &greedy, seen5, 2, &rng) == 1, "penalty on a token not the largest: no change");
    /* sampled: id 1's frequency follows its penalised logit */
    const SampleParams warm = {.temperature = 1, .top_k = 0, .top_p = 1, .repetition_penalty = 3};
    const int seen1[] = {1};
    int c1 = 0;
    for (int i = 0; i < DRAWS; i++) c1 += sample_next_token(logits, 6, &warm, seen1, 1, &rng) == 1;
    double z = exp(1.0) + exp(1.0) + exp(3.0) + exp(-2.0) + exp(0.5) + exp(2.0);
    CHECK(fabs((double)c1 / DRAWS - exp(1.0) / z) < 0.01, "penalty 3, temperature 1: id 1 drawn %.3f, expected %.3f",
          (double)c1 / DRAWS, exp(1.0) / z);
}

static void test_errors(void) {
    LlamaConfig c = {.hidden_size = 16, .intermediate_size = 32, .num_attention_heads = 2, .num_key_value_heads = 1,
                     .num_hidden_layers = 1, .vocab_size = 10, .head_dim = 8, .max_position_embeddings = 64,
                     .rms_norm_eps = 1e-5f, .rope_theta = 10000.0};
    LlamaModel m;
    llama_build(&m, &c);
    llama_init_random(&m, 1);
    Generator g;
    SeqErr e;
    CHECK(generator_init(&g, &m, 4, 4, &e) == 0, "init");
    int toks[4] = {1, 2, 3, 4}, bad = 10;
    CHECK(generator_forward(&g, &bad, 1, NULL, NULL, &e) != 0 && strstr(e.msg, "vocab_size 10"), "a token outside the vocabulary");
    CHECK(generator_forward(&g, toks, 4, NULL, NULL, &e) == 0, "fill the cache");
    CHECK(generator_forward(&g, toks, 1, NULL, NULL, &e) != 0 && strstr(e.msg, "beyond the 4"), "a full cache");
    generator_free(&g);
    CHECK(generator_init(&g, &m, 0, 1, &e) != 0, "an empty generator");
    llama_free(&m);
}

int main(void) {
    test_against_training(0);
    test_against_training(1);
    test_fixture("tiny_bytes");
    test_fixture("tiny_mha");
    test_fixture("tiny_gqa_tied");
    test_fixture("tiny_llama3");
    test_fixture("tiny_qwen2");     /* q, k, v biases */
    test_fixture("tiny_attn_bias"); /* q, k, v, o biases */
    test_fixture("tiny_qwen3");     /* per-head q/k norms */
    test_fixture("tiny_qwen3_bias");
    test_fixture("tiny_mistral_window"); /* a window of 7 on every layer, prompt 9 + 16 new tokens */
    test_fixture("tiny_qwen2_window");   /* a window of 9 on layers 1-2, prompt 20 + 16 new tokens */
    test_sampling();
    test_top_p_and_penalty();
    test_errors();
    return test_summary("test_generate");
}
