/* Context schedules: the shared destructor (see context_schedule.h). */
#include "parallel/context_schedule.h"

void context_schedule_destroy(ContextSchedule *s) {
    if (s && s->destroy) s->destroy(s);
}
