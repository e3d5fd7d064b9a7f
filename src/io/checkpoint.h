/* Training checkpoints: a directory that Hugging Face tooling loads as a model (config.json +
 * model.safetensors) and that seqpar resumes from bit-exactly (optimizer.safetensors with the
 * AdamW moments, trainer_state.json with the step, data RNG, data cursor, seed and run settings).
 *
 * Layout of DIR:
 *   config.json            the LlamaConfig (config_json_save)
 *   model.safetensors      all parameters, F32, HF names and shapes; above the shard limit
 *                          (checkpoint_save_src's max_shard_bytes, default 5 GB) instead
 *                          model-0000k-of-0000n.safetensors + model.safetensors.index.json, as
 *                          transformers' save_pretrained writes them
 *   optimizer.safetensors  F32 tensors "adamw.m" and "adamw.v" of shape [end - begin]; the range
 *                          [begin, end) of the flat buffer they cover is in trainer_state.json
 *                          (absent when the checkpoint was saved without an optimizer)
 *   trainer_state.json     format "seqpar-trainer-state", format_version 2, step, optimizer
 *                          {type, step, begin, end}, param_total, seed, data_cursor, data_shard
 *                          (optional, 0 when absent), data_rng
 *                          (64-bit values as "0x..." hex strings, exact), seq_len, settings
 *                          {key: string}, files {name: {bytes, crc32}} for the three other files,
 *                          state_crc32
 *
 * Verification: at save, the size and CRC-32 (zlib) of config.json, model.safetensors and
 * optimizer.safetensors are recorded in trainer_state.json, and "state_crc32" is the CRC-32 of
 * trainer_state.json's own canonical text (compact JSON, keys sorted, without state_crc32). At
 * load, every one is checked before the file is used: a bit flip is a one-line error naming the
 * damaged file. Version-1 checkpoints (no checksums) still load.
 *
 * Saving is atomic as a whole: the files go to a sibling DIR.tmp.XXXXXX (each fsynced), which is
 * fsynced and then swapped with DIR (renameat2 RENAME_EXCHANGE where the file system supports it,
 * else DIR -> DIR.old.XXXXXX and DIR.tmp.XXXXXX -> DIR); the parent is fsynced and the old copy
 * removed. A crash at any point leaves a complete old or new checkpoint (in the two-rename
 * fallback, a crash between the renames leaves it as DIR.old.XXXXXX: checkpoint_recover brings it
 * back, and loading DIR before that says so).
 * A save that fails while writing (a full disk) removes its DIR.tmp.XXXXXX before it ends the
 * program; DIR.tmp.* / DIR.old.* siblings that the running save did not create are never
 * removed. Only one process (rank 0) may save a given DIR.
 *
 * Loading reports every problem to the caller as one line (checkpoint_read, ...); the
 * checkpoint_load* forms die with that line instead. */
#ifndef SEQPAR_CHECKPOINT_H
#define SEQPAR_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "core/param_table.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "optim/adamw.h"

#define CKPT_FORMAT_VERSION 2
#define CKPT_MAX_SETTINGS 32

/* A run setting recorded for resume checks, as text (format floats with "%a" or "%.9g"). */
typedef struct {
    char key[48];
    char value[208];
} CkptSetting;

typedef struct {
    long step;            /* training steps completed */
    Rng data_rng;         /* the data sampler's RNG state */
    uint64_t data_cursor; /* the data sampler's position (in token data: the offset in shard data_shard) */
    uint64_t data_shard;  /* token data: the shard of the cursor (0 in checkpoints that predate it) */
    uint64_t seed;        /* the run's --seed */
    int seq_len;          /* 0 = not recorded */
    int n_settings;
    CkptSetting settings[CKPT_MAX_SETTINGS];
} TrainerState;

/* Zeroes *st (no settings). */
void trainer_state_init(TrainerState *st);
/* Sets (or replaces) setting `key` to the printf-formatted value. Dies if the key is too long or
 * there are more than CKPT_MAX_SETTINGS settings. */
void trainer_state_set(TrainerState *st, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The value of setting `key`, or NULL. */
const char *trainer_state_get(const TrainerState *st, const char *key);
/* Returns -1 with one line naming `dir`, the setting and both values if `saved` (from the
 * checkpoint) and `now` (this run) differ in seq_len (when both are > 0) or in any setting both
 * have, else 0. The line ends in the fix: a setting that is one flag's value names that flag and
 * the saved value; "ffn_chunks" and "streamed_layers" name `layer_fix` where it is not NULL or ""
 * ("with --no-stream --ffn-chunks 2": the caller's flags that give this run both back; without
 * it, --ffn-chunks and the saved count). trainer_state_check (no layer_fix) dies on every rank
 * instead. */
int trainer_state_compare(const TrainerState *saved, const TrainerState *now, const char *dir, const char *layer_fix,
                          SeqErr *e);
void trainer_state_check(const TrainerState *saved, const TrainerState *now, const char *dir);

/* Parses and validates trainer_state.json text (`path` names it in messages) into *st, checking
 * its own CRC-32 when it has one. Returns 0 or -1 with a message. */
int trainer_state_parse(const char *text, size_t len, const char *path, TrainerState *st, SeqErr *e);

/* 0 if DIR can take a checkpoint, else -1 with one line saying why and what to do: its parent
 * must be an existing directory in which this process can create entries (tested by creating
 * and removing a DIR.tmp.XXXXXX), and an existing DIR must be a directory owned by this user that
 * is empty or holds a seqpar checkpoint. The CLI calls it before step 1; checkpoint_save again. */
int checkpoint_check_target(const char *dir, SeqErr *e);

/* Takes the save lock of DIR for this process's life: an flock on ".BASE.seqpar-lock" beside DIR
 * (holding the process id), so that two runs started on one --save cannot replace each other's
 * checkpoints (each checked only at its start that DIR was not another run's). Returns the lock's
 * descriptor (to keep open), or -1 with one line naming the process that holds it. The file stays
 * (empty of meaning once its holder ends: a lock dies with its process). */
int checkpoint_lock(const char *dir, SeqErr *e);

/* Brings back the checkpoint a save left aside when it was interrupted between the two renames
 * of its fallback (no rename-exchange on the file system): where DIR does not exist and exactly
 * one DIR.old.XXXXXX sibling holds a whole seqpar checkpoint (its state reads and every file it
 * records has the recorded size: not the part of an old copy that a save killed while removing it
 * left), that sibling is renamed to DIR (and the
 * parent fsynced). Call it holding DIR's save lock (checkpoint_lock). Returns 1 with *from the
 * sibling's path (to free) when it moved one, 0 when there was nothing to bring back (DIR exists,
 * or no such sibling), -1 with one line when it cannot: several candidates (named, for the user
 * to choose), or the rename failed. DIR.tmp.* siblings are left alone. */
int checkpoint_recover(const char *dir, char **from, SeqErr *e);

/* The leftovers of saves that were killed before they ended: the DIR.tmp.XXXXXX and DIR.old.XXXXXX
 * siblings of DIR that hold at least one file (seqpar never removes what it did not create, so
 * each kill -9 during a save leaves up to a checkpoint's size there). Returns their number (0 when
 * there are none or the parent cannot be read), with *bytes their files' total size and *first the
 * path of the first one (to free; NULL when none). Empty ones (a save's start, the --save check's
 * probe) are not counted. Call it holding DIR's save lock, so no other run is saving to DIR. */
int checkpoint_leftovers(const char *dir, char **first, uint64_t *bytes);

/* Weights larger than this are saved as model-0000k-of-0000n.safetensors shards with
 * model.safetensors.index.json (params_save_dir; the index's CRC is in the trainer state, each
 * shard's in the index); 0 means never shard. Default: 5 GB, as transformers. */
#define CHECKPOINT_DEFAULT_SHARD_BYTES 5000000000ull

/* Every message about a damaged or incomplete checkpoint ends in this advice ("... (a bit flip on
 * disk or in transfer): ADVICE"), which holds for any reader. */
#define CHECKPOINT_DAMAGE_ADVICE "use an undamaged copy of it or another checkpoint"
/* A caller that knows how its user named the checkpoint and what they can do instead ("resume from
 * another checkpoint") puts its own advice in place of that ending of e's message (a message of
 * another kind is left as it is). */
void checkpoint_error_advice(SeqErr *e, const char *advice);

/* Writes the checkpoint DIR atomically (see above), replacing an existing one. A DIR that
 * checkpoint_check_target refuses is refused, so a mistyped path cannot delete unrelated data.
 * `opt` may be NULL (no optimizer state saved). Returns 0, or -1 with a one-line message; a
 * failure before the new checkpoint is complete removes what the save wrote and leaves DIR as it
 * was, a later one says where each copy is. */
int checkpoint_save(const char *dir, const LlamaConfig *cfg, const ParamTable *t, const float *params,
                    const AdamW *opt, const TrainerState *st, SeqErr *e);
/* checkpoint_save for state no one process holds whole: where params (then NULL) and opt->m,
 * opt->v (then NULL; opt gives the range and step) are missing, `params` reads the weights by
 * their flat offsets and `moments` the moments, m as [0, n) and v as [n, 2n) for the n elements
 * of opt's range, piece by piece in the files' order (st_write_f32_src). Weights above
 * max_shard_bytes are saved in shards (0: never; checkpoint_save: CHECKPOINT_DEFAULT_SHARD_BYTES). */
typedef struct {
    StSource params, moments;
} CheckpointSource;
int checkpoint_save_src(const char *dir, const LlamaConfig *cfg, const ParamTable *t, const float *params,
                        const AdamW *opt, const CheckpointSource *src, uint64_t max_shard_bytes,
                        const TrainerState *st, SeqErr *e);

/* 1 if DIR holds a checkpoint (DIR/trainer_state.json exists), else 0. */
int checkpoint_exists(const char *dir);

/* For a model directory read as weights (--model): where DIR holds a seqpar trainer state, its
 * config.json and model.safetensors are checked against the sizes and CRC-32s it recorded (a
 * sharded model's index records its shards'); 0 for any other directory (a Hugging Face one: its
 * trainer_state.json, if any, is not seqpar's). -1 with one line naming the damaged file. */
int checkpoint_verify_model(const char *dir, SeqErr *e);

/* Reads DIR/config.json into *cfg (to build the model before checkpoint_load), after checking
 * trainer_state.json and config.json's checksum. Returns -1 with one line if DIR or a file is
 * missing, damaged or invalid; checkpoint_load_config dies with it instead. */
int checkpoint_read_config(const char *dir, LlamaConfig *cfg, SeqErr *e);
void checkpoint_load_config(const char *dir, LlamaConfig *cfg);

/* Loads the checkpoint into an already built model: params (every tensor of t), the optimizer
 * (m, v, step; opt may be NULL to skip it; opt must already be initialised by adamw_init with a
 * range inside the one saved: a sharded rank reads only its own part of the moments) and *st. If `expect` is not NULL, the architecture fields of
 * DIR/config.json must equal it. Validates before reading tensors: missing files, bad or
 * wrong-version trainer_state.json, a parameter count or optimizer range that differs from t/opt;
 * each dies with one line naming the file and the fix, as does a file whose size or CRC-32 differs
 * from the one recorded at save, or a NaN / Inf in the weights or moments. Everything
 * round-trips bit-exactly. checkpoint_read returns 0, or -1 with that line in *e. */
int checkpoint_read(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, AdamW *opt,
                    TrainerState *st, SeqErr *e);
void checkpoint_load(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, AdamW *opt,
                     TrainerState *st);
/* checkpoint_read filling only elements [lo, hi) of params (params_read_dir's lo, hi). */
int checkpoint_read_part(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, size_t lo,
                         size_t hi, AdamW *opt, TrainerState *st, SeqErr *e);
/* Where a resume's moments go when opt->m and opt->v are NULL (kept out of RAM, adamw_init_unbacked):
 * write(ctx, moment, first, n, src) with moment 0 for m, 1 for v and `first` counted from
 * opt->begin, piece by piece (at most ST_WRITE_PIECE elements, each checked finite first). */
typedef struct {
    void (*write)(void *ctx, int moment, size_t first, size_t n, const float *src);
    void *ctx;
} CheckpointSink;
/* checkpoint_read_part with the moments written to `moments` where opt->m is NULL. */
int checkpoint_read_part_to(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, size_t lo,
                            size_t hi, AdamW *opt, const CheckpointSink *moments, TrainerState *st, SeqErr *e);

#endif
