/* Benchmark of the distributed attention strategy: see dist_attention_bench.h. */
#include "bench/dist_attention_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sgemm_bench.h"
#include "core/common.h"
#include "parallel/dist_attention.h"

static void fill(float *x, size_t n, Rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(r);
}

static double max_over_ranks(const Topology *t, double v) {
    double m;
    if (MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, t->world) != MPI_SUCCESS) die("MPI_Allreduce (bench) failed");
    return m;
}

typedef struct {
    double total, fwd, bwd, compute, compute_cpu, exposed, exposed_p2p;
    unsigned long long bytes, messages;
    double kind_bytes[COMM_KINDS], kind_msgs[COMM_KINDS]; /* max over ranks */
} OneRun;

static void one_run(const Topology *t, Comm *comm, SeqAttention *sa, const float *q, const float *k, const float *v,
                    float *o, float *saved, const float *dout, float *dq, float *dk, float *dv, OneRun *r) {
    comm_stats_reset(comm);
    if (MPI_Barrier(t->world) != MPI_SUCCESS) die("MPI_Barrier (bench) failed");
    double t0 = now_seconds();
    sa->forward(sa, q, k, v, o, saved);
    double t1 = now_seconds();
    sa->backward(sa, q, k, v, o, saved, dout, dq, dk, dv);
    double t2 = now_seconds();
    const CommStats *s = &comm->stats;
    r->total = max_over_ranks(t, t2 - t0);
    r->fwd = max_over_ranks(t, t1 - t0);
    r->bwd = max_over_ranks(t, t2 - t1);
    r->compute = max_over_ranks(t, s->compute_s);
    r->compute_cpu = max_over_ranks(t, s->compute_cpu_s);
    r->exposed = max_over_ranks(t, comm_stats_exposed(s));
    r->exposed_p2p = max_over_ranks(t, s->wait_s[COMM_P2P_INNER] + s->wait_s[COMM_P2P_OUTER]);
    r->bytes = r->messages = 0;
    for (int kd = 0; kd < COMM_KINDS; kd++) {
        r->bytes += comm_stats_bytes(s, (CommKind)kd);
        r->messages += s->messages[kd];
        r->kind_bytes[kd] = max_over_ranks(t, (double)comm_stats_bytes(s, (CommKind)kd));
        r->kind_msgs[kd] = max_over_ranks(t, (double)s->messages[kd]);
    }
}

void dist_attention_bench(const Topology *t, Comm *comm, SeqAttention *sa, const int *pos, int S, int repeats,
                          DistAttnBenchResult *r) {
    memset(r, 0, sizeof *r);
    if (repeats < 1) repeats = 1;
    const int N = sa->heads.n_local, H = sa->heads.n_heads, Hkv = sa->heads.n_kv_heads, d = sa->heads.head_dim;
    sa->set_positions(sa, pos, NULL);
    const size_t nq = (size_t)N * H * d, nk = (size_t)N * Hkv * d;
    float *q = xmalloc_aligned(nq * sizeof(float)), *k = xmalloc_aligned(nk * sizeof(float));
    float *v = xmalloc_aligned(nk * sizeof(float)), *dout = xmalloc_aligned(nq * sizeof(float));
    float *o = xmalloc_aligned(nq * sizeof(float)), *dq = xmalloc_aligned(nq * sizeof(float));
    float *dk = xmalloc_aligned(nk * sizeof(float)), *dv = xmalloc_aligned(nk * sizeof(float));
    float *saved = xmalloc_aligned(sa->saved_floats * sizeof(float));
    Rng rng;
    rng_seed(&rng, 1234 + (uint64_t)t->world_rank);
    fill(q, nq, &rng);
    fill(k, nk, &rng);
    fill(v, nk, &rng);
    fill(dout, nq, &rng);

    OneRun run;
    one_run(t, comm, sa, q, k, v, o, saved, dout, dq, dk, dv, &run); /* warm-up */
    double *tt = xmalloc(sizeof(double) * (size_t)repeats * 7);
    double *tf = tt + repeats, *tb = tf + repeats, *tc = tb + repeats, *te = tc + repeats, *tp = te + repeats, *tu = tp + repeats;
    for (int i = 0; i < repeats; i++) {
        one_run(t, comm, sa, q, k, v, o, saved, dout, dq, dk, dv, &run);
        tt[i] = run.total;
        tf[i] = run.fwd;
        tb[i] = run.bwd;
        tc[i] = run.compute;
        te[i] = run.exposed;
        tp[i] = run.exposed_p2p;
        tu[i] = run.compute_cpu;
    }
    const CommStats timed = comm->stats; /* the last timed run's, which --stats prints per rank */
    r->bytes_per_rank = (double)run.bytes;
    r->messages_per_rank = (double)run.messages;
    for (int kd = 0; kd < COMM_KINDS; kd++) {
        r->bytes_kind_max[kd] = run.kind_bytes[kd];
        r->messages_kind_max[kd] = run.kind_msgs[kd];
    }
    r->time_s = median_of(tt, repeats);
    r->fwd_s = median_of(tf, repeats);
    r->bwd_s = median_of(tb, repeats);
    r->compute_s = median_of(tc, repeats);
    r->compute_cpu_s = median_of(tu, repeats);
    r->exposed_s = median_of(te, repeats);
    r->exposed_p2p_s = median_of(tp, repeats);

    /* the same schedule without the attention compute: all of it is communication (a single
     * process has none) */
    const int distributed = t->sp > 1;
    if (distributed) dist_attention_set_compute(sa, 0);
    for (int i = 0; distributed && i < repeats; i++) {
        one_run(t, comm, sa, q, k, v, o, saved, dout, dq, dk, dv, &run);
        tt[i] = run.exposed;
        tp[i] = run.exposed_p2p;
    }
    r->comm_only_s = distributed ? median_of(tt, repeats) : 0;
    r->comm_only_p2p_s = distributed ? median_of(tp, repeats) : 0;
    if (distributed) dist_attention_set_compute(sa, 1);
    r->overlap = r->comm_only_s > 0 ? fmax(0.0, fmin(1.0, (r->comm_only_s - r->exposed_s) / r->comm_only_s)) : 1.0;
    r->overlap_p2p = r->comm_only_p2p_s > 0
                         ? fmax(0.0, fmin(1.0, (r->comm_only_p2p_s - r->exposed_p2p_s) / r->comm_only_p2p_s))
                         : 1.0;
    double flops = 3.5 * 4.0 * d * (double)H * ((double)S * (S + 1) / 2.0);
    r->gflops = flops / r->time_s / 1e9;
    comm->stats = timed; /* not the communication-only runs' (nor zeros, as --stats printed) */

    xfree(tt);
    float *fr[] = {q, k, v, dout, o, dq, dk, dv, saved};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) xfree(fr[i]);
}
