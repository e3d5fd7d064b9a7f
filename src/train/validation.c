/* Held-out validation loss over a token stream, forward only; see validation.h. */
#include "train/validation.h"

#include <string.h>

#include "data/packing.h"

int validation_open(Validation *v, const char *source, TokensFormat format, int seq_len, int eval_batches,
                    int batch, int dp, int vocab_size, int eot, SeqErr *e) {
    memset(v, 0, sizeof *v);
    if (token_stream_open(&v->stream, source, format, STREAM_VAL, e) != 0) return -1;
    v->stream.vocab_size = vocab_size;
    v->seq_len = seq_len;
    size_t avail = v->stream.total > 0 ? (v->stream.total - 1) / (size_t)seq_len : 0;
    size_t want = (size_t)eval_batches * (size_t)batch;
    if (want > avail) want = avail;
    want -= want % (size_t)dp;
    if (want == 0) {
        int rc = seq_err(e, "--val-data '%s' holds %zu tokens, fewer than one sequence of --seq-len %d (+1) for each "
                         "of the %d data-parallel replicas: give more validation data or a shorter --seq-len", source,
                         v->stream.total, seq_len, dp);
        token_stream_close(&v->stream);
        return rc;
    }
    if (want > (size_t)(1 << 30)) want = (size_t)(1 << 30) - (size_t)(1 << 30) % (size_t)dp;
    v->n_seqs = (int)want;
    v->eot = eot;
    /* every sequence read once now: a token outside the vocabulary ends the run before step 1 */
    long scored;
    int rc = token_stream_scan(&v->stream, v->n_seqs, seq_len, eot, &scored, e);
    if (rc == 0 && scored == 0)
        rc = seq_err(e, "--val-data '%s': its %d sequences hold nothing but the end-of-text id %d (--pack), so no token "
                     "is scored: give other validation data", source, v->n_seqs, eot);
    if (rc != 0) token_stream_close(&v->stream);
    return rc;
}

void validation_close(Validation *v) { token_stream_close(&v->stream); }

int validation_loss(Validation *v, LlamaModel *m, LlamaActs *acts, SeqParallel *par, double *loss, long *n_tokens,
                    SeqErr *e) {
    int S = v->seq_len, N = par->n_local, dp = par->topo.dp;
    int *inputs = xmalloc(sizeof(int) * (size_t)S), *targets = xmalloc(sizeof(int) * (size_t)S);
    int *li = xmalloc(sizeof(int) * (size_t)N), *lt = xmalloc(sizeof(int) * (size_t)N);
    int *docs = v->eot >= 0 ? xmalloc(sizeof(int) * (size_t)S) : NULL, *ld = docs ? xmalloc(sizeof(int) * (size_t)N) : NULL;
    int rc = token_stream_seek(&v->stream, 0, 0, e);
    double sum = 0;
    long scored = 0;
    /* every rank reads every sequence (a failed read fails on all of them alike) and scores its
     * replica's ones; replicas run the same number of forwards (ZeRO-3 gathers in each) */
    for (int s = 0; s < v->n_seqs && rc == 0; s++) {
        rc = token_stream_next(&v->stream, S, inputs, targets, e);
        if (rc != 0) continue;
        if (docs) { /* as a training step packs its windows */
            pack_documents(inputs, S, v->eot, docs);
            pack_mask_targets(inputs, S, v->eot, targets);
        }
        for (int i = 0; i < S; i++) scored += targets[i] >= 0;
        if (s % dp != par->topo.dp_rank) continue;
        seq_parallel_take_local(par, inputs, li);
        seq_parallel_take_local(par, targets, lt);
        if (docs) seq_parallel_take_local(par, docs, ld);
        sum += llama_forward_backward_docs(m, acts, par->attn, li, lt, par->positions, ld, N, 1.0f, 0, NULL);
    }
    if (rc == 0) {
        *n_tokens = scored;
        *loss = seq_parallel_sum(par, sum) / (double)scored;
    }
    xfree(inputs); xfree(targets); xfree(li); xfree(lt); xfree(docs); xfree(ld);
    return rc;
}
