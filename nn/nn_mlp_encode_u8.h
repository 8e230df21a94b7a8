/* The MLP's (nn_mlp.h) bulk encode for knowledge makers: nn_mlp_encode_u8 / nn_encode_u8_cpu, a maker's
 * forward pass over grey-level images (bytes, scaled by 1/255 on the device), writing the last hidden layer
 * and, with a classifier, the class probabilities. The CPU version is the reference; the CUDA twin
 * (cuda/nn_cuda_encode.h) pipelines the chunks through pinned host memory on two streams so copies overlap
 * compute. */
#ifndef NN_MLP_ENCODE_U8_H
#define NN_MLP_ENCODE_U8_H

#include "nn_mlp.h"

#include <stdint.h>

/* Eval-mode forward pass of an MLP given by its layers, on the CPU (host pointers):
 *   x = pixels / 255  (n, in[0]);  h_l = relu(h_{l-1} @ w[l]^T + b[l]) for l < n_hidden;
 *   emb (n, out[n_hidden-1]) = h_{n_hidden-1};  probs (n, out[n_layers-1]) = softmax(logits) when
 *   n_layers > n_hidden and probs is not NULL.
 * w[l] (out[l], in[l]), b[l] (out[l]); in[l+1] == out[l]. emb may be NULL. Works in chunks of `chunk` rows
 * (>= 1); the result does not depend on the chunk size beyond BLAS rounding. */
void nn_encode_u8_cpu(const float *const *w, const float *const *b, const int *in, const int *out, int n_layers,
                      int n_hidden, const uint8_t *pixels, int n, float *emb, float *probs, int chunk);

/* nn_encode_u8 on the model's device: the CPU reference above, or the CUDA twin when the model lives on a GPU
 * (weights already there; the pixels are read from host memory and the results written to host memory).
 * pixels (n, in_dim) host bytes; emb (n, hidden[n_hidden-1]) host or NULL; probs (n, num_classes) host or
 * NULL (needs a classifier). chunk <= 0 picks 4096. A model with convolutions runs its own forward pass
 * (nn_mlp_encode, nn_mlp_predict) in chunks of its max_batch instead, whatever chunk says. */
void nn_mlp_encode_u8(nn_mlp_t *self, const uint8_t *pixels, int n, float *emb, float *probs, int chunk);

#endif
