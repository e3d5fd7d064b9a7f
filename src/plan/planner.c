/* The planner: enumerate, check, predict memory, traffic and time, rank (planner.h). */
#include "plan/planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/llama.h"
#include "parallel/head_exchange.h"
#include "parallel/layout.h"
#include "plan/simulate.h"
#include "strategies/registry.h"

/* ---------------------------------------------------------------- traffic */

typedef struct {
    int world, dp, hp, cp, sp, W, rpn;
    Placement pl;
} Grid;

static int world_of(const Grid *g, int d, int h, int c) { return placement_world_rank(g->pl, g->hp, g->cp, d, h, c); }

/* bytes to peer world rank `peer` from world rank `me`, kind k */
static void send_to(PlanTraffic *t, const Grid *g, int k, int me, int peer, double bytes) {
    if (peer == me || bytes == 0) return;
    t->bytes[k] += bytes;
    if (peer / g->rpn == me / g->rpn) t->intra[k] += bytes;
    else t->inter[k] += bytes;
}

/* The indices [*lo, *hi] of the members first + i stride (i < n, stride > 0) that lie on the
 * node of world rank me (a member's node: a contiguous run of them); *lo > *hi for none. */
static void node_members(const Grid *g, long first, long stride, int n, int me, long *lo, long *hi) {
    const long begin = (long)(me / g->rpn) * g->rpn, end = begin + g->rpn - 1;
    long a = begin <= first ? 0 : (begin - first + stride - 1) / stride, b = end < first ? -1 : (end - first) / stride;
    *lo = a;
    *hi = b < n - 1 ? b : n - 1;
}

/* spread() over the n peers first + i stride, me among them: in closed form (the planner's loop
 * over every rank made a peer loop per rank quadratic in the ranks: 5 minutes at 4096) */
static void spread_ap(PlanTraffic *t, const Grid *g, int k, int me, long first, long stride, int n, double bytes) {
    if (n <= 1 || bytes == 0) return;
    long lo, hi;
    node_members(g, first, stride, n, me, &lo, &hi);
    const double share = bytes / (n - 1), on_node = (double)(hi - lo); /* hi - lo + 1 members, me one of them */
    t->bytes[k] += share * (n - 1);
    t->intra[k] += share * on_node;
    t->inter[k] += share * (n - 1 - on_node);
}

/* bytes spread in equal shares over n peers (world ranks; me skipped) */
static void spread(PlanTraffic *t, const Grid *g, int k, int me, const int *peers, int n, double bytes) {
    int others = 0;
    for (int i = 0; i < n; i++) others += peers[i] != me;
    if (!others) return;
    for (int i = 0; i < n; i++) send_to(t, g, k, me, peers[i], bytes / others);
}

/* The direct-model allreduce of `count` elements of es bytes over the members (world ranks,
 * in communicator order) as comm_allreduce counts it: to each peer p, (c_p + c_me) elements. */
static void allreduce_to(PlanTraffic *t, const Grid *g, int k, long first, long stride, int n, int me_index,
                         double count, double es) {
    if (n <= 1) return;
    /* the members first + p stride: the sums over peers in closed form (integers, exact) */
    const long long c = (long long)count, base = c / n, rem = c % n, mine = base + (me_index < rem);
    long lo, hi;
    node_members(g, first, stride, n, (int)(first + (long)me_index * stride), &lo, &hi);
    const long long cnt = hi - lo + 1, below = rem > lo ? (rem - 1 < hi ? rem - 1 : hi) - lo + 1 : 0;
    const long long all = (c - mine) + (long long)(n - 1) * mine; /* to every peer: its part + mine */
    const long long near = (cnt * base + below - mine) + (cnt - 1) * mine;
    t->bytes[k] += (double)all * es;
    t->intra[k] += (double)near * es;
    t->inter[k] += (double)(all - near) * es;
    t->msgs[k] += n - 1;
}

/* Shard of group rank q of g ranks over Psi elements (data_parallel.c's split). */
static void shard_of(double Psi, int q, int g, double *b, double *e) {
    long long P = (long long)Psi;
    *b = (double)(P * q / g);
    *e = (double)(P * (q + 1) / g);
}

/* Gradient reduction and ZeRO's gathers of one step (data_parallel.h's formulas), world rank w. */
static void grad_traffic(PlanTraffic *t, const Grid *g, const LlamaConfig *c, int zero, int group, int micro, int w) {
    if (g->world == 1) return;
    double E, Lu, T;
    memory_model_unit_sizes(c, &E, &Lu, &T);
    const double Psi = E + c->num_hidden_layers * Lu + T;
    if (zero == 0) {
        allreduce_to(t, g, COMM_GRAD_REDUCE, 0, 1, g->world, w, Psi, 4);
        return;
    }
    const int G = g->world / group, q = w % group, gi = w / group;
    double sb, se;
    shard_of(Psi, q, group, &sb, &se);
    const double n = se - sb;
    long lo = 0, hi = -1; /* the group's members on this rank's node */
    if (group > 1) {
        node_members(g, (long)gi * group, 1, group, w, &lo, &hi);
        /* reduce-scatter in the group: each peer gets its shard; zero 2/3 once per micro-batch (the
         * shards are contiguous: the group's add up to the whole, members lo..hi's to end(hi) - begin(lo)) */
        int reps = zero >= 2 ? micro : 1;
        double unused, whole, lo_b, hi_e;
        shard_of(Psi, 0, 1, &unused, &whole);
        shard_of(Psi, (int)lo, group, &lo_b, &unused);
        shard_of(Psi, (int)hi, group, &unused, &hi_e);
        const double all = whole - n, near = (hi_e - lo_b) - n; /* its own shard left out */
        t->bytes[COMM_GRAD_REDUCE] += 4 * all * reps;
        t->intra[COMM_GRAD_REDUCE] += 4 * near * reps;
        t->inter[COMM_GRAD_REDUCE] += 4 * (all - near) * reps;
        t->msgs[COMM_GRAD_REDUCE] += (double)(group - 1) * reps * (zero >= 2 ? c->num_hidden_layers + 2 : 1);
    }
    if (G > 1) allreduce_to(t, g, COMM_GRAD_REDUCE, q, group, G, gi, n, 4); /* the shard's replicas in the other groups */
    if (group > 1) allreduce_to(t, g, COMM_GRAD_REDUCE, (long)gi * group, 1, group, q, 1, 8); /* the norm: one double */
    if (group > 1) {
        double per_peer;
        if (zero <= 2) {
            per_peer = 4 * n; /* the updated shard to every peer after the step */
        } else {
            /* own part of the embedding and tail units: gathered once per micro-batch; layers twice */
            double ob = sb > 0 ? sb : 0, oe = se < E ? se : E;
            double outer = (oe > ob ? oe - ob : 0);
            double tb = sb > Psi - T ? sb : Psi - T;
            outer += se > tb ? se - tb : 0;
            per_peer = (double)micro * 4 * (2 * n - outer);
        }
        t->bytes[COMM_PARAM_GATHER] += per_peer * (group - 1);
        t->intra[COMM_PARAM_GATHER] += per_peer * (double)(hi - lo);
        t->inter[COMM_PARAM_GATHER] += per_peer * (double)(group - 1 - (hi - lo));
        t->msgs[COMM_PARAM_GATHER] += (double)(group - 1) * (zero <= 2 ? 1 : micro * (2.0 * c->num_hidden_layers + 2));
    }
}

/* A strategy's route (registry.h) into this rank's traffic: context ranks to world ranks. */
typedef struct {
    PlanTraffic *t;
    const Grid *g;
    int w, d, h;
} RouteCtx;

static void route_to(void *ctx, int kind, int cp_peer, double bytes) {
    RouteCtx *r = ctx;
    send_to(r->t, r->g, kind, r->w, world_of(r->g, r->d, r->h, cp_peer), bytes);
}

static void route_group(void *ctx, int kind, double bytes) {
    RouteCtx *r = ctx;
    const long first = world_of(r->g, r->d, r->h, 0), stride = r->g->pl == PLACEMENT_CONTEXT_FIRST ? 1 : r->g->hp;
    spread_ap(r->t, r->g, kind, r->w, first, stride, r->g->cp, bytes);
}

static void route_peers(void *ctx, int kind, const int *cp_peers, int n, double bytes) {
    RouteCtx *r = ctx;
    int *peers = xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) peers[i] = world_of(r->g, r->d, r->h, cp_peers[i]);
    spread(r->t, r->g, kind, r->w, peers, n, bytes);
    xfree(peers);
}

/* The strategy's parameters of configuration `in` on the grid the memory model resolved (m); dp
 * left 0, so that the simulated schedules of grids differing only in replicas share their cache. */
static void strategy_params_of(const MemoryModelInput *in, const MemoryEstimate *m, StrategyParams *sp) {
    const LlamaConfig *c = &in->model;
    strategy_params_init(strategy_named(in->par.strategy), &in->par, 0, m->hp, m->cp, in->seq_len,
                         c->num_attention_heads, c->num_key_value_heads, c->head_dim, in->precision == PRECISION_BF16,
                         sp);
}

/* plan_rank_traffic for a configuration the memory model already accepted (m: its estimate, the
 * resolved grid), so that plan_evaluate's loop over the ranks does not estimate it again per rank;
 * given (else NULL), the rank's layer volumes without and with the window (strategy_volume's of
 * its member) and the heads' split, which the loop keeps from rank to rank. */
static char *rank_traffic(const MemoryModelInput *in, const MemoryEstimate *est, int ranks_per_node, int w,
                          const AttnVolume *given_v, const AttnVolume *given_vw, const HeadSplit *given_hs,
                          PlanTraffic *t) {
    memset(t, 0, sizeof *t);
    const MemoryEstimate m = *est;
    char *err = NULL;
    const LlamaConfig *c = &in->model;
    const ParallelConfig *pc = &in->par;
    const Strategy *s = strategy_named(pc->strategy);
    Grid g = {.world = in->world, .dp = m.dp, .hp = m.hp, .cp = m.cp, .sp = m.hp * m.cp,
              .W = m.params.ring_inner > 0 ? m.params.ring_inner : m.cp, .rpn = ranks_per_node > 0 ? ranks_per_node : 1,
              .pl = pc->placement};
    if (w < 0 || w >= g.world) return xstrdup_printf("rank %d is outside the %d ranks", w, g.world);
    const int micro = in->batch / m.dp, L = c->num_hidden_layers;
    const int d = w / g.sp, in_rep = w % g.sp;
    const int h = g.pl == PLACEMENT_CONTEXT_FIRST ? in_rep / g.cp : in_rep % g.hp;
    const int cr = g.pl == PLACEMENT_CONTEXT_FIRST ? in_rep % g.cp : in_rep / g.hp;
    if (g.sp > 1 || s->own) {
        const int bf16 = in->precision == PRECISION_BF16;
        StrategyParams sp;
        strategy_params_of(in, &m, &sp);
        const int chunk_calls = strategy_attention_chunks(s, &sp);
        /* the volume of a layer without a window and of one with it (the ring runs fewer steps) */
        const int windowed = llama_windowed_layers(c);
        AttnVolume v, vw;
        if (given_v) {
            v = *given_v;
            vw = *given_vw;
            if (windowed) sp.window = c->sliding_window;
        } else {
            strategy_volume(s, &sp, h, cr, &v);
            vw = v;
            if (windowed) {
                sp.window = c->sliding_window;
                strategy_volume(s, &sp, h, cr, &vw);
            }
        }
        /* how many times per micro-batch each direction runs: forward, backward, and the checkpoint
         * mode's recomputation (layer: the forward again; selective: the head exchange of q, k, v,
         * and, where the strategy's restore() exchanges o, of o too) */
        double fwd_times = in->checkpoint == LLAMA_CKPT_LAYER ? 2 : 1;
        double extra_a2a = 0, extra_a2a_msgs = 0;
        if (g.hp > 1 && (m.streams || in->checkpoint == LLAMA_CKPT_SELECTIVE)) {
            HeadSplit own;
            if (!given_hs && (err = head_split_init(&own, g.hp, c->num_attention_heads, c->num_key_value_heads)))
                return err;
            const HeadSplit hs = given_hs ? *given_hs : own;
            const double N = (double)(in->seq_len / g.sp), e = bf16 ? 2 : 4;
            if (m.streams) { /* streamed layers: the backward fetches each chunk's o again (output_chunk) */
                extra_a2a += N * c->head_dim * e * hs.hl[h] * (g.hp - 1);
                extra_a2a_msgs += (double)(g.hp - 1) * chunk_calls;
            } else { /* selective: restore()'s exchange of q, k, v (and of o, per chunk, where it does) */
                const int fp = s->restores_o;
                for (int p = 0; p < g.hp; p++)
                    if (p != h) extra_a2a += N * c->head_dim * e * (hs.hl[p] + 2 * hs.hk[p] + (fp ? hs.hl[p] : 0));
                extra_a2a_msgs += (double)(g.hp - 1) * (fp ? 2.0 * chunk_calls : 1.0);
            }
            if (!given_hs) head_split_free(&own);
        }
        double bytes[COMM_KINDS], msgs[COMM_KINDS];
        const double Lf = L - windowed, Lw = windowed;
        for (int k = 0; k < COMM_KINDS; k++) {
            bytes[k] = (double)micro * (Lf * (fwd_times * (double)v.fwd[k] + (double)v.bwd[k]) +
                                        Lw * (fwd_times * (double)vw.fwd[k] + (double)vw.bwd[k]));
            msgs[k] = (double)micro * (Lf * (fwd_times * (double)v.fwd_msgs[k] + (double)v.bwd_msgs[k]) +
                                       Lw * (fwd_times * (double)vw.fwd_msgs[k] + (double)vw.bwd_msgs[k]));
        }
        bytes[COMM_ALLTOALL] += (double)micro * L * extra_a2a;
        msgs[COMM_ALLTOALL] += (double)micro * L * extra_a2a_msgs;
        /* peers: the head group (equal shares: exact when hp divides the heads); the context kinds
         * where the strategy's route sends them (NULL: in equal shares over the context group) */
        const int cf = g.pl == PLACEMENT_CONTEXT_FIRST; /* world_of's two orders: heads or contexts adjacent */
        spread_ap(t, &g, COMM_ALLTOALL, w, world_of(&g, d, 0, cr), cf ? g.cp : 1, g.hp, bytes[COMM_ALLTOALL]);
        if (s->route) {
            RouteCtx rc = {.t = t, .g = &g, .w = w, .d = d, .h = h};
            const TrafficSink sink = {.ctx = &rc, .to = route_to, .group = route_group, .peers = route_peers};
            RankTraffic rt = {.layer = {&v, &vw}, .layers = {Lf, Lw}, .micro = micro, .n_layers = L};
            memcpy(rt.bytes, bytes, sizeof rt.bytes);
            s->route(&sp, cr, &rt, &sink);
        } else {
            const long first = world_of(&g, d, h, 0), stride = cf ? 1 : g.hp; /* the context group */
            spread_ap(t, &g, COMM_P2P_INNER, w, first, stride, g.cp, bytes[COMM_P2P_INNER]);
            spread_ap(t, &g, COMM_P2P_OUTER, w, first, stride, g.cp, bytes[COMM_P2P_OUTER]);
            spread_ap(t, &g, COMM_TEAM, w, first, stride, g.cp, bytes[COMM_TEAM]);
        }
        for (int k = 0; k < COMM_KINDS; k++) t->msgs[k] += msgs[k];
    }
    grad_traffic(t, &g, c, in->par.zero, in->par.zero_group > 0 ? in->par.zero_group : in->world, micro, w);
    return NULL;
}

char *plan_rank_traffic(const MemoryModelInput *in, int ranks_per_node, int w, PlanTraffic *t) {
    memset(t, 0, sizeof *t);
    MemoryEstimate m;
    char *err = memory_model_estimate(in, &m);
    return err ? err : rank_traffic(in, &m, ranks_per_node, w, NULL, NULL, NULL, t);
}

/* ---------------------------------------------------------------- time */

/* Visible causal pairs (query, key at or before it) of context slot c: its queries' positions + 1,
 * at most the sliding window (> 0; 0: none) each. */
static double slot_pairs(TokenLayout l, long S, int cp, int c, int window) {
    int *pos = xmalloc(sizeof(int) * (size_t)(S / cp));
    layout_context_positions(l, (int)S, cp, c, pos);
    double sum = 0;
    for (long i = 0; i < S / cp; i++) sum += window > 0 && pos[i] + 1.0 > window ? window : pos[i] + 1.0;
    xfree(pos);
    return sum;
}

/* The pairs of every context slot (cp of them) for one layer of this window: each slot's own, or
 * (balanced: the schedules that even out causal work, Strategy.balanced) an equal share of the sequence's. */
static void layer_pairs(TokenLayout l, long S, int cp, int balanced, int window, double *pairs) {
    double total = 0;
    for (int k = 0; k < cp; k++) total += pairs[k] = slot_pairs(l, S, cp, k, window);
    if (balanced)
        for (int k = 0; k < cp; k++) pairs[k] = total / cp;
}

static double link_time(const PlanTraffic *t, int k, const PlanCluster *c) {
    double s = t->intra[k] / (c->intra_gbs * 1e9) + t->inter[k] / (c->inter_gbs * 1e9);
    double lat = t->inter[k] > 0 ? c->inter_lat_s : c->intra_lat_s;
    return s + t->msgs[k] * lat;
}

/* ---------------------------------------------------------------- simulated attention */

/* One layer's attention played on the cluster, forward and backward: each member's (c hp + h)
 * end and the time in its blocks. Cached by the strategy's parameters: the search's checkpoint
 * modes, ZeRO stages and FFN chunks share it. */
typedef struct {
    const Strategy *s;
    StrategyParams p;
    int replicas;               /* played at once: the first and those sharing its nodes */
    double *end[2], *blocks[2]; /* [forward, backward] (hp cp): each member's latest over the replicas */
    AttnVolume *vol;            /* NULL, or (hp cp) each member's strategy_volume (evaluate's ranks share it) */
} SimAttn;

typedef struct {
    SimAttn *v;
    int n, cap;
} SimCache;

static void sim_cache_free(SimCache *c) {
    for (int i = 0; i < c->n; i++) {
        for (int k = 0; k < 2; k++) xfree(c->v[i].end[k]), xfree(c->v[i].blocks[k]);
        xfree(c->v[i].vol);
    }
    xfree(c->v);
}

/* NULL, or why hp cp x replicas members do not fit the cluster (xmalloc'd). */
static char *sim_fits(int members, int replicas, const Cluster *cl) {
    if (members * replicas <= cl->nodes * cl->ranks_per_node) return NULL;
    return xstrdup_printf("%d sequence-parallel ranks do not fit the cluster's %d x %d ranks", members * replicas,
                          cl->nodes, cl->ranks_per_node);
}

/* The (query, key) pairs of one sequence of S tokens that the causal mask (and a window, > 0) lets
 * through, per head. */
static double visible_pairs(long S, int window) {
    const double n = (double)S;
    if (window <= 0 || window >= S) return n * (n + 1) / 2;
    const double w = window;
    return w * (w + 1) / 2 + (n - w) * w;
}

/* The most query rows a block of the layer of p may have: a context slot's tokens (the strategies
 * move keys and values, and whole slots' queries at most). */
static int slot_rows(const StrategyParams *p) { return (int)((p->seq_len + p->cp - 1) / p->cp); }

/* sc's blocks' visible pairs times their heads added to *sum; 0 where a block has more than `rows`
 * query rows. */
static int blocks_within(const StepSchedule *sc, int rows, double *sum) {
    for (int i = 0; i < sc->n_compute; i++) {
        if (sc->compute[i].q_rows > rows) return 0;
        *sum += (double)sc->compute[i].pairs * sc->compute[i].heads; /* whole numbers below 2^53: exact */
    }
    return 1;
}

/* Whether a pass's blocks, over its members, compute at least every visible pair of every head,
 * and none has more query rows than a context slot: what the first of the search's bounds
 * (attention_bound) takes for granted. */
static int schedule_covers(const StepSchedule *sc, const StrategyParams *p) {
    double sum = 0;
    return blocks_within(sc, slot_rows(p), &sum) && sum >= visible_pairs(p->seq_len, p->window) * p->n_heads * (1 - 1e-12);
}

/* The same of a schedule in parts (strategy_play_parts): each lane's blocks once per head member
 * that runs it. */
static int parts_cover(const SchedulePlayParts *x, const StrategyParams *p) {
    double sum = 0;
    int ok = blocks_within(&x->exchange, slot_rows(p), &sum);
    for (int h = 0; ok && x->n_lanes && h < p->hp; h++) ok = blocks_within(&x->lanes[x->lane_of[h]], slot_rows(p), &sum);
    return ok && sum >= visible_pairs(p->seq_len, p->window) * p->n_heads * (1 - 1e-12);
}

/* Each member's layer volume of a played layer (a's strategy and parameters), computed once. */
static const AttnVolume *sim_volumes(SimAttn *a) {
    if (!a->vol) {
        const int members = a->p.hp * a->p.cp;
        a->vol = xmalloc(sizeof *a->vol * (size_t)members);
        for (int m = 0; m < members; m++) strategy_volume(a->s, &a->p, m % a->p.hp, m / a->p.hp, &a->vol[m]);
    }
    return a->vol;
}

/* The layer of s with p (p->window: that layer's window) played on cl with member (h, c) of replica
 * d on world rank placement_world_rank(p->placement, ..., d, h, c), `replicas` replicas at once:
 * from the cache, or played and kept. NULL with *err (xmalloc'd) when it cannot be played. */
static SimAttn *sim_attention(SimCache *cache, const Strategy *s, const StrategyParams *p, int replicas,
                              const Cluster *cl, char **err) {
    for (int i = 0; i < cache->n; i++) /* StrategyParams holds no padding: its bytes are its fields */
        if (cache->v[i].s == s && cache->v[i].replicas == replicas && !memcmp(&cache->v[i].p, p, sizeof *p))
            return &cache->v[i];
    const int members = p->hp * p->cp;
    if ((*err = sim_fits(members, replicas, cl))) return NULL;
    SimAttn a = {.s = s, .p = *p, .replicas = replicas};
    int *rank_of = xmalloc(sizeof(int) * (size_t)(members * replicas));
    for (int m = 0; m < members * replicas; m++)
        rank_of[m] = placement_world_rank(p->placement, p->hp, p->cp, m / members, m % members % p->hp, m % members / p->hp);
    for (int k = 0; k < 2 && !*err; k++) {
        StepSchedule sc;
        strategy_play(s, p, k ? PASS_BACKWARD : PASS_FORWARD, &sc);
        ScheduleSim sim;
        SeqErr e;
        if (!schedule_covers(&sc, p)) {
            *err = xstrdup_printf("%s's %s schedule computes fewer (query, key) pairs than the causal mask lets "
                                  "through, or a block of more query rows than a context slot's: the planner's "
                                  "bounds assume neither (a bug)", s->name, k ? "backward" : "forward");
        } else if (simulate_schedule_replicas(&sc, replicas, cl, rank_of, p->head_dim,
                                       p->attn_bf16 ? PRECISION_BF16 : PRECISION_FP32, &sim, &e) != 0) {
            *err = xstrdup(e.msg);
        } else {
            a.end[k] = xcalloc((size_t)members, sizeof(double));
            a.blocks[k] = xcalloc((size_t)members, sizeof(double));
            for (int m = 0; m < members * replicas; m++) {
                a.end[k][m % members] = fmax(a.end[k][m % members], sim.m[m].end_s);
                a.blocks[k][m % members] = fmax(a.blocks[k][m % members], sim.m[m].compute_s);
            }
            schedule_sim_free(&sim);
        }
        schedule_free(&sc);
    }
    xfree(rank_of);
    if (*err) {
        for (int k = 0; k < 2; k++) xfree(a.end[k]), xfree(a.blocks[k]);
        return NULL;
    }
    cache->v = xgrow(cache->v, &cache->cap, cache->n, sizeof *cache->v, 16);
    cache->v[cache->n] = a;
    return &cache->v[cache->n++];
}

/* The most a curve gives at `rows` or fewer: it is linear between its points and constant outside
 * them, so its largest point at or below rows, or its value at rows. */
static double curve_peak(const ClusterCurve *k, double rows) {
    double peak = cluster_curve_at(k, rows);
    for (int i = 0; i < k->n && k->x[i] <= rows; i++) peak = fmax(peak, k->tflops[i]);
    return peak;
}

/* The cluster's highest attention rate (FLOP/s) of any block of `rows` (its shorter side) or
 * fewer: the most any of its curves gives there (a head dimension between two curves is a mix of
 * them, no more than the larger), a little over for the rounding of the mixes. */
static double attention_peak(const Cluster *cl, double rows) {
    double peak = curve_peak(&cl->attn, rows);
    for (int k = 0; k < cl->n_attn_curves; k++) peak = fmax(peak, curve_peak(&cl->attn_curves[k].rate, rows));
    return peak * 1e12 * (1 + 1e-9);
}

/* Lower bounds of what sim_attention gives for the layer of s with p, without playing the events:
 * each member's blocks (exact) and, as its end, a lower bound, replica 0's members alone (the
 * replicas sharing its NICs only slow it). level 2: simulate_lanes_bound on the schedule in parts
 * (strategy_play_parts: a lane that several head members run emitted and summed once): the
 * member's blocks step by step, its own bytes through its NIC, port and node medium. level 3: on
 * the whole schedule (strategy_play), the larger of that and simulate_schedule_step_bound's (step
 * by step, each step's transfers after their latency). Cached in `cache` (one a level): its index
 * there, or -1 with *err (xmalloc'd) when it cannot be played. */
static int sim_attention_bound(int level, SimCache *cache, const Strategy *s, const StrategyParams *p,
                               const Cluster *cl, char **err) {
    for (int i = 0; i < cache->n; i++)
        if (cache->v[i].s == s && !memcmp(&cache->v[i].p, p, sizeof *p)) return i;
    const int members = p->hp * p->cp;
    /* head-first and context-first only map the members (grid positions) to world ranks: a
     * schedule, whose members are grid positions, is the same under both (only a strategy whose
     * play reads its teams' placement, KNOB_TEAM_PLACEMENT, differs), so one emitted schedule
     * bounds both */
    SimAttn b[2] = {{.s = s, .p = *p, .replicas = 1}, {.s = s, .p = *p, .replicas = 1}};
    int variants = 1;
    if (p->hp > 1 && p->cp > 1 && !(s->reads & KNOB_TEAM_PLACEMENT) &&
        (p->placement == PLACEMENT_HEAD_FIRST || p->placement == PLACEMENT_CONTEXT_FIRST)) {
        b[1].p.placement = p->placement == PLACEMENT_HEAD_FIRST ? PLACEMENT_CONTEXT_FIRST : PLACEMENT_HEAD_FIRST;
        variants = 2;
        for (int i = 0; i < cache->n; i++)
            if (cache->v[i].s == s && !memcmp(&cache->v[i].p, &b[1].p, sizeof b[1].p)) variants = 1;
    }
    int *rank_of = xmalloc(sizeof(int) * (size_t)members * 2);
    for (int v = 0; v < variants; v++)
        for (int m = 0; m < members; m++)
            rank_of[v * members + m] = placement_world_rank(b[v].p.placement, p->hp, p->cp, 0, m % p->hp, m / p->hp);
    for (int k = 0; k < 2 && !*err && level == 3; k++) {
        /* the whole schedule, step by step: the larger of the two bounds, member by member */
        StepSchedule sc;
        strategy_play(s, p, k ? PASS_BACKWARD : PASS_FORWARD, &sc);
        SeqErr e;
        double *steps = xmalloc(sizeof(double) * (size_t)members);
        for (int v = 0; v < variants; v++) {
            b[v].end[k] = xcalloc((size_t)members, sizeof(double));
            b[v].blocks[k] = xcalloc((size_t)members, sizeof(double));
        }
        if (!schedule_covers(&sc, p))
            *err = xstrdup_printf("%s's %s schedule breaks the planner's bounds (a bug): see sim_attention", s->name,
                                  k ? "backward" : "forward");
        for (int v = 0; v < variants && !*err; v++) {
            const int *ro = rank_of + v * members, prec = p->attn_bf16 ? PRECISION_BF16 : PRECISION_FP32;
            if (simulate_schedule_bound(&sc, cl, ro, p->head_dim, prec, b[v].end[k], b[v].blocks[k], &e) != 0 ||
                simulate_schedule_step_bound(&sc, cl, ro, p->head_dim, prec, steps, &e) != 0) {
                *err = xstrdup(e.msg);
                break;
            }
            for (int m = 0; m < members; m++) b[v].end[k][m] = fmax(b[v].end[k][m], steps[m]);
        }
        xfree(steps);
        schedule_free(&sc);
    }
    for (int k = 0; k < 2 && !*err && level == 2; k++) {
        /* the schedule in parts: the lanes of head members with the same heads emitted and summed once */
        SchedulePlayParts sc;
        strategy_play_parts(s, p, k ? PASS_BACKWARD : PASS_FORWARD, &sc);
        SeqErr e;
        for (int v = 0; v < variants; v++) {
            b[v].end[k] = xcalloc((size_t)members, sizeof(double));
            b[v].blocks[k] = xcalloc((size_t)members, sizeof(double));
        }
        if (!parts_cover(&sc, p))
            *err = xstrdup_printf("%s's %s schedule breaks the planner's bounds (a bug): see sim_attention", s->name,
                                  k ? "backward" : "forward");
        for (int v = 0; v < variants && !*err; v++)
            if (simulate_lanes_bound(&sc.exchange, sc.n_lanes ? sc.lanes : NULL, sc.lane_of, cl, rank_of + v * members,
                                     p->head_dim, p->attn_bf16 ? PRECISION_BF16 : PRECISION_FP32, b[v].end[k],
                                     b[v].blocks[k], &e) != 0)
                *err = xstrdup(e.msg);
        schedule_play_parts_free(&sc);
    }
    xfree(rank_of);
    if (*err) {
        for (int v = 0; v < variants; v++)
            for (int k = 0; k < 2; k++) xfree(b[v].end[k]), xfree(b[v].blocks[k]);
        return -1;
    }
    for (int v = 0; v < variants; v++) {
        cache->v = xgrow(cache->v, &cache->cap, cache->n, sizeof *cache->v, 16);
        cache->v[cache->n++] = b[v];
    }
    return cache->n - variants;
}

/* Lower bounds of the attention of a step's layers (Lf without a window with p, Lw with pw: p with
 * the window), forward counted fwd_runs times. level 1: no schedule at all: *out, a lower bound of
 * the most any member spends in it from each pass's start to its last step's end (what evaluate
 * makes of SimAttn's end): each pass computes at least every visible pair of every head, in blocks
 * of a context slot's query rows at most (schedule_covers: every play checks both), at the
 * cluster's highest rate for such blocks, and the member that does the most at least the members'
 * mean. level 2 or 3: *a and *aw (NULL without Lw), sim_attention_bound's of that level, each
 * member's blocks (exact) and a lower bound of its end. NULL, or the reason (xmalloc'd). */
static char *attention_bound(int level, SimCache *cache, const Strategy *s, const StrategyParams *p,
                             const StrategyParams *pw, double Lf, double Lw, int replicas, const Cluster *cl,
                             double fwd_runs, double *out, const SimAttn **a, const SimAttn **aw) {
    const int members = p->hp * p->cp;
    char *err = sim_fits(members, replicas, cl);
    if (err) return err;
    if (level == 1) {
        const double scale = 4.0 * p->n_heads * p->head_dim / (members * attention_peak(cl, slot_rows(p)));
        const double layer = Lf * visible_pairs(p->seq_len, p->window) * scale +
                             (Lw ? Lw * visible_pairs(pw->seq_len, pw->window) * scale : 0);
        *out = layer * fwd_runs + layer * cl->attn_backward_factor;
        return NULL;
    }
    cache += level - 2; /* each level's bounds apart */
    const int ia = sim_attention_bound(level, cache, s, p, cl, &err);
    const int iw = ia >= 0 && Lw ? sim_attention_bound(level, cache, s, pw, cl, &err) : -1;
    if (err) return err;
    *a = &cache->v[ia];
    *aw = iw >= 0 ? &cache->v[iw] : NULL;
    return NULL;
}

/* ---------------------------------------------------------------- the cluster's collectives */

/* The parts of a step outside attention on the cluster: the gradient reduction (a ZeRO group's
 * reduce-scatter, then each shard's all-reduce over the groups: the data-parallel sync; or, at ZeRO
 * 0, one all-reduce over the world), ZeRO's gathers of the parameters, each as NCCL's ring plays it
 * (simulate_collective), in the bytes and counts data_parallel.h's code sends; the optimizer step
 * (AdamW: parameters, gradients and both moments read, all but the gradients written, fp32: 28 bytes
 * a parameter of the rank's shard) at the rank's memory bandwidth; the cluster's fixed cost. */
typedef struct {
    double grad, gather, optimizer, fixed;
    int grad_across, gather_across;
} StepCollectives;

static char *step_collectives(const Cluster *cl, const MemoryModelInput *in, int P, int micro, StepCollectives *out) {
    memset(out, 0, sizeof *out);
    const LlamaConfig *c = &in->model;
    double E, Lu, T;
    memory_model_unit_sizes(c, &E, &Lu, &T);
    const double Psi = E + c->num_hidden_layers * Lu + T;
    const int zero = in->par.zero, group = in->par.zero_group > 0 ? in->par.zero_group : P, G = P / group;
    const double shard = zero ? Psi / group : Psi;
    if (cl->device_mem_gbs > 0) out->optimizer = 28.0 * shard / (cl->device_mem_gbs * 1e9);
    out->fixed = 1e-3 * cl->step_overhead_ms;
    if (P == 1) return NULL;
    CollectiveSim cs;
    SeqErr e;
    if (zero == 0) {
        const CollectiveGroups world = {.groups = 1, .size = P, .group_step = 0, .stride = 1};
        if (simulate_collective(cl, COLLECTIVE_ALLREDUCE, 4 * Psi, 1, &world, &cs, &e)) return xstrdup(e.msg);
        out->grad = cs.seconds, out->grad_across = cs.across;
        return NULL;
    }
    const CollectiveGroups in_group = {.groups = G, .size = group, .group_step = group, .stride = 1};
    const CollectiveGroups across = {.groups = group, .size = G, .group_step = 1, .stride = group};
    /* ZeRO-2/3 reduce-scatter every micro-batch, layer by layer (and the embedding and the tail) */
    const double reps = zero >= 2 ? micro : 1, calls = zero >= 2 ? c->num_hidden_layers + 2 : 1;
    if (simulate_collective(cl, COLLECTIVE_REDUCE_SCATTER, reps * 4 * Psi, reps * calls, &in_group, &cs, &e))
        return xstrdup(e.msg);
    out->grad = cs.seconds, out->grad_across = cs.across;
    if (simulate_collective(cl, COLLECTIVE_ALLREDUCE, 4 * shard, 1, &across, &cs, &e)) return xstrdup(e.msg);
    out->grad += cs.seconds, out->grad_across |= cs.across;
    if (simulate_collective(cl, COLLECTIVE_ALLREDUCE, 8, 1, &in_group, &cs, &e)) return xstrdup(e.msg); /* the norm */
    out->grad += cs.seconds;
    /* the updated shards to every member after the step; ZeRO-3: every layer gathered twice a
     * micro-batch (forward and backward), the embedding and the tail once */
    const double gathered = zero <= 2 ? 4 * Psi : micro * 4 * (2 * Psi - E - T);
    const double gathers = zero <= 2 ? 1 : micro * (2.0 * c->num_hidden_layers + 2);
    if (simulate_collective(cl, COLLECTIVE_ALLGATHER, gathered, gathers, &in_group, &cs, &e)) return xstrdup(e.msg);
    out->gather = cs.seconds, out->gather_across = cs.across;
    return NULL;
}

/* How many replicas share nodes with the first (the node size over its greatest common divisor with
 * the replica's ranks), at most dp: those whose attention transfers the simulator plays beside it. */
static int replicas_sharing(int sp, int rpn, int dp) {
    int a = sp, b = rpn;
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    const int r = rpn / a;
    return r < dp ? r : dp;
}

/* ---------------------------------------------------------------- the step */

/* The step of evaluate's rank with E seconds of attention in place of its blocks and waits (the
 * rest of the attention's exposure, the head exchange beyond the played passes, left out): its
 * backward at most E of attention (what ZeRO-2/3 hide their reduce-scatters behind), its compute at
 * most t_dense and E (what ZeRO-3 hides its gathers behind). A rank whose attention takes E has a
 * step at least this. */
static double step_at(double E, int micro, double t_dense, const StepCollectives *col, int zero) {
    const double compute = micro * (t_dense + E) + col->optimizer;
    const double gr_x = zero >= 2 ? fmax(0, col->grad - micro * (E + t_dense * 2.0 / 3.0)) : col->grad;
    const double pg_x = zero == 3 ? fmax(0, col->gather - compute) : col->gather;
    return compute + gr_x + pg_x + col->fixed;
}

/* A lower bound of the step of a configuration whose slowest member spends at least E seconds in
 * its layers' attention (attention_bound): the least step_at takes at E or beyond. It falls with E
 * where ZeRO-3's gathers outlast the compute and ZeRO-2/3's reduce-scatter the backward (both
 * hidden behind more of it), and is convex, piecewise linear with a kink where each stops being
 * hidden: its least at E or at a kink past E. Less a relative 1e-6 for the rounding of the sums it
 * stands for. */
static double step_bound(double E, int micro, double t_dense, const StepCollectives *col, int zero) {
    double least = step_at(E, micro, t_dense, col, zero);
    const double kinks[2] = {zero == 3 ? (col->gather - col->optimizer) / micro - t_dense : -1,
                             zero >= 2 ? col->grad / micro - t_dense * 2.0 / 3.0 : -1};
    for (int i = 0; i < 2; i++)
        if (kinks[i] > E) least = fmin(least, step_at(kinks[i], micro, t_dense, col, zero));
    return least * (1 - 1e-6);
}

/* A lower bound of the step of a configuration from the second or the third bound of its layers'
 * attention (a: the layers without a window, Lf of them; aw: with one, Lw): for each member, the
 * step of evaluate's rank on it with its blocks (exact) and, for its waits, its end's lower bound
 * less its blocks (the head exchange beyond the played passes left out); the slowest member's.
 * Tighter than step_bound of the most a member spends in attention: waits hide no reduce-scatter
 * or gather in evaluate, blocks do. Less a relative 1e-6 for the rounding of the sums. */
static double members_step_bound(const SimAttn *a, const SimAttn *aw, double Lf, double Lw, double fwd_runs, int micro,
                                 double t_dense, const StepCollectives *col, int zero) {
    const int members = a->p.hp * a->p.cp;
    double worst = 0;
    for (int m = 0; m < members; m++) {
        double end[2], blocks[2];
        for (int k = 0; k < 2; k++) {
            end[k] = Lf * a->end[k][m] + (Lw ? Lw * aw->end[k][m] : 0);
            blocks[k] = Lf * a->blocks[k][m] + (Lw ? Lw * aw->blocks[k][m] : 0);
        }
        const double t_attn_f = blocks[0] * fwd_runs, t_attn_b = blocks[1];
        const double waits = micro * (fmax(0, end[0] - blocks[0]) * fwd_runs + fmax(0, end[1] - blocks[1]));
        const double compute = micro * (t_dense + t_attn_f + t_attn_b) + col->optimizer;
        const double backward = micro * (t_attn_b + t_dense * 2.0 / 3.0);
        const double gr_x = zero >= 2 ? fmax(0, col->grad - backward) : col->grad;
        const double pg_x = zero == 3 ? fmax(0, col->gather - compute) : col->gather;
        worst = fmax(worst, compute + waits + gr_x + pg_x + col->fixed);
    }
    return worst * (1 - 1e-6);
}

/* One configuration: level 0 exact (its attention played: sim_attention); level 1, 2 or 3 (a
 * configuration the cluster's simulator would play) t_step only, a lower bound (attention_bound's
 * level, its schedules in `bounds`), with the same refusals as level 0 but a schedule that cannot
 * finish (the strategies' schedules all do: tests/test_schedule.c). */
static char *evaluate(const MemoryModelInput *in0, const PlanCluster *cl, SimCache *cache, SimCache *bounds, int level,
                      PlanEntry *e) {
    memset(e, 0, sizeof *e);
    MemoryModelInput in = *in0;
    in.world = cl->ranks;
    in.cores = cl->cores_per_node * (cl->ranks / cl->ranks_per_node > 0 ? cl->ranks / cl->ranks_per_node : 1);
    char *err = memory_model_estimate(&in, &e->mem);
    if (err) return err;
    const MemoryEstimate *m = &e->mem;
    const LlamaConfig *c = &in.model;
    const Strategy *s = strategy_named(in.par.strategy);
    e->par = in.par;
    e->par.dp = m->dp;
    e->par.hp = m->hp;
    e->par.cp = m->cp;
    e->checkpoint = in.checkpoint;
    e->ffn_chunks = in.ffn_chunks;
    e->ram = m->ram_total + cl->runtime_bytes;
    e->fits = cl->ram_bytes <= 0 || e->ram <= cl->ram_bytes;

    const int sp = m->hp * m->cp, micro = in.batch / m->dp, L = c->num_hidden_layers;
    const double thr = m->threads > 0 ? m->threads : 1;
    const double S = (double)in.seq_len, N = S / sp;
    double rec_dense, rec_attn;
    llama_recompute_flops_parts(c, S, llama_window_length(S, c->sliding_window), in.checkpoint,
                                in.checkpoint == LLAMA_CKPT_NONE && m->ffn_chunks == 1,
                                llama_rebuilds_x_mid(in.checkpoint, in.precision, m->streams), &rec_dense, &rec_attn);
    const double dense = N * (6.0 * llama_matmul_params(c) + rec_dense);
    const double t_dense = dense / (cl->gemm_gflops * 1e9 * thr);
    const TokenLayout layout = in.par.layout_given ? in.par.layout : s->default_layout;
    const int balanced = s->balanced;
    HeadSplit hs;
    err = head_split_init(&hs, m->hp, c->num_attention_heads, c->num_key_value_heads);
    if (err) return err;
    const int windowed = llama_windowed_layers(c);
    /* the attention played on the cluster: layers without a window and with one */
    SimAttn *played[2] = {NULL, NULL};
    StrategyParams sprm;
    strategy_params_of(&in, m, &sprm);
    StepCollectives col = {0};
    if (cl->sim) err = step_collectives(cl->sim, &in, cl->ranks, micro, &col);
    if (cl->sim && !err && (sp > 1 || s->own)) {
        const int reps = replicas_sharing(sp, cl->sim->ranks_per_node, m->dp);
        if (level > 0) {
            StrategyParams pw = sprm;
            pw.window = c->sliding_window;
            double E = 0;
            const double fwd_runs = in.checkpoint == LLAMA_CKPT_LAYER ? 2 : 1;
            const SimAttn *a = NULL, *aw = NULL;
            err = attention_bound(level, bounds, s, &sprm, &pw, L - windowed, windowed, reps, cl->sim, fwd_runs, &E,
                                  &a, &aw);
            if (!err) {
                e->t_step = level == 1 ? step_bound(E, micro, t_dense, &col, in.par.zero)
                                       : members_step_bound(a, aw, L - windowed, windowed, fwd_runs, micro, t_dense, &col,
                                                            in.par.zero);
                e->tokens_per_s = in.batch * S / e->t_step;
                e->bound = level;
            }
            head_split_free(&hs);
            return err;
        }
        played[0] = sim_attention(cache, s, &sprm, reps, cl->sim, &err);
        if (played[0] && windowed) {
            StrategyParams pw = sprm;
            pw.window = c->sliding_window;
            played[1] = sim_attention(cache, s, &pw, reps, cl->sim, &err);
            /* (adding the second may have moved the cache: the first again, found there) */
            if (played[1]) played[0] = sim_attention(cache, s, &sprm, reps, cl->sim, &err);
        }
    }
    if (err) {
        head_split_free(&hs);
        return err;
    }
    /* each slot's pairs over the layers, those without a window and those with one: the attention's
     * time where the cluster does not play it */
    double *pairs = xcalloc((size_t)m->cp, sizeof(double));
    if (!played[0]) {
        double *wpairs = xmalloc(sizeof(double) * (size_t)m->cp);
        layer_pairs(layout, in.seq_len, m->cp, balanced, 0, pairs);
        if (windowed) layer_pairs(layout, in.seq_len, m->cp, balanced, c->sliding_window, wpairs);
        for (int k = 0; k < m->cp; k++) pairs[k] = (L - windowed) * pairs[k] + (windowed ? windowed * wpairs[k] : 0);
        xfree(wpairs);
    }

    const AttnVolume *vols[2] = {played[0] ? sim_volumes(played[0]) : NULL, played[1] ? sim_volumes(played[1]) : NULL};
    double worst = -1;
    for (int w = 0; w < cl->ranks; w++) {
        const int in_rep = w % sp;
        const int h = in.par.placement == PLACEMENT_CONTEXT_FIRST ? in_rep / m->cp : in_rep % m->hp;
        const int cr = in.par.placement == PLACEMENT_CONTEXT_FIRST ? in_rep % m->cp : in_rep / m->hp;
        const double fwd = 4.0 * c->head_dim * pairs[cr] * hs.hl[h]; /* every layer's */
        const double fwd_runs = in.checkpoint == LLAMA_CKPT_LAYER ? 2 : 1;
        double t_attn_f = fwd * fwd_runs / (cl->attn_fwd_gflops * 1e9 * thr);
        double t_attn_b = 2.5 * fwd / (cl->attn_bwd_gflops * 1e9 * thr);
        PlanTraffic t;
        const int mb = cr * m->hp + h;
        const AttnVolume *pv = played[0] ? &vols[0][mb] : NULL, *pvw = played[0] ? &vols[windowed ? 1 : 0][mb] : NULL;
        err = rank_traffic(&in, m, cl->ranks_per_node, w, pv, pvw, &hs, &t);
        if (err) break;
        double exposed;
        if (played[0]) { /* its blocks and its waits as the cluster plays them, every layer */
            const double Lf = L - windowed, Lw = windowed;
            double end[2], blocks[2];
            for (int k = 0; k < 2; k++) {
                end[k] = Lf * played[0]->end[k][mb] + (Lw ? Lw * played[1]->end[k][mb] : 0);
                blocks[k] = Lf * played[0]->blocks[k][mb] + (Lw ? Lw * played[1]->blocks[k][mb] : 0);
            }
            t_attn_f = blocks[0] * fwd_runs;
            t_attn_b = blocks[1];
            exposed = micro * ((end[0] - blocks[0]) * fwd_runs + end[1] - blocks[1]);
            /* the head-exchange bytes beyond the played passes (selective checkpointing's restore,
             * streamed layers' output fetch) at the links' rates */
            const AttnVolume v = *pv, vw = *pvw;
            const double played_a2a = micro * (Lf * (fwd_runs * (double)v.fwd[COMM_ALLTOALL] + (double)v.bwd[COMM_ALLTOALL]) +
                                               Lw * (fwd_runs * (double)vw.fwd[COMM_ALLTOALL] + (double)vw.bwd[COMM_ALLTOALL]));
            const double extra = t.bytes[COMM_ALLTOALL] - played_a2a;
            if (extra > 0 && t.bytes[COMM_ALLTOALL] > 0) {
                PlanTraffic x = {0};
                const double share = extra / t.bytes[COMM_ALLTOALL];
                x.intra[COMM_ALLTOALL] = share * t.intra[COMM_ALLTOALL];
                x.inter[COMM_ALLTOALL] = share * t.inter[COMM_ALLTOALL];
                exposed += link_time(&x, COMM_ALLTOALL, cl);
            }
        } else {
            exposed = link_time(&t, COMM_ALLTOALL, cl) + link_time(&t, COMM_TEAM, cl);
            const double p2p = link_time(&t, COMM_P2P_INNER, cl) + link_time(&t, COMM_P2P_OUTER, cl);
            exposed += fmax(0, p2p - micro * (t_attn_f + t_attn_b));
        }
        const double attn_comm = exposed;
        const double compute = micro * (t_dense + t_attn_f + t_attn_b) + col.optimizer;
        /* the gradient reduction and ZeRO's gathers: the cluster's collectives, else each rank's bytes at
         * the links' rates */
        const double gr = cl->sim ? col.grad : link_time(&t, COMM_GRAD_REDUCE, cl);
        const double pg = cl->sim ? col.gather : link_time(&t, COMM_PARAM_GATHER, cl);
        const double backward = micro * (t_attn_b + t_dense * 2.0 / 3.0);
        const double gr_x = in.par.zero >= 2 ? fmax(0, gr - backward) : gr;
        const double pg_x = in.par.zero == 3 ? fmax(0, pg - compute) : pg;
        exposed += gr_x + pg_x;
        const double step = compute + exposed + col.fixed;
        if (step > worst) {
            worst = step;
            e->t_compute = compute;
            e->t_exposed = exposed;
            e->terms = (PlanTerms){.gemm = micro * t_dense, .attention = micro * (t_attn_f + t_attn_b),
                                   .attn_comm = attn_comm, .grad = gr_x, .gather = pg_x,
                                   .grad_across = col.grad_across, .gather_across = col.gather_across,
                                   .optimizer = col.optimizer, .fixed = col.fixed};
            static const int attn_kinds[] = {COMM_ALLTOALL, COMM_P2P_INNER, COMM_P2P_OUTER, COMM_TEAM};
            for (size_t k = 0; k < ARRAY_LEN(attn_kinds); k++)
                e->terms.attn_intra += t.intra[attn_kinds[k]], e->terms.attn_inter += t.inter[attn_kinds[k]];
        }
        double inter = 0, total = 0;
        for (int k = 0; k < COMM_KINDS; k++) inter += t.inter[k], total += t.bytes[k];
        e->inter_bytes = fmax(e->inter_bytes, inter);
        e->total_bytes = fmax(e->total_bytes, total);
    }
    xfree(pairs);
    head_split_free(&hs);
    if (err) return err;
    e->t_step = worst;
    e->tokens_per_s = worst > 0 ? in.batch * S / worst : 0;
    return NULL;
}

char *plan_evaluate(const MemoryModelInput *in, const PlanCluster *cl, PlanEntry *e) {
    SimCache cache = {0};
    char *err = evaluate(in, cl, &cache, NULL, 0, e);
    sim_cache_free(&cache);
    return err;
}

/* ---------------------------------------------------------------- search */

typedef struct {
    PlanEntry *v;
    int n, cap, invalid;
    char *first_refusal; /* the first configuration's reason, for a search that finds none */
    int level;           /* evaluate's level for the configurations as they are found */
    MemoryModelInput *in; /* level > 0: each entry's input, to evaluate it again (in_cap) */
    int in_cap;
} List;

static void try_one(List *l, const MemoryModelInput *in, const PlanCluster *c, SimCache *cache, SimCache *bounds) {
    PlanEntry e;
    char *err = evaluate(in, c, cache, bounds, l->level, &e);
    if (err) {
        if (!l->first_refusal) l->first_refusal = err;
        else xfree(err);
        l->invalid++;
        return;
    }
    e.order = l->n;
    if (l->level) {
        l->in = xgrow(l->in, &l->in_cap, l->n, sizeof *l->in, 64);
        l->in[l->n] = *in;
    }
    l->v = xgrow(l->v, &l->cap, l->n, sizeof *l->v, 64);
    l->v[l->n++] = e;
}

/* Fitting first, by speed; those that do not fit after them by RAM, the smallest first. By speed
 * in two passes: sorted fastest first, then cut into groups of the entries within PLAN_TIE of
 * their group's fastest, and inside a group the simpler configuration goes first: the lower ZeRO
 * stage (its gathers and rebinding cost what the model does not count), then less recomputation
 * (none, selective, layer), then fewer bytes to other nodes (what a wrong guess of the links' speed
 * would hurt most), then the faster, then less RAM. (A tie "within 1%" is not transitive, so it
 * cannot be one comparison for qsort; a log-spaced bucket was, but split pairs 0.3% apart.) */
#define PLAN_TIE 0.01
static int ckpt_rank(int ckpt) { return ckpt == LLAMA_CKPT_NONE ? 0 : ckpt == LLAMA_CKPT_SELECTIVE ? 1 : 2; }

static int cmp_speed(const void *a, const void *b) {
    const PlanEntry *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (!x->fits && x->ram != y->ram) return x->ram < y->ram ? -1 : 1; /* nearest to fitting first */
    if (x->tokens_per_s != y->tokens_per_s) return x->tokens_per_s < y->tokens_per_s ? 1 : -1;
    if (x->ram != y->ram) return x->ram < y->ram ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int cmp_simpler(const void *a, const void *b) {
    const PlanEntry *x = a, *y = b;
    if (x->par.zero != y->par.zero) return x->par.zero - y->par.zero;
    if (x->checkpoint != y->checkpoint) return ckpt_rank(x->checkpoint) - ckpt_rank(y->checkpoint);
    if (x->inter_bytes != y->inter_bytes) return x->inter_bytes < y->inter_bytes ? -1 : 1;
    return cmp_speed(a, b);
}

static void rank_entries(PlanEntry *v, int n) {
    if (n < 2) return;
    qsort(v, (size_t)n, sizeof *v, cmp_speed);
    int nfit = 0;
    while (nfit < n && v[nfit].fits) nfit++;
    for (int i = 0; i < nfit;) {
        int j = i + 1;
        while (j < nfit && v[j].tokens_per_s * (1 + PLAN_TIE) >= v[i].tokens_per_s) j++;
        qsort(v + i, (size_t)(j - i), sizeof *v, cmp_simpler);
        i = j;
    }
}

static int fixed_or(int fixed, int v) { return fixed > 0 ? fixed == v : 1; }

/* A binary heap of entries of v, the smallest step first (then the search's order). */
static int heap_less(const PlanEntry *v, int a, int b) {
    return v[a].t_step != v[b].t_step ? v[a].t_step < v[b].t_step : v[a].order < v[b].order;
}
static void heap_push(int *h, int *n, const PlanEntry *v, int x) {
    int i = (*n)++;
    for (; i > 0 && heap_less(v, x, h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = x;
}
static void heap_pop(int *h, int *n, const PlanEntry *v) {
    const int x = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(v, h[c + 1], h[c])) c++;
        if (!heap_less(v, h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
}

/* plan_search's `exact`: the entries of l (found at level 1: bounds) made exact, the smallest step
 * first (a bound made exact comes back with its larger step; a level-1 bound first becomes the
 * level-2 one, that the level-3 one, each at least the one before), until `exact` fitting ones are
 * exact and faster, beyond the tie, than the smallest bound left; where fewer than `exact` fit,
 * every entry. The steps taken out in that order never decrease, so the exact ones taken are the
 * fastest of all (where fewer fit, each is played at once, its tighter bounds of no use). An entry whose refinement is refused
 * leaves the list, counted as refused. */
static void refine(List *l, const PlanCluster *c, SimCache *cache, SimCache *bounds, int exact) {
    int fits = 0;
    for (int i = 0; i < l->n; i++) fits += l->v[i].fits;
    int *heap = xmalloc(sizeof(int) * (size_t)(l->n ? l->n : 1)), nh = 0, done = 0;
    char *gone = xcalloc((size_t)(l->n ? l->n : 1), 1);
    for (int i = 0; i < l->n; i++)
        if (fits < exact || l->v[i].fits) heap_push(heap, &nh, l->v, i);
    double kth = 0; /* the exact-th exact entry's tokens/s */
    while (nh) {
        const int i = heap[0];
        PlanEntry *e = &l->v[i];
        if (done >= exact && kth > e->tokens_per_s * (1 + PLAN_TIE)) break;
        heap_pop(heap, &nh, l->v);
        if (!e->bound) {
            if (e->fits && ++done == exact) kth = e->tokens_per_s;
            continue;
        }
        PlanEntry x;
        char *err = evaluate(&l->in[i], c, cache, bounds, e->bound && e->bound < 3 && fits >= exact ? e->bound + 1 : 0, &x);
        if (err) {
            if (!l->first_refusal) l->first_refusal = err;
            else xfree(err);
            l->invalid++;
            gone[i] = 1;
            continue;
        }
        x.order = e->order;
        if (x.bound && x.t_step < e->t_step) { /* two lower bounds: the larger (the steps taken out never decrease) */
            x.t_step = e->t_step;
            x.tokens_per_s = e->tokens_per_s;
        }
        if (!x.bound && x.t_step < e->t_step) { /* a bound above the played step: the search's premise broken */
            if (!l->first_refusal)
                l->first_refusal = xstrdup_printf("the planner's lower bound of a %s step (%.9g s) is above the step "
                                                  "played (%.9g s): a bug", e->par.strategy, e->t_step, x.t_step);
            l->invalid++;
            gone[i] = 1;
            continue;
        }
        *e = x;
        heap_push(heap, &nh, l->v, i);
    }
    int kept = 0;
    for (int i = 0; i < l->n; i++)
        if (!gone[i]) l->v[kept++] = l->v[i];
    l->n = kept;
    xfree(heap);
    xfree(gone);
}

char *plan_search(const MemoryModelInput *base, const PlanFixed *f, const PlanCluster *c, int exact, PlanEntry **out,
                  int *n, int *invalid, char **refusal) {
    *out = NULL;
    *n = *invalid = 0;
    if (refusal) *refusal = NULL;
    if (c->ranks < 1) return xstrdup_printf("--ranks %d: give the job's ranks (at least 1)", c->ranks);
    if (c->ranks_per_node < 1 || c->ranks % c->ranks_per_node != 0)
        return xstrdup_printf("--ranks-per-node %d does not divide --ranks %d: use a divisor of %d", c->ranks_per_node,
                       c->ranks, c->ranks);
    if (f->strategy && !strategy_find(f->strategy)) return strategy_unknown_message(f->strategy);
    if (!(c->gemm_gflops > 0 && c->attn_fwd_gflops > 0 && c->attn_bwd_gflops > 0 && c->intra_gbs > 0 &&
          c->inter_gbs > 0))
        return xstrdup_printf("the planner needs positive GEMM and attention rates and link bandwidths");
    const int P = c->ranks;
    static const int ckpts[3] = {LLAMA_CKPT_NONE, LLAMA_CKPT_SELECTIVE, LLAMA_CKPT_LAYER};
    List l = {.level = exact > 0 && c->sim ? 1 : 0};
    SimCache cache = {0}, bounds[2] = {{0}}; /* the second and the third bounds' */
    MemoryModelInput in = *base;
    for (int si = 0; strategy_at(si); si++) {
        const Strategy *s = strategy_at(si);
        if (f->strategy && strcmp(f->strategy, s->name)) continue;
        /* only the strategies train would take the fixed flags with: a knob fixes the strategies that
         * read it (the others refuse it; with --strategy given, nothing runs, and the CLI names
         * train's reason) */
        ParallelConfig fx = base->par;
        fx.knobs = f->knobs;
        fx.placement = f->placement >= 0 ? (Placement)f->placement : PLACEMENT_HEAD_FIRST;
        char *unread = parallel_flags_check(s, &fx);
        xfree(unread);
        if (unread) continue;
        for (int dp = 1; dp <= P; dp++) {
            if (P % dp || !fixed_or(f->dp, dp)) continue;
            char *batch_err = batch_split_error(base->batch, dp);
            if (batch_err) { /* the memory model's reason, kept for a search that finds nothing */
                if (!l.first_refusal) l.first_refusal = batch_err;
                else xfree(batch_err);
                continue;
            }
            const int sp = P / dp;
            for (int hp = 1; hp <= sp; hp++) {
                if (sp % hp || !fixed_or(f->hp, hp) || !fixed_or(f->cp, sp / hp)) continue;
                const int cp = sp / hp;
                /* each grid once: the corners under the heads-only and context-only strategies, the
                 * middle under the 2D one */
                if (s->grid == GRID_HEADS_ONLY && cp != 1) continue;
                if (s->grid == GRID_CONTEXT_ONLY && hp != 1) continue;
                /* (sp = 1, data parallel only: once, as the 2D strategy's 1 x 1, and under the
                 * strategies with their own attention, whose chunked layers save memory on one rank) */
                if (s->grid == GRID_2D && (hp == 1) != (cp == 1)) continue;
                if (s->grid != GRID_2D && sp == 1 && !s->own) continue;
                if (s->grid == GRID_CONTEXT && cp == 1) continue;
                StrategyFixed fixed = {.knobs = f->knobs, .placement = f->placement, .strategy_given = f->strategy != NULL,
                                       .seq_len = base->seq_len};
                StrategyCandidate cand[256];
                const int nc = strategy_candidates(s, hp, cp, &fixed, cand, (int)ARRAY_LEN(cand));
                for (int k = 0; k < nc; k++) {
                    const StrategyCandidate *sc = &cand[k];
                    /* under a sliding window the plain ring on the contiguous layout runs only the steps
                     * the window reaches and its slots' work evens out past it: tried beside the
                     * strategy's default layout where the user gave none */
                    const int try_contig = sc->plain_ring && !base->par.layout_given &&
                                           llama_windowed_layers(&base->model) && s->default_layout != LAYOUT_CONTIGUOUS;
                    /* lay 0: the strategy's (or the user's) layout; 1: the contiguous one beside it */
                    for (int lay = 0; lay < (try_contig ? 2 : 1); lay++)
                        for (int ci = 0; ci < 3; ci++) {
                            if (f->checkpoint >= 0 && f->checkpoint != ckpts[ci]) continue;
                            for (int z = 0; z <= 3; z++) { /* one rank: ZeRO shards nothing, unless given */
                                if (f->zero >= 0 ? f->zero != z : P == 1 && z > 0) continue;
                                in.par = base->par;
                                if (lay) {
                                    in.par.layout = LAYOUT_CONTIGUOUS;
                                    in.par.layout_given = 1;
                                }
                                in.par.strategy = s->name;
                                in.par.dp = dp;
                                in.par.hp = hp;
                                in.par.cp = cp;
                                in.par.knobs = sc->knobs;
                                in.par.placement = sc->placement;
                                in.par.zero = z;
                                in.checkpoint = ckpts[ci];
                                in.ffn_chunks = base->ffn_chunks;
                                const int before = l.n;
                                try_one(&l, &in, c, &cache, bounds);
                                /* one FFN chunk: no gate / up recompute (not under a streaming strategy,
                                 * whose chunks are the stream's), where the default has more than one */
                                if (base->ffn_chunks == 0 && ckpts[ci] == LLAMA_CKPT_NONE && !s->streams &&
                                    l.n > before && l.v[l.n - 1].mem.ffn_chunks > 1) {
                                    in.ffn_chunks = 1;
                                    try_one(&l, &in, c, &cache, bounds);
                                }
                            }
                        }
                }
            }
        }
    }
    if (l.level) refine(&l, c, &cache, bounds, exact);
    sim_cache_free(&cache);
    sim_cache_free(&bounds[0]);
    sim_cache_free(&bounds[1]);
    xfree(l.in);
    rank_entries(l.v, l.n);
    *out = l.v;
    *n = l.n;
    *invalid = l.invalid;
    if (refusal && l.n == 0) *refusal = l.first_refusal;
    else xfree(l.first_refusal);
    return NULL;
}

/* ---------------------------------------------------------------- explain */

/* The terms of a step, named, in the order plan_explain lists them. */
#define EXPLAIN_TERMS 7
static void explain_terms(const PlanTerms *t, double v[EXPLAIN_TERMS], const char *name[EXPLAIN_TERMS]) {
    static const char *const names[EXPLAIN_TERMS] = {
        "the GEMMs (recomputation included)", "attention's blocks", "attention's exposed messages",
        "the gradient reduction", "ZeRO's gathers", "the optimizer step", "the fixed cost"};
    const double x[EXPLAIN_TERMS] = {t->gemm, t->attention, t->attn_comm, t->grad, t->gather, t->optimizer, t->fixed};
    for (int i = 0; i < EXPLAIN_TERMS; i++) v[i] = x[i], name[i] = names[i];
}

/* One line: the step and its parts. */
static int explain_line(const PlanEntry *e, const char *label, char *buf, size_t n) {
    const PlanTerms *t = &e->terms;
    char flags[512];
    plan_flags(e, flags, sizeof flags);
    char fixed[48] = "";
    if (t->fixed > 0) snprintf(fixed, sizeof fixed, " + fixed %.4g", t->fixed);
    return snprintf(buf, n,
                    "%s %s\n    step %.4g s = compute %.4g (GEMMs %.4g, attention %.4g, optimizer %.3g) + exposed %.4g "
                    "(attention's messages %.4g: %.0f MB a step in the node, %.0f MB across; gradient reduction %.4g%s; "
                    "ZeRO's gathers %.4g%s)%s; %.0f MiB a rank\n",
                    label, flags, e->t_step, e->t_compute, t->gemm, t->attention, t->optimizer, e->t_exposed, t->attn_comm,
                    t->attn_intra / 1e6, t->attn_inter / 1e6, t->grad, t->grad_across ? " across nodes" : "", t->gather,
                    t->gather_across ? " across nodes" : "", fixed, e->ram / 1048576.0);
}

void plan_explain(const PlanEntry *e, const PlanEntry *other, char *buf, size_t n) {
    size_t len = 0;
#define PUT(call)                                                                                                      \
    do {                                                                                                               \
        const int w_ = (call);                                                                                         \
        if (w_ > 0) len = len + (size_t)w_ < n ? len + (size_t)w_ : (n ? n - 1 : 0);                                   \
    } while (0)
    if (n) buf[0] = 0;
    PUT(explain_line(e, "#1:", buf + len, n - len));
    if (!other) {
        PUT(snprintf(buf + len, n - len, "#1 is the only configuration that runs\n"));
        return;
    }
    PUT(explain_line(other, "#2:", buf + len, n - len));
    if (!other->fits || !e->fits) {
        PUT(snprintf(buf + len, n - len, "#2 %s: memory decided (%.0f MiB a rank against %.0f)\n",
                     other->fits ? "fits too" : "does not fit", other->ram / 1048576.0, e->ram / 1048576.0));
        if (!other->fits) return;
    }
    double a[EXPLAIN_TERMS], b[EXPLAIN_TERMS];
    const char *name[EXPLAIN_TERMS];
    explain_terms(&e->terms, a, name);
    explain_terms(&other->terms, b, name);
    int first = -1, second = -1; /* the terms where #1 gains most over #2 */
    for (int i = 0; i < EXPLAIN_TERMS; i++) {
        const double d = b[i] - a[i];
        if (first < 0 || d > b[first] - a[first]) second = first, first = i;
        else if (second < 0 || d > b[second] - a[second]) second = i;
    }
    double worst = 0; /* and where it loses most */
    int lost = -1;
    for (int i = 0; i < EXPLAIN_TERMS; i++)
        if (a[i] - b[i] > worst && a[i] - b[i] > 1e-3 * e->t_step) worst = a[i] - b[i], lost = i;
    const double faster = other->t_step > 0 ? 100 * (other->t_step - e->t_step) / other->t_step : 0;
    if (e->tokens_per_s <= other->tokens_per_s * (1 + PLAN_TIE)) {
        const char *why = e->par.zero != other->par.zero ? "the lower ZeRO stage"
                          : e->checkpoint != other->checkpoint ? "less recomputation"
                          : e->inter_bytes != other->inter_bytes ? "fewer bytes across nodes"
                                                                 : "the faster, then less RAM";
        PUT(snprintf(buf + len, n - len,
                     "#1 against #2: %.2f%% %s, within 1%%: the simpler configuration first, decided by %s "
                     "(%.0f against %.0f MB across nodes a step)\n",
                     fabs(faster), faster >= 0 ? "faster" : "slower", why, e->inter_bytes / 1e6, other->inter_bytes / 1e6));
        return;
    }
    PUT(snprintf(buf + len, n - len, "#1 against #2: %.2f%% faster (%.4g s a step less): decided by %s (%.4g s less)",
                 faster, other->t_step - e->t_step, name[first], b[first] - a[first]));
    if (second >= 0 && b[second] - a[second] > 0)
        PUT(snprintf(buf + len, n - len, ", then %s (%.4g s less)", name[second], b[second] - a[second]));
    if (lost >= 0) PUT(snprintf(buf + len, n - len, "; against it: %s (%.4g s more)", name[lost], worst));
    PUT(snprintf(buf + len, n - len, "\n"));
#undef PUT
}

void plan_flags(const PlanEntry *e, char *buf, size_t n) {
    const ParallelConfig *p = &e->par;
    int len = snprintf(buf, n, "--strategy %s", p->strategy);
    const Strategy *s = strategy_find(p->strategy);
#define ADD(...)                                                                                                       \
    do {                                                                                                               \
        if (len >= 0 && (size_t)len < n) len += snprintf(buf + len, n - (size_t)len, __VA_ARGS__);                      \
    } while (0)
    if (p->dp > 1) ADD(" --dp %d", p->dp);
    if (s && s->grid != GRID_CONTEXT_ONLY && (p->hp > 1 || s->grid == GRID_2D)) ADD(" --hp %d", p->hp);
    if (s && s->grid != GRID_HEADS_ONLY && p->cp > 1) ADD(" --cp %d", p->cp);
    if (s) {
        char knobs[256];
        strategy_knob_flags(s, p, knobs, sizeof knobs);
        ADD("%s", knobs);
    }
    if (p->placement != PLACEMENT_HEAD_FIRST) ADD(" --placement %s", placement_name(p->placement));
    if (p->layout_given) ADD(" --layout %s", layout_name(p->layout));
    ADD(" --checkpoint %s", llama_checkpoint_name(e->checkpoint));
    if (e->ffn_chunks > 0) ADD(" --ffn-chunks %d", e->ffn_chunks);
    if (p->zero) ADD(" --zero %d", p->zero);
    if (p->offload_dir && ((s && s->reads & KNOB_CHUNK_OFFLOAD) || e->checkpoint != LLAMA_CKPT_NONE)) ADD(" --offload-dir %s", p->offload_dir);
#undef ADD
}
