/* Unit tests for kb_knn: exactness of Flat against a brute-force reference computed here, recall of IVF and
 * HNSW on clustered data, moved/removed/excluded ids, IVF's brute-force phase before training, HNSW staleness
 * and rebuilds, bad input, and searches racing updates and background rebuilds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kb_knn.h"
#include "util.h"

#include <faiss/c_api/utils/distances_c.h>

/* ---- data and reference ---- */

static float s_uniform(uint64_t *rng)
{
    return (float)((carls_splitmix64(rng) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float s_gauss(uint64_t *rng)
{
    double u1 = ((carls_splitmix64(rng) >> 11) + 1) * (1.0 / 9007199254740993.0);
    double u2 = (carls_splitmix64(rng) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* n uniform vectors in [-1, 1]^dim. Caller frees. */
static float *s_random(size_t n, uint32_t dim, uint64_t seed)
{
    float *v = malloc(n * dim * sizeof(float));
    assert_non_null(v);
    for (size_t i = 0; i < n * dim; i++)
        v[i] = s_uniform(&seed);
    return v;
}

/* n vectors around nclusters random centres (spread 0.15 around centres in [-1, 1]^dim). Caller frees. */
static float *s_clustered(size_t n, uint32_t dim, uint32_t nclusters, uint64_t seed)
{
    float *centres = s_random(nclusters, dim, seed ^ 0xc1u);
    float *v = malloc(n * dim * sizeof(float));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) {
        const float *c = centres + (carls_splitmix64(&seed) % nclusters) * dim;
        for (uint32_t d = 0; d < dim; d++)
            v[i * dim + d] = c[d] + 0.15f * s_gauss(&seed);
    }
    free(centres);
    return v;
}

/* Embedding-like data: n vectors around nclusters centres, each cluster spread along its own 8 random
 * directions plus a little isotropic noise, so the data has a low intrinsic dimension as learned
 * embeddings do. (Isotropic Gaussian clusters in 32 dimensions are the worst case for graph indexes; see
 * test_hnsw_recall.) Caller frees. */
static float *s_embedding_like(size_t n, uint32_t dim, uint32_t nclusters, uint64_t seed)
{
    const uint32_t sub = 8;
    float *centres = s_random(nclusters, dim, seed ^ 0xc2u);
    float *basis = malloc((size_t)nclusters * sub * dim * sizeof(float));
    assert_non_null(basis);
    for (size_t i = 0; i < (size_t)nclusters * sub * dim; i++)
        basis[i] = 0.12f * s_gauss(&seed);
    float *v = malloc(n * dim * sizeof(float));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) {
        uint32_t c = (uint32_t)(carls_splitmix64(&seed) % nclusters);
        float g[8];
        for (uint32_t j = 0; j < sub; j++)
            g[j] = s_gauss(&seed);
        for (uint32_t d = 0; d < dim; d++) {
            float x = centres[c * dim + d] + 0.02f * s_gauss(&seed);
            for (uint32_t j = 0; j < sub; j++)
                x += g[j] * basis[((size_t)c * sub + j) * dim + d];
            v[i * dim + d] = x;
        }
    }
    free(centres);
    free(basis);
    return v;
}

static void s_normalize(float *v, uint32_t dim)
{
    double ss = 0;
    for (uint32_t i = 0; i < dim; i++)
        ss += (double)v[i] * v[i];
    if (ss > 0)
        for (uint32_t i = 0; i < dim; i++)
            v[i] = (float)(v[i] / sqrt(ss));
}

typedef struct {
    float score;
    int64_t id;
} ref_hit_t;

static int s_cmp_higher(const void *a, const void *b)
{
    const ref_hit_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int s_cmp_lower(const void *a, const void *b)
{
    const ref_hit_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Exact top-k of query q over base (n vectors with ids), in double precision; ids == NULL means ids 0..n-1.
 * Vectors are used as given (the caller normalizes for cosine). exclude: id never returned (-1 none). */
static void s_reference(const float *base, const int64_t *ids, size_t n, uint32_t dim, kb_knn_metric_t metric,
                        const float *q, uint32_t k, int64_t exclude, int64_t *out_ids, float *out_scores)
{
    ref_hit_t *all = malloc(n * sizeof(*all));
    assert_non_null(all);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t id = ids ? ids[i] : (int64_t)i;
        if (id == exclude)
            continue;
        double acc = 0;
        for (uint32_t d = 0; d < dim; d++) {
            if (metric == KB_KNN_METRIC_L2) {
                double diff = (double)q[d] - base[i * dim + d];
                acc += diff * diff;
            } else {
                acc += (double)q[d] * base[i * dim + d];
            }
        }
        all[m].score = (float)acc;
        all[m].id = id;
        m++;
    }
    qsort(all, m, sizeof(*all), metric == KB_KNN_METRIC_L2 ? s_cmp_lower : s_cmp_higher);
    for (uint32_t j = 0; j < k; j++) {
        out_ids[j] = j < m ? all[j].id : -1;
        out_scores[j] = j < m ? all[j].score : (metric == KB_KNN_METRIC_L2 ? INFINITY : -INFINITY);
    }
    free(all);
}

/* Asserts that got equals the reference: same scores (to float rounding) and same ids, except that ids
 * may swap places where their reference scores tie within that rounding. */
static void s_assert_same(const int64_t *got_ids, const float *got_scores, const int64_t *ref_ids,
                          const float *ref_scores, uint32_t k)
{
    for (uint32_t j = 0; j < k; j++) {
        if (ref_ids[j] == -1) {
            assert_int_equal(got_ids[j], -1);
            continue;
        }
        float tol = 1e-4f * (1.0f + fabsf(ref_scores[j]));
        if (fabsf(got_scores[j] - ref_scores[j]) > tol) {
            fprintf(stderr, "rank %u: got id %lld score %.7g, want id %lld score %.7g\n", j, (long long)got_ids[j],
                    got_scores[j], (long long)ref_ids[j], ref_scores[j]);
            fail();
        }
        if (got_ids[j] != ref_ids[j]) {
            /* Acceptable only as a tie: the neighbour ranks must hold the other id with the same score. */
            bool tie = (j > 0 && fabsf(ref_scores[j - 1] - ref_scores[j]) <= tol) ||
                       (j + 1 < k && fabsf(ref_scores[j + 1] - ref_scores[j]) <= tol);
            if (!tie) {
                fprintf(stderr, "rank %u: got id %lld, want %lld\n", j, (long long)got_ids[j], (long long)ref_ids[j]);
                fail();
            }
        }
    }
}

/* How many of the k ids in got are among the k reference ids (a -1 in the reference, no neighbour, never
 * counts). */
static size_t s_hits(const int64_t *got, const int64_t *ref, uint32_t k)
{
    size_t hits = 0;
    for (uint32_t a = 0; a < k; a++)
        for (uint32_t b = 0; b < k; b++)
            hits += got[a] == ref[b] && ref[b] != -1;
    return hits;
}

/* Prints recall under a printf-style label and asserts that it reaches min. */
static void s_expect_recall(double recall, double min, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void s_expect_recall(double recall, double min, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " = %.4f\n", recall);
    assert_true(recall >= min);
}

/* Mean recall@k of the index against the exact reference for nq queries. */
static double s_recall(kb_knn_t *knn, const float *base, size_t n, uint32_t dim, kb_knn_metric_t metric,
                       const float *queries, size_t nq, uint32_t k)
{
    int64_t *ids = malloc(nq * k * sizeof(int64_t));
    float *scores = malloc(nq * k * sizeof(float));
    int64_t *ref_ids = malloc(k * sizeof(int64_t));
    float *ref_scores = malloc(k * sizeof(float));
    float *q = malloc(dim * sizeof(float));
    assert_int_equal(kb_knn_search(knn, queries, nq, k, NULL, ids, scores), 0);
    size_t hits = 0;
    for (size_t i = 0; i < nq; i++) {
        memcpy(q, queries + i * dim, dim * sizeof(float));
        if (metric == KB_KNN_METRIC_COSINE)
            s_normalize(q, dim);
        s_reference(base, NULL, n, dim, metric, q, k, -1, ref_ids, ref_scores);
        hits += s_hits(ids + i * k, ref_ids, k);
    }
    free(ids);
    free(scores);
    free(ref_ids);
    free(ref_scores);
    free(q);
    return (double)hits / (double)(nq * k);
}

/* The default config of an index spec over dim-wide vectors compared by metric. */
static kb_knn_config_t s_config(const char *spec, kb_knn_metric_t metric, uint32_t dim)
{
    kb_knn_config_t cfg;
    kb_knn_config_default(&cfg);
    cfg.spec = spec;
    cfg.metric = metric;
    cfg.dim = dim;
    return cfg;
}

/* An index of cfg, which must be accepted. */
static kb_knn_t *s_open(const kb_knn_config_t *cfg)
{
    kb_knn_t *knn = NULL;
    char err[256];
    int rc = kb_knn_new(cfg, &knn, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "kb_knn_new(%s): %s\n", cfg->spec, err);
    assert_int_equal(rc, 0);
    assert_non_null(knn);
    return knn;
}

static kb_knn_t *s_new(const char *spec, kb_knn_metric_t metric, uint32_t dim, bool background)
{
    kb_knn_config_t cfg = s_config(spec, metric, dim);
    cfg.background = background;
    return s_open(&cfg);
}

static void s_add_all(kb_knn_t *knn, const float *v, size_t first, size_t n, uint32_t dim)
{
    int64_t *ids = malloc(n * sizeof(int64_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)(first + i);
    assert_int_equal(kb_knn_upsert_batch(knn, n, ids, v + first * dim), 0);
    free(ids);
}

/* Polls until pred(stats) holds, for at most timeout_ms. */
static bool s_wait_for(kb_knn_t *knn, bool (*pred)(const kb_knn_stats_t *), int timeout_ms)
{
    int64_t end = carls_monotonic_ms() + timeout_ms;
    kb_knn_stats_t st;
    do {
        kb_knn_get_stats(knn, &st);
        if (pred(&st))
            return true;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    } while (carls_monotonic_ms() < end);
    return false;
}

static bool s_is_ready(const kb_knn_stats_t *st)
{
    return st->ready && !st->building;
}

static bool s_rebuilt(const kb_knn_stats_t *st)
{
    return st->rebuilds >= 1 && !st->building;
}

/* ---- tests ---- */

/* Flat answers equal the brute-force reference, ids and scores, for each metric, for single queries and
 * batches (FAISS takes its BLAS path from 20 queries on). */
static void test_flat_exact(void **st)
{
    (void)st;
    const uint32_t dim = 24, k = 10;
    const size_t n = 2000, nq = 40;
    float *base = s_random(n, dim, 1);
    float *queries = s_random(nq, dim, 2);
    kb_knn_metric_t metrics[] = {KB_KNN_METRIC_IP, KB_KNN_METRIC_L2, KB_KNN_METRIC_COSINE};
    for (size_t m = 0; m < 3; m++) {
        kb_knn_t *knn = s_new("Flat", metrics[m], dim, false);
        s_add_all(knn, base, 0, n, dim);
        float *ref_base = malloc(n * dim * sizeof(float));
        memcpy(ref_base, base, n * dim * sizeof(float));
        if (metrics[m] == KB_KNN_METRIC_COSINE)
            for (size_t i = 0; i < n; i++)
                s_normalize(ref_base + i * dim, dim);
        int64_t ids[40 * 10], ref_ids[10];
        float scores[40 * 10], ref_scores[10];
        for (size_t batch = 1; batch <= nq; batch += nq - 1) { /* 1 query, then all 40 */
            assert_int_equal(kb_knn_search(knn, queries, batch, k, NULL, ids, scores), 0);
            for (size_t q = 0; q < batch; q++) {
                float qv[24];
                memcpy(qv, queries + q * dim, sizeof qv);
                if (metrics[m] == KB_KNN_METRIC_COSINE)
                    s_normalize(qv, dim);
                s_reference(ref_base, NULL, n, dim, metrics[m], qv, k, -1, ref_ids, ref_scores);
                s_assert_same(ids + q * k, scores + q * k, ref_ids, ref_scores, k);
            }
        }
        /* Cosine scores are cosines. */
        if (metrics[m] == KB_KNN_METRIC_COSINE)
            assert_true(scores[0] <= 1.0001f && scores[0] > 0.0f);
        kb_knn_stats_t s;
        kb_knn_get_stats(knn, &s);
        assert_true(s.ready && s.removable);
        assert_int_equal(s.count, n);
        assert_int_equal(s.indexed, n);
        assert_int_equal(s.pending, 0);
        free(ref_base);
        kb_knn_destroy(&knn);
        assert_null(knn);
    }
    free(base);
    free(queries);
}

/* More k than vectors: the tail is -1 with the worst score. */
static void test_short_answers_padded(void **st)
{
    (void)st;
    const uint32_t dim = 4;
    float *base = s_random(3, dim, 3);
    const char *specs[] = {"Flat", "HNSW8"};
    for (int s = 0; s < 2; s++) {
        kb_knn_t *knn = s_new(specs[s], KB_KNN_METRIC_L2, dim, false);
        int64_t ids[5];
        float scores[5];
        assert_int_equal(kb_knn_search(knn, base, 1, 5, NULL, ids, scores), 0); /* empty index */
        for (int j = 0; j < 5; j++) {
            assert_int_equal(ids[j], -1);
            assert_true(isinf(scores[j]) && scores[j] > 0);
        }
        s_add_all(knn, base, 0, 3, dim);
        assert_int_equal(kb_knn_search(knn, base, 1, 5, NULL, ids, scores), 0);
        assert_int_equal(ids[0], 0);
        assert_true(scores[0] < 1e-6f);
        assert_true(ids[1] >= 0 && ids[2] >= 0);
        assert_int_equal(ids[3], -1);
        assert_int_equal(ids[4], -1);
        kb_knn_destroy(&knn);
    }
    free(base);
}

/* IVF: exact brute force before training, trains in the background at train_min, then recall >= 0.9. */
static void test_ivf_train_and_recall(void **st)
{
    (void)st;
    const uint32_t dim = 32, k = 10;
    const size_t n = 5000, nq = 200;
    float *base = s_clustered(n, dim, 50, 11);
    float *queries = s_clustered(nq, dim, 50, 11 ^ 0x5eedu); /* same centres, other points */
    kb_knn_t *knn = s_new("IVF64,Flat", KB_KNN_METRIC_L2, dim, true);

    /* 39 * 64 = 2496 vectors are needed; 2000 are not enough. */
    s_add_all(knn, base, 0, 2000, dim);
    kb_knn_stats_t s;
    kb_knn_get_stats(knn, &s);
    assert_false(s.ready);
    assert_int_equal(s.pending, 2000);
    assert_int_equal(kb_knn_rebuild(knn), -EAGAIN);
    int64_t ids[10], ref_ids[10];
    float scores[10], ref_scores[10];
    for (size_t q = 0; q < 5; q++) { /* brute force: exact */
        assert_int_equal(kb_knn_search(knn, queries + q * dim, 1, k, NULL, ids, scores), 0);
        s_reference(base, NULL, 2000, dim, KB_KNN_METRIC_L2, queries + q * dim, k, -1, ref_ids, ref_scores);
        s_assert_same(ids, scores, ref_ids, ref_scores, k);
    }

    s_add_all(knn, base, 2000, n - 2000, dim);
    assert_true(s_wait_for(knn, s_is_ready, 20000));
    kb_knn_get_stats(knn, &s);
    assert_true(s.removable);
    assert_int_equal(s.count, n);
    assert_int_equal(s.indexed, n); /* changes during training were replayed */
    assert_int_equal(s.pending, 0);
    assert_true(s.rebuilds >= 1 && s.last_build_ms > 0);

    s_expect_recall(s_recall(knn, base, n, dim, KB_KNN_METRIC_L2, queries, nq, k), 0.9, "IVF64,Flat l2 recall@10");
    kb_knn_destroy(&knn);

    /* The same with inner product, built by an explicit rebuild. */
    knn = s_new("IVF64,Flat", KB_KNN_METRIC_IP, dim, false);
    s_add_all(knn, base, 0, n, dim);
    kb_knn_get_stats(knn, &s);
    assert_false(s.ready);
    assert_int_equal(kb_knn_rebuild(knn), 0);
    kb_knn_get_stats(knn, &s);
    assert_true(s.ready);
    s_expect_recall(s_recall(knn, base, n, dim, KB_KNN_METRIC_IP, queries, nq, k), 0.9, "IVF64,Flat ip recall@10");
    kb_knn_destroy(&knn);

    /* And l2 on embedding-like data. */
    free(base);
    free(queries);
    base = s_embedding_like(n, dim, 50, 12);
    queries = s_embedding_like(nq, dim, 50, 12 ^ 0x5eedu);
    knn = s_new("IVF64,Flat", KB_KNN_METRIC_L2, dim, false);
    s_add_all(knn, base, 0, n, dim);
    assert_int_equal(kb_knn_rebuild(knn), 0);
    s_expect_recall(s_recall(knn, base, n, dim, KB_KNN_METRIC_L2, queries, nq, k), 0.9,
                    "IVF64,Flat embedding-like l2 recall@10");
    kb_knn_destroy(&knn);
    free(base);
    free(queries);
}

static bool s_rebuilt_twice(const kb_knn_stats_t *st)
{
    return st->rebuilds >= 2 && !st->building;
}

/* Waits until no build is running and none starts for 300 ms; returns the rebuild count then. */
static uint64_t s_settled_rebuilds(kb_knn_t *knn)
{
    kb_knn_stats_t s;
    uint64_t seen = UINT64_MAX;
    int64_t quiet_since = carls_monotonic_ms();
    for (int64_t end = quiet_since + 20000; carls_monotonic_ms() < end;) {
        kb_knn_get_stats(knn, &s);
        if (s.building || s.rebuilds != seen) {
            seen = s.rebuilds;
            quiet_since = carls_monotonic_ms();
        } else if (carls_monotonic_ms() - quiet_since >= 300) {
            return seen;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fail_msg("the index never stopped rebuilding");
    return 0;
}

/* An IVF index is retrained as its table grows: each time the count has doubled since the last training,
 * until it was trained on 256 vectors per centroid (IVF8: 2048); then growth alone retrains no more. */
static void test_ivf_retrains_as_it_grows(void **st)
{
    (void)st;
    const uint32_t dim = 16;
    const size_t n = 10000;
    float *base = s_clustered(n, dim, 20, 21);
    kb_knn_t *knn = s_new("IVF8,Flat", KB_KNN_METRIC_L2, dim, true);

    s_add_all(knn, base, 0, 312, dim); /* 39 * 8: trained on the first 312 */
    assert_true(s_wait_for(knn, s_is_ready, 20000));
    assert_int_equal(s_settled_rebuilds(knn), 1);

    s_add_all(knn, base, 312, 400, dim); /* 712 >= 2 * 312: retrained */
    assert_true(s_wait_for(knn, s_rebuilt_twice, 20000));
    uint64_t after_doubling = s_settled_rebuilds(knn);
    assert_int_equal(after_doubling, 2);

    s_add_all(knn, base, 712, 700, dim); /* 1412 < 2 * 712: not yet */
    assert_int_equal(s_settled_rebuilds(knn), 2);

    s_add_all(knn, base, 1412, 2688, dim); /* 4100 >= 2048: retrained on them all, the last time */
    uint64_t capped = s_settled_rebuilds(knn);
    assert_int_equal(capped, 3);
    s_add_all(knn, base, 4100, n - 4100, dim); /* more than twice as many: no more training */
    assert_int_equal(s_settled_rebuilds(knn), capped);

    kb_knn_stats_t s;
    kb_knn_get_stats(knn, &s);
    assert_int_equal(s.count, n);
    assert_int_equal(s.indexed, n);
    assert_int_equal(s.pending, 0);
    /* Searches stay exact for the stored vectors themselves after every retraining. */
    for (size_t q = 0; q < 20; q++) {
        int64_t ids[1];
        float scores[1];
        size_t i = q * 401 % n;
        assert_int_equal(kb_knn_search(knn, base + i * dim, 1, 1, NULL, ids, scores), 0);
        assert_float_equal(scores[0], 0.0f, 1e-4f);
    }
    kb_knn_destroy(&knn);
    free(base);
}

/* HNSW with the default efSearch on two data sets: isotropic Gaussian clusters (hard for graph indexes:
 * inside a cluster all 32 dimensions are noise) and embedding-like clusters of low intrinsic dimension. */
static void test_hnsw_recall(void **st)
{
    (void)st;
    const uint32_t dim = 32, k = 10;
    const size_t n = 5000, nq = 200;
    for (int set = 0; set < 2; set++) {
        float *base = set == 0 ? s_clustered(n, dim, 50, 21) : s_embedding_like(n, dim, 50, 21);
        float *queries = set == 0 ? s_clustered(nq, dim, 50, 21 ^ 0x5eedu) : s_embedding_like(nq, dim, 50, 21 ^ 0x5eedu);
        kb_knn_metric_t metrics[] = {KB_KNN_METRIC_L2, KB_KNN_METRIC_COSINE};
        for (int m = 0; m < 2; m++) {
            kb_knn_t *knn = s_new("HNSW32", metrics[m], dim, false);
            s_add_all(knn, base, 0, n, dim);
            kb_knn_stats_t s;
            kb_knn_get_stats(knn, &s);
            assert_true(s.ready);
            assert_false(s.removable);
            assert_int_equal(s.pending, 0); /* new ids go straight into the graph */
            float *ref_base = malloc(n * dim * sizeof(float));
            memcpy(ref_base, base, n * dim * sizeof(float));
            if (metrics[m] == KB_KNN_METRIC_COSINE)
                for (size_t i = 0; i < n; i++)
                    s_normalize(ref_base + i * dim, dim);
            double recall = s_recall(knn, ref_base, n, dim, metrics[m], queries, nq, k);
            s_expect_recall(recall, 0.9, "HNSW32 %s %s recall@10", set == 0 ? "isotropic" : "embedding-like",
                            kb_knn_metric_name(metrics[m]));
            free(ref_base);
            kb_knn_destroy(&knn);
        }
        free(base);
        free(queries);
    }
}

/* A moved vector is found at its new place and not at its old one; a removed one is gone; the excluded id
 * never comes back; for every index kind, including HNSW before and after its rebuild. */
static void test_move_remove_exclude(void **st)
{
    (void)st;
    const uint32_t dim = 16, k = 5;
    const size_t n = 3000;
    float *base = s_clustered(n, dim, 20, 31);
    const char *specs[] = {"Flat", "IVF16,Flat", "HNSW16"};
    for (int s = 0; s < 3; s++) {
        kb_knn_t *knn = s_new(specs[s], KB_KNN_METRIC_L2, dim, false);
        s_add_all(knn, base, 0, n, dim);
        if (strncmp(specs[s], "IVF", 3) == 0)
            assert_int_equal(kb_knn_rebuild(knn), 0);
        for (int round = 0; round < 2; round++) {
            int64_t moved = 100 + round, gone = 200 + round, target = 300 + round;
            float newv[16];
            /* Move `moved` next to `target`, which lies in another part of the space. */
            for (uint32_t d = 0; d < dim; d++)
                newv[d] = base[target * dim + d] + 1e-3f;
            assert_int_equal(kb_knn_upsert(knn, moved, newv), 0);
            assert_int_equal(kb_knn_remove(knn, gone), 0);
            assert_int_equal(kb_knn_remove(knn, gone), -ENOENT);

            int64_t ids[5];
            float scores[5];
            /* At the new place: a query on newv finds it first. */
            assert_int_equal(kb_knn_search(knn, newv, 1, k, NULL, ids, scores), 0);
            assert_int_equal(ids[0], moved);
            assert_true(scores[0] < 1e-6f);
            /* Not at the old place. */
            assert_int_equal(kb_knn_search(knn, base + moved * dim, 1, k, NULL, ids, scores), 0);
            for (uint32_t j = 0; j < k; j++)
                assert_int_not_equal(ids[j], moved);
            /* The removed one is nowhere. */
            assert_int_equal(kb_knn_search(knn, base + gone * dim, 1, k, NULL, ids, scores), 0);
            for (uint32_t j = 0; j < k; j++) {
                assert_int_not_equal(ids[j], gone);
                assert_true(ids[j] >= 0);
            }
            /* Exclude: a query on target's own vector, excluding target; the second query excludes nothing. */
            float two[32];
            memcpy(two, base + target * dim, dim * sizeof(float));
            memcpy(two + dim, base + target * dim, dim * sizeof(float));
            int64_t excl[2] = {target, -1};
            int64_t ids2[10];
            float scores2[10];
            assert_int_equal(kb_knn_search(knn, two, 2, k, excl, ids2, scores2), 0);
            for (uint32_t j = 0; j < k; j++)
                assert_int_not_equal(ids2[j], target);
            assert_int_equal(ids2[0], moved); /* moved sits 1e-3 away from target */
            assert_true(ids2[k - 1] >= 0);
            assert_int_equal(ids2[k], target);
            assert_int_equal(ids2[k + 1], moved);

            kb_knn_stats_t stt;
            kb_knn_get_stats(knn, &stt);
            assert_int_equal(stt.count, n - 1 - round);
            if (strncmp(specs[s], "HNSW", 4) == 0) {
                if (round == 0) {
                    assert_int_equal(stt.pending, 2); /* moved + gone */
                    assert_int_equal(kb_knn_rebuild(knn), 0);
                    kb_knn_get_stats(knn, &stt);
                    assert_int_equal(stt.pending, 0);
                    assert_int_equal(stt.indexed, n - 1);
                }
            } else {
                assert_int_equal(stt.indexed, stt.count);
            }
        }
        /* Put the removed ones back: found again. */
        assert_int_equal(kb_knn_upsert(knn, 200, base + 200 * dim), 0);
        int64_t ids[5];
        float scores[5];
        assert_int_equal(kb_knn_search(knn, base + 200 * dim, 1, k, NULL, ids, scores), 0);
        assert_int_equal(ids[0], 200);
        kb_knn_destroy(&knn);
    }
    free(base);
}

/* HNSW: pending changes, rebuild counts and times are visible; searches are right while stale; a
 * background rebuild starts once the threshold is reached. */
static void test_hnsw_staleness(void **st)
{
    (void)st;
    const uint32_t dim = 16, k = 10;
    const size_t n = 2000, nmove = 150;
    float *base = s_clustered(n, dim, 20, 41);
    float *moved = s_clustered(nmove, dim, 20, 42);
    int64_t *move_ids = malloc(nmove * sizeof(int64_t));
    for (size_t i = 0; i < nmove; i++)
        move_ids[i] = (int64_t)(i * 13);
    /* The expected state after the moves, for the reference. */
    float *after = malloc(n * dim * sizeof(float));
    memcpy(after, base, n * dim * sizeof(float));
    for (size_t i = 0; i < nmove; i++)
        memcpy(after + move_ids[i] * dim, moved + i * dim, dim * sizeof(float));

    kb_knn_t *knn = s_new("HNSW16", KB_KNN_METRIC_L2, dim, false);
    s_add_all(knn, base, 0, n, dim);
    assert_int_equal(kb_knn_upsert_batch(knn, nmove, move_ids, moved), 0);
    kb_knn_stats_t s;
    kb_knn_get_stats(knn, &s);
    assert_int_equal(s.pending, nmove);
    assert_int_equal(s.rebuilds, 0);
    assert_int_equal(s.last_build_ms, 0);
    assert_int_equal(s.indexed, n);
    assert_true(s.ready);

    /* While stale: every moved vector is found at its new place (exactly: it is scored from the copy). */
    int64_t ids[10];
    float scores[10];
    for (size_t i = 0; i < nmove; i++) {
        assert_int_equal(kb_knn_search(knn, moved + i * dim, 1, k, NULL, ids, scores), 0);
        assert_int_equal(ids[0], move_ids[i]);
    }
    s_expect_recall(s_recall(knn, after, n, dim, KB_KNN_METRIC_L2, moved, nmove, k), 0.9,
                    "HNSW16 while stale: recall@10");

    int64_t t_before = carls_wall_ms();
    assert_int_equal(kb_knn_rebuild(knn), 0);
    kb_knn_get_stats(knn, &s);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.rebuilds, 1);
    assert_true(s.last_build_ms >= t_before);
    assert_true(s.last_build_duration_ms >= 0);
    s_expect_recall(s_recall(knn, after, n, dim, KB_KNN_METRIC_L2, moved, nmove, k), 0.9,
                    "HNSW16 after rebuild: recall@10");
    kb_knn_destroy(&knn);

    /* Background: the default threshold is max(256, 5% of count); 300 moves pass it. */
    knn = s_new("HNSW16", KB_KNN_METRIC_L2, dim, true);
    s_add_all(knn, base, 0, n, dim);
    int64_t few[100];
    for (int i = 0; i < 100; i++)
        few[i] = i;
    assert_int_equal(kb_knn_upsert_batch(knn, 100, few, moved), 0);
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    kb_knn_get_stats(knn, &s);
    assert_int_equal(s.rebuilds, 0); /* 100 < 256: not due */
    assert_int_equal(s.pending, 100);
    int64_t many[300];
    for (int i = 0; i < 300; i++)
        many[i] = 1000 + i;
    assert_int_equal(kb_knn_upsert_batch(knn, 100, many, moved), 0);
    assert_int_equal(kb_knn_upsert_batch(knn, 100, many + 100, moved), 0);
    assert_int_equal(kb_knn_upsert_batch(knn, 100, many + 200, moved), 0);
    assert_true(s_wait_for(knn, s_rebuilt, 20000));
    kb_knn_get_stats(knn, &s);
    assert_true(s.pending < 256);
    fprintf(stderr, "HNSW16 background: rebuilds %llu, pending %llu, took %lld ms\n", (unsigned long long)s.rebuilds,
            (unsigned long long)s.pending, (long long)s.last_build_duration_ms);
    kb_knn_destroy(&knn);

    free(base);
    free(moved);
    free(move_ids);
    free(after);
}

/* The slice floor the server splits a knn request by (kb-server's s_knn_parallel): a Flat search of a
 * BLAS batch or more must not be cut below it (the scalar path cost 13 times as much: kb-maker graph over
 * 8k x 784 in slices of one query); a smaller one is scanned query by query whole or split, and so are
 * every HNSW and IVF search. */
static void test_batch_min(void **st)
{
    (void)st;
    kb_knn_t *flat = s_new("Flat", KB_KNN_METRIC_L2, 8, false);
    kb_knn_t *ivf = s_new("IVF4,Flat", KB_KNN_METRIC_L2, 8, false);
    kb_knn_t *hnsw = s_new("HNSW16", KB_KNN_METRIC_L2, 8, false);
    size_t threshold = (size_t)faiss_get_distance_compute_blas_threshold();
    assert_true(threshold > 1);
    assert_true(kb_knn_batch_min(flat, threshold) >= threshold);
    assert_true(kb_knn_batch_min(flat, 1024) >= 256);
    assert_int_equal(kb_knn_batch_min(flat, threshold - 1), 1);
    assert_int_equal(kb_knn_batch_min(ivf, 1024), 1);
    assert_int_equal(kb_knn_batch_min(hnsw, 1024), 1);
    kb_knn_destroy(&flat);
    kb_knn_destroy(&ivf);
    kb_knn_destroy(&hnsw);
}

static void test_bad_input(void **st)
{
    (void)st;
    kb_knn_config_t cfg;
    kb_knn_config_default(&cfg);
    cfg.dim = 8;
    kb_knn_t *knn = NULL;
    char err[256] = "";

    cfg.spec = "Bogus42";
    assert_int_equal(kb_knn_new(&cfg, &knn, err, sizeof err), -EINVAL);
    assert_null(knn);
    fprintf(stderr, "bad spec error: %s\n", err);
    assert_non_null(strstr(err, "Bogus42"));
    cfg.spec = "IVF,Flat";
    assert_int_equal(kb_knn_new(&cfg, &knn, err, sizeof err), -EINVAL);
    assert_true(strlen(err) > 0);
    cfg.spec = "";
    assert_int_equal(kb_knn_new(&cfg, &knn, err, sizeof err), -EINVAL);
    cfg.spec = "Flat";
    cfg.dim = 0;
    assert_int_equal(kb_knn_new(&cfg, &knn, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "dim"));
    cfg.dim = 8;
    cfg.metric = (kb_knn_metric_t)7;
    assert_int_equal(kb_knn_new(&cfg, &knn, NULL, 0), -EINVAL);
    cfg.metric = KB_KNN_METRIC_IP;

    kb_knn_metric_t m;
    assert_int_equal(kb_knn_metric_parse("cosine", &m), 0);
    assert_int_equal(m, KB_KNN_METRIC_COSINE);
    assert_int_equal(kb_knn_metric_parse("l2", &m), 0);
    assert_int_equal(m, KB_KNN_METRIC_L2);
    assert_int_equal(kb_knn_metric_parse("dot", &m), -EINVAL);

    assert_int_equal(kb_knn_new(&cfg, &knn, err, sizeof err), 0);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(kb_knn_upsert(knn, -5, v), -EINVAL);
    v[3] = NAN;
    assert_int_equal(kb_knn_upsert(knn, 5, v), -EINVAL);
    v[3] = INFINITY;
    assert_int_equal(kb_knn_upsert(knn, 5, v), -EINVAL);
    v[3] = 4;
    assert_int_equal(kb_knn_upsert(knn, 5, v), 0);
    int64_t ids[4];
    float scores[4];
    assert_int_equal(kb_knn_search(knn, v, 1, 0, NULL, ids, scores), -EINVAL);
    assert_int_equal(kb_knn_search(knn, v, 1, 5000, NULL, ids, scores), -EINVAL);
    v[0] = NAN;
    assert_int_equal(kb_knn_search(knn, v, 1, 4, NULL, ids, scores), -EINVAL);
    assert_int_equal(kb_knn_remove(knn, 6), -ENOENT);
    kb_knn_stats_t s;
    kb_knn_get_stats(knn, &s);
    assert_int_equal(s.count, 1); /* rejected calls changed nothing */
    assert_int_equal(kb_knn_dim(knn), 8);
    assert_int_equal(kb_knn_metric(knn), KB_KNN_METRIC_IP);
    kb_knn_destroy(&knn);
    kb_knn_destroy(&knn); /* NULL is fine */
    kb_knn_destroy(NULL);
}

/* Many random batches of upserts (with repeated ids inside a batch: the last wins) and removes (some of
 * absent ids) against a shadow copy; then the answers must match the shadow: exactly for Flat and for
 * IVF probing every list, with recall for HNSW (rebuilt now and then, so both of its paths are used). */
static void test_random_ops(void **st)
{
    (void)st;
    enum { NIDS = 600, DIM = 8, K = 6 };
    const char *specs[] = {"Flat", "IVF8,Flat", "HNSW16"};
    for (int s = 0; s < 3; s++) {
        kb_knn_config_t cfg = s_config(specs[s], KB_KNN_METRIC_L2, DIM);
        cfg.nprobe = 8;
        cfg.train_min = 200;
        cfg.background = false;
        kb_knn_t *knn = s_open(&cfg);
        static float shadow[NIDS * DIM];
        static bool present[NIDS];
        memset(present, 0, sizeof present);
        uint64_t rng = 4242 + (uint64_t)s;
        for (int op = 0; op < 1500; op++) {
            int64_t ids[6];
            float v[6 * DIM];
            size_t nb = 1 + carls_splitmix64(&rng) % 6;
            for (size_t j = 0; j < nb; j++) {
                ids[j] = (int64_t)(carls_splitmix64(&rng) % NIDS);
                if (j > 0 && carls_splitmix64(&rng) % 4 == 0)
                    ids[j] = ids[0]; /* a repeat inside the batch */
                for (int d = 0; d < DIM; d++)
                    v[j * DIM + d] = s_uniform(&rng);
            }
            if (carls_splitmix64(&rng) % 3 == 0) {
                size_t removed = 0, want = 0;
                for (size_t j = 0; j < nb; j++) {
                    bool first = true;
                    for (size_t i = 0; i < j; i++)
                        first &= ids[i] != ids[j];
                    want += first && present[ids[j]];
                }
                assert_int_equal(kb_knn_remove_batch(knn, nb, ids, &removed), 0);
                assert_int_equal(removed, want);
                for (size_t j = 0; j < nb; j++)
                    present[ids[j]] = false;
            } else {
                assert_int_equal(kb_knn_upsert_batch(knn, nb, ids, v), 0);
                for (size_t j = 0; j < nb; j++) {
                    present[ids[j]] = true;
                    memcpy(shadow + ids[j] * DIM, v + j * DIM, sizeof(float) * DIM);
                }
            }
            if (op % 500 == 250 && strncmp(specs[s], "Flat", 4) != 0) {
                int rc = kb_knn_rebuild(knn);
                assert_true(rc == 0 || rc == -EAGAIN);
            }
        }
        float ref[NIDS * DIM];
        int64_t ref_ids[NIDS];
        size_t nref = 0;
        for (int i = 0; i < NIDS; i++) {
            if (present[i]) {
                memcpy(ref + nref * DIM, shadow + i * DIM, sizeof(float) * DIM);
                ref_ids[nref++] = i;
            }
        }
        kb_knn_stats_t stt;
        kb_knn_get_stats(knn, &stt);
        assert_int_equal(stt.count, nref);
        if (strncmp(specs[s], "HNSW", 4) == 0)
            assert_true(stt.pending > 0); /* the stale path is exercised below */
        float *q = s_random(40, DIM, 9);
        int64_t got[40 * K], rid[K];
        float sc[40 * K], rsc[K];
        int64_t excl[40];
        for (int i = 0; i < 40; i++)
            excl[i] = i % 2 ? ref_ids[i] : -1;
        assert_int_equal(kb_knn_search(knn, q, 40, K, excl, got, sc), 0);
        size_t hits = 0;
        for (int i = 0; i < 40; i++) {
            s_reference(ref, ref_ids, nref, DIM, KB_KNN_METRIC_L2, q + i * DIM, K, excl[i], rid, rsc);
            if (strncmp(specs[s], "HNSW", 4) != 0)
                s_assert_same(got + i * K, sc + i * K, rid, rsc, K);
            hits += s_hits(got + i * K, rid, K);
        }
        s_expect_recall((double)hits / (40.0 * K), 0.95, "%s after random ops (pending %llu): recall@%d", specs[s],
                        (unsigned long long)stt.pending, K);
        free(q);
        kb_knn_destroy(&knn);
    }
}

/* ---- concurrency ---- */

#define CONC_N 2000u
#define CONC_DIM 16u
#define CONC_K 8u

/* The state the writers leave behind: writer w owns the ids with id % 2 == w, so the shadow needs no lock. */
typedef struct {
    float vecs[CONC_N * CONC_DIM];
    bool present[CONC_N];
} conc_shadow_t;

typedef struct {
    kb_knn_t *knn;
    conc_shadow_t *shadow;
    int writer;     /* 0 or 1 for writers */
    uint64_t seed;
    int iterations;
    int failures;   /* calls or answers that broke the contract */
} conc_arg_t;

static void *s_writer(void *p)
{
    conc_arg_t *a = p;
    float v[CONC_DIM * 4];
    int64_t ids[4];
    for (int it = 0; it < a->iterations; it++) {
        for (int j = 0; j < 4; j++) {
            /* Distinct ids of this writer's parity (j spreads them over the range). */
            ids[j] = (int64_t)((carls_splitmix64(&a->seed) % (CONC_N / 8)) * 8 + (uint64_t)j * 2 + (uint64_t)a->writer);
            for (uint32_t d = 0; d < CONC_DIM; d++)
                v[j * CONC_DIM + d] = s_uniform(&a->seed);
        }
        if (it % 5 == 4) {
            size_t removed;
            if (kb_knn_remove_batch(a->knn, 2, ids, &removed) != 0)
                a->failures++;
            for (int j = 0; j < 2; j++)
                a->shadow->present[ids[j]] = false;
        } else {
            if (kb_knn_upsert_batch(a->knn, 4, ids, v) != 0)
                a->failures++;
            for (int j = 0; j < 4; j++) {
                a->shadow->present[ids[j]] = true;
                memcpy(a->shadow->vecs + ids[j] * CONC_DIM, v + j * CONC_DIM, CONC_DIM * sizeof(float));
            }
        }
    }
    return NULL;
}

static void *s_reader(void *p)
{
    conc_arg_t *a = p;
    float q[CONC_DIM * 3];
    int64_t ids[CONC_K * 3];
    float scores[CONC_K * 3];
    int64_t excl[3];
    for (int it = 0; it < a->iterations; it++) {
        for (uint32_t d = 0; d < CONC_DIM * 3; d++)
            q[d] = s_uniform(&a->seed);
        for (int j = 0; j < 3; j++)
            excl[j] = (int64_t)(carls_splitmix64(&a->seed) % CONC_N);
        if (kb_knn_search(a->knn, q, 3, CONC_K, excl, ids, scores) != 0) {
            a->failures++;
            continue;
        }
        for (int j = 0; j < 3; j++) {
            for (uint32_t r = 0; r < CONC_K; r++) {
                int64_t id = ids[j * CONC_K + r];
                /* Valid id, never the excluded one, no repeats, ordered best (lowest l2) first. */
                if (id < -1 || id >= (int64_t)CONC_N || (id == excl[j] && id != -1))
                    a->failures++;
                if (id != -1) {
                    for (uint32_t r2 = 0; r2 < r; r2++)
                        a->failures += ids[j * CONC_K + r2] == id;
                    if (r > 0 && scores[j * CONC_K + r] < scores[j * CONC_K + r - 1])
                        a->failures++;
                }
            }
        }
    }
    return NULL;
}

/* Two writers (upserts and removes) and two readers on one index, with background training (IVF),
 * background rebuilds (HNSW) or in-place updates (Flat, IVF), then a check against the final state:
 * exact for Flat and for IVF (probing every list makes it exact), recall for HNSW. */
static void test_concurrent(void **st)
{
    (void)st;
    const char *specs[] = {"Flat", "IVF16,Flat", "HNSW16"};
    conc_shadow_t *shadow = calloc(1, sizeof(*shadow));
    assert_non_null(shadow);
    for (int s = 0; s < 3; s++) {
        kb_knn_config_t cfg = s_config(specs[s], KB_KNN_METRIC_L2, CONC_DIM);
        cfg.nprobe = 16;              /* IVF16: all lists, exact */
        cfg.rebuild_min_pending = 32; /* HNSW: rebuild often, to race builds against everything else */
        cfg.train_min = 700;          /* IVF: trains in the background while the threads run */
        kb_knn_t *knn = s_open(&cfg);
        float *base = s_random(CONC_N / 4, CONC_DIM, 51);
        memset(shadow, 0, sizeof(*shadow));
        memcpy(shadow->vecs, base, CONC_N / 4 * CONC_DIM * sizeof(float));
        for (uint32_t i = 0; i < CONC_N / 4; i++)
            shadow->present[i] = true;
        s_add_all(knn, base, 0, CONC_N / 4, CONC_DIM);
        free(base);

        pthread_t th[4];
        conc_arg_t args[4];
        for (int t = 0; t < 4; t++) {
            args[t] = (conc_arg_t){knn, shadow, t, 1000 + (uint64_t)t, t < 2 ? 600 : 300, 0};
            assert_int_equal(pthread_create(&th[t], NULL, t < 2 ? s_writer : s_reader, &args[t]), 0);
        }
        for (int t = 0; t < 4; t++) {
            pthread_join(th[t], NULL);
            assert_int_equal(args[t].failures, 0);
        }
        kb_knn_stats_t stt;
        kb_knn_get_stats(knn, &stt);
        fprintf(stderr, "%s concurrent: count %llu, indexed %llu, pending %llu, rebuilds %llu\n", specs[s],
                (unsigned long long)stt.count, (unsigned long long)stt.indexed, (unsigned long long)stt.pending,
                (unsigned long long)stt.rebuilds);

        /* The final state, from the shadow. */
        float *ref = malloc(CONC_N * CONC_DIM * sizeof(float));
        int64_t *ref_id_of = malloc(CONC_N * sizeof(int64_t));
        size_t nref = 0;
        for (uint32_t i = 0; i < CONC_N; i++) {
            if (shadow->present[i]) {
                memcpy(ref + nref * CONC_DIM, shadow->vecs + i * CONC_DIM, CONC_DIM * sizeof(float));
                ref_id_of[nref++] = i;
            }
        }
        assert_int_equal(stt.count, nref);
        if (strncmp(specs[s], "HNSW", 4) == 0) {
            /* Far more than 32 changes are pending or were: the worker must get to a rebuild. */
            assert_true(s_wait_for(knn, s_rebuilt, 20000));
            assert_int_equal(kb_knn_rebuild(knn), 0);
        } else if (strncmp(specs[s], "IVF", 3) == 0) {
            assert_true(s_wait_for(knn, s_is_ready, 20000));
        }
        kb_knn_get_stats(knn, &stt);
        assert_int_equal(stt.pending, 0);
        assert_int_equal(stt.indexed, nref);

        float *q = s_random(50, CONC_DIM, 77);
        int64_t ids[50 * CONC_K], rid[CONC_K];
        float scores[50 * CONC_K], rsc[CONC_K];
        assert_int_equal(kb_knn_search(knn, q, 50, CONC_K, NULL, ids, scores), 0);
        size_t hits = 0;
        for (int i = 0; i < 50; i++) {
            s_reference(ref, ref_id_of, nref, CONC_DIM, KB_KNN_METRIC_L2, q + i * CONC_DIM, CONC_K, -1, rid, rsc);
            if (strncmp(specs[s], "HNSW", 4) != 0)
                s_assert_same(ids + i * CONC_K, scores + i * CONC_K, rid, rsc, CONC_K);
            hits += s_hits(ids + i * CONC_K, rid, CONC_K);
        }
        s_expect_recall((double)hits / (50.0 * CONC_K), 0.9, "%s after the race: recall@%u", specs[s], CONC_K);
        free(q);
        free(ref);
        free(ref_id_of);
        kb_knn_destroy(&knn);
    }
    free(shadow);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_flat_exact),
    cmocka_unit_test(test_short_answers_padded),
    cmocka_unit_test(test_ivf_train_and_recall),
    cmocka_unit_test(test_ivf_retrains_as_it_grows),
    cmocka_unit_test(test_hnsw_recall),
    cmocka_unit_test(test_move_remove_exclude),
    cmocka_unit_test(test_hnsw_staleness),
    cmocka_unit_test(test_batch_min),
    cmocka_unit_test(test_bad_input),
    cmocka_unit_test(test_random_ops),
    cmocka_unit_test(test_concurrent))
