/* The memory tiers of a chunked strategy's chunks (RAM, and disk with a helper thread): see chunk_tier.h. */
#include "memory/chunk_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "kernels/bf16.h"

static size_t ram_offset(const ChunkTier *t, TierKind kind, int chunk) {
    size_t off = 0;
    for (int k = 0; k < (int)kind; k++) off += (size_t)t->chunks * t->chunk_floats[k];
    return off + (size_t)chunk * t->chunk_floats[kind];
}

static float *ram_slot(ChunkTier *t, float *saved, TierKind kind, int chunk) {
    return saved + ram_offset(t, kind, chunk);
}

static int ram_store(ChunkTier *t, float *saved, TierKind kind, int chunk) {
    (void)t, (void)saved, (void)kind, (void)chunk; /* already in place */
    return 0;
}

static void ram_prefetch(ChunkTier *t, const float *saved, TierKind kind, int chunk, int buf) {
    (void)t, (void)saved, (void)kind, (void)chunk, (void)buf;
}

static const float *ram_fetch(ChunkTier *t, const float *saved, TierKind kind, int chunk, int buf) {
    (void)buf;
    return saved + ram_offset(t, kind, chunk);
}

static void ram_release(ChunkTier *t, const float *ptr) { (void)t, (void)ptr; }

static void ram_destroy(ChunkTier *t) { xfree(t); }

ChunkTier *chunk_tier_ram_create(int chunks, const size_t chunk_floats[TIER_KINDS]) {
    ChunkTier *t = xcalloc(1, sizeof *t);
    t->name = "ram";
    t->chunks = chunks;
    for (int k = 0; k < TIER_KINDS; k++) t->chunk_floats[k] = chunk_floats[k];
    t->slot = ram_slot;
    t->store = ram_store;
    t->prefetch = ram_prefetch;
    t->fetch = ram_fetch;
    t->release = ram_release;
    t->destroy = ram_destroy;
    return t;
}

size_t chunk_tier_ram_saved_floats(int chunks, const size_t chunk_floats[TIER_KINDS]) {
    size_t s = 0;
    for (int k = 0; k < TIER_KINDS; k++) s += (size_t)chunks * chunk_floats[k];
    return s;
}

void chunk_tier_destroy(ChunkTier *t) {
    if (t) t->destroy(t);
}

/* ---- the disk tier */

typedef struct {
    int write;         /* 1: write buf to off; 0: read */
    int bf16;          /* the file holds the chunk as bf16: bytes / 2 floats of buf */
    float *buf;
    size_t bytes;      /* bytes in the file */
    off_t off;
    int *done;         /* set to 1 (or -errno) by the helper thread */
} IoJob;

typedef struct {
    int fd;
    char path[4096], dir[200];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    IoJob *q;
    int q_cap, q_head, q_len, stop;
    int io_error;                          /* first errno of a failed job */
    const float **keys;                    /* layer slot of each `saved` pointer */
    int n_keys, cap_keys;
    size_t layer_bytes, kind_off[TIER_KINDS];
    unsigned bf16_kinds;                   /* kinds kept in the file as bf16 (1 << kind) */
    bf16_t *wire;                          /* the helper thread's bf16 copy of a chunk being moved */
    float *stage[TIER_KINDS][2];
    int stage_done[TIER_KINDS][2], stage_next[TIER_KINDS];
    float *rbuf[TIER_KINDS][2];
    int rdone[TIER_KINDS][2];
    const float *rkey[TIER_KINDS][2];      /* what buffer holds or will hold: (saved, chunk) */
    int rchunk[TIER_KINDS][2];
    TierStats st;
} Disk;

static void *disk_worker(void *arg) {
    Disk *k = arg;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->q_len && !k->stop) pthread_cond_wait(&k->cv, &k->mu);
        if (!k->q_len) break;
        IoJob j = k->q[k->q_head];
        pthread_mutex_unlock(&k->mu);
        /* a bf16 chunk moves through the helper's own bf16 copy (exact: its floats are bf16 values) */
        char *io = j.bf16 ? (char *)k->wire : (char *)j.buf;
        if (j.bf16 && j.write) bf16_pack(k->wire, j.buf, j.bytes / sizeof(bf16_t));
        size_t done = 0;
        int err = 0;
        while (done < j.bytes) {
            ssize_t n = j.write ? pwrite(k->fd, io + done, j.bytes - done, j.off + (off_t)done)
                                : pread(k->fd, io + done, j.bytes - done, j.off + (off_t)done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                err = n < 0 ? errno : EIO;
                break;
            }
            done += (size_t)n;
        }
        if (j.bf16 && !j.write && !err) bf16_unpack(j.buf, k->wire, j.bytes / sizeof(bf16_t));
        pthread_mutex_lock(&k->mu);
        k->q_head = (k->q_head + 1) % k->q_cap;
        k->q_len--;
        if (err && !k->io_error) k->io_error = err;
        *j.done = err ? -err : 1;
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* Bytes of one element of `kind` in the file. */
static size_t disk_elem(const Disk *k, TierKind kind) {
    return k->bf16_kinds >> kind & 1u ? sizeof(bf16_t) : sizeof(float);
}

static void disk_submit(Disk *k, int write, TierKind kind, float *buf, size_t bytes, off_t off, int *done) {
    pthread_mutex_lock(&k->mu);
    while (k->q_len == k->q_cap) pthread_cond_wait(&k->cv, &k->mu);
    *done = 0;
    k->q[(k->q_head + k->q_len) % k->q_cap] = (IoJob){write, (int)(k->bf16_kinds >> kind & 1u), buf, bytes, off, done};
    k->q_len++;
    if (write) k->st.bytes_written += bytes; else k->st.bytes_read += bytes;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

/* Waits for a job; its time counts as un-hidden I/O. 0, or -1 with t->err set. */
static int disk_wait(ChunkTier *t, int *done) {
    Disk *k = t->ctx;
    double t0 = now_seconds();
    pthread_mutex_lock(&k->mu);
    while (*done == 0) pthread_cond_wait(&k->cv, &k->mu);
    int rc = *done;
    /* the first failure in queue order names the cause: a read of a chunk whose write failed
     * (a full disk) comes back short (EIO), but the error to report is the write's */
    int first = k->io_error ? k->io_error : -rc;
    pthread_mutex_unlock(&k->mu);
    k->st.wait_s += now_seconds() - t0;
    if (rc < 0) {
        snprintf(t->err, sizeof t->err, "offload file in %.160s: %s", k->dir, strerror(first));
        if (!t->io_errno) t->io_errno = first;
        return -1;
    }
    return 0;
}

static off_t disk_offset(ChunkTier *t, const float *saved, TierKind kind, int chunk) {
    Disk *k = t->ctx;
    int slot = -1;
    for (int i = 0; i < k->n_keys; i++)
        if (k->keys[i] == saved) slot = i;
    if (slot < 0) {
        if (k->n_keys == k->cap_keys) {
            k->cap_keys = k->cap_keys ? 2 * k->cap_keys : 8;
            const float **grown = xmalloc(sizeof(*grown) * (size_t)k->cap_keys);
            if (k->n_keys) memcpy(grown, k->keys, sizeof(*grown) * (size_t)k->n_keys);
            xfree(k->keys);
            k->keys = grown;
        }
        slot = k->n_keys++;
        k->keys[slot] = saved;
    }
    return (off_t)((size_t)slot * k->layer_bytes + k->kind_off[kind] +
                   (size_t)chunk * t->chunk_floats[kind] * disk_elem(k, kind));
}

static float *disk_slot(ChunkTier *t, float *saved, TierKind kind, int chunk) {
    Disk *k = t->ctx;
    if (kind == TIER_LSE) return saved + (size_t)chunk * t->chunk_floats[TIER_LSE];
    int b = k->stage_next[kind];
    if (k->stage_done[kind][b] == 0) disk_wait(t, &k->stage_done[kind][b]); /* a failure sets io_errno */
    return k->stage[kind][b];
}

static int disk_store(ChunkTier *t, float *saved, TierKind kind, int chunk) {
    Disk *k = t->ctx;
    if (kind == TIER_LSE) return 0;
    if (k->io_error && !t->io_errno) t->io_errno = k->io_error; /* the caller stops at its next collective point */
    int b = k->stage_next[kind];
    k->stage_next[kind] = 1 - b;
    /* a read buffer that holds this chunk is stale now */
    for (int r = 0; r < 2; r++)
        if (k->rkey[kind][r] == saved && k->rchunk[kind][r] == chunk) k->rkey[kind][r] = NULL;
    disk_submit(k, 1, kind, k->stage[kind][b], t->chunk_floats[kind] * disk_elem(k, kind),
                disk_offset(t, saved, kind, chunk), &k->stage_done[kind][b]);
    return 0;
}

static void disk_prefetch(ChunkTier *t, const float *saved, TierKind kind, int chunk, int buf) {
    Disk *k = t->ctx;
    if (kind == TIER_LSE) return;
    if (k->rkey[kind][buf] == saved && k->rchunk[kind][buf] == chunk) return; /* already there or on its way */
    if (k->rkey[kind][buf] && k->rdone[kind][buf] == 0) disk_wait(t, &k->rdone[kind][buf]);
    k->rkey[kind][buf] = saved;
    k->rchunk[kind][buf] = chunk;
    disk_submit(k, 0, kind, k->rbuf[kind][buf], t->chunk_floats[kind] * disk_elem(k, kind),
                disk_offset(t, saved, kind, chunk), &k->rdone[kind][buf]);
}

static const float *disk_fetch(ChunkTier *t, const float *saved, TierKind kind, int chunk, int buf) {
    Disk *k = t->ctx;
    if (kind == TIER_LSE) return saved + (size_t)chunk * t->chunk_floats[TIER_LSE];
    disk_prefetch(t, saved, kind, chunk, buf);
    disk_wait(t, &k->rdone[kind][buf]); /* a failure sets io_errno */
    return k->rbuf[kind][buf];
}

static void disk_release(ChunkTier *t, const float *ptr) { (void)t, (void)ptr; }

static TierStats disk_stats(const ChunkTier *t) { return ((const Disk *)t->ctx)->st; }

static void disk_destroy(ChunkTier *t) {
    Disk *k = t->ctx;
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->thread, NULL);
    close(k->fd);
    for (int kd = 0; kd < TIER_KINDS; kd++)
        for (int b = 0; b < 2; b++) {
            xfree(k->stage[kd][b]);
            xfree(k->rbuf[kd][b]);
        }
    xfree(k->keys);
    xfree(k->wire);
    xfree(k->q);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    xfree(k);
    xfree(t);
}

/* A new file in dir, already unlinked (gone when the process ends, however it ends); path gets its
 * name. -1 with the one-line message in err. */
static int offload_file(const char *flag, const char *dir, int rank, char *path, size_t path_size, char *err,
                        size_t errsz) {
    snprintf(path, path_size, "%s/seqpar-offload-%ld-r%d-XXXXXX", dir, (long)getpid(), rank);
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(err, errsz, "%s %s: cannot create a file there (%s)", flag, dir, strerror(errno));
        return -1;
    }
    unlink(path);
    return fd;
}

int chunk_tier_disk_probe(const char *flag, const char *dir, int rank, char *err, size_t errsz) {
    char path[4096];
    int fd = offload_file(flag, dir, rank, path, sizeof path, err, errsz);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

ChunkTier *chunk_tier_disk_create(const char *flag, const char *dir, int rank, int chunks,
                                  const size_t chunk_floats[TIER_KINDS], unsigned bf16_kinds, char *err, size_t errsz) {
    Disk *k = xcalloc(1, sizeof *k);
    k->fd = offload_file(flag, dir, rank, k->path, sizeof k->path, err, errsz);
    if (k->fd < 0) {
        xfree(k);
        return NULL;
    }
    snprintf(k->dir, sizeof k->dir, "%s", dir);
    ChunkTier *t = xcalloc(1, sizeof *t);
    t->name = "disk";
    t->ctx = k;
    t->chunks = chunks;
    for (int kd = 0; kd < TIER_KINDS; kd++) t->chunk_floats[kd] = chunk_floats[kd];
    k->bf16_kinds = bf16_kinds & ~(1u << TIER_LSE); /* lse stays in RAM, in fp32 */
    size_t off = 0, widest = 0;
    for (int kd = 0; kd < TIER_KINDS; kd++) {
        k->kind_off[kd] = off;
        if (kd == TIER_LSE) continue;
        off += (size_t)chunks * chunk_floats[kd] * disk_elem(k, (TierKind)kd);
        if (k->bf16_kinds >> kd & 1u && chunk_floats[kd] > widest) widest = chunk_floats[kd];
        for (int b = 0; b < 2; b++) {
            k->stage[kd][b] = xmalloc_aligned(sizeof(float) * chunk_floats[kd]);
            k->rbuf[kd][b] = xmalloc_aligned(sizeof(float) * chunk_floats[kd]);
            k->stage_done[kd][b] = 1;
            k->rdone[kd][b] = 1;
            k->st.ram_floats += 2 * chunk_floats[kd];
        }
    }
    k->layer_bytes = off;
    if (widest) {
        k->wire = xmalloc_aligned(sizeof(bf16_t) * widest);
        k->st.ram_floats += (widest + 1) / 2;
    }
    k->q_cap = 64;
    k->q = xcalloc((size_t)k->q_cap, sizeof(IoJob));
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (pthread_create(&k->thread, NULL, disk_worker, k)) die("offload: cannot start the I/O thread");
    t->slot = disk_slot;
    t->store = disk_store;
    t->prefetch = disk_prefetch;
    t->fetch = disk_fetch;
    t->release = disk_release;
    t->stats = disk_stats;
    t->destroy = disk_destroy;
    return t;
}

int chunk_tier_disk_reserve(ChunkTier *t, int layers) {
    Disk *k = t->ctx;
    const size_t bytes = (size_t)layers * k->layer_bytes;
    const int rc = bytes ? posix_fallocate(k->fd, 0, (off_t)bytes) : 0;
    if (rc) {
        snprintf(t->err, sizeof t->err, "offload file in %.160s: %s", k->dir, strerror(rc));
        if (!t->io_errno) t->io_errno = rc;
        return -1;
    }
    return 0;
}

size_t chunk_tier_disk_saved_floats(int chunks, const size_t chunk_floats[TIER_KINDS]) {
    return (size_t)chunks * chunk_floats[TIER_LSE];
}

void chunk_tier_stats(const ChunkTier *t, TierStats *s) {
    if (t && t->stats)
        *s = t->stats(t);
    else
        memset(s, 0, sizeof *s);
}
