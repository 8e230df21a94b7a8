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

/* Up to this many gradients the scratch space lives on the stack; the common pending set is small. */
#define S_STACK_ROWS 64

/* qsort order for norms; NaN sorts after everything so that it cannot become the median of mostly finite
 * norms. */
static int s_cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    if (isnan(a) || isnan(b))
        return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

static double s_row_norm(const float *row, uint32_t dim)
{
    double s = 0.0;
    for (uint32_t j = 0; j < dim; j++)
        s += (double)row[j] * (double)row[j];
    return sqrt(s);
}

/* Median of n >= 1 values; sorts v in place. An even count takes the mean of the two middle values. */
static double s_median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(double), s_cmp_double);
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
        for (uint32_t i = 0; i < count; i++)
            sorted[i] = norms[i] = s_row_norm(grads + (size_t)i * dim, dim);
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

    for (uint32_t j = 0; j < dim; j++) {
        double s = 0.0;
        for (uint32_t i = 0; i < count; i++) {
            if (filter && !(norms[i] <= limit))
                continue;
            s += (double)grads[(size_t)i * dim + j];
        }
        avg[j] = (float)(s / (double)kept);
    }

    free(heap);
    if (dropped)
        *dropped = count - kept;
    return kept;
}
