/* Stop signals and test-only fault injection: see run_control.h. */
#include "train/run_control.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/common.h"

static volatile sig_atomic_t g_stop_signal; /* written by the handler, read by the training loop */
static volatile long g_stop_ms;             /* when it arrived (CLOCK_MONOTONIC); the handler's own */

/* A second SIGTERM or SIGINT this soon after the first stop is the same stop delivered twice: a
 * wrapper that signals both its child and the child's process group (coreutils' timeout, scripts'
 * `kill 0`) delivers one stop twice, microseconds to a few milliseconds apart. */
#define STOP_REPEAT_MS 1000

static long monotonic_ms(void) { /* clock_gettime is async-signal-safe */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void on_stop_signal(int sig) {
    if (g_stop_signal && sig != SIGUSR1) { /* second SIGTERM / SIGINT: end now, unless a repeat */
        if (monotonic_ms() - g_stop_ms < STOP_REPEAT_MS) return;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (!g_stop_signal) {
        g_stop_ms = monotonic_ms();
        atomic_signal_fence(memory_order_seq_cst); /* the time before the flag another signal reads */
        g_stop_signal = sig;
    }
}

void stop_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask); /* one stop signal at a time on a thread */
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sigaddset(&sa.sa_mask, SIGINT);
    sa.sa_flags = SA_RESTART;
    const int sigs[] = {SIGTERM, SIGUSR1, SIGINT};
    for (size_t i = 0; i < ARRAY_LEN(sigs); i++)
        if (sigaction(sigs[i], &sa, NULL) != 0) die("sigaction(%d) failed: %s", sigs[i], strerror(errno));
}

int stop_signal_pending(void) { return (int)g_stop_signal; }

const char *stop_signal_name(int sig) {
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "a signal";
    }
}

/* The decimal number of digits [p, p + n) (no sign, no spaces), or -1 when it is not one. */
static long plain_count(const char *p, size_t n) {
    char buf[24];
    if (n == 0 || n >= sizeof buf || *p == '+' || *p == '-') return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return is_decimal_number(buf, 0) ? strtol(buf, NULL, 10) : -1;
}

void fault_plan_from_env(FaultPlan *f) {
    memset(f, 0, sizeof *f);
    f->hang_rank = -1;
    const char *s = getenv("SEQPAR_FAULT_NONFINITE");
    if (s && *s) {
        const char *p = s;
        for (;;) {
            const size_t n = strcspn(p, ",");
            const long v = plain_count(p, n);
            if (v < 1 || f->n_nonfinite == FAULT_MAX_STEPS)
                die_collective("SEQPAR_FAULT_NONFINITE='%s' is not a list of at most %d steps >= 1 such as '3,7' "
                               "(a test-only setting: unset it)", s, FAULT_MAX_STEPS);
            f->nonfinite_steps[f->n_nonfinite++] = v;
            if (!p[n]) break;
            p += n + 1;
        }
    }
    s = getenv("SEQPAR_FAULT_HANG");
    if (s && *s) {
        const size_t n = strcspn(s, ":"), n2 = s[n] ? strcspn(s + n + 1, ":") : 0;
        const char *third = s[n] && s[n + 1 + n2] ? s + n + 1 + n2 + 1 : NULL;
        const long r = plain_count(s, n), st = s[n] ? plain_count(s + n + 1, n2) : -1;
        const long ms = third ? plain_count(third, strlen(third)) : 0;
        if (r < 0 || r > INT_MAX || st < 0 || ms < 0 || (third && ms < 1))
            die_collective("SEQPAR_FAULT_HANG='%s' is not RANK:STEP or RANK:STEP:MILLISECONDS such as '1:4', '1:0' or "
                           "'0:2:3000' (a test-only setting: unset it)", s);
        f->hang_rank = (int)r;
        f->hang_step = st;
        f->hang_ms = ms;
    }
}

int fault_nonfinite_at(const FaultPlan *f, long step) {
    for (int i = 0; i < f->n_nonfinite; i++)
        if (f->nonfinite_steps[i] == step) return 1;
    return 0;
}

void fault_maybe_hang(const FaultPlan *f, int world_rank, long step) {
    if (f->hang_rank != world_rank || f->hang_step != step) return;
    char how[48] = "";
    if (f->hang_ms > 0) snprintf(how, sizeof how, " for %ld ms", f->hang_ms);
    if (step == 0) fprintf(stderr, "seqpar: rank %d hangs before its setup%s (SEQPAR_FAULT_HANG, test only)\n", world_rank, how);
    else fprintf(stderr, "seqpar: rank %d hangs at step %ld%s (SEQPAR_FAULT_HANG, test only)\n", world_rank, step, how);
    fflush(stderr);
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += f->hang_ms / 1000;
    end.tv_nsec += (f->hang_ms % 1000) * 1000000L;
    if (end.tv_nsec >= 1000000000L) end.tv_sec++, end.tv_nsec -= 1000000000L;
    for (;;) { /* a signal's handler interrupts the sleep, not the pause */
        if (f->hang_ms <= 0) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        } else if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &end, NULL) == 0) {
            return;
        }
    }
}
