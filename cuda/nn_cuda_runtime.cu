/* Device discovery, the cuBLAS handle and device memory for the nn operations (see nn_cuda.h). */
#include "nn_cuda.h"
#include "nn_cuda_internal.h"

static cublasHandle_t s_blas = NULL;

extern "C" int nn_cuda_device_count_raw(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky error: no driver or no device is an answer, not a fault */
        LOG_DEBUG("cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return 0;
    }
    return count;
}

extern "C" void nn_cuda_init(void)
{
    if (s_blas) {
        return;
    }
    NN_CUDA_CHECK(cudaSetDevice(0));
    NN_CUBLAS_CHECK(cublasCreate(&s_blas));
    /* Plain FP32 math (no TF32), so that the GPU results stay within float rounding of the CPU reference. */
    NN_CUBLAS_CHECK(cublasSetMathMode(s_blas, CUBLAS_DEFAULT_MATH));
    cudaDeviceProp prop;
    NN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    LOG_INFO("CUDA device 0: %s, %d SMs, %.1f GiB", prop.name, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

cublasHandle_t nn_cuda_blas(void)
{
    nn_cuda_init();
    return s_blas;
}

extern "C" void *nn_cuda_alloc(size_t bytes)
{
    void *p = NULL;
    NN_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    NN_CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}

extern "C" void nn_cuda_free(void *ptr)
{
    if (ptr) {
        NN_CUDA_CHECK(cudaFree(ptr));
    }
}

extern "C" void nn_cuda_to_device(void *dst, const void *host_src, size_t bytes)
{
    if (bytes) {
        NN_CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
    }
}

extern "C" void nn_cuda_to_host(void *host_dst, const void *src, size_t bytes)
{
    if (bytes) {
        NN_CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
    }
}

extern "C" void nn_cuda_zero(void *ptr, size_t bytes)
{
    if (bytes) {
        NN_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, 0));
    }
}

extern "C" void nn_cuda_synchronize(void)
{
    NN_CUDA_CHECK(cudaDeviceSynchronize());
}
