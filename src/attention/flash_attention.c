/* Flash attention on the CPU (FlashAttention-2 schedule) for every seqpar strategy.
 *
 * Forward: one work item per (query head, query tile); the item keeps a running max m, sum l and
 * accumulator acc (tile x head_dim) seeded from the caller's (o, lse), so each call merges into
 * the caller's state. Scores are computed transposed, S^T = K Q^T (keys x queries): the query
 * tile is transposed once per item, the softmax runs down the columns vectorised across queries,
 * and acc += P V reads P as (S^T)^T. K and V of every kv head are copied once per call into
 * compact buffers (a head's rows are H*d apart, often a power of two, which thrashes the L1
 * sets), and the next tile is prefetched while the current scores are computed. A partially
 * visible tile runs in blocks of FA_QBLOCK queries, each stopping at its last visible key. Scores live in the base-2 domain
 * (alpha = scale * log2 e) so that one exp2 per score is all the softmax needs.
 * Backward: one work item per (key/value head, key tile) with the query heads of its GQA group
 * looped inside, so dk/dv of a tile have a single writer; K and V of the tile are transposed once
 * per item, and Q and dO of the kv head's query heads are copied once per kv head into compact
 * buffers. The items go to threads as they come free (heaviest first); dq has many writers and
 * goes to fixed slots (attn_backward_dq_slots: item i to slot i mod slots, in turn; slot 0 is dq
 * itself, the others copies), summed in slot order after each key/value head, so the gradients
 * never depend on timing. Where those dq copies and the Q/dO copies would
 * outgrow the kv head's own dK and dV (many threads, long calls: attn_backward_pass_rows), the kv
 * head runs in passes of one query head and a range of query rows each, the copies covering one
 * pass and dK/dV summed across passes: the same gradients bit for bit.
 *
 * Tile products, the column softmax and the row loops go through the kernel table chosen at run
 * time (kernels/isa.h, simd_body.h): an in-register micro-kernel on strided operands (no packing,
 * no beta pass: at these tile shapes OpenBLAS spent ~25% of the attention time packing and
 * zeroing), 6 x 64 with AVX-512, 6 x 16 with AVX2+FMA, plain C otherwise; the tile sizes come
 * from the same table.
 *
 * Masking works on tiles: from the min/max position of each query and key tile a tile pair is
 * fully visible (no mask work), fully hidden (skipped) or partial (elementwise -inf). Nothing is
 * proportional to n_q x n_kv: each thread's workspace is O(tile^2 + tile * head_dim), plus the
 * compact copies (forward: K and V of the call; backward: Q and dO of one pass) and for backward
 * one dq buffer of the pass's rows per dq slot beyond the first (with passes, the kv head's dK and
 * dV too).
 *
 * bf16 tiles (AttnShape.precision = PRECISION_BF16 on a CPU with AVX512_BF16, kernels/attn_bf16.h):
 * the same loops, with each product's operands packed into bf16 pair words (VDPBF16PS multiplies
 * pairs along the contraction dimension) instead of copied or transposed: forward K in rows
 * layout, Q^T and P^T in pairs layout (P^T from the fp32 probabilities, rounded after the softmax
 * and the running sum l used them in fp32); the forward's second product either acc +=
 * P V with P^T read transposed and V in pairs layout, or, where the table says so
 * (fwd_acc_transposed: the AMX tiles, which then load every operand of both forward products in
 * place), acc^T += V^T P^T with V^T in rows layout and the accumulator transposed (head_dim x
 * queries); backward Q, dO and dS in rows layout, K^T,
 * V^T, K, Q, dO, P and dS in pairs layout. Every product accumulates in fp32; scores, softmax,
 * lse, delta, dS = P (dP - delta) and the rescaling are fp32. The scores are stored unscaled and
 * alpha applied with the exponential (alpha s rounded first, the value a product with alpha would
 * have stored), and dS is packed as scale dS, so every bf16 product runs with alpha 1 (the AMX
 * tiles then store and accumulate straight from their accumulators). K and V (forward) and Q and dO
 * (backward, one kv head's query heads at a time) are packed once per call; P is packed by the
 * softmax pass itself and dS where it is computed (both layouts), so neither is stored in fp32.
 * The tiles have their own sizes (attn_bf16.h), even, so that tile pairs are the call's pairs.
 *
 * Sliding windows (AttnShape.window) ride on the same tiles: the spans' rule (attn_visibility) skips
 * a tile wholly before its queries' windows, and a tile across a window's lower edge is partial:
 * its elementwise mask hides the keys window or more positions back as well as the later ones.
 *
 * Not here: dropout, low-precision storage; inputs must be finite. */
#include "attention/flash_attention.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/op_clock.h"
#include "kernels/attn_bf16.h"
#include "kernels/isa.h"

/* Tile sizes come from the kernel table (isa.h): each instruction set's micro-kernel shape has its
 * own; any positive values are correct. */
#define FA_MAX_TILE 512
#define FA_SKEW 16 /* extra floats per buffer row: avoids power-of-two strides (cache-set conflicts) */
#define FA_QBLOCK 64 /* queries per block of a partially visible forward tile */

#define FA_LOG2E 1.4426950408889634
#define FA_LN2 0.6931471805599453
#define LAZY_MAX_LOG2 8.0f /* the bf16 forward's lazy rescaling: P below 2^8 */

/* Whether the key at kp is window (> 0) or more positions before the query at qp. */
static inline int before_window(int kp, int qp, int window) {
    return window > 0 && (long long)qp - kp >= window;
}

/* Whether the key at kp is hidden from the query at qp by causality or a window (0: none). */
static inline int key_hidden(int kp, int qp, int window) { return kp > qp || before_window(kp, qp, window); }

/* s[j] = -inf where kv_pos[j] > qp, or kv_pos[j] <= qp - window (window > 0) (causal and window
 * mask of one row). */
static inline void row_mask(float *restrict s, const int *restrict kv_pos, int n, int qp, int window) {
    if (window <= 0) {
        for (int j = 0; j < n; j++) s[j] = kv_pos[j] > qp ? -INFINITY : s[j];
        return;
    }
    for (int j = 0; j < n; j++) s[j] = key_hidden(kv_pos[j], qp, window) ? -INFINITY : s[j];
}

/* s[j] = -inf where row_mask hides it or kv_doc[j] != qd (causal, window and document mask of one
 * row). */
static inline void row_mask_docs(float *restrict s, const int *restrict kv_pos, const int *restrict kv_doc, int n,
                                 int qp, int qd, int window) {
    for (int j = 0; j < n; j++) s[j] = key_hidden(kv_pos[j], qp, window) || kv_doc[j] != qd ? -INFINITY : s[j];
}

/* ---------------------------------------------------------------------------------------------
 * Tiles and their visibility. */
enum { TILE_HIDDEN = ATTN_VIS_HIDDEN, TILE_PARTIAL = ATTN_VIS_PARTIAL, TILE_VISIBLE = ATTN_VIS_FULL };

AttnSpan attn_span(const int *pos, const int *doc, int n) {
    AttnSpan r = {INT_MAX, INT_MIN, 0, 0};
    for (int i = 0; i < n; i++) {
        if (pos[i] < r.pos_lo) r.pos_lo = pos[i];
        if (pos[i] > r.pos_hi) r.pos_hi = pos[i];
    }
    if (doc && n > 0) {
        r.doc_lo = r.doc_hi = doc[0];
        for (int i = 1; i < n; i++) {
            if (doc[i] < r.doc_lo) r.doc_lo = doc[i];
            if (doc[i] > r.doc_hi) r.doc_hi = doc[i];
        }
    }
    return r;
}

/* The span of every tile of `tile` rows (unused under ATTN_FULL: pos NULL). */
static void tile_ranges(const int *pos, const int *doc, int n, int tile, AttnSpan *out) {
    for (int t = 0; t * tile < n; t++) {
        int i0 = t * tile, i1 = i0 + tile < n ? i0 + tile : n;
        out[t] = pos ? attn_span(pos + i0, doc ? doc + i0 : NULL, i1 - i0) : (AttnSpan){INT_MAX, INT_MIN, 0, 0};
    }
}

AttnVisibility attn_visibility(AttnSpan q, AttnSpan k, int window) {
    if (k.pos_lo > q.pos_hi || k.doc_lo > q.doc_hi || k.doc_hi < q.doc_lo) return ATTN_VIS_HIDDEN;
    if (before_window(k.pos_hi, q.pos_lo, window)) return ATTN_VIS_HIDDEN; /* before every query's window */
    if (k.pos_hi <= q.pos_lo && q.doc_lo == q.doc_hi && k.doc_lo == k.doc_hi && k.doc_lo == q.doc_lo &&
        !before_window(k.pos_lo, q.pos_hi, window))
        return ATTN_VIS_FULL;
    return ATTN_VIS_PARTIAL;
}

static inline int tile_class(AttnMask mask, int window, AttnSpan q, AttnSpan k) {
    if (mask == ATTN_FULL) return TILE_VISIBLE;
    return (int)attn_visibility(q, k, window);
}

typedef struct { int cost, idx; } TileOrder;

static int cmp_cost_desc(const void *a, const void *b) {
    const TileOrder *x = a, *y = b;
    if (x->cost != y->cost) return y->cost - x->cost;
    return x->idx - y->idx;
}

static void check_shape(const AttnShape *s, const int *q_pos, const int *kv_pos, const int *q_doc,
                        const int *kv_doc, const char *who) {
    if (s->n_q < 0 || s->n_kv < 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0)
        die("%s: bad shape n_q=%d n_kv=%d n_heads=%d n_kv_heads=%d head_dim=%d", who, s->n_q, s->n_kv,
            s->n_heads, s->n_kv_heads, s->head_dim);
    if (s->n_heads % s->n_kv_heads != 0)
        die("%s: n_heads=%d is not a multiple of n_kv_heads=%d", who, s->n_heads, s->n_kv_heads);
    if (s->mask != ATTN_FULL && s->mask != ATTN_CAUSAL) die("%s: unknown mask %d", who, (int)s->mask);
    if (s->mask == ATTN_CAUSAL && ((!q_pos && s->n_q > 0) || (!kv_pos && s->n_kv > 0)))
        die("%s: causal attention needs q_pos and kv_pos", who);
    if ((q_doc == NULL) != (kv_doc == NULL))
        die("%s: document ids given for %s only: give both q_doc and kv_doc, or neither", who, q_doc ? "q" : "kv");
    if (q_doc && s->mask != ATTN_CAUSAL) die("%s: document ids need ATTN_CAUSAL", who);
    if (s->window < 0) die("%s: window %d is negative (0: no window)", who, s->window);
    if (s->window > 0 && s->mask != ATTN_CAUSAL) die("%s: a window needs ATTN_CAUSAL", who);
}

/* ---------------------------------------------------------------------------------------------
 * Simple operations. */
void attn_state_init(const AttnShape *s, float *o, float *lse) {
    size_t rows = (size_t)s->n_q * s->n_heads;
    memset(o, 0, rows * s->head_dim * sizeof(float));
    for (size_t i = 0; i < rows; i++) lse[i] = -INFINITY;
}

void attn_merge(int n_rows, int n_heads, int head_dim, float *o, float *lse, const float *o_b,
                const float *lse_b) {
    long long rows = (long long)n_rows * n_heads;
#pragma omp parallel for schedule(static) if (rows * head_dim > 65536)
    for (long long r = 0; r < rows; r++) {
        float a = lse[r], b = lse_b[r];
        float *orow = o + (size_t)r * head_dim;            /* (head_dim) */
        const float *brow = o_b + (size_t)r * head_dim;    /* (head_dim) */
        if (b == -INFINITY) continue;                      /* nothing new */
        if (a == -INFINITY) {                              /* nothing yet: take the partial */
            memcpy(orow, brow, (size_t)head_dim * sizeof(float));
            lse[r] = b;
            continue;
        }
        double mx = a > b ? a : b;
        double nl = mx + log1p(exp(-fabs((double)a - (double)b)));
        float wa = (float)exp((double)a - nl), wb = (float)exp((double)b - nl);
        for (int d = 0; d < head_dim; d++) orow[d] = wa * orow[d] + wb * brow[d];
        lse[r] = (float)nl;
    }
}

void attn_backward_delta(const AttnShape *s, const float *o, const float *dout, float *delta) {
    long long rows = (long long)s->n_q * s->n_heads;
    int d = s->head_dim;
#pragma omp parallel for schedule(static) if (rows * d > 65536)
    for (long long r = 0; r < rows; r++) {
        const float *a = o + (size_t)r * d, *b = dout + (size_t)r * d;
        double acc = 0.0;
        for (int k = 0; k < d; k++) acc += (double)a[k] * b[k];
        delta[r] = (float)acc;
    }
}

/* The first position a query at qp sees: qp - window + 1 (window > 0), else INT_MIN. */
static int window_start(int qp, int window) {
    if (window <= 0) return INT_MIN;
    const long long w = (long long)qp - window + 1;
    return w < INT_MIN ? INT_MIN : (int)w;
}

/* Entries of sorted[0..n) that are <= x (upper=1) or < x (upper=0). */
static int count_below(const int *sorted, int n, int x, int upper) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (sorted[mid] < x || (upper && sorted[mid] == x)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* (doc, pos) pairs in lexicographic order: the keys of one document are one sorted range. */
typedef struct { int doc, pos; } DocPos;

static int cmp_docpos(const void *a, const void *b) {
    const DocPos *x = a, *y = b;
    if (x->doc != y->doc) return (x->doc > y->doc) - (x->doc < y->doc);
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Index of the first entry > key (upper=1) or >= key (upper=0) in sorted[0..n). */
static int docpos_bound(const DocPos *sorted, int n, DocPos key, int upper) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = cmp_docpos(&sorted[mid], &key);
        if (c < 0 || (upper && c == 0)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

double attn_forward_flops_docs(const AttnShape *s, const int *q_pos, const int *q_doc, const int *kv_pos,
                               const int *kv_doc) {
    check_shape(s, q_pos, kv_pos, q_doc, kv_doc, "attn_forward_flops");
    if (!q_doc) return attn_forward_flops(s, q_pos, kv_pos);
    if (s->n_q == 0 || s->n_kv == 0) return 0.0;
    DocPos *sorted = xmalloc((size_t)s->n_kv * sizeof *sorted);
    for (int j = 0; j < s->n_kv; j++) sorted[j] = (DocPos){kv_doc[j], kv_pos[j]};
    qsort(sorted, (size_t)s->n_kv, sizeof *sorted, cmp_docpos);
    double pairs = 0;
    for (int i = 0; i < s->n_q; i++) /* keys of the query's document at or before it (and in its window) */
        pairs += docpos_bound(sorted, s->n_kv, (DocPos){q_doc[i], q_pos[i]}, 1) -
                 docpos_bound(sorted, s->n_kv, (DocPos){q_doc[i], window_start(q_pos[i], s->window)}, 0);
    xfree(sorted);
    return 4.0 * s->head_dim * (double)s->n_heads * pairs;
}

double attn_forward_flops(const AttnShape *s, const int *q_pos, const int *kv_pos) {
    check_shape(s, q_pos, kv_pos, NULL, NULL, "attn_forward_flops");
    double pairs;
    if (s->mask == ATTN_FULL || s->n_q == 0 || s->n_kv == 0) {
        pairs = (double)s->n_q * s->n_kv;
    } else {
        int *sorted = xmalloc((size_t)s->n_kv * sizeof(int));
        memcpy(sorted, kv_pos, (size_t)s->n_kv * sizeof(int));
        qsort(sorted, (size_t)s->n_kv, sizeof(int), cmp_int);
        pairs = 0;
        for (int i = 0; i < s->n_q; i++) /* keys with position in [window start, q_pos[i]] */
            pairs += count_below(sorted, s->n_kv, q_pos[i], 1) -
                     count_below(sorted, s->n_kv, window_start(q_pos[i], s->window), 0);
        xfree(sorted);
    }
    return 4.0 * s->head_dim * (double)s->n_heads * pairs;
}

/* dst (rows, cols; ld_dst) = src (rows, cols; ld_src): gathers a strided head slice into a
 * compact tile, so that the kernel's operand rows are not a power of two apart. */
static void copy_tile(int rows, int cols, const float *src, size_t ld_src, float *dst, size_t ld_dst) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * ld_dst, src + (size_t)r * ld_src, (size_t)cols * sizeof(float));
}

/* Zeroed, 64-byte aligned pair words (the bf16 tiles' workspace): padding a product reads but
 * no packer writes is then a finite value. The kernel's buffers, these and the fp32 ones, come
 * from xzalloc_filled: from 1 MiB the kernel's zero pages, in huge pages where granted, first
 * touched by the threads that fill them. A memset here was serial and took each 4 KiB page's
 * fault (8.2-9.2 ms of a 130 ms forward at S = 8192, d = 128, 4 heads on the AMX Xeon, 12% of it
 * on two threads). */
static bf16_pair *words_zeroed(size_t n) { return xzalloc_filled(n * sizeof(bf16_pair)); }

/* dst (d, ldd words) = the transposed pairs layout of fp32 src (rows, d; lds): row c holds column
 * c's pair words (an odd last row pairs with 0), the rows-layout A of a transposed product (the
 * forward's V^T, the backward's Q^T and dO^T), made as pairs (d words a row) in tmp first. */
static void pack_pairs_transposed(const AttnBf16Tiles *bt, const SimdKernels *sk, int rows, int d, const float *src,
                                  size_t lds, bf16_pair *tmp, bf16_pair *dst, size_t ldd) {
    bt->pack_pairs(rows, d, src, lds, tmp, (size_t)d);
    sk->transpose32((rows + 1) / 2, d, tmp, (size_t)d, dst, ldd);
}

const char *attn_kernel_name(Precision precision) {
    if (precision != PRECISION_BF16) return "fp32";
    const AttnBf16Tiles *bt = attn_bf16_tiles();
    return bt ? bt->name : "fp32 on bf16 inputs (conversion path)";
}

/* ---------------------------------------------------------------------------------------------
 * Forward. */
void attn_forward(const AttnShape *s, const float *q, const int *q_pos, const float *k,
                  const float *v, const int *kv_pos, float *o, float *lse) {
    attn_forward_docs(s, q, q_pos, NULL, k, v, kv_pos, NULL, o, lse);
}

static void forward_docs(const AttnShape *s, const float *q, const int *q_pos, const int *q_doc, const float *k,
                         const float *v, const int *kv_pos, const int *kv_doc, float *o, float *lse);

void attn_forward_docs(const AttnShape *s, const float *q, const int *q_pos, const int *q_doc, const float *k,
                       const float *v, const int *kv_pos, const int *kv_doc, float *o, float *lse) {
    const double t0 = op_clock_now();
    forward_docs(s, q, q_pos, q_doc, k, v, kv_pos, kv_doc, o, lse);
    op_clock_add(OPC_ATTN_FWD, t0);
}

/* mx (n) = the column maxima of the scores S^T (rows, n; ld) in log2 units: as stored (the fp32
 * kernel scales in its product), or (unscaled, the bf16 tiles) times alpha: the max of the scaled
 * scores, alpha > 0 and rounding being monotonic. */
static void col_max_scores(const SimdKernels *sk, int unscaled, const float *st, int rows, int n, size_t ld,
                           float alpha, float *mx) {
    sk->col_max(st, rows, n, ld, mx);
    if (unscaled)
        for (int i = 0; i < n; i++) mx[i] *= alpha;
}

static void forward_docs(const AttnShape *s, const float *q, const int *q_pos, const int *q_doc, const float *k,
                         const float *v, const int *kv_pos, const int *kv_doc, float *o, float *lse) {
    check_shape(s, q_pos, kv_pos, q_doc, kv_doc, "attn_forward");
    const int n_q = s->n_q, n_kv = s->n_kv, H = s->n_heads, Hkv = s->n_kv_heads, d = s->head_dim;
    if (n_q == 0 || n_kv == 0) return;
    const SimdKernels *sk = simd();
    const AttnBf16Tiles *bt = s->precision == PRECISION_BF16 ? attn_bf16_tiles() : NULL;
    const int acc_t = bt && bt->fwd_acc_transposed; /* acc^T += V^T P^T instead of acc += P V */
    const int group = H / Hkv, BQ = bt ? bt->fwd_bq : sk->fwd_bq, BK = bt ? bt->fwd_bk : sk->fwd_bk;
    if (BQ > FA_MAX_TILE) die("attn_forward: query tile %d exceeds %d", BQ, FA_MAX_TILE);
    const int nqt = (n_q + BQ - 1) / BQ, nkt = (n_kv + BK - 1) / BK;
    const size_t ldq = (size_t)H * d, ldk = (size_t)Hkv * d, ldt = (size_t)BQ + FA_SKEW;
    if (bt && !acc_t && (size_t)BQ + (size_t)bt->mr > ldt) /* P^T is read transposed, up to mr words past a row */
        die("internal: attn_forward: query tile %d plus the bf16 tiles' %d rows exceeds the stride %zu", BQ, bt->mr, ldt);
    const size_t ldc = (size_t)d + FA_SKEW; /* row stride of the compact k and v tiles */
    const float alpha = (float)(s->scale * FA_LOG2E); /* scores in log2 units */
    /* Lazy rescaling (bf16 tiles): a query's reference maximum m moves only when a block's maximum
     * exceeds it by more than LAZY_MAX_LOG2, so the accumulator is rescaled a few times per row
     * instead of at almost every key block (with 192 queries a block some query's maximum grows in
     * nearly every one); P = 2^(s - m) then stays below 2^LAZY_MAX_LOG2, exact in bf16's exponent
     * range, and l and the fp32 accumulator carry the factor until the final division. The fp32
     * kernel keeps the exact running maximum: its results are unchanged. */
    const float lazy_max = LAZY_MAX_LOG2;
    const AttnMask mask = s->mask;
    const int W = s->window;

    AttnSpan *qr = xmalloc((size_t)nqt * sizeof *qr), *kr = xmalloc((size_t)nkt * sizeof *kr);
    tile_ranges(mask == ATTN_CAUSAL ? q_pos : NULL, q_doc, n_q, BQ, qr);
    tile_ranges(mask == ATTN_CAUSAL ? kv_pos : NULL, kv_doc, n_kv, BK, kr);
    /* Heaviest query tiles first, so the dynamic schedule ends balanced. */
    TileOrder *order = xmalloc((size_t)nqt * sizeof *order);
    int n_busy = 0;
    for (int t = 0; t < nqt; t++) {
        int c = 0;
        for (int u = 0; u < nkt; u++) c += tile_class(mask, W, qr[t], kr[u]) != TILE_HIDDEN;
        if (c) order[n_busy++] = (TileOrder){c, t};
    }
    qsort(order, (size_t)n_busy, sizeof *order, cmp_cost_desc);

    const int nth = omp_get_max_threads();
    /* per thread: Q^T (d, ldt) | S^T (BK, ldt) | acc (BQ, d) or acc^T (d, ldt) | m, l, mx, msafe,
     * corr, sum (BQ) */
    const size_t acc_n = acc_t ? (size_t)d * ldt : (size_t)BQ * d;
    const size_t per_thread = ((size_t)d * ldt + (size_t)BK * ldt + acc_n + 6 * (size_t)BQ + 15) / 16 * 16;
    float *work = xzalloc_filled((size_t)nth * per_thread * sizeof(float));
    const long long n_items = (long long)n_busy * H;
    /* K and V of every kv head are packed once per call (every query tile reads them; copying a
     * tile per query tile instead measured ~10% of the forward at S = 8192): K in the panels of the
     * score product's micro-kernel (isa.h, attn_bf16.h: one sequential stream; a rows-layout K
     * read in place streams the block's rows at once, and that product ran 12-16% slower than the
     * second), a key tile's panels (BKp rows, BK rounded up to the panel rows) at a time, fp32
     * floats or bf16 pair words, (Hkv, nkt, BKp, d or d2); where the bf16 table has no panels
     * (AMX) K in rows layout, (Hkv, nkt, BK, ldkw) pair words. V as fp32 compact rows of ldc
     * floats, (Hkv, n_kv, ldc); under bf16 tiles in pairs layout, (Hkv, n_kv / 2, ldvw), or (acc_t)
     * V^T in rows layout a key tile at a time, (Hkv, nkt, d, ldvt) (a tile's V^T words pair its
     * keys; each tile contiguous, as K's: with V^T's rows the whole sequence long, a tile's 128
     * rows lay 16 KiB apart at S = 8192, a TLB page each), and per thread Q rows (BQ, d2) | Q^T
     * pairs (d2, ldt) | P^T pairs (BK/2, ldt; under acc_t first the V pairs of a key tile being
     * packed, (BK/2, d)). ldt >= BQ + mr where
     * P^T is read transposed. Key tiles start at even rows (BK even), so a tile's pairs are the
     * call's. */
    const int d2 = (d + 1) / 2, bk2 = (BK + 1) / 2, nkv2 = (n_kv + 1) / 2;
    const size_t ldkw = bt ? attn_bf16_rows_ld(bt, d2) : 0, ldvw = (size_t)d + FA_SKEW / 2;
    const size_t ldvt = ((size_t)bk2 + 15) / 16 * 16;
    const size_t pw_n = (size_t)bk2 * (acc_t && (size_t)d > ldt ? (size_t)d : ldt);
    const size_t per_thread_w = ((size_t)BQ * d2 + (size_t)d2 * ldt + pw_n + 15) / 16 * 16;
    bf16_pair *work_w = bt ? words_zeroed((size_t)nth * per_thread_w) : NULL;
    const int kpan = !bt || bt->tile_gemm_panels; /* K in panels */
    const int pmr = !bt ? sk->gemm_mr : bt->panel_mr, BKp = kpan ? (BK + pmr - 1) / pmr * pmr : 0;
    /* words or floats of one packed K tile, and where tile kt of kv head g starts */
    const size_t ktile_n = kpan ? (size_t)BKp * (bt ? d2 : d) : (size_t)BK * ldkw;
#define K_TILE_AT(base, g, kt) ((base) + ((size_t)(g) * nkt + (size_t)(kt)) * ktile_n)
    bf16_pair *Kall = bt ? words_zeroed((size_t)Hkv * nkt * ktile_n) : NULL;
    bf16_pair *Vall = bt && !acc_t ? words_zeroed((size_t)Hkv * nkv2 * ldvw) : NULL;
    bf16_pair *VTall = acc_t ? words_zeroed((size_t)Hkv * nkt * d * ldvt) : NULL;
#define VT_TILE_AT(g, kt) (VTall + ((size_t)(g) * nkt + (size_t)(kt)) * d * ldvt)
    float *Kf = bt ? NULL : xzalloc_filled((size_t)Hkv * nkt * ktile_n * sizeof(float));
    float *Vf = bt ? NULL : xzalloc_filled((size_t)Hkv * n_kv * ldc * sizeof(float));

#pragma omp parallel num_threads(nth)
    {
        float *Qt = work + (size_t)omp_get_thread_num() * per_thread; /* (d, bq) transposed q tile */
        float *ST = Qt + (size_t)d * ldt;                             /* (bk, bq) scores^T / probs^T */
        float *acc = ST + (size_t)BK * ldt;                           /* (bq, d); acc_t: (d, ldt) */
        float *m = acc + acc_n;                                       /* (bq) running max, log2 */
        float *l = m + BQ;                                            /* (bq) running sum */
        float *mx = l + BQ, *msafe = mx + BQ, *corr = msafe + BQ, *sum = corr + BQ; /* (bq) each */
        unsigned char seen[FA_MAX_TILE];
        bf16_pair *Qr = NULL, *Qw = NULL, *Pw = NULL;
        if (bt) {
            Qr = work_w + (size_t)omp_get_thread_num() * per_thread_w; /* (bq, d2) Q rows */
            Qw = Qr + (size_t)BQ * d2;                                /* (d2, bq) Q^T pairs */
            Pw = Qw + (size_t)d2 * ldt;                               /* (bk/2, bq) P^T pairs */
        }
#pragma omp for schedule(static)
        for (long long t = 0; t < (long long)Hkv * nkt; t++) { /* K, V of every kv head: rows, or packed */
            const int g = (int)(t / nkt), j0 = (int)(t % nkt) * BK, bk = j0 + BK <= n_kv ? BK : n_kv - j0;
            const float *ks = k + ((size_t)j0 * Hkv + g) * d, *vs = v + ((size_t)j0 * Hkv + g) * d;
            if (bt) {
                if (kpan) bt->pack_panels(bk, d, ks, ldk, K_TILE_AT(Kall, g, t % nkt));
                else bt->pack_rows(bk, d, ks, ldk, K_TILE_AT(Kall, g, t % nkt), ldkw);
                if (!acc_t) {
                    bt->pack_pairs(bk, d, vs, ldk, Vall + ((size_t)g * nkv2 + j0 / 2) * ldvw, ldvw);
                } else { /* V's pairs (an odd last key pairs with 0), then as V^T rows */
                    pack_pairs_transposed(bt, sk, bk, d, vs, ldk, Pw, VT_TILE_AT(g, t % nkt), ldvt);
                }
            } else {
                sk->pack_panels(bk, d, ks, ldk, K_TILE_AT(Kf, g, t % nkt));
                copy_tile(bk, d, vs, ldk, Vf + ((size_t)g * n_kv + j0) * ldc, ldc);
            }
        } /* implicit barrier: every tile is packed */

#pragma omp for schedule(dynamic, 1)
        for (long long w = 0; w < n_items; w++) {
            /* head-major: the threads work on one head at a time and share its K/V in L3 */
            const int h = (int)(w / n_busy), qt = order[w % n_busy].idx, g = h / group;
            if (s->progress && w > 0 && omp_get_thread_num() == 0) s->progress(s->progress_arg);
            const int i0 = qt * BQ, bq = i0 + BQ <= n_q ? BQ : n_q - i0;
            if (bt) {
                bt->pack_rows(bq, d, q + ((size_t)i0 * H + h) * d, ldq, Qr, (size_t)d2);
                sk->transpose32(bq, d2, Qr, (size_t)d2, Qw, ldt);
            } else {
                sk->transpose32(bq, d, q + ((size_t)i0 * H + h) * d, ldq, Qt, ldt);
            }
            for (int r = 0; r < bq; r++) {
                size_t row = (size_t)(i0 + r) * H + h;
                float L = lse[row];
                seen[r] = 0;
                if (L == -INFINITY) {
                    m[r] = -INFINITY;
                    l[r] = 0.0f;
                    if (acc_t)
                        for (int c = 0; c < d; c++) acc[(size_t)c * ldt + r] = 0.0f;
                    else
                        memset(acc + (size_t)r * d, 0, (size_t)d * sizeof(float));
                } else {
                    m[r] = (float)(L * FA_LOG2E);
                    l[r] = 1.0f;
                    if (acc_t)
                        for (int c = 0; c < d; c++) acc[(size_t)c * ldt + r] = o[row * d + c];
                    else
                        memcpy(acc + (size_t)r * d, o + row * d, (size_t)d * sizeof(float));
                }
            }
            for (int kt = 0; kt < nkt; kt++) {
                const int cls = tile_class(mask, W, qr[qt], kr[kt]);
                if (cls == TILE_HIDDEN) continue;
                const int j0 = kt * BK, bk = j0 + BK <= n_kv ? BK : n_kv - j0;
                /* this tile's packed K and V, and the next visible tile's to prefetch (contiguous:
                 * rows of one 64-byte line) */
                const bf16_pair *Kw = bt ? K_TILE_AT(Kall, g, kt) : NULL;
                const bf16_pair *Vw = bt && !acc_t ? Vall + ((size_t)g * nkv2 + j0 / 2) * ldvw : NULL;
                const bf16_pair *VTw = acc_t ? VT_TILE_AT(g, kt) : NULL;
                const float *Kc = bt ? NULL : K_TILE_AT(Kf, g, kt);
                const float *Vc = bt ? NULL : Vf + ((size_t)g * n_kv + j0) * ldc;
                /* K and V are contiguous (rows of one 64-byte line), prefetched during the score
                 * product; under acc_t K so, and V^T's tile during acc^T's */
                Prefetch pf = {.lines_per_row = 1}, pfv = {.lines_per_row = 1}; /* empty */
                for (int nt = kt + 1; nt < nkt; nt++) {
                    if (tile_class(mask, W, qr[qt], kr[nt]) == TILE_HIDDEN) continue;
                    const int n0 = nt * BK, nb = n0 + BK <= n_kv ? BK : n_kv - n0;
                    const size_t bytes = bt ? (size_t)nb * ldkw * sizeof(bf16_pair) : (size_t)nb * ldc * sizeof(float);
                    const void *kb = bt ? (const void *)K_TILE_AT(Kall, g, nt) : (const void *)K_TILE_AT(Kf, g, nt);
                    const void *vb = acc_t ? NULL
                                     : bt  ? (const void *)(Vall + ((size_t)g * nkv2 + n0 / 2) * ldvw)
                                           : (const void *)(Vf + ((size_t)g * n_kv + n0) * ldc);
                    prefetch_pair(&pf, kb, vb, bytes);
                    if (acc_t) prefetch_pair(&pfv, VT_TILE_AT(g, nt), NULL, (size_t)d * ldvt * sizeof(bf16_pair));
                    break;
                }
                /* A partial tile runs in blocks of FA_QBLOCK queries: no key row at or past jend[b]
                 * is visible to block b (each is later than the block's latest query), so block b's
                 * products, mask and softmax stop there. The rows skipped would hold p = 0 exactly,
                 * so the result is the whole tile's. */
                int jend[FA_MAX_TILE / FA_QBLOCK + 1], nblk = 1, bw = bq;
                jend[0] = bk;
                if (cls == TILE_PARTIAL) {
                    nblk = (bq + FA_QBLOCK - 1) / FA_QBLOCK;
                    bw = FA_QBLOCK;
                    for (int b = 0; b < nblk; b++) {
                        const int c0 = b * bw, c1 = c0 + bw < bq ? c0 + bw : bq;
                        int maxq = INT_MIN, je = 0;
                        for (int i = c0; i < c1; i++) maxq = q_pos[i0 + i] > maxq ? q_pos[i0 + i] : maxq;
                        for (int j = 0; j < bk; j++)
                            if (kv_pos[j0 + j] <= maxq) je = j + 1;
                        jend[b] = je;
                    }
                }
                /* bf16 tiles on a tile every key of which every query sees, with every query's reference
                 * maximum set: the softmax step first tries the current maxima, finding the block's
                 * largest arguments as it goes, so that the separate pass for the column maxima (a
                 * read of S^T from L2, 7% of the AMX forward at d = 64) is needed only where a maximum
                 * moves (the lazy rule: by more than lazy_max) */
                int try_m = bt && cls != TILE_PARTIAL;
                for (int i = 0; i < bq && try_m; i++) try_m = m[i] != -INFINITY;
                for (int b = 0; b < nblk; b++) {
                    /* S^T (je, cw) = alpha K (je, d) Q^T (d, cw) of this block's queries, masked */
                    const int c0 = b * bw, cw = c0 + bw < bq ? bw : bq - c0, je = jend[b];
                    /* (the bf16 tiles store K Q^T unscaled and apply alpha in the softmax step:
                     * AMX stores a product with alpha 1 straight from its tiles) */
                    if (bt && kpan) bt->tile_gemm_panels(je, cw, d2, 1.0f, Kw, Qw + c0, ldt, 0, ST + c0, ldt, &pf);
                    else if (bt) bt->tile_gemm(je, cw, d2, 1.0f, Kw, ldkw, 1, Qw + c0, ldt, 0, ST + c0, ldt, &pf);
                    else sk->tile_gemm_panels(je, cw, d, alpha, Kc, Qt + c0, ldt, 0, ST + c0, ldt, &pf);
                    if (cls == TILE_PARTIAL)
                        for (int j = 0; j < je; j++) {
                            const int kp = kv_pos[j0 + j], kd = q_doc ? kv_doc[j0 + j] : 0;
                            if (kp <= qr[qt].pos_lo && (!q_doc || (kd == qr[qt].doc_lo && kd == qr[qt].doc_hi)) &&
                                !before_window(kp, qr[qt].pos_hi, W))
                                continue; /* every query of the tile sees this key */
                            float *row = ST + (size_t)j * ldt;
                            const int *qp = q_pos + i0, *qd = q_doc ? q_doc + i0 : NULL;
                            if (!q_doc && W <= 0)
                                for (int i = c0; i < c0 + cw; i++) row[i] = kp > qp[i] ? -INFINITY : row[i];
                            else if (!q_doc)
                                for (int i = c0; i < c0 + cw; i++) row[i] = key_hidden(kp, qp[i], W) ? -INFINITY : row[i];
                            else
                                for (int i = c0; i < c0 + cw; i++)
                                    row[i] = key_hidden(kp, qp[i], W) || kd != qd[i] ? -INFINITY : row[i];
                        }
                    if (!try_m) col_max_scores(sk, bt != NULL, ST + c0, je, cw, ldt, alpha, mx + c0);
                }
                int settled = 0; /* P, its sums and l done by the try */
                if (try_m) { /* one block (no partial tile): c0 0, cw bq, je bk */
                    bt->col_exp2_pairs(ST, bk, bq, ldt, alpha, m, sum, Pw, ldt, mx);
                    /* no argument within a quarter of the threshold: the rule below, on the maxima, would
                     * keep every m too (for |m| < 2^21), and its step would make these same P, sums and
                     * l (m - m = 0, a factor of 1): the results are bit for bit those of that path */
                    int moves = 0;
                    for (int i = 0; i < bq; i++) moves |= mx[i] > lazy_max - 0.25f;
                    if (!moves) {
                        for (int i = 0; i < bq; i++) {
                            seen[i] |= mx[i] != -INFINITY;
                            l[i] += sum[i]; /* m stays: no rescaling */
                        }
                        settled = 1;
                    } else { /* the maxima after all, and the usual step below (P made again) */
                        col_max_scores(sk, 1, ST, bk, bq, ldt, alpha, mx);
                    }
                }
                if (!settled) {
                    for (int i = 0; i < bq; i++) { /* bf16 tiles: the reference maximum moves only past lazy_max */
                        float mnew = !bt ? (m[i] > mx[i] ? m[i] : mx[i]) : mx[i] > m[i] + lazy_max ? mx[i] : m[i];
                        seen[i] |= mx[i] != -INFINITY;
                        msafe[i] = mnew == -INFINITY ? 0.0f : mnew; /* a column with no key yet: p = 0 */
                        corr[i] = m[i] - msafe[i];                  /* exponent of the rescaling */
                        m[i] = mnew;
                    }
                    sk->row_exp2_sum(corr, bq, 0.0f); /* corr = 2^(m_old - m_new), 0 when m was -inf */
                    for (int b = 0; b < nblk; b++) { /* P^T: bf16 pairs (never stored in fp32), or in place */
                        const int c0 = b * bw, cw = c0 + bw < bq ? bw : bq - c0;
                        if (bt)
                            bt->col_exp2_pairs(ST + c0, jend[b], cw, ldt, alpha, msafe + c0, sum + c0, Pw + c0, ldt,
                                               NULL);
                        else sk->col_exp2_sum(ST + c0, jend[b], cw, ldt, msafe + c0, sum + c0);
                    }
                    int rescale = 0;
                    for (int i = 0; i < bq; i++) {
                        l[i] = l[i] * corr[i] + sum[i];
                        rescale |= corr[i] != 1.0f;
                        if (!acc_t && corr[i] != 1.0f) sk->scale_row(acc + (size_t)i * d, d, corr[i]);
                    }
                    if (acc_t && rescale) sk->scale_cols(acc, d, bq, ldt, corr);
                }
                for (int b = 0; b < nblk; b++) {
                    /* acc (cw, d) += P (cw, je) V (je, d), P read as (S^T)^T; or acc^T (d, cw) +=
                     * V^T (d, je) P^T (je, cw) */
                    const int c0 = b * bw, cw = c0 + bw < bq ? bw : bq - c0, je = jend[b];
                    float *ab = acc + (size_t)c0 * d;
                    if (acc_t)
                        bt->tile_gemm(d, cw, (je + 1) / 2, 1.0f, VTw, ldvt, 1, Pw + c0, ldt, 1, acc + c0, ldt,
                                      b == 0 ? &pfv : NULL);
                    else if (bt)
                        bt->tile_gemm(cw, d, (je + 1) / 2, 1.0f, Pw + c0, 1, ldt, Vw, ldvw, 1, ab, (size_t)d, NULL);
                    else
                        sk->tile_gemm(cw, d, je, 1.0f, ST + c0, 1, ldt, Vc, ldc, 1, ab, (size_t)d, NULL);
                }
            }
            for (int r = 0; r < bq; r++) {
                if (!seen[r]) continue; /* no visible key in this call: state unchanged */
                size_t row = (size_t)(i0 + r) * H + h;
                float inv = 1.0f / l[r];
                float *orow = o + row * d;
                if (acc_t)
                    for (int c = 0; c < d; c++) orow[c] = acc[(size_t)c * ldt + r] * inv;
                else
                    for (int c = 0; c < d; c++) orow[c] = acc[(size_t)r * d + c] * inv;
                lse[row] = (float)(((double)m[r] + log2((double)l[r])) * FA_LN2);
            }
        }
    }
    xfree(work);
    xfree(work_w);
#undef K_TILE_AT
#undef VT_TILE_AT
    xfree(Kall);
    xfree(Vall);
    xfree(VTall);
    xfree(Kf);
    xfree(Vf);
    xfree(order);
    xfree(qr);
    xfree(kr);
}

/* ---------------------------------------------------------------------------------------------
 * Backward. */
/* SEQPAR_ATTN_DQ_SLOTS and SEQPAR_ATTN_BWD_ROWS: their values (0 where unset or empty), or -1 with
 * the one-line message in err */
static long env_dq_slots(char *err, size_t n) {
    const char *env = getenv("SEQPAR_ATTN_DQ_SLOTS");
    if (!env || !*env) return 0;
    char *end;
    long v = strtol(env, &end, 10);
    if (*end || !is_decimal_number(env, 0) || v < 1 || v > 1024) {
        snprintf(err, n, "SEQPAR_ATTN_DQ_SLOTS=%.40s: expected the number of dq accumulators of the attention "
                 "backward, 1..1024", env);
        return -1;
    }
    return v;
}

static long env_bwd_rows(char *err, size_t n) {
    const char *env = getenv("SEQPAR_ATTN_BWD_ROWS");
    if (!env || !*env) return 0;
    char *end;
    long v = strtol(env, &end, 10);
    if (*end || !is_decimal_number(env, 0) || v <= 0 || v > INT_MAX / 2) {
        snprintf(err, n, "SEQPAR_ATTN_BWD_ROWS=%.40s: expected a positive number of query rows per backward pass",
                 env);
        return -1;
    }
    return v;
}

int attn_env_check(char *err, size_t n) { return env_dq_slots(err, n) < 0 || env_bwd_rows(err, n) < 0; }

int attn_backward_dq_slots(int threads) {
    char err[160];
    const long v = env_dq_slots(err, sizeof err);
    if (v < 0) die("%s", err);
    if (v > 0) return (int)v;
    return threads <= 1 ? 1 : 2 * threads;
}

/* A thread's wait for its turn at a dq slot: short (the slot's previous key tile was taken
 * 2 x threads tiles earlier, by default), so a spin; past a few thousand rounds it yields the core
 * (more threads than cores: the thread it waits for may need it). */
static void wait_turn(atomic_int *turn, int mine) {
    for (unsigned spins = 0; atomic_load_explicit(turn, memory_order_acquire) != mine; spins++) {
        if (spins >= 4096) {
            sched_yield();
            continue;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

int attn_backward_pass_rows(int n_q, int n_kv, int group, int head_dim, int bq, int bf16_tiles, int threads) {
    if (n_q <= 0 || bq <= 0) return n_q > 0 ? n_q : 0;
    char err[160];
    long r = env_bwd_rows(err, sizeof err);
    if (r < 0) die("%s", err);
    if (r > 0) {
        r = (r + bq - 1) / bq * bq;
        return r < n_q ? (int)r : n_q;
    }
    const int slots = attn_backward_dq_slots(threads);
    const double d = head_dim, ldc = d + FA_SKEW, d2 = (head_dim + 1) / 2;
    /* words per query row of the compact Q and dO copies: fp32 rows, or bf16 rows and pairs */
    const AttnBf16Tiles *bt = bf16_tiles ? attn_bf16_tiles() : NULL;
    const double ldkw = bt ? (double)attn_bf16_rows_ld(bt, (int)d2) : d2 + ATTN_BF16_ROW_SKEW;
    const double copy_row = bf16_tiles ? 2 * ldkw + (d + FA_SKEW / 2) : 2 * ldc;
    const double whole = (slots - 1.0) * n_q * group * d + (double)group * n_q * copy_row;
    const double per_row = (slots - 1.0) * d + copy_row, acc = 2.0 * n_kv * d;
    double c = acc / per_row; /* per-pass buffers about the size of the kv head's dK and dV */
    if (c < 2048) c = 2048;
    const double rows = ceil(c / bq) * bq;
    if (rows >= n_q || per_row * (double)rows + acc >= whole) return n_q;
    return (int)rows;
}

void attn_backward(const AttnShape *s, const float *q, const int *q_pos, const float *k,
                   const float *v, const int *kv_pos, const float *lse, const float *delta,
                   const float *dout, float *dq, float *dk, float *dv) {
    attn_backward_docs(s, q, q_pos, NULL, k, v, kv_pos, NULL, lse, delta, dout, dq, dk, dv);
}

static void backward_docs(const AttnShape *s, const float *q, const int *q_pos, const int *q_doc, const float *k,
                          const float *v, const int *kv_pos, const int *kv_doc, const float *lse, const float *delta,
                          const float *dout, float *dq, float *dk, float *dv);

void attn_backward_docs(const AttnShape *s, const float *q, const int *q_pos, const int *q_doc, const float *k,
                        const float *v, const int *kv_pos, const int *kv_doc, const float *lse, const float *delta,
                        const float *dout, float *dq, float *dk, float *dv) {
    const double t0 = op_clock_now();
    backward_docs(s, q, q_pos, q_doc, k, v, kv_pos, kv_doc, lse, delta, dout, dq, dk, dv);
    op_clock_add(OPC_ATTN_BWD, t0);
}

/* Rows [off, off + rows x ld) of a backward input, rows of d floats ld apart: the fp32 array's
 * own, or (bf16 inputs, AttnShape.q16 ..) those rows widened into tmp, d apart (by the dispatched
 * kernel itself: bf16_unpack's OpenMP region, entered per row, cost the backward 10%); *ld_out:
 * their stride. */
static const float *input_rows(const float *f, const bf16_t *h, size_t off, int rows, int d, size_t ld, float *tmp,
                               size_t *ld_out) {
    if (!h) {
        *ld_out = ld;
        return f + off;
    }
    const Bf16Kernels *bk = bf16_kernels();
    for (int r = 0; r < rows; r++) bk->unpack(tmp + (size_t)r * d, h + off + (size_t)r * ld, (size_t)d);
    *ld_out = (size_t)d;
    return tmp;
}

static void backward_docs(const AttnShape *s, const float *q, const int *q_pos, const int *q_doc, const float *k,
                          const float *v, const int *kv_pos, const int *kv_doc, const float *lse, const float *delta,
                          const float *dout, float *dq, float *dk, float *dv) {
    check_shape(s, q_pos, kv_pos, q_doc, kv_doc, "attn_backward");
    const int n_q = s->n_q, n_kv = s->n_kv, H = s->n_heads, Hkv = s->n_kv_heads, d = s->head_dim;
    if (n_q == 0 || n_kv == 0 || (!dq && !dk && !dv)) return;
    const SimdKernels *sk = simd();
    const AttnBf16Tiles *bt = s->precision == PRECISION_BF16 ? attn_bf16_tiles() : NULL;
    const int group = H / Hkv, BQ = bt ? bt->bwd_bq : sk->bwd_bq, BK = bt ? bt->bwd_bk : sk->bwd_bk;
    if (BQ > FA_MAX_TILE) die("attn_backward: query tile %d exceeds %d", BQ, FA_MAX_TILE);
    const int nqt = (n_q + BQ - 1) / BQ, nkt = (n_kv + BK - 1) / BK;
    const size_t ldq = (size_t)H * d, ldk = (size_t)Hkv * d, ldp = (size_t)BK + FA_SKEW;
    if (bt && (size_t)BK + (size_t)bt->mr > ldp) /* P and dS pairs are read transposed, up to mr words past */
        die("internal: attn_backward: key tile %d plus the bf16 tiles' %d rows exceeds the stride %zu", BK, bt->mr, ldp);
    const size_t ldc = (size_t)d + FA_SKEW; /* row stride of the compact k, q and dout tiles */
    const float alpha = (float)(s->scale * FA_LOG2E), scale = s->scale;
    const AttnMask mask = s->mask;
    const int W = s->window;

    AttnSpan *qr = xmalloc((size_t)nqt * sizeof *qr), *kr = xmalloc((size_t)nkt * sizeof *kr);
    tile_ranges(mask == ATTN_CAUSAL ? q_pos : NULL, q_doc, n_q, BQ, qr);
    tile_ranges(mask == ATTN_CAUSAL ? kv_pos : NULL, kv_doc, n_kv, BK, kr);
    TileOrder *order = xmalloc((size_t)nkt * sizeof *order);
    int n_busy = 0;
    for (int u = 0; u < nkt; u++) {
        int c = 0;
        for (int t = 0; t < nqt; t++) c += tile_class(mask, W, qr[t], kr[u]) != TILE_HIDDEN;
        if (c) order[n_busy++] = (TileOrder){c, u};
    }
    qsort(order, (size_t)n_busy, sizeof *order, cmp_cost_desc);

    const int nth = omp_get_max_threads(), nslots = attn_backward_dq_slots(nth);
    /* a pass's key tiles in order (those its queries see), each with its dq slot (by its place in
     * the whole order, so that passes sum alike) and its turn there; each slot's next turn */
    typedef struct { int kt, slot, turn; } BwdItem;
    BwdItem *items = xmalloc(((size_t)n_busy + 1) * sizeof *items);
    int n_items = 0, *slot_items = xmalloc((size_t)nslots * sizeof *slot_items);
    atomic_int *turn = xmalloc((size_t)nslots * sizeof *turn);
    /* Passes over each kv head's query heads and rows (attn_backward_pass_rows): one covering all
     * (PR = n_q), or one per (query head, PR rows), with dK and dV accumulated across the passes in
     * (n_kv, d) buffers of the kv head. Either way every dK / dV row sums its terms in the order
     * (query head, query tile), and every dq row its slot's terms in the order of that slot's key
     * tiles, then the slots' in slot order: the same gradients bit for bit. */
    const int PR = attn_backward_pass_rows(n_q, n_kv, group, d, BQ, bt != NULL, nth);
    const int passes_on = PR < n_q, ph = passes_on ? 1 : group; /* query heads per pass */
    const int n_pass = passes_on ? group * ((n_q + PR - 1) / PR) : 1;
    /* per thread: K^T, V^T (d, ldp) | P, dP (BQ, ldp) | dK acc, dV acc (BK, d) | K (BK, ldc) | with
     * bf16 inputs, a tile of them widened (max(BQ, BK), d) */
    const int in16 = s->q16 != NULL;
    if (in16 && (!s->k16 || !s->v16)) die("internal: attn_backward: bf16 q given without bf16 k and v");
    const size_t wide_n = in16 ? (size_t)(BQ > BK ? BQ : BK) * d : 0;
    const size_t per_thread =
        (2 * (size_t)d * ldp + 2 * (size_t)BQ * ldp + 2 * (size_t)BK * d + (size_t)BK * ldc + wide_n + 15) / 16 * 16;
    float *work = xzalloc_filled((size_t)nth * per_thread * sizeof(float));
    /* dq slots 1.. : (PR, ph, d) each, for the query heads and rows of the current pass */
    const size_t dq_elems = (size_t)PR * ph * d;
    float **dqbuf = xcalloc((size_t)nslots, sizeof *dqbuf);
    if (dq)
        for (int t = 1; t < nslots; t++) dqbuf[t] = xzalloc_filled(dq_elems * sizeof(float));
    /* with passes: the kv head's dK and dV, (n_kv, d) each, across its passes */
    float *dKall = passes_on && dk ? xzalloc_filled((size_t)n_kv * d * sizeof(float)) : NULL;
    float *dVall = passes_on && dv ? xzalloc_filled((size_t)n_kv * d * sizeof(float)) : NULL;
    /* bf16 tiles: Q and dO of the current pass (ph query heads, PR rows) in rows and pairs layouts,
     * packed once per pass (every key tile reads them), (ph, PR, ldkw) and (ph, PR / 2, ldvw) pair
     * words each; per thread: K^T, V^T pairs (d2, ldp) | K pairs (BK/2, ldc) | K or V rows (BK, d2)
     * | P or dS pairs (BQ/2, ldp) | dS rows (BQ, ldsw). ldp >= BK + mr: P and dS pairs are read
     * transposed. Query tiles and passes start at even rows (BQ even), so a tile's pairs are the
     * pass's. */
    const int d2 = (d + 1) / 2, bk2 = (BK + 1) / 2, bq2 = (BQ + 1) / 2, pr2 = (PR + 1) / 2;
    const size_t ldkw = bt ? attn_bf16_rows_ld(bt, d2) : 0, ldvw = (size_t)d + FA_SKEW / 2;
    const size_t ldsw = (size_t)bk2 + FA_SKEW;
    const size_t per_thread_w = (2 * (size_t)d2 * ldp + (size_t)bk2 * ldc + (size_t)BK * d2 + (size_t)bq2 * ldp +
                                 (size_t)BQ * ldsw + 15) / 16 * 16;
    bf16_pair *work_w = bt ? words_zeroed((size_t)nth * per_thread_w) : NULL;
    /* bwd_acc_transposed (the AMX tiles): dK and dV accumulate transposed, dK^T (d, bk) += Q^T (d,
     * bq) dS (bq, bk) and dV^T += dO^T P, so that every operand of the five products loads in
     * place (dS and P as their pairs, Q^T and dO^T in rows layout) instead of P^T and dS^T being
     * transposed into the tiles' A panels; Q^T and dO^T are packed once per pass, a query tile at a
     * time, (ph, nqp, d, ldqt) words each (each tile contiguous, as the forward's V^T), in place of
     * Q's and dO's pairs. The per-thread dK and dV sums are then (d, BK), turned back into rows as
     * they are added to dk, dv (or dKall, dVall) at the end of each key tile. */
    const int acc_tb = bt && bt->bwd_acc_transposed && (size_t)bq2 <= ldp; /* a tile's Q pairs fit Vt */
    const int nqp = (PR + BQ - 1) / BQ; /* query tiles per pass */
    const size_t ldqt = ((size_t)bq2 + 15) / 16 * 16;
    const size_t rows_w = (size_t)ph * PR * ldkw, pairs_w = acc_tb ? (size_t)ph * nqp * d * ldqt : (size_t)ph * pr2 * ldvw;
    bf16_pair *Qrows = bt ? words_zeroed(rows_w) : NULL, *dOrows = bt && (dq || dk) ? words_zeroed(rows_w) : NULL;
    /* Q and dO pairs (ph, PR / 2, ldvw), or under acc_tb Q^T and dO^T rows */
    bf16_pair *Qpairs = bt && dk ? words_zeroed(pairs_w) : NULL, *dOpairs = bt && dv ? words_zeroed(pairs_w) : NULL;
#define QT_TILE_AT(base, hp, t) ((base) + ((size_t)(hp) * nqp + (size_t)(t)) * d * ldqt)
    /* fp32: Q and dO of the current pass, compact rows of ldc, (ph, PR, ldc) each, copied once per
     * pass (every key tile reads them; a copy per tile pair measured ~6% of the backward at
     * S = 8192) */
    float *Qf = bt ? NULL : xzalloc_filled((size_t)ph * PR * ldc * sizeof(float));
    float *dOf = bt ? NULL : xzalloc_filled((size_t)ph * PR * ldc * sizeof(float));

#pragma omp parallel num_threads(nth)
    {
        const int tid = omp_get_thread_num();
        float *Kt = work + (size_t)tid * per_thread; /* (d, bk) transposed k tile */
        float *Vt = Kt + (size_t)d * ldp;            /* (d, bk) transposed v tile */
        float *P = Vt + (size_t)d * ldp;             /* (bq, bk) probabilities, then dS */
        float *dP = P + (size_t)BQ * ldp;            /* (bq, bk) */
        float *dKa = dP + (size_t)BQ * ldp;          /* (bk, d) */
        float *dVa = dKa + (size_t)BK * d;           /* (bk, d) */
        float *Kc = dVa + (size_t)BK * d;            /* (bk, d) compact k tile */
        float *Wide = Kc + (size_t)BK * ldc;         /* bf16 inputs: a tile widened */
        bf16_pair *KTw = NULL, *VTw = NULL, *Kp = NULL, *Tr = NULL, *Pp = NULL, *dSr = NULL;
        if (bt) {
            KTw = work_w + (size_t)tid * per_thread_w; /* (d2, bk) K^T pairs */
            VTw = KTw + (size_t)d2 * ldp;              /* (d2, bk) V^T pairs */
            Kp = VTw + (size_t)d2 * ldp;               /* (bk/2, d) K pairs */
            Tr = Kp + (size_t)bk2 * ldc;               /* (bk, d2) K or V rows, before transposing */
            Pp = Tr + (size_t)BK * d2;                 /* (bq/2, bk) P, then dS, pairs */
            dSr = Pp + (size_t)bq2 * ldp;              /* (bq, bk/2) dS rows */
        }
        for (int g = 0; g < Hkv; g++) {
            const int h0 = g * group;
            if (passes_on) { /* this kv head's dK and dV, summed across its passes, start at 0 */
#pragma omp for schedule(static)
                for (int j = 0; j < n_kv; j++) {
                    if (dKall) memset(dKall + (size_t)j * d, 0, (size_t)d * sizeof(float));
                    if (dVall) memset(dVall + (size_t)j * d, 0, (size_t)d * sizeof(float));
                }
            }
            const int row_passes = (n_q + PR - 1) / PR;
            for (int pass = 0; pass < n_pass; pass++) {
                /* query heads h0 + ha .. + ph - 1, rows r0 .. r1 - 1 (query tiles qt0 .. qt1 - 1) */
                const int ha = passes_on ? pass / row_passes : 0, r0 = pass % row_passes * PR;
                const int r1 = r0 + PR < n_q ? r0 + PR : n_q, qt0 = r0 / BQ, qt1 = (r1 + BQ - 1) / BQ;
                /* no barrier needed here: the previous pass's products and reduction ended with one */
                if (dq) {
#pragma omp for schedule(static) nowait
                    for (int t = 1; t < nslots; t++) memset(dqbuf[t], 0, (size_t)(r1 - r0) * ph * d * sizeof(float));
                }
#pragma omp single nowait
                { /* the key tiles any query of this pass sees, heaviest first; the slots' turns from 0 */
                    n_items = 0;
                    for (int t = 0; t < nslots; t++) {
                        slot_items[t] = 0;
                        atomic_store_explicit(&turn[t], 0, memory_order_relaxed);
                    }
                    for (int w = 0; w < n_busy; w++) {
                        int vis = !passes_on;
                        for (int qt = qt0; qt < qt1 && !vis; qt++)
                            vis = tile_class(mask, W, qr[qt], kr[order[w].idx]) != TILE_HIDDEN;
                        if (vis) items[n_items++] = (BwdItem){order[w].idx, w % nslots, slot_items[w % nslots]++};
                    }
                }
                /* Q, dO of this pass, packed once: rows and pairs, or compact rows */
#pragma omp for schedule(static)
                for (long long t = 0; t < (long long)ph * (qt1 - qt0); t++) {
                    const int hp = (int)(t / (qt1 - qt0)), i0 = (qt0 + (int)(t % (qt1 - qt0))) * BQ;
                    const int bq = i0 + BQ <= n_q ? BQ : n_q - i0, hh = ha + hp;
                    const size_t q_off = ((size_t)i0 * H + h0 + hh) * d;
                    size_t lq;
                    const float *qs = input_rows(q, s->q16, q_off, bq, d, ldq, Wide, &lq), *ds = dout + q_off;
                    if (bt) {
                        const size_t ro = ((size_t)hp * PR + (i0 - r0)) * ldkw;
                        const size_t po = ((size_t)hp * pr2 + (i0 - r0) / 2) * ldvw;
                        bt->pack_rows(bq, d, qs, lq, Qrows + ro, ldkw);
                        if (dOrows) bt->pack_rows(bq, d, ds, ldq, dOrows + ro, ldkw);
                        if (acc_tb) { /* pairs (bq2, d) in Vt, then as Q^T, dO^T rows (d, ldqt) */
                            bf16_pair *tmp = (bf16_pair *)Vt;
                            const int tq = (int)(t % (qt1 - qt0)); /* the tile's place in the pass */
                            if (Qpairs)
                                pack_pairs_transposed(bt, sk, bq, d, qs, lq, tmp, QT_TILE_AT(Qpairs, hp, tq), ldqt);
                            if (dOpairs)
                                pack_pairs_transposed(bt, sk, bq, d, ds, ldq, tmp, QT_TILE_AT(dOpairs, hp, tq), ldqt);
                        } else {
                            if (Qpairs) bt->pack_pairs(bq, d, qs, lq, Qpairs + po, ldvw);
                            if (dOpairs) bt->pack_pairs(bq, d, ds, ldq, dOpairs + po, ldvw);
                        }
                    } else {
                        const size_t dst = ((size_t)hp * PR + (i0 - r0)) * ldc;
                        copy_tile(bq, d, qs, lq, Qf + dst, ldc);
                        copy_tile(bq, d, ds, ldq, dOf + dst, ldc);
                    }
                } /* implicit barrier: the copies, the zeroed slots, the items and turns are ready */
                /* The key tiles to whichever thread comes free (heaviest first); the tile at place w
                 * of the whole order sums its dq terms into slot w % nslots, at its turn there
                 * (attn_backward_dq_slots), so which thread took it, and when, never changes a bit
                 * of the gradients, nor do passes. */
#pragma omp for schedule(dynamic, 1) nowait
                for (int it = 0; it < n_items; it++) {
                    const int kt = items[it].kt, j0 = kt * BK, bk = j0 + BK <= n_kv ? BK : n_kv - j0;
                    const int slot = items[it].slot, my_turn = items[it].turn;
                    int have_turn = !dq; /* waited for this slot's turn (no dq: no turns) */
                    if (s->progress && it > 0 && tid == 0) s->progress(s->progress_arg);
                    /* slot 0 accumulates straight into dq; the others into their (PR, ph, d) buffer */
                    float *dq_base = !dq ? NULL : slot == 0 ? dq + ((size_t)r0 * H + h0 + ha) * d : dqbuf[slot];
                    const size_t dq_ld = slot == 0 ? ldq : (size_t)ph * d; /* row stride of dq_base */
                    /* this tile's K, then V, (bk, d) rows lk, lv apart (with bf16 inputs widened,
                     * one after the other, into the same buffer) */
                    const size_t kv_off = ((size_t)j0 * Hkv + g) * d;
                    size_t lk, lv;
                    const float *ktile = input_rows(k, s->k16, kv_off, bk, d, ldk, Wide, &lk);
                    if (bt) {
                        bt->pack_rows(bk, d, ktile, lk, Tr, (size_t)d2);
                        sk->transpose32(bk, d2, Tr, (size_t)d2, KTw, ldp);
                        if (dq) bt->pack_pairs(bk, d, ktile, lk, Kp, ldc);
                        const float *vtile = input_rows(v, s->v16, kv_off, bk, d, ldk, Wide, &lv);
                        bt->pack_rows(bk, d, vtile, lv, Tr, (size_t)d2);
                        sk->transpose32(bk, d2, Tr, (size_t)d2, VTw, ldp);
                    } else {
                        sk->transpose32(bk, d, ktile, lk, Kt, ldp);
                        if (dq) copy_tile(bk, d, ktile, lk, Kc, ldc);
                        const float *vtile = input_rows(v, s->v16, kv_off, bk, d, ldk, Wide, &lv);
                        sk->transpose32(bk, d, vtile, lv, Vt, ldp);
                    }
                    /* this tile's dK and dV sums: per item, or the kv head's across passes */
                    float *dKt = dKall ? dKall + (size_t)j0 * d : dKa, *dVt = dVall ? dVall + (size_t)j0 * d : dVa;
                    if (acc_tb) { /* (d, BK): from 0, or the kv head's sums so far (the same chain as one pass) */
                        dKt = dKa, dVt = dVa;
                        if (passes_on) {
                            if (dKall) sk->transpose32(bk, d, dKall + (size_t)j0 * d, (size_t)d, dKa, (size_t)BK);
                            if (dVall) sk->transpose32(bk, d, dVall + (size_t)j0 * d, (size_t)d, dVa, (size_t)BK);
                        } else {
                            memset(dKa, 0, (size_t)d * BK * sizeof(float));
                            memset(dVa, 0, (size_t)d * BK * sizeof(float));
                        }
                    } else if (!passes_on) {
                        memset(dKa, 0, (size_t)bk * d * sizeof(float));
                        memset(dVa, 0, (size_t)bk * d * sizeof(float));
                    }
                    for (int hp = 0; hp < ph; hp++) {
                        const int h = h0 + ha + hp;
                        for (int qt = qt0; qt < qt1; qt++) {
                            const int cls = tile_class(mask, W, qr[qt], kr[kt]);
                            if (cls == TILE_HIDDEN) continue;
                            const int i0 = qt * BQ, bq = i0 + BQ <= n_q ? BQ : n_q - i0;
                            /* fp32, a tile across the diagonal: its products run over rows r_lo..
                             * (the leading rows before the tile's first key see none of it) and
                             * keys ..je - 1 (later keys are past the tile's latest query). The
                             * terms left out are exact zeros (p = 0), so every sum is the whole
                             * tile's, bit for bit. */
                            int r_lo = 0, je = bk;
                            if (cls == TILE_PARTIAL && !bt) {
                                while (r_lo < bq && q_pos[i0 + r_lo] < kr[kt].pos_lo) r_lo++;
                                while (je > 0 && kv_pos[j0 + je - 1] > qr[qt].pos_hi) je--;
                                if (r_lo == bq || je == 0) continue;
                            }
                            const int bqe = bq - r_lo; /* the rows the products run over */
                            /* this tile's Q, dO: rows and pairs (bf16), compact rows (fp32) */
                            const size_t ro = ((size_t)hp * PR + (i0 - r0)) * ldkw;
                            const size_t po = ((size_t)hp * pr2 + (i0 - r0) / 2) * ldvw;
                            const float *Qc = bt ? NULL : Qf + ((size_t)hp * PR + (i0 - r0)) * ldc;
                            const float *dOc = bt ? NULL : dOf + ((size_t)hp * PR + (i0 - r0)) * ldc;
                            /* the next visible query tile's Q and dO, toward L2 during this pair's
                             * last products: compact rows (fp32) or rows (bf16, pfq) and pairs (pfp) */
                            Prefetch pfq = {.lines_per_row = 1}, pfp = pfq; /* empty */
                            for (int nt = qt + 1; nt < qt1; nt++) {
                                if (tile_class(mask, W, qr[nt], kr[kt]) == TILE_HIDDEN) continue;
                                const int n0 = nt * BQ, nb = n0 + BQ <= n_q ? BQ : n_q - n0;
                                if (bt) {
                                    const size_t nro = ((size_t)hp * PR + (n0 - r0)) * ldkw;
                                    const size_t npo = ((size_t)hp * pr2 + (n0 - r0) / 2) * ldvw;
                                    prefetch_pair(&pfq, Qrows + nro, dOrows ? dOrows + nro : NULL,
                                                  (size_t)nb * ldkw * sizeof(bf16_pair));
                                    if (acc_tb)
                                        prefetch_pair(&pfp, Qpairs ? QT_TILE_AT(Qpairs, hp, nt - qt0) : NULL,
                                                      dOpairs ? QT_TILE_AT(dOpairs, hp, nt - qt0) : NULL,
                                                      (size_t)d * ldqt * sizeof(bf16_pair));
                                    else
                                        prefetch_pair(&pfp, Qpairs ? Qpairs + npo : NULL, dOpairs ? dOpairs + npo : NULL,
                                                      (size_t)(nb + 1) / 2 * ldvw * sizeof(bf16_pair));
                                } else {
                                    const size_t off = ((size_t)hp * PR + (n0 - r0)) * ldc;
                                    prefetch_pair(&pfq, Qf + off, dOf + off, (size_t)nb * ldc * sizeof(float));
                                }
                                break;
                            }
                            /* S (bq, bk) = alpha Q (bq, d) K^T (d, bk); P = 2^(S - lse) */
                            if (bt) { /* unscaled (alpha applied with the exponential, as the forward) */
                                bt->tile_gemm(bq, bk, d2, 1.0f, Qrows + ro, ldkw, 1, KTw, ldp, 0, P, ldp, NULL);
                            } else {
                                sk->tile_gemm(bqe, je, d, alpha, Qc + (size_t)r_lo * ldc, ldc, 1, Kt, ldp, 0,
                                              P + (size_t)r_lo * ldp, ldp, NULL);
                            }
                            int any = 0;
                            /* bf16 tiles: each row's lse in log2 units (+inf: a hidden row, all 0),
                             * for the exponential that also packs P's pairs, after the masks */
                            float mrow[FA_MAX_TILE];
                            for (int r = r_lo; r < bq; r++) {
                                float *prow = P + (size_t)r * ldp;
                                float L = lse[(size_t)(i0 + r) * H + h];
                                int hidden = L == -INFINITY;
                                if (cls == TILE_PARTIAL && !hidden) {
                                    /* the row sees none of the tile (before its first key, past
                                     * every key's window, or outside its documents), all of it,
                                     * or needs the mask */
                                    const int qp = q_pos[i0 + r], qd = q_doc ? q_doc[i0 + r] : 0;
                                    const AttnSpan kk = kr[kt];
                                    if (qp < kk.pos_lo || before_window(kk.pos_hi, qp, W) ||
                                        (q_doc && (qd < kk.doc_lo || qd > kk.doc_hi)))
                                        hidden = 1;
                                    else if (!q_doc && (qp < kk.pos_hi || before_window(kk.pos_lo, qp, W)))
                                        row_mask(prow, kv_pos + j0, je, qp, W);
                                    else if (q_doc && (qp < kk.pos_hi || before_window(kk.pos_lo, qp, W) ||
                                                       kk.doc_lo != kk.doc_hi))
                                        row_mask_docs(prow, kv_pos + j0, kv_doc + j0, je, qp, qd, W);
                                }
                                if (hidden) {
                                    memset(prow, 0, (size_t)je * sizeof(float));
                                    if (bt) mrow[r] = INFINITY;
                                    continue;
                                }
                                any = 1;
                                if (bt) mrow[r] = (float)(L * FA_LOG2E);
                                else sk->row_exp2_sum(prow, je, (float)(L * FA_LOG2E));
                            }
                            if (!any) continue;
                            /* P = 2^(alpha S - lse) in place and P's pairs (dV's operand: B of dV^T +=
                             * dO^T P under acc_tb, else P^T read transposed), in one pass over S */
                            if (bt) bt->row_exp2_pairs(P, bq, bk, ldp, alpha, mrow, Pp, ldp);
                            const int bq2r = (bq + 1) / 2, bk2r = (bk + 1) / 2; /* pair steps over bq, bk */
                            if (dv) { /* dV (bk, d) += P^T (bk, bq) dO (bq, d) */
                                if (acc_tb) { /* dV^T (d, bk) += dO^T (d, bq) P (bq, bk) */
                                    bt->tile_gemm(d, bk, bq2r, 1.0f, QT_TILE_AT(dOpairs, hp, qt - qt0), ldqt, 1, Pp,
                                                  ldp, 1, dVt, (size_t)BK, NULL);
                                } else if (bt) {
                                    bt->tile_gemm(bk, d, bq2r, 1.0f, Pp, 1, ldp, dOpairs + po, ldvw, 1, dVt, (size_t)d,
                                                  NULL);
                                } else {
                                    sk->tile_gemm(je, d, bqe, 1.0f, P + (size_t)r_lo * ldp, 1, ldp,
                                                  dOc + (size_t)r_lo * ldc, ldc, 1, dVt, (size_t)d, NULL);
                                }
                            }
                            if (!dq && !dk) continue;
                            /* dP (bq, bk) = dO (bq, d) V^T (d, bk) */
                            if (bt) bt->tile_gemm(bq, bk, d2, 1.0f, dOrows + ro, ldkw, 1, VTw, ldp, 0, dP, ldp, &pfp);
                            else
                                sk->tile_gemm(bqe, je, d, 1.0f, dOc + (size_t)r_lo * ldc, ldc, 1, Vt, ldp, 0,
                                              dP + (size_t)r_lo * ldp, ldp, NULL);
                            float *dq_tile = dq ? dq_base + (size_t)(i0 - r0) * dq_ld + (size_t)hp * d : NULL;
                            /* this pair's dq rows (strided; a row may straddle one more line), toward L2
                             * during the dK product */
                            Prefetch pfdq = {.stride = dq_ld * sizeof(float)};
                            if (dq && dk) {
                                pfdq.base[0] = (const char *)dq_tile;
                                pfdq.rows = bq;
                                pfdq.lines_per_row = (int)(((size_t)d * sizeof(float) + 63) / 64) +
                                                     ((uintptr_t)dq_tile % 64 || pfdq.stride % 64 ? 1 : 0);
                                pfdq.total = pfdq.rows * pfdq.lines_per_row;
                            }
                            if (!have_turn) { /* this tile's dq terms follow the slot's previous tile's */
                                wait_turn(&turn[slot], my_turn);
                                have_turn = 1;
                            }
                            if (bt) { /* dS = P * (dP - delta) straight into its bf16 pairs and rows */
                                float dl[FA_MAX_TILE];
                                for (int r = 0; r < bq; r++) dl[r] = delta[(size_t)(i0 + r) * H + h];
                                bt->ds_pack(P, dP, ldp, bq, bk, dl, scale, Pp, ldp, dSr, ldsw); /* scale dS */
                                if (dk && acc_tb) /* dK^T (d, bk) += Q^T (d, bq) (scale dS) (bq, bk) */
                                    bt->tile_gemm(d, bk, bq2r, 1.0f, QT_TILE_AT(Qpairs, hp, qt - qt0), ldqt, 1, Pp, ldp,
                                                  1, dKt, (size_t)BK, &pfdq);
                                else if (dk) /* dK (bk, d) += (scale dS)^T (bk, bq) Q (bq, d) */
                                    bt->tile_gemm(bk, d, bq2r, 1.0f, Pp, 1, ldp, Qpairs + po, ldvw, 1, dKt, (size_t)d,
                                                  &pfdq);
                                if (dq) /* dQ (bq, d) += (scale dS) (bq, bk) K (bk, d) */
                                    bt->tile_gemm(bq, d, bk2r, 1.0f, dSr, ldsw, 1, Kp, ldc, 1, dq_tile, dq_ld, &pfq);
                            } else {
                                for (int r = r_lo; r < bq; r++) /* dS = P * (dP - delta), into P */
                                    sk->ds_row(P + (size_t)r * ldp, dP + (size_t)r * ldp, je,
                                               delta[(size_t)(i0 + r) * H + h]);
                                const float *dS = P + (size_t)r_lo * ldp;
                                if (dk) /* dK (bk, d) += scale dS^T (bk, bq) Q (bq, d) */
                                    sk->tile_gemm(je, d, bqe, scale, dS, 1, ldp, Qc + (size_t)r_lo * ldc, ldc, 1, dKt,
                                                  (size_t)d, &pfdq);
                                if (dq) /* dQ (bq, d) += scale dS (bq, bk) K (bk, d) */
                                    sk->tile_gemm(bqe, d, je, scale, dS, ldp, 1, Kc, ldc, 1,
                                                  dq_tile + (size_t)r_lo * dq_ld, dq_ld, &pfq);
                            }
                        }
                    }
                    if (acc_tb && passes_on) { /* the sums so far back to the kv head's rows */
                        if (dKall) sk->transpose32(d, bk, dKa, (size_t)BK, dKall + (size_t)j0 * d, (size_t)d);
                        if (dVall) sk->transpose32(d, bk, dVa, (size_t)BK, dVall + (size_t)j0 * d, (size_t)d);
                    } else if (acc_tb) { /* rows of 16 keys at a time through Kt (unused by bf16 tiles) */
                        for (int jb = 0; jb < bk; jb += 16) {
                            const int nj = bk - jb < 16 ? bk - jb : 16;
                            for (int w = 0; w < 2; w++) {
                                float *dst = w ? dv : dk;
                                if (!dst) continue;
                                sk->transpose32(d, nj, (w ? dVa : dKa) + jb, (size_t)BK, Kt, (size_t)d);
                                for (int j = 0; j < nj; j++) /* this thread is the only writer of these rows */
                                    sk->add_row(dst + ((size_t)(j0 + jb + j) * Hkv + g) * d, Kt + (size_t)j * d,
                                                (size_t)d);
                            }
                        }
                    } else if (!passes_on)
                        for (int j = 0; j < bk; j++) { /* this thread is the only writer of these rows */
                            size_t off = ((size_t)(j0 + j) * Hkv + g) * d;
                            if (dk) sk->add_row(dk + off, dKa + (size_t)j * d, (size_t)d);
                            if (dv) sk->add_row(dv + off, dVa + (size_t)j * d, (size_t)d);
                        }
                    if (dq) { /* the slot's next tile may go on */
                        if (!have_turn) wait_turn(&turn[slot], my_turn);
                        atomic_store_explicit(&turn[slot], my_turn + 1, memory_order_release);
                    }
                }
#pragma omp barrier /* every slot's dq part for this pass is complete */
                if (dq && nslots > 1) {
#pragma omp for schedule(static)
                    for (int i = r0; i < r1; i++) {
                        float *dst = dq + ((size_t)i * H + h0 + ha) * d; /* (ph, d) contiguous */
                        for (int t = 1; t < nslots; t++) {
                            const float *src = dqbuf[t] + (size_t)(i - r0) * ph * d;
                            sk->add_row(dst, src, (size_t)ph * d);
                        }
                    }
                }
            } /* passes */
            if (passes_on) { /* implicit barrier above: the kv head's dK and dV are complete */
#pragma omp for schedule(static)
                for (int w = 0; w < n_busy; w++) {
                    const int j0 = order[w].idx * BK, bk = j0 + BK <= n_kv ? BK : n_kv - j0;
                    for (int j = 0; j < bk; j++) {
                        size_t off = ((size_t)(j0 + j) * Hkv + g) * d;
                        if (dk) sk->add_row(dk + off, dKall + (size_t)(j0 + j) * d, (size_t)d);
                        if (dv) sk->add_row(dv + off, dVall + (size_t)(j0 + j) * d, (size_t)d);
                    }
                }
            }
        }
    }
    for (int t = 1; t < nslots; t++) xfree(dqbuf[t]);
    xfree(dqbuf);
    xfree(work);
    xfree(work_w);
    xfree(Qrows);
    xfree(dOrows);
#undef QT_TILE_AT
    xfree(Qpairs);
    xfree(dOpairs);
    xfree(Qf);
    xfree(dOf);
    xfree(dKall);
    xfree(dVall);
    xfree(items);
    xfree(slot_items);
    xfree(turn);
    xfree(order);
    xfree(qr);
    xfree(kr);
}
