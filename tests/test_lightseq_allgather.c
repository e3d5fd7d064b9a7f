/* Tests of two context schedules: LightSeq's balanced causal schedule (src/strategies/lightseq.c)
 * and all-gather context parallelism (src/strategies/allgather.c). Run directly (1 rank) and
 * under mpirun --oversubscribe -np P (tests/test_mpi.sh: 2, 3, 4, 8).
 *
 * Without MPI traffic (every rank, cheap):
 *   - the LightSeq plan (lightseq_step) for P = 1 and every even P up to 32: every causal block
 *     pair (i >= j) computed exactly once and no other (whole, or its first rows by one rank and
 *     the rest by another); every remote input of a block (with the rows it needs) was sent by
 *     its owner and received by the computing rank at the step before; no transfer is wasted;
 *     every helper block's o|lse (forward) / dq (backward) and every owner block's dk|dv
 *     (backward) returns to its owner exactly one step later with the block's rows; every rank
 *     computes P/2 whole blocks and one half block; the bytes and messages the plan sends equal
 *     lightseq_rank_volume's closed forms for every rank, at an even and an odd slot length;
 *   - check messages for bad configurations (odd cp, wrong layout, sequence not divisible);
 *   - the balance figure at P = 8 (printed): total / slowest rank's work for a plain ring over
 *     the contiguous layout, a zigzag ring, all-gather (zigzag) and LightSeq, in the block
 *     iterator's cells (a partially visible block counts whole, as the paper counts the diagonal)
 *     and in exact visible (query, key) pairs. The contiguous ring must give 36/8 = 4.5 cells (paper
 *     004, Fig. 5 and §4.3) and LightSeq, whose last step is split (lightseq.h), exactly 8 in both
 *     measures (the paper's unsplit plan: 36/5 = 7.2).
 *
 * With MPI: for every P dividing the number of ranks (dp = ranks / P replicas run side by side,
 * hp = 1), every schedule, every layout it accepts, MHA / GQA / MQA (4 heads with 4, 2, 1 KV
 * heads, and 8 heads with 2), piece rows 256 and 4: every rank builds the same random q, k, v, dout
 * for the whole sequence (S = 48, same seed), takes its slot (layout_context_positions), runs
 * forward and backward through the schedule and compares O, LSE, dQ, dK, dV with the single-
 * process kernel over positions 0..S-1. The bytes and messages of every kind each rank sent,
 * forward and backward (cm->stats, reset before each call), must equal the formulas exactly:
 * for LightSeq its rank's closed form and, over the ranks, the maximum that `volume` reports; for
 * all-gather `volume` on every rank. The work cells must equal a replay of the plan through the
 * same iterator with the kernel off, and the schedule's allocations must match workspace_floats.
 *
 * Tolerances (fp32; inputs ~N(0,1), at most 48 keys per row), as in test_dist_attention:
 *   O   absolute 2e-5 (merge order differs from the one-process kernel: observed ~1e-6);
 *   LSE absolute 2e-5 + relative 2e-6;
 *   dQ, dK, dV: 1e-4 x max|reference| of the tensor (sums of at most 48 products in another
 *       order, ~S eps; a missing or doubled block moves entries by ~1/S, 100x above).
 * Prints "test_lightseq_allgather: N passed, N failed" (summed over ranks) and exits non-zero on
 * failure. */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "core/common.h"
#include "parallel/block_attention.h"
#include "parallel/layout.h"
#include "strategies/lightseq.h"
#include "strategies/registry.h"
#include "attn_reference.h"
#include "testlib.h"

extern void openblas_set_num_threads(int);


/* ------------------------------------------------------------------------------------------ */
/* The LightSeq plan, without MPI. */

static void test_plan(int P) {
    const int steps = lightseq_steps(P), h = P / 2;
    LightseqStep *pl = xmalloc(sizeof(LightseqStep) * (size_t)P * (size_t)steps);
#define AT(r, t) pl[(size_t)(t) * (size_t)P + (size_t)(r)]
    for (int t = 0; t < steps; t++)
        for (int r = 0; r < P; r++) lightseq_step(P, r, t, &AT(r, t));
    /* per causal pair, the rows computed: bit 0 the first n/2, bit 1 the others; a pair computed
       twice (or a half twice) counts in `twice` */
    int *seen = xcalloc((size_t)P * (size_t)P, sizeof(int));
    int bad_pair = 0, bad_input = 0, bad_send = 0, bad_ret = 0, bad_count = 0, twice = 0;
    for (int r = 0; r < P; r++) {
        int halves = 0; /* work in half blocks */
        for (int t = 0; t < steps; t++) {
            const LightseqStep *s = &AT(r, t);
            if (s->q >= 0) {
                int bits = s->rows == LS_ROWS_ALL ? 3 : s->rows == LS_ROWS_FIRST ? 1 : 2;
                halves += s->rows == LS_ROWS_ALL ? 2 : 1;
                if (s->q < s->kv || s->kv < 0 || s->q >= P) bad_pair++;
                else {
                    twice += (seen[(size_t)s->q * P + s->kv] & bits) != 0;
                    seen[(size_t)s->q * P + s->kv] |= bits;
                }
                if (s->q != r && s->kv != r) bad_input++; /* a block uses my q or my kv */
                /* remote inputs arrived at step t - 1 from their owner, with the rows the block needs */
                if (s->q != r && (t == 0 || AT(r, t - 1).recv_q_from != s->q || AT(s->q, t - 1).send_q_to != r ||
                                  AT(r, t - 1).q_rows != s->rows || AT(s->q, t - 1).q_rows != s->rows))
                    bad_input++;
                if (s->kv != r && (t == 0 || AT(r, t - 1).recv_kv_from != s->kv || AT(s->kv, t - 1).send_kv_to != r))
                    bad_input++;
                /* what the block produced for another rank returns at step t + 1 */
                if (s->q != r && (t + 1 >= steps || AT(r, t + 1).ret_to != s->q || AT(s->q, t + 1).ret_from != r ||
                                  AT(r, t + 1).ret_rows != s->rows || AT(s->q, t + 1).ret_rows != s->rows))
                    bad_ret++;
                if (s->q == r && s->kv != r &&
                    (t + 1 >= steps || AT(r, t + 1).dkv_to != s->kv || AT(s->kv, t + 1).dkv_from != r))
                    bad_ret++;
            }
            /* every receive feeds the next block; every send has its receive */
            if (s->recv_kv_from >= 0 && (t + 1 >= steps || AT(r, t + 1).kv != s->recv_kv_from)) bad_send++;
            if (s->recv_q_from >= 0 && (t + 1 >= steps || AT(r, t + 1).q != s->recv_q_from)) bad_send++;
            if (s->send_kv_to >= 0 && AT(s->send_kv_to, t).recv_kv_from != r) bad_send++;
            if (s->send_q_to >= 0 && AT(s->send_q_to, t).recv_q_from != r) bad_send++;
            if (s->send_kv_to >= 0 && s->send_q_to >= 0) bad_send++; /* one input out per step */
            if (s->recv_kv_from >= 0 && s->recv_q_from >= 0) bad_send++;
            if (s->ret_to >= 0 && (t == 0 || AT(r, t - 1).q != s->ret_to || AT(r, t - 1).kv != r)) bad_ret++;
            if (s->dkv_to >= 0 && (t == 0 || AT(r, t - 1).q != r || AT(r, t - 1).kv != s->dkv_to)) bad_ret++;
            if (s->ret_from >= 0 && AT(s->ret_from, t).ret_to != r) bad_ret++;
            if (s->dkv_from >= 0 && AT(s->dkv_from, t).dkv_to != r) bad_ret++;
            if ((s->ret_to >= 0) + (s->dkv_to >= 0) > 1 || (s->ret_from >= 0) + (s->dkv_from >= 0) > 1) bad_ret++;
        }
        int want = P == 1 ? 2 : 2 * h + 1;
        if (halves != want) bad_count++;
    }
    int missing = 0;
    for (int i = 0; i < P; i++)
        for (int j = 0; j <= i; j++) missing += seen[(size_t)i * P + j] != 3;
    CHECK(!bad_pair && !missing && !twice, "P=%d: %d non-causal pairs, %d causal pairs (or halves) missing, %d computed twice", P,
          bad_pair, missing, twice);
    CHECK(!bad_input, "P=%d: %d blocks whose remote inputs did not arrive the step before", P, bad_input);
    CHECK(!bad_send, "P=%d: %d unmatched or wasted transfers", P, bad_send);
    CHECK(!bad_ret, "P=%d: %d partial results not returned one step later to their owner", P, bad_ret);
    CHECK(!bad_count, "P=%d: %d ranks compute other than P/2 whole blocks and one half", P, bad_count);

    /* bytes and messages of the plan equal the closed forms, every rank, at an even and an odd
       slot length */
    int bad_vol = 0;
    for (int n = 12; n <= 13; n++) {
        StrategyParams sp = {.hp = 1, .cp = P, .layout = LAYOUT_CONTIGUOUS, .seq_len = (long)n * P, .n_heads = 6,
                             .n_kv_heads = 2, .head_dim = 5};
        const unsigned long long K = 8ULL * (unsigned long long)n * 2 * 5;
        for (int r = 0; r < P; r++) {
            unsigned long long fb = 0, fm = 0, bb = 0, bm = 0;
            for (int t = 0; t < steps; t++) {
                const LightseqStep *s = &AT(r, t);
                int r0, qn, rn;
                lightseq_rows(s->q_rows, n, &r0, &qn);
                lightseq_rows(s->ret_rows, n, &r0, &rn);
                const unsigned long long Q = 4ULL * (unsigned long long)qn * 6 * 5, L = 4ULL * (unsigned long long)qn * 6,
                                         RQ = 4ULL * (unsigned long long)rn * 6 * 5, RL = 4ULL * (unsigned long long)rn * 6;
                if (s->send_kv_to >= 0) { fb += K; fm++; bb += K; bm++; }
                if (s->send_q_to >= 0) { fb += Q; fm++; bb += 2 * Q + 2 * L; bm++; }
                if (s->ret_to >= 0) { fb += RQ + RL; fm++; bb += RQ; bm++; }
                if (s->dkv_to >= 0) { bb += K; bm++; }
            }
            AttnVolume v;
            lightseq_rank_volume(&sp, r, &v);
            for (int k = 0; k < COMM_KINDS; k++) {
                int inner = k == COMM_P2P_INNER;
                if (v.fwd[k] != (inner ? fb : 0) || v.fwd_msgs[k] != (inner ? fm : 0) || v.bwd[k] != (inner ? bb : 0) ||
                    v.bwd_msgs[k] != (inner ? bm : 0))
                    bad_vol++;
            }
        }
    }
    CHECK(!bad_vol, "P=%d: the plan's bytes / messages differ from lightseq_rank_volume on %d (rank, kind)", P, bad_vol);
    xfree(seen);
    xfree(pl);
#undef AT
}

/* ------------------------------------------------------------------------------------------ */
/* Check messages. */

static void expect_msg(const ScheduleInfo *si, StrategyParams p, const char *want, const char *what) {
    char *m = si->check(&p);
    if (!want) CHECK(m == NULL, "%s: %s should be accepted: %s", si->name, what, m ? m : "");
    else CHECK(m && strstr(m, want) && !strchr(m, '\n'), "%s: %s: want '%s' in one line, got '%s'", si->name, what,
               want, m ? m : "(accepted)");
    xfree(m);
}

static void test_checks(void) {
    StrategyParams p = {.hp = 1, .cp = 3, .layout = LAYOUT_CONTIGUOUS, .seq_len = 48, .n_heads = 4, .n_kv_heads = 2,
                        .head_dim = 16};
    expect_msg(strategy_find("lightseq")->schedule, p, "lightseq needs an even --cp (got 3): 3 ranks have no even cp: start 2 or 4 "
               "(mpirun -np), or use another --strategy", "cp 3");
    /* 2 replicas of 3: the grids of all 6 ranks (was "use --cp 2 or 4": neither runs on 6) */
    p.dp = 2;
    expect_msg(strategy_find("lightseq")->schedule, p, "on these 6 ranks use --dp 1 --hp 1 --cp 6 or --dp 3 --hp 1 --cp 2", "dp 2 cp 3");
    p.dp = 0;
    expect_msg(strategy_find("allgather")->schedule, p, NULL, "cp 3 contiguous");
    /* the even-cp grids of the same ranks, within the heads; none: the ranks to start */
    p.hp = 2;
    expect_msg(strategy_find("lightseq")->schedule, p, "on these ranks use --hp 3 --cp 2 or --hp 1 --cp 6", "hp 2 cp 3");
    p.n_heads = 2;
    expect_msg(strategy_find("lightseq")->schedule, p, "on these ranks use --hp 1 --cp 6", "hp 2 cp 3, 2 heads");
    p.hp = 3;
    expect_msg(strategy_find("lightseq")->schedule, p, "9 ranks have no even cp: start 8 or 10 (mpirun -np)", "hp 3 cp 3");
    p.hp = 1;
    p.n_heads = 4;
    p.cp = 4;
    p.layout = LAYOUT_ZIGZAG;
    expect_msg(strategy_find("lightseq")->schedule, p, "add --layout contiguous", "zigzag");
    expect_msg(strategy_find("allgather")->schedule, p, NULL, "zigzag cp 4");
    p.layout = LAYOUT_STRIPED;
    expect_msg(strategy_find("lightseq")->schedule, p, "add --layout contiguous", "striped");
    expect_msg(strategy_find("allgather")->schedule, p, NULL, "striped cp 4");
    p.layout = LAYOUT_CONTIGUOUS;
    expect_msg(strategy_find("lightseq")->schedule, p, NULL, "contiguous cp 4");
    p.seq_len = 50;
    expect_msg(strategy_find("lightseq")->schedule, p, "divisible by 4 (e.g. 48 or 52)", "S 50 cp 4");
    p.layout = LAYOUT_ZIGZAG;
    expect_msg(strategy_find("allgather")->schedule, p, "divisible by 8 (e.g. 48 or 56)", "S 50 zigzag cp 4");
    p.seq_len = 2; /* shorter than the unit: one example, not "8 or 8" */
    expect_msg(strategy_find("allgather")->schedule, p, "divisible by 8 (e.g. 8)", "S 2 zigzag cp 4");
    p.seq_len = 50;
    p.hp = 2; /* hp x cp ranks split the sequence; zigzag runs over the context group: 2 cp and hp cp
                 must divide S (8 here), 2 hp cp need not */
    p.seq_len = 36;
    expect_msg(strategy_find("allgather")->schedule, p, "divisible by 8 (e.g. 32 or 40)", "S 36 zigzag hp 2 cp 4");
    p.seq_len = 40;
    expect_msg(strategy_find("allgather")->schedule, p, NULL, "S 40 zigzag hp 2 cp 4");
    p.hp = 3; /* odd hp: 2 hp cp after all (hp cp = 6 and 2 cp = 4: their lcm 12) */
    p.cp = 2;
    p.seq_len = 18;
    expect_msg(strategy_find("allgather")->schedule, p, "divisible by 12 (e.g. 12 or 24)", "S 18 zigzag hp 3 cp 2");
    p.cp = 4;
    p.seq_len = 48;
    p.hp = 1;
    p.cp = 1;
    expect_msg(strategy_find("lightseq")->schedule, p, NULL, "cp 1 (local, any layout)");
    p.cp = 0;
    expect_msg(strategy_find("lightseq")->schedule, p, "at least 1", "cp 0");
    expect_msg(strategy_find("allgather")->schedule, p, "at least 1", "cp 0");
}

/* ------------------------------------------------------------------------------------------ */
/* Balance at P = 8, through the same iterator with the kernel off. */

typedef struct { unsigned long long cells, pairs; } Work;

static Work block_work(const int *qpos, int nq, const int *kpos, int n, int piece_rows) {
    PosRun *qr = xmalloc(sizeof(PosRun) * (size_t)(nq > 0 ? nq : 1)), *kr = xmalloc(sizeof(PosRun) * (size_t)n);
    PosBlock qb, kb;
    pos_block_init(&qb, qpos, NULL, nq, qr);
    pos_block_init(&kb, kpos, NULL, n, kr);
    BlockAttn b;
    block_attn_init(&b, NULL, 1, 1, 1);
    b.compute = 0;
    b.piece_rows = piece_rows;
    block_attn_forward(&b, NULL, &qb, NULL, NULL, &kb, NULL, NULL, NULL);
    Work w = {b.work.fwd_cells, 0};
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < n; j++) w.pairs += kpos[j] <= qpos[i];
    xfree(qr);
    xfree(kr);
    return w;
}

static int *all_positions(TokenLayout l, int S, int P) {
    int n = S / P, *all = xmalloc(sizeof(int) * (size_t)S);
    for (int c = 0; c < P; c++) layout_context_positions(l, S, P, c, all + (size_t)c * n);
    return all;
}

/* Work of rank r: every slot's kv against its q (ring, all-gather), or the LightSeq plan. */
static Work rank_work(int lightseq, TokenLayout l, int S, int P, int r, int piece_rows) {
    int n = S / P, *all = all_positions(l, S, P);
    Work w = {0, 0};
    for (int t = 0; t < (lightseq ? lightseq_steps(P) : P); t++) {
        int qs = r, ks = t, r0 = 0, nr = n;
        if (lightseq) {
            LightseqStep s;
            lightseq_step(P, r, t, &s);
            if (s.q < 0) continue;
            qs = s.q;
            ks = s.kv;
            lightseq_rows(s.rows, n, &r0, &nr);
        }
        Work b = block_work(all + (size_t)qs * n + r0, nr, all + (size_t)ks * n, n, piece_rows);
        w.cells += b.cells;
        w.pairs += b.pairs;
    }
    xfree(all);
    return w;
}

static void test_balance(void) {
    const int P = 8, S = 8 * 64;
    const struct { const char *name; int lightseq; TokenLayout l; } rows[] = {
        {"ring, contiguous layout", 0, LAYOUT_CONTIGUOUS},
        {"ring, zigzag layout", 0, LAYOUT_ZIGZAG},
        {"allgather, zigzag layout", 0, LAYOUT_ZIGZAG},
        {"lightseq (contiguous)", 1, LAYOUT_CONTIGUOUS}, /* the paper: 7.2x cells */
    };
    double ratio_cells[4], ratio_pairs[4];
    if (g_rank == 0) printf("balance at P = %d (S = %d): total work / slowest rank's work (ideal %d)\n", P, S, P);
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        unsigned long long tc = 0, tp = 0, mc = 0, mp = 0;
        for (int r = 0; r < P; r++) {
            Work w = rank_work(rows[i].lightseq, rows[i].l, S, P, r, 256);
            tc += w.cells;
            tp += w.pairs;
            if (w.cells > mc) mc = w.cells;
            if (w.pairs > mp) mp = w.pairs;
        }
        ratio_cells[i] = (double)tc / (double)mc;
        ratio_pairs[i] = (double)tp / (double)mp;
        if (g_rank == 0)
            printf("  %-26s %.3fx in block cells (partial block = whole), %.3fx in visible pairs\n", rows[i].name,
                   ratio_cells[i], ratio_pairs[i]);
        CHECK(tp == (unsigned long long)S * (S + 1) / 2, "%s: %llu visible pairs computed, causal attention has %llu",
              rows[i].name, tp, (unsigned long long)S * (S + 1) / 2);
    }
    CHECK(fabs(ratio_cells[0] - 4.5) < 1e-12, "contiguous ring: %.4f, paper 4.5", ratio_cells[0]);
    CHECK(fabs(ratio_cells[3] - P) < 1e-12, "lightseq (split last step): %.4f cells, want %d", ratio_cells[3], P);
    CHECK(fabs(ratio_pairs[3] - P) < 1e-12, "lightseq (split last step): %.4f visible pairs, want %d", ratio_pairs[3],
          P);
    CHECK(ratio_pairs[1] > 7.9, "zigzag visible pairs: %.4f", ratio_pairs[1]);
}

/* ------------------------------------------------------------------------------------------ */
/* Reference and distributed runs. */

typedef struct { long cases; double max_o, max_lse, max_dq, max_dk, max_dv; } Summary;

static void check_counts(const CommStats *st, const AttnVolume *v, int bwd, const char *what) {
    const unsigned long long *bytes = bwd ? v->bwd : v->fwd, *msgs = bwd ? v->bwd_msgs : v->fwd_msgs;
    for (int k = 0; k < COMM_KINDS; k++) {
        CHECKQ(comm_stats_bytes(st, (CommKind)k) == bytes[k] && st->messages[k] == msgs[k],
               "%s %s %s: %llu bytes in %llu messages, formula %llu in %llu", what, bwd ? "bwd" : "fwd",
               comm_kind_name((CommKind)k), (unsigned long long)comm_stats_bytes(st, (CommKind)k),
               (unsigned long long)st->messages[k], bytes[k], msgs[k]);
    }
    CHECKQ(st->meta_bytes == 0, "%s: %llu meta bytes", what, (unsigned long long)st->meta_bytes);
}

static void run_case(const ScheduleInfo *si, const Topology *t, Comm *cm, TokenLayout layout, const Reference *R,
                     int piece_rows, Summary *sum, const char *what) {
    const HeadCase hc = R->hc;
    const int S = hc.S, H = hc.H, Hkv = hc.Hkv, d = hc.d, P = t->cp, r = t->cp_rank, n = S / P;
    const size_t qf = (size_t)n * H * d, kvh = (size_t)n * Hkv * d;
    StrategyParams sp = {.hp = 1, .cp = P, .layout = layout, .seq_len = S, .n_heads = H, .n_kv_heads = Hkv,
                         .head_dim = d};
    ScheduleShape sh = {.topo = t, .comm = cm, .n = n, .heads = H, .kv_heads = Hkv, .head_dim = d, .layout = layout};
    size_t mem0 = mem_tracked_current();
    ContextSchedule *s = si->create(&sh);
    size_t mem1 = mem_tracked_current(), ws = si->workspace_floats(&sp) * sizeof(float);
    /* position bookkeeping: up to 3 blocks per slot (LightSeq: all, first and second half rows), 2 runs per token */
    size_t slack = 3 * (size_t)P * sizeof(PosBlock) + 2 * (size_t)S * sizeof(PosRun) + 1024;
    CHECKQ(mem1 - mem0 >= ws && mem1 - mem0 <= ws + slack, "%s: create allocated %zu bytes, workspace %zu (+ <= %zu)",
           what, mem1 - mem0, ws, slack);
    s->blocks->piece_rows = piece_rows;

    int *all = all_positions(layout, S, P), *pos = all + (size_t)r * n;
    float *q = xmalloc(sizeof(float) * qf), *kv = xmalloc(sizeof(float) * 2 * kvh);
    float *dout = xmalloc(sizeof(float) * qf), *o = xmalloc(sizeof(float) * qf);
    float *lse = xmalloc(sizeof(float) * (size_t)n * H), *delta = xmalloc(sizeof(float) * (size_t)n * H);
    float *dq = xmalloc(sizeof(float) * qf), *dkv = xmalloc(sizeof(float) * 2 * kvh);
    gather_rows(q, R->q, pos, n, H * d);
    gather_rows(kv, R->k, pos, n, Hkv * d);
    gather_rows(kv + kvh, R->v, pos, n, Hkv * d);
    gather_rows(dout, R->dout, pos, n, H * d);
    for (size_t i = 0; i < qf; i++) dq[i] = NAN; /* backward must overwrite */
    for (size_t i = 0; i < 2 * kvh; i++) dkv[i] = NAN;

    s->set_positions(s, all, NULL);
    memset(&s->blocks->work, 0, sizeof s->blocks->work);
    comm_stats_reset(cm);
    s->forward(s, q, kv, o, lse);
    CommStats fst = cm->stats;
    AttnShape as = {.n_q = n, .n_kv = n, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d};
    attn_backward_delta(&as, o, dout, delta);
    comm_stats_reset(cm);
    s->backward(s, q, kv, lse, delta, dout, dq, dkv);
    CommStats bst = cm->stats;

    double eo = row_err(o, R->o, pos, n, H * d, O_ATOL, 0);
    double el = row_err(lse, R->lse, pos, n, H, LSE_ATOL, LSE_RTOL);
    double eq = row_err(dq, R->dq, pos, n, H * d, GRAD_REL * R->scale_dq, 0);
    double ek = row_err(dkv, R->dk, pos, n, Hkv * d, GRAD_REL * R->scale_dk, 0);
    double ev = row_err(dkv + kvh, R->dv, pos, n, Hkv * d, GRAD_REL * R->scale_dv, 0);
    CHECKQ(eo <= 1, "%s: O error %.3g x tolerance", what, eo);
    CHECKQ(el <= 1, "%s: LSE error %.3g x tolerance", what, el);
    CHECKQ(eq <= 1, "%s: dQ error %.3g x tolerance", what, eq);
    CHECKQ(ek <= 1, "%s: dK error %.3g x tolerance", what, ek);
    CHECKQ(ev <= 1, "%s: dV error %.3g x tolerance", what, ev);
    sum->max_o = fmax(sum->max_o, eo);
    sum->max_lse = fmax(sum->max_lse, el);
    sum->max_dq = fmax(sum->max_dq, eq);
    sum->max_dk = fmax(sum->max_dk, ek);
    sum->max_dv = fmax(sum->max_dv, ev);

    /* work: a replay of the plan through the same iterator */
    int is_ls = si == strategy_find("lightseq")->schedule;
    Work w = rank_work(is_ls, layout, S, P, r, piece_rows);
    CHECKQ(s->blocks->work.fwd_cells == w.cells && s->blocks->work.bwd_cells == w.cells,
           "%s: work cells fwd %llu bwd %llu, replay %llu", what, s->blocks->work.fwd_cells, s->blocks->work.bwd_cells,
           w.cells);

    /* volume: exact per kind, forward and backward */
    AttnVolume vol, mine;
    si->volume(&sp, r, &mine);
    if (is_ls) { /* the closed form in lightseq.h is what the registry reports */
        AttnVolume direct;
        lightseq_rank_volume(&sp, r, &direct);
        CHECKQ(!memcmp(&direct, &mine, sizeof mine), "%s: volume() differs from lightseq_rank_volume", what);
    }
    memset(&vol, 0, sizeof vol); /* the maximum over the ranks of the per-rank formula */
    for (int rr = 0; rr < P; rr++) {
        AttnVolume w;
        si->volume(&sp, rr, &w);
        for (int k = 0; k < COMM_KINDS; k++) {
            if (w.fwd[k] > vol.fwd[k]) vol.fwd[k] = w.fwd[k];
            if (w.bwd[k] > vol.bwd[k]) vol.bwd[k] = w.bwd[k];
            if (w.fwd_msgs[k] > vol.fwd_msgs[k]) vol.fwd_msgs[k] = w.fwd_msgs[k];
            if (w.bwd_msgs[k] > vol.bwd_msgs[k]) vol.bwd_msgs[k] = w.bwd_msgs[k];
        }
    }
    check_counts(&fst, &mine, 0, what);
    check_counts(&bst, &mine, 1, what);
    unsigned long long got[4 * COMM_KINDS], mx[4 * COMM_KINDS];
    for (int k = 0; k < COMM_KINDS; k++) {
        got[k] = comm_stats_bytes(&fst, (CommKind)k);
        got[COMM_KINDS + k] = comm_stats_bytes(&bst, (CommKind)k);
        got[2 * COMM_KINDS + k] = fst.messages[k];
        got[3 * COMM_KINDS + k] = bst.messages[k];
    }
    MPI_Allreduce(got, mx, 4 * COMM_KINDS, MPI_UNSIGNED_LONG_LONG, MPI_MAX, t->ctx_comm);
    int same = 1;
    for (int k = 0; k < COMM_KINDS; k++)
        same &= mx[k] == vol.fwd[k] && mx[COMM_KINDS + k] == vol.bwd[k] && mx[2 * COMM_KINDS + k] == vol.fwd_msgs[k] &&
                mx[3 * COMM_KINDS + k] == vol.bwd_msgs[k];
    CHECKQ(same, "%s: the maximum over the ranks of bytes / messages differs from volume()", what);

    sum->cases++;
    float *fr[] = {q, kv, dout, o, lse, delta, dq, dkv};
    for (size_t i = 0; i < ARRAY_LEN(fr); i++) xfree(fr[i]);
    xfree(all);
    context_schedule_destroy(s);
    CHECKQ(mem_tracked_current() == mem0, "%s: destroy left %zu bytes", what, mem_tracked_current() - mem0);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    double t_start = MPI_Wtime();

    test_plan(1);
    for (int P = 2; P <= 32; P += 2) test_plan(P);
    test_checks();
    test_balance();

    const HeadCase heads[] = {{4, 4, 16, 48}, {4, 2, 16, 48}, {4, 1, 32, 48}, {8, 2, 8, 48}};
    Reference refs[ARRAY_LEN(heads)];
    for (size_t i = 0; i < ARRAY_LEN(heads); i++) reference_build(&refs[i], heads[i], 2000 + i);
    const ScheduleInfo *scheds[] = {strategy_find("lightseq")->schedule, strategy_find("allgather")->schedule};
    Summary sum = {0};
    long skipped = 0, combo = 0;
    for (int P = 1; P <= g_size; P++) {
        if (g_size % P) continue;
        Topology t;
        topology_create(&t, g_size / P, 1, P, 0, PLACEMENT_HEAD_FIRST, 2);
        Comm *cm = comm_create(&t, NULL);
        (void)comm_world_rank_of(cm, t.ctx_comm, 0); /* caches ctx_comm's ranks (xmalloc) before run_case counts */
        for (size_t si = 0; si < ARRAY_LEN(scheds); si++)
            for (int lay = 0; lay < 3; lay++)
                for (size_t hi = 0; hi < ARRAY_LEN(heads); hi++) {
                    StrategyParams sp = {.hp = 1, .cp = P, .layout = (TokenLayout)lay, .seq_len = heads[hi].S,
                                         .n_heads = heads[hi].H, .n_kv_heads = heads[hi].Hkv, .head_dim = heads[hi].d};
                    char *err = scheds[si]->check(&sp);
                    if (err) { /* LightSeq refuses odd P or another layout; both, an S the layout does
                                * not split over P (at 5 and 7 ranks: that was counted as a failure) */
                        const int splits = heads[hi].S % (lay == LAYOUT_ZIGZAG ? 2 * P : P) == 0;
                        CHECKQ((scheds[si] == strategy_find("lightseq")->schedule && (P % 2 || lay != LAYOUT_CONTIGUOUS)) ||
                                   (!splits && strstr(err, "does not split")),
                               "%s refused cp %d %s: %s", scheds[si]->name, P, layout_name((TokenLayout)lay), err);
                        xfree(err);
                        skipped++;
                        continue;
                    }
                    char what[160];
                    int piece = (combo++ % 2) ? 4 : 256;
                    snprintf(what, sizeof what, "%s cp%d (dp%d) %s H%d Hkv%d d%d S%d piece%d", scheds[si]->name, P,
                             g_size / P, layout_name((TokenLayout)lay), heads[hi].H, heads[hi].Hkv, heads[hi].d,
                             heads[hi].S, piece);
                    run_case(scheds[si], &t, cm, (TokenLayout)lay, &refs[hi], piece, &sum, what);
                }
        comm_destroy(cm, NULL);
        topology_free(&t);
    }
    for (size_t i = 0; i < ARRAY_LEN(heads); i++) reference_free(&refs[i]);

    double worst[5] = {sum.max_o, sum.max_lse, sum.max_dq, sum.max_dk, sum.max_dv}, wmax[5];
    MPI_Allreduce(worst, wmax, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long counts[2] = {tl_passed, tl_failed}, tot[2];
    MPI_Allreduce(counts, tot, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("ranks %d: %ld runs per rank (%ld refused configurations), %.2f s\n", g_size, sum.cases, skipped,
               MPI_Wtime() - t_start);
        printf("worst error / tolerance: O %.3f, LSE %.3f, dQ %.3f, dK %.3f, dV %.3f\n", wmax[0], wmax[1], wmax[2],
               wmax[3], wmax[4]);
        printf("test_lightseq_allgather: %ld passed, %ld failed\n", tot[0], tot[1]);
    }
    MPI_Finalize();
    return tot[1] ? 1 : 0;
}
