/* CUDA parity: every nn_*_cuda kernel against its nn_*_cpu twin on the same random inputs, then a few MLP
 * training steps on both devices. Tolerance: |gpu - cpu| <= ATOL + RTOL * |cpu| element-wise (FP32 on both
 * sides; cuBLAS and the reductions sum in another order, and nvcc contracts a*b+c into FMAs). Dropout masks,
 * argmax, im2col and max pooling must match exactly.
 *
 * Without CUDA in the build, or without a usable GPU, it prints "SKIPPED: no CUDA device" and exits 77, which
 * CTest reports as skipped (SKIP_RETURN_CODE), never as passed. */
#include "nn_device.h"
#include "nn_mlp.h"
#include "nn_ops.h"
#include "nn_testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 1e-4
#define RTOL 1e-3

static const nn_ops_t *s_gpu;
static int s_failures;

/* Device copy of a host array. */
static void *s_up(const void *host, size_t bytes)
{
    void *d = s_gpu->alloc(bytes);
    s_gpu->to_device(d, host, bytes);
    return d;
}

static float *s_down(const float *dev, size_t n)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    s_gpu->to_host(h, dev, sizeof(float) * n);
    return h;
}

static float *s_rand(size_t n, float lo, float hi, uint64_t *rng)
{
    float *x = malloc(sizeof(float) * (n ? n : 1));
    t_fill_uniform(x, (int)n, lo, hi, rng);
    return x;
}

/* Compares a device result with the host reference and reports. */
static void s_compare(const char *what, const float *dev, const float *ref, size_t n, double atol, double rtol)
{
    float *got = s_down(dev, n);
    double err = t_max_scaled_err(got, ref, (int)n, atol, rtol);
    int ok = err <= 1.0;
    printf("parity %-32s n=%-8zu max scaled err %.4f (atol %.0e rtol %.0e) %s\n", what, n, err, atol, rtol,
           ok ? "OK" : "FAIL");
    s_failures += !ok;
    free(got);
}

/* Bit-exact comparison, for results that involve no rounding differences. */
static void s_compare_exact(const char *what, const float *dev, const float *ref, size_t n)
{
    float *got = s_down(dev, n);
    int ok = memcmp(got, ref, sizeof(float) * n) == 0;
    printf("parity %-32s n=%-8zu bit-exact %s\n", what, n, ok ? "OK" : "FAIL");
    s_failures += !ok;
    free(got);
}

static void s_linear(uint64_t *rng)
{
    const int B = 67, C = 300, OC = 130;
    float *inp = s_rand((size_t)B * C, -1, 1, rng), *w = s_rand((size_t)OC * C, -0.1f, 0.1f, rng);
    float *bias = s_rand(OC, -1, 1, rng), *dout = s_rand((size_t)B * OC, -1, 1, rng);
    float *out = calloc((size_t)B * OC, 4), *dinp = calloc((size_t)B * C, 4);
    float *dw = s_rand((size_t)OC * C, -1, 1, rng), *db = s_rand(OC, -1, 1, rng); /* accumulate onto these */
    float *g_inp = s_up(inp, 4ul * B * C), *g_w = s_up(w, 4ul * OC * C), *g_b = s_up(bias, 4ul * OC);
    float *g_dout = s_up(dout, 4ul * B * OC), *g_dw = s_up(dw, 4ul * OC * C), *g_db = s_up(db, 4ul * OC);
    float *g_out = s_gpu->alloc(4ul * B * OC), *g_dinp = s_gpu->alloc(4ul * B * C);
    nn_linear_forward_cpu(out, inp, w, bias, B, C, OC);
    s_gpu->linear_forward(g_out, g_inp, g_w, g_b, B, C, OC);
    s_compare("linear_forward", g_out, out, (size_t)B * OC, ATOL, RTOL);
    nn_linear_backward_cpu(dinp, dw, db, dout, inp, w, B, C, OC);
    s_gpu->linear_backward(g_dinp, g_dw, g_db, g_dout, g_inp, g_w, B, C, OC);
    s_compare("linear_backward dinp", g_dinp, dinp, (size_t)B * C, ATOL, RTOL);
    s_compare("linear_backward dweight (+=)", g_dw, dw, (size_t)OC * C, ATOL, RTOL);
    s_compare("linear_backward dbias (+=)", g_db, db, OC, ATOL, RTOL);
    float *ptrs[] = {inp, w, bias, dout, out, dinp, dw, db};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        free(ptrs[i]);
    }
    float *gptrs[] = {g_inp, g_w, g_b, g_dout, g_dw, g_db, g_out, g_dinp};
    for (size_t i = 0; i < sizeof gptrs / sizeof gptrs[0]; i++) {
        s_gpu->free(gptrs[i]);
    }
}

static void s_elementwise(uint64_t *rng)
{
    const int N = 100003;
    float *x = s_rand(N, -1, 1, rng), *g = s_rand(N, -1, 1, rng);
    float *out = calloc(N, 4), *mask = calloc(N, 4), *dx = calloc(N, 4);
    float *g_x = s_up(x, 4ul * N), *g_g = s_up(g, 4ul * N);
    float *g_out = s_gpu->alloc(4ul * N), *g_mask = s_gpu->alloc(4ul * N), *g_dx = s_gpu->alloc(4ul * N);

    nn_relu_forward_cpu(out, x, N);
    s_gpu->relu_forward(g_out, g_x, N);
    s_compare_exact("relu_forward", g_out, out, N);
    nn_relu_backward_cpu(dx, g, out, N);
    s_gpu->relu_backward(g_dx, g_g, g_out, N);
    s_compare_exact("relu_backward", g_dx, dx, N);

    nn_dropout_forward_cpu(out, mask, x, 0.3f, 12345, N);
    s_gpu->dropout_forward(g_out, g_mask, g_x, 0.3f, 12345, N);
    s_compare_exact("dropout_forward mask", g_mask, mask, N);
    s_compare_exact("dropout_forward out", g_out, out, N);
    nn_dropout_backward_cpu(dx, g, mask, N);
    s_gpu->dropout_backward(g_dx, g_g, g_mask, N);
    s_compare_exact("dropout_backward", g_dx, dx, N);

    memcpy(out, x, 4ul * N);
    s_gpu->to_device(g_out, x, 4ul * N);
    nn_add_cpu(out, g, -0.5f, N);
    s_gpu->add(g_out, g_g, -0.5f, N);
    s_compare("add", g_out, out, N, 1e-7, 1e-6);
    free(x);
    free(g);
    free(out);
    free(mask);
    free(dx);
    float *gptrs[] = {g_x, g_g, g_out, g_mask, g_dx};
    for (size_t i = 0; i < sizeof gptrs / sizeof gptrs[0]; i++) {
        s_gpu->free(gptrs[i]);
    }
}

static void s_softmax_ce(uint64_t *rng, int B, int V)
{
    float *logits = s_rand((size_t)B * V, -5, 5, rng), *dl = s_rand(B, 0, 1, rng);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)B);
    for (int b = 0; b < B; b++) {
        t[b] = b % 7 == 3 ? -1 : (int32_t)((b * 31) % V);
    }
    float *losses = calloc((size_t)B, 4), *probs = calloc((size_t)B * V, 4), *dlog = calloc((size_t)B * V, 4);
    float *g_logits = s_up(logits, 4ul * B * V), *g_dl = s_up(dl, 4ul * B);
    int32_t *g_t = s_up(t, 4ul * B);
    float *g_losses = s_gpu->alloc(4ul * B), *g_probs = s_gpu->alloc(4ul * B * V), *g_dlog = s_gpu->alloc(4ul * B * V);
    nn_softmax_ce_forward_cpu(losses, probs, logits, t, B, V);
    s_gpu->softmax_ce_forward(g_losses, g_probs, g_logits, g_t, B, V);
    char name[64];
    snprintf(name, sizeof name, "softmax_ce_forward V=%d losses", V);
    s_compare(name, g_losses, losses, B, ATOL, RTOL);
    snprintf(name, sizeof name, "softmax_ce_forward V=%d probs", V);
    s_compare(name, g_probs, probs, (size_t)B * V, 1e-6, RTOL);
    nn_softmax_ce_backward_cpu(dlog, dl, probs, t, B, V);
    s_gpu->softmax_ce_backward(g_dlog, g_dl, g_probs, g_t, B, V);
    snprintf(name, sizeof name, "softmax_ce_backward V=%d", V);
    s_compare(name, g_dlog, dlog, (size_t)B * V, 1e-6, RTOL);

    int32_t *pred = malloc(4ul * B), *g_pred = s_gpu->alloc(4ul * B), *gp = malloc(4ul * B);
    nn_argmax_cpu(pred, logits, B, V);
    s_gpu->argmax(g_pred, g_logits, B, V);
    s_gpu->to_host(gp, g_pred, 4ul * B);
    int same = memcmp(pred, gp, 4ul * B) == 0;
    printf("parity %-32s n=%-8d %s\n", "argmax (exact)", B, same ? "OK" : "FAIL");
    s_failures += !same;
    free(pred);
    free(gp);
    s_gpu->free(g_pred);
    free(logits);
    free(dl);
    free(t);
    free(losses);
    free(probs);
    free(dlog);
    s_gpu->free(g_logits);
    s_gpu->free(g_dl);
    s_gpu->free(g_t);
    s_gpu->free(g_losses);
    s_gpu->free(g_probs);
    s_gpu->free(g_dlog);
}

static void s_l2norm(uint64_t *rng)
{
    const int B = 33, D = 300;
    float *x = s_rand((size_t)B * D, -1, 1, rng), *g = s_rand((size_t)B * D, -1, 1, rng);
    float *out = calloc((size_t)B * D, 4), *norms = calloc(B, 4), *dx = calloc((size_t)B * D, 4);
    float *g_x = s_up(x, 4ul * B * D), *g_g = s_up(g, 4ul * B * D);
    float *g_out = s_gpu->alloc(4ul * B * D), *g_norms = s_gpu->alloc(4ul * B), *g_dx = s_gpu->alloc(4ul * B * D);
    nn_l2norm_forward_cpu(out, norms, x, 1e-12f, B, D);
    s_gpu->l2norm_forward(g_out, g_norms, g_x, 1e-12f, B, D);
    s_compare("l2norm_forward", g_out, out, (size_t)B * D, 1e-6, RTOL);
    s_compare("l2norm_forward norms", g_norms, norms, B, 1e-6, RTOL);
    nn_l2norm_backward_cpu(dx, g, out, norms, B, D);
    s_gpu->l2norm_backward(g_dx, g_g, g_out, g_norms, B, D);
    s_compare("l2norm_backward", g_dx, dx, (size_t)B * D, 1e-5, RTOL);
    free(x);
    free(g);
    free(out);
    free(norms);
    free(dx);
    s_gpu->free(g_x);
    s_gpu->free(g_g);
    s_gpu->free(g_out);
    s_gpu->free(g_norms);
    s_gpu->free(g_dx);
}

static void s_embedding_bag(uint64_t *rng)
{
    const int B = 40, R = 57, D = 70;
    int32_t offsets[41], indices[400];
    int L = 0;
    for (int b = 0; b < B; b++) {
        offsets[b] = L;
        int len = b % 9; /* includes empty bags */
        for (int k = 0; k < len; k++) {
            indices[L++] = (int32_t)((b * 13 + k * 7) % R);
        }
    }
    offsets[B] = L;
    float *rows = s_rand((size_t)R * D, -1, 1, rng), *w = s_rand(L, 0.1f, 2, rng), *g = s_rand((size_t)B * D, -1, 1, rng);
    float *out = calloc((size_t)B * D, 4), *drows = calloc((size_t)R * D, 4);
    float *g_rows = s_up(rows, 4ul * R * D), *g_w = s_up(w, 4ul * L), *g_g = s_up(g, 4ul * B * D);
    int32_t *g_idx = s_up(indices, 4ul * L), *g_off = s_up(offsets, 4ul * (B + 1));
    float *g_out = s_gpu->alloc(4ul * B * D), *g_drows = s_gpu->alloc(4ul * R * D);
    for (int variant = 0; variant < 4; variant++) {
        int mode = (variant & 1) ? NN_BAG_MEAN : NN_BAG_SUM;
        const float *wh = (variant & 2) ? w : NULL, *wd = (variant & 2) ? g_w : NULL;
        char name[64];
        nn_embedding_bag_forward_cpu(out, rows, indices, offsets, wh, mode, B, R, D);
        s_gpu->embedding_bag_forward(g_out, g_rows, g_idx, g_off, wd, mode, B, R, D);
        snprintf(name, sizeof name, "embedding_bag_forward %s%s", mode ? "mean" : "sum", wh ? " w" : "");
        s_compare(name, g_out, out, (size_t)B * D, 1e-5, RTOL);
        nn_embedding_bag_backward_cpu(drows, g, indices, offsets, wh, mode, B, R, D);
        s_gpu->embedding_bag_backward(g_drows, g_g, g_idx, g_off, wd, mode, B, R, D);
        snprintf(name, sizeof name, "embedding_bag_backward %s%s", mode ? "mean" : "sum", wh ? " w" : "");
        s_compare(name, g_drows, drows, (size_t)R * D, 1e-5, RTOL);
    }
    free(rows);
    free(w);
    free(g);
    free(out);
    free(drows);
    s_gpu->free(g_rows);
    s_gpu->free(g_w);
    s_gpu->free(g_g);
    s_gpu->free(g_idx);
    s_gpu->free(g_off);
    s_gpu->free(g_out);
    s_gpu->free(g_drows);
}

static void s_sqdist(uint64_t *rng)
{
    const int B = 33, K = 5, D = 100;
    float *x = s_rand((size_t)B * D, -1, 1, rng), *nbr = s_rand((size_t)B * K * D, -1, 1, rng);
    float *g = s_rand((size_t)B * K, -1, 1, rng);
    float *out = calloc((size_t)B * K, 4), *dx = calloc((size_t)B * D, 4), *dn = calloc((size_t)B * K * D, 4);
    float *g_x = s_up(x, 4ul * B * D), *g_nbr = s_up(nbr, 4ul * B * K * D), *g_g = s_up(g, 4ul * B * K);
    float *g_out = s_gpu->alloc(4ul * B * K), *g_dx = s_gpu->alloc(4ul * B * D), *g_dn = s_gpu->alloc(4ul * B * K * D);
    nn_pairwise_sqdist_forward_cpu(out, x, nbr, B, K, D);
    s_gpu->pairwise_sqdist_forward(g_out, g_x, g_nbr, B, K, D);
    s_compare("pairwise_sqdist_forward", g_out, out, (size_t)B * K, ATOL, RTOL);
    nn_pairwise_sqdist_backward_cpu(dx, dn, g, x, nbr, B, K, D);
    s_gpu->pairwise_sqdist_backward(g_dx, g_dn, g_g, g_x, g_nbr, B, K, D);
    s_compare("pairwise_sqdist_backward dx", g_dx, dx, (size_t)B * D, 1e-5, RTOL);
    s_compare("pairwise_sqdist_backward dnbr", g_dn, dn, (size_t)B * K * D, 1e-6, RTOL);
    free(x);
    free(nbr);
    free(g);
    free(out);
    free(dx);
    free(dn);
    s_gpu->free(g_x);
    s_gpu->free(g_nbr);
    s_gpu->free(g_g);
    s_gpu->free(g_out);
    s_gpu->free(g_dx);
    s_gpu->free(g_dn);
}

static void s_infonce(uint64_t *rng)
{
    const int B = 20, N = 500, D = 64, W = 1 + N;
    const float inv_temp = 5.0f;
    float *q = s_rand((size_t)B * D, -0.2f, 0.2f, rng), *pos = s_rand((size_t)B * D, -0.2f, 0.2f, rng);
    float *neg = s_rand((size_t)N * D, -0.2f, 0.2f, rng), *plq = s_rand(B, -8, -2, rng), *nlq = s_rand(N, -8, -2, rng);
    float *dl = s_rand(B, 0.5f, 1, rng);
    float *losses = calloc(B, 4), *probs = calloc((size_t)B * W, 4);
    float *dq = calloc((size_t)B * D, 4), *dpos = calloc((size_t)B * D, 4), *dneg = calloc((size_t)N * D, 4);
    float *g_q = s_up(q, 4ul * B * D), *g_pos = s_up(pos, 4ul * B * D), *g_neg = s_up(neg, 4ul * N * D);
    float *g_plq = s_up(plq, 4ul * B), *g_nlq = s_up(nlq, 4ul * N), *g_dl = s_up(dl, 4ul * B);
    float *g_losses = s_gpu->alloc(4ul * B), *g_probs = s_gpu->alloc(4ul * B * W);
    float *g_dq = s_gpu->alloc(4ul * B * D), *g_dpos = s_gpu->alloc(4ul * B * D), *g_dneg = s_gpu->alloc(4ul * N * D);
    nn_infonce_forward_cpu(losses, probs, q, pos, neg, plq, nlq, inv_temp, B, N, D);
    s_gpu->infonce_forward(g_losses, g_probs, g_q, g_pos, g_neg, g_plq, g_nlq, inv_temp, B, N, D);
    s_compare("infonce_forward losses", g_losses, losses, B, ATOL, RTOL);
    s_compare("infonce_forward probs", g_probs, probs, (size_t)B * W, 1e-6, RTOL);
    nn_infonce_backward_cpu(dq, dpos, dneg, probs, dl, q, pos, neg, inv_temp, B, N, D);
    s_gpu->infonce_backward(g_dq, g_dpos, g_dneg, g_probs, g_dl, g_q, g_pos, g_neg, inv_temp, B, N, D);
    s_compare("infonce_backward dq", g_dq, dq, (size_t)B * D, 1e-5, RTOL);
    s_compare("infonce_backward dpos", g_dpos, dpos, (size_t)B * D, 1e-5, RTOL);
    s_compare("infonce_backward dneg", g_dneg, dneg, (size_t)N * D, 1e-6, RTOL);
    float *ptrs[] = {q, pos, neg, plq, nlq, dl, losses, probs, dq, dpos, dneg};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        free(ptrs[i]);
    }
    float *gptrs[] = {g_q, g_pos, g_neg, g_plq, g_nlq, g_dl, g_losses, g_probs, g_dq, g_dpos, g_dneg};
    for (size_t i = 0; i < sizeof gptrs / sizeof gptrs[0]; i++) {
        s_gpu->free(gptrs[i]);
    }
}

/* im2col and col2im over one shape (B, H, W, C, K, stride, pad). im2col only copies: bit-exact. col2im gathers
 * each pixel's taps in the order the CPU adds them (no atomics), so it is held to 1e-6. */
static void s_im2col(uint64_t *rng, int B, int H, int W, int C, int K, int stride, int pad)
{
    const int OH = nn_conv_out_size(H, K, stride, pad), OW = nn_conv_out_size(W, K, stride, pad);
    const size_t n_in = (size_t)B * H * W * C, n_col = (size_t)B * OH * OW * K * K * C;
    float *x = s_rand(n_in, -1, 1, rng), *dcol = s_rand(n_col, -1, 1, rng);
    float *col = calloc(n_col, 4), *dx = calloc(n_in, 4);
    float *g_x = s_up(x, 4 * n_in), *g_dcol = s_up(dcol, 4 * n_col);
    float *g_col = s_gpu->alloc(4 * n_col), *g_dx = s_gpu->alloc(4 * n_in);
    char name[64];
    nn_im2col_forward_cpu(col, x, B, H, W, C, K, stride, pad);
    s_gpu->im2col_forward(g_col, g_x, B, H, W, C, K, stride, pad);
    snprintf(name, sizeof name, "im2col_forward K=%d s=%d p=%d C=%d", K, stride, pad, C);
    s_compare_exact(name, g_col, col, n_col);
    s_gpu->to_device(g_dx, x, 4 * n_in); /* stale values: must be overwritten */
    nn_col2im_backward_cpu(dx, dcol, B, H, W, C, K, stride, pad);
    s_gpu->col2im_backward(g_dx, g_dcol, B, H, W, C, K, stride, pad);
    snprintf(name, sizeof name, "col2im_backward K=%d s=%d p=%d C=%d", K, stride, pad, C);
    s_compare(name, g_dx, dx, n_in, 1e-6, 1e-6);
    free(x);
    free(dcol);
    free(col);
    free(dx);
    s_gpu->free(g_x);
    s_gpu->free(g_dcol);
    s_gpu->free(g_col);
    s_gpu->free(g_dx);
}

/* Max pooling, with ties (values on a coarse grid) so the first-maximum rule is exercised: all bit-exact. */
static void s_maxpool(uint64_t *rng, int B, int H, int W, int C, int P)
{
    const size_t n_in = (size_t)B * H * W * C, n_out = n_in / ((size_t)P * P);
    float *x = s_rand(n_in, 0, 1, rng), *dout = s_rand(n_out, -1, 1, rng);
    for (size_t i = 0; i < n_in; i++) {
        x[i] = floorf(x[i] * 4.0f); /* 0..3: many windows hold equal maxima */
    }
    float *out = calloc(n_out, 4), *dx = calloc(n_in, 4);
    int32_t *arg = calloc(n_out, 4), *got_arg = calloc(n_out, 4);
    float *g_x = s_up(x, 4 * n_in), *g_dout = s_up(dout, 4 * n_out);
    float *g_out = s_gpu->alloc(4 * n_out), *g_dx = s_gpu->alloc(4 * n_in);
    int32_t *g_arg = s_gpu->alloc(4 * n_out);
    char name[64];
    nn_maxpool2d_forward_cpu(out, arg, x, B, H, W, C, P);
    s_gpu->maxpool2d_forward(g_out, g_arg, g_x, B, H, W, C, P);
    snprintf(name, sizeof name, "maxpool2d_forward P=%d", P);
    s_compare_exact(name, g_out, out, n_out);
    s_gpu->to_host(got_arg, g_arg, 4 * n_out);
    int same = memcmp(arg, got_arg, 4 * n_out) == 0;
    printf("parity %-32s n=%-8zu %s\n", "maxpool2d_forward argmax (exact)", n_out, same ? "OK" : "FAIL");
    s_failures += !same;
    s_gpu->to_device(g_dx, x, 4 * n_in); /* stale values: must be overwritten */
    nn_maxpool2d_backward_cpu(dx, dout, arg, B, H, W, C, P);
    s_gpu->maxpool2d_backward(g_dx, g_dout, g_arg, B, H, W, C, P);
    snprintf(name, sizeof name, "maxpool2d_backward P=%d", P);
    s_compare_exact(name, g_dx, dx, n_in);
    free(x);
    free(dout);
    free(out);
    free(dx);
    free(arg);
    free(got_arg);
    s_gpu->free(g_x);
    s_gpu->free(g_dout);
    s_gpu->free(g_out);
    s_gpu->free(g_dx);
    s_gpu->free(g_arg);
}

static void s_optimisers(uint64_t *rng)
{
    const int N = 10007;
    float *p = s_rand(N, -1, 1, rng), *m = calloc(N, 4), *v = calloc(N, 4);
    float *g_p = s_up(p, 4ul * N), *g_m = s_gpu->alloc(4ul * N), *g_v = s_gpu->alloc(4ul * N);
    float *g_g = s_gpu->alloc(4ul * N);
    for (int t = 1; t <= 5; t++) {
        float *g = s_rand(N, -1, 1, rng);
        s_gpu->to_device(g_g, g, 4ul * N);
        nn_adam_update_cpu(p, g, m, v, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, t, N);
        s_gpu->adam_update(g_p, g_g, g_m, g_v, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, t, N);
        free(g);
    }
    s_compare("adam_update params (5 steps)", g_p, p, N, 1e-6, 1e-5);
    s_compare("adam_update m", g_m, m, N, 1e-7, 1e-5);
    s_compare("adam_update v", g_v, v, N, 1e-7, 1e-5);
    memset(m, 0, 4ul * N);
    s_gpu->zero(g_m, 4ul * N);
    for (int t = 1; t <= 5; t++) {
        float *g = s_rand(N, -1, 1, rng);
        s_gpu->to_device(g_g, g, 4ul * N);
        nn_sgd_update_cpu(p, g, m, 0.05f, 0.9f, 1e-3f, N);
        s_gpu->sgd_update(g_p, g_g, g_m, 0.05f, 0.9f, 1e-3f, N);
        free(g);
    }
    s_compare("sgd_update params (5 steps)", g_p, p, N, 1e-6, 1e-5);
    free(p);
    free(m);
    free(v);
    s_gpu->free(g_p);
    s_gpu->free(g_m);
    s_gpu->free(g_v);
    s_gpu->free(g_g);
}

/* The same MLP on both devices: equal start, a few Adam steps with dropout, losses and predictions agree. */
static void s_mlp(uint64_t *rng)
{
    nn_mlp_config_t cfg = {.in_dim = 784, .n_hidden = 2, .hidden = {256, 128}, .num_classes = 10, .dropout = 0.2f};
    nn_mlp_t *cpu = NULL, *gpu = NULL;
    char err[256];
    if (nn_mlp_new(&cfg, NN_DEVICE_CPU, 128, 7, &cpu, err, sizeof err) != 0 ||
        nn_mlp_new(&cfg, NN_DEVICE_CUDA, 128, 7, &gpu, err, sizeof err) != 0) {
        printf("parity mlp: cannot build the models: %s FAIL\n", err);
        s_failures++;
        return;
    }
    nn_optim_config_t opt = {.kind = NN_OPT_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    const int B = 128;
    float *x = s_rand((size_t)B * 784, 0, 1, rng);
    int32_t y[128];
    for (int i = 0; i < B; i++) {
        y[i] = (i * 7) % 10;
    }
    double worst = 0;
    for (int step = 0; step < 5; step++) {
        nn_mlp_set_batch(cpu, x, y, B);
        nn_mlp_set_batch(gpu, x, y, B);
        float lc = nn_mlp_forward(cpu, B, true, (uint64_t)step);
        float lg = nn_mlp_forward(gpu, B, true, (uint64_t)step);
        double e = fabs((double)lc - lg) / (1e-4 + 1e-3 * fabs(lc));
        worst = e > worst ? e : worst;
        nn_mlp_zero_grad(cpu);
        nn_mlp_zero_grad(gpu);
        nn_mlp_backward(cpu, B, NULL);
        nn_mlp_backward(gpu, B, NULL);
        nn_mlp_step(cpu, &opt);
        nn_mlp_step(gpu, &opt);
    }
    int ok = worst <= 1.0;
    printf("parity %-32s 5 Adam steps, loss max scaled err %.4f %s\n", "mlp train step", worst, ok ? "OK" : "FAIL");
    s_failures += !ok;
    float *pc = malloc(sizeof(float) * (size_t)B * 10), *pg = malloc(sizeof(float) * (size_t)B * 10);
    nn_mlp_predict(cpu, x, B, pc);
    nn_mlp_predict(gpu, x, B, pg);
    double err_p = t_max_scaled_err(pg, pc, B * 10, 1e-4, 1e-2);
    ok = err_p <= 1.0;
    printf("parity %-32s max scaled err %.4f (atol 1e-4 rtol 1e-2) %s\n", "mlp predictions after training", err_p,
           ok ? "OK" : "FAIL");
    s_failures += !ok;
    free(pc);
    free(pg);
    free(x);
    nn_mlp_destroy(&cpu);
    nn_mlp_destroy(&gpu);
}

int main(void)
{
    if (!nn_cuda_compiled() || nn_cuda_device_count() <= 0) {
        printf("SKIPPED: no CUDA device (%s)\n", nn_cuda_compiled() ? "no GPU or no driver found"
                                                                  : "this build has no CUDA kernels");
        return 77;
    }
    nn_cpu_set_threads(1);
    s_gpu = nn_ops_for(NN_DEVICE_CUDA);
    uint64_t rng = 2024;
    s_linear(&rng);
    s_elementwise(&rng);
    s_softmax_ce(&rng, 70, 10);
    s_softmax_ce(&rng, 9, 1000);
    s_l2norm(&rng);
    s_embedding_bag(&rng);
    s_sqdist(&rng);
    s_infonce(&rng);
    s_im2col(&rng, 4, 28, 28, 1, 5, 1, 2);
    s_im2col(&rng, 3, 13, 11, 3, 3, 2, 1);
    s_im2col(&rng, 2, 14, 14, 8, 5, 2, 0);
    s_im2col(&rng, 2, 8, 8, 2, 2, 3, 0); /* stride > K: pixels no window reads */
    s_maxpool(&rng, 4, 28, 28, 8, 2);
    s_maxpool(&rng, 3, 12, 9, 5, 3);
    s_optimisers(&rng);
    s_mlp(&rng);
    s_gpu->synchronize();
    printf("%s: %d failure(s)\n", s_failures ? "FAILED" : "CUDA parity OK", s_failures);
    return s_failures ? 1 : 0;
}
