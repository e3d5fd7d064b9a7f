/* Measurements of this machine for a cluster file (seqpar calibrate): the attention kernel's rate on
 * square blocks, and the time of messages between two ranks and of every rank of a node exchanging
 * at once. Collective where it says so; every figure is a median of repeats. */
#ifndef SEQPAR_CALIBRATE_H
#define SEQPAR_CALIBRATE_H

#include <mpi.h>
#include <stddef.h>

/* The forward rate of a rows x rows block (heads, head_dim; fp32) in TFLOP/s of useful work (4
 * visible pairs heads head_dim a pass: rows^2 fully visible, rows (rows + 1) / 2 a causal diagonal),
 * the median of `repeats` trials, each the kernel run again and again for 0.1 s (so that ranks sharing
 * cores get their share within a trial), and the backward's time over the forward's
 * (*backward_factor). */
double calibrate_attention(int rows, int heads, int head_dim, int causal, int repeats, double *backward_factor);

/* One-way seconds of a `bytes` message between ranks a and b of comm (half a round trip): the median
 * of `repeats`, or with `fastest` the fastest round trip's (a link's own latency and bandwidth: where
 * ranks share cores, most round trips also wait for a preempted rank to run again, which is the
 * cores' time, not the link's; as the GEMM's peak takes the best trial); every rank of comm calls
 * it, the others wait. */
double calibrate_pingpong(MPI_Comm comm, int a, int b, size_t bytes, int repeats, int fastest);

/* Every rank of comm sends `bytes` to its partner (rank ^ 1; an odd last rank sits out) and
 * receives as many, all at once: the bytes all ranks sent over the slowest rank's time, in GB/s
 * (median of `repeats`, or with `fastest` the fastest repeat's, as calibrate_pingpong). Collective. */
double calibrate_all_pairs_gbs(MPI_Comm comm, size_t bytes, int repeats, int fastest);

/* Every rank of comm sends `bytes`, split evenly over the ranks on other nodes (node_of[r]: rank r's
 * node, the same number of ranks on each; a rank with node_of < 0 takes no part), to all of them at
 * once, and receives as much from them: the bytes one node's ranks sent across over the trials' mean
 * time (a long transfer's rate: trials over TCP vary by a third), in GB/s, on every rank. A node's
 * links as the collectives and all-to-alls load them: every rank sending and receiving at once, many
 * flows each way; with two ranks taking part, one pair's exchange both ways. Collective; 0 where every
 * rank taking part is on one node. */
double calibrate_cross_node_gbs(MPI_Comm comm, const int *node_of, size_t bytes, int repeats);

/* Waits for req asleep (a test every 0.2 ms), not polling: where ranks share cores, a rank polling
 * while others measure takes a core from them (every link measurement's bystanders wait so). */
void calibrate_wait_asleep(MPI_Request *req);

/* One rank's memory bandwidth in GB/s: STREAM's triad a = b + s c over three arrays of `bytes`
 * each, counting two arrays read and one written (the median of `repeats`). Not collective: call it
 * on every rank at once for a node's ranks sharing its memory. */
double calibrate_memory_gbs(size_t bytes, int repeats);

/* Seconds a calibration trial runs its kernel again and again (calibrate_attention; the GEMM's
 * through sgemm_gflops): many scheduler time slices, so that ranks sharing cores (more ranks than
 * cores) each get their fair share within it, where one short call either runs alone on a core or
 * waits a whole slice. */
#define CALIBRATE_TRIAL_S 0.1

#endif
