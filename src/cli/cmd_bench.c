/* seqpar bench: speed and memory figures, each printed next to sgemm GFLOPS measured
 * in the same run. Parts: attn (flash attention forward/backward at S = 8192, head_dim 64 and
 * 128, causal), step (a training step of a 4-layer, 256-wide, 4-head / 2-KV-head model, MFU and
 * HFU, under --checkpoint none|layer|selective and --ffn-chunks),
 * memory (peak memory of a training step at several sequence lengths, each in a fresh child
 * process). Benchmarks are not tests: they report; bench/results/ keeps the readings. */
#include <cblas.h>
#include <getopt.h>
#include <mpi.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/attention_bench.h"
#include "train/cli_common.h"
#include "cli/commands.h"
#include "core/common.h"
#include "core/op_clock.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "kernels/sgemm.h"
#include "bench/sgemm_bench.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "bench/dist_attention_bench.h"
#include "plan/memory_model.h"
#include "train/seq_parallel.h"

static const char HELP[] =
    "usage: seqpar bench [attn|step|memory|all] [options]\n"
    "\n"
    "  attn      flash attention forward/backward GFLOPS (causal) vs same-run sgemm\n"
    "  step      training step of the reference model: tokens/s, MFU and HFU vs same-run sgemm,\n"
    "            and the step at that peak for every FLOP it executes\n"
    "  memory    peak memory of one training step at each --mem-seq-lens length\n"
    "  all       all of the above (default)\n"
    "\n"
    "  --seq-len S          sequence length for attn and step (default 8192)\n"
    "  --head-dims LIST     head dims for attn, comma separated (default 64,128)\n"
    "  --repeats N          timed repeats; medians are reported (default 5)\n"
    "  --warmup-steps N     untimed training steps before step's / memory's timed ones (default 1)\n"
    "  --cpu-time           attn and step: time by this process's CPU time (every thread), the sgemm\n"
    "                       and bf16 GEMM peaks too, so the ratios are of rates per CPU-second (for a\n"
    "                       shared machine; with --threads 1 CPU time is compute time; not for\n"
    "                       distributed attn, whose waits are what it measures)\n"
    "  --mem-seq-lens LIST  sequence lengths for memory (default 4096,16384,65536)\n"
    "  --checkpoint [MODE]  step/memory under none (default), layer (also --checkpoint alone) or\n"
    "                       selective checkpointing\n"
    "  --ffn-chunks K       step/memory with the MLP over K chunks of tokens (default: at least 2 chunks\n"
    "                       of at most " SEQ_STR(LLAMA_FFN_ROWS_MAX) " tokens, smaller where they would outgrow the attention's\n"
    "                       gradients, at least " SEQ_STR(LLAMA_FFN_ROWS_MIN) " tokens: train's rule)\n"
    "  --precision P        fp32 (default) or bf16: attn, step and memory in that precision\n"
    "  memory also takes --strategy, --hp/--cp/--dp, --chunks, --zero, --zero-group, --offload-dir and\n"
    "                       --no-stream (under mpirun for more ranks): then the lengths run shortest\n"
    "                       first in one process, next to the memory model's prediction ('seqpar memory')\n"
    "  --heads N            query heads for attn (default 8; one-rank attn: 8, 4 at head_dim 128 and up)\n"
    "  --kv-heads N         key/value heads for attn, dividing --heads (default = heads)\n"
    "  --help               this text\n"
    "\n"
    "The reference model: 4 layers, hidden 256, 4 heads (2 KV heads, head_dim 64), ffn 1024,\n"
    "vocab 256, fp32, one sequence per step, AdamW included.\n"
    "\n"
    "Distributed attention: 'seqpar bench attn' with any of --dp/--hp/--cp (under mpirun for more\n"
    "than one rank) times forward+backward of one causal attention layer of the strategy the flags\n"
    "select (S = --seq-len, head_dim = first of --head-dims), the slowest rank's time, and the\n"
    "overlap achieved (communication hidden / communication total). '--cp 1 --threads 1' on one\n"
    "rank is the one-device baseline.\n"
    "\n"
    "Kernels: the best path this CPU runs (amx, avx512, avx2, scalar), printed first; SEQPAR_ISA=\n"
    "avx2|scalar|avx512|amx forces one (a path the CPU lacks is refused; amx = avx512 plus AMX\n"
    "tiles for bf16 attention and oneDNN's bf16 GEMM); the fp32 attention tiles follow the L2 per\n"
    "core, SEQPAR_ATTN_TILES=fwd_bq,fwd_bk,bwd_bk,bwd_bq sets them. The sgemm figure is the best of\n"
    "several trials: the fp32 peak that MFU is measured against.\n";

/* Parses "a,b,c" into at most max positive ints; returns the count. An empty item ("8,,8", "64,")
 * is refused (strtok skipped it). */
#define BENCH_LIST_MAX 8 /* values of --head-dims and --mem-seq-lens */
static int parse_list(const char *flag, const char *s, int *out, int max) {
    if (!*s) die_collective("seqpar bench: --%s needs at least one value", flag);
    int n = 0;
    for (const char *p = s;; p++) {
        const size_t len = strcspn(p, ",");
        if (len == 0)
            die_collective("seqpar bench: --%s '%s' has an empty item: give values separated by single commas "
                           "(e.g. 64,128)", flag, s);
        if (n == max) die_collective("seqpar bench: --%s takes at most %d values", flag, max);
        char *tok = xmalloc(len + 1);
        memcpy(tok, p, len);
        tok[len] = 0;
        out[n++] = (int)parse_long("bench", flag, tok, 1, 1 << 30);
        xfree(tok);
        p += len;
        if (!*p) return n;
    }
}

typedef struct {
    double step_seconds, tokens_per_s, mfu_gflops, hfu_gflops; /* model / hardware FLOPs per second */
    double executed_gflop; /* a step's FLOPs as executed: HFU's and the attention backward's scores again */
    double mean_seconds, split[OPC_COUNT]; /* the timed steps' mean, and its op_clock split */
    int ffn_chunks;
    size_t tracked_peak, rss_peak;
} StepResult;

static int g_warmup_steps = 1;

/* Builds the reference model and times `repeats` full training steps (after the warm-up ones). */
static StepResult run_steps(int S, int repeats, const MemoryFlags *mf) {
    LlamaConfig c = llama_reference_config();
    LlamaModel m;
    llama_build(&m, &c);
    llama_init_random(&m, 1);
    AdamWConfig oc;
    adamw_config_default(&oc);
    AdamW opt;
    adamw_init(&opt, &oc, 0, m.table.total);
    SeqAttention *attn = local_attention_create((AttnHeads){.n_local = S, .n_heads = c.num_attention_heads,
                                                            .n_kv_heads = c.num_key_value_heads,
                                                            .head_dim = c.head_dim, .precision = mf->precision});
    LlamaActsOptions ao = {.checkpoint = mf->checkpoint, .ffn_chunks = mf->ffn_chunks, .precision = mf->precision};
    LlamaActs *acts = llama_acts_create_opts(&m, attn, S, &ao);
    int *inputs = xmalloc(sizeof(int) * S), *targets = xmalloc(sizeof(int) * S), *pos = xmalloc(sizeof(int) * S);
    Rng rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < S; i++) {
        inputs[i] = (int)rng_below(&rng, (uint64_t)c.vocab_size);
        targets[i] = (int)rng_below(&rng, (uint64_t)c.vocab_size);
        pos[i] = i;
    }
    double *times = xmalloc(sizeof(double) * (size_t)repeats);
    for (int r = 1 - g_warmup_steps; r <= repeats; r++) {
        if (r == 1) op_clock_reset(); /* the split counts the timed steps only */
        double t0 = bench_seconds();
        memset(m.grads, 0, sizeof(float) * m.table.total);
        llama_forward_backward(&m, acts, attn, inputs, targets, pos, S, 1.0f / S, 1, NULL);
        double nsq = grad_norm_sq(m.grads, m.table.total);
        adamw_update(&opt, &m.table, m.params, m.grads, 1e-4f, adamw_clip_scale(&oc, nsq));
        if (r > 0) times[r - 1] = bench_seconds() - t0;
    }
    StepResult res;
    for (int c = 0; c < OPC_COUNT; c++) res.split[c] = op_clock_seconds((OpClass)c) / repeats;
    res.mean_seconds = 0;
    for (int r = 0; r < repeats; r++) res.mean_seconds += times[r] / repeats;
    res.step_seconds = median_of(times, repeats);
    res.tokens_per_s = S / res.step_seconds;
    const double mfu_rate = res.tokens_per_s * llama_train_flops_per_token(&c, S) * 1e-9;
    const double hfu_rate = res.tokens_per_s * (llama_train_flops_per_token(&c, S) +
                                                llama_recompute_flops_per_token(&c, S, acts)) * 1e-9;
    res.mfu_gflops = mfu_rate;
    res.hfu_gflops = hfu_rate;
    /* The flash backward forms each tile's scores again (one product of the causal half per layer,
     * S H d FLOPs per token), which HFU, counting recomputation by layer as InternEvo does, leaves out. */
    res.executed_gflop = S * (llama_train_flops_per_token(&c, S) + llama_recompute_flops_per_token(&c, S, acts) +
                              (double)c.num_hidden_layers * S * c.num_attention_heads * c.head_dim) * 1e-9;
    res.ffn_chunks = llama_acts_ffn_chunks(acts);
    res.tracked_peak = mem_tracked_peak();
    res.rss_peak = mem_peak_rss();
    xfree(times); xfree(inputs); xfree(targets); xfree(pos);
    llama_acts_free(acts);
    seq_attention_destroy(attn);
    adamw_free(&opt);
    llama_free(&m);
    return res;
}

/* What the peak is: the bf16 GEMM's, or sgemm's (fp32, and bf16 on the conversion path, whose
 * products are fp32 sgemm on bf16 values: bf16.h) */
static const char *peak_name(int bf16) {
    return bf16 && !bf16_products_on_sgemm() ? "bf16 GEMM" : "sgemm";
}

static double measure_peak(int bf16, int trials, double libs[SGEMM_LIBS]);

/* bf16: bf16 q, k, v, dout through the kernel attn_kernel_name() names (bf16 tiles with VDPBF16PS
 * where the CPU has AVX512_BF16, else the fp32 kernel on the bf16 values), compared with the bf16
 * GEMM's peak. The peak is measured again after the attention runs and the higher taken (as for
 * the step), so that a peak measured in a slow minute does not flatter the kernel; each rate is
 * then a share of it twice: the median run's, and the fastest run's ("best"), the peak's own
 * statistic (the best of its trials), which compares like with like on a machine that only ever
 * slows a run down. */
static int attn_bench_heads(int head_dim) { return head_dim >= 128 ? 4 : 8; }

/* heads, kv_heads: --heads and --kv-heads (0: not given, the default per head_dim, KV = heads) */
static void bench_attn(int S, const int *dims, int n_dims, int repeats, double peak, int bf16, int trials, int heads,
                       int kv_heads) {
    const char *yard = peak_name(bf16);
    const Precision prec = bf16 ? PRECISION_BF16 : PRECISION_FP32;
    AttnBenchResult r[BENCH_LIST_MAX];
    int H[BENCH_LIST_MAX], Hkv[BENCH_LIST_MAX];
    for (int i = 0; i < n_dims; i++) {
        H[i] = heads ? heads : attn_bench_heads(dims[i]);
        Hkv[i] = kv_heads ? kv_heads : H[i];
        attention_bench(S, H[i], Hkv[i], dims[i], ATTN_CAUSAL, prec, repeats, &r[i]);
    }
    const double before = peak, after = measure_peak(bf16, trials, NULL);
    if (after > peak) peak = after;
    printf("attention (causal, S = %d, %s, kernel: %s, %d threads), medians of %d%s; %% of the %s peak, %.1f GFLOPS "
           "before the runs, %.1f after, the higher:\n", S, precision_name(prec), attn_kernel_name(prec),
           current_threads(), repeats, bench_clock_is_cpu() ? ", GFLOPS per CPU-second (CPU s)" : "", yard, before,
           after);
    for (int i = 0; i < n_dims; i++) {
        char kv[32] = "";
        if (Hkv[i] != H[i]) snprintf(kv, sizeof kv, " (%d KV)", Hkv[i]);
        printf("  head_dim %3d, %d heads%s: forward %7.1f GFLOPS (%5.1f%% of %s, %.3f s; best %5.1f%%) | "
               "backward %7.1f GFLOPS (%5.1f%% of %s, %.3f s; best %5.1f%%)\n",
               dims[i], H[i], kv, r[i].fwd_gflops, 100 * r[i].fwd_gflops / peak, yard, r[i].fwd_seconds,
               100 * r[i].fwd_best_gflops / peak, r[i].bwd_gflops, 100 * r[i].bwd_gflops / peak, yard,
               r[i].bwd_seconds, 100 * r[i].bwd_best_gflops / peak);
    }
    fflush(stdout);
}

/* The peak MFU is measured against: fp32 sgemm (the better library's) or the bf16 GEMM, 2048^3,
 * the best of `trials`, on the benchmarks' clock (by CPU time under --cpu-time, as everything the
 * ratios compare with it). */
static double measure_peak(int bf16, int trials, double libs[SGEMM_LIBS]) {
    if (bf16) return bf16_gemm_peak_gflops(trials);
    return sgemm_peak_gflops_libs(trials, libs);
}

/* The peak is measured before the steps and again after them, and MFU is taken against the
 * higher: a machine that was slow during one measurement (a busy neighbour on a VM) gives a low
 * peak, which a step would then appear to beat. */
static void bench_step(int S, int repeats, const MemoryFlags *mf, double peak, int trials) {
    StepResult r = run_steps(S, repeats, mf);
    double libs[SGEMM_LIBS];
    const int bf16 = mf->precision == PRECISION_BF16;
    const double before = peak, after = measure_peak(bf16, trials, libs);
    if (after > peak) peak = after;
    int clamped = 0;
    double mfu = utilisation_clamp(peak > 0 ? r.mfu_gflops / peak : 0, &clamped),
           hfu = utilisation_clamp(peak > 0 ? r.hfu_gflops / peak : 0, &clamped);
    printf("training step (4 layers, hidden 256, 4 heads / 2 KV, ffn 1024, S = %d, %s, --checkpoint %s, %d FFN chunk%s), "
           "median of %d:\n"
           "  %.3f %ss/step | %.0f tokens/s | MFU %.1f%% | HFU %.1f%% of same-run %s | peak tracked memory %.1f MiB, "
           "peak RSS %.1f MiB\n",
           S, precision_name(mf->precision), llama_checkpoint_name(mf->checkpoint), r.ffn_chunks, r.ffn_chunks == 1 ? "" : "s", repeats, r.step_seconds,
           bench_clock_is_cpu() ? "CPU " : "", r.tokens_per_s, 100 * mfu, 100 * hfu,
           peak_name(bf16), (double)r.tracked_peak / (1 << 20), (double)r.rss_peak / (1 << 20));
    printf("  the %s peak: %.1f GFLOPS before the steps, %.1f after; MFU and HFU are against the higher\n",
           peak_name(bf16), before, after);
    if (clamped) printf("  (a utilisation above 100%% of the same-run peak is shown as 100%%)\n");
    if (peak > 0)
        printf("  the step at the %s peak: %.3f s/step, %.0f tokens/s (all %.1f GFLOP it executes, the attention "
               "backward's second score product included, at %.1f GFLOPS): this step takes %.2fx that\n",
               peak_name(bf16), r.executed_gflop / peak, S * peak / r.executed_gflop, r.executed_gflop, peak,
               r.step_seconds * peak / r.executed_gflop);
    if (!bench_clock_is_cpu()) {
        const double rest = r.mean_seconds - r.split[OPC_ATTN_FWD] - r.split[OPC_ATTN_BWD] - r.split[OPC_LINEAR];
        printf("  where a step's time goes (mean of the timed steps, %.3f s): attention forward %.3f s (%.0f%%), "
               "backward %.3f s (%.0f%%), linear-layer GEMMs %.3f s (%.0f%%), everything else %.3f s (%.0f%%)\n",
               r.mean_seconds, r.split[OPC_ATTN_FWD], 100 * r.split[OPC_ATTN_FWD] / r.mean_seconds, r.split[OPC_ATTN_BWD],
               100 * r.split[OPC_ATTN_BWD] / r.mean_seconds, r.split[OPC_LINEAR], 100 * r.split[OPC_LINEAR] / r.mean_seconds,
               rest, 100 * rest / r.mean_seconds);
    }
    fflush(stdout);
}

/* "--ffn-chunks K" as given, or the default's rule (llama_ffn_chunks_default). */
static const char *ffn_chunks_describe(int given, char *buf, size_t n) {
    if (given > 0) snprintf(buf, n, "--ffn-chunks %d", given);
    else snprintf(buf, n, "FFN chunks of at most %d tokens, at least %d, sized to the attention's gradients",
                  LLAMA_FFN_ROWS_MAX, LLAMA_FFN_CHUNKS_DEFAULT);
    return buf;
}

/* Each length runs in a child process so its peak RSS is its own. */
static void bench_memory(const int *lens, int n, const MemoryFlags *mf) {
    char chunks[96];
    printf("peak memory of one training step (reference model, %s, --checkpoint %s, %s), each in a fresh "
           "process:\n", precision_name(mf->precision), llama_checkpoint_name(mf->checkpoint),
           ffn_chunks_describe(mf->ffn_chunks, chunks, sizeof chunks));
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        int fds[2];
        if (pipe(fds) != 0) die("pipe failed");
        pid_t pid = fork();
        if (pid < 0) die("fork failed");
        if (pid == 0) {
            close(fds[0]);
            StepResult r = run_steps(lens[i], 1, mf);
            if (write(fds[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
            _exit(0);
        }
        close(fds[1]);
        StepResult r;
        ssize_t got = read(fds[0], &r, sizeof r);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (got != (ssize_t)sizeof r || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("  S = %6d: failed (child status %d)\n", lens[i], status);
            continue;
        }
        printf("  S = %6d: tracked %8.1f MiB (%.1f KiB/token) | RSS %8.1f MiB | %.2f s/step\n", lens[i],
               (double)r.tracked_peak / (1 << 20), (double)r.tracked_peak / 1024.0 / lens[i],
               (double)r.rss_peak / (1 << 20), r.step_seconds);
        fflush(stdout);
    }
}

/* The memory model's total for the reference model at S under the flags (bytes), 0 on error. */
static double predicted_bytes(const ParallelConfig *pc, const MemoryFlags *mf, int S, int world, int batch) {
    MemoryModelInput in;
    memset(&in, 0, sizeof in);
    in.model = llama_reference_config();
    in.seq_len = S;
    in.batch = batch;
    in.world = world;
    in.cores = omp_get_num_procs();
    in.par = *pc;
    in.checkpoint = mf->checkpoint;
    in.ffn_chunks = mf->ffn_chunks;
    in.no_stream = mf->no_stream;
    in.precision = mf->precision;
    MemoryEstimate m;
    char *err = memory_model_estimate(&in, &m);
    if (err) {
        xfree(err);
        return 0;
    }
    return m.ram_total;
}

/* The memory part under the parallel flags (--strategy, grid, --chunks, --zero, --zero-group,
 * --offload-dir; under mpirun for more than one rank): each length in this process, shortest
 * first, warm-up steps then one measured step, as seqpar train runs it (one sequence per
 * replica). Tracked peak: that step's (max over ranks); peak RSS: the process's so far, which is
 * this length's when memory grows with S. Rank 0 prints, with the memory model's prediction. */
static void bench_memory_parallel(const ParallelConfig *pc_in, const MemoryFlags *mf, int *lens, int n) {
    ParallelConfig pc_bf16 = *pc_in, *pc = &pc_bf16;
    pc->wire_bf16 = mf->precision == PRECISION_BF16; /* the head exchange and schedules in bf16, as train */
    for (int i = 1; i < n; i++) /* shortest first */
        for (int j = i; j > 0 && lens[j] < lens[j - 1]; j--) {
            int t = lens[j]; lens[j] = lens[j - 1]; lens[j - 1] = t;
        }
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    LlamaConfig c = llama_reference_config();
    for (int li = 0; li < n; li++) {
        const int S = lens[li];
        LlamaModel m;
        llama_build(&m, &c);
        llama_init_random(&m, 1);
        SeqParallel par;
        seq_parallel_create(&par, pc, &c, S, m.table.total);
        const int N = par.n_local, batch = par.topo.dp;
        if (li == 0 && rank == 0) {
            char desc[512];
            seq_parallel_describe(&par, desc, sizeof desc);
            char chunks[96];
            printf("peak memory of one training step (reference model, %s, --checkpoint %s, %s%s%s) on %s; "
                   "lengths shortest first in one process:\n", precision_name(mf->precision),
                   llama_checkpoint_name(mf->checkpoint),
                   ffn_chunks_describe(mf->ffn_chunks, chunks, sizeof chunks), pc->offload_dir ? ", --offload-dir " : "",
                   pc->offload_dir ? pc->offload_dir : "", desc);
            fflush(stdout);
        }
        AdamWConfig oc;
        adamw_config_default(&oc);
        AdamW opt;
        adamw_init(&opt, &oc, par.sync.shard_begin, par.sync.shard_end);
        LlamaActsOptions ao = {.checkpoint = mf->checkpoint, .ffn_chunks = mf->ffn_chunks, .offload_dir = pc->offload_dir,
                               .rank = par.topo.world_rank, .no_stream = mf->no_stream, .precision = mf->precision};
        LlamaActs *acts = llama_acts_create_opts(&m, par.attn, N, &ao);
        grad_sync_attach(&par.sync, &m);
        int *g_in = xmalloc(sizeof(int) * (size_t)S), *g_tg = xmalloc(sizeof(int) * (size_t)S);
        int *in = xmalloc(sizeof(int) * (size_t)N), *tg = xmalloc(sizeof(int) * (size_t)N);
        Rng rng;
        rng_seed(&rng, 7 + (uint64_t)par.topo.dp_rank);
        for (int i = 0; i < S; i++) {
            g_in[i] = (int)rng_below(&rng, (uint64_t)c.vocab_size);
            g_tg[i] = (int)rng_below(&rng, (uint64_t)c.vocab_size);
        }
        seq_parallel_take_local(&par, g_in, in);
        seq_parallel_take_local(&par, g_tg, tg);
        double t0 = 0, step_s = 0;
        for (int r = 1 - g_warmup_steps; r <= 1; r++) {
            if (r == 1) {
                mem_tracked_reset_peak();
                t0 = now_seconds();
            }
            if (m.grads) memset(m.grads, 0, sizeof(float) * m.table.total);
            grad_sync_microbatch(&par.sync, 0);
            llama_forward_backward(&m, acts, par.attn, in, tg, par.positions, N, 1.0f / ((float)S * batch), 1, NULL);
            offload_errors_check(acts, &par);
            double nsq = grad_sync_reduce(&par.sync, m.grads);
            grad_sync_update(&par.sync, &opt, &m, 1e-4f, adamw_clip_scale(&oc, nsq));
            if (r == 1) step_s = now_seconds() - t0;
        }
        double agree[3] = {(double)mem_tracked_peak(), (double)mem_peak_rss(), step_s};
        if (world > 1) MPI_Allreduce(MPI_IN_PLACE, agree, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        unsigned long long wr = 0, rd = 0;
        double wait_s = 0;
        long passes = 0;
        llama_acts_offload_stats(acts, &wr, &rd, &wait_s, &passes);
        TierStats ts;
        long batches = 0;
        memset(&ts, 0, sizeof ts);
        if (par.strategy->own && par.strategy->own->tier_stats) par.strategy->own->tier_stats(par.attn, &ts, &batches);
        double pred = predicted_bytes(pc, mf, S, world, batch);
        if (rank == 0) {
            printf("  S = %7d: tracked %9.1f MiB (%.2f KiB/token, %.2f KiB/local token) | model %9.1f MiB (x%.3f) | "
                   "RSS %9.1f MiB | %.2f s/step\n", S, agree[0] / 1048576.0, agree[0] / 1024.0 / S, agree[0] / 1024.0 / N,
                   pred / 1048576.0, agree[0] > 0 ? pred / agree[0] : 0.0, agree[1] / 1048576.0, agree[2]);
            double steps = 1.0 + g_warmup_steps;
            if (passes > 0 || batches > 0)
                printf("             rank 0 disk tier per step: %.1f MB written, %.1f MB read, %.3f s I/O not hidden\n",
                       (wr + ts.bytes_written) / steps / 1e6, (rd + ts.bytes_read) / steps / 1e6,
                       (wait_s + ts.wait_s) / steps);
            fflush(stdout);
        }
        xfree(g_in); xfree(g_tg); xfree(in); xfree(tg);
        llama_acts_free(acts);
        adamw_free(&opt);
        parallel_free_or_die(&par);
        llama_free(&m);
    }
}

/* Distributed attention benchmark on the grid the flags select; rank 0 prints. */
static void bench_dist_attn(const ParallelConfig *pc, int S, int H, int Hkv, int d, int repeats) {
    LlamaConfig heads = {.num_attention_heads = H, .num_key_value_heads = Hkv, .head_dim = d, .hidden_size = H * d};
    SeqParallel par;
    seq_parallel_create(&par, pc, &heads, S, 1);
    DistAttnBenchResult r;
    dist_attention_bench(&par.topo, par.comm, par.attn, par.positions, S, repeats, &r);
    if (par.topo.world_rank == 0) {
        char desc[512];
        seq_parallel_describe(&par, desc, sizeof desc);
        printf("distributed attention, causal, S = %d, %d heads (%d KV), head_dim %d, %s on %s; medians of %d:\n", S,
               H, Hkv, d, pc->wire_bf16 ? "bf16" : "fp32", desc, repeats);
        if (par.topo.world_size == 1) { /* nothing to overlap or count: the timing alone */
            printf("  forward+backward %.3f s (forward %.3f s, backward %.3f s) | %.1f GFLOPS | one process: no "
                   "communication\n", r.time_s, r.fwd_s, r.bwd_s, r.gflops);
            fflush(stdout);
            parallel_free_or_die(&par);
            return;
        }
        printf("  forward+backward %.3f s (forward %.3f s, backward %.3f s) | %.1f GFLOPS for the group\n"
               "  compute %.3f s | exposed communication %.3f s (ring %.3f s) | communication alone %.3f s (ring %.3f s)\n"
               "  overlap (hidden / total communication): %.0f%% overall, %.0f%% of the ring | %.1f MiB in %.0f messages "
               "sent by rank 0\n",
               r.time_s, r.fwd_s, r.bwd_s, r.gflops, r.compute_s, r.exposed_s, r.exposed_p2p_s, r.comm_only_s,
               r.comm_only_p2p_s, 100 * r.overlap, 100 * r.overlap_p2p, r.bytes_per_rank / (1 << 20), r.messages_per_rank);
        printf("  sent per rank (most of any rank), forward + backward:");
        for (int k = 0; k < COMM_KINDS; k++)
            if (r.bytes_kind_max[k] > 0)
                printf(" %s %.2f MiB in %.0f msgs;", comm_kind_name((CommKind)k), r.bytes_kind_max[k] / (1 << 20),
                       r.messages_kind_max[k]);
        printf("\n");
        fflush(stdout);
    }
    parallel_free_or_die(&par);
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench";
    int S = 8192, repeats = 5;
    MemoryFlags mf = {0};
    int dims[BENCH_LIST_MAX] = {64, 128}, n_dims = 2;
    int lens[BENCH_LIST_MAX] = {4096, 16384, 65536}, n_lens = 3;
    int heads = 0, kv_heads = 0, grid = 0, mem_modes = 0; /* heads 0: not given */
    ParallelConfig pc;
    parallel_config_default(&pc);
    static const struct option opts[] = {
        PARALLEL_FLAG_OPTIONS,
        {"heads", required_argument, 0, 'H'}, {"kv-heads", required_argument, 0, 'K'},
        {"seq-len", required_argument, 0, 's'}, {"head-dims", required_argument, 0, 'd'},
        {"repeats", required_argument, 0, 'r'}, {"warmup-steps", required_argument, 0, 'w'},
        {"cpu-time", no_argument, 0, 'C'}, {"mem-seq-lens", required_argument, 0, 'M'},
        MEMORY_FLAG_OPTIONS, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_full(argc, argv, ":h", options_with_knobs(opts), cmd)) != -1) {
        if (parallel_flags_handle(&pc, cmd, opt, optarg)) {
            if ((opt >= 2001 && opt <= 2004) || (opt >= 2012 && opt <= 2014)) grid = 1;
            if (opt == 2008 || opt == 2012 || opt == 2014 || opt == 2015 || opt == 2031) mem_modes = 1;
            if (opt == 2011) set_threads(pc.threads);
            continue;
        }
        if (memory_flags_handle(&mf, cmd, opt, optarg, argc, argv)) continue;
        switch (opt) {
        case 'H': heads = (int)parse_long(cmd, "heads", optarg, 1, 1 << 14); break;
        case 'K': kv_heads = (int)parse_long(cmd, "kv-heads", optarg, 1, 1 << 14); break;
        case 's': S = (int)parse_long(cmd, "seq-len", optarg, 16, 1 << 30); break;
        case 'd': n_dims = parse_list("head-dims", optarg, dims, BENCH_LIST_MAX); break;
        case 'r': repeats = (int)parse_long(cmd, "repeats", optarg, 1, 1000); break;
        case 'C': bench_clock_cpu(1); break;
        case 'w': g_warmup_steps = (int)parse_long(cmd, "warmup-steps", optarg, 0, 1000); break;
        case 'M': n_lens = parse_list("mem-seq-lens", optarg, lens, BENCH_LIST_MAX); break;
        case 'h': fputs(HELP, stdout); parallel_flags_help(stdout); return 0;
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    const char *part = optind < argc ? argv[optind++] : "all";
    die_extra_args(cmd, argc, argv);
    int all = !strcmp(part, "all");
    if (!all && strcmp(part, "attn") && strcmp(part, "step") && strcmp(part, "memory"))
        die_collective("seqpar bench: unknown part '%s': use attn, step, memory or all", part);
    if ((heads || kv_heads) && !all && strcmp(part, "attn")) /* step and memory: the reference model's heads */
        die_collective("seqpar bench: --%s is read by attn only ('%s' runs the reference model, 4 heads / 2 KV): drop "
                       "it or use 'bench attn'", heads ? "heads" : "kv-heads", part);
    for (int i = 0; i < n_dims; i++)
        if (dims[i] % 2) die_collective("seqpar bench: --head-dims values must be even, got %d", dims[i]);

    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int dist_attn = world > 1 || grid; /* distributed attn: --heads default 8 at every head_dim */
    for (int i = 0; kv_heads && i < (dist_attn ? 1 : n_dims); i++) {
        const int h = heads ? heads : dist_attn ? 8 : attn_bench_heads(dims[i]);
        if (h % kv_heads)
            die_collective("seqpar bench: --kv-heads %d does not divide the %d query heads%s: give --kv-heads dividing "
                           "--heads", kv_heads, h, heads ? "" : " (the default: set --heads)");
    }
    /* a flag no part of this run reads is refused (as train's knobs of another strategy): --zero,
     * --zero-group, --no-stream and --offload-dir are the parallel memory part's (and, in distributed
     * attn, --offload-dir the chunk tier's of a strategy that keeps its chunks there), --checkpoint and
     * --ffn-chunks step's and memory's */
    const Strategy *named = strategy_named(pc.strategy), *chunker = NULL;
    for (int i = 0; strategy_at(i) && !chunker; i++)
        if (strategy_at(i)->reads & KNOB_CHUNK_OFFLOAD) chunker = strategy_at(i);
    const int own_chunks = named && named->reads & KNOB_CHUNK_OFFLOAD;
    const char *unread = pc.zero > 0 ? "zero" : pc.zero_group > 0 ? "zero-group" : mf.no_stream ? "no-stream"
                         : pc.offload_dir && !(dist_attn && own_chunks) ? "offload-dir" : NULL;
    if (unread && strcmp(part, "memory")) {
        char attn[96] = "";
        if (!strcmp(unread, "offload-dir") && chunker)
            snprintf(attn, sizeof attn, " and 'bench attn --strategy %s'", chunker->name);
        die_collective("seqpar bench: --%s is read by 'bench memory'%s only, not by 'bench %s': drop it or run 'bench "
                       "memory'", unread, attn, part);
    }
    if (!strcmp(part, "attn") && (mf.checkpoint != LLAMA_CKPT_NONE || mf.ffn_chunks > 0))
        die_collective("seqpar bench: --%s is read by 'bench step' and 'bench memory', not by 'bench attn' (attention "
                       "alone): drop it", mf.ffn_chunks > 0 ? "ffn-chunks" : "checkpoint");
    if (mf.no_stream) mem_modes = 1; /* memory in one process: offload_flags_check (a streaming strategy's flag) */
    if (!strcmp(part, "memory") && (world > 1 || grid || mem_modes)) {
        offload_flags_check(&pc, &mf);
        bench_memory_parallel(&pc, &mf, lens, n_lens);
        return 0;
    }
    if (dist_attn) {
        if (strcmp(part, "attn"))
            die_collective("seqpar bench: with --dp/--hp/--cp or under mpirun only 'bench attn' and 'bench memory' run; "
                           "got '%s'", part);
        if (bench_clock_is_cpu())
            die_collective("seqpar bench: --cpu-time times one process's kernels; distributed 'bench attn' measures "
                           "wall time, its waits included: drop --cpu-time");
        pc.wire_bf16 = mf.precision == PRECISION_BF16; /* bf16 inputs and wire, as train (it ran fp32) */
        bench_dist_attn(&pc, S, heads ? heads : 8, kv_heads ? kv_heads : heads ? heads : 8, dims[0], repeats);
        return 0;
    }
    double peak = 0;
    const int trials = repeats > SGEMM_PEAK_TRIALS ? repeats : SGEMM_PEAK_TRIALS; /* of each peak measurement */
    if (all || strcmp(part, "memory")) {
        print_kernels_header();
        double libs[SGEMM_LIBS];
        peak = measure_peak(0, trials, libs);
        printf("sgemm (2048^3, %d threads): %.1f GFLOPS%s, the better of %s %.1f and %s %.1f (best of %d trials each; "
               "the fp32 peak below)\n", current_threads(), peak, bench_clock_is_cpu() ? " per CPU-second" : "",
               sgemm_lib_name(SGEMM_ONEDNN), libs[SGEMM_ONEDNN], sgemm_lib_name(SGEMM_OPENBLAS), libs[SGEMM_OPENBLAS],
               trials);
        if (mf.precision == PRECISION_BF16) { /* the step's MFU is against the bf16 GEMM's peak */
            char b16[160];
            bf16_describe(b16, sizeof b16);
            if (bf16_products_on_sgemm()) {
                printf("bf16 GEMM (bf16 path: %s): the products are fp32 sgemm, so the bf16 peak below is the "
                       "sgemm above\n", b16);
            } else {
                double sgemm = peak;
                peak = measure_peak(1, trials, libs);
                printf("bf16 GEMM (2048^3; bf16 path: %s; %d threads): %.1f GFLOPS %s (best of %d trials; "
                       "%.2fx sgemm; the bf16 peak below)\n", b16, current_threads(), peak,
                       bench_clock_is_cpu() ? "per CPU-second" : "wall clock", trials, peak / sgemm);
            }
            printf("bf16 attention: %s\n", attn_kernel_name(PRECISION_BF16));
        }
        fflush(stdout);
    }
    if (all || !strcmp(part, "attn"))
        bench_attn(S, dims, n_dims, repeats, peak, mf.precision == PRECISION_BF16, trials, heads, kv_heads);
    if (all || !strcmp(part, "step")) bench_step(S, repeats, &mf, peak, trials);
    if (all || !strcmp(part, "memory")) bench_memory(lens, n_lens, &mf);
    return 0;
}
