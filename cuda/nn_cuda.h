/* CUDA twins of the operations in nn/nn_ops.h: the same names ending in _cuda, the same arguments, device
 * pointers. Each one's contract (shapes, what overwrites and what accumulates) is the CPU version's; see
 * nn/nn_ops.h. All kernels run on one stream of this library's (the default stream); cuBLAS runs on it too.
 * A CUDA or cuBLAS failure is a dead GPU: it is logged with file:line and the process aborts.
 *
 * Only built when CMake found nvcc (CARLS_HAVE_CUDA); the C code reaches it through nn/nn_device.h. */
#ifndef NN_CUDA_H
#define NN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaGetDeviceCount, with every error (no driver, no device) reported as 0. Never aborts. */
int nn_cuda_device_count_raw(void);
/* Creates the cuBLAS handle on first call (idempotent). */
void nn_cuda_init(void);

void *nn_cuda_alloc(size_t bytes); /* zeroed */
void nn_cuda_free(void *ptr);
void nn_cuda_to_device(void *dst, const void *host_src, size_t bytes);
void nn_cuda_to_host(void *host_dst, const void *src, size_t bytes);
void nn_cuda_zero(void *ptr, size_t bytes);
void nn_cuda_synchronize(void);

void nn_linear_forward_cuda(float *out, const float *inp, const float *weight, const float *bias, int B, int C,
                            int OC);
void nn_linear_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, int B, int C, int OC);
void nn_relu_forward_cuda(float *out, const float *inp, int N);
void nn_relu_backward_cuda(float *dinp, const float *dout, const float *out, int N);
void nn_dropout_forward_cuda(float *out, float *mask, const float *inp, float p, uint64_t seed, int N);
void nn_dropout_backward_cuda(float *dinp, const float *dout, const float *mask, int N);
void nn_softmax_ce_forward_cuda(float *losses, float *probs, const float *logits, const int32_t *targets, int B,
                                int V);
void nn_softmax_ce_backward_cuda(float *dlogits, const float *dlosses, const float *probs, const int32_t *targets,
                                 int B, int V);
void nn_l2norm_forward_cuda(float *out, float *norms, const float *inp, float eps, int B, int D);
void nn_l2norm_backward_cuda(float *dinp, const float *dout, const float *out, const float *norms, int B, int D);
/* The embedding-bag twins' `mode`: 0 sums the weighted rows, 1 divides by the bag's total weight (nn/nn_ops.h's
 * NN_BAG_SUM and NN_BAG_MEAN, which nn/nn_device.c checks at compile time against these). */
#define NN_CUDA_BAG_SUM 0
#define NN_CUDA_BAG_MEAN 1
void nn_embedding_bag_forward_cuda(float *out, const float *rows, const int32_t *indices, const int32_t *offsets,
                                   const float *weights, int mode, int B, int R, int D);
void nn_embedding_bag_backward_cuda(float *drows, const float *dout, const int32_t *indices, const int32_t *offsets,
                                    const float *weights, int mode, int B, int R, int D);
void nn_pairwise_sqdist_forward_cuda(float *out, const float *x, const float *nbr, int B, int K, int D);
void nn_pairwise_sqdist_backward_cuda(float *dx, float *dnbr, const float *dout, const float *x, const float *nbr,
                                      int B, int K, int D);
void nn_infonce_forward_cuda(float *losses, float *probs, const float *q, const float *pos, const float *neg,
                             const float *pos_logq, const float *neg_logq, float inv_temp, int B, int N, int D);
void nn_infonce_backward_cuda(float *dq, float *dpos, float *dneg, float *probs, const float *dlosses,
                              const float *q, const float *pos, const float *neg, float inv_temp, int B, int N,
                              int D);
void nn_im2col_forward_cuda(float *col, const float *inp, int B, int H, int W, int C, int K, int stride, int pad);
/* Deterministic: one thread per input element gathers over the taps that read it (no atomics). */
void nn_col2im_backward_cuda(float *dinp, const float *dcol, int B, int H, int W, int C, int K, int stride, int pad);
void nn_maxpool2d_forward_cuda(float *out, int32_t *argmax, const float *inp, int B, int H, int W, int C, int P);
void nn_maxpool2d_backward_cuda(float *dinp, const float *dout, const int32_t *argmax, int B, int H, int W, int C,
                                int P);
void nn_add_cuda(float *y, const float *x, float alpha, int N);
void nn_argmax_cuda(int32_t *pred, const float *x, int B, int V);
void nn_sgd_update_cuda(float *params, const float *grads, float *mom, float lr, float momentum, float weight_decay,
                        int N);
void nn_adam_update_cuda(float *params, const float *grads, float *m, float *v, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int t, int N);

#ifdef __cplusplus
}
#endif

#endif
