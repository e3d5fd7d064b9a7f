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
 * Both are built from the same tile steps (section "Tile steps"): one grid of query and key tiles
 * with its cost-sorted work list (query tiles forward, key tiles backward), the walk over the tile
 * pairs an item sees, the score product of one side's rows with the other side's transposed tile,
 * the mask of a partially visible pair (a key or a query at a time against the other side's tile)
 * and the trimming of its keys, and the packing of the second products' operands; forward_docs and
 * backward_docs are each a loop over tiles calling those and their own steps (fwd_*, bwd_*).
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
 * Tile steps: the forward and the backward are built from these. Both run over one grid of query
 * and key tiles (TileGrid) in its work list's order, each item over the tiles of the other axis
 * that it sees, in tile order (next_key_tile, next_query_tile: the loop and the prefetch of the
 * next tile). A tile pair's scores are one product (score_tile) of one side's rows with the other
 * side's transposed tile (load_transposed); on a partially visible pair they are masked a key or a
 * query at a time, that position against the other side's tile (key_class, query_class: the tile
 * rule on a span of one position; mask_key_row, mask_query_row where it is partial), and the
 * products stop at the last key the pair's queries can see (visible_keys). The second products
 * contract over a tile's rows, packed by pack_contracting; lse enters both in log2 units
 * (lse_log2). */

/* Rows of tile t of `tile` rows over n (the last tile may be short). */
static inline int tile_len(int t, int tile, int n) {
    const int i0 = t * tile;
    return i0 + tile <= n ? tile : n - i0;
}

/* The tiles of one call and its work list. The forward's items are query tiles (each runs over the
 * key tiles it sees), the backward's key tiles (each runs over the query tiles that see it); the
 * list holds the tiles of the items' axis that see (or are seen by) any tile of the other, heaviest
 * (most such tiles) first, so that the dynamic schedule ends balanced. */
typedef struct {
    AttnMask mask;
    int window;
    int nqt, nkt;      /* query tiles, key tiles */
    AttnSpan *qr, *kr; /* (nqt), (nkt): each tile's span (unused under ATTN_FULL) */
    TileOrder *order;  /* (n_busy): the work list */
    int n_busy;
} TileGrid;

/* How query tile qt and key tile kt see each other: TILE_HIDDEN, TILE_PARTIAL or TILE_VISIBLE. */
static inline int pair_class(const TileGrid *tg, int qt, int kt) {
    return tile_class(tg->mask, tg->window, tg->qr[qt], tg->kr[kt]);
}

static void tile_grid_init(TileGrid *tg, const AttnShape *s, const int *q_pos, const int *q_doc, const int *kv_pos,
                           const int *kv_doc, int BQ, int BK, int items_are_keys) {
    tg->mask = s->mask;
    tg->window = s->window;
    tg->nqt = (s->n_q + BQ - 1) / BQ;
    tg->nkt = (s->n_kv + BK - 1) / BK;
    tg->qr = xmalloc((size_t)tg->nqt * sizeof *tg->qr);
    tg->kr = xmalloc((size_t)tg->nkt * sizeof *tg->kr);
    tile_ranges(s->mask == ATTN_CAUSAL ? q_pos : NULL, q_doc, s->n_q, BQ, tg->qr);
    tile_ranges(s->mask == ATTN_CAUSAL ? kv_pos : NULL, kv_doc, s->n_kv, BK, tg->kr);
    const int n_items = items_are_keys ? tg->nkt : tg->nqt, n_other = items_are_keys ? tg->nqt : tg->nkt;
    tg->order = xmalloc((size_t)n_items * sizeof *tg->order);
    tg->n_busy = 0;
    for (int t = 0; t < n_items; t++) {
        int c = 0;
        for (int u = 0; u < n_other; u++)
            c += (items_are_keys ? pair_class(tg, u, t) : pair_class(tg, t, u)) != TILE_HIDDEN;
        if (c) tg->order[tg->n_busy++] = (TileOrder){c, t};
    }
    qsort(tg->order, (size_t)tg->n_busy, sizeof *tg->order, cmp_cost_desc);
}

static void tile_grid_free(TileGrid *tg) {
    xfree(tg->order);
    xfree(tg->qr);
    xfree(tg->kr);
}

/* The first key tile from kt on that query tile qt sees (nkt: none). */
static inline int next_key_tile(const TileGrid *tg, int qt, int kt) {
    while (kt < tg->nkt && pair_class(tg, qt, kt) == TILE_HIDDEN) kt++;
    return kt;
}

/* The first query tile in [qt, end) that sees key tile kt (end: none). */
static inline int next_query_tile(const TileGrid *tg, int kt, int qt, int end) {
    while (qt < end && pair_class(tg, qt, kt) == TILE_HIDDEN) qt++;
    return qt;
}

/* How the key at kp (document kd) and the query tile q see each other, and the query at qp
 * (document qd) and the key tile k: the tile rule on a span of one position. TILE_VISIBLE: no mask
 * work; TILE_HIDDEN: nothing visible. Without document ids kd and qd are 0, as the tiles' spans. */
static inline int key_class(AttnSpan q, int kp, int kd, int window) {
    return (int)attn_visibility(q, (AttnSpan){kp, kp, kd, kd}, window);
}

static inline int query_class(int qp, int qd, AttnSpan k, int window) {
    return (int)attn_visibility((AttnSpan){qp, qp, qd, qd}, k, window);
}

/* s[i] = -inf for the queries i in [c0, c1) (positions qp, documents qd or NULL) that do not see
 * the key at kp (document kd): the mask of one row of the transposed scores S^T (the forward's). */
static inline void mask_key_row(float *restrict s, int kp, int kd, const int *restrict qp, const int *restrict qd,
                                int c0, int c1, int window) {
    if (!qd && window <= 0)
        for (int i = c0; i < c1; i++) s[i] = kp > qp[i] ? -INFINITY : s[i];
    else if (!qd)
        for (int i = c0; i < c1; i++) s[i] = key_hidden(kp, qp[i], window) ? -INFINITY : s[i];
    else
        for (int i = c0; i < c1; i++) s[i] = key_hidden(kp, qp[i], window) || kd != qd[i] ? -INFINITY : s[i];
}

/* s[j] = -inf for the keys j < n (positions kv_pos, documents kv_doc or NULL) that the query at qp
 * (document qd) does not see: the mask of one row of the scores S (the backward's). */
static inline void mask_query_row(float *restrict s, const int *restrict kv_pos, const int *restrict kv_doc, int n,
                                  int qp, int qd, int window) {
    if (!kv_doc) row_mask(s, kv_pos, n, qp, window);
    else row_mask_docs(s, kv_pos, kv_doc, n, qp, qd, window);
}

/* Keys [0, result) of a tile (positions kv_pos, n of them): every key after them is past maxq, so
 * hidden from each query at maxq or before. A partially visible pair's products stop there; the
 * rows left out would hold p = 0 exactly, so every sum is the whole tile's, bit for bit. */
static inline int visible_keys(const int *kv_pos, int n, int maxq) {
    while (n > 0 && kv_pos[n - 1] > maxq) n--;
    return n;
}

/* lse (natural log) in the scores' log2 units. */
static inline float lse_log2(float lse) { return (float)(lse * FA_LOG2E); }

/* C (m, n; ldc) = A (m, d) B (d, n): a tile pair's scores (alpha Q K^T, or transposed K Q^T), or
 * the backward's dP = dO V^T (alpha 1). A: one side's m rows, in the micro-kernel's panels (lda 0)
 * or rows lda apart; B: the other side's tile transposed (load_transposed), ldb. fp32 floats,
 * scaled by alpha in the product; bf16 tiles pair words, unscaled (alpha applied with the
 * exponential), so that the product stores straight from its accumulators. pf may be NULL. */
static inline void score_tile(const SimdKernels *sk, const AttnBf16Tiles *bt, int m, int n, int d, float alpha,
                              const void *a, size_t lda, const void *b, size_t ldb, float *c, size_t ldc,
                              Prefetch *pf) {
    if (bt) {
        const int d2 = (d + 1) / 2;
        if (!lda) bt->tile_gemm_panels(m, n, d2, 1.0f, a, b, ldb, 0, c, ldc, pf);
        else bt->tile_gemm(m, n, d2, 1.0f, a, lda, 1, b, ldb, 0, c, ldc, pf);
    } else if (!lda) {
        sk->tile_gemm_panels(m, n, d, alpha, a, b, ldb, 0, c, ldc, pf);
    } else {
        sk->tile_gemm(m, n, d, alpha, a, lda, 1, b, ldb, 0, c, ldc, pf);
    }
}

/* dst = the B operand of score_tile from one side's tile src (rows, d; lds): fp32 its transpose
 * (d, rows; ldd floats); bf16 tiles its rows layout (made in tmp, rows x ceil(d / 2) words)
 * transposed (ceil(d / 2), rows; ldd words). */
static inline void load_transposed(const SimdKernels *sk, const AttnBf16Tiles *bt, int rows, int d, const float *src,
                                   size_t lds, bf16_pair *tmp, void *dst, size_t ldd) {
    if (bt) {
        const int d2 = (d + 1) / 2;
        bt->pack_rows(rows, d, src, lds, tmp, (size_t)d2);
        sk->transpose32(rows, d2, tmp, (size_t)d2, dst, ldd);
    } else {
        sk->transpose32(rows, d, src, lds, dst, ldd);
    }
}

/* dst = fp32 src (rows, d; lds) as the bf16 operand of a product that contracts over its rows (the
 * forward's V, the backward's Q and dO): its pairs layout (ceil(rows / 2), d words; ldd) where the
 * product's accumulator is (queries or keys, d), or (transposed: the accumulator is (d, queries or
 * keys)) those pairs transposed into rows layout, (d, ceil(rows / 2) words; ldd), through tmp. */
static inline void pack_contracting(const AttnBf16Tiles *bt, const SimdKernels *sk, int transposed, int rows, int d,
                                    const float *src, size_t lds, bf16_pair *tmp, bf16_pair *dst, size_t ldd) {
    if (transposed) pack_pairs_transposed(bt, sk, rows, d, src, lds, tmp, dst, ldd);
    else bt->pack_pairs(rows, d, src, lds, dst, ldd);
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

/* One forward call: its kernels, sizes and strides, and K and V of every kv head, packed once
 * (forward_docs says how). */
typedef struct {
    const SimdKernels *sk;
    const AttnBf16Tiles *bt; /* NULL: fp32 */
    int acc_t;               /* bf16 tiles: acc^T += V^T P^T instead of acc += P V */
    int kpan;                /* K in the score product's panels */
    int d, d2, BK, n_kv, nkt, nkv2, Hkv;
    size_t ldt;             /* row stride of Q^T, S^T (and acc^T) */
    size_t ldc;             /* row stride of fp32 V's compact rows */
    size_t ldkw, ldvw, ldvt; /* bf16: K rows, V pairs, V^T rows (words) */
    size_t ktile_n;          /* floats or words of one packed K tile */
    float alpha;             /* scale * log2 e: scores in log2 units */
    float lazy_max;          /* bf16 tiles: the lazy rescaling's threshold */
    bf16_pair *Kall, *Vall, *VTall; /* bf16: K tiles, V pairs, V^T tiles */
    float *Kf, *Vf;                 /* fp32: K tiles in panels, V compact rows */
} FwdCall;

/* A thread's buffers: the query tile transposed, the scores, the accumulator and the per-query
 * running state of the current item. */
typedef struct {
    float *Qt;  /* (d, bq) transposed q tile (fp32) */
    float *ST;  /* (bk, bq) scores^T / probs^T */
    float *acc; /* (bq, d); acc_t: (d, ldt) */
    float *m;   /* (bq) running max, log2 */
    float *l;   /* (bq) running sum */
    float *mx, *msafe, *corr, *sum; /* (bq) each */
    bf16_pair *Qr, *Qw, *Pw; /* bf16: (bq, d2) Q rows, (d2, bq) Q^T pairs, (bk/2, bq) P^T pairs */
    unsigned char seen[FA_MAX_TILE]; /* a query saw a key in this call */
} FwdWork;

/* Key tile kt of kv head g in the packed K (bf16 words or fp32 floats in panels), and in the
 * packed V: V^T rows (acc_t), pairs (bf16) or compact rows (fp32). */
static inline void *fwd_k_tile(const FwdCall *c, int g, int kt) {
    const size_t at = ((size_t)g * c->nkt + (size_t)kt) * c->ktile_n;
    return c->bt ? (void *)(c->Kall + at) : (void *)(c->Kf + at);
}

static inline void *fwd_v_tile(const FwdCall *c, int g, int kt) {
    const int j0 = kt * c->BK;
    if (c->acc_t) return c->VTall + ((size_t)g * c->nkt + (size_t)kt) * c->d * c->ldvt;
    if (c->bt) return c->Vall + ((size_t)g * c->nkv2 + j0 / 2) * c->ldvw;
    return c->Vf + ((size_t)g * c->n_kv + j0) * c->ldc;
}

/* Packs key tile kt of kv head g (k, v: rows ldk apart): K in panels or rows, V as fp32 compact
 * rows or bf16 pairs or V^T rows (pack_contracting, through tmp). */
static inline void fwd_pack_key_tile(const FwdCall *c, int g, int kt, const float *k, const float *v, size_t ldk,
                                     bf16_pair *tmp) {
    const int d = c->d, j0 = kt * c->BK, bk = tile_len(kt, c->BK, c->n_kv);
    const float *ks = k + ((size_t)j0 * c->Hkv + g) * d, *vs = v + ((size_t)j0 * c->Hkv + g) * d;
    if (c->bt) {
        if (c->kpan) c->bt->pack_panels(bk, d, ks, ldk, fwd_k_tile(c, g, kt));
        else c->bt->pack_rows(bk, d, ks, ldk, fwd_k_tile(c, g, kt), c->ldkw);
        pack_contracting(c->bt, c->sk, c->acc_t, bk, d, vs, ldk, tmp, fwd_v_tile(c, g, kt), c->acc_t ? c->ldvt : c->ldvw);
    } else {
        c->sk->pack_panels(bk, d, ks, ldk, fwd_k_tile(c, g, kt));
        copy_tile(bk, d, vs, ldk, fwd_v_tile(c, g, kt), c->ldc);
    }
}

/* The prefetches of key tile nt (nkt: none, both empty) during this tile's products: its K and V
 * (contiguous, rows of one 64-byte line) during the score product; under acc_t K so, and V^T's
 * tile during acc^T's. */
static inline void fwd_prefetch(const FwdCall *c, int g, int nt, Prefetch *pf, Prefetch *pfv) {
    *pf = (Prefetch){.lines_per_row = 1};
    *pfv = (Prefetch){.lines_per_row = 1};
    if (nt >= c->nkt) return;
    const int nb = tile_len(nt, c->BK, c->n_kv);
    const size_t bytes = c->bt ? (size_t)nb * c->ldkw * sizeof(bf16_pair) : (size_t)nb * c->ldc * sizeof(float);
    prefetch_pair(pf, fwd_k_tile(c, g, nt), c->acc_t ? NULL : fwd_v_tile(c, g, nt), bytes);
    if (c->acc_t) prefetch_pair(pfv, fwd_v_tile(c, g, nt), NULL, (size_t)c->d * c->ldvt * sizeof(bf16_pair));
}

/* The state of the item's queries from the caller's: bq rows of o (rows H * d apart) and lse
 * (H apart). A row with no state yet (lse -inf) starts empty; another is one key of weight 1 with
 * the value o (l = 1, m its lse), so that the call merges into it. */
static inline void fwd_seed(const FwdCall *c, FwdWork *w, int bq, const float *o, const float *lse, int H) {
    const int d = c->d;
    for (int r = 0; r < bq; r++) {
        const size_t row = (size_t)r * H;
        float L = lse[row];
        w->seen[r] = 0;
        if (L == -INFINITY) {
            w->m[r] = -INFINITY;
            w->l[r] = 0.0f;
            if (c->acc_t)
                for (int cc = 0; cc < d; cc++) w->acc[(size_t)cc * c->ldt + r] = 0.0f;
            else
                memset(w->acc + (size_t)r * d, 0, (size_t)d * sizeof(float));
        } else {
            w->m[r] = lse_log2(L);
            w->l[r] = 1.0f;
            if (c->acc_t)
                for (int cc = 0; cc < d; cc++) w->acc[(size_t)cc * c->ldt + r] = o[row * d + cc];
            else
                memcpy(w->acc + (size_t)r * d, o + row * d, (size_t)d * sizeof(float));
        }
    }
}

/* The query blocks of a tile pair. A partially visible pair runs in blocks of FA_QBLOCK queries,
 * block b over the keys before end[b] (visible_keys: every later key is past the block's latest
 * query), so that its products, mask and softmax stop there; any other pair is one block. */
typedef struct { int n, w, end[FA_MAX_TILE / FA_QBLOCK + 1]; } QueryBlocks;

static inline void fwd_query_blocks(QueryBlocks *qb, int cls, const int *q_pos, const int *kv_pos, int bq, int bk) {
    qb->n = 1;
    qb->w = bq;
    qb->end[0] = bk;
    if (cls != TILE_PARTIAL) return;
    qb->n = (bq + FA_QBLOCK - 1) / FA_QBLOCK;
    qb->w = FA_QBLOCK;
    for (int b = 0; b < qb->n; b++) {
        const int c0 = b * qb->w, c1 = c0 + qb->w < bq ? c0 + qb->w : bq;
        qb->end[b] = visible_keys(kv_pos, bk, attn_span(q_pos + c0, NULL, c1 - c0).pos_hi);
    }
}

/* Queries [c0, c0 + width) of block b of a tile of bq queries. */
static inline int block_width(const QueryBlocks *qb, int b, int bq) {
    const int c0 = b * qb->w;
    return c0 + qb->w < bq ? qb->w : bq - c0;
}

/* bf16 tiles on a pair every key of which every query sees, with every query's reference maximum
 * set: the softmax step first tries the current maxima, finding the block's largest arguments as it
 * goes, so that the separate pass for the column maxima (a read of S^T from L2, 7% of the AMX
 * forward at d = 64) is needed only where a maximum moves (the lazy rule: by more than lazy_max). */
static inline int fwd_try_maxima(const FwdCall *c, const FwdWork *w, int cls, int bq) {
    int try_m = c->bt && cls != TILE_PARTIAL;
    for (int i = 0; i < bq && try_m; i++) try_m = w->m[i] != -INFINITY;
    return try_m;
}

/* S^T (end[b], width) of each query block = K Q^T of the block's queries (score_tile: the bf16
 * tiles' unscaled), masked on a partial pair key by key (a key every query of the tile q sees is
 * left as it is; positions qp, qd of the tile's queries, kp, kd of the pair's keys, qd and kd NULL
 * without documents), and unless the softmax step tries the current maxima, the block's column
 * maxima in log2 units into mx. */
static inline void fwd_scores(const FwdCall *c, FwdWork *w, const QueryBlocks *qb, int bq, int cls, int try_m,
                              const void *K, Prefetch *pf, AttnSpan q, const int *qp, const int *qd, const int *kp,
                              const int *kd, int window) {
    for (int b = 0; b < qb->n; b++) {
        const int c0 = b * qb->w, cw = block_width(qb, b, bq), je = qb->end[b];
        const void *QT = c->bt ? (const void *)(w->Qw + c0) : (const void *)(w->Qt + c0); /* the block's Q^T */
        score_tile(c->sk, c->bt, je, cw, c->d, c->alpha, K, c->kpan ? 0 : c->ldkw, QT, c->ldt, w->ST + c0, c->ldt, pf);
        if (cls == TILE_PARTIAL)
            for (int j = 0; j < je; j++) {
                const int kdj = qd ? kd[j] : 0;
                if (key_class(q, kp[j], kdj, window) == TILE_VISIBLE) continue; /* every query sees it */
                mask_key_row(w->ST + (size_t)j * c->ldt, kp[j], kdj, qp, qd, c0, c0 + cw, window);
            }
        if (!try_m) col_max_scores(c->sk, c->bt != NULL, w->ST + c0, je, cw, c->ldt, c->alpha, w->mx + c0);
    }
}

/* The online softmax step of a pair: the running maxima m (bf16 tiles: moved only past lazy_max),
 * P^T = 2^(S^T - m) (in place, or the bf16 tiles' pairs, never stored in fp32), l = l corr + the
 * column sums and the accumulator rescaled by corr = 2^(m_old - m_new). */
static inline void fwd_softmax(const FwdCall *c, FwdWork *w, const QueryBlocks *qb, int bq, int bk, int try_m) {
    const SimdKernels *sk = c->sk;
    const AttnBf16Tiles *bt = c->bt;
    const size_t ldt = c->ldt;
    const float lazy_max = c->lazy_max;
    float *m = w->m, *l = w->l, *mx = w->mx, *msafe = w->msafe, *corr = w->corr, *sum = w->sum;
    if (try_m) { /* one block (no partial pair): c0 0, cw bq, je bk */
        bt->col_exp2_pairs(w->ST, bk, bq, ldt, c->alpha, m, sum, w->Pw, ldt, mx);
        /* no argument within a quarter of the threshold: the rule below, on the maxima, would
         * keep every m too (for |m| < 2^21), and its step would make these same P, sums and
         * l (m - m = 0, a factor of 1): the results are bit for bit those of that path */
        int moves = 0;
        for (int i = 0; i < bq; i++) moves |= mx[i] > lazy_max - 0.25f;
        if (!moves) {
            for (int i = 0; i < bq; i++) {
                w->seen[i] |= mx[i] != -INFINITY;
                l[i] += sum[i]; /* m stays: no rescaling */
            }
            return;
        }
        col_max_scores(sk, 1, w->ST, bk, bq, ldt, c->alpha, mx); /* the maxima after all; P made again */
    }
    for (int i = 0; i < bq; i++) { /* bf16 tiles: the reference maximum moves only past lazy_max */
        float mnew = !bt ? (m[i] > mx[i] ? m[i] : mx[i]) : mx[i] > m[i] + lazy_max ? mx[i] : m[i];
        w->seen[i] |= mx[i] != -INFINITY;
        msafe[i] = mnew == -INFINITY ? 0.0f : mnew; /* a column with no key yet: p = 0 */
        corr[i] = m[i] - msafe[i];                  /* exponent of the rescaling */
        m[i] = mnew;
    }
    sk->row_exp2_sum(corr, bq, 0.0f); /* corr = 2^(m_old - m_new), 0 when m was -inf */
    for (int b = 0; b < qb->n; b++) { /* P^T: bf16 pairs (never stored in fp32), or in place */
        const int c0 = b * qb->w, cw = block_width(qb, b, bq);
        if (bt)
            bt->col_exp2_pairs(w->ST + c0, qb->end[b], cw, ldt, c->alpha, msafe + c0, sum + c0, w->Pw + c0, ldt, NULL);
        else sk->col_exp2_sum(w->ST + c0, qb->end[b], cw, ldt, msafe + c0, sum + c0);
    }
    int rescale = 0;
    for (int i = 0; i < bq; i++) {
        l[i] = l[i] * corr[i] + sum[i];
        rescale |= corr[i] != 1.0f;
        if (!c->acc_t && corr[i] != 1.0f) sk->scale_row(w->acc + (size_t)i * c->d, c->d, corr[i]);
    }
    if (c->acc_t && rescale) sk->scale_cols(w->acc, c->d, bq, ldt, corr);
}

/* acc (cw, d) += P (cw, je) V (je, d) of each query block, P read as (S^T)^T (fp32) or from its
 * pairs (bf16); or acc^T (d, cw) += V^T (d, je) P^T (je, cw) (acc_t; pfv during the first). */
static inline void fwd_accumulate(const FwdCall *c, FwdWork *w, const QueryBlocks *qb, int bq, const void *V,
                                  Prefetch *pfv) {
    const int d = c->d;
    const size_t ldt = c->ldt;
    for (int b = 0; b < qb->n; b++) {
        const int c0 = b * qb->w, cw = block_width(qb, b, bq), je = qb->end[b];
        float *ab = w->acc + (size_t)c0 * d;
        if (c->acc_t)
            c->bt->tile_gemm(d, cw, (je + 1) / 2, 1.0f, V, c->ldvt, 1, w->Pw + c0, ldt, 1, w->acc + c0, ldt,
                             b == 0 ? pfv : NULL);
        else if (c->bt)
            c->bt->tile_gemm(cw, d, (je + 1) / 2, 1.0f, w->Pw + c0, 1, ldt, V, c->ldvw, 1, ab, (size_t)d, NULL);
        else
            c->sk->tile_gemm(cw, d, je, 1.0f, w->ST + c0, 1, ldt, V, c->ldc, 1, ab, (size_t)d, NULL);
    }
}

/* The item's queries back into the caller's state (o rows H * d apart, lse H apart): o = acc / l,
 * lse = (m + log2 l) ln 2; a query that saw no key in this call keeps its state. */
static inline void fwd_finish(const FwdCall *c, const FwdWork *w, int bq, float *o, float *lse, int H) {
    const int d = c->d;
    for (int r = 0; r < bq; r++) {
        if (!w->seen[r]) continue; /* no visible key in this call: state unchanged */
        const size_t row = (size_t)r * H;
        float inv = 1.0f / w->l[r];
        float *orow = o + row * d;
        if (c->acc_t)
            for (int cc = 0; cc < d; cc++) orow[cc] = w->acc[(size_t)cc * c->ldt + r] * inv;
        else
            for (int cc = 0; cc < d; cc++) orow[cc] = w->acc[(size_t)r * d + cc] * inv;
        lse[row] = (float)(((double)w->m[r] + log2((double)w->l[r])) * FA_LN2);
    }
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
    const size_t ldq = (size_t)H * d, ldk = (size_t)Hkv * d, ldt = (size_t)BQ + FA_SKEW;
    if (bt && !acc_t && (size_t)BQ + (size_t)bt->mr > ldt) /* P^T is read transposed, up to mr words past a row */
        die("internal: attn_forward: query tile %d plus the bf16 tiles' %d rows exceeds the stride %zu", BQ, bt->mr, ldt);
    const int W = s->window;
    /* Lazy rescaling (bf16 tiles): a query's reference maximum m moves only when a block's maximum
     * exceeds it by more than LAZY_MAX_LOG2, so the accumulator is rescaled a few times per row
     * instead of at almost every key block (with 192 queries a block some query's maximum grows in
     * nearly every one); P = 2^(s - m) then stays below 2^LAZY_MAX_LOG2, exact in bf16's exponent
     * range, and l and the fp32 accumulator carry the factor until the final division. The fp32
     * kernel keeps the exact running maximum: its results are unchanged. */
    FwdCall c = {.sk = sk, .bt = bt, .acc_t = acc_t, .d = d, .d2 = (d + 1) / 2, .BK = BK, .n_kv = n_kv, .Hkv = Hkv,
                 .nkv2 = (n_kv + 1) / 2, .ldt = ldt, .ldc = (size_t)d + FA_SKEW,
                 .alpha = (float)(s->scale * FA_LOG2E), .lazy_max = LAZY_MAX_LOG2};

    /* the query tiles with any key tile to see, heaviest first */
    TileGrid tg;
    tile_grid_init(&tg, s, q_pos, q_doc, kv_pos, kv_doc, BQ, BK, 0);
    const int nkt = tg.nkt, n_busy = tg.n_busy;
    c.nkt = nkt;

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
    const int d2 = c.d2, bk2 = (BK + 1) / 2;
    c.ldkw = bt ? attn_bf16_rows_ld(bt, d2) : 0;
    c.ldvw = (size_t)d + FA_SKEW / 2;
    c.ldvt = ((size_t)bk2 + 15) / 16 * 16;
    const size_t pw_n = (size_t)bk2 * (acc_t && (size_t)d > ldt ? (size_t)d : ldt);
    const size_t per_thread_w = ((size_t)BQ * d2 + (size_t)d2 * ldt + pw_n + 15) / 16 * 16;
    bf16_pair *work_w = bt ? words_zeroed((size_t)nth * per_thread_w) : NULL;
    c.kpan = !bt || bt->tile_gemm_panels;
    const int pmr = !bt ? sk->gemm_mr : bt->panel_mr, BKp = c.kpan ? (BK + pmr - 1) / pmr * pmr : 0;
    c.ktile_n = c.kpan ? (size_t)BKp * (bt ? d2 : d) : (size_t)BK * c.ldkw;
    c.Kall = bt ? words_zeroed((size_t)Hkv * nkt * c.ktile_n) : NULL;
    c.Vall = bt && !acc_t ? words_zeroed((size_t)Hkv * c.nkv2 * c.ldvw) : NULL;
    c.VTall = acc_t ? words_zeroed((size_t)Hkv * nkt * d * c.ldvt) : NULL;
    c.Kf = bt ? NULL : xzalloc_filled((size_t)Hkv * nkt * c.ktile_n * sizeof(float));
    c.Vf = bt ? NULL : xzalloc_filled((size_t)Hkv * n_kv * c.ldc * sizeof(float));

#pragma omp parallel num_threads(nth)
    {
        FwdWork w = {.Qt = work + (size_t)omp_get_thread_num() * per_thread};
        w.ST = w.Qt + (size_t)d * ldt;
        w.acc = w.ST + (size_t)BK * ldt;
        w.m = w.acc + acc_n;
        w.l = w.m + BQ;
        w.mx = w.l + BQ, w.msafe = w.mx + BQ, w.corr = w.msafe + BQ, w.sum = w.corr + BQ;
        if (bt) {
            w.Qr = work_w + (size_t)omp_get_thread_num() * per_thread_w;
            w.Qw = w.Qr + (size_t)BQ * d2;
            w.Pw = w.Qw + (size_t)d2 * ldt;
        }
#pragma omp for schedule(static)
        for (long long t = 0; t < (long long)Hkv * nkt; t++) /* K, V of every kv head: rows, or packed */
            fwd_pack_key_tile(&c, (int)(t / nkt), (int)(t % nkt), k, v, ldk, w.Pw);
        /* implicit barrier: every tile is packed */

#pragma omp for schedule(dynamic, 1)
        for (long long it = 0; it < n_items; it++) {
            /* head-major: the threads work on one head at a time and share its K/V in L3 */
            const int h = (int)(it / n_busy), qt = tg.order[it % n_busy].idx, g = h / group;
            if (s->progress && it > 0 && omp_get_thread_num() == 0) s->progress(s->progress_arg);
            const int i0 = qt * BQ, bq = tile_len(qt, BQ, n_q);
            const int *qp = q_pos ? q_pos + i0 : NULL, *qd = q_doc ? q_doc + i0 : NULL;
            const size_t row0 = (size_t)i0 * H + h; /* the item's first (query, head) row */
            load_transposed(sk, bt, bq, d, q + row0 * d, ldq, w.Qr, bt ? (void *)w.Qw : (void *)w.Qt, ldt);
            fwd_seed(&c, &w, bq, o + row0 * d, lse + row0, H);
            for (int kt = next_key_tile(&tg, qt, 0), nt; kt < nkt; kt = nt) {
                nt = next_key_tile(&tg, qt, kt + 1);
                const int cls = pair_class(&tg, qt, kt), j0 = kt * BK, bk = tile_len(kt, BK, n_kv);
                const int *kp = kv_pos ? kv_pos + j0 : NULL, *kd = kv_doc ? kv_doc + j0 : NULL;
                Prefetch pf, pfv; /* the next visible key tile's K and V */
                fwd_prefetch(&c, g, nt, &pf, &pfv);
                QueryBlocks qb;
                fwd_query_blocks(&qb, cls, qp, kp, bq, bk);
                const int try_m = fwd_try_maxima(&c, &w, cls, bq);
                fwd_scores(&c, &w, &qb, bq, cls, try_m, fwd_k_tile(&c, g, kt), &pf, tg.qr[qt], qp, qd, kp, kd, W);
                fwd_softmax(&c, &w, &qb, bq, bk, try_m);
                fwd_accumulate(&c, &w, &qb, bq, fwd_v_tile(&c, g, kt), &pfv);
            }
            fwd_finish(&c, &w, bq, o + row0 * d, lse + row0, H);
        }
    }
    xfree(work);
    xfree(work_w);
    xfree(c.Kall);
    xfree(c.Vall);
    xfree(c.VTall);
    xfree(c.Kf);
    xfree(c.Vf);
    tile_grid_free(&tg);
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


/* One backward call: its kernels, sizes and strides, the current pass's Q and dO copies and the
 * kv head's dK and dV across passes (backward_docs says how). */
typedef struct {
    const SimdKernels *sk;
    const AttnBf16Tiles *bt; /* NULL: fp32 */
    int acc_tb;              /* bf16 tiles: dK^T += Q^T dS and dV^T += dO^T P */
    int passes_on;           /* the kv head runs in passes (dKall, dVall) */
    int d, d2, BQ, BK, Hkv, PR, pr2, nqp;
    size_t ldp;              /* row stride of K^T, V^T, P, dP (and the pairs read transposed) */
    size_t ldc;              /* row stride of the compact fp32 K, Q, dO and the bf16 K pairs */
    size_t ldkw, ldvw, ldsw, ldqt; /* bf16: Q, dO rows; Q, dO pairs; dS rows; Q^T, dO^T rows */
    float alpha, scale;
    bf16_pair *Qrows, *dOrows, *Qpairs, *dOpairs; /* bf16: the pass's Q and dO (Qpairs: Q^T under acc_tb) */
    float *Qf, *dOf;                             /* fp32: the pass's Q and dO, compact rows */
    float *dKall, *dVall;                        /* with passes: the kv head's dK, dV (n_kv, d) */
    float *dk, *dv;                              /* the caller's (NULL: not wanted) */
} BwdCall;

/* A thread's buffers: the key tile's transposed and compact copies, the tile pair's P and dP, the
 * key tile's dK and dV sums. */
typedef struct {
    float *Kt, *Vt;   /* (d, bk) transposed k, v tiles */
    float *P, *dP;    /* (bq, bk) probabilities, then dS; dP */
    float *dKa, *dVa; /* (bk, d), or (d, BK) under acc_tb */
    float *Kc;        /* (bk, d) compact k tile */
    float *Wide;      /* bf16 inputs: a tile widened */
    bf16_pair *KTw, *VTw, *Kp, *Tr, *Pp, *dSr; /* bf16: K^T, V^T pairs | K pairs | K or V rows | P, dS pairs | dS rows */
} BwdWork;

/* Query tile qt (query head hp of the pass from row r0, query tile qt0) in the pass's copies: rows
 * and pairs (bf16; Q^T, dO^T rows under acc_tb), or compact rows (fp32); NULL where not made. */
typedef struct {
    bf16_pair *Qr, *dOr, *Qp, *dOp;
    float *Qc, *dOc;
} BwdQueries;

static inline BwdQueries bwd_queries(const BwdCall *c, int hp, int qt, int qt0, int r0) {
    BwdQueries t = {.Qr = NULL};
    const int i0 = qt * c->BQ;
    if (c->bt) {
        const size_t ro = ((size_t)hp * c->PR + (i0 - r0)) * c->ldkw;
        const size_t po = ((size_t)hp * c->pr2 + (i0 - r0) / 2) * c->ldvw;
        const size_t to = ((size_t)hp * c->nqp + (size_t)(qt - qt0)) * c->d * c->ldqt;
        t.Qr = c->Qrows + ro;
        if (c->dOrows) t.dOr = c->dOrows + ro;
        if (c->Qpairs) t.Qp = c->Qpairs + (c->acc_tb ? to : po);
        if (c->dOpairs) t.dOp = c->dOpairs + (c->acc_tb ? to : po);
    } else {
        const size_t off = ((size_t)hp * c->PR + (i0 - r0)) * c->ldc;
        t.Qc = c->Qf + off;
        t.dOc = c->dOf + off;
    }
    return t;
}

/* Packs query tile qt of the pass's query head hp (rows q_off.. of q and dout, ldq apart): bf16 Q
 * and dO rows and pairs (pack_contracting, through the thread's Vt), or fp32 compact rows. */
static inline void bwd_pack_query_tile(const BwdCall *c, BwdWork *w, const AttnShape *s, const float *q,
                                       const float *dout, size_t q_off, size_t ldq, int bq, BwdQueries t) {
    const int d = c->d;
    size_t lq;
    const float *qs = input_rows(q, s->q16, q_off, bq, d, ldq, w->Wide, &lq), *ds = dout + q_off;
    if (c->bt) {
        const size_t ldpw = c->acc_tb ? c->ldqt : c->ldvw;
        c->bt->pack_rows(bq, d, qs, lq, t.Qr, c->ldkw);
        if (t.dOr) c->bt->pack_rows(bq, d, ds, ldq, t.dOr, c->ldkw);
        if (t.Qp) pack_contracting(c->bt, c->sk, c->acc_tb, bq, d, qs, lq, (bf16_pair *)w->Vt, t.Qp, ldpw);
        if (t.dOp) pack_contracting(c->bt, c->sk, c->acc_tb, bq, d, ds, ldq, (bf16_pair *)w->Vt, t.dOp, ldpw);
    } else {
        copy_tile(bq, d, qs, lq, t.Qc, c->ldc);
        copy_tile(bq, d, ds, ldq, t.dOc, c->ldc);
    }
}

/* The next visible query tile's Q and dO, toward L2 during this pair's last products: rows (bf16)
 * or compact rows (fp32) into pfq, pairs (bf16) into pfp; both empty where there is none. */
static inline void bwd_prefetch(const BwdCall *c, int hp, int nt, int qt0, int qt1, int r0, int n_q, Prefetch *pfq,
                                Prefetch *pfp) {
    *pfq = (Prefetch){.lines_per_row = 1};
    *pfp = *pfq;
    if (nt >= qt1) return;
    const int nb = tile_len(nt, c->BQ, n_q);
    const BwdQueries t = bwd_queries(c, hp, nt, qt0, r0);
    if (c->bt) {
        prefetch_pair(pfq, t.Qr, t.dOr, (size_t)nb * c->ldkw * sizeof(bf16_pair));
        prefetch_pair(pfp, t.Qp, t.dOp,
                      c->acc_tb ? (size_t)c->d * c->ldqt * sizeof(bf16_pair)
                                : (size_t)(nb + 1) / 2 * c->ldvw * sizeof(bf16_pair));
    } else {
        prefetch_pair(pfq, t.Qc, t.dOc, (size_t)nb * c->ldc * sizeof(float));
    }
}

/* Loads key tile kv_off.. (bk rows, ldk apart) of k and v: K^T and V^T (load_transposed) and, for
 * dQ, K itself (bf16 pairs or fp32 compact rows). With bf16 inputs K and then V are widened into
 * the same buffer. */
static inline void bwd_load_key_tile(const BwdCall *c, BwdWork *w, const AttnShape *s, const float *k, const float *v,
                                     size_t kv_off, size_t ldk, int bk, int want_dq) {
    const int d = c->d;
    const int bf = c->bt != NULL;
    size_t lk, lv;
    const float *ktile = input_rows(k, s->k16, kv_off, bk, d, ldk, w->Wide, &lk);
    load_transposed(c->sk, c->bt, bk, d, ktile, lk, w->Tr, bf ? (void *)w->KTw : (void *)w->Kt, c->ldp);
    if (want_dq) {
        if (bf) c->bt->pack_pairs(bk, d, ktile, lk, w->Kp, c->ldc);
        else copy_tile(bk, d, ktile, lk, w->Kc, c->ldc);
    }
    const float *vtile = input_rows(v, s->v16, kv_off, bk, d, ldk, w->Wide, &lv);
    load_transposed(c->sk, c->bt, bk, d, vtile, lv, w->Tr, bf ? (void *)w->VTw : (void *)w->Vt, c->ldp);
}

/* Where key tile j0.. (bk keys) sums its dK and dV: per item from 0, or the kv head's sums across
 * passes (in place; under acc_tb transposed into the thread's (d, BK) sums, the same chain as one
 * pass). */
static inline void bwd_sums_start(const BwdCall *c, BwdWork *w, int j0, int bk, float **dKt, float **dVt) {
    const int d = c->d;
    *dKt = c->dKall ? c->dKall + (size_t)j0 * d : w->dKa;
    *dVt = c->dVall ? c->dVall + (size_t)j0 * d : w->dVa;
    if (c->acc_tb) { /* (d, BK): from 0, or the kv head's sums so far */
        *dKt = w->dKa, *dVt = w->dVa;
        if (c->passes_on) {
            if (c->dKall) c->sk->transpose32(bk, d, c->dKall + (size_t)j0 * d, (size_t)d, w->dKa, (size_t)c->BK);
            if (c->dVall) c->sk->transpose32(bk, d, c->dVall + (size_t)j0 * d, (size_t)d, w->dVa, (size_t)c->BK);
        } else {
            memset(w->dKa, 0, (size_t)d * c->BK * sizeof(float));
            memset(w->dVa, 0, (size_t)d * c->BK * sizeof(float));
        }
    } else if (!c->passes_on) {
        memset(w->dKa, 0, (size_t)bk * d * sizeof(float));
        memset(w->dVa, 0, (size_t)bk * d * sizeof(float));
    }
}

/* Key tile j0.. of kv head g done: its sums back to the kv head's rows (passes, acc_tb), or added
 * to dk and dv (this thread is the only writer of these rows; under acc_tb 16 keys at a time
 * through Kt, which the bf16 tiles do not use). Without acc_tb and with passes the sums are
 * dKall's own rows already. */
static inline void bwd_sums_store(const BwdCall *c, BwdWork *w, int g, int j0, int bk) {
    const SimdKernels *sk = c->sk;
    const int d = c->d;
    if (c->acc_tb && c->passes_on) {
        if (c->dKall) sk->transpose32(d, bk, w->dKa, (size_t)c->BK, c->dKall + (size_t)j0 * d, (size_t)d);
        if (c->dVall) sk->transpose32(d, bk, w->dVa, (size_t)c->BK, c->dVall + (size_t)j0 * d, (size_t)d);
    } else if (c->acc_tb) {
        for (int jb = 0; jb < bk; jb += 16) {
            const int nj = bk - jb < 16 ? bk - jb : 16;
            for (int x = 0; x < 2; x++) {
                float *dst = x ? c->dv : c->dk;
                if (!dst) continue;
                sk->transpose32(d, nj, (x ? w->dVa : w->dKa) + jb, (size_t)c->BK, w->Kt, (size_t)d);
                for (int j = 0; j < nj; j++)
                    sk->add_row(dst + ((size_t)(j0 + jb + j) * c->Hkv + g) * d, w->Kt + (size_t)j * d, (size_t)d);
            }
        }
    } else if (!c->passes_on) {
        for (int j = 0; j < bk; j++) {
            size_t off = ((size_t)(j0 + j) * c->Hkv + g) * d;
            if (c->dk) sk->add_row(c->dk + off, w->dKa + (size_t)j * d, (size_t)d);
            if (c->dv) sk->add_row(c->dv + off, w->dVa + (size_t)j * d, (size_t)d);
        }
    }
}

/* P (bq, bk) = 2^(alpha Q K^T - lse) of a tile pair, over rows r_lo.. and keys ..je - 1 (fp32 on a
 * partial pair: the leading rows see none of the key tile, the later keys are past every query;
 * the bf16 tiles run the whole pair). A row hidden from the whole key tile k (or with no state:
 * lse -inf) is 0; on a partial pair the others are masked a query at a time (query positions qp,
 * qd of the tile, key positions kp, kd of the pair; qd, kd NULL without documents). lse: the tile's
 * first row's, rows H apart. bf16 tiles: P's pairs (Pp) too, in the same pass. 0 where no row sees
 * any key (nothing to add). */
static inline int bwd_probs(const BwdCall *c, BwdWork *w, const BwdQueries *t, int bq, int bk, int r_lo, int je,
                            int cls, AttnSpan k, const float *lse, int H, const int *qp, const int *qd, const int *kp,
                            const int *kd, int window) {
    const AttnBf16Tiles *bt = c->bt;
    const size_t ldp = c->ldp;
    /* S: unscaled under the bf16 tiles (alpha applied with the exponential, as the forward) */
    score_tile(c->sk, bt, bq - r_lo, je, c->d, c->alpha,
               bt ? (const void *)(t->Qr + (size_t)r_lo * c->ldkw) : (const void *)(t->Qc + (size_t)r_lo * c->ldc),
               bt ? c->ldkw : c->ldc, bt ? (const void *)w->KTw : (const void *)w->Kt, ldp, w->P + (size_t)r_lo * ldp,
               ldp, NULL);
    int any = 0;
    /* bf16 tiles: each row's lse in log2 units (+inf: a hidden row, all 0), for the exponential
     * that also packs P's pairs, after the masks */
    float mrow[FA_MAX_TILE];
    for (int r = r_lo; r < bq; r++) {
        float *prow = w->P + (size_t)r * ldp;
        float L = lse[(size_t)r * H];
        int hidden = L == -INFINITY;
        if (cls == TILE_PARTIAL && !hidden) {
            /* the row sees none of the tile (before its first key, past every key's window, or
             * outside its documents), all of it, or needs the mask */
            const int qdr = qd ? qd[r] : 0, rc = query_class(qp[r], qdr, k, window);
            if (rc == TILE_HIDDEN) hidden = 1;
            else if (rc == TILE_PARTIAL) mask_query_row(prow, kp, kd, je, qp[r], qdr, window);
        }
        if (hidden) {
            memset(prow, 0, (size_t)je * sizeof(float));
            if (bt) mrow[r] = INFINITY;
            continue;
        }
        any = 1;
        if (bt) mrow[r] = lse_log2(L);
        else c->sk->row_exp2_sum(prow, je, lse_log2(L));
    }
    if (!any) return 0;
    /* P = 2^(alpha S - lse) in place and P's pairs (dV's operand: B of dV^T += dO^T P under acc_tb,
     * else P^T read transposed), in one pass over S */
    if (bt) bt->row_exp2_pairs(w->P, bq, bk, ldp, c->alpha, mrow, w->Pp, ldp);
    return 1;
}

/* dV (bk, d) += P^T (bk, bq) dO (bq, d) of a tile pair (fp32: keys ..je - 1, rows r_lo..), or
 * (acc_tb) dV^T (d, bk) += dO^T (d, bq) P (bq, bk). */
static inline void bwd_dv(const BwdCall *c, BwdWork *w, const BwdQueries *t, int bq, int bk, int r_lo, int je,
                          float *dVt) {
    const int d = c->d, bq2r = (bq + 1) / 2; /* pair steps over bq */
    if (c->acc_tb)
        c->bt->tile_gemm(d, bk, bq2r, 1.0f, t->dOp, c->ldqt, 1, w->Pp, c->ldp, 1, dVt, (size_t)c->BK, NULL);
    else if (c->bt)
        c->bt->tile_gemm(bk, d, bq2r, 1.0f, w->Pp, 1, c->ldp, t->dOp, c->ldvw, 1, dVt, (size_t)d, NULL);
    else
        c->sk->tile_gemm(je, d, bq - r_lo, 1.0f, w->P + (size_t)r_lo * c->ldp, 1, c->ldp,
                         t->dOc + (size_t)r_lo * c->ldc, c->ldc, 1, dVt, (size_t)d, NULL);
}

/* dS = P (dP - delta) of a tile pair (delta: the tile's first row's, rows H apart), then dK (bk, d)
 * += scale dS^T (bk, bq) Q (bq, d) (acc_tb: dK^T (d, bk) += Q^T (d, bq) scale dS) and dQ (bq, d)
 * += scale dS (bq, bk) K (bk, d) into dq_tile (rows dq_ld apart). The bf16 tiles pack scale dS
 * straight into its pairs and rows (nothing fp32 written); fp32 writes dS into P and scales in the
 * products. pfdq: the dq rows, during the dK product; pfq: the next query tile, during dQ's. */
static inline void bwd_ds_dk_dq(const BwdCall *c, BwdWork *w, const BwdQueries *t, int bq, int bk, int r_lo, int je,
                                const float *delta, int H, float *dKt, float *dq_tile, size_t dq_ld, Prefetch *pfdq,
                                Prefetch *pfq) {
    const int d = c->d, want_dk = c->dk != NULL, bqe = bq - r_lo;
    const size_t ldp = c->ldp;
    if (c->bt) {
        const int bq2r = (bq + 1) / 2, bk2r = (bk + 1) / 2; /* pair steps over bq, bk */
        float dl[FA_MAX_TILE];
        for (int r = 0; r < bq; r++) dl[r] = delta[(size_t)r * H];
        c->bt->ds_pack(w->P, w->dP, ldp, bq, bk, dl, c->scale, w->Pp, ldp, w->dSr, c->ldsw); /* scale dS */
        if (want_dk && c->acc_tb) /* dK^T (d, bk) += Q^T (d, bq) (scale dS) (bq, bk) */
            c->bt->tile_gemm(d, bk, bq2r, 1.0f, t->Qp, c->ldqt, 1, w->Pp, ldp, 1, dKt, (size_t)c->BK, pfdq);
        else if (want_dk) /* dK (bk, d) += (scale dS)^T (bk, bq) Q (bq, d) */
            c->bt->tile_gemm(bk, d, bq2r, 1.0f, w->Pp, 1, ldp, t->Qp, c->ldvw, 1, dKt, (size_t)d, pfdq);
        if (dq_tile) /* dQ (bq, d) += (scale dS) (bq, bk) K (bk, d) */
            c->bt->tile_gemm(bq, d, bk2r, 1.0f, w->dSr, c->ldsw, 1, w->Kp, c->ldc, 1, dq_tile, dq_ld, pfq);
    } else {
        for (int r = r_lo; r < bq; r++) /* dS = P * (dP - delta), into P */
            c->sk->ds_row(w->P + (size_t)r * ldp, w->dP + (size_t)r * ldp, je, delta[(size_t)r * H]);
        const float *dS = w->P + (size_t)r_lo * ldp;
        if (want_dk) /* dK (bk, d) += scale dS^T (bk, bq) Q (bq, d) */
            c->sk->tile_gemm(je, d, bqe, c->scale, dS, 1, ldp, t->Qc + (size_t)r_lo * c->ldc, c->ldc, 1, dKt,
                             (size_t)d, pfdq);
        if (dq_tile) /* dQ (bq, d) += scale dS (bq, bk) K (bk, d) */
            c->sk->tile_gemm(bqe, d, je, c->scale, dS, ldp, 1, w->Kc, c->ldc, 1, dq_tile + (size_t)r_lo * dq_ld,
                             dq_ld, pfq);
    }
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
    const size_t ldq = (size_t)H * d, ldk = (size_t)Hkv * d, ldp = (size_t)BK + FA_SKEW;
    if (bt && (size_t)BK + (size_t)bt->mr > ldp) /* P and dS pairs are read transposed, up to mr words past */
        die("internal: attn_backward: key tile %d plus the bf16 tiles' %d rows exceeds the stride %zu", BK, bt->mr, ldp);
    const size_t ldc = (size_t)d + FA_SKEW; /* row stride of the compact k, q and dout tiles */
    const int W = s->window;

    /* the key tiles any query tile sees, heaviest first */
    TileGrid tg;
    tile_grid_init(&tg, s, q_pos, q_doc, kv_pos, kv_doc, BQ, BK, 1);
    const int n_busy = tg.n_busy;

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
    BwdCall c = {.sk = sk, .bt = bt, .passes_on = passes_on, .d = d, .d2 = (d + 1) / 2, .BQ = BQ, .BK = BK,
                 .Hkv = Hkv, .PR = PR, .pr2 = (PR + 1) / 2, .nqp = (PR + BQ - 1) / BQ, .ldp = ldp, .ldc = ldc,
                 .alpha = (float)(s->scale * FA_LOG2E), .scale = s->scale, .dk = dk, .dv = dv};
    /* with passes: the kv head's dK and dV, (n_kv, d) each, across its passes */
    c.dKall = passes_on && dk ? xzalloc_filled((size_t)n_kv * d * sizeof(float)) : NULL;
    c.dVall = passes_on && dv ? xzalloc_filled((size_t)n_kv * d * sizeof(float)) : NULL;
    /* bf16 tiles: Q and dO of the current pass (ph query heads, PR rows) in rows and pairs layouts,
     * packed once per pass (every key tile reads them), (ph, PR, ldkw) and (ph, PR / 2, ldvw) pair
     * words each; per thread: K^T, V^T pairs (d2, ldp) | K pairs (BK/2, ldc) | K or V rows (BK, d2)
     * | P or dS pairs (BQ/2, ldp) | dS rows (BQ, ldsw). ldp >= BK + mr: P and dS pairs are read
     * transposed. Query tiles and passes start at even rows (BQ even), so a tile's pairs are the
     * pass's. */
    const int d2 = c.d2, bk2 = (BK + 1) / 2, bq2 = (BQ + 1) / 2;
    c.ldkw = bt ? attn_bf16_rows_ld(bt, d2) : 0;
    c.ldvw = (size_t)d + FA_SKEW / 2;
    c.ldsw = (size_t)bk2 + FA_SKEW;
    const size_t per_thread_w = (2 * (size_t)d2 * ldp + (size_t)bk2 * ldc + (size_t)BK * d2 + (size_t)bq2 * ldp +
                                 (size_t)BQ * c.ldsw + 15) / 16 * 16;
    bf16_pair *work_w = bt ? words_zeroed((size_t)nth * per_thread_w) : NULL;
    /* bwd_acc_transposed (the AMX tiles): dK and dV accumulate transposed, dK^T (d, bk) += Q^T (d,
     * bq) dS (bq, bk) and dV^T += dO^T P, so that every operand of the five products loads in
     * place (dS and P as their pairs, Q^T and dO^T in rows layout) instead of P^T and dS^T being
     * transposed into the tiles' A panels; Q^T and dO^T are packed once per pass, a query tile at a
     * time, (ph, nqp, d, ldqt) words each (each tile contiguous, as the forward's V^T), in place of
     * Q's and dO's pairs. The per-thread dK and dV sums are then (d, BK), turned back into rows as
     * they are added to dk, dv (or dKall, dVall) at the end of each key tile. */
    c.acc_tb = bt && bt->bwd_acc_transposed && (size_t)bq2 <= ldp; /* a tile's Q pairs fit Vt */
    c.ldqt = ((size_t)bq2 + 15) / 16 * 16;
    const size_t rows_w = (size_t)ph * PR * c.ldkw;
    const size_t pairs_w = c.acc_tb ? (size_t)ph * c.nqp * d * c.ldqt : (size_t)ph * c.pr2 * c.ldvw;
    c.Qrows = bt ? words_zeroed(rows_w) : NULL;
    c.dOrows = bt && (dq || dk) ? words_zeroed(rows_w) : NULL;
    /* Q and dO pairs (ph, PR / 2, ldvw), or under acc_tb Q^T and dO^T rows */
    c.Qpairs = bt && dk ? words_zeroed(pairs_w) : NULL;
    c.dOpairs = bt && dv ? words_zeroed(pairs_w) : NULL;
    /* fp32: Q and dO of the current pass, compact rows of ldc, (ph, PR, ldc) each, copied once per
     * pass (every key tile reads them; a copy per tile pair measured ~6% of the backward at
     * S = 8192) */
    c.Qf = bt ? NULL : xzalloc_filled((size_t)ph * PR * ldc * sizeof(float));
    c.dOf = bt ? NULL : xzalloc_filled((size_t)ph * PR * ldc * sizeof(float));

#pragma omp parallel num_threads(nth)
    {
        const int tid = omp_get_thread_num();
        BwdWork w = {.Kt = work + (size_t)tid * per_thread};
        w.Vt = w.Kt + (size_t)d * ldp;
        w.P = w.Vt + (size_t)d * ldp;
        w.dP = w.P + (size_t)BQ * ldp;
        w.dKa = w.dP + (size_t)BQ * ldp;
        w.dVa = w.dKa + (size_t)BK * d;
        w.Kc = w.dVa + (size_t)BK * d;
        w.Wide = w.Kc + (size_t)BK * ldc;
        if (bt) {
            w.KTw = work_w + (size_t)tid * per_thread_w;
            w.VTw = w.KTw + (size_t)d2 * ldp;
            w.Kp = w.VTw + (size_t)d2 * ldp;
            w.Tr = w.Kp + (size_t)bk2 * ldc;
            w.Pp = w.Tr + (size_t)BK * d2;
            w.dSr = w.Pp + (size_t)bq2 * ldp;
        }
        for (int g = 0; g < Hkv; g++) {
            const int h0 = g * group;
            if (passes_on) { /* this kv head's dK and dV, summed across its passes, start at 0 */
#pragma omp for schedule(static)
                for (int j = 0; j < n_kv; j++) {
                    if (c.dKall) memset(c.dKall + (size_t)j * d, 0, (size_t)d * sizeof(float));
                    if (c.dVall) memset(c.dVall + (size_t)j * d, 0, (size_t)d * sizeof(float));
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
                    for (int x = 0; x < n_busy; x++) {
                        const int kt = tg.order[x].idx;
                        if (!passes_on || next_query_tile(&tg, kt, qt0, qt1) < qt1)
                            items[n_items++] = (BwdItem){kt, x % nslots, slot_items[x % nslots]++};
                    }
                }
                /* Q, dO of this pass, packed once: rows and pairs, or compact rows */
#pragma omp for schedule(static)
                for (long long t = 0; t < (long long)ph * (qt1 - qt0); t++) {
                    const int hp = (int)(t / (qt1 - qt0)), qt = qt0 + (int)(t % (qt1 - qt0)), i0 = qt * BQ;
                    bwd_pack_query_tile(&c, &w, s, q, dout, ((size_t)i0 * H + h0 + ha + hp) * d, ldq,
                                        tile_len(qt, BQ, n_q), bwd_queries(&c, hp, qt, qt0, r0));
                } /* implicit barrier: the copies, the zeroed slots, the items and turns are ready */
                /* The key tiles to whichever thread comes free (heaviest first); the tile at place x
                 * of the whole order sums its dq terms into slot x % nslots, at its turn there
                 * (attn_backward_dq_slots), so which thread took it, and when, never changes a bit
                 * of the gradients, nor do passes. */
#pragma omp for schedule(dynamic, 1) nowait
                for (int it = 0; it < n_items; it++) {
                    const int kt = items[it].kt, j0 = kt * BK, bk = tile_len(kt, BK, n_kv);
                    const int slot = items[it].slot, my_turn = items[it].turn;
                    int have_turn = !dq; /* waited for this slot's turn (no dq: no turns) */
                    if (s->progress && it > 0 && tid == 0) s->progress(s->progress_arg);
                    /* slot 0 accumulates straight into dq; the others into their (PR, ph, d) buffer */
                    float *dq_base = !dq ? NULL : slot == 0 ? dq + ((size_t)r0 * H + h0 + ha) * d : dqbuf[slot];
                    const size_t dq_ld = slot == 0 ? ldq : (size_t)ph * d; /* row stride of dq_base */
                    const int *kp = kv_pos ? kv_pos + j0 : NULL, *kd = kv_doc ? kv_doc + j0 : NULL;
                    bwd_load_key_tile(&c, &w, s, k, v, ((size_t)j0 * Hkv + g) * d, ldk, bk, dq != NULL);
                    float *dKt, *dVt; /* this tile's dK and dV sums */
                    bwd_sums_start(&c, &w, j0, bk, &dKt, &dVt);
                    for (int hp = 0; hp < ph; hp++) {
                        const int h = h0 + ha + hp;
                        for (int qt = next_query_tile(&tg, kt, qt0, qt1), nq; qt < qt1; qt = nq) {
                            nq = next_query_tile(&tg, kt, qt + 1, qt1);
                            const int cls = pair_class(&tg, qt, kt), i0 = qt * BQ, bq = tile_len(qt, BQ, n_q);
                            const int *qp = q_pos ? q_pos + i0 : NULL, *qd = q_doc ? q_doc + i0 : NULL;
                            const size_t row0 = (size_t)i0 * H + h; /* the tile's first (query, head) row */
                            /* fp32, a pair across the diagonal: its products run over rows r_lo.. (the
                             * leading rows before the key tile's first key see none of it) and keys
                             * ..je - 1 (visible_keys) */
                            int r_lo = 0, je = bk;
                            if (cls == TILE_PARTIAL && !bt) {
                                while (r_lo < bq && qp[r_lo] < tg.kr[kt].pos_lo) r_lo++;
                                je = visible_keys(kp, bk, tg.qr[qt].pos_hi);
                                if (r_lo == bq || je == 0) continue;
                            }
                            const BwdQueries qt_ops = bwd_queries(&c, hp, qt, qt0, r0);
                            Prefetch pfq, pfp; /* the next visible query tile's Q and dO */
                            bwd_prefetch(&c, hp, nq, qt0, qt1, r0, n_q, &pfq, &pfp);
                            if (!bwd_probs(&c, &w, &qt_ops, bq, bk, r_lo, je, cls, tg.kr[kt], lse + row0, H, qp, qd, kp,
                                           kd, W))
                                continue;
                            if (dv) bwd_dv(&c, &w, &qt_ops, bq, bk, r_lo, je, dVt);
                            if (!dq && !dk) continue;
                            /* dP (bq, bk) = dO (bq, d) V^T (d, bk): the score product's shape, alpha 1 */
                            score_tile(sk, bt, bq - r_lo, je, d, 1.0f,
                                       bt ? (const void *)qt_ops.dOr
                                          : (const void *)(qt_ops.dOc + (size_t)r_lo * ldc),
                                       bt ? c.ldkw : ldc, bt ? (const void *)w.VTw : (const void *)w.Vt, ldp,
                                       w.dP + (size_t)r_lo * ldp, ldp, bt ? &pfp : NULL);
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
                            bwd_ds_dk_dq(&c, &w, &qt_ops, bq, bk, r_lo, je, delta + row0, H, dKt, dq_tile, dq_ld,
                                         &pfdq, &pfq);
                        }
                    }
                    bwd_sums_store(&c, &w, g, j0, bk);
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
                for (int x = 0; x < n_busy; x++) {
                    const int j0 = tg.order[x].idx * BK, bk = tile_len(tg.order[x].idx, BK, n_kv);
                    for (int j = 0; j < bk; j++) {
                        size_t off = ((size_t)(j0 + j) * Hkv + g) * d;
                        if (dk) sk->add_row(dk + off, c.dKall + (size_t)(j0 + j) * d, (size_t)d);
                        if (dv) sk->add_row(dv + off, c.dVall + (size_t)(j0 + j) * d, (size_t)d);
                    }
                }
            }
        }
    }
    for (int t = 1; t < nslots; t++) xfree(dqbuf[t]);
    xfree(dqbuf);
    xfree(work);
    xfree(work_w);
    xfree(c.Qrows);
    xfree(c.dOrows);
    xfree(c.Qpairs);
    xfree(c.dOpairs);
    xfree(c.Qf);
    xfree(c.dOf);
    xfree(c.dKall);
    xfree(c.dVall);
    xfree(items);
    xfree(slot_items);
    xfree(turn);
    tile_grid_free(&tg);
}
