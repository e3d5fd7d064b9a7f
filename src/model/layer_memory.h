/* The decoder layers' memory policy: which activations a layer keeps, recomputes, streams, offloads
 * or rebuilds, where they live, and the points where llama.c's forward and backward ask for them.
 * llama.c holds the math and calls these points; this module holds no arithmetic of the model but
 * exact copies (bf16 packing and widening of values that are bf16 already, the offload tier). The
 * settings (checkpoint modes, FFN chunks, streaming, offload, bf16) are public through llama.h,
 * which includes this header; the LlamaActs layout is private to the model (activations.h). */
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
    int forward_only; /* 1: forward passes only (seqpar eval), see below */
} LlamaActsOptions;
/* Forward only (`seqpar eval`): activations for forward passes that no backward follows. No layer
 * keeps anything for a backward: the layers run as under layer checkpointing (one shared set of
 * q, k, v, o and the strategy's `saved`), whatever opt->checkpoint says, and the residual stream is
 * one (N, D) buffer: on whole layers x_mid = x_in + o_proj(o) is made in it in place once q, k, v
 * are made, and the MLP's output added to it in place (each chunk's rows normed before they are
 * written); streamed, each chunk's output rows overwrite its input rows, as with offloaded inputs. No
 * gradient scratch (dx, dxn, the q/k norms' and the attention half's gradients; under a strategy
 * that keeps its inputs q, k, v still go where dq, dk, dv would) and no layer-input offload. The
 * forward's arithmetic is the training forward's, bit for bit; llama_forward_backward with
 * backward 1 on these activations is an internal error. */
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
int llama_acts_forward_only(const LlamaActs *a);

/* Whether a layer's attention backward reads the layer's bf16 q, k, v as they are, never widened:
 * bf16 under none on whole layers, with a strategy that keeps no copies of q, k, v of its own
 * (SeqAttention.keeps_inputs) and has backward_bf16 (one process: local_attention). */
int llama_reads_qkv16(int checkpoint, int precision, int stream, int keeps_inputs, int has_backward_bf16);

/* Whether backward makes x_mid = x_in + o_proj(o) again instead of each layer keeping it (one
 * o_proj forward per layer and token more): under none with chunk streaming (per chunk, above) or
 * with bf16 on whole layers, where a layer keeps o as bf16 and x_mid was its largest fp32 tensor
 * but the input (one (N, D) buffer shared by the layers; rebuilt bit for bit). */
int llama_rebuilds_x_mid(int checkpoint, int precision, int stream);

/* The activations of model c for N local tokens under opt (llama_acts_create_opts). */
LlamaActs *layer_memory_create(const LlamaConfig *c, const SeqAttention *attn, int N, const LlamaActsOptions *opt);

#endif
