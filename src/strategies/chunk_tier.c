/* The RAM memory tier of FPDT's chunks: see chunk_tier.h. */
#include "strategies/chunk_tier.h"

#include "core/common.h"

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
