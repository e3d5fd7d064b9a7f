/* Benchmark of the distributed attention strategy (dist_attention.h) on the current topology:
 * forward + backward of one causal attention layer over random data, timed per repeat as the
 * slowest rank, plus the same communication schedule with the attention compute switched off,
 * which measures how much communication there is to hide. */
#ifndef SEQPAR_DIST_ATTENTION_BENCH_H
#define SEQPAR_DIST_ATTENTION_BENCH_H

#include "parallel/comm.h"
#include "parallel/topology.h"
#include "attention/seq_attention.h"
#include "parallel/layout.h"

typedef struct {
    double time_s;        /* forward + backward: max over ranks, median over repeats */
    double fwd_s, bwd_s;  /* the same for forward and backward alone */
    double compute_s;     /* compute time recorded in the Comm stats (attention + packing), max over ranks */
    double compute_cpu_s; /* process CPU seconds of that compute, max over ranks: robust to other
                             processes time-slicing the cores (divide by threads for core time) */
    double exposed_s;     /* time blocked in waits / collectives / progress tests, max over ranks */
    double exposed_p2p_s; /* the ring part of exposed_s */
    double comm_only_s;   /* forward + backward with compute off (all communication), max over ranks */
    double comm_only_p2p_s; /* its ring part (wait time of the p2p kinds) */
    double overlap;       /* hidden / total communication = (comm_only - exposed) / comm_only, in [0, 1] */
    double overlap_p2p;   /* the same for the ring transfers alone (the all-to-all cannot overlap) */
    double gflops;        /* useful causal attention flops of the sp group (fwd 4 d H S(S+1)/2,
                             bwd 2.5x that) per second of time_s */
    double bytes_per_rank; /* bytes this rank sent per forward + backward (all kinds) */
    double messages_per_rank; /* messages this rank sent per forward + backward (all kinds) */
    double bytes_kind_max[COMM_KINDS];    /* per kind, the most any rank sent per forward + backward */
    double messages_kind_max[COMM_KINDS]; /* per kind, the most messages any rank sent */
} DistAttnBenchResult;

/* Collective over the world: times the runtime's strategy sa (a distributed one, or the
 * single-process kernel when sp = 1) on this rank's positions pos. Prints nothing; every rank
 * gets the same result (except bytes_per_rank, messages_per_rank). repeats >= 1 (one extra
 * warm-up run is not timed). */
void dist_attention_bench(const Topology *t, Comm *comm, SeqAttention *sa, const int *pos, int S, int repeats,
                          DistAttnBenchResult *r);

#endif
