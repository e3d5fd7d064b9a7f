/* seqpar strategies: lists the registered distributed attention strategies (registry.h) with the
 * flags they read and their constraints. With a model shape and a rank count it also prints, for
 * every strategy that can run it, the bytes one rank sends per layer and its attention memory,
 * from the strategies' own formulas (the tests check those formulas against what is sent). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "train/cli_common.h"
#include "cli/commands.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "strategies/registry.h"

static const char HELP[] =
    "usage: seqpar strategies [--names] [--ranks P --seq-len S --heads H --kv-heads K --head-dim D]\n"
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
    "  --team C       team size of the strategies with teams (default: theirs, e.g. the largest C with\n"
    "                 C^2 dividing the ranks)\n"
    "  --precision P  fp32 (default) or bf16: with bf16 the head exchange sends 2 bytes an element\n";

int cmd_strategies(int argc, char **argv) {
    const char *cmd = "strategies";
    int P = 0, H = 8, K = 0, d = 64, team = 0, precision = PRECISION_FP32, names = 0;
    long S = 16384;
    static const struct option opts[] = {
        {"ranks", required_argument, 0, 'P'}, {"seq-len", required_argument, 0, 'S'},
        {"heads", required_argument, 0, 'H'}, {"kv-heads", required_argument, 0, 'K'},
        {"head-dim", required_argument, 0, 'd'}, {"team", required_argument, 0, 'C'},
        {"precision", required_argument, 0, 'p'}, {"names", no_argument, 0, 'n'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_full(argc, argv, ":h", opts, cmd)) != -1) {
        switch (opt) {
        case 'P': P = (int)parse_long(cmd, "ranks", optarg, 1, 1 << 20); break;
        case 'S': S = parse_long(cmd, "seq-len", optarg, 1, 1L << 40); break;
        case 'H': H = (int)parse_long(cmd, "heads", optarg, 1, 1 << 16); break;
        case 'K': K = (int)parse_long(cmd, "kv-heads", optarg, 1, 1 << 16); break;
        case 'd': d = (int)parse_long(cmd, "head-dim", optarg, 1, 1 << 16); break;
        case 'C': team = (int)parse_long(cmd, "team", optarg, 1, 1 << 20); break;
        case 'p':
            precision = precision_parse(optarg);
            if (precision < 0) die_collective("seqpar %s: --precision expects fp32 or bf16, got '%s'", cmd, optarg);
            break;
        case 'n': names = 1; break;
        case 'h': fputs(HELP, stdout); return 0;
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    if (!K) K = H;
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
        StrategyParams p = {.hp = hp, .cp = cp, .team = team, .layout = s->default_layout, .seq_len = S,
                            .n_heads = H, .n_kv_heads = K, .head_dim = d, .wire_bf16 = precision == PRECISION_BF16};
        if (!err && (long)hp * cp != P) { /* 2d's default grid is 1 x 1: spread it as heads x context */
            p.hp = 1;
            for (int h = 1; h <= P && h <= H; h++)
                if (P % h == 0 && h * h <= P) p.hp = h;
            p.cp = P / p.hp;
        }
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
