/* Atomic file writes: the data goes to a uniquely named temporary file in the target's
 * directory (so the final rename never crosses file systems), which is flushed, fsynced, closed
 * and renamed over the target; the directory is then fsynced so the rename itself is durable.
 * A crash at any point leaves either the complete old file or the complete new one. */
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

static char *string_copy(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = xmalloc(n);
    memcpy(copy, s, n);
    return copy;
}

char *directory_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return string_copy(".");
    if (slash == path) return string_copy("/");
    size_t n = (size_t)(slash - path);
    char *dir = xmalloc(n + 1);
    memcpy(dir, path, n);
    dir[n] = '\0';
    return dir;
}

static void release_names(AtomicFile *af) {
    xfree(af->final_path);
    xfree(af->tmp_path);
    af->final_path = af->tmp_path = NULL;
    af->f = NULL;
}

int atomic_open(AtomicFile *af, const char *path, SeqErr *e) {
    memset(af, 0, sizeof *af);
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (*base == '\0') return seq_err(e, "cannot write '%s': the path names a directory, not a file", path);
    /* The rename replaces whatever the path names: a device (run as root, `--out /dev/null` would
     * make /dev/null a regular file), a FIFO or a socket is refused instead. */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return seq_err(e, "cannot write '%s': it is %s, and writing a file there replaces it; name a regular file",
                       path, S_ISDIR(sb.st_mode) ? "a directory" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                       : S_ISFIFO(sb.st_mode) ? "a FIFO" : "a socket or another special file");
    size_t dir_len = (size_t)(base - path);
    /* "<dir>/.<base>.tmp.XXXXXX": hidden, beside the target, unique. */
    static const char suffix[] = ".tmp.XXXXXX";
    size_t base_len = strlen(base);
    char *tmp = xmalloc(dir_len + 1 + base_len + sizeof suffix);
    memcpy(tmp, path, dir_len);
    tmp[dir_len] = '.';
    memcpy(tmp + dir_len + 1, base, base_len);
    memcpy(tmp + dir_len + 1 + base_len, suffix, sizeof suffix);
    af->tmp_path = tmp;
    af->final_path = string_copy(path);

    int fd = mkstemp(af->tmp_path);
    if (fd < 0) {
        int err = errno;
        char *dir = directory_of(path);
        seq_err(e, "cannot write '%s': creating a temporary file in '%s' failed: %s (check that the directory "
                "exists and is writable)", path, dir, strerror(err));
        xfree(dir);
        release_names(af);
        return -1;
    }
    /* mkstemp creates mode 0600; give the file the permissions an ordinary fopen would. */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0) {
        /* Not fatal: the data is still written correctly. */
    }
    af->f = fdopen(fd, "wb");
    if (!af->f) {
        int err = errno;
        close(fd);
        unlink(af->tmp_path);
        release_names(af);
        return seq_err(e, "cannot write '%s': %s", path, strerror(err));
    }
    return 0;
}

/* Removes the temporary and keeps the message, naming the final path; returns -1. */
static int fail(AtomicFile *af, const char *what, int err) {
    seq_err(&af->err, "writing '%s' failed while %s: %s (is the disk full or the directory read-only?)",
            af->final_path, what, strerror(err));
    atomic_abort(af);
    af->failed = 1;
    return -1;
}

int atomic_write(AtomicFile *af, const void *buf, size_t len) {
    if (af->failed || !af->f) return -1;
    if (len == 0) return 0;
    if (fwrite(buf, 1, len, af->f) != len) return fail(af, "writing data", errno ? errno : EIO);
    return 0;
}

int atomic_commit(AtomicFile *af, SeqErr *e) {
    if (!af->failed && !af->f) {
        seq_err(&af->err, "internal: atomic_commit on a file that is not open");
        af->failed = 1;
    }
    if (!af->failed) {
        if (fflush(af->f) != 0) fail(af, "flushing", errno);
        else if (fsync(fileno(af->f)) != 0) fail(af, "syncing to disk", errno);
    }
    if (!af->failed) {
        FILE *f = af->f;
        af->f = NULL;
        if (fclose(f) != 0) fail(af, "closing", errno);
        else if (rename(af->tmp_path, af->final_path) != 0) fail(af, "renaming the temporary file into place", errno);
    }
    if (af->failed) {
        if (e) *e = af->err;
        release_names(af);
        return -1;
    }
    char *dir = directory_of(af->final_path);
    int rc = fsync_dir(dir, e);
    xfree(dir);
    release_names(af);
    return rc;
}

void atomic_abort(AtomicFile *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp_path) unlink(af->tmp_path);
    release_names(af);
}

int fsync_dir(const char *dir, SeqErr *e) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return seq_err(e, "cannot open directory '%s' to sync it: %s", dir, strerror(errno));
    /* Some file systems cannot sync directories (EINVAL); the rename is as durable as they allow. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        int err = errno;
        close(fd);
        return seq_err(e, "syncing directory '%s' failed: %s", dir, strerror(err));
    }
    close(fd);
    return 0;
}

int atomic_check_target(const char *path, SeqErr *e) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return seq_err(e, "cannot write '%s': it is a directory; name a file", path);
    AtomicFile af;
    if (atomic_open(&af, path, e) != 0) return -1;
    atomic_abort(&af);
    return 0;
}

int atomic_write_text(const char *path, const char *text, SeqErr *e) {
    AtomicFile af;
    if (atomic_open(&af, path, e) != 0) return -1;
    atomic_write(&af, text, strlen(text));
    atomic_write(&af, "\n", 1);
    return atomic_commit(&af, e);
}
