/* The step's time split by operation class (see op_clock.h). */
#include "core/op_clock.h"

#include <stdatomic.h>

#include "core/common.h"

static _Atomic long long g_ns[OPC_COUNT];

double op_clock_now(void) { return now_seconds(); }

void op_clock_add(OpClass c, double t0) { atomic_fetch_add(&g_ns[c], (long long)((op_clock_now() - t0) * 1e9)); }

double op_clock_seconds(OpClass c) { return 1e-9 * (double)atomic_load(&g_ns[c]); }

void op_clock_reset(void) {
    for (int c = 0; c < OPC_COUNT; c++) atomic_store(&g_ns[c], 0);
}
