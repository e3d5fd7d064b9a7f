/* The planner's inputs from `seqpar plan`'s flags, the kernels' rates measured here, the search,
 * and the pick as a train command line (plan_setup.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wordexp.h>

#include <mpi.h>
#include <omp.h>

#include "bench/attention_bench.h"
#include "bench/sgemm_bench.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "model/llama.h"
#include "strategies/registry.h"
#include "train/cli_common.h"
#include "train/plan_setup.h"
#include "train/trainer.h"

/* The tokens model_gemm_gflops times (min(S, 4096)), or 0 where one layer's weights exceed 64 MB. */
static int model_gemm_tokens(const LlamaConfig *c, long seq_len) {
    if (llama_layer_matmul_params(c) * sizeof(float) > 64e6) return 0;
    return (int)(seq_len < 4096 ? seq_len : 4096);
}

/* Floats of model_gemm_gflops' activation rows at N tokens: x, dx (D); q, dq (Dq); k, v (Dkv);
 * gate, up and their gradients (ldF). */
static size_t model_gemm_row_floats(const LlamaConfig *c, int N) {
    const size_t D = (size_t)c->hidden_size, ldF = (size_t)linear_row_stride(c->intermediate_size);
    const size_t Dq = (size_t)c->num_attention_heads * c->head_dim, Dkv = (size_t)c->num_key_value_heads * c->head_dim;
    return (size_t)N * (2 * D + 2 * Dq + 2 * Dkv + 4 * ldF);
}

/* The fp32 GEMM rate of the model's own linear products with one thread: one layer's forward,
 * input and weight gradients (q, k, v, o; gate, up and down, rows laid out as the model lays them
 * out) at min(S, 4096) tokens, the most an FFN chunk holds; FLOPs 6 N (the layer's weights) over
 * the best of `reps` times. The products of a small hidden size are skinnier than 2048^3: on an
 * AVX2-only Zen 3 the reference model's ran at 0.87-0.92x that sgemm's rate with one thread (and
 * 15-35% below it with two). 0 where one layer's weights exceed 64 MB (their products are large,
 * the 2048^3 rate fits them, and timing them here would take that memory twice). */
static double model_gemm_gflops(const LlamaConfig *c, long seq_len, int reps, int *tokens) {
    const int D = c->hidden_size, F = c->intermediate_size, ldF = linear_row_stride(F);
    const int Dq = c->num_attention_heads * c->head_dim, Dkv = c->num_key_value_heads * c->head_dim;
    const double wparams = llama_layer_matmul_params(c);
    const int N = model_gemm_tokens(c, seq_len);
    if (N == 0) return 0;
    *tokens = N;
    const size_t nw = (size_t)wparams, na = model_gemm_row_floats(c, N);
    float *w = xmalloc_aligned(2 * nw * sizeof(float)), *a = xmalloc_aligned(na * sizeof(float));
    for (size_t i = 0; i < 2 * nw; i++) w[i] = 0.01f * (float)((int)(i % 13) - 6);
    for (size_t i = 0; i < na; i++) a[i] = 0.1f * (float)((int)(i % 11) - 5);
    float *Wq = w, *Wk = Wq + (size_t)Dq * D, *Wv = Wk + (size_t)Dkv * D, *Wo = Wv + (size_t)Dkv * D;
    float *Wg = Wo + (size_t)D * Dq, *Wu = Wg + (size_t)F * D, *Wd = Wu + (size_t)F * D, *dW = w + nw;
    float *x = a, *dx = x + (size_t)N * D, *q = dx + (size_t)N * D, *dq = q + (size_t)N * Dq;
    float *k = dq + (size_t)N * Dq, *v = k + (size_t)N * Dkv, *g = v + (size_t)N * Dkv;
    float *u = g + (size_t)N * ldF, *dg = u + (size_t)N * ldF, *du = dg + (size_t)N * ldF;
    double best = 0;
    for (int r = 0; r <= reps; r++) { /* the first round warms up */
        /* called by measure_rates' copies: every round starts on every core at once (outside a
         * parallel region the barrier does nothing) */
#pragma omp barrier
        const double t0 = omp_get_wtime();
        linear_forward(q, x, Wq, N, D, Dq, 0);
        linear_forward(k, x, Wk, N, D, Dkv, 0);
        linear_forward(v, x, Wv, N, D, Dkv, 0);
        linear_forward(dx, q, Wo, N, Dq, D, 0);
        linear_forward_ld(g, ldF, x, D, Wg, N, D, F, 0);
        linear_forward_ld(u, ldF, x, D, Wu, N, D, F, 0);
        linear_forward_ld(dx, D, g, ldF, Wd, N, F, D, 0);
        linear_backward_ld(dg, dW, x, D, g, ldF, Wd, N, F, D);
        linear_backward_ld(dx, dW, du, ldF, x, D, Wu, N, D, F);
        linear_backward_ld(dx, dW, dg, ldF, x, D, Wg, N, D, F);
        linear_backward(dq, dW, x, q, Wo, N, Dq, D);
        linear_backward(dx, dW, v, x, Wv, N, D, Dkv);
        linear_backward(dx, dW, k, x, Wk, N, D, Dkv);
        linear_backward(dx, dW, q, x, Wq, N, D, Dq);
        const double g_s = 6.0 * N * wparams / (omp_get_wtime() - t0) * 1e-9;
        if (r && g_s > best) best = g_s;
    }
    xfree(w);
    xfree(a);
    return best;
}

/* Bytes one copy of the rate measurements holds at once: model_gemm_gflops' weights and rows (or
 * the 2048^3 GEMM's three matrices) and attention_bench's eight (4096, 2 heads, d) arrays. */
static double rate_bytes(const LlamaConfig *c, long seq_len) {
    const int N = model_gemm_tokens(c, seq_len);
    const double gemm = N ? 2 * llama_layer_matmul_params(c) + (double)model_gemm_row_floats(c, N) : 3.0 * 2048 * 2048;
    return 4.0 * (gemm + 8.0 * 4096 * 2 * c->head_dim);
}

/* The kernels' rates per thread as a step sees them: `copies` one-thread copies of each measurement
 * run at once, one per core (a step keeps every core busy, and a core runs slower while its
 * neighbours work: on an AVX2-only Zen 3 VM two busy cores ran 5-10% slower each than one alone),
 * and the copies' rates averaged. fp32 GEMM on the model's own products (2048^3 where a layer
 * passes 64 MB), which is also bf16's on the conversion path (fp32 sgemm on bf16 values, ops.h); the
 * bf16 GEMM of the AVX512_BF16 path (its library's primitives are shared) alone, 2048^3. `which`: 1
 * the GEMM, 2 attention, 3 both. Returns the copies that ran (fewer under OMP_THREAD_LIMIT). */
static int measure_rates(const MemoryModelInput *base, int copies, int which, double *gemm, int *gemm_kind,
                          int *tokens, double *attn_f, double *attn_b) {
    const int bf16 = base->precision == PRECISION_BF16, saved = omp_get_max_threads();
    const int fp32_gemm = !bf16 || bf16_products_on_sgemm();
    double *g = xcalloc((size_t)copies, sizeof *g), *f = xcalloc((size_t)copies, sizeof *f);
    double *b = xcalloc((size_t)copies, sizeof *b);
    int shapes_ok = 1, team = 1;
    (void)simd(); /* the kernel table, chosen once before the copies start */
#pragma omp parallel num_threads(copies)
    {
        const int t = omp_get_thread_num();
        if (t == 0) team = omp_get_num_threads(); /* fewer than asked under OMP_THREAD_LIMIT */
        omp_set_num_threads(1); /* each copy's own kernels and GEMMs on one thread */
        if (which & 1 && fp32_gemm) {
            int tok = 0;
            g[t] = model_gemm_gflops(&base->model, base->seq_len, 3, &tok);
            if (!(g[t] > 0)) g[t] = sgemm_peak_gflops(3); /* (the copies start it together, ~1 s each) */
            if (t == 0) *tokens = tok, shapes_ok = tok > 0;
        }
        if (which & 2)
            for (int rep = 0; rep < 3; rep++) { /* the best of three timed calls, each started on every core at once */
#pragma omp barrier
                AttnBenchResult r;
                attention_bench(4096, 2, 2, base->model.head_dim, ATTN_CAUSAL, bf16 ? PRECISION_BF16 : PRECISION_FP32, 1,
                                &r);
                if (r.fwd_gflops > f[t]) f[t] = r.fwd_gflops;
                if (r.bwd_gflops > b[t]) b[t] = r.bwd_gflops;
            }
    }
    omp_set_num_threads(1);
    if (which & 1 && !fp32_gemm) *gemm = bf16_gemm_peak_gflops(3), *gemm_kind = 1;
    omp_set_num_threads(saved);
    double sg = 0, sf = 0, sb = 0;
    for (int t = 0; t < team; t++) sg += g[t], sf += f[t], sb += b[t];
    if (which & 1 && fp32_gemm) *gemm = sg / team, *gemm_kind = shapes_ok ? 2 : 1;
    if (which & 2) *attn_f = sf / team, *attn_b = sb / team;
    xfree(g);
    xfree(f);
    xfree(b);
    return team;
}

/* Whether argv holds NAME or NAME=VALUE. */
static const char *has_flag(int argc, char **argv, const char *name) {
    size_t len = strlen(name);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name) || (!strncmp(argv[i], name, len) && argv[i][len] == '=')) return name;
    return NULL;
}

/* F or F,B */
static void parse_rates(const char *v, double *f, double *b) {
    char *end;
    *f = strtod(v, &end);
    *b = *f;
    size_t n1 = (size_t)(end - v);
    int plain = n1 > 0 && n1 < 64;
    if (plain) {
        char first[64];
        memcpy(first, v, n1);
        first[n1] = '\0';
        plain = is_decimal_number(first, 1);
    }
    if (*end == ',') {
        plain = plain && is_decimal_number(end + 1, 1);
        *b = strtod(end + 1, &end);
    }
    if (!plain || *end || !(*f > 0) || !(*b > 0))
        die_collective("seqpar plan: --attn-gflops '%s' is not F or F,B with positive GFLOPS per thread: e.g. 90 or 90,85",
                       v);
}

void plan_setup(int *argc, char **argv, const char *who, int exact, PlanSetup *ps) {
    memset(ps, 0, sizeof *ps);
    PlanCluster *cl = &ps->cl;
    Cluster *cx = &ps->cx;
    MemoryModelInput *base = &ps->base;
    PlanFixed *fx = &ps->fx;
    TrainOptions *o = &ps->o;
    SizeFlags *sf = &ps->sf;
    int mpi = 0;
    MPI_Initialized(&mpi);
    *cl = (PlanCluster){.intra_gbs = 10, .inter_gbs = 12.5, .intra_lat_s = 2e-6, .inter_lat_s = 5e-6,
                        .runtime_bytes = 64.0 * 1048576};
    const char *v;
    /* --cluster: a preset or file, its single fields overridden, standing for the flags not given */
    const char *cluster = take_flag(argc, argv, "plan", "--cluster");
    if (cluster) {
        ClusterOverrides over;
        SeqErr ce;
        if (cluster_take_overrides(argc, argv, &over, &ce) != 0 || cluster_resolve(cluster, cx, &ce) != 0 ||
            cluster_apply_overrides(cx, &over, &ce) != 0)
            die_collective("%s: %s", who, ce.msg);
        cl->ranks = cx->nodes * cx->ranks_per_node;
        cl->intra_gbs = cx->intra_gbs, cl->intra_lat_s = cx->intra_latency_us * 1e-6;
        if (cx->nodes > 1) cl->inter_gbs = cx->nic_gbs * cx->nics_per_node / cx->ranks_per_node;
        cl->inter_lat_s = cx->nic_latency_us * 1e-6;
    }
    if ((v = take_flag(argc, argv, "plan", "--ranks"))) cl->ranks = (int)parse_long("plan", "ranks", v, 1, 1 << 20);
    else if (!cluster) die_collective("%s: give --ranks P, the ranks of the job (see seqpar plan --help)", who);
    cl->ranks_per_node = cluster ? cx->ranks_per_node : cl->ranks;
    if (!cluster && (v = take_flag(argc, argv, "plan", "--ranks-per-node")))
        cl->ranks_per_node = (int)parse_long("plan", "ranks-per-node", v, 1, 1 << 20);
    if (cl->ranks_per_node > cl->ranks) cl->ranks_per_node = cl->ranks; /* fewer ranks than the cluster's node */
    cl->cores_per_node = cluster ? cx->threads_per_rank * cl->ranks_per_node : omp_get_num_procs();
    if ((v = take_flag(argc, argv, "plan", "--cores-per-node")))
        cl->cores_per_node = (int)parse_long("plan", "cores-per-node", v, 1, 1 << 20);
    double ram_node = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    int ram_given = cluster && cx->device_mem_gib > 0;
    cl->ram_bytes = ram_given ? cx->device_mem_gib * 1073741824.0 : ram_node / cl->ranks_per_node;
    if ((v = take_flag(argc, argv, "plan", "--mem-per-rank")))
        cl->ram_bytes = parse_double("plan", "mem-per-rank", v, 1e-3, 1e9) * 1073741824.0, ram_given = 1;
    if ((v = take_flag(argc, argv, "plan", "--runtime-mib")))
        cl->runtime_bytes = parse_double("plan", "runtime-mib", v, 0, 1e9) * 1048576.0;
    if (!cluster && (v = take_flag(argc, argv, "plan", "--intra-gbs")))
        cl->intra_gbs = parse_double("plan", "intra-gbs", v, 1e-6, 1e9);
    if ((v = take_flag(argc, argv, "plan", "--inter-gbs"))) cl->inter_gbs = parse_double("plan", "inter-gbs", v, 1e-6, 1e9);
    if ((v = take_flag(argc, argv, "plan", "--intra-lat-us")))
        cl->intra_lat_s = parse_double("plan", "intra-lat-us", v, 0, 1e9) * 1e-6;
    if ((v = take_flag(argc, argv, "plan", "--inter-lat-us")))
        cl->inter_lat_s = parse_double("plan", "inter-lat-us", v, 0, 1e9) * 1e-6;
    if ((v = take_flag(argc, argv, "plan", "--gemm-gflops"))) cl->gemm_gflops = parse_double("plan", "gemm-gflops", v, 1e-6, 1e9);
    if ((v = take_flag(argc, argv, "plan", "--attn-gflops"))) parse_rates(v, &cl->attn_fwd_gflops, &cl->attn_bwd_gflops);
    /* --offload-dir: train's parser refuses it without checkpointing; here it only makes the
     * configurations that offload possible (each is checked by the memory model) */
    const char *offload_dir = take_flag(argc, argv, "plan", "--offload-dir");
    if (cl->ranks % cl->ranks_per_node)
        die_collective("%s: --ranks-per-node %d does not divide --ranks %d: use a divisor of %d", who,
                       cl->ranks_per_node, cl->ranks, cl->ranks);

    /* what the user fixed: train's grid flags present on the command line */
    *fx = (PlanFixed){.placement = -1, .checkpoint = -1, .zero = -1};
    const int fix_strategy = has_flag(*argc, argv, "--strategy") != NULL, fix_ckpt = has_flag(*argc, argv, "--checkpoint") != NULL;
    const int fix_zero = has_flag(*argc, argv, "--zero") != NULL, fix_pl = has_flag(*argc, argv, "--placement") != NULL;
    parse_train_options(*argc, argv, o, sf, "plan");
    if (o->par.threads > 0) /* the best line carries the user's train flags: none may contradict the plan */
        die_collective("%s: --threads is the plan's to choose (a rank's threads = --cores-per-node / "
                       "--ranks-per-node): give --cores-per-node %d for %d thread%s a rank", who,
                       o->par.threads * cl->ranks_per_node, o->par.threads, o->par.threads == 1 ? "" : "s");
    memory_input_from_options(o, sf, "plan", base);
    base->par.offload_dir = offload_dir;
    if (fix_strategy) fx->strategy = o->par.strategy;
    fx->dp = o->par.dp;
    fx->hp = o->par.hp;
    fx->cp = o->par.cp;
    fx->knobs = o->par.knobs;
    if (fix_pl) fx->placement = o->par.placement;
    if (fix_ckpt) fx->checkpoint = o->mem.checkpoint;
    if (fix_zero) fx->zero = o->par.zero;
    /* the cluster's rates per thread where the flags give none: GEMM at the model's (S/P) x hidden x
     * hidden product in the precision (where the cluster has a curve for it), attention on causal
     * blocks of S/P rows, backward at the forward's rate over the cluster's factor (2.5x the FLOPs) */
    char cluster_gemm[160] = "", cluster_attn[160] = "";
    if (cluster) {
        const double rows = (double)base->seq_len / cl->ranks > 1 ? (double)base->seq_len / cl->ranks : 1;
        /* per thread as the planner counts a rank's threads (--cores-per-node / ranks per node) */
        const int thr_rank = cl->cores_per_node / cl->ranks_per_node > 1 ? cl->cores_per_node / cl->ranks_per_node : 1;
        const double h = base->model.hidden_size, threads = thr_rank;
        if (!(cl->gemm_gflops > 0) && cx->gemm[base->precision].n) {
            cl->gemm_gflops = cluster_gemm_flops_per_s(cx, base->precision, rows, h, h) / threads * 1e-9;
            snprintf(cluster_gemm, sizeof cluster_gemm, " (cluster %s, %s, per rank / %d threads)", cx->name,
                     precision_name(base->precision), thr_rank);
        }
        if (!(cl->attn_fwd_gflops > 0)) {
            cl->attn_fwd_gflops = cluster_attention_rate(cx, base->precision, base->model.head_dim, 1, (int)rows, (int)rows) /
                                 threads * 1e-9;
            cl->attn_bwd_gflops = cl->attn_fwd_gflops * 2.5 / cx->attn_backward_factor;
            snprintf(cluster_attn, sizeof cluster_attn, " (cluster %s, causal blocks of %.0f rows, per rank / %d threads)",
                     cx->name, rows, thr_rank);
            cl->sim = cx; /* and each configuration's attention schedule played on the cluster */
        }
    }

    /* the kernels' rates per thread, measured here unless given: one copy per core of this machine
     * (of this rank's share of them under mpirun), as many as 2 GiB (and a quarter of the RAM) hold */
    const int bf16 = base->precision == PRECISION_BF16;
    const int bf16_gemm = bf16 && !bf16_products_on_sgemm(); /* else fp32 sgemm on bf16 values */
    int measured_gemm = 0, measured_attn = 0, gemm_tokens = 0; /* measured_gemm 2: on the model's shapes */
    int copies = 0;
    if (!(cl->gemm_gflops > 0) || !(cl->attn_fwd_gflops > 0)) {
        int world = 1;
        if (mpi) MPI_Comm_size(MPI_COMM_WORLD, &world);
        copies = omp_get_num_procs() / world;
        const double budget = ram_node / 4 < 2.0 * 1073741824.0 ? ram_node / 4 : 2.0 * 1073741824.0;
        const double fit = floor(budget / rate_bytes(&base->model, base->seq_len));
        if (fit < copies) copies = (int)fit;
        if (copies < 1) copies = 1;
        const int which = (cl->gemm_gflops > 0 ? 0 : 1) | (cl->attn_fwd_gflops > 0 ? 0 : 2);
        copies = measure_rates(base, copies, which, &cl->gemm_gflops, &measured_gemm, &gemm_tokens, &cl->attn_fwd_gflops,
                      &cl->attn_bwd_gflops);
        measured_attn = which & 2 ? 1 : 0;
    }
    snprintf(ps->load, sizeof ps->load, copies > 1 ? "one thread per core on %d cores at once" : "one thread", copies);

    ps->refusal = NULL;
    char *err = plan_search(base, fx, cl, exact, &ps->list, &ps->n, &ps->invalid, &ps->refusal);
    if (err) die_collective("%s: %s", who, err);
    ps->fit = 0;
    for (int i = 0; i < ps->n; i++) ps->fit += ps->list[i].fits;
    ps->ram_given = ram_given;
    ps->measured_gemm = measured_gemm, ps->measured_attn = measured_attn, ps->gemm_tokens = gemm_tokens;
    ps->bf16_gemm = bf16_gemm;
    snprintf(ps->cluster_gemm, sizeof ps->cluster_gemm, "%s", cluster_gemm);
    snprintf(ps->cluster_attn, sizeof ps->cluster_attn, "%s", cluster_attn);
}

void plan_setup_free(PlanSetup *ps) {
    xfree(ps->list);
    xfree(ps->refusal);
    ps->list = NULL, ps->refusal = NULL;
}

int plan_user_flags(int argc, char **argv, int keep_offload, char *buf, size_t n) {
    static const char *const chosen[] = {"strategy", "dp",         "hp",         "cp",         "placement",
                                         "layout",   "zero",       "checkpoint", "ffn-chunks", "offload-dir"};
    const char *grid[ARRAY_LEN(chosen) + KNOB_SLOTS + 1]; /* and the strategies' knobs */
    size_t ng = 0;
    for (size_t j = 0; j < ARRAY_LEN(chosen); j++)
        if (!keep_offload || strcmp(chosen[j], "offload-dir") != 0) grid[ng++] = chosen[j];
    for (int j = 0; j < strategy_knob_count(); j++) grid[ng++] = strategy_knob(j)->name;
    grid[ng] = NULL;
    return train_flags_except(argc, argv, grid, buf, n);
}

int plan_setup_command(const PlanSetup *ps, const PlanEntry *e, int argc, char **argv, const char *program, char *launch,
                       size_t ln, char *flags, size_t fn) {
    char pick[512];
    plan_flags(e, pick, sizeof pick);
    char given[4096], prog[4096]; /* the user's train flags, with the plan's choices in place of its grid flags */
    if (plan_user_flags(argc, argv, 0, given, sizeof given) != 0) {
        snprintf(launch, ln, "the train flags given are over %zu characters: shorten the paths", sizeof given);
        return -1;
    }
    /* the program as it was run (a checkout's build/seqpar), so that the line runs as printed */
    if (program_word(program, prog, sizeof prog) != 0) {
        snprintf(launch, ln, "the program's path is over %zu characters: run it by a shorter one", sizeof prog);
        return -1;
    }
    /* each rank the cores the plan gave it: Open MPI binds a rank to one core where it starts at most
     * 2, so a bare `mpirun -n 1` trains on 1 thread where the plan counted 2 */
    const int thr = ps->cl.cores_per_node / ps->cl.ranks_per_node > 1 ? ps->cl.cores_per_node / ps->cl.ranks_per_node : 1;
    char pe[48] = "";
    if (thr > 1) snprintf(pe, sizeof pe, " --map-by slot:PE=%d", thr);
    const int k = snprintf(flags, fn, "%s%s%s", given, *given ? " " : "", pick);
    if (k < 0 || (size_t)k >= fn) {
        snprintf(launch, ln, "the train flags given are over %zu characters: shorten the paths", fn);
        return -1;
    }
    snprintf(launch, ln, "mpirun -n %d%s %s train", ps->cl.ranks, pe, prog);
    return 0;
}

char *plan_setup_refusal(const PlanSetup *ps) {
    MemoryModelInput in = ps->base;
    in.world = ps->cl.ranks;
    PlanEntry e;
    char *why = plan_evaluate(&in, &ps->cl, &e);
    /* and what stopped the grids plan filled in around them, where that is another reason (--dp 2 on
     * 4 ranks: train's reason is the grid, the grids with --cp 2 or --hp 2 fail on the batch) */
    const int other = ps->refusal && (!why || strcmp(why, ps->refusal) != 0);
    char *text = xstrdup_printf("%s%s%s",
                                why ? why : "no configuration of seqpar train matches them all (see 'seqpar "
                                            "strategies' for what each strategy takes)",
                                other ? "; the grids plan tried with them: " : "", other ? ps->refusal : "");
    xfree(why);
    return text;
}

char *plan_bcast_text(const char *text) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int len = rank == 0 ? (int)strlen(text) : 0;
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char *s = xmalloc((size_t)len + 1);
    if (rank == 0) memcpy(s, text, (size_t)len);
    MPI_Bcast(s, len, MPI_CHAR, 0, MPI_COMM_WORLD);
    s[len] = '\0';
    return s;
}

char **plan_flags_argv(const char *argv0, const char *flags, int *argc) {
    wordexp_t we; /* the shell's words, quoted as train_flags_except quotes them; no command substitution */
    if (wordexp(flags, &we, WRDE_NOCMD) != 0) return NULL;
    char **out = xmalloc(sizeof(char *) * (we.we_wordc + 2));
    out[0] = xstrdup(argv0);
    for (size_t i = 0; i < we.we_wordc; i++) out[i + 1] = xstrdup(we.we_wordv[i]);
    out[we.we_wordc + 1] = NULL;
    *argc = (int)we.we_wordc + 1;
    wordfree(&we);
    return out;
}

void plan_argv_free(char **argv) {
    for (int i = 0; argv && argv[i]; i++) xfree(argv[i]);
    xfree(argv);
}

/* The step time train_measure saw: the mean of the steps after the first (which also touches the
 * buffers for the first time), or the one step. */
static double measured_step(const TrainMeasure *m) {
    const long n = m->steps < TRAIN_MEASURE_STEPS ? m->steps : TRAIN_MEASURE_STEPS;
    if (n <= 1) return n == 1 ? m->step_s[0] : 0;
    double sum = 0;
    for (long i = 1; i < n; i++) sum += m->step_s[i];
    return sum / (double)(n - 1);
}

/* --profile K: a topology scheduler's profiling (docs/planner.md: the configuration of the highest
 * profiled throughput): K training steps of each of the first `top_n` fitting configurations, run by the
 * training library on the ranks mpirun started with the run's model and data, timed; rank 0 prints
 * each measured against its prediction and the fastest's train command. Collective. */
int plan_setup_profile(const PlanSetup *ps, long K, int top_n, int argc, char **argv, const char *program,
                       const char *label) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* rank 0's candidates (its list: the ranks' measured rates may differ), one train flag line each */
    char *text = NULL;
    size_t len = 0;
    int rows[64], n_cand = 0;
    if (rank == 0) {
        text = xmalloc((size_t)top_n * 4701 + 1);
        text[0] = '\0';
        for (int i = 0; i < ps->n && n_cand < top_n && n_cand < (int)ARRAY_LEN(rows); i++) {
            if (!ps->list[i].fits) continue;
            char launch[4200], flags[4700];
            if (plan_setup_command(ps, &ps->list[i], argc, argv, program, launch, sizeof launch, flags, sizeof flags) != 0)
                die("%s", launch);
            const size_t k = strlen(flags);
            memcpy(text + len, flags, k);
            len += k;
            text[len++] = '\n';
            text[len] = '\0';
            rows[n_cand++] = i;
        }
    }
    char *all = plan_bcast_text(text ? text : "");
    xfree(text);
    if (rank == 0) {
        printf("profile: %ld step%s of each of the %d best configurations on the %d ranks here, the fastest kept "
               "(docs/planner.md, profiling); measured: %s\n", K, K == 1 ? "" : "s", n_cand,
               ps->cl.ranks, K > 1 ? "the mean step after the first" : "the one step");
        printf("  #  %11s %11s %9s  %s\n", "predicted s", "measured s", "meas/pred", "configuration");
        fflush(stdout);
    }
    double best_s = 0;
    int best = -1, c = 0;
    for (char *line = all, *end; *line; line = end + 1, c++) {
        end = strchr(line, '\n');
        *end = '\0';
        int cargc;
        char **cargv = plan_flags_argv("plan", line, &cargc);
        if (!cargv) die_collective("a candidate's flags do not split into words: %s", line);
        TrainOptions o;
        SizeFlags sf;
        parse_train_options(cargc, cargv, &o, &sf, "plan");
        TrainMeasure m;
        train_measure(&o, &sf, K, &m);
        plan_argv_free(cargv);
        const double t = measured_step(&m);
        if (best < 0 || t < best_s) best = c, best_s = t;
        if (rank == 0) {
            const PlanEntry *e = &ps->list[rows[c]];
            char pick[512];
            plan_flags(e, pick, sizeof pick);
            printf("%3d  %11.4f %11.4f %9.2f  %s\n", rows[c] + 1, e->t_step, t, t / e->t_step, pick);
            fflush(stdout);
        }
    }
    if (rank == 0 && best >= 0 && label) {
        char launch[4200], flags[4700];
        if (plan_setup_command(ps, &ps->list[rows[best]], argc, argv, program, launch, sizeof launch, flags,
                               sizeof flags) != 0)
            die("%s", launch);
        printf("%s: %s %s\n", label, launch, flags);
    }
    xfree(all);
    const int row = rank == 0 && best >= 0 ? rows[best] : 0; /* rank 0's row, which the others take */
    int out = row;
    MPI_Bcast(&out, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return out;
}

