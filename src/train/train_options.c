/* The options of `seqpar train`, which `seqpar memory` and `seqpar plan` take too: the flags'
 * table and help, their parsing and checks (one line on every rank for a bad flag), the data flags'
 * checks, the recall task they name, and the memory model's input they describe. */
#include "train/train_options.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attention/flash_attention.h"
#include "bench/sgemm_bench.h"
#include "core/common.h"
#include "data/packing.h"
#include "data/recall.h"
#include "data/token_stream.h"
#include "io/checkpoint.h"
#include "io/config_json.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/trace.h"
#include "train/cli_common.h"
#include "train/progress.h"
#include "train/run_control.h"
#include "train/seq_parallel.h"
#include "train/validation.h"

static const char HELP_HEAD[] =
    "usage: seqpar train [options]\n"
    "\n"
    "Trains a Llama model. With no options: a 2-layer model on the built-in multi-query\n"
    "associative-recall task, printing recall accuracy by key-query distance. The README's default\n"
    "job (scripts/train.sh) runs it twice on 2 ranks, 256 then 2048 tokens, --recall-format fused.\n"
    "\n"
    "model (either --model or the size flags):\n"
    "  --model DIR          Hugging Face model directory: config.json and model.safetensors or a\n"
    "                       sharded checkpoint (model.safetensors.index.json + shards)\n"
    "  --random-init        start from random weights of --model DIR's config.json (weights in DIR,\n"
    "                       if any, are not read)\n";
static const char HELP_TAIL[] =
    "data:\n"
    "  --data SRC           'recall' (default), an llm.c shard (.bin), a text file (.txt), a directory\n"
    "                       of .bin shards (without *_val_* ones) or a quoted glob; read in name order\n"
    "  --val-data SRC       held-out shards (file, directory, glob; a --data directory's *_val_*\n"
    "                       shards by default): validation loss every --eval-every steps\n"
    "  --eval-batches N     validation sequences: N x --batch (default 4)\n"
    "  --tokens-format F    auto|llmc|text for --data FILE (default auto)\n"
    "  --seq-len S          tokens per sequence (default 128)\n"
    "  --batch B            sequences per step over all dp replicas (default 8; divisible by --dp)\n"
    "recall task (--data recall):\n"
    "  --recall-format F    adjacent: a key token then its value token (needs an induction circuit);\n"
    "                       fused: one token per pair naming key and value (default adjacent)\n"
    "  --recall-pairs N     key-value pairs per sequence (default seq-len/16)\n"
    "  --recall-queries N   queries per sequence (default 4 x pairs, at most seq-len/2)\n"
    "evaluation:\n"
    "  --eval-every N       evaluate recall accuracy by distance (recall) or the validation loss\n"
    "                       (--val-data) every N steps (default 250; 0: only at the end)\n"
    "  --eval-seqs N        recall sequences per evaluation (default 16)\n"
    "optimisation:\n"
    "  --steps N            total training steps (default 1500)\n"
    "  --lr X               peak learning rate (default 2e-3)\n"
    "  --min-lr X           final learning rate of the cosine decay (default lr/10)\n"
    "  --warmup N           linear warmup steps (default 50)\n"
    "  --weight-decay X     decoupled weight decay (default 0.1)\n"
    "  --decay-all          also decay norms and embeddings\n"
    "  --grad-clip X        clip the global gradient norm to X; 0 disables (default 1)\n"
    "  --beta1 X, --beta2 X AdamW betas (default 0.9, 0.95)\n"
    "  --offload-optimizer DIR  keep the AdamW moments (8 bytes a parameter of the rank's shard) in a\n"
    "                       (deleted-on-exit) file per rank in DIR, its space reserved at start, streamed\n"
    "                       through each step in 4 MiB chunks (the same results bit for bit)\n"
    "  --offload-master     with --offload-optimizer and --zero 3: the rank's fp32 parameter shard in\n"
    "                       that file too, read by each layer's gathers and streamed by the update\n"
    "  --seed N             seed for weights and data (default 1)\n"
    "checkpoints:\n"
    "  --save DIR           write a checkpoint to DIR at the end (and every --save-every steps)\n"
    "  --save-every N       also checkpoint every N steps\n"
    "  --save-shard-mb N    weights above N MB are saved as shards + model.safetensors.index.json\n"
    "                       (default 5000, as transformers; 0: never shard)\n"
    "  --resume DIR         continue the run saved in DIR (same settings required)\n"
    "  --auto-resume        continue the run saved in --save DIR when DIR holds a checkpoint, else\n"
    "                       start it (from --model or the size flags): one command for every\n"
    "                       (re)start of a requeued job\n"
    "  --stop-at N          stop after step N (of the --steps schedule), e.g. to train in slices\n"
    "  --skip-nonfinite N   skip the update of at most N steps whose loss or gradient norm is NaN or\n"
    "                       Inf (each logged); the next one ends the run (default 0: the first does)\n"
    "progress and logs:\n"
    "  --log FILE           JSONL log (rank 0): a run-start record, then one record per step and per\n"
    "                       evaluation; appended to if FILE is a log already (default: a new directory\n"
    "                       runs/<UTC date-time>/ per run, holding train.jsonl; $SEQPAR_RUNS\n"
    "                       replaces runs/)\n"
    "  --trace-step N|last  with --trace FILE: record only step N (or the last step) in the trace\n"
    "  --peak-gflops X      peak for MFU and HFU (default: $SEQPAR_PEAK_GFLOPS, else the best of several\n"
    "                       sgemm trials at start-up, oneDNN's and OpenBLAS's)\n"
    "  --quiet              print only evaluations and the summary\n"
    "  --strategy auto      the planner's pick for the ranks started ('seqpar plan' with their ranks,\n"
    "                       ranks per node, threads and RAM; the grid flags given stay fixed), printed\n"
    "                       as the train command it equals and run; a resume takes the configuration\n"
    "                       the checkpoint recorded\n"
    "  --profile K          with --strategy auto: K training steps of each of the planner's\n"
    "                       --profile-top N (default 3) best on these ranks first, the fastest run\n"
    "checking a job before it runs:\n"
    "  --dry-run            make every check of a run (flags, strategy rules, data, model files,\n"
    "                       --save and --resume, memory per rank and disk tier against --mem-per-rank\n"
    "                       or the node) on every rank, print the memory plan ('seqpar memory') and\n"
    "                       exit 0, or with the one-line refusal the run would give; allocates no\n"
    "                       weights, activations or optimizer state and writes nothing\n"
    "  --ranks P            with --dry-run: check a job of P ranks from this one process, without\n"
    "                       starting them (another cluster's: --ranks-per-node R, --mem-per-rank GIB)\n"
    "  --mem-per-rank GIB   RAM one rank may use: a run whose predicted memory (the memory model\n"
    "                       plus 64 MiB of runtime) exceeds it is refused before it allocates\n"
    "                       (default: this node's RAM over its ranks)\n"
    "  --help               this text\n"
    "  Each step line ends with the elapsed time and an estimate of the time left (ETA); the run\n"
    "  ends by naming its log, model (--save) and trace (--trace).\n"
    "stopping: SIGTERM, SIGUSR1 or SIGINT (to every rank; mpirun forwards only SIGUSR1) stop the run\n"
    "  after the current step: a checkpoint goes to --save DIR (default: checkpoint-stepN next to\n"
    "  --log) and the run exits 0.\n"
    "kernels: the best path this CPU runs (amx, avx512, avx2, scalar), named in the header;\n"
    "  SEQPAR_ISA=avx2|scalar|avx512|amx forces one (a path the CPU lacks is refused; amx = avx512\n"
    "  plus AMX tiles for bf16 attention and oneDNN's bf16 GEMM). The fp32 attention tiles follow\n"
    "  the L2 per core (named in the header); SEQPAR_ATTN_TILES=fwd_bq,fwd_bk,bwd_bk,bwd_bq sets them.\n"
    "  The attention backward sums dq in 2 slots per thread (1 on one thread), never by timing;\n"
    "  SEQPAR_ATTN_DQ_SLOTS=N fixes the count: the same gradients bit for bit on any thread count.\n"
    "  SEQPAR_CHECK_ROUNDED=1 (bf16, for tests): every matrix-multiply operand the model made as bf16\n"
    "  values is checked to be so before its product (one line naming the call if not); 0: no check.\n";
void val_overlap_check(const TokenStream *val, const TokenStream *train) {
    for (int i = 0; i < val->n_shards; i++) /* held out means not trained on */
        for (int j = 0; j < train->n_shards; j++)
            if (same_file(val->paths[i], train->paths[j]))
                die_collective("--val-data and --data share '%s': a validation loss on training data measures nothing "
                               "held out: give held-out shards as --val-data (a --data directory's *_val_* shards are "
                               "held out; a glob takes them in)", val->paths[i]);
}
int train_data_flags_check(const TrainOptions *o, int recall, int vocab_size, const char *cmd) {
    if (o->val_data && recall) die_collective("--val-data needs token data: --data recall reports recall accuracy instead");
    if (o->pack.pack && recall) /* before --eot's own checks: no id makes the recall task packed */
        die_collective("seqpar %s: --pack splits token data at the end-of-text id: pass --data with a token file "
                       "(.bin shard or .txt), not the recall task", cmd);
    return pack_flags_eot(&o->pack, cmd, o->model_dir ? o->model_dir : o->resume_dir, vocab_size);
}
RecallSpec recall_spec_from_options(const TrainOptions *o, int vocab_size) {
    RecallSpec spec = {.format = (RecallFormat)o->recall_format, .vocab_size = vocab_size, .seq_len = o->seq_len,
                       .n_pairs = o->recall_pairs, .n_queries = o->recall_queries};
    recall_spec_finalize(&spec);
    if (!o->recall_queries) { /* several queries per pair: more recall signal per sequence */
        int q = 4 * spec.n_pairs, room = o->seq_len - o->seq_len / 2;
        spec.n_queries = q < room ? q : room;
    }
    return spec;
}
/* train's long options (memory and plan read the same) */
static const struct option TRAIN_OPTIONS[] = {
    SIZE_FLAG_OPTIONS,
    PARALLEL_FLAG_OPTIONS,
    {"model", required_argument, 0, 'm'}, {"data", required_argument, 0, 'd'},
    {"tokens-format", required_argument, 0, 'F'}, {"seq-len", required_argument, 0, 's'},
    {"batch", required_argument, 0, 'b'}, {"steps", required_argument, 0, 'n'},
    {"lr", required_argument, 0, 'l'}, {"min-lr", required_argument, 0, 'L'},
    {"warmup", required_argument, 0, 'w'}, {"weight-decay", required_argument, 0, 'W'},
    {"decay-all", no_argument, 0, 'A'}, {"grad-clip", required_argument, 0, 'g'},
    {"beta1", required_argument, 0, '1'}, {"beta2", required_argument, 0, '2'},
    MEMORY_FLAG_OPTIONS, PACK_FLAG_OPTIONS, {"seed", required_argument, 0, 'r'},
    {"random-init", no_argument, 0, 3101}, {"auto-resume", no_argument, 0, 3107},
    {"eval-every", required_argument, 0, 'e'}, {"eval-seqs", required_argument, 0, 'E'},
    {"val-data", required_argument, 0, 3103}, {"eval-batches", required_argument, 0, 3104},
    {"save", required_argument, 0, 'S'}, {"save-every", required_argument, 0, 'V'},
    {"save-shard-mb", required_argument, 0, 3102},
    {"resume", required_argument, 0, 'R'}, {"log", required_argument, 0, 'o'},
    {"peak-gflops", required_argument, 0, 'p'},
    {"recall-pairs", required_argument, 0, 'P'}, {"recall-queries", required_argument, 0, 'Q'},
    {"recall-format", required_argument, 0, 3105}, {"trace-step", required_argument, 0, 3106},
    {"skip-nonfinite", required_argument, 0, 'K'},
    {"dry-run", no_argument, 0, 3108}, {"ranks", required_argument, 0, 3109},
    {"mem-per-rank", required_argument, 0, 3110}, {"offload-optimizer", required_argument, 0, 3111},
    {"offload-master", no_argument, 0, 3112},
    {"quiet", no_argument, 0, 'q'}, {"stop-at", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
/* arg appended to buf at *len after a space, as one shell word: as it is where every character is
 * plain, else in single quotes (a quote inside as '\''); *len counts past n where it does not fit */
static void shell_word_append(char *buf, size_t n, size_t *len, const char *arg) {
    static const char plain[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+=.,/:@%";
#define PUT(...)                                                                                                       \
    do {                                                                                                               \
        const int k_ = snprintf(buf + (*len < n ? *len : n), *len < n ? n - *len : 0, __VA_ARGS__);                    \
        *len += k_ > 0 ? (size_t)k_ : 0;                                                                               \
    } while (0)
    if (*arg && strspn(arg, plain) == strlen(arg)) {
        PUT(" %s", arg);
        return;
    }
    PUT(" '");
    for (const char *p = arg; *p; p++)
        if (*p == '\'') PUT("'\\''");
        else PUT("%c", *p);
    PUT("'");
#undef PUT
}
int train_flags_except(int argc, char **argv, const char *const *drop, char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = 0;
    const int saved_opterr = opterr;
    opterr = 0;
    optind = 0; /* a fresh scan (glibc: 0 re-initialises) */
    int opt, idx;
    const struct option *opts = options_with_knobs(TRAIN_OPTIONS);
    for (int start = 1; (idx = -1, opt = getopt_long(argc, argv, ":h", opts, &idx)) != -1; start = optind) {
        MemoryFlags unused; /* --checkpoint's mode given as the next word: taken as the parser takes it */
        if (opt == 3001) memory_flags_handle(&unused, "plan", opt, optarg, argc, argv);
        int keep = idx >= 0;
        for (const char *const *d = drop; keep && *d; d++)
            if (!strcmp(opts[idx].name, *d)) keep = 0;
        for (int i = start; keep && i < optind; i++) shell_word_append(buf, n, &len, argv[i]);
    }
    opterr = saved_opterr;
    if (len >= n) return -1;
    if (len) memmove(buf, buf + 1, len); /* the leading space */
    return 0;
}
int shell_words(int argc, char **argv, char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < argc; i++) shell_word_append(buf, n, &len, argv[i]);
    if (len >= n) return -1;
    if (len) memmove(buf, buf + 1, len); /* the leading space */
    return 0;
}
int program_word(const char *program, char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = 0;
    shell_word_append(buf, n, &len, program && strchr(program, '/') ? program : "seqpar");
    if (len >= n) return -1;
    memmove(buf, buf + 1, len); /* the leading space */
    return 0;
}
void parse_train_options(int argc, char **argv, TrainOptions *o, SizeFlags *sf, const char *cmd) {
    memset(o, 0, sizeof *o);
    size_flags_default(sf);
    adamw_config_default(&o->opt);
    o->data = "recall";
    o->seq_len = 128;
    o->batch = 8;
    o->steps = 1500;
    o->seed = 1;
    o->eval_every = 250;
    o->eval_seqs = 16;
    o->eval_batches = 4;
    o->opt.lr = 2e-3f;
    o->opt.warmup_steps = 50;
    parallel_config_default(&o->par);
    o->save_shard_bytes = CHECKPOINT_DEFAULT_SHARD_BYTES;
    const char *peak_env = getenv("SEQPAR_PEAK_GFLOPS"); /* the default of --peak-gflops */
    if (peak_env && *peak_env) o->peak_gflops = parse_double(cmd, "peak-gflops (from SEQPAR_PEAK_GFLOPS)", peak_env, 1e-3, 1e12);
    pack_flags_default(&o->pack);
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_full(argc, argv, ":h", options_with_knobs(TRAIN_OPTIONS), cmd)) != -1) {
        if (size_flags_handle(sf, cmd, opt, optarg)) continue;
        if (parallel_flags_handle(&o->par, cmd, opt, optarg)) continue;
        if (memory_flags_handle(&o->mem, cmd, opt, optarg, argc, argv)) continue;
        if (pack_flags_handle(&o->pack, cmd, opt, optarg)) continue;
        switch (opt) {
        case 'm': o->model_dir = optarg; break;
        case 3101: o->random_init = 1; break;
        case 3107: o->auto_resume = 1; break;
        case 'd': o->data = optarg; break;
        case 'F': o->tokens_format = tokens_format_parse(optarg); break;
        case 's': o->seq_len = (int)parse_long(cmd, "seq-len", optarg, 2, 1L << 30); break;
        case 'b': o->batch = (int)parse_long(cmd, "batch", optarg, 1, 1 << 20); break;
        case 'n': o->steps = parse_long(cmd, "steps", optarg, 0, 1L << 40); break;
        case 'l': o->opt.lr = (float)parse_double(cmd, "lr", optarg, 0, 10); break;
        case 'L': o->opt.min_lr = (float)parse_double(cmd, "min-lr", optarg, 0, 10); o->min_lr_set = 1; break;
        case 'w': o->opt.warmup_steps = parse_long(cmd, "warmup", optarg, 0, 1L << 40); break;
        case 'W': o->opt.weight_decay = (float)parse_double(cmd, "weight-decay", optarg, 0, 10); break;
        case 'A': o->opt.decay_all = 1; break;
        case 'g': o->opt.grad_clip = (float)parse_double(cmd, "grad-clip", optarg, 0, 1e9); break;
        case '1': o->opt.beta1 = (float)parse_double(cmd, "beta1", optarg, 0, 0.999999); break;
        case '2': o->opt.beta2 = (float)parse_double(cmd, "beta2", optarg, 0, 0.999999); break;
        case 'r': o->seed = (uint64_t)parse_long(cmd, "seed", optarg, 0, 1L << 62); break;
        case 'e': o->eval_every = (int)parse_long(cmd, "eval-every", optarg, 0, 1 << 30); break;
        case 'E': o->eval_seqs = (int)parse_long(cmd, "eval-seqs", optarg, 1, 1 << 20); break;
        case 3103: o->val_data = optarg; break;
        case 3104: o->eval_batches = (int)parse_long(cmd, "eval-batches", optarg, 1, 1 << 20); break;
        case 'S': o->save_dir = optarg; break;
        case 3102: o->save_shard_bytes = (uint64_t)(parse_double(cmd, "save-shard-mb", optarg, 0.0, 1e9) * 1e6); break;
        case 'V': o->save_every = (int)parse_long(cmd, "save-every", optarg, 1, 1 << 30); break;
        case 'R': o->resume_dir = optarg; break;
        case 'o': o->log_path = optarg; break;
        case 'p': o->peak_gflops = parse_double(cmd, "peak-gflops", optarg, 1e-3, 1e12); break;
        case 'P': o->recall_pairs = (int)parse_long(cmd, "recall-pairs", optarg, 1, 1 << 28); break;
        case 3105:
            if ((o->recall_format = recall_format_parse(optarg)) < 0)
                die_collective("seqpar train: --recall-format '%s' is not a format: use adjacent or fused", optarg);
            break;
        case 3106:
            o->trace_step = !strcmp(optarg, "last") ? -1 : parse_long(cmd, "trace-step", optarg, 1, 1L << 40);
            break;
        case 'Q': o->recall_queries = (int)parse_long(cmd, "recall-queries", optarg, 1, 1 << 28); break;
        case 'q': o->quiet = 1; break;
        case 3108: o->dry_run = 1; break;
        case 3111:
            if (!*optarg)
                die_collective("seqpar %s: --offload-optimizer needs a directory: name one (an empty path is not the "
                               "current directory)", cmd);
            o->par.offload_optimizer = optarg;
            break;
        case 3112: o->par.offload_master = 1; break;
        case 3109: o->dry_ranks = (int)parse_long(cmd, "ranks", optarg, 1, 1 << 20); break;
        case 3110: o->mem_per_rank = parse_double(cmd, "mem-per-rank", optarg, 1e-3, 1e9) * 1073741824.0; break;
        case 'K': o->skip_nonfinite = (int)parse_long(cmd, "skip-nonfinite", optarg, 0, 1 << 30); break;
        case 'T':
            o->stop_at = parse_long(cmd, "stop-at", optarg, LONG_MIN, 1L << 40);
            if (o->stop_at < 1) /* 0 is "not given" below */
                die_collective("seqpar %s: --stop-at %ld is not a step of the schedule: give 1 to --steps", cmd, o->stop_at);
            break;
        case 'h':
            fputs(HELP_HEAD, stdout);
            fputs(SIZE_FLAGS_HELP, stdout);
            fputs(HELP_TAIL, stdout);
            fputs(MEMORY_FLAGS_HELP, stdout);
            fputs(PACK_FLAGS_HELP, stdout);
            parallel_flags_help(stdout);
            exit(0);
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    offload_flags_check(&o->par, &o->mem);
    if (!o->min_lr_set) o->opt.min_lr = o->opt.lr / 10;
    if (o->opt.min_lr > o->opt.lr) /* the cosine "decay" would raise the rate after warmup */
        die_collective("seqpar %s: --min-lr %g is above --lr %g: the schedule decays from --lr to --min-lr, so give "
                       "--min-lr at most --lr", cmd, (double)o->opt.min_lr, (double)o->opt.lr);
    o->opt.total_steps = o->steps;
    if (o->stop_at > o->steps)
        die_collective("seqpar %s: --stop-at %ld is past --steps %ld: give a step of the schedule (1 to %ld) or "
                       "drop --stop-at", cmd, o->stop_at, o->steps, o->steps);
    if (!o->stop_at) o->stop_at = o->steps;
    if (o->trace_step && !o->par.trace_path)
        die_collective("seqpar train: --trace-step needs --trace FILE (where the trace goes)");
    if (o->trace_step > o->stop_at) /* the trace would hold no step */
        die_collective("seqpar train: --trace-step %ld is past the run's last step, %ld (--steps or --stop-at): give 1 "
                       "to %ld, or 'last'", o->trace_step, o->stop_at, o->stop_at);
    if (o->dry_run && strcmp(cmd, "train") != 0) /* memory and plan read train's table */
        die_collective("seqpar %s: --dry-run is seqpar train's: run seqpar train --dry-run with these flags", cmd);
    if (o->dry_ranks && !o->dry_run) /* mpirun -np P starts the ranks of a real run */
        die_collective("seqpar %s: --ranks %d checks a job of %d ranks without starting them: add --dry-run, or "
                       "start the ranks with mpirun -np %d", cmd, o->dry_ranks, o->dry_ranks, o->dry_ranks);
    if (o->model_dir && o->resume_dir)
        die_collective("seqpar train: --model and --resume both name a model: --resume DIR already holds one");
    if (o->auto_resume && !o->save_dir)
        die_collective("seqpar %s: --auto-resume continues the run in the --save directory: give --save DIR", cmd);
    if (o->auto_resume && o->resume_dir)
        die_collective("seqpar %s: --auto-resume and --resume both name where to continue from: --auto-resume "
                       "continues from --save DIR; drop one of them", cmd);
}

void memory_input_from_options(const TrainOptions *o, SizeFlags *sf, const char *cmd, MemoryModelInput *in) {
    memset(in, 0, sizeof *in);
    LlamaConfig *out = &in->model;
    SeqErr e;
    in->recall_data = !strcmp(o->data, "recall");
    TokenStream ts; /* token data: read for its length, its largest file and (size flags) its vocabulary */
    if (!in->recall_data) {
        if (token_stream_open(&ts, o->data, o->tokens_format, STREAM_TRAIN, &e) != 0) die_collective("%s", e.msg);
        data_length_check(&ts, o->seq_len, o->data); /* train's refusal, so that no plan names a run train refuses */
    }
    if (o->resume_dir) {
        if (checkpoint_read_config(o->resume_dir, out, &e) != 0) die_collective("%s", e.msg);
        size_flags_check(sf, out, cmd, o->resume_dir);
    } else if (o->model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", o->model_dir);
        if (model_dir_check(o->model_dir, &e) != 0 || config_json_read(path, out, &e) != 0) die_collective("%s", e.msg);
        size_flags_check(sf, out, cmd, o->model_dir);
    } else {
        if (!in->recall_data) size_flags_fit_data(sf, &ts, o->data); /* token data sizes the vocabulary, as in train */
        *out = sf->cfg;
        size_flags_validate(out);
    }
    (void)train_data_flags_check(o, in->recall_data, out->vocab_size, cmd);
    if (o->val_data) { /* opened as train opens it: a missing or malformed source is refused alike */
        TokenStream vs;
        if (token_stream_open(&vs, o->val_data, o->tokens_format, STREAM_VAL, &e) != 0) die_collective("%s", e.msg);
        val_overlap_check(&vs, &ts);
        token_stream_close(&vs);
    }
    memory_input_settings(o, in->recall_data ? NULL : &ts, in);
    if (!in->recall_data) token_stream_close(&ts);
    else (void)recall_spec_from_options(o, out->vocab_size); /* the recall task's own limits, as train checks them */
}

void memory_input_settings(const TrainOptions *o, const TokenStream *ts, MemoryModelInput *in) {
    in->data_tokens = 0;
    for (int i = 0; ts && i < ts->n_shards; i++) /* the trainer holds one training file at a time, whole */
        if ((double)ts->counts[i] > in->data_tokens) in->data_tokens = (double)ts->counts[i];
    in->seq_len = o->seq_len;
    in->batch = o->batch;
    in->par = o->par;
    in->checkpoint = o->mem.checkpoint;
    in->ffn_chunks = o->mem.ffn_chunks;
    in->no_stream = o->mem.no_stream;
    in->precision = o->mem.precision;
}
