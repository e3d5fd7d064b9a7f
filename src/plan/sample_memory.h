/* The memory of `seqpar sample` per rank, predicted from the flags (`seqpar memory --sample`): the
 * weights, the prompt's prefill (the strategy's forward only: the activations llama_acts_create_opts
 * makes with forward_only, the strategy's buffers, the flash kernel's transient buffers, the bf16
 * products' operand copies), the key/value cache shard (train/dist_generate.h: the rank's prompt rows
 * and its share of the new tokens, fp32 or bf16 words) and decode's scratch (one token's rows, the
 * LM head's bf16 operand copy). One process without a strategy (model/generate.h) holds its whole
 * cache, 512-token chunks' scratch and a score per position instead. Like plan/memory_model.h it
 * counts seqpar's own allocations (the tracked peak `seqpar sample` prints); the process's resident
 * set adds the C runtime, MPI and thread stacks. Not counted: --prompt-logits's prompt x vocabulary
 * floats on rank 0, a second turn's block. */
#ifndef SEQPAR_SAMPLE_MEMORY_H
#define SEQPAR_SAMPLE_MEMORY_H

#include "model/config.h"
#include "parallel/parallel_config.h"

typedef struct {
    double weights;  /* the parameters (fp32 master weights in both precisions) */
    double prefill;  /* the prefill's activations, strategy buffers and kernel scratch (freed after it) */
    double cache;    /* the key/value cache shard */
    double decode;   /* the generator's rows for one token and decode's transient copies */
    double total;    /* weights + cache + decode scratch kept + the larger of prefill and decode transients */
    long seq_len;    /* the prompt as the strategy runs it (padded) */
    long n_local;    /* prompt tokens on the largest rank */
    int hp, cp;
} SampleMemory;

/* Fills *out for a prompt of `prompt` tokens and `new_tokens` after it on `world` ranks under pc's
 * strategy (pc->strategy NULL with world 1: one process's own path), `threads` per rank. NULL, or a
 * one-line message (xmalloc'd) naming what does not fit. */
char *sample_memory_estimate(const LlamaConfig *c, const ParallelConfig *pc, int world, int threads, long prompt,
                             long new_tokens, int precision, SampleMemory *out);

/* The longest prompt (at most `limit` tokens) whose estimate stays within `budget` bytes; 0 if none. */
long sample_memory_longest(const LlamaConfig *c, const ParallelConfig *pc, int world, int threads, long new_tokens,
                           int precision, double budget, long limit);

#endif
