/* A cluster for the step simulator and the planner: see cluster.h. */
#include "plan/cluster.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/atomic_file.h"

/* The presets, generated at build time from the JSON files of clusters/ (clusters/embed.sh), in name order. */
extern const char *const cluster_preset_names[];
extern const char *const cluster_preset_texts[];
extern const int cluster_preset_n;

#define THIS_MACHINE "this-machine"

/* Every key a cluster file may hold; anything else is refused as a typo. */
static const char *const KEYS[] = {
    "name", "description", "source", "sources", "note", "nodes", "ranks_per_node", "threads_per_rank",
    "device_mem_gib", "host_mem_gib", "d2h_gbs", "device_mem_gbs", "step_overhead_ms", "collectives", "intra_all_to_all", "intra_gbs", "intra_node_gbs", "intra_peer_gbs",
    "intra_latency_us", "nics_per_node", "nic_gbs", "nic_flows", "nic_latency_us", "attention", "attention_backward_factor",
    "attention_merge_bytes",
    "attention_rates", "gemm"};

/* A number field of the object: required ones must be there; whole ones must be whole; -1 with one
 * line otherwise. */
static int number(json_t *o, const char *origin, const char *key, int required, int whole, double fallback,
                  double *out, SeqErr *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return seq_err(e, "cluster '%s' has no \"%s\": add it (a number)", origin, key);
        *out = fallback;
        return 0;
    }
    if (!json_is_number(v)) return seq_err(e, "cluster '%s': \"%s\" must be a number", origin, key);
    *out = json_number_value(v);
    if (whole && (*out != floor(*out) || fabs(*out) > 1e9))
        return seq_err(e, "cluster '%s': \"%s\" must be a whole number (got %g)", origin, key, *out);
    return 0;
}

/* Points [[x, y], ...] (1 to CLUSTER_RATE_POINTS of them) into k; `what` names them, xname and yname
 * their coordinates (rate points: y "tflops"). */
static int points_of(json_t *pts, const char *origin, const char *what, const char *xname, const char *yname,
                     ClusterCurve *k, SeqErr *e) {
    if (!json_is_array(pts) || !json_array_size(pts) || json_array_size(pts) > CLUSTER_RATE_POINTS)
        return seq_err(e, "cluster '%s': %s must be a list of 1 to %d [%s, %s] points", origin, what,
                       CLUSTER_RATE_POINTS, xname, yname);
    for (size_t i = 0; i < json_array_size(pts); i++) {
        json_t *p = json_array_get(pts, i);
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_number(json_array_get(p, 0)) ||
            !json_is_number(json_array_get(p, 1)))
            return seq_err(e, "cluster '%s': %s point %zu must be [%s, %s]", origin, what, i + 1, xname, yname);
        k->x[i] = json_number_value(json_array_get(p, 0));
        k->tflops[i] = json_number_value(json_array_get(p, 1));
    }
    k->n = (int)json_array_size(pts);
    return 0;
}
static int points(json_t *pts, const char *origin, const char *what, const char *xname, ClusterCurve *k, SeqErr *e) {
    return points_of(pts, origin, what, xname, "tflops", k, e);
}

static int precision_of(json_t *v, int *out) {
    if (!json_is_string(v)) return -1;
    *out = precision_parse(json_string_value(v));
    return *out < 0 ? -1 : 0;
}

/* "attention_rates": [{"precision": "bf16", "head_dim": 128, "causal": false, "points": [[rows, tflops], ...]}, ...] */
static int attention_rates(json_t *arr, const char *origin, Cluster *c, SeqErr *e) {
    if (!json_is_array(arr) || !json_array_size(arr) || json_array_size(arr) > CLUSTER_ATTN_CURVES)
        return seq_err(e, "cluster '%s': \"attention_rates\" must be a list of 1 to %d curves {\"precision\", "
                       "\"head_dim\", \"causal\", \"points\"}", origin, CLUSTER_ATTN_CURVES);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *o = json_array_get(arr, i);
        ClusterAttnCurve *k = &c->attn_curves[i];
        char what[64];
        snprintf(what, sizeof what, "\"attention_rates\" curve %zu", i + 1);
        if (!json_is_object(o)) return seq_err(e, "cluster '%s': %s must be an object", origin, what);
        const char *key;
        json_t *v;
        json_object_foreach(o, key, v) if (strcmp(key, "precision") && strcmp(key, "head_dim") && strcmp(key, "causal") &&
                                           strcmp(key, "points") && strcmp(key, "source"))
            return seq_err(e, "cluster '%s': %s has an unknown key \"%s\": give precision, head_dim, causal, points",
                           origin, what, key);
        if (precision_of(json_object_get(o, "precision"), &k->precision) != 0)
            return seq_err(e, "cluster '%s': %s needs \"precision\": \"fp32\" or \"bf16\"", origin, what);
        json_t *hd = json_object_get(o, "head_dim");
        if (!json_is_integer(hd) || json_integer_value(hd) < 1 || json_integer_value(hd) > 65536)
            return seq_err(e, "cluster '%s': %s needs \"head_dim\": a whole number from 1 to 65536", origin, what);
        k->head_dim = (int)json_integer_value(hd);
        json_t *causal = json_object_get(o, "causal");
        if (!json_is_boolean(causal)) return seq_err(e, "cluster '%s': %s needs \"causal\": true or false", origin, what);
        k->causal = json_is_true(causal);
        snprintf(what, sizeof what, "\"attention_rates\" curve %zu's \"points\"", i + 1);
        if (points(json_object_get(o, "points"), origin, what, "rows", &k->rate, e) != 0) return -1;
    }
    c->n_attn_curves = (int)json_array_size(arr);
    return 0;
}

/* "gemm": {"fp32": [[size, tflops], ...], "bf16": [...]} */
static int gemm_rates(json_t *o, const char *origin, Cluster *c, SeqErr *e) {
    if (!json_is_object(o)) return seq_err(e, "cluster '%s': \"gemm\" must be an object {\"fp32\": [[size, tflops], ...], \"bf16\": ...}", origin);
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        const int p = precision_parse(key);
        if (p < 0) return seq_err(e, "cluster '%s': \"gemm\" has \"%s\": its keys are the precisions fp32 and bf16", origin, key);
        char what[48];
        snprintf(what, sizeof what, "\"gemm\" \"%s\"", key);
        if (points(v, origin, what, "size", &c->gemm[p], e) != 0) return -1;
    }
    return 0;
}

int cluster_parse(const char *text, const char *origin, Cluster *c, SeqErr *e) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return seq_err(e, "cluster '%s': %s (line %d): give a JSON cluster file", origin, je.text, je.line);
    int rc = -1;
    if (!json_is_object(root)) {
        seq_err(e, "cluster '%s' is not a JSON object", origin);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        size_t i = 0;
        while (i < ARRAY_LEN(KEYS) && strcmp(KEYS[i], key)) i++;
        if (i == ARRAY_LEN(KEYS)) {
            seq_err(e, "cluster '%s' has an unknown key \"%s\": see the cluster file reference in docs/planner.md",
                    origin, key);
            goto out;
        }
    }
    json_t *name = json_object_get(root, "name"), *desc = json_object_get(root, "description");
    snprintf(c->name, sizeof c->name, "%s", json_is_string(name) ? json_string_value(name) : origin);
    if (json_is_string(desc)) snprintf(c->description, sizeof c->description, "%s", json_string_value(desc));
    double nodes = 0, rpn = 0, nics = 0, threads = 0;
    if (number(root, origin, "nodes", 1, 1, 0, &nodes, e) || number(root, origin, "ranks_per_node", 1, 1, 0, &rpn, e) ||
        number(root, origin, "threads_per_rank", 0, 1, 1, &threads, e) ||
        number(root, origin, "device_mem_gib", 0, 0, 0, &c->device_mem_gib, e) ||
        number(root, origin, "host_mem_gib", 0, 0, 0, &c->host_mem_gib, e) ||
        number(root, origin, "d2h_gbs", 0, 0, 0, &c->d2h_gbs, e) ||
        number(root, origin, "device_mem_gbs", 0, 0, 0, &c->device_mem_gbs, e) ||
        number(root, origin, "step_overhead_ms", 0, 0, 0, &c->step_overhead_ms, e) ||
        number(root, origin, "intra_gbs", 1, 0, 0, &c->intra_gbs, e) ||
        number(root, origin, "intra_node_gbs", 0, 0, 0, &c->intra_node_gbs, e) ||
        number(root, origin, "intra_peer_gbs", 0, 0, 0, &c->intra_peer_gbs, e) ||
        number(root, origin, "intra_latency_us", 0, 0, 0, &c->intra_latency_us, e) ||
        number(root, origin, "nics_per_node", 0, 1, 1, &nics, e) || number(root, origin, "nic_gbs", 0, 0, 0, &c->nic_gbs, e) ||
        number(root, origin, "nic_latency_us", 0, 0, 0, &c->nic_latency_us, e) ||
        number(root, origin, "attention_backward_factor", 0, 0, 2.5, &c->attn_backward_factor, e) ||
        number(root, origin, "attention_merge_bytes", 0, 0, 0, &c->attn_merge_bytes, e))
        goto out;
    c->nodes = (int)nodes;
    c->ranks_per_node = (int)rpn;
    c->nics_per_node = (int)nics;
    c->threads_per_rank = (int)threads;
    json_t *kind = json_object_get(root, "intra_all_to_all");
    c->intra_kind = c->intra_node_gbs > 0 ? CLUSTER_INTRA_SHARED_MEMORY : CLUSTER_INTRA_SWITCH;
    if (kind) {
        const char *k = json_is_string(kind) ? json_string_value(kind) : "";
        if (!strcmp(k, "switch")) c->intra_kind = CLUSTER_INTRA_SWITCH;
        else if (!strcmp(k, "shared_memory")) c->intra_kind = CLUSTER_INTRA_SHARED_MEMORY;
        else {
            seq_err(e, "cluster '%s': \"intra_all_to_all\" must be \"switch\" or \"shared_memory\"", origin);
            goto out;
        }
    }
    json_t *coll = json_object_get(root, "collectives");
    c->collectives = CLUSTER_COLLECTIVES_RING;
    if (coll) {
        const char *k = json_is_string(coll) ? json_string_value(coll) : "";
        if (!strcmp(k, "direct")) c->collectives = CLUSTER_COLLECTIVES_DIRECT;
        else if (strcmp(k, "nccl")) {
            seq_err(e, "cluster '%s': \"collectives\" must be \"nccl\" (NCCL's ring) or \"direct\" (seqpar's CPU "
                       "collectives)", origin);
            goto out;
        }
    }
    json_t *rates = json_object_get(root, "attention_rates"), *gemm = json_object_get(root, "gemm");
    json_t *flows = json_object_get(root, "nic_flows");
    if (flows && points_of(flows, origin, "\"nic_flows\"", "flows", "gbs", &c->nic_flows, e) != 0) goto out;
    if (rates && attention_rates(rates, origin, c, e) != 0) goto out;
    if (gemm && gemm_rates(gemm, origin, c, e) != 0) goto out;
    json_t *pts = json_object_get(root, "attention");
    if (pts || !c->n_attn_curves) {
        if (points(pts, origin, "\"attention\"", "rows", &c->attn, e) != 0) goto out;
    } else { /* the default curve: the first of attention_rates */
        c->attn = c->attn_curves[0].rate;
    }
    char *bad = cluster_check(c);
    if (bad) {
        seq_err(e, "cluster '%s': %s", origin, bad);
        xfree(bad);
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int cluster_load(const char *path, Cluster *c, SeqErr *e) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        memset(c, 0, sizeof *c);
        return seq_err(e, "cluster '%s': %s (line %d): give a JSON cluster file", path, je.text, je.line);
    }
    char *text = json_dumps(root, JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return seq_err(e, "cluster '%s': cannot read it back (out of memory?)", path);
    const int rc = cluster_parse(text, path, c, e);
    free(text);
    return rc;
}

static json_t *points_json(const ClusterCurve *k) {
    json_t *pts = json_array();
    for (int i = 0; i < k->n; i++) {
        json_t *p = json_array();
        json_array_append_new(p, json_real(k->x[i]));
        json_array_append_new(p, json_real(k->tflops[i]));
        json_array_append_new(pts, p);
    }
    return pts;
}

int cluster_save(const char *path, const Cluster *c, const char *source, SeqErr *e) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(c->name));
    if (c->description[0]) json_object_set_new(o, "description", json_string(c->description));
    json_object_set_new(o, "source", json_string(source ? source : ""));
    json_object_set_new(o, "nodes", json_integer(c->nodes));
    json_object_set_new(o, "ranks_per_node", json_integer(c->ranks_per_node));
    json_object_set_new(o, "threads_per_rank", json_integer(c->threads_per_rank));
    json_object_set_new(o, "device_mem_gib", json_real(c->device_mem_gib));
    json_object_set_new(o, "host_mem_gib", json_real(c->host_mem_gib));
    json_object_set_new(o, "d2h_gbs", json_real(c->d2h_gbs));
    json_object_set_new(o, "device_mem_gbs", json_real(c->device_mem_gbs));
    json_object_set_new(o, "step_overhead_ms", json_real(c->step_overhead_ms));
    json_object_set_new(o, "collectives", json_string(c->collectives == CLUSTER_COLLECTIVES_DIRECT ? "direct" : "nccl"));
    json_object_set_new(o, "intra_all_to_all",
                        json_string(c->intra_kind == CLUSTER_INTRA_SHARED_MEMORY ? "shared_memory" : "switch"));
    json_object_set_new(o, "intra_gbs", json_real(c->intra_gbs));
    json_object_set_new(o, "intra_node_gbs", json_real(c->intra_node_gbs));
    json_object_set_new(o, "intra_peer_gbs", json_real(c->intra_peer_gbs));
    json_object_set_new(o, "intra_latency_us", json_real(c->intra_latency_us));
    json_object_set_new(o, "nics_per_node", json_integer(c->nics_per_node));
    json_object_set_new(o, "nic_gbs", json_real(c->nic_gbs));
    if (c->nic_flows.n) json_object_set_new(o, "nic_flows", points_json(&c->nic_flows));
    json_object_set_new(o, "nic_latency_us", json_real(c->nic_latency_us));
    json_object_set_new(o, "attention", points_json(&c->attn));
    json_object_set_new(o, "attention_backward_factor", json_real(c->attn_backward_factor));
    if (c->attn_merge_bytes > 0) json_object_set_new(o, "attention_merge_bytes", json_real(c->attn_merge_bytes));
    if (c->n_attn_curves) {
        json_t *arr = json_array();
        for (int i = 0; i < c->n_attn_curves; i++) {
            const ClusterAttnCurve *k = &c->attn_curves[i];
            json_t *x = json_object();
            json_object_set_new(x, "precision", json_string(precision_name(k->precision)));
            json_object_set_new(x, "head_dim", json_integer(k->head_dim));
            json_object_set_new(x, "causal", json_boolean(k->causal));
            json_object_set_new(x, "points", points_json(&k->rate));
            json_array_append_new(arr, x);
        }
        json_object_set_new(o, "attention_rates", arr);
    }
    if (c->gemm[0].n || c->gemm[1].n) {
        json_t *g = json_object();
        for (int p = 0; p < 2; p++)
            if (c->gemm[p].n) json_object_set_new(g, precision_name(p), points_json(&c->gemm[p]));
        json_object_set_new(o, "gemm", g);
    }
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!text) return seq_err(e, "cluster '%s': cannot format the file (out of memory?)", path);
    const size_t n = strlen(text);
    char *line = xmalloc(n + 2);
    memcpy(line, text, n);
    line[n] = '\n', line[n + 1] = 0;
    free(text);
    int rc = 0;
    if (path) rc = atomic_write_text(path, line, e);
    else fputs(line, stdout);
    xfree(line);
    return rc;
}

/* NULL, or what is wrong with curve k (x at least min_x, increasing; y positive), its coordinates
 * named xname and yname (rate curves: "tflops"). */
static char *points_check(const ClusterCurve *k, const char *what, const char *xname, const char *yname, double min_x) {
    if (k->n < 1 || k->n > CLUSTER_RATE_POINTS)
        return xstrdup_printf("%s needs 1 to %d [%s, %s] points", what, CLUSTER_RATE_POINTS, xname, yname);
    for (int i = 0; i < k->n; i++) {
        if (!(k->x[i] >= min_x) || !(k->tflops[i] > 0) || !isfinite(k->x[i]) || !isfinite(k->tflops[i]))
            return xstrdup_printf("%s point %d must have %s >= %g and %s > 0", what, i + 1, xname, min_x, yname);
        if (i && !(k->x[i] > k->x[i - 1]))
            return xstrdup_printf("%s points must be in increasing %s (point %d)", what, xname, i + 1);
    }
    return NULL;
}
static char *curve_check(const ClusterCurve *k, const char *what, const char *xname, double min_x) {
    return points_check(k, what, xname, "tflops", min_x);
}

/* A bandwidth, memory size or latency: finite and not negative (0: not given, where allowed). */
static int nonneg(double v) { return v >= 0 && isfinite(v); }

char *cluster_check(const Cluster *c) {
    if (c->nodes < 1) return xstrdup_printf("\"nodes\" must be at least 1 (got %d)", c->nodes);
    if (c->ranks_per_node < 1) return xstrdup_printf("\"ranks_per_node\" must be at least 1 (got %d)", c->ranks_per_node);
    if (c->threads_per_rank < 1)
        return xstrdup_printf("\"threads_per_rank\" must be at least 1 (got %d)", c->threads_per_rank);
    if (!nonneg(c->device_mem_gib))
        return xstrdup_printf("\"device_mem_gib\" must be 0 (not given) or positive (got %g)", c->device_mem_gib);
    if (!nonneg(c->host_mem_gib))
        return xstrdup_printf("\"host_mem_gib\" must be 0 (not given) or positive (got %g)", c->host_mem_gib);
    if (!nonneg(c->d2h_gbs)) return xstrdup_printf("\"d2h_gbs\" must be 0 (not given) or positive (got %g)", c->d2h_gbs);
    if (!nonneg(c->device_mem_gbs))
        return xstrdup_printf("\"device_mem_gbs\" must be 0 (not given) or positive (got %g)", c->device_mem_gbs);
    if (!nonneg(c->attn_merge_bytes))
        return xstrdup_printf("\"attention_merge_bytes\" must be 0 (not counted) or positive (got %g)",
                              c->attn_merge_bytes);
    if (!nonneg(c->step_overhead_ms))
        return xstrdup_printf("\"step_overhead_ms\" must be 0 (none) or positive (got %g)", c->step_overhead_ms);
    if (c->collectives != CLUSTER_COLLECTIVES_RING && c->collectives != CLUSTER_COLLECTIVES_DIRECT)
        return xstrdup("\"collectives\" must be \"nccl\" or \"direct\"");
    if (c->intra_kind != CLUSTER_INTRA_SWITCH && c->intra_kind != CLUSTER_INTRA_SHARED_MEMORY)
        return xstrdup("\"intra_all_to_all\" must be \"switch\" or \"shared_memory\"");
    if (!(c->intra_gbs > 0) || !isfinite(c->intra_gbs))
        return xstrdup_printf("\"intra_gbs\" must be positive (got %g)", c->intra_gbs);
    if (!nonneg(c->intra_node_gbs)) return xstrdup("\"intra_node_gbs\" must be 0 (no shared limit) or positive");
    if (!nonneg(c->intra_peer_gbs))
        return xstrdup_printf("\"intra_peer_gbs\" must be 0 (no limit beyond the ports) or positive (got %g)", c->intra_peer_gbs);
    if (c->intra_node_gbs > 0 && c->intra_kind == CLUSTER_INTRA_SWITCH)
        return xstrdup_printf("\"intra_node_gbs\" %g is a shared medium's limit, but \"intra_all_to_all\" is \"switch\": "
                              "set it to 0 or say \"shared_memory\"", c->intra_node_gbs);
    if (!nonneg(c->intra_latency_us) || !nonneg(c->nic_latency_us))
        return xstrdup_printf("latencies must not be negative (\"%s\" is %g)",
                              nonneg(c->intra_latency_us) ? "nic_latency_us" : "intra_latency_us",
                              nonneg(c->intra_latency_us) ? c->nic_latency_us : c->intra_latency_us);
    if (c->nics_per_node < 0) return xstrdup_printf("\"nics_per_node\" must not be negative (got %d)", c->nics_per_node);
    if (!nonneg(c->nic_gbs)) return xstrdup_printf("\"nic_gbs\" must not be negative (got %g)", c->nic_gbs);
    if (c->nodes > 1 && (c->nics_per_node < 1 || !(c->nic_gbs > 0)))
        return xstrdup_printf("%d nodes need \"nics_per_node\" >= 1 and a positive \"nic_gbs\"", c->nodes);
    if (c->nic_flows.n) {
        char *bad = points_check(&c->nic_flows, "\"nic_flows\"", "flows", "gbs", 1);
        if (bad) return bad;
        for (int i = 0; i < c->nic_flows.n; i++)
            if (!(c->nic_flows.tflops[i] <= c->nic_gbs))
                return xstrdup_printf("\"nic_flows\" point %d must have 0 < gbs <= \"nic_gbs\" (%g: the most a NIC "
                                      "carries; got %g)", i + 1, c->nic_gbs, c->nic_flows.tflops[i]);
    }
    if (c->nics_per_node > c->ranks_per_node)
        return xstrdup_printf("\"nics_per_node\" %d exceeds \"ranks_per_node\" %d: a NIC serves at least one rank",
                              c->nics_per_node, c->ranks_per_node);
    if (c->n_attn_curves < 0 || c->n_attn_curves > CLUSTER_ATTN_CURVES)
        return xstrdup_printf("\"attention_rates\" holds 0 to %d curves", CLUSTER_ATTN_CURVES);
    for (int i = 0; i < c->n_attn_curves; i++) {
        const ClusterAttnCurve *k = &c->attn_curves[i];
        char what[48];
        snprintf(what, sizeof what, "\"attention_rates\" curve %d", i + 1);
        if (k->precision != PRECISION_FP32 && k->precision != PRECISION_BF16)
            return xstrdup_printf("%s: \"precision\" must be fp32 or bf16", what);
        if (k->head_dim < 1) return xstrdup_printf("%s: \"head_dim\" must be at least 1 (got %d)", what, k->head_dim);
        if (k->causal != 0 && k->causal != 1) return xstrdup_printf("%s: \"causal\" must be true or false", what);
        char *bad = curve_check(&k->rate, what, "rows", 1);
        if (bad) return bad;
        for (int j = 0; j < i; j++)
            if (c->attn_curves[j].precision == k->precision && c->attn_curves[j].head_dim == k->head_dim &&
                c->attn_curves[j].causal == k->causal)
                return xstrdup_printf("%s repeats curve %d (%s, head_dim %d, %s): give each shape once", what, j + 1,
                                      precision_name(k->precision), k->head_dim, k->causal ? "causal" : "not causal");
    }
    if (c->attn.n < 1) return xstrdup("\"attention\" needs at least one [rows, tflops] point");
    char *bad = curve_check(&c->attn, "\"attention\"", "rows", 1);
    if (bad) return bad;
    if (!(c->attn_backward_factor > 0) || !isfinite(c->attn_backward_factor))
        return xstrdup("\"attention_backward_factor\" must be positive");
    for (int p = 0; p < 2; p++)
        if (c->gemm[p].n) {
            char what[32];
            snprintf(what, sizeof what, "\"gemm\" \"%s\"", precision_name(p));
            if ((bad = curve_check(&c->gemm[p], what, "size", 1))) return bad;
        }
    return NULL;
}

double cluster_nic_gbs(const Cluster *c, double flows) {
    return c->nic_flows.n ? cluster_curve_at(&c->nic_flows, flows) : c->nic_gbs;
}

double cluster_curve_at(const ClusterCurve *k, double x) {
    const int n = k->n;
    if (n < 1) return 0;
    if (x <= k->x[0]) return k->tflops[0];
    for (int i = 1; i < n; i++)
        if (x <= k->x[i]) {
            const double f = (x - k->x[i - 1]) / (k->x[i] - k->x[i - 1]);
            return k->tflops[i - 1] + f * (k->tflops[i] - k->tflops[i - 1]);
        }
    return k->tflops[n - 1];
}

double cluster_attention_flops_per_s(const Cluster *c, int q_rows, int kv_rows) {
    return cluster_curve_at(&c->attn, q_rows < kv_rows ? q_rows : kv_rows) * 1e12;
}

double cluster_attention_rate(const Cluster *c, int precision, int head_dim, int causal, int q_rows, int kv_rows) {
    const double rows = q_rows < kv_rows ? q_rows : kv_rows;
    /* the curves of the precision, of the asked causality where there is one */
    int want_causal = -1;
    for (int i = 0; i < c->n_attn_curves; i++)
        if (c->attn_curves[i].precision == precision && (want_causal < 0 || c->attn_curves[i].causal == !!causal))
            want_causal = c->attn_curves[i].causal;
    if (want_causal < 0) return cluster_attention_flops_per_s(c, q_rows, kv_rows);
    const ClusterAttnCurve *below = NULL, *above = NULL; /* nearest head_dim <= and >= the asked one */
    for (int i = 0; i < c->n_attn_curves; i++) {
        const ClusterAttnCurve *k = &c->attn_curves[i];
        if (k->precision != precision || k->causal != want_causal) continue;
        if (k->head_dim <= head_dim && (!below || k->head_dim > below->head_dim)) below = k;
        if (k->head_dim >= head_dim && (!above || k->head_dim < above->head_dim)) above = k;
    }
    if (!below) below = above;
    if (!above) above = below;
    const double lo = cluster_curve_at(&below->rate, rows), hi = cluster_curve_at(&above->rate, rows);
    if (above->head_dim == below->head_dim) return lo * 1e12;
    const double f = (double)(head_dim - below->head_dim) / (above->head_dim - below->head_dim);
    return (lo + f * (hi - lo)) * 1e12;
}

double cluster_gemm_flops_per_s(const Cluster *c, int precision, double m, double n, double k) {
    if (precision != PRECISION_FP32 && precision != PRECISION_BF16) return 0;
    return cluster_curve_at(&c->gemm[precision], cbrt(m * n * k)) * 1e12;
}

int cluster_node_of(const Cluster *c, int r) { return r / c->ranks_per_node; }

int cluster_nic_of(const Cluster *c, int r) {
    const int nics = c->nics_per_node > 0 ? c->nics_per_node : 1;
    return (r % c->ranks_per_node) * nics / c->ranks_per_node;
}

/* ---- presets ---- */

int cluster_preset_count(void) { return cluster_preset_n + 1; }

const char *cluster_preset_name(int i) {
    if (i < 0 || i > cluster_preset_n) return NULL;
    return i < cluster_preset_n ? cluster_preset_names[i] : THIS_MACHINE;
}

const char *cluster_preset_text(const char *name) {
    for (int i = 0; i < cluster_preset_n; i++)
        if (!strcmp(cluster_preset_names[i], name)) return cluster_preset_texts[i];
    return NULL;
}

const char *cluster_this_machine_path(char *buf, size_t n) {
    const char *env = getenv("SEQPAR_THIS_MACHINE"), *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (env && *env) snprintf(buf, n, "%s", env);
    else if (xdg && *xdg) snprintf(buf, n, "%s/seqpar/this-machine.json", xdg);
    else snprintf(buf, n, "%s/.config/seqpar/this-machine.json", home && *home ? home : ".");
    return buf;
}

int cluster_resolve(const char *arg, Cluster *c, SeqErr *e) {
    const char *text = cluster_preset_text(arg);
    if (text) {
        char origin[96];
        snprintf(origin, sizeof origin, "preset %s", arg);
        return cluster_parse(text, origin, c, e);
    }
    if (!strcmp(arg, THIS_MACHINE)) {
        char path[4096];
        cluster_this_machine_path(path, sizeof path);
        FILE *f = fopen(path, "r");
        if (!f)
            return seq_err(e, "cluster this-machine: %s does not exist yet: measure this machine first with "
                           "'mpirun -np P seqpar calibrate --save'", path);
        fclose(f);
        return cluster_load(path, c, e);
    }
    FILE *f = fopen(arg, "r");
    if (!f) {
        char names[1024] = "";
        size_t used = 0;
        for (int i = 0; i < cluster_preset_count() && used + 2 < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", cluster_preset_name(i));
        return seq_err(e, "cluster '%s' is neither a preset nor a readable file: give a preset (%s; 'seqpar plan "
                       "--clusters' describes them) or a JSON cluster file", arg, names);
    }
    fclose(f);
    return cluster_load(arg, c, e);
}

/* ---- single-field overrides ---- */

typedef struct {
    const char *flag, *key;
    int kind; /* 0 whole number, 1 number, 2 switch|shared_memory, 3 nccl|direct */
} Override;
static const Override OVERRIDES[] = {
    {"--nodes", "nodes", 0},
    {"--ranks-per-node", "ranks_per_node", 0},
    {"--threads-per-rank", "threads_per_rank", 0},
    {"--device-mem-gib", "device_mem_gib", 1},
    {"--host-mem-gib", "host_mem_gib", 1},
    {"--d2h-gbs", "d2h_gbs", 1},
    {"--device-mem-gbs", "device_mem_gbs", 1},
    {"--step-overhead-ms", "step_overhead_ms", 1},
    {"--intra-gbs", "intra_gbs", 1},
    {"--intra-node-gbs", "intra_node_gbs", 1},
    {"--intra-peer-gbs", "intra_peer_gbs", 1},
    {"--intra-latency-us", "intra_latency_us", 1},
    {"--intra-all-to-all", "intra_all_to_all", 2},
    {"--collectives", "collectives", 3},
    {"--nics-per-node", "nics_per_node", 0},
    {"--nic-gbs", "nic_gbs", 1},
    {"--nic-latency-us", "nic_latency_us", 1},
};

int cluster_take_overrides(int *argc, char **argv, ClusterOverrides *o, SeqErr *e) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < *argc;) {
        const Override *ov = NULL;
        const char *value = NULL;
        int used = 0;
        for (size_t j = 0; j < ARRAY_LEN(OVERRIDES) && !ov; j++) {
            const size_t len = strlen(OVERRIDES[j].flag);
            if (!strcmp(argv[i], OVERRIDES[j].flag)) {
                if (i + 1 >= *argc) return seq_err(e, "%s needs a value (see --help)", OVERRIDES[j].flag);
                ov = &OVERRIDES[j], value = argv[i + 1], used = 2;
            } else if (!strncmp(argv[i], OVERRIDES[j].flag, len) && argv[i][len] == '=') {
                ov = &OVERRIDES[j], value = argv[i] + len + 1, used = 1;
            }
        }
        if (!ov) {
            if (!strcmp(argv[i], "--")) break;
            i++;
            continue;
        }
        int k = 0;
        while (k < o->n && strcmp(o->key[k], ov->key)) k++; /* the last of a repeated flag wins */
        if (k == o->n) {
            if (o->n == (int)ARRAY_LEN(o->key)) return seq_err(e, "too many cluster overrides");
            o->n++;
        }
        o->flag[k] = ov->flag, o->key[k] = ov->key, o->value[k] = value;
        for (int j = i; j + used <= *argc; j++) argv[j] = argv[j + used];
        *argc -= used;
    }
    return 0;
}

int cluster_apply_overrides(Cluster *c, const ClusterOverrides *o, SeqErr *e) {
    for (int i = 0; i < o->n; i++) {
        const Override *ov = NULL;
        for (size_t j = 0; j < ARRAY_LEN(OVERRIDES); j++)
            if (!strcmp(OVERRIDES[j].key, o->key[i])) ov = &OVERRIDES[j];
        if (!ov) return seq_err(e, "no cluster field \"%s\"", o->key[i]);
        const char *v = o->value[i];
        if (ov->kind == 3) {
            if (!strcmp(v, "nccl")) c->collectives = CLUSTER_COLLECTIVES_RING;
            else if (!strcmp(v, "direct")) c->collectives = CLUSTER_COLLECTIVES_DIRECT;
            else return seq_err(e, "%s '%s': give nccl (NCCL's ring) or direct (seqpar's CPU collectives)", ov->flag, v);
            continue;
        }
        if (ov->kind == 2) {
            if (!strcmp(v, "switch")) c->intra_kind = CLUSTER_INTRA_SWITCH, c->intra_node_gbs = 0;
            else if (!strcmp(v, "shared_memory")) c->intra_kind = CLUSTER_INTRA_SHARED_MEMORY;
            else return seq_err(e, "%s '%s': give switch or shared_memory", ov->flag, v);
            continue;
        }
        char *end;
        const double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || (ov->kind == 0 && (x != floor(x) || fabs(x) > 1e9)))
            return seq_err(e, "%s '%s' is not a%s number: e.g. %s", ov->flag, v, ov->kind == 0 ? " whole" : "",
                           ov->kind == 0 ? "4" : "25");
        if (!strcmp(ov->key, "nodes")) c->nodes = (int)x;
        else if (!strcmp(ov->key, "ranks_per_node")) c->ranks_per_node = (int)x;
        else if (!strcmp(ov->key, "threads_per_rank")) c->threads_per_rank = (int)x;
        else if (!strcmp(ov->key, "device_mem_gib")) c->device_mem_gib = x;
        else if (!strcmp(ov->key, "host_mem_gib")) c->host_mem_gib = x;
        else if (!strcmp(ov->key, "d2h_gbs")) c->d2h_gbs = x;
        else if (!strcmp(ov->key, "device_mem_gbs")) c->device_mem_gbs = x;
        else if (!strcmp(ov->key, "step_overhead_ms")) c->step_overhead_ms = x;
        else if (!strcmp(ov->key, "intra_gbs")) c->intra_gbs = x;
        else if (!strcmp(ov->key, "intra_node_gbs")) {
            c->intra_node_gbs = x;
            if (x > 0) c->intra_kind = CLUSTER_INTRA_SHARED_MEMORY;
        } else if (!strcmp(ov->key, "intra_peer_gbs")) c->intra_peer_gbs = x;
        else if (!strcmp(ov->key, "intra_latency_us")) c->intra_latency_us = x;
        else if (!strcmp(ov->key, "nics_per_node")) c->nics_per_node = (int)x;
        else if (!strcmp(ov->key, "nic_gbs")) { /* the curve of the flows keeps its shape */
            for (int i = 0; i < c->nic_flows.n; i++) c->nic_flows.tflops[i] *= c->nic_gbs > 0 ? x / c->nic_gbs : 1;
            c->nic_gbs = x;
        }
        else c->nic_latency_us = x;
    }
    char *bad = cluster_check(c);
    if (bad) {
        char given[512] = "";
        size_t used = 0;
        for (int i = 0; i < o->n && used + 2 < sizeof given; i++)
            used += (size_t)snprintf(given + used, sizeof given - used, " %s %s", o->flag[i], o->value[i]);
        seq_err(e, "cluster '%s' with%s: %s", c->name, given, bad);
        xfree(bad);
        return -1;
    }
    return 0;
}
