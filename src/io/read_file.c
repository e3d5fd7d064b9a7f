/* Implementation of safe input-file reading and file checksums (see read_file.h). The
 * O_NONBLOCK open matters: a plain open() of a FIFO waits for a writer forever, before any
 * regular-file check could run. */
#include "io/read_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

int open_regular_file(const char *path, const char *what, uint64_t *size, SeqErr *e) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return seq_err(e, "cannot open %s '%s': %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return seq_err(e, "cannot stat %s '%s': %s", what, path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return seq_err(e, "%s '%s' is not a regular file (it is a %s): pass a file", what, path,
                       S_ISDIR(sb.st_mode) ? "directory" : S_ISFIFO(sb.st_mode) ? "FIFO" : "device or socket");
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *size = (uint64_t)sb.st_size;
    return fd;
}

/* Reads exactly len bytes; returns 0, or the errno (EIO standing for a short read). */
static int read_fully(int fd, unsigned char *buf, size_t len, size_t *done) {
    *done = 0;
    while (*done < len) {
        size_t chunk = len - *done < ((size_t)1 << 30) ? len - *done : ((size_t)1 << 30);
        ssize_t got = read(fd, buf + *done, chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EIO;
        *done += (size_t)got;
    }
    return 0;
}

int read_regular_file(const char *path, const char *what, uint64_t max_bytes, unsigned char **out, size_t *len,
                      SeqErr *e) {
    *out = NULL;
    *len = 0;
    uint64_t size;
    int fd = open_regular_file(path, what, &size, e);
    if (fd < 0) return -1;
    if (size > max_bytes || size > SIZE_MAX - 1) {
        close(fd);
        return seq_err(e, "%s '%s' has %llu bytes, more than the %llu expected of such a file: is it the right file?",
                       what, path, (unsigned long long)size, (unsigned long long)max_bytes);
    }
    unsigned char *buf = xmalloc((size_t)size + 1);
    size_t done = 0;
    int err = read_fully(fd, buf, (size_t)size, &done);
    close(fd);
    if (err) {
        xfree(buf);
        return seq_err(e, "reading %s '%s' failed after %zu of %llu bytes: %s", what, path, done,
                       (unsigned long long)size, err == EIO && done < size ? "the file shrank while it was read" : strerror(err));
    }
    buf[size] = 0;
    *out = buf;
    *len = (size_t)size;
    return 0;
}

uint32_t crc32_bytes(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    uLong c = crc;
    while (len > 0) { /* zlib takes uInt lengths */
        uInt chunk = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
    return (uint32_t)c;
}

int file_crc32(const char *path, uint32_t *crc, uint64_t *size, SeqErr *e) {
    int fd = open_regular_file(path, "checkpoint file", size, e);
    if (fd < 0) return -1;
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = xmalloc(CHUNK);
    uint32_t c = 0;
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) { rc = seq_err(e, "reading checkpoint file '%s' failed: %s", path, strerror(errno)); break; }
        if (got == 0) break;
        c = crc32_bytes(c, buf, (size_t)got);
        total += (uint64_t)got;
    }
    close(fd);
    xfree(buf);
    *crc = c;
    *size = total;
    return rc;
}
