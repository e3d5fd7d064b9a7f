/* libFuzzer target for the checkpoint loader: at start-up a small valid checkpoint is saved in a
 * private temporary directory; every input replaces its trainer_state.json and the whole
 * checkpoint is loaded (checkpoint_read_config, checkpoint_read: state parsing, checksum and
 * size checks of every file, config, weights, optimizer moments). This build skips checksum
 * mismatches (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) so the checks behind them are reached.
 * Any input must load or give a one-line error. */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "core/param_table.h"
#include "model/config.h"
#include "optim/adamw.h"

static char g_dir[256], g_state[300];
static AdamWConfig g_acfg;
static LlamaConfig g_cfg = { .hidden_size = 4, .intermediate_size = 8, .num_attention_heads = 2, .num_key_value_heads = 1,
                             .num_hidden_layers = 1, .vocab_size = 6, .head_dim = 2, .max_position_embeddings = 64,
                             .tie_word_embeddings = 0, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0 };
/* A small table (the loader does not check it against the architecture): 6 x 4 + 4 + 6 x 4. */
static ParamTensor g_tensors[3] = {
    { "model.embed_tokens.weight", 2, { 6, 4 }, 0, 24, 1 },
    { "model.norm.weight", 1, { 4, 0 }, 24, 4, 1 },
    { "lm_head.weight", 2, { 6, 4 }, 28, 24, 0 },
};
static ParamTable g_table = { g_tensors, 3, 52 };
static float g_params[52];

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}
static void cleanup(void) {
    char parent[256];
    snprintf(parent, sizeof parent, "%s", g_dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0;
    nftw(parent, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char parent[] = "/tmp/seqpar_fuzz_ck.XXXXXX";
    if (!mkdtemp(parent)) { perror("mkdtemp"); abort(); }
    snprintf(g_dir, sizeof g_dir, "%s/ck", parent);
    snprintf(g_state, sizeof g_state, "%s/trainer_state.json", g_dir);
    atexit(cleanup);
    for (int i = 0; i < 52; i++) g_params[i] = 0.01f * (float)(i - 26);
    adamw_config_default(&g_acfg);
    AdamW opt;
    adamw_init(&opt, &g_acfg, 0, g_table.total);
    TrainerState st;
    trainer_state_init(&st);
    st.step = 3;
    st.seq_len = 16;
    trainer_state_set(&st, "lr", "%a", 1e-3);
    SeqErr e;
    if (checkpoint_save(g_dir, &g_cfg, &g_table, g_params, &opt, &st, &e) != 0) die("%s", e.msg);
    adamw_free(&opt);
    if (getenv("SEQPAR_FUZZ_PRINT_SEED")) { /* how the committed seed was made */
        FILE *f = fopen(g_state, "rb");
        int ch;
        while ((ch = fgetc(f)) != EOF) putchar(ch);
        fclose(f);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_state, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
    SeqErr e;
    LlamaConfig c;
    if (checkpoint_read_config(g_dir, &c, &e) != 0) {
        if (strchr(e.msg, '\n') || !e.msg[0]) abort();
        return 0;
    }
    TrainerState st;
    AdamW opt;
    adamw_init(&opt, &g_acfg, 0, g_table.total);
    float params[52];
    if (checkpoint_read(g_dir, &g_cfg, &g_table, params, &opt, &st, &e) != 0) {
        if (strchr(e.msg, '\n') || !e.msg[0]) abort();
    } else if (st.step < 0 || st.n_settings > CKPT_MAX_SETTINGS) {
        abort();
    }
    adamw_free(&opt);
    return 0;
}
