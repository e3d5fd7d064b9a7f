/* Packed documents: document starts, target masking and visible-pair counts (see packing.h). */
#include "data/packing.h"

int pack_documents(const int *tokens, int n, int eot, int *doc_start) {
    int start = 0, docs = n > 0;
    for (int i = 0; i < n; i++) {
        doc_start[i] = start;
        if (tokens[i] == eot && i + 1 < n) { /* the EOT ends its document; the next token starts one */
            start = i + 1;
            docs++;
        }
    }
    return docs;
}

int pack_mask_targets(const int *inputs, int n, int eot, int *targets) {
    int masked = 0;
    for (int i = 0; i < n; i++)
        if (inputs[i] == eot && targets[i] >= 0) {
            targets[i] = -1;
            masked++;
        }
    return masked;
}

long long pack_visible_pairs(const int *doc_start, const int *pos, int n) {
    long long pairs = 0;
    for (int i = 0; i < n; i++) pairs += (long long)pos[i] - doc_start[pos[i]] + 1;
    return pairs;
}

double pack_attention_length(const int *doc_start, int n, int window) {
    if (n <= 0) return 0;
    double squares = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && doc_start[j] == doc_start[i]) j++;
        const double m = j - i;
        squares += window > 0 && m > window ? (double)window * (2 * m - window) : m * m;
        i = j;
    }
    return squares / n;
}
