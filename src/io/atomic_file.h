/* Atomic file and directory writes: write to a temporary name in the same directory, fsync,
 * rename over the target, fsync the directory. A crash leaves either the old or the new file. */
#ifndef SEQPAR_ATOMIC_FILE_H
#define SEQPAR_ATOMIC_FILE_H

#include <stdio.h>

typedef struct {
    FILE *f;
    char *final_path;
    char *tmp_path;
} AtomicFile;

/* Opens a temporary file beside `path` for binary writing; dies naming the path on failure. */
void atomic_open(AtomicFile *af, const char *path);
/* Flushes, fsyncs, closes and renames the temporary over the target; dies on any failure
 * (removing the temporary, leaving any old file intact). */
void atomic_commit(AtomicFile *af);
/* Removes the temporary without touching the target. */
void atomic_abort(AtomicFile *af);
/* Writes `len` bytes or dies naming the file. */
void atomic_write(AtomicFile *af, const void *buf, size_t len);
/* Writes a text file atomically: the NUL-terminated text followed by a newline. */
void atomic_write_text(const char *path, const char *text);
/* fsyncs a directory (so a rename inside it is durable). */
void fsync_dir(const char *dir);

#endif
