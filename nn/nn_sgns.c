/* Skip-gram with negative sampling over one minibatch (see nn_sgns.h). */
#include "nn_sgns.h"

#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SIGMOID_TABLE 2048
#define SIGMOID_MAX 8.0f

static float s_sigmoid[SIGMOID_TABLE + 1];   /* sigmoid(x) at x = -8 + 16 i / SIGMOID_TABLE */
static float s_log_sigmoid[SIGMOID_TABLE + 1];
static pthread_once_t s_tables_once = PTHREAD_ONCE_INIT;

static void s_tables_init(void)
{
    for (int i = 0; i <= SIGMOID_TABLE; i++) {
        double x = -SIGMOID_MAX + 2.0 * SIGMOID_MAX * i / SIGMOID_TABLE;
        s_sigmoid[i] = (float)(1.0 / (1.0 + exp(-x)));
        s_log_sigmoid[i] = (float)-log1p(exp(-x));
    }
}

/* Table index of x (clamped to the table). */
static inline int s_index(float x)
{
    if (x <= -SIGMOID_MAX)
        return 0;
    if (x >= SIGMOID_MAX)
        return SIGMOID_TABLE;
    if (!(x == x)) /* NaN (diverged values): the middle, rather than an index out of the table */
        return SIGMOID_TABLE / 2;
    return (int)((x + SIGMOID_MAX) * (SIGMOID_TABLE / (2.0f * SIGMOID_MAX)) + 0.5f);
}

/* Dot product with 8 independent partial sums, so the compiler can keep them in one vector register
 * without reassociating a single sum (no -ffast-math needed). */
static inline float s_dot(const float *restrict a, const float *restrict b, uint32_t n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y += alpha * x */
static inline void s_axpy(float *restrict y, float alpha, const float *restrict x, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

/* The whole batch; cloned for AVX2+FMA and for the baseline ISA, picked at load time. */
__attribute__((target_clones("arch=haswell", "default"))) static void
s_run(const nn_sgns_batch_t *b, const float *in, const float *out, float *d_in, float *d_out, float *gh,
      uint64_t *rng, double *loss_out, uint64_t *pairs_out)
{
    const uint32_t dim = b->dim;
    double loss = 0;
    uint64_t pairs = 0;
    uint32_t start = 0;
    for (uint32_t s = 0; s < b->n_sents; s++) {
        uint32_t end = b->sent_end[s];
        for (uint32_t i = start; i < end; i++) {
            uint32_t c = b->tokens[i];
            const float *h = in + (size_t)c * dim;
            uint32_t half = 1 + (uint32_t)(carls_splitmix64(rng) % b->window);
            uint32_t lo = i - start > half ? i - half : start;
            uint32_t hi = end - i - 1 > half ? i + half : end - 1;
            memset(gh, 0, dim * sizeof(float));
            for (uint32_t j = lo; j <= hi; j++) {
                if (j == i)
                    continue;
                uint32_t o = b->tokens[j];
                pairs++;
                for (uint32_t k = 0; k <= b->negatives; k++) {
                    uint32_t t;
                    float label;
                    if (k == 0) {
                        t = o;
                        label = 1.0f;
                    } else {
                        if (b->n_pool == 0)
                            break;
                        t = b->pool[carls_splitmix64(rng) % b->n_pool];
                        for (int tries = 0; t == o && tries < 8; tries++)
                            t = b->pool[carls_splitmix64(rng) % b->n_pool];
                        if (t == o)
                            continue;
                        label = 0.0f;
                    }
                    const float *u = out + (size_t)t * dim;
                    float score = s_dot(u, h, dim);
                    int idx = s_index(score);
                    float p = s_sigmoid[idx];
                    /* -log sigmoid(score) for the positive, -log sigmoid(-score) for a negative. */
                    loss -= label > 0 ? s_log_sigmoid[idx] : s_log_sigmoid[SIGMOID_TABLE - idx];
                    float coef = p - label;
                    s_axpy(gh, coef, u, dim);
                    s_axpy(d_out + (size_t)t * dim, coef, h, dim);
                }
            }
            s_axpy(d_in + (size_t)c * dim, 1.0f, gh, dim);
        }
        start = end;
    }
    *loss_out = loss;
    *pairs_out = pairs;
}

void nn_sgns_cpu(const nn_sgns_batch_t *b, const float *in, const float *out, float *d_in, float *d_out,
                 uint64_t *rng, double *loss_out, uint64_t *pairs_out)
{
    pthread_once(&s_tables_once, s_tables_init);
    memset(d_in, 0, (size_t)b->n_in * b->dim * sizeof(float));
    memset(d_out, 0, (size_t)b->n_out * b->dim * sizeof(float));
    float *gh = carls_xmalloc((b->dim ? b->dim : 1) * sizeof(float));
    s_run(b, in, out, d_in, d_out, gh, rng, loss_out, pairs_out);
    free(gh);
}
