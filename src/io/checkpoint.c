/* Implementation of training checkpoints: writing the four files into a sibling temporary
 * directory, swapping it with the target atomically, cleaning up, and loading with validation
 * (one-line errors naming the file and the fix). 64-bit state is stored as hex strings in JSON and
 * all float state as F32 safetensors, so a resume is bit-exact. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/config_json.h"
#include "io/param_io.h"
#include "io/read_file.h"
#include "io/safetensors.h"

#define STATE_FORMAT "seqpar-trainer-state"
#define F_CONFIG "config.json"
#define F_MODEL "model.safetensors"
#define F_OPTIM "optimizer.safetensors"
#define F_STATE "trainer_state.json"
#define STATE_MAX_BYTES (1 << 20)

/* Fuzzing builds skip checksum mismatches so that the fuzzer can reach the checks behind them. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define CHECKSUMS_ENFORCED 0
#else
#define CHECKSUMS_ENFORCED 1
#endif

/* ---------------------------------------------------------------------------------------------
 * Trainer state settings */

void trainer_state_init(TrainerState *st) { memset(st, 0, sizeof *st); }

void trainer_state_set(TrainerState *st, const char *key, const char *fmt, ...) {
    if (strlen(key) == 0 || strlen(key) >= sizeof st->settings[0].key)
        die("checkpoint setting name '%s' is empty or longer than %zu characters: use a shorter name", key,
            sizeof st->settings[0].key - 1);
    int i;
    for (i = 0; i < st->n_settings; i++)
        if (strcmp(st->settings[i].key, key) == 0) break;
    if (i == st->n_settings) {
        if (st->n_settings >= CKPT_MAX_SETTINGS)
            die("too many checkpoint settings (at most %d): record fewer run settings", CKPT_MAX_SETTINGS);
        st->n_settings++;
    }
    CkptSetting *s = &st->settings[i];
    snprintf(s->key, sizeof s->key, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->value, sizeof s->value, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof s->value)
        die("checkpoint setting '%s' is longer than %zu characters: record a shorter value", key, sizeof s->value - 1);
}

const char *trainer_state_get(const TrainerState *st, const char *key) {
    for (int i = 0; i < st->n_settings; i++)
        if (strcmp(st->settings[i].key, key) == 0) return st->settings[i].value;
    return NULL;
}

/* A setting as a person reads it: the hex floats it is recorded in (exact, "%a") as decimals. */
static void setting_display(const char *v, char *out, size_t n) {
    size_t k = 0;
    out[0] = '\0';
    while (*v && k + 1 < n) {
        const size_t len = strcspn(v, ",");
        char piece[64], *end = NULL;
        snprintf(piece, sizeof piece, "%.*s", (int)(len < sizeof piece ? len : sizeof piece - 1), v);
        const int hex = strstr(piece, "0x") != NULL;
        const double x = hex ? strtod(piece, &end) : 0;
        if (hex && end && !*end) { /* the fewest digits that read back as the same float (settings are floats) */
            char dec[32];
            for (int p = 6; p <= 17; p++) {
                snprintf(dec, sizeof dec, "%.*g", p, x);
                if ((float)strtod(dec, NULL) == (float)x) break;
            }
            k += (size_t)snprintf(out + k, n - k, "%s", dec);
        } else {
            k += (size_t)snprintf(out + k, n - k, "%s", piece);
        }
        if (k >= n) break;
        v += len;
        if (*v == ',') {
            k += (size_t)snprintf(out + k, n - k, ",");
            v++;
        }
    }
}

int trainer_state_compare(const TrainerState *saved, const TrainerState *now, const char *dir, const char *layer_fix,
                          SeqErr *e) {
    if (saved->seq_len > 0 && now->seq_len > 0 && saved->seq_len != now->seq_len)
        return seq_err(e, "checkpoint %s was trained with seq_len %d but this run uses %d: resume with --seq-len %d or "
                       "start a new run", dir, saved->seq_len, now->seq_len, saved->seq_len);
    for (int i = 0; i < saved->n_settings; i++) {
        const char *v = trainer_state_get(now, saved->settings[i].key);
        if (v && strcmp(v, saved->settings[i].value) != 0) {
            char was[128], is[128];
            setting_display(saved->settings[i].value, was, sizeof was);
            setting_display(v, is, sizeof is);
            /* FFN chunks and layer streaming: the flags the caller worked out for this run (under a
               strategy's streamed layers --ffn-chunks alone does not give a count back) */
            if (layer_fix && *layer_fix &&
                (!strcmp(saved->settings[i].key, "ffn_chunks") || !strcmp(saved->settings[i].key, "streamed_layers")))
                return seq_err(e, "checkpoint %s was trained with %s = %s but this run uses %s: resume %s or start a "
                               "new run", dir, saved->settings[i].key, was, is, layer_fix);
            /* the settings that are one train flag's value: name the flag that resumes */
            if (!strcmp(saved->settings[i].key, "data_files")) /* token_stream_fingerprint */
                return seq_err(e, "checkpoint %s was trained on other token files than this run's --data (their "
                               "names, token counts or contents differ: fingerprint %s, now %s): resume with the "
                               "files it was trained on (moved anywhere, named any way) or start a new run",
                               dir, saved->settings[i].value, v);
            static const char *const flag_of[][2] = {
                {"ffn_chunks", "--ffn-chunks"}, {"precision", "--precision"},
                {"batch", "--batch"}, {"steps", "--steps"}, {"warmup", "--warmup"}, {"lr", "--lr"},
                {"min_lr", "--min-lr"}, {"weight_decay", "--weight-decay"}, {"grad_clip", "--grad-clip"}};
            const char *key = saved->settings[i].key;
            const size_t kl = strlen(key);
            for (size_t f = 0; f < ARRAY_LEN(flag_of) + 1; f++)
                /* and NAME_chunks, a strategy's --chunks (the trainer records it so) */
                if (f == ARRAY_LEN(flag_of) ? kl > 7 && !strcmp(key + kl - 7, "_chunks")
                                            : !strcmp(key, flag_of[f][0]))
                    return seq_err(e, "checkpoint %s was trained with %s = %s but this run uses %s: resume with %s %s "
                                   "or start a new run", dir, saved->settings[i].key, was, is,
                                   f == ARRAY_LEN(flag_of) ? "--chunks" : flag_of[f][1], was);
            return seq_err(e, "checkpoint %s was trained with %s = %s but this run uses %s: resume with the same "
                           "setting or start a new run", dir, saved->settings[i].key, was, is);
        }
    }
    return 0;
}

void trainer_state_check(const TrainerState *saved, const TrainerState *now, const char *dir) {
    SeqErr e;
    if (trainer_state_compare(saved, now, dir, NULL, &e) != 0) die_collective("%s", e.msg);
}

/* ---------------------------------------------------------------------------------------------
 * Paths */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) die("formatting a path failed");
    char *s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* `dir` without trailing slashes, or NULL with a message for an empty path or "/". A symbolic link
 * is replaced by the directory it names: a save puts a new directory in place of the path, which
 * would replace the link and leave the checkpoint it points at behind. */
static char *normalize_dir(const char *dir, SeqErr *e) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 0 || (n == 1 && dir[0] == '/')) {
        seq_err(e, "checkpoint directory '%s' is not usable: name a directory", dir);
        return NULL;
    }
    char *d = xmalloc(n + 1);
    memcpy(d, dir, n);
    d[n] = '\0';
    struct stat lsb;
    if (lstat(d, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
        char *target = realpath(d, NULL); /* NULL for a dangling link: the path stays as given */
        if (target) {
            xfree(d);
            d = str_printf("%s", target);
            free(target);
        }
    }
    return d;
}

/* 1 for the names a checkpoint's files have (config, weights and their shards, optimizer, state):
 * what a save writes anew; every other entry of the directory is the user's. */
static int checkpoint_owns(const char *name) {
    unsigned a, b;
    int end = 0;
    return !strcmp(name, F_CONFIG) || !strcmp(name, F_MODEL) || !strcmp(name, ST_INDEX_NAME) ||
           !strcmp(name, F_OPTIM) || !strcmp(name, F_STATE) ||
           (sscanf(name, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && end > 0 && name[end] == '\0');
}

/* Copies the regular file src to dst (a new file, mode kept); 0 or -1 with errno set. */
static int copy_file(const char *src, const char *dst, mode_t mode) {
    int in = open(src, O_RDONLY), out = in < 0 ? -1 : open(dst, O_WRONLY | O_CREAT | O_EXCL, mode & 07777);
    int rc = in < 0 || out < 0 ? -1 : 0;
    char buf[65536];
    for (ssize_t n; rc == 0 && (n = read(in, buf, sizeof buf)) != 0;) {
        if (n < 0 || write(out, buf, (size_t)n) != n) rc = -1;
    }
    const int err = errno;
    if (out >= 0 && close(out) != 0) rc = -1;
    if (in >= 0) close(in);
    if (rc != 0) errno = err;
    return rc;
}

/* The entries of the old checkpoint directory d that are not the checkpoint's own files (a
 * tokenizer.json copied in for transformers, notes), put into the new one tmp before the swap:
 * `dirs` 0, regular files hard-linked
 * (copied where the file system has no links) and symbolic links made again, which leaves d as
 * it was; `dirs` 1, directories moved (where the swap then fails, they are in tmp, which the
 * message names). 0, or -1 with a message. */
static int carry_user_entries(const char *d, const char *tmp, int dirs, SeqErr *e) {
    DIR *dd = opendir(d);
    if (!dd) return seq_err(e, "cannot save checkpoint '%s': reading it failed: %s", d, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(dd)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || checkpoint_owns(de->d_name)) continue;
        char *src = str_printf("%s/%s", d, de->d_name), *dst = str_printf("%s/%s", tmp, de->d_name);
        struct stat sb;
        char target[4096];
        ssize_t tn;
        if (lstat(src, &sb) != 0) rc = -1;
        else if (dirs && S_ISDIR(sb.st_mode)) rc = rename(src, dst);
        else if (!dirs && S_ISREG(sb.st_mode)) rc = link(src, dst) == 0 || copy_file(src, dst, sb.st_mode) == 0 ? 0 : -1;
        else if (!dirs && S_ISLNK(sb.st_mode))
            rc = (tn = readlink(src, target, sizeof target - 1)) >= 0 && (target[tn] = '\0', symlink(target, dst) == 0) ? 0 : -1;
        if (rc != 0)
            seq_err(e, "cannot save checkpoint '%s': keeping its %s '%s' in the new checkpoint failed: %s (the new "
                    "checkpoint is complete in '%s'%s)", d, dirs ? "directory" : "file", de->d_name, strerror(errno),
                    tmp, dirs ? ", with the directories moved before this one" : "; the old one is unchanged");
        xfree(src);
        xfree(dst);
    }
    closedir(dd);
    return rc;
}

/* Splits a normalized dir into its parent ("." if none) and base name, both newly allocated. */
static int split_dir(const char *d, char **parent, char **base, SeqErr *e) {
    const char *slash = strrchr(d, '/');
    if (!slash) {
        *parent = str_printf(".");
        *base = str_printf("%s", d);
    } else {
        *parent = slash == d ? str_printf("/") : str_printf("%.*s", (int)(slash - d), d);
        *base = str_printf("%s", slash + 1);
    }
    if (strcmp(*base, ".") == 0 || strcmp(*base, "..") == 0) {
        xfree(*parent);
        xfree(*base);
        *parent = *base = NULL;
        return seq_err(e, "checkpoint directory '%s' must end in a real directory name (not . or ..)", d);
    }
    return 0;
}

static int path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    if (remove(path) != 0)
        fprintf(stderr, "seqpar: warning: could not remove '%s': %s\n", path, strerror(errno));
    return 0;
}

/* Removes a directory tree; failures are warnings (the new checkpoint is already complete). */
static void remove_tree(const char *path) {
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "seqpar: warning: could not remove '%s': %s\n", path, strerror(errno));
}

/* 1 if `name` is "<base>.<kind>.XXXXXX" (six characters after the prefix). */
static int is_sibling(const char *name, const char *base, const char *kind) {
    size_t bl = strlen(base), kl = strlen(kind);
    return strncmp(name, base, bl) == 0 && name[bl] == '.' && strncmp(name + bl + 1, kind, kl) == 0 &&
           name[bl + 1 + kl] == '.' && strlen(name + bl + 1 + kl + 1) == 6;
}


/* 1 if `path` holds a trainer_state.json that says it was written by seqpar. */
static int is_seqpar_checkpoint(const char *d) {
    char *state = str_printf("%s/" F_STATE, d);
    unsigned char *text = NULL;
    size_t len = 0;
    int yes = 0;
    if (read_regular_file(state, "trainer state", STATE_MAX_BYTES, &text, &len, NULL) == 0) {
        json_t *root = json_loadb((const char *)text, len, 0, NULL);
        const char *fmt = root ? json_string_value(json_object_get(root, "format")) : NULL;
        yes = fmt && strcmp(fmt, STATE_FORMAT) == 0;
        if (root) json_decref(root);
        xfree(text);
    }
    xfree(state);
    return yes;
}

static int is_whole_checkpoint(const char *d);

/* The first "<base>.old.XXXXXX" in parent (newly allocated, or NULL), only those holding a whole
 * seqpar checkpoint where checkpoints_only (is_whole_checkpoint: not the part of an old copy that a
 * save killed while removing it left); where second is not NULL, also the next such one there. */
static char *find_old_sibling(const char *parent, const char *base, int checkpoints_only, char **second) {
    if (second) *second = NULL;
    DIR *dd = opendir(parent);
    if (!dd) return NULL;
    char *found = NULL;
    struct dirent *ent;
    while ((!found || (second && !*second)) && (ent = readdir(dd)) != NULL) {
        if (!is_sibling(ent->d_name, base, "old")) continue;
        char *path = str_printf("%s/%s", parent, ent->d_name);
        if (checkpoints_only && !is_whole_checkpoint(path)) xfree(path);
        else if (!found) found = path;
        else *second = path;
    }
    closedir(dd);
    return found;
}

/* nftw has no user pointer: the running total of tree_bytes (one caller at a time, rank 0's start) */
static uint64_t g_tree_bytes;
static long g_tree_files;

static int add_file_size(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)path; (void)ftw;
    if (flag == FTW_F) {
        g_tree_bytes += (uint64_t)sb->st_size;
        g_tree_files++;
    }
    return 0;
}

int checkpoint_leftovers(const char *dir, char **first, uint64_t *bytes) {
    *first = NULL;
    *bytes = 0;
    char *d = normalize_dir(dir, NULL), *parent = NULL, *base = NULL;
    if (!d) return 0;
    int n = 0;
    DIR *dd = split_dir(d, &parent, &base, NULL) == 0 ? opendir(parent) : NULL;
    struct dirent *ent;
    while (dd && (ent = readdir(dd)) != NULL) {
        if (!is_sibling(ent->d_name, base, "tmp") && !is_sibling(ent->d_name, base, "old")) continue;
        char *path = str_printf("%s/%s", parent, ent->d_name);
        struct stat sb;
        g_tree_bytes = 0;
        g_tree_files = 0;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) nftw(path, add_file_size, 16, FTW_PHYS);
        if (g_tree_files > 0) {
            n++;
            *bytes += g_tree_bytes;
            if (!*first) {
                *first = path;
                path = NULL;
            }
        }
        xfree(path);
    }
    if (dd) closedir(dd);
    xfree(d);
    xfree(parent);
    xfree(base);
    return n;
}

int checkpoint_recover(const char *dir, char **from, SeqErr *e) {
    *from = NULL;
    char *d = normalize_dir(dir, e), *parent = NULL, *base = NULL;
    if (!d) return -1;
    if (split_dir(d, &parent, &base, e) != 0) {
        xfree(d);
        return -1;
    }
    struct stat sb;
    char *found = NULL, *other = NULL; /* the first two DIR.old.* siblings holding a checkpoint */
    if (lstat(d, &sb) != 0 && errno == ENOENT) found = find_old_sibling(parent, base, 1, &other);
    int rc = 0;
    if (other)
        rc = seq_err(e, "checkpoint directory '%s' does not exist, and interrupted saves left more than one checkpoint "
                     "beside it ('%s', '%s', ...): rename the one to continue from to '%s'", d, found, other, d);
    else if (found && rename(found, d) != 0)
        rc = seq_err(e, "cannot bring back checkpoint '%s' from '%s', where an interrupted save left it: %s (rename "
                     "it yourself)", d, found, strerror(errno));
    else if (found && (rc = fsync_dir(parent, e)) == 0) {
        *from = found;
        found = NULL;
        rc = 1;
    }
    xfree(found);
    xfree(other);
    xfree(d);
    xfree(parent);
    xfree(base);
    return rc;
}

/* An existing DIR may be replaced only if it is ours: a directory owned by this user that is
 * empty or holds a seqpar checkpoint. */
static int check_replaceable(const char *d, SeqErr *e) {
    struct stat sb;
    if (stat(d, &sb) != 0) return seq_err(e, "cannot inspect checkpoint directory '%s': %s", d, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return seq_err(e, "checkpoint path '%s' exists and is not a directory: choose another --save path", d);
    if (sb.st_uid != geteuid())
        return seq_err(e, "refusing to replace '%s': it belongs to another user (uid %u): choose a checkpoint directory "
                       "of your own", d, (unsigned)sb.st_uid);
    /* its owner took away its own write permission (chmod a-w: keep it): a save renames a new
     * directory into its place, which the directory's mode does not stop, and then cannot remove
     * the old copy's files; root too, whom the mode does not stop otherwise */
    if (!(sb.st_mode & S_IWUSR))
        return seq_err(e, "refusing to replace '%s': it is read-only (mode %03o) and a save puts a new directory in its "
                       "place: make it writable (chmod u+w %s) or choose another --save path", d,
                       (unsigned)(sb.st_mode & 07777), d);
    if (is_seqpar_checkpoint(d)) return 0;
    DIR *dd = opendir(d);
    if (!dd) return seq_err(e, "cannot read checkpoint directory '%s': %s", d, strerror(errno));
    int empty = 1;
    struct dirent *de;
    while ((de = readdir(dd)) != NULL)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) { empty = 0; break; }
    closedir(dd);
    if (!empty)
        return seq_err(e, "refusing to replace '%s': it exists, is not empty and is not a seqpar checkpoint (no "
                       "seqpar " F_STATE "): choose a new checkpoint directory", d);
    return 0;
}

int checkpoint_check_target(const char *dir, SeqErr *e) {
    char *d = normalize_dir(dir, e), *parent = NULL, *base = NULL;
    if (!d) return -1;
    int rc = split_dir(d, &parent, &base, e);
    struct stat sb;
    if (rc == 0 && (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        rc = seq_err(e, "cannot save checkpoint '%s': parent directory '%s' %s: create it first", d, parent,
                     path_exists(parent) ? "is not a directory" : "does not exist");
    struct stat db, pb; /* a save renames a new directory into d's place: not across file systems */
    if (rc == 0 && stat(d, &db) == 0 && stat(parent, &pb) == 0 && db.st_dev != pb.st_dev)
        rc = seq_err(e, "cannot save checkpoint '%s': it is a mount point (another file system than '%s'), and a "
                     "checkpoint is put in place by renaming a new directory beside it: give --save %s/NAME, a "
                     "directory inside it", d, parent, d);
    if (rc == 0 && path_exists(d)) rc = check_replaceable(d, e);
    if (rc == 0) { /* the only honest writability test: create (and remove) a sibling */
        char *probe = str_printf("%s.tmp.XXXXXX", d);
        if (!mkdtemp(probe))
            rc = seq_err(e, "cannot save checkpoint '%s': creating a directory in '%s' failed: %s (choose a writable "
                         "--save path)", d, parent, strerror(errno));
        else
            rmdir(probe);
        xfree(probe);
    }
    xfree(d);
    xfree(parent);
    xfree(base);
    return rc;
}

int checkpoint_lock(const char *dir, SeqErr *e) {
    char *d = normalize_dir(dir, e), *parent = NULL, *base = NULL;
    if (!d) return -1;
    int fd = -1;
    if (split_dir(d, &parent, &base, e) == 0) {
        char *path = str_printf("%s/.%s.seqpar-lock", parent, base);
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            seq_err(e, "cannot save checkpoint '%s': creating its lock '%s' failed: %s (choose a writable --save path)",
                    d, path, strerror(errno));
        } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char holder[32] = "";
            const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = 0;
            holder[strcspn(holder, "\n")] = 0;
            seq_err(e, "--save %s is being written by another run (%s%s holds its lock '%s'%s): give this run another "
                    "directory, or start it when that one ends", d, *holder ? "process " : "a process", holder, path,
                    *holder ? ", on the host running that run" : "");
            close(fd);
            fd = -1;
        } else {
            char pid[32];
            const int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) == 0) { /* the holder's name is a courtesy to the next run's message */
                const ssize_t wrote = pwrite(fd, pid, (size_t)len, 0);
                (void)wrote;
            }
        }
        xfree(path);
    }
    xfree(d);
    xfree(parent);
    xfree(base);
    return fd;
}

/* ---------------------------------------------------------------------------------------------
 * Saving */

static void hex_u64(char out[19], uint64_t x) { snprintf(out, 19, "0x%016" PRIx64, x); }

static json_t *state_to_json(const TrainerState *st, const ParamTable *t, const AdamW *opt) {
    char hex[19];
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(STATE_FORMAT));
    json_object_set_new(root, "format_version", json_integer(CKPT_FORMAT_VERSION));
    json_object_set_new(root, "step", json_integer(st->step));
    json_object_set_new(root, "param_total", json_integer((json_int_t)t->total));
    hex_u64(hex, st->seed);
    json_object_set_new(root, "seed", json_string(hex));
    hex_u64(hex, st->data_cursor);
    json_object_set_new(root, "data_cursor", json_string(hex));
    hex_u64(hex, st->data_shard);
    json_object_set_new(root, "data_shard", json_string(hex));
    json_t *rng = json_array();
    for (int i = 0; i < 4; i++) {
        hex_u64(hex, st->data_rng.s[i]);
        json_array_append_new(rng, json_string(hex));
    }
    json_object_set_new(root, "data_rng", rng);
    json_object_set_new(root, "seq_len", json_integer(st->seq_len));
    if (opt) {
        json_t *o = json_object();
        json_object_set_new(o, "type", json_string("adamw"));
        json_object_set_new(o, "file", json_string(F_OPTIM));
        json_object_set_new(o, "step", json_integer(opt->step));
        json_object_set_new(o, "begin", json_integer((json_int_t)opt->begin));
        json_object_set_new(o, "end", json_integer((json_int_t)opt->end));
        json_object_set_new(root, "optimizer", o);
    } else {
        json_object_set_new(root, "optimizer", json_null());
    }
    json_t *set = json_object();
    for (int i = 0; i < st->n_settings; i++)
        json_object_set_new(set, st->settings[i].key, json_string(st->settings[i].value));
    json_object_set_new(root, "settings", set);
    return root;
}

/* CRC-32 of the state's canonical text: compact, keys sorted, without "state_crc32" itself. */
static int state_crc(json_t *root, uint32_t *crc) {
    json_t *copy = json_deep_copy(root);
    if (!copy) return -1;
    json_object_del(copy, "state_crc32");
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(copy);
    if (!text) return -1;
    *crc = crc32_bytes(0, text, strlen(text));
    free(text);
    return 0;
}


static int write_json_atomic(const char *path, json_t *root, SeqErr *e) {
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) return seq_err(e, "cannot serialize '%s' (out of memory?)", path);
    int rc = atomic_write_text(path, text, e);
    free(text);
    return rc;
}

/* Records DIR_TMP/name's size and CRC in files; 0, or -1 with a message. */
static int record_file(json_t *files, const char *tmp, const char *name, SeqErr *e) {
    char *p = str_printf("%s/%s", tmp, name);
    json_t *j = file_size_crc_json(p, "checkpoint file", e);
    xfree(p);
    if (!j) return -1;
    json_object_set_new(files, name, j);
    return 0;
}

/* Writes every file of the checkpoint into the temporary directory tmp; 0, or -1 with a message. */
static int fill_checkpoint(const char *tmp, const char *d, const LlamaConfig *cfg, const ParamTable *t,
                           const float *params, const AdamW *opt, const CheckpointSource *src,
                           uint64_t max_shard_bytes, const TrainerState *st, SeqErr *e) {
    json_t *files = json_object();
    char *p = str_printf("%s/" F_CONFIG, tmp);
    int rc = config_json_save(p, cfg, e);
    xfree(p);
    if (rc == 0) rc = record_file(files, tmp, F_CONFIG, e);
    int n_weight_files =
        rc == 0 ? params_save_dir(tmp, t, params, params || !src ? NULL : &src->params, max_shard_bytes, e) : -1;
    if (n_weight_files < 0) rc = -1;
    /* shards: their CRCs are in the index */
    if (rc == 0) rc = record_file(files, tmp, n_weight_files == 1 ? F_MODEL : ST_INDEX_NAME, e);
    if (rc == 0 && opt) {
        size_t n = opt->end - opt->begin;
        StWriteTensor w[2] = {
            { "adamw.m", opt->m, 1, { (int64_t)n, 0, 0, 0 }, 0 },
            { "adamw.v", opt->v, 1, { (int64_t)n, 0, 0, 0 }, n },
        };
        p = str_printf("%s/" F_OPTIM, tmp);
        rc = st_write_f32_src(p, w, 2, "pt", opt->m || !src ? NULL : &src->moments, e);
        xfree(p);
        if (rc == 0) rc = record_file(files, tmp, F_OPTIM, e);
    }
    if (rc != 0) {
        json_decref(files);
        return -1;
    }
    json_t *root = state_to_json(st, t, opt);
    json_object_set_new(root, "files", files);
    uint32_t crc;
    if (state_crc(root, &crc) != 0) {
        json_decref(root);
        return seq_err(e, "cannot checksum the trainer state of '%s' (out of memory?)", d);
    }
    char hex[11];
    snprintf(hex, sizeof hex, "0x%08" PRIx32, crc);
    json_object_set_new(root, "state_crc32", json_string(hex));
    p = str_printf("%s/" F_STATE, tmp);
    rc = write_json_atomic(p, root, e);
    xfree(p);
    json_decref(root);
    return rc == 0 ? fsync_dir(tmp, e) : -1;
}

/* Puts the complete temporary directory tmp in place of d (which exists when `exists`); on
 * success *old is the copy moved aside, if any, for the caller to remove. 0, or -1 with a message
 * saying where each copy is. */
static int swap_in(const char *tmp, const char *d, int exists, char **old, SeqErr *e) {
    *old = NULL;
    if (!exists) {
        if (rename(tmp, d) != 0)
            return seq_err(e, "cannot save checkpoint '%s': renaming '%s' into place failed: %s", d, tmp, strerror(errno));
        return 0;
    }
    if (!getenv("SEQPAR_CKPT_NO_RENAME_EXCHANGE") && /* test hook: force the fallback */
        renameat2(AT_FDCWD, tmp, AT_FDCWD, d, RENAME_EXCHANGE) == 0) {
        *old = str_printf("%s", tmp); /* now holds the previous checkpoint */
        return 0;
    }
    if (!getenv("SEQPAR_CKPT_NO_RENAME_EXCHANGE") && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return seq_err(e, "cannot save checkpoint '%s': swapping in the new one failed: %s (the new checkpoint is "
                       "complete in '%s')", d, strerror(errno), tmp);
    char *aside = str_printf("%s.old.XXXXXX", d);
    if (!mkdtemp(aside)) {
        seq_err(e, "cannot save checkpoint '%s': creating '%s' failed: %s (the new checkpoint is complete in '%s')", d,
                aside, strerror(errno), tmp);
        xfree(aside);
        return -1;
    }
    if (rename(d, aside) != 0) { /* replaces the empty placeholder directory */
        seq_err(e, "cannot save checkpoint '%s': moving the old one aside failed: %s (the new checkpoint is complete "
                "in '%s')", d, strerror(errno), tmp);
        rmdir(aside);
        xfree(aside);
        return -1;
    }
    if (rename(tmp, d) != 0) {
        seq_err(e, "cannot save checkpoint '%s': renaming '%s' into place failed: %s (the previous checkpoint is in "
                "'%s': rename it back to '%s')", d, tmp, strerror(errno), aside, d);
        xfree(aside);
        return -1;
    }
    *old = aside;
    return 0;
}

int checkpoint_save(const char *dir, const LlamaConfig *cfg, const ParamTable *t, const float *params,
                    const AdamW *opt, const TrainerState *st, SeqErr *e) {
    return checkpoint_save_src(dir, cfg, t, params, opt, NULL, CHECKPOINT_DEFAULT_SHARD_BYTES, st, e);
}

int checkpoint_save_src(const char *dir, const LlamaConfig *cfg, const ParamTable *t, const float *params,
                        const AdamW *opt, const CheckpointSource *src, uint64_t max_shard_bytes,
                        const TrainerState *st, SeqErr *e) {
    if ((!params || (opt && !opt->m)) && !src)
        return seq_err(e, "internal: cannot save checkpoint '%s': weights or moments given neither whole nor by a source",
                       dir);
    if (checkpoint_check_target(dir, e) != 0) return -1;
    char *d = normalize_dir(dir, e), *parent = NULL, *base = NULL, *tmp = NULL, *old = NULL;
    int rc = d ? split_dir(d, &parent, &base, e) : -1;
    if (rc == 0 && opt && (opt->end > t->total || opt->begin > opt->end))
        rc = seq_err(e, "cannot save checkpoint '%s': optimizer range [%zu, %zu) lies outside the %zu parameters", d,
                     opt->begin, opt->end, t->total);
    if (rc == 0) {
        const int exists = path_exists(d);
        tmp = str_printf("%s.tmp.XXXXXX", d);
        if (!mkdtemp(tmp)) {
            rc = seq_err(e, "cannot save checkpoint '%s': creating a temporary directory beside it failed: %s (check "
                         "that '%s' is writable)", d, strerror(errno), parent);
        } else {
            mode_t mask = umask(0);
            umask(mask);
            (void)chmod(tmp, (0777 & ~mask) | S_IRWXU); /* mkdtemp makes 0700; not fatal if this fails; writable
                                                          * by its owner whatever the umask (the next save's check) */
            /* a failed write (a full disk) removes what this save created; once the temporary is
             * complete, the messages say where each copy is */
            rc = fill_checkpoint(tmp, d, cfg, t, params, opt, src, max_shard_bytes, st, e);
            if (rc != 0) remove_tree(tmp);
            else {
                for (int dirs = 0; exists && rc == 0 && dirs < 2; dirs++) rc = carry_user_entries(d, tmp, dirs, e);
                if (rc == 0) rc = swap_in(tmp, d, exists, &old, e);
            }
        }
    }
    if (rc == 0) rc = fsync_dir(parent, e);
    /* Only the copy this save moved aside is removed: DIR.tmp.* / DIR.old.* siblings that this
     * run did not create (an earlier crash's, or someone else's) are left alone. */
    if (old) remove_tree(old);
    xfree(old);
    xfree(tmp);
    xfree(d);
    xfree(parent);
    xfree(base);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Loading */

int checkpoint_exists(const char *dir) {
    char *d = normalize_dir(dir, NULL);
    if (!d) return 0;
    char *p = str_printf("%s/" F_STATE, d);
    int r = path_exists(p);
    xfree(p);
    xfree(d);
    return r;
}

/* 0 if d is a directory; else a message pointing at an interrupted save's leftover if any. */
static int require_dir(const char *d, SeqErr *e) {
    struct stat sb;
    if (stat(d, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return seq_err(e, "checkpoint '%s' is not a directory: pass a checkpoint directory", d);
        return 0;
    }
    char *parent, *base;
    if (split_dir(d, &parent, &base, e) != 0) return -1;
    char *old = find_old_sibling(parent, base, 1, NULL); /* a whole checkpoint first */
    if (!old) old = find_old_sibling(parent, base, 0, NULL);
    int rc;
    if (old)
        rc = seq_err(e, "checkpoint directory '%s' does not exist, but '%s' does (a save was interrupted): rename it "
                     "to '%s' to resume from it (a run given --save %s too brings it back itself)", d, old, d, d);
    else
        rc = seq_err(e, "checkpoint directory '%s' does not exist: check the path", d);
    xfree(old);
    xfree(parent);
    xfree(base);
    return rc;
}

/* What every message about a damaged or incomplete checkpoint ends in (checkpoint_error_advice). */
static const char *damage_advice(void) { return CHECKPOINT_DAMAGE_ADVICE; }

void checkpoint_error_advice(SeqErr *e, const char *advice) {
    const size_t n = strlen(e->msg), k = strlen(CHECKPOINT_DAMAGE_ADVICE);
    if (!advice || n < k || strcmp(e->msg + n - k, CHECKPOINT_DAMAGE_ADVICE) != 0) return;
    snprintf(e->msg + n - k, sizeof e->msg - (n - k), "%s", advice);
}

static char *require_file(const char *d, const char *name, SeqErr *e) {
    char *p = str_printf("%s/%s", d, name);
    if (!path_exists(p)) {
        seq_err(e, "checkpoint '%s' is incomplete: %s is missing (not a whole checkpoint written by seqpar): %s", d,
                name, damage_advice());
        xfree(p);
        return NULL;
    }
    return p;
}

static int bad_field(const char *path, const char *key, const char *what, SeqErr *e) {
    return seq_err(e, "%s: field \"%s\" is missing or not %s (the file is damaged): %s", path, key, what,
                   damage_advice());
}

static int get_int(const char *path, json_t *obj, const char *key, json_int_t min, json_int_t *out, SeqErr *e) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) return bad_field(path, key, "an integer", e);
    json_int_t x = json_integer_value(v);
    if (x < min) return bad_field(path, key, "a non-negative integer", e);
    *out = x;
    return 0;
}

static int parse_hex(const char *path, const char *key, json_t *v, int max_digits, uint64_t *out, SeqErr *e) {
    const char *s = json_string_value(v);
    size_t n = s ? strlen(s) : 0;
    if (!s || strncmp(s, "0x", 2) != 0 || n < 3 || n > (size_t)max_digits + 2)
        return bad_field(path, key, "a \"0x...\" hex string", e);
    for (size_t i = 2; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F')))
            return bad_field(path, key, "a \"0x...\" hex string", e);
    *out = (uint64_t)strtoull(s + 2, NULL, 16);
    return 0;
}

typedef struct {
    int has_opt;
    long opt_step;
    size_t opt_begin, opt_end;
    size_t param_total;
    int checksummed;  /* format_version >= 2: "files" holds size and CRC-32 of each file */
    uint64_t bytes[3]; /* config, model, optimizer */
    uint32_t crc[3];
    int has_file[3];
    int sharded;       /* the weights are ST_INDEX_NAME + shards rather than F_MODEL */
} StateExtra;

static const char *const CHECKED_FILES[3] = { F_CONFIG, F_MODEL, F_OPTIM };

static int parse_state(const char *path, json_t *root, TrainerState *st, StateExtra *ex, SeqErr *e) {
    if (!json_is_object(root))
        return seq_err(e, "%s is not a JSON object: the file is damaged: %s", path, damage_advice());
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, STATE_FORMAT) != 0)
        return seq_err(e, "%s is not a seqpar trainer state (\"format\" is not \"" STATE_FORMAT "\"): pass a "
                       "checkpoint written by seqpar", path);
    json_int_t ver = 0, x = 0;
    if (get_int(path, root, "format_version", 0, &ver, e) != 0) return -1;
    if (ver != CKPT_FORMAT_VERSION && ver != 1)
        return seq_err(e, "%s has format_version %lld but this seqpar reads versions 1 and %d: resume with the seqpar "
                       "version that wrote it", path, (long long)ver, CKPT_FORMAT_VERSION);
    ex->checksummed = ver >= 2;
    if (!ex->checksummed && (json_object_get(root, "state_crc32") || json_object_get(root, "files")))
        return seq_err(e, "%s says format_version 1 but records version 2's checksums: the file is damaged (an edit or "
                       "a bit flip that would turn its checks off): %s", path, damage_advice());
    if (ex->checksummed) {
        uint64_t want;
        uint32_t got;
        if (parse_hex(path, "state_crc32", json_object_get(root, "state_crc32"), 8, &want, e) != 0) return -1;
        if (state_crc(root, &got) != 0) return seq_err(e, "%s: cannot checksum the trainer state (out of memory?)", path);
        if (CHECKSUMS_ENFORCED && got != (uint32_t)want)
            return seq_err(e, "%s is damaged: its contents have CRC-32 0x%08" PRIx32 " but it records 0x%08" PRIx32
                           " (a bit flip or an edit): %s", path, got, (uint32_t)want, damage_advice());
        json_t *files = json_object_get(root, "files");
        if (!json_is_object(files)) return bad_field(path, "files", "an object", e);
        for (int i = 0; i < 3; i++) {
            json_t *f = json_object_get(files, CHECKED_FILES[i]);
            if (!f && i == 1 && (f = json_object_get(files, ST_INDEX_NAME)) != NULL) ex->sharded = 1;
            if (!f) continue;
            uint64_t crc;
            if (!json_is_object(f) || get_int(path, f, "bytes", 0, &x, e) != 0 ||
                parse_hex(path, "files.crc32", json_object_get(f, "crc32"), 8, &crc, e) != 0)
                return bad_field(path, "files", "an object of {bytes, crc32}", e);
            ex->has_file[i] = 1;
            ex->bytes[i] = (uint64_t)x;
            ex->crc[i] = (uint32_t)crc;
        }
        if (!ex->has_file[0] || !ex->has_file[1])
            return bad_field(path, "files", "an object listing " F_CONFIG " and " F_MODEL " (or " ST_INDEX_NAME ")", e);
    }

    trainer_state_init(st);
    if (get_int(path, root, "step", 0, &x, e) != 0) return -1;
    st->step = (long)x;
    if (get_int(path, root, "param_total", 0, &x, e) != 0) return -1;
    ex->param_total = (size_t)x;
    if (parse_hex(path, "seed", json_object_get(root, "seed"), 16, &st->seed, e) != 0 ||
        parse_hex(path, "data_cursor", json_object_get(root, "data_cursor"), 16, &st->data_cursor, e) != 0)
        return -1;
    /* absent in checkpoints written before multi-shard data: everything was one shard */
    json_t *shard = json_object_get(root, "data_shard");
    if (shard && parse_hex(path, "data_shard", shard, 16, &st->data_shard, e) != 0) return -1;
    json_t *rng = json_object_get(root, "data_rng");
    if (!json_is_array(rng) || json_array_size(rng) != 4) return bad_field(path, "data_rng", "an array of 4 hex strings", e);
    for (int i = 0; i < 4; i++)
        if (parse_hex(path, "data_rng", json_array_get(rng, (size_t)i), 16, &st->data_rng.s[i], e) != 0) return -1;
    if (get_int(path, root, "seq_len", 0, &x, e) != 0) return -1;
    if (x > 0x7fffffff) return bad_field(path, "seq_len", "an int", e);
    st->seq_len = (int)x;

    json_t *o = json_object_get(root, "optimizer");
    if (json_is_null(o)) {
        ex->has_opt = 0;
    } else if (json_is_object(o)) {
        const char *type = json_string_value(json_object_get(o, "type"));
        if (!type || strcmp(type, "adamw") != 0) return bad_field(path, "optimizer.type", "\"adamw\"", e);
        ex->has_opt = 1;
        if (get_int(path, o, "step", 0, &x, e) != 0) return -1;
        ex->opt_step = (long)x;
        if (get_int(path, o, "begin", 0, &x, e) != 0) return -1;
        ex->opt_begin = (size_t)x;
        if (get_int(path, o, "end", 0, &x, e) != 0) return -1;
        ex->opt_end = (size_t)x;
        if (ex->opt_begin > ex->opt_end || ex->opt_end > ex->param_total)
            return bad_field(path, "optimizer.begin/end", "a range inside param_total", e);
        if (ex->checksummed && !ex->has_file[2])
            return bad_field(path, "files", "an object listing " F_OPTIM, e);
    } else {
        return bad_field(path, "optimizer", "an object or null", e);
    }

    json_t *set = json_object_get(root, "settings");
    if (!json_is_object(set)) return bad_field(path, "settings", "an object", e);
    const char *key;
    json_t *val;
    json_object_foreach(set, key, val) {
        if (!json_is_string(val)) return bad_field(path, "settings", "an object of strings", e);
        if (strlen(key) == 0 || strlen(key) >= sizeof st->settings[0].key ||
            strlen(json_string_value(val)) >= sizeof st->settings[0].value || st->n_settings >= CKPT_MAX_SETTINGS)
            return bad_field(path, "settings", "a small object of short strings", e);
        trainer_state_set(st, key, "%s", json_string_value(val));
    }
    return 0;
}

static int parse_state_text(const char *text, size_t len, const char *path, TrainerState *st, StateExtra *ex,
                            SeqErr *e) {
    memset(ex, 0, sizeof *ex);
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return seq_err(e, "%s is not valid JSON (line %d: %s): the file is damaged: %s", path, err.line, err.text,
                       damage_advice());
    int rc = parse_state(path, root, st, ex, e);
    json_decref(root);
    return rc;
}

int trainer_state_parse(const char *text, size_t len, const char *path, TrainerState *st, SeqErr *e) {
    StateExtra ex;
    return parse_state_text(text, len, path, st, &ex, e);
}

static int read_state(const char *path, TrainerState *st, StateExtra *ex, SeqErr *e) {
    unsigned char *text;
    size_t len;
    if (read_regular_file(path, "trainer state", STATE_MAX_BYTES, &text, &len, e) != 0) return -1;
    int rc = parse_state_text((const char *)text, len, path, st, ex, e);
    xfree(text);
    return rc;
}

/* 1 if d holds a whole seqpar checkpoint: its trainer state reads (its own CRC-32 checked) and each
 * file it records (config, weights or their index, optimizer) is a regular file of the size it
 * recorded. What a save killed while it removed an old copy leaves (DIR.old.* in the fallback: some
 * files unlinked, trainer_state.json perhaps still there) is not; the files' CRC-32s are not read
 * here (the resume checks them). Version-1 states (no sizes): the files must exist. */
static int is_whole_checkpoint(const char *d) {
    char *state = str_printf("%s/" F_STATE, d);
    TrainerState st;
    StateExtra ex;
    int yes = read_state(state, &st, &ex, NULL) == 0;
    xfree(state);
    for (int i = 0; yes && i < 3; i++) {
        const int needed = ex.checksummed ? ex.has_file[i] : (i < 2 || ex.has_opt);
        if (!needed) continue;
        char *p = str_printf("%s/%s", d, i == 1 && ex.sharded ? ST_INDEX_NAME : CHECKED_FILES[i]);
        struct stat sb;
        yes = stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && (!ex.checksummed || (uint64_t)sb.st_size == ex.bytes[i]);
        xfree(p);
    }
    return yes;
}

/* Checks file i of the checkpoint against the size and CRC-32 the state recorded at save. */
static int verify_file(const char *path, const StateExtra *ex, int i, SeqErr *e) {
    if (!ex->checksummed || !ex->has_file[i]) return 0;
    uint32_t crc;
    uint64_t size;
    if (file_crc32(path, &crc, &size, e) != 0) return -1;
    if (!CHECKSUMS_ENFORCED) return 0;
    if (size != ex->bytes[i])
        return seq_err(e, "checkpoint file '%s' is damaged: it has %llu bytes but " F_STATE " recorded %llu at save "
                       "(truncated or replaced): %s", path, (unsigned long long)size,
                       (unsigned long long)ex->bytes[i], damage_advice());
    if (crc != ex->crc[i])
        return seq_err(e, "checkpoint file '%s' is damaged: its CRC-32 is 0x%08" PRIx32 " but " F_STATE " recorded "
                       "0x%08" PRIx32 " at save (a bit flip on disk or in transfer): %s", path, crc, ex->crc[i],
                       damage_advice());
    return 0;
}

int checkpoint_verify_model(const char *dir, SeqErr *e) {
    char *d = normalize_dir(dir, e);
    if (!d) return -1;
    int rc = 0;
    if (is_seqpar_checkpoint(d)) {
        char *state = str_printf("%s/" F_STATE, d), *cfg = str_printf("%s/" F_CONFIG, d), *model = str_printf("%s/" F_MODEL, d);
        StateExtra ex;
        TrainerState st;
        rc = read_state(state, &st, &ex, e);
        if (rc == 0) rc = verify_file(cfg, &ex, 0, e);
        if (rc == 0 && !ex.sharded && path_exists(model)) rc = verify_file(model, &ex, 1, e);
        xfree(state);
        xfree(cfg);
        xfree(model);
    }
    xfree(d);
    return rc;
}

int checkpoint_read_config(const char *dir, LlamaConfig *cfg, SeqErr *e) {
    char *d = normalize_dir(dir, e), *state_path = NULL, *cfg_path = NULL;
    if (!d) return -1;
    StateExtra ex;
    TrainerState st;
    int rc = require_dir(d, e);
    if (rc == 0 && !(state_path = require_file(d, F_STATE, e))) rc = -1;
    if (rc == 0 && !(cfg_path = require_file(d, F_CONFIG, e))) rc = -1;
    if (rc == 0) rc = read_state(state_path, &st, &ex, e);
    if (rc == 0) rc = verify_file(cfg_path, &ex, 0, e);
    if (rc == 0) rc = config_json_read(cfg_path, cfg, e);
    xfree(cfg_path);
    xfree(state_path);
    xfree(d);
    return rc;
}

void checkpoint_load_config(const char *dir, LlamaConfig *cfg) {
    SeqErr e;
    if (checkpoint_read_config(dir, cfg, &e) != 0) die("%s", e.msg);
}

static int check_config(const char *path, const LlamaConfig *got, const LlamaConfig *want, SeqErr *e) {
#define CHECK_FIELD(f) \
    if (got->f != want->f) \
        return seq_err(e, "%s has " #f " %d but the model was built with %d: build the model from the checkpoint's " \
                       "config", path, got->f, want->f)
    CHECK_FIELD(hidden_size);
    CHECK_FIELD(intermediate_size);
    CHECK_FIELD(num_attention_heads);
    CHECK_FIELD(num_key_value_heads);
    CHECK_FIELD(num_hidden_layers);
    CHECK_FIELD(vocab_size);
    CHECK_FIELD(head_dim);
    CHECK_FIELD(tie_word_embeddings);
#undef CHECK_FIELD
    return 0;
}

/* Checks that `name` in the optimizer file is 1-D with n elements (the saved range), then reads
 * elements [first, first + count) of it: this run's range (a rank's shard reads only its own). */
/* Elements [first, first + count) of moment `name` (n saved) into dst, or, where dst is NULL, to the
 * sink's moment `moment` piece by piece. */
static int read_moment(const StFile *f, const char *path, const char *name, size_t n, size_t first, size_t count,
                       float *dst, const CheckpointSink *sink, int moment, SeqErr *e) {
    const StTensor *ts = st_find(f, name);
    if (!ts) return seq_err(e, "%s has no tensor %s: the file is damaged: %s", path, name, damage_advice());
    size_t have = 1;
    for (int i = 0; i < ts->ndim; i++) have *= (size_t)ts->shape[i];
    if (ts->ndim != 1 || have != n)
        return seq_err(e, "%s: %s has %zu elements but this model's optimizer range has %zu: the checkpoint belongs to "
                       "a different model or rank layout", path, name, have, n);
    if (dst) {
        if (st_load_tensor_range(f, name, n, first, count, dst, e) != 0) return -1;
        return st_check_finite(dst, count, name, path, e);
    }
    float *piece = xmalloc(sizeof(float) * (count < ST_WRITE_PIECE ? (count ? count : 1) : ST_WRITE_PIECE));
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < count; k += ST_WRITE_PIECE) {
        const size_t m = count - k < ST_WRITE_PIECE ? count - k : ST_WRITE_PIECE;
        rc = st_load_tensor_range(f, name, n, first + k, m, piece, e);
        if (rc == 0) rc = st_check_finite(piece, m, name, path, e);
        if (rc == 0) sink->write(sink->ctx, moment, k, m, piece);
    }
    xfree(piece);
    return rc;
}

int checkpoint_read(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, AdamW *opt,
                    TrainerState *st, SeqErr *e) {
    return checkpoint_read_part(dir, expect, t, params, 0, t->total, opt, st, e);
}

int checkpoint_read_part(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, size_t lo,
                         size_t hi, AdamW *opt, TrainerState *st, SeqErr *e) {
    return checkpoint_read_part_to(dir, expect, t, params, lo, hi, opt, NULL, st, e);
}

int checkpoint_read_part_to(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, size_t lo,
                            size_t hi, AdamW *opt, const CheckpointSink *moments, TrainerState *st, SeqErr *e) {
    if (opt && !opt->m && !moments)
        return seq_err(e, "internal: cannot read checkpoint '%s': the moments have neither a buffer nor a sink", dir);
    char *d = normalize_dir(dir, e);
    if (!d) return -1;
    char *cfg_path = NULL, *model_path = NULL, *state_path = NULL, *optim_path = NULL;
    StateExtra ex;
    memset(&ex, 0, sizeof ex);
    TrainerState loaded;
    LlamaConfig cfg;
    int rc = require_dir(d, e);
    if (rc == 0 && (!(cfg_path = require_file(d, F_CONFIG, e)) || !(state_path = require_file(d, F_STATE, e))))
        rc = -1;
    if (rc == 0) rc = read_state(state_path, &loaded, &ex, e);
    if (rc == 0 && !(model_path = require_file(d, ex.sharded ? ST_INDEX_NAME : F_MODEL, e))) rc = -1;
    if (rc == 0) rc = verify_file(cfg_path, &ex, 0, e);
    if (rc == 0) rc = config_json_read(cfg_path, &cfg, e);
    if (rc == 0 && expect) rc = check_config(cfg_path, &cfg, expect, e);
    if (rc == 0 && ex.param_total != t->total)
        rc = seq_err(e, "%s records %zu parameters but the model has %zu: build the model from the checkpoint's "
                     "config.json", state_path, ex.param_total, t->total);
    if (rc == 0 && opt) {
        if (!ex.has_opt)
            rc = seq_err(e, "checkpoint '%s' has no optimizer state (saved without one): load only the weights, or "
                         "resume from a checkpoint with " F_OPTIM, d);
        else if (opt->begin < ex.opt_begin || opt->end > ex.opt_end)
            rc = seq_err(e, "%s: the optimizer state covers [%zu, %zu) of the parameters but this run's optimizer "
                         "covers [%zu, %zu): resume with the same number of ranks as the saved run", state_path, ex.opt_begin,
                         ex.opt_end, opt->begin, opt->end);
        else if (!(optim_path = require_file(d, F_OPTIM, e)))
            rc = -1;
    }
    if (rc == 0) rc = verify_file(model_path, &ex, 1, e);
    if (rc == 0 && optim_path) rc = verify_file(optim_path, &ex, 2, e);
    if (rc == 0)
        rc = ex.sharded ? params_read_sharded(d, t, params, cfg.tie_word_embeddings, lo, hi, e)
                        : params_read_safetensors_part(model_path, t, params, cfg.tie_word_embeddings, lo, hi, e);
    if (rc == 0 && opt) {
        StFile f;
        rc = st_load(optim_path, &f, e);
        if (rc == 0) {
            const size_t n = ex.opt_end - ex.opt_begin, first = opt->begin - ex.opt_begin, count = opt->end - opt->begin;
            rc = read_moment(&f, optim_path, "adamw.m", n, first, count, opt->m, moments, 0, e);
            if (rc == 0) rc = read_moment(&f, optim_path, "adamw.v", n, first, count, opt->v, moments, 1, e);
            st_close(&f);
        }
        if (rc == 0) opt->step = ex.opt_step;
    }
    if (rc == 0) *st = loaded;

    xfree(optim_path);
    xfree(state_path);
    xfree(model_path);
    xfree(cfg_path);
    xfree(d);
    return rc;
}

void checkpoint_load(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, AdamW *opt,
                     TrainerState *st) {
    SeqErr e;
    if (checkpoint_read(dir, expect, t, params, opt, st, &e) != 0) die("%s", e.msg);
}
