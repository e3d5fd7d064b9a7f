/* The schedules the strategies play (strategy_play, parallel/step_schedule.h) against what they
 * send: for every registered strategy, every setting of its knobs the planner tries
 * (strategy_candidates), grids of 1 to 8 ranks, the three layouts, head counts that do and do not
 * divide (GQA, MQA, KV replication), sliding windows and the bf16 wire, each member's bytes and
 * messages per kind in the played forward and backward equal strategy_volume's, exactly; every
 * message goes between two members of the group and is waited within the schedule; forward and
 * backward compute the same blocks in all (cells over the group), and cover every (query, key) pair
 * the causal mask and window let through, for every head, exactly once. The cells of each rank against a
 * real run's work counters: test_dist_attention and test_fpdt. No MPI. */
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "strategies/registry.h"
#include "testlib.h"

static const char *kind_label(int k) { return comm_kind_name((CommKind)k); }

/* One configuration: plays both passes and compares. */
static void check_config(const Strategy *s, const StrategyParams *p, const char *what) {
    StepSchedule pass[2];
    unsigned long long cells[2] = {0, 0}, pairs[2] = {0, 0};
    for (int ps = 0; ps < 2; ps++) {
        StepSchedule *sc = &pass[ps];
        strategy_play(s, p, (SchedulePass)ps, sc);
        int bad_msg = 0;
        for (int i = 0; i < sc->n_messages; i++) {
            const StepMessage *m = &sc->messages[i];
            if (m->from < 0 || m->from >= sc->members || m->to < 0 || m->to >= sc->members || m->from == m->to ||
                !m->bytes || m->step + m->steps > sc->n_steps)
                bad_msg++;
        }
        CHECK(!bad_msg, "%s %s: %d messages out of the group, to itself, empty or waited past the end", what,
              ps ? "backward" : "forward", bad_msg);
        int ordered = 1;
        for (int i = 0; i < sc->n_steps; i++) {
            const ScheduleStep *st = &sc->steps[i];
            for (int j = st->compute0; j < st->compute0 + st->n_compute; j++) ordered &= sc->compute[j].step == i;
            for (int j = st->message0; j < st->message0 + st->n_message; j++) ordered &= sc->messages[j].step == i;
        }
        CHECK(ordered, "%s: events not grouped by step", what);
        int mismatch = 0;
        char first[240] = "";
        MemberTotals *all = xmalloc(sizeof *all * (size_t)sc->members);
        schedule_totals(sc, all);
        for (int i = 0; i < sc->n_compute; i++) pairs[ps] += sc->compute[i].pairs * (unsigned)sc->compute[i].heads;
        for (int h = 0; h < p->hp; h++)
            for (int c = 0; c < p->cp; c++) {
                AttnVolume v;
                strategy_volume(s, p, h, c, &v);
                const MemberTotals t = all[c * p->hp + h];
                cells[ps] += t.cells;
                for (int k = 0; k < COMM_KINDS; k++) {
                    const unsigned long long want = ps ? v.bwd[k] : v.fwd[k], msgs = ps ? v.bwd_msgs[k] : v.fwd_msgs[k];
                    if (t.bytes[k] == want && t.msgs[k] == msgs) continue;
                    if (!mismatch++)
                        snprintf(first, sizeof first, "member hp %d cp %d %s: played %llu bytes in %llu messages, "
                                 "volume %llu in %llu", h, c, kind_label(k), t.bytes[k], t.msgs[k], want, msgs);
                }
            }
        xfree(all);
        CHECK(!mismatch, "%s %s: %d (member, kind) totals differ from strategy_volume, first: %s", what,
              ps ? "backward" : "forward", mismatch, first);
    }
    CHECK(cells[0] == cells[1] && cells[0] > 0, "%s: forward computes %llu cells, backward %llu", what, cells[0],
          cells[1]);
    /* every (query, key) pair the mask lets through, for every head, exactly once a pass */
    unsigned long long visible = 0;
    for (long q = 0; q < p->seq_len; q++) visible += (unsigned long long)(p->window > 0 && q + 1 > p->window ? p->window : q + 1);
    visible *= (unsigned)p->n_heads;
    CHECK(pairs[0] == visible && pairs[1] == visible, "%s: the blocks cover %llu (forward) and %llu (backward) "
          "visible pairs x heads, the mask lets %llu through", what, pairs[0], pairs[1], visible);
    schedule_free(&pass[0]);
    schedule_free(&pass[1]);
}

/* pos_blocks_work's visible pairs against a count of every (query, key) pair: blocks made of runs
 * of random strides (decreasing and constant query runs too, whose count takes the row-by-row
 * path), with and without a window. */
static void test_work_counts(void) {
    unsigned seed = 12345;
    int bad = 0, tried = 0;
    for (int t = 0; t < 400; t++) {
        int pos[2][64];
        PosRun runs[2][64];
        int n[2];
        for (int side = 0; side < 2; side++) {
            n[side] = 0;
            const int pieces = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 4;
            for (int k = 0; k < pieces; k++) {
                seed = seed * 1103515245u + 12345u;
                const int start = (int)(seed >> 16) % 200, len = 1 + (int)(seed >> 8) % 15;
                int stride = 1 + (int)(seed >> 4) % 7;
                if (side == 0 && (seed >> 24) % 5 == 0) stride = -stride; /* a decreasing query run */
                if (side == 0 && (seed >> 24) % 7 == 1) stride = 0;       /* one position repeated */
                for (int i = 0; i < len && n[side] < 64; i++) pos[side][n[side]++] = start + i * stride;
            }
        }
        PosBlock q, kb;
        pos_block_init(&q, pos[0], NULL, n[0], runs[0]);
        pos_block_init(&kb, pos[1], NULL, n[1], runs[1]);
        int distinct = 1; /* a key run needs a rising stride (run_keys_in's rule): keys sorted and distinct */
        for (int j = 0; j < kb.n_runs; j++)
            if (runs[1][j].len > 1 && pos[1][runs[1][j].start + 1] <= pos[1][runs[1][j].start]) distinct = 0;
        if (!distinct) continue;
        const int windows[] = {0, 1, 9, 60};
        for (size_t wi = 0; wi < ARRAY_LEN(windows); wi++) {
            const int w = windows[wi];
            unsigned long long cells, calls, visible, expect = 0;
            pos_blocks_work(&q, &kb, w, &cells, &calls, &visible);
            for (int i = 0; i < n[0]; i++)
                for (int j = 0; j < n[1]; j++) expect += pos[1][j] <= pos[0][i] && (w <= 0 || pos[1][j] > pos[0][i] - w);
            bad += visible != expect;
            tried++;
        }
    }
    CHECK(tried > 500 && !bad, "pos_blocks_work: %d of %d random blocks count other visible pairs than one by one", bad,
          tried);
}

/* pos_block_init_pieces on the layouts' slots (the pieces layout_context_pieces names) against
 * pos_block_init: the same runs, for every slot of lengths and group sizes with short, single and
 * merging chunks. */
static void test_slot_pieces(void) {
    int bad = 0, tried = 0;
    for (int lay = 0; lay < 3; lay++)
        for (int cp = 1; cp <= 9; cp++)
            for (int n = 1; n <= 12; n++) {
                const int S = cp * n;
                int starts[2], pos[12];
                PosRun a[12], b[12];
                const int pieces = layout_context_pieces((TokenLayout)lay, S, cp, starts);
                if (!pieces) continue;
                for (int c = 0; c < cp; c++) {
                    PosBlock x, y;
                    layout_context_positions((TokenLayout)lay, S, cp, c, pos);
                    pos_block_init(&x, pos, NULL, n, a);
                    pos_block_init_pieces(&y, pos, n, b, starts, pieces);
                    int same = x.n_runs == y.n_runs;
                    for (int i = 0; same && i < x.n_runs; i++) same = !memcmp(&a[i], &b[i], sizeof a[i]);
                    bad += !same;
                    tried++;
                }
            }
    CHECK(tried > 500 && !bad, "pos_block_init_pieces: %d of %d layout slots cut into other runs than pos_block_init's",
          bad, tried);
}

int main(void) {
    test_work_counts();
    test_slot_pieces();
    typedef struct { int H, Hkv, d; } Heads;
    const Heads heads[] = {{4, 4, 16}, {8, 2, 16}, {4, 1, 32}, {5, 5, 16}, {6, 2, 16}, {7, 1, 16}};
    const int windows[] = {0, 5, 40};
    long configs = 0;
    for (int si = 0; strategy_at(si); si++) {
        const Strategy *s = strategy_at(si);
        long mine = 0;
        for (int sp = 1; sp <= 8; sp++)
            for (int hp = 1; hp <= sp; hp++) {
                if (sp % hp) continue;
                const int cp = sp / hp;
                if ((s->grid == GRID_HEADS_ONLY && cp > 1) || (s->grid == GRID_CONTEXT_ONLY && hp > 1)) continue;
                for (int lay = 0; lay < 3; lay++)
                    for (size_t hi = 0; hi < ARRAY_LEN(heads); hi++)
                        for (size_t wi = 0; wi < ARRAY_LEN(windows); wi++) {
                            const long S = 96;
                            StrategyFixed fixed = {.placement = -1, .seq_len = S};
                            StrategyCandidate cand[32];
                            const int n = strategy_candidates(s, hp, cp, &fixed, cand, 32);
                            for (int ci = 0; ci < n; ci++) {
                                StrategyParams p = {.hp = hp, .cp = cp, .dp = 1,
                                                    .placement = cand[ci].placement, .layout = (TokenLayout)lay,
                                                    .seq_len = S, .n_heads = heads[hi].H,
                                                    .n_kv_heads = heads[hi].Hkv, .head_dim = heads[hi].d,
                                                    .window = windows[wi], .wire_bf16 = (int)((hi + wi) % 2)};
                                strategy_apply_knobs(s, &cand[ci].knobs, &p);
                                strategy_defaults(s, &p);
                                char *err = strategy_check(s, &p);
                                if (err) { /* heads the grid cannot split, a layout the strategy refuses */
                                    xfree(err);
                                    continue;
                                }
                                char what[200];
                                snprintf(what, sizeof what, "%s hp %d cp %d W %d team %d chunks %d %s H %d/%d window %d%s",
                                         s->name, hp, cp, p.ring_inner, p.team, p.chunks, layout_name(p.layout), p.n_heads,
                                         p.n_kv_heads, p.window, p.wire_bf16 ? " bf16 wire" : "");
                                check_config(s, &p, what);
                                mine++;
                            }
                        }
            }
        CHECK(mine > 0, "%s: no configuration played", s->name);
        printf("%s: %ld configurations played\n", s->name, mine);
        configs += mine;
    }
    printf("%ld configurations in all\n", configs);
    return test_summary("test_schedule");
}
