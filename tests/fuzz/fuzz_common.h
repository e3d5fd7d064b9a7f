/* Shared by the libFuzzer targets: puts the fuzz input into an in-memory file (memfd) so that
 * the loaders read it through their real path-based entry points, the FIFO and regular-file
 * checks included, without touching the disk. Header-only. */
#ifndef SEQPAR_FUZZ_COMMON_H
#define SEQPAR_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Returns "/proc/self/fd/N" of a memfd holding data[0..size). */
static inline const char *fuzz_memfile(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("seqpar-fuzz", 0);
        if (fd < 0) { perror("memfd_create"); abort(); }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
    return path;
}

#endif
