/* Unit tests for kb_latency: quantile estimates of known distributions stay within the documented bucket
 * error (an estimate is the upper edge of a bucket 2^(1/4) wide: at least the true value, less than ~19%
 * above it), an empty histogram answers 0, the maximum is exact, and concurrent recording loses nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kb_latency.h"
#include "test_util.h"

/* 2^(1/4): the documented bucket ratio. */
static const double s_ratio = 1.189207115002721;

static int s_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted values as "the smallest value with at least q of the samples at or below it". */
static uint64_t s_true_quantile(const uint64_t *sorted, size_t n, double q)
{
    size_t rank = (size_t)ceil(q * (double)n);
    if (rank == 0)
        rank = 1;
    return sorted[rank - 1];
}

/* estimate within [truth, truth * 2^(1/4)], with a hair of slack for the floating-point edge. */
static void s_assert_close(double estimate, uint64_t truth, double q)
{
    double lo = (double)truth * (1.0 - 1e-9);
    double hi = (double)truth * s_ratio * (1.0 + 1e-9);
    if (!(estimate >= lo && estimate <= hi))
        fail_msg("q=%g: estimate %.3f not within [%llu, %.3f]", q, estimate, (unsigned long long)truth, hi);
}

static void s_check_distribution(uint64_t *values, size_t n)
{
    kb_latency_t h;
    kb_latency_init(&h);
    uint64_t max = 0;
    for (size_t i = 0; i < n; i++) {
        kb_latency_record(&h, values[i]);
        if (values[i] > max)
            max = values[i];
    }
    assert_int_equal(kb_latency_count(&h), n);
    assert_int_equal(kb_latency_max(&h), max);
    qsort(values, n, sizeof *values, s_cmp_u64);
    static const double qs[] = {1e-9, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0};
    double prev = 0.0;
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        double e = kb_latency_quantile(&h, qs[i]);
        s_assert_close(e, s_true_quantile(values, n, qs[i]), qs[i]);
        assert_true(e >= prev); /* quantiles do not decrease with q */
        prev = e;
    }
}

static void test_empty(void **st)
{
    (void)st;
    kb_latency_t h;
    kb_latency_init(&h);
    assert_int_equal(kb_latency_count(&h), 0);
    assert_int_equal(kb_latency_max(&h), 0);
    assert_true(kb_latency_quantile(&h, 0.5) == 0.0);
    assert_true(kb_latency_quantile(&h, 0.99) == 0.0);
    assert_true(kb_latency_quantile(&h, 1.0) == 0.0);
}

static void test_single_values(void **st)
{
    (void)st;
    /* Powers of two sit on bucket edges, the others inside buckets. */
    static const uint64_t samples[] = {1, 2, 3, 5, 7, 8, 100, 1000, 1024, 4097, 65535, 1000000, 123456789};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        kb_latency_t h;
        kb_latency_init(&h);
        kb_latency_record(&h, samples[i]);
        assert_int_equal(kb_latency_count(&h), 1);
        assert_int_equal(kb_latency_max(&h), samples[i]);
        s_assert_close(kb_latency_quantile(&h, 0.5), samples[i], 0.5);
        s_assert_close(kb_latency_quantile(&h, 1.0), samples[i], 1.0);
    }
    /* Below the 1 µs resolution: answered as at most 1 µs. */
    kb_latency_t h;
    kb_latency_init(&h);
    kb_latency_record(&h, 0);
    assert_true(kb_latency_quantile(&h, 0.5) <= 1.0);
    assert_int_equal(kb_latency_count(&h), 1);
    assert_int_equal(kb_latency_max(&h), 0);
}

/* Value i of n of a distribution under test, drawing from *rng where it needs randomness. */
typedef uint64_t (*s_draw_fn)(size_t i, size_t n, uint64_t *rng);

/* Records n values drawn by draw (seeded with seed) and checks the quantiles (s_check_distribution). */
static void s_check_drawn(size_t n, uint64_t seed, s_draw_fn draw)
{
    uint64_t *v = malloc(n * sizeof *v);
    assert_non_null(v);
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++)
        v[i] = draw(i, n, &rng);
    s_check_distribution(v, n);
    free(v);
}

/* Every value 1..n once, recorded in descending order. */
static uint64_t s_draw_uniform(size_t i, size_t n, uint64_t *rng)
{
    (void)rng;
    return n - i;
}

static void test_uniform(void **st)
{
    (void)st;
    s_check_drawn(100000, 0, s_draw_uniform);
}

/* Log-uniform between 1 µs and ~17 minutes: every bucket range is exercised. */
static uint64_t s_draw_log_uniform(size_t i, size_t n, uint64_t *rng)
{
    (void)i;
    (void)n;
    double u = (double)(test_xorshift64(rng) >> 11) / 9007199254740992.0; /* [0, 1) */
    uint64_t v = (uint64_t)exp2(u * 30.0);
    return v == 0 ? 1 : v;
}

static void test_log_uniform(void **st)
{
    (void)st;
    s_check_drawn(200000, 42, s_draw_log_uniform);
}

/* A latency-like mixture: most requests fast, a long tail of slow ones; checks the tail quantiles. */
static uint64_t s_draw_bimodal(size_t i, size_t n, uint64_t *rng)
{
    (void)n;
    return (i % 100 < 97) ? 200 + test_xorshift64(rng) % 100 : 50000 + test_xorshift64(rng) % 50000;
}

static void test_bimodal(void **st)
{
    (void)st;
    s_check_drawn(100000, 7, s_draw_bimodal);
}

/* The maximum is exact, not bucketed, and never goes down. */
static void test_max_exact(void **st)
{
    (void)st;
    kb_latency_t h;
    kb_latency_init(&h);
    uint64_t rng = 3, max = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t us = test_xorshift64(&rng) % 10000000;
        kb_latency_record(&h, us);
        if (us > max)
            max = us;
        assert_int_equal(kb_latency_max(&h), max);
    }
    kb_latency_record(&h, 1);
    assert_int_equal(kb_latency_max(&h), max);
    /* Far beyond the top bucket (hours): still recorded and the maximum stays exact. */
    uint64_t huge = 10ULL * 3600 * 1000000;
    kb_latency_record(&h, huge);
    assert_int_equal(kb_latency_max(&h), huge);
    assert_int_equal(kb_latency_count(&h), 10002);
}

/* Recording from several threads at once loses no sample and keeps the true maximum. */
typedef struct {
    kb_latency_t *h;
    uint64_t seed, max;
} s_worker_t;

enum { THREADS = 4, PER_THREAD = 200000 };

static void *s_worker(void *arg)
{
    s_worker_t *w = arg;
    uint64_t rng = w->seed;
    for (int i = 0; i < PER_THREAD; i++) {
        uint64_t us = 1 + test_xorshift64(&rng) % 5000;
        if (i == PER_THREAD / 2)
            us = 1000000 + w->seed; /* one distinct spike per thread */
        if (us > w->max)
            w->max = us;
        kb_latency_record(w->h, us);
    }
    return NULL;
}

/* The exported histogram: le_counts[i] is exactly the number of values <= 2^i us (the internal buckets nest
 * in these edges), cumulative, and the sum and count are exact; kb_latency_summarize fills a summary with
 * them and the capped percentiles. */
static void test_le_counts_exact(void **st)
{
    (void)st;
    kb_latency_t h;
    kb_latency_init(&h);
    uint64_t values[2000], sum = 0, rng = 99;
    for (int i = 0; i < 2000; i++) {
        values[i] = 1 + test_xorshift64(&rng) % 5000000; /* 1 us .. 5 s */
        if (i % 100 == 0)
            values[i] = (uint64_t)1 << (i % 22); /* exactly on an edge: counted at that edge */
        kb_latency_record(&h, values[i]);
        sum += values[i];
    }
    uint64_t le[KB_LATENCY_LE_BUCKETS];
    assert_int_equal(kb_latency_le_counts(&h, le), 2000);
    for (int b = 0; b < KB_LATENCY_LE_BUCKETS; b++) {
        uint64_t want = 0;
        for (int i = 0; i < 2000; i++)
            want += values[i] <= ((uint64_t)1 << b);
        if (le[b] != want)
            fail_msg("le 2^%d us: %llu, want %llu", b, (unsigned long long)le[b], (unsigned long long)want);
    }
    Carls__LatencySummary l = CARLS__LATENCY_SUMMARY__INIT;
    uint64_t storage[KB_LATENCY_LE_BUCKETS];
    kb_latency_summarize(&h, &l, storage);
    assert_int_equal(l.count, 2000);
    assert_int_equal(l.n_le_counts, KB_LATENCY_LE_BUCKETS);
    assert_ptr_equal(l.le_counts, storage);
    assert_memory_equal(storage, le, sizeof le);
    assert_true(l.sum_us == (double)sum);
    assert_true(l.max_us == (double)kb_latency_max(&h));
    assert_true(l.p50_us <= l.p99_us && l.p99_us <= l.max_us);
}

static void test_concurrent(void **st)
{
    (void)st;
    kb_latency_t h;
    kb_latency_init(&h);
    pthread_t th[THREADS];
    s_worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (s_worker_t){.h = &h, .seed = (uint64_t)i + 1, .max = 0};
        assert_int_equal(pthread_create(&th[i], NULL, s_worker, &w[i]), 0);
    }
    uint64_t max = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        if (w[i].max > max)
            max = w[i].max;
    }
    assert_int_equal(kb_latency_count(&h), (uint64_t)THREADS * PER_THREAD);
    assert_int_equal(kb_latency_max(&h), max);
    /* The median of values uniform in 1..5000 is about 2500. */
    double med = kb_latency_quantile(&h, 0.5);
    assert_true(med >= 2400.0 && med <= 2600.0 * s_ratio);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_empty),
    cmocka_unit_test(test_single_values),
    cmocka_unit_test(test_uniform),
    cmocka_unit_test(test_log_uniform),
    cmocka_unit_test(test_bimodal),
    cmocka_unit_test(test_max_exact),
    cmocka_unit_test(test_le_counts_exact),
    cmocka_unit_test(test_concurrent))
