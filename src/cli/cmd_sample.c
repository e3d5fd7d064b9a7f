/* seqpar sample: generates a continuation of a prompt from a trained model (a seqpar checkpoint or
 * any Hugging Face Llama directory) in one process, with a key/value cache (model/generate.h).
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
#include "model/generate.h"
#include "model/llama.h"

static const char HELP[] =
    "usage: seqpar sample --model DIR (--prompt TEXT | --prompt-tokens IDS) [options]\n"
    "\n"
    "Generates a continuation of a prompt from a trained model (a checkpoint written by\n"
    "`seqpar train --save`, or any Hugging Face Llama directory), one process, with a key/value cache.\n"
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
    "  --threads N            threads (default 1: one token at a time is little work, and more threads\n"
    "                         mostly wait for each other; larger models may gain from more)\n"
    "  --help                 this text\n"
    "Output: byte-level models print the prompt and its continuation as text (the end-of-text id\n"
    "as a newline); other models print the generated ids. Speed goes to stderr.\n";

enum { SAMPLE_MAX_STOPS = 64 }; /* eos ids a model may list (Llama 3 lists 3) */

typedef struct {
    const char *model_dir, *prompt, *prompt_tokens;
    long max_new;
    SampleParams sp;
    int ids, stop_set, threads;
    long stop_token;
    uint64_t seed;
} SampleOptions;

static void parse_sample_options(int argc, char **argv, SampleOptions *o) {
    const char *cmd = "sample";
    memset(o, 0, sizeof *o);
    o->max_new = 200;
    o->sp = (SampleParams){.temperature = 0.8, .top_k = 40, .top_p = 1, .repetition_penalty = 1};
    o->seed = 1;
    o->threads = 1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"prompt-tokens", required_argument, 0, 'P'}, {"max-new-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'q'}, {"repetition-penalty", required_argument, 0, 'r'},
        {"seed", required_argument, 0, 's'}, {"stop-token", required_argument, 0, 'x'},
        {"ids", no_argument, 0, 'i'}, {"threads", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int opt;
    while ((opt = getopt_full(argc, argv, ":h", opts, cmd)) != -1) {
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
        case 'T': o->threads = (int)parse_long(cmd, "threads", optarg, 1, 4096); break;
        case 'h': fputs(HELP, stdout); exit(0);
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    if (!o->model_dir) die_collective("seqpar sample: --model DIR is required: a checkpoint or Hugging Face Llama directory");
    if (!o->prompt == !o->prompt_tokens)
        die_collective("seqpar sample: give exactly one of --prompt TEXT (byte-level models) and --prompt-tokens IDS");
}

/* "1,2, 3" -> ids: one id between commas (spaces around it allowed); dies naming a bad list. */
static int *parse_ids(const char *s, int *n_out) {
    size_t cap = strlen(s) / 2 + 1;
    int *ids = xmalloc(sizeof(int) * cap);
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || v > 0x7ffffffe)
            die_collective("seqpar sample: --prompt-tokens expects non-negative token ids separated by commas (e.g. "
                           "\"1,2,3\"), got '%s'", s);
        ids[n++] = (int)v;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',')
            die_collective("seqpar sample: --prompt-tokens expects non-negative token ids separated by commas (e.g. "
                           "\"1,2,3\"), got '%s'", s);
        p++;
    }
    *n_out = n;
    return ids;
}

/* A byte-level model's token as text: bytes as they are, the end-of-text id as a newline. */
static void put_token(int id, int as_ids, int first) {
    if (as_ids) printf(first ? "%d" : ",%d", id);
    else if (id < 256) putchar(id);
    else putchar('\n');
}

int cmd_sample(int argc, char **argv) {
    SampleOptions o;
    parse_sample_options(argc, argv, &o);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) /* each rank would print its own copy of the text */
        die_collective("seqpar sample runs in one process, but %d ranks were started: run it without mpirun (or with "
                       "-np 1)", world);
    set_threads(o.threads);
    LlamaModel model;
    model_from_dir(&model, o.model_dir, 1, 0);
    int V = model.cfg.vocab_size, byte_level = V == 256 || V == 257;
    int n_prompt = 0, *prompt;
    if (o.prompt) {
        if (!byte_level)
            die_collective("seqpar sample: '%s' has vocab_size %d, so it is not a byte-level model and --prompt TEXT "
                           "cannot be encoded: pass --prompt-tokens IDS (python3 scripts/make_shards.py --tokenizer "
                           "tokenizer.json --encode TEXT prints them)", o.model_dir, V);
        n_prompt = (int)strlen(o.prompt);
        if (n_prompt == 0) die_collective("seqpar sample: --prompt is empty: give at least one character");
        prompt = xmalloc(sizeof(int) * (size_t)n_prompt);
        for (int i = 0; i < n_prompt; i++) prompt[i] = (unsigned char)o.prompt[i];
    } else {
        prompt = parse_ids(o.prompt_tokens, &n_prompt);
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= V)
                die_collective("seqpar sample: prompt token %d is outside the vocabulary of '%s' (vocab_size %d)",
                               prompt[i], o.model_dir, V);
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

    Generator g;
    SeqErr e;
    long total = (long)n_prompt + o.max_new;
    if (total > (1L << 30)) die_collective("seqpar sample: prompt + --max-new-tokens exceeds 2^30 tokens");
    int chunk = n_prompt < 512 ? n_prompt : 512;
    if (generator_init(&g, &model, (int)total, chunk, &e) != 0) die_collective("%s", e.msg);
    float *logits = xmalloc(sizeof(float) * (size_t)V);
    int *context = xmalloc(sizeof(int) * (size_t)total); /* the prompt, then each token made */
    memcpy(context, prompt, sizeof(int) * (size_t)n_prompt);
    Rng rng;
    rng_seed(&rng, o.seed);

    double t0 = now_seconds(), c0 = cpu_seconds();
    for (int i = 0; i < n_prompt; i += chunk) {
        int n = n_prompt - i < chunk ? n_prompt - i : chunk;
        if (generator_forward(&g, prompt + i, n, NULL, logits, &e) != 0) die_collective("%s", e.msg);
    }
    double t_prompt = now_seconds() - t0, c_prompt = cpu_seconds() - c0;
    if (!as_ids) /* the prompt as text first, whichever way it was given */
        for (int i = 0; i < n_prompt; i++) put_token(prompt[i], 0, 0);
    long made = 0;
    double t1 = now_seconds(), c1 = cpu_seconds();
    for (; made < o.max_new; made++) {
        int next = sample_next_token(logits, V, &o.sp, context, n_prompt + made, &rng);
        context[n_prompt + made] = next;
        put_token(next, as_ids, made == 0);
        fflush(stdout);
        int stop = 0;
        for (int k = 0; k < n_stops; k++) stop |= next == stops[k];
        if (stop) {
            made++;
            break;
        }
        if (made + 1 < o.max_new && generator_forward(&g, &next, 1, NULL, logits, &e) != 0) die_collective("%s", e.msg);
    }
    putchar('\n');
    fflush(stdout);
    double t_gen = now_seconds() - t1, c_gen = cpu_seconds() - c1;
    fprintf(stderr, "seqpar sample: prompt %d tokens in %.3f s (CPU %.3f s); generated %ld tokens in %.3f s (CPU %.3f s): "
            "%.1f tokens/s\n", n_prompt, t_prompt, c_prompt, made, t_gen, c_gen, t_gen > 0 ? (double)made / t_gen : 0.0);
    xfree(logits);
    xfree(context);
    xfree(prompt);
    generator_free(&g);
    llama_free(&model);
    return 0;
}
