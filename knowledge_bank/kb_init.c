/* Deterministic initial values for unseen keys (see kb_init.h).
 *
 * Stream: state = carls_hash64(key, key_len, seed); each value draws carls_splitmix64(&state). Changing any of
 * this (the hash, the order of draws, the bit slicing below) changes the initial value of every key that has
 * not been written yet, so a restarted server would hand out vectors that differ from the ones trainers saw;
 * tests/knowledge_bank/test_kb_init.c pins a golden value to catch that. */
#include "kb_init.h"

#include "util.h"

#include <assert.h>
#include <math.h>
#include <string.h>

static const char *s_names[] = {
    [KB_INIT_ZEROS] = "zeros",
    [KB_INIT_UNIFORM] = "uniform",
    [KB_INIT_NORMAL] = "normal",
};
#define S_KIND_COUNT ((int)(sizeof(s_names) / sizeof(s_names[0])))

/* The top 24 bits of a 64-bit draw as an integer in [0, 2^24). 24 bits is a float's full significand, so
 * converting it and scaling by 2^-24 are both exact: the result does not depend on the FPU's rounding. */
static uint32_t s_top24(uint64_t x)
{
    return (uint32_t)(x >> 40);
}

/* Uniform in [-1, 1): 2*k/2^24 - 1 = (k - 2^23) / 2^23, an integer of magnitude <= 2^23 times a power of
 * two, hence exact in float. */
static float s_uniform_pm1(uint64_t x)
{
    return (float)((int32_t)s_top24(x) - (1 << 23)) * 0x1p-23f;
}

void kb_init_value(kb_init_kind_t kind, float scale, uint64_t seed, const void *key, size_t key_len, float *out,
                   uint32_t dim)
{
    assert(out || dim == 0);
    assert(key || key_len == 0);
    uint64_t state = carls_hash64(key, key_len, seed);

    switch (kind) {
    case KB_INIT_UNIFORM:
        /* |scale * u| <= |scale| because rounding is monotonic and |u| <= 1. */
        for (uint32_t i = 0; i < dim; i++)
            out[i] = scale * s_uniform_pm1(carls_splitmix64(&state));
        break;
    case KB_INIT_NORMAL:
        /* Box-Muller: two uniforms give two independent standard normals. u1 is taken in (0, 1] so log(u1)
         * is finite; the trig and log run in double so the float result is the correctly rounded value on
         * any reasonable libm. An odd dim discards the last pair's second value. */
        for (uint32_t i = 0; i < dim; i += 2) {
            double u1 = ((double)s_top24(carls_splitmix64(&state)) + 1.0) * 0x1p-24;
            double u2 = (double)s_top24(carls_splitmix64(&state)) * 0x1p-24;
            double r = sqrt(-2.0 * log(u1));
            double a = 2.0 * M_PI * u2;
            out[i] = (float)((double)scale * r * cos(a));
            if (i + 1 < dim)
                out[i + 1] = (float)((double)scale * r * sin(a));
        }
        break;
    case KB_INIT_ZEROS:
    default:
        /* An unknown kind is a programmer error; zeros are the least surprising value in a release build. */
        assert(kind == KB_INIT_ZEROS);
        if (dim)
            memset(out, 0, (size_t)dim * sizeof(float));
        break;
    }
}

const char *kb_init_name(kb_init_kind_t kind)
{
    return (int)kind >= 0 && (int)kind < S_KIND_COUNT ? s_names[kind] : "unknown";
}

int kb_init_parse(const char *name, kb_init_kind_t *out)
{
    const int k = carls_name_index(name, s_names, S_KIND_COUNT);
    if (k < 0)
        return -1;
    if (out)
        *out = (kb_init_kind_t)k;
    return 0;
}
