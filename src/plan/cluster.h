/* A cluster as the step simulator sees it (simulate.h): nodes of ranks, the links between the ranks
 * of a node, the NICs each node shares among its ranks, and the rate each rank computes attention at
 * as a function of the block's shape. Read from a JSON file (cluster_load) or filled in by the
 * caller; every field has a unit in its name. */
#ifndef SEQPAR_CLUSTER_H
#define SEQPAR_CLUSTER_H

#include "core/common.h"

#define CLUSTER_RATE_POINTS 8

typedef struct {
    char name[64];
    int nodes, ranks_per_node;
    /* inside a node: each rank's port (per direction) and, where the node's ranks share one medium
     * (shared memory), the node's total; 0: no shared limit (a switch such as NVSwitch) */
    double intra_gbs, intra_node_gbs, intra_latency_us;
    /* between nodes: NICs per node, each with this bandwidth per direction; rank i of a node sends
     * and receives through NIC i * nics / ranks_per_node */
    int nics_per_node;
    double nic_gbs, nic_latency_us;
    /* attention: the rank's rate in TFLOP/s for a block whose shorter side (query or key rows) has
     * rows[i] rows, interpolated linearly between the points (constant outside) */
    int n_rate_points;
    double rate_rows[CLUSTER_RATE_POINTS], attn_tflops[CLUSTER_RATE_POINTS];
    double attn_backward_factor; /* backward FLOPs per forward FLOP of a block (2.5: five matmuls for two) */
} Cluster;

/* Reads a cluster file: a JSON object with the fields above (rate points as "attention": [[rows,
 * tflops], ...]); -1 with one line naming the file and the field on a missing or bad value. */
int cluster_load(const char *path, Cluster *c, SeqErr *e);
/* Writes c as a cluster file (atomically; path NULL: to stdout), `source` saying where its values come from ("measured by
 * seqpar calibrate on ..."): 0, or -1 with one line. */
int cluster_save(const char *path, const Cluster *c, const char *source, SeqErr *e);
/* NULL, or a one-line message naming the first field out of range (xmalloc'd). */
char *cluster_check(const Cluster *c);

/* The attention rate in FLOP/s for a block of q_rows x kv_rows. */
double cluster_attention_flops_per_s(const Cluster *c, int q_rows, int kv_rows);
/* Node and NIC of world rank r. */
int cluster_node_of(const Cluster *c, int r);
int cluster_nic_of(const Cluster *c, int r);

#endif
