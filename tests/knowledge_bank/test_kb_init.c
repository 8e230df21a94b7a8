/* Unit tests for kb_init: determinism, ranges and moments of the distributions, names, and a golden value that
 * pins the hashing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kb_init.h"

/* Fills key with "key-<i>" and returns its length. */
static size_t s_key(char *buf, size_t cap, int i)
{
    int n = snprintf(buf, cap, "key-%d", i);
    assert_true(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

static void test_same_key_same_bits(void **st)
{
    (void)st;
    for (int kind = KB_INIT_UNIFORM; kind <= KB_INIT_NORMAL; kind++) {
        float a[16], b[16];
        kb_init_value((kb_init_kind_t)kind, 0.1f, 7, "user:1234", 9, a, 16);
        kb_init_value((kb_init_kind_t)kind, 0.1f, 7, "user:1234", 9, b, 16);
        assert_memory_equal(a, b, sizeof a);
        /* A prefix of a longer vector: the stream is the same, so the first values agree. */
        float c[5];
        kb_init_value((kb_init_kind_t)kind, 0.1f, 7, "user:1234", 9, c, 5);
        assert_memory_equal(a, c, sizeof c);
        /* And the values are not all equal to each other (a constant vector would pass the bit check). */
        int distinct = 0;
        for (int i = 1; i < 16; i++)
            distinct += a[i] != a[0];
        assert_true(distinct >= 14);
    }
}

static void test_different_key_or_seed_differs(void **st)
{
    (void)st;
    for (int kind = KB_INIT_UNIFORM; kind <= KB_INIT_NORMAL; kind++) {
        float base[8], other_key[8], other_seed[8], one_byte_more[8];
        kb_init_value((kb_init_kind_t)kind, 1.0f, 0, "apple", 5, base, 8);
        kb_init_value((kb_init_kind_t)kind, 1.0f, 0, "apply", 5, other_key, 8);
        kb_init_value((kb_init_kind_t)kind, 1.0f, 1, "apple", 5, other_seed, 8);
        kb_init_value((kb_init_kind_t)kind, 1.0f, 0, "apple\0", 6, one_byte_more, 8);
        /* Each pair must differ in (practically) every coordinate, not just one. */
        int d_key = 0, d_seed = 0, d_len = 0;
        for (int i = 0; i < 8; i++) {
            d_key += base[i] != other_key[i];
            d_seed += base[i] != other_seed[i];
            d_len += base[i] != one_byte_more[i];
        }
        assert_int_equal(d_key, 8);
        assert_int_equal(d_seed, 8);
        assert_int_equal(d_len, 8);
    }
}

static void test_scale_scales(void **st)
{
    (void)st;
    /* Same key and seed: the vector for scale 2 is exactly twice the one for scale 1 (scaling by a power of
     * two is exact), so the scale is applied after the draw and does not perturb the stream. */
    float one[6], two[6];
    kb_init_value(KB_INIT_UNIFORM, 1.0f, 3, "k", 1, one, 6);
    kb_init_value(KB_INIT_UNIFORM, 2.0f, 3, "k", 1, two, 6);
    for (int i = 0; i < 6; i++)
        assert_true(two[i] == 2.0f * one[i]);
}

static void test_zeros(void **st)
{
    (void)st;
    float v[7];
    for (int i = 0; i < 7; i++)
        v[i] = 123.0f;
    kb_init_value(KB_INIT_ZEROS, 0.5f, 99, "anything", 8, v, 7);
    for (int i = 0; i < 7; i++)
        assert_true(v[i] == 0.0f && !signbit(v[i]));
}

/* 4000 keys x dim 8 = 32000 values. For U[-s, s]: mean 0, variance s^2/3 (sd of one value s/sqrt(3)).
 * The sample mean's standard error is s/sqrt(3*32000) ~ 0.0032 s; 5 standard errors is ~0.016 s. The sample
 * variance's standard error is sqrt((mu4 - sigma^4)/n) with mu4 = s^4/5, i.e. s^2 * sqrt(4/45/32000) ~ 0.0017 s^2;
 * we allow 0.01 s^2 (about 6 standard errors). The chance that a correct generator fails is below 1e-6. */
static void test_uniform_range_and_moments(void **st)
{
    (void)st;
    const float s = 0.05f;
    const int keys = 4000, dim = 8;
    double sum = 0.0, sumsq = 0.0;
    float lo = 1.0f, hi = -1.0f;
    char key[32];
    for (int k = 0; k < keys; k++) {
        float v[8];
        kb_init_value(KB_INIT_UNIFORM, s, 0, key, s_key(key, sizeof key, k), v, (uint32_t)dim);
        for (int i = 0; i < dim; i++) {
            assert_true(v[i] >= -s && v[i] <= s);
            lo = fminf(lo, v[i]);
            hi = fmaxf(hi, v[i]);
            sum += v[i];
            sumsq += (double)v[i] * v[i];
        }
    }
    double n = (double)keys * dim;
    double mean = sum / n, var = sumsq / n - mean * mean;
    assert_true(fabs(mean) < 0.016 * s);
    assert_true(fabs(var - s * s / 3.0) < 0.01 * s * s);
    /* The extremes are reached to within a small fraction of the range (32000 draws leave gaps ~s/16000). */
    assert_true(lo < -0.999f * s && hi > 0.999f * s);
}

/* 2500 keys x dim 8 = 20000 values, N(0, s^2). Mean: standard error s/sqrt(20000) ~ 0.0071 s, allow 0.035 s
 * (~5 SE). SD: standard error of the sample sd ~ s/sqrt(2n) = 0.005 s, allow 0.025 s (~5 SE). Also the fraction
 * within one sd should be 0.6827, SE sqrt(p(1-p)/n) ~ 0.0033, allow 0.017; and a fourth moment near 3 s^4
 * (kurtosis: SE ~ sqrt(24/n) ~ 0.035, allow 0.2) so a uniform with the right variance (kurtosis 1.8) cannot pass. */
static void test_normal_moments(void **st)
{
    (void)st;
    const float s = 0.3f;
    const int keys = 2500, dim = 8;
    double sum = 0.0, sumsq = 0.0, sum4 = 0.0;
    int within = 0;
    char key[32];
    for (int k = 0; k < keys; k++) {
        float v[8];
        kb_init_value(KB_INIT_NORMAL, s, 42, key, s_key(key, sizeof key, k), v, (uint32_t)dim);
        for (int i = 0; i < dim; i++) {
            assert_true(isfinite(v[i]));
            double x = v[i];
            sum += x;
            sumsq += x * x;
            sum4 += x * x * x * x;
            within += fabs(x) <= s;
        }
    }
    double n = (double)keys * dim;
    double mean = sum / n;
    double sd = sqrt(sumsq / n - mean * mean);
    double kurt = (sum4 / n) / pow(sumsq / n, 2);
    assert_true(fabs(mean) < 0.035 * s);
    assert_true(fabs(sd - s) < 0.025 * s);
    assert_true(fabs(within / n - 0.682689) < 0.017);
    assert_true(fabs(kurt - 3.0) < 0.2);
}

/* An odd dim still fills every value (the last Box-Muller pair is half used). */
static void test_normal_odd_dim(void **st)
{
    (void)st;
    float v[5], w[6];
    for (int i = 0; i < 5; i++)
        v[i] = NAN;
    kb_init_value(KB_INIT_NORMAL, 1.0f, 0, "odd", 3, v, 5);
    kb_init_value(KB_INIT_NORMAL, 1.0f, 0, "odd", 3, w, 6);
    for (int i = 0; i < 5; i++)
        assert_true(v[i] == w[i]);
}

static void test_keys_with_nul_bytes(void **st)
{
    (void)st;
    /* Keys are byte strings: "a\0b" and "a\0c" differ after the NUL and must get different vectors, and the
     * result must not stop at the first NUL (so "a\0b" differs from "a"). */
    const char k1[] = {'a', '\0', 'b'};
    const char k2[] = {'a', '\0', 'c'};
    float v1[4], v2[4], v3[4], again[4];
    kb_init_value(KB_INIT_UNIFORM, 1.0f, 5, k1, sizeof k1, v1, 4);
    kb_init_value(KB_INIT_UNIFORM, 1.0f, 5, k2, sizeof k2, v2, 4);
    kb_init_value(KB_INIT_UNIFORM, 1.0f, 5, "a", 1, v3, 4);
    kb_init_value(KB_INIT_UNIFORM, 1.0f, 5, k1, sizeof k1, again, 4);
    assert_memory_equal(v1, again, sizeof v1);
    assert_memory_not_equal(v1, v2, sizeof v1);
    assert_memory_not_equal(v1, v3, sizeof v1);
    /* The empty key is a key too. */
    float e[4];
    kb_init_value(KB_INIT_UNIFORM, 1.0f, 5, "", 0, e, 4);
    for (int i = 0; i < 4; i++)
        assert_true(e[i] >= -1.0f && e[i] <= 1.0f);
}

/* GOLDEN VALUE. These four floats were computed once with this implementation (key "sheep", seed 0, uniform,
 * scale 0.05, dim 4) and are compared bit for bit. If this test fails, the hashing or the draw changed: every
 * key that has never been written would now get a different initial value than before, so vectors served by
 * an old and a new server (or before and after a restart) would disagree. Do not just update the numbers;
 * only change them for a deliberate, versioned format change. */
static void test_golden_sheep(void **st)
{
    (void)st;
    /* -0.0110603273, -0.0335291587, 0.00347549329, 0.00825865846; hex so that no decimal rounding is involved.
     * Cross-checked once against an independent Python transcription of FNV-1a + splitmix64 + the 24-bit
     * draw. */
    const float want[4] = {-0x1.6a6ccp-7f, -0x1.12abbep-5f, 0x1.c78a34p-9f, 0x1.0e9ea6p-7f};
    float v[4];
    kb_init_value(KB_INIT_UNIFORM, 0.05f, 0, "sheep", 5, v, 4);
    for (int i = 0; i < 4; i++) {
        if (memcmp(&v[i], &want[i], sizeof(float)) != 0) {
            print_error("sheep[%d] = %a (%.9g), golden %a (%.9g)\n", i, (double)v[i], (double)v[i],
                        (double)want[i], (double)want[i]);
            fail();
        }
    }
}

static void test_names_round_trip(void **st)
{
    (void)st;
    const char *want[] = {"zeros", "uniform", "normal"};
    for (int k = KB_INIT_ZEROS; k <= KB_INIT_NORMAL; k++) {
        assert_string_equal(kb_init_name((kb_init_kind_t)k), want[k]);
        kb_init_kind_t back = (kb_init_kind_t)-1;
        assert_int_equal(kb_init_parse(want[k], &back), 0);
        assert_int_equal(back, k);
    }
    kb_init_kind_t out = KB_INIT_NORMAL;
    assert_int_equal(kb_init_parse("gaussian", &out), -1);
    assert_int_equal(out, KB_INIT_NORMAL);
    assert_int_equal(kb_init_parse(NULL, &out), -1);
    assert_string_equal(kb_init_name((kb_init_kind_t)9), "unknown");
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_same_key_same_bits),
    cmocka_unit_test(test_different_key_or_seed_differs),
    cmocka_unit_test(test_scale_scales),
    cmocka_unit_test(test_zeros),
    cmocka_unit_test(test_uniform_range_and_moments),
    cmocka_unit_test(test_normal_moments),
    cmocka_unit_test(test_normal_odd_dim),
    cmocka_unit_test(test_keys_with_nul_bytes),
    cmocka_unit_test(test_golden_sheep),
    cmocka_unit_test(test_names_round_trip))
