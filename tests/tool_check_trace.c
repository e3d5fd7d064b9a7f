/* Test tool: checks a Chrome trace-event JSON file written by `--trace`: it parses, holds a
 * traceEvents array whose "X" events have name, cat, ts >= 0, dur >= 0, pid and tid, names a
 * track ("thread_name" metadata) for each of the expected ranks, has events on every rank, and
 * has at least one event of each required category. Exits 0 if so, 1 with the reason otherwise.
 * usage: tool_check_trace FILE RANKS [CATEGORY ...] */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FILE RANKS [CATEGORY ...]\n", argv[0]);
        return 2;
    }
    int ranks = atoi(argv[2]);
    json_error_t err;
    json_t *root = json_load_file(argv[1], 0, &err);
    if (!root) { printf("%s: not JSON: %s (line %d)\n", argv[1], err.text, err.line); return 1; }
    json_t *events = json_object_get(root, "traceEvents");
    if (!json_is_array(events)) { printf("%s: no traceEvents array\n", argv[1]); return 1; }
    int *named = calloc((size_t)ranks, sizeof(int)), *busy = calloc((size_t)ranks, sizeof(int));
    int n_cats = argc - 3, *seen = calloc((size_t)n_cats + 1, sizeof(int));
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        json_t *tid = json_object_get(e, "tid");
        if (!ph || !json_is_integer(tid)) { printf("event %zu lacks ph or tid\n", i); return 1; }
        long t = (long)json_integer_value(tid);
        if (t < 0 || t >= ranks) { printf("event %zu on track %ld, expected 0..%d\n", i, t, ranks - 1); return 1; }
        if (!strcmp(ph, "M")) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "thread_name")) named[t] = 1;
            continue;
        }
        if (strcmp(ph, "X")) { printf("event %zu has phase '%s'\n", i, ph); return 1; }
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (!json_string_value(json_object_get(e, "name")) || !cat || !json_is_number(json_object_get(e, "ts")) ||
            !json_is_number(json_object_get(e, "dur")) || json_number_value(json_object_get(e, "dur")) < 0 ||
            json_number_value(json_object_get(e, "ts")) < 0) {
            printf("event %zu is not a complete X event\n", i);
            return 1;
        }
        busy[t] = 1;
        for (int c = 0; c < n_cats; c++)
            if (!strcmp(cat, argv[3 + c])) seen[c] = 1;
    }
    for (int r = 0; r < ranks; r++)
        if (!named[r] || !busy[r]) { printf("rank %d has no %s\n", r, named[r] ? "events" : "track name"); return 1; }
    for (int c = 0; c < n_cats; c++)
        if (!seen[c]) { printf("no event of category '%s'\n", argv[3 + c]); return 1; }
    printf("trace ok: %zu events on %d tracks\n", json_array_size(events), ranks);
    json_decref(root);
    free(named); free(busy); free(seen);
    return 0;
}
