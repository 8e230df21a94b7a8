#include "kb_bloom.h"

#include "util.h"

#include <stdatomic.h>
#include <stdlib.h>

struct kb_bloom {
    atomic_uchar *counters;
    uint64_t mask;
    uint32_t hashes;
};

kb_bloom_t *kb_bloom_new(uint32_t bits_log2, uint32_t hashes)
{
    kb_bloom_t *self = carls_xcalloc(1, sizeof *self);
    uint64_t size = 1ULL << bits_log2;
    self->counters = carls_xcalloc(size, sizeof *self->counters);
    self->mask = size - 1;
    self->hashes = hashes;
    return self;
}

void kb_bloom_destroy(kb_bloom_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->counters);
    free(*self_p);
    *self_p = NULL;
}

/* Position i of key: h1 + i*h2 (double hashing), h2 odd so the positions differ. */
static uint64_t s_position(uint64_t h1, uint64_t h2, uint32_t i, uint64_t mask) { return (h1 + i * h2) & mask; }

static void s_hashes(const void *key, size_t len, uint64_t *h1, uint64_t *h2)
{
    *h1 = carls_hash64(key, len, 0x626c6f6f6d31ULL);
    *h2 = carls_hash64(key, len, 0x626c6f6f6d32ULL) | 1u;
}

uint32_t kb_bloom_add(kb_bloom_t *self, const void *key, size_t len)
{
    uint64_t h1, h2;
    s_hashes(key, len, &h1, &h2);
    uint32_t min = 255;
    for (uint32_t i = 0; i < self->hashes; i++) {
        atomic_uchar *c = &self->counters[s_position(h1, h2, i, self->mask)];
        unsigned char old = atomic_load(c);
        while (old < 255 && !atomic_compare_exchange_weak(c, &old, (unsigned char)(old + 1))) {
        }
        uint32_t now = old < 255 ? old + 1u : 255u;
        if (now < min)
            min = now;
    }
    return min;
}

uint32_t kb_bloom_count(kb_bloom_t *self, const void *key, size_t len)
{
    uint64_t h1, h2;
    s_hashes(key, len, &h1, &h2);
    uint32_t min = 255;
    for (uint32_t i = 0; i < self->hashes; i++) {
        uint32_t v = atomic_load(&self->counters[s_position(h1, h2, i, self->mask)]);
        if (v < min)
            min = v;
    }
    return min;
}
