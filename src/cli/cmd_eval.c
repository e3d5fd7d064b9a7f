/* seqpar eval: a forward-only pass of a model (a seqpar checkpoint or any Hugging Face Llama
 * directory) over token data or the recall task, on any number of ranks under any strategy, with
 * activations made forward only (layer_memory.h); prints the loss and perplexity overall and by
 * position bucket, the recall task's accuracy by distance, tokens per second and peak memory, and
 * writes them as JSON with --out (train/evaluate.h does the work). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/common.h"
#include "io/atomic_file.h"
#include "kernels/bf16.h"
#include "model/llama.h"
#include "train/auto_strategy.h"
#include "train/cli_common.h"
#include "train/evaluate.h"
#include "train/plan_setup.h"
#include "train/seq_parallel.h"
#include "train/train_options.h"

static const char HELP[] =
    "usage: seqpar eval --model DIR --data SRC --seq-len S [options]\n"
    "\n"
    "A forward-only pass of a model over token data or the recall task, on one process or any\n"
    "number of ranks under any strategy (mpirun -np N seqpar eval ... with train's parallel flags).\n"
    "Prints the mean next-token loss and perplexity overall and by position (1-1K, 1K-4K, 4K-16K,\n"
    "... the last bucket ending at S: a token's position is the number of tokens its prediction\n"
    "sees, in its document under --pack), the recall task's accuracy by distance, tokens per second\n"
    "and the peak memory per rank. No activation is kept for a backward: eval fits sequences several\n"
    "times longer than train in the same memory. The loss equals one process's within fp32 rounding,\n"
    "and the validation loss `seqpar train --val-data` prints for the same sequences and ranks.\n"
    "\n"
    "  --model DIR          config.json + model.safetensors (or a sharded checkpoint): a directory\n"
    "                       `seqpar train --save` wrote, or any Hugging Face Llama directory\n"
    "  --data SRC           'recall' (the built-in recall task, as train runs it), an llm.c shard\n"
    "                       (.bin), a text file (.txt), a directory of shards (its *_val_* shards\n"
    "                       where it has any) or a glob\n"
    "  --tokens-format F    auto|llmc|text (default auto: .txt is text, else llm.c shard)\n"
    "  --seq-len S          tokens per sequence (at most the model's max_position_embeddings)\n"
    "  --eval-seqs N        sequences to evaluate (token data: the first N, default all the data\n"
    "                       holds; recall: N fresh sequences, default 16, as train's evaluation)\n"
    "  --seed N             the recall task's sequences (default 1: those of train's --seed 1)\n"
    "  --recall-format F, --recall-pairs N, --recall-queries N   the recall task, as train's\n"
    "  --out FILE           also write the results as JSON (replaced atomically)\n"
    "  --precision P        fp32 (default) or bf16, as train's\n"
    "  --strategy auto      the planner's pick for the ranks started, planned as train would run one\n"
    "                       sequence (--batch 1 --zero 0), printed as the eval command it equals and run\n"
    "  --help               this text\n"
    "Also --pack and --eot ID (token data: documents scored alone, as train packs them) and train's\n"
    "parallel flags; --checkpoint, --ffn-chunks and --no-stream are accepted as train takes them\n"
    "(a forward-only pass keeps no layer's activations whatever --checkpoint says).\n";

/* --strategy auto: the planner's pick for these ranks, planned as train would run one sequence of
 * the model (train/auto_strategy.h: train's flags given, eval's own left out; --zero 0, as eval
 * has no optimizer state; no data: the memory of a forward is less than a training step's), in
 * place of its words; rank 0 prints the eval command it equals. A new argv (plan_argv_free). */
static char **eval_auto(int argc, char **argv, const char *program, int *out_argc) {
    static const char *const own[] = {"--data", "--tokens-format", "--eval-seqs", "--out", "--eot"}; /* with values */
    char **eargv = xmalloc(sizeof(char *) * ((size_t)argc + 1)), **targv = xmalloc(sizeof(char *) * ((size_t)argc + 5));
    int en = 0, tn = 0;
    targv[tn++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const int k = strategy_auto_words(argc, argv, i);
        if (k) {
            i += k - 1;
            continue;
        }
        eargv[en++] = argv[i];
        int skip = !strcmp(argv[i], "--pack");
        for (size_t j = 0; j < ARRAY_LEN(own) && !skip; j++) {
            const size_t l = strlen(own[j]);
            if (!strncmp(argv[i], own[j], l) && argv[i][l] == '=') skip = 1;
            else if (!strcmp(argv[i], own[j]) && i + 1 < argc) skip = 1, eargv[en++] = argv[++i];
        }
        if (!skip) targv[tn++] = argv[i];
    }
    targv[tn++] = "--batch", targv[tn++] = "1", targv[tn++] = "--zero", targv[tn++] = "0";
    targv[tn] = NULL;
    char desc[256] = "", given[8192], prog[4096];
    char *pick = strategy_auto_pick(tn, targv, "seqpar eval --strategy auto", desc, sizeof desc);
    if (shell_words(en, eargv, given, sizeof given) != 0 || program_word(program, prog, sizeof prog) != 0)
        die_collective("seqpar eval --strategy auto: the flags given are over %zu characters: shorten the paths",
                       sizeof given);
    char *line = xstrdup_printf("%s%s%s", given, *given ? " " : "", pick);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank == 0) {
        printf("strategy auto: %s: mpirun -n %d %s eval %s\n", desc, world, prog, line);
        fflush(stdout);
    }
    char **out = plan_flags_argv(argv[0], line, out_argc);
    if (!out) die_collective("seqpar eval --strategy auto: the pick's flags do not split into words: %s", line);
    xfree(line);
    xfree(pick);
    xfree(eargv);
    xfree(targv);
    return out;
}

static int eval_main(int argc, char **argv);

int cmd_eval(int argc, char **argv, const char *program) {
    char **picked = NULL;
    if (strategy_auto_given(argc, argv)) argv = picked = eval_auto(argc, argv, program, &argc);
    const int status = eval_main(argc, argv);
    plan_argv_free(picked);
    return status;
}

static int eval_main(int argc, char **argv) {
    const char *cmd = "eval", *model_dir = NULL, *data = NULL, *out_path = NULL;
    TokensFormat fmt = TOKENS_AUTO;
    long seq_len = 0, eval_seqs = 0;
    uint64_t seed = 1;
    int recall_pairs = 0, recall_queries = 0, recall_format = RECALL_ADJACENT;
    MemoryFlags mf = {0};
    PackFlags pf;
    pack_flags_default(&pf);
    ParallelConfig pc;
    parallel_config_default(&pc);
    static const struct option opts[] = {
        PARALLEL_FLAG_OPTIONS, MEMORY_FLAG_OPTIONS, PACK_FLAG_OPTIONS,
        {"model", required_argument, 0, 'm'}, {"data", required_argument, 0, 'd'},
        {"tokens-format", required_argument, 0, 'f'}, {"seq-len", required_argument, 0, 's'},
        {"eval-seqs", required_argument, 0, 'E'}, {"seed", required_argument, 0, 'r'},
        {"recall-pairs", required_argument, 0, 'P'}, {"recall-queries", required_argument, 0, 'Q'},
        {"recall-format", required_argument, 0, 3105}, {"out", required_argument, 0, 'o'},
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
        case 'd': data = optarg; break;
        case 'f': fmt = tokens_format_parse(optarg); break;
        case 's': seq_len = parse_long(cmd, "seq-len", optarg, 1, 1L << 30); break;
        case 'E': eval_seqs = parse_long(cmd, "eval-seqs", optarg, 1, 1L << 30); break;
        case 'r': seed = (uint64_t)parse_long(cmd, "seed", optarg, 0, 1L << 62); break;
        case 'P': recall_pairs = (int)parse_long(cmd, "recall-pairs", optarg, 1, 1 << 28); break;
        case 'Q': recall_queries = (int)parse_long(cmd, "recall-queries", optarg, 1, 1 << 28); break;
        case 3105:
            if ((recall_format = recall_format_parse(optarg)) < 0)
                die_collective("seqpar eval: --recall-format '%s' is not a format: give adjacent or fused", optarg);
            break;
        case 'o': out_path = optarg; break;
        case 'h':
            fputs(HELP, stdout);
            fputs(PACK_FLAGS_HELP, stdout);
            parallel_flags_help(stdout);
            return 0;
        default: die_bad_option(cmd, argc, argv, opt);
        }
    }
    die_extra_args(cmd, argc, argv);
    offload_flags_check(&pc, &mf);
    if (!model_dir)
        die_collective("seqpar eval: --model DIR is required: a checkpoint of `seqpar train --save` or a Hugging Face "
                       "Llama directory");
    if (!data)
        die_collective("seqpar eval: --data is required: token data (a .bin shard, a .txt file, a directory of shards, "
                       "a glob) or 'recall'");
    if (!seq_len) die_collective("seqpar eval: --seq-len S is required (see 'seqpar eval --help')");
    if (pc.zero != 0)
        die_collective("seqpar eval: --zero %d shards gradients and optimizer state, which a forward-only pass has "
                       "none of: drop --zero", pc.zero);
    const int recall = !strcmp(data, "recall");
    if (out_path) file_target_check(out_path);
    trace_target_check(&pc, NULL);

    LlamaModel model;
    model_from_dir(&model, model_dir, seed, 0);
    xfree(model.grads); /* no backward: no gradients */
    model.grads = NULL;
    const LlamaConfig *c = &model.cfg;
    if (seq_len > c->max_position_embeddings)
        die_collective("seqpar eval: --seq-len %ld is past the %d positions of the model in %s (max_position_embeddings "
                       "in its config.json): give --seq-len %d or less", seq_len, c->max_position_embeddings, model_dir,
                       c->max_position_embeddings);
    const int S = (int)seq_len;
    /* the data flags and the recall task as train checks them */
    TrainOptions to;
    memset(&to, 0, sizeof to);
    to.data = data;
    to.model_dir = model_dir;
    to.seq_len = S;
    to.pack = pf;
    to.recall_pairs = recall_pairs;
    to.recall_queries = recall_queries;
    to.recall_format = recall_format;
    if (!recall && (recall_pairs || recall_queries || recall_format != RECALL_ADJACENT))
        die_collective("seqpar eval: --recall-pairs, --recall-queries and --recall-format describe the recall task: "
                       "give --data recall or drop them");
    const int eot = train_data_flags_check(&to, recall, c->vocab_size, cmd);
    EvalData ed;
    SeqErr err;
    if (recall) eval_data_recall(&ed, (RecallSpec[]){recall_spec_from_options(&to, c->vocab_size)},
                                 eval_seqs > 0 ? eval_seqs : 16, seed);
    else die_if_any_rank(eval_data_tokens(&ed, data, fmt, S, eval_seqs, c->vocab_size, eot, &err) != 0 ? &err : NULL);

    SeqParallel par;
    pc.wire_bf16 = mf.precision == PRECISION_BF16; /* the head exchange in bf16 too */
    seq_parallel_create(&par, &pc, c, S, model.table.total);
    const int N = par.n_local;
    LlamaActsOptions ao = {.checkpoint = mf.checkpoint, .ffn_chunks = mf.ffn_chunks, .rank = par.topo.world_rank,
                           .precision = mf.precision, .no_stream = mf.no_stream, .forward_only = 1};
    LlamaActs *acts = llama_acts_create_opts(&model, par.attn, N, &ao);
    const int root = par.topo.world_rank == 0;
    if (root) {
        char desc[768], ddesc[96] = "";
        print_kernels_header();
        seq_parallel_describe(&par, desc, sizeof desc);
        printf("parallel: %s\n", desc);
        if (!recall) token_stream_describe(&ed.stream, ddesc, sizeof ddesc);
        printf("model %s (%d layers, hidden %d, vocabulary %d); data %s%s%s%s: %ld sequences of %d tokens\n", model_dir,
               c->num_hidden_layers, c->hidden_size, c->vocab_size, data, recall ? "" : " (", ddesc, recall ? "" : ")",
               ed.n_seqs, S);
        if (recall)
            printf("recall task: %d pairs, %d queries per sequence, chance accuracy %.3f\n", ed.spec.n_pairs,
                   ed.spec.n_queries, 1.0 / recall_n_keys(&ed.spec));
        if (eot >= 0) printf("packed documents: split at end-of-text id %d; each token attends only to its document\n", eot);
        if (mf.precision == PRECISION_BF16) {
            char b16[160];
            bf16_describe(b16, sizeof b16);
            printf("precision: bf16 (bf16 path: %s)\n", b16);
        }
        printf("forward only%s, %d FFN chunk%s\n", llama_acts_streams(acts) ? ", layers streamed" : "",
               llama_acts_ffn_chunks(acts), llama_acts_ffn_chunks(acts) == 1 ? "" : "s");
        fflush(stdout);
    }
    comm_set_step(par.comm, 0, "eval");
    EvalResult res;
    die_if_any_rank(eval_run(&ed, &model, acts, &par, &res, &err) != 0 ? &err : NULL);
    int failed = 0;
    if (root) {
        eval_print(&res, stdout);
        fflush(stdout);
        if (out_path) {
            char header[4096], grid[768];
            seq_parallel_describe(&par, grid, sizeof grid);
            /* the header's strings are the user's paths and our description: no quote or backslash
             * is expected, but one would break the JSON, so such a character is written as '?' */
            for (char *p = grid; *p; p++) if (*p == '"' || *p == '\\') *p = '?';
            char md[1024], dd[1024];
            snprintf(md, sizeof md, "%s", model_dir);
            snprintf(dd, sizeof dd, "%s", data);
            for (char *p = md; *p; p++) if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '?';
            for (char *p = dd; *p; p++) if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '?';
            snprintf(header, sizeof header,
                     "  \"model\": \"%s\",\n  \"data\": \"%s\",\n  \"ranks\": %d,\n  \"parallel\": \"%s\",\n"
                     "  \"precision\": \"%s\",\n  \"packed_eot\": %d",
                     md, dd, par.topo.world_size, grid, mf.precision == PRECISION_BF16 ? "bf16" : "fp32", eot);
            failed = eval_write_json(out_path, header, &res, &err) != 0;
            if (!failed) printf("results written to %s\n", out_path);
        }
    }
    if (par.topo.world_size > 1) comm_control_barrier(par.comm, "MPI_Ibarrier (end of run)", par.topo.world);
    die_if_any_rank(failed ? &err : NULL); /* a summary rank 0 could not write ends every rank */
    llama_acts_free(acts);
    parallel_free_or_die(&par);
    eval_data_close(&ed);
    llama_free(&model);
    return 0;
}
