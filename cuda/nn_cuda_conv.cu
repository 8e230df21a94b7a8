/* CUDA twins of nn/nn_conv_cpu.c: im2col, its adjoint, and max pooling, NHWC, same contracts (nn/nn_ops.h).
 * Every kernel writes each output element from one thread and adds nothing atomically, so the results are
 * deterministic. im2col and pooling only copy, so they equal the CPU's bit for bit; col2im sums each pixel's taps
 * in the order the CPU adds them, so it should too (the parity test still allows 1e-6). */
#include "nn_cuda.h"
#include "nn_cuda_internal.h"

#include "nn_host_device.h"

/* nn_conv_out_size of nn/nn_ops.h (cuda/ includes nothing from nn/); the CPU side asserts the arguments. */
static int s_out_size(int in, int K, int stride, int pad)
{
    return (in + 2 * pad - K) / stride + 1;
}

/* ---- im2col / col2im ---- */

/* One thread per column entry (b, oh, ow, kh, kw, c), in col's own order so the writes coalesce. */
__global__ static void k_im2col(float *col, const float *inp, int B, int H, int W, int C, int K, int stride, int pad,
                                int OH, int OW)
{
    const int KKC = K * K * C;
    const long long n = (long long)B * OH * OW * KKC;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / KKC;
        const int j = (int)(i % KKC);
        const int c = j % C, kw = (j / C) % K, kh = j / (K * C);
        const int ow = (int)(row % OW), oh = (int)((row / OW) % OH), b = (int)(row / ((long long)OW * OH));
        const int h = oh * stride - pad + kh, w = ow * stride - pad + kw;
        col[i] = (h < 0 || h >= H || w < 0 || w >= W) ? 0.0f : inp[(((size_t)b * H + h) * W + w) * C + c];
    }
}

/* One thread per input element (b, h, w, c): the sum of the column entries read from it. Output row (oh, ow) reads
 * the pixel through tap (h + pad - oh*stride, w + pad - ow*stride) when both lie in [0, K); the rows are visited in
 * ascending order, the order in which the CPU's scatter adds them. */
__global__ static void k_col2im(float *dinp, const float *dcol, int B, int H, int W, int C, int K, int stride,
                                int pad, int OH, int OW)
{
    const int KKC = K * K * C;
    const long long n = (long long)B * H * W * C;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % C), w = (int)((i / C) % W), h = (int)((i / ((long long)C * W)) % H);
        const int b = (int)(i / ((long long)C * W * H));
        const int hp = h + pad, wp = w + pad;
        /* Rows whose window covers the pixel: oh*stride <= hp < oh*stride + K (likewise ow), clipped to the grid. */
        const int oh_lo = hp - K + 1 <= 0 ? 0 : (hp - K + stride) / stride;
        const int ow_lo = wp - K + 1 <= 0 ? 0 : (wp - K + stride) / stride;
        const int oh_hi = min(hp / stride, OH - 1), ow_hi = min(wp / stride, OW - 1);
        float s = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; oh++) {
            const int kh = hp - oh * stride;
            for (int ow = ow_lo; ow <= ow_hi; ow++) {
                const int kw = wp - ow * stride;
                const size_t row = ((size_t)b * OH + oh) * OW + ow;
                s += dcol[row * KKC + (size_t)(kh * K + kw) * C + c];
            }
        }
        dinp[i] = s;
    }
}

extern "C" void nn_im2col_forward_cuda(float *col, const float *inp, int B, int H, int W, int C, int K, int stride,
                                       int pad)
{
    const int OH = s_out_size(H, K, stride, pad), OW = s_out_size(W, K, stride, pad);
    k_im2col<<<nn_blocks((long long)B * OH * OW * K * K * C), NN_THREADS>>>(col, inp, B, H, W, C, K, stride, pad, OH,
                                                                           OW);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_col2im_backward_cuda(float *dinp, const float *dcol, int B, int H, int W, int C, int K, int stride,
                                        int pad)
{
    const int OH = s_out_size(H, K, stride, pad), OW = s_out_size(W, K, stride, pad);
    k_col2im<<<nn_blocks((long long)B * H * W * C), NN_THREADS>>>(dinp, dcol, B, H, W, C, K, stride, pad, OH, OW);
    NN_CUDA_LAUNCHED();
}

/* ---- max pooling ---- */

/* One thread per output element (b, oh, ow, c). */
__global__ static void k_maxpool_forward(float *out, int32_t *argmax, const float *inp, int B, int H, int W, int C,
                                         int P)
{
    const int OH = H / P, OW = W / P;
    const long long n = (long long)B * OH * OW * C;
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < n; o += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(o % C), ow = (int)((o / C) % OW), oh = (int)((o / ((long long)C * OW)) % OH);
        const int b = (int)(o / ((long long)C * OW * OH));
        const int i = nn_pool_window_argmax(inp, b, oh, ow, c, H, W, C, P);
        argmax[o] = i;
        out[o] = inp[i];
    }
}

/* One thread per input element: its window's gradient if it was the window's argmax, else 0 (no zeroing pass). */
__global__ static void k_maxpool_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int H, int W,
                                          int C, int P)
{
    const int OH = H / P, OW = W / P;
    const long long n = (long long)B * H * W * C;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % C), w = (int)((i / C) % W), h = (int)((i / ((long long)C * W)) % H);
        const int b = (int)(i / ((long long)C * W * H));
        const size_t o = (((size_t)b * OH + h / P) * OW + w / P) * C + c;
        dinp[i] = argmax[o] == i ? dout[o] : 0.0f;
    }
}

extern "C" void nn_maxpool2d_forward_cuda(float *out, int32_t *argmax, const float *inp, int B, int H, int W, int C,
                                          int P)
{
    k_maxpool_forward<<<nn_blocks((long long)B * (H / P) * (W / P) * C), NN_THREADS>>>(out, argmax, inp, B, H, W, C,
                                                                                      P);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_maxpool2d_backward_cuda(float *dinp, const float *dout, const int32_t *argmax, int B, int H, int W,
                                           int C, int P)
{
    k_maxpool_backward<<<nn_blocks((long long)B * H * W * C), NN_THREADS>>>(dinp, dout, argmax, B, H, W, C, P);
    NN_CUDA_LAUNCHED();
}
