/* Where a chunked strategy (paper 003's pipeline) keeps the chunks its backward needs: a small
 * "memory tier" interface.
 *
 * A layer's saved state is u chunks of four kinds (q_h, kv_h, o_h, lse_h of one sequence chunk,
 * head-parallel layout). The strategy never addresses a chunk itself; it asks the tier:
 *
 *   slot(t, saved, kind, i)         where to WRITE chunk i (fast memory, chunk_floats(kind) floats)
 *   store(t, saved, kind, i)        chunk i is complete; the tier may move it to the slow tier
 *   prefetch(t, saved, kind, i, b)  hint: chunk i will be fetched into buffer b next
 *   fetch(t, saved, kind, i, b)     a readable copy of chunk i, in buffer b (0 or 1: double buffer)
 *   release(t, ptr)                 done with a fetched chunk
 *
 * `saved` (the layer's buffer from the model) names the layer. The RAM tier (the only one today)
 * keeps every chunk in `saved` itself: slot and fetch return pointers into it and store, prefetch
 * and release do nothing, so the chunked pipeline on the RAM tier has exactly the memory of the whole head exchange. The intended
 * other tiers: disk (--offload-dir: slot returns a staging buffer, store writes it to a file on
 * a helper thread, prefetch starts the read into buffer b, fetch waits for it; `saved` then only
 * needs the kept part) and device <-> pinned host memory on a GPU (the same calls map onto
 * cudaMemcpyAsync on a copy stream and an event per buffer). An I/O failure (full disk, ...) does
 * not stop the caller mid-layer: the calls go on returning buffers (of garbage) and set
 * io_errno; the caller checks it at its next collective point so that every rank stops with the
 * same one-line message (the strategy: after each forward, backward and restore, and after the last
 * chunk of each pass of the chunk calls). */
#ifndef SEQPAR_CHUNK_TIER_H
#define SEQPAR_CHUNK_TIER_H

#include <stddef.h>

typedef enum { TIER_Q = 0, TIER_KV = 1, TIER_O = 2, TIER_LSE = 3, TIER_KINDS = 4 } TierKind;

typedef struct {
    unsigned long long bytes_written, bytes_read;
    double wait_s; /* time the caller waited for the helper thread (un-hidden I/O) */
    size_t ram_floats; /* staging and read buffers the tier holds */
} TierStats;

typedef struct ChunkTier ChunkTier;
struct ChunkTier {
    const char *name;
    void *ctx;
    int chunks;                      /* u */
    size_t chunk_floats[TIER_KINDS]; /* floats of one chunk of each kind */
    char err[256];
    int io_errno;                    /* first failed read or write (0: none) */
    TierStats (*stats)(const ChunkTier *t); /* NULL: none (RAM) */
    float *(*slot)(ChunkTier *t, float *saved, TierKind kind, int chunk);
    int (*store)(ChunkTier *t, float *saved, TierKind kind, int chunk);
    void (*prefetch)(ChunkTier *t, const float *saved, TierKind kind, int chunk, int buf);
    const float *(*fetch)(ChunkTier *t, const float *saved, TierKind kind, int chunk, int buf);
    void (*release)(ChunkTier *t, const float *ptr);
    void (*destroy)(ChunkTier *t);
};

/* The RAM tier over a `saved` buffer laid out kind-major, chunk-minor:
 * [q_h 0..u-1 | kv_h 0..u-1 | o_h 0..u-1 | lse_h 0..u-1] (so lse, the part selective
 * checkpointing keeps, is the suffix). */
ChunkTier *chunk_tier_ram_create(int chunks, const size_t chunk_floats[TIER_KINDS]);
/* Floats a layer's `saved` needs under the RAM tier: u times the sum of the chunk sizes. */
size_t chunk_tier_ram_saved_floats(int chunks, const size_t chunk_floats[TIER_KINDS]);
void chunk_tier_destroy(ChunkTier *t);

#endif

/* The disk tier (--offload-dir DIR): q_h, kv_h and o_h chunks go to one file in DIR, unlinked as
 * soon as it is opened (so it disappears when the process ends, however it ends); lse_h stays in
 * RAM in `saved` (it is small, and it is the suffix selective checkpointing keeps), so a layer's
 * `saved` needs only u chunk_floats[TIER_LSE] floats. Layers are told apart by their `saved`
 * pointer (a buffer shared by checkpointed layers is rewritten by forward or restore before
 * its backward reads it). One helper thread does every read and write in FIFO order, so a read
 * always sees the writes queued before it: store() queues the write of the slot's staging buffer
 * (two staging buffers per kind: slot() waits only for the write of two chunks ago), prefetch()
 * queues a read into read buffer b (two per kind: the double buffer), fetch() waits for it (or
 * queues and waits). Time spent waiting is the I/O that compute did not hide.
 * bf16_kinds: a mask of (1 << kind) for the kinds whose chunks hold bf16 values only (a chunked
 * strategy's q_h, kv_h, o_h and dout_h under --precision bf16): the file keeps them as bf16, half the bytes and the
 * I/O, the helper thread rounding on write and widening on read through one bf16 buffer of the
 * largest such chunk (exact for bf16 values; other floats would be rounded). 0: all fp32.
 * NULL with a one-line message in err (size errsz) when DIR is not a writable directory; `flag` names
 * the flag that gave DIR in it ("--offload-dir"). */
ChunkTier *chunk_tier_disk_create(const char *flag, const char *dir, int rank, int chunks,
                                  const size_t chunk_floats[TIER_KINDS], unsigned bf16_kinds, char *err, size_t errsz);
/* Allocates the file's space for `layers` layers (keys) now (posix_fallocate), so that a full disk
 * is found here rather than by a write mid-run, and a read of a chunk never stored gives zeros.
 * 0, or -1 with err and io_errno set. */
int chunk_tier_disk_reserve(ChunkTier *t, int layers);
/* Whether this rank can make its offload file in dir (made and removed at once): 0, or -1 with
 * chunk_tier_disk_create's one-line message in err. Every rank probes at set-up and the first
 * failing rank's line ends all of them (seq_parallel_create), where one rank's failing create
 * later would leave the others waiting in their next collective. */
int chunk_tier_disk_probe(const char *flag, const char *dir, int rank, char *err, size_t errsz);
size_t chunk_tier_disk_saved_floats(int chunks, const size_t chunk_floats[TIER_KINDS]);

/* Zeros for the RAM tier. */
void chunk_tier_stats(const ChunkTier *t, TierStats *s);
