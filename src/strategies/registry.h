/* The strategy registry: the one interface through which the rest of seqpar sees its distributed
 * attention strategies. A strategy is a plug-in: one file in src/strategies/ that defines one
 * `const Strategy NAME_strategy` (below) holding everything that is that strategy's (its name and
 * summary, its grid rule and layout, its flags and their refusals, its checks, its constructor, its
 * exact traffic and memory terms, the configurations it offers the planner and where its traffic
 * goes), and one line in registry.c's table. Nothing outside src/strategies/ names a strategy: the
 * planner, the memory model, the trainer and the CLI ask the descriptor's fields and functions.
 *
 * Most strategies are the head exchange (hp ranks, parallel/head_exchange.h) composed with one
 * context schedule (cp ranks, parallel/context_schedule.h: a ScheduleInfo); one that is not (it runs
 * the head exchange per chunk, say) provides its own SeqAttention instead (an OwnAttention) and
 * schedule = NULL. */
#ifndef SEQPAR_REGISTRY_H
#define SEQPAR_REGISTRY_H

#include <stddef.h>

#include "attention/seq_attention.h"
#include "memory/chunk_tier.h"
#include "parallel/context_schedule.h"
#include "parallel/parallel_config.h"

/* Memory of head member hp_rank in floats: the `saved` state per layer (head-parallel q, kv, o,
 * lse), its suffix that selective checkpointing keeps per layer (the lse: SeqAttention's
 * kept_floats) and the buffers held once (head exchange, schedule workspaces, backward scratch). */
typedef struct {
    size_t saved_per_layer, kept_per_layer, workspace;
    size_t bf16_per_layer; /* the prefix of `saved` that holds copies of q, k, v (SeqAttention's bf16_floats) */
    size_t rows_per_call;  /* the most query rows one kernel call gets (the kernel's transient buffers) */
    /* bytes on the disk tier (--offload-dir) of the strategy's own chunks: per layer whose state is
     * kept, and once (a buffer every layer's backward reuses) */
    double disk_per_layer, disk_workspace;
} AttnMemory;

/* A strategy that builds its own SeqAttention (no context schedule). */
typedef struct {
    /* NULL or a one-line message (xmalloc'd); the whole check (heads, S, the strategy's flags). */
    char *(*check)(const StrategyParams *p);
    /* Collective over the replica's sp group. Only called after check() returned NULL. */
    SeqAttention *(*create)(const StrategyParams *p, const Topology *t, Comm *comm);
    /* positions (S / (hp cp)) of member (hp_rank, cp_rank): the strategy's own token layout. */
    void (*positions)(const StrategyParams *p, int hp_rank, int cp_rank, int *positions);
    /* The run header's name of that layout ("rank-ordinal chunk (4 chunks)"). */
    void (*layout_name)(const StrategyParams *p, char *buf, size_t n);
    /* Bytes and messages member hp_rank sends per layer, all kinds, exact. */
    void (*volume)(const StrategyParams *p, int hp_rank, AttnVolume *v);
    void (*memory)(const StrategyParams *p, int hp_rank, AttnMemory *m);
    /* The slow tier's counters since creation and the batches (set_positions calls) seen. */
    void (*tier_stats)(const SeqAttention *sa, TierStats *s, long *batches);
    /* The attention work of the last forward and backward (block_attention.h's counters). */
    void (*work)(const SeqAttention *sa, AttnWork *w);
    /* Plays one layer's pass into out (step_schedule.h; created with p's hp x cp), every member. */
    void (*play)(const StrategyParams *p, SchedulePass pass, StepSchedule *out);
} OwnAttention;

/* How a strategy uses the sp = hp x cp grid. */
typedef enum {
    GRID_2D,           /* --hp and --cp as given (default 1 x 1) */
    GRID_HEADS_ONLY,   /* heads only: hp = sp (default: the ranks of a replica), cp = 1 */
    GRID_CONTEXT_ONLY, /* context only: hp = 1, cp = sp (default: the ranks of a replica) */
    GRID_CONTEXT,      /* cp defaults to the ranks of a replica / hp; hp as given (default 1) */
} GridRule;

/* The run-wide flags that only some strategies read, one bit each: a value of --placement, a use of
 * --offload-dir, --no-stream. A strategy says which it reads (`reads`); the one that `owns` a bit
 * words the refusal when a run of another strategy is given it (`refuse`). A strategy's own integer
 * flags are knobs (StrategyKnob) instead. */
enum {
    KNOB_TEAM_PLACEMENT = 1 << 3, /* --placement team-first | ring-first */
    KNOB_CHUNK_OFFLOAD = 1 << 4,  /* --offload-dir for the strategy's own chunks (without checkpointing) */
    KNOB_NO_STREAM = 1 << 5,      /* --no-stream: whole layers instead of the strategy's chunk streaming */
};

typedef struct Strategy Strategy;

/* Which value of a knob means the same as not giving it: none, 1, or the context group's size. */
typedef enum { KNOB_SAME_NONE, KNOB_SAME_ONE, KNOB_SAME_CP } KnobSame;

/* An integer flag of a strategy's own, --NAME METAVAR with a value from 1 to max, declared in its
 * descriptor (`knobs`). The registry gives each name a slot of KnobValues (two strategies declaring
 * the same name share the flag), and from the declarations every command with the parallel flags
 * parses it, --help lists it (the first declaration's text), a run of a strategy that does not
 * declare it is refused, and a run of one that does gets the value in StrategyParams at `param`. */
typedef struct {
    const char *name;    /* "team": the flag --team */
    const char *metavar; /* "C" */
    const char *help;    /* --help's text after the flag */
    int max;
    size_t param;        /* offsetof(StrategyParams, the int it sets) */
    KnobSame same;       /* the value that means the same as not giving it (left off printed commands) */
    const char *column;  /* its heading in seqpar plan's table */
    int recorded;        /* it changes the arithmetic (the order of sums): checkpoints record it as
                            STRATEGY_NAME and a resume under another value is refused */
    /* Optional: the refusal given to a run of `runner`, which does not declare it, given `value`
     * (one line, xmalloc'd); NULL: the registry's. */
    char *(*refuse)(const Strategy *runner, int value);
} StrategyKnob;

/* One setting of a strategy's knobs that the planner tries on an hp x cp grid. */
typedef struct {
    KnobValues knobs; /* 0: not set */
    Placement placement;
    int plain_ring; /* a ring over the whole context group, whose sliding-window steps thin out on the
                       contiguous layout: the planner tries that layout too */
} StrategyCandidate;

/* What the user fixed for the planner (knobs 0 and the placement -1: free) and whether the strategy
 * was named. */
typedef struct {
    KnobValues knobs;
    int placement;
    int strategy_given;
    long seq_len;
} StrategyFixed;

/* Where a rank's attention traffic of one step goes (the planner's node accounting): `to` one context
 * rank, `group` in equal shares over its whole context group, `peers` in equal shares over n context
 * ranks (the rank itself among them or not). */
typedef struct {
    void *ctx;
    void (*to)(void *ctx, int kind, int cp_peer, double bytes);
    void (*group)(void *ctx, int kind, double bytes);
    void (*peers)(void *ctx, int kind, const int *cp_peers, int n, double bytes);
} TrafficSink;

/* One rank's attention traffic of one step: the bytes of each kind (every layer and micro-batch,
 * recomputation included) and what they are made of. */
typedef struct {
    double bytes[COMM_KINDS];
    const AttnVolume *layer[2]; /* one layer's volume: without a sliding window, with one */
    double layers[2];           /* how many layers of each */
    double micro;               /* micro-batches in the step */
    int n_layers;               /* layers in all */
} RankTraffic;

/* The papers' memory formulas for a strategy's family, which `seqpar memory` prints beside its own
 * estimate (fp32 bytes of this rank), from the run's resolved parameters p (whatever strategy the run
 * has), the model's hidden size D and layers L: up to 4 lines of text, "  LABEL   VALUE MiB". */
typedef struct {
    const StrategyParams *p;
    double D, L;
} PaperMemoryInput;
typedef struct {
    int n;
    char line[4][160];
} PaperMemory;

struct Strategy {
    const char *name;              /* --strategy NAME */
    const char *title;             /* as its paper calls it, for messages: "FPDT" */
    const char *summary;           /* one line: what it is, which paper */
    const char *flags;             /* the flags it reads, e.g. "--cp --team --layout" */
    const char *constraints;       /* human-readable, e.g. "C^2 divides cp; zigzag or contiguous layout" */
    GridRule grid;
    TokenLayout default_layout;    /* when --layout is not given */
    const ScheduleInfo *schedule;  /* the context schedule composed with the head exchange, or NULL and */
    const OwnAttention *own;       /* its own SeqAttention (which runs even on one rank) */
    const StrategyKnob *knobs;     /* its own integer flags, ended by {NULL}; NULL: none */
    unsigned reads;                /* the KNOB_* bits it reads */
    unsigned owns;                 /* the KNOB_* bits whose refusal it words */
    int balanced;                  /* every context rank computes an equal share of the causal pairs */
    int streams;                   /* its attention has chunk calls under --chunks > 1 (seq_attention.h) */
    int restores_o;                /* selective checkpointing's restore() exchanges o as well as q, k, v,
                                      once per chunk each way */
    /* Optional. The refusal of bit k (KNOB_*), which it owns, given to a run of `runner`: a one-line
     * message (xmalloc'd). */
    char *(*refuse)(unsigned knob, const Strategy *runner, const ParallelConfig *cfg);
    /* Optional. Its own refusals of the run-wide settings (a placement of the other family): NULL or
     * a one-line message (xmalloc'd). */
    char *(*check_config)(const ParallelConfig *cfg);
    /* Optional. The knobs of p not given (0), filled with its defaults for p->cp. */
    void (*defaults)(StrategyParams *p);
    /* Optional. The run header's words for its knobs (", team 2"), where sp > 1. */
    void (*describe)(const StrategyParams *p, char *buf, size_t n);
    /* The knob settings it offers the planner on an hp x cp grid: out[0 .. return value), at most
     * max, in the order the planner tries them. NULL: one, no knobs, head-first. */
    int (*candidates)(int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out, int max);
    /* Optional. Where context rank cp_rank's traffic goes; NULL: each point-to-point and team kind
     * in equal shares over the context group. */
    void (*route)(const StrategyParams *p, int cp_rank, const RankTraffic *t, const TrafficSink *sink);
    /* Optional. Its paper's memory formulas. */
    void (*paper_memory)(const PaperMemoryInput *in, PaperMemory *out);
};

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

/* The knobs of p not given, filled with s's defaults for p->cp (its team size, say). */
void strategy_defaults(const Strategy *s, StrategyParams *p);
/* The run header's words for s's knobs (", team 2"; "" for none), where sp > 1. */
void strategy_describe(const Strategy *s, const StrategyParams *p, char *buf, size_t n);
/* The refusal of bit k (KNOB_*) given to a run of s, worded by the strategy that owns k: a one-line
 * message (xmalloc'd). */
char *strategy_knob_refusal(unsigned knob, const Strategy *s, const ParallelConfig *cfg);

/* The knobs of all registered strategies: slots 0 .. strategy_knob_count() - 1, each the first
 * declaration of its name in table order. */
int strategy_knob_count(void);
const StrategyKnob *strategy_knob(int slot);
/* The slot of knob `name` ("team"); -1 when no strategy declares it. */
int strategy_knob_slot(const char *name);
/* s's declaration of the knob in `slot`; NULL where s does not declare it. */
const StrategyKnob *strategy_knob_of(const Strategy *s, int slot);
/* The value of knob `name` in k (0 where no strategy declares it), and setting it (an internal
 * error where none does). */
int knob_get(const KnobValues *k, const char *name);
void knob_set(KnobValues *k, const char *name, int value);
/* Whether any knob has a value. */
int knobs_given(const KnobValues *k);
/* The knob's value in p (its `param`). */
int strategy_knob_param(const StrategyParams *p, const StrategyKnob *k);
/* Sets p's parameter of each knob s declares from `given` (0: not given, the strategy's default
 * later: strategy_defaults). */
void strategy_apply_knobs(const Strategy *s, const KnobValues *given, StrategyParams *p);
/* The knobs of pc (a configuration of strategy s on context group cp) as flags: " --ring-inner 4
 * --team 2", each value that differs from not giving it ("" for none); at most n bytes with the 0. */
void strategy_knob_flags(const Strategy *s, const ParallelConfig *pc, char *buf, size_t n);
/* The value s runs knob `slot` at in pc on context group cp (where not given: what its `same` says,
 * else 0), or -1 where s does not declare it: seqpar plan's table. */
int strategy_knob_shown(const Strategy *s, const ParallelConfig *pc, int slot);
/* The value knob k runs at in p: its parameter, or where not given what its `same` says (else 0). */
int strategy_knob_value(const StrategyKnob *k, const StrategyParams *p);
/* The key a checkpoint records knob k of s under ("fpdt_chunks"), at most n bytes with the 0. */
void strategy_knob_key(const Strategy *s, const StrategyKnob *k, char *buf, size_t n);
/* s's knob that sets its attention's sequence chunks (StrategyParams.chunks), NULL where none. */
const StrategyKnob *strategy_chunk_knob(const Strategy *s);
/* The calls a layer's attention makes, one per sequence chunk (seq_attention.h): the chunks of a
 * strategy that streams (`streams`) under a chunk count above 1, else 1. */
int strategy_attention_chunks(const Strategy *s, const StrategyParams *p);
/* Every registered strategy's own flags, for --help: lines "  --team C            help\n" (each
 * flag once, in table order), at most n bytes with the 0. */
void strategy_flags_help(char *buf, size_t n);
/* The strategy of a run that names none (--strategy's default): the table's first. */
const Strategy *strategy_default(void);
/* By name; NULL: the default. NULL when unknown. */
const Strategy *strategy_named(const char *name);
/* The parameters of a run of s configured by cfg on a dp x hp x cp grid (dp 0: not known), for a
 * model of n_heads query and n_kv_heads KV heads of head_dim at seq_len, bf16 or not (the wire and the
 * kernel's tiles): cfg's layout where given, else s's; cfg's placement; s's knobs from cfg (an inner
 * ring not given: cp, the plain ring); the knobs' defaults (strategy_defaults). */
void strategy_params_init(const Strategy *s, const ParallelConfig *cfg, int dp, int hp, int cp, long seq_len,
                          int n_heads, int n_kv_heads, int head_dim, int bf16, StrategyParams *p);
/* The planner's knob settings of s on an hp x cp grid (s->candidates, or its one default). */
int strategy_candidates(const Strategy *s, int hp, int cp, const StrategyFixed *fixed, StrategyCandidate *out, int max);
/* The papers' memory formulas for s (none: out->n = 0). */
void strategy_paper_memory(const Strategy *s, const PaperMemoryInput *in, PaperMemory *out);
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

/* The shortest sequence from min_len up to 2 min_len + 4096 that s runs on a dp x hp x cp grid
 * (strategy_check passes; one rank without a schedule of its own: min_len), p set for it
 * (strategy_params_init); -1 where none does (p then for the last length tried). How a prompt is
 * padded to what the strategy splits. */
long strategy_fit_length(const Strategy *s, const ParallelConfig *cfg, int dp, int hp, int cp, long min_len,
                         int n_heads, int n_kv_heads, int head_dim, int bf16, StrategyParams *p);

/* Bytes and messages rank (hp_rank, cp_rank) sends per layer: head exchange + context schedule. */
void strategy_volume(const Strategy *s, const StrategyParams *p, int hp_rank, int cp_rank, AttnVolume *v);

void strategy_memory(const Strategy *s, const StrategyParams *p, int hp_rank, AttnMemory *m);

/* The schedule s runs for one layer's forward or backward attention on p's hp x cp grid
 * (p->window: that layer's sliding window), every member's blocks and messages step by step
 * (step_schedule.h): the head exchange's steps around the context schedule's, or the strategy's own.
 * out is initialised here and finished; free it with schedule_free. Each member's bytes and
 * messages per kind equal strategy_volume's. */
void strategy_play(const Strategy *s, const StrategyParams *p, SchedulePass pass, StepSchedule *out);
/* strategy_play's schedule in parts, for a caller that needs each member's blocks step by step and
 * its messages but not how the lanes interleave (the planner's bounds): `exchange`, the head
 * exchange's steps (messages only) on the hp x cp grid, and each head member h's context schedule,
 * lanes[lane_of[h]] (hp 1, cp members: its member c is member c hp + h of the whole), each finished
 * (schedule_finish), the distinct ones once (n_lanes). For a strategy with its own play, exchange is
 * the whole schedule and n_lanes 0. Free with schedule_play_parts_free. */
typedef struct {
    StepSchedule exchange;
    StepSchedule *lanes;
    int n_lanes;
    int *lane_of;
} SchedulePlayParts;
void strategy_play_parts(const Strategy *s, const StrategyParams *p, SchedulePass pass, SchedulePlayParts *out);
void schedule_play_parts_free(SchedulePlayParts *x);
/* The attention work of sa's (created for s) last forward and backward: what strategy_play's blocks
 * count, for the tests. */
void strategy_attention_work(const Strategy *s, const SeqAttention *sa, AttnWork *w);

/* The run's flags as given (parallel_config.h) against strategy s. */
/* A flag `s` does not read, given anyway (another strategy's knob, a placement of the other family): a one-line message naming
 * it and its fix (the caller frees it), else NULL. Refused rather than echoed in the header and
 * ignored; seq_parallel_create and the memory model both ask. */
char *parallel_flags_check(const Strategy *s, const ParallelConfig *cfg);
/* A strategy's knob given where sp = 1 (one rank, or dp only), where the strategy's check is
 * skipped: its check on the one rank (a team of C needs C^2 to divide cp = 1), not the layout's
 * (nothing is split). A one-line message (the caller frees it), else NULL; seq_parallel_create and
 * the memory model both ask. */
char *strategy_sp1_check(const Strategy *s, const StrategyParams *p);

#endif
