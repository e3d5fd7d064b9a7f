/* Text generation from a Llama model in one process: a forward pass that appends tokens to a
 * key/value cache (incremental decoding: each new token attends to the cached keys and values of
 * every earlier one, so generating n tokens costs O(n) layer passes, not O(n^2)), and the choice of
 * the next token from its logits (greedy, temperature, top-k). A separate path from training's
 * llama_forward_backward (which it must agree with: tests/test_generate.c) that uses the same
 * kernels for every op but attention, which here is a plain softmax over the cache.
 *
 * A generator may also hand each layer's attention to its caller (generator_init_attend): the
 * caller keeps the keys and values (a cache sharded over ranks: train/dist_generate.h) and the
 * generator runs every other op, as here.
 *
 * Not here: batching several prompts, beam search. */
#ifndef SEQPAR_GENERATE_H
#define SEQPAR_GENERATE_H

#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "model/llama.h"

/* The attention of n new tokens of layer `layer` at positions (n), for a generator that keeps no
 * cache: q (n, H d), k, v (n, Hkv d) after RoPE; writes o (n, H d), each token's causal attention
 * over every earlier token and itself (under the layer's window, llama_layer_window). */
typedef void (*GeneratorAttend)(void *ctx, int layer, int n, const int *positions, const float *q, const float *k,
                                const float *v, float *o);

typedef struct {
    const LlamaModel *m;
    GeneratorAttend attend; /* NULL: the generator's own cache below */
    void *attend_ctx;
    int max_len;          /* cache capacity (tokens) */
    int max_chunk;        /* most tokens one generator_forward call takes */
    int len;              /* tokens in the cache */
    float *k_cache;       /* (L, max_len, Hkv*d), after RoPE; NULL with `attend` or under bf16 */
    float *v_cache;       /* (L, max_len, Hkv*d) */
    int precision;        /* PRECISION_FP32 (0) or PRECISION_BF16 (generator_set_precision) */
    bf16_t *k16_cache, *v16_cache; /* bf16 without `attend`: the cache as bf16 words (k and v are
                                      bf16 values already, so nothing is lost) */
    Bf16Scratch mm;       /* bf16: the matrix multiplies' operand copies (ops.h) */
    double *acc;          /* (head_dim): one head's weighted values */
    /* scratch for up to max_chunk tokens */
    float *x, *xn, *q, *k, *v, *o; /* (T, D) (T, D) (T, H d) (T, Hkv d) (T, Hkv d) (T, H d) */
    float *gate, *up, *h, *rstd;   /* (T, F) x3, (T, H) */
    float *rope_cos, *rope_sin;                       /* (T, d/2) */
    double *scores;                                   /* (max_len); NULL with `attend` */
    int *positions;                                   /* (T) */
} Generator;

/* A generator for at most max_len tokens in all, fed at most max_chunk tokens per call. -1 with
 * one line if max_len or max_chunk is not positive. */
int generator_init(Generator *g, const LlamaModel *m, int max_len, int max_chunk, SeqErr *e);
/* The same without a cache: each layer's attention is attend(ctx, ...); max_len bounds the
 * positions (len + n <= max_len). */
int generator_init_attend(Generator *g, const LlamaModel *m, int max_len, int max_chunk, GeneratorAttend attend,
                          void *ctx, SeqErr *e);
void generator_free(Generator *g);
/* bf16 mixed precision (PRECISION_BF16), as train's --precision bf16 forward runs it (model/
 * layer_memory.h): every matrix multiply (q, k, v, o, gate, up, down, the LM head) on bf16 operands
 * with fp32 accumulation; the normed inputs, SwiGLU's h, q and k after RoPE, v and attention's
 * output o rounded to bf16 values as train rounds them; the residual stream, norms' statistics,
 * attention's softmax (here in double) and the logits stay fp32. The cache then holds bf16 words,
 * half the bytes, losing nothing (k and v are bf16 values). Call before the first forward; -1 with
 * one line after it. */
int generator_set_precision(Generator *g, int precision, SeqErr *e);

/* Appends tokens[0..n) at positions len .. len+n-1 (n <= max_chunk, len + n <= max_len).
 * logits (n, V) receives every token's next-token logits when not NULL; last (V) receives the last
 * token's when not NULL. -1 with one line for a token outside the vocabulary or a full cache. */
int generator_forward(Generator *g, const int *tokens, int n, float *logits, float *last, SeqErr *e);

/* How sample_next_token chooses, in transformers' order (generate's logits processors, then its
 * warpers): the repetition penalty, then temperature, top-k and top-p. */
typedef struct {
    double temperature;        /* 0: greedy (the first largest logit, as torch.argmax) */
    int top_k;                 /* the top_k largest logits only; <= 0 or >= V: all */
    double top_p;              /* then the fewest most likely tokens whose probability reaches top_p
                                * (at least one); >= 1: all */
    double repetition_penalty; /* a token already in the context: its logit divided by it where
                                * positive, multiplied where negative (transformers'
                                * RepetitionPenaltyLogitsProcessor); 1: none */
} SampleParams;

/* The next token from logits (V) of the context ids[0..n_ids) (read only for the repetition
 * penalty), drawn with rng where temperature > 0. */
int sample_next_token(const float *logits, int V, const SampleParams *sp, const int *ids, long n_ids, Rng *rng);

#endif
