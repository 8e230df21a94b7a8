/* CUDA twins of nn/nn_layers_cpu.c: same names with _cuda, same arguments, device pointers, same contracts
 * (nn/nn_ops.h). GEMMs go to cuBLAS in FP32; everything else is a kernel below.
 *
 * cuBLAS is column-major: a row-major (R, C) matrix is, to cuBLAS, its (C, R) transpose with leading dimension
 * C. Each GEMM below is written as the row-major product it computes and the column-major call that does it. */
#include "nn_cuda.h"
#include "nn_cuda_internal.h"

#include "nn_hash.h"
#include "nn_host_device.h"

/* ---- linear ---- */

__global__ static void k_add_bias(float *out, const float *bias, int B, int OC)
{
    long long n = (long long)B * OC;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        out[i] += bias[i % OC];
    }
}

/* dbias[o] += sum_b dout[b, o]: one thread per output column, coalesced across threads. */
__global__ static void k_bias_grad(float *dbias, const float *dout, int B, int OC)
{
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < OC; o += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) {
            s += dout[(size_t)b * OC + o];
        }
        dbias[o] += s;
    }
}

extern "C" void nn_linear_forward_cuda(float *out, const float *inp, const float *weight, const float *bias, int B,
                                       int C, int OC)
{
    const float one = 1.0f, zero = 0.0f;
    /* out (B, OC) = inp (B, C) @ weight^T  <=>  out^T (OC, B) = weight (OC, C) @ inp^T (C, B):
     * column-major weight is (C, OC) ld C, transposed; inp is (C, B) ld C; out is (OC, B) ld OC. */
    NN_CUBLAS_CHECK(cublasSgemm(nn_cuda_blas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, &one, weight, C, inp, C, &zero,
                                out, OC));
    if (bias) {
        k_add_bias<<<nn_blocks((long long)B * OC), NN_THREADS>>>(out, bias, B, OC);
        NN_CUDA_LAUNCHED();
    }
}

extern "C" void nn_linear_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, int B, int C, int OC)
{
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = nn_cuda_blas();
    if (dinp) {
        /* dinp (B, C) = dout (B, OC) @ weight (OC, C)  <=>  dinp^T (C, B) = weight^T (C, OC) @ dout^T (OC, B):
         * column-major weight is (C, OC) ld C as is; dout is (OC, B) ld OC. */
        NN_CUBLAS_CHECK(
            cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, B, OC, &one, weight, C, dout, OC, &zero, dinp, C));
    }
    /* dweight (OC, C) += dout^T (OC, B) @ inp (B, C)  <=>  dweight^T (C, OC) += inp^T (C, B) @ dout (B, OC). */
    NN_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, B, &one, inp, C, dout, OC, &one, dweight, C));
    if (dbias) {
        k_bias_grad<<<(OC + NN_THREADS - 1) / NN_THREADS, NN_THREADS>>>(dbias, dout, B, OC);
        NN_CUDA_LAUNCHED();
    }
}

/* ---- ReLU ---- */

__global__ static void k_relu_forward(float *out, const float *inp, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    }
}

__global__ static void k_relu_backward(float *dinp, const float *dout, const float *out, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
    }
}

extern "C" void nn_relu_forward_cuda(float *out, const float *inp, int N)
{
    if (N > 0) {
        k_relu_forward<<<nn_blocks(N), NN_THREADS>>>(out, inp, N);
        NN_CUDA_LAUNCHED();
    }
}

extern "C" void nn_relu_backward_cuda(float *dinp, const float *dout, const float *out, int N)
{
    if (N > 0) {
        k_relu_backward<<<nn_blocks(N), NN_THREADS>>>(dinp, dout, out, N);
        NN_CUDA_LAUNCHED();
    }
}

/* ---- dropout ---- */

__global__ static void k_dropout_forward(float *out, float *mask, const float *inp, float p, float scale,
                                         uint64_t seed, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        float m = nn_hash_uniform(seed, (uint64_t)i) < p ? 0.0f : scale;
        mask[i] = m;
        out[i] = inp[i] * m;
    }
}

__global__ static void k_mul(float *dinp, const float *dout, const float *mask, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        dinp[i] = dout[i] * mask[i];
    }
}

extern "C" void nn_dropout_forward_cuda(float *out, float *mask, const float *inp, float p, uint64_t seed, int N)
{
    if (N > 0) {
        const float scale = 1.0f / (1.0f - p); /* computed as the CPU does, so masks agree exactly */
        k_dropout_forward<<<nn_blocks(N), NN_THREADS>>>(out, mask, inp, p, scale, seed, N);
        NN_CUDA_LAUNCHED();
    }
}

extern "C" void nn_dropout_backward_cuda(float *dinp, const float *dout, const float *mask, int N)
{
    if (N > 0) {
        k_mul<<<nn_blocks(N), NN_THREADS>>>(dinp, dout, mask, N);
        NN_CUDA_LAUNCHED();
    }
}

/* ---- softmax cross-entropy ---- */

/* In place over row (V): row = softmax(row); returns the log-partition. Whole block cooperates. */
static __device__ float d_softmax_row(float *row, int V)
{
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        m = fmaxf(m, row[v]);
    }
    m = nn_block_reduce(m, true);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float e = expf(row[v] - m);
        row[v] = e;
        s += e;
    }
    s = nn_block_reduce(s, false);
    const float inv = 1.0f / s;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        row[v] *= inv;
    }
    return m + logf(s);
}

/* One block per row. */
__global__ static void k_softmax_ce_forward(float *losses, float *probs, const float *logits, const int32_t *targets,
                                            int V)
{
    const int b = blockIdx.x;
    const float *lrow = logits + (size_t)b * V;
    float *prow = probs + (size_t)b * V;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        prow[v] = lrow[v];
    }
    __syncthreads();
    float logz = d_softmax_row(prow, V);
    if (threadIdx.x == 0) {
        int t = targets[b];
        losses[b] = t >= 0 ? logz - lrow[t] : 0.0f;
    }
}

__global__ static void k_softmax_ce_backward(float *dlogits, const float *dlosses, const float *probs,
                                             const int32_t *targets, int B, int V)
{
    long long n = (long long)B * V;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int b = (int)(i / V), v = (int)(i % V), t = targets[b];
        dlogits[i] = t < 0 ? 0.0f : (probs[i] - (v == t ? 1.0f : 0.0f)) * dlosses[b];
    }
}

static int s_row_threads(int width)
{
    return width >= 256 ? 256 : (width >= 128 ? 128 : (width >= 64 ? 64 : 32));
}

extern "C" void nn_softmax_ce_forward_cuda(float *losses, float *probs, const float *logits, const int32_t *targets,
                                           int B, int V)
{
    k_softmax_ce_forward<<<B, s_row_threads(V)>>>(losses, probs, logits, targets, V);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_softmax_ce_backward_cuda(float *dlogits, const float *dlosses, const float *probs,
                                            const int32_t *targets, int B, int V)
{
    k_softmax_ce_backward<<<nn_blocks((long long)B * V), NN_THREADS>>>(dlogits, dlosses, probs, targets, B, V);
    NN_CUDA_LAUNCHED();
}

/* ---- L2 normalisation: one block per row ---- */

__global__ static void k_l2norm_forward(float *out, float *norms, const float *inp, float eps, int D)
{
    const int b = blockIdx.x;
    const float *x = inp + (size_t)b * D;
    float *y = out + (size_t)b * D;
    const float n = sqrtf(nn_block_dot(x, x, D) + eps);
    const float inv = 1.0f / n;
    if (threadIdx.x == 0) {
        norms[b] = n;
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        y[d] = x[d] * inv;
    }
}

__global__ static void k_l2norm_backward(float *dinp, const float *dout, const float *out, const float *norms, int D)
{
    const int b = blockIdx.x;
    const float *dy = dout + (size_t)b * D;
    const float *y = out + (size_t)b * D;
    float *dx = dinp + (size_t)b * D;
    const float dot = nn_block_dot(dy, y, D);
    const float inv = 1.0f / norms[b];
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        dx[d] = (dy[d] - y[d] * dot) * inv;
    }
}

extern "C" void nn_l2norm_forward_cuda(float *out, float *norms, const float *inp, float eps, int B, int D)
{
    k_l2norm_forward<<<B, s_row_threads(D)>>>(out, norms, inp, eps, D);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_l2norm_backward_cuda(float *dinp, const float *dout, const float *out, const float *norms, int B,
                                        int D)
{
    k_l2norm_backward<<<B, s_row_threads(D)>>>(dinp, dout, out, norms, D);
    NN_CUDA_LAUNCHED();
}

/* ---- embedding bag: one thread per (bag, feature) ---- */

__global__ static void k_bag_forward(float *out, const float *rows, const int32_t *indices, const int32_t *offsets,
                                     const float *weights, int mode, int B, int D)
{
    long long n = (long long)B * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int b = (int)(i / D), d = (int)(i % D);
        float inv = nn_bag_scale(weights, offsets, b, mode == NN_CUDA_BAG_MEAN);
        float s = 0.0f;
        for (int32_t l = offsets[b]; l < offsets[b + 1]; l++) {
            s += (weights ? weights[l] : 1.0f) * inv * rows[(size_t)indices[l] * D + d];
        }
        out[i] = s;
    }
}

__global__ static void k_bag_backward(float *drows, const float *dout, const int32_t *indices, const int32_t *offsets,
                                      const float *weights, int mode, int B, int D)
{
    long long n = (long long)B * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int b = (int)(i / D), d = (int)(i % D);
        float inv = nn_bag_scale(weights, offsets, b, mode == NN_CUDA_BAG_MEAN);
        float g = dout[i];
        for (int32_t l = offsets[b]; l < offsets[b + 1]; l++) {
            atomicAdd(&drows[(size_t)indices[l] * D + d], (weights ? weights[l] : 1.0f) * inv * g);
        }
    }
}

extern "C" void nn_embedding_bag_forward_cuda(float *out, const float *rows, const int32_t *indices,
                                              const int32_t *offsets, const float *weights, int mode, int B, int R,
                                              int D)
{
    (void)R;
    k_bag_forward<<<nn_blocks((long long)B * D), NN_THREADS>>>(out, rows, indices, offsets, weights, mode, B, D);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_embedding_bag_backward_cuda(float *drows, const float *dout, const int32_t *indices,
                                               const int32_t *offsets, const float *weights, int mode, int B, int R,
                                               int D)
{
    NN_CUDA_CHECK(cudaMemsetAsync(drows, 0, sizeof(float) * (size_t)R * (size_t)D, 0));
    k_bag_backward<<<nn_blocks((long long)B * D), NN_THREADS>>>(drows, dout, indices, offsets, weights, mode, B, D);
    NN_CUDA_LAUNCHED();
}

/* ---- neighbour squared distance ---- */

/* One warp per (b, k). */
__global__ static void k_sqdist_forward(float *out, const float *x, const float *nbr, int B, int K, int D)
{
    const int warps_per_block = blockDim.x / 32;
    const long long pair = (long long)blockIdx.x * warps_per_block + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (pair >= (long long)B * K) {
        return; /* the whole warp leaves together */
    }
    const int b = (int)(pair / K);
    const float *xb = x + (size_t)b * D;
    const float *n = nbr + (size_t)pair * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) {
        float diff = xb[d] - n[d];
        s += diff * diff;
    }
    s = nn_warp_sum(s);
    if (lane == 0) {
        out[pair] = s;
    }
}

__global__ static void k_sqdist_backward_x(float *dx, const float *dout, const float *x, const float *nbr, int B,
                                           int K, int D)
{
    long long n = (long long)B * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int b = (int)(i / D), d = (int)(i % D);
        float s = 0.0f;
        for (int k = 0; k < K; k++) {
            s += 2.0f * dout[(size_t)b * K + k] * (x[i] - nbr[((size_t)b * K + k) * D + d]);
        }
        dx[i] = s;
    }
}

__global__ static void k_sqdist_backward_nbr(float *dnbr, const float *dout, const float *x, const float *nbr, int B,
                                             int K, int D)
{
    long long n = (long long)B * K * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long pair = i / D;
        int d = (int)(i % D), b = (int)(pair / K);
        dnbr[i] = -2.0f * dout[pair] * (x[(size_t)b * D + d] - nbr[i]);
    }
}

extern "C" void nn_pairwise_sqdist_forward_cuda(float *out, const float *x, const float *nbr, int B, int K, int D)
{
    const int warps = NN_THREADS / 32;
    long long pairs = (long long)B * K;
    k_sqdist_forward<<<(int)((pairs + warps - 1) / warps), NN_THREADS>>>(out, x, nbr, B, K, D);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_pairwise_sqdist_backward_cuda(float *dx, float *dnbr, const float *dout, const float *x,
                                                 const float *nbr, int B, int K, int D)
{
    k_sqdist_backward_x<<<nn_blocks((long long)B * D), NN_THREADS>>>(dx, dout, x, nbr, B, K, D);
    NN_CUDA_LAUNCHED();
    if (dnbr) {
        k_sqdist_backward_nbr<<<nn_blocks((long long)B * K * D), NN_THREADS>>>(dnbr, dout, x, nbr, B, K, D);
        NN_CUDA_LAUNCHED();
    }
}

/* ---- InfoNCE ---- */

/* One block per row: the positive logit, the corrections, the softmax and the loss. Columns 1..N already hold
 * inv_temp * <q, neg_j> from the GEMM. */
__global__ static void k_infonce_rows(float *losses, float *probs, const float *q, const float *pos,
                                      const float *pos_logq, const float *neg_logq, float inv_temp, int N, int D)
{
    const int b = blockIdx.x, W = 1 + N;
    float *row = probs + (size_t)b * W;
    const float *qb = q + (size_t)b * D;
    const float *pb = pos + (size_t)b * D;
    const float logit0 = inv_temp * nn_block_dot(qb, pb, D) - (pos_logq ? pos_logq[b] : 0.0f);
    if (threadIdx.x == 0) {
        row[0] = logit0;
    }
    if (neg_logq) {
        for (int j = threadIdx.x; j < N; j += blockDim.x) {
            row[1 + j] -= neg_logq[j];
        }
    }
    __syncthreads();
    float logz = d_softmax_row(row, W);
    if (threadIdx.x == 0) {
        losses[b] = logz - logit0;
    }
}

/* probs (B, W) -> dlogits = (probs - onehot(0)) * dlosses[b]. */
__global__ static void k_infonce_dlogits(float *probs, const float *dlosses, int B, int W)
{
    long long n = (long long)B * W;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int b = (int)(i / W), j = (int)(i % W);
        probs[i] = (probs[i] - (j == 0 ? 1.0f : 0.0f)) * dlosses[b];
    }
}

/* dq[b] += inv_temp * dlogit0[b] * pos[b];  dpos[b] = inv_temp * dlogit0[b] * q[b]. */
__global__ static void k_infonce_pos(float *dq, float *dpos, const float *dl, const float *q, const float *pos,
                                     float inv_temp, int B, int W, int D)
{
    long long n = (long long)B * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int b = (int)(i / D);
        float g0 = inv_temp * dl[(size_t)b * W];
        dq[i] += g0 * pos[i];
        if (dpos) {
            dpos[i] = g0 * q[i];
        }
    }
}

extern "C" void nn_infonce_forward_cuda(float *losses, float *probs, const float *q, const float *pos,
                                        const float *neg, const float *pos_logq, const float *neg_logq,
                                        float inv_temp, int B, int N, int D)
{
    const int W = 1 + N;
    const float zero = 0.0f;
    /* probs[:, 1:] (B, N, row stride W) = inv_temp * q (B, D) @ neg^T  <=>  (N, B) ld W = neg (N, D)^T... :
     * column-major neg is (D, N) ld D, transposed; q is (D, B) ld D. */
    NN_CUBLAS_CHECK(cublasSgemm(nn_cuda_blas(), CUBLAS_OP_T, CUBLAS_OP_N, N, B, D, &inv_temp, neg, D, q, D, &zero,
                                probs + 1, W));
    k_infonce_rows<<<B, s_row_threads(W > D ? W : D)>>>(losses, probs, q, pos, pos_logq, neg_logq, inv_temp, N, D);
    NN_CUDA_LAUNCHED();
}

extern "C" void nn_infonce_backward_cuda(float *dq, float *dpos, float *dneg, float *probs, const float *dlosses,
                                         const float *q, const float *pos, const float *neg, float inv_temp, int B,
                                         int N, int D)
{
    const int W = 1 + N;
    const float zero = 0.0f;
    cublasHandle_t h = nn_cuda_blas();
    k_infonce_dlogits<<<nn_blocks((long long)B * W), NN_THREADS>>>(probs, dlosses, B, W);
    NN_CUDA_LAUNCHED();
    /* dq (B, D) = inv_temp * dlogits[:, 1:] (B, N) @ neg (N, D)  <=>  dq^T (D, B) = neg^T (D, N) @ dl^T (N, B):
     * column-major neg is (D, N) ld D as is; dlogits[:, 1:] is (N, B) ld W. */
    NN_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, D, B, N, &inv_temp, neg, D, probs + 1, W, &zero, dq, D));
    k_infonce_pos<<<nn_blocks((long long)B * D), NN_THREADS>>>(dq, dpos, probs, q, pos, inv_temp, B, W, D);
    NN_CUDA_LAUNCHED();
    if (dneg) {
        /* dneg (N, D) = inv_temp * dl^T (N, B) @ q (B, D)  <=>  dneg^T (D, N) = q^T (D, B) @ dl (B, N):
         * column-major q is (D, B) ld D; dlogits[:, 1:] is (N, B) ld W, transposed. */
        NN_CUBLAS_CHECK(
            cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, D, N, B, &inv_temp, q, D, probs + 1, W, &zero, dneg, D));
    }
}

/* ---- helpers ---- */

__global__ static void k_add(float *y, const float *x, float alpha, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        y[i] += alpha * x[i];
    }
}

__global__ static void k_argmax(int32_t *pred, const float *x, int B, int V)
{
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
        pred[b] = nn_row_argmax(x + (size_t)b * V, V);
    }
}

extern "C" void nn_add_cuda(float *y, const float *x, float alpha, int N)
{
    if (N > 0) {
        k_add<<<nn_blocks(N), NN_THREADS>>>(y, x, alpha, N);
        NN_CUDA_LAUNCHED();
    }
}

extern "C" void nn_argmax_cuda(int32_t *pred, const float *x, int B, int V)
{
    k_argmax<<<nn_blocks(B), NN_THREADS>>>(pred, x, B, V);
    NN_CUDA_LAUNCHED();
}

/* ---- optimisers ---- */

__global__ static void k_sgd(float *params, const float *grads, float *mom, float lr, float momentum,
                             float weight_decay, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        float g = grads[i] + weight_decay * params[i];
        if (mom) {
            mom[i] = momentum * mom[i] + g;
            g = mom[i];
        }
        params[i] -= lr * g;
    }
}

__global__ static void k_adam(float *params, const float *grads, float *m, float *v, float lr, float beta1,
                              float beta2, float eps, float weight_decay, float c1, float c2, int N)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        float g = grads[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        params[i] -= lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + weight_decay * params[i]);
    }
}

extern "C" void nn_sgd_update_cuda(float *params, const float *grads, float *mom, float lr, float momentum,
                                   float weight_decay, int N)
{
    if (N > 0) {
        k_sgd<<<nn_blocks(N), NN_THREADS>>>(params, grads, mom, lr, momentum, weight_decay, N);
        NN_CUDA_LAUNCHED();
    }
}

extern "C" void nn_adam_update_cuda(float *params, const float *grads, float *m, float *v, float lr, float beta1,
                                    float beta2, float eps, float weight_decay, int t, int N)
{
    if (N > 0) {
        /* Bias corrections on the host, exactly as the CPU version computes them. */
        const float c1 = 1.0f / (1.0f - powf(beta1, (float)t));
        const float c2 = 1.0f / (1.0f - powf(beta2, (float)t));
        k_adam<<<nn_blocks(N), NN_THREADS>>>(params, grads, m, v, lr, beta1, beta2, eps, weight_decay, c1, c2, N);
        NN_CUDA_LAUNCHED();
    }
}
