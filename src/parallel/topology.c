/* The dp x hp x cp process grid and its communicators: see topology.h. */
#include "parallel/topology.h"

#include <string.h>

#include "core/common.h"

Placement placement_parse(const char *s) {
    if (!strcmp(s, "head-first")) return PLACEMENT_HEAD_FIRST;
    if (!strcmp(s, "context-first")) return PLACEMENT_CONTEXT_FIRST;
    if (!strcmp(s, "team-first")) return PLACEMENT_TEAM_FIRST;
    if (!strcmp(s, "ring-first")) return PLACEMENT_RING_FIRST;
    die_collective("unknown placement '%s': use head-first, context-first, team-first or ring-first", s);
}

const char *placement_name(Placement p) {
    switch (p) {
    case PLACEMENT_CONTEXT_FIRST: return "context-first";
    case PLACEMENT_TEAM_FIRST: return "team-first";
    case PLACEMENT_RING_FIRST: return "ring-first";
    default: return "head-first";
    }
}

int placement_world_rank(Placement pl, int hp, int cp, int dp_rank, int h, int c) {
    if (pl != PLACEMENT_CONTEXT_FIRST) return dp_rank * hp * cp + c * hp + h;
    return dp_rank * hp * cp + h * cp + c;
}

int topology_world_rank_of(const Topology *t, int dp_rank, int h, int c) {
    return placement_world_rank(t->placement, t->hp, t->cp, dp_rank, h, c);
}

int topology_node_of(const Topology *t, int world_rank) { return world_rank / t->ranks_per_node; }

static MPI_Comm split(MPI_Comm parent, int color, int key) {
    MPI_Comm c;
    if (MPI_Comm_split(parent, color, key, &c) != MPI_SUCCESS) die("MPI_Comm_split failed");
    return c;
}

void topology_create(Topology *t, int dp, int hp, int cp, int ring_inner, Placement placement, int ranks_per_node) {
    memset(t, 0, sizeof *t);
    t->world = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &t->world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &t->world_size);
    if (dp < 1 || hp < 1 || cp < 1)
        die_collective("--dp, --hp and --cp must be at least 1 (got %d, %d, %d)", dp, hp, cp);
    if ((long)dp * hp * cp != t->world_size) { /* the ways to agree: another --dp, another --cp, other ranks */
        const long grid = (long)dp * hp * cp, W = t->world_size;
        const char *s = grid == 1 ? "" : "s";
        char fix[256];
        int n = 0;
        if (W % ((long)hp * cp) == 0) n += snprintf(fix + n, sizeof fix - n, "give --dp %ld (or drop it), ", W / ((long)hp * cp));
        if (W % ((long)dp * hp) == 0 && W / ((long)dp * hp) != cp)
            n += snprintf(fix + n, sizeof fix - n, "%s--cp %ld to split each sequence over the ranks, ", n ? "" : "give ",
                          W / ((long)dp * hp));
        if (n) snprintf(fix + n, sizeof fix - n, "or start %ld rank%s (mpirun -np %ld)", grid, s, grid);
        else snprintf(fix, sizeof fix, "start %ld rank%s (mpirun -np %ld), or give an --hp x --cp that divides %ld", grid, s, grid, W);
        die_collective("--dp %d x --hp %d x --cp %d = %ld rank%s, but %ld were started: %s", dp, hp, cp, grid, s, W, fix);
    }
    if (ring_inner <= 0) ring_inner = cp;
    if (cp % ring_inner != 0)
        die_collective("--ring-inner %d does not divide --cp %d: pick an inner ring size that divides the context "
                       "group (W = cp is the plain ring)", ring_inner, cp);
    t->dp = dp;
    t->hp = hp;
    t->cp = cp;
    t->sp = hp * cp;
    t->ring_inner = ring_inner;
    t->placement = placement;
    if (ranks_per_node <= 0) {
        MPI_Comm shared;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, t->world_rank, MPI_INFO_NULL, &shared);
        int local = 1;
        MPI_Comm_size(shared, &local);
        MPI_Comm_free(&shared);
        /* the smallest node size, so every rank agrees */
        MPI_Allreduce(&local, &ranks_per_node, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    }
    t->ranks_per_node = ranks_per_node;

    /* this rank's coordinates: invert topology_world_rank_of */
    int r = t->world_rank;
    t->dp_rank = r / t->sp;
    int within = r % t->sp;
    if (placement != PLACEMENT_CONTEXT_FIRST) { /* head-first, team-first, ring-first */
        t->cp_rank = within / hp;
        t->hp_rank = within % hp;
    } else {
        t->hp_rank = within / cp;
        t->cp_rank = within % cp;
    }
    t->sp_rank = t->cp_rank * hp + t->hp_rank;
    t->inner_rank = t->cp_rank % ring_inner;
    t->outer_rank = t->cp_rank / ring_inner;

    int h = t->hp_rank, c = t->cp_rank, d = t->dp_rank, W = ring_inner;
    t->dp_comm = split(MPI_COMM_WORLD, c * hp + h, d);
    t->sp_comm = split(MPI_COMM_WORLD, d, t->sp_rank);
    t->head_comm = split(MPI_COMM_WORLD, d * cp + c, h);
    t->ctx_comm = split(MPI_COMM_WORLD, d * hp + h, c);
    t->inner_comm = split(MPI_COMM_WORLD, (d * hp + h) * (cp / W) + c / W, c % W);
    t->outer_comm = split(MPI_COMM_WORLD, (d * hp + h) * W + c % W, c / W);
}

void topology_free(Topology *t) {
    MPI_Comm *comms[] = {&t->dp_comm, &t->sp_comm, &t->head_comm, &t->ctx_comm, &t->inner_comm, &t->outer_comm};
    for (size_t i = 0; i < ARRAY_LEN(comms); i++)
        if (*comms[i] != MPI_COMM_NULL && *comms[i] != 0) MPI_Comm_free(comms[i]);
}
