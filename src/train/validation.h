/* Held-out validation loss for `seqpar train --val-data`: the mean next-token cross-entropy of the
 * model over a fixed set of sequences at the start of a validation token stream, forward only (no
 * gradients, no optimizer step), under any strategy and rank layout. */
#ifndef SEQPAR_VALIDATION_H
#define SEQPAR_VALIDATION_H

#include <stdio.h>

#include "data/token_stream.h"
#include "model/llama.h"
#include "train/seq_parallel.h"

typedef struct {
    TokenStream stream;
    int n_seqs; /* sequences per evaluation: a multiple of the dp replicas */
    int seq_len;
    int eot;    /* --pack's end-of-text id (documents scored alone, as in training); -1: not packed */
} Validation;

/* Opens `source` as validation data (token_stream.h, role STREAM_VAL) for sequences of seq_len
 * tokens: the first min(eval_batches x batch, what the data holds) sequences, rounded down to a
 * multiple of dp, read once here. -1 with one line if the data holds less than one sequence per
 * replica, a token of those sequences is at or above vocab_size (at start-up, not at the first
 * evaluation --eval-every steps later), or, packed (eot >= 0), they hold no target. */
int validation_open(Validation *v, const char *source, TokensFormat format, int seq_len, int eval_batches,
                    int batch, int dp, int vocab_size, int eot, SeqErr *e);
void validation_close(Validation *v);

/* The mean loss over the validation sequences (the same ones each time), identical on every rank;
 * *n_tokens gets the number of scored tokens (packed: each document alone, the targets training
 * drops, after an end-of-text, left out). Sequence e is scored by replica e % dp. Every rank
 * must call it. -1 with one line if a shard cannot be read. */
int validation_loss(Validation *v, LlamaModel *m, LlamaActs *acts, SeqParallel *par, double *loss, long *n_tokens,
                    SeqErr *e);

#endif
