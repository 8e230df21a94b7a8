/* Fuzz target "export": the table export reader, kb_export_reader_open / _next (client/kb_export.h).
 *
 * The reader takes a path, so each input is put in an in-memory file (memfd) and read through
 * /proc/self/fd/N. Every input is read twice: as it is, and "fixed up" (when it is long enough to have a
 * trailer) with its last 4 bytes replaced by the CRC-32 of the bytes before them, so mutations get past the
 * checksum and reach the structural checks. A valid export is unchanged by the fix-up.
 * When open succeeds, the rows pass must deliver exactly the trailer's row count, each row well formed
 * (key of 1..max bytes; dim finite values for an embedding table, a record that decodes for a feature
 * table; in format 2 a state within its caps, the same optimizer float count in every row, finite floats),
 * and end with 0. Then the rows are written again with kb_export_writer (format 2, what `kbctl export` would
 * write for the same table) and read back: the copy must hold the same name, kind, dim and rows, states
 * included. Format-1 inputs are still read (their rows have a zero state). */
#include "fuzz_common.h"

#include "bytes.h"
#include "kb_export.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_TRAILER_BYTES 20u /* "CARLSEND", u64 rows, u32 CRC (see kb_export.c) */

/* Where the write-back goes (fuzz_scratch_file, made on the first input). */
static const char *s_rewrite_path;

/* One row, copied out of the reader. */
typedef struct {
    uint8_t *key;
    size_t key_len;
    uint64_t version, frequency;
    float *values;                 /* embedding */
    Carls__FeatureRecord *record;  /* feature */
    kb_export_state_t state;       /* format 2 (zero in format 1); opt_state and pending point at copies */
} s_row_t;

static void s_rows_free(s_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rows[i].key);
        free(rows[i].values);
        free((float *)rows[i].state.opt_state);
        free((float *)rows[i].state.pending);
        if (rows[i].record)
            carls__feature_record__free_unpacked(rows[i].record, NULL);
    }
    free(rows);
}

/* Runs the rows pass of an open reader, checking each row; returns the rows (*n of them). */
static s_row_t *s_read_rows(kb_export_reader_t *r, size_t *n_out)
{
    const Carls__TableConfig *cfg = kb_export_reader_config(r);
    bool feature = cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    uint32_t dim = feature ? 0 : cfg->dim;
    uint64_t expected = kb_export_reader_rows(r);
    s_row_t *rows = NULL;
    size_t n = 0;
    char err[512];
    kb_export_row_t row;
    int rc;
    while ((rc = kb_export_reader_next(r, &row, err, sizeof err)) == 1) {
        FUZZ_CHECK(n < expected);
        FUZZ_CHECK(row.key && row.key_len >= 1 && row.key_len <= CARLS_DEFAULT_MAX_KEY_BYTES);
        rows = realloc(rows, (n + 1) * sizeof *rows);
        FUZZ_CHECK(rows != NULL);
        s_row_t *c = &rows[n++];
        memset(c, 0, sizeof *c);
        c->key = malloc(row.key_len);
        FUZZ_CHECK(c->key != NULL);
        memcpy(c->key, row.key, row.key_len);
        c->key_len = row.key_len;
        c->version = row.version;
        c->frequency = row.frequency;
        /* The state: within its caps, the same optimizer float count in every row, every float finite. */
        FUZZ_CHECK(row.updated_at_ms >= 0 && row.opt_floats <= KB_EXPORT_MAX_OPT_FACTOR * dim &&
                   row.pending_count <= CARLS_MAX_PENDING_LIMIT);
        FUZZ_CHECK(n == 1 || row.opt_floats == rows[0].state.opt_floats);
        FUZZ_CHECK(!feature || (row.opt_floats == 0 && row.pending_count == 0 && row.opt_steps == 0));
        c->state = (kb_export_state_t){.version = row.version, .frequency = row.frequency,
                                       .updated_at_ms = row.updated_at_ms, .opt_steps = row.opt_steps,
                                       .opt_floats = row.opt_floats, .pending_count = row.pending_count};
        size_t pending_floats = (size_t)row.pending_count * dim;
        if (row.opt_floats) {
            float *o = malloc(row.opt_floats * sizeof *o);
            FUZZ_CHECK(o != NULL);
            for (uint32_t j = 0; j < row.opt_floats; j++)
                FUZZ_CHECK(isfinite(row.opt_state[j]));
            memcpy(o, row.opt_state, row.opt_floats * sizeof *o);
            c->state.opt_state = o;
        }
        if (pending_floats) {
            float *p = malloc(pending_floats * sizeof *p);
            FUZZ_CHECK(p != NULL);
            for (size_t j = 0; j < pending_floats; j++)
                FUZZ_CHECK(isfinite(row.pending[j]));
            memcpy(p, row.pending, pending_floats * sizeof *p);
            c->state.pending = p;
        }
        if (feature) {
            FUZZ_CHECK(row.values == NULL && row.record != NULL);
            c->record = carls__feature_record__unpack(NULL, row.record_len, row.record);
            FUZZ_CHECK(c->record != NULL);
        } else {
            FUZZ_CHECK(row.values != NULL && row.record == NULL);
            c->values = malloc(dim * sizeof *c->values);
            FUZZ_CHECK(c->values != NULL);
            for (uint32_t j = 0; j < dim; j++)
                FUZZ_CHECK(isfinite(row.values[j]));
            memcpy(c->values, row.values, dim * sizeof *c->values);
        }
    }
    /* The file did not change, so the second pass must agree with the verified first one. */
    if (rc != 0)
        fprintf(stderr, "fuzz_export: rows pass failed after a successful open: %s\n", err);
    FUZZ_CHECK(rc == 0);
    FUZZ_CHECK(n == expected);
    FUZZ_CHECK(kb_export_reader_next(r, &row, err, sizeof err) == 0);
    *n_out = n;
    return rows;
}

/* Packs a record the way the writer stores it (found cleared) into a new buffer. */
static uint8_t *s_pack_record(const Carls__FeatureRecord *rec, size_t *len)
{
    Carls__FeatureRecord r = *rec;
    r.found = false;
    *len = carls__feature_record__get_packed_size(&r);
    uint8_t *buf = malloc(*len ? *len : 1);
    FUZZ_CHECK(buf != NULL);
    carls__feature_record__pack(&r, buf);
    return buf;
}

/* Writes name/cfg/rows with the writer and checks that reading the copy gives the same table. */
static void s_write_back(const char *name, const Carls__TableConfig *cfg, const s_row_t *rows, size_t n)
{
    bool feature = cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE;
    uint32_t dim = feature ? 0 : cfg->dim;
    char err[512];
    kb_export_writer_t *w = NULL;
    int rc = kb_export_writer_open(s_rewrite_path, name, cfg, &w, err, sizeof err);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = kb_export_writer_add_state(w, rows[i].key, rows[i].key_len, rows[i].values, rows[i].record,
                                        &rows[i].state, err, sizeof err);
    if (rc == 0)
        rc = kb_export_writer_finish(w, err, sizeof err);
    kb_export_writer_destroy(&w);
    if (rc != 0) {
        fprintf(stderr, "fuzz_export: writing back a table the reader accepted failed: %s\n", err);
        abort();
    }
    kb_export_reader_t *r = NULL;
    rc = kb_export_reader_open(s_rewrite_path, &r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "fuzz_export: reading back a written export failed: %s\n", err);
        abort();
    }
    FUZZ_CHECK(strcmp(kb_export_reader_table(r), name) == 0);
    const Carls__TableConfig *cfg2 = kb_export_reader_config(r);
    FUZZ_CHECK(cfg2->kind == cfg->kind && cfg2->dim == cfg->dim);
    size_t n2;
    s_row_t *rows2 = s_read_rows(r, &n2);
    FUZZ_CHECK(n2 == n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(rows2[i].key_len == rows[i].key_len && memcmp(rows2[i].key, rows[i].key, rows[i].key_len) == 0);
        FUZZ_CHECK(rows2[i].version == rows[i].version && rows2[i].frequency == rows[i].frequency);
        const kb_export_state_t *a = &rows[i].state, *b = &rows2[i].state;
        FUZZ_CHECK(a->updated_at_ms == b->updated_at_ms && a->opt_steps == b->opt_steps &&
                   a->opt_floats == b->opt_floats && a->pending_count == b->pending_count);
        FUZZ_CHECK(a->opt_floats == 0 || memcmp(a->opt_state, b->opt_state, a->opt_floats * sizeof(float)) == 0);
        FUZZ_CHECK(a->pending_count == 0 ||
                   memcmp(a->pending, b->pending, (size_t)a->pending_count * dim * sizeof(float)) == 0);
        if (feature) {
            size_t a_len, b_len;
            uint8_t *a = s_pack_record(rows[i].record, &a_len);
            uint8_t *b = s_pack_record(rows2[i].record, &b_len);
            FUZZ_CHECK(a_len == b_len && memcmp(a, b, a_len) == 0);
            free(a);
            free(b);
        } else {
            FUZZ_CHECK(memcmp(rows2[i].values, rows[i].values, dim * sizeof(float)) == 0);
        }
    }
    s_rows_free(rows2, n2);
    kb_export_reader_destroy(&r);
    unlink(s_rewrite_path);
}

/* Reads the export at path and checks the outcome (data, its bytes, is not needed: the write-back's rows are
 * compared with the rows read). */
static void s_read(const char *path, const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    kb_export_reader_t *r = NULL;
    char err[512] = "";
    int rc = kb_export_reader_open(path, &r, err, sizeof err);
    if (rc != KB_EXPORT_OK) {
        FUZZ_CHECK(r == NULL);
        FUZZ_CHECK(rc < 0 && rc >= KB_EXPORT_EINVAL && rc != KB_EXPORT_EIO);
        FUZZ_CHECK(err[0] != '\0');
        return;
    }
    FUZZ_CHECK(r != NULL);
    const char *name = kb_export_reader_table(r);
    FUZZ_CHECK(carls_table_name_valid(name));
    const Carls__TableConfig *cfg = kb_export_reader_config(r);
    FUZZ_CHECK(cfg != NULL);
    FUZZ_CHECK(cfg->kind == CARLS__TABLE_KIND__TABLE_FEATURE ||
               (cfg->kind == CARLS__TABLE_KIND__TABLE_EMBEDDING && cfg->dim >= 1 &&
                cfg->dim <= CARLS_DEFAULT_MAX_DIM));
    size_t n;
    s_row_t *rows = s_read_rows(r, &n);
    s_write_back(name, cfg, rows, n);
    s_rows_free(rows, n);
    kb_export_reader_destroy(&r);
    FUZZ_CHECK(r == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!s_rewrite_path) {
        carls_log_set_level(CARLS_LOG_OFF);
        s_rewrite_path = fuzz_scratch_file("export", "rewrite.kbx");
    }
    fuzz_read_with_crc_fixup(data, size, S_TRAILER_BYTES + 8, NULL, s_read);
    return 0;
}
