/* The communication layer: MPI wrappers with per-kind statistics, tracing and the watchdog.
 * See comm.h. */
#include "parallel/comm.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel/trace.h"
#include "core/common.h"
#include "kernels/bf16.h"

static const char *const KIND_NAMES[COMM_KINDS] = {"alltoall", "p2p_inner", "p2p_outer", "team", "grad_reduce",
                                                    "param_gather"};

const char *comm_kind_name(CommKind k) { return (unsigned)k < COMM_KINDS ? KIND_NAMES[k] : "?"; }

static void mpi_check(int rc, const char *what, MPI_Comm mc, int peer, size_t bytes) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0, size = -1;
    MPI_Error_string(rc, msg, &len);
    if (mc != MPI_COMM_NULL) MPI_Comm_size(mc, &size);
    die("%s failed (communicator of %d ranks, peer %d, %zu bytes): %s", what, size, peer, bytes, msg);
}

/* The most elements one message or one MPI call's count carries (comm.h, "Counts"). */
static size_t msg_limit(const Comm *c) { return c->piece && c->piece < (size_t)INT_MAX ? c->piece : (size_t)INT_MAX; }

/* Elements a piece of a split transfer: def, or less under comm_set_piece. */
static size_t piece_of(const Comm *c, size_t def) { return c->piece && c->piece < def ? c->piece : def; }

/* A span of bytes as one MPI count of one datatype: `bytes` of MPI_BYTE when they fit msg_limit,
 * else one element of a derived type of extent `bytes` (chunks of msg_limit bytes, then the rest),
 * which also serves as the block of an equal-block collective (block p at p x bytes). */
typedef struct {
    int count;
    MPI_Datatype dt;
} Span;

static Span span_of(const Comm *c, size_t bytes, const char *what) {
    if (bytes <= msg_limit(c)) return (Span){(int)bytes, MPI_BYTE};
    size_t chunk = msg_limit(c);
    if (bytes / chunk > (size_t)INT_MAX) chunk = bytes / (size_t)INT_MAX + 1; /* a tiny comm_set_piece */
    const size_t n = bytes / chunk, rest = bytes % chunk;
    MPI_Datatype one, body, whole, t;
    mpi_check(MPI_Type_contiguous((int)chunk, MPI_BYTE, &one), what, MPI_COMM_NULL, -1, bytes);
    mpi_check(MPI_Type_contiguous((int)n, one, &body), what, MPI_COMM_NULL, -1, bytes);
    if (rest) {
        int len[2] = {1, (int)rest};
        MPI_Aint at[2] = {0, (MPI_Aint)(n * chunk)};
        MPI_Datatype ty[2] = {body, MPI_BYTE};
        mpi_check(MPI_Type_create_struct(2, len, at, ty, &whole), what, MPI_COMM_NULL, -1, bytes);
    } else {
        mpi_check(MPI_Type_dup(body, &whole), what, MPI_COMM_NULL, -1, bytes);
    }
    mpi_check(MPI_Type_create_resized(whole, 0, (MPI_Aint)bytes, &t), what, MPI_COMM_NULL, -1, bytes);
    mpi_check(MPI_Type_commit(&t), what, MPI_COMM_NULL, -1, bytes);
    MPI_Type_free(&one);
    MPI_Type_free(&body);
    MPI_Type_free(&whole);
    return (Span){1, t};
}

/* Once the call using it is posted (MPI keeps what a pending operation needs). */
static void span_free(Span *s) {
    if (s->dt != MPI_BYTE) MPI_Type_free(&s->dt);
}

/* ---- communicator -> world ranks, cached as an attribute ---- */
static int delete_ranks(MPI_Comm comm, int keyval, void *attr, void *extra) {
    (void)comm;
    (void)keyval;
    (void)extra;
    xfree(attr);
    return MPI_SUCCESS;
}

/* Returns the cached array [size, world rank of 0, world rank of 1, ...] of communicator mc. */
static const int *world_ranks(Comm *c, MPI_Comm mc) {
    void *attr = NULL;
    int found = 0;
    mpi_check(MPI_Comm_get_attr(mc, c->keyval, &attr, &found), "MPI_Comm_get_attr", mc, -1, 0);
    if (found) return attr;
    int size;
    mpi_check(MPI_Comm_size(mc, &size), "MPI_Comm_size", mc, -1, 0);
    MPI_Group g, gw;
    mpi_check(MPI_Comm_group(mc, &g), "MPI_Comm_group", mc, -1, 0);
    mpi_check(MPI_Comm_group(c->topo->world, &gw), "MPI_Comm_group (world)", mc, -1, 0);
    int *arr = xmalloc(sizeof(int) * ((size_t)size + 1));
    int *in = xmalloc(sizeof(int) * (size_t)size);
    for (int i = 0; i < size; i++) in[i] = i;
    arr[0] = size;
    mpi_check(MPI_Group_translate_ranks(g, size, in, gw, arr + 1), "MPI_Group_translate_ranks", mc, -1, 0);
    xfree(in);
    MPI_Group_free(&g);
    MPI_Group_free(&gw);
    mpi_check(MPI_Comm_set_attr(mc, c->keyval, arr), "MPI_Comm_set_attr", mc, -1, 0);
    return arr;
}

int comm_world_rank_of(Comm *c, MPI_Comm mc, int rank) {
    const int *arr = world_ranks(c, mc);
    if (rank < 0 || rank >= arr[0]) die("comm: rank %d outside a communicator of %d ranks", rank, arr[0]);
    return arr[1 + rank];
}

static void count_bytes(Comm *c, CommKind k, MPI_Comm mc, int peer, uint64_t bytes) {
    int w = comm_world_rank_of(c, mc, peer);
    if (w == c->topo->world_rank) return; /* to self: not communication */
    if (topology_node_of(c->topo, w) == topology_node_of(c->topo, c->topo->world_rank))
        c->stats.bytes_intra[k] += bytes;
    else
        c->stats.bytes_inter[k] += bytes;
}

/* One message of `bytes` to peer of mc in kind k's statistics. */
static void count_message(Comm *c, CommKind k, MPI_Comm mc, int peer, uint64_t bytes) {
    count_bytes(c, k, mc, peer, bytes);
    c->stats.messages[k]++;
}

static void record(Comm *c, const char *name, const char *cat, double t0, double t1) {
    if (c->trace) trace_event(c->trace, name, cat, t0, t1);
}

#define TRACE_EVERY (-1.0)     /* wait_spent's trace_over for waits: each is traced */
#define TRACE_TESTS_OVER 20e-6 /* ... for tests: only those past 20 us (most return at once) */

/* [t0, t1], time this rank spent waiting on kind k's traffic (a wait, a test, a blocking
 * collective): added to k's exposed wait and, where it lasted over trace_over seconds, traced as
 * the event `name` of category cat (NULL name: "wait <kind>"). */
static void wait_spent(Comm *c, CommKind k, const char *name, const char *cat, double trace_over, double t0,
                       double t1) {
    c->stats.wait_s[k] += t1 - t0;
    if (!c->trace || !(t1 - t0 > trace_over)) return;
    char wait_name[40];
    if (!name) {
        snprintf(wait_name, sizeof wait_name, "wait %s", comm_kind_name(k));
        name = wait_name;
    }
    record(c, name, cat, t0, t1);
}

/* ---- watchdog ---- */
void comm_set_timeout(Comm *c, double seconds) {
    c->timeout_s = seconds > 0 ? seconds : 0;
    exchange_deadline_set(c->timeout_s); /* die_if_any_rank's waits: the same deadline (common.h) */
}

void comm_set_piece(Comm *c, size_t n) { c->piece = n; }

void comm_set_step(Comm *c, long step, const char *phase) {
    c->step = step;
    c->phase = phase ? phase : "?";
}

static void remember_posted(Comm *c, MPI_Request req, int world_peer, int is_send, CommKind k, size_t bytes) {
    CommPosted *p = &c->posted[c->posted_next];
    c->posted_next = (c->posted_next + 1) % COMM_POSTED;
    p->req = req;
    p->world_peer = world_peer;
    p->is_send = is_send;
    p->kind = k;
    p->bytes = bytes;
}

static const CommPosted *find_posted(const Comm *c, MPI_Request req) {
    for (int i = 1; i <= COMM_POSTED; i++) { /* newest first */
        const CommPosted *p = &c->posted[(c->posted_next - i + COMM_POSTED) % COMM_POSTED];
        if (p->req == req) return p;
    }
    return NULL;
}

/* Appends to buf (capacity n) without overflowing; keeps it terminated. */
static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t n, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

/* "4 ranks (world 0-2,8)" for the members of mc (ranges, cut after ~200 characters). */
static void describe_group(Comm *c, MPI_Comm mc, char *buf, size_t n) {
    const int *arr = world_ranks(c, mc);
    int size = arr[0];
    snprintf(buf, n, "%d rank%s (world ", size, size == 1 ? "" : "s");
    for (int i = 0; i < size;) {
        int j = i;
        while (j + 1 < size && arr[1 + j + 1] == arr[1 + j] + 1) j++;
        if (strlen(buf) > 200) {
            append(buf, n, "...");
            break;
        }
        if (j > i) append(buf, n, "%s%d-%d", i ? "," : "", arr[1 + i], arr[1 + j]);
        else append(buf, n, "%s%d", i ? "," : "", arr[1 + i]);
        i = j + 1;
    }
    append(buf, n, ")");
}

/* The pending point-to-point requests among reqs: "recv from world rank 1 (64 KiB), ...". */
static void describe_pending(Comm *c, int n, MPI_Request *reqs, char *buf, size_t cap) {
    buf[0] = 0;
    int listed = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i] == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Request_get_status(reqs[i], &done, MPI_STATUS_IGNORE);
        if (done) continue;
        const CommPosted *p = find_posted(c, reqs[i]);
        if (p)
            append(buf, cap, "%s%s world rank %d (%s, %zu KiB)", listed ? ", " : "", p->is_send ? "send to" : "recv from",
                   p->world_peer, comm_kind_name(p->kind), p->bytes >> 10);
        else
            append(buf, cap, "%sa request not posted through comm_isend/comm_irecv", listed ? ", " : "");
        listed++;
    }
    if (!listed) snprintf(buf, cap, "requests that completed just now");
}

/* Prints the watchdog's line, gives the other ranks a moment to print theirs, ends the job. */
static void watchdog_fire(Comm *c, const char *op, CommKind k, MPI_Comm group, int n, MPI_Request *reqs,
                          double waited) {
    char who[512], when[96], kind[24] = "";
    if (group != MPI_COMM_NULL) {
        char g[400];
        describe_group(c, group, g, sizeof g);
        snprintf(who, sizeof who, "over a group of %s", g);
    } else {
        char pend[440];
        describe_pending(c, n, reqs, pend, sizeof pend);
        snprintf(who, sizeof who, "waiting for %s", pend);
    }
    if (c->step > 0) snprintf(when, sizeof when, "at step %ld (%s)", c->step, c->phase);
    else snprintf(when, sizeof when, "before step 1 (%s)", c->phase);
    if ((unsigned)k < COMM_KINDS) snprintf(kind, sizeof kind, " (%s)", KIND_NAMES[k]); /* control: none */
    fprintf(stderr,
            "seqpar: error: watchdog: rank %d %s: %s%s %s is not complete after %.1f s: some rank is stopped, "
            "dead or cut off (one of those that print no such line); ending the job (raise --comm-timeout if steps "
            "are legitimately this slow)\n",
            c->topo->world_rank, when, op, kind, who, waited);
    fflush(stderr);
    double grace = c->timeout_s / 2 < 5 ? c->timeout_s / 2 : 5;
    sleep_seconds(grace);
    MPI_Abort(c->topo->world, COMM_WATCHDOG_EXIT);
    exit(COMM_WATCHDOG_EXIT); /* not reached */
}

/* A wait's requests, tested by wait_until (core/common.h) */
typedef struct {
    int n;
    MPI_Request *reqs;
    const char *op;
    MPI_Comm group;
} Pending;

static int pending_done(void *arg) {
    Pending *p = arg;
    int flag = 0;
    mpi_check(MPI_Testall(p->n, p->reqs, &flag, MPI_STATUSES_IGNORE), p->op, p->group, -1, 0);
    return flag;
}

/* Completes n requests under the deadline. group: the collective's communicator (named in the
 * message), or MPI_COMM_NULL for point-to-point requests (their peers are named). k may be
 * COMM_KINDS for control traffic. */
static void wait_deadline(Comm *c, const char *op, CommKind k, MPI_Comm group, int n, MPI_Request *reqs) {
    Pending p = {n, reqs, op, group};
    double waited = 0;
    if (wait_until(pending_done, &p, c->timeout_s, &waited) != 0) watchdog_fire(c, op, k, group, n, reqs, waited);
}

/* The skeleton of every blocking collective here: rc, what its nonblocking call `op` on mc
 * returned, is checked (a failure names peer and bytes), then req is completed under the deadline
 * (the watchdog names op, k and mc). */
static void collective_wait(Comm *c, const char *op, CommKind k, MPI_Comm mc, int rc, int peer, size_t bytes,
                            MPI_Request *req) {
    mpi_check(rc, op, mc, peer, bytes);
    wait_deadline(c, op, k, mc, 1, req);
}

/* ---- the setup's guard (comm.h) ---- */
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_guard_cv;
static pthread_once_t g_guard_once = PTHREAD_ONCE_INIT;
static int g_guard_armed, g_guard_rank, g_guard_thread_ok;
static struct timespec g_guard_deadline; /* CLOCK_MONOTONIC */
static double g_guard_timeout;
static char g_guard_what[200];

static void *guard_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_guard_mu);
    for (;;) {
        while (!g_guard_armed) pthread_cond_wait(&g_guard_cv, &g_guard_mu);
        const struct timespec dl = g_guard_deadline;
        if (pthread_cond_timedwait(&g_guard_cv, &g_guard_mu, &dl) != ETIMEDOUT || !g_guard_armed) continue;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec < g_guard_deadline.tv_sec ||
            (now.tv_sec == g_guard_deadline.tv_sec && now.tv_nsec < g_guard_deadline.tv_nsec))
            continue; /* re-armed meanwhile */
        fprintf(stderr,
                "seqpar: error: watchdog: rank %d before step 1 (setup): %s is not complete after %.1f s: some rank is "
                "stopped, dead or cut off (one of those that print no such line); ending the job (raise "
                "--comm-timeout if the start is legitimately this slow)\n",
                g_guard_rank, g_guard_what, g_guard_timeout);
        fflush(stderr);
        _exit(COMM_WATCHDOG_EXIT);
    }
    return NULL;
}

static void guard_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_guard_cv, &a);
    pthread_condattr_destroy(&a);
    pthread_t th;
    g_guard_thread_ok = pthread_create(&th, NULL, guard_main, NULL) == 0;
    if (g_guard_thread_ok) pthread_detach(th);
}

void comm_guard_begin(int world_rank, const char *what, double timeout_s) {
    if (!(timeout_s > 0)) return;
    pthread_once(&g_guard_once, guard_init);
    if (!g_guard_thread_ok) return; /* no thread: no guard (the setup runs as before) */
    pthread_mutex_lock(&g_guard_mu);
    clock_gettime(CLOCK_MONOTONIC, &g_guard_deadline);
    const double end = (double)g_guard_deadline.tv_sec + 1e-9 * (double)g_guard_deadline.tv_nsec + timeout_s;
    g_guard_deadline.tv_sec = (time_t)end;
    g_guard_deadline.tv_nsec = (long)((end - (double)g_guard_deadline.tv_sec) * 1e9);
    g_guard_timeout = timeout_s;
    g_guard_rank = world_rank;
    snprintf(g_guard_what, sizeof g_guard_what, "%s", what);
    g_guard_armed = 1;
    pthread_cond_signal(&g_guard_cv);
    pthread_mutex_unlock(&g_guard_mu);
}

void comm_guard_end(void) {
    if (!g_guard_thread_ok) return;
    pthread_mutex_lock(&g_guard_mu);
    g_guard_armed = 0;
    pthread_cond_signal(&g_guard_cv);
    pthread_mutex_unlock(&g_guard_mu);
}

/* ---- context ---- */
/* SEQPAR_COMM_PIECE: its value (0 where unset or empty), or -1 with a one-line message in err. */
static long long env_piece(char *err, size_t n) {
    const char *env = getenv("SEQPAR_COMM_PIECE");
    if (!env || !*env) return 0;
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(env, &end, 10);
    if (*end || errno || v < 1 || env[0] < '0' || env[0] > '9') {
        snprintf(err, n, "SEQPAR_COMM_PIECE=%.40s: expected a positive number of elements a message (a test knob: "
                 "unset it for normal runs)", env);
        return -1;
    }
    return v;
}

int comm_env_check(char *err, size_t n) { return env_piece(err, n) < 0; }

Comm *comm_create(const Topology *t, const char *trace_path) {
    Comm *c = xcalloc(1, sizeof *c);
    c->topo = t;
    c->timeout_s = COMM_DEFAULT_TIMEOUT_S;
    c->phase = "setup";
    char err[200];
    const long long piece = env_piece(err, sizeof err);
    if (piece < 0) die("%s", err);
    c->piece = (size_t)piece;
    mpi_check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_ranks, &c->keyval, NULL),
              "MPI_Comm_create_keyval", MPI_COMM_NULL, -1, 0);
    if (trace_path) c->trace = trace_create(t->world, trace_path, c->piece);
    return c;
}

int comm_destroy(Comm *c, SeqErr *e) {
    if (!c) return 0;
    int rc = 0;
    if (c->trace) {
        if (trace_write(c->trace, e) < 0) rc = -1;
        trace_free(c->trace);
    }
    for (int i = 0; i < c->n_wire; i++) xfree(c->wire[i].stage);
    xfree(c->wire);
    /* attributes still attached stay valid and are deleted with their communicators */
    mpi_check(MPI_Comm_free_keyval(&c->keyval), "MPI_Comm_free_keyval", MPI_COMM_NULL, -1, 0);
    xfree(c);
    return rc;
}

uint64_t comm_stats_bytes(const CommStats *s, CommKind k) { return s->bytes_intra[k] + s->bytes_inter[k]; }

void comm_stats_reset(Comm *c) { memset(&c->stats, 0, sizeof c->stats); }

double comm_stats_exposed(const CommStats *s) {
    double e = 0;
    for (int k = 0; k < COMM_KINDS; k++) e += s->wait_s[k];
    return e + s->meta_wait_s;
}

void comm_stats_print(Comm *c, FILE *f) {
    int rank = c->topo->world_rank, size = c->topo->world_size;
    CommStats *all = rank == 0 ? xmalloc(sizeof(CommStats) * (size_t)size) : NULL;
    MPI_Request req;
    collective_wait(c, "MPI_Igather (comm stats)", COMM_KINDS, c->topo->world,
                    MPI_Igather(&c->stats, (int)sizeof(CommStats), MPI_BYTE, all, (int)sizeof(CommStats), MPI_BYTE, 0,
                                c->topo->world, &req),
                    0, sizeof(CommStats), &req);
    if (rank != 0) return;
    for (int r = 0; r < size; r++) {
        const CommStats *s = &all[r];
        fprintf(f, "rank %d:", r);
        for (int k = 0; k < COMM_KINDS; k++) {
            if (!s->messages[k] && !comm_stats_bytes(s, (CommKind)k) && s->wait_s[k] == 0) continue;
            fprintf(f, " %s %.3f MB (intra %.3f, inter %.3f) msgs %" PRIu64 " wait %.4f s;", KIND_NAMES[k],
                    comm_stats_bytes(s, (CommKind)k) / 1e6, s->bytes_intra[k] / 1e6, s->bytes_inter[k] / 1e6,
                    s->messages[k], s->wait_s[k]);
        }
        if (s->meta_bytes || s->meta_wait_s > 0) fprintf(f, " meta %.3f MB wait %.4f s;", s->meta_bytes / 1e6, s->meta_wait_s);
        fprintf(f, " compute in the attention strategy %.4f s (cpu %.4f s), exposed comm %.4f s\n", s->compute_s, s->compute_cpu_s,
                comm_stats_exposed(s));
    }
    for (int r = 0; r < size; r++) { /* the exact byte counts, for checks against formulas */
        fprintf(f, "bytes rank %d:", r);
        for (int k = 0; k < COMM_KINDS; k++)
            fprintf(f, " %s %" PRIu64, KIND_NAMES[k], comm_stats_bytes(&all[r], (CommKind)k));
        fprintf(f, "\n");
    }
    fflush(f);
    xfree(all);
}

double comm_compute_begin(Comm *c) {
    c->cpu_t0 = cpu_seconds();
    return now_seconds();
}

void comm_compute_end(Comm *c, const char *name, double t0) {
    double t1 = now_seconds();
    c->stats.compute_s += t1 - t0;
    c->stats.compute_cpu_s += cpu_seconds() - c->cpu_t0;
    record(c, name, "compute", t0, t1);
}

/* ---- point to point ---- */
void comm_isend(Comm *c, CommKind k, const void *buf, size_t bytes, int peer, int tag, MPI_Comm mc,
                MPI_Request *req) {
    double t0 = now_seconds();
    Span sp = span_of(c, bytes, "MPI_Isend");
    mpi_check(MPI_Isend(buf, sp.count, sp.dt, peer, tag, mc, req), "MPI_Isend", mc, peer, bytes);
    span_free(&sp);
    count_message(c, k, mc, peer, bytes);
    remember_posted(c, *req, comm_world_rank_of(c, mc, peer), 1, k, bytes);
    if (c->trace) {
        char name[40];
        snprintf(name, sizeof name, "isend %s %zuKB to %d", KIND_NAMES[k], bytes >> 10,
                 comm_world_rank_of(c, mc, peer));
        record(c, name, "send", t0, now_seconds());
    }
}

void comm_irecv(Comm *c, CommKind k, void *buf, size_t bytes, int peer, int tag, MPI_Comm mc, MPI_Request *req) {
    double t0 = now_seconds();
    Span sp = span_of(c, bytes, "MPI_Irecv");
    mpi_check(MPI_Irecv(buf, sp.count, sp.dt, peer, tag, mc, req), "MPI_Irecv", mc, peer, bytes);
    span_free(&sp);
    remember_posted(c, *req, comm_world_rank_of(c, mc, peer), 0, k, bytes);
    if (c->trace) {
        char name[40];
        snprintf(name, sizeof name, "irecv %s %zuKB from %d", KIND_NAMES[k], bytes >> 10,
                 comm_world_rank_of(c, mc, peer));
        record(c, name, "recv", t0, now_seconds());
    }
}

/* ---- bf16 wire ---- */
static MPI_Request wire_busy_marker = MPI_REQUEST_NULL; /* a blocking collective's staging slot */

/* The index of a free slot with room for count bf16 elements (a free one is grown, or a new one
 * added: the array may move, so callers keep indices, not pointers). */
static int wire_slot(Comm *c, size_t count) {
    int grow = -1;
    for (int i = 0; i < c->n_wire; i++) {
        if (c->wire[i].req) continue;
        if (c->wire[i].cap >= count) return i;
        if (grow < 0) grow = i;
    }
    if (grow < 0) {
        CommWireSlot *bigger = xcalloc((size_t)c->n_wire + 1, sizeof *bigger);
        if (c->n_wire) memcpy(bigger, c->wire, sizeof *bigger * (size_t)c->n_wire);
        xfree(c->wire);
        c->wire = bigger;
        grow = c->n_wire++;
    }
    CommWireSlot *w = &c->wire[grow];
    xfree(w->stage);
    w->stage = xmalloc_aligned(sizeof(bf16_t) * (count ? count : 1));
    w->cap = count;
    return grow;
}

/* Completes the bf16 transfers whose requests MPI has completed (their handles are null now):
 * receives are widened into their destinations, slots become free. */
static void wire_finish(Comm *c) {
    for (int i = 0; i < c->n_wire; i++) {
        CommWireSlot *w = &c->wire[i];
        if (!w->req || w->req == &wire_busy_marker || *w->req != MPI_REQUEST_NULL) continue;
        if (w->dst) bf16_unpack(w->dst, w->stage, w->count);
        w->req = NULL;
        w->dst = NULL;
    }
}

void comm_isend_floats(Comm *c, CommKind k, const float *buf, size_t count, CommWire w, int peer, int tag,
                       MPI_Comm mc, MPI_Request *req) {
    if (w == COMM_WIRE_FP32) {
        comm_isend(c, k, buf, sizeof(float) * count, peer, tag, mc, req);
        return;
    }
    const int i = wire_slot(c, count); /* may move c->wire */
    CommWireSlot *s = &c->wire[i];
    bf16_pack(s->stage, buf, count);
    comm_isend(c, k, s->stage, sizeof(bf16_t) * count, peer, tag, mc, req);
    s->req = req;
    s->dst = NULL;
    s->count = count;
}

void comm_irecv_floats(Comm *c, CommKind k, float *buf, size_t count, CommWire w, int peer, int tag, MPI_Comm mc,
                       MPI_Request *req) {
    if (w == COMM_WIRE_FP32) {
        comm_irecv(c, k, buf, sizeof(float) * count, peer, tag, mc, req);
        return;
    }
    const int i = wire_slot(c, count); /* may move c->wire */
    CommWireSlot *s = &c->wire[i];
    comm_irecv(c, k, s->stage, sizeof(bf16_t) * count, peer, tag, mc, req);
    s->req = req;
    s->dst = buf;
    s->count = count;
}

void comm_waitall(Comm *c, CommKind k, int n, MPI_Request *reqs) {
    if (n <= 0) return;
    double t0 = now_seconds();
    wait_deadline(c, "MPI_Waitall", k, MPI_COMM_NULL, n, reqs);
    wait_spent(c, k, NULL, "wait", TRACE_EVERY, t0, now_seconds());
    if (c->n_wire) wire_finish(c);
}

int comm_testall(Comm *c, CommKind k, int n, MPI_Request *reqs) {
    int pending = 0; /* none (e.g. a ring of one rank's progress tests): no test, no time to k */
    for (int i = 0; i < n && !pending; i++) pending = reqs[i] != MPI_REQUEST_NULL;
    if (!pending) return 1;
    double t0 = now_seconds();
    int flag = 0;
    mpi_check(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE), "MPI_Testall", MPI_COMM_NULL, -1, 0);
    if (flag && c->n_wire) wire_finish(c);
    wait_spent(c, k, "testall", "wait", TRACE_TESTS_OVER, t0, now_seconds());
    return flag;
}

/* ---- collectives ---- */
static int comm_size_of(MPI_Comm mc) {
    int n;
    mpi_check(MPI_Comm_size(mc, &n), "MPI_Comm_size", mc, -1, 0);
    return n;
}

static int comm_rank_of(MPI_Comm mc) {
    int r;
    mpi_check(MPI_Comm_rank(mc, &r), "MPI_Comm_rank", mc, -1, 0);
    return r;
}

static size_t type_size(MPI_Datatype dt) {
    int s;
    mpi_check(MPI_Type_size(dt, &s), "MPI_Type_size", MPI_COMM_NULL, -1, 0);
    return (size_t)s;
}

/* One message of `bytes` to every other member of mc, counted (a collective's traffic). */
static void count_to_peers(Comm *c, CommKind k, MPI_Comm mc, uint64_t bytes) {
    const int n = comm_size_of(mc), me = comm_rank_of(mc);
    for (int p = 0; p < n; p++)
        if (p != me) count_message(c, k, mc, p, bytes);
}

/* A blocking collective of kind k, begun at t0, is complete: its time is exposed wait. */
static void finish_collective(Comm *c, CommKind k, const char *cat, double t0) {
    wait_spent(c, k, KIND_NAMES[k], cat, TRACE_EVERY, t0, now_seconds());
}

void comm_alltoall(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t bytes_per_peer, MPI_Comm mc) {
    double t0 = now_seconds();
    MPI_Request req;
    Span sp = span_of(c, bytes_per_peer, "MPI_Ialltoall");
    const int rc = MPI_Ialltoall(sendbuf, sp.count, sp.dt, recvbuf, sp.count, sp.dt, mc, &req);
    span_free(&sp);
    collective_wait(c, "MPI_Ialltoall", k, mc, rc, -1, bytes_per_peer, &req);
    finish_collective(c, k, "alltoall", t0);
    count_to_peers(c, k, mc, bytes_per_peer);
}

static size_t post_pieces(int send, void *buf, size_t count, MPI_Datatype dt, size_t es, size_t pe, int p, int tag,
                          MPI_Comm mc, MPI_Request *reqs, const char *what);
static size_t pieces_of(size_t count, size_t pe);

/* Tags of the collectives run over point-to-point messages (beside the reduce-scatter's, below). */
#define A2A_TAG 24000
#define AG_TAG 24001
#define GATHER_TAG 24002

/* An int copy of n counts known to fit. */
static int *ints_of(const size_t *v, int n, int *into) {
    for (int i = 0; i < n; i++) into[i] = (int)v[i];
    return into;
}

void comm_alltoallv(Comm *c, CommKind k, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                    void *recvbuf, const size_t *recvcounts, const size_t *rdispls, MPI_Datatype dt, size_t most,
                    MPI_Comm mc) {
    int n = comm_size_of(mc), me = comm_rank_of(mc);
    size_t es = type_size(dt);
    double t0 = now_seconds();
    if (most <= msg_limit(c)) { /* every rank's counts fit: one MPI call */
        int *iv = xmalloc(sizeof(int) * 4 * (size_t)n);
        for (int p = 0; p < n; p++)
            if (sendcounts[p] > most || sdispls[p] > most - sendcounts[p] || recvcounts[p] > most ||
                rdispls[p] > most - recvcounts[p])
                die("internal: all-to-all: a count or displacement past the bound %zu", most);
        MPI_Request req;
        collective_wait(c, "MPI_Ialltoallv", k, mc,
                        MPI_Ialltoallv(sendbuf, ints_of(sendcounts, n, iv), ints_of(sdispls, n, iv + n), dt, recvbuf,
                                       ints_of(recvcounts, n, iv + 2 * n), ints_of(rdispls, n, iv + 3 * n), dt, mc,
                                       &req),
                        -1, sendcounts[me] * es, &req);
        xfree(iv);
    } else { /* messages in pieces; the own block is copied */
        const size_t pe = piece_of(c, COMM_RS_PIECE);
        size_t n_req = 0;
        for (int p = 0; p < n; p++)
            if (p != me) n_req += pieces_of(sendcounts[p], pe) + pieces_of(recvcounts[p], pe);
        if (n_req > (size_t)INT_MAX) die("all-to-all: %zu messages", n_req);
        MPI_Request *reqs = xmalloc(sizeof(MPI_Request) * (n_req ? n_req : 1));
        size_t i = 0;
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            i += post_pieces(0, (char *)recvbuf + rdispls[p] * es, recvcounts[p], dt, es, pe, p, A2A_TAG, mc, reqs + i,
                             "MPI_Irecv (all-to-all)");
            i += post_pieces(1, (char *)sendbuf + sdispls[p] * es, sendcounts[p], dt, es, pe, p, A2A_TAG, mc, reqs + i,
                             "MPI_Isend (all-to-all)");
        }
        if (sendcounts[me] != recvcounts[me]) die("internal: all-to-all: %zu elements to self, %zu expected", sendcounts[me], recvcounts[me]);
        if (sendcounts[me])
            memcpy((char *)recvbuf + rdispls[me] * es, (const char *)sendbuf + sdispls[me] * es, sendcounts[me] * es);
        wait_deadline(c, "all-to-all", k, mc, (int)n_req, reqs);
        xfree(reqs);
    }
    finish_collective(c, k, "alltoall", t0);
    for (int p = 0; p < n; p++)
        if (p != me) count_message(c, k, mc, p, (uint64_t)sendcounts[p] * es);
}

static void allreduce_floats_own(Comm *c, CommKind k, float *buf, size_t count, MPI_Comm mc, int n);

void comm_allreduce(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t count, MPI_Datatype dt,
                    MPI_Op op, MPI_Comm mc) {
    int n = comm_size_of(mc), me = comm_rank_of(mc);
    size_t es = type_size(dt);
    const int own = dt == MPI_FLOAT && op == MPI_SUM && n > 1 && count >= COMM_ALLREDUCE_OWN_MIN;
    double t0 = now_seconds();
    if (own) {
        if (sendbuf != MPI_IN_PLACE) memcpy(recvbuf, sendbuf, count * sizeof(float));
        allreduce_floats_own(c, k, recvbuf, count, mc, n);
    } else { /* runs of at most msg_limit elements (an elementwise op: the same results) */
        const size_t lim = msg_limit(c);
        size_t o = 0;
        do {
            const size_t len = count - o < lim ? count - o : lim;
            const void *from = sendbuf == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)sendbuf + o * es;
            MPI_Request req;
            collective_wait(c, "MPI_Iallreduce", k, mc,
                            MPI_Iallreduce(from, (char *)recvbuf + o * es, (int)len, dt, op, mc, &req), -1, len * es,
                            &req);
            o += len;
        } while (o < count);
    }
    finish_collective(c, k, "allreduce", t0);
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    size_t mine = base + ((size_t)me < rem);
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        size_t part = base + ((size_t)p < rem);
        count_message(c, k, mc, p, (uint64_t)(part + mine) * es);
    }
}

/* ---- reduce-scatter (comm.h: seqpar's own, in pieces, each block summed in a fixed order) ---- */
#define RS_TAG_BASE 24576 /* tags RS_TAG_BASE .. + COMM_RS_TAGS - 1, on the reduce-scatter's communicator */

/* Messages of at most pe floats that count floats take. */
static size_t pieces_of(size_t count, size_t pe) { return (count + pe - 1) / pe; }

/* Posts the count elements of dt (es bytes each) at buf to peer p of mc (send) or from it
 * (receive) as pieces_of(count, pe) messages, one request each from reqs on; returns how many it
 * posted. what: the call, for the error message. The reduce-scatter, the allreduce's all-gather
 * and the per-rank-count collectives past MPI's int counts move their blocks this way: no message
 * beyond MPI's int count (pe is at most INT_MAX), and the reduce-scatter sums a piece while the
 * next ones are in flight. */
static size_t post_pieces(int send, void *buf, size_t count, MPI_Datatype dt, size_t es, size_t pe, int p, int tag,
                          MPI_Comm mc, MPI_Request *reqs, const char *what) {
    size_t i = 0;
    for (size_t o = 0; o < count; o += pe, i++) {
        const size_t len = count - o < pe ? count - o : pe;
        char *at = (char *)buf + o * es;
        mpi_check(send ? MPI_Isend(at, (int)len, dt, p, tag, mc, &reqs[i]) : MPI_Irecv(at, (int)len, dt, p, tag, mc, &reqs[i]),
                  what, mc, p, len * es);
    }
    return i;
}

/* Receives and sums every message that has arrived, in step order; when all are summed and the
 * sends are complete, returns 1 (the reduce-scatter is then no longer in flight). */
static int rs_progress(CommReduceScatter *rs) {
    const size_t pieces = rs->n_steps / (size_t)(rs->n - 1 > 0 ? rs->n - 1 : 1);
    const size_t pe = rs->piece;
    while (rs->step < rs->n_steps) {
        const int p = (int)((rs->me + 1 + rs->step / pieces) % rs->n);
        const size_t off = rs->step % pieces * pe;
        const size_t len = rs->own - off < pe ? rs->own - off : pe;
        float *land = rs->scratch ? rs->scratch : rs->land + off;
        if (!rs->recv_posted) {
            mpi_check(MPI_Irecv(land, (int)len, MPI_FLOAT, p, RS_TAG_BASE + rs->tag, rs->mc, &rs->recv),
                      "MPI_Irecv (reduce-scatter)", rs->mc, p, len * sizeof(float));
            rs->recv_posted = 1;
        }
        int flag = 0;
        mpi_check(MPI_Test(&rs->recv, &flag, MPI_STATUS_IGNORE), "MPI_Test (reduce-scatter)", rs->mc, p,
                  len * sizeof(float));
        if (!flag) return 0;
        rs->recv_posted = 0;
        float *d = rs->dst + off;
        for (size_t i = 0; i < len; i++) d[i] += land[i];
        rs->step++;
    }
    int flag = 1;
    if (rs->n_sends)
        mpi_check(MPI_Testall(rs->n_sends, rs->sends, &flag, MPI_STATUSES_IGNORE), "MPI_Testall (reduce-scatter)",
                  rs->mc, -1, 0);
    if (!flag) return 0;
    xfree(rs->sends);
    xfree(rs->scratch);
    rs->sends = NULL;
    rs->scratch = NULL;
    rs->n_sends = 0;
    rs->active = 0;
    return 1;
}

/* comm_rs_post's work; in_place: the sum is made in the own block of src (recv unused), the
 * peers' messages landing in a scratch piece; account: count the bytes (comm_allreduce counts its
 * own). */
static void rs_start(Comm *c, CommKind k, CommReduceScatter *rs, float *src, float *recv, const size_t *recvcounts,
                     MPI_Comm mc, int tag, int in_place, int account) {
    const size_t pe = piece_of(c, in_place ? COMM_AR_PIECE : COMM_RS_PIECE); /* floats a message */
    if (rs->active) die("internal: a reduce-scatter posted while still in flight");
    if (tag < 0 || tag >= COMM_RS_TAGS) die("internal: reduce-scatter tag %d outside 0..%d", tag, COMM_RS_TAGS - 1);
    const int n = comm_size_of(mc), me = comm_rank_of(mc);
    size_t off = 0, own_off = 0;
    size_t n_sends = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) own_off = off;
        else n_sends += pieces_of(recvcounts[p], pe);
        off += recvcounts[p];
    }
    if (n_sends > (size_t)INT_MAX) die("reduce-scatter: %zu messages", n_sends);
    const size_t own = recvcounts[me];
    *rs = (CommReduceScatter){.mc = mc, .n = n, .me = me, .tag = tag, .active = 1,
                              .land = src + own_off, .dst = in_place ? src + own_off : recv, .own = own,
                              .piece = pe, .n_steps = pieces_of(own, pe) * (size_t)(n - 1), .n_sends = (int)n_sends};
    if (n_sends) rs->sends = xmalloc(sizeof(MPI_Request) * n_sends);
    size_t i = 0;
    off = 0;
    for (int p = 0; p < n; p++) {
        const size_t cnt = recvcounts[p];
        if (p != me) {
            i += post_pieces(1, src + off, cnt, MPI_FLOAT, sizeof(float), pe, p, RS_TAG_BASE + tag, mc, rs->sends + i,
                             "MPI_Isend (reduce-scatter)");
            if (cnt && account) count_message(c, k, mc, p, (uint64_t)cnt * sizeof(float));
        }
        off += cnt;
    }
    if (in_place) {
        if (own && n > 1) rs->scratch = xmalloc(sizeof(float) * (own < pe ? own : pe));
    } else {
        if (own && recv < rs->land + own && rs->land < recv + own) die("internal: a reduce-scatter's block overlaps its input");
        if (own) memcpy(recv, rs->land, own * sizeof(float)); /* the own contribution first */
    }
    rs_progress(rs);
}

void comm_rs_post(Comm *c, CommKind k, CommReduceScatter *rs, float *src, float *recv, const size_t *recvcounts,
                  MPI_Comm mc, int tag) {
    rs_start(c, k, rs, src, recv, recvcounts, mc, tag, 0, 1);
}

static int rs_any_active(int n, const CommReduceScatter *rs) {
    for (int i = 0; i < n; i++)
        if (rs[i].active) return 1;
    return 0;
}

/* Progresses every one in flight; 1 when none is left. */
static int rs_progress_all(int n, CommReduceScatter *rs) {
    int done = 1;
    for (int i = 0; i < n; i++)
        if (rs[i].active) done &= rs_progress(&rs[i]);
    return done;
}

int comm_rs_test(Comm *c, CommKind k, int n, CommReduceScatter *rs) {
    if (!rs_any_active(n, rs)) return 1;
    double t0 = now_seconds();
    const int done = rs_progress_all(n, rs);
    wait_spent(c, k, "reduce-scatter test", "wait", TRACE_TESTS_OVER, t0, now_seconds());
    return done;
}

typedef struct {
    int n;
    CommReduceScatter *rs;
} RsPending;

static int rs_pending_done(void *arg) {
    RsPending *p = arg;
    return rs_progress_all(p->n, p->rs);
}

/* Completes them under the deadline, with no accounting. */
static void rs_complete(Comm *c, CommKind k, int n, CommReduceScatter *rs) {
    RsPending p = {n, rs};
    double waited = 0;
    if (wait_until(rs_pending_done, &p, c->timeout_s, &waited) != 0) {
        MPI_Comm group = MPI_COMM_NULL;
        for (int i = 0; i < n && group == MPI_COMM_NULL; i++)
            if (rs[i].active) group = rs[i].mc;
        watchdog_fire(c, "reduce-scatter", k, group, 0, NULL, waited);
    }
}

void comm_rs_wait(Comm *c, CommKind k, int n, CommReduceScatter *rs) {
    if (!rs_any_active(n, rs)) return;
    double t0 = now_seconds();
    rs_complete(c, k, n, rs);
    wait_spent(c, k, NULL, "wait", TRACE_EVERY, t0, now_seconds());
}

void comm_reduce_scatter(Comm *c, CommKind k, float *sendbuf, float *recvbuf, const size_t *recvcounts, MPI_Comm mc) {
    double t0 = now_seconds();
    CommReduceScatter rs = {0};
    comm_rs_post(c, k, &rs, sendbuf, recvbuf, recvcounts, mc, COMM_RS_TAGS - 1);
    rs_complete(c, k, 1, &rs);
    finish_collective(c, k, "reduce_scatter", t0);
}

/* comm_allreduce of floats (sum, in place, any count): the reduce-scatter above into near-equal
 * blocks, each summed in its own place, then an all-gather of the blocks in messages of at most
 * COMM_RS_PIECE floats, all posted at once (no MPI count or displacement beyond one message, so
 * vectors past 2^31 floats too; the bytes are comm_allreduce's to count). Every rank gets every
 * element as its block's owner summed it: the replicas stay equal bit for bit. */
static void allreduce_floats_own(Comm *c, CommKind k, float *buf, size_t count, MPI_Comm mc, int n) {
    const int me = comm_rank_of(mc);
    size_t *counts = xmalloc(sizeof(size_t) * (size_t)n), *displs = xmalloc(sizeof(size_t) * (size_t)n);
    const size_t base = count / (size_t)n, rem = count % (size_t)n;
    for (int p = 0; p < n; p++) {
        counts[p] = base + ((size_t)p < rem);
        displs[p] = p ? displs[p - 1] + counts[p - 1] : 0;
    }
    CommReduceScatter rs = {0};
    rs_start(c, k, &rs, buf, NULL, counts, mc, COMM_RS_TAGS - 1, 1, 0);
    rs_complete(c, k, 1, &rs);
    const size_t pe = piece_of(c, COMM_RS_PIECE), mine = pieces_of(counts[me], pe);
    size_t n_req = 0;
    for (int p = 0; p < n; p++)
        if (p != me) n_req += mine + pieces_of(counts[p], pe);
    if (n_req > (size_t)INT_MAX) die("allreduce: %zu messages", n_req);
    MPI_Request *reqs = xmalloc(sizeof(MPI_Request) * (n_req ? n_req : 1));
    size_t i = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        i += post_pieces(0, buf + displs[p], counts[p], MPI_FLOAT, sizeof(float), pe, p, RS_TAG_BASE + COMM_RS_TAGS, mc,
                         reqs + i, "MPI_Irecv (allreduce's all-gather)"); /* p's block from p */
        i += post_pieces(1, buf + displs[me], counts[me], MPI_FLOAT, sizeof(float), pe, p, RS_TAG_BASE + COMM_RS_TAGS,
                         mc, reqs + i, "MPI_Isend (allreduce's all-gather)"); /* mine to p */
    }
    wait_deadline(c, "allreduce's all-gather", k, mc, (int)n_req, reqs);
    xfree(reqs);
    xfree(counts);
    xfree(displs);
}

void comm_reduce_scatter_block(Comm *c, CommKind k, float *sendbuf, float *recvbuf, size_t recvcount, MPI_Comm mc) {
    const int n = comm_size_of(mc);
    size_t *counts = xmalloc(sizeof(size_t) * (size_t)n);
    for (int p = 0; p < n; p++) counts[p] = recvcount;
    comm_reduce_scatter(c, k, sendbuf, recvbuf, counts, mc);
    xfree(counts);
}

/* Posts the all-gatherv into ag (comm.h): one MPI_Iallgatherv when every count and displacement
 * fits (the arrays are the same on every rank, so all take the same path), else every rank's
 * block to every other in pieces of at most COMM_RS_PIECE elements, received straight into
 * place. Counts the bytes (comm.h's direct model). */
static void allgatherv_post(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf,
                            const size_t *recvcounts, const size_t *displs, MPI_Datatype dt, MPI_Comm mc,
                            CommGather *ag) {
    const int n = comm_size_of(mc), me = comm_rank_of(mc);
    const size_t es = type_size(dt), lim = msg_limit(c);
    if (ag->reqs) die("internal: an all-gather posted while still in flight");
    if (sendcount != recvcounts[me])
        die("internal: all-gather: %zu elements sent, %zu expected from this rank", sendcount, recvcounts[me]);
    int fits = 1;
    for (int p = 0; p < n; p++) fits &= recvcounts[p] <= lim && displs[p] <= lim;
    *ag = (CommGather){.mc = mc};
    if (fits) {
        ag->ints = xmalloc(sizeof(int) * 2 * (size_t)n);
        ag->reqs = xmalloc(sizeof(MPI_Request));
        ag->n = 1;
        mpi_check(MPI_Iallgatherv(sendbuf, (int)sendcount, dt, recvbuf, ints_of(recvcounts, n, ag->ints), ints_of(displs, n, ag->ints + n),
                                  dt, mc, ag->reqs),
                  "MPI_Iallgatherv", mc, -1, sendcount * es);
    } else {
        char *mine = (char *)recvbuf + displs[me] * es;
        if (sendbuf != MPI_IN_PLACE && sendcount) memcpy(mine, sendbuf, sendcount * es);
        const size_t pe = piece_of(c, COMM_RS_PIECE);
        size_t n_req = 0;
        for (int p = 0; p < n; p++)
            if (p != me) n_req += pieces_of(recvcounts[p], pe) + pieces_of(sendcount, pe);
        if (n_req > (size_t)INT_MAX) die("all-gather: %zu messages", n_req);
        ag->reqs = xmalloc(sizeof(MPI_Request) * (n_req ? n_req : 1));
        ag->n = (int)n_req;
        size_t i = 0;
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            i += post_pieces(0, (char *)recvbuf + displs[p] * es, recvcounts[p], dt, es, pe, p, AG_TAG, mc, ag->reqs + i,
                             "MPI_Irecv (all-gather)");
            i += post_pieces(1, mine, sendcount, dt, es, pe, p, AG_TAG, mc, ag->reqs + i, "MPI_Isend (all-gather)");
        }
    }
    count_to_peers(c, k, mc, (uint64_t)sendcount * es);
}

static void gather_done(CommGather *ag) {
    xfree(ag->reqs);
    xfree(ag->ints);
    ag->reqs = NULL;
    ag->ints = NULL;
    ag->n = 0;
}

void comm_allgatherv(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf, const size_t *recvcounts,
                     const size_t *displs, MPI_Datatype dt, MPI_Comm mc) {
    double t0 = now_seconds();
    CommGather ag = {0};
    allgatherv_post(c, k, sendbuf, sendcount, recvbuf, recvcounts, displs, dt, mc, &ag);
    wait_deadline(c, "all-gather", k, mc, ag.n, ag.reqs);
    gather_done(&ag);
    finish_collective(c, k, "allgather", t0);
}

void comm_iallgatherv(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf,
                      const size_t *recvcounts, const size_t *displs, MPI_Datatype dt, MPI_Comm mc, CommGather *ag) {
    allgatherv_post(c, k, sendbuf, sendcount, recvbuf, recvcounts, displs, dt, mc, ag);
}

int comm_gather_test(Comm *c, CommKind k, int n, CommGather *ag) {
    int pending = 0;
    for (int i = 0; i < n; i++) pending |= ag[i].reqs != NULL;
    if (!pending) return 1;
    double t0 = now_seconds();
    int all = 1;
    for (int i = 0; i < n; i++) {
        if (!ag[i].reqs) continue;
        int flag = 0;
        mpi_check(MPI_Testall(ag[i].n, ag[i].reqs, &flag, MPI_STATUSES_IGNORE), "MPI_Testall (all-gather)", ag[i].mc, -1,
                  0);
        if (flag) gather_done(&ag[i]);
        all &= flag;
    }
    wait_spent(c, k, "testall", "wait", TRACE_TESTS_OVER, t0, now_seconds());
    return all;
}

void comm_gather_wait(Comm *c, CommKind k, int n, CommGather *ag) {
    int pending = 0;
    for (int i = 0; i < n; i++) pending |= ag[i].reqs != NULL;
    if (!pending) return;
    double t0 = now_seconds();
    for (int i = 0; i < n; i++) {
        if (!ag[i].reqs) continue;
        wait_deadline(c, "all-gather", k, ag[i].mc, ag[i].n, ag[i].reqs);
        gather_done(&ag[i]);
    }
    wait_spent(c, k, NULL, "wait", TRACE_EVERY, t0, now_seconds());
}

void comm_allgather(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, MPI_Comm mc) {
    double t0 = now_seconds();
    MPI_Request req;
    Span sp = span_of(c, bytes_per_rank, "MPI_Iallgather");
    const int rc = MPI_Iallgather(sendbuf, sp.count, sp.dt, recvbuf, sp.count, sp.dt, mc, &req);
    span_free(&sp);
    collective_wait(c, "MPI_Iallgather", k, mc, rc, -1, bytes_per_rank, &req);
    finish_collective(c, k, "allgather", t0);
    count_to_peers(c, k, mc, bytes_per_rank);
}

void comm_allgather_floats(Comm *c, CommKind k, const float *sendbuf, float *recvbuf, size_t count_per_rank,
                           CommWire w, MPI_Comm mc) {
    if (w == COMM_WIRE_FP32) {
        comm_allgather(c, k, sendbuf, recvbuf, sizeof(float) * count_per_rank, mc);
        return;
    }
    size_t n = (size_t)comm_size_of(mc);
    const int si = wire_slot(c, count_per_rank);
    c->wire[si].req = &wire_busy_marker; /* held while the receive slot is found */
    const int ri = wire_slot(c, n * count_per_rank);
    bf16_pack(c->wire[si].stage, sendbuf, count_per_rank);
    comm_allgather(c, k, c->wire[si].stage, c->wire[ri].stage, sizeof(bf16_t) * count_per_rank, mc);
    bf16_unpack(recvbuf, c->wire[ri].stage, n * count_per_rank);
    c->wire[si].req = NULL;
}

void comm_allgather_meta(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t bytes, MPI_Comm mc) {
    int n = comm_size_of(mc);
    double t0 = now_seconds();
    MPI_Request req;
    Span sp = span_of(c, bytes, "MPI_Iallgather");
    mpi_check(MPI_Iallgather(sendbuf, sp.count, sp.dt, recvbuf, sp.count, sp.dt, mc, &req), "MPI_Iallgather", mc, -1,
              bytes);
    span_free(&sp);
    wait_deadline(c, "MPI_Iallgather (meta)", k, mc, 1, &req);
    double t1 = now_seconds();
    c->stats.meta_wait_s += t1 - t0; /* not k's: it moved none of k's bytes (k names it to the watchdog) */
    if (c->trace) record(c, "allgather meta", "allgather", t0, t1);
    c->stats.meta_bytes += (uint64_t)bytes * (uint64_t)(n - 1);
}

void comm_gatherv(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf,
                  const size_t *recvcounts, const size_t *displs, MPI_Datatype dt, int root, MPI_Comm mc) {
    const int n = comm_size_of(mc), me = comm_rank_of(mc);
    const size_t es = type_size(dt), pe = piece_of(c, COMM_RS_PIECE);
    double t0 = now_seconds();
    size_t n_req = 0;
    if (me == root) {
        for (int p = 0; p < n; p++)
            if (p != me) n_req += pieces_of(recvcounts[p], pe);
        if (sendbuf != MPI_IN_PLACE) {
            if (sendcount != recvcounts[me])
                die("internal: gather: %zu elements from the root, %zu expected", sendcount, recvcounts[me]);
            if (sendcount) memcpy((char *)recvbuf + displs[me] * es, sendbuf, sendcount * es);
        }
    } else {
        n_req = pieces_of(sendcount, pe);
    }
    if (n_req > (size_t)INT_MAX) die("gather: %zu messages", n_req);
    MPI_Request *reqs = xmalloc(sizeof(MPI_Request) * (n_req ? n_req : 1));
    size_t i = 0;
    if (me == root) {
        for (int p = 0; p < n; p++)
            if (p != me)
                i += post_pieces(0, (char *)recvbuf + displs[p] * es, recvcounts[p], dt, es, pe, p, GATHER_TAG, mc,
                                 reqs + i, "MPI_Irecv (gather)");
    } else {
        i = post_pieces(1, (void *)sendbuf, sendcount, dt, es, pe, root, GATHER_TAG, mc, reqs, "MPI_Isend (gather)");
    }
    wait_deadline(c, "gather", k, mc, (int)n_req, reqs);
    xfree(reqs);
    finish_collective(c, k, "gather", t0);
    if (me != root) count_message(c, k, mc, root, (uint64_t)sendcount * es);
}

/* ---- control traffic: under the watchdog, outside the statistics ---- */
void comm_control_allreduce(Comm *c, const char *what, void *buf, size_t count, MPI_Datatype dt, MPI_Op op,
                            MPI_Comm mc) {
    const size_t es = type_size(dt), lim = msg_limit(c);
    size_t o = 0;
    do { /* runs of at most lim elements (the op is elementwise: the same results) */
        const size_t len = count - o < lim ? count - o : lim;
        MPI_Request req;
        collective_wait(c, what, COMM_KINDS, mc,
                        MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + o * es, (int)len, dt, op, mc, &req), -1, len * es,
                        &req);
        o += len;
    } while (o < count);
}

void comm_control_barrier(Comm *c, const char *what, MPI_Comm mc) {
    MPI_Request req;
    collective_wait(c, what, COMM_KINDS, mc, MPI_Ibarrier(mc, &req), -1, 0, &req);
}

void comm_control_bcast(Comm *c, const char *what, void *buf, size_t bytes, int root, MPI_Comm mc) {
    MPI_Request req;
    Span sp = span_of(c, bytes, what);
    const int rc = MPI_Ibcast(buf, sp.count, sp.dt, root, mc, &req);
    span_free(&sp);
    collective_wait(c, what, COMM_KINDS, mc, rc, root, bytes, &req);
}

int comm_launched_world(int *rank) {
    static const char *const vars[][2] = {
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"}, {"PMI_SIZE", "PMI_RANK"}, {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"}};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *n = getenv(vars[i][0]), *r = getenv(vars[i][1]);
        if (!n) continue;
        *rank = r ? atoi(r) : -1;
        return atoi(n);
    }
    *rank = -1;
    return 0;
}
