/* CPU time of the flash-attention kernel's causal forward and backward on one thread (S = 4096,
 * 4 heads, head_dim from argv[1], default 64), best of 7 calls. With argv[2] = L > 0 the tokens are
 * packed documents of L tokens (attn_forward_docs / attn_backward_docs). CPU time rather than wall time,
 * so that two builds can be compared on a machine shared with other jobs: run this program of
 * each build alternately several times and compare the minima (README, packed documents). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "attention/flash_attention.h"
#include "core/common.h"
int main(int argc, char **argv) {
    int S = 4096, H = 4, d = argc > 1 ? atoi(argv[1]) : 64, R = 7;
    omp_set_num_threads(1);
    size_t n = (size_t)S * H * d;
    float *q = malloc(4 * n), *k = malloc(4 * n), *v = malloc(4 * n), *o = malloc(4 * n), *g = malloc(4 * n), *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4);
    float *lse = malloc(4 * (size_t)S * H), *delta = malloc(4 * (size_t)S * H);
    int *pos = malloc(4 * S), *doc = malloc(4 * S), L = argc > 2 ? atoi(argv[2]) : 0;
    srand(1);
    for (size_t i = 0; i < n; i++) { q[i] = rand() / (float)RAND_MAX - .5f; k[i] = rand() / (float)RAND_MAX - .5f; v[i] = rand() / (float)RAND_MAX - .5f; g[i] = rand() / (float)RAND_MAX - .5f; }
    for (int i = 0; i < S; i++) {
        pos[i] = i;
        doc[i] = L > 0 ? i / L * L : 0;
    }
    AttnShape s = {.n_q = S, .n_kv = S, .n_heads = H, .n_kv_heads = H, .head_dim = d, .scale = 1.0f / sqrtf(d), .mask = ATTN_CAUSAL};
    double bf = 1e9, bb = 1e9;
    for (int r = 0; r < R; r++) {
        attn_state_init(&s, o, lse);
        double t0 = cpu_seconds();
        if (L > 0) attn_forward_docs(&s, q, pos, doc, k, v, pos, doc, o, lse);
        else attn_forward(&s, q, pos, k, v, pos, o, lse);
        double t1 = cpu_seconds();
        attn_backward_delta(&s, o, g, delta);
        if (L > 0) attn_backward_docs(&s, q, pos, doc, k, v, pos, doc, lse, delta, g, dq, dk, dv);
        else attn_backward(&s, q, pos, k, v, pos, lse, delta, g, dq, dk, dv);
        double t2 = cpu_seconds();
        if (t1 - t0 < bf) bf = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
    }
    printf("d=%d documents of %d: fwd %.4f s bwd %.4f s (CPU time, best of %d)\n", d, L > 0 ? L : S, bf, bb, R);
    return 0;
}
