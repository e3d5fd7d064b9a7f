/* Token streams over a file, a directory of llm.c shards or a glob, read in order with a
 * (shard, offset) cursor; one shard in memory at a time. See token_stream.h. */
#include "data/token_stream.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/packing.h"
#include "io/read_file.h"

static int is_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int is_val_name(const char *name) { return strstr(name, "_val_") != NULL; }

/* paths holds room for every candidate (allocated by the caller). */
static void add_path(TokenStream *ts, const char *path) { ts->paths[ts->n_shards++] = xstrdup(path); }

static int select_name(const struct dirent *d) { return ends_with(d->d_name, ".bin") && d->d_name[0] != '.'; }

/* The *.bin files of directory `dir`, sorted, training or validation ones by role. */
static int list_directory(TokenStream *ts, const char *dir, StreamRole role, SeqErr *e) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, select_name, alphasort);
    if (n < 0) return seq_err(e, "cannot list the data directory '%s': %s", dir, strerror(errno));
    int n_val = 0;
    for (int i = 0; i < n; i++) n_val += is_val_name(names[i]->d_name);
    int want_val = role == STREAM_VAL && n_val > 0;
    ts->paths = xmalloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        if (is_val_name(names[i]->d_name) == want_val || (role == STREAM_VAL && !n_val)) {
            size_t len = strlen(dir) + strlen(names[i]->d_name) + 2;
            char *p = xmalloc(len);
            snprintf(p, len, "%s/%s", dir, names[i]->d_name);
            add_path(ts, p);
            xfree(p);
        }
        free(names[i]);
    }
    free(names);
    if (ts->n_shards == 0) {
        if (n > 0)
            return seq_err(e, "the data directory '%s' holds only held-out shards (names with _val_): give them to "
                           "--val-data and the training shards to --data", dir);
        return seq_err(e, "the data directory '%s' holds no .bin token shards: write some with scripts/make_shards.py "
                       "or name a file", dir);
    }
    return 0;
}

static int list_glob(TokenStream *ts, const char *pattern, SeqErr *e) {
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return seq_err(e, "the data pattern '%s' matches no files: check the path (quote the pattern so that "
                       "seqpar, not the shell, expands it)", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return seq_err(e, "cannot expand the data pattern '%s' (%s)", pattern,
                       rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        globfree(&g);
        return seq_err(e, "the data pattern '%s' matches too many files: name fewer", pattern);
    }
    ts->paths = xmalloc(sizeof(char *) * g.gl_pathc);
    for (size_t i = 0; i < g.gl_pathc; i++) add_path(ts, g.gl_pathv[i]); /* glob sorts */
    globfree(&g);
    return 0;
}

int token_stream_open(TokenStream *ts, const char *source, TokensFormat format, StreamRole role, SeqErr *e) {
    memset(ts, 0, sizeof *ts);
    ts->source = xstrdup(source);
    ts->format = format;
    ts->loaded = -1;
    struct stat sb;
    int rc;
    if (stat(source, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        rc = list_directory(ts, source, role, e);
    } else if (is_glob(source) && stat(source, &sb) != 0) {
        rc = list_glob(ts, source, e);
    } else {
        ts->paths = xmalloc(sizeof(char *));
        add_path(ts, source);
        rc = 0;
    }
    if (rc == 0) {
        ts->counts = xmalloc(sizeof(size_t) * (size_t)ts->n_shards);
        for (int i = 0; i < ts->n_shards && rc == 0; i++) {
            rc = tokens_probe(ts->paths[i], format, &ts->counts[i], e);
            ts->total += ts->counts[i];
        }
    }
    if (rc != 0) token_stream_close(ts);
    return rc;
}

void token_stream_close(TokenStream *ts) {
    for (int i = 0; i < ts->n_shards; i++) xfree(ts->paths[i]);
    xfree(ts->paths);
    xfree(ts->counts);
    xfree(ts->source);
    if (ts->loaded >= 0) tokens_free(&ts->data);
    memset(ts, 0, sizeof *ts);
    ts->loaded = -1;
}

/* Shard j in memory, its size unchanged since the stream opened and its ids inside the vocabulary. */
static int load_shard(TokenStream *ts, int j, SeqErr *e) {
    if (ts->loaded == j) return 0;
    if (ts->loaded >= 0) tokens_free(&ts->data);
    ts->loaded = -1;
    if (tokens_read(ts->paths[j], ts->format, &ts->data, e) != 0) return -1;
    ts->loaded = j;
    if (ts->data.n != ts->counts[j])
        return seq_err(e, "token shard '%s' changed while seqpar read it: it held %zu tokens at start-up and now %zu; "
                       "do not rewrite shards during a run", ts->paths[j], ts->counts[j], ts->data.n);
    if (ts->vocab_size > 0) return tokens_check_vocab(&ts->data, ts->paths[j], ts->vocab_size, e);
    return 0;
}

int token_stream_max_token(TokenStream *ts, uint32_t *max_token, SeqErr *e) {
    uint32_t mx = 0;
    for (int j = 0; j < ts->n_shards; j++) {
        if (load_shard(ts, j, e) != 0) return -1;
        if (ts->data.max_token > mx) mx = ts->data.max_token;
    }
    *max_token = mx;
    return 0;
}

static uint64_t global_position(const TokenStream *ts) {
    uint64_t g = ts->offset;
    for (uint64_t j = 0; j < ts->shard; j++) g += ts->counts[j];
    return g;
}

/* An offset at or past its shard's end moves to the following shards (not past the last one). */
static void normalize(TokenStream *ts) {
    while (ts->shard + 1 < (uint64_t)ts->n_shards && ts->offset >= ts->counts[ts->shard]) {
        ts->offset -= ts->counts[ts->shard];
        ts->shard++;
    }
}

int token_stream_next(TokenStream *ts, int S, int *inputs, int *targets, SeqErr *e) {
    if (ts->total < (size_t)S + 1)
        return seq_err(e, "--seq-len %d needs %d tokens but '%s' holds %zu: use a shorter --seq-len or more data", S,
                       S + 1, ts->source, ts->total);
    /* written so that no cursor value can wrap the bound (seek checks it lies in the stream) */
    uint64_t g = global_position(ts);
    if (g > ts->total || ts->total - g < (uint64_t)S + 1) ts->shard = ts->offset = 0;
    int j = (int)ts->shard;
    size_t o = (size_t)ts->offset, k = 0, need = (size_t)S + 1;
    while (need > 0) {
        if (load_shard(ts, j, e) != 0) return -1;
        size_t take = ts->counts[j] - o < need ? ts->counts[j] - o : need;
        for (size_t i = 0; i < take; i++, k++) {
            int t = (int)ts->data.tokens[o + i];
            if (k < (size_t)S) inputs[k] = t;
            if (k >= 1) targets[k - 1] = t;
        }
        need -= take;
        j++;
        o = 0;
    }
    ts->offset += (uint64_t)S;
    normalize(ts);
    return 0;
}

int token_stream_seek(TokenStream *ts, uint64_t shard, uint64_t offset, SeqErr *e) {
    if (shard >= (uint64_t)ts->n_shards || offset > ts->counts[shard])
        return seq_err(e, "the saved data position (data_shard %" PRIu64 ", data_cursor %" PRIu64 ") lies outside '%s' (%d "
                       "shard%s, %zu tokens): resume with the data the checkpoint was trained on", shard, offset,
                       ts->source, ts->n_shards, ts->n_shards == 1 ? "" : "s", ts->total);
    ts->shard = shard;
    ts->offset = offset;
    normalize(ts);
    return 0;
}

int token_stream_fingerprint(const TokenStream *ts, uint32_t *crc, SeqErr *e) {
    uint32_t c = 0;
    unsigned char buf[4096];
    for (int i = 0; i < ts->n_shards; i++) {
        const char *slash = strrchr(ts->paths[i], '/'), *name = slash ? slash + 1 : ts->paths[i];
        c = crc32_bytes(c, name, strlen(name) + 1);
        const uint64_t count = ts->counts[i];
        c = crc32_bytes(c, &count, sizeof count);
        FILE *f = fopen(ts->paths[i], "rb");
        if (!f) return seq_err(e, "cannot read token file '%s': %s", ts->paths[i], strerror(errno));
        size_t got = fread(buf, 1, sizeof buf, f); /* the head, then the tail */
        c = crc32_bytes(c, buf, got);
        if (got == sizeof buf && fseek(f, -(long)sizeof buf, SEEK_END) == 0) c = crc32_bytes(c, buf, fread(buf, 1, sizeof buf, f));
        const int bad = ferror(f);
        fclose(f);
        if (bad) return seq_err(e, "cannot read token file '%s'", ts->paths[i]);
    }
    *crc = c;
    return 0;
}

void token_stream_describe(const TokenStream *ts, char *buf, size_t n) {
    snprintf(buf, n, "%d shard%s, %zu tokens", ts->n_shards, ts->n_shards == 1 ? "" : "s", ts->total);
}

int token_stream_dir_has_val(const char *source) {
    struct stat sb;
    if (stat(source, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    struct dirent **names = NULL;
    int n = scandir(source, &names, select_name, alphasort), found = 0;
    for (int i = 0; i < n; i++) {
        found |= is_val_name(names[i]->d_name);
        free(names[i]);
    }
    free(names);
    return found;
}

int token_stream_scan(TokenStream *ts, long n_seqs, int S, int eot, long *scored, SeqErr *e) {
    int *inputs = xmalloc(sizeof(int) * (size_t)S), *targets = xmalloc(sizeof(int) * (size_t)S);
    int rc = token_stream_seek(ts, 0, 0, e);
    *scored = 0;
    for (long s = 0; s < n_seqs && rc == 0; s++) {
        rc = token_stream_next(ts, S, inputs, targets, e);
        if (rc == 0 && eot >= 0) pack_mask_targets(inputs, S, eot, targets);
        for (int i = 0; rc == 0 && i < S; i++) *scored += targets[i] >= 0;
    }
    xfree(inputs);
    xfree(targets);
    return rc;
}
