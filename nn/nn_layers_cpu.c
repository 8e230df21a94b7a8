/* CPU reference implementations of the operations declared in nn_ops.h. Plain loops, accumulation in
 * float unless said otherwise, GEMMs through OpenBLAS. The CUDA twins in cuda/ must agree with these. */
#include "nn_ops.h"

#include "nn_hash.h"
#include "nn_host_device.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* ---- linear ---- */

void nn_linear_forward_cpu(float *out, const float *inp, const float *weight, const float *bias, int B, int C,
                           int OC)
{
    assert(out && inp && weight && B > 0 && C > 0 && OC > 0);
    /* out (B, OC) = inp (B, C) @ weight^T (C, OC) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias) {
        for (int b = 0; b < B; b++) {
            float *row = out + (size_t)b * OC;
            for (int o = 0; o < OC; o++) {
                row[o] += bias[o];
            }
        }
    }
}

void nn_linear_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int B, int C, int OC)
{
    assert(dweight && dout && inp && weight && B > 0 && C > 0 && OC > 0);
    if (dinp) {
        /* dinp (B, C) = dout (B, OC) @ weight (OC, C) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    }
    /* dweight (OC, C) += dout^T (OC, B) @ inp (B, C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, B, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
        for (int b = 0; b < B; b++) {
            const float *row = dout + (size_t)b * OC;
            for (int o = 0; o < OC; o++) {
                dbias[o] += row[o];
            }
        }
    }
}

/* ---- ReLU ---- */

void nn_relu_forward_cpu(float *out, const float *inp, int N)
{
    assert(out && inp && N >= 0);
    for (int i = 0; i < N; i++) {
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
    }
}

void nn_relu_backward_cpu(float *dinp, const float *dout, const float *out, int N)
{
    assert(dinp && dout && out && N >= 0);
    for (int i = 0; i < N; i++) {
        dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
    }
}

/* ---- dropout ---- */

void nn_dropout_forward_cpu(float *out, float *mask, const float *inp, float p, uint64_t seed, int N)
{
    assert(out && mask && inp && N >= 0 && p >= 0.0f && p < 1.0f);
    const float scale = 1.0f / (1.0f - p);
    for (int i = 0; i < N; i++) {
        mask[i] = nn_hash_uniform(seed, (uint64_t)i) < p ? 0.0f : scale;
        out[i] = inp[i] * mask[i];
    }
}

void nn_dropout_backward_cpu(float *dinp, const float *dout, const float *mask, int N)
{
    assert(dinp && dout && mask && N >= 0);
    for (int i = 0; i < N; i++) {
        dinp[i] = dout[i] * mask[i];
    }
}

/* ---- softmax cross-entropy ---- */

/* probs (V) = softmax(logits (V)); returns log(sum exp(logits - max)) + max, the log-partition. */
static float s_softmax_row(float *probs, const float *logits, int V)
{
    float maxv = logits[0];
    for (int v = 1; v < V; v++) {
        maxv = logits[v] > maxv ? logits[v] : maxv;
    }
    double sum = 0.0;
    for (int v = 0; v < V; v++) {
        probs[v] = expf(logits[v] - maxv);
        sum += probs[v];
    }
    const float inv = (float)(1.0 / sum);
    for (int v = 0; v < V; v++) {
        probs[v] *= inv;
    }
    return maxv + (float)log(sum);
}

void nn_softmax_ce_forward_cpu(float *losses, float *probs, const float *logits, const int32_t *targets, int B,
                               int V)
{
    assert(losses && probs && logits && targets && B > 0 && V > 0);
    for (int b = 0; b < B; b++) {
        const float *lrow = logits + (size_t)b * V;
        float logz = s_softmax_row(probs + (size_t)b * V, lrow, V);
        int t = targets[b];
        assert(t < V);
        /* -log p_t computed as logZ - logit_t: accurate even when p_t underflows. */
        losses[b] = t >= 0 ? logz - lrow[t] : 0.0f;
    }
}

void nn_softmax_ce_backward_cpu(float *dlogits, const float *dlosses, const float *probs, const int32_t *targets,
                                int B, int V)
{
    assert(dlogits && dlosses && probs && targets && B > 0 && V > 0);
    for (int b = 0; b < B; b++) {
        float *drow = dlogits + (size_t)b * V;
        const float *prow = probs + (size_t)b * V;
        int t = targets[b];
        if (t < 0) {
            memset(drow, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float dl = dlosses[b];
        for (int v = 0; v < V; v++) {
            drow[v] = (prow[v] - (v == t ? 1.0f : 0.0f)) * dl;
        }
    }
}

/* ---- L2 normalisation ---- */

void nn_l2norm_forward_cpu(float *out, float *norms, const float *inp, float eps, int B, int D)
{
    assert(out && norms && inp && B > 0 && D > 0 && eps > 0.0f);
    for (int b = 0; b < B; b++) {
        const float *x = inp + (size_t)b * D;
        float *y = out + (size_t)b * D;
        double ss = 0.0;
        for (int d = 0; d < D; d++) {
            ss += (double)x[d] * x[d];
        }
        float n = (float)sqrt(ss + eps);
        norms[b] = n;
        float inv = 1.0f / n;
        for (int d = 0; d < D; d++) {
            y[d] = x[d] * inv;
        }
    }
}

void nn_l2norm_backward_cpu(float *dinp, const float *dout, const float *out, const float *norms, int B, int D)
{
    assert(dinp && dout && out && norms && B > 0 && D > 0);
    for (int b = 0; b < B; b++) {
        const float *dy = dout + (size_t)b * D;
        const float *y = out + (size_t)b * D;
        float *dx = dinp + (size_t)b * D;
        double dot = 0.0;
        for (int d = 0; d < D; d++) {
            dot += (double)dy[d] * y[d];
        }
        float inv = 1.0f / norms[b];
        for (int d = 0; d < D; d++) {
            dx[d] = (dy[d] - y[d] * (float)dot) * inv;
        }
    }
}

/* ---- embedding bag ---- */

void nn_embedding_bag_forward_cpu(float *out, const float *rows, const int32_t *indices, const int32_t *offsets,
                                  const float *weights, int mode, int B, int R, int D)
{
    assert(out && rows && indices && offsets && B > 0 && R >= 0 && D > 0);
    (void)R;
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        assert(offsets[b] <= offsets[b + 1]);
        float inv = nn_bag_scale(weights, offsets, b, mode == NN_BAG_MEAN);
        for (int32_t l = offsets[b]; l < offsets[b + 1]; l++) {
            int32_t r = indices[l];
            assert(r >= 0 && r < R);
            float w = (weights ? weights[l] : 1.0f) * inv;
            const float *row = rows + (size_t)r * D;
            for (int d = 0; d < D; d++) {
                o[d] += w * row[d];
            }
        }
    }
}

void nn_embedding_bag_backward_cpu(float *drows, const float *dout, const int32_t *indices, const int32_t *offsets,
                                   const float *weights, int mode, int B, int R, int D)
{
    assert(drows && dout && indices && offsets && B > 0 && R >= 0 && D > 0);
    memset(drows, 0, sizeof(float) * (size_t)R * (size_t)D);
    for (int b = 0; b < B; b++) {
        const float *g = dout + (size_t)b * D;
        float inv = nn_bag_scale(weights, offsets, b, mode == NN_BAG_MEAN);
        for (int32_t l = offsets[b]; l < offsets[b + 1]; l++) {
            int32_t r = indices[l];
            assert(r >= 0 && r < R);
            float w = (weights ? weights[l] : 1.0f) * inv;
            float *dr = drows + (size_t)r * D;
            for (int d = 0; d < D; d++) {
                dr[d] += w * g[d];
            }
        }
    }
}

/* ---- neighbour squared distance ---- */

void nn_pairwise_sqdist_forward_cpu(float *out, const float *x, const float *nbr, int B, int K, int D)
{
    assert(out && x && nbr && B > 0 && K > 0 && D > 0);
    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * D;
        for (int k = 0; k < K; k++) {
            const float *n = nbr + ((size_t)b * K + k) * D;
            float s = 0.0f;
            for (int d = 0; d < D; d++) {
                float diff = xb[d] - n[d];
                s += diff * diff;
            }
            out[(size_t)b * K + k] = s;
        }
    }
}

void nn_pairwise_sqdist_backward_cpu(float *dx, float *dnbr, const float *dout, const float *x, const float *nbr,
                                     int B, int K, int D)
{
    assert(dx && dout && x && nbr && B > 0 && K > 0 && D > 0);
    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * D;
        float *dxb = dx + (size_t)b * D;
        memset(dxb, 0, sizeof(float) * (size_t)D);
        for (int k = 0; k < K; k++) {
            const float *n = nbr + ((size_t)b * K + k) * D;
            float g = 2.0f * dout[(size_t)b * K + k];
            float *dn = dnbr ? dnbr + ((size_t)b * K + k) * D : NULL;
            for (int d = 0; d < D; d++) {
                float gd = g * (xb[d] - n[d]);
                dxb[d] += gd;
                if (dn) {
                    dn[d] = -gd;
                }
            }
        }
    }
}

/* ---- InfoNCE ---- */

void nn_infonce_forward_cpu(float *losses, float *probs, const float *q, const float *pos, const float *neg,
                            const float *pos_logq, const float *neg_logq, float inv_temp, int B, int N, int D)
{
    assert(losses && probs && q && pos && neg && B > 0 && N > 0 && D > 0);
    const int W = 1 + N; /* row width of probs */
    /* probs[:, 1:] (B, N, row stride W) = inv_temp * q (B, D) @ neg^T (D, N) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, N, D, inv_temp, q, D, neg, D, 0.0f, probs + 1, W);
    for (int b = 0; b < B; b++) {
        float *row = probs + (size_t)b * W;
        const float *qb = q + (size_t)b * D;
        const float *pb = pos + (size_t)b * D;
        float dot = 0.0f;
        for (int d = 0; d < D; d++) {
            dot += qb[d] * pb[d];
        }
        row[0] = inv_temp * dot - (pos_logq ? pos_logq[b] : 0.0f);
        if (neg_logq) {
            for (int j = 0; j < N; j++) {
                row[1 + j] -= neg_logq[j];
            }
        }
        float logit0 = row[0];
        float logz = s_softmax_row(row, row, W);
        losses[b] = logz - logit0;
    }
}

void nn_infonce_backward_cpu(float *dq, float *dpos, float *dneg, float *probs, const float *dlosses, const float *q,
                             const float *pos, const float *neg, float inv_temp, int B, int N, int D)
{
    assert(dq && probs && dlosses && q && pos && neg && B > 0 && N > 0 && D > 0);
    const int W = 1 + N;
    /* dlogits (B, W) = (probs - onehot(0)) * dlosses, written over probs. */
    for (int b = 0; b < B; b++) {
        float *row = probs + (size_t)b * W;
        float dl = dlosses[b];
        row[0] -= 1.0f;
        for (int j = 0; j < W; j++) {
            row[j] *= dl;
        }
    }
    /* dq (B, D) = inv_temp * (dlogits[:, 1:] (B, N) @ neg (N, D) + dlogits[:, 0] * pos) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, D, N, inv_temp, probs + 1, W, neg, D, 0.0f, dq, D);
    for (int b = 0; b < B; b++) {
        float g0 = inv_temp * probs[(size_t)b * W];
        const float *pb = pos + (size_t)b * D;
        const float *qb = q + (size_t)b * D;
        float *dqb = dq + (size_t)b * D;
        for (int d = 0; d < D; d++) {
            dqb[d] += g0 * pb[d];
        }
        if (dpos) {
            float *dpb = dpos + (size_t)b * D;
            for (int d = 0; d < D; d++) {
                dpb[d] = g0 * qb[d];
            }
        }
    }
    if (dneg) {
        /* dneg (N, D) = inv_temp * dlogits[:, 1:]^T (N, B) @ q (B, D) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, D, B, inv_temp, probs + 1, W, q, D, 0.0f, dneg, D);
    }
}

/* ---- helpers ---- */

void nn_add_cpu(float *y, const float *x, float alpha, int N)
{
    assert(y && x && N >= 0);
    for (int i = 0; i < N; i++) {
        y[i] += alpha * x[i];
    }
}

void nn_argmax_cpu(int32_t *pred, const float *x, int B, int V)
{
    assert(pred && x && B > 0 && V > 0);
    for (int b = 0; b < B; b++) {
        pred[b] = nn_row_argmax(x + (size_t)b * V, V);
    }
}

/* ---- optimisers ---- */

void nn_sgd_update_cpu(float *params, const float *grads, float *mom, float lr, float momentum, float weight_decay,
                       int N)
{
    assert(params && grads && N >= 0 && (mom || momentum == 0.0f));
    for (int i = 0; i < N; i++) {
        float g = grads[i] + weight_decay * params[i];
        if (mom) {
            mom[i] = momentum * mom[i] + g;
            g = mom[i];
        }
        params[i] -= lr * g;
    }
}

void nn_adam_update_cpu(float *params, const float *grads, float *m, float *v, float lr, float beta1, float beta2,
                        float eps, float weight_decay, int t, int N)
{
    assert(params && grads && m && v && t >= 1 && N >= 0);
    const float c1 = 1.0f / (1.0f - powf(beta1, (float)t));
    const float c2 = 1.0f / (1.0f - powf(beta2, (float)t));
    for (int i = 0; i < N; i++) {
        float g = grads[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = m[i] * c1;
        float vhat = v[i] * c2;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
}
