/* The lazy update's arithmetic (CARLS §3.2): given the gradients gathered for one key, drop outliers and
 * average the rest. The caller then takes ONE optimizer step with the average.
 *
 * Outlier rule KB_OUTLIER_NORM_MEDIAN: with at least min_count gradients, a gradient whose L2 norm is above
 * threshold * (median of all the norms) is dropped. With fewer than min_count gradients, or a median of
 * zero, nothing is dropped. The median of an even count is the mean of the two middle norms. */
#ifndef KB_LAZY_H
#define KB_LAZY_H

#include <stdint.h>

typedef enum {
    KB_OUTLIER_NORM_MEDIAN = 0,
    KB_OUTLIER_NONE = 1,
} kb_outlier_rule_t;

typedef struct {
    kb_outlier_rule_t rule;
    float threshold;    /* default 3.0 */
    uint32_t min_count; /* default 3 */
} kb_outlier_config_t;

/* grads: count rows of dim floats, row-major. Writes the average of the kept rows into avg[dim].
 * Returns the number of rows kept (>= 1 whenever count >= 1: the median row is never an outlier) and
 * stores the number dropped in *dropped. count == 0 returns 0 and leaves avg untouched. */
uint32_t kb_lazy_average(const kb_outlier_config_t *cfg, const float *grads, uint32_t count, uint32_t dim,
                         float *avg, uint32_t *dropped);

#endif
