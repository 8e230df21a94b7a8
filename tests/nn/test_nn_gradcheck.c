/* Finite-difference gradient checks for every CPU layer in nn/nn_ops.h, plus the value checks that pin down
 * what each forward computes and the overwrite/accumulate conventions of the backward passes.
 *
 * Method: each layer's outputs are projected on a fixed random vector r, f = <r, out> (in double), and the
 * backward pass is run with dout = r; then every input element is perturbed by +-eps and the central
 * difference of f is compared with the analytic gradient (tolerance: |a-n| <= atol + rtol*max(|a|,|n|)). */
#include "nn_ops.h"
#include "nn_testlib.h"

#include "nn_device.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define EPS 5e-3f
#define ATOL 1e-3
#define RTOL 1e-2

/* The buffers a test asked s_new for; they live until the test ends, when s_free_buffers (every test's
 * teardown, so also after a failed assertion) frees them. */
static float *s_buffers[32];
static size_t s_n_buffers;

/* n zeroed floats, freed with the test. */
static float *s_new(int n)
{
    assert_true(s_n_buffers < sizeof s_buffers / sizeof s_buffers[0]);
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    assert_non_null(p);
    s_buffers[s_n_buffers++] = p;
    return p;
}

static int s_free_buffers(void **state)
{
    (void)state;
    while (s_n_buffers > 0)
        free(s_buffers[--s_n_buffers]);
    return 0;
}

/* ---- linear ---- */

typedef struct {
    float *inp, *w, *b, *out, *r;
    int B, C, OC;
} linear_ctx_t;

static double s_linear_loss(void *p)
{
    linear_ctx_t *c = p;
    nn_linear_forward_cpu(c->out, c->inp, c->w, c->b, c->B, c->C, c->OC);
    return t_dot(c->r, c->out, c->B * c->OC);
}

static void test_linear(void **state)
{
    (void)state;
    uint64_t rng = 1;
    linear_ctx_t c = {.B = 4, .C = 5, .OC = 3};
    c.inp = s_new(c.B * c.C);
    c.w = s_new(c.OC * c.C);
    c.b = s_new(c.OC);
    c.out = s_new(c.B * c.OC);
    c.r = s_new(c.B * c.OC);
    t_fill_uniform(c.inp, c.B * c.C, -1, 1, &rng);
    t_fill_uniform(c.w, c.OC * c.C, -1, 1, &rng);
    t_fill_uniform(c.b, c.OC, -1, 1, &rng);
    t_fill_uniform(c.r, c.B * c.OC, -1, 1, &rng);

    /* Value: out[b][o] = sum_c inp[b][c] w[o][c] + bias[o]. */
    s_linear_loss(&c);
    for (int b = 0; b < c.B; b++) {
        for (int o = 0; o < c.OC; o++) {
            double want = c.b[o];
            for (int k = 0; k < c.C; k++) {
                want += (double)c.inp[b * c.C + k] * c.w[o * c.C + k];
            }
            assert_float_equal(c.out[b * c.OC + o], want, 1e-5);
        }
    }

    float *dinp = s_new(c.B * c.C), *dw = s_new(c.OC * c.C), *db = s_new(c.OC);
    for (int i = 0; i < c.B * c.C; i++) {
        dinp[i] = 1e6f; /* must be overwritten */
    }
    nn_linear_backward_cpu(dinp, dw, db, c.r, c.inp, c.w, c.B, c.C, c.OC);
    assert_int_equal(t_gradcheck("linear dinp", c.inp, c.B * c.C, dinp, s_linear_loss, &c, EPS, ATOL, RTOL), 0);
    assert_int_equal(t_gradcheck("linear dweight", c.w, c.OC * c.C, dw, s_linear_loss, &c, EPS, ATOL, RTOL), 0);
    assert_int_equal(t_gradcheck("linear dbias", c.b, c.OC, db, s_linear_loss, &c, EPS, ATOL, RTOL), 0);

    /* Parameter gradients accumulate: a second backward doubles them; dinp=NULL and dbias=NULL are skipped. */
    float *dw2 = s_new(c.OC * c.C), *db2 = s_new(c.OC);
    memcpy(dw2, dw, sizeof(float) * (size_t)(c.OC * c.C));
    memcpy(db2, db, sizeof(float) * (size_t)c.OC);
    nn_linear_backward_cpu(NULL, dw2, NULL, c.r, c.inp, c.w, c.B, c.C, c.OC);
    for (int i = 0; i < c.OC * c.C; i++) {
        assert_float_equal(dw2[i], 2.0f * dw[i], 1e-5);
    }
    for (int i = 0; i < c.OC; i++) {
        assert_float_equal(db2[i], db[i], 0.0);
    }
    /* Without bias the forward is the plain product. */
    s_linear_loss(&c); /* the gradient checks left out from a perturbed input */
    float *out_nb = s_new(c.B * c.OC);
    nn_linear_forward_cpu(out_nb, c.inp, c.w, NULL, c.B, c.C, c.OC);
    for (int b = 0; b < c.B; b++) {
        for (int o = 0; o < c.OC; o++) {
            assert_float_equal(out_nb[b * c.OC + o] + c.b[o], c.out[b * c.OC + o], 1e-5);
        }
    }
}

/* ---- ReLU ---- */

typedef struct {
    float *inp, *out, *r;
    int N;
} relu_ctx_t;

static double s_relu_loss(void *p)
{
    relu_ctx_t *c = p;
    nn_relu_forward_cpu(c->out, c->inp, c->N);
    return t_dot(c->r, c->out, c->N);
}

static void test_relu(void **state)
{
    (void)state;
    uint64_t rng = 2;
    relu_ctx_t c = {.N = 40};
    c.inp = s_new(c.N);
    c.out = s_new(c.N);
    c.r = s_new(c.N);
    t_fill_away_from_zero(c.inp, c.N, -1, 1, 0.05f, &rng);
    t_fill_uniform(c.r, c.N, -1, 1, &rng);
    s_relu_loss(&c);
    for (int i = 0; i < c.N; i++) {
        assert_float_equal(c.out[i], c.inp[i] > 0 ? c.inp[i] : 0.0f, 0.0);
    }
    float *dinp = s_new(c.N);
    nn_relu_backward_cpu(dinp, c.r, c.out, c.N);
    assert_int_equal(t_gradcheck("relu", c.inp, c.N, dinp, s_relu_loss, &c, EPS, ATOL, RTOL), 0);
}

/* ---- dropout ---- */

typedef struct {
    float *inp, *out, *mask, *r;
    float p;
    uint64_t seed;
    int N;
} dropout_ctx_t;

static double s_dropout_loss(void *p)
{
    dropout_ctx_t *c = p;
    nn_dropout_forward_cpu(c->out, c->mask, c->inp, c->p, c->seed, c->N);
    return t_dot(c->r, c->out, c->N);
}

static void test_dropout(void **state)
{
    (void)state;
    uint64_t rng = 3;
    dropout_ctx_t c = {.N = 64, .p = 0.3f, .seed = 42};
    c.inp = s_new(c.N);
    c.out = s_new(c.N);
    c.mask = s_new(c.N);
    c.r = s_new(c.N);
    t_fill_uniform(c.inp, c.N, -1, 1, &rng);
    t_fill_uniform(c.r, c.N, -1, 1, &rng);
    s_dropout_loss(&c); /* fixed seed: the same mask on every call */
    float *dinp = s_new(c.N);
    nn_dropout_backward_cpu(dinp, c.r, c.mask, c.N);
    assert_int_equal(t_gradcheck("dropout (fixed mask)", c.inp, c.N, dinp, s_dropout_loss, &c, EPS, ATOL, RTOL), 0);

    /* Statistics on a large vector: about p dropped, kept values scaled by 1/(1-p), seeds matter. */
    const int n = 200000;
    float *x = s_new(n), *y = s_new(n), *m1 = s_new(n), *m2 = s_new(n);
    for (int i = 0; i < n; i++) {
        x[i] = 2.0f;
    }
    nn_dropout_forward_cpu(y, m1, x, 0.3f, 7, n);
    int dropped = 0;
    for (int i = 0; i < n; i++) {
        if (m1[i] == 0.0f) {
            dropped++;
            assert_float_equal(y[i], 0.0f, 0.0);
        } else {
            assert_float_equal(m1[i], 1.0f / 0.7f, 1e-6);
            assert_float_equal(y[i], 2.0f / 0.7f, 1e-5);
        }
    }
    double frac = (double)dropped / n;
    printf("dropout p=0.3: dropped fraction %.4f\n", frac);
    assert_true(frac > 0.295 && frac < 0.305);
    nn_dropout_forward_cpu(y, m2, x, 0.3f, 7, n);
    assert_memory_equal(m1, m2, sizeof(float) * (size_t)n);
    nn_dropout_forward_cpu(y, m2, x, 0.3f, 8, n);
    assert_memory_not_equal(m1, m2, sizeof(float) * (size_t)n);
    nn_dropout_forward_cpu(y, m2, x, 0.0f, 8, n); /* p = 0 is the identity */
    assert_memory_equal(y, x, sizeof(float) * (size_t)n);
}

/* ---- softmax cross-entropy ---- */

typedef struct {
    float *logits, *probs, *losses, *dl;
    int32_t *targets;
    int B, V;
} ce_ctx_t;

static double s_ce_loss(void *p)
{
    ce_ctx_t *c = p;
    nn_softmax_ce_forward_cpu(c->losses, c->probs, c->logits, c->targets, c->B, c->V);
    return t_dot(c->dl, c->losses, c->B);
}

static void test_softmax_ce(void **state)
{
    (void)state;
    uint64_t rng = 4;
    ce_ctx_t c = {.B = 4, .V = 7};
    int32_t targets[4] = {0, 6, -1, 3}; /* row 2 is ignored */
    c.targets = targets;
    c.logits = s_new(c.B * c.V);
    c.probs = s_new(c.B * c.V);
    c.losses = s_new(c.B);
    c.dl = s_new(c.B);
    t_fill_uniform(c.logits, c.B * c.V, -3, 3, &rng);
    t_fill_uniform(c.dl, c.B, 0.1f, 1, &rng);
    s_ce_loss(&c);
    for (int b = 0; b < c.B; b++) {
        double sum = 0;
        for (int v = 0; v < c.V; v++) {
            sum += c.probs[b * c.V + v];
        }
        assert_float_equal(sum, 1.0, 1e-5);
        if (targets[b] >= 0) {
            assert_float_equal(c.losses[b], -log(c.probs[b * c.V + targets[b]]), 1e-5);
        } else {
            assert_float_equal(c.losses[b], 0.0f, 0.0);
        }
    }
    float *dlogits = s_new(c.B * c.V);
    nn_softmax_ce_backward_cpu(dlogits, c.dl, c.probs, c.targets, c.B, c.V);
    assert_int_equal(
        t_gradcheck("softmax_ce dlogits", c.logits, c.B * c.V, dlogits, s_ce_loss, &c, EPS, ATOL, RTOL), 0);

    /* Uniform logits: loss log V. Huge logits stay finite. */
    int32_t t1[1] = {2};
    float big[3] = {1000.0f, -1000.0f, 999.0f}, pr[3], l1[1];
    nn_softmax_ce_forward_cpu(l1, pr, big, t1, 1, 3);
    assert_true(isfinite(l1[0]));
    assert_float_equal(l1[0], 1.0f + log1p(exp(-1.0)), 1e-4);
    float flat[3] = {0.5f, 0.5f, 0.5f};
    nn_softmax_ce_forward_cpu(l1, pr, flat, t1, 1, 3);
    assert_float_equal(l1[0], log(3.0), 1e-6);
}

/* ---- L2 normalisation ---- */

typedef struct {
    float *inp, *out, *norms, *r;
    int B, D;
} l2_ctx_t;

static double s_l2_loss(void *p)
{
    l2_ctx_t *c = p;
    nn_l2norm_forward_cpu(c->out, c->norms, c->inp, 1e-12f, c->B, c->D);
    return t_dot(c->r, c->out, c->B * c->D);
}

static void test_l2norm(void **state)
{
    (void)state;
    uint64_t rng = 5;
    l2_ctx_t c = {.B = 3, .D = 6};
    c.inp = s_new(c.B * c.D);
    c.out = s_new(c.B * c.D);
    c.norms = s_new(c.B);
    c.r = s_new(c.B * c.D);
    t_fill_uniform(c.inp, c.B * c.D, -1, 1, &rng);
    t_fill_uniform(c.r, c.B * c.D, -1, 1, &rng);
    s_l2_loss(&c);
    for (int b = 0; b < c.B; b++) {
        double ss = 0;
        for (int d = 0; d < c.D; d++) {
            ss += (double)c.out[b * c.D + d] * c.out[b * c.D + d];
        }
        assert_float_equal(ss, 1.0, 1e-5);
    }
    float *dinp = s_new(c.B * c.D);
    nn_l2norm_backward_cpu(dinp, c.r, c.out, c.norms, c.B, c.D);
    assert_int_equal(t_gradcheck("l2norm", c.inp, c.B * c.D, dinp, s_l2_loss, &c, EPS, ATOL, RTOL), 0);
    /* A zero row stays finite (eps). */
    float z[4] = {0}, zo[4], zn[1];
    nn_l2norm_forward_cpu(zo, zn, z, 1e-12f, 1, 4);
    assert_true(isfinite(zo[0]) && zo[0] == 0.0f);
}

/* ---- embedding bag ---- */

typedef struct {
    float *rows, *out, *r;
    const int32_t *indices, *offsets;
    const float *weights;
    int mode, B, R, D;
} bag_ctx_t;

static double s_bag_loss(void *p)
{
    bag_ctx_t *c = p;
    nn_embedding_bag_forward_cpu(c->out, c->rows, c->indices, c->offsets, c->weights, c->mode, c->B, c->R, c->D);
    return t_dot(c->r, c->out, c->B * c->D);
}

static void test_embedding_bag(void **state)
{
    (void)state;
    uint64_t rng = 6;
    /* 4 bags over 5 fetched rows: a repeated row, a shared row, an empty bag. */
    static const int32_t indices[] = {0, 2, 2, 1, 4, 3, 0};
    static const int32_t offsets[] = {0, 3, 5, 5, 7};
    static const float weights[] = {0.5f, 1.5f, 1.0f, 2.0f, -0.5f, 1.0f, 0.25f};
    bag_ctx_t c = {.indices = indices, .offsets = offsets, .B = 4, .R = 5, .D = 3};
    c.rows = s_new(c.R * c.D);
    c.out = s_new(c.B * c.D);
    c.r = s_new(c.B * c.D);
    t_fill_uniform(c.rows, c.R * c.D, -1, 1, &rng);
    t_fill_uniform(c.r, c.B * c.D, -1, 1, &rng);
    float *drows = s_new(c.R * c.D);
    const char *names[4] = {"embedding_bag sum", "embedding_bag mean", "embedding_bag sum w", "embedding_bag mean w"};
    for (int variant = 0; variant < 4; variant++) {
        c.mode = (variant & 1) ? NN_BAG_MEAN : NN_BAG_SUM;
        c.weights = (variant & 2) ? weights : NULL;
        s_bag_loss(&c);
        /* Value of bag 0: rows 0, 2, 2 combined. */
        for (int d = 0; d < c.D; d++) {
            float w0 = c.weights ? weights[0] : 1, w1 = c.weights ? weights[1] : 1, w2 = c.weights ? weights[2] : 1;
            double want = w0 * c.rows[0 * c.D + d] + w1 * c.rows[2 * c.D + d] + w2 * c.rows[2 * c.D + d];
            if (c.mode == NN_BAG_MEAN) {
                want /= (w0 + w1 + w2);
            }
            assert_float_equal(c.out[d], want, 1e-5);
            assert_float_equal(c.out[2 * c.D + d], 0.0f, 0.0); /* empty bag */
        }
        for (int i = 0; i < c.R * c.D; i++) {
            drows[i] = 1e6f; /* must be overwritten */
        }
        nn_embedding_bag_backward_cpu(drows, c.r, indices, offsets, c.weights, c.mode, c.B, c.R, c.D);
        assert_int_equal(t_gradcheck(names[variant], c.rows, c.R * c.D, drows, s_bag_loss, &c, EPS, ATOL, RTOL), 0);
    }
}

/* ---- neighbour squared distance ---- */

typedef struct {
    float *x, *nbr, *out, *r;
    int B, K, D;
} sqd_ctx_t;

static double s_sqd_loss(void *p)
{
    sqd_ctx_t *c = p;
    nn_pairwise_sqdist_forward_cpu(c->out, c->x, c->nbr, c->B, c->K, c->D);
    return t_dot(c->r, c->out, c->B * c->K);
}

static void test_pairwise_sqdist(void **state)
{
    (void)state;
    uint64_t rng = 7;
    sqd_ctx_t c = {.B = 3, .K = 4, .D = 5};
    c.x = s_new(c.B * c.D);
    c.nbr = s_new(c.B * c.K * c.D);
    c.out = s_new(c.B * c.K);
    c.r = s_new(c.B * c.K);
    t_fill_uniform(c.x, c.B * c.D, -1, 1, &rng);
    t_fill_uniform(c.nbr, c.B * c.K * c.D, -1, 1, &rng);
    t_fill_uniform(c.r, c.B * c.K, 0, 1, &rng);
    float *dx = s_new(c.B * c.D), *dn = s_new(c.B * c.K * c.D);
    s_sqd_loss(&c);
    nn_pairwise_sqdist_backward_cpu(dx, dn, c.r, c.x, c.nbr, c.B, c.K, c.D);
    assert_int_equal(t_gradcheck("pairwise_sqdist dx", c.x, c.B * c.D, dx, s_sqd_loss, &c, EPS, ATOL, RTOL), 0);
    assert_int_equal(
        t_gradcheck("pairwise_sqdist dnbr", c.nbr, c.B * c.K * c.D, dn, s_sqd_loss, &c, EPS, ATOL, RTOL), 0);
    /* 3-4-5 triangle. */
    float x[2] = {0, 0}, n[2] = {3, 4}, o[1];
    nn_pairwise_sqdist_forward_cpu(o, x, n, 1, 1, 2);
    assert_float_equal(o[0], 25.0f, 0.0);
}

/* ---- InfoNCE ---- */

typedef struct {
    float *q, *pos, *neg, *pos_logq, *neg_logq, *losses, *probs, *dl;
    float inv_temp;
    int B, N, D;
} nce_ctx_t;

static double s_nce_loss(void *p)
{
    nce_ctx_t *c = p;
    nn_infonce_forward_cpu(c->losses, c->probs, c->q, c->pos, c->neg, c->pos_logq, c->neg_logq, c->inv_temp, c->B,
                           c->N, c->D);
    return t_dot(c->dl, c->losses, c->B);
}

static void test_infonce(void **state)
{
    (void)state;
    uint64_t rng = 8;
    nce_ctx_t c = {.B = 3, .N = 6, .D = 4, .inv_temp = 2.5f};
    c.q = s_new(c.B * c.D);
    c.pos = s_new(c.B * c.D);
    c.neg = s_new(c.N * c.D);
    c.pos_logq = s_new(c.B);
    c.neg_logq = s_new(c.N);
    c.losses = s_new(c.B);
    c.probs = s_new(c.B * (1 + c.N));
    c.dl = s_new(c.B);
    t_fill_uniform(c.q, c.B * c.D, -1, 1, &rng);
    t_fill_uniform(c.pos, c.B * c.D, -1, 1, &rng);
    t_fill_uniform(c.neg, c.N * c.D, -1, 1, &rng);
    t_fill_uniform(c.pos_logq, c.B, -3, -1, &rng);
    t_fill_uniform(c.neg_logq, c.N, -3, -1, &rng);
    t_fill_uniform(c.dl, c.B, 0.2f, 1, &rng);

    /* Value: row 1 by hand. */
    s_nce_loss(&c);
    {
        int b = 1;
        double logits[7], mx = -1e30, sum = 0;
        for (int j = 0; j <= c.N; j++) {
            const float *other = j == 0 ? c.pos + b * c.D : c.neg + (j - 1) * c.D;
            double dot = 0;
            for (int d = 0; d < c.D; d++) {
                dot += (double)c.q[b * c.D + d] * other[d];
            }
            logits[j] = c.inv_temp * dot - (j == 0 ? c.pos_logq[b] : c.neg_logq[j - 1]);
            mx = logits[j] > mx ? logits[j] : mx;
        }
        for (int j = 0; j <= c.N; j++) {
            sum += exp(logits[j] - mx);
        }
        assert_float_equal(c.losses[b], mx + log(sum) - logits[0], 1e-5);
    }

    float *dq = s_new(c.B * c.D), *dpos = s_new(c.B * c.D), *dneg = s_new(c.N * c.D);
    nn_infonce_backward_cpu(dq, dpos, dneg, c.probs, c.dl, c.q, c.pos, c.neg, c.inv_temp, c.B, c.N, c.D);
    assert_int_equal(t_gradcheck("infonce dq", c.q, c.B * c.D, dq, s_nce_loss, &c, EPS, ATOL, RTOL), 0);
    assert_int_equal(t_gradcheck("infonce dpos", c.pos, c.B * c.D, dpos, s_nce_loss, &c, EPS, ATOL, RTOL), 0);
    assert_int_equal(t_gradcheck("infonce dneg", c.neg, c.N * c.D, dneg, s_nce_loss, &c, EPS, ATOL, RTOL), 0);

    /* Without corrections and with q = 0 every logit is 0: loss log(1 + N). */
    memset(c.q, 0, sizeof(float) * (size_t)(c.B * c.D));
    nn_infonce_forward_cpu(c.losses, c.probs, c.q, c.pos, c.neg, NULL, NULL, c.inv_temp, c.B, c.N, c.D);
    for (int b = 0; b < c.B; b++) {
        assert_float_equal(c.losses[b], log(1.0 + c.N), 1e-6);
    }
}

static void test_helpers(void **state)
{
    (void)state;
    float y[3] = {1, 2, 3}, x[3] = {10, 20, 30};
    nn_add_cpu(y, x, 0.5f, 3);
    assert_float_equal(y[0], 6.0f, 0.0);
    assert_float_equal(y[2], 18.0f, 0.0);
    float m[6] = {0.1f, 0.7f, 0.7f, -1.0f, -2.0f, -0.5f};
    int32_t pred[2];
    nn_argmax_cpu(pred, m, 2, 3);
    assert_int_equal(pred[0], 1); /* first of the tied maxima */
    assert_int_equal(pred[1], 2);
}

static void test_device_parse(void **state)
{
    (void)state;
    nn_device_t d;
    assert_int_equal(nn_device_parse("auto", &d), 0);
    assert_int_equal(d, NN_DEVICE_AUTO);
    assert_int_equal(nn_device_parse("cpu", &d), 0);
    assert_int_equal(d, NN_DEVICE_CPU);
    assert_int_equal(nn_device_parse("cuda", &d), 0);
    assert_int_equal(d, NN_DEVICE_CUDA);
    assert_int_equal(nn_device_parse("gpu", &d), -1);
    assert_int_equal(nn_device_parse("", &d), -1);

    char err[256] = "";
    nn_device_t got;
    assert_int_equal(nn_device_resolve(NN_DEVICE_CPU, &got, err, sizeof err), 0);
    assert_int_equal(got, NN_DEVICE_CPU);
    assert_non_null(nn_ops_for(NN_DEVICE_CPU));
    assert_null(nn_ops_for(NN_DEVICE_AUTO));
    assert_int_equal(nn_device_resolve(NN_DEVICE_AUTO, &got, err, sizeof err), 0);
    if (nn_cuda_device_count() > 0) {
        assert_int_equal(got, NN_DEVICE_CUDA);
    } else {
        /* No GPU (or no CUDA in this build): auto falls back, an explicit cuda is an error with a reason. */
        assert_int_equal(got, NN_DEVICE_CPU);
        assert_int_equal(nn_device_resolve(NN_DEVICE_CUDA, &got, err, sizeof err), -1);
        assert_true(strstr(err, "cuda") != NULL);
        printf("--device cuda refused: %s\n", err);
    }
    if (!nn_cuda_compiled()) {
        assert_null(nn_ops_for(NN_DEVICE_CUDA));
    }
}

int main(void)
{
    nn_cpu_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_linear, s_free_buffers),
        cmocka_unit_test_teardown(test_relu, s_free_buffers),
        cmocka_unit_test_teardown(test_dropout, s_free_buffers),
        cmocka_unit_test_teardown(test_softmax_ce, s_free_buffers),
        cmocka_unit_test_teardown(test_l2norm, s_free_buffers),
        cmocka_unit_test_teardown(test_embedding_bag, s_free_buffers),
        cmocka_unit_test_teardown(test_pairwise_sqdist, s_free_buffers),
        cmocka_unit_test_teardown(test_infonce, s_free_buffers),
        cmocka_unit_test_teardown(test_helpers, s_free_buffers),
        cmocka_unit_test_teardown(test_device_parse, s_free_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
