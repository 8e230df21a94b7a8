/* The layering rules of docs/DESIGN.md ("Layering"), read from the document itself and checked against every
 * source file's #include lines, so the walls between folders stay where the document says they are.
 *
 * The table in docs/DESIGN.md has one row per folder:
 *
 *     | `folder/` | job | `below/`, `other/` (or —) | `zmq.h`, `protobuf-c/` (or —) |
 *
 * column 3: the project folders whose headers the folder may include (its own always);
 * column 4: header prefixes of outside libraries it must not include.
 * A quoted include ("x.h") is resolved to the folder that holds a file of that name (the generated
 * carls.pb-c.h belongs to proto/); an angle include (<x.h>) is matched against column 4 only.
 *
 * A row may name one file instead of a folder (`knowledge_bank/kb_commit.c`, a path from the root): a room
 * inside a folder. Its column 3 lists the header names it may include (its own header among them), and
 * nothing else of the tree; column 4 as for a folder. The folder's row holds for it too. A file row that
 * names no file of the tree is a violation, so a rule cannot outlive its file unnoticed. */
#ifndef LAYERING_H
#define LAYERING_H

#include <stdbool.h>
#include <stddef.h>

#define LAYER_MAX_FOLDERS 32
#define LAYER_MAX_NAMES 16
#define LAYER_NAME_LEN 64

typedef struct {
    char folder[LAYER_NAME_LEN];                       /* "base" (no slash), or a file's path from the root */
    bool file;                                         /* a file row: folder holds "dir/name.c" */
    char allowed[LAYER_MAX_NAMES][LAYER_NAME_LEN];     /* folders it may include from; a file's header names */
    int n_allowed;
    char forbidden[LAYER_MAX_NAMES][LAYER_NAME_LEN];   /* outside header prefixes it may not include */
    int n_forbidden;
} layer_rule_t;

typedef struct {
    layer_rule_t rules[LAYER_MAX_FOLDERS];
    int n;
} layer_table_t;

/* Reads the "## Layering" section of the markdown file at path. 0, or -1 with the reason in err. */
int layer_table_read(const char *path, layer_table_t *out, char *err, size_t errlen);

/* The rule of folder (or of a file, by its path from the root), or NULL when the table has no row for it. */
const layer_rule_t *layer_table_find(const layer_table_t *table, const char *folder);

/* Checks every .c/.h/.cu/.cpp file in the table's folders under root (recursively). Each violation is
 * printed to stderr as "file:line: ..."; files in folders without a row are reported too. Returns the
 * number of violations, or -1 when root cannot be read. */
int layer_check_tree(const char *root, const layer_table_t *table);

#endif
