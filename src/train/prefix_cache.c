/* A prompt's key/value cache kept in a directory between runs, and a long block prefilled against
 * a sharded cache a piece at a time; see prefix_cache.h. */
#include "train/prefix_cache.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/read_file.h"

#define MANIFEST "manifest.txt"
#define SHARD_MAGIC "SQPKVC01"
enum { SHARD_VERSION = 1, SHARD_HEADER_INTS = 8 };

/* ------------------------------------------------------------------ the model's identity */

/* A 64-bit hash of n bytes (four multiply-xor lanes over 8-byte words, then the tail): the same
 * bytes give the same value; not a cryptographic hash, but one flipped bit changes it. */
static uint64_t hash64(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h[4] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull, 0x27D4EB2F165667C5ull};
    const uint64_t k = 0xFF51AFD7ED558CCDull;
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * j, 8);
            h[j] = (h[j] ^ w) * k;
            h[j] ^= h[j] >> 31;
        }
    uint64_t out = (uint64_t)n;
    for (int j = 0; j < 4; j++) out = (out ^ h[j]) * k, out ^= out >> 29;
    for (; i < n; i++) out = (out ^ p[i]) * 0x100000001B3ull;
    out ^= out >> 33;
    return out;
}

int prefix_model_id(const LlamaModel *m, const char *model_dir, uint64_t *id, SeqErr *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    unsigned char *text;
    size_t len;
    if (read_regular_file(path, "config file", 1 << 24, &text, &len, e) != 0) return -1;
    const uint64_t c = hash64(text, len);
    xfree(text);
    *id = hash64(m->params, sizeof(float) * m->table.total) ^ (c * 0x9E3779B97F4A7C15ull);
    return 0;
}

/* ------------------------------------------------------------------ the manifest */

void prefix_cache_free(PrefixCache *pc) {
    for (int r = 0; r < pc->ranks; r++) {
        if (pc->files) xfree(pc->files[r]);
        if (pc->positions) xfree(pc->positions[r]);
    }
    xfree(pc->files); xfree(pc->crc); xfree(pc->rows); xfree(pc->positions); xfree(pc->tokens);
    memset(pc, 0, sizeof *pc);
}

int prefix_cache_rows_kept(const PrefixCache *pc, int rank) {
    int n = 0;
    if (!pc->found) return 0;
    for (int i = 0; i < pc->rows[rank]; i++) n += pc->positions[rank][i] < pc->reuse;
    return n;
}

/* A growing text buffer. */
typedef struct {
    char *s;
    size_t n, cap;
} Text;

static void text_add(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(Text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (t->s && (size_t)k < t->cap - t->n) {
            t->n += (size_t)k;
            return;
        }
        t->cap = (t->cap + (size_t)k + 1) * 2;
        char *grown = xmalloc(t->cap);
        if (t->s) memcpy(grown, t->s, t->n);
        xfree(t->s);
        t->s = grown;
    }
}

/* Positions as runs of consecutive values: "0-3,12-15" ("5" for a run of one). */
static void add_runs(Text *t, const int *pos, int n) {
    if (n == 0) text_add(t, "-");
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && pos[j + 1] == pos[j] + 1) j++;
        if (j > i) text_add(t, "%s%d-%d", i ? "," : "", pos[i], pos[j]);
        else text_add(t, "%s%d", i ? "," : "", pos[i]);
        i = j + 1;
    }
}

/* The next line of [*p, end): its start, NUL-terminated in place; NULL at the end. */
static char *next_line(char **p, char *end) {
    if (*p >= end) return NULL;
    char *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
    if (!nl) nl = end;
    *nl = 0;
    *p = nl + 1;
    return s;
}

/* Non-negative integers separated by commas (runs "a-b" where runs): -1 when malformed or not
 * exactly n values. */
static int parse_list(const char *s, int runs, int *out, int n) {
    int k = 0;
    if (runs && !strcmp(s, "-")) return n == 0 ? 0 : -1;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0 || a > 0x7fffffff) return -1;
        s = end;
        if (runs && *s == '-') {
            b = strtol(s + 1, &end, 10);
            if (end == s + 1 || b < a || b > 0x7fffffff) return -1;
            s = end;
        }
        for (long v = a; v <= b; v++) {
            if (k >= n) return -1;
            out[k++] = (int)v;
        }
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return k == n ? 0 : -1;
}

#define DAMAGED(what) \
    seq_err(e, "--prefix-cache %s: %s/" MANIFEST " is damaged (%s): remove the directory (the next run prefills from " \
            "scratch and saves a new cache) or give another --prefix-cache", dir, dir, what)

int prefix_cache_open(PrefixCache *pc, const char *dir, const PrefixIdent *id, const int *prompt, int P, SeqErr *e) {
    memset(pc, 0, sizeof *pc);
    pc->save = 1;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || (mkdir(dir, 0777) != 0 && errno != EEXIST))
            return seq_err(e, "--prefix-cache %s: cannot create the directory (%s): give a directory that can be "
                           "written", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return seq_err(e, "--prefix-cache %s is not a directory: give a directory (it is created where missing)", dir);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/" MANIFEST, dir);
    if (atomic_check_target(path, e) != 0) return -1;
    if (access(path, F_OK) != 0) return 0; /* no cache yet */
    unsigned char *buf;
    size_t len;
    if (read_regular_file(path, "prefix cache manifest", (uint64_t)1 << 32, &buf, &len, e) != 0) return -1;
    char *text = (char *)buf, *end = text + len;
    /* the checksum line: the last one, over everything before it */
    char *stop = end;
    while (stop > text && stop[-1] == '\n') stop--;
    char *crc_line = stop;
    while (crc_line > text && crc_line[-1] != '\n') crc_line--;
    *stop = 0;
    int rc = -1;
    unsigned long want;
    if (strncmp(crc_line, "crc32 ", 6) || sscanf(crc_line, "crc32 %lx", &want) != 1) {
        DAMAGED("no checksum line");
        goto out;
    }
    if (crc32_bytes(0, text, (size_t)(crc_line - text)) != (uint32_t)want) {
        DAMAGED("its checksum does not match its text");
        goto out;
    }
    char *p = text, *line;
    int version = 0, L = -1, Hkv = -1, d = -1;
    char strategy[64] = "", dtype[16] = "", model[32] = "";
    int have_tokens = 0;
    while ((line = next_line(&p, crc_line)) != NULL) {
        char *arg = strchr(line, ' ');
        if (!arg) {
            DAMAGED("a line without a value");
            goto out;
        }
        *arg++ = 0;
        if (!strcmp(line, "seqpar-prefix-cache")) version = atoi(arg);
        else if (!strcmp(line, "model")) snprintf(model, sizeof model, "%s", arg);
        else if (!strcmp(line, "dtype")) snprintf(dtype, sizeof dtype, "%s", arg);
        else if (!strcmp(line, "strategy")) snprintf(strategy, sizeof strategy, "%s", arg);
        else if (!strcmp(line, "ranks")) {
            if (pc->rows) {
                DAMAGED("two rank counts");
                goto out;
            }
            pc->ranks = atoi(arg);
            if (pc->ranks < 1 || pc->ranks > (1 << 20)) {
                DAMAGED("its rank count");
                goto out;
            }
            pc->files = xcalloc((size_t)pc->ranks, sizeof(char *));
            pc->positions = xcalloc((size_t)pc->ranks, sizeof(int *));
            pc->crc = xcalloc((size_t)pc->ranks, sizeof(uint32_t));
            pc->rows = xcalloc((size_t)pc->ranks, sizeof(int));
        } else if (!strcmp(line, "shape")) {
            if (sscanf(arg, "%d %d %d", &L, &Hkv, &d) != 3) {
                DAMAGED("its shape line");
                goto out;
            }
        } else if (!strcmp(line, "tokens")) {
            pc->n_tokens = atoi(arg);
            if (pc->n_tokens < 1) {
                DAMAGED("its token count");
                goto out;
            }
        } else if (!strcmp(line, "ids")) {
            if (pc->n_tokens < 1 || pc->tokens) {
                DAMAGED("ids before the token count");
                goto out;
            }
            pc->tokens = xmalloc(sizeof(int) * (size_t)pc->n_tokens);
            if (parse_list(arg, 0, pc->tokens, pc->n_tokens) != 0) {
                DAMAGED("its token ids");
                goto out;
            }
            have_tokens = 1;
        } else if (!strcmp(line, "shard")) {
            int r, rows, at = 0;
            unsigned long crc;
            char file[256];
            if (!pc->rows || sscanf(arg, "%d %d %255s %lx %n", &r, &rows, file, &crc, &at) != 4 || at == 0 || r < 0 ||
                r >= pc->ranks || rows < 0 || rows > pc->n_tokens || pc->files[r] || strchr(file, '/')) {
                DAMAGED("a shard line");
                goto out;
            }
            pc->files[r] = xstrdup(file);
            pc->rows[r] = rows;
            pc->crc[r] = (uint32_t)crc;
            pc->positions[r] = xmalloc(sizeof(int) * (size_t)(rows ? rows : 1));
            if (parse_list(arg + at, 1, pc->positions[r], rows) != 0) {
                DAMAGED("a shard's positions");
                goto out;
            }
        }
    }
    if (version != 1) {
        DAMAGED("not a version-1 prefix cache");
        goto out;
    }
    if (!have_tokens || !pc->rows || L < 0) {
        DAMAGED("a line is missing");
        goto out;
    }
    { /* every cached position in exactly one shard */
        unsigned char *seen = xcalloc((size_t)pc->n_tokens, 1);
        long total = 0;
        int bad = 0;
        for (int r = 0; r < pc->ranks && !bad; r++) {
            if (!pc->files[r]) bad = 1;
            for (int i = 0; !bad && i < pc->rows[r]; i++) {
                const int q = pc->positions[r][i];
                if (q >= pc->n_tokens || seen[q]++) bad = 1;
            }
            total += pc->rows[r];
        }
        xfree(seen);
        if (bad || total != pc->n_tokens) {
            DAMAGED("its shards do not hold each cached position once");
            goto out;
        }
    }
    char mine[32];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)id->model);
    if (strcmp(model, mine) || L != id->layers || Hkv != id->kv_heads || d != id->head_dim) {
        seq_err(e, "--prefix-cache %s holds the cache of another model (model hash %s; this model's is %s): give each "
                "model a --prefix-cache directory of its own (or remove %s to replace its cache)", dir, model, mine, dir);
        goto out;
    }
    if (strcmp(dtype, id->dtype)) {
        seq_err(e, "--prefix-cache %s holds a %s cache and this run computes in %s: give another --prefix-cache "
                "directory (or remove %s to replace its cache)", dir, dtype, id->dtype, dir);
        goto out;
    }
    if (strcmp(strategy, id->strategy) || pc->ranks != id->ranks) {
        char made[96], now[96];
        if (!strcmp(strategy, "none")) snprintf(made, sizeof made, "one process without --strategy");
        else snprintf(made, sizeof made, "--strategy %s on %d rank%s", strategy, pc->ranks, pc->ranks > 1 ? "s" : "");
        if (!strcmp(id->strategy, "none")) snprintf(now, sizeof now, "one process without --strategy");
        else snprintf(now, sizeof now, "--strategy %s on %d rank%s", id->strategy, id->ranks, id->ranks > 1 ? "s" : "");
        seq_err(e, "--prefix-cache %s was made by %s, this run is %s: run as it was made, or give another "
                "--prefix-cache directory (or remove %s to replace its cache)", dir, made, now, dir);
        goto out;
    }
    pc->found = 1;
    int j = 0;
    while (j < P && j < pc->n_tokens && prompt[j] == pc->tokens[j]) j++;
    pc->common = j;
    pc->reuse = j < P ? j : P - 1; /* the last prompt token runs again: its logits choose the first new one */
    pc->save = j < P;              /* a prompt inside the cached one leaves the (longer) cache as it is */
    rc = 0;
out:
    xfree(buf);
    if (rc != 0) prefix_cache_free(pc);
    return rc;
}

/* ------------------------------------------------------------------ shard files */

/* Bytes of a cached value under the cache's dtype: 4 ("f32") or 2 ("bf16": the words as kept). */
static size_t dtype_bytes(const char *dtype) { return strcmp(dtype, "bf16") ? sizeof(float) : sizeof(bf16_t); }

/* Writes a shard: rows of keys and values of es bytes a value (rows r of layer l at K + (l stride +
 * r) kvd values), their positions; *crc the file's CRC-32. The header's last word says the values'
 * type (0 fp32, 1 bf16 words). */
static int shard_write(const char *path, int rank, int ranks, int L, int Hkv, int d, int rows, const int *pos,
                       const void *K, const void *V, size_t es, size_t stride, uint32_t *crc, SeqErr *e) {
    AtomicFile af;
    if (atomic_open(&af, path, e) != 0) return -1;
    const size_t kvd = (size_t)Hkv * d;
    const int32_t hdr[SHARD_HEADER_INTS] = {SHARD_VERSION, rank, ranks, L, Hkv, d, rows, es == sizeof(bf16_t)};
    uint32_t c = crc32_bytes(0, SHARD_MAGIC, 8);
    atomic_write(&af, SHARD_MAGIC, 8);
    c = crc32_bytes(c, hdr, sizeof hdr);
    atomic_write(&af, hdr, sizeof hdr);
    c = crc32_bytes(c, pos, sizeof(int) * (size_t)rows);
    atomic_write(&af, pos, sizeof(int) * (size_t)rows);
    for (int half = 0; half < 2; half++)
        for (int l = 0; l < L; l++) {
            const char *src = (const char *)(half ? V : K) + (size_t)l * stride * kvd * es;
            c = crc32_bytes(c, src, es * (size_t)rows * kvd);
            atomic_write(&af, src, es * (size_t)rows * kvd);
        }
    atomic_write(&af, &c, sizeof c);
    if (atomic_commit(&af, e) != 0) return -1;
    *crc = c;
    return 0;
}

/* Reads rank's shard named in the manifest, checking it against the manifest: its rows at a
 * position below keep_below go to K, V (values of id->dtype's bytes, layer stride `stride` rows): at
 * row = position when by_position, else in file order (their positions to pos_out); *n_out their
 * count. */
static int shard_read(const PrefixCache *pc, const char *dir, const PrefixIdent *id, int rank, int keep_below,
                      void *K, void *V, size_t stride, int by_position, int *pos_out, int *n_out, SeqErr *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, pc->files[rank]);
    const int rows = pc->rows[rank], L = id->layers;
    const size_t kvd = (size_t)id->kv_heads * id->head_dim, es = dtype_bytes(id->dtype), row_b = kvd * es;
    const uint64_t want = 8 + sizeof(int32_t) * (SHARD_HEADER_INTS + (uint64_t)rows) +
                          2 * (uint64_t)L * rows * row_b + sizeof(uint32_t);
    uint64_t size;
    const int fd = open_regular_file(path, "prefix cache shard", &size, e);
    if (fd < 0)
        return seq_err(e, "--prefix-cache %s: rank %d's shard %s cannot be read (%s): remove the directory (the next "
                       "run prefills from scratch) or give another --prefix-cache", dir, rank, pc->files[rank], e->msg);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return seq_err(e, "--prefix-cache %s: cannot open %s (%s)", dir, path, strerror(errno));
    }
    char magic[8];
    int32_t hdr[SHARD_HEADER_INTS];
    int rc = -1, n = 0;
    int *pos = xmalloc(sizeof(int) * (size_t)(rows ? rows : 1));
    char *scratch = xmalloc(row_b);
    const char *problem = NULL;
    if (size != want) problem = "its size is not the one its rows give";
    else if (fread(magic, 1, 8, f) != 8 || memcmp(magic, SHARD_MAGIC, 8)) problem = "not a shard file";
    else if (fread(hdr, sizeof hdr, 1, f) != 1 || hdr[0] != SHARD_VERSION || hdr[1] != rank ||
             hdr[2] != pc->ranks || hdr[3] != L || hdr[4] != id->kv_heads || hdr[5] != id->head_dim || hdr[6] != rows ||
             hdr[7] != (es == sizeof(bf16_t)))
        problem = "its header is not the manifest's";
    else if (fread(pos, sizeof(int), (size_t)rows, f) != (size_t)rows ||
             memcmp(pos, pc->positions[rank], sizeof(int) * (size_t)rows))
        problem = "its positions are not the manifest's";
    if (!problem) {
        uint32_t c = crc32_bytes(crc32_bytes(crc32_bytes(0, SHARD_MAGIC, 8), hdr, sizeof hdr), pos,
                                 sizeof(int) * (size_t)rows);
        for (int half = 0; half < 2 && !problem; half++)
            for (int l = 0; l < L && !problem; l++) {
                char *dst = (char *)(half ? V : K) + (size_t)l * stride * row_b;
                int k = 0;
                for (int i = 0; i < rows; i++) {
                    const int keep = pos[i] < keep_below;
                    char *row = !keep ? scratch : dst + (size_t)(by_position ? pos[i] : k) * row_b;
                    if (fread(row, es, kvd, f) != kvd) {
                        problem = "it ends early";
                        break;
                    }
                    c = crc32_bytes(c, row, row_b);
                    k += keep;
                }
                n = k;
            }
        uint32_t stored;
        if (!problem && (fread(&stored, sizeof stored, 1, f) != 1 || stored != c || c != pc->crc[rank]))
            problem = "its checksum does not match";
    }
    if (problem) {
        seq_err(e, "--prefix-cache %s: rank %d's shard %s is damaged (%s): remove the directory (the next run prefills "
                "from scratch and saves a new cache) or give another --prefix-cache", dir, rank, pc->files[rank], problem);
    } else {
        if (pos_out)
            for (int i = 0, k = 0; i < rows; i++)
                if (pos[i] < keep_below) pos_out[k++] = pos[i];
        *n_out = n;
        rc = 0;
    }
    fclose(f);
    xfree(pos);
    xfree(scratch);
    return rc;
}

int prefix_cache_load_dist(const PrefixCache *pc, const char *dir, DistGenerator *g, long still_to_come, SeqErr *e) {
    const LlamaConfig *c = &g->m->cfg;
    const int R = g->ranks, own = prefix_cache_rows_kept(pc, g->rank);
    /* a new row goes to a shard holding the fewest: none passes max(own, ceil(all / R) + 1) */
    const long fair = ((long)pc->reuse + still_to_come + R - 1) / R + 1;
    const long need = (own > fair ? own : fair) + 1;
    if (need > g->shard.cap) {
        const int bf16 = g->shard.bf16;
        kv_shard_free(&g->shard);
        kv_shard_init(&g->shard, c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                      (int)need, R);
        if (bf16) kv_shard_set_bf16(&g->shard);
    }
    PrefixIdent id = {.layers = c->num_hidden_layers, .kv_heads = c->num_key_value_heads, .head_dim = c->head_dim,
                      .dtype = g->shard.bf16 ? "bf16" : "f32"};
    int n = 0;
    if (shard_read(pc, dir, &id, g->rank, pc->reuse, kv_shard_rows(&g->shard, 0, 0), kv_shard_rows(&g->shard, 1, 0),
                   (size_t)g->shard.cap, 0, g->shard.pos, &n, e) != 0)
        return -1;
    g->shard.n = n;
    return 0;
}

void prefix_cache_loaded(const PrefixCache *pc, DistGenerator *g) {
    if (g->ranks > 1)
        comm_allgather_meta(g->par->comm, COMM_TEAM, &g->shard.n, g->counts, sizeof(int), g->par->topo.world);
    else g->counts[0] = g->shard.n;
    g->gen.len = pc->reuse;
}

int prefix_cache_load_one(const PrefixCache *pc, const char *dir, Generator *g, SeqErr *e) {
    const LlamaConfig *c = &g->m->cfg;
    PrefixIdent id = {.layers = c->num_hidden_layers, .kv_heads = c->num_key_value_heads, .head_dim = c->head_dim,
                      .dtype = g->k16_cache ? "bf16" : "f32"};
    int n = 0;
    if (pc->reuse > g->max_len) return seq_err(e, "internal: %d cached rows, room for %d", pc->reuse, g->max_len);
    void *K = g->k16_cache ? (void *)g->k16_cache : (void *)g->k_cache;
    void *V = g->v16_cache ? (void *)g->v16_cache : (void *)g->v_cache;
    if (shard_read(pc, dir, &id, 0, pc->reuse, K, V, (size_t)g->max_len, 1, NULL, &n, e) != 0)
        return -1;
    if (n != pc->reuse) return seq_err(e, "internal: %d of %d cached rows loaded", n, pc->reuse);
    g->len = pc->reuse;
    return 0;
}

/* ------------------------------------------------------------------ saving */

/* 0 on every rank, or -1 with the message of the lowest rank whose rc is not 0. Collective. */
static int agree(Comm *c, MPI_Comm mc, int ranks, int rank, int rc, SeqErr *e) {
    if (ranks == 1) return rc;
    int first = rc ? rank : ranks;
    comm_control_allreduce(c, "MPI_Iallreduce (prefix cache status)", &first, 1, MPI_INT, MPI_MIN, mc);
    if (first == ranks) return 0;
    comm_control_bcast(c, "MPI_Ibcast (prefix cache error)", e->msg, sizeof e->msg, first, mc);
    return -1;
}

/* A name no earlier save in this directory used (time, process and a hash of the prompt). */
static uint64_t save_nonce(const int *prompt, int P) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40) ^
           hash64(prompt, sizeof(int) * (size_t)P);
}

/* The manifest's text: the lines, then the checksum line. */
static int manifest_write(const char *dir, const PrefixIdent *id, const int *prompt, int P, int ranks,
                          char **files, const int *rows, const uint32_t *crc, int *const *positions, SeqErr *e) {
    Text t = {0};
    text_add(&t, "seqpar-prefix-cache 1\nmodel %016llx\ndtype %s\nstrategy %s\nranks %d\nshape %d %d %d\ntokens %d\nids ",
             (unsigned long long)id->model, id->dtype, id->strategy, ranks, id->layers, id->kv_heads, id->head_dim, P);
    for (int i = 0; i < P; i++) text_add(&t, i ? ",%d" : "%d", prompt[i]);
    text_add(&t, "\n");
    for (int r = 0; r < ranks; r++) {
        text_add(&t, "shard %d %d %s %08x ", r, rows[r], files[r], crc[r]);
        add_runs(&t, positions[r], rows[r]);
        text_add(&t, "\n");
    }
    text_add(&t, "crc32 %08x", crc32_bytes(0, t.s, t.n));
    char path[4096];
    snprintf(path, sizeof path, "%s/" MANIFEST, dir);
    const int rc = atomic_write_text(path, t.s, e);
    xfree(t.s);
    return rc;
}

/* Removes this rank's shard file of the replaced manifest (when not the new one). */
static void remove_old(const PrefixCache *pc, const char *dir, int rank, const char *now) {
    if (!pc->found || rank >= pc->ranks || !strcmp(pc->files[rank], now)) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, pc->files[rank]);
    unlink(path); /* a file left behind is unused, not wrong */
}

int prefix_cache_save_dist(PrefixCache *pc, const char *dir, const PrefixIdent *id, const int *prompt, int P,
                           DistGenerator *g, SeqErr *e) {
    const int R = g->ranks, me = g->rank;
    Comm *comm = g->par->comm;
    const MPI_Comm world = g->par->topo.world;
    uint64_t nonce = me == 0 ? save_nonce(prompt, P) : 0;
    if (R > 1) comm_control_bcast(comm, "MPI_Ibcast (prefix cache name)", &nonce, sizeof nonce, 0, world);
    char name[96], path[4096];
    snprintf(name, sizeof name, "kv-%016llx-%d-of-%d.bin", (unsigned long long)nonce, me, R);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint32_t crc = 0;
    int rc = g->shard.n == g->counts[me] ? 0 : seq_err(e, "internal: shard of %d rows, %d counted", g->shard.n, g->counts[me]);
    if (!rc)
        rc = shard_write(path, me, R, g->shard.layers, g->shard.kv_heads, g->shard.head_dim, g->shard.n, g->shard.pos,
                         kv_shard_rows(&g->shard, 0, 0), kv_shard_rows(&g->shard, 1, 0), kv_shard_elem(&g->shard),
                         (size_t)g->shard.cap, &crc, e);
    if (agree(comm, world, R, me, rc, e) != 0) return -1;
    /* each shard's checksum and positions to rank 0, which writes the manifest */
    uint32_t *crcs = xcalloc((size_t)R, sizeof(uint32_t));
    crcs[me] = crc;
    if (R > 1) comm_control_allreduce(comm, "MPI_Iallreduce (prefix cache checksums)", crcs, (size_t)R, MPI_UINT32_T,
                                      MPI_BOR, world);
    int *all = me == 0 ? xmalloc(sizeof(int) * (size_t)P) : NULL;
    size_t *cnt = xmalloc(sizeof(size_t) * (size_t)R), *dis = xmalloc(sizeof(size_t) * (size_t)R), at = 0;
    for (int r = 0; r < R; r++) cnt[r] = (size_t)g->counts[r], dis[r] = at, at += cnt[r];
    if (R > 1) comm_gatherv(comm, COMM_TEAM, g->shard.pos, (size_t)g->shard.n, all, cnt, dis, MPI_INT, 0, world);
    else memcpy(all, g->shard.pos, sizeof(int) * (size_t)g->shard.n);
    rc = 0;
    if (me == 0) {
        char **files = xmalloc(sizeof(char *) * (size_t)R);
        int **positions = xmalloc(sizeof(int *) * (size_t)R);
        for (int r = 0; r < R; r++) {
            files[r] = xmalloc(96);
            snprintf(files[r], 96, "kv-%016llx-%d-of-%d.bin", (unsigned long long)nonce, r, R);
            positions[r] = all + dis[r];
        }
        rc = manifest_write(dir, id, prompt, P, R, files, g->counts, crcs, positions, e);
        for (int r = 0; r < R; r++) xfree(files[r]);
        xfree(files);
        xfree(positions);
    }
    xfree(crcs); xfree(all); xfree(cnt); xfree(dis);
    if (agree(comm, world, R, me, rc, e) != 0) {
        unlink(path); /* the old manifest stands, with its files */
        return -1;
    }
    remove_old(pc, dir, me, name);
    return 0;
}

int prefix_cache_save_one(PrefixCache *pc, const char *dir, const PrefixIdent *id, const int *prompt, int P,
                          const Generator *g, SeqErr *e) {
    if (g->len != P) return seq_err(e, "internal: %d tokens cached, the prompt has %d", g->len, P);
    char name[96], path[4096];
    snprintf(name, sizeof name, "kv-%016llx-0-of-1.bin", (unsigned long long)save_nonce(prompt, P));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int *pos = xmalloc(sizeof(int) * (size_t)P);
    for (int i = 0; i < P; i++) pos[i] = i;
    uint32_t crc;
    const void *K = g->k16_cache ? (const void *)g->k16_cache : (const void *)g->k_cache;
    const void *V = g->v16_cache ? (const void *)g->v16_cache : (const void *)g->v_cache;
    int rc = shard_write(path, 0, 1, id->layers, id->kv_heads, id->head_dim, P, pos, K, V,
                         g->k16_cache ? sizeof(bf16_t) : sizeof(float), (size_t)g->max_len, &crc, e);
    if (!rc) {
        char *files[1] = {name};
        rc = manifest_write(dir, id, prompt, P, 1, files, &P, &crc, &pos, e);
        if (rc) unlink(path);
    }
    xfree(pos);
    if (!rc) remove_old(pc, dir, 0, name);
    return rc;
}
