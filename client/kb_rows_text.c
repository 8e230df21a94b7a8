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
        size_t cap = carls_grow_cap(rows->cap, rows->n + 1, sizeof *rows->key_off); /* shared by three arrays */
        rows->key_off = carls_xrealloc(rows->key_off, cap * sizeof *rows->key_off);
        rows->key_len = carls_xrealloc(rows->key_len, cap * sizeof *rows->key_len);
        if (rows->dim > 0) {
            if (cap > SIZE_MAX / sizeof(float) / rows->dim)
                CARLS_FATAL("rows: %zu rows of dim %u do not fit in memory", cap, rows->dim);
            rows->values = carls_xrealloc(rows->values, cap * rows->dim * sizeof *rows->values);
        }
        rows->cap = cap;
    }
    rows->key_bytes = carls_grow(rows->key_bytes, &rows->key_bytes_cap, rows->key_bytes_len + key_len, 1);
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
    /* values is NULL for key-only rows (dim 0); gcc -O3 cannot see that and warns on memcpy(.., NULL, ..) */
    float *dst = rows->values + rows->n * rows->dim;
    if (rows->dim > 0 && values)
        memcpy(dst, values, rows->dim * sizeof(float));
    else if (rows->dim > 0)
        memset(dst, 0, rows->dim * sizeof(float));
    s_commit_key(rows, key, key_len);
}

void kb_rows_clear(kb_rows_t *rows)
{
    assert(rows);
    rows->n = 0;
    rows->key_bytes_len = 0;
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

/* Finds the next token in [*p, end): tokens are separated by spaces and TABs. Sets *tok and *tok_len to it
 * and moves *p past it; false when only blanks are left. */
static bool s_next_token(const char **p, const char *end, const char **tok, size_t *tok_len)
{
    const char *q = *p;
    while (q < end && (*q == ' ' || *q == '\t'))
        q++;
    *tok = q;
    while (q < end && *q != ' ' && *q != '\t')
        q++;
    *tok_len = (size_t)(q - *tok);
    *p = q;
    return *tok_len > 0;
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
    const char *p = tab + 1, *tok;
    size_t tok_len;
    while (s_next_token(&p, line + len, &tok, &tok_len)) {
        /* Past dim we only count, so the error can say how many there were. */
        if (count < rows->dim && s_parse_number(tok, tok_len, count, &dst[count], err, errlen) != 0)
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

/* Line parser for s_read_lines: parses one line (without '\n') into ctx. 0, or -1 with a reason in err. */
typedef int (*s_line_parser_t)(void *ctx, const char *line, size_t len, char *err, size_t errlen);

/* Reads every line of in and hands each non-blank one to parse; reports invalid lines as kb_rows_read
 * describes. Returns 0 when every line was valid, -1 otherwise. */
static int s_read_lines(FILE *in, FILE *errs, size_t max_reports, size_t *bad_lines_out, s_line_parser_t parse,
                        void *ctx)
{
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
        if (parse(ctx, line, len, err, sizeof err) != 0) {
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

static int s_parse_row_or_key(void *ctx, const char *line, size_t len, char *err, size_t errlen)
{
    kb_rows_t *rows = ctx;
    return rows->dim > 0 ? kb_rows_parse_line(rows, line, len, err, errlen)
                         : kb_rows_parse_key_line(rows, line, len, err, errlen);
}

int kb_rows_read(kb_rows_t *rows, FILE *in, FILE *errs, size_t max_reports, size_t *bad_lines_out)
{
    assert(rows && in);
    return s_read_lines(in, errs, max_reports, bad_lines_out, s_parse_row_or_key, rows);
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

/* ---- feature lines (format in kb_rows_text.h) ------------------------------------------------------- */

kb_feature_rows_t *kb_feature_rows_new(void)
{
    kb_feature_rows_t *rows = carls_xcalloc(1, sizeof *rows);
    rows->keys = kb_rows_new(0);
    return rows;
}

/* Frees a record built by the parser (every array in it is ours). */
static void s_record_free(Carls__FeatureRecord *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_neighbor_keys; i++)
        free(r->neighbor_keys[i].data);
    free(r->neighbor_keys);
    free(r->neighbor_weights);
    free(r->data.data);
    free(r);
}

void kb_feature_rows_destroy(kb_feature_rows_t **rows_p)
{
    if (!rows_p || !*rows_p)
        return;
    kb_feature_rows_t *rows = *rows_p;
    for (size_t i = 0; i < rows->keys->n; i++)
        s_record_free(rows->records[i]);
    free(rows->records);
    kb_rows_destroy(&rows->keys);
    free(rows);
    *rows_p = NULL;
}

static int s_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes a percent-encoded key of len bytes into out (room for CARLS_DEFAULT_MAX_KEY_BYTES). what names it
 * in errors ("key", "neighbour 2"). 0 with *out_len, or -1 with a reason. */
static int s_decode_key(const char *text, size_t len, const char *what, uint8_t *out, size_t *out_len, char *err,
                        size_t errlen)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        if (b == '%') {
            int hi = i + 2 < len ? s_hex_digit(text[i + 1]) : -1;
            int lo = i + 2 < len ? s_hex_digit(text[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                snprintf(err, errlen, "%s: '%%' must be followed by two hex digits", what);
                return -1;
            }
            b = (uint8_t)(hi << 4 | lo);
            i += 2;
        }
        if (n == CARLS_DEFAULT_MAX_KEY_BYTES) {
            snprintf(err, errlen, "%s is longer than the limit of %u bytes", what, CARLS_DEFAULT_MAX_KEY_BYTES);
            return -1;
        }
        out[n++] = b;
    }
    if (n == 0) {
        snprintf(err, errlen, "%s is empty", what);
        return -1;
    }
    *out_len = n;
    return 0;
}

/* Copies a token into a NUL-terminated buffer for the number parsers; -1 when it is too long. */
static int s_token(const char *tok, size_t len, char *buf, size_t cap)
{
    if (len + 1 > cap)
        return -1;
    memcpy(buf, tok, len);
    buf[len] = '\0';
    return 0;
}

/* A finite float field value. */
static int s_field_float(const char *name, const char *v, size_t len, float *out, char *err, size_t errlen)
{
    char buf[S_MAX_NUMBER_CHARS + 1];
    char *end;
    if (len == 0 || s_token(v, len, buf, sizeof buf) != 0) {
        snprintf(err, errlen, "%s= wants a number", name);
        return -1;
    }
    errno = 0;
    float f = strtof(buf, &end);
    if (end == buf || *end != '\0' || !isfinite(f)) {
        snprintf(err, errlen, "%s=%s is not a finite number", name, buf);
        return -1;
    }
    *out = f;
    return 0;
}

/* Parses "K:W,K:W,..." into r's neighbour arrays (allocated here). */
static int s_field_neighbors(Carls__FeatureRecord *r, const char *v, size_t len, char *err, size_t errlen)
{
    if (len == 0)
        return 0;
    size_t count = 1;
    for (size_t i = 0; i < len; i++)
        count += v[i] == ',';
    r->neighbor_keys = carls_xcalloc(count, sizeof *r->neighbor_keys);
    r->neighbor_weights = carls_xcalloc(count, sizeof *r->neighbor_weights);
    uint8_t key[CARLS_DEFAULT_MAX_KEY_BYTES];
    const char *p = v, *end = v + len;
    for (size_t j = 0; j < count; j++) {
        const char *item_end = memchr(p, ',', (size_t)(end - p));
        if (!item_end)
            item_end = end;
        const char *colon = memchr(p, ':', (size_t)(item_end - p));
        char what[48];
        snprintf(what, sizeof what, "neighbour %zu", j + 1);
        if (!colon) {
            snprintf(err, errlen, "%s has no ':WEIGHT' (write neighbors=KEY:WEIGHT,...)", what);
            return -1;
        }
        size_t klen;
        if (s_decode_key(p, (size_t)(colon - p), what, key, &klen, err, errlen) != 0)
            return -1;
        char wname[48];
        snprintf(wname, sizeof wname, "neighbour %zu's weight", j + 1);
        float w;
        if (s_field_float(wname, colon + 1, (size_t)(item_end - colon - 1), &w, err, errlen) != 0)
            return -1;
        r->neighbor_keys[j].data = carls_xmalloc(klen);
        memcpy(r->neighbor_keys[j].data, key, klen);
        r->neighbor_keys[j].len = klen;
        r->neighbor_weights[j] = w;
        r->n_neighbor_keys = r->n_neighbor_weights = j + 1;
        p = item_end + 1;
    }
    return 0;
}

static int s_field_hex(Carls__FeatureRecord *r, const char *v, size_t len, char *err, size_t errlen)
{
    if (len % 2 != 0) {
        snprintf(err, errlen, "data= wants an even number of hex digits, got %zu", len);
        return -1;
    }
    if (len == 0)
        return 0;
    r->data.data = carls_xmalloc(len / 2);
    r->data.len = len / 2;
    for (size_t i = 0; i < len; i += 2) {
        int hi = s_hex_digit(v[i]), lo = s_hex_digit(v[i + 1]);
        if (hi < 0 || lo < 0) {
            snprintf(err, errlen, "data= holds a character that is not a hex digit at position %zu", i + 1);
            return -1;
        }
        r->data.data[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* Applies one NAME=VALUE field to r; seen[] stops repeated names. */
static int s_field(Carls__FeatureRecord *r, const char *tok, size_t len, bool *seen, bool *found_false, char *err,
                   size_t errlen)
{
    static const char *const names[] = {"label", "flabel", "confidence", "version", "neighbors", "data",
                                        "updated_at_ms", "found"};
    enum { F_LABEL, F_FLABEL, F_CONF, F_VERSION, F_NEIGHBORS, F_DATA, F_UPDATED, F_FOUND, F_N };
    const char *eq = memchr(tok, '=', len);
    if (!eq) {
        snprintf(err, errlen, "field \"%.*s\" is not NAME=VALUE", (int)(len < 40 ? len : 40), tok);
        return -1;
    }
    size_t nlen = (size_t)(eq - tok);
    int f = -1;
    for (int i = 0; i < F_N; i++)
        if (strlen(names[i]) == nlen && memcmp(names[i], tok, nlen) == 0)
            f = i;
    if (f < 0) {
        snprintf(err, errlen, "unknown field \"%.*s\" (label, flabel, confidence, version, neighbors, data)",
                 (int)(nlen < 40 ? nlen : 40), tok);
        return -1;
    }
    if (seen[f]) {
        snprintf(err, errlen, "field %s appears twice", names[f]);
        return -1;
    }
    seen[f] = true;
    const char *v = eq + 1;
    size_t vlen = len - nlen - 1;
    char buf[S_MAX_NUMBER_CHARS + 1];
    switch (f) {
    case F_LABEL:
    case F_FLABEL:
        if (seen[F_LABEL] && seen[F_FLABEL]) {
            snprintf(err, errlen, "label and flabel exclude each other");
            return -1;
        }
        if (f == F_FLABEL) {
            r->label_case = CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL;
            return s_field_float("flabel", v, vlen, &r->float_label, err, errlen);
        }
        if (s_token(v, vlen, buf, sizeof buf) != 0 || carls_parse_i64(buf, &r->int_label) != 0) {
            snprintf(err, errlen, "label= wants a whole number (64-bit); use flabel= for a float label");
            return -1;
        }
        r->label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
        return 0;
    case F_CONF:
        return s_field_float("confidence", v, vlen, &r->label_confidence, err, errlen);
    case F_VERSION:
        if (s_token(v, vlen, buf, sizeof buf) != 0 || carls_parse_u64(buf, &r->version) != 0) {
            snprintf(err, errlen, "version= wants a whole number >= 0");
            return -1;
        }
        return 0;
    case F_UPDATED: {
        int64_t ignored;
        if (s_token(v, vlen, buf, sizeof buf) != 0 || carls_parse_i64(buf, &ignored) != 0) {
            snprintf(err, errlen, "updated_at_ms= wants a whole number");
            return -1;
        }
        return 0;
    }
    case F_NEIGHBORS:
        return s_field_neighbors(r, v, vlen, err, errlen);
    case F_DATA:
        return s_field_hex(r, v, vlen, err, errlen);
    default: /* F_FOUND */
        if (vlen != 5 || memcmp(v, "false", 5) != 0) {
            snprintf(err, errlen, "found= can only be false (a line for a key without a record)");
            return -1;
        }
        *found_false = true;
        return 0;
    }
}

int kb_feature_parse_line(kb_feature_rows_t *rows, const char *line, size_t len, char *err, size_t errlen)
{
    assert(rows && (line || len == 0));
    len = s_strip_cr(line, len);
    const char *tab = len > 0 ? memchr(line, '\t', len) : NULL;
    if (!tab) {
        snprintf(err, errlen, "no TAB after the key (expected KEY<TAB>FIELD=VALUE ...)");
        return -1;
    }
    uint8_t key[CARLS_DEFAULT_MAX_KEY_BYTES];
    size_t key_len;
    if (s_decode_key(line, (size_t)(tab - line), "key", key, &key_len, err, errlen) != 0)
        return -1;
    Carls__FeatureRecord *r = carls_xmalloc(sizeof *r);
    carls__feature_record__init(r);
    bool seen[8] = {false};
    bool found_false = false;
    size_t fields = 0;
    const char *p = tab + 1, *tok;
    size_t tok_len;
    while (s_next_token(&p, line + len, &tok, &tok_len)) {
        if (s_field(r, tok, tok_len, seen, &found_false, err, errlen) != 0) {
            s_record_free(r);
            return -1;
        }
        fields++;
    }
    if (found_false) {
        s_record_free(r);
        if (fields != 1) {
            snprintf(err, errlen, "found=false stands alone (a key without a record has no fields)");
            return -1;
        }
        rows->skipped++;
        return 0;
    }
    rows->records = carls_grow(rows->records, &rows->cap, rows->keys->n + 1, sizeof *rows->records);
    rows->records[rows->keys->n] = r;
    kb_rows_append(rows->keys, key, key_len, NULL);
    return 0;
}

static int s_parse_feature(void *ctx, const char *line, size_t len, char *err, size_t errlen)
{
    return kb_feature_parse_line(ctx, line, len, err, errlen);
}

int kb_feature_rows_read(kb_feature_rows_t *rows, FILE *in, FILE *errs, size_t max_reports, size_t *bad_lines_out)
{
    assert(rows && in);
    return s_read_lines(in, errs, max_reports, bad_lines_out, s_parse_feature, rows);
}

int kb_key_write_encoded(FILE *out, const void *key, size_t key_len)
{
    const uint8_t *k = key;
    for (size_t i = 0; i < key_len; i++) {
        uint8_t b = k[i];
        if (b < 0x21 || b > 0x7e || b == '%' || b == ',' || b == ':' || b == '=')
            fprintf(out, "%%%02X", b);
        else
            fputc(b, out);
    }
    return ferror(out) ? -1 : 0;
}

int kb_feature_write_line(FILE *out, const void *key, size_t key_len, const Carls__FeatureRecord *rec, bool meta)
{
    char num[KB_ROWS_FLOAT_CHARS];
    kb_key_write_encoded(out, key, key_len);
    fputc('\t', out);
    if (!rec || !rec->found) {
        fputs("found=false", out);
        return ferror(out) ? -1 : 0;
    }
    const char *sep = "";
    if (rec->label_case == CARLS__FEATURE_RECORD__LABEL_INT_LABEL) {
        fprintf(out, "%slabel=%lld", sep, (long long)rec->int_label);
        sep = " ";
    } else if (rec->label_case == CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL) {
        kb_rows_format_float(rec->float_label, num, sizeof num);
        fprintf(out, "%sflabel=%s", sep, num);
        sep = " ";
    }
    if (rec->label_confidence != 0.0f || signbit(rec->label_confidence)) {
        kb_rows_format_float(rec->label_confidence, num, sizeof num);
        fprintf(out, "%sconfidence=%s", sep, num);
        sep = " ";
    }
    if (rec->version != 0) {
        fprintf(out, "%sversion=%llu", sep, (unsigned long long)rec->version);
        sep = " ";
    }
    size_t nn = rec->n_neighbor_keys < rec->n_neighbor_weights ? rec->n_neighbor_keys : rec->n_neighbor_weights;
    if (nn > 0) {
        fprintf(out, "%sneighbors=", sep);
        for (size_t j = 0; j < nn; j++) {
            if (j)
                fputc(',', out);
            kb_key_write_encoded(out, rec->neighbor_keys[j].data, rec->neighbor_keys[j].len);
            kb_rows_format_float(rec->neighbor_weights[j], num, sizeof num);
            fprintf(out, ":%s", num);
        }
        sep = " ";
    }
    if (rec->data.len > 0) {
        fprintf(out, "%sdata=", sep);
        for (size_t j = 0; j < rec->data.len; j++)
            fprintf(out, "%02x", rec->data.data[j]);
        sep = " ";
    }
    if (meta)
        fprintf(out, "%supdated_at_ms=%lld", sep, (long long)rec->updated_at_ms);
    return ferror(out) ? -1 : 0;
}
