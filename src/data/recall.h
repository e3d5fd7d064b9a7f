/* Multi-query associative recall (MQAR): the built-in synthetic long-range task.
 *
 * A sequence holds key-value pairs scattered through its first part and, later, queries that
 * repeat a key; the target after a query key is that key's value. Answering needs attention
 * across the whole distance between the pair and the query, so accuracy by distance shows
 * whether long-range attention works. Filler tokens fill the rest; only the answers carry a
 * target (others are RECALL_IGNORE), so loss and accuracy measure recall alone.
 *
 * Two formats:
 * - RECALL_ADJACENT (the classic MQAR): a pair is a key token followed by its value token; a
 *   query repeats the key and its target is the value that followed it. Solving it needs an
 *   induction circuit (two attention layers: one writes "the previous token was k" into the value's
 *   position, the next finds that position from the query). Vocabulary (vocab_size >= 16):
 *   token 0 = filler, [1, 1+K) keys, [1+K, 1+2K) values, K = (vocab_size - 1) / 2.
 * - RECALL_FUSED: a pair is one token that names both its key and its value; a query is a key
 *   token and its target is the value token named by that key's pair token. One attention layer
 *   can solve it (query key -> the pair token with that key -> read its value), so a small model
 *   learns it in minutes even thousands of tokens back. Vocabulary (vocab_size >= 16): token 0 =
 *   filler, [1, 1+K) query keys, [1+K, 1+2K) values, [1+2K, 1+2K+K^2) pair tokens, pair (k, v)
 *   = 1+2K + k*K + v, with K = floor(sqrt(vocab_size)) - 1 (so (K+1)^2 <= vocab_size). */
#ifndef SEQPAR_RECALL_H
#define SEQPAR_RECALL_H

#include <stdint.h>
#include "core/common.h"

#define RECALL_IGNORE (-1)

typedef enum { RECALL_ADJACENT = 0, RECALL_FUSED = 1 } RecallFormat;

typedef struct {
    RecallFormat format; /* default (0): RECALL_ADJACENT */
    int vocab_size;
    int seq_len;   /* S: inputs and targets each have S entries */
    int n_pairs;   /* key-value pairs per sequence (distinct keys); default seq_len / 16, min 1,
                    * capped by the keys available */
    int n_queries; /* queries per sequence; default n_pairs */
} RecallSpec;

/* Fills inputs[S] and targets[S] (targets[i] = the value to predict after inputs[i], or
 * RECALL_IGNORE) and, for each target, distance[i] = query position - key position (the pair
 * token's position for RECALL_FUSED; 0 where ignored). Deterministic given the RNG state. Pairs
 * occupy the first half, queries the second half, in random positions. */
void recall_generate(const RecallSpec *spec, Rng *rng, int *inputs, int *targets, int *distance);

/* Keys (= values) the vocabulary provides under the spec's format. */
int recall_n_keys(const RecallSpec *spec);
/* "adjacent" or "fused" to a format; -1 for anything else. */
int recall_format_parse(const char *name);
const char *recall_format_name(RecallFormat f);

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
/* Writes the statistics as one JSON array (no newline), the non-empty buckets in order:
 * [{"from": 256, "to": 511, "correct": 40, "total": 41}, ...] ("to" of the last bucket is null). */
void recall_stats_json(const RecallStats *st, FILE *out);

#endif
