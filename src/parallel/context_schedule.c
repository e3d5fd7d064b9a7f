/* Context schedules: the shared constructor tail and destructor (see context_schedule.h). */
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
