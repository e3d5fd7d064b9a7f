/* Core helpers shared by every part of seqpar: fatal errors that end every rank, checked
 * allocation and file calls, timing, peak-memory accounting and a small deterministic RNG.
 * Nothing here knows about models or parallelism. */
#ifndef SEQPAR_COMMON_H
#define SEQPAR_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Prints "seqpar: error: <message>" (one line) and ends the program with a non-zero status.
 * Under MPI with more than one rank it calls MPI_Abort so that no rank is left waiting. */
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Like die(), but for an error every rank detects identically (bad flags, bad config, a grid
 * that does not factor): every rank prints the same line and exits with status 1 after
 * MPI_Finalize, without MPI_Abort, so no rank hangs and none prints an abort trace. Only for
 * errors that every rank is sure to detect; anything else must use die(). */
void die_collective(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* An error reported by a library function to its caller (loaders return -1 or NULL and fill
 * one of these) so that the caller decides how to end; `msg` is one line naming the problem and
 * the fix, without the "seqpar: error: " prefix. */
typedef struct {
    char msg[1536];
} SeqErr;

/* Formats the message into *e (if e is not NULL) and returns -1, for `return seq_err(e, ...)`. */
int seq_err(SeqErr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Collective over MPI_COMM_WORLD (every rank must call it; a single process or no MPI is fine):
 * when `e` is not NULL on some rank, every rank prints the message of the lowest such rank as
 * one "seqpar: error:" line and exits with status 1 as die_collective does; otherwise returns.
 * This is how the CLI ends a run for a loader error that only some ranks may have seen. */
void die_if_any_rank(const SeqErr *e);

/* Exit status of a job ended by a deadline (the watchdog, comm.h; die_if_any_rank's wait). */
#define SEQPAR_WATCHDOG_EXIT 3
/* The deadline of die_if_any_rank's wait for the other ranks, in seconds (0: none): a rank that
 * never reaches the exchange (stopped, hung in I/O, cut off) ends the job with one "watchdog"
 * line and status SEQPAR_WATCHDOG_EXIT rather than leaving the others waiting. The command line
 * sets it from --comm-timeout before the first exchange, and comm_set_timeout keeps it equal to
 * the watchdog's deadline from then on. Default: none. */
void exchange_deadline_set(double seconds);

void *xmalloc(size_t n);          /* dies with the size on failure; tracked for peak memory */
/* A tracked copy of a string (freed with xfree): how library code returns one-line messages. */
char *xstrdup(const char *s);
/* A formatted one-line message in an xmalloc'd string (at most 319 characters kept). */
char *xstrdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *xcalloc(size_t count, size_t size);
void *xmalloc_aligned(size_t n);  /* 64-byte aligned; free with xfree */
/* n zero bytes for a buffer its caller fills whole right away (the attention kernel's packed
 * copies): from 1 MiB on mapped from the kernel, 2 MiB-aligned and advised for transparent huge
 * pages (MADV_HUGEPAGE), so the zeroing happens at the first touch, in whichever thread writes
 * the page, one fault per 2 MiB where Linux grants huge pages; smaller, xcalloc's. Free with xfree. */
void *xzalloc_filled(size_t n);
void  xfree(void *p);             /* frees memory from any of the x* allocators above */
/* Room for one more element in a growing array of `size`-byte elements holding n of *cap: a itself,
 * or an xmalloc'd copy of its n elements with *cap doubled (first where *cap is 0), a freed. */
void *xgrow(void *a, int *cap, int n, size_t size, int first);
FILE *xfopen(const char *path, const char *mode); /* dies naming the path and the reason */

/* Bytes currently allocated through x* allocators and the highest value seen. */
size_t mem_tracked_current(void);
size_t mem_tracked_peak(void);
void   mem_tracked_reset_peak(void);
/* Peak resident set size of this process image, in bytes (VmHWM of /proc/self/status; getrusage elsewhere). */
size_t mem_peak_rss(void);

/* 1 if s is a plain decimal number: optional sign, digits, and (fraction: 1) a point and an
 * exponent; no spaces, hexadecimal, inf or nan (which strtol/strtod accept). For the command
 * line's numbers and the environment's. */
int is_decimal_number(const char *s, int fraction);

double now_seconds(void); /* monotonic clock */
double cpu_seconds(void); /* CPU time of this process, all its threads */
void sleep_seconds(double s);
/* Polls done(arg) until it returns non-zero (then returns 0), or until deadline_s (> 0; 0: none)
 * of waiting has passed (then returns -1 with *waited, the seconds waited). Busy-polls for
 * WAIT_SPIN_S, then sleeps about 1/16 of the time waited so far between polls (1 us to 1 ms), so
 * that a long wait leaves the core to the processes that share it. A gap of over a second between
 * two polls means this process was not running (SIGSTOP, a suspended VM): no peer's fault, so it
 * does not count. The watchdog's waits (comm.c) and die_if_any_rank's exchange run on it. */
#define WAIT_SPIN_S 50e-6
int wait_until(int (*done)(void *arg), void *arg, double deadline_s, double *waited);

/* Deterministic RNG (xoshiro-style state, seeded by splitmix64): the same seed gives the same
 * numbers on every machine. The state is plain data so checkpoints can save it. */
typedef struct { uint64_t s[4]; } Rng;
void     rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
/* Advances r by n draws of rng_u64 (the same state as n calls) in O(log n): the stream can be
 * split among threads and ranks. Thread-safe (a table made once per process). */
void     rng_jump(Rng *r, uint64_t n);
double   rng_uniform(Rng *r);           /* [0, 1) */
double   rng_normal(Rng *r);            /* standard normal (Box-Muller) */
/* rng_normal's value from the two draws it would take (a, then b, from rng_u64): the same number,
 * so that a caller may draw the stream serially and transform it on several threads */
double   rng_normal_from(uint64_t a, uint64_t b);
uint64_t rng_below(Rng *r, uint64_t n); /* uniform in [0, n) */

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* A macro's value as a string literal, for help texts that name a constant: SEQ_STR(X) */
#define SEQ_STR_(x) #x
#define SEQ_STR(x) SEQ_STR_(x)

#endif
