/* Tests of the file formats and data sources: safetensors (round trip, BF16/F16 decoding, header
 * validation), config.json (load, defaults, save round trip, errors), llm.c token shards and text
 * files, and the associative recall generator's invariants. Error paths end the process through
 * die(), so each is run in a fork()ed child whose stderr is captured and checked to be exactly one
 * line containing the expected words, with exit status 1. Files live in a mkdtemp directory. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "data/recall.h"
#include "data/tokens.h"
#include "io/atomic_file.h"
#include "io/config_json.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* ---------------------------------------------------------------- helpers */

typedef struct {
    char dir[64];
} TempDir;

static void path_in(const TempDir *td, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", td->dir, name);
}

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    if (len && fwrite(data, 1, len, f) != len) { perror(path); exit(2); }
    fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* Reads a whole file into a malloc'd buffer (NUL-terminated); *len gets its size. */
static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    if (n && fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(2); }
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void put_u64_le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Builds a safetensors file from a header JSON string (padded with spaces to a multiple of 8)
 * and a data section. */
static void write_safetensors_raw(const char *path, const char *header, const void *data, size_t data_len) {
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    size_t total = 8 + padded + data_len;
    unsigned char *buf = malloc(total);
    put_u64_le(buf, padded);
    memcpy(buf + 8, header, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    if (data_len) memcpy(buf + 8 + padded, data, data_len);
    write_bytes(path, buf, total);
    free(buf);
}

/* Runs fn(arg) in a child process; checks that it exits with status 1 after printing exactly one
 * line "seqpar: error: ..." that contains every word in `words` (NULL-terminated). */
typedef void (*DeathFn)(const void *arg);

static void expect_death_impl(const char *label, DeathFn fn, const void *arg, const char *const *words) {
    int fds[2];
    if (pipe(fds) != 0) { perror("pipe"); exit(2); }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(2); }
    if (pid == 0) {
#if defined(__SANITIZE_ADDRESS__)
        __lsan_disable(); /* die() exits with live allocations by design; not leaks of the code */
#endif
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        fn(arg);
        _exit(0); /* returning means the error went undetected */
    }
    close(fds[1]);
    char out[8192];
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], out + used, sizeof out - 1 - used)) > 0) used += (size_t)got;
    out[used] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);

    if (getenv("TEST_IO_SHOW_ERRORS")) printf("[%s] %s", label, out); /* to review the wording */
    int exited_1 = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    CHECK(exited_1, "%s: expected exit status 1, got %s %d; stderr: %s", label,
          WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), out);
    size_t newlines = 0;
    for (size_t i = 0; i < used; i++) newlines += out[i] == '\n';
    CHECK(newlines == 1 && used > 0 && out[used - 1] == '\n', "%s: expected one line on stderr, got: %s", label, out);
    CHECK(strncmp(out, "seqpar: error: ", 15) == 0, "%s: message lacks the 'seqpar: error: ' prefix: %s", label, out);
    for (size_t w = 0; words[w]; w++)
        CHECK(strstr(out, words[w]) != NULL, "%s: message lacks \"%s\": %s", label, words[w], out);
}

#define EXPECT_DEATH(label, fn, arg, ...) \
    expect_death_impl(label, fn, arg, (const char *const[]){__VA_ARGS__, NULL})

/* ---------------------------------------------------------------- safetensors */

typedef struct {
    const char *path;
    const char *tensor;
    int ndim;
    int64_t shape[4];
} StReadCall;

static void death_st_open(const void *arg) {
    StFile f;
    st_open((const char *)arg, &f);
}

static void death_st_read(const void *arg) {
    const StReadCall *c = arg;
    StFile f;
    st_open(c->path, &f);
    float *dst = malloc(4096 * sizeof(float));
    st_read_f32(&f, c->tensor, c->ndim, c->shape, dst);
}

static void test_safetensors_round_trip(const TempDir *td) {
    char path[256];
    path_in(td, "model.safetensors", path, sizeof path);
    Rng rng;
    rng_seed(&rng, 7);
    float embed[6 * 5], norm[5], bias3d[2 * 3 * 4];
    for (size_t i = 0; i < ARRAY_LEN(embed); i++) embed[i] = (float)rng_normal(&rng);
    for (size_t i = 0; i < ARRAY_LEN(norm); i++) norm[i] = 1.0f + (float)i;
    for (size_t i = 0; i < ARRAY_LEN(bias3d); i++) bias3d[i] = (float)rng_uniform(&rng) - 0.5f;
    /* Values whose bits must survive exactly: -0, a subnormal, infinity, a quiet NaN. */
    uint32_t special[4] = {0x80000000u, 0x00000001u, 0x7F800000u, 0x7FC00001u};
    memcpy(&norm[1], special, sizeof special);
    StWriteTensor w[] = {
        {"model.embed_tokens.weight", embed, 2, {6, 5}, 0},
        {"model.norm.weight", norm, 1, {5}, 0},
        {"extra.three_d", bias3d, 3, {2, 3, 4}, 0},
        {"empty", NULL, 2, {0, 7}, 0},
    };
    SeqErr we;
    CHECK(st_write_f32(path, w, (int)ARRAY_LEN(w), "pt", &we) == 0, "st_write_f32: %s", we.msg);

    size_t len;
    unsigned char *raw = read_all(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    CHECK(raw[8] == '{', "header does not start with '{'");
    CHECK(len == 8 + hlen + sizeof embed + sizeof norm + sizeof bias3d, "file size %zu inconsistent", len);
    CHECK(strstr((char *)raw + 8, "\"__metadata__\":{\"format\":\"pt\"}") != NULL, "metadata missing");
    /* Tensors in the given order: the embedding's data comes first. */
    CHECK(memcmp(raw + 8 + hlen, embed, sizeof embed) == 0, "first tensor's data is not first");
    free(raw);

    StFile f;
    st_open(path, &f);
    CHECK(f.n_tensors == 4, "expected 4 tensors, got %d", f.n_tensors);
    CHECK(f.n_tensors == 4 && strcmp(f.tensors[0].name, "model.embed_tokens.weight") == 0 &&
              strcmp(f.tensors[3].name, "empty") == 0, "tensor order not kept");
    const StTensor *t = st_find(&f, "extra.three_d");
    CHECK(t && t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 4 && t->dtype == ST_F32,
          "3-d tensor metadata wrong");
    CHECK(st_find(&f, "nope") == NULL, "st_find of a missing name should be NULL");
    float got_embed[30], got_norm[5], got_3d[24];
    st_read_f32(&f, "model.embed_tokens.weight", 2, (int64_t[]){6, 5}, got_embed);
    st_read_f32(&f, "model.norm.weight", 1, (int64_t[]){5}, got_norm);
    st_read_f32(&f, "extra.three_d", 3, (int64_t[]){2, 3, 4}, got_3d);
    st_read_f32(&f, "empty", 2, (int64_t[]){0, 7}, got_3d); /* zero elements: writes nothing */
    CHECK(memcmp(got_embed, embed, sizeof embed) == 0, "embedding not bit-exact");
    CHECK(memcmp(got_norm, norm, sizeof norm) == 0, "norm (with special values) not bit-exact");
    CHECK(memcmp(got_3d, bias3d, sizeof bias3d) == 0, "3-d tensor not bit-exact");
    st_close(&f);

    /* Overwriting is atomic and leaves no temporary files behind. */
    CHECK(st_write_f32(path, w, 1, NULL, &we) == 0, "st_write_f32 (overwrite): %s", we.msg);
    st_open(path, &f);
    CHECK(f.n_tensors == 1, "rewritten file should hold 1 tensor, has %d", f.n_tensors);
    st_close(&f);
    raw = read_all(path, &len);
    CHECK(strstr((char *)raw + 8, "__metadata__") == NULL, "metadata written although NULL was passed");
    free(raw);
}

static void test_safetensors_half_types(const TempDir *td) {
    char path[256];
    path_in(td, "half.safetensors", path, sizeof path);
    /* BF16: 1, -2, 0.5, 3.140625. F16 (7 values, so the F32 tensor after it starts at an odd
     * multiple of 2 bytes): 1, -2, 65504, 2^-24 (subnormal), 1/3 rounded, +inf, -0. */
    uint16_t bf16[4] = {0x3F80, 0xC000, 0x3F00, 0x4049};
    uint16_t f16[7] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3555, 0x7C00, 0x8000};
    float f32[2] = {42.5f, -0.125f};
    unsigned char data[8 + 14 + 8];
    memcpy(data, bf16, 8);
    memcpy(data + 8, f16, 14);
    memcpy(data + 22, f32, 8);
    const char *header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
        "\"b.f16\":{\"dtype\":\"F16\",\"shape\":[7],\"data_offsets\":[8,22]},"
        "\"c.f32\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[22,30]}}";
    write_safetensors_raw(path, header, data, sizeof data);

    StFile f;
    st_open(path, &f);
    CHECK(f.n_tensors == 3, "expected 3 tensors (metadata skipped), got %d", f.n_tensors);
    CHECK(st_find(&f, "a.bf16") && st_find(&f, "a.bf16")->dtype == ST_BF16, "BF16 dtype not recognized");
    CHECK(st_find(&f, "b.f16") && st_find(&f, "b.f16")->dtype == ST_F16, "F16 dtype not recognized");
    float got_bf16[4], got_f16[7], got_f32[2];
    st_read_f32(&f, "a.bf16", 2, (int64_t[]){2, 2}, got_bf16);
    st_read_f32(&f, "b.f16", 1, (int64_t[]){7}, got_f16);
    st_read_f32(&f, "c.f32", 2, (int64_t[]){1, 2}, got_f32);
    float want_bf16[4] = {1.0f, -2.0f, 0.5f, 3.140625f};
    for (int i = 0; i < 4; i++) CHECK(got_bf16[i] == want_bf16[i], "bf16[%d] = %g, want %g", i, got_bf16[i], want_bf16[i]);
    float want_f16[7] = {1.0f, -2.0f, 65504.0f, 0x1.0p-24f, 0.333251953125f, INFINITY, -0.0f};
    for (int i = 0; i < 7; i++) CHECK(got_f16[i] == want_f16[i], "f16[%d] = %g, want %g", i, got_f16[i], want_f16[i]);
    CHECK(signbit(got_f16[6]), "F16 -0 lost its sign");
    CHECK(got_f32[0] == 42.5f && got_f32[1] == -0.125f, "unaligned F32 tensor read wrong");
    st_close(&f);
}

static void test_safetensors_errors(const TempDir *td) {
    char good[256], truncated[256], bad_json[256], bad_len[256], bad_span[256], bad_dtype[256], tiny[256],
        out_of_range[256];
    path_in(td, "good.safetensors", good, sizeof good);
    path_in(td, "truncated.safetensors", truncated, sizeof truncated);
    path_in(td, "bad_json.safetensors", bad_json, sizeof bad_json);
    path_in(td, "bad_len.safetensors", bad_len, sizeof bad_len);
    path_in(td, "bad_span.safetensors", bad_span, sizeof bad_span);
    path_in(td, "bad_dtype.safetensors", bad_dtype, sizeof bad_dtype);
    path_in(td, "tiny.safetensors", tiny, sizeof tiny);
    path_in(td, "out_of_range.safetensors", out_of_range, sizeof out_of_range);

    float values[12] = {0};
    StWriteTensor w[] = {{"w", values, 2, {3, 4}, 0}};
    SeqErr we;
    CHECK(st_write_f32(good, w, 1, "pt", &we) == 0, "st_write_f32: %s", we.msg);
    /* a bad tensor description and an unwritable path are errors returned, not exits */
    StWriteTensor twice[] = {{"w", values, 2, {3, 4}, 0}, {"w", values, 1, {12}, 0}};
    CHECK(st_write_f32(good, twice, 2, "pt", &we) == -1 && strstr(we.msg, "appears twice"),
          "a repeated tensor name: '%s'", we.msg);
    CHECK(st_write_f32("/nonexistent-seqpar-dir/x.safetensors", w, 1, "pt", &we) == -1 &&
              strstr(we.msg, "/nonexistent-seqpar-dir") && strstr(we.msg, "writable"),
          "a file in a missing directory: '%s'", we.msg);
    size_t len;
    unsigned char *raw = read_all(good, &len);
    write_bytes(truncated, raw, len - 5); /* data section cut short */
    put_u64_le(raw, 1u << 20);            /* header length far beyond the file */
    write_bytes(bad_len, raw, len);
    free(raw);
    float data[12] = {0};
    write_safetensors_raw(bad_json, "{\"w\": {\"dtype\": \"F32\",, }", data, sizeof data);
    write_safetensors_raw(bad_span, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,40]}}", data,
                          sizeof data);
    write_safetensors_raw(bad_dtype, "{\"w\":{\"dtype\":\"I64\",\"shape\":[6],\"data_offsets\":[0,48]}}", data,
                          sizeof data);
    write_safetensors_raw(out_of_range, "{\"w\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}}",
                          data, sizeof data);
    write_bytes(tiny, "abc", 3);

    char missing[256];
    path_in(td, "does_not_exist.safetensors", missing, sizeof missing);
    EXPECT_DEATH("safetensors missing file", death_st_open, missing, "does_not_exist.safetensors", "No such file");
    EXPECT_DEATH("safetensors truncated", death_st_open, truncated, "truncated.safetensors", "truncated", "48");
    EXPECT_DEATH("safetensors header length", death_st_open, bad_len, "bad_len.safetensors", "header length",
                 "1048576");
    EXPECT_DEATH("safetensors bad header json", death_st_open, bad_json, "bad_json.safetensors", "header",
                 "column");
    EXPECT_DEATH("safetensors span mismatch", death_st_open, bad_span, "bad_span.safetensors", "'w'", "40", "48");
    EXPECT_DEATH("safetensors unsupported dtype", death_st_open, bad_dtype, "bad_dtype.safetensors", "'w'", "I64",
                 "BF16");
    EXPECT_DEATH("safetensors offsets past data", death_st_open, out_of_range, "out_of_range.safetensors",
                 "data_offsets", "48 bytes");
    EXPECT_DEATH("safetensors too small", death_st_open, tiny, "tiny.safetensors", "3 bytes");

    /* the tensors must tile the data section: no overlap, no hole, nothing after the last one
     * (all accepted before: overlapping tensors aliased each other's bytes) */
    char overlap[256], hole[256], trailing[256];
    path_in(td, "overlap.safetensors", overlap, sizeof overlap);
    path_in(td, "hole.safetensors", hole, sizeof hole);
    path_in(td, "trailing.safetensors", trailing, sizeof trailing);
    write_safetensors_raw(overlap, "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", data, 32);
    write_safetensors_raw(hole, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[32,48]}}", data, 48);
    write_safetensors_raw(trailing, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 20);
    EXPECT_DEATH("safetensors overlapping tensors", death_st_open, overlap, "overlap.safetensors", "'a'", "'b'", "overlap");
    EXPECT_DEATH("safetensors hole between tensors", death_st_open, hole, "hole.safetensors", "[16, 32)", "no tensor");
    EXPECT_DEATH("safetensors trailing bytes", death_st_open, trailing, "trailing.safetensors", "4 trailing bytes");

    StReadCall missing_tensor = {good, "lm_head.weight", 2, {3, 4}};
    EXPECT_DEATH("safetensors tensor missing", death_st_read, &missing_tensor, "lm_head.weight", "missing",
                 "good.safetensors");
    StReadCall wrong_shape = {good, "w", 2, {4, 3}};
    EXPECT_DEATH("safetensors wrong shape", death_st_read, &wrong_shape, "'w'", "good.safetensors", "[3, 4]",
                 "expected [4, 3]");
    StReadCall wrong_rank = {good, "w", 1, {12}};
    EXPECT_DEATH("safetensors wrong rank", death_st_read, &wrong_rank, "[3, 4]", "expected [12]");
}

/* ---------------------------------------------------------------- config.json */

static void death_config_load(const void *arg) {
    LlamaConfig c;
    config_json_load((const char *)arg, &c);
}

static void death_config_validate(const void *arg) {
    llama_config_validate((const LlamaConfig *)arg, "size flags");
}

/* One case of a config table: parses json into *c; checks that it was read (want_ok) or refused
 * with a message holding `word`. Returns whether it was read (the caller checks what). */
static int config_case_read(const char *label, size_t i, const char *json, int want_ok, const char *word,
                            LlamaConfig *c) {
    SeqErr e;
    const int ok = config_json_parse(json, strlen(json), label, c, &e) == 0;
    CHECK(ok == want_ok, "%s %zu: %s", label, i, ok ? "read, should be refused" : e.msg);
    if (!ok) CHECK(strstr(e.msg, word) != NULL, "%s %zu: '%s' lacks '%s'", label, i, e.msg, word);
    return ok;
}

/* Saves c at path and returns the file's JSON (NULL if unreadable; the caller decrefs it). */
static json_t *config_case_save(const LlamaConfig *c, const char *path) {
    SeqErr e;
    CHECK(config_json_save(path, c, &e) == 0, "config_json_save: %s", e.msg);
    json_error_t jerr;
    return json_load_file(path, 0, &jerr);
}

/* The config saved at path reads back as c, field for field. */
static void config_case_reloads(const char *label, size_t i, const LlamaConfig *c, const char *path) {
    LlamaConfig back;
    config_json_load(path, &back);
    CHECK(memcmp(c, &back, sizeof back) == 0, "%s %zu: save/load round trip changed values", label, i);
}

static void test_config(const TempDir *td) {
    char full[256], minimal[256], saved[256];
    path_in(td, "full_config.json", full, sizeof full);
    path_in(td, "minimal_config.json", minimal, sizeof minimal);
    path_in(td, "saved_config.json", saved, sizeof saved);
    write_text(full,
               "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
               "  \"hidden_size\": 256, \"intermediate_size\": 688, \"num_attention_heads\": 8,\n"
               "  \"num_key_value_heads\": 2, \"num_hidden_layers\": 3, \"vocab_size\": 1000,\n"
               "  \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,\n"
               "  \"tie_word_embeddings\": true, \"head_dim\": null, \"hidden_act\": \"silu\",\n"
               "  \"rope_scaling\": null, \"attention_bias\": false, \"bos_token_id\": 1,\n"
               "  \"some_future_field\": {\"nested\": [1, 2]}, \"torch_dtype\": \"bfloat16\"\n}\n");
    LlamaConfig c;
    config_json_load(full, &c);
    CHECK(c.hidden_size == 256 && c.intermediate_size == 688 && c.num_attention_heads == 8 &&
              c.num_key_value_heads == 2 && c.num_hidden_layers == 3 && c.vocab_size == 1000,
          "full config sizes wrong");
    CHECK(c.head_dim == 32, "head_dim null should default to hidden/heads = 32, got %d", c.head_dim);
    CHECK(c.max_position_embeddings == 131072, "max_position_embeddings %d", c.max_position_embeddings);
    CHECK(c.rms_norm_eps == 1e-5f && c.rope_theta == 500000.0 && c.tie_word_embeddings == 1,
          "full config eps/theta/tie wrong");

    write_text(minimal, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                        "\"num_hidden_layers\": 2, \"vocab_size\": 256}");
    config_json_load(minimal, &c);
    CHECK(c.num_key_value_heads == 4, "default num_key_value_heads should equal heads, got %d", c.num_key_value_heads);
    CHECK(c.head_dim == 16, "default head_dim should be 16, got %d", c.head_dim);
    CHECK(c.rms_norm_eps == 1e-6f, "default rms_norm_eps %g", (double)c.rms_norm_eps);
    CHECK(c.rope_theta == 10000.0, "default rope_theta %g", c.rope_theta);
    CHECK(c.tie_word_embeddings == 0, "default tie_word_embeddings should be false");
    CHECK(c.max_position_embeddings == 2048, "default max_position_embeddings %d", c.max_position_embeddings);

    /* transformers 5 layout: rope_theta inside rope_parameters. */
    char v5[256];
    path_in(td, "v5_config.json", v5, sizeof v5);
    write_text(v5, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                   "\"num_hidden_layers\": 2, \"vocab_size\": 256, \"dtype\": \"bfloat16\", "
                   "\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"default\"}}");
    config_json_load(v5, &c);
    CHECK(c.rope_theta == 500000.0, "rope_parameters.rope_theta not read: %g", c.rope_theta);

    /* Save, reload: identical. Explicit head_dim different from hidden/heads survives. */
    LlamaConfig orig = {.hidden_size = 96, .intermediate_size = 256, .num_attention_heads = 6,
                        .num_key_value_heads = 3, .num_hidden_layers = 2, .vocab_size = 300, .head_dim = 32,
                        .max_position_embeddings = 4096, .tie_word_embeddings = 1, .rms_norm_eps = 1e-6f,
                        .rope_theta = 10000.0};
    { SeqErr ce; CHECK(config_json_save(saved, &orig, &ce) == 0, "config_json_save: %s", ce.msg); }
    LlamaConfig back;
    config_json_load(saved, &back);
    CHECK(memcmp(&orig, &back, sizeof orig) == 0, "config save/load round trip changed values");
    /* An explicit head_dim is explicit whatever its value: hidden_size / num_attention_heads rounded
     * down where the heads do not divide the hidden size (66 / 4 -> 16) is read, validated and saved
     * as a different value (18) is, as transformers reads it. Until 2026-11-29 it was taken for the
     * derived value and refused ('... or set head_dim explicitly', though it was set). */
    {
        const int dims[] = {16, 18};
        for (size_t i = 0; i < ARRAY_LEN(dims); i++) {
            char json[400];
            snprintf(json, sizeof json, "{\"hidden_size\": 66, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"num_hidden_layers\": 1, \"vocab_size\": 64, \"head_dim\": %d}",
                     dims[i]);
            LlamaConfig fc;
            SeqErr fe = {{0}};
            int rc = config_json_parse(json, strlen(json), "floor.json", &fc, &fe);
            CHECK(rc == 0 && fc.head_dim == dims[i], "explicit head_dim %d with 4 heads, hidden 66 refused: %s", dims[i],
                  fe.msg);
            if (rc != 0) continue;
            CHECK(llama_config_check(&fc, "size flags", &fe) == 0, "size flags with head_dim %d refused: %s", dims[i],
                  fe.msg);
            CHECK(config_json_save(saved, &fc, &fe) == 0, "config_json_save: %s", fe.msg);
            LlamaConfig fb;
            rc = config_json_read(saved, &fb, &fe);
            CHECK(rc == 0 && memcmp(&fc, &fb, sizeof fc) == 0, "head_dim %d with 4 heads, hidden 66: save/read: %s",
                  dims[i], rc ? fe.msg : "values changed");
        }
    }
    /* RoPE scaling survives save/load (both layouts are written; they agree). */
    for (int rt = LLAMA_ROPE_LINEAR; rt <= LLAMA_ROPE_LLAMA3; rt++) {
        LlamaConfig sc = orig;
        sc.rope_type = rt;
        sc.rope_factor = 8.0;
        if (rt == LLAMA_ROPE_LLAMA3) {
            sc.rope_low_freq_factor = 1.0;
            sc.rope_high_freq_factor = 4.0;
            sc.rope_original_max_position_embeddings = 8192;
        }
        { SeqErr ce; CHECK(config_json_save(saved, &sc, &ce) == 0, "config_json_save: %s", ce.msg); }
        LlamaConfig sb;
        config_json_load(saved, &sb);
        CHECK(memcmp(&sc, &sb, sizeof sc) == 0, "config save/load round trip of rope_type %s changed values",
              llama_rope_type_name(rt));
    }
    { SeqErr ce; CHECK(config_json_save(saved, &orig, &ce) == 0, "config_json_save: %s", ce.msg); }
    json_error_t err;
    json_t *root = json_load_file(saved, 0, &err);
    CHECK(root != NULL, "saved config is not JSON: %s", err.text);
    if (root) {
        json_t *arch = json_object_get(root, "architectures");
        CHECK(json_is_array(arch) && json_array_size(arch) == 1 &&
                  strcmp(json_string_value(json_array_get(arch, 0)), "LlamaForCausalLM") == 0,
              "architectures wrong");
        CHECK(strcmp(json_string_value(json_object_get(root, "model_type")), "llama") == 0, "model_type wrong");
        CHECK(strcmp(json_string_value(json_object_get(root, "hidden_act")), "silu") == 0, "hidden_act wrong");
        CHECK(strcmp(json_string_value(json_object_get(root, "torch_dtype")), "float32") == 0, "torch_dtype wrong");
        CHECK(json_is_false(json_object_get(root, "attention_bias")) && json_is_false(json_object_get(root, "mlp_bias")),
              "biases should be false");
        CHECK(json_is_true(json_object_get(root, "tie_word_embeddings")), "tie_word_embeddings should be true");
        CHECK(json_is_integer(json_object_get(root, "head_dim")), "head_dim should be an integer");
        CHECK(json_is_real(json_object_get(root, "initializer_range")), "initializer_range missing");
        json_decref(root);
    }
    size_t len;
    char *text = (char *)read_all(saved, &len);
    CHECK(strstr(text, "\"rms_norm_eps\": 1e-6") != NULL && strstr(text, "9999") == NULL,
          "rms_norm_eps not written as the short decimal 1e-6: %s", text);
    free(text);

    /* RoPE read with transformers 5's precedence (PreTrainedConfig.convert_rope_params_to_dict): a
     * non-empty rope_scaling over rope_parameters, rope_theta from the chosen object else the top
     * level, llama3's top-level original_max_position_embeddings over the object's. Until 2026-11-29
     * rope_parameters won, its rope_theta always, and the top-level value was ignored. */
    {
#define SIZES "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, \"num_hidden_layers\": 1, " \
              "\"vocab_size\": 64, "
        const struct { const char *json; int type; double theta, factor; int omax; } cases[] = {
            {"{" SIZES "\"rope_scaling\": {\"rope_type\": \"default\"}, \"rope_parameters\": {\"rope_type\": \"linear\", "
             "\"factor\": 4.0, \"rope_theta\": 10000.0}}", LLAMA_ROPE_DEFAULT, 10000.0, 0, 0},
            {"{" SIZES "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, \"rope_theta\": 20000.0, "
             "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500.0}}", LLAMA_ROPE_LINEAR, 20000.0, 2.0, 0},
            {"{" SIZES "\"rope_scaling\": {}, \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 3.0, "
             "\"rope_theta\": 700.0}, \"rope_theta\": 900.0}", LLAMA_ROPE_LINEAR, 700.0, 3.0, 0},
            {"{" SIZES "\"rope_scaling\": null, \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 5.0}, "
             "\"rope_theta\": 900.0}", LLAMA_ROPE_LINEAR, 900.0, 5.0, 0},
            {"{" SIZES "\"max_position_embeddings\": 128, \"original_max_position_embeddings\": 8, \"rope_parameters\": "
             "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
             "\"original_max_position_embeddings\": 64, \"rope_theta\": 10000.0}}", LLAMA_ROPE_LLAMA3, 10000.0, 8.0, 8},
            {"{" SIZES "\"max_position_embeddings\": 128, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
             "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}", LLAMA_ROPE_LLAMA3, 10000.0, 8.0, 128},
        };
#undef SIZES
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            LlamaConfig rc;
            SeqErr ce;
            int ok = config_json_parse(cases[i].json, strlen(cases[i].json), "rope case", &rc, &ce) == 0;
            CHECK(ok, "rope case %zu refused: %s", i, ce.msg);
            if (!ok) continue;
            CHECK(rc.rope_type == cases[i].type && rc.rope_theta == cases[i].theta &&
                      (cases[i].type == LLAMA_ROPE_DEFAULT || rc.rope_factor == cases[i].factor) &&
                      (cases[i].type != LLAMA_ROPE_LLAMA3 || rc.rope_original_max_position_embeddings == cases[i].omax),
                  "rope case %zu read as type %d theta %g factor %g original max %d, transformers 5 reads type %d theta %g "
                  "factor %g original max %d", i, rc.rope_type, rc.rope_theta, rc.rope_factor,
                  rc.rope_original_max_position_embeddings, cases[i].type, cases[i].theta, cases[i].factor, cases[i].omax);
        }
    }
    /* The token ids (and an initializer_range other than the 0.02 every save writes) go from the
     * config read to the config saved, a list and a null as they were; a config without them saves
     * none (was: always dropped, so transformers read its defaults bos 1, eos 2 and `--pack` lost its
     * end-of-text id). */
    {
        const char *json = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"bos_token_id\": 60, \"eos_token_id\": [61, 62], "
                           "\"pad_token_id\": null, \"initializer_range\": 0.008}";
        LlamaConfig kc;
        SeqErr ce;
        CHECK(config_json_parse(json, strlen(json), "ids", &kc, &ce) == 0, "ids config refused: %s", ce.msg);
        CHECK(config_json_save(saved, &kc, &ce) == 0, "config_json_save: %s", ce.msg);
        json_error_t jerr;
        json_t *r = json_load_file(saved, 0, &jerr);
        json_t *eos = r ? json_object_get(r, "eos_token_id") : NULL;
        CHECK(r && json_integer_value(json_object_get(r, "bos_token_id")) == 60 && json_is_array(eos) &&
                  json_array_size(eos) == 2 && json_integer_value(json_array_get(eos, 1)) == 62 &&
                  json_is_null(json_object_get(r, "pad_token_id")) &&
                  json_real_value(json_object_get(r, "initializer_range")) == 0.008,
              "the saved config lost the token ids or initializer_range");
        json_decref(r);
        int eot = -1; /* two eos ids: --pack asks which (it reads the saved list) */
        CHECK(config_json_eos_token_id(saved, &eot, &ce) != 0 && strstr(ce.msg, "lists 2 eos_token_id values"),
              "eos of the saved config: %d", eot);
        /* an integer id too large (or negative) is named by its value (it said "found an integer") */
        char eos_path[300];
        snprintf(eos_path, sizeof eos_path, "%s.eos", saved);
        write_text(eos_path, "{\"eos_token_id\": 2147483648}");
        CHECK(config_json_eos_token_id(eos_path, &eot, &ce) != 0 &&
                  strstr(ce.msg, "\"eos_token_id\" 2147483648 is out of range (a token id is 0 to 2147483646)"),
              "eos_token_id 2^31 not refused as out of range: %s", ce.msg);
        write_text(eos_path, "{\"eos_token_id\": 2147483646}");
        CHECK(config_json_eos_token_id(eos_path, &eot, &ce) == 0 && eot == 2147483646, "eos_token_id 2^31 - 2 refused");
        remove(eos_path);
        LlamaConfig back2;
        config_json_load(saved, &back2);
        CHECK(memcmp(&kc, &back2, sizeof kc) == 0, "config with token ids: save/load round trip changed values");
        CHECK(config_json_save(saved, &orig, &ce) == 0, "config_json_save: %s", ce.msg);
        r = json_load_file(saved, 0, &jerr);
        CHECK(r && !json_object_get(r, "bos_token_id") && !json_object_get(r, "eos_token_id"),
              "a config from size flags got token ids");
        json_decref(r);
        /* transformers' "swish" is its "silu"; dropout, which seqpar does not implement, is refused */
        const char *swish = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                            "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"hidden_act\": \"swish\", \"attention_dropout\": 0.0}";
        CHECK(config_json_parse(swish, strlen(swish), "swish", &kc, &ce) == 0, "hidden_act swish refused: %s", ce.msg);
        const char *drop = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"attention_dropout\": 0.1}";
        CHECK(config_json_parse(drop, strlen(drop), "drop", &kc, &ce) != 0 && strstr(ce.msg, "attention_dropout") &&
                  strstr(ce.msg, "set it to 0.0"), "attention_dropout 0.1 not refused by name: %s", ce.msg);
        /* partial_rotary_factor at the top level (transformers 4's place; it was read as 1.0) */
        const char *prf = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                          "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"partial_rotary_factor\": 0.5}";
        CHECK(config_json_parse(prf, strlen(prf), "prf", &kc, &ce) != 0 && strstr(ce.msg, "\"partial_rotary_factor\" is 0.5"),
              "a top-level partial_rotary_factor 0.5 not refused: %s", ce.msg);
        const char *prf1 = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"partial_rotary_factor\": 1.0}";
        CHECK(config_json_parse(prf1, strlen(prf1), "prf1", &kc, &ce) == 0, "partial_rotary_factor 1.0 refused: %s", ce.msg);
        /* nulls transformers 5 refuses (they took seqpar's defaults, and a save wrote the guess), token
         * ids that are not integers; the nulls transformers allows still read */
        const char *nulls[] = {"model_type", "rms_norm_eps", "hidden_act", "tie_word_embeddings", "max_position_embeddings",
                               "attention_bias", "mlp_bias"};
        for (size_t k = 0; k < sizeof nulls / sizeof *nulls; k++) {
            char cfg_null[512];
            snprintf(cfg_null, sizeof cfg_null, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                     "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"%s\": null}", nulls[k]);
            char want[64];
            snprintf(want, sizeof want, "\"%s\" is null", nulls[k]);
            CHECK(config_json_parse(cfg_null, strlen(cfg_null), "nul", &kc, &ce) != 0 && strstr(ce.msg, want) &&
                      strstr(ce.msg, "which transformers refuses too"), "%s null not refused: %s", nulls[k], ce.msg);
        }
        const char *ok_nulls = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                               "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"num_key_value_heads\": null, \"head_dim\": null, "
                               "\"rope_scaling\": null, \"bos_token_id\": null, \"eos_token_id\": [1, 2], \"pad_token_id\": null}";
        CHECK(config_json_parse(ok_nulls, strlen(ok_nulls), "ok", &kc, &ce) == 0 && kc.num_key_value_heads == 4 &&
                  kc.head_dim == 16, "nulls transformers reads refused: %s", ce.msg);
        const char *eos_str = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                              "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"eos_token_id\": \"2\"}";
        CHECK(config_json_parse(eos_str, strlen(eos_str), "eos", &kc, &ce) != 0 &&
                  strstr(ce.msg, "\"eos_token_id\" must be an integer, a list of integers or null, found a string"),
              "eos_token_id \"2\" not refused: %s", ce.msg);
        const char *bos_list = "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                               "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"bos_token_id\": [1, \"x\"]}";
        CHECK(config_json_parse(bos_list, strlen(bos_list), "bos", &kc, &ce) != 0 && strstr(ce.msg, "a list holding something else"),
              "bos_token_id [1, \"x\"] not refused: %s", ce.msg);
        char big[8192];
        int n = snprintf(big, sizeof big, "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                                           "\"num_hidden_layers\": 1, \"vocab_size\": 64, \"eos_token_id\": [1");
        for (int k = 0; k < 700; k++) n += snprintf(big + n, sizeof big - (size_t)n, ",1000");
        snprintf(big + n, sizeof big - (size_t)n, "]}");
        CHECK(config_json_parse(big, strlen(big), "big", &kc, &ce) != 0 && strstr(ce.msg, "token ids take"),
              "a 3500-character eos list not refused: %s", ce.msg);
    }
    /* A Mistral (model_type "mistral"): Llama's arithmetic with a sliding window, read with
     * MistralConfig's defaults (sliding_window 4096 and 8 KV heads where absent, 131072 positions),
     * refused past the window, saved as a Mistral; a Llama's sliding_window stays refused. */
    {
#define MSIZES "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 8, \"num_hidden_layers\": 1, \"vocab_size\": 64, "
        struct { const char *json; int ok, window, kv, maxpos; } cases[] = {
            {"{" MSIZES "\"model_type\": \"mistral\", \"sliding_window\": null, \"num_key_value_heads\": 2}", 1, 0, 2, 131072},
            {"{" MSIZES "\"model_type\": \"mistral\", \"sliding_window\": 32, \"max_position_embeddings\": 64}", 1, 32, 8, 64},
            {"{" MSIZES "\"model_type\": \"mistral\"}", 1, 4096, 8, 131072},
            {"{" MSIZES "\"model_type\": \"mistral\", \"num_key_value_heads\": null}", 1, 4096, 8, 131072},
            {"{" MSIZES "\"model_type\": \"mistral\", \"sliding_window\": 0}", 0, 0, 0, 0},
            {"{" MSIZES "\"model_type\": \"mistral\", \"sliding_window\": \"4096\"}", 0, 0, 0, 0},
            {"{" MSIZES "\"model_type\": \"llama\", \"sliding_window\": 32}", 0, 0, 0, 0},
            {"{" MSIZES "\"model_type\": \"gemma\"}", 0, 0, 0, 0},
        };
#undef MSIZES
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            LlamaConfig mc;
            if (!config_case_read("mistral case", i, cases[i].json, cases[i].ok, i == 7 ? "model_type" : "sliding_window",
                                  &mc))
                continue;
            CHECK(mc.family == LLAMA_FAMILY_MISTRAL && mc.sliding_window == cases[i].window &&
                      mc.num_key_value_heads == cases[i].kv && mc.max_position_embeddings == cases[i].maxpos,
                  "mistral case %zu read as family %d window %d kv %d positions %d", i, mc.family, mc.sliding_window,
                  mc.num_key_value_heads, mc.max_position_embeddings);
            CHECK(llama_layer_window(&mc, 0) == cases[i].window && llama_layer_window(&mc, 1) == cases[i].window &&
                      llama_windowed_layers(&mc) == (cases[i].window ? mc.num_hidden_layers : 0),
                  "mistral case %zu: every layer's window should be %d: %d, %d", i, cases[i].window,
                  llama_layer_window(&mc, 0), llama_layer_window(&mc, 1));
            json_t *r = config_case_save(&mc, saved);
            json_t *sw = r ? json_object_get(r, "sliding_window") : NULL;
            CHECK(r && !strcmp(json_string_value(json_object_get(r, "model_type")), "mistral") &&
                      !strcmp(json_string_value(json_array_get(json_object_get(r, "architectures"), 0)),
                              "MistralForCausalLM") &&
                      sw && (cases[i].window ? json_integer_value(sw) == cases[i].window : json_is_null(sw)) &&
                      !json_object_get(r, "attention_bias"),
                  "mistral case %zu: the saved config is no Mistral with its window", i);
            json_decref(r);
            config_case_reloads("mistral case", i, &mc, saved);
        }
    }

    /* A Qwen2 (model_type "qwen2"): biases on q, k, v (not o), read with Qwen2Config's defaults (32 KV
     * heads where absent, 32768 positions, no window unless use_sliding_window; then the window from
     * layer max_window_layers on, default 28); layer_types must agree with those; saved as a Qwen2
     * with the three window fields, read back equal. A Llama's attention_bias: all four biases. */
    {
#define QSIZES "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 32, \"num_hidden_layers\": 2, \"vocab_size\": 64, "
        struct { const char *json; int ok, window, kv, maxpos, family, qkv, o; const char *word; } cases[] = {
            {"{" QSIZES "\"model_type\": \"qwen2\"}", 1, 0, 32, 32768, LLAMA_FAMILY_QWEN2, 1, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"num_key_value_heads\": 4, \"use_sliding_window\": false, "
             "\"sliding_window\": 32, \"max_window_layers\": 0, \"attention_bias\": false}", 1, 0, 4, 32768, LLAMA_FAMILY_QWEN2, 1, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 32, "
             "\"max_window_layers\": 1}", 1, 32, 32, 32768, LLAMA_FAMILY_QWEN2, 1, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 32, "
             "\"max_window_layers\": 2}", 1, 0, 32, 32768, LLAMA_FAMILY_QWEN2, 1, 0, NULL}, /* no layer windowed */
            {"{" QSIZES "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 32, "
             "\"max_window_layers\": 1, \"layer_types\": [\"full_attention\", \"sliding_attention\"]}", 1, 32, 32, 32768,
             LLAMA_FAMILY_QWEN2, 1, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"layer_types\": [\"full_attention\", \"full_attention\"]}", 1, 0, 32,
             32768, LLAMA_FAMILY_QWEN2, 1, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"layer_types\": [\"full_attention\", \"sliding_attention\"]}", 0, 0,
             0, 0, 0, 0, 0, "layer 1 should be \"full_attention\""},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"layer_types\": [\"full_attention\"]}", 0, 0, 0, 0, 0, 0, 0,
             "layer_types"},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"max_window_layers\": -1}", 0, 0, 0, 0, 0, 0, 0,
             "\"max_window_layers\" -1 is negative"},
            {"{" QSIZES "\"model_type\": \"qwen2\", \"use_sliding_window\": 1}", 0, 0, 0, 0, 0, 0, 0,
             "\"use_sliding_window\" must be true or false"},
            {"{" QSIZES "\"model_type\": \"llama\", \"attention_bias\": true}", 1, 0, 32, 2048, LLAMA_FAMILY_LLAMA, 1, 1, NULL},
            {"{" QSIZES "\"attention_bias\": true, \"mlp_bias\": true}", 0, 0, 0, 0, 0, 0, 0, "\"mlp_bias\": true"},
            {"{" QSIZES "\"model_type\": \"llama\", \"use_sliding_window\": false, \"layer_types\": [\"full_attention\"]}",
             0, 0, 0, 0, 0, 0, 0, "\"layer_types\""}, /* a Llama's stay refused by name */
            /* a Qwen3: q/k norms, head_dim 128 where absent (Qwen3Config), attention_bias on all four */
            {"{" QSIZES "\"model_type\": \"qwen3\"}", 1, 0, 32, 32768, LLAMA_FAMILY_QWEN3, 0, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen3\", \"attention_bias\": true, \"head_dim\": 16, \"num_key_value_heads\": 8, "
             "\"mlp_bias\": true}", 1, 0, 8, 32768, LLAMA_FAMILY_QWEN3, 1, 1, NULL},
            {"{" QSIZES "\"model_type\": \"qwen3\", \"use_sliding_window\": true, \"sliding_window\": 32, "
             "\"max_window_layers\": 0, \"layer_types\": [\"sliding_attention\", \"sliding_attention\"]}", 1, 32, 32, 32768,
             LLAMA_FAMILY_QWEN3, 0, 0, NULL},
            {"{" QSIZES "\"model_type\": \"qwen3\", \"head_dim\": null}", 0, 0, 0, 0, 0, 0, 0, "\"head_dim\" is null"},
            {"{" QSIZES "\"model_type\": \"qwen3\", \"attention_bias\": 1}", 0, 0, 0, 0, 0, 0, 0,
             "\"attention_bias\" must be true or false"},
        };
#undef QSIZES
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            LlamaConfig qc;
            if (!config_case_read("qwen2 case", i, cases[i].json, cases[i].ok, cases[i].word, &qc)) continue;
            const int q3 = cases[i].family == LLAMA_FAMILY_QWEN3;
            CHECK(qc.family == cases[i].family && qc.sliding_window == cases[i].window &&
                      qc.num_key_value_heads == cases[i].kv && qc.max_position_embeddings == cases[i].maxpos &&
                      qc.qkv_bias == cases[i].qkv && qc.o_bias == cases[i].o && qc.qk_norm == q3 &&
                      qc.head_dim == (q3 ? (strstr(cases[i].json, "\"head_dim\": 16") ? 16 : 128) : 2),
                  "qwen2 case %zu read as family %d window %d kv %d positions %d biases %d %d", i, qc.family,
                  qc.sliding_window, qc.num_key_value_heads, qc.max_position_embeddings, qc.qkv_bias, qc.o_bias);
            const int w0 = strstr(cases[i].json, "\"max_window_layers\": 0") ? cases[i].window : 0; /* 2 layers */
            CHECK(llama_layer_window(&qc, 0) == w0 && llama_layer_window(&qc, 1) == cases[i].window,
                  "qwen2 case %zu: layer windows %d, %d, expected %d, %d", i, llama_layer_window(&qc, 0),
                  llama_layer_window(&qc, 1), w0, cases[i].window);
            json_t *r = config_case_save(&qc, saved);
            const int q2 = cases[i].family == LLAMA_FAMILY_QWEN2;
            const char *mt = q2 ? "qwen2" : q3 ? "qwen3" : "llama";
            const char *arch = q2 ? "Qwen2ForCausalLM" : q3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
            json_t *ab = r ? json_object_get(r, "attention_bias") : NULL;
            CHECK(r && !strcmp(json_string_value(json_object_get(r, "model_type")), mt) &&
                      !strcmp(json_string_value(json_array_get(json_object_get(r, "architectures"), 0)), arch) &&
                      (q2 ? !ab : json_is_boolean(ab) && json_is_true(ab) == cases[i].o) &&
                      (q2 || q3 ? json_object_get(r, "use_sliding_window") && json_object_get(r, "max_window_layers")
                                : !json_object_get(r, "use_sliding_window")) &&
                      !json_is_true(json_object_get(r, "mlp_bias")),
                  "qwen2 case %zu: the saved config is not the family read", i);
            json_decref(r);
            config_case_reloads("qwen2 case", i, &qc, saved);
        }
    }

    /* Error paths. */
    struct { const char *name, *json; } bad[] = {
        {"bad_syntax.json", "{\n  \"hidden_size\": 64,\n  \"vocab_size\": 256,,\n}"},
        {"missing_field.json", "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                               "\"num_hidden_layers\": 2}"},
        {"heads_not_dividing.json", "{\"hidden_size\": 100, \"intermediate_size\": 128, \"num_attention_heads\": 3, "
                                    "\"num_hidden_layers\": 2, \"vocab_size\": 256}"},
        {"kv_not_dividing.json", "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                                 "\"num_key_value_heads\": 3, \"num_hidden_layers\": 2, \"vocab_size\": 256}"},
        {"float_int.json", "{\"hidden_size\": 64.0, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 2, \"vocab_size\": 256}"},
        {"string_eps.json", "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                            "\"num_hidden_layers\": 2, \"vocab_size\": 256, \"rms_norm_eps\": \"1e-5\"}"},
        {"rope_scaling.json", "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                              "\"num_hidden_layers\": 2, \"vocab_size\": 256, "
                              "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}"},
        {"array.json", "[1, 2]"},
        {"rope_parameters.json", "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 4, "
                                 "\"num_hidden_layers\": 2, \"vocab_size\": 256, "
                                 "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000}}"},
    };
    char paths[ARRAY_LEN(bad)][256];
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        path_in(td, bad[i].name, paths[i], sizeof paths[i]);
        write_text(paths[i], bad[i].json);
    }
    char missing[256];
    path_in(td, "no_such_config.json", missing, sizeof missing);
    EXPECT_DEATH("config missing file", death_config_load, missing, "no_such_config.json", "No such file");
    EXPECT_DEATH("config bad JSON", death_config_load, paths[0], "bad_syntax.json", "not valid JSON", "line 3",
                 "column");
    EXPECT_DEATH("config missing field", death_config_load, paths[1], "missing_field.json", "\"vocab_size\"", "add it");
    EXPECT_DEATH("config heads not dividing", death_config_load, paths[2], "heads_not_dividing.json",
                 "num_attention_heads (3) does not divide hidden_size (100), so head_dim cannot be derived",
                 "the nearest is 2", "or set head_dim to a positive even value (e.g. 32)");
    EXPECT_DEATH("config kv not dividing", death_config_load, paths[3], "kv_not_dividing.json",
                 "num_key_value_heads (3) does not divide num_attention_heads (4)");
    EXPECT_DEATH("config float for int", death_config_load, paths[4], "float_int.json", "\"hidden_size\"",
                 "JSON integer");
    EXPECT_DEATH("config string for number", death_config_load, paths[5], "string_eps.json", "rms_norm_eps",
                 "number");
    EXPECT_DEATH("config rope_scaling", death_config_load, paths[6], "rope_scaling.json", "rope_scaling", "llama3");
    EXPECT_DEATH("config not an object", death_config_load, paths[7], "array.json", "object");
    EXPECT_DEATH("config rope_parameters", death_config_load, paths[8], "rope_parameters.json", "rope_parameters",
                 "yarn");

    LlamaConfig bad_size = orig;
    bad_size.hidden_size = 0;
    EXPECT_DEATH("validate zero hidden", death_config_validate, &bad_size, "size flags", "hidden_size is 0");
    LlamaConfig bad_heads = orig;
    bad_heads.hidden_size = 100;
    bad_heads.num_attention_heads = 8;
    bad_heads.head_dim = 0;
    EXPECT_DEATH("validate heads", death_config_validate, &bad_heads, "size flags", "does not divide hidden_size",
                 "set head_dim to a positive even value (e.g. 12)");
    bad_heads.head_dim = -4; /* set, but not positive: no advice to leave it out, which the heads refuse */
    EXPECT_DEATH("validate negative head_dim", death_config_validate, &bad_heads, "size flags",
                 "head_dim is -4; it must be a positive even value (e.g. 12)");
    bad_heads.head_dim = 100 / 8; /* the quotient rounded down, set: explicit, accepted */
    bad_heads.num_key_value_heads = 4;
    {
        SeqErr he;
        CHECK(llama_config_check(&bad_heads, "size flags", &he) == 0, "head_dim 12 with 8 heads, hidden 100: %s", he.msg);
    }
    LlamaConfig bad_kv = orig;
    bad_kv.num_key_value_heads = 4;
    EXPECT_DEATH("validate kv heads", death_config_validate, &bad_kv, "num_key_value_heads (4)", "(6)");
}

/* ---------------------------------------------------------------- tokens */

typedef struct {
    const char *path;
    TokensFormat format;
} TokensCall;

static void death_tokens_load(const void *arg) {
    const TokensCall *c = arg;
    TokenData td;
    tokens_load(c->path, c->format, &td);
}

static void death_format_parse(const void *arg) { tokens_format_parse((const char *)arg); }

/* Writes an llm.c shard by hand: header (magic, version, count), then tokens of `width` bytes. */
static void write_shard_by_hand(const char *path, int32_t magic, int32_t version, int32_t count,
                                const uint32_t *tokens, size_t n, size_t width) {
    size_t total = 1024 + n * width;
    unsigned char *buf = calloc(total, 1);
    int32_t header[3] = {magic, version, count};
    memcpy(buf, header, sizeof header); /* little-endian host */
    for (size_t i = 0; i < n; i++) memcpy(buf + 1024 + i * width, &tokens[i], width);
    write_bytes(path, buf, total);
    free(buf);
}

static void test_tokens(const TempDir *td) {
    char v1[256], v7[256], hand_v1[256], hand_v7[256], text[256], text_as_llmc[256];
    path_in(td, "tokens_v1.bin", v1, sizeof v1);
    path_in(td, "tokens_v7.bin", v7, sizeof v7);
    path_in(td, "hand_v1.bin", hand_v1, sizeof hand_v1);
    path_in(td, "hand_v7.bin", hand_v7, sizeof hand_v7);
    path_in(td, "story.txt", text, sizeof text);
    path_in(td, "story.dat", text_as_llmc, sizeof text_as_llmc);

    enum { N = 40000 };
    uint32_t *small = malloc(N * sizeof(uint32_t)), *large = malloc(N * sizeof(uint32_t));
    for (uint32_t i = 0; i < N; i++) {
        small[i] = (i * 2654435761u) % 65536;
        large[i] = (i * 2654435761u) % 200000;
    }
    small[123] = 65535;
    large[77] = 199999;
    SeqErr te;
    CHECK(tokens_write_llmc(v1, small, N, &te) == 0 && tokens_write_llmc(v7, large, N, &te) == 0, "tokens_write_llmc: %s",
          te.msg);
    struct stat sb;
    stat(v1, &sb);
    CHECK((size_t)sb.st_size == 1024 + 2 * (size_t)N, "v1 shard size %lld", (long long)sb.st_size);
    stat(v7, &sb);
    CHECK((size_t)sb.st_size == 1024 + 4 * (size_t)N, "v7 shard size %lld", (long long)sb.st_size);
    size_t len;
    int32_t *header = (int32_t *)read_all(v1, &len);
    CHECK(header[0] == 20240520 && header[1] == 1 && header[2] == N, "v1 header %d %d %d", header[0], header[1],
          header[2]);
    free(header);
    header = (int32_t *)read_all(v7, &len);
    CHECK(header[0] == 20240801 && header[1] == 7 && header[2] == N, "v7 header %d %d %d", header[0], header[1],
          header[2]);
    free(header);

    TokenData data;
    tokens_load(v1, TOKENS_AUTO, &data);
    CHECK(data.n == N && data.format == TOKENS_LLMC && data.max_token == 65535, "v1 load: n=%zu max=%u", data.n,
          data.max_token);
    CHECK(data.n == N && memcmp(data.tokens, small, N * sizeof(uint32_t)) == 0, "v1 tokens differ");
    tokens_free(&data);
    tokens_load(v7, TOKENS_LLMC, &data);
    CHECK(data.n == N && data.max_token == 199999, "v7 load: n=%zu max=%u", data.n, data.max_token);
    CHECK(data.n == N && memcmp(data.tokens, large, N * sizeof(uint32_t)) == 0, "v7 tokens differ");
    tokens_free(&data);

    uint32_t few[5] = {5, 0, 65535, 17, 300};
    write_shard_by_hand(hand_v1, 20240520, 1, 5, few, 5, 2);
    tokens_load(hand_v1, TOKENS_AUTO, &data);
    CHECK(data.n == 5 && memcmp(data.tokens, few, sizeof few) == 0 && data.max_token == 65535, "hand v1 wrong");
    tokens_free(&data);
    uint32_t wide[3] = {128000, 1, 128255};
    write_shard_by_hand(hand_v7, 20240801, 7, 3, wide, 3, 4);
    tokens_load(hand_v7, TOKENS_AUTO, &data);
    CHECK(data.n == 3 && memcmp(data.tokens, wide, sizeof wide) == 0 && data.max_token == 128255, "hand v7 wrong");
    tokens_free(&data);

    const char *story = "Once upon a time\n\xff\x01";
    write_text(text, story);
    tokens_load(text, TOKENS_AUTO, &data);
    CHECK(data.format == TOKENS_TEXT && data.n == strlen(story), "text load: format %d n %zu", data.format, data.n);
    int same = data.n == strlen(story);
    for (size_t i = 0; same && i < data.n; i++) same = data.tokens[i] == (unsigned char)story[i];
    CHECK(same && data.max_token == 255, "text bytes not read as tokens");
    tokens_free(&data);
    write_text(text_as_llmc, story);
    tokens_load(text_as_llmc, TOKENS_TEXT, &data); /* explicit format overrides the extension */
    CHECK(data.format == TOKENS_TEXT && data.n == strlen(story), "explicit text format ignored");
    tokens_free(&data);

    CHECK(tokens_format_parse("auto") == TOKENS_AUTO && tokens_format_parse("llmc") == TOKENS_LLMC &&
              tokens_format_parse("text") == TOKENS_TEXT, "tokens_format_parse");

    /* Error paths. */
    char missing[256], bad_magic[256], truncated[256], empty[256], bad_version[256], short_file[256];
    path_in(td, "missing.bin", missing, sizeof missing);
    path_in(td, "bad_magic.bin", bad_magic, sizeof bad_magic);
    path_in(td, "truncated.bin", truncated, sizeof truncated);
    path_in(td, "empty.txt", empty, sizeof empty);
    path_in(td, "bad_version.bin", bad_version, sizeof bad_version);
    path_in(td, "short.bin", short_file, sizeof short_file);
    write_shard_by_hand(bad_magic, 12345, 1, 5, few, 5, 2);
    write_shard_by_hand(truncated, 20240520, 1, 6, few, 5, 2); /* header says 6, holds 5 */
    write_shard_by_hand(bad_version, 20240801, 1, 3, wide, 3, 4);
    write_bytes(empty, "", 0);
    write_text(short_file, "hello");

    TokensCall c_missing = {missing, TOKENS_AUTO}, c_magic = {bad_magic, TOKENS_AUTO},
               c_trunc = {truncated, TOKENS_LLMC}, c_empty = {empty, TOKENS_AUTO},
               c_version = {bad_version, TOKENS_AUTO}, c_short = {short_file, TOKENS_AUTO};
    EXPECT_DEATH("tokens missing file", death_tokens_load, &c_missing, "missing.bin", "No such file");
    EXPECT_DEATH("tokens wrong magic", death_tokens_load, &c_magic, "bad_magic.bin", "12345", "20240520",
                 "20240801");
    EXPECT_DEATH("tokens truncated", death_tokens_load, &c_trunc, "truncated.bin", "6 tokens", "1036 bytes",
                 "1034 bytes");
    EXPECT_DEATH("tokens empty", death_tokens_load, &c_empty, "empty.txt", "empty");
    EXPECT_DEATH("tokens bad version", death_tokens_load, &c_version, "bad_version.bin", "version 1", "version 7");
    EXPECT_DEATH("tokens short file", death_tokens_load, &c_short, "short.bin", "5 bytes", "1024");
    EXPECT_DEATH("tokens format", death_format_parse, "llm.c", "'llm.c'", "auto, llmc or text");
    free(small);
    free(large);
}

/* ---------------------------------------------------------------- recall */

static void death_recall_spec(const void *arg) {
    RecallSpec s = *(const RecallSpec *)arg;
    recall_spec_finalize(&s);
}

/* Checks every documented invariant of one generated sequence; returns the number of failures. */
static int check_recall_sequence(const RecallSpec *s, const int *in, const int *tgt, const int *dist) {
    int S = s->seq_len, half = S / 2, n_keys = (s->vocab_size - 1) / 2;
    int failures = 0, n_targets = 0, n_nonzero = 0, n_pair_keys = 0;
    int *key_pos = malloc((size_t)(n_keys + 1) * sizeof(int));
    for (int k = 0; k <= n_keys; k++) key_pos[k] = -1;
    for (int i = 0; i < half; i++) {
        int tok = in[i];
        if (tok >= 1 && tok <= n_keys) {
            n_pair_keys++;
            if (key_pos[tok] >= 0) failures++; /* keys distinct */
            key_pos[tok] = i;
            if (i + 1 >= half || in[i + 1] <= n_keys || in[i + 1] > 2 * n_keys) failures++; /* value follows */
        } else if (tok > n_keys) {
            if (i == 0 || in[i - 1] < 1 || in[i - 1] > n_keys) failures++; /* a value only right after a key */
        }
        if (tgt[i] != RECALL_IGNORE || dist[i] != 0) failures++; /* no targets in the pair half */
    }
    if (n_pair_keys != s->n_pairs) failures++;
    for (int i = 0; i < S; i++) {
        n_nonzero += in[i] != 0;
        if (in[i] < 0 || in[i] >= s->vocab_size) failures++;
    }
    for (int i = half; i < S; i++) {
        int tok = in[i];
        if (tok == 0) {
            if (tgt[i] != RECALL_IGNORE || dist[i] != 0) failures++;
            continue;
        }
        if (tok > n_keys || key_pos[tok] < 0) { failures++; continue; } /* a query is a known key */
        n_targets++;
        if (tgt[i] != in[key_pos[tok] + 1]) failures++;               /* target = that key's value */
        if (dist[i] != i - key_pos[tok]) failures++;                   /* distance to the pair's key */
    }
    for (int i = 0; i < S; i++)
        if (tgt[i] != RECALL_IGNORE && (i < half || in[i] == 0)) failures++; /* targets only at queries */
    if (n_targets != s->n_queries) failures++;
    if (n_nonzero != 2 * s->n_pairs + s->n_queries) failures++; /* filler 0 everywhere else */
    free(key_pos);
    return failures;
}

/* Invariants of one RECALL_FUSED sequence: pair tokens (distinct keys) only in the first half,
 * queries (key tokens) only in the second, each query's target the value its key's pair token
 * names and its distance the way back to that token; filler elsewhere. Returns the failures. */
static int check_fused_sequence(const RecallSpec *s, const int *in, const int *tgt, const int *dist) {
    int S = s->seq_len, half = S / 2, K = recall_n_keys(s), first_pair = 1 + 2 * K;
    int failures = 0, n_pairs = 0, n_targets = 0;
    int key_pos[64], key_value[64];
    if (K >= 64) return 1;
    for (int k = 0; k < K; k++) key_pos[k] = -1;
    for (int i = 0; i < half; i++) {
        int tok = in[i];
        if (tgt[i] != RECALL_IGNORE || dist[i] != 0) failures++;
        if (tok == 0) continue;
        if (tok < first_pair || tok >= first_pair + K * K) { failures++; continue; } /* only pair tokens */
        int k = (tok - first_pair) / K, v = (tok - first_pair) % K;
        if (key_pos[k] >= 0) failures++; /* keys distinct */
        key_pos[k] = i;
        key_value[k] = 1 + K + v;
        n_pairs++;
    }
    if (n_pairs != s->n_pairs) failures++;
    for (int i = half; i < S; i++) {
        int tok = in[i];
        if (tok == 0) {
            if (tgt[i] != RECALL_IGNORE || dist[i] != 0) failures++;
            continue;
        }
        if (tok < 1 || tok > K || key_pos[tok - 1] < 0) { failures++; continue; } /* a query asks a known key */
        n_targets++;
        if (tgt[i] != key_value[tok - 1]) failures++;
        if (dist[i] != i - key_pos[tok - 1]) failures++;
    }
    if (n_targets != s->n_queries) failures++;
    return failures;
}

static void test_recall_fused(void) {
    RecallSpec v81 = {.format = RECALL_FUSED, .vocab_size = 81, .seq_len = 64};
    RecallSpec v80 = {.format = RECALL_FUSED, .vocab_size = 80, .seq_len = 64};
    CHECK(recall_n_keys(&v81) == 8 && recall_n_keys(&v80) == 7, "fused keys: vocab 81 -> %d (want 8), 80 -> %d (want 7)",
          recall_n_keys(&v81), recall_n_keys(&v80));
    CHECK(recall_format_parse("fused") == RECALL_FUSED && recall_format_parse("adjacent") == RECALL_ADJACENT &&
              recall_format_parse("mqar") == -1, "recall_format_parse");
    RecallSpec cases[] = {
        {.format = RECALL_FUSED, .vocab_size = 81, .seq_len = 2048, .n_pairs = 8, .n_queries = 32},
        {.format = RECALL_FUSED, .vocab_size = 81, .seq_len = 16, .n_pairs = 8, .n_queries = 8}, /* pairs fill the half */
        {.format = RECALL_FUSED, .vocab_size = 300, .seq_len = 301, .n_pairs = 5, .n_queries = 40},
    };
    enum { S = 2048 };
    static int in[S], tgt[S], dist[S];
    for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
        RecallSpec s = cases[c];
        recall_spec_finalize(&s);
        Rng rng;
        rng_seed(&rng, 77 + c);
        int failures = 0, max_dist = 0;
        for (int rep = 0; rep < 30; rep++) {
            recall_generate(&s, &rng, in, tgt, dist);
            failures += check_fused_sequence(&s, in, tgt, dist);
            for (int i = 0; i < s.seq_len; i++) if (dist[i] > max_dist) max_dist = dist[i];
        }
        CHECK(failures == 0, "fused case %zu: %d invariant violations", c, failures);
        CHECK(c != 0 || max_dist > 1900, "fused distances should reach across 2048 tokens, max %d", max_dist);
    }
    /* the classic checker rejects a fused sequence (the two checks are not vacuous) */
    RecallSpec s = cases[0];
    Rng rng;
    rng_seed(&rng, 3);
    recall_generate(&s, &rng, in, tgt, dist);
    RecallSpec as_adjacent = s;
    as_adjacent.format = RECALL_ADJACENT;
    CHECK(check_recall_sequence(&as_adjacent, in, tgt, dist) != 0, "a fused sequence passed the adjacent checks");
    tgt[S - 1] = tgt[S - 1] == RECALL_IGNORE ? 1 : RECALL_IGNORE;
    CHECK(check_fused_sequence(&s, in, tgt, dist) != 0, "a damaged fused sequence passed its checks");
    RecallSpec too_many = {.format = RECALL_FUSED, .vocab_size = 81, .seq_len = 4096, .n_pairs = 9};
    EXPECT_DEATH("fused: more pairs than keys", death_recall_spec, &too_many, "9 pairs", "only 8");

    /* statistics as JSON: the non-empty buckets in order, the last one open-ended */
    RecallStats st;
    memset(&st, 0, sizeof st);
    recall_stats_add(&st, 300, 1);
    recall_stats_add(&st, 511, 0);
    recall_stats_add(&st, 1500, 1);
    recall_stats_add(&st, 1 << 30, 1);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    recall_stats_json(&st, mem);
    fclose(mem);
    const char *want = "[{\"from\": 256, \"to\": 511, \"correct\": 1, \"total\": 2}, {\"from\": 1024, \"to\": 2047, "
                       "\"correct\": 1, \"total\": 1}, {\"from\": 8388608, \"to\": null, \"correct\": 1, \"total\": 1}]";
    CHECK(strcmp(text, want) == 0, "recall_stats_json: %s", text);
    free(text);
}

static void test_recall(void) {
    RecallSpec spec = {.vocab_size = 64, .seq_len = 256};
    recall_spec_finalize(&spec);
    CHECK(spec.n_pairs == 16 && spec.n_queries == 16, "defaults: %d pairs %d queries", spec.n_pairs, spec.n_queries);
    RecallSpec capped = {.vocab_size = 16, .seq_len = 4096};
    recall_spec_finalize(&capped);
    CHECK(capped.n_pairs == 7, "default pairs should be capped at the 7 keys, got %d", capped.n_pairs);

    enum { S = 1025 };
    int in[S], tgt[S], dist[S], in2[S], tgt2[S], dist2[S];
    RecallSpec cases[] = {
        {.vocab_size = 64, .seq_len = 256},
        {.vocab_size = 16, .seq_len = 30, .n_pairs = 7, .n_queries = 15}, /* tight: pairs fill the half, repeats */
        {.vocab_size = 1000, .seq_len = S, .n_pairs = 100, .n_queries = 40},
        {.vocab_size = 300, .seq_len = 5, .n_pairs = 1, .n_queries = 3},
    };
    for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
        RecallSpec s = cases[c];
        recall_spec_finalize(&s);
        Rng rng;
        rng_seed(&rng, 1000 + c);
        int failures = 0, max_dist = 0, min_dist = S;
        for (int rep = 0; rep < 50; rep++) {
            recall_generate(&s, &rng, in, tgt, dist);
            failures += check_recall_sequence(&s, in, tgt, dist);
            for (int i = 0; i < s.seq_len; i++)
                if (tgt[i] != RECALL_IGNORE) {
                    if (dist[i] > max_dist) max_dist = dist[i];
                    if (dist[i] < min_dist) min_dist = dist[i];
                }
        }
        CHECK(failures == 0, "recall case %zu: %d invariant violations", c, failures);
        CHECK(min_dist >= 2 && max_dist < s.seq_len, "recall case %zu: distances [%d, %d]", c, min_dist, max_dist);
    }
    /* Distances cover short and long ranges over many sequences. */
    {
        RecallSpec s = cases[2];
        recall_spec_finalize(&s);
        Rng rng;
        rng_seed(&rng, 5);
        int max_dist = 0, min_dist = S;
        for (int rep = 0; rep < 20; rep++) {
            recall_generate(&s, &rng, in, tgt, dist);
            for (int i = 0; i < S; i++)
                if (tgt[i] != RECALL_IGNORE) {
                    if (dist[i] > max_dist) max_dist = dist[i];
                    if (dist[i] < min_dist) min_dist = dist[i];
                }
        }
        CHECK(min_dist < 64 && max_dist > 900, "distances should span the sequence, got [%d, %d]", min_dist, max_dist);
    }

    /* Deterministic for a seed, different across seeds, and a zero spec gets defaults. */
    RecallSpec s = {.vocab_size = 128, .seq_len = 512};
    Rng a, b;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    recall_generate(&s, &a, in, tgt, dist);
    recall_generate(&s, &b, in2, tgt2, dist2);
    CHECK(memcmp(in, in2, 512 * sizeof(int)) == 0 && memcmp(tgt, tgt2, 512 * sizeof(int)) == 0 &&
              memcmp(dist, dist2, 512 * sizeof(int)) == 0, "same seed gave different sequences");
    recall_generate(&s, &a, in2, tgt2, dist2);
    CHECK(memcmp(in, in2, 512 * sizeof(int)) != 0, "consecutive sequences are identical");
    rng_seed(&b, 43);
    recall_generate(&s, &b, in2, tgt2, dist2);
    CHECK(memcmp(in, in2, 512 * sizeof(int)) != 0, "different seeds gave the same sequence");
    RecallSpec fin = s;
    recall_spec_finalize(&fin);
    CHECK(check_recall_sequence(&fin, in, tgt, dist) == 0, "zero-field spec sequence violates invariants");

    /* Statistics: bucket of distance d is floor(log2 d). */
    RecallStats st;
    memset(&st, 0, sizeof st);
    recall_stats_add(&st, 1, 1);
    recall_stats_add(&st, 2, 1);
    recall_stats_add(&st, 3, 0);
    recall_stats_add(&st, 4, 1);
    recall_stats_add(&st, 7, 1);
    recall_stats_add(&st, 8, 0);
    recall_stats_add(&st, 1 << 30, 1);
    CHECK(st.total[0] == 1 && st.total[1] == 2 && st.correct[1] == 1 && st.total[2] == 2 && st.correct[2] == 2 &&
              st.total[3] == 1 && st.correct[3] == 0 && st.total[RECALL_BUCKETS - 1] == 1,
          "recall_stats_add buckets wrong");
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    double overall = recall_stats_print(&st, mem);
    fclose(mem);
    CHECK(fabs(overall - 5.0 / 7.0) < 1e-12, "overall accuracy %g", overall);
    const char *want = "recall accuracy by distance: 1-1: 1.000 (n=1) 2-3: 0.500 (n=2) 4-7: 1.000 (n=2) "
                       "8-15: 0.000 (n=1) 8388608+: 1.000 (n=1) overall: 0.714 (n=7)\n";
    CHECK(strcmp(text, want) == 0, "stats line: %s", text);
    size_t newlines = 0;
    for (size_t i = 0; i < text_len; i++) newlines += text[i] == '\n';
    CHECK(newlines == 1, "stats should be one line: %s", text);
    free(text);

    RecallSpec tiny_vocab = {.vocab_size = 10, .seq_len = 64};
    EXPECT_DEATH("recall vocab too small", death_recall_spec, &tiny_vocab, "vocab_size is 10", "16");
    RecallSpec too_many = {.vocab_size = 64, .seq_len = 64, .n_pairs = 17};
    EXPECT_DEATH("recall pairs do not fit", death_recall_spec, &too_many, "17 pairs", "at most 16");
    RecallSpec few_keys = {.vocab_size = 21, .seq_len = 4096, .n_pairs = 11};
    EXPECT_DEATH("recall too few keys", death_recall_spec, &few_keys, "11 pairs", "only 10");
}

/* ---------------------------------------------------------------- atomic files */

static void test_atomic(const TempDir *td) {
    char path[256];
    path_in(td, "atomic.txt", path, sizeof path);
    write_text(path, "old");
    AtomicFile af;
    SeqErr e = {""};
    CHECK(atomic_open(&af, path, &e) == 0, "atomic_open: %s", e.msg);
    atomic_write(&af, "new contents", 12);
    atomic_abort(&af);
    size_t len;
    char *text = (char *)read_all(path, &len);
    CHECK(strcmp(text, "old") == 0, "abort changed the target: %s", text);
    free(text);
    CHECK(atomic_open(&af, path, &e) == 0 && atomic_write(&af, "new contents", 12) == 0 && atomic_commit(&af, &e) == 0,
          "atomic write: %s", e.msg);
    text = (char *)read_all(path, &len);
    CHECK(strcmp(text, "new contents") == 0, "commit did not replace the target: %s", text);
    free(text);
    struct stat sb;
    stat(path, &sb);
    mode_t mask = umask(0);
    umask(mask);
    CHECK((sb.st_mode & 0777) == (0666 & ~mask), "committed file has mode %o, expected %o",
          (unsigned)(sb.st_mode & 0777), (unsigned)(0666 & ~mask));

    /* failures come back as one line each, the target untouched and no temporary left: a
     * directory as the path, a missing directory, and writes past the file size limit (a full
     * disk), which are sticky: later writes do nothing and the commit returns the first failure */
    char sub[300];
    path_in(td, "a_dir", sub, sizeof sub);
    mkdir(sub, 0755);
    CHECK(atomic_write_text(sub, "x", &e) == -1 && strstr(e.msg, "it is a directory") && strstr(e.msg, "a_dir"),
          "a file over a directory: '%s'", e.msg);
    /* ... and a FIFO, which the rename would replace (a device likewise: test_cli as root) */
    char fifo[300];
    path_in(td, "a_fifo", fifo, sizeof fifo);
    struct stat fs;
    CHECK(mkfifo(fifo, 0644) == 0 && atomic_write_text(fifo, "x", &e) == -1 && strstr(e.msg, "it is a FIFO") &&
              stat(fifo, &fs) == 0 && S_ISFIFO(fs.st_mode),
          "a file over a FIFO: '%s'", e.msg);
    unlink(fifo);
    rmdir(sub);
    char dir_slash[300];
    snprintf(dir_slash, sizeof dir_slash, "%s/", td->dir);
    CHECK(atomic_open(&af, dir_slash, &e) == -1 && strstr(e.msg, "names a directory"), "a path ending in '/': '%s'",
          e.msg);
    CHECK(atomic_write_text("/nonexistent-seqpar-dir/a.txt", "x", &e) == -1 && strstr(e.msg, "nonexistent-seqpar-dir") &&
              strstr(e.msg, "writable") && !strchr(e.msg, '\n'),
          "a missing directory: '%s'", e.msg);
    struct rlimit old, low;
    getrlimit(RLIMIT_FSIZE, &old);
    low = old;
    low.rlim_cur = 64;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    const size_t nbig = (size_t)1 << 20; /* more than any stdio buffer: this write reaches the file */
    char *big = xmalloc(nbig);
    memset(big, 'x', nbig);
    setrlimit(RLIMIT_FSIZE, &low);
    const int o = atomic_open(&af, path, &e), w1 = atomic_write(&af, big, nbig), w2 = atomic_write(&af, "y", 1);
    const int c = atomic_commit(&af, &e);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    xfree(big);
    CHECK(o == 0 && w1 == -1 && w2 == -1 && c == -1 && strstr(e.msg, "File too large") && strstr(e.msg, "atomic.txt") &&
              strstr(e.msg, "disk full"),
          "writes past the size limit: open %d, writes %d %d, commit %d: '%s'", o, w1, w2, c, e.msg);
    text = (char *)read_all(path, &len);
    CHECK(strcmp(text, "new contents") == 0, "a failed write changed the target: %s", text);
    free(text);
}

/* Removes the temporary directory and its (flat) contents; checks no temp files were left. */
static void remove_temp_dir(const TempDir *td) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -c '\\.tmp\\.' > /dev/null", td->dir);
    CHECK(system(cmd) != 0, "temporary files left behind in %s", td->dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", td->dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", td->dir);
}

int main(void) {
    TempDir td;
    snprintf(td.dir, sizeof td.dir, "/tmp/test_io_XXXXXX");
    if (!mkdtemp(td.dir)) { perror("mkdtemp"); return 2; }
    test_safetensors_round_trip(&td);
    test_safetensors_half_types(&td);
    test_safetensors_errors(&td);
    test_config(&td);
    test_tokens(&td);
    test_recall();
    test_recall_fused();
    test_atomic(&td);
    remove_temp_dir(&td);
    return test_summary("test_io");
}
