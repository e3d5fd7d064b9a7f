/* The AdamW moments on the disk tier (--offload-optimizer DIR, ZeRO-Infinity's optimizer offload):
 * m and v of this rank's optimizer range live in one file in DIR (the disk chunk tier of
 * memory/chunk_tier.h: made per rank, unlinked at once, its space reserved at creation) instead of
 * 8 bytes a parameter of RAM. The optimizer step streams them through in chunks of
 * OPT_OFFLOAD_CHUNK elements with double buffering: while chunk i is updated (adamw_apply), the
 * tier's helper thread reads chunk i + 1 and writes chunk i - 1 back. The update is element-wise,
 * so the weights and moments are the in-RAM optimizer's bit for bit.
 *
 * With `master` (--offload-master, ZeRO-3 only) the rank's fp32 parameter shard lives in the file
 * too (the tier's TIER_O kind): the update streams it with the moments, and ZeRO-3's gathers read
 * each unit's own part from the file into its place in the gather's buffer (data_parallel.c), so a
 * rank keeps no shard of the weights in RAM. Under ZeRO 0-2 there is no such shard: every rank's
 * full weights are the model's working weights, read by every forward (seqpar keeps no separate
 * low-precision copy), so they stay in RAM.
 *
 * I/O errors do not stop the step mid-way: optimizer_offload_error reports the first one, which the
 * trainer checks on every rank after the step so that all stop with one line. */
#ifndef SEQPAR_OPTIMIZER_OFFLOAD_H
#define SEQPAR_OPTIMIZER_OFFLOAD_H

#include <stddef.h>

#include "core/common.h"
#include "core/param_table.h"
#include "optim/adamw.h"

#define OPT_OFFLOAD_CHUNK ((size_t)1 << 20) /* elements of m (and of v) per streamed chunk: 4 MiB */
#define OPT_OFFLOAD_FLAG "--offload-optimizer"

typedef struct OptOffload OptOffload;

/* Elements per chunk for n moments (OPT_OFFLOAD_CHUNK, or $SEQPAR_OPT_OFFLOAD_CHUNK: a test hook),
 * and the RAM (the tier's staging and read buffers) and disk bytes the offload of n elements'
 * moments (and with `master` their weights) holds: what the memory model counts. */
size_t optimizer_offload_chunk(size_t n);
double optimizer_offload_ram_bytes(size_t n, int master);
double optimizer_offload_disk_bytes(size_t n, int master);

/* Checks SEQPAR_OPT_OFFLOAD_CHUNK before MPI starts: 0, or 1 with a one-line message in err. */
int optimizer_offload_env_check(char *err, size_t n);

/* The file for the moments (and with `master` the weights) of n elements in dir, its space
 * reserved, reading as zeros (fresh moments). NULL with a one-line message in *e (the directory
 * not writable, the disk full). */
OptOffload *optimizer_offload_create(const char *dir, int rank, size_t n, int master, SeqErr *e);
int optimizer_offload_master(const OptOffload *o); /* the weights are in the file */
void optimizer_offload_free(OptOffload *o);

/* One AdamW step (adamw_update_at's: the same arguments, the same bits) on opt's range, whose
 * moments are this file's (opt from adamw_init_unbacked); with `master` the weights are the
 * file's too and params is not read. */
void optimizer_offload_update(OptOffload *o, AdamW *opt, const ParamTable *table, float *params, size_t params_base,
                              const float *grads, size_t grads_base, float lr, float grad_scale);

/* Elements [first, first + n) of the range (0-based within it) of moment 0 (m) or 1 (v), or of the
 * weights (2, with `master`): read into dst, or written from src (a checkpoint's save and resume,
 * ZeRO-3's gathers). */
void optimizer_offload_read(OptOffload *o, int moment, size_t first, size_t n, float *dst);
void optimizer_offload_write(OptOffload *o, int moment, size_t first, size_t n, const float *src);

/* --offload-optimizer DIR (NULL: not given) and --offload-master against --zero on `world` ranks:
 * NULL, or the one-line refusal (newly allocated) of a --offload-master that has no shard to move. */
char *optimizer_offload_flags_error(const char *dir, int master, int zero, int world);

/* 0, or -1 with the first I/O failure's one line in *e. */
int optimizer_offload_error(const OptOffload *o, SeqErr *e);
/* Bytes written and read and the seconds the steps waited for the helper thread since creation. */
void optimizer_offload_stats(const OptOffload *o, unsigned long long *written, unsigned long long *read,
                             double *wait_s);

#endif
