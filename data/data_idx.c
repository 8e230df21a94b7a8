/* IDX reader (see data_idx.h). zlib's gzread also reads files that are not compressed. */
#include "data_idx.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Reads up to n bytes; returns how many were read (< n only at the end of the stream), or -1 on error. */
static int64_t s_gzread_full(gzFile f, void *buf, uint64_t n)
{
    uint64_t done = 0;
    while (done < n) {
        unsigned chunk = n - done > (1u << 30) ? (1u << 30) : (unsigned)(n - done);
        int got = gzread(f, (char *)buf + done, chunk);
        if (got < 0) {
            return -1;
        }
        if (got == 0) {
            break;
        }
        done += (uint64_t)got;
    }
    return (int64_t)done;
}

/* zlib's description of the last error on f (it starts with the file's name). */
static const char *s_gzerr(gzFile f)
{
    int code = 0;
    const char *msg = gzerror(f, &code);
    return (msg && *msg) ? msg : "read error";
}

int carls_idx_read_gz(const char *path, int expected_ndim, carls_idx_t *out, char *err, size_t errlen)
{
    if (!path || !out) {
        return carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "carls_idx_read_gz: no path or output");
    }
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        return carls_errorf(err, errlen, e == ENOENT ? CARLS_IDX_ENOENT : CARLS_IDX_EIO, "cannot open %s: %s", path,
                      strerror(e));
    }
    gzFile f = gzopen(path, "rb");
    if (!f) {
        return carls_errorf(err, errlen, CARLS_IDX_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    int rc = 0;
    uint8_t *data = NULL;
    unsigned char h[4 + 4 * CARLS_IDX_MAX_DIMS];
    int64_t got = s_gzread_full(f, h, 4);
    if (got < 0) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EIO, "%s", s_gzerr(f));
        goto cleanup;
    }
    if (got < 4) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: truncated IDX header (%lld bytes)", path, (long long)got);
        goto cleanup;
    }
    if (h[0] != 0 || h[1] != 0) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: bad IDX magic %02x %02x %02x %02x (must start with 00 00)",
                    path, h[0], h[1], h[2], h[3]);
        goto cleanup;
    }
    if (h[2] != 0x08) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: IDX element type 0x%02x is not unsigned byte (0x08)", path,
                    h[2]);
        goto cleanup;
    }
    int ndim = h[3];
    if (ndim < 1 || ndim > CARLS_IDX_MAX_DIMS || (expected_ndim > 0 && ndim != expected_ndim)) {
        if (expected_ndim > 0) {
            rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: IDX file has %d dimensions, expected %d", path, ndim,
                        expected_ndim);
        } else {
            rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: IDX file has %d dimensions (1..%d allowed)", path, ndim,
                        CARLS_IDX_MAX_DIMS);
        }
        goto cleanup;
    }
    got = s_gzread_full(f, h + 4, 4 * (uint64_t)ndim);
    if (got < 0) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EIO, "%s", s_gzerr(f));
        goto cleanup;
    }
    if (got < 4 * ndim) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: truncated IDX header (dimensions)", path);
        goto cleanup;
    }
    uint64_t count = 1;
    for (int d = 0; d < ndim; d++) {
        const unsigned char *p = h + 4 + 4 * d;
        uint32_t v = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
        if (v < 1 || v > CARLS_IDX_MAX_DIM) {
            rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: IDX dimension %d is %u (1..%u allowed)", path, d, v,
                        CARLS_IDX_MAX_DIM);
            goto cleanup;
        }
        count *= v;
        if (count > CARLS_IDX_MAX_BYTES) {
            rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: IDX data would exceed %llu bytes", path,
                        (unsigned long long)CARLS_IDX_MAX_BYTES);
            goto cleanup;
        }
        out->dims[d] = v;
    }
    data = malloc((size_t)count);
    if (!data) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EIO, "%s: cannot allocate %llu bytes", path, (unsigned long long)count);
        goto cleanup;
    }
    got = s_gzread_full(f, data, count);
    if (got < 0) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EIO, "%s", s_gzerr(f));
        goto cleanup;
    }
    if ((uint64_t)got < count) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: truncated: header says %llu data bytes, file has %lld",
                    path, (unsigned long long)count, (long long)got);
        goto cleanup;
    }
    unsigned char extra;
    got = s_gzread_full(f, &extra, 1);
    if (got < 0) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EIO, "%s", s_gzerr(f));
        goto cleanup;
    }
    if (got > 0) {
        rc = carls_errorf(err, errlen, CARLS_IDX_EFORMAT, "%s: trailing bytes after the %llu data bytes the header declares",
                    path, (unsigned long long)count);
        goto cleanup;
    }
    out->ndim = ndim;
    out->count = count;
    out->data = data;
    data = NULL;
cleanup:
    free(data);
    gzclose(f);
    if (rc) {
        memset(out, 0, sizeof *out);
    }
    return rc;
}

void carls_idx_free(carls_idx_t *idx)
{
    if (!idx) {
        return;
    }
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
