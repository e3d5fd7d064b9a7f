/* `seqpar train --strategy auto`: the planner's pick (plan_setup.h) for the job that is running
 * (its ranks, ranks per node from MPI's shared-memory split, its threads, the model, S, batch, the
 * RAM per rank; the cluster `this-machine` where `seqpar calibrate --save` wrote it, else the rates
 * `seqpar plan` measures here), turned into the train flags that run it. The flags given stay
 * fixed, as `seqpar plan` takes them. Rank 0 decides and every rank takes its line; a checkpoint
 * records the configuration it was trained with (TRAIN_RECORD_KEY, trainer.h), and a resume under
 * auto takes that one. */
#ifndef SEQPAR_AUTO_STRATEGY_H
#define SEQPAR_AUTO_STRATEGY_H

#include <stddef.h>

/* The words of --strategy auto at argv[i]: 2 (--strategy auto), 1 (--strategy=auto) or 0. */
int strategy_auto_words(int argc, char **argv, int i);
/* 1 where argv holds --strategy auto (or --strategy=auto). */
int strategy_auto_given(int argc, char **argv);

/* train's argv with --strategy auto replaced by the pick's flags (the user's other flags kept, the
 * grid flags given kept as constraints): a new argv of *out_argc words (free with
 * plan_argv_free). Rank 0 prints the pick as one line: the command it is equivalent to.
 * Collective over MPI_COMM_WORLD; where nothing runs or fits, every rank ends with one line.
 * A --resume (or --auto-resume) checkpoint that recorded its configuration resumes with it. */
char **strategy_auto_resolve(int argc, char **argv, const char *program, int *out_argc);

/* The pick alone (plan_flags: "--strategy ring --cp 2 --checkpoint none ...") for the job and the
 * train flags in argv (argv[0] the program, no --strategy auto): for a command with flags of its
 * own (`seqpar eval`), which gives the train flags that describe its run. Rank 0's pick on every
 * rank (xmalloc'd); on rank 0 desc says what was picked from ("the planner's pick of N
 * configurations (predicted ...)"). Collective; nothing runs or fits: one line naming `who`. */
char *strategy_auto_pick(int argc, char **argv, const char *who, char *desc, size_t dn);

#endif
