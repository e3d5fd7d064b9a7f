/* How the token layouts balance packed-document attention: for sequences of S tokens packed from
 * documents of random lengths, the exact causal-and-document work (visible (query, key) pairs) of
 * each of P context ranks under the ring / all-gather layouts (contiguous, zigzag, striped: a rank
 * computes its own queries against every key) and under LightSeq's plan (contiguous slots, ranks
 * < P/2 help later ones: the blocks each rank computes, lightseq.h). Prints, per layout, total work
 * / slowest rank's work (ideal P) averaged over the sequences, and the worst sequence.
 * Head-parallel strategies (Ulysses, FPDT) split heads, not tokens: always exactly P.
 *
 * Besides the exact work, the score cells the forward kernel really computes for the ring /
 * all-gather layouts: block_attention's pieces (256 query rows of one position run) against key
 * runs, cut into the kernel's tiles (this CPU's forward tile sizes), each classified by
 * attn_visibility on its position and document spans; tiles across a document boundary compute
 * masked cells. Printed as the slowest rank's cells / its visible pairs (1 = no waste) and all
 * visible pairs / the slowest rank's cells (the speed-up the layout allows, ideal P).
 *
 * Document lengths: log-normal with the given median and sigma, at least 1 token, and a document
 * does not continue into the next sequence (the last one is cut), as `--pack` sees a token stream.
 *
 * usage: packed_balance [S [P [median [sigma [sequences]]]]]   (defaults 32768 8 1024 1.2 200)
 * Build: make bench-tools (or make build/bench/packed_balance). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "data/packing.h"
#include "kernels/isa.h"
#include "parallel/block_attention.h"
#include "parallel/layout.h"
#include "strategies/lightseq.h"

enum { L_CONTIG, L_ZIGZAG, L_STRIPED, L_LIGHTSEQ, N_L };
static const char *names[N_L] = {"ring / all-gather, contiguous", "ring / all-gather, zigzag",
                                 "ring / all-gather, striped", "LightSeq (contiguous)"};

/* Visible pairs of the queries at positions [q0, q0 + nq) against the keys at [k0, k0 + n): a
 * query at q sees the keys of its document up to q, i.e. [start[q], q] (documents are contiguous). */
static long long block_pairs(const int *start, int q0, int nq, int k0, int n) {
    long long c = 0;
    for (int q = q0; q < q0 + nq; q++) {
        int lo = start[q] > k0 ? start[q] : k0, hi = q < k0 + n - 1 ? q : k0 + n - 1;
        if (hi >= lo) c += hi - lo + 1;
    }
    return c;
}

/* Score cells the forward kernel computes for queries qpos (n) against keys kpos (m), as
 * block_attention and flash_attention cut them (see the file comment). */
static long long kernel_cells(const int *start, const int *qpos, int n, const int *kpos, int m, int *qdoc, int *kdoc,
                              PosRun *qr, PosRun *kr) {
    const int BQ = simd()->fwd_bq, BK = simd()->fwd_bk, piece = 256;
    for (int i = 0; i < n; i++) qdoc[i] = start[qpos[i]];
    for (int j = 0; j < m; j++) kdoc[j] = start[kpos[j]];
    PosBlock qb, kb;
    pos_block_init(&qb, qpos, qdoc, n, qr);
    pos_block_init(&kb, kpos, kdoc, m, kr);
    long long cells = 0;
    for (int a = 0; a < qb.n_runs; a++)
        for (int r0 = 0; r0 < qb.runs[a].len; r0 += piece) {
            const int i0 = qb.runs[a].start + r0, nq = qb.runs[a].len - r0 < piece ? qb.runs[a].len - r0 : piece;
            const AttnSpan ps = attn_span(qpos + i0, qdoc + i0, nq);
            for (int c = 0; c < kb.n_runs; c++) {
                const PosRun *k = &kb.runs[c];
                AttnVisibility v = attn_visibility(ps, (AttnSpan){k->lo, k->hi, k->doc_lo, k->doc_hi}, 0);
                if (v == ATTN_VIS_HIDDEN) continue;
                if (v == ATTN_VIS_FULL) { /* the kernel runs it unmasked: every tile */
                    cells += (long long)nq * k->len;
                    continue;
                }
                for (int t0 = 0; t0 < nq; t0 += BQ) {
                    const int bq = nq - t0 < BQ ? nq - t0 : BQ;
                    const AttnSpan qt = attn_span(qpos + i0 + t0, qdoc + i0 + t0, bq);
                    for (int u0 = 0; u0 < k->len; u0 += BK) {
                        const int bk = k->len - u0 < BK ? k->len - u0 : BK;
                        const AttnSpan kt = attn_span(kpos + k->start + u0, kdoc + k->start + u0, bk);
                        if (attn_visibility(qt, kt, 0) != ATTN_VIS_HIDDEN) cells += (long long)bq * bk;
                    }
                }
            }
        }
    return cells;
}

int main(int argc, char **argv) {
    const int S = argc > 1 ? atoi(argv[1]) : 32768, P = argc > 2 ? atoi(argv[2]) : 8;
    const double median = argc > 3 ? atof(argv[3]) : 1024, sigma = argc > 4 ? atof(argv[4]) : 1.2;
    const int seqs = argc > 5 ? atoi(argv[5]) : 200;
    if (S <= 0 || P < 2 || P % 2 || S % (2 * P)) die("S must split in 2P chunks and P be even");
    const int n = S / P;
    int *start = xmalloc(sizeof(int) * (size_t)S), *pos = xmalloc(sizeof(int) * (size_t)S);
    int *kpos = xmalloc(sizeof(int) * (size_t)n), *qdoc = xmalloc(sizeof(int) * (size_t)n);
    int *kdoc = xmalloc(sizeof(int) * (size_t)n);
    PosRun *qr = xmalloc(sizeof(PosRun) * (size_t)n), *kr = xmalloc(sizeof(PosRun) * (size_t)n);
    double cell_speedup[3] = {0}, cell_waste[3] = {0};
    Rng rng;
    rng_seed(&rng, 12345);
    double sum_ratio[N_L] = {0}, worst[N_L], ideal_sum = 0;
    for (int l = 0; l < N_L; l++) worst[l] = 1e30;
    long long docs = 0;
    int carry = 0; /* tokens of the current document left over from the previous sequence */
    for (int q = 0; q < seqs; q++) {
        /* the document starts of this window */
        int at = 0, s0 = 0;
        int left = carry;
        while (at < S) {
            if (left <= 0) {
                left = (int)lround(median * exp(sigma * rng_normal(&rng)));
                if (left < 1) left = 1;
                s0 = at;
                docs++;
            }
            start[at++] = s0;
            left--;
        }
        carry = left;
        long long total = 0, rank_work[N_L][64] = {{0}}, rank_cells[3][64] = {{0}};
        if (P > 64) die("P <= 64");
        for (int c = 0; c < P; c++) {
            for (int l = L_CONTIG; l <= L_STRIPED; l++) {
                TokenLayout tl = l == L_CONTIG ? LAYOUT_CONTIGUOUS : l == L_ZIGZAG ? LAYOUT_ZIGZAG : LAYOUT_STRIPED;
                layout_context_positions(tl, S, P, c, pos);
                rank_work[l][c] = pack_visible_pairs(start, pos, n);
                long long cells = 0;
                for (int j = 0; j < P; j++) {
                    layout_context_positions(tl, S, P, j, kpos);
                    cells += kernel_cells(start, pos, n, kpos, n, qdoc, kdoc, qr, kr);
                }
                rank_cells[l][c] = cells;
            }
            total += rank_work[L_CONTIG][c];
        }
        /* LightSeq: the blocks (q slot, kv slot) each rank computes over the plan's steps */
        for (int r = 0; r < P; r++)
            for (int t = 0; t < lightseq_steps(P); t++) {
                LightseqStep st;
                lightseq_step(P, r, t, &st);
                if (st.q >= 0 && st.kv >= 0) { /* the block's query rows may be half of the slot */
                    int r0, nq;
                    lightseq_rows(st.rows, n, &r0, &nq);
                    rank_work[L_LIGHTSEQ][r] += block_pairs(start, st.q * n + r0, nq, st.kv * n, n);
                }
            }
        for (int l = 0; l < N_L; l++) {
            long long mx = 0, tot = 0;
            for (int c = 0; c < P; c++) {
                mx = rank_work[l][c] > mx ? rank_work[l][c] : mx;
                tot += rank_work[l][c];
            }
            if (tot != total) die("%s: work %lld, expected %lld", names[l], tot, total);
            double ratio = (double)total / (double)mx;
            sum_ratio[l] += ratio;
            if (ratio < worst[l]) worst[l] = ratio;
        }
        ideal_sum += (double)total;
        for (int l = 0; l < 3; l++) {
            long long mx = 0, tot = 0;
            int slow = 0;
            for (int c = 0; c < P; c++) {
                tot += rank_cells[l][c];
                if (rank_cells[l][c] > mx) mx = rank_cells[l][c], slow = c;
            }
            cell_speedup[l] += (double)total / (double)mx;
            cell_waste[l] += (double)mx / (double)rank_work[l][slow];
        }
    }
    printf("S = %d, P = %d, %d sequences, document lengths log-normal (median %.0f, sigma %.2f): %.1f documents per "
           "sequence, %.3g visible pairs per sequence (one document: %.3g)\n", S, P, seqs, median, sigma,
           (double)docs / seqs, ideal_sum / seqs, (double)S * (S + 1) / 2);
    printf("%-32s %s\n", "layout", "total / slowest rank (ideal P): mean, worst sequence");
    for (int l = 0; l < N_L; l++) printf("%-32s %.2fx  %.2fx\n", names[l], sum_ratio[l] / seqs, worst[l]);
    printf("kernel cells (forward tiles %d x %d, pieces of 256 rows), means: slowest rank's cells / its visible pairs "
           "(1 = no masked work); all visible pairs / slowest rank's cells (the speed-up bound, ideal P)\n",
           simd()->fwd_bq, simd()->fwd_bk);
    for (int l = 0; l < 3; l++) printf("%-32s %.2f  %.2fx\n", names[l], cell_waste[l] / seqs, cell_speedup[l] / seqs);
    xfree(start);
    xfree(pos);
    xfree(kpos);
    xfree(qdoc);
    xfree(kdoc);
    xfree(qr);
    xfree(kr);
    return 0;
}
