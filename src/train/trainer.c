/* The training run (trainer.h): the checks of a start, shared with --dry-run (which stops after
 * them); data, model, strategy and optimizer set up from the options; the step loop with
 * evaluation, checkpoints, preemption and logging; the end-of-run report. */
#include "train/trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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
#include "plan/planner.h"
#include "train/cli_common.h"
#include "train/progress.h"
#include "train/run_control.h"
#include "train/seq_parallel.h"
#include "train/validation.h"
#include "train/train_options.h"

/* The source of training sequences: recall task or token files read in order (token_stream.h). */
typedef struct {
    int is_recall;
    RecallSpec spec;
    TokenStream ts;
    int *distance; /* (S) for recall */
} DataSource;
/* Every rank reads the same data, so a failed read ends every rank alike (with one line). */
static void next_sequence(DataSource *ds, TrainerState *st, int S, int *inputs, int *targets) {
    if (ds->is_recall) {
        recall_generate(&ds->spec, &st->data_rng, inputs, targets, ds->distance);
        st->data_cursor++;
        return;
    }
    SeqErr e;
    die_if_any_rank(token_stream_next(&ds->ts, S, inputs, targets, &e) != 0 ? &e : NULL);
    st->data_shard = ds->ts.shard;
    st->data_cursor = ds->ts.offset;
}
/* Validation loss, printed and logged by rank 0. */
static void evaluate_val(Validation *val, LlamaModel *m, LlamaActs *acts, SeqParallel *par, long step, FILE *log) {
    double loss;
    long n;
    SeqErr e;
    die_if_any_rank(validation_loss(val, m, acts, par, &loss, &n, &e) != 0 ? &e : NULL);
    if (par->topo.world_rank != 0) return;
    printf("step %5ld | val loss %.4f (%d sequences, %ld tokens)\n", step, loss, val->n_seqs, n);
    fflush(stdout);
    fprintf(log, "{\"step\": %ld, \"val_loss\": %.17g, \"val_tokens\": %ld}\n", step, loss, n);
    progress_log_flush(log, step);
}
/* Recall accuracy on eval_seqs fresh sequences from a fixed seed (the same set every time).
 * Sequence e is evaluated by replica e % dp; each rank scores its own tokens and the counts are
 * summed over every rank. Printed by rank 0. */
static double evaluate_recall(LlamaModel *m, LlamaActs *acts, SeqParallel *par, DataSource *ds,
                              const TrainOptions *o, FILE *out, RecallStats *stats_out) {
    int S = o->seq_len, N = par->n_local;
    int *inputs = xmalloc(sizeof(int) * S), *targets = xmalloc(sizeof(int) * S);
    int *li = xmalloc(sizeof(int) * N), *lt = xmalloc(sizeof(int) * N), *ld = xmalloc(sizeof(int) * N);
    int *pred = xmalloc(sizeof(int) * N);
    Rng rng;
    rng_seed(&rng, o->seed ^ 0xE7A1E7A1ull);
    RecallStats stats;
    memset(&stats, 0, sizeof stats);
    /* sequence e goes to replica e mod dp; every replica makes the same number of passes (a pass's
       collectives, e.g. ZeRO-3's gathers, can span the replicas), and the passes over sequences
       past --eval-seqs are not counted */
    const int dp = par->topo.dp, rounds = (o->eval_seqs + dp - 1) / dp;
    for (int e = 0; e < rounds * dp; e++) {
        recall_generate(&ds->spec, &rng, inputs, targets, ds->distance);
        if (e % dp != par->topo.dp_rank) continue;
        seq_parallel_take_local(par, inputs, li);
        seq_parallel_take_local(par, targets, lt);
        seq_parallel_take_local(par, ds->distance, ld);
        llama_forward_backward(m, acts, par->attn, li, lt, par->positions, N, 1.0f, 0, pred);
        if (e >= o->eval_seqs) continue;
        for (int i = 0; i < N; i++)
            if (lt[i] >= 0) recall_stats_add(&stats, ld[i], pred[i] == lt[i]);
    }
    if (par->topo.world_size > 1) {
        comm_control_allreduce(par->comm, "MPI_Iallreduce (eval counts)", stats.correct, RECALL_BUCKETS, MPI_LONG,
                               MPI_SUM, par->topo.world);
        comm_control_allreduce(par->comm, "MPI_Iallreduce (eval counts)", stats.total, RECALL_BUCKETS, MPI_LONG,
                               MPI_SUM, par->topo.world);
    }
    double acc = 0;
    if (par->topo.world_rank == 0) {
        acc = recall_stats_print(&stats, out);
    } else {
        long right = 0, all = 0;
        for (int b = 0; b < RECALL_BUCKETS; b++) right += stats.correct[b], all += stats.total[b];
        acc = all ? (double)right / (double)all : 0.0;
    }
    *stats_out = stats;
    xfree(inputs); xfree(targets); xfree(li); xfree(lt); xfree(ld); xfree(pred);
    return acc;
}
/* Evaluates recall, prints it (rank 0) after "LABEL (elapsed, ETA):" and appends it to the log:
 * {"step": N, "eval": "recall", "accuracy": x, "by_distance": [...], "elapsed_s": t}. eta < 0: none. */
static double eval_report(LlamaModel *m, LlamaActs *acts, SeqParallel *par, DataSource *ds, const TrainOptions *o,
                          FILE *log, long step, const char *label, double elapsed, double eta) {
    int root = par->topo.world_rank == 0;
    if (root) {
        char el[32], left[32];
        progress_format_duration(elapsed, el, sizeof el);
        progress_format_duration(eta, left, sizeof left);
        if (eta >= 0) printf("%s %ld (%s elapsed, ETA %s): ", label, step, el, left);
        else printf("%s %ld (%s elapsed): ", label, step, el);
    }
    RecallStats stats;
    double acc = evaluate_recall(m, acts, par, ds, o, stdout, &stats);
    if (root) {
        fflush(stdout);
        fprintf(log, "{\"step\": %ld, \"eval\": \"recall\", \"accuracy\": %.6f, \"by_distance\": ", step, acc);
        recall_stats_json(&stats, log);
        fprintf(log, ", \"elapsed_s\": %.3f}\n", elapsed);
        progress_log_flush(log, step);
    }
    return acc;
}
static void record_settings(TrainerState *st, const TrainOptions *o, const LlamaModel *m, const DataSource *ds,
                            const LlamaActs *acts, const SeqParallel *par) {
    /* the data by what it is, not by how --data spells it (a resume on the same files moved or named
     * another way was refused, one rewritten with as many other tokens accepted); checkpoints from
     * before this recorded "data" as given, which a token run no longer records, so they still resume */
    trainer_state_set(st, "data_kind", "%s", ds->is_recall ? "recall task" : "token files");
    if (ds->is_recall) trainer_state_set(st, "data", "%s", o->data);
    if (ds->ts.n_shards > 0) { /* the same files, not only the same name */
        char desc[96];
        token_stream_describe(&ds->ts, desc, sizeof desc);
        trainer_state_set(st, "data_shards", "%s", desc);
        uint32_t crc = 0;
        SeqErr e;
        int rank = 0; /* rank 0 reads the shards' ends (8 KiB each), not every rank of the job */
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        die_if_any_rank(rank == 0 && token_stream_fingerprint(&ds->ts, &crc, &e) != 0 ? &e : NULL);
        MPI_Bcast(&crc, 1, MPI_UINT32_T, 0, MPI_COMM_WORLD);
        trainer_state_set(st, "data_files", "0x%08x", (unsigned)crc);
    }
    trainer_state_set(st, "batch", "%d", o->batch);
    trainer_state_set(st, "steps", "%ld", o->steps);
    trainer_state_set(st, "lr", "%a", (double)o->opt.lr);
    trainer_state_set(st, "min_lr", "%a", (double)o->opt.min_lr);
    trainer_state_set(st, "warmup", "%ld", o->opt.warmup_steps);
    trainer_state_set(st, "weight_decay", "%a", (double)o->opt.weight_decay);
    trainer_state_set(st, "grad_clip", "%a", (double)o->opt.grad_clip);
    trainer_state_set(st, "betas", "%a,%a", (double)o->opt.beta1, (double)o->opt.beta2);
    trainer_state_set(st, "decay_all", "%d", o->opt.decay_all);
    trainer_state_set(st, "recall", o->recall_format == RECALL_FUSED ? "%d,%d,fused" : "%d,%d", o->recall_pairs,
                      o->recall_queries);
    trainer_state_set(st, "params", "%zu", m->table.total);
    /* these change the arithmetic (bf16 rounding; the order weight gradients are summed over FFN
       chunks; a strategy's streamed layers against whole ones, --no-stream), so a resume under another
       value would not continue the run bit for bit */
    trainer_state_set(st, "precision", "%s", precision_name(o->mem.precision));
    trainer_state_set(st, "ffn_chunks", "%d", llama_acts_ffn_chunks(acts));
    trainer_state_set(st, "streamed_layers", "%s", llama_acts_streams(acts) ? "yes" : "no (--no-stream or no chunks)");
    /* the strategy's knobs that change the arithmetic (its --chunks: its attention runs, and its layers
       stream, chunk by chunk, so another count sums in another order), recorded as NAME_KNOB after the
       two above, so that a resume differing in them too is refused with resume_layer_fix's flags
       (--chunks included); another strategy is another layout, and checkpoints without the setting
       resume under any value */
    for (const StrategyKnob *k = par->strategy->knobs; k && k->name; k++) {
        if (!k->recorded) continue;
        char key[64];
        strategy_knob_key(par->strategy, k, key, sizeof key);
        trainer_state_set(st, key, "%d", strategy_knob_value(k, &par->params));
    }
    /* always recorded, so that resuming with --pack changed either way is refused */
    if (o->eot >= 0) trainer_state_set(st, "pack_eot", "%d", o->eot);
    else trainer_state_set(st, "pack_eot", "none");
}
/* A save's source of sharded state (checkpoint_save_src): pieces fetched from the shards. */
typedef struct {
    GradSync *g;
    ShardArray arrays[3]; /* the parameter shard (zero 3), the moments m and v (in RAM or the offload file) */
    size_t total;
} SaveShards;
static void read_params(void *ctx, size_t first, size_t n, float *dst) {
    SaveShards *s = ctx;
    grad_sync_fetch(s->g, s->arrays, 0, first, n, dst);
}
static void read_moments(void *ctx, size_t first, size_t n, float *dst) { /* m as [0, total), v after it */
    SaveShards *s = ctx;
    const int v = first >= s->total;
    grad_sync_fetch(s->g, s->arrays, 1 + v, first - (v ? s->total : 0), n, dst);
}
/* Writes the checkpoint from rank 0. Sharded state (the AdamW moments under ZeRO, the parameters
 * under ZeRO-3) is fetched from its shards piece by piece while the files are written, so rank 0
 * never holds it whole. */
static void save_checkpoint(const char *dir, LlamaModel *m, const AdamW *opt, const TrainerState *st,
                            SeqParallel *par, uint64_t max_shard_bytes) {
    int root = par->topo.world_rank == 0;
    GradSync *g = &par->sync;
    SaveShards sh = {g, {{g->p_shard, g->offload, 2}, {opt->m, g->offload, 0}, {opt->v, g->offload, 1}}, m->table.total};
    const int sharded = grad_sync_streams(g);
    SeqErr e;
    int failed = 0;
    if (root) {
        AdamW whole = *opt; /* its range and step; the moments from the source where sharded */
        whole.begin = 0;
        whole.end = m->table.total;
        if (sharded) whole.m = whole.v = NULL; /* else this rank's range is all of it */
        CheckpointSource src = {{read_params, &sh}, {read_moments, &sh}};
        failed = checkpoint_save_src(dir, &m->cfg, &m->table, m->params, &whole, &src, max_shard_bytes, st, &e) != 0;
        grad_sync_fetch_done(g); /* after a failed write too: the shards' ranks wait for it */
    } else {
        grad_sync_serve(g, sh.arrays, 3);
    }
    if (par->topo.world_size > 1) comm_control_barrier(par->comm, "MPI_Ibarrier (after the save)", par->topo.world);
    /* a save that failed (the disk full, the directory gone) ends every rank with its line; the
     * previous checkpoint, if any, is untouched */
    die_if_any_rank(failed ? &e : NULL);
}
/* Tells the watchdog the step and phase; slow phases (the first step, saves) get
 * COMM_SLOW_PHASE_FACTOR times the deadline. */
static void watch(SeqParallel *par, long step, const char *phase, int slow) {
    comm_set_step(par->comm, step, phase);
    comm_set_timeout(par->comm, par->cfg.comm_timeout * (slow ? COMM_SLOW_PHASE_FACTOR : 1));
}
/* The JSON-lines log, appended to. Opened without waiting: a FIFO with no reader is an error here
 * (a plain open would wait for one forever); with a reader (a named pipe being read, or a shell's
 * process substitution) it is used as a file. A regular file already there must be a log (a
 * resumed run appends to its own): its first record a run start, not some other file the records
 * would be appended to. NULL and *e on failure. */
/* A regular file at `path` that is not a seqpar log: -1 and *e (open_log's and --dry-run's refusal). */
static int log_file_check(const char *path, SeqErr *e) {
    static const char head[] = "{\"run_start\": ";
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
        char first[sizeof head - 1];
        const int rfd = open(path, O_RDONLY | O_CLOEXEC);
        const int same = rfd >= 0 && read(rfd, first, sizeof first) == (ssize_t)sizeof first &&
                         memcmp(first, head, sizeof first) == 0;
        if (rfd >= 0) close(rfd);
        if (!same)
            return seq_err(e, "--log '%s' is a file that is not a seqpar log (its first line is no run_start record): "
                           "give a new file or the log of an earlier run", path);
    }
    return 0;
}
static FILE *open_log(const char *path, SeqErr *e) {
    if (log_file_check(path, e) != 0) return NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENXIO) {
        seq_err(e, "--log '%s' is a FIFO that no process is reading: start its reader first, or give a regular file",
                path);
        return NULL;
    }
    int flags = fd < 0 ? -1 : fcntl(fd, F_GETFL);
    FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "a");
    if (!f) {
        seq_err(e, "cannot open '%s' as the log: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
    }
    return f;
}
/* Where a stop signal's checkpoint goes without --save: DIR/checkpoint-stepN, DIR holding the log. */
static void default_stop_dir(const char *log_path, long step, char *buf, size_t n) {
    const char *slash = strrchr(log_path, '/');
    if (slash) snprintf(buf, n, "%.*s/checkpoint-step%ld", (int)(slash - log_path), log_path, step);
    else snprintf(buf, n, "checkpoint-step%ld", step);
}
/* A resume's moments into the optimizer offload's file (CheckpointSink). */
static void moments_to_offload(void *ctx, int moment, size_t first, size_t n, const float *src) {
    optimizer_offload_write(ctx, moment, first, n, src);
}
/* Every rank reads the checkpoint (the directory must be visible to all ranks) and, of the AdamW
 * moments (saved whole), only its own shard (into RAM, or through `offload` into its file), and of
 * the weights [lo, hi) (ZeRO-3: its shard; else all), so any rank layout resumes any checkpoint
 * without a rank holding the whole moments. An error on any rank ends every rank with one line. */
static void load_checkpoint(const char *dir, LlamaModel *m, size_t lo, size_t hi, AdamW *opt, OptOffload *offload,
                            TrainerState *st, const char *advice) {
    SeqErr e;
    const CheckpointSink sink = {moments_to_offload, offload};
    int failed = checkpoint_read_part_to(dir, NULL, &m->table, m->params, lo, hi, opt, offload ? &sink : NULL, st,
                                         &e) != 0;
    if (!failed && offload) failed = optimizer_offload_error(offload, &e) != 0;
    if (failed) checkpoint_error_advice(&e, advice);
    die_if_any_rank(failed ? &e : NULL);
}
/* The flags that give this run a checkpoint's FFN chunks and layer streaming back (its settings
 * "ffn_chunks" and "streamed_layers"), for the refusal of a resume that differs in either: "with
 * --no-stream --ffn-chunks 2", "with --chunks 2 --ffn-chunks 2", "with --ffn-chunks 4 and without
 * --no-stream". Under a strategy's streamed layers a --ffn-chunks K is rounded up to a multiple of
 * --chunks (llama_ffn_chunk_count), so the saved count alone may not resume (--ffn-chunks 2 makes 3
 * chunks under --chunks 3). ""
 * where no flag gives them back to this run's N local tokens (another rank layout's): the refusal
 * then names --ffn-chunks and the saved count. */
static void resume_layer_fix(const TrainerState *saved, const TrainerState *now, const TrainOptions *o,
                             const SeqAttention *attn, long N, char *fix, size_t n) {
    fix[0] = '\0';
    const char *sk = trainer_state_get(saved, "ffn_chunks"), *nk = trainer_state_get(now, "ffn_chunks");
    const char *ss = trainer_state_get(saved, "streamed_layers"), *ns = trainer_state_get(now, "streamed_layers");
    if (!sk || !nk || !ns || (!strcmp(sk, nk) && (!ss || !strcmp(ss, ns)))) return; /* nothing to give back */
    char *end;
    const long want = strtol(sk, &end, 10);
    if (*end || want <= 0) return;
    const int now_streams = !strncmp(ns, "yes", 3), streamed = ss ? !strncmp(ss, "yes", 3) : now_streams;
    /* the streaming strategy's --chunks where the checkpoint recorded them (NAME_chunks): a resume under
     * another count is refused after these two, so the fix names the saved one */
    const Strategy *streamer = NULL; /* the streaming strategy: the one the checkpoint recorded, else the first */
    char key[64] = "";
    for (int i = 0; strategy_at(i); i++) {
        const Strategy *s = strategy_at(i);
        if (!s->streams || !strategy_chunk_knob(s)) continue;
        strategy_knob_key(s, strategy_chunk_knob(s), key, sizeof key);
        if (!streamer || trainer_state_get(saved, key)) streamer = s;
        if (trainer_state_get(saved, key)) break;
    }
    const char *flag = streamer ? strategy_chunk_knob(streamer)->name : "chunks"; /* its chunk count's flag */
    if (streamer) strategy_knob_key(streamer, strategy_chunk_knob(streamer), key, sizeof key);
    const char *sc = streamer ? trainer_state_get(saved, key) : NULL, *nc = streamer ? trainer_state_get(now, key) : NULL;
    const long saved_u = sc ? strtol(sc, NULL, 10) : 0;
    if (!streamed) { /* whole layers: --no-stream where this run streams */
        const long K = llama_ffn_chunks_flag(N, want, 1, N);
        char chunks[48] = "";
        if (sc && nc && strcmp(sc, nc) != 0) snprintf(chunks, sizeof chunks, "--%.16s %ld ", flag, saved_u);
        if (K > 0) snprintf(fix, n, "with %s%s--ffn-chunks %ld", chunks, now_streams ? "--no-stream " : "", K);
        return;
    }
    /* streamed layers: a streaming strategy's with --chunks u > 1, not under --checkpoint selective; the saved u
     * where it was recorded, else this run's u where it gives the count back, else the u nearest to
     * it that does (u must divide N) */
    if (!streamer || strcmp(attn->name, streamer->name) != 0 || !llama_streams(2, o->mem.checkpoint, 0)) {
        /* under the --chunks it was trained with, its count is --ffn-chunks' (llama_ffn_chunks_flag) */
        char chunks[48];
        snprintf(chunks, sizeof chunks, "with its --%.16s", flag);
        if (saved_u > 1) snprintf(chunks, sizeof chunks, "--%.16s %ld", flag, saved_u);
        if (snprintf(fix, n, "with %s's streamed layers as it was trained (--strategy %s %s, not under "
                     "--checkpoint selective) and --ffn-chunks %ld", streamer ? streamer->title : "the",
                     streamer ? streamer->name : "", chunks, want) < 0)
            fix[0] = '\0';
        return;
    }
    const long u = attn->stream_chunks > 1 ? attn->stream_chunks : 1;
    long best_u = 0, best_K = 0;
    for (long v = 2; v <= want && v <= N; v++) /* the count is v x the chunks inside each of v */
        if ((saved_u <= 0 || v == saved_u) && N % v == 0 && want % v == 0 &&
            (!best_K || labs(v - u) < labs(best_u - u))) {
            const long K = llama_ffn_chunks_flag(N, want, (int)v, N / v);
            if (K > 0) best_u = v, best_K = K;
        }
    if (!best_K) return;
    char chunks[48] = "";
    if (best_u != u) snprintf(chunks, sizeof chunks, "--%.16s %ld ", flag, best_u);
    snprintf(fix, n, "with %s--ffn-chunks %ld%s", chunks, best_K, o->mem.no_stream ? " and without --no-stream" : "");
}
/* A resumed state must fit this run: same settings, a step inside the --steps schedule and a
 * data cursor inside the token data. */
static int check_resumed(const TrainerState *st, const TrainerState *now, const TrainOptions *o, DataSource *ds,
                         const SeqAttention *attn, long N, SeqErr *e) {
    char layer_fix[160];
    resume_layer_fix(st, now, o, attn, N, layer_fix, sizeof layer_fix);
    if (trainer_state_compare(st, now, o->resume_dir, layer_fix, e) != 0) return -1;
    if (st->seed != now->seed) /* the data stream continues from the checkpoint; evaluation would not */
        return seq_err(e, "checkpoint %s was trained with --seed %llu but this run uses %llu: resume with --seed %llu "
                       "or start a new run", o->resume_dir, (unsigned long long)st->seed,
                       (unsigned long long)now->seed, (unsigned long long)st->seed);
    if (st->step > o->steps)
        return seq_err(e, "checkpoint %s is at step %ld, beyond this run's schedule of --steps %ld: resume with the "
                       "--steps it was saved with, or start a new run", o->resume_dir, st->step, o->steps);
    return ds->is_recall ? 0 : token_stream_seek(&ds->ts, st->data_shard, st->data_cursor, e);
}
/* What the refusal of a damaged or incomplete --resume checkpoint advises (checkpoint.c's messages
 * end in it), by how this run names it. Under --auto-resume the --save DIR is the run's only
 * checkpoint ("resume from another checkpoint" did not say how): restore it, or move it out of the
 * way, and the next start begins afresh, or continues the whole copy an interrupted save left
 * beside it as DIR.old.* (checkpoint_recover). --resume DIR --save DIR: another checkpoint resumes
 * into another --save only (DIR holds one that run would not continue). */
static void damage_advice(const TrainOptions *o, char *advice, size_t n) {
    const char *d = o->resume_dir;
    if (o->auto_resume)
        snprintf(advice, n, "restore %s from a copy, or move it aside (mv %s %s.damaged) and --auto-resume "
                 "starts the run afresh (or continues a whole %s.old.* copy that an interrupted save left beside it)",
                 d, d, d, d);
    else if (o->save_dir && same_file(d, o->save_dir))
        snprintf(advice, n, "restore %s from a copy, or resume from another checkpoint with another --save "
                 "directory", d);
    else
        snprintf(advice, n, "resume from another checkpoint");
}
/* The --resume checkpoint's config (collective: a refusal on any rank ends every rank, ending in
 * the run's advice). */
static void read_resumed_config(const char *dir, LlamaConfig *cfg, const char *advice) {
    SeqErr e;
    const int failed = checkpoint_read_config(dir, cfg, &e) != 0;
    if (failed) checkpoint_error_advice(&e, advice);
    die_if_any_rank(failed ? &e : NULL);
}
/* The end of a run (collective: the parallel state's communicators; writes --trace). */
static void run_free(LlamaActs *acts, SeqParallel *par, AdamW *opt, DataSource *ds, Validation *vp, LlamaModel *model) {
    llama_acts_free(acts);
    parallel_free_or_die(par);
    adamw_free(opt);
    if (ds->is_recall) xfree(ds->distance); else token_stream_close(&ds->ts);
    if (vp) validation_close(vp);
    llama_free(model);
}
/* What the start's checks leave to the run: rank 0's lock on --save (-1: none), held to the end, and
 * what a refusal of a damaged --resume checkpoint advises. */
typedef struct {
    int save_lock;
    char advice[512];
} StartState;
/* The checks a run makes before it reads a model: the data (opened into *ds), --save, --resume's
 * checkpoint, --trace and --log. dry (--dry-run): the same refusals, but --save is neither locked nor
 * brought back from an interrupted save, and nothing is said about starting. Collective. */
static void start_checks(TrainOptions *o, SizeFlags *sf, DataSource *ds, StartState *ss, int dry) {
    /* data */
    memset(ds, 0, sizeof *ds);
    ds->is_recall = !strcmp(o->data, "recall");
    SeqErr err;
    if (!ds->is_recall) {
        die_if_any_rank(token_stream_open(&ds->ts, o->data, o->tokens_format, STREAM_TRAIN, &err) != 0 ? &err : NULL);
        data_length_check(&ds->ts, o->seq_len, o->data);
        if (!o->model_dir && !o->resume_dir) size_flags_fit_data(sf, &ds->ts, o->data); /* a vocabulary that covers it */
    }
    /* Where --save names no directory, a save interrupted between the two renames of its fallback may
     * have left the last checkpoint beside it (DIR.old.*): rank 0 brings it back, under the save lock,
     * before any rank reads --save or --resume; --auto-resume then continues what --save holds. */
    ss->save_lock = -1;
    int auto_start = 0; /* --auto-resume found no checkpoint: rank 0 says it starts the run (not before a
                           refusal of the --save path: one line, the refusal) */
    if (o->save_dir) {
        int rank = 0, holds = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        int bad = 0;
        if (rank == 0 && !dry) {
            SeqErr lock_err; /* a lock refused here is reported below, after the --save path's checks */
            char *from = NULL;
            struct stat sb; /* only a missing DIR can be an interrupted save's (no lock file beside a refused one) */
            if (lstat(o->save_dir, &sb) != 0 && errno == ENOENT) ss->save_lock = checkpoint_lock(o->save_dir, &lock_err);
            const int r = ss->save_lock >= 0 ? checkpoint_recover(o->save_dir, &from, &err) : 0;
            bad = r < 0;
            if (r == 1)
                printf("seqpar: checkpoint %s brought back from %s, where a save interrupted between its two renames "
                       "left it\n", o->save_dir, from);
            fflush(stdout); /* before any error line of this start */
            xfree(from);
            holds = !bad && checkpoint_exists(o->save_dir);
        } else if (rank == 0) {
            holds = checkpoint_exists(o->save_dir);
        }
        die_if_any_rank(bad ? &err : NULL); /* also: no rank reads --save before it is back */
        if (o->auto_resume) {
            MPI_Bcast(&holds, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (holds) { /* as --resume DIR --save DIR; the checkpoint holds the model */
                o->resume_dir = o->save_dir;
                o->model_dir = NULL;
                o->random_init = 0;
            } else {
                auto_start = rank == 0 && !dry; /* said once the --save path's checks below have passed */
            }
        }
    }
    /* the checkpoint resumed from first: a damaged one is named as such, not as a --save directory
     * "that is no seqpar checkpoint" where both flags name it */
    snprintf(ss->advice, sizeof ss->advice, "%s", CHECKPOINT_DAMAGE_ADVICE);
    if (o->resume_dir) {
        damage_advice(o, ss->advice, sizeof ss->advice);
        LlamaConfig resumed;
        read_resumed_config(o->resume_dir, &resumed, ss->advice);
    }
    /* An unusable --save path ends the run now, not after training (rank 0 checks, all end). */
    if (o->save_dir) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        int bad = rank == 0 && checkpoint_check_target(o->save_dir, &err) != 0;
        /* another run's checkpoint is not replaced unless this run continues it */
        /* another run on the same --save now (one that started with it, or is starting) */
        if (rank == 0 && !bad && ss->save_lock < 0 && !dry)
            bad = (ss->save_lock = checkpoint_lock(o->save_dir, &err)) < 0;
        if (rank == 0 && !bad && checkpoint_exists(o->save_dir) && !(o->resume_dir && same_file(o->resume_dir, o->save_dir)))
            bad = seq_err(&err, "--save %s already holds a checkpoint that this run does not continue: give a new "
                          "directory, continue it with --resume %s, or remove it first", o->save_dir, o->save_dir) != 0;
        /* under the lock: what saves killed before they ended left beside it (each up to a whole
         * checkpoint, never removed by seqpar: they piled up without a word until a save found the
         * disk full) */
        char *left = NULL;
        uint64_t left_bytes = 0;
        const int n_left = rank == 0 && !bad ? checkpoint_leftovers(o->save_dir, &left, &left_bytes) : 0;
        if (n_left > 0) {
            fprintf(stderr, "seqpar: warning: --save %s: %d interrupted save%s left %.1f MB beside it (%s%s), which "
                    "seqpar never removes: delete %s when no run is writing %s\n", o->save_dir, n_left,
                    n_left == 1 ? "" : "s", (double)left_bytes / 1e6, left, n_left == 1 ? "" : ", ...",
                    n_left == 1 ? "it" : "them", o->save_dir);
            fflush(stderr);
        }
        xfree(left);
        die_if_any_rank(bad ? &err : NULL);
        if (auto_start) {
            printf("seqpar: --auto-resume: %s holds no checkpoint yet: starting the run\n", o->save_dir);
            fflush(stdout);
        }
    }
    trace_target_check(&o->par, o->save_dir); /* and --trace, written at the end */
    if (o->log_path && o->par.trace_path && paths_same(o->log_path, o->par.trace_path)) /* the trace replaced the log */
        die_collective("--log and --trace both name %s: give each its own file", o->log_path);
    if (o->log_path && o->save_dir && path_inside_dir(o->log_path, o->save_dir)) /* it went with the old copy */
        die_collective("--log %s lies in the --save directory %s, which every save replaces whole: write the log "
                       "elsewhere", o->log_path, o->save_dir);
}
/* The model's config (--resume's checkpoint, --model's config.json, or the size flags) and the
 * checks on it: size flags against it, the data flags (*o's eot set), the recall task (*ds's spec).
 * dry: --model's weights are checked to be there, not read. Collective. */
static void model_checks(TrainOptions *o, SizeFlags *sf, DataSource *ds, const char *advice, LlamaConfig *c, int dry) {
    if (o->resume_dir) {
        read_resumed_config(o->resume_dir, c, advice);
    } else if (o->model_dir) { /* built here, its weights loaded once the shards are known (below) */
        model_dir_config(o->model_dir, c);
        if (dry) model_dir_weights_check(o->model_dir, o->random_init);
    } else {
        *c = sf->cfg;
        size_flags_validate(c);
    }
    if (o->resume_dir || o->model_dir) size_flags_check(sf, c, "train", o->resume_dir ? o->resume_dir : o->model_dir);
    ds->ts.vocab_size = c->vocab_size; /* every shard is checked when it is loaded */
    o->eot = train_data_flags_check(o, ds->is_recall, c->vocab_size, "train");
    if (ds->is_recall) {
        ds->spec = recall_spec_from_options(o, c->vocab_size);
        o->recall_pairs = ds->spec.n_pairs;
        o->recall_queries = ds->spec.n_queries;
    }
}
/* The checks once the grid is known: --batch over the dp replicas and the validation data (opened
 * into *val; NULL without it). Collective. */
static Validation *grid_checks(TrainOptions *o, const DataSource *ds, const LlamaConfig *c, int dp, Validation *val) {
    char *batch_err = batch_split_error(o->batch, dp);
    if (batch_err) die_collective("%s", batch_err);
    /* llm.c's layout: a --data directory's *_val_* shards are its held-out data */
    if (!o->val_data && !ds->is_recall && token_stream_dir_has_val(o->data)) o->val_data = o->data;
    if (!o->val_data) return NULL;
    SeqErr err;
    die_if_any_rank(validation_open(val, o->val_data, o->tokens_format, o->seq_len, o->eval_batches, o->batch, dp,
                                    c->vocab_size, o->eot, &err) != 0 ? &err : NULL);
    val_overlap_check(&val->stream, &ds->ts);
    return val;
}
/* RAM a rank needs beyond the memory model's tracked allocations: the C runtime, MPI, thread stacks
 * (docs/memory.md: tens of MiB; seqpar plan's default --runtime-mib). */
#define RUNTIME_BYTES (64.0 * 1048576)
/* The memory model of this run on `world` ranks of `threads` threads each (0: the model's default for
 * this machine's cores): NULL, or its one-line refusal (xmalloc'd). */
static char *run_estimate(const TrainOptions *o, const DataSource *ds, const LlamaConfig *c, int world, int threads,
                          MemoryModelInput *in, MemoryEstimate *m) {
    memset(in, 0, sizeof *in);
    in->model = *c;
    in->world = world;
    in->cores = omp_get_num_procs();
    in->recall_data = ds->is_recall;
    memory_input_settings(o, ds->is_recall ? NULL : &ds->ts, in);
    if (threads > 0) in->par.threads = threads;
    return memory_model_estimate(in, m);
}
/* The memory plan against what a rank has: RAM (the estimate plus RUNTIME_BYTES) against
 * --mem-per-rank, else this node's RAM over its `ranks_here` ranks; the disk tier (--offload-dir)
 * against the free space there, shared by the node's ranks. ranks_here 0: a job for another
 * cluster (--dry-run --ranks), of which only --mem-per-rank is known. A refusal ends every rank with
 * one line; else, on rank 0 where `said`, what was checked. Collective where ranks_here > 0. */
/* bytes as "N.NN GiB", or "N.N MiB" below a GiB, into buf */
static const char *size_text(double bytes, char *buf, size_t n) {
    if (bytes >= 1073741824.0) snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    return buf;
}
static void memory_fit_check(const TrainOptions *o, const MemoryEstimate *m, int ranks_here, char *said, size_t n) {
    const double need = m->ram_total + RUNTIME_BYTES;
    double have = o->mem_per_rank;
    char whose[160], t1[32], t2[32], t3[32], t4[32];
    if (have > 0) snprintf(whose, sizeof whose, "--mem-per-rank %g", have / 1073741824.0);
    else if (ranks_here > 0) {
        const double node = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        have = node / ranks_here;
        snprintf(whose, sizeof whose, "this node's %s of RAM over its %d rank%s", size_text(node, t1, sizeof t1),
                 ranks_here, ranks_here == 1 ? "" : "s");
    }
    SeqErr e;
    int bad = 0;
    if (have > 0 && need > have)
        bad = seq_err(&e, "this run needs %s of RAM per rank (the memory model's %s for rank %d, plus %.0f MiB of "
                      "runtime) but a rank has %s (%s): use more ranks, --zero 3, --checkpoint layer, --offload-dir DIR "
                      "or a shorter --seq-len ('seqpar memory' shows where it goes, 'seqpar plan' what fits)",
                      size_text(need, t1, sizeof t1), size_text(m->ram_total, t2, sizeof t2), m->rank,
                      RUNTIME_BYTES / 1048576, size_text(have, t3, sizeof t3), whose) != 0;
    /* the disk tiers: --offload-dir's (activations) and --offload-optimizer's (the moments), summed
     * where both directories lie on one file system */
    const char *dirs[2] = {o->par.offload_dir, o->par.offload_optimizer};
    const char *flags[2] = {"--offload-dir", "--offload-optimizer"};
    const double opt_disk = m->disk[MEM_OPTIMIZER] + m->disk[MEM_PARAMS]; /* the weights' shard: --offload-master */
    double per_rank[2] = {m->disk_total - opt_disk, opt_disk};
    double disk_need[2] = {0, 0}, disk_free[2] = {-1, -1};
    struct stat dev[2];
    for (int k = 0; k < 2 && !bad && ranks_here > 0; k++) {
        if (!dirs[k] || per_rank[k] <= 0) continue;
        struct statvfs vs;
        disk_need[k] = per_rank[k] * ranks_here;
        if (statvfs(dirs[k], &vs) == 0) disk_free[k] = (double)vs.f_bavail * (double)vs.f_frsize;
        double need = disk_need[k], rank_need = per_rank[k];
        if (k == 1 && disk_need[0] > 0 && stat(dirs[0], &dev[0]) == 0 && stat(dirs[1], &dev[1]) == 0 &&
            dev[0].st_dev == dev[1].st_dev)
            need += disk_need[0], rank_need += per_rank[0]; /* one file system holds both */
        if (disk_free[k] >= 0 && need > disk_free[k])
            bad = seq_err(&e, "the disk tier needs %s under %s %s (%s a rank x %d rank%s of this node) but %s "
                          "are free there: free space, or give %s on a larger disk", size_text(need, t1, sizeof t1),
                          flags[k], dirs[k], size_text(rank_need, t2, sizeof t2), ranks_here, ranks_here == 1 ? "" : "s",
                          size_text(disk_free[k], t3, sizeof t3), flags[k]) != 0;
    }
    if (ranks_here > 0) die_if_any_rank(bad ? &e : NULL);
    else if (bad) die_collective("%s", e.msg);
    if (!said) return;
    int k = have > 0 ? snprintf(said, n, "RAM per rank %s (with %.0f MiB of runtime) of %s (%s)",
                                size_text(need, t1, sizeof t1), RUNTIME_BYTES / 1048576, size_text(have, t2, sizeof t2),
                                whose)
                     : snprintf(said, n, "RAM per rank %s (with %.0f MiB of runtime): not checked (give "
                                "--mem-per-rank GIB, the RAM a rank of that cluster has)", size_text(need, t1, sizeof t1),
                                RUNTIME_BYTES / 1048576);
    for (int d = 0; d < 2; d++)
        if (k > 0 && (size_t)k < n && disk_free[d] >= 0) {
            const int w = snprintf(said + k, n - (size_t)k, "; %s %s of %s free under %s",
                                   d ? "optimizer on disk" : "disk tier", size_text(disk_need[d], t3, sizeof t3),
                                   size_text(disk_free[d], t4, sizeof t4), dirs[d]);
            k = w > 0 ? k + w : k;
        }
}
/* --dry-run: the run's checks, each by the code the run makes it with (start_checks, model_checks,
 * seq_parallel_check, grid_checks, memory_fit_check), and the memory plan; allocates no weights,
 * activations or optimizer state and writes nothing. --ranks P: the job of P ranks checked from this
 * process (the grid's refusals are then the memory model's, as seqpar memory --ranks gives them). */
static int dry_run(TrainOptions *o, SizeFlags *sf) {
    DataSource ds;
    StartState ss;
    start_checks(o, sf, &ds, &ss, 1);
    LlamaConfig c;
    model_checks(o, sf, &ds, ss.advice, &c, 1);
    o->par.wire_bf16 = o->mem.precision == PRECISION_BF16;
    MemoryModelInput in;
    MemoryEstimate m;
    Validation val, *vp = NULL;
    int rank = 0, world, ranks_here = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char *err;
    if (!o->dry_ranks) {
        SeqParallel par;
        seq_parallel_check(&par, &o->par, &c, o->seq_len);
        world = par.topo.world_size;
        vp = grid_checks(o, &ds, &c, par.topo.dp, &val);
        err = run_estimate(o, &ds, &c, world, par.threads, &in, &m);
        seq_parallel_check_free(&par);
        ranks_here = seq_parallel_ranks_on_node();
    } else {
        world = o->dry_ranks;
        const int rpn = o->par.ranks_per_node, cores = omp_get_num_procs();
        err = run_estimate(o, &ds, &c, world, o->par.threads > 0 || rpn <= 0 ? 0 : (cores / rpn > 0 ? cores / rpn : 1),
                           &in, &m);
        if (err) die_collective("%s", err);
        vp = grid_checks(o, &ds, &c, m.dp, &val);
    }
    char said[512];
    if (!err) memory_fit_check(o, &m, ranks_here, said, sizeof said);
    else snprintf(said, sizeof said, "memory not checked: the memory model does not know this run (%s)", err);
    if (o->log_path) { /* rank 0 opens it in the run, after every other check */
        SeqErr le;
        die_if_any_rank(rank == 0 && log_file_check(o->log_path, &le) != 0 ? &le : NULL);
    }
    if (vp) validation_close(vp);
    if (!ds.is_recall) token_stream_close(&ds.ts);
    if (rank == 0) {
        if (!err) memory_estimate_print(stdout, &in, &m);
        printf("dry run: %s\n", said);
        if (o->dry_ranks)
            printf("dry run: every check of seqpar train passed for %d rank%s (checked from one process); nothing was "
                   "allocated or written: start them with mpirun -np %d, without --dry-run and --ranks\n", world,
                   world == 1 ? "" : "s", world);
        else
            printf("dry run: every check of seqpar train passed on %d rank%s; nothing was allocated or written: run it "
                   "without --dry-run\n", world, world == 1 ? "" : "s");
        fflush(stdout);
    }
    xfree(err);
    return 0;
}
/* The configuration a run was built with as train flags (TRAIN_RECORD_KEY's value): its grid as
 * resolved, the knobs as given, no --offload-dir (a path, not a choice: the resume's own). */
static void record_config(const SeqParallel *par, int checkpoint, int ffn_chunks, char *buf, size_t n) {
    PlanEntry e;
    memset(&e, 0, sizeof e);
    e.par = par->cfg;
    e.par.strategy = par->strategy->name;
    e.par.dp = par->topo.dp, e.par.hp = par->topo.hp, e.par.cp = par->topo.cp;
    e.par.offload_dir = NULL;
    e.checkpoint = checkpoint;
    e.ffn_chunks = ffn_chunks;
    plan_flags(&e, buf, n);
}
/* train_run and train_measure: m NULL for the run; else nothing printed, logged or saved, and the
 * steps' times and last loss in *m. */
static int run(const TrainOptions *options, const SizeFlags *sizes, int argc, char **argv, TrainMeasure *m) {
    TrainOptions o = *options;
    SizeFlags sf = *sizes;
    int S = o.seq_len;

    if (o.dry_run) return dry_run(&o, &sf);
    DataSource ds;
    StartState ss;
    start_checks(&o, &sf, &ds, &ss, 0);
    int save_lock = ss.save_lock;
    const char *advice = ss.advice;
    SeqErr err;

    /* model: its config and checks; built once the grid and the memory plan are checked */
    LlamaConfig cfg;
    model_checks(&o, &sf, &ds, advice, &cfg, 0);

    SeqParallel par;
    o.par.wire_bf16 = o.mem.precision == PRECISION_BF16; /* the head exchange in bf16 too */
    FaultPlan faults;
    fault_plan_from_env(&faults);
    int world_rank0 = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank0);
    fault_maybe_hang(&faults, world_rank0, 0); /* step 0: before the communicators are made */
    seq_parallel_check(&par, &o.par, &cfg, S);
    /* before anything big is allocated (the model, the strategy's buffers, the activations and the
     * optimizer state): the batch, the validation data, and the memory plan against what a rank has
     * (the checks --dry-run makes, by the same functions) */
    Validation val, *vp = grid_checks(&o, &ds, &cfg, par.topo.dp, &val);
    {
        MemoryModelInput in;
        MemoryEstimate est;
        char *merr = run_estimate(&o, &ds, &cfg, par.topo.world_size, par.threads, &in, &est);
        if (!merr) memory_fit_check(&o, &est, seq_parallel_ranks_on_node(), NULL, 0);
        xfree(merr); /* a run the memory model does not know is not refused for it */
    }
    LlamaModel model; /* --model's weights are loaded once the shards are known (below) */
    llama_build(&model, &cfg);
    const LlamaConfig *c = &model.cfg;
    if (ds.is_recall) ds.distance = xmalloc(sizeof(int) * S);
    seq_parallel_finish(&par, c, model.table.total);
    /* the weights: under ZeRO-3 each rank fills only its shard of the flat parameters (the rest is
     * never written: its pages take no memory until grad_sync_attach frees the buffer) */
    size_t load_lo = 0, load_hi = model.table.total;
    if (o.par.zero == 3 && par.sync.counts) load_lo = par.sync.shard_begin, load_hi = par.sync.shard_end;
    if (!o.resume_dir && o.model_dir) model_dir_load(&model, o.model_dir, o.seed, o.random_init, load_lo, load_hi);
    else if (!o.resume_dir) llama_init_random_part(&model, o.seed, load_lo, load_hi);
    if (o.trace_step) trace_set_recording(par.comm->trace, 0); /* on again for that step only */
    int root = par.topo.world_rank == 0, dp = par.topo.dp, N = par.n_local;
    const int say = root && !m; /* rank 0 prints and logs, unless measuring */
    int per_replica = o.batch / dp;

    LlamaActsOptions ao = {.checkpoint = o.mem.checkpoint, .ffn_chunks = o.mem.ffn_chunks, .offload_dir = o.par.offload_dir,
                           .rank = par.topo.world_rank, .precision = o.mem.precision,
                           .no_stream = o.mem.no_stream};
    LlamaActs *acts = llama_acts_create_opts(&model, par.attn, N, &ao);
    AdamW opt;
    if (o.par.offload_optimizer) { /* the moments in a file of their own, its space reserved now */
        adamw_init_unbacked(&opt, &o.opt, par.sync.shard_begin, par.sync.shard_end);
        SeqErr oe;
        par.sync.offload = optimizer_offload_create(o.par.offload_optimizer, par.topo.world_rank,
                                                    par.sync.shard_end - par.sync.shard_begin, o.par.offload_master, &oe);
        if (!par.sync.offload && par.topo.world_size > 1) {
            SeqErr ranked;
            seq_err(&ranked, "rank %d: %s", par.topo.world_rank, oe.msg);
            oe = ranked;
        }
        die_if_any_rank(par.sync.offload ? NULL : &oe);
    } else {
        adamw_init(&opt, &o.opt, par.sync.shard_begin, par.sync.shard_end);
    }
    TrainerState st, now;
    trainer_state_init(&now);
    now.seed = o.seed;
    now.seq_len = S;
    record_settings(&now, &o, &model, &ds, acts, &par);
    if (o.resume_dir) {
        load_checkpoint(o.resume_dir, &model, load_lo, load_hi, &opt, par.sync.offload, &st, advice);
        die_if_any_rank(check_resumed(&st, &now, &o, &ds, par.attn, N, &err) != 0 ? &err : NULL);
        /* the settings every key of which matched: this version's, so that its saves record them all */
        st.n_settings = now.n_settings;
        memcpy(st.settings, now.settings, sizeof st.settings);
        if (st.step >= o.stop_at) { /* a finished run or slice: say so and end cleanly (a requeued job) */
            if (say) {
                if (o.stop_at == o.steps)
                    printf("checkpoint %s is at step %ld, the end of its --steps schedule: nothing to train\n",
                           o.resume_dir, st.step);
                else
                    printf("checkpoint %s is at step %ld, at or past --stop-at %ld: nothing to train (a later --stop-at, "
                           "up to --steps %ld, continues it)\n", o.resume_dir, st.step, o.stop_at, o.steps);
                fflush(stdout);
            }
            run_free(acts, &par, &opt, &ds, vp, &model);
            return 0;
        }
        if (say) printf("resumed from %s at step %ld\n", o.resume_dir, st.step);
    } else {
        st = now;
        rng_seed(&st.data_rng, o.seed * 0x9E3779B97F4A7C15ull + 17);
    }
    { /* the configuration it runs, for a resume under --strategy auto (never compared: saved only) */
        char cfg[sizeof st.settings[0].value];
        record_config(&par, o.mem.checkpoint, o.mem.ffn_chunks, cfg, sizeof cfg);
        trainer_state_set(&st, TRAIN_RECORD_KEY, "%s", cfg);
    }

    grad_sync_attach(&par.sync, &model); /* zero 2/3: per-layer reduce-scatter (and gathers) */
    int *g_inputs = xmalloc(sizeof(int) * (size_t)S * o.batch), *g_targets = xmalloc(sizeof(int) * (size_t)S * o.batch);
    int *inputs = xmalloc(sizeof(int) * (size_t)N * per_replica), *targets = xmalloc(sizeof(int) * (size_t)N * per_replica);
    /* --pack: document starts of the global batch and of this rank's tokens (data/packing.h) */
    int *g_docs = o.eot >= 0 ? xmalloc(sizeof(int) * (size_t)S * o.batch) : NULL;
    int *docs = o.eot >= 0 ? xmalloc(sizeof(int) * (size_t)N * per_replica) : NULL;

    /* under bf16 the matmuls run at the bf16 GEMM's rate: utilisation is against that peak */
    const int bf16 = o.mem.precision == PRECISION_BF16;
    double peak = o.peak_gflops > 0 ? o.peak_gflops
                  : bf16           ? bf16_gemm_peak_gflops(SGEMM_PEAK_TRIALS)
                                   : sgemm_peak_gflops(SGEMM_PEAK_TRIALS);
    double flops_per_token = llama_train_flops_per_token(c, S);
    double hw_flops_per_token = flops_per_token + llama_recompute_flops_per_token(c, S, acts);
    int clamped = 0; /* a utilisation above 100% was printed as 100% */
    char run_log[4096];
    if (!o.log_path && !m) { /* a log of its own: runs/<UTC date-time>/train.jsonl ($SEQPAR_RUNS for runs/) */
        char dir[4000];
        const char *runs = getenv("SEQPAR_RUNS");
        die_if_any_rank(run_dir_create(runs && *runs ? runs : "runs", MPI_COMM_WORLD, dir, sizeof dir, &err) != 0 ? &err : NULL);
        snprintf(run_log, sizeof run_log, "%s/train.jsonl", dir);
        o.log_path = run_log;
    }
    FILE *log = NULL;
    if (say) {
        if (make_parent_dirs(o.log_path, &err) == 0) log = open_log(o.log_path, &err);
    }
    die_if_any_rank(say && !log ? &err : NULL);
    if (say) {
        progress_log_run_start(log, o.log_path, st.step + 1, o.steps, par.topo.world_size, argc, argv);
        char desc[512];
        seq_parallel_describe(&par, desc, sizeof desc);
        char family[128];
        llama_describe_family(c, family, sizeof family);
        printf("model: %s, %d layers, hidden %d, heads %d (kv %d), head_dim %d, ffn %d, vocab %d: %.3fM parameters\n",
               family, c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
               c->intermediate_size, c->vocab_size, (double)model.table.total / 1e6);
        printf("data: %s, seq-len %d, batch %d; %d rank%s: %s\n", o.data, S, o.batch, par.topo.world_size,
               par.topo.world_size == 1 ? "" : "s", desc);
        char b16[160];
        print_kernels_header();
        if (o.mem.precision == PRECISION_BF16) {
            bf16_describe(b16, sizeof b16);
            printf("precision: bf16 mixed (bf16 path: %s; attention: %s; fp32 weights, optimizer state and "
                   "checkpoints)\n", b16, attn_kernel_name(PRECISION_BF16));
        }
        if (o.peak_gflops > 0) printf("MFU and HFU against %.1f GFLOPS per rank (--peak-gflops)", peak);
        else
        {
            /* bf16 on the conversion path multiplies in fp32 sgemm: its peak is fp32's (bf16.h) */
            const int bf16_gemm = bf16 && !bf16_products_on_sgemm();
            printf("MFU and HFU against %.1f GFLOPS per rank: %s, the best of %d %s 2048^3 trials with %d threads "
                   "(raised if a step runs faster)", peak,
                   !bf16       ? "fp32 peak"
                   : bf16_gemm ? "bf16 peak"
                               : "bf16 peak = fp32 peak (the conversion path multiplies in fp32 sgemm)",
                   SGEMM_PEAK_TRIALS, bf16_gemm ? "bf16 GEMM" : "sgemm (oneDNN and OpenBLAS)", current_threads());
        }
        printf("; --checkpoint %s, %d FFN chunk%s", llama_checkpoint_name(o.mem.checkpoint),
               llama_acts_ffn_chunks(acts), llama_acts_ffn_chunks(acts) == 1 ? "" : "s");
        if (llama_acts_streams(acts)) printf("; layers streamed in %d chunks", par.attn->stream_chunks);
        printf("\n");
        if (vp) {
            char vdesc[96];
            token_stream_describe(&vp->stream, vdesc, sizeof vdesc);
            printf("validation: %s (%s): %d sequences every %d steps and at the end\n", o.val_data, vdesc, vp->n_seqs,
                   o.eval_every);
        }
        if (o.eot >= 0)
            printf("packed documents: split at end-of-text id %d; each token attends only to its document\n", o.eot);
        if (ds.is_recall)
            printf("recall task: %d pairs, %d queries per sequence, chance accuracy %.3f\n", ds.spec.n_pairs,
                   ds.spec.n_queries, 1.0 / recall_n_keys(&ds.spec));
        fflush(stdout);
    }

    double last_loss = NAN; /* the stop signals' handlers: main(), before MPI starts */
    long first_step = st.step + 1;
    double run_t0 = now_seconds(); /* elapsed time and ETA count from here */
    int skipped = 0, stop_sig = 0;
    long traced_step = o.trace_step > 0 ? o.trace_step : o.stop_at; /* with --trace-step */
    while (st.step < o.stop_at) {
        if (o.trace_step) trace_set_recording(par.comm->trace, st.step + 1 == traced_step);
        double t0 = now_seconds();
        watch(&par, st.step + 1, "train", st.step + 1 == first_step);
        fault_maybe_hang(&faults, par.topo.world_rank, st.step + 1);
        mem_tracked_reset_peak();
        /* every rank draws the whole global batch (same RNG), keeps its replica's sequences and
         * its own tokens of them */
        long n_targets = 0;
        for (int b = 0; b < o.batch; b++) {
            next_sequence(&ds, &st, S, g_inputs + (size_t)b * S, g_targets + (size_t)b * S);
            if (o.eot >= 0) {
                pack_documents(g_inputs + (size_t)b * S, S, o.eot, g_docs + (size_t)b * S);
                pack_mask_targets(g_inputs + (size_t)b * S, S, o.eot, g_targets + (size_t)b * S);
            }
            for (int i = 0; i < S; i++) n_targets += g_targets[(size_t)b * S + i] >= 0;
        }
        if (n_targets == 0 && o.eot >= 0)
            die_collective("step %ld: every token of the batch is the end-of-text id %d (--pack), so nothing is trained: "
                           "check --eot or the data", st.step + 1, o.eot);
        if (n_targets == 0) die_collective("a batch holds no targets: use a longer --seq-len or more --recall-queries");
        if (o.eot >= 0) { /* packed: attention computes each document alone; FLOPs count only that */
            double len = 0, len_w = 0; /* the layers without and with a window */
            for (int b = 0; b < o.batch; b++) {
                len += pack_attention_length(g_docs + (size_t)b * S, S, 0);
                len_w += pack_attention_length(g_docs + (size_t)b * S, S, c->sliding_window);
            }
            len /= o.batch, len_w /= o.batch;
            flops_per_token = llama_train_flops_lengths(c, len, len_w);
            hw_flops_per_token = flops_per_token + llama_recompute_flops_lengths(c, len, len_w, acts);
        }
        for (int b = 0; b < per_replica; b++) {
            size_t g = (size_t)(par.topo.dp_rank * per_replica + b) * S;
            seq_parallel_take_local(&par, g_inputs + g, inputs + (size_t)b * N);
            seq_parallel_take_local(&par, g_targets + g, targets + (size_t)b * N);
            if (docs) seq_parallel_take_local(&par, g_docs + g, docs + (size_t)b * N);
        }
        if (model.grads) memset(model.grads, 0, sizeof(float) * model.table.total); /* zero 2/3 have none */
        double loss_sum = 0;
        for (int b = 0; b < per_replica; b++) {
            grad_sync_microbatch(&par.sync, b);
            loss_sum += llama_forward_backward_docs(&model, acts, par.attn, inputs + (size_t)b * N, targets + (size_t)b * N,
                                                    par.positions, docs ? docs + (size_t)b * N : NULL, N,
                                                    1.0f / (float)n_targets, 1, NULL);
        }
        offload_errors_check(acts, &par); /* a failed layer-input write or read (a full disk) */
        if (fault_nonfinite_at(&faults, st.step + 1) && root) *(model.grads ? model.grads : par.sync.shard_buf) = NAN;
        double loss = seq_parallel_sum(&par, loss_sum) / (double)n_targets;
        double norm_sq = grad_sync_reduce(&par.sync, model.grads);
        float lr = lr_at_step(&o.opt, st.step);
        /* NaN and Inf survive every sum, so every rank reaches the same verdict */
        int nonfinite = !isfinite(loss) || !isfinite(norm_sq);
        if (nonfinite) {
            skipped++;
            int fatal = skipped > o.skip_nonfinite;
            if (root && log) {
                fprintf(log, "{\"step\": %ld, \"nonfinite\": true, \"action\": \"%s\", \"loss\": null, \"grad_norm\": null, "
                             "\"loss_text\": \"%g\", \"grad_norm_text\": \"%g\", \"lr\": %.9g, \"skipped_steps\": %d, "
                             "\"skip_limit\": %d}\n",
                        st.step + 1, fatal ? "stopped" : "skipped", loss, sqrt(norm_sq), lr,
                        fatal ? skipped - 1 : skipped, o.skip_nonfinite);
                progress_log_flush(log, st.step + 1);
            }
            if (fatal) {
                if (o.skip_nonfinite == 0)
                    die_collective("step %ld: the loss (%g) or the gradient norm (%g) is not finite: lower --lr or raise --warmup, or "
                                   "allow skipping such steps with --skip-nonfinite N", st.step + 1, loss, sqrt(norm_sq));
                die_collective("step %ld: the loss (%g) or the gradient norm (%g) is not finite and the %d skips allowed by "
                               "--skip-nonfinite are used up: lower --lr or raise --warmup", st.step + 1, loss,
                               sqrt(norm_sq), o.skip_nonfinite);
            }
            if (say) {
                printf("step %5ld/%ld | loss %g | grad norm %g | not finite: update skipped (%d of --skip-nonfinite %d)\n",
                       st.step + 1, o.steps, loss, sqrt(norm_sq), skipped, o.skip_nonfinite);
                fflush(stdout);
            }
        } else {
            grad_sync_update(&par.sync, &opt, &model, lr, adamw_clip_scale(&o.opt, norm_sq));
        }
        st.step++;
        /* step time, peak memory, a stop request and a failed optimizer-offload read or write (a full
         * disk), agreed by every rank in one reduction */
        SeqErr off_err;
        const int off_failed = par.sync.offload && optimizer_offload_error(par.sync.offload, &off_err) != 0;
        double agree[4] = {now_seconds() - t0, (double)mem_tracked_peak(), (double)stop_signal_pending(), off_failed};
        if (par.topo.world_size > 1)
            comm_control_allreduce(par.comm, "MPI_Iallreduce (step time, stop flag)", agree, 4, MPI_DOUBLE, MPI_MAX,
                                   par.topo.world);
        if (agree[3] > 0) die_if_any_rank(off_failed ? &off_err : NULL); /* every rank is here: the failing one's line */
        double dt = agree[0];
        unsigned long long peak_mem = (unsigned long long)agree[1];
        stop_sig = (int)agree[2];
        double tok_s = (double)S * o.batch / dt, tok_s_rank = tok_s / par.topo.world_size;
        double rate = tok_s_rank * flops_per_token * 1e-9; /* GFLOPS per rank */
        /* a measured peak that a step beat was measured low: raise it, so MFU never exceeds 100%; a
         * peak the user gave stays, and a utilisation above it is shown as 100% with a note */
        if (o.peak_gflops <= 0 && rate > peak) peak = rate;
        double mfu = rate / peak;
        double hfu = tok_s_rank * hw_flops_per_token / (peak * 1e9);
        if (!nonfinite) last_loss = loss;
        double elapsed = now_seconds() - run_t0, eta = progress_eta_seconds(elapsed, st.step - first_step + 1, o.stop_at - st.step);
        if (say && !o.quiet && !nonfinite) {
            char el[32], left[32];
            progress_format_duration(elapsed, el, sizeof el);
            progress_format_duration(eta, left, sizeof left);
            printf("step %5ld/%ld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s (%.0f/rank) | MFU %.1f%% | "
                   "HFU %.1f%% | peak mem %.1f MiB/rank | %s elapsed, ETA %s\n",
                   st.step, o.steps, loss, lr, sqrt(norm_sq), tok_s, tok_s_rank, 100 * utilisation_clamp(mfu, &clamped),
                   100 * utilisation_clamp(hfu, &clamped), (double)peak_mem / (1 << 20), el, left);
            fflush(stdout);
        }
        if (m) { /* the step's time as every rank agreed it, and its loss */
            m->step_s[m->steps < TRAIN_MEASURE_STEPS ? m->steps : TRAIN_MEASURE_STEPS - 1] = dt;
            m->steps++;
            m->last_loss = loss;
        }
        if (root && log && !nonfinite) {
            fprintf(log, "{\"step\": %ld, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.17g, \"tokens_per_s\": %.3f, "
                         "\"tokens_per_s_per_rank\": %.3f, \"mfu\": %.9g, \"hfu\": %.9g, \"flops_per_token\": %.9g, "
                         "\"peak_mem_bytes\": %llu, \"step_seconds\": %.6f, \"elapsed_s\": %.3f, \"eta_s\": %.3f}\n",
                    st.step, loss, lr, sqrt(norm_sq), tok_s, tok_s_rank, fmin(mfu, 1.0), fmin(hfu, 1.0), flops_per_token,
                    peak_mem, dt, elapsed, eta);
            if (mfu > 1.0 || hfu > 1.0) clamped = 1;
            progress_log_flush(log, st.step);
        }
        if (o.trace_step) trace_set_recording(par.comm->trace, 0);
        /* a step's evaluation before a stop's checkpoint: the resumed run starts at the next step, so
         * it was lost for good (the log lacked that step's val_loss) */
        if (ds.is_recall && o.eval_every > 0 && st.step % o.eval_every == 0 && st.step < o.stop_at) {
            watch(&par, st.step, "eval", 0);
            eval_report(&model, acts, &par, &ds, &o, log, st.step, "step", now_seconds() - run_t0,
                        progress_eta_seconds(now_seconds() - run_t0, st.step - first_step + 1, o.stop_at - st.step));
        }
        if (vp && o.eval_every > 0 && st.step % o.eval_every == 0 && st.step < o.stop_at) {
            watch(&par, st.step, "eval", 0);
            evaluate_val(vp, &model, acts, &par, st.step, log);
        }
        if (stop_sig) break;
        if (o.save_dir && o.save_every > 0 && st.step % o.save_every == 0 && st.step < o.stop_at) {
            watch(&par, st.step, "save", 1);
            save_checkpoint(o.save_dir, &model, &opt, &st, &par, o.save_shard_bytes);
        }
    }
    if (stop_sig && m) { /* measuring: nothing to keep */
    } else if (stop_sig) { /* a stop signal: checkpoint and exit 0, no final evaluation */
        char dir[4096];
        if (o.save_dir) snprintf(dir, sizeof dir, "%s", o.save_dir);
        else default_stop_dir(o.log_path, st.step, dir, sizeof dir);
        watch(&par, st.step, "save", 1);
        save_checkpoint(dir, &model, &opt, &st, &par, o.save_shard_bytes);
        if (root) {
            printf("seqpar: stopped by %s after step %ld of %ld: checkpoint saved to %s; continue with --resume %s\n",
                   stop_signal_name(stop_sig), st.step, o.steps, dir, dir);
            fflush(stdout);
        }
    } else {
        if (ds.is_recall && o.eval_seqs > 0) {
            watch(&par, st.step, "eval", 0);
            double acc = eval_report(&model, acts, &par, &ds, &o, log, st.step, "final eval, step", now_seconds() - run_t0, -1);
            if (say) printf("recall accuracy %.3f (chance %.3f)\n", acc, 1.0 / recall_n_keys(&ds.spec));
        }
        if (vp) {
            watch(&par, st.step, "eval", 0);
            evaluate_val(vp, &model, acts, &par, st.step, log);
        }
        if (o.save_dir) {
            watch(&par, st.step, "save", 1);
            save_checkpoint(o.save_dir, &model, &opt, &st, &par, o.save_shard_bytes);
            if (say) printf("saved checkpoint to %s (step %ld)\n", o.save_dir, st.step);
        }
    }
    if (llama_acts_offloads_inputs(acts)) { /* per rank, like --stats: its own file */
        unsigned long long wr, rd;
        double wait_s;
        long passes;
        llama_acts_offload_stats(acts, &wr, &rd, &wait_s, &passes);
        double b = passes > 0 ? (double)passes : 1.0;
        printf("rank %d: layer-input offload: %.3f MB written, %.3f MB read per backward pass (%ld passes), I/O not "
               "hidden %.4f s per pass; RAM for layer inputs %.3f MB instead of %.3f MB\n", par.topo.world_rank,
               wr / b / 1e6, rd / b / 1e6, passes, wait_s / b,
               (2.0 * N + 4.0 * ((N + llama_input_chunks(N) - 1) / llama_input_chunks(N))) * c->hidden_size * 4 / 1e6,
               (c->num_hidden_layers + 1.0) * N * c->hidden_size * 4 / 1e6);
        fflush(stdout);
    }
    if (par.sync.offload && (o.par.stats || !o.quiet)) { /* per rank: its own file */
        unsigned long long wr, rd;
        double wait_s;
        optimizer_offload_stats(par.sync.offload, &wr, &rd, &wait_s);
        printf("rank %d: optimizer offload: %.3f MB written, %.3f MB read, I/O not hidden %.3f s; RAM for the moments%s "
               "%.3f MB instead of %.3f MB\n", par.topo.world_rank, wr / 1e6, rd / 1e6, wait_s,
               o.par.offload_master ? " and weights" : "",
               optimizer_offload_ram_bytes(opt.end - opt.begin, o.par.offload_master) / 1e6,
               (o.par.offload_master ? 12.0 : 8.0) * (double)(opt.end - opt.begin) / 1e6);
        fflush(stdout);
    }
    /* every rank gets here before any enters MPI_Finalize, which has no deadline */
    watch(&par, st.step, "end", 0);
    /* the run's high-water mark of resident memory, every phase included (the steps' tracked
     * peak leaves out loading, saves and the C runtime): rank 0's, the largest and the smallest rank's */
    unsigned long long rss0 = (unsigned long long)mem_peak_rss(), rss_max = rss0, rss_min = rss0;
    if (par.topo.world_size > 1) {
        comm_control_allreduce(par.comm, "MPI_Allreduce (peak RSS)", &rss_max, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX,
                               par.topo.world);
        comm_control_allreduce(par.comm, "MPI_Allreduce (peak RSS)", &rss_min, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN,
                               par.topo.world);
        comm_control_barrier(par.comm, "MPI_Ibarrier (end of run)", par.topo.world);
    }
    if (root && log) {
        fprintf(log, "{\"run_end\": {\"step\": %ld, \"elapsed_s\": %.3f, \"peak_rss_bytes_rank0\": %llu, "
                     "\"peak_rss_bytes_max\": %llu, \"peak_rss_bytes_min\": %llu}}\n", st.step, now_seconds() - run_t0, rss0, rss_max,
                rss_min);
        progress_log_flush(log, st.step);
    }
    if (say && clamped)
        printf("note: a utilisation above 100%% of the peak was shown as 100%%: the peak (--peak-gflops or the "
               "measured sgemm) is below what this run reached\n");
    if (say && !isnan(last_loss)) printf("final loss %.6f\n", last_loss);
    if (log) fclose(log);
    if (save_lock >= 0) close(save_lock);
    xfree(g_inputs); xfree(g_targets); xfree(inputs); xfree(targets); xfree(g_docs); xfree(docs);
    run_free(acts, &par, &opt, &ds, vp, &model); /* writes the trace */
    if (say) { /* where this run's files are */
        char el[32];
        progress_format_duration(now_seconds() - run_t0, el, sizeof el);
        printf("run took %s; log: %s", el, o.log_path);
        if (progress_log_error()) printf(" (incomplete: %s)", strerror(progress_log_error()));
        if (o.save_dir && !stop_sig) printf("; model: %s", o.save_dir);
        if (o.par.trace_path) printf("; trace: %s", o.par.trace_path);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
int train_run(const TrainOptions *options, const SizeFlags *sizes, int argc, char **argv) {
    return run(options, sizes, argc, argv, NULL);
}
int train_measure(const TrainOptions *options, const SizeFlags *sizes, long steps, TrainMeasure *m) {
    TrainOptions o = *options;
    o.steps = o.stop_at = o.opt.total_steps = steps;
    if (o.resume_dir) o.model_dir = o.resume_dir, o.random_init = 0; /* its model, from step 0 */
    o.save_dir = o.resume_dir = NULL, o.auto_resume = 0, o.save_every = 0;
    o.val_data = NULL, o.eval_every = 0, o.eval_seqs = 0;
    o.log_path = NULL, o.quiet = 1, o.dry_run = 0, o.dry_ranks = 0;
    o.par.trace_path = NULL, o.trace_step = 0, o.par.stats = 0;
    o.peak_gflops = 1; /* no MFU is printed: the peak's measurement is not made */
    memset(m, 0, sizeof *m);
    char *argv[] = {"train", NULL};
    return run(&o, sizes, 1, argv, m);
}
