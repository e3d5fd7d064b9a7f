/* Progress of a training run: durations for people, the time-left estimate, a run directory of
 * its own and the run-start record of the JSONL log (see progress.h). */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train/progress.h"

void progress_format_duration(double seconds, char *buf, size_t n) {
    if (!isfinite(seconds) || seconds < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long s = (long)(seconds + 0.5);
    if (s < 60) snprintf(buf, n, "%lds", s);
    else if (s < 3600) snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, n, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
}

double progress_eta_seconds(double elapsed, long done, long remaining) {
    if (done <= 0 || remaining < 0) return -1;
    return elapsed / (double)done * (double)remaining;
}

int run_dir_create(const char *parent, MPI_Comm comm, char *buf, size_t n, SeqErr *e) {
    if (!buf || n < 2) return seq_err(e, "run_dir_create: no room for the path");
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    int err_no = 0;
    if (rank == 0) {
        char stamp[32];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        char path[4096]; /* mkdir -p parent */
        snprintf(path, sizeof path, "%s", parent);
        for (char *p = path + 1; *p && !err_no; p++) {
            if (*p != '/') continue;
            *p = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) err_no = errno;
            *p = '/';
        }
        if (!err_no && mkdir(path, 0755) != 0 && errno != EEXIST) err_no = errno;
        for (int k = 1; !err_no; k++) {
            if (k == 1) snprintf(buf, n, "%s/%s", parent, stamp);
            else snprintf(buf, n, "%s/%s-%d", parent, stamp, k);
            if (mkdir(buf, 0755) == 0) break;
            if (errno != EEXIST || k == 1000) err_no = errno ? errno : EEXIST;
        }
    }
    MPI_Bcast(&err_no, 1, MPI_INT, 0, comm);
    if (err_no) {
        return seq_err(e, "cannot create a run directory under '%s': %s: make it writable or name a log file "
                       "with --log FILE", parent, strerror(err_no));
    }
    int len = rank == 0 ? (int)strlen(buf) + 1 : 0;
    MPI_Bcast(&len, 1, MPI_INT, 0, comm);
    if ((size_t)len > n) return seq_err(e, "run directory path longer than %zu bytes", n);
    MPI_Bcast(buf, len, MPI_CHAR, 0, comm);
    return 0;
}

/* Bytes of the well-formed UTF-8 sequence at p (1 for ASCII), or 0 where none starts there. */
static int utf8_sequence(const unsigned char *p) {
    if (*p < 0x80) return 1;
    int n = *p >= 0xC2 && *p <= 0xDF ? 2 : *p >= 0xE0 && *p <= 0xEF ? 3 : *p >= 0xF0 && *p <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((*p == 0xE0 && p[1] < 0xA0) || (*p == 0xED && p[1] > 0x9F))) return 0; /* overlong, surrogate */
    if (n == 4 && ((*p == 0xF0 && p[1] < 0x90) || (*p == 0xF4 && p[1] > 0x8F))) return 0; /* overlong, > U+10FFFF */
    return n;
}

void json_write_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = utf8_sequence(p);
        if (n == 0) fputs("\\ufffd", out); /* a byte that is not UTF-8 (a path's, say): the replacement character */
        else if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", out);
        else if (*p == '\t') fputs("\\t", out);
        else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
        else fwrite(p, 1, (size_t)n, out);
        p += n ? n : 1;
    }
    fputc('"', out);
}

/* the log this process writes (rank 0's only): its path, the end of its last whole record, the
 * error that stopped it */
static struct {
    char path[4096];
    long good;
    int err;
} g_log;

void progress_log_flush(FILE *log, long step) {
    if (g_log.err) return;
    errno = 0;
    if (fflush(log) == 0 && !ferror(log)) {
        g_log.good = ftell(log);
        return;
    }
    g_log.err = errno ? errno : EIO;
    const int cut = g_log.good > 0 && ftruncate(fileno(log), g_log.good) == 0;
    fprintf(stderr, "seqpar: warning: writing the log %s failed at step %ld (%s): training goes on, the log keeps the "
            "records before%s\n", g_log.path, step, strerror(g_log.err), cut ? "" : " (and part of the one that failed)");
    if (!freopen("/dev/null", "w", log)) clearerr(log); /* later records go nowhere */
}

int progress_log_error(void) { return g_log.err; }

void progress_log_run_start(FILE *log, const char *path, long first_step, long steps, int ranks, int argc, char **argv) {
    snprintf(g_log.path, sizeof g_log.path, "%s", path);
    g_log.good = ftell(log) > 0 ? ftell(log) : 0;
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(log, "{\"run_start\": \"%s\", \"first_step\": %ld, \"steps\": %ld, \"ranks\": %d, \"argv\": [", stamp,
            first_step, steps, ranks);
    for (int i = 0; i < argc; i++) {
        if (i) fputs(", ", log);
        json_write_string(log, argv[i]);
    }
    fputs("]}\n", log);
    progress_log_flush(log, first_step - 1);
}
