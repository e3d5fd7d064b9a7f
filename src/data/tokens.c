/* Token files: llm.c shards (a 256-int32 header with magic, version and token count, then
 * uint16 or uint32 tokens) and plain text read as bytes. The whole file is loaded into memory
 * as uint32 tokens; every inconsistency (wrong magic, unknown version, a count that disagrees
 * with the file size, a token id of INT32_MAX or more) fails at load with both numbers in the message,
 * returned to the caller (tokens_read) or ending the program (tokens_load). */
#include "data/tokens.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "io/atomic_file.h"
#include "io/read_file.h"

#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * sizeof(int32_t))
#define LLMC_MAGIC_U16 20240520
#define LLMC_VERSION_U16 1
#define LLMC_MAGIC_U32 20240801
#define LLMC_VERSION_U32 7

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Reads `count` tokens of `width` bytes (2 or 4, little-endian) from fp into td->tokens. */
static int read_tokens(FILE *fp, const char *path, size_t count, size_t width, TokenData *td, SeqErr *e) {
    enum { CHUNK = 1 << 14 };
    unsigned char buf[CHUNK * 4];
    size_t done = 0;
    uint32_t max_token = 0;
    while (done < count) {
        size_t want = count - done < CHUNK ? count - done : CHUNK;
        if (fread(buf, width, want, fp) != want)
            return seq_err(e, "reading tokens from '%s' failed after %zu of %zu tokens: %s", path, done, count,
                           ferror(fp) ? strerror(errno) : "unexpected end of file");
        for (size_t i = 0; i < want; i++) {
            uint32_t v;
            if (width == 1) {
                v = buf[i];
            } else if (width == 2) {
                v = (uint32_t)buf[2 * i] | (uint32_t)buf[2 * i + 1] << 8;
            } else {
                v = (uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 | (uint32_t)buf[4 * i + 2] << 16 |
                    (uint32_t)buf[4 * i + 3] << 24;
            }
            if (v >= (uint32_t)INT32_MAX)
                return seq_err(e, "token file '%s' is corrupt: token %zu has id %" PRIu32 ", above the largest "
                               "token id seqpar supports (%d): check the tokenizer or the file", path, done + i, v,
                               INT32_MAX - 1);
            td->tokens[done + i] = v;
            if (v > max_token) max_token = v;
        }
        done += want;
    }
    td->max_token = max_token;
    return 0;
}

static int load_text(FILE *fp, const char *path, size_t file_size, TokenData *td, SeqErr *e) {
    td->format = TOKENS_TEXT;
    td->n = file_size;
    td->tokens = xmalloc(file_size * sizeof(uint32_t));
    return read_tokens(fp, path, file_size, 1, td, e);
}

/* Reads and checks the header of an llm.c shard of file_size bytes: *count tokens of *width bytes. */
static int read_llmc_header(FILE *fp, const char *path, size_t file_size, size_t *count_out, size_t *width_out,
                            SeqErr *e) {
    if (file_size < LLMC_HEADER_BYTES)
        return seq_err(e, "'%s' is not an llm.c token shard: it has %zu bytes, fewer than the %zu-byte header (for a "
                       "text file use a .txt name or the text format)", path, file_size, (size_t)LLMC_HEADER_BYTES);
    unsigned char raw[LLMC_HEADER_BYTES];
    if (fread(raw, 1, sizeof raw, fp) != sizeof raw)
        return seq_err(e, "reading the header of '%s' failed: %s", path,
                       ferror(fp) ? strerror(errno) : "unexpected end of file");
    int32_t header[LLMC_HEADER_INTS];
    for (size_t i = 0; i < LLMC_HEADER_INTS; i++)
        header[i] = (int32_t)((uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 | (uint32_t)raw[4 * i + 2] << 16 |
                              (uint32_t)raw[4 * i + 3] << 24);
    int32_t magic = header[0], version = header[1], count = header[2];
    size_t width;
    if (magic == LLMC_MAGIC_U16) {
        if (version != LLMC_VERSION_U16)
            return seq_err(e, "llm.c shard '%s' has magic %d with version %d; that magic goes with version %d (uint16 "
                           "tokens)", path, magic, version, LLMC_VERSION_U16);
        width = 2;
    } else if (magic == LLMC_MAGIC_U32) {
        if (version != LLMC_VERSION_U32)
            return seq_err(e, "llm.c shard '%s' has magic %d with version %d; that magic goes with version %d (uint32 "
                           "tokens)", path, magic, version, LLMC_VERSION_U32);
        width = 4;
    } else {
        return seq_err(e, "'%s' is not an llm.c token shard: header magic is %d, expected %d (uint16 tokens) or %d "
                       "(uint32 tokens); for a text file use a .txt name or the text format", path, magic,
                       LLMC_MAGIC_U16, LLMC_MAGIC_U32);
    }
    if (count < 0)
        return seq_err(e, "llm.c shard '%s' is corrupt: its header gives a negative token count (%d)", path, count);
    size_t expected = LLMC_HEADER_BYTES + (size_t)count * width;
    if (expected != file_size)
        return seq_err(e, "llm.c shard '%s' is truncated or corrupt: the header says %d tokens (%zu bytes with the "
                       "header) but the file has %zu bytes", path, count, expected, file_size);
    if (count == 0) return seq_err(e, "llm.c shard '%s' holds no tokens (its header count is 0)", path);
    *count_out = (size_t)count;
    *width_out = width;
    return 0;
}

static int load_llmc(FILE *fp, const char *path, size_t file_size, TokenData *td, SeqErr *e) {
    td->format = TOKENS_LLMC;
    size_t width;
    if (read_llmc_header(fp, path, file_size, &td->n, &width, e) != 0) return -1;
    td->tokens = xmalloc(td->n * sizeof(uint32_t));
    return read_tokens(fp, path, td->n, width, td, e);
}

/* Opens path as a non-empty regular file for reading; *fp_out and *size_out on success. */
static int open_token_file(const char *path, FILE **fp_out, size_t *size_out, SeqErr *e) {
    uint64_t size;
    int fd = open_regular_file(path, "token file", &size, e);
    if (fd < 0) return -1;
    if (size == 0) {
        close(fd);
        return seq_err(e, "token file '%s' is empty: it needs at least one token", path);
    }
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int err = errno;
        close(fd);
        return seq_err(e, "cannot open token file '%s': %s", path, strerror(err));
    }
    *fp_out = fp;
    *size_out = (size_t)size;
    return 0;
}

static TokensFormat resolve_format(const char *path, TokensFormat format) {
    if (format == TOKENS_AUTO) format = ends_with(path, ".txt") ? TOKENS_TEXT : TOKENS_LLMC;
    return format;
}

int tokens_probe(const char *path, TokensFormat format, size_t *count, SeqErr *e) {
    FILE *fp = NULL;
    size_t file_size = 0, width;
    if (open_token_file(path, &fp, &file_size, e) != 0) return -1;
    int rc = 0;
    if (resolve_format(path, format) == TOKENS_TEXT) {
        *count = file_size;
        int32_t magic = 0; /* an llm.c shard read as text trained on its raw bytes, header included */
        if (file_size >= 1024 && fread(&magic, sizeof magic, 1, fp) == 1 && (magic == LLMC_MAGIC_U16 || magic == LLMC_MAGIC_U32))
            rc = seq_err(e, "'%s' is an llm.c token shard (magic %d), but --tokens-format text reads a file's bytes: "
                         "drop --tokens-format text (or give auto or llmc)", path, (int)magic);
    } else {
        rc = read_llmc_header(fp, path, file_size, count, &width, e);
    }
    fclose(fp);
    return rc;
}

int tokens_read(const char *path, TokensFormat format, TokenData *td, SeqErr *e) {
    memset(td, 0, sizeof *td);
    FILE *fp = NULL;
    size_t file_size = 0;
    if (open_token_file(path, &fp, &file_size, e) != 0) return -1;
    format = resolve_format(path, format);
    int rc = format == TOKENS_TEXT ? load_text(fp, path, file_size, td, e) : load_llmc(fp, path, file_size, td, e);
    fclose(fp);
    if (rc != 0) tokens_free(td);
    return rc;
}

void tokens_load(const char *path, TokensFormat format, TokenData *td) {
    SeqErr e;
    if (tokens_read(path, format, td, &e) != 0) die("%s", e.msg);
}

int tokens_check_vocab(const TokenData *td, const char *path, int vocab_size, SeqErr *e) {
    if (vocab_size <= 0 || td->max_token >= (uint32_t)vocab_size)
        return seq_err(e, "'%s' holds token %" PRIu32 " but the model's vocab_size is %d: use a model with a larger "
                       "vocabulary (or the tokenizer that matches this model)", path, td->max_token, vocab_size);
    return 0;
}

void tokens_free(TokenData *td) {
    xfree(td->tokens);
    memset(td, 0, sizeof *td);
}

int tokens_write_llmc(const char *path, const uint32_t *tokens, size_t n, SeqErr *e) {
    if (n > INT32_MAX)
        return seq_err(e, "cannot write '%s': %zu tokens exceed the %d an llm.c shard header can count; split the data",
                       path, n, INT32_MAX);
    uint32_t max_token = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] > max_token) max_token = tokens[i];
    int narrow = max_token < 65536;
    size_t width = narrow ? 2 : 4;
    uint32_t header[LLMC_HEADER_INTS] = {0};
    header[0] = narrow ? LLMC_MAGIC_U16 : LLMC_MAGIC_U32;
    header[1] = narrow ? LLMC_VERSION_U16 : LLMC_VERSION_U32;
    header[2] = (uint32_t)n;
    unsigned char raw[LLMC_HEADER_BYTES];
    for (size_t i = 0; i < LLMC_HEADER_INTS; i++)
        for (size_t b = 0; b < 4; b++) raw[4 * i + b] = (unsigned char)(header[i] >> (8 * b));

    AtomicFile af;
    if (atomic_open(&af, path, e) != 0) return -1;
    atomic_write(&af, raw, sizeof raw);
    enum { CHUNK = 1 << 14 };
    unsigned char buf[CHUNK * 4];
    for (size_t done = 0; done < n;) {
        size_t count = n - done < CHUNK ? n - done : CHUNK;
        for (size_t i = 0; i < count; i++)
            for (size_t b = 0; b < width; b++) buf[width * i + b] = (unsigned char)(tokens[done + i] >> (8 * b));
        if (atomic_write(&af, buf, count * width) != 0) break; /* the failure is atomic_commit's to return */
        done += count;
    }
    return atomic_commit(&af, e);
}

TokensFormat tokens_format_parse(const char *s) {
    if (strcmp(s, "auto") == 0) return TOKENS_AUTO;
    if (strcmp(s, "llmc") == 0) return TOKENS_LLMC;
    if (strcmp(s, "text") == 0) return TOKENS_TEXT;
    die_collective("unknown token file format '%s': choose auto, llmc or text", s);
}
