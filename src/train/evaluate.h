/* Forward-only evaluation of a model (`seqpar eval`): the mean next-token loss and perplexity over
 * token data (files, shard directories, globs, packed documents: what `seqpar train --data` reads)
 * or the built-in recall task, overall and by position bucket, the recall task's accuracy by
 * distance, tokens per second and peak memory, under any strategy and rank layout. Not here: the
 * flags (the CLI's), the model's loading (cli_common.h) and training's own validation loss
 * (validation.h; an evaluation of the same sequences on the same ranks gives its loss bit for bit). */
#ifndef SEQPAR_EVALUATE_H
#define SEQPAR_EVALUATE_H

#include <stdint.h>
#include <stdio.h>

#include "data/recall.h"
#include "data/token_stream.h"
#include "model/llama.h"
#include "train/seq_parallel.h"

/* Position buckets: 1-1K, 1K-4K, 4K-16K, ... (x4 each), the last one ending at S. A token's position
 * is the number of tokens its prediction sees: its input's place in the sequence plus one (packed:
 * in its document), 1 to S. */
#define EVAL_BUCKETS 16
/* The buckets of sequences of S tokens: bucket b holds positions from[b] to to[b]; returns their count. */
int eval_buckets(long S, long *from, long *to);

typedef struct {
    int is_recall;
    int seq_len;
    /* token data */
    TokenStream stream;
    int eot;          /* packed documents' end-of-text id; -1: not packed */
    /* the recall task */
    RecallSpec spec;
    uint64_t seed;
    long n_seqs;      /* sequences evaluated (sequence e by data-parallel replica e % dp) */
} EvalData;

/* Token data from `source` (token_stream.h, read as validation data: a directory's *_val_* shards
 * where it has any), the first min(max_seqs, what it holds) sequences of seq_len tokens (max_seqs
 * <= 0: all), each read once here: -1 with one line naming the fix if the data holds less than one
 * sequence (S + 1 tokens), a token is at or above vocab_size, or, packed (eot >= 0), nothing is
 * scored. */
int eval_data_tokens(EvalData *d, const char *source, TokensFormat format, int seq_len, long max_seqs, int vocab_size,
                     int eot, SeqErr *e);
/* The recall task of spec (recall_spec_finalize'd): n_seqs sequences drawn from `seed` as
 * `seqpar train` draws its evaluation's (the same sequences for the same seed and spec). */
void eval_data_recall(EvalData *d, const RecallSpec *spec, long n_seqs, uint64_t seed);
void eval_data_close(EvalData *d);

typedef struct {
    long n_seqs, seq_len;
    long scored;          /* tokens with a target */
    double loss;          /* their mean loss (nats) */
    int n_buckets;
    long from[EVAL_BUCKETS], to[EVAL_BUCKETS], tokens[EVAL_BUCKETS];
    double bucket_loss[EVAL_BUCKETS]; /* mean loss of the bucket's tokens; 0 where it has none */
    int recall;           /* the recall task: accuracy below */
    RecallStats stats;
    double accuracy;
    double seconds;       /* the forwards' wall time, the slowest rank's */
    double tokens_per_s;  /* n_seqs x S / seconds */
    unsigned long long peak_tracked, peak_rss; /* the largest rank's, bytes */
} EvalResult;

/* Evaluates every sequence of d with the model (forward only: acts may be made forward only, see
 * layer_memory.h). Every rank must call it; every rank gets the same result. The overall loss is
 * validation_loss's sum: per sequence the forward's sum, summed over the sequences in order and then
 * over the ranks, divided by the scored tokens. -1 with one line on a rank whose read failed (the
 * same on every rank: each reads every sequence). */
int eval_run(EvalData *d, LlamaModel *m, LlamaActs *acts, SeqParallel *par, EvalResult *r, SeqErr *e);

/* The result as lines of text (rank 0 prints them). */
void eval_print(const EvalResult *r, FILE *out);
/* The result as one JSON object, with `header` (a JSON object's members, no braces; may be NULL)
 * first, written atomically to path: 0, or -1 with one line. */
int eval_write_json(const char *path, const char *header, const EvalResult *r, SeqErr *e);

#endif
