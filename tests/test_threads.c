/* The default threads per rank (strategies/seq_parallel.h: threads_for_cpus) on the CPU sets a
 * launcher leaves: unbound ranks share the node, ranks bound to cores of their own get those
 * cores, ranks bound to a socket share it with the ranks bound there (Open MPI's default above 2
 * ranks, where dividing the socket's CPUs by every rank of the node left half of them idle), and
 * at least 1 when ranks outnumber CPUs; the CPUs no rank may run on (cpus_left_idle, the run header's
 * note). Then this process as one unbound rank: as many threads as OpenMP sees CPUs. */
#include <omp.h>
#include <sched.h>
#include <stdlib.h>

#include "train/seq_parallel.h"
#include "testlib.h"

static cpu_set_t cpus(int lo, int hi) { /* CPUs lo .. hi */
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = lo; c <= hi; c++) CPU_SET(c, &s);
    return s;
}

int main(void) {
    {
        cpu_set_t all = cpus(0, 15), node[4] = {all, all, all, all};
        CHECK(threads_for_cpus(&all, node, 4) == 4, "16 CPUs, 4 unbound ranks: %d threads, want 4",
              threads_for_cpus(&all, node, 4));
    }
    {
        cpu_set_t node[4] = {cpus(0, 3), cpus(4, 7), cpus(8, 11), cpus(12, 15)};
        CHECK(threads_for_cpus(&node[1], node, 4) == 4, "4 ranks on 4 cores each: %d threads, want 4",
              threads_for_cpus(&node[1], node, 4));
    }
    {
        cpu_set_t node[4] = {cpus(0, 7), cpus(0, 7), cpus(8, 15), cpus(8, 15)};
        CHECK(threads_for_cpus(&node[2], node, 4) == 4, "2 ranks on each of 2 sockets of 8: %d threads, want 4",
              threads_for_cpus(&node[2], node, 4));
    }
    {
        cpu_set_t node[2] = {cpus(0, 0), cpus(1, 1)};
        CHECK(threads_for_cpus(&node[0], node, 2) == 1, "2 ranks bound to a core each: %d threads, want 1",
              threads_for_cpus(&node[0], node, 2));
    }
    {
        cpu_set_t node[3] = {cpus(0, 0), cpus(1, 1), cpus(0, 0)};
        CHECK(threads_for_cpus(&node[0], node, 3) == 1, "3 ranks on 2 cores: %d threads, want 1",
              threads_for_cpus(&node[0], node, 3));
    }
    {
        cpu_set_t node[2] = {cpus(0, 5), cpus(4, 9)}; /* overlapping sets share */
        CHECK(threads_for_cpus(&node[0], node, 2) == 3, "overlapping sets of 6: %d threads, want 3",
              threads_for_cpus(&node[0], node, 2));
    }
    /* CPUs no rank may run on (the header's note): mpirun -np 1 binding one core of 2, two ranks on
     * a core each of 16, ranks covering the node, overlapping sets, a launcher held to 8 CPUs of
     * more (a container's or allocation's limit is not idleness) */
    {
        cpu_set_t one = cpus(0, 0), two[2] = {cpus(0, 0), cpus(1, 1)}, over[2] = {cpus(0, 5), cpus(4, 9)};
        cpu_set_t c2 = cpus(0, 1), c16 = cpus(0, 15), c12 = cpus(0, 11), c8 = cpus(0, 7);
        CHECK(cpus_left_idle(&one, 1, &c2) == 1, "1 rank bound to 1 of 2 CPUs: %d idle, want 1", cpus_left_idle(&one, 1, &c2));
        CHECK(cpus_left_idle(two, 2, &c16) == 14, "2 ranks on a core each of 16: %d idle, want 14",
              cpus_left_idle(two, 2, &c16));
        CHECK(cpus_left_idle(two, 2, &c2) == 0, "2 ranks on the 2 cores: %d idle, want 0", cpus_left_idle(two, 2, &c2));
        CHECK(cpus_left_idle(over, 2, &c12) == 2, "sets 0-5 and 4-9 of 12: %d idle, want 2", cpus_left_idle(over, 2, &c12));
        CHECK(cpus_left_idle(over, 2, &c8) == 0, "sets 0-5 and 4-9, launcher on 0-7: %d idle, want 0",
              cpus_left_idle(over, 2, &c8));
    }
    if (!getenv("OMP_PROC_BIND") && !getenv("OMP_PLACES") && !getenv("GOMP_CPU_AFFINITY")) {
        cpu_set_t mine;
        CPU_ZERO(&mine);
        CHECK(sched_getaffinity(0, sizeof mine, &mine) == 0, "sched_getaffinity failed");
        CHECK(threads_for_cpus(&mine, &mine, 1) == omp_get_num_procs(),
              "one unbound rank: %d threads, OpenMP sees %d CPUs", threads_for_cpus(&mine, &mine, 1),
              omp_get_num_procs());
    }
    return test_summary("test_threads");
}
