/* The MLP model (see nn_mlp.h). Every tensor operation goes through self->ops, so this file never touches
 * device memory directly; host scratch (targets, losses) is only for bookkeeping. */
#include "nn_mlp.h"

#include "nn_hash.h"

#include "log.h"
#include "util.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nn_mlp_config_check(const nn_mlp_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->in_dim < 1 || cfg->in_dim > NN_MLP_MAX_WIDTH) {
        return carls_errorf(err, errlen, -1, "input width %d outside 1..%d", cfg->in_dim, NN_MLP_MAX_WIDTH);
    }
    if (cfg->n_hidden < 1 || cfg->n_hidden > NN_MLP_MAX_HIDDEN) {
        return carls_errorf(err, errlen, -1, "%d hidden layers (1..%d allowed)", cfg->n_hidden, NN_MLP_MAX_HIDDEN);
    }
    for (int l = 0; l < cfg->n_hidden; l++) {
        if (cfg->hidden[l] < 1 || cfg->hidden[l] > NN_MLP_MAX_WIDTH) {
            return carls_errorf(err, errlen, -1, "hidden layer %d width %d outside 1..%d", l, cfg->hidden[l],
                          NN_MLP_MAX_WIDTH);
        }
    }
    if (cfg->num_classes < 0 || cfg->num_classes > NN_MLP_MAX_WIDTH) {
        return carls_errorf(err, errlen, -1, "%d classes outside 0..%d", cfg->num_classes, NN_MLP_MAX_WIDTH);
    }
    if (!(cfg->dropout >= 0.0f && cfg->dropout < 1.0f)) {
        return carls_errorf(err, errlen, -1, "dropout %g outside [0, 1)", (double)cfg->dropout);
    }
    if (cfg->n_conv < 0 || cfg->n_conv > NN_MLP_MAX_CONV) {
        return carls_errorf(err, errlen, -1, "%d convolution blocks (0..%d allowed)", cfg->n_conv, NN_MLP_MAX_CONV);
    }
    if (cfg->n_conv == 0) {
        return 0;
    }
    if (cfg->image_h < 1 || cfg->image_w < 1 || cfg->image_c < 1 ||
        (int64_t)cfg->image_h * cfg->image_w * cfg->image_c != cfg->in_dim) {
        return carls_errorf(err, errlen, -1, "convolutions need the input as an image: %dx%dx%d is not %d inputs",
                            cfg->image_h, cfg->image_w, cfg->image_c, cfg->in_dim);
    }
    int h = cfg->image_h, w = cfg->image_w, c = cfg->image_c;
    for (int i = 0; i < cfg->n_conv; i++) {
        const nn_conv_block_t *b = &cfg->conv[i];
        if (b->channels < 1 || b->channels > NN_MLP_MAX_CONV_CHANNELS) {
            return carls_errorf(err, errlen, -1, "convolution %d: %d channels outside 1..%d", i, b->channels,
                                NN_MLP_MAX_CONV_CHANNELS);
        }
        if (b->k < 1 || b->k > NN_MLP_MAX_CONV_K || b->k % 2 == 0) {
            return carls_errorf(err, errlen, -1, "convolution %d: kernel %d is not odd in 1..%d", i, b->k,
                                NN_MLP_MAX_CONV_K);
        }
        if (b->pool < 1 || b->pool > NN_MLP_MAX_POOL || h % b->pool || w % b->pool) {
            return carls_errorf(err, errlen, -1, "convolution %d: pooling %d does not divide its %dx%d input (1..%d)",
                                i, b->pool, h, w, NN_MLP_MAX_POOL);
        }
        if ((int64_t)h * w * b->k * b->k * c > INT_MAX / 64) {
            return carls_errorf(err, errlen, -1, "convolution %d: %dx%dx%d input with kernel %d is too large", i, h, w,
                                c, b->k);
        }
        h /= b->pool;
        w /= b->pool;
        c = b->channels;
    }
    if ((int64_t)h * w * c > NN_MLP_MAX_WIDTH) {
        return carls_errorf(err, errlen, -1, "the convolutions hand on %d features (%dx%dx%d): more than %d", h * w * c,
                            h, w, c, NN_MLP_MAX_WIDTH);
    }
    return 0;
}

/* Input shapes of every convolution block and the width the hidden layers see. */
static int s_conv_shapes(nn_mlp_t *m)
{
    const nn_mlp_config_t *cfg = &m->cfg;
    int h = cfg->image_h, w = cfg->image_w, c = cfg->image_c;
    for (int i = 0; i < cfg->n_conv; i++) {
        m->conv_h[i] = h;
        m->conv_w[i] = w;
        m->conv_c[i] = c;
        h /= cfg->conv[i].pool;
        w /= cfg->conv[i].pool;
        c = cfg->conv[i].channels;
    }
    return cfg->n_conv ? h * w * c : cfg->in_dim;
}

/* Parameters of conv block i: weight (channels, k*k*c) and bias (channels). */
static size_t s_conv_weights(const nn_mlp_t *m, int i)
{
    const nn_conv_block_t *b = &m->cfg.conv[i];
    return (size_t)b->channels * (size_t)(b->k * b->k * m->conv_c[i]);
}

/* The conv buffers: activations for max_batch images, im2col scratch for conv_chunk of them. */
static void s_conv_alloc(nn_mlp_t *m)
{
    const nn_mlp_config_t *cfg = &m->cfg;
    const size_t B = (size_t)m->max_batch;
    size_t pix_max = 0, col_max = 0, need = 0, idx = 0;
    m->conv_chunk = m->max_batch < 64 ? m->max_batch : 64;
    for (int i = 0; i < cfg->n_conv; i++) {
        const nn_conv_block_t *b = &cfg->conv[i];
        size_t pix = (size_t)m->conv_h[i] * (size_t)m->conv_w[i];
        size_t act = pix * (size_t)b->channels;
        size_t col = (size_t)m->conv_chunk * pix * (size_t)(b->k * b->k * m->conv_c[i]);
        need += B * act + (b->pool > 1 ? B * act / (size_t)(b->pool * b->pool) : 0);
        idx += b->pool > 1 ? B * act / (size_t)(b->pool * b->pool) : 0;
        pix_max = act > pix_max ? act : pix_max;
        col_max = col > col_max ? col : col_max;
    }
    need += col_max;
    m->conv_col_floats = col_max;
    m->conv_acts = m->ops->alloc(sizeof(float) * need);
    m->conv_grad_floats = col_max + 2 * B * pix_max; /* allocated by the first backward: makers never need them */
    m->conv_idx = m->ops->alloc(sizeof(int32_t) * (idx ? idx : 1));
    float *p = m->conv_acts;
    int32_t *q = m->conv_idx;
    for (int i = 0; i < cfg->n_conv; i++) {
        const nn_conv_block_t *b = &cfg->conv[i];
        size_t act = (size_t)m->conv_h[i] * (size_t)m->conv_w[i] * (size_t)b->channels;
        m->cact[i] = p;
        p += B * act;
        if (b->pool > 1) {
            m->cpool[i] = p;
            m->cargmax[i] = q;
            p += B * act / (size_t)(b->pool * b->pool);
            q += B * act / (size_t)(b->pool * b->pool);
        } else {
            m->cpool[i] = m->cact[i];
        }
    }
    m->col = p;
    p += col_max;
    assert((size_t)(p - m->conv_acts) == need);
}

/* The conv gradient buffers (dcol, dconv), on first use. */
static void s_conv_grad_alloc(nn_mlp_t *m)
{
    m->conv_grads = m->ops->alloc(sizeof(float) * m->conv_grad_floats);
    const size_t half = (m->conv_grad_floats - m->conv_col_floats) / 2;
    m->dcol = m->conv_grads;
    m->dconv[0] = m->conv_grads + m->conv_col_floats;
    m->dconv[1] = m->dconv[0] + half;
}

static float s_uniform(uint64_t *state, float bound)
{
    float u = (float)(carls_splitmix64(state) >> 40) * (1.0f / 16777216.0f);
    return (2.0f * u - 1.0f) * bound;
}

int nn_mlp_new(const nn_mlp_config_t *cfg, nn_device_t device, int max_batch, uint64_t seed, nn_mlp_t **out,
               char *err, size_t errlen)
{
    *out = NULL;
    if (nn_mlp_config_check(cfg, err, errlen) != 0) {
        return -1;
    }
    if (max_batch < 1 || max_batch > (1 << 20)) {
        return carls_errorf(err, errlen, -1, "batch size %d outside 1..%d", max_batch, 1 << 20);
    }
    const nn_ops_t *ops = nn_ops_for(device);
    if (!ops) {
        return carls_errorf(err, errlen, -1, "device %s is not available in this build", nn_device_name(device));
    }
    nn_mlp_t *m = carls_xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->ops = ops;
    m->max_batch = max_batch;
    m->n_layers = cfg->n_hidden + (cfg->num_classes > 0 ? 1 : 0);
    int prev = s_conv_shapes(m), maxw = 1;
    size_t np = 0;
    for (int i = 0; i < cfg->n_conv; i++) {
        np += s_conv_weights(m, i) + (size_t)cfg->conv[i].channels;
    }
    for (int l = 0; l < m->n_layers; l++) {
        m->in[l] = prev;
        m->out[l] = l < cfg->n_hidden ? cfg->hidden[l] : cfg->num_classes;
        prev = m->out[l];
        maxw = m->out[l] > maxw ? m->out[l] : maxw;
        np += (size_t)m->in[l] * (size_t)m->out[l] + (size_t)m->out[l];
    }
    if (np > INT_MAX) {
        free(m);
        return carls_errorf(err, errlen, -1, "%zu parameters: more than this library handles (INT_MAX)", np);
    }
    m->num_params = np;

    /* Parameters and gradients: one block each, same layout (conv weights and biases, then w0, b0, w1, b1, ...). */
    m->params = ops->alloc(sizeof(float) * np);
    m->grads = ops->alloc(sizeof(float) * np);
    size_t off = 0;
    for (int i = 0; i < cfg->n_conv; i++) {
        m->cw[i] = m->params + off;
        m->dcw[i] = m->grads + off;
        off += s_conv_weights(m, i);
        m->cb[i] = m->params + off;
        m->dcb[i] = m->grads + off;
        off += (size_t)cfg->conv[i].channels;
    }
    for (int l = 0; l < m->n_layers; l++) {
        size_t nw = (size_t)m->in[l] * (size_t)m->out[l];
        m->w[l] = m->params + off;
        m->dw[l] = m->grads + off;
        off += nw;
        m->b[l] = m->params + off;
        m->db[l] = m->grads + off;
        off += (size_t)m->out[l];
    }
    float *host = carls_xmalloc(sizeof(float) * np);
    uint64_t state = seed;
    off = 0;
    for (int i = 0; i < cfg->n_conv; i++) {
        const nn_conv_block_t *b = &cfg->conv[i];
        float bound = 1.0f / sqrtf((float)(b->k * b->k * m->conv_c[i]));
        size_t n = s_conv_weights(m, i) + (size_t)b->channels;
        for (size_t j = 0; j < n; j++) {
            host[off + j] = s_uniform(&state, bound);
        }
        off += n;
    }
    for (int l = 0; l < m->n_layers; l++) {
        float bound = 1.0f / sqrtf((float)m->in[l]);
        size_t n = (size_t)m->in[l] * (size_t)m->out[l] + (size_t)m->out[l];
        for (size_t i = 0; i < n; i++) {
            host[off + i] = s_uniform(&state, bound);
        }
        off += n;
    }
    ops->to_device(m->params, host, sizeof(float) * np);
    free(host);

    /* Activations: one block. */
    size_t B = (size_t)max_batch, need = B * (size_t)cfg->in_dim;
    for (int l = 0; l < m->n_layers; l++) {
        size_t n = B * (size_t)m->out[l];
        need += n; /* pre */
        if (l < cfg->n_hidden) {
            need += n;                                /* post */
            need += cfg->dropout > 0.0f ? 2 * n : 0; /* mask, drop */
        }
    }
    size_t C = (size_t)(cfg->num_classes > 0 ? cfg->num_classes : 0);
    need += B * C + 2 * B + 2 * B * (size_t)maxw;
    m->acts = ops->alloc(sizeof(float) * need);
    float *p = m->acts;
    m->x = p;
    p += B * (size_t)cfg->in_dim;
    for (int l = 0; l < m->n_layers; l++) {
        size_t n = B * (size_t)m->out[l];
        m->pre[l] = p;
        p += n;
        if (l < cfg->n_hidden) {
            m->post[l] = p;
            p += n;
            if (cfg->dropout > 0.0f) {
                m->mask[l] = p;
                p += n;
                m->drop[l] = p;
                p += n;
            }
            m->h[l] = m->post[l];
        }
    }
    m->probs = C ? p : NULL;
    p += B * C;
    m->losses = p;
    p += B;
    m->dlosses = p;
    p += B;
    m->dbuf[0] = p;
    p += B * (size_t)maxw;
    m->dbuf[1] = p;
    p += B * (size_t)maxw;
    assert((size_t)(p - m->acts) == need);
    m->targets = ops->alloc(sizeof(int32_t) * B);
    m->pred = ops->alloc(sizeof(int32_t) * B);
    m->h_targets = carls_xcalloc(B, sizeof(int32_t));
    m->h_losses = carls_xcalloc(B, sizeof(float));
    m->h_dlosses = carls_xcalloc(B, sizeof(float));
    if (cfg->n_conv) {
        s_conv_alloc(m);
    }
    *out = m;
    return 0;
}

void nn_mlp_destroy(nn_mlp_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    nn_mlp_t *m = *self_p;
    const nn_ops_t *ops = m->ops;
    ops->free(m->params);
    ops->free(m->grads);
    if (m->opt_m) {
        ops->free(m->opt_m);
    }
    if (m->opt_v) {
        ops->free(m->opt_v);
    }
    ops->free(m->acts);
    if (m->conv_acts) {
        ops->free(m->conv_acts);
        ops->free(m->conv_idx);
    }
    if (m->conv_grads) {
        ops->free(m->conv_grads);
    }
    ops->free(m->targets);
    ops->free(m->pred);
    free(m->h_targets);
    free(m->h_losses);
    free(m->h_dlosses);
    free(m);
    *self_p = NULL;
}

void nn_mlp_set_batch(nn_mlp_t *self, const float *x, const int32_t *labels, int B)
{
    assert(self && x && B >= 1 && B <= self->max_batch);
    self->ops->to_device(self->x, x, sizeof(float) * (size_t)B * (size_t)self->cfg.in_dim);
    for (int i = 0; i < B; i++) {
        self->h_targets[i] = labels ? labels[i] : -1;
        assert(self->h_targets[i] < self->cfg.num_classes);
    }
    self->ops->to_device(self->targets, self->h_targets, sizeof(int32_t) * (size_t)B);
}

/* Convolution block i over B images from inp (B, h, w, c): cact = ReLU(conv), cpool = its max pooling. */
static void s_conv_forward(nn_mlp_t *self, int i, const float *inp, int B)
{
    const nn_ops_t *ops = self->ops;
    const nn_conv_block_t *b = &self->cfg.conv[i];
    const int h = self->conv_h[i], w = self->conv_w[i], c = self->conv_c[i], kkc = b->k * b->k * c;
    const size_t in_img = (size_t)h * (size_t)w * (size_t)c, out_img = (size_t)h * (size_t)w * (size_t)b->channels;
    for (int off = 0; off < B; off += self->conv_chunk) {
        int n = B - off < self->conv_chunk ? B - off : self->conv_chunk;
        ops->im2col_forward(self->col, inp + (size_t)off * in_img, n, h, w, c, b->k, 1, b->k / 2);
        ops->linear_forward(self->cact[i] + (size_t)off * out_img, self->col, self->cw[i], self->cb[i], n * h * w, kkc,
                            b->channels);
    }
    ops->relu_forward(self->cact[i], self->cact[i], (int)((size_t)B * out_img));
    if (b->pool > 1) {
        ops->maxpool2d_forward(self->cpool[i], self->cargmax[i], self->cact[i], B, h, w, b->channels, b->pool);
    }
}

/* Backward through convolution block i. dout (B, pooled output) is the gradient of cpool[i]; spare is a buffer
 * of the same capacity that is not dout; dinp (B, h, w, c) receives the input's gradient unless NULL (block 0). */
static void s_conv_backward(nn_mlp_t *self, int i, const float *inp, float *dout, float *spare, float *dinp, int B)
{
    const nn_ops_t *ops = self->ops;
    const nn_conv_block_t *b = &self->cfg.conv[i];
    const int h = self->conv_h[i], w = self->conv_w[i], c = self->conv_c[i], kkc = b->k * b->k * c;
    const size_t in_img = (size_t)h * (size_t)w * (size_t)c, out_img = (size_t)h * (size_t)w * (size_t)b->channels;
    float *dact = dout;
    if (b->pool > 1) {
        ops->maxpool2d_backward(spare, dout, self->cargmax[i], B, h, w, b->channels, b->pool);
        dact = spare;
    }
    ops->relu_backward(dact, dact, self->cact[i], (int)((size_t)B * out_img));
    for (int off = 0; off < B; off += self->conv_chunk) {
        int n = B - off < self->conv_chunk ? B - off : self->conv_chunk;
        /* The chunk's columns are rebuilt: keeping them all would cost k*k times the activations. */
        ops->im2col_forward(self->col, inp + (size_t)off * in_img, n, h, w, c, b->k, 1, b->k / 2);
        ops->linear_backward(dinp ? self->dcol : NULL, self->dcw[i], self->dcb[i], dact + (size_t)off * out_img,
                             self->col, self->cw[i], n * h * w, kkc, b->channels);
        if (dinp) {
            ops->col2im_backward(dinp + (size_t)off * in_img, self->dcol, n, h, w, c, b->k, 1, b->k / 2);
        }
    }
}

float nn_mlp_forward(nn_mlp_t *self, int B, bool train, uint64_t dropout_seed)
{
    assert(self && B >= 1 && B <= self->max_batch);
    const nn_ops_t *ops = self->ops;
    const nn_mlp_config_t *cfg = &self->cfg;
    const bool drop = train && cfg->dropout > 0.0f;
    const float *inp = self->x;
    for (int i = 0; i < cfg->n_conv; i++) {
        s_conv_forward(self, i, inp, B);
        inp = self->cpool[i];
    }
    for (int l = 0; l < self->n_layers; l++) {
        const int n = B * self->out[l];
        ops->linear_forward(self->pre[l], inp, self->w[l], self->b[l], B, self->in[l], self->out[l]);
        if (l < cfg->n_hidden) {
            ops->relu_forward(self->post[l], self->pre[l], n);
            if (drop) {
                ops->dropout_forward(self->drop[l], self->mask[l], self->post[l], cfg->dropout,
                                     nn_hash_mix(dropout_seed, (uint64_t)l), n);
                self->h[l] = self->drop[l];
            } else {
                self->h[l] = self->post[l];
            }
            inp = self->h[l];
        }
    }
    self->train_mode = drop;
    if (cfg->num_classes == 0) {
        return 0.0f;
    }
    const int L = self->n_layers - 1;
    ops->softmax_ce_forward(self->losses, self->probs, self->pre[L], self->targets, B, cfg->num_classes);
    ops->to_host(self->h_losses, self->losses, sizeof(float) * (size_t)B);
    double sum = 0.0;
    int n_lab = 0;
    for (int i = 0; i < B; i++) {
        if (self->h_targets[i] >= 0) {
            sum += self->h_losses[i];
            n_lab++;
        }
    }
    return n_lab ? (float)(sum / n_lab) : 0.0f;
}

void nn_mlp_zero_grad(nn_mlp_t *self)
{
    self->ops->zero(self->grads, sizeof(float) * self->num_params);
}

/* The backward pass from the per-row loss weights already in h_dlosses (B, host; read only with a classifier)
 * and d_embedding: nn_mlp_backward and nn_mlp_backward_weighted differ only in those weights. */
static void s_backward(nn_mlp_t *self, int B, const float *d_embedding)
{
    const nn_ops_t *ops = self->ops;
    const nn_mlp_config_t *cfg = &self->cfg;
    float *cur = NULL; /* gradient of the current layer's output, (B, out[l]) */
    int which = 0;
    if (cfg->n_conv && !self->conv_grads) {
        s_conv_grad_alloc(self);
    }
    if (cfg->num_classes > 0) {
        ops->to_device(self->dlosses, self->h_dlosses, sizeof(float) * (size_t)B);
        ops->softmax_ce_backward(self->dbuf[0], self->dlosses, self->probs, self->targets, B, cfg->num_classes);
        cur = self->dbuf[0];
    }
    for (int l = self->n_layers - 1; l >= 0; l--) {
        const int n = B * self->out[l];
        if (l < cfg->n_hidden) {
            if (l == cfg->n_hidden - 1 && d_embedding) {
                if (!cur) {
                    cur = self->dbuf[which];
                    ops->zero(cur, sizeof(float) * (size_t)n);
                }
                ops->add(cur, d_embedding, 1.0f, n);
            }
            if (self->train_mode) {
                ops->dropout_backward(cur, cur, self->mask[l], n);
            }
            ops->relu_backward(cur, cur, self->post[l], n);
        }
        const int nc = cfg->n_conv;
        const float *inp = l > 0 ? self->h[l - 1] : nc ? self->cpool[nc - 1] : self->x;
        float *dinp = l > 0 ? self->dbuf[1 - which] : nc ? self->dconv[0] : NULL;
        ops->linear_backward(dinp, self->dw[l], self->db[l], cur, inp, self->w[l], B, self->in[l], self->out[l]);
        cur = dinp;
        which = 1 - which;
    }
    /* cur is now the gradient of the last block's pooled output, in dconv[0]. */
    int d = 0;
    for (int i = cfg->n_conv - 1; i >= 0; i--) {
        float *dout = self->dconv[d], *spare = self->dconv[1 - d];
        float *dinp = i > 0 ? (cfg->conv[i].pool > 1 ? dout : spare) : NULL;
        s_conv_backward(self, i, i > 0 ? self->cpool[i - 1] : self->x, dout, spare, dinp, B);
        if (dinp == spare) {
            d = 1 - d;
        }
    }
}

void nn_mlp_backward(nn_mlp_t *self, int B, const float *d_embedding)
{
    assert(self && B >= 1 && B <= self->max_batch);
    assert(self->cfg.num_classes > 0 || d_embedding);
    if (self->cfg.num_classes > 0) {
        int n_lab = 0;
        for (int i = 0; i < B; i++) {
            n_lab += self->h_targets[i] >= 0;
        }
        for (int i = 0; i < B; i++) {
            self->h_dlosses[i] = (self->h_targets[i] >= 0 && n_lab) ? 1.0f / (float)n_lab : 0.0f;
        }
    }
    s_backward(self, B, d_embedding);
}

void nn_mlp_backward_weighted(nn_mlp_t *self, int B, const float *row_weight, const float *d_embedding)
{
    assert(self && B >= 1 && B <= self->max_batch && row_weight);
    assert(self->cfg.num_classes > 0);
    for (int i = 0; i < B; i++) {
        self->h_dlosses[i] = self->h_targets[i] >= 0 ? row_weight[i] : 0.0f;
    }
    s_backward(self, B, d_embedding);
}

void nn_mlp_step(nn_mlp_t *self, const nn_optim_config_t *opt)
{
    const nn_ops_t *ops = self->ops;
    const size_t bytes = sizeof(float) * self->num_params;
    const int N = (int)self->num_params;
    if (!self->opt_m) {
        self->opt_m = ops->alloc(bytes);
        if (opt->kind == NN_OPT_ADAM) {
            self->opt_v = ops->alloc(bytes);
        }
    }
    self->opt_t++;
    if (opt->kind == NN_OPT_ADAM) {
        assert(self->opt_v);
        ops->adam_update(self->params, self->grads, self->opt_m, self->opt_v, opt->lr, opt->beta1, opt->beta2,
                         opt->eps, opt->weight_decay, self->opt_t, N);
    } else {
        ops->sgd_update(self->params, self->grads, opt->momentum != 0.0f ? self->opt_m : NULL, opt->lr,
                        opt->momentum, opt->weight_decay, N);
    }
}

int nn_mlp_correct(nn_mlp_t *self, int B, int32_t *pred_host)
{
    assert(self->cfg.num_classes > 0);
    const int L = self->n_layers - 1;
    int32_t local[256];
    int32_t *pred = pred_host ? pred_host : (B <= 256 ? local : carls_xmalloc(sizeof(int32_t) * (size_t)B));
    self->ops->argmax(self->pred, self->pre[L], B, self->cfg.num_classes);
    self->ops->to_host(pred, self->pred, sizeof(int32_t) * (size_t)B);
    int correct = 0;
    for (int i = 0; i < B; i++) {
        correct += self->h_targets[i] >= 0 && pred[i] == self->h_targets[i];
    }
    if (pred != pred_host && pred != local) {
        free(pred);
    }
    return correct;
}

void nn_mlp_encode(nn_mlp_t *self, const float *x, int B, float *emb_host)
{
    const int E = self->cfg.hidden[self->cfg.n_hidden - 1];
    for (int off = 0; off < B; off += self->max_batch) {
        int n = B - off < self->max_batch ? B - off : self->max_batch;
        nn_mlp_set_batch(self, x + (size_t)off * (size_t)self->cfg.in_dim, NULL, n);
        nn_mlp_forward(self, n, false, 0);
        self->ops->to_host(emb_host + (size_t)off * (size_t)E, self->h[self->cfg.n_hidden - 1],
                           sizeof(float) * (size_t)n * (size_t)E);
    }
}

void nn_mlp_predict(nn_mlp_t *self, const float *x, int B, float *probs_host)
{
    const int C = self->cfg.num_classes;
    assert(C > 0);
    for (int off = 0; off < B; off += self->max_batch) {
        int n = B - off < self->max_batch ? B - off : self->max_batch;
        nn_mlp_set_batch(self, x + (size_t)off * (size_t)self->cfg.in_dim, NULL, n);
        nn_mlp_forward(self, n, false, 0);
        self->ops->to_host(probs_host + (size_t)off * (size_t)C, self->probs, sizeof(float) * (size_t)n * (size_t)C);
    }
}

double nn_mlp_train_flops_per_example(const nn_mlp_t *self)
{
    double f = 0.0;
    for (int i = 0; i < self->cfg.n_conv; i++) {
        double mac = (double)self->conv_h[i] * self->conv_w[i] * (double)s_conv_weights(self, i);
        f += (i > 0 ? 6.0 : 4.0) * mac; /* forward, dweight, and dinp above the first block */
    }
    for (int l = 0; l < self->n_layers; l++) {
        double mac = (double)self->in[l] * (double)self->out[l];
        f += 2.0 * mac;      /* forward */
        f += 2.0 * mac;      /* dweight */
        if (l > 0) {
            f += 2.0 * mac;  /* dinp (the first layer's input needs none) */
        }
    }
    return f;
}

void nn_mlp_get_params(const nn_mlp_t *self, float *host)
{
    self->ops->to_host(host, self->params, sizeof(float) * self->num_params);
}

void nn_mlp_set_params(nn_mlp_t *self, const float *host)
{
    self->ops->to_device(self->params, host, sizeof(float) * self->num_params);
}

/* Checkpoint tensor names of convolution block i ("conv.<i>"). */
static void s_conv_names(int i, char *wname, char *bname, size_t len)
{
    snprintf(wname, len, "conv.%d.weight", i);
    snprintf(bname, len, "conv.%d.bias", i);
}

/* Checkpoint tensor names of layer l ("enc.<l>" or "cls"). */
static void s_layer_names(const nn_mlp_t *self, int l, char *wname, char *bname, size_t len)
{
    if (l < self->cfg.n_hidden) {
        snprintf(wname, len, "enc.%d.weight", l);
        snprintf(bname, len, "enc.%d.bias", l);
    } else {
        snprintf(wname, len, "cls.weight");
        snprintf(bname, len, "cls.bias");
    }
}

int nn_mlp_to_ckpt(const nn_mlp_t *self, uint64_t step, carls_ckpt_t **out, char *err, size_t errlen)
{
    *out = NULL;
    carls_ckpt_t *c = carls_ckpt_new(self->cfg.num_classes > 0 ? NN_MLP_KIND_CLASSIFIER : NN_MLP_KIND_ENCODER, step);
    if (!c) {
        return carls_errorf(err, errlen, -1, "cannot create a checkpoint");
    }
    float *host = carls_xmalloc(sizeof(float) * self->num_params);
    nn_mlp_get_params(self, host);
    size_t off = 0;
    int rc = 0;
    char wname[32] = "conv.image", bname[32] = "";
    const nn_mlp_config_t *cfg = &self->cfg;
    if (cfg->n_conv) {
        rc = carls_ckpt_add_u64(c, "conv.image_h", (uint64_t)cfg->image_h);
        rc = rc ? rc : carls_ckpt_add_u64(c, "conv.image_w", (uint64_t)cfg->image_w);
        rc = rc ? rc : carls_ckpt_add_u64(c, "conv.image_c", (uint64_t)cfg->image_c);
    }
    for (int i = 0; rc == 0 && i < cfg->n_conv; i++) {
        s_conv_names(i, wname, bname, sizeof wname);
        int64_t wd[2] = {cfg->conv[i].channels, (int64_t)(s_conv_weights(self, i) / (size_t)cfg->conv[i].channels)};
        int64_t bd[1] = {cfg->conv[i].channels};
        rc = carls_ckpt_add(c, wname, 2, wd, host + off);
        off += s_conv_weights(self, i);
        rc = rc ? rc : carls_ckpt_add(c, bname, 1, bd, host + off);
        off += (size_t)cfg->conv[i].channels;
        char name[32];
        snprintf(name, sizeof name, "conv.%d.k", i);
        rc = rc ? rc : carls_ckpt_add_u64(c, name, (uint64_t)cfg->conv[i].k);
        snprintf(name, sizeof name, "conv.%d.pool", i);
        rc = rc ? rc : carls_ckpt_add_u64(c, name, (uint64_t)cfg->conv[i].pool);
    }
    if (rc) {
        free(host);
        carls_ckpt_destroy(&c);
        return carls_errorf(err, errlen, -1, "cannot add %s to the checkpoint: %s", wname, carls_ckpt_strerror(rc));
    }
    for (int l = 0; l < self->n_layers; l++) {
        s_layer_names(self, l, wname, bname, sizeof wname);
        int64_t wd[2] = {self->out[l], self->in[l]}, bd[1] = {self->out[l]};
        rc = carls_ckpt_add(c, wname, 2, wd, host + off);
        off += (size_t)self->in[l] * (size_t)self->out[l];
        if (rc == 0) {
            rc = carls_ckpt_add(c, bname, 1, bd, host + off);
        }
        off += (size_t)self->out[l];
        if (rc) {
            free(host);
            carls_ckpt_destroy(&c);
            return carls_errorf(err, errlen, -1, "cannot add %s to the checkpoint: %s", wname, carls_ckpt_strerror(rc));
        }
    }
    free(host);
    *out = c;
    return 0;
}

/* The tensor called name with the given shape (ndim 1 or 2), or NULL with err set. */
static const carls_ckpt_tensor_t *s_expect(const carls_ckpt_t *c, const char *name, int ndim, int64_t d0,
                                           int64_t d1, char *err, size_t errlen)
{
    const carls_ckpt_tensor_t *t = carls_ckpt_find(c, name);
    if (!t) {
        carls_errorf(err, errlen, -1, "checkpoint has no tensor %s", name);
        return NULL;
    }
    if (t->ndim != ndim || t->dims[0] != d0 || (ndim == 2 && t->dims[1] != d1)) {
        carls_errorf(err, errlen, -1, "checkpoint tensor %s has an unexpected shape", name);
        return NULL;
    }
    return t;
}

/* A number the checkpoint must carry for its convolutions, in 1..max. */
static int s_ckpt_int(const carls_ckpt_t *c, const char *name, int max, int *out, char *err, size_t errlen)
{
    uint64_t v = 0;
    if (carls_ckpt_get_u64(c, name, &v, err, errlen) != 0) {
        return -1;
    }
    if (v < 1 || v > (uint64_t)max) {
        return carls_errorf(err, errlen, -1, "checkpoint value %s = %llu outside 1..%d", name, (unsigned long long)v,
                            max);
    }
    *out = (int)v;
    return 0;
}

/* The convolution blocks of a checkpoint: the image shape and each block's kernel and pooling from its
 * numbers, the channels from each weight's rows; nn_mlp_config_check and the shape checks judge the rest. */
static int s_conv_config_from_ckpt(const carls_ckpt_t *c, nn_mlp_config_t *cfg, char *err, size_t errlen)
{
    if (s_ckpt_int(c, "conv.image_h", NN_MLP_MAX_WIDTH, &cfg->image_h, err, errlen) != 0 ||
        s_ckpt_int(c, "conv.image_w", NN_MLP_MAX_WIDTH, &cfg->image_w, err, errlen) != 0 ||
        s_ckpt_int(c, "conv.image_c", NN_MLP_MAX_WIDTH, &cfg->image_c, err, errlen) != 0) {
        return -1;
    }
    /* Each is up to NN_MLP_MAX_WIDTH, so the product is taken in 64 bits (an untrusted file could overflow int). */
    const int64_t pixels = (int64_t)cfg->image_h * cfg->image_w * cfg->image_c;
    cfg->in_dim = pixels <= NN_MLP_MAX_WIDTH ? (int)pixels : 0;
    for (int i = 0; i < NN_MLP_MAX_CONV; i++) {
        char name[32], bias[32];
        s_conv_names(i, name, bias, sizeof name);
        const carls_ckpt_tensor_t *w = carls_ckpt_find(c, name);
        if (!w) {
            break;
        }
        if (w->ndim != 2 || w->dims[0] < 1 || w->dims[0] > NN_MLP_MAX_CONV_CHANNELS) {
            return carls_errorf(err, errlen, -1, "checkpoint tensor %s has an unexpected shape", name);
        }
        cfg->conv[i].channels = (int)w->dims[0];
        snprintf(name, sizeof name, "conv.%d.k", i);
        if (s_ckpt_int(c, name, NN_MLP_MAX_CONV_K, &cfg->conv[i].k, err, errlen) != 0) {
            return -1;
        }
        snprintf(name, sizeof name, "conv.%d.pool", i);
        if (s_ckpt_int(c, name, NN_MLP_MAX_POOL, &cfg->conv[i].pool, err, errlen) != 0) {
            return -1;
        }
        cfg->n_conv = i + 1;
    }
    return 0;
}

int nn_mlp_from_ckpt(const carls_ckpt_t *ckpt, nn_device_t device, int max_batch, nn_mlp_t **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    const char *kind = carls_ckpt_kind(ckpt);
    bool has_cls = strcmp(kind, NN_MLP_KIND_CLASSIFIER) == 0;
    if (!has_cls && strcmp(kind, NN_MLP_KIND_ENCODER) != 0) {
        return carls_errorf(err, errlen, -1, "checkpoint holds a '%s', not an MLP", kind);
    }
    nn_mlp_config_t cfg = {0};
    const carls_ckpt_tensor_t *w0 = carls_ckpt_find(ckpt, "enc.0.weight");
    if (!w0 || w0->ndim != 2) {
        return carls_errorf(err, errlen, -1, "checkpoint has no 2-d tensor enc.0.weight");
    }
    cfg.in_dim = (int)(w0->dims[1] <= NN_MLP_MAX_WIDTH ? w0->dims[1] : 0);
    if (carls_ckpt_find(ckpt, "conv.0.weight") && s_conv_config_from_ckpt(ckpt, &cfg, err, errlen) != 0) {
        return -1;
    }
    for (int l = 0; l < NN_MLP_MAX_HIDDEN; l++) {
        char name[32];
        snprintf(name, sizeof name, "enc.%d.weight", l);
        const carls_ckpt_tensor_t *w = carls_ckpt_find(ckpt, name);
        if (!w) {
            break;
        }
        if (w->ndim != 2 || w->dims[0] > NN_MLP_MAX_WIDTH) {
            return carls_errorf(err, errlen, -1, "checkpoint tensor %s has an unexpected shape", name);
        }
        cfg.hidden[l] = (int)w->dims[0];
        cfg.n_hidden = l + 1;
    }
    if (has_cls) {
        const carls_ckpt_tensor_t *cw = carls_ckpt_find(ckpt, "cls.weight");
        if (!cw || cw->ndim != 2 || cw->dims[0] > NN_MLP_MAX_WIDTH) {
            return carls_errorf(err, errlen, -1, "classifier checkpoint has no usable cls.weight");
        }
        cfg.num_classes = (int)cw->dims[0];
    }
    if (nn_mlp_config_check(&cfg, err, errlen) != 0) {
        return -1;
    }
    nn_mlp_t *m = NULL;
    if (nn_mlp_new(&cfg, device, max_batch, 0, &m, err, errlen) != 0) {
        return -1;
    }
    float *host = carls_xmalloc(sizeof(float) * m->num_params);
    size_t off = 0;
    for (int l = -cfg.n_conv; l < m->n_layers; l++) {
        char wname[32], bname[32];
        int64_t rows = 0, cols = 0;
        if (l < 0) {
            const int i = l + cfg.n_conv;
            s_conv_names(i, wname, bname, sizeof wname);
            rows = cfg.conv[i].channels;
            cols = (int64_t)(s_conv_weights(m, i) / (size_t)rows);
        } else {
            s_layer_names(m, l, wname, bname, sizeof wname);
            rows = m->out[l];
            cols = m->in[l];
        }
        const carls_ckpt_tensor_t *w = s_expect(ckpt, wname, 2, rows, cols, err, errlen);
        const carls_ckpt_tensor_t *b = w ? s_expect(ckpt, bname, 1, rows, 0, err, errlen) : NULL;
        if (!w || !b) {
            free(host);
            nn_mlp_destroy(&m);
            return -1;
        }
        memcpy(host + off, w->data, sizeof(float) * (size_t)w->numel);
        off += (size_t)w->numel;
        memcpy(host + off, b->data, sizeof(float) * (size_t)b->numel);
        off += (size_t)b->numel;
    }
    nn_mlp_set_params(m, host);
    free(host);
    *out = m;
    return 0;
}
