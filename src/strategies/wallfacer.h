/* WallFacer multi-ring attention (paper 002, §3.2-3.5, Alg. 1-3) as a context schedule: its
 * Communication Configuration Generator, exposed as pure functions (no MPI) so that tests can
 * simulate the routing, and the exact per-rank communication volume. The schedule itself is
 * `wallfacer_schedule` (registry.h); the algorithm is described at the top of wallfacer.c.
 *
 * Names: P context ranks, team size C (C >= 1, C^2 divides P), T = P / C teams of C members,
 * G = P / C^2 (the length of a sub-ring = the number of ring steps), C team groups of G teams
 * (team group of team t: t / G). C = 1 is the plain ring; C = sqrt(P) has no ring steps.
 *
 * Placement of (team t, member m) on context ranks (paper §3.4):
 *   team-first (default): c = t C + m                    a team on consecutive ranks
 *   ring-first:           c = ((t / G) C + m) G + t % G  a sub-ring on consecutive ranks
 * The generator does not depend on it beyond this map. */
#ifndef SEQPAR_WALLFACER_H
#define SEQPAR_WALLFACER_H

#include "parallel/context_schedule.h"

/* One context rank's view of the schedule. Every rank field is a context rank (ctx_comm). */
typedef struct {
    int P, C, G, T;
    int ring_first;           /* 0: team-first, 1: ring-first */
    int rank;                 /* this context rank */
    int team, member, group;  /* group = team / G (the team group of Alg. 2/3) */
    int init_send, init_recv; /* Alg. 2: where this team's kv goes; whose kv arrives here */
    int ring_next, ring_prev; /* Alg. 3: same member of the next / previous team of the group */
} WallfacerRank;

/* 1 when C >= 1 and C^2 divides P. */
int wallfacer_team_valid(int P, int C);
/* Context rank of (team, member) under the placement. */
int wallfacer_ctx_rank(int P, int C, int ring_first, int team, int member);
/* Fills r for context rank `rank`; requires wallfacer_team_valid(P, C). */
void wallfacer_rank_config(int P, int C, int ring_first, int rank, WallfacerRank *r);
/* Forward step s (0 <= s < G): the rank computes (query team r->team, kv team returned). */
int wallfacer_fwd_kv_team(const WallfacerRank *r, int step);
/* Backward: kv stays put (kv team wallfacer_fwd_kv_team(r, 0)); at step s the rank holds the
 * queries (and the dq partial) of the returned team. */
int wallfacer_bwd_q_team(const WallfacerRank *r, int step);

/* Exact bytes and messages this context rank sends per layer (the ranks whose initial send of
 * Alg. 2 targets themselves copy locally and send nothing over COMM_P2P_OUTER). The registry's
 * volume is the maximum over ranks, that of a rank whose initial send leaves it. */
void wallfacer_rank_volume(const StrategyParams *p, int ring_first, int ctx_rank, AttnVolume *v);

#endif
