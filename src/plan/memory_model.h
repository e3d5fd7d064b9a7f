/* The memory model: what one training step holds per rank, per tier (RAM, disk), predicted from
 * the flags alone (no MPI, no allocation). It mirrors what the code allocates: the parameter
 * table (llama.c), the gradient synchronisation and ZeRO buffers (data_parallel.c), AdamW's
 * moments, the activations of llama_acts_create_opts under each checkpoint mode and FFN chunk
 * count, the attention strategy's saved state and buffers (the registry's strategy_memory), the
 * chunk and layer-input disk tiers, the flash-attention kernel's transient per-thread buffers and
 * the trainer's token buffers; under --precision bf16 each at the size the code stores it (what
 * a layer keeps in bf16 and the shared fp32 set it widens into, the bf16 GEMMs' operand copies,
 * the bf16 attention kernel's pair words, the bf16 wire's staging). `seqpar memory` prints it;
 * tests/test_memory_model.sh compares it with the tracked-allocation peak `seqpar train`
 * measures, in fp32 and in bf16.
 *
 * It predicts the tracked allocations (xmalloc), not the process's RSS: the C runtime, MPI's
 * own buffers and the thread stacks are outside it (tens of MiB, docs/memory.md). */
#ifndef SEQPAR_MEMORY_MODEL_H
#define SEQPAR_MEMORY_MODEL_H

#include <stddef.h>
#include <stdio.h>

#include "model/config.h"
#include "parallel/parallel_config.h"
#include "parallel/data_parallel.h"
#include "strategies/registry.h"

typedef enum {
    MEM_PARAMS,      /* parameters (ZeRO-3: the shard, two gathered layers, the gathered embedding + head) */
    MEM_GRADS,       /* gradients (ZeRO-1: + the summed shard; ZeRO-2/3: two layer slots, embedding + tail, shard) */
    MEM_OPTIMIZER,   /* AdamW first and second moments of this rank's shard */
    MEM_SAVED,       /* activations kept from forward to backward: layer inputs and per-layer state */
    MEM_LAYER,       /* one layer's working set (shared buffers, scratch) and the kernel's transient peak */
    MEM_ATTN,        /* the strategy's buffers: head exchange, ring / gather buffers, backward scratch, tier staging */
    MEM_DATA,        /* token buffers of the trainer */
    MEM_COMPONENTS
} MemComponent;

const char *memory_component_name(MemComponent c);

typedef struct {
    LlamaConfig model;
    long seq_len;        /* global S */
    int batch;           /* sequences per step over all replicas */
    int world;           /* ranks */
    int cores;           /* cores of the node (threads per rank default: cores / ranks, at least 1) */
    int recall_data;     /* the trainer's recall task keeps a distance per token */
    double data_tokens;  /* token data (--data): the tokens of its largest training file, which the
                            trainer holds whole while it reads it (uint32 each); 0 for the recall task */
    ParallelConfig par;  /* --strategy, grid, --chunks, --offload-dir, --zero, --zero-group, --threads */
    int checkpoint;      /* LLAMA_CKPT_* */
    int ffn_chunks;      /* 0: the default */
    int no_stream;       /* --no-stream: a streaming strategy runs whole layers (llama.h) */
    int precision;       /* --precision: PRECISION_FP32 (0) or PRECISION_BF16 (kernels/bf16.h): what the
                            layers keep in bf16, the bf16 copies and kernel buffers, the bf16 wire */
} MemoryModelInput;

typedef struct {
    double ram[MEM_COMPONENTS], disk[MEM_COMPONENTS]; /* bytes, of the rank with the largest RAM total */
    double ram_total, disk_total;
    int rank;                /* that world rank */
    int dp, hp, cp, n_local, threads, ffn_chunks, zero, zero_group, layer_chunks;
    int streams;             /* layers run chunk by chunk (llama.h: chunk streaming) */
    const char *strategy;    /* strategy_run_name: the strategy's, or "data parallel only" / "single process" */
    /* The strategy's parameters as resolved for the run (grid, knobs and their defaults): what the
     * strategies' own formulas (the papers' memory terms, strategy_paper_memory) read. */
    StrategyParams params;
} MemoryEstimate;

/* Fills *out; NULL, or a one-line message (xmalloc'd) naming a flag that does not fit (the same
 * checks seq_parallel_create makes, without MPI). */
char *memory_model_estimate(const MemoryModelInput *in, MemoryEstimate *out);

/* The plan `seqpar memory` and `seqpar train --dry-run` print for the estimate of `in` (in->world
 * ranks): the model and run, RAM and disk by component of the largest rank, per token, streaming,
 * and every strategy's paper terms. */
void memory_estimate_print(FILE *out, const MemoryModelInput *in, const MemoryEstimate *m);

/* NULL when a global batch of `batch` sequences splits over dp replicas, else the one-line refusal
 * (train, the memory model and the planner give the same). */
char *batch_split_error(int batch, int dp);

/* Floats of the parameter units data_parallel.c shards: the embedding, one layer, the tail (final
 * norm and an untied head). */
void memory_model_unit_sizes(const LlamaConfig *c, double *embed, double *layer, double *tail);

/* Floats of the fp32 flash-attention kernel's transient buffers for one call of nq query and nk key
 * rows (per-thread tiles, the call's compact K and V copies; its backward's too, whichever is more):
 * what `seqpar memory` counts in a layer's working set, for plan/sample_memory.h. */
double memory_model_flash_floats(int threads, double nq, double nk, int kv_heads, int group, int d);

#endif
