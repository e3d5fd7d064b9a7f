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
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/config_json.h"
#include "io/param_io.h"
#include "io/safetensors.h"

#define STATE_FORMAT "seqpar-trainer-state"
#define F_CONFIG "config.json"
#define F_MODEL "model.safetensors"
#define F_OPTIM "optimizer.safetensors"
#define F_STATE "trainer_state.json"

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

void trainer_state_check(const TrainerState *saved, const TrainerState *now, const char *dir) {
    if (saved->seq_len > 0 && now->seq_len > 0 && saved->seq_len != now->seq_len)
        die("checkpoint %s was trained with seq_len %d but this run uses %d: resume with --seq-len %d or start a "
            "new run", dir, saved->seq_len, now->seq_len, saved->seq_len);
    for (int i = 0; i < saved->n_settings; i++) {
        const char *v = trainer_state_get(now, saved->settings[i].key);
        if (v && strcmp(v, saved->settings[i].value) != 0)
            die("checkpoint %s was trained with %s = %s but this run uses %s: resume with the same setting or "
                "start a new run", dir, saved->settings[i].key, saved->settings[i].value, v);
    }
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

/* `dir` without trailing slashes; dies on an empty path or "/". */
static char *normalize_dir(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n == 0 || (n == 1 && dir[0] == '/')) die("checkpoint directory '%s' is not usable: name a directory", dir);
    char *d = xmalloc(n + 1);
    memcpy(d, dir, n);
    d[n] = '\0';
    return d;
}

/* Splits a normalized dir into its parent ("." if none) and base name, both newly allocated. */
static void split_dir(const char *d, char **parent, char **base) {
    const char *slash = strrchr(d, '/');
    if (!slash) {
        *parent = str_printf(".");
        *base = str_printf("%s", d);
    } else {
        *parent = slash == d ? str_printf("/") : str_printf("%.*s", (int)(slash - d), d);
        *base = str_printf("%s", slash + 1);
    }
    if (strcmp(*base, ".") == 0 || strcmp(*base, "..") == 0)
        die("checkpoint directory '%s' must end in a real directory name (not . or ..)", d);
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

/* The first "<base>.old.XXXXXX" in parent, newly allocated, or NULL. */
static char *find_old_sibling(const char *parent, const char *base) {
    DIR *dd = opendir(parent);
    if (!dd) return NULL;
    char *found = NULL;
    struct dirent *e;
    while (!found && (e = readdir(dd)) != NULL)
        if (is_sibling(e->d_name, base, "old")) found = str_printf("%s/%s", parent, e->d_name);
    closedir(dd);
    return found;
}

static void remove_stale_siblings(const char *parent, const char *base) {
    DIR *dd = opendir(parent);
    if (!dd) return;
    /* Collect first: removing entries while reading the directory is unspecified. */
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        if (!is_sibling(e->d_name, base, "tmp") && !is_sibling(e->d_name, base, "old")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 4;
            char **nn = xmalloc(cap * sizeof *nn);
            if (names) memcpy(nn, names, n * sizeof *nn);
            xfree(names);
            names = nn;
        }
        names[n++] = str_printf("%s/%s", parent, e->d_name);
    }
    closedir(dd);
    for (size_t i = 0; i < n; i++) {
        remove_tree(names[i]);
        xfree(names[i]);
    }
    xfree(names);
}

/* An existing DIR may be replaced only if it is empty or looks like a checkpoint. */
static void check_replaceable(const char *d) {
    struct stat sb;
    if (stat(d, &sb) != 0) die("cannot inspect checkpoint directory '%s': %s", d, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) die("checkpoint path '%s' exists and is not a directory: choose another path", d);
    char *state = str_printf("%s/" F_STATE, d), *model = str_printf("%s/" F_MODEL, d);
    int looks_like = path_exists(state) || path_exists(model);
    xfree(state);
    xfree(model);
    if (looks_like) return;
    DIR *dd = opendir(d);
    if (!dd) die("cannot read checkpoint directory '%s': %s", d, strerror(errno));
    int empty = 1;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) { empty = 0; break; }
    closedir(dd);
    if (!empty)
        die("refusing to replace '%s': it exists, is not empty and is not a seqpar checkpoint (no " F_STATE
            " or " F_MODEL "): choose a new checkpoint directory", d);
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

static void write_json_atomic(const char *path, json_t *root) {
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) die("cannot serialize '%s' (out of memory?)", path);
    atomic_write_text(path, text);
    free(text);
}

void checkpoint_save(const char *dir, const LlamaConfig *cfg, const ParamTable *t, const float *params,
                     const AdamW *opt, const TrainerState *st) {
    char *d = normalize_dir(dir), *parent, *base;
    split_dir(d, &parent, &base);
    if (!path_exists(parent))
        die("cannot save checkpoint '%s': parent directory '%s' does not exist: create it first", d, parent);
    int exists = path_exists(d);
    if (exists) check_replaceable(d);
    if (opt && (opt->end > t->total || opt->begin > opt->end))
        die("cannot save checkpoint '%s': optimizer range [%zu, %zu) lies outside the %zu parameters", d, opt->begin,
            opt->end, t->total);

    char *tmp = str_printf("%s.tmp.XXXXXX", d);
    if (!mkdtemp(tmp))
        die("cannot save checkpoint '%s': creating a temporary directory beside it failed: %s (check that '%s' is "
            "writable)", d, strerror(errno), parent);
    mode_t mask = umask(0);
    umask(mask);
    (void)chmod(tmp, 0777 & ~mask); /* mkdtemp makes 0700; not fatal if this fails */

    char *p = str_printf("%s/" F_CONFIG, tmp);
    config_json_save(p, cfg);
    xfree(p);
    p = str_printf("%s/" F_MODEL, tmp);
    params_save_safetensors(p, t, params);
    xfree(p);
    if (opt) {
        size_t n = opt->end - opt->begin;
        StWriteTensor w[2] = {
            { "adamw.m", opt->m, 1, { (int64_t)n, 0, 0, 0 } },
            { "adamw.v", opt->v, 1, { (int64_t)n, 0, 0, 0 } },
        };
        p = str_printf("%s/" F_OPTIM, tmp);
        st_write_f32(p, w, 2, "pt");
        xfree(p);
    }
    json_t *root = state_to_json(st, t, opt);
    p = str_printf("%s/" F_STATE, tmp);
    write_json_atomic(p, root);
    xfree(p);
    json_decref(root);
    fsync_dir(tmp);

    /* Swap the complete temporary directory into place. */
    char *old = NULL;
    if (!exists) {
        if (rename(tmp, d) != 0)
            die("cannot save checkpoint '%s': renaming '%s' into place failed: %s", d, tmp, strerror(errno));
    } else if (!getenv("SEQPAR_CKPT_NO_RENAME_EXCHANGE") && /* test hook: force the fallback */
               renameat2(AT_FDCWD, tmp, AT_FDCWD, d, RENAME_EXCHANGE) == 0) {
        old = tmp; /* now holds the previous checkpoint */
        tmp = NULL;
    } else if (getenv("SEQPAR_CKPT_NO_RENAME_EXCHANGE") || errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
        old = str_printf("%s.old.XXXXXX", d);
        if (!mkdtemp(old))
            die("cannot save checkpoint '%s': creating '%s' failed: %s (the new checkpoint is complete in '%s')", d,
                old, strerror(errno), tmp);
        if (rename(d, old) != 0) /* replaces the empty placeholder directory */
            die("cannot save checkpoint '%s': moving the old one aside failed: %s (the new checkpoint is complete "
                "in '%s')", d, strerror(errno), tmp);
        if (rename(tmp, d) != 0)
            die("cannot save checkpoint '%s': renaming '%s' into place failed: %s (the previous checkpoint is in "
                "'%s': rename it back to '%s')", d, tmp, strerror(errno), old, d);
    } else {
        die("cannot save checkpoint '%s': swapping in the new one failed: %s (the new checkpoint is complete in '%s')",
            d, strerror(errno), tmp);
    }
    fsync_dir(parent);
    if (old) remove_tree(old);
    remove_stale_siblings(parent, base);

    xfree(old);
    xfree(tmp);
    xfree(d);
    xfree(parent);
    xfree(base);
}

/* ---------------------------------------------------------------------------------------------
 * Loading */

int checkpoint_exists(const char *dir) {
    char *d = normalize_dir(dir);
    char *p = str_printf("%s/" F_STATE, d);
    int r = path_exists(p);
    xfree(p);
    xfree(d);
    return r;
}

/* Dies unless d is a directory, pointing at an interrupted save's leftover if there is one. */
static void require_dir(const char *d) {
    struct stat sb;
    if (stat(d, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) die("checkpoint '%s' is not a directory: pass a checkpoint directory", d);
        return;
    }
    char *parent, *base;
    split_dir(d, &parent, &base);
    char *old = find_old_sibling(parent, base);
    if (old)
        die("checkpoint directory '%s' does not exist, but '%s' does (a save was interrupted): rename it to '%s' "
            "to resume from it", d, old, d);
    die("checkpoint directory '%s' does not exist: check the path", d);
}

static char *require_file(const char *d, const char *name) {
    char *p = str_printf("%s/%s", d, name);
    if (!path_exists(p))
        die("checkpoint '%s' is incomplete: %s is missing (resume from a complete checkpoint written by seqpar)", d,
            name);
    return p;
}

void checkpoint_load_config(const char *dir, LlamaConfig *cfg) {
    char *d = normalize_dir(dir);
    require_dir(d);
    char *p = require_file(d, F_CONFIG);
    config_json_load(p, cfg);
    xfree(p);
    xfree(d);
}

static void bad_field(const char *path, const char *key, const char *what) __attribute__((noreturn));
static void bad_field(const char *path, const char *key, const char *what) {
    die("%s: field \"%s\" is missing or not %s (the file is damaged: resume from another checkpoint)", path, key, what);
}

static json_int_t get_int(const char *path, json_t *obj, const char *key, json_int_t min) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) bad_field(path, key, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < min) bad_field(path, key, "a non-negative integer");
    return x;
}

static uint64_t parse_hex(const char *path, const char *key, json_t *v) {
    const char *s = json_string_value(v);
    if (!s || strncmp(s, "0x", 2) != 0 || strlen(s) < 3 || strlen(s) > 18) bad_field(path, key, "a \"0x...\" hex string");
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s + 2, &end, 16);
    if (errno || *end != '\0' || s[2] == '-' || s[2] == '+' || s[2] == ' ') bad_field(path, key, "a \"0x...\" hex string");
    return (uint64_t)x;
}

typedef struct {
    int has_opt;
    long opt_step;
    size_t opt_begin, opt_end;
    size_t param_total;
} StateExtra;

static void read_state(const char *path, TrainerState *st, StateExtra *ex) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        die("%s is not valid JSON (line %d: %s): the file is damaged, resume from another checkpoint", path, err.line,
            err.text);
    if (!json_is_object(root)) die("%s is not a JSON object: the file is damaged, resume from another checkpoint", path);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, STATE_FORMAT) != 0)
        die("%s is not a seqpar trainer state (\"format\" is not \"" STATE_FORMAT "\"): pass a checkpoint written by "
            "seqpar", path);
    json_int_t ver = get_int(path, root, "format_version", 0);
    if (ver != CKPT_FORMAT_VERSION)
        die("%s has format_version %lld but this seqpar reads version %d: resume with the seqpar version that wrote "
            "it", path, (long long)ver, CKPT_FORMAT_VERSION);

    trainer_state_init(st);
    st->step = (long)get_int(path, root, "step", 0);
    ex->param_total = (size_t)get_int(path, root, "param_total", 0);
    st->seed = parse_hex(path, "seed", json_object_get(root, "seed"));
    st->data_cursor = parse_hex(path, "data_cursor", json_object_get(root, "data_cursor"));
    json_t *rng = json_object_get(root, "data_rng");
    if (!json_is_array(rng) || json_array_size(rng) != 4) bad_field(path, "data_rng", "an array of 4 hex strings");
    for (int i = 0; i < 4; i++) st->data_rng.s[i] = parse_hex(path, "data_rng", json_array_get(rng, (size_t)i));
    json_int_t sl = get_int(path, root, "seq_len", 0);
    if (sl > 0x7fffffff) bad_field(path, "seq_len", "an int");
    st->seq_len = (int)sl;

    json_t *o = json_object_get(root, "optimizer");
    if (json_is_null(o)) {
        ex->has_opt = 0;
    } else if (json_is_object(o)) {
        const char *type = json_string_value(json_object_get(o, "type"));
        if (!type || strcmp(type, "adamw") != 0) bad_field(path, "optimizer.type", "\"adamw\"");
        ex->has_opt = 1;
        ex->opt_step = (long)get_int(path, o, "step", 0);
        ex->opt_begin = (size_t)get_int(path, o, "begin", 0);
        ex->opt_end = (size_t)get_int(path, o, "end", 0);
        if (ex->opt_begin > ex->opt_end || ex->opt_end > ex->param_total)
            bad_field(path, "optimizer.begin/end", "a range inside param_total");
    } else {
        bad_field(path, "optimizer", "an object or null");
    }

    json_t *set = json_object_get(root, "settings");
    if (!json_is_object(set)) bad_field(path, "settings", "an object");
    const char *key;
    json_t *val;
    json_object_foreach(set, key, val) {
        if (!json_is_string(val)) bad_field(path, "settings", "an object of strings");
        if (strlen(key) >= sizeof st->settings[0].key || strlen(json_string_value(val)) >= sizeof st->settings[0].value ||
            st->n_settings >= CKPT_MAX_SETTINGS)
            bad_field(path, "settings", "a small object of short strings");
        trainer_state_set(st, key, "%s", json_string_value(val));
    }
    json_decref(root);
}

static void check_config(const char *path, const LlamaConfig *got, const LlamaConfig *want) {
#define CHECK_FIELD(f) \
    if (got->f != want->f) \
        die("%s has " #f " %d but the model was built with %d: build the model from the checkpoint's config", path, \
            got->f, want->f)
    CHECK_FIELD(hidden_size);
    CHECK_FIELD(intermediate_size);
    CHECK_FIELD(num_attention_heads);
    CHECK_FIELD(num_key_value_heads);
    CHECK_FIELD(num_hidden_layers);
    CHECK_FIELD(vocab_size);
    CHECK_FIELD(head_dim);
    CHECK_FIELD(tie_word_embeddings);
#undef CHECK_FIELD
}

/* Checks that `name` in the optimizer file is 1-D with n elements, then reads it. */
static void read_moment(const StFile *f, const char *path, const char *name, size_t n, float *dst) {
    const StTensor *ts = st_find(f, name);
    if (!ts) die("%s has no tensor %s: the file is damaged, resume from another checkpoint", path, name);
    size_t have = 1;
    for (int i = 0; i < ts->ndim; i++) have *= (size_t)ts->shape[i];
    if (ts->ndim != 1 || have != n)
        die("%s: %s has %zu elements but this model's optimizer range has %zu: the checkpoint belongs to a different "
            "model or rank layout", path, name, have, n);
    int64_t shape[1] = { (int64_t)n };
    st_read_f32(f, name, 1, shape, dst);
}

void checkpoint_load(const char *dir, const LlamaConfig *expect, const ParamTable *t, float *params, AdamW *opt,
                     TrainerState *st) {
    char *d = normalize_dir(dir);
    require_dir(d);
    char *cfg_path = require_file(d, F_CONFIG);
    char *model_path = require_file(d, F_MODEL);
    char *state_path = require_file(d, F_STATE);

    StateExtra ex;
    memset(&ex, 0, sizeof ex);
    TrainerState loaded;
    read_state(state_path, &loaded, &ex);

    LlamaConfig cfg;
    config_json_load(cfg_path, &cfg);
    if (expect) check_config(cfg_path, &cfg, expect);
    if (ex.param_total != t->total)
        die("%s records %zu parameters but the model has %zu: build the model from the checkpoint's config.json",
            state_path, ex.param_total, t->total);

    char *optim_path = NULL;
    if (opt) {
        if (!ex.has_opt)
            die("checkpoint '%s' has no optimizer state (saved without one): load only the weights, or resume from "
                "a checkpoint with " F_OPTIM, d);
        if (ex.opt_begin != opt->begin || ex.opt_end != opt->end)
            die("%s: the optimizer state covers [%zu, %zu) of the parameters but this run's optimizer covers "
                "[%zu, %zu): resume with the same number of ranks as the saved run", state_path, ex.opt_begin,
                ex.opt_end, opt->begin, opt->end);
        optim_path = require_file(d, F_OPTIM);
    }

    params_load_safetensors(model_path, t, params, cfg.tie_word_embeddings);
    if (opt) {
        StFile f;
        st_open(optim_path, &f);
        size_t n = opt->end - opt->begin;
        read_moment(&f, optim_path, "adamw.m", n, opt->m);
        read_moment(&f, optim_path, "adamw.v", n, opt->v);
        st_close(&f);
        opt->step = ex.opt_step;
    }
    *st = loaded;

    xfree(optim_path);
    xfree(state_path);
    xfree(model_path);
    xfree(cfg_path);
    xfree(d);
}
