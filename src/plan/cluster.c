/* A cluster for the step simulator: see cluster.h. */
#include "plan/cluster.h"

#include <jansson.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/atomic_file.h"

/* A number field of the object: required ones must be there; -1 with one line otherwise. */
static int number(json_t *o, const char *path, const char *key, int required, double fallback, double *out,
                  SeqErr *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return seq_err(e, "cluster '%s' has no \"%s\": add it (a number)", path, key);
        *out = fallback;
        return 0;
    }
    if (!json_is_number(v)) return seq_err(e, "cluster '%s': \"%s\" must be a number", path, key);
    *out = json_number_value(v);
    return 0;
}

int cluster_load(const char *path, Cluster *c, SeqErr *e) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return seq_err(e, "cluster '%s': %s (line %d): give a JSON cluster file", path, je.text, je.line);
    int rc = -1;
    if (!json_is_object(root)) {
        seq_err(e, "cluster '%s' is not a JSON object", path);
        goto out;
    }
    json_t *name = json_object_get(root, "name");
    snprintf(c->name, sizeof c->name, "%s", json_is_string(name) ? json_string_value(name) : path);
    double nodes = 0, rpn = 0, nics = 0, lat = 0;
    if (number(root, path, "nodes", 1, 0, &nodes, e) || number(root, path, "ranks_per_node", 1, 0, &rpn, e) ||
        number(root, path, "intra_gbs", 1, 0, &c->intra_gbs, e) ||
        number(root, path, "intra_node_gbs", 0, 0, &c->intra_node_gbs, e) ||
        number(root, path, "intra_latency_us", 0, 0, &c->intra_latency_us, e) ||
        number(root, path, "nics_per_node", 0, 1, &nics, e) || number(root, path, "nic_gbs", 0, 0, &c->nic_gbs, e) ||
        number(root, path, "nic_latency_us", 0, 0, &lat, e) ||
        number(root, path, "attention_backward_factor", 0, 2.5, &c->attn_backward_factor, e))
        goto out;
    c->nodes = (int)nodes;
    c->ranks_per_node = (int)rpn;
    c->nics_per_node = (int)nics;
    c->nic_latency_us = lat;
    json_t *pts = json_object_get(root, "attention");
    if (!json_is_array(pts) || !json_array_size(pts) || json_array_size(pts) > CLUSTER_RATE_POINTS) {
        seq_err(e, "cluster '%s': \"attention\" must be a list of 1 to %d [rows, tflops] points", path,
                CLUSTER_RATE_POINTS);
        goto out;
    }
    for (size_t i = 0; i < json_array_size(pts); i++) {
        json_t *p = json_array_get(pts, i);
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_number(json_array_get(p, 0)) ||
            !json_is_number(json_array_get(p, 1))) {
            seq_err(e, "cluster '%s': \"attention\" point %zu must be [rows, tflops]", path, i + 1);
            goto out;
        }
        c->rate_rows[i] = json_number_value(json_array_get(p, 0));
        c->attn_tflops[i] = json_number_value(json_array_get(p, 1));
    }
    c->n_rate_points = (int)json_array_size(pts);
    char *bad = cluster_check(c);
    if (bad) {
        seq_err(e, "cluster '%s': %s", path, bad);
        xfree(bad);
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int cluster_save(const char *path, const Cluster *c, const char *source, SeqErr *e) {
    json_t *o = json_object(), *pts = json_array();
    json_object_set_new(o, "name", json_string(c->name));
    json_object_set_new(o, "source", json_string(source ? source : ""));
    json_object_set_new(o, "nodes", json_integer(c->nodes));
    json_object_set_new(o, "ranks_per_node", json_integer(c->ranks_per_node));
    json_object_set_new(o, "intra_gbs", json_real(c->intra_gbs));
    json_object_set_new(o, "intra_node_gbs", json_real(c->intra_node_gbs));
    json_object_set_new(o, "intra_latency_us", json_real(c->intra_latency_us));
    json_object_set_new(o, "nics_per_node", json_integer(c->nics_per_node));
    json_object_set_new(o, "nic_gbs", json_real(c->nic_gbs));
    json_object_set_new(o, "nic_latency_us", json_real(c->nic_latency_us));
    for (int i = 0; i < c->n_rate_points; i++) {
        json_t *p = json_array();
        json_array_append_new(p, json_real(c->rate_rows[i]));
        json_array_append_new(p, json_real(c->attn_tflops[i]));
        json_array_append_new(pts, p);
    }
    json_object_set_new(o, "attention", pts);
    json_object_set_new(o, "attention_backward_factor", json_real(c->attn_backward_factor));
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

char *cluster_check(const Cluster *c) {
    if (c->nodes < 1) return xstrdup_printf("\"nodes\" must be at least 1 (got %d)", c->nodes);
    if (c->ranks_per_node < 1) return xstrdup_printf("\"ranks_per_node\" must be at least 1 (got %d)", c->ranks_per_node);
    if (!(c->intra_gbs > 0)) return xstrdup_printf("\"intra_gbs\" must be positive (got %g)", c->intra_gbs);
    if (c->intra_node_gbs < 0) return xstrdup("\"intra_node_gbs\" must be 0 (no shared limit) or positive");
    if (c->intra_latency_us < 0 || c->nic_latency_us < 0) return xstrdup("latencies must not be negative");
    if (c->nodes > 1 && (c->nics_per_node < 1 || !(c->nic_gbs > 0)))
        return xstrdup_printf("%d nodes need \"nics_per_node\" >= 1 and a positive \"nic_gbs\"", c->nodes);
    if (c->nics_per_node > c->ranks_per_node)
        return xstrdup_printf("\"nics_per_node\" %d exceeds \"ranks_per_node\" %d: a NIC serves at least one rank",
                              c->nics_per_node, c->ranks_per_node);
    if (c->n_rate_points < 1) return xstrdup("\"attention\" needs at least one [rows, tflops] point");
    for (int i = 0; i < c->n_rate_points; i++) {
        if (!(c->rate_rows[i] >= 1) || !(c->attn_tflops[i] > 0))
            return xstrdup_printf("\"attention\" point %d must have rows >= 1 and tflops > 0", i + 1);
        if (i && !(c->rate_rows[i] > c->rate_rows[i - 1]))
            return xstrdup_printf("\"attention\" points must be in increasing rows (point %d)", i + 1);
    }
    if (!(c->attn_backward_factor > 0)) return xstrdup("\"attention_backward_factor\" must be positive");
    return NULL;
}

double cluster_attention_flops_per_s(const Cluster *c, int q_rows, int kv_rows) {
    const double r = q_rows < kv_rows ? q_rows : kv_rows;
    const int n = c->n_rate_points;
    double t = c->attn_tflops[n - 1];
    if (r <= c->rate_rows[0]) t = c->attn_tflops[0];
    else
        for (int i = 1; i < n; i++)
            if (r <= c->rate_rows[i]) {
                const double f = (r - c->rate_rows[i - 1]) / (c->rate_rows[i] - c->rate_rows[i - 1]);
                t = c->attn_tflops[i - 1] + f * (c->attn_tflops[i] - c->attn_tflops[i - 1]);
                break;
            }
    return t * 1e12;
}

int cluster_node_of(const Cluster *c, int r) { return r / c->ranks_per_node; }

int cluster_nic_of(const Cluster *c, int r) {
    const int nics = c->nics_per_node > 0 ? c->nics_per_node : 1;
    return (r % c->ranks_per_node) * nics / c->ranks_per_node;
}
