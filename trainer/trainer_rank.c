/* Ranking metrics (see trainer_rank.h). */
#include "trainer_rank.h"

#include "util.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

uint32_t rank_of_truth(const float *scores, size_t n, size_t truth)
{
    assert(truth < n);
    float t = scores[truth];
    size_t higher = 0, ties = 0;
    for (size_t i = 0; i < n; i++) {
        float s = scores[i];
        if (isnan(t) ? !isnan(s) : s > t)
            higher++;
        else if (i != truth && (s == t || (isnan(s) && isnan(t))))
            ties++;
    }
    size_t rank = 1 + higher + ties / 2;
    return rank > UINT32_MAX ? UINT32_MAX : (uint32_t)rank;
}

static int s_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

void rank_metrics(const uint32_t *ranks, size_t n, rank_metrics_t *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (n == 0)
        return;
    size_t r1 = 0, r10 = 0, r100 = 0;
    double inv = 0;
    for (size_t i = 0; i < n; i++) {
        assert(ranks[i] >= 1);
        r1 += ranks[i] <= 1;
        r10 += ranks[i] <= 10;
        r100 += ranks[i] <= 100;
        inv += 1.0 / ranks[i];
    }
    out->r1 = (double)r1 / (double)n;
    out->r10 = (double)r10 / (double)n;
    out->r100 = (double)r100 / (double)n;
    out->mrr = inv / (double)n;
    uint32_t *sorted = carls_xmalloc(n * sizeof *sorted);
    memcpy(sorted, ranks, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, s_cmp_u32);
    out->median_rank = n % 2 ? sorted[n / 2] : ((double)sorted[n / 2 - 1] + (double)sorted[n / 2]) / 2.0;
    free(sorted);
}

void rank_metrics_print(FILE *f, const char *prefix, const rank_metrics_t *m)
{
    const char *p = prefix ? prefix : "";
    fprintf(f, "%sr1=%.4f %sr10=%.4f %sr100=%.4f %smedian_rank=%.1f %smrr=%.4f %sn=%zu\n", p, m->r1, p, m->r10, p,
            m->r100, p, m->median_rank, p, m->mrr, p, m->n);
}
