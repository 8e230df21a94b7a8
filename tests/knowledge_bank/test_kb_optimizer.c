/* Unit tests for kb_optimizer: every optimizer against a plain double-precision reference written here from
 * the textbook formulas, plus defaults, validation, state layout and names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kb_optimizer.h"

#define DIM 5
#define STEPS 4

/* Four distinct gradients, mixed signs and magnitudes (including a zero entry, which AdaGrad and Adam must
 * handle without dividing by zero). */
static const float s_grads[STEPS][DIM] = {
    {0.5f, -1.25f, 2.0f, 0.0f, 0.03f},
    {-0.75f, 0.4f, 1.5f, 3.0f, -0.02f},
    {0.1f, -2.5f, -0.6f, 0.25f, 0.05f},
    {1.2f, 0.9f, -0.3f, -1.75f, 0.0f},
};
static const float s_w0[DIM] = {0.3f, -0.7f, 1.1f, 0.05f, -2.0f};

/* Asserts |got - want| <= 1e-6 relative (with an absolute floor of 1e-6 for values near zero). */
static void s_assert_close(double got, double want, const char *what, int step, int i)
{
    double tol = 1e-6 * fmax(fabs(want), 1.0);
    if (fabs(got - want) > tol) {
        print_error("%s step %d [%d]: got %.9g want %.9g\n", what, step, i, got, want);
        fail();
    }
}

/* Reference state for one row, all double. */
typedef struct {
    double w[DIM];
    double m[DIM]; /* momentum velocity or Adam first moment */
    double v[DIM]; /* Adam second moment or AdaGrad accumulator */
} s_ref_t;

/* One textbook step of cfg's optimizer on ref at step number t (1-based). */
static void s_ref_step(const kb_optimizer_config_t *cfg, s_ref_t *ref, const float *g32, int t)
{
    double lr = cfg->learning_rate;
    for (int i = 0; i < DIM; i++) {
        double g = g32[i];
        switch (cfg->kind) {
        case KB_OPT_SGD:
            ref->w[i] -= lr * g;
            break;
        case KB_OPT_MOMENTUM:
            ref->m[i] = cfg->momentum * ref->m[i] + g;
            ref->w[i] -= lr * ref->m[i];
            break;
        case KB_OPT_ADAGRAD:
            ref->v[i] += g * g;
            ref->w[i] -= lr * g / (sqrt(ref->v[i]) + cfg->epsilon);
            break;
        case KB_OPT_ADAM: {
            double b1 = cfg->beta1, b2 = cfg->beta2;
            ref->m[i] = b1 * ref->m[i] + (1 - b1) * g;
            ref->v[i] = b2 * ref->v[i] + (1 - b2) * g * g;
            double mhat = ref->m[i] / (1 - pow(b1, t));
            double vhat = ref->v[i] / (1 - pow(b2, t));
            ref->w[i] -= lr * mhat / (sqrt(vhat) + cfg->epsilon);
            break;
        }
        }
    }
}

/* With the defaults filled into cfg's zero fields: runs STEPS steps of the real optimizer and of the
 * reference side by side, comparing weights and state after each step; also checks the weights really moved
 * away from the start (so a no-op cannot pass). */
static void s_check_against_reference(kb_optimizer_config_t cfg)
{
    kb_optimizer_config_defaults(&cfg);
    char err[128];
    assert_int_equal(kb_optimizer_config_validate(&cfg, err, sizeof err), 0);

    float w[DIM], state[2 * DIM];
    memcpy(w, s_w0, sizeof w);
    uint32_t nstate = kb_optimizer_state_floats(cfg.kind, DIM);
    for (uint32_t i = 0; i < 2 * DIM; i++)
        state[i] = -999.0f; /* state_init must overwrite every slot it owns */
    kb_optimizer_state_init(&cfg, state, DIM);
    uint64_t steps = 0;

    s_ref_t ref;
    for (int i = 0; i < DIM; i++) {
        ref.w[i] = s_w0[i];
        ref.m[i] = 0.0;
        ref.v[i] = cfg.kind == KB_OPT_ADAGRAD ? (double)cfg.initial_accumulator : 0.0;
    }

    for (int t = 1; t <= STEPS; t++) {
        kb_optimizer_step(&cfg, w, nstate ? state : NULL, &steps, s_grads[t - 1], DIM);
        s_ref_step(&cfg, &ref, s_grads[t - 1], t);
        assert_int_equal(steps, (uint64_t)t);
        for (int i = 0; i < DIM; i++) {
            s_assert_close(w[i], ref.w[i], kb_optimizer_name(cfg.kind), t, i);
            switch (cfg.kind) {
            case KB_OPT_SGD:
                break;
            case KB_OPT_MOMENTUM:
                s_assert_close(state[i], ref.m[i], "momentum velocity", t, i);
                break;
            case KB_OPT_ADAGRAD:
                s_assert_close(state[i], ref.v[i], "adagrad accumulator", t, i);
                break;
            case KB_OPT_ADAM:
                s_assert_close(state[i], ref.m[i], "adam m", t, i);
                s_assert_close(state[DIM + i], ref.v[i], "adam v", t, i);
                break;
            }
        }
    }
    /* Coordinates 0..2 get non-zero gradients every step; each must have moved well beyond the tolerance. */
    for (int i = 0; i < 3; i++)
        assert_true(fabs((double)w[i] - (double)s_w0[i]) > 1e-3);
}

static void test_sgd_matches_reference(void **st)
{
    (void)st;
    s_check_against_reference((kb_optimizer_config_t){.kind = KB_OPT_SGD, .learning_rate = 0.1f});
}

static void test_momentum_matches_reference(void **st)
{
    (void)st;
    s_check_against_reference(
        (kb_optimizer_config_t){.kind = KB_OPT_MOMENTUM, .learning_rate = 0.05f, .momentum = 0.8f});
}

static void test_adagrad_matches_reference(void **st)
{
    (void)st;
    s_check_against_reference((kb_optimizer_config_t){.kind = KB_OPT_ADAGRAD, .learning_rate = 0.2f});
    /* And with a non-default accumulator and epsilon, so both really reach the formula. */
    s_check_against_reference((kb_optimizer_config_t){
        .kind = KB_OPT_ADAGRAD, .learning_rate = 0.2f, .initial_accumulator = 0.5f, .epsilon = 0.01f});
}

static void test_adam_matches_reference(void **st)
{
    (void)st;
    s_check_against_reference((kb_optimizer_config_t){.kind = KB_OPT_ADAM, .learning_rate = 0.1f});
    /* Non-default betas and a large epsilon make a wrong epsilon placement or bias correction visible. */
    s_check_against_reference((kb_optimizer_config_t){
        .kind = KB_OPT_ADAM, .learning_rate = 0.1f, .beta1 = 0.5f, .beta2 = 0.7f, .epsilon = 0.1f});
}

/* Adam's first step, bias-corrected, is lr * g / (|g| + eps): about lr in the direction of -g whatever |g|. */
static void test_adam_first_step_is_lr_sized(void **st)
{
    (void)st;
    kb_optimizer_config_t cfg = {.kind = KB_OPT_ADAM, .learning_rate = 0.01f};
    kb_optimizer_config_defaults(&cfg);
    float w[3] = {0, 0, 0}, state[6] = {0};
    const float g[3] = {1e-3f, -50.0f, 2.0f};
    uint64_t steps = 0;
    kb_optimizer_step(&cfg, w, state, &steps, g, 3);
    assert_float_equal(w[0], -0.01f, 1e-6);
    assert_float_equal(w[1], 0.01f, 1e-6);
    assert_float_equal(w[2], -0.01f, 1e-6);
}

/* Adam's bias correction follows the row's own step count: a row that resumes at step 1000 (as after a
 * reload) must use 1 - beta^1001, not restart at 1. */
static void test_adam_uses_persisted_steps(void **st)
{
    (void)st;
    kb_optimizer_config_t cfg = {.kind = KB_OPT_ADAM, .learning_rate = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f};
    kb_optimizer_config_defaults(&cfg);
    float w[1] = {1.0f}, state[2] = {0.2f, 0.04f};
    const float g[1] = {0.5f};
    uint64_t steps = 1000;
    kb_optimizer_step(&cfg, w, state, &steps, g, 1);
    assert_int_equal(steps, 1001);
    double m = 0.9 * 0.2 + 0.1 * 0.5, v = 0.999 * 0.04 + 0.001 * 0.25;
    double mhat = m / (1 - pow(0.9, 1001)), vhat = v / (1 - pow(0.999, 1001));
    double want = 1.0 - 0.1 * mhat / (sqrt(vhat) + (double)cfg.epsilon);
    s_assert_close(w[0], want, "adam resumed", 1001, 0);
}

static void test_defaults_fill_zero_fields(void **st)
{
    (void)st;
    kb_optimizer_config_t adam = {.kind = KB_OPT_ADAM};
    kb_optimizer_config_defaults(&adam);
    assert_float_equal(adam.learning_rate, 0.01f, 0);
    assert_float_equal(adam.momentum, 0.9f, 0);
    assert_float_equal(adam.beta1, 0.9f, 0);
    assert_float_equal(adam.beta2, 0.999f, 0);
    assert_float_equal(adam.epsilon, 1e-8f, 0);
    assert_float_equal(adam.initial_accumulator, 0.1f, 0);
    assert_int_equal(kb_optimizer_config_validate(&adam, NULL, 0), 0);

    kb_optimizer_config_t ada = {.kind = KB_OPT_ADAGRAD};
    kb_optimizer_config_defaults(&ada);
    assert_float_equal(ada.epsilon, 1e-7f, 0);
    assert_float_equal(ada.initial_accumulator, 0.1f, 0);

    /* Fields already set are left alone. */
    kb_optimizer_config_t set = {
        .kind = KB_OPT_ADAM, .learning_rate = 0.5f, .beta1 = 0.3f, .beta2 = 0.6f, .epsilon = 1e-3f};
    kb_optimizer_config_defaults(&set);
    assert_float_equal(set.learning_rate, 0.5f, 0);
    assert_float_equal(set.beta1, 0.3f, 0);
    assert_float_equal(set.beta2, 0.6f, 0);
    assert_float_equal(set.epsilon, 1e-3f, 0);
}

/* Validates cfg, expecting rejection with a non-empty message. */
static void s_expect_reject(kb_optimizer_config_t cfg)
{
    char err[128] = "";
    assert_int_equal(kb_optimizer_config_validate(&cfg, err, sizeof err), -1);
    assert_true(strlen(err) > 0);
}

/* A config that must be refused: kind's defaults with one float field (at offset field) set to value. */
typedef struct {
    kb_optimizer_kind_t kind;
    size_t field;
    float value;
} s_bad_field_t;

#define S_FIELD(name) offsetof(kb_optimizer_config_t, name)

static const s_bad_field_t s_bad_fields[] = {
    {KB_OPT_MOMENTUM, S_FIELD(momentum), 1.0f},
    {KB_OPT_MOMENTUM, S_FIELD(momentum), -0.1f},
    {KB_OPT_MOMENTUM, S_FIELD(momentum), NAN},
    {KB_OPT_ADAM, S_FIELD(beta1), 1.0f},
    {KB_OPT_ADAM, S_FIELD(beta2), 1.5f},
    {KB_OPT_ADAM, S_FIELD(beta2), -0.5f},
    {KB_OPT_ADAM, S_FIELD(epsilon), 0.0f},
    {KB_OPT_ADAM, S_FIELD(epsilon), -1e-8f},
    {KB_OPT_ADAGRAD, S_FIELD(epsilon), 0.0f},
    {KB_OPT_ADAGRAD, S_FIELD(initial_accumulator), -1.0f},
};

/* kind's documented defaults (valid). */
static kb_optimizer_config_t s_defaults(kb_optimizer_kind_t kind)
{
    kb_optimizer_config_t cfg = {.kind = kind};
    kb_optimizer_config_defaults(&cfg);
    assert_int_equal(kb_optimizer_config_validate(&cfg, NULL, 0), 0);
    return cfg;
}

static void test_validate_rejects_bad_ranges(void **st)
{
    (void)st;
    static const float bad_lr[] = {-0.1f, NAN, INFINITY};
    for (int k = KB_OPT_SGD; k <= KB_OPT_ADAM; k++) {
        for (size_t i = 0; i < sizeof bad_lr / sizeof bad_lr[0]; i++) {
            kb_optimizer_config_t c = s_defaults((kb_optimizer_kind_t)k);
            c.learning_rate = bad_lr[i];
            s_expect_reject(c);
        }
    }
    for (size_t i = 0; i < sizeof s_bad_fields / sizeof s_bad_fields[0]; i++) {
        kb_optimizer_config_t c = s_defaults(s_bad_fields[i].kind);
        memcpy((char *)&c + s_bad_fields[i].field, &s_bad_fields[i].value, sizeof(float));
        s_expect_reject(c);
    }

    /* Boundaries that are allowed: lr 0 (frozen table), momentum and betas 0. */
    kb_optimizer_config_t c = {.kind = KB_OPT_ADAM, .learning_rate = 0.0f, .beta1 = 0.0f, .beta2 = 0.0f,
                               .epsilon = 1e-8f};
    assert_int_equal(kb_optimizer_config_validate(&c, NULL, 0), 0);

    c = s_defaults(KB_OPT_ADAGRAD);
    c.kind = (kb_optimizer_kind_t)17;
    s_expect_reject(c);
}

static void test_state_floats_and_init(void **st)
{
    (void)st;
    assert_int_equal(kb_optimizer_state_floats(KB_OPT_SGD, 7), 0);
    assert_int_equal(kb_optimizer_state_floats(KB_OPT_MOMENTUM, 7), 7);
    assert_int_equal(kb_optimizer_state_floats(KB_OPT_ADAGRAD, 7), 7);
    assert_int_equal(kb_optimizer_state_floats(KB_OPT_ADAM, 7), 14);

    /* Each kind's state of a dim-4 or dim-3 row: n_state floats set to `initial`, nothing written past them. */
    static const struct {
        kb_optimizer_config_t cfg;
        size_t dim, n_state;
        float initial;
    } inits[] = {
        {{.kind = KB_OPT_ADAGRAD, .initial_accumulator = 0.25f}, 4, 4, 0.25f},
        {{.kind = KB_OPT_ADAM}, 4, 8, 0.0f},
        {{.kind = KB_OPT_MOMENTUM}, 3, 3, 0.0f},
    };
    for (size_t k = 0; k < sizeof inits / sizeof inits[0]; k++) {
        float s[9];
        for (int i = 0; i < 9; i++)
            s[i] = 42.0f;
        kb_optimizer_config_t cfg = inits[k].cfg;
        kb_optimizer_config_defaults(&cfg);
        kb_optimizer_state_init(&cfg, s, (uint32_t)inits[k].dim);
        for (size_t i = 0; i < inits[k].n_state; i++)
            assert_float_equal(s[i], inits[k].initial, 0);
        assert_float_equal(s[inits[k].n_state], 42.0f, 0);
    }

    /* SGD has no state: a NULL pointer is fine. */
    kb_optimizer_config_t sgd = {.kind = KB_OPT_SGD};
    kb_optimizer_state_init(&sgd, NULL, 4);
}

static void test_names_round_trip(void **st)
{
    (void)st;
    const char *want[] = {"sgd", "momentum", "adagrad", "adam"};
    for (int k = KB_OPT_SGD; k <= KB_OPT_ADAM; k++) {
        const char *name = kb_optimizer_name((kb_optimizer_kind_t)k);
        assert_string_equal(name, want[k]);
        kb_optimizer_kind_t back = (kb_optimizer_kind_t)-1;
        assert_int_equal(kb_optimizer_parse(name, &back), 0);
        assert_int_equal(back, k);
    }
    kb_optimizer_kind_t out = KB_OPT_ADAM;
    assert_int_equal(kb_optimizer_parse("Adam", &out), 0);
    assert_int_equal(out, KB_OPT_ADAM);
    out = KB_OPT_MOMENTUM;
    assert_int_equal(kb_optimizer_parse("rmsprop", &out), -1);
    assert_int_equal(out, KB_OPT_MOMENTUM); /* untouched on failure */
    assert_int_equal(kb_optimizer_parse("", &out), -1);
    assert_int_equal(kb_optimizer_parse(NULL, &out), -1);
    assert_string_equal(kb_optimizer_name((kb_optimizer_kind_t)99), "unknown");
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_sgd_matches_reference),
    cmocka_unit_test(test_momentum_matches_reference),
    cmocka_unit_test(test_adagrad_matches_reference),
    cmocka_unit_test(test_adam_matches_reference),
    cmocka_unit_test(test_adam_first_step_is_lr_sized),
    cmocka_unit_test(test_adam_uses_persisted_steps),
    cmocka_unit_test(test_defaults_fill_zero_fields),
    cmocka_unit_test(test_validate_rejects_bad_ranges),
    cmocka_unit_test(test_state_floats_and_init),
    cmocka_unit_test(test_names_round_trip))
