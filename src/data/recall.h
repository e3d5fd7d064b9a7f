/* Multi-query associative recall (MQAR): the built-in synthetic long-range task.
 *
 * A sequence holds key-value pairs scattered through its first part and, later, queries that
 * repeat a key; the target after a query key is that key's value. Answering needs attention
 * across the whole distance between the pair and the query, so accuracy by distance shows
 * whether long-range attention works. Filler tokens fill the rest; only the answers carry a
 * target (others are RECALL_IGNORE), so loss and accuracy measure recall alone.
 *
 * Vocabulary split (vocab_size >= 16): token 0 = filler, [1, 1+n_keys) keys,
 * [1+n_keys, 1+n_keys+n_values) values, with n_keys = n_values = (vocab_size - 1) / 2. */
#ifndef SEQPAR_RECALL_H
#define SEQPAR_RECALL_H

#include <stdint.h>
#include "core/common.h"

#define RECALL_IGNORE (-1)

typedef struct {
    int vocab_size;
    int seq_len;   /* S: inputs and targets each have S entries */
    int n_pairs;   /* key-value pairs per sequence (distinct keys); default seq_len / 16, min 1,
                    * capped by the keys available */
    int n_queries; /* queries per sequence; default n_pairs */
} RecallSpec;

/* Fills inputs[S] and targets[S] (targets[i] = the value to predict after inputs[i], or
 * RECALL_IGNORE) and, for each target, distance[i] = query position - key position (0 where
 * ignored). Deterministic given the RNG state. Pairs occupy the first half, queries the second
 * half, in random positions. */
void recall_generate(const RecallSpec *spec, Rng *rng, int *inputs, int *targets, int *distance);

/* Fills in defaults for zero fields and dies with a one-line error if the spec cannot work
 * (vocab too small, more pairs than keys or than fit in half the sequence, ...). */
void recall_spec_finalize(RecallSpec *spec);

/* Accuracy by distance bucket: bucket b holds distances in [2^b, 2^(b+1)). */
#define RECALL_BUCKETS 24
typedef struct {
    long correct[RECALL_BUCKETS];
    long total[RECALL_BUCKETS];
} RecallStats;

void recall_stats_add(RecallStats *st, int distance, int correct);
/* Prints "recall accuracy by distance: 1-1: 0.95 (n=..) 2-3: ..." on one line; returns overall. */
double recall_stats_print(const RecallStats *st, FILE *out);

#endif
