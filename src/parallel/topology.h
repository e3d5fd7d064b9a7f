/* The process grid: world = dp x hp x cp ranks. dp replicas train different sequences; inside a
 * replica the sp = hp x cp ranks split one sequence, hp along attention heads (all-to-all inside
 * a head group) and cp along the sequence (ring inside a context group, optionally as a double
 * ring of inner rings of W members). Placement decides which group gets consecutive world ranks
 * (and so shares a node): head-first puts head groups together, context-first context groups.
 * All communicators are made once here and passed explicitly; nothing is global. */
#ifndef SEQPAR_TOPOLOGY_H
#define SEQPAR_TOPOLOGY_H

#include <mpi.h>

/* team-first / ring-first: the two placements of a context group of teams (paper 002 §3.4: its
 * teams, or its sub-rings, on consecutive context ranks). For the dp x hp x cp
 * grid they behave exactly like head-first; other schedules ignore the difference. */
typedef enum {
    PLACEMENT_HEAD_FIRST = 0,
    PLACEMENT_CONTEXT_FIRST = 1,
    PLACEMENT_TEAM_FIRST = 2,
    PLACEMENT_RING_FIRST = 3
} Placement;

typedef struct {
    int dp, hp, cp, sp;   /* sizes; sp = hp * cp; world = dp * sp */
    int ring_inner;       /* W: members of an inner ring; divides cp (W = cp: plain ring) */
    Placement placement;
    int ranks_per_node;   /* for intra/inter-node accounting (MPI_COMM_TYPE_SHARED or flag) */

    int world_rank, world_size;
    int dp_rank;          /* which replica: 0..dp-1 */
    int hp_rank;          /* h: position in the head group: 0..hp-1 */
    int cp_rank;          /* c: position in the context group (ring order): 0..cp-1 */
    int sp_rank;          /* c * hp + h: canonical rank inside the replica (data layout order) */
    int inner_rank;       /* c % W */
    int outer_rank;       /* c / W */

    MPI_Comm world;       /* MPI_COMM_WORLD (not owned) */
    MPI_Comm dp_comm;     /* same (h, c), different replicas; ordered by dp_rank */
    MPI_Comm sp_comm;     /* one replica; ordered by sp_rank */
    MPI_Comm head_comm;   /* same (dp, c); ordered by h */
    MPI_Comm ctx_comm;    /* same (dp, h); ordered by c */
    MPI_Comm inner_comm;  /* same (dp, h, c / W); ordered by c % W */
    MPI_Comm outer_comm;  /* same (dp, h, c % W); ordered by c / W */
} Topology;

/* World rank of the member (dp_rank, h, c) under the placement:
 *   head-first (and team-first, ring-first): dp_rank * sp + c * hp + h
 *   context-first: dp_rank * sp + h * cp + c */
int topology_world_rank_of(const Topology *t, int dp_rank, int h, int c);
/* The same for a grid of hp x cp under placement pl, without a Topology (the planner's). */
int placement_world_rank(Placement pl, int hp, int cp, int dp_rank, int h, int c);
/* Node of a world rank: world_rank / ranks_per_node. */
int topology_node_of(const Topology *t, int world_rank);

/* Builds the grid on MPI_COMM_WORLD. Checks (same one-line error on every rank, exit 1, no
 * hang): dp * hp * cp equals the number of ranks; W divides cp; ranks_per_node >= 1.
 * ranks_per_node <= 0 means: take it from MPI_COMM_TYPE_SHARED. */
void topology_create(Topology *t, int dp, int hp, int cp, int ring_inner, Placement placement,
                     int ranks_per_node);
void topology_free(Topology *t);

/* "head-first" / "context-first" / "team-first" / "ring-first"; dies naming the value and the
 * choices otherwise. */
Placement placement_parse(const char *s);
const char *placement_name(Placement p);

#endif
