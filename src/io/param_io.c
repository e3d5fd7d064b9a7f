/* Implementation of the parameter safetensors I/O: maps ParamTable entries to safetensors tensors
 * (names, shapes, offsets into the flat buffer) on top of io/safetensors; reads one file or a
 * Hugging Face sharded checkpoint (model.safetensors.index.json + shards), every tensor exactly
 * once, refusing tensors the model does not use and pickled PyTorch weights. */
#include "io/param_io.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "io/atomic_file.h"
#include "io/read_file.h"
#include "io/safetensors.h"

json_t *file_size_crc_json(const char *path, const char *what, SeqErr *e) {
    uint32_t crc;
    uint64_t size;
    SeqErr re;
    if (file_crc32(path, &crc, &size, &re) != 0) {
        seq_err(e, "cannot checksum the %s just written: %s", what, re.msg);
        return NULL;
    }
    char hex[11];
    snprintf(hex, sizeof hex, "0x%08" PRIx32, crc);
    return json_pack("{s:I, s:s}", "bytes", (json_int_t)size, "crc32", hex);
}

static const char LM_HEAD[] = "lm_head.weight";
static const char EMBED[] = "model.embed_tokens.weight";

static char *join_path(const char *dir, const char *name);

/* The table's tensors i with shard_of[i] == shard (shard_of NULL: all of them), in table order,
 * as StWriteTensor entries into w; returns how many, or -1 with a message when the table is
 * inconsistent. json_map, when given, maps each name to shard_name. */
static int write_list(const ParamTable *t, const float *params, const int *shard_of, int shard, StWriteTensor *w,
                      json_t *json_map, const char *shard_name, SeqErr *e) {
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        if (shard_of && shard_of[i] != shard) continue;
        const ParamTensor *p = &t->t[i];
        if (p->ndim < 1 || p->ndim > 2)
            return seq_err(e, "tensor %s has %d dimensions: the parameter table supports 1 or 2", p->name, p->ndim);
        if (p->offset + p->numel > t->total)
            return seq_err(e, "tensor %s lies outside the parameter buffer (%zu + %zu > %zu): the parameter table is "
                           "inconsistent", p->name, p->offset, p->numel, t->total);
        w[n].name = p->name;
        w[n].data = params ? params + p->offset : NULL;
        w[n].at = p->offset;
        w[n].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) w[n].shape[d] = p->shape[d];
        n++;
        if (json_map) json_object_set_new(json_map, p->name, json_string(shard_name));
    }
    return n;
}

/* Every tensor of the table into one file, from params or (params NULL) src. */
static int save_one_file(const char *path, const ParamTable *t, const float *params, const StSource *src, SeqErr *e) {
    StWriteTensor *w = xcalloc(t->n ? (size_t)t->n : 1, sizeof *w);
    const int n = write_list(t, params, NULL, 0, w, NULL, NULL, e);
    const int rc = n < 0 ? -1 : st_write_f32_src(path, w, n, "pt", src, e);
    xfree(w);
    return rc;
}

int params_save_dir(const char *dir, const ParamTable *t, const float *params, const StSource *src,
                    uint64_t max_shard_bytes, SeqErr *e) {
    uint64_t total = 0;
    for (int i = 0; i < t->n; i++) total += (uint64_t)t->t[i].numel * 4;
    if (max_shard_bytes == 0 || total <= max_shard_bytes) {
        char *p = join_path(dir, "model.safetensors");
        const int rc = save_one_file(p, t, params, src, e);
        xfree(p);
        return rc == 0 ? 1 : -1;
    }
    /* Greedy in table order, as transformers does: a new shard when the next tensor would push
     * the current one past the limit (a tensor larger than the limit gets a shard of its own). */
    int *shard_of = xmalloc(sizeof *shard_of * (size_t)(t->n ? t->n : 1));
    int n_shards = 0;
    uint64_t used = 0;
    for (int i = 0; i < t->n; i++) {
        uint64_t b = (uint64_t)t->t[i].numel * 4;
        if (n_shards == 0 || (used > 0 && used + b > max_shard_bytes)) { n_shards++; used = 0; }
        shard_of[i] = n_shards - 1;
        used += b;
    }
    json_t *map = json_object(), *files = json_object();
    StWriteTensor *w = xcalloc((size_t)(t->n ? t->n : 1), sizeof *w);
    int rc = 0;
    for (int k = 0; k < n_shards && rc == 0; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        const int n = write_list(t, params, shard_of, k, w, map, name, e);
        char *path = join_path(dir, name);
        json_t *fj = NULL;
        if (n < 0 || st_write_f32_src(path, w, n, "pt", src, e) != 0 || !(fj = file_size_crc_json(path, "shard", e)))
            rc = -1;
        else json_object_set_new(files, name, fj);
        xfree(path);
    }
    json_t *root = json_pack("{s:{s:I, s:I, s:o}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "total_parameters", (json_int_t)(total / 4), "seqpar_shards", files, "weight_map", map);
    char *text = rc == 0 ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (rc == 0 && !text) rc = seq_err(e, "cannot encode " ST_INDEX_NAME " (out of memory?)");
    if (rc == 0) {
        char *path = join_path(dir, ST_INDEX_NAME);
        rc = atomic_write_text(path, text, e);
        xfree(path);
    }
    free(text);
    xfree(w);
    xfree(shard_of);
    return rc == 0 ? n_shards : -1;
}

int params_save_safetensors(const char *path, const ParamTable *t, const float *params, SeqErr *e) {
    return save_one_file(path, t, params, NULL, e);
}

int params_save_safetensors_src(const char *path, const ParamTable *t, const StSource *src, SeqErr *e) {
    return save_one_file(path, t, NULL, src, e);
}

/* Old Llama conversions store RoPE's inverse frequencies as buffers; transformers recomputes them
 * from config.json and ignores these on load, and so does seqpar. */
static int is_rope_buffer(const char *name) {
    size_t n = strlen(name);
    static const char suffix[] = ".rotary_emb.inv_freq";
    return n >= sizeof suffix - 1 && strcmp(name + n - (sizeof suffix - 1), suffix) == 0;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = xmalloc(a + b + 2);
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

static int param_index(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->t[i].name, name) == 0) return i;
    return -1;
}

/* The part of the flat buffer a load fills, [lo, hi) (a ZeRO-3 rank's shard; [0, total): all),
 * and a tied model's stored lm_head copy over the embedding's elements [head_lo, head_hi). */
typedef struct {
    size_t lo, hi;
    float *tied_head;
    size_t head_lo, head_hi;
} LoadPart;

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_z(size_t a, size_t b) { return a < b ? a : b; }

/* Tensor `name` (a table tensor at [off, off + numel) of the flat buffer) into its part of dst
 * (dst: the flat buffer), checked for shape and, in the part read, for finite values. */
static int load_part(const StFile *f, const char *path, const char *name, int ndim, const int64_t *shape, size_t off,
                     size_t numel, const LoadPart *pt, float *dst, SeqErr *e) {
    const size_t a = max_z(off, pt->lo), b = min_z(off + numel, pt->hi);
    if (a >= b) return st_check_tensor(f, name, ndim, shape, e); /* none of it here */
    if (a == off && b == off + numel) {
        if (st_load_tensor(f, name, ndim, shape, dst + off, e) != 0) return -1;
    } else if (st_check_tensor(f, name, ndim, shape, e) != 0 ||
               st_load_tensor_range(f, name, numel, a - off, b - a, dst + a, e) != 0) {
        return -1;
    }
    return st_check_finite(dst + a, b - a, name, path, e);
}

/* Loads every tensor of one safetensors file into the table's slots (their part in pt), marking
 * them in seen[]. A tensor the table lacks, one already loaded from another file, or (with an
 * index) one the index maps elsewhere is an error naming it. */
static int read_one_file(const char *path, const char *shard, json_t *weight_map, const ParamTable *t, float *params,
                         int tie, char *seen, LoadPart *pt, SeqErr *e) {
    StFile f;
    if (st_load(path, &f, e) != 0) return -1;
    int rc = 0;
    for (int k = 0; k < f.n_tensors && rc == 0; k++) {
        const char *name = f.tensors[k].name;
        if (is_rope_buffer(name)) continue;
        int i = param_index(t, name);
        if (weight_map) {
            json_t *where = json_object_get(weight_map, name);
            if (!json_is_string(where) || strcmp(json_string_value(where), shard) != 0) {
                rc = seq_err(e, "tensor '%s' is in '%s' but model.safetensors.index.json %s%s%s: the checkpoint is "
                             "inconsistent (re-save it with save_pretrained)", name, path,
                             json_is_string(where) ? "maps it to '" : "does not list it",
                             json_is_string(where) ? json_string_value(where) : "", json_is_string(where) ? "'" : "");
                break;
            }
        }
        if (i < 0 && tie && strcmp(name, LM_HEAD) == 0) {
            /* A tied model's lm_head is the embedding: a stored copy is accepted only if it is one. */
            int emb = param_index(t, EMBED);
            if (emb < 0 || pt->tied_head) {
                rc = seq_err(e, "'%s' holds %s but the tied model has no %s to compare it with", path, LM_HEAD, EMBED);
            } else { /* the part of it over the embedding's part */
                const ParamTensor *pe = &t->t[emb];
                pt->head_lo = max_z(pe->offset, pt->lo);
                pt->head_hi = max_z(pt->head_lo, min_z(pe->offset + pe->numel, pt->hi));
                const size_t n = pt->head_hi - pt->head_lo;
                pt->tied_head = xmalloc(sizeof(float) * (n ? n : 1));
                rc = st_check_tensor(&f, name, pe->ndim, pe->shape, e);
                if (rc == 0 && n)
                    rc = st_load_tensor_range(&f, name, pe->numel, pt->head_lo - pe->offset, n, pt->tied_head, e);
            }
        } else if (i < 0) {
            rc = seq_err(e, "tensor '%s' in '%s' is not part of seqpar's Llama (%s): the checkpoint is from a different "
                         "architecture or configuration; seqpar refuses to drop weights silently", name, path,
                         "embed_tokens, q/k/v/o_proj, gate/up/down_proj, the RMSNorm weights and lm_head");
        } else if (seen[i]) {
            rc = seq_err(e, "tensor '%s' appears twice: in '%s' and in an earlier shard", name, path);
        } else {
            const ParamTensor *p = &t->t[i];
            if (p->offset + p->numel > t->total)
                rc = seq_err(e, "tensor %s lies outside the parameter buffer (%zu + %zu > %zu): the parameter table "
                             "is inconsistent", p->name, p->offset, p->numel, t->total);
            if (rc == 0) rc = load_part(&f, path, p->name, p->ndim, p->shape, p->offset, p->numel, pt, params, e);
            seen[i] = 1;
        }
    }
    st_close(&f);
    return rc;
}

/* After every file: each table tensor loaded (the tied lm_head gets the embedding's copy). */
static int finish(const char *where, const ParamTable *t, float *params, int tie, const char *seen, const LoadPart *pt,
                  SeqErr *e) {
    int lm_head_idx = -1, embed_idx = -1;
    if (pt->tied_head) { /* over the part read (every rank of a sharded load checks its own) */
        if (memcmp(pt->tied_head, params + pt->head_lo, (pt->head_hi - pt->head_lo) * sizeof(float)) != 0)
            return seq_err(e, "%s holds %s, which differs from %s, but config.json sets \"tie_word_embeddings\": "
                           "true: set it to false if the checkpoint has its own output matrix", where, LM_HEAD, EMBED);
    }
    for (int i = 0; i < t->n; i++) {
        const ParamTensor *p = &t->t[i];
        if (strcmp(p->name, EMBED) == 0) embed_idx = i;
        if (tie && strcmp(p->name, LM_HEAD) == 0) { lm_head_idx = i; continue; }
        if (seen[i]) continue;
        if (strcmp(p->name, LM_HEAD) == 0)
            return seq_err(e, "tensor %s missing from %s: the weights have tied embeddings; set "
                           "\"tie_word_embeddings\": true in config.json", p->name, where);
        return seq_err(e, "tensor %s missing from %s: the weights do not match the model configuration (check "
                       "config.json against the safetensors file)", p->name, where);
    }
    if (lm_head_idx >= 0) {
        const ParamTensor *h = &t->t[lm_head_idx];
        if (pt->lo != 0 || pt->hi != t->total)
            return seq_err(e, "internal: a tied model's table with its own %s cannot be loaded in part", LM_HEAD);
        if (embed_idx < 0 || t->t[embed_idx].numel != h->numel)
            return seq_err(e, "the parameter table has %s but tie_word_embeddings is set and %s is missing or differs "
                           "in size: the parameter table is inconsistent", LM_HEAD, EMBED);
        memcpy(params + h->offset, params + t->t[embed_idx].offset, h->numel * sizeof(float));
    }
    return 0;
}

int params_read_safetensors_part(const char *path, const ParamTable *t, float *params, int tie_word_embeddings,
                                 size_t lo, size_t hi, SeqErr *e) {
    char *seen = xcalloc(t->n ? (size_t)t->n : 1, 1);
    LoadPart pt = {lo, hi, NULL, 0, 0};
    int rc = read_one_file(path, NULL, NULL, t, params, tie_word_embeddings, seen, &pt, e);
    if (rc == 0) rc = finish(path, t, params, tie_word_embeddings, seen, &pt, e);
    xfree(pt.tied_head);
    xfree(seen);
    return rc;
}

int params_read_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings, SeqErr *e) {
    return params_read_safetensors_part(path, t, params, tie_word_embeddings, 0, t->total, e);
}

/* A shard name from the index must be a plain file name inside the model directory. */
static int plain_name(const char *s) {
    return *s && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* A shard seqpar wrote carries its size and CRC-32 in the index ("metadata.seqpar_shards"), so a
 * damaged shard is named before it is read (the index itself is checksummed by the checkpoint). */
static int verify_shard(const char *path, json_t *sums, const char *index_path, SeqErr *e) {
    json_t *bytes = json_object_get(sums, "bytes"), *crc_text = json_object_get(sums, "crc32");
    if (!json_is_integer(bytes) || !json_is_string(crc_text))
        return seq_err(e, "'%s': metadata.seqpar_shards entry for '%s' is not {bytes, crc32}: the index is damaged",
                       index_path, path);
    uint32_t crc;
    uint64_t size;
    if (file_crc32(path, &crc, &size, e) != 0) return -1;
    char hex[11];
    snprintf(hex, sizeof hex, "0x%08" PRIx32, crc);
    if (size != (uint64_t)json_integer_value(bytes) || strcmp(hex, json_string_value(crc_text)) != 0)
        return seq_err(e, "shard '%s' is damaged: it has %llu bytes and CRC-32 %s but '%s' recorded %lld bytes and %s "
                       "at save: use another copy of the checkpoint", path, (unsigned long long)size, hex, index_path,
                       (long long)json_integer_value(bytes), json_string_value(crc_text));
    return 0;
}

int params_read_sharded(const char *dir, const ParamTable *t, float *params, int tie_word_embeddings, size_t lo,
                        size_t hi, SeqErr *e) {
    char *index_path = join_path(dir, ST_INDEX_NAME);
    unsigned char *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    char *seen = xcalloc(t->n ? (size_t)t->n : 1, 1);
    LoadPart pt = {lo, hi, NULL, 0, 0};
    int rc = read_regular_file(index_path, "safetensors index", 64u << 20, &text, &len, e);
    if (rc == 0) {
        json_error_t jerr;
        root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root)
            rc = seq_err(e, "'%s' is not valid JSON: %s at line %d, column %d", index_path, jerr.text, jerr.line,
                         jerr.column);
    }
    json_t *map = rc == 0 ? json_object_get(root, "weight_map") : NULL;
    if (rc == 0 && !json_is_object(map))
        rc = seq_err(e, "'%s' has no \"weight_map\" object (tensor name -> shard file): the index is damaged", index_path);
    /* Every shard the map names, each once, in order of first mention. */
    json_t *shards = json_array();
    const char *name;
    json_t *v;
    if (rc == 0) {
        json_object_foreach(map, name, v) {
            if (!json_is_string(v) || !plain_name(json_string_value(v))) {
                rc = seq_err(e, "'%s' maps tensor '%s' to %s, not to a file name in the model directory", index_path,
                             name, json_is_string(v) ? json_string_value(v) : "a non-string");
                break;
            }
            if (!is_rope_buffer(name) && param_index(t, name) < 0) {
                rc = seq_err(e, "tensor '%s' (listed in '%s') is not part of seqpar's Llama: the checkpoint is from a "
                             "different architecture or configuration; seqpar refuses to drop weights silently", name,
                             index_path);
                break;
            }
            int known = 0;
            for (size_t k = 0; k < json_array_size(shards) && !known; k++)
                known = strcmp(json_string_value(json_array_get(shards, k)), json_string_value(v)) == 0;
            if (!known) json_array_append(shards, v);
        }
    }
    for (size_t k = 0; rc == 0 && k < json_array_size(shards); k++) {
        const char *shard = json_string_value(json_array_get(shards, k));
        char *path = join_path(dir, shard);
        struct stat sb;
        json_t *sums = json_object_get(json_object_get(json_object_get(root, "metadata"), "seqpar_shards"), shard);
        if (stat(path, &sb) != 0)
            rc = seq_err(e, "shard '%s' listed in '%s' is missing: copy every model-*.safetensors file of the "
                         "checkpoint", path, index_path);
        else if (sums)
            rc = verify_shard(path, sums, index_path, e);
        if (rc == 0) rc = read_one_file(path, shard, map, t, params, tie_word_embeddings, seen, &pt, e);
        xfree(path);
    }
    /* A tensor the index lists but whose shard does not hold it. */
    if (rc == 0) {
        json_object_foreach(map, name, v) {
            int i = param_index(t, name);
            if (i >= 0 && !seen[i]) {
                rc = seq_err(e, "tensor '%s' is missing from shard '%s/%s' although '%s' lists it there", name, dir,
                             json_string_value(v), index_path);
                break;
            }
        }
    }
    if (rc == 0) rc = finish(index_path, t, params, tie_word_embeddings, seen, &pt, e);
    xfree(pt.tied_head);
    json_decref(shards);
    if (root) json_decref(root);
    xfree(text);
    xfree(seen);
    xfree(index_path);
    return rc;
}

int params_read_dir(const char *dir, const ParamTable *t, float *params, int tie_word_embeddings, size_t lo,
                    size_t hi, SeqErr *e) {
    char *single = join_path(dir, "model.safetensors"), *index = join_path(dir, ST_INDEX_NAME);
    struct stat sb;
    int has_single = stat(single, &sb) == 0, has_index = stat(index, &sb) == 0, rc;
    if (has_single && has_index) {
        rc = seq_err(e, "'%s' holds both model.safetensors and " ST_INDEX_NAME ": keep one checkpoint per directory",
                     dir);
    } else if (has_single) {
        rc = params_read_safetensors_part(single, t, params, tie_word_embeddings, lo, hi, e);
    } else if (has_index) {
        rc = params_read_sharded(dir, t, params, tie_word_embeddings, lo, hi, e);
    } else {
        /* PyTorch pickles (pytorch_model.bin, its shards and index) are code, not data: refused. */
        DIR *d = opendir(dir);
        int bin = 0;
        struct dirent *ent;
        while (d && (ent = readdir(d)) != NULL && !bin) {
            size_t n = strlen(ent->d_name);
            bin = strncmp(ent->d_name, "pytorch_model", 13) == 0 &&
                  ((n > 4 && strcmp(ent->d_name + n - 4, ".bin") == 0) || strstr(ent->d_name, ".bin.index.json"));
        }
        if (d) closedir(d);
        if (bin)
            rc = seq_err(e, "'%s' holds PyTorch pickle weights (pytorch_model*.bin), which seqpar does not read: "
                         "convert them once with python -c \"from transformers import AutoModelForCausalLM as M; "
                         "M.from_pretrained('%s').save_pretrained('OUT')\" and pass OUT (it writes safetensors)", dir,
                         dir);
        else
            rc = 1;
    }
    xfree(single);
    xfree(index);
    return rc;
}

void params_load_safetensors(const char *path, const ParamTable *t, float *params, int tie_word_embeddings) {
    SeqErr e;
    if (params_read_safetensors(path, t, params, tie_word_embeddings, &e) != 0) die("%s", e.msg);
}
