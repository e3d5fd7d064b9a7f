/* Token layouts for sequence parallelism: see layout.h. */
#include "parallel/layout.h"

#include <string.h>

#include "core/common.h"

TokenLayout layout_parse(const char *s) {
    if (!strcmp(s, "contiguous")) return LAYOUT_CONTIGUOUS;
    if (!strcmp(s, "zigzag")) return LAYOUT_ZIGZAG;
    if (!strcmp(s, "striped")) return LAYOUT_STRIPED;
    die_collective("unknown layout '%s': use contiguous, zigzag or striped", s);
}

const char *layout_name(TokenLayout l) {
    switch (l) {
    case LAYOUT_CONTIGUOUS: return "contiguous";
    case LAYOUT_ZIGZAG: return "zigzag";
    default: return "striped";
    }
}

/* Zigzag runs over the context group only: a context member's S / cp tokens are its two chunks of
 * S / 2cp, split contiguously over its hp members (layout_positions). So S must divide by 2 cp and
 * by hp cp: by their least common multiple, cp lcm(2, hp) (2 hp cp only for odd hp; for hp = 1,
 * or cp = 1, where zigzag is the natural order, S divisible by 2 cp or hp and even). */
char *layout_split_error(TokenLayout l, long S, int hp, int cp) {
    const long h = hp > 0 ? hp : 1, sp = h * cp;
    const long unit = l == LAYOUT_ZIGZAG ? cp * (h % 2 ? 2 * h : h) : sp; /* zigzag: cp lcm(2, hp) */
    if (S > 0 && S % unit == 0) return NULL;
    long below = S / unit * unit, above = below + unit;
    char buf[256];
    if (below > 0)
        snprintf(buf, sizeof buf,
                 "--seq-len %ld does not split under the %s layout over hp x cp = %ld ranks: it must be divisible by "
                 "%ld (e.g. %ld or %ld)", S, layout_name(l), sp, unit, below, above);
    else /* one example: the nearest above (below would be 0) */
        snprintf(buf, sizeof buf,
                 "--seq-len %ld does not split under the %s layout over hp x cp = %ld ranks: it must be divisible by "
                 "%ld (e.g. %ld)", S, layout_name(l), sp, unit, above);
    return xstrdup(buf);
}

void layout_context_positions(TokenLayout l, int S, int cp, int c, int *positions) {
    int n = S / cp;
    switch (l) {
    case LAYOUT_CONTIGUOUS:
        for (int i = 0; i < n; i++) positions[i] = c * n + i;
        break;
    case LAYOUT_ZIGZAG: {
        int half = n / 2; /* chunk size S / (2 cp) */
        for (int i = 0; i < half; i++) {
            positions[i] = c * half + i;
            positions[half + i] = (2 * cp - 1 - c) * half + i;
        }
        break;
    }
    case LAYOUT_STRIPED:
        for (int i = 0; i < n; i++) positions[i] = c + i * cp;
        break;
    }
}

int layout_context_pieces(TokenLayout l, int S, int cp, int starts[2]) {
    const int n = S / cp;
    starts[0] = 0;
    if (l != LAYOUT_ZIGZAG) return 1; /* contiguous, striped: one progression */
    if (n % 2 || n == 0) return 0;    /* a zigzag slot that is not two chunks: not known */
    starts[1] = n / 2;                /* zigzag: its two chunks */
    return 2;
}

void layout_positions(TokenLayout l, int S, int hp, int cp, int h, int c, int *positions) {
    int n_ctx = S / cp, n = n_ctx / hp;
    int *ctx = xmalloc(sizeof(int) * (size_t)n_ctx);
    layout_context_positions(l, S, cp, c, ctx);
    memcpy(positions, ctx + (size_t)h * n, sizeof(int) * (size_t)n);
    xfree(ctx);
}
