/* The options of `seqpar train`, shared with `seqpar memory` (which takes the same flags and
 * predicts what one training step with them would hold). */
#ifndef SEQPAR_TRAIN_OPTIONS_H
#define SEQPAR_TRAIN_OPTIONS_H

#include <stdint.h>

#include "train/cli_common.h"
#include "data/packing.h"
#include "data/recall.h"
#include "data/token_stream.h"
#include "data/tokens.h"
#include "optim/adamw.h"
#include "plan/memory_model.h"

typedef struct {
    const char *data, *val_data, *save_dir, *resume_dir, *log_path, *model_dir;
    TokensFormat tokens_format;
    int seq_len, batch, eval_every, eval_seqs, eval_batches, save_every, quiet, skip_nonfinite;
    int recall_pairs, recall_queries, recall_format;
    long steps, stop_at;
    long trace_step; /* --trace-step: 0 every step, -1 the last one */
    uint64_t seed;
    int random_init;
    int auto_resume; /* --auto-resume: --resume --save DIR where DIR holds a checkpoint */
    double peak_gflops;
    AdamWConfig opt;
    int min_lr_set;
    ParallelConfig par;
    MemoryFlags mem;
    PackFlags pack;
    int eot; /* --pack: the end-of-text id documents end with; -1: not packed */
    uint64_t save_shard_bytes; /* --save-shard-mb: weights above it are saved in shards (0: never) */
    double mem_per_rank;       /* --mem-per-rank GIB, in bytes: the RAM a rank may use (0: the node's RAM
                                  over its ranks) */
    int dry_run;               /* --dry-run: every check, the memory plan, nothing allocated, no run */
    int dry_ranks;             /* --dry-run --ranks P: a job of P ranks checked from this one process (0: the
                                  ranks mpirun started) */
} TrainOptions;

/* Parses train's flags (GNU long options; a bad one ends every rank with one line naming it);
 * cmd names the command in errors. --help prints train's help and exits. */
void parse_train_options(int argc, char **argv, TrainOptions *o, SizeFlags *sf, const char *cmd);

/* The train flags in argv (as parse_train_options read them) but those named in drop (long names
 * without the dashes, NULL-terminated), each with its value, as shell words one space apart in
 * buf: the flags of a train command to print. Returns 0, or -1 where they do not fit in n. */
int train_flags_except(int argc, char **argv, const char *const *drop, char *buf, size_t n);
/* argv's argc words as shell words one space apart in buf (quoted where the shell would read them
 * otherwise). Returns 0, or -1 where they do not fit in n. */
int shell_words(int argc, char **argv, char *buf, size_t n);
/* How a printed command names seqpar so that it runs as printed: `program` (main's argv[0]) as one
 * shell word where it is a path (holds a '/': build/seqpar from a checkout), else "seqpar" (found on
 * PATH). Returns 0, or -1 where it does not fit in n. */
int program_word(const char *program, char *buf, size_t n);

/* The data flags as train, memory and plan check them (--val-data or --pack on the recall task,
 * --pack without an id: --eot or the model's eos_token_id, each ends every rank with one line);
 * returns the end-of-text id --pack splits documents at, -1 without --pack. */
int train_data_flags_check(const TrainOptions *o, int recall, int vocab_size, const char *cmd);
/* --val-data sharing a file with --data ends every rank with one line (train, memory, plan). */
void val_overlap_check(const TokenStream *val, const TokenStream *train);

/* The recall task of the flags for a model of vocab_size at --seq-len: checked (a window or a
 * vocabulary too small ends every rank with one line) and with its default query count filled in. */
RecallSpec recall_spec_from_options(const TrainOptions *o, int vocab_size);

/* The memory model's input for the flags: the model they name (--resume's checkpoint, --model's
 * config.json, or the size flags; checked, a bad one ends every rank with one line), S, batch,
 * the parallel flags, checkpoint mode, FFN chunks, streaming and precision; world and cores left
 * 0 for the caller. For `seqpar memory` and `seqpar plan`. */
void memory_input_from_options(const TrainOptions *o, SizeFlags *sf, const char *cmd, MemoryModelInput *in);
/* The run's settings of the memory model's input from the flags: S, batch, the parallel flags,
 * checkpoint mode, FFN chunks, streaming, precision, and the tokens of ts's largest file, which the
 * trainer holds whole (ts NULL: the recall task, no file). Part of memory_input_from_options; the
 * trainer's own estimate takes the rest from the model it checked. */
void memory_input_settings(const TrainOptions *o, const TokenStream *ts, MemoryModelInput *in);

#endif
