/* Cluster descriptions (plan/cluster.h): every preset compiled into the binary loads, each field in a
 * plausible range and each value naming its source; an older file (tests/fixtures/clusters) loads
 * with the documented defaults and the simulator's attention rate unchanged; the GEMM and attention
 * rate tables interpolate to hand-computed values; single-field overrides from a command line; bad
 * files, bad overrides and unknown presets are refused with one line naming the problem. Run from
 * the repository root. No MPI. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "plan/cluster.h"
#include "testlib.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b) + 1e-15; }

/* Every preset: loads; its name is its file's; each field in range; each field has a source. */
static void test_presets(void) {
    int n = 0;
    for (int i = 0; i < cluster_preset_count(); i++) {
        const char *name = cluster_preset_name(i);
        const char *text = cluster_preset_text(name);
        if (!text) {
            CHECK(!strcmp(name, "this-machine") && i == cluster_preset_count() - 1, "preset %s has no text", name);
            continue;
        }
        n++;
        Cluster c;
        SeqErr e;
        if (cluster_resolve(name, &c, &e) != 0) {
            CHECK(0, "preset %s: %s", name, e.msg);
            continue;
        }
        CHECK(!strcmp(c.name, name), "preset %s calls itself '%s'", name, c.name);
        CHECK(c.description[0] && !strchr(c.description, '\n'), "preset %s: a one-line description", name);
        CHECK(c.nodes >= 1 && c.nodes <= 4096 && c.ranks_per_node >= 1 && c.ranks_per_node <= 64, "%s: %d x %d", name,
              c.nodes, c.ranks_per_node);
        CHECK(c.threads_per_rank >= 1 && c.threads_per_rank <= 256, "%s: threads %d", name, c.threads_per_rank);
        CHECK(c.device_mem_gib >= 8 && c.device_mem_gib <= 1024, "%s: device memory %g GiB", name, c.device_mem_gib);
        CHECK(c.host_mem_gib >= 64 && c.host_mem_gib <= 65536, "%s: host memory %g GiB", name, c.host_mem_gib);
        CHECK(c.d2h_gbs >= 1 && c.d2h_gbs <= 1000, "%s: device-to-host %g GB/s", name, c.d2h_gbs);
        CHECK(c.intra_gbs >= 10 && c.intra_gbs <= 2000 && c.intra_latency_us > 0 && c.intra_latency_us <= 100,
              "%s: intra %g GB/s, %g us", name, c.intra_gbs, c.intra_latency_us);
        CHECK(c.intra_kind == CLUSTER_INTRA_SWITCH && c.intra_node_gbs == 0, "%s: GPUs inside a node on a switch", name);
        CHECK(c.nics_per_node >= 1 && c.nics_per_node <= c.ranks_per_node && c.nic_gbs >= 1 && c.nic_gbs <= 200 &&
                  c.nic_latency_us > 0 && c.nic_latency_us <= 100,
              "%s: %d NICs of %g GB/s, %g us", name, c.nics_per_node, c.nic_gbs, c.nic_latency_us);
        CHECK(c.attn_backward_factor >= 2 && c.attn_backward_factor <= 4, "%s: backward factor %g", name,
              c.attn_backward_factor);
        int causal = 0, plain = 0;
        for (int k = 0; k < c.n_attn_curves; k++) {
            const ClusterAttnCurve *a = &c.attn_curves[k];
            causal += a->causal, plain += !a->causal;
            for (int j = 0; j < a->rate.n; j++)
                CHECK(a->rate.tflops[j] > 10 && a->rate.tflops[j] < 2000, "%s: attention curve %d: %g TFLOP/s", name, k,
                      a->rate.tflops[j]);
        }
        CHECK(causal >= 1 && plain >= 1, "%s: attention curves causal and not (%d, %d)", name, causal, plain);
        CHECK(c.gemm[PRECISION_FP32].n >= 1 && c.gemm[PRECISION_BF16].n >= 1, "%s: GEMM rates for fp32 and bf16", name);
        for (int p = 0; p < 2; p++)
            for (int j = 0; j < c.gemm[p].n; j++)
                CHECK(c.gemm[p].tflops[j] > 1 && c.gemm[p].tflops[j] < 2000, "%s: GEMM %g TFLOP/s", name,
                      c.gemm[p].tflops[j]);
        /* the sources: one non-empty line for every field the file gives, none for a field it lacks */
        json_error_t je;
        json_t *root = json_loads(text, 0, &je), *src = json_object_get(root, "sources"),
               *note = json_object_get(root, "note");
        CHECK(json_is_object(src), "%s: a \"sources\" object", name);
        CHECK(json_is_string(note) && strstr(json_string_value(note), "fitted"), "%s: the note on fitting", name);
        const char *key;
        json_t *v;
        int fields = 0;
        json_object_foreach(root, key, v) {
            if (!strcmp(key, "name") || !strcmp(key, "description") || !strcmp(key, "note") || !strcmp(key, "sources"))
                continue;
            fields++;
            json_t *s = json_object_get(src, key);
            CHECK(json_is_string(s) && strlen(json_string_value(s)) > 10, "%s: field \"%s\" names no source", name, key);
        }
        /* the 18 every preset gives, the per-peer limit where its nodes are wired pair by pair, and
           the merge's bytes where the preset counts them */
        const int want_fields = 18 + (json_object_get(root, "intra_peer_gbs") != NULL) +
                                (json_object_get(root, "attention_merge_bytes") != NULL);
        CHECK(c.device_mem_gbs > 100 && c.device_mem_gbs < 10000, "%s: memory bandwidth %g GB/s", name, c.device_mem_gbs);
        CHECK(fields == want_fields && (int)json_object_size(src) == fields, "%s: %d fields, %zu sources", name, fields,
              json_object_size(src));
        json_decref(root);
    }
    CHECK(n >= 9, "the presets: %d", n);
    const char *want[] = {"loongtrain-a800", "wallfacer-h100-8x8", "wallfacer-a100-16x2", "wallfacer-a100-8x4",
                          "wallfacer-a100-16x2-b", "fpdt-a100-40g", "fpdt-a100-80g", "lightseq-dgx-a100",
                          "h100-8x8-ndr400"};
    for (size_t i = 0; i < ARRAY_LEN(want); i++) CHECK(cluster_preset_text(want[i]), "no preset %s", want[i]);
    Cluster c;
    SeqErr e;
    CHECK(cluster_resolve("loongtrain-a800", &c, &e) == 0 && c.nodes == 8 && c.ranks_per_node == 8 && c.nics_per_node == 4,
          "LoongTrain's testbed: 8 x 8 with 4 NICs a node");
}

/* An older file: every field it has as before, the new ones at their defaults, the attention rate
 * of the simulator the same function of the block as before (hand-computed from its points). */
static void test_old_file(void) {
    Cluster c;
    SeqErr e;
    if (cluster_load("tests/fixtures/clusters/two-nodes.json", &c, &e) != 0) {
        CHECK(0, "two-nodes.json: %s", e.msg);
        return;
    }
    CHECK(c.nodes == 2 && c.ranks_per_node == 4 && c.intra_gbs == 100 && c.intra_latency_us == 1 &&
              c.nics_per_node == 2 && c.nic_gbs == 10 && c.nic_latency_us == 5 && c.attn_backward_factor == 2.5 &&
              c.attn.n == 3 && c.intra_node_gbs == 0,
          "two-nodes.json's fields");
    CHECK(c.threads_per_rank == 1 && c.device_mem_gib == 0 && c.host_mem_gib == 0 && c.d2h_gbs == 0 &&
              c.intra_kind == CLUSTER_INTRA_SWITCH && c.n_attn_curves == 0 && c.gemm[0].n == 0 && c.gemm[1].n == 0,
          "two-nodes.json's new fields at their defaults");
    /* points [128, 20], [1024, 60], [8192, 80]: 576 rows halfway between the first two */
    CHECK(near(cluster_attention_flops_per_s(&c, 576, 4096), 40e12) && near(cluster_attention_flops_per_s(&c, 9000, 9000), 80e12) &&
              near(cluster_attention_flops_per_s(&c, 5, 100), 20e12),
          "the default curve: %g", cluster_attention_flops_per_s(&c, 576, 4096));
    /* no curves by shape: every shape gets the default curve */
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 128, 1, 576, 576), 40e12) &&
              near(cluster_attention_rate(&c, PRECISION_FP32, 64, 0, 4608, 9000), 70e12),
          "old file by shape: %g", cluster_attention_rate(&c, PRECISION_FP32, 64, 0, 4608, 9000));
    CHECK(cluster_gemm_flops_per_s(&c, PRECISION_FP32, 100, 100, 100) == 0, "old file: no GEMM rate");
    /* an old file with a shared medium is shared memory inside */
    CHECK(cluster_parse("{\"nodes\": 1, \"ranks_per_node\": 4, \"intra_gbs\": 5, \"intra_node_gbs\": 8, "
                        "\"attention\": [[1, 1]]}", "t", &c, &e) == 0 && c.intra_kind == CLUSTER_INTRA_SHARED_MEMORY,
          "intra_node_gbs implies shared memory");
}

/* Every field through cluster_save and cluster_load unchanged. */
static void test_round_trip(void) {
    const char *text =
        "{\"name\": \"rt\", \"description\": \"one line\", \"nodes\": 3, \"ranks_per_node\": 4, \"threads_per_rank\": 6, "
        "\"device_mem_gib\": 40, \"host_mem_gib\": 512, \"d2h_gbs\": 20, \"intra_all_to_all\": \"shared_memory\", "
        "\"collectives\": \"direct\", "
        "\"intra_gbs\": 50, \"intra_node_gbs\": 120, \"intra_latency_us\": 2, \"nics_per_node\": 2, \"nic_gbs\": 12.5, "
        "\"nic_latency_us\": 7, \"attention_backward_factor\": 2.75, "
        "\"attention_rates\": [{\"precision\": \"bf16\", \"head_dim\": 128, \"causal\": true, \"points\": [[512, 100], [4096, 200]]}, "
        "{\"precision\": \"fp32\", \"head_dim\": 64, \"causal\": false, \"points\": [[256, 1.5]]}], "
        "\"gemm\": {\"fp32\": [[512, 2], [2048, 3]], \"bf16\": [[1024, 9]]}}";
    Cluster a, b;
    SeqErr e;
    char dir[] = "/tmp/test_cluster_XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/rt.json", dir);
    const int ok = cluster_parse(text, "rt", &a, &e) == 0 && cluster_save(path, &a, "test", &e) == 0 &&
                   cluster_load(path, &b, &e) == 0;
    CHECK(ok, "round trip: %s", ok ? "" : e.msg);
    if (ok) {
        CHECK(!strcmp(a.description, b.description) && a.threads_per_rank == 6 && b.threads_per_rank == 6 &&
                  b.device_mem_gib == 40 && b.host_mem_gib == 512 && b.d2h_gbs == 20 &&
                  b.intra_kind == CLUSTER_INTRA_SHARED_MEMORY && b.intra_node_gbs == 120 && b.nic_gbs == 12.5 &&
                  b.attn_backward_factor == 2.75 && a.collectives == CLUSTER_COLLECTIVES_DIRECT &&
                  b.collectives == CLUSTER_COLLECTIVES_DIRECT,
              "round trip: scalar fields");
        CHECK(b.n_attn_curves == 2 && b.attn_curves[0].precision == PRECISION_BF16 && b.attn_curves[0].causal == 1 &&
                  b.attn_curves[0].head_dim == 128 && b.attn_curves[0].rate.n == 2 && b.attn_curves[0].rate.tflops[1] == 200 &&
                  b.attn_curves[1].precision == PRECISION_FP32 && b.attn_curves[1].causal == 0,
              "round trip: attention curves");
        CHECK(b.gemm[PRECISION_FP32].n == 2 && b.gemm[PRECISION_FP32].x[1] == 2048 && b.gemm[PRECISION_BF16].n == 1 &&
                  b.gemm[PRECISION_BF16].tflops[0] == 9,
              "round trip: GEMM curves");
        /* without "attention", the default curve is the first of attention_rates */
        CHECK(a.attn.n == 2 && a.attn.x[1] == 4096 && a.attn.tflops[0] == 100, "the default curve");
    }
    unlink(path);
    rmdir(dir);
}

/* The rate tables at points computed by hand. */
static void test_interpolation(void) {
    const char *text =
        "{\"nodes\": 1, \"ranks_per_node\": 1, \"intra_gbs\": 1, \"attention\": [[1, 7]], "
        "\"attention_rates\": ["
        "{\"precision\": \"bf16\", \"head_dim\": 64, \"causal\": false, \"points\": [[1000, 100], [3000, 300]]}, "
        "{\"precision\": \"bf16\", \"head_dim\": 128, \"causal\": false, \"points\": [[1000, 200], [3000, 400]]}, "
        "{\"precision\": \"bf16\", \"head_dim\": 128, \"causal\": true, \"points\": [[1000, 50]]}], "
        "\"gemm\": {\"bf16\": [[256, 10], [1024, 100]]}}";
    Cluster c;
    SeqErr e;
    if (cluster_parse(text, "interp", &c, &e) != 0) {
        CHECK(0, "interp: %s", e.msg);
        return;
    }
    /* head dim 96 halfway between 64 (200 at 2000 rows) and 128 (300): 250; rows = the shorter side */
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 96, 0, 2000, 5000), 250e12), "hd 96: %g",
          cluster_attention_rate(&c, PRECISION_BF16, 96, 0, 2000, 5000));
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 112, 0, 5000, 1500), 225e12),
          "hd 112 at 1500 rows: %g", cluster_attention_rate(&c, PRECISION_BF16, 112, 0, 5000, 1500));
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 128, 1, 2000, 2000), 50e12), "causal: its own curve");
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 64, 1, 2000, 2000), 50e12), "causal hd 64: the nearest causal");
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 256, 0, 500, 800), 200e12), "hd 256 below the rows: 200");
    CHECK(near(cluster_attention_rate(&c, PRECISION_BF16, 32, 0, 3000, 9000), 300e12), "hd 32: hd 64's curve");
    CHECK(near(cluster_attention_rate(&c, PRECISION_FP32, 128, 0, 5, 5), 7e12), "fp32: the default curve");
    CHECK(near(cluster_attention_flops_per_s(&c, 100000, 100000), 7e12), "the simulator's curve: \"attention\"");
    /* GEMM size: cbrt(256 x 512 x 1024) = 512, a third of the way from 256 (10) to 1024 (100): 40 */
    CHECK(near(cluster_gemm_flops_per_s(&c, PRECISION_BF16, 256, 512, 1024), 40e12), "GEMM 512: %g",
          cluster_gemm_flops_per_s(&c, PRECISION_BF16, 256, 512, 1024));
    CHECK(near(cluster_gemm_flops_per_s(&c, PRECISION_BF16, 64, 64, 64), 10e12) &&
              near(cluster_gemm_flops_per_s(&c, PRECISION_BF16, 4096, 4096, 4096), 100e12),
          "GEMM outside the points: constant");
    CHECK(cluster_gemm_flops_per_s(&c, PRECISION_FP32, 512, 512, 512) == 0, "GEMM of a precision without a curve: 0");
    const ClusterCurve k = {.n = 3, .x = {1, 2, 4}, .tflops = {1, 3, 4}};
    CHECK(near(cluster_curve_at(&k, 3), 3.5) && near(cluster_curve_at(&k, 1.25), 1.5), "a curve");
}

/* Overrides: taken out of argv, applied, refused with one line naming the flag. */
static void test_overrides(void) {
    char a0[] = "seqpar", a1[] = "--nics-per-node", a2[] = "2", a3[] = "--schedule", a4[] = "ring",
         a5[] = "--nic-gbs=12.5", a6[] = "--intra-all-to-all", a7[] = "shared_memory", a8[] = "--intra-node-gbs",
         a9[] = "300";
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, NULL};
    int argc = 10;
    ClusterOverrides o;
    SeqErr e;
    CHECK(cluster_take_overrides(&argc, argv, &o, &e) == 0 && argc == 3 && !strcmp(argv[1], "--schedule") &&
              !strcmp(argv[2], "ring") && o.n == 4,
          "overrides taken out of argv (argc %d)", argc);
    Cluster c;
    CHECK(cluster_resolve("loongtrain-a800", &c, &e) == 0 && cluster_apply_overrides(&c, &o, &e) == 0 &&
              c.nics_per_node == 2 && c.nic_gbs == 12.5 && c.intra_kind == CLUSTER_INTRA_SHARED_MEMORY &&
              c.intra_node_gbs == 300 && c.nodes == 8,
          "overrides applied");
    static const struct {
        const char *flag, *value, *words;
    } bad[] = {
        {"--nic-gbs", "-1", "--nic-gbs -1: \"nic_gbs\" must not be negative"},
        {"--nodes", "2.5", "--nodes '2.5' is not a whole number"},
        {"--nics-per-node", "9", "\"nics_per_node\" 9 exceeds \"ranks_per_node\" 8"},
        {"--threads-per-rank", "0", "\"threads_per_rank\" must be at least 1"},
        {"--device-mem-gib", "-4", "\"device_mem_gib\" must be 0 (not given) or positive"},
        {"--intra-all-to-all", "bus", "give switch or shared_memory"},
        {"--d2h-gbs", "fast", "is not a number"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char f[64], v[64];
        snprintf(f, sizeof f, "%s", bad[i].flag);
        snprintf(v, sizeof v, "%s", bad[i].value);
        char *av[] = {a0, f, v, NULL};
        int ac = 3;
        const int rc = cluster_take_overrides(&ac, av, &o, &e) != 0 || cluster_resolve("loongtrain-a800", &c, &e) != 0 ||
                       cluster_apply_overrides(&c, &o, &e) != 0;
        CHECK(rc && strstr(e.msg, bad[i].words) && !strchr(e.msg, '\n'), "override %s %s: %s", bad[i].flag,
              bad[i].value, rc ? e.msg : "accepted");
    }
    char *av[] = {a0, a1, NULL};
    int ac = 2;
    CHECK(cluster_take_overrides(&ac, av, &o, &e) != 0 && strstr(e.msg, "--nics-per-node needs a value"),
          "an override without its value");
}

/* Bad files, presets and names: one line naming the field or the problem, and the fix. */
static void test_bad(void) {
    static const struct {
        const char *json, *words;
    } cases[] = {
        {"{\"nodes\": 1, \"intra_gbs\": 1, \"attention\": [[1, 1]]}", "has no \"ranks_per_node\": add it"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"device_mem_gib\": -1}",
         "\"device_mem_gib\" must be 0 (not given) or positive"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"host_mem_gib\": -2}",
         "\"host_mem_gib\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"d2h_gbs\": -3}", "\"d2h_gbs\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"threads_per_rank\": 0}",
         "\"threads_per_rank\" must be at least 1"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"threads_per_rank\": 1.5}",
         "\"threads_per_rank\" must be a whole number"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"nic_gbs\": -1}",
         "\"nic_gbs\" must not be negative"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"intra_peer_gbs\": -1}",
         "\"intra_peer_gbs\" must be 0 (no limit beyond the ports) or positive (got -1)"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"attention_merge_bytes\": -1}",
         "\"attention_merge_bytes\" must be 0 (not counted) or positive (got -1)"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"nic_latency_us\": -1}",
         "\"nic_latency_us\" is -1"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"intra_all_to_all\": \"bus\"}",
         "\"intra_all_to_all\" must be \"switch\" or \"shared_memory\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"collectives\": \"tree\"}",
         "\"collectives\" must be \"nccl\" (NCCL's ring) or \"direct\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"intra_all_to_all\": \"switch\", "
         "\"intra_node_gbs\": 5}",
         "set it to 0 or say \"shared_memory\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"nic_gb\": 3}",
         "unknown key \"nic_gb\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1}", "\"attention\" must be a list"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention_rates\": [{\"precision\": \"fp16\", "
         "\"head_dim\": 64, \"causal\": false, \"points\": [[1, 1]]}]}",
         "curve 1 needs \"precision\": \"fp32\" or \"bf16\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention_rates\": [{\"precision\": \"bf16\", "
         "\"head_dim\": 64, \"points\": [[1, 1]]}]}",
         "curve 1 needs \"causal\": true or false"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention_rates\": [{\"precision\": \"bf16\", "
         "\"head_dim\": 0, \"causal\": true, \"points\": [[1, 1]]}]}",
         "curve 1 needs \"head_dim\""},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention_rates\": [{\"precision\": \"bf16\", "
         "\"head_dim\": 64, \"causal\": true, \"points\": [[10, 1], [5, 2]]}]}",
         "curve 1 points must be in increasing rows"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention_rates\": [{\"precision\": \"bf16\", "
         "\"head_dim\": 64, \"causal\": true, \"points\": [[10, -1]]}]}",
         "tflops > 0"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention_rates\": ["
         "{\"precision\": \"bf16\", \"head_dim\": 64, \"causal\": true, \"points\": [[10, 1]]}, "
         "{\"precision\": \"bf16\", \"head_dim\": 64, \"causal\": true, \"points\": [[20, 1]]}]}",
         "curve 2 repeats curve 1"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"gemm\": {\"fp8\": [[1, 1]]}}",
         "\"gemm\" has \"fp8\": its keys are the precisions fp32 and bf16"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"gemm\": {\"bf16\": [[512, 1], [256, 2]]}}",
         "\"gemm\" \"bf16\" points must be in increasing size"},
        {"{\"nodes\": 1, \"ranks_per_node\": 2, \"intra_gbs\": 1, \"attention\": [[1, 1]], \"gemm\": {\"bf16\": [[512]]}}",
         "\"gemm\" \"bf16\" point 1 must be [size, tflops]"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        Cluster c;
        SeqErr e;
        const int rc = cluster_parse(cases[i].json, "bad", &c, &e);
        CHECK(rc != 0 && strstr(e.msg, cases[i].words) && !strchr(e.msg, '\n'), "bad cluster %zu: %s", i,
              rc ? e.msg : "accepted");
    }
    Cluster c;
    SeqErr e;
    int rc = cluster_resolve("loongtrain-a900", &c, &e);
    CHECK(rc != 0 && strstr(e.msg, "neither a preset nor a readable file: give a preset (") &&
              strstr(e.msg, "loongtrain-a800") && !strchr(e.msg, '\n'),
          "an unknown preset: %s", rc ? e.msg : "accepted");
    setenv("SEQPAR_THIS_MACHINE", "/nonexistent/this-machine.json", 1);
    rc = cluster_resolve("this-machine", &c, &e);
    CHECK(rc != 0 && strstr(e.msg, "seqpar calibrate --save") && !strchr(e.msg, '\n'), "this-machine unmeasured: %s",
          rc ? e.msg : "accepted");
    setenv("SEQPAR_THIS_MACHINE", "tests/fixtures/clusters/two-nodes.json", 1);
    CHECK(cluster_resolve("this-machine", &c, &e) == 0 && c.nodes == 2, "this-machine reads its file");
    unsetenv("SEQPAR_THIS_MACHINE");
    CHECK(cluster_resolve("tests/fixtures/clusters/two-nodes.json", &c, &e) == 0 && c.ranks_per_node == 4,
          "a file by its path");
}

int main(void) {
    test_presets();
    test_old_file();
    test_round_trip();
    test_interpolation();
    test_overrides();
    test_bad();
    return test_summary("test_cluster");
}
