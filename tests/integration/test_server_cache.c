/* Integration: kb-server --cache-bytes (tables larger than memory, kb_cache.h). A real server keeps only
 * part of a table in memory and reads the rest back from storage on demand:
 *  - 400,000 rows of dimension 128 (200 MB of values) behind a 32 MiB cache: every lookup answers the
 *    value put, before and after a restart (which loads no rows), and the server's peak resident size
 *    (VmHWM) stays under 128 MB;
 *  - puts and lookups mixed at random over rows that keep leaving memory, with a 1 MiB cache and fast
 *    compaction: every answer is the newest value, a scan (resident rows merged with stored ones) returns
 *    every row once with its newest value, and a server restarted without --cache-bytes (every row
 *    loaded) holds the same;
 *  - Adam pushes (immediate updates) to rows that keep leaving memory give, bit for bit, the values and
 *    versions a server holding every row in memory gives for the same pushes (optimizer state and step
 *    counts survive the trip to storage), also after a restart;
 *  - feature records of rows that left memory are read back whole;
 *  - after SIGKILL, with the last epochs likely only in the journal, a restarted cached server answers every
 *    acknowledged write (the journal is replayed into SQLite before rows are read back);
 *  - sample of a cached table is refused with UNIMPLEMENTED; a table with a knn index stays in memory and
 *    answers. */
#include "kb_cluster.h"
#include "kb_memory.h"
#include "server_fixture.h"
#include "test_proto.h"
#include "test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

#define BATCH 2000

static kb_client_options_t s_client_options = {.timeout_ms = 60000, .retries = 1};

/* Keys "k<first + i>" for i < n (static storage, valid until the next call). */
static kb_key_t *s_keys(size_t first, size_t n)
{
    static kb_key_t keys[BATCH];
    static char text[BATCH][16];
    assert_true(n <= BATCH);
    for (size_t i = 0; i < n; i++) {
        int len = snprintf(text[i], sizeof text[i], "k%zu", first + i);
        keys[i] = (kb_key_t){.data = text[i], .len = (size_t)len};
    }
    return keys;
}

/* Row i's value in generation gen: exact in float (i < 2^24), different for every row, column and gen. */
static float s_value(size_t i, uint32_t j, uint32_t gen)
{
    return j == 0 ? (float)i : (float)((i * 7 + j * 13 + gen * 101) % 4096) / 64.0f;
}

static void s_fill(float *values, size_t first, size_t n, uint32_t dim, const uint32_t *gens)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < dim; j++)
            values[i * dim + j] = s_value(first + i, j, gens ? gens[first + i] : 0);
}

static void s_create(kb_cluster_t *c, const char *name, uint32_t dim, bool knn)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__KnnConfig kc = CARLS__KNN_CONFIG__INIT;
    cfg.dim = dim;
    kc.spec = "Flat";
    if (knn)
        cfg.knn = &kc;
    test_create_table(c, name, &cfg);
}

/* Looks up rows [first, first + n) (no_create) and asserts each holds its generation's value. */
static void s_check(kb_cluster_t *c, const char *table, size_t first, size_t n, uint32_t dim, const uint32_t *gens,
                    float *got, float *want)
{
    kb_key_t *keys = s_keys(first, n);
    if (kb_cluster_lookup_ex(c, table, keys, n, dim, true, got, NULL) != 0)
        fail_msg("lookup of rows %zu..%zu: %s", first, first + n - 1, kb_cluster_last_error(c));
    s_fill(want, first, n, dim, gens);
    for (size_t i = 0; i < n * dim; i++)
        if (got[i] != want[i])
            fail_msg("row k%zu column %zu: %g, expected %g", first + i / dim, i % dim, (double)got[i],
                     (double)want[i]);
}

/* The cache's figures a stopped server logged last (kb_bank_close): rows read back from storage and rows
 * that left memory. Fails the test when the log has none. */
static void s_logged_cache(server_fixture_t *f, unsigned long long *read_back, unsigned long long *evicted)
{
    size_t len = 0;
    char *log = (char *)test_read_file(f->srv.log_file, 1, &len);
    assert_non_null(log);
    log[len] = '\0';
    const char *line = NULL;
    for (const char *p = log; (p = strstr(p, "cache of ")) != NULL; p++)
        line = p;
    unsigned long long budget = 0, looked = 0;
    if (!line || sscanf(line, "cache of %llu MiB: %llu rows looked for in storage, %llu read back, %llu left memory",
                        &budget, &looked, read_back, evicted) != 4)
        fail_msg("no cache figures in %s", f->srv.log_file);
    free(log);
}

/* The server's cache figures from stats: budget, rows read back, rows that left memory. */
static void s_stats_cache(kb_cluster_t *c, uint64_t *budget, uint64_t *loads, uint64_t *evictions)
{
    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_stats(c, 0, NULL, &resp), 0);
    *budget = resp->stats->cache_bytes;
    *loads = resp->stats->cache_loads;
    *evictions = resp->stats->cache_evictions;
    assert_true(resp->stats->cache_loads <= resp->stats->cache_reads);
    carls__response__free_unpacked(resp, NULL);
}

static uint64_t s_hwm_kb(server_fixture_t *f) { return kb_memory_proc_status_kb(f->srv.pid, "VmHWM"); }

/* The done criterion of issue 20's tables larger than memory. */
#define BIG_ROWS 400000u
#define BIG_DIM 128u
#define BIG_HWM_LIMIT_KB (128u * 1000u) /* 128 MB */

static void test_big_table_in_small_cache(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--cache-bytes", "32M", NULL};
    server_fixture_start(f, args);
    s_create(f->cluster, "emb", BIG_DIM, false);
    float *values = malloc((size_t)BATCH * BIG_DIM * sizeof *values);
    float *want = malloc((size_t)BATCH * BIG_DIM * sizeof *want);
    assert_non_null(values);
    assert_non_null(want);
    for (size_t first = 0; first < BIG_ROWS; first += BATCH) {
        s_fill(values, first, BATCH, BIG_DIM, NULL);
        if (kb_cluster_put(f->cluster, "emb", s_keys(first, BATCH), BATCH, BIG_DIM, values, 1) != 0)
            fail_msg("put of rows %zu..: %s", first, kb_cluster_last_error(f->cluster));
    }
    assert_int_equal(test_table_stats(f->cluster, "emb").rows, BIG_ROWS);
    /* Every row, in order (most of them only in storage by now), then a stride across the table. */
    for (size_t first = 0; first < BIG_ROWS; first += BATCH)
        s_check(f->cluster, "emb", first, BATCH, BIG_DIM, NULL, values, want);
    uint64_t hwm_loaded = s_hwm_kb(f);
    uint64_t budget = 0, loads = 0, evictions = 0;
    s_stats_cache(f->cluster, &budget, &loads, &evictions);
    assert_int_equal(budget, 32u << 20);
    assert_true(loads > 0 && evictions > 0);

    /* A restart loads no rows: the same answers come from storage. */
    assert_int_equal(server_fixture_restart(f, SIGTERM, args), 0);
    unsigned long long read_back = 0, evicted = 0;
    s_logged_cache(f, &read_back, &evicted);
    assert_true(read_back > 0 && evicted > 0);
    assert_int_equal(test_table_stats(f->cluster, "emb").rows, BIG_ROWS);
    for (size_t first = BIG_ROWS; first > 0; first -= BATCH)
        s_check(f->cluster, "emb", first - BATCH, BATCH, BIG_DIM, NULL, values, want);
    /* A new key after the restart is a new row (not one of the stored ones). */
    float fresh[BIG_DIM];
    kb_key_t nk = {.data = "new-key", .len = 7};
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", &nk, 1, BIG_DIM, fresh, NULL), 0);
    assert_int_equal(test_table_stats(f->cluster, "emb").rows, BIG_ROWS + 1);
    uint64_t hwm_restarted = s_hwm_kb(f);
    print_message("--cache-bytes 32M, %u rows of dim %u: VmHWM %llu kB while loading and reading, %llu kB after a "
                  "restart and reading every row\n",
                  BIG_ROWS, BIG_DIM, (unsigned long long)hwm_loaded, (unsigned long long)hwm_restarted);
    assert_true(hwm_loaded > 0 && hwm_restarted > 0);
#ifndef TEST_SANITIZED /* AddressSanitizer's shadow memory and quarantine are resident too */
    assert_true(hwm_loaded < BIG_HWM_LIMIT_KB);
    assert_true(hwm_restarted < BIG_HWM_LIMIT_KB);
#endif
    free(values);
    free(want);
}

/* Scans table in pages of 700 rows and asserts it holds rows k0..k<rows - 1> once each, with gens' values,
 * in increasing row-id order. */
static void s_scan_check(kb_client_t *c, const char *table, size_t rows, uint32_t dim, const uint32_t *gens)
{
    bool *seen = calloc(rows, sizeof *seen);
    assert_non_null(seen);
    int64_t after = 0;
    size_t total = 0;
    for (bool done = false; !done;) {
        Carls__Request req = CARLS__REQUEST__INIT;
        Carls__Scan sc = CARLS__SCAN__INIT;
        sc.after_row_id = after;
        sc.limit = 700;
        req.table = (char *)table;
        req.op_case = CARLS__REQUEST__OP_SCAN;
        req.scan = &sc;
        Carls__Response *resp = NULL;
        if (kb_client_call(c, &req, &resp) != 0)
            fail_msg("scan after %lld: %s", (long long)after, kb_client_last_error(c));
        const Carls__ScanResult *r = resp->scan;
        assert_true(r->n_keys <= 700);
        assert_int_equal(r->n_values, r->n_keys * dim);
        for (size_t i = 0; i < r->n_keys; i++) {
            char text[16] = {0};
            assert_true(r->keys[i].len > 1 && r->keys[i].len < sizeof text);
            memcpy(text, r->keys[i].data, r->keys[i].len);
            size_t k = strtoul(text + 1, NULL, 10);
            assert_true(k < rows);
            if (seen[k])
                fail_msg("scan returned k%zu twice", k);
            seen[k] = true;
            for (uint32_t j = 0; j < dim; j++)
                if (r->values[i * dim + j] != s_value(k, j, gens[k]))
                    fail_msg("scan: row k%zu column %u: %g, expected %g", k, j, (double)r->values[i * dim + j],
                             (double)s_value(k, j, gens[k]));
            assert_true(r->row_ids[i] > after);
            after = r->row_ids[i];
            total++;
        }
        done = r->done;
        carls__response__free_unpacked(resp, NULL);
    }
    assert_int_equal(total, rows);
    free(seen);
}

#define MIX_ROWS 20000u
#define MIX_DIM 32u
#define MIX_ROUNDS 300

/* What a test of table "mix" knows: each row's generation, and a batch of values and of expected values. */
typedef struct {
    uint32_t *gens;
    float *values, *want;
} s_mix_t;

/* A server started with args holding table "mix": MIX_ROWS rows of generation 0. Free m with s_mix_free. */
static void s_mix_start(server_fixture_t *f, const char *const *args, s_mix_t *m)
{
    server_fixture_start(f, args);
    s_create(f->cluster, "mix", MIX_DIM, false);
    m->gens = calloc(MIX_ROWS, sizeof *m->gens);
    m->values = malloc((size_t)BATCH * MIX_DIM * sizeof *m->values);
    m->want = malloc((size_t)BATCH * MIX_DIM * sizeof *m->want);
    assert_non_null(m->gens);
    assert_non_null(m->values);
    assert_non_null(m->want);
    for (size_t first = 0; first < MIX_ROWS; first += BATCH) {
        s_fill(m->values, first, BATCH, MIX_DIM, m->gens);
        assert_int_equal(kb_cluster_put(f->cluster, "mix", s_keys(first, BATCH), BATCH, MIX_DIM, m->values, 1), 0);
    }
}

static void s_mix_free(s_mix_t *m)
{
    free(m->gens);
    free(m->values);
    free(m->want);
}

/* Moves rows [first, first + n) of "mix" to their next generation: their new values put with version. */
static void s_mix_bump(server_fixture_t *f, s_mix_t *m, size_t first, size_t n, uint64_t version)
{
    for (size_t i = first; i < first + n; i++)
        m->gens[i]++;
    s_fill(m->values, first, n, MIX_DIM, m->gens);
    assert_int_equal(kb_cluster_put(f->cluster, "mix", s_keys(first, n), n, MIX_DIM, m->values, version), 0);
}

/* Checks rows [first, first + n) of "mix" against their generations. */
static void s_mix_check(server_fixture_t *f, s_mix_t *m, size_t first, size_t n)
{
    s_check(f->cluster, "mix", first, n, MIX_DIM, m->gens, m->values, m->want);
}

/* Checks every row of "mix". */
static void s_mix_check_all(server_fixture_t *f, s_mix_t *m)
{
    for (size_t first = 0; first < MIX_ROWS; first += BATCH)
        s_mix_check(f, m, first, BATCH);
}

/* Random puts and lookups over rows that keep leaving memory. */
static void test_updates_of_cold_rows(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--cache-bytes", "1M", "--compact-delay-ms", "20", NULL};
    s_mix_t m;
    s_mix_start(f, args, &m);
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (int round = 0; round < MIX_ROUNDS; round++) {
        size_t first = (size_t)(test_xorshift64(&rng) % (MIX_ROWS / 100)) * 100;
        size_t n = 1 + (size_t)(test_xorshift64(&rng) % 100);
        if (test_xorshift64(&rng) % 2) {
            s_mix_bump(f, &m, first, n, 2);
        } else {
            s_mix_check(f, &m, first, n);
        }
    }
    s_mix_check_all(f, &m);
    /* Rows changed last are in memory (some not yet compacted), the rest only in storage: a scan merges them. */
    for (size_t first = 0; first < 300; first += 100)
        s_mix_bump(f, &m, first, 100, 3);
    s_scan_check(f->client, "mix", MIX_ROWS, MIX_DIM, m.gens);
    /* Storage holds the same: a server that loads every row answers it too. */
    assert_int_equal(server_fixture_restart(f, SIGTERM, NULL), 0);
    unsigned long long read_back = 0, evicted = 0;
    s_logged_cache(f, &read_back, &evicted);
    print_message("--cache-bytes 1M, %u rows of dim %u: %llu rows read back from storage, %llu left memory\n",
                  MIX_ROWS, MIX_DIM, read_back, evicted);
    assert_true(read_back > 0 && evicted > 0);
    assert_int_equal(test_table_stats(f->cluster, "mix").rows, MIX_ROWS);
    s_mix_check_all(f, &m);
    s_mix_free(&m);
}

/* The same pushes to a cached server and to one holding every row. */
#define PUSH_ROWS 8000u
#define PUSH_DIM 16u
#define PUSH_ROUNDS 300

/* Looks up rows [first, first + n) on both servers and asserts the same values and versions, bit for bit. */
static void s_compare(kb_cluster_t *cached, kb_cluster_t *resident, size_t first, size_t n)
{
    static float a[BATCH * PUSH_DIM], b[BATCH * PUSH_DIM];
    static kb_row_meta_t ma[BATCH], mb[BATCH];
    kb_key_t *keys = s_keys(first, n);
    assert_int_equal(kb_cluster_lookup_ex(cached, "adam", keys, n, PUSH_DIM, true, a, ma), 0);
    assert_int_equal(kb_cluster_lookup_ex(resident, "adam", keys, n, PUSH_DIM, true, b, mb), 0);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(a + i * PUSH_DIM, b + i * PUSH_DIM, PUSH_DIM * sizeof *a) != 0 || ma[i].version != mb[i].version)
            fail_msg("row k%zu differs: %g (version %llu) in the cached server, %g (version %llu) in the other",
                     first + i, (double)a[i * PUSH_DIM], (unsigned long long)ma[i].version, (double)b[i * PUSH_DIM],
                     (unsigned long long)mb[i].version);
    }
}

static void test_pushes_match_resident_server(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--cache-bytes", "1M", "--compact-delay-ms", "20", NULL};
    server_fixture_start(f, args);
    test_server_t other;
    test_server_init(&other);
    assert_int_equal(test_server_start(&other, NULL), 0);
    kb_cluster_t *c2 = kb_cluster_new(other.endpoint, &s_client_options);
    assert_non_null(c2);
    test_table_config_t t;
    test_embedding_table_config(&t, PUSH_DIM, CARLS__INIT_KIND__INIT_ZEROS, 0, CARLS__OPTIMIZER_KIND__OPT_ADAM, 0.0f,
                                CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE);
    test_create_table(f->cluster, "adam", &t.cfg);
    test_create_table(c2, "adam", &t.cfg);
    static float values[BATCH * PUSH_DIM];
    for (size_t first = 0; first < PUSH_ROWS; first += BATCH) {
        s_fill(values, first, BATCH, PUSH_DIM, NULL);
        assert_int_equal(kb_cluster_put(f->cluster, "adam", s_keys(first, BATCH), BATCH, PUSH_DIM, values, 1), 0);
        assert_int_equal(kb_cluster_put(c2, "adam", s_keys(first, BATCH), BATCH, PUSH_DIM, values, 1), 0);
    }
    uint64_t rng = 0x2545f4914f6cdd1dULL;
    for (int round = 0; round < PUSH_ROUNDS; round++) {
        size_t n = 1 + (size_t)(test_xorshift64(&rng) % 100);
        size_t first = (size_t)(test_xorshift64(&rng) % (PUSH_ROWS - n));
        for (size_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < PUSH_DIM; j++)
                values[i * PUSH_DIM + j] = (float)((int)((first + i) * 31 + j * 7 + (size_t)round) % 17 - 8) / 16.0f;
        assert_int_equal(kb_cluster_push_gradients(f->cluster, "adam", s_keys(first, n), n, PUSH_DIM, values), 0);
        assert_int_equal(kb_cluster_push_gradients(c2, "adam", s_keys(first, n), n, PUSH_DIM, values), 0);
        if (round % 3 == 0)
            s_compare(f->cluster, c2, first, n);
    }
    for (size_t first = 0; first < PUSH_ROWS; first += BATCH)
        s_compare(f->cluster, c2, first, BATCH);
    assert_int_equal(server_fixture_restart(f, SIGTERM, args), 0);
    unsigned long long read_back = 0, evicted = 0;
    s_logged_cache(f, &read_back, &evicted);
    assert_true(read_back > 0 && evicted > 0);
    for (size_t first = 0; first < PUSH_ROWS; first += BATCH)
        s_compare(f->cluster, c2, first, BATCH);
    kb_cluster_destroy(&c2);
    assert_int_equal(test_server_cleanup(&other), 0);
}

/* Feature tables: records of rows that left memory. */
#define FEAT_ROWS 4000u
#define FEAT_BATCH 200u
#define FEAT_BYTES 400u

static uint8_t s_feature_byte(size_t key, size_t b) { return (uint8_t)(key * 131 + b * 7); }

/* Puts (put) or gets and checks the records of keys [first, first + FEAT_BATCH) of table "feat". */
static void s_features(kb_client_t *c, size_t first, bool put)
{
    static uint8_t data[FEAT_BATCH][FEAT_BYTES];
    Carls__FeatureRecord recs[FEAT_BATCH], *rec_ptrs[FEAT_BATCH];
    ProtobufCBinaryData keys[FEAT_BATCH];
    kb_key_t *k = s_keys(first, FEAT_BATCH);
    for (size_t i = 0; i < FEAT_BATCH; i++) {
        keys[i] = (ProtobufCBinaryData){.len = k[i].len, .data = (uint8_t *)k[i].data};
        for (size_t b = 0; b < FEAT_BYTES; b++)
            data[i][b] = s_feature_byte(first + i, b);
        recs[i] = (Carls__FeatureRecord)CARLS__FEATURE_RECORD__INIT;
        recs[i].data = (ProtobufCBinaryData){.len = FEAT_BYTES, .data = data[i]};
        rec_ptrs[i] = &recs[i];
    }
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__FeaturePut fp;
    Carls__FeatureGet fg;
    req.table = "feat";
    if (put)
        test_feature_put_request(&req, &fp, keys, rec_ptrs, FEAT_BATCH);
    else
        test_feature_get_request(&req, &fg, keys, FEAT_BATCH);
    Carls__Response *resp = NULL;
    if (kb_client_call(c, &req, &resp) != 0)
        fail_msg("feature %s of keys %zu..: %s", put ? "put" : "get", first, kb_client_last_error(c));
    if (!put) {
        assert_int_equal(resp->features->n_records, FEAT_BATCH);
        for (size_t i = 0; i < FEAT_BATCH; i++) {
            const Carls__FeatureRecord *r = resp->features->records[i];
            if (!r || r->data.len != FEAT_BYTES || memcmp(r->data.data, data[i], FEAT_BYTES) != 0)
                fail_msg("record of k%zu differs", first + i);
        }
    }
    carls__response__free_unpacked(resp, NULL);
}

static void test_feature_rows_leave_memory(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--cache-bytes", "1M", "--compact-delay-ms", "20", NULL};
    server_fixture_start(f, args);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    test_create_table(f->cluster, "feat", &cfg);
    for (size_t first = 0; first < FEAT_ROWS; first += FEAT_BATCH)
        s_features(f->client, first, true);
    for (size_t first = 0; first < FEAT_ROWS; first += FEAT_BATCH)
        s_features(f->client, first, false);
    assert_int_equal(server_fixture_restart(f, SIGTERM, args), 0);
    unsigned long long read_back = 0, evicted = 0;
    s_logged_cache(f, &read_back, &evicted);
    assert_true(read_back > 0 && evicted > 0);
    for (size_t first = 0; first < FEAT_ROWS; first += FEAT_BATCH)
        s_features(f->client, first, false);
}

static void test_kill_then_read_back(void **state)
{
    server_fixture_t *f = *state;
    /* Compaction waits up to 2 s (or a queue of 256 KiB), so the last writes are likely still only in the
     * journal when the server is killed. */
    const char *args[] = {"--cache-bytes", "1M", "--compact-delay-ms", "2000", NULL};
    s_mix_t m;
    s_mix_start(f, args, &m);
    for (size_t first = 0; first < MIX_ROWS; first += 2 * BATCH)
        s_mix_bump(f, &m, first, BATCH, 2);
    assert_int_equal(server_fixture_restart(f, SIGKILL, args), 128 + SIGKILL);
    assert_int_equal(test_table_stats(f->cluster, "mix").rows, MIX_ROWS);
    s_mix_check_all(f, &m);
    s_mix_free(&m);
}

/* Asserts the client's last call failed with UNIMPLEMENTED naming --cache-bytes. */
static void s_assert_refused(kb_client_t *c, int rc)
{
    if (rc == 0 || kb_client_last_status(c) != CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED)
        fail_msg("expected UNIMPLEMENTED, got rc %d: %s", rc, kb_client_last_error(c));
    assert_non_null(strstr(kb_client_last_error(c), "--cache-bytes"));
}

static void test_sample_refused_knn_resident(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--cache-bytes", "1M", NULL};
    server_fixture_start(f, args);
    s_create(f->cluster, "emb", 4, false);
    s_create(f->cluster, "near", 4, true);
    float values[10 * 4];
    s_fill(values, 0, 10, 4, NULL);
    assert_int_equal(kb_cluster_put(f->cluster, "emb", s_keys(0, 10), 10, 4, values, 1), 0);
    assert_int_equal(kb_cluster_put(f->cluster, "near", s_keys(0, 10), 10, 4, values, 1), 0);

    Carls__Request sreq = CARLS__REQUEST__INIT;
    Carls__Sample sm = CARLS__SAMPLE__INIT;
    sm.n = 3;
    sreq.table = "emb";
    sreq.op_case = CARLS__REQUEST__OP_SAMPLE;
    sreq.sample = &sm;
    Carls__Response *resp = NULL;
    s_assert_refused(f->client, kb_client_call(f->client, &sreq, &resp));
    carls__response__free_unpacked(resp, NULL);

    /* The knn table stays resident: its rows are its neighbours. */
    Carls__Response *r = test_knn(f->client, "near", values, 4, NULL, 0, 3, false);
    assert_int_equal(r->knn->n_keys, 3);
    for (size_t i = 0; i < 3; i++)
        assert_true(r->knn->keys[i].len >= 2 && ((const char *)r->knn->keys[i].data)[0] == 'k');
    carls__response__free_unpacked(r, NULL);
    uint32_t gens[10] = {0};
    s_scan_check(f->client, "near", 10, 4, gens);
}

CARLS_TEST_MAIN(
    SERVER_FIXTURE_TEST(test_sample_refused_knn_resident, &s_client_options),
    SERVER_FIXTURE_TEST(test_updates_of_cold_rows, &s_client_options),
    SERVER_FIXTURE_TEST(test_pushes_match_resident_server, &s_client_options),
    SERVER_FIXTURE_TEST(test_feature_rows_leave_memory, &s_client_options),
    SERVER_FIXTURE_TEST(test_kill_then_read_back, &s_client_options),
    SERVER_FIXTURE_TEST(test_big_table_in_small_cache, &s_client_options))
