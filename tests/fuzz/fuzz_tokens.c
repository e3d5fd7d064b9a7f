/* libFuzzer target for the token-file loader (tokens_read, tokens_check_vocab). The first byte
 * picks the format (even: llm.c shard, odd: text); the rest is the file. Any input must give
 * tokens whose ids and count agree with what was reported, or a one-line error. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/tokens.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    TokensFormat fmt = (data[0] & 1) ? TOKENS_TEXT : TOKENS_LLMC;
    TokenData td;
    SeqErr e;
    if (tokens_read(fuzz_memfile(data + 1, size - 1), fmt, &td, &e) != 0) {
        if (strchr(e.msg, '\n') || !e.msg[0]) abort();
        return 0;
    }
    uint32_t max = 0;
    for (size_t i = 0; i < td.n; i++)
        if (td.tokens[i] > max) max = td.tokens[i];
    if (td.n == 0 || max != td.max_token || max >= (uint32_t)INT32_MAX) abort();
    if (tokens_check_vocab(&td, "fuzz", (int)max + 1, &e) != 0 || (max > 0 && tokens_check_vocab(&td, "fuzz", (int)max, &e) == 0))
        abort();
    tokens_free(&td);
    return 0;
}
