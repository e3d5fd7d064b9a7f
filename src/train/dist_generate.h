/* Generation on several ranks (`mpirun -np N seqpar sample --strategy ...`): the prompt's prefill
 * is the training strategy's own forward over the prompt split by its layout (zigzag included),
 * padded at its end to a length the strategy splits (seq_parallel_check_fit: causal attention
 * keeps the padding out of every prompt token's result); each rank keeps the keys and values of its
 * own prompt tokens (parallel/kv_shard.h), so the cache is sharded, never gathered. Each new token
 * then runs every op but attention on every rank (model/generate.h, the same weights everywhere);
 * its attention runs on every rank over that rank's shard and the partial results merge by their
 * log-sum-exp (kv_shard_attend), and its key and value are kept by the rank whose shard holds the
 * fewest tokens (the lowest such rank), so the shards stay balanced. Rank 0 chooses each token
 * (sample_next_token, one rank's seeds and rules) and sends it to the others. A block of new tokens
 * continuing the cache (a second prompt: dist_generator_continue) runs its dense ops on every rank
 * at once and its attention by pass-Q or pass-KV (parallel/kv_shard.h), each token kept as a
 * decoded one would be. Under --precision bf16 (ParallelConfig.wire_bf16) every part runs train's
 * bf16 forward and the cache is kept in bf16 (kv_shard_set_bf16), as one process keeps it.
 * Not here: the flags and output (cli/cmd_sample.c); data parallelism (one sequence). */
#ifndef SEQPAR_DIST_GENERATE_H
#define SEQPAR_DIST_GENERATE_H

#include "model/generate.h"
#include "model/llama.h"
#include "parallel/kv_shard.h"
#include "train/seq_parallel.h"

typedef struct {
    LlamaModel *m;
    SeqParallel *par;  /* made by seq_parallel_check_fit for the prompt (dp 1), then finished */
    int prompt_len;
    KvShard shard;
    Generator gen;     /* every op but attention, for each new token */
    int *counts;       /* (ranks) tokens each rank's shard holds */
    int row;           /* the new token's row in this rank's shard; -1: another rank keeps it */
    int rank, ranks;
    int block;         /* tokens of the block being continued; 0: one token at a time */
    KvScheme scheme;   /* the block's */
    int *rows, *owners; /* (max_block) each block token's row here (-1 elsewhere) and the rank keeping it */
    int *cached;       /* (ranks) rows each shard held before the block */
    int precision;     /* PRECISION_BF16 where par->cfg.wire_bf16 (--precision bf16): the prefill's
                          forward is train's bf16 forward, the generator's too (generator_set_precision),
                          and the shard holds bf16 words */
} DistGenerator;

/* Ready for a prompt of prompt_len tokens and max_new tokens after it in all (generated or
 * continued; the shard holds this rank's share of the prompt and of the new tokens), continued at
 * most max_block tokens at a time. */
void dist_generator_init(DistGenerator *g, LlamaModel *m, SeqParallel *par, int prompt_len, long max_new,
                         int max_block);
void dist_generator_free(DistGenerator *g);
/* The prompt's prefill (collective): last (V) on every rank, the logits after the prompt's last token;
 * prompt_logits (prompt_len, V), where non-NULL on rank 0, those after every prompt token. */
void dist_generator_prefill(DistGenerator *g, const int *prompt, float *last, float *prompt_logits);
/* Appends `token` (the same on every rank) at the next position; logits (V) on every rank, the same
 * bits everywhere. Collective. -1 with one line past the positions it was made for. */
int dist_generator_step(DistGenerator *g, int token, float *logits, SeqErr *e);
/* Appends tokens[0..T) (the same on every rank) at the next positions in one block by `scheme`
 * (KV_AUTO: pass-Q); logits (V), the last token's, and all (T, V) where non-NULL, every token's,
 * the same bits on every rank. Collective. */
int dist_generator_continue(DistGenerator *g, const int *tokens, int T, KvScheme scheme, float *all, float *logits,
                            SeqErr *e);
/* Tokens[0..T) continuing g in ceil(T / block) blocks as even as can be (dist_generator_continue each), all
 * by one scheme: `want`, or for KV_AUTO the one whose bytes over all blocks are fewer; *pass_q,
 * *pass_kv those bytes (all ranks, layers and blocks). all (T, V) where non-NULL. Collective. */
int dist_generator_continue_blocks(DistGenerator *g, const int *tokens, int T, int block, KvScheme want, float *all,
                                   float *logits, KvScheme *used, double *pass_q, double *pass_kv, SeqErr *e);
/* Rank 0's sample_next_token (rng read there only), sent to every rank. Collective. */
int dist_generator_choose(DistGenerator *g, const float *logits, const SampleParams *sp, const int *ids, long n_ids,
                          Rng *rng);
/* The bytes of this rank's cache (keys and values, all layers, as allocated). */
size_t dist_generator_cache_bytes(const DistGenerator *g);

#endif
