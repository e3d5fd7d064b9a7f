/* Tests of the WallFacer multi-ring context schedule (src/strategies/wallfacer.c). Run under
 * mpirun with 1, 2, 4, 8, 9 and 12 ranks (P = the number of ranks = cp, hp = 1): together they
 * cover C = 1 (plain ring), G = 1 (C = sqrt(P): no ring steps), G = 2 and G = 3 with C > 1.
 *
 * 1. The Communication Configuration Generator, on rank 0, for every P <= 64, every valid team
 *    size C (C^2 | P) and both placements: the context-rank map is a bijection with teams (team-
 *    first) or sub-rings (ring-first) on consecutive ranks; the initial send (Alg. 2) is a
 *    permutation whose receive side is its inverse; the sub-rings (Alg. 3) are cycles of G ranks
 *    inside a team group with the same member; SIMULATING the data movement (kv arrives by the
 *    initial send, then moves one hop per step) gives the kv team the schedule says it attends,
 *    and every (query team, kv team) pair is computed exactly once forward; backward (kv fixed,
 *    query bundles moving) every pair exactly once too, the last dq hop lands on the query team
 *    and the dk/dv return hop on the kv team.
 * 2. check(): bad C (C^2 not dividing P, C > sqrt(P), C < 1, not given) and bad S give one line
 *    naming the valid --team values / lengths; valid ones give NULL.
 * 3. Forward and backward on P ranks, for every valid C, both placements, the contiguous, zigzag
 *    and striped layouts and MHA / GQA / MQA (4 heads with 4, 2 and 1 KV heads, head_dim 16,
 *    S = 6P): every rank builds the same random global q, k, v, dout, the single-process
 *    reference (attn_forward / attn_backward over the whole sequence, positions 0..S-1) and
 *    compares O, LSE, dQ, dK, dV of its slot (layout_context_positions) with it. Bytes and
 *    messages per kind, forward and backward, equal wallfacer_rank_volume() of the rank EXACTLY,
 *    the maximum over ranks equals wallfacer_schedule.volume exactly, and their intra/inter-node
 *    split matches the peers' nodes (nodes of C ranks under team-first keep the team collectives
 *    intra-node; nodes of G ranks under ring-first keep the sub-ring P2P intra-node). The
 *    schedule's tracked allocation matches workspace_floats, and destroy frees all of it. Under
 *    zigzag the forward work (score cells) of the ranks differs by at most C n^2/2 (the C
 *    diagonal slot pairs some ranks meet) out of C^2 G n^2/2: the loader balances the teams.
 *
 * Tolerances (fp32; inputs ~N(0,1), at most S = 6P = 72 keys per row), as in test_dist_attention:
 *   O   absolute 2e-5 (the distributed result differs only in merge and tile order, ~1e-6);
 *   LSE absolute 2e-5 + 2e-6 relative (|lse| < ~12);
 *   dQ, dK, dV |err| <= 1e-4 x max|reference| of the tensor (sums of <= 72 products in another
 *       order give ~S eps; a missing or doubled block changes entries by ~1/S, 100x more).
 * Prints "test_wallfacer: N passed, N failed" (checks summed over ranks) from rank 0; exits
 * non-zero on failure. */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "core/common.h"
#include "parallel/layout.h"
#include "strategies/registry.h"
#include "strategies/wallfacer.h"

/* the schedule of the registry's wallfacer strategy */
#define wallfacer_schedule (*strategy_find("wallfacer")->schedule)
#include "attn_reference.h"
#include "testlib.h"

extern void openblas_set_num_threads(int);


/* ------------------------------------------------------------------------------------------ */
/* 1. The generator. */

/* Every check of one (P, C, placement); returns a description of the first violation or NULL. */
static const char *generator_case(int P, int C, int rf) {
    static char why[200];
    const int G = P / (C * C), T = P / C;
    WallfacerRank *cfg = xmalloc(sizeof(WallfacerRank) * (size_t)P);
    int *seen = xcalloc((size_t)P, sizeof(int)), *held = xmalloc(sizeof(int) * (size_t)P);
    int *tmp = xmalloc(sizeof(int) * (size_t)P), *kvfix = xmalloc(sizeof(int) * (size_t)P);
    int *cover = xcalloc((size_t)T * T, sizeof(int));
    const char *bad = NULL;
#define BAD(...) do { if (!bad) { snprintf(why, sizeof why, __VA_ARGS__); bad = why; } } while (0)
    for (int c = 0; c < P; c++) wallfacer_rank_config(P, C, rf, c, &cfg[c]);
    for (int c = 0; c < P; c++) {
        const WallfacerRank *r = &cfg[c];
        if (r->G != G || r->T != T || r->team < 0 || r->team >= T || r->member < 0 || r->member >= C)
            BAD("rank %d: team %d member %d out of range", c, r->team, r->member);
        if (wallfacer_ctx_rank(P, C, rf, r->team, r->member) != c) BAD("rank %d: map not inverted", c);
        if (r->group != r->team / G) BAD("rank %d: group", c);
        /* placement: consecutive ranks */
        if (!rf && c % C && (cfg[c - 1].team != r->team || cfg[c - 1].member != r->member - 1))
            BAD("team-first: rank %d not next to its team mate", c);
        if (rf && c % G && cfg[c - 1].ring_next != c) BAD("ring-first: rank %d not next in its sub-ring", c);
        /* Alg. 2 and its inverse */
        seen[r->init_send]++;
        if (cfg[r->init_send].init_recv != c) BAD("rank %d: init_recv of its target is not itself", c);
        /* Alg. 3 */
        const WallfacerRank *nx = &cfg[r->ring_next];
        if (nx->ring_prev != c || nx->member != r->member || nx->group != r->group)
            BAD("rank %d: ring next %d not a sub-ring neighbour", c, r->ring_next);
        int hop = c, len = 0;
        do {
            hop = cfg[hop].ring_next;
            len++;
        } while (hop != c && len <= P);
        if (len != G) BAD("rank %d: sub-ring of %d ranks, expected G = %d", c, len, G);
    }
    for (int c = 0; c < P; c++)
        if (seen[c] != 1) BAD("initial send is not a permutation (rank %d targeted %d times)", c, seen[c]);
    /* forward: simulate the kv movement */
    for (int c = 0; c < P; c++) held[c] = cfg[cfg[c].init_recv].team; /* the sender sends its team's kv */
    for (int s = 0; s < G; s++) {
        for (int c = 0; c < P; c++) {
            if (held[c] != wallfacer_fwd_kv_team(&cfg[c], s))
                BAD("fwd step %d rank %d holds kv team %d, schedule says %d", s, c, held[c],
                    wallfacer_fwd_kv_team(&cfg[c], s));
            cover[(size_t)cfg[c].team * T + held[c]]++;
        }
        for (int c = 0; c < P; c++) tmp[c] = held[cfg[c].ring_prev];
        memcpy(held, tmp, sizeof(int) * (size_t)P);
    }
    for (int i = 0; i < T * T; i++)
        if (cover[i] != 1) BAD("fwd pair (q team %d, kv team %d) computed %d times", i / T, i % T, cover[i]);
    /* backward: kv fixed, query bundles move */
    memset(cover, 0, sizeof(int) * (size_t)T * T);
    for (int c = 0; c < P; c++) {
        kvfix[c] = cfg[cfg[c].init_recv].team;
        held[c] = cfg[c].team;
    }
    for (int s = 0; s < G; s++) {
        for (int c = 0; c < P; c++) {
            if (held[c] != wallfacer_bwd_q_team(&cfg[c], s)) BAD("bwd step %d rank %d holds q team %d", s, c, held[c]);
            cover[(size_t)held[c] * T + kvfix[c]]++;
        }
        if (s < G - 1) {
            for (int c = 0; c < P; c++) tmp[c] = held[cfg[c].ring_prev];
            memcpy(held, tmp, sizeof(int) * (size_t)P);
        }
    }
    for (int i = 0; i < T * T; i++)
        if (cover[i] != 1) BAD("bwd pair (q team %d, kv team %d) computed %d times", i / T, i % T, cover[i]);
    for (int c = 0; c < P; c++) {
        int dq_to = G > 1 ? cfg[c].ring_next : c;
        if (cfg[dq_to].team != held[c]) BAD("rank %d: last dq hop lands on team %d, not %d", c, cfg[dq_to].team, held[c]);
        if (cfg[cfg[c].init_recv].team != kvfix[c]) BAD("rank %d: dk/dv return hop misses the kv team", c);
    }
#undef BAD
    xfree(cfg);
    xfree(seen);
    xfree(held);
    xfree(tmp);
    xfree(kvfix);
    xfree(cover);
    return bad;
}

static void test_generator(void) {
    int cases = 0;
    for (int P = 1; P <= 64; P++)
        for (int C = 1; C * C <= P; C++) {
            if (!wallfacer_team_valid(P, C)) continue;
            for (int rf = 0; rf < 2; rf++) {
                const char *bad = generator_case(P, C, rf);
                CHECKQ(!bad, "generator P %d C %d %s: %s", P, C, rf ? "ring-first" : "team-first", bad ? bad : "");
                cases++;
            }
        }
    CHECKQ(!wallfacer_team_valid(8, 3) && !wallfacer_team_valid(8, 4) && !wallfacer_team_valid(8, 0) &&
               wallfacer_team_valid(8, 2) && wallfacer_team_valid(9, 3) && wallfacer_team_valid(64, 8),
           "wallfacer_team_valid");
    printf("generator: %d (P, C, placement) cases, P <= 64\n", cases);
}

/* ------------------------------------------------------------------------------------------ */
/* 2. check(). */

static void expect_msg(int cp, int team, long S, TokenLayout l, const char *want1, const char *want2) {
    StrategyParams p = {.hp = 1, .cp = cp, .team = team, .layout = l, .seq_len = S, .n_heads = 4, .n_kv_heads = 2,
                        .head_dim = 16};
    char *m = wallfacer_schedule.check(&p);
    if (!want1) {
        CHECKQ(m == NULL, "check(cp %d, team %d, S %ld) = '%s', expected NULL", cp, team, S, m ? m : "");
    } else {
        CHECKQ(m && strstr(m, want1) && (!want2 || strstr(m, want2)) && !strchr(m, '\n'),
               "check(cp %d, team %d, S %ld) = '%s', expected '%s' and '%s'", cp, team, S, m ? m : "(null)", want1,
               want2 ? want2 : "");
    }
    xfree(m);
}

static void test_check(void) {
    expect_msg(8, 3, 64, LAYOUT_ZIGZAG, "--team 3", "valid --team for cp 8: 1, 2");
    expect_msg(8, 4, 64, LAYOUT_ZIGZAG, "--team 4", "valid --team for cp 8: 1, 2");
    expect_msg(4, 3, 64, LAYOUT_ZIGZAG, "sqrt", "valid --team for cp 4: 1, 2");
    expect_msg(8, -1, 64, LAYOUT_ZIGZAG, "--team -1", "valid --team for cp 8: 1, 2");
    expect_msg(8, 0, 64, LAYOUT_ZIGZAG, "--team", "valid --team for cp 8: 1, 2");
    expect_msg(36, 4, 72, LAYOUT_ZIGZAG, "--team 4", "valid --team for cp 36: 1, 2, 3, 6");
    expect_msg(8, 2, 60, LAYOUT_ZIGZAG, "--seq-len 60", "16");
    expect_msg(8, 2, 60, LAYOUT_CONTIGUOUS, "--seq-len 60", "8");
    expect_msg(0, 1, 64, LAYOUT_ZIGZAG, "--cp", NULL);
    expect_msg(8, 2, 64, LAYOUT_ZIGZAG, NULL, NULL);
    expect_msg(9, 3, 18, LAYOUT_ZIGZAG, NULL, NULL);
    expect_msg(9, 1, 9, LAYOUT_STRIPED, NULL, NULL);
    expect_msg(1, 1, 4, LAYOUT_ZIGZAG, NULL, NULL);
    const Strategy *wf = strategy_find("wallfacer");
    CHECKQ(wf && !strcmp(wf->schedule->name, "wallfacer") && wf->summary &&
               !strcmp(wf->flags, "--hp --cp --team --placement --layout") && wf->constraints,
           "schedule table entry");
}

/* ------------------------------------------------------------------------------------------ */
/* 3. Forward and backward against the single-process kernel. */

typedef struct { long cases; double o, lse, dq, dk, dv, zz_imbalance; } Summary;

/* Bytes this rank's stats put intra / inter node, recomputed from the peers' nodes. */
static void add_split(const Topology *t, Comm *cm, MPI_Comm mc, int peer, uint64_t bytes, uint64_t *in, uint64_t *out) {
    int w = comm_world_rank_of(cm, mc, peer);
    if (w == t->world_rank || !bytes) return;
    if (topology_node_of(t, w) == topology_node_of(t, t->world_rank)) *in += bytes;
    else *out += bytes;
}

static void check_stats(const Topology *t, Comm *cm, const WallfacerRank *me, const CommStats *st,
                        const AttnVolume *v, int bwd, const char *what) {
    const unsigned long long *bytes = bwd ? v->bwd : v->fwd, *msgs = bwd ? v->bwd_msgs : v->fwd_msgs;
    for (int k = 0; k < COMM_KINDS; k++) {
        CHECKQ(comm_stats_bytes(st, (CommKind)k) == bytes[k] && st->messages[k] == msgs[k],
               "%s %s %s: %llu bytes in %llu messages, formula %llu in %llu", what, bwd ? "bwd" : "fwd",
               comm_kind_name((CommKind)k), (unsigned long long)comm_stats_bytes(st, (CommKind)k),
               (unsigned long long)st->messages[k], bytes[k], msgs[k]);
    }
    CHECKQ(st->meta_bytes == 0, "%s meta bytes %llu", what, (unsigned long long)st->meta_bytes);
    /* the split, from the peers: team collectives to every team mate (equal shares), sub-ring
     * P2P to ring_next, the initial send to init_send and the dk/dv return to init_recv */
    MPI_Comm ctx = t->ctx_comm;
    uint64_t e_in[COMM_KINDS] = {0}, e_out[COMM_KINDS] = {0};
    if (me->C > 1)
        for (int j = 0; j < me->C; j++)
            add_split(t, cm, ctx, wallfacer_ctx_rank(me->P, me->C, me->ring_first, me->team, j),
                      bytes[COMM_TEAM] / (unsigned)(me->C - 1), &e_in[COMM_TEAM], &e_out[COMM_TEAM]);
    add_split(t, cm, ctx, me->ring_next, bytes[COMM_P2P_INNER], &e_in[COMM_P2P_INNER], &e_out[COMM_P2P_INNER]);
    if (!bwd) {
        add_split(t, cm, ctx, me->init_send, bytes[COMM_P2P_OUTER], &e_in[COMM_P2P_OUTER], &e_out[COMM_P2P_OUTER]);
    } else {
        add_split(t, cm, ctx, me->init_send, bytes[COMM_P2P_OUTER] / 2, &e_in[COMM_P2P_OUTER], &e_out[COMM_P2P_OUTER]);
        add_split(t, cm, ctx, me->init_recv, bytes[COMM_P2P_OUTER] / 2, &e_in[COMM_P2P_OUTER], &e_out[COMM_P2P_OUTER]);
    }
    for (int k = 0; k < COMM_KINDS; k++)
        CHECKQ(st->bytes_intra[k] == e_in[k] && st->bytes_inter[k] == e_out[k],
               "%s %s %s: intra %llu inter %llu, expected %llu %llu", what, bwd ? "bwd" : "fwd",
               comm_kind_name((CommKind)k), (unsigned long long)st->bytes_intra[k],
               (unsigned long long)st->bytes_inter[k], (unsigned long long)e_in[k], (unsigned long long)e_out[k]);
    /* the placement's point (paper §3.4) */
    if (!me->ring_first && t->ranks_per_node == me->C)
        CHECKQ(st->bytes_inter[COMM_TEAM] == 0, "%s: team-first with nodes of C ranks sends team bytes off-node", what);
    if (me->ring_first && t->ranks_per_node == me->G)
        CHECKQ(st->bytes_inter[COMM_P2P_INNER] == 0, "%s: ring-first with nodes of G ranks sends ring bytes off-node",
               what);
}

static void copy_volume(const CommStats *st, unsigned long long *bytes, unsigned long long *msgs) {
    for (int k = 0; k < COMM_KINDS; k++) {
        bytes[k] = comm_stats_bytes(st, (CommKind)k);
        msgs[k] = st->messages[k];
    }
}

static void run_case(const Topology *t, Comm *cm, int C, TokenLayout layout, const Reference *R, int piece,
                     Summary *sum, const char *what) {
    const int P = t->cp, S = R->hc.S, H = R->hc.H, Hkv = R->hc.Hkv, d = R->hc.d, n = S / P, me_c = t->cp_rank;
    const int ring_first = t->placement == PLACEMENT_RING_FIRST;
    StrategyParams p = {.hp = 1, .cp = P, .team = C, .layout = layout, .seq_len = S, .n_heads = H,
                        .n_kv_heads = Hkv, .head_dim = d};
    char *err = wallfacer_schedule.check(&p);
    CHECKQ(!err, "%s: check says '%s'", what, err ? err : "");
    xfree(err);
    ScheduleShape sh = {.topo = t, .comm = cm, .n = n, .heads = H, .kv_heads = Hkv, .head_dim = d, .team = C,
                        .layout = layout};
    (void)comm_world_rank_of(cm, t->ctx_comm, 0); /* the test's own cache on ctx_comm, before mem0 */
    size_t mem0 = mem_tracked_current();
    ContextSchedule *s = wallfacer_schedule.create(&sh);
    size_t mem1 = mem_tracked_current(), ws = wallfacer_schedule.workspace_floats(&p) * sizeof(float);
    /* the arena plus positions, runs and small structs (S ints + S runs of 16 bytes + headers) */
    CHECKQ(mem1 - mem0 >= ws && mem1 - mem0 <= ws + (size_t)S * 20 + 4096,
           "%s: create allocated %zu bytes, workspace_floats says %zu", what, mem1 - mem0, ws);
    s->blocks->piece_rows = piece;

    int *all_pos = xmalloc(sizeof(int) * (size_t)S);
    for (int c = 0; c < P; c++) layout_context_positions(layout, S, P, c, all_pos + (size_t)c * n);
    s->set_positions(s, all_pos, NULL);
    const int *pos = all_pos + (size_t)me_c * n;
    const size_t a = (size_t)n * H * d, b = (size_t)n * Hkv * d, h = (size_t)n * H;
    float *q = xmalloc(sizeof(float) * a), *kv = xmalloc(sizeof(float) * 2 * b), *dout = xmalloc(sizeof(float) * a);
    float *o = xmalloc(sizeof(float) * a), *lse = xmalloc(sizeof(float) * h), *delta = xmalloc(sizeof(float) * h);
    float *dq = xmalloc(sizeof(float) * a), *dkv = xmalloc(sizeof(float) * 2 * b);
    gather_rows(q, R->q, pos, n, H * d);
    gather_rows(kv, R->k, pos, n, Hkv * d);
    gather_rows(kv + b, R->v, pos, n, Hkv * d);
    gather_rows(dout, R->dout, pos, n, H * d);
    for (size_t i = 0; i < a; i++) dq[i] = NAN; /* overwritten, not accumulated */
    for (size_t i = 0; i < 2 * b; i++) dkv[i] = NAN;

    WallfacerRank me;
    wallfacer_rank_config(P, C, ring_first, me_c, &me);
    AttnVolume vr, vmax, vreg;
    wallfacer_rank_volume(&p, ring_first, me_c, &vr);
    p.placement = ring_first ? PLACEMENT_RING_FIRST : PLACEMENT_TEAM_FIRST;
    { /* the registry's per-rank volume is the closed form; its maximum over the ranks is vreg */
        AttnVolume w;
        wallfacer_schedule.volume(&p, me_c, &w);
        CHECKQ(!memcmp(&w, &vr, sizeof w), "%s: registry volume of rank %d differs from wallfacer_rank_volume", what,
               me_c);
        memset(&vreg, 0, sizeof vreg);
        unsigned long long *dst = (unsigned long long *)&vreg;
        for (int r = 0; r < P; r++) {
            wallfacer_schedule.volume(&p, r, &w);
            const unsigned long long *src = (const unsigned long long *)&w;
            for (size_t i = 0; i < 4 * COMM_KINDS; i++)
                if (src[i] > dst[i]) dst[i] = src[i];
        }
    }
    memset(&vmax, 0, sizeof vmax);

    comm_stats_reset(cm);
    memset(&s->blocks->work, 0, sizeof s->blocks->work);
    s->forward(s, q, kv, o, lse);
    /* zigzag balance (paper §3.5): each rank computes C^2 G slot pairs, off-diagonal ones cost
     * exactly n^2/2 cells, and a rank meets at most C diagonal pairs (<= n^2 cells each) */
    unsigned long long cells = s->blocks->work.fwd_cells, cmax, cmin;
    MPI_Allreduce(&cells, &cmax, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&cells, &cmin, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    if (layout == LAYOUT_ZIGZAG) {
        unsigned long long G = (unsigned)(P / (C * C)), half = (unsigned long long)n * n / 2;
        CHECKQ(cmin >= (unsigned long long)C * C * G * half - (unsigned long long)C * half &&
                   cmax - cmin <= (unsigned long long)C * half,
               "%s: zigzag forward cells per rank %llu..%llu, expected within C n^2/2 = %llu of C^2 G n^2/2 = %llu",
               what, cmin, cmax, (unsigned long long)C * half, (unsigned long long)C * C * G * half);
        sum->zz_imbalance = fmax(sum->zz_imbalance, (double)cmax / (double)(cmin ? cmin : 1));
    }
    CommStats st = cm->stats;
    check_stats(t, cm, &me, &st, &vr, 0, what);
    copy_volume(&st, vmax.fwd, vmax.fwd_msgs);

    double vo = row_err(o, R->o, pos, n, H * d, O_ATOL, 0);
    double vl = row_err(lse, R->lse, pos, n, H, LSE_ATOL, LSE_RTOL);
    CHECKQ(vo <= 1, "%s: O error / tolerance %.3g", what, vo);
    CHECKQ(vl <= 1, "%s: LSE error / tolerance %.3g", what, vl);

    AttnShape ash = {.n_q = n, .n_kv = n, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d, .scale = 1.0f / sqrtf((float)d),
                     .mask = ATTN_CAUSAL};
    attn_backward_delta(&ash, o, dout, delta);
    comm_stats_reset(cm);
    s->backward(s, q, kv, lse, delta, dout, dq, dkv);
    st = cm->stats;
    check_stats(t, cm, &me, &st, &vr, 1, what);
    copy_volume(&st, vmax.bwd, vmax.bwd_msgs);

    double vq = row_err(dq, R->dq, pos, n, H * d, GRAD_REL * R->scale_dq, 0);
    double vk = row_err(dkv, R->dk, pos, n, Hkv * d, GRAD_REL * R->scale_dk, 0);
    double vv = row_err(dkv + b, R->dv, pos, n, Hkv * d, GRAD_REL * R->scale_dv, 0);
    CHECKQ(vq <= 1, "%s: dQ error / tolerance %.3g", what, vq);
    CHECKQ(vk <= 1, "%s: dK error / tolerance %.3g", what, vk);
    CHECKQ(vv <= 1, "%s: dV error / tolerance %.3g", what, vv);

    /* the registry's volume is the maximum over the ranks, exactly */
    unsigned long long *mine = (unsigned long long *)&vmax;
    size_t words = 4 * COMM_KINDS;
    unsigned long long got[4 * COMM_KINDS];
    MPI_Allreduce(mine, got, (int)words, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    CHECKQ(!memcmp(got, &vreg, sizeof got) && vreg.meta_batch == 0,
           "%s: registry volume differs from the maximum over ranks (fwd inner %llu/%llu, outer %llu/%llu, team "
           "%llu/%llu; bwd inner %llu/%llu, outer %llu/%llu, team %llu/%llu)",
           what, got[COMM_P2P_INNER], vreg.fwd[COMM_P2P_INNER], got[COMM_P2P_OUTER], vreg.fwd[COMM_P2P_OUTER],
           got[COMM_TEAM], vreg.fwd[COMM_TEAM], got[COMM_KINDS + COMM_P2P_INNER], vreg.bwd[COMM_P2P_INNER],
           got[COMM_KINDS + COMM_P2P_OUTER], vreg.bwd[COMM_P2P_OUTER], got[COMM_KINDS + COMM_TEAM],
           vreg.bwd[COMM_TEAM]);

    sum->cases++;
    sum->o = fmax(sum->o, vo);
    sum->lse = fmax(sum->lse, vl);
    sum->dq = fmax(sum->dq, vq);
    sum->dk = fmax(sum->dk, vk);
    sum->dv = fmax(sum->dv, vv);
    context_schedule_destroy(s);
    float *bufs[] = {q, kv, dout, o, lse, delta, dq, dkv};
    for (size_t i = 0; i < ARRAY_LEN(bufs); i++) xfree(bufs[i]);
    xfree(all_pos);
    CHECKQ(mem_tracked_current() == mem0, "%s: destroy left %zd tracked bytes", what,
           (ssize_t)(mem_tracked_current() - mem0));
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    omp_set_num_threads(1); /* up to 9 ranks share 2 cores */
    openblas_set_num_threads(1);
    double t_start = MPI_Wtime();

    if (g_rank == 0) {
        test_generator();
        test_check();
    }

    const int P = g_size, S = 6 * P;
    const int kv_heads[] = {4, 2, 1}; /* MHA, GQA, MQA with 4 query heads */
    Reference refs[ARRAY_LEN(kv_heads)];
    for (size_t i = 0; i < ARRAY_LEN(kv_heads); i++) reference_build(&refs[i], (HeadCase){4, kv_heads[i], 16, S}, 77 + i);
    Summary sum = {0};
    long combo = 0;
    for (int C = 1; C * C <= P; C++) {
        if (!wallfacer_team_valid(P, C)) continue;
        const int G = P / (C * C);
        for (int rf = 0; rf < 2; rf++) {
            Placement pl = rf ? PLACEMENT_RING_FIRST : PLACEMENT_TEAM_FIRST;
            Topology t;
            topology_create(&t, 1, 1, P, 0, pl, rf ? G : C); /* nodes of one team / one sub-ring */
            Comm *cm = comm_create(&t, NULL);
            for (int lay = 0; lay < 3; lay++)
                for (size_t hi = 0; hi < ARRAY_LEN(kv_heads); hi++) {
                    int piece = (combo++ % 2) ? 4 : 256;
                    char what[160];
                    snprintf(what, sizeof what, "P %d C %d %s %s H 4 Hkv %d S %d piece %d", P, C, placement_name(pl),
                             layout_name((TokenLayout)lay), kv_heads[hi], S, piece);
                    run_case(&t, cm, C, (TokenLayout)lay, &refs[hi], piece, &sum, what);
                }
            comm_destroy(cm, NULL);
            topology_free(&t);
        }
    }
    for (size_t i = 0; i < ARRAY_LEN(kv_heads); i++) reference_free(&refs[i]);

    double worst[5] = {sum.o, sum.lse, sum.dq, sum.dk, sum.dv}, wmax[5];
    MPI_Allreduce(worst, wmax, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long counts[2] = {tl_passed, tl_failed}, tot[2];
    MPI_Allreduce(counts, tot, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("ranks %d: %ld schedule cases per rank, %.2f s; zigzag forward work max/min over ranks %.3f\n", g_size,
               sum.cases, MPI_Wtime() - t_start, sum.zz_imbalance);
        printf("worst error / tolerance: O %.3f, LSE %.3f, dQ %.3f, dK %.3f, dV %.3f\n", wmax[0], wmax[1], wmax[2],
               wmax[3], wmax[4]);
        printf("test_wallfacer: %ld passed, %ld failed\n", tot[0], tot[1]);
    }
    MPI_Finalize();
    return tot[1] ? 1 : 0;
}
