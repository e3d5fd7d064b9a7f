/* Tests for token streams (src/data/token_stream.h): a directory, glob or file of llm.c shards
 * read in name order as one concatenated stream, sequences crossing shard boundaries, wrapping
 * at the end, a cursor that resumes exactly, held-out (_val_) shards, and a one-line error for
 * each kind of bad input. The expected tokens come from a plain array of the concatenation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/token_stream.h"
#include "testlib.h"

static char base[256];
static const char *dir = base; /* where write_shard writes */

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

/* Writes shard `name` holding tokens first, first+1, ... (count of them) + offset_id. */
static void write_shard(const char *name, uint32_t first, size_t count, uint32_t offset_id) {
    uint32_t *t = malloc(sizeof(uint32_t) * count);
    for (size_t i = 0; i < count; i++) t[i] = first + (uint32_t)i + offset_id;
    char p[512];
    path_of(p, sizeof p, name);
    SeqErr e;
    if (tokens_write_llmc(p, t, count, &e) != 0) die("%s", e.msg);
    free(t);
}

/* Reads n_seq sequences of S from ts and compares them with the concatenation 0, 1, 2, ... of
 * `total` tokens, starting at global position *g (advanced as the stream should). */
static int check_sequences(TokenStream *ts, int S, int n_seq, size_t total, size_t *g, const char *what) {
    int *in = malloc(sizeof(int) * (size_t)S), *tg = malloc(sizeof(int) * (size_t)S);
    int bad = 0;
    for (int s = 0; s < n_seq && !bad; s++) {
        if (total - *g < (size_t)S + 1) *g = 0; /* the next epoch */
        SeqErr e;
        if (token_stream_next(ts, S, in, tg, &e) != 0) {
            fprintf(stderr, "%s: %s\n", what, e.msg);
            bad = 1;
            break;
        }
        for (int i = 0; i < S; i++)
            if (in[i] != (int)(*g + (size_t)i) || tg[i] != (int)(*g + (size_t)i + 1)) {
                fprintf(stderr, "%s: sequence %d token %d: got %d -> %d, expected %zu -> %zu\n", what, s, i, in[i],
                        tg[i], *g + (size_t)i, *g + (size_t)i + 1);
                bad = 1;
                break;
            }
        *g += (size_t)S;
    }
    free(in);
    free(tg);
    return !bad;
}

static int open_fails_with(const char *source, StreamRole role, const char *words) {
    TokenStream ts;
    SeqErr e;
    if (token_stream_open(&ts, source, TOKENS_AUTO, role, &e) == 0) {
        token_stream_close(&ts);
        fprintf(stderr, "'%s' opened\n", source);
        return 0;
    }
    if (!strstr(e.msg, words) || strchr(e.msg, '\n')) {
        fprintf(stderr, "message lacks '%s': %s\n", words, e.msg);
        return 0;
    }
    return 1;
}

int main(void) {
    snprintf(base, sizeof base, "/tmp/seqpar_stream_XXXXXX");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    /* three training shards of 10, 7 and 25 tokens (written out of order), a held-out shard, a
     * file that is not a shard's name and a hidden file, which the directory listing skips */
    write_shard("d_train_000001.bin", 10, 7, 0);
    write_shard("d_train_000000.bin", 0, 10, 0);
    write_shard("d_train_000002.bin", 17, 25, 0);
    write_shard("d_val_000000.bin", 0, 30, 0);
    char p[512];
    path_of(p, sizeof p, "notes.txt");
    FILE *f = fopen(p, "w");
    fputs("not a shard", f);
    fclose(f);
    path_of(p, sizeof p, ".hidden.bin");
    f = fopen(p, "w");
    fputs("x", f);
    fclose(f);
    const size_t total = 42;

    /* the directory: sorted, _val_ excluded; sequences cross both boundaries and wrap */
    TokenStream ts;
    SeqErr e;
    int rc = token_stream_open(&ts, dir, TOKENS_AUTO, STREAM_TRAIN, &e);
    CHECK(rc == 0, "open dir: %s", rc ? e.msg : "");
    if (rc != 0) return test_summary("test_token_stream");
    CHECK(ts.n_shards == 3 && ts.total == total, "dir: %d shards, %zu tokens (expected 3, 42)", ts.n_shards, ts.total);
    CHECK(ts.n_shards == 3 && strstr(ts.paths[0], "000000") && strstr(ts.paths[2], "000002"), "dir: not sorted");
    size_t g = 0;
    CHECK(check_sequences(&ts, 8, 13, total, &g, "dir S=8"), "dir S=8: sequences differ from the concatenation");
    /* the cursor resumes exactly: a fresh stream seeked to the saved (shard, offset) continues it */
    uint64_t shard = ts.shard, offset = ts.offset;
    size_t g_saved = g;
    CHECK(check_sequences(&ts, 8, 5, total, &g, "continued"), "continued stream differs");
    TokenStream ts2;
    rc = token_stream_open(&ts2, dir, TOKENS_AUTO, STREAM_TRAIN, &e);
    CHECK(rc == 0 && token_stream_seek(&ts2, shard, offset, &e) == 0, "reopen and seek");
    size_t g2 = g_saved;
    CHECK(rc == 0 && check_sequences(&ts2, 8, 5, total, &g2, "resumed"), "resumed stream differs");
    CHECK(rc == 0 && ts2.shard == ts.shard && ts2.offset == ts.offset, "resumed cursor (%llu, %llu) != (%llu, %llu)",
          (unsigned long long)ts2.shard, (unsigned long long)ts2.offset, (unsigned long long)ts.shard,
          (unsigned long long)ts.offset);
    /* a sequence longer than a whole shard spans three shards */
    CHECK(token_stream_seek(&ts2, 0, 3, &e) == 0, "seek (0, 3)");
    g2 = 3;
    CHECK(check_sequences(&ts2, 30, 3, total, &g2, "S=30"), "S=30 across three shards differs");
    /* the cursor after a sequence ending exactly at a shard boundary points into the next shard */
    CHECK(token_stream_seek(&ts2, 0, 0, &e) == 0, "seek (0, 0)");
    g2 = 0;
    CHECK(check_sequences(&ts2, 10, 1, total, &g2, "S=10") && ts2.shard == 1 && ts2.offset == 0,
          "after tokens 0..10 the cursor is (%llu, %llu), expected (1, 0)", (unsigned long long)ts2.shard,
          (unsigned long long)ts2.offset);
    /* seek outside the data */
    CHECK(token_stream_seek(&ts2, 3, 0, &e) != 0 && strstr(e.msg, "shard 3"), "seek to shard 3 accepted");
    CHECK(token_stream_seek(&ts2, 1, 8, &e) != 0 && strstr(e.msg, "data_cursor 8"), "seek past a shard's end accepted");
    token_stream_close(&ts2);
    /* the largest token id */
    uint32_t mx = 0;
    CHECK(token_stream_max_token(&ts, &mx, &e) == 0 && mx == 41, "max token %u, expected 41", mx);
    /* the vocabulary is checked when a shard loads, naming it */
    ts.vocab_size = 20;
    CHECK(token_stream_seek(&ts, 1, 0, &e) == 0, "seek (1, 0)");
    int in[8], tg[8];
    CHECK(token_stream_next(&ts, 8, in, tg, &e) != 0 && strstr(e.msg, "d_train_000002.bin") &&
              strstr(e.msg, "vocab_size is 20"), "a token above the vocabulary in shard 2 is not reported: %s", e.msg);
    token_stream_close(&ts);

    /* a glob gives the same stream; a single file is a one-shard stream */
    char pat[512];
    path_of(pat, sizeof pat, "d_train_*.bin");
    rc = token_stream_open(&ts, pat, TOKENS_AUTO, STREAM_TRAIN, &e);
    g = 0;
    CHECK(rc == 0 && ts.n_shards == 3 && check_sequences(&ts, 8, 13, total, &g, "glob"), "glob stream differs");
    if (rc == 0) token_stream_close(&ts);
    path_of(p, sizeof p, "d_train_000000.bin");
    rc = token_stream_open(&ts, p, TOKENS_AUTO, STREAM_TRAIN, &e);
    g = 0;
    CHECK(rc == 0 && ts.n_shards == 1 && check_sequences(&ts, 4, 6, 10, &g, "file"), "single-file stream differs");
    if (rc == 0) token_stream_close(&ts);

    /* validation: the directory's _val_ shards only */
    rc = token_stream_open(&ts, dir, TOKENS_AUTO, STREAM_VAL, &e);
    CHECK(rc == 0 && ts.n_shards == 1 && ts.total == 30 && strstr(ts.paths[0], "_val_"), "val role: wrong shards");
    if (rc == 0) token_stream_close(&ts);
    CHECK(token_stream_dir_has_val(dir) == 1, "dir_has_val");
    CHECK(token_stream_dir_has_val(p) == 0, "dir_has_val on a file");

    /* uint32 shards (ids above 65535) mix with uint16 ones */
    char dir2[300];
    snprintf(dir2, sizeof dir2, "%s/wide", dir);
    CHECK(mkdir(dir2, 0755) == 0, "mkdir");
    dir = dir2;
    write_shard("a.bin", 0, 5, 0);
    write_shard("b.bin", 0, 5, 70000);
    rc = token_stream_open(&ts, dir, TOKENS_AUTO, STREAM_TRAIN, &e);
    CHECK(rc == 0 && token_stream_next(&ts, 7, in, tg, &e) == 0 && in[4] == 4 && in[5] == 70000 && tg[6] == 70002,
          "uint16 + uint32 shards: %d %d %d", in[4], in[5], tg[6]);
    /* a shard rewritten during the run is reported when it is loaded again */
    write_shard("a.bin", 0, 6, 0);
    CHECK(rc == 0 && token_stream_seek(&ts, 0, 0, &e) == 0 && token_stream_next(&ts, 3, in, tg, &e) != 0 &&
              strstr(e.msg, "changed"), "a changed shard is not reported");
    if (rc == 0) token_stream_close(&ts);
    /* bad input: one line naming the problem */
    write_shard("c_val_0.bin", 0, 5, 0);
    dir = base;
    char only_val[300];
    snprintf(only_val, sizeof only_val, "%s/onlyval", dir);
    mkdir(only_val, 0755);
    dir = only_val;
    write_shard("x_val_000000.bin", 0, 5, 0);
    dir = base;
    CHECK(open_fails_with(only_val, STREAM_TRAIN, "only held-out shards"), "a directory of val shards as --data");
    char empty[300];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    mkdir(empty, 0755);
    CHECK(open_fails_with(empty, STREAM_TRAIN, "holds no .bin token shards"), "an empty directory");
    path_of(pat, sizeof pat, "nothing_*.bin");
    CHECK(open_fails_with(pat, STREAM_TRAIN, "matches no files"), "a glob matching nothing");
    path_of(p, sizeof p, "missing.bin");
    CHECK(open_fails_with(p, STREAM_TRAIN, "missing.bin"), "a missing file");
    path_of(p, sizeof p, "d_train_000001.bin"); /* a damaged shard in the directory fails at open */
    f = fopen(p, "r+b");
    fseek(f, 0, SEEK_SET);
    fputc(0, f);
    fclose(f);
    CHECK(open_fails_with(dir, STREAM_TRAIN, "d_train_000001.bin"), "a shard with a bad magic in the directory");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary("test_token_stream");
}
