/* Token sources for training and for `seqpar grad`: llm.c token shards and raw text as bytes. */
#ifndef SEQPAR_TOKENS_H
#define SEQPAR_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

typedef enum { TOKENS_AUTO, TOKENS_LLMC, TOKENS_TEXT } TokensFormat;

typedef struct {
    uint32_t *tokens; /* all tokens of the file, in memory */
    size_t n;
    uint32_t max_token; /* largest token id present (to check against vocab_size) */
    TokensFormat format; /* the format actually read */
} TokenData;

/* Loads a token file.
 * llm.c shard: 256 int32 header; header[0] = magic, header[1] = version, header[2] = token
 *   count; magic 20240520 version 1 -> uint16 tokens, magic 20240801 version 7 -> uint32 tokens.
 *   Wrong magic, unknown version, or a token count that disagrees with the file size dies with
 *   a one-line error naming the file, what was found and what was expected.
 * text: every byte is a token (vocabulary 256).
 * TOKENS_AUTO: a file ending in ".txt" is text, anything else must be an llm.c shard.
 * A missing or empty file, or one that is not a regular file (a FIFO is refused without
 * blocking), dies naming it; so does a token id of INT32_MAX or more.
 * tokens_read returns 0, or -1 with that one-line message in *e (td then needs no tokens_free);
 * tokens_load dies with it. */
int tokens_read(const char *path, TokensFormat format, TokenData *td, SeqErr *e);
void tokens_load(const char *path, TokensFormat format, TokenData *td);
/* Checks a token file as tokens_read does, reading only an llm.c shard's header (and sizes): *count
 * is its number of tokens. 0, or -1 with a one-line message. */
int tokens_probe(const char *path, TokensFormat format, size_t *count, SeqErr *e);
/* 0 if every token id is below vocab_size, else -1 with a message naming the file, the id and
 * the vocabulary size. */
int tokens_check_vocab(const TokenData *td, const char *path, int vocab_size, SeqErr *e);
void tokens_free(TokenData *td);

/* Writes an llm.c shard (version 1 with uint16 tokens if every token < 65536, else version 7)
 * atomically. Used by tests and `seqpar` tools. Returns 0, or -1 with a one-line message. */
int tokens_write_llmc(const char *path, const uint32_t *tokens, size_t n, SeqErr *e);

/* Parses "auto" / "llmc" / "text"; dies naming the value and the choices otherwise. */
TokensFormat tokens_format_parse(const char *s);

#endif
