/* FPDT (Fully Pipelined Distributed Transformer, DeepSpeed Ulysses-Offload; paper 003 §4, notes
 * §8) as its own SeqAttention: Ulysses run per sequence chunk.
 *
 * Layout (rank-ordinal chunks): u chunks of Cn = S / u global tokens, each cut into P = hp pieces
 * of c = Cn / P tokens; local chunk i of member r holds global piece i P + r, i.e. positions
 * [i Cn + r c, i Cn + (r + 1) c). The head exchange of local chunk i (a HeadExchange built for
 * N = c rows) gives every member the contiguous global segment [i Cn, (i + 1) Cn) for its Hl
 * query heads and Hk KV heads: chunk order is causal order.
 *
 * Forward, chunk i = 0 .. u-1: exchange q, k, v of local chunk i -> q_h_i, kv_h_i (stored in the
 * tier); o_h_i, lse_h_i = attention of q_h_i against kv_h_0 .. kv_h_i one chunk at a time through
 * the block iterator (chunks j < i fully visible, j = i causal), merged in place; o_h_i back
 * through the exchange into local chunk i of o. Resident while attending: q_h_i, o_h_i, lse_h_i,
 * kv_h_i and the one fetched kv_h_j (at most two KV chunks).
 *
 * Backward: dout of every chunk through the exchange and delta_j = rowsum(dout_h_j o_h_j), dout_h_j
 * into the dout tier (RAM, or a second file with --offload-dir); then key/value chunks outer (i),
 * query chunks inner (j = i .. u-1): dq_h_j += ..., dkv_i += ... dq_h_j's last contribution comes
 * at outer i = j, dk_i, dv_i are final after the inner loop: both go back through the exchange at
 * the end of outer step i. Resident in the compute loop: kv_h_i and its gradient dkv_i (the two
 * KV-sized chunks), plus q_h_j, lse_h_j, dout_h_j of the current query chunk; dq_h of all chunks
 * (S Hl d floats per member) and delta (S Hl) stay in RAM: dq_h_j is read and written at every
 * outer step i <= j, so on disk it would cost u times its size in each direction per layer.
 *
 * Chunk streaming (seq_attention.h): forward_chunk(i) is forward's step i; output_chunk(i) +
 * dout_chunk(i) are backward's first pass for chunk i (o_h_i fetched once for both: o_i back
 * through the exchange for the model, then delta_i); backward_chunk(i) is outer step i, handing
 * back local chunk i's final dq, dk, dv. forward() and backward() are the same steps over all
 * chunks, so the two paths run identical strategy arithmetic.
 *
 * Saved per layer (through the chunk tier, RAM today): q_h, kv_h, o_h, lse_h of every chunk,
 * S (2 Hl d + 2 Hk d + Hl) floats on member p, the same as Ulysses; lse is the kept suffix for
 * selective checkpointing, restore() redoes the exchanges of q, k, v and o per chunk.
 *
 * With --offload-dir the tier is the disk one (chunk_tier.h): q_h, kv_h, o_h chunks go to a file
 * and come back one chunk ahead of use (forward: kv_h_{j+1} read while kv_h_j computes;
 * backward: o_h_{j+1}, kv_h_{i+1}, q_h_{j+1} likewise); `saved` holds only lse_h, S Hl floats.
 *
 * Sliding windows (SeqAttention.window): chunk i's queries attend only to the chunks from the first
 * some window of theirs reaches, and key chunk i's backward runs only over the query chunks up to
 * the last one whose windows reach it (first_seen, last_seeing): the chunks outside are never
 * fetched, so the tier's reads grow with the window, not with the chunk's index.
 *
 * Communication per layer: u head exchanges of c rows, i.e. Ulysses' bytes (linear in rows) in
 * u times as many messages. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "parallel/block_attention.h"
#include "memory/chunk_tier.h"
#include "parallel/dist_attention.h"
#include "strategies/registry.h"

typedef struct {
    const Topology *t;
    Comm *comm;
    HeadExchange hx;
    BlockAttn b;
    ChunkTier *tier;
    int S, P, u, N, c, Cn, H, Hkv, Hl, Hk, d;
    int *all_pos;    /* (S) local positions of every member, member-major */
    int *cpos;       /* (S) positions after the exchange, chunk-major: chunk i at [i Cn, (i+1) Cn) */
    int *all_doc, *cdoc; /* (S) each: document ids (packed sequences) in the orders of all_pos, cpos */
    PosRun *runs;    /* (S) */
    PosBlock *blk;   /* (u) */
    float *dout_h, *delta, *dq_h, *dkv_h;
    ChunkTier *dout_tier; /* dout_h of every chunk: RAM (over dout_h) or a second disk file */
    float *dout_saved;    /* the dout tier's `saved`: dout_h (RAM) or an empty key (disk) */
    float dout_key;
    const float *held_o;  /* o_h of held_chunk, fetched by output_chunk for dout_chunk */
    int held_chunk;       /* -1: none */
    long batches;    /* set_positions calls */
    const char *offload_dir; /* NULL: RAM tier */
} Fpdt;

static int fpdt_chunks(const StrategyParams *p) { return p->chunks > 0 ? p->chunks : 1; }

static char *fpdt_check(const StrategyParams *p) {
    char buf[512];
    char *err = strategy_check_heads(p);
    if (err) return err;
    const long u = fpdt_chunks(p), P = p->hp, unit = u * P;
    if (p->cp != 1) {
        snprintf(buf, sizeof buf, "--strategy fpdt splits heads only: drop --cp %d", p->cp);
        return xstrdup(buf);
    }
    if (p->seq_len > 0 && p->seq_len % unit == 0) return NULL;
    long below = p->seq_len / unit * unit, above = below + unit;
    int len = snprintf(buf, sizeof buf,
                       "--strategy fpdt --chunks %ld over hp %ld: --seq-len %ld must split into chunks x hp = %ld pieces "
                       "(e.g. --seq-len %ld",
                       u, P, p->seq_len, unit, below > 0 ? below : above);
    if (below > 0) len += snprintf(buf + len, sizeof buf - (size_t)len, " or %ld", above);
    int listed = 0;
    for (long v = 1; p->seq_len > 0 && v <= p->seq_len / P && listed < 8 && len < (int)sizeof buf - 40; v++)
        if (p->seq_len % (v * P) == 0)
            len += snprintf(buf + len, sizeof buf - (size_t)len, "%s%ld", listed++ ? ", " : "; or --chunks ", v);
    snprintf(buf + len, sizeof buf - (size_t)len, ")");
    return xstrdup(buf);
}

static void fpdt_positions(const StrategyParams *p, int hp_rank, int cp_rank, int *positions) {
    (void)cp_rank;
    const int u = fpdt_chunks(p), P = p->hp, S = (int)p->seq_len, Cn = S / u, c = Cn / P;
    for (int i = 0; i < u; i++)
        for (int r = 0; r < c; r++) positions[(size_t)i * c + r] = i * Cn + hp_rank * c + r;
}

static void fpdt_volume(const StrategyParams *p, int hp_rank, AttnVolume *v) {
    memset(v, 0, sizeof *v);
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("fpdt_volume: %s", err);
    /* u exchanges of a chunk's c local rows a layer; delta is made after dout's exchange (dout_one) */
    const long u = fpdt_chunks(p), N = p->seq_len / p->hp, c = N / u;
    dist_attention_exchange_volume(p, &hs, hp_rank, c, (int)u, 0, v);
    head_split_free(&hs);
}

static void fpdt_memory(const StrategyParams *p, int hp_rank, AttnMemory *m) {
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("fpdt_memory: %s", err);
    const size_t u = (size_t)fpdt_chunks(p), S = (size_t)p->seq_len, Cn = S / u, c = Cn / (size_t)p->hp;
    const size_t d = (size_t)p->head_dim, Hl = (size_t)hs.hl[hp_rank], Hk = (size_t)hs.hk[hp_rank];
    m->saved_per_layer = S * (2 * Hl * d + 2 * Hk * d + Hl); /* q_h, o_h, kv_h, lse_h of all chunks */
    m->kept_per_layer = S * Hl;                                /* lse_h of all chunks */
    /* q_h | kv_h (| o_h, bf16-rounded under bf16 attention) of all chunks (RAM tier) */
    m->bf16_per_layer = p->offload_dir ? 0 : S * (Hl * d + 2 * Hk * d + (p->attn_bf16 ? Hl * d : 0));
    size_t tier = 0, dout_h = S * Hl * d;
    if (p->offload_dir) { /* only lse_h stays; two staging and two read buffers of q_h, kv_h, o_h chunks,
                             and of dout_h chunks (the backward's second file) */
        m->saved_per_layer = S * Hl;
        tier = 4 * Cn * (2 * Hl * d + 2 * Hk * d) + 4 * Cn * Hl * d;
        if (p->attn_bf16) { /* each file's helper moves bf16 chunks through a bf16 buffer of the largest */
            const size_t widest = Cn * (Hl > 2 * Hk ? Hl : 2 * Hk) * d;
            tier += (widest + 1) / 2 + (Cn * Hl * d + 1) / 2;
        }
        dout_h = 0;
        /* q_h, kv_h, o_h of every chunk in the layer's file (bf16 values as bf16 under bf16: chunk_tier.h),
         * and the backward's dout_h of every chunk in the second file */
        const double elem = p->attn_bf16 ? 2 : 4;
        m->disk_per_layer = elem * (double)S * (2.0 * Hl * d + 2.0 * Hk * d);
        m->disk_workspace = elem * (double)S * (double)Hl * d;
    }
    m->rows_per_call = Cn; /* block_attention calls the kernel a chunk at a time (one run) */
    size_t send = 0, recv = 0; /* the head exchange of one chunk (head_exchange.c's buffers) */
    for (int q = 0; q < p->hp; q++) {
        send += c * (size_t)(hs.hl[q] + 2 * hs.hk[q]) * d;
        recv += c * (Hl + 2 * Hk) * d;
    }
    if (Cn * Hl * d > send) send = Cn * Hl * d;
    if (c * (size_t)p->n_heads * d > recv) recv = c * (size_t)p->n_heads * d;
    size_t exchange = send + (p->hp > 1 ? recv : 0);
    size_t scratch = dout_h + S * Hl * d + S * Hl + 2 * Cn * Hk * d; /* dout_h (RAM tier), dq_h, delta, dkv of one chunk */
    /* positions and document ids (2 x S ints each) and runs */
    size_t index = 4 * S + S * (sizeof(PosRun) / sizeof(float));
    m->workspace = exchange + scratch + index + tier;
    head_split_free(&hs);
}

static size_t rows_off(const Fpdt *x, int chunk, int heads) { return (size_t)chunk * x->c * heads * x->d; }

/* Gathers one int per local token of every member (member-major) into all (S). */
static void gather_member_ints(Fpdt *x, const int *mine, int *all) {
    if (x->P > 1)
        comm_allgather_meta(x->comm, COMM_ALLTOALL, mine, all, sizeof(int) * (size_t)x->N, x->t->sp_comm);
    else
        memcpy(all, mine, sizeof(int) * (size_t)x->N);
}

/* Member-major (all) to chunk-major (chunked): chunk i holds piece i of every member. */
static void chunk_major(const Fpdt *x, const int *all, int *chunked) {
    for (int i = 0; i < x->u; i++)
        for (int m = 0; m < x->P; m++)
            memcpy(chunked + (size_t)i * x->Cn + (size_t)m * x->c, all + (size_t)m * x->N + (size_t)i * x->c,
                   sizeof(int) * (size_t)x->c);
}

static void fpdt_set_positions(SeqAttention *sa, const int *positions, const int *docs) {
    Fpdt *x = sa->ctx;
    x->batches++;
    gather_member_ints(x, positions, x->all_pos);
    chunk_major(x, x->all_pos, x->cpos);
    if (docs) {
        gather_member_ints(x, docs, x->all_doc);
        chunk_major(x, x->all_doc, x->cdoc);
    }
    for (int i = 0; i < x->u; i++)
        pos_block_init(&x->blk[i], x->cpos + (size_t)i * x->Cn, docs ? x->cdoc + (size_t)i * x->Cn : NULL, x->Cn,
                       x->runs + (size_t)i * x->Cn);
}

static void tier_check(ChunkTier *t, int rc) {
    if (rc) die("fpdt: %s tier: %s", t->name, t->err);
}

/* After each forward, backward and restore (collective): a slow-tier I/O failure on any rank
 * stops every rank with the same one line. */
static void tier_sync(Fpdt *x) {
    if (!x->offload_dir) return;
    int e = x->tier->io_errno ? x->tier->io_errno : x->dout_tier->io_errno;
    if (x->P > 1) comm_control_allreduce(x->comm, "MPI_Iallreduce (offload errors)", &e, 1, MPI_INT, MPI_MAX, x->t->sp_comm);
    if (e)
        die_collective("--offload-dir %s: the offload file could not be written or read (%s): free space there or "
                       "choose another directory", x->offload_dir, strerror(e));
}

/* Under a sliding window (x->b.window) the chunks a chunk's queries can see are a range: from the
 * first whose keys reach some window of query chunk i (0 without a window), and, for key chunk i,
 * the query chunks up to the last one some of whose windows reach it (u - 1 without one). Chunks
 * outside are never fetched from the tier (their attention is all hidden: the same results). */
static int first_seen(const Fpdt *x, int i) {
    int j = 0;
    while (j < i && !pos_blocks_meet(&x->blk[i], &x->blk[j], x->b.window)) j++;
    return j;
}

static int last_seeing(const Fpdt *x, int i) {
    int j = x->u - 1;
    while (j > i && !pos_blocks_meet(&x->blk[j], &x->blk[i], x->b.window)) j--;
    return j;
}

/* Forward of local chunk i (q_i, k_i, v_i: its c rows; o_i: its c output rows). */
static void fwd_chunk(Fpdt *x, int i, const float *q_i, const float *k_i, const float *v_i, float *o_i, float *saved) {
    ChunkTier *t = x->tier;
    const size_t kv_half = (size_t)x->Cn * x->Hk * x->d;
    AttnShape st = {.n_q = x->Cn, .n_heads = x->Hl, .head_dim = x->d};
    if (i == 0) x->b.work.fwd_calls = x->b.work.fwd_cells = 0;
    float *q_h = t->slot(t, saved, TIER_Q, i), *kv_h = t->slot(t, saved, TIER_KV, i);
    if (!q_h || !kv_h) tier_check(t, -1);
    head_exchange_qkv(&x->hx, q_i, k_i, v_i, q_h, kv_h);
    tier_check(t, t->store(t, saved, TIER_Q, i));
    float *o_h = t->slot(t, saved, TIER_O, i), *lse_h = t->slot(t, saved, TIER_LSE, i);
    if (!o_h || !lse_h) tier_check(t, -1);
    double t0 = comm_compute_begin(x->comm);
    attn_state_init(&st, o_h, lse_h);
    const int j0 = first_seen(x, i); /* the kv chunks before j0 lie before every window */
    if (i > j0) t->prefetch(t, saved, TIER_KV, j0, j0 & 1);
    for (int j = j0; j <= i; j++) { /* kv_h_i (just made) and at most one fetched kv_h_j */
        const float *kv = j == i ? kv_h : t->fetch(t, saved, TIER_KV, j, j & 1);
        if (!kv) tier_check(t, -1);
        if (j + 1 < i) t->prefetch(t, saved, TIER_KV, j + 1, (j + 1) & 1);
        block_attn_forward(&x->b, q_h, &x->blk[i], kv, kv + kv_half, &x->blk[j], o_h, lse_h, NULL);
        if (j != i) t->release(t, kv);
    }
    comm_compute_end(x->comm, "attn fwd", t0);
    tier_check(t, t->store(t, saved, TIER_KV, i));
    /* bf16: o_h rounded before it is kept and sent, so the o the model keeps, this o_h and one
     * restored from that o (selective) are the same values, and so is the backward's delta */
    if (x->b.precision == PRECISION_BF16) bf16_round(o_h, (size_t)x->Cn * x->Hl * x->d);
    head_exchange_out(&x->hx, o_h, o_i);
    tier_check(t, t->store(t, saved, TIER_O, i));
    tier_check(t, t->store(t, saved, TIER_LSE, i));
}

/* Backward, first pass over chunk j: dout_h_j (through the exchange, into the dout tier) and
 * delta_j = rowsum(dout_h_j o_h_j). o_h_j is the one output_chunk(j) fetched, or fetched here. */
static void dout_one(Fpdt *x, int j, const float *saved, const float *dout_j) {
    ChunkTier *t = x->tier, *dt = x->dout_tier;
    const size_t lsz = (size_t)x->Cn * x->Hl;
    AttnShape st = {.n_q = x->Cn, .n_heads = x->Hl, .head_dim = x->d};
    float *dout_h = dt->slot(dt, x->dout_saved, TIER_Q, j);
    if (!dout_h) tier_check(dt, -1);
    head_exchange_dout(&x->hx, dout_j, dout_h);
    const float *o_h = x->held_o;
    if (x->held_chunk != j) {
        if (j + 1 < x->u) t->prefetch(t, saved, TIER_O, j + 1, (j + 1) & 1);
        o_h = t->fetch(t, saved, TIER_O, j, j & 1);
        if (!o_h) tier_check(t, -1);
    }
    double t0 = comm_compute_begin(x->comm);
    attn_backward_delta(&st, o_h, dout_h, x->delta + j * lsz);
    comm_compute_end(x->comm, "delta", t0);
    t->release(t, o_h);
    x->held_o = NULL;
    x->held_chunk = -1;
    tier_check(dt, dt->store(dt, x->dout_saved, TIER_Q, j));
}

/* Backward, second pass: key/value chunk i outer, query chunks j = i .. u-1 inner (the ones that
 * see chunk i). dq_h_i got its last contribution at j = i and dk_i, dv_i are complete after the
 * inner loop: all three go back through the exchange into local chunk i's rows dq_i, dk_i, dv_i.
 * dq_h of the later chunks keeps accumulating in RAM (read and written at every outer step, so
 * the slow tier would move it u times over). */
static void outer_one(Fpdt *x, int i, const float *saved, float *dq_i, float *dk_i, float *dv_i) {
    ChunkTier *t = x->tier, *dt = x->dout_tier;
    const size_t kv_half = (size_t)x->Cn * x->Hk * x->d, qsz = (size_t)x->Cn * x->Hl * x->d,
                 lsz = (size_t)x->Cn * x->Hl;
    if (i == 0) {
        x->b.work.bwd_calls = x->b.work.bwd_cells = 0;
        memset(x->dq_h, 0, sizeof(float) * qsz * (size_t)x->u);
    }
    if (i + 1 < x->u) t->prefetch(t, saved, TIER_KV, i + 1, (i + 1) & 1);
    const float *kv = t->fetch(t, saved, TIER_KV, i, i & 1);
    if (!kv) tier_check(t, -1);
    memset(x->dkv_h, 0, sizeof(float) * 2 * kv_half);
    double t0 = comm_compute_begin(x->comm);
    const int j1 = last_seeing(x, i); /* the query chunks after j1 see none of kv chunk i */
    for (int j = i; j <= j1; j++) {
        if (j + 1 <= j1) {
            t->prefetch(t, saved, TIER_Q, j + 1, (j + 1) & 1);
            t->prefetch(t, saved, TIER_LSE, j + 1, (j + 1) & 1);
            dt->prefetch(dt, x->dout_saved, TIER_Q, j + 1, (j + 1) & 1);
        }
        const float *q_h = t->fetch(t, saved, TIER_Q, j, j & 1), *lse_h = t->fetch(t, saved, TIER_LSE, j, j & 1);
        const float *dout_h = dt->fetch(dt, x->dout_saved, TIER_Q, j, j & 1);
        if (!q_h || !lse_h) tier_check(t, -1);
        if (!dout_h) tier_check(dt, -1);
        block_attn_backward(&x->b, q_h, &x->blk[j], kv, kv + kv_half, &x->blk[i], lse_h, x->delta + j * lsz, dout_h,
                            x->dq_h + j * qsz, x->dkv_h, x->dkv_h + kv_half, NULL);
        t->release(t, q_h);
        t->release(t, lse_h);
        dt->release(dt, dout_h);
    }
    comm_compute_end(x->comm, "attn bwd", t0);
    t->release(t, kv);
    head_exchange_grads(&x->hx, x->dq_h + i * qsz, x->dkv_h, dq_i, dk_i, dv_i);
}

static void fpdt_forward(SeqAttention *sa, const float *q, const float *k, const float *v, float *o, float *saved) {
    Fpdt *x = sa->ctx;
    x->b.window = sa->window;
    for (int i = 0; i < x->u; i++)
        fwd_chunk(x, i, q + rows_off(x, i, x->H), k + rows_off(x, i, x->Hkv), v + rows_off(x, i, x->Hkv),
                  o + rows_off(x, i, x->H), saved);
    tier_sync(x);
}

static void fpdt_backward(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                          const float *saved, const float *dout, float *dq, float *dk, float *dv) {
    Fpdt *x = sa->ctx;
    (void)q, (void)k, (void)v, (void)o; /* the strategy's own copies are in the tier */
    x->b.window = sa->window;
    for (int j = 0; j < x->u; j++) dout_one(x, j, saved, dout + rows_off(x, j, x->H));
    for (int i = 0; i < x->u; i++)
        outer_one(x, i, saved, dq + rows_off(x, i, x->H), dk + rows_off(x, i, x->Hkv), dv + rows_off(x, i, x->Hkv));
    tier_sync(x);
}

/* The chunk calls (seq_attention.h): the same steps, one chunk per call; the collective error
 * check after the last chunk of each pass. */
static void fpdt_forward_chunk(SeqAttention *sa, int i, const float *q, const float *k, const float *v, float *o,
                               float *saved) {
    Fpdt *x = sa->ctx;
    x->b.window = sa->window;
    fwd_chunk(x, i, q, k, v, o, saved);
    if (i == x->u - 1) tier_sync(x);
}

static void fpdt_output_chunk(SeqAttention *sa, int i, const float *saved, float *o) {
    Fpdt *x = sa->ctx;
    ChunkTier *t = x->tier;
    if (i + 1 < x->u) t->prefetch(t, saved, TIER_O, i + 1, (i + 1) & 1);
    const float *o_h = t->fetch(t, saved, TIER_O, i, i & 1);
    if (!o_h) tier_check(t, -1);
    head_exchange_out(&x->hx, o_h, o);
    x->held_o = o_h; /* dout_chunk(i) reads it */
    x->held_chunk = i;
}

static void fpdt_dout_chunk(SeqAttention *sa, int i, const float *saved, const float *dout) {
    dout_one(sa->ctx, i, saved, dout);
}

static void fpdt_backward_chunk(SeqAttention *sa, int i, const float *saved, float *dq, float *dk, float *dv) {
    Fpdt *x = sa->ctx;
    x->b.window = sa->window;
    outer_one(x, i, saved, dq, dk, dv);
    if (i == x->u - 1) tier_sync(x);
}

/* Selective checkpointing: q_h, kv_h and o_h of every chunk by the exchanges forward ran (o by
 * the dout exchange, the inverse of head_exchange_out); lse_h (the suffix) is kept. */
static void fpdt_restore(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                         float *saved) {
    Fpdt *x = sa->ctx;
    ChunkTier *t = x->tier;
    for (int i = 0; i < x->u; i++) {
        float *q_h = t->slot(t, saved, TIER_Q, i), *kv_h = t->slot(t, saved, TIER_KV, i), *o_h = t->slot(t, saved, TIER_O, i);
        if (!q_h || !kv_h || !o_h) tier_check(t, -1);
        head_exchange_qkv(&x->hx, q + rows_off(x, i, x->H), k + rows_off(x, i, x->Hkv), v + rows_off(x, i, x->Hkv), q_h,
                          kv_h);
        head_exchange_dout(&x->hx, o + rows_off(x, i, x->H), o_h);
        tier_check(t, t->store(t, saved, TIER_Q, i));
        tier_check(t, t->store(t, saved, TIER_KV, i));
        tier_check(t, t->store(t, saved, TIER_O, i));
    }
    tier_sync(x);
}

static void fpdt_destroy(SeqAttention *sa) {
    if (!sa) return;
    Fpdt *x = sa->ctx;
    chunk_tier_destroy(x->tier);
    chunk_tier_destroy(x->dout_tier);
    head_exchange_free(&x->hx);
    xfree(x->all_pos);
    xfree(x->cpos);
    xfree(x->all_doc);
    xfree(x->cdoc);
    xfree(x->runs);
    xfree(x->blk);
    xfree(x->dout_h);
    xfree(x->delta);
    xfree(x->dq_h);
    xfree(x->dkv_h);
    xfree(x);
    xfree(sa);
}

static void fpdt_set_piece_rows(SeqAttention *sa, int rows) { ((Fpdt *)sa->ctx)->b.piece_rows = rows > 0 ? rows : 0; }

static void fpdt_set_compute(SeqAttention *sa, int enabled) { ((Fpdt *)sa->ctx)->b.compute = enabled != 0; }

static SeqAttention *fpdt_create(const StrategyParams *p, const Topology *t, Comm *comm) {
    Fpdt *x = xcalloc(1, sizeof *x);
    x->t = t;
    x->comm = comm;
    x->S = (int)p->seq_len;
    x->P = t->hp;
    x->u = fpdt_chunks(p);
    x->N = x->S / x->P;
    x->Cn = x->S / x->u;
    x->c = x->N / x->u;
    x->H = p->n_heads;
    x->Hkv = p->n_kv_heads;
    x->d = p->head_dim;
    dist_attention_exchange_init(&x->hx, p, t, comm, x->c);
    x->Hl = x->hx.Hl;
    x->Hk = x->hx.Hk;
    block_attn_init(&x->b, comm, x->Hl, x->Hk, x->d);
    if (p->attn_bf16) x->b.precision = PRECISION_BF16; /* bf16 inputs: the kernel's bf16 tiles */
    const size_t S = (size_t)x->S, d = (size_t)x->d, Cn = (size_t)x->Cn;
    const size_t sizes[TIER_KINDS] = {Cn * x->Hl * d, 2 * Cn * x->Hk * d, Cn * x->Hl * d, Cn * x->Hl};
    x->offload_dir = p->offload_dir;
    if (p->offload_dir) {
        char err[512];
        /* under bf16 attention q_h, kv_h and (rounded in fwd_chunk) o_h are bf16 values: bf16 on disk */
        const unsigned b16 = p->attn_bf16 ? 1u << TIER_Q | 1u << TIER_KV | 1u << TIER_O : 0;
        x->tier = chunk_tier_disk_create("--offload-dir", p->offload_dir, t->world_rank, x->u, sizes, b16, err, sizeof err);
        if (!x->tier) die("%s", err); /* after the set-up's probe: this rank alone (chunk_tier.h) */
    } else {
        x->tier = chunk_tier_ram_create(x->u, sizes);
    }
    x->all_pos = xmalloc(sizeof(int) * S);
    x->cpos = xmalloc(sizeof(int) * S);
    x->all_doc = xmalloc(sizeof(int) * S);
    x->cdoc = xmalloc(sizeof(int) * S);
    x->runs = xmalloc(sizeof(PosRun) * S);
    x->blk = xcalloc((size_t)x->u, sizeof(PosBlock));
    x->held_chunk = -1;
    if (p->offload_dir) {
        const size_t dsizes[TIER_KINDS] = {Cn * x->Hl * d, 0, 0, 0};
        char err[512];
        /* dout_h: the model's dout, bf16-rounded under bf16 */
        x->dout_tier = chunk_tier_disk_create("--offload-dir", p->offload_dir, t->world_rank, x->u, dsizes,
                                              p->attn_bf16 ? 1u << TIER_Q : 0, err, sizeof err);
        if (!x->dout_tier) die("%s", err);
        x->dout_saved = &x->dout_key;
    } else {
        const size_t dsizes[TIER_KINDS] = {Cn * x->Hl * d, 0, 0, 0};
        x->dout_h = xmalloc_aligned(sizeof(float) * S * x->Hl * d);
        x->dout_tier = chunk_tier_ram_create(x->u, dsizes);
        x->dout_saved = x->dout_h;
    }
    x->delta = xmalloc_aligned(sizeof(float) * S * x->Hl);
    x->dq_h = xmalloc_aligned(sizeof(float) * S * x->Hl * d);
    x->dkv_h = xmalloc_aligned(sizeof(float) * 2 * Cn * x->Hk * d);
    SeqAttention *sa = xcalloc(1, sizeof *sa);
    sa->name = "fpdt";
    sa->ctx = x;
    sa->heads = (AttnHeads){.n_local = x->N, .n_heads = x->H, .n_kv_heads = x->Hkv, .head_dim = x->d};
    sa->saved_floats = p->offload_dir ? chunk_tier_disk_saved_floats(x->u, sizes) : chunk_tier_ram_saved_floats(x->u, sizes);
    sa->keeps_inputs = 1;
    sa->kept_floats = (size_t)x->u * sizes[TIER_LSE]; /* lse_h of every chunk: the suffix */
    /* the RAM tier's q_h and kv_h chunks, copies of q, k, v, and under bf16 attention its o_h
     * chunks, rounded in fwd_chunk (the prefix: kind-major layout) */
    sa->bf16_floats = p->offload_dir ? 0
                                     : (size_t)x->u * (sizes[TIER_Q] + sizes[TIER_KV] + (p->attn_bf16 ? sizes[TIER_O] : 0));
    sa->set_positions = fpdt_set_positions;
    sa->forward = fpdt_forward;
    sa->backward = fpdt_backward;
    sa->restore = fpdt_restore;
    if (x->u > 1) {
        sa->stream_chunks = x->u;
        sa->stream_rows = x->c;
        sa->forward_chunk = fpdt_forward_chunk;
        sa->output_chunk = fpdt_output_chunk;
        sa->dout_chunk = fpdt_dout_chunk;
        sa->backward_chunk = fpdt_backward_chunk;
    }
    sa->set_piece_rows = fpdt_set_piece_rows;
    sa->set_compute = fpdt_set_compute;
    sa->destroy = fpdt_destroy;
    return sa;
}

static void fpdt_tier_stats(const SeqAttention *sa, TierStats *s, long *batches) {
    const Fpdt *x = sa->ctx;
    TierStats d;
    chunk_tier_stats(x->tier, s);
    chunk_tier_stats(x->dout_tier, &d);
    s->bytes_written += d.bytes_written;
    s->bytes_read += d.bytes_read;
    s->wait_s += d.wait_s;
    s->ram_floats += d.ram_floats;
    *batches = x->batches;
}


/* --chunks, --no-stream and the chunks' use of --offload-dir are FPDT's: refused for the others */
static char *fpdt_refuse_chunks(const Strategy *runner, int value) {
    (void)runner;
    return xstrdup_printf("--chunks %d is read by --strategy fpdt only: drop it, or use --strategy fpdt with a "
                          "--seq-len that splits into %d x hp pieces", value, value);
}

static char *fpdt_refuse(unsigned knob, const Strategy *runner, const ParallelConfig *cfg) {
    (void)runner, (void)cfg;
    if (knob == KNOB_NO_STREAM)
        return xstrdup("--no-stream runs FPDT's layers whole instead of chunk by chunk: it is read by --strategy fpdt "
                       "only: drop it or use --strategy fpdt");
    return xstrdup("--offload-dir moves FPDT chunks and checkpointed layer inputs: add --checkpoint layer|selective "
                   "or use --strategy fpdt");
}

/* Chunk counts u = 1, 2, 4, ... 64 that split S into u x hp pieces; a --chunks U given: U alone. */
static int fpdt_candidates(int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out, int max) {
    (void)cp;
    const int fixed_u = knob_get(&fixed->knobs, "chunks");
    int n = 0;
    for (int u = fixed_u > 0 ? fixed_u : 1; u <= (fixed_u > 0 ? fixed_u : 64); u *= 2) {
        if (fixed->seq_len % ((long)u * hp)) continue;
        for (int pl = 0; pl < 4; pl++) {
            if (fixed->placement >= 0 && fixed->placement != pl) continue;
            if (fixed->placement < 0 && pl != PLACEMENT_HEAD_FIRST) continue; /* cp = 1: one placement */
            if (n < max) {
                out[n] = (StrategyCandidate){.placement = (Placement)pl};
                knob_set(&out[n++].knobs, "chunks", u);
            }
        }
    }
    return n;
}

static void fpdt_layout_name(const StrategyParams *p, char *buf, size_t n) {
    snprintf(buf, n, "rank-ordinal chunk (%d chunks)", p->chunks > 0 ? p->chunks : 1);
}

/* FPDT's memory term (paper 003 Table 2): the peak of one Ulysses block's backward, 8 N d (q, k, v,
 * o, dO, dq, dk, dv of the local tokens). */
static void fpdt_paper_memory(const PaperMemoryInput *in, PaperMemory *out) {
    const StrategyParams *p = in->p;
    const double N = (double)(p->seq_len / ((long)p->hp * p->cp));
    out->n = 1;
    snprintf(out->line[0], sizeof out->line[0], "  FPDT Table 2     backward peak 8 N d            %10.2f MiB",
             8 * N * in->D * 4 / 1048576.0);
}

/* The schedule fwd_chunk / dout_one / outer_one run, every member at once: per chunk the head
 * exchange of q, k, v, the chunk's queries against the chunks they see, o back; backward dout of
 * every chunk, then per key chunk its blocks against the query chunks that see it and dq, dk, dv
 * back. Each exchange and its attention follow one another (no overlap). */
static void fpdt_play(const StrategyParams *p, SchedulePass pass, StepSchedule *out) {
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("fpdt_play: %s", err);
    const int u = fpdt_chunks(p), P = p->hp, S = (int)p->seq_len, Cn = S / u, elem = p->wire_bf16 ? 2 : 4;
    const long c = (long)Cn / P;
    int *pos = xmalloc(sizeof(int) * (size_t)S);
    PosRun *runs = xmalloc(sizeof(PosRun) * (size_t)S);
    PosBlock *blk = xcalloc((size_t)u, sizeof *blk);
    for (int i = 0; i < S; i++) pos[i] = i; /* after the exchange chunk i is the segment [i Cn, (i + 1) Cn) */
    for (int i = 0; i < u; i++) pos_block_init(&blk[i], pos + (size_t)i * Cn, NULL, Cn, runs + (size_t)i * Cn);
    if (pass == PASS_FORWARD) {
        for (int i = 0; i < u; i++) {
            schedule_step(out, "head exchange: q, k, v of a chunk");
            schedule_head_exchange(out, &hs, c, p->head_dim, elem, HX_QKV, 0);
            schedule_step(out, "attention of a chunk");
            int j0 = 0;
            while (j0 < i && !pos_blocks_meet(&blk[i], &blk[j0], p->window)) j0++;
            for (int m = 0; m < P; m++)
                for (int j = j0; j <= i; j++) schedule_compute(out, m, hs.hl[m], hs.hk[m], &blk[i], &blk[j], p->window);
            schedule_step(out, "head exchange: o of a chunk");
            schedule_head_exchange(out, &hs, c, p->head_dim, elem, HX_OUT, 0);
        }
    } else {
        for (int j = 0; j < u; j++) {
            schedule_step(out, "head exchange: dout of a chunk");
            schedule_head_exchange(out, &hs, c, p->head_dim, elem, HX_DOUT, 0);
        }
        for (int i = 0; i < u; i++) {
            schedule_step(out, "attention backward of a key chunk");
            int j1 = u - 1;
            while (j1 > i && !pos_blocks_meet(&blk[j1], &blk[i], p->window)) j1--;
            for (int m = 0; m < P; m++)
                for (int j = i; j <= j1; j++) schedule_compute(out, m, hs.hl[m], hs.hk[m], &blk[j], &blk[i], p->window);
            schedule_step(out, "head exchange: dq, dk, dv of a chunk");
            schedule_head_exchange(out, &hs, c, p->head_dim, elem, HX_GRADS, 0);
        }
    }
    xfree(pos);
    xfree(runs);
    xfree(blk);
    head_split_free(&hs);
}

static void fpdt_work(const SeqAttention *sa, AttnWork *w) { *w = ((const Fpdt *)sa->ctx)->b.work; }

static const OwnAttention fpdt_attention = {
    .work = fpdt_work,
    .play = fpdt_play,
    .check = fpdt_check,
    .create = fpdt_create,
    .positions = fpdt_positions,
    .layout_name = fpdt_layout_name,
    .volume = fpdt_volume,
    .memory = fpdt_memory,
    .tier_stats = fpdt_tier_stats,
};

static const StrategyKnob KNOBS[] = {
    {.name = "chunks", .metavar = "U",
     .help = "fpdt: U sequence chunks, the head exchange and attention run per chunk\n"
             "                      (default 1); S must split into U x hp pieces",
     .max = 1 << 20, .param = offsetof(StrategyParams, chunks), .same = KNOB_SAME_ONE, .column = "chunk",
     .recorded = 1, .refuse = fpdt_refuse_chunks},
    {0},
};

const Strategy fpdt_strategy = {
    .name = "fpdt",
    .title = "FPDT",
    .summary = "FPDT (DeepSpeed Ulysses-Offload): Ulysses run per sequence chunk, kv chunks outer in backward",
    .flags = "--hp --chunks",
    .constraints = "hp <= query heads; S divisible by chunks x hp; its own rank-ordinal chunk layout",
    .grid = GRID_HEADS_ONLY,
    .default_layout = LAYOUT_CONTIGUOUS,
    .own = &fpdt_attention,
    .knobs = KNOBS,
    .reads = KNOB_CHUNK_OFFLOAD | KNOB_NO_STREAM,
    .owns = KNOB_CHUNK_OFFLOAD | KNOB_NO_STREAM,
    .streams = 1,
    .restores_o = 1,
    .refuse = fpdt_refuse,
    .candidates = fpdt_candidates,
    .paper_memory = fpdt_paper_memory,
};
