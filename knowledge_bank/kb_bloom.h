/* Counting Bloom filter for admission (DynamicEmbedding's short-term memory): counts how often keys that
 * have no row yet were seen, in a fixed amount of memory, so rare keys never get a row.
 *
 * 2^bits_log2 saturating 8-bit counters, `hashes` positions per key (double hashing of carls_hash64). A
 * key's count is the minimum of its counters: never below the true count, sometimes above it (a false
 * admission), never the other way round. Thread-safe (atomic counters). */
#ifndef KB_BLOOM_H
#define KB_BLOOM_H

#include <stddef.h>
#include <stdint.h>

typedef struct kb_bloom kb_bloom_t;

/* bits_log2 in 4..30, hashes in 1..16. Caller owns the result. */
kb_bloom_t *kb_bloom_new(uint32_t bits_log2, uint32_t hashes);
void kb_bloom_destroy(kb_bloom_t **self_p);

/* Counts one sighting of key and returns its estimated count including this one (saturates at 255). */
uint32_t kb_bloom_add(kb_bloom_t *self, const void *key, size_t len);

/* The estimated count of key without adding. */
uint32_t kb_bloom_count(kb_bloom_t *self, const void *key, size_t len);

#endif
