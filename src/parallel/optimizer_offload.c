/* The AdamW moments streamed through the disk chunk tier: see optimizer_offload.h. m is the tier's
 * TIER_Q kind, v its TIER_KV kind and the weights (with `master`) its TIER_O kind, chunk i of each
 * holding elements [i C, (i + 1) C) of the range; the tier's one "layer" is keyed by the object's
 * own `key`. */
#include "parallel/optimizer_offload.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory/chunk_tier.h"

struct OptOffload {
    ChunkTier *tier;
    size_t n, chunk; /* elements of the range; per chunk */
    int chunks, master;
    float key;       /* the tier's name for the one set of chunks */
    char dir[200];
};

/* $SEQPAR_OPT_OFFLOAD_CHUNK (a test hook: many chunks of an odd size on a small model, their ends
 * inside tensors and SIMD vectors): its value, 0 where unset or empty, -1 where it is no positive number */
static long long env_chunk(void) {
    const char *env = getenv("SEQPAR_OPT_OFFLOAD_CHUNK");
    if (!env || !*env) return 0;
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(env, &end, 10);
    return *end || errno || v < 1 || env[0] < '0' || env[0] > '9' ? -1 : v;
}

int optimizer_offload_env_check(char *err, size_t n) {
    if (env_chunk() >= 0) return 0;
    snprintf(err, n, "SEQPAR_OPT_OFFLOAD_CHUNK=%.40s: expected a positive number of elements a chunk (a test knob: "
             "unset it for normal runs)", getenv("SEQPAR_OPT_OFFLOAD_CHUNK"));
    return 1;
}

static size_t chunk_max(void) {
    const long long v = env_chunk();
    return v > 0 ? (size_t)v : OPT_OFFLOAD_CHUNK;
}

size_t optimizer_offload_chunk(size_t n) {
    const size_t c = chunk_max();
    return n < c ? (n ? n : 1) : c;
}

static size_t chunk_count(size_t n) {
    const size_t c = optimizer_offload_chunk(n);
    return n ? (n + c - 1) / c : 1;
}

/* two staging and two read buffers for each of m, v (and the weights) */
double optimizer_offload_ram_bytes(size_t n, int master) {
    return (master ? 3.0 : 2.0) * 4 * sizeof(float) * (double)optimizer_offload_chunk(n);
}

double optimizer_offload_disk_bytes(size_t n, int master) {
    return (master ? 3.0 : 2.0) * sizeof(float) * (double)chunk_count(n) * (double)optimizer_offload_chunk(n);
}

int optimizer_offload_master(const OptOffload *o) { return o->master; }

/* the tier's kind of moment k (2: the weights) */
static TierKind kind_of(int k) { return k == 0 ? TIER_Q : k == 1 ? TIER_KV : TIER_O; }

OptOffload *optimizer_offload_create(const char *dir, int rank, size_t n, int master, SeqErr *e) {
    OptOffload *o = xcalloc(1, sizeof *o);
    o->n = n;
    o->master = master;
    o->chunk = optimizer_offload_chunk(n);
    const size_t chunks = chunk_count(n);
    if (chunks > (size_t)INT_MAX / 2) { /* 2^50 elements and more */
        xfree(o);
        seq_err(e, OPT_OFFLOAD_FLAG " %s: %zu moments are more than the tier's chunk count allows", dir, n);
        return NULL;
    }
    o->chunks = (int)chunks;
    snprintf(o->dir, sizeof o->dir, "%s", dir);
    const size_t sizes[TIER_KINDS] = {o->chunk, o->chunk, master ? o->chunk : 0, 0};
    char err[512];
    o->tier = chunk_tier_disk_create(OPT_OFFLOAD_FLAG, dir, rank, o->chunks, sizes, 0, err, sizeof err);
    if (!o->tier) {
        xfree(o);
        seq_err(e, "%s", err);
        return NULL;
    }
    if (chunk_tier_disk_reserve(o->tier, 1) != 0) {
        const double b = optimizer_offload_disk_bytes(n, master), gib = b >= 1073741824.0;
        seq_err(e, OPT_OFFLOAD_FLAG " %s: cannot reserve %.2f %s for the optimizer state there (%s): free space "
                "there or give a directory on a larger disk", dir, b / (gib ? 1073741824.0 : 1048576.0),
                gib ? "GiB" : "MiB", strerror(o->tier->io_errno));
        optimizer_offload_free(o);
        return NULL;
    }
    return o;
}

void optimizer_offload_free(OptOffload *o) {
    if (!o) return;
    chunk_tier_destroy(o->tier);
    xfree(o);
}

static size_t chunk_len(const OptOffload *o, int i) {
    const size_t lo = (size_t)i * o->chunk;
    return o->n - lo < o->chunk ? o->n - lo : o->chunk;
}

void optimizer_offload_update(OptOffload *o, AdamW *opt, const ParamTable *table, float *params, size_t params_base,
                              const float *grads, size_t grads_base, float lr, float grad_scale) {
    if (opt->end - opt->begin != o->n) die("internal: optimizer_offload_update: a range of another size");
    AdamWStep s;
    adamw_step_begin(opt, lr, grad_scale, &s);
    ChunkTier *t = o->tier;
    if (!o->n) return;
    const int kinds = o->master ? 3 : 2;
    for (int k = 0; k < kinds; k++) t->prefetch(t, &o->key, kind_of(k), 0, 0);
    for (int i = 0; i < o->chunks; i++) {
        const float *r[3];
        float *w[3];
        for (int k = 0; k < kinds; k++) r[k] = t->fetch(t, &o->key, kind_of(k), i, i & 1);
        if (i + 1 < o->chunks) /* read while this chunk is updated */
            for (int k = 0; k < kinds; k++) t->prefetch(t, &o->key, kind_of(k), i + 1, (i + 1) & 1);
        /* the staging buffers of chunk i - 2, whose writes are waited for */
        const size_t len = chunk_len(o, i), lo = opt->begin + (size_t)i * o->chunk;
        for (int k = 0; k < kinds; k++) {
            w[k] = t->slot(t, &o->key, kind_of(k), i);
            memcpy(w[k], r[k], sizeof(float) * len);
        }
        if (o->master) params = w[2], params_base = lo;
        adamw_apply(opt, &s, table, params, params_base, grads, grads_base, w[0], w[1], lo, lo + len);
        for (int k = 0; k < kinds; k++) t->store(t, &o->key, kind_of(k), i);
    }
}

void optimizer_offload_read(OptOffload *o, int moment, size_t first, size_t n, float *dst) {
    if (!n) return;
    if (moment == 2 && !o->master) die("internal: optimizer_offload_read: the weights are not in the file");
    ChunkTier *t = o->tier;
    const TierKind kind = kind_of(moment);
    const int a = (int)(first / o->chunk), b = (int)((first + n - 1) / o->chunk);
    for (int i = a; i <= b; i++) {
        if (i < b) t->prefetch(t, &o->key, kind, i + 1, (i + 1) & 1);
        const float *r = t->fetch(t, &o->key, kind, i, i & 1);
        const size_t lo = (size_t)i * o->chunk, from = first > lo ? first : lo;
        const size_t to = first + n < lo + o->chunk ? first + n : lo + o->chunk;
        memcpy(dst + (from - first), r + (from - lo), sizeof(float) * (to - from));
    }
}

void optimizer_offload_write(OptOffload *o, int moment, size_t first, size_t n, const float *src) {
    if (moment == 2 && !o->master) die("internal: optimizer_offload_write: the weights are not in the file");
    ChunkTier *t = o->tier;
    const TierKind kind = kind_of(moment);
    for (size_t at = first; at < first + n;) {
        const int i = (int)(at / o->chunk);
        const size_t lo = (size_t)i * o->chunk, len = chunk_len(o, i);
        const size_t to = first + n < lo + len ? first + n : lo + len;
        float *w = t->slot(t, &o->key, kind, i);
        if (at > lo || to < lo + len) memcpy(w, t->fetch(t, &o->key, kind, i, 0), sizeof(float) * len); /* a part */
        memcpy(w + (at - lo), src + (at - first), sizeof(float) * (to - at));
        t->store(t, &o->key, kind, i);
        at = to;
    }
}

char *optimizer_offload_flags_error(const char *dir, int master, int zero, int world) {
    if (!master) return NULL;
    if (!dir) return xstrdup("--offload-master keeps the weights' shard in the optimizer's file: add --offload-optimizer DIR");
    if (zero != 3)
        return xstrdup_printf("--offload-master moves ZeRO-3's parameter shard to disk, but under --zero %d every rank's "
                          "whole weights are the model's working weights, kept in RAM: add --zero 3, or drop "
                          "--offload-master", zero);
    if (world < 2)
        return xstrdup("--offload-master moves ZeRO-3's parameter shard to disk, but one rank has no shard (its "
                       "weights are the model's working weights, kept in RAM): run on more ranks, or drop --offload-master");
    return NULL;
}

int optimizer_offload_error(const OptOffload *o, SeqErr *e) {
    if (!o->tier->io_errno) return 0;
    return seq_err(e, OPT_OFFLOAD_FLAG " %s: the optimizer state file could not be written or read (%s): free space "
                   "there or choose another directory", o->dir, strerror(o->tier->io_errno));
}

void optimizer_offload_stats(const OptOffload *o, unsigned long long *written, unsigned long long *read,
                             double *wait_s) {
    TierStats s;
    chunk_tier_stats(o->tier, &s);
    *written = s.bytes_written;
    *read = s.bytes_read;
    *wait_s = s.wait_s;
}
