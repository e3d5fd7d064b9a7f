/* Ring-Attention / Megatron context parallelism: the point-to-point ring alone, the hp = 1 corner of
 * LoongTrain's 2D attention (double_ring.c); --ring-inner W makes it a double ring of cp / W inner
 * rings. Every rank of a replica in the ring by default. */
#include "strategies/double_ring.h"

const Strategy ring_strategy = {
    .name = "ring",
    .title = "Ring-Attention",
    .summary = "Ring-Attention / Megatron CP: P2P ring only (the hp = 1 corner of 2d; --ring-inner for a double ring)",
    .flags = "--cp --ring-inner --layout",
    .constraints = "--ring-inner divides --cp; any layout",
    .grid = GRID_CONTEXT_ONLY,
    .default_layout = LAYOUT_ZIGZAG,
    .schedule = &double_ring_schedule,
    .knobs = double_ring_knobs,
    .candidates = double_ring_candidates,
    .route = double_ring_route,
};
