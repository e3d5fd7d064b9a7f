/* Reading input files safely: a path must name a regular file (a FIFO, device or directory is
 * refused without blocking on it), is read whole into memory with a size limit, and CRC-32
 * checksums (zlib's crc32, the one gzip and PNG use) of files for checkpoint verification.
 * Errors are returned as one-line messages, never by ending the program. */
#ifndef SEQPAR_READ_FILE_H
#define SEQPAR_READ_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

/* Opens `path` for reading without blocking (O_NONBLOCK) and checks that it is a regular file.
 * Returns the descriptor (blocking mode restored) and its size in *size, or -1 with a message in
 * *e that names `what` ("token file", "safetensors file", ...) and the path. */
int open_regular_file(const char *path, const char *what, uint64_t *size, SeqErr *e);

/* Reads the whole regular file into a new buffer (xmalloc, free with xfree) with a NUL byte
 * after the end; files larger than max_bytes are refused. Returns 0 or -1 with a message. */
int read_regular_file(const char *path, const char *what, uint64_t max_bytes, unsigned char **out, size_t *len,
                      SeqErr *e);

/* CRC-32 of a byte range (continue from `crc`; start from 0). */
uint32_t crc32_bytes(uint32_t crc, const void *data, size_t len);

/* CRC-32 and size of a whole regular file, read in chunks. Returns 0 or -1 with a message. */
int file_crc32(const char *path, uint32_t *crc, uint64_t *size, SeqErr *e);

#endif
