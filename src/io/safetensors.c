/* Safetensors reading and writing. A file is: 8-byte little-endian header length N, N bytes of
 * JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
 * {..}}, then the data section that the offsets index. Reading validates the whole header up
 * front (so a bad file fails at open, naming the file and the problem) and converts F32, BF16
 * and F16 to float; writing produces F32 tensors laid out contiguously in the given order with
 * the header padded by spaces to a multiple of 8 bytes, as the Python library does. */
#include "io/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "io/atomic_file.h"

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

static void read_exactly(FILE *fp, void *buf, size_t len, const char *path, const char *what) {
    unsigned char *p = buf;
    while (len > 0) {
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        size_t got = fread(p, 1, chunk, fp);
        if (got != chunk)
            die("reading the %s of '%s' failed: %s", what, path,
                ferror(fp) ? strerror(errno) : "unexpected end of file (the file is truncated)");
        p += got;
        len -= got;
    }
}

/* Formats a shape as "[a, b, c]" into buf. */
static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

/* Parses one tensor entry of the header into *t; dies naming the file and tensor on any fault. */
static void parse_tensor(const char *path, const char *name, json_t *entry, size_t data_len, StTensor *t) {
    if (!json_is_object(entry))
        die("safetensors file '%s': the header entry for tensor '%s' is not an object (the file is corrupt)",
            path, name);
    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets))
        die("safetensors file '%s': tensor '%s' lacks a string \"dtype\", an array \"shape\" or an array "
            "\"data_offsets\" (the file is corrupt)", path, name);

    const char *dt = json_string_value(dtype);
    if (strcmp(dt, "F32") == 0) t->dtype = ST_F32;
    else if (strcmp(dt, "BF16") == 0) t->dtype = ST_BF16;
    else if (strcmp(dt, "F16") == 0) t->dtype = ST_F16;
    else
        die("safetensors file '%s': tensor '%s' has dtype %s, which seqpar cannot read: convert the "
            "checkpoint to F32, BF16 or F16", path, name, dt);

    size_t ndim = json_array_size(shape);
    if (ndim > ARRAY_LEN(t->shape))
        die("safetensors file '%s': tensor '%s' has %zu dimensions; at most %zu are supported", path, name, ndim,
            ARRAY_LEN(t->shape));
    t->ndim = (int)ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            die("safetensors file '%s': tensor '%s' has a shape entry that is not a non-negative integer", path,
                name);
        t->shape[i] = (int64_t)json_integer_value(d);
        uint64_t dim = (uint64_t)t->shape[i];
        if (dim != 0 && numel > UINT64_MAX / dim) overflow = 1;
        numel *= dim;
    }

    if (json_array_size(offsets) != 2 || !json_is_integer(json_array_get(offsets, 0)) ||
        !json_is_integer(json_array_get(offsets, 1)))
        die("safetensors file '%s': tensor '%s' needs \"data_offsets\" of two integers", path, name);
    json_int_t begin = json_integer_value(json_array_get(offsets, 0));
    json_int_t end = json_integer_value(json_array_get(offsets, 1));
    if (begin < 0 || end < begin || (uint64_t)end > data_len)
        die("safetensors file '%s' is truncated or corrupt: tensor '%s' has data_offsets [%lld, %lld] but the "
            "data section holds %zu bytes", path, name, (long long)begin, (long long)end, data_len);
    t->begin = (size_t)begin;
    t->end = (size_t)end;
    uint64_t want = numel * dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / dtype_size(t->dtype) || want != (uint64_t)(end - begin)) {
        char buf[256];
        die("safetensors file '%s': tensor '%s' (%s, shape %s) spans %lld bytes but its shape needs %" PRIu64
            " (the file is corrupt)", path, name, dtype_name(t->dtype), shape_text(t->ndim, t->shape, buf, sizeof buf),
            (long long)(end - begin), want);
    }
    t->name = string_copy(name);
}

void st_open(const char *path, StFile *f) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) die("cannot open safetensors file '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) die("cannot stat safetensors file '%s': %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) die("safetensors path '%s' is not a regular file", path);
    size_t file_size = (size_t)sb.st_size;
    if (file_size < 8)
        die("'%s' is not a safetensors file: it has %zu bytes, fewer than the 8-byte header length that "
            "starts every safetensors file", path, file_size);

    unsigned char len_bytes[8];
    read_exactly(fp, len_bytes, 8, path, "header length");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > file_size - 8)
        die("safetensors file '%s' is truncated or not a safetensors file: its header length is %" PRIu64
            " bytes but only %zu bytes follow the length field", path, header_len, file_size - 8);
    if (header_len > ST_MAX_HEADER_BYTES)
        die("safetensors file '%s': header length %" PRIu64 " exceeds the 100 MB limit (the file is corrupt)", path,
            header_len);
    if (header_len < 2)
        die("safetensors file '%s': header length is %" PRIu64 " bytes, too short for a JSON object (the file is "
            "corrupt)", path, header_len);

    char *header = xmalloc((size_t)header_len + 1);
    read_exactly(fp, header, (size_t)header_len, path, "header");
    header[header_len] = '\0';
    json_error_t jerr;
    json_t *root = json_loadb(header, (size_t)header_len, JSON_REJECT_DUPLICATES, &jerr);
    xfree(header);
    if (!root)
        die("safetensors file '%s' has a corrupt header: %s at line %d, column %d of the header JSON", path,
            jerr.text, jerr.line, jerr.column);
    if (!json_is_object(root)) die("safetensors file '%s': the header is not a JSON object (the file is corrupt)", path);

    f->path = string_copy(path);
    f->data_len = file_size - 8 - (size_t)header_len;
    size_t n_entries = json_object_size(root);
    f->tensors = xcalloc(n_entries ? n_entries : 1, sizeof(StTensor));
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) continue;
        parse_tensor(path, key, value, f->data_len, &f->tensors[f->n_tensors]);
        f->n_tensors++;
    }
    json_decref(root);

    f->data = xmalloc(f->data_len ? f->data_len : 1);
    read_exactly(fp, f->data, f->data_len, path, "data section");
    fclose(fp);
}

void st_close(StFile *f) {
    for (int i = 0; i < f->n_tensors; i++) xfree(f->tensors[i].name);
    xfree(f->tensors);
    xfree(f->data);
    xfree(f->path);
    memset(f, 0, sizeof *f);
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

void st_read_f32(const StFile *f, const char *name, int ndim, const int64_t *shape, float *dst) {
    const StTensor *t = st_find(f, name);
    if (!t)
        die("tensor '%s' missing from '%s' (the file holds %d tensors): is this checkpoint from a model "
            "with the same configuration?", name, f->path, f->n_tensors);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[256], want[256];
        die("tensor '%s' in '%s' has shape %s, expected %s: the checkpoint does not match the model configuration",
            name, f->path, shape_text(t->ndim, t->shape, have, sizeof have), shape_text(ndim, shape, want, sizeof want));
    }
    const unsigned char *src = f->data + t->begin;
    size_t numel = (t->end - t->begin) / dtype_size(t->dtype);
    switch (t->dtype) {
    case ST_F32:
        if (numel) memcpy(dst, src, numel * 4);
        break;
    case ST_BF16:
        for (size_t i = 0; i < numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        break;
    case ST_F16:
        for (size_t i = 0; i < numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = half_to_float(h);
        }
        break;
    }
}

void st_write_f32(const char *path, const StWriteTensor *tensors, int n, const char *metadata_format) {
    json_t *root = json_object();
    if (metadata_format) json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", metadata_format));
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const StWriteTensor *t = &tensors[i];
        if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0)
            die("cannot write '%s': tensor %d has an empty or reserved name", path, i);
        if (json_object_get(root, t->name)) die("cannot write '%s': tensor name '%s' appears twice", path, t->name);
        if (t->ndim < 0 || t->ndim > (int)ARRAY_LEN(t->shape))
            die("cannot write '%s': tensor '%s' has %d dimensions (0 to 4 supported)", path, t->name, t->ndim);
        json_t *shape = json_array();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) die("cannot write '%s': tensor '%s' has a negative dimension", path, t->name);
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        uint64_t end = offset + numel * 4;
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)offset, (json_int_t)end));
        offset = end;
    }
    char *header = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!header) die("cannot encode the safetensors header for '%s' (out of memory?)", path);
    size_t header_len = strlen(header);
    size_t padded_len = (header_len + 7) / 8 * 8;
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)((uint64_t)padded_len >> (8 * i));
    static const char spaces[8] = "        ";

    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, len_bytes, 8);
    atomic_write(&af, header, header_len);
    atomic_write(&af, spaces, padded_len - header_len);
    free(header);
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < tensors[i].ndim; d++) numel *= (uint64_t)tensors[i].shape[d];
        if (numel) atomic_write(&af, tensors[i].data, (size_t)numel * 4);
    }
    atomic_commit(&af);
}
