/* The Hugging Face Llama model: parameters in one flat buffer described by a ParamTable with HF
 * names, activations for a rank's local tokens, and one fused forward + backward over them.
 * Attention goes through a SeqAttention strategy, so the same model code runs on one process
 * or with the sequence split across ranks (every other op is token-local). */
#ifndef SEQPAR_LLAMA_H
#define SEQPAR_LLAMA_H

#include <stdint.h>

#include "attention/seq_attention.h"
#include "core/common.h"
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

typedef struct LlamaActs LlamaActs;

/* Activation checkpointing modes (--checkpoint none|layer|selective):
 *   none       every layer keeps its activations (fastest, most memory);
 *   layer      only each layer's input is kept (the residual stream); backward recomputes the
 *              attention half of the layer, attention's forward included;
 *   selective  Selective Checkpoint++ (paper 000) / rematerialization-aware checkpointing (paper 004): each
 *              layer also keeps its attention output o (N, H d) and the strategy's kept state
 *              (the lse: (N, H) locally, (n, Hl) head-parallel when distributed); backward
 *              recomputes norm -> q, k, v -> RoPE (-> the strategy's restore(): for distributed
 *              strategies the head exchange of q, k, v and o) and x_mid = x_in + o_proj(o), then
 *              runs attention's backward from the kept output and lse: attention's forward runs
 *              once. Extra memory over layer: L (S H d + S H) / sp floats per rank.
 * Under layer and selective the MLP is recomputed inside its backward from x_mid (gate and up,
 * chunk by chunk; down_proj's forward is never repeated). Gradients are bit-identical across
 * the three modes for the same FFN chunk count. */
enum { LLAMA_CKPT_NONE = 0, LLAMA_CKPT_LAYER = 1, LLAMA_CKPT_SELECTIVE = 2 };
/* "none", "layer", "selective" -> the mode; -1 for anything else. */
int llama_checkpoint_parse(const char *name);
const char *llama_checkpoint_name(int mode);

/* Chunked FFN (paper 003 §5.4): the MLP's forward and backward run over ffn_chunks chunks of
 * ceil(N / ffn_chunks) tokens, so its (N, F) gate / up / h never exist whole: scratch is 5 chunks
 * x F floats. With more than one chunk (or under layer / selective) gate and up are recomputed
 * per chunk in backward from the normed x_mid (2 x 2 D F FLOPs per token and layer, counted by
 * llama_recompute_flops_per_token); with one chunk under none they are kept per layer (2 N F
 * floats each). Default (llama_ffn_chunks_default): whole layers, at least 2 chunks of at most
 * LLAMA_FFN_ROWS_MAX tokens, so the scratch stops growing with N (at S = 32768 on the reference
 * model 80 instead of 320 MiB; a GEMM of 4096 rows runs at the rate of a larger one), and no more
 * rows than the attention half's gradients (dq, dk, dv, dout: 2 N (H + Hkv) d floats) leave room
 * for in the buffer the two share (3 chunk buffers of ldF floats a row; phases_alloc in llama.c):
 * there the MLP costs no memory of its own. But at least LLAMA_FFN_ROWS_MIN rows: the MLP's GEMMs
 * lose speed on fewer (2 layers of hidden 1024, F 4096 at S = 4096 on a Zen 4, 2 threads: a step
 * of 5.96 s in chunks of 2048 rows, 6.05 in 1366, 6.35 in 1024, 6.80 in 820, the rule's 850 when
 * the minimum was 512; 5.28 s whole, without the recompute), while the 3 chunk buffers' excess
 * over the attention's gradients is at most 3 x 2048 x ldF floats a rank (24 MiB at F = 1024,
 * 336 MiB at Llama-3-8B's 14336; at that shape's 4096 tokens +9% of the peak). A strategy's
 * streamed layers, 2u (chunk streaming below; there the MLP runs inside each attention chunk, so in at
 * least u chunks whatever K). */
#define LLAMA_FFN_CHUNKS_DEFAULT 2
#define LLAMA_FFN_ROWS_MAX 4096
#define LLAMA_FFN_ROWS_MIN 2048
/* The FFN chunk count a run of model c uses when --ffn-chunks is not given: N local tokens, whole
 * layers or streamed in su chunks. */
int llama_ffn_chunks_default(const LlamaConfig *c, long N, int stream, int su);
/* The FFN chunks --ffn-chunks K (> 0) makes of N local tokens (the one rule of llama_acts_create
 * and the memory model): whole layers (su 1, sc N) run chunks of ceil(N / K) rows; streamed layers
 * (su chunks of sc rows, N = su sc) run chunks of min(ceil(N / K), sc) rows inside each streamed
 * chunk, su x ceil(sc / rows) in all (a K there is rounded up to a multiple of su). Returns the
 * count; *rows (where not NULL) the rows of each chunk but the last. */
long llama_ffn_chunk_count(long N, long K, int su, long sc, long *rows);
/* The --ffn-chunks K that makes `want` FFN chunks under that rule: `want` itself where it does,
 * else the smallest K that does; 0 where none does (a resume's fix names it). */
long llama_ffn_chunks_flag(long N, long want, int su, long sc);
/* The benchmarks' reference model (`seqpar bench step`, bench/): 4 layers, hidden 256, 4 heads of
 * 64 (2 KV heads), ffn 1024, vocabulary 256, untied, RoPE theta 1e4, eps 1e-5. */
LlamaConfig llama_reference_config(void);
/* Layer-input offload (paper 003's "activation checkpoint with offloading"): with offload_dir set and
 * checkpoint layer or selective, the residual stream keeps two (N, D) working buffers in RAM
 * instead of L + 1; each layer's input goes to a file in offload_dir through the disk chunk tier
 * (strategies/chunk_tier.h: a helper thread, staging and read buffers of one chunk, two each) in
 * llama_input_chunks(N) chunks of rows before the layer's forward, and comes back before its
 * backward, the next layer's first chunks prefetched while the current one runs. Exact: the bytes
 * that come back are the bytes that went out. */
typedef struct {
    int checkpoint; /* LLAMA_CKPT_* */
    int ffn_chunks; /* <= 0: LLAMA_FFN_CHUNKS_DEFAULT; more than N: N */
    const char *offload_dir; /* NULL: layer inputs stay in RAM; ignored under none */
    int rank;                /* names the offload file (one per rank) */
    int precision;  /* PRECISION_FP32 (0, the default) or PRECISION_BF16 (kernels/bf16.h) */
    int no_stream;  /* 1: run whole layers even when the strategy streams (--no-stream) */
} LlamaActsOptions;
/* Chunk streaming (the pipeline of paper 003 §4): when the attention strategy has chunk calls
 * (seq_attention.h: a streaming strategy with --chunks u > 1) and the checkpoint mode is none or layer, each layer
 * runs chunk by chunk: per chunk of c = N / u local rows, norm -> q, k, v -> RoPE -> the
 * strategy's forward_chunk -> o_proj -> the MLP (in ffn chunks inside the chunk); backward in two
 * passes (the output gradient of every chunk, then the strategy's key/value-outer loop handing
 * back each chunk's final dq, dk, dv for the projections' and input norm's backward of its rows).
 * The final norm and loss run per chunk too. No (N, .) activation of a layer exists whole: the
 * layer's scratch is chunk-sized, and only dx (N, D), the layer inputs and the strategy's state
 * remain whole. x_mid is rebuilt in backward from o (one o_proj forward per layer and token more),
 * so no layer keeps x_mid or o; under layer checkpointing the recompute streams too (attention
 * half only). With layer inputs offloaded the residual stream is one (N, D) buffer: each chunk's
 * output rows overwrite its input rows. The default FFN chunk count is 2u. Selective
 * checkpointing keeps the whole-layer path (it keeps o whole by design). Gradients equal the
 * whole-layer path's within float rounding (weight gradients sum per chunk): docs/memory.md. */
int llama_streams(int stream_chunks, int checkpoint, int no_stream);
int llama_acts_streams(const LlamaActs *a);
/* Chunks of a layer input in the offload tier for N local tokens. */
int llama_input_chunks(long N);

/* bf16 mixed precision (--precision bf16): every matrix multiply (the layers' q, k, v, o, gate,
 * up, down projections and the LM head, forward and backward) takes bf16-rounded operands and
 * accumulates in fp32 (the head reads a bf16 copy of its weight made once per forward);
 * attention takes bf16 q, k, v (after RoPE) and a bf16 output gradient, with fp32 softmax
 * statistics and accumulation; each layer's kept attention tensors (q, k, v when the
 * model keeps them, and o; under none also the strategy's own copies of q, k, v in its saved
 * state, SeqAttention.bf16_floats: the head-parallel q_h, kv_h, a chunked strategy's RAM-tier chunks) are
 * stored as bf16, widened into one shared fp32 set before the layer's backward (the copies of
 * q, k, v bit for bit, as they are bf16 values already; o is rounded in place after attention
 * under every checkpoint mode, as o_proj takes it rounded anyway, and every strategy's attention
 * backward reads that o for its delta; a chunked strategy rounds its o_h chunks alike). Parameters, gradients,
 * the residual stream (layer inputs, x_mid), norms, RoPE tables, the strategies' lse, the
 * logits and the loss stay fp32 (the logits and the cross-entropy are where bf16 loses most;
 * a bf16 residual stream would change the forward's numbers); under none no
 * layer keeps its x_mid: backward makes it again from the layer input and o
 * (llama_rebuilds_x_mid), so a layer keeps its input in fp32 and the rest in bf16. */

/* Activations for N local tokens. llama_acts_create(m, attn, N, checkpoint) is
 * llama_acts_create_opts with the default FFN chunk count. */
LlamaActs *llama_acts_create(const LlamaModel *m, const SeqAttention *attn, int N, int checkpoint);
LlamaActs *llama_acts_create_opts(const LlamaModel *m, const SeqAttention *attn, int N, const LlamaActsOptions *opt);
void llama_acts_free(LlamaActs *a);
int llama_acts_checkpoint(const LlamaActs *a);
int llama_acts_ffn_chunks(const LlamaActs *a); /* effective */
/* Layer-input offload: whether it is on, its tier's counters since creation and the backward
 * passes that ran, and its I/O error: 0, or -1 with the one-line message in *e (check it at a
 * point every rank reaches, e.g. with die_if_any_rank, so that all stop together). */
int llama_acts_offloads_inputs(const LlamaActs *a);
void llama_acts_offload_stats(const LlamaActs *a, unsigned long long *bytes_written, unsigned long long *bytes_read,
                              double *wait_s, long *passes);
int llama_acts_io_error(const LlamaActs *a, SeqErr *e);
int llama_acts_precision(const LlamaActs *a);

/* Whether a layer's attention backward reads the layer's bf16 q, k, v as they are, never widened:
 * bf16 under none on whole layers, with a strategy that keeps no copies of q, k, v of its own
 * (SeqAttention.keeps_inputs) and has backward_bf16 (one process: local_attention). */
int llama_reads_qkv16(int checkpoint, int precision, int stream, int keeps_inputs, int has_backward_bf16);

/* Whether backward makes x_mid = x_in + o_proj(o) again instead of each layer keeping it (one
 * o_proj forward per layer and token more): under none with chunk streaming (per chunk, above) or
 * with bf16 on whole layers, where a layer keeps o as bf16 and x_mid was its largest fp32 tensor
 * but the input (one (N, D) buffer shared by the layers; rebuilt bit for bit). */
int llama_rebuilds_x_mid(int checkpoint, int precision, int stream);

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

#endif
