/* Integration: export/import carries everything needed to continue training (docs/STATE.md "Export and
 * import").
 *
 * An AdaGrad table with lazy updates is trained on one server until its rows hold accumulators, optimizer
 * steps, use counts and pending gradients; `kbctl export`'s function writes it to a file, and the file is
 * imported into a bank of two shards. The same further pushes then go to both banks, and every row must be
 * the same in both, bit for bit: values (looked up, which applies what is pending), optimizer state and
 * steps, versions, use counts, pending gradients. Bit for bit, not within a tolerance: the same state and the
 * same gradients in the same order go through the same code, so any difference is state the import lost.
 *
 * Also: import_rows refuses rows that do not fit the table (optimizer floats of another optimizer, NaN,
 * more pending gradients than max_pending) naming the key, and a replayed import_rows is a duplicate. */
#include "kb_client.h"
#include "kb_cluster.h"
#include "kb_export.h"
#include "protocol.h"
#include "raw_client.h"
#include "server_harness.h"
#include "test_proto.h"
#include "test_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

enum { DIM = 8, KEYS = 120, MAX_PENDING = 4 };

typedef struct {
    test_server_t one, shard[2];
    kb_cluster_t *a, *b; /* the single server; the two shards */
    char dir[256];
} s_fixture_t;

static int s_setup(void **state)
{
    s_fixture_t *f = calloc(1, sizeof *f);
    assert_non_null(f);
    test_server_init(&f->one);
    test_server_init(&f->shard[0]);
    test_server_init(&f->shard[1]);
    const char *s0[] = {"--shard", "0/2", NULL}, *s1[] = {"--shard", "1/2", NULL};
    if (test_server_start(&f->one, NULL) != 0 || test_server_start(&f->shard[0], s0) != 0 ||
        test_server_start(&f->shard[1], s1) != 0)
        return -1;
    kb_client_options_t opts = {.timeout_ms = 10000, .retries = 2};
    f->a = kb_cluster_new(f->one.endpoint, &opts);
    char both[600];
    snprintf(both, sizeof both, "%s,%s", f->shard[0].endpoint, f->shard[1].endpoint);
    f->b = kb_cluster_new(both, &opts);
    assert_int_equal(test_tmpdir(f->dir, sizeof f->dir, "export-state"), 0);
    *state = f;
    return f->a && f->b ? 0 : -1;
}

static int s_teardown(void **state)
{
    s_fixture_t *f = *state;
    kb_cluster_destroy(&f->a);
    kb_cluster_destroy(&f->b);
    int rc = test_server_cleanup(&f->one) | test_server_cleanup(&f->shard[0]) | test_server_cleanup(&f->shard[1]);
    test_rmrf(f->dir);
    free(f);
    return rc == 0 ? 0 : -1;
}

static void s_key(char *buf, size_t n, int i) { snprintf(buf, n, "key-%03d", i); }

/* Keys 0..n-1: names[i] holds "key-NNN" and keys[i] points at it. */
static void s_keys(char (*names)[16], kb_key_t *keys, int n)
{
    for (int i = 0; i < n; i++) {
        s_key(names[i], sizeof names[i], i);
        keys[i] = (kb_key_t){names[i], strlen(names[i])};
    }
}

/* Pushes one gradient to each of the keys i with (i * 7 + round) % 3 != 0 -- so keys gather different numbers
 * of gradients, some reaching max_pending (applied) and some left pending -- with gradients drawn from rng. */
static void s_push_round(kb_cluster_t *c, int round, uint64_t *rng)
{
    static char names[KEYS][16];
    kb_key_t keys[KEYS];
    float grads[KEYS * DIM];
    size_t n = 0;
    for (int i = 0; i < KEYS; i++) {
        if ((i * 7 + round) % 3 == 0)
            continue;
        s_key(names[n], sizeof names[n], i);
        keys[n] = (kb_key_t){names[n], strlen(names[n])};
        for (int j = 0; j < DIM; j++)
            grads[n * DIM + j] = test_uniform_pm1(rng) * (float)(1 + i % 5);
        n++;
    }
    if (kb_cluster_push_gradients(c, "emb", keys, n, DIM, grads) != 0)
        fail_msg("push: %s", kb_cluster_last_error(c));
}

/* Every row of the table over all of c's shards, by key (keys are "key-NNN"): scan pages with their state. */
typedef struct {
    bool seen;
    float value[DIM], opt[DIM];
    uint64_t version, frequency, opt_steps;
    uint32_t pending_count;
    float pending[MAX_PENDING * DIM];
} s_row_t;

static void s_scan_all(kb_cluster_t *c, s_row_t *rows)
{
    memset(rows, 0, KEYS * sizeof *rows);
    for (uint32_t s = 0; s < kb_cluster_shards(c); s++) {
        Carls__Response *resp = NULL;
        assert_int_equal(kb_cluster_scan(c, s, "emb", 0, 1000, &resp), 0);
        const Carls__ScanResult *r = resp->scan;
        assert_true(r->done);
        assert_int_equal(r->n_updated_at_ms, r->n_keys); /* the server sends every row's state */
        assert_int_equal(r->opt_floats, DIM);           /* AdaGrad: one accumulator per dimension */
        size_t at = 0;
        for (size_t i = 0; i < r->n_keys; i++) {
            /* "key-NNN" (key bytes are not NUL-terminated) */
            const uint8_t *d = r->keys[i].data;
            assert_int_equal(r->keys[i].len, 7);
            int k = (d[4] - '0') * 100 + (d[5] - '0') * 10 + (d[6] - '0');
            assert_true(k >= 0 && k < KEYS && !rows[k].seen);
            s_row_t *row = &rows[k];
            row->seen = true;
            memcpy(row->value, r->values + i * DIM, sizeof row->value);
            memcpy(row->opt, r->opt_state + i * DIM, sizeof row->opt);
            row->version = r->versions[i];
            row->frequency = r->frequencies[i];
            row->opt_steps = r->opt_steps[i];
            row->pending_count = r->pending_counts[i];
            assert_true(row->pending_count <= MAX_PENDING);
            if (row->pending_count)
                memcpy(row->pending, r->pending + at, row->pending_count * DIM * sizeof(float));
            at += row->pending_count * DIM;
        }
        carls__response__free_unpacked(resp, NULL);
    }
}

static void s_assert_same_rows(kb_cluster_t *a, kb_cluster_t *b, bool expect_pending)
{
    static s_row_t ra[KEYS], rb[KEYS];
    s_scan_all(a, ra);
    s_scan_all(b, rb);
    int pending_rows = 0;
    for (int k = 0; k < KEYS; k++) {
        assert_true(ra[k].seen && rb[k].seen);
        if (memcmp(ra[k].value, rb[k].value, sizeof ra[k].value) != 0 || memcmp(ra[k].opt, rb[k].opt, sizeof ra[k].opt) ||
            ra[k].version != rb[k].version || ra[k].frequency != rb[k].frequency ||
            ra[k].opt_steps != rb[k].opt_steps || ra[k].pending_count != rb[k].pending_count ||
            memcmp(ra[k].pending, rb[k].pending, ra[k].pending_count * DIM * sizeof(float)) != 0)
            fail_msg("key-%03d differs: value[0] %.9g / %.9g, accumulator[0] %.9g / %.9g, version %llu / %llu, "
                     "frequency %llu / %llu, steps %llu / %llu, pending %u / %u",
                     k, ra[k].value[0], rb[k].value[0], ra[k].opt[0], rb[k].opt[0],
                     (unsigned long long)ra[k].version, (unsigned long long)rb[k].version,
                     (unsigned long long)ra[k].frequency, (unsigned long long)rb[k].frequency,
                     (unsigned long long)ra[k].opt_steps, (unsigned long long)rb[k].opt_steps, ra[k].pending_count,
                     rb[k].pending_count);
        pending_rows += ra[k].pending_count > 0;
    }
    if (expect_pending)
        assert_true(pending_rows > KEYS / 4);
}

/* Exports table from the single server to dir/<table>.kbx (page rows a scan, 0: the default) and imports that
 * file into the two shards (batch rows a message, 0: the default); each step must move want_rows rows. */
static void s_export_then_import(s_fixture_t *f, const char *table, uint32_t page, size_t batch, uint64_t want_rows)
{
    char path[320], err[512];
    snprintf(path, sizeof path, "%s/%s.kbx", f->dir, table);
    uint64_t rows = 0;
    if (kb_export_table(f->a, table, path, page, &rows, NULL, err, sizeof err) != 0)
        fail_msg("export: %s", err);
    assert_int_equal(rows, want_rows);
    if (kb_import_table(f->b, table, path, batch, &rows, NULL, err, sizeof err) != 0)
        fail_msg("import: %s", err);
    assert_int_equal(rows, want_rows);
}

/* Creates table `name` on c: an embedding table of dim, optimizer kind (learning rate 0.3), lazy updates with
 * max_pending and an hour's max_age (only max_pending and lookups apply gradients: no timing in the tests),
 * uniform initial values of seed 42. */
static void s_create(kb_cluster_t *c, const char *name, uint32_t dim, Carls__OptimizerKind kind, uint32_t max_pending)
{
    test_table_config_t t;
    test_embedding_table_config(&t, dim, CARLS__INIT_KIND__INIT_UNIFORM, 42, kind, 0.3f,
                                CARLS__UPDATE_POLICY__UPDATE_LAZY);
    t.lazy.max_pending = max_pending;
    t.lazy.max_age_ms = 3600000;
    if (kb_cluster_create_table(c, name, &t.cfg, false) != 0)
        fail_msg("create %s: %s", name, kb_cluster_last_error(c));
}

static void test_adagrad_export_import_into_two_shards_trains_the_same(void **state)
{
    s_fixture_t *f = *state;
    s_create(f->a, "emb", DIM, CARLS__OPTIMIZER_KIND__OPT_ADAGRAD, MAX_PENDING);

    /* Train on the single server: lookups (use counts), pushes (some applied at max_pending, some pending),
     * a few puts (versions). */
    static char names[KEYS][16];
    kb_key_t keys[KEYS];
    s_keys(names, keys, KEYS);
    static float values[KEYS * DIM];
    assert_int_equal(kb_cluster_lookup(f->a, "emb", keys, KEYS, DIM, values, NULL), 0);
    uint64_t rng = 7;
    for (int round = 0; round < 6; round++)
        s_push_round(f->a, round, &rng);
    float put[DIM] = {0.5f, -0.5f, 1, 0, 0, 0, 0, 2};
    assert_int_equal(kb_cluster_put(f->a, "emb", keys + 3, 1, DIM, put, 77), 0);
    assert_int_equal(kb_cluster_lookup(f->a, "emb", keys, KEYS / 2, DIM, values, NULL), 0);
    for (int round = 6; round < 9; round++)
        s_push_round(f->a, round, &rng);

    /* Export from the single server, import into the two shards: the same rows, state and all. */
    s_export_then_import(f, "emb", 50, 37, KEYS);
    s_assert_same_rows(f->a, f->b, true);

    /* The same further training on both: pushes, then lookups of every key (which apply what is pending). */
    uint64_t rng_a = 99, rng_b = 99;
    for (int round = 0; round < 7; round++) {
        s_push_round(f->a, round, &rng_a);
        s_push_round(f->b, round, &rng_b);
    }
    s_assert_same_rows(f->a, f->b, true);
    static float va[KEYS * DIM], vb[KEYS * DIM];
    kb_row_meta_t ma[KEYS], mb[KEYS];
    assert_int_equal(kb_cluster_lookup(f->a, "emb", keys, KEYS, DIM, va, ma), 0);
    assert_int_equal(kb_cluster_lookup(f->b, "emb", keys, KEYS, DIM, vb, mb), 0);
    for (int i = 0; i < KEYS; i++)
        if (memcmp(va + i * DIM, vb + i * DIM, DIM * sizeof(float)) != 0 || ma[i].version != mb[i].version ||
            ma[i].frequency != mb[i].frequency)
            fail_msg("%s after training: %.9g / %.9g, version %llu / %llu, frequency %llu / %llu", names[i],
                     va[i * DIM], vb[i * DIM], (unsigned long long)ma[i].version, (unsigned long long)mb[i].version,
                     (unsigned long long)ma[i].frequency, (unsigned long long)mb[i].frequency);
    s_assert_same_rows(f->a, f->b, false);
}

/* import_rows checks every row against the table and names the first bad one by key; a replay of the same
 * (client_id, sequence) is answered as a duplicate. */
static void test_import_rows_refusals_and_replay(void **state)
{
    s_fixture_t *f = *state;
    s_create(f->a, "small", 2, CARLS__OPTIMIZER_KIND__OPT_ADAGRAD, 2);
    float v[2] = {1, 2}, acc[2] = {0.5f, 0.25f}, pend[6] = {1, 1, 2, 2, 3, 3};
    kb_import_row_t row = {.key = {"good", 4}, .values = v, .opt_state = acc, .opt_steps = 3, .version = 5,
                           .frequency = 8, .updated_at_ms = 1000, .pending_count = 1, .pending = pend};
    kb_import_row_t rows[2] = {row, row};
    rows[1].key = (kb_key_t){"bad-key", 7};
    /* Another optimizer's state size (Adam's 2 * dim). */
    float adam[4] = {0, 0, 0, 0};
    rows[0].opt_state = rows[1].opt_state = adam;
    assert_int_equal(kb_cluster_import_rows(f->a, "small", rows, 2, 2, 4), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->a), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(kb_cluster_last_error(f->a), "optimizer floats"));
    rows[0].opt_state = rows[1].opt_state = acc;
    /* NaN in the second row's value; a negative accumulator; more pending than max_pending. */
    float nan_v[2] = {1, NAN}, neg[2] = {0.5f, -1};
    rows[1].values = nan_v;
    assert_int_equal(kb_cluster_import_rows(f->a, "small", rows, 2, 2, 2), KB_CLIENT_ESTATUS);
    assert_non_null(strstr(kb_cluster_last_error(f->a), "key 'bad-key'"));
    rows[1].values = v;
    rows[1].opt_state = neg;
    assert_int_equal(kb_cluster_import_rows(f->a, "small", rows, 2, 2, 2), KB_CLIENT_ESTATUS);
    assert_non_null(strstr(kb_cluster_last_error(f->a), "key 'bad-key'"));
    assert_non_null(strstr(kb_cluster_last_error(f->a), "accumulator"));
    rows[1].opt_state = acc;
    rows[1].pending_count = 3;
    assert_int_equal(kb_cluster_import_rows(f->a, "small", rows, 2, 2, 2), KB_CLIENT_ESTATUS);
    assert_non_null(strstr(kb_cluster_last_error(f->a), "key 'bad-key'"));
    assert_non_null(strstr(kb_cluster_last_error(f->a), "pending"));
    /* Nothing of the refused requests was written. */
    float got[2];
    kb_row_meta_t meta;
    kb_key_t good = {"good", 4};
    assert_int_equal(kb_cluster_lookup_ex(f->a, "small", &good, 1, 2, true, got, &meta), 0);
    assert_int_equal(meta.version, 0);

    /* Accepted: the state is the row's (the pending gradient is applied by this lookup: one AdaGrad step). */
    rows[1].pending_count = 0;
    assert_int_equal(kb_cluster_import_rows(f->a, "small", rows, 2, 2, 2), 0);
    assert_int_equal(kb_cluster_lookup_ex(f->a, "small", &good, 1, 2, true, got, &meta), 0);
    assert_int_equal(meta.version, 6);
    assert_int_equal(meta.frequency, 8);

    /* A replayed import_rows (same client id and sequence) is a duplicate and changes nothing. */
    raw_client_t raw;
    assert_int_equal(raw_open(&raw, f->one.endpoint), 0);
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__ImportRows im = CARLS__IMPORT_ROWS__INIT;
    ProtobufCBinaryData k = {3, (uint8_t *)"dup"};
    uint64_t zero64 = 0, one = 1;
    int64_t zero_ts = 0;
    uint32_t zero32 = 0;
    im.n_keys = 1;
    im.keys = &k;
    im.n_values = 2;
    im.values = v;
    im.n_versions = im.n_frequencies = im.n_opt_steps = im.n_updated_at_ms = im.n_pending_counts = 1;
    im.versions = &one;
    im.frequencies = &zero64;
    im.opt_steps = &zero64;
    im.updated_at_ms = &zero_ts;
    im.pending_counts = &zero32;
    test_request_envelope(&req, "small", 1, 4242, 1);
    req.op_case = CARLS__REQUEST__OP_IMPORT_ROWS;
    req.import_rows = &im;
    assert_false(raw_write_is_duplicate(&raw, &req, 10000));
    req.request_id = 2;
    assert_true(raw_write_is_duplicate(&raw, &req, 10000));
    raw_close(&raw);
}

/* Wide rows: a scan page keeps its floats under the protocol's cap (worst case per row of dim 1024, Adam and
 * max_pending 1024: about a million floats, so 3 rows a page), and an export pages through them all. */
static void test_wide_rows_export_in_short_pages(void **state)
{
    s_fixture_t *f = *state;
    enum { WIDE = 1024, N = 10 };
    s_create(f->a, "wide", WIDE, CARLS__OPTIMIZER_KIND__OPT_ADAM, 1024);
    static char names[N][16];
    kb_key_t keys[N];
    s_keys(names, keys, N);
    static float values[N * WIDE];
    assert_int_equal(kb_cluster_lookup(f->a, "wide", keys, N, WIDE, values, NULL), 0);
    for (int i = 0; i < N * WIDE; i++)
        values[i] = 0.001f * (float)(i % 97);
    assert_int_equal(kb_cluster_push_gradients(f->a, "wide", keys, 2, WIDE, values), 0);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_scan(f->a, 0, "wide", 0, 1000, &resp), 0);
    assert_true(resp->scan->n_keys >= 1 && resp->scan->n_keys < N);
    assert_false(resp->scan->done);
    carls__response__free_unpacked(resp, NULL);

    s_export_then_import(f, "wide", 0, 0, N);
    /* The two pending gradients came along: looking the keys up applies them on both banks alike. */
    static float va[N * WIDE], vb[N * WIDE];
    assert_int_equal(kb_cluster_lookup(f->a, "wide", keys, N, WIDE, va, NULL), 0);
    assert_int_equal(kb_cluster_lookup(f->b, "wide", keys, N, WIDE, vb, NULL), 0);
    assert_memory_equal(va, vb, sizeof va);
}

/* kb_cluster_scan_all over two shards: every row once, in pages of at most the limit, both shards visited;
 * a callback that says stop gets no further page; a table that is not there is the scan's error. */
typedef struct {
    int seen[KEYS];
    size_t pages, rows, largest_page;
    uint32_t shards_seen; /* bit s: shard s handed a page */
    size_t stop_after;    /* pages; 0: never stop */
} s_scan_count_t;

static bool s_count_page(void *ctx, uint32_t shard, const Carls__ScanResult *page)
{
    s_scan_count_t *sc = ctx;
    sc->pages++;
    sc->shards_seen |= 1u << shard;
    if (page->n_keys > sc->largest_page)
        sc->largest_page = page->n_keys;
    for (size_t i = 0; i < page->n_keys; i++) {
        const uint8_t *d = page->keys[i].data;
        int k = (d[4] - '0') * 100 + (d[5] - '0') * 10 + (d[6] - '0');
        assert_true(page->keys[i].len == 7 && k >= 0 && k < KEYS);
        sc->seen[k]++;
        sc->rows++;
    }
    return sc->stop_after == 0 || sc->pages < sc->stop_after;
}

static void test_scan_all_pages_every_shard(void **state)
{
    s_fixture_t *f = *state;
    s_create(f->b, "emb", DIM, CARLS__OPTIMIZER_KIND__OPT_SGD, 4);
    char names[KEYS][16];
    kb_key_t keys[KEYS];
    s_keys(names, keys, KEYS);
    float values[KEYS * DIM];
    for (size_t i = 0; i < KEYS * DIM; i++)
        values[i] = (float)i;
    assert_int_equal(kb_cluster_put(f->b, "emb", keys, KEYS, DIM, values, 1), 0);

    s_scan_count_t all = {0};
    assert_int_equal(kb_cluster_scan_all(f->b, "emb", 7, s_count_page, &all), 0);
    assert_int_equal(all.rows, KEYS);
    for (int k = 0; k < KEYS; k++)
        assert_int_equal(all.seen[k], 1);
    assert_int_equal(all.shards_seen, 3u);
    assert_true(all.largest_page <= 7 && all.pages >= KEYS / 7);

    s_scan_count_t first = {.stop_after = 1};
    assert_int_equal(kb_cluster_scan_all(f->b, "emb", 7, s_count_page, &first), 0);
    assert_int_equal(first.pages, 1);

    s_scan_count_t none = {0};
    assert_int_not_equal(kb_cluster_scan_all(f->b, "nosuch", 7, s_count_page, &none), 0);
    assert_non_null(strstr(kb_cluster_last_error(f->b), "nosuch"));
    assert_int_equal(none.pages, 0);
}

CARLS_TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_adagrad_export_import_into_two_shards_trains_the_same, s_setup,
                                    s_teardown),
    cmocka_unit_test_setup_teardown(test_import_rows_refusals_and_replay, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_wide_rows_export_in_short_pages, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_scan_all_pages_every_shard, s_setup, s_teardown))
