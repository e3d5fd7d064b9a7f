/* An example strategy for the README's "Adding a strategy" walk-through, compiled in the tests only
 * (tests/test_plugin.c): a plug-in is this one file plus one line X(example) in the registry's list.
 * It is the ring (double_ring.c's schedule) on the striped layout by default, a context-only grid,
 * with --ring-inner: every knob, check, traffic route and planner setting comes from the descriptor,
 * and nothing else in seqpar names it. */
#include <stddef.h>

#include "strategies/double_ring.h"

/* Its own integer flag: declared here, parsed, listed, refused for the other strategies and set in
 * StrategyParams by the registry. The name is the double ring's, so it shares 2d's flag. */
static const StrategyKnob KNOBS[] = {
    {.name = "ring-inner", .metavar = "W", .help = "example: double ring with inner rings of W ranks", .max = 1 << 20,
     .param = offsetof(StrategyParams, ring_inner), .same = KNOB_SAME_CP, .column = "W"},
    {0},
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
    .knobs = KNOBS,
    .candidates = double_ring_candidates,
    .route = double_ring_route,
};
