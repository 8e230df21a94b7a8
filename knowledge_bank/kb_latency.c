#include "kb_latency.h"

#include <math.h>

void kb_latency_init(kb_latency_t *self)
{
    for (int i = 0; i < KB_LATENCY_BUCKETS; i++)
        atomic_init(&self->buckets[i], 0);
    atomic_init(&self->count, 0);
    atomic_init(&self->max_us, 0);
    atomic_init(&self->sum_us, 0);
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
    atomic_fetch_add(&self->sum_us, us);
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
uint64_t kb_latency_sum(kb_latency_t *self) { return atomic_load(&self->sum_us); }

uint64_t kb_latency_le_counts(kb_latency_t *self, uint64_t *le)
{
    /* bucket b holds values v with ceil(4 log2 v) == b (b = 0: v <= 1), so v <= 2^i exactly when b <= 4i */
    uint64_t seen = 0;
    int next = 0;
    for (int b = 0; b < KB_LATENCY_BUCKETS; b++) {
        seen += atomic_load(&self->buckets[b]);
        if (next < KB_LATENCY_LE_BUCKETS && b == 4 * next)
            le[next++] = seen;
    }
    return seen;
}

void kb_latency_summarize(kb_latency_t *self, Carls__LatencySummary *l, uint64_t *le_storage)
{
    l->count = kb_latency_le_counts(self, le_storage);
    l->max_us = (double)kb_latency_max(self);
    l->p50_us = fmin(kb_latency_quantile(self, 0.50), l->max_us);
    l->p99_us = fmin(kb_latency_quantile(self, 0.99), l->max_us);
    l->sum_us = (double)kb_latency_sum(self);
    l->le_counts = le_storage;
    l->n_le_counts = KB_LATENCY_LE_BUCKETS;
}
