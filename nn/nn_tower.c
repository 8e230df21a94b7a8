/* The two-tower model's shared pieces (see nn_tower.h). CPU only: a batch is a few small GEMMs over rows
 * that travel through the bank, so the bank, not the arithmetic, sets the pace. */
#include "nn_tower.h"

#include "nn_ops.h"

#include <cblas.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int nn_tower_trigrams(const char *word, size_t len, char (*keys)[3], int max)
{
    /* Trigram i of "<" word ">" covers bytes i-1 .. i+1 of the word, with '<' at -1 and '>' at len. */
    int n = 0;
    size_t count = len < 1 ? 0 : len;
    for (size_t i = 0; i < count && n < max; i++, n++) {
        for (int j = 0; j < 3; j++) {
            long at = (long)i - 1 + j;
            keys[n][j] = at < 0 ? '<' : (size_t)at >= len ? '>' : word[at];
        }
    }
    return n;
}

void nn_tower_word_pool(float *x, const float *word_rows, const int32_t *word_idx, const float *gram_rows,
                        const int32_t *gram_idx, const int32_t *gram_off, int B, int E)
{
    for (int b = 0; b < B; b++) {
        float *xb = x + (size_t)b * E;
        memcpy(xb, word_rows + (size_t)word_idx[b] * E, (size_t)E * sizeof(float));
        int n = gram_off[b + 1] - gram_off[b];
        if (n <= 0)
            continue;
        float scale = 1.0f / (float)n;
        for (int g = gram_off[b]; g < gram_off[b + 1]; g++) {
            const float *row = gram_rows + (size_t)gram_idx[g] * E;
            for (int e = 0; e < E; e++)
                xb[e] += scale * row[e];
        }
    }
}

void nn_tower_word_pool_backward(float *d_word_rows, float *d_gram_rows, const float *dx, const int32_t *word_idx,
                                 const int32_t *gram_idx, const int32_t *gram_off, int B, int E)
{
    for (int b = 0; b < B; b++) {
        const float *db = dx + (size_t)b * E;
        float *dw = d_word_rows + (size_t)word_idx[b] * E;
        for (int e = 0; e < E; e++)
            dw[e] += db[e];
        int n = gram_off[b + 1] - gram_off[b];
        if (n <= 0)
            continue;
        float scale = 1.0f / (float)n;
        for (int g = gram_off[b]; g < gram_off[b + 1]; g++) {
            float *dg = d_gram_rows + (size_t)gram_idx[g] * E;
            for (int e = 0; e < E; e++)
                dg[e] += scale * db[e];
        }
    }
}

void nn_tower_head_forward(const nn_tower_head_t *h, float *out, float *pre, float *norms, float *hid,
                           const float *x, int B)
{
    nn_linear_forward_cpu(pre, x, h->W, h->bias, B, h->E, h->D);
    if (h->H > 0) {
        nn_linear_forward_cpu(hid, x, h->U, h->c, B, h->E, h->H);
        nn_relu_forward_cpu(hid, hid, B * h->H);
        /* pre (B, D) += hid (B, H) @ V^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, h->D, h->H, 1.0f, hid, h->H, h->V, h->H, 1.0f, pre,
                    h->D);
    }
    nn_l2norm_forward_cpu(out, norms, pre, NN_TOWER_L2_EPS, B, h->D);
}

void nn_tower_head_backward(const nn_tower_head_t *h, const nn_tower_head_grads_t *g, float *dx, float *dpre,
                            float *dhid, const float *dout, const float *out, const float *norms, const float *hid,
                            const float *x, int B)
{
    nn_l2norm_backward_cpu(dpre, dout, out, norms, B, h->D);
    nn_linear_backward_cpu(dx, g->W, g->bias, dpre, x, h->W, B, h->E, h->D);
    if (h->H <= 0)
        return;
    nn_linear_backward_cpu(dhid, g->V, NULL, dpre, hid, h->V, B, h->H, h->D);
    nn_relu_backward_cpu(dhid, dhid, hid, B * h->H);
    nn_linear_backward_cpu(NULL, g->U, g->c, dhid, x, h->U, B, h->E, h->H);
    if (dx) /* dx (B, E) += dhid (B, H) @ U (H, E) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, h->E, h->H, 1.0f, dhid, h->H, h->U, h->E, 1.0f, dx,
                    h->E);
}

#define NN_TOWER_MASKED_LOGIT -1e4f

double nn_tower_infonce(float *dq, float *dcand, float *logits, float *probs, const float *q, const float *cand,
                        const uint32_t *cand_word, const float *logq, float inv_temp, int B, int N, int D)
{
    nn_linear_forward_cpu(logits, q, cand, NULL, B, D, N);
    for (int b = 0; b < B; b++) {
        float *row = logits + (size_t)b * N;
        for (int j = 0; j < N; j++)
            row[j] = (j != b && cand_word[j] == cand_word[b]) ? NN_TOWER_MASKED_LOGIT
                                                               : row[j] * inv_temp - (logq ? logq[j] : 0.0f);
    }
    /* targets[b] = b; dlosses = 1/B (the mean). Small batches: the arrays live on the stack in chunks. */
    double loss = 0;
    for (int b0 = 0; b0 < B; b0 += 256) {
        int nb = B - b0 < 256 ? B - b0 : 256;
        int32_t targets[256];
        float losses[256], dlosses[256];
        for (int i = 0; i < nb; i++) {
            targets[i] = b0 + i;
            dlosses[i] = 1.0f / (float)B;
        }
        float *lg = logits + (size_t)b0 * N, *pr = probs + (size_t)b0 * N;
        nn_softmax_ce_forward_cpu(losses, pr, lg, targets, nb, N);
        for (int i = 0; i < nb; i++)
            loss += losses[i];
        /* The logits' gradient, through the temperature (masked logits are constants: their gradient is 0). */
        nn_softmax_ce_backward_cpu(lg, dlosses, pr, targets, nb, N);
    }
    for (int b = 0; b < B; b++) {
        float *row = logits + (size_t)b * N;
        for (int j = 0; j < N; j++)
            row[j] = (j != b && cand_word[j] == cand_word[b]) ? 0.0f : row[j] * inv_temp;
    }
    memset(dcand, 0, (size_t)N * D * sizeof(float));
    nn_linear_backward_cpu(dq, dcand, NULL, logits, q, cand, B, D, N);
    return loss / B;
}

/* The tensor PREFIX.NAME if it has the shape (d0) or (d0, d1); NULL with the reason in err otherwise. */
static const float *s_tensor(const carls_ckpt_t *ckpt, const char *prefix, const char *name, int ndim, int64_t d0,
                             int64_t d1, char *err, size_t errlen)
{
    char full[64];
    snprintf(full, sizeof full, "%s.%s", prefix, name);
    const carls_ckpt_tensor_t *t = carls_ckpt_find(ckpt, full);
    if (!t) {
        snprintf(err, errlen, "checkpoint lacks tensor %s", full);
        return NULL;
    }
    if (t->ndim != ndim || t->dims[0] != d0 || (ndim == 2 && t->dims[1] != d1)) {
        snprintf(err, errlen, "checkpoint tensor %s has an inconsistent shape", full);
        return NULL;
    }
    return t->data;
}

int nn_tower_from_ckpt(const carls_ckpt_t *ckpt, const char *which, nn_tower_head_t *out, char *err, size_t errlen)
{
    if (strcmp(carls_ckpt_kind(ckpt), NN_TOWER_KIND) != 0) {
        snprintf(err, errlen, "checkpoint kind is '%s', not '%s'", carls_ckpt_kind(ckpt), NN_TOWER_KIND);
        return -1;
    }
    char wname[32];
    snprintf(wname, sizeof wname, "%s.weight", which);
    const carls_ckpt_tensor_t *w = carls_ckpt_find(ckpt, wname);
    if (!w) {
        snprintf(err, errlen, "checkpoint lacks tensor %s", wname);
        return -1;
    }
    if (w->ndim != 2 || w->dims[0] < 1 || w->dims[1] < 1 || w->dims[0] > 65536 || w->dims[1] > 65536) {
        snprintf(err, errlen, "checkpoint tensor %s has an inconsistent shape", wname);
        return -1;
    }
    nn_tower_head_t h = {.D = (int)w->dims[0], .E = (int)w->dims[1], .W = w->data};
    h.bias = s_tensor(ckpt, which, "bias", 1, h.D, 0, err, errlen);
    if (!h.bias)
        return -1;
    char uname[48];
    snprintf(uname, sizeof uname, "%s.hidden.weight", which);
    const carls_ckpt_tensor_t *u = carls_ckpt_find(ckpt, uname);
    if (u) { /* an MLP head: its hidden layer and output weights must match */
        if (u->ndim != 2 || u->dims[0] < 1 || u->dims[0] > 65536 || u->dims[1] != h.E) {
            snprintf(err, errlen, "checkpoint tensor %s has an inconsistent shape", uname);
            return -1;
        }
        h.H = (int)u->dims[0];
        h.U = u->data;
        h.c = s_tensor(ckpt, which, "hidden.bias", 1, h.H, 0, err, errlen);
        h.V = h.c ? s_tensor(ckpt, which, "out.weight", 2, h.D, h.H, err, errlen) : NULL;
        if (!h.V)
            return -1;
    }
    const carls_ckpt_tensor_t *defs = strcmp(which, "word") == 0 ? carls_ckpt_find(ckpt, "word.defs") : NULL;
    h.defs = defs && defs->numel >= 1 && defs->data[0] > 0 ? (int)defs->data[0] : 0;
    *out = h;
    return 0;
}
