/* A context schedule: how the cp ranks of one context group compute exact causal attention of
 * their context slot's queries against the keys/values of every slot. Every distributed strategy
 * of seqpar is the head exchange (head_exchange.h: the SeqAlltoAll of the hp ranks of a head
 * group, identity when hp = 1) composed with one context schedule (identity when cp = 1); the
 * schedules themselves are the strategies' (src/strategies/, registry.h).
 *
 * A schedule sees only its context slot (n = S / cp rows, in head-parallel layout):
 *   q, o, dq, dout (n, heads, d);  kv = k | v packed: (2, n, kv_heads, d), k first;
 *   lse, delta (n, heads).
 * Positions of every slot are given once per batch (slot-major: rows of slot c are
 * all_pos[c n .. (c+1) n)), with document ids alike for packed sequences; the mask is by position
 * and document (key visible iff kpos <= qpos in the same document), so the layout
 * is whatever the loader chose. A schedule communicates only inside ctx_comm (or communicators it
 * derives from it at creation), and counts its bytes in the kinds of comm.h (ring P2P in
 * COMM_P2P_INNER / COMM_P2P_OUTER, team collectives in COMM_TEAM). q, k, v and dout travel on
 * ScheduleShape.wire (bf16 under --precision bf16: exact, they are bf16 values); partial outputs,
 * lse and gradients travel in fp32, and every accumulator is fp32. Compute goes through block_attention.h (one visibility iterator).
 *
 * Creation is collective over the context group; so is every forward and backward call. */
#ifndef SEQPAR_CONTEXT_SCHEDULE_H
#define SEQPAR_CONTEXT_SCHEDULE_H

#include <stddef.h>

#include "parallel/comm.h"
#include "parallel/topology.h"
#include "parallel/block_attention.h"
#include "parallel/layout.h"
#include "parallel/step_schedule.h"

/* Everything a schedule is created with. */
typedef struct {
    const Topology *topo; /* ctx_comm, cp, cp_rank, ring_inner, placement, ranks_per_node */
    Comm *comm;
    int n;                /* rows per context slot: S / cp */
    int heads;            /* query heads held after the head exchange */
    int kv_heads;         /* KV heads held after the head exchange (replicas included) */
    int head_dim;
    int team;             /* --team C (teams); 0 when not given */
    TokenLayout layout;
    CommWire wire;        /* how q, k, v and dout travel (--precision bf16: COMM_WIRE_BF16, exact since
                             they are bf16 values); partial outputs, lse and gradients stay fp32 */
} ScheduleShape;

typedef struct ContextSchedule ContextSchedule;
struct ContextSchedule {
    void *ctx;
    BlockAttn *blocks;    /* the schedule's block compute (work counters, piece rows, compute on/off) */
    /* Per batch, before the layers: the positions of every slot, (cp, n) slot-major, and their
     * document ids (same shape; NULL: one document). The schedule may keep the pointers until the
     * next call (the caller keeps the arrays alive). */
    void (*set_positions)(ContextSchedule *s, const int *all_pos, const int *all_doc);
    /* Writes o (n, heads, d) and lse (n, heads): the exact attention of the slot's queries. */
    void (*forward)(ContextSchedule *s, const float *q, const float *kv, float *o, float *lse);
    /* lse is the forward's final lse, delta = rowsum(dout * o) (n, heads): the backward needs no o.
     * OVERWRITES dq (n, heads, d) and dkv (2, n, kv_heads, d) with the gradients of this slot's q
     * and kv. */
    void (*backward)(ContextSchedule *s, const float *q, const float *kv, const float *lse, const float *delta,
                     const float *dout, float *dq, float *dkv);
    void (*destroy)(ContextSchedule *s);
};

void context_schedule_destroy(ContextSchedule *s);
/* A schedule's value: its functions as `ops` gives them (ctx and blocks of ops unused), around its
 * state ctx and block compute; xcalloc'd, freed by the schedule's destroy with xfree. */
ContextSchedule *context_schedule_new(const ContextSchedule *ops, void *ctx, BlockAttn *blocks);

/* What a schedule builds from its ScheduleShape the same way as every other: its block compute and
 * the position blocks of the cp context slots. A schedule's state holds one: schedule_core_init in
 * its create, schedule_core_set_positions as (or in) its set_positions, schedule_core_new for its
 * ContextSchedule value, schedule_core_free in its destroy. */
typedef struct {
    BlockAttn ba;    /* ContextSchedule.blocks */
    int P, n;        /* context slots (cp) and rows a slot */
    PosBlock *slot;  /* (P) the rows of slot c: all_pos[c n .. (c+1) n) of set_positions */
    PosRun *runs;    /* (P n) their runs */
} ScheduleCore;

void schedule_core_init(ScheduleCore *c, const ScheduleShape *sh);
/* Cuts every slot's positions (and document ids; NULL: one document) into c->slot (pos_block_init). */
void schedule_core_set_positions(ScheduleCore *c, const int *all_pos, const int *all_doc);
void schedule_core_free(ScheduleCore *c);
/* context_schedule_new around state ctx and c's block compute. */
ContextSchedule *schedule_core_new(const ContextSchedule *ops, void *ctx, ScheduleCore *c);

/* Bytes and messages one rank sends per layer, per kind (fp32), forward and backward. */
typedef struct {
    unsigned long long fwd[COMM_KINDS], bwd[COMM_KINDS];
    unsigned long long fwd_msgs[COMM_KINDS], bwd_msgs[COMM_KINDS];
    unsigned long long meta_batch; /* control bytes (positions) outside the kinds, once per batch;
                                    * packed documents send as many again (their ids) */
    /* The plain ring under a sliding window (double_ring.c): of bwd[COMM_P2P_INNER], the bytes of
     * the last dK/dV hop, which goes to the member ring_home_back places back in the inner ring
     * (the next one when the ring runs all its steps: ring_home_back W - 1); 0 where it does not
     * apply. */
    unsigned long long ring_home_bytes;
    int ring_home_back;
} AttnVolume;

/* Everything the registry's check / volume / memory functions need (no communicators): the grid,
 * the building blocks' parameters (the inner ring, the team, the sequence chunks: set from the
 * knobs a strategy declares, registry.h), the model's shape and precision. For a
 * ScheduleInfo's volume and workspace_floats, n_heads and n_kv_heads are the heads the schedule
 * holds on this rank (after the head exchange; the model's heads when hp = 1). */
typedef struct {
    int hp, cp;           /* head and context group sizes (sp = hp cp) */
    int dp;               /* data-parallel replicas of that group (0: not known; for messages only) */
    int ring_inner;       /* W: members of an inner ring of the double ring; 0 = cp */
    int team;             /* C: ranks of a team (teams of the context group); 0 = not given */
    int chunks;           /* U: sequence chunks of chunked attention; 0 = not given (1) */
    const char *offload_dir; /* a chunked strategy's disk tier directory (NULL: RAM) */
    Placement placement;  /* of the topology (teams: team-first or ring-first) */
    TokenLayout layout;
    long seq_len;         /* S, global */
    int n_heads, n_kv_heads, head_dim;
    int wire_bf16;        /* --precision bf16: the head exchange sends bf16 (2 bytes an element), and
                             the context schedules send q, k, v and dout in bf16 (ScheduleShape.wire) */
    int attn_bf16;        /* --precision bf16: the attention inputs are bf16 values, so the kernel runs its
                             bf16 tiles where the CPU has them (BlockAttn.precision). Set together with
                             wire_bf16 by the trainer; apart so that tests can vary the wire alone */
    int window;           /* the sliding window of the layer whose traffic volume() counts (0: none): the
                             plain ring runs only the steps some query's window reaches (double_ring.c) */
} StrategyParams;

/* A context schedule as a building block for strategies (strategies/registry.h): its constraints, a
 * check that RETURNS a one-line message, its constructor and its exact traffic and workspace. */
typedef struct {
    const char *name;        /* what the SeqAttention built on it is called (SeqAttention.name) */
    /* NULL when the context part of p can run; otherwise an xmalloc'd one-line message naming what
     * would work (the caller frees it with xfree). Reads p only: no communication. */
    char *(*check)(const StrategyParams *p);
    /* Collective over the context group. Only called after check() returned NULL. */
    ContextSchedule *(*create)(const ScheduleShape *sh);
    /* Bytes and messages context rank cp_rank sends per layer in the CONTEXT part (the head
     * exchange adds its own); exact, per rank (some schedules are not symmetric). */
    void (*volume)(const StrategyParams *p, int cp_rank, AttnVolume *v);
    /* Peak floats of the schedule's own buffers per rank (workspaces beyond the slot's q, kv, o,
     * lse that the caller holds), for the memory formula. */
    size_t (*workspace_floats)(const StrategyParams *p);
    /* Plays the CONTEXT part of one layer's pass into out (step_schedule.h; created with hp = 1, so
     * members are the context ranks), as every rank of the context group runs it, p's heads being
     * the ones the schedule holds (as for volume). p->window is the layer's sliding window. */
    void (*play)(const StrategyParams *p, SchedulePass pass, StepSchedule *out);
} ScheduleInfo;

#endif
