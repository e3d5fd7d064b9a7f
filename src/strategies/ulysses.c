/* DeepSpeed-Ulysses: the head all-to-all alone, the cp = 1 corner of LoongTrain's 2D attention
 * (double_ring.c, whose schedule is the identity on one context rank). Every rank of a replica in the
 * head group by default; uneven head splits allowed, KV heads replicated when fewer than hp. */
#include "strategies/double_ring.h"

const Strategy ulysses_strategy = {
    .name = "ulysses",
    .title = "DeepSpeed-Ulysses",
    .summary = "DeepSpeed-Ulysses: head all-to-all only (the cp = 1 corner of 2d)",
    .flags = "--hp --layout",
    .constraints = "hp <= query heads (uneven splits allowed; KV heads replicated when fewer than hp)",
    .grid = GRID_HEADS_ONLY,
    .default_layout = LAYOUT_ZIGZAG,
    .schedule = &double_ring_schedule,
    .candidates = double_ring_candidates,
    .route = double_ring_route,
};
