/* CUDA twin of nn_encode_u8_cpu (nn/nn_mlp_encode_u8.h): a knowledge maker's bulk eval-mode forward pass.
 *
 * Same arguments as the CPU version, except that w[l] and b[l] are DEVICE pointers (the model's parameters
 * on the GPU); pixels, emb and probs are ordinary host memory. The rows go through in chunks of `chunk`
 * rows on two CUDA streams: each chunk is staged in pinned host memory, copied in as bytes (a quarter of the
 * float traffic), converted and scaled on the GPU, run through cuBLAS FP32 GEMMs with bias+ReLU kernels, and
 * copied back into pinned memory, so one chunk's copies overlap the other's compute. Returns when every
 * result is in emb / probs. CUDA failures abort with file:line (a dead GPU is not recoverable). */
#ifndef NN_CUDA_ENCODE_H
#define NN_CUDA_ENCODE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void nn_encode_u8_cuda(const float *const *w, const float *const *b, const int *in, const int *out, int n_layers,
                       int n_hidden, const uint8_t *pixels, int n, float *emb, float *probs, int chunk);

#ifdef __cplusplus
}
#endif

#endif
