/* The Llama model configuration: the fields of a Hugging Face config.json that seqpar uses. */
#ifndef SEQPAR_MODEL_CONFIG_H
#define SEQPAR_MODEL_CONFIG_H

typedef struct {
    int hidden_size;
    int intermediate_size;
    int num_attention_heads;
    int num_key_value_heads;
    int num_hidden_layers;
    int vocab_size;
    int head_dim;               /* hidden_size / num_attention_heads unless config.json sets it */
    int max_position_embeddings;
    int tie_word_embeddings;    /* 0 or 1 */
    float rms_norm_eps;
    double rope_theta;
} LlamaConfig;

#include "core/common.h"

/* Returns -1 with a one-line message in *e naming the field and the fix if the configuration is
 * unusable (non-positive sizes, heads not dividing hidden size when head_dim is implicit, KV
 * heads not dividing heads, absurd sizes whose products would overflow, ...), else 0. `where`
 * names the source (a path or "size flags") in the message. */
int llama_config_check(const LlamaConfig *c, const char *where, SeqErr *e);
/* llama_config_check that dies with the message (on every rank: it is a pure function). */
void llama_config_validate(const LlamaConfig *c, const char *where);

#endif
