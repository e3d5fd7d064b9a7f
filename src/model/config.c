/* Validation of a Llama configuration: every check that a model built from it would otherwise
 * trip over later with an obscure failure (division by zero, a shape that does not split into
 * heads, grouped-query attention that does not group, sizes whose products overflow) is made
 * here, with one clear message returned to the caller. */
#include "model/config.h"

#include <math.h>
#include <stdio.h>

#include "core/common.h"

/* Limits far above any real Llama (the largest have ~126 layers, 128 heads, head_dim 256) that
 * keep every size product seqpar computes inside its integer types. */
#define MAX_LAYERS (1 << 16)
#define MAX_HEADS (1 << 16)
#define MAX_HEAD_DIM (1 << 16)
#define MAX_PARAMS 0x1p48 /* 2.8e14 parameters: ~1 PB of float32 */

/* The divisor of `n` nearest to `near` (ties go to the smaller), for suggesting a head count.
 * Walks divisor pairs up to sqrt(n) in 64-bit arithmetic: no overflow, at most 46341 steps. */
static int nearest_divisor(int n, int near) {
    if (n <= 0) return 1;
    long long best = 1, target = near;
    for (long long i = 1; i * i <= n; i++) {
        if (n % i != 0) continue;
        long long pair[2] = { i, n / i };
        for (int k = 0; k < 2; k++) {
            long long d = pair[k], dd = d > target ? d - target : target - d;
            long long bd = best > target ? best - target : target - best;
            if (dd < bd || (dd == bd && d < best)) best = d;
        }
    }
    return (int)best;
}

int llama_even_head_dim(int quotient) { return quotient < 2 ? 2 : quotient - quotient % 2; }

static int require_positive(int value, const char *field, const char *where, SeqErr *e) {
    if (value <= 0) return seq_err(e, "%s: %s is %d; it must be a positive integer", where, field, value);
    return 0;
}

static int require_at_most(int value, int limit, const char *field, const char *where, SeqErr *e) {
    if (value > limit)
        return seq_err(e, "%s: %s is %d, more than the %d seqpar supports (no real Llama comes near): check the value",
                       where, field, value, limit);
    return 0;
}

int llama_config_check(const LlamaConfig *c, const char *where, SeqErr *e) {
    if (require_positive(c->hidden_size, "hidden_size", where, e) ||
        require_positive(c->intermediate_size, "intermediate_size", where, e) ||
        require_positive(c->num_attention_heads, "num_attention_heads", where, e) ||
        require_positive(c->num_key_value_heads, "num_key_value_heads", where, e) ||
        require_positive(c->num_hidden_layers, "num_hidden_layers", where, e) ||
        require_positive(c->vocab_size, "vocab_size", where, e) ||
        require_positive(c->max_position_embeddings, "max_position_embeddings", where, e) ||
        require_at_most(c->num_hidden_layers, MAX_LAYERS, "num_hidden_layers", where, e) ||
        require_at_most(c->num_attention_heads, MAX_HEADS, "num_attention_heads", where, e) ||
        require_at_most(c->num_key_value_heads, MAX_HEADS, "num_key_value_heads", where, e) ||
        require_at_most(c->head_dim, MAX_HEAD_DIM, "head_dim", where, e))
        return -1;

    /* head_dim is implicit only when it is unset (0: the callers fill in hidden_size /
     * num_attention_heads where the heads divide the hidden size): then the heads must divide it.
     * Any value that was set is explicit, hidden_size / num_attention_heads rounded down included,
     * as transformers reads config.json's head_dim (the q/k/v projections are heads x head_dim wide,
     * o_proj maps that back to hidden_size). */
    int heads = c->num_attention_heads, divides = c->hidden_size % heads == 0;
    if (c->head_dim == 0 && !divides)
        return seq_err(e, "%s: num_attention_heads (%d) does not divide hidden_size (%d), so head_dim cannot be "
                       "derived: choose a head count that divides the hidden size (the nearest is %d), or set head_dim "
                       "to a positive even value (e.g. %d)", where, heads, c->hidden_size,
                       nearest_divisor(c->hidden_size, heads), llama_even_head_dim(c->hidden_size / heads));
    if (c->head_dim <= 0) {
        if (divides)
            return seq_err(e, "%s: head_dim is %d; it must be positive (leave it out to use hidden_size / "
                           "num_attention_heads = %d)", where, c->head_dim, c->hidden_size / heads);
        return seq_err(e, "%s: head_dim is %d; it must be a positive even value (e.g. %d)", where, c->head_dim,
                       llama_even_head_dim(c->hidden_size / heads));
    }
    if (c->head_dim % 2 != 0)
        return seq_err(e, "%s: head_dim is %d; rotary position embeddings need an even head_dim", where, c->head_dim);
    if (heads % c->num_key_value_heads != 0)
        return seq_err(e, "%s: num_key_value_heads (%d) does not divide num_attention_heads (%d): grouped-query "
                       "attention needs every KV head to serve the same number of query heads; use a divisor of %d",
                       where, c->num_key_value_heads, heads, heads);
    if (c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1)
        return seq_err(e, "%s: tie_word_embeddings is %d; it must be 0 or 1", where, c->tie_word_embeddings);
    if (!(c->rms_norm_eps > 0.0f) || !isfinite(c->rms_norm_eps))
        return seq_err(e, "%s: rms_norm_eps is %g; it must be a positive finite number (Llama uses 1e-5 or 1e-6)",
                       where, (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return seq_err(e, "%s: rope_theta is %g; it must be a positive finite number (Llama uses 10000 or 500000)",
                       where, c->rope_theta);
    if (c->rope_type != LLAMA_ROPE_DEFAULT && c->rope_type != LLAMA_ROPE_LINEAR && c->rope_type != LLAMA_ROPE_LLAMA3)
        return seq_err(e, "%s: rope_type %d is not one seqpar implements (default, linear, llama3)", where, c->rope_type);
    if (c->rope_type != LLAMA_ROPE_DEFAULT && (!(c->rope_factor > 0.0) || !isfinite(c->rope_factor)))
        return seq_err(e, "%s: rope scaling \"factor\" is %g; it must be a positive finite number", where,
                       c->rope_factor);
    if (c->rope_type == LLAMA_ROPE_LLAMA3) {
        if (!isfinite(c->rope_low_freq_factor) || !isfinite(c->rope_high_freq_factor) ||
            !(c->rope_low_freq_factor > 0.0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return seq_err(e, "%s: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, found %g and %g",
                           where, c->rope_low_freq_factor, c->rope_high_freq_factor);
        if (c->rope_original_max_position_embeddings <= 0)
            return seq_err(e, "%s: llama3 rope scaling needs a positive original_max_position_embeddings, found %d",
                           where, c->rope_original_max_position_embeddings);
    }
    /* Every size product in double: exact enough to compare against the limit, cannot overflow. */
    double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    double qd = (double)heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    double per_layer = 2 * D + D * qd * 2 + D * kvd * 2 + 3 * D * F;
    double total = per_layer * c->num_hidden_layers + V * D * (c->tie_word_embeddings ? 1 : 2) + D;
    if (total > MAX_PARAMS)
        return seq_err(e, "%s: the model would have %.3g parameters, more than the %.3g seqpar can index: check "
                       "hidden_size, intermediate_size, vocab_size and num_hidden_layers", where, total, MAX_PARAMS);
    return 0;
}

void llama_config_validate(const LlamaConfig *c, const char *where) {
    /* A pure function of the configuration, so every rank reaches the same verdict:
     * die_collective gives the single clean line without MPI_Abort noise. */
    SeqErr e;
    if (llama_config_check(c, where, &e) != 0) die_collective("%s", e.msg);
}

int llama_layer_window(const LlamaConfig *c, int l) {
    if (c->sliding_window <= 0) return 0;
    if (c->family == LLAMA_FAMILY_QWEN2 || c->family == LLAMA_FAMILY_QWEN3)
        return l >= c->qwen_max_window_layers ? c->sliding_window : 0;
    return c->sliding_window;
}

int llama_windowed_layers(const LlamaConfig *c) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += llama_layer_window(c, l) > 0;
    return n;
}

const char *llama_rope_type_name(int rope_type) {
    switch (rope_type) {
    case LLAMA_ROPE_LINEAR: return "linear";
    case LLAMA_ROPE_LLAMA3: return "llama3";
    default: return "default";
    }
}

void llama_describe_family(const LlamaConfig *c, char *buf, size_t n) {
    const char *name = c->family == LLAMA_FAMILY_MISTRAL ? "Mistral"
                       : c->family == LLAMA_FAMILY_QWEN2 ? "Qwen2"
                       : c->family == LLAMA_FAMILY_QWEN3 ? "Qwen3"
                                                         : "Llama";
    char opts[96] = "";
    size_t len = 0;
    if (c->qk_norm) len += (size_t)snprintf(opts + len, sizeof opts - len, ", q/k norms");
    if (c->qkv_bias) len += (size_t)snprintf(opts + len, sizeof opts - len, ", %s biases", c->o_bias ? "q, k, v, o" : "q, k, v");
    const int windowed = llama_windowed_layers(c);
    if (windowed == c->num_hidden_layers && windowed > 0)
        snprintf(opts + len, sizeof opts - len, ", window %d", c->sliding_window);
    else if (windowed == 1)
        snprintf(opts + len, sizeof opts - len, ", window %d on layer %d", c->sliding_window, c->num_hidden_layers - 1);
    else if (windowed > 0)
        snprintf(opts + len, sizeof opts - len, ", window %d on layers %d-%d", c->sliding_window,
                 c->num_hidden_layers - windowed, c->num_hidden_layers - 1);
    if (opts[0]) snprintf(buf, n, "%s (%s)", name, opts + 2);
    else snprintf(buf, n, "%s", name);
}

double llama_rope_inv_freq(const LlamaConfig *c, int j) {
    double inv_freq = pow(c->rope_theta, -2.0 * j / (double)c->head_dim); /* as rope_tables */
    if (c->rope_type == LLAMA_ROPE_LINEAR) return inv_freq / c->rope_factor;
    if (c->rope_type != LLAMA_ROPE_LLAMA3) return inv_freq;
    double factor = c->rope_factor, low = c->rope_low_freq_factor, high = c->rope_high_freq_factor;
    double old_len = (double)c->rope_original_max_position_embeddings;
    double low_freq_wavelen = old_len / low, high_freq_wavelen = old_len / high;
    double wavelen = 2.0 * M_PI / inv_freq;
    if (wavelen > low_freq_wavelen) return inv_freq / factor;
    if (wavelen < high_freq_wavelen) return inv_freq;
    double smooth = (old_len / wavelen - low) / (high - low);
    return (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
}
