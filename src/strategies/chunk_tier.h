/* Where FPDT keeps the chunks its backward needs: a small "memory tier" interface.
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
 * and release do nothing, so FPDT on the RAM tier has exactly the Ulysses memory. The intended
 * other tiers: disk (--offload-dir: slot returns a staging buffer, store writes it to a file on
 * a helper thread, prefetch starts the read into buffer b, fetch waits for it; `saved` then only
 * needs the kept part) and device <-> pinned host memory on a GPU (the same calls map onto
 * cudaMemcpyAsync on a copy stream and an event per buffer). store and fetch return NULL / -1 on
 * an I/O failure with a one-line message in err. */
#ifndef SEQPAR_CHUNK_TIER_H
#define SEQPAR_CHUNK_TIER_H

#include <stddef.h>

typedef enum { TIER_Q = 0, TIER_KV = 1, TIER_O = 2, TIER_LSE = 3, TIER_KINDS = 4 } TierKind;

typedef struct ChunkTier ChunkTier;
struct ChunkTier {
    const char *name;
    void *ctx;
    int chunks;                      /* u */
    size_t chunk_floats[TIER_KINDS]; /* floats of one chunk of each kind */
    char err[256];
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
