/* An example strategy for the README's "Adding a strategy" walk-through, compiled in the tests only
 * (tests/test_plugin.c): a plug-in is this one file plus one line X(example) in the registry's list.
 * It is the ring (double_ring.c's schedule) on the striped layout by default, a context-only grid,
 * with --ring-inner: every knob, check, traffic route and planner setting comes from the descriptor,
 * and nothing else in seqpar names it. */
#include "strategies/double_ring.h"

static const StrategyFlag FLAGS[] = {
    {"--ring-inner W", "2d, ring, example: double ring with inner rings of W ranks"},
    {NULL, NULL},
};

const Strategy example_strategy = {
    .name = "example",
    .title = "the striped ring",
    .summary = "example plug-in: the ring on the striped layout (tests/plugin/example.c)",
    .flags = "--cp --ring-inner --layout",
    .constraints = "--ring-inner divides --cp; any layout",
    .grid = GRID_CONTEXT_ONLY,
    .default_layout = LAYOUT_STRIPED,
    .schedule = &double_ring_schedule,
    .own_flags = FLAGS,
    .reads = KNOB_RING_INNER,
    .candidates = double_ring_candidates,
    .route = double_ring_route,
};
