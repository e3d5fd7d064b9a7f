/* The AdamW step alone, on N elements (one tensor with weight decay), with the moments in RAM
 * (adamw_update_at) and on the disk tier (optimizer_offload_update, parallel/optimizer_offload.h:
 * chunks of 4 MiB streamed through a file in DIR), the two alternating, R rounds after one warm-up
 * step each: wall clock of every step, the best and the median per mode, and the offload's bytes
 * and the I/O its steps waited for. What `train --offload-optimizer` adds to a step is the
 * difference (the rest of the step is the same code). The two modes' weights are checked equal
 * bit for bit after the same steps. The file stays in the page cache where free RAM holds it;
 * the RAM figure counts the tier's buffers. Not a test; built by `make bench-tools`.
 * usage: build/bench/optimizer_step [N (millions, default 64)] [rounds (default 5)] [DIR (default /tmp)] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "optim/adamw.h"
#include "parallel/optimizer_offload.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const size_t n = (size_t)(argc > 1 ? atof(argv[1]) : 64) * 1000000;
    const int rounds = argc > 2 ? atoi(argv[2]) : 5;
    const char *dir = argc > 3 ? argv[3] : "/tmp";
    if (!n || rounds < 1) die("usage: optimizer_step [N millions] [rounds] [DIR]");
    ParamTensor pt = {.name = "w", .ndim = 1, .shape = {(int64_t)n, 0}, .offset = 0, .numel = n, .no_decay = 0};
    ParamTable table = {&pt, 1, n};
    float *p[2], *g = xmalloc(sizeof(float) * n);
    for (int k = 0; k < 2; k++) p[k] = xmalloc(sizeof(float) * n);
    Rng rng;
    rng_seed(&rng, 7);
    for (size_t i = 0; i < n; i++) {
        p[0][i] = p[1][i] = rng_normal(&rng) * 0.02f;
        g[i] = rng_normal(&rng) * 1e-3f;
    }
    AdamWConfig cfg;
    adamw_config_default(&cfg);
    AdamW ram, disk;
    adamw_init(&ram, &cfg, 0, n);
    adamw_init_unbacked(&disk, &cfg, 0, n);
    SeqErr e;
    OptOffload *off = optimizer_offload_create(dir, 0, n, 0, &e);
    if (!off) die("%s", e.msg);
    double *t[2];
    for (int k = 0; k < 2; k++) t[k] = xmalloc(sizeof(double) * (size_t)rounds);
    printf("AdamW step on %zu elements (%.2f GB of moments), %d thread(s), moments on disk in %s\n", n, 8e-9 * (double)n,
           omp_get_max_threads(), dir);
    for (int r = -1; r < rounds; r++) { /* round -1: one warm-up step of each */
        for (int k = 0; k < 2; k++) {
            const double t0 = now_seconds();
            if (k == 0) adamw_update_at(&ram, &table, p[0], 0, g, 0, 1e-3f, 1.0f);
            else optimizer_offload_update(off, &disk, &table, p[1], 0, g, 0, 1e-3f, 1.0f);
            if (r >= 0) t[k][r] = now_seconds() - t0;
        }
    }
    if (optimizer_offload_error(off, &e)) die("%s", e.msg);
    const int same = memcmp(p[0], p[1], sizeof(float) * n) == 0;
    unsigned long long wr, rd;
    double wait_s;
    optimizer_offload_stats(off, &wr, &rd, &wait_s);
    double med[2], best[2];
    for (int k = 0; k < 2; k++) {
        qsort(t[k], (size_t)rounds, sizeof(double), cmp_double);
        best[k] = t[k][0];
        med[k] = rounds % 2 ? t[k][rounds / 2] : 0.5 * (t[k][rounds / 2 - 1] + t[k][rounds / 2]);
        printf("  %-5s best %.3f s, median %.3f s (%d steps)\n", k ? "disk" : "RAM", best[k], med[k], rounds);
    }
    printf("  disk - RAM: best %+.3f s, median %+.3f s a step; %.2f GB written, %.2f GB read over %d steps, I/O not "
           "hidden %.3f s a step; RAM for the moments %.1f MiB instead of %.1f MiB\n",
           best[1] - best[0], med[1] - med[0], wr / 1e9, rd / 1e9, rounds + 1, wait_s / (rounds + 1),
           optimizer_offload_ram_bytes(n, 0) / 1048576.0, 8.0 * (double)n / 1048576.0);
    printf("  weights after %d steps: %s\n", rounds + 1, same ? "equal bit for bit" : "DIFFERENT");
    optimizer_offload_free(off);
    adamw_free(&ram);
    adamw_free(&disk);
    for (int k = 0; k < 2; k++) xfree(p[k]), xfree(t[k]);
    xfree(g);
    return same ? 0 : 1;
}
