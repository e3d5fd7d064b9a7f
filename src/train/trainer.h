/* The training loop as a library: what `seqpar train` runs, callable from any C program that has
 * initialised MPI (one process or several under mpirun). The options are train's
 * (train_options.h: parse_train_options fills them from argv, or set the fields yourself after
 * parse_train_options on an empty argv for the defaults).
 *
 * Data comes from the built-in associative-recall task (default), an llm.c token shard or a text
 * file; each step runs --batch sequences of --seq-len tokens through the model, clips the global
 * gradient norm and takes an AdamW step. Every step prints (with the elapsed time and an ETA,
 * progress.h) and logs to the run's own JSONL log: loss, learning rate, gradient norm, tokens/s,
 * MFU, HFU (hardware FLOPs: recomputation counted), peak memory; recall evaluations are logged by
 * key-query distance. --save writes an atomic checkpoint that Hugging Face loads; --resume continues
 * a run bit-identically. SIGTERM, SIGUSR1 or SIGINT stop the run after the current step with a
 * checkpoint (run_control.h); a non-finite loss or gradient norm ends the run unless
 * --skip-nonfinite allows skipping that step's update. */
#ifndef SEQPAR_TRAINER_H
#define SEQPAR_TRAINER_H

#include "train/train_options.h"

/* Runs the training the options describe, collective over MPI_COMM_WORLD. argc, argv: the command
 * line the run's log records. Returns 0; a configuration or run error ends every rank with one line
 * (die_collective), as the CLI does. Before it allocates the model, the strategy's buffers, the
 * activations or the optimizer state, the memory plan (memory_model.h, plus 64 MiB of runtime) is checked against --mem-per-rank
 * (default: the node's RAM over its ranks) and a disk tier against its free space.
 * options->dry_run (--dry-run): the run's checks only, made by the same functions, then rank 0 prints
 * the memory plan and what was checked; nothing big is allocated and nothing is written or locked.
 * options->dry_ranks (--ranks P): a job of P ranks checked from this process (the grid's refusals are
 * the memory model's). */
int train_run(const TrainOptions *options, const SizeFlags *sizes, int argc, char **argv);

/* The checkpoint setting holding the configuration a run was built with, as train flags in plan's
 * form ("--strategy ring --cp 2 --checkpoint none --ffn-chunks 1"): its strategy, grid, knobs,
 * placement, layout, ZeRO stage, --checkpoint and --ffn-chunks. Never compared on a resume (a
 * checkpoint resumes under any strategy); `train --strategy auto` resumes with it. */
#define TRAIN_RECORD_KEY "parallel"

#define TRAIN_MEASURE_STEPS 64
/* What train_measure saw: each step's time (the slowest rank's, as the run's step line gives it;
 * the first TRAIN_MEASURE_STEPS - 1 steps and the last) and the last step's loss. */
typedef struct {
    long steps;
    double step_s[TRAIN_MEASURE_STEPS];
    double last_loss;
} TrainMeasure;

/* `steps` training steps of the options' run from its start (no --resume), timed: nothing printed,
 * logged, evaluated or saved (the profiling of a candidate configuration, `seqpar plan
 * --profile`). Collective over MPI_COMM_WORLD; a configuration error ends every rank with one line,
 * as train_run. Returns 0. */
int train_measure(const TrainOptions *options, const SizeFlags *sizes, long steps, TrainMeasure *m);

#endif
