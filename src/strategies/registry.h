/* The strategy registry: one table of every distributed attention strategy seqpar has. A
 * strategy is the head exchange (hp ranks, head_exchange.h) composed with one context schedule
 * (cp ranks, context_schedule.h); the table holds, per schedule, its name, what it reads, its
 * constraints, a check that RETURNS a one-line message, its constructor and its communication
 * volume and memory formulas.
 *
 * Adding a strategy: write src/strategies/NAME.c defining `const ScheduleInfo NAME_schedule`
 * (declared below), add one line to the table in registry.c, and add its tests. */
#ifndef SEQPAR_REGISTRY_H
#define SEQPAR_REGISTRY_H

#include <stddef.h>

#include "strategies/context_schedule.h"

typedef struct {
    const char *name;        /* --strategy NAME */
    const char *summary;     /* one line: what it is, which paper */
    const char *flags;       /* the flags it reads, e.g. "--cp --team --layout" */
    const char *constraints; /* human-readable, e.g. "C^2 divides cp; zigzag or contiguous layout" */
    /* NULL when the context part of p can run; otherwise an xmalloc'd one-line message naming what
     * would work (the caller frees it with xfree). Reads p only: no communication. */
    char *(*check)(const StrategyParams *p);
    /* Collective over the context group. Only called after check() returned NULL. */
    ContextSchedule *(*create)(const ScheduleShape *sh);
    /* Bytes and messages per rank per layer of the CONTEXT part (the head exchange adds its own). */
    void (*volume)(const StrategyParams *p, AttnVolume *v);
    /* Peak floats of the schedule's own buffers per rank (workspaces beyond the slot's q, kv, o,
     * lse that the caller holds), for the memory formula. */
    size_t (*workspace_floats)(const StrategyParams *p);
} ScheduleInfo;

extern const ScheduleInfo double_ring_schedule; /* "2d"  (double_ring.c) */
extern const ScheduleInfo wallfacer_schedule;   /* "wallfacer" (wallfacer.c) */
extern const ScheduleInfo lightseq_schedule;    /* "lightseq" (lightseq.c) */
extern const ScheduleInfo allgather_schedule;   /* "allgather" (allgather.c) */

#endif
