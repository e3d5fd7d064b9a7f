/* Test tool for packed documents: the pieces of the per-document reference that test_pack.sh
 * builds with `seqpar grad` run on each document SEPARATELY (no --pack), to compare with one
 * `seqpar grad --pack` over the packed window.
 *
 *   tool_packed_reference split TOKENS S EOT DIR
 *       cuts the window tokens[0..S] (S inputs and the last target) into documents at EOT (the EOT
 *       ends its document, data/packing.h) and writes DIR/doc_K.bin (llm.c shard) for every
 *       document that has targets, holding exactly its tokens, plus the next window token when
 *       the window cuts it (that is its last target). Prints one line per file:
 *       "K SEQ_LEN TARGETS" with SEQ_LEN the `seqpar grad --seq-len` that runs it.
 *   tool_packed_reference sum OUT W1 A1 [W2 A2 ...]
 *       writes OUT = sum_i Wi * Ai tensor by tensor (safetensors, same names and shapes, F32,
 *       accumulated in double): the packed gradient is sum_d (n_d / n) grad_d.
 *   tool_packed_reference wsum W1 L1 [W2 L2 ...]
 *       prints sum_i Wi * Li with 12 significant digits (the packed loss). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/packing.h"
#include "data/tokens.h"
#include "io/safetensors.h"

static int split(const char *path, int S, int eot, const char *dir) {
    TokenData td;
    tokens_load(path, TOKENS_AUTO, &td);
    if ((size_t)S + 1 > td.n) die("%s holds %zu tokens, the window needs %d", path, td.n, S + 1);
    int *tok = xmalloc(sizeof(int) * (size_t)(S + 1)), *start = xmalloc(sizeof(int) * (size_t)S);
    for (int i = 0; i <= S; i++) tok[i] = (int)td.tokens[i];
    pack_documents(tok, S, eot, start);
    uint32_t *out = xmalloc(sizeof(uint32_t) * (size_t)(S + 1));
    int k = 0;
    for (int s0 = 0; s0 < S;) {
        int e = s0 + 1;
        while (e < S && start[e] == s0) e++;
        const int ends_with_eot = tok[e - 1] == eot, L = e - s0;
        const int targets = ends_with_eot ? L - 1 : L; /* a cut document's last target is tok[e] */
        if (targets > 0) {
            int n = ends_with_eot ? L : L + 1;
            for (int i = 0; i < n; i++) out[i] = (uint32_t)tok[s0 + i];
            char f[4096];
            snprintf(f, sizeof f, "%s/doc_%d.bin", dir, k);
            SeqErr e;
            if (tokens_write_llmc(f, out, (size_t)n, &e) != 0) die("%s", e.msg);
            printf("%d %d %d\n", k, n - 1, targets);
            k++;
        }
        s0 = e;
    }
    xfree(out);
    xfree(tok);
    xfree(start);
    tokens_free(&td);
    return 0;
}

static int sum(int argc, char **argv) {
    if (argc < 5 || (argc - 3) % 2) die("usage: tool_packed_reference sum OUT W1 A1 [W2 A2 ...]");
    const int nf = (argc - 3) / 2; /* argv: tool sum OUT W1 A1 W2 A2 ... */
    StFile *f = xcalloc((size_t)nf, sizeof *f);
    for (int i = 0; i < nf; i++) st_open(argv[4 + 2 * i], &f[i]);
    const int nt = f[0].n_tensors;
    StWriteTensor *w = xcalloc((size_t)nt, sizeof *w);
    for (int t = 0; t < nt; t++) {
        const StTensor *ref = &f[0].tensors[t];
        size_t n = 1;
        for (int d = 0; d < ref->ndim; d++) n *= (size_t)ref->shape[d];
        double *acc = xcalloc(n, sizeof(double));
        float *buf = xmalloc(sizeof(float) * n), *res = xmalloc(sizeof(float) * n);
        for (int i = 0; i < nf; i++) {
            if (f[i].n_tensors != nt) die("%s has %d tensors, %s %d", argv[4 + 2 * i], f[i].n_tensors, argv[4], nt);
            st_read_f32(&f[i], ref->name, ref->ndim, ref->shape, buf);
            const double wt = atof(argv[3 + 2 * i]);
            for (size_t j = 0; j < n; j++) acc[j] += wt * buf[j];
        }
        for (size_t j = 0; j < n; j++) res[j] = (float)acc[j];
        w[t].name = ref->name;
        w[t].data = res;
        w[t].ndim = ref->ndim;
        for (int d = 0; d < ref->ndim; d++) w[t].shape[d] = ref->shape[d];
        xfree(acc);
        xfree(buf);
    }
    SeqErr e;
    if (st_write_f32(argv[2], w, nt, "pt", &e) != 0) die("%s", e.msg);
    for (int t = 0; t < nt; t++) xfree((void *)w[t].data);
    xfree(w);
    for (int i = 0; i < nf; i++) st_close(&f[i]);
    xfree(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 6 && !strcmp(argv[1], "split")) return split(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    if (argc >= 5 && !strcmp(argv[1], "sum")) return sum(argc, argv);
    if (argc >= 4 && !strcmp(argv[1], "wsum") && argc % 2 == 0) {
        double s = 0;
        for (int i = 2; i < argc; i += 2) s += atof(argv[i]) * atof(argv[i + 1]);
        printf("%.12g\n", s);
        return 0;
    }
    fprintf(stderr, "usage: %s split TOKENS S EOT DIR | sum OUT W1 A1 [W2 A2 ...] | wsum W1 L1 [W2 L2 ...]\n", argv[0]);
    return 2;
}
