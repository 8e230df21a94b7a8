/* Unit tests for kb_lazy: averaging, outlier dropping by norm versus median, and the lazy update's "one step
 * with the average" combined with kb_optimizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <math.h>
#include <string.h>

#include "kb_lazy.h"
#include "kb_optimizer.h"

static const kb_outlier_config_t s_default = {.rule = KB_OUTLIER_NORM_MEDIAN, .threshold = 3.0f, .min_count = 3};

/* DESIGN.md: two gradients 2 and 4 for one key average to 3; one SGD step with lr 0.5 moves the value by -1.5. */
/* Averages n one-dimensional gradients under cfg, checks that `kept` were kept and `dropped` dropped (the
 * count is written even when it is 0), and returns the average. */
static float s_average1(const kb_outlier_config_t *cfg, const float *grads, uint32_t n, uint32_t kept,
                        uint32_t dropped)
{
    float avg = -1.0f;
    uint32_t got_dropped = 99;
    assert_int_equal(kb_lazy_average(cfg, grads, n, 1, &avg, &got_dropped), kept);
    assert_int_equal(got_dropped, dropped);
    return avg;
}

static void test_design_example(void **st)
{
    (void)st;
    const float grads[2] = {2.0f, 4.0f};
    float avg = s_average1(&s_default, grads, 2, 2, 0);
    assert_true(avg == 3.0f);

    kb_optimizer_config_t sgd = {.kind = KB_OPT_SGD, .learning_rate = 0.5f};
    kb_optimizer_config_defaults(&sgd);
    float w = 10.0f;
    uint64_t steps = 0;
    kb_optimizer_step(&sgd, &w, NULL, &steps, &avg, 1);
    assert_true(w == 8.5f);
    assert_int_equal(steps, 1); /* one step for the two gradients, not two */
}

/* Norms [1, 1.1, 0.9, 50], threshold 3: median (0.9..1.1 middle pair) is 1.05, limit 3.15, so 50 goes. */
static void test_outlier_dropped(void **st)
{
    (void)st;
    const float grads[4] = {1.0f, -1.1f, 0.9f, 50.0f};
    float avg = s_average1(&s_default, grads, 4, 3, 1);
    /* The mean of the kept three, computed the same way the module documents (double sum, one rounding). */
    float want = (float)(((double)1.0f + (double)-1.1f + (double)0.9f) / 3.0);
    assert_true(avg == want);
    assert_float_equal(avg, 0.8f / 3.0f, 1e-6);

    /* With OUTLIER_NONE the same four are all kept. */
    kb_outlier_config_t none = {.rule = KB_OUTLIER_NONE, .threshold = 3.0f, .min_count = 3};
    avg = s_average1(&none, grads, 4, 4, 0);
    assert_float_equal(avg, (1.0f - 1.1f + 0.9f + 50.0f) / 4.0f, 1e-5);
}

/* A norm just below the limit stays and one just above goes; the comparison is "above threshold * median". */
static void test_threshold_boundary(void **st)
{
    (void)st;
    /* Norms 1, 1, 1, 2.9, 3.1: median 1, limit 3. */
    const float grads[5] = {1.0f, 1.0f, -1.0f, 2.9f, -3.1f};
    float avg = s_average1(&s_default, grads, 5, 4, 1);
    assert_true(avg == (float)((1.0 + 1.0 - 1.0 + (double)2.9f) / 4.0));
}

/* Even count: the median is the mean of the two middle norms. Norms 1, 1, 5, 7 with threshold 2 give median 3
 * and limit 6, so only 7 goes; taking the upper middle (5, limit 10) would keep it and the lower middle
 * (1, limit 2) would also drop 5. */
static void test_even_count_median_is_mean_of_middle(void **st)
{
    (void)st;
    kb_outlier_config_t two = {.rule = KB_OUTLIER_NORM_MEDIAN, .threshold = 2.0f, .min_count = 3};
    const float grads[4] = {1.0f, -1.0f, 5.0f, 7.0f};
    float avg = s_average1(&two, grads, 4, 3, 1);
    assert_true(avg == (float)(5.0 / 3.0));
}

/* Exactly min_count gradients is enough to filter. */
static void test_exactly_min_count_filters(void **st)
{
    (void)st;
    const float grads[3] = {1.0f, 1.0f, 50.0f};
    float avg = s_average1(&s_default, grads, 3, 2, 1);
    assert_true(avg == 1.0f);
}

static void test_fewer_than_min_count_keeps_all(void **st)
{
    (void)st;
    /* Two gradients with min_count 3: even a 100x one is kept. */
    const float grads[2] = {1.0f, 100.0f};
    float avg = s_average1(&s_default, grads, 2, 2, 0);
    assert_true(avg == 50.5f);

    /* Raise min_count above a set that would otherwise lose its outlier. */
    const float four[4] = {1.0f, 1.1f, 0.9f, 50.0f};
    kb_outlier_config_t strict = s_default;
    strict.min_count = 5;
    avg = s_average1(&strict, four, 4, 4, 0);
    assert_float_equal(avg, 53.0f / 4.0f, 1e-5);
}

static void test_zero_median_keeps_all(void **st)
{
    (void)st;
    /* Most gradients are zero, so the median norm is 0 and there is no scale: nothing is dropped. */
    const float grads[4] = {0.0f, 0.0f, 0.0f, 8.0f};
    float avg = s_average1(&s_default, grads, 4, 4, 0);
    assert_true(avg == 2.0f);
}

static void test_multi_dim_rows(void **st)
{
    (void)st;
    /* Rows of dim 3. Norms: 5 (3,4,0), 5 (0,3,4), 5 (4,0,-3), 26 (0,24,-10) and 3 (1,2,2).
     * Sorted 3, 5, 5, 5, 26: median 5, limit 15 with threshold 3, so the row of norm 26 is dropped. */
    const float grads[5][3] = {
        {3.0f, 4.0f, 0.0f}, {0.0f, 3.0f, 4.0f}, {4.0f, 0.0f, -3.0f}, {0.0f, 24.0f, -10.0f}, {1.0f, 2.0f, 2.0f},
    };
    float avg[3];
    uint32_t dropped;
    assert_int_equal(kb_lazy_average(&s_default, &grads[0][0], 5, 3, avg, &dropped), 4);
    assert_int_equal(dropped, 1);
    assert_true(avg[0] == 2.0f); /* (3 + 0 + 4 + 1) / 4 */
    assert_true(avg[1] == 2.25f); /* (4 + 3 + 0 + 2) / 4 */
    assert_true(avg[2] == 0.75f); /* (0 + 4 - 3 + 2) / 4 */

    /* A row with a large norm spread over dimensions (each entry small, norm large) is caught by the norm,
     * not by any single coordinate: 8 entries of 2 have norm 5.66 against unit rows. */
    float rows[4][8];
    memset(rows, 0, sizeof rows);
    rows[0][0] = 1.0f;
    rows[1][1] = 1.0f;
    rows[2][2] = -1.0f;
    for (int j = 0; j < 8; j++)
        rows[3][j] = 2.0f;
    float a8[8];
    assert_int_equal(kb_lazy_average(&s_default, &rows[0][0], 4, 8, a8, &dropped), 3);
    assert_int_equal(dropped, 1);
    const float want8[8] = {1.0f / 3.0f, 1.0f / 3.0f, -1.0f / 3.0f, 0, 0, 0, 0, 0};
    for (int j = 0; j < 8; j++)
        assert_true(a8[j] == want8[j]);
}

/* count 0: returns 0, dropped 0, avg untouched. */
static void test_empty(void **st)
{
    (void)st;
    float avg[2] = {7.0f, 8.0f};
    uint32_t dropped = 3;
    assert_int_equal(kb_lazy_average(&s_default, NULL, 0, 2, avg, &dropped), 0);
    assert_int_equal(dropped, 0);
    assert_true(avg[0] == 7.0f && avg[1] == 8.0f);
}

/* The header promises at least one row is kept; a threshold below 1 must not break that. */
static void test_small_threshold_keeps_median(void **st)
{
    (void)st;
    kb_outlier_config_t tiny = {.rule = KB_OUTLIER_NORM_MEDIAN, .threshold = 0.1f, .min_count = 3};
    const float grads[3] = {1.0f, 2.0f, 3.0f};
    float avg;
    uint32_t dropped;
    uint32_t kept = kb_lazy_average(&tiny, grads, 3, 1, &avg, &dropped);
    assert_true(kept >= 1);
    assert_int_equal(kept + dropped, 3);
    /* Treated as threshold 1: norms above the median 2 go. */
    assert_int_equal(kept, 2);
    assert_true(avg == 1.5f);
}

/* A non-finite gradient (NaN norm) is an outlier when filtering and must not poison the average. */
static void test_nan_gradient_dropped(void **st)
{
    (void)st;
    const float grads[4] = {1.0f, 2.0f, NAN, 3.0f};
    float avg = s_average1(&s_default, grads, 4, 3, 1);
    assert_true(avg == 2.0f);
}

/* More gradients than the module's stack scratch: 200 unit-norm rows plus 3 huge ones. */
static void test_many_rows(void **st)
{
    (void)st;
    enum { N = 203, D = 2 };
    static float grads[N][D];
    for (int i = 0; i < 200; i++) {
        grads[i][0] = (i % 2) ? 1.0f : -1.0f;
        grads[i][1] = 0.0f;
    }
    for (int i = 200; i < N; i++) {
        grads[i][0] = 0.0f;
        grads[i][1] = 1000.0f;
    }
    float avg[D];
    uint32_t dropped;
    assert_int_equal(kb_lazy_average(&s_default, &grads[0][0], N, D, avg, &dropped), 200);
    assert_int_equal(dropped, 3);
    assert_true(avg[0] == 0.0f && avg[1] == 0.0f);
}

/* The definition written out plainly (norms row by row, the median by sorting, column sums in row order),
 * for comparing kb_lazy_average's unrolled loops with. */
static uint32_t s_reference_average(const float *grads, uint32_t count, uint32_t dim, float *avg)
{
    double norms[16] = {0}, sorted[16] = {0};
    for (uint32_t i = 0; i < count; i++) {
        double s = 0.0;
        for (uint32_t j = 0; j < dim; j++)
            s += (double)grads[(size_t)i * dim + j] * (double)grads[(size_t)i * dim + j];
        norms[i] = sorted[i] = sqrt(s);
    }
    for (uint32_t i = 1; i < count; i++) /* no NaN here */
        for (uint32_t k = i; k > 0 && sorted[k - 1] > sorted[k]; k--) {
            double t = sorted[k];
            sorted[k] = sorted[k - 1];
            sorted[k - 1] = t;
        }
    double median = count % 2 ? sorted[count / 2] : 0.5 * (sorted[count / 2 - 1] + sorted[count / 2]);
    double limit = 3.0 * median;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < count; i++)
        kept += norms[i] <= limit;
    for (uint32_t j = 0; j < dim; j++) {
        double s = 0.0;
        for (uint32_t i = 0; i < count; i++)
            if (norms[i] <= limit)
                s += (double)grads[(size_t)i * dim + j];
        avg[j] = (float)(s / (double)kept);
    }
    return kept;
}

/* Counts that are and are not a multiple of four (the norms go four rows at a time) and a dimension above
 * the stack's 512 column sums: every average is the same float as the plain definition's, outliers too. */
static void test_matches_plain_definition(void **st)
{
    (void)st;
    enum { D = 600 };
    static float grads[16 * D];
    uint32_t seed = 12345;
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++) {
        seed = seed * 1103515245u + 12345u;
        grads[i] = (float)((int)(seed >> 9) % 20001 - 10000) * 1e-4f;
    }
    for (uint32_t j = 0; j < D; j++) /* row 5 is an outlier wherever it is among the kept */
        grads[5 * D + j] *= 50.0f;
    const uint32_t counts[] = {3, 4, 7, 8, 13, 16};
    const uint32_t dims[] = {1, 3, 64, D};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            static float got[D], want[D];
            uint32_t dropped = 0;
            uint32_t kept = kb_lazy_average(&s_default, grads, counts[c], dims[d], got, &dropped);
            assert_int_equal(kept, s_reference_average(grads, counts[c], dims[d], want));
            assert_int_equal(kept + dropped, counts[c]);
            if (dims[d] == D && counts[c] > 5)
                assert_int_equal(dropped, 1);
            assert_memory_equal(got, want, dims[d] * sizeof(float));
        }
    }
}

/* Lazy vs immediate with SGD: applying the average once equals lr * mean, not the sum; with the outlier
 * removed the outlier has no effect at all. */
static void test_lazy_sgd_step_uses_mean(void **st)
{
    (void)st;
    const float grads[4][2] = {{1.0f, -2.0f}, {3.0f, 0.0f}, {-1.0f, 2.0f}, {400.0f, 300.0f}};
    float avg[2];
    uint32_t dropped;
    assert_int_equal(kb_lazy_average(&s_default, &grads[0][0], 4, 2, avg, &dropped), 3);
    kb_optimizer_config_t sgd = {.kind = KB_OPT_SGD, .learning_rate = 0.25f};
    kb_optimizer_config_defaults(&sgd);
    float w[2] = {1.0f, 1.0f};
    uint64_t steps = 0;
    kb_optimizer_step(&sgd, w, NULL, &steps, avg, 2);
    /* mean of kept = (1, 0); w = 1 - 0.25 * (1, 0) */
    assert_true(w[0] == 0.75f);
    assert_true(w[1] == 1.0f);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_design_example),
    cmocka_unit_test(test_outlier_dropped),
    cmocka_unit_test(test_threshold_boundary),
    cmocka_unit_test(test_even_count_median_is_mean_of_middle),
    cmocka_unit_test(test_exactly_min_count_filters),
    cmocka_unit_test(test_fewer_than_min_count_keeps_all),
    cmocka_unit_test(test_zero_median_keeps_all),
    cmocka_unit_test(test_multi_dim_rows),
    cmocka_unit_test(test_empty),
    cmocka_unit_test(test_small_threshold_keeps_median),
    cmocka_unit_test(test_nan_gradient_dropped),
    cmocka_unit_test(test_many_rows),
    cmocka_unit_test(test_matches_plain_definition),
    cmocka_unit_test(test_lazy_sgd_step_uses_mean))
