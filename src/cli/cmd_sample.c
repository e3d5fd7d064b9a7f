/* seqpar sample: generates a continuation of a prompt from a trained model (a seqpar checkpoint or
 * any Hugging Face Llama directory) in one process, with a key/value cache (model/generate.h), or
 * on several ranks under a strategy, the prompt's prefill split by the strategy's forward and the
 * cache sharded over the ranks (train/dist_generate.h).
 * Byte-level models (vocabulary 256, as `--data file.txt` trains, or 257 with the end-of-text id
 * 256 that scripts/make_shards.py --byte-level writes) take the prompt as text and print text;
 * other models take and print token ids (scripts/make_shards.py --encode / --decode converts). */
#include <getopt.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/cli_common.h"
#include "cli/commands.h"
#include "core/common.h"
#include "io/config_json.h"
#include "io/atomic_file.h"
#include "kernels/bf16.h"
#include "model/generate.h"
#include "model/llama.h"
#include "train/dist_generate.h"
#include "train/prefix_cache.h"
#include "strategies/registry.h"
#include "train/seq_parallel.h"

static const char HELP[] =
    "usage: seqpar sample --model DIR (--prompt TEXT | --prompt-tokens IDS) [options]\n"
    "\n"
    "Generates a continuation of a prompt from a trained model (a checkpoint written by\n"
    "`seqpar train --save`, or any Hugging Face Llama directory), with a key/value cache: in one\n"
    "process, or on N ranks (mpirun -np N seqpar sample --strategy S ...) with the prompt's prefill\n"
    "split by the strategy's own forward and the cache sharded over the ranks (docs/sampling.md):\n"
    "the same tokens as one process for the same seed.\n"
    "\n"
    "  --model DIR            config.json + model.safetensors (or a sharded checkpoint)\n"
    "  --prompt TEXT          byte-level models (vocab 256 or 257): the prompt as UTF-8 bytes\n"
    "  --prompt-tokens IDS    any model: the prompt as comma-separated token ids (for a tokenizer:\n"
    "                         python3 scripts/make_shards.py --tokenizer tokenizer.json --encode TEXT)\n"
    "  --max-new-tokens N     tokens to generate (default 200)\n"
    "  --temperature T        0: greedy (the most likely token each step); else sample from\n"
    "                         softmax(logits / T) (default 0.8)\n"
    "  --top-k K              sample only among the K most likely tokens; 0: all (default 40)\n"
    "  --top-p P              then only among the fewest most likely tokens whose probabilities add\n"
    "                         up to P (nucleus sampling; 0 < P <= 1; default 1: all)\n"
    "  --repetition-penalty R a token already in the prompt or the output: its logit divided by R\n"
    "                         where positive, multiplied by R where negative, before the choice (also\n"
    "                         the greedy one; transformers' repetition_penalty; R > 0; default 1: none)\n"
    "  --seed S               sampling seed (default 1): the same seed gives the same text\n"
    "  --stop-token ID        stop after generating ID, an id below vocab_size; -1: never stop early\n"
    "                         (default: the model's eos_token_id, one or a list, as transformers'\n"
    "                         generate reads it: generation_config.json where the directory has\n"
    "                         one, else config.json; without one, 256 for a vocabulary-257 byte\n"
    "                         model, else none)\n"
    "  --ids                  print token ids (comma-separated) instead of text\n"
    "  --threads N            threads (one process: default 1, as one token at a time is little work\n"
    "                         and more threads mostly wait for each other; larger models may gain\n"
    "                         from more; on ranks: train's default, the CPUs over the ranks)\n"
    "  --strategy S           run on the ranks mpirun started (one rank too: the same path) with\n"
    "                         train's strategy S and its parallel flags (--hp, --cp, --layout, the\n"
    "                         strategy's knobs; every rank splits the one sequence: no --dp, --zero)\n"
    "  --continue-prompt TEXT, --continue-tokens IDS\n"
    "                         a second turn: after the first continuation, these tokens follow\n"
    "                         (after the last generated one) and --max-new-tokens more are generated:\n"
    "                         what one process gives for the prompt, the first continuation and TEXT\n"
    "                         as one prompt. On ranks the block runs against the sharded cache\n"
    "                         (docs/sampling.md); ids output: the second continuation on a line of its own\n"
    "  --continue-scheme S    on ranks: auto (the one moving fewer bytes), pass-q or pass-kv\n"
    "  --precision P          fp32 (default) or bf16: train's bf16 forward (docs/bf16.md): every matrix\n"
    "                         multiply on bf16 operands with fp32 accumulation, attention on bf16\n"
    "                         q, k, v; the key/value cache kept in bf16 (half the bytes), in one\n"
    "                         process and on ranks alike; logits and sampling in fp32\n"
    "  --prefix-cache DIR     keep the prompt's key/value cache in DIR (each rank its shard, and a\n"
    "                         manifest): a later run whose prompt starts with tokens of the cached\n"
    "                         prompt loads them and prefills only the rest; a prompt that differs\n"
    "                         sooner reuses what it shares and replaces the cache; another model,\n"
    "                         strategy or rank count, or a damaged file, is refused (docs/sampling.md)\n"
    "  --prefill-block N      run a block of new tokens after a cache (the rest of a cached prompt, a\n"
    "                         second turn; one process: any prompt) N tokens at a time (default 512)\n"
    "  --prompt-logits FILE   also write the logits after every prompt token: prompt length x\n"
    "                         vocab_size float32, little-endian, row by row (for checks); with a\n"
    "                         second turn, then those after each token of its block (the first\n"
    "                         turn's last token and the continuation)\n"
    "  --help                 this text\n"
    "Output: byte-level models print the prompt and its continuation as text (the end-of-text id\n"
    "as a newline); other models print the generated ids. Speed goes to stderr.\n";

enum { SAMPLE_MAX_STOPS = 64 }; /* eos ids a model may list (Llama 3 lists 3) */

typedef struct {
    const char *model_dir, *prompt, *prompt_tokens;
    long max_new;
    SampleParams sp;
    int ids, stop_set;
    long stop_token;
    uint64_t seed;
    ParallelConfig pc;
    const char *prompt_logits; /* --prompt-logits FILE */
    const char *cont, *cont_tokens; /* --continue-prompt TEXT, --continue-tokens IDS */
    KvScheme scheme;                /* --continue-scheme */
    const char *prefix_dir;         /* --prefix-cache DIR */
    int prefill_block;              /* --prefill-block N */
    int precision;                  /* --precision: PRECISION_FP32 or PRECISION_BF16 */
} SampleOptions;

static void parse_sample_options(int argc, char **argv, SampleOptions *o) {
    const char *cmd = "sample";
    memset(o, 0, sizeof *o);
    o->max_new = 200;
    o->sp = (SampleParams){.temperature = 0.8, .top_k = 40, .top_p = 1, .repetition_penalty = 1};
    o->seed = 1;
    o->prefill_block = 512;
    parallel_config_default(&o->pc);
    static const struct option opts[] = {
        PARALLEL_FLAG_OPTIONS, {"prompt-logits", required_argument, 0, 'L'},
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"prompt-tokens", required_argument, 0, 'P'}, {"max-new-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'q'}, {"repetition-penalty", required_argument, 0, 'r'},
        {"seed", required_argument, 0, 's'}, {"stop-token", required_argument, 0, 'x'},
        {"ids", no_argument, 0, 'i'}, {"continue-prompt", required_argument, 0, 'C'},
        {"continue-tokens", required_argument, 0, 'T'}, {"continue-scheme", required_argument, 0, 'S'},
        {"prefix-cache", required_argument, 0, 'K'}, {"prefill-block", required_argument, 0, 'B'},
        {"precision", required_argument, 0, 'R'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_full(argc, argv, ":h", options_with_knobs(opts), cmd)) != -1) {
        if (parallel_flags_handle(&o->pc, cmd, opt, optarg)) continue;
        switch (opt) {
        case 'm': o->model_dir = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'P': o->prompt_tokens = optarg; break;
        case 'n': o->max_new = parse_long(cmd, "max-new-tokens", optarg, 0, 1L << 24); break;
        case 't': o->sp.temperature = parse_double(cmd, "temperature", optarg, 0, 100); break;
        case 'k': o->sp.top_k = (int)parse_long(cmd, "top-k", optarg, 0, 1L << 30); break;
        case 'q':
            o->sp.top_p = parse_double(cmd, "top-p", optarg, 0, 1);
            if (!(o->sp.top_p > 0))
                die_collective("seqpar sample: --top-p 0 keeps no token: give a probability above 0 (1: all tokens)");
            break;
        case 'r':
            o->sp.repetition_penalty = parse_double(cmd, "repetition-penalty", optarg, 0, 1e6);
            if (!(o->sp.repetition_penalty > 0))
                die_collective("seqpar sample: --repetition-penalty 0 divides by zero: give a factor above 0 (1: no "
                               "penalty; above 1 penalises repeats)");
            break;
        case 's': o->seed = (uint64_t)parse_long(cmd, "seed", optarg, 0, 1L << 62); break;
        case 'x': o->stop_token = parse_long(cmd, "stop-token", optarg, -1, (1L << 31) - 2); o->stop_set = 1; break;
        case 'i': o->ids = 1; break;
        case 'L': o->prompt_logits = optarg; break;
        case 'C': o->cont = optarg; break;
        case 'T': o->cont_tokens = optarg; break;
        case 'K': o->prefix_dir = optarg; break;
        case 'B': o->prefill_block = (int)parse_long(cmd, "prefill-block", optarg, 1, 1L << 30); break;
        case 'S':
            if (!strcmp(optarg, "auto")) o->scheme = KV_AUTO;
            else if (!strcmp(optarg, "pass-q")) o->scheme = KV_PASS_Q;
            else if (!strcmp(optarg, "pass-kv")) o->scheme = KV_PASS_KV;
            else die_collective("seqpar sample: --continue-scheme '%s' is not one: give auto, pass-q or pass-kv", optarg);
            break;
        case 'R':
            o->precision = precision_parse(optarg);
            if (o->precision < 0) die_collective("seqpar sample: --precision expects fp32 or bf16, got '%s'", optarg);
            break;
        case 'h':
            fputs(HELP, stdout);
            parallel_flags_help(stdout);
            exit(0);
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    if (!o->model_dir) die_collective("seqpar sample: --model DIR is required: a checkpoint or Hugging Face Llama directory");
    if (!o->prompt == !o->prompt_tokens)
        die_collective("seqpar sample: give exactly one of --prompt TEXT (byte-level models) and --prompt-tokens IDS");
    if (o->cont && o->cont_tokens)
        die_collective("seqpar sample: give at most one of --continue-prompt TEXT and --continue-tokens IDS");
}

/* "1,2, 3" -> ids: one id between commas (spaces around it allowed); dies naming a bad list. */
static int *parse_ids(const char *flag, const char *s, int *n_out) {
    size_t cap = strlen(s) / 2 + 1;
    int *ids = xmalloc(sizeof(int) * cap);
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || v > 0x7ffffffe)
            die_collective("seqpar sample: --%s expects non-negative token ids separated by commas (e.g. "
                           "\"1,2,3\"), got '%s'", flag, s);
        ids[n++] = (int)v;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',')
            die_collective("seqpar sample: --%s expects non-negative token ids separated by commas (e.g. "
                           "\"1,2,3\"), got '%s'", flag, s);
        p++;
    }
    *n_out = n;
    return ids;
}

/* A prompt's tokens: `text` as bytes (byte-level models) or `ids` (flag names the flags); dies
 * naming an empty prompt, a text prompt for another model or an id outside the vocabulary. */
static int *read_prompt(const char *text_flag, const char *ids_flag, const char *text, const char *ids,
                        const char *model_dir, int V, int *n_out) {
    int n = 0, *prompt;
    if (text) {
        if (V != 256 && V != 257)
            die_collective("seqpar sample: '%s' has vocab_size %d, so it is not a byte-level model and --%s TEXT "
                           "cannot be encoded: pass --%s IDS (python3 scripts/make_shards.py --tokenizer "
                           "tokenizer.json --encode TEXT prints them)", model_dir, V, text_flag, ids_flag);
        n = (int)strlen(text);
        if (n == 0) die_collective("seqpar sample: --%s is empty: give at least one character", text_flag);
        prompt = xmalloc(sizeof(int) * (size_t)n);
        for (int i = 0; i < n; i++) prompt[i] = (unsigned char)text[i];
    } else {
        prompt = parse_ids(ids_flag, ids, &n);
        for (int i = 0; i < n; i++)
            if (prompt[i] >= V)
                die_collective("seqpar sample: %s token %d is outside the vocabulary of '%s' (vocab_size %d): give "
                               "ids from 0 to %d, as the model's tokenizer makes them",
                               strcmp(ids_flag, "prompt-tokens") ? "continuation" : "prompt", prompt[i], model_dir, V,
                               V - 1);
    }
    *n_out = n;
    return prompt;
}

/* A byte-level model's token as text: bytes as they are, the end-of-text id as a newline. */
static void put_token(int id, int as_ids, int first) {
    if (as_ids) printf(first ? "%d" : ",%d", id);
    else if (id < 256) putchar(id);
    else putchar('\n');
}

/* --prefix-cache DIR read for this run (collective: every rank ends alike on a problem). */
static void open_prefix(const SampleOptions *o, const LlamaModel *m, const char *strategy, int ranks,
                        const int *prompt, int n_prompt, PrefixCache *pc, PrefixIdent *id) {
    const LlamaConfig *c = &m->cfg;
    *id = (PrefixIdent){.dtype = o->precision == PRECISION_BF16 ? "bf16" : "f32", .strategy = strategy, .ranks = ranks, .layers = c->num_hidden_layers,
                        .kv_heads = c->num_key_value_heads, .head_dim = c->head_dim};
    SeqErr e;
    int rc = prefix_model_id(m, o->model_dir, &id->model, &e);
    if (!rc) rc = prefix_cache_open(pc, o->prefix_dir, id, prompt, n_prompt, &e);
    if (rc) {
        SeqErr w;
        snprintf(w.msg, sizeof w.msg, "seqpar sample: %.1500s", e.msg);
        die_if_any_rank(&w);
    }
    die_if_any_rank(NULL);
}

/* What the prefix cache gave this run, on stderr. */
static void say_prefix(const char *dir, const PrefixCache *pc, int n_prompt, double t_load, double t_save) {
    fprintf(stderr, "seqpar sample: prefix cache %s: ", dir);
    if (!pc->found) fprintf(stderr, "empty: prefilled the prompt's %d tokens", n_prompt);
    else if (pc->common == n_prompt)
        fprintf(stderr, "the prompt is %s the cached prompt's %d tokens: reused the cache of %d, ran the last one again",
                pc->n_tokens == n_prompt ? "all" : "the start of", pc->n_tokens, pc->reuse);
    else if (pc->common == pc->n_tokens)
        fprintf(stderr, "the prompt continues the cached %d tokens: reused their cache, prefilled the %d new ones",
                pc->n_tokens, n_prompt - pc->reuse);
    else if (pc->common > 0)
        fprintf(stderr, "the prompt differs from the cached prompt (%d tokens) at token %d: reused the cache of the %d "
                "before it, prefilled the other %d", pc->n_tokens, pc->common, pc->reuse, n_prompt - pc->reuse);
    else
        fprintf(stderr, "the prompt differs from the cached prompt (%d tokens) at its first token: prefilled all %d "
                "from scratch", pc->n_tokens, n_prompt);
    if (pc->reuse > 0) fprintf(stderr, " (loaded in %.3f s)", t_load);
    if (pc->save) fprintf(stderr, "; saved this prompt's cache in %.3f s\n", t_save);
    else fprintf(stderr, "; the cache kept as it is\n");
}

int cmd_sample(int argc, char **argv) {
    SampleOptions o;
    parse_sample_options(argc, argv, &o);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int dist = world > 1 || o.pc.strategy; /* the ranks' path (one rank too, given a strategy) */
    if (dist && o.pc.zero)
        die_collective("seqpar sample: --zero %d shards gradients and optimizer state, which generation has none of: "
                       "drop --zero", o.pc.zero);
    if (dist && o.pc.dp > 1)
        die_collective("seqpar sample generates one sequence, which every rank splits: drop --dp %d", o.pc.dp);
    if (dist && o.pc.offload_dir)
        die_collective("seqpar sample: --offload-dir moves training's chunks and checkpointed layers, which generation "
                       "keeps none of: drop --offload-dir");
    if (o.prompt_logits) file_target_check(o.prompt_logits);
    if (!dist) set_threads(o.pc.threads > 0 ? o.pc.threads : 1);
    LlamaModel model;
    model_from_dir(&model, o.model_dir, 1, 0);
    xfree(model.grads); /* no backward: no gradients (calloc'd and never written, so never resident) */
    model.grads = NULL;
    mem_tracked_reset_peak(); /* the peak printed at the end is the run's, as `seqpar memory --sample` counts it */
    int V = model.cfg.vocab_size, byte_level = V == 256 || V == 257;
    int n_prompt = 0, *prompt = read_prompt("prompt", "prompt-tokens", o.prompt, o.prompt_tokens, o.model_dir, V, &n_prompt);
    int n_cont = 0, *cont = o.cont || o.cont_tokens ? read_prompt("continue-prompt", "continue-tokens", o.cont,
                                                                  o.cont_tokens, o.model_dir, V, &n_cont) : NULL;
    const LlamaConfig *mc = &model.cfg;
    if (cont && (long)n_prompt + o.max_new + n_cont > mc->max_position_embeddings)
        die_collective("seqpar sample: the prompt (%d tokens), --max-new-tokens %ld and the continuation (%d tokens) "
                       "reach past the %d positions of '%s': give fewer new tokens or shorter prompts", n_prompt,
                       o.max_new, n_cont, mc->max_position_embeddings, o.model_dir);
    if (n_prompt > mc->max_position_embeddings) { /* positions past those the model was made for */
        char scaling[96] = "";
        if (mc->rope_type != LLAMA_ROPE_DEFAULT)
            snprintf(scaling, sizeof scaling, ", its %s RoPE scaling by %g included", llama_rope_type_name(mc->rope_type),
                     mc->rope_factor);
        die_collective("seqpar sample: the prompt has %d tokens, past the %d positions of '%s' (max_position_embeddings "
                       "in its config.json%s): give a prompt of at most %d tokens", n_prompt, mc->max_position_embeddings,
                       o.model_dir, scaling, mc->max_position_embeddings);
    }
    if (o.stop_set && o.stop_token >= V) /* no token the model makes: it never stopped */
        die_collective("seqpar sample: --stop-token %ld is outside the vocabulary of '%s' (vocab_size %d): give an id "
                       "from 0 to %d, or -1 (never stop early)", o.stop_token, o.model_dir, V, V - 1);
    /* where generation stops: --stop-token, else the model's eos_token_id as transformers' generate
     * reads it (generation_config.json where the directory has one, else config.json; an integer
     * or a list), else a byte model's end-of-text id 256 */
    int stops[SAMPLE_MAX_STOPS], n_stops = 0;
    if (o.stop_set) {
        if (o.stop_token >= 0) stops[n_stops++] = (int)o.stop_token;
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/generation_config.json", o.model_dir);
        SeqErr ee;
        int rc = config_json_eos_ids(path, stops, SAMPLE_MAX_STOPS, &n_stops, &ee);
        if (rc == 1) {
            snprintf(path, sizeof path, "%s/config.json", o.model_dir);
            rc = config_json_eos_ids(path, stops, SAMPLE_MAX_STOPS, &n_stops, &ee);
        }
        if (rc < 0) die_collective("seqpar sample: %s", ee.msg);
        if (n_stops == 0 && V == 257) stops[n_stops++] = 256; /* none named: a byte model's end-of-text */
    }
    int as_ids = o.ids || !byte_level;

    /* a second turn appends the continuation and as many new tokens again */
    long total = (long)n_prompt + o.max_new + (cont ? n_cont + o.max_new : 0);
    if (total > (1L << 30)) die_collective("seqpar sample: prompt + --max-new-tokens exceeds 2^30 tokens");
    Generator g;
    DistGenerator dg;
    SeqParallel par;
    SeqErr e;
    const int block = cont ? n_cont + 1 : 0; /* the continuation after the last generated token, unfed yet */
    int root = 1, chunk = n_prompt > block ? n_prompt : block;
    if (chunk > o.prefill_block) chunk = o.prefill_block;
    PrefixCache pc = {0};
    PrefixIdent pid = {0};
    float *logits = xmalloc(sizeof(float) * (size_t)V);
    /* the prompt's rows, then (a second turn) the block's */
    float *prompt_logits = o.prompt_logits ? xmalloc(sizeof(float) * (size_t)(n_prompt + block) * V) : NULL;
    if (dist) {
        const Strategy *st = strategy_named(o.pc.strategy);
        int hp = 1, cp = 1;
        char *grid = st && !o.pc.hp && !o.pc.cp && !o.pc.dp
                         ? strategy_grid(st, 0, 0, world, model.cfg.num_attention_heads, &hp, &cp) : NULL;
        if (st && !grid && !o.pc.hp && !o.pc.cp && !o.pc.dp && hp * cp < world)
            o.pc.cp = world; /* 2d's rule gives the ranks no split of its own: the context ring takes them all */
        xfree(grid);
        o.pc.wire_bf16 = o.precision == PRECISION_BF16; /* the strategies' bf16 forward, as train's */
        seq_parallel_check_fit(&par, &o.pc, &model.cfg, n_prompt);
        /* bf16: the prefill's attention takes bf16 q, k, v but keeps its probabilities fp32 (the fp32
         * kernel, train's on a CPU without AVX512_BF16), as one process's and decode's attention does */
        par.params.attn_bf16 = 0;
        if (par.topo.dp > 1)
            die_collective("seqpar sample generates one sequence, which every rank splits, but --strategy %s splits it "
                           "over hp %d x cp %d = %d of the %d ranks (the rest would be data parallel): give --hp and --cp "
                           "with hp x cp = %d", par.strategy->name, par.topo.hp, par.topo.cp, par.topo.sp, world, world);
        seq_parallel_finish(&par, &model.cfg, model.table.total);
        root = par.topo.world_rank == 0;
        if (o.prefix_dir)
            open_prefix(&o, &model, par.strategy ? par.strategy->name : o.pc.strategy, world, prompt, n_prompt, &pc, &pid);
        /* the block after a cache: a second turn's, or the rest of a prompt a cached prefix starts */
        int most = pc.found && n_prompt - pc.reuse > block ? n_prompt - pc.reuse : block;
        dist_generator_init(&dg, &model, &par, n_prompt, total - n_prompt, most < o.prefill_block ? most : o.prefill_block);
        if (root) {
            char desc[768];
            seq_parallel_describe(&par, desc, sizeof desc);
            if (pc.found && pc.reuse > 0) /* the strategy's forward does not run: the cache's rows stand for it */
                fprintf(stderr, "seqpar sample: %s; prompt %d tokens, %d of them from the prefix cache\n", desc,
                        n_prompt, pc.reuse);
            else
                fprintf(stderr, "seqpar sample: %s; prompt %d tokens run as %d (padded at its end to what the "
                        "strategy splits)\n", desc, n_prompt, par.seq_len);
        }
    } else {
        if (generator_init(&g, &model, (int)total, chunk, &e) != 0 || generator_set_precision(&g, o.precision, &e) != 0)
            die_collective("%s", e.msg);
        if (o.prefix_dir) open_prefix(&o, &model, "none", 1, prompt, n_prompt, &pc, &pid);
    }
    if (root && o.precision == PRECISION_BF16) {
        char b16[256];
        bf16_describe(b16, sizeof b16);
        fprintf(stderr, "seqpar sample: precision bf16 (bf16 path: %s); key/value cache in bf16\n", b16);
    }
    const int hit = pc.found && pc.reuse > 0; /* rows to load */
    const int skip = hit ? pc.reuse : 0;      /* prompt rows this run does not run (their logits not made) */
    int *context = xmalloc(sizeof(int) * (size_t)total); /* the prompt, then each token made */
    memcpy(context, prompt, sizeof(int) * (size_t)n_prompt);
    Rng rng;
    rng_seed(&rng, o.seed);

    double t0 = now_seconds(), c0 = cpu_seconds(), t_load = 0, t_save = 0, pf_q = 0, pf_kv = 0;
    KvScheme pf_scheme = KV_PASS_Q;
    if (hit) { /* the cached prefix's rows loaded, the rest of the prompt run after them */
        int rc = dist ? prefix_cache_load_dist(&pc, o.prefix_dir, &dg, total - pc.reuse, &e)
                      : prefix_cache_load_one(&pc, o.prefix_dir, &g, &e);
        if (rc) {
            SeqErr w;
            snprintf(w.msg, sizeof w.msg, "seqpar sample: %.1500s", e.msg);
            die_if_any_rank(&w);
        }
        die_if_any_rank(NULL);
        if (dist) prefix_cache_loaded(&pc, &dg);
        t_load = now_seconds() - t0;
    }
    if (dist && hit) {
        if (dist_generator_continue_blocks(&dg, prompt + skip, n_prompt - skip, o.prefill_block, o.scheme,
                                           prompt_logits ? prompt_logits + (size_t)skip * V : NULL, logits, &pf_scheme,
                                           &pf_q, &pf_kv, &e) != 0)
            die_collective("%s", e.msg);
    } else if (dist) {
        dist_generator_prefill(&dg, prompt, logits, prompt_logits);
    } else {
        for (int i = skip; i < n_prompt; i += chunk) {
            int n = n_prompt - i < chunk ? n_prompt - i : chunk;
            if (generator_forward(&g, prompt + i, n, prompt_logits ? prompt_logits + (size_t)i * V : NULL, logits, &e) != 0)
                die_collective("%s", e.msg);
        }
    }
    double t_prompt = now_seconds() - t0, c_prompt = cpu_seconds() - c0;
    if (o.prefix_dir && pc.save) {
        double ts = now_seconds();
        if ((dist ? prefix_cache_save_dist(&pc, o.prefix_dir, &pid, prompt, n_prompt, &dg, &e)
                  : prefix_cache_save_one(&pc, o.prefix_dir, &pid, prompt, n_prompt, &g, &e)) != 0)
            die_collective("seqpar sample: %.1500s", e.msg); /* every rank has the message */
        t_save = now_seconds() - ts;
    }
    if (o.prefix_dir && root) {
        say_prefix(o.prefix_dir, &pc, n_prompt, t_load, t_save);
        if (dist && hit)
            fprintf(stderr, "seqpar sample: prefix cache: %d new prompt tokens after %d cached: %s (%.3f MB) over %s (%.3f "
                    "MB)%s\n", n_prompt - skip, skip, kv_scheme_name(pf_scheme),
                    (pf_scheme == KV_PASS_Q ? pf_q : pf_kv) / 1e6, kv_scheme_name(pf_scheme == KV_PASS_Q ? KV_PASS_KV : KV_PASS_Q),
                    (pf_scheme == KV_PASS_Q ? pf_kv : pf_q) / 1e6, o.scheme != KV_AUTO ? ", as --continue-scheme asks" : ": fewer bytes");
        if (hit && prompt_logits)
            fprintf(stderr, "seqpar sample: --prompt-logits %s: the rows of prompt tokens %d to %d (the cached %d before "
                    "them were not run)\n", o.prompt_logits, skip, n_prompt - 1, skip);
    }
    if (root && !as_ids) /* the prompt as text first, whichever way it was given */
        for (int i = 0; i < n_prompt; i++) put_token(prompt[i], 0, 0);
    long made = 0, len = n_prompt; /* tokens made in all; the context's length */
    double t_gen = 0, c_gen = 0, t_cont = 0, moved = 0;
    KvScheme scheme = KV_PASS_Q;
    int T = 0; /* the continuation's block */
    for (int turn = 0; turn < (cont ? 2 : 1); turn++) {
        if (turn == 1) { /* the continuation, after the first turn's last token (made, not fed yet) */
            int *blk = xmalloc(sizeof(int) * (size_t)block);
            if (len > n_prompt) blk[T++] = context[len - 1];
            memcpy(blk + T, cont, sizeof(int) * (size_t)n_cont);
            T += n_cont;
            memcpy(context + len, cont, sizeof(int) * (size_t)n_cont);
            len += n_cont;
            if (root) {
                if (as_ids) putchar('\n');
                else
                    for (int i = 0; i < n_cont; i++) put_token(cont[i], 0, 0);
            }
            double t2 = now_seconds();
            if (dist) {
                double pq, pkv, before = (double)comm_stats_bytes(&par.comm->stats, COMM_TEAM);
                const int cached = dg.gen.len;
                if (dist_generator_continue_blocks(&dg, blk, T, o.prefill_block, o.scheme,
                                                   prompt_logits ? prompt_logits + (size_t)n_prompt * V : NULL, logits,
                                                   &scheme, &pq, &pkv, &e) != 0)
                    die_collective("%s", e.msg);
                char pieces[64] = "";
                if (T > dg.gen.max_chunk)
                    snprintf(pieces, sizeof pieces, ", in %d blocks of at most %d", (T + dg.gen.max_chunk - 1) / dg.gen.max_chunk,
                             dg.gen.max_chunk);
                if (root)
                    fprintf(stderr, "seqpar sample: continue: %d new tokens after %d cached: %s (%.3f MB) over %s (%.3f "
                            "MB)%s%s\n", T, cached, kv_scheme_name(scheme), (scheme == KV_PASS_Q ? pq : pkv) / 1e6,
                            kv_scheme_name(scheme == KV_PASS_Q ? KV_PASS_KV : KV_PASS_Q),
                            (scheme == KV_PASS_Q ? pkv : pq) / 1e6,
                            o.scheme != KV_AUTO ? ", as --continue-scheme asks" : ": fewer bytes", pieces);
                moved = (double)comm_stats_bytes(&par.comm->stats, COMM_TEAM) - before;
                if (world > 1) comm_control_allreduce(par.comm, "MPI_Iallreduce (continue bytes)", &moved, 1, MPI_DOUBLE,
                                                      MPI_SUM, par.topo.world);
            } else {
                for (int i = 0; i < T; i += chunk)
                    if (generator_forward(&g, blk + i, T - i < chunk ? T - i : chunk,
                                          prompt_logits ? prompt_logits + (size_t)(n_prompt + i) * V : NULL, logits, &e) != 0)
                        die_collective("%s", e.msg);
            }
            t_cont = now_seconds() - t2;
            xfree(blk);
        }
        double t1 = now_seconds(), c1 = cpu_seconds();
        for (long turn_made = 0; turn_made < o.max_new; turn_made++) {
            int next = dist ? dist_generator_choose(&dg, logits, &o.sp, context, len, &rng)
                            : sample_next_token(logits, V, &o.sp, context, len, &rng);
            context[len++] = next;
            made++;
            if (root) {
                put_token(next, as_ids, turn_made == 0);
                fflush(stdout);
            }
            int stop = 0;
            for (int k = 0; k < n_stops; k++) stop |= next == stops[k];
            if (stop) break;
            if (turn_made + 1 < o.max_new &&
                (dist ? dist_generator_step(&dg, next, logits, &e) : generator_forward(&g, &next, 1, NULL, logits, &e)) != 0)
                die_collective("%s", e.msg);
        }
        t_gen += now_seconds() - t1;
        c_gen += cpu_seconds() - c1;
    }
    if (root) {
        putchar('\n');
        fflush(stdout);
    }
    int failed = 0;
    if (root && prompt_logits) {
        AtomicFile af;
        failed = atomic_open(&af, o.prompt_logits, &e) != 0;
        if (!failed) { /* little-endian float32, as this machine stores them (x86-64, the build's target) */
            atomic_write(&af, prompt_logits + (size_t)skip * V, sizeof(float) * (size_t)(n_prompt - skip + T) * V);
            failed = atomic_commit(&af, &e) != 0;
        }
        if (failed) fprintf(stderr, "seqpar: error: %s\n", e.msg);
    }
    if (dist) {
        unsigned long long cache = dist_generator_cache_bytes(&dg), most = cache;
        double times[3] = {t_prompt, t_gen, t_cont}, peak[2] = {(double)mem_tracked_peak(), (double)mem_peak_rss()};
        if (world > 1) {
            comm_control_allreduce(par.comm, "MPI_Iallreduce (sample peaks)", peak, 2, MPI_DOUBLE, MPI_MAX, par.topo.world);
            comm_control_allreduce(par.comm, "MPI_Iallreduce (sample memory)", &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX,
                                   par.topo.world);
            comm_control_allreduce(par.comm, "MPI_Iallreduce (sample times)", times, 3, MPI_DOUBLE, MPI_MAX, par.topo.world);
            comm_control_allreduce(par.comm, "MPI_Iallreduce (sample status)", &failed, 1, MPI_INT, MPI_MAX, par.topo.world);
        }
        t_prompt = times[0];
        t_gen = times[1];
        t_cont = times[2];
        if (root && cont)
            fprintf(stderr, "seqpar sample: continue: %d tokens by %s in %.3f s, %.3f MB moved (all ranks)\n", T,
                    kv_scheme_name(scheme), t_cont, moved / 1e6);
        if (root)
            fprintf(stderr, "seqpar sample: %d ranks: prefill %d tokens in %.3f s (%.1f tokens/s); generated %ld tokens in "
                    "%.3f s (%.2f ms/token); key/value cache %llu bytes (%.3f MiB) on the largest rank\n", world, n_prompt - skip,
                    t_prompt, t_prompt > 0 ? (n_prompt - skip) / t_prompt : 0.0, made, t_gen,
                    made > 0 ? 1e3 * t_gen / (double)made : 0.0, most, (double)most / (1 << 20));
        if (root) /* what `seqpar memory --sample` estimates: the tracked allocations; RSS adds the runtimes' */
            fprintf(stderr, "seqpar sample: peak memory of the largest rank: %.1f MiB tracked, %.1f MiB resident\n",
                    peak[0] / (1 << 20), peak[1] / (1 << 20));
        dist_generator_free(&dg);
        parallel_free_or_die(&par);
        if (failed) die_collective("seqpar sample: --prompt-logits %s could not be written", o.prompt_logits);
    } else {
        fprintf(stderr, "seqpar sample: prompt %d tokens in %.3f s (CPU %.3f s); generated %ld tokens in %.3f s (CPU %.3f s): "
                "%.1f tokens/s\n", n_prompt - skip, t_prompt, c_prompt, made, t_gen, c_gen, t_gen > 0 ? (double)made / t_gen : 0.0);
        fprintf(stderr, "seqpar sample: peak memory: %.1f MiB tracked, %.1f MiB resident\n",
                (double)mem_tracked_peak() / (1 << 20), (double)mem_peak_rss() / (1 << 20));
        generator_free(&g);
        if (failed) exit(1);
    }
    xfree(logits);
    xfree(prompt_logits);
    xfree(context);
    xfree(prompt);
    xfree(cont);
    prefix_cache_free(&pc);
    llama_free(&model);
    return 0;
}
