/* The sequence-attention interface the model calls for every layer. A strategy takes the
 * rank's LOCAL tokens (q, k, v after RoPE) and returns the local attention output, exactly as if
 * one process had attended over the whole sequence.
 *
 * A strategy is created for one head shape (AttnHeads: local tokens N, heads H, KV heads Hkv,
 * head_dim d) and one layout; there is no second set-up step. Per batch, set_positions() gives the
 * global position (and, for packed documents, the document id) of each local token (collective for distributed strategies: they exchange the
 * positions once per batch, not per layer). The single-process strategy is
 * local_attention_create(); the distributed ones come from the registry (strategies/registry.h).
 *
 * Shapes: q, o, dq, dout (N, H, d); k, v, dk, dv (N, Hkv, d); `saved`: a per-layer buffer of
 * saved_floats floats that forward fills and backward reads. When keeps_inputs is set, `saved`
 * holds the strategy's own copies of q, k, v (head-parallel q, k, v and lse), so backward does
 * not read q, k or v and the model need not keep them (it passes NULL); backward still takes o,
 * the forward's output as the model keeps it for o_proj (bf16-rounded under --precision bf16),
 * for delta = rowsum(dout * o), except chunk-streaming strategies, which keep their own.
 *
 * Selective checkpointing (Selective Checkpoint++, paper 000 / rematerialization-aware
 * checkpointing, paper 004): `saved` is split into a recomputable prefix and a KEPT suffix, the last
 * kept_floats floats (the lse: (N, H) locally, lse_h (n, Hl) for distributed strategies). A model
 * that checkpoints selectively keeps, per layer, only the kept suffix and the local output o; in
 * backward it recomputes q, k, v (after RoPE), copies the kept suffix back into a full `saved`
 * buffer and calls restore(), which rebuilds the prefix exactly as forward left it without running
 * attention (distributed: the head exchange of q, k, v (and of o, for a strategy that keeps o_h chunks), all-to-alls, no
 * attention compute).
 * backward() then runs from the output o and the kept lse: attention's forward runs once. Every
 * prefix float restore() writes is a copy of q, k, v or (a strategy that keeps its o_h chunks) o,
 * so backward after restore() is bit-identical to backward after forward().
 *
 * Chunk streaming (optional; paper 003 §4): a strategy with stream_chunks = u > 1 lets the
 * model run a layer chunk by chunk, so that no (N, .) activation of the layer exists whole. Local
 * chunk i is rows [i c, (i + 1) c) with c = stream_rows (N = u c), and causality makes chunk i
 * depend only on chunks <= i. The calls, in this order per layer:
 *   forward:  forward_chunk(i, q_i, k_i, v_i -> o_i) for i = 0 .. u-1 (q_i (c, H, d), k_i, v_i
 *             (c, Hkv, d) after RoPE; the strategy keeps its own copies in `saved` / its tier);
 *   backward: (a) for i = 0 .. u-1: output_chunk(i -> o_i), forward's output rows again (the model
 *             needs them for o_proj's weight gradient and to rebuild x_mid), then
 *             dout_chunk(i, dout_i) with the output gradient of those rows;
 *             (b) for i = 0 .. u-1: backward_chunk(i -> dq_i, dk_i, dv_i): the gradients of local
 *             chunk i, final (written, not accumulated).
 * All four are collective for distributed strategies (every member calls them with the same i).
 * forward() and backward() on the same strategy give the same numbers as the chunk calls made
 * over all chunks (they are built from them). stream_chunks 0: the strategy has no chunk calls.
 *
 * Sliding windows: SeqAttention.window, set per layer, masks every call as the kernel's
 * AttnShape.window does; distributed strategies skip (query, key) blocks wholly before the window
 * as they skip future ones, and the plain ring also stops passing KV blocks no window reaches
 * (double_ring.c); the other schedules' transfers run as without a window. */
#ifndef SEQPAR_SEQ_ATTENTION_H
#define SEQPAR_SEQ_ATTENTION_H

#include <stddef.h>

#include "kernels/bf16.h"

typedef struct {
    int n_local;    /* N: tokens on this rank */
    int n_heads;    /* H */
    int n_kv_heads; /* Hkv */
    int head_dim;   /* d */
    Precision precision; /* of q, k, v, dout: PRECISION_BF16 selects the kernel's bf16 tiles (AttnShape) */
} AttnHeads;

typedef struct SeqAttention SeqAttention;

struct SeqAttention {
    const char *name;
    void *ctx;
    AttnHeads heads;
    size_t saved_floats; /* per layer */
    int keeps_inputs;    /* backward ignores q, k, v (may be NULL); o is still read (see above) */
    size_t kept_floats;  /* the suffix of `saved` that restore() cannot rebuild (<= saved_floats) */
    /* The prefix of `saved` that holds only copies of q, k, v (the head-parallel q_h, kv_h): when
     * the model passes bf16-rounded q, k, v (--precision bf16) its values are bf16, so the model
     * may keep it as bf16 between forward and backward and widen it back bit for bit (model/layer_memory.c).
     * 0: none (<= saved_floats - kept_floats). */
    size_t bf16_floats;
    /* The sliding window of the layer the next forward / backward / chunk calls are for (AttnShape.window:
     * each query sees its `window` latest positions; 0, as created: full causal attention). The model
     * sets it before each layer's calls (a Mistral's layers, a Qwen's windowed ones); strategies read it
     * at every call that computes attention. */
    int window;
    /* Positions (N) of this rank's tokens for the coming forward/backward calls, and their
     * document ids (N) for packed sequences (NULL: the sequence is one document; every rank of the
     * group must pass NULL or ids alike). Positions are global token positions in the sequence
     * (not restarting per document: the mask is key visible iff same document and kpos <= qpos).
     * The strategy copies what it needs. Collective for distributed strategies. */
    void (*set_positions)(SeqAttention *sa, const int *positions, const int *docs);
    void (*forward)(SeqAttention *sa, const float *q, const float *k, const float *v, float *o, float *saved);
    /* Writes (overwrites) dq, dk, dv. o is the forward's output. */
    void (*backward)(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o,
                     const float *saved, const float *dout, float *dq, float *dk, float *dv);
    /* Optional (NULL: the strategy has none): backward() on q, k, v given as bf16 values, the
     * model's bf16 copies of them under --precision bf16 --checkpoint none, which the kernel reads as
     * they are (AttnShape.q16): the same results bit for bit as backward() on them widened, without
     * an fp32 set of them. Only for strategies that read q, k, v in backward (!keeps_inputs). */
    void (*backward_bf16)(SeqAttention *sa, const bf16_t *q, const bf16_t *k, const bf16_t *v, const float *o,
                          const float *saved, const float *dout, float *dq, float *dk, float *dv);
    /* Refills saved[0 .. saved_floats - kept_floats) from the layer's local q, k, v (after RoPE)
     * and output o as forward() would have; the kept suffix must already hold forward's values.
     * Never computes attention. Collective for distributed strategies (as forward). A no-op when
     * kept_floats == saved_floats. */
    void (*restore)(SeqAttention *sa, const float *q, const float *k, const float *v, const float *o, float *saved);
    int stream_chunks; /* u > 1 when the chunk calls below exist (see the top of this file); else 0 */
    int stream_rows;   /* c = N / u: rows of one local chunk */
    void (*forward_chunk)(SeqAttention *sa, int i, const float *q, const float *k, const float *v, float *o,
                          float *saved);
    void (*output_chunk)(SeqAttention *sa, int i, const float *saved, float *o);
    void (*dout_chunk)(SeqAttention *sa, int i, const float *saved, const float *dout);
    void (*backward_chunk)(SeqAttention *sa, int i, const float *saved, float *dq, float *dk, float *dv);
    /* Measurement knobs (optional; NULL: the strategy has none): query rows per kernel call (0: a
     * whole run) and compute on/off (off: the same communication with no attention work, the
     * benchmark's communication-alone time). */
    void (*set_piece_rows)(SeqAttention *sa, int rows);
    void (*set_compute)(SeqAttention *sa, int enabled);
    void (*destroy)(SeqAttention *sa);
};

/* Causal attention of all local tokens against all local tokens on this process. */
SeqAttention *local_attention_create(AttnHeads heads);
void seq_attention_destroy(SeqAttention *sa);

#endif
