/* Dense optimisers (nn_sgd_update_cpu, nn_adam_update_cpu) against hand-computed first steps and against an
 * independent double-precision reference over several steps with changing gradients. */
#include "nn_ops.h"
#include "nn_testlib.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

#define N 16
#define STEPS 7

static void test_sgd_first_step_by_hand(void **state)
{
    (void)state;
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f}, mom[2] = {0, 0};
    nn_sgd_update_cpu(p, g, mom, 0.1f, 0.9f, 0.01f, 2);
    /* g' = g + 0.01 p = (0.51, 0.23); mom = g'; p -= 0.1 mom */
    assert_float_equal(mom[0], 0.51f, 1e-7);
    assert_float_equal(mom[1], 0.23f, 1e-7);
    assert_float_equal(p[0], 0.949f, 1e-7);
    assert_float_equal(p[1], -2.023f, 1e-6);
    /* Second step with the same gradient: mom = 0.9 * mom + g'' */
    nn_sgd_update_cpu(p, g, mom, 0.1f, 0.9f, 0.01f, 2);
    float g2 = 0.5f + 0.01f * 0.949f;
    assert_float_equal(mom[0], 0.9f * 0.51f + g2, 1e-6);
    assert_float_equal(p[0], 0.949f - 0.1f * (0.9f * 0.51f + g2), 1e-6);
    /* momentum 0 without a buffer is plain SGD */
    float q[1] = {3.0f}, gq[1] = {1.0f};
    nn_sgd_update_cpu(q, gq, NULL, 0.5f, 0.0f, 0.0f, 1);
    assert_float_equal(q[0], 2.5f, 0.0);
}

static void test_adam_first_step_by_hand(void **state)
{
    (void)state;
    /* At t = 1 the bias-corrected update is lr * g / (|g| + eps): about lr * sign(g), whatever |g|. */
    float p[3] = {1.0f, 1.0f, 1.0f}, g[3] = {1e-3f, -5.0f, 0.0f}, m[3] = {0}, v[3] = {0};
    nn_adam_update_cpu(p, g, m, v, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 3);
    assert_float_equal(p[0], 1.0f - 0.01f, 1e-6);
    assert_float_equal(p[1], 1.0f + 0.01f, 1e-6);
    assert_float_equal(p[2], 1.0f, 0.0);
    assert_float_equal(m[1], -0.5f, 1e-6);
    assert_float_equal(v[1], 0.025f, 1e-6);
    /* Decoupled weight decay: with g = 0 the step is exactly lr * wd * p. */
    float q[1] = {2.0f}, gz[1] = {0}, mq[1] = {0}, vq[1] = {0};
    nn_adam_update_cpu(q, gz, mq, vq, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1, 1);
    assert_float_equal(q[0], 2.0f - 0.1f * 0.5f * 2.0f, 1e-6);
}

/* A gradient that changes with the step and the parameter: g = 0.3 p + sin(i + t). */
static double s_grad(double p, int i, int t)
{
    return 0.3 * p + sin((double)i + t);
}

static void test_sgd_matches_reference(void **state)
{
    (void)state;
    uint64_t rng = 11;
    float p[N], g[N], mom[N] = {0};
    double rp[N], rm[N] = {0};
    t_fill_uniform(p, N, -1, 1, &rng);
    for (int i = 0; i < N; i++) {
        rp[i] = p[i];
    }
    const double lr = 0.05, mu = 0.8, wd = 0.02;
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)s_grad(p[i], i, t);
            double rg = s_grad(rp[i], i, t) + wd * rp[i];
            rm[i] = mu * rm[i] + rg;
            rp[i] -= lr * rm[i];
        }
        nn_sgd_update_cpu(p, g, mom, (float)lr, (float)mu, (float)wd, N);
    }
    for (int i = 0; i < N; i++) {
        assert_float_equal(p[i], rp[i], 1e-5);
        assert_float_equal(mom[i], rm[i], 1e-5);
    }
}

static void test_adam_matches_reference(void **state)
{
    (void)state;
    uint64_t rng = 12;
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0};
    t_fill_uniform(p, N, -1, 1, &rng);
    for (int i = 0; i < N; i++) {
        rp[i] = p[i];
    }
    const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-6, wd = 0.1;
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)s_grad(p[i], i, t);
            double rg = s_grad(rp[i], i, t);
            rm[i] = b1 * rm[i] + (1 - b1) * rg;
            rv[i] = b2 * rv[i] + (1 - b2) * rg * rg;
            double mhat = rm[i] / (1 - pow(b1, t));
            double vhat = rv[i] / (1 - pow(b2, t));
            rp[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * rp[i]);
        }
        nn_adam_update_cpu(p, g, m, v, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t, N);
    }
    for (int i = 0; i < N; i++) {
        assert_float_equal(p[i], rp[i], 1e-5);
        assert_float_equal(m[i], rm[i], 1e-5);
        assert_float_equal(v[i], rv[i], 1e-5);
    }
}

static void test_both_minimise_a_quadratic(void **state)
{
    (void)state;
    /* f(p) = 0.5 * sum (p - c)^2, gradient p - c: both optimisers must get close to c. */
    float c[4] = {1, -2, 3, 0.5f};
    float ps[4] = {0}, pa[4] = {0}, g[4], mom[4] = {0}, m[4] = {0}, v[4] = {0};
    for (int t = 1; t <= 500; t++) {
        for (int i = 0; i < 4; i++) {
            g[i] = ps[i] - c[i];
        }
        nn_sgd_update_cpu(ps, g, mom, 0.05f, 0.9f, 0.0f, 4);
        for (int i = 0; i < 4; i++) {
            g[i] = pa[i] - c[i];
        }
        nn_adam_update_cpu(pa, g, m, v, 0.05f, 0.9f, 0.999f, 1e-8f, 0.0f, t, 4);
    }
    for (int i = 0; i < 4; i++) {
        assert_float_equal(ps[i], c[i], 1e-3);
        assert_float_equal(pa[i], c[i], 2e-2);
    }
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_sgd_first_step_by_hand), cmocka_unit_test(test_adam_first_step_by_hand),
    cmocka_unit_test(test_sgd_matches_reference),  cmocka_unit_test(test_adam_matches_reference),
    cmocka_unit_test(test_both_minimise_a_quadratic))
