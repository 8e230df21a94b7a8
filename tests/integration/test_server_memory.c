/* Integration: kb-server --max-memory. A server with a small budget is filled with new rows until it refuses
 * them; then every request that would create a row or a table is refused whole with RESOURCE_EXHAUSTED
 * (puts, lookups of unseen keys, pushes to unseen keys, feature puts, create_table), nothing of a refused
 * request is applied, while reads and updates of existing rows, lookups with no_create and new keys of an
 * eviction table at its cap keep working. Refusals are counted in stats (server-wide and per table, also as
 * kbctl prints them), and dropping a table gives its budget back. */
#include "kb_cluster.h"
#include "protocol.h"
#include "raw_client.h"
#include "server_fixture.h"
#include "test_proto.h"

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

#define LIMIT_BYTES (8u << 20)
#define DIM 4

static kb_client_options_t s_client_options = {.timeout_ms = 10000, .retries = 1};

/* Every test runs one server limited to 8 MiB. */
static void s_start(server_fixture_t *f)
{
    const char *args[] = {"--max-memory", "8M", NULL};
    server_fixture_start(f, args);
}

/* Keys "<prefix><first + i>" for i < n (static storage, valid until the next call with the same slot). */
static kb_key_t *s_keys(int slot, const char *prefix, size_t first, size_t n)
{
    static kb_key_t keys[2][1000];
    static char text[2][1000][32];
    assert_true(n <= 1000);
    for (size_t i = 0; i < n; i++) {
        int len = snprintf(text[slot][i], 32, "%s%zu", prefix, first + i);
        keys[slot][i] = (kb_key_t){.data = text[slot][i], .len = (size_t)len};
    }
    return keys[slot];
}

static float s_values[1000 * DIM];

static void s_create(server_fixture_t *f, const char *name, Carls__EvictionConfig *eviction)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = DIM;
    cfg.eviction = eviction;
    test_create_table(f->cluster, name, &cfg);
}

static Carls__Response *s_stats(server_fixture_t *f, const char *table)
{
    Carls__Response *r = NULL;
    assert_int_equal(kb_cluster_stats(f->cluster, 0, table, &r), 0);
    return r;
}

static uint64_t s_rows(server_fixture_t *f, const char *table)
{
    return test_table_stats(f->cluster, table).rows;
}

/* Asserts a call that returned rc with status and error was refused for memory. */
static void s_assert_refused_for_memory(int rc, Carls__StatusCode status, const char *error)
{
    if (rc != KB_CLIENT_ESTATUS || status != CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED)
        fail_msg("expected RESOURCE_EXHAUSTED, got rc %d: %s", rc, error);
    assert_non_null(strstr(error, "memory limit"));
}

/* Asserts the cluster's last call was refused for memory. */
static void s_assert_exhausted(server_fixture_t *f, int rc)
{
    s_assert_refused_for_memory(rc, kb_cluster_last_status(f->cluster), kb_cluster_last_error(f->cluster));
}

/* Puts new rows into "emb" in batches of 1000, then 100, 10 and 1, until even one row is refused. Returns
 * the number of rows put; checks that each refused batch left the table as it was. A refusal is believed
 * only after a checkpoint: the rows being committed are in the estimate until their commit ends. */
static size_t s_fill(server_fixture_t *f)
{
    size_t next = 0;
    for (size_t batch = 1000; batch >= 1; batch /= 10) {
        bool refused_after_checkpoint = false;
        while (!refused_after_checkpoint) {
            uint64_t before = s_rows(f, "emb");
            int rc = kb_cluster_put(f->cluster, "emb", s_keys(0, "row", next, batch), batch, DIM, s_values, 1);
            if (rc == 0) {
                next += batch;
                assert_true(next < 200000); /* 8 MiB cannot hold that many */
                continue;
            }
            s_assert_exhausted(f, rc);
            assert_true(s_rows(f, "emb") == before); /* all or nothing */
            assert_int_equal(kb_cluster_checkpoint(f->cluster, NULL), 0);
            rc = kb_cluster_put(f->cluster, "emb", s_keys(0, "row", next, batch), batch, DIM, s_values, 1);
            if (rc == 0)
                next += batch;
            else
                refused_after_checkpoint = true;
        }
    }
    return next;
}

/* A feature_put of one key through the low-level call. */
static int s_feature_put(server_fixture_t *f, const char *key)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__FeaturePut fp;
    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    ProtobufCBinaryData k = {.len = strlen(key), .data = (uint8_t *)key};
    uint8_t data[64] = {1, 2, 3};
    rec.data.len = sizeof data;
    rec.data.data = data;
    Carls__FeatureRecord *recs[1] = {&rec};
    req.table = "feat";
    test_feature_put_request(&req, &fp, &k, recs, 1);
    Carls__Response *resp = NULL;
    int rc = kb_client_call(f->client, &req, &resp);
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    return rc;
}

/* kbctl stats' output for the server. Caller frees. */
static char *s_kbctl_stats(server_fixture_t *f)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s/kbctl' --kb '%s' stats 2>&1", CARLS_BIN_DIR, f->srv.endpoint);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap);
    size_t got;
    while ((got = fread(out + len, 1, cap - 1 - len, p)) > 0)
        len += got;
    assert_int_equal(pclose(p), 0);
    return out;
}

static void test_refuse_new_rows_keep_existing(void **state)
{
    server_fixture_t *f = *state;
    s_start(f);
    for (size_t i = 0; i < 1000 * DIM; i++)
        s_values[i] = (float)(i % DIM) + 0.5f;
    s_create(f, "emb", NULL);
    Carls__EvictionConfig lru = CARLS__EVICTION_CONFIG__INIT;
    lru.kind = CARLS__EVICTION_KIND__EVICT_LRU;
    lru.max_rows = 200;
    s_create(f, "lru", &lru);
    assert_int_equal(kb_cluster_put(f->cluster, "lru", s_keys(0, "l", 0, 200), 200, DIM, s_values, 1), 0);
    Carls__TableConfig fcfg = CARLS__TABLE_CONFIG__INIT;
    fcfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    assert_int_equal(kb_cluster_create_table(f->cluster, "feat", &fcfg, false), 0);
    assert_int_equal(s_feature_put(f, "known"), 0);
    /* A table to drop later: 5000 rows of budget. */
    s_create(f, "spare", NULL);
    for (size_t i = 0; i < 5000; i += 1000)
        assert_int_equal(kb_cluster_put(f->cluster, "spare", s_keys(0, "s", i, 1000), 1000, DIM, s_values, 1), 0);

    size_t filled = s_fill(f);
    print_message("filled %zu rows of dim %d under --max-memory 8M\n", filled, DIM);
    assert_true(filled > 5000);

    /* Every kind of creation is refused now. */
    float one[DIM] = {9, 9, 9, 9}, out[DIM * 2];
    kb_key_t *fresh = s_keys(1, "fresh", 0, 2);
    s_assert_exhausted(f, kb_cluster_put(f->cluster, "emb", fresh, 1, DIM, one, 1));
    s_assert_exhausted(f, kb_cluster_lookup(f->cluster, "emb", fresh, 1, DIM, out, NULL));
    s_assert_exhausted(f, kb_cluster_push_gradients(f->cluster, "emb", fresh, 1, DIM, one));
    int rc = s_feature_put(f, "unknown");
    s_assert_refused_for_memory(rc, kb_client_last_status(f->client), kb_client_last_error(f->client));
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = DIM;
    s_assert_exhausted(f, kb_cluster_create_table(f->cluster, "another", &cfg, false));
    /* A request mixing an existing key with a new one is refused whole: the existing row is not changed. */
    kb_key_t mixed[2] = {s_keys(0, "row", 0, 1)[0], fresh[1]};
    float two[2 * DIM] = {7, 7, 7, 7, 7, 7, 7, 7};
    s_assert_exhausted(f, kb_cluster_put(f->cluster, "emb", mixed, 2, DIM, two, 5));
    kb_row_meta_t meta[2];
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", mixed, 1, DIM, out, meta), 0);
    assert_true(out[0] == 0.5f && meta[0].version == 1);

    /* What exists keeps working: lookups, puts and pushes of existing rows, lookups without creating. */
    kb_key_t *old = s_keys(0, "row", 0, 1000);
    assert_int_equal(kb_cluster_put(f->cluster, "emb", old, 1000, DIM, s_values, 2), 0);
    assert_int_equal(kb_cluster_push_gradients(f->cluster, "emb", old, 1000, DIM, s_values), 0);
    float *vals = calloc(1000 * DIM, sizeof *vals);
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", old, 1000, DIM, vals, NULL), 0);
    free(vals);
    assert_int_equal(kb_cluster_lookup_ex(f->cluster, "emb", fresh, 2, DIM, true, out, meta), 0);
    assert_true(meta[0].frequency == 0 && meta[1].frequency == 0); /* answered, not created */
    assert_int_equal(s_feature_put(f, "known"), 0);
    assert_int_equal(kb_cluster_create_table(f->cluster, "emb", &cfg, true), 0); /* exists: nothing to create */
    /* An eviction table at its cap takes new keys: each replaces an evicted row. */
    assert_int_equal(kb_cluster_put(f->cluster, "lru", s_keys(0, "l", 1000, 100), 100, DIM, s_values, 1), 0);
    assert_true(s_rows(f, "lru") == 200);

    /* Stats: the refusals, server-wide and per table, and an estimate within the limit. */
    Carls__Response *r = s_stats(f, NULL);
    Carls__StatsResult *st = r->stats;
    assert_true(st->memory_limit == LIMIT_BYTES);
    print_message("estimate %llu bytes after the updates\n", (unsigned long long)st->memory_bytes);
    /* Updates of existing rows may go over the limit (pending buffers, rows being committed), not far. */
    assert_true(st->memory_bytes <= LIMIT_BYTES + (1u << 20));
    assert_true(st->memory_bytes > LIMIT_BYTES / 2);
    assert_true(st->rss_bytes > 0);
    uint64_t emb_refusals = 0, feat_refusals = 0, table_sum = 0;
    for (size_t i = 0; i < st->n_tables; i++) {
        if (strcmp(st->tables[i]->name, "emb") == 0)
            emb_refusals = st->tables[i]->memory_refusals;
        if (strcmp(st->tables[i]->name, "feat") == 0)
            feat_refusals = st->tables[i]->memory_refusals;
        table_sum += st->tables[i]->bytes;
    }
    assert_true(table_sum <= st->memory_bytes);
    /* emb: at least 8 refusals while filling (two per batch size), then put, lookup, push and the mixed put. */
    assert_true(emb_refusals >= 12);
    assert_true(feat_refusals == 1);
    assert_true(st->memory_refusals == emb_refusals + 2); /* + feature put, create_table */
    assert_true(st->memory_refused_rows >= 2 * (1000 + 100 + 10 + 1) + 4);
    print_message("estimate %llu bytes, rss %llu bytes, %llu refusals\n", (unsigned long long)st->memory_bytes,
                  (unsigned long long)st->rss_bytes, (unsigned long long)st->memory_refusals);
    carls__response__free_unpacked(r, NULL);
    char *text = s_kbctl_stats(f), line[64];
    snprintf(line, sizeof line, "memory_refusals: %llu\n", (unsigned long long)(emb_refusals + 2));
    assert_non_null(strstr(text, line)); /* server */
    snprintf(line, sizeof line, "memory_refusals: %llu\n", (unsigned long long)emb_refusals);
    assert_non_null(strstr(text, line)); /* table emb */
    assert_non_null(strstr(text, "memory_limit: 8388608\n"));
    free(text);

    /* Dropping a table gives its budget back: new rows and tables are accepted again. */
    assert_int_equal(kb_cluster_drop_table(f->cluster, "spare", false), 0);
    assert_int_equal(kb_cluster_put(f->cluster, "emb", fresh, 2, DIM, two, 1), 0);
    assert_int_equal(kb_cluster_create_table(f->cluster, "another", &cfg, false), 0);
}

/* A write refused for memory is forgotten by the exactly-once record, so its retry (same client id and
 * sequence) is applied once there is room, and a retry after that is a duplicate. */
static void test_refused_write_is_not_remembered(void **state)
{
    server_fixture_t *f = *state;
    s_start(f);
    s_create(f, "emb", NULL);
    s_create(f, "spare", NULL);
    for (size_t i = 0; i < 5000; i += 1000)
        assert_int_equal(kb_cluster_put(f->cluster, "spare", s_keys(0, "s", i, 1000), 1000, DIM, s_values, 1), 0);
    s_fill(f);
    /* The same request (same client id and sequence) sent twice: refused, then applied after a drop. It
     * carries 100 new rows: the fill stopped at the first refused row, and the room left then (up to one
     * stripe's map growth, which depends on the key) can hold a few more rows but not a hundred. */
    enum { LATER = 100 };
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Put put = CARLS__PUT__INIT;
    ProtobufCBinaryData key[LATER];
    char names[LATER][16];
    float v[LATER * DIM];
    for (int i = 0; i < LATER; i++) {
        key[i].len = (size_t)snprintf(names[i], sizeof names[i], "later%d", i);
        key[i].data = (uint8_t *)names[i];
        for (int j = 0; j < DIM; j++)
            v[i * DIM + j] = (float)(i + j);
    }
    req.table = "emb";
    test_put_request(&req, &put, key, LATER, v, LATER * DIM);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_client_call(f->client, &req, &resp), KB_CLIENT_ESTATUS);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED);
    carls__response__free_unpacked(resp, NULL);
    assert_true(req.client_id != 0 && req.sequence != 0); /* filled in by the client */
    assert_int_equal(kb_cluster_drop_table(f->cluster, "spare", false), 0);
    /* The very same bytes again (a retry): applied now, and not as a duplicate. */
    raw_client_t raw;
    assert_int_equal(raw_open(&raw, f->srv.endpoint), 0);
    assert_false(raw_write_is_duplicate(&raw, &req, 10000));
    /* And once more: now it is a duplicate. */
    assert_true(raw_write_is_duplicate(&raw, &req, 10000));
    raw_close(&raw);
    float out[DIM];
    kb_key_t k = {.data = names[LATER - 1], .len = key[LATER - 1].len};
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", &k, 1, DIM, out, NULL), 0);
    assert_memory_equal(out, v + (LATER - 1) * DIM, sizeof out);
}

CARLS_TEST_MAIN(
    SERVER_FIXTURE_TEST(test_refuse_new_rows_keep_existing, &s_client_options),
    SERVER_FIXTURE_TEST(test_refused_write_is_not_remembered, &s_client_options))
