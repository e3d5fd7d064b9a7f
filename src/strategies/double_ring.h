/* The double ring's parts that the strategies built on it share (2d in double_ring.c, ring.c and
 * ulysses.c, its two corners): the context schedule, the refusal of --ring-inner, the planner's ring
 * settings and the ring's traffic routes. For src/strategies/ only. */
#ifndef SEQPAR_DOUBLE_RING_H
#define SEQPAR_DOUBLE_RING_H

#include "strategies/registry.h"

extern const ScheduleInfo double_ring_schedule;
/* --ring-inner W: the knob of every strategy on the double ring that splits its context group */
extern const StrategyKnob double_ring_knobs[];
/* Inner ring sizes W dividing cp (the plain ring W = cp first among equals) x the placements. */
int double_ring_candidates(int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out, int max);
/* KV blocks and dK/dV to the next member of the inner ring (the last hop home), the outer ring's to
 * the same member of the next window. */
void double_ring_route(const StrategyParams *p, int cp_rank, const RankTraffic *t, const TrafficSink *sink);

#endif
