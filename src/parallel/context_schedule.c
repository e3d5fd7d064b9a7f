/* Context schedules: the shared constructor tail, destructor and core state (see context_schedule.h). */
#include "parallel/context_schedule.h"

#include "core/common.h"

void context_schedule_destroy(ContextSchedule *s) {
    if (s && s->destroy) s->destroy(s);
}

ContextSchedule *context_schedule_new(const ContextSchedule *ops, void *ctx, BlockAttn *blocks) {
    ContextSchedule *s = xcalloc(1, sizeof *s);
    *s = *ops;
    s->ctx = ctx;
    s->blocks = blocks;
    return s;
}

void schedule_core_init(ScheduleCore *c, const ScheduleShape *sh) {
    block_attn_init(&c->ba, sh->comm, sh->heads, sh->kv_heads, sh->head_dim);
    c->P = sh->topo->cp;
    c->n = sh->n;
    c->slot = xcalloc((size_t)c->P, sizeof(PosBlock));
    c->runs = xmalloc(sizeof(PosRun) * (size_t)c->P * (size_t)c->n);
}

void schedule_core_set_positions(ScheduleCore *c, const int *all_pos, const int *all_doc) {
    for (int s = 0; s < c->P; s++)
        pos_block_init(&c->slot[s], all_pos + (size_t)s * c->n, all_doc ? all_doc + (size_t)s * c->n : NULL, c->n,
                       c->runs + (size_t)s * c->n);
}

void schedule_core_free(ScheduleCore *c) {
    xfree(c->slot);
    xfree(c->runs);
    c->slot = NULL;
    c->runs = NULL;
}

ContextSchedule *schedule_core_new(const ContextSchedule *ops, void *ctx, ScheduleCore *c) {
    return context_schedule_new(ops, ctx, &c->ba);
}
