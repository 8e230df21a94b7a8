/* Unit tests for kb_store: file and directory permissions, a commit survives close and reopen with every
 * field intact, rollback leaves nothing, drop_table removes the table's rows, malformed rows written behind
 * the store's back are skipped, and a database of another schema version is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kb_store.h"

/* ---- scratch directory ---- */

typedef struct {
    char base[256]; /* mkdtemp directory */
    char data[300]; /* base/data: the store's directory, created by kb_store_open */
    char db[340];   /* data/bank.sqlite */
} s_dirs_t;

static void s_dirs_make(s_dirs_t *d)
{
    snprintf(d->base, sizeof d->base, "%s/test_kb_store.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(d->base));
    snprintf(d->data, sizeof d->data, "%s/data", d->base);
    snprintf(d->db, sizeof d->db, "%s/bank.sqlite", d->data);
}

static void s_dirs_remove(const s_dirs_t *d)
{
    static const char *suffixes[] = {"", "-wal", "-shm", "-journal"};
    char path[400];
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(path, sizeof path, "%s%s", d->db, suffixes[i]);
        unlink(path);
    }
    rmdir(d->data);
    rmdir(d->base);
}

static kb_store_t *s_open(const char *dir, bool sync)
{
    kb_store_t *s = NULL;
    char err[512] = "";
    if (kb_store_open(dir, sync, &s, err, sizeof err) != 0)
        fail_msg("kb_store_open(%s): %s", dir, err);
    assert_non_null(s);
    return s;
}

/* ---- what a load delivers, copied out of the callbacks ---- */

typedef struct {
    int64_t id;
    char name[64];
    uint8_t config[64];
    size_t config_len;
} s_table_t;

typedef struct {
    uint64_t client_id, max_seq;
    uint8_t window[256];
    size_t len;
} s_client_t;

typedef struct {
    s_table_t tables[16];
    size_t n_tables;
    kb_store_row_t rows[64];
    size_t n_rows;
    s_client_t clients[16];
    size_t n_clients;
    int stop_at_row; /* nonzero: on_row returns this */
} s_loaded_t;

static void *s_dup(const void *p, size_t n)
{
    if (n == 0)
        return NULL;
    void *q = malloc(n);
    assert_non_null(q);
    memcpy(q, p, n);
    return q;
}

static int s_on_table(void *ctx, int64_t id, const char *name, const uint8_t *config, size_t len)
{
    s_loaded_t *l = ctx;
    assert_true(l->n_tables < 16);
    assert_true(len <= 64);
    s_table_t *t = &l->tables[l->n_tables++];
    t->id = id;
    snprintf(t->name, sizeof t->name, "%s", name);
    if (len)
        memcpy(t->config, config, len);
    t->config_len = len;
    return 0;
}

static int s_on_row(void *ctx, const kb_store_row_t *row)
{
    s_loaded_t *l = ctx;
    if (l->stop_at_row)
        return l->stop_at_row;
    assert_true(l->n_rows < 64);
    kb_store_row_t *r = &l->rows[l->n_rows++];
    *r = *row;
    r->key = s_dup(row->key, row->key_len);
    r->value = s_dup(row->value, (size_t)row->dim * sizeof(float));
    r->opt_state = s_dup(row->opt_state, (size_t)row->opt_floats * sizeof(float));
    r->pending = s_dup(row->pending, (size_t)row->pending_count * row->dim * sizeof(float));
    return 0;
}

static int s_on_client(void *ctx, uint64_t client_id, uint64_t max_seq, const uint8_t *window, size_t len)
{
    s_loaded_t *l = ctx;
    assert_true(l->n_clients < 16);
    assert_true(len <= 256);
    s_client_t *c = &l->clients[l->n_clients++];
    c->client_id = client_id;
    c->max_seq = max_seq;
    if (len)
        memcpy(c->window, window, len);
    c->len = len;
    return 0;
}

static void s_loaded_free(s_loaded_t *l)
{
    for (size_t i = 0; i < l->n_rows; i++)
        kb_store_row_free(&l->rows[i]);
    memset(l, 0, sizeof *l);
}

static void s_load(kb_store_t *s, s_loaded_t *l)
{
    memset(l, 0, sizeof *l);
    assert_int_equal(kb_store_load(s, s_on_table, s_on_row, s_on_client, l), 0);
}

static const s_table_t *s_find_table(const s_loaded_t *l, int64_t id)
{
    for (size_t i = 0; i < l->n_tables; i++)
        if (l->tables[i].id == id)
            return &l->tables[i];
    return NULL;
}

static const kb_store_row_t *s_find_row(const s_loaded_t *l, int64_t table_id, const void *key, uint32_t len)
{
    const kb_store_row_t *hit = NULL;
    for (size_t i = 0; i < l->n_rows; i++) {
        const kb_store_row_t *r = &l->rows[i];
        if (r->table_id == table_id && r->key_len == len && memcmp(r->key, key, len) == 0) {
            assert_null(hit);
            hit = r;
        }
    }
    return hit;
}

static const s_client_t *s_find_client(const s_loaded_t *l, uint64_t id)
{
    for (size_t i = 0; i < l->n_clients; i++)
        if (l->clients[i].client_id == id)
            return &l->clients[i];
    return NULL;
}

static void s_assert_row_equal(const kb_store_row_t *got, const kb_store_row_t *want)
{
    assert_non_null(got);
    assert_int_equal(got->table_id, want->table_id);
    assert_int_equal(got->key_len, want->key_len);
    assert_memory_equal(got->key, want->key, want->key_len);
    assert_int_equal(got->row_id, want->row_id);
    assert_int_equal(got->dim, want->dim);
    assert_memory_equal(got->value, want->value, want->dim * sizeof(float));
    assert_int_equal(got->opt_floats, want->opt_floats);
    if (want->opt_floats)
        assert_memory_equal(got->opt_state, want->opt_state, want->opt_floats * sizeof(float));
    assert_int_equal(got->opt_steps, want->opt_steps);
    assert_int_equal(got->pending_count, want->pending_count);
    if (want->pending_count)
        assert_memory_equal(got->pending, want->pending, (size_t)want->pending_count * want->dim * sizeof(float));
    assert_int_equal(got->version, want->version);
    assert_int_equal(got->updated_at_ms, want->updated_at_ms);
    assert_int_equal(got->frequency, want->frequency);
}

/* ---- fixtures: three rows of two tables ---- */

static float s_v1[3] = {1.5f, -2.25f, 1e-30f};
static float s_o1[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
static float s_p1[2 * 3] = {1, 2, 3, 4, 5, 6};
static float s_v2[3] = {-0.0f, 3.0f, 1e30f};
static float s_v3[1] = {42.0f};

static kb_store_row_t s_row1(void)
{
    /* A key with NUL bytes, Adam-sized state, two pending gradients, large 64-bit metadata. */
    kb_store_row_t r = {.table_id = 1, .key = (uint8_t *)"k\0ey", .key_len = 4, .row_id = 7, .value = s_v1,
                        .dim = 3, .opt_state = s_o1, .opt_floats = 6, .opt_steps = 12345678901ULL,
                        .pending = s_p1, .pending_count = 2, .version = 0x7fffffffffffff00ULL,
                        .updated_at_ms = 1700000000123LL, .frequency = 99};
    return r;
}

static kb_store_row_t s_row2(void)
{
    /* SGD row: no optimizer state, nothing pending. */
    kb_store_row_t r = {.table_id = 1, .key = (uint8_t *)"k", .key_len = 1, .row_id = 8, .value = s_v2,
                        .dim = 3, .version = 1, .updated_at_ms = 0, .frequency = 0};
    return r;
}

static kb_store_row_t s_row3(void)
{
    kb_store_row_t r = {.table_id = 2, .key = (uint8_t *)"k", .key_len = 1, .row_id = 1, .value = s_v3,
                        .dim = 1, .version = 3, .updated_at_ms = 5, .frequency = 6};
    return r;
}

static const uint8_t s_config1[5] = {0x10, 0x03, 0x00, 0xff, 0x01};
static const uint8_t s_config2[2] = {0x10, 0x01};

static void s_fill(uint8_t *window, size_t len, uint8_t seed)
{
    for (size_t i = 0; i < len; i++)
        window[i] = (uint8_t)(seed + i * 37u);
}

static void s_put_fixture(kb_store_t *s)
{
    uint8_t w1[128], w2[128];
    s_fill(w1, sizeof w1, 1);
    s_fill(w2, sizeof w2, 2);
    assert_int_equal(kb_store_begin(s), 0);
    assert_int_equal(kb_store_put_table(s, 1, "users", s_config1, sizeof s_config1), 0);
    assert_int_equal(kb_store_put_table(s, 2, "items.v2", s_config2, sizeof s_config2), 0);
    kb_store_row_t r1 = s_row1(), r2 = s_row2(), r3 = s_row3();
    assert_int_equal(kb_store_put_row(s, &r1), 0);
    assert_int_equal(kb_store_put_row(s, &r2), 0);
    assert_int_equal(kb_store_put_row(s, &r3), 0);
    assert_int_equal(kb_store_put_client(s, 0xfeedfacecafebeefULL, 1ULL << 62, w1, sizeof w1), 0);
    assert_int_equal(kb_store_put_client(s, 5, 77, w2, sizeof w2), 0);
    assert_int_equal(kb_store_commit(s), 0);
}

static void s_check_fixture(const s_loaded_t *l)
{
    assert_int_equal(l->n_tables, 2);
    const s_table_t *t1 = s_find_table(l, 1), *t2 = s_find_table(l, 2);
    assert_non_null(t1);
    assert_non_null(t2);
    assert_string_equal(t1->name, "users");
    assert_int_equal(t1->config_len, sizeof s_config1);
    assert_memory_equal(t1->config, s_config1, sizeof s_config1);
    assert_string_equal(t2->name, "items.v2");
    assert_int_equal(t2->config_len, sizeof s_config2);
    assert_memory_equal(t2->config, s_config2, sizeof s_config2);

    assert_int_equal(l->n_rows, 3);
    kb_store_row_t r1 = s_row1(), r2 = s_row2(), r3 = s_row3();
    s_assert_row_equal(s_find_row(l, 1, "k\0ey", 4), &r1);
    s_assert_row_equal(s_find_row(l, 1, "k", 1), &r2);
    s_assert_row_equal(s_find_row(l, 2, "k", 1), &r3);

    assert_int_equal(l->n_clients, 2);
    uint8_t w1[128], w2[128];
    s_fill(w1, sizeof w1, 1);
    s_fill(w2, sizeof w2, 2);
    const s_client_t *c1 = s_find_client(l, 0xfeedfacecafebeefULL), *c2 = s_find_client(l, 5);
    assert_non_null(c1);
    assert_non_null(c2);
    assert_int_equal(c1->max_seq, 1ULL << 62);
    assert_int_equal(c1->len, sizeof w1);
    assert_memory_equal(c1->window, w1, sizeof w1);
    assert_int_equal(c2->max_seq, 77);
    assert_int_equal(c2->len, sizeof w2);
    assert_memory_equal(c2->window, w2, sizeof w2);
}

/* A new store in a new scratch directory d, holding the fixture (s_put_fixture). */
static kb_store_t *s_new_with_fixture(s_dirs_t *d)
{
    s_dirs_make(d);
    kb_store_t *s = s_open(d->data, false);
    s_put_fixture(s);
    return s;
}

/* Loads s and checks that it holds exactly the fixture. */
static void s_assert_holds_fixture(kb_store_t *s)
{
    s_loaded_t l;
    s_load(s, &l);
    s_check_fixture(&l);
    s_loaded_free(&l);
}

/* Closes *s and removes its scratch directory d. */
static void s_close_and_remove(kb_store_t **s, const s_dirs_t *d)
{
    kb_store_close(s);
    s_dirs_remove(d);
}

/* cmocka fixture of the tests that start from the fixture: a store s in scratch directory d holding it. The
 * teardown closes the store and removes the directory, also after a failed assertion. */
typedef struct {
    s_dirs_t d;
    kb_store_t *s;
} s_fixture_t;

static int s_fixture_setup(void **state)
{
    s_fixture_t *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    fx->s = s_new_with_fixture(&fx->d);
    *state = fx;
    return 0;
}

static int s_fixture_teardown(void **state)
{
    s_fixture_t *fx = *state;
    s_close_and_remove(&fx->s, &fx->d);
    free(fx);
    return 0;
}

/* A test entry that runs on the fixture store. */
#define S_FIXTURE_TEST(test) cmocka_unit_test_setup_teardown(test, s_fixture_setup, s_fixture_teardown)

/* Closes *s and opens the store in d again, as a restarted server would. */
static void s_reopen(kb_store_t **s, const s_dirs_t *d)
{
    kb_store_close(s);
    *s = s_open(d->data, false);
}

/* Runs sql on the database file of the closed store in d, behind the store's back; returns the number of rows
 * the last statement changed. */
static int s_exec_behind(const s_dirs_t *d, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(d->db, &db), SQLITE_OK);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("sqlite: %s", msg ? msg : "?");
    int changed = sqlite3_changes(db);
    sqlite3_close(db);
    return changed;
}

static void s_assert_private(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return; /* a -wal/-shm file that does not exist leaks nothing */
    if ((sb.st_mode & 077) != 0)
        fail_msg("%s has mode %o: readable or writable by group/others", path, (unsigned)(sb.st_mode & 0777));
}

/* ---- tests ---- */

/* Even under a permissive umask, the directory is created 0700 and the database files are private. */
static void test_permissions(void **st)
{
    (void)st;
    s_dirs_t d;
    s_dirs_make(&d);
    mode_t old = umask(0);
    kb_store_t *s = s_open(d.data, false);
    s_put_fixture(s);
    struct stat sb;
    assert_int_equal(stat(d.data, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 0777, 0700);
    assert_int_equal(stat(d.db, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_true((sb.st_mode & 0600) == 0600);
    s_assert_private(d.db);
    char path[400];
    snprintf(path, sizeof path, "%s-wal", d.db);
    s_assert_private(path);
    snprintf(path, sizeof path, "%s-shm", d.db);
    s_assert_private(path);
    assert_int_equal(kb_store_checkpoint(s), 0);
    kb_store_close(&s);
    assert_null(s);
    kb_store_close(&s); /* NULL is fine */
    umask(old);

    /* An existing directory is used as it is. */
    s = s_open(d.data, true);
    s_assert_holds_fixture(s);
    s_close_and_remove(&s, &d);
}

/* A path that is a file, or under one, is refused with a message. */
static void test_open_bad_directory(void **st)
{
    (void)st;
    s_dirs_t d;
    s_dirs_make(&d);
    FILE *f = fopen(d.data, "w");
    assert_non_null(f);
    fclose(f);
    kb_store_t *s = (kb_store_t *)&d; /* must be overwritten with NULL */
    char err[512] = "";
    assert_int_equal(kb_store_open(d.data, false, &s, err, sizeof err), -1);
    assert_null(s);
    assert_true(strlen(err) > 0);
    char below[400];
    snprintf(below, sizeof below, "%s/sub", d.data);
    err[0] = '\0';
    assert_int_equal(kb_store_open(below, false, &s, err, sizeof err), -1);
    assert_null(s);
    assert_true(strlen(err) > 0);
    unlink(d.data);
    rmdir(d.base);
}

/* What is committed comes back, field for field, after close and reopen; a later put replaces a row. */
static void test_commit_reopen_load(void **st)
{
    (void)st;
    s_dirs_t d;
    s_dirs_make(&d);
    kb_store_t *s = s_open(d.data, true);
    s_loaded_t l;
    s_load(s, &l); /* a new store is empty */
    assert_int_equal(l.n_tables + l.n_rows + l.n_clients, 0);
    s_put_fixture(s);

    s_reopen(&s, &d);
    s_assert_holds_fixture(s);

    /* Overwrite row 2 and client 5; rename table 2. */
    float v[3] = {9, 8, 7};
    kb_store_row_t r2 = s_row2();
    r2.value = v;
    r2.version = 2;
    uint8_t w[128];
    s_fill(w, sizeof w, 3);
    assert_int_equal(kb_store_begin(s), 0);
    assert_int_equal(kb_store_put_row(s, &r2), 0);
    assert_int_equal(kb_store_put_client(s, 5, 80, w, sizeof w), 0);
    assert_int_equal(kb_store_put_table(s, 2, "items.v3", s_config2, sizeof s_config2), 0);
    assert_int_equal(kb_store_commit(s), 0);

    s_reopen(&s, &d);
    s_load(s, &l);
    assert_int_equal(l.n_tables, 2);
    assert_string_equal(s_find_table(&l, 2)->name, "items.v3");
    assert_int_equal(l.n_rows, 3);
    s_assert_row_equal(s_find_row(&l, 1, "k", 1), &r2);
    kb_store_row_t r1 = s_row1();
    s_assert_row_equal(s_find_row(&l, 1, "k\0ey", 4), &r1);
    assert_int_equal(l.n_clients, 2);
    assert_int_equal(s_find_client(&l, 5)->max_seq, 80);
    assert_memory_equal(s_find_client(&l, 5)->window, w, sizeof w);
    s_loaded_free(&l);

    /* A callback's nonzero return stops the load and is returned. */
    memset(&l, 0, sizeof l);
    l.stop_at_row = 7;
    assert_int_equal(kb_store_load(s, s_on_table, s_on_row, s_on_client, &l), 7);
    assert_int_equal(l.n_clients, 0);
    s_loaded_free(&l);
    s_close_and_remove(&s, &d);
}

/* A frequency-only record changes the stored row's frequency and nothing else; one whose row id is not the
 * stored row's (a row since evicted and created again) or whose key is not stored changes nothing. */
static void test_frequency_only_update(void **st)
{
    s_fixture_t *fx = *st;
    kb_store_row_t r2 = s_row2(), r3 = s_row3();
    kb_store_row_t count2 = {.table_id = r2.table_id, .key = r2.key, .key_len = r2.key_len, .row_id = r2.row_id,
                             .frequency = 1000, .frequency_only = true};
    kb_store_row_t stale3 = {.table_id = r3.table_id, .key = r3.key, .key_len = r3.key_len,
                             .row_id = r3.row_id + 1, .frequency = 2000, .frequency_only = true};
    kb_store_row_t unknown = {.table_id = 1, .key = (uint8_t *)"nope", .key_len = 4, .row_id = 1,
                              .frequency = 3000, .frequency_only = true};
    assert_int_equal(kb_store_begin(fx->s), 0);
    assert_int_equal(kb_store_put_row(fx->s, &count2), 0);
    assert_int_equal(kb_store_put_row(fx->s, &stale3), 0);
    assert_int_equal(kb_store_put_row(fx->s, &unknown), 0);
    assert_int_equal(kb_store_commit(fx->s), 0);

    s_reopen(&fx->s, &fx->d);
    s_loaded_t l;
    s_load(fx->s, &l);
    assert_int_equal(l.n_rows, 3);
    r2.frequency = 1000;
    s_assert_row_equal(s_find_row(&l, 1, "k", 1), &r2); /* value, version, state untouched */
    s_assert_row_equal(s_find_row(&l, 2, "k", 1), &r3);
    kb_store_row_t r1 = s_row1();
    s_assert_row_equal(s_find_row(&l, 1, "k\0ey", 4), &r1);
    s_loaded_free(&l);
}

/* A rolled-back transaction leaves no trace, in this connection or after reopening. */
static void test_rollback(void **st)
{
    s_fixture_t *fx = *st;

    uint8_t w[128] = {0};
    float v[1] = {1};
    kb_store_row_t extra = {.table_id = 3, .key = (uint8_t *)"x", .key_len = 1, .row_id = 1, .value = v, .dim = 1};
    kb_store_row_t r1 = s_row1();
    float changed[3] = {0, 0, 0};
    r1.value = changed;
    assert_int_equal(kb_store_begin(fx->s), 0);
    assert_int_equal(kb_store_put_table(fx->s, 3, "later", s_config2, sizeof s_config2), 0);
    assert_int_equal(kb_store_put_row(fx->s, &extra), 0);
    assert_int_equal(kb_store_put_row(fx->s, &r1), 0);
    assert_int_equal(kb_store_put_client(fx->s, 9, 9, w, sizeof w), 0);
    assert_int_equal(kb_store_drop_table(fx->s, 2), 0);
    kb_store_rollback(fx->s);
    kb_store_rollback(fx->s); /* no transaction open: harmless */

    s_assert_holds_fixture(fx->s);
    s_reopen(&fx->s, &fx->d);
    s_assert_holds_fixture(fx->s);

    /* The store is usable after a rollback. */
    assert_int_equal(kb_store_begin(fx->s), 0);
    assert_int_equal(kb_store_put_client(fx->s, 9, 9, w, sizeof w), 0);
    assert_int_equal(kb_store_commit(fx->s), 0);
    s_loaded_t l;
    s_load(fx->s, &l);
    assert_int_equal(l.n_clients, 3);
    s_loaded_free(&l);
}

/* drop_table removes the table and its rows and nothing else. */
static void test_drop_table(void **st)
{
    s_fixture_t *fx = *st;
    assert_int_equal(kb_store_begin(fx->s), 0);
    assert_int_equal(kb_store_drop_table(fx->s, 1), 0);
    assert_int_equal(kb_store_drop_table(fx->s, 42), 0); /* unknown id: nothing to do */
    assert_int_equal(kb_store_commit(fx->s), 0);

    s_reopen(&fx->s, &fx->d);
    s_loaded_t l;
    s_load(fx->s, &l);
    assert_int_equal(l.n_tables, 1);
    assert_null(s_find_table(&l, 1));
    assert_non_null(s_find_table(&l, 2));
    assert_int_equal(l.n_rows, 1);
    kb_store_row_t r3 = s_row3();
    s_assert_row_equal(s_find_row(&l, 2, "k", 1), &r3);
    assert_int_equal(l.n_clients, 2);
    s_loaded_free(&l);

    /* The id can be used again by a new table, which starts empty. */
    assert_int_equal(kb_store_begin(fx->s), 0);
    assert_int_equal(kb_store_put_table(fx->s, 1, "fresh", s_config2, sizeof s_config2), 0);
    assert_int_equal(kb_store_commit(fx->s), 0);
    s_load(fx->s, &l);
    assert_int_equal(l.n_tables, 2);
    assert_string_equal(s_find_table(&l, 1)->name, "fresh");
    assert_int_equal(l.n_rows, 1);
    s_loaded_free(&l);
}

/* Rows whose table does not exist (any more) are skipped by the load. */
static void test_rows_of_missing_table_skipped(void **st)
{
    s_fixture_t *fx = *st;
    float v[1] = {1};
    kb_store_row_t orphan = {.table_id = 77, .key = (uint8_t *)"o", .key_len = 1, .row_id = 1, .value = v,
                             .dim = 1};
    assert_int_equal(kb_store_begin(fx->s), 0);
    assert_int_equal(kb_store_put_row(fx->s, &orphan), 0);
    assert_int_equal(kb_store_commit(fx->s), 0);
    s_loaded_t l;
    s_load(fx->s, &l);
    s_check_fixture(&l);
    assert_null(s_find_row(&l, 77, "o", 1));
    s_loaded_free(&l);
}

/* Rows written with malformed blobs are skipped; the load still succeeds and keeps the good rows. */
static void test_malformed_rows_skipped(void **st)
{
    s_fixture_t *fx = *st;
    kb_store_close(&fx->s);

    /* Columns: table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version,
     * updated_at, frequency. Floats are little-endian float32: 0000803f = 1.0, 00000040 = 2.0. */
    const char *sql =
        "BEGIN;"
        /* value of 7 bytes: not a whole number of floats */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'01', 100, x'0000803f000000', NULL, 0, NULL, 0, 1, 1, 1);"
        /* empty value: dim 0 */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'02', 101, x'', NULL, 0, NULL, 0, 1, 1, 1);"
        /* optimizer state of 5 bytes */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'03', 102, x'0000803f', x'0000803f00', 0, NULL, 0, 1, 1, 1);"
        /* pending_count 2 with one float of pending data (dim 1) */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'04', 103, x'0000803f', NULL, 0, x'00000040', 2, 1, 1, 1);"
        /* pending_count 1 with no pending data */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'05', 104, x'0000803f', NULL, 0, NULL, 1, 1, 1, 1);"
        /* negative pending_count */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'06', 105, x'0000803f', NULL, 0, x'00000040', -1, 1, 1, 1);"
        /* pending data although nothing is pending */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'07', 106, x'0000803f', NULL, 0, x'00000040', 0, 1, 1, 1);"
        /* a well-formed row written the same way: value 1.0, one pending gradient 2.0 */
        "INSERT INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, frequency) VALUES(1, x'08', 107, x'0000803f', NULL, 3, x'00000040', 1, 4, 5, 6);"
        "COMMIT;";
    s_exec_behind(&fx->d, sql);

    fx->s = s_open(fx->d.data, false);
    s_loaded_t l;
    s_load(fx->s, &l);
    assert_int_equal(l.n_tables, 2);
    assert_int_equal(l.n_clients, 2);
    assert_int_equal(l.n_rows, 4); /* the fixture's three and the good one */
    kb_store_row_t r1 = s_row1();
    s_assert_row_equal(s_find_row(&l, 1, "k\0ey", 4), &r1);
    for (uint8_t k = 1; k <= 7; k++)
        assert_null(s_find_row(&l, 1, &k, 1));
    uint8_t good = 8;
    const kb_store_row_t *g = s_find_row(&l, 1, &good, 1);
    assert_non_null(g);
    assert_int_equal(g->row_id, 107);
    assert_int_equal(g->dim, 1);
    assert_true(g->value[0] == 1.0f);
    assert_int_equal(g->opt_floats, 0);
    assert_int_equal(g->opt_steps, 3);
    assert_int_equal(g->pending_count, 1);
    assert_true(g->pending[0] == 2.0f);
    assert_int_equal(g->version, 4);
    assert_int_equal(g->updated_at_ms, 5);
    assert_int_equal(g->frequency, 6);
    s_loaded_free(&l);
}

/* A database written with another schema version is refused, with a message that says so. */
static void test_schema_version_refused(void **st)
{
    s_fixture_t *fx = *st;
    kb_store_close(&fx->s);

    assert_int_equal(s_exec_behind(&fx->d, "UPDATE meta SET v = 2 WHERE k = 'schema_version';"), 1);

    char err[512] = "";
    fx->s = (kb_store_t *)&fx->d;
    assert_int_equal(kb_store_open(fx->d.data, false, &fx->s, err, sizeof err), -1);
    assert_null(fx->s);
    assert_non_null(strstr(err, "schema version"));
    assert_non_null(strstr(err, "2"));

    /* Put back, it opens again with the data intact. */
    s_exec_behind(&fx->d, "UPDATE meta SET v = 1 WHERE k = 'schema_version';");
    fx->s = s_open(fx->d.data, false);
    s_assert_holds_fixture(fx->s);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_permissions),
    cmocka_unit_test(test_open_bad_directory),
    cmocka_unit_test(test_commit_reopen_load),
    S_FIXTURE_TEST(test_rollback),
    S_FIXTURE_TEST(test_frequency_only_update),
    S_FIXTURE_TEST(test_drop_table),
    S_FIXTURE_TEST(test_rows_of_missing_table_skipped),
    S_FIXTURE_TEST(test_malformed_rows_skipped),
    S_FIXTURE_TEST(test_schema_version_refused))
