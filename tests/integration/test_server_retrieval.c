/* Integration: the retrieval side of a real kb-server. Nearest neighbours through the server equal a
 * brute-force reference and follow puts and updates; feature records round-trip and survive restarts;
 * frequency and Bloom admission keep rare keys out; LRU and oldest-first eviction keep what they should and
 * delete the rest from storage; scan pages cover every row once; --read-only and --shard refuse what they
 * must. */
#include "kb_cluster.h"
#include "protocol.h"
#include "server_fixture.h"
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

static uint64_t s_rng = 88172645463325252ULL; /* test_uniform_pm1's stream for the test data */

static void s_key_name(char *buf, size_t n, int i) { snprintf(buf, n, "item%04d", i); }

/* Flat kNN through the server equals brute force, for ip, l2 and cosine; it follows a moved vector. */
static void test_flat_knn_matches_brute_force_and_follows_updates(void **state)
{
    server_fixture_t *f = *state;
    enum { N = 300, DIM = 8, K = 5, NQ = 10 };
    static float data[N * DIM];
    for (int i = 0; i < N * DIM; i++)
        data[i] = test_uniform_pm1(&s_rng);
    const Carls__KnnMetric metrics[3] = {CARLS__KNN_METRIC__METRIC_IP, CARLS__KNN_METRIC__METRIC_L2,
                                         CARLS__KNN_METRIC__METRIC_COSINE};
    const char *names[3] = {"knn_ip", "knn_l2", "knn_cos"};
    char keybuf[N][16];
    kb_key_t keys[N];
    for (int i = 0; i < N; i++) {
        s_key_name(keybuf[i], sizeof keybuf[i], i);
        keys[i] = (kb_key_t){keybuf[i], strlen(keybuf[i])};
    }
    for (int m = 0; m < 3; m++) {
        Carls__KnnConfig kc;
        Carls__TableConfig cfg = test_knn_table_config(&kc, DIM, "Flat", metrics[m]);
        test_create_table(f->cluster, names[m], &cfg);
        assert_int_equal(kb_cluster_put(f->cluster, names[m], keys, N, DIM, data, 1), 0);

        float queries[NQ * DIM];
        for (int i = 0; i < NQ * DIM; i++)
            queries[i] = test_uniform_pm1(&s_rng);
        Carls__Response *resp = test_knn(f->client, names[m], queries, NQ * DIM, NULL, 0, K, false);
        assert_int_equal(resp->knn->n_keys, NQ * K);
        for (int q = 0; q < NQ; q++) {
            /* Reference: score every row. */
            double score[N];
            for (int i = 0; i < N; i++) {
                double dot = 0, d2 = 0, nx = 0, nq = 0;
                for (int j = 0; j < DIM; j++) {
                    double x = data[i * DIM + j], y = queries[q * DIM + j];
                    dot += x * y;
                    d2 += (x - y) * (x - y);
                    nx += x * x;
                    nq += y * y;
                }
                score[i] = m == 0 ? dot : m == 1 ? -d2 : dot / sqrt(nx * nq);
            }
            for (int r = 0; r < K; r++) {
                int best = -1;
                for (int i = 0; i < N; i++) {
                    bool taken = false;
                    for (int t = 0; t < r; t++) {
                        char name[16];
                        memcpy(name, resp->knn->keys[q * K + t].data, resp->knn->keys[q * K + t].len);
                        name[resp->knn->keys[q * K + t].len] = '\0';
                        taken |= strcmp(name, keybuf[i]) == 0;
                    }
                    if (!taken && (best < 0 || score[i] > score[best]))
                        best = i;
                }
                ProtobufCBinaryData got = resp->knn->keys[q * K + r];
                if (got.len != strlen(keybuf[best]) || memcmp(got.data, keybuf[best], got.len) != 0)
                    fail_msg("%s query %d rank %d: got %.*s, expected %s", names[m], q, r, (int)got.len,
                             (const char *)got.data, keybuf[best]);
                double expected = m == 1 ? -score[best] : score[best];
                assert_true(fabs(resp->knn->scores[q * K + r] - expected) < 1e-4);
            }
        }
        carls__response__free_unpacked(resp, NULL);
    }

    /* Move item0007 onto a far point: it is found there, and no longer near its old place. */
    float far[DIM], old[DIM];
    memcpy(old, data + 7 * DIM, sizeof old);
    for (int j = 0; j < DIM; j++)
        far[j] = 50.0f + (float)j;
    assert_int_equal(kb_cluster_put(f->cluster, "knn_l2", &keys[7], 1, DIM, far, 2), 0);
    Carls__Response *resp = test_knn(f->client, "knn_l2", far, DIM, NULL, 0, 1, false);
    assert_memory_equal(resp->knn->keys[0].data, "item0007", 8);
    carls__response__free_unpacked(resp, NULL);
    resp = test_knn(f->client, "knn_l2", old, DIM, NULL, 0, 1, false);
    assert_false(resp->knn->keys[0].len == 8 && memcmp(resp->knn->keys[0].data, "item0007", 8) == 0);
    carls__response__free_unpacked(resp, NULL);

    /* By key, excluding the key itself. */
    resp = test_knn(f->client, "knn_l2", NULL, 0, &keys[3], 1, 3, true);
    for (int r = 0; r < 3; r++)
        assert_false(resp->knn->keys[r].len == 8 && memcmp(resp->knn->keys[r].data, "item0003", 8) == 0);
    carls__response__free_unpacked(resp, NULL);
    resp = test_knn(f->client, "knn_l2", NULL, 0, &keys[3], 1, 1, false);
    assert_memory_equal(resp->knn->keys[0].data, "item0003", 8);
    assert_true(resp->knn->scores[0] < 1e-6f);
    carls__response__free_unpacked(resp, NULL);

    /* Many queries at once, split among the workers in slices of a query or a few (--knn-slice-us 1: these
     * searches take about a microsecond a query): each answer is its own query's, with the exclusion of its
     * own key. 37 leaves a short last slice while the table has no time per query yet. */
    const char *const slice_args[] = {"--knn-slice-us", "1", NULL};
    server_fixture_restart(f, SIGTERM, slice_args);
    for (int n = 37; n <= N; n += N - 37) {
        resp = test_knn(f->client, "knn_l2", NULL, 0, keys, (size_t)n, 1, false);
        assert_int_equal(resp->knn->n_keys, n);
        for (int q = 0; q < n; q++)
            if (resp->knn->keys[q].len != strlen(keybuf[q]) || memcmp(resp->knn->keys[q].data, keybuf[q], 8) != 0)
                fail_msg("%d queries: query %d (%s) found %.*s first", n, q, keybuf[q], (int)resp->knn->keys[q].len,
                         (const char *)resp->knn->keys[q].data);
        carls__response__free_unpacked(resp, NULL);
        resp = test_knn(f->client, "knn_l2", NULL, 0, keys, (size_t)n, 2, true);
        assert_int_equal(resp->knn->n_keys, 2 * n);
        for (int i = 0; i < 2 * n; i++)
            if (resp->knn->keys[i].len == 0 || memcmp(resp->knn->keys[i].data, keybuf[i / 2], 8) == 0)
                fail_msg("%d queries excluding themselves: answer %d of query %d is '%.*s'", n, i % 2, i / 2,
                         (int)resp->knn->keys[i].len, (const char *)resp->knn->keys[i].data);
        carls__response__free_unpacked(resp, NULL);
    }

    /* After a restart the index is rebuilt from the stored rows. */
    server_fixture_restart(f, SIGKILL, NULL);
    resp = test_knn(f->client, "knn_l2", far, DIM, NULL, 0, 1, false);
    assert_memory_equal(resp->knn->keys[0].data, "item0007", 8);
    carls__response__free_unpacked(resp, NULL);
}

static void test_feature_records_round_trip(void **state)
{
    server_fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    test_create_table(f->cluster, "graph", &cfg);

    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    ProtobufCBinaryData nbrs[2] = {{2, (uint8_t *)"n1"}, {2, (uint8_t *)"n2"}};
    float weights[2] = {0.75f, 0.25f};
    test_record_neighbors(&rec, nbrs, weights, 2);
    rec.label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
    rec.int_label = 7;
    rec.label_confidence = 0.9f;
    rec.data = (ProtobufCBinaryData){3, (uint8_t *)"\x00\x01\x02"};
    rec.version = 42;
    Carls__FeatureRecord *recs[1] = {&rec};
    ProtobufCBinaryData key = {4, (uint8_t *)"node"};
    Carls__FeaturePut fp;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = "graph";
    test_feature_put_request(&req, &fp, &key, recs, 1);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_client_call(f->client, &req, &resp), 0);
    carls__response__free_unpacked(resp, NULL);

    /* Mismatched neighbour and weight counts are refused. */
    rec.n_neighbor_weights = 1;
    assert_int_equal(kb_client_call(f->client, &req, &resp), KB_CLIENT_ESTATUS);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    carls__response__free_unpacked(resp, NULL);
    /* Embedding operations on a feature table are refused. */
    kb_key_t k = {"node", 4};
    float v;
    assert_int_equal(kb_cluster_lookup(f->cluster, "graph", &k, 1, 1, &v, NULL), KB_CLIENT_ESTATUS);

    server_fixture_restart(f, SIGKILL, NULL);
    ProtobufCBinaryData keys[2] = {{4, (uint8_t *)"node"}, {7, (uint8_t *)"missing"}};
    Carls__FeatureGet fg;
    Carls__Request get = CARLS__REQUEST__INIT;
    get.table = "graph";
    test_feature_get_request(&get, &fg, keys, 2);
    assert_int_equal(kb_client_call(f->client, &get, &resp), 0);
    assert_int_equal(resp->features->n_records, 2);
    Carls__FeatureRecord *got = resp->features->records[0];
    assert_true(got->found);
    assert_int_equal(got->n_neighbor_keys, 2);
    assert_memory_equal(got->neighbor_keys[1].data, "n2", 2);
    assert_true(got->neighbor_weights[0] == 0.75f && got->neighbor_weights[1] == 0.25f);
    assert_int_equal(got->label_case, CARLS__FEATURE_RECORD__LABEL_INT_LABEL);
    assert_int_equal(got->int_label, 7);
    assert_true(got->label_confidence == 0.9f);
    assert_int_equal(got->data.len, 3);
    assert_int_equal(got->version, 42);
    assert_true(got->updated_at_ms > 0);
    assert_false(resp->features->records[1]->found);
    carls__response__free_unpacked(resp, NULL);
}

static void test_admission_keeps_rare_keys_out(void **state)
{
    server_fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__AdmissionConfig adm = CARLS__ADMISSION_CONFIG__INIT;
    cfg.dim = 2;
    cfg.admission = &adm;
    adm.kind = CARLS__ADMISSION_KIND__ADMIT_FREQUENCY;
    adm.min_frequency = 3;
    test_create_table(f->cluster, "freq", &cfg);
    adm.kind = CARLS__ADMISSION_KIND__ADMIT_BLOOM;
    test_create_table(f->cluster, "bloom", &cfg);

    kb_key_t rare = {"rare", 4}, common = {"common", 6};
    float v[2];
    for (int i = 0; i < 3; i++)
        assert_int_equal(kb_cluster_lookup(f->cluster, "freq", &common, 1, 2, v, NULL), 0);
    assert_int_equal(kb_cluster_lookup(f->cluster, "freq", &rare, 1, 2, v, NULL), 0);
    Carls__TableStats ts = test_table_stats(f->cluster, "freq");
    assert_int_equal(ts.rows, 2);
    assert_int_equal(ts.not_persisted, 1);

    /* Bloom: no row until the third sighting; gradients for a key without a row are dropped and counted. */
    float g[2] = {1, 1};
    assert_int_equal(kb_cluster_push_gradients(f->cluster, "bloom", &rare, 1, 2, g), 0);
    assert_int_equal(kb_cluster_lookup(f->cluster, "bloom", &rare, 1, 2, v, NULL), 0);
    ts = test_table_stats(f->cluster, "bloom");
    assert_int_equal(ts.rows, 0);
    assert_int_equal(ts.not_admitted, 2);
    assert_int_equal(kb_cluster_lookup(f->cluster, "bloom", &rare, 1, 2, v, NULL), 0);
    ts = test_table_stats(f->cluster, "bloom");
    assert_int_equal(ts.rows, 1);

    /* Checkpoint, crash: the frequent key was persisted, the rare one was not. */
    assert_int_equal(kb_cluster_checkpoint(f->cluster, NULL), 0);
    server_fixture_restart(f, SIGKILL, NULL);
    ts = test_table_stats(f->cluster, "freq");
    assert_int_equal(ts.rows, 1);
    kb_row_meta_t meta;
    assert_int_equal(kb_cluster_lookup_ex(f->cluster, "freq", &common, 1, 2, true, v, &meta), 0);
    assert_int_equal(meta.frequency, 3);
    assert_int_equal(kb_cluster_lookup_ex(f->cluster, "freq", &rare, 1, 2, true, v, &meta), 0);
    assert_int_equal(meta.frequency, 0);
}

static void test_eviction_lru_and_oldest(void **state)
{
    server_fixture_t *f = *state;
    enum { CAP = 200, TOTAL = 1000 };
    const Carls__EvictionKind kinds[2] = {CARLS__EVICTION_KIND__EVICT_LRU, CARLS__EVICTION_KIND__EVICT_OLDEST};
    const char *names[2] = {"lru", "oldest"};
    for (int m = 0; m < 2; m++) {
        Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
        Carls__EvictionConfig ev = CARLS__EVICTION_CONFIG__INIT;
        cfg.dim = 1;
        cfg.eviction = &ev;
        ev.kind = kinds[m];
        ev.max_rows = CAP;
        test_create_table(f->cluster, names[m], &cfg);
        kb_key_t hot = {"hot", 3};
        float v = 5.0f;
        assert_int_equal(kb_cluster_put(f->cluster, names[m], &hot, 1, 1, &v, 1), 0);
        char name[16];
        for (int i = 0; i < TOTAL; i++) {
            s_key_name(name, sizeof name, i);
            kb_key_t k = {name, strlen(name)};
            assert_int_equal(kb_cluster_put(f->cluster, names[m], &k, 1, 1, &v, 1), 0);
            float got;
            assert_int_equal(kb_cluster_lookup_ex(f->cluster, names[m], &hot, 1, 1, true, &got, NULL), 0);
            if (m == 0 && i % 10 == 0) /* keep "hot" recently used (a lookup is a use) */
                assert_int_equal(kb_cluster_lookup(f->cluster, names[m], &hot, 1, 1, &got, NULL), 0);
        }
        Carls__TableStats ts = test_table_stats(f->cluster, names[m]);
        /* Each new row over the cap evicts one: the cap holds exactly once reached. */
        assert_int_equal(ts.rows, CAP);
        assert_int_equal(ts.rows + ts.evictions, TOTAL + 1);
        kb_row_meta_t meta;
        float got;
        assert_int_equal(kb_cluster_lookup_ex(f->cluster, names[m], &hot, 1, 1, true, &got, &meta), 0);
        if (m == 0)
            assert_int_equal(meta.version, 1); /* LRU kept the hot key */
        else
            assert_int_equal(meta.version, 0); /* oldest-first evicted it long ago: initial value */
        /* The newest key is always there. */
        s_key_name(name, sizeof name, TOTAL - 1);
        kb_key_t newest = {name, strlen(name)};
        assert_int_equal(kb_cluster_lookup_ex(f->cluster, names[m], &newest, 1, 1, true, &got, &meta), 0);
        assert_int_equal(meta.version, 1);
    }
    /* Evicted rows are deleted from storage too. */
    assert_int_equal(kb_cluster_checkpoint(f->cluster, NULL), 0);
    uint64_t rows_before = test_table_stats(f->cluster, "lru").rows;
    server_fixture_restart(f, SIGKILL, NULL);
    assert_int_equal(test_table_stats(f->cluster, "lru").rows, rows_before);
}

static void test_scan_pages_cover_every_row_once(void **state)
{
    server_fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 2;
    test_create_table(f->cluster, "scan", &cfg);
    enum { N = 537 };
    char name[16];
    for (int i = 0; i < N; i++) {
        s_key_name(name, sizeof name, i);
        kb_key_t k = {name, strlen(name)};
        float v[2] = {(float)i, -(float)i};
        assert_int_equal(kb_cluster_put(f->cluster, "scan", &k, 1, 2, v, 3), 0);
    }
    static bool seen[N];
    int64_t after = 0;
    int pages = 0, total = 0;
    for (;;) {
        Carls__Request req = CARLS__REQUEST__INIT;
        Carls__Scan sc = CARLS__SCAN__INIT;
        sc.after_row_id = after;
        sc.limit = 100;
        req.table = "scan";
        req.op_case = CARLS__REQUEST__OP_SCAN;
        req.scan = &sc;
        Carls__Response *resp;
        assert_int_equal(kb_client_call(f->client, &req, &resp), 0);
        Carls__ScanResult *r = resp->scan;
        assert_true(r->n_keys <= 100);
        for (size_t i = 0; i < r->n_keys; i++) {
            char kbuf[16] = {0};
            assert_true(r->keys[i].len < sizeof kbuf);
            memcpy(kbuf, r->keys[i].data, r->keys[i].len);
            int idx = atoi(kbuf + 4);
            assert_false(seen[idx]);
            seen[idx] = true;
            assert_true(r->values[2 * i] == (float)idx && r->values[2 * i + 1] == -(float)idx);
            assert_true(r->row_ids[i] > after);
            after = r->row_ids[i];
            total++;
        }
        pages++;
        bool done = r->done;
        carls__response__free_unpacked(resp, NULL);
        if (done)
            break;
        assert_true(pages < 100);
    }
    assert_int_equal(total, N);
    assert_int_equal(pages, (N + 99) / 100);
}

static void test_read_only_and_shard_refusals(void **state)
{
    server_fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 1;
    test_create_table(f->cluster, "t", &cfg);
    kb_key_t k = {"a", 1};
    float v = 1.0f;
    assert_int_equal(kb_cluster_put(f->cluster, "t", &k, 1, 1, &v, 1), 0);

    const char *ro[] = {"--read-only", NULL};
    server_fixture_restart(f, SIGTERM, ro);
    assert_int_equal(kb_cluster_put(f->cluster, "t", &k, 1, 1, &v, 2), KB_CLIENT_ESTATUS);
    assert_non_null(strstr(kb_cluster_last_error(f->cluster), "READ_ONLY"));
    assert_int_equal(kb_cluster_push_gradients(f->cluster, "t", &k, 1, 1, &v), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_create_table(f->cluster, "u", &cfg, false), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_drop_table(f->cluster, "t", false), KB_CLIENT_ESTATUS);
    float got;
    assert_int_equal(kb_cluster_lookup(f->cluster, "t", &k, 1, 1, &got, NULL), 0);
    assert_true(got == 1.0f);

    /* Shard 0 of 2 refuses keys of shard 1. */
    const char *sh[] = {"--shard", "0/2", NULL};
    server_fixture_restart(f, SIGTERM, sh);
    char name[16];
    int refused = 0, accepted = 0;
    for (int i = 0; i < 40; i++) {
        s_key_name(name, sizeof name, i);
        kb_key_t key = {name, strlen(name)};
        int rc = kb_cluster_put(f->cluster, "t", &key, 1, 1, &v, 1);
        if (carls_shard_of(name, strlen(name), 2) == 0) {
            assert_int_equal(rc, 0);
            accepted++;
        } else {
            assert_int_equal(rc, KB_CLIENT_ESTATUS);
            assert_non_null(strstr(kb_cluster_last_error(f->cluster), "shard"));
            refused++;
        }
    }
    assert_true(refused > 5 && accepted > 5);
}

static Carls__Response *s_sample(kb_client_t *c, const char *table, Carls__SampleStrategy strategy, uint32_t n,
                                 const char *positive, uint64_t seed, int expect_rc)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Sample sm = CARLS__SAMPLE__INIT;
    ProtobufCBinaryData pos = {positive ? strlen(positive) : 0, (uint8_t *)positive};
    sm.n = n;
    sm.strategy = strategy;
    sm.seed = seed;
    sm.positives = positive ? &pos : NULL;
    sm.n_positives = positive ? 1 : 0;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_SAMPLE;
    req.sample = &sm;
    Carls__Response *resp = NULL;
    int rc = kb_client_call(c, &req, &resp);
    if (rc != expect_rc)
        fail_msg("sample: rc %d, expected %d: %s", rc, expect_rc, kb_client_last_error(c));
    return resp;
}

/* Sampling through the server: stated probabilities are the strategy's formula, draws follow them, the
 * positive comes first with its probability, and a seed makes the draw repeatable. */
static void test_sampling_probabilities_and_frequencies(void **state)
{
    server_fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 1;
    test_create_table(f->cluster, "words", &cfg);
    Carls__Response *resp = s_sample(f->client, "words", CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM, 5, NULL, 1,
                                     KB_CLIENT_ESTATUS);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    carls__response__free_unpacked(resp, NULL);

    /* Word i is looked up i+1 times: frequency i+1. */
    enum { WORDS = 8, DRAWS = 20000 };
    char name[16];
    double mass = 0;
    for (int i = 0; i < WORDS; i++) {
        s_key_name(name, sizeof name, i);
        kb_key_t k = {name, strlen(name)};
        float v;
        for (int j = 0; j <= i; j++)
            assert_int_equal(kb_cluster_lookup(f->cluster, "words", &k, 1, 1, &v, NULL), 0);
        mass += pow(i + 1, 0.75);
    }
    const Carls__SampleStrategy strategies[2] = {CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM,
                                                 CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM};
    for (int m = 0; m < 2; m++) {
        resp = s_sample(f->client, "words", strategies[m], DRAWS, "item0003", 7, 0);
        Carls__SampleResult *r = resp->sample;
        assert_int_equal(r->n_keys, DRAWS + 1);
        assert_true(r->is_positive[0] && !r->is_positive[1]);
        assert_memory_equal(r->keys[0].data, "item0003", 8);
        assert_int_equal(r->rows, WORDS);
        double expect_pos = m == 0 ? 1.0 / WORDS : pow(4, 0.75) / mass;
        assert_true(fabs(r->probabilities[0] - expect_pos) < 1e-6);
        if (m == 1)
            assert_true(fabs(r->mass - mass) < 1e-6 * mass);
        int counts[WORDS] = {0};
        for (size_t j = 1; j < r->n_keys; j++) {
            char kbuf[16] = {0};
            memcpy(kbuf, r->keys[j].data, r->keys[j].len);
            int idx = atoi(kbuf + 4);
            assert_true(idx >= 0 && idx < WORDS);
            double p = m == 0 ? 1.0 / WORDS : pow(idx + 1, 0.75) / mass;
            assert_true(fabs(r->probabilities[j] - p) < 1e-6);
            counts[idx]++;
        }
        for (int i = 0; i < WORDS; i++) {
            double p = m == 0 ? 1.0 / WORDS : pow(i + 1, 0.75) / mass;
            double sd = sqrt(DRAWS * p * (1 - p));
            /* 5 standard deviations: a false failure about once in 2 million runs per bucket. */
            if (fabs(counts[i] - DRAWS * p) > 5 * sd)
                fail_msg("strategy %d word %d: %d draws, expected %.1f +- %.1f", m, i, counts[i], DRAWS * p, sd);
        }
        carls__response__free_unpacked(resp, NULL);
    }
    /* Same seed, same draws. */
    Carls__Response *a = s_sample(f->client, "words", CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM, 50, NULL, 99, 0);
    Carls__Response *b = s_sample(f->client, "words", CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM, 50, NULL, 99, 0);
    for (int j = 0; j < 50; j++) {
        assert_int_equal(a->sample->keys[j].len, b->sample->keys[j].len);
        assert_memory_equal(a->sample->keys[j].data, b->sample->keys[j].data, a->sample->keys[j].len);
    }
    carls__response__free_unpacked(a, NULL);
    carls__response__free_unpacked(b, NULL);
}

/* Patient clients: some scans and knn queries run long under the sanitizers. */
static kb_client_options_t s_client_options = {.timeout_ms = 10000, .retries = 1};

CARLS_TEST_MAIN(
    SERVER_FIXTURE_TEST_STARTED(test_flat_knn_matches_brute_force_and_follows_updates, &s_client_options),
    SERVER_FIXTURE_TEST_STARTED(test_feature_records_round_trip, &s_client_options),
    SERVER_FIXTURE_TEST_STARTED(test_admission_keeps_rare_keys_out, &s_client_options),
    SERVER_FIXTURE_TEST_STARTED(test_eviction_lru_and_oldest, &s_client_options),
    SERVER_FIXTURE_TEST_STARTED(test_scan_pages_cover_every_row_once, &s_client_options),
    SERVER_FIXTURE_TEST_STARTED(test_read_only_and_shard_refusals, &s_client_options),
    SERVER_FIXTURE_TEST_STARTED(test_sampling_probabilities_and_frequencies, &s_client_options))
