/* What a person following a long training run needs besides the loss: elapsed time and an
 * estimate of the time left, written the way people read durations; a log of its own for every
 * run (runs/<UTC date-time>/train.jsonl unless --log names one); and a record that marks where a
 * run starts, so that two runs appended to one --log file can be told apart.
 * Only rank 0 writes; run_dir_create() is collective so that every rank knows the path. */
#ifndef SEQPAR_PROGRESS_H
#define SEQPAR_PROGRESS_H

#include <stddef.h>
#include <stdio.h>

#include <mpi.h>

#include "core/common.h"

/* "45s", "3m07s", "2h05m"; "?" for a negative or non-finite value. */
void progress_format_duration(double seconds, char *buf, size_t n);

/* Seconds left if the remaining steps go at the pace of those done so far: elapsed / done *
 * remaining; -1 when nothing is done yet (no estimate). */
double progress_eta_seconds(double elapsed, long done, long remaining);

/* Creates a fresh directory under parent (itself created if missing) named after the UTC time
 * (YYYYmmdd-HHMMSS, with -2, -3, ... added when it exists) on rank 0 of comm and gives every rank
 * its path in buf. Returns -1 with the reason in *e (on every rank) if it cannot be created. */
int run_dir_create(const char *parent, MPI_Comm comm, char *buf, size_t n, SeqErr *e);

/* The record that opens a run in its JSONL log:
 * {"run_start": "2026-11-22T08:50:01Z", "first_step": 1, "steps": 1500, "ranks": 2, "argv": [...]}. */
void progress_log_run_start(FILE *log, const char *path, long first_step, long steps, int ranks, int argc, char **argv);

/* Ends a record of the log: flushed, or on the first failure to write (a full disk) one warning on
 * stderr, the file cut back to its last whole record and every later record dropped: the run goes
 * on (the log's records were lost without a word, the last one cut mid-line). `step`: the record's. */
void progress_log_flush(FILE *log, long step);
/* The error (errno) that stopped the log, 0 while it is whole. */
int progress_log_error(void);

/* Writes s as a JSON string literal (quotes included). */
void json_write_string(FILE *out, const char *s);

#endif
