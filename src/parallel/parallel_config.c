/* The parallel settings' defaults: see parallel_config.h. */
#include "parallel/parallel_config.h"

#include <string.h>

#include "parallel/comm.h"

void parallel_config_default(ParallelConfig *c) {
    memset(c, 0, sizeof *c);
    c->strategy = NULL; /* the registry's default (strategy_named) */
    c->placement = PLACEMENT_HEAD_FIRST;
    c->layout = LAYOUT_ZIGZAG;
    c->comm_timeout = COMM_DEFAULT_TIMEOUT_S;
}
