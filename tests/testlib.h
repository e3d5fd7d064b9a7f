/* A minimal test harness: CHECK records a pass or a failure with file:line and a message;
 * test_summary() prints "N passed, N failed" and returns the exit status. Header-only. */
#ifndef SEQPAR_TESTLIB_H
#define SEQPAR_TESTLIB_H

#include <math.h>
#include <stdio.h>

static int tl_passed, tl_failed;

#define CHECK(cond, ...) do { \
    if (cond) { tl_passed++; } else { \
        tl_failed++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

/* Max |a - b| / (atol + rtol * |b|) over n elements; <= 1 means within tolerance. */
static inline double tl_max_violation(const float *a, const double *b, size_t n, double atol, double rtol,
                                      size_t *worst) {
    double w = 0; size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double v = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (!(v <= w)) { w = v; wi = i; } /* NaN counts as worst */
    }
    if (worst) *worst = wi;
    return w;
}

static inline int test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, tl_passed, tl_failed);
    return tl_failed ? 1 : 0;
}

#endif
