/* The gradient reduction's collectives, seqpar's own against Open MPI's, in the same run: for each
 * size, a reduce-scatter of n floats (near-equal blocks) by comm_reduce_scatter (comm.h: each
 * rank's block summed in place in a fixed order) and by MPI_Ireduce_scatter + wait (libnbc in
 * Open MPI 4.1: a binomial reduce of the whole vector to rank 0, then a scatter), and an in-place
 * allreduce by comm_allreduce (its own path: that reduce-scatter, then an in-place all-gather) and
 * by MPI_Iallreduce + wait (in place: binomial to rank 0 and a broadcast back). Prints the median
 * time of each over the repeats, its bus bandwidth (the direct model's bytes a rank sends, over the
 * time), and the growth of every rank's peak RSS (VmHWM, reset before each method's first call
 * through /proc/self/clear_refs) during that call, the largest over the ranks: what the
 * collective's temporaries cost. Not a test; built by `make bench-tools`.
 * usage: mpirun -np P build/bench/coll_rates [floats ...] (default 1048576 16777216 67108864)
 *        [COLL_REPEATS=5] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/topology.h"
#include "core/common.h"

/* Resets this process's VmHWM to its current RSS (Linux: 5 to /proc/self/clear_refs); 0 on success. */
static int reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    const int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { OWN_RS, MPI_RS, OWN_AR, MPI_AR, METHODS };
static const char *NAMES[METHODS] = {"reduce-scatter, seqpar", "reduce-scatter, MPI_Ireduce_scatter",
                                     "allreduce (in place), seqpar", "allreduce (in place), MPI_Iallreduce"};

/* One call of method m on n floats (buf: the input, refilled by the caller; out: a block). */
static void run(int m, Comm *cm, float *buf, float *out, size_t n, const size_t *counts, const int *icounts,
                MPI_Comm mc) {
    MPI_Request req;
    switch (m) {
    case OWN_RS: comm_reduce_scatter(cm, COMM_GRAD_REDUCE, buf, out, counts, mc); break;
    case MPI_RS:
        MPI_Ireduce_scatter(buf, out, icounts, MPI_FLOAT, MPI_SUM, mc, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
    case OWN_AR: comm_allreduce(cm, COMM_GRAD_REDUCE, MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, mc); break;
    default:
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, mc, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int P, me;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    Topology t;
    topology_create(&t, P, 1, 1, 1, PLACEMENT_HEAD_FIRST, 1);
    Comm *cm = comm_create(&t, NULL);
    const char *rep_env = getenv("COLL_REPEATS");
    const int reps = rep_env && atoi(rep_env) > 0 ? atoi(rep_env) : 5;
    int hwm_reset_ok = 1;
    size_t sizes[16] = {1u << 20, 1u << 24, 1u << 26};
    int n_sizes = 3;
    if (argc > 1) {
        n_sizes = 0;
        for (int i = 1; i < argc && n_sizes < 16; i++) sizes[n_sizes++] = (size_t)strtoull(argv[i], NULL, 10);
    }
    if (me == 0)
        printf("coll_rates: %d ranks, medians of %d calls after one; bus bandwidth = 4 (P-1)/P n bytes (reduce-scatter) "
               "or twice that (allreduce) over the time; RSS growth: the largest rank's VmHWM rise during the first call\n",
               P, reps);
    for (int si = 0; si < n_sizes; si++) {
        const size_t n = sizes[si];
        if (n > (size_t)1 << 30 || n < (size_t)P) continue;
        size_t *counts = xmalloc(sizeof(size_t) * (size_t)P);
        int *icounts = xmalloc(sizeof(int) * (size_t)P); /* MPI's, for MPI_Ireduce_scatter */
        for (int p = 0; p < P; p++) counts[p] = n / (size_t)P + ((size_t)p < n % (size_t)P), icounts[p] = (int)counts[p];
        float *buf = xmalloc_aligned(sizeof(float) * n), *out = xmalloc_aligned(sizeof(float) * ((size_t)counts[0] + 1));
        for (size_t i = 0; i < n; i++) buf[i] = (float)((i + (size_t)me) % 97) * 0.01f;
        memset(out, 0, sizeof(float) * ((size_t)counts[0] + 1)); /* the caller's block: touched before */
        double med[METHODS], grow[METHODS];
        for (int m = 0; m < METHODS; m++) {
            double *ts = xmalloc(sizeof(double) * (size_t)reps);
            for (int r = 0; r <= reps; r++) {
                for (size_t i = 0; i < n; i++) buf[i] = (float)((i + (size_t)me) % 97) * 0.01f;
                if (r == 0 && reset_hwm() != 0) hwm_reset_ok = 0;
                MPI_Barrier(MPI_COMM_WORLD);
                const double hwm0 = (double)mem_peak_rss(), t0 = MPI_Wtime();
                run(m, cm, buf, out, n, counts, icounts, MPI_COMM_WORLD);
                const double t1 = MPI_Wtime();
                double dt = t1 - t0, g = (double)mem_peak_rss() - hwm0;
                MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                MPI_Allreduce(MPI_IN_PLACE, &g, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (r == 0) grow[m] = g;
                else ts[r - 1] = dt;
            }
            qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
            med[m] = ts[reps / 2];
            xfree(ts);
        }
        if (me == 0) {
            printf("%zu floats (%.1f MiB):\n", n, (double)n * 4 / 1048576.0);
            for (int m = 0; m < METHODS; m++) {
                const double bytes = 4.0 * (double)n * (P - 1) / P * (m >= OWN_AR ? 2 : 1);
                printf("  %-40s %9.2f ms  %6.2f GB/s  RSS +%7.1f MiB\n", NAMES[m], med[m] * 1e3, bytes / med[m] * 1e-9,
                       grow[m] / 1048576.0);
            }
            printf("  seqpar / MPI: reduce-scatter %.2fx the speed, allreduce %.2fx\n", med[MPI_RS] / med[OWN_RS],
                   med[MPI_AR] / med[OWN_AR]);
        }
        xfree(buf);
        xfree(out);
        xfree(counts);
        xfree(icounts);
    }
    if (me == 0 && !hwm_reset_ok)
        printf("note: /proc/self/clear_refs could not reset the peak RSS: a growth can hide behind an earlier call's\n");
    comm_destroy(cm, NULL);
    topology_free(&t);
    MPI_Finalize();
    return 0;
}
