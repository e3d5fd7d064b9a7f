/* The decoder layers' memory policy: which activations a layer keeps, recomputes, streams, offloads
 * or rebuilds, where they live, and the points where llama.c's forward and backward ask for them.
 * llama.c holds the math and calls these points; this module holds no arithmetic of the model but
 * exact copies (bf16 packing and widening of values that are bf16 already, the offload tier). The
 * settings (checkpoint modes, FFN chunks, streaming, offload, bf16) are public through llama.h,
 * which includes this header; the LlamaActs layout below is for llama.c. */
#ifndef SEQPAR_LAYER_MEMORY_H
#define SEQPAR_LAYER_MEMORY_H

#include <stddef.h>

#include "attention/seq_attention.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "memory/chunk_tier.h"
#include "model/config.h"

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
 * for in the buffer the two share (3 chunk buffers of ldF floats a row; phases_alloc in
 * layer_memory.c): there the MLP costs no memory of its own. But at least LLAMA_FFN_ROWS_MIN rows:
 * the MLP's GEMMs lose speed on fewer (2 layers of hidden 1024, F 4096 at S = 4096 on a Zen 4, 2
 * threads: a step of 5.96 s in chunks of 2048 rows, 6.05 in 1366, 6.35 in 1024, 6.80 in 820, the
 * rule's 850 when the minimum was 512; 5.28 s whole, without the recompute), while the 3 chunk
 * buffers' excess over the attention's gradients is at most 3 x 2048 x ldF floats a rank (24 MiB
 * at F = 1024, 336 MiB at Llama-3-8B's 14336; at that shape's 4096 tokens +9% of the peak). A
 * strategy's streamed layers, 2u (chunk streaming below; there the MLP runs inside each attention
 * chunk, so in at least u chunks whatever K). */
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
/* Layer-input offload (paper 003's "activation checkpoint with offloading"): with offload_dir set and
 * checkpoint layer or selective, the residual stream keeps two (N, D) working buffers in RAM
 * instead of L + 1; each layer's input goes to a file in offload_dir through the disk chunk tier
 * (memory/chunk_tier.h: a helper thread, staging and read buffers of one chunk, two each) in
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

/* ---------------------------------------------------------------- the layout llama.c reads */

/* One layer's activations as llama.c's math sees them: the tensors of one attention chunk (on
 * whole layers the one chunk is the layer's N rows; streamed, c rows, and every pointer but saved
 * is chunk scratch shared by the layers). Which of them are the layer's own, shared, bf16-backed
 * or chunk-sized is the policy's choice (layer_memory_create). */
typedef struct {
    float *rstd1;     /* (rows) */
    float *q, *k, *v; /* (rows, H*d), (rows, Hkv*d), (rows, Hkv*d), after RoPE; shared scratch (not kept)
                         when the strategy keeps its own copies (keeps_inputs) */
    float *o;         /* (rows, H*d) attention output (o_proj's weight gradient reads it) */
    float *saved;     /* strategy's saved state (lse; head-parallel q, k, v, lse when distributed;
                         a chunked strategy's o_h chunks too) */
    float *kept;      /* selective, when the strategy's saved state has a recomputable part: this
                         layer's copy of the kept suffix (the lse); NULL otherwise */
    float *x_mid;     /* (rows, D) residual after attention; or x_mid_shared, or x_mid_c */
    float *rstd2;     /* (rows) */
    float *gate, *up; /* (N, F), only under none with one FFN chunk; NULL otherwise */
    /* bf16: this layer's own q, k, v (none, when not shared) and o (none, selective) are kept
     * here; q, k, v, o above then point at the shared fp32 set a->wq.. (packed by
     * layer_memory_attention_done, widened by layer_memory_widen) */
    bf16_t *q16, *k16, *v16, *o16;
    /* bf16, none, a strategy with a bf16 prefix (SeqAttention.bf16_floats: its copies of q, k, v):
     * the prefix as bf16 and the rest (lse_h) as fp32; saved above then points at the shared
     * fp32 buffer a->wsaved */
    bf16_t *saved16;
    float *saved_rest;
} LayerActs;

struct LlamaActs {
    int N, checkpoint, n_layers;
    int D, qd, kvd;       /* hidden size, H d and Hkv d */
    int precision;        /* PRECISION_FP32 or PRECISION_BF16 */
    float *wq, *wk, *wv, *wo; /* bf16: the shared fp32 set the layers' bf16 copies widen into */
    float *wsaved;            /* bf16: the shared fp32 `saved` the layers' saved16 + saved_rest widen into */
    size_t saved_floats, saved_bf16; /* the strategy's saved floats per layer and their bf16 prefix */
    Bf16Scratch mm_scratch;   /* bf16: operand copies of the matrix multiplies (ops.h) */
    int ffn_chunks, ffn_rows; /* chunks of the MLP and rows per chunk (the last may be shorter) */
    int xn_rows;          /* rows of xn and dxn, and of each block of the token-wise parts (norms,
                             projections, the loss head): ffn_rows (whole layers) or c (streaming) */
    int store_gate_up;    /* none with one chunk: gate, up kept per layer (else recomputed per chunk) */
    int shared_qkv;       /* q, k, v are one scratch set for all layers: dq, dk, dv */
    int x_mid_kept;       /* each layer keeps the x_mid its forward made (none, fp32, whole layers);
                             else backward makes it again (llama_rebuilds_x_mid, layer, selective) */
    float *x_mid_shared;  /* bf16 none on whole layers (llama_rebuilds_x_mid): the one (N, D) x_mid
                             of every layer, made again before each MLP backward; NULL otherwise */
    int qkv16_read;       /* bf16 none: the strategy's backward reads the layers' bf16 q, k, v as they
                             are (backward_bf16): they are never widened, and the fp32 set they are
                             made in (wq, wk, wv) lives only in the forward */
    float *q, *k, *v;     /* that scratch set (aliases, NULL unless shared_qkv) */
    float *residual;      /* (L+1, N, D): input of each layer, then the last layer's output */
    LayerActs *layers;    /* per layer (none); layer: all share `shared`; selective: all share
                             `shared` but o and kept (or saved); streaming: all share the chunk
                             scratch but saved */
    LayerActs shared;
    float *rope_cos, *rope_sin; /* (N, d/2) */
    float *rstd_final;    /* (N); one float when streaming (the head then uses rstd1_c) */
    /* scratch, shared by all layers */
    float *xn;            /* (xn_rows, D) one block's normed input (a layer's or the final norm's),
                             recomputed in backward */
    float *dx;            /* (N, D) */
    float *dxn;           /* (xn_rows, D) its gradient */
    /* per-head q/k norms (cfg.qk_norm): the rstd of a block's heads, forward and backward, and the
       backward's projection output made again and its gradient, (xn_rows, max(H, Hkv) d) each */
    float *qk_rstd, *qk_x, *qk_dx;
    float *dq, *dk, *dv, *dout; /* attention gradients (one attention chunk's rows) */
    /* the MLP's F-wide rows, here and in LayerActs, are ldF floats apart (linear_row_stride(F)),
       their padding zero from the start and forever after (see ffn_rows_alloc) */
    int ldF;
    float *h;             /* (ffn_rows, F) swiglu output, then its gradient */
    float *gate_c, *up_c; /* (ffn_rows, F) one chunk's gate and up (NULL when store_gate_up); in the
                             backward, their gradients in place */
    /* whole layers: one buffer for the two phases of a layer that never overlap (phases_alloc):
     * the MLP's h, gate_c, up_c and the attention half's dq, dk, dv, dout (and under bf16 none
     * the shared fp32 set wq, wk, wv, wo, wsaved) point into it; NULL when streaming */
    float *phases;
    float *ce_workspace;  /* (chunk, V) */
    int ce_chunk;
    Bf16Weight head16;    /* bf16: the LM head's weight as its products read it, made per forward */
    /* layer-input offload (above): residual holds two (N, D) buffers, layer l's in l % 2 */
    ChunkTier *inputs_tier;
    int in_chunks, in_rows; /* chunks of a layer input, rows per chunk (the last may be shorter) */
    float *in_keys;         /* (L) one address per layer: the tier's name for layer l's input */
    long passes;            /* backward passes that read layer inputs back */
    const char *offload_dir;
    /* chunk streaming (above): layers run chunk by chunk through the strategy's chunk calls */
    int stream;             /* 1: the streaming path; the (N, .) scratch above is then chunk-sized */
    int su, sc;             /* attention chunks u and rows per chunk c (whole layers: 1 and N) */
    int residual_single;    /* streaming with layer inputs offloaded: one (N, D) buffer, x_out over x_in */
    float *x_mid_c, *o_c;   /* (c, D), (c, H d): one chunk's x_mid and attention output */
    float *rstd1_c, *rstd2_c; /* (c) */
};

/* The activations of model c for N local tokens under opt (llama_acts_create_opts). */
LlamaActs *layer_memory_create(const LlamaConfig *c, const SeqAttention *attn, int N, const LlamaActsOptions *opt);

/* The padding of the MLP's gate and up rows (between F and ldF) zero again before an MLP pass:
 * on whole layers the attention half's buffers share their memory, and SwiGLU runs over it. */
void layer_memory_ffn_pads_zero(const LlamaActs *a, int F);

/* Layer l's input (N, D) in the residual stream; layer L's is the last layer's output. */
float *layer_memory_input(const LlamaActs *a, int l);
/* The final norm's rstd for the block of rows at r0. */
float *layer_memory_head_rstd(const LlamaActs *a, int r0);

/* The points of one forward and backward where the policy acts (llama_forward_backward_docs):
 * before layer l's forward (its input to the offload tier when a backward follows), before the
 * head (the last layer's input prefetched), before the backward, before layer l's backward (its
 * input back from the tier, the next one's prefetched). No-ops without offload. */
void layer_memory_forward_begin(LlamaActs *a, int l, int backward);
void layer_memory_head_begin(LlamaActs *a, int backward);
void layer_memory_backward_begin(LlamaActs *a);
void layer_memory_layer_backward_begin(LlamaActs *a, int l);

/* In layer l's forward, once its last chunk's attention half (x_mid included) has run and before
 * that chunk's MLP: selective keeps the strategy's kept suffix; bf16 packs the layer's kept
 * tensors to their bf16 copies (before the MLP, which on whole layers shares the fp32 set's
 * memory). */
void layer_memory_attention_done(LlamaActs *a, const SeqAttention *attn, int l);
/* Before selective's restore of layer l: the kept suffix back into the strategy's state. */
void layer_memory_restore_kept(LlamaActs *a, const SeqAttention *attn, int l);

/* What layer l's backward has of its attention half (q, k, v, o, the strategy's state): kept from
 * the forward (none), made again with attention's forward (layer) or from the kept o and lse by the
 * strategy's restore (selective); and whether it has the x_mid its forward made (none, fp32, whole
 * layers) or makes it again (llama_rebuilds_x_mid, layer, selective). */
enum { LAYER_MEMORY_ATTENTION_KEPT, LAYER_MEMORY_ATTENTION_AGAIN, LAYER_MEMORY_ATTENTION_RESTORE };
int layer_memory_attention_in_backward(const LlamaActs *a);
int layer_memory_keeps_x_mid(const LlamaActs *a);

/* Where in layer l's backward the bf16 copies are widened back into the fp32 set: at its start
 * (streaming, selective), or after the MLP's backward (none on whole layers, where the set shares
 * the MLP's memory). */
enum { LAYER_MEMORY_BACKWARD_BEGIN, LAYER_MEMORY_AFTER_MLP_BACKWARD };
void layer_memory_widen(LlamaActs *a, int l, int point);
/* Layer l's o (whole layers) for x_mid's rebuild: widened from its bf16 copy where the widening
 * of the whole set comes only after the MLP's backward. */
void layer_memory_o_for_x_mid(LlamaActs *a, int l);

#endif
