/* Forward-only evaluation over token data or the recall task; see evaluate.h. */
#include "train/evaluate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/packing.h"
#include "io/atomic_file.h"
#include "parallel/comm.h"

int eval_buckets(long S, long *from, long *to) {
    int n = 0;
    long lo = 1, hi = 1024;
    while (lo <= S) {
        from[n] = lo;
        to[n] = hi < S && n < EVAL_BUCKETS - 1 ? hi : S;
        lo = to[n] + 1;
        hi *= 4;
        n++;
    }
    return n;
}

int eval_data_tokens(EvalData *d, const char *source, TokensFormat format, int seq_len, long max_seqs, int vocab_size,
                     int eot, SeqErr *e) {
    memset(d, 0, sizeof *d);
    if (token_stream_open(&d->stream, source, format, STREAM_VAL, e) != 0) return -1;
    d->stream.vocab_size = vocab_size;
    d->seq_len = seq_len;
    d->eot = eot;
    const size_t avail = d->stream.total > 0 ? (d->stream.total - 1) / (size_t)seq_len : 0;
    if (avail == 0) {
        const int rc = seq_err(e, "--data '%s' holds %zu tokens, fewer than one sequence of --seq-len %d (+1): give more "
                               "data or --seq-len %zu or less", source, d->stream.total, seq_len,
                               d->stream.total > 1 ? d->stream.total - 1 : (size_t)1);
        token_stream_close(&d->stream);
        return rc;
    }
    d->n_seqs = max_seqs > 0 && (size_t)max_seqs < avail ? max_seqs : (long)avail;
    /* every sequence read once now: a token outside the vocabulary ends the run before any forward */
    long scored;
    int rc = token_stream_scan(&d->stream, d->n_seqs, seq_len, eot, &scored, e);
    if (rc == 0 && scored == 0)
        rc = seq_err(e, "--data '%s': its %ld sequences hold nothing but the end-of-text id %d (--pack), so no token "
                     "is scored: give other data or check --eot", source, d->n_seqs, eot);
    if (rc != 0) token_stream_close(&d->stream);
    return rc;
}

void eval_data_recall(EvalData *d, const RecallSpec *spec, long n_seqs, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->is_recall = 1;
    d->spec = *spec;
    d->seq_len = spec->seq_len;
    d->seed = seed;
    d->n_seqs = n_seqs;
    d->eot = -1;
}

void eval_data_close(EvalData *d) {
    if (!d->is_recall) token_stream_close(&d->stream);
}

static int bucket_of(const EvalResult *r, long pos) {
    int b = 0;
    while (b + 1 < r->n_buckets && pos > r->to[b]) b++;
    return b;
}

int eval_run(EvalData *d, LlamaModel *m, LlamaActs *acts, SeqParallel *par, EvalResult *r, SeqErr *e) {
    const int S = d->seq_len, N = par->n_local, dp = par->topo.dp;
    memset(r, 0, sizeof *r);
    r->n_seqs = d->n_seqs;
    r->seq_len = S;
    r->recall = d->is_recall;
    r->n_buckets = eval_buckets(S, r->from, r->to);
    int *inputs = xmalloc(sizeof(int) * (size_t)S), *targets = xmalloc(sizeof(int) * (size_t)S);
    int *docs = d->eot >= 0 ? xmalloc(sizeof(int) * (size_t)S) : NULL;
    int *dist = d->is_recall ? xmalloc(sizeof(int) * (size_t)S) : NULL;
    int *li = xmalloc(sizeof(int) * (size_t)N), *lt = xmalloc(sizeof(int) * (size_t)N);
    int *ld = docs ? xmalloc(sizeof(int) * (size_t)N) : NULL, *ldist = dist ? xmalloc(sizeof(int) * (size_t)N) : NULL;
    int *pred = dist ? xmalloc(sizeof(int) * (size_t)N) : NULL;
    double *tl = xmalloc(sizeof(double) * (size_t)N);
    double sum = 0, bsum[EVAL_BUCKETS] = {0};
    long scored = 0;
    Rng rng;
    rng_seed(&rng, d->seed ^ 0xE7A1E7A1ull); /* train's evaluation sequences (trainer.c) */
    int rc = d->is_recall ? 0 : token_stream_seek(&d->stream, 0, 0, e);
    mem_tracked_reset_peak();
    const double t0 = now_seconds();
    /* every rank reads every sequence (a failed read fails on all of them alike) and scores its
     * replica's ones, each replica its own sequences e (e % dp) */
    for (long s = 0; s < d->n_seqs && rc == 0; s++) {
        if (d->is_recall) recall_generate(&d->spec, &rng, inputs, targets, dist);
        else rc = token_stream_next(&d->stream, S, inputs, targets, e);
        if (rc != 0) continue;
        if (docs) { /* as training packs its windows */
            pack_documents(inputs, S, d->eot, docs);
            pack_mask_targets(inputs, S, d->eot, targets);
        }
        for (int i = 0; i < S; i++) scored += targets[i] >= 0;
        if (s % dp != par->topo.dp_rank) continue;
        seq_parallel_take_local(par, inputs, li);
        seq_parallel_take_local(par, targets, lt);
        if (docs) seq_parallel_take_local(par, docs, ld);
        if (dist) seq_parallel_take_local(par, dist, ldist);
        sum += llama_forward_scores(m, acts, par->attn, li, lt, par->positions, ld, N, tl, pred);
        for (int i = 0; i < N; i++) {
            if (lt[i] < 0) continue;
            const int b = bucket_of(r, (long)par->positions[i] - (ld ? ld[i] : 0) + 1);
            bsum[b] += tl[i];
            r->tokens[b]++;
            if (dist) recall_stats_add(&r->stats, ldist[i], pred[i] == lt[i]);
        }
    }
    double seconds = now_seconds() - t0;
    unsigned long long peak[2] = {(unsigned long long)mem_tracked_peak(), (unsigned long long)mem_peak_rss()};
    xfree(inputs); xfree(targets); xfree(docs); xfree(dist); xfree(li); xfree(lt); xfree(ld); xfree(ldist);
    xfree(pred); xfree(tl);
    if (rc != 0) return rc;
    r->scored = scored;
    r->loss = seq_parallel_sum(par, sum) / (double)scored;
    if (par->topo.world_size > 1) {
        Comm *c = par->comm;
        const MPI_Comm w = par->topo.world;
        comm_control_allreduce(c, "MPI_Iallreduce (eval buckets)", bsum, (size_t)r->n_buckets, MPI_DOUBLE, MPI_SUM, w);
        comm_control_allreduce(c, "MPI_Iallreduce (eval buckets)", r->tokens, (size_t)r->n_buckets, MPI_LONG, MPI_SUM, w);
        comm_control_allreduce(c, "MPI_Iallreduce (eval counts)", r->stats.correct, RECALL_BUCKETS, MPI_LONG, MPI_SUM, w);
        comm_control_allreduce(c, "MPI_Iallreduce (eval counts)", r->stats.total, RECALL_BUCKETS, MPI_LONG, MPI_SUM, w);
        comm_control_allreduce(c, "MPI_Iallreduce (eval time)", &seconds, 1, MPI_DOUBLE, MPI_MAX, w);
        comm_control_allreduce(c, "MPI_Iallreduce (eval memory)", peak, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, w);
    }
    for (int b = 0; b < r->n_buckets; b++) r->bucket_loss[b] = r->tokens[b] ? bsum[b] / (double)r->tokens[b] : 0.0;
    if (d->is_recall) {
        long right = 0, all = 0;
        for (int b = 0; b < RECALL_BUCKETS; b++) right += r->stats.correct[b], all += r->stats.total[b];
        r->accuracy = all ? (double)right / (double)all : 0.0;
    }
    r->seconds = seconds;
    r->tokens_per_s = seconds > 0 ? (double)r->n_seqs * S / seconds : 0.0;
    r->peak_tracked = peak[0];
    r->peak_rss = peak[1];
    return 0;
}

/* A position as the bucket table writes it: 1K, 4K, 1M where a multiple of 1024 (of 1024^2), else
 * the number. */
static void position_text(long p, char *buf, size_t n) {
    if (p >= (1L << 20) && p % (1L << 20) == 0) snprintf(buf, n, "%ldM", p >> 20);
    else if (p >= 1024 && p % 1024 == 0) snprintf(buf, n, "%ldK", p >> 10);
    else snprintf(buf, n, "%ld", p);
}

/* exp of a mean loss: the perplexity (inf past what a double holds) */
static double perplexity(double loss) { return exp(loss); }

void eval_print(const EvalResult *r, FILE *out) {
    fprintf(out, "loss %.6f, perplexity %.4f over %ld tokens (%ld sequences of %ld)\n", r->loss, perplexity(r->loss),
            r->scored, r->n_seqs, r->seq_len);
    fprintf(out, "by position:\n");
    fprintf(out, "  %-15s %12s %10s %12s\n", "positions", "tokens", "loss", "perplexity");
    for (int b = 0; b < r->n_buckets; b++) {
        char lo[32], hi[32], range[72];
        position_text(b == 0 ? 1 : r->to[b - 1], lo, sizeof lo);
        position_text(r->to[b], hi, sizeof hi);
        snprintf(range, sizeof range, "%s-%s", lo, hi);
        if (r->tokens[b])
            fprintf(out, "  %-15s %12ld %10.6f %12.4f\n", range, r->tokens[b], r->bucket_loss[b],
                    perplexity(r->bucket_loss[b]));
        else
            fprintf(out, "  %-15s %12ld %10s %12s\n", range, 0L, "-", "-");
    }
    if (r->recall) recall_stats_print(&r->stats, out);
    fprintf(out, "%.1f tokens/s (%ld tokens in %.3f s); peak memory %.1f MiB/rank tracked, %.1f MiB/rank resident\n",
            r->tokens_per_s, r->n_seqs * r->seq_len, r->seconds, (double)r->peak_tracked / (1 << 20),
            (double)r->peak_rss / (1 << 20));
}

/* A number as JSON has it: null for NaN and the infinities (a perplexity past a double's range) */
static void json_number(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

int eval_write_json(const char *path, const char *header, const EvalResult *r, SeqErr *e) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return seq_err(e, "--out %s: out of memory for the summary", path);
    fprintf(f, "{\n");
    if (header && *header) fprintf(f, "%s,\n", header);
    fprintf(f, "  \"seq_len\": %ld,\n  \"sequences\": %ld,\n  \"tokens\": %ld,\n", r->seq_len, r->n_seqs, r->scored);
    fputs("  \"loss\": ", f);
    json_number(f, r->loss);
    fputs(",\n  \"perplexity\": ", f);
    json_number(f, perplexity(r->loss));
    fputs(",\n  \"by_position\": [", f);
    for (int b = 0; b < r->n_buckets; b++) {
        fprintf(f, "%s\n    {\"from\": %ld, \"to\": %ld, \"tokens\": %ld, ", b ? "," : "", r->from[b], r->to[b],
                r->tokens[b]);
        fputs("\"loss\": ", f);
        json_number(f, r->tokens[b] ? r->bucket_loss[b] : NAN);
        fputs(", \"perplexity\": ", f);
        json_number(f, r->tokens[b] ? perplexity(r->bucket_loss[b]) : NAN);
        fputc('}', f);
    }
    fprintf(f, "\n  ],\n");
    if (r->recall) {
        fputs("  \"recall_accuracy\": ", f);
        json_number(f, r->accuracy);
        fputs(",\n  \"recall_by_distance\": ", f);
        recall_stats_json(&r->stats, f);
        fprintf(f, ",\n");
    }
    fprintf(f, "  \"seconds\": %.6f,\n  \"tokens_per_second\": %.6g,\n", r->seconds, r->tokens_per_s);
    fprintf(f, "  \"peak_tracked_bytes_max\": %llu,\n  \"peak_rss_bytes_max\": %llu\n}", r->peak_tracked, r->peak_rss);
    fclose(f);
    const int rc = atomic_write_text(path, text, e);
    free(text);
    return rc;
}
