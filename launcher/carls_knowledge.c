/* The knowledge's quality per refresh from the makers' logs (see carls_knowledge.h). */
#include "carls_knowledge.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_HEADER "step,graph_purity,pseudo_label_accuracy,confident_accuracy,confident_share"

/* ---- one line ------------------------------------------------------------------------------------------ */

/* What one maker's log line says. */
typedef struct {
    bool label;       /* a label step (else a graph version) */
    uint64_t step;    /* the version or label step */
    uint64_t items;   /* the maker's items (graph) or unlabelled items (label) */
    double purity;    /* graph */
    double acc;       /* label: pseudo-label accuracy */
    double conf_acc;  /* label: accuracy on the confident ones */
    double conf_frac; /* label: their share, 0..1 */
    char ts[40];      /* the line's first word: its time stamp (ISO 8601 UTC, so later sorts later) */
} s_entry_t;

/* The number at *p: a run of digits and dots, which must be followed by one of `after` (so that a line cut in
 * the middle of a number is not read as a shorter number). Stores it in text (len bytes) and moves *p past
 * it. true on success. */
static bool s_token(const char **p, const char *after, char *text, size_t len)
{
    size_t n = strspn(*p, "0123456789.");
    if (n == 0 || n >= len || (*p)[n] == '\0' || !strchr(after, (*p)[n])) {
        return false;
    }
    memcpy(text, *p, n);
    text[n] = '\0';
    *p += n;
    return true;
}

/* An unsigned decimal integer at *p followed by one of after. */
static bool s_u64(const char **p, const char *after, uint64_t *out)
{
    char text[32];
    return s_token(p, after, text, sizeof text) && carls_parse_u64(text, out) == 0;
}

/* text, whole, as a finite decimal number that starts with a digit (no sign, blanks or "inf"). */
static bool s_strict_number(const char *text, double *out)
{
    char *end = NULL;
    if (!(text[0] >= '0' && text[0] <= '9')) {
        return false;
    }
    double v = strtod(text, &end);
    if (*end != '\0' || !isfinite(v)) {
        return false;
    }
    *out = v;
    return true;
}

/* A decimal number in [lo, hi] at *p followed by one of after. */
static bool s_num(const char **p, const char *after, double lo, double hi, double *out)
{
    char text[32];
    double v = 0.0;
    if (!s_token(p, after, text, sizeof text) || !s_strict_number(text, &v) || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

/* Moves *p past the literal lit when it is there. */
static bool s_lit(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n) != 0) {
        return false;
    }
    *p += n;
    return true;
}

/* Moves *p past the first lit at or after *p. */
static bool s_past(const char **p, const char *lit)
{
    const char *q = strstr(*p, lit);
    if (!q) {
        return false;
    }
    *p = q + strlen(lit);
    return true;
}

/* "graph from T (version V): M items, ... ; purity P (...". */
static bool s_parse_graph(const char *line, s_entry_t *e)
{
    const char *p = line;
    return s_past(&p, " graph from ") && s_past(&p, " (version ") && s_u64(&p, ")", &e->step) &&
           s_lit(&p, "): ") && s_u64(&p, " ", &e->items) && s_lit(&p, " items, ") && s_past(&p, "; purity ") &&
           s_num(&p, " ,;)\r\n", 0.0, 1.0, &e->purity);
}

/* "label step S (...): M unlabelled items in ...; pseudo-label accuracy A, B on the P% with confidence". */
static bool s_parse_label(const char *line, s_entry_t *e)
{
    const char *p = line;
    double pct = 0;
    e->label = true;
    bool ok = s_past(&p, " label step ") && s_u64(&p, " ", &e->step) && s_lit(&p, " (") && s_past(&p, "): ") &&
              s_u64(&p, " ", &e->items) && s_lit(&p, " unlabelled items") &&
              s_past(&p, "; pseudo-label accuracy ") && s_num(&p, ",", 0.0, 1.0, &e->acc) && s_lit(&p, ", ") &&
              s_num(&p, " ", 0.0, 1.0, &e->conf_acc) && s_lit(&p, " on the ") && s_num(&p, "%", 0.0, 100.0, &pct) &&
              s_lit(&p, "% with confidence");
    e->conf_frac = pct / 100.0;
    return ok;
}

/* ---- one log, then all of them ---------------------------------------------------------------------------- */

/* A growable list of entries. */
typedef struct {
    s_entry_t *e;
    size_t n, cap;
} s_list_t;

/* Adds e to l; an entry of the same kind and step is replaced (a restarted maker's last line counts). */
static void s_list_put(s_list_t *l, const s_entry_t *e)
{
    for (size_t i = l->n; i-- > 0;) {
        if (l->e[i].label == e->label && l->e[i].step == e->step) {
            l->e[i] = *e;
            return;
        }
    }
    l->e = carls_grow(l->e, &l->cap, l->n + 1, sizeof *l->e);
    l->e[l->n++] = *e;
}

/* Reads path's graph and label lines into l (emptied first). false when it cannot be opened. */
static bool s_read_log(const char *path, s_list_t *l)
{
    l->n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        return false;
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        s_entry_t g = {0}, lb = {0};
        s_entry_t *e = s_parse_graph(line, &g) ? &g : s_parse_label(line, &lb) ? &lb : NULL;
        if (e) {
            const size_t n = strcspn(line, " \t\r\n");
            memcpy(e->ts, line, n < sizeof e->ts ? n : sizeof e->ts - 1);
            s_list_put(l, e);
        }
    }
    free(line);
    fclose(f);
    return true;
}

/* The sums of one fleet's lines of one kind and step (a fleet: the makers whose logs differ only in the
 * worker number, "graph-0.log" and "graph-1.log"), weighted (by items) and plain, for the means. */
typedef struct {
    char fleet[64];
    uint64_t step;
    bool label;
    char ts[40];           /* the latest time stamp of these lines */
    double w, a, a_plain;  /* items; items * purity or accuracy; the plain sum */
    double f, f_plain;     /* label: items * confident share; the plain sum */
    double c, c_plain;     /* label: items * confident share * confident accuracy; the plain sum */
    size_t n;              /* lines */
} s_sum_t;

/* The mean: weighted when there is weight, else plain. */
static double s_mean(double w, double wsum, double plain, size_t n)
{
    return w > 0 ? wsum / w : plain / (double)n;
}

/* By step, then graph before label, then time stamp (the latest last). */
static int s_sum_cmp(const void *a, const void *b)
{
    const s_sum_t *x = a, *y = b;
    if (x->step != y->step) {
        return x->step < y->step ? -1 : 1;
    }
    if (x->label != y->label) {
        return x->label ? 1 : -1;
    }
    int c = strcmp(x->ts, y->ts);
    return c ? c : strcmp(x->fleet, y->fleet);
}

static int s_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The fleet of log file name ("maker-graph-1.log" -> "maker-graph") into fleet (len bytes). */
static void s_fleet_of(const char *name, char *fleet, size_t len)
{
    size_t n = strlen(name) - 4; /* without ".log" */
    size_t d = n;
    while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9') {
        d--;
    }
    if (d < n && d > 0 && name[d - 1] == '-') {
        n = d - 1;
    }
    snprintf(fleet, len, "%.*s", (int)n, name);
}

/* Adds the entries of one log of fleet to the sums. */
static void s_sum_add(s_sum_t **sums, size_t *n, size_t *cap, const char *fleet, const s_list_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        const s_entry_t *e = &l->e[i];
        size_t k = 0;
        while (k < *n && ((*sums)[k].step != e->step || (*sums)[k].label != e->label ||
                          strcmp((*sums)[k].fleet, fleet) != 0)) {
            k++;
        }
        if (k == *n) {
            *sums = carls_grow(*sums, cap, *n + 1, sizeof **sums);
            memset(&(*sums)[k], 0, sizeof **sums);
            snprintf((*sums)[k].fleet, sizeof (*sums)[k].fleet, "%s", fleet);
            (*sums)[k].step = e->step;
            (*sums)[k].label = e->label;
            (*n)++;
        }
        s_sum_t *s = &(*sums)[k];
        const double w = (double)e->items;
        if (strcmp(e->ts, s->ts) > 0) {
            memcpy(s->ts, e->ts, sizeof s->ts);
        }
        s->w += w;
        s->a += w * (e->label ? e->acc : e->purity);
        s->a_plain += e->label ? e->acc : e->purity;
        s->f += w * e->conf_frac;
        s->f_plain += e->conf_frac;
        s->c += w * e->conf_frac * e->conf_acc;
        s->c_plain += e->conf_acc;
        s->n++;
    }
}

int carls_knowledge_collect(const char *logs_dir, carls_knowledge_row_t **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    DIR *d = opendir(logs_dir);
    if (!d) {
        return -1;
    }
    /* The logs in name order, so that the sums (and their rounding) do not depend on the directory's order. */
    char **names = NULL;
    size_t n_names = 0, names_cap = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        const size_t len = strlen(de->d_name);
        if (len > 4 && strcmp(de->d_name + len - 4, ".log") == 0) {
            names = carls_grow(names, &names_cap, n_names + 1, sizeof *names);
            names[n_names] = carls_xmalloc(strlen(logs_dir) + len + 2);
            sprintf(names[n_names++], "%s/%s", logs_dir, de->d_name);
        }
    }
    closedir(d);
    if (n_names > 1) {
        qsort(names, n_names, sizeof *names, s_name_cmp);
    }
    s_list_t l = {0};
    s_sum_t *sums = NULL;
    size_t n_sums = 0, sums_cap = 0;
    const size_t dir_len = strlen(logs_dir) + 1;
    for (size_t i = 0; i < n_names; i++) {
        char fleet[64];
        s_fleet_of(names[i] + dir_len, fleet, sizeof fleet);
        if (s_read_log(names[i], &l)) {
            s_sum_add(&sums, &n_sums, &sums_cap, fleet, &l);
        }
        free(names[i]);
    }
    free(names);
    free(l.e);
    if (n_sums > 1) {
        qsort(sums, n_sums, sizeof *sums, s_sum_cmp);
    }
    /* One row per step. Where several fleets wrote the same step (the resident graph makers' version 0 after
     * the initial pixel graph's, the resident label maker's step 0 after the first spreading's), the bank
     * holds what the last of them wrote: that fleet's sums count (the last of the step's kind in sort order). */
    if (n_sums > 0) {
        *rows = carls_xcalloc(n_sums, sizeof **rows);
    }
    for (size_t k = 0; k < n_sums; k++) {
        const s_sum_t *s = &sums[k];
        if (*n == 0 || (*rows)[*n - 1].step != s->step) {
            carls_knowledge_row_t *r = &(*rows)[(*n)++];
            r->step = s->step;
            r->graph_purity = r->pseudo_label_accuracy = r->confident_accuracy = r->confident_share = NAN;
        }
        if (k + 1 < n_sums && sums[k + 1].step == s->step && sums[k + 1].label == s->label) {
            continue; /* a later fleet wrote this step too */
        }
        carls_knowledge_row_t *r = &(*rows)[*n - 1];
        if (!s->label) {
            r->graph_purity = s_mean(s->w, s->a, s->a_plain, s->n);
        } else {
            r->pseudo_label_accuracy = s_mean(s->w, s->a, s->a_plain, s->n);
            r->confident_share = s_mean(s->w, s->f, s->f_plain, s->n);
            /* No confident item: no accuracy among them (the maker writes 0). */
            r->confident_accuracy = s->f > 0 ? s->c / s->f : s->f_plain > 0 ? s->c_plain / (double)s->n : NAN;
        }
    }
    free(sums);
    return 0;
}

/* ---- knowledge.csv -------------------------------------------------------------------------------------- */

/* ",value" or "," for NAN. */
static void s_cell(FILE *f, double v)
{
    if (isnan(v)) {
        fputc(',', f);
    } else {
        fprintf(f, ",%.6g", v);
    }
}

int carls_knowledge_write_csv(const char *path, const carls_knowledge_row_t *rows, size_t n)
{
    char err[512];
    carls_atomic_file_t *af = NULL;
    if (carls_atomic_open(path, 0644, 0, &af, err, sizeof err) != 0) {
        LOG_WARN("knowledge per refresh: %s", err);
        return -1;
    }
    FILE *f = carls_atomic_stream(af);
    fprintf(f, "%s\n", S_HEADER);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%" PRIu64, rows[i].step);
        s_cell(f, rows[i].graph_purity);
        s_cell(f, rows[i].pseudo_label_accuracy);
        s_cell(f, rows[i].confident_accuracy);
        s_cell(f, rows[i].confident_share);
        fputc('\n', f);
    }
    if (carls_atomic_commit(&af, err, sizeof err) != 0) {
        LOG_WARN("knowledge per refresh: %s", err);
        return -1;
    }
    return 0;
}

/* One cell of a knowledge.csv row (text, cut at its comma): NAN when empty, else a strict number. */
static bool s_read_cell(const char *text, double *out)
{
    if (*text == '\0') {
        *out = NAN;
        return true;
    }
    return s_strict_number(text, out);
}

/* A knowledge.csv row (without its line end): five cells, cut in place. */
static bool s_read_row(char *line, carls_knowledge_row_t *r)
{
    char *cell[5];
    cell[0] = line;
    for (int i = 1; i < 5; i++) {
        char *comma = strchr(cell[i - 1], ',');
        if (!comma) {
            return false;
        }
        *comma = '\0';
        cell[i] = comma + 1;
    }
    return !strchr(cell[4], ',') && carls_parse_u64(cell[0], &r->step) == 0 &&
           s_read_cell(cell[1], &r->graph_purity) && s_read_cell(cell[2], &r->pseudo_label_accuracy) &&
           s_read_cell(cell[3], &r->confident_accuracy) && s_read_cell(cell[4], &r->confident_share);
}

int carls_knowledge_read_csv(const char *path, carls_knowledge_row_t **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    char *line = NULL;
    size_t cap = 0, rows_cap = 0;
    ssize_t len;
    bool header = true;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
            line[--len] = '\0';
        }
        if (header) {
            header = false;
            if (strcmp(line, S_HEADER) != 0) {
                rc = -1;
                break;
            }
            continue;
        }
        carls_knowledge_row_t r;
        if (s_read_row(line, &r)) {
            *rows = carls_grow(*rows, &rows_cap, *n + 1, sizeof **rows);
            (*rows)[(*n)++] = r;
        }
    }
    free(line);
    fclose(f);
    if (header || rc != 0) {
        free(*rows);
        *rows = NULL;
        *n = 0;
        return -1;
    }
    return 0;
}

int carls_knowledge_write(const char *logs_dir, const char *csv_path)
{
    carls_knowledge_row_t *rows = NULL;
    size_t n = 0;
    if (carls_knowledge_collect(logs_dir, &rows, &n) != 0) {
        LOG_WARN("knowledge per refresh: cannot read the logs in %s", logs_dir);
        return -1;
    }
    int rc = n > 0 ? carls_knowledge_write_csv(csv_path, rows, n) : 0;
    free(rows);
    return rc != 0 ? -1 : (int)n;
}
