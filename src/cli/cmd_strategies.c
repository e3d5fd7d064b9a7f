/* seqpar strategies: lists the registered distributed attention strategies (registry.h) with the
 * flags they read and their constraints. With a model shape and a rank count it also prints, for
 * every strategy that can run it, the bytes one rank sends per layer and its attention memory,
 * from the strategies' own formulas (the tests check those formulas against what is sent); with
 * --schedule NAME, the steps that strategy plays (strategy_play: blocks and messages per step). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "train/cli_common.h"
#include "cli/commands.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "plan/simulate.h"
#include "strategies/registry.h"

static const char HELP[] =
    "usage: seqpar strategies [--names] [--ranks P --seq-len S --heads H --kv-heads K --head-dim D]\n"
    "       seqpar strategies --schedule NAME --ranks P [--hp H --cp C --layout L --placement P --window W\n"
    "                         --backward --cluster NAME|FILE [cluster overrides]] [knobs] [shape flags as above]\n"
    "\n"
    "Lists the distributed attention strategies ('--strategy NAME' of train, grad and bench), the\n"
    "flags each reads and its constraints. Given --ranks, also prints per strategy (all ranks in one\n"
    "sequence-parallel group, its default grid) the bytes rank 0 sends per layer, forward + backward,\n"
    "and its attention memory, from the strategies' formulas (bytes and messages of the busiest rank).\n"
    "\n"
    "  --names        the strategies' names only, one a line\n"
    "  --ranks P      sequence-parallel ranks (default: list only)\n"
    "  --seq-len S    global sequence length (default 16384)\n"
    "  --heads H      query heads (default 8)\n"
    "  --kv-heads K   key/value heads (default: H)\n"
    "  --head-dim D   head dimension (default 64)\n"
    "  --precision P  fp32 (default) or bf16: with bf16 the head exchange sends 2 bytes an element\n"
    "  knobs          the strategies' own flags, each applied to the strategies that declare it\n"
    "                 (default: each strategy's own, e.g. the largest team C with C^2 dividing the ranks):\n"
    "%s"
    "\n"
    "  --schedule NAME  the schedule strategy NAME runs for one layer's attention on P ranks, step by\n"
    "                 step: each step's attention blocks (count, the most score cells one rank computes)\n"
    "                 and messages (count, the most bytes one rank sends, the step by which the last must\n"
    "                 arrive); the schedule the planner's simulator replays. --hp / --cp pick the grid\n"
    "                 (default: the strategy's), the knobs its settings, --layout the token layout,\n"
    "                 --placement the ranks' order (as train's: head-first, context-first, team-first,\n"
    "                 ring-first), --window a sliding window, --backward the backward pass\n"
    "  --cluster NAME|FILE  with --schedule: play it on a cluster, a preset ('seqpar plan --clusters'\n"
    "                 lists them) or a JSON cluster file (docs/planner.md; the group's ranks on the\n"
    "                 cluster's first ranks in --placement's order), and print each rank's simulated\n"
    "                 time: its blocks, its exposed wait, its end\n"
    "  --trace FILE     with --cluster: the simulated layer as a Chrome trace (train --trace's format:\n"
    "                 each rank's blocks by step and its exposed waits), to open beside a measured one\n"
    CLUSTER_OVERRIDE_HELP;

/* One line a step: its blocks (count, the most cells one member computes), its messages (count, the
 * most bytes one member sends, the last step by which one must arrive); then each member's totals
 * against strategy_volume. */
static void print_schedule(const Strategy *s, const StrategyParams *p, SchedulePass pass, const Cluster *cl,
                           const char *trace_path) {
    StepSchedule sc;
    strategy_play(s, p, pass, &sc);
    char knobs[96] = "";
    strategy_describe(s, p, knobs, sizeof knobs);
    char win[32] = "";
    if (p->window) snprintf(win, sizeof win, ", window %d", p->window);
    printf("%s %s, hp %d x cp %d%s, S = %ld, %s layout, %d heads (%d KV), head_dim %d%s%s:\n", s->name,
           pass == PASS_BACKWARD ? "backward" : "forward", p->hp, p->cp, knobs, p->seq_len, layout_name(p->layout),
           p->n_heads, p->n_kv_heads, p->head_dim, p->wire_bf16 ? ", bf16 wire" : "", win);
    printf("%5s  %-44s %7s %14s %9s %12s %9s\n", "step", "what", "blocks", "max cells", "messages", "max MiB",
           "arrive by");
    double *sent = xcalloc((size_t)sc.members, sizeof *sent);
    unsigned long long *cells = xcalloc((size_t)sc.members, sizeof *cells);
    for (int i = 0; i < sc.n_steps; i++) {
        const ScheduleStep *st = &sc.steps[i];
        memset(sent, 0, sizeof *sent * (size_t)sc.members);
        memset(cells, 0, sizeof *cells * (size_t)sc.members);
        double most = 0;
        unsigned long long most_cells = 0;
        int by = i;
        for (int j = st->message0; j < st->message0 + st->n_message; j++) {
            const StepMessage *m = &sc.messages[j];
            sent[m->from] += (double)m->bytes;
            if (sent[m->from] > most) most = sent[m->from];
            if (i + m->steps - 1 > by) by = i + m->steps - 1;
        }
        for (int j = st->compute0; j < st->compute0 + st->n_compute; j++) {
            const StepCompute *c = &sc.compute[j];
            cells[c->member] += c->cells;
            if (cells[c->member] > most_cells) most_cells = cells[c->member];
        }
        printf("%5d  %-44s %7d %14llu %9d %12.3f %9d\n", i, st->what, st->n_compute, most_cells, st->n_message,
               most / 1048576.0, by);
    }
    int equal = 1;
    MemberTotals *totals = xmalloc(sizeof *totals * (size_t)sc.members);
    schedule_totals(&sc, totals);
    for (int h = 0; h < p->hp; h++)
        for (int c = 0; c < p->cp; c++) {
            AttnVolume v;
            strategy_volume(s, p, h, c, &v);
            const MemberTotals t = totals[c * p->hp + h];
            for (int k = 0; k < COMM_KINDS; k++)
                equal &= t.bytes[k] == (pass == PASS_BACKWARD ? v.bwd[k] : v.fwd[k]) &&
                         t.msgs[k] == (pass == PASS_BACKWARD ? v.bwd_msgs[k] : v.fwd_msgs[k]);
        }
    xfree(totals);
    printf("%d steps, %d blocks, %d messages; every rank's bytes and messages per kind %s its volume formula\n",
           sc.n_steps, sc.n_compute, sc.n_messages, equal ? "equal" : "DIFFER FROM");
    if (cl) {
        int *rank_of = xmalloc(sizeof(int) * (size_t)sc.members);
        for (int m = 0; m < sc.members; m++) /* member c hp + h on its world rank under the placement */
            rank_of[m] = placement_world_rank(p->placement, p->hp, p->cp, 0, m % p->hp, m / p->hp);
        ScheduleSim sim;
        SimTrace trace;
        SeqErr e;
        if (simulate_schedule_trace(&sc, cl, rank_of, p->head_dim, p->wire_bf16 ? PRECISION_BF16 : PRECISION_FP32, &trace,
                                    &sim, &e) != 0)
            die_collective("seqpar strategies: %s", e.msg);
        if (trace_path && sim_trace_write(&trace, rank_of, sc.members, trace_path, &e) != 0)
            die_collective("seqpar strategies: --trace %s: %s", trace_path, e.msg);
        sim_trace_free(&trace);
        printf("\nsimulated on %s (%d nodes x %d ranks, %d NIC%s of %g GB/s a node):\n", cl->name, cl->nodes,
               cl->ranks_per_node, cl->nics_per_node, cl->nics_per_node == 1 ? "" : "s", cl->nic_gbs);
        printf("%6s %6s %12s %12s %12s %14s %14s\n", "rank", "node", "blocks ms", "wait ms", "end ms", "intra MiB",
               "inter MiB");
        for (int m = 0; m < sim.members; m++)
            printf("%6d %6d %12.4f %12.4f %12.4f %14.3f %14.3f\n", rank_of[m], cluster_node_of(cl, rank_of[m]),
                   1e3 * sim.m[m].compute_s, 1e3 * sim.m[m].wait_s, 1e3 * sim.m[m].end_s,
                   sim.m[m].bytes_intra / 1048576.0, sim.m[m].bytes_inter / 1048576.0);
        printf("the layer's %s attention ends at %.4f ms (rank %d last)\n", pass == PASS_BACKWARD ? "backward" : "forward",
               1e3 * sim.end_s, rank_of[sim.slowest]);
        schedule_sim_free(&sim);
        xfree(rank_of);
    }
    xfree(sent);
    xfree(cells);
    schedule_free(&sc);
}

int cmd_strategies(int argc, char **argv) {
    const char *cmd = "strategies";
    int P = 0, H = 8, K = 0, d = 64, precision = PRECISION_FP32, names = 0;
    int hp_given = 0, cp_given = 0, window = 0, backward = 0, layout = -1, placement = -1;
    KnobValues knobs = {0}; /* the strategies' own flags (--team, --ring-inner, --chunks, ...) */
    const char *schedule = NULL, *cluster = NULL, *trace = NULL;
    long S = 16384;
    static const struct option opts[] = {
        {"ranks", required_argument, 0, 'P'}, {"seq-len", required_argument, 0, 'S'},
        {"heads", required_argument, 0, 'H'}, {"kv-heads", required_argument, 0, 'K'},
        {"head-dim", required_argument, 0, 'd'},
        {"precision", required_argument, 0, 'p'}, {"names", no_argument, 0, 'n'},
        {"schedule", required_argument, 0, 's'}, {"hp", required_argument, 0, 'a'},
        {"cp", required_argument, 0, 'c'}, {"layout", required_argument, 0, 'L'},
        {"placement", required_argument, 0, 'o'},
        {"window", required_argument, 0, 'w'}, {"backward", no_argument, 0, 'b'},
        {"cluster", required_argument, 0, 'X'}, {"trace", required_argument, 0, 'T'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    ClusterOverrides over;
    SeqErr ce;
    if (cluster_take_overrides(&argc, argv, &over, &ce) != 0) die_collective("seqpar %s: %s", cmd, ce.msg);
    int opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_full(argc, argv, ":h", options_with_knobs(opts), cmd)) != -1) {
        if (knob_option_handle(&knobs, cmd, opt, optarg)) continue;
        switch (opt) {
        case 'P': P = (int)parse_long(cmd, "ranks", optarg, 1, 1 << 20); break;
        case 'S': S = parse_long(cmd, "seq-len", optarg, 1, 1L << 40); break;
        case 'H': H = (int)parse_long(cmd, "heads", optarg, 1, 1 << 16); break;
        case 'K': K = (int)parse_long(cmd, "kv-heads", optarg, 1, 1 << 16); break;
        case 'd': d = (int)parse_long(cmd, "head-dim", optarg, 1, 1 << 16); break;
        case 'p':
            precision = precision_parse(optarg);
            if (precision < 0) die_collective("seqpar %s: --precision expects fp32 or bf16, got '%s'", cmd, optarg);
            break;
        case 'n': names = 1; break;
        case 's': schedule = optarg; break;
        case 'a': hp_given = (int)parse_long(cmd, "hp", optarg, 1, 1 << 20); break;
        case 'c': cp_given = (int)parse_long(cmd, "cp", optarg, 1, 1 << 20); break;
        case 'L': layout = (int)layout_parse(optarg); break;
        case 'o': placement = (int)placement_parse(optarg); break;
        case 'w': window = (int)parse_long(cmd, "window", optarg, 1, 1 << 30); break;
        case 'b': backward = 1; break;
        case 'X': cluster = optarg; break;
        case 'T': trace = optarg; break;
        case 'h': {
            char knobs_help[2048];
            strategy_flags_help(knobs_help, sizeof knobs_help);
            printf(HELP, knobs_help);
            return 0;
        }
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    if (over.n && !cluster)
        die_collective("seqpar %s: a cluster override (%s) needs --cluster NAME|FILE: give the cluster it changes", cmd,
                       over.flag[0]);
    if (trace && !cluster)
        die_collective("seqpar %s: --trace needs --schedule NAME and --cluster NAME|FILE: the trace is of the simulated "
                       "schedule", cmd);
    if (!K) K = H;
    if (schedule) {
        if (!P) die_collective("seqpar %s: --schedule needs --ranks P (the ranks of the sequence-parallel group)", cmd);
        const Strategy *s = strategy_find(schedule);
        if (!s) die_collective("seqpar %s: %s", cmd, strategy_unknown_message(schedule));
        ParallelConfig cfg;
        parallel_config_default(&cfg);
        cfg.strategy = s->name;
        cfg.knobs = knobs;
        if (placement >= 0) cfg.placement = (Placement)placement, cfg.placement_given = 1;
        /* head-first is the default, which a strategy with teams reads as its teams on consecutive ranks */
        const Placement pl = s->reads & KNOB_TEAM_PLACEMENT && cfg.placement == PLACEMENT_HEAD_FIRST
                                 ? PLACEMENT_TEAM_FIRST : cfg.placement;
        int hp, cp;
        char *err = parallel_flags_check(s, &cfg); /* another strategy's knob */
        if (!err) err = strategy_grid(s, hp_given, cp_given, P, H, &hp, &cp);
        if (!err && (long)hp * cp != P)
            err = xstrdup_printf("--hp %d x --cp %d is %d ranks, not --ranks %d: give --hp and --cp whose product is P",
                                 hp, cp, hp * cp, P);
        StrategyParams p = {.hp = hp, .cp = cp, .placement = pl,
                            .layout = layout >= 0 ? (TokenLayout)layout : s->default_layout, .seq_len = S,
                            .n_heads = H, .n_kv_heads = K, .head_dim = d, .wire_bf16 = precision == PRECISION_BF16,
                            .window = window};
        if (!err) {
            strategy_apply_knobs(s, &knobs, &p);
            strategy_defaults(s, &p);
            err = strategy_check(s, &p);
        }
        if (err) die_collective("seqpar %s: --schedule %s: %s", cmd, s->name, err);
        Cluster cl;
        if (cluster && (cluster_resolve(cluster, &cl, &ce) != 0 || cluster_apply_overrides(&cl, &over, &ce) != 0))
            die_collective("seqpar %s: %s", cmd, ce.msg);
        print_schedule(s, &p, backward ? PASS_BACKWARD : PASS_FORWARD, cluster ? &cl : NULL, trace);
        return 0;
    }
    if (names) {
        for (int i = 0; strategy_at(i); i++) printf("%s\n", strategy_at(i)->name);
        return 0;
    }
    for (int i = 0; strategy_at(i); i++) {
        const Strategy *s = strategy_at(i);
        printf("%-10s %s\n", s->name, s->summary);
        printf("%-10s flags: %s; constraints: %s%s%s\n", "", s->flags, s->constraints,
               s->own ? "" : "; default layout ", /* an own attention's layout is in its constraints (no --layout) */
               s->own ? "" : layout_name(s->default_layout));
    }
    if (!P) return 0;
    printf("\n%d ranks, S = %ld, %d heads (%d KV), head_dim %d, %s, per layer (busiest rank):\n", P, S, H, K, d,
           precision == PRECISION_BF16 ? "bf16 head exchange, fp32 context schedules" : "fp32");
    printf("%-10s %-10s %14s %14s %10s %16s %14s\n", "strategy", "grid", "fwd MiB", "bwd MiB", "messages",
           "saved MiB/layer", "buffers MiB");
    for (int i = 0; strategy_at(i); i++) {
        const Strategy *s = strategy_at(i);
        int hp, cp;
        char *err = strategy_grid(s, 0, 0, P, H, &hp, &cp);
        StrategyParams p = {.hp = hp, .cp = cp, .layout = s->default_layout, .seq_len = S,
                            .n_heads = H, .n_kv_heads = K, .head_dim = d, .wire_bf16 = precision == PRECISION_BF16};
        if (!err && (long)hp * cp != P) { /* 2d's default grid is 1 x 1: spread it as heads x context */
            p.hp = 1;
            for (int h = 1; h <= P && h <= H; h++)
                if (P % h == 0 && h * h <= P) p.hp = h;
            p.cp = P / p.hp;
        }
        strategy_apply_knobs(s, &knobs, &p);
        strategy_defaults(s, &p);
        if (!err) err = strategy_check(s, &p);
        if (err) {
            printf("%-10s cannot run: %s\n", s->name, err);
            xfree(err);
            continue;
        }
        AttnMemory m;
        strategy_memory(s, &p, 0, &m);
        unsigned long long fb = 0, bb = 0, msgs = 0; /* the busiest rank of each */
        for (int h = 0; h < p.hp; h++)
            for (int c = 0; c < p.cp; c++) {
                AttnVolume v;
                strategy_volume(s, &p, h, c, &v);
                unsigned long long f = 0, b = 0, n = 0;
                for (int k = 0; k < COMM_KINDS; k++) {
                    f += v.fwd[k];
                    b += v.bwd[k];
                    n += v.fwd_msgs[k] + v.bwd_msgs[k];
                }
                if (f > fb) fb = f;
                if (b > bb) bb = b;
                if (n > msgs) msgs = n;
            }
        char grid[32];
        snprintf(grid, sizeof grid, "%dx%d", p.hp, p.cp);
        printf("%-10s %-10s %14.2f %14.2f %10llu %16.2f %14.2f\n", s->name, grid, fb / 1048576.0, bb / 1048576.0, msgs,
               m.saved_per_layer * 4.0 / 1048576.0, m.workspace * 4.0 / 1048576.0);
    }
    return 0;
}
