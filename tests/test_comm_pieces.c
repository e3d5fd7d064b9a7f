/* comm.h's size_t counts: every collective and point-to-point call, run at piece sizes of 1, 2, 3,
 * 7 and 100 elements (comm_set_piece) and at the defaults, with per-rank counts at each boundary of
 * a piece (0, 1, piece - 1, piece, piece + 1, 2 piece + 1, 3 piece), so that every splitting path
 * (the reduce-scatter's and the allreduce's pieces, the per-rank-count collectives over
 * point-to-point messages, the derived datatype of a span past the limit, runs of an elementwise
 * allreduce) runs at small counts, every element of every result checked exactly and the bytes
 * counted as the direct model. The reduce-scatter's sums are checked bit for bit against the
 * documented order (me, me+1, ..., me-1) with values whose fp32 sum depends on it: the piece size
 * moves no addition.
 *
 * `test_comm_pieces --big` (2 ranks, NOT in the default suite: ~8.5 GiB and ~30 s here; see
 * docs/testing.md) runs the same calls at the defaults past 2^31 elements:
 *   - a reduce-scatter of floats whose block on rank 0 is 2^31 + 1024 floats (8 GiB + 4 KiB) and on
 *     rank 1 1027: rank 0 holds the 8 GiB result; the 8 GiB inputs (rank 1's, sent, and rank 0's,
 *     read and then the landing space of rank 1's pieces) are a 64 MiB pattern mapped again and
 *     again (memfd), so they take 64 MiB each; every one of the 2^31 + 1024 sums checked;
 *   - an all-gatherv, a nonblocking all-gatherv, a gatherv and an all-to-allv of MPI_BYTE elements
 *     with blocks of 2^31 + 3 and 5 elements (counts and displacements past INT_MAX; 2 GiB + 8 B a
 *     buffer, two or three a rank), every byte checked;
 *   - a point-to-point message, an all-gather and a broadcast of 2^31 + 3 bytes (one element of a
 *     derived datatype), every byte checked.
 * Prints "N passed, N failed". */
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/common.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "testlib.h"

static int g_rank, g_size;

/* An element count at a boundary of piece pc (pc 0: the defaults, small counts). */
static size_t boundary(size_t pc, int i) {
    if (!pc) {
        static const size_t plain[] = {0, 1, 5, 17, 33, 64};
        return plain[i % 6];
    }
    const size_t c[] = {0, 1, pc - 1, pc, pc + 1, 2 * pc + 1, 3 * pc};
    return c[i % 7];
}

/* Rank r's contribution to element i: values whose fp32 sum depends on the order of the additions. */
static float rs_value(int r, size_t i, int salt) {
    return (float)(sin(0.37 * (double)i + 1.3 * r + salt) * (1.0 + 0.25 * r) * pow(10.0, (double)(i % 7) - 3.0));
}

/* An exact small integer for (source rank, destination or 0, index), < 2^12. */
static unsigned pat(int src, int dst, size_t i) { return (unsigned)((i * 7 + (size_t)src * 131 + (size_t)dst * 17) % 4093); }

static void test_reduce_scatter(Comm *cm, MPI_Comm mc, size_t pc) {
    size_t *counts = xmalloc(sizeof(size_t) * (size_t)g_size), *displs = xmalloc(sizeof(size_t) * (size_t)g_size);
    for (int shift = 0; shift < 7; shift++) {
        size_t total = 0;
        for (int p = 0; p < g_size; p++) counts[p] = boundary(pc, p + shift), displs[p] = total, total += counts[p];
        const size_t own = counts[g_rank];
        float *src[2], *dst[2];
        for (int a = 0; a < 2; a++) {
            src[a] = xmalloc(sizeof(float) * (total + 1));
            dst[a] = xmalloc(sizeof(float) * (own + 1));
            for (size_t i = 0; i < total; i++) src[a][i] = rs_value(g_rank, i, a + shift);
        }
        comm_stats_reset(cm);
        if (shift % 2) { /* two in flight on tags 0 and 1 */
            CommReduceScatter rs[2] = {{0}, {0}};
            for (int a = 0; a < 2; a++) comm_rs_post(cm, COMM_GRAD_REDUCE, &rs[a], src[a], dst[a], counts, mc, a);
            comm_rs_test(cm, COMM_GRAD_REDUCE, 2, rs);
            comm_rs_wait(cm, COMM_GRAD_REDUCE, 2, rs);
        } else {
            for (int a = 0; a < 2; a++) comm_reduce_scatter(cm, COMM_GRAD_REDUCE, src[a], dst[a], counts, mc);
        }
        size_t bad = 0, kept = 0;
        for (int a = 0; a < 2; a++) {
            for (size_t i = 0; i < own; i++) {
                const size_t e = displs[g_rank] + i;
                float want = rs_value(g_rank, e, a + shift);
                for (int q = 1; q < g_size; q++) want += rs_value((g_rank + q) % g_size, e, a + shift);
                bad += memcmp(&want, &dst[a][i], sizeof want) != 0;
            }
            for (size_t i = 0; i < total; i++)
                if (i < displs[g_rank] || i >= displs[g_rank] + own) kept += src[a][i] != rs_value(g_rank, i, a + shift);
        }
        CHECK(bad == 0 && kept == 0, "piece %zu shift %d: reduce-scatter: %zu sums off the documented order, %zu other "
              "elements changed", pc, shift, bad, kept);
        CHECK(comm_stats_bytes(&cm->stats, COMM_GRAD_REDUCE) == 2 * 4 * (uint64_t)(total - own),
              "piece %zu: reduce-scatter bytes %llu", pc, (unsigned long long)comm_stats_bytes(&cm->stats, COMM_GRAD_REDUCE));
        for (int a = 0; a < 2; a++) xfree(src[a]), xfree(dst[a]);
    }
    xfree(counts);
    xfree(displs);
}

static void test_allreduce(Comm *cm, MPI_Comm mc, size_t pc) {
    /* seqpar's own (floats, sum, >= COMM_ALLREDUCE_OWN_MIN): its pieces; exact integer sums */
    const size_t n = COMM_ALLREDUCE_OWN_MIN + 3 + 2 * pc;
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < n; i++) x[i] = (float)pat(g_rank, 0, i);
        comm_allreduce(cm, COMM_GRAD_REDUCE, inplace ? MPI_IN_PLACE : x, inplace ? x : y, n, MPI_FLOAT, MPI_SUM, mc);
        const float *got = inplace ? x : y;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned want = 0;
            for (int r = 0; r < g_size; r++) want += pat(r, 0, i);
            bad += got[i] != (float)want;
        }
        CHECK(bad == 0, "piece %zu: own allreduce (%s) of %zu floats: %zu wrong", pc, inplace ? "in place" : "copy", n, bad);
    }
    xfree(x);
    xfree(y);
    /* MPI's (doubles; ints by max), in runs of at most the limit */
    for (int j = 0; j < 7; j++) {
        const size_t m = boundary(pc, j) + 1;
        double *d = xmalloc(sizeof(double) * m), *e = xmalloc(sizeof(double) * m);
        int *v = xmalloc(sizeof(int) * m);
        long *l = xmalloc(sizeof(long) * m);
        for (size_t i = 0; i < m; i++) d[i] = pat(g_rank, 1, i), v[i] = (int)pat(g_rank, 2, i), l[i] = (long)pat(g_rank, 3, i);
        comm_allreduce(cm, COMM_GRAD_REDUCE, d, e, m, MPI_DOUBLE, MPI_SUM, mc);
        comm_allreduce(cm, COMM_GRAD_REDUCE, MPI_IN_PLACE, d, m, MPI_DOUBLE, MPI_SUM, mc);
        comm_allreduce(cm, COMM_GRAD_REDUCE, MPI_IN_PLACE, v, m, MPI_INT, MPI_MAX, mc);
        comm_control_allreduce(cm, "test", l, m, MPI_LONG, MPI_SUM, mc);
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            double s = 0;
            long ls = 0;
            int mx = 0;
            for (int r = 0; r < g_size; r++)
                s += pat(r, 1, i), ls += pat(r, 3, i), mx = (int)pat(r, 2, i) > mx ? (int)pat(r, 2, i) : mx;
            bad += d[i] != s || e[i] != s || v[i] != mx || l[i] != ls;
        }
        CHECK(bad == 0, "piece %zu: MPI allreduce runs of %zu elements: %zu wrong", pc, m, bad);
        xfree(d), xfree(e), xfree(v), xfree(l);
    }
}

/* All-gatherv (blocking in place and not, two nonblocking in flight) and gatherv to the first and
 * the last rank, of floats and of bytes. */
static void test_gathers(Comm *cm, MPI_Comm mc, size_t pc) {
    size_t *counts = xmalloc(sizeof(size_t) * (size_t)g_size), *displs = xmalloc(sizeof(size_t) * (size_t)g_size);
    for (int shift = 0; shift < 7; shift++) {
        size_t total = 0;
        for (int p = 0; p < g_size; p++) counts[p] = boundary(pc, 2 * p + shift), displs[p] = total, total += counts[p];
        const size_t mine = counts[g_rank];
        for (int ty = 0; ty < 2; ty++) { /* MPI_FLOAT, MPI_BYTE */
            const MPI_Datatype dt = ty ? MPI_BYTE : MPI_FLOAT;
            const size_t es = ty ? 1 : 4;
            unsigned char *a = xcalloc(total * es + 1, 1), *b = xcalloc(total * es + 1, 1), *own = xmalloc(mine * es + 1);
#define PUT(buf, i, v) (ty ? (void)((buf)[i] = (unsigned char)(v)) : (void)(((float *)(void *)(buf))[i] = (float)(v)))
#define GET(buf, i) (ty ? (unsigned)(buf)[i] : (unsigned)((const float *)(const void *)(buf))[i])
            for (size_t i = 0; i < mine; i++) PUT(own, i, pat(g_rank, 0, i) & (ty ? 255u : ~0u));
            for (size_t i = 0; i < mine; i++) PUT(a, displs[g_rank] + i, GET(own, i));
            comm_stats_reset(cm);
            comm_allgatherv(cm, COMM_PARAM_GATHER, MPI_IN_PLACE, mine, a, counts, displs, dt, mc);
            comm_allgatherv(cm, COMM_PARAM_GATHER, own, mine, b, counts, displs, dt, mc);
            unsigned char *c2[2] = {xcalloc(total * es + 1, 1), xcalloc(total * es + 1, 1)};
            CommGather ag[2] = {{0}, {0}};
            for (int k = 0; k < 2; k++) comm_iallgatherv(cm, COMM_PARAM_GATHER, own, mine, c2[k], counts, displs, dt, mc, &ag[k]);
            comm_gather_test(cm, COMM_PARAM_GATHER, 2, ag);
            comm_gather_wait(cm, COMM_PARAM_GATHER, 2, ag);
            CHECK(!comm_gather_active(&ag[0]) && !comm_gather_active(&ag[1]), "gathers complete after the wait");
            size_t bad = 0;
            for (int p = 0; p < g_size; p++)
                for (size_t i = 0; i < counts[p]; i++) {
                    const unsigned want = pat(p, 0, i) & (ty ? 255u : ~0u);
                    const size_t at = displs[p] + i;
                    bad += GET(a, at) != want || GET(b, at) != want || GET(c2[0], at) != want || GET(c2[1], at) != want;
                }
            CHECK(bad == 0, "piece %zu shift %d %s: all-gatherv: %zu elements wrong", pc, shift, ty ? "bytes" : "floats", bad);
            CHECK(comm_stats_bytes(&cm->stats, COMM_PARAM_GATHER) == 4 * (uint64_t)mine * es * (uint64_t)(g_size - 1),
                  "piece %zu: all-gatherv bytes", pc);
            for (int root = 0; root < g_size; root += g_size > 1 ? g_size - 1 : 1) {
                memset(b, 0, total * es + 1);
                comm_stats_reset(cm);
                comm_gatherv(cm, COMM_PARAM_GATHER, own, mine, g_rank == root ? b : NULL, g_rank == root ? counts : NULL,
                             g_rank == root ? displs : NULL, dt, root, mc);
                bad = 0;
                if (g_rank == root)
                    for (int p = 0; p < g_size; p++)
                        for (size_t i = 0; i < counts[p]; i++) bad += GET(b, displs[p] + i) != (pat(p, 0, i) & (ty ? 255u : ~0u));
                CHECK(bad == 0, "piece %zu shift %d: gatherv to %d: %zu elements wrong", pc, shift, root, bad);
                CHECK(comm_stats_bytes(&cm->stats, COMM_PARAM_GATHER) == (g_rank == root ? 0 : (uint64_t)mine * es),
                      "piece %zu: gatherv bytes", pc);
            }
#undef PUT
#undef GET
            xfree(a), xfree(b), xfree(own), xfree(c2[0]), xfree(c2[1]);
        }
    }
    xfree(counts);
    xfree(displs);
}

/* Elements from rank s to rank d in the all-to-allv test. */
static size_t a2a_count(size_t pc, int s, int d, int shift) { return boundary(pc, s * 3 + d + shift); }

static void test_alltoallv(Comm *cm, MPI_Comm mc, size_t pc) {
    const size_t n = (size_t)g_size;
    size_t *sc = xmalloc(sizeof(size_t) * 4 * n), *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
    for (int shift = 0; shift < 7; shift++) {
        size_t most = 0, st = 0, rt = 0;
        for (int r = 0; r < g_size; r++) { /* the bound over every rank's counts */
            size_t out = 0, in = 0;
            for (int p = 0; p < g_size; p++) out += a2a_count(pc, r, p, shift), in += a2a_count(pc, p, r, shift);
            most = out > most ? out : most;
            most = in > most ? in : most;
        }
        for (int p = 0; p < g_size; p++) {
            sc[p] = a2a_count(pc, g_rank, p, shift), sd[p] = st, st += sc[p];
            rc[p] = a2a_count(pc, p, g_rank, shift), rd[p] = rt, rt += rc[p];
        }
        float *s = xmalloc(sizeof(float) * (st + 1)), *r = xcalloc(rt + 1, sizeof(float));
        for (int p = 0; p < g_size; p++)
            for (size_t i = 0; i < sc[p]; i++) s[sd[p] + i] = (float)pat(g_rank, p, i);
        comm_stats_reset(cm);
        comm_alltoallv(cm, COMM_ALLTOALL, s, sc, sd, r, rc, rd, MPI_FLOAT, most, mc);
        size_t bad = 0;
        uint64_t bytes = 0;
        for (int p = 0; p < g_size; p++) {
            for (size_t i = 0; i < rc[p]; i++) bad += r[rd[p] + i] != (float)pat(p, g_rank, i);
            if (p != g_rank) bytes += 4 * (uint64_t)sc[p];
        }
        CHECK(bad == 0, "piece %zu shift %d: all-to-allv (bound %zu): %zu elements wrong", pc, shift, most, bad);
        CHECK(comm_stats_bytes(&cm->stats, COMM_ALLTOALL) == bytes, "piece %zu: all-to-allv bytes", pc);
        xfree(s), xfree(r);
    }
    xfree(sc);
}

/* Equal blocks and single messages: one element of a derived type past the limit. */
static void test_spans(Comm *cm, MPI_Comm mc, size_t pc) {
    const size_t n = (size_t)g_size;
    for (int j = 0; j < 7; j++) {
        const size_t B = boundary(pc, j) + 2; /* bytes */
        unsigned char *s = xmalloc(B * n), *r = xcalloc(B * n, 1);
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < B; i++) s[p * B + i] = (unsigned char)pat(g_rank, (int)p, i);
        size_t bad = 0;
        comm_alltoall(cm, COMM_ALLTOALL, s, r, B, mc);
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < B; i++) bad += r[p * B + i] != (unsigned char)pat((int)p, g_rank, i);
        memset(r, 0, B * n);
        comm_allgather(cm, COMM_TEAM, s, r, B, mc);
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < B; i++) bad += r[p * B + i] != (unsigned char)pat((int)p, 0, i);
        memset(r, 0, B * n);
        comm_allgather_meta(cm, COMM_TEAM, s, r, B, mc);
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < B; i++) bad += r[p * B + i] != (unsigned char)pat((int)p, 0, i);
        memcpy(r, s, B);
        comm_control_bcast(cm, "test", r, B, g_size - 1, mc);
        for (size_t i = 0; i < B; i++) bad += r[i] != (unsigned char)pat(g_size - 1, 0, i);
        /* a ring: to the next rank, from the previous */
        const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
        MPI_Request req[2];
        memset(r, 0, B);
        comm_irecv(cm, COMM_P2P_INNER, r, B, prev, 7, mc, &req[0]);
        comm_isend(cm, COMM_P2P_INNER, s + (size_t)next * B, B, next, 7, mc, &req[1]);
        comm_waitall(cm, COMM_P2P_INNER, 2, req);
        for (size_t i = 0; i < B; i++) bad += r[i] != (unsigned char)pat(prev, g_rank, i);
        /* floats on the bf16 wire (small integers: exact) */
        const size_t F = B / 2 + 1;
        float *fs = xmalloc(sizeof(float) * F), *fr = xcalloc(F * n, sizeof(float));
        for (size_t i = 0; i < F; i++) fs[i] = (float)(pat(g_rank, 0, i) & 255u);
        comm_irecv_floats(cm, COMM_P2P_INNER, fr, F, COMM_WIRE_BF16, prev, 8, mc, &req[0]);
        comm_isend_floats(cm, COMM_P2P_INNER, fs, F, COMM_WIRE_BF16, next, 8, mc, &req[1]);
        comm_waitall(cm, COMM_P2P_INNER, 2, req);
        for (size_t i = 0; i < F; i++) bad += fr[i] != (float)(pat(prev, 0, i) & 255u);
        comm_allgather_floats(cm, COMM_TEAM, fs, fr, F, COMM_WIRE_BF16, mc);
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < F; i++) bad += fr[p * F + i] != (float)(pat((int)p, 0, i) & 255u);
        CHECK(bad == 0, "piece %zu: spans of %zu bytes (all-to-all, all-gathers, broadcast, ring, bf16 wire): %zu wrong",
              pc, B, bad);
        xfree(s), xfree(r), xfree(fs), xfree(fr);
    }
}

/* ---- --big: past 2^31 elements on 2 ranks ---- */

/* `reserve` bytes of address space whose first `windows` bytes (a multiple of `period`, itself a
 * multiple of the page size) are the same `period` bytes of memory again and again (a memfd mapped
 * at each window): they take `period` bytes, whatever their length; writes alias across windows.
 * The rest stays unmapped for the caller. */
static unsigned char *periodic_map(size_t reserve, size_t windows, size_t period) {
    const int fd = memfd_create("test_comm_pieces", 0);
    if (fd < 0 || ftruncate(fd, (off_t)period) != 0) die("memfd_create / ftruncate failed");
    unsigned char *r = mmap(NULL, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) die("mmap (reserve %zu bytes) failed", reserve);
    for (size_t o = 0; o < windows; o += period)
        if (mmap(r + o, period, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
            die("mmap (window at %zu) failed", o);
    close(fd);
    return r;
}

static void test_big(Comm *cm, MPI_Comm mc) {
    const size_t BIG = ((size_t)1 << 31) + 1024, SMALL = 1027; /* floats: rank 0's block, rank 1's */
    const size_t PERIOD = (size_t)16 << 20;                    /* floats a window: 64 MiB */
    const size_t big_bytes = BIG * sizeof(float);              /* a multiple of 4 KiB */
    /* the input: [BIG floats: the pattern | SMALL floats: plain memory], value of element i on rank
     * r: (i % PERIOD) % 1021 + 2 r (exact integers; the pattern repeats with the windows) */
    const size_t small_bytes = (SMALL * sizeof(float) + 4095) / 4096 * 4096;
    const size_t windows = (big_bytes + PERIOD * 4 - 1) / (PERIOD * 4) * (PERIOD * 4), reserve = windows + small_bytes;
    unsigned char *base = periodic_map(reserve, windows, PERIOD * 4);
    float *src = (float *)(void *)base;
    for (size_t i = 0; i < PERIOD; i++) src[i] = (float)(i % 1021 + 2 * (size_t)g_rank);
    /* the small block right after the big one (big_bytes is a multiple of the page), in plain memory */
    float *small = src + BIG;
    if (mmap(small, small_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
        die("mmap (the small block) failed");
    for (size_t i = 0; i < SMALL; i++) small[i] = (float)((BIG + i) % PERIOD % 1021 + 2 * (size_t)g_rank);
    size_t counts[2] = {BIG, SMALL};
    const size_t own = counts[g_rank];
    float *dst = xmalloc(sizeof(float) * own);
    double t0 = MPI_Wtime();
    comm_reduce_scatter(cm, COMM_GRAD_REDUCE, src, dst, counts, mc);
    size_t bad = 0;
    for (size_t i = 0; i < own; i++) {
        const size_t e = (g_rank ? BIG : 0) + i;
        bad += dst[i] != (float)(2 * (e % PERIOD % 1021) + 2);
    }
    CHECK(bad == 0, "big reduce-scatter: %zu of %zu sums wrong", bad, own);
    CHECK(comm_stats_bytes(&cm->stats, COMM_GRAD_REDUCE) == 4 * (uint64_t)counts[1 - g_rank], "big reduce-scatter bytes");
    if (g_rank == 0) printf("reduce-scatter of %zu + %zu floats: %.1f s\n", BIG, SMALL, MPI_Wtime() - t0);
    xfree(dst);
    munmap(base, reserve);

    /* bytes: blocks of 2^31 + 3 and 5 elements */
    const size_t B0 = ((size_t)1 << 31) + 3, B1 = 5, total = B0 + B1;
    size_t bc[2] = {B0, B1}, bd[2] = {0, B0};
    const size_t mine = bc[g_rank];
    unsigned char *all = xmalloc(total);
    t0 = MPI_Wtime();
    for (size_t i = 0; i < mine; i++) all[bd[g_rank] + i] = (unsigned char)(pat(g_rank, 0, i) & 255u);
    comm_allgatherv(cm, COMM_PARAM_GATHER, MPI_IN_PLACE, mine, all, bc, bd, MPI_BYTE, mc);
    bad = 0;
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < bc[p]; i++) bad += all[bd[p] + i] != (unsigned char)(pat(p, 0, i) & 255u);
    CHECK(bad == 0, "big all-gatherv: %zu of %zu bytes wrong", bad, total);
    /* nonblocking, from rank 0's copy of its own block in place (rank 1 sends its 5) */
    memset(all + bd[1 - g_rank], 0, bc[1 - g_rank]);
    CommGather ag = {0};
    comm_iallgatherv(cm, COMM_PARAM_GATHER, MPI_IN_PLACE, mine, all, bc, bd, MPI_BYTE, mc, &ag);
    comm_gather_wait(cm, COMM_PARAM_GATHER, 1, &ag);
    bad = 0;
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < bc[p]; i++) bad += all[bd[p] + i] != (unsigned char)(pat(p, 0, i) & 255u);
    CHECK(bad == 0, "big nonblocking all-gatherv: %zu of %zu bytes wrong", bad, total);
    /* gatherv to rank 1 (the big block travels) */
    if (g_rank == 1) memset(all, 0, B0);
    comm_gatherv(cm, COMM_PARAM_GATHER, all + bd[g_rank], mine, g_rank == 1 ? all : NULL, bc, bd, MPI_BYTE, 1, mc);
    bad = 0;
    if (g_rank == 1)
        for (size_t i = 0; i < B0; i++) bad += all[i] != (unsigned char)(pat(0, 0, i) & 255u);
    CHECK(bad == 0, "big gatherv: %zu of %zu bytes wrong", bad, B0);
    if (g_rank == 0) printf("all-gatherv x 2, gatherv of %zu bytes: %.1f s\n", total, MPI_Wtime() - t0);
    /* all-to-allv: rank 0 sends rank 1 B0 bytes, everything else 5 */
    t0 = MPI_Wtime();
    size_t sc[2], sd[2], rc[2], rd[2];
    for (int p = 0; p < 2; p++) {
        sc[p] = g_rank == 0 && p == 1 ? B0 : B1;
        rc[p] = p == 0 && g_rank == 1 ? B0 : B1;
    }
    sd[0] = 0, sd[1] = sc[0], rd[0] = 0, rd[1] = rc[0];
    unsigned char *s = xmalloc(sc[0] + sc[1]);
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < sc[p]; i++) s[sd[p] + i] = (unsigned char)(pat(g_rank, p, i) & 255u);
    unsigned char *r = all; /* rc[0] + rc[1] <= total */
    memset(r, 0, rc[0] + rc[1]);
    comm_alltoallv(cm, COMM_ALLTOALL, s, sc, sd, r, rc, rd, MPI_BYTE, B0 + B1, mc);
    bad = 0;
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < rc[p]; i++) bad += r[rd[p] + i] != (unsigned char)(pat(p, g_rank, i) & 255u);
    CHECK(bad == 0, "big all-to-allv: %zu bytes wrong", bad);
    xfree(s);
    if (g_rank == 0) printf("all-to-allv of %zu bytes: %.1f s\n", B0, MPI_Wtime() - t0);
    /* one message, an all-gather of 2 x B0 bytes is too much here: a ring message and a broadcast */
    t0 = MPI_Wtime();
    unsigned char *m = all; /* total >= B0 */
    if (g_rank == 0)
        for (size_t i = 0; i < B0; i++) m[i] = (unsigned char)(pat(0, 1, i) & 255u);
    else
        memset(m, 0, B0);
    MPI_Request req = MPI_REQUEST_NULL;
    if (g_rank == 0) comm_isend(cm, COMM_P2P_INNER, m, B0, 1, 9, mc, &req);
    else comm_irecv(cm, COMM_P2P_INNER, m, B0, 0, 9, mc, &req);
    comm_waitall(cm, COMM_P2P_INNER, 1, &req);
    bad = 0;
    for (size_t i = 0; i < B0; i++) bad += m[i] != (unsigned char)(pat(0, 1, i) & 255u);
    CHECK(bad == 0, "big message: %zu of %zu bytes wrong", bad, B0);
    if (g_rank == 1) memset(m, 0, B0);
    comm_control_bcast(cm, "test (big)", m, B0, 0, mc);
    bad = 0;
    for (size_t i = 0; i < B0; i++) bad += m[i] != (unsigned char)(pat(0, 1, i) & 255u);
    CHECK(bad == 0, "big broadcast: %zu of %zu bytes wrong", bad, B0);
    if (g_rank == 0) printf("message and broadcast of %zu bytes: %.1f s\n", B0, MPI_Wtime() - t0);
    xfree(all);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const int big = argc > 1 && !strcmp(argv[1], "--big");
    Topology t;
    topology_create(&t, g_size, 1, 1, 1, PLACEMENT_HEAD_FIRST, 2);
    Comm *cm = comm_create(&t, NULL);
    if (big) {
        if (g_size != 2) die("test_comm_pieces --big runs on 2 ranks: mpirun -np 2 %s --big", argv[0]);
        comm_set_piece(cm, 0);
        test_big(cm, t.dp_comm);
    } else {
        const size_t pieces[] = {1, 2, 3, 7, 100, 0};
        for (size_t k = 0; k < ARRAY_LEN(pieces); k++) {
            comm_set_piece(cm, pieces[k]);
            test_reduce_scatter(cm, t.dp_comm, pieces[k]);
            test_allreduce(cm, t.dp_comm, pieces[k]);
            test_gathers(cm, t.dp_comm, pieces[k]);
            test_alltoallv(cm, t.dp_comm, pieces[k]);
            test_spans(cm, t.dp_comm, pieces[k]);
        }
    }
    comm_destroy(cm, NULL);
    topology_free(&t);
    /* every rank's failures count: the closing line is the world's */
    int f = tl_failed, fs = 0, ps = 0;
    MPI_Allreduce(&f, &fs, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&tl_passed, &ps, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int rc = 0;
    if (g_rank == 0) {
        tl_passed = ps, tl_failed = fs;
        rc = test_summary("test_comm_pieces");
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
