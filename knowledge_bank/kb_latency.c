#include "kb_latency.h"

#include <math.h>

void kb_latency_init(kb_latency_t *self)
{
    for (int i = 0; i < KB_LATENCY_BUCKETS; i++)
        atomic_init(&self->buckets[i], 0);
    atomic_init(&self->count, 0);
    atomic_init(&self->max_us, 0);
}

static int s_bucket(uint64_t us)
{
    if (us <= 1)
        return 0;
    int b = (int)ceil(4.0 * log2((double)us));
    return b >= KB_LATENCY_BUCKETS ? KB_LATENCY_BUCKETS - 1 : b;
}

void kb_latency_record(kb_latency_t *self, uint64_t us)
{
    atomic_fetch_add(&self->buckets[s_bucket(us)], 1);
    atomic_fetch_add(&self->count, 1);
    uint64_t prev = atomic_load(&self->max_us);
    while (us > prev && !atomic_compare_exchange_weak(&self->max_us, &prev, us)) {
    }
}

double kb_latency_quantile(kb_latency_t *self, double q)
{
    uint64_t total = 0;
    uint64_t counts[KB_LATENCY_BUCKETS];
    for (int i = 0; i < KB_LATENCY_BUCKETS; i++) {
        counts[i] = atomic_load(&self->buckets[i]);
        total += counts[i];
    }
    if (total == 0)
        return 0.0;
    uint64_t rank = (uint64_t)ceil(q * (double)total);
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < KB_LATENCY_BUCKETS; i++) {
        seen += counts[i];
        if (seen >= rank)
            return exp2((double)i / 4.0);
    }
    return exp2((double)(KB_LATENCY_BUCKETS - 1) / 4.0);
}

uint64_t kb_latency_count(kb_latency_t *self) { return atomic_load(&self->count); }
uint64_t kb_latency_max(kb_latency_t *self) { return atomic_load(&self->max_us); }
