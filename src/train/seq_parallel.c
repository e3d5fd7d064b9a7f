/* The parallel runtime: see seq_parallel.h. */
#include "train/seq_parallel.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "parallel/dist_attention.h"

int threads_for_cpus(const cpu_set_t *mine, const cpu_set_t *node, int n) {
    int sharing = 0;
    for (int i = 0; i < n; i++) {
        cpu_set_t both;
        CPU_AND(&both, mine, &node[i]);
        sharing += CPU_COUNT(&both) > 0;
    }
    const int t = CPU_COUNT(mine) / (sharing > 0 ? sharing : 1);
    return t > 0 ? t : 1;
}

int cpus_left_idle(const cpu_set_t *node, int n, const cpu_set_t *avail) {
    cpu_set_t used, left;
    CPU_ZERO(&used);
    for (int i = 0; i < n; i++) CPU_OR(&used, &used, &node[i]);
    CPU_XOR(&left, avail, &used);
    CPU_AND(&left, &left, avail); /* avail and not used */
    return CPU_COUNT(&left);
}

/* The default threads per rank (threads_for_cpus over this node's ranks): collective over
 * MPI_COMM_WORLD. Where the CPU sets cannot be read (more CPUs than a cpu_set_t holds) or the user
 * set OpenMP's own placement (which may have bound this thread to one place already): the CPUs
 * OpenMP sees divided by the ranks on this node. *idle: the CPUs this node's launchers may use
 * that no rank of it may (cpus_left_idle), 0 where that cannot be told. */
static int default_threads(int *idle) {
    MPI_Comm shared;
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
    MPI_Comm_size(shared, &n);
    cpu_set_t mine;
    CPU_ZERO(&mine);
    int ok = sched_getaffinity(0, sizeof mine, &mine) == 0 && !getenv("OMP_PROC_BIND") && !getenv("OMP_PLACES") &&
             !getenv("GOMP_CPU_AFFINITY");
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, shared);
    int t;
    if (all_ok) {
        cpu_set_t *node = xmalloc(sizeof(cpu_set_t) * (size_t)n);
        MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, node, (int)sizeof mine, MPI_BYTE, shared);
        t = threads_for_cpus(&mine, node, n);
        /* the CPUs the launchers of this node's ranks may use (unreadable, or no launcher: no note; a
         * process started by hand was bound by its user, taskset say) */
        cpu_set_t parent, avail;
        CPU_ZERO(&parent);
        int launch_rank;
        const int launched = comm_launched_world(&launch_rank) > 0;
        int have = launched && sched_getaffinity(getppid(), sizeof parent, &parent) == 0, all_have = 0;
        MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, shared);
        MPI_Allreduce(&parent, &avail, (int)sizeof parent, MPI_BYTE, MPI_BOR, shared);
        *idle = all_have ? cpus_left_idle(node, n, &avail) : 0;
        xfree(node);
    } else {
        t = omp_get_num_procs() / n;
    }
    MPI_Comm_free(&shared);
    return t > 0 ? t : 1;
}
int seq_parallel_default_threads(void) {
    int idle;
    return default_threads(&idle);
}
int seq_parallel_ranks_on_node(void) {
    MPI_Comm shared;
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
    MPI_Comm_size(shared, &n);
    MPI_Comm_free(&shared);
    return n;
}


/* The smallest length from min_len on that s's check accepts on the grid (params: its parameters,
 * remade for each length tried); min_len itself where none up to 2 min_len + 4096 does (the run's
 * check then names what is wrong). */
static int fit_length(const Strategy *s, const ParallelConfig *cfg, int dp, int hp, int cp, int min_len,
                      const LlamaConfig *model, StrategyParams *params) {
    const long S = strategy_fit_length(s, cfg, dp, hp, cp, min_len, model->num_attention_heads,
                                       model->num_key_value_heads, model->head_dim, cfg->wire_bf16, params);
    return S < 0 ? min_len : (int)S;
}

static void check(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int seq_len, int fit);

void seq_parallel_check(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int seq_len) {
    check(p, cfg, model, seq_len, 0);
}

void seq_parallel_check_fit(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int min_len) {
    check(p, cfg, model, min_len, 1);
}

static void check(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int seq_len, int fit) {
    memset(p, 0, sizeof *p);
    p->cfg = *cfg;
    int world = 1, world_rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    /* the communicators are made by blocking calls every rank must reach: under the setup's
     * guard, with the first step's allowance */
    if (world > 1)
        comm_guard_begin(world_rank, "making the communicators (MPI_Comm_split, MPI_Allreduce)",
                         cfg->comm_timeout * COMM_SLOW_PHASE_FACTOR);
    p->strategy = strategy_named(cfg->strategy);
    if (!p->strategy) {
        char *m = strategy_unknown_message(cfg->strategy);
        die_collective("%s", m);
    }
    if (!cfg->layout_given) p->cfg.layout = p->strategy->default_layout;
    char *unread = parallel_flags_check(p->strategy, cfg);
    if (unread) die_collective("%s", unread);
    /* head-first is the default, which a strategy with teams reads as its teams on consecutive ranks */
    if (p->strategy->reads & KNOB_TEAM_PLACEMENT && cfg->placement == PLACEMENT_HEAD_FIRST)
        p->cfg.placement = PLACEMENT_TEAM_FIRST;
    cfg = &p->cfg;
    int hp, cp;
    int sp_ranks = cfg->dp > 0 ? (world % cfg->dp == 0 ? world / cfg->dp : 0) : world;
    char *err = strategy_grid(p->strategy, cfg->hp, cfg->cp, sp_ranks, model->num_attention_heads, &hp, &cp);
    if (err) die_collective("%s", err);
    int dp = cfg->dp > 0 ? cfg->dp : (world % (hp * cp) == 0 ? world / (hp * cp) : 1);
    /* the strategy's parameters: its inner ring shapes the topology */
    if (fit) seq_len = fit_length(p->strategy, cfg, dp, hp, cp, seq_len, model, &p->params);
    strategy_params_init(p->strategy, cfg, dp, hp, cp, seq_len, model->num_attention_heads, model->num_key_value_heads,
                         model->head_dim, cfg->wire_bf16, &p->params);
    topology_create(&p->topo, dp, hp, cp, p->params.ring_inner, cfg->placement, cfg->ranks_per_node);

    /* threads: each rank stands for one device */
    int idle = 0;
    const int auto_threads = default_threads(&idle); /* collective: every rank, whatever --threads says */
    p->threads = cfg->threads > 0 ? cfg->threads : auto_threads;
    p->idle_cpus = cfg->threads > 0 ? 0 : idle;
    omp_set_num_threads(p->threads);
    openblas_set_num_threads(p->threads);

    p->seq_len = seq_len;
    int sp = p->topo.sp;
    /* --offload-dir where the strategy keeps no chunks there moves checkpointed layer inputs only: the
     * model's business (llama.h); the CLI refuses it without --checkpoint layer|selective
     * (offload_flags_check) */
    if (p->strategy->own && cfg->layout_given)
        die_collective("--strategy %s has its own token layout: drop --layout %s", p->strategy->name,
                       layout_name(cfg->layout));
    /* a strategy with its own attention runs even on one rank (its chunked pipeline, say) */
    const int own = p->strategy->own != NULL;
    if (sp > 1 || own) {
        err = strategy_check(p->strategy, &p->params);
        if (err) die_collective("%s", err);
    } else if (knobs_given(&cfg->knobs)) { /* --team 3 on one rank: accepted and read by nothing otherwise */
        err = strategy_sp1_check(p->strategy, &p->params);
        if (err) die_collective("%s", err);
    }
    /* a directory one node lacks: every rank's one line, not a stall (chunk_tier.h) */
    const char *const dirs[2][2] = {{"--offload-dir", cfg->offload_dir}, {OPT_OFFLOAD_FLAG, cfg->offload_optimizer}};
    for (int k = 0; k < 2; k++) {
        if (!dirs[k][1]) continue;
        SeqErr e;
        char msg[sizeof e.msg - 16];
        const int bad = chunk_tier_disk_probe(dirs[k][0], dirs[k][1], world_rank, msg, sizeof msg) != 0;
        if (bad && world > 1) seq_err(&e, "rank %d: %s", world_rank, msg);
        else if (bad) seq_err(&e, "%s", msg);
        die_if_any_rank(bad ? &e : NULL);
    }
    p->n_local = seq_len / sp;
    err = zero_flags_error(cfg->zero, cfg->zero_group, world); /* grad_sync_init's refusals, made now */
    if (err) die_collective("%s", err);
    err = optimizer_offload_flags_error(cfg->offload_optimizer, cfg->offload_master, cfg->zero, world);
    if (err) die_collective("%s", err);
    comm_guard_end();
}

void seq_parallel_finish(SeqParallel *p, const LlamaConfig *model, size_t n_params) {
    const ParallelConfig *cfg = &p->cfg;
    const int world = p->topo.world_size, sp = p->topo.sp, own = p->strategy->own != NULL, seq_len = p->seq_len;
    if (world > 1) /* blocking calls every rank must reach, as in seq_parallel_check */
        comm_guard_begin(p->topo.world_rank, "making the communicators (MPI_Comm_split, MPI_Allreduce)",
                         cfg->comm_timeout * COMM_SLOW_PHASE_FACTOR);
    p->positions = xmalloc(sizeof(int) * (size_t)p->n_local);
    if (sp > 1 || own) {
        strategy_positions(p->strategy, &p->params, p->topo.hp_rank, p->topo.cp_rank, p->positions);
    } else { /* the sequence is not split: every layout is the identity, any length works */
        for (int i = 0; i < seq_len; i++) p->positions[i] = i;
    }
    p->comm = comm_create(&p->topo, cfg->trace_path);
    comm_set_timeout(p->comm, cfg->comm_timeout * COMM_SLOW_PHASE_FACTOR); /* the caller shortens it after step 1 */
    AttnHeads heads = {.n_local = p->n_local, .n_heads = model->num_attention_heads,
                       .n_kv_heads = model->num_key_value_heads, .head_dim = model->head_dim,
                       .precision = p->params.attn_bf16 ? PRECISION_BF16 : PRECISION_FP32};
    p->attn = sp > 1 || own ? strategy_create_attention(p->strategy, &p->params, &p->topo, p->comm)
                     : local_attention_create(heads);
    grad_sync_init(&p->sync, MPI_COMM_WORLD, p->comm, n_params, cfg->zero, cfg->zero_group);
    comm_guard_end();
}

void seq_parallel_create(SeqParallel *p, const ParallelConfig *cfg, const LlamaConfig *model, int seq_len,
                         size_t n_params) {
    seq_parallel_check(p, cfg, model, seq_len);
    seq_parallel_finish(p, model, n_params);
}
void seq_parallel_check_free(SeqParallel *p) {
    topology_free(&p->topo);
    memset(p, 0, sizeof *p);
}

int seq_parallel_free(SeqParallel *p, SeqErr *e) {
    if (p->cfg.stats) comm_stats_print(p->comm, stdout);
    if (p->cfg.stats && p->strategy->own && p->strategy->own->tier_stats) {
        TierStats ts;
        long batches = 0;
        p->strategy->own->tier_stats(p->attn, &ts, &batches);
        if (ts.bytes_written || ts.bytes_read) {
            double b = batches > 0 ? (double)batches : 1.0;
            printf("rank %d: offload: %.3f MB written, %.3f MB read per batch (%ld batches), I/O not hidden %.4f s per "
                   "batch, tier buffers %.3f MB\n", p->topo.world_rank, ts.bytes_written / b / 1e6,
                   ts.bytes_read / b / 1e6, batches, ts.wait_s / b, ts.ram_floats * 4.0 / 1e6);
        }
    }
    grad_sync_free(&p->sync);
    seq_attention_destroy(p->attn);
    const int rc = comm_destroy(p->comm, e);
    topology_free(&p->topo);
    xfree(p->positions);
    memset(p, 0, sizeof *p);
    return rc;
}

void seq_parallel_take_local(const SeqParallel *p, const int *global, int *local) {
    for (int i = 0; i < p->n_local; i++) local[i] = global[p->positions[i]];
}

double seq_parallel_sum(const SeqParallel *p, double local) {
    double global = local;
    if (p->topo.world_size > 1)
        comm_control_allreduce(p->comm, "MPI_Iallreduce (loss sum)", &global, 1, MPI_DOUBLE, MPI_SUM, p->topo.world);
    return global;
}

void seq_parallel_describe(const SeqParallel *p, char *buf, size_t n) {
    const Topology *t = &p->topo;
    char team[32] = "", lay[48];
    if (p->strategy->own && p->strategy->own->layout_name)
        p->strategy->own->layout_name(&p->params, lay, sizeof lay);
    else
        snprintf(lay, sizeof lay, "%s", layout_name(p->cfg.layout));
    if (t->sp > 1) strategy_describe(p->strategy, &p->params, team, sizeof team);
    snprintf(buf, n, "%s%s: dp %d x hp %d x cp %d (ring W %d), %s layout, %s placement, %d ranks/node, zero %d (groups of %d), %d thread%s/rank",
             strategy_run_name(p->strategy, t->sp, t->dp), team, t->dp, t->hp, t->cp, t->ring_inner, lay, placement_name(t->placement),
             t->ranks_per_node, p->cfg.zero, p->sync.group, p->threads, p->threads == 1 ? "" : "s");
    const size_t len = strlen(buf);
    if (p->idle_cpus > 0 && len < n)
        snprintf(buf + len, n - len,
                 " (the ranks' CPU binding leaves %d of the CPUs their launcher may use to no rank: mpirun "
                 "--bind-to none, or --map-by slot:PE=N for N cores a rank, would use them)",
                 p->idle_cpus);
}
