/* The lazy update's arithmetic: outlier filtering and averaging (see kb_lazy.h).
 *
 * Norms, the median and the sums are computed in double: the gradients are floats, so double sums of a few
 * thousand rows are exact enough that the average is the correctly rounded float mean in every case the
 * tests check (e.g. 2 and 4 average to exactly 3). */
#include "kb_lazy.h"

#include "util.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Up to this many gradients the scratch space lives on the stack; the common pending set is small. */
#define S_STACK_ROWS 64
/* Up to this dimension the column sums live on the stack too. */
#define S_STACK_DIM 512

/* qsort order for norms; NaN sorts after everything so that it cannot become the median of mostly finite
 * norms. */
static int s_cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    if (isnan(a) || isnan(b))
        return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

/* L2 norms of count rows. Four rows at a time: each row's sum still runs in column order (so every norm is
 * the same double as summing that row alone), but four independent sums keep the adder busy. */
static void s_row_norms(const float *grads, uint32_t count, uint32_t dim, double *norms)
{
    uint32_t i = 0;
    for (; i + 4 <= count; i += 4) {
        const float *a = grads + (size_t)i * dim, *b = a + dim, *c = b + dim, *d = c + dim;
        double sa = 0.0, sb = 0.0, sc = 0.0, sd = 0.0;
        for (uint32_t j = 0; j < dim; j++) {
            sa += (double)a[j] * (double)a[j];
            sb += (double)b[j] * (double)b[j];
            sc += (double)c[j] * (double)c[j];
            sd += (double)d[j] * (double)d[j];
        }
        norms[i] = sqrt(sa);
        norms[i + 1] = sqrt(sb);
        norms[i + 2] = sqrt(sc);
        norms[i + 3] = sqrt(sd);
    }
    for (; i < count; i++) {
        const float *a = grads + (size_t)i * dim;
        double s = 0.0;
        for (uint32_t j = 0; j < dim; j++)
            s += (double)a[j] * (double)a[j];
        norms[i] = sqrt(s);
    }
}

/* Median of n >= 1 values; sorts v in place. An even count takes the mean of the two middle values. A
 * pending set is a few dozen norms at most, where insertion sort beats qsort's calls through a pointer. */
static double s_median(double *v, uint32_t n)
{
    if (n <= S_STACK_ROWS) {
        for (uint32_t i = 1; i < n; i++) {
            double x = v[i];
            uint32_t j = i;
            for (; j > 0 && s_cmp_double(&v[j - 1], &x) > 0; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
    } else {
        qsort(v, n, sizeof(double), s_cmp_double);
    }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint32_t kb_lazy_average(const kb_outlier_config_t *cfg, const float *grads, uint32_t count, uint32_t dim,
                         float *avg, uint32_t *dropped)
{
    assert(cfg);
    if (dropped)
        *dropped = 0;
    if (count == 0)
        return 0;
    assert(grads && (avg || dim == 0));

    /* norms[i] is row i's L2 norm; only computed (and read) when filtering. sorted is its copy for the median. */
    double stack_norms[S_STACK_ROWS], stack_sorted[S_STACK_ROWS];
    double *norms = stack_norms, *sorted = stack_sorted;
    double *heap = NULL;
    double limit = INFINITY;
    int filter = cfg->rule == KB_OUTLIER_NORM_MEDIAN && count >= cfg->min_count;

    if (filter) {
        if (count > S_STACK_ROWS) {
            heap = carls_xmalloc(2 * (size_t)count * sizeof(double));
            norms = heap;
            sorted = heap + count;
        }
        s_row_norms(grads, count, dim, norms);
        memcpy(sorted, norms, count * sizeof(double));
        double median = s_median(sorted, count);
        /* A threshold below 1 could drop the median row itself (and then every row); clamping to 1 keeps the
         * header's promise that at least one row survives. fmax also maps a NaN threshold to 1. */
        double threshold = fmax((double)cfg->threshold, 1.0);
        /* A zero median (most gradients zero) or a non-finite one gives no scale to compare against. */
        if (median > 0.0 && isfinite(median))
            limit = threshold * median;
        else
            filter = 0;
    }

    uint32_t kept = 0;
    for (uint32_t i = 0; i < count; i++) {
        /* Written as !(<=) so that a NaN norm counts as an outlier when filtering is on. */
        if (filter && !(norms[i] <= limit))
            continue;
        kept++;
    }
    assert(kept >= 1);

    /* Row by row into a double per column: each column is summed in row order as before, and the inner loop
     * runs over contiguous floats (the compiler vectorizes it) instead of striding down a column. */
    double stack_sums[S_STACK_DIM];
    double *sums = dim <= S_STACK_DIM ? stack_sums : carls_xmalloc((size_t)dim * sizeof(double));
    for (uint32_t j = 0; j < dim; j++)
        sums[j] = 0.0;
    for (uint32_t i = 0; i < count; i++) {
        if (filter && !(norms[i] <= limit))
            continue;
        const float *row = grads + (size_t)i * dim;
        for (uint32_t j = 0; j < dim; j++)
            sums[j] += (double)row[j];
    }
    for (uint32_t j = 0; j < dim; j++)
        avg[j] = (float)(sums[j] / (double)kept);

    if (sums != stack_sums)
        free(sums);
    free(heap);
    if (dropped)
        *dropped = count - kept;
    return kept;
}
