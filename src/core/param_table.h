/* A table describing tensors that live in one flat float buffer (parameters, gradients,
 * optimizer moments share the same layout): HF name, shape, offset, and whether weight decay
 * applies. Optimizers, checkpoint I/O and collectives iterate it instead of hard-coding
 * tensor indices; a range [begin, end) of the flat buffer is a ZeRO shard. */
#ifndef SEQPAR_PARAM_TABLE_H
#define SEQPAR_PARAM_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char name[96];     /* Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* HF shape: Linear weights are [out_features, in_features] */
    size_t offset;     /* first element in the flat buffer */
    size_t numel;
    int no_decay;      /* 1 for norms and embeddings (exempt from weight decay by default) */
} ParamTensor;

typedef struct {
    ParamTensor *t;
    int n;
    size_t total; /* elements in the flat buffer */
} ParamTable;

#endif
