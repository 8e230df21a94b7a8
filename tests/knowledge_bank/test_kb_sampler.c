/* Unit tests for kb_sampler: the stated probabilities (formulas, sum to 1, lookups by row id), empirical
 * frequencies over many draws against them (per-entry 5-sigma binomial bounds and a chi-square test),
 * determinism for a seed, and the edge cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_sampler.h"
#include "util.h"

/* Chi-square critical value with df degrees of freedom at upper tail 1e-6 (z = 4.7534), by the
 * Wilson-Hilferty approximation, which is accurate to a few percent for df >= 10. */
static double s_chi2_crit(double df)
{
    const double z = 4.7534;
    double h = 2.0 / (9.0 * df);
    double c = 1.0 - h + z * sqrt(h);
    return df * c * c * c;
}

/* Checks observed counts against expected probabilities over `draws` draws: each count within 5 binomial
 * sigmas (+1 for the discreteness of small counts), zero-probability entries never drawn, and Pearson's
 * chi-square below its 1e-6 critical value. Entries with an expected count below 5 are pooled for the
 * chi-square so that its approximation holds. */
static void s_check_counts(const char *what, const uint64_t *counts, const double *p, size_t k, uint64_t draws)
{
    double chi2 = 0.0, pool_e = 0.0, pool_o = 0.0;
    size_t cells = 0;
    for (size_t i = 0; i < k; i++) {
        double e = p[i] * (double)draws;
        if (p[i] == 0.0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double sigma = sqrt(e * (1.0 - p[i]));
        if (fabs((double)counts[i] - e) > 5.0 * sigma + 1.0) {
            fprintf(stderr, "%s: entry %zu drawn %llu times, expected %.1f (sigma %.1f)\n", what, i,
                    (unsigned long long)counts[i], e, sigma);
            fail();
        }
        if (e < 5.0) {
            pool_e += e;
            pool_o += (double)counts[i];
            continue;
        }
        chi2 += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        cells++;
    }
    if (pool_e > 0.0) {
        chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    double crit = s_chi2_crit((double)(cells - 1));
    fprintf(stderr, "%s: chi2 %.1f over %zu cells (df %zu, 1e-6 critical value %.1f)\n", what, chi2, cells, cells - 1,
            crit);
    assert_true(chi2 < crit);
}

/* N entries with row ids 1000 + 7 * i and frequencies that spread over three orders of magnitude, in no
 * particular order, with entry 3 at frequency 0. */
static kb_sampler_entry_t *s_entries(size_t n)
{
    kb_sampler_entry_t *e = malloc(n * sizeof(*e));
    assert_non_null(e);
    uint64_t rng = 99;
    for (size_t i = 0; i < n; i++) {
        e[i].row_id = 1000 + 7 * (int64_t)i;
        e[i].frequency = 1 + carls_splitmix64(&rng) % 2000;
    }
    if (n > 3)
        e[3].frequency = 0;
    return e;
}

static void test_probabilities_sum_and_lookup(void **st)
{
    (void)st;
    const size_t n = 1000;
    kb_sampler_entry_t *e = s_entries(n);
    for (int s = KB_SAMPLER_UNIFORM; s <= KB_SAMPLER_UNIGRAM; s++) {
        kb_sampler_t *smp = NULL;
        assert_int_equal(kb_sampler_new((kb_sampler_strategy_t)s, e, n, &smp), 0);
        assert_int_equal(kb_sampler_size(smp), n);
        assert_int_equal(kb_sampler_strategy(smp), s);
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) {
            double p = kb_sampler_prob_at(smp, i), q = -1;
            size_t idx = 0;
            assert_true(p >= 0.0 && p <= 1.0);
            sum += p;
            assert_int_equal(kb_sampler_prob_of(smp, e[i].row_id, &q, &idx), 0);
            assert_true(q == p);
            assert_int_equal(idx, i);
        }
        assert_true(fabs(sum - 1.0) < 1e-9);
        double q = -1;
        assert_int_equal(kb_sampler_prob_of(smp, 5, &q, NULL), -ENOENT);
        assert_true(q == 0.0);
        assert_true(kb_sampler_prob_at(smp, n) == 0.0);
        kb_sampler_destroy(&smp);
        assert_null(smp);
    }
    free(e);
}

/* The stated formulas: uniform 1/N; log-uniform by frequency rank (ties keep the array's order); unigram
 * f^0.75 / sum. And the shard masses. */
static void test_formulas(void **st)
{
    (void)st;
    const size_t n = 200;
    kb_sampler_entry_t *e = s_entries(n);
    e[10].frequency = e[11].frequency = e[12].frequency = 5000; /* the top three, tied */
    kb_sampler_t *smp = NULL;

    assert_int_equal(kb_sampler_new(KB_SAMPLER_UNIFORM, e, n, &smp), 0);
    assert_true(fabs(kb_sampler_prob_at(smp, 17) - 1.0 / n) < 1e-15);
    assert_true(kb_sampler_mass(smp) == (double)n);
    kb_sampler_destroy(&smp);

    assert_int_equal(kb_sampler_new(KB_SAMPLER_LOG_UNIFORM, e, n, &smp), 0);
    for (size_t i = 0; i < n; i++) {
        size_t rank = 0; /* entries before i in the order: more frequent, or as frequent and earlier */
        for (size_t j = 0; j < n; j++)
            rank += e[j].frequency > e[i].frequency || (e[j].frequency == e[i].frequency && j < i);
        double want = (log((double)rank + 2) - log((double)rank + 1)) / log((double)n + 1);
        assert_true(fabs(kb_sampler_prob_at(smp, i) - want) < 1e-12 * want + 1e-15);
    }
    assert_true(kb_sampler_prob_at(smp, 10) > kb_sampler_prob_at(smp, 11));
    assert_true(kb_sampler_prob_at(smp, 11) > kb_sampler_prob_at(smp, 12));
    assert_true(fabs(kb_sampler_prob_at(smp, 10) - log(2.0) / log((double)n + 1)) < 1e-12);
    assert_true(kb_sampler_mass(smp) == (double)n);
    kb_sampler_destroy(&smp);

    assert_int_equal(kb_sampler_new(KB_SAMPLER_UNIGRAM, e, n, &smp), 0);
    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += pow((double)e[i].frequency, 0.75);
    for (size_t i = 0; i < n; i++) {
        double want = pow((double)e[i].frequency, 0.75) / total;
        assert_true(fabs(kb_sampler_prob_at(smp, i) - want) < 1e-12 * want + 1e-15);
    }
    assert_true(kb_sampler_prob_at(smp, 3) == 0.0);
    assert_true(fabs(kb_sampler_mass(smp) - total) < 1e-9 * total);
    kb_sampler_destroy(&smp);
    free(e);
}

/* Empirical frequencies of 500k draws match the stated probabilities, for each strategy; every draw
 * reports its entry's row id and probability. */
static void test_empirical(void **st)
{
    (void)st;
    const size_t n = 50, draws = 500000, batch = 1000;
    kb_sampler_entry_t *e = s_entries(n);
    uint64_t counts[50];
    double p[50];
    size_t idx[1000];
    int64_t ids[1000];
    double probs[1000];
    for (int s = KB_SAMPLER_UNIFORM; s <= KB_SAMPLER_UNIGRAM; s++) {
        kb_sampler_t *smp = NULL;
        assert_int_equal(kb_sampler_new((kb_sampler_strategy_t)s, e, n, &smp), 0);
        memset(counts, 0, sizeof counts);
        for (size_t i = 0; i < n; i++)
            p[i] = kb_sampler_prob_at(smp, i);
        uint64_t rng = 1234 + (uint64_t)s;
        for (size_t done = 0; done < draws; done += batch) {
            assert_int_equal(kb_sampler_draw(smp, &rng, batch, idx, ids, probs), 0);
            for (size_t j = 0; j < batch; j++) {
                assert_true(idx[j] < n);
                assert_int_equal(ids[j], e[idx[j]].row_id);
                assert_true(probs[j] == p[idx[j]]);
                counts[idx[j]]++;
            }
        }
        s_check_counts(kb_sampler_strategy_name((kb_sampler_strategy_t)s), counts, p, n, draws);
        kb_sampler_destroy(&smp);
    }
    free(e);
}

/* Log-uniform over 100k entries: 1M draws, counted in rank buckets [0,1), [1,2), [2,4), [4,8), ... whose
 * probabilities follow from the CDF P(rank < r) = log(r + 1) / log(N + 1). Tests the inverse-CDF draw far
 * into the tail. */
static void test_log_uniform_large(void **st)
{
    (void)st;
    const size_t n = 100000, draws = 1000000, batch = 10000;
    kb_sampler_entry_t *e = malloc(n * sizeof(*e));
    for (size_t i = 0; i < n; i++) {
        e[i].row_id = (int64_t)i;
        e[i].frequency = n - i; /* index == rank */
    }
    kb_sampler_t *smp = NULL;
    assert_int_equal(kb_sampler_new(KB_SAMPLER_LOG_UNIFORM, e, n, &smp), 0);
    uint64_t counts[20] = {0};
    double p[20] = {0};
    size_t nb = 0;
    size_t lo_of[20];
    for (size_t lo = 0; lo < n; lo = lo ? lo * 2 : 1) {
        size_t hi = lo ? lo * 2 : 1;
        if (hi > n)
            hi = n;
        lo_of[nb] = lo;
        p[nb++] = (log((double)hi + 1) - log((double)lo + 1)) / log((double)n + 1);
    }
    size_t *idx = malloc(batch * sizeof(size_t));
    uint64_t rng = 77;
    for (size_t done = 0; done < draws; done += batch) {
        assert_int_equal(kb_sampler_draw(smp, &rng, batch, idx, NULL, NULL), 0);
        for (size_t j = 0; j < batch; j++) {
            size_t b = 0;
            while (b + 1 < nb && idx[j] >= lo_of[b + 1])
                b++;
            counts[b]++;
        }
    }
    s_check_counts("log_uniform, 100k entries, rank buckets", counts, p, nb, draws);
    free(idx);
    free(e);
    kb_sampler_destroy(&smp);
}

static void test_deterministic(void **st)
{
    (void)st;
    const size_t n = 300;
    kb_sampler_entry_t *e = s_entries(n);
    for (int s = KB_SAMPLER_UNIFORM; s <= KB_SAMPLER_UNIGRAM; s++) {
        kb_sampler_t *a = NULL, *b = NULL;
        assert_int_equal(kb_sampler_new((kb_sampler_strategy_t)s, e, n, &a), 0);
        assert_int_equal(kb_sampler_new((kb_sampler_strategy_t)s, e, n, &b), 0);
        size_t x[64], y[64], z[64];
        uint64_t ra = 42, rb = 42, rc = 43;
        assert_int_equal(kb_sampler_draw(a, &ra, 64, x, NULL, NULL), 0);
        assert_int_equal(kb_sampler_draw(b, &rb, 64, y, NULL, NULL), 0);
        assert_int_equal(kb_sampler_draw(a, &rc, 64, z, NULL, NULL), 0);
        assert_memory_equal(x, y, sizeof x);
        assert_true(ra == rb && ra != 42); /* the state advanced, identically */
        assert_true(memcmp(x, z, sizeof x) != 0);
        /* Continuing from the advanced state gives new draws, not a replay. */
        assert_int_equal(kb_sampler_draw(a, &ra, 64, z, NULL, NULL), 0);
        assert_true(memcmp(x, z, sizeof x) != 0);
        kb_sampler_destroy(&a);
        kb_sampler_destroy(&b);
    }
    free(e);
}

static void test_edge_cases(void **st)
{
    (void)st;
    kb_sampler_t *smp = NULL;
    size_t idx[4];
    uint64_t rng = 1;

    /* Empty snapshot: builds, draws nothing. */
    assert_int_equal(kb_sampler_new(KB_SAMPLER_UNIFORM, NULL, 0, &smp), 0);
    assert_int_equal(kb_sampler_size(smp), 0);
    assert_true(kb_sampler_mass(smp) == 0.0);
    assert_int_equal(kb_sampler_draw(smp, &rng, 4, idx, NULL, NULL), -ENODATA);
    assert_int_equal(kb_sampler_draw(smp, &rng, 0, idx, NULL, NULL), 0);
    double p;
    assert_int_equal(kb_sampler_prob_of(smp, 1, &p, NULL), -ENOENT);
    kb_sampler_destroy(&smp);

    /* Unigram with no frequencies at all. */
    kb_sampler_entry_t zero[3] = {{1, 0}, {2, 0}, {3, 0}};
    assert_int_equal(kb_sampler_new(KB_SAMPLER_UNIGRAM, zero, 3, &smp), 0);
    assert_true(kb_sampler_mass(smp) == 0.0);
    assert_int_equal(kb_sampler_draw(smp, &rng, 4, idx, NULL, NULL), -ENODATA);
    kb_sampler_destroy(&smp);
    /* ...but log-uniform and uniform still draw (all ranks tie). */
    assert_int_equal(kb_sampler_new(KB_SAMPLER_LOG_UNIFORM, zero, 3, &smp), 0);
    assert_int_equal(kb_sampler_draw(smp, &rng, 4, idx, NULL, NULL), 0);
    kb_sampler_destroy(&smp);

    /* A single entry is always drawn, with probability 1. */
    kb_sampler_entry_t one = {9, 5};
    for (int s = KB_SAMPLER_UNIFORM; s <= KB_SAMPLER_UNIGRAM; s++) {
        double probs[4];
        int64_t ids[4];
        assert_int_equal(kb_sampler_new((kb_sampler_strategy_t)s, &one, 1, &smp), 0);
        assert_int_equal(kb_sampler_draw(smp, &rng, 4, idx, ids, probs), 0);
        for (int j = 0; j < 4; j++) {
            assert_int_equal(idx[j], 0);
            assert_int_equal(ids[j], 9);
            assert_true(fabs(probs[j] - 1.0) < 1e-12);
        }
        kb_sampler_destroy(&smp);
    }

    /* A duplicate row id, an unknown strategy. */
    kb_sampler_entry_t dup[3] = {{1, 1}, {2, 1}, {1, 3}};
    assert_int_equal(kb_sampler_new(KB_SAMPLER_UNIFORM, dup, 3, &smp), -EINVAL);
    assert_null(smp);
    assert_int_equal(kb_sampler_new((kb_sampler_strategy_t)9, &one, 1, &smp), -EINVAL);
    assert_null(smp);
    kb_sampler_destroy(&smp);
    kb_sampler_destroy(NULL);

    /* Names. */
    kb_sampler_strategy_t s;
    assert_int_equal(kb_sampler_strategy_parse("log-uniform", &s), 0);
    assert_int_equal(s, KB_SAMPLER_LOG_UNIFORM);
    assert_int_equal(kb_sampler_strategy_parse("log_uniform", &s), 0);
    assert_int_equal(kb_sampler_strategy_parse("unigram", &s), 0);
    assert_int_equal(s, KB_SAMPLER_UNIGRAM);
    assert_int_equal(kb_sampler_strategy_parse("zipf", &s), -EINVAL);
    assert_string_equal(kb_sampler_strategy_name(KB_SAMPLER_UNIFORM), "uniform");
}

/* Unigram with most weight on one entry and many zero-frequency entries: the alias table must never
 * return a zero-weight entry and must give the heavy one its share. */
static void test_unigram_skewed(void **st)
{
    (void)st;
    const size_t n = 1000, draws = 400000;
    kb_sampler_entry_t *e = calloc(n, sizeof(*e));
    for (size_t i = 0; i < n; i++) {
        e[i].row_id = (int64_t)i;
        e[i].frequency = i % 3 == 0 ? 0 : 1 + i % 7;
    }
    e[500].frequency = 30000; /* about half of all the weight */
    kb_sampler_t *smp = NULL;
    assert_int_equal(kb_sampler_new(KB_SAMPLER_UNIGRAM, e, n, &smp), 0);
    uint64_t *counts = calloc(n, sizeof(uint64_t));
    double *p = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        p[i] = kb_sampler_prob_at(smp, i);
    size_t idx[1000];
    uint64_t rng = 5;
    for (size_t done = 0; done < draws; done += 1000) {
        assert_int_equal(kb_sampler_draw(smp, &rng, 1000, idx, NULL, NULL), 0);
        for (size_t j = 0; j < 1000; j++)
            counts[idx[j]]++;
    }
    s_check_counts("unigram, skewed with zeros", counts, p, n, draws);
    free(counts);
    free(p);
    free(e);
    kb_sampler_destroy(&smp);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_probabilities_sum_and_lookup),
    cmocka_unit_test(test_formulas),
    cmocka_unit_test(test_empirical),
    cmocka_unit_test(test_log_uniform_large),
    cmocka_unit_test(test_deterministic),
    cmocka_unit_test(test_edge_cases),
    cmocka_unit_test(test_unigram_skewed))
