/* CPU reference of the convolution building blocks in nn_ops.h: im2col and its adjoint, and max pooling, all
 * NHWC. A pixel's C channels are contiguous in the image and in a column row alike, so both copy C floats at a
 * time. The CUDA twins are in cuda/nn_cuda_conv.cu. */
#include "nn_ops.h"

#include "nn_host_device.h"

#include <assert.h>
#include <stddef.h>
#include <string.h>

int nn_conv_out_size(int in, int K, int stride, int pad)
{
    assert(in > 0 && K >= 1 && stride >= 1 && pad >= 0 && in + 2 * pad >= K);
    return (in + 2 * pad - K) / stride + 1;
}

/* ---- im2col / col2im ---- */

void nn_im2col_forward_cpu(float *col, const float *inp, int B, int H, int W, int C, int K, int stride, int pad)
{
    assert(col && inp && B > 0 && C > 0);
    const int OH = nn_conv_out_size(H, K, stride, pad), OW = nn_conv_out_size(W, K, stride, pad);
    const size_t tap = sizeof(float) * (size_t)C;
    float *dst = col;
    for (int b = 0; b < B; b++) {
        for (int oh = 0; oh < OH; oh++) {
            for (int ow = 0; ow < OW; ow++) {
                for (int kh = 0; kh < K; kh++) {
                    const int h = oh * stride - pad + kh;
                    for (int kw = 0; kw < K; kw++, dst += C) {
                        const int w = ow * stride - pad + kw;
                        if (h < 0 || h >= H || w < 0 || w >= W) {
                            memset(dst, 0, tap);
                        } else {
                            memcpy(dst, inp + (((size_t)b * H + h) * W + w) * C, tap);
                        }
                    }
                }
            }
        }
    }
}

void nn_col2im_backward_cpu(float *dinp, const float *dcol, int B, int H, int W, int C, int K, int stride, int pad)
{
    assert(dinp && dcol && B > 0 && C > 0);
    const int OH = nn_conv_out_size(H, K, stride, pad), OW = nn_conv_out_size(W, K, stride, pad);
    memset(dinp, 0, sizeof(float) * (size_t)B * H * W * C);
    /* The same walk as im2col, adding where it copied. The CUDA twin gathers per pixel in this walk's order
     * (rows ascending), so the two sum each pixel's taps in the same order. */
    const float *src = dcol;
    for (int b = 0; b < B; b++) {
        for (int oh = 0; oh < OH; oh++) {
            for (int ow = 0; ow < OW; ow++) {
                for (int kh = 0; kh < K; kh++) {
                    const int h = oh * stride - pad + kh;
                    for (int kw = 0; kw < K; kw++, src += C) {
                        const int w = ow * stride - pad + kw;
                        if (h < 0 || h >= H || w < 0 || w >= W) {
                            continue;
                        }
                        float *px = dinp + (((size_t)b * H + h) * W + w) * C;
                        for (int c = 0; c < C; c++) {
                            px[c] += src[c];
                        }
                    }
                }
            }
        }
    }
}

/* ---- max pooling ---- */

void nn_maxpool2d_forward_cpu(float *out, int32_t *argmax, const float *inp, int B, int H, int W, int C, int P)
{
    assert(out && argmax && inp && B > 0 && C > 0 && P >= 1 && H > 0 && W > 0 && H % P == 0 && W % P == 0);
    const int OH = H / P, OW = W / P;
    size_t o = 0;
    for (int b = 0; b < B; b++) {
        for (int oh = 0; oh < OH; oh++) {
            for (int ow = 0; ow < OW; ow++) {
                for (int c = 0; c < C; c++, o++) {
                    const int i = nn_pool_window_argmax(inp, b, oh, ow, c, H, W, C, P);
                    argmax[o] = i;
                    out[o] = inp[i];
                }
            }
        }
    }
}

void nn_maxpool2d_backward_cpu(float *dinp, const float *dout, const int32_t *argmax, int B, int H, int W, int C,
                               int P)
{
    assert(dinp && dout && argmax && B > 0 && C > 0 && P >= 1 && H > 0 && W > 0 && H % P == 0 && W % P == 0);
    const size_t n_in = (size_t)B * H * W * C, n_out = n_in / ((size_t)P * P);
    memset(dinp, 0, sizeof(float) * n_in);
    /* Windows do not overlap, so no two outputs share an argmax: "=" and "+=" agree. */
    for (size_t o = 0; o < n_out; o++) {
        assert(argmax[o] >= 0 && (size_t)argmax[o] < n_in);
        dinp[argmax[o]] = dout[o];
    }
}
