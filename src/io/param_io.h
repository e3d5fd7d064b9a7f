/* Saving and loading the flat parameter buffer as a Hugging Face safetensors file: one tensor per
 * ParamTable entry, with its HF name and shape, so transformers can load the result directly. */
#ifndef SEQPAR_PARAM_IO_H
#define SEQPAR_PARAM_IO_H

#include "core/common.h"
#include <stdint.h>

#include "core/param_table.h"
#include "io/safetensors.h"

/* Writes every tensor of the table as F32 (metadata format "pt"), atomically (st_write_f32).
 * F32 round-trips bit-exactly through params_load_safetensors. Returns 0, or -1 with a one-line
 * message (an inconsistent table, a failed write). */
int params_save_safetensors(const char *path, const ParamTable *t, const float *params, SeqErr *e);
/* The same with the elements read from src piece by piece (indexed by the flat buffer's offsets):
 * a file written without the data held whole. */
int params_save_safetensors_src(const char *path, const ParamTable *t, const StSource *src, SeqErr *e);

/* Reads every tensor of the table from `path` (F32, BF16 or F16, converted to float), checking its
 * shape. A tensor of the table missing from the file dies naming it; a tensor in the file that the
 * table lacks is an error naming it (except RoPE inv_freq buffers of old conversions, which
 * transformers ignores too). With tie_word_embeddings, an "lm_head.weight" in the file must equal
 * model.embed_tokens.weight bit for bit (a redundant copy), else it is an error naming it. A NaN or Inf weight is an error naming the tensor. With tie_word_embeddings, "lm_head.weight" in the file is ignored (the
 * table built for a tied model has no lm_head; should it have one, it gets a copy of
 * model.embed_tokens.weight). */
int params_read_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings, SeqErr *e);
/* Returns 0, or -1 with a one-line message in *e (above: "dies" means that message); the
 * dying form params_load_safetensors ends the program with it instead. */
void params_load_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings);

#define ST_INDEX_NAME "model.safetensors.index.json"

/* {"bytes": N, "crc32": "0x..."} of a file just written (a jansson object the caller owns), as a
 * checkpoint's state and a sharded index record each file; NULL with a message naming the file
 * (`what`) when it cannot be read back. */
struct json_t;
struct json_t *file_size_crc_json(const char *path, const char *what, SeqErr *e);

/* The readers below fill elements [lo, hi) of params ([0, t->total): all of it; a ZeRO-3 rank's
 * shard: the rest is never written, so its pages need no memory); every tensor is still checked
 * for presence and shape, values (finite, a tied model's stored lm_head copy) in the part read. */
/* params_read_safetensors over a part. */
int params_read_safetensors_part(const char *path, const ParamTable *t, float *params, int tie_word_embeddings,
                                 size_t lo, size_t hi, SeqErr *e);
/* Reads DIR/model.safetensors.index.json (Hugging Face's sharded layout: "weight_map" maps each
 * tensor name to a shard file in DIR) and every shard it names: each table tensor exactly once,
 * in the shard the index names; a missing shard, a missing tensor, a tensor the table lacks or a
 * tensor in two shards is an error naming it. */
int params_read_sharded(const char *dir, const ParamTable *t, float *params, int tie_word_embeddings, size_t lo,
                        size_t hi, SeqErr *e);
/* The weights of a Hugging Face model directory: model.safetensors or the sharded index (both:
 * an error). Returns 0 when loaded, -1 with a message, or 1 when DIR holds no weights at all;
 * pytorch_model*.bin without safetensors is an error saying how to convert. */
int params_read_dir(const char *dir, const ParamTable *t, float *params, int tie_word_embeddings, size_t lo,
                    size_t hi, SeqErr *e);

/* Writes the weights into DIR as transformers' save_pretrained does: model.safetensors when they
 * fit in max_shard_bytes (0: no limit), else model-0000k-of-0000n.safetensors shards of at most
 * that size (a larger tensor gets a shard alone) and model.safetensors.index.json, whose
 * metadata also records each shard's size and CRC-32 (verified on load). Every file is written
 * atomically. Returns the number of weight files (1: a single model.safetensors), or -1 with a
 * one-line message (files this call wrote before the failure stay; the caller writes into a
 * temporary directory). */
/* The weights come from params, or (params NULL) from src (indexed by the flat buffer's offsets)
 * piece by piece: a sharded model written without being held whole. */
int params_save_dir(const char *dir, const ParamTable *t, const float *params, const StSource *src,
                    uint64_t max_shard_bytes, SeqErr *e);

#endif
