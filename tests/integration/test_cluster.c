/* Integration: the sharded client (kb_cluster) against real servers. Three kb-servers started with
 * --shard 0/3, 1/3, 2/3 and one unsharded server get the same data through kb_cluster; everything read back
 * through the 3-shard cluster must equal the single server's answer: lookups (values, versions), Flat
 * nearest neighbours merged across shards (l2 and ip, keys and scores, by vector and by key with exclusion),
 * sampling (stated probabilities equal the single server's and sum to one; empirical frequencies match them
 * within binomial bounds; log-uniform is only checked for self-consistency, being an approximation across
 * shards), feature records, and export/import in both directions (1 shard -> 3 shards -> 1 shard).
 * Corrupt export files are refused before anything is imported. Errors name the shard they come from. */
#include "kb_cluster.h"
#include "kb_export.h"
#include "protocol.h"
#include "server_harness.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

enum { SHARDS = 3 };

typedef struct {
    test_server_t shard[SHARDS];
    test_server_t single;
    kb_cluster_t *cluster; /* the three shards */
    kb_cluster_t *one;     /* the unsharded server, through the single-endpoint pass-through */
    char dir[64];          /* scratch directory for export files */
} fixture_t;

static kb_cluster_t *s_cluster(const char *endpoints)
{
    kb_client_options_t opts = {.timeout_ms = 8000, .retries = 0}; /* loopback: an answer or a dead server */
    kb_cluster_t *c = kb_cluster_new(endpoints, &opts);
    assert_non_null(c);
    return c;
}

static int s_group_setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    char endpoints[1024] = "";
    for (int i = 0; i < SHARDS; i++) {
        test_server_init(&f->shard[i]);
        char spec[16];
        snprintf(spec, sizeof spec, "%d/%d", i, SHARDS);
        const char *args[] = {"--shard", spec, NULL};
        if (test_server_start(&f->shard[i], args) != 0)
            return -1;
        snprintf(endpoints + strlen(endpoints), sizeof endpoints - strlen(endpoints), "%s%s", i ? "," : "",
                 f->shard[i].endpoint);
    }
    test_server_init(&f->single);
    if (test_server_start(&f->single, NULL) != 0)
        return -1;
    f->cluster = s_cluster(endpoints);
    f->one = s_cluster(f->single.endpoint);
    snprintf(f->dir, sizeof f->dir, "/tmp/carls-cluster-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

static int s_group_teardown(void **state)
{
    fixture_t *f = *state;
    kb_cluster_destroy(&f->cluster);
    kb_cluster_destroy(&f->one);
    /* Each server must shut down cleanly (exit 0): under the sanitizers that includes no leaks. */
    int bad = 0;
    for (int i = 0; i < SHARDS; i++)
        bad |= test_server_cleanup(&f->shard[i]) != 0;
    bad |= test_server_cleanup(&f->single) != 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", f->dir);
    free(f);
    return bad ? -1 : 0;
}

static uint64_t s_rng = 0x2545f4914f6cdd1dULL;
static float s_uniform(void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (float)((s_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Creates table on both banks (the cluster's shards and the single server). */
static void s_create_both(fixture_t *f, const char *table, const Carls__TableConfig *cfg)
{
    if (kb_cluster_create_table(f->cluster, table, cfg, false) != 0)
        fail_msg("create %s on the cluster: %s", table, kb_cluster_last_error(f->cluster));
    if (kb_cluster_create_table(f->one, table, cfg, false) != 0)
        fail_msg("create %s on the single server: %s", table, kb_cluster_last_error(f->one));
}

/* n keys "<prefix><i>" in a table of fixed-size names. */
typedef struct {
    char (*names)[32];
    kb_key_t *keys;
    size_t n;
} s_keys_t;

static s_keys_t s_make_keys(const char *prefix, size_t n)
{
    s_keys_t k = {calloc(n, sizeof *k.names), calloc(n, sizeof *k.keys), n};
    for (size_t i = 0; i < n; i++) {
        snprintf(k.names[i], sizeof k.names[i], "%s%zu", prefix, i);
        k.keys[i] = (kb_key_t){k.names[i], strlen(k.names[i])};
    }
    return k;
}

static void s_free_keys(s_keys_t *k)
{
    free(k->names);
    free(k->keys);
}

static uint64_t s_table_rows(kb_cluster_t *c, const char *table)
{
    Carls__Response *list = NULL;
    assert_int_equal(kb_cluster_list_tables(c, &list), 0);
    uint64_t rows = UINT64_MAX;
    for (size_t i = 0; i < list->table_list->n_tables; i++)
        if (strcmp(list->table_list->tables[i]->name, table) == 0)
            rows = list->table_list->tables[i]->rows;
    carls__response__free_unpacked(list, NULL);
    return rows;
}

static bool s_table_exists(kb_cluster_t *c, const char *table)
{
    kb_cluster_forget_tables(c);
    kb_cluster_table_t info;
    return kb_cluster_table(c, table, &info) == 0;
}

/* Lookups through the cluster equal the single server's: values bit for bit, versions; the shards split the
 * rows between them (each holds some, the sum is all) and each shard refuses another shard's key. */
static void test_rows_split_and_equal(void **state)
{
    fixture_t *f = *state;
    enum { N = 600, DIM = 4 };
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = DIM;
    cfg.init = CARLS__INIT_KIND__INIT_UNIFORM;
    cfg.init_seed = 5;
    s_create_both(f, "rows", &cfg);
    s_keys_t k = s_make_keys("row-", N);
    static float vals[N * DIM], grads[N * DIM], a[N * DIM], b[N * DIM];
    for (size_t i = 0; i < N * DIM; i++) {
        vals[i] = s_uniform();
        grads[i] = s_uniform();
    }
    /* Half the keys are put (versions differ by batch), a third get gradients, all are read. */
    assert_int_equal(kb_cluster_put(f->cluster, "rows", k.keys, N / 2, DIM, vals, 7), 0);
    assert_int_equal(kb_cluster_put(f->one, "rows", k.keys, N / 2, DIM, vals, 7), 0);
    assert_int_equal(kb_cluster_push_gradients(f->cluster, "rows", k.keys + N / 3, N / 3, DIM, grads), 0);
    assert_int_equal(kb_cluster_push_gradients(f->one, "rows", k.keys + N / 3, N / 3, DIM, grads), 0);
    /* Read back in a shuffled order, so the scatter back into the caller's order is exercised. */
    kb_key_t *order = malloc(N * sizeof *order);
    memcpy(order, k.keys, N * sizeof *order);
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = (size_t)((s_uniform() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        kb_key_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    static kb_row_meta_t ma[N], mb[N];
    assert_int_equal(kb_cluster_lookup(f->cluster, "rows", order, N, DIM, a, ma), 0);
    assert_int_equal(kb_cluster_lookup(f->one, "rows", order, N, DIM, b, mb), 0);
    assert_memory_equal(a, b, sizeof a);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(ma[i].version, mb[i].version);
        assert_int_equal(ma[i].frequency, mb[i].frequency);
    }
    /* A put key read back has its put value unless gradients moved it. */
    for (size_t i = 0; i < N; i++) {
        size_t idx = (size_t)atoi((const char *)order[i].data + 4);
        if (idx < N / 3)
            assert_memory_equal(a + i * DIM, vals + idx * DIM, DIM * sizeof(float));
    }
    assert_int_equal(s_table_rows(f->cluster, "rows"), N);
    uint64_t total = 0;
    for (uint32_t s = 0; s < SHARDS; s++) {
        Carls__Response *st = NULL;
        assert_int_equal(kb_cluster_stats(f->cluster, s, "rows", &st), 0);
        uint64_t rows = st->stats->tables[0]->rows;
        assert_true(rows > N / 6 && rows < N / 2); /* a hash split: about a third each */
        total += rows;
        carls__response__free_unpacked(st, NULL);
    }
    assert_int_equal(total, N);
    /* The shards really are sharded: shard 0 refuses a key of shard 1. */
    for (size_t i = 0; i < N; i++) {
        if (kb_cluster_shard_of(f->cluster, k.keys[i].data, k.keys[i].len) == 1) {
            float v[DIM];
            kb_cluster_t *c0 = kb_cluster_new(kb_cluster_endpoint(f->cluster, 0), NULL);
            assert_non_null(c0);
            assert_int_equal(kb_cluster_lookup(c0, "rows", &k.keys[i], 1, DIM, v, NULL), KB_CLIENT_ESTATUS);
            assert_int_equal(kb_cluster_last_status(c0), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
            kb_cluster_destroy(&c0);
            break;
        }
    }
    free(order);
    s_free_keys(&k);
}

/* Compares two knn results slot by slot: same keys, scores within a float's rounding. */
static void s_assert_same_knn(const kb_knn_result_t *x, const kb_knn_result_t *y)
{
    assert_int_equal(x->nq, y->nq);
    assert_int_equal(x->k, y->k);
    for (size_t i = 0; i < x->nq * x->k; i++) {
        if (x->keys[i].len != y->keys[i].len ||
            (x->keys[i].len && memcmp(x->keys[i].data, y->keys[i].data, x->keys[i].len) != 0))
            fail_msg("slot %zu: cluster %.*s, single %.*s", i, (int)x->keys[i].len, (const char *)x->keys[i].data,
                     (int)y->keys[i].len, (const char *)y->keys[i].data);
        if (fabsf(x->scores[i] - y->scores[i]) > 1e-5f * (1.0f + fabsf(y->scores[i])))
            fail_msg("slot %zu: score %.9g vs %.9g", i, (double)x->scores[i], (double)y->scores[i]);
    }
}

/* Flat kNN merged over three shards equals one server's, for l2 (lower first) and ip (higher first); by key
 * with and without exclusion; k larger than the table. */
static void test_knn_merged_equals_single(void **state)
{
    fixture_t *f = *state;
    enum { N = 400, DIM = 8, K = 10, NQ = 6 };
    const char *tables[2] = {"knn_l2", "knn_ip"};
    const Carls__KnnMetric metrics[2] = {CARLS__KNN_METRIC__METRIC_L2, CARLS__KNN_METRIC__METRIC_IP};
    s_keys_t k = s_make_keys("v", N);
    static float data[N * DIM];
    for (size_t i = 0; i < N * DIM; i++)
        data[i] = s_uniform();
    for (int m = 0; m < 2; m++) {
        Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
        Carls__KnnConfig kc = CARLS__KNN_CONFIG__INIT;
        cfg.dim = DIM;
        kc.spec = "Flat";
        kc.metric = metrics[m];
        cfg.knn = &kc;
        s_create_both(f, tables[m], &cfg);
        assert_int_equal(kb_cluster_put(f->cluster, tables[m], k.keys, N, DIM, data, 1), 0);
        assert_int_equal(kb_cluster_put(f->one, tables[m], k.keys, N, DIM, data, 1), 0);

        float q[NQ * DIM];
        for (size_t i = 0; i < NQ * DIM; i++)
            q[i] = s_uniform();
        kb_knn_result_t *x = NULL, *y = NULL;
        assert_int_equal(kb_cluster_knn(f->cluster, tables[m], q, NQ, DIM, K, &x), 0);
        assert_int_equal(kb_cluster_knn(f->one, tables[m], q, NQ, DIM, K, &y), 0);
        s_assert_same_knn(x, y);
        /* Best first in the metric's direction. */
        for (size_t qi = 0; qi < NQ; qi++)
            for (uint32_t r = 1; r < K; r++) {
                float prev = x->scores[qi * K + r - 1], cur = x->scores[qi * K + r];
                assert_true(m == 0 ? prev <= cur : prev >= cur);
            }
        kb_knn_result_destroy(&x);
        kb_knn_result_destroy(&y);

        /* By key: the cluster reads the key's value from its shard and excludes it itself; the single server
         * does both server-side. */
        for (size_t i = 0; i < 5; i++) {
            for (int excl = 0; excl < 2; excl++) {
                assert_int_equal(kb_cluster_knn_by_key(f->cluster, tables[m], &k.keys[i * 37], 1, K, excl, &x), 0);
                assert_int_equal(kb_cluster_knn_by_key(f->one, tables[m], &k.keys[i * 37], 1, K, excl, &y), 0);
                s_assert_same_knn(x, y);
                bool self_found = false;
                for (uint32_t r = 0; r < K; r++)
                    self_found |= x->keys[r].len == k.keys[i * 37].len &&
                                  memcmp(x->keys[r].data, k.keys[i * 37].data, x->keys[r].len) == 0;
                assert_true(self_found == !excl); /* l2: itself at distance 0; ip: checked equal to single */
                kb_knn_result_destroy(&x);
                kb_knn_result_destroy(&y);
                if (m == 1)
                    break; /* ip need not rank a vector first for itself; the equality above is the check */
            }
        }
    }
    /* More slots than rows: every row, then empty slots, the same on both. */
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__KnnConfig kc = CARLS__KNN_CONFIG__INIT;
    cfg.dim = DIM;
    kc.spec = "Flat";
    kc.metric = CARLS__KNN_METRIC__METRIC_L2;
    cfg.knn = &kc;
    s_create_both(f, "knn_small", &cfg);
    assert_int_equal(kb_cluster_put(f->cluster, "knn_small", k.keys, 7, DIM, data, 1), 0);
    assert_int_equal(kb_cluster_put(f->one, "knn_small", k.keys, 7, DIM, data, 1), 0);
    kb_knn_result_t *x = NULL, *y = NULL;
    assert_int_equal(kb_cluster_knn(f->cluster, "knn_small", data, 1, DIM, 12, &x), 0);
    assert_int_equal(kb_cluster_knn(f->one, "knn_small", data, 1, DIM, 12, &y), 0);
    s_assert_same_knn(x, y);
    assert_int_equal(x->keys[6].len > 0, 1);
    assert_int_equal(x->keys[7].len, 0);
    kb_knn_result_destroy(&x);
    kb_knn_result_destroy(&y);
    /* Wrong dim and no index are refused before anything is sent (no index: as a server would refuse it). */
    assert_int_equal(kb_cluster_knn(f->cluster, "knn_small", data, 1, DIM - 1, 3, &x), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_knn(f->cluster, "rows", data, 1, 4, 3, &x), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(kb_cluster_last_error(f->cluster), "no nearest-neighbour index"));
    assert_null(x);
    s_free_keys(&k);
}

/* Index of key (data, len) in k, or -1. Keys are "s<i>". */
static long s_index_of(const s_keys_t *k, const void *data, size_t len)
{
    char buf[32];
    if (len < 2 || len >= sizeof buf)
        return -1;
    memcpy(buf, data, len);
    buf[len] = '\0';
    long i = atol(buf + 1);
    return i >= 0 && (size_t)i < k->n && strcmp(k->names[i], buf) == 0 ? i : -1;
}

/* The probabilities the cluster states for every row (all keys as positives, no draws). */
static void s_all_probs(kb_cluster_t *c, const s_keys_t *k, Carls__SampleStrategy strategy, double *p)
{
    kb_sample_result_t *r = NULL;
    if (kb_cluster_sample(c, "samp", k->keys, k->n, 0, strategy, 1, &r) != 0)
        fail_msg("sample: %s", kb_cluster_last_error(c));
    assert_int_equal(r->n, k->n);
    assert_int_equal(r->n_positives, k->n);
    for (size_t i = 0; i < k->n; i++) {
        assert_true(r->is_positive[i]);
        assert_memory_equal(r->keys[i].data, k->keys[i].data, k->keys[i].len);
        p[i] = r->probabilities[i];
    }
    kb_sample_result_destroy(&r);
}

static void test_sample_merged(void **state)
{
    fixture_t *f = *state;
    enum { N = 60, DRAWS = 60000 };
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 2;
    s_create_both(f, "samp", &cfg);
    s_keys_t k = s_make_keys("s", N);
    static float v[N * 2];
    assert_int_equal(kb_cluster_put(f->cluster, "samp", k.keys, N, 2, v, 1), 0);
    assert_int_equal(kb_cluster_put(f->one, "samp", k.keys, N, 2, v, 1), 0);
    /* Frequencies 1..12 (lookups count), so unigram and log-uniform are far from uniform. */
    for (size_t i = 0; i < N; i++) {
        float out[2];
        for (size_t t = 0; t < 1 + i % 12; t++) {
            assert_int_equal(kb_cluster_lookup(f->cluster, "samp", &k.keys[i], 1, 2, out, NULL), 0);
            assert_int_equal(kb_cluster_lookup(f->one, "samp", &k.keys[i], 1, 2, out, NULL), 0);
        }
    }
    const Carls__SampleStrategy strategies[3] = {CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM,
                                                 CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM,
                                                 CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM};
    for (int m = 0; m < 3; m++) {
        double pc[N], ps[N], sum = 0;
        s_all_probs(f->cluster, &k, strategies[m], pc);
        s_all_probs(f->one, &k, strategies[m], ps);
        for (size_t i = 0; i < N; i++) {
            sum += pc[i];
            /* Uniform and unigram merge exactly: the same probabilities as one server holding every row. */
            if (m < 2 && fabs(pc[i] - ps[i]) > 1e-6 * (1 + ps[i]) + 1e-7)
                fail_msg("strategy %d key %s: cluster %.9g, single %.9g", m, k.names[i], pc[i], ps[i]);
        }
        assert_true(fabs(sum - 1.0) < 1e-4);

        /* Empirical frequencies of DRAWS candidates against the stated probabilities: every key within
         * 5 standard deviations (binomial), and the chi-square statistic (N-1 = 59 degrees of freedom: mean 59,
         * sd 10.9) below 59 + 6 sd. A seeded draw makes the outcome repeatable. */
        kb_sample_result_t *r = NULL;
        if (kb_cluster_sample(f->cluster, "samp", &k.keys[3], 1, DRAWS, strategies[m], 12345 + m, &r) != 0)
            fail_msg("sample: %s", kb_cluster_last_error(f->cluster));
        assert_int_equal(r->n, DRAWS + 1);
        assert_true(r->is_positive[0] && fabs(r->probabilities[0] - pc[3]) < 1e-7);
        assert_int_equal(r->rows, N);
        static size_t count[N];
        memset(count, 0, sizeof count);
        size_t shard_runs = 0;
        for (size_t j = 1; j < r->n; j++) {
            assert_false(r->is_positive[j]);
            long i = s_index_of(&k, r->keys[j].data, r->keys[j].len);
            assert_true(i >= 0);
            count[i]++;
            /* Each candidate carries the probability stated for its key. */
            assert_true(fabs(r->probabilities[j] - pc[i]) <= 1e-6 * pc[i] + 1e-9);
            if (j > 1 && kb_cluster_shard_of(f->cluster, r->keys[j].data, r->keys[j].len) !=
                             kb_cluster_shard_of(f->cluster, r->keys[j - 1].data, r->keys[j - 1].len))
                shard_runs++;
        }
        /* Shuffled: candidates are not grouped by shard (grouped would give 2 changes of shard). */
        assert_true(shard_runs > DRAWS / 3);
        double chi2 = 0;
        for (size_t i = 0; i < N; i++) {
            double e = DRAWS * pc[i], sd = sqrt(DRAWS * pc[i] * (1 - pc[i]));
            if (fabs((double)count[i] - e) > 5 * sd + 1)
                fail_msg("strategy %d key %s: %zu draws, expected %.1f (sd %.1f)", m, k.names[i], count[i], e, sd);
            if (e > 0)
                chi2 += ((double)count[i] - e) * ((double)count[i] - e) / e;
        }
        assert_true(chi2 < 59 + 6 * 10.9);
        kb_sample_result_destroy(&r);
    }
    /* A seed repeats the draw; the single-server path passes the request through unchanged. */
    kb_sample_result_t *a = NULL, *b = NULL;
    assert_int_equal(kb_cluster_sample(f->cluster, "samp", NULL, 0, 50, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM, 9, &a), 0);
    assert_int_equal(kb_cluster_sample(f->cluster, "samp", NULL, 0, 50, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM, 9, &b), 0);
    assert_int_equal(a->n, 50);
    for (size_t j = 0; j < 50; j++)
        assert_memory_equal(a->keys[j].data, b->keys[j].data, a->keys[j].len);
    kb_sample_result_destroy(&a);
    kb_sample_result_destroy(&b);
    assert_int_equal(kb_cluster_sample(f->one, "samp", NULL, 0, 10, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM, 9, &a), 0);
    assert_int_equal(a->n, 10);
    assert_true(fabs(a->probabilities[0] - 1.0 / N) < 1e-7);
    kb_sample_result_destroy(&a);
    s_free_keys(&k);
}

/* A record with every field set from i. */
static void s_record(Carls__FeatureRecord *r, ProtobufCBinaryData *nbrs, float *w, uint8_t *data, size_t i)
{
    carls__feature_record__init(r);
    size_t nn = i % 4;
    for (size_t j = 0; j < nn; j++) {
        nbrs[j].data = (uint8_t *)(j % 2 ? "left, :=" : "right");
        nbrs[j].len = strlen((const char *)nbrs[j].data);
        w[j] = (float)(i + j) * 0.25f;
    }
    r->neighbor_keys = nbrs;
    r->n_neighbor_keys = nn;
    r->neighbor_weights = w;
    r->n_neighbor_weights = nn;
    if (i % 3 == 0) {
        r->label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
        r->int_label = (int64_t)i - 50;
    } else if (i % 3 == 1) {
        r->label_case = CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL;
        r->float_label = (float)i / 7.0f;
    }
    r->label_confidence = (float)(i % 10) / 10.0f;
    for (size_t j = 0; j < i % 5; j++)
        data[j] = (uint8_t)(i * 31 + j);
    r->data = (ProtobufCBinaryData){i % 5, data};
    r->version = i;
}

static void s_assert_same_record(const Carls__FeatureRecord *x, const Carls__FeatureRecord *y)
{
    assert_true(x->found && y->found);
    assert_int_equal(x->n_neighbor_keys, y->n_neighbor_keys);
    assert_int_equal(x->n_neighbor_weights, y->n_neighbor_weights);
    for (size_t j = 0; j < x->n_neighbor_keys; j++) {
        assert_int_equal(x->neighbor_keys[j].len, y->neighbor_keys[j].len);
        assert_memory_equal(x->neighbor_keys[j].data, y->neighbor_keys[j].data, x->neighbor_keys[j].len);
        assert_true(x->neighbor_weights[j] == y->neighbor_weights[j]);
    }
    assert_int_equal(x->label_case, y->label_case);
    if (x->label_case == CARLS__FEATURE_RECORD__LABEL_INT_LABEL)
        assert_int_equal(x->int_label, y->int_label);
    if (x->label_case == CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL)
        assert_true(x->float_label == y->float_label);
    assert_true(x->label_confidence == y->label_confidence);
    assert_int_equal(x->data.len, y->data.len);
    if (x->data.len)
        assert_memory_equal(x->data.data, y->data.data, x->data.len);
    assert_int_equal(x->version, y->version);
}

/* Puts n records (from s_record) into table through c. */
static void s_put_records(kb_cluster_t *c, const char *table, const s_keys_t *k)
{
    Carls__FeatureRecord *recs = calloc(k->n, sizeof *recs);
    const Carls__FeatureRecord **ptrs = calloc(k->n, sizeof *ptrs);
    ProtobufCBinaryData(*nbrs)[4] = calloc(k->n, sizeof *nbrs);
    float(*w)[4] = calloc(k->n, sizeof *w);
    uint8_t(*data)[8] = calloc(k->n, sizeof *data);
    for (size_t i = 0; i < k->n; i++) {
        s_record(&recs[i], nbrs[i], w[i], data[i], i);
        ptrs[i] = &recs[i];
    }
    if (kb_cluster_feature_put(c, table, k->keys, k->n, ptrs) != 0)
        fail_msg("feature_put: %s", kb_cluster_last_error(c));
    free(recs);
    free(ptrs);
    free(nbrs);
    free(w);
    free(data);
}

static void test_features_across_shards(void **state)
{
    fixture_t *f = *state;
    enum { N = 200 };
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    s_create_both(f, "feat", &cfg);
    s_keys_t k = s_make_keys("node/", N);
    s_put_records(f->cluster, "feat", &k);
    s_put_records(f->one, "feat", &k);
    /* Keys in reverse order plus two unknown ones interleaved. */
    kb_key_t q[N + 2];
    for (size_t i = 0; i < N; i++)
        q[i] = k.keys[N - 1 - i];
    q[N] = (kb_key_t){"nobody", 6};
    q[N + 1] = q[0];
    q[0] = (kb_key_t){"nobody-else", 11};
    kb_feature_result_t *x = NULL, *y = NULL;
    assert_int_equal(kb_cluster_feature_get(f->cluster, "feat", q, N + 2, &x), 0);
    assert_int_equal(kb_cluster_feature_get(f->one, "feat", q, N + 2, &y), 0);
    assert_int_equal(x->n, N + 2);
    assert_false(x->records[0]->found);
    assert_false(x->records[N]->found);
    for (size_t i = 0; i < N + 2; i++) {
        if (i == 0 || i == N)
            continue;
        s_assert_same_record(x->records[i], y->records[i]);
        size_t idx = (size_t)atoi((const char *)q[i].data + 5);
        assert_int_equal(x->records[i]->version, idx);
    }
    kb_feature_result_destroy(&x);
    kb_feature_result_destroy(&y);
    assert_int_equal(s_table_rows(f->cluster, "feat"), N);
    s_free_keys(&k);
}

/* Every row of table `a` on bank ca equals the same key's row of table `b` on bank cb (keys from keys). */
static void s_assert_tables_equal(kb_cluster_t *ca, const char *a, kb_cluster_t *cb, const char *b,
                                  const s_keys_t *k, uint32_t dim)
{
    float *va = malloc(k->n * dim * sizeof *va), *vb = malloc(k->n * dim * sizeof *vb);
    kb_row_meta_t *ma = malloc(k->n * sizeof *ma), *mb = malloc(k->n * sizeof *mb);
    assert_int_equal(kb_cluster_lookup_ex(ca, a, k->keys, k->n, dim, true, va, ma), 0);
    assert_int_equal(kb_cluster_lookup_ex(cb, b, k->keys, k->n, dim, true, vb, mb), 0);
    assert_memory_equal(va, vb, k->n * dim * sizeof *va);
    for (size_t i = 0; i < k->n; i++)
        assert_int_equal(ma[i].version, mb[i].version);
    free(va);
    free(vb);
    free(ma);
    free(mb);
}

static void s_assert_features_equal(kb_cluster_t *ca, const char *a, kb_cluster_t *cb, const char *b,
                                    const s_keys_t *k)
{
    kb_feature_result_t *x = NULL, *y = NULL;
    assert_int_equal(kb_cluster_feature_get(ca, a, k->keys, k->n, &x), 0);
    assert_int_equal(kb_cluster_feature_get(cb, b, k->keys, k->n, &y), 0);
    for (size_t i = 0; i < k->n; i++)
        s_assert_same_record(x->records[i], y->records[i]);
    kb_feature_result_destroy(&x);
    kb_feature_result_destroy(&y);
}

static void s_path(const fixture_t *f, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", f->dir, name);
}

static void s_copy_file(const char *from, const char *to, long truncate_to, long flip_at)
{
    FILE *in = fopen(from, "rb");
    assert_non_null(in);
    fseek(in, 0, SEEK_END);
    long len = ftell(in);
    rewind(in);
    unsigned char *buf = malloc((size_t)len);
    assert_int_equal(fread(buf, 1, (size_t)len, in), (size_t)len);
    fclose(in);
    if (flip_at >= 0)
        buf[flip_at < len ? flip_at : len / 2] ^= 0x10;
    if (truncate_to >= 0 && truncate_to < len)
        len = truncate_to;
    FILE *out = fopen(to, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(buf, 1, (size_t)len, out), (size_t)len);
    fclose(out);
    free(buf);
}

/* Export from the single server, import into the 3-shard cluster (rows routed by the current shard count),
 * every row equal; export that, import back into the single server, equal again. Versions differ per row,
 * so the import's one-put-per-version batching is exercised. */
static void test_export_import_round_trip(void **state)
{
    fixture_t *f = *state;
    enum { N = 777, DIM = 3, NF = 150 };
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__KnnConfig kc = CARLS__KNN_CONFIG__INIT;
    cfg.dim = DIM;
    cfg.init = CARLS__INIT_KIND__INIT_NORMAL;
    kc.spec = "Flat";
    kc.metric = CARLS__KNN_METRIC__METRIC_COSINE;
    cfg.knn = &kc;
    assert_int_equal(kb_cluster_create_table(f->one, "exp", &cfg, false), 0);
    s_keys_t k = s_make_keys("e", N);
    static float v[N * DIM];
    for (size_t i = 0; i < N * DIM; i++)
        v[i] = s_uniform() * 100.0f;
    for (size_t i = 0; i < N; i += 100) {
        size_t n = N - i < 100 ? N - i : 100;
        assert_int_equal(kb_cluster_put(f->one, "exp", k.keys + i, n, DIM, v + i * DIM, 10 + i / 100), 0);
    }
    Carls__TableConfig fcfg = CARLS__TABLE_CONFIG__INIT;
    fcfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    assert_int_equal(kb_cluster_create_table(f->one, "expf", &fcfg, false), 0);
    s_keys_t kf = s_make_keys("f", NF);
    s_put_records(f->one, "expf", &kf);

    char p1[128], p2[128], pf[128], pf2[128];
    s_path(f, "exp-1.kbx", p1, sizeof p1);
    s_path(f, "exp-3.kbx", p2, sizeof p2);
    s_path(f, "expf-1.kbx", pf, sizeof pf);
    s_path(f, "expf-3.kbx", pf2, sizeof pf2);
    char err[512];
    uint64_t rows = 0;
    if (kb_export_table(f->one, "exp", p1, 64, &rows, NULL, err, sizeof err) != 0)
        fail_msg("export: %s", err);
    assert_int_equal(rows, N);
    struct stat sb;
    assert_int_equal(stat(p1, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    if (kb_import_table(f->cluster, "exp_c", p1, 50, &rows, NULL, err, sizeof err) != 0)
        fail_msg("import: %s", err);
    assert_int_equal(rows, N);
    s_assert_tables_equal(f->one, "exp", f->cluster, "exp_c", &k, DIM);
    assert_int_equal(s_table_rows(f->cluster, "exp_c"), N);
    /* The config came along: the cluster's copy has the index (cosine), so knn works there. */
    kb_knn_result_t *x = NULL;
    assert_int_equal(kb_cluster_knn_by_key(f->cluster, "exp_c", &k.keys[0], 1, 3, false, &x), 0);
    assert_memory_equal(x->keys[0].data, "e0", 2);
    kb_knn_result_destroy(&x);

    /* And back: 3 shards -> 1. */
    if (kb_export_table(f->cluster, "exp_c", p2, 0, &rows, NULL, err, sizeof err) != 0)
        fail_msg("export from the cluster: %s", err);
    assert_int_equal(rows, N);
    if (kb_import_table(f->one, "exp_back", p2, 0, &rows, NULL, err, sizeof err) != 0)
        fail_msg("import back: %s", err);
    s_assert_tables_equal(f->one, "exp", f->one, "exp_back", &k, DIM);

    /* Feature tables the same way. */
    if (kb_export_table(f->one, "expf", pf, 0, &rows, NULL, err, sizeof err) != 0)
        fail_msg("export features: %s", err);
    assert_int_equal(rows, NF);
    if (kb_import_table(f->cluster, "expf_c", pf, 7, &rows, NULL, err, sizeof err) != 0)
        fail_msg("import features: %s", err);
    s_assert_features_equal(f->one, "expf", f->cluster, "expf_c", &kf);
    if (kb_export_table(f->cluster, "expf_c", pf2, 0, &rows, NULL, err, sizeof err) != 0)
        fail_msg("export features from the cluster: %s", err);
    if (kb_import_table(f->one, "expf_back", pf2, 0, &rows, NULL, err, sizeof err) != 0)
        fail_msg("import features back: %s", err);
    s_assert_features_equal(f->one, "expf", f->one, "expf_back", &kf);

    /* Importing into an existing table with another config is refused and writes nothing. */
    assert_int_equal(kb_import_table(f->cluster, "rows", p1, 0, &rows, NULL, err, sizeof err), KB_EXPORT_EBANK);
    assert_non_null(strstr(err, "another config"));
    assert_int_equal(rows, 0);
    s_free_keys(&k);
    s_free_keys(&kf);
}

/* Damaged files are refused before anything reaches the bank: no table is created, no row written. */
static void test_corrupt_exports_refused(void **state)
{
    fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 2;
    assert_int_equal(kb_cluster_create_table(f->one, "src", &cfg, false), 0);
    s_keys_t k = s_make_keys("c", 300);
    static float v[600];
    for (size_t i = 0; i < 600; i++)
        v[i] = (float)i;
    assert_int_equal(kb_cluster_put(f->one, "src", k.keys, 300, 2, v, 1), 0);
    char good[128], bad[128], err[512];
    s_path(f, "src.kbx", good, sizeof good);
    s_path(f, "bad.kbx", bad, sizeof bad);
    uint64_t rows;
    assert_int_equal(kb_export_table(f->one, "src", good, 0, &rows, NULL, err, sizeof err), 0);
    struct stat sb;
    assert_int_equal(stat(good, &sb), 0);
    long len = (long)sb.st_size;
    struct {
        long truncate_to, flip_at;
        int want;
    } cases[] = {
        {-1, len / 2, KB_EXPORT_ECHECKSUM},     /* a bit flipped in the rows */
        {-1, 40, KB_EXPORT_ECHECKSUM},          /* in the config area */
        {-1, len - 3, KB_EXPORT_ECHECKSUM},     /* in the stored CRC */
        {-1, 0, KB_EXPORT_EMAGIC},              /* in the magic */
        {len - 1, -1, KB_EXPORT_ETRUNCATED},    /* the last byte missing */
        {len / 2, -1, KB_EXPORT_ETRUNCATED},    /* cut in the middle */
        {10, -1, KB_EXPORT_ETRUNCATED},         /* only a header's start */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s_copy_file(good, bad, cases[i].truncate_to, cases[i].flip_at);
        err[0] = '\0';
        rows = 99;
        int rc = kb_import_table(f->cluster, "imported_bad", bad, 0, &rows, NULL, err, sizeof err);
        if (rc != cases[i].want)
            fail_msg("case %zu: rc %d, want %d (%s)", i, rc, cases[i].want, err);
        assert_true(strlen(err) > 10);
        assert_int_equal(rows, 0);
        assert_false(s_table_exists(f->cluster, "imported_bad"));
    }
    /* The good file still imports. */
    assert_int_equal(kb_import_table(f->cluster, "imported_good", good, 0, &rows, NULL, err, sizeof err), 0);
    assert_int_equal(rows, 300);
    s_free_keys(&k);
}

/* An empty table samples as a single server would and exports as a valid file of no rows (every shard's scan comes back empty) and imports as an
 * empty table with the same config. Last, because a server that fails it stops answering. */
static void test_empty_table_export(void **state)
{
    fixture_t *f = *state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 5;
    char pe[128], err[512];
    s_path(f, "empty.kbx", pe, sizeof pe);
    assert_int_equal(kb_cluster_create_table(f->cluster, "empty", &cfg, false), 0);
    /* Nothing to draw: the positives' probabilities (0) for n = 0, NOT_FOUND for n > 0, as one server says. */
    kb_key_t pos = {"p", 1};
    kb_sample_result_t *r = NULL;
    assert_int_equal(kb_cluster_sample(f->cluster, "empty", &pos, 1, 0, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM, 3, &r), 0);
    assert_int_equal(r->n, 1);
    assert_true(r->probabilities[0] == 0.0f);
    kb_sample_result_destroy(&r);
    assert_int_equal(kb_cluster_sample(f->cluster, "empty", &pos, 1, 5, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM, 3, &r),
                     KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    assert_int_equal(kb_cluster_create_table(f->one, "empty1", &cfg, false), 0);
    assert_int_equal(kb_cluster_sample(f->one, "empty1", &pos, 1, 5, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM, 3, &r),
                     KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->one), CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    assert_null(r);
    uint64_t rows = 99;
    if (kb_export_table(f->cluster, "empty", pe, 0, &rows, NULL, err, sizeof err) != 0)
        fail_msg("export of an empty table: %s", err);
    assert_int_equal(rows, 0);
    assert_int_equal(kb_import_table(f->one, "empty_copy", pe, 0, &rows, NULL, err, sizeof err), 0);
    assert_int_equal(rows, 0);
    assert_int_equal(s_table_rows(f->one, "empty_copy"), 0);
    kb_cluster_table_t info;
    assert_int_equal(kb_cluster_table(f->one, "empty_copy", &info), 0);
    assert_int_equal(info.dim, 5);
}

/* Errors name the shard: a dead shard times out, and a list in the wrong order is refused by the servers. */
static void test_errors_name_the_shard(void **state)
{
    fixture_t *f = *state;
    char eps[1024];
    /* Shard 1 of 2 is a port nobody listens on; shard 0 is the unsharded server, which takes any key. */
    snprintf(eps, sizeof eps, "%s, tcp://127.0.0.1:1", f->single.endpoint);
    kb_client_options_t opts = {.timeout_ms = 300, .retries = 0};
    kb_cluster_t *c = kb_cluster_new(eps, &opts);
    assert_non_null(c);
    assert_int_equal(kb_cluster_shards(c), 2);
    assert_string_equal(kb_cluster_endpoint(c, 1), "tcp://127.0.0.1:1");
    s_keys_t k = s_make_keys("dead", 40);
    static float v[40 * 4];
    assert_int_equal(kb_cluster_put(c, "rows", k.keys, 40, 4, v, 1), KB_CLIENT_ETIMEOUT);
    assert_int_equal(kb_cluster_failed_shard(c), 1);
    assert_non_null(strstr(kb_cluster_last_error(c), "shard 1 (tcp://127.0.0.1:1)"));
    kb_cluster_destroy(&c);

    /* The shards listed in the wrong order: a server refuses the keys routed to it. */
    snprintf(eps, sizeof eps, "%s,%s,%s", f->shard[1].endpoint, f->shard[0].endpoint, f->shard[2].endpoint);
    c = s_cluster(eps);
    float out[40 * 4];
    assert_int_equal(kb_cluster_lookup(c, "rows", k.keys, 40, 4, out, NULL), KB_CLIENT_ESTATUS);
    assert_true(kb_cluster_failed_shard(c) == 0 || kb_cluster_failed_shard(c) == 1);
    assert_non_null(strstr(kb_cluster_last_error(c), "belongs to shard"));
    kb_cluster_destroy(&c);

    /* Malformed endpoint lists are refused. */
    assert_null(kb_cluster_new("tcp://127.0.0.1:5,,tcp://127.0.0.1:6", NULL));
    assert_null(kb_cluster_new("tcp://127.0.0.1:5,tcp://127.0.0.1:5", NULL));
    assert_null(kb_cluster_new("", NULL));
    s_free_keys(&k);
}

CARLS_TEST_MAIN_GROUP(s_group_setup, s_group_teardown,
    cmocka_unit_test(test_rows_split_and_equal),
    cmocka_unit_test(test_knn_merged_equals_single),
    cmocka_unit_test(test_sample_merged),
    cmocka_unit_test(test_features_across_shards),
    cmocka_unit_test(test_export_import_round_trip),
    cmocka_unit_test(test_corrupt_exports_refused),
    cmocka_unit_test(test_errors_name_the_shard),
    cmocka_unit_test(test_empty_table_export))
