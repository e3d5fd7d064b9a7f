/* seqpar train: the training loop. Data comes from the built-in associative-recall task
 * (default), an llm.c token shard or a text file; each step runs --batch sequences of --seq-len
 * tokens through the model, clips the global gradient norm and takes an AdamW step. Every step
 * prints and appends to a JSONL log: loss, learning rate, gradient norm, tokens/s, MFU, peak
 * memory. --save writes an atomic checkpoint that Hugging Face loads; --resume continues a run
 * bit-identically. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "core/common.h"
#include "data/recall.h"
#include "data/tokens.h"
#include "io/checkpoint.h"
#include "io/config_json.h"
#include "kernels/sgemm_bench.h"
#include "model/llama.h"
#include "optim/adamw.h"

static const char HELP_HEAD[] =
    "usage: seqpar train [options]\n"
    "\n"
    "Trains a Llama model. With no options: a 2-layer model on the built-in multi-query\n"
    "associative-recall task, printing recall accuracy by key-query distance.\n"
    "\n"
    "model (either --model or the size flags):\n"
    "  --model DIR          Hugging Face model directory (config.json [+ model.safetensors])\n";
static const char HELP_TAIL[] =
    "data:\n"
    "  --data SRC           'recall' (default), an llm.c shard (.bin) or a text file (.txt)\n"
    "  --tokens-format F    auto|llmc|text for --data FILE (default auto)\n"
    "  --seq-len S          tokens per sequence (default 256)\n"
    "  --batch B            sequences per step (default 8)\n"
    "  --recall-pairs N     key-value pairs per recall sequence (default seq-len/16)\n"
    "  --recall-queries N   queries per recall sequence (default = pairs)\n"
    "optimisation:\n"
    "  --steps N            total training steps (default 400)\n"
    "  --lr X               peak learning rate (default 3e-3)\n"
    "  --min-lr X           final learning rate of the cosine decay (default lr/10)\n"
    "  --warmup N           linear warmup steps (default 20)\n"
    "  --weight-decay X     decoupled weight decay (default 0.1)\n"
    "  --decay-all          also decay norms and embeddings\n"
    "  --grad-clip X        clip the global gradient norm to X; 0 disables (default 1)\n"
    "  --beta1 X, --beta2 X AdamW betas (default 0.9, 0.95)\n"
    "  --checkpoint         layer-boundary activation checkpointing (recompute in backward)\n"
    "run:\n"
    "  --seed N             seed for weights and data (default 1)\n"
    "  --eval-every N       evaluate recall accuracy every N steps (default 100; 0: only at the end)\n"
    "  --eval-seqs N        sequences per evaluation (default 16)\n"
    "  --save DIR           write a checkpoint to DIR at the end (and every --save-every steps)\n"
    "  --save-every N       also checkpoint every N steps\n"
    "  --resume DIR         continue the run saved in DIR (same settings required)\n"
    "  --stop-at N          stop after step N (of the --steps schedule), e.g. to train in slices\n"
    "  --log FILE           JSONL log, appended (default runs/train.jsonl)\n"
    "  --threads N          OpenMP/OpenBLAS threads (default: all cores)\n"
    "  --peak-gflops X      peak for MFU (default: measured OpenBLAS sgemm on this machine)\n"
    "  --quiet              print only evaluations and the summary\n"
    "  --help               this text\n";

typedef struct {
    const char *data, *save_dir, *resume_dir, *log_path, *model_dir;
    TokensFormat tokens_format;
    int seq_len, batch, checkpoint, eval_every, eval_seqs, save_every, quiet;
    int recall_pairs, recall_queries;
    long steps, stop_at;
    uint64_t seed;
    double peak_gflops;
    AdamWConfig opt;
    int min_lr_set;
} TrainOptions;

/* The source of training sequences: recall task or a token file read sequentially. */
typedef struct {
    int is_recall;
    RecallSpec spec;
    TokenData td;
    int *distance; /* (S) for recall */
} DataSource;

static void next_sequence(DataSource *ds, TrainerState *st, int S, int *inputs, int *targets) {
    if (ds->is_recall) {
        recall_generate(&ds->spec, &st->data_rng, inputs, targets, ds->distance);
        st->data_cursor++;
        return;
    }
    if (st->data_cursor + (uint64_t)S + 1 > ds->td.n) st->data_cursor = 0;
    const uint32_t *t = ds->td.tokens + st->data_cursor;
    for (int i = 0; i < S; i++) {
        inputs[i] = (int)t[i];
        targets[i] = (int)t[i + 1];
    }
    st->data_cursor += (uint64_t)S;
}

/* Recall accuracy on eval_seqs fresh sequences from a fixed seed (the same set every time). */
static double evaluate_recall(LlamaModel *m, LlamaActs *acts, const SeqAttention *attn, DataSource *ds,
                              const TrainOptions *o, const int *positions, FILE *out) {
    int S = o->seq_len;
    int *inputs = xmalloc(sizeof(int) * S), *targets = xmalloc(sizeof(int) * S), *pred = xmalloc(sizeof(int) * S);
    Rng rng;
    rng_seed(&rng, o->seed ^ 0xE7A1E7A1ull);
    RecallStats stats;
    memset(&stats, 0, sizeof stats);
    for (int s = 0; s < o->eval_seqs; s++) {
        recall_generate(&ds->spec, &rng, inputs, targets, ds->distance);
        llama_forward_backward(m, acts, attn, inputs, targets, positions, S, 1.0f, 0, pred);
        for (int i = 0; i < S; i++)
            if (targets[i] >= 0) recall_stats_add(&stats, ds->distance[i], pred[i] == targets[i]);
    }
    double acc = recall_stats_print(&stats, out);
    xfree(inputs); xfree(targets); xfree(pred);
    return acc;
}

static void record_settings(TrainerState *st, const TrainOptions *o, const LlamaModel *m) {
    trainer_state_set(st, "data", "%s", o->data);
    trainer_state_set(st, "batch", "%d", o->batch);
    trainer_state_set(st, "steps", "%ld", o->steps);
    trainer_state_set(st, "lr", "%a", (double)o->opt.lr);
    trainer_state_set(st, "min_lr", "%a", (double)o->opt.min_lr);
    trainer_state_set(st, "warmup", "%ld", o->opt.warmup_steps);
    trainer_state_set(st, "weight_decay", "%a", (double)o->opt.weight_decay);
    trainer_state_set(st, "grad_clip", "%a", (double)o->opt.grad_clip);
    trainer_state_set(st, "betas", "%a,%a", (double)o->opt.beta1, (double)o->opt.beta2);
    trainer_state_set(st, "decay_all", "%d", o->opt.decay_all);
    trainer_state_set(st, "recall", "%d,%d", o->recall_pairs, o->recall_queries);
    trainer_state_set(st, "params", "%zu", m->table.total);
}

static void parse_train_options(int argc, char **argv, TrainOptions *o, SizeFlags *sf) {
    const char *cmd = "train";
    memset(o, 0, sizeof *o);
    size_flags_default(sf);
    adamw_config_default(&o->opt);
    o->data = "recall";
    o->seq_len = 256;
    o->batch = 8;
    o->steps = 400;
    o->seed = 1;
    o->eval_every = 100;
    o->eval_seqs = 16;
    o->log_path = "runs/train.jsonl";
    o->opt.lr = 3e-3f;
    o->opt.warmup_steps = 20;
    static const struct option opts[] = {
        SIZE_FLAG_OPTIONS,
        {"model", required_argument, 0, 'm'}, {"data", required_argument, 0, 'd'},
        {"tokens-format", required_argument, 0, 'F'}, {"seq-len", required_argument, 0, 's'},
        {"batch", required_argument, 0, 'b'}, {"steps", required_argument, 0, 'n'},
        {"lr", required_argument, 0, 'l'}, {"min-lr", required_argument, 0, 'L'},
        {"warmup", required_argument, 0, 'w'}, {"weight-decay", required_argument, 0, 'W'},
        {"decay-all", no_argument, 0, 'A'}, {"grad-clip", required_argument, 0, 'g'},
        {"beta1", required_argument, 0, '1'}, {"beta2", required_argument, 0, '2'},
        {"checkpoint", no_argument, 0, 'c'}, {"seed", required_argument, 0, 'r'},
        {"eval-every", required_argument, 0, 'e'}, {"eval-seqs", required_argument, 0, 'E'},
        {"save", required_argument, 0, 'S'}, {"save-every", required_argument, 0, 'V'},
        {"resume", required_argument, 0, 'R'}, {"log", required_argument, 0, 'o'},
        {"threads", required_argument, 0, 'j'}, {"peak-gflops", required_argument, 0, 'p'},
        {"recall-pairs", required_argument, 0, 'P'}, {"recall-queries", required_argument, 0, 'Q'},
        {"quiet", no_argument, 0, 'q'}, {"stop-at", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (size_flags_handle(sf, cmd, opt, optarg)) continue;
        switch (opt) {
        case 'm': o->model_dir = optarg; break;
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
        case 'c': o->checkpoint = 1; break;
        case 'r': o->seed = (uint64_t)parse_long(cmd, "seed", optarg, 0, 1L << 62); break;
        case 'e': o->eval_every = (int)parse_long(cmd, "eval-every", optarg, 0, 1 << 30); break;
        case 'E': o->eval_seqs = (int)parse_long(cmd, "eval-seqs", optarg, 1, 1 << 20); break;
        case 'S': o->save_dir = optarg; break;
        case 'V': o->save_every = (int)parse_long(cmd, "save-every", optarg, 1, 1 << 30); break;
        case 'R': o->resume_dir = optarg; break;
        case 'o': o->log_path = optarg; break;
        case 'j': set_threads((int)parse_long(cmd, "threads", optarg, 1, 4096)); break;
        case 'p': o->peak_gflops = parse_double(cmd, "peak-gflops", optarg, 1e-3, 1e12); break;
        case 'P': o->recall_pairs = (int)parse_long(cmd, "recall-pairs", optarg, 1, 1 << 28); break;
        case 'Q': o->recall_queries = (int)parse_long(cmd, "recall-queries", optarg, 1, 1 << 28); break;
        case 'q': o->quiet = 1; break;
        case 'T': o->stop_at = parse_long(cmd, "stop-at", optarg, 1, 1L << 40); break;
        case 'h':
            fputs(HELP_HEAD, stdout);
            fputs(SIZE_FLAGS_HELP, stdout);
            fputs(HELP_TAIL, stdout);
            exit(0);
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    if (!o->min_lr_set) o->opt.min_lr = o->opt.lr / 10;
    o->opt.total_steps = o->steps;
    if (!o->stop_at || o->stop_at > o->steps) o->stop_at = o->steps;
    if (o->model_dir && o->resume_dir)
        die_collective("seqpar train: --model and --resume both name a model: --resume DIR already holds one");
}

int cmd_train(int argc, char **argv) {
    TrainOptions o;
    SizeFlags sf;
    parse_train_options(argc, argv, &o, &sf);
    int S = o.seq_len;

    /* data */
    DataSource ds;
    memset(&ds, 0, sizeof ds);
    ds.is_recall = !strcmp(o.data, "recall");
    if (!ds.is_recall) {
        tokens_load(o.data, o.tokens_format, &ds.td);
        if (ds.td.n < (size_t)S + 1)
            die("--seq-len %d needs %d tokens but '%s' holds %zu: use a shorter --seq-len", S, S + 1, o.data, ds.td.n);
        if (!o.model_dir && !o.resume_dir && sf.cfg.vocab_size <= (int)ds.td.max_token)
            sf.cfg.vocab_size = ds.td.format == TOKENS_TEXT ? 256 : (int)ds.td.max_token + 1;
    }

    /* model */
    LlamaModel model;
    if (o.resume_dir) {
        LlamaConfig cfg;
        checkpoint_load_config(o.resume_dir, &cfg);
        llama_build(&model, &cfg);
    } else if (o.model_dir) {
        model_from_dir(&model, o.model_dir, o.seed);
    } else {
        model_from_size(&model, &sf.cfg, o.seed);
    }
    const LlamaConfig *c = &model.cfg;
    if (!ds.is_recall && (int)ds.td.max_token >= c->vocab_size)
        die("'%s' holds token %u but the model's vocab_size is %d: use a model with a larger vocabulary",
            o.data, ds.td.max_token, c->vocab_size);
    if (ds.is_recall) {
        ds.spec.vocab_size = c->vocab_size;
        ds.spec.seq_len = S;
        ds.spec.n_pairs = o.recall_pairs;
        ds.spec.n_queries = o.recall_queries;
        recall_spec_finalize(&ds.spec);
        o.recall_pairs = ds.spec.n_pairs;
        o.recall_queries = ds.spec.n_queries;
        ds.distance = xmalloc(sizeof(int) * S);
    }

    AdamW opt;
    adamw_init(&opt, &o.opt, 0, model.table.total);
    TrainerState st, now;
    trainer_state_init(&now);
    now.seed = o.seed;
    now.seq_len = S;
    record_settings(&now, &o, &model);
    if (o.resume_dir) {
        checkpoint_load(o.resume_dir, NULL, &model.table, model.params, &opt, &st);
        trainer_state_check(&st, &now, o.resume_dir);
        printf("resumed from %s at step %ld\n", o.resume_dir, st.step);
    } else {
        st = now;
        rng_seed(&st.data_rng, o.seed * 0x9E3779B97F4A7C15ull + 17);
    }

    SeqAttention *attn = local_attention_create();
    LlamaActs *acts = llama_acts_create(&model, attn, S, o.checkpoint);
    int *inputs = xmalloc(sizeof(int) * (size_t)S * o.batch), *targets = xmalloc(sizeof(int) * (size_t)S * o.batch);
    int *positions = xmalloc(sizeof(int) * S);
    for (int i = 0; i < S; i++) positions[i] = i;

    double peak = o.peak_gflops > 0 ? o.peak_gflops : sgemm_peak_gflops(3);
    double flops_per_token = llama_train_flops_per_token(c, S);
    make_dirs(o.log_path, 0);
    FILE *log = xfopen(o.log_path, "a");
    printf("model: %d layers, hidden %d, heads %d (kv %d), head_dim %d, ffn %d, vocab %d: %.3fM parameters\n",
           c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
           c->intermediate_size, c->vocab_size, (double)model.table.total / 1e6);
    printf("data: %s, seq-len %d, batch %d; %d threads; MFU against %.1f GFLOPS (%s)\n", o.data, S, o.batch,
           current_threads(), peak, o.peak_gflops > 0 ? "--peak-gflops" : "measured sgemm");
    if (ds.is_recall)
        printf("recall task: %d pairs, %d queries per sequence, chance accuracy %.3f\n", ds.spec.n_pairs,
               ds.spec.n_queries, 1.0 / ((c->vocab_size - 1) / 2));
    fflush(stdout);

    double last_loss = NAN;
    while (st.step < o.stop_at) {
        double t0 = now_seconds();
        mem_tracked_reset_peak();
        int n_targets = 0;
        for (int b = 0; b < o.batch; b++) {
            next_sequence(&ds, &st, S, inputs + (size_t)b * S, targets + (size_t)b * S);
            for (int i = 0; i < S; i++) n_targets += targets[(size_t)b * S + i] >= 0;
        }
        if (n_targets == 0) die("a batch holds no targets: use a longer --seq-len or more --recall-queries");
        memset(model.grads, 0, sizeof(float) * model.table.total);
        double loss_sum = 0;
        for (int b = 0; b < o.batch; b++)
            loss_sum += llama_forward_backward(&model, acts, attn, inputs + (size_t)b * S, targets + (size_t)b * S,
                                               positions, S, 1.0f / (float)n_targets, 1, NULL);
        double loss = loss_sum / n_targets;
        double norm_sq = grad_norm_sq(model.grads, model.table.total);
        if (!isfinite(loss) || !isfinite(norm_sq))
            die("step %ld: loss %g, gradient norm^2 %g are not finite: lower --lr or raise --warmup", st.step + 1,
                loss, norm_sq);
        float lr = lr_at_step(&o.opt, st.step);
        adamw_update(&opt, &model.table, model.params, model.grads, lr, adamw_clip_scale(&o.opt, norm_sq));
        st.step++;
        double dt = now_seconds() - t0;
        double tok_s = (double)S * o.batch / dt;
        double mfu = tok_s * flops_per_token / (peak * 1e9);
        double peak_mib = (double)mem_tracked_peak() / (1 << 20);
        last_loss = loss;
        if (!o.quiet) {
            printf("step %5ld/%ld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% | peak mem %.1f MiB\n",
                   st.step, o.steps, loss, lr, sqrt(norm_sq), tok_s, 100 * mfu, peak_mib);
            fflush(stdout);
        }
        fprintf(log, "{\"step\": %ld, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.17g, \"tokens_per_s\": %.3f, "
                     "\"mfu\": %.6f, \"peak_mem_bytes\": %zu, \"step_seconds\": %.6f}\n",
                st.step, loss, lr, sqrt(norm_sq), tok_s, mfu, mem_tracked_peak(), dt);
        fflush(log);
        if (ds.is_recall && o.eval_every > 0 && st.step % o.eval_every == 0 && st.step < o.stop_at) {
            printf("step %5ld eval: ", st.step);
            evaluate_recall(&model, acts, attn, &ds, &o, positions, stdout);
        }
        if (o.save_dir && o.save_every > 0 && st.step % o.save_every == 0 && st.step < o.stop_at)
            checkpoint_save(o.save_dir, c, &model.table, model.params, &opt, &st);
    }
    if (ds.is_recall) {
        printf("final eval (step %ld): ", st.step);
        double acc = evaluate_recall(&model, acts, attn, &ds, &o, positions, stdout);
        printf("recall accuracy %.3f (chance %.3f)\n", acc, 1.0 / ((c->vocab_size - 1) / 2));
    }
    if (o.save_dir) {
        checkpoint_save(o.save_dir, c, &model.table, model.params, &opt, &st);
        printf("saved checkpoint to %s (step %ld)\n", o.save_dir, st.step);
    }
    if (!isnan(last_loss)) printf("final loss %.6f\n", last_loss);
    fclose(log);
    xfree(inputs); xfree(targets); xfree(positions);
    llama_acts_free(acts);
    seq_attention_destroy(attn);
    adamw_free(&opt);
    if (ds.is_recall) xfree(ds.distance); else tokens_free(&ds.td);
    llama_free(&model);
    return 0;
}
