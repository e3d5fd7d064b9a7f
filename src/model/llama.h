/* The Hugging Face Llama model: parameters in one flat buffer described by a ParamTable with HF
 * names, activations for a rank's local tokens, and one fused forward + backward over them.
 * Attention goes through a SeqAttention strategy, so the same model code runs on one process
 * or with the sequence split across ranks (every other op is token-local). */
#ifndef SEQPAR_LLAMA_H
#define SEQPAR_LLAMA_H

#include <stdint.h>

#include "attention/seq_attention.h"
#include "core/param_table.h"
#include "model/config.h"

typedef struct {
    float *input_norm; /* (D) */
    float *q_proj;     /* (H*d, D) */
    float *k_proj;     /* (Hkv*d, D) */
    float *v_proj;     /* (Hkv*d, D) */
    float *o_proj;     /* (D, H*d) */
    float *post_norm;  /* (D) */
    float *gate_proj;  /* (F, D) */
    float *up_proj;    /* (F, D) */
    float *down_proj;  /* (D, F) */
} LlamaLayerWeights;

typedef struct {
    float *embed;      /* (V, D) */
    LlamaLayerWeights *layers;
    float *final_norm; /* (D) */
    float *lm_head;    /* (V, D); the embedding itself when tie_word_embeddings */
} LlamaWeights;

/* Per-layer hooks (ZeRO-2/3 use them: src/strategies/data_parallel.h). llama_forward_backward
 * calls fn, when the model has hooks, at these points of one micro-batch; layer is -1 for BEGIN
 * and END, backward tells whether a backward pass follows or ran. With --checkpoint the layer's
 * recomputation runs after BEFORE_BACKWARD. A hook may repoint m->w.layers[layer] /
 * m->g.layers[layer] and must leave them usable until the matching AFTER point. */
typedef enum {
    LLAMA_HOOK_BEGIN,           /* before the embedding */
    LLAMA_HOOK_BEFORE_FORWARD,  /* before layer l's forward */
    LLAMA_HOOK_AFTER_FORWARD,   /* after layer l's forward */
    LLAMA_HOOK_BEFORE_BACKWARD, /* before layer l's backward (and its recomputation) */
    LLAMA_HOOK_AFTER_BACKWARD,  /* after layer l's backward: its gradients are final */
    LLAMA_HOOK_END              /* after the embedding's backward (or the loss, forward only) */
} LlamaHookPoint;

struct LlamaModel;
typedef struct {
    void (*fn)(void *ctx, struct LlamaModel *m, LlamaHookPoint point, int layer, int backward);
    void *ctx;
} LlamaHooks;

typedef struct LlamaModel {
    LlamaConfig cfg;
    ParamTable table;  /* HF names and shapes; lm_head absent when tied */
    float *params;     /* (table.total) */
    float *grads;      /* (table.total), same layout */
    LlamaWeights w;    /* named pointers into params */
    LlamaWeights g;    /* named pointers into grads */
    const LlamaHooks *hooks; /* NULL: none (llama_build leaves it NULL) */
} LlamaModel;

/* Allocates parameters and gradients (zeroed) for the configuration. */
void llama_build(LlamaModel *m, const LlamaConfig *cfg);
/* Hugging Face's initialisation: Linear and Embedding weights ~ N(0, 0.02), norm weights 1. */
void llama_init_random(LlamaModel *m, uint64_t seed);
void llama_free(LlamaModel *m);

/* Parameters that do matrix multiplies (everything but the embedding lookup; the head counts
 * even when tied), for FLOP counting. */
double llama_matmul_params(const LlamaConfig *cfg);
/* Model FLOPs per token of one training step (forward + backward) as Megatron-LM and
 * LoongTrain count them: 6 x matmul parameters + 6 x layers x S x H x head_dim (the attention's
 * 12 L S H d with the causal half counted once). S is the global sequence length. */
double llama_train_flops_per_token(const LlamaConfig *cfg, long seq_len);

typedef struct LlamaActs LlamaActs;

/* Activations for N local tokens. checkpoint = 1 keeps only each layer's input and recomputes
 * the layer (attention included) in backward. */
LlamaActs *llama_acts_create(const LlamaModel *m, const SeqAttention *attn, int N, int checkpoint);
void llama_acts_free(LlamaActs *a);

/* One forward (and, if backward, backward) over N local tokens. inputs/targets/positions (N):
 * targets < 0 are ignored; positions are global. loss_scale multiplies each token's loss
 * gradient (pass 1 / global number of targets for the mean). Gradients ACCUMULATE into
 * m->grads. predictions (N) receives the argmax per token when non-NULL.
 * Returns the SUM of the local per-token losses. */
double llama_forward_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                              const int *inputs, const int *targets, const int *positions, int N,
                              float loss_scale, int backward, int *predictions);

#endif
