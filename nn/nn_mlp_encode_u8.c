/* The makers' bulk encode of grey-level images (see nn_mlp_encode_u8.h). */
#include "nn_mlp_encode_u8.h"

#include "nn_ops.h"

#include "util.h"

#include <assert.h>
#include <stdlib.h>

#ifdef CARLS_HAVE_CUDA
#include "nn_cuda_encode.h"
#endif

void nn_encode_u8_cpu(const float *const *w, const float *const *b, const int *in, const int *out, int n_layers,
                      int n_hidden, const uint8_t *pixels, int n, float *emb, float *probs, int chunk)
{
    assert(n_layers >= n_hidden && n_hidden >= 1 && chunk >= 1 && n >= 0);
    int maxw = in[0];
    for (int l = 0; l < n_layers; l++) {
        maxw = out[l] > maxw ? out[l] : maxw;
    }
    float *buf[2];
    buf[0] = carls_xmalloc(sizeof(float) * (size_t)chunk * (size_t)maxw);
    buf[1] = carls_xmalloc(sizeof(float) * (size_t)chunk * (size_t)maxw);
    int32_t *targets = carls_xmalloc(sizeof(int32_t) * (size_t)chunk);
    float *losses = carls_xmalloc(sizeof(float) * (size_t)chunk);
    for (int i = 0; i < chunk; i++) {
        targets[i] = -1;
    }
    const int E = out[n_hidden - 1];
    for (int off = 0; off < n; off += chunk) {
        const int m = n - off < chunk ? n - off : chunk;
        const uint8_t *px = pixels + (size_t)off * (size_t)in[0];
        for (size_t i = 0; i < (size_t)m * (size_t)in[0]; i++) {
            buf[0][i] = (float)px[i] * (1.0f / 255.0f);
        }
        int cur = 0;
        for (int l = 0; l < n_layers; l++) {
            nn_linear_forward_cpu(buf[1 - cur], buf[cur], w[l], b[l], m, in[l], out[l]);
            cur = 1 - cur;
            if (l < n_hidden) {
                nn_relu_forward_cpu(buf[cur], buf[cur], m * out[l]);
                if (l == n_hidden - 1 && emb) {
                    float *dst = emb + (size_t)off * (size_t)E;
                    for (size_t i = 0; i < (size_t)m * (size_t)E; i++) {
                        dst[i] = buf[cur][i];
                    }
                }
                if (l == n_hidden - 1 && (!probs || n_layers == n_hidden)) {
                    break;
                }
            } else if (probs) {
                const int C = out[l];
                nn_softmax_ce_forward_cpu(losses, probs + (size_t)off * (size_t)C, buf[cur], targets, m, C);
            }
        }
    }
    free(buf[0]);
    free(buf[1]);
    free(targets);
    free(losses);
}

/* A model with convolutions goes through its own forward pass (nn_mlp_encode / nn_mlp_predict, on its
 * device), max_batch images at a time: the fused layer loops above know only linear layers. */
static void s_encode_u8_model(nn_mlp_t *self, const uint8_t *pixels, int n, float *emb, float *probs)
{
    const size_t D = (size_t)self->cfg.in_dim;
    const int E = self->cfg.hidden[self->cfg.n_hidden - 1], C = self->cfg.num_classes;
    float *x = carls_xmalloc(sizeof(float) * (size_t)self->max_batch * D);
    for (int off = 0; off < n; off += self->max_batch) {
        const int m = n - off < self->max_batch ? n - off : self->max_batch;
        const uint8_t *px = pixels + (size_t)off * D;
        for (size_t i = 0; i < (size_t)m * D; i++) {
            x[i] = (float)px[i] * (1.0f / 255.0f);
        }
        if (emb) {
            nn_mlp_encode(self, x, m, emb + (size_t)off * (size_t)E);
        }
        if (probs) {
            nn_mlp_predict(self, x, m, probs + (size_t)off * (size_t)C);
        }
    }
    free(x);
}

void nn_mlp_encode_u8(nn_mlp_t *self, const uint8_t *pixels, int n, float *emb, float *probs, int chunk)
{
    assert(self && (emb || probs));
    assert(!probs || self->cfg.num_classes > 0);
    if (chunk <= 0) {
        chunk = 4096;
    }
    if (n <= 0) {
        return;
    }
    if (self->cfg.n_conv > 0) {
        s_encode_u8_model(self, pixels, n, emb, probs);
        return;
    }
    const float *w[NN_MLP_MAX_LAYERS], *b[NN_MLP_MAX_LAYERS];
    for (int l = 0; l < self->n_layers; l++) {
        w[l] = self->w[l];
        b[l] = self->b[l];
    }
#ifdef CARLS_HAVE_CUDA
    if (self->ops->device == NN_DEVICE_CUDA) {
        nn_encode_u8_cuda(w, b, self->in, self->out, self->n_layers, self->cfg.n_hidden, pixels, n, emb, probs,
                          chunk);
        return;
    }
#endif
    nn_encode_u8_cpu(w, b, self->in, self->out, self->n_layers, self->cfg.n_hidden, pixels, n, emb, probs, chunk);
}
