/* The step simulator (plan/simulate.h) and cluster files (plan/cluster.h) on schedules whose times
 * are computed by hand: two flows through one NIC and through two, a 4-rank ring over two nodes
 * whose steps wait for the link between the nodes, an all-to-all across two nodes, the attention
 * rate's interpolation, a message posted after the blocks; every registered strategy's played
 * schedule runs to the end with its bytes split into intra- and inter-node; a per-peer limit inside a
 * node; bad cluster files are
 * refused with one line naming the field. No MPI. */
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

static double run(const StepSchedule *sc, const Cluster *c, const int *rank_of, ScheduleSim *out) {
    SeqErr e;
    if (simulate_schedule(sc, c, rank_of, 64, PRECISION_FP32, out, &e) != 0) {
        CHECK(0, "simulate: %s", e.msg);
        return -1;
    }
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

/* The ring of 4 ranks on 2 nodes (ranks 0, 1 | 2, 3): in each of its 3 transfer steps two KV blocks
 * cross between the nodes (1 -> 2, 3 -> 0), each alone on its NIC's direction, and two stay inside;
 * each step ends with the slower, 5 us + b / 10 GB/s. */
static void test_ring_two_nodes(void) {
    const Strategy *ring = strategy_find("ring");
    StrategyParams p = {.hp = 1, .cp = 4, .layout = LAYOUT_ZIGZAG, .seq_len = 4096, .n_heads = 8, .n_kv_heads = 8,
                        .head_dim = 64};
    StepSchedule sc;
    strategy_play(ring, &p, PASS_FORWARD, &sc);
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

int main(void) {
    test_peer_links();
    test_nic_sharing();
    test_nic_egress();
    test_ring_two_nodes();
    test_alltoall();
    test_compute_and_results();
    test_every_strategy();
    test_bad_files();
    return test_summary("test_simulate");
}
