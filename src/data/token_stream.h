/* A token stream over one or more token files (llm.c shards or text), read in order as one
 * concatenated sequence of tokens: training data (`seqpar train --data`) and held-out validation
 * data (`--val-data`). Only the shard being read is in memory; a sequence that runs past the end of
 * a shard continues in the next one. The position is a cursor (shard index, token offset), which
 * checkpoints save so that a resumed run reads exactly what an uninterrupted one would.
 *
 * What a source names:
 *   a file        that file alone;
 *   a directory   its *.bin files (llm.c shards), sorted by name. Names holding "_val_" (llm.c's
 *                 naming, e.g. fineweb_val_000000.bin) are held-out shards: training skips them,
 *                 validation reads only them when there are any;
 *   a glob        (holds *, ? or [) the regular files it matches, sorted by name.
 * Every file is checked when the stream opens (header, size), so a bad shard fails at start-up;
 * token ids are checked against the vocabulary when a shard is loaded.
 *
 * Not here: shuffling (shards and sequences are read in order, as llm.c's loader does without
 * shuffling) and document packing. */
#ifndef SEQPAR_TOKEN_STREAM_H
#define SEQPAR_TOKEN_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "data/tokens.h"

typedef enum { STREAM_TRAIN, STREAM_VAL } StreamRole;

typedef struct {
    char *source;       /* what the user named */
    int n_shards;
    char **paths;       /* (n_shards), sorted */
    size_t *counts;     /* (n_shards) tokens in each */
    size_t total;       /* tokens in all shards */
    TokensFormat format;
    int vocab_size;     /* token ids must be below it (0: not checked) */
    int loaded;         /* index of the shard in `data`, -1 for none */
    TokenData data;
    uint64_t shard;     /* cursor: the shard of the next sequence's first token */
    uint64_t offset;    /* ... and its offset in that shard */
} TokenStream;

/* Resolves `source` (see above) and checks every file's header. Returns 0, or -1 with one line
 * naming the source or file and the fix (the stream then needs no token_stream_close). */
int token_stream_open(TokenStream *ts, const char *source, TokensFormat format, StreamRole role, SeqErr *e);
void token_stream_close(TokenStream *ts);

/* The largest token id in all shards (reads every shard once; for choosing a vocabulary). */
int token_stream_max_token(TokenStream *ts, uint32_t *max_token, SeqErr *e);

/* One sequence: inputs = tokens[c .. c+S-1], targets = tokens[c+1 .. c+S] of the concatenated
 * stream at cursor c, which then advances by S. When fewer than S+1 tokens remain, the stream
 * starts again at its first token (the next epoch). The stream must hold at least S+1 tokens.
 * Returns 0, or -1 with one line (a shard that changed since it was opened, a token id at or above
 * vocab_size). */
int token_stream_next(TokenStream *ts, int S, int *inputs, int *targets, SeqErr *e);

/* Moves the cursor (from a checkpoint). -1 with one line if it lies outside the stream. */
int token_stream_seek(TokenStream *ts, uint64_t shard, uint64_t offset, SeqErr *e);

/* Reads the stream's first n_seqs sequences of S tokens once, from its start (every token checked
 * against the vocabulary, as token_stream_next does), and sets *scored to the targets they leave to
 * score (packed: eot >= 0, the target after each end-of-text dropped, pack_mask_targets). 0, or -1
 * with one line. */
int token_stream_scan(TokenStream *ts, long n_seqs, int S, int eot, long *scored, SeqErr *e);

/* 1 if `source` is a directory holding held-out (*_val_*.bin) shards, else 0. */
int token_stream_dir_has_val(const char *source);

/* A CRC-32 over each shard's file name (not its directory), token count and first and last 4 KiB:
 * the same for the same files wherever they lie (data moved to node-local scratch, a path spelt
 * another way), different for other files or a shard rewritten with other tokens of the same count
 * (what a resume compares). 0, or -1 with one line if a shard cannot be read. */
int token_stream_fingerprint(const TokenStream *ts, uint32_t *crc, SeqErr *e);

/* "N shards, T tokens" style summary, for settings and headers. */
void token_stream_describe(const TokenStream *ts, char *buf, size_t n);

#endif
