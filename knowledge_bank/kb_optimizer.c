/* Server-side optimizers for embedding rows (see kb_optimizer.h for the contract).
 *
 * Update rules, with g the gradient, t the step number after this step (1 for a row's first step):
 *   SGD       w -= lr * g
 *   momentum  m = momentum * m + g;                 w -= lr * m
 *   AdaGrad   a += g * g;                           w -= lr * g / (sqrt(a) + eps)
 *   Adam      m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g;
 *             mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t);   w -= lr * mhat / (sqrt(vhat) + eps)
 * Epsilon sits outside the square root in both AdaGrad and Adam, so it only guards against dividing by zero
 * and does not change the step of a row whose accumulator is large. */
#include "kb_optimizer.h"

#include "util.h"

#include <assert.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *s_names[] = {
    [KB_OPT_SGD] = "sgd",
    [KB_OPT_MOMENTUM] = "momentum",
    [KB_OPT_ADAGRAD] = "adagrad",
    [KB_OPT_ADAM] = "adam",
};
#define S_KIND_COUNT ((int)(sizeof(s_names) / sizeof(s_names[0])))

static bool s_kind_valid(kb_optimizer_kind_t kind)
{
    return (int)kind >= 0 && (int)kind < S_KIND_COUNT;
}

void kb_optimizer_config_defaults(kb_optimizer_config_t *cfg)
{
    assert(cfg);
    if (cfg->learning_rate == 0.0f)
        cfg->learning_rate = 0.01f;
    if (cfg->momentum == 0.0f)
        cfg->momentum = 0.9f;
    if (cfg->beta1 == 0.0f)
        cfg->beta1 = 0.9f;
    if (cfg->beta2 == 0.0f)
        cfg->beta2 = 0.999f;
    /* AdaGrad's accumulator starts at 0.1, so its denominator is never tiny and a slightly larger epsilon is
     * harmless; Adam's vhat can be near zero, where a smaller epsilon keeps the step close to lr. */
    if (cfg->epsilon == 0.0f)
        cfg->epsilon = cfg->kind == KB_OPT_ADAGRAD ? 1e-7f : 1e-8f;
    if (cfg->initial_accumulator == 0.0f)
        cfg->initial_accumulator = 0.1f;
}

/* Writes a message into err when the caller gave room for one; always returns -1. */
static int s_reject(char *err, size_t errlen, const char *what, float value)
{
    if (err && errlen > 0)
        snprintf(err, errlen, "optimizer: %s (got %g)", what, (double)value);
    return -1;
}

/* Only the fields the kind uses are checked, so a SGD table need not carry valid Adam parameters. The
 * comparisons are written so that NaN fails them (NaN compares false with everything). */
int kb_optimizer_config_validate(const kb_optimizer_config_t *cfg, char *err, size_t errlen)
{
    assert(cfg);
    if (!s_kind_valid(cfg->kind))
        return s_reject(err, errlen, "unknown optimizer kind", (float)cfg->kind);
    if (!(cfg->learning_rate >= 0.0f) || !isfinite(cfg->learning_rate))
        return s_reject(err, errlen, "learning_rate must be finite and >= 0", cfg->learning_rate);
    switch (cfg->kind) {
    case KB_OPT_SGD:
        break;
    case KB_OPT_MOMENTUM:
        if (!(cfg->momentum >= 0.0f && cfg->momentum < 1.0f))
            return s_reject(err, errlen, "momentum must be in [0, 1)", cfg->momentum);
        break;
    case KB_OPT_ADAGRAD:
        if (!(cfg->epsilon > 0.0f) || !isfinite(cfg->epsilon))
            return s_reject(err, errlen, "epsilon must be finite and > 0", cfg->epsilon);
        if (!(cfg->initial_accumulator >= 0.0f) || !isfinite(cfg->initial_accumulator))
            return s_reject(err, errlen, "initial_accumulator must be finite and >= 0", cfg->initial_accumulator);
        break;
    case KB_OPT_ADAM:
        if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f))
            return s_reject(err, errlen, "beta1 must be in [0, 1)", cfg->beta1);
        if (!(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
            return s_reject(err, errlen, "beta2 must be in [0, 1)", cfg->beta2);
        if (!(cfg->epsilon > 0.0f) || !isfinite(cfg->epsilon))
            return s_reject(err, errlen, "epsilon must be finite and > 0", cfg->epsilon);
        break;
    }
    if (err && errlen > 0)
        err[0] = '\0';
    return 0;
}

uint32_t kb_optimizer_state_floats(kb_optimizer_kind_t kind, uint32_t dim)
{
    switch (kind) {
    case KB_OPT_MOMENTUM:
    case KB_OPT_ADAGRAD:
        return dim;
    case KB_OPT_ADAM:
        return 2 * dim;
    case KB_OPT_SGD:
    default:
        return 0;
    }
}

void kb_optimizer_state_init(const kb_optimizer_config_t *cfg, float *state, uint32_t dim)
{
    assert(cfg);
    uint32_t n = kb_optimizer_state_floats(cfg->kind, dim);
    if (n == 0)
        return;
    assert(state);
    float fill = cfg->kind == KB_OPT_ADAGRAD ? cfg->initial_accumulator : 0.0f;
    for (uint32_t i = 0; i < n; i++)
        state[i] = fill;
}

void kb_optimizer_step(const kb_optimizer_config_t *cfg, float *weights, float *state, uint64_t *steps,
                       const float *grad, uint32_t dim)
{
    assert(cfg && weights && grad && steps);
    assert(state || kb_optimizer_state_floats(cfg->kind, dim) == 0);
    const float lr = cfg->learning_rate;
    const uint64_t t = ++*steps;

    switch (cfg->kind) {
    case KB_OPT_SGD:
        for (uint32_t i = 0; i < dim; i++)
            weights[i] -= lr * grad[i];
        break;
    case KB_OPT_MOMENTUM: {
        float *m = state; /* (dim) velocity */
        for (uint32_t i = 0; i < dim; i++) {
            m[i] = cfg->momentum * m[i] + grad[i];
            weights[i] -= lr * m[i];
        }
        break;
    }
    case KB_OPT_ADAGRAD: {
        float *a = state; /* (dim) sum of squared gradients, starting at initial_accumulator */
        for (uint32_t i = 0; i < dim; i++) {
            a[i] += grad[i] * grad[i];
            weights[i] -= lr * grad[i] / (sqrtf(a[i]) + cfg->epsilon);
        }
        break;
    }
    case KB_OPT_ADAM: {
        float *m = state;       /* (dim) first moment */
        float *v = state + dim; /* (dim) second moment */
        const float b1 = cfg->beta1, b2 = cfg->beta2;
        /* The bias corrections are computed in double: t can reach millions, and 1 - b2^t for b2 = 0.999 and
         * small t loses most of its digits in float. */
        const float c1 = (float)(1.0 - pow((double)b1, (double)t));
        const float c2 = (float)(1.0 - pow((double)b2, (double)t));
        for (uint32_t i = 0; i < dim; i++) {
            m[i] = b1 * m[i] + (1.0f - b1) * grad[i];
            v[i] = b2 * v[i] + (1.0f - b2) * grad[i] * grad[i];
            const float mhat = m[i] / c1;
            const float vhat = v[i] / c2;
            weights[i] -= lr * mhat / (sqrtf(vhat) + cfg->epsilon);
        }
        break;
    }
    default:
        assert(!"kb_optimizer_step: unknown optimizer kind");
        break;
    }
}

const char *kb_optimizer_name(kb_optimizer_kind_t kind)
{
    return s_kind_valid(kind) ? s_names[kind] : "unknown";
}

int kb_optimizer_parse(const char *name, kb_optimizer_kind_t *out)
{
    /* Case-insensitive so that config files may write "Adam" or "SGD". */
    const int k = carls_name_index(name, s_names, S_KIND_COUNT);
    if (k < 0)
        return -1;
    if (out)
        *out = (kb_optimizer_kind_t)k;
    return 0;
}
