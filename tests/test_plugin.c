/* "Adding a strategy is one new file plus one line in the registry", kept true: this test compiles
 * the registry (src/strategies/registry.c) with one more line, X(example), and the example plug-in
 * tests/plugin/example.c, and checks that the whole system sees it through the registry alone: the
 * list and lookup, the unknown-name message, the grid rule, the knobs it reads and refuses, its flags'
 * help, its default layout and placement settings for the planner, and an exact forward and backward
 * against the float64-checked single-process reference on every rank count it runs on (mpirun -np
 * 1, 2, 4). Prints "N passed, N failed". */
#define SEQPAR_REGISTRY_EXTRA(X) X(example)
#include "strategies/registry.c"

#include "plugin/example.c"

#include <cblas.h>
#include <omp.h>

#include "testlib.h"
#include "attn_reference.h"
#include "parallel/dist_attention.h"

static void registry_checks(void) {
    int n = 0, last = -1;
    for (int i = 0; strategy_at(i); i++, n++)
        if (!strcmp(strategy_at(i)->name, "example")) last = i;
    CHECK(n == 8 && last == 7, "the example is the registry's 8th strategy (found %d of %d)", last, n);
    CHECK(strategy_find("example") == &example_strategy, "strategy_find(\"example\")");
    CHECK(strategy_default() != &example_strategy, "the default stays the table's first");
    char *m = strategy_unknown_message("nosuch");
    CHECK(strstr(m, "wallfacer, example") != NULL, "the unknown-name message lists it: %s", m);
    xfree(m);
    int hp, cp;
    char *err = strategy_grid(&example_strategy, 0, 0, 4, 8, &hp, &cp);
    CHECK(!err && hp == 1 && cp == 4, "context-only grid: hp %d cp %d", hp, cp);
    xfree(err);
    err = strategy_grid(&example_strategy, 2, 0, 4, 8, &hp, &cp);
    CHECK(err && strstr(err, "--strategy example splits the sequence only: drop --hp 2"), "--hp refused: %s",
          err ? err : "(none)");
    xfree(err);
    /* its knobs: --ring-inner read; another strategy's refused in that strategy's words */
    ParallelConfig pc;
    parallel_config_default(&pc);
    pc.strategy = "example";
    knob_set(&pc.knobs, "ring-inner", 2);
    err = parallel_flags_check(&example_strategy, &pc);
    CHECK(!err, "--ring-inner is the example's: %s", err ? err : "");
    xfree(err);
    StrategyParams given = {0};
    strategy_apply_knobs(&example_strategy, &pc.knobs, &given);
    CHECK(given.ring_inner == 2, "--ring-inner 2 reaches the example's parameters: %d", given.ring_inner);
    pc.cp = 4;
    char flags[64];
    strategy_knob_flags(&example_strategy, &pc, flags, sizeof flags);
    CHECK(!strcmp(flags, " --ring-inner 2"), "its flags as the planner prints them: '%s'", flags);
    knob_set(&pc.knobs, "ring-inner", 4); /* = cp: the plain ring, what not giving it means */
    strategy_knob_flags(&example_strategy, &pc, flags, sizeof flags);
    CHECK(!strcmp(flags, ""), "W = cp left off the printed flags: '%s'", flags);
    knob_set(&pc.knobs, "ring-inner", 0);
    knob_set(&pc.knobs, "team", 2);
    err = parallel_flags_check(&example_strategy, &pc);
    CHECK(err && !strcmp(err, "--team 2 is read by --strategy wallfacer only: drop it or use --strategy wallfacer"),
          "--team refused: %s", err ? err : "(none)");
    xfree(err);
    knob_set(&pc.knobs, "team", 0);
    knob_set(&pc.knobs, "chunks", 4);
    err = parallel_flags_check(&example_strategy, &pc);
    CHECK(err && strstr(err, "--chunks 4 is read by --strategy fpdt only"), "--chunks refused: %s", err ? err : "(none)");
    xfree(err);
    /* its flag in --help: listed once, by 2d (the first that declares it) */
    char help[4096];
    strategy_flags_help(help, sizeof help);
    const char *first = strstr(help, "--ring-inner W");
    CHECK(first && !strstr(first + 1, "--ring-inner W"), "--ring-inner listed once in the flags' help");
    /* the planner's settings: inner rings 2 and 4 (plain ring) on cp 4, one placement each */
    StrategyFixed fx = {.placement = -1, .seq_len = 64};
    StrategyCandidate c[16];
    int nc = strategy_candidates(&example_strategy, 1, 4, &fx, c, 16);
    CHECK(nc == 2 && knob_get(&c[0].knobs, "ring-inner") == 2 && knob_get(&c[1].knobs, "ring-inner") == 4 &&
              c[1].plain_ring && !c[0].plain_ring,
          "planner settings on cp 4: %d", nc);
    /* its traffic: a ring's exact volume, counted by the composition */
    StrategyParams p = {.hp = 1, .cp = 4, .ring_inner = 4, .layout = LAYOUT_STRIPED, .seq_len = 64, .n_heads = 4,
                        .n_kv_heads = 2, .head_dim = 16};
    AttnVolume v;
    strategy_volume(&example_strategy, &p, 0, 1, &v);
    const unsigned long long kv = 8ULL * 16 * 2 * 16; /* 8 n Hk d, n = 16 */
    CHECK(v.fwd[COMM_P2P_INNER] == 3 * kv && v.bwd[COMM_P2P_INNER] == 3 * kv + 4 * kv,
          "ring volume: fwd %llu bwd %llu", v.fwd[COMM_P2P_INNER], v.bwd[COMM_P2P_INNER]);
    /* and the schedule it plays (the planner's simulator replays it): 4 ring steps, the same bytes */
    StepSchedule sc;
    strategy_play(&example_strategy, &p, PASS_BACKWARD, &sc);
    MemberTotals mt;
    schedule_member_totals(&sc, 1, &mt);
    CHECK(sc.n_steps == 4 && mt.bytes[COMM_P2P_INNER] == v.bwd[COMM_P2P_INNER] && mt.msgs[COMM_P2P_INNER] == 7,
          "played backward: %d steps, %llu bytes in %llu messages", sc.n_steps, mt.bytes[COMM_P2P_INNER],
          mt.msgs[COMM_P2P_INNER]);
    schedule_free(&sc);
}

/* Forward and backward of the example on this world (hp 1, cp = world) against the reference. */
static void exact_run(const HeadCase hc, uint64_t seed) {
    Reference R;
    reference_build(&R, hc, seed);
    Topology t;
    topology_create(&t, 1, 1, g_size, g_size, PLACEMENT_HEAD_FIRST, 2);
    Comm *cm = comm_create(&t, NULL);
    StrategyParams sp = {.hp = 1, .cp = g_size, .ring_inner = g_size, .layout = example_strategy.default_layout,
                         .seq_len = hc.S, .n_heads = hc.H, .n_kv_heads = hc.Hkv, .head_dim = hc.d};
    char *err = strategy_check(&example_strategy, &sp);
    CHECK(!err, "check: %s", err ? err : "");
    xfree(err);
    const int N = hc.S / g_size, H = hc.H, Hkv = hc.Hkv, d = hc.d;
    SeqAttention *sa = g_size > 1 ? strategy_create_attention(&example_strategy, &sp, &t, cm)
                                  : local_attention_create((AttnHeads){.n_local = N, .n_heads = H, .n_kv_heads = Hkv,
                                                                       .head_dim = d});
    int *pos = xmalloc(sizeof(int) * (size_t)N);
    strategy_positions(&example_strategy, &sp, 0, t.cp_rank, pos);
    sa->set_positions(sa, pos, NULL);
    float *q = xmalloc(sizeof(float) * (size_t)N * H * d), *k = xmalloc(sizeof(float) * (size_t)N * Hkv * d);
    float *v = xmalloc(sizeof(float) * (size_t)N * Hkv * d), *dout = xmalloc(sizeof(float) * (size_t)N * H * d);
    gather_rows(q, R.q, pos, N, H * d);
    gather_rows(k, R.k, pos, N, Hkv * d);
    gather_rows(v, R.v, pos, N, Hkv * d);
    gather_rows(dout, R.dout, pos, N, H * d);
    float *o = xmalloc(sizeof(float) * (size_t)N * H * d), *dq = xmalloc(sizeof(float) * (size_t)N * H * d);
    float *dk = xmalloc(sizeof(float) * (size_t)N * Hkv * d), *dv = xmalloc(sizeof(float) * (size_t)N * Hkv * d);
    float *saved = xmalloc(sizeof(float) * sa->saved_floats);
    sa->forward(sa, q, k, v, o, saved);
    sa->backward(sa, q, k, v, o, saved, dout, dq, dk, dv);
    const double eo = row_err(o, R.o, pos, N, H * d, 1.0, 0);
    const double eq = row_err(dq, R.dq, pos, N, H * d, 1.0, 0) / (GRAD_REL * R.scale_dq);
    const double ek = row_err(dk, R.dk, pos, N, Hkv * d, 1.0, 0) / (GRAD_REL * R.scale_dk);
    const double ev = row_err(dv, R.dv, pos, N, Hkv * d, 1.0, 0) / (GRAD_REL * R.scale_dv);
    CHECK(eo <= O_ATOL, "np %d H %d Hkv %d: O error %.3g", g_size, H, Hkv, eo);
    CHECK(eq <= 1.0 && ek <= 1.0 && ev <= 1.0, "np %d H %d Hkv %d: dq %.3g dk %.3g dv %.3g x tolerance", g_size, H,
          Hkv, eq, ek, ev);
    /* the striped layout: rank r holds positions r, r + P, ... */
    int striped = 1;
    for (int i = 0; i < N; i++) striped &= pos[i] == t.cp_rank + i * g_size;
    CHECK(striped, "the default layout is the example's (striped)");
    seq_attention_destroy(sa);
    comm_destroy(cm, NULL);
    topology_free(&t);
    xfree(pos), xfree(q), xfree(k), xfree(v), xfree(dout), xfree(o), xfree(dq), xfree(dk), xfree(dv), xfree(saved);
    reference_free(&R);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    (void)g_fail_prints; /* attn_reference.h's CHECKQ counter: this test uses CHECK */
    registry_checks();
    const HeadCase cases[] = {{4, 4, 16, 64}, {4, 2, 16, 64}, {6, 1, 32, 32}};
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) exact_run(cases[i], 500 + i);
    int fails = tl_failed, all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int rc = 0;
    if (g_rank == 0) rc = test_summary("test_plugin");
    MPI_Finalize();
    return rc || all;
}
