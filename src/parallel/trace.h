/* Per-rank event trace written as Chrome trace-event JSON (opens in Perfetto / chrome://tracing).
 *
 * Every rank buffers "X" (complete) events in memory: name, category (compute, send, recv,
 * wait, alltoall, allreduce, ...), start and duration. trace_write() gathers all ranks' events
 * to rank 0, which writes one JSON file (atomically: temporary file + rename):
 *   {"traceEvents":[{"name":..,"cat":..,"ph":"X","ts":us,"dur":us,"pid":0,"tid":world_rank},
 *                   {"name":"thread_name","ph":"M","pid":0,"tid":r,"args":{"name":"rank r"}},..]}
 * Timestamps are microseconds since the trace was created (after a barrier, so ranks of one
 * node line up; across nodes the clocks are only as aligned as the machines' clocks).
 * A disabled trace is a NULL pointer: callers test it and record nothing. */
#ifndef SEQPAR_TRACE_H
#define SEQPAR_TRACE_H

#include <mpi.h>

#include "core/common.h"

typedef struct CommTrace CommTrace;

/* Collective over world (barrier). path is copied. piece: the most events one message of
 * trace_write carries (0: the default, 2^20; the tests set fewer through SEQPAR_COMM_PIECE). */
CommTrace *trace_create(MPI_Comm world, const char *path, size_t piece);
/* Seconds on the trace clock (now_seconds()). */
double trace_now(void);
/* Records an event from t0 to t1 (seconds, now_seconds() clock). name and cat are copied
 * (truncated to 39 and 15 characters). */
void trace_event(CommTrace *tr, const char *name, const char *cat, double t0, double t1);
/* Turns recording on (the default) or off: while off, trace_event() drops events (e.g. to trace
 * one training step of many). Local to the rank. */
void trace_set_recording(CommTrace *tr, int on);
/* Gathers to rank 0 and writes the file; collective over world. Rank 0 takes the ranks' events one
 * rank at a time in bounded messages and writes them as they come, so neither the file nor any
 * rank's event count has a limit of its own. Returns the number of events written on rank 0 (0
 * elsewhere), or -1 on rank 0 with a one-line message when the file cannot be written (any old file
 * intact) or when a rank dropped events because its buffer could not grow (the file is written with
 * the rest). Calling it again rewrites the file with all events so far. */
long trace_write(CommTrace *tr, SeqErr *e);
void trace_free(CommTrace *tr);

#endif
