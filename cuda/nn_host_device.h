/* Small functions compiled both for the host (nn/nn_layers_cpu.c, nn/nn_conv_cpu.c: the CPU reference ops) and for
 * the device (the CUDA twins in this folder), so the two sides compute these from one definition and agree bit for
 * bit (the parity tests compare them). The counter RNG both sides draw dropout masks from is nn_hash.h. */
#ifndef NN_HOST_DEVICE_H
#define NN_HOST_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define NN_HOST_DEVICE __host__ __device__
#else
#define NN_HOST_DEVICE
#endif

/* Index of the largest of row[0 .. V-1] (V >= 1); the first one on ties. */
static inline NN_HOST_DEVICE int nn_row_argmax(const float *row, int V)
{
    int best = 0;
    for (int v = 1; v < V; v++) {
        if (row[v] > row[best]) {
            best = v;
        }
    }
    return best;
}

/* The factor every entry of embedding bag b (offsets[b] .. offsets[b+1]-1) is scaled by on top of its weight
 * (1 each when weights is NULL): 1 for a sum; for a mean, 1 / the bag's total weight (1 when that is 0, so an
 * empty bag gives 0). */
static inline NN_HOST_DEVICE float nn_bag_scale(const float *weights, const int32_t *offsets, int b, bool mean)
{
    if (!mean) {
        return 1.0f;
    }
    float total = 0.0f;
    for (int32_t l = offsets[b]; l < offsets[b + 1]; l++) {
        total += weights ? weights[l] : 1.0f;
    }
    return 1.0f / (total != 0.0f ? total : 1.0f);
}

/* The flat index into inp (B, H, W, C) of the largest element of the P x P pooling window at output (b, oh, ow,
 * c) (stride P, no padding); the first one in row-major window order on ties. */
static inline NN_HOST_DEVICE int nn_pool_window_argmax(const float *inp, int b, int oh, int ow, int c, int H, int W,
                                                       int C, int P)
{
    int best = ((b * H + oh * P) * W + ow * P) * C + c;
    for (int ph = 0; ph < P; ph++) {
        for (int pw = 0; pw < P; pw++) {
            int i = ((b * H + oh * P + ph) * W + ow * P + pw) * C + c;
            if (inp[i] > inp[best]) {
                best = i;
            }
        }
    }
    return best;
}

#endif
