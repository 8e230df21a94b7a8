/* Private helpers of the CUDA kernels: error checks, the cuBLAS handle, launch sizes and block reductions.
 * Only for the .cu files in cuda/. */
#ifndef NN_CUDA_INTERNAL_H
#define NN_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "log.h"
}

#include <stdlib.h>

/* A CUDA or cuBLAS failure means a dead or misused GPU: log file:line and abort (STYLE.md, failure kinds). */
#define NN_CUDA_CHECK(call)                                                                                 \
    do {                                                                                                    \
        cudaError_t nn_e_ = (call);                                                                         \
        if (nn_e_ != cudaSuccess) {                                                                         \
            CARLS_FATAL("CUDA: %s failed: %s", #call, cudaGetErrorString(nn_e_));                         \
        }                                                                                                   \
    } while (0)

#define NN_CUBLAS_CHECK(call)                                                                               \
    do {                                                                                                    \
        cublasStatus_t nn_s_ = (call);                                                                      \
        if (nn_s_ != CUBLAS_STATUS_SUCCESS) {                                                               \
            CARLS_FATAL("cuBLAS: %s failed: status %d", #call, (int)nn_s_);                               \
        }                                                                                                   \
    } while (0)

/* After a kernel launch. */
#define NN_CUDA_LAUNCHED() NN_CUDA_CHECK(cudaGetLastError())

/* The library's cuBLAS handle (created by nn_cuda_init). */
cublasHandle_t nn_cuda_blas(void);

#define NN_THREADS 256

/* Blocks for a grid-stride loop over n elements. */
static inline int nn_blocks(long long n)
{
    long long b = (n + NN_THREADS - 1) / NN_THREADS;
    if (b < 1) {
        b = 1;
    }
    return b > 65535LL * 32 ? 65535 * 32 : (int)b;
}

static __device__ __forceinline__ float nn_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

static __device__ __forceinline__ float nn_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* Sum (or max) of v over the whole block, returned to every thread. blockDim.x is a multiple of 32. */
static __device__ __forceinline__ float nn_block_reduce(float v, bool is_max)
{
    __shared__ float shared[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = is_max ? nn_warp_max(v) : nn_warp_sum(v);
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.0f);
        w = is_max ? nn_warp_max(w) : nn_warp_sum(w);
        if (lane == 0) {
            shared[0] = w;
        }
    }
    __syncthreads();
    float r = shared[0];
    __syncthreads(); /* shared may be reused by the next call */
    return r;
}

/* <a, b> over D floats by the whole block (a strided share per thread, then nn_block_reduce), returned to every
 * thread. */
static __device__ __forceinline__ float nn_block_dot(const float *a, const float *b, int D)
{
    float s = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        s += a[d] * b[d];
    }
    return nn_block_reduce(s, false);
}

#endif
