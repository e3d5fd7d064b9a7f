/* A cluster as the step simulator and the planner see it: nodes of ranks, the threads, memory and
 * slow tier of each, the links between the ranks of a node (a switch or one shared memory), the NICs
 * each node shares among its ranks, and the rates a rank computes at as functions of shape: GEMMs by
 * size and attention by head dimension, block length and causality, per precision. Read from a JSON
 * file (cluster_load), from a named preset compiled into the binary (cluster_resolve: the files of
 * the repository's clusters/ folder), or filled in by the caller; every field has a unit in its name.
 * Fields a file leaves out take the defaults cluster_load documents, so that every older file loads. */
#ifndef SEQPAR_CLUSTER_H
#define SEQPAR_CLUSTER_H

#include "core/common.h"
#include "kernels/bf16.h"

#define CLUSTER_RATE_POINTS 8
#define CLUSTER_ATTN_CURVES 16

/* How the ranks of a node exchange: through a switch (NVSwitch, or a full mesh of links: every rank's
 * port is its own) or through one shared memory (the ranks of a CPU host: intra_node_gbs limits them
 * together where it is set). */
typedef enum { CLUSTER_INTRA_SWITCH = 0, CLUSTER_INTRA_SHARED_MEMORY = 1 } ClusterIntraKind;
/* How the step's collectives outside attention (the gradient reduction, ZeRO's reduce-scatters and
 * gathers) move their bytes: NCCL's ring (a GPU cluster), or seqpar's CPU collectives, where each
 * member exchanges its share directly with every other member (parallel/comm.h). */
typedef enum { CLUSTER_COLLECTIVES_RING = 0, CLUSTER_COLLECTIVES_DIRECT = 1 } ClusterCollectives;

/* Rate points: y at x[i], interpolated linearly between the points and constant outside them. */
typedef struct {
    int n;
    double x[CLUSTER_RATE_POINTS], tflops[CLUSTER_RATE_POINTS];
} ClusterCurve;

/* An attention rate curve: forward TFLOP/s of useful work (4 visible (query, key) pairs x head_dim a
 * head, the FlashAttention papers' convention) of a block of `precision` and `head_dim`, causal
 * (the block's diagonal) or fully visible, by the block's length in rows (its shorter side). */
typedef struct {
    int precision; /* Precision */
    int head_dim;
    int causal;
    ClusterCurve rate; /* x: rows */
} ClusterAttnCurve;

typedef struct {
    char name[64];
    char description[160]; /* one line for `seqpar plan --clusters` */
    int nodes, ranks_per_node;
    int threads_per_rank;  /* CPU threads a rank computes with (a GPU rank: the host cores it may use) */
    /* memory: each rank's own (a GPU's HBM; a CPU rank's share of RAM), the node's slow tier that
     * offloading spills to (host RAM for a GPU, disk for a CPU), and each rank's bandwidth
     * to it per direction; 0: not given */
    double device_mem_gib, host_mem_gib, d2h_gbs;
    /* each rank's memory bandwidth (a GPU's HBM), for the optimizer step's pass over its shard of the
     * parameters, gradients and moments; 0: not given (the step not counted) */
    double device_mem_gbs;
    /* a fixed cost every training step pays beyond what the model counts (launches, the framework);
     * 0: none */
    double step_overhead_ms;
    int intra_kind; /* ClusterIntraKind */
    int collectives; /* ClusterCollectives: "collectives" in the file: "nccl" (the default) or "direct" */
    /* inside a node: each rank's port (per direction) and, where the node's ranks share one medium
     * (shared memory), the node's total; 0: no shared limit (a switch such as NVSwitch) */
    double intra_gbs, intra_node_gbs, intra_latency_us;
    /* inside a node: the most one rank sends another per direction, where the ranks are wired pair by
     * pair (a 4-GPU board's NVLinks split over its 3 peers); 0: no limit beyond the ports */
    double intra_peer_gbs;
    /* between nodes: NICs per node, each with this bandwidth per direction; rank i of a node sends
     * and receives through NIC i * nics / ranks_per_node */
    int nics_per_node;
    double nic_gbs, nic_latency_us;
    /* a NIC's total per direction (GB/s) by the flows sharing it, as measured where many flows carry
     * less together than one alone (TCP over a shared queue): x flows, y ("tflops") GB/s, each at most
     * nic_gbs; n 0: nic_gbs whatever the flows (cluster_nic_gbs) */
    ClusterCurve nic_flows;
    /* attention's default curve (the file's "attention" points, else its first "attention_rates"
     * curve): the rank's rate in TFLOP/s for a block whose shorter side (query or key rows) has
     * x[i] rows, interpolated linearly between the points (constant outside). The simulator's
     * rate where the cluster has no curve of the block's precision (cluster_attention_flops_per_s). */
    ClusterCurve attn;
    double attn_backward_factor; /* backward time per forward time of a block at the same rate (2.5: five matmuls for two) */
    /* bytes of device memory traffic, per element, to merge a block's result into its fp32
     * accumulator outside the attention kernel (the forward's output and log-sum-exp rescale, the
     * backward's dq, dk, dv sums), at device_mem_gbs; 0: not counted */
    double attn_merge_bytes;
    /* attention by shape: curves by precision, head dimension and causality (cluster_attention_rate) */
    int n_attn_curves;
    ClusterAttnCurve attn_curves[CLUSTER_ATTN_CURVES];
    /* GEMM TFLOP/s per precision (indexed by Precision) by size, the cube root of m n k; n 0: not given */
    ClusterCurve gemm[2];
} Cluster;

/* Reads a cluster file: a JSON object with the fields above (rate points as "attention": [[rows,
 * tflops], ...]; see docs/planner.md for every key); -1 with one line naming the file and the field on
 * a missing or bad value. Defaults of the optional keys: threads_per_rank 1, device_mem_gib,
 * host_mem_gib and d2h_gbs 0 (not given), intra_all_to_all "shared_memory" where intra_node_gbs is
 * set and "switch" otherwise, no gemm and no attention_rates curves. */
int cluster_load(const char *path, Cluster *c, SeqErr *e);
/* The same from JSON text; `origin` names it in messages (a file, "preset NAME"). */
int cluster_parse(const char *text, const char *origin, Cluster *c, SeqErr *e);
/* Writes c as a cluster file (atomically; path NULL: to stdout), `source` saying where its values come from ("measured by
 * seqpar calibrate on ..."): 0, or -1 with one line. */
int cluster_save(const char *path, const Cluster *c, const char *source, SeqErr *e);
/* NULL, or a one-line message naming the first field out of range (xmalloc'd). */
char *cluster_check(const Cluster *c);

/* The named presets compiled into the binary (the repository's clusters/NAME.json), in name order,
 * and "this-machine" last: the file `seqpar calibrate --save` writes (cluster_this_machine_path). */
int cluster_preset_count(void);
const char *cluster_preset_name(int i);
/* The preset's JSON text; NULL for "this-machine" and for a name that is not a preset. */
const char *cluster_preset_text(const char *name);
/* Where `seqpar calibrate --save` writes this machine and the preset "this-machine" reads it:
 * $SEQPAR_THIS_MACHINE, else $XDG_CONFIG_HOME/seqpar/this-machine.json, else
 * $HOME/.config/seqpar/this-machine.json (buf of n bytes). */
const char *cluster_this_machine_path(char *buf, size_t n);
/* A preset by name or a cluster file by path (a preset's name wins; "this-machine" reads the file
 * above): 0, or -1 with one line naming the problem and the fix. */
int cluster_resolve(const char *name_or_path, Cluster *c, SeqErr *e);

/* Single-field overrides from the command line, the same for every command that takes --cluster:
 * --nodes N, --ranks-per-node R, --threads-per-rank T, --device-mem-gib G, --host-mem-gib G,
 * --d2h-gbs X, --device-mem-gbs X, --step-overhead-ms T, --intra-gbs X, --intra-node-gbs X, --intra-latency-us A, --intra-all-to-all
 * switch|shared_memory, --nics-per-node N, --nic-gbs X (per direction), --nic-latency-us B. */
typedef struct {
    int n;
    const char *flag[24], *key[24], *value[24]; /* the flag, the file's key, the flag's value */
} ClusterOverrides;
/* Removes the override flags ("--flag V" or "--flag=V") from argv into o: 0, or -1 with one line (a
 * flag without its value). The help line of the flags: CLUSTER_OVERRIDE_HELP. */
int cluster_take_overrides(int *argc, char **argv, ClusterOverrides *o, SeqErr *e);
/* Applies o to c and checks the result: 0, or -1 with one line naming the flag. */
int cluster_apply_overrides(Cluster *c, const ClusterOverrides *o, SeqErr *e);
#define CLUSTER_OVERRIDE_HELP                                                                                    \
    "  cluster overrides (with --cluster): --nodes N, --ranks-per-node R, --threads-per-rank T,\n"                 \
    "                 --device-mem-gib G, --host-mem-gib G, --d2h-gbs X, --device-mem-gbs X,\n"                     \
    "                 --step-overhead-ms T, --intra-gbs X, --intra-node-gbs X,\n"                                  \
    "                 --intra-peer-gbs X, --intra-latency-us A, --intra-all-to-all switch|shared_memory,\n"      \
    "                 --collectives nccl|direct, --nics-per-node N, --nic-gbs X (per direction),\n"               \
    "                 --nic-latency-us B: each replaces one field of the cluster\n"

/* A NIC's total GB/s per direction while `flows` flows share it: nic_flows at flows, else nic_gbs. */
double cluster_nic_gbs(const Cluster *c, double flows);
/* A curve's value at x (TFLOP/s): linear between the points, constant outside. */
double cluster_curve_at(const ClusterCurve *k, double x);
/* The attention rate in FLOP/s for a block of q_rows x kv_rows on the default curve. */
double cluster_attention_flops_per_s(const Cluster *c, int q_rows, int kv_rows);
/* The attention rate in FLOP/s for a block of `precision`, head_dim, causal or not, q_rows x kv_rows:
 * from the curves of that precision (of that causality where the cluster has one, else the other),
 * interpolated linearly in head dimension between the two nearest curves (the nearest alone outside
 * them) and in rows along each; the default curve where the cluster has none of that precision. */
double cluster_attention_rate(const Cluster *c, int precision, int head_dim, int causal, int q_rows, int kv_rows);
/* The GEMM rate in FLOP/s of an m x k times k x n product in `precision` (at size cbrt(m n k)); 0
 * where the cluster gives no GEMM rate for that precision. */
double cluster_gemm_flops_per_s(const Cluster *c, int precision, double m, double n, double k);
/* Node and NIC of world rank r. */
int cluster_node_of(const Cluster *c, int r);
int cluster_nic_of(const Cluster *c, int r);

#endif
