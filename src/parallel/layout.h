/* Token layouts: which global tokens each rank of a sequence-parallel group holds.
 *
 * The layout is defined for the cp context slots first: context rank c attends with the token
 * set T_c (S / cp tokens, in this order):
 *   contiguous: [c S/cp, (c+1) S/cp)
 *   zigzag:     chunks c and 2cp-1-c of 2cp equal chunks (causal work balanced over the ring)
 *   striped:    c, c + cp, c + 2 cp, ...
 * T_c is then cut into hp consecutive pieces of S / sp tokens: head-group member h holds piece h.
 * After the head all-to-all (received pieces placed in member order) context rank c holds T_c
 * in order, e.g. the zigzag pair, so the ring stays balanced under 2D attention (notes §4).
 * The loader permutes tokens, targets and positions once per batch; nothing moves at run time.
 * Requirements: S divisible by 2 sp (zigzag) or sp (contiguous, striped). */
#ifndef SEQPAR_LAYOUT_H
#define SEQPAR_LAYOUT_H

typedef enum { LAYOUT_CONTIGUOUS = 0, LAYOUT_ZIGZAG = 1, LAYOUT_STRIPED = 2 } TokenLayout;

TokenLayout layout_parse(const char *s);   /* dies naming the value and the choices */
const char *layout_name(TokenLayout l);

/* NULL when S splits under the layout over hp x cp ranks; otherwise a one-line message naming the
 * nearest valid lengths (xmalloc'd: free with xfree). */
char *layout_split_error(TokenLayout l, long S, int hp, int cp);

/* positions (S / (hp cp)): the global positions held by head member h of context rank c. */
void layout_positions(TokenLayout l, int S, int hp, int cp, int h, int c, int *positions);

/* positions (S / cp): the context slot's token set T_c, in order. */
void layout_context_positions(TokenLayout l, int S, int cp, int c, int *positions);

/* Where the positions layout_context_positions gives a slot may stop being one arithmetic
 * progression: the first index of each piece (piece k: [starts[k], starts[k + 1]), the last to S /
 * cp), inside which they are one. Returns the pieces (at most 2), 0 where the layout does not
 * split S / cp tokens evenly (a zigzag slot of an odd count). */
int layout_context_pieces(TokenLayout l, int S, int cp, int starts[2]);

#endif
