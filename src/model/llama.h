/* The Hugging Face Llama model: parameters in one flat buffer described by a ParamTable with HF
 * names, activations for a rank's local tokens (their memory policy: model/layer_memory.h), and one
 * fused forward + backward over them.
 * Attention goes through a SeqAttention strategy, so the same model code runs on one process
 * or with the sequence split across ranks (every other op is token-local). */
#ifndef SEQPAR_LLAMA_H
#define SEQPAR_LLAMA_H

#include <stdint.h>

#include "attention/seq_attention.h"
#include "core/common.h"
#include "core/param_table.h"
#include "model/config.h"
#include "model/layer_memory.h"

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
    /* biases (cfg.qkv_bias: q, k, v; cfg.o_bias: o), NULL where the model has none */
    float *q_bias;     /* (H*d) */
    float *k_bias;     /* (Hkv*d) */
    float *v_bias;     /* (Hkv*d) */
    float *o_bias;     /* (D) */
    /* per-head RMSNorm weights of q and k (cfg.qk_norm: a Qwen3's q_norm, k_norm), NULL without */
    float *q_norm;     /* (d) */
    float *k_norm;     /* (d) */
} LlamaLayerWeights;

typedef struct {
    float *embed;      /* (V, D) */
    LlamaLayerWeights *layers;
    float *final_norm; /* (D) */
    float *lm_head;    /* (V, D); the embedding itself when tie_word_embeddings */
} LlamaWeights;

/* Per-layer hooks (ZeRO-2/3 use them: src/parallel/data_parallel.h). llama_forward_backward
 * calls fn, when the model has hooks, at these points of one micro-batch; layer is -1 for BEGIN
 * and END, backward tells whether a backward pass follows or ran. With --checkpoint the layer's
 * recomputation runs after BEFORE_BACKWARD. A hook may repoint m->w.layers[layer] /
 * m->g.layers[layer] and must leave them usable until the matching AFTER point. */
typedef enum {
    LLAMA_HOOK_BEGIN,              /* before the embedding */
    LLAMA_HOOK_AFTER_EMBEDDING,    /* after the embedding's forward: m->w.embed is not read again
                                      unless the head is tied to it */
    LLAMA_HOOK_BEFORE_FORWARD,     /* before layer l's forward */
    LLAMA_HOOK_AFTER_FORWARD,      /* after layer l's forward */
    LLAMA_HOOK_BEFORE_HEAD,        /* before the final norm, head and loss */
    LLAMA_HOOK_AFTER_HEAD,         /* after them (with backward: the final norm's and head's
                                      gradients are final) */
    LLAMA_HOOK_BEFORE_BACKWARD,    /* before layer l's backward (and its recomputation) */
    LLAMA_HOOK_AFTER_BACKWARD,     /* after layer l's backward: its gradients are final */
    LLAMA_HOOK_BEFORE_EMBEDDING_BACKWARD, /* before the embedding's backward (m->g.embed written) */
    LLAMA_HOOK_END                 /* after the embedding's backward (or the loss, forward only) */
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

/* Tensors per decoder layer in the parameter table (9, plus its biases and q/k norms). The
 * table's order: the embedding; per layer input norm, q [bias], k [bias], v [bias], o [bias],
 * [q norm, k norm], post norm, gate, up, down; the final norm; the head unless tied. */
int llama_layer_tensors(const LlamaConfig *cfg);
/* Points w's fields at layer l's tensors of table t inside `base`, which holds the flat buffer
 * from element `origin` on (base NULL: every field NULL). */
void llama_bind_layer(LlamaLayerWeights *w, float *base, size_t origin, const ParamTable *t, const LlamaConfig *cfg,
                      int l);

/* Allocates parameters and gradients (zeroed) for the configuration. */
void llama_build(LlamaModel *m, const LlamaConfig *cfg);
/* Hugging Face's initialisation: Linear and Embedding weights ~ N(0, 0.02), norm weights 1,
 * biases 0. */
void llama_init_random(LlamaModel *m, uint64_t seed);
/* The same values, written only at flat elements [lo, hi) (a ZeRO-3 rank's shard; the rest of
 * params is left untouched, so its pages need no memory). */
void llama_init_random_part(LlamaModel *m, uint64_t seed, size_t lo, size_t hi);
void llama_free(LlamaModel *m);

/* Parameters that do matrix multiplies (everything but the embedding lookup; the head counts
 * even when tied), for FLOP counting. */
double llama_matmul_params(const LlamaConfig *cfg);
/* The same for one decoder layer: q, k, v, o, gate, up, down. */
double llama_layer_matmul_params(const LlamaConfig *cfg);
/* Model FLOPs per token of one training step (forward + backward) as Megatron-LM and
 * LoongTrain count them: 6 x matmul parameters + 6 x layers x S x H x head_dim (the attention's
 * 12 L S H d with the causal half counted once), S the global sequence length; a layer with a
 * sliding window counts llama_window_length(S, window) in place of S. */
double llama_train_flops_per_token(const LlamaConfig *cfg, double seq_len);
/* The same with the attention lengths given: len_full for the layers without a window, len_window
 * for those with one (packed documents: pack_attention_length without and with the window). */
double llama_train_flops_lengths(const LlamaConfig *cfg, double len_full, double len_window);
/* The attention length of one causal sequence of S tokens under a sliding window W (0: none):
 * twice its visible (query, key) pairs per token, S where S <= W (the causal count's S^2 / 2
 * pairs), W (2 S - W) / S past it (the first W tokens' W^2 / 2, then W a token). */
double llama_window_length(double seq_len, int window);
/* The benchmarks' reference model (`seqpar bench step`, bench/): 4 layers, hidden 256, 4 heads of
 * 64 (2 KV heads), ffn 1024, vocabulary 256, untied, RoPE theta 1e4, eps 1e-5. */
LlamaConfig llama_reference_config(void);

/* Activations for N local tokens, laid out by the memory policy (model/layer_memory.h: checkpoint
 * modes, FFN chunks, chunk streaming, layer-input offload, bf16 copies; freed by llama_acts_free).
 * llama_acts_create(m, attn, N, checkpoint) is llama_acts_create_opts with the default FFN chunk
 * count. */
LlamaActs *llama_acts_create(const LlamaModel *m, const SeqAttention *attn, int N, int checkpoint);
LlamaActs *llama_acts_create_opts(const LlamaModel *m, const SeqAttention *attn, int N, const LlamaActsOptions *opt);

/* FLOPs per token a training step spends recomputing (beyond llama_train_flops_per_token), for
 * hardware-FLOPs utilisation (HFU) as InternEvo counts it: layer: the forward of the attention
 * half (q, k, v, o projections and attention) and gate/up; selective: the projections and
 * gate/up, no attention; none: gate/up when the MLP is chunked, and o_proj's forward where x_mid
 * is rebuilt (llama_rebuilds_x_mid). The flash-attention backward's own recomputation of the
 * scores is part of every mode and counted in none. */
double llama_recompute_flops_per_token(const LlamaConfig *cfg, double seq_len, const LlamaActs *a);
/* The same with the attention lengths given (llama_train_flops_lengths). */
double llama_recompute_flops_lengths(const LlamaConfig *cfg, double len_full, double len_window, const LlamaActs *a);
/* The same from the settings alone, split into the linear layers' part and attention's (per token;
 * store_gate_up: one FFN chunk under none; x_mid_again: llama_rebuilds_x_mid). For the planner. */
void llama_recompute_flops_parts(const LlamaConfig *cfg, double len_full, double len_window, int checkpoint,
                                 int store_gate_up, int x_mid_again, double *dense, double *attention);

/* One forward (and, if backward, backward) over N local tokens. inputs/targets/positions (N):
 * targets < 0 are ignored; positions are global. loss_scale multiplies each token's loss
 * gradient (pass 1 / global number of targets for the mean). Gradients ACCUMULATE into
 * m->grads. predictions (N) receives the argmax per token when non-NULL.
 * Returns the SUM of the local per-token losses. */
double llama_forward_backward(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                              const int *inputs, const int *targets, const int *positions, int N,
                              float loss_scale, int backward, int *predictions);

/* The same over packed documents (data/packing.h): docs (N) gives each token's document as the
 * global position of the document's first token, so a token attends only to earlier tokens of its
 * document and RoPE sees positions[i] - docs[i], its position inside the document (transformers'
 * position_ids of packed training). docs NULL is llama_forward_backward. */
double llama_forward_backward_docs(LlamaModel *m, LlamaActs *a, SeqAttention *attn,
                                   const int *inputs, const int *targets, const int *positions, const int *docs,
                                   int N, float loss_scale, int backward, int *predictions);

/* The forward of llama_forward_backward_docs alone (backward 0), returning the same sum bit for
 * bit, with each token's loss in token_loss (N; 0 where targets[i] < 0; the returned sum adds
 * them in blocks of rows, so summing them in another grouping may differ in the last bits) and,
 * when predictions is non-NULL, each token's argmax. For activations made forward only
 * (LlamaActsOptions.forward_only) or any others. */
double llama_forward_scores(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *targets,
                            const int *positions, const int *docs, int N, double *token_loss, int *predictions);

/* The forward of llama_forward_scores without targets or loss: the logits (n_rows, V) of local rows
 * rows[0..n_rows) (each row's final norm and the head: fp32, or under bf16 the head's products on
 * bf16 operands as train's, the logits fp32), e.g. a prompt's last token for
 * generation (train/dist_generate.h). */
void llama_forward_logits(LlamaModel *m, LlamaActs *a, SeqAttention *attn, const int *inputs, const int *positions,
                          int N, const int *rows, int n_rows, float *logits);

#endif
