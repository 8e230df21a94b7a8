/* IDX files (the format of MNIST and Fashion-MNIST), gzip-compressed or plain.
 *
 * Layout: 2 zero bytes, a type byte (0x08 = unsigned byte, the only type read here), a byte ndim, then ndim
 * big-endian u32 dimensions, then the product of the dimensions in data bytes, and nothing after. The reader
 * validates all of it against caps and against the (decompressed) length before and after allocating, and
 * says exactly what is wrong with a bad file. */
#ifndef CARLS_DATA_IDX_H
#define CARLS_DATA_IDX_H

#include <stddef.h>
#include <stdint.h>

#define CARLS_IDX_MAX_DIMS 4
#define CARLS_IDX_MAX_DIM (1u << 24)      /* per dimension */
#define CARLS_IDX_MAX_BYTES (1ull << 31)  /* data bytes in all */

typedef struct {
    int ndim;                         /* 1..CARLS_IDX_MAX_DIMS */
    uint32_t dims[CARLS_IDX_MAX_DIMS]; /* dims[0..ndim-1], each >= 1 */
    uint64_t count;                   /* product of dims = bytes of data */
    uint8_t *data;                    /* (count), owned; free with carls_idx_free */
} carls_idx_t;

enum {
    CARLS_IDX_OK = 0,
    CARLS_IDX_ENOENT = -1,  /* the file does not exist */
    CARLS_IDX_EIO = -2,     /* cannot read it, or the gzip stream is damaged */
    CARLS_IDX_EFORMAT = -3, /* not a valid IDX file of unsigned bytes (header, sizes, length) */
};

/* Reads path into *out (zeroed first). expected_ndim > 0 requires exactly that many dimensions. Returns 0 or a
 * negative CARLS_IDX_E* code with a message in err (errlen bytes). */
int carls_idx_read_gz(const char *path, int expected_ndim, carls_idx_t *out, char *err, size_t errlen);

/* Frees out->data and zeroes *out; accepts NULL. */
void carls_idx_free(carls_idx_t *idx);

#endif
