/* The Llama model configuration: the fields of a Hugging Face config.json that seqpar uses (a
 * Llama, with or without attention biases; a Mistral: the same model with a sliding attention
 * window on every layer; a Qwen2: a Llama with biases on q, k and v and an optional window on the
 * layers from max_window_layers on; a Qwen3: a Llama with RMSNorms over each head of q and k,
 * optional attention biases, a Qwen2's window). */
#ifndef SEQPAR_MODEL_CONFIG_H
#define SEQPAR_MODEL_CONFIG_H

#include <stddef.h>

#define LLAMA_HF_CARRIED_MAX 1024

typedef struct {
    int hidden_size;
    int intermediate_size;
    int num_attention_heads;
    int num_key_value_heads;
    int num_hidden_layers;
    int vocab_size;
    int head_dim;               /* hidden_size / num_attention_heads unless config.json or --head-dim sets it */
    int max_position_embeddings;
    int tie_word_embeddings;    /* 0 or 1 */
    /* 1 + the embedding row transformers builds as nn.Embedding's padding_idx (pad_token_id; a
     * negative id counts from the end, as torch's): the lookup adds nothing to that row's gradient,
     * so it keeps its values through training (a tied lm_head's part still reaches it). 0: none. */
    int padding_idx1;
    float rms_norm_eps;
    double rope_theta;
    /* RoPE frequency scaling (config.json "rope_scaling" / "rope_parameters"); zero-initialised
     * means plain RoPE, so designated initialisers elsewhere stay valid. */
    int rope_type;              /* LLAMA_ROPE_DEFAULT, LLAMA_ROPE_LINEAR or LLAMA_ROPE_LLAMA3 */
    double rope_factor;         /* linear and llama3 */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_original_max_position_embeddings;          /* llama3 */
    int family;                 /* LLAMA_FAMILY_LLAMA (0), _MISTRAL, _QWEN2 or _QWEN3: config.json's model_type */
    int sliding_window;         /* Mistral, Qwen2: each token of a windowed layer attends to this many
                                   latest tokens; 0: all (no layer has a window) */
    int qkv_bias;               /* 1: q_proj, k_proj, v_proj have biases (Qwen2; a Llama's attention_bias) */
    int o_bias;                 /* 1: o_proj has a bias (a Llama's or a Qwen3's attention_bias) */
    int qk_norm;                /* 1: q and k pass an RMSNorm over each head (weights of head_dim) before
                                   RoPE: a Qwen3's q_norm, k_norm */
    /* a Qwen2's or Qwen3's window settings as config.json gave them, written back on save:
     * use_sliding_window, its sliding_window (0: null) and max_window_layers (layers from this
     * index on have the window) */
    int qwen_use_window, qwen_window, qwen_max_window_layers;
    /* config.json's fields that seqpar does not compute with but a saved model must keep for
     * transformers (bos/eos/pad_token_id, an initializer_range other than 0.02): a compact JSON object of those present
     * in the config it was read from, "" for none (a model from size flags); written back on save. */
    char hf_carried[LLAMA_HF_CARRIED_MAX];
} LlamaConfig;

enum { LLAMA_ROPE_DEFAULT = 0, LLAMA_ROPE_LINEAR = 1, LLAMA_ROPE_LLAMA3 = 2 };
enum { LLAMA_FAMILY_LLAMA = 0, LLAMA_FAMILY_MISTRAL = 1, LLAMA_FAMILY_QWEN2 = 2, LLAMA_FAMILY_QWEN3 = 3 };

/* The RoPE inverse frequency of pair j (0 <= j < head_dim / 2), in double, exactly as
 * transformers' rope init functions compute it: theta^(-2j/head_dim), then for "linear" divided
 * by factor, and for "llama3" (_compute_llama3_parameters) divided by factor when the wavelength
 * 2*pi/inv_freq exceeds original_max_position_embeddings / low_freq_factor, kept when it is
 * below original_max_position_embeddings / high_freq_factor, and smoothly interpolated between. */
double llama_rope_inv_freq(const LlamaConfig *c, int j);
/* The family and its options for a run's header: "Llama", "Qwen2 (q, k, v biases)", "Qwen3 (q/k
 * norms)", "Mistral (window 4096)", ... */
void llama_describe_family(const LlamaConfig *c, char *buf, size_t n);
/* The rope_type name of c ("default", "linear", "llama3"). */
const char *llama_rope_type_name(int rope_type);

#include "core/common.h"

/* Returns -1 with a one-line message in *e naming the field and the fix if the configuration is
 * unusable (non-positive sizes, heads not dividing hidden size when head_dim is unset, 0: any value
 * set is explicit, hidden_size / num_attention_heads rounded down included; KV heads not dividing
 * heads, absurd sizes whose products would overflow, ...), else 0. `where`
 * names the source (a path or "size flags") in the message. */
int llama_config_check(const LlamaConfig *c, const char *where, SeqErr *e);
/* An even head_dim near `quotient` (hidden_size / num_attention_heads rounded down), for the
 * messages that ask for one (config.json's head_dim, --head-dim): RoPE needs it even. */
int llama_even_head_dim(int quotient);
/* The sliding window of layer l (0 <= l < num_hidden_layers): each token attends to its this many
 * latest positions, itself included (transformers' rule: key visible iff q - k < window); 0: full
 * causal attention. A Mistral's sliding_window on every layer; a Qwen's window (use_sliding_window)
 * from layer max_window_layers on. */
int llama_layer_window(const LlamaConfig *c, int l);
/* Layers with a window (llama_layer_window > 0). */
int llama_windowed_layers(const LlamaConfig *c);
/* llama_config_check that dies with the message (on every rank: it is a pure function). */
void llama_config_validate(const LlamaConfig *c, const char *where);

#endif
