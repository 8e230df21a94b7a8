/* Table export files (contract in kb_export.h).
 *
 * Byte layout, format version 2 (the writer's) and 1 (still read). Integers are unsigned little-endian unless
 * marked i64 (two's complement); floats are IEEE-754 binary32 little-endian.
 *
 *   offset   size        field
 *   0        8           magic "CARLSKBX"
 *   8        4           u32 format version (2; 1 for files written before optimizer state was carried)
 *   12       4           u32 name_len, 1..128
 *   16       name_len    the exported table's name ([A-Za-z0-9_.-])
 *   ..       4           u32 config_len, 0..KB_EXPORT_MAX_CONFIG_BYTES
 *   ..       config_len  packed carls.TableConfig (defaults filled in, as list_tables reports it); kind
 *                        embedding needs dim 1..CARLS_DEFAULT_MAX_DIM
 *   rows, one after the other until the trailer:
 *            4           u32 key_len, 1..CARLS_DEFAULT_MAX_KEY_BYTES
 *            key_len     key bytes
 *            8           u64 version
 *            8           u64 frequency
 *            4           u32 payload_len: embedding tables exactly 4 * dim; feature tables
 *                        0..KB_EXPORT_MAX_RECORD_BYTES
 *            payload_len embedding: dim finite float32; feature: a packed carls.FeatureRecord
 *          format 2 only, the row's state:
 *            8           i64 updated_at_ms, >= 0
 *            8           u64 opt_steps (0 for feature tables)
 *            4           u32 opt_floats, 0..KB_EXPORT_MAX_OPT_FACTOR * dim, the same in every row (0 for
 *                        feature tables)
 *            4           u32 pending_count, 0..CARLS_MAX_PENDING_LIMIT (0 for feature tables)
 *            4*opt_floats           finite float32: the optimizer state
 *            4*pending_count*dim    finite float32: the pending gradients, oldest first
 *   trailer, the last 20 bytes of the file:
 *   end-20   8           magic "CARLSEND"
 *   end-12   8           u64 row count
 *   end-4    4           u32 CRC-32 (zlib crc32) of every byte before it
 *
 * The trailer is found from the file's length, so no row can be mistaken for it, and a file cut short
 * anywhere loses it. Every length is checked against its cap and against the bytes left before the trailer
 * before anything is allocated or read. When the structure is wrong, the reader still finishes the CRC over
 * the rest of the file and reports a checksum mismatch if there is one (a damaged file is then called
 * damaged, not "row 17: key of 3 billion bytes"); a file whose checksum matches but whose structure does
 * not was written wrong and gets the structural reason. */
#include "kb_export.h"

#include "bytes.h"
#include "files.h"
#include "kb_rows_text.h"
#include "log.h"
#include "npy.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_TRAILER_BYTES 20u
#define S_MIN_FILE_BYTES (8u + 4u + 4u + 1u + 4u + S_TRAILER_BYTES) /* header with a 1-byte name, no rows */

/* ---- writer ------------------------------------------------------------------------------------------ */

struct kb_export_writer {
    carls_atomic_file_t *file; /* the temporary file beside the target; NULL once finished */
    FILE *f;           /* its stream */
    uint32_t crc;      /* of every byte written so far */
    bool feature;      /* a feature table (else embedding) */
    uint32_t dim;      /* embedding tables */
    uint64_t rows;
    bool failed;       /* a write failed: only destroy remains */
    uint8_t *scratch;  /* packed records and converted values */
    size_t scratch_cap;
    uint32_t opt_floats; /* every row's (format 2), fixed by the first row */
};

/* Writes len bytes and adds them to the CRC. 0 or KB_EXPORT_EIO. */
static int s_write(kb_export_writer_t *w, const void *buf, size_t len, char *err, size_t errlen)
{
    if (len > 0 && fwrite(buf, 1, len, w->f) != len) {
        w->failed = true;
        return carls_errorf(err, errlen, KB_EXPORT_EIO, "write %s: %s", carls_atomic_tmp_path(w->file),
                            strerror(errno));
    }
    w->crc = carls_crc32(w->crc, buf, len);
    return 0;
}

static void s_scratch(kb_export_writer_t *w, size_t len)
{
    if (w->scratch_cap < len) {
        w->scratch = carls_xrealloc(w->scratch, len);
        w->scratch_cap = len;
    }
}

int kb_export_writer_open(const char *path, const char *table, const Carls__TableConfig *cfg,
                          kb_export_writer_t **out, char *err, size_t errlen)
{
    if (!out)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: no output pointer");
    *out = NULL;
    if (!path || !*path || !table || !cfg)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: a path, a table name and a config are required");
    if (!carls_table_name_valid(table))
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: invalid table name \"%s\"", table);
    bool feature = cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    if (!feature && cfg->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: unknown table kind %d", (int)cfg->kind);
    if (!feature && (cfg->dim == 0 || cfg->dim > CARLS_DEFAULT_MAX_DIM))
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: dim %u is outside 1..%u", cfg->dim,
                      CARLS_DEFAULT_MAX_DIM);
    size_t cfg_len = carls__table_config__get_packed_size(cfg);
    if (cfg_len > KB_EXPORT_MAX_CONFIG_BYTES)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: the config packs to %zu bytes", cfg_len);

    kb_export_writer_t *w = carls_xcalloc(1, sizeof *w);
    w->feature = feature;
    w->dim = cfg->dim;
    /* Created 0600 beside the target (the same file system, so the final rename is atomic). */
    int rc = carls_atomic_open(path, 0600, 0, &w->file, err, errlen);
    if (rc != 0) {
        kb_export_writer_destroy(&w);
        return KB_EXPORT_EIO;
    }
    w->f = carls_atomic_stream(w->file);
    uint8_t head[16];
    memcpy(head, KB_EXPORT_MAGIC, 8);
    carls_put_le32(head + 8, KB_EXPORT_VERSION);
    carls_put_le32(head + 12, (uint32_t)strlen(table));
    uint8_t len4[4];
    carls_put_le32(len4, (uint32_t)cfg_len);
    s_scratch(w, cfg_len ? cfg_len : 1);
    carls__table_config__pack(cfg, w->scratch);
    rc = s_write(w, head, sizeof head, err, errlen);
    if (rc == 0)
        rc = s_write(w, table, strlen(table), err, errlen);
    if (rc == 0)
        rc = s_write(w, len4, 4, err, errlen);
    if (rc == 0)
        rc = s_write(w, w->scratch, cfg_len, err, errlen);
    if (rc != 0) {
        kb_export_writer_destroy(&w);
        return rc;
    }
    *out = w;
    return 0;
}

/* Writes n floats little-endian (through the scratch buffer), refusing non-finite ones: what names the
 * floats in the message of row `row`. */
static int s_write_floats(kb_export_writer_t *w, const float *v, size_t n, const char *what, char *err,
                          size_t errlen)
{
    if (n == 0)
        return 0;
    s_scratch(w, n * 4);
    for (size_t j = 0; j < n; j++) {
        if (!isfinite(v[j]))
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: row %llu: %s %zu is not finite",
                                (unsigned long long)w->rows + 1, what, j + 1);
        uint32_t bits;
        memcpy(&bits, &v[j], 4);
        carls_put_le32(w->scratch + 4 * j, bits);
    }
    return s_write(w, w->scratch, n * 4, err, errlen);
}

int kb_export_writer_add(kb_export_writer_t *self, const void *key, size_t key_len, uint64_t version,
                         uint64_t frequency, const float *values, const Carls__FeatureRecord *record, char *err,
                         size_t errlen)
{
    kb_export_state_t state = {.version = version, .frequency = frequency};
    return kb_export_writer_add_state(self, key, key_len, values, record, &state, err, errlen);
}

int kb_export_writer_add_state(kb_export_writer_t *self, const void *key, size_t key_len, const float *values,
                               const Carls__FeatureRecord *record, const kb_export_state_t *state, char *err,
                               size_t errlen)
{
    assert(self && state);
    uint64_t version = state->version, frequency = state->frequency;
    if (self->failed || !self->file)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: the writer has failed or finished");
    if (!key || key_len == 0 || key_len > CARLS_DEFAULT_MAX_KEY_BYTES)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: row %llu: key of %zu bytes (1..%u allowed)",
                      (unsigned long long)self->rows + 1, key_len, CARLS_DEFAULT_MAX_KEY_BYTES);
    size_t payload;
    if (self->feature) {
        if (!record || values)
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: a feature row needs a record and no values");
        /* `found` only means something in replies; it is not part of the stored record. */
        Carls__FeatureRecord r = *record;
        r.found = false;
        payload = carls__feature_record__get_packed_size(&r);
        if (payload > KB_EXPORT_MAX_RECORD_BYTES)
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: row %llu: a record of %zu bytes",
                          (unsigned long long)self->rows + 1, payload);
        s_scratch(self, payload ? payload : 1);
        carls__feature_record__pack(&r, self->scratch);
    } else {
        if (!values || record)
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: an embedding row needs values and no record");
        payload = (size_t)self->dim * 4;
        s_scratch(self, payload);
        for (uint32_t j = 0; j < self->dim; j++) {
            if (!isfinite(values[j]))
                return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: row %llu: value %u is not finite",
                              (unsigned long long)self->rows + 1, j + 1);
            uint32_t bits;
            memcpy(&bits, &values[j], 4);
            carls_put_le32(self->scratch + 4 * j, bits);
        }
    }
    /* The state is checked before anything of the row is written. */
    if (state->updated_at_ms < 0 || (self->feature && (state->opt_floats || state->pending_count || state->opt_steps)) ||
        state->opt_floats > KB_EXPORT_MAX_OPT_FACTOR * self->dim || state->pending_count > CARLS_MAX_PENDING_LIMIT ||
        (state->opt_floats && !state->opt_state) || (state->pending_count && !state->pending) ||
        (self->rows > 0 && state->opt_floats != self->opt_floats))
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL,
                            "export: row %llu: a state the format cannot hold (updated_at %lld, %u optimizer floats "
                            "where rows have %u, %u pending gradients)",
                            (unsigned long long)self->rows + 1, (long long)state->updated_at_ms, state->opt_floats,
                            self->rows ? self->opt_floats : state->opt_floats, state->pending_count);
    for (size_t j = 0; j < state->opt_floats; j++)
        if (!isfinite(state->opt_state[j]))
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: row %llu: optimizer float %zu is not finite",
                                (unsigned long long)self->rows + 1, j + 1);
    for (size_t j = 0; j < (size_t)state->pending_count * self->dim; j++)
        if (!isfinite(state->pending[j]))
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: row %llu: pending gradient float %zu is not "
                                "finite", (unsigned long long)self->rows + 1, j + 1);
    uint8_t klen[4], meta[20];
    carls_put_le32(klen, (uint32_t)key_len);
    carls_put_le64(meta, version);
    carls_put_le64(meta + 8, frequency);
    carls_put_le32(meta + 16, (uint32_t)payload);
    int rc = s_write(self, klen, 4, err, errlen);
    if (rc == 0)
        rc = s_write(self, key, key_len, err, errlen);
    if (rc == 0)
        rc = s_write(self, meta, sizeof meta, err, errlen);
    if (rc == 0)
        rc = s_write(self, self->scratch, payload, err, errlen);
    uint8_t st[24];
    carls_put_le64(st, (uint64_t)state->updated_at_ms);
    carls_put_le64(st + 8, state->opt_steps);
    carls_put_le32(st + 16, state->opt_floats);
    carls_put_le32(st + 20, state->pending_count);
    if (rc == 0)
        rc = s_write(self, st, sizeof st, err, errlen);
    if (rc == 0)
        rc = s_write_floats(self, state->opt_state, state->opt_floats, "optimizer float", err, errlen);
    if (rc == 0)
        rc = s_write_floats(self, state->pending, (size_t)state->pending_count * self->dim, "pending float", err,
                            errlen);
    if (rc == 0) {
        self->opt_floats = state->opt_floats;
        self->rows++;
    } else {
        self->failed = true; /* part of the row may be written */
    }
    return rc;
}

uint64_t kb_export_writer_rows(const kb_export_writer_t *self)
{
    assert(self);
    return self->rows;
}

int kb_export_writer_finish(kb_export_writer_t *self, char *err, size_t errlen)
{
    assert(self);
    if (self->failed || !self->file)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: the writer has failed or finished");
    uint8_t trailer[S_TRAILER_BYTES];
    memcpy(trailer, KB_EXPORT_END_MAGIC, 8);
    carls_put_le64(trailer + 8, self->rows);
    int rc = s_write(self, trailer, 16, err, errlen);
    if (rc != 0)
        return rc;
    carls_put_le32(trailer + 16, self->crc);
    rc = s_write(self, trailer + 16, 4, err, errlen);
    if (rc != 0)
        return rc;
    self->failed = true; /* from here on, whatever happens, only destroy remains */
    self->f = NULL;
    return carls_atomic_commit(&self->file, err, errlen) == 0 ? 0 : KB_EXPORT_EIO;
}

void kb_export_writer_destroy(kb_export_writer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_export_writer_t *w = *self_p;
    carls_atomic_abort(&w->file);
    free(w->scratch);
    free(w);
    *self_p = NULL;
}

/* ---- reader ------------------------------------------------------------------------------------------ */

struct kb_export_reader {
    FILE *f;
    char *path;
    uint64_t size;         /* file length */
    uint64_t trailer_off;  /* size - S_TRAILER_BYTES: rows end here */
    uint64_t rows_off;     /* first row */
    uint32_t crc_at_rows;  /* CRC of the bytes before rows_off */
    uint64_t pos;          /* offset of the next byte to read */
    uint32_t crc;          /* CRC of the bytes before pos */
    char name[CARLS_MAX_TABLE_NAME_BYTES + 1];
    Carls__TableConfig *config;
    bool feature;
    uint32_t dim;
    uint64_t rows;         /* from the trailer */
    uint64_t rows_read;    /* by the current pass */
    uint8_t key[CARLS_DEFAULT_MAX_KEY_BYTES];
    uint8_t *payload;      /* the current row's payload */
    size_t payload_cap;
    float *values;         /* (dim) the current row's values in host order */
    uint32_t format;       /* the file's format version */
    uint32_t opt_floats;   /* format 2: every row's, from the pass's first row */
    float *state;          /* format 2: the current row's optimizer state, then its pending gradients */
    size_t state_cap;      /* floats */
};

/* Reads exactly len bytes at the current position into buf (NULL: read and discard), adding them to the CRC.
 * The caller has checked that they lie before `limit`. 0 or KB_EXPORT_EIO / KB_EXPORT_ETRUNCATED. */
static int s_read(kb_export_reader_t *r, void *buf, size_t len, char *err, size_t errlen)
{
    uint8_t tmp[4096];
    uint8_t *dst = buf;
    while (len > 0) {
        size_t chunk = dst ? len : (len < sizeof tmp ? len : sizeof tmp);
        uint8_t *p = dst ? dst : tmp;
        size_t got = fread(p, 1, chunk, r->f);
        if (got != chunk) {
            if (ferror(r->f))
                return carls_errorf(err, errlen, KB_EXPORT_EIO, "read %s: %s", r->path, strerror(errno));
            return carls_errorf(err, errlen, KB_EXPORT_ETRUNCATED, "%s: the file ended early (was it changed while being "
                          "read?)", r->path);
        }
        r->crc = carls_crc32(r->crc, p, got);
        r->pos += got;
        len -= got;
        if (dst)
            dst += got;
    }
    return 0;
}

/* Checks that len more bytes fit before the trailer. */
static int s_fits(const kb_export_reader_t *r, uint64_t len, const char *what, char *err, size_t errlen)
{
    if (len > r->trailer_off - r->pos)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: %s of %llu bytes runs past the end of the rows (%llu bytes "
                      "left)", r->path, what, (unsigned long long)len,
                      (unsigned long long)(r->trailer_off - r->pos));
    return 0;
}

/* Format 2: reads row n's state after its payload into row (buffers of the reader), checking it: updated_at
 * not negative, none for a feature row, opt_floats within KB_EXPORT_MAX_OPT_FACTOR * dim and the same as the
 * pass's first row, pending_count within CARLS_MAX_PENDING_LIMIT, every float finite. 0 or a negative code. */
static int s_read_state(kb_export_reader_t *r, kb_export_row_t *row, uint64_t n, char *err, size_t errlen)
{
    char what[64];
    snprintf(what, sizeof what, "row %llu's state", (unsigned long long)n);
    uint8_t b[24];
    int rc = s_fits(r, sizeof b, what, err, errlen);
    if (rc == 0)
        rc = s_read(r, b, sizeof b, err, errlen);
    if (rc != 0)
        return rc;
    int64_t updated = (int64_t)carls_get_le64(b);
    uint64_t steps = carls_get_le64(b + 8);
    uint32_t opt_floats = carls_get_le32(b + 16), pending = carls_get_le32(b + 20);
    if (updated < 0 || (r->feature && (steps || opt_floats || pending)))
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu: updated_at %lld, %llu optimizer steps, %u "
                            "optimizer floats, %u pending gradients (a feature row has none)", r->path,
                            (unsigned long long)n, (long long)updated, (unsigned long long)steps, opt_floats, pending);
    if (opt_floats > KB_EXPORT_MAX_OPT_FACTOR * r->dim || pending > CARLS_MAX_PENDING_LIMIT)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu: %u optimizer floats (at most %u) and %u "
                            "pending gradients (at most %u)", r->path, (unsigned long long)n, opt_floats,
                            KB_EXPORT_MAX_OPT_FACTOR * r->dim, pending, CARLS_MAX_PENDING_LIMIT);
    if (r->rows_read == 0)
        r->opt_floats = opt_floats;
    else if (opt_floats != r->opt_floats)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu has %u optimizer floats; row 1 has %u", r->path,
                            (unsigned long long)n, opt_floats, r->opt_floats);
    size_t floats = opt_floats + (size_t)pending * r->dim;
    rc = s_fits(r, (uint64_t)floats * 4, what, err, errlen);
    if (rc != 0)
        return rc;
    if (r->state_cap < floats) {
        r->state = carls_xrealloc(r->state, floats * sizeof *r->state);
        r->state_cap = floats;
    }
    uint8_t chunk[4096];
    for (size_t done = 0; done < floats;) {
        size_t k = floats - done < sizeof chunk / 4 ? floats - done : sizeof chunk / 4;
        rc = s_read(r, chunk, k * 4, err, errlen);
        if (rc != 0)
            return rc;
        for (size_t j = 0; j < k; j++) {
            uint32_t bits = carls_get_le32(chunk + 4 * j);
            memcpy(&r->state[done + j], &bits, 4);
            if (!isfinite(r->state[done + j]))
                return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu: %s float %zu is not finite",
                                    r->path, (unsigned long long)n,
                                    done + j < opt_floats ? "optimizer" : "pending gradient",
                                    done + j < opt_floats ? done + j + 1 : done + j - opt_floats + 1);
        }
        done += k;
    }
    row->updated_at_ms = updated;
    row->opt_steps = steps;
    row->opt_floats = opt_floats;
    row->opt_state = opt_floats ? r->state : NULL;
    row->pending_count = pending;
    row->pending = pending ? r->state + opt_floats : NULL;
    return 0;
}

/* Reads the next row at r->pos (< trailer_off) into the reader's buffers, checking every length and the
 * payload (finite values, a record that decodes). 0 or a negative code. */
static int s_read_row(kb_export_reader_t *r, kb_export_row_t *row, char *err, size_t errlen)
{
    uint64_t n = r->rows_read + 1;
    char what[64];
    uint8_t b[20];
    snprintf(what, sizeof what, "row %llu's key length", (unsigned long long)n);
    int rc = s_fits(r, 4, what, err, errlen);
    if (rc == 0)
        rc = s_read(r, b, 4, err, errlen);
    if (rc != 0)
        return rc;
    uint32_t key_len = carls_get_le32(b);
    if (key_len == 0 || key_len > CARLS_DEFAULT_MAX_KEY_BYTES)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu has a key of %u bytes (1..%u allowed)", r->path,
                      (unsigned long long)n, key_len, CARLS_DEFAULT_MAX_KEY_BYTES);
    snprintf(what, sizeof what, "row %llu", (unsigned long long)n);
    rc = s_fits(r, (uint64_t)key_len + 20, what, err, errlen);
    if (rc == 0)
        rc = s_read(r, r->key, key_len, err, errlen);
    if (rc == 0)
        rc = s_read(r, b, 20, err, errlen);
    if (rc != 0)
        return rc;
    uint32_t payload = carls_get_le32(b + 16);
    if (!r->feature && payload != 4u * r->dim)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu has %u value bytes; dim %u needs %u", r->path,
                      (unsigned long long)n, payload, r->dim, 4u * r->dim);
    if (r->feature && payload > KB_EXPORT_MAX_RECORD_BYTES)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu has a record of %u bytes (at most %u)", r->path,
                      (unsigned long long)n, payload, KB_EXPORT_MAX_RECORD_BYTES);
    snprintf(what, sizeof what, "row %llu's payload", (unsigned long long)n);
    rc = s_fits(r, payload, what, err, errlen);
    if (rc != 0)
        return rc;
    if (r->payload_cap < payload) {
        r->payload = carls_xrealloc(r->payload, payload);
        r->payload_cap = payload;
    }
    rc = s_read(r, r->payload, payload, err, errlen);
    if (rc != 0)
        return rc;
    memset(row, 0, sizeof *row);
    row->key = r->key;
    row->key_len = key_len;
    row->version = carls_get_le64(b);
    row->frequency = carls_get_le64(b + 8);
    if (r->feature) {
        Carls__FeatureRecord *rec = carls__feature_record__unpack(NULL, payload, r->payload);
        if (!rec)
            return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu's feature record does not decode", r->path,
                          (unsigned long long)n);
        carls__feature_record__free_unpacked(rec, NULL);
        row->record = r->payload;
        row->record_len = payload;
    } else {
        for (uint32_t j = 0; j < r->dim; j++) {
            uint32_t bits = carls_get_le32(r->payload + 4 * j);
            memcpy(&r->values[j], &bits, 4);
            if (!isfinite(r->values[j]))
                return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: row %llu: value %u is not finite", r->path,
                              (unsigned long long)n, j + 1);
        }
        row->values = r->values;
    }
    if (r->format >= 2) {
        rc = s_read_state(r, row, n, err, errlen);
        if (rc != 0)
            return rc;
    }
    r->rows_read++;
    return 0;
}

/* Reads the trailer (r->pos == trailer_off) and checks the row count and the CRC against this pass. */
static int s_check_trailer(kb_export_reader_t *r, char *err, size_t errlen)
{
    uint8_t t[S_TRAILER_BYTES];
    uint32_t computed_body = 0;
    int rc = s_read(r, t, 16, err, errlen);
    if (rc != 0)
        return rc;
    computed_body = r->crc;
    rc = s_read(r, t + 16, 4, err, errlen);
    if (rc != 0)
        return rc;
    uint32_t stored = carls_get_le32(t + 16);
    if (stored != computed_body)
        return carls_errorf(err, errlen, KB_EXPORT_ECHECKSUM, "%s: checksum mismatch (stored %08x, computed %08x): the "
                      "file is damaged", r->path, stored, computed_body);
    if (memcmp(t, KB_EXPORT_END_MAGIC, 8) != 0)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: no trailer at the end of the file", r->path);
    uint64_t count = carls_get_le64(t + 8);
    if (count != r->rows_read)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: the trailer says %llu rows, the file holds %llu", r->path,
                      (unsigned long long)count, (unsigned long long)r->rows_read);
    r->rows = count;
    return 0;
}

/* After a structural error at r->pos: reads the rest of the file to finish the CRC. When the CRC does not
 * match, the file is damaged: reports that (with the structural detail) instead. Returns the code to give. */
static int s_prefer_checksum(kb_export_reader_t *r, int code, char *err, size_t errlen)
{
    if (code == KB_EXPORT_EIO)
        return code;
    if (r->pos > r->size - 4 || fseeko(r->f, (off_t)r->pos, SEEK_SET) != 0)
        return code;
    if (s_read(r, NULL, (size_t)(r->size - 4 - r->pos), NULL, 0) != 0)
        return code;
    uint8_t c[4];
    if (fread(c, 1, 4, r->f) != 4)
        return code;
    uint32_t stored = carls_get_le32(c);
    if (stored == r->crc)
        return code;
    char detail[256];
    snprintf(detail, sizeof detail, "%s", err ? err : "");
    return carls_errorf(err, errlen, KB_EXPORT_ECHECKSUM, "%s: checksum mismatch (stored %08x, computed %08x): the file is "
                  "damaged (%s)", r->path, stored, r->crc, detail);
}

/* Reads the header after its first 16 bytes: the table name (name_len bytes, as the header says) and the
 * table config, and checks them (a valid name, a config that decodes, a known kind, an embedding dim in
 * range). Sets up the reader for that kind of rows. 0 or a negative code. */
static int s_read_name_and_config(kb_export_reader_t *r, uint32_t name_len, char *err, size_t errlen)
{
    const char *path = r->path;
    if (name_len == 0 || name_len > CARLS_MAX_TABLE_NAME_BYTES)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: table name of %u bytes (1..%u allowed)", path,
                            name_len, CARLS_MAX_TABLE_NAME_BYTES);
    int rc = s_fits(r, (uint64_t)name_len + 4, "the table name", err, errlen);
    if (rc == 0)
        rc = s_read(r, r->name, name_len, err, errlen);
    if (rc != 0)
        return rc;
    r->name[name_len] = '\0';
    if (!carls_table_name_valid(r->name))
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: the table name is not a valid name", path);
    uint8_t b4[4];
    rc = s_read(r, b4, 4, err, errlen);
    if (rc != 0)
        return rc;
    uint32_t cfg_len = carls_get_le32(b4);
    if (cfg_len > KB_EXPORT_MAX_CONFIG_BYTES)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: a table config of %u bytes (at most %u)", path,
                            cfg_len, KB_EXPORT_MAX_CONFIG_BYTES);
    rc = s_fits(r, cfg_len, "the table config", err, errlen);
    if (rc != 0)
        return rc;
    uint8_t *cfg_buf = carls_xmalloc(cfg_len ? cfg_len : 1);
    rc = s_read(r, cfg_buf, cfg_len, err, errlen);
    if (rc == 0) {
        r->config = carls__table_config__unpack(NULL, cfg_len, cfg_buf);
        if (!r->config)
            rc = carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: the table config does not decode", path);
    }
    free(cfg_buf);
    if (rc != 0)
        return rc;
    r->feature = r->config->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    if (!r->feature && r->config->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING)
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: unknown table kind %d", path, (int)r->config->kind);
    if (!r->feature && (r->config->dim == 0 || r->config->dim > CARLS_DEFAULT_MAX_DIM))
        return carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: dim %u is outside 1..%u", path, r->config->dim,
                            CARLS_DEFAULT_MAX_DIM);
    r->dim = r->feature ? 0 : r->config->dim;
    r->values = carls_xmalloc((r->dim ? r->dim : 1) * sizeof *r->values);
    return 0;
}

/* The verifying pass over the rows (from the end of the header to the trailer): remembers where they start
 * and the CRC there, for the caller's pass, and reads every row as s_read_row checks it. 0 or a negative
 * code. */
static int s_check_rows(kb_export_reader_t *r, char *err, size_t errlen)
{
    r->rows_off = r->pos;
    r->crc_at_rows = r->crc;
    kb_export_row_t row;
    while (r->pos < r->trailer_off) {
        int rc = s_read_row(r, &row, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kb_export_reader_open(const char *path, kb_export_reader_t **out, char *err, size_t errlen)
{
    if (!out || !path)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: no path or output pointer");
    *out = NULL;
    kb_export_reader_t *r = carls_xcalloc(1, sizeof *r);
    r->path = strdup(path);
    if (!r->path)
        CARLS_FATAL("out of memory");
    int rc = 0;
    r->f = fopen(path, "rb");
    if (!r->f) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fileno(r->f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "%s is not a regular file", path);
        goto fail;
    }
    r->size = (uint64_t)st.st_size;
    r->crc = 0; /* carls_crc32 starts from 0 */
    uint8_t head[16];
    size_t got = fread(head, 1, sizeof head, r->f);
    if (got < 8 || memcmp(head, KB_EXPORT_MAGIC, 8) != 0) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EMAGIC, "%s is not a carls table export (no \"%s\" magic)", path,
                    KB_EXPORT_MAGIC);
        goto fail;
    }
    if (got >= 12 && (carls_get_le32(head + 8) < KB_EXPORT_MIN_VERSION || carls_get_le32(head + 8) > KB_EXPORT_VERSION)) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EVERSION, "%s: export format version %u; this build reads versions "
                    "%u..%u", path, carls_get_le32(head + 8), KB_EXPORT_MIN_VERSION, KB_EXPORT_VERSION);
        goto fail;
    }
    r->format = got >= 12 ? carls_get_le32(head + 8) : KB_EXPORT_VERSION;
    if (r->size < S_MIN_FILE_BYTES) {
        rc = carls_errorf(err, errlen, KB_EXPORT_ETRUNCATED, "%s is %llu bytes, shorter than any export (%u): truncated",
                    path, (unsigned long long)r->size, S_MIN_FILE_BYTES);
        goto fail;
    }
    /* The trailer's magic first: a file cut short is then called truncated rather than "row N runs past". */
    uint8_t end_magic[8];
    if (fseeko(r->f, (off_t)(r->size - S_TRAILER_BYTES), SEEK_SET) != 0 || fread(end_magic, 1, 8, r->f) != 8) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "read %s: %s", path, strerror(errno));
        goto fail;
    }
    if (memcmp(end_magic, KB_EXPORT_END_MAGIC, 8) != 0) {
        rc = carls_errorf(err, errlen, KB_EXPORT_ETRUNCATED, "%s: no \"%s\" trailer at the end: the file is truncated or "
                    "was not completely written", path, KB_EXPORT_END_MAGIC);
        goto fail;
    }
    r->trailer_off = r->size - S_TRAILER_BYTES;

    /* Header, checked field by field, then the rows, then the trailer: one pass computing the CRC. */
    rewind(r->f);
    r->pos = 0;
    rc = s_read(r, head, sizeof head, err, errlen);
    if (rc != 0)
        goto fail;
    rc = s_read_name_and_config(r, carls_get_le32(head + 12), err, errlen);
    if (rc == 0)
        rc = s_check_rows(r, err, errlen);
    if (rc != 0)
        goto structural;
    rc = s_check_trailer(r, err, errlen);
    if (rc != 0)
        goto fail;
    /* Ready for the rows pass. */
    if (fseeko(r->f, (off_t)r->rows_off, SEEK_SET) != 0) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "seek %s: %s", path, strerror(errno));
        goto fail;
    }
    r->pos = r->rows_off;
    r->crc = r->crc_at_rows;
    r->rows_read = 0;
    *out = r;
    return 0;
structural:
    rc = s_prefer_checksum(r, rc, err, errlen);
fail:
    kb_export_reader_destroy(&r);
    return rc;
}

const char *kb_export_reader_table(const kb_export_reader_t *self)
{
    assert(self);
    return self->name;
}

const Carls__TableConfig *kb_export_reader_config(const kb_export_reader_t *self)
{
    assert(self);
    return self->config;
}

uint32_t kb_export_reader_version(const kb_export_reader_t *self)
{
    assert(self);
    return self->format;
}

uint64_t kb_export_reader_rows(const kb_export_reader_t *self)
{
    assert(self);
    return self->rows;
}

int kb_export_reader_next(kb_export_reader_t *self, kb_export_row_t *row, char *err, size_t errlen)
{
    assert(self && row);
    if (self->pos < self->trailer_off) {
        int rc = s_read_row(self, row, err, errlen);
        return rc == 0 ? 1 : rc;
    }
    if (self->pos > self->trailer_off)
        return 0; /* the trailer was checked already */
    int rc = s_check_trailer(self, err, errlen);
    return rc;
}

void kb_export_reader_destroy(kb_export_reader_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_export_reader_t *r = *self_p;
    if (r->f)
        fclose(r->f);
    if (r->config)
        carls__table_config__free_unpacked(r->config, NULL);
    free(r->path);
    free(r->payload);
    free(r->values);
    free(r->state);
    free(r);
    *self_p = NULL;
}

/* ---- whole tables ----------------------------------------------------------------------------------- */

#define S_DEFAULT_PAGE 1000u
#define S_DEFAULT_BATCH 1000u

/* One page of a scan, checked against the table's config (dim, kind), handed to a consumer. */
typedef int (*s_page_fn)(void *ctx, const Carls__TableConfig *cfg, const Carls__ScanResult *r, char *err,
                         size_t errlen);

/* s_scan_table's state across kb_cluster_scan_all's pages. */
typedef struct {
    const Carls__TableConfig *cfg;
    s_page_fn fn;
    void *ctx;
    carls_progress_t *progress;
    char *err;
    size_t errlen;
    int rc;
} s_scan_t;

/* One page: checked against the table's config, then handed to the consumer; stops at the first error. */
static bool s_scan_page(void *ctx, uint32_t shard, const Carls__ScanResult *r)
{
    s_scan_t *sc = ctx;
    const Carls__TableConfig *cfg = sc->cfg;
    const bool feature = cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    if (!feature && (r->dim != cfg->dim || r->n_values != r->n_keys * cfg->dim))
        sc->rc = carls_errorf(sc->err, sc->errlen, KB_EXPORT_EBANK,
                              "shard %u sent rows of dim %u for a table of dim %u", shard, r->dim, cfg->dim);
    else if (feature && r->n_records != r->n_keys)
        sc->rc = carls_errorf(sc->err, sc->errlen, KB_EXPORT_EBANK,
                              "shard %u sent embedding rows for a feature table", shard);
    else
        sc->rc = sc->fn(sc->ctx, cfg, r, sc->err, sc->errlen);
    if (sc->progress && sc->rc == 0)
        carls_progress_add(sc->progress, (int64_t)r->n_keys);
    return sc->rc == 0;
}

/* Scans table on every shard in pages of `page` rows, checks each page against cfg and gives it to fn(ctx);
 * reports the rows to progress (may be NULL; started here, finished by the caller). Returns 0, fn's error, or
 * KB_EXPORT_EBANK. */
static int s_scan_table(kb_cluster_t *bank, const char *table, uint32_t page, const Carls__TableConfig *cfg,
                        s_page_fn fn, void *ctx, carls_progress_t *progress, char *err, size_t errlen)
{
    char label[64];
    snprintf(label, sizeof label, "export %s", table);
    if (progress)
        carls_progress_start_units(progress, label, 0, "rows");
    s_scan_t sc = {.cfg = cfg, .fn = fn, .ctx = ctx, .progress = progress, .err = err, .errlen = errlen};
    if (kb_cluster_scan_all(bank, table, page, s_scan_page, &sc) != 0)
        return carls_errorf(err, errlen, KB_EXPORT_EBANK, "%s", kb_cluster_last_error(bank));
    return sc.rc;
}

/* kb_export_table's page consumer: every row into the export writer (ctx). */
static int s_page_to_writer(void *ctx, const Carls__TableConfig *cfg, const Carls__ScanResult *r, char *err,
                            size_t errlen)
{
    const bool feature = cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    /* The rows' whole state when the server sent it (kb_cluster_scan checked its sizes). */
    const bool state = r->n_updated_at_ms == r->n_keys && r->n_keys > 0;
    size_t pending_at = 0;
    int rc = 0;
    for (size_t i = 0; i < r->n_keys && rc == 0; i++) {
        kb_export_state_t st = {.version = r->versions[i], .frequency = r->frequencies[i]};
        if (state) {
            st.updated_at_ms = r->updated_at_ms[i];
            st.opt_steps = r->opt_steps[i];
            st.opt_floats = r->opt_floats;
            st.opt_state = r->opt_floats ? r->opt_state + i * r->opt_floats : NULL;
            st.pending_count = r->pending_counts[i];
            st.pending = st.pending_count ? r->pending + pending_at : NULL;
            pending_at += (size_t)st.pending_count * cfg->dim;
        }
        rc = kb_export_writer_add_state(ctx, r->keys[i].data, r->keys[i].len,
                                        feature ? NULL : r->values + i * cfg->dim, feature ? r->records[i] : NULL,
                                        &st, err, errlen);
        /* A row the writer refuses (non-finite value, over-long key) came from the bank. */
        if (rc == KB_EXPORT_EINVAL)
            rc = KB_EXPORT_EBANK;
    }
    return rc;
}

int kb_export_table(kb_cluster_t *bank, const char *table, const char *path, uint32_t page, uint64_t *rows_out,
                    carls_progress_t *progress, char *err, size_t errlen)
{
    if (rows_out)
        *rows_out = 0;
    if (!bank || !table || !path)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: a bank, a table and a path are required");
    if (page == 0)
        page = S_DEFAULT_PAGE;
    Carls__TableConfig *cfg = NULL;
    kb_export_writer_t *w = NULL;
    int rc = kb_cluster_table_config(bank, table, &cfg);
    if (rc != 0)
        return carls_errorf(err, errlen, KB_EXPORT_EBANK, "%s", kb_cluster_last_error(bank));
    rc = kb_export_writer_open(path, table, cfg, &w, err, errlen);
    if (rc == 0)
        rc = s_scan_table(bank, table, page, cfg, s_page_to_writer, w, progress, err, errlen);
    if (rc == 0)
        rc = kb_export_writer_finish(w, err, errlen);
    if (rc == 0 && rows_out)
        *rows_out = kb_export_writer_rows(w);
    if (rc == 0 && progress)
        carls_progress_finish(progress, NULL);
    kb_export_writer_destroy(&w);
    carls__table_config__free_unpacked(cfg, NULL);
    return rc;
}

/* Rows read from a file and not yet written: keys and values (embedding tables) in a kb_rows_t, with each
 * row's version and (feature tables) its decoded record; for a format-2 file also each row's state, its
 * optimizer floats and pending gradients back to back in one buffer. */
typedef struct {
    size_t cap;                      /* rows per flush */
    uint32_t dim;                    /* 0 for feature tables */
    kb_rows_t *rows;                 /* dim 0 for feature tables */
    uint64_t *versions;              /* (cap) */
    Carls__FeatureRecord **records;  /* (cap) decoded, owned; NULL for embedding tables */
    kb_export_row_t *meta;           /* format 2: (cap) each row's scalars (its pointers are not used); else NULL */
    size_t *state_at;                /* format 2: (cap) where each row's floats start in state */
    float *state;                    /* format 2: optimizer floats then pending gradients, row after row */
    size_t state_n, state_cap;
    uint32_t opt_floats;             /* format 2: every row's (the reader checked) */
    size_t record_bytes;             /* the packed records' bytes */
} s_batch_t;

/* A batch is sent once its floats or its records reach 16 MiB, well under the protocol's message cap. */
#define S_BATCH_MAX_FLOATS ((size_t)4 << 20)
#define S_BATCH_MAX_RECORD_BYTES ((size_t)16 << 20)

static void s_batch_init(s_batch_t *b, size_t cap, uint32_t dim, bool state)
{
    memset(b, 0, sizeof *b);
    b->cap = cap;
    b->dim = dim;
    b->rows = kb_rows_new(dim);
    b->versions = carls_xmalloc(cap * sizeof *b->versions);
    b->records = dim ? NULL : carls_xcalloc(cap, sizeof *b->records);
    if (state) {
        b->meta = carls_xcalloc(cap, sizeof *b->meta);
        b->state_at = carls_xcalloc(cap, sizeof *b->state_at);
    }
}

/* Forgets the rows (freeing their records). */
static void s_batch_clear(s_batch_t *b)
{
    for (size_t i = 0; b->records && i < b->rows->n; i++) {
        carls__feature_record__free_unpacked(b->records[i], NULL);
        b->records[i] = NULL;
    }
    kb_rows_clear(b->rows);
    b->state_n = 0;
    b->record_bytes = 0;
}

static void s_batch_free(s_batch_t *b)
{
    s_batch_clear(b);
    kb_rows_destroy(&b->rows);
    free(b->versions);
    free(b->records);
    free(b->meta);
    free(b->state_at);
    free(b->state);
}

/* Adds one row read from the file (b has room). 0, or KB_EXPORT_ECORRUPT when its record does not decode
 * (the file changed after it was verified). */
static int s_batch_add(s_batch_t *b, const kb_export_row_t *row)
{
    size_t n = b->rows->n;
    assert(n < b->cap);
    if (b->records) {
        b->records[n] = carls__feature_record__unpack(NULL, row->record_len, row->record);
        if (!b->records[n])
            return KB_EXPORT_ECORRUPT;
        b->record_bytes += row->record_len;
    }
    b->versions[n] = row->version;
    if (b->meta) {
        size_t floats = row->opt_floats + (size_t)row->pending_count * b->dim;
        if (b->state_n + floats > b->state_cap) {
            b->state_cap = (b->state_n + floats) * 2;
            b->state = carls_xrealloc(b->state, b->state_cap * sizeof *b->state);
        }
        if (row->opt_floats)
            memcpy(b->state + b->state_n, row->opt_state, row->opt_floats * sizeof(float));
        if (row->pending_count)
            memcpy(b->state + b->state_n + row->opt_floats, row->pending,
                   (size_t)row->pending_count * b->dim * sizeof(float));
        b->state_at[n] = b->state_n;
        b->state_n += floats;
        b->meta[n] = *row;
        b->opt_floats = row->opt_floats;
    }
    kb_rows_append(b->rows, row->key, row->key_len, row->values);
    return 0;
}

/* Whether the batch is to be sent now: cap rows, S_BATCH_MAX_FLOATS floats or S_BATCH_MAX_RECORD_BYTES of
 * records. */
static bool s_batch_full(const s_batch_t *b)
{
    return b->rows->n == b->cap || b->state_n + b->rows->n * (size_t)b->dim >= S_BATCH_MAX_FLOATS ||
           b->record_bytes >= S_BATCH_MAX_RECORD_BYTES;
}

/* Format 2: sends the batch's rows with their whole state (kb_cluster_import_rows). 0 or the client's code. */
static int s_batch_import_rows(kb_cluster_t *bank, const char *table, const s_batch_t *b)
{
    size_t n = b->rows->n;
    kb_import_row_t *rows = carls_xcalloc(n, sizeof *rows);
    for (size_t i = 0; i < n; i++) {
        const kb_export_row_t *m = &b->meta[i];
        kb_import_row_t *r = &rows[i];
        r->key = kb_rows_key(b->rows, i);
        r->values = b->dim ? b->rows->values + i * b->dim : NULL;
        r->opt_state = m->opt_floats ? b->state + b->state_at[i] : NULL;
        r->opt_steps = m->opt_steps;
        r->version = m->version;
        r->frequency = m->frequency;
        r->updated_at_ms = m->updated_at_ms;
        r->pending_count = m->pending_count;
        r->pending = m->pending_count ? b->state + b->state_at[i] + m->opt_floats : NULL;
        r->record = b->records ? b->records[i] : NULL;
    }
    int rc = kb_cluster_import_rows(bank, table, rows, n, b->dim, b->opt_floats);
    free(rows);
    return rc;
}

/* qsort_r order of row indices by version, then file order (so a later row for the same key still comes
 * later and wins on the server). */
static int s_by_version(const void *a, const void *b, void *ctx)
{
    const uint64_t *versions = ctx;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (versions[x] != versions[y])
        return versions[x] < versions[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Writes the batch to the bank and clears it. 0 or KB_EXPORT_EBANK (message set). */
static int s_batch_flush(kb_cluster_t *bank, const char *table, s_batch_t *b, char *err, size_t errlen)
{
    const kb_rows_t *rows = b->rows;
    size_t n = rows->n, dim = rows->dim;
    if (n == 0)
        return 0;
    int rc = 0;
    kb_key_t *keys = carls_xmalloc(n * sizeof *keys);
    if (b->meta) {
        rc = s_batch_import_rows(bank, table, b);
    } else if (!dim) {
        for (size_t i = 0; i < n; i++)
            keys[i] = kb_rows_key(rows, i);
        rc = kb_cluster_feature_put(bank, table, keys, n, (const Carls__FeatureRecord *const *)b->records);
    } else {
        /* One put per version: the protocol's put tags all its rows with one version. */
        size_t *order = carls_xmalloc(n * sizeof *order);
        float *vals = carls_xmalloc(n * dim * sizeof *vals);
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        qsort_r(order, n, sizeof *order, s_by_version, b->versions);
        for (size_t i = 0; i < n; i++) {
            keys[i] = kb_rows_key(rows, order[i]);
            memcpy(vals + i * dim, rows->values + order[i] * dim, dim * sizeof *vals);
        }
        for (size_t start = 0; start < n && rc == 0;) {
            size_t end = start + 1;
            while (end < n && b->versions[order[end]] == b->versions[order[start]])
                end++;
            rc = kb_cluster_put(bank, table, keys + start, end - start, (uint32_t)dim, vals + start * dim,
                                b->versions[order[start]]);
            start = end;
        }
        free(vals);
        free(order);
    }
    free(keys);
    s_batch_clear(b);
    if (rc != 0)
        return carls_errorf(err, errlen, KB_EXPORT_EBANK, "%s", kb_cluster_last_error(bank));
    return 0;
}

/* kb_export_table_npy's page consumer: the rows into a kb_rows_t (ctx), refusing keys a keys file cannot hold. */
static int s_page_to_rows(void *ctx, const Carls__TableConfig *cfg, const Carls__ScanResult *r, char *err,
                          size_t errlen)
{
    kb_rows_t *rows = ctx;
    for (size_t i = 0; i < r->n_keys; i++) {
        const ProtobufCBinaryData *k = &r->keys[i];
        if (memchr(k->data, '\n', k->len) || (k->len && k->data[k->len - 1] == '\r'))
            return carls_errorf(err, errlen, KB_EXPORT_EINVAL,
                                "row %zu: its key holds a newline or ends in a carriage return, which a keys file "
                                "of one key a line cannot hold (use kbctl export TABLE FILE)",
                                rows->n);
        kb_rows_append(rows, k->data, k->len, r->values + i * cfg->dim);
    }
    return 0;
}

int kb_export_table_npy(kb_cluster_t *bank, const char *table, const char *npy_path, const char *keys_path,
                        uint32_t page, uint64_t *rows_out, carls_progress_t *progress, char *err, size_t errlen)
{
    if (rows_out)
        *rows_out = 0;
    if (!bank || !table || !npy_path || !keys_path)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "export: a bank, a table and two paths are required");
    if (page == 0)
        page = S_DEFAULT_PAGE;
    Carls__TableConfig *cfg = NULL;
    if (kb_cluster_table_config(bank, table, &cfg) != 0)
        return carls_errorf(err, errlen, KB_EXPORT_EBANK, "%s", kb_cluster_last_error(bank));
    int rc = 0;
    kb_rows_t *rows = NULL;
    char *keys_text = NULL;
    size_t keys_len = 0;
    if (cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE || cfg->dim == 0) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EINVAL, "%s is a feature table: .npy holds embeddings only", table);
        goto cleanup;
    }
    rows = kb_rows_new(cfg->dim);
    rc = s_scan_table(bank, table, page, cfg, s_page_to_rows, rows, progress, err, errlen);
    if (rc != 0)
        goto cleanup;
    FILE *f = open_memstream(&keys_text, &keys_len);
    if (!f) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "out of memory for the keys");
        goto cleanup;
    }
    for (size_t i = 0; i < rows->n; i++) {
        kb_key_t k = kb_rows_key(rows, i);
        fwrite(k.data, 1, k.len, f);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "out of memory for the keys");
        goto cleanup;
    }
    if (carls_npy_write_f32(npy_path, rows->values, rows->n, cfg->dim, err, errlen) != 0) {
        rc = KB_EXPORT_EIO;
        goto cleanup;
    }
    char inner[512];
    if (carls_write_file_atomic(keys_path, keys_text, keys_len, 0644, 0, inner, sizeof inner) != 0) {
        rc = carls_errorf(err, errlen, KB_EXPORT_EIO, "%s (%s was written; its keys were not)", inner, npy_path);
        goto cleanup;
    }
    if (rows_out)
        *rows_out = rows->n;
    if (progress)
        carls_progress_finish(progress, NULL);
cleanup:
    free(keys_text);
    kb_rows_destroy(&rows);
    carls__table_config__free_unpacked(cfg, NULL);
    return rc;
}

int kb_import_table(kb_cluster_t *bank, const char *table, const char *path, size_t batch, uint64_t *rows_out,
                    carls_progress_t *progress, char *err, size_t errlen)
{
    if (rows_out)
        *rows_out = 0;
    if (!bank || !table || !path)
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "import: a bank, a table and a path are required");
    if (!carls_table_name_valid(table))
        return carls_errorf(err, errlen, KB_EXPORT_EINVAL, "import: invalid table name \"%s\"", table);
    if (batch == 0)
        batch = S_DEFAULT_BATCH;
    kb_export_reader_t *r = NULL;
    /* Everything about the file is checked before the bank is touched. */
    int rc = kb_export_reader_open(path, &r, err, errlen);
    if (rc != 0)
        return rc;
    const Carls__TableConfig *cfg = kb_export_reader_config(r);
    bool feature = cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    uint64_t written = 0;
    s_batch_t b;
    s_batch_init(&b, batch, feature ? 0 : cfg->dim, kb_export_reader_version(r) >= 2);
    if (kb_cluster_create_table(bank, table, cfg, true) != 0) {
        if (kb_cluster_last_status(bank) == CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS)
            rc = carls_errorf(err, errlen, KB_EXPORT_EBANK, "table %s exists with another config than the file's (%s)",
                        table, kb_cluster_last_error(bank));
        else
            rc = carls_errorf(err, errlen, KB_EXPORT_EBANK, "%s", kb_cluster_last_error(bank));
        goto cleanup;
    }
    char label[64];
    snprintf(label, sizeof label, "import %s", table);
    if (progress)
        carls_progress_start_units(progress, label, (int64_t)kb_export_reader_rows(r), "rows");
    kb_export_row_t row;
    int got;
    while ((got = kb_export_reader_next(r, &row, err, errlen)) == 1) {
        if (s_batch_add(&b, &row) != 0) {
            got = carls_errorf(err, errlen, KB_EXPORT_ECORRUPT, "%s: a feature record no longer decodes (was the file "
                         "changed while being imported?)", path);
            break;
        }
        if (s_batch_full(&b)) {
            size_t k = b.rows->n;
            rc = s_batch_flush(bank, table, &b, err, errlen);
            if (rc != 0)
                goto cleanup;
            written += k;
            if (progress)
                carls_progress_add(progress, (int64_t)k);
        }
    }
    if (got < 0) {
        rc = got;
        goto cleanup;
    }
    size_t k = b.rows->n;
    rc = s_batch_flush(bank, table, &b, err, errlen);
    if (rc == 0)
        written += k;
    if (rc == 0 && progress) {
        carls_progress_add(progress, (int64_t)k);
        carls_progress_finish(progress, NULL);
    }
cleanup:
    if (rows_out)
        *rows_out = written;
    s_batch_free(&b);
    kb_export_reader_destroy(&r);
    return rc;
}
