/* Test tool: compares two safetensors files tensor by tensor (same names, same shapes, values
 * within |a - b| <= atol + rtol * max|b| of each tensor). Prints the worst tensor and exits 0 if
 * they agree, 1 otherwise. Used by the CLI tests to compare `seqpar grad` outputs.
 * usage: tool_compare_safetensors A B [rtol [atol]] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "io/safetensors.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s A B [rtol [atol]]\n", argv[0]);
        return 2;
    }
    double rtol = argc > 3 ? atof(argv[3]) : 1e-4, atol = argc > 4 ? atof(argv[4]) : 1e-7;
    StFile a, b;
    st_open(argv[1], &a);
    st_open(argv[2], &b);
    int ok = a.n_tensors == b.n_tensors;
    if (!ok) printf("tensor count differs: %d vs %d\n", a.n_tensors, b.n_tensors);
    double worst_ratio = 0;
    const char *worst_name = "";
    for (int i = 0; i < b.n_tensors && ok; i++) {
        const StTensor *tb = &b.tensors[i];
        const StTensor *ta = st_find(&a, tb->name);
        if (!ta) { printf("tensor %s missing from %s\n", tb->name, argv[1]); ok = 0; break; }
        size_t n = 1;
        for (int d = 0; d < tb->ndim; d++) n *= (size_t)tb->shape[d];
        float *va = malloc(sizeof(float) * n), *vb = malloc(sizeof(float) * n);
        st_read_f32(&b, tb->name, tb->ndim, tb->shape, vb);
        st_read_f32(&a, tb->name, tb->ndim, tb->shape, va); /* dies on a shape mismatch */
        double scale = 0, worst = 0;
        for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(vb[j]));
        for (size_t j = 0; j < n; j++) {
            double e = fabs((double)va[j] - vb[j]);
            if (!(e <= worst)) worst = e;
        }
        /* with both tolerances 0 (bit-identical asked) a tensor that matches is at 0, not 0 / 0 */
        double ratio = worst == 0 ? 0 : worst / (atol + rtol * scale);
        if (!(ratio <= worst_ratio)) { worst_ratio = ratio; worst_name = tb->name; }
        free(va); free(vb);
    }
    if (ok) {
        ok = worst_ratio <= 1.0;
        if (worst_ratio == 0) printf("agree: every tensor equal bit for bit (rtol %g, atol %g)\n", rtol, atol);
        else printf("%s: worst tensor %s at %.3g of tolerance (rtol %g, atol %g)\n", ok ? "agree" : "DIFFER",
                    worst_name, worst_ratio, rtol, atol);
    }
    st_close(&a);
    st_close(&b);
    return ok ? 0 : 1;
}
