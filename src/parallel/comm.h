/* The communication layer every seqpar strategy goes through: thin wrappers over the MPI calls
 * we use (nonblocking point-to-point, all-to-all, all-reduce, reduce-scatter, all-gather), each
 * tagged with a CommKind, that keep per-rank statistics and an optional Chrome trace.
 *
 * Statistics, per kind, for THIS rank:
 *   - bytes SENT to other ranks, split into intra-node and inter-node by the node of the peer's
 *     world rank (topology_node_of); bytes a rank "sends" to itself are never counted;
 *   - messages: number of point-to-point sends, or number of peers a collective sends to;
 *   - wait time: seconds blocked inside a wait or a collective (communication NOT hidden by
 *     compute), plus the short MPI_Testall calls made between compute pieces to progress
 *     transfers.
 * Plus the compute time a strategy records with comm_compute_begin/comm_compute_end, and
 * "meta" bytes: small control data (token positions) that a strategy exchanges outside the
 * data volumes of the paper's formulas, counted apart so that nothing is hidden.
 *
 * Byte accounting of collectives follows the direct model (each rank sends each peer that
 * peer's share), which is also the bandwidth-optimal volume of ring algorithms:
 *   alltoall:            bytes_per_peer to each other member             -> (P-1) x bytes_per_peer
 *   allreduce:           count split in P near-equal parts c_0..c_{P-1}; to peer p: c_p (its
 *                        reduce-scatter share) + c_me (the all-gather of mine) -> about 2(P-1)/P x size
 *   reduce_scatter(_block): to peer p its block recvcounts[p]          -> total - own block
 *   allgatherv:          own block to each other member               -> (P-1) x own block
 * The true bytes of Open MPI's chosen algorithm may differ; the model is what the formulas of
 * the papers count.
 *
 * Peers are addressed by their rank in the given communicator; the world rank (for the node) is
 * found with MPI_Group_translate_ranks once per communicator and cached on the communicator as
 * an MPI attribute (freed with it).
 *
 * Counts. Every count here is a size_t: no message, block or vector length is limited by MPI's
 * int counts. A call whose counts and displacements fit in one MPI call's ints (at most INT_MAX
 * elements) is that MPI call; past that, a message or an equal-sized block travels as one element
 * of a derived datatype of its bytes (chunks of at most INT_MAX bytes and the rest), and the
 * collectives with per-rank counts (all-gatherv, gatherv, all-to-allv) run over point-to-point
 * messages of at most COMM_RS_PIECE elements, as the reduce-scatter and the own allreduce always
 * do. None of this adds, moves or reorders an arithmetic operation: every result is the same bits
 * whichever way it travelled. The environment variable SEQPAR_COMM_PIECE=N (or comm_set_piece)
 * lowers every one of those limits to N elements (tests: the splitting paths run at small
 * counts, every boundary included; a user has no reason to set it).
 *
 * Every MPI return code is checked: a failure dies naming the call, the communicator size, the
 * peer and the byte count. A Comm is used from one thread. Nothing is global: the context is
 * passed explicitly.
 *
 * Watchdog. Every wait has a deadline: collectives are posted as their nonblocking forms
 * (MPI_Ialltoall, MPI_Iallreduce, ...) and completed, like point-to-point waits, by a loop of
 * MPI_Testall that spins for WAIT_SPIN_S and then sleeps between tests (nanosleep, growing with
 * the time already waited, at most 1 ms, so a long wait leaves the core to the ranks that share
 * it: core/common.h's wait_until). When one wait has lasted timeout_s seconds (comm_set_timeout; 0 waits forever), the rank
 * prints ONE line on stderr naming the operation, its kind, the peers (world ranks) or group it
 * waited on and the step and phase the caller set with comm_set_step, waits a short grace
 * (min(5 s, timeout / 2): the other ranks that still run print their own line meanwhile), and
 * ends the whole job with MPI_Abort(world, COMM_WATCHDOG_EXIT). Time during which this process
 * itself did not run (a gap of over 1 s between two tests: it was stopped or suspended) does not
 * count against the deadline. A timed-out MPI request cannot be
 * cancelled (collectives never can), so ending the job is the only safe outcome; the ranks that
 * print no such line are the ones stopped, dead or cut off (or whose output cannot reach mpirun). */
#ifndef SEQPAR_COMM_H
#define SEQPAR_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "parallel/topology.h"
#include "core/common.h"

typedef enum {
    COMM_ALLTOALL,     /* SeqAlltoAll of head-parallel attention */
    COMM_P2P_INNER,    /* ring transfers inside an inner ring (the plain ring when W = cp) */
    COMM_P2P_OUTER,    /* transfers between inner rings of a double ring, or between teams */
    COMM_TEAM,         /* all-gather / reduce-scatter of attention data inside a context team */
    COMM_GRAD_REDUCE,  /* gradient all-reduce / reduce-scatter over data-parallel replicas */
    COMM_PARAM_GATHER, /* ZeRO parameter all-gather */
    COMM_KINDS
} CommKind;

const char *comm_kind_name(CommKind k); /* "alltoall", "p2p_inner", ... */

typedef struct {
    uint64_t bytes_intra[COMM_KINDS]; /* sent to peers on this rank's node */
    uint64_t bytes_inter[COMM_KINDS]; /* sent to peers on other nodes */
    uint64_t messages[COMM_KINDS];
    double wait_s[COMM_KINDS];        /* blocked in waits / collectives / progress tests */
    double compute_s;                 /* recorded by the strategy (wall clock) */
    double compute_cpu_s;             /* process CPU time inside those sections: unlike the wall
                                         clock, not inflated when other processes share the cores */
    uint64_t meta_bytes;              /* control data outside the kinds (see above) */
    double meta_wait_s;               /* blocked in those exchanges (e.g. the positions' all-gather) */
} CommStats;

typedef struct CommTrace CommTrace; /* trace.h */

/* Exit status of a job ended by the watchdog (mpirun returns it), distinct from the status 1
 * of other errors so that a job script can tell a hang (e.g. requeue elsewhere) from a bad
 * input. */
#define COMM_WATCHDOG_EXIT SEQPAR_WATCHDOG_EXIT /* 3 (common.h) */
#define COMM_DEFAULT_TIMEOUT_S 300.0
/* The first step, checkpoint saves and loads and everything before step 1 may take this many
 * times the deadline (connection set-up, first touch of all memory, rank 0 writing alone). */
#define COMM_SLOW_PHASE_FACTOR 4
#define COMM_POSTED 64    /* point-to-point requests remembered for the watchdog's message */

typedef struct {
    MPI_Request req;  /* the handle as posted (handles are reused: the newest entry wins) */
    int world_peer;
    int is_send;
    CommKind kind;
    size_t bytes;
} CommPosted;

/* How fp32 values travel (comm_isend_floats and friends): as they are, or rounded to bf16 (two
 * bytes an element; round to nearest even, kernels/bf16.h) and widened again on arrival. */
typedef enum { COMM_WIRE_FP32 = 0, COMM_WIRE_BF16 = 1 } CommWire;

/* A bf16 transfer in flight: its staging buffer (kept for reuse once done) and, for a receive,
 * where the widened values go when the request completes. */
typedef struct {
    MPI_Request *req; /* the caller's handle (NULL: the slot is free) */
    void *stage;      /* bf16 elements, cap of them */
    size_t cap;
    float *dst;       /* receive: widened into dst[0 .. count) on completion; send: NULL */
    size_t count;
} CommWireSlot;

typedef struct {
    const Topology *topo;
    CommStats stats;
    CommTrace *trace; /* NULL: tracing off (then it costs one pointer test per call) */
    int keyval;       /* MPI attribute key caching each communicator's world ranks */
    double cpu_t0;    /* process CPU clock at the open compute section (sections do not nest) */
    double timeout_s; /* watchdog deadline of one wait, seconds; 0: wait forever */
    long step;        /* the caller's training step, for the watchdog's message (0: before step 1) */
    const char *phase;/* what the caller is doing ("train", "eval", "save", ...): a string literal */
    CommPosted posted[COMM_POSTED]; /* ring of recent isend/irecv requests */
    int posted_next;
    CommWireSlot *wire; /* bf16 transfers: slots in flight and idle staging buffers */
    int n_wire;
    size_t piece;       /* 0, or the most elements of one message or MPI call (comm_set_piece) */
} Comm;

/* Creates the context. trace_path non-NULL turns tracing on (written by comm_destroy).
 * Collective over the topology's world communicator (one barrier to align trace clocks). */
Comm *comm_create(const Topology *t, const char *trace_path);
/* Writes the trace if tracing is on (collective over world then) and frees the context. Returns
 * 0, or -1 with a one-line message (on rank 0) when the trace file could not be written. */
int comm_destroy(Comm *c, SeqErr *e);

/* The most elements any one message or MPI call carries from now on (0: the defaults: INT_MAX
 * elements an MPI call, COMM_RS_PIECE / COMM_AR_PIECE floats a piece of the reduce-scatter and of
 * the allreduce; a smaller n lowers each of them to n). Every rank of a communicator must use the
 * same value. comm_create takes it from SEQPAR_COMM_PIECE (a positive count) when that is set.
 * For tests: results are the same bits under any value. */
void comm_set_piece(Comm *c, size_t n);
/* Checks SEQPAR_COMM_PIECE before MPI starts: 0, or 1 with a one-line message in err. */
int comm_env_check(char *err, size_t n);

/* Watchdog deadline of every later wait, in seconds (0: wait forever). comm_create sets
 * COMM_DEFAULT_TIMEOUT_S. */
void comm_set_timeout(Comm *c, double seconds);
/* Tells the watchdog what the caller is doing: training step (0: before step 1) and a phase
 * (string literal such as "train", "eval", "save"), both named in its message. */
void comm_set_step(Comm *c, long step, const char *phase);

/* The setup's guard. MPI_Init (which under mpirun waits for every rank to start) and the
 * communicators' creation (MPI_Comm_split, MPI_Comm_split_type, ...) and agreement
 * (MPI_Allreduce) are blocking calls made before any Comm exists, where the watchdog above cannot
 * reach. comm_guard_begin arms a deadline `timeout_s` from now (0: none) over what the
 * process does until comm_guard_end; a helper thread waits for it, and if it passes first, prints
 * ONE line on stderr ("seqpar: error: watchdog: rank R before step 1 (setup): WHAT is not
 * complete after T s: ...") and ends the process with _exit(COMM_WATCHDOG_EXIT) (a thread
 * other than the one in MPI cannot call MPI_Abort; mpirun ends the other ranks when one exits
 * so). One guard per process, armed by one thread at a time. */
void comm_guard_begin(int world_rank, const char *what, double timeout_s);
void comm_guard_end(void);

/* The world size a launcher announces before MPI starts, and this process's rank (-1 if unsaid):
 * Open MPI's mpirun (OMPI_COMM_WORLD_SIZE / _RANK), a PMI launcher such as `srun --mpi=pmi2`
 * (PMI_SIZE / PMI_RANK), or srun itself (SLURM_STEP_NUM_TASKS / SLURM_PROCID, set for every task
 * it starts, `--mpi=pmix` included, which announces no size of its own). 0 when none does: the
 * process was started by hand. */
int comm_launched_world(int *rank);

/* Total bytes of a kind (intra + inter). */
uint64_t comm_stats_bytes(const CommStats *s, CommKind k);
void comm_stats_reset(Comm *c);
/* Per-rank lines (bytes by kind with intra/inter split, messages, wait, compute, exposed comm),
 * then one line per rank "bytes rank R: KIND N ..." with the exact byte count of every kind:
 * rank 0 gathers every rank's stats and prints them in rank order to f. Collective over world;
 * f is only used on rank 0. */
void comm_stats_print(Comm *c, FILE *f);
/* Sum of wait_s over all kinds: communication time not hidden by compute. */
double comm_stats_exposed(const CommStats *s);

/* World rank of member `rank` of communicator mc (cached per communicator). */
int comm_world_rank_of(Comm *c, MPI_Comm mc, int rank);

/* Compute timing: t0 = comm_compute_begin(c); ...; comm_compute_end(c, "attn fwd", t0). The name
 * must be a string literal or otherwise outlive the call only until it returns (it is copied). */
double comm_compute_begin(Comm *c);
void comm_compute_end(Comm *c, const char *name, double t0);

/* Nonblocking point-to-point; bytes are counted when posted (sends only). */
void comm_isend(Comm *c, CommKind k, const void *buf, size_t bytes, int peer, int tag, MPI_Comm mc,
                MPI_Request *req);
void comm_irecv(Comm *c, CommKind k, void *buf, size_t bytes, int peer, int tag, MPI_Comm mc,
                MPI_Request *req);
/* fp32 values on a wire (CommWire): COMM_WIRE_FP32 is comm_isend / comm_irecv of 4 count bytes;
 * COMM_WIRE_BF16 sends 2 count bytes (counted so) from a staging buffer the values were rounded
 * into, and a receive is widened into buf when its request completes in comm_waitall or
 * comm_testall (every wait on such a request must go through them). For values that are bf16
 * already (q, k, v, dout under --precision bf16) the bf16 wire is exact: half the bytes, the same
 * bits. Staging buffers are kept for reuse until comm_destroy. */
void comm_isend_floats(Comm *c, CommKind k, const float *buf, size_t count, CommWire w, int peer, int tag,
                       MPI_Comm mc, MPI_Request *req);
void comm_irecv_floats(Comm *c, CommKind k, float *buf, size_t count, CommWire w, int peer, int tag, MPI_Comm mc,
                       MPI_Request *req);
/* Waits for n requests (MPI_REQUEST_NULL entries allowed); the blocked time goes to kind k. */
void comm_waitall(Comm *c, CommKind k, int n, MPI_Request *reqs);
/* One MPI_Testall (progresses transfers); returns 1 when all n are complete. Time goes to k. */
int comm_testall(Comm *c, CommKind k, int n, MPI_Request *reqs);

/* Collectives (blocking; their whole time counts as wait time of kind k). */
void comm_alltoall(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t bytes_per_peer,
                   MPI_Comm mc);
/* All-to-all with per-peer counts and displacements in elements of dt (sendcounts[p] to peer p).
 * most: a bound, the same on every rank of mc, on every count and displacement + count any rank of
 * mc passes (a rank cannot see the others' counts, and all must take the same path: one
 * MPI_Ialltoallv when most fits MPI's int, else messages in pieces). */
void comm_alltoallv(Comm *c, CommKind k, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                    void *recvbuf, const size_t *recvcounts, const size_t *rdispls, MPI_Datatype dt, size_t most,
                    MPI_Comm mc);
/* Sums of at least COMM_ALLREDUCE_OWN_MIN floats (MPI_FLOAT, MPI_SUM) on more than one rank are
 * seqpar's own: the reduce-scatter below into near-equal blocks, each summed in its own place of
 * recvbuf (sendbuf copied there first unless MPI_IN_PLACE) with one message of scratch (at most
 * COMM_AR_PIECE floats, tracked), then an all-gather in messages of at most COMM_RS_PIECE floats;
 * every rank gets the same bits, and no MPI count limits the length (past 2^31 floats too).
 * (Open MPI 4.1's MPI_Iallreduce in place runs a binomial reduce to rank 0 and a broadcast from it,
 * with a temporary of the whole vector on every rank.) Anything else goes to MPI_Iallreduce, in
 * runs of at most INT_MAX elements (the ops are elementwise: the same results). */
#define COMM_ALLREDUCE_OWN_MIN ((size_t)16384)
#define COMM_AR_PIECE ((size_t)1 << 16) /* floats a message there, and of the scratch: 256 KiB */
void comm_allreduce(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t count,
                    MPI_Datatype dt, MPI_Op op, MPI_Comm mc);
/* All-gather of per-rank blocks (MPI_Allgatherv semantics, MPI_IN_PLACE allowed; counts and
 * displacements in elements of dt, the same arrays on every rank). */
void comm_allgatherv(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf,
                     const size_t *recvcounts, const size_t *displs, MPI_Datatype dt, MPI_Comm mc);
/* Reduce-scatter of floats (sum), run by seqpar over point-to-point messages rather than
 * MPI_Ireduce_scatter: Open MPI 4's nonblocking one (libnbc) reduces the WHOLE vector to rank 0
 * along a binomial tree, in temporaries of one to two times its size on rank 0 and on the tree's
 * inner ranks, and then scatters it from rank 0, so that rank 0 held up to twice a unit's
 * gradient more than the others and moved every byte of it. Here each rank sends each peer that
 * peer's block (the direct model the byte counts always followed) in messages of at most
 * COMM_RS_PIECE floats, and every rank sums its own block without any temporary: its own
 * contribution is copied into recvbuf, then the peers' contributions land, one message at a
 * time, in the OWN BLOCK OF SENDBUF (which is never sent: its contents are undefined afterwards)
 * and are added in a fixed order, peers me+1, me+2, ... me-1 (mod P), so that at each moment the
 * ranks read from different peers. The sum is the same bit for bit on every run with the same
 * layout; for two ranks it is MPI's (a + b = b + a).
 * A reduce-scatter in flight is progressed by comm_rs_test (each call sums every message that has
 * arrived) and completed by comm_rs_wait under the watchdog's deadline; several may be in flight
 * on one communicator when each has its own tag (0 .. COMM_RS_TAGS - 2; the blocking forms use
 * COMM_RS_TAGS - 1; every rank of mc posts the same reduce-scatters in the same order, as for any
 * collective). sendbuf must not be touched and recvbuf not be read until it completes. Bytes are
 * counted when posted (to peer p its block). */
#define COMM_RS_PIECE ((size_t)1 << 20) /* floats per message: 4 MiB */
#define COMM_RS_TAGS 1024
typedef struct {
    MPI_Comm mc;
    int n, me, tag, active;
    float *land;          /* the own block of sendbuf: where the peers' messages land */
    float *scratch;       /* or here, one message at a time (comm_allreduce's in-place sums) */
    float *dst;           /* this rank's block of the sum */
    size_t own;           /* floats of this rank's block */
    size_t piece;         /* floats a message: COMM_RS_PIECE, or COMM_AR_PIECE for comm_allreduce */
    size_t n_steps, step; /* messages to receive ((P - 1) x pieces, peer-major); summed so far */
    int recv_posted;      /* step's receive is posted in recv */
    MPI_Request recv;
    MPI_Request *sends;   /* every piece to every peer */
    int n_sends;
} CommReduceScatter;
/* Posts the reduce-scatter of src (recvcounts[p] floats to rank p of mc, blocks in rank order)
 * into recv (recvcounts[me] floats). rs must not be in flight. */
void comm_rs_post(Comm *c, CommKind k, CommReduceScatter *rs, float *src, float *recv, const size_t *recvcounts,
                  MPI_Comm mc, int tag);
/* Progresses the n reduce-scatters (those not in flight are skipped); returns 1 when none is left
 * in flight. Time goes to k. */
int comm_rs_test(Comm *c, CommKind k, int n, CommReduceScatter *rs);
/* Completes the n reduce-scatters under the watchdog's deadline; time goes to k. */
void comm_rs_wait(Comm *c, CommKind k, int n, CommReduceScatter *rs);
static inline int comm_rs_active(const CommReduceScatter *rs) { return rs->active; }
/* Blocking forms: recvcounts per rank, or recvcount floats for every rank. */
void comm_reduce_scatter(Comm *c, CommKind k, float *sendbuf, float *recvbuf, const size_t *recvcounts, MPI_Comm mc);
void comm_reduce_scatter_block(Comm *c, CommKind k, float *sendbuf, float *recvbuf, size_t recvcount, MPI_Comm mc);
/* Nonblocking comm_allgatherv, counted when posted as comm_allgatherv counts it: one
 * MPI_Iallgatherv, or (past MPI's int counts) its messages in pieces; progress it with
 * comm_gather_test and complete it with comm_gather_wait. recvbuf must not be read and sendbuf not
 * change until it completes. Several may be in flight on one communicator when every rank posts
 * them in the same order. */
typedef struct {
    MPI_Comm mc;
    MPI_Request *reqs; /* NULL: not in flight */
    int n;
    int *ints;         /* the MPI call's counts and displacements, kept until it completes */
} CommGather;
void comm_iallgatherv(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf,
                      const size_t *recvcounts, const size_t *displs, MPI_Datatype dt, MPI_Comm mc, CommGather *ag);
/* One test of the n gathers (those not in flight are skipped): 1 when none is left in flight. */
int comm_gather_test(Comm *c, CommKind k, int n, CommGather *ag);
/* Completes the n gathers under the watchdog's deadline. */
void comm_gather_wait(Comm *c, CommKind k, int n, CommGather *ag);
static inline int comm_gather_active(const CommGather *ag) { return ag->reqs != NULL; }
/* All-gather of equal blocks of bytes_per_rank (own block to each other member). */
void comm_allgather(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, MPI_Comm mc);
/* comm_allgather of count floats per rank on a wire (see comm_isend_floats). */
void comm_allgather_floats(Comm *c, CommKind k, const float *sendbuf, float *recvbuf, size_t count_per_rank,
                           CommWire w, MPI_Comm mc);
/* Plain all-gather of small control data; its bytes go to meta_bytes, its time to meta_wait_s (k names
 * the exchange to the watchdog). */
void comm_allgather_meta(Comm *c, CommKind k, const void *sendbuf, void *recvbuf, size_t bytes,
                         MPI_Comm mc);
/* Gather to `root` (MPI_Gatherv semantics; recvcounts/displs used on the root only): each
 * non-root member sends its block to the root, counted as one message of kind k. It runs over
 * point-to-point messages of at most COMM_RS_PIECE elements (the other ranks do not know the
 * root's counts, so no rank could choose another path alone), received straight into place. */
void comm_gatherv(Comm *c, CommKind k, const void *sendbuf, size_t sendcount, void *recvbuf,
                  const size_t *recvcounts, const size_t *displs, MPI_Datatype dt, int root, MPI_Comm mc);

/* Control traffic: a few values per step (loss sums, step times, stop flags, evaluation counts)
 * and barriers. Under the watchdog like everything else, but counted in no statistics (outside
 * the formulas the statistics check). `what` names it in the watchdog's message. */
void comm_control_allreduce(Comm *c, const char *what, void *buf, size_t count, MPI_Datatype dt, MPI_Op op,
                            MPI_Comm mc); /* in place */
void comm_control_barrier(Comm *c, const char *what, MPI_Comm mc);
void comm_control_bcast(Comm *c, const char *what, void *buf, size_t bytes, int root, MPI_Comm mc);

#endif
