/* Tests of packed documents and sliding windows in the flash-attention kernel (attn_forward_docs /
 * attn_backward_docs, attn_visibility with document spans and windows, attn_forward_flops_docs) and
 * of the packing functions
 * (src/data/packing.c). run_tests.sh runs it once per kernel path this CPU has (SEQPAR_ISA), since
 * the masked tiles reach every path's exp / max / GEMM kernels with -inf entries.
 *
 *  - packing: document starts at an end-of-text id (the EOT ends its document; consecutive EOTs,
 *    an EOT first or last, none at all), masked targets, visible-pair counts against brute force;
 *  - the visibility rule on spans: other documents are hidden whatever the positions, one shared
 *    document with earlier keys is fully visible, anything mixed is partial;
 *  - the kernel with document ids against a double-precision reference that applies the rule
 *    (key visible iff same document and kpos <= qpos) pair by pair: several lengths (1 to 700),
 *    head dims 32/64/128, GQA ratios 1/2/4, four token orders (contiguous, zigzag, striped,
 *    random), three document mixes (random lengths, many one-token documents, one document), keys
 *    split in parts merged by successive calls: o, lse, dq, dk, dv;
 *  - the kernel with document ids equals the kernel run on each document SEPARATELY (positions
 *    0..L-1, no ids), forward and backward;
 *  - a tile entirely across documents is skipped, checked deterministically: two documents whose
 *    boundary falls on a tile boundary (of this path's forward or backward tiles), the first one's
 *    q, k, v and dout NaN: a computed-then-masked tile would still multiply
 *    P = 0 by NaN, so the second document's o, lse, dq, dk, dv must be finite and equal to running it
 *    alone; and, printed for information (wall time on a shared machine), forward over 4096 tokens
 *    causal, as 8 documents of 512 and as 64 documents of 64;
 *  - attn_forward_flops_docs against a brute-force count.
 *  - sliding windows (AttnShape.window W: key visible iff also qpos - kpos < W): the same reference
 *    and per-document comparison with windows 1 to 300 over the orders, mixes, GQA ratios and head
 *    dims, the kernel's plain path (no document ids) too; the rule on spans; a window that leaves
 *    whole key tiles behind every query skips them (their inputs NaN, the result finite and equal
 *    to the run without those keys); attn_forward_flops(_docs) with windows against brute force.
 * Tolerances as test_attention.c (fp32 kernel vs float64 reference): forward atol 1e-5 rtol 1e-4,
 * backward atol 1e-4 rtol 1e-3. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "data/packing.h"
#include "kernels/isa.h"
#include "testlib.h"

#define FWD_ATOL 1e-5
#define FWD_RTOL 1e-4
#define BWD_ATOL 1e-4
#define BWD_RTOL 1e-3

enum { ORDER_CONTIG, ORDER_ZIGZAG, ORDER_STRIPED, ORDER_RANDOM, N_ORDERS };
enum { DOCS_RANDOM, DOCS_SINGLETONS, DOCS_ONE, N_MIXES };
static const char *order_name[] = {"contiguous", "zigzag", "striped", "random"};
static const char *mix_name[] = {"random lengths", "many one-token documents", "one document"};
static double g_worst_fwd, g_worst_bwd;

/* ------------------------------------------------------------------------------------------ */
static void test_packing(void) {
    const int eot = 9;
    int doc[8], tg[8];
    const int none[] = {1, 2, 3, 4};
    CHECK(pack_documents(none, 4, eot, doc) == 1 && doc[0] == 0 && doc[3] == 0, "no EOT: one document");
    const int last[] = {1, 2, 3, 9};
    CHECK(pack_documents(last, 4, eot, doc) == 1 && doc[3] == 0, "an EOT at the end ends the only document");
    const int mixed[] = {9, 4, 9, 9, 5, 6, 9, 7};
    int n = pack_documents(mixed, 8, eot, doc);
    const int want[] = {0, 1, 1, 3, 4, 4, 4, 7};
    CHECK(n == 5 && !memcmp(doc, want, sizeof want), "EOT first, consecutive EOTs: %d documents, starts %d %d %d %d %d %d %d %d",
          n, doc[0], doc[1], doc[2], doc[3], doc[4], doc[5], doc[6], doc[7]);
    for (int i = 0; i < 8; i++) tg[i] = 100 + i;
    CHECK(pack_mask_targets(mixed, 8, eot, tg) == 4 && tg[0] == -1 && tg[1] == 101 && tg[2] == -1 && tg[3] == -1 &&
              tg[6] == -1 && tg[7] == 107, "targets of EOT inputs ignored, the others kept");
    int pos[8];
    for (int i = 0; i < 8; i++) pos[i] = 7 - i;
    long long brute = 0;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) brute += doc[j] == doc[i] && j <= i;
    /* the attention length of MFU: sum of squared document lengths over n (mixed: 1 2 1 3 1) */
    n = pack_documents(mixed, 8, eot, doc);
    double sq = 0;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) sq += doc[j] == doc[i];
    CHECK(pack_attention_length(doc, 8, 0) == sq / 8 && sq == 16, "attention length %g, brute force %g / 8",
          pack_attention_length(doc, 8, 0), sq);
    /* under a sliding window W a document of m > W tokens counts W (2m - W) (the causal count's m^2
     * with the pairs past the window left out); documents 1 2 1 3 1: W = 1 gives 1 + 3 + 1 + 5 + 1
     * (2m - 1 each), W = 2: 1 + 4 + 1 + 8 + 1, W >= 3 the causal 16 */
    const double want_w[] = {0, 1 + 3 + 1 + 5 + 1, 1 + 4 + 1 + 8 + 1, 16, 16};
    for (int w = 1; w <= 4; w++)
        CHECK(pack_attention_length(doc, 8, w) == want_w[w] / 8, "window %d: attention length %g, want %g / 8", w,
              pack_attention_length(doc, 8, w), want_w[w]);
    CHECK(pack_documents(none, 4, eot, doc) == 1 && pack_attention_length(doc, 4, 0) == 4.0,
          "one document: the attention length is the window (got %g)", pack_attention_length(doc, 4, 0));
    n = pack_documents(mixed, 8, eot, doc);
    CHECK(pack_visible_pairs(doc, pos, 8) == brute, "visible pairs %lld, brute force %lld", pack_visible_pairs(doc, pos, 8),
          brute);
}

static void test_visibility(void) {
    /* queries at 100..163 in document 2 (or 2..3, or none); with a window W they see keys from
     * 100 - W + 1 (the first query) to 163 - W + 1 (the last) on */
    const struct { AttnSpan q, k; int window; AttnVisibility want; const char *what; } cases[] = {
        {{100, 163, 2, 2}, {0, 63, 1, 1}, 0, ATTN_VIS_HIDDEN, "earlier keys of another document are hidden"},
        {{100, 163, 2, 2}, {0, 63, 2, 2}, 0, ATTN_VIS_FULL, "earlier keys of the same document are visible"},
        {{100, 163, 2, 2}, {0, 63, 1, 2}, 0, ATTN_VIS_PARTIAL, "keys across a boundary are partial"},
        {{100, 163, 2, 2}, {200, 263, 2, 2}, 0, ATTN_VIS_HIDDEN, "later keys are hidden"},
        {{100, 163, 2, 2}, {120, 180, 2, 2}, 0, ATTN_VIS_PARTIAL, "the diagonal is partial"},
        {{100, 163, 2, 3}, {0, 63, 2, 2}, 0, ATTN_VIS_PARTIAL, "queries across a boundary are partial"},
        {{100, 163, 0, 0}, {0, 63, 0, 0}, 0, ATTN_VIS_FULL, "without documents: the position rule"},
        {{100, 163, 0, 0}, {0, 63, 0, 0}, 37, ATTN_VIS_HIDDEN, "keys before every query's window are hidden"},
        {{100, 163, 0, 0}, {0, 63, 0, 0}, 38, ATTN_VIS_PARTIAL, "the first query sees key 63 with window 38"},
        {{100, 163, 0, 0}, {0, 63, 0, 0}, 163, ATTN_VIS_PARTIAL, "key 0 is past the last query's window 163"},
        {{100, 163, 0, 0}, {0, 63, 0, 0}, 164, ATTN_VIS_FULL, "window 164 covers every pair"},
        {{100, 163, 0, 0}, {0, 63, 2, 2}, 164, ATTN_VIS_HIDDEN, "another document stays hidden in a window"},
        {{100, 163, 0, 0}, {120, 180, 0, 0}, 1000, ATTN_VIS_PARTIAL, "the diagonal stays partial"},
        {{100, 163, 0, 0}, {200, 263, 0, 0}, 1000, ATTN_VIS_HIDDEN, "later keys stay hidden"},
        {{INT_MAX - 10, INT_MAX, 0, 0}, {INT_MIN, INT_MIN + 10, 0, 0}, 5, ATTN_VIS_HIDDEN,
         "extreme positions do not overflow the window rule"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++)
        CHECK(attn_visibility(cases[i].q, cases[i].k, cases[i].window) == cases[i].want, "%s", cases[i].what);
    AttnSpan s = attn_span((const int[]){5, 3, 9}, (const int[]){1, 0, 1}, 3);
    CHECK(s.pos_lo == 3 && s.pos_hi == 9 && s.doc_lo == 0 && s.doc_hi == 1, "attn_span");
}

/* ------------------------------------------------------------------------------------------ */
/* Global positions of n tokens in a storage order (a permutation of 0..n-1). */
static void make_order(int order, int n, Rng *rng, int *pos) {
    int at = 0;
    if (order == ORDER_ZIGZAG) { /* rank 0 of 2: chunks 0 and 3, then rank 1: chunks 1 and 2 */
        const int chunks[4] = {0, 3, 1, 2};
        for (int c = 0; c < 4; c++)
            for (int t = (int)((long long)chunks[c] * n / 4); t < (int)((long long)(chunks[c] + 1) * n / 4); t++) pos[at++] = t;
    } else if (order == ORDER_STRIPED) {
        for (int r = 0; r < 3; r++)
            for (int t = r; t < n; t += 3) pos[at++] = t;
    } else {
        for (int t = 0; t < n; t++) pos[at++] = t;
        if (order == ORDER_RANDOM)
            for (int i = n - 1; i > 0; i--) {
                int j = (int)rng_below(rng, (uint64_t)i + 1), tmp = pos[i];
                pos[i] = pos[j];
                pos[j] = tmp;
            }
    }
}

/* Document starts (by global position) of n tokens. */
static void make_docs(int mix, int n, Rng *rng, int *start) {
    int s = 0;
    for (int t = 0; t < n; t++) {
        if (t > 0 && ((mix == DOCS_RANDOM && rng_below(rng, 40) == 0) || (mix == DOCS_SINGLETONS && rng_below(rng, 3) == 0)))
            s = t;
        start[t] = s;
    }
}

static float *new_normal(size_t n, Rng *rng) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(rng);
    return x;
}

/* Double reference from a fresh state: o (nq, H, d), lse (nq, H), and the gradients of
 * sum(o * dout) (dq, dk, dv), key j visible to query i iff kdoc[j] == qdoc[i] && kpos[j] <= qpos[i]
 * && (s->window == 0 || qpos[i] - kpos[j] < s->window). */
static void ref_attention(const AttnShape *s, const float *q, const int *qpos, const int *qdoc, const float *k,
                          const float *v, const int *kpos, const int *kdoc, const float *dout, double *o, double *lse,
                          double *dq, double *dk, double *dv) {
    const int H = s->n_heads, Hkv = s->n_kv_heads, d = s->head_dim, G = H / Hkv, nk = s->n_kv;
    double *p = xmalloc(sizeof(double) * ((size_t)nk + 1));
    memset(dq, 0, sizeof(double) * (size_t)s->n_q * H * d);
    memset(dk, 0, sizeof(double) * (size_t)nk * Hkv * d);
    memset(dv, 0, sizeof(double) * (size_t)nk * Hkv * d);
    for (int i = 0; i < s->n_q; i++)
        for (int h = 0; h < H; h++) {
            const float *qi = q + ((size_t)i * H + h) * d, *gi = dout + ((size_t)i * H + h) * d;
            double *oi = o + ((size_t)i * H + h) * d, mx = -INFINITY;
            for (int j = 0; j < nk; j++) {
                p[j] = -INFINITY;
                if (kdoc[j] != qdoc[i] || kpos[j] > qpos[i] || (s->window > 0 && qpos[i] - kpos[j] >= s->window))
                    continue;
                const float *kj = k + ((size_t)j * Hkv + h / G) * d;
                double dot = 0;
                for (int c = 0; c < d; c++) dot += (double)qi[c] * kj[c];
                p[j] = s->scale * dot;
                mx = fmax(mx, p[j]);
            }
            for (int c = 0; c < d; c++) oi[c] = 0;
            if (mx == -INFINITY) {
                lse[(size_t)i * H + h] = -INFINITY;
                continue;
            }
            double sum = 0;
            for (int j = 0; j < nk; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
            for (int j = 0; j < nk; j++) {
                p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx) / sum;
                const float *vj = v + ((size_t)j * Hkv + h / G) * d;
                for (int c = 0; c < d; c++) oi[c] += p[j] * vj[c];
            }
            lse[(size_t)i * H + h] = mx + log(sum);
            double delta = 0;
            for (int c = 0; c < d; c++) delta += gi[c] * oi[c];
            for (int j = 0; j < nk; j++) {
                if (p[j] == 0) continue;
                const float *vj = v + ((size_t)j * Hkv + h / G) * d, *kj = k + ((size_t)j * Hkv + h / G) * d;
                double g = 0;
                for (int c = 0; c < d; c++) g += gi[c] * (double)vj[c];
                double ds = p[j] * (g - delta) * s->scale;
                double *dkj = dk + ((size_t)j * Hkv + h / G) * d, *dvj = dv + ((size_t)j * Hkv + h / G) * d;
                for (int c = 0; c < d; c++) {
                    dq[((size_t)i * H + h) * d + c] += ds * kj[c];
                    dkj[c] += ds * qi[c];
                    dvj[c] += p[j] * gi[c];
                }
            }
        }
    xfree(p);
}

static double viol(const float *a, const double *b, size_t n, double atol, double rtol) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(b[i]) && a[i] == b[i]) continue;
        double v = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (!(v <= w)) w = v;
    }
    return w;
}

/* Self-attention of n packed tokens in `order` with documents `mix` and a sliding window (0: none);
 * keys in n_parts calls. */
static void packed_case(int n, int order, int mix, int H, int Hkv, int d, int n_parts, int window, Rng *rng) {
    int *pos = xmalloc(sizeof(int) * (size_t)n), *start = xmalloc(sizeof(int) * (size_t)n);
    int *doc = xmalloc(sizeof(int) * (size_t)n);
    make_order(order, n, rng, pos);
    make_docs(mix, n, rng, start);
    for (int i = 0; i < n; i++) doc[i] = start[pos[i]]; /* document of the row held at i */
    const size_t nq = (size_t)n * H * d, nk = (size_t)n * Hkv * d;
    float *q = new_normal(nq, rng), *k = new_normal(nk, rng), *v = new_normal(nk, rng), *dout = new_normal(nq, rng);
    AttnShape s = {.n_q = n, .n_kv = n, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d,
                   .scale = 1.0f / sqrtf((float)d), .mask = ATTN_CAUSAL, .window = window};
    float *o = xmalloc(sizeof(float) * nq), *lse = xmalloc(sizeof(float) * (size_t)n * H);
    attn_state_init(&s, o, lse);
    for (int p = 0; p < n_parts; p++) { /* key rows [lo, hi) per call, merged through the running state */
        int lo = (int)((long long)p * n / n_parts), hi = (int)((long long)(p + 1) * n / n_parts);
        AttnShape sp = s;
        sp.n_kv = hi - lo;
        attn_forward_docs(&sp, q, pos, doc, k + (size_t)lo * Hkv * d, v + (size_t)lo * Hkv * d, pos + lo, doc + lo, o, lse);
    }
    float *delta = xmalloc(sizeof(float) * (size_t)n * H);
    float *dq = xcalloc(nq, sizeof(float)), *dk = xcalloc(nk, sizeof(float)), *dv = xcalloc(nk, sizeof(float));
    attn_backward_delta(&s, o, dout, delta);
    for (int p = 0; p < n_parts; p++) {
        int lo = (int)((long long)p * n / n_parts), hi = (int)((long long)(p + 1) * n / n_parts);
        AttnShape sp = s;
        sp.n_kv = hi - lo;
        attn_backward_docs(&sp, q, pos, doc, k + (size_t)lo * Hkv * d, v + (size_t)lo * Hkv * d, pos + lo, doc + lo, lse,
                           delta, dout, dq, dk + (size_t)lo * Hkv * d, dv + (size_t)lo * Hkv * d);
    }
    double *ro = xmalloc(sizeof(double) * nq), *rl = xmalloc(sizeof(double) * (size_t)n * H);
    double *rq = xmalloc(sizeof(double) * nq), *rk = xmalloc(sizeof(double) * nk), *rv = xmalloc(sizeof(double) * nk);
    ref_attention(&s, q, pos, doc, k, v, pos, doc, dout, ro, rl, rq, rk, rv);
    double vf = fmax(viol(o, ro, nq, FWD_ATOL, FWD_RTOL), viol(lse, rl, (size_t)n * H, FWD_ATOL, FWD_RTOL));
    double vb = fmax(viol(dq, rq, nq, BWD_ATOL, BWD_RTOL), fmax(viol(dk, rk, nk, BWD_ATOL, BWD_RTOL), viol(dv, rv, nk, BWD_ATOL, BWD_RTOL)));
    CHECK(vf <= 1 && vb <= 1, "n=%d %s, %s, H=%d Hkv=%d d=%d parts=%d window %d: forward %.3g, backward %.3g x tolerance",
          n, order_name[order], mix_name[mix], H, Hkv, d, n_parts, window, vf, vb);
    g_worst_fwd = fmax(g_worst_fwd, vf);
    g_worst_bwd = fmax(g_worst_bwd, vb);

    if (mix == DOCS_ONE) { /* one document: the kernel's plain path (no ids) against the same reference */
        float *po = xmalloc(sizeof(float) * nq), *pl = xmalloc(sizeof(float) * (size_t)n * H);
        float *pq = xcalloc(nq, sizeof(float)), *pk = xcalloc(nk, sizeof(float)), *pv = xcalloc(nk, sizeof(float));
        float *pd = xmalloc(sizeof(float) * (size_t)n * H);
        attn_state_init(&s, po, pl);
        attn_forward(&s, q, pos, k, v, pos, po, pl);
        attn_backward_delta(&s, po, dout, pd);
        attn_backward(&s, q, pos, k, v, pos, pl, pd, dout, pq, pk, pv);
        double pf = fmax(viol(po, ro, nq, FWD_ATOL, FWD_RTOL), viol(pl, rl, (size_t)n * H, FWD_ATOL, FWD_RTOL));
        double pb = fmax(viol(pq, rq, nq, BWD_ATOL, BWD_RTOL), fmax(viol(pk, rk, nk, BWD_ATOL, BWD_RTOL), viol(pv, rv, nk, BWD_ATOL, BWD_RTOL)));
        CHECK(pf <= 1 && pb <= 1, "n=%d %s, H=%d Hkv=%d d=%d window %d, no document ids: forward %.3g, backward %.3g x "
              "tolerance", n, order_name[order], H, Hkv, d, window, pf, pb);
        float *pr[] = {po, pl, pq, pk, pv, pd};
        for (size_t i = 0; i < ARRAY_LEN(pr); i++) xfree(pr[i]);
    }

    /* each document by itself through the plain kernel (positions 0..L-1, rows gathered) */
    double ef = 0, eb = 0;
    int *rows = xmalloc(sizeof(int) * (size_t)n), *lp = xmalloc(sizeof(int) * (size_t)n);
    float *bq = xmalloc(sizeof(float) * nq), *bk = xmalloc(sizeof(float) * nk), *bv = xmalloc(sizeof(float) * nk);
    float *bg = xmalloc(sizeof(float) * nq), *bo = xmalloc(sizeof(float) * nq), *bl = xmalloc(sizeof(float) * (size_t)n * H);
    float *bd = xmalloc(sizeof(float) * (size_t)n * H), *gq = xmalloc(sizeof(float) * nq);
    float *gk = xmalloc(sizeof(float) * nk), *gv = xmalloc(sizeof(float) * nk);
    for (int s0 = 0; s0 < n;) {
        int L = 0;
        for (int i = 0; i < n; i++) /* the rows of document s0, in position order (pos is a permutation) */
            if (start[pos[i]] == s0) rows[L++] = i;
        for (int a = 1; a < L; a++) /* insertion sort by position */
            for (int b = a; b > 0 && pos[rows[b - 1]] > pos[rows[b]]; b--) { int t = rows[b]; rows[b] = rows[b - 1]; rows[b - 1] = t; }
        for (int a = 0; a < L; a++) {
            lp[a] = a;
            memcpy(bq + (size_t)a * H * d, q + (size_t)rows[a] * H * d, sizeof(float) * (size_t)H * d);
            memcpy(bg + (size_t)a * H * d, dout + (size_t)rows[a] * H * d, sizeof(float) * (size_t)H * d);
            memcpy(bk + (size_t)a * Hkv * d, k + (size_t)rows[a] * Hkv * d, sizeof(float) * (size_t)Hkv * d);
            memcpy(bv + (size_t)a * Hkv * d, v + (size_t)rows[a] * Hkv * d, sizeof(float) * (size_t)Hkv * d);
        }
        AttnShape sd = s;
        sd.n_q = sd.n_kv = L;
        attn_state_init(&sd, bo, bl);
        attn_forward(&sd, bq, lp, bk, bv, lp, bo, bl);
        attn_backward_delta(&sd, bo, bg, bd);
        memset(gq, 0, sizeof(float) * (size_t)L * H * d);
        memset(gk, 0, sizeof(float) * (size_t)L * Hkv * d);
        memset(gv, 0, sizeof(float) * (size_t)L * Hkv * d);
        attn_backward(&sd, bq, lp, bk, bv, lp, bl, bd, bg, gq, gk, gv);
        for (int a = 0; a < L; a++) {
            for (int c = 0; c < H * d; c++) {
                ef = fmax(ef, fabs(bo[(size_t)a * H * d + c] - o[(size_t)rows[a] * H * d + c]) / FWD_ATOL);
                eb = fmax(eb, fabs(gq[(size_t)a * H * d + c] - dq[(size_t)rows[a] * H * d + c]) / BWD_ATOL);
            }
            for (int c = 0; c < Hkv * d; c++)
                eb = fmax(eb, fmax(fabs(gk[(size_t)a * Hkv * d + c] - dk[(size_t)rows[a] * Hkv * d + c]),
                                   fabs(gv[(size_t)a * Hkv * d + c] - dv[(size_t)rows[a] * Hkv * d + c])) / BWD_ATOL);
        }
        int next = n; /* the next document start after s0 */
        for (int t = s0 + 1; t < n; t++)
            if (start[t] != s0) { next = t; break; }
        s0 = next;
    }
    CHECK(ef <= 1 && eb <= 1, "n=%d %s, %s, window %d: packed vs each document alone: forward %.3g, backward %.3g x "
          "tolerance", n, order_name[order], mix_name[mix], window, ef, eb);
    float *fr[] = {q, k, v, dout, o, lse, delta, dq, dk, dv, bq, bk, bv, bg, bo, bl, bd, gq, gk, gv};
    for (size_t i = 0; i < ARRAY_LEN(fr); i++) xfree(fr[i]);
    double *dr[] = {ro, rl, rq, rk, rv};
    for (size_t i = 0; i < ARRAY_LEN(dr); i++) xfree(dr[i]);
    xfree(pos);
    xfree(start);
    xfree(doc);
    xfree(rows);
    xfree(lp);
}

static void test_flops(Rng *rng) {
    const int n = 300;
    int pos[300], start[300], doc[300];
    make_order(ORDER_RANDOM, n, rng, pos);
    make_docs(DOCS_RANDOM, n, rng, start);
    for (int i = 0; i < n; i++) doc[i] = start[pos[i]];
    AttnShape s = {.n_q = 200, .n_kv = 100, .n_heads = 3, .n_kv_heads = 1, .head_dim = 16, .scale = 0.25f,
                   .mask = ATTN_CAUSAL};
    double pairs = 0;
    for (int i = 0; i < 200; i++)
        for (int j = 200; j < 300; j++) pairs += doc[j] == doc[i] && pos[j] <= pos[i];
    double got = attn_forward_flops_docs(&s, pos, doc, pos + 200, doc + 200);
    CHECK(got == 4.0 * 16 * 3 * pairs, "flops with documents %.0f, brute force %.0f", got, 4.0 * 16 * 3 * pairs);
    const int windows[] = {1, 2, 17, 150, 400};
    for (size_t w = 0; w < ARRAY_LEN(windows); w++) { /* and with a window, documents or none */
        s.window = windows[w];
        double wd = 0, wp = 0;
        for (int i = 0; i < 200; i++)
            for (int j = 200; j < 300; j++) {
                const int in = pos[j] <= pos[i] && pos[i] - pos[j] < windows[w];
                wp += in;
                wd += in && doc[j] == doc[i];
            }
        double gd = attn_forward_flops_docs(&s, pos, doc, pos + 200, doc + 200), gp = attn_forward_flops(&s, pos, pos + 200);
        CHECK(gd == 4.0 * 16 * 3 * wd && gp == 4.0 * 16 * 3 * wp, "flops with window %d: %.0f / %.0f (documents / none), "
              "brute force %.0f / %.0f", windows[w], gd, gp, 4.0 * 16 * 3 * wd, 4.0 * 16 * 3 * wp);
    }
}

/* Tiles wholly across documents cost nothing: 8 documents of 512 tokens against one causal 4096
 * (and, printed only, 64 documents of 64: documents shorter than a tile mask most of each tile). */
static double time_docs(int n, int doc_len, const AttnShape *s, const float *q, const float *k, const float *v,
                        float *o, float *lse) {
    int *pos = xmalloc(sizeof(int) * n), *doc = xmalloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        doc[i] = i / doc_len * doc_len;
    }
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        attn_state_init(s, o, lse);
        double t0 = now_seconds();
        attn_forward_docs(s, q, pos, doc, k, v, pos, doc, o, lse);
        best = fmin(best, now_seconds() - t0);
    }
    xfree(pos);
    xfree(doc);
    return best;
}

static void test_tiles_skipped(Rng *rng) {
    const int n = 4096, H = 2, d = 64;
    int *pos = xmalloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) pos[i] = i;
    float *q = new_normal((size_t)n * H * d, rng), *k = new_normal((size_t)n * H * d, rng), *v = new_normal((size_t)n * H * d, rng);
    float *o = xmalloc(sizeof(float) * (size_t)n * H * d), *lse = xmalloc(sizeof(float) * (size_t)n * H);
    AttnShape s = {.n_q = n, .n_kv = n, .n_heads = H, .n_kv_heads = H, .head_dim = d, .scale = 0.125f, .mask = ATTN_CAUSAL};
    double best_plain = 1e9;
    for (int r = 0; r < 3; r++) {
        attn_state_init(&s, o, lse);
        double t0 = now_seconds();
        attn_forward(&s, q, pos, k, v, pos, o, lse);
        best_plain = fmin(best_plain, now_seconds() - t0);
    }
    double t512 = time_docs(n, 512, &s, q, k, v, o, lse), t64 = time_docs(n, 64, &s, q, k, v, o, lse);
    printf("4096 tokens forward: plain causal %.4f s; 8 documents of 512 %.4f s (%.1fx less); 64 documents of 64 %.4f s "
           "(%.1fx less)\n", best_plain, t512, best_plain / t512, t64, best_plain / t64);
    float *fr[] = {q, k, v, o, lse};
    for (size_t i = 0; i < ARRAY_LEN(fr); i++) xfree(fr[i]);
    xfree(pos);
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Two documents of L tokens each, L a multiple of the pass's tile sizes on this path, document 0's
 * inputs NaN: document 1 must come out finite and equal to itself run alone (see the file
 * comment). backward = 0 checks the forward (o, lse); 1 the backward (dq, dk, dv), given document
 * 1's lse and delta from its run alone (document 0's rows get lse 0, delta 0: finite, so that its
 * NaN would spread if a cross-document tile were computed). */
static void nan_documents_case(int backward, Rng *rng) {
    const SimdKernels *sk = simd();
    const int a = backward ? sk->bwd_bq : sk->fwd_bq, b = backward ? sk->bwd_bk : sk->fwd_bk;
    const int L = a / gcd(a, b) * b, n = 2 * L, H = 2, Hkv = 1, d = 32;
    const size_t nq = (size_t)n * H * d, nk = (size_t)n * Hkv * d, hq = (size_t)L * H * d, hk = (size_t)L * Hkv * d;
    const size_t hr = (size_t)L * H;
    int *pos = xmalloc(sizeof(int) * (size_t)n), *doc = xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        doc[i] = i < L ? 0 : L;
    }
    float *q = new_normal(nq, rng), *k = new_normal(nk, rng), *v = new_normal(nk, rng), *g = new_normal(nq, rng);
    AttnShape s = {.n_q = n, .n_kv = n, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d, .scale = 0.2f, .mask = ATTN_CAUSAL};
    /* document 1 alone (finite inputs) */
    AttnShape s1 = s;
    s1.n_q = s1.n_kv = L;
    float *o1 = xmalloc(sizeof(float) * hq), *l1 = xmalloc(sizeof(float) * hr), *d1 = xmalloc(sizeof(float) * hr);
    float *dq1 = xcalloc(hq, sizeof(float)), *dk1 = xcalloc(hk, sizeof(float)), *dv1 = xcalloc(hk, sizeof(float));
    attn_state_init(&s1, o1, l1);
    attn_forward(&s1, q + hq, pos, k + hk, v + hk, pos, o1, l1);
    attn_backward_delta(&s1, o1, g + hq, d1);
    attn_backward(&s1, q + hq, pos, k + hk, v + hk, pos, l1, d1, g + hq, dq1, dk1, dv1);
    for (size_t i = 0; i < hq; i++) q[i] = g[i] = NAN;
    for (size_t i = 0; i < hk; i++) k[i] = v[i] = NAN;
    float *o = xmalloc(sizeof(float) * nq), *lse = xmalloc(sizeof(float) * (size_t)n * H);
    float *delta = xcalloc((size_t)n * H, sizeof(float));
    float *dq = xcalloc(nq, sizeof(float)), *dk = xcalloc(nk, sizeof(float)), *dv = xcalloc(nk, sizeof(float));
    int finite;
    double e = 0;
    if (!backward) {
        attn_state_init(&s, o, lse);
        attn_forward_docs(&s, q, pos, doc, k, v, pos, doc, o, lse);
        finite = all_finite(o + hq, hq) && all_finite(lse + hr, hr);
        for (size_t i = 0; i < hq; i++) e = fmax(e, fabs(o[hq + i] - o1[i]) / FWD_ATOL);
    } else {
        for (size_t i = 0; i < hr; i++) {
            lse[i] = 0;
            lse[hr + i] = l1[i];
            delta[hr + i] = d1[i];
        }
        attn_backward_docs(&s, q, pos, doc, k, v, pos, doc, lse, delta, g, dq, dk, dv);
        finite = all_finite(dq + hq, hq) && all_finite(dk + hk, hk) && all_finite(dv + hk, hk);
        for (size_t i = 0; i < hq; i++) e = fmax(e, fabs(dq[hq + i] - dq1[i]) / BWD_ATOL);
        for (size_t i = 0; i < hk; i++) e = fmax(e, fmax(fabs(dk[hk + i] - dk1[i]), fabs(dv[hk + i] - dv1[i])) / BWD_ATOL);
    }
    CHECK(finite && e <= 1, "%s: documents of %d tokens on tile boundaries, the first NaN: the second is %s (%.3g x "
          "tolerance from itself alone): tiles wholly in another document were computed, not skipped",
          backward ? "backward" : "forward", L, finite ? "finite" : "NaN", e);
    float *fr[] = {q, k, v, g, o, lse, delta, dq, dk, dv, o1, l1, d1, dq1, dk1, dv1};
    for (size_t i = 0; i < ARRAY_LEN(fr); i++) xfree(fr[i]);
    xfree(pos);
    xfree(doc);
}

/* A window that leaves whole key tiles behind every query: keys at positions 0..3L-1 whose first L
 * (whole tiles of this path) are NaN, queries at 2L..3L-1 with window L, which see none of them:
 * o, lse, dq and the other keys' dk, dv must be finite and equal to the run without those keys,
 * and the NaN keys' dk, dv untouched (0). backward as nan_documents_case. */
static void window_skip_case(int backward, Rng *rng) {
    const SimdKernels *sk = simd();
    const int a = backward ? sk->bwd_bq : sk->fwd_bq, b = backward ? sk->bwd_bk : sk->fwd_bk;
    const int L = a / gcd(a, b) * b, nkv = 3 * L, H = 2, Hkv = 1, d = 32;
    const size_t nq = (size_t)L * H * d, nk = (size_t)nkv * Hkv * d, hk = (size_t)L * Hkv * d, hr = (size_t)L * H;
    int *qpos = xmalloc(sizeof(int) * (size_t)L), *kpos = xmalloc(sizeof(int) * (size_t)nkv);
    for (int i = 0; i < L; i++) qpos[i] = 2 * L + i;
    for (int j = 0; j < nkv; j++) kpos[j] = j;
    float *q = new_normal(nq, rng), *k = new_normal(nk, rng), *v = new_normal(nk, rng), *g = new_normal(nq, rng);
    AttnShape s = {.n_q = L, .n_kv = nkv, .n_heads = H, .n_kv_heads = Hkv, .head_dim = d, .scale = 0.2f,
                   .mask = ATTN_CAUSAL, .window = L};
    AttnShape s1 = s; /* keys L.. only, finite */
    s1.n_kv = nkv - L;
    float *o1 = xmalloc(sizeof(float) * nq), *l1 = xmalloc(sizeof(float) * hr), *d1 = xmalloc(sizeof(float) * hr);
    float *dq1 = xcalloc(nq, sizeof(float)), *dk1 = xcalloc(nk - hk, sizeof(float)), *dv1 = xcalloc(nk - hk, sizeof(float));
    attn_state_init(&s1, o1, l1);
    attn_forward(&s1, q, qpos, k + hk, v + hk, kpos + L, o1, l1);
    attn_backward_delta(&s1, o1, g, d1);
    attn_backward(&s1, q, qpos, k + hk, v + hk, kpos + L, l1, d1, g, dq1, dk1, dv1);
    for (size_t i = 0; i < hk; i++) k[i] = v[i] = NAN;
    float *o = xmalloc(sizeof(float) * nq), *lse = xmalloc(sizeof(float) * hr);
    float *dq = xcalloc(nq, sizeof(float)), *dk = xcalloc(nk, sizeof(float)), *dv = xcalloc(nk, sizeof(float));
    int finite;
    double e = 0;
    if (!backward) {
        attn_state_init(&s, o, lse);
        attn_forward(&s, q, qpos, k, v, kpos, o, lse);
        finite = all_finite(o, nq) && all_finite(lse, hr);
        for (size_t i = 0; i < nq; i++) e = fmax(e, fabs(o[i] - o1[i]) / FWD_ATOL);
        for (size_t i = 0; i < hr; i++) e = fmax(e, fabs(lse[i] - l1[i]) / FWD_ATOL);
    } else {
        attn_backward(&s, q, qpos, k, v, kpos, l1, d1, g, dq, dk, dv);
        finite = all_finite(dq, nq) && all_finite(dk, nk) && all_finite(dv, nk);
        for (size_t i = 0; i < hk; i++) finite &= dk[i] == 0 && dv[i] == 0;
        for (size_t i = 0; i < nq; i++) e = fmax(e, fabs(dq[i] - dq1[i]) / BWD_ATOL);
        for (size_t i = 0; i < nk - hk; i++) e = fmax(e, fmax(fabs(dk[hk + i] - dk1[i]), fabs(dv[hk + i] - dv1[i])) / BWD_ATOL);
    }
    CHECK(finite && e <= 1, "%s: window %d with the %d keys before every query's window NaN: %s, %.3g x tolerance from "
          "the run without them: tiles before the window were computed, not skipped", backward ? "backward" : "forward",
          L, L, finite ? "finite" : "NaN or touched", e);
    float *fr[] = {q, k, v, g, o, lse, dq, dk, dv, o1, l1, d1, dq1, dk1, dv1};
    for (size_t i = 0; i < ARRAY_LEN(fr); i++) xfree(fr[i]);
    xfree(qpos);
    xfree(kpos);
}

int main(void) {
    Rng rng;
    rng_seed(&rng, 20261122);
    double t0 = now_seconds();
    test_packing();
    test_visibility();
    test_flops(&rng);
    const int sizes[] = {1, 7, 100, 257, 700};
    const int dims[] = {32, 64, 128}, ratios[] = {1, 2, 4};
    int idx = 0;
    for (size_t si = 0; si < ARRAY_LEN(sizes); si++)
        for (int order = 0; order < N_ORDERS; order++)
            for (int mix = 0; mix < N_MIXES; mix++, idx++) {
                int d = dims[idx % 3], ratio = ratios[(idx / 3 + idx) % 3], Hkv = sizes[si] >= 700 ? 1 : 2;
                if (sizes[si] >= 257 && mix == DOCS_ONE && order != ORDER_RANDOM) continue; /* test_attention's ground */
                if (sizes[si] >= 700 && (mix != DOCS_RANDOM || order == ORDER_CONTIG)) continue; /* keep it short */
                packed_case(sizes[si], order, mix, ratio * Hkv, Hkv, d, 1 + idx % 3, 0, &rng);
            }
    /* sliding windows: 1 (each token alone), narrower than, about and wider than the tiles */
    const int wsizes[] = {7, 100, 257, 700}, windows[] = {1, 3, 17, 64, 150, 300};
    idx = 0;
    for (size_t si = 0; si < ARRAY_LEN(wsizes); si++)
        for (int order = 0; order < N_ORDERS; order++)
            for (int mix = 0; mix < N_MIXES; mix++, idx++) {
                int d = dims[idx % 3], ratio = ratios[(idx / 3 + idx) % 3], Hkv = wsizes[si] >= 700 ? 1 : 2;
                if (wsizes[si] >= 257 && mix == DOCS_SINGLETONS) continue; /* one-token documents need no window */
                if (wsizes[si] >= 700 && (order == ORDER_STRIPED || order == ORDER_RANDOM)) continue; /* keep it short */
                packed_case(wsizes[si], order, mix, ratio * Hkv, Hkv, d, 1 + idx % 3, windows[idx % ARRAY_LEN(windows)], &rng);
            }
    window_skip_case(0, &rng);
    window_skip_case(1, &rng);
    nan_documents_case(0, &rng);
    nan_documents_case(1, &rng);
    test_tiles_skipped(&rng);
    printf("test_packed_attention: %.1f s; largest violation (1 = at tolerance): forward %.3g, backward %.3g\n",
           now_seconds() - t0, g_worst_fwd, g_worst_bwd);
    return test_summary("test_packed_attention");
}
