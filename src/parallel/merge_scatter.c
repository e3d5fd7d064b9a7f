/* Merge reduce-scatter of (o, lse) partials: see merge_scatter.h. */
#include "parallel/merge_scatter.h"

#include "attention/flash_attention.h"

void merge_reduce_scatter(Comm *c, CommKind k, MPI_Comm group, const float *partials, float *recv, int n_rows,
                          int heads, int head_dim, float *o, float *lse) {
    int P = 1;
    MPI_Comm_size(group, &P);
    const size_t a = (size_t)n_rows * heads * head_dim, h = (size_t)n_rows * heads;
    comm_alltoall(c, k, partials, recv, (a + h) * sizeof(float), group);
    double t0 = comm_compute_begin(c);
    AttnShape st = {.n_q = n_rows, .n_heads = heads, .head_dim = head_dim};
    attn_state_init(&st, o, lse);
    for (int j = 0; j < P; j++) attn_merge(n_rows, heads, head_dim, o, lse, recv + j * (a + h), recv + j * (a + h) + a);
    comm_compute_end(c, "merge", t0);
}
