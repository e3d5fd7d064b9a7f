/* The step simulator (plan/simulate.h) and cluster files (plan/cluster.h) on schedules whose times
 * are computed by hand: two flows through one NIC and through two, a 4-rank ring over two nodes
 * whose steps wait for the link between the nodes, an all-to-all across two nodes, the attention
 * rate's interpolation, a message posted after the blocks; every registered strategy's played
 * schedule runs to the end with its bytes split into intra- and inter-node; a per-peer limit inside a
 * node; collectives as NCCL's ring plays them (a node's NICs shared by the rings crossing it) and
 * as seqpar's direct ones (a node's NICs carry every byte that leaves it),
 * replicas played side by side; a NIC whose total falls with its flows (nic_flows) in the play and
 * in the direct collectives; bad cluster files are refused with one line naming the field. No
 * MPI. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/common.h"
#include "plan/cluster.h"
#include "plan/simulate.h"
#include "strategies/registry.h"
#include "testlib.h"

/* 2 nodes x 2 ranks, one NIC of 10 GB/s and 5 us per node, ports of 100 GB/s and 1 us inside, an
 * attention rate so high that blocks take no time to speak of. */
static Cluster two_nodes(int nics) {
    Cluster c = {.nodes = 2, .ranks_per_node = 2, .intra_gbs = 100, .intra_latency_us = 1, .nics_per_node = nics,
                 .nic_gbs = 10, .nic_latency_us = 5, .attn = {.n = 1, .x = {1}, .tflops = {1e9}},
                 .attn_backward_factor = 2.5};
    snprintf(c.name, sizeof c.name, "two nodes");
    return c;
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b) + 1e-15; }

/* Plays sc; and checks simulate_schedule_bound and simulate_schedule_step_bound against the play:
 * the same time in blocks, bit for bit, and each member's end bounds at most its end (the planner
 * skips configurations by them). */
static double run(const StepSchedule *sc, const Cluster *c, const int *rank_of, ScheduleSim *out) {
    SeqErr e;
    if (simulate_schedule(sc, c, rank_of, 64, PRECISION_FP32, out, &e) != 0) {
        CHECK(0, "simulate: %s", e.msg);
        return -1;
    }
    const int M = sc->members;
    double *lb = xcalloc((size_t)M, sizeof *lb), *blocks = xcalloc((size_t)M, sizeof *blocks);
    CHECK(simulate_schedule_bound(sc, c, rank_of, 64, PRECISION_FP32, lb, blocks, &e) == 0, "bound: %s", e.msg);
    int ok = 1;
    for (int m = 0; m < M; m++) ok &= blocks[m] == out->m[m].compute_s && lb[m] <= out->m[m].end_s * (1 + 1e-9);
    CHECK(ok, "the bound without playing: blocks equal and every end at most the played one (member 0: %.9g s, "
              "%.9g s played)", lb[0], out->m[0].end_s);
    CHECK(simulate_schedule_step_bound(sc, c, rank_of, 64, PRECISION_FP32, lb, &e) == 0, "step bound: %s", e.msg);
    ok = 1;
    int worst = 0;
    for (int m = 0; m < M; m++) {
        ok &= lb[m] <= out->m[m].end_s * (1 + 1e-9);
        if (lb[m] - out->m[m].end_s > lb[worst] - out->m[worst].end_s) worst = m;
    }
    CHECK(ok, "the step bound: every end at most the played one (member %d: %.9g s, %.9g s played)", worst, lb[worst],
          out->m[worst].end_s);
    xfree(lb);
    xfree(blocks);
    return out->end_s;
}

/* Two flows out of one node to two others (3 nodes x 2 ranks, one NIC each): only the sender's NIC
 * is shared. */
static void test_nic_egress(void) {
    Cluster c = two_nodes(1);
    c.nodes = 3;
    const int ident[6] = {0, 1, 2, 3, 4, 5};
    StepSchedule sc;
    schedule_init(&sc, 1, 6, PASS_FORWARD);
    schedule_step(&sc, "two flows out of node 0");
    schedule_message(&sc, COMM_P2P_INNER, 0, 2, 100000000ULL, 1);
    schedule_message(&sc, COMM_P2P_INNER, 1, 4, 100000000ULL, 1);
    schedule_finish(&sc);
    ScheduleSim out;
    const double t = run(&sc, &c, ident, &out), want = 5e-6 + 1e8 / 5e9;
    CHECK(near(t, want), "two flows out of one NIC: %.9g s, by hand %.9g s", t, want);
    schedule_sim_free(&out);
    schedule_free(&sc);
}

static void test_nic_sharing(void) {
    const int ident[4] = {0, 1, 2, 3};
    const double B = 1e8; /* bytes */
    for (int nics = 1; nics <= 2; nics++) {
        Cluster c = two_nodes(nics);
        StepSchedule sc;
        schedule_init(&sc, 1, 4, PASS_FORWARD);
        schedule_step(&sc, "two flows between the nodes");
        schedule_message(&sc, COMM_P2P_INNER, 0, 2, (unsigned long long)B, 1);
        schedule_message(&sc, COMM_P2P_INNER, 1, 3, (unsigned long long)B, 1);
        schedule_finish(&sc);
        ScheduleSim out;
        const double t = run(&sc, &c, ident, &out), want = 5e-6 + B / (10e9 / (nics == 1 ? 2 : 1));
        CHECK(near(t, want), "two flows on %d NIC(s): %.9g s, by hand %.9g s", nics, t, want);
        CHECK(out.m[0].bytes_inter == B && out.m[0].bytes_intra == 0, "flow bytes counted as inter-node");
        schedule_sim_free(&out);
        schedule_free(&sc);
    }
}

/* A NIC that carries less with more flows (nic_flows [[1, 10], [2, 6]] GB/s): two flows through
 * one NIC's direction move 3 GB/s each, where one flow each way (0 -> 2, 3 -> 1) moves 10 GB/s; a
 * file with the curve saves and loads it back; a direct all-reduce of 2 nodes x 2 ranks with the
 * curve [[1, 10], [4, 6]]: its reduce-scatter (each member receiving from one peer at a time: 4 / 3
 * flows a NIC on average, 9.556 GB/s) and its all-gather (every share at once: 4 flows, 6 GB/s) move
 * B each out of a node. */
static void test_nic_flows(void) {
    const int ident[4] = {0, 1, 2, 3};
    const double B = 1e8;
    Cluster c = two_nodes(1);
    c.nic_flows = (ClusterCurve){.n = 2, .x = {1, 2}, .tflops = {10, 6}};
    for (int same = 0; same < 2; same++) {
        StepSchedule sc;
        schedule_init(&sc, 1, 4, PASS_FORWARD);
        schedule_step(&sc, "two flows between the nodes");
        schedule_message(&sc, COMM_P2P_INNER, 0, 2, (unsigned long long)B, 1);
        schedule_message(&sc, COMM_P2P_INNER, same ? 1 : 3, same ? 3 : 1, (unsigned long long)B, 1);
        schedule_finish(&sc);
        ScheduleSim out;
        const double t = run(&sc, &c, ident, &out), want = 5e-6 + B / (same ? 3e9 : 10e9);
        CHECK(near(t, want), "two flows %s with nic_flows: %.9g s, by hand %.9g s", same ? "one way" : "both ways", t,
              want);
        schedule_sim_free(&out);
        schedule_free(&sc);
    }
    char path[] = "/tmp/test_simulate_flows.XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    SeqErr e;
    Cluster back;
    c.threads_per_rank = 1;
    CHECK(fd >= 0 && cluster_save(path, &c, "test", &e) == 0 && cluster_load(path, &back, &e) == 0 &&
              back.nic_flows.n == 2 && back.nic_flows.x[1] == 2 && back.nic_flows.tflops[1] == 6,
          "nic_flows saved and loaded back: %s", e.msg);
    unlink(path);
    /* --nic-gbs keeps the curve's shape: [[1, 5], [2, 3]] */
    char a0[] = "x", a1[] = "--nic-gbs", a2[] = "5", *argv[] = {a0, a1, a2, NULL};
    int argc = 3;
    ClusterOverrides ov;
    Cluster half = c;
    CHECK(cluster_take_overrides(&argc, argv, &ov, &e) == 0 && cluster_apply_overrides(&half, &ov, &e) == 0 &&
              half.nic_gbs == 5 && half.nic_flows.tflops[0] == 5 && half.nic_flows.tflops[1] == 3,
          "--nic-gbs 5 over nic_flows [[1, 10], [2, 6]]: nic_gbs %g, curve %g, %g", half.nic_gbs,
          half.nic_flows.tflops[0], half.nic_flows.tflops[1]);
    c.collectives = CLUSTER_COLLECTIVES_DIRECT;
    c.nic_flows = (ClusterCurve){.n = 2, .x = {1, 4}, .tflops = {10, 6}};
    const CollectiveGroups four = {1, 4, 0, 1};
    CollectiveSim cs;
    simulate_collective(&c, COLLECTIVE_ALLREDUCE, B, 1, &four, &cs, &e);
    const double rs_gbs = 10 + (6 - 10) * (4.0 / 3 - 1) / 3, want = B / (rs_gbs * 1e9) + B / 6e9 + 6 * 5e-6;
    CHECK(near(cs.seconds, want), "direct all-reduce with nic_flows: %.9g s, by hand %.9g s", cs.seconds, want);
    simulate_collective(&c, COLLECTIVE_ALLGATHER, B, 1, &four, &cs, &e);
    CHECK(near(cs.seconds, B / 6e9 + 3 * 5e-6), "direct all-gather with nic_flows: %.9g s", cs.seconds);
}

/* The ring's forward on 4 ranks, 4096 tokens, 8 heads of 64 (zigzag). */
static void play_ring4(StepSchedule *sc) {
    const StrategyParams p = {.hp = 1, .cp = 4, .layout = LAYOUT_ZIGZAG, .seq_len = 4096, .n_heads = 8, .n_kv_heads = 8,
                              .head_dim = 64};
    strategy_play(strategy_find("ring"), &p, PASS_FORWARD, sc);
}

/* The ring of 4 ranks on 2 nodes (ranks 0, 1 | 2, 3): in each of its 3 transfer steps two KV blocks
 * cross between the nodes (1 -> 2, 3 -> 0), each alone on its NIC's direction, and two stay inside;
 * each step ends with the slower, 5 us + b / 10 GB/s. */
static void test_ring_two_nodes(void) {
    StepSchedule sc;
    play_ring4(&sc);
    Cluster c = two_nodes(1);
    const int ident[4] = {0, 1, 2, 3};
    ScheduleSim out;
    const double b = 8.0 * 1024 * 8 * 64; /* k and v of a slot, fp32: 8 n Hk d */
    const double t = run(&sc, &c, ident, &out), blocks = out.m[out.slowest].compute_s;
    const double want = 3 * (5e-6 + b / 10e9);
    CHECK(fabs(t - want) <= blocks + 1e-12, "ring on two nodes: %.9g s, by hand %.9g s (+ at most %.3g s of blocks)", t,
          want, blocks);
    double waits = 0;
    for (int m = 0; m < 4; m++) waits += out.m[m].wait_s;
    CHECK(waits > 3.5 * want, "the ring's waits are exposed: %.9g s summed over 4 ranks", waits);
    schedule_sim_free(&out);
    /* on four nodes of one rank every transfer crosses a NIC alone: the same time */
    Cluster c4 = two_nodes(1);
    c4.nodes = 4;
    c4.ranks_per_node = 1;
    const double t4 = run(&sc, &c4, ident, &out);
    CHECK(near(t4, t), "ring on four nodes %.9g s, on two %.9g s", t4, t);
    schedule_sim_free(&out);
    /* inside one node (4 ranks, 100 GB/s ports, 1 us): 3 (1 us + b / 100 GB/s) */
    Cluster c1 = two_nodes(1);
    c1.nodes = 1;
    c1.ranks_per_node = 4;
    c1.nics_per_node = 1;
    const double t1 = run(&sc, &c1, ident, &out), want1 = 3 * (1e-6 + b / 100e9);
    CHECK(fabs(t1 - want1) <= out.m[out.slowest].compute_s + 1e-12, "ring in one node: %.9g s, by hand %.9g s", t1,
          want1);
    schedule_sim_free(&out);
    schedule_free(&sc);
}

/* An all-to-all of 4 ranks on 2 nodes, b bytes from each rank to each other: each node's NIC
 * carries 4 flows out and 4 in (2 ranks x 2 peers across), so 5 us + 4 b / 10 GB/s; the flows inside
 * a node end long before. */
static void test_alltoall(void) {
    StepSchedule sc;
    schedule_init(&sc, 4, 1, PASS_FORWARD);
    schedule_step(&sc, "all-to-all");
    const unsigned long long b = 25000000ULL;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            if (i != j) schedule_message(&sc, COMM_ALLTOALL, i, j, b, 1);
    schedule_finish(&sc);
    Cluster c = two_nodes(1);
    const int ident[4] = {0, 1, 2, 3};
    ScheduleSim out;
    const double t = run(&sc, &c, ident, &out), want = 5e-6 + 4.0 * b / 10e9;
    CHECK(near(t, want), "all-to-all across two nodes: %.9g s, by hand %.9g s", t, want);
    CHECK(out.m[0].bytes_intra == b && out.m[0].bytes_inter == 2.0 * b, "bytes by link: %g intra, %g inter",
          out.m[0].bytes_intra, out.m[0].bytes_inter);
    schedule_sim_free(&out);
    /* a node whose ranks share one medium of 50 GB/s: inside-node flows share it (two of 25 MB) */
    c.intra_node_gbs = 50;
    c.nic_gbs = 1000;
    const double t2 = run(&sc, &c, ident, &out), inter = 5e-6 + 4.0 * b / 1000e9, intra = 1e-6 + b / 25e9;
    CHECK(near(t2, fmax(inter, intra)), "all-to-all, shared medium: %.9g s, by hand %.9g s", t2, fmax(inter, intra));
    schedule_sim_free(&out);
    schedule_free(&sc);
}

/* Compute at the interpolated rate, and a result posted only after the blocks. */
static void test_compute_and_results(void) {
    Cluster c = two_nodes(1);
    c.attn.n = 2;
    c.attn.x[0] = 64, c.attn.tflops[0] = 10;
    c.attn.x[1] = 128, c.attn.tflops[1] = 20;
    CHECK(near(cluster_attention_flops_per_s(&c, 100, 4000), 15.625e12), "interpolated rate %.6g",
          cluster_attention_flops_per_s(&c, 100, 4000));
    CHECK(near(cluster_attention_flops_per_s(&c, 10, 10), 10e12) && near(cluster_attention_flops_per_s(&c, 999, 999), 20e12),
          "the rate is constant outside the points");
    int pos[100];
    for (int i = 0; i < 100; i++) pos[i] = 1000 + i;
    int kpos[100];
    for (int i = 0; i < 100; i++) kpos[i] = i; /* all before: a full block of 100 x 100 cells */
    PosRun rq[100], rk[100];
    PosBlock qb, kb;
    pos_block_init(&qb, pos, NULL, 100, rq);
    pos_block_init(&kb, kpos, NULL, 100, rk);
    StepSchedule sc;
    schedule_init(&sc, 1, 4, PASS_BACKWARD);
    schedule_step(&sc, "a block, then its result");
    schedule_compute(&sc, 0, 8, 8, &qb, &kb, 0);
    schedule_result(&sc, COMM_P2P_INNER, 0, 2, 100000000ULL, 1);
    schedule_finish(&sc);
    const int ident[4] = {0, 1, 2, 3};
    ScheduleSim out;
    const double blk = 4.0 * 100 * 100 * 8 * 64 * 2.5 / 15.625e12;
    const double t = run(&sc, &c, ident, &out), want = blk + 5e-6 + 1e8 / 10e9;
    CHECK(near(out.m[0].compute_s, blk), "backward block %.9g s, by hand %.9g s", out.m[0].compute_s, blk);
    CHECK(near(t, want), "block then result: %.9g s, by hand %.9g s", t, want);
    CHECK(near(out.m[0].wait_s, want - blk), "the result's transfer is the exposed wait: %.9g s", out.m[0].wait_s);
    schedule_sim_free(&out);
    schedule_free(&sc);
}

/* A block whose visible pairs are whole rectangles (a zigzag ring's off-diagonal step: two query
 * runs against the earlier of two key runs) runs at the full curve's rate at the rectangle's shorter
 * side, not the causal curve's; each block then pays the merge of its result into the fp32
 * accumulators: attention_merge_bytes per element of its output rows (forward), of dq's, dk's and
 * dv's rows (backward), at device_mem_gbs. */
static void test_block_shape_and_merge(void) {
    Cluster c = two_nodes(1);
    c.n_attn_curves = 2;
    c.attn_curves[0] = (ClusterAttnCurve){.precision = PRECISION_FP32, .head_dim = 64, .causal = 0,
                                          .rate = {.n = 2, .x = {50, 100}, .tflops = {20, 40}}};
    c.attn_curves[1] = (ClusterAttnCurve){.precision = PRECISION_FP32, .head_dim = 64, .causal = 1,
                                          .rate = {.n = 1, .x = {1}, .tflops = {10}}};
    int qpos[100], kpos[100];
    for (int i = 0; i < 50; i++) qpos[i] = 100 + i, qpos[50 + i] = 300 + i; /* two runs */
    for (int i = 0; i < 50; i++) kpos[i] = i, kpos[50 + i] = 400 + i;       /* before both, after both */
    PosRun rq[100], rk[100];
    PosBlock qb, kb;
    pos_block_init(&qb, qpos, NULL, 100, rq);
    pos_block_init(&kb, kpos, NULL, 100, rk);
    const int ident[4] = {0, 1, 2, 3};
    for (int merge = 0; merge < 2; merge++)
        for (int pass = 0; pass < 2; pass++) {
            c.attn_merge_bytes = merge ? 10 : 0;
            c.device_mem_gbs = 100;
            StepSchedule sc;
            schedule_init(&sc, 1, 4, pass ? PASS_BACKWARD : PASS_FORWARD);
            schedule_step(&sc, "an off-diagonal block");
            schedule_compute(&sc, 0, 8, 2, &qb, &kb, 0);
            schedule_finish(&sc);
            ScheduleSim out;
            run(&sc, &c, ident, &out);
            /* 100 x 50 visible pairs, 8 heads, head dim 64, at 20 TFLOP/s (50 rows: the full curve) */
            double want = 4.0 * 100 * 50 * 8 * 64 * (pass ? 2.5 : 1) / 20e12;
            if (merge) want += 10.0 * (100 * 8 * 64 + (pass ? 2 * 100 * 2 * 64 : 0)) / 100e9;
            CHECK(near(out.m[0].compute_s, want), "%s block, merge %d: %.9g s, by hand %.9g s",
                  pass ? "backward" : "forward", merge, out.m[0].compute_s, want);
            schedule_sim_free(&out);
            schedule_free(&sc);
        }
}

/* strategy_play_parts' schedule bounded in parts (simulate_lanes_bound) against the whole one
 * (simulate_schedule_bound): the same blocks and end bounds, bit for bit. */
static void check_parts(const Strategy *s, const StrategyParams *p, SchedulePass pass, const Cluster *c,
                        const int *rank_of) {
    StepSchedule sc;
    SchedulePlayParts parts;
    strategy_play(s, p, pass, &sc);
    strategy_play_parts(s, p, pass, &parts);
    const int M = sc.members;
    double *lb = xcalloc((size_t)M, sizeof *lb), *blocks = xcalloc((size_t)M, sizeof *blocks);
    double *lb2 = xcalloc((size_t)M, sizeof *lb2), *blocks2 = xcalloc((size_t)M, sizeof *blocks2);
    SeqErr e;
    int rc = simulate_schedule_bound(&sc, c, rank_of, 64, PRECISION_FP32, lb, blocks, &e);
    rc |= simulate_lanes_bound(&parts.exchange, parts.n_lanes ? parts.lanes : NULL, parts.lane_of, c, rank_of, 64,
                               PRECISION_FP32, lb2, blocks2, &e);
    int same = !rc && parts.exchange.members == M;
    for (int m = 0; same && m < M; m++) same &= lb[m] == lb2[m] && blocks[m] == blocks2[m];
    CHECK(same, "%s %s hp %d x cp %d: the bound in parts (%d lanes) is the whole schedule's", s->name,
          pass ? "backward" : "forward", p->hp, p->cp, parts.n_lanes);
    if (parts.n_lanes) { /* the whole as the parts put together one event at a time (schedule_add_lane) */
        StepSchedule ref;
        schedule_init(&ref, p->hp, p->cp, pass);
        const StepSchedule *x = &parts.exchange;
        for (int st = 0; st < x->n_steps; st++) {
            if (st == 1) {
                const int first = ref.n_steps;
                for (int h = 0; h < p->hp; h++) schedule_add_lane(&ref, &parts.lanes[parts.lane_of[h]], h, first);
            }
            schedule_step(&ref, x->steps[st].what);
            for (int i = x->steps[st].message0; i < x->steps[st].message0 + x->steps[st].n_message; i++) {
                const StepMessage *g = &x->messages[i];
                (g->after ? schedule_result : schedule_message)(&ref, g->kind, g->from, g->to, g->bytes, g->steps);
            }
        }
        if (!x->n_steps) /* one head member: no exchange */
            for (int h = 0; h < p->hp; h++) schedule_add_lane(&ref, &parts.lanes[parts.lane_of[h]], h, 0);
        schedule_finish(&ref);
        int eq = ref.n_steps == sc.n_steps && ref.n_compute == sc.n_compute && ref.n_messages == sc.n_messages;
        for (int i = 0; eq && i < sc.n_steps; i++)
            eq &= !strcmp(ref.steps[i].what, sc.steps[i].what) && ref.steps[i].compute0 == sc.steps[i].compute0 &&
                  ref.steps[i].n_compute == sc.steps[i].n_compute && ref.steps[i].message0 == sc.steps[i].message0 &&
                  ref.steps[i].n_message == sc.steps[i].n_message;
        eq = eq && !memcmp(ref.compute, sc.compute, sizeof *sc.compute * (size_t)sc.n_compute) &&
             !memcmp(ref.messages, sc.messages, sizeof *sc.messages * (size_t)sc.n_messages);
        CHECK(eq, "%s %s hp %d x cp %d: strategy_play's schedule is its lanes added one event at a time", s->name,
              pass ? "backward" : "forward", p->hp, p->cp);
        schedule_free(&ref);
    }
    xfree(lb), xfree(blocks), xfree(lb2), xfree(blocks2);
    schedule_play_parts_free(&parts);
    schedule_free(&sc);
}

/* Head members with different heads run different lanes (6 query heads over 4 head members: 2, 2, 1
 * and 1): each lane bounded as its own members'. */
static void test_uneven_lanes(void) {
    Cluster c = two_nodes(2);
    c.ranks_per_node = 4;
    c.attn.tflops[0] = 50;
    const Strategy *s = strategy_find("2d");
    StrategyParams p = {.hp = 4, .cp = 2, .layout = s->default_layout, .seq_len = 4096, .n_heads = 6, .n_kv_heads = 3,
                        .head_dim = 64};
    strategy_defaults(s, &p);
    char *err = strategy_check(s, &p);
    CHECK(!err, "2d on 6 heads over 4: %s", err ? err : "");
    xfree(err);
    if (err) return;
    SchedulePlayParts parts;
    strategy_play_parts(s, &p, PASS_FORWARD, &parts);
    CHECK(parts.n_lanes == 2, "6 heads over 4 head members: %d distinct lanes, 2 expected", parts.n_lanes);
    schedule_play_parts_free(&parts);
    int placed[8];
    for (int m = 0; m < 8; m++) placed[m] = (3 * m + 1) % 8;
    for (int ps = 0; ps < 2; ps++) check_parts(s, &p, (SchedulePass)ps, &c, placed);
}

/* Every strategy's schedules on 8 ranks of 2 nodes end, after their blocks, with all bytes counted. */
static void test_every_strategy(void) {
    Cluster c = two_nodes(2);
    c.ranks_per_node = 4;
    c.attn.tflops[0] = 50;
    for (int si = 0; strategy_at(si); si++) {
        const Strategy *s = strategy_at(si);
        int hp = 1, cp = 8;
        if (s->grid == GRID_HEADS_ONLY || s->own) hp = 8, cp = 1;
        else if (s->grid == GRID_2D) hp = 2, cp = 4;
        StrategyParams p = {.hp = hp, .cp = cp, .layout = s->grid == GRID_HEADS_ONLY ? LAYOUT_ZIGZAG : s->default_layout,
                            .seq_len = 8192, .n_heads = 8, .n_kv_heads = 8, .head_dim = 64, .chunks = s->own ? 2 : 0};
        if (!strcmp(s->name, "lightseq")) p.layout = LAYOUT_CONTIGUOUS;
        strategy_defaults(s, &p);
        char *err = strategy_check(s, &p);
        CHECK(!err, "%s: %s", s->name, err ? err : "");
        if (err) {
            xfree(err);
            continue;
        }
        int rank_of[8];
        for (int m = 0; m < 8; m++) rank_of[m] = m;
        for (int ps = 0; ps < 2; ps++) {
            StepSchedule sc;
            strategy_play(s, &p, (SchedulePass)ps, &sc);
            ScheduleSim out;
            const double t = run(&sc, &c, rank_of, &out);
            int ok = t > 0;
            for (int m = 0; m < 8; m++) {
                MemberTotals mt;
                schedule_member_totals(&sc, m, &mt);
                double bytes = 0;
                for (int k = 0; k < COMM_KINDS; k++) bytes += (double)mt.bytes[k];
                ok &= out.m[m].end_s >= out.m[m].compute_s && near(out.m[m].bytes_intra + out.m[m].bytes_inter, bytes);
            }
            CHECK(ok, "%s %s: simulated %.6g s; every rank ends after its blocks with its bytes counted", s->name,
                  ps ? "backward" : "forward", t);
            int shuffled[8]; /* members placed out of order: the lanes' members mapped as the whole's */
            for (int m = 0; m < 8; m++) shuffled[m] = (5 * m + 3) % 8;
            check_parts(s, &p, (SchedulePass)ps, &c, rank_of);
            check_parts(s, &p, (SchedulePass)ps, &c, shuffled);
            if (out.m) schedule_sim_free(&out);
            schedule_free(&sc);
        }
    }
}

static void test_bad_files(void) {
    char dir[] = "/tmp/test_simulate.XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp");
    struct { const char *json, *words; } cases[] = {
        {"{\"nodes\": 2, \"intra_gbs\": 100, \"attention\": [[64, 10]]}", "no \"ranks_per_node\""},
        {"{\"nodes\": 2, \"ranks_per_node\": 4, \"intra_gbs\": \"fast\", \"attention\": [[64, 10]]}", "\"intra_gbs\" must be a number"},
        {"{\"nodes\": 2, \"ranks_per_node\": 4, \"intra_gbs\": 100, \"attention\": [[64, 10]]}", "need \"nics_per_node\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 4, \"intra_gbs\": 100, \"attention\": [[64, 10], [32, 20]]}", "increasing rows"},
        {"{\"nodes\": 1, \"ranks_per_node\": 4, \"intra_gbs\": 100}", "\"attention\" must be a list"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 100, \"nics_per_node\": 4, \"attention\": [[1, 1]]}", "exceeds"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 100, \"device_mem_gbs\": -1, \"attention\": [[1, 1]]}",
         "\"device_mem_gbs\" must be 0"},
        {"{\"nodes\": 2, \"ranks_per_node\": 2, \"intra_gbs\": 100, \"nics_per_node\": 1, \"nic_gbs\": 10, "
         "\"nic_flows\": [[1, 10], [4, 12]], \"attention\": [[1, 1]]}", "0 < gbs <= \"nic_gbs\""},
        {"{\"nodes\": 2, \"ranks_per_node\": 2, \"intra_gbs\": 100, \"nics_per_node\": 1, \"nic_gbs\": 10, "
         "\"nic_flows\": [[4, 6], [1, 10]], \"attention\": [[1, 1]]}", "increasing flows"},
        {"{\"nodes\": 2, \"ranks_per_node\": 2, \"intra_gbs\": 100, \"nics_per_node\": 1, \"nic_gbs\": 10, "
         "\"nic_flows\": [[1]], \"attention\": [[1, 1]]}", "[flows, gbs]"},
        {"[1, 2]", "not a JSON object"},
        {"{\"nodes\": ", "give a JSON cluster file"},
    };
    char path[128];
    snprintf(path, sizeof path, "%s/c.json", dir);
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        FILE *f = fopen(path, "w");
        fputs(cases[i].json, f);
        fclose(f);
        Cluster c;
        SeqErr e;
        const int rc = cluster_load(path, &c, &e);
        CHECK(rc != 0 && strstr(e.msg, cases[i].words) && !strchr(e.msg, '\n'), "bad cluster %zu: %s", i,
              rc ? e.msg : "accepted");
    }
    FILE *f = fopen(path, "w");
    fputs("{\"name\": \"two\", \"nodes\": 2, \"ranks_per_node\": 4, \"intra_gbs\": 100, \"nics_per_node\": 2, "
          "\"nic_gbs\": 25, \"nic_latency_us\": 3, \"attention\": [[128, 50], [1024, 150]]}", f);
    fclose(f);
    Cluster c;
    SeqErr e;
    CHECK(cluster_load(path, &c, &e) == 0 && c.nodes == 2 && c.nics_per_node == 2 && c.nic_gbs == 25 &&
              c.attn.n == 2 && c.attn_backward_factor == 2.5 && !strcmp(c.name, "two"),
          "a good cluster file loads");
    unlink(path);
    rmdir(dir);
}

/* Ranks wired pair by pair inside a node (intra_peer_gbs): rank 0 of a 4-rank node sends 1e8 bytes
 * to ranks 1 and 2 at once through its 100 GB/s port. With 25 GB/s to any one peer each flow moves at
 * 25 (the port is not full); with 60, the port splits them at 50 each; with none, likewise at 50. */
static void test_peer_links(void) {
    const double peers[3] = {25, 60, 0}, want_rate[3] = {25e9, 50e9, 50e9};
    const int ident[4] = {0, 1, 2, 3};
    for (int i = 0; i < 3; i++) {
        Cluster c = two_nodes(1);
        c.nodes = 1;
        c.ranks_per_node = 4;
        c.intra_peer_gbs = peers[i];
        StepSchedule sc;
        schedule_init(&sc, 1, 4, PASS_FORWARD);
        schedule_step(&sc, "two flows out of rank 0");
        schedule_message(&sc, COMM_P2P_INNER, 0, 1, 100000000ULL, 1);
        schedule_message(&sc, COMM_P2P_INNER, 0, 2, 100000000ULL, 1);
        schedule_finish(&sc);
        ScheduleSim out;
        const double t = run(&sc, &c, ident, &out), want = 1e-6 + 1e8 / want_rate[i];
        CHECK(near(t, want), "two flows from one rank, %g GB/s a peer: %.9g s, by hand %.9g s", peers[i], t, want);
        schedule_sim_free(&out);
        schedule_free(&sc);
    }
}

/* Collectives as NCCL's ring plays them (simulate_collective), on 2 nodes x 4 ranks, ports of 100
 * GB/s and 1 us inside, NICs of 10 GB/s and 5 us, a buffer of B bytes a member:
 *   an all-gather over the 8 ranks, one NIC a node: 7/8 B through the NIC, 7 hops of its latency;
 *   two at once (even and odd ranks), one NIC: the node's NIC split between the two rings (not per
 *     peer: 3/4 B each at 5 GB/s);
 *   the data-parallel all-reduce of 4 rings of 2 (rank i and i + 4), 2 NICs a node: 20 GB/s a node
 *     over 4 rings, twice 1/2 B, 2 hops;
 *   a reduce-scatter inside node 0 (ranks 0-3): 3/4 B at the port's 100 GB/s, 3 hops of 1 us;
 *   two all-reduces of 2 inside one node that shares 200 GB/s among its ranks: 50 GB/s each. */
static void test_collectives(void) {
    const double B = 8e8;
    struct {
        int nics;
        double node_gbs;
        CollectiveKind kind;
        CollectiveGroups g;
        double want;
        int across;
        const char *what;
    } cases[] = {
        {1, 0, COLLECTIVE_ALLGATHER, {1, 8, 0, 1}, 7.0 / 8 * B / 10e9 + 7 * 5e-6, 1, "all-gather over 2 nodes, 1 NIC"},
        {1, 0, COLLECTIVE_ALLGATHER, {2, 4, 1, 2}, 3.0 / 4 * B / 5e9 + 3 * 5e-6, 1, "two all-gathers through 1 NIC"},
        {2, 0, COLLECTIVE_ALLREDUCE, {4, 2, 1, 4}, 2 * 0.5 * B / 5e9 + 2 * 5e-6, 1, "4 all-reduces over 2 NICs"},
        {1, 0, COLLECTIVE_REDUCE_SCATTER, {1, 4, 0, 1}, 3.0 / 4 * B / 100e9 + 3 * 1e-6, 0, "reduce-scatter in a node"},
        {1, 200, COLLECTIVE_ALLREDUCE, {2, 2, 2, 1}, 2 * 0.5 * B / 50e9 + 2 * 1e-6, 0, "two all-reduces, shared medium"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        Cluster c = two_nodes(cases[i].nics);
        c.ranks_per_node = 4;
        c.intra_node_gbs = cases[i].node_gbs;
        CollectiveSim cs;
        SeqErr e;
        const int rc = simulate_collective(&c, cases[i].kind, B, 1, &cases[i].g, &cs, &e);
        CHECK(rc == 0 && near(cs.seconds, cases[i].want) && cs.across == cases[i].across,
              "%s: %.9g s, by hand %.9g s", cases[i].what, cs.seconds, cases[i].want);
    }
    /* three of them one after another: the latencies add up, the bytes share one bandwidth term */
    Cluster c = two_nodes(1);
    c.ranks_per_node = 4;
    CollectiveSim cs;
    SeqErr e;
    const CollectiveGroups all = {1, 8, 0, 1};
    simulate_collective(&c, COLLECTIVE_ALLGATHER, B, 3, &all, &cs, &e);
    CHECK(near(cs.seconds, 7.0 / 8 * B / 10e9 + 21 * 5e-6), "three all-gathers: %.9g s", cs.seconds);
    /* seqpar's own collectives ("direct": every member's share straight to every other member): the
     * all-gather over the 8 ranks sends, from each node, 4 members x 4 on the other node x B / 8 =
     * 2 B through its NIC (the ring: 7/8 B); the ports' 7/8 B at 100 GB/s are not the limit. An
     * all-reduce of 2 nodes x 2 ranks (ranks 0-3, 2 a node): 2 x 2 x 2 / 4 B = 2 B a node (the ring:
     * 2 x 3/4 B): the 4 / 3 the two-host runs measured. Inside one node: as the ring. */
    c.collectives = CLUSTER_COLLECTIVES_DIRECT;
    simulate_collective(&c, COLLECTIVE_ALLGATHER, B, 1, &all, &cs, &e);
    CHECK(near(cs.seconds, 2 * B / 10e9 + 7 * 5e-6) && cs.across, "direct all-gather over 2 nodes: %.9g s", cs.seconds);
    const CollectiveGroups four = {1, 4, 0, 1};
    c.ranks_per_node = 2, c.nodes = 4;
    simulate_collective(&c, COLLECTIVE_ALLREDUCE, B, 1, &four, &cs, &e);
    const double direct_ar = cs.seconds;
    c.collectives = CLUSTER_COLLECTIVES_RING;
    simulate_collective(&c, COLLECTIVE_ALLREDUCE, B, 1, &four, &cs, &e);
    CHECK(near(direct_ar, 2 * B / 10e9 + 6 * 5e-6) && near(cs.seconds, 2 * 0.75 * B / 10e9 + 6 * 5e-6),
          "all-reduce over 2 nodes x 2 ranks: direct %.9g s, ring %.9g s", direct_ar, cs.seconds);
    c.collectives = CLUSTER_COLLECTIVES_DIRECT, c.ranks_per_node = 4, c.nodes = 2;
    const double ring_rs = 3.0 / 4 * B / 100e9 + 3 * 1e-6;
    simulate_collective(&c, COLLECTIVE_REDUCE_SCATTER, B, 1, &four, &cs, &e);
    CHECK(near(cs.seconds, ring_rs) && !cs.across, "direct reduce-scatter inside a node: %.9g s", cs.seconds);
    c.collectives = CLUSTER_COLLECTIVES_RING;
    const CollectiveGroups big = {1, 16, 0, 1};
    CHECK(simulate_collective(&c, COLLECTIVE_ALLGATHER, B, 1, &big, &cs, &e) != 0 && strstr(e.msg, "larger cluster"),
          "a collective beyond the cluster is refused: %s", e.msg);
}

/* Two replicas of a 2-rank ring played at once share the NIC: 2 nodes x 2 ranks, 1 NIC each; each
 * replica's ring crosses the nodes (members 0 and 2, 1 and 3): its two transfers take twice as long
 * as one replica's alone. */
static void test_replicas(void) {
    Cluster c = two_nodes(1);
    StepSchedule sc;
    schedule_init(&sc, 1, 2, PASS_FORWARD);
    schedule_step(&sc, "swap");
    schedule_message(&sc, COMM_P2P_INNER, 0, 1, 100000000ULL, 1);
    schedule_message(&sc, COMM_P2P_INNER, 1, 0, 100000000ULL, 1);
    schedule_finish(&sc);
    const int one[2] = {0, 2}, two[4] = {0, 2, 1, 3};
    ScheduleSim a, b;
    SeqErr e;
    const double t1 = run(&sc, &c, one, &a);
    const int rc = simulate_schedule_replicas(&sc, 2, &c, two, 64, PRECISION_FP32, &b, &e);
    CHECK(near(t1, 5e-6 + 1e8 / 10e9), "one replica: %.9g s", t1);
    CHECK(rc == 0 && b.members == 4 && near(b.end_s, 5e-6 + 2e8 / 10e9), "two replicas: %.9g s, by hand %.9g s",
          rc ? -1 : b.end_s, 5e-6 + 2e8 / 10e9);
    schedule_sim_free(&a);
    if (!rc) schedule_sim_free(&b);
    schedule_free(&sc);
}

/* The simulated trace (sim_trace_write, train --trace's format): the ring of 4 on two nodes; each
 * rank's blocks and waits in the trace add up to what the simulator reports, and the file holds one
 * named thread a rank and one event a block step and a wait. */
static void test_trace(void) {
    StepSchedule sc;
    play_ring4(&sc);
    Cluster c = two_nodes(1);
    const int ranks[4] = {0, 1, 2, 3};
    ScheduleSim out;
    SimTrace tr;
    SeqErr e;
    CHECK(simulate_schedule_trace(&sc, &c, ranks, 64, PRECISION_FP32, &tr, &out, &e) == 0, "traced: %s", e.msg);
    double blocks[4] = {0}, waits[4] = {0};
    for (int i = 0; i < tr.n; i++) *(tr.ev[i].wait ? &waits[tr.ev[i].member] : &blocks[tr.ev[i].member]) += tr.ev[i].t1 - tr.ev[i].t0;
    for (int m = 0; m < 4; m++)
        CHECK(near(blocks[m], out.m[m].compute_s) && near(waits[m], out.m[m].wait_s),
              "rank %d: traced blocks %.9g / waits %.9g s, simulated %.9g / %.9g", m, blocks[m], waits[m],
              out.m[m].compute_s, out.m[m].wait_s);
    char path[] = "/tmp/test_simulate_trace.XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(sim_trace_write(&tr, ranks, 4, path, &e) == 0, "trace written: %s", e.msg);
    FILE *f = fopen(path, "r");
    char text[1 << 16] = "";
    const size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[got] = 0;
    if (f) fclose(f);
    int x = 0, named = 0;
    for (const char *q = text; (q = strstr(q, "\"ph\":\"X\"")); q++) x++;
    for (const char *q = text; (q = strstr(q, "\"thread_name\"")); q++) named++;
    CHECK(!strncmp(text, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 38) && x == tr.n && named == 4 &&
              strstr(text, "\"args\":{\"name\":\"rank 3\"}"),
          "the trace file: %d events of %d, %d ranks named", x, tr.n, named);
    unlink(path);
    sim_trace_free(&tr);
    schedule_sim_free(&out);
    schedule_free(&sc);
}

int main(void) {
    test_trace();
    test_collectives();
    test_replicas();
    test_peer_links();
    test_nic_sharing();
    test_nic_flows();
    test_nic_egress();
    test_ring_two_nodes();
    test_alltoall();
    test_compute_and_results();
    test_block_shape_and_merge();
    test_every_strategy();
    test_uneven_lanes();
    test_bad_files();
    return test_summary("test_simulate");
}
