/* NumPy .npy reader and writer (see npy.h). */
#include "npy.h"

#include "bytes.h"
#include "files.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define S_MAGIC "\x93NUMPY"
#define S_MAGIC_LEN 6
#define S_MAX_HEADER 65536 /* NumPy writes a few hundred bytes; a bigger header is not a real array */

/* ---- header parsing ---- */

/* Skips spaces in *p. */
static void s_skip(const char **p)
{
    while (**p == ' ' || **p == '\t')
        (*p)++;
}

/* The value text after the key 'key': in the header dict, or NULL. */
static const char *s_value(const char *header, const char *key)
{
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    const char *k = strstr(header, quoted);
    if (!k)
        return NULL;
    const char *p = k + strlen(quoted);
    s_skip(&p);
    if (*p != ':')
        return NULL;
    p++;
    s_skip(&p);
    return p;
}

/* Parses the dtype text ('<f4', '|u1', ...) into kind and itemsize. */
static int s_descr(const char *path, const char *v, char *kind, int *itemsize, char *err, size_t errlen)
{
    if (!v || (*v != '\'' && *v != '"'))
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: header has no 'descr' string (a structured dtype?)",
                            path);
    char q = *v++;
    char text[16];
    size_t n = 0;
    while (v[n] && v[n] != q && n + 1 < sizeof text) {
        text[n] = v[n];
        n++;
    }
    text[n] = '\0';
    if (v[n] != q)
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: unterminated or unknown dtype in the header", path);
    /* byte order, kind, size: '<f4', '|u1', '=i8' would be host order, which NumPy never writes to a file */
    if (n < 3 || (text[0] != '<' && text[0] != '|' && text[0] != '>'))
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: dtype '%s' is not supported (float32, float64, or an "
                            "integer type)", path, text);
    char k = text[1];
    int size = atoi(text + 2);
    bool ok_size = size == 1 || size == 2 || size == 4 || size == 8;
    if ((k != 'f' && k != 'i' && k != 'u') || !ok_size || (k == 'f' && size != 4 && size != 8) ||
        strspn(text + 2, "0123456789") != strlen(text + 2))
        return carls_errorf(err, errlen, CARLS_NPY_EBAD,
                            "%s: dtype '%s' is not supported (float32, float64, or an integer type)", path, text);
    if (text[0] == '>' && size > 1)
        return carls_errorf(err, errlen, CARLS_NPY_EBAD,
                            "%s: dtype '%s' is big-endian; save it little-endian (a.astype('<%c%d'))", path, text,
                            k, size);
    *kind = k;
    *itemsize = size;
    return 0;
}

/* Parses the shape tuple "(N,)" or "(N, D)". */
static int s_shape(const char *path, const char *v, carls_npy_t *a, char *err, size_t errlen)
{
    if (!v || *v != '(')
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: header has no 'shape' tuple", path);
    const char *p = v + 1;
    uint64_t dims[3];
    int nd = 0;
    for (;;) {
        s_skip(&p);
        if (*p == ')')
            break;
        if (!isdigit((unsigned char)*p))
            return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: malformed 'shape' in the header", path);
        uint64_t d = 0;
        while (isdigit((unsigned char)*p)) {
            d = d * 10 + (uint64_t)(*p - '0');
            if (d > CARLS_NPY_MAX_ITEMS)
                return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: a dimension of the shape is over 2^40", path);
            p++;
        }
        if (nd == 3)
            return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: shape has more than 2 dimensions", path);
        dims[nd++] = d;
        s_skip(&p);
        if (*p == ',')
            p++;
        else if (*p != ')')
            return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: malformed 'shape' in the header", path);
    }
    if (nd == 0)
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: a 0-d array (shape ()) is not a data set", path);
    if (nd > 2)
        return carls_errorf(err, errlen, CARLS_NPY_EBAD,
                            "%s: shape has %d dimensions; expected (N,) or (N, D) (reshape images to (N, H*W))",
                            path, nd);
    a->ndim = nd;
    a->rows = dims[0];
    a->cols = nd == 2 ? dims[1] : 1;
    if (a->cols != 0 && a->rows > CARLS_NPY_MAX_ITEMS / a->cols)
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: shape holds more than 2^40 items", path);
    return 0;
}

int carls_npy_read(const char *path, carls_npy_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return carls_errorf(err, errlen, CARLS_NPY_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = 0;
    char *header = NULL;
    struct stat st;
    unsigned char pre[12];
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EIO, "%s: not a regular file", path);
        goto done;
    }
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, S_MAGIC, S_MAGIC_LEN) != 0) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: not a NumPy .npy file (no \\x93NUMPY magic)", path);
        goto done;
    }
    int major = pre[6];
    size_t header_len, pre_len;
    if (major == 1) {
        header_len = carls_get_le16(pre + 8);
        pre_len = 10;
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: truncated in the header", path);
            goto done;
        }
        header_len = carls_get_le32(pre + 8);
        pre_len = 12;
    } else {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: .npy format version %d.%d is not supported (1, 2, 3)",
                          path, major, pre[7]);
        goto done;
    }
    if (header_len == 0 || header_len > S_MAX_HEADER) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: header length %zu is not plausible", path, header_len);
        goto done;
    }
    header = carls_xmalloc(header_len + 1);
    if (fread(header, 1, header_len, f) != header_len) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: truncated in the header", path);
        goto done;
    }
    header[header_len] = '\0';
    if (strlen(header) != header_len || header[0] != '{' || !strchr(header, '}')) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: header is not a dict literal", path);
        goto done;
    }
    rc = s_descr(path, s_value(header, "descr"), &out->kind, &out->itemsize, err, errlen);
    if (rc)
        goto done;
    const char *fo = s_value(header, "fortran_order");
    if (!fo || (strncmp(fo, "False", 5) != 0 && strncmp(fo, "True", 4) != 0)) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: header has no 'fortran_order' True/False", path);
        goto done;
    }
    if (strncmp(fo, "True", 4) == 0) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD,
                          "%s: array is in Fortran order; save np.ascontiguousarray(a) instead", path);
        goto done;
    }
    rc = s_shape(path, s_value(header, "shape"), out, err, errlen);
    if (rc)
        goto done;
    uint64_t bytes = out->rows * out->cols * (uint64_t)out->itemsize;
    uint64_t have = (uint64_t)st.st_size - pre_len - header_len;
    if ((uint64_t)st.st_size < pre_len + header_len || have < bytes) {
        uint64_t row_bytes = out->cols * (uint64_t)out->itemsize;
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD,
                          "%s: truncated: shape (%llu, %llu) needs %llu data bytes, the file holds %llu (row %llu "
                          "is incomplete)",
                          path, (unsigned long long)out->rows, (unsigned long long)out->cols,
                          (unsigned long long)bytes, (unsigned long long)have,
                          (unsigned long long)(row_bytes ? have / row_bytes : 0));
        goto done;
    }
    if (have > bytes) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EBAD,
                          "%s: %llu bytes after the data that shape (%llu, %llu) describes (wrong shape?)", path,
                          (unsigned long long)(have - bytes), (unsigned long long)out->rows,
                          (unsigned long long)out->cols);
        goto done;
    }
    out->data = carls_xmalloc(bytes ? (size_t)bytes : 1);
    if (bytes && fread(out->data, 1, (size_t)bytes, f) != (size_t)bytes) {
        rc = carls_errorf(err, errlen, CARLS_NPY_EIO, "%s: read error: %s", path, strerror(errno));
        goto done;
    }
done:
    free(header);
    fclose(f);
    if (rc)
        carls_npy_free(out);
    return rc;
}

void carls_npy_free(carls_npy_t *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- conversions ---- */

/* Item i as a double (floats) or, for integers, through *iv / *uv. */
static double s_float_at(const carls_npy_t *a, uint64_t i)
{
    const unsigned char *p = (const unsigned char *)a->data + i * (uint64_t)a->itemsize;
    if (a->itemsize == 4) {
        uint32_t bits = carls_get_le32(p);
        float v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
    uint64_t bits = carls_get_le64(p);
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static uint64_t s_bits_at(const carls_npy_t *a, uint64_t i)
{
    const unsigned char *p = (const unsigned char *)a->data + i * (uint64_t)a->itemsize;
    switch (a->itemsize) {
    case 1: return p[0];
    case 2: return carls_get_le16(p);
    case 4: return carls_get_le32(p);
    default: return carls_get_le64(p);
    }
}

/* A signed integer item, sign-extended from its size. */
static int64_t s_signed(uint64_t bits, int size)
{
    if (size == 8)
        return (int64_t)bits;
    uint64_t sign = (uint64_t)1 << (size * 8 - 1);
    return (int64_t)((bits ^ sign) - sign);
}

int carls_npy_to_f32(const carls_npy_t *a, const char *path, float **out, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t n = a->rows * a->cols;
    float *x = carls_xmalloc(sizeof *x * (n ? (size_t)n : 1));
    for (uint64_t i = 0; i < n; i++) {
        double v;
        if (a->kind == 'f')
            v = s_float_at(a, i);
        else if (a->kind == 'i')
            v = (double)s_signed(s_bits_at(a, i), a->itemsize);
        else
            v = (double)s_bits_at(a, i);
        if (!isfinite(v) || fabs(v) > 3.4e38) {
            free(x);
            return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: row %llu, column %llu: %s", path,
                                (unsigned long long)(i / a->cols), (unsigned long long)(i % a->cols),
                                isnan(v) ? "NaN" : "not a finite float32");
        }
        x[i] = (float)v;
    }
    *out = x;
    return 0;
}

int carls_npy_to_i64(const carls_npy_t *a, const char *path, int64_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (a->kind == 'f')
        return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: holds floats; expected integers (a.astype(np.int64))",
                            path);
    uint64_t n = a->rows * a->cols;
    int64_t *x = carls_xmalloc(sizeof *x * (n ? (size_t)n : 1));
    for (uint64_t i = 0; i < n; i++) {
        uint64_t bits = s_bits_at(a, i);
        if (a->kind == 'u' && bits > (uint64_t)INT64_MAX) {
            free(x);
            return carls_errorf(err, errlen, CARLS_NPY_EBAD, "%s: row %llu: %llu is too large", path,
                                (unsigned long long)(i / a->cols), (unsigned long long)bits);
        }
        x[i] = a->kind == 'i' ? s_signed(bits, a->itemsize) : (int64_t)bits;
    }
    *out = x;
    return 0;
}

/* ---- writing ---- */

/* Writes the 1.0 preamble and header for descr and shape; the header is padded so the data starts at a
 * multiple of 64 bytes, as NumPy does. */
static void s_write_header(FILE *f, const char *descr, uint64_t rows, uint64_t cols)
{
    char dict[256];
    if (cols)
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu, %llu), }", descr,
                 (unsigned long long)rows, (unsigned long long)cols);
    else
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,), }", descr,
                 (unsigned long long)rows);
    size_t len = strlen(dict) + 1; /* + '\n' */
    size_t total = 10 + len;
    size_t pad = (64 - total % 64) % 64;
    unsigned char pre[10];
    memcpy(pre, S_MAGIC, S_MAGIC_LEN);
    pre[6] = 1;
    pre[7] = 0;
    carls_put_le16(pre + 8, (uint16_t)(len + pad));
    fwrite(pre, 1, sizeof pre, f);
    fputs(dict, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
}

static int s_write(const char *path, const char *descr, const void *x, int itemsize, uint64_t rows, uint64_t cols,
                   char *err, size_t errlen)
{
    carls_atomic_file_t *af = NULL;
    if (carls_atomic_open(path, 0644, 0, &af, err, errlen) != 0)
        return CARLS_NPY_EIO;
    FILE *f = carls_atomic_stream(af);
    s_write_header(f, descr, rows, cols);
    uint64_t n = rows * (cols ? cols : 1);
    const unsigned char *src = x;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char le[8];
        if (itemsize == 4) {
            uint32_t bits;
            memcpy(&bits, src + i * 4, 4);
            carls_put_le32(le, bits);
        } else {
            uint64_t bits;
            memcpy(&bits, src + i * 8, 8);
            carls_put_le64(le, bits);
        }
        fwrite(le, 1, (size_t)itemsize, f);
    }
    return carls_atomic_commit(&af, err, errlen) == 0 ? 0 : CARLS_NPY_EIO;
}

int carls_npy_write_f32(const char *path, const float *x, uint64_t rows, uint64_t cols, char *err, size_t errlen)
{
    return s_write(path, "<f4", x, 4, rows, cols, err, errlen);
}

int carls_npy_write_i64(const char *path, const int64_t *x, uint64_t rows, char *err, size_t errlen)
{
    return s_write(path, "<i8", x, 8, rows, 0, err, errlen);
}
