/* Wall time spent in the operation classes that dominate a training step (attention forward and
 * backward, the linear layers' GEMMs), summed over every call since the last reset, so that a
 * benchmark can say where a step's time goes (seqpar bench step) without a profiler: the device
 * machines the project is measured on have none. Adds are atomic (nanoseconds); two threads in the
 * same class at once count twice. */
#ifndef SEQPAR_OP_CLOCK_H
#define SEQPAR_OP_CLOCK_H

typedef enum { OPC_ATTN_FWD = 0, OPC_ATTN_BWD = 1, OPC_LINEAR = 2, OPC_COUNT = 3 } OpClass;

/* A monotonic time in seconds, for the start of a timed call. */
double op_clock_now(void);
/* Adds now - t0 to class c. */
void op_clock_add(OpClass c, double t0);
/* Seconds in class c since the last reset. */
double op_clock_seconds(OpClass c);
void op_clock_reset(void);

#endif
