/* The model's activations as its math reads them, and the points of a forward and backward where
 * the memory policy (layer_memory.c) acts. Private to src/model/ (llama.c and layer_memory.c):
 * everything else sees LlamaActs through llama.h and layer_memory.h only. */
#ifndef SEQPAR_MODEL_ACTIVATIONS_H
#define SEQPAR_MODEL_ACTIVATIONS_H

#include <stddef.h>

#include "attention/seq_attention.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "memory/chunk_tier.h"

typedef struct LlamaActs LlamaActs;

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
    int residual_single;    /* streaming with layer inputs offloaded, or forward only: one (N, D)
                               buffer, x_out over x_in */
    int forward_only;       /* LlamaActsOptions.forward_only: no backward, no gradient scratch */
    float *x_mid_c, *o_c;   /* (c, D), (c, H d): one chunk's x_mid and attention output */
    float *rstd1_c, *rstd2_c; /* (c) */
};


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
