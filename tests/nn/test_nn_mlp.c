/* nn/nn_mlp: the whole model's gradient against finite differences (with dropout on a fixed mask, an
 * unlabelled row and an extra embedding gradient), learning a small synthetic problem with both optimisers,
 * and a checkpoint round trip that must reproduce the predictions exactly. CPU device. */
#include "nn_mlp.h"
#include "nn_mlp_encode_u8.h"
#include "nn_testlib.h"

#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct {
    nn_mlp_t *m;
    float *params; /* host copy being perturbed */
    float *r;      /* (B, E) direction of the extra embedding term */
    float *emb;    /* (B, E) host scratch */
    int B, E;
} mlp_ctx_t;

static double s_mlp_loss(void *p)
{
    mlp_ctx_t *c = p;
    nn_mlp_set_params(c->m, c->params);
    double loss = nn_mlp_forward(c->m, c->B, true, 1234);
    memcpy(c->emb, c->m->h[c->m->cfg.n_hidden - 1], sizeof(float) * (size_t)(c->B * c->E));
    return loss + t_dot(c->r, c->emb, c->B * c->E);
}

/* The gradient-check context of m on its current batch (B rows, embedding width E): a copy of the parameters,
 * and a random projection r of the embedding drawn uniformly from [lo, hi). Free with s_mlp_ctx_free. */
static mlp_ctx_t s_mlp_ctx(nn_mlp_t *m, int B, int E, float lo, float hi, uint64_t *rng)
{
    mlp_ctx_t c = {.m = m, .B = B, .E = E};
    c.params = malloc(sizeof(float) * m->num_params);
    c.r = malloc(sizeof(float) * (size_t)(B * E));
    c.emb = malloc(sizeof(float) * (size_t)(B * E));
    nn_mlp_get_params(m, c.params);
    t_fill_uniform(c.r, B * E, lo, hi, rng);
    return c;
}

/* The analytic gradient of the context's loss at its parameters (a new array of num_params floats). */
static float *s_mlp_analytic(mlp_ctx_t *c)
{
    s_mlp_loss(c);
    nn_mlp_zero_grad(c->m);
    nn_mlp_backward(c->m, c->B, c->r);
    float *analytic = malloc(sizeof(float) * c->m->num_params);
    memcpy(analytic, c->m->grads, sizeof(float) * c->m->num_params);
    return analytic;
}

static void s_mlp_ctx_free(mlp_ctx_t *c)
{
    free(c->params);
    free(c->r);
    free(c->emb);
}

static void test_mlp_gradcheck(void **state)
{
    (void)state;
    nn_mlp_config_t cfg = {.in_dim = 6, .n_hidden = 2, .hidden = {5, 4}, .num_classes = 3, .dropout = 0.25f};
    nn_mlp_t *m = NULL;
    char err[256];
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 8, 99, &m, err, sizeof err), 0);
    const int B = 5, E = 4;
    uint64_t rng = 21;
    float x[5 * 6];
    int32_t y[5] = {0, 2, -1, 1, 2}; /* row 2 unlabelled */
    t_fill_uniform(x, B * 6, -1, 1, &rng);
    nn_mlp_set_batch(m, x, y, B);
    mlp_ctx_t c = s_mlp_ctx(m, B, E, -0.5f, 0.5f, &rng);

    float *analytic = s_mlp_analytic(&c);
    int bad = t_gradcheck("mlp all parameters", c.params, (int)m->num_params, analytic, s_mlp_loss, &c, 1e-3f, 1e-3,
                          1e-2);
    assert_int_equal(bad, 0);

    /* Gradients accumulate across backward calls until zero_grad. */
    s_mlp_loss(&c);
    nn_mlp_backward(m, B, c.r);
    for (size_t i = 0; i < m->num_params; i++) {
        assert_float_equal(m->grads[i], 2.0f * analytic[i], 1e-5);
    }
    free(analytic);
    s_mlp_ctx_free(&c);
    nn_mlp_destroy(&m);
    assert_null(m);
}

/* Three Gaussian blobs in 8 dimensions, one per class. */
static void s_blobs(float *x, int32_t *y, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++) {
        int c = i % 3;
        y[i] = c;
        for (int d = 0; d < 8; d++) {
            float noise;
            t_fill_uniform(&noise, 1, -1, 1, rng);
            x[i * 8 + d] = (d % 3 == c ? 1.5f : 0.0f) + noise;
        }
    }
}

static float s_train_blobs(nn_optim_config_t opt)
{
    nn_mlp_config_t cfg = {.in_dim = 8, .n_hidden = 1, .hidden = {16}, .num_classes = 3, .dropout = 0.1f};
    nn_mlp_t *m = NULL;
    char err[256];
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 64, 5, &m, err, sizeof err), 0);
    enum { N = 64 };
    float x[N * 8];
    int32_t y[N];
    uint64_t rng = 3;
    s_blobs(x, y, N, &rng);
    float first = 0, last = 0;
    for (int step = 0; step < 300; step++) {
        nn_mlp_set_batch(m, x, y, N);
        float loss = nn_mlp_forward(m, N, true, (uint64_t)step);
        if (step == 0) {
            first = loss;
        }
        last = loss;
        nn_mlp_zero_grad(m);
        nn_mlp_backward(m, N, NULL);
        nn_mlp_step(m, &opt);
    }
    /* Fresh points from the same blobs. */
    s_blobs(x, y, N, &rng);
    nn_mlp_set_batch(m, x, y, N);
    nn_mlp_forward(m, N, false, 0);
    float acc = (float)nn_mlp_correct(m, N, NULL) / N;
    printf("blobs: loss %.4f -> %.4f, held-out accuracy %.3f\n", first, last, acc);
    assert_true(last < 0.5f * first);
    nn_mlp_destroy(&m);
    return acc;
}

static void test_mlp_learns(void **state)
{
    (void)state;
    nn_optim_config_t adam = {.kind = NN_OPT_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    nn_optim_config_t sgd = {.kind = NN_OPT_SGD, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
    assert_true(s_train_blobs(adam) >= 0.9f);
    assert_true(s_train_blobs(sgd) >= 0.9f);
}

static void test_mlp_checkpoint_round_trip(void **state)
{
    (void)state;
    nn_mlp_config_t cfg = {.in_dim = 7, .n_hidden = 2, .hidden = {9, 5}, .num_classes = 4};
    nn_mlp_t *m = NULL, *back = NULL;
    char err[512], dir[] = "/tmp/carls_mlp_test_XXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 16, 77, &m, err, sizeof err), 0);
    carls_ckpt_t *c = NULL;
    assert_int_equal(nn_mlp_to_ckpt(m, 42, &c, err, sizeof err), 0);
    assert_string_equal(carls_ckpt_kind(c), NN_MLP_KIND_CLASSIFIER);
    assert_int_equal(carls_ckpt_count(c), 6);
    assert_int_equal(carls_ckpt_save_to_dir(c, dir, path, sizeof path, err, sizeof err), 0);
    carls_ckpt_destroy(&c);
    assert_int_equal(carls_ckpt_read(path, &c, err, sizeof err), 0);
    assert_int_equal(nn_mlp_from_ckpt(c, NN_DEVICE_CPU, 16, &back, err, sizeof err), 0);
    assert_int_equal(back->cfg.in_dim, 7);
    assert_int_equal(back->cfg.n_hidden, 2);
    assert_int_equal(back->cfg.hidden[1], 5);
    assert_int_equal(back->cfg.num_classes, 4);

    float x[20 * 7], p1[20 * 4], p2[20 * 4], e1[20 * 5], e2[20 * 5];
    uint64_t rng = 9;
    t_fill_uniform(x, 20 * 7, -1, 1, &rng);
    nn_mlp_predict(m, x, 20, p1); /* 20 > max_batch: two chunks */
    nn_mlp_predict(back, x, 20, p2);
    assert_memory_equal(p1, p2, sizeof p1);
    nn_mlp_encode(m, x, 20, e1);
    nn_mlp_encode(back, x, 20, e2);
    assert_memory_equal(e1, e2, sizeof e1);
    for (int i = 0; i < 20; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) {
            s += p1[i * 4 + k];
        }
        assert_float_equal(s, 1.0, 1e-5);
    }

    /* A checkpoint missing a tensor, or of another kind, is refused with a reason. */
    carls_ckpt_t *partial = carls_ckpt_new(NN_MLP_KIND_CLASSIFIER, 1);
    const carls_ckpt_tensor_t *t = carls_ckpt_find(c, "enc.0.weight");
    assert_int_equal(carls_ckpt_add(partial, t->name, t->ndim, t->dims, t->data), 0);
    nn_mlp_t *none = NULL;
    assert_int_equal(nn_mlp_from_ckpt(partial, NN_DEVICE_CPU, 4, &none, err, sizeof err), -1);
    printf("partial checkpoint refused: %s\n", err);
    assert_null(none);
    carls_ckpt_t *other = carls_ckpt_new("word2vec", 1);
    assert_int_equal(nn_mlp_from_ckpt(other, NN_DEVICE_CPU, 4, &none, err, sizeof err), -1);
    assert_non_null(strstr(err, "word2vec"));
    carls_ckpt_destroy(&other);
    carls_ckpt_destroy(&partial);
    carls_ckpt_destroy(&c);
    nn_mlp_destroy(&m);
    nn_mlp_destroy(&back);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* An encoder without a classifier (what a contrastive or graph-only trainer uses): its gradient comes only
 * from d_embedding, and it saves and loads as NN_MLP_KIND_ENCODER. */
static void test_mlp_encoder_only(void **state)
{
    (void)state;
    nn_mlp_config_t cfg = {.in_dim = 4, .n_hidden = 2, .hidden = {6, 3}, .num_classes = 0};
    nn_mlp_t *m = NULL, *back = NULL;
    char err[256];
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 4, 3, &m, err, sizeof err), 0);
    assert_int_equal(m->n_layers, 2);
    const int B = 4, E = 3;
    uint64_t rng = 31;
    float x[4 * 4];
    t_fill_uniform(x, B * 4, -1, 1, &rng);
    nn_mlp_set_batch(m, x, NULL, B);
    mlp_ctx_t c = s_mlp_ctx(m, B, E, -1, 1, &rng);
    assert_float_equal(nn_mlp_forward(m, B, true, 1234), 0.0f, 0.0); /* no classifier: no cross-entropy */
    float *analytic = s_mlp_analytic(&c);
    assert_int_equal(t_gradcheck("mlp encoder only", c.params, (int)m->num_params, analytic, s_mlp_loss, &c, 1e-3f,
                                 1e-3, 1e-2),
                     0);
    nn_mlp_set_params(m, c.params); /* the gradient check left the last parameter perturbed */
    carls_ckpt_t *ck = NULL;
    assert_int_equal(nn_mlp_to_ckpt(m, 5, &ck, err, sizeof err), 0);
    assert_string_equal(carls_ckpt_kind(ck), NN_MLP_KIND_ENCODER);
    assert_null(carls_ckpt_find(ck, "cls.weight"));
    assert_int_equal(nn_mlp_from_ckpt(ck, NN_DEVICE_CPU, 4, &back, err, sizeof err), 0);
    float e1[4 * 3], e2[4 * 3];
    nn_mlp_encode(m, x, B, e1);
    nn_mlp_encode(back, x, B, e2);
    assert_memory_equal(e1, e2, sizeof e1);
    carls_ckpt_destroy(&ck);
    free(analytic);
    s_mlp_ctx_free(&c);
    nn_mlp_destroy(&m);
    nn_mlp_destroy(&back);
}

static void test_mlp_config_checks(void **state)
{
    (void)state;
    char err[256];
    nn_mlp_t *m = NULL;
    nn_mlp_config_t bad = {.in_dim = 4, .n_hidden = 0, .num_classes = 2};
    assert_int_equal(nn_mlp_new(&bad, NN_DEVICE_CPU, 4, 1, &m, err, sizeof err), -1);
    bad.n_hidden = 1;
    bad.hidden[0] = 3;
    bad.dropout = 1.0f;
    assert_int_equal(nn_mlp_new(&bad, NN_DEVICE_CPU, 4, 1, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "dropout"));
    bad.dropout = 0.0f;
    assert_int_equal(nn_mlp_new(&bad, NN_DEVICE_CPU, 0, 1, &m, err, sizeof err), -1);
    assert_null(m);
}

/* A fingerprint of every on/off decision of the last forward: which ReLU outputs are positive, in the
 * convolutions and the hidden layers, and which element each pooling window chose. */
static uint64_t s_kink_pattern(const nn_mlp_t *m, int B)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < m->cfg.n_conv; i++) {
        const nn_conv_block_t *b = &m->cfg.conv[i];
        const int n = B * m->conv_h[i] * m->conv_w[i] * b->channels;
        for (int j = 0; j < n; j++) {
            h = (h ^ (uint64_t)(m->cact[i][j] > 0.0f)) * 1099511628211ull;
        }
        for (int j = 0; b->pool > 1 && j < n / (b->pool * b->pool); j++) {
            h = (h ^ (uint64_t)m->cargmax[i][j]) * 1099511628211ull;
        }
    }
    for (int l = 0; l < m->cfg.n_hidden; l++) {
        for (int j = 0; j < B * m->out[l]; j++) {
            h = (h ^ (uint64_t)(m->post[l][j] > 0.0f)) * 1099511628211ull;
        }
    }
    return h;
}

/* Two convolution blocks (one pooled, one not) in front of the hidden layers: the whole model's gradient
 * against central differences, with im2col passes of 2 images so that chunks meet inside the batch.
 * A nudge of a conv weight or bias moves every position of its channel, so some nudges cross a ReLU's kink
 * or change a pooling window's choice, where the finite difference is not the derivative: those parameters
 * are recognised by their changed on/off pattern and skipped, and there must be few of them. */
static void test_mlp_conv_gradcheck(void **state)
{
    (void)state;
    nn_mlp_config_t cfg = {.in_dim = 72, .n_hidden = 2, .hidden = {5, 4}, .num_classes = 3, .dropout = 0.25f,
                           .n_conv = 2, .conv = {{3, 3, 2}, {4, 3, 1}}, .image_h = 6, .image_w = 6, .image_c = 2};
    nn_mlp_t *m = NULL;
    char err[256];
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 8, 5, &m, err, sizeof err), 0);
    assert_int_equal(m->in[0], 3 * 3 * 4);
    assert_int_equal(m->num_params, (3 * 9 * 2 + 3) + (4 * 9 * 3 + 4) + (36 * 5 + 5) + (5 * 4 + 4) + (4 * 3 + 3));
    m->conv_chunk = 2;
    const int B = 5, E = 4;
    uint64_t rng = 23;
    float x[5 * 72];
    int32_t y[5] = {2, -1, 0, 1, 2};
    t_fill_uniform(x, B * 72, -1, 1, &rng);
    nn_mlp_set_batch(m, x, y, B);
    mlp_ctx_t c = s_mlp_ctx(m, B, E, -0.5f, 0.5f, &rng);
    float *analytic = s_mlp_analytic(&c);
    const float eps = 1e-3f;
    int bad = 0, kinks = 0;
    double conv_norm = 0.0;
    for (size_t i = 0; i < m->num_params; i++) {
        const float saved = c.params[i];
        c.params[i] = saved + eps;
        const double fp = s_mlp_loss(&c);
        const uint64_t pp = s_kink_pattern(m, B);
        c.params[i] = saved - eps;
        const double fm = s_mlp_loss(&c);
        const uint64_t pm = s_kink_pattern(m, B);
        c.params[i] = saved;
        if (pp != pm) {
            kinks++;
            continue;
        }
        const double num = (fp - fm) / (2.0 * eps), a = analytic[i];
        const double scale = fabs(a) > fabs(num) ? fabs(a) : fabs(num);
        if (fabs(a - num) > 1e-3 + 1e-2 * scale) {
            printf("conv mlp parameter %zu: analytic %.6g numeric %.6g\n", i, a, num);
            bad++;
        }
        if (i < (size_t)(3 * 9 * 2 + 3 + 4 * 9 * 3 + 4)) {
            conv_norm += fabs(a);
        }
    }
    printf("conv mlp gradcheck: %zu parameters, %d across a kink (skipped), %d wrong\n", m->num_params, kinks, bad);
    assert_int_equal(bad, 0);
    assert_true(kinks * 10 < (int)m->num_params);
    assert_true(conv_norm > 1e-3); /* the conv blocks' gradients are not all zero */
    free(analytic);
    s_mlp_ctx_free(&c);
    nn_mlp_destroy(&m);
}

/* A copy of c's tensors with the given conv numbers for one block (pool 0: none written). */
static carls_ckpt_t *s_conv_ckpt_with_numbers(const carls_ckpt_t *c, uint64_t h, uint64_t w, uint64_t ch,
                                              uint64_t k, uint64_t pool)
{
    carls_ckpt_t *out = carls_ckpt_new(NN_MLP_KIND_CLASSIFIER, 3);
    for (int i = 0; i < carls_ckpt_count(c); i++) {
        const carls_ckpt_tensor_t *t = carls_ckpt_tensor(c, i);
        assert_int_equal(carls_ckpt_add(out, t->name, t->ndim, t->dims, t->data), 0);
    }
    assert_int_equal(carls_ckpt_add_u64(out, "conv.image_h", h), 0);
    assert_int_equal(carls_ckpt_add_u64(out, "conv.image_w", w), 0);
    assert_int_equal(carls_ckpt_add_u64(out, "conv.image_c", ch), 0);
    assert_int_equal(carls_ckpt_add_u64(out, "conv.0.k", k), 0);
    if (pool) {
        assert_int_equal(carls_ckpt_add_u64(out, "conv.0.pool", pool), 0);
    }
    return out;
}

/* A conv model saved and loaded gives the same predictions, whole batches of 70 (two im2col passes of up to
 * 64) equal to one image at a time, and broken conv numbers in a checkpoint are refused by name. */
static void test_mlp_conv_checkpoint(void **state)
{
    (void)state;
    nn_mlp_config_t cfg = {.in_dim = 8 * 8, .n_hidden = 1, .hidden = {6}, .num_classes = 4, .n_conv = 1,
                           .conv = {{5, 5, 2}}, .image_h = 8, .image_w = 8, .image_c = 1};
    nn_mlp_t *m = NULL, *back = NULL, *one = NULL;
    char err[512];
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 80, 7, &m, err, sizeof err), 0);
    carls_ckpt_t *c = NULL;
    assert_int_equal(nn_mlp_to_ckpt(m, 3, &c, err, sizeof err), 0);
    assert_int_equal(nn_mlp_from_ckpt(c, NN_DEVICE_CPU, 80, &back, err, sizeof err), 0);
    assert_int_equal(nn_mlp_from_ckpt(c, NN_DEVICE_CPU, 1, &one, err, sizeof err), 0);
    assert_int_equal(back->cfg.n_conv, 1);
    assert_int_equal(back->cfg.conv[0].channels, 5);
    assert_int_equal(back->cfg.conv[0].k, 5);
    assert_int_equal(back->cfg.conv[0].pool, 2);
    assert_int_equal(back->cfg.image_h, 8);
    enum { N = 70 };
    float *x = malloc(sizeof(float) * N * 64), p1[N * 4], p2[N * 4], p3[N * 4];
    uint64_t rng = 11;
    t_fill_uniform(x, N * 64, 0, 1, &rng);
    nn_mlp_predict(m, x, N, p1);
    nn_mlp_predict(back, x, N, p2);
    nn_mlp_predict(one, x, N, p3);
    assert_memory_equal(p1, p2, sizeof p1);
    for (int i = 0; i < N * 4; i++) {
        assert_float_equal(p1[i], p3[i], 1e-6);
    }
    /* A kernel size the weights do not match, or a missing pooling number, is refused by name. */
    carls_ckpt_t *broken = s_conv_ckpt_with_numbers(c, 8, 8, 1, 3, 0);
    nn_mlp_t *none = NULL;
    assert_int_equal(nn_mlp_from_ckpt(broken, NN_DEVICE_CPU, 4, &none, err, sizeof err), -1);
    printf("missing pooling refused: %s\n", err);
    assert_non_null(strstr(err, "conv.0.pool"));
    assert_int_equal(carls_ckpt_add_u64(broken, "conv.0.pool", 2), 0);
    assert_int_equal(nn_mlp_from_ckpt(broken, NN_DEVICE_CPU, 4, &none, err, sizeof err), -1);
    printf("wrong kernel refused: %s\n", err);
    assert_non_null(strstr(err, "conv.0.weight"));
    assert_null(none);
    carls_ckpt_destroy(&broken);
    /* An image shape whose product overflows int is refused, not wrapped. */
    carls_ckpt_t *huge = s_conv_ckpt_with_numbers(c, 65536, 65536, 1, 5, 2);
    assert_int_equal(nn_mlp_from_ckpt(huge, NN_DEVICE_CPU, 4, &none, err, sizeof err), -1);
    printf("huge image refused: %s\n", err);
    assert_null(none);
    carls_ckpt_destroy(&huge);
    carls_ckpt_destroy(&c);
    free(x);
    nn_mlp_destroy(&m);
    nn_mlp_destroy(&back);
    nn_mlp_destroy(&one);
}

/* The makers' bulk encode of grey-level bytes runs a conv model's convolutions: its embeddings and
 * probabilities equal the model's own forward pass on bytes / 255 (a fused path of linear layers alone would
 * read the pixels as if they were the first hidden layer's input). */
static void test_mlp_conv_encode_u8(void **state)
{
    (void)state;
    nn_mlp_config_t cfg = {.in_dim = 8 * 8, .n_hidden = 2, .hidden = {7, 5}, .num_classes = 3, .n_conv = 1,
                           .conv = {{4, 3, 2}}, .image_h = 8, .image_w = 8, .image_c = 1};
    nn_mlp_t *m = NULL;
    char err[256];
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 16, 4, &m, err, sizeof err), 0);
    enum { N = 37 };
    uint8_t px[N * 64];
    float x[N * 64], e1[N * 5], e2[N * 5], p1[N * 3], p2[N * 3];
    uint64_t rng = 5;
    for (int i = 0; i < N * 64; i++) {
        px[i] = (uint8_t)(carls_splitmix64(&rng) >> 56);
        x[i] = (float)px[i] * (1.0f / 255.0f);
    }
    nn_mlp_encode_u8(m, px, N, e1, p1, 4096);
    nn_mlp_encode(m, x, N, e2);
    nn_mlp_predict(m, x, N, p2);
    assert_memory_equal(e1, e2, sizeof e1);
    assert_memory_equal(p1, p2, sizeof p1);
    double norm = 0.0;
    for (int i = 0; i < N * 5; i++) {
        norm += fabs(e1[i]);
    }
    assert_true(norm > 1e-3);
    nn_mlp_destroy(&m);
}

static void test_mlp_conv_config_checks(void **state)
{
    (void)state;
    char err[256];
    nn_mlp_t *m = NULL;
    nn_mlp_config_t cfg = {.in_dim = 64, .n_hidden = 1, .hidden = {3}, .num_classes = 2, .n_conv = 1,
                           .conv = {{4, 3, 2}}, .image_h = 8, .image_w = 7, .image_c = 1};
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 4, 1, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "8x7x1 is not 64 inputs"));
    cfg.image_w = 8;
    cfg.conv[0].k = 4;
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 4, 1, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "kernel 4 is not odd"));
    cfg.conv[0].k = 3;
    cfg.conv[0].pool = 3;
    assert_int_equal(nn_mlp_new(&cfg, NN_DEVICE_CPU, 4, 1, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "pooling 3 does not divide its 8x8 input"));
    assert_null(m);
}

int main(void)
{
    nn_cpu_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_gradcheck),
        cmocka_unit_test(test_mlp_learns),
        cmocka_unit_test(test_mlp_checkpoint_round_trip),
        cmocka_unit_test(test_mlp_encoder_only),
        cmocka_unit_test(test_mlp_config_checks),
        cmocka_unit_test(test_mlp_conv_gradcheck),
        cmocka_unit_test(test_mlp_conv_checkpoint),
        cmocka_unit_test(test_mlp_conv_encode_u8),
        cmocka_unit_test(test_mlp_conv_config_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
