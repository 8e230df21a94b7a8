/* A multi-layer perceptron: an encoder (linear -> ReLU -> dropout, n_hidden times) and an optional softmax
 * classifier on top. The trainer trains it; knowledge makers load it from a checkpoint and run the encoder
 * (nn_mlp_encode) to embed items, or the classifier (nn_mlp_predict) to label them.
 *
 * Memory, as in llm.c: all parameters live in one block, their gradients in a second with the same layout,
 * the optimiser state in a third (and fourth for Adam), all activations in one block sized for max_batch;
 * the tensor pointers below point into those blocks, on the model's device. The model runs every operation
 * through the device's nn_ops_t table, so the same code runs on the CPU and on a GPU.
 *
 * Optionally, convolution blocks come first (config n_conv > 0): the input is then an NHWC image (image_h x
 * image_w x image_c, e.g. 28 x 28 x 1), and each block is a "same" convolution (stride 1, padding k/2, through
 * im2col and the linear op), a ReLU and a pool x pool max pooling; the last block's output, flattened, feeds the
 * first hidden layer. Convolutions run over chunks of images so that the im2col scratch stays small whatever
 * max_batch is.
 *
 * Checkpoints: tensors "enc.<l>.weight" (out, in), "enc.<l>.bias" (out), and "cls.weight", "cls.bias" when
 * there is a classifier; kind NN_MLP_KIND_CLASSIFIER or NN_MLP_KIND_ENCODER. The shapes carry the
 * configuration, so loading needs nothing else; convolution blocks add "conv.<i>.weight" (channels, k*k*c),
 * "conv.<i>.bias" and the numbers the shapes cannot carry (conv.image_h/_w/_c, conv.<i>.k, conv.<i>.pool). */
#ifndef NN_MLP_H
#define NN_MLP_H

#include "nn_device.h"

#include "checkpoint.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NN_MLP_MAX_HIDDEN 8
#define NN_MLP_MAX_LAYERS (NN_MLP_MAX_HIDDEN + 1)
#define NN_MLP_MAX_WIDTH 65536
#define NN_MLP_KIND_CLASSIFIER "mlp_classifier"
#define NN_MLP_KIND_ENCODER "mlp_encoder"
#define NN_MLP_MAX_CONV 4
#define NN_MLP_MAX_CONV_CHANNELS 1024
#define NN_MLP_MAX_CONV_K 11
#define NN_MLP_MAX_POOL 4

/* One convolution block: conv k x k (stride 1, padding k/2) -> ReLU -> max pooling pool x pool (1: none). */
typedef struct {
    int channels; /* output channels, 1..NN_MLP_MAX_CONV_CHANNELS */
    int k;        /* kernel size, odd, 1..NN_MLP_MAX_CONV_K */
    int pool;     /* pooling window and stride, 1..NN_MLP_MAX_POOL; the block's height and width must divide */
} nn_conv_block_t;

typedef struct {
    int in_dim;                    /* input features, e.g. 784 */
    int n_hidden;                  /* encoder layers, 1..NN_MLP_MAX_HIDDEN */
    int hidden[NN_MLP_MAX_HIDDEN]; /* their widths; hidden[n_hidden-1] is the embedding size */
    int num_classes;               /* classifier outputs, or 0 for an encoder without a classifier */
    float dropout;                 /* dropout rate after each hidden ReLU in training, 0 <= dropout < 1 */
    int n_conv;                    /* convolution blocks before the hidden layers, 0..NN_MLP_MAX_CONV */
    nn_conv_block_t conv[NN_MLP_MAX_CONV];
    int image_h, image_w, image_c; /* with n_conv > 0: the input as an NHWC image, h * w * c == in_dim */
} nn_mlp_config_t;

typedef enum {
    NN_OPT_SGD = 0,  /* SGD with momentum, coupled weight decay */
    NN_OPT_ADAM = 1, /* Adam with decoupled weight decay (AdamW) */
} nn_opt_kind_t;

typedef struct {
    nn_opt_kind_t kind;
    float lr;           /* learning rate */
    float momentum;     /* SGD */
    float beta1, beta2; /* Adam */
    float eps;          /* Adam */
    float weight_decay; /* applied to every parameter, biases included */
} nn_optim_config_t;

typedef struct {
    nn_mlp_config_t cfg;
    const nn_ops_t *ops; /* the device everything below lives on */
    int n_layers;        /* n_hidden + (num_classes > 0 ? 1 : 0) */
    int in[NN_MLP_MAX_LAYERS], out[NN_MLP_MAX_LAYERS]; /* widths of layer l */
    int conv_h[NN_MLP_MAX_CONV], conv_w[NN_MLP_MAX_CONV], conv_c[NN_MLP_MAX_CONV]; /* block i's input shape */
    int conv_chunk;                /* images per im2col pass */

    /* parameters */
    size_t num_params;
    float *params;                 /* (num_params), one block */
    float *grads;                  /* (num_params), same layout; accumulated by backward, zeroed by zero_grad */
    float *opt_m, *opt_v;          /* (num_params) optimiser state, allocated on the first step */
    int opt_t;                     /* optimiser steps taken */
    float *w[NN_MLP_MAX_LAYERS];   /* layer l weight (out[l], in[l]), into params */
    float *b[NN_MLP_MAX_LAYERS];   /* layer l bias (out[l]) */
    float *dw[NN_MLP_MAX_LAYERS];  /* their gradients, into grads */
    float *db[NN_MLP_MAX_LAYERS];
    float *cw[NN_MLP_MAX_CONV];    /* conv block i weight (channels, k*k*c) and bias, into params */
    float *cb[NN_MLP_MAX_CONV];
    float *dcw[NN_MLP_MAX_CONV];   /* their gradients, into grads */
    float *dcb[NN_MLP_MAX_CONV];

    /* activations, for batches of up to max_batch rows */
    int max_batch;
    float *acts;                     /* one block holding everything below except targets/pred */
    float *x;                        /* (B, in_dim) input batch */
    float *pre[NN_MLP_MAX_LAYERS];   /* (B, out[l]) linear outputs; for the classifier, the logits */
    float *post[NN_MLP_MAX_LAYERS];  /* (B, out[l]) ReLU outputs (hidden layers) */
    float *mask[NN_MLP_MAX_LAYERS];  /* (B, out[l]) dropout masks (hidden layers, when dropout > 0) */
    float *drop[NN_MLP_MAX_LAYERS];  /* (B, out[l]) ReLU outputs after dropout (hidden, when dropout > 0) */
    float *h[NN_MLP_MAX_LAYERS];     /* what hidden layer l handed on in the last forward: post[l] or drop[l] */
    float *probs;                    /* (B, num_classes) */
    float *losses;                   /* (B) */
    float *dlosses;                  /* (B) */
    float *dbuf[2];                  /* (B, max width) activation gradients, ping-pong */
    int32_t *targets;                /* (B) device copy of the labels, -1 = unlabelled */
    int32_t *pred;                   /* (B) device argmax of the logits */
    /* host scratch */
    int32_t *h_targets;              /* (B) */
    float *h_losses;                 /* (B) */
    float *h_dlosses;                /* (B) */
    float *cact[NN_MLP_MAX_CONV];    /* (B, h, w, channels) block i's ReLU outputs, before pooling */
    float *cpool[NN_MLP_MAX_CONV];   /* (B, h/pool, w/pool, channels) its pooled outputs (= cact when pool 1) */
    int32_t *cargmax[NN_MLP_MAX_CONV]; /* (same) where each pooled value came from */
    float *col;                      /* (conv_chunk * h * w, k*k*c) im2col scratch, the largest block's */
    float *dcol;                     /* (same) its gradient */
    float *dconv[2];                 /* (B, largest block output) conv activation gradients, ping-pong */
    float *conv_acts;                /* the one block cact, cpool and col live in */
    float *conv_grads;               /* the one block dcol and dconv live in, allocated by the first backward */
    size_t conv_col_floats, conv_grad_floats; /* col's size; conv_grads' size */
    int32_t *conv_idx;               /* the one block of every cargmax */
    bool train_mode;                 /* the last forward applied dropout */
} nn_mlp_t;

/* Checks a configuration; returns 0 or -1 with the reason in err. */
int nn_mlp_config_check(const nn_mlp_config_t *cfg, char *err, size_t errlen);

/* A new model on a resolved device (CPU or CUDA), weights drawn from seed: uniform(+-1/sqrt(in)) for
 * weights and biases (the common default for linear layers). Caller owns *out. Returns 0, or -1 with err. */
int nn_mlp_new(const nn_mlp_config_t *cfg, nn_device_t device, int max_batch, uint64_t seed, nn_mlp_t **out,
               char *err, size_t errlen);

/* Frees everything; accepts NULL and *self_p == NULL; nulls *self_p. */
void nn_mlp_destroy(nn_mlp_t **self_p);

/* Copies a batch from the host: x (B, in_dim), labels (B) in [0, num_classes) or -1 for unlabelled rows;
 * labels may be NULL (all unlabelled). 1 <= B <= max_batch. */
void nn_mlp_set_batch(nn_mlp_t *self, const float *x, const int32_t *labels, int B);

/* Forward pass over the batch set last. train: apply dropout with masks drawn from dropout_seed. Returns the
 * mean cross-entropy over the labelled rows (0 when none, or without a classifier). */
float nn_mlp_forward(nn_mlp_t *self, int B, bool train, uint64_t dropout_seed);

/* Zeroes the parameter gradients. */
void nn_mlp_zero_grad(nn_mlp_t *self);

/* Backward pass for the last forward: adds to the parameter gradients the gradient of
 *   mean cross-entropy over the labelled rows  +  <d_embedding, embedding>
 * where embedding is h[n_hidden-1] (B, hidden[n_hidden-1]) and d_embedding is a device pointer of that shape
 * or NULL. A model without a classifier needs d_embedding. */
void nn_mlp_backward(nn_mlp_t *self, int B, const float *d_embedding);

/* nn_mlp_backward with a weight per labelled row instead of the plain mean over labelled rows, so a trainer
 * can mix true labels with confidence-weighted pseudo-labels: adds to the parameter gradients the gradient of
 *   sum_b row_weight[b] * CE_b  +  <d_embedding, embedding>
 * where CE_b is row b's cross-entropy for its target (rows with target -1 contribute nothing whatever their
 * weight). row_weight (B) is a host array; d_embedding is a device pointer (B, hidden[n_hidden-1]) or NULL.
 * Needs a classifier. */
void nn_mlp_backward_weighted(nn_mlp_t *self, int B, const float *row_weight, const float *d_embedding);

/* One optimiser step with the accumulated gradients (state allocated on first use). */
void nn_mlp_step(nn_mlp_t *self, const nn_optim_config_t *opt);

/* After a forward: number of labelled rows whose argmax equals their label; writes the argmax of each row
 * to pred_host (B) when it is not NULL. Needs a classifier. */
int nn_mlp_correct(nn_mlp_t *self, int B, int32_t *pred_host);

/* Convenience for makers: eval-mode forward of x (B, in_dim) (any B >= 1, in chunks of max_batch), writes
 * the embeddings (B, hidden[n_hidden-1]) to emb_host. */
void nn_mlp_encode(nn_mlp_t *self, const float *x, int B, float *emb_host);
/* Same, writing class probabilities (B, num_classes) to probs_host. Needs a classifier. */
void nn_mlp_predict(nn_mlp_t *self, const float *x, int B, float *probs_host);

/* GEMM floating-point operations of one training step (forward + backward) per example. */
double nn_mlp_train_flops_per_example(const nn_mlp_t *self);

/* Copies the parameters to / from the host (num_params floats). */
void nn_mlp_get_params(const nn_mlp_t *self, float *host);
void nn_mlp_set_params(nn_mlp_t *self, const float *host);

/* A new checkpoint of the parameters at step (kind by whether there is a classifier). Caller owns *out. */
int nn_mlp_to_ckpt(const nn_mlp_t *self, uint64_t step, carls_ckpt_t **out, char *err, size_t errlen);

/* A new model from a checkpoint written by nn_mlp_to_ckpt (dropout 0). Every expected tensor must be there
 * with consistent shapes; returns -1 with err otherwise. */
int nn_mlp_from_ckpt(const carls_ckpt_t *ckpt, nn_device_t device, int max_batch, nn_mlp_t **out, char *err,
                     size_t errlen);

#endif
