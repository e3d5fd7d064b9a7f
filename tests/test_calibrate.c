/* seqpar calibrate's link measurements (bench/calibrate.h) on the ranks of this host: the exchange
 * across nodes (calibrate_cross_node_gbs) with the ranks split into two pretended nodes gives a
 * positive, finite rate of the size the same bytes get from the pairwise exchange (each rank sends
 * as much either way: a node's two ranks' bytes against all ranks', so half the pairwise figure,
 * within this machine's noise, a factor 4 either side), a rate on every rank where two ranks
 * exchange and the rest sit out (node -1), and 0 where every rank is on one node.
 * Run at 1 rank (run_tests.sh) and at 4 (test_mpi.sh). Prints "N passed, N failed". */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>

#include "bench/calibrate.h"
#include "core/common.h"
#include "testlib.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int *node_of = xmalloc(sizeof(int) * (size_t)size);
    for (int r = 0; r < size; r++) node_of[r] = 0;
    CHECK(calibrate_cross_node_gbs(MPI_COMM_WORLD, node_of, 1 << 20, 2) == 0,
          "every rank on one node: no rate across nodes");
    if (size % 2 == 0) {
        for (int r = 0; r < size; r++) node_of[r] = r < size / 2; /* two nodes of size / 2 ranks */
        const size_t bytes = (size_t)4 << 20;
        const double cross = calibrate_cross_node_gbs(MPI_COMM_WORLD, node_of, bytes, 3);
        const double pairs = calibrate_all_pairs_gbs(MPI_COMM_WORLD, bytes, 3, 0);
        CHECK(isfinite(cross) && cross > 0, "the rate across two nodes is %g GB/s", cross);
        /* the pairwise figure counts all `size` ranks' bytes, the cross one a node's half */
        const double ratio = cross / (pairs / 2);
        CHECK(ratio > 0.25 && ratio < 4, "across nodes %g GB/s, pairwise %g GB/s: a node's bytes count %g times "
              "half the pairwise figure", cross, pairs, ratio);
        /* two ranks exchanging, the others sitting out: a rate on every rank */
        for (int r = 0; r < size; r++) node_of[r] = r == 0 ? 0 : r == size / 2 ? 1 : -1;
        const double pair = calibrate_cross_node_gbs(MPI_COMM_WORLD, node_of, bytes, 2);
        CHECK(isfinite(pair) && pair > 0, "one pair across two nodes, the rest sitting out: %g GB/s on rank %d", pair,
              rank);
        if (rank == 0) printf("across two pretended nodes of %d ranks: %.3g GB/s a node; pairwise %.3g GB/s all ranks\n",
                              size / 2, cross, pairs);
    }
    xfree(node_of);
    const int status = rank == 0 ? test_summary("test_calibrate") : (tl_failed ? 1 : 0);
    MPI_Finalize();
    return status;
}
