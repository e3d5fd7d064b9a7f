/* Safetensors reading and writing. A file is: 8-byte little-endian header length N, N bytes of
 * JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
 * {..}}, then the data section that the offsets index. Reading validates the whole header up
 * front (so a bad file fails at open, naming the file and the problem: offsets outside the data,
 * overlapping tensors, bytes that belong to no tensor) and converts F32, BF16 and F16 to float
 * (st_check_finite then refuses NaN and Inf where the caller wants that); loading reports errors to the caller (st_load, st_load_tensor) or, in the
 * dying wrappers st_open / st_read_f32, ends the program; writing produces F32 tensors laid out contiguously in the given order with
 * the header padded by spaces to a multiple of 8 bytes, as the Python library does. */
#include "io/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/atomic_file.h"
#include "io/read_file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (safetensors data is little-endian)"
#endif

/* The Python/Rust implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000)

static size_t dtype_size(StDtype d) { return d == ST_F32 ? 4 : 2; }

static const char *dtype_name(StDtype d) {
    switch (d) {
    case ST_F32: return "F32";
    case ST_BF16: return "BF16";
    case ST_F16: return "F16";
    }
    return "?";
}

static char *string_copy(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = xmalloc(n);
    memcpy(copy, s, n);
    return copy;
}

/* Formats a shape as "[a, b, c]" into buf. */
static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

/* Parses one tensor entry of the header into *t; reports a fault naming the file and tensor. */
static int parse_tensor(const char *path, const char *name, json_t *entry, size_t data_len, StTensor *t, SeqErr *e) {
    if (!json_is_object(entry))
        return seq_err(e, "safetensors file '%s': the header entry for tensor '%s' is not an object (the file is "
                       "corrupt)", path, name);
    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets))
        return seq_err(e, "safetensors file '%s': tensor '%s' lacks a string \"dtype\", an array \"shape\" or an "
                       "array \"data_offsets\" (the file is corrupt)", path, name);

    const char *dt = json_string_value(dtype);
    if (strcmp(dt, "F32") == 0) t->dtype = ST_F32;
    else if (strcmp(dt, "BF16") == 0) t->dtype = ST_BF16;
    else if (strcmp(dt, "F16") == 0) t->dtype = ST_F16;
    else
        return seq_err(e, "safetensors file '%s': tensor '%s' has dtype %.40s, which seqpar cannot read: convert the "
                       "checkpoint to F32, BF16 or F16", path, name, dt);

    size_t ndim = json_array_size(shape);
    if (ndim > ARRAY_LEN(t->shape))
        return seq_err(e, "safetensors file '%s': tensor '%s' has %zu dimensions; at most %zu are supported", path,
                       name, ndim, ARRAY_LEN(t->shape));
    t->ndim = (int)ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return seq_err(e, "safetensors file '%s': tensor '%s' has a shape entry that is not a non-negative "
                           "integer", path, name);
        t->shape[i] = (int64_t)json_integer_value(d);
        uint64_t dim = (uint64_t)t->shape[i];
        if (dim != 0 && numel > UINT64_MAX / dim) overflow = 1;
        numel *= dim;
    }

    if (json_array_size(offsets) != 2 || !json_is_integer(json_array_get(offsets, 0)) ||
        !json_is_integer(json_array_get(offsets, 1)))
        return seq_err(e, "safetensors file '%s': tensor '%s' needs \"data_offsets\" of two integers", path, name);
    json_int_t begin = json_integer_value(json_array_get(offsets, 0));
    json_int_t end = json_integer_value(json_array_get(offsets, 1));
    if (begin < 0 || end < begin || (uint64_t)end > data_len)
        return seq_err(e, "safetensors file '%s' is truncated or corrupt: tensor '%s' has data_offsets [%lld, %lld] "
                       "but the data section holds %zu bytes", path, name, (long long)begin, (long long)end, data_len);
    t->begin = (size_t)begin;
    t->end = (size_t)end;
    uint64_t want = numel * dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / dtype_size(t->dtype) || want != (uint64_t)(end - begin)) {
        char buf[256];
        return seq_err(e, "safetensors file '%s': tensor '%s' (%s, shape %s) spans %lld bytes but its shape needs "
                       "%" PRIu64 " (the file is corrupt)", path, name, dtype_name(t->dtype),
                       shape_text(t->ndim, t->shape, buf, sizeof buf), (long long)(end - begin), want);
    }
    t->name = string_copy(name);
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile the data section exactly, as the safetensors format requires: no two
 * overlap, no bytes between them, none after the last. */
static int check_tiling(const char *path, const StFile *f, SeqErr *e) {
    int n = f->n_tensors;
    const StTensor **order = xmalloc(sizeof *order * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)n, sizeof *order, by_begin);
    size_t at = 0;
    const StTensor *prev = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const StTensor *t = order[i];
        if (t->begin < at)
            rc = seq_err(e, "safetensors file '%s' is corrupt: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap in "
                         "the data section", path, prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
        else if (t->begin > at)
            rc = seq_err(e, "safetensors file '%s' is corrupt: bytes [%zu, %zu) of the data section belong to no "
                         "tensor (before '%s')", path, at, t->begin, t->name);
        if (t->end > at) { at = t->end; prev = t; }
    }
    if (rc == 0 && at != f->data_len)
        rc = seq_err(e, "safetensors file '%s' is corrupt: %zu trailing bytes follow the last tensor's data "
                     "(the data section holds %zu bytes, the tensors %zu)", path, f->data_len - at, f->data_len, at);
    xfree(order);
    return rc;
}

/* Reads exactly len bytes at offset off; 0, or -1 with a message naming the file (a short read:
 * the file changed while it was read). */
static int pread_fully(int fd, const char *path, void *buf, size_t len, uint64_t off, SeqErr *e) {
    size_t done = 0;
    while (done < len) {
        size_t chunk = len - done < ((size_t)1 << 30) ? len - done : ((size_t)1 << 30);
        ssize_t got = pread(fd, (unsigned char *)buf + done, chunk, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return seq_err(e, "reading safetensors file '%s' failed: %s", path, strerror(errno));
        if (got == 0)
            return seq_err(e, "safetensors file '%s' shrank while it was read (%zu of %zu bytes at offset %llu): do "
                           "not rewrite a checkpoint while it is loaded", path, done, len, (unsigned long long)off);
        done += (size_t)got;
    }
    return 0;
}

int st_load(const char *path, StFile *f, SeqErr *e) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    uint64_t file_size;
    const int fd = open_regular_file(path, "safetensors file", &file_size, e);
    if (fd < 0) return -1;
    if (file_size < 8) {
        close(fd);
        return seq_err(e, "'%s' is not a safetensors file: it has %llu bytes, fewer than the 8-byte header length "
                       "that starts every safetensors file", path, (unsigned long long)file_size);
    }
    unsigned char len_bytes[8];
    if (pread_fully(fd, path, len_bytes, 8, 0, e) != 0) {
        close(fd);
        return -1;
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | len_bytes[i];
    const char *problem = NULL;
    char pbuf[512];
    if (header_len > file_size - 8) {
        snprintf(pbuf, sizeof pbuf, "safetensors file '%.300s' is truncated or not a safetensors file: its header "
                 "length is %" PRIu64 " bytes but only %llu bytes follow the length field", path, header_len,
                 (unsigned long long)(file_size - 8));
        problem = pbuf;
    } else if (header_len > ST_MAX_HEADER_BYTES) {
        snprintf(pbuf, sizeof pbuf, "safetensors file '%.300s': header length %" PRIu64 " exceeds the 100 MB limit "
                 "(the file is corrupt)", path, header_len);
        problem = pbuf;
    } else if (header_len < 2) {
        snprintf(pbuf, sizeof pbuf, "safetensors file '%.300s': header length is %" PRIu64 " bytes, too short for a "
                 "JSON object (the file is corrupt)", path, header_len);
        problem = pbuf;
    }
    if (problem) {
        close(fd);
        return seq_err(e, "%s", problem);
    }
    if (file_size > SIZE_MAX) {
        close(fd);
        return seq_err(e, "safetensors file '%s' has %llu bytes, more than this machine can address", path,
                       (unsigned long long)file_size);
    }
    unsigned char *raw = xmalloc((size_t)header_len + 1);
    if (pread_fully(fd, path, raw, (size_t)header_len, 8, e) != 0) {
        xfree(raw);
        close(fd);
        return -1;
    }

    json_error_t jerr;
    json_t *root = json_loadb((const char *)raw, (size_t)header_len, JSON_REJECT_DUPLICATES, &jerr);
    xfree(raw);
    if (!root || !json_is_object(root)) {
        if (root) json_decref(root);
        close(fd);
        if (!root)
            return seq_err(e, "safetensors file '%s' has a corrupt header: %s at line %d, column %d of the header "
                           "JSON", path, jerr.text, jerr.line, jerr.column);
        return seq_err(e, "safetensors file '%s': the header is not a JSON object (the file is corrupt)", path);
    }

    f->path = string_copy(path);
    f->fd = fd;
    f->data_off = 8 + (size_t)header_len;
    f->data_len = (size_t)(file_size - 8 - header_len);
    size_t n_entries = json_object_size(root);
    f->tensors = xcalloc(n_entries ? n_entries : 1, sizeof(StTensor));
    const char *key;
    json_t *value;
    int rc = 0;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(value)) {
                rc = seq_err(e, "safetensors file '%s': \"__metadata__\" is not an object (the file is corrupt)", path);
                break;
            }
            continue;
        }
        if (parse_tensor(path, key, value, f->data_len, &f->tensors[f->n_tensors], e) != 0) { rc = -1; break; }
        f->n_tensors++;
    }
    json_decref(root);
    if (rc == 0) rc = check_tiling(path, f, e);
    if (rc != 0) st_close(f);
    return rc;
}

void st_open(const char *path, StFile *f) {
    SeqErr e;
    if (st_load(path, f, &e) != 0) die("%s", e.msg);
}

void st_close(StFile *f) {
    for (int i = 0; i < f->n_tensors; i++) xfree(f->tensors[i].name);
    xfree(f->tensors);
    if (f->fd >= 0) close(f->fd);
    xfree(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const StTensor *st_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* IEEE half to float, including subnormals, infinities and NaN. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: value = mantissa * 2^-24 */
        float magnitude = (float)mantissa * 0x1.0p-24f;
        memcpy(&bits, &magnitude, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

/* Elements [first, first + count) of tensor t into dst as floats: F32 read straight into dst,
 * BF16 and F16 through a small buffer and converted. */
static int read_elements(const StFile *f, const StTensor *t, size_t first, size_t count, float *dst, SeqErr *e) {
    const size_t es = dtype_size(t->dtype);
    const uint64_t at = (uint64_t)f->data_off + t->begin + (uint64_t)first * es;
    if (t->dtype == ST_F32) return count ? pread_fully(f->fd, f->path, dst, count * 4, at, e) : 0;
    enum { CHUNK = 16384 };
    uint16_t buf[CHUNK];
    for (size_t i0 = 0; i0 < count; i0 += CHUNK) {
        const size_t n = count - i0 < CHUNK ? count - i0 : CHUNK;
        if (pread_fully(f->fd, f->path, buf, n * 2, at + (uint64_t)i0 * 2, e) != 0) return -1;
        for (size_t i = 0; i < n; i++) {
            if (t->dtype == ST_BF16) {
                const uint32_t bits = (uint32_t)buf[i] << 16;
                memcpy(&dst[i0 + i], &bits, 4);
            } else {
                dst[i0 + i] = half_to_float(buf[i]);
            }
        }
    }
    return 0;
}

int st_load_tensor(const StFile *f, const char *name, int ndim, const int64_t *shape, float *dst, SeqErr *e) {
    if (st_check_tensor(f, name, ndim, shape, e) != 0) return -1;
    const StTensor *t = st_find(f, name);
    return read_elements(f, t, 0, (t->end - t->begin) / dtype_size(t->dtype), dst, e);
}

int st_check_tensor(const StFile *f, const char *name, int ndim, const int64_t *shape, SeqErr *e) {
    const StTensor *t = st_find(f, name);
    if (!t)
        return seq_err(e, "tensor '%s' missing from '%s' (the file holds %d tensors): is this checkpoint from a model "
                       "with the same configuration?", name, f->path, f->n_tensors);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[256], want[256];
        return seq_err(e, "tensor '%s' in '%s' has shape %s, expected %s: the checkpoint does not match the model "
                       "configuration", name, f->path, shape_text(t->ndim, t->shape, have, sizeof have),
                       shape_text(ndim, shape, want, sizeof want));
    }
    return 0;
}

int st_load_tensor_range(const StFile *f, const char *name, size_t numel, size_t first, size_t count, float *dst,
                         SeqErr *e) {
    const StTensor *t = st_find(f, name);
    if (!t)
        return seq_err(e, "tensor '%s' missing from '%s' (the file holds %d tensors): is this checkpoint from a model "
                       "with the same configuration?", name, f->path, f->n_tensors);
    const size_t have = (t->end - t->begin) / dtype_size(t->dtype);
    if (have != numel)
        return seq_err(e, "tensor '%s' in '%s' has %zu elements, expected %zu: the checkpoint does not match the model "
                       "configuration", name, f->path, have, numel);
    if (first > numel || count > numel - first)
        return seq_err(e, "internal: elements [%zu, %zu) of tensor '%s' in '%s' asked for, which has %zu", first,
                       first + count, name, f->path, numel);
    return read_elements(f, t, first, count, dst, e);
}

int st_check_finite(const float *x, size_t n, const char *name, const char *path, SeqErr *e) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return seq_err(e, "tensor '%s' in '%s' holds %s at element %zu: the weights are damaged or diverged; "
                           "use an earlier checkpoint", name, path, isnan(x[i]) ? "NaN" : "Inf", i);
    return 0;
}

void st_read_f32(const StFile *f, const char *name, int ndim, const int64_t *shape, float *dst) {
    SeqErr e;
    if (st_load_tensor(f, name, ndim, shape, dst, &e) != 0) die("%s", e.msg);
}

int st_write_f32(const char *path, const StWriteTensor *tensors, int n, const char *metadata_format, SeqErr *e) {
    return st_write_f32_src(path, tensors, n, metadata_format, NULL, e);
}

int st_write_f32_src(const char *path, const StWriteTensor *tensors, int n, const char *metadata_format,
                     const StSource *src, SeqErr *e) {
    json_t *root = json_object();
    if (metadata_format) json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", metadata_format));
    uint64_t offset = 0;
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        const StWriteTensor *t = &tensors[i];
        if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0)
            bad = seq_err(e, "cannot write '%s': tensor %d has an empty or reserved name", path, i);
        else if (json_object_get(root, t->name))
            bad = seq_err(e, "cannot write '%s': tensor name '%s' appears twice", path, t->name);
        else if (t->ndim < 0 || t->ndim > (int)ARRAY_LEN(t->shape))
            bad = seq_err(e, "cannot write '%s': tensor '%s' has %d dimensions (0 to 4 supported)", path, t->name,
                          t->ndim);
        if (bad) break;
        json_t *shape = json_array();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) {
                bad = seq_err(e, "cannot write '%s': tensor '%s' has a negative dimension", path, t->name);
                break;
            }
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        if (bad) {
            json_decref(shape);
            break;
        }
        uint64_t end = offset + numel * 4;
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)offset, (json_int_t)end));
        offset = end;
    }
    char *header = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (bad) return -1;
    if (!header) return seq_err(e, "cannot encode the safetensors header for '%s' (out of memory?)", path);
    size_t header_len = strlen(header);
    size_t padded_len = (header_len + 7) / 8 * 8;
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)((uint64_t)padded_len >> (8 * i));
    static const char spaces[8] = "        ";

    AtomicFile af;
    if (atomic_open(&af, path, e) != 0) {
        free(header);
        return -1;
    }
    atomic_write(&af, len_bytes, 8);
    atomic_write(&af, header, header_len);
    atomic_write(&af, spaces, padded_len - header_len);
    free(header);
    float *piece = NULL;
    size_t piece_n = 0; /* the largest piece any tensor needs */
    for (int i = 0; src && i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++) numel *= (uint64_t)tensors[i].shape[d];
        if (numel > piece_n) piece_n = numel < ST_WRITE_PIECE ? (size_t)numel : ST_WRITE_PIECE;
    }
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++) numel *= (uint64_t)tensors[i].shape[d];
        if (!src) {
            if (numel) atomic_write(&af, tensors[i].data, (size_t)numel * 4);
            continue;
        }
        for (uint64_t k = 0; k < numel; k += ST_WRITE_PIECE) { /* the source's pieces in file order */
            const size_t m = numel - k < ST_WRITE_PIECE ? (size_t)(numel - k) : ST_WRITE_PIECE;
            if (!piece) piece = xmalloc(sizeof(float) * piece_n);
            src->read(src->ctx, tensors[i].at + (size_t)k, m, piece);
            atomic_write(&af, piece, m * 4);
        }
    }
    xfree(piece);
    return atomic_commit(&af, e);
}
