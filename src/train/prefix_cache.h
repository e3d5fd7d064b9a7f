/* `seqpar sample --prefix-cache DIR`: a prompt's key/value cache kept between runs. A run that
 * prefills a prompt writes each rank's cache shard to its own file in DIR, then rank 0 writes
 * DIR/manifest.txt naming them; a later run whose prompt starts with tokens of the cached prompt
 * loads the shards (the rows of that common prefix) and prefills only the rest against them.
 *
 * DIR/manifest.txt (text, one item a line):
 *   seqpar-prefix-cache 1
 *   model HEX          the model's identity: a 64-bit hash of its parameters (as loaded, fp32) and
 *                      of its config.json text (prefix_model_id)
 *   dtype f32|bf16     the cache's element type (bf16: --precision bf16's cache, its words as kept)
 *   strategy NAME      the strategy that made it ("none": one process without --strategy)
 *   ranks N
 *   shape L HKV D      layers, key/value heads, head dim
 *   tokens P
 *   ids A,B,...        the cached prompt's token ids
 *   shard R ROWS FILE CRC POSITIONS   for each rank R: its file, the file's CRC-32 and the
 *                      positions of its rows in file order, as runs ("0-3,12-15")
 *   crc32 0xHEX        the CRC-32 of every line above (the text up to this line)
 * A shard file: "SQPKVC01", then int32 version 1, rank, ranks, layers, kv heads, head dim, rows,
 * dtype (0: f32, 1: bf16); rows int32 positions; the keys (layers, rows, Hkv d) and values alike
 * (4 or 2 bytes a value), after RoPE, little-endian; a trailing uint32 CRC-32 of everything before it.
 * Saving is atomic as a whole: each rank writes a new file (a name no earlier save used) by
 * atomic rename, then rank 0 replaces the manifest the same way, then each rank removes the file
 * the old manifest named: a crash leaves the old manifest and its files, or the new ones.
 * Every problem is returned as one line naming DIR, the problem and the fix; the caller decides
 * how to end (cli/cmd_sample.c ends every rank alike).
 * Not here: which rows a rank keeps (train/dist_generate.h) or the flags (cli/cmd_sample.c). */
#ifndef SEQPAR_PREFIX_CACHE_H
#define SEQPAR_PREFIX_CACHE_H

#include <stdint.h>

#include "core/common.h"
#include "model/generate.h"
#include "model/llama.h"
#include "train/dist_generate.h"

/* What a cache must match to be used. */
typedef struct {
    uint64_t model;       /* prefix_model_id */
    const char *dtype;    /* "f32" or "bf16" */
    const char *strategy; /* the registry's name, or "none" */
    int ranks;
    int layers, kv_heads, head_dim;
} PrefixIdent;

typedef struct {
    int found;      /* DIR held a manifest */
    int n_tokens;   /* the cached prompt */
    int *tokens;
    int common;     /* tokens the prompt shares with the cached prompt from its start */
    int reuse;      /* rows loaded: the common prefix, at most prompt length - 1 (the last prompt
                     * token runs again to give its logits) */
    int save;       /* the run writes its prompt's cache: DIR has none, or the prompt is not a
                     * prefix of the cached prompt */
    int ranks;
    char **files;   /* (ranks) */
    uint32_t *crc;  /* (ranks) */
    int *rows;      /* (ranks) rows of each shard */
    int **positions; /* (ranks) (rows) */
} PrefixCache;

/* The model's identity: its parameters (fp32, as loaded) and the text of model_dir/config.json
 * hashed; -1 with one line if config.json cannot be read. */
int prefix_model_id(const LlamaModel *m, const char *model_dir, uint64_t *id, SeqErr *e);

/* Reads DIR/manifest.txt, if any, for a prompt (P tokens): pc->found 0 without one (a DIR that
 * does not exist is created). -1 with one line when it is damaged or made for another model,
 * dtype, strategy or rank count. */
int prefix_cache_open(PrefixCache *pc, const char *dir, const PrefixIdent *id, const int *prompt, int P, SeqErr *e);
void prefix_cache_free(PrefixCache *pc);
/* The rows of `rank`'s shard at positions below pc->reuse. */
int prefix_cache_rows_kept(const PrefixCache *pc, int rank);

/* Loads this rank's rows below pc->reuse into g's shard (grown where the rows and the tokens still
 * to come need it), in file order. Then prefix_cache_loaded (collective) once every rank loaded. */
int prefix_cache_load_dist(const PrefixCache *pc, const char *dir, DistGenerator *g, long still_to_come, SeqErr *e);
/* After every rank's load: the shards' counts exchanged, the generator at position pc->reuse. */
void prefix_cache_loaded(const PrefixCache *pc, DistGenerator *g);
/* One process: rows 0..pc->reuse-1 into g's own cache, g at position pc->reuse. */
int prefix_cache_load_one(const PrefixCache *pc, const char *dir, Generator *g, SeqErr *e);

/* Writes the cache of prompt (P tokens, all of it in the cache now) to DIR (collective on ranks:
 * every rank writes its shard, rank 0 the manifest). Returns 0 on every rank, or -1 with the
 * failure of the lowest failing rank on every rank. */
int prefix_cache_save_dist(PrefixCache *pc, const char *dir, const PrefixIdent *id, const int *prompt, int P,
                           DistGenerator *g, SeqErr *e);
int prefix_cache_save_one(PrefixCache *pc, const char *dir, const PrefixIdent *id, const int *prompt, int P,
                          const Generator *g, SeqErr *e);

#endif
