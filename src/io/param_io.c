/* Implementation of the parameter safetensors I/O: maps ParamTable entries to safetensors tensors
 * (names, shapes, offsets into the flat buffer) on top of io/safetensors. */
#include "io/param_io.h"

#include <string.h>

#include "core/common.h"
#include "io/safetensors.h"

static const char LM_HEAD[] = "lm_head.weight";
static const char EMBED[] = "model.embed_tokens.weight";

void params_save_safetensors(const char *path, const ParamTable *t, const float *params) {
    StWriteTensor *w = xcalloc(t->n ? (size_t)t->n : 1, sizeof *w);
    for (int i = 0; i < t->n; i++) {
        const ParamTensor *p = &t->t[i];
        if (p->ndim < 1 || p->ndim > 2) die("tensor %s has %d dimensions: the parameter table supports 1 or 2", p->name, p->ndim);
        if (p->offset + p->numel > t->total)
            die("tensor %s lies outside the parameter buffer (%zu + %zu > %zu): the parameter table is inconsistent",
                p->name, p->offset, p->numel, t->total);
        w[i].name = p->name;
        w[i].data = params + p->offset;
        w[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) w[i].shape[d] = p->shape[d];
    }
    st_write_f32(path, w, t->n, "pt");
    xfree(w);
}

int params_read_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings, SeqErr *e) {
    StFile f;
    if (st_load(path, &f, e) != 0) return -1;
    int lm_head_idx = -1, embed_idx = -1, rc = 0;
    for (int i = 0; i < t->n && rc == 0; i++) {
        const ParamTensor *p = &t->t[i];
        if (strcmp(p->name, EMBED) == 0) embed_idx = i;
        if (tie_word_embeddings && strcmp(p->name, LM_HEAD) == 0) { lm_head_idx = i; continue; }
        if (!st_find(&f, p->name)) {
            if (strcmp(p->name, LM_HEAD) == 0)
                rc = seq_err(e, "tensor %s missing from %s: the weights have tied embeddings; set "
                             "\"tie_word_embeddings\": true in config.json", p->name, path);
            else
                rc = seq_err(e, "tensor %s missing from %s: the weights do not match the model configuration (check "
                             "config.json against the safetensors file)", p->name, path);
        } else if (p->offset + p->numel > t->total) {
            rc = seq_err(e, "tensor %s lies outside the parameter buffer (%zu + %zu > %zu): the parameter table is "
                         "inconsistent", p->name, p->offset, p->numel, t->total);
        } else {
            rc = st_load_tensor(&f, p->name, p->ndim, p->shape, params + p->offset, e);
            if (rc == 0) rc = st_check_finite(params + p->offset, p->numel, p->name, path, e);
        }
    }
    st_close(&f);
    if (rc == 0 && lm_head_idx >= 0) {
        const ParamTensor *h = &t->t[lm_head_idx];
        if (embed_idx < 0 || t->t[embed_idx].numel != h->numel)
            return seq_err(e, "the parameter table has %s but tie_word_embeddings is set and %s is missing or differs "
                           "in size: the parameter table is inconsistent", LM_HEAD, EMBED);
        memcpy(params + h->offset, params + t->t[embed_idx].offset, h->numel * sizeof(float));
    }
    return rc;
}

void params_load_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings) {
    SeqErr e;
    if (params_read_safetensors(path, t, params, tie_word_embeddings, &e) != 0) die("%s", e.msg);
}
