/* The neural-network operations of carls-c, CPU reference versions (nn_<op>_cpu).
 *
 * Every operation here has a CUDA twin in cuda/nn_cuda.h with the same name ending in _cuda and the same
 * argument list; the twins take device pointers, these take host pointers. nn_device.h gathers both sets
 * behind one table (nn_ops_t) so that models call whichever the run-time device selected.
 *
 * Conventions (as in llm.c):
 *   - Tensors are row-major float32; each argument carries its shape in a comment, e.g. (B, C).
 *   - Forward functions overwrite their outputs.
 *   - Backward functions: gradients of PARAMETERS accumulate (+=), so several backward calls may add into
 *     one gradient block that the caller zeroes once per step; gradients of ACTIVATIONS/INPUTS are
 *     overwritten (=). The one exception is said where it applies (nn_add_cpu).
 *   - An optional gradient output may be NULL, and is then not computed.
 *   - Sizes are int (they go to BLAS, which takes int); callers keep them below INT_MAX elements.
 *   - Preconditions (positive sizes, indices in range) are asserted, not reported: the callers own the data.
 */
#ifndef NN_OPS_H
#define NN_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Embedding-bag combiners. */
typedef enum {
    NN_BAG_SUM = 0,  /* out = sum_l w_l * row_l */
    NN_BAG_MEAN = 1, /* out = sum_l w_l * row_l / sum_l w_l  (w_l = 1 when no weights; empty bag -> 0) */
} nn_bag_mode_t;

/* ---- linear: out = inp @ weight^T + bias -------------------------------------------------------- */
/* out (B, OC), inp (B, C), weight (OC, C), bias (OC) or NULL. GEMM through BLAS. */
void nn_linear_forward_cpu(float *out, const float *inp, const float *weight, const float *bias, int B, int C,
                           int OC);
/* dinp (B, C) = dout @ weight (overwritten; NULL skips it),
 * dweight (OC, C) += dout^T @ inp, dbias (OC) += column sums of dout (NULL skips it). dout (B, OC). */
void nn_linear_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int B, int C, int OC);

/* ---- ReLU ---------------------------------------------------------------------------------------- */
/* out (N) = max(inp, 0). out may equal inp (in place). */
void nn_relu_forward_cpu(float *out, const float *inp, int N);
/* dinp (N) = dout * (out > 0), from the forward OUTPUT. dinp may equal dout. */
void nn_relu_backward_cpu(float *dinp, const float *dout, const float *out, int N);

/* ---- dropout (inverted) -------------------------------------------------------------------------- */
/* mask (N) = 1/(1-p) where kept, 0 where dropped; out (N) = inp * mask. Element i is dropped when
 * nn_hash_uniform(seed, i) < p (nn_hash.h), so the CPU and the GPU draw the same mask from the same seed,
 * and a fixed seed gives a fixed mask. 0 <= p < 1. out may equal inp. */
void nn_dropout_forward_cpu(float *out, float *mask, const float *inp, float p, uint64_t seed, int N);
/* dinp (N) = dout * mask. dinp may equal dout. */
void nn_dropout_backward_cpu(float *dinp, const float *dout, const float *mask, int N);

/* ---- softmax cross-entropy (fused) --------------------------------------------------------------- */
/* probs (B, V) = softmax(logits (B, V)) per row; losses (B) = -log probs[b, targets[b]].
 * targets (B) in [0, V), or negative to ignore the row (its loss is 0). */
void nn_softmax_ce_forward_cpu(float *losses, float *probs, const float *logits, const int32_t *targets, int B,
                               int V);
/* dlogits (B, V) = (probs - onehot(targets)) * dlosses[b]; rows with a negative target get 0.
 * dlosses (B) is the gradient of the caller's loss with respect to each row's loss (1/B for a mean). */
void nn_softmax_ce_backward_cpu(float *dlogits, const float *dlosses, const float *probs, const int32_t *targets,
                                int B, int V);

/* ---- L2 normalisation over rows ------------------------------------------------------------------ */
/* norms (B) = sqrt(sum_d inp^2 + eps); out (B, D) = inp / norms. eps > 0 keeps the zero row finite. */
void nn_l2norm_forward_cpu(float *out, float *norms, const float *inp, float eps, int B, int D);
/* dinp (B, D) = (dout - out * <dout, out>) / norms, from the forward's out and norms. */
void nn_l2norm_backward_cpu(float *dinp, const float *dout, const float *out, const float *norms, int B, int D);

/* ---- embedding bag over rows fetched from the bank ----------------------------------------------- */
/* rows (R, D): the distinct rows a batch needs, as the bank returned them. Bag b is the entries
 * offsets[b] .. offsets[b+1]-1 of indices (L = offsets[B]), each an index into rows, with an optional
 * weight (weights (L) or NULL for 1). out (B, D) per mode (nn_bag_mode_t). */
void nn_embedding_bag_forward_cpu(float *out, const float *rows, const int32_t *indices, const int32_t *offsets,
                                  const float *weights, int mode, int B, int R, int D);
/* drows (R, D) = the gradient of each fetched row (overwritten: zeroed, then every bag adds its share),
 * ready to be pushed to the bank. dout (B, D). */
void nn_embedding_bag_backward_cpu(float *drows, const float *dout, const int32_t *indices, const int32_t *offsets,
                                   const float *weights, int mode, int B, int R, int D);

/* ---- squared distance to each item's neighbours (graph regularisation) --------------------------- */
/* out (B, K) = ||x[b] - nbr[b, k]||^2, x (B, D), nbr (B, K, D). */
void nn_pairwise_sqdist_forward_cpu(float *out, const float *x, const float *nbr, int B, int K, int D);
/* dx (B, D) = sum_k 2 dout[b,k] (x[b] - nbr[b,k]); dnbr (B, K, D) = -2 dout[b,k] (x[b] - nbr[b,k]) or NULL. */
void nn_pairwise_sqdist_backward_cpu(float *dx, float *dnbr, const float *dout, const float *x, const float *nbr,
                                     int B, int K, int D);

/* ---- InfoNCE / sampled softmax with external negatives ------------------------------------------- */
/* Row b has 1 + N logits: column 0 is the positive, inv_temp * <q[b], pos[b]> - pos_logq[b], column 1 + j is
 * negative j, inv_temp * <q[b], neg[j]> - neg_logq[j] (the log-probability each was sampled with, for the
 * sampled-softmax correction; NULL means no correction). losses (B) = -log softmax(row)[0];
 * probs (B, 1+N) keeps the softmax for the backward pass. q (B, D), pos (B, D), neg (N, D) shared by the batch. */
void nn_infonce_forward_cpu(float *losses, float *probs, const float *q, const float *pos, const float *neg,
                            const float *pos_logq, const float *neg_logq, float inv_temp, int B, int N, int D);
/* dq (B, D), dpos (B, D) or NULL, dneg (N, D) or NULL (the gradient per negative row, for the bank), all
 * overwritten. probs is CONSUMED: it is overwritten with the logits' gradient. dlosses (B). */
void nn_infonce_backward_cpu(float *dq, float *dpos, float *dneg, float *probs, const float *dlosses, const float *q,
                             const float *pos, const float *neg, float inv_temp, int B, int N, int D);

/* ---- convolution building blocks (NHWC) ---------------------------------------------------------- */
/* Images are (B, H, W, C), row-major, so a 28x28 grey image is its 784 pixels. A convolution is im2col then
 * nn_linear_*_cpu with weight (OC, K*K*C): the linear's output (B*OH*OW, OC) is already NHWC. */

/* Output height (or width) of a K x K window sliding by stride over in pixels padded by pad on each side:
 * (in + 2*pad - K) / stride + 1. Plain C, no device; asserts K >= 1, stride >= 1, pad >= 0, in + 2*pad >= K. */
int nn_conv_out_size(int in, int K, int stride, int pad);
/* col (B*OH*OW, K*K*C): row (b, oh, ow) holds the K x K x C patch whose top-left tap is pixel
 * (oh*stride - pad, ow*stride - pad) of inp (B, H, W, C), columns ordered (kh, kw, c) with c fastest; taps
 * outside the image are 0. OH, OW per nn_conv_out_size. */
void nn_im2col_forward_cpu(float *col, const float *inp, int B, int H, int W, int C, int K, int stride, int pad);
/* The adjoint of im2col: dinp (B, H, W, C) is overwritten (zeroed, then every entry of dcol (B*OH*OW, K*K*C)
 * adds into the pixel it was read from; padding taps are dropped). */
void nn_col2im_backward_cpu(float *dinp, const float *dcol, int B, int H, int W, int C, int K, int stride, int pad);

/* Non-overlapping P x P max pooling, stride P; H and W divisible by P. out (B, H/P, W/P, C) = each window's
 * maximum per channel; argmax (B, H/P, W/P, C) = the flat index into inp (B, H, W, C) of that maximum (the first
 * in row-major window order on ties), for the backward pass. */
void nn_maxpool2d_forward_cpu(float *out, int32_t *argmax, const float *inp, int B, int H, int W, int C, int P);
/* dinp (B, H, W, C) overwritten: 0 except dinp[argmax[o]] = dout[o] for every output o. dout (B, H/P, W/P, C). */
void nn_maxpool2d_backward_cpu(float *dinp, const float *dout, const int32_t *argmax, int B, int H, int W, int C,
                               int P);

/* ---- small helpers ------------------------------------------------------------------------------- */
/* y (N) += alpha * x (N). The one op that accumulates into an activation gradient, by design. */
void nn_add_cpu(float *y, const float *x, float alpha, int N);
/* out (B, V) -> pred (B) = argmax per row (the first maximum). */
void nn_argmax_cpu(int32_t *pred, const float *x, int B, int V);

/* ---- dense-parameter optimisers ------------------------------------------------------------------ */
/* SGD with momentum and coupled weight decay (PyTorch's convention), over N parameters:
 *   g = grads + weight_decay * params;  mom = momentum * mom + g;  params -= lr * mom.
 * mom (N) may be NULL only when momentum == 0 (then params -= lr * g). */
void nn_sgd_update_cpu(float *params, const float *grads, float *mom, float lr, float momentum, float weight_decay,
                       int N);
/* Adam with decoupled weight decay (AdamW), step t >= 1 (the step being taken, for bias correction):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mhat = m / (1-b1^t);  vhat = v / (1-b2^t);
 *   params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params). */
void nn_adam_update_cpu(float *params, const float *grads, float *m, float *v, float lr, float beta1, float beta2,
                        float eps, float weight_decay, int t, int N);

#ifdef __cplusplus
}
#endif

#endif
