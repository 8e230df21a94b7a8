/* Reads the layering table of docs/DESIGN.md and checks #include lines against it (see layering.h). */
#include "layering.h"

#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define S_MAX_HEADERS 1024
#define S_LINE 4096

/* ---- the table --------------------------------------------------------------------------------------- */

/* Copies the backticked names of one table cell into names (trailing '/' dropped). "—" or "-" is none. */
static int s_cell_names(const char *cell, char names[][LAYER_NAME_LEN], int *count)
{
    *count = 0;
    const char *p = cell;
    while ((p = strchr(p, '`')) != NULL) {
        const char *end = strchr(p + 1, '`');
        if (!end)
            return -1;
        size_t len = (size_t)(end - p - 1);
        if (len == 0 || len >= LAYER_NAME_LEN || *count >= LAYER_MAX_NAMES)
            return -1;
        memcpy(names[*count], p + 1, len);
        names[*count][len] = '\0';
        if (names[*count][len - 1] == '/' && len > 1)
            names[*count][len - 1] = '\0';
        (*count)++;
        p = end + 1;
    }
    return 0;
}

int layer_table_read(const char *path, layer_table_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, -1, "%s: cannot open", path);
    char line[S_LINE];
    bool in_section = false;
    int line_no = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        line_no++;
        if (strncmp(line, "## ", 3) == 0) {
            in_section = strncmp(line, "## Layering", 11) == 0;
            continue;
        }
        if (!in_section || strncmp(line, "| `", 3) != 0)
            continue;
        /* | `folder/` | job | allowed | forbidden | */
        char *cells[5] = {0};
        int n = 0;
        for (char *p = line; *p && n < 5; p++)
            if (*p == '|') {
                *p = '\0';
                cells[n++] = p + 1;
            }
        if (n != 5) {
            rc = carls_errorf(err, errlen, -1, "%s:%d: a layering row needs 4 cells", path, line_no);
            break;
        }
        if (out->n >= LAYER_MAX_FOLDERS) {
            rc = carls_errorf(err, errlen, -1, "%s:%d: more than %d rows", path, line_no, LAYER_MAX_FOLDERS);
            break;
        }
        layer_rule_t *r = &out->rules[out->n];
        char folder[1][LAYER_NAME_LEN];
        int nf = 0;
        if (s_cell_names(cells[0], folder, &nf) != 0 || nf != 1 ||
            s_cell_names(cells[2], r->allowed, &r->n_allowed) != 0 ||
            s_cell_names(cells[3], r->forbidden, &r->n_forbidden) != 0) {
            rc = carls_errorf(err, errlen, -1, "%s:%d: malformed layering row", path, line_no);
            break;
        }
        memcpy(r->folder, folder[0], LAYER_NAME_LEN);
        r->file = strchr(r->folder, '/') != NULL; /* a folder's trailing slash is dropped by s_cell_names */
        out->n++;
    }
    fclose(f);
    if (rc == 0 && out->n == 0)
        rc = carls_errorf(err, errlen, -1, "%s: no \"## Layering\" table rows found", path);
    return rc;
}

const layer_rule_t *layer_table_find(const layer_table_t *table, const char *folder)
{
    for (int i = 0; i < table->n; i++)
        if (strcmp(table->rules[i].folder, folder) == 0)
            return &table->rules[i];
    return NULL;
}

/* ---- the tree ---------------------------------------------------------------------------------------- */

typedef struct {
    char name[LAYER_NAME_LEN];   /* header file name */
    char folder[LAYER_NAME_LEN]; /* top-level folder that holds it */
} s_header_t;

typedef struct {
    const char *root;
    const layer_table_t *table;
    s_header_t headers[S_MAX_HEADERS];
    int n_headers;
    int n_sources;  /* s_folder_has_sources' count */
    int violations;
    bool file_seen[LAYER_MAX_FOLDERS]; /* file rows whose file was checked */
} s_check_t;

static bool s_is_source(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot && (strcmp(dot, ".c") == 0 || strcmp(dot, ".h") == 0 || strcmp(dot, ".cu") == 0 ||
                   strcmp(dot, ".cpp") == 0);
}

/* Top-level folders that hold no product code. */
static bool s_skipped_top(const char *name)
{
    return name[0] == '.' || strncmp(name, "build", 5) == 0 || strcmp(name, "tests") == 0 ||
           strcmp(name, "docs") == 0 || strcmp(name, "scripts") == 0 || strcmp(name, "experiments") == 0;
}

typedef void (*s_visit_fn)(s_check_t *c, const char *top, const char *path, const char *name);

/* Calls visit for every source file below dir (relative path rel), recursively. */
static void s_walk(s_check_t *c, const char *top, const char *dir, s_visit_fn visit)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path || stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            s_walk(c, top, path, visit);
        else if (S_ISREG(st.st_mode) && s_is_source(e->d_name))
            visit(c, top, path, e->d_name);
    }
    closedir(d);
}

static void s_index_header(s_check_t *c, const char *top, const char *path, const char *name)
{
    (void)path;
    const char *dot = strrchr(name, '.');
    if (strcmp(dot, ".h") != 0 || c->n_headers >= S_MAX_HEADERS || strlen(name) >= LAYER_NAME_LEN ||
        strlen(top) >= LAYER_NAME_LEN)
        return;
    s_header_t *h = &c->headers[c->n_headers++];
    memcpy(h->name, name, strlen(name) + 1);
    memcpy(h->folder, top, strlen(top) + 1);
}

static const char *s_header_folder(const s_check_t *c, const char *name)
{
    if (strcmp(name, "carls.pb-c.h") == 0) /* generated at build time from proto/carls.proto */
        return "proto";
    for (int i = 0; i < c->n_headers; i++)
        if (strcmp(c->headers[i].name, name) == 0)
            return c->headers[i].folder;
    return NULL;
}

static void s_violation(s_check_t *c, const char *path, int line_no, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: ", path, line_no);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (docs/DESIGN.md, \"Layering\")\n");
    va_end(ap);
    c->violations++;
}

static bool s_allowed(const layer_rule_t *rule, const char *folder)
{
    if (strcmp(rule->folder, folder) == 0)
        return true;
    for (int i = 0; i < rule->n_allowed; i++)
        if (strcmp(rule->allowed[i], folder) == 0)
            return true;
    return false;
}

/* The file row of path (under the root), or NULL; marks it seen. */
static const layer_rule_t *s_file_rule(s_check_t *c, const char *path)
{
    size_t root_len = strlen(c->root);
    if (strncmp(path, c->root, root_len) != 0 || path[root_len] != '/')
        return NULL;
    const layer_rule_t *rule = layer_table_find(c->table, path + root_len + 1);
    if (!rule || !rule->file)
        return NULL;
    c->file_seen[rule - c->table->rules] = true;
    return rule;
}

/* rule's fourth column (a folder's or a file's, NULL: none) against include inc, written <inc> or "inc". */
static void s_forbidden(s_check_t *c, const layer_rule_t *rule, const char *path, int line_no, const char *inc,
                        char open)
{
    for (int i = 0; rule && i < rule->n_forbidden; i++)
        if (strncmp(inc, rule->forbidden[i], strlen(rule->forbidden[i])) == 0)
            s_violation(c, path, line_no, "%s%s may not include %c%s%c", rule->folder, rule->file ? "" : "/", open,
                        inc, open == '<' ? '>' : '"');
}

static void s_check_file(s_check_t *c, const char *top, const char *path, const char *name)
{
    (void)name;
    const layer_rule_t *rule = layer_table_find(c->table, top);
    const layer_rule_t *file_rule = s_file_rule(c, path);
    FILE *f = fopen(path, "r");
    if (!f) {
        s_violation(c, path, 0, "cannot read the file");
        return;
    }
    char line[S_LINE];
    int line_no = 0;
    while (fgets(line, sizeof line, f)) {
        line_no++;
        const char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (*p != '#')
            continue;
        p++;
        while (isspace((unsigned char)*p))
            p++;
        if (strncmp(p, "include", 7) != 0)
            continue;
        p += 7;
        while (isspace((unsigned char)*p))
            p++;
        char open = *p, close = open == '"' ? '"' : '>';
        if (open != '"' && open != '<')
            continue;
        const char *end = strchr(p + 1, close);
        if (!end)
            continue;
        char inc[512];
        size_t len = (size_t)(end - p - 1);
        if (len >= sizeof inc)
            len = sizeof inc - 1;
        memcpy(inc, p + 1, len);
        inc[len] = '\0';
        s_forbidden(c, rule, path, line_no, inc, open);
        s_forbidden(c, file_rule, path, line_no, inc, open);
        if (open == '<')
            continue;
        const char *base = strrchr(inc, '/');
        base = base ? base + 1 : inc;
        const char *folder = s_header_folder(c, base);
        if (!folder) {
            s_violation(c, path, line_no, "includes \"%s\", which no folder of the tree holds", inc);
            continue;
        }
        if (!s_allowed(rule, folder))
            s_violation(c, path, line_no, "%s/ may not include \"%s\" from %s/", top, inc, folder);
        if (file_rule && !s_allowed(file_rule, base)) /* its folder is a path: only its listed names */
            s_violation(c, path, line_no, "%s may not include \"%s\" (not in its row)", file_rule->folder, inc);
    }
    fclose(f);
}

static void s_count_source(s_check_t *c, const char *top, const char *path, const char *name)
{
    (void)top;
    (void)path;
    (void)name;
    c->n_sources++;
}

static bool s_folder_has_sources(const char *root, const char *top)
{
    s_check_t *probe = calloc(1, sizeof *probe);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", root, top);
    s_walk(probe, top, dir, s_count_source);
    bool has = probe->n_sources > 0;
    free(probe);
    return has;
}

int layer_check_tree(const char *root, const layer_table_t *table)
{
    DIR *d = opendir(root);
    if (!d)
        return -1;
    s_check_t *c = calloc(1, sizeof *c);
    c->root = root;
    c->table = table;
    char tops[64][LAYER_NAME_LEN];
    int n_tops = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n_tops < 64) {
        if (s_skipped_top(e->d_name))
            continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) || !s_folder_has_sources(root, e->d_name))
            continue;
        if (strlen(e->d_name) >= LAYER_NAME_LEN)
            continue;
        memcpy(tops[n_tops++], e->d_name, strlen(e->d_name) + 1);
    }
    closedir(d);
    for (int i = 0; i < n_tops; i++) {
        char dir[4096];
        if (snprintf(dir, sizeof dir, "%s/%s", root, tops[i]) >= (int)sizeof dir)
            continue;
        s_walk(c, tops[i], dir, s_index_header);
    }
    for (int i = 0; i < n_tops; i++) {
        char dir[4096];
        if (snprintf(dir, sizeof dir, "%s/%s", root, tops[i]) >= (int)sizeof dir)
            continue;
        if (!layer_table_find(table, tops[i])) {
            s_violation(c, dir, 0, "%s/ holds sources but has no row in the layering table", tops[i]);
            continue;
        }
        s_walk(c, tops[i], dir, s_check_file);
    }
    for (int i = 0; i < table->n; i++)
        if (table->rules[i].file && !c->file_seen[i])
            s_violation(c, table->rules[i].folder, 0, "a file row names no source file of the tree");
    int violations = c->violations;
    free(c);
    return violations;
}
