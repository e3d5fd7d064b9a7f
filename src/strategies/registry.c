/* The strategy registry: see registry.h. One line per strategy in TABLE. */
#include "strategies/registry.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "parallel/dist_attention.h"
#include "parallel/head_exchange.h"

/* The registered strategies, in the order `seqpar strategies` lists them and the planner tries them;
 * the first is the default. One line each: X(NAME) for `const Strategy NAME_strategy` in NAME.c.
 * SEQPAR_REGISTRY_EXTRA adds more (tests/test_plugin.c compiles this file with an example). */
#ifndef SEQPAR_REGISTRY_EXTRA
#define SEQPAR_REGISTRY_EXTRA(X)
#endif
#define STRATEGIES(X) \
    X(double_ring)    \
    X(ulysses)        \
    X(ring)           \
    X(fpdt)           \
    X(lightseq)       \
    X(allgather)      \
    X(wallfacer)      \
    SEQPAR_REGISTRY_EXTRA(X)

#define DECLARE(n) extern const Strategy n##_strategy;
STRATEGIES(DECLARE)
#undef DECLARE
#define ENTRY(n) &n##_strategy,
static const Strategy *const TABLE[] = {STRATEGIES(ENTRY)};
#undef ENTRY

const Strategy *strategy_at(int i) { return i >= 0 && i < (int)ARRAY_LEN(TABLE) ? TABLE[i] : NULL; }

const Strategy *strategy_find(const char *name) {
    for (size_t i = 0; i < ARRAY_LEN(TABLE); i++)
        if (!strcmp(TABLE[i]->name, name)) return TABLE[i];
    return NULL;
}

const Strategy *strategy_default(void) { return TABLE[0]; }

const Strategy *strategy_named(const char *name) { return name ? strategy_find(name) : strategy_default(); }

char *strategy_unknown_message(const char *name) {
    char buf[512];
    int len = snprintf(buf, sizeof buf, "unknown strategy '%s': use one of", name);
    for (size_t i = 0; i < ARRAY_LEN(TABLE) && len < (int)sizeof buf - 32; i++)
        len += snprintf(buf + len, sizeof buf - (size_t)len, "%s %s", i ? "," : "", TABLE[i]->name);
    snprintf(buf + len, sizeof buf - (size_t)len, " (seqpar strategies lists them)");
    return xstrdup(buf);
}

char *strategy_grid(const Strategy *s, int hp_given, int cp_given, int sp_ranks, int n_heads, int *hp, int *cp) {
    char buf[256];
    *hp = hp_given > 0 ? hp_given : 1;
    *cp = cp_given > 0 ? cp_given : 1;
    switch (s->grid) {
    case GRID_2D: return NULL;
    case GRID_HEADS_ONLY:
        if (cp_given > 1) {
            snprintf(buf, sizeof buf,
                     "--strategy %s splits heads only: drop --cp %d (or use --strategy 2d for heads x context)",
                     s->name, cp_given);
            return xstrdup(buf);
        }
        *cp = 1;
        if (hp_given <= 0) *hp = sp_ranks > 0 ? sp_ranks : 1;
        if (hp_given <= 0 && n_heads > 0 && *hp > n_heads) {
            char range[48];
            if (n_heads == 1) snprintf(range, sizeof range, "--hp 1");
            else snprintf(range, sizeof range, "--hp 1 to %d", n_heads);
            snprintf(buf, sizeof buf,
                     "--strategy %s puts all %d ranks in head parallelism, more than the model's %d query head%s: "
                     "give %s (the other ranks become data-parallel replicas) or use --strategy 2d",
                     s->name, *hp, n_heads, n_heads == 1 ? "" : "s", range);
            return xstrdup(buf);
        }
        return NULL;
    case GRID_CONTEXT_ONLY:
        if (hp_given > 1) {
            snprintf(buf, sizeof buf,
                     "--strategy %s splits the sequence only: drop --hp %d (or use --strategy 2d for heads x context)",
                     s->name, hp_given);
            return xstrdup(buf);
        }
        *hp = 1;
        if (cp_given <= 0) *cp = sp_ranks > 0 ? sp_ranks : 1;
        return NULL;
    case GRID_CONTEXT:
        if (cp_given <= 0) *cp = sp_ranks > 0 && sp_ranks % *hp == 0 ? sp_ranks / *hp : 1;
        return NULL;
    }
    return NULL;
}

const char *strategy_run_name(const Strategy *s, int sp, int dp) {
    return sp > 1 || s->own ? s->name : dp > 1 ? "data parallel only" : "single process";
}

void strategy_defaults(const Strategy *s, StrategyParams *p) {
    if (s->defaults) s->defaults(p);
}

void strategy_describe(const Strategy *s, const StrategyParams *p, char *buf, size_t n) {
    if (n) buf[0] = 0;
    if (s->describe) s->describe(p, buf, n);
}

/* The heads the schedule holds on head member hp_rank, as the schedule's StrategyParams (hp = 1:
 * the heads are already this member's share). */
static StrategyParams schedule_view(const StrategyParams *p, const HeadSplit *hs, int hp_rank) {
    StrategyParams q = *p;
    q.hp = 1;
    q.n_heads = hs->hl[hp_rank];
    q.n_kv_heads = hs->hk[hp_rank];
    return q;
}

SeqAttention *strategy_create_attention(const Strategy *s, const StrategyParams *p, const Topology *t, Comm *comm) {
    return s->own ? s->own->create(p, t, comm) : dist_attention_create(s->schedule, p, t, comm);
}

void strategy_positions(const Strategy *s, const StrategyParams *p, int hp_rank, int cp_rank, int *positions) {
    if (s->own && s->own->positions)
        s->own->positions(p, hp_rank, cp_rank, positions);
    else
        layout_positions(p->layout, (int)p->seq_len, p->hp, p->cp, hp_rank, cp_rank, positions);
}

char *strategy_check_heads(const StrategyParams *p) {
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) return err;
    head_split_free(&hs);
    if (p->head_dim < 1) {
        char buf[64];
        snprintf(buf, sizeof buf, "head_dim %d must be positive", p->head_dim);
        return xstrdup(buf);
    }
    return NULL;
}

char *strategy_check(const Strategy *s, const StrategyParams *p) {
    if (s->own) return s->own->check(p);
    char *err = strategy_check_heads(p);
    if (err) return err;
    /* the schedule's own constraint first: it names what the grid must change (lightseq's even cp),
     * which would otherwise hide behind a --seq-len that does not split over the wrong grid */
    err = s->schedule->check ? s->schedule->check(p) : NULL;
    return err ? err : layout_split_error(p->layout, p->seq_len, p->hp, p->cp);
}

long strategy_fit_length(const Strategy *s, const ParallelConfig *cfg, int dp, int hp, int cp, long min_len,
                         int n_heads, int n_kv_heads, int head_dim, int bf16, StrategyParams *p) {
    const long last = 2 * min_len + 4096;
    for (long S = min_len; S <= last && S <= (1L << 30); S++) {
        strategy_params_init(s, cfg, dp, hp, cp, S, n_heads, n_kv_heads, head_dim, bf16, p);
        char *err = hp * cp > 1 || s->own ? strategy_check(s, p) : NULL;
        if (!err) return S;
        xfree(err);
    }
    return -1;
}

void strategy_volume(const Strategy *s, const StrategyParams *p, int hp_rank, int cp_rank, AttnVolume *v) {
    memset(v, 0, sizeof *v);
    if (s->own) {
        s->own->volume(p, hp_rank, v);
        return;
    }
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("strategy_volume: %s", err);
    /* one exchange of the N local rows a layer, dout carrying delta */
    dist_attention_exchange_volume(p, &hs, hp_rank, p->seq_len / ((long)p->hp * p->cp), 1, 1, v);
    StrategyParams sv = schedule_view(p, &hs, hp_rank);
    if (p->cp > 1 && s->schedule->volume) {
        AttnVolume c;
        memset(&c, 0, sizeof c);
        s->schedule->volume(&sv, cp_rank, &c);
        for (int k = 0; k < COMM_KINDS; k++) {
            v->fwd[k] += c.fwd[k];
            v->bwd[k] += c.bwd[k];
            v->fwd_msgs[k] += c.fwd_msgs[k];
            v->bwd_msgs[k] += c.bwd_msgs[k];
        }
        v->ring_home_bytes = c.ring_home_bytes;
        v->ring_home_back = c.ring_home_back;
    }
    head_split_free(&hs);
}

/* The context schedule of every head member of p (hp of them): lanes[0 .. return value) the
 * distinct ones, each played once (a lane is a function of its view: members with the same query
 * and KV heads run the same one), lane_of[h] head member h's. */
static int play_lanes(const Strategy *s, const StrategyParams *p, const HeadSplit *hs, SchedulePass pass,
                      StepSchedule *lanes, int *lane_of) {
    int n = 0;
    for (int h = 0; h < p->hp; h++) {
        int same = -1;
        for (int g = 0; g < h && same < 0; g++)
            if (hs->hl[g] == hs->hl[h] && hs->hk[g] == hs->hk[h]) same = lane_of[g];
        if (same >= 0) {
            lane_of[h] = same;
            continue;
        }
        StrategyParams sv = schedule_view(p, hs, h);
        schedule_init(&lanes[n], 1, p->cp, pass);
        s->schedule->play(&sv, pass, &lanes[n]);
        lane_of[h] = n++;
    }
    return n;
}

/* The head exchange's step before a context group's schedule (before: q, k, v forward; dout and
 * delta backward) or after it (o; dq, dk, dv). */
static void play_head_exchange(StepSchedule *out, const HeadSplit *hs, const StrategyParams *p, int fwd, int before) {
    const long N = p->seq_len / ((long)p->hp * p->cp);
    const int elem = p->wire_bf16 ? 2 : 4;
    if (before) {
        schedule_step(out, fwd ? "head exchange: q, k, v" : "head exchange: dout, delta");
        schedule_head_exchange(out, hs, N, p->head_dim, elem, fwd ? HX_QKV : HX_DOUT, 1);
    } else {
        schedule_step(out, fwd ? "head exchange: o" : "head exchange: dq, dk, dv");
        schedule_head_exchange(out, hs, N, p->head_dim, elem, fwd ? HX_OUT : HX_GRADS, 0);
    }
}

void strategy_play(const Strategy *s, const StrategyParams *p, SchedulePass pass, StepSchedule *out) {
    schedule_init(out, p->hp, p->cp, pass);
    const ScheduleInfo *sched = s->schedule;
    void (*own_play)(const StrategyParams *, SchedulePass, StepSchedule *) = s->own ? s->own->play : NULL;
    if (s->own ? !own_play : !sched->play) die("internal: strategy %s plays no schedule", s->name);
    if (own_play) {
        own_play(p, pass, out);
        schedule_finish(out);
        return;
    }
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("strategy_play: %s", err);
    const int fwd = pass == PASS_FORWARD;
    if (p->hp > 1) play_head_exchange(out, &hs, p, fwd, 1);
    const int first = out->n_steps;
    StepSchedule *lanes = xmalloc(sizeof *lanes * (size_t)p->hp);
    int *lane_of = xmalloc(sizeof(int) * (size_t)p->hp);
    const int n_lanes = play_lanes(s, p, &hs, pass, lanes, lane_of);
    for (int i = 0; i < n_lanes; i++) schedule_finish(&lanes[i]);
    schedule_add_lanes(out, lanes, lane_of, first); /* every head member's context group runs its lane */
    for (int i = 0; i < n_lanes; i++) schedule_free(&lanes[i]);
    xfree(lanes);
    xfree(lane_of);
    if (p->hp > 1) play_head_exchange(out, &hs, p, fwd, 0);
    head_split_free(&hs);
    schedule_finish(out);
}

void strategy_play_parts(const Strategy *s, const StrategyParams *p, SchedulePass pass, SchedulePlayParts *out) {
    memset(out, 0, sizeof *out);
    if (s->own) {
        strategy_play(s, p, pass, &out->exchange);
        return;
    }
    if (!s->schedule->play) die("internal: strategy %s plays no schedule", s->name);
    schedule_init(&out->exchange, p->hp, p->cp, pass);
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("strategy_play_parts: %s", err);
    if (p->hp > 1) {
        play_head_exchange(&out->exchange, &hs, p, pass == PASS_FORWARD, 1);
        play_head_exchange(&out->exchange, &hs, p, pass == PASS_FORWARD, 0);
    }
    schedule_finish(&out->exchange);
    out->lanes = xmalloc(sizeof *out->lanes * (size_t)p->hp);
    out->lane_of = xmalloc(sizeof(int) * (size_t)p->hp);
    out->n_lanes = play_lanes(s, p, &hs, pass, out->lanes, out->lane_of);
    for (int i = 0; i < out->n_lanes; i++) schedule_finish(&out->lanes[i]);
    head_split_free(&hs);
}

void schedule_play_parts_free(SchedulePlayParts *x) {
    schedule_free(&x->exchange);
    for (int i = 0; i < x->n_lanes; i++) schedule_free(&x->lanes[i]);
    xfree(x->lanes);
    xfree(x->lane_of);
    memset(x, 0, sizeof *x);
}

void strategy_attention_work(const Strategy *s, const SeqAttention *sa, AttnWork *w) {
    if (!s->own)
        dist_attention_work(sa, w);
    else if (s->own->work)
        s->own->work(sa, w);
    else
        memset(w, 0, sizeof *w);
}

void strategy_memory(const Strategy *s, const StrategyParams *p, int hp_rank, AttnMemory *m) {
    memset(m, 0, sizeof *m);
    if (s->own) {
        s->own->memory(p, hp_rank, m);
        return;
    }
    HeadSplit hs;
    char *err = head_split_init(&hs, p->hp, p->n_heads, p->n_kv_heads);
    if (err) die("strategy_memory: %s", err);
    const size_t n = (size_t)(p->seq_len / p->cp), N = (size_t)(p->seq_len / ((long)p->hp * p->cp));
    const size_t d = (size_t)p->head_dim, Hl = (size_t)hs.hl[hp_rank], Hk = (size_t)hs.hk[hp_rank];
    m->saved_per_layer = n * Hl * d + 2 * n * Hk * d + n * Hl; /* q_h | kv_h | lse_h */
    m->rows_per_call = n; /* block_attention calls the kernel a query run at a time: at most a slot's rows */
    m->kept_per_layer = n * Hl;                                       /* lse_h */
    m->bf16_per_layer = n * Hl * d + 2 * n * Hk * d;                  /* q_h | kv_h */
    /* the head exchange's send and receive buffers (head_exchange_init: the largest block set
     * either way, dout with delta d + 1 floats per row and head); the bf16 wire's words live in
     * them */
    const size_t H = (size_t)p->n_heads;
    size_t theirs = 0, mine = n * (Hl + 2 * Hk) * d;
    for (int q = 0; q < p->hp; q++) theirs += N * (size_t)(hs.hl[q] + 2 * hs.hk[q]) * d;
    size_t most = theirs > mine ? theirs : mine;
    if (N * H * (d + 1) > most) most = N * H * (d + 1);
    if (n * Hl * (d + 1) > most) most = n * Hl * (d + 1);
    size_t exchange = most + (p->hp > 1 ? most : 0);
    /* dout_h, dq_h (n, Hl, d), delta (n, Hl), dkv_h, the local delta (N, H); the forward's o_h
     * lives in the exchange's send buffer */
    size_t scratch = n * Hl * d * 2 + n * Hl + 2 * n * Hk * d + N * H;
    StrategyParams sv = schedule_view(p, &hs, hp_rank);
    size_t sched = s->schedule->workspace_floats ? s->schedule->workspace_floats(&sv) : 0;
    m->workspace = exchange + scratch + sched + (size_t)p->seq_len; /* + positions (S ints of 4 bytes) */
    head_split_free(&hs);
}

/* The refusal of bit k where s does not read it; NULL where it does. */
static char *unread(unsigned k, const Strategy *s, const ParallelConfig *cfg) {
    return s->reads & k ? NULL : strategy_knob_refusal(k, s, cfg);
}

/* The knobs' slots: the names the table's strategies declare, each once, in table order. */
static const StrategyKnob *knob_slots[KNOB_SLOTS];
static int knob_slot_count = -1;

static void knob_slots_init(void) {
    if (knob_slot_count >= 0) return;
    int n = 0;
    for (size_t i = 0; i < ARRAY_LEN(TABLE); i++)
        for (const StrategyKnob *k = TABLE[i]->knobs; k && k->name; k++) {
            int seen = 0;
            for (int j = 0; j < n && !seen; j++) seen = !strcmp(knob_slots[j]->name, k->name);
            if (seen) continue;
            if (n == KNOB_SLOTS) die("internal: the strategies declare more than %d knobs: raise KNOB_SLOTS", KNOB_SLOTS);
            knob_slots[n++] = k;
        }
    knob_slot_count = n;
}

int strategy_knob_count(void) {
    knob_slots_init();
    return knob_slot_count;
}

const StrategyKnob *strategy_knob(int slot) {
    knob_slots_init();
    return slot >= 0 && slot < knob_slot_count ? knob_slots[slot] : NULL;
}

int strategy_knob_slot(const char *name) {
    knob_slots_init();
    for (int j = 0; j < knob_slot_count; j++)
        if (!strcmp(knob_slots[j]->name, name)) return j;
    return -1;
}

const StrategyKnob *strategy_knob_of(const Strategy *s, int slot) {
    const StrategyKnob *named = strategy_knob(slot);
    if (!named) return NULL;
    for (const StrategyKnob *k = s->knobs; k && k->name; k++)
        if (!strcmp(k->name, named->name)) return k;
    return NULL;
}

int knob_get(const KnobValues *k, const char *name) {
    const int slot = strategy_knob_slot(name);
    return slot >= 0 ? k->v[slot] : 0;
}

void knob_set(KnobValues *k, const char *name, int value) {
    const int slot = strategy_knob_slot(name);
    if (slot < 0) die("internal: no strategy declares the knob '%s'", name);
    k->v[slot] = value;
}

int knobs_given(const KnobValues *k) {
    for (int j = 0; j < KNOB_SLOTS; j++)
        if (k->v[j]) return 1;
    return 0;
}

int strategy_knob_param(const StrategyParams *p, const StrategyKnob *k) {
    int v;
    memcpy(&v, (const char *)p + k->param, sizeof v);
    return v;
}

void strategy_apply_knobs(const Strategy *s, const KnobValues *given, StrategyParams *p) {
    for (const StrategyKnob *k = s->knobs; k && k->name; k++) {
        const int v = given->v[strategy_knob_slot(k->name)];
        memcpy((char *)p + k->param, &v, sizeof v);
    }
}

/* The value a knob runs at in pc on context group cp where it is not given. */
static int knob_unset(const StrategyKnob *k, int cp) { return k->same == KNOB_SAME_CP ? cp : k->same == KNOB_SAME_ONE; }

void strategy_knob_flags(const Strategy *s, const ParallelConfig *pc, char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = 0;
    for (const StrategyKnob *k = s->knobs; k && k->name; k++) {
        const int v = pc->knobs.v[strategy_knob_slot(k->name)];
        if (v <= 0 || (k->same != KNOB_SAME_NONE && v == knob_unset(k, pc->cp)) || len >= n) continue;
        int w = snprintf(buf + len, n - len, " --%s %d", k->name, v);
        if (w > 0) len += (size_t)w < n - len ? (size_t)w : n - len - 1;
    }
}

int strategy_knob_shown(const Strategy *s, const ParallelConfig *pc, int slot) {
    const StrategyKnob *k = strategy_knob_of(s, slot);
    if (!k) return -1;
    return pc->knobs.v[slot] > 0 ? pc->knobs.v[slot] : knob_unset(k, pc->cp);
}

int strategy_knob_value(const StrategyKnob *k, const StrategyParams *p) {
    const int v = strategy_knob_param(p, k);
    return v > 0 ? v : knob_unset(k, p->cp);
}

void strategy_knob_key(const Strategy *s, const StrategyKnob *k, char *buf, size_t n) {
    snprintf(buf, n, "%s_%s", s->name, k->name);
}

const StrategyKnob *strategy_chunk_knob(const Strategy *s) {
    for (const StrategyKnob *k = s->knobs; k && k->name; k++)
        if (k->param == offsetof(StrategyParams, chunks)) return k;
    return NULL;
}

int strategy_attention_chunks(const Strategy *s, const StrategyParams *p) {
    return s->streams && p->chunks > 1 ? p->chunks : 1;
}

char *parallel_flags_check(const Strategy *s, const ParallelConfig *cfg) {
    char *err = NULL;
    if (cfg->placement == PLACEMENT_TEAM_FIRST || cfg->placement == PLACEMENT_RING_FIRST)
        err = unread(KNOB_TEAM_PLACEMENT, s, cfg);
    if (!err && s->check_config) err = s->check_config(cfg);
    for (int j = strategy_knob_count() - 1; !err && j >= 0; j--) { /* the later strategies' knobs first */
        const int v = cfg->knobs.v[j];
        const StrategyKnob *k = strategy_knob(j);
        /* a value that means the same as not giving it is still a flag this run does not read,
         * except 1 for a count (--chunks 1: one chunk, what every strategy runs) */
        if (v <= 0 || (k->same == KNOB_SAME_ONE && v == 1) || strategy_knob_of(s, j)) continue;
        for (size_t i = 0; i < ARRAY_LEN(TABLE) && !err; i++) {
            const StrategyKnob *own = strategy_knob_of(TABLE[i], j);
            if (own && own->refuse) err = own->refuse(s, v);
        }
        if (!err)
            err = xstrdup_printf("--%s %d is not read by --strategy %s: drop it (seqpar strategies lists what each "
                                 "strategy reads)", k->name, v, s->name);
    }
    return err;
}

char *strategy_knob_refusal(unsigned knob, const Strategy *s, const ParallelConfig *cfg) {
    for (size_t i = 0; i < ARRAY_LEN(TABLE); i++)
        if (TABLE[i]->owns & knob && TABLE[i]->refuse) return TABLE[i]->refuse(knob, s, cfg);
    return xstrdup_printf("a setting --strategy %s does not read was given: drop it (seqpar strategies lists what "
                          "each strategy reads)", s->name);
}

void strategy_flags_help(char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = 0;
    for (int j = 0; j < strategy_knob_count() && len < n; j++) {
        const StrategyKnob *k = strategy_knob(j);
        char flag[64];
        snprintf(flag, sizeof flag, "--%s %s", k->name, k->metavar);
        int w = snprintf(buf + len, n - len, "  %-18s  %s\n", flag, k->help);
        if (w > 0) len += (size_t)w < n - len ? (size_t)w : n - len - 1;
    }
}

void strategy_params_init(const Strategy *s, const ParallelConfig *cfg, int dp, int hp, int cp, long seq_len,
                          int n_heads, int n_kv_heads, int head_dim, int bf16, StrategyParams *p) {
    *p = (StrategyParams){.hp = hp, .cp = cp, .dp = dp,
                          .offload_dir = s->reads & KNOB_CHUNK_OFFLOAD ? cfg->offload_dir : NULL,
                          .placement = cfg->placement, .layout = cfg->layout_given ? cfg->layout : s->default_layout,
                          .seq_len = seq_len, .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                          .wire_bf16 = bf16, .attn_bf16 = bf16};
    strategy_apply_knobs(s, &cfg->knobs, p);
    if (p->ring_inner <= 0) p->ring_inner = cp; /* the plain ring, as topology_create */
    strategy_defaults(s, p);
}

int strategy_candidates(const Strategy *s, int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out,
                        int max) {
    if (s->candidates) return s->candidates(hp, cp, fixed, out, max);
    if (max < 1) return 0;
    if (fixed->placement >= 0) { /* the placements that differ: head-first, and context-first on a 2D grid */
        if (fixed->placement != PLACEMENT_HEAD_FIRST && fixed->placement != PLACEMENT_CONTEXT_FIRST) return 0;
        out[0] = (StrategyCandidate){.placement = (Placement)fixed->placement};
        return 1;
    }
    out[0] = (StrategyCandidate){.placement = PLACEMENT_HEAD_FIRST};
    if (hp == 1 || cp == 1 || max < 2) return 1;
    out[1] = (StrategyCandidate){.placement = PLACEMENT_CONTEXT_FIRST};
    return 2;
}

void strategy_paper_memory(const Strategy *s, const PaperMemoryInput *in, PaperMemory *out) {
    memset(out, 0, sizeof *out);
    if (s->paper_memory) s->paper_memory(in, out);
}

char *strategy_sp1_check(const Strategy *s, const StrategyParams *p) {
    StrategyParams q = *p;
    q.layout = LAYOUT_CONTIGUOUS; /* splits any --seq-len over one rank */
    return strategy_check(s, &q);
}
