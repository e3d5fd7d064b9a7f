/* A strategy's schedule of one layer's attention, as data: the steps its ranks run, each with the
 * attention blocks every rank computes and the messages every rank sends. Each strategy plays its
 * own schedule into a StepSchedule (registry.h: strategy_play) from the run's parameters alone, no
 * communicator and no data; the planner's step simulator replays it on a cluster model, and the
 * tests hold it to what the strategy really does (every rank's bytes and messages per kind equal to
 * its exact volume, its attention cells equal to the work counters of a real run).
 *
 * Members: the sp = hp x cp ranks of one sequence-parallel group, member m = cp_rank * hp + hp_rank.
 * Steps run in order. Within a step each member computes its blocks one after another while the
 * step's messages are in flight; a member ends a step when its blocks are done and the messages it
 * receives in that step have arrived. A message posted in a step may be given more steps to arrive
 * (`steps` > 1: the double ring's outer transfer overlaps a whole inner ring), then it is waited
 * for at the end of the step `steps` - 1 later. A message is posted at the step's start (an input
 * of a later step) or, marked `after`, when the sender's blocks of the step are done (a result). Collectives appear as the point-to-point messages
 * each member sends (an all-to-all or all-gather of P members: P - 1 messages a member), the way
 * their bytes are counted (comm.h).
 *
 * A compute block is the attention of q_rows query rows against kv_rows key rows with the heads the
 * member holds; `cells` is what block_attention's work counter records for it (rows x keys of every
 * (query run, key run) pair not hidden: causal, windowed), `calls` its kernel calls, `pairs` the
 * (query, key) pairs the mask lets through (the useful work: cells overcount a causal pair, whose
 * hidden tiles the kernel skips). Documents (packed sequences) are not known here: a schedule is
 * played for one document per sequence. */
#ifndef SEQPAR_STEP_SCHEDULE_H
#define SEQPAR_STEP_SCHEDULE_H

#include "parallel/block_attention.h"
#include "parallel/comm.h"
#include "parallel/head_exchange.h"
#include "parallel/layout.h"

typedef enum { PASS_FORWARD = 0, PASS_BACKWARD = 1 } SchedulePass;

typedef struct {
    int step;
    int member;
    int heads, kv_heads;          /* query and KV heads of the block (held by the member) */
    int q_rows, kv_rows;
    unsigned long long cells, calls;
    unsigned long long pairs;     /* (query, key) pairs the mask lets through, per head */
} StepCompute;

typedef struct {
    int step;
    CommKind kind;
    int from, to;                 /* members */
    unsigned long long bytes;
    int steps;                    /* 1: arrives within its step; k: by the end of step + k - 1 */
    int after;                    /* posted when the sender's blocks of the step are done (a partial
                                     result), not at the step's start */
} StepMessage;

typedef struct {
    const char *what;             /* "ring step", "head exchange: q, k, v" (a static string) */
    int compute0, n_compute;      /* its blocks: compute[compute0 ..), after schedule_finish */
    int message0, n_message;      /* its messages */
} ScheduleStep;

typedef struct {
    int hp, cp, members;
    SchedulePass pass;
    ScheduleStep *steps;
    StepCompute *compute;
    StepMessage *messages;
    int n_steps, n_compute, n_messages;
    int cap_steps, cap_compute, cap_messages;
    int cur;                      /* the step events go to (schedule_step; schedule_add_lane) */
} StepSchedule;

void schedule_init(StepSchedule *s, int hp, int cp, SchedulePass pass);
void schedule_free(StepSchedule *s);

/* Starts a new step; the events that follow belong to it. Returns its index. */
int schedule_step(StepSchedule *s, const char *what);
/* Member computes the attention of q's rows against kv's rows (window: the layer's sliding
 * window, 0 none). Blocks no pair of which is visible add nothing (the strategies skip them too). */
void schedule_compute(StepSchedule *s, int member, int heads, int kv_heads, const PosBlock *q, const PosBlock *kv,
                      int window);
void schedule_message(StepSchedule *s, CommKind kind, int from, int to, unsigned long long bytes, int steps);
/* The same, posted after the sender's blocks of the step (what a block produced: a partial output,
 * a gradient on its way). */
void schedule_result(StepSchedule *s, CommKind kind, int from, int to, unsigned long long bytes, int steps);

/* Every event of `lane` (a schedule of one head member's context group: members = context ranks
 * 0 .. cp-1, hp = 1) added to s as head member hp_rank's, step i of lane going to step first + i of
 * s (steps created as needed, named as lane's). */
void schedule_add_lane(StepSchedule *s, const StepSchedule *lane, int hp_rank, int first);

/* Every head member h's lane lanes[lane_of[h]] (each finished: schedule_finish) added to s at once,
 * as schedule_add_lane for h = 0 .. hp-1 and schedule_finish would leave them: step by step, each
 * step's events head member after head member, so that s stays in step order where it was. */
void schedule_add_lanes(StepSchedule *s, const StepSchedule *lanes, const int *lane_of, int first);

/* Orders the events by step (stable) and sets each step's ranges. Call once, after the play. */
void schedule_finish(StepSchedule *s);

/* What a member does over the whole schedule: bytes and messages it sends per kind, attention cells,
 * kernel calls and visible pairs; schedule_totals every member's (t: members), in one pass. */
typedef struct {
    unsigned long long bytes[COMM_KINDS], msgs[COMM_KINDS];
    unsigned long long cells, calls, pairs;
} MemberTotals;
void schedule_member_totals(const StepSchedule *s, int m, MemberTotals *t);
void schedule_totals(const StepSchedule *s, MemberTotals *t);

/* The positions of the cp context slots under a layout (layout.h), cut into runs: what a context
 * schedule's play computes its blocks from. */
typedef struct {
    int cp, n;
    int *pos;        /* (cp n) slot-major */
    PosRun *runs;    /* (cp n) */
    PosBlock *slot;  /* (cp) */
} SlotBlocks;
void slot_blocks_init(SlotBlocks *b, TokenLayout layout, long seq_len, int cp);
void slot_blocks_free(SlotBlocks *b);

/* The head exchange's messages inside every head group (hp members of each context rank), N local
 * rows per member, elem bytes an element on the wire, into the current step. */
typedef enum {
    HX_QKV,   /* q, k, v of the local rows -> head-parallel */
    HX_OUT,   /* o back to the local layout */
    HX_DOUT,  /* dout (and delta, fp32, where with_delta) -> head-parallel */
    HX_GRADS, /* dq, dk, dv back */
} HeadExchangeLeg;
void schedule_head_exchange(StepSchedule *s, const HeadSplit *hs, long N, int d, int elem_bytes, HeadExchangeLeg leg,
                            int with_delta);

#endif
