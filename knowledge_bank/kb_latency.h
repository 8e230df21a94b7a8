/* Latency histogram for one kind of request: lock-free recording, percentile estimates for stats, and the
 * cumulative power-of-two buckets and sum that /metrics exports as a Prometheus histogram.
 * Buckets are spaced by a factor of 2^(1/4) from 1 µs, so a percentile is known to within ~19%. */
#ifndef KB_LATENCY_H
#define KB_LATENCY_H

#include "carls.pb-c.h"

#include <stdatomic.h>
#include <stdint.h>

#define KB_LATENCY_BUCKETS 128
/* Exported buckets: le = 2^i µs for i = 0 .. KB_LATENCY_LE_BUCKETS - 1 (1 µs .. 2^25 µs, about 33.6 s); every
 * 4th internal bucket edge, so the cumulative counts are exact. */
#define KB_LATENCY_LE_BUCKETS 26

typedef struct {
    atomic_uint_fast64_t buckets[KB_LATENCY_BUCKETS];
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t max_us;
    atomic_uint_fast64_t sum_us; /* total of everything recorded */
} kb_latency_t;

void kb_latency_init(kb_latency_t *self);
void kb_latency_record(kb_latency_t *self, uint64_t us);
/* Estimate of the q-quantile (0 < q <= 1) in microseconds: the upper edge of the bucket holding it. */
double kb_latency_quantile(kb_latency_t *self, double q);
uint64_t kb_latency_count(kb_latency_t *self);
uint64_t kb_latency_max(kb_latency_t *self);
uint64_t kb_latency_sum(kb_latency_t *self);

/* le (KB_LATENCY_LE_BUCKETS) = the number of recordings of at most 2^i µs, cumulative; returns the count of
 * all recordings read in the same pass (le's last entry can be below it: slower ones). */
uint64_t kb_latency_le_counts(kb_latency_t *self, uint64_t *le);

/* Fills l's count, p50_us, p99_us, max_us (percentiles capped at the maximum seen, since a percentile is its
 * bucket's upper edge), sum_us and le_counts, which point into le_storage (KB_LATENCY_LE_BUCKETS entries,
 * caller's; it must live as long as l is used). l->op is left as it is. */
void kb_latency_summarize(kb_latency_t *self, Carls__LatencySummary *l, uint64_t *le_storage);

#endif
