/* The parallel settings of one run as the user gave them (flags of train, grad, bench, memory and
 * plan): the strategy's name and its knobs' values, the dp x hp x cp grid, placement, layout, ZeRO, threads,
 * tracing and the watchdog. A plain value: the registry (strategies/registry.h) checks it against
 * the chosen strategy, the runtime (train/seq_parallel.h) builds from it, the memory model and the
 * planner read it. */
#ifndef SEQPAR_PARALLEL_CONFIG_H
#define SEQPAR_PARALLEL_CONFIG_H

#include "parallel/layout.h"
#include "parallel/topology.h"

/* The values given for the strategies' own integer flags (--team C, --chunks U, ...), one slot per
 * flag: the strategies declare the flags (strategies/registry.h, StrategyKnob) and the registry
 * numbers them; 0 = not given. */
#define KNOB_SLOTS 8
typedef struct {
    int v[KNOB_SLOTS];
} KnobValues;

typedef struct {
    const char *strategy; /* registry name; NULL: the registry's default */
    KnobValues knobs;    /* its flags' values as given */
    const char *offload_dir; /* --offload-dir DIR: idle chunks and layer inputs on disk; NULL = RAM */
    const char *offload_optimizer; /* train's --offload-optimizer DIR: the AdamW moments on disk; NULL = RAM */
    int offload_master;  /* train's --offload-master: ZeRO-3's parameter shard in that file too */
    int dp, hp, cp;      /* 0 = not given: the strategy's grid rule decides (registry.h) */
    int ranks_per_node;  /* 0 = from MPI_COMM_TYPE_SHARED */
    int zero;            /* ZeRO stage 0 to 3 (data_parallel.h) */
    int zero_group;      /* ranks per sharding group; 0 = the world */
    int threads;         /* 0 = the default: see threads_for_cpus */
    Placement placement;
    int placement_given; /* --placement was given (head-first is also the default, which a strategy with teams reads as team-first) */
    TokenLayout layout;
    int layout_given;    /* 0: the strategy's default layout */
    const char *trace_path; /* NULL: no trace */
    int stats;           /* print per-rank communication statistics at the end */
    double comm_timeout; /* watchdog deadline of one wait, seconds (0: none); see comm.h */
    int wire_bf16;       /* --precision bf16: bf16 on the wire and the kernel's bf16 tiles (StrategyParams
                            wire_bf16 and attn_bf16) */
} ParallelConfig;

void parallel_config_default(ParallelConfig *c);

#endif
