/* Atomic file and directory writes: write to a temporary name in the same directory, fsync,
 * rename over the target, fsync the directory. A crash leaves either the old or the new file.
 * Every failure is returned (-1 with a one-line message naming the path, the cause and the fix in
 * a SeqErr), never ended here: the caller decides. */
#ifndef SEQPAR_ATOMIC_FILE_H
#define SEQPAR_ATOMIC_FILE_H

#include <stdio.h>

#include "core/common.h"

typedef struct {
    FILE *f;
    char *final_path;
    char *tmp_path;
    int failed;  /* a write failed: the temporary is gone, later writes do nothing */
    SeqErr err;  /* that failure's message, which atomic_commit returns */
} AtomicFile;

/* Opens a temporary file beside `path` for binary writing. Returns 0, or -1 with the reason; a
 * path that names anything but a regular file (a directory, a device, a FIFO, a socket; through
 * symbolic links) is refused, since the commit's rename would replace it. */
int atomic_open(AtomicFile *af, const char *path, SeqErr *e);
/* Writes `len` bytes. A failure removes the temporary and is kept (sticky) for atomic_commit, so
 * a writer may issue its writes and check once; returns -1 from then on, else 0. */
int atomic_write(AtomicFile *af, const void *buf, size_t len);
/* Flushes, fsyncs, closes and renames the temporary over the target, then fsyncs the directory.
 * Returns 0, or -1 with the first failure of this file (the temporary removed, any old file
 * intact). Either way af is released. */
int atomic_commit(AtomicFile *af, SeqErr *e);
/* Removes the temporary without touching the target. */
void atomic_abort(AtomicFile *af);
/* Writes a text file atomically: the NUL-terminated text followed by a newline. */
int atomic_write_text(const char *path, const char *text, SeqErr *e);
/* Whether `path` can be written later: its temporary can be created beside it (the directory
 * exists and is writable) and `path` is not a directory. Creates nothing that stays. Returns 0,
 * or -1 with the reason. */
int atomic_check_target(const char *path, SeqErr *e);
/* The directory part of `path`: "." when it has none, "/" for a file in the root; newly
 * allocated (xfree). */
char *directory_of(const char *path);
/* fsyncs a directory (so a rename inside it is durable). */
int fsync_dir(const char *dir, SeqErr *e);

#endif
