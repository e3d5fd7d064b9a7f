/* The strategy registry: one table of every distributed attention strategy seqpar has. A
 * strategy is the head exchange (hp ranks, head_exchange.h) composed with one context schedule
 * (cp ranks, context_schedule.h); the table holds, per schedule, its name, what it reads, its
 * constraints, a check that RETURNS a one-line message, its constructor and its communication
 * volume and memory formulas.
 *
 * Adding a strategy: write src/strategies/NAME.c defining `const ScheduleInfo NAME_schedule`
 * (declared below), add one line to the table in registry.c, and add its tests.
 *
 * A strategy that is not "head exchange, then one schedule" (FPDT runs the head exchange per
 * chunk) provides its own SeqAttention instead: an OwnAttention (constructor, check, token
 * layout, volume and memory formulas) and schedule = NULL. */
#ifndef SEQPAR_REGISTRY_H
#define SEQPAR_REGISTRY_H

#include <stddef.h>

#include "attention/seq_attention.h"
#include "strategies/chunk_tier.h"
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
    /* Bytes and messages context rank cp_rank sends per layer in the CONTEXT part (the head
     * exchange adds its own); exact, per rank (schedules such as LightSeq are not symmetric). */
    void (*volume)(const StrategyParams *p, int cp_rank, AttnVolume *v);
    /* Peak floats of the schedule's own buffers per rank (workspaces beyond the slot's q, kv, o,
     * lse that the caller holds), for the memory formula. */
    size_t (*workspace_floats)(const StrategyParams *p);
} ScheduleInfo;

extern const ScheduleInfo double_ring_schedule; /* "2d"  (double_ring.c) */
extern const ScheduleInfo wallfacer_schedule;   /* "wallfacer" (wallfacer.c) */
extern const ScheduleInfo lightseq_schedule;    /* "lightseq" (lightseq.c) */
extern const ScheduleInfo allgather_schedule;   /* "allgather" (allgather.c) */

/* Memory of head member hp_rank in floats: the `saved` state per layer (head-parallel q, kv, o,
 * lse), its suffix that selective checkpointing keeps per layer (the lse: SeqAttention's
 * kept_floats) and the buffers held once (head exchange, schedule workspaces, backward scratch). */
typedef struct {
    size_t saved_per_layer, kept_per_layer, workspace;
    size_t bf16_per_layer; /* the prefix of `saved` that holds copies of q, k, v (SeqAttention's bf16_floats) */
} AttnMemory;

/* A strategy that builds its own SeqAttention (no context schedule). */
typedef struct {
    /* NULL or a one-line message (xmalloc'd); the whole check (heads, S, the strategy's flags). */
    char *(*check)(const StrategyParams *p);
    /* Collective over the replica's sp group. Only called after check() returned NULL. */
    SeqAttention *(*create)(const StrategyParams *p, const Topology *t, Comm *comm);
    /* positions (S / (hp cp)) of member (hp_rank, cp_rank): the strategy's own token layout. */
    void (*positions)(const StrategyParams *p, int hp_rank, int cp_rank, int *positions);
    /* Bytes and messages member hp_rank sends per layer, all kinds, exact. */
    void (*volume)(const StrategyParams *p, int hp_rank, AttnVolume *v);
    void (*memory)(const StrategyParams *p, int hp_rank, AttnMemory *m);
    /* The benchmark's knobs (dist_attention.h), optional. */
    void (*set_piece_rows)(SeqAttention *sa, int rows);
    void (*set_compute)(SeqAttention *sa, int enabled);
    /* The slow tier's counters since creation and the batches (set_positions calls) seen. */
    void (*tier_stats)(const SeqAttention *sa, TierStats *s, long *batches);
} OwnAttention;

extern const OwnAttention fpdt_attention; /* "fpdt" (fpdt.c) */

/* How a strategy uses the sp = hp x cp grid. */
typedef enum {
    GRID_2D,           /* --hp and --cp as given (default 1 x 1) */
    GRID_HEADS_ONLY,   /* Ulysses: hp = sp (default: the ranks of a replica), cp = 1 */
    GRID_CONTEXT_ONLY, /* Ring: hp = 1, cp = sp (default: the ranks of a replica) */
    GRID_CONTEXT,      /* cp defaults to the ranks of a replica / hp; hp as given (default 1) */
} GridRule;

typedef struct {
    const char *name;              /* --strategy NAME */
    const ScheduleInfo *schedule;  /* the context schedule it runs (NULL: own != NULL) */
    GridRule grid;
    TokenLayout default_layout;    /* when --layout is not given */
    const char *summary;           /* NULL: the schedule's */
    const char *flags;             /* NULL: the schedule's */
    const char *constraints;       /* NULL: the schedule's */
    const OwnAttention *own;       /* its own SeqAttention instead of a schedule; else NULL */
} Strategy;

/* The registered strategies: the i-th, NULL past the end. */
const Strategy *strategy_at(int i);
/* NULL when unknown. */
const Strategy *strategy_find(const char *name);
/* "unknown strategy 'x': use one of 2d, ulysses, ring, ..." (xmalloc'd). */
char *strategy_unknown_message(const char *name);

/* The strategy's constructor (dist_attention_create for schedules; own->create otherwise). */
SeqAttention *strategy_create_attention(const Strategy *s, const StrategyParams *p, const Topology *t, Comm *comm);
/* positions (S / (hp cp)) of member (hp_rank, cp_rank) under p->layout or the strategy's own. */
void strategy_positions(const Strategy *s, const StrategyParams *p, int hp_rank, int cp_rank, int *positions);

/* Resolves --hp/--cp for the strategy: given values (0 = not given) and the ranks of one
 * replica (sp_ranks = world / dp, or 0 when dp is not given either: then the world).
 * Returns NULL or a one-line message (xmalloc'd), e.g. "--strategy ulysses runs on heads only:
 * drop --cp 2". n_heads > 0: the model's query heads, so that a head-parallel grid this function
 * chose itself (every rank of the replica) and the heads cannot fill is refused in terms of the
 * flags the user gave (a --hp the user gave is checked with the heads by strategy_check). */
char *strategy_grid(const Strategy *s, int hp_given, int cp_given, int sp_ranks, int n_heads, int *hp, int *cp);

/* The team size when --team is not given: wallfacer's largest C with C^2 dividing cp; 0 for the
 * strategies without teams. */
int strategy_default_team(const Strategy *s, int cp);
/* What a run of s on a dp x sp grid is called in headers: the strategy's name, or where it has no
 * attention to split (sp = 1 and no attention of its own) "data parallel only" (dp > 1) or
 * "single process". */
const char *strategy_run_name(const Strategy *s, int sp, int dp);

/* The heads split over hp (also unevenly: head_exchange.h) and a positive head_dim: NULL or a
 * one-line message (xmalloc'd). Part of strategy_check; for strategies with their own check. */
char *strategy_check_heads(const StrategyParams *p);

/* Everything the strategy needs to run p: the heads split over hp (also unevenly), S splitting
 * under the layout, and the schedule's own check. NULL or a one-line message (xmalloc'd). */
char *strategy_check(const Strategy *s, const StrategyParams *p);

/* Bytes and messages rank (hp_rank, cp_rank) sends per layer: head exchange + context schedule. */
void strategy_volume(const Strategy *s, const StrategyParams *p, int hp_rank, int cp_rank, AttnVolume *v);

void strategy_memory(const Strategy *s, const StrategyParams *p, int hp_rank, AttnMemory *m);

#endif
