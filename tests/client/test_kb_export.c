/* Tests of kb_export (table snapshot files): the writer's files read back row for row and bit for bit; the
 * reader refuses crafted bad files with the right code and a message, whether their checksum is right (a
 * file written wrong: the structural reason) or not (a damaged file: checksum mismatch); the writer leaves
 * no temporary file behind and never a half-written target. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kb_export.h"
#include "protocol.h"
#include "test_util.h"
#include "test_proto.h"

/* Crafted files are format 1 (rows without their state), which the reader still reads. */
#define S_V1 1u

static void s_path(const char *name, char *out, size_t cap) { snprintf(out, cap, "%s/%s", test_scratch_dir, name); }

/* ---- a byte builder for crafted files ---- */

typedef struct {
    uint8_t *b;
    size_t len, cap;
} s_buf_t;

static void s_put(s_buf_t *s, const void *p, size_t n)
{
    if (s->len + n > s->cap) {
        s->cap = (s->len + n) * 2 + 64;
        s->b = realloc(s->b, s->cap);
        assert_non_null(s->b);
    }
    if (n)
        memcpy(s->b + s->len, p, n);
    s->len += n;
}

static void s_u32(s_buf_t *s, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    s_put(s, b, 4);
}

static void s_u64(s_buf_t *s, uint64_t v)
{
    s_u32(s, (uint32_t)v);
    s_u32(s, (uint32_t)(v >> 32));
}

static void s_f32(s_buf_t *s, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    s_u32(s, bits);
}

/* Header: magic, version, name, config of kind/dim. */
static void s_header(s_buf_t *s, uint32_t version, const char *name, Carls__TableKind kind, uint32_t dim)
{
    s_put(s, KB_EXPORT_MAGIC, 8);
    s_u32(s, version);
    s_u32(s, (uint32_t)strlen(name));
    s_put(s, name, strlen(name));
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = kind;
    cfg.dim = dim;
    uint8_t packed[64];
    size_t n = carls__table_config__pack(&cfg, packed);
    s_u32(s, (uint32_t)n);
    s_put(s, packed, n);
}

/* An embedding row of dim values v0, v0+1, ... */
static void s_row(s_buf_t *s, const char *key, uint64_t version, uint32_t dim, float v0)
{
    s_u32(s, (uint32_t)strlen(key));
    s_put(s, key, strlen(key));
    s_u64(s, version);
    s_u64(s, 3);
    s_u32(s, 4 * dim);
    for (uint32_t j = 0; j < dim; j++)
        s_f32(s, v0 + (float)j);
}

/* From scratch: a feature table "g"'s header and its one row up to the record's length (key "k", version and
 * frequency 0). */
static void s_feature_row_start(s_buf_t *s)
{
    s->len = 0;
    s_header(s, S_V1, "g", CARLS__TABLE_KIND__TABLE_FEATURE, 0);
    s_u32(s, 1);
    s_put(s, "k", 1);
    s_u64(s, 0);
    s_u64(s, 0);
}

/* Trailer with the row count and the CRC of everything before it (plus crc_delta, to damage it). */
static void s_trailer(s_buf_t *s, uint64_t rows, uint32_t crc_delta)
{
    s_put(s, KB_EXPORT_END_MAGIC, 8);
    s_u64(s, rows);
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), s->b, (uInt)s->len);
    s_u32(s, crc + crc_delta);
}

static void s_write_file(const char *path, const s_buf_t *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(s->b, 1, s->len, f), s->len);
    fclose(f);
}

/* Writes s to a file and opens it: returns the reader's code; err gets its message. */
static int s_open(const s_buf_t *s, char *err, size_t errlen)
{
    char path[320];
    s_path("crafted.kbx", path, sizeof path);
    s_write_file(path, s);
    kb_export_reader_t *r = NULL;
    err[0] = '\0';
    int rc = kb_export_reader_open(path, &r, err, errlen);
    if (rc == 0) {
        assert_non_null(r);
        kb_export_reader_destroy(&r);
    } else {
        assert_null(r);
        assert_true(strlen(err) > 10);
    }
    return rc;
}

/* Opens a writer of table `table` (dim dim, default settings) at scratch file `file`, whose path goes to
 * path. */
static kb_export_writer_t *s_writer(const char *file, const char *table, uint32_t dim, char *path, size_t pathlen)
{
    char err[256];
    s_path(file, path, pathlen);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = dim;
    kb_export_writer_t *w = NULL;
    assert_int_equal(kb_export_writer_open(path, table, &cfg, &w, err, sizeof err), 0);
    return w;
}

/* ---- tests ---- */

static void test_writer_round_trip(void **state)
{
    (void)state;
    char path[320], err[256];
    s_path("emb.kbx", path, sizeof path);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__OptimizerConfig opt = CARLS__OPTIMIZER_CONFIG__INIT;
    cfg.dim = 3;
    opt.kind = CARLS__OPTIMIZER_KIND__OPT_ADAM;
    opt.learning_rate = 0.25f;
    cfg.optimizer = &opt;
    kb_export_writer_t *w = NULL;
    assert_int_equal(kb_export_writer_open(path, "emb.v1", &cfg, &w, err, sizeof err), 0);
    /* Values that need every bit: -0, a subnormal, the largest float. */
    const float rows[3][3] = {{-0.0f, 1e-45f, 3.40282347e+38f}, {0.1f, -2.5f, 7}, {1, 2, 3}};
    const char *keys[3] = {"a", "key with\ttab and \xff byte", "c"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(kb_export_writer_add(w, keys[i], strlen(keys[i]), 100 + (uint64_t)i, 7 * (uint64_t)i,
                                              rows[i], NULL, err, sizeof err), 0);
    /* Refused rows change nothing. */
    const float nan_row[3] = {1, NAN, 2};
    assert_int_equal(kb_export_writer_add(w, "n", 1, 0, 0, nan_row, NULL, err, sizeof err), KB_EXPORT_EINVAL);
    assert_int_equal(kb_export_writer_add(w, "", 0, 0, 0, rows[0], NULL, err, sizeof err), KB_EXPORT_EINVAL);
    char long_key[CARLS_DEFAULT_MAX_KEY_BYTES + 1];
    memset(long_key, 'k', sizeof long_key);
    assert_int_equal(kb_export_writer_add(w, long_key, sizeof long_key, 0, 0, rows[0], NULL, err, sizeof err),
                     KB_EXPORT_EINVAL);
    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    assert_int_equal(kb_export_writer_add(w, "r", 1, 0, 0, NULL, &rec, err, sizeof err), KB_EXPORT_EINVAL);
    assert_int_equal(kb_export_writer_rows(w), 3);
    /* Nothing at the target until finish. */
    struct stat sb;
    assert_int_not_equal(stat(path, &sb), 0);
    assert_int_equal(kb_export_writer_finish(w, err, sizeof err), 0);
    kb_export_writer_destroy(&w);
    assert_null(w);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    /* No temporary file left beside it. */
    DIR *d = opendir(test_scratch_dir);
    struct dirent *e;
    while ((e = readdir(d)))
        assert_null(strstr(e->d_name, ".tmp"));
    closedir(d);

    kb_export_reader_t *r = NULL;
    assert_int_equal(kb_export_reader_open(path, &r, err, sizeof err), 0);
    assert_string_equal(kb_export_reader_table(r), "emb.v1");
    assert_int_equal(kb_export_reader_rows(r), 3);
    const Carls__TableConfig *got = kb_export_reader_config(r);
    assert_int_equal(got->dim, 3);
    assert_int_equal(got->optimizer->kind, CARLS__OPTIMIZER_KIND__OPT_ADAM);
    assert_true(got->optimizer->learning_rate == 0.25f);
    kb_export_row_t row;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 1);
        assert_int_equal(row.key_len, strlen(keys[i]));
        assert_memory_equal(row.key, keys[i], row.key_len);
        assert_int_equal(row.version, 100 + i);
        assert_int_equal(row.frequency, 7 * i);
        assert_memory_equal(row.values, rows[i], sizeof rows[i]);
        assert_null(row.record);
    }
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 0);
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 0);
    kb_export_reader_destroy(&r);
    kb_export_reader_destroy(&r);
    kb_export_reader_destroy(NULL);
}

static void test_feature_round_trip(void **state)
{
    (void)state;
    char path[320], err[256];
    s_path("feat.kbx", path, sizeof path);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    kb_export_writer_t *w = NULL;
    assert_int_equal(kb_export_writer_open(path, "graph", &cfg, &w, err, sizeof err), 0);
    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    ProtobufCBinaryData nbrs[2] = {{2, (uint8_t *)"n1"}, {3, (uint8_t *)"n,2"}};
    float weights[2] = {0.5f, -0.25f};
    test_record_neighbors(&rec, nbrs, weights, 2);
    rec.label_case = CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL;
    rec.float_label = 1.5f;
    rec.version = 9;
    rec.found = true; /* a reply-only flag: not stored */
    assert_int_equal(kb_export_writer_add(w, "node", 4, 9, 2, NULL, &rec, err, sizeof err), 0);
    Carls__FeatureRecord empty = CARLS__FEATURE_RECORD__INIT;
    assert_int_equal(kb_export_writer_add(w, "bare", 4, 0, 0, NULL, &empty, err, sizeof err), 0);
    float v = 1;
    assert_int_equal(kb_export_writer_add(w, "x", 1, 0, 0, &v, NULL, err, sizeof err), KB_EXPORT_EINVAL);
    assert_int_equal(kb_export_writer_finish(w, err, sizeof err), 0);
    /* finish is once only. */
    assert_int_equal(kb_export_writer_finish(w, err, sizeof err), KB_EXPORT_EINVAL);
    kb_export_writer_destroy(&w);

    kb_export_reader_t *r = NULL;
    assert_int_equal(kb_export_reader_open(path, &r, err, sizeof err), 0);
    assert_int_equal(kb_export_reader_config(r)->kind, CARLS__TABLE_KIND__TABLE_FEATURE);
    kb_export_row_t row;
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 1);
    assert_null(row.values);
    Carls__FeatureRecord *got = carls__feature_record__unpack(NULL, row.record_len, row.record);
    assert_non_null(got);
    assert_false(got->found);
    assert_int_equal(got->n_neighbor_keys, 2);
    assert_memory_equal(got->neighbor_keys[1].data, "n,2", 3);
    assert_true(got->neighbor_weights[1] == -0.25f);
    assert_int_equal(got->label_case, CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL);
    assert_true(got->float_label == 1.5f);
    assert_int_equal(got->version, 9);
    carls__feature_record__free_unpacked(got, NULL);
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 1);
    assert_int_equal(row.record_len, 0); /* an empty record packs to nothing, and that is valid */
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 0);
    kb_export_reader_destroy(&r);
}

/* Format 2: a row's whole state (updated_at, optimizer steps and floats, pending gradients) reads back bit
 * for bit; states the format cannot hold are refused by the writer and, crafted, by the reader. */
static void s_state(s_buf_t *s, int64_t updated, uint64_t steps, uint32_t opt_floats, uint32_t pending,
                    uint32_t dim, float f)
{
    s_u64(s, (uint64_t)updated);
    s_u64(s, steps);
    s_u32(s, opt_floats);
    s_u32(s, pending);
    for (uint32_t j = 0; j < opt_floats + pending * dim; j++)
        s_f32(s, f + (float)j);
}

static void test_state_round_trip(void **state)
{
    (void)state;
    char path[320], err[256];
    kb_export_writer_t *w = s_writer("state.kbx", "emb", 2, path, sizeof path);
    float v[2] = {1.5f, -2.0f}, opt[2] = {0.1f, 3.25f}, pend[6] = {1, 2, 3, 4, 5, 6};
    kb_export_state_t st = {.version = 7, .frequency = 9, .updated_at_ms = 1700000000123, .opt_steps = 4,
                            .opt_floats = 2, .opt_state = opt, .pending_count = 3, .pending = pend};
    assert_int_equal(kb_export_writer_add_state(w, "a", 1, v, NULL, &st, err, sizeof err), 0);
    st.pending_count = 0;
    st.pending = NULL;
    assert_int_equal(kb_export_writer_add_state(w, "b", 1, v, NULL, &st, err, sizeof err), 0);
    /* Refused before anything of the row is written: another optimizer float count than row 1's, a NaN, too
     * many pending gradients, a negative timestamp. The file stays good. */
    kb_export_state_t bad = st;
    bad.opt_floats = 1;
    assert_int_equal(kb_export_writer_add_state(w, "c", 1, v, NULL, &bad, err, sizeof err), KB_EXPORT_EINVAL);
    assert_non_null(strstr(err, "row 3"));
    float nan_opt[2] = {0.1f, NAN};
    bad = st;
    bad.opt_state = nan_opt;
    assert_int_equal(kb_export_writer_add_state(w, "c", 1, v, NULL, &bad, err, sizeof err), KB_EXPORT_EINVAL);
    bad = st;
    bad.pending_count = CARLS_MAX_PENDING_LIMIT + 1;
    bad.pending = pend;
    assert_int_equal(kb_export_writer_add_state(w, "c", 1, v, NULL, &bad, err, sizeof err), KB_EXPORT_EINVAL);
    bad = st;
    bad.updated_at_ms = -1;
    assert_int_equal(kb_export_writer_add_state(w, "c", 1, v, NULL, &bad, err, sizeof err), KB_EXPORT_EINVAL);
    assert_int_equal(kb_export_writer_finish(w, err, sizeof err), 0);
    kb_export_writer_destroy(&w);

    kb_export_reader_t *r = NULL;
    assert_int_equal(kb_export_reader_open(path, &r, err, sizeof err), 0);
    assert_int_equal(kb_export_reader_version(r), KB_EXPORT_VERSION);
    assert_int_equal(kb_export_reader_rows(r), 2);
    kb_export_row_t row;
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 1);
    assert_int_equal(row.version, 7);
    assert_int_equal(row.frequency, 9);
    assert_int_equal(row.updated_at_ms, 1700000000123);
    assert_int_equal(row.opt_steps, 4);
    assert_int_equal(row.opt_floats, 2);
    assert_memory_equal(row.opt_state, opt, sizeof opt);
    assert_int_equal(row.pending_count, 3);
    assert_memory_equal(row.pending, pend, sizeof pend);
    assert_memory_equal(row.values, v, sizeof v);
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 1);
    assert_int_equal(row.pending_count, 0);
    assert_null(row.pending);
    assert_memory_equal(row.opt_state, opt, sizeof opt);
    assert_int_equal(kb_export_reader_next(r, &row, err, sizeof err), 0);
    kb_export_reader_destroy(&r);

    /* A feature table's rows have no optimizer state. */
    Carls__TableConfig fcfg = CARLS__TABLE_CONFIG__INIT;
    fcfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    assert_int_equal(kb_export_writer_open(path, "g", &fcfg, &w, err, sizeof err), 0);
    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    kb_export_state_t fst = {.version = 1, .opt_floats = 2, .opt_state = opt};
    assert_int_equal(kb_export_writer_add_state(w, "k", 1, NULL, &rec, &fst, err, sizeof err), KB_EXPORT_EINVAL);
    kb_export_writer_destroy(&w);

    /* Crafted format-2 files: a good one, then each state field made wrong (with a right checksum). */
    s_buf_t s = {0};
    for (int fault = 0; fault <= 5; fault++) {
        s.len = 0;
        s_header(&s, 2, "t", CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
        s_row(&s, "a", 1, 2, 0.5f);
        s_state(&s, 5, 1, 2, 1, 2, 0.25f);
        s_row(&s, "b", 1, 2, 0.5f);
        switch (fault) {
        case 0: s_state(&s, 0, 0, 2, 0, 2, 1.0f); break;                         /* good */
        case 1: s_state(&s, 0, 0, 4, 0, 2, 1.0f); break;                         /* opt floats differ */
        case 2: s_state(&s, -5, 0, 2, 0, 2, 1.0f); break;                        /* negative timestamp */
        case 3: s_state(&s, 0, 0, 2, CARLS_MAX_PENDING_LIMIT + 1, 2, 1.0f); break; /* too many pending */
        case 4: s_state(&s, 0, 0, 17, 0, 2, 1.0f); break;                        /* over 8 * dim */
        case 5:                                                                   /* a NaN gradient */
            s_u64(&s, 0), s_u64(&s, 0), s_u32(&s, 2), s_u32(&s, 1);
            s_f32(&s, 1), s_f32(&s, 1), s_f32(&s, 1), s_f32(&s, NAN);
            break;
        }
        s_trailer(&s, 2, 0);
        int rc = s_open(&s, err, sizeof err);
        if (fault == 0)
            assert_int_equal(rc, 0);
        else if (rc != KB_EXPORT_ECORRUPT)
            fail_msg("fault %d: code %d (%s)", fault, rc, err);
        if (fault)
            assert_non_null(strstr(err, "row 2"));
    }
    free(s.b);
}

/* An unfinished writer leaves an existing target as it was and removes its temporary file. */
static void test_abandoned_writer_keeps_target(void **state)
{
    (void)state;
    char path[320], err[256];
    s_path("keep.kbx", path, sizeof path);
    s_buf_t old = {0};
    s_put(&old, "previous contents", 17);
    s_write_file(path, &old);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 1;
    kb_export_writer_t *w = NULL;
    assert_int_equal(kb_export_writer_open(path, "t", &cfg, &w, err, sizeof err), 0);
    float v = 1;
    assert_int_equal(kb_export_writer_add(w, "a", 1, 0, 0, &v, NULL, err, sizeof err), 0);
    kb_export_writer_destroy(&w);
    FILE *f = fopen(path, "rb");
    char buf[32] = {0};
    assert_int_equal(fread(buf, 1, sizeof buf, f), 17);
    fclose(f);
    assert_string_equal(buf, "previous contents");
    DIR *d = opendir(test_scratch_dir);
    struct dirent *e;
    while ((e = readdir(d)))
        assert_null(strstr(e->d_name, ".tmp"));
    closedir(d);
    /* Bad arguments. */
    assert_int_equal(kb_export_writer_open(path, "bad name", &cfg, &w, err, sizeof err), KB_EXPORT_EINVAL);
    cfg.dim = 0;
    assert_int_equal(kb_export_writer_open(path, "t", &cfg, &w, err, sizeof err), KB_EXPORT_EINVAL);
    cfg.dim = 1;
    assert_int_equal(kb_export_writer_open("/nonexistent-dir/x.kbx", "t", &cfg, &w, err, sizeof err), KB_EXPORT_EIO);
    assert_null(w);
    free(old.b);
}

/* A well-formed crafted file opens; each field made wrong (with a correct checksum, as a buggy writer would
 * produce) is refused with the structural code. */
static void test_crafted_files(void **state)
{
    (void)state;
    char err[512];
    s_buf_t s = {0};

    /* The reference: two rows of dim 2. */
    s_header(&s, S_V1, "t", CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
    s_row(&s, "a", 1, 2, 0.5f);
    s_row(&s, "b", 2, 2, 1.5f);
    s_trailer(&s, 2, 0);
    assert_int_equal(s_open(&s, err, sizeof err), 0);
    s.len = 0;

    /* Zero rows is a valid file. */
    s_header(&s, S_V1, "t", CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
    s_trailer(&s, 0, 0);
    assert_int_equal(s_open(&s, err, sizeof err), 0);
    s.len = 0;

    /* Not an export; another version; empty; shorter than any export. */
    s_put(&s, "CARLSCKP", 8);
    s_u32(&s, 1);
    for (int i = 0; i < 10; i++)
        s_u32(&s, 0);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_EMAGIC);
    assert_non_null(strstr(err, "not a carls table export"));
    s.len = 0;
    s_header(&s, KB_EXPORT_VERSION + 1, "t", CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
    s_trailer(&s, 0, 0);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_EVERSION);
    assert_non_null(strstr(err, "version 3"));
    assert_non_null(strstr(err, "reads versions 1..2"));
    s.len = 0;
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_EMAGIC);
    s_put(&s, KB_EXPORT_MAGIC, 8);
    s_u32(&s, 1);
    s_u32(&s, 1);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_ETRUNCATED);
    s.len = 0;

    /* No trailer at the end: a cut file. */
    s_header(&s, S_V1, "t", CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
    s_row(&s, "a", 1, 2, 0.5f);
    s_row(&s, "b", 2, 2, 1.5f);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_ETRUNCATED);
    assert_non_null(strstr(err, "truncated"));
    s.len = 0;

    /* Each structural fault, with a correct checksum: ECORRUPT and a reason. */
    struct {
        const char *what;
        int fault;
        const char *reason;
    } faults[] = {
        {"empty key", 1, "key of 0 bytes"},
        {"key over the cap", 2, "key of 1025 bytes"},
        {"key length 4 GiB", 3, "key of 4294967295 bytes"},
        {"payload of another dim", 4, "needs 8"},
        {"a NaN value", 5, "not finite"},
        {"row count off by one", 6, "the trailer says 3 rows"},
        {"a partial row before the trailer", 7, "runs past"},
        {"table name empty", 8, "table name of 0 bytes"},
        {"table name too long", 9, "table name of 200 bytes"},
        {"config length over the cap", 10, "config of"},
        {"config that does not decode", 11, "config does not decode"},
        {"dim 0", 12, "dim 0"},
        {"dim over the cap", 13, "dim 5000"},
        {"unknown kind", 14, "unknown table kind"},
        {"a key length running past the end", 15, "runs past"},
        {"an invalid table name", 16, "not a valid name"},
    };
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        for (int damaged = 0; damaged < 2; damaged++) {
            s.len = 0;
            int fault = faults[i].fault;
            if (fault == 8 || fault == 9 || fault == 16) {
                const char *name = fault == 8 ? "" : fault == 16 ? "a b" : NULL;
                char longname[201];
                memset(longname, 'n', 200);
                longname[200] = '\0';
                s_header(&s, S_V1, name ? name : longname, CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
            } else if (fault == 10 || fault == 11) {
                s_put(&s, KB_EXPORT_MAGIC, 8);
                s_u32(&s, S_V1);
                s_u32(&s, 1);
                s_put(&s, "t", 1);
                if (fault == 10) {
                    s_u32(&s, KB_EXPORT_MAX_CONFIG_BYTES + 1);
                } else {
                    s_u32(&s, 3);
                    s_put(&s, "\xff\xff\xff", 3); /* a field tag with no end */
                }
            } else {
                uint32_t dim = fault == 12 ? 0 : fault == 13 ? 5000 : 2;
                s_header(&s, S_V1, "t", fault == 14 ? (Carls__TableKind)7 : CARLS__TABLE_KIND__TABLE_EMBEDDING,
                         dim);
            }
            uint64_t rows = 2;
            s_row(&s, "a", 1, 2, 0.5f);
            switch (fault) {
            case 1:
            case 2:
            case 3:
                s_u32(&s, fault == 1 ? 0 : fault == 2 ? CARLS_DEFAULT_MAX_KEY_BYTES + 1 : UINT32_MAX);
                s_put(&s, "b", 1);
                s_u64(&s, 0);
                s_u64(&s, 0);
                s_u32(&s, 8);
                s_f32(&s, 0);
                s_f32(&s, 0);
                break;
            case 4:
                s_row(&s, "b", 2, 3, 1.5f);
                break;
            case 5:
                s_row(&s, "b", 2, 2, NAN);
                break;
            case 6:
                s_row(&s, "b", 2, 2, 1.5f);
                rows = 3;
                break;
            case 7:
                s_row(&s, "b", 2, 2, 1.5f);
                s_u32(&s, 1); /* a row that stops after its key length and key */
                s_put(&s, "c", 1);
                break;
            case 15:
                s_u32(&s, 1000); /* fits the cap, not the file */
                s_put(&s, "b", 1);
                break;
            default:
                s_row(&s, "b", 2, 2, 1.5f);
                break;
            }
            s_trailer(&s, rows, damaged ? 1 : 0);
            int rc = s_open(&s, err, sizeof err);
            int want = damaged ? KB_EXPORT_ECHECKSUM : KB_EXPORT_ECORRUPT;
            if (rc != want || !strstr(err, damaged ? "checksum mismatch" : faults[i].reason))
                fail_msg("%s (%s): rc %d, want %d; message: %s", faults[i].what, damaged ? "damaged" : "checksum right",
                         rc, want, err);
        }
    }

    /* Only the stored checksum wrong: the structure is fine, the checksum is not. */
    s.len = 0;
    s_header(&s, S_V1, "t", CARLS__TABLE_KIND__TABLE_EMBEDDING, 2);
    s_row(&s, "a", 1, 2, 0.5f);
    s_trailer(&s, 1, 0x100);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_ECHECKSUM);

    /* A feature record that does not decode. */
    s_feature_row_start(&s);
    s_u32(&s, 2);
    s_put(&s, "\x0a\xff", 2); /* field 1 (bytes) claiming 127+ bytes */
    s_trailer(&s, 1, 0);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_ECORRUPT);
    assert_non_null(strstr(err, "record does not decode"));
    /* A record length over the cap. */
    s_feature_row_start(&s);
    s_u32(&s, KB_EXPORT_MAX_RECORD_BYTES + 1);
    s_trailer(&s, 1, 0);
    assert_int_equal(s_open(&s, err, sizeof err), KB_EXPORT_ECORRUPT);

    /* A file that is not there, and a directory. */
    kb_export_reader_t *r = NULL;
    assert_int_equal(kb_export_reader_open("/nonexistent/x.kbx", &r, err, sizeof err), KB_EXPORT_EIO);
    assert_int_equal(kb_export_reader_open(test_scratch_dir, &r, err, sizeof err), KB_EXPORT_EIO);
    free(s.b);
}

/* Every single-byte corruption and every truncation of a real file is refused. */
static void test_every_byte_matters(void **state)
{
    (void)state;
    char path[320], err[512];
    kb_export_writer_t *w = s_writer("small.kbx", "small", 2, path, sizeof path);
    const float v[2] = {1.25f, -3};
    assert_int_equal(kb_export_writer_add(w, "k1", 2, 1, 1, v, NULL, err, sizeof err), 0);
    assert_int_equal(kb_export_writer_add(w, "k2", 2, 2, 2, v, NULL, err, sizeof err), 0);
    assert_int_equal(kb_export_writer_finish(w, err, sizeof err), 0);
    kb_export_writer_destroy(&w);
    FILE *f = fopen(path, "rb");
    s_buf_t good = {0};
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    s_put(&good, buf, n);
    s_buf_t bad = {0};
    for (size_t i = 0; i < good.len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            bad.len = 0;
            s_put(&bad, good.b, good.len);
            bad.b[i] ^= (uint8_t)(1u << bit);
            int rc = s_open(&bad, err, sizeof err);
            if (rc == 0)
                fail_msg("flipping bit %d of byte %zu went unnoticed", bit, i);
        }
    }
    for (size_t len = 0; len < good.len; len++) {
        bad.len = 0;
        s_put(&bad, good.b, len);
        assert_int_not_equal(s_open(&bad, err, sizeof err), 0);
    }
    /* Extra bytes at the end move the trailer: refused too. */
    bad.len = 0;
    s_put(&bad, good.b, good.len);
    s_put(&bad, "x", 1);
    assert_int_not_equal(s_open(&bad, err, sizeof err), 0);
    free(good.b);
    free(bad.b);
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_writer_round_trip),
    cmocka_unit_test(test_feature_round_trip),
    cmocka_unit_test(test_state_round_trip),
    cmocka_unit_test(test_abandoned_writer_keeps_target),
    cmocka_unit_test(test_crafted_files),
    cmocka_unit_test(test_every_byte_matters))
