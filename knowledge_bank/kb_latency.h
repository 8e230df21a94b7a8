/* Latency histogram for one kind of request: lock-free recording, percentile estimates for stats.
 * Buckets are spaced by a factor of 2^(1/4) from 1 µs, so a percentile is known to within ~19%. */
#ifndef KB_LATENCY_H
#define KB_LATENCY_H

#include <stdatomic.h>
#include <stdint.h>

#define KB_LATENCY_BUCKETS 128

typedef struct {
    atomic_uint_fast64_t buckets[KB_LATENCY_BUCKETS];
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t max_us;
} kb_latency_t;

void kb_latency_init(kb_latency_t *self);
void kb_latency_record(kb_latency_t *self, uint64_t us);
/* Estimate of the q-quantile (0 < q <= 1) in microseconds: the upper edge of the bucket holding it. */
double kb_latency_quantile(kb_latency_t *self, double q);
uint64_t kb_latency_count(kb_latency_t *self);
uint64_t kb_latency_max(kb_latency_t *self);

#endif
