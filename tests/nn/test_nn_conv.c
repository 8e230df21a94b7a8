/* The convolution building blocks of nn/nn_ops.h (CPU): im2col + linear against a direct NHWC convolution,
 * col2im as im2col's adjoint, a finite-difference check of a whole conv layer (im2col -> linear -> ReLU ->
 * max pool -> sum of squares), and max pooling on a hand-made tensor whose answer is known, ties included. */
#include "nn_device.h"
#include "nn_ops.h"
#include "nn_testlib.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* The buffers a test asked s_new for, freed by every test's teardown (so also after a failed assertion). */
static void *s_buffers[32];
static size_t s_n_buffers;

/* n zeroed elements of `size` bytes, freed with the test. */
static void *s_new(size_t n, size_t size)
{
    assert_true(s_n_buffers < sizeof s_buffers / sizeof s_buffers[0]);
    void *p = calloc(n > 0 ? n : 1, size);
    assert_non_null(p);
    s_buffers[s_n_buffers++] = p;
    return p;
}

static float *s_floats(size_t n)
{
    return s_new(n, sizeof(float));
}

static int s_free_buffers(void **state)
{
    (void)state;
    while (s_n_buffers > 0)
        free(s_buffers[--s_n_buffers]);
    return 0;
}

static void test_out_size(void **state)
{
    (void)state;
    assert_int_equal(nn_conv_out_size(28, 5, 1, 0), 24);
    assert_int_equal(nn_conv_out_size(28, 3, 1, 1), 28); /* "same" padding */
    assert_int_equal(nn_conv_out_size(28, 3, 2, 1), 14);
    assert_int_equal(nn_conv_out_size(7, 3, 2, 0), 3);
    assert_int_equal(nn_conv_out_size(8, 3, 2, 0), 3); /* the last column does not fit a window: dropped */
    assert_int_equal(nn_conv_out_size(5, 5, 1, 0), 1);
    assert_int_equal(nn_conv_out_size(1, 5, 1, 2), 1);
}

/* ---- im2col + linear == direct convolution ---- */

/* out (B, OH, OW, OC) by the definition: every tap of every window, in double. weight (OC, K*K*C) in (kh, kw, c)
 * order, as the linear op over im2col's columns takes it. */
static void s_naive_conv(float *out, const float *inp, const float *weight, const float *bias, int B, int H, int W,
                         int C, int OC, int K, int stride, int pad)
{
    const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    for (int b = 0; b < B; b++) {
        for (int oh = 0; oh < OH; oh++) {
            for (int ow = 0; ow < OW; ow++) {
                for (int o = 0; o < OC; o++) {
                    double s = bias[o];
                    for (int kh = 0; kh < K; kh++) {
                        for (int kw = 0; kw < K; kw++) {
                            for (int c = 0; c < C; c++) {
                                int h = oh * stride - pad + kh, w = ow * stride - pad + kw;
                                if (h >= 0 && h < H && w >= 0 && w < W) {
                                    s += (double)inp[((b * H + h) * W + w) * C + c] *
                                         weight[o * K * K * C + (kh * K + kw) * C + c];
                                }
                            }
                        }
                    }
                    out[((b * OH + oh) * OW + ow) * OC + o] = (float)s;
                }
            }
        }
    }
}

static void test_im2col_matches_direct_conv(void **state)
{
    (void)state;
    uint64_t rng = 11;
    const int B = 2, H = 9, W = 8, OC = 4; /* H != W: a swapped height and width shows */
    const int Ks[] = {3, 5}, strides[] = {1, 2}, pads[] = {0, 1, 2}, Cs[] = {1, 3};
    int cases = 0;
    for (int ki = 0; ki < 2; ki++) {
        for (int si = 0; si < 2; si++) {
            for (int pi = 0; pi < 3; pi++) {
                for (int ci = 0; ci < 2; ci++) {
                    const int K = Ks[ki], stride = strides[si], pad = pads[pi], C = Cs[ci], KKC = K * K * C;
                    const int OH = nn_conv_out_size(H, K, stride, pad), OW = nn_conv_out_size(W, K, stride, pad);
                    const int rows = B * OH * OW;
                    float *inp = malloc(sizeof(float) * (size_t)(B * H * W * C));
                    float *weight = malloc(sizeof(float) * (size_t)(OC * KKC)), bias[4];
                    float *col = malloc(sizeof(float) * (size_t)(rows * KKC));
                    float *out = malloc(sizeof(float) * (size_t)(rows * OC));
                    float *want = malloc(sizeof(float) * (size_t)(rows * OC));
                    assert_true(inp && weight && col && out && want);
                    t_fill_uniform(inp, B * H * W * C, -1, 1, &rng);
                    t_fill_uniform(weight, OC * KKC, -1, 1, &rng);
                    t_fill_uniform(bias, OC, -1, 1, &rng);
                    for (int i = 0; i < rows * KKC; i++) {
                        col[i] = NAN; /* every entry must be written, padding taps included */
                    }
                    nn_im2col_forward_cpu(col, inp, B, H, W, C, K, stride, pad);
                    nn_linear_forward_cpu(out, col, weight, bias, rows, KKC, OC);
                    s_naive_conv(want, inp, weight, bias, B, H, W, C, OC, K, stride, pad);
                    double err = t_max_scaled_err(out, want, rows * OC, 1e-5, 1e-5);
                    if (err > 1.0) {
                        printf("K=%d stride=%d pad=%d C=%d: max scaled err %.3f\n", K, stride, pad, C, err);
                    }
                    free(inp);
                    free(weight);
                    free(col);
                    free(out);
                    free(want);
                    assert_true(err <= 1.0);
                    cases++;
                }
            }
        }
    }
    assert_int_equal(cases, 24);
}

/* A few entries of im2col by hand: one 3x3 single-channel image, K=2, stride 1, pad 1 -> 4x4 windows. */
static void test_im2col_by_hand(void **state)
{
    (void)state;
    const float img[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float col[16 * 4];
    nn_im2col_forward_cpu(col, img, 1, 3, 3, 1, 2, 1, 1);
    /* Window (0, 0) hangs over the top-left corner: only its last tap, pixel (0, 0), is inside. */
    const float w00[4] = {0, 0, 0, 1}, w11[4] = {1, 2, 4, 5}, w33[4] = {9, 0, 0, 0}, w03[4] = {0, 0, 3, 0};
    assert_memory_equal(col + 0 * 4, w00, sizeof w00);
    assert_memory_equal(col + 5 * 4, w11, sizeof w11);
    assert_memory_equal(col + 15 * 4, w33, sizeof w33);
    assert_memory_equal(col + 3 * 4, w03, sizeof w03);
    /* Two channels, one window covering the whole 2x2 image: the row is (kh, kw, c) with c fastest, i.e. the
     * image's own NHWC order (channel-major would give 1, 2, 3, 4, -1, ...). */
    const float img2[8] = {1, -1, 2, -2, 3, -3, 4, -4};
    float col2[8];
    nn_im2col_forward_cpu(col2, img2, 1, 2, 2, 2, 2, 1, 0);
    assert_memory_equal(col2, img2, sizeof img2);
}

/* ---- col2im is im2col's adjoint ---- */

static void test_col2im_adjoint(void **state)
{
    (void)state;
    uint64_t rng = 12;
    /* (B, H, W, C, K, stride, pad); the last has stride > K, so some pixels are read by no window. */
    const int shapes[][7] = {
        {2, 9, 8, 3, 3, 1, 1}, {2, 9, 8, 1, 5, 2, 2}, {1, 7, 7, 2, 3, 2, 0},
        {2, 6, 5, 3, 5, 1, 2}, {2, 8, 8, 2, 2, 3, 0},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int B = shapes[s][0], H = shapes[s][1], W = shapes[s][2], C = shapes[s][3], K = shapes[s][4];
        const int stride = shapes[s][5], pad = shapes[s][6];
        const int OH = nn_conv_out_size(H, K, stride, pad), OW = nn_conv_out_size(W, K, stride, pad);
        const int n_in = B * H * W * C, n_col = B * OH * OW * K * K * C;
        float *x = s_floats((size_t)n_in), *dx = s_floats((size_t)n_in);
        float *y = s_floats((size_t)n_col), *col = s_floats((size_t)n_col);
        t_fill_uniform(x, n_in, -1, 1, &rng);
        t_fill_uniform(y, n_col, -1, 1, &rng);
        for (int i = 0; i < n_in; i++) {
            dx[i] = 1e6f; /* overwritten, not added to */
        }
        nn_im2col_forward_cpu(col, x, B, H, W, C, K, stride, pad);
        nn_col2im_backward_cpu(dx, y, B, H, W, C, K, stride, pad);
        const double lhs = t_dot(col, y, n_col), rhs = t_dot(x, dx, n_in);
        printf("shape %zu: <im2col(x), y> = %.9g, <x, col2im(y)> = %.9g\n", s, lhs, rhs);
        assert_true(fabs(lhs - rhs) <= 1e-5 * fmax(fabs(lhs), fabs(rhs)));
        if (stride > K) {
            /* Pixel (0, K) of image 0 lies between the first two windows: no tap reads it. */
            for (int c = 0; c < C; c++) {
                assert_float_equal(dx[K * C + c], 0.0f, 0.0);
            }
        }
        s_free_buffers(NULL);
    }
}

/* ---- max pooling on a known tensor ---- */

static void test_maxpool_known(void **state)
{
    (void)state;
    /* (1, 4, 4, 2): channel 0 is a, channel 1 is b; flat index of (h, w, c) is (h*4 + w)*2 + c. */
    const float a[16] = {
        /* window (0,0): 5 at (0,1); window (0,1): 2 at (0,2), (0,3) and (1,3) -> (0,2) */
        1, 5, 2, 2, 3, -1, 0, 2,
        /* window (1,0): all negative, -2 at (3,1); window (1,1): 7 at (2,2), (2,3) and (3,2) -> (2,2) */
        -4, -3, 7, 7, -5, -2, 7, 1,
    };
    const float b[16] = {
        /* window (0,0): all 0 -> the first, (0,0); window (0,1): 9 at (0,2) and (1,3) -> (0,2) */
        0, 0, 9, 1, 0, 0, 1, 9,
        /* window (1,0): 6 at (2,0) and (3,1) -> (2,0); window (1,1): all -1 -> (2,2) */
        6, 1, -1, -1, 2, 6, -1, -1,
    };
    float inp[32];
    for (int i = 0; i < 16; i++) {
        inp[2 * i] = a[i];
        inp[2 * i + 1] = b[i];
    }
#define AT(h, w, c) (((h) * 4 + (w)) * 2 + (c))
    /* outputs in (oh, ow, c) order */
    const float want_out[8] = {5, 0, 2, 9, -2, 6, 7, -1};
    const int32_t want_arg[8] = {AT(0, 1, 0), AT(0, 0, 1), AT(0, 2, 0), AT(0, 2, 1),
                                 AT(3, 1, 0), AT(2, 0, 1), AT(2, 2, 0), AT(2, 2, 1)};
    float out[8];
    int32_t arg[8];
    nn_maxpool2d_forward_cpu(out, arg, inp, 1, 4, 4, 2, 2);
    for (int o = 0; o < 8; o++) {
        assert_float_equal(out[o], want_out[o], 0.0);
        assert_int_equal(arg[o], want_arg[o]);
    }
    /* Backward: every element 0 (the 1e6 must be overwritten) except the argmaxes, which get dout. */
    const float dout[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float dinp[32];
    for (int i = 0; i < 32; i++) {
        dinp[i] = 1e6f;
    }
    nn_maxpool2d_backward_cpu(dinp, dout, arg, 1, 4, 4, 2, 2);
    float want_d[32] = {0};
    for (int o = 0; o < 8; o++) {
        want_d[want_arg[o]] = dout[o];
    }
    assert_memory_equal(dinp, want_d, sizeof want_d);
    /* Two images, P = 4 (one window each): the second image's argmax indexes the whole batch. */
    float two[64];
    memcpy(two, inp, sizeof inp);
    memcpy(two + 32, inp, sizeof inp);
    float out2[4];
    int32_t arg2[4];
    nn_maxpool2d_forward_cpu(out2, arg2, two, 2, 4, 4, 2, 4);
    assert_float_equal(out2[0], 7.0f, 0.0);
    assert_int_equal(arg2[0], AT(2, 2, 0));
    assert_float_equal(out2[1], 9.0f, 0.0);
    assert_int_equal(arg2[1], AT(0, 2, 1));
    assert_int_equal(arg2[2], 32 + AT(2, 2, 0));
    assert_int_equal(arg2[3], 32 + AT(0, 2, 1));
#undef AT
}

/* ---- a whole conv layer, by finite differences ---- */

typedef struct {
    float *inp, *w, *bias, *col, *pre, *act, *pool;
    int32_t *arg;
    /* The unperturbed point's ReLU signs and pooling choices; perturbations that change one are counted in
     * `switched`: a finite difference across a kink or a changed maximum does not measure the gradient. */
    float *base_pre;
    int32_t *base_arg;
    int switched;
    int B, H, W, C, K, stride, pad, OC, P, OH, OW;
} conv_ctx_t;

/* loss = sum of squares of maxpool(relu(im2col(inp) @ w^T + bias)). */
static double s_conv_loss(void *p)
{
    conv_ctx_t *c = p;
    const int rows = c->B * c->OH * c->OW, n_act = rows * c->OC, n_pool = n_act / (c->P * c->P);
    nn_im2col_forward_cpu(c->col, c->inp, c->B, c->H, c->W, c->C, c->K, c->stride, c->pad);
    nn_linear_forward_cpu(c->pre, c->col, c->w, c->bias, rows, c->K * c->K * c->C, c->OC);
    nn_relu_forward_cpu(c->act, c->pre, n_act);
    nn_maxpool2d_forward_cpu(c->pool, c->arg, c->act, c->B, c->OH, c->OW, c->OC, c->P);
    if (c->base_arg) {
        int changed = memcmp(c->arg, c->base_arg, sizeof(int32_t) * (size_t)n_pool) != 0;
        for (int i = 0; i < n_act && !changed; i++) {
            changed = (c->pre[i] > 0.0f) != (c->base_pre[i] > 0.0f);
        }
        c->switched += changed;
    }
    return t_dot(c->pool, c->pool, n_pool);
}

static void test_conv_layer_gradcheck(void **state)
{
    (void)state;
    uint64_t rng = 14; /* a draw whose perturbations all stay on one smooth piece (asserted below) */
    conv_ctx_t c = {.B = 2, .H = 6, .W = 6, .C = 2, .K = 3, .stride = 1, .pad = 1, .OC = 3, .P = 2};
    c.OH = nn_conv_out_size(c.H, c.K, c.stride, c.pad);
    c.OW = nn_conv_out_size(c.W, c.K, c.stride, c.pad);
    const int KKC = c.K * c.K * c.C, rows = c.B * c.OH * c.OW, n_in = c.B * c.H * c.W * c.C;
    const int n_act = rows * c.OC, n_pool = n_act / (c.P * c.P);
    c.inp = s_floats((size_t)n_in);
    c.w = s_floats((size_t)(c.OC * KKC));
    c.bias = s_floats((size_t)c.OC);
    c.col = s_floats((size_t)(rows * KKC));
    c.pre = s_floats((size_t)n_act);
    c.act = s_floats((size_t)n_act);
    c.pool = s_floats((size_t)n_pool);
    c.arg = s_new((size_t)n_pool, sizeof(int32_t));
    t_fill_uniform(c.inp, n_in, -1, 1, &rng);
    t_fill_uniform(c.w, c.OC * KKC, -0.5f, 0.5f, &rng);
    t_fill_uniform(c.bias, c.OC, -0.1f, 0.1f, &rng);

    /* Backward, from the outputs of one forward: d pool = 2 pool. */
    s_conv_loss(&c);
    float *dpool = s_floats((size_t)n_pool), *dact = s_floats((size_t)n_act), *dcol = s_floats((size_t)(rows * KKC));
    float *dinp = s_floats((size_t)n_in), *dw = s_floats((size_t)(c.OC * KKC)), *db = s_floats((size_t)c.OC);
    for (int i = 0; i < n_pool; i++) {
        dpool[i] = 2.0f * c.pool[i];
    }
    nn_maxpool2d_backward_cpu(dact, dpool, c.arg, c.B, c.OH, c.OW, c.OC, c.P);
    nn_relu_backward_cpu(dact, dact, c.act, n_act);
    nn_linear_backward_cpu(dcol, dw, db, dact, c.col, c.w, rows, KKC, c.OC);
    nn_col2im_backward_cpu(dinp, dcol, c.B, c.H, c.W, c.C, c.K, c.stride, c.pad);
    c.base_pre = s_floats((size_t)n_act);
    c.base_arg = s_new((size_t)n_pool, sizeof(int32_t));
    memcpy(c.base_pre, c.pre, sizeof(float) * (size_t)n_act);
    memcpy(c.base_arg, c.arg, sizeof(int32_t) * (size_t)n_pool);

    int nonzero = 0;
    for (int i = 0; i < n_in; i++) {
        nonzero += dinp[i] != 0.0f;
    }
    assert_true(nonzero > n_in / 2); /* the check below is not vacuous */
    /* eps small enough that no perturbation crosses a ReLU kink or changes a window's maximum (checked below:
     * otherwise a failure would say nothing about the gradients), large enough for float's rounding. */
    const float eps = 1e-3f;
    int bad = t_gradcheck("conv layer dinp", c.inp, n_in, dinp, s_conv_loss, &c, eps, 1e-3, 1e-2);
    bad += t_gradcheck("conv layer dweight", c.w, c.OC * KKC, dw, s_conv_loss, &c, eps, 1e-3, 1e-2);
    bad += t_gradcheck("conv layer dbias", c.bias, c.OC, db, s_conv_loss, &c, eps, 1e-3, 1e-2);
    printf("perturbations that crossed a kink or changed a maximum: %d\n", c.switched);
    assert_int_equal(c.switched, 0);
    assert_int_equal(bad, 0);
}

/* The CPU table carries the new ops. */
static void test_cpu_table(void **state)
{
    (void)state;
    const nn_ops_t *ops = nn_ops_for(NN_DEVICE_CPU);
    assert_non_null(ops);
    assert_ptr_equal(ops->im2col_forward, nn_im2col_forward_cpu);
    assert_ptr_equal(ops->col2im_backward, nn_col2im_backward_cpu);
    assert_ptr_equal(ops->maxpool2d_forward, nn_maxpool2d_forward_cpu);
    assert_ptr_equal(ops->maxpool2d_backward, nn_maxpool2d_backward_cpu);
}

int main(void)
{
    nn_cpu_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_out_size, s_free_buffers),
        cmocka_unit_test_teardown(test_im2col_by_hand, s_free_buffers),
        cmocka_unit_test_teardown(test_im2col_matches_direct_conv, s_free_buffers),
        cmocka_unit_test_teardown(test_col2im_adjoint, s_free_buffers),
        cmocka_unit_test_teardown(test_maxpool_known, s_free_buffers),
        cmocka_unit_test_teardown(test_conv_layer_gradcheck, s_free_buffers),
        cmocka_unit_test_teardown(test_cpu_table, s_free_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
