/* Run control for seqpar's commands: a graceful stop requested by a signal, and test-only fault
 * injection.
 *
 * Stop signals. SIGTERM, SIGUSR1 (what Slurm sends ahead of a job's end with --signal=USR1@T)
 * and SIGINT only set a flag; the training loop reads it at each step boundary, the ranks agree
 * on it (a max-reduction every step), and the job saves a checkpoint and exits 0. A second
 * SIGTERM or SIGINT a second or more after the first ends the process at once (the default
 * action), as an impatient operator expects; one sooner is the same stop delivered twice (a
 * wrapper such as coreutils' timeout signals the process and then its process group) and changes
 * nothing. The flag and its time are the handler's only variables: it can reach nothing else.
 *
 * Fault injection, for tests only: read from the environment once (fault_plan_from_env), never
 * set in normal runs, and costing one integer comparison per step when unset.
 *   SEQPAR_FAULT_NONFINITE=3,7  world rank 0 writes NaN into its gradient at steps 3 and 7
 *   SEQPAR_FAULT_HANG=R:S       world rank R stops making progress (sleeps) at the start of step S
 *                               (S = 0: before the communicators are made, the setup's guard)
 *   SEQPAR_FAULT_HANG=R:S:MS    the same for MS milliseconds, then goes on (a step that takes long:
 *                               the stop-signal tests send signals while it lasts)
 * This file does not save anything or talk to MPI. */
#ifndef SEQPAR_RUN_CONTROL_H
#define SEQPAR_RUN_CONTROL_H

/* Installs the handlers for SIGTERM, SIGUSR1 and SIGINT (SA_RESTART). */
void stop_signals_install(void);
/* The signal that requested a stop (first one received), or 0. */
int stop_signal_pending(void);
/* "SIGTERM", "SIGUSR1", "SIGINT" or "signal N" (static storage for the known ones). */
const char *stop_signal_name(int sig);

#define FAULT_MAX_STEPS 16
typedef struct {
    long nonfinite_steps[FAULT_MAX_STEPS];
    int n_nonfinite;
    int hang_rank;  /* -1: none */
    long hang_step;
    long hang_ms;   /* 0: for good */
} FaultPlan;

/* Reads SEQPAR_FAULT_NONFINITE and SEQPAR_FAULT_HANG (absent: no faults). A malformed value
 * ends the process with a one-line error (every rank reads the same environment). */
void fault_plan_from_env(FaultPlan *f);
/* 1 if a NaN is to be injected at `step` (1-based). */
int fault_nonfinite_at(const FaultPlan *f, long step);
/* If this rank is to hang at `step` (0: before the setup), prints a line on stderr and sleeps
 * forever, or for the plan's milliseconds. */
void fault_maybe_hang(const FaultPlan *f, int world_rank, long step);

#endif
