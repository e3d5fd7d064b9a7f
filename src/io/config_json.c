/* Hugging Face config.json for Llama models, read and written with jansson. Loading takes the
 * fields seqpar uses, checks their JSON types strictly (an integer field must be a JSON
 * integer), applies the Hugging Face defaults for optional fields, rejects settings that would
 * change the model's arithmetic in ways seqpar does not implement (a model_type other than llama
 * and mistral, RoPE scaling other than linear and llama3, a Llama's sliding window, q/k norms,
 * soft-capping, biases, an activation other than SiLU, dropout) by name, reads a Mistral's
 * sliding_window (transformers' default 4096 where absent; null: none; seqpar then refuses
 * sequences longer than it), reads linear and llama3 RoPE scaling (transformers 4's
 * rope_scaling or transformers 5's rope_parameters, with transformers 5's precedence), keeps the
 * token ids for the saved config (LlamaConfig.hf_carried), ignores everything else, and
 * validates the result; every problem is returned to the caller as one line (config_json_read)
 * or ends the program (config_json_load). Both transformers 4 (top-level rope_theta) and transformers 5
 * (rope_parameters.rope_theta) layouts are read. Saving writes a config that transformers'
 * LlamaForCausalLM (MistralForCausalLM for a Mistral).from_pretrained accepts, in both layouts at
 * once. */
#include "io/config_json.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "io/atomic_file.h"
#include "io/read_file.h"

/* A config.json is a few kB; anything far larger is the wrong file. */
#define CONFIG_MAX_BYTES (16 * 1024 * 1024)

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a non-integer number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

/* The field's value, or NULL when it is absent or null. */
static json_t *field(json_t *root, const char *name) {
    json_t *v = json_object_get(root, name);
    return (v && !json_is_null(v)) ? v : NULL;
}

/* Reads an integer field into *out; when absent (or null) a required one is an error and an
 * optional one gives `fallback`. */
static int int_field(json_t *root, const char *name, int required, int fallback, const char *path, int *out,
                     SeqErr *e) {
    json_t *v = field(root, name);
    if (!v) {
        if (required)
            return seq_err(e, "config '%s' has no \"%s\": add it as a JSON integer (every Llama config.json sets it)",
                           path, name);
        *out = fallback;
        return 0;
    }
    if (!json_is_integer(v))
        return seq_err(e, "config '%s': \"%s\" must be a JSON integer, found %s (write it without quotes or a "
                       "decimal point)", path, name, json_type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < INT_MIN || x > INT_MAX) return seq_err(e, "config '%s': \"%s\" = %lld is out of range", path, name, (long long)x);
    *out = (int)x;
    return 0;
}

static int number_field(json_t *root, const char *name, double fallback, const char *path, double *out, SeqErr *e) {
    json_t *v = field(root, name);
    if (!v) { *out = fallback; return 0; }
    if (!json_is_number(v))
        return seq_err(e, "config '%s': \"%s\" must be a JSON number, found %s", path, name, json_type_name(v));
    *out = json_number_value(v);
    return 0;
}

static int bool_field(json_t *root, const char *name, int fallback, const char *path, int *out, SeqErr *e) {
    json_t *v = field(root, name);
    if (!v) { *out = fallback; return 0; }
    if (!json_is_boolean(v))
        return seq_err(e, "config '%s': \"%s\" must be true or false, found %s", path, name, json_type_name(v));
    *out = json_is_true(v) ? 1 : 0;
    return 0;
}

/* A partial_rotary_factor other than 1 in `obj` (the RoPE object `name`, or the top level where
 * name is NULL): seqpar rotates the whole head. */
static int refuse_partial_rotary(json_t *obj, const char *name, const char *path, SeqErr *e) {
    double partial = 1.0;
    if (number_field(obj, "partial_rotary_factor", 1.0, path, &partial, e) != 0) return -1;
    if (partial == 1.0) return 0;
    if (name)
        return seq_err(e, "config '%s': \"%s\".partial_rotary_factor is %g, but seqpar rotates the whole head "
                       "(partial rotary embeddings are not Llama's)", path, name, partial);
    return seq_err(e, "config '%s': \"partial_rotary_factor\" is %g, but seqpar rotates the whole head (partial "
                   "rotary embeddings are not Llama's)", path, partial);
}

/* Reads one RoPE description ("rope_scaling" of transformers 4 or "rope_parameters" of
 * transformers 5) into c's rope fields: type "default" (or, for rope_parameters, none given),
 * "linear" (factor) and "llama3" (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings, which falls back to max_position_embeddings as in
 * transformers); every other type is refused by name. *type_out gets the LLAMA_ROPE_* value. */
static int read_rope(json_t *rope, const char *name, const char *path, LlamaConfig *c, int *type_out, SeqErr *e) {
    if (!json_is_object(rope))
        return seq_err(e, "config '%s': \"%s\" must be an object or null, found %s", path, name, json_type_name(rope));
    json_t *type = field(rope, "rope_type");
    if (!type) type = field(rope, "type");
    if (type && !json_is_string(type))
        return seq_err(e, "config '%s': \"%s\".rope_type must be a string, found %s", path, name, json_type_name(type));
    const char *t = type ? json_string_value(type) : (strcmp(name, "rope_parameters") == 0 ? "default" : NULL);
    if (!t)
        return seq_err(e, "config '%s': \"%s\" has no \"rope_type\": give it \"default\", \"linear\" or \"llama3\"",
                       path, name);
    if (refuse_partial_rotary(rope, name, path, e) != 0) return -1;
    if (strcmp(t, "default") == 0) { *type_out = LLAMA_ROPE_DEFAULT; return 0; }
    if (strcmp(t, "linear") != 0 && strcmp(t, "llama3") != 0)
        return seq_err(e, "config '%s' sets \"%s\" of type \"%.60s\", which seqpar does not implement (it implements "
                       "\"default\", \"linear\" and \"llama3\", exactly as transformers does)", path, name, t);
    int llama3 = strcmp(t, "llama3") == 0;
    if (!field(rope, "factor"))
        return seq_err(e, "config '%s': \"%s\" of type \"%s\" has no \"factor\"", path, name, t);
    if (number_field(rope, "factor", 1.0, path, &c->rope_factor, e) != 0) return -1;
    if (llama3) {
        const char *need[] = {"low_freq_factor", "high_freq_factor"};
        for (size_t i = 0; i < ARRAY_LEN(need); i++)
            if (!field(rope, need[i]))
                return seq_err(e, "config '%s': \"%s\" of type \"llama3\" has no \"%s\"", path, name, need[i]);
        if (number_field(rope, "low_freq_factor", 1.0, path, &c->rope_low_freq_factor, e) != 0 ||
            number_field(rope, "high_freq_factor", 4.0, path, &c->rope_high_freq_factor, e) != 0 ||
            int_field(rope, "original_max_position_embeddings", 0, c->max_position_embeddings, path,
                      &c->rope_original_max_position_embeddings, e) != 0)
            return -1;
    }
    *type_out = llama3 ? LLAMA_ROPE_LLAMA3 : LLAMA_ROPE_LINEAR;
    return 0;
}

/* Which RoPE description counts, as transformers 5 decides (PreTrainedConfig's
 * convert_rope_params_to_dict and standardize_rope_params): a non-empty "rope_scaling" object,
 * else "rope_parameters"; rope_theta from that object, else the top-level "rope_theta" (already in
 * c), else 10000; for llama3 a top-level "original_max_position_embeddings" over the object's, then
 * max_position_embeddings. transformers 4 reads only rope_scaling and the top-level rope_theta, so
 * wherever rope_scaling is set both versions agree with this. */
static int read_rope_settings(json_t *root, const char *path, LlamaConfig *c, SeqErr *e) {
    json_t *scaling = field(root, "rope_scaling"), *parameters = field(root, "rope_parameters");
    /* (field: a JSON null is absent) */
    const int use_scaling = scaling && !(json_is_object(scaling) && json_object_size(scaling) == 0);
    json_t *rope = use_scaling ? scaling : parameters;
    const char *name = use_scaling ? "rope_scaling" : "rope_parameters";
    if (!rope) {
        c->rope_type = LLAMA_ROPE_DEFAULT;
        return 0;
    }
    int type = LLAMA_ROPE_DEFAULT;
    if (read_rope(rope, name, path, c, &type, e) != 0) return -1;
    if (field(rope, "rope_theta") && number_field(rope, "rope_theta", c->rope_theta, path, &c->rope_theta, e) != 0)
        return -1;
    if (type == LLAMA_ROPE_LLAMA3 && field(root, "original_max_position_embeddings") &&
        int_field(root, "original_max_position_embeddings", 1, 0, path, &c->rope_original_max_position_embeddings, e) != 0)
        return -1;
    c->rope_type = type;
    return 0;
}

/* Fields of other model families (or Llama options) that change the arithmetic and that seqpar
 * does not implement: each is refused by name when it is set to anything but its neutral value. */
static int reject_unsupported(json_t *root, const char *path, int *family, SeqErr *e) {
    json_t *mt = field(root, "model_type");
    const char *mts = mt && json_is_string(mt) ? json_string_value(mt) : "";
    *family = !strcmp(mts, "mistral") ? LLAMA_FAMILY_MISTRAL
              : !strcmp(mts, "qwen2") ? LLAMA_FAMILY_QWEN2
              : !strcmp(mts, "qwen3") ? LLAMA_FAMILY_QWEN3
                                      : LLAMA_FAMILY_LLAMA;
    if (mt && strcmp(mts, "llama") && *family == LLAMA_FAMILY_LLAMA)
        return seq_err(e, "config '%s' has \"model_type\" %s%.60s%s: seqpar trains Llama, Mistral, Qwen2 and "
                       "Qwen3 models only (model_type \"llama\", \"mistral\", \"qwen2\" or \"qwen3\"); other "
                       "families compute a different model", path,
                       json_is_string(mt) ? "\"" : "", json_is_string(mt) ? json_string_value(mt) : json_type_name(mt),
                       json_is_string(mt) ? "\"" : "");
    const char *on_fields[] = {"sliding_window", "use_sliding_window", "use_qk_norm", "qk_norm", "qk_layernorm",
                               "attn_logit_softcapping", "final_logit_softcapping", "no_rope_layers",
                               "layer_types", "query_pre_attn_scalar", "logits_scaling", "embedding_multiplier",
                               "residual_multiplier", "attention_multiplier"};
    for (size_t i = 0; i < ARRAY_LEN(on_fields); i++) {
        if (*family == LLAMA_FAMILY_MISTRAL && !strcmp(on_fields[i], "sliding_window")) continue; /* read below */
        const int qwen = *family == LLAMA_FAMILY_QWEN2 || *family == LLAMA_FAMILY_QWEN3;
        if (qwen && (!strcmp(on_fields[i], "sliding_window") || !strcmp(on_fields[i], "use_sliding_window") ||
                     !strcmp(on_fields[i], "layer_types")))
            continue; /* read below (read_qwen_window) */
        json_t *v = field(root, on_fields[i]);
        if (v && !json_is_false(v))
            return seq_err(e, "config '%s' sets \"%s\", which seqpar's Llama does not implement: remove it (or set "
                           "it to null) only if the checkpoint was trained without it", path, on_fields[i]);
    }
    /* MistralForCausalLM and Qwen2ForCausalLM read neither field (a Mistral has no biases, a Qwen2
     * those of q, k and v, whatever these say; a bias tensor the model does not have is refused
     * as one it does not use), Qwen3ForCausalLM only attention_bias; a Llama's and a Qwen3's
     * attention_bias is read by config_from_json */
    int mlp_bias = 0;
    if (*family == LLAMA_FAMILY_LLAMA && bool_field(root, "mlp_bias", 0, path, &mlp_bias, e) != 0) return -1;
    if (mlp_bias)
        return seq_err(e, "config '%s' sets \"mlp_bias\": true, but seqpar's Llama has no MLP biases: set it to false "
                       "only if the checkpoint has none", path);
    /* top level too, where transformers 4 read it (transformers 5 moves it into rope_parameters) */
    if (refuse_partial_rotary(root, NULL, path, e) != 0) return -1;
    double dropout = 0;
    if (number_field(root, "attention_dropout", 0.0, path, &dropout, e) != 0) return -1;
    if (dropout != 0.0)
        return seq_err(e, "config '%s' sets \"attention_dropout\": %g, but seqpar trains without dropout (as Llama "
                       "was pretrained): set it to 0.0", path, dropout);
    json_t *act = field(root, "hidden_act");
    if (act && !(json_is_string(act) && (strcmp(json_string_value(act), "silu") == 0 ||
                                         strcmp(json_string_value(act), "swish") == 0))) /* transformers: the same */
        return seq_err(e, "config '%s': \"hidden_act\" must be \"silu\" (the Llama SwiGLU MLP), found %s%.60s%s", path,
                       json_is_string(act) ? "\"" : "", json_is_string(act) ? json_string_value(act) : json_type_name(act),
                       json_is_string(act) ? "\"" : "");
    return 0;
}

/* "sliding_window" into *window: absent, the default of MistralConfig, Qwen2Config and Qwen3Config
 * (4096); null, none (0); else a positive integer. */
static int window_field(json_t *root, const char *path, int *window, SeqErr *e) {
    json_t *v = json_object_get(root, "sliding_window");
    if (!v) *window = 4096;
    else if (json_is_null(v)) *window = 0;
    else if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= INT_MAX)
        *window = (int)json_integer_value(v);
    else
        return seq_err(e, "config '%s': \"sliding_window\" must be a positive JSON integer (tokens) or null (no "
                       "window), found %s", path, json_is_integer(v) ? "an integer below 1" : json_type_name(v));
    return 0;
}

/* A Mistral's sliding_window: every layer has it. */
static int read_sliding_window(json_t *root, const char *path, LlamaConfig *c, SeqErr *e) {
    if (c->family != LLAMA_FAMILY_MISTRAL) return 0;
    return window_field(root, path, &c->sliding_window, e);
}

/* A Qwen2's or Qwen3's window (Qwen2Config, Qwen3Config): use_sliding_window (default false) turns
 * on sliding_window (default 4096; null: none) for the layers from max_window_layers (default 28) on, which
 * layer_types spells out when present; seqpar computes the window as a Mistral's, for sequences
 * no longer than it (c->sliding_window, 0 where no layer has one). layer_types must be what the
 * other three give (a saved config writes those three back, and transformers derives it). */
static int read_qwen_window(json_t *root, const char *path, LlamaConfig *c, SeqErr *e) {
    if (c->family != LLAMA_FAMILY_QWEN2 && c->family != LLAMA_FAMILY_QWEN3) return 0;
    if (bool_field(root, "use_sliding_window", 0, path, &c->qwen_use_window, e) != 0 ||
        int_field(root, "max_window_layers", 0, 28, path, &c->qwen_max_window_layers, e) != 0)
        return -1;
    if (c->qwen_max_window_layers < 0)
        return seq_err(e, "config '%s': \"max_window_layers\" %d is negative: give the index of the first layer with "
                       "the window (0 to num_hidden_layers)", path, c->qwen_max_window_layers);
    if (window_field(root, path, &c->qwen_window, e) != 0) return -1;
    const int window = c->qwen_use_window ? c->qwen_window : 0; /* as Qwen2Config.__post_init__ */
    json_t *types = field(root, "layer_types");
    for (int l = 0; types && l < c->num_hidden_layers; l++) {
        const int sliding = window && l >= c->qwen_max_window_layers;
        json_t *t = json_is_array(types) ? json_array_get(types, (size_t)l) : NULL;
        if (!json_is_array(types) || json_array_size(types) != (size_t)c->num_hidden_layers || !json_is_string(t) ||
            strcmp(json_string_value(t), sliding ? "sliding_attention" : "full_attention"))
            return seq_err(e, "config '%s': \"layer_types\" is not the list use_sliding_window, sliding_window and "
                           "max_window_layers give (layer %d should be \"%s\"): seqpar keeps a Qwen's window in those "
                           "three; remove layer_types if they describe the checkpoint", path, l,
                           sliding ? "sliding_attention" : "full_attention");
    }
    c->sliding_window = window && c->qwen_max_window_layers < c->num_hidden_layers ? window : 0;
    return 0;
}

/* The fields a saved config keeps from the one it was read from (LlamaConfig.hf_carried). */
static const char *const CARRIED[] = {"bos_token_id", "eos_token_id", "pad_token_id", "initializer_range"};

static int read_carried(json_t *root, const char *path, LlamaConfig *c, SeqErr *e) {
    json_t *keep = json_object();
    for (size_t i = 0; i < ARRAY_LEN(CARRIED); i++) {
        json_t *v = json_object_get(root, CARRIED[i]); /* null too: transformers reads an explicit null */
        /* initializer_range only where it is not what config_json_save writes anyway (0.02), so that
         * a config seqpar saved reads back as it was */
        if (v && !strcmp(CARRIED[i], "initializer_range") && json_is_number(v) && json_number_value(v) == 0.02) continue;
        if (v) json_object_set(keep, CARRIED[i], v);
    }
    char *text = json_object_size(keep) ? json_dumps(keep, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(keep);
    const size_t n = text ? strlen(text) : 0;
    if (n >= sizeof c->hf_carried) {
        free(text);
        return seq_err(e, "config '%s': its token ids take %zu characters of JSON, more than the %zu seqpar keeps for "
                       "them: shorten bos/eos/pad_token_id", path, n, sizeof c->hf_carried - 1);
    }
    if (text) memcpy(c->hf_carried, text, n + 1);
    free(text);
    return 0;
}

/* pad_token_id as transformers' LlamaModel uses it: the padding_idx of embed_tokens (absent or
 * null: none). torch takes -vocab_size .. vocab_size - 1 and refuses the rest, as here. */
static int read_padding_idx(json_t *root, const char *path, LlamaConfig *c, SeqErr *e) {
    json_t *v = field(root, "pad_token_id");
    if (!v) return 0;
    const json_int_t V = c->vocab_size;
    if (!json_is_integer(v))
        return seq_err(e, "config '%s': \"pad_token_id\" must be a JSON integer (a token id) or null, found %s", path,
                       json_type_name(v));
    const json_int_t p = json_integer_value(v);
    if (p < -V || p >= V)
        return seq_err(e, "config '%s': \"pad_token_id\" %lld lies outside the vocabulary of %lld tokens (transformers "
                       "refuses it too, as the embedding's padding_idx): give an id below %lld, or null", path,
                       (long long)p, (long long)V, (long long)V);
    c->padding_idx1 = (int)(p < 0 ? p + V : p) + 1;
    return 0;
}

/* Keys whose null transformers (5.x) refuses to load ('expected float, got NoneType'): read as
 * absent they took seqpar's defaults silently, and a saved config then stated the guess as fact.
 * Keys that may be null (num_key_value_heads, head_dim, rope_scaling, a Mistral's sliding_window)
 * are not here. The token ids may be null, an integer or a list of integers, as in transformers. */
static int refuse_nulls(json_t *root, const char *path, SeqErr *e) {
    static const char *const typed[] = {"model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_hidden_layers", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                                        "hidden_act", "tie_word_embeddings", "attention_bias", "mlp_bias"};
    for (size_t i = 0; i < ARRAY_LEN(typed); i++)
        if (json_is_null(json_object_get(root, typed[i])))
            return seq_err(e, "config '%s': \"%s\" is null, which transformers refuses too: give the value the model "
                           "was trained with, or remove the key for transformers' default", path, typed[i]);
    static const char *const ids[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (size_t i = 0; i < ARRAY_LEN(ids); i++) {
        json_t *v = json_object_get(root, ids[i]);
        int ok = !v || json_is_null(v) || json_is_integer(v);
        if (json_is_array(v)) {
            ok = 1;
            for (size_t j = 0; j < json_array_size(v); j++) ok &= json_is_integer(json_array_get(v, j));
        }
        if (!ok)
            return seq_err(e, "config '%s': \"%s\" must be an integer, a list of integers or null, found %s (transformers "
                           "refuses it too): write the id as a number", path, ids[i],
                           json_is_array(v) ? "a list holding something else" : json_type_name(v));
    }
    return 0;
}

static int config_from_json(json_t *root, const char *path, LlamaConfig *c, SeqErr *e) {
    if (!json_is_object(root))
        return seq_err(e, "config '%s' must hold a JSON object {...}, found %s", path, json_type_name(root));
    memset(c, 0, sizeof *c);
    if (refuse_nulls(root, path, e) != 0) return -1;
    double eps = 0;
    if (reject_unsupported(root, path, &c->family, e) != 0) return -1;
    const int mistral = c->family == LLAMA_FAMILY_MISTRAL; /* transformers' MistralConfig defaults */
    const int qwen2 = c->family == LLAMA_FAMILY_QWEN2;     /* and Qwen2Config's */
    const int qwen3 = c->family == LLAMA_FAMILY_QWEN3;     /* and Qwen3Config's */
    if (qwen3 && json_is_null(json_object_get(root, "head_dim")))
        return seq_err(e, "config '%s': \"head_dim\" is null, which transformers' Qwen3 cannot use: give the model's "
                       "head_dim (Qwen3Config's default is 128)", path);
    int head_dim_given = field(root, "head_dim") != NULL;
    if (int_field(root, "hidden_size", 1, 0, path, &c->hidden_size, e) ||
        int_field(root, "intermediate_size", 1, 0, path, &c->intermediate_size, e) ||
        int_field(root, "num_attention_heads", 1, 0, path, &c->num_attention_heads, e) ||
        int_field(root, "num_hidden_layers", 1, 0, path, &c->num_hidden_layers, e) ||
        int_field(root, "vocab_size", 1, 0, path, &c->vocab_size, e) ||
        /* absent from a Mistral's config: MistralConfig's 8; null (and a Llama's absent): the heads */
        int_field(root, "num_key_value_heads", 0,
                  mistral && !json_object_get(root, "num_key_value_heads")  ? 8
                  : (qwen2 || qwen3) && !json_object_get(root, "num_key_value_heads") ? 32
                                                                             : c->num_attention_heads,
                  path, &c->num_key_value_heads, e) ||
        int_field(root, "max_position_embeddings", 0, mistral ? 131072 : qwen2 || qwen3 ? 32768 : 2048, path,
                  &c->max_position_embeddings, e) ||
        /* 0 marks head_dim as implicit for llama_config_check; filled in after validation. */
        int_field(root, "head_dim", 0, qwen3 ? 128 : 0, path, &c->head_dim, e) || /* Qwen3Config: 128 */
        number_field(root, "rms_norm_eps", 1e-6, path, &eps, e) ||
        number_field(root, "rope_theta", 10000.0, path, &c->rope_theta, e))
        return -1;
    c->rms_norm_eps = (float)eps;
    if (bool_field(root, "tie_word_embeddings", 0, path, &c->tie_word_embeddings, e) != 0) return -1;
    if (read_sliding_window(root, path, c, e) != 0 || read_qwen_window(root, path, c, e) != 0) return -1;
    if ((c->family == LLAMA_FAMILY_LLAMA || qwen3) && bool_field(root, "attention_bias", 0, path, &c->o_bias, e) != 0)
        return -1;
    /* LlamaAttention and Qwen3Attention: all four or none; Qwen2Attention: q, k, v */
    c->qkv_bias = qwen2 || c->o_bias;
    c->qk_norm = qwen3;
    if (read_carried(root, path, c, e) != 0) return -1;
    if (read_padding_idx(root, path, c, e) != 0) return -1;
    if (read_rope_settings(root, path, c, e) != 0) return -1;

    if (!head_dim_given && !qwen3 && c->num_attention_heads > 0 && c->hidden_size % c->num_attention_heads == 0)
        c->head_dim = c->hidden_size / c->num_attention_heads;
    char where[1200];
    snprintf(where, sizeof where, "config '%.1000s'", path);
    return llama_config_check(c, where, e);
}

int config_json_parse(const char *text, size_t len, const char *path, LlamaConfig *c, SeqErr *e) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return seq_err(e, "config '%s' is not valid JSON: %s at line %d, column %d", path, err.text, err.line, err.column);
    int rc = config_from_json(root, path, c, e);
    json_decref(root);
    return rc;
}

int config_json_read(const char *path, LlamaConfig *c, SeqErr *e) {
    unsigned char *text;
    size_t len;
    if (read_regular_file(path, "model config", CONFIG_MAX_BYTES, &text, &len, e) != 0) return -1;
    int rc = config_json_parse((const char *)text, len, path, c, e);
    xfree(text);
    return rc;
}

/* The JSON object in the file at path, or NULL with "<prefix>'path' is not a JSON object: <fix>"
 * (or the reader's line) */
static json_t *read_object(const char *path, const char *prefix, const char *fix, SeqErr *e) {
    unsigned char *text;
    size_t len;
    if (read_regular_file(path, "model config", CONFIG_MAX_BYTES, &text, &len, e) != 0) return NULL;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)text, len, 0, &jerr);
    xfree(text);
    if (root && json_is_object(root)) return root;
    if (root) json_decref(root);
    seq_err(e, "%s'%s' is not a JSON object: %s", prefix, path, fix);
    return NULL;
}

int config_json_eos_token_id(const char *path, int *eos, SeqErr *e) {
    json_t *root = read_object(path, "config ", "pass --eot ID", e);
    if (!root) return -1;
    int rc = 1;
    json_t *v = field(root, "eos_token_id");
    if (v && json_is_array(v) && json_array_size(v) == 1) v = json_array_get(v, 0);
    if (!v) {
        rc = 1;
    } else if (json_is_array(v)) {
        rc = seq_err(e, "config '%s' lists %zu eos_token_id values: pass the one that ends documents with --eot ID",
                     path, json_array_size(v));
    } else if (!json_is_integer(v)) {
        rc = seq_err(e, "config '%s': \"eos_token_id\" must be a non-negative JSON integer, found %s: pass --eot ID",
                     path, json_type_name(v));
    } else if (json_integer_value(v) < 0 || json_integer_value(v) >= INT_MAX) { /* an integer: its size is wrong */
        rc = seq_err(e, "config '%s': \"eos_token_id\" %lld is out of range (a token id is 0 to %d): pass --eot ID",
                     path, (long long)json_integer_value(v), INT_MAX - 1);
    } else {
        *eos = (int)json_integer_value(v);
        rc = 0;
    }
    json_decref(root);
    return rc;
}

void config_json_load(const char *path, LlamaConfig *c) {
    SeqErr e;
    if (config_json_read(path, c, &e) != 0) die_collective("%s", e.msg);
}

/* The shortest decimal that reads back as the same float, as a double (so that 1e-6f is written
 * as 1e-06 rather than 9.9999999747524271e-07). */
static double float_as_short_decimal(float x) {
    char buf[64];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return strtod(buf, NULL);
}

int config_json_save(const char *path, const LlamaConfig *c, SeqErr *e) {
    json_t *root = json_object();
    const int mistral = c->family == LLAMA_FAMILY_MISTRAL, qwen2 = c->family == LLAMA_FAMILY_QWEN2,
              qwen3 = c->family == LLAMA_FAMILY_QWEN3;
    json_object_set_new(root, "architectures", json_pack("[s]", mistral ? "MistralForCausalLM"
                                                                : qwen2 ? "Qwen2ForCausalLM"
                                                                : qwen3 ? "Qwen3ForCausalLM"
                                                                        : "LlamaForCausalLM"));
    json_object_set_new(root, "model_type", json_string(mistral ? "mistral" : qwen2 ? "qwen2" : qwen3 ? "qwen3" : "llama"));
    if (mistral) json_object_set_new(root, "sliding_window", c->sliding_window ? json_integer(c->sliding_window) : json_null());
    if (qwen2 || qwen3) {
        json_object_set_new(root, "use_sliding_window", json_boolean(c->qwen_use_window));
        json_object_set_new(root, "sliding_window", c->qwen_window ? json_integer(c->qwen_window) : json_null());
        json_object_set_new(root, "max_window_layers", json_integer(c->qwen_max_window_layers));
    }
    json_object_set_new(root, "hidden_act", json_string("silu"));
    json_object_set_new(root, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(root, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(root, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(root, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(root, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(root, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(root, "head_dim", json_integer(c->head_dim));
    json_object_set_new(root, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(root, "rms_norm_eps", json_real(float_as_short_decimal(c->rms_norm_eps)));
    json_object_set_new(root, "rope_theta", json_real(c->rope_theta));
    json_t *rope = json_pack("{s:f, s:s}", "rope_theta", c->rope_theta, "rope_type", llama_rope_type_name(c->rope_type));
    if (c->rope_type != LLAMA_ROPE_DEFAULT) json_object_set_new(rope, "factor", json_real(c->rope_factor));
    if (c->rope_type == LLAMA_ROPE_LLAMA3) {
        json_object_set_new(rope, "low_freq_factor", json_real(c->rope_low_freq_factor));
        json_object_set_new(rope, "high_freq_factor", json_real(c->rope_high_freq_factor));
        json_object_set_new(rope, "original_max_position_embeddings",
                            json_integer(c->rope_original_max_position_embeddings));
    }
    if (c->rope_type == LLAMA_ROPE_DEFAULT) { /* transformers 4 */
        json_object_set_new(root, "rope_scaling", json_null());
    } else {
        json_t *scaling = json_deep_copy(rope);
        json_object_del(scaling, "rope_theta");
        json_object_set_new(root, "rope_scaling", scaling);
    }
    json_object_set_new(root, "rope_parameters", rope); /* transformers 5 */
    json_object_set_new(root, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(root, "torch_dtype", json_string("float32"));
    const int llama = !mistral && !qwen2 && !qwen3; /* the others have no mlp_bias, a Qwen3 attention_bias */
    if (llama || qwen3) json_object_set_new(root, "attention_bias", json_boolean(c->o_bias));
    json_object_set_new(root, "attention_dropout", json_real(0.0));
    if (llama) json_object_set_new(root, "mlp_bias", json_false());
    json_object_set_new(root, "initializer_range", json_real(0.02));
    json_object_set_new(root, "use_cache", json_true());
    if (c->hf_carried[0]) { /* the token ids (and initializer_range) of the config the model came from */
        json_t *kept = json_loads(c->hf_carried, 0, NULL);
        if (!json_is_object(kept)) {
            json_decref(kept);
            json_decref(root);
            return seq_err(e, "cannot write '%s': the kept config fields are not a JSON object", path);
        }
        json_object_update(root, kept);
        json_decref(kept);
    }

    /* 17 significant digits would print 1e-06 as 9.9999999999999995e-07; 15 keep every float
     * exact and every realistic rope_theta. */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (!text) return seq_err(e, "cannot encode model config for '%s' as JSON (out of memory?)", path);
    int rc = atomic_write_text(path, text, e);
    free(text);
    return rc;
}

int config_json_eos_ids(const char *path, int *ids, int max, int *n, SeqErr *e) {
    *n = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return 1;
    json_t *root = read_object(path, "", "fix it, or give --stop-token ID", e);
    if (!root) return -1;
    json_t *v = field(root, "eos_token_id");
    const size_t count = !v ? 0 : json_is_array(v) ? json_array_size(v) : 1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        json_t *id = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT_MAX)
            rc = seq_err(e, "'%s': \"eos_token_id\" must be a non-negative integer or a list of them: fix it, or give "
                         "--stop-token ID", path);
        else if (*n >= max)
            rc = seq_err(e, "'%s' lists more than %d eos_token_id values: give --stop-token ID", path, max);
        else
            ids[(*n)++] = (int)json_integer_value(id);
    }
    json_decref(root);
    return rc;
}
