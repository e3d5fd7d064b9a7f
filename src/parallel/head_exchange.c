/* The head exchange (SeqAlltoAll with uneven head splits and KV replication): see head_exchange.h. */
#include "parallel/head_exchange.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "kernels/bf16.h"

char *head_split_init(HeadSplit *s, int hp, int H, int Hkv) {
    memset(s, 0, sizeof *s);
    char buf[256];
    if (H < 1 || Hkv < 1 || H % Hkv) {
        snprintf(buf, sizeof buf, "the model's %d query heads are not a multiple of its %d key/value heads", H, Hkv);
        return xstrdup(buf);
    }
    if (hp < 1 || hp > H) {
        snprintf(buf, sizeof buf,
                 "--hp %d is more than the model's %d query heads: each head-parallel rank needs at least one head; "
                 "use --hp 1 to %d",
                 hp, H, H);
        return xstrdup(buf);
    }
    const int G = H / Hkv; /* query heads per KV head */
    s->hp = hp;
    s->H = H;
    s->Hkv = Hkv;
    s->h0 = xmalloc(sizeof(int) * (size_t)hp);
    s->hl = xmalloc(sizeof(int) * (size_t)hp);
    s->hk = xmalloc(sizeof(int) * (size_t)hp);
    s->kv_off = xmalloc(sizeof(int) * (size_t)(hp + 1));
    s->kv_src = xmalloc(sizeof(int) * (size_t)H); /* at most one KV head per query head */
    int h = 0, off = 0;
    for (int p = 0; p < hp; p++) {
        const int hl = H / hp + (p < H % hp);
        const int g_first = h / G, g_last = (h + hl - 1) / G, span = g_last - g_first + 1;
        int even = hl % span == 0;
        for (int i = 0; even && i < hl; i++) even = (h + i) / G - g_first == i / (hl / span);
        s->h0[p] = h;
        s->hl[p] = hl;
        s->hk[p] = even ? span : hl;
        s->kv_off[p] = off;
        for (int j = 0; j < s->hk[p]; j++) s->kv_src[off + j] = even ? g_first + j : (h + j) / G;
        off += s->hk[p];
        h += hl;
    }
    s->kv_off[hp] = off;
    return NULL;
}

void head_split_free(HeadSplit *s) {
    xfree(s->h0);
    xfree(s->hl);
    xfree(s->hk);
    xfree(s->kv_off);
    xfree(s->kv_src);
    memset(s, 0, sizeof *s);
}

/* Floats of member me's send (and receive) buffer: the largest block set either way: q|k|v out
 * (their heads) and in (mine), dq|dk|dv the same in reverse, o and dout (N H d one way, hp N Hl d
 * the other), dout with delta (head_exchange_dout_delta: d + 1 floats per row and head, d + 2
 * words on the bf16 wire). */
static size_t buffer_floats(const HeadSplit *s, int me, int N, int H, int d) {
    const int hp = s->hp, Hl = s->hl[me], Hk = s->hk[me];
    size_t theirs = 0, mine = (size_t)hp * N * (Hl + 2 * Hk) * d;
    for (int p = 0; p < hp; p++) theirs += (size_t)N * (s->hl[p] + 2 * s->hk[p]) * d;
    size_t most = theirs > mine ? theirs : mine;
    if ((size_t)N * H * d > most) most = (size_t)N * H * d;
    if ((size_t)hp * N * Hl * d > most) most = (size_t)hp * N * Hl * d;
    if ((size_t)N * H * (d + 1) > most) most = (size_t)N * H * (d + 1);
    if ((size_t)hp * N * Hl * (d + 1) > most) most = (size_t)hp * N * Hl * (d + 1);
    return most;
}

void head_exchange_init(HeadExchange *x, Comm *comm, MPI_Comm head_comm, int hp, int me, int N, int H, int Hkv,
                        int d) {
    memset(x, 0, sizeof *x);
    char *err = head_split_init(&x->split, hp, H, Hkv);
    if (err) die("head_exchange_init: %s", err); /* callers check the split first */
    x->comm = comm;
    x->head_comm = head_comm;
    x->me = me;
    x->N = N;
    x->d = d;
    x->Hl = x->split.hl[me];
    x->Hk = x->split.hk[me];
    x->most = buffer_floats(&x->split, me, N, H, d);
    x->most_any = 0; /* every member's: the all-to-alls' common bound on counts (comm_alltoallv) */
    for (int p = 0; p < hp; p++) {
        const size_t m = buffer_floats(&x->split, p, N, H, d);
        if (m > x->most_any) x->most_any = m;
    }
    const size_t most = x->most;
    x->send = xmalloc_aligned(sizeof(float) * most);
    x->recv = hp > 1 ? xmalloc_aligned(sizeof(float) * most) : NULL;
    x->scounts = xmalloc(sizeof(size_t) * (size_t)hp);
    x->sdispls = xmalloc(sizeof(size_t) * (size_t)hp);
    x->rcounts = xmalloc(sizeof(size_t) * (size_t)hp);
    x->rdispls = xmalloc(sizeof(size_t) * (size_t)hp);
    x->ssize = xcalloc((size_t)hp, sizeof(size_t));
    x->rsize = xcalloc((size_t)hp, sizeof(size_t));
}

void head_exchange_set_wire_bf16(HeadExchange *x) {
    if (x->wire_bf16 || x->split.hp == 1) return; /* hp = 1 sends nothing */
    x->wire_bf16 = 1;
}

void head_exchange_free(HeadExchange *x) {
    head_split_free(&x->split);
    xfree(x->send);
    xfree(x->recv);
    xfree(x->scounts);
    xfree(x->sdispls);
    xfree(x->rcounts);
    xfree(x->rdispls);
    xfree(x->ssize);
    xfree(x->rsize);
    memset(x, 0, sizeof *x);
}

static void copy_rows(float *dst, size_t dst_ld, const float *src, size_t src_ld, int rows, size_t width) {
    for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * dst_ld, src + (size_t)i * src_ld, sizeof(float) * width);
}

/* Sets counts (elements) and displacements from per-member sizes. */
static void set_counts(size_t *counts, size_t *displs, int hp, const size_t *sizes) {
    size_t off = 0;
    for (int p = 0; p < hp; p++) {
        counts[p] = sizes[p];
        displs[p] = off;
        off += sizes[p];
    }
}

/* Runs the all-to-all (or nothing when hp = 1: the one block is already where it belongs).
 * Block p has send_sizes[p] floats, received ones recv_sizes[p]; the last send_tail[p] /
 * recv_tail[p] floats of a block (NULL: none) travel exactly on the bf16 wire too, as the two
 * 16-bit halves of each float. */
static const float *exchange_tail(HeadExchange *x, const size_t *send_sizes, const size_t *recv_sizes,
                                  const size_t *send_tail, const size_t *recv_tail) {
    const int hp = x->split.hp;
    if (hp == 1) return x->send;
    if (!x->wire_bf16) {
        set_counts(x->scounts, x->sdispls, hp, send_sizes);
        set_counts(x->rcounts, x->rdispls, hp, recv_sizes);
        comm_alltoallv(x->comm, COMM_ALLTOALL, x->send, x->scounts, x->sdispls, x->recv, x->rcounts, x->rdispls,
                       MPI_FLOAT, x->most_any, x->head_comm);
        return x->recv;
    }
    /* on the wire: a block's rounded floats, then its tail's words (2 per float); the words are
     * packed into recv and received into send (each holds 2 most words: a block set's floats
     * plus its tails', which are at most one word per float, fit) */
    size_t *wss = xmalloc(sizeof(size_t) * 2 * (size_t)hp), *wrs = wss + hp, ws = 0, wr = 0;
    for (int p = 0; p < hp; p++) {
        wss[p] = send_sizes[p] + (send_tail ? send_tail[p] : 0);
        wrs[p] = recv_sizes[p] + (recv_tail ? recv_tail[p] : 0);
        ws += wss[p];
        wr += wrs[p];
    }
    if (ws > 2 * x->most || wr > 2 * x->most)
        die("internal: head exchange: %zu / %zu bf16 words exceed the buffers' %zu", ws, wr, 2 * x->most);
    set_counts(x->scounts, x->sdispls, hp, wss);
    set_counts(x->rcounts, x->rdispls, hp, wrs);
    bf16_t *wire_send = (bf16_t *)x->recv, *wire_recv = (bf16_t *)x->send;
    double t0 = comm_compute_begin(x->comm);
    const float *src = x->send;
    bf16_t *w = wire_send;
    for (int p = 0; p < hp; p++) {
        const size_t tail = send_tail ? send_tail[p] : 0, body = send_sizes[p] - tail;
        bf16_pack(w, src, body);
        memcpy(w + body, src + body, sizeof(float) * tail);
        src += send_sizes[p];
        w += wss[p];
    }
    comm_compute_end(x->comm, "a2a bf16 pack", t0);
    comm_alltoallv(x->comm, COMM_ALLTOALL, wire_send, x->scounts, x->sdispls, wire_recv, x->rcounts, x->rdispls,
                   MPI_UINT16_T, 2 * x->most_any, x->head_comm);
    t0 = comm_compute_begin(x->comm);
    float *dst = x->recv;
    const bf16_t *r = wire_recv;
    for (int p = 0; p < hp; p++) {
        const size_t tail = recv_tail ? recv_tail[p] : 0, body = recv_sizes[p] - tail;
        bf16_unpack(dst, r, body);
        memcpy(dst + body, r + body, sizeof(float) * tail);
        dst += recv_sizes[p];
        r += wrs[p];
    }
    comm_compute_end(x->comm, "a2a bf16 unpack", t0);
    xfree(wss);
    return x->recv;
}

static const float *exchange(HeadExchange *x, const size_t *send_sizes, const size_t *recv_sizes) {
    return exchange_tail(x, send_sizes, recv_sizes, NULL, NULL);
}

/* One member (hp = 1: context parallelism alone, a chunked strategy on one rank): the local layout is the
 * head-parallel one already (every head, no KV replica), so each exchange is one copy, not a copy
 * into the send buffer and another out of it. */
static void copy_floats(Comm *comm, float *dst, const float *src, size_t n) {
    double t0 = comm_compute_begin(comm);
    if (dst != src) memcpy(dst, src, sizeof(float) * n);
    comm_compute_end(comm, "head copy (hp 1)", t0);
}

void head_exchange_qkv(HeadExchange *x, const float *q, const float *k, const float *v, float *q_h, float *kv_h) {
    const HeadSplit *s = &x->split;
    const int hp = s->hp, N = x->N, d = x->d, H = s->H, Hkv = s->Hkv, Hl = x->Hl, Hk = x->Hk;
    size_t *ss = x->ssize, *rs = x->rsize;
    if (hp == 1) {
        copy_floats(x->comm, q_h, q, (size_t)N * H * d);
        copy_floats(x->comm, kv_h, k, (size_t)N * Hkv * d);
        copy_floats(x->comm, kv_h + (size_t)N * Hkv * d, v, (size_t)N * Hkv * d);
        return;
    }
    double t0 = comm_compute_begin(x->comm);
    float *b = x->send;
    for (int p = 0; p < hp; p++) { /* to member p: q of its heads | k | v of its KV heads */
        const int hl = s->hl[p], hk = s->hk[p];
        copy_rows(b, (size_t)hl * d, q + (size_t)s->h0[p] * d, (size_t)H * d, N, (size_t)hl * d);
        float *bk = b + (size_t)N * hl * d, *bv = bk + (size_t)N * hk * d;
        for (int j = 0; j < hk; j++) {
            const int g = s->kv_src[s->kv_off[p] + j];
            for (int i = 0; i < N; i++) {
                memcpy(bk + ((size_t)i * hk + j) * d, k + ((size_t)i * Hkv + g) * d, sizeof(float) * (size_t)d);
                memcpy(bv + ((size_t)i * hk + j) * d, v + ((size_t)i * Hkv + g) * d, sizeof(float) * (size_t)d);
            }
        }
        ss[p] = (size_t)N * (hl + 2 * hk) * d;
        rs[p] = (size_t)N * (Hl + 2 * Hk) * d;
        b += ss[p];
    }
    comm_compute_end(x->comm, "a2a pack", t0);
    const float *recv = exchange(x, ss, rs);
    t0 = comm_compute_begin(x->comm);
    const size_t n = (size_t)hp * N;
    float *k_h = kv_h, *v_h = kv_h + n * Hk * d;
    for (int p = 0; p < hp; p++) { /* member p's tokens are rows [p N, (p+1) N) */
        const float *r = recv + (size_t)p * rs[p];
        memcpy(q_h + (size_t)p * N * Hl * d, r, sizeof(float) * (size_t)N * Hl * d);
        memcpy(k_h + (size_t)p * N * Hk * d, r + (size_t)N * Hl * d, sizeof(float) * (size_t)N * Hk * d);
        memcpy(v_h + (size_t)p * N * Hk * d, r + (size_t)N * (Hl + Hk) * d, sizeof(float) * (size_t)N * Hk * d);
    }
    comm_compute_end(x->comm, "a2a unpack", t0);
}

void head_exchange_out(HeadExchange *x, const float *o_h, float *o) {
    const HeadSplit *s = &x->split;
    const int hp = s->hp, N = x->N, d = x->d, H = s->H, Hl = x->Hl;
    size_t *ss = x->ssize, *rs = x->rsize;
    if (hp == 1) {
        copy_floats(x->comm, o, o_h, (size_t)N * H * d);
        return;
    }
    double t0 = comm_compute_begin(x->comm);
    if (o_h != x->send) /* block p = rows of member p (in place: head_exchange_out_buffer) */
        memcpy(x->send, o_h, sizeof(float) * (size_t)hp * N * Hl * d);
    for (int p = 0; p < hp; p++) {
        ss[p] = (size_t)N * Hl * d;
        rs[p] = (size_t)N * s->hl[p] * d;
    }
    comm_compute_end(x->comm, "a2a pack", t0);
    const float *r = exchange(x, ss, rs);
    t0 = comm_compute_begin(x->comm);
    for (int p = 0; p < hp; p++) {
        copy_rows(o + (size_t)s->h0[p] * d, (size_t)H * d, r, (size_t)s->hl[p] * d, N, (size_t)s->hl[p] * d);
        r += rs[p];
    }
    comm_compute_end(x->comm, "a2a unpack", t0);
}

float *head_exchange_out_buffer(HeadExchange *x) { return x->send; }

void head_exchange_dout(HeadExchange *x, const float *dout, float *dout_h) {
    head_exchange_dout_delta(x, dout, NULL, dout_h, NULL);
}

void head_exchange_dout_delta(HeadExchange *x, const float *dout, const float *delta, float *dout_h, float *delta_h) {
    const HeadSplit *s = &x->split;
    const int hp = s->hp, N = x->N, d = x->d, H = s->H, Hl = x->Hl;
    if (hp == 1) {
        copy_floats(x->comm, dout_h, dout, (size_t)N * H * d);
        if (delta) copy_floats(x->comm, delta_h, delta, (size_t)N * H);
        return;
    }
    size_t *ss = x->ssize, *rs = x->rsize, *st = xmalloc(sizeof(size_t) * 2 * (size_t)hp), *rt = st + hp;
    double t0 = comm_compute_begin(x->comm);
    float *b = x->send;
    for (int p = 0; p < hp; p++) { /* to member p: dout of its heads, then their delta (if any) */
        const int hl = s->hl[p];
        copy_rows(b, (size_t)hl * d, dout + (size_t)s->h0[p] * d, (size_t)H * d, N, (size_t)hl * d);
        if (delta) copy_rows(b + (size_t)N * hl * d, (size_t)hl, delta + s->h0[p], (size_t)H, N, (size_t)hl);
        st[p] = delta ? (size_t)N * hl : 0;
        rt[p] = delta ? (size_t)N * Hl : 0;
        ss[p] = (size_t)N * hl * d + st[p];
        rs[p] = (size_t)N * Hl * d + rt[p];
        b += ss[p];
    }
    comm_compute_end(x->comm, "a2a pack", t0);
    const float *r = exchange_tail(x, ss, rs, st, rt);
    t0 = comm_compute_begin(x->comm);
    for (int p = 0; p < hp; p++) { /* member p's tokens are rows [p N, (p+1) N) */
        memcpy(dout_h + (size_t)p * N * Hl * d, r, sizeof(float) * (size_t)N * Hl * d);
        if (delta) memcpy(delta_h + (size_t)p * N * Hl, r + (size_t)N * Hl * d, sizeof(float) * (size_t)N * Hl);
        r += rs[p];
    }
    comm_compute_end(x->comm, "a2a unpack", t0);
    xfree(st);
}

void head_exchange_grads(HeadExchange *x, const float *dq_h, const float *dkv_h, float *dq, float *dk, float *dv) {
    const HeadSplit *s = &x->split;
    const int hp = s->hp, N = x->N, d = x->d, H = s->H, Hkv = s->Hkv, Hl = x->Hl, Hk = x->Hk;
    const size_t n = (size_t)hp * N;
    const float *dk_h = dkv_h, *dv_h = dkv_h + n * Hk * d;
    size_t *ss = x->ssize, *rs = x->rsize;
    if (hp == 1) {
        copy_floats(x->comm, dq, dq_h, (size_t)N * H * d);
        copy_floats(x->comm, dk, dk_h, (size_t)N * Hkv * d);
        copy_floats(x->comm, dv, dv_h, (size_t)N * Hkv * d);
        return;
    }
    double t0 = comm_compute_begin(x->comm);
    for (int p = 0; p < hp; p++) {
        float *b = x->send + (size_t)p * N * (Hl + 2 * Hk) * d;
        memcpy(b, dq_h + (size_t)p * N * Hl * d, sizeof(float) * (size_t)N * Hl * d);
        memcpy(b + (size_t)N * Hl * d, dk_h + (size_t)p * N * Hk * d, sizeof(float) * (size_t)N * Hk * d);
        memcpy(b + (size_t)N * (Hl + Hk) * d, dv_h + (size_t)p * N * Hk * d, sizeof(float) * (size_t)N * Hk * d);
        ss[p] = (size_t)N * (Hl + 2 * Hk) * d;
        rs[p] = (size_t)N * (s->hl[p] + 2 * s->hk[p]) * d;
    }
    comm_compute_end(x->comm, "a2a pack", t0);
    const float *r = exchange(x, ss, rs);
    t0 = comm_compute_begin(x->comm);
    memset(dk, 0, sizeof(float) * (size_t)N * Hkv * d);
    memset(dv, 0, sizeof(float) * (size_t)N * Hkv * d);
    for (int p = 0; p < hp; p++) {
        const int hl = s->hl[p], hk = s->hk[p];
        copy_rows(dq + (size_t)s->h0[p] * d, (size_t)H * d, r, (size_t)hl * d, N, (size_t)hl * d);
        const float *bk = r + (size_t)N * hl * d, *bv = bk + (size_t)N * hk * d;
        for (int j = 0; j < hk; j++) { /* replicas of a KV head are summed */
            const int g = s->kv_src[s->kv_off[p] + j];
            for (int i = 0; i < N; i++) {
                float *tk = dk + ((size_t)i * Hkv + g) * d, *tv = dv + ((size_t)i * Hkv + g) * d;
                const float *sk = bk + ((size_t)i * hk + j) * d, *sv = bv + ((size_t)i * hk + j) * d;
                for (int e = 0; e < d; e++) {
                    tk[e] += sk[e];
                    tv[e] += sv[e];
                }
            }
        }
        r += rs[p];
    }
    comm_compute_end(x->comm, "a2a unpack", t0);
}

void head_exchange_volume(const HeadSplit *s, int me, long N, int d, int elem_bytes, unsigned long long *fwd_bytes,
                          unsigned long long *bwd_bytes, unsigned long long *msgs_each_way) {
    unsigned long long f = 0, b = 0;
    const unsigned long long Nd4 = (unsigned long long)elem_bytes * (unsigned long long)N * (unsigned)d;
    for (int m = 0; m < s->hp; m++) {
        if (m == me) continue;
        f += Nd4 * (unsigned)(s->hl[m] + 2 * s->hk[m]); /* q, k, v to member m */
        f += Nd4 * (unsigned)s->hl[me];                 /* my heads of m's tokens, back to m */
        b += Nd4 * (unsigned)s->hl[m];                  /* dout of m's heads */
        b += Nd4 * (unsigned)(s->hl[me] + 2 * s->hk[me]); /* dq, dk, dv of m's tokens, back to m */
    }
    *fwd_bytes = f;
    *bwd_bytes = b;
    *msgs_each_way = s->hp > 1 ? 2ULL * (unsigned)(s->hp - 1) : 0;
}

unsigned long long head_exchange_delta_bytes(const HeadSplit *s, int me, long N) {
    unsigned long long b = 0;
    for (int m = 0; m < s->hp; m++)
        if (m != me) b += 4ULL * (unsigned long long)N * (unsigned)s->hl[m];
    return b;
}
