/* Pieces shared by the seqpar subcommands: number parsing that names the bad flag, the
 * unknown-option error, thread settings, and loading or creating a model. */
#ifndef SEQPAR_CLI_COMMON_H
#define SEQPAR_CLI_COMMON_H

#include <getopt.h>
#include <stdio.h>
#include <stdint.h>

#include "data/token_stream.h"
#include "model/llama.h"
#include "train/seq_parallel.h"

/* The flag's value as a decimal integer (double) in [min, max]; dies naming the flag otherwise. */
long   parse_long(const char *cmd, const char *flag, const char *value, long min, long max);
/* Removes every "NAME VALUE" and "NAME=VALUE" from argv (for a command's own flags before train's
 * parser reads the rest) and returns the last VALUE (a pointer into argv; given twice, the last
 * wins, as with getopt's flags), or NULL when NAME is absent. */
const char *take_flag(int *argc, char **argv, const char *cmd, const char *name);
double parse_double(const char *cmd, const char *flag, const char *value, double min, double max);

/* getopt_long without its abbreviations: a long option must be given in full (getopt_long takes
 * any unambiguous prefix, so another command's --tokens read as train's --tokens-format and --ranks
 * as --ranks-per-node); a prefix dies naming the option it would have been read as. A table with
 * the parallel flags (PARALLEL_FLAG_OPTIONS) gets the strategies' knobs too (options_with_knobs). */
int getopt_full(int argc, char **argv, const char *shortopts, const struct option *opts, const char *cmd);
/* Call from the getopt_long loop on '?' or ':': dies naming the option and pointing at --help. */
void die_bad_option(const char *cmd, int argc, char **argv, int opt);
/* Dies if positional arguments are left over. */
void die_extra_args(const char *cmd, int argc, char **argv);

/* Sets OpenMP and OpenBLAS threads (n <= 0: leave the default). */
/* The run header's kernel lines (rank 0 calls it): the kernel path (isa_describe), OpenBLAS's core
 * (blas_describe), the linear layers' GEMM library (sgemm.h) and, when that core is below the CPU's, a warning. */
void print_kernels_header(void);
void set_threads(int n);
int  current_threads(void);

/* Model size flags for a model made from scratch (train and bench). */
typedef struct {
    LlamaConfig cfg;
    unsigned given; /* bit i: the i-th size flag (1001 + i) was on the command line */
} SizeFlags;
void size_flags_default(SizeFlags *f);
/* Handles --layers --hidden --ffn --heads --kv-heads --head-dim --vocab --rope-theta
 * --tie-embeddings; returns 1 if opt was one of them. */
#define SIZE_FLAG_OPTIONS \
    {"layers", required_argument, 0, 1001}, {"hidden", required_argument, 0, 1002}, \
    {"ffn", required_argument, 0, 1003}, {"heads", required_argument, 0, 1004}, \
    {"kv-heads", required_argument, 0, 1005}, {"head-dim", required_argument, 0, 1006}, \
    {"vocab", required_argument, 0, 1007}, {"rope-theta", required_argument, 0, 1008}, \
    {"tie-embeddings", no_argument, 0, 1009}
int size_flags_handle(SizeFlags *f, const char *cmd, int opt, const char *arg);
/* With size flags and token data: the vocabulary the data needs (train's and memory's rule): an
 * explicit --vocab that does not cover the data ends every rank with one line; else vocab_size is
 * raised to it (text: 256, one token per byte; shards: the largest id + 1). */
void size_flags_fit_data(SizeFlags *sf, TokenStream *ts, const char *data);
/* Token data too short for one window (--seq-len S reads S + 1 tokens) ends every rank with train's
 * one line; train, memory and plan refuse alike. */
void data_length_check(const TokenStream *ts, int seq_len, const char *data);
/* With --model or --resume the model's own config decides the sizes: a size flag given with a
 * different value is one line on every rank naming both values (the same value is accepted, so
 * a run can be resumed with its original command line). `source` names the config. */
void size_flags_check(const SizeFlags *f, const LlamaConfig *c, const char *cmd, const char *source);
extern const char SIZE_FLAGS_HELP[];

/* --model DIR's checks before its config.json is read (train, grad, sample, memory, plan alike): an
 * empty name, a missing directory, a directory without config.json; -1 and *e naming the fix. */
int model_dir_check(const char *dir, SeqErr *e);
/* Loads DIR/config.json and the weights: DIR/model.safetensors or a sharded checkpoint
 * (model.safetensors.index.json + shards). A directory without weights is an error unless
 * random_init (--random-init), which initialises from seed. Collective: every rank must call
 * it; a problem on any rank ends every rank with one line. */
void model_from_dir(LlamaModel *m, const char *dir, uint64_t seed, int random_init);
/* The size flags' model made whole and checked (train, grad, memory, plan alike): head_dim, unless
 * --head-dim gave it (then it is explicit, whatever its value, as config.json's), is --hidden /
 * --heads, which the heads must divide; a problem ends every rank with one line naming the fix. */
void size_flags_validate(LlamaConfig *c);
/* Builds a random model from size flags (size_flags_validate). */
void model_from_size(LlamaModel *m, const LlamaConfig *cfg, uint64_t seed);
/* The two halves of model_from_dir / model_from_size, for a run that shards the parameters
 * (ZeRO-3): build the model (checks, config, the table; no weights), and later fill only
 * [lo, hi) of the flat parameters (the rank's shard: the rest is never written) from DIR's
 * weights or the random initialisation (the same values as a whole load). */
void model_dir_build(LlamaModel *m, const char *dir);
/* model_dir_build's checks and config, without the model: every rank ends alike on a refusal. */
void model_dir_config(const char *dir, LlamaConfig *cfg);
/* model_dir_load's refusal of a directory without weights (or with both kinds), made without reading
 * them: nothing under random_init. Collective. */
void model_dir_weights_check(const char *dir, int random_init);
void model_dir_load(LlamaModel *m, const char *dir, uint64_t seed, int random_init, size_t lo, size_t hi);
void model_size_build(LlamaModel *m, const LlamaConfig *cfg);

/* Parallelism flags shared by grad, train and bench: --strategy --dp --hp --cp --placement --layout
 * --ranks-per-node --zero --zero-group --threads --trace --stats --comm-timeout --offload-dir, and the
 * strategies' own knobs (--ring-inner, --team, --chunks, ...: registry.h), which options_with_knobs
 * adds to a command's table. */
#define PARALLEL_FLAG_OPTIONS \
    {"dp", required_argument, 0, 2001}, {"hp", required_argument, 0, 2002}, \
    {"cp", required_argument, 0, 2003}, \
    {"placement", required_argument, 0, 2005}, {"layout", required_argument, 0, 2006}, \
    {"ranks-per-node", required_argument, 0, 2007}, {"zero", required_argument, 0, 2008}, \
    {"trace", required_argument, 0, 2009}, {"stats", no_argument, 0, 2010}, \
    {"threads", required_argument, 0, 2011}, {"strategy", required_argument, 0, 2012}, \
    {"comm-timeout", required_argument, 0, 2030}, \
    {"zero-group", required_argument, 0, 2031}, \
    {"offload-dir", required_argument, 0, 2015}
int parallel_flags_handle(ParallelConfig *c, const char *cmd, int opt, const char *arg);
/* opts (ended by {0}) and an entry for each registered strategy knob, --NAME with a value, option
 * id KNOB_OPTION_FIRST + its slot: a copy made once per table and kept (opts itself where it has
 * them already). */
#define KNOB_OPTION_FIRST 2100
const struct option *options_with_knobs(const struct option *opts);
/* A knob's option (id from options_with_knobs): its value (1 to the knob's max) into k; returns 1,
 * or 0 for any other option. */
int knob_option_handle(KnobValues *k, const char *cmd, int opt, const char *arg);
/* The parallelism flags' help, the registered strategies' knobs among them. */
void parallel_flags_help(FILE *out);

/* --checkpoint [none|layer|selective], --ffn-chunks K, --precision fp32|bf16 and --no-stream (train, grad, bench). --checkpoint with
 * no value is layer (as before the modes); the mode may follow as the next word or after '='. */
#define MEMORY_FLAG_OPTIONS \
    {"checkpoint", optional_argument, 0, 3001}, {"ffn-chunks", required_argument, 0, 3002}, \
    {"precision", required_argument, 0, 3003}, {"no-stream", no_argument, 0, 3004}
typedef struct {
    int checkpoint; /* LLAMA_CKPT_* */
    int ffn_chunks; /* 0: the default */
    int precision;  /* PRECISION_FP32 (default) or PRECISION_BF16 (kernels/bf16.h) */
    int no_stream;  /* --no-stream: whole layers under a streaming strategy (llama.h, chunk streaming) */
} MemoryFlags;
/* Returns 1 if opt was one of them (may consume the next argv word: call from the getopt loop). */
int memory_flags_handle(MemoryFlags *f, const char *cmd, int opt, const char *arg, int argc, char **argv);
extern const char MEMORY_FLAGS_HELP[];
/* --offload-dir needs something to offload: a chunked strategy's chunks or checkpointed layer inputs;
 * --no-stream is a streaming strategy's (one line on every rank otherwise, worded by the strategy). */
void offload_flags_check(const ParallelConfig *pc, const MemoryFlags *mf);
/* Layer-input offload (llama.h): a failed write or read on any rank ends every rank with that
 * rank's one line. Collective when offloading (an allreduce under the watchdog); nothing otherwise. */
void offload_errors_check(const LlamaActs *acts, SeqParallel *par);
/* seq_parallel_free, ending every rank with rank 0's line when the trace file could not be
 * written (collective). */
void parallel_free_or_die(SeqParallel *par);
/* An output file the run will write at its end that cannot be written (a missing or read-only
 * directory, a directory) ends every rank now with rank 0's line, not after the run (collective
 * over MPI_COMM_WORLD); trace_target_check: --trace's, nothing without it. */
void file_target_check(const char *path);
/* --trace, also: not inside `save_dir` (--save; NULL: none), which every save replaces whole, and
 * not an existing file other than a trace (the weights, the tokens, a checkpoint's file: written at
 * the end, it replaced them). */
void trace_target_check(const ParallelConfig *pc, const char *save_dir);
/* 1 if `path` (which need not exist) lies inside directory `dir`, by their real paths. */
int path_inside_dir(const char *path, const char *dir);
/* 1 if the two paths (which need not exist) name one file, by their real paths. */
int paths_same(const char *a, const char *b);
/* Utilisation for printing: min(u, 1); *clamped set when u was above 1. */
double utilisation_clamp(double u, int *clamped);

/* --pack and --eot ID (train and grad, token files): packed documents (data/packing.h). */
#define PACK_FLAG_OPTIONS {"pack", no_argument, 0, 3201}, {"eot", required_argument, 0, 3202}
typedef struct {
    int pack;  /* --pack given */
    long eot;  /* --eot ID; -1: not given */
} PackFlags;
void pack_flags_default(PackFlags *f);
int pack_flags_handle(PackFlags *f, const char *cmd, int opt, const char *arg);
extern const char PACK_FLAGS_HELP[];
/* The end-of-text id --pack splits at: --eot, else model_dir's config.json eos_token_id (model_dir
 * may be NULL). -1 when --pack is off. Every problem (--eot without --pack, no id known, an id
 * outside the vocabulary) ends every rank with one line naming the fix. */
int pack_flags_eot(const PackFlags *f, const char *cmd, const char *model_dir, int vocab_size);

int file_exists(const char *path);
/* 1 if both paths exist and name the same file or directory (device and inode). */
int same_file(const char *a, const char *b);
/* mkdir -p for the directory part of a file path; -1 and *e where it cannot. */
int make_parent_dirs(const char *path, SeqErr *e);

#endif
