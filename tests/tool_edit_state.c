/* Test tool: sets one top-level field of a checkpoint's trainer_state.json to a JSON value and,
 * when the file carries "state_crc32", re-signs it (CRC-32 of the compact, key-sorted JSON
 * without that field, written independently of the library's code), so tests can reach the
 * semantic checks behind the checksum: tool_edit_state FILE KEY JSON-VALUE. The value --delete
 * removes the field instead (to make a checkpoint as an older seqpar wrote it). KEY "OBJ.NAME"
 * names a field of the top-level object OBJ ("settings.fpdt_chunks"). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tool_edit_state trainer_state.json KEY JSON-VALUE\n");
        return 2;
    }
    json_error_t err;
    json_t *root = json_load_file(argv[1], JSON_PRESERVE_ORDER, &err);
    int delete = strcmp(argv[3], "--delete") == 0;
    json_t *value = delete ? json_null() : json_loads(argv[3], JSON_DECODE_ANY, &err);
    if (!root || !value) {
        fprintf(stderr, "tool_edit_state: cannot parse %s or the value: %s\n", root ? "the value" : argv[1], err.text);
        return 2;
    }
    json_t *obj = root;
    const char *key = argv[2], *dot = strchr(key, '.');
    if (dot) { /* a field of a top-level object */
        char outer[256];
        snprintf(outer, sizeof outer, "%.*s", (int)(dot - key), key);
        obj = json_object_get(root, outer);
        key = dot + 1;
        if (!json_is_object(obj)) {
            fprintf(stderr, "tool_edit_state: %s has no object \"%s\"\n", argv[1], outer);
            return 2;
        }
    }
    if (delete) json_object_del(obj, key);
    else json_object_set_new(obj, key, value);
    if (json_object_get(root, "state_crc32")) {
        json_t *copy = json_deep_copy(root);
        json_object_del(copy, "state_crc32");
        char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
        char hex[11];
        snprintf(hex, sizeof hex, "0x%08lx", crc32(0, (const unsigned char *)text, (unsigned)strlen(text)));
        json_object_set_new(root, "state_crc32", json_string(hex));
        free(text);
        json_decref(copy);
    }
    if (json_dump_file(root, argv[1], JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        fprintf(stderr, "tool_edit_state: cannot write %s\n", argv[1]);
        return 2;
    }
    json_decref(root);
    return 0;
}
