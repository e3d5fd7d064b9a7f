/* Chrome trace-event recording and writing: see trace.h. */
#include "parallel/trace.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/atomic_file.h"

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
    int paused; /* trace_set_recording(tr, 0): events are dropped */
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

CommTrace *trace_create(MPI_Comm world, const char *path) {
    CommTrace *tr = xcalloc(1, sizeof *tr);
    tr->world = world;
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
        if (!ev) die("trace: out of memory for %zu events", cap);
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

long trace_write(CommTrace *tr, SeqErr *e) {
    int rank, size;
    check(MPI_Comm_rank(tr->world, &rank), "MPI_Comm_rank");
    check(MPI_Comm_size(tr->world, &size), "MPI_Comm_size");
    if (tr->n * sizeof(TraceEvent) > (size_t)1 << 30) die("trace: too many events on rank %d (%zu)", rank, tr->n);
    int mine = (int)(tr->n * sizeof(TraceEvent));
    int *counts = NULL, *displs = NULL;
    char *all = NULL;
    if (rank == 0) {
        counts = xcalloc((size_t)size, sizeof(int));
        displs = xcalloc((size_t)size, sizeof(int));
    }
    check(MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, tr->world), "MPI_Gather (trace sizes)");
    size_t total = 0;
    if (rank == 0) {
        for (int r = 0; r < size; r++) {
            if (total + (size_t)counts[r] > (size_t)2000000000) die("trace: gathered trace exceeds 2 GB");
            displs[r] = (int)total;
            total += (size_t)counts[r];
        }
        all = xmalloc(total ? total : 1);
    }
    check(MPI_Gatherv(tr->ev, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, tr->world),
          "MPI_Gatherv (trace events)");
    long written = 0;
    if (rank == 0) {
        AtomicFile af;
        int opened = atomic_open(&af, tr->path, e) == 0; /* if not, the writes below do nothing */
        if (!opened) af.failed = 1;
        const char *head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
        atomic_write(&af, head, strlen(head));
        char line[256];
        int first = 1;
        for (int r = 0; r < size; r++) {
            int len = snprintf(line, sizeof line,
                               "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                               "\"args\":{\"name\":\"rank %d\"}}",
                               first ? "" : ",\n", r, r);
            atomic_write(&af, line, (size_t)len);
            first = 0;
            const TraceEvent *ev = (const TraceEvent *)(all + displs[r]);
            size_t n = (size_t)counts[r] / sizeof(TraceEvent);
            for (size_t i = 0; i < n; i++) {
                atomic_write(&af, ",\n{\"name\":", 10);
                put_json_string(&af, ev[i].name);
                atomic_write(&af, ",\"cat\":", 7);
                put_json_string(&af, ev[i].cat);
                len = snprintf(line, sizeof line, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":0,\"tid\":%d}",
                               ev[i].ts, ev[i].dur, r);
                atomic_write(&af, line, (size_t)len);
                written++;
            }
        }
        const char *tail = "\n]}\n";
        atomic_write(&af, tail, strlen(tail));
        if (opened && atomic_commit(&af, e) != 0) opened = 0;
        if (!opened) written = -1;
        xfree(all);
        xfree(counts);
        xfree(displs);
    }
    return written;
}

void trace_free(CommTrace *tr) {
    if (!tr) return;
    free(tr->ev);
    xfree(tr->path);
    xfree(tr);
}
