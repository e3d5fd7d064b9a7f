/* The multi-query associative recall generator and its accuracy-by-distance statistics.
 *
 * Layout of one RECALL_ADJACENT sequence of length S, with H = S / 2:
 *   [0, H):  n_pairs pairs "key value" at random non-overlapping positions (a pair is the key
 *            token immediately followed by its value token); keys are distinct, values random;
 *   [H, S):  n_queries query positions, each holding a key from the first half;
 *   elsewhere: filler token 0.
 * Only query positions carry a target (the key's value). The pair's own key position has no
 * target: its value is random and cannot be predicted, so training on it would only add noise.
 * A 2-layer transformer solves this with an induction head (find the earlier copy of the query
 * key, read the token after it), and it cannot be solved without attending back across the
 * distance from query to pair, which is what accuracy-by-distance measures.
 * RECALL_FUSED has the same layout with each pair one token (key and value in one id): the
 * query still has to find that token by content, however far back it lies. */
#include <string.h>

#include "data/recall.h"

int recall_n_keys(const RecallSpec *spec) {
    if (spec->format == RECALL_FUSED) {
        int k = 1;
        while ((long)(k + 2) * (k + 2) <= spec->vocab_size) k++; /* largest k with (k+1)^2 <= vocab */
        return k;
    }
    return (spec->vocab_size - 1) / 2;
}

int recall_format_parse(const char *name) {
    if (!strcmp(name, "adjacent")) return RECALL_ADJACENT;
    if (!strcmp(name, "fused")) return RECALL_FUSED;
    return -1;
}

const char *recall_format_name(RecallFormat f) { return f == RECALL_FUSED ? "fused" : "adjacent"; }

void recall_spec_finalize(RecallSpec *spec) {
    if (spec->vocab_size < 16)
        die_collective("recall task: vocab_size is %d but it needs at least 16 (token 0 is filler, then keys "
                       "and values); use a larger vocabulary", spec->vocab_size);
    if (spec->seq_len < 4)
        die_collective("recall task: seq_len is %d but it needs at least 4 (pairs in the first half, queries "
                       "in the second); use a longer sequence", spec->seq_len);
    if (spec->n_pairs < 0 || spec->n_queries < 0)
        die_collective("recall task: pair and query counts must not be negative (got %d pairs, %d queries)",
                       spec->n_pairs, spec->n_queries);
    if (spec->format != RECALL_ADJACENT && spec->format != RECALL_FUSED)
        die_collective("recall task: unknown format %d: use adjacent or fused", (int)spec->format);
    int n_keys = recall_n_keys(spec);
    int pair_tokens = spec->format == RECALL_FUSED ? 1 : 2; /* tokens one pair occupies */
    int half = spec->seq_len / 2;
    int second_half = spec->seq_len - half;
    if (spec->n_pairs == 0) {
        int pairs = spec->seq_len / 16;
        if (pairs > n_keys) pairs = n_keys;
        if (pairs > half / pair_tokens) pairs = half / pair_tokens;
        spec->n_pairs = pairs < 1 ? 1 : pairs;
    }
    /* the most pairs both limits allow: the one suggested whichever is hit (the keys' limit alone was
     * suggested, and then refused by the sequence's) */
    const int most = n_keys < half / pair_tokens ? n_keys : half / pair_tokens;
    if (spec->n_pairs > n_keys)
        die_collective("recall task: %d pairs need %d distinct keys but vocab_size %d provides only %d; use at "
                       "most %d pairs or a larger vocabulary", spec->n_pairs, spec->n_pairs, spec->vocab_size,
                       n_keys, most);
    if (pair_tokens * (long)spec->n_pairs > half)
        die_collective("recall task: %d pairs (%d token%s each) do not fit in the first half (%d tokens) of a "
                       "%d-token sequence; use at most %d pairs or a longer sequence", spec->n_pairs, pair_tokens,
                       pair_tokens == 1 ? "" : "s", half, spec->seq_len, most);
    if (spec->n_queries == 0) spec->n_queries = spec->n_pairs;
    if (spec->n_queries > second_half)
        die_collective("recall task: %d queries do not fit in the second half (%d tokens) of a %d-token "
                       "sequence; use at most %d queries", spec->n_queries, second_half, spec->seq_len,
                       second_half);
}

/* Selection sampling (Knuth's Algorithm S): marks `count` of the `range` slots, chosen uniformly,
 * writing them in increasing order to out[]. */
static void sample_sorted(Rng *rng, int range, int count, int *out) {
    int chosen = 0;
    for (int t = 0; t < range && chosen < count; t++)
        if ((int)rng_below(rng, (uint64_t)(range - t)) < count - chosen) out[chosen++] = t;
}

static void shuffle(Rng *rng, int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(rng, (uint64_t)i + 1);
        int tmp = a[i];
        a[i] = a[j];
        a[j] = tmp;
    }
}

void recall_generate(const RecallSpec *spec_in, Rng *rng, int *inputs, int *targets, int *distance) {
    RecallSpec spec = *spec_in;
    recall_spec_finalize(&spec);
    int S = spec.seq_len, half = S / 2, n_pairs = spec.n_pairs, n_queries = spec.n_queries;
    int n_keys = recall_n_keys(&spec), n_values = n_keys;
    int first_value = 1 + n_keys, first_pair = 1 + 2 * n_keys;
    int fused = spec.format == RECALL_FUSED, pair_tokens = fused ? 1 : 2;

    for (int i = 0; i < S; i++) {
        inputs[i] = 0;
        targets[i] = RECALL_IGNORE;
        distance[i] = 0;
    }

    int *key_pool = xmalloc((size_t)n_keys * sizeof(int));      /* distinct keys via partial shuffle */
    int *pair_pos = xmalloc((size_t)n_pairs * sizeof(int));      /* position of each pair's key */
    int *pair_order = xmalloc((size_t)n_pairs * sizeof(int));    /* which pair each query asks */
    int *query_pos = xmalloc((size_t)n_queries * sizeof(int));

    /* Keys: the first n_pairs of a partial Fisher-Yates shuffle of all keys. */
    for (int k = 0; k < n_keys; k++) key_pool[k] = 1 + k;
    for (int p = 0; p < n_pairs; p++) {
        int j = p + (int)rng_below(rng, (uint64_t)(n_keys - p));
        int tmp = key_pool[p];
        key_pool[p] = key_pool[j];
        key_pool[j] = tmp;
    }

    /* Pair positions: n_pairs sorted slots; adjacent pairs take them out of half - n_pairs, the
     * j-th shifted by j so that each pair's two tokens never overlap the next pair (the last value
     * lands at most at half-1). */
    sample_sorted(rng, half - (pair_tokens - 1) * n_pairs, n_pairs, pair_pos);
    int *pair_value = xmalloc((size_t)n_pairs * sizeof(int)); /* each pair's value token */
    for (int p = 0; p < n_pairs; p++) {
        pair_pos[p] += (pair_tokens - 1) * p;
        int v = (int)rng_below(rng, (uint64_t)n_values);
        pair_value[p] = first_value + v;
        if (fused) {
            inputs[pair_pos[p]] = first_pair + (key_pool[p] - 1) * n_values + v;
        } else {
            inputs[pair_pos[p]] = key_pool[p];
            inputs[pair_pos[p] + 1] = pair_value[p];
        }
    }

    /* Queries: sorted positions in the second half; each asks a pair, going through the pairs in
     * a fresh random order every n_pairs queries (so each pair is asked once by default). */
    sample_sorted(rng, S - half, n_queries, query_pos);
    for (int q = 0; q < n_queries; q++) {
        if (q % n_pairs == 0) {
            for (int p = 0; p < n_pairs; p++) pair_order[p] = p;
            shuffle(rng, pair_order, n_pairs);
        }
        int p = pair_order[q % n_pairs];
        int pos = half + query_pos[q];
        inputs[pos] = key_pool[p];
        targets[pos] = pair_value[p];
        distance[pos] = pos - pair_pos[p];
    }
    xfree(pair_value);

    xfree(key_pool);
    xfree(pair_pos);
    xfree(pair_order);
    xfree(query_pos);
}

void recall_stats_json(const RecallStats *st, FILE *out) {
    fputc('[', out);
    int first = 1;
    for (int b = 0; b < RECALL_BUCKETS; b++) {
        if (st->total[b] == 0) continue;
        fprintf(out, "%s{\"from\": %ld, \"to\": ", first ? "" : ", ", 1L << b);
        if (b == RECALL_BUCKETS - 1) fputs("null", out);
        else fprintf(out, "%ld", (1L << (b + 1)) - 1);
        fprintf(out, ", \"correct\": %ld, \"total\": %ld}", st->correct[b], st->total[b]);
        first = 0;
    }
    fputc(']', out);
}

static int distance_bucket(int distance) {
    int b = 0;
    while (b + 1 < RECALL_BUCKETS && (distance >> (b + 1)) != 0) b++;
    return b;
}

void recall_stats_add(RecallStats *st, int distance, int correct) {
    if (distance <= 0) return;
    int b = distance_bucket(distance);
    st->total[b]++;
    if (correct) st->correct[b]++;
}

double recall_stats_print(const RecallStats *st, FILE *out) {
    long correct = 0, total = 0;
    fprintf(out, "recall accuracy by distance:");
    for (int b = 0; b < RECALL_BUCKETS; b++) {
        if (st->total[b] == 0) continue;
        long lo = 1L << b, hi = (1L << (b + 1)) - 1;
        if (b == RECALL_BUCKETS - 1) fprintf(out, " %ld+:", lo); /* the last bucket takes all longer ones */
        else fprintf(out, " %ld-%ld:", lo, hi);
        fprintf(out, " %.3f (n=%ld)", (double)st->correct[b] / (double)st->total[b], st->total[b]);
        correct += st->correct[b];
        total += st->total[b];
    }
    double overall = total ? (double)correct / (double)total : 0.0;
    if (total) fprintf(out, " overall: %.3f (n=%ld)\n", overall, total);
    else fprintf(out, " no queries\n");
    return overall;
}
