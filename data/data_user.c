/* A user's own data set from .npy or CSV files (see data_user.h). */
#include "data_user.h"

#include "npy.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Features or labels of one split before they become an image set. */
typedef struct {
    uint64_t n, dim;
    float *x;      /* (n, dim) when the features were floats */
    uint8_t *u8;   /* (n, dim) when they were bytes */
    int64_t *y;    /* (n) labels */
} s_split_t;

static void s_split_free(s_split_t *s)
{
    free(s->x);
    free(s->u8);
    free(s->y);
    memset(s, 0, sizeof *s);
}

/* ---- .npy ---- */

static int s_npy_features(const char *path, s_split_t *s, char *err, size_t errlen)
{
    carls_npy_t a;
    int rc = carls_npy_read(path, &a, err, errlen);
    if (rc)
        return rc == CARLS_NPY_EIO ? CARLS_USER_EIO : CARLS_USER_EBAD;
    if (a.ndim != 2 || a.rows == 0 || a.cols == 0) {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD,
                          "%s: features must have shape (N, D) with N, D > 0; this is %s(%llu%s%llu)", path,
                          a.ndim == 2 ? "" : "1-d ", (unsigned long long)a.rows, a.ndim == 2 ? ", " : ",",
                          a.ndim == 2 ? (unsigned long long)a.cols : 0ULL);
        goto done;
    }
    if (a.rows > INT32_MAX || a.cols > INT32_MAX) {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: more than 2^31 rows or columns", path);
        goto done;
    }
    s->n = a.rows;
    s->dim = a.cols;
    if (a.kind == 'u' && a.itemsize == 1) {
        s->u8 = a.data; /* taken over */
        a.data = NULL;
    } else if (a.kind == 'f') {
        if (carls_npy_to_f32(&a, path, &s->x, err, errlen) != 0)
            rc = CARLS_USER_EBAD;
    } else {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD,
                          "%s: features of an integer type other than uint8; save float32 or uint8", path);
    }
done:
    carls_npy_free(&a);
    return rc;
}

static int s_npy_labels(const char *path, s_split_t *s, char *err, size_t errlen)
{
    carls_npy_t a;
    int rc = carls_npy_read(path, &a, err, errlen);
    if (rc)
        return rc == CARLS_NPY_EIO ? CARLS_USER_EIO : CARLS_USER_EBAD;
    if (!(a.ndim == 1 || (a.ndim == 2 && a.cols == 1))) {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: labels must have shape (N,); this is (%llu, %llu)",
                          path, (unsigned long long)a.rows, (unsigned long long)a.cols);
    } else if (carls_npy_to_i64(&a, path, &s->y, err, errlen) != 0) {
        rc = CARLS_USER_EBAD;
    }
    if (rc == 0 && a.rows != s->n)
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s has %llu labels but the features have %llu rows", path,
                          (unsigned long long)a.rows, (unsigned long long)s->n);
    carls_npy_free(&a);
    return rc;
}

/* ---- CSV ---- */

/* Splits line (modified) at commas into fields (at most max), trimming blanks; returns the count, or max+1 when
 * there are more. */
static size_t s_fields(char *line, char **fields, size_t max)
{
    size_t n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    char *p = line;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        char *end = p + strlen(p);
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (n == max)
            return max + 1;
        fields[n++] = p;
        if (!comma)
            return n;
        p = comma + 1;
    }
}

static int s_csv_features(const char *path, s_split_t *s, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, CARLS_USER_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL, **fields = NULL;
    size_t cap = 0, xcap = 0, fcap = 0;
    uint64_t lineno = 0, n = 0, dim = 0;
    float *x = NULL;
    int rc = 0;
    while (getline(&line, &cap, f) != -1) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue; /* blank lines (a trailing newline) */
        size_t commas = 1;
        for (const char *c = line; *c; c++)
            commas += *c == ',';
        if (commas > fcap) {
            fcap = commas;
            fields = carls_xrealloc(fields, sizeof *fields * fcap);
        }
        size_t nf = s_fields(line, fields, fcap);
        float probe;
        if (n == 0 && dim == 0 && carls_parse_float(fields[0], &probe) != 0 && strcasecmp(fields[0], "nan") != 0)
            continue; /* a header line */
        if (dim == 0)
            dim = nf;
        if (nf != dim) {
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: line %llu has %zu values, the first row %llu", path,
                              (unsigned long long)lineno, nf, (unsigned long long)dim);
            goto done;
        }
        x = carls_grow(x, &xcap, (size_t)((n + 1) * dim), sizeof *x);
        for (size_t j = 0; j < nf; j++) {
            if (carls_parse_float(fields[j], &x[n * dim + j]) != 0) {
                rc = carls_errorf(err, errlen, CARLS_USER_EBAD,
                                  "%s: line %llu, column %zu: '%s' is not a finite number", path, (unsigned long long)lineno, j + 1, fields[j]);
                goto done;
            }
        }
        if (++n > INT32_MAX) {
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: more than 2^31 rows", path);
            goto done;
        }
    }
    if (ferror(f)) {
        rc = carls_errorf(err, errlen, CARLS_USER_EIO, "%s: read error", path);
        goto done;
    }
    if (n == 0) {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: no rows of features", path);
        goto done;
    }
    s->n = n;
    s->dim = dim;
    s->x = x;
    x = NULL;
done:
    free(x);
    free(fields);
    free(line);
    fclose(f);
    return rc;
}

static int s_csv_labels(const char *path, s_split_t *s, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, CARLS_USER_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, ycap = 0;
    uint64_t lineno = 0, n = 0;
    int64_t *y = NULL;
    int rc = 0;
    while (getline(&line, &cap, f) != -1) {
        lineno++;
        char *field;
        if (s_fields(line, &field, 1) != 1) {
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: line %llu: more than one value (one label a line)",
                              path, (unsigned long long)lineno);
            goto done;
        }
        if (field[0] == '\0')
            continue;
        int64_t v;
        if (carls_parse_i64(field, &v) != 0) {
            if (n == 0 && lineno == 1)
                continue; /* a header */
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: line %llu: '%s' is not an integer label", path,
                              (unsigned long long)lineno, field);
            goto done;
        }
        y = carls_grow(y, &ycap, (size_t)n + 1, sizeof *y);
        y[n++] = v;
    }
    if (n != s->n) {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "%s has %llu labels but the features have %llu rows", path,
                          (unsigned long long)n, (unsigned long long)s->n);
        goto done;
    }
    s->y = y;
    y = NULL;
done:
    free(y);
    free(line);
    fclose(f);
    return rc;
}

/* ---- specs ---- */

int carls_user_data_is_spec(const char *data)
{
    return data && (strncmp(data, "npy:", 4) == 0 || strncmp(data, "csv:", 4) == 0);
}

/* Reads one split named by spec; what names the row in messages depends on the format. */
static int s_load_split(const char *spec, const char *what, s_split_t *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (!carls_user_data_is_spec(spec))
        return carls_errorf(err, errlen, CARLS_USER_EBAD,
                            "%s '%s': expected npy:FEATURES.npy,LABELS.npy or csv:FEATURES.csv,LABELS.csv", what,
                            spec ? spec : "");
    bool npy = spec[0] == 'n';
    const char *files = spec + 4;
    const char *comma = strchr(files, ',');
    if (!comma || comma == files || !comma[1] || strchr(comma + 1, ','))
        return carls_errorf(err, errlen, CARLS_USER_EBAD, "%s '%s': expected two files, FEATURES,LABELS", what, spec);
    char fpath[4096], lpath[4096];
    if ((size_t)(comma - files) >= sizeof fpath || strlen(comma + 1) >= sizeof lpath)
        return carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: a path is too long", what);
    memcpy(fpath, files, (size_t)(comma - files));
    fpath[comma - files] = '\0';
    snprintf(lpath, sizeof lpath, "%s", comma + 1);
    int rc = npy ? s_npy_features(fpath, s, err, errlen) : s_csv_features(fpath, s, err, errlen);
    if (rc == 0)
        rc = npy ? s_npy_labels(lpath, s, err, errlen) : s_csv_labels(lpath, s, err, errlen);
    if (rc) {
        s_split_free(s); /* the features, when the labels were refused */
        return rc;
    }
    if (s->dim > 1 << 20) {
        s_split_free(s);
        return carls_errorf(err, errlen, CARLS_USER_EBAD, "%s: %llu features a row is over the limit (2^20)", fpath,
                            (unsigned long long)s->dim);
    }
    for (uint64_t i = 0; i < s->n; i++) {
        if (s->y[i] < -1 || s->y[i] >= CARLS_USER_MAX_CLASSES) {
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD,
                              "%s: row %llu: label %lld is out of range (-1 for unlabelled, or a class 0..%d)", lpath,
                              (unsigned long long)i, (long long)s->y[i],
                              CARLS_USER_MAX_CLASSES - 1);
            s_split_free(s);
            return rc;
        }
    }
    return 0;
}

/* Fills set from split s, mapping float features by value -> (value - lo) * scale, clipped to 0..255. */
static void s_to_set(const s_split_t *s, float lo, float scale, carls_image_set_t *set)
{
    set->n = (int)s->n;
    set->rows = 1;
    set->cols = (int)s->dim;
    set->dim = (int)s->dim;
    size_t items = (size_t)(s->n * s->dim);
    set->pixels = carls_xmalloc(items ? items : 1);
    if (s->u8) {
        memcpy(set->pixels, s->u8, items);
    } else {
        for (size_t i = 0; i < items; i++) {
            float v = (s->x[i] - lo) * scale;
            set->pixels[i] = (uint8_t)(v <= 0.0f ? 0 : v >= 255.0f ? 255 : lrintf(v));
        }
    }
    set->labels = carls_xmalloc(s->n ? (size_t)s->n : 1);
    for (uint64_t i = 0; i < s->n; i++)
        set->labels[i] = s->y[i] < 0 ? CARLS_LABEL_NONE : (uint8_t)s->y[i];
}

int carls_user_data_load(const char *spec, const char *test_spec, carls_fmnist_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    s_split_t tr, te;
    memset(&te, 0, sizeof te);
    int rc = s_load_split(spec, "data", &tr, err, errlen);
    if (rc)
        return rc;
    bool has_test = test_spec && test_spec[0];
    if (has_test) {
        rc = s_load_split(test_spec, "test_data", &te, err, errlen);
        if (rc == 0 && te.dim != tr.dim)
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "test_data has %llu features a row, data %llu",
                              (unsigned long long)te.dim, (unsigned long long)tr.dim);
        if (rc == 0 && (te.u8 == NULL) != (tr.u8 == NULL))
            rc = carls_errorf(err, errlen, CARLS_USER_EBAD,
                              "test_data and data must both be floats or both be uint8 features");
        for (uint64_t i = 0; rc == 0 && i < te.n; i++) {
            if (te.y[i] < 0)
                rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "test_data '%s': example %llu has no label (-1)",
                                  test_spec, (unsigned long long)i);
        }
    }
    if (rc)
        goto done;
    int64_t max_label = -1;
    for (uint64_t i = 0; i < tr.n; i++)
        max_label = tr.y[i] > max_label ? tr.y[i] : max_label;
    for (uint64_t i = 0; i < te.n; i++)
        max_label = te.y[i] > max_label ? te.y[i] : max_label;
    if (max_label < 1) {
        rc = carls_errorf(err, errlen, CARLS_USER_EBAD, "data '%s': the labels name fewer than two classes", spec);
        goto done;
    }
    float lo = 0.0f, scale = 1.0f;
    if (tr.x) {
        float hi = tr.x[0];
        lo = tr.x[0];
        for (size_t i = 1; i < (size_t)(tr.n * tr.dim); i++) {
            lo = tr.x[i] < lo ? tr.x[i] : lo;
            hi = tr.x[i] > hi ? tr.x[i] : hi;
        }
        scale = hi > lo ? 255.0f / (hi - lo) : 1.0f;
    }
    s_to_set(&tr, lo, scale, &out->train);
    if (has_test)
        s_to_set(&te, lo, scale, &out->test);
    out->classes = (int)max_label + 1;
done:
    s_split_free(&tr);
    s_split_free(&te);
    return rc;
}

int carls_dataset_load(const char *data, const char *data_dir, const char *test_spec, carls_fmnist_t *out, char *err,
                       size_t errlen)
{
    if (carls_user_data_is_spec(data))
        return carls_user_data_load(data, test_spec, out, err, errlen);
    memset(out, 0, sizeof *out);
    if (!data || strcmp(data, "fashion-mnist") != 0)
        return carls_errorf(err, errlen, CARLS_USER_EBAD,
                            "data '%s': expected fashion-mnist, npy:FEATURES.npy,LABELS.npy or csv:FEATURES.csv,"
                            "LABELS.csv",
                            data ? data : "");
    if (test_spec && test_spec[0])
        return carls_errorf(err, errlen, CARLS_USER_EBAD,
                            "test_data is for a user data set (npy: or csv:); Fashion-MNIST has its own test set");
    return carls_fmnist_load(data_dir, out, err, errlen); /* CARLS_FMNIST_EMISSING when not installed */
}
