/* seqpar grad: one forward and backward of a model on the first S+1 tokens of a file
 * (inputs tokens[0..S-1], targets tokens[1..S], positions 0..S-1). Prints "loss: <value>" and
 * writes the gradient of the mean loss for every parameter (HF names and shapes, F32) to a
 * safetensors file. With --pack the window is packed documents (data/packing.h): document masking,
 * positions restarting per document, EOT targets ignored, the mean over the targets left. This is
 * the exactness contract every parallel strategy must reproduce. A loss
 * or gradient norm that is NaN or Inf is an error (exit 1, no file written). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/cli_common.h"
#include "cli/commands.h"
#include "train/run_control.h"
#include "core/common.h"
#include "attention/flash_attention.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "data/packing.h"
#include "data/tokens.h"
#include "io/atomic_file.h"
#include "io/param_io.h"
#include "model/llama.h"
#include "train/seq_parallel.h"

static const char HELP[] =
    "usage: seqpar grad --model DIR --tokens FILE --seq-len S --out FILE [options]\n"
    "\n"
    "One forward and backward on the first S+1 tokens of FILE; prints 'loss: <value>' and\n"
    "writes d(mean loss)/d(parameter) for every parameter to a safetensors file.\n"
    "\n"
    "  --model DIR          Hugging Face model directory: config.json and model.safetensors or a\n"
    "                       sharded checkpoint (model.safetensors.index.json + shards)\n"
    "  --random-init        start from random weights of config.json's shape (weights in DIR, if any,\n"
    "                       are not read; without it a DIR with no weights is an error)\n"
    "  --tokens FILE        llm.c token shard (.bin) or text (.txt, one token per byte)\n"
    "  --tokens-format F    auto|llmc|text (default auto: .txt is text, else llm.c shard)\n"
    "  --seq-len S          tokens per sequence\n"
    "  --out FILE           gradient file to write (safetensors, F32)\n"
    "  --seed N             seed for --random-init (default 1)\n"
    "  --help               this text\n";

/* The gradient file's source, piece by piece: under ZeRO 0/1 rank 0's whole gradient (the model's
 * own buffer), under ZeRO-2/3 pieces fetched from the group's shards (grad_sync_fetch), so no rank
 * holds the whole gradient twice; each
 * piece turned into the replicas' mean as it comes. */
typedef struct {
    GradSync *g;
    ShardArray arrays[1];   /* the reduced gradient's shard (ZeRO-2/3) */
    const float *whole;     /* or the whole gradient (ZeRO 0/1) */
    int dp;
} GradSource;

static void read_grad_piece(void *ctx, size_t first, size_t n, float *dst) {
    GradSource *s = ctx;
    if (s->whole) memcpy(dst, s->whole + first, sizeof(float) * n);
    else grad_sync_fetch(s->g, s->arrays, 0, first, n, dst);
    if (s->dp > 1) /* the replicas' sum to their mean: one process's gradient within one fp32 rounding */
        for (size_t i = 0; i < n; i++) dst[i] = (float)((double)dst[i] / s->dp);
}

int cmd_grad(int argc, char **argv) {
    const char *cmd = "grad", *model_dir = NULL, *tokens_path = NULL, *out_path = NULL;
    TokensFormat fmt = TOKENS_AUTO;
    long seq_len = 0;
    uint64_t seed = 1;
    int random_init = 0;
    MemoryFlags mf = {0};
    PackFlags pf;
    pack_flags_default(&pf);
    ParallelConfig pc;
    parallel_config_default(&pc);
    static const struct option opts[] = {
        PARALLEL_FLAG_OPTIONS,
        {"model", required_argument, 0, 'm'}, {"tokens", required_argument, 0, 't'},
        {"tokens-format", required_argument, 0, 'f'}, {"seq-len", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'}, {"seed", required_argument, 0, 'r'},
        {"random-init", no_argument, 0, 3101},
        MEMORY_FLAG_OPTIONS, PACK_FLAG_OPTIONS,
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_full(argc, argv, ":h", options_with_knobs(opts), cmd)) != -1) {
        if (parallel_flags_handle(&pc, cmd, opt, optarg)) continue;
        if (memory_flags_handle(&mf, cmd, opt, optarg, argc, argv)) continue;
        if (pack_flags_handle(&pf, cmd, opt, optarg)) continue;
        switch (opt) {
        case 'm': model_dir = optarg; break;
        case 3101: random_init = 1; break;
        case 't': tokens_path = optarg; break;
        case 'f': fmt = tokens_format_parse(optarg); break;
        case 's': seq_len = parse_long(cmd, "seq-len", optarg, 1, 1L << 30); break;
        case 'o': out_path = optarg; break;
        case 'r': seed = (uint64_t)parse_long(cmd, "seed", optarg, 0, (1L << 62)); break;
        case 'h': fputs(HELP, stdout); fputs(MEMORY_FLAGS_HELP, stdout); fputs(PACK_FLAGS_HELP, stdout); parallel_flags_help(stdout); return 0;
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    offload_flags_check(&pc, &mf);
    if (!model_dir) die_collective("seqpar grad: --model DIR is required (see 'seqpar grad --help')");
    if (!tokens_path) die_collective("seqpar grad: --tokens FILE is required (see 'seqpar grad --help')");
    if (!seq_len) die_collective("seqpar grad: --seq-len S is required (see 'seqpar grad --help')");
    if (!out_path) die_collective("seqpar grad: --out FILE is required (see 'seqpar grad --help')");
    { /* the gradients never replace a file of the model being read (its weights, say) */
        char *dir = directory_of(out_path);
        const int replaces = file_exists(out_path) && same_file(dir, model_dir);
        xfree(dir);
        if (replaces)
            die_collective("seqpar grad: --out %s would replace a file of the model directory %s: write the gradients "
                           "elsewhere", out_path, model_dir);
    }

    LlamaModel model;
    model_from_dir(&model, model_dir, seed, random_init);
    const int eot = pack_flags_eot(&pf, cmd, model_dir, model.cfg.vocab_size);
    TokenData td;
    SeqErr err;
    die_if_any_rank(tokens_read(tokens_path, fmt, &td, &err) != 0 ||
                    tokens_check_vocab(&td, tokens_path, model.cfg.vocab_size, &err) != 0 ? &err : NULL);
    if ((size_t)seq_len + 1 > td.n)
        die_collective("--seq-len %ld needs %ld tokens but '%s' holds %zu: use --seq-len %zu or less", seq_len, seq_len + 1,
            tokens_path, td.n, td.n > 0 ? td.n - 1 : 0);
    int S = (int)seq_len;
    SeqParallel par;
    pc.wire_bf16 = mf.precision == PRECISION_BF16; /* the head exchange in bf16 too */
    trace_target_check(&pc, NULL); /* before the work, not after */
    file_target_check(out_path);
    if (same_file(out_path, tokens_path))
        die_collective("seqpar grad: --out %s is the --tokens file: write the gradients elsewhere", out_path);
    seq_parallel_create(&par, &pc, &model.cfg, S, model.table.total);
    int N = par.n_local;
    int *global_inputs = xmalloc(sizeof(int) * S), *global_targets = xmalloc(sizeof(int) * S);
    int *inputs = xmalloc(sizeof(int) * N), *targets = xmalloc(sizeof(int) * N);
    int *global_docs = NULL, *docs = NULL; /* document starts (packed), else NULL */
    for (int i = 0; i < S; i++) {
        global_inputs[i] = (int)td.tokens[i];
        global_targets[i] = (int)td.tokens[i + 1];
    }
    long n_targets = S;
    if (eot >= 0) {
        global_docs = xmalloc(sizeof(int) * S);
        docs = xmalloc(sizeof(int) * N);
        int n_docs = pack_documents(global_inputs, S, eot, global_docs);
        n_targets -= pack_mask_targets(global_inputs, S, eot, global_targets);
        if (n_targets == 0)
            die_collective("seqpar grad: every token of the window is the end-of-text id %d, so nothing is trained: "
                           "check --eot or the file", eot);
        seq_parallel_take_local(&par, global_docs, docs);
        if (par.topo.world_rank == 0)
            printf("packed: %d documents (end-of-text id %d), %ld of %d targets\n", n_docs, eot, n_targets, S);
    }
    seq_parallel_take_local(&par, global_inputs, inputs);
    seq_parallel_take_local(&par, global_targets, targets);
    /* Every dp replica computes the same sequence at one process's scale, so that its bf16 roundings
     * are one process's too; the replicas' fp32 sum is divided by dp below (1/3 folded into the
     * loss scale would round every bf16 activation gradient differently from one process). */
    const float loss_scale = 1.0f / (float)n_targets;
    comm_set_step(par.comm, 1, "grad");
    FaultPlan faults;
    fault_plan_from_env(&faults);
    LlamaActsOptions ao = {.checkpoint = mf.checkpoint, .ffn_chunks = mf.ffn_chunks, .offload_dir = pc.offload_dir,
                           .rank = par.topo.world_rank, .precision = mf.precision, .no_stream = mf.no_stream};
    LlamaActs *acts = llama_acts_create_opts(&model, par.attn, N, &ao);
    grad_sync_attach(&par.sync, &model); /* zero 2/3: per-layer reduce-scatter (and gathers) */
    grad_sync_microbatch(&par.sync, 0);
    double local = llama_forward_backward_docs(&model, acts, par.attn, inputs, targets, par.positions, docs, N, loss_scale,
                                               1, NULL);
    offload_errors_check(acts, &par);
    if (fault_nonfinite_at(&faults, 1) && par.topo.world_rank == 0) *(model.grads ? model.grads : par.sync.shard_buf) = NAN;
    double loss = seq_parallel_sum(&par, local) / ((double)n_targets * par.topo.dp);
    double norm_sq = grad_sync_reduce(&par.sync, model.grads);
    /* NaN and Inf survive every sum: every rank reaches the same verdict */
    if (!isfinite(loss) || !isfinite(norm_sq))
        die_collective("seqpar grad: the loss (%g) or the gradient norm (%g) is not finite (the weights or the tokens "
                       "of '%s' give NaN or Inf); no gradient file written", loss, sqrt(norm_sq), tokens_path);
    const int from_shards = model.grads == NULL; /* zero 2/3 */
    GradSource gs = {&par.sync, {{par.sync.shard_buf, NULL, 0}}, from_shards ? NULL : grad_sync_grads_to_root(&par.sync, &model),
                     par.topo.dp};
    if (par.topo.world_rank == 0) {
        char b16[160];
        print_kernels_header();
        if (mf.precision == PRECISION_BF16) {
            bf16_describe(b16, sizeof b16);
            printf("precision: bf16 (bf16 path: %s; attention: %s)\n", b16, attn_kernel_name(PRECISION_BF16));
        }
        if (llama_acts_streams(acts))
            printf("streaming: %d chunks of %d rows per layer\n", par.attn->stream_chunks, par.attn->stream_rows);
        printf("loss: %.9f\n", loss);
    }
    SeqErr werr;
    int failed = 0;
    if (par.topo.world_rank == 0) {
        const StSource src = {read_grad_piece, &gs};
        failed = params_save_safetensors_src(out_path, &model.table, &src, &werr) != 0;
        if (from_shards) grad_sync_fetch_done(&par.sync); /* after a failed write too: the shards' ranks wait for it */
    } else if (from_shards) {
        grad_sync_serve(&par.sync, gs.arrays, 1);
    }
    /* every rank gets here before any enters MPI_Finalize, which has no deadline */
    if (par.topo.world_size > 1) comm_control_barrier(par.comm, "MPI_Ibarrier (end of run)", par.topo.world);
    die_if_any_rank(failed ? &werr : NULL); /* a gradient file rank 0 could not write ends every rank */
    llama_acts_free(acts);
    parallel_free_or_die(&par);
    xfree(global_inputs); xfree(global_targets); xfree(inputs); xfree(targets); xfree(global_docs); xfree(docs);
    tokens_free(&td);
    llama_free(&model);
    return 0;
}
