/* Generation over a key/value cache sharded across ranks; see dist_generate.h. */
#include "train/dist_generate.h"

#include <string.h>

#include "core/common.h"

static void attend(void *ctx, int layer, int n, const int *positions, const float *q, const float *k, const float *v,
                   float *o) {
    DistGenerator *g = ctx;
    if (g->block) {
        if (n != g->block) die("internal: %d new tokens in a block of %d", n, g->block);
        kv_shard_attend_block(&g->shard, g->par->comm, g->par->topo.world, g->scheme, layer, n, positions, g->rows,
                              g->owners, g->cached, llama_layer_window(&g->m->cfg, layer), q, k, v, o);
        return;
    }
    if (n != 1) die("internal: %d new tokens at once on a sharded cache outside a block", n);
    kv_shard_attend(&g->shard, g->par->comm, g->par->topo.world, layer, positions[0], g->row,
                    llama_layer_window(&g->m->cfg, layer), q, k, v, o);
}

void dist_generator_init(DistGenerator *g, LlamaModel *m, SeqParallel *par, int prompt_len, long max_new,
                         int max_block) {
    memset(g, 0, sizeof *g);
    const LlamaConfig *c = &m->cfg;
    g->m = m;
    g->par = par;
    g->prompt_len = prompt_len;
    g->rank = par->topo.world_rank;
    g->ranks = par->topo.world_size;
    /* this rank's prompt rows, then at most its share of the new ones (each goes to a shard holding
     * the fewest: no shard passes max(N, ceil((held + new) / ranks)) ) */
    const long cap = (long)par->n_local + (max_new + g->ranks - 1) / g->ranks + 1;
    kv_shard_init(&g->shard, c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                  (int)cap, g->ranks);
    g->precision = par->cfg.wire_bf16 ? PRECISION_BF16 : PRECISION_FP32; /* --precision bf16 */
    if (g->precision == PRECISION_BF16) kv_shard_set_bf16(&g->shard); /* bf16 values: the words hold them */
    g->counts = xcalloc((size_t)g->ranks, sizeof(int));
    g->row = -1;
    SeqErr e;
    if (max_block < 1) max_block = 1;
    g->rows = xmalloc(sizeof(int) * (size_t)max_block);
    g->owners = xmalloc(sizeof(int) * (size_t)max_block);
    g->cached = xmalloc(sizeof(int) * (size_t)g->ranks);
    if (generator_init_attend(&g->gen, m, (int)((long)prompt_len + max_new), max_block, attend, g, &e) != 0 ||
        generator_set_precision(&g->gen, g->precision, &e) != 0)
        die("%s", e.msg);
}

void dist_generator_free(DistGenerator *g) {
    generator_free(&g->gen);
    kv_shard_free(&g->shard);
    xfree(g->counts);
    xfree(g->rows);
    xfree(g->owners);
    xfree(g->cached);
    memset(g, 0, sizeof *g);
}

size_t dist_generator_cache_bytes(const DistGenerator *g) { return kv_shard_bytes(&g->shard); }

void dist_generator_prefill(DistGenerator *g, const int *prompt, float *last, float *prompt_logits) {
    SeqParallel *par = g->par;
    const int S = par->seq_len, N = par->n_local, P = g->prompt_len, V = g->m->cfg.vocab_size;
    Comm *comm = par->comm;
    const MPI_Comm world = par->topo.world;
    /* the prompt and its padding (token 0, after every prompt token: no prompt token sees it) */
    int *tokens = xcalloc((size_t)S, sizeof(int)), *local = xmalloc(sizeof(int) * (size_t)N);
    memcpy(tokens, prompt, sizeof(int) * (size_t)P);
    seq_parallel_take_local(par, tokens, local);
    /* the logits wanted here: every prompt row for prompt_logits, else the last prompt token's */
    int *rows = xmalloc(sizeof(int) * (size_t)N), n_rows = 0, have_last = 0;
    for (int i = 0; i < N; i++) {
        const int p = par->positions[i];
        if (p == P - 1) have_last = 1;
        if ((prompt_logits || p == P - 1) && p < P) rows[n_rows++] = i;
    }
    float *out = xmalloc(sizeof(float) * (size_t)V * (size_t)(n_rows ? n_rows : 1));
    SeqAttention *capture = kv_capture_create(par->attn, &g->shard);
    LlamaActsOptions ao = {.rank = g->rank, .no_stream = 1, .forward_only = 1, .precision = g->precision};
    LlamaActs *acts = llama_acts_create_opts(g->m, capture, N, &ao);
    llama_forward_logits(g->m, acts, capture, local, par->positions, N, rows, n_rows, out);
    llama_acts_free(acts);
    seq_attention_destroy(capture);
    kv_shard_keep(&g->shard, par->positions, N, P);
    if (g->ranks > 1) comm_allgather_meta(comm, COMM_TEAM, &g->shard.n, g->counts, sizeof(int), world);
    else g->counts[0] = g->shard.n;

    /* the last prompt token's logits, from the rank that holds it to every rank */
    int root = have_last ? g->rank : -1;
    if (g->ranks > 1) comm_control_allreduce(comm, "MPI_Iallreduce (prefill owner)", &root, 1, MPI_INT, MPI_MAX, world);
    if (have_last)
        for (int r = 0; r < n_rows; r++)
            if (par->positions[rows[r]] == P - 1) memcpy(last, out + (size_t)r * V, sizeof(float) * (size_t)V);
    if (g->ranks > 1) comm_control_bcast(comm, "MPI_Ibcast (prefill logits)", last, sizeof(float) * (size_t)V, root, world);

    if (prompt_logits) { /* every rank's rows to rank 0, then in position order */
        size_t *cnt = xmalloc(sizeof(size_t) * (size_t)g->ranks), *dis = xmalloc(sizeof(size_t) * (size_t)g->ranks);
        size_t at = 0;
        for (int r = 0; r < g->ranks; r++) cnt[r] = (size_t)g->counts[r], dis[r] = at, at += cnt[r];
        int *pos = xmalloc(sizeof(int) * (size_t)P), *mine = xmalloc(sizeof(int) * (size_t)(n_rows ? n_rows : 1));
        for (int r = 0; r < n_rows; r++) mine[r] = par->positions[rows[r]];
        float *all = g->rank == 0 ? xmalloc(sizeof(float) * (size_t)P * V) : NULL;
        if (g->ranks > 1) {
            comm_gatherv(comm, COMM_TEAM, mine, (size_t)n_rows, pos, cnt, dis, MPI_INT, 0, world);
            for (int r = 0; r < g->ranks; r++) cnt[r] *= (size_t)V, dis[r] *= (size_t)V;
            comm_gatherv(comm, COMM_TEAM, out, (size_t)n_rows * V, all, cnt, dis, MPI_FLOAT, 0, world);
        } else {
            memcpy(pos, mine, sizeof(int) * (size_t)n_rows);
            memcpy(all, out, sizeof(float) * (size_t)n_rows * V);
        }
        if (g->rank == 0)
            for (int i = 0; i < P; i++) memcpy(prompt_logits + (size_t)pos[i] * V, all + (size_t)i * V, sizeof(float) * V);
        xfree(cnt); xfree(dis); xfree(pos); xfree(mine); xfree(all);
    }
    xfree(tokens); xfree(local); xfree(rows); xfree(out);
    g->gen.len = P;
}

/* The rank whose shard holds the fewest tokens (the lowest such rank) keeps the token at pos: its
 * row there, -1 on the others; *owner that rank. */
static int keep(DistGenerator *g, int pos, int *owner) {
    int o = 0;
    for (int r = 1; r < g->ranks; r++)
        if (g->counts[r] < g->counts[o]) o = r;
    g->counts[o]++;
    *owner = o;
    const int row = o == g->rank ? kv_shard_reserve(&g->shard, pos) : -1;
    if (o == g->rank && row < 0) die("internal: the cache shard of rank %d is full", g->rank);
    return row;
}

int dist_generator_step(DistGenerator *g, int token, float *logits, SeqErr *e) {
    const int pos = g->gen.len;
    if (pos >= g->gen.max_len)
        return seq_err(e, "the sequence would reach %d tokens, beyond the %d this generator holds", pos + 1,
                       g->gen.max_len);
    int owner;
    g->row = keep(g, pos, &owner);
    return generator_forward(&g->gen, &token, 1, NULL, logits, e);
}

int dist_generator_continue(DistGenerator *g, const int *tokens, int T, KvScheme scheme, float *all, float *logits,
                            SeqErr *e) {
    const int pos = g->gen.len;
    if (T <= 0) return 0;
    if (T > g->gen.max_chunk) return seq_err(e, "internal: a block of %d tokens, at most %d", T, g->gen.max_chunk);
    if (pos + T > g->gen.max_len)
        return seq_err(e, "the sequence would reach %d tokens, beyond the %d this generator holds", pos + T,
                       g->gen.max_len);
    memcpy(g->cached, g->counts, sizeof(int) * (size_t)g->ranks);
    for (int t = 0; t < T; t++) g->rows[t] = keep(g, pos + t, &g->owners[t]);
    g->block = T;
    g->scheme = scheme == KV_AUTO ? KV_PASS_Q : scheme;
    const int rc = generator_forward(&g->gen, tokens, T, all, logits, e);
    g->block = 0;
    return rc;
}

/* The first token of piece i of T split into nb pieces as even as can be (sizes differ by one at
 * most): no piece of one token unless T or the block is one, so every piece's matrix products take
 * the BLAS's many-row path as one block's do (a one-row product takes another, which rounds
 * differently). */
static int piece(int T, int nb, int i) { return (int)((long)T * i / nb); }

int dist_generator_continue_blocks(DistGenerator *g, const int *tokens, int T, int block, KvScheme want, float *all,
                                   float *logits, KvScheme *used, double *pass_q, double *pass_kv, SeqErr *e) {
    const LlamaConfig *c = &g->m->cfg;
    const int V = c->vocab_size, L = c->num_hidden_layers;
    if (block < 1 || block > g->gen.max_chunk) block = g->gen.max_chunk;
    const int nb = T > 0 ? (T + block - 1) / block : 0;
    long cached = 0;
    for (int r = 0; r < g->ranks; r++) cached += g->counts[r];
    int *windows = xmalloc(sizeof(int) * (size_t)(L > 0 ? L : 1));
    for (int l = 0; l < L; l++) windows[l] = llama_layer_window(c, l);
    *pass_q = *pass_kv = 0;
    for (int i = 0; i < nb; i++) { /* each piece after the cache and the pieces before it */
        double q, kv;
        kv_scheme_bytes(&g->shard, piece(T, nb, i + 1) - piece(T, nb, i), cached + piece(T, nb, i), windows, &q, &kv);
        *pass_q += q;
        *pass_kv += kv;
    }
    xfree(windows);
    const KvScheme scheme = want != KV_AUTO ? want : *pass_kv < *pass_q ? KV_PASS_KV : KV_PASS_Q;
    *used = scheme;
    for (int i = 0; i < nb; i++) {
        const int at = piece(T, nb, i), n = piece(T, nb, i + 1) - at;
        if (dist_generator_continue(g, tokens + at, n, scheme, all ? all + (size_t)at * V : NULL, logits, e) != 0)
            return -1;
    }
    return 0;
}

int dist_generator_choose(DistGenerator *g, const float *logits, const SampleParams *sp, const int *ids, long n_ids,
                          Rng *rng) {
    int next = g->rank == 0 ? sample_next_token(logits, g->m->cfg.vocab_size, sp, ids, n_ids, rng) : 0;
    if (g->ranks > 1) comm_control_bcast(g->par->comm, "MPI_Ibcast (next token)", &next, sizeof next, 0, g->par->topo.world);
    return next;
}
