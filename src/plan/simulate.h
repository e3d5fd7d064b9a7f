/* The step simulator: plays a strategy's schedule (parallel/step_schedule.h, as strategy_play gives
 * it) on a cluster (cluster.h), event by event.
 *
 * Each member begins a step when it ended the previous one: it posts the step's messages (those
 * marked `after` once its blocks are done), computes its blocks one after another at the rate their
 * shape gets (plus the cluster's merge of each block's result into its accumulators, a pass over
 * device memory, where the cluster counts one), and ends the step when its blocks are done and every message it sends or receives
 * that is due by then (posted steps - 1 steps before) has arrived, as MPI's waits do. A message
 * starts after its link's latency and then shares bandwidth with every transfer in flight at the
 * same time, max-min fairly: a transfer between nodes goes through the sender's NIC and the
 * receiver's NIC (rank i of a node uses NIC i * nics / ranks_per_node), one inside a node through
 * the two ranks' ports and, where the node has one, its shared medium. Nothing else (no MPI
 * protocol, no GEMMs: the schedule is one layer's attention). simulate_collective times the
 * collectives outside attention the same cluster carries. */
#ifndef SEQPAR_SIMULATE_H
#define SEQPAR_SIMULATE_H

#include "parallel/step_schedule.h"
#include "plan/cluster.h"

typedef struct {
    double compute_s;   /* its blocks */
    double wait_s;      /* exposed: step ends after its blocks were done, summed */
    double end_s;       /* when it ended its last step */
    double bytes_intra, bytes_inter; /* sent, inside its node and to other nodes */
} MemberSim;

typedef struct {
    int members;
    MemberSim *m;       /* (members) */
    double end_s;       /* the last member's end */
    int slowest;        /* that member */
} ScheduleSim;

/* Plays sc with member i on world rank rank_of[i] of cluster c (ranks inside c's nodes x
 * ranks_per_node), head_dim for the blocks' FLOPs (4 pairs heads head_dim a forward block: the
 * visible (query, key) pairs, as attention rates are quoted; times the cluster's backward factor
 * in a backward schedule) at the cluster's rate for the precision (PRECISION_*), the head dim, the
 * block's shape and whether it is masked (fewer visible pairs than the cells of its kernel calls:
 * the causal curve; a block of whole visible rectangles: the full curve at the rectangle's shorter
 * side) (cluster_attention_rate), plus attn_merge_bytes an element of the block's output rows
 * (forward) or of its dq, dk and dv rows (backward) at device_mem_gbs. 0, or -1 with one line (a rank outside the
 * cluster, a schedule that cannot finish). Free out with schedule_sim_free. */
int simulate_schedule(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision,
                      ScheduleSim *out, SeqErr *e);
/* The same with `replicas` copies of sc played at once (the data-parallel replicas that share nodes
 * with the first: their transfers share its NICs and media): copy r's member i on world rank
 * rank_of[r * sc->members + i]; out has replicas x members members in that order. */
int simulate_schedule_replicas(const StepSchedule *sc, int replicas, const Cluster *c, const int *rank_of, int head_dim,
                               int precision, ScheduleSim *out, SeqErr *e);
void schedule_sim_free(ScheduleSim *s);
/* Without playing the events: each member's time in its blocks (compute_s, equal to
 * simulate_schedule's) and a lower bound on when it ends (end_lb, at most simulate_schedule's end_s,
 * up to the rounding of a sum, relative 1e-9 at most, where the bound is a transfer time): the sum of its steps'
 * blocks, and its own transfers' bytes through each resource only it holds of theirs (its NIC's egress and
 * ingress, its port out and in, its node's medium) at that resource's bandwidth after a latency.
 * Also a lower bound with other copies sharing its NICs (simulate_schedule_replicas: they only slow it).
 * For the planner to skip the configurations that cannot rank high enough to be played (planner.h). 0, or -1 with
 * one line (a member outside the cluster). */
int simulate_schedule_bound(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision,
                            double *end_lb, double *compute_s, SeqErr *e);
/* The same bound, of the same figures, from a schedule in parts (registry.h's SchedulePlayParts,
 * without the schedule put together): `exchange` on the whole grid (hp x cp members: the head
 * exchange's messages, no blocks) and head member h's lane lanes[lane_of[h]] (hp 1, cp members:
 * its member i is member i hp + h of the whole), each lane's blocks summed once however many head
 * members run it. lanes NULL: exchange is the whole schedule (simulate_schedule_bound). */
int simulate_lanes_bound(const StepSchedule *exchange, const StepSchedule *lanes, const int *lane_of, const Cluster *c,
                         const int *rank_of, int head_dim, int precision, double *end_lb, double *compute_s, SeqErr *e);

/* A tighter lower bound of each member's end (end_lb, at most simulate_schedule's end_s up to the
 * rounding of sums, relative 1e-9): step by step, a member ends a step no sooner than its blocks
 * after the step's lower-bound start, and no sooner than the transfers it sends or receives that
 * are due then: each after its sender may post it (the sender's lower-bound start, or that plus
 * its blocks for a result) and its latency, alone at the slowest rate it crosses, and those due in
 * the step it was posted through one resource of the member's (its NIC's egress or ingress, its
 * port out or in, its node's medium) together at that resource's rate after the first of them may
 * move. Also a lower bound with other copies sharing its NICs. 0, or -1 with one line (a member
 * outside the cluster). */
int simulate_schedule_step_bound(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim,
                                 int precision, double *end_lb, SeqErr *e);

/* A simulated trace: each member's blocks (named by their step) and exposed waits, step by step. */
typedef struct {
    int member;
    const char *name;  /* the step's (static) or "wait" */
    int wait;
    double t0, t1;     /* seconds */
} SimEvent;
typedef struct {
    SimEvent *ev;
    int n, cap;
} SimTrace;
/* simulate_schedule recording every member's blocks and waits into *trace (free with sim_trace_free). */
int simulate_schedule_trace(const StepSchedule *sc, const Cluster *c, const int *rank_of, int head_dim, int precision,
                            SimTrace *trace, ScheduleSim *out, SeqErr *e);
/* Writes the trace as Chrome trace-event JSON in `seqpar train --trace`'s format (parallel/trace.h:
 * "X" events of category compute or wait, microseconds, tid the member's world rank rank_of[m],
 * a "rank r" name each), atomically, so that a simulated and a measured step open side by side: 0,
 * or -1 with one line. */
int sim_trace_write(const SimTrace *trace, const int *rank_of, int members, const char *path, SeqErr *e);
void sim_trace_free(SimTrace *trace);

/* Collectives as the cluster's algorithm plays them (its "collectives"), for the parts of a step outside
 * attention (the gradient reduction, ZeRO's reduce-scatters and gathers). A group's ring visits each
 * of its nodes once (NCCL orders the ring by topology), so every byte crosses each node boundary of
 * the ring once per direction, over all of the node's NICs (one channel a NIC), whichever of its
 * ranks are members. Each member sends (n - 1) / n of the buffer (an all-gather's output, a
 * reduce-scatter's input; twice for an all-reduce) at the ring's bandwidth: the slowest of its
 * hops, that is a rank's port inside a node (intra_gbs; the shared medium's share where the node has
 * one) and, for a ring over several nodes, each node's NICs divided among the concurrent rings that
 * cross that node. Each collective pays (n - 1) hops of latency (2 (n - 1) for an all-reduce), the
 * NIC's where the ring crosses nodes. That is NCCL's ring ("nccl"). Under "direct" (seqpar's CPU
 * collectives, parallel/comm.h: each member sends its share straight to every other member) the
 * ports inside a node carry the same (n - 1) / n, but a node's NICs carry every byte its members send
 * to members on other nodes: on x (n - on) / n of the buffer for a node with `on` of the n members
 * (a ring over those nodes: (n - 1) / n); latency as the ring's. Concurrent groups: member i of
 * group g is world rank g * group_step + i * stride. */
typedef enum { COLLECTIVE_ALLGATHER, COLLECTIVE_REDUCE_SCATTER, COLLECTIVE_ALLREDUCE } CollectiveKind;
typedef struct {
    int groups, size;
    long group_step, stride;
} CollectiveGroups;
typedef struct {
    double seconds;    /* the slowest group's */
    double gbs;        /* that ring's bandwidth, GB/s a member */
    int across;        /* that ring crosses nodes */
} CollectiveSim;
/* `bytes` of one member's buffer in `count` collectives one after another (their latencies add up,
 * their bytes share the bandwidth term). 0, or -1 with one line (a member outside the cluster). */
int simulate_collective(const Cluster *c, CollectiveKind kind, double bytes, double count, const CollectiveGroups *g,
                        CollectiveSim *out, SeqErr *e);

#endif
