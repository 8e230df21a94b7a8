/* NumPy .npy files (format versions 1.0, 2.0 and 3.0), the way NumPy's own np.save writes them:
 *
 *   "\x93NUMPY" major minor  header-length (2 bytes little-endian in 1.0, 4 bytes in 2.0/3.0)
 *   header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (N, D), } padded with
 *           spaces and ended by '\n'
 *   data:   N*D items, C order (row after row)
 *
 * A file is untrusted: the reader checks the magic, the version, the header's length and syntax, the dtype
 * (little-endian or single-byte: float32/float64 features, unsigned/signed integers of 1, 2, 4 or 8 bytes),
 * refuses Fortran order, a shape of more than two dimensions or one that overflows, and a data part shorter
 * or longer than the shape says; every message names the file. Conversions (carls_npy_to_f32,
 * carls_npy_to_i64) refuse NaN, infinities and values an int64 cannot hold, naming the file and the row.
 * The writers go through base/files' atomic write (a reader never sees half a file). */
#ifndef CARLS_NPY_H
#define CARLS_NPY_H

#include <stddef.h>
#include <stdint.h>

enum {
    CARLS_NPY_OK = 0,
    CARLS_NPY_EIO = -1,  /* cannot open, read or write the file */
    CARLS_NPY_EBAD = -2, /* not a valid .npy file, or a dtype/shape this reader does not take */
};

/* The largest dimension or item count accepted (2^40): a header cannot make the reader allocate more than
 * the file holds, since the data size is checked against the file's size first. */
#define CARLS_NPY_MAX_ITEMS ((uint64_t)1 << 40)

/* A whole .npy array in memory. */
typedef struct {
    char kind;        /* 'f' float, 'i' signed integer, 'u' unsigned integer */
    int itemsize;     /* bytes per item: 1, 2, 4 or 8 ('f': 4 or 8) */
    int ndim;         /* 1 or 2 (0-d arrays are refused) */
    uint64_t rows;    /* shape[0] */
    uint64_t cols;    /* shape[1], 1 when ndim == 1 */
    void *data;       /* rows * cols items, little-endian, C order (owned) */
} carls_npy_t;

/* Reads path whole into *out (zeroed first; owns data on success). */
int carls_npy_read(const char *path, carls_npy_t *out, char *err, size_t errlen);

/* The array's items as float32 (malloc'd, caller frees), rows*cols of them. Refuses NaN and infinities
 * (and float64 values beyond float32's range), naming path and the row (0-based). */
int carls_npy_to_f32(const carls_npy_t *a, const char *path, float **out, char *err, size_t errlen);

/* The array's items as int64 (malloc'd, caller frees). Refuses float arrays, and uint64 values above
 * INT64_MAX, naming path and the row. */
int carls_npy_to_i64(const carls_npy_t *a, const char *path, int64_t **out, char *err, size_t errlen);

void carls_npy_free(carls_npy_t *a);

/* Writes a float32 array of shape (rows, cols) (cols 0: the 1-d shape (rows,)) as path, atomically. */
int carls_npy_write_f32(const char *path, const float *x, uint64_t rows, uint64_t cols, char *err, size_t errlen);

/* Writes an int64 array of shape (rows,) as path, atomically. */
int carls_npy_write_i64(const char *path, const int64_t *x, uint64_t rows, char *err, size_t errlen);

#endif
