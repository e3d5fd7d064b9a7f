/* Tests for parameter safetensors I/O and training checkpoints: a bit-exact save/load round trip
 * (params, AdamW m/v/step, data RNG, cursor, seed, settings), overwriting a checkpoint atomically
 * (no temporary directories left, stale ones cleaned), one-line deaths with a non-zero status for
 * damaged or mismatched checkpoints (run in forked children, stderr captured through a pipe),
 * tied-embedding loads that ignore lm_head, and loading a hand-written BF16 file. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "core/param_table.h"
#include "io/checkpoint.h"
#include "io/param_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "optim/adamw.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
/* A child that dies leaves its allocations behind, and its leak check sees the parent's OpenMP
 * threads as unsuspended: send sanitizer reports from the child to /dev/null so that stderr holds
 * only the die() line. A real memory error still fails the test (the expected line is missing). */
static void quiet_sanitizer(int devnull) { __sanitizer_set_report_fd((void *)(intptr_t)devnull); }
#else
static void quiet_sanitizer(int devnull) { (void)devnull; }
#endif

static char g_root[256];

/* ---- fixtures ------------------------------------------------------------------------------ */

static void set_tensor(ParamTensor *p, const char *name, int64_t r, int64_t c, size_t off, int no_decay) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = c ? 2 : 1;
    p->shape[0] = r;
    p->shape[1] = c;
    p->numel = (size_t)(c ? r * c : r);
    p->offset = off;
    p->no_decay = no_decay;
}

/* embed [6,4], up_proj [3,4], norm [4] (= 40 elements); with lm_head [6,4] when untied (64). */
static ParamTensor g_tied_t[3], g_untied_t[4];
static ParamTable tied_table(void) {
    set_tensor(&g_tied_t[0], "model.embed_tokens.weight", 6, 4, 0, 1);
    set_tensor(&g_tied_t[1], "model.layers.0.mlp.up_proj.weight", 3, 4, 24, 0);
    set_tensor(&g_tied_t[2], "model.norm.weight", 4, 0, 36, 1);
    ParamTable t = { g_tied_t, 3, 40 };
    return t;
}
static ParamTable untied_table(void) {
    ParamTable tt = tied_table();
    memcpy(g_untied_t, tt.t, sizeof g_tied_t);
    set_tensor(&g_untied_t[3], "lm_head.weight", 6, 4, 40, 0);
    ParamTable t = { g_untied_t, 4, 64 };
    return t;
}

static LlamaConfig small_config(int tie) {
    LlamaConfig c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 4; c.intermediate_size = 3; c.num_attention_heads = 2; c.num_key_value_heads = 1;
    c.num_hidden_layers = 1; c.vocab_size = 6; c.head_dim = 2; c.max_position_embeddings = 64;
    c.tie_word_embeddings = tie; c.rms_norm_eps = 1e-5f; c.rope_theta = 10000.0;
    return c;
}

static void fill_params(float *p, size_t n, uint64_t seed) {
    Rng r; rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) p[i] = (float)rng_normal(&r);
    /* values whose bits must survive: signed zero, subnormals, extremes */
    if (n > 8) {
        uint32_t bits[] = { 0x80000000u, 0x00000001u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f800001u };
        for (size_t k = 0; k < ARRAY_LEN(bits); k++) memcpy(&p[k + 1], &bits[k], 4);
    }
}

static TrainerState make_state(long step) {
    TrainerState st;
    trainer_state_init(&st);
    st.step = step;
    rng_seed(&st.data_rng, 42);
    for (int i = 0; i < 5; i++) rng_u64(&st.data_rng);
    st.data_cursor = 0xFFFFFFFFFFFFFFF1ull; /* above 2^53: would lose bits as a JSON double */
    st.seed = 0x8000000000000001ull;
    st.seq_len = 4096;
    trainer_state_set(&st, "lr", "%a", 3e-4);
    trainer_state_set(&st, "world_size", "%d", 4);
    return st;
}

/* An optimizer with non-trivial moments after a few updates. */
static void make_opt(AdamW *opt, const ParamTable *t, float *params, size_t begin, size_t end) {
    AdamWConfig cfg; adamw_config_default(&cfg);
    adamw_init(opt, &cfg, begin, end);
    float *g = xmalloc(t->total * sizeof(float));
    Rng r; rng_seed(&r, 5);
    for (int s = 0; s < 3; s++) {
        for (size_t i = 0; i < t->total; i++) g[i] = (float)rng_normal(&r);
        adamw_update(opt, t, params, g, 1e-3f, 0.7f);
    }
    xfree(g);
}

static char *path_in(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_root, name);
    return buf[k];
}

static int exists(const char *p) { struct stat sb; return stat(p, &sb) == 0; }

/* Number of entries of g_root whose names start with prefix. */
static int count_prefix(const char *prefix) {
    DIR *d = opendir(g_root);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

/* ---- death helper -------------------------------------------------------------------------- */

typedef void (*DeathFn)(void *arg);

/* Runs fn in a child with stderr captured; checks a non-zero exit, exactly one line of stderr and
 * that every NULL-terminated word occurs in it. */
static void expect_death(const char *what, DeathFn fn, void *arg, ...) {
    int pfd[2];
    if (pipe(pfd) != 0) { perror("pipe"); exit(2); }
    fflush(stdout); fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) { dup2(devnull, 1); quiet_sanitizer(devnull); }
        alarm(30);
        fn(arg);
        _exit(0);
    }
    close(pfd[1]);
    char buf[8192];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pfd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    buf[len] = '\0';
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (getenv("TEST_VERBOSE")) printf("[%s] exit %d: %s", what, code, buf);
    CHECK(code != 0, "%s: expected a non-zero exit, got 0 (stderr: %s)", what, buf);
    CHECK(WIFEXITED(status), "%s: child did not exit normally (signal %d)", what, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    CHECK(lines == 1 && len > 0 && buf[len - 1] == '\n', "%s: expected one line of stderr, got %d: %s", what, lines, buf);
    va_list ap;
    va_start(ap, arg);
    const char *w;
    while ((w = va_arg(ap, const char *)) != NULL)
        CHECK(strstr(buf, w) != NULL, "%s: stderr lacks '%s': %s", what, w, buf);
    va_end(ap);
}

/* checkpoint_save / the safetensors writers, ending the (test or child) process with the message
 * on failure as the CLI does: the calls that must succeed, and the children expect_death runs. */
static void save_or_die(const char *dir, const LlamaConfig *cfg, const ParamTable *t, const float *p, const AdamW *opt,
                        const TrainerState *st) {
    SeqErr e;
    if (checkpoint_save(dir, cfg, t, p, opt, st, &e) != 0) die("%s", e.msg);
}

static void params_save_or_die(const char *path, const ParamTable *t, const float *p) {
    SeqErr e;
    if (params_save_safetensors(path, t, p, &e) != 0) die("%s", e.msg);
}

/* ---- round trip ---------------------------------------------------------------------------- */

static void test_round_trip(void) {
    ParamTable t = untied_table();
    LlamaConfig cfg = small_config(0);
    float *p = xmalloc(t.total * sizeof(float));
    fill_params(p, t.total, 1);
    AdamW opt;
    make_opt(&opt, &t, p, 0, t.total);
    TrainerState st = make_state(123);
    const char *dir = path_in("ck");
    save_or_die(dir, &cfg, &t, p, &opt, &st);
    CHECK(checkpoint_exists(dir), "checkpoint_exists after save");
    CHECK(!checkpoint_exists(path_in("nothing")), "checkpoint_exists on a missing dir");
    CHECK(exists(path_in("ck/config.json")) && exists(path_in("ck/model.safetensors")) &&
          exists(path_in("ck/optimizer.safetensors")) && exists(path_in("ck/trainer_state.json")),
          "checkpoint files missing");
    CHECK(count_prefix("ck.") == 0, "temporary directories left after the first save");

    LlamaConfig c2;
    checkpoint_load_config(dir, &c2);
    CHECK(c2.hidden_size == cfg.hidden_size && c2.num_key_value_heads == cfg.num_key_value_heads &&
          c2.vocab_size == cfg.vocab_size && c2.tie_word_embeddings == 0 && c2.head_dim == cfg.head_dim,
          "config round trip");

    float *p2 = xcalloc(t.total, sizeof(float));
    AdamWConfig ac; adamw_config_default(&ac);
    AdamW opt2; adamw_init(&opt2, &ac, 0, t.total);
    TrainerState st2;
    checkpoint_load(dir, &cfg, &t, p2, &opt2, &st2);
    CHECK(memcmp(p, p2, t.total * sizeof(float)) == 0, "params not bit-identical after load");
    CHECK(memcmp(opt.m, opt2.m, t.total * sizeof(float)) == 0, "adam m not bit-identical after load");
    CHECK(memcmp(opt.v, opt2.v, t.total * sizeof(float)) == 0, "adam v not bit-identical after load");
    CHECK(opt2.step == 3, "optimizer step %ld, expected 3", opt2.step);
    CHECK(st2.step == 123, "trainer step %ld", st2.step);
    CHECK(memcmp(&st.data_rng, &st2.data_rng, sizeof(Rng)) == 0, "data RNG state differs");
    CHECK(st2.data_cursor == st.data_cursor, "cursor %llx", (unsigned long long)st2.data_cursor);
    CHECK(st2.seed == st.seed, "seed %llx", (unsigned long long)st2.seed);
    CHECK(st2.seq_len == 4096, "seq_len %d", st2.seq_len);
    const char *lr = trainer_state_get(&st2, "lr");
    CHECK(lr && strtod(lr, NULL) == 3e-4, "setting lr = %s", lr ? lr : "(null)");
    CHECK(trainer_state_get(&st2, "world_size") && strcmp(trainer_state_get(&st2, "world_size"), "4") == 0,
          "setting world_size");
    Rng a = st.data_rng, b = st2.data_rng;
    CHECK(rng_u64(&a) == rng_u64(&b), "restored RNG continues the same stream");

    /* a range (ZeRO-style shard) optimizer round-trips too */
    AdamW shard;
    make_opt(&shard, &t, p, 10, 50);
    save_or_die(path_in("ck_shard"), &cfg, &t, p, &shard, &st);
    AdamW shard2; adamw_init(&shard2, &ac, 10, 50);
    checkpoint_load(path_in("ck_shard"), NULL, &t, p2, &shard2, &st2);
    CHECK(memcmp(shard.m, shard2.m, 40 * sizeof(float)) == 0 && memcmp(shard.v, shard2.v, 40 * sizeof(float)) == 0,
          "shard m/v not bit-identical");

    /* saved without an optimizer: loads with opt == NULL */
    save_or_die(path_in("ck_noopt"), &cfg, &t, p, NULL, &st);
    CHECK(!exists(path_in("ck_noopt/optimizer.safetensors")), "optimizer file written without an optimizer");
    memset(p2, 0, t.total * sizeof(float));
    checkpoint_load(path_in("ck_noopt"), &cfg, &t, p2, NULL, &st2);
    CHECK(memcmp(p, p2, t.total * sizeof(float)) == 0, "params (no optimizer) not bit-identical");

    adamw_free(&opt); adamw_free(&opt2); adamw_free(&shard); adamw_free(&shard2);
    xfree(p); xfree(p2);
}

/* ---- overwrite ----------------------------------------------------------------------------- */

static void test_overwrite(void) {
    ParamTable t = untied_table();
    LlamaConfig cfg = small_config(0);
    float *p = xmalloc(t.total * sizeof(float)), *q = xmalloc(t.total * sizeof(float));
    fill_params(p, t.total, 11);
    fill_params(q, t.total, 22);
    AdamW opt; make_opt(&opt, &t, p, 0, t.total);
    TrainerState st = make_state(10);
    const char *dir = path_in("ow");
    save_or_die(dir, &cfg, &t, p, &opt, &st);
    /* leftovers of an interrupted earlier save */
    mkdir(path_in("ow.tmp.AbC123"), 0755);
    FILE *f = fopen(path_in("ow.tmp.AbC123/model.safetensors"), "w"); fputs("partial", f); fclose(f);
    mkdir(path_in("ow.old.XyZ789"), 0755);
    mkdir(path_in("ow.other"), 0755); /* not ours: must survive */

    opt.step = 77;
    st.step = 20;
    save_or_die(dir, &cfg, &t, q, &opt, &st);
    /* only what this save created is removed: the earlier leftovers are not ours to delete */
    CHECK(count_prefix("ow.tmp.") == 1 && count_prefix("ow.old.") == 1, "a save removed or left temporaries: %d tmp, %d old",
          count_prefix("ow.tmp."), count_prefix("ow.old."));
    CHECK(exists(path_in("ow.tmp.AbC123/model.safetensors")) && exists(path_in("ow.old.XyZ789")),
          "a save removed DIR.tmp.* / DIR.old.* siblings it did not create");
    CHECK(exists(path_in("ow.other")), "an unrelated sibling directory was removed");

    float *r = xcalloc(t.total, sizeof(float));
    AdamWConfig ac; adamw_config_default(&ac);
    AdamW o2; adamw_init(&o2, &ac, 0, t.total);
    TrainerState s2;
    checkpoint_load(dir, &cfg, &t, r, &o2, &s2);
    CHECK(memcmp(r, q, t.total * sizeof(float)) == 0, "overwritten checkpoint does not hold the new params");
    CHECK(s2.step == 20 && o2.step == 77, "overwritten checkpoint step %ld / optimizer step %ld", s2.step, o2.step);

    /* saving through a trailing slash works the same */
    char slash[600];
    snprintf(slash, sizeof slash, "%s/", dir);
    save_or_die(slash, &cfg, &t, p, &opt, &st);
    checkpoint_load(slash, &cfg, &t, r, &o2, &s2);
    CHECK(memcmp(r, p, t.total * sizeof(float)) == 0, "save via trailing slash");
    CHECK(count_prefix("ow.tmp.") == 1 && count_prefix("ow.old.") == 1, "temporary directories left (trailing slash)");

    /* the two-rename fallback used where RENAME_EXCHANGE is unsupported */
    setenv("SEQPAR_CKPT_NO_RENAME_EXCHANGE", "1", 1);
    st.step = 30;
    save_or_die(dir, &cfg, &t, q, &opt, &st);
    unsetenv("SEQPAR_CKPT_NO_RENAME_EXCHANGE");
    checkpoint_load(dir, &cfg, &t, r, &o2, &s2);
    CHECK(memcmp(r, q, t.total * sizeof(float)) == 0 && s2.step == 30, "fallback swap did not install the new checkpoint");
    CHECK(count_prefix("ow.tmp.") == 1 && count_prefix("ow.old.") == 1, "temporary directories left (fallback swap)");

    adamw_free(&opt); adamw_free(&o2);
    xfree(p); xfree(q); xfree(r);
}

/* ---- deaths -------------------------------------------------------------------------------- */

typedef struct {
    const char *dir;
    int tie;
    size_t opt_begin, opt_end;
    int with_opt;
    int untied_table;
} LoadArgs;

static void do_load(void *arg) {
    LoadArgs *a = arg;
    ParamTable t = a->untied_table ? untied_table() : tied_table();
    LlamaConfig cfg = small_config(a->tie);
    float *p = xcalloc(t.total, sizeof(float));
    AdamWConfig ac; adamw_config_default(&ac);
    AdamW opt; adamw_init(&opt, &ac, a->opt_begin, a->opt_end ? a->opt_end : t.total);
    TrainerState st;
    checkpoint_load(a->dir, &cfg, &t, p, a->with_opt ? &opt : NULL, &st);
}

static void save_basic(const char *dir) {
    ParamTable t = untied_table();
    LlamaConfig cfg = small_config(0);
    float *p = xmalloc(t.total * sizeof(float));
    fill_params(p, t.total, 3);
    AdamW opt; make_opt(&opt, &t, p, 0, t.total);
    TrainerState st = make_state(5);
    save_or_die(dir, &cfg, &t, p, &opt, &st);
    adamw_free(&opt);
    xfree(p);
}

/* save_basic with the optimizer state of [begin, end) only */
static void save_partial(const char *dir, size_t begin, size_t end) {
    ParamTable t = untied_table();
    LlamaConfig cfg = small_config(0);
    float *p = xmalloc(t.total * sizeof(float));
    fill_params(p, t.total, 3);
    AdamW opt; make_opt(&opt, &t, p, begin, end);
    TrainerState st = make_state(5);
    save_or_die(dir, &cfg, &t, p, &opt, &st);
    adamw_free(&opt);
    xfree(p);
}

/* A rank's shard of the moments out of a whole-range save: exactly the saved elements of its
 * range (each rank reads only its own since 2026-11-29), at every split of the 64 parameters. */
static void test_shard_read(void) {
    ParamTable t = untied_table();
    LlamaConfig cfg = small_config(0);
    const char *dir = path_in("d_shard");
    save_basic(dir);
    float *p = xmalloc(t.total * sizeof(float));
    fill_params(p, t.total, 3);
    AdamW whole; make_opt(&whole, &t, p, 0, t.total); /* what save_basic saved */
    const size_t cuts[][2] = {{0, 64}, {8, 40}, {0, 1}, {63, 64}, {21, 43}, {32, 32}};
    for (size_t c = 0; c < ARRAY_LEN(cuts); c++) {
        AdamWConfig ac; adamw_config_default(&ac);
        AdamW opt; adamw_init(&opt, &ac, cuts[c][0], cuts[c][1]);
        float *q = xcalloc(t.total, sizeof(float));
        TrainerState st;
        SeqErr e;
        const int rc = checkpoint_read(dir, &cfg, &t, q, &opt, &st, &e);
        const size_t n = cuts[c][1] - cuts[c][0];
        CHECK(rc == 0, "shard [%zu, %zu) of the moments: %s", cuts[c][0], cuts[c][1], rc ? e.msg : "");
        if (rc == 0) {
            CHECK(!memcmp(opt.m, whole.m + cuts[c][0], n * sizeof(float)) &&
                  !memcmp(opt.v, whole.v + cuts[c][0], n * sizeof(float)),
                  "shard [%zu, %zu): the moments differ from the saved ones there", cuts[c][0], cuts[c][1]);
            CHECK(opt.step == whole.step, "shard [%zu, %zu): step %ld, saved %ld", cuts[c][0], cuts[c][1],
                  (long)opt.step, (long)whole.step);
            CHECK(!memcmp(q, p, t.total * sizeof(float)), "shard [%zu, %zu): the weights differ", cuts[c][0], cuts[c][1]);
        }
        adamw_free(&opt);
        xfree(q);
    }
    adamw_free(&whole);
    xfree(p);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void truncate_half(const char *path) {
    struct stat sb;
    stat(path, &sb);
    if (truncate(path, sb.st_size / 2) != 0) perror("truncate");
}

static void do_save_into(void *arg) {
    ParamTable t = untied_table();
    LlamaConfig cfg = small_config(0);
    float *p = xcalloc(t.total, sizeof(float));
    TrainerState st = make_state(1);
    save_or_die((const char *)arg, &cfg, &t, p, NULL, &st);
    xfree(p);
}

static void do_state_check(void *arg) {
    (void)arg;
    TrainerState a = make_state(1), b = make_state(1);
    trainer_state_set(&b, "lr", "%a", 1e-3);
    trainer_state_check(&a, &b, "ckpt");
}

/* a setting that is no single flag's value (betas: two flags) */
static void do_state_check_betas(void *arg) {
    (void)arg;
    TrainerState a = make_state(1), b = make_state(1);
    trainer_state_set(&a, "betas", "%a,%a", 0.9, 0.95);
    trainer_state_set(&b, "betas", "%a,%a", 0.8, 0.95);
    trainer_state_check(&a, &b, "ckpt");
}

/* Flips one bit of byte `at` (counted from the end when negative) of a file. */
static void flip_bit(const char *path, long at, int bit) {
    FILE *f = fopen(path, "r+b");
    if (!f) { perror(path); exit(2); }
    fseek(f, at, at < 0 ? SEEK_END : SEEK_SET);
    long pos = ftell(f);
    int c = fgetc(f);
    fseek(f, pos, SEEK_SET);
    fputc(c ^ (1 << bit), f);
    fclose(f);
}

/* Replaces the first occurrence of `from` in a text file by `to`. */
static void edit_text(const char *path, const char *from, const char *to) {
    char buf[65536];
    FILE *f = fopen(path, "rb");
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, from);
    CHECK(at != NULL, "'%s' not found in %s", from, path);
    if (!at) return;
    char out[70000];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    write_text(path, out);
}

/* A save whose writes fail part-way (RLIMIT_FSIZE stands for a full disk: writes past 300 bytes fail
 * with EFBIG) must end with one line and leave no DIR.tmp.XXXXXX behind. */
static void do_save_small_disk(void *arg) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = { 300, 300 };
    setrlimit(RLIMIT_FSIZE, &rl);
    ParamTable t = untied_table(); /* no optimizer steps here: OpenMP does not survive fork() */
    LlamaConfig cfg = small_config(0);
    float *p = xmalloc(t.total * sizeof(float));
    fill_params(p, t.total, 3);
    AdamWConfig ac; adamw_config_default(&ac);
    AdamW opt; adamw_init(&opt, &ac, 0, t.total);
    TrainerState st = make_state(5);
    save_or_die((const char *)arg, &cfg, &t, p, &opt, &st);
}

typedef struct { const char *dir; } TargetArg;
static void do_check_target(void *arg) {
    SeqErr e;
    if (checkpoint_check_target(((TargetArg *)arg)->dir, &e) != 0) die("%s", e.msg);
}

static void test_verification(void) {
    LoadArgs a = { NULL, 0, 0, 0, 1, 1 };
    /* a bit flip in any file is one line naming that file */
    save_basic(path_in("v_model"));
    flip_bit(path_in("v_model/model.safetensors"), -7, 3); /* inside a weight */
    a.dir = path_in("v_model");
    expect_death("bit flip in model.safetensors", do_load, &a, "model.safetensors", "CRC-32", "damaged", NULL);
    save_basic(path_in("v_opt"));
    flip_bit(path_in("v_opt/optimizer.safetensors"), -1, 0);
    a.dir = path_in("v_opt");
    expect_death("bit flip in optimizer.safetensors", do_load, &a, "optimizer.safetensors", "CRC-32", NULL);
    save_basic(path_in("v_cfg"));
    edit_text(path_in("v_cfg/config.json"), "\"rope_theta\": 10000", "\"rope_theta\": 10001");
    a.dir = path_in("v_cfg");
    expect_death("edited config.json", do_load, &a, "config.json", "damaged", NULL);
    save_basic(path_in("v_state"));
    edit_text(path_in("v_state/trainer_state.json"), "\"step\": 5", "\"step\": 7");
    a.dir = path_in("v_state");
    expect_death("edited trainer_state.json", do_load, &a, "trainer_state.json", "damaged", NULL);
    save_basic(path_in("v_cursor")); /* a bit flip inside a hex value */
    edit_text(path_in("v_cursor/trainer_state.json"), "\"data_cursor\": \"0x", "\"data_cursor\": \"0xf");
    a.dir = path_in("v_cursor");
    expect_death("flipped data_cursor", do_load, &a, "trainer_state.json", "damaged", NULL);

    /* a failed save removes its own temporary, and only that */
    mkdir(path_in("full.tmp.Zz9Zz9"), 0755); /* someone else's */
    expect_death("save on a full disk", do_save_small_disk, path_in("full"), "full", "File too large", NULL);
    CHECK(count_prefix("full.tmp.") == 1 && exists(path_in("full.tmp.Zz9Zz9")),
          "a failed save left its temporary directory (or removed another): %d full.tmp.*", count_prefix("full.tmp."));
    CHECK(!exists(path_in("full")), "a failed save created the checkpoint directory");

    /* ... and returns its error to the caller, which lives on: the checkpoint it would have
     * replaced is untouched and still loads (the same process, the file size limit lowered for
     * the save only) */
    {
        save_basic(path_in("keep"));
        ParamTable t = untied_table();
        float *before = xcalloc(t.total, sizeof(float));
        TrainerState back;
        SeqErr le;
        CHECK(checkpoint_read(path_in("keep"), NULL, &t, before, NULL, &back, &le) == 0, "a fresh checkpoint: %s",
              le.msg);
        LlamaConfig cfg = small_config(0);
        float *p = xmalloc(t.total * sizeof(float));
        fill_params(p, t.total, 4);
        TrainerState st = make_state(6);
        struct rlimit old;
        getrlimit(RLIMIT_FSIZE, &old);
        struct rlimit low = { 300, old.rlim_max };
        void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &low);
        SeqErr e = { "" };
        const int rc = checkpoint_save(path_in("keep"), &cfg, &t, p, NULL, &st, &e);
        setrlimit(RLIMIT_FSIZE, &old);
        signal(SIGXFSZ, prev);
        CHECK(rc == -1 && strstr(e.msg, "File too large") && strstr(e.msg, "keep") && !strchr(e.msg, '\n'),
              "a save on a full disk returned %d with '%s'", rc, e.msg);
        CHECK(count_prefix("keep.") == 0, "a failed save left %d keep.* beside the checkpoint", count_prefix("keep."));
        float *q = xcalloc(t.total, sizeof(float));
        CHECK(checkpoint_read(path_in("keep"), NULL, &t, q, NULL, &back, &le) == 0, "the kept checkpoint: %s", le.msg);
        CHECK(memcmp(q, before, t.total * sizeof(float)) == 0 && back.step == 5,
              "the checkpoint a failed save would have replaced changed (step %ld)", back.step);
        xfree(p); xfree(q); xfree(before);
    }

    /* unusable --save targets are found before any training */
    TargetArg ta = { path_in("v_model/model.safetensors") };
    expect_death("save target is a file", do_check_target, &ta, "not a directory", NULL);
    mkdir(path_in("hf_model"), 0755);
    write_text(path_in("hf_model/config.json"), "{}");
    write_text(path_in("hf_model/model.safetensors"), "x");
    write_text(path_in("hf_model/tokenizer.json"), "{}");
    ta.dir = path_in("hf_model");
    expect_death("save target is a model directory", do_check_target, &ta, "refusing", "not a seqpar checkpoint", NULL);
    ta.dir = path_in("no/such/parent/ck");
    expect_death("save target without parent", do_check_target, &ta, "does not exist", NULL);
    ta.dir = "/proc/seqpar_ck";
    expect_death("save target not writable", do_check_target, &ta, "/proc", "failed", NULL);
    if (geteuid() == 0) { /* only root can give a directory away */
        mkdir(path_in("theirs"), 0755);
        if (chown(path_in("theirs"), 4242, 4242) == 0) {
            ta.dir = path_in("theirs");
            expect_death("save target of another user", do_check_target, &ta, "another user", NULL);
        }
    }
    SeqErr e;
    CHECK(checkpoint_check_target(path_in("v_model"), &e) == 0, "an existing checkpoint is a fine target");
    CHECK(checkpoint_check_target(path_in("brand_new"), &e) == 0 && !exists(path_in("brand_new")),
          "a new target is fine and the check leaves nothing behind");
    CHECK(count_prefix("brand_new") == 0, "the writability probe left a directory");
}

static void test_deaths(void) {
    LoadArgs a = { NULL, 0, 0, 0, 1, 1 };

    /* sanity: an intact checkpoint loads in the child without dying */
    save_basic(path_in("d_ok"));
    a.dir = path_in("d_ok");
    {
        pid_t pid = fork();
        if (pid == 0) { do_load(&a); _exit(0); }
        int status; waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "intact checkpoint failed to load in the child");
    }

    save_basic(path_in("d_noopt"));
    unlink(path_in("d_noopt/optimizer.safetensors"));
    a.dir = path_in("d_noopt");
    expect_death("missing optimizer file", do_load, &a, "optimizer.safetensors", "missing", NULL);

    save_basic(path_in("d_nomodel"));
    unlink(path_in("d_nomodel/model.safetensors"));
    a.dir = path_in("d_nomodel");
    expect_death("missing model file", do_load, &a, "model.safetensors", "missing", NULL);

    save_basic(path_in("d_trunc"));
    truncate_half(path_in("d_trunc/model.safetensors"));
    a.dir = path_in("d_trunc");
    expect_death("truncated model file", do_load, &a, "model.safetensors", "truncated", NULL);

    save_basic(path_in("d_trunc_opt"));
    truncate_half(path_in("d_trunc_opt/optimizer.safetensors"));
    a.dir = path_in("d_trunc_opt");
    expect_death("truncated optimizer file", do_load, &a, "optimizer.safetensors", NULL);

    save_basic(path_in("d_json"));
    write_text(path_in("d_json/trainer_state.json"), "{\"format\": \"seqpar-trainer-state\", \"step\": ");
    a.dir = path_in("d_json");
    expect_death("bad JSON", do_load, &a, "trainer_state.json", "not valid JSON", NULL);

    save_basic(path_in("d_ver"));
    write_text(path_in("d_ver/trainer_state.json"),
               "{\"format\": \"seqpar-trainer-state\", \"format_version\": 99, \"step\": 1}\n");
    a.dir = path_in("d_ver");
    expect_death("wrong format version", do_load, &a, "trainer_state.json", "format_version 99", NULL);

    /* a run whose optimizer range lies outside the saved one (a save of a shard, loaded whole) */
    save_partial(path_in("d_part"), 8, 40);
    a.dir = path_in("d_part");
    expect_death("optimizer range mismatch", do_load, &a, "trainer_state.json", "[8, 40)", "ranks", NULL);
    save_basic(path_in("d_range"));

    a.untied_table = 0; /* a 40-element model against the 64-element checkpoint */
    a.dir = path_in("d_range");
    a.tie = 0;
    expect_death("parameter count mismatch", do_load, &a, "64 parameters", "40", NULL);
    a.tie = 1;
    expect_death("config mismatch", do_load, &a, "config.json", "tie_word_embeddings", NULL);
    a.untied_table = 1; a.tie = 0;

    /* optimizer tensor length differs from the recorded range */
    save_basic(path_in("d_len"));
    {
        float z[10] = { 0 };
        StWriteTensor w[2] = { { "adamw.m", z, 1, { 10, 0, 0, 0 }, 0 }, { "adamw.v", z, 1, { 10, 0, 0, 0 }, 0 } };
        SeqErr e;
        CHECK(st_write_f32(path_in("d_len/optimizer.safetensors"), w, 2, "pt", &e) == 0, "st_write_f32: %s", e.msg);
    }
    a.dir = path_in("d_len");
    /* a replaced file no longer matches the size and CRC-32 recorded at save */
    expect_death("optimizer file replaced", do_load, &a, "optimizer.safetensors", "damaged", NULL);

    a.dir = path_in("d_missing");
    expect_death("missing directory", do_load, &a, "d_missing", "does not exist", NULL);

    /* interrupted two-rename save: DIR gone, DIR.old.XXXXXX holds the previous checkpoint */
    save_basic(path_in("d_gone"));
    rename(path_in("d_gone"), path_in("d_gone.old.Q1w2E3"));
    a.dir = path_in("d_gone");
    expect_death("interrupted save", do_load, &a, "d_gone.old.Q1w2E3", "rename", NULL);

    /* refusing to replace an unrelated non-empty directory, which stays intact */
    mkdir(path_in("precious"), 0755);
    write_text(path_in("precious/notes.txt"), "keep me");
    expect_death("replace unrelated dir", do_save_into, path_in("precious"), "refusing", "precious", NULL);
    CHECK(exists(path_in("precious/notes.txt")), "unrelated directory was touched");
    /* an empty existing directory is fine */
    mkdir(path_in("empty_dir"), 0755);
    do_save_into(path_in("empty_dir"));
    CHECK(checkpoint_exists(path_in("empty_dir")), "save into an empty existing directory");

    /* a setting that is one flag's value names the flag and the value that resumes */
    expect_death("settings mismatch", do_state_check, NULL, "lr = ", "but this run uses 0.001: resume with --lr ", NULL);
    expect_death("settings mismatch, no flag", do_state_check_betas, NULL, "betas = 0.9,0.95 but this run uses 0.8,0.95",
                 "resume with the same setting", NULL);
    TrainerState s1 = make_state(1), s2 = make_state(9);
    trainer_state_set(&s2, "new_setting", "x"); /* present only in this run: not a mismatch */
    trainer_state_check(&s1, &s2, "ckpt");
    CHECK(1, "matching settings pass");
}

/* ---- param I/O: tied embeddings, BF16 ------------------------------------------------------- */

typedef struct { const char *path; } PathArg;
static void do_load_untied(void *arg) {
    ParamTable t = untied_table();
    float *p = xcalloc(t.total, sizeof(float));
    params_load_safetensors(((PathArg *)arg)->path, &t, p, 0);
}

static void do_load_tied(void *arg) {
    ParamTable t = tied_table();
    float *p = xcalloc(t.total, sizeof(float));
    params_load_safetensors(((PathArg *)arg)->path, &t, p, 1);
}

static void test_tied(void) {
    ParamTable ut = untied_table(), tt = tied_table();
    float *p = xmalloc(ut.total * sizeof(float));
    fill_params(p, ut.total, 8);
    const char *full = path_in("untied.safetensors");
    for (size_t i = 0; i < 24; i++) p[40 + i] = p[i]; /* lm_head [6,4] at 40 = a copy of embed [6,4] at 0 */
    params_save_or_die(full, &ut, p); /* file has lm_head, equal to the embedding */
    float *q = xcalloc(tt.total, sizeof(float));
    params_load_safetensors(full, &tt, q, 1);
    CHECK(memcmp(p, q, tt.total * sizeof(float)) == 0, "tied load (lm_head copy of the embedding in file) differs");
    /* an lm_head that differs from the embedding would be dropped silently: refused, naming it */
    p[40] += 1.0f;
    params_save_or_die(full, &ut, p);
    PathArg pd = { full };
    expect_death("tied load of a different lm_head", do_load_tied, &pd, "lm_head.weight", "differs", NULL);
    p[40] -= 1.0f;

    /* a tied file (no lm_head) loaded as untied dies naming lm_head.weight */
    const char *tied_file = path_in("tied.safetensors");
    params_save_or_die(tied_file, &tt, p);
    PathArg pa = { tied_file };
    expect_death("untied load of a tied file", do_load_untied, &pa, "lm_head.weight", "tied.safetensors", NULL);

    /* tie flag with a table that has lm_head: lm_head becomes a copy of the embedding */
    float *r = xcalloc(ut.total, sizeof(float));
    params_load_safetensors(tied_file, &ut, r, 1);
    CHECK(memcmp(r, p, 40 * sizeof(float)) == 0 && memcmp(r + 40, p, 24 * sizeof(float)) == 0,
          "tied lm_head not copied from the embedding");
    xfree(p); xfree(q); xfree(r);
}

static void put_bf16(FILE *f, float x) {
    uint32_t b; memcpy(&b, &x, 4);
    uint16_t h = (uint16_t)(b >> 16);
    fwrite(&h, 2, 1, f);
}

static void test_bf16(void) {
    ParamTable t = tied_table();
    float *want = xmalloc(t.total * sizeof(float));
    Rng r; rng_seed(&r, 77);
    for (size_t i = 0; i < t.total; i++) {
        float x = (float)rng_normal(&r);
        uint32_t b; memcpy(&b, &x, 4);
        b &= 0xFFFF0000u; /* exactly representable in BF16 */
        memcpy(&want[i], &b, 4);
    }
    /* tensors in the file in a different order than the table, plus an extra one */
    char header[1024];
    int hl = snprintf(header, sizeof header,
                      "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                      "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[6,4],\"data_offsets\":[8,56]},"
                      "\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[56,80]},"
                      "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[6,4],\"data_offsets\":[80,128]}}");
    while (hl % 8) header[hl++] = ' ';
    const char *path = path_in("bf16.safetensors");
    FILE *f = fopen(path, "wb");
    uint64_t len = (uint64_t)hl;
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, (size_t)hl, f);
    for (size_t i = 36; i < 40; i++) put_bf16(f, want[i]);
    for (size_t i = 0; i < 36; i++) put_bf16(f, want[i]);
    for (size_t i = 0; i < 24; i++) put_bf16(f, want[i]); /* tied: lm_head stored as a copy of the embedding */
    fclose(f);
    float *got = xcalloc(t.total, sizeof(float));
    params_load_safetensors(path, &t, got, 1);
    CHECK(memcmp(got, want, t.total * sizeof(float)) == 0, "BF16 load differs");
    xfree(want); xfree(got);
}

/* ---- main ---------------------------------------------------------------------------------- */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

int main(void) {
    snprintf(g_root, sizeof g_root, "/tmp/seqpar_test_checkpoint.XXXXXX");
    if (!mkdtemp(g_root)) { perror("mkdtemp"); return 2; }
    test_round_trip();
    test_overwrite();
    test_deaths();
    test_shard_read();
    test_verification();
    test_tied();
    test_bf16();
    if (!tl_failed) nftw(g_root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    else fprintf(stderr, "test files kept in %s\n", g_root);
    return test_summary("test_checkpoint");
}
