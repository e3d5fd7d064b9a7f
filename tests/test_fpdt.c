/* Tests of FPDT (src/strategies/fpdt.c: Ulysses run per sequence chunk, chunk_tier.h) against the
 * single-process reference (attn_reference.h), at whatever world size mpirun gives (1 rank: run
 * directly by run_tests.sh; 2, 3 and 4 ranks by test_mpi.sh). For every hp dividing the world
 * (dp = world / hp), head shapes MHA / GQA / MQA and head counts hp does not divide, and every
 * chunk count u with S divisible by u hp:
 *   - the rank-ordinal layout: local chunk i of member r holds global piece i hp + r;
 *   - o, lse (chunk-major suffix of `saved`), dq, dk, dv against the reference;
 *   - bytes and messages sent per kind, forward and backward, equal the volume formula exactly;
 *     saved_floats equals the memory formula;
 *   - restore() after wiping the recomputable prefix of `saved` rebuilds it bit for bit;
 *   - the chunk calls (forward_chunk, output_chunk, dout_chunk, backward_chunk: the model's
 *     streaming path) give forward's o and backward's dq, dk, dv bit for bit, chunk by chunk;
 *   - check() messages for bad u / S name lengths and chunk counts that work.
 * Packed documents for three head shapes; a sliding window of 11 positions (SeqAttention.window)
 * for two, in RAM and on the disk tier, against the single-process kernel with that window.
 * Prints "test_fpdt: N passed, N failed" (summed over ranks) and exits non-zero on failure. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/topology.h"
#include "core/common.h"
#include "memory/chunk_tier.h"
#include "strategies/registry.h"
#include "attn_reference.h"
#include "testlib.h"

extern void openblas_set_num_threads(int);


/* doc_start (S): packed documents (R then holds the per-document reference), or NULL; window: the
 * sliding window R was built with, or 0. */
static void run_case(const Topology *t, Comm *cm, const Strategy *fp, const Reference *R, const int *doc_start,
                     int window, int u, const char *offload, const char *what) {
    const HeadCase hc = R->hc;
    const int S = hc.S, H = hc.H, Hkv = hc.Hkv, d = hc.d, P = t->hp, N = S / P, c = N / u, Cn = S / u;
    StrategyParams sp = {.hp = P, .cp = 1, .chunks = u, .offload_dir = offload, .layout = LAYOUT_CONTIGUOUS, .seq_len = S, .n_heads = H,
                         .n_kv_heads = Hkv, .head_dim = d};
    char *err = strategy_check(fp, &sp);
    CHECKQ(!err, "%s: check: %s", what, err ? err : "");
    if (err) {
        xfree(err);
        return;
    }
    int *pos = xmalloc(sizeof(int) * (size_t)N);
    strategy_positions(fp, &sp, t->hp_rank, 0, pos);
    int layout_ok = 1;
    for (int i = 0; i < u; i++)
        for (int r = 0; r < c; r++)
            if (pos[i * c + r] != (i * P + t->hp_rank) * c + r) layout_ok = 0;
    CHECKQ(layout_ok, "%s: local chunk i must hold global piece i hp + r", what);
    SeqAttention *sa = strategy_create_attention(fp, &sp, t, cm);
    sa->window = window;
    AttnVolume vol;
    strategy_volume(fp, &sp, t->hp_rank, 0, &vol);
    AttnMemory mem;
    strategy_memory(fp, &sp, t->hp_rank, &mem);
    CHECKQ(sa->saved_floats == mem.saved_per_layer, "%s: saved floats %zu, formula %zu", what, sa->saved_floats,
           mem.saved_per_layer);
    CHECKQ(sa->kept_floats == mem.kept_per_layer, "%s: kept floats %zu, formula %zu", what, sa->kept_floats,
           mem.kept_per_layer);
    int *docs = reference_local_docs(doc_start, pos, N);
    comm_stats_reset(cm);
    sa->set_positions(sa, pos, docs);
    CHECKQ(cm->stats.meta_bytes == vol.meta_batch * (docs ? 2 : 1), "%s: positions: %llu meta bytes, formula %llu",
           what, (unsigned long long)cm->stats.meta_bytes, vol.meta_batch * (docs ? 2 : 1));
    const size_t nq = (size_t)N * H * d, nk = (size_t)N * Hkv * d;
    float *q = xmalloc(sizeof(float) * nq), *k = xmalloc(sizeof(float) * nk), *v = xmalloc(sizeof(float) * nk);
    float *dout = xmalloc(sizeof(float) * nq), *o = xmalloc(sizeof(float) * nq), *dq = xmalloc(sizeof(float) * nq);
    float *dk = xmalloc(sizeof(float) * nk), *dv = xmalloc(sizeof(float) * nk);
    gather_rows(q, R->q, pos, N, H * d);
    gather_rows(k, R->k, pos, N, Hkv * d);
    gather_rows(v, R->v, pos, N, Hkv * d);
    gather_rows(dout, R->dout, pos, N, H * d);
    float *saved = xmalloc(sizeof(float) * sa->saved_floats), *copy = xmalloc(sizeof(float) * sa->saved_floats);

    comm_stats_reset(cm);
    sa->forward(sa, q, k, v, o, saved);
    CommStats fst = cm->stats;
    comm_stats_reset(cm);
    CHECKQ(sa->keeps_inputs, "%s: keeps its inputs", what);
    sa->backward(sa, NULL, NULL, NULL, NULL, saved, dout, dq, dk, dv);
    CommStats bst = cm->stats;
    for (int kd = 0; kd < COMM_KINDS; kd++) {
        CHECKQ(comm_stats_bytes(&fst, (CommKind)kd) == vol.fwd[kd] && comm_stats_bytes(&bst, (CommKind)kd) == vol.bwd[kd],
               "%s: kind %d bytes fwd %llu bwd %llu, formula %llu %llu", what, kd,
               (unsigned long long)comm_stats_bytes(&fst, (CommKind)kd),
               (unsigned long long)comm_stats_bytes(&bst, (CommKind)kd), vol.fwd[kd], vol.bwd[kd]);
        CHECKQ(fst.messages[kd] == vol.fwd_msgs[kd] && bst.messages[kd] == vol.bwd_msgs[kd],
               "%s: kind %d messages fwd %llu bwd %llu, formula %llu %llu", what, kd,
               (unsigned long long)fst.messages[kd], (unsigned long long)bst.messages[kd], vol.fwd_msgs[kd],
               vol.bwd_msgs[kd]);
    }
    if (!docs) { /* the schedule fpdt plays: this member's cells and bytes as the run's */
        AttnWork wk;
        strategy_attention_work(fp, sa, &wk);
        StrategyParams pw = sp;
        pw.window = window;
        for (int ps = 0; ps < 2; ps++) {
            StepSchedule sc;
            strategy_play(fp, &pw, (SchedulePass)ps, &sc);
            MemberTotals mt;
            schedule_member_totals(&sc, t->hp_rank, &mt);
            const unsigned long long cells = ps ? wk.bwd_cells : wk.fwd_cells;
            CHECKQ(mt.cells == cells, "%s: played schedule computes %llu cells in %s, the run %llu", what, mt.cells,
                   ps ? "backward" : "forward", cells);
            int differ = 0;
            for (int kd = 0; kd < COMM_KINDS; kd++)
                differ += mt.bytes[kd] != comm_stats_bytes(ps ? &bst : &fst, (CommKind)kd) ||
                          mt.msgs[kd] != (ps ? bst : fst).messages[kd];
            CHECKQ(!differ, "%s: played schedule's %s bytes or messages differ from the run's in %d kinds", what,
                   ps ? "backward" : "forward", differ);
            schedule_free(&sc);
        }
    }
    double eo = row_err(o, R->o, pos, N, H * d, 1.0, 0);
    CHECKQ(eo <= O_ATOL, "%s: O error %.3g", what, eo);
    /* lse: the suffix, chunk-major, each chunk (Cn, Hl) holding positions [i Cn, (i+1) Cn) */
    const size_t lse_n = sa->kept_floats;
    const int Hl = (int)(lse_n / (size_t)S);
    CHECKQ(lse_n == (size_t)S * Hl && Hl >= 1, "%s: kept floats %zu is not S x Hl", what, lse_n);
    int h0 = 0; /* this member's first head: the first H mod hp members take one more */
    for (int m = 0; m < t->hp_rank; m++) h0 += H / P + (m < H % P);
    const float *lse = saved + sa->saved_floats - lse_n;
    double el = 0;
    for (int r = 0; r < S; r++)
        for (int h = 0; h < Hl; h++) {
            double ref = R->lse[(size_t)r * H + h0 + h];
            double e = fabs(lse[(size_t)r * Hl + h] - ref) / (LSE_ATOL + LSE_RTOL * fabs(ref));
            if (!(e <= el)) el = e;
        }
    CHECKQ(el <= 1.0, "%s: LSE error %.3g x tolerance (Cn %d)", what, el, Cn);
    double eq = row_err(dq, R->dq, pos, N, H * d, 1.0, 0) / (GRAD_REL * R->scale_dq);
    double ek = row_err(dk, R->dk, pos, N, Hkv * d, 1.0, 0) / (GRAD_REL * R->scale_dk);
    double ev = row_err(dv, R->dv, pos, N, Hkv * d, 1.0, 0) / (GRAD_REL * R->scale_dv);
    CHECKQ(eq <= 1.0 && ek <= 1.0 && ev <= 1.0, "%s: dQ %.3g dK %.3g dV %.3g x tolerance", what, eq, ek, ev);

    /* selective checkpointing: wipe the prefix, restore, bit-identical */
    memcpy(copy, saved, sizeof(float) * sa->saved_floats);
    memset(saved, 0xff, sizeof(float) * (sa->saved_floats - lse_n));
    sa->restore(sa, q, k, v, o, saved);
    CHECKQ(!memcmp(copy, saved, sizeof(float) * sa->saved_floats), "%s: restore differs from forward's saved", what);
    /* ... and backward after restore is bit-identical (the disk tier's chunks were rewritten) */
    float *dq2 = xmalloc(sizeof(float) * nq), *dk2 = xmalloc(sizeof(float) * nk), *dv2 = xmalloc(sizeof(float) * nk);
    sa->backward(sa, NULL, NULL, NULL, NULL, saved, dout, dq2, dk2, dv2);
    CHECKQ(!memcmp(dq, dq2, sizeof(float) * nq) && !memcmp(dk, dk2, sizeof(float) * nk) &&
               !memcmp(dv, dv2, sizeof(float) * nk), "%s: backward after restore differs", what);

    /* the chunk calls (seq_attention.h: the model's streaming path): forward_chunk over the chunks,
     * then output_chunk + dout_chunk per chunk, then backward_chunk per chunk give forward's o and
     * backward's dq, dk, dv bit for bit, chunk by chunk */
    CHECKQ(u > 1 ? sa->stream_chunks == u && sa->stream_rows == c && sa->forward_chunk && sa->output_chunk &&
                       sa->dout_chunk && sa->backward_chunk
                 : sa->stream_chunks == 0,
           "%s: stream_chunks %d rows %d (u %d, c %d)", what, sa->stream_chunks, sa->stream_rows, u, c);
    if (sa->stream_chunks > 1) {
        const size_t cq = (size_t)c * H * d, ck = (size_t)c * Hkv * d;
        float *oc = xmalloc(sizeof(float) * cq);
        int same_o = 1, same_again = 1, same_g = 1;
        memset(saved, 0xff, sizeof(float) * sa->saved_floats);
        for (int i = 0; i < u; i++) {
            sa->forward_chunk(sa, i, q + i * cq, k + i * ck, v + i * ck, oc, saved);
            if (memcmp(oc, o + i * cq, sizeof(float) * cq)) same_o = 0;
        }
        for (int i = 0; i < u; i++) {
            memset(oc, 0, sizeof(float) * cq);
            sa->output_chunk(sa, i, saved, oc);
            if (memcmp(oc, o + i * cq, sizeof(float) * cq)) same_again = 0;
            sa->dout_chunk(sa, i, saved, dout + i * cq);
        }
        for (int i = 0; i < u; i++) {
            sa->backward_chunk(sa, i, saved, dq2, dk2, dv2);
            if (memcmp(dq2, dq + i * cq, sizeof(float) * cq) || memcmp(dk2, dk + i * ck, sizeof(float) * ck) ||
                memcmp(dv2, dv + i * ck, sizeof(float) * ck))
                same_g = 0;
        }
        CHECKQ(same_o && same_again, "%s: forward_chunk's o %s, output_chunk's o %s forward's", what,
               same_o ? "equals" : "differs from", same_again ? "equals" : "differs from");
        CHECKQ(same_g, "%s: backward_chunk's dq, dk, dv differ from backward's", what);
        xfree(oc);
    }
    xfree(dq2);
    xfree(dk2);
    xfree(dv2);

    xfree(saved);
    xfree(copy);
    xfree(pos);
    xfree(docs);
    float *fr[] = {q, k, v, dout, o, dq, dk, dv};
    for (size_t i = 0; i < ARRAY_LEN(fr); i++) xfree(fr[i]);
    seq_attention_destroy(sa);
}

/* Stores chunks 0..2 of kinds q, kv, o of two layers with values val(l, i, kd, j), reads them back
 * in reverse (prefetching the next): 1 when every value returns bit for bit. */
static int disk_round_trip(ChunkTier *t, float *layers[2], const size_t sizes[TIER_KINDS],
                           float (*val)(int l, int i, int kd, size_t j)) {
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 3; i++)
            for (int kd = 0; kd < 3; kd++) {
                float *s = t->slot(t, layers[l], (TierKind)kd, i);
                for (size_t j = 0; j < sizes[kd]; j++) s[j] = val(l, i, kd, j);
                CHECKQ(t->store(t, layers[l], (TierKind)kd, i) == 0, "store");
            }
    int ok = 1;
    for (int l = 1; l >= 0; l--)
        for (int i = 2; i >= 0; i--)
            for (int kd = 0; kd < 3; kd++) {
                if (i > 0) t->prefetch(t, layers[l], (TierKind)kd, i - 1, (i - 1) & 1);
                const float *s = t->fetch(t, layers[l], (TierKind)kd, i, i & 1);
                for (size_t j = 0; s && j < sizes[kd]; j++)
                    if (s[j] != val(l, i, kd, j)) ok = 0;
                if (!s) ok = 0;
                t->release(t, s);
            }
    return ok;
}

static float plain_val(int l, int i, int kd, size_t j) { return (float)(1000 * l + 100 * i + 10 * kd) + (float)j; }
/* bf16 values (8 significant bits) for q and o; kv values that bf16 would round */
static float mixed_val(int l, int i, int kd, size_t j) {
    if (kd == TIER_KV) return (1.0f + (float)(j + 1) * 0x1p-20f) * (float)(1 + l + i + kd);
    return ldexpf(1.0f + (float)(((int)j * 7 + kd * 3 + i) % 128) / 128.0f, l * 5 + i - 6);
}

static void test_disk_tier(void) {
    const size_t sizes[TIER_KINDS] = {64, 128, 64, 8};
    char err[512] = "";
    ChunkTier *t = chunk_tier_disk_create("--offload-dir", "/nonexistent-seqpar-dir", 0, 2, sizes, 0, err, sizeof err);
    CHECKQ(!t && strstr(err, "--offload-dir /nonexistent-seqpar-dir: cannot create a file there"), "bad dir: %s", err);
    chunk_tier_destroy(t);
    t = chunk_tier_disk_create("--offload-dir", "/tmp", 0, 3, sizes, 0, err, sizeof err);
    CHECKQ(t != NULL, "disk tier in /tmp: %s", err);
    if (!t) return;
    float a[16], b[16]; /* two layers' saved (lse only: 3 x 8 floats is more than needed here) */
    float *layers[2] = {a, b};
    CHECKQ(disk_round_trip(t, layers, sizes, plain_val), "disk tier: chunks read back differ from those stored");
    TierStats st;
    chunk_tier_stats(t, &st);
    CHECKQ(st.bytes_written == 2 * 3 * 256 * sizeof(float) && st.bytes_read >= st.bytes_written,
           "disk tier: %llu bytes written, %llu read", st.bytes_written, st.bytes_read);
    chunk_tier_destroy(t);

    /* q_h and o_h kept as bf16 (kv_h in fp32): bf16 values come back bit for bit, in half the
     * bytes; the fp32 kind beside them unchanged */
    t = chunk_tier_disk_create("--offload-dir", "/tmp", 0, 3, sizes, 1u << TIER_Q | 1u << TIER_O, err, sizeof err);
    CHECKQ(t != NULL, "bf16 disk tier in /tmp: %s", err);
    if (!t) return;
    CHECKQ(disk_round_trip(t, layers, sizes, mixed_val), "bf16 disk tier: chunks read back differ from those stored");
    chunk_tier_stats(t, &st);
    /* per layer and chunk: q_h 64 x 2, kv_h 128 x 4, o_h 64 x 2 bytes */
    CHECKQ(st.bytes_written == 2 * 3 * (64 * 2 + 128 * 4 + 64 * 2) && st.bytes_read >= st.bytes_written,
           "bf16 disk tier: %llu bytes written (expected %d), %llu read", st.bytes_written, 2 * 3 * (64 * 2 + 128 * 4 + 64 * 2),
           st.bytes_read);
    chunk_tier_destroy(t);

    /* a full disk (simulated by a file size limit: writes past it fail with EFBIG): no crash,
     * io_errno set for the caller's collective check */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    t = chunk_tier_disk_create("--offload-dir", "/tmp", 0, 3, sizes, 0, err, sizeof err);
    CHECKQ(t != NULL, "disk tier in /tmp: %s", err);
    if (t) {
        for (int i = 0; i < 3; i++)
            for (int kd = 0; kd < 3; kd++) {
                float *s = t->slot(t, a, (TierKind)kd, i);
                memset(s, 0, sizeof(float) * sizes[kd]);
                t->store(t, a, (TierKind)kd, i);
            }
        const float *s = t->fetch(t, a, TIER_KV, 2, 0);
        CHECKQ(s != NULL && t->io_errno == EFBIG, "full disk: io_errno %d (%s), expected EFBIG", t->io_errno,
               t->err);
        chunk_tier_destroy(t);
    }
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
}

static void test_messages(const Strategy *fp) {
    StrategyParams p = {.hp = 2, .cp = 1, .chunks = 3, .seq_len = 256, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16};
    char *e = strategy_check(fp, &p);
    CHECKQ(e && strstr(e, "--seq-len 256") && strstr(e, "chunks x hp = 6") && strstr(e, "--chunks 1, 2, 4"),
           "u = 3, S = 256: %s", e ? e : "(accepted)");
    xfree(e);
    p.chunks = 8, p.seq_len = 200; /* 200 / 16 is not whole */
    e = strategy_check(fp, &p);
    CHECKQ(e && strstr(e, "192 or 208"), "u = 8, S = 200: %s", e ? e : "(accepted)");
    xfree(e);
    p.seq_len = 256, p.hp = 5;
    e = strategy_check(fp, &p);
    CHECKQ(e != NULL, "hp 5 > 4 heads accepted");
    xfree(e);
    p.hp = 2, p.cp = 2;
    e = strategy_check(fp, &p);
    CHECKQ(e && strstr(e, "--cp"), "cp 2: %s", e ? e : "(accepted)");
    xfree(e);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    const Strategy *fp = strategy_find("fpdt");
    CHECKQ(fp && fp->own && !fp->schedule, "fpdt is registered with its own attention");
    if (!fp) MPI_Abort(MPI_COMM_WORLD, 1);
    test_messages(fp);
    test_disk_tier();
    /* MHA, GQA, MQA, and head counts that do not divide by 3 or 4 */
    const HeadCase heads[] = {{4, 4, 16, 96}, {4, 2, 16, 96}, {4, 1, 32, 96}, {6, 2, 16, 96}, {5, 5, 8, 96}};
    long cases = 0;
    for (size_t hi = 0; hi < ARRAY_LEN(heads); hi++) {
        Reference R, P, Wr;
        const int window = hi == 1 || hi == 3 ? 11 : 0; /* a sliding window of 11 (of 96) for two shapes */
        reference_build(&R, heads[hi], 700 + (uint64_t)hi);
        if (window) reference_build_window(&Wr, heads[hi], 700 + (uint64_t)hi, window);
        int starts[96];
        reference_doc_starts(heads[hi].S, 90 + hi, starts);
        if (hi < 3) reference_build_docs(&P, heads[hi], 700 + (uint64_t)hi, starts);
        for (int hp = 1; hp <= g_size; hp++) {
            if (g_size % hp || hp > heads[hi].H) continue;
            Topology t;
            topology_create(&t, g_size / hp, hp, 1, 1, PLACEMENT_HEAD_FIRST, 2);
            Comm *cm = comm_create(&t, NULL);
            for (int u = 1; u <= 8; u++) {
                if (heads[hi].S % (u * hp)) continue;
                char what[128];
                snprintf(what, sizeof what, "fpdt dp%d hp%d u%d H%d Hkv%d d%d S%d", g_size / hp, hp, u, heads[hi].H,
                         heads[hi].Hkv, heads[hi].d, heads[hi].S);
                run_case(&t, cm, fp, &R, NULL, 0, u, NULL, what);
                cases++;
                if (window) { /* the sliding window, in RAM and (u = 2) on disk */
                    char w2[160];
                    snprintf(w2, sizeof w2, "%s window %d", what, window);
                    run_case(&t, cm, fp, &Wr, NULL, window, u, u == 2 ? "/tmp" : NULL, w2);
                    cases++;
                }
                if (hi < 3) { /* packed documents against each document run by itself */
                    char w2[160];
                    snprintf(w2, sizeof w2, "%s packed", what);
                    run_case(&t, cm, fp, &P, starts, 0, u, u == 2 ? "/tmp" : NULL, w2);
                    cases++;
                }
                if (u == 1 || u == 4) { /* the disk tier: same results, `saved` only lse */
                    char w2[160];
                    snprintf(w2, sizeof w2, "%s offload", what);
                    run_case(&t, cm, fp, &R, NULL, 0, u, "/tmp", w2);
                    cases++;
                }
            }
            comm_destroy(cm, NULL);
            topology_free(&t);
        }
        reference_free(&R);
        if (hi < 3) reference_free(&P);
        if (window) reference_free(&Wr);
    }
    long counts[2] = {tl_passed, tl_failed}, tot[2];
    MPI_Allreduce(counts, tot, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("ranks %d: %ld fpdt configurations per rank\n", g_size, cases);
        printf("test_fpdt: %ld passed, %ld failed\n", tot[0], tot[1]);
    }
    MPI_Finalize();
    return tot[1] ? 1 : 0;
}
