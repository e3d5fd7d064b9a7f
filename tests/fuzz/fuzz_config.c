/* libFuzzer target for the config.json loader (config_json_parse, with llama_config_check): any
 * input must give a configuration that passes validation or a one-line error. An accepted
 * configuration must have the invariants the model relies on. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/config_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    LlamaConfig c;
    SeqErr e;
    if (config_json_parse((const char *)data, size, "fuzz/config.json", &c, &e) != 0) {
        if (strchr(e.msg, '\n') || !e.msg[0]) abort();
        return 0;
    }
    if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.head_dim <= 0 ||
        c.head_dim % 2 != 0 || c.num_attention_heads % c.num_key_value_heads != 0 || c.num_hidden_layers <= 0 ||
        c.vocab_size <= 0)
        abort(); /* validation let an unusable configuration through */
    if ((c.qk_norm && c.family != LLAMA_FAMILY_QWEN3) || (c.o_bias && !c.qkv_bias) || c.sliding_window < 0 ||
        (c.family == LLAMA_FAMILY_QWEN2 && !c.qkv_bias))
        abort(); /* a family read with options it does not have */
    const int windowed = llama_windowed_layers(&c); /* the window reaches some layer, or none */
    if ((c.sliding_window > 0) != (windowed > 0) || (c.family == LLAMA_FAMILY_LLAMA && c.sliding_window) ||
        (c.family == LLAMA_FAMILY_MISTRAL && windowed && windowed != c.num_hidden_layers))
        abort();
    return 0;
}
