/* A strategy's schedule of one layer's attention as data: see step_schedule.h. */
#include "parallel/step_schedule.h"

#include <string.h>

#include "core/common.h"

void schedule_init(StepSchedule *s, int hp, int cp, SchedulePass pass) {
    memset(s, 0, sizeof *s);
    s->hp = hp;
    s->cp = cp;
    s->members = hp * cp;
    s->pass = pass;
    s->cur = -1;
}

void schedule_free(StepSchedule *s) {
    xfree(s->steps);
    xfree(s->compute);
    xfree(s->messages);
    memset(s, 0, sizeof *s);
}

/* Room for one more element of an array of `size`-byte elements holding n of *cap. */
static void *grow(void *a, int *cap, int n, size_t size) { return xgrow(a, cap, n, size, 16); }
/* a with room for `need` elements of `size` (its first n kept): reallocated at exactly that
 * capacity where it has less */
static void *reserve(void *a, int *cap, int need, int n, size_t size) {
    if (need <= *cap) return a;
    *cap = need;
    void *b = xmalloc(size * (size_t)(need ? need : 1));
    if (n) memcpy(b, a, size * (size_t)n);
    xfree(a);
    return b;
}

int schedule_step(StepSchedule *s, const char *what) {
    s->steps = grow(s->steps, &s->cap_steps, s->n_steps, sizeof *s->steps);
    s->steps[s->n_steps] = (ScheduleStep){.what = what};
    s->cur = s->n_steps;
    return s->n_steps++;
}

static void add_compute(StepSchedule *s, StepCompute c) {
    if (s->cur < 0) die("schedule_compute: no step begun");
    s->compute = grow(s->compute, &s->cap_compute, s->n_compute, sizeof *s->compute);
    c.step = s->cur;
    s->compute[s->n_compute++] = c;
}

static void add_message(StepSchedule *s, StepMessage m) {
    if (s->cur < 0) die("schedule_message: no step begun");
    s->messages = grow(s->messages, &s->cap_messages, s->n_messages, sizeof *s->messages);
    m.step = s->cur;
    s->messages[s->n_messages++] = m;
}

void schedule_compute(StepSchedule *s, int member, int heads, int kv_heads, const PosBlock *q, const PosBlock *kv,
                      int window) {
    StepCompute c = {.member = member, .heads = heads, .kv_heads = kv_heads, .q_rows = q->n, .kv_rows = kv->n};
    pos_blocks_work(q, kv, window, &c.cells, &c.calls, &c.pairs);
    if (c.calls) add_compute(s, c);
}

void schedule_message(StepSchedule *s, CommKind kind, int from, int to, unsigned long long bytes, int steps) {
    add_message(s, (StepMessage){.kind = kind, .from = from, .to = to, .bytes = bytes, .steps = steps > 1 ? steps : 1});
}

void schedule_result(StepSchedule *s, CommKind kind, int from, int to, unsigned long long bytes, int steps) {
    add_message(s, (StepMessage){.kind = kind, .from = from, .to = to, .bytes = bytes, .steps = steps > 1 ? steps : 1,
                                 .after = 1});
}

void slot_blocks_init(SlotBlocks *b, TokenLayout layout, long seq_len, int cp) {
    b->cp = cp;
    b->n = (int)(seq_len / cp);
    b->pos = xmalloc(sizeof(int) * (size_t)cp * (size_t)b->n);
    b->runs = xmalloc(sizeof(PosRun) * (size_t)cp * (size_t)b->n);
    b->slot = xcalloc((size_t)cp, sizeof *b->slot);
    int starts[2];
    const int pieces = layout_context_pieces(layout, (int)seq_len, cp, starts);
    for (int c = 0; c < cp; c++) {
        int *pos = b->pos + (size_t)c * b->n;
        layout_context_positions(layout, (int)seq_len, cp, c, pos);
        if (pieces) pos_block_init_pieces(&b->slot[c], pos, b->n, b->runs + (size_t)c * b->n, starts, pieces);
        else pos_block_init(&b->slot[c], pos, NULL, b->n, b->runs + (size_t)c * b->n);
    }
}

void slot_blocks_free(SlotBlocks *b) {
    xfree(b->pos);
    xfree(b->runs);
    xfree(b->slot);
    b->pos = NULL;
    b->runs = NULL;
    b->slot = NULL;
}

void schedule_add_lane(StepSchedule *s, const StepSchedule *lane, int hp_rank, int first) {
    for (int i = 0; i < lane->n_steps; i++)
        if (first + i >= s->n_steps) schedule_step(s, lane->steps[i].what);
    for (int i = 0; i < lane->n_compute; i++) {
        StepCompute c = lane->compute[i];
        c.member = c.member * s->hp + hp_rank;
        s->cur = first + c.step;
        add_compute(s, c);
    }
    for (int i = 0; i < lane->n_messages; i++) {
        StepMessage m = lane->messages[i];
        m.from = m.from * s->hp + hp_rank;
        m.to = m.to * s->hp + hp_rank;
        s->cur = first + m.step;
        add_message(s, m);
    }
    s->cur = s->n_steps - 1;
}

void schedule_add_lanes(StepSchedule *s, const StepSchedule *lanes, const int *lane_of, int first) {
    const int hp = s->hp;
    int steps = 0, n_compute = 0, n_messages = 0;
    for (int h = 0; h < hp; h++) {
        const StepSchedule *l = &lanes[lane_of[h]];
        steps = l->n_steps > steps ? l->n_steps : steps;
        n_compute += l->n_compute;
        n_messages += l->n_messages;
    }
    /* the steps, named as the first lane that has each (schedule_add_lane's, lane after lane) */
    for (int i = 0; i < steps; i++) {
        if (first + i < s->n_steps) continue;
        int h = 0;
        while (lanes[lane_of[h]].n_steps <= i) h++;
        schedule_step(s, lanes[lane_of[h]].steps[i].what);
    }
    /* room for every event at once, then step by step each head member's in order */
    s->compute = reserve(s->compute, &s->cap_compute, s->n_compute + n_compute, s->n_compute, sizeof *s->compute);
    s->messages = reserve(s->messages, &s->cap_messages, s->n_messages + n_messages, s->n_messages, sizeof *s->messages);
    for (int i = 0; i < steps; i++)
        for (int h = 0; h < hp; h++) {
            const StepSchedule *l = &lanes[lane_of[h]];
            if (i >= l->n_steps) continue;
            const ScheduleStep *st = &l->steps[i];
            for (int j = st->compute0; j < st->compute0 + st->n_compute; j++) {
                StepCompute c = l->compute[j];
                c.member = c.member * hp + h;
                c.step = first + i;
                s->compute[s->n_compute++] = c;
            }
            for (int j = st->message0; j < st->message0 + st->n_message; j++) {
                StepMessage m = l->messages[j];
                m.from = m.from * hp + h;
                m.to = m.to * hp + h;
                m.step = first + i;
                s->messages[s->n_messages++] = m;
            }
        }
    s->cur = s->n_steps - 1;
}

/* Stable counting sort of n elements of `size` bytes by their step (the int at offset 0); nothing
 * moves where they are in order already (the strategies emit step after step). */
static void sort_by_step(void *a, int n, size_t size, int n_steps, int *first, int *count) {
    for (int i = 0; i < n_steps; i++) count[i] = 0;
    char *base = a;
    int sorted = 1;
    for (int i = 0, last = 0; i < n; i++) {
        const int st = *(const int *)(base + (size_t)i * size);
        count[st]++;
        sorted &= st >= last;
        last = st;
    }
    for (int i = 0, at = 0; i < n_steps; i++) {
        first[i] = at;
        at += count[i];
    }
    if (sorted) return;
    char *out = xmalloc(size * (size_t)(n ? n : 1));
    int *fill = xmalloc(sizeof(int) * (size_t)(n_steps ? n_steps : 1));
    for (int i = 0; i < n_steps; i++) fill[i] = first[i];
    for (int i = 0; i < n; i++) {
        const int st = *(const int *)(base + (size_t)i * size);
        memcpy(out + (size_t)fill[st]++ * size, base + (size_t)i * size, size);
    }
    if (n) memcpy(base, out, size * (size_t)n);
    xfree(out);
    xfree(fill);
}

void schedule_finish(StepSchedule *s) {
    const int k = s->n_steps ? s->n_steps : 1;
    int *first = xmalloc(sizeof(int) * (size_t)k), *count = xmalloc(sizeof(int) * (size_t)k);
    sort_by_step(s->compute, s->n_compute, sizeof *s->compute, s->n_steps, first, count);
    for (int i = 0; i < s->n_steps; i++) {
        s->steps[i].compute0 = first[i];
        s->steps[i].n_compute = count[i];
    }
    sort_by_step(s->messages, s->n_messages, sizeof *s->messages, s->n_steps, first, count);
    for (int i = 0; i < s->n_steps; i++) {
        s->steps[i].message0 = first[i];
        s->steps[i].n_message = count[i];
    }
    xfree(first);
    xfree(count);
}

void schedule_totals(const StepSchedule *s, MemberTotals *t) {
    memset(t, 0, sizeof *t * (size_t)s->members);
    for (int i = 0; i < s->n_messages; i++) {
        const StepMessage *x = &s->messages[i];
        t[x->from].bytes[x->kind] += x->bytes;
        t[x->from].msgs[x->kind]++;
    }
    for (int i = 0; i < s->n_compute; i++) {
        t[s->compute[i].member].cells += s->compute[i].cells;
        t[s->compute[i].member].calls += s->compute[i].calls;
        t[s->compute[i].member].pairs += s->compute[i].pairs;
    }
}

void schedule_member_totals(const StepSchedule *s, int m, MemberTotals *t) {
    MemberTotals *all = xmalloc(sizeof *all * (size_t)s->members);
    schedule_totals(s, all);
    *t = all[m];
    xfree(all);
}

void schedule_head_exchange(StepSchedule *s, const HeadSplit *hs, long N, int d, int elem_bytes, HeadExchangeLeg leg,
                            int with_delta) {
    const int hp = hs->hp;
    if (hp <= 1) return;
    const unsigned long long Nd = (unsigned long long)elem_bytes * (unsigned long long)N * (unsigned)d;
    for (int c = 0; c < s->cp; c++)
        for (int me = 0; me < hp; me++)
            for (int m = 0; m < hp; m++) {
                if (m == me) continue;
                unsigned long long b = 0;
                switch (leg) {
                case HX_QKV: b = Nd * (unsigned)(hs->hl[m] + 2 * hs->hk[m]); break;   /* m's heads of my rows */
                case HX_OUT: b = Nd * (unsigned)hs->hl[me]; break;                     /* my heads of m's rows */
                case HX_DOUT:
                    b = Nd * (unsigned)hs->hl[m];
                    if (with_delta) b += 4ULL * (unsigned long long)N * (unsigned)hs->hl[m];
                    break;
                case HX_GRADS: b = Nd * (unsigned)(hs->hl[me] + 2 * hs->hk[me]); break; /* dq, dk, dv of m's rows */
                }
                schedule_message(s, COMM_ALLTOALL, c * hp + me, c * hp + m, b, 1);
            }
}
