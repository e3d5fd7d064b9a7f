/* Implementation of the core helpers: fatal errors, tracked allocation, time, RNG. */
#include "core/common.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int mpi_world_size(void) {
    int init = 0, fin = 0, size = 1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

static void print_error(const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fprintf(stderr, "seqpar: error: %s\n", msg);
    fflush(stderr);
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
    if (mpi_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

void die_collective(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Finalize();
    /* _exit, not exit: the process ends here with its output flushed, and without running the
     * libraries' exit handlers and destructors while threads they started (OpenMP's, a tier's
     * helper) may still run: an ASan build saw a rare SEGV in that window after this error line. */
    fflush(NULL);
    _exit(1);
}

int seq_err(SeqErr *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    for (char *c = e->msg; *c; c++) /* keep it one line whatever a file name holds */
        if (*c == '\n' || *c == '\r') *c = ' ';
    return -1;
}

static double g_exchange_deadline; /* seconds; 0: none */

void exchange_deadline_set(double seconds) { g_exchange_deadline = seconds > 0 ? seconds : 0; }

/* die_if_any_rank's wait: its request done */
static int request_done(void *r) {
    int done = 0;
    MPI_Test((MPI_Request *)r, &done, MPI_STATUS_IGNORE);
    return done;
}

/* Completes r within g_exchange_deadline, or prints the watchdog's kind of line and ends the job. */
static void exchange_wait(MPI_Request *r, int rank, int size) {
    double waited = 0;
    if (wait_until(request_done, r, g_exchange_deadline, &waited) == 0) return;
    fprintf(stderr,
            "seqpar: error: watchdog: rank %d: the ranks' error exchange (MPI_Iallreduce over all %d ranks) "
            "is not complete after %.1f s: some rank is stopped, dead or cut off (one of those that print no "
            "such line); ending the job (raise --comm-timeout if the ranks are legitimately this slow)\n",
            rank, size, waited);
    fflush(stderr);
    sleep_seconds(g_exchange_deadline / 2 < 5 ? g_exchange_deadline / 2 : 5); /* the others' lines */
    MPI_Abort(MPI_COMM_WORLD, SEQPAR_WATCHDOG_EXIT);
    exit(SEQPAR_WATCHDOG_EXIT); /* not reached */
}

void die_if_any_rank(const SeqErr *e) {
    if (mpi_world_size() <= 1) {
        if (e) die_collective("%s", e->msg);
        return;
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int first = e ? rank : size;
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r);
    exchange_wait(&r, rank, size); /* every rank is past it: the broadcast below finds them all */
    if (first == size) return;
    SeqErr shared;
    if (rank == first) shared = *e;
    MPI_Bcast(shared.msg, (int)sizeof shared.msg, MPI_CHAR, first, MPI_COMM_WORLD);
    shared.msg[sizeof shared.msg - 1] = '\0';
    die_collective("%s", shared.msg);
}

/* Every tracked block carries a 64-byte header holding its size (and whether it was mapped
 * directly, below), so that frees can be counted and the user pointer stays 64-byte aligned. */
#define HEADER 64
static size_t g_current, g_peak;

/* Zeroed blocks of at least this many bytes are mapped from the kernel, whose pages read as zero
 * until written and take memory only then: a flat parameter or gradient buffer that ZeRO-3 frees
 * before most of it is written (each rank fills its shard) costs that much. A memset would touch
 * every page. */
#define LAZY_ZERO_BYTES ((size_t)1 << 20)

static void *track(void *raw, size_t n) {
    *(size_t *)raw = n;
    ((size_t *)raw)[1] = 0; /* not mapped */
    #pragma omp atomic
    g_current += n;
    size_t cur = g_current;
    if (cur > g_peak) g_peak = cur;
    return (char *)raw + HEADER;
}

void *xmalloc_aligned(size_t n) {
    void *raw = NULL;
    if (posix_memalign(&raw, 64, n + HEADER) != 0 || !raw)
        die("out of memory allocating %zu bytes (%.2f GiB): use a shorter --seq-len or a smaller model",
            n, (double)n / (1 << 30));
    return track(raw, n);
}

void *xmalloc(size_t n) { return xmalloc_aligned(n); }

void *xgrow(void *a, int *cap, int n, size_t size, int first) {
    if (n < *cap) return a;
    *cap = *cap ? 2 * *cap : first;
    void *b = xmalloc(size * (size_t)*cap);
    if (n) memcpy(b, a, size * (size_t)n);
    xfree(a);
    return b;
}

void *xcalloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) die("allocation of %zu x %zu bytes overflows", count, size);
    const size_t n = count * size;
    if (n < LAZY_ZERO_BYTES || n > SIZE_MAX - HEADER) {
        void *p = xmalloc_aligned(n);
        memset(p, 0, n);
        return p;
    }
    void *raw = mmap(NULL, n + HEADER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        die("out of memory allocating %zu bytes (%.2f GiB): use a shorter --seq-len or a smaller model", n,
            (double)n / (1 << 30));
    void *p = track(raw, n); /* page-aligned raw: the user pointer 64-byte aligned */
    ((size_t *)raw)[1] = 1;  /* mapped */
    return p;
}

#define HUGE_PAGE ((size_t)2 << 20)

void *xzalloc_filled(size_t n) {
    if (n < LAZY_ZERO_BYTES || n > SIZE_MAX - HEADER - 2 * HUGE_PAGE) return xcalloc(n, 1);
    /* map a huge page more, keep the 2 MiB-aligned part (so the header and the data start a huge
     * page), and give the rest back: xfree unmaps exactly what is kept */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), keep = (n + HEADER + page - 1) / page * page;
    char *base = mmap(NULL, keep + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        die("out of memory allocating %zu bytes (%.2f GiB): use a shorter --seq-len or a smaller model", n,
            (double)n / (1 << 30));
    char *raw = (char *)(((uintptr_t)base + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (raw > base) munmap(base, (size_t)(raw - base));
    if (base + keep + HUGE_PAGE > raw + keep) munmap(raw + keep, (size_t)(base + keep + HUGE_PAGE - (raw + keep)));
    madvise(raw, keep, MADV_HUGEPAGE); /* advice only: without huge pages the pages come 4 KiB at a time */
    void *p = track(raw, n);
    ((size_t *)raw)[1] = 1; /* mapped */
    return p;
}

void xfree(void *p) {
    if (!p) return;
    char *raw = (char *)p - HEADER;
    size_t n = *(size_t *)raw;
    #pragma omp atomic
    g_current -= n;
    if (((size_t *)raw)[1]) munmap(raw, n + HEADER);
    else free(raw);
}

size_t mem_tracked_current(void) { return g_current; }
size_t mem_tracked_peak(void) { return g_peak; }
void mem_tracked_reset_peak(void) { g_peak = g_current; }

size_t mem_peak_rss(void) {
    /* VmHWM: the high-water mark of this process image's own memory. getrusage's ru_maxrss is
     * carried across execve on Linux, so a process started from a large one (a Python benchmark
     * driver) would report the parent's resident size at fork when its own is smaller. */
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        size_t kib = 0;
        int found = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %zu kB", &kib) == 1) {
                found = 1;
                break;
            }
        fclose(f);
        if (found) return kib * 1024;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

FILE *xfopen(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f)
        die("cannot open '%s' for %s: %s", path, mode[0] == 'r' ? "reading" : "writing", strerror(errno));
    return f;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sleep_seconds(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

int wait_until(int (*done)(void *arg), void *arg, double deadline_s, double *waited) {
    double t0 = now_seconds(), prev = t0;
    for (;;) {
        if (done(arg)) return 0;
        const double t = now_seconds();
        if (t - prev > 1.0) t0 += t - prev;
        prev = t;
        const double w = t - t0;
        if (deadline_s > 0 && w > deadline_s) {
            *waited = w;
            return -1;
        }
        if (w > WAIT_SPIN_S) { /* about 1/16 of the time waited so far: 1 us to 1 ms */
            const double sl = w / 16;
            sleep_seconds(sl < 1e-6 ? 1e-6 : sl > 1e-3 ? 1e-3 : sl);
        }
    }
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(Rng *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}

/* rng_jump: xoshiro256's state update is linear over GF(2), so n updates are the n-th power of its
 * 256 x 256 bit matrix T. jump_table[k][i] holds T^(2^k) applied to the unit state e_i (bit i of
 * the 256), made once (64 levels, each by applying the level below to its own images: about 10 ms);
 * a jump then applies the levels of n's set bits to the state, 256 conditional XORs each. */
static uint64_t jump_table[64][256][4];
static pthread_once_t jump_once = PTHREAD_ONCE_INIT;

static void state_step(uint64_t *s) { /* rng_u64's update without its output */
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
}

/* x <- M x for the linear map whose images of the unit states are m[0..255] */
static void apply_map(const uint64_t (*m)[4], uint64_t *x) {
    uint64_t y[4] = {0, 0, 0, 0};
    for (int i = 0; i < 256; i++)
        if (x[i >> 6] >> (i & 63) & 1)
            for (int w = 0; w < 4; w++) y[w] ^= m[i][w];
    memcpy(x, y, sizeof y);
}

static void jump_table_make(void) {
    for (int i = 0; i < 256; i++) {
        memset(jump_table[0][i], 0, sizeof jump_table[0][i]);
        jump_table[0][i][i >> 6] = 1ull << (i & 63);
        state_step(jump_table[0][i]);
    }
    for (int k = 1; k < 64; k++)
        for (int i = 0; i < 256; i++) {
            memcpy(jump_table[k][i], jump_table[k - 1][i], sizeof jump_table[k][i]);
            apply_map((const uint64_t (*)[4])jump_table[k - 1], jump_table[k][i]);
        }
}

void rng_jump(Rng *r, uint64_t n) {
    if (n < 64) { /* short ones step */
        for (uint64_t i = 0; i < n; i++) state_step(r->s);
        return;
    }
    pthread_once(&jump_once, jump_table_make);
    for (int k = 0; k < 64; k++)
        if (n >> k & 1) apply_map((const uint64_t (*)[4])jump_table[k], r->s);
}

static double unit_interval(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; } /* [0, 1) */

double rng_uniform(Rng *r) { return unit_interval(rng_u64(r)); }

double rng_normal_from(uint64_t a, uint64_t b) {
    double u1 = unit_interval(a), u2 = unit_interval(b);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double rng_normal(Rng *r) {
    const uint64_t a = rng_u64(r), b = rng_u64(r);
    return rng_normal_from(a, b);
}

uint64_t rng_below(Rng *r, uint64_t n) { return n ? rng_u64(r) % n : 0; }

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *m = xmalloc(n);
    memcpy(m, s, n);
    return m;
}

char *xstrdup_printf(const char *fmt, ...) {
    char buf[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return xstrdup(buf);
}

/* A number as a user writes one in decimal: an optional sign, digits and (fraction: 1) a point and
 * an exponent, nothing else. strtol/strtod alone take leading spaces, and strtod hexadecimal
 * ("0x10" = 16), "inf" and "nan". */
int is_decimal_number(const char *s, int fraction) {
    if (*s == '+' || *s == '-') s++;
    int digits = 0, point = 0;
    for (; *s; s++) {
        if (*s >= '0' && *s <= '9') digits++;
        else if (fraction && *s == '.' && !point) point = 1;
        else break;
    }
    if (!digits) return 0;
    if (fraction && (*s == 'e' || *s == 'E')) {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (*s < '0' || *s > '9') return 0;
        while (*s >= '0' && *s <= '9') s++;
    }
    return *s == '\0';
}
