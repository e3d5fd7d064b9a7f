/* The step simulator: see simulate.h. */
#include "plan/simulate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/atomic_file.h"

/* A transfer: one message of the schedule. */
typedef struct {
    int from, to;          /* members */
    int due;               /* waited at the end of step `due` (posted steps - 1 steps before) */
    int after;             /* posted when the sender's blocks of the step are done */
    double bytes, left;    /* total, still to send */
    double ready;          /* when it starts moving (post + latency); < 0: not posted */
    double rate;           /* bytes / s while active */
    int res[4], n_res;     /* the resources it crosses */
} Flow;

typedef struct {
    const StepSchedule *sc;
    const Cluster *c;
    const int *rank_of;
    Flow *f;
    int n_flows;
    double *cap, *cap_left;
    int *users, n_res;
    int n_nic_res;            /* resources 0 .. n_nic_res - 1: the NICs' egress, then their ingress */
    int *active, n_active;    /* transfers moving: posted, latency over, not done */
    int reshare;              /* the moving transfers changed since share() last fixed their rates */
    int *waiting, n_waiting;  /* posted, still in their latency */
    int *used, *slot_of, *res_start, *res_flows; /* share(): the resources in use and their transfers */
    int *sent_start, *sent;   /* the transfers member m posts in step k: sent[sent_start[k M + m] ..) */
    int *step, *finished;     /* per member: the step it is in, done with all */
    double *compute_end;
    double *step_compute;     /* (members x steps) seconds of blocks */
    int *pending;             /* (members x steps) transfers not done that the member waits for at that step */
    int *waits;               /* per member: those of its current and earlier steps */
    double *step_begin;       /* per member: when it began its current step */
    /* the members whose blocks end later than now, by that time (a binary heap; entries whose member
     * began again or finished since are dropped when they surface) */
    struct EndAt { double t; int m; } *ends;
    int n_ends;
    /* the members that may end their step now: those a transfer just ended for, those whose blocks
     * just ended (each listed once: listed[m]) */
    int *cand, n_cand;
    char *listed;
    SimTrace *trace;          /* NULL, or where each member's blocks and waits go */
} Sim;

/* The attention rate of a block's shape (cluster_attention_rate), remembered for the shapes seen:
 * a schedule has millions of blocks of a few shapes. The same value, looked up. */
enum { RATE_SLOTS = 1024 };
typedef struct {
    const Cluster *c;
    int precision, head_dim;
    struct RateSlot { int q, kv, masked; double rate; } slot[RATE_SLOTS];
} RateMemo;

static void rate_memo_init(RateMemo *r, const Cluster *c, int precision, int head_dim) {
    r->c = c, r->precision = precision, r->head_dim = head_dim;
    for (int i = 0; i < RATE_SLOTS; i++) r->slot[i].q = -1;
}

static double rate_of(RateMemo *r, int masked, int q_rows, int kv_rows) {
    const unsigned h = ((unsigned)q_rows * 2654435761u ^ (unsigned)kv_rows * 40503u ^ (unsigned)masked) % RATE_SLOTS;
    struct RateSlot *x = &r->slot[h];
    if (x->q != q_rows || x->kv != kv_rows || x->masked != masked)
        *x = (struct RateSlot){q_rows, kv_rows, masked,
                               cluster_attention_rate(r->c, r->precision, r->head_dim, masked, q_rows, kv_rows)};
    return x->rate;
}

/* The seconds block b takes (factor: the cluster's backward factor in a backward schedule, else 1):
 * its FLOPs (4 visible pairs x heads x head_dim) at the rate its shape gets. A block with fewer
 * visible pairs than the cells of its kernel calls is masked (a causal diagonal, a window's edge):
 * the causal curve's rate, whose FLOPs count the visible pairs as these do. A block whose visible
 * pairs are whole rectangles (a zigzag ring's off-diagonal step: all queries against half the keys,
 * or half the queries against all keys) is what the ring implementations call the kernel on
 * unmasked (causal=False), so it gets the full curve's rate at its rectangle's shorter side
 * (cells / q_rows keys a query row). Plus the merge of the block's result into the fp32
 * accumulators where the cluster counts one, a pass over device memory: the output rows (forward),
 * dq's rows and dk's and dv's (backward). play() and the bound take every block's time from here. */
static double block_seconds(RateMemo *rates, const Cluster *c, const StepSchedule *sc, const StepCompute *b,
                            int head_dim, double factor) {
    const double flops = 4.0 * (double)b->pairs * b->heads * head_dim * factor;
    const int masked = b->pairs < b->cells;
    const int kv_rows = masked || !b->q_rows ? b->kv_rows : (int)(b->cells / (unsigned long long)b->q_rows);
    double secs = flops / rate_of(rates, masked, b->q_rows, kv_rows);
    if (c->attn_merge_bytes > 0 && c->device_mem_gbs > 0) {
        double elems = (double)b->q_rows * b->heads * head_dim;
        if (sc->pass == PASS_BACKWARD) elems += 2.0 * b->kv_rows * b->kv_heads * head_dim;
        secs += c->attn_merge_bytes * elems / (c->device_mem_gbs * 1e9);
    }
    return secs;
}

/* Resources: NIC egress and ingress of every (node, NIC), each rank's intra-node port out and in,
 * each node's shared medium, and (where the cluster limits one rank to another, intra_peer_gbs)
 * every ordered pair of ranks of a node. */
static int nic_out(const Sim *s, int rank) {
    return cluster_node_of(s->c, rank) * s->c->nics_per_node + cluster_nic_of(s->c, rank);
}
static void flow_resources(Sim *s, Flow *f) {
    const Cluster *c = s->c;
    const int a = s->rank_of[f->from], b = s->rank_of[f->to];
    const int nics = c->nodes * (c->nics_per_node > 0 ? c->nics_per_node : 1), ranks = c->nodes * c->ranks_per_node;
    f->n_res = 0;
    if (cluster_node_of(c, a) != cluster_node_of(c, b)) {
        f->res[f->n_res++] = nic_out(s, a);
        f->res[f->n_res++] = nics + nic_out(s, b);
    } else {
        f->res[f->n_res++] = 2 * nics + a;
        f->res[f->n_res++] = 2 * nics + ranks + b;
        if (c->intra_node_gbs > 0) f->res[f->n_res++] = 2 * nics + 2 * ranks + cluster_node_of(c, a);
        if (c->intra_peer_gbs > 0) /* the pair (a, b): a, and b's place in its node */
            f->res[f->n_res++] = 2 * nics + 2 * ranks + c->nodes + a * c->ranks_per_node + b % c->ranks_per_node;
    }
}

static double latency_s(const Sim *s, const Flow *f) {
    const Cluster *c = s->c;
    const int inter = cluster_node_of(c, s->rank_of[f->from]) != cluster_node_of(c, s->rank_of[f->to]);
    return 1e-6 * (inter ? c->nic_latency_us : c->intra_latency_us);
}

/* Max-min fair rates of the moving transfers (progressive filling): the resource whose equal share
 * is the smallest fixes that rate for its unfixed transfers, which then leave every resource they
 * cross; until every transfer has its rate. */
static void share(Sim *s) {
    if (!s->reshare) return; /* the same transfers in the same order: the same rates */
    s->reshare = 0;
    int n_used = 0;
    for (int i = 0; i < s->n_active; i++) {
        Flow *f = &s->f[s->active[i]];
        f->rate = -1; /* not fixed */
        for (int k = 0; k < f->n_res; k++) {
            const int r = f->res[k];
            if (s->slot_of[r] < 0) {
                s->slot_of[r] = n_used;
                s->used[n_used++] = r;
                s->users[r] = 0;
                s->cap_left[r] = s->cap[r];
            }
            s->users[r]++;
        }
    }
    if (s->c->nic_flows.n) /* a NIC direction carries what its flows together get (cluster_nic_gbs) */
        for (int u = 0; u < n_used; u++)
            if (s->used[u] < s->n_nic_res) s->cap_left[s->used[u]] = cluster_nic_gbs(s->c, s->users[s->used[u]]) * 1e9;
    s->res_start[0] = 0; /* each used resource's transfers, contiguous */
    for (int u = 0; u < n_used; u++) s->res_start[u + 1] = s->res_start[u] + s->users[s->used[u]];
    for (int u = 0; u < n_used; u++) s->users[s->used[u]] = 0;
    for (int i = 0; i < s->n_active; i++) {
        const Flow *f = &s->f[s->active[i]];
        for (int k = 0; k < f->n_res; k++) {
            const int u = s->slot_of[f->res[k]];
            s->res_flows[s->res_start[u] + s->users[f->res[k]]++] = s->active[i];
        }
    }
    int unfixed = s->n_active;
    while (unfixed) {
        int best = -1;
        double most = 0;
        for (int u = 0; u < n_used; u++) {
            const int r = s->used[u];
            if (s->users[r] && (best < 0 || s->cap_left[r] / s->users[r] < most)) {
                best = u;
                most = s->cap_left[r] / s->users[r];
            }
        }
        if (best < 0) break;
        /* every resource at that level saturates together (fixing its transfers at the level keeps
         * the others' shares there): one round a level, not a resource */
        for (int u = best; u < n_used; u++) {
            const int r = s->used[u];
            if (!s->users[r] || s->cap_left[r] / s->users[r] > most * (1 + 1e-12)) continue;
            for (int j = s->res_start[u]; j < s->res_start[u + 1]; j++) {
                Flow *f = &s->f[s->res_flows[j]];
                if (f->rate != -1) continue;
                f->rate = most;
                unfixed--;
                for (int k = 0; k < f->n_res; k++) {
                    s->cap_left[f->res[k]] -= most;
                    s->users[f->res[k]]--;
                }
            }
        }
    }
    for (int u = 0; u < n_used; u++) s->slot_of[s->used[u]] = -1;
}

/* Posted transfers whose latency is over at time t start moving. */
static void start_ready(Sim *s, double t) {
    int w = 0;
    for (int i = 0; i < s->n_waiting; i++) {
        const int j = s->waiting[i];
        if (s->f[j].ready <= t) s->active[s->n_active++] = j, s->reshare = 1;
        else s->waiting[w++] = j;
    }
    s->n_waiting = w;
}

static void post(Sim *s, int m, int k, int after, double t) {
    const size_t at = (size_t)k * s->sc->members + m;
    for (int i = s->sent_start[at]; i < s->sent_start[at + 1]; i++) {
        const int j = s->sent[i];
        Flow *f = &s->f[j];
        if (f->after != after || f->ready >= 0) continue;
        f->ready = t + latency_s(s, f);
        s->waiting[s->n_waiting++] = j;
    }
}

static void ends_push(Sim *s, double t, int m) {
    int i = s->n_ends++;
    while (i > 0 && s->ends[(i - 1) / 2].t > t) {
        s->ends[i] = s->ends[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->ends[i] = (struct EndAt){t, m};
}

static void ends_pop(Sim *s) {
    const struct EndAt last = s->ends[--s->n_ends];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= s->n_ends) break;
        if (c + 1 < s->n_ends && s->ends[c + 1].t < s->ends[c].t) c++;
        if (!(s->ends[c].t < last.t)) break;
        s->ends[i] = s->ends[c];
        i = c;
    }
    if (s->n_ends) s->ends[i] = last;
}

/* Whether the heap's first entry is its member's current end of blocks. */
static int ends_top_current(const Sim *s) {
    const struct EndAt *e = &s->ends[0];
    return !s->finished[e->m] && s->compute_end[e->m] == e->t;
}

static void list_member(Sim *s, int m) {
    if (s->listed[m]) return;
    s->listed[m] = 1;
    s->cand[s->n_cand++] = m;
}

static int cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void begin(Sim *s, int m, double t) {
    const int k = s->step[m];
    s->step_begin[m] = t;
    s->compute_end[m] = t + s->step_compute[(size_t)m * s->sc->n_steps + k];
    if (s->compute_end[m] > t) ends_push(s, s->compute_end[m], m);
    post(s, m, k, 0, t);
    if (s->compute_end[m] <= t) post(s, m, k, 1, t);
}

/* Whether member m may end its step at time t: its blocks done, and every transfer it sends or
 * receives that is due by this step. */
static int may_end(const Sim *s, int m, double t) { return t >= s->compute_end[m] && !s->waits[m]; }

/* A transfer done: neither end waits for it any more. */
static void flow_done(Sim *s, const Flow *f) {
    const int K = s->sc->n_steps, ends[2] = {f->from, f->to};
    for (int i = 0; i < 2; i++) {
        s->pending[(size_t)ends[i] * K + f->due]--;
        if (f->due <= s->step[ends[i]]) s->waits[ends[i]]--;
        list_member(s, ends[i]);
    }
}

static void trace_add(SimTrace *tr, int member, const char *name, int wait, double t0, double t1) {
    if (!tr || !(t1 > t0)) return;
    tr->ev = xgrow(tr->ev, &tr->cap, tr->n, sizeof *tr->ev, 256);
    tr->ev[tr->n++] = (SimEvent){.member = member, .name = name, .wait = wait, .t0 = t0, .t1 = t1};
}

static int play(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision,
                SimTrace *trace, ScheduleSim *out, SeqErr *e) {
    memset(out, 0, sizeof *out);
    const int M = sc->members, K = sc->n_steps, ranks = c->nodes * c->ranks_per_node;
    for (int m = 0; m < M; m++)
        if (rank_of[m] < 0 || rank_of[m] >= ranks)
            return seq_err(e, "member %d on rank %d: the cluster has %d ranks (%d nodes x %d): give a larger cluster",
                           m, rank_of[m], ranks, c->nodes, c->ranks_per_node);
    Sim s = {.sc = sc, .c = c, .rank_of = rank_of, .n_flows = sc->n_messages, .trace = trace};
    const int nics = c->nodes * (c->nics_per_node > 0 ? c->nics_per_node : 1);
    s.n_res = 2 * nics + 2 * ranks + c->nodes + (c->intra_peer_gbs > 0 ? ranks * c->ranks_per_node : 0);
    s.cap = xcalloc((size_t)s.n_res, sizeof *s.cap);
    s.cap_left = xcalloc((size_t)s.n_res, sizeof *s.cap_left);
    s.users = xcalloc((size_t)s.n_res, sizeof *s.users);
    s.used = xcalloc((size_t)s.n_res, sizeof *s.used);
    s.slot_of = xmalloc(sizeof *s.slot_of * (size_t)s.n_res);
    for (int r = 0; r < s.n_res; r++) s.slot_of[r] = -1;
    s.res_start = xcalloc((size_t)s.n_res + 1, sizeof *s.res_start);
    s.res_flows = xcalloc(4 * (size_t)(sc->n_messages ? sc->n_messages : 1), sizeof *s.res_flows);
    const size_t KM = (size_t)K * (size_t)M;
    s.sent_start = xcalloc(KM + 1, sizeof *s.sent_start);
    s.sent = xcalloc((size_t)(sc->n_messages ? sc->n_messages : 1), sizeof *s.sent);
    for (int i = 0; i < sc->n_messages; i++) s.sent_start[(size_t)sc->messages[i].step * M + sc->messages[i].from + 1]++;
    for (size_t i = 0; i < KM; i++) s.sent_start[i + 1] += s.sent_start[i];
    {
        int *fill = xmalloc(sizeof(int) * (KM ? KM : 1));
        for (size_t i = 0; i < KM; i++) fill[i] = s.sent_start[i];
        for (int i = 0; i < sc->n_messages; i++) s.sent[fill[(size_t)sc->messages[i].step * M + sc->messages[i].from]++] = i;
        xfree(fill);
    }
    s.active = xcalloc((size_t)(sc->n_messages ? sc->n_messages : 1), sizeof *s.active);
    s.waiting = xcalloc((size_t)(sc->n_messages ? sc->n_messages : 1), sizeof *s.waiting);
    for (int r = 0; r < 2 * nics; r++) s.cap[r] = c->nic_gbs * 1e9;
    s.n_nic_res = 2 * nics;
    for (int r = 0; r < 2 * ranks; r++) s.cap[2 * nics + r] = c->intra_gbs * 1e9;
    for (int r = 0; r < c->nodes; r++) s.cap[2 * nics + 2 * ranks + r] = c->intra_node_gbs * 1e9;
    for (int r = 2 * nics + 2 * ranks + c->nodes; r < s.n_res; r++) s.cap[r] = c->intra_peer_gbs * 1e9;
    s.f = xcalloc((size_t)(sc->n_messages ? sc->n_messages : 1), sizeof *s.f);
    for (int i = 0; i < sc->n_messages; i++) {
        const StepMessage *m = &sc->messages[i];
        Flow *f = &s.f[i];
        *f = (Flow){.from = m->from, .to = m->to, .due = m->step + m->steps - 1, .after = m->after,
                    .bytes = (double)m->bytes, .left = (double)m->bytes, .ready = -1};
        flow_resources(&s, f);
    }
    out->members = M;
    out->m = xcalloc((size_t)M, sizeof *out->m);
    s.step = xcalloc((size_t)M, sizeof *s.step);
    s.finished = xcalloc((size_t)M, sizeof *s.finished);
    s.compute_end = xcalloc((size_t)M, sizeof *s.compute_end);
    s.step_compute = xcalloc((size_t)M * (size_t)(K ? K : 1), sizeof *s.step_compute);
    s.pending = xcalloc((size_t)M * (size_t)(K ? K : 1), sizeof *s.pending);
    s.waits = xcalloc((size_t)M, sizeof *s.waits);
    s.step_begin = xcalloc((size_t)M, sizeof *s.step_begin);
    s.ends = xmalloc(sizeof *s.ends * (size_t)(M ? M : 1)); /* one entry a member: see the loop */
    s.cand = xmalloc(sizeof *s.cand * (size_t)(M ? M : 1));
    s.listed = xcalloc((size_t)(M ? M : 1), 1);
    for (int i = 0; i < sc->n_messages; i++) {
        const Flow *f = &s.f[i];
        s.pending[(size_t)f->from * K + f->due]++;
        s.pending[(size_t)f->to * K + f->due]++;
    }
    for (int m = 0; m < M; m++) s.waits[m] = K ? s.pending[(size_t)m * K] : 0;
    const double factor = sc->pass == PASS_BACKWARD ? c->attn_backward_factor : 1.0;
    RateMemo *rates = xmalloc(sizeof *rates);
    rate_memo_init(rates, c, precision, head_dim);
    for (int i = 0; i < sc->n_compute; i++) {
        const StepCompute *b = &sc->compute[i];
        const double secs = block_seconds(rates, c, sc, b, head_dim, factor);
        s.step_compute[(size_t)b->member * K + b->step] += secs;
        out->m[b->member].compute_s += secs;
    }
    xfree(rates);
    for (int i = 0; i < sc->n_messages; i++) {
        const Flow *f = &s.f[i];
        const int inter = cluster_node_of(c, rank_of[f->from]) != cluster_node_of(c, rank_of[f->to]);
        if (inter) out->m[f->from].bytes_inter += f->bytes;
        else out->m[f->from].bytes_intra += f->bytes;
    }
    double now = 0;
    int left = M, rc = 0;
    for (int m = 0; m < M; m++) {
        if (K == 0) {
            s.finished[m] = 1;
            left--;
        } else {
            begin(&s, m, 0);
        }
    }
    start_ready(&s, now);
    share(&s);
    for (int m = 0; m < M; m++) list_member(&s, m);
    /* An event at time now: the members that may end their step end it and begin the next, in
     * rank order, pass after pass (ending a step changes no other member: only those that just began
     * may end again at once); then time moves to the next end of a transfer, of a latency or of a
     * member's blocks. A member's step may end only once a transfer of it or its blocks ended since
     * it last could not: the listed members, so that an event costs its own members, not all. Every
     * entry of the heap of blocks' ends is later than now after an event's ends are taken out, so it
     * holds at most one per member. */
    int *next_pass = xmalloc(sizeof(int) * (size_t)(M ? M : 1));
    while (left) {
        int n_pass = s.n_cand;
        qsort(s.cand, (size_t)n_pass, sizeof *s.cand, cmp_int);
        for (int i = 0; i < n_pass; i++) s.listed[s.cand[i]] = 0;
        s.n_cand = 0;
        while (n_pass) { /* members that end their step now, and begin the next */
            int n_next = 0;
            for (int i = 0; i < n_pass; i++) {
                const int m = s.cand[i];
                if (s.finished[m] || !may_end(&s, m, now)) continue;
                out->m[m].wait_s += now - s.compute_end[m];
                trace_add(s.trace, m, sc->steps[s.step[m]].what, 0, s.step_begin[m], s.compute_end[m]);
                trace_add(s.trace, m, "wait", 1, s.compute_end[m], now);
                next_pass[n_next++] = m;
                if (++s.step[m] < K) s.waits[m] += s.pending[(size_t)m * K + s.step[m]];
                if (s.step[m] == K) {
                    s.finished[m] = 1;
                    out->m[m].end_s = now;
                    left--;
                } else {
                    begin(&s, m, now);
                }
            }
            if (n_next) {
                start_ready(&s, now);
                share(&s);
            }
            memcpy(s.cand, next_pass, sizeof(int) * (size_t)n_next);
            n_pass = n_next;
        }
        if (!left) break;
        double next = INFINITY;
        for (int i = 0; i < s.n_waiting; i++) next = fmin(next, s.f[s.waiting[i]].ready);
        for (int i = 0; i < s.n_active; i++) {
            const Flow *f = &s.f[s.active[i]];
            if (f->left <= 0) next = now;
            else if (f->rate > 0) next = fmin(next, now + f->left / f->rate);
        }
        while (s.n_ends && !ends_top_current(&s)) ends_pop(&s);
        if (s.n_ends) next = fmin(next, s.ends[0].t);
        if (!isfinite(next)) {
            int m = 0;
            while (m < M && s.finished[m]) m++;
            rc = seq_err(e, "the schedule cannot finish: member %d waits in step %d (\"%s\") for a message never sent",
                         m, s.step[m], sc->steps[s.step[m]].what);
            break;
        }
        const double dt = next - now;
        int kept = 0;
        for (int i = 0; i < s.n_active; i++) {
            Flow *f = &s.f[s.active[i]];
            f->left -= f->rate * dt;
            /* within a relative 1e-9 of its size: done (rates times durations round) */
            if (f->left <= 1e-9 * f->bytes) flow_done(&s, f);
            else s.active[kept++] = s.active[i];
        }
        if (kept < s.n_active) s.reshare = 1;
        s.n_active = kept;
        now = next;
        /* results posted at the end of the member's blocks, in rank order */
        int n_done = 0;
        while (s.n_ends && s.ends[0].t <= now) {
            if (ends_top_current(&s)) next_pass[n_done++] = s.ends[0].m;
            ends_pop(&s);
        }
        qsort(next_pass, (size_t)n_done, sizeof *next_pass, cmp_int);
        for (int i = 0; i < n_done; i++) {
            post(&s, next_pass[i], s.step[next_pass[i]], 1, now);
            list_member(&s, next_pass[i]);
        }
        start_ready(&s, now);
        share(&s);
    }
    xfree(next_pass);
    for (int m = 0; m < M; m++)
        if (out->m[m].end_s >= out->end_s) {
            out->end_s = out->m[m].end_s;
            out->slowest = m;
        }
    xfree(s.cap);
    xfree(s.cap_left);
    xfree(s.users);
    xfree(s.used);
    xfree(s.slot_of);
    xfree(s.res_start);
    xfree(s.res_flows);
    xfree(s.sent_start);
    xfree(s.sent);
    xfree(s.active);
    xfree(s.waiting);
    xfree(s.f);
    xfree(s.step);
    xfree(s.finished);
    xfree(s.compute_end);
    xfree(s.step_compute);
    xfree(s.pending);
    xfree(s.waits);
    xfree(s.step_begin);
    xfree(s.ends);
    xfree(s.cand);
    xfree(s.listed);
    if (rc) schedule_sim_free(out);
    return rc;
}

/* The bound's blocks: member m of sc's time in its blocks (compute_s[m]) and the sum of its steps'
 * blocks (end_lb[m]), in the same order and the same arithmetic as play() */
static void bound_blocks(const StepSchedule *sc, const Cluster *c, int head_dim, int precision, double *end_lb,
                         double *compute_s) {
    const int M = sc->members, K = sc->n_steps;
    double *step_compute = xcalloc((size_t)M * (size_t)(K ? K : 1), sizeof *step_compute);
    const double factor = sc->pass == PASS_BACKWARD ? c->attn_backward_factor : 1.0;
    for (int m = 0; m < M; m++) compute_s[m] = 0;
    RateMemo *rates = xmalloc(sizeof *rates);
    rate_memo_init(rates, c, precision, head_dim);
    for (int i = 0; i < sc->n_compute; i++) {
        const StepCompute *b = &sc->compute[i];
        const double secs = block_seconds(rates, c, sc, b, head_dim, factor);
        step_compute[(size_t)b->member * K + b->step] += secs;
        compute_s[b->member] += secs;
    }
    xfree(rates);
    /* a member begins step k + 1 no earlier than its blocks of step k end: play()'s times are at
     * least this sum, taken in the same order (a rounded sum grows with its terms) */
    for (int m = 0; m < M; m++) {
        double t = 0;
        for (int k = 0; k < K; k++) t = t + step_compute[(size_t)m * K + k];
        end_lb[m] = t;
    }
    xfree(step_compute);
}

/* The resources of its own a member's transfers go through (simulate_schedule_bound). */
enum { OWN_NIC_OUT, OWN_NIC_IN, OWN_PORT_OUT, OWN_PORT_IN, OWN_MEDIUM, OWN };

/* Each transfer of sc into the bytes of its sender's and its receiver's own resources (acc: OWN a
 * member of the whole schedule), sc's member i being member i hp + h of the whole (hp 1, h 0: sc is
 * the whole), node[m] member m's node. Bytes are whole numbers: their sums do not depend on the
 * order (below 2^53). */
static void bound_bytes(const StepSchedule *sc, int hp, int h, const int *node, double *acc) {
    for (int i = 0; i < sc->n_messages; i++) {
        const StepMessage *g = &sc->messages[i];
        const double bytes = (double)g->bytes;
        const int from = g->from * hp + h, to = g->to * hp + h;
        if (node[from] != node[to]) {
            acc[(size_t)from * OWN + OWN_NIC_OUT] += bytes;
            acc[(size_t)to * OWN + OWN_NIC_IN] += bytes;
        } else {
            acc[(size_t)from * OWN + OWN_PORT_OUT] += bytes;
            acc[(size_t)to * OWN + OWN_PORT_IN] += bytes;
            acc[(size_t)from * OWN + OWN_MEDIUM] += bytes;
            if (to != from) acc[(size_t)to * OWN + OWN_MEDIUM] += bytes;
        }
    }
}

/* The bound's transfers: every transfer a member sends or receives has arrived by its last step's
 * end; those of them through one resource of its own (its NIC's egress or ingress, its port out or
 * in, its node's medium) share that resource's bandwidth and none moves before its latency. */
static void bound_transfers(const Cluster *c, int M, const double *acc, double *end_lb) {
    const double nic = c->nic_gbs * 1e9, port = c->intra_gbs * 1e9, medium = c->intra_node_gbs * 1e9;
    const double lat_nic = 1e-6 * c->nic_latency_us, lat_intra = 1e-6 * c->intra_latency_us;
    for (int m = 0; m < M; m++) {
        const double *x = &acc[(size_t)m * OWN];
        double t = 0;
        if (x[OWN_NIC_OUT] > 0) t = fmax(t, lat_nic + x[OWN_NIC_OUT] / nic);
        if (x[OWN_NIC_IN] > 0) t = fmax(t, lat_nic + x[OWN_NIC_IN] / nic);
        if (x[OWN_PORT_OUT] > 0) t = fmax(t, lat_intra + x[OWN_PORT_OUT] / port);
        if (x[OWN_PORT_IN] > 0) t = fmax(t, lat_intra + x[OWN_PORT_IN] / port);
        if (x[OWN_MEDIUM] > 0 && medium > 0) t = fmax(t, lat_intra + x[OWN_MEDIUM] / medium);
        end_lb[m] = fmax(end_lb[m], t);
    }
}

static int bound_ranks(int M, const Cluster *c, const int *rank_of, SeqErr *e) {
    const int ranks = c->nodes * c->ranks_per_node;
    for (int m = 0; m < M; m++)
        if (rank_of[m] < 0 || rank_of[m] >= ranks)
            return seq_err(e, "member %d on rank %d: the cluster has %d ranks (%d nodes x %d): give a larger cluster",
                           m, rank_of[m], ranks, c->nodes, c->ranks_per_node);
    return 0;
}

int simulate_schedule_bound(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision,
                            double *end_lb, double *compute_s, SeqErr *e) {
    return simulate_lanes_bound(sc, NULL, NULL, c, rank_of, head_dim, precision, end_lb, compute_s, e);
}

int simulate_lanes_bound(const StepSchedule *exchange, const StepSchedule *lanes, const int *lane_of, const Cluster *c,
                         const int *rank_of, int head_dim, int precision, double *end_lb, double *compute_s, SeqErr *e) {
    const int M = exchange->members, hp = lanes ? exchange->hp : 1;
    if (bound_ranks(M, c, rank_of, e)) return -1;
    if (!lanes) {
        bound_blocks(exchange, c, head_dim, precision, end_lb, compute_s);
    } else {
        /* a member's blocks are its lane's (the exchange has none): its lane's sums, which a step
         * of the whole schedule without its blocks (the exchange's) adds nothing to */
        const int cp = exchange->cp;
        double *lane_end = xmalloc(sizeof(double) * (size_t)cp), *lane_compute = xmalloc(sizeof(double) * (size_t)cp);
        for (int h = 0; h < hp; h++) {
            int seen = 0; /* a lane once: at its first head member, for every member running it */
            for (int g = 0; g < h && !seen; g++) seen = lane_of[g] == lane_of[h];
            if (seen) continue;
            bound_blocks(&lanes[lane_of[h]], c, head_dim, precision, lane_end, lane_compute);
            for (int g = h; g < hp; g++)
                if (lane_of[g] == lane_of[h])
                    for (int i = 0; i < cp; i++) end_lb[i * hp + g] = lane_end[i], compute_s[i * hp + g] = lane_compute[i];
        }
        xfree(lane_end);
        xfree(lane_compute);
    }
    double *acc = xcalloc((size_t)M * OWN, sizeof *acc);
    int *node = xmalloc(sizeof(int) * (size_t)(M ? M : 1));
    for (int m = 0; m < M; m++) node[m] = cluster_node_of(c, rank_of[m]);
    bound_bytes(exchange, 1, 0, node, acc);
    if (lanes)
        for (int h = 0; h < hp; h++) bound_bytes(&lanes[lane_of[h]], hp, h, node, acc);
    bound_transfers(c, M, acc, end_lb);
    xfree(acc);
    xfree(node);
    return 0;
}

/* A group of transfers through one resource of a member's, due at one step: their bytes and the
 * earliest any of them may be posted. */
typedef struct {
    double bytes, post;
} DueGroup;

int simulate_schedule_step_bound(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim,
                                 int precision, double *end_lb, SeqErr *e) {
    const int M = sc->members, K = sc->n_steps;
    if (bound_ranks(M, c, rank_of, e)) return -1;
    /* each member's blocks per step, as play() sums them */
    double *step_compute = xcalloc((size_t)M * (size_t)(K ? K : 1), sizeof *step_compute);
    const double factor = sc->pass == PASS_BACKWARD ? c->attn_backward_factor : 1.0;
    RateMemo *rates = xmalloc(sizeof *rates);
    rate_memo_init(rates, c, precision, head_dim);
    for (int i = 0; i < sc->n_compute; i++) {
        const StepCompute *b = &sc->compute[i];
        step_compute[(size_t)b->member * K + b->step] += block_seconds(rates, c, sc, b, head_dim, factor);
    }
    xfree(rates);
    int *node = xmalloc(sizeof(int) * (size_t)(M ? M : 1));
    for (int m = 0; m < M; m++) node[m] = cluster_node_of(c, rank_of[m]);
    const double cap[OWN] = {c->nic_gbs * 1e9, c->nic_gbs * 1e9, c->intra_gbs * 1e9, c->intra_gbs * 1e9,
                             c->intra_node_gbs * 1e9};
    const double lat_nic = 1e-6 * c->nic_latency_us, lat_intra = 1e-6 * c->intra_latency_us;
    /* a transfer's bytes at the slowest rate any resource it crosses allows: what it takes alone */
    const double peer = c->intra_peer_gbs > 0 ? c->intra_peer_gbs * 1e9 : INFINITY;
    const double alone_intra = fmin(fmin(cap[OWN_PORT_OUT], c->intra_node_gbs > 0 ? cap[OWN_MEDIUM] : INFINITY), peer);
    /* less a relative 1e-9: play() takes a transfer within 1e-9 of its size as done */
    const double done = 1 - 1e-9;
    double *begin = xcalloc((size_t)(M ? M : 1), sizeof *begin); /* a lower bound of when m begins its step */
    double *need = xcalloc((size_t)M * (size_t)(K ? K : 1), sizeof *need); /* of when m may end step k */
    DueGroup *g = xmalloc(sizeof *g * (size_t)(M ? M : 1) * OWN);
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < (size_t)M * OWN; i++) g[i] = (DueGroup){0, INFINITY};
        const ScheduleStep *st = &sc->steps[k];
        for (int i = st->message0; i < st->message0 + st->n_message; i++) {
            const StepMessage *f = &sc->messages[i];
            /* posted at the sender's step start, or (a result) once its blocks of the step are done */
            const double post = begin[f->from] + (f->after ? step_compute[(size_t)f->from * K + k] : 0);
            const int inter = node[f->from] != node[f->to], due = k + (f->steps > 1 ? f->steps : 1) - 1;
            const double lat = inter ? lat_nic : lat_intra, bytes = (double)f->bytes;
            const double alone = post + lat + done * bytes / (inter ? cap[OWN_NIC_OUT] : alone_intra);
            for (int j = 0; j < 2; j++) {
                const int m = j ? f->to : f->from;
                need[(size_t)m * K + due] = fmax(need[(size_t)m * K + due], alone);
            }
            if (due != k) continue; /* due later: alone (a group over steps is not kept) */
            int slot[3], n = 0;
            if (inter) {
                slot[n++] = f->from * OWN + OWN_NIC_OUT;
                slot[n++] = f->to * OWN + OWN_NIC_IN;
            } else {
                slot[n++] = f->from * OWN + OWN_PORT_OUT;
                slot[n++] = f->to * OWN + OWN_PORT_IN;
                if (c->intra_node_gbs > 0) slot[n++] = f->from * OWN + OWN_MEDIUM;
            }
            for (int j = 0; j < n; j++) {
                g[slot[j]].bytes += bytes;
                g[slot[j]].post = fmin(g[slot[j]].post, post);
            }
            if (!inter && c->intra_node_gbs > 0 && f->to != f->from) {
                DueGroup *x = &g[f->to * OWN + OWN_MEDIUM];
                x->bytes += bytes;
                x->post = fmin(x->post, post);
            }
        }
        /* member m ends step k once its blocks are done and every transfer of it due by then has
         * arrived: those through one resource of its own no sooner than their bytes at its rate
         * after the first of them may move */
        for (int m = 0; m < M; m++) {
            double end = fmax(begin[m] + step_compute[(size_t)m * K + k], need[(size_t)m * K + k]);
            for (int r = 0; r < OWN; r++) {
                const DueGroup *x = &g[m * OWN + r];
                if (x->bytes > 0 && cap[r] > 0)
                    end = fmax(end, x->post + (r < OWN_PORT_OUT ? lat_nic : lat_intra) + done * x->bytes / cap[r]);
            }
            begin[m] = end;
        }
    }
    for (int m = 0; m < M; m++) end_lb[m] = begin[m];
    xfree(step_compute);
    xfree(node);
    xfree(begin);
    xfree(need);
    xfree(g);
    return 0;
}

int simulate_schedule(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision, ScheduleSim *out,
                      SeqErr *e) {
    return play(sc, c, rank_of, head_dim, precision, NULL, out, e);
}

int simulate_schedule_trace(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision,
                            SimTrace *trace, ScheduleSim *out, SeqErr *e) {
    memset(trace, 0, sizeof *trace);
    const int rc = play(sc, c, rank_of, head_dim, precision, trace, out, e);
    if (rc) sim_trace_free(trace);
    return rc;
}

/* A JSON string of plain text (the steps' names): quotes and backslashes escaped. */
static void put_string(AtomicFile *af, const char *text) {
    atomic_write(af, "\"", 1);
    for (const char *p = text; *p; p++) {
        if (*p == '"' || *p == '\\') atomic_write(af, "\\", 1);
        atomic_write(af, p, 1);
    }
    atomic_write(af, "\"", 1);
}

int sim_trace_write(const SimTrace *trace, const int *rank_of, int members, const char *path, SeqErr *e) {
    AtomicFile af;
    if (atomic_open(&af, path, e) != 0) return -1;
    const char *head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    atomic_write(&af, head, strlen(head));
    char line[256];
    for (int m = 0; m < members; m++) {
        const int len = snprintf(line, sizeof line,
                                 "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                                 m ? ",\n" : "", rank_of[m], rank_of[m]);
        atomic_write(&af, line, (size_t)len);
    }
    for (int i = 0; i < trace->n; i++) {
        const SimEvent *v = &trace->ev[i];
        atomic_write(&af, ",\n{\"name\":", 10);
        put_string(&af, v->name);
        const int len = snprintf(line, sizeof line, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":0,\"tid\":%d}",
                                 v->wait ? "wait" : "compute", 1e6 * v->t0, 1e6 * (v->t1 - v->t0), rank_of[v->member]);
        atomic_write(&af, line, (size_t)len);
    }
    atomic_write(&af, "\n]}\n", 4);
    return atomic_commit(&af, e);
}

void sim_trace_free(SimTrace *trace) {
    xfree(trace->ev);
    trace->ev = NULL;
    trace->n = trace->cap = 0;
}

int simulate_schedule_replicas(const StepSchedule *sc, int replicas, const Cluster *c, const int *rank_of, int head_dim,
                               int precision, ScheduleSim *out, SeqErr *e) {
    if (replicas <= 1) return simulate_schedule(sc, c, rank_of, head_dim, precision, out, e);
    /* one schedule of replicas x members: each copy's events with its members shifted (the steps,
     * their names and the pass are shared; the simulator reads the events by their step) */
    StepSchedule x = *sc;
    const int M = sc->members;
    x.members = replicas * M;
    x.n_compute = replicas * sc->n_compute;
    x.n_messages = replicas * sc->n_messages;
    x.compute = xmalloc(sizeof *x.compute * (size_t)(x.n_compute ? x.n_compute : 1));
    x.messages = xmalloc(sizeof *x.messages * (size_t)(x.n_messages ? x.n_messages : 1));
    for (int r = 0; r < replicas; r++) {
        for (int i = 0; i < sc->n_compute; i++) {
            StepCompute *b = &x.compute[(size_t)r * sc->n_compute + i];
            *b = sc->compute[i];
            b->member += r * M;
        }
        for (int i = 0; i < sc->n_messages; i++) {
            StepMessage *m = &x.messages[(size_t)r * sc->n_messages + i];
            *m = sc->messages[i];
            m->from += r * M;
            m->to += r * M;
        }
    }
    const int rc = simulate_schedule(&x, c, rank_of, head_dim, precision, out, e);
    xfree(x.compute);
    xfree(x.messages);
    return rc;
}

/* ---------------------------------------------------------------- collectives */

/* GB/s of a collective's hops inside a node whose medium `inside` members share: each member's
 * port, its pair's limit, the medium's share. */
static double port_gbs(const Cluster *c, int inside) {
    double gbs = c->intra_gbs;
    if (c->intra_peer_gbs > 0) gbs = fmin(gbs, c->intra_peer_gbs);
    if (c->intra_node_gbs > 0) gbs = fmin(gbs, c->intra_node_gbs / inside);
    return gbs;
}

int simulate_collective(const Cluster *c, CollectiveKind kind, double bytes, double count, const CollectiveGroups *g,
                        CollectiveSim *out, SeqErr *e) {
    memset(out, 0, sizeof *out);
    if (g->size <= 1 || g->groups < 1 || !(bytes > 0 || count > 0)) return 0;
    const int ranks = c->nodes * c->ranks_per_node, rpn = c->ranks_per_node;
    const long last = (long)(g->groups - 1) * g->group_step + (long)(g->size - 1) * g->stride;
    if (g->group_step < 0 || g->stride < 1 || last >= ranks)
        return seq_err(e, "a collective of %d groups of %d reaches rank %ld: the cluster has %d ranks (%d nodes x %d): "
                          "give a larger cluster", g->groups, g->size, last, ranks, c->nodes, rpn);
    /* per node: the rings over several nodes that cross its NICs, and the members whose ring hops
     * inside it (they share its medium, where it has one); per group, its nodes and members on each */
    int *crossing = xcalloc((size_t)c->nodes, sizeof(int)), *inside = xcalloc((size_t)c->nodes, sizeof(int));
    int *tag = xmalloc(sizeof(int) * (size_t)c->nodes), *on = xcalloc((size_t)c->nodes, sizeof(int));
    int *list = xmalloc(sizeof(int) * (size_t)c->nodes);
    const int nics = c->nics_per_node > 0 ? c->nics_per_node : 1;
    const double n1 = g->size - 1.0, twice = kind == COLLECTIVE_ALLREDUCE ? 2 : 1;
    const double volume = twice * n1 / g->size * bytes, hops = twice * n1 * count;
    const int direct = c->collectives == CLUSTER_COLLECTIVES_DIRECT;
    for (int pass = 0; pass < 2; pass++) { /* 0: the nodes' shares; 1: each ring's time */
        for (int n = 0; n < c->nodes; n++) tag[n] = -1;
        for (int k = 0; k < g->groups; k++) {
            int nodes = 0;
            for (int i = 0; i < g->size; i++) {
                const int n = cluster_node_of(c, (int)(k * g->group_step + i * g->stride));
                if (tag[n] != k) tag[n] = k, on[n] = 0, list[nodes++] = n;
                on[n]++;
            }
            const int across = nodes > 1;
            double gbs = INFINITY, direct_s = 0;
            for (int j = 0; j < nodes; j++) {
                const int n = list[j];
                if (pass == 0) {
                    if (on[n] > 1) inside[n] += on[n];
                    if (across) crossing[n]++;
                    continue;
                }
                if (on[n] > 1) gbs = fmin(gbs, port_gbs(c, inside[n]));
                /* a group's share of the node's NICs: their total at the flows through each NIC
                 * (cluster_nic_gbs), over the groups crossing them */
                if (across) gbs = fmin(gbs, nics * cluster_nic_gbs(c, fmax(1.0, (double)crossing[n] / nics)) / crossing[n]);
                if (direct && across) { /* each member's share to every member on another node */
                    const double pairs = on[n] * (double)(g->size - on[n]), leaving = pairs / g->size * bytes;
                    /* an all-gather posts every share at once; a reduce-scatter's member receives
                     * from one peer at a time (parallel/comm.h), on average this many across */
                    const double f_ag = crossing[n] * pairs / nics,
                                 f_rs = crossing[n] * fmax(1.0, pairs / (g->size - 1)) / nics;
                    const double s_ag = leaving / (nics * cluster_nic_gbs(c, fmax(1.0, f_ag)) / crossing[n] * 1e9),
                                 s_rs = leaving / (nics * cluster_nic_gbs(c, fmax(1.0, f_rs)) / crossing[n] * 1e9);
                    direct_s = fmax(direct_s, kind == COLLECTIVE_ALLGATHER ? s_ag
                                              : kind == COLLECTIVE_REDUCE_SCATTER ? s_rs : s_rs + s_ag);
                }
            }
            if (pass == 0) continue;
            const double lat = 1e-6 * (across ? c->nic_latency_us : c->intra_latency_us);
            double t = volume / (gbs * 1e9) + hops * lat;
            if (direct && across) { /* the ports as the ring's, the NICs by the bytes that leave the node */
                double port = INFINITY;
                for (int j = 0; j < nodes; j++)
                    if (on[list[j]] > 1) port = fmin(port, port_gbs(c, inside[list[j]]));
                const double port_s = isfinite(port) ? volume / (port * 1e9) : 0;
                t = fmax(port_s, direct_s) + hops * lat;
                gbs = t > hops * lat ? volume / ((t - hops * lat) * 1e9) : gbs;
            }
            if (t > out->seconds) {
                out->seconds = t;
                out->gbs = gbs;
                out->across = across;
            }
        }
    }
    xfree(crossing);
    xfree(inside);
    xfree(tag);
    xfree(on);
    xfree(list);
    return 0;
}

void schedule_sim_free(ScheduleSim *s) {
    xfree(s->m);
    s->m = NULL;
}
