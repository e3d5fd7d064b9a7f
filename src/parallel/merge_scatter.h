/* The reduce-scatter of partial attention results, combined with the (o, lse) merge rule instead
 * of a sum (notes §1): each member of a group holds a partial (o, lse) for the rows of every
 * member; member j ends with the merge of all members' partials for its own rows. Used where
 * several ranks attend the same queries to different keys (teams of paper 002, §3.3).
 *
 * partials: P blocks in member order, block j = o_j (n, heads, d) | lse_j (n, heads), the partial
 * result of this rank for member j's rows. recv: the same size (scratch). o, lse: this member's
 * merged rows. One all-to-all of (o, lse) blocks (kind k), then P merges in member order, so
 * every member merges in the same order and the result does not depend on the arrival order.
 * Bytes sent: (P - 1) (n heads d + n heads) x 4. */
#ifndef SEQPAR_MERGE_SCATTER_H
#define SEQPAR_MERGE_SCATTER_H

#include <mpi.h>

#include "parallel/comm.h"

void merge_reduce_scatter(Comm *c, CommKind k, MPI_Comm group, const float *partials, float *recv, int n_rows,
                          int heads, int head_dim, float *o, float *lse);

#endif
