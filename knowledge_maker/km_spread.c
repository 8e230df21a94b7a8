/* Label spreading on a symmetrised kNN graph (see km_spread.h). */
#include "km_spread.h"

#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int km_spread(const uint32_t *nbr, const float *weight, size_t n, uint32_t k, const float *prior, int C,
              float alpha, int iters, int balance, float *F)
{
    /* CSR of W = A + A^T: every directed edge i->j adds (i, j, w) and (j, i, w). */
    size_t *start = carls_xcalloc(n + 1, sizeof *start);
    for (size_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < k; j++) {
            uint32_t t = nbr[i * k + j];
            if (t == UINT32_MAX) {
                continue;
            }
            if (t >= n) {
                free(start);
                return -1;
            }
            start[i + 1]++;
            start[t + 1]++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        start[i + 1] += start[i];
    }
    const size_t nnz = start[n];
    uint32_t *col = carls_xmalloc(sizeof *col * (nnz ? nnz : 1));
    float *val = carls_xmalloc(sizeof *val * (nnz ? nnz : 1));
    size_t *fill = carls_xmalloc(sizeof *fill * (n ? n : 1));
    memcpy(fill, start, sizeof *fill * n);
    for (size_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < k; j++) {
            uint32_t t = nbr[i * k + j];
            if (t == UINT32_MAX) {
                continue;
            }
            float w = weight[i * k + j] > 0.0f ? weight[i * k + j] : 0.0f;
            col[fill[i]] = t;
            val[fill[i]++] = w;
            col[fill[t]] = (uint32_t)i;
            val[fill[t]++] = w;
        }
    }
    /* S = D^-1/2 W D^-1/2 */
    float *dinv = carls_xmalloc(sizeof *dinv * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        double d = 0.0;
        for (size_t e = start[i]; e < start[i + 1]; e++) {
            d += val[e];
        }
        dinv[i] = d > 0.0 ? (float)(1.0 / sqrt(d)) : 0.0f;
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t e = start[i]; e < start[i + 1]; e++) {
            val[e] *= dinv[i] * dinv[col[e]];
        }
    }
    float *next = carls_xmalloc(sizeof *next * (n * (size_t)C + 1));
    memcpy(F, prior, sizeof *F * n * (size_t)C);
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < n; i++) {
            float *o = next + i * (size_t)C;
            for (int c = 0; c < C; c++) {
                o[c] = 0.0f;
            }
            for (size_t e = start[i]; e < start[i + 1]; e++) {
                const float *src = F + (size_t)col[e] * (size_t)C;
                for (int c = 0; c < C; c++) {
                    o[c] += val[e] * src[c];
                }
            }
            const float *y = prior + i * (size_t)C;
            for (int c = 0; c < C; c++) {
                o[c] = alpha * o[c] + (1.0f - alpha) * y[c];
            }
        }
        memcpy(F, next, sizeof *F * n * (size_t)C);
    }
    if (balance) {
        for (int c = 0; c < C; c++) {
            double mass = 0.0;
            for (size_t i = 0; i < n; i++) {
                mass += F[i * (size_t)C + c];
            }
            float scale = mass > 0.0 ? (float)((double)n / ((double)C * mass)) : 0.0f;
            for (size_t i = 0; i < n; i++) {
                F[i * (size_t)C + c] *= scale;
            }
        }
    }
    free(start);
    free(col);
    free(val);
    free(fill);
    free(dinv);
    free(next);
    return 0;
}

void km_spread_labels(const float *F, size_t n, int C, int32_t *label, float *confidence)
{
    for (size_t i = 0; i < n; i++) {
        const float *f = F + i * (size_t)C;
        int best = 0;
        double sum = 0.0;
        for (int c = 0; c < C; c++) {
            sum += f[c] > 0.0f ? f[c] : 0.0f;
            if (f[c] > f[best]) {
                best = c;
            }
        }
        if (sum <= 0.0 || f[best] <= 0.0f) {
            label[i] = -1;
            confidence[i] = 0.0f;
        } else {
            label[i] = best;
            confidence[i] = (float)(f[best] / sum);
        }
    }
}
