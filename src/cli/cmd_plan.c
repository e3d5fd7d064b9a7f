/* seqpar plan: the planner (strategies/planner.h) for a model, a sequence length and a cluster:
 * every strategy, grid, placement, checkpoint mode and ZeRO stage the ranks allow, the memory of
 * each against the RAM per rank, a predicted step time, the best first and the `seqpar train`
 * flags that run it. The kernels' rates are measured on this machine unless given. */
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/common.h"
#include "model/llama.h"
#include "plan/cluster.h"
#include "plan/planner.h"
#include "strategies/registry.h"
#include "train/auto_strategy.h"
#include "train/cli_common.h"
#include "train/plan_setup.h"
#include "train/train_options.h"
#include "train/trainer.h"

/* A rank's RAM as the user would write it: GiB with 2 decimals from 1 GiB, MiB with 1 below (0.002 GiB
 * printed as "0.00 GiB" next to "the smallest needs 66.0 MiB"). */
static void ram_text(double bytes, char *buf, size_t n) {
    if (bytes >= 1073741824.0) snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
}

static const char HELP[] =
    "usage: seqpar plan --ranks P [cluster flags] [train's model, --seq-len, --batch, --precision flags]\n"
    "       seqpar plan --cluster NAME|FILE [cluster overrides] [--ranks P] [train's flags as above]\n"
    "       seqpar plan --clusters\n"
    "\n"
    "Ranks every configuration of 'seqpar train' the P ranks allow (strategy, dp x hp x cp, ring\n"
    "inner size, team, chunks, placement, --checkpoint, --zero) by a predicted step\n"
    "time, keeping those whose memory (the model of 'seqpar memory') fits a rank, and prints the\n"
    "train flags of the best. Train's grid flags given here (--strategy, --dp, --hp, --cp,\n"
    "--ring-inner, --team, --chunks, --placement, --checkpoint, --zero) fix that choice.\n"
    "\n"
    "  --clusters            list the cluster presets (name, nodes x ranks, what it is) and end\n"
    "  --cluster NAME|FILE   a preset or a JSON cluster file (docs/planner.md): its ranks per node, threads\n"
    "                        (cores = threads x ranks per node), device memory as RAM per rank, links\n"
    "                        (across nodes: each rank's share of its node's NICs) and its rates (per thread;\n"
    "                        GEMM at the model's S/P x hidden x hidden product, attention on causal blocks\n"
    "                        of S/P rows) stand for the flags below not given; the cluster overrides\n"
    "                        replace its single fields (--ranks-per-node and --intra-gbs among them)\n"
    CLUSTER_OVERRIDE_HELP
    "  --ranks P             ranks of the job (required; with --cluster: its nodes x ranks per node)\n"
    "  --ranks-per-node R    consecutive ranks per node (default: all on one node)\n"
    "  --cores-per-node C    threads per rank = C / R (default: this machine's cores)\n"
    "  --mem-per-rank GIB    RAM a rank may use (default: this machine's RAM / R)\n"
    "  --runtime-mib M       per rank beyond the tracked memory: C runtime, MPI, stacks (default 64)\n"
    "  --intra-gbs X         GB/s a rank sends at to a peer on its node (default 10)\n"
    "  --inter-gbs Y         GB/s to a peer on another node (default 12.5: 100 Gb/s)\n"
    "  --intra-lat-us A      per message on the node (default 2)\n"
    "  --inter-lat-us B      per message across nodes (default 5)\n"
    "  --gemm-gflops G       GEMM rate per thread in the precision (default: measured here, one\n"
    "                        thread per core on every core at once: fp32 on one layer's own products;\n"
    "                        the AVX512_BF16 path's bf16 GEMM (one thread alone), or a layer over 64 MB,\n"
    "                        the 2048^3 GEMM; bf16 on the conversion path runs fp32's sgemm)\n"
    "  --attn-gflops F[,B]   attention forward[,backward] rate per thread (default: measured here,\n"
    "                        one thread per core on every core at once)\n"
    "  --top K               configurations listed (default 10)\n"
    "  --profile K           under mpirun -np P (P = --ranks): also run K training steps of each of the\n"
    "                        --profile-top best fitting configurations on these ranks with the model and data\n"
    "                        given, and print each measured step (the mean after the first) against its\n"
    "                        prediction and the fastest's train command (docs/planner.md)\n"
    "  --profile-top N       configurations --profile times (default 3, at most 64)\n"
    "  --traffic             the best's bytes per rank and kind in one step, as 'seqpar train\n"
    "                        --stats' prints them ('bytes rank r: ...', exact; 'rank r: ...', MB\n"
    "                        with the split to peers on the node and on other nodes); --stats\n"
    "                        counts the whole run: one step on token data (no evaluation) equals it\n"
    "  --explain             why the best comes first: its step's parts (compute, exposed communication\n"
    "                        by kind and link, memory) and the next's, and the term that decided\n"
    "  --help                this text\n";

/* seqpar plan --clusters: each preset's name, nodes x ranks and line (rank 0 prints). */
static int list_clusters(int rank) {
    if (rank != 0) return 0;
    printf("cluster presets (--cluster NAME; each value and its source: clusters/NAME.json in the repository):\n");
    for (int i = 0; i < cluster_preset_count(); i++) {
        const char *name = cluster_preset_name(i);
        Cluster c;
        SeqErr e;
        char path[4096], line[4200];
        const int ok = cluster_resolve(name, &c, &e) == 0;
        if (cluster_preset_text(name)) {
            if (!ok) die("seqpar plan: %s", e.msg); /* a preset that does not load: a build problem */
            snprintf(line, sizeof line, "%s", c.description);
        } else if (ok) {
            snprintf(line, sizeof line, "this machine as 'seqpar calibrate --save' measured it (%s)",
                     cluster_this_machine_path(path, sizeof path));
        } else {
            snprintf(line, sizeof line, "this machine: not measured yet (run 'mpirun -np P seqpar calibrate --save')");
        }
        char shape[32] = "-";
        if (ok) snprintf(shape, sizeof shape, "%d x %d", c.nodes, c.ranks_per_node);
        printf("  %-24s %9s  %s\n", name, shape, line);
    }
    return 0;
}

int cmd_plan(int argc, char **argv, const char *program) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        }
    int rank = 0, mpi = 0;
    MPI_Initialized(&mpi);
    if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--clusters")) return list_clusters(rank);
    int top = 10, traffic = 0, explain = 0, profile_top = 3;
    long profile_steps = 0;
    const char *v;
    if ((v = take_flag(&argc, argv, "plan", "--top"))) top = (int)parse_long("plan", "top", v, 1, 1 << 20);
    if ((v = take_flag(&argc, argv, "plan", "--profile"))) profile_steps = parse_long("plan", "profile", v, 1, 1000000);
    if ((v = take_flag(&argc, argv, "plan", "--profile-top")))
        profile_top = (int)parse_long("plan", "profile-top", v, 1, 64);
    if (v && !profile_steps)
        die_collective("seqpar plan: --profile-top %d names how many configurations --profile K times: give --profile "
                       "K too (K steps each)", profile_top);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--traffic") || !strcmp(argv[i], "--explain")) {
            *(argv[i][2] == 't' ? &traffic : &explain) = 1;
            for (int j = i; j + 1 < argc; j++) argv[j] = argv[j + 1];
            argc--;
            i--;
        }
    for (int i = 1; i < argc; i++) { /* --strategy auto: the planner's own choice, as no --strategy */
        const int k = strategy_auto_words(argc, argv, i);
        if (!k) continue;
        for (int j = i; j + k < argc; j++) argv[j] = argv[j + k];
        argc -= k;
        i--;
    }
    /* the rows it prints, the next for --explain, those --profile times: the rest of the ranking may
     * stay bounds (planner.h); SEQPAR_PLAN_PLAY_ALL=1 plays every configuration (the same output) */
    const char *all = getenv("SEQPAR_PLAN_PLAY_ALL");
    int exact = top > 2 ? top : 2;
    if (profile_steps && profile_top > exact) exact = profile_top;
    if (all && *all && strcmp(all, "0") != 0) exact = 0;
    /* the search emits and frees schedules of up to hundreds of MB, one after another: kept in the
     * heap (not mapped and unmapped each time, every page faulted in again), the same figures in
     * a fraction of the system time */
    (void)mallopt(M_MMAP_THRESHOLD, 1 << 30);
    (void)mallopt(M_TRIM_THRESHOLD, 1 << 30);
    PlanSetup *ps = xmalloc(sizeof *ps);
    plan_setup(&argc, argv, "seqpar plan", exact, ps);
    const PlanCluster cl = ps->cl;
    const MemoryModelInput base = ps->base;
    const TrainOptions o = ps->o;
    PlanEntry *list = ps->list;
    const int n = ps->n, invalid = ps->invalid, fit = ps->fit, ram_given = ps->ram_given;
    char *err;
    int world = 1, mpi_on = 0;
    MPI_Initialized(&mpi_on);
    if (mpi_on) MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (profile_steps && world != cl.ranks)
        die_collective("seqpar plan: --profile times the configurations on the ranks mpirun started (%d), not on "
                       "--ranks %d: start it as mpirun -np %d seqpar plan ... --profile %ld", world, cl.ranks, cl.ranks,
                       profile_steps);
    /* every rank agrees on profiling: whether anything runs and fits does not depend on the rates */
    const int profiling = profile_steps > 0 && n > 0 && fit > 0;
    if (rank != 0) { /* rank 0 prints; every rank ends with its status (nothing runs or fits: 1, as rank 0) */
        if (profiling) (void)plan_setup_profile(ps, profile_steps, profile_top, argc, argv, program, "best measured");
        plan_setup_free(ps);
        xfree(ps);
        return n == 0 || fit == 0 ? 1 : 0;
    }
    const LlamaConfig *c = &base.model;
    const int nodes = cl.ranks / cl.ranks_per_node, thr = cl.cores_per_node / cl.ranks_per_node > 1 ? cl.cores_per_node / cl.ranks_per_node : 1;
    char family[160];
    llama_describe_family(c, family, sizeof family);
    printf("plan: %s, %d layers, hidden %d, heads %d (kv %d), head_dim %d, ffn %d, vocab %d; S = %d, batch %d, %s\n",
           family, c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
           c->intermediate_size, c->vocab_size, o.seq_len, o.batch, precision_name(base.precision));
    char ram[32];
    ram_text(cl.ram_bytes, ram, sizeof ram);
    printf("cluster: %d rank%s on %d node%s of %d, %d thread%s/rank, %s RAM per rank%s (+ %.0f MiB runtime "
           "allowance counted), links %.3g GB/s on a node, %.3g GB/s across (latency %.3g / %.3g us)\n",
           cl.ranks, cl.ranks == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", cl.ranks_per_node, thr, thr == 1 ? "" : "s",
           ram, ram_given ? "" : " (this machine's RAM / ranks per node)",
           cl.runtime_bytes / 1048576.0, cl.intra_gbs, cl.inter_gbs, cl.intra_lat_s * 1e6, cl.inter_lat_s * 1e6);
    char gemm_src[192] = "", attn_src[192] = "";
    if (ps->measured_gemm == 2)
        snprintf(gemm_src, sizeof gemm_src, " (this machine's sgemm on one layer's products at %d tokens, %s)",
                 ps->gemm_tokens, ps->load);
    else if (ps->measured_gemm)
        snprintf(gemm_src, sizeof gemm_src, " (this machine's %s, 2048^3, %s)", ps->bf16_gemm ? "bf16 GEMM" : "sgemm",
                 ps->bf16_gemm ? "one thread" : ps->load);
    if (ps->measured_attn) snprintf(attn_src, sizeof attn_src, " (this machine's kernel, S = 4096, %s)", ps->load);
    if (*ps->cluster_gemm) snprintf(gemm_src, sizeof gemm_src, "%s", ps->cluster_gemm);
    if (*ps->cluster_attn) snprintf(attn_src, sizeof attn_src, "%s", ps->cluster_attn);
    printf("rates per thread: GEMM %.1f GFLOPS%s, attention %.1f / %.1f GFLOPS forward / backward%s\n", cl.gemm_gflops,
           gemm_src, cl.attn_fwd_gflops, cl.attn_bwd_gflops, attn_src);
    if (cl.sim)
        printf("attention: each configuration's schedule played on %s by the step simulator (its NICs, links and "
               "block rates; docs/planner.md)\n", cl.sim->name);
    printf("%d configurations run on %d ranks (%d refused by the strategies' checks); %d fit in %s\n", n,
           cl.ranks, invalid, fit, ram);
    if (n == 0) { /* the flags given, as train would take them: its reason, where it has one */
        char *why = plan_setup_refusal(ps);
        fprintf(stderr, "seqpar: error: seqpar plan: nothing runs on %d rank%s with the flags given: %s\n", cl.ranks,
                cl.ranks == 1 ? "" : "s", why);
        xfree(why);
        plan_setup_free(ps);
        xfree(ps);
        return 1;
    }
    /* a column per strategy knob (registry.h: its heading, at least 3 wide) */
    const int n_knobs = strategy_knob_count();
    printf("  #  %-10s %3s %3s %3s", "strategy", "dp", "hp", "cp");
    for (int j = 0; j < n_knobs; j++) printf(" %3s", strategy_knob(j)->column);
    printf(" %-13s %-10s %-9s %3s %4s %9s %10s %8s %8s %10s %10s\n", "placement", "layout", "ckpt", "ffn", "zero",
           "step s", "tokens/s", "compute", "exposed", "inter MB", "RAM MiB");
    for (int i = 0; i < n && i < top; i++) {
        const PlanEntry *e = &list[i];
        const Strategy *es = strategy_find(e->par.strategy);
        /* each knob's value where the strategy reads it, else "-" (train refuses it there) */
        char knobs[256] = "";
        for (int j = 0, len = 0; j < n_knobs && len < (int)sizeof knobs; j++) {
            char v[16] = "-";
            const int shown = strategy_knob_shown(es, &e->par, j);
            if (shown >= 0) snprintf(v, sizeof v, "%d", shown);
            len += snprintf(knobs + len, sizeof knobs - (size_t)len, " %*s", (int)strlen(strategy_knob(j)->column) > 3
                            ? (int)strlen(strategy_knob(j)->column) : 3, v);
        }
        /* the token layout (a strategy with its own attention has its own: -) */
        const char *lay = es->own ? "-" : layout_name(e->par.layout_given ? e->par.layout : es->default_layout);
        printf("%3d  %-10s %3d %3d %3d%s %-13s %-10s %-9s %3d %4d %9.3f %10.0f %8.3f %8.3f %10.2f %10.1f%s\n",
               i + 1, e->par.strategy, e->par.dp, e->par.hp, e->par.cp, knobs, placement_name(e->par.placement), lay,
               llama_checkpoint_name(e->checkpoint), e->mem.ffn_chunks, e->par.zero, e->t_step, e->tokens_per_s, e->t_compute,
               e->t_exposed, e->inter_bytes / 1e6, e->ram / 1048576.0, e->fits ? "" : "  does not fit");
    }
    const PlanEntry *best = &list[0];
    if (best->fits) { /* the user's train flags, with the plan's choices in place of its grid flags */
        char launch[4200], flags[4700];
        if (plan_setup_command(ps, best, argc, argv, program, launch, sizeof launch, flags, sizeof flags) != 0)
            die("seqpar plan: %s", launch);
        printf("best: %s %s\n", launch, flags);
    }
    if (explain) { /* which term put the best first, against the next */
        char why[2048];
        plan_explain(&list[0], n > 1 ? &list[1] : NULL, why, sizeof why);
        fputs(why, stdout);
    }
    if (traffic) {
        MemoryModelInput in = base;
        in.world = cl.ranks;
        in.cores = cl.cores_per_node * nodes;
        in.par = best->par;
        in.checkpoint = best->checkpoint;
        for (int w = 0; w < cl.ranks; w++) {
            PlanTraffic t;
            err = plan_rank_traffic(&in, cl.ranks_per_node, w, &t);
            if (err) die("seqpar plan: %s", err);
            printf("bytes rank %d:", w);
            for (int k = 0; k < COMM_KINDS; k++) printf(" %s %.0f", comm_kind_name((CommKind)k), t.bytes[k]);
            printf("\nrank %d:", w);
            for (int k = 0; k < COMM_KINDS; k++)
                if (t.bytes[k] > 0)
                    printf(" %s %.3f MB (intra %.3f, inter %.3f);", comm_kind_name((CommKind)k), t.bytes[k] / 1e6,
                           t.intra[k] / 1e6, t.inter[k] / 1e6);
            printf("\n");
        }
    }
    if (!best->fits) { /* the table stays on stdout; the error is stderr's one line, last, naming what to change */
        const double gib = ceil(best->ram / 1073741824.0 * 1000) / 1000; /* --mem-per-rank's unit, rounded up */
        fprintf(stderr, "seqpar: error: seqpar plan: no configuration fits in %s per rank: the smallest (row 1) needs "
                "%.1f MiB: give --mem-per-rank %.3f or more (ranks with that RAM), more --ranks, %sor a shorter "
                "--seq-len\n", ram, best->ram / 1048576.0, gib, base.par.offload_dir ? "" : "--offload-dir DIR, ");
    }
    if (profiling) (void)plan_setup_profile(ps, profile_steps, profile_top, argc, argv, program, "best measured");
    const int status = best->fits ? 0 : 1;
    plan_setup_free(ps);
    xfree(ps);
    return status;
}
