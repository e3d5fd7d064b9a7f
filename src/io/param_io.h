/* Saving and loading the flat parameter buffer as a Hugging Face safetensors file: one tensor per
 * ParamTable entry, with its HF name and shape, so transformers can load the result directly. */
#ifndef SEQPAR_PARAM_IO_H
#define SEQPAR_PARAM_IO_H

#include "core/common.h"
#include "core/param_table.h"

/* Writes every tensor of the table as F32 (metadata format "pt"), atomically (st_write_f32).
 * F32 round-trips bit-exactly through params_load_safetensors. */
void params_save_safetensors(const char *path, const ParamTable *t, const float *params);

/* Reads every tensor of the table from `path` (F32, BF16 or F16, converted to float), checking its
 * shape. A tensor of the table missing from the file dies naming it; tensors in the file that the
 * table lacks are ignored. A NaN or Inf weight is an error naming the tensor. With tie_word_embeddings, "lm_head.weight" in the file is ignored (the
 * table built for a tied model has no lm_head; should it have one, it gets a copy of
 * model.embed_tokens.weight). */
int params_read_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings, SeqErr *e);
/* Returns 0, or -1 with a one-line message in *e (above: "dies" means that message); the
 * dying form params_load_safetensors ends the program with it instead. */
void params_load_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings);

#endif
