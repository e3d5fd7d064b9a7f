/* Measurements of this machine for a cluster file: see calibrate.h. */
#include "bench/calibrate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention/flash_attention.h"
#include "bench/sgemm_bench.h"
#include "core/common.h"

double calibrate_attention(int rows, int heads, int head_dim, int causal, int repeats, double *backward_factor) {
    const size_t nq = (size_t)rows * heads * head_dim;
    float *q = xmalloc(sizeof(float) * nq), *k = xmalloc(sizeof(float) * nq), *v = xmalloc(sizeof(float) * nq);
    float *o = xmalloc(sizeof(float) * nq), *dout = xmalloc(sizeof(float) * nq), *dq = xmalloc(sizeof(float) * nq);
    float *dk = xmalloc(sizeof(float) * nq), *dv = xmalloc(sizeof(float) * nq);
    float *lse = xmalloc(sizeof(float) * (size_t)rows * heads), *delta = xmalloc(sizeof(float) * (size_t)rows * heads);
    int *qpos = xmalloc(sizeof(int) * (size_t)rows), *kpos = xmalloc(sizeof(int) * (size_t)rows);
    for (size_t i = 0; i < nq; i++) {
        q[i] = (float)((i * 7919) % 97) / 97.0f - 0.5f;
        k[i] = (float)((i * 104729) % 89) / 89.0f - 0.5f;
        v[i] = (float)((i * 1299709) % 83) / 83.0f - 0.5f;
        dout[i] = (float)((i * 15485863) % 79) / 79.0f - 0.5f;
    }
    for (int i = 0; i < rows; i++) {
        kpos[i] = i;
        qpos[i] = causal ? i : rows + i; /* a diagonal block, or every key before every query */
    }
    AttnShape s = {.n_q = rows, .n_kv = rows, .n_heads = heads, .n_kv_heads = heads, .head_dim = head_dim,
                   .scale = 1.0f / sqrtf((float)head_dim), .mask = causal ? ATTN_CAUSAL : ATTN_FULL};
    double *tf = xmalloc(sizeof(double) * (size_t)repeats), *tb = xmalloc(sizeof(double) * (size_t)repeats);
    attn_forward(&s, q, qpos, k, v, kpos, o, lse); /* warm-up */
    for (int r = 0; r < repeats; r++) { /* each a trial of CALIBRATE_TRIAL_S: seconds per call */
        int n = 0;
        const double t0 = MPI_Wtime();
        do attn_forward(&s, q, qpos, k, v, kpos, o, lse), n++;
        while (MPI_Wtime() - t0 < CALIBRATE_TRIAL_S);
        const double t1 = MPI_Wtime();
        tf[r] = (t1 - t0) / n;
        n = 0;
        do {
            attn_backward_delta(&s, o, dout, delta);
            attn_backward(&s, q, qpos, k, v, kpos, lse, delta, dout, dq, dk, dv);
            n++;
        } while (MPI_Wtime() - t1 < CALIBRATE_TRIAL_S);
        tb[r] = (MPI_Wtime() - t1) / n;
    }
    const double fwd = median_of(tf, repeats), bwd = median_of(tb, repeats);
    *backward_factor = bwd / fwd;
    xfree(q), xfree(k), xfree(v), xfree(o), xfree(dout), xfree(dq), xfree(dk), xfree(dv);
    xfree(lse), xfree(delta), xfree(qpos), xfree(kpos), xfree(tf), xfree(tb);
    const double pairs = causal ? rows * (rows + 1.0) / 2 : rows * (double)rows;
    return 4.0 * pairs * heads * head_dim / fwd / 1e12;
}

void calibrate_wait_asleep(MPI_Request *req) {
    for (int flag = 0;;) {
        MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (flag) return;
        nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL);
    }
}

double calibrate_pingpong(MPI_Comm comm, int a, int b, size_t bytes, int repeats, int fastest) {
    int me;
    MPI_Comm_rank(comm, &me);
    char *buf = xcalloc(bytes ? bytes : 1, 1);
    double *t = xmalloc(sizeof(double) * (size_t)repeats);
    const int n = (int)bytes;
    for (int r = -1; r < repeats; r++) { /* r = -1: a warm-up round trip */
        MPI_Request sync;
        MPI_Ibarrier(comm, &sync); /* the ranks taking no part wait for the next round asleep */
        if (me == a || me == b) MPI_Wait(&sync, MPI_STATUS_IGNORE);
        else calibrate_wait_asleep(&sync);
        const double t0 = MPI_Wtime();
        if (me == a) {
            MPI_Send(buf, n, MPI_BYTE, b, 77, comm);
            MPI_Recv(buf, n, MPI_BYTE, b, 77, comm, MPI_STATUS_IGNORE);
        } else if (me == b) {
            MPI_Recv(buf, n, MPI_BYTE, a, 77, comm, MPI_STATUS_IGNORE);
            MPI_Send(buf, n, MPI_BYTE, a, 77, comm);
        }
        if (r >= 0) t[r] = (MPI_Wtime() - t0) / 2;
    }
    double one_way = median_of(t, repeats); /* sorts t */
    if (fastest) one_way = t[0];
    MPI_Bcast(&one_way, 1, MPI_DOUBLE, a, comm);
    xfree(buf);
    xfree(t);
    return one_way;
}

double calibrate_all_pairs_gbs(MPI_Comm comm, size_t bytes, int repeats, int fastest) {
    int me, size;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &size);
    const int partner = (me ^ 1) < size ? (me ^ 1) : -1, pairs = size / 2;
    char *s = xcalloc(bytes ? bytes : 1, 1), *rbuf = xcalloc(bytes ? bytes : 1, 1);
    double *t = xmalloc(sizeof(double) * (size_t)repeats);
    for (int r = -1; r < repeats; r++) {
        MPI_Barrier(comm);
        const double t0 = MPI_Wtime();
        if (partner >= 0)
            MPI_Sendrecv(s, (int)bytes, MPI_BYTE, partner, 78, rbuf, (int)bytes, MPI_BYTE, partner, 78, comm,
                         MPI_STATUS_IGNORE);
        double mine = MPI_Wtime() - t0, slowest;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
        if (r >= 0) t[r] = slowest;
    }
    double secs = median_of(t, repeats); /* sorts t */
    if (fastest) secs = t[0];
    xfree(s);
    xfree(rbuf);
    xfree(t);
    return pairs > 0 ? 2.0 * pairs * (double)bytes / secs / 1e9 : 0;
}

double calibrate_cross_node_gbs(MPI_Comm comm, const int *node_of, size_t bytes, int repeats) {
    int me, size;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &size);
    int remote = 0, local = 0;
    if (node_of[me] >= 0)
        for (int r = 0; r < size; r++)
            if (node_of[r] >= 0) node_of[r] == node_of[me] ? local++ : remote++;
    const size_t piece = remote ? bytes / (size_t)remote : 0;
    char *s = xcalloc(piece ? piece : 1, 1), *rbuf = xcalloc(piece ? piece * (size_t)remote : 1, 1);
    MPI_Request *q = xmalloc(sizeof(MPI_Request) * (size_t)(2 * remote + 1));
    double total = 0;
    for (int r = -1; r < repeats; r++) { /* r = -1: a warm-up exchange (the connections opened) */
        MPI_Barrier(comm);
        const double t0 = MPI_Wtime();
        int nq = 0, k = 0;
        for (int p = 0; p < size && remote; p++) {
            if (node_of[p] < 0 || node_of[p] == node_of[me]) continue;
            MPI_Irecv(rbuf + (size_t)k++ * piece, (int)piece, MPI_BYTE, p, 79, comm, &q[nq++]);
            MPI_Isend(s, (int)piece, MPI_BYTE, p, 79, comm, &q[nq++]);
        }
        MPI_Waitall(nq, q, MPI_STATUSES_IGNORE);
        double mine = MPI_Wtime() - t0, slowest;
        MPI_Request done; /* the ranks done (or taking no part) wait asleep */
        MPI_Iallreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm, &done);
        calibrate_wait_asleep(&done);
        if (r >= 0) total += slowest;
    }
    double gbs = remote && total > 0 ? (double)local * (double)piece * remote * repeats / total / 1e9 : 0, most;
    MPI_Allreduce(&gbs, &most, 1, MPI_DOUBLE, MPI_MAX, comm); /* the ranks that sat out learn it too */
    xfree(s);
    xfree(rbuf);
    xfree(q);
    return most;
}

double calibrate_memory_gbs(size_t bytes, int repeats) {
    const size_t n = bytes / sizeof(float) > 0 ? bytes / sizeof(float) : 1;
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n), *c = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = (float)(i % 7), c[i] = (float)(i % 5);
    double *t = xmalloc(sizeof(double) * (size_t)repeats);
    for (int r = -1; r < repeats; r++) { /* r = -1: touches every page once */
        const double t0 = MPI_Wtime();
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 0.5f * c[i];
        if (r >= 0) t[r] = MPI_Wtime() - t0;
        b[r < 0 ? 0 : (size_t)r % n] = a[n - 1]; /* the result is used: the loop is not dropped */
    }
    const double secs = median_of(t, repeats);
    xfree(a), xfree(b), xfree(c), xfree(t);
    return 3.0 * sizeof(float) * (double)n / secs / 1e9;
}
