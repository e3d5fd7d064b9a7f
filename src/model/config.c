/* Validation of a Llama configuration: every check that a model built from it would otherwise
 * trip over later with an obscure failure (division by zero, a shape that does not split into
 * heads, grouped-query attention that does not group) is made here, with one clear message. */
#include "model/config.h"

#include <math.h>

#include "core/common.h"

/* Validation is a pure function of the configuration, so every rank reaches the same verdict:
 * die_collective gives the single clean line without MPI_Abort noise. */
static void require_positive(int value, const char *field, const char *where) {
    if (value <= 0)
        die_collective("%s: %s is %d; it must be a positive integer", where, field, value);
}

/* The divisor of `n` nearest to `near` (ties go to the smaller), for suggesting a head count. */
static int nearest_divisor(int n, int near) {
    for (int delta = 0; delta <= n; delta++) {
        if (near - delta >= 1 && n % (near - delta) == 0) return near - delta;
        if (near + delta <= n && n % (near + delta) == 0) return near + delta;
    }
    return 1;
}

void llama_config_validate(const LlamaConfig *c, const char *where) {
    require_positive(c->hidden_size, "hidden_size", where);
    require_positive(c->intermediate_size, "intermediate_size", where);
    require_positive(c->num_attention_heads, "num_attention_heads", where);
    require_positive(c->num_key_value_heads, "num_key_value_heads", where);
    require_positive(c->num_hidden_layers, "num_hidden_layers", where);
    require_positive(c->vocab_size, "vocab_size", where);
    require_positive(c->max_position_embeddings, "max_position_embeddings", where);

    /* head_dim is implicit when it is unset (0) or equals the truncated quotient that
     * hidden_size / num_attention_heads produces: then the heads must divide the hidden size. */
    int heads = c->num_attention_heads;
    if (c->hidden_size % heads != 0 && (c->head_dim <= 0 || c->head_dim == c->hidden_size / heads))
        die_collective("%s: num_attention_heads (%d) does not divide hidden_size (%d): choose a head "
                       "count that divides the hidden size (the nearest is %d), or set head_dim explicitly",
                       where, heads, c->hidden_size, nearest_divisor(c->hidden_size, heads));
    if (c->head_dim <= 0)
        die_collective("%s: head_dim is %d; it must be positive (leave it out to use hidden_size / "
                       "num_attention_heads = %d)", where, c->head_dim, c->hidden_size / heads);
    if (c->head_dim % 2 != 0)
        die_collective("%s: head_dim is %d; rotary position embeddings need an even head_dim", where,
                       c->head_dim);
    if (heads % c->num_key_value_heads != 0)
        die_collective("%s: num_key_value_heads (%d) does not divide num_attention_heads (%d): grouped-query "
                       "attention needs every KV head to serve the same number of query heads; use a "
                       "divisor of %d", where, c->num_key_value_heads, heads, heads);
    if (c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1)
        die_collective("%s: tie_word_embeddings is %d; it must be 0 or 1", where, c->tie_word_embeddings);
    if (!(c->rms_norm_eps > 0.0f) || !isfinite(c->rms_norm_eps))
        die_collective("%s: rms_norm_eps is %g; it must be a positive finite number (Llama uses 1e-5 or 1e-6)",
                       where, (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        die_collective("%s: rope_theta is %g; it must be a positive finite number (Llama uses 10000 or 500000)",
                       where, c->rope_theta);
}
