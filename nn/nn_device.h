/* Run-time device selection and the table of operations per device.
 *
 * A model asks nn_ops_for(device) once and calls every operation and every memory transfer through the
 * returned table, so the same model code runs on the CPU (nn_*_cpu, host memory) or on a CUDA GPU
 * (nn_*_cuda from cuda/, device memory). "auto" picks CUDA when this build has the CUDA kernels and
 * cudaGetDeviceCount finds a GPU, and the CPU otherwise, saying so in one LOG_INFO line. */
#ifndef NN_DEVICE_H
#define NN_DEVICE_H

#include "nn_ops.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    NN_DEVICE_AUTO = 0,
    NN_DEVICE_CPU = 1,
    NN_DEVICE_CUDA = 2,
} nn_device_t;

/* One device's operations. Pointers given to the ops and taken from alloc live on that device. */
typedef struct nn_ops {
    nn_device_t device;  /* NN_DEVICE_CPU or NN_DEVICE_CUDA */
    const char *name;    /* "cpu" or "cuda" */
    /* Memory: alloc returns zeroed memory and aborts on failure (out of memory is not recoverable). */
    void *(*alloc)(size_t bytes);
    void (*free)(void *ptr);
    void (*to_device)(void *dst, const void *host_src, size_t bytes);
    void (*to_host)(void *host_dst, const void *src, size_t bytes);
    void (*zero)(void *ptr, size_t bytes);
    void (*synchronize)(void);
    /* Operations, see nn_ops.h for each one's contract. */
    void (*linear_forward)(float *, const float *, const float *, const float *, int, int, int);
    void (*linear_backward)(float *, float *, float *, const float *, const float *, const float *, int, int, int);
    void (*relu_forward)(float *, const float *, int);
    void (*relu_backward)(float *, const float *, const float *, int);
    void (*dropout_forward)(float *, float *, const float *, float, uint64_t, int);
    void (*dropout_backward)(float *, const float *, const float *, int);
    void (*softmax_ce_forward)(float *, float *, const float *, const int32_t *, int, int);
    void (*softmax_ce_backward)(float *, const float *, const float *, const int32_t *, int, int);
    void (*l2norm_forward)(float *, float *, const float *, float, int, int);
    void (*l2norm_backward)(float *, const float *, const float *, const float *, int, int);
    void (*embedding_bag_forward)(float *, const float *, const int32_t *, const int32_t *, const float *, int, int,
                                  int, int);
    void (*embedding_bag_backward)(float *, const float *, const int32_t *, const int32_t *, const float *, int, int,
                                   int, int);
    void (*pairwise_sqdist_forward)(float *, const float *, const float *, int, int, int);
    void (*pairwise_sqdist_backward)(float *, float *, const float *, const float *, const float *, int, int, int);
    void (*infonce_forward)(float *, float *, const float *, const float *, const float *, const float *,
                            const float *, float, int, int, int);
    void (*infonce_backward)(float *, float *, float *, float *, const float *, const float *, const float *,
                             const float *, float, int, int, int);
    void (*im2col_forward)(float *, const float *, int, int, int, int, int, int, int);
    void (*col2im_backward)(float *, const float *, int, int, int, int, int, int, int);
    void (*maxpool2d_forward)(float *, int32_t *, const float *, int, int, int, int, int);
    void (*maxpool2d_backward)(float *, const float *, const int32_t *, int, int, int, int, int);
    void (*add)(float *, const float *, float, int);
    void (*argmax)(int32_t *, const float *, int, int);
    void (*sgd_update)(float *, const float *, float *, float, float, float, int);
    void (*adam_update)(float *, const float *, float *, float *, float, float, float, float, float, int, int);
} nn_ops_t;

/* Parses "auto", "cpu" or "cuda". Returns 0 and sets *out, or -1 for anything else. */
int nn_device_parse(const char *text, nn_device_t *out);

/* "auto", "cpu" or "cuda". */
const char *nn_device_name(nn_device_t device);

/* True when this build contains the CUDA kernels. */
bool nn_cuda_compiled(void);

/* Number of usable CUDA devices: 0 when the build has no CUDA, or there is no GPU or no driver. */
int nn_cuda_device_count(void);

/* Turns a requested device into the one to use. AUTO becomes CUDA when nn_cuda_device_count() > 0, else CPU
 * (logged once at INFO). CUDA when this build has no CUDA kernels, or no GPU is usable, is an error: returns
 * -1 and writes the reason to err (errlen bytes). Returns 0 and sets *out otherwise. */
int nn_device_resolve(nn_device_t requested, nn_device_t *out, char *err, size_t errlen);

/* The operations of a resolved device (CPU or CUDA); NULL for CUDA in a build without it, or for AUTO. The
 * CUDA table initialises the GPU (cuBLAS handle) on first use. */
const nn_ops_t *nn_ops_for(nn_device_t device);

/* OpenBLAS threads for the CPU path: sets them to n (n >= 1) and returns the number in effect. */
int nn_cpu_set_threads(int n);

#endif
