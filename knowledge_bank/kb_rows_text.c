/* Text rows "KEY<TAB>v1 v2 ..." for kbctl: parsing with line-numbered errors, and exact printing.
 * The format is described in kb_rows_text.h. */
#include "kb_rows_text.h"

#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Longest number token we accept. A float written out in full needs at most ~50 characters (the "%.9g" form
 * at most 15); the cap keeps the copy into a NUL-terminated buffer bounded. */
#define S_MAX_NUMBER_CHARS 127

kb_rows_t *kb_rows_new(uint32_t dim)
{
    kb_rows_t *rows = carls_xcalloc(1, sizeof *rows);
    rows->dim = dim;
    return rows;
}

void kb_rows_destroy(kb_rows_t **rows_p)
{
    if (!rows_p || !*rows_p)
        return;
    kb_rows_t *rows = *rows_p;
    free(rows->key_bytes);
    free(rows->key_off);
    free(rows->key_len);
    free(rows->values);
    free(rows);
    *rows_p = NULL;
}

/* Makes room for one more row and key_len more key bytes. */
static void s_reserve(kb_rows_t *rows, size_t key_len)
{
    if (rows->n == rows->cap) {
        size_t cap = rows->cap ? rows->cap * 2 : 64;
        rows->key_off = carls_xrealloc(rows->key_off, cap * sizeof *rows->key_off);
        rows->key_len = carls_xrealloc(rows->key_len, cap * sizeof *rows->key_len);
        if (rows->dim > 0) {
            if (cap > SIZE_MAX / sizeof(float) / rows->dim)
                CARLS_FATAL("rows: %zu rows of dim %u do not fit in memory", cap, rows->dim);
            rows->values = carls_xrealloc(rows->values, cap * rows->dim * sizeof *rows->values);
        }
        rows->cap = cap;
    }
    if (rows->key_bytes_cap - rows->key_bytes_len < key_len) {
        size_t cap = rows->key_bytes_cap ? rows->key_bytes_cap : 1024;
        while (cap - rows->key_bytes_len < key_len)
            cap *= 2;
        rows->key_bytes = carls_xrealloc(rows->key_bytes, cap);
        rows->key_bytes_cap = cap;
    }
}

/* Commits row rows->n: copies its key (values are already in place). */
static void s_commit_key(kb_rows_t *rows, const void *key, size_t key_len)
{
    if (key_len > 0)
        memcpy(rows->key_bytes + rows->key_bytes_len, key, key_len);
    rows->key_off[rows->n] = rows->key_bytes_len;
    rows->key_len[rows->n] = key_len;
    rows->key_bytes_len += key_len;
    rows->n++;
}

void kb_rows_append(kb_rows_t *rows, const void *key, size_t key_len, const float *values)
{
    assert(rows);
    s_reserve(rows, key_len);
    if (rows->dim > 0)
        memcpy(rows->values + rows->n * rows->dim, values, rows->dim * sizeof(float));
    s_commit_key(rows, key, key_len);
}

kb_key_t kb_rows_key(const kb_rows_t *rows, size_t i)
{
    assert(rows && i < rows->n);
    kb_key_t k = {rows->key_bytes + rows->key_off[i], rows->key_len[i]};
    return k;
}

/* Drops one trailing '\r' (CRLF files). */
static size_t s_strip_cr(const char *line, size_t len)
{
    return (len > 0 && line[len - 1] == '\r') ? len - 1 : len;
}

static int s_check_key(size_t key_len, char *err, size_t errlen)
{
    if (key_len == 0) {
        snprintf(err, errlen, "empty key");
        return -1;
    }
    if (key_len > CARLS_DEFAULT_MAX_KEY_BYTES) {
        snprintf(err, errlen, "key is %zu bytes, longer than the limit of %u", key_len,
                 CARLS_DEFAULT_MAX_KEY_BYTES);
        return -1;
    }
    return 0;
}

/* Parses one number token (not NUL-terminated) into *out. Overflow and non-finite values are refused;
 * underflow (ERANGE with a result that is zero or subnormal) is accepted because it is exact for the
 * subnormals kb_rows_write_row prints. */
static int s_parse_number(const char *tok, size_t len, size_t index, float *out, char *err, size_t errlen)
{
    if (len > S_MAX_NUMBER_CHARS) {
        snprintf(err, errlen, "value %zu is %zu characters long; not a number", index + 1, len);
        return -1;
    }
    char buf[S_MAX_NUMBER_CHARS + 1];
    memcpy(buf, tok, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    float v = strtof(buf, &end);
    if (end == buf || *end != '\0') {
        snprintf(err, errlen, "value %zu \"%s\" is not a number", index + 1, buf);
        return -1;
    }
    if (!isfinite(v)) {
        snprintf(err, errlen, "value %zu \"%s\" is not finite (or overflows a float)", index + 1, buf);
        return -1;
    }
    *out = v;
    return 0;
}

int kb_rows_parse_line(kb_rows_t *rows, const char *line, size_t len, char *err, size_t errlen)
{
    assert(rows && rows->dim > 0 && (line || len == 0));
    len = s_strip_cr(line, len);
    const char *tab = len > 0 ? memchr(line, '\t', len) : NULL;
    if (!tab) {
        snprintf(err, errlen, "no TAB after the key (expected KEY<TAB>%u numbers)", rows->dim);
        return -1;
    }
    size_t key_len = (size_t)(tab - line);
    if (s_check_key(key_len, err, errlen) != 0)
        return -1;

    s_reserve(rows, key_len);
    /* Numbers go straight into the next row's slot; it only counts once the whole line is valid. */
    float *dst = rows->values + rows->n * rows->dim;
    size_t count = 0;
    const char *p = tab + 1, *end = line + len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (p == end)
            break;
        const char *tok = p;
        while (p < end && *p != ' ' && *p != '\t')
            p++;
        /* Past dim we only count, so the error can say how many there were. */
        if (count < rows->dim && s_parse_number(tok, (size_t)(p - tok), count, &dst[count], err, errlen) != 0)
            return -1;
        count++;
    }
    if (count != rows->dim) {
        snprintf(err, errlen, "expected %u numbers after the key, got %zu", rows->dim, count);
        return -1;
    }
    s_commit_key(rows, line, key_len);
    return 0;
}

int kb_rows_parse_key_line(kb_rows_t *rows, const char *line, size_t len, char *err, size_t errlen)
{
    assert(rows && rows->dim == 0 && (line || len == 0));
    len = s_strip_cr(line, len);
    if (s_check_key(len, err, errlen) != 0)
        return -1;
    kb_rows_append(rows, line, len, NULL);
    return 0;
}

int kb_rows_read(kb_rows_t *rows, FILE *in, FILE *errs, size_t max_reports, size_t *bad_lines_out)
{
    assert(rows && in);
    char *line = NULL;
    size_t line_cap = 0, lineno = 0, bad = 0;
    char err[256];
    ssize_t got;
    while ((got = getline(&line, &line_cap, in)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        if (s_strip_cr(line, len) == 0)
            continue;
        int rc = rows->dim > 0 ? kb_rows_parse_line(rows, line, len, err, sizeof err)
                               : kb_rows_parse_key_line(rows, line, len, err, sizeof err);
        if (rc != 0) {
            bad++;
            if (errs && bad <= max_reports)
                fprintf(errs, "line %zu: %s\n", lineno, err);
        }
    }
    int read_failed = ferror(in);
    free(line);
    if (errs && bad > max_reports)
        fprintf(errs, "... and %zu more invalid lines\n", bad - max_reports);
    if (read_failed && errs)
        fprintf(errs, "line %zu: read error: %s\n", lineno + 1, strerror(errno));
    if (bad_lines_out)
        *bad_lines_out = bad;
    return (bad > 0 || read_failed) ? -1 : 0;
}

int kb_rows_format_float(float v, char *buf, size_t cap)
{
    assert(cap >= KB_ROWS_FLOAT_CHARS);
    /* Nine significant digits always read back to the same float. People read these numbers too, and a
     * value that was typed as "0.1" should come back as "0.1", not "0.100000001": so the plain "%g" (six
     * digits) when it reads back to the same bits (compared as bits, so -0 stays -0), else "%.9g". */
    snprintf(buf, cap, "%g", (double)v);
    float back = strtof(buf, NULL);
    if (memcmp(&back, &v, sizeof v) != 0)
        snprintf(buf, cap, "%.9g", (double)v);
    return (int)strlen(buf);
}

int kb_rows_write_row(FILE *out, const void *key, size_t key_len, const float *values, uint32_t dim)
{
    char num[KB_ROWS_FLOAT_CHARS];
    if (key_len > 0)
        fwrite(key, 1, key_len, out);
    fputc('\t', out);
    for (uint32_t j = 0; j < dim; j++) {
        kb_rows_format_float(values[j], num, sizeof num);
        if (j)
            fputc(' ', out);
        fputs(num, out);
    }
    return ferror(out) ? -1 : 0;
}
