/* Reads and writes Hugging Face config.json files for Llama models (with jansson). */
#ifndef SEQPAR_CONFIG_JSON_H
#define SEQPAR_CONFIG_JSON_H

#include <stddef.h>

#include "core/common.h"
#include "model/config.h"

/* Loads config.json at `path` into *c and validates it (llama_config_validate). Missing optional
 * fields take the Hugging Face defaults (num_key_value_heads = num_attention_heads,
 * rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = false, head_dim = hidden/heads,
 * max_position_embeddings = 2048). Missing required fields, wrong JSON types or unparsable JSON
 * die with a one-line error naming the file, the field and the fix.
 * config_json_read returns 0, or -1 with that message in *e (a FIFO or other non-regular file is
 * refused without blocking); config_json_parse does the same for JSON text already in memory
 * (`path` only names it in messages); config_json_load dies with the message on every rank. */
int config_json_read(const char *path, LlamaConfig *c, SeqErr *e);
int config_json_parse(const char *text, size_t len, const char *path, LlamaConfig *c, SeqErr *e);
void config_json_load(const char *path, LlamaConfig *c);

/* The end-of-text token id of config.json at `path` ("eos_token_id", an integer or a list of one)
 * for packing documents: 0 with *eos set, 1 when the config has none, -1 with a one-line message
 * in *e (unreadable file, a list of several ids, not an integer). */
int config_json_eos_token_id(const char *path, int *eos, SeqErr *e);

/* Writes an HF-loadable config.json (architectures LlamaForCausalLM, model_type llama,
 * hidden_act silu, torch_dtype float32, ...) atomically (temp file, fsync, rename). Returns 0, or
 * -1 with a one-line message. */
int config_json_save(const char *path, const LlamaConfig *c, SeqErr *e);

/* The ids generation stops at, as transformers' generate reads them: "eos_token_id" of the JSON
 * file at `path` (generation_config.json or config.json), an integer or a list of them (at most
 * max), into ids[0..*n) (*n = 0 where it is absent or null). 0, 1 where the file does not exist,
 * -1 with one line (unreadable, not JSON, an id that is not a non-negative integer). */
int config_json_eos_ids(const char *path, int *ids, int max, int *n, SeqErr *e);

#endif
