/* Safetensors files (the Hugging Face weight format): an 8-byte little-endian header length,
 * a JSON header {name: {dtype, shape, data_offsets}}, then the raw data. Reading accepts F32,
 * BF16 and F16 and converts to float; writing produces F32. */
#ifndef SEQPAR_SAFETENSORS_H
#define SEQPAR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

typedef enum { ST_F32, ST_BF16, ST_F16 } StDtype;

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[8];
    size_t begin, end; /* byte offsets into the data section */
} StTensor;

typedef struct {
    char *path;
    StTensor *tensors;
    int n_tensors;
    int fd;          /* the open file: tensors are read from it when asked for, never the whole
                        file into memory (a model's or optimizer's file is as large as its
                        parameters: reading it whole would double a load's memory) */
    size_t data_off; /* where the data section starts in the file */
    size_t data_len;
} StFile;

/* Opens and fully validates a file's header: a regular file (a FIFO or device is refused without
 * blocking), header length within the file, JSON parses, every tensor's offsets lie inside the
 * data section and match dtype x shape, and the tensors tile the data section exactly (no
 * overlap, no gap, no trailing bytes). Only the header is read; the file stays open until
 * st_close. Returns 0, or -1 with a one-line message in *e naming the file and the problem (an
 * unsupported dtype names the tensor); *f then needs no st_close. */
int st_load(const char *path, StFile *f, SeqErr *e);
/* st_load that dies with the message instead of returning it. */
void st_open(const char *path, StFile *f);
void st_close(StFile *f);

/* The tensor called `name`, or NULL. */
const StTensor *st_find(const StFile *f, const char *name);

/* Copies tensor `name` into dst (converted to float). Returns -1 with a message naming the file
 * and tensor if it is missing ("tensor X missing from F"), its shape differs from the expected
 * one ("tensor X in F has shape [a, b], expected [c, d]"). NaN and Inf are converted as they are. */
int st_load_tensor(const StFile *f, const char *name, int ndim, const int64_t *shape, float *dst, SeqErr *e);
/* 0 if tensor `name` is in the file with this shape, else st_load_tensor's error. */
int st_check_tensor(const StFile *f, const char *name, int ndim, const int64_t *shape, SeqErr *e);
/* Elements [first, first + count) of tensor `name` in its row-major order, converted to float,
 * into dst (a rank's range of a flat 1-D tensor: the optimizer moments). Checks the tensor has
 * `numel` elements in all. Errors as st_load_tensor's. */
int st_load_tensor_range(const StFile *f, const char *name, size_t numel, size_t first, size_t count, float *dst,
                         SeqErr *e);
/* 0 if every x[i] is finite, else -1 with a message naming the tensor, the file and the element. */
int st_check_finite(const float *x, size_t n, const char *name, const char *path, SeqErr *e);
/* st_load_tensor that dies with the message instead of returning it. */
void st_read_f32(const StFile *f, const char *name, int ndim, const int64_t *shape, float *dst);

typedef struct {
    const char *name;
    const float *data; /* its elements, or (with an StSource) NULL */
    int ndim;
    int64_t shape[4];
    size_t at; /* with an StSource: where its elements start in the source's numbering */
} StWriteTensor;

/* Where the data of arrays no one process holds whole comes from (a sharded model or optimizer
 * state, gathered piece by piece): read(ctx, first, n, dst) gives the source's elements [first,
 * first + n) in dst. */
typedef struct {
    void (*read)(void *ctx, size_t first, size_t n, float *dst);
    void *ctx;
} StSource;

/* Writes the tensors as F32 in the given order, atomically: temp file in the same directory,
 * fsync, rename. `metadata_format` goes in __metadata__.format (e.g. "pt"); NULL for none.
 * Returns 0, or -1 with a one-line message (a bad tensor description, a failed write: the
 * temporary is removed, any old file intact). */
int st_write_f32(const char *path, const StWriteTensor *tensors, int n, const char *metadata_format, SeqErr *e);
/* The same with the data read from src (NULL: from each tensor's data) in pieces of at most
 * ST_WRITE_PIECE elements, in the file's order: memory for one piece, not the tensors. */
#define ST_WRITE_PIECE ((size_t)4 << 20)
int st_write_f32_src(const char *path, const StWriteTensor *tensors, int n, const char *metadata_format,
                     const StSource *src, SeqErr *e);

#endif
