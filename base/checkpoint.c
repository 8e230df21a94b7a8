/* Checkpoint files (see checkpoint.h).
 *
 * Byte layout, all integers little-endian, floats IEEE-754 binary32 little-endian:
 *
 *   offset  size        field
 *   0       8           magic "CARLSCKP"
 *   8       4           u32 format version: 1 (tensors only) or 2 (tensors, then blobs)
 *   12      4           u32 entry count: tensors + blobs (<= CARLS_CKPT_MAX_TENSORS)
 *   16      8           u64 file length in bytes, this header and the trailing CRC included
 *   24      8           u64 step
 *   32      2           u16 kind length K            (1..CARLS_CKPT_MAX_KIND)
 *   34      K           model kind, bytes (e.g. "mlp_classifier")
 *   then, per tensor:
 *           2           u16 name length L            (1..CARLS_CKPT_MAX_NAME)
 *           L           name bytes (no NUL)
 *           1           u8 dtype (1 = float32)
 *           1           u8 ndim                      (1..CARLS_CKPT_MAX_DIMS)
 *           8 * ndim    u64 dims, each >= 1, product <= CARLS_CKPT_MAX_ELEMENTS
 *           4 * numel   data, row-major
 *   then, version 2 only, per blob (at least one; at most CARLS_CKPT_MAX_BLOBS; after every tensor):
 *           2           u16 name length L            (1..CARLS_CKPT_MAX_NAME)
 *           L           name bytes (no NUL)
 *           1           u8 dtype (2 = bytes)
 *           1           u8 ndim (1)
 *           8           u64 length N                 (1..CARLS_CKPT_MAX_ELEMENTS)
 *           N           the bytes
 *   end-4   4           u32 CRC-32 (zlib's crc32) of every byte before it
 *
 * The version is 2 exactly when there are blobs, so a file the reader accepts is the one the writer makes of
 * what was read (no slack: the fuzz target checks it). Reading checks, in order: magic, version, tensor count cap, the stated length against the cap and the real
 * file size (shorter: truncated; longer: trailing bytes), the CRC over the whole file, then each tensor's
 * name, dtype and shape against the caps and the bytes that remain, and finally that nothing is left over.
 * Only the file itself (bounded by its real size) and the tensor table (bounded by the count cap) are
 * allocated before the checks that justify them. */
#include "checkpoint.h"
#include "bytes.h"
#include "files.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c stores floats with memcpy and assumes a little-endian host"
#endif

#define S_HEADER_BYTES 34u /* fixed part of the header, before the kind */
#define S_DTYPE_F32 1u
#define S_DTYPE_BYTES 2u

/* A blob: len bytes, followed in memory (not in the file) by a NUL. */
typedef struct {
    char *name;
    unsigned char *data; /* (len + 1), owned */
    size_t len;
} s_blob_t;

struct carls_ckpt {
    char kind[CARLS_CKPT_MAX_KIND + 1]; /* model kind, NUL-terminated */
    uint64_t step;                      /* training step the tensors belong to */
    int count;                          /* tensors in use */
    size_t cap;                         /* tensors allocated */
    carls_ckpt_tensor_t *tensors;       /* (cap), owned */
    int n_blobs;                        /* blobs in use */
    size_t blob_cap;                    /* blobs allocated */
    s_blob_t *blobs;                    /* (blob_cap), owned */
    uint32_t crc;                       /* CRC of the file it was read from, else 0 */
    uint64_t file_bytes;                /* size of the file it was read from, else 0 */
};

const char *carls_ckpt_strerror(int rc)
{
    switch (rc) {
    case CARLS_CKPT_OK:
        return "ok";
    case CARLS_CKPT_EIO:
        return "i/o error";
    case CARLS_CKPT_EMAGIC:
        return "bad magic";
    case CARLS_CKPT_EVERSION:
        return "unsupported version";
    case CARLS_CKPT_ETRUNCATED:
        return "truncated";
    case CARLS_CKPT_ECHECKSUM:
        return "checksum mismatch";
    case CARLS_CKPT_ELIMIT:
        return "over a limit";
    case CARLS_CKPT_ECORRUPT:
        return "corrupt";
    case CARLS_CKPT_EINVAL:
        return "invalid argument";
    }
    return "unknown error";
}

/* ---- in-memory checkpoint ---- */

carls_ckpt_t *carls_ckpt_new(const char *kind, uint64_t step)
{
    if (!kind) {
        return NULL;
    }
    size_t len = strlen(kind);
    if (len == 0 || len > CARLS_CKPT_MAX_KIND) {
        return NULL;
    }
    carls_ckpt_t *self = calloc(1, sizeof *self);
    if (!self) {
        return NULL;
    }
    memcpy(self->kind, kind, len + 1);
    self->step = step;
    return self;
}

static void s_tensor_free(carls_ckpt_tensor_t *t)
{
    free(t->name);
    free(t->data);
    memset(t, 0, sizeof *t);
}

void carls_ckpt_destroy(carls_ckpt_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    carls_ckpt_t *self = *self_p;
    for (int i = 0; i < self->count; i++) {
        s_tensor_free(&self->tensors[i]);
    }
    free(self->tensors);
    for (int i = 0; i < self->n_blobs; i++) {
        free(self->blobs[i].name);
        free(self->blobs[i].data);
    }
    free(self->blobs);
    free(self);
    *self_p = NULL;
}

/* numel of a shape, or 0 when the shape is outside the caps. */
static uint64_t s_shape_numel(int ndim, const int64_t *dims)
{
    if (ndim < 1 || ndim > CARLS_CKPT_MAX_DIMS) {
        return 0;
    }
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] < 1 || (uint64_t)dims[d] > CARLS_CKPT_MAX_ELEMENTS) {
            return 0;
        }
        n *= (uint64_t)dims[d]; /* both factors <= 2^31, so no overflow before the check */
        if (n > CARLS_CKPT_MAX_ELEMENTS) {
            return 0;
        }
    }
    return n;
}

const carls_ckpt_tensor_t *carls_ckpt_find(const carls_ckpt_t *self, const char *name)
{
    if (!self || !name) {
        return NULL;
    }
    for (int i = 0; i < self->count; i++) {
        if (strcmp(self->tensors[i].name, name) == 0) {
            return &self->tensors[i];
        }
    }
    return NULL;
}

static const s_blob_t *s_find_blob(const carls_ckpt_t *self, const char *name)
{
    for (int i = 0; self && name && i < self->n_blobs; i++) {
        if (strcmp(self->blobs[i].name, name) == 0) {
            return &self->blobs[i];
        }
    }
    return NULL;
}

/* Whether name may be added: 1..CARLS_CKPT_MAX_NAME bytes, not yet a tensor's or a blob's, room for one more
 * entry. */
static bool s_name_free(const carls_ckpt_t *self, const char *name)
{
    size_t len = strlen(name);
    return len > 0 && len <= CARLS_CKPT_MAX_NAME && !carls_ckpt_find(self, name) && !s_find_blob(self, name) &&
           (unsigned)(self->count + self->n_blobs) < CARLS_CKPT_MAX_TENSORS;
}

/* Appends a tensor, taking ownership of name and data. */
static int s_append(carls_ckpt_t *self, char *name, int ndim, const int64_t *dims, uint64_t numel, float *data)
{
    self->tensors = carls_grow(self->tensors, &self->cap, (size_t)self->count + 1, sizeof *self->tensors);
    carls_ckpt_tensor_t *t = &self->tensors[self->count++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        t->dims[d] = dims[d];
    }
    t->numel = (int64_t)numel;
    t->data = data;
    return 0;
}

int carls_ckpt_add(carls_ckpt_t *self, const char *name, int ndim, const int64_t *dims, const float *data)
{
    if (!self || !name || !dims || !data) {
        return CARLS_CKPT_EINVAL;
    }
    if (!s_name_free(self, name)) {
        return CARLS_CKPT_EINVAL;
    }
    uint64_t numel = s_shape_numel(ndim, dims);
    if (numel == 0) {
        return CARLS_CKPT_EINVAL;
    }
    char *n = strdup(name);
    float *copy = malloc(sizeof(float) * numel);
    if (!n || !copy) {
        free(n);
        free(copy);
        return CARLS_CKPT_EIO;
    }
    memcpy(copy, data, sizeof(float) * numel);
    int rc = s_append(self, n, ndim, dims, numel, copy);
    if (rc) {
        free(n);
        free(copy);
    }
    return rc;
}

/* Appends a blob, copying name and data. */
static int s_append_blob(carls_ckpt_t *self, const char *name, const void *data, size_t len)
{
    char *n = strdup(name);
    unsigned char *copy = malloc(len + 1);
    if (!n || !copy) {
        free(n);
        free(copy);
        return CARLS_CKPT_EIO;
    }
    memcpy(copy, data, len);
    copy[len] = '\0';
    self->blobs = carls_grow(self->blobs, &self->blob_cap, (size_t)self->n_blobs + 1, sizeof *self->blobs);
    self->blobs[self->n_blobs++] = (s_blob_t){.name = n, .data = copy, .len = len};
    return 0;
}

int carls_ckpt_add_blob(carls_ckpt_t *self, const char *name, const void *data, size_t len)
{
    if (!self || !name || !data || len == 0 || len > CARLS_CKPT_MAX_ELEMENTS || !s_name_free(self, name) ||
        (unsigned)self->n_blobs >= CARLS_CKPT_MAX_BLOBS) {
        return CARLS_CKPT_EINVAL;
    }
    return s_append_blob(self, name, data, len);
}

const void *carls_ckpt_blob(const carls_ckpt_t *self, const char *name, size_t *len)
{
    const s_blob_t *b = s_find_blob(self, name);
    if (len) {
        *len = b ? b->len : 0;
    }
    return b ? b->data : NULL;
}

int carls_ckpt_blob_count(const carls_ckpt_t *self)
{
    return self ? self->n_blobs : 0;
}

const char *carls_ckpt_blob_name(const carls_ckpt_t *self, int i, size_t *len)
{
    if (!self || i < 0 || i >= self->n_blobs) {
        return NULL;
    }
    if (len) {
        *len = self->blobs[i].len;
    }
    return self->blobs[i].name;
}

int carls_ckpt_add_u64(carls_ckpt_t *self, const char *name, uint64_t value)
{
    unsigned char b[8];
    carls_put_le64(b, value);
    return carls_ckpt_add_blob(self, name, b, sizeof b);
}

int carls_ckpt_get_u64(const carls_ckpt_t *self, const char *name, uint64_t *value, char *err, size_t errlen)
{
    size_t len = 0;
    const unsigned char *b = carls_ckpt_blob(self, name, &len);
    if (!b || len != 8) {
        return carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "blob '%s' %s", name ? name : "(null)",
                            b ? "is not 8 bytes" : "is missing");
    }
    *value = carls_get_le64(b);
    return 0;
}

int carls_ckpt_add_text(carls_ckpt_t *self, const char *name, const char *text)
{
    return text ? carls_ckpt_add_blob(self, name, text, strlen(text)) : CARLS_CKPT_EINVAL;
}

const char *carls_ckpt_text(const carls_ckpt_t *self, const char *name)
{
    const s_blob_t *b = s_find_blob(self, name);
    return b && strlen((const char *)b->data) == b->len ? (const char *)b->data : NULL;
}

uint64_t carls_ckpt_step(const carls_ckpt_t *self)
{
    return self->step;
}

const char *carls_ckpt_kind(const carls_ckpt_t *self)
{
    return self->kind;
}

int carls_ckpt_count(const carls_ckpt_t *self)
{
    return self->count;
}

const carls_ckpt_tensor_t *carls_ckpt_tensor(const carls_ckpt_t *self, int i)
{
    return (self && i >= 0 && i < self->count) ? &self->tensors[i] : NULL;
}

uint32_t carls_ckpt_crc(const carls_ckpt_t *self)
{
    return self->crc;
}

uint64_t carls_ckpt_file_bytes(const carls_ckpt_t *self)
{
    return self->file_bytes;
}

/* ---- little-endian helpers ---- */

/* ---- writing ---- */

typedef struct {
    FILE *f;      /* output */
    uint32_t crc; /* running CRC of everything written */
    bool failed;  /* a write failed */
    int error;    /* errno of the failed write */
} s_writer_t;

static void s_emit(s_writer_t *w, const void *data, size_t len)
{
    if (w->failed || len == 0) {
        return;
    }
    if (fwrite(data, 1, len, w->f) != len) {
        w->failed = true;
        w->error = errno ? errno : EIO;
        return;
    }
    w->crc = carls_crc32(w->crc, data, len);
}

static uint64_t s_file_bytes(const carls_ckpt_t *self)
{
    uint64_t n = S_HEADER_BYTES + strlen(self->kind) + 4;
    for (int i = 0; i < self->count; i++) {
        const carls_ckpt_tensor_t *t = &self->tensors[i];
        n += 2 + strlen(t->name) + 2 + 8u * (uint64_t)t->ndim + 4u * (uint64_t)t->numel;
    }
    for (int i = 0; i < self->n_blobs; i++) {
        n += 2 + strlen(self->blobs[i].name) + 2 + 8 + (uint64_t)self->blobs[i].len;
    }
    return n;
}

static void s_write_body(const carls_ckpt_t *self, s_writer_t *w)
{
    unsigned char h[S_HEADER_BYTES];
    size_t kind_len = strlen(self->kind);
    memcpy(h, CARLS_CKPT_MAGIC, 8);
    carls_put_le32(h + 8, self->n_blobs ? CARLS_CKPT_VERSION_BLOBS : CARLS_CKPT_VERSION);
    carls_put_le32(h + 12, (uint32_t)(self->count + self->n_blobs));
    carls_put_le64(h + 16, s_file_bytes(self));
    carls_put_le64(h + 24, self->step);
    carls_put_le16(h + 32, (uint16_t)kind_len);
    s_emit(w, h, sizeof h);
    s_emit(w, self->kind, kind_len);
    for (int i = 0; i < self->count; i++) {
        const carls_ckpt_tensor_t *t = &self->tensors[i];
        unsigned char th[4 + 8 * CARLS_CKPT_MAX_DIMS];
        size_t name_len = strlen(t->name);
        carls_put_le16(th, (uint16_t)name_len);
        s_emit(w, th, 2);
        s_emit(w, t->name, name_len);
        th[0] = S_DTYPE_F32;
        th[1] = (unsigned char)t->ndim;
        for (int d = 0; d < t->ndim; d++) {
            carls_put_le64(th + 2 + 8 * d, (uint64_t)t->dims[d]);
        }
        s_emit(w, th, 2 + 8 * (size_t)t->ndim);
        s_emit(w, t->data, sizeof(float) * (size_t)t->numel);
    }
    for (int i = 0; i < self->n_blobs; i++) {
        const s_blob_t *b = &self->blobs[i];
        unsigned char th[12];
        size_t name_len = strlen(b->name);
        carls_put_le16(th, (uint16_t)name_len);
        s_emit(w, th, 2);
        s_emit(w, b->name, name_len);
        th[0] = S_DTYPE_BYTES;
        th[1] = 1;
        carls_put_le64(th + 2, (uint64_t)b->len);
        s_emit(w, th, 10);
        s_emit(w, b->data, b->len);
    }
}

int carls_ckpt_write(const carls_ckpt_t *self, const char *path, char *err, size_t errlen)
{
    if (!self || !path || !*path) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "carls_ckpt_write: no checkpoint or path");
    }
    carls_atomic_file_t *file = NULL;
    int rc = carls_atomic_open(path, 0644, 0, &file, err, errlen);
    if (rc != 0) {
        return CARLS_CKPT_EIO;
    }
    s_writer_t w = {.f = carls_atomic_stream(file), .crc = 0};
    s_write_body(self, &w);
    unsigned char crc[4];
    carls_put_le32(crc, w.crc); /* the CRC covers everything before it */
    s_emit(&w, crc, 4);
    if (w.failed) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "write %s: %s", carls_atomic_tmp_path(file),
                          strerror(w.error));
        carls_atomic_abort(&file);
        return rc;
    }
    return carls_atomic_commit(&file, err, errlen) == 0 ? 0 : CARLS_CKPT_EIO;
}

/* ---- reading ---- */

typedef struct {
    const unsigned char *p; /* next byte */
    const unsigned char *end;
} s_cursor_t;

static bool s_take(s_cursor_t *c, size_t n, const unsigned char **out)
{
    if ((size_t)(c->end - c->p) < n) {
        return false;
    }
    *out = c->p;
    c->p += n;
    return true;
}

static int s_read_all(int fd, unsigned char *buf, uint64_t n)
{
    uint64_t done = 0;
    while (done < n) {
        size_t want = n - done > (1u << 30) ? (1u << 30) : (size_t)(n - done);
        ssize_t got = read(fd, buf + done, want);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (got == 0) {
            errno = EIO; /* the file shrank under us */
            return -1;
        }
        done += (uint64_t)got;
    }
    return 0;
}

/* Parses blob `name` (its header up to meta, the dtype and ndim bytes, already taken from c) into self. */
static int s_parse_blob(carls_ckpt_t *self, s_cursor_t *c, const unsigned char *meta, const char *name,
                        const char *path, char *err, size_t errlen)
{
    if (meta[1] != 1) {
        return carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: blob '%s': %u dimensions (1 allowed)", path, name,
                            meta[1]);
    }
    const unsigned char *len_p, *data_p;
    if (!s_take(c, 8, &len_p)) {
        return carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: blob '%s': length runs past the end", path, name);
    }
    const uint64_t len = carls_get_le64(len_p);
    if (len < 1 || len > CARLS_CKPT_MAX_ELEMENTS) {
        return carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: blob '%s': length %llu outside 1..%llu", path, name,
                            (unsigned long long)len, (unsigned long long)CARLS_CKPT_MAX_ELEMENTS);
    }
    if (!s_take(c, (size_t)len, &data_p)) {
        return carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: blob '%s': %llu bytes declared but only %zu remain",
                            path, name, (unsigned long long)len, (size_t)(c->end - c->p));
    }
    if (carls_ckpt_find(self, name) || s_find_blob(self, name)) {
        return carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: '%s' appears twice", path, name);
    }
    if ((unsigned)self->n_blobs >= CARLS_CKPT_MAX_BLOBS) {
        return carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: more than %u blobs", path, CARLS_CKPT_MAX_BLOBS);
    }
    if (s_append_blob(self, name, data_p, (size_t)len) != 0) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "%s: out of memory", path);
    }
    return 0;
}

/* Parses the verified file image buf (size bytes) into a new checkpoint. */
static int s_parse(const unsigned char *buf, uint64_t size, const char *path, carls_ckpt_t **out, char *err,
                   size_t errlen)
{
    const uint32_t version = carls_get_le32(buf + 8);
    uint32_t count = carls_get_le32(buf + 12);
    uint16_t kind_len = carls_get_le16(buf + 32);
    char kind[CARLS_CKPT_MAX_KIND + 1];
    memcpy(kind, buf + S_HEADER_BYTES, kind_len);
    kind[kind_len] = '\0';
    if (strlen(kind) != kind_len) {
        return carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: model kind contains a NUL byte", path);
    }
    carls_ckpt_t *self = carls_ckpt_new(kind, carls_get_le64(buf + 24));
    if (!self) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "%s: out of memory", path);
    }
    self->crc = carls_get_le32(buf + size - 4);
    self->file_bytes = size;
    s_cursor_t c = {.p = buf + S_HEADER_BYTES + kind_len, .end = buf + size - 4};
    int rc = 0;
    for (uint32_t i = 0; i < count && rc == 0; i++) {
        const unsigned char *p;
        if (!s_take(&c, 2, &p)) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor %u: header runs past the end", path, i);
            break;
        }
        uint16_t name_len = carls_get_le16(p);
        if (name_len == 0 || name_len > CARLS_CKPT_MAX_NAME) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: tensor %u: name length %u outside 1..%u", path, i,
                        name_len, CARLS_CKPT_MAX_NAME);
            break;
        }
        const unsigned char *name_p, *meta;
        if (!s_take(&c, name_len, &name_p) || !s_take(&c, 2, &meta)) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor %u: header runs past the end", path, i);
            break;
        }
        char name[CARLS_CKPT_MAX_NAME + 1];
        memcpy(name, name_p, name_len);
        name[name_len] = '\0';
        if (strlen(name) != name_len) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor %u: name contains a NUL byte", path, i);
            break;
        }
        if (meta[0] == S_DTYPE_BYTES && version == CARLS_CKPT_VERSION_BLOBS) {
            rc = s_parse_blob(self, &c, meta, name, path, err, errlen);
            continue;
        }
        if (meta[0] != S_DTYPE_F32) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor '%s': unknown dtype %u", path, name, meta[0]);
            break;
        }
        if (self->n_blobs > 0) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor '%s' after a blob (blobs come last)", path,
                              name);
            break;
        }
        int ndim = meta[1];
        if (ndim < 1 || ndim > CARLS_CKPT_MAX_DIMS) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: tensor '%s': %d dimensions (1..%d allowed)", path, name,
                        ndim, CARLS_CKPT_MAX_DIMS);
            break;
        }
        const unsigned char *dims_p;
        if (!s_take(&c, 8 * (size_t)ndim, &dims_p)) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor '%s': shape runs past the end", path, name);
            break;
        }
        int64_t dims[CARLS_CKPT_MAX_DIMS];
        uint64_t numel = 1;
        bool ok = true;
        for (int d = 0; d < ndim; d++) {
            uint64_t v = carls_get_le64(dims_p + 8 * d);
            if (v < 1 || v > CARLS_CKPT_MAX_ELEMENTS || numel * v > CARLS_CKPT_MAX_ELEMENTS) {
                rc = carls_errorf(err, errlen, CARLS_CKPT_ELIMIT,
                            "%s: tensor '%s': dimension %d is %llu (each >= 1, at most %llu elements in all)", path,
                            name, d, (unsigned long long)v, (unsigned long long)CARLS_CKPT_MAX_ELEMENTS);
                ok = false;
                break;
            }
            numel *= v;
            dims[d] = (int64_t)v;
        }
        if (!ok) {
            break;
        }
        const unsigned char *data_p;
        if (!s_take(&c, 4 * (size_t)numel, &data_p)) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT,
                        "%s: tensor '%s': %llu floats declared but only %zu bytes remain", path, name,
                        (unsigned long long)numel, (size_t)(c.end - c.p));
            break;
        }
        if (carls_ckpt_find(self, name)) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: tensor '%s' appears twice", path, name);
            break;
        }
        char *n = strdup(name);
        float *data = malloc(4 * (size_t)numel);
        if (!n || !data) {
            free(n);
            free(data);
            rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "%s: out of memory", path);
            break;
        }
        memcpy(data, data_p, 4 * (size_t)numel);
        if (s_append(self, n, ndim, dims, numel, data) != 0) {
            free(n);
            free(data);
            rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "%s: out of memory", path);
        }
    }
    if (rc == 0 && version == CARLS_CKPT_VERSION_BLOBS && self->n_blobs == 0) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: a version %u checkpoint without blobs", path, version);
    }
    if (rc == 0 && c.p != c.end) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: %zu bytes left after the last of %u tensors", path,
                    (size_t)(c.end - c.p), count);
    }
    if (rc) {
        carls_ckpt_destroy(&self);
        return rc;
    }
    *out = self;
    return 0;
}

int carls_ckpt_peek_step(const char *path, uint64_t *step, char *err, size_t errlen)
{
    if (!path || !step) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "carls_ckpt_peek_step: no path or output");
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    unsigned char h[32]; /* magic, version, tensor count, file length, step */
    int rc = s_read_all(fd, h, sizeof h);
    int e = errno;
    close(fd);
    if (rc != 0) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "read %s: %s", path, strerror(e));
    }
    if (memcmp(h, CARLS_CKPT_MAGIC, 8) != 0) {
        return carls_errorf(err, errlen, CARLS_CKPT_EMAGIC, "%s is not a carls checkpoint (bad magic)", path);
    }
    if (carls_get_le32(h + 8) != CARLS_CKPT_VERSION && carls_get_le32(h + 8) != CARLS_CKPT_VERSION_BLOBS) {
        return carls_errorf(err, errlen, CARLS_CKPT_EVERSION, "%s: unsupported checkpoint version %u", path,
                            carls_get_le32(h + 8));
    }
    *step = carls_get_le64(h + 24);
    return 0;
}

int carls_ckpt_read(const char *path, carls_ckpt_t **out, char *err, size_t errlen)
{
    if (!path || !out) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "carls_ckpt_read: no path or output");
    }
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    unsigned char *buf = NULL;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "stat %s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "%s is not a regular file", path);
        goto cleanup;
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char h[S_HEADER_BYTES + CARLS_CKPT_MAX_KIND];
    size_t hn = size < sizeof h ? (size_t)size : sizeof h;
    if (s_read_all(fd, h, hn) != 0) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "read %s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (memcmp(h, CARLS_CKPT_MAGIC, hn < 8 ? hn : 8) != 0) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EMAGIC, "%s is not a carls checkpoint (bad magic)", path);
        goto cleanup;
    }
    if (hn < 12) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ETRUNCATED, "%s: truncated: only %llu bytes", path,
                    (unsigned long long)size);
        goto cleanup;
    }
    uint32_t version = carls_get_le32(h + 8);
    if (version != CARLS_CKPT_VERSION && version != CARLS_CKPT_VERSION_BLOBS) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EVERSION,
                          "%s: unsupported checkpoint version %u (this build reads %u and %u)", path, version,
                          CARLS_CKPT_VERSION, CARLS_CKPT_VERSION_BLOBS);
        goto cleanup;
    }
    if (hn < S_HEADER_BYTES + 4) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ETRUNCATED, "%s: truncated: only %llu bytes", path,
                    (unsigned long long)size);
        goto cleanup;
    }
    uint32_t count = carls_get_le32(h + 12);
    uint64_t stated = carls_get_le64(h + 16);
    uint16_t kind_len = carls_get_le16(h + 32);
    if (count > CARLS_CKPT_MAX_TENSORS) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: %u tensors (at most %u)", path, count, CARLS_CKPT_MAX_TENSORS);
        goto cleanup;
    }
    if (kind_len == 0 || kind_len > CARLS_CKPT_MAX_KIND) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: model kind length %u outside 1..%u", path, kind_len,
                    CARLS_CKPT_MAX_KIND);
        goto cleanup;
    }
    if (stated > CARLS_CKPT_MAX_FILE_BYTES) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ELIMIT, "%s: header states %llu bytes (at most %llu)", path,
                    (unsigned long long)stated, (unsigned long long)CARLS_CKPT_MAX_FILE_BYTES);
        goto cleanup;
    }
    if (size < stated) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ETRUNCATED, "%s: truncated: %llu bytes, header says %llu", path,
                    (unsigned long long)size, (unsigned long long)stated);
        goto cleanup;
    }
    if (size > stated) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s: %llu bytes, header says %llu (trailing bytes)", path,
                    (unsigned long long)size, (unsigned long long)stated);
        goto cleanup;
    }
    if (size < (uint64_t)S_HEADER_BYTES + kind_len + 4) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ETRUNCATED, "%s: truncated: %llu bytes cannot hold the header", path,
                    (unsigned long long)size);
        goto cleanup;
    }
    buf = malloc((size_t)size);
    if (!buf) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "%s: cannot allocate %llu bytes", path, (unsigned long long)size);
        goto cleanup;
    }
    memcpy(buf, h, hn);
    if (s_read_all(fd, buf + hn, size - hn) != 0) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "read %s: %s", path, strerror(errno));
        goto cleanup;
    }
    uint32_t want = carls_get_le32(buf + size - 4);
    uint32_t got = carls_crc32(0, buf, size - 4);
    if (want != got) {
        rc = carls_errorf(err, errlen, CARLS_CKPT_ECHECKSUM, "%s: checksum mismatch (stored %08x, computed %08x)", path,
                    want, got);
        goto cleanup;
    }
    rc = s_parse(buf, size, path, out, err, errlen);
cleanup:
    free(buf);
    close(fd);
    return rc;
}

/* ---- checkpoint directories ---- */

int carls_ckpt_save_to_dir(const carls_ckpt_t *self, const char *dir, char *path_out, size_t path_len, char *err,
                           size_t errlen)
{
    if (!self || !dir || !*dir) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "carls_ckpt_save_to_dir: no checkpoint or directory");
    }
    if (carls_mkdir_p(dir, 0755, err, errlen) != 0) {
        return CARLS_CKPT_EIO;
    }
    char name[64], path[4096], latest[4096], line[80];
    snprintf(name, sizeof name, "ckpt-%012llu.ckpt", (unsigned long long)self->step);
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        snprintf(latest, sizeof latest, "%s/%s", dir, CARLS_CKPT_LATEST) >= (int)sizeof latest) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "directory name too long: %s", dir);
    }
    int rc = carls_ckpt_write(self, path, err, errlen);
    if (rc) {
        return rc;
    }
    snprintf(line, sizeof line, "%s\n", name);
    if (carls_write_file_atomic(latest, line, strlen(line), 0644, 0, err, errlen) != 0) {
        return CARLS_CKPT_EIO;
    }
    if (path_out && path_len) {
        snprintf(path_out, path_len, "%s", path);
    }
    return 0;
}

/* Reads DIR/latest and checks it names a plain file in DIR; name (namelen bytes) receives it. */
static int s_read_latest_name(const char *dir, char *name, size_t namelen, char *err, size_t errlen)
{
    char latest[4096];
    if (snprintf(latest, sizeof latest, "%s/%s", dir, CARLS_CKPT_LATEST) >= (int)sizeof latest) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "directory name too long: %s", dir);
    }
    FILE *f = fopen(latest, "rb");
    if (!f) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "cannot open %s: %s", latest, strerror(errno));
    }
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) {
        buf[--n] = '\0';
    }
    if (more || n == 0 || strlen(buf) != n || strchr(buf, '/') || strchr(buf, '\n') || strcmp(buf, ".") == 0 ||
        strcmp(buf, "..") == 0 || n >= namelen) {
        return carls_errorf(err, errlen, CARLS_CKPT_ECORRUPT, "%s does not name a checkpoint file in %s", latest, dir);
    }
    memcpy(name, buf, n + 1);
    return 0;
}

int carls_ckpt_latest_path(const char *dir, char *path_out, size_t path_len, char *err, size_t errlen)
{
    if (!dir || !path_out || !path_len) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "carls_ckpt_latest_path: bad arguments");
    }
    char name[256];
    int rc = s_read_latest_name(dir, name, sizeof name, err, errlen);
    if (rc) {
        return rc;
    }
    if (snprintf(path_out, path_len, "%s/%s", dir, name) >= (int)path_len) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "path buffer too small for %s/%s", dir, name);
    }
    return 0;
}

static bool s_is_ckpt_name(const char *n)
{
    /* ckpt-DDDDDDDDDDDD.ckpt */
    if (strlen(n) != 22 || strncmp(n, "ckpt-", 5) != 0 || strcmp(n + 17, ".ckpt") != 0) {
        return false;
    }
    for (int i = 5; i < 17; i++) {
        if (n[i] < '0' || n[i] > '9') {
            return false;
        }
    }
    return true;
}

static int s_cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int carls_ckpt_prune(const char *dir, int keep, char *err, size_t errlen)
{
    if (!dir || keep < 1) {
        return carls_errorf(err, errlen, CARLS_CKPT_EINVAL, "carls_ckpt_prune: bad arguments");
    }
    char latest[256] = "";
    if (s_read_latest_name(dir, latest, sizeof latest, NULL, 0) != 0) {
        latest[0] = '\0';
    }
    DIR *d = opendir(dir);
    if (!d) {
        return carls_errorf(err, errlen, CARLS_CKPT_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    }
    char **names = NULL;
    int n = 0, rc = 0;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!s_is_ckpt_name(e->d_name)) {
            continue;
        }
        names = carls_grow(names, &cap, (size_t)n + 1, sizeof *names);
        names[n] = strdup(e->d_name);
        if (!names[n]) {
            rc = carls_errorf(err, errlen, CARLS_CKPT_EIO, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    int removed = 0;
    if (rc == 0) {
        qsort(names, (size_t)n, sizeof *names, s_cmp_names);
        for (int i = 0; i + keep < n; i++) {
            if (strcmp(names[i], latest) == 0) {
                continue;
            }
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            if (unlink(path) == 0) {
                removed++;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
    return rc ? rc : removed;
}
