/* Chrome trace-event recording and writing: see trace.h. */
#include "parallel/trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/atomic_file.h"

/* Events a message of trace_write carries at most (fewer under trace_create's piece): MPI counts are
 * int, and rank 0 holds one piece at a time, so the file has no size limit and rank 0 no memory cost
 * beyond a piece. */
#define TRACE_PIECE_EVENTS ((size_t)1 << 20)

typedef struct {
    double ts, dur; /* microseconds */
    char name[40];
    char cat[16];
} TraceEvent;

struct CommTrace {
    MPI_Comm world;
    char *path;
    double t0; /* seconds, creation time */
    TraceEvent *ev;
    size_t n, cap;
    int paused;       /* trace_set_recording(tr, 0): events are dropped */
    uint64_t dropped; /* events lost because the buffer could not grow */
    size_t piece;     /* events a message of trace_write carries at most */
};

static void check(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        die("trace: %s failed: %s", what, msg);
    }
}

double trace_now(void) { return now_seconds(); }

CommTrace *trace_create(MPI_Comm world, const char *path, size_t piece) {
    CommTrace *tr = xcalloc(1, sizeof *tr);
    tr->world = world;
    tr->piece = piece && piece < TRACE_PIECE_EVENTS ? piece : TRACE_PIECE_EVENTS;
    size_t len = strlen(path);
    tr->path = xmalloc(len + 1);
    memcpy(tr->path, path, len + 1);
    check(MPI_Barrier(world), "MPI_Barrier");
    tr->t0 = now_seconds();
    return tr;
}

void trace_set_recording(CommTrace *tr, int on) {
    if (tr) tr->paused = !on;
}

void trace_event(CommTrace *tr, const char *name, const char *cat, double t0, double t1) {
    if (!tr || tr->paused) return;
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? 2 * tr->cap : 1024;
        /* plain realloc: trace memory is bookkeeping, not model memory */
        TraceEvent *ev = realloc(tr->ev, cap * sizeof *ev);
        if (!ev) { /* counted and reported by trace_write: a trace never ends the run */
            tr->dropped++;
            return;
        }
        tr->ev = ev;
        tr->cap = cap;
    }
    TraceEvent *e = &tr->ev[tr->n++];
    e->ts = (t0 - tr->t0) * 1e6;
    e->dur = (t1 - t0) * 1e6;
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->cat, sizeof e->cat, "%s", cat);
}

/* JSON string body: names are ours (no quotes expected) but escape anyway. */
static void put_json_string(AtomicFile *af, const char *s) {
    char buf[96];
    size_t j = 0;
    buf[j++] = '"';
    for (; *s && j < sizeof buf - 4; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { buf[j++] = '\\'; buf[j++] = (char)ch; }
        else if (ch < 0x20) buf[j++] = ' ';
        else buf[j++] = (char)ch;
    }
    buf[j++] = '"';
    atomic_write(af, buf, j);
}

static void write_events(AtomicFile *af, const TraceEvent *ev, size_t n, int rank, long *written) {
    char line[160];
    for (size_t i = 0; i < n; i++) {
        atomic_write(af, ",\n{\"name\":", 10);
        put_json_string(af, ev[i].name);
        atomic_write(af, ",\"cat\":", 7);
        put_json_string(af, ev[i].cat);
        int len = snprintf(line, sizeof line, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":0,\"tid\":%d}",
                           ev[i].ts, ev[i].dur, rank);
        atomic_write(af, line, (size_t)len);
        (*written)++;
    }
}

long trace_write(CommTrace *tr, SeqErr *e) {
    int rank, size;
    check(MPI_Comm_rank(tr->world, &rank), "MPI_Comm_rank");
    check(MPI_Comm_size(tr->world, &size), "MPI_Comm_size");
    uint64_t mine[2] = {tr->n, tr->dropped};
    uint64_t *counts = rank == 0 ? xcalloc((size_t)size * 2, sizeof *counts) : NULL;
    check(MPI_Gather(mine, 2, MPI_UINT64_T, counts, 2, MPI_UINT64_T, 0, tr->world), "MPI_Gather (trace sizes)");
    /* Rank r > 0 sends its events to rank 0 in pieces, when rank 0 asks for them (one rank at a time:
     * rank 0 writes as it receives). */
    if (rank != 0) {
        int go = 0;
        check(MPI_Recv(&go, 1, MPI_INT, 0, 0, tr->world, MPI_STATUS_IGNORE), "MPI_Recv (trace turn)");
        for (size_t at = 0; at < tr->n; at += tr->piece) {
            size_t n = tr->n - at < tr->piece ? tr->n - at : tr->piece;
            check(MPI_Send(tr->ev + at, (int)(n * sizeof(TraceEvent)), MPI_BYTE, 0, 1, tr->world),
                  "MPI_Send (trace events)");
        }
        return 0;
    }
    AtomicFile af;
    int opened = atomic_open(&af, tr->path, e) == 0; /* if not, the writes below do nothing */
    if (!opened) af.failed = 1;
    const char *head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    atomic_write(&af, head, strlen(head));
    TraceEvent *piece = size > 1 ? xmalloc(tr->piece * sizeof *piece) : NULL;
    long written = 0;
    int dropped_rank = -1;
    char line[160];
    for (int r = 0; r < size; r++) {
        int len = snprintf(line, sizeof line,
                           "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                           "\"args\":{\"name\":\"rank %d\"}}",
                           r == 0 ? "" : ",\n", r, r);
        atomic_write(&af, line, (size_t)len);
        if (counts[2 * r + 1] && dropped_rank < 0) dropped_rank = r;
        if (r == 0) {
            write_events(&af, tr->ev, tr->n, 0, &written);
            continue;
        }
        int go = 1;
        check(MPI_Send(&go, 1, MPI_INT, r, 0, tr->world), "MPI_Send (trace turn)");
        for (uint64_t at = 0; at < counts[2 * r]; at += tr->piece) {
            size_t n = (size_t)(counts[2 * r] - at < tr->piece ? counts[2 * r] - at : tr->piece);
            check(MPI_Recv(piece, (int)(n * sizeof(TraceEvent)), MPI_BYTE, r, 1, tr->world, MPI_STATUS_IGNORE),
                  "MPI_Recv (trace events)");
            write_events(&af, piece, n, r, &written);
        }
    }
    const char *tail = "\n]}\n";
    atomic_write(&af, tail, strlen(tail));
    xfree(piece);
    if (opened && atomic_commit(&af, e) != 0) opened = 0;
    if (opened && dropped_rank >= 0) {
        seq_err(e, "trace: rank %d ran out of memory for its events and dropped %llu of them (the file %s holds "
                   "the rest): trace fewer steps",
                dropped_rank, (unsigned long long)counts[2 * dropped_rank + 1], tr->path);
        opened = 0;
    }
    xfree(counts);
    return opened ? written : -1;
}

void trace_free(CommTrace *tr) {
    if (!tr) return;
    free(tr->ev);
    xfree(tr->path);
    xfree(tr);
}
