/* Hash map from key bytes to row pointers, for one stripe of a table.
 *
 * Open addressing with linear probing; the map stores (hash, row) pairs side by side in one slot array (a
 * probe costs one cache line, not one per array) and compares keys through the rows themselves, so it owns
 * no key memory. Not thread-safe: the stripe's mutex guards it. */
#ifndef KB_ROWMAP_H
#define KB_ROWMAP_H

#include <stddef.h>
#include <stdint.h>

struct kb_row;

typedef struct {
    uint64_t hash;         /* 0 marks an empty slot (real hashes are forced nonzero) */
    struct kb_row *row;
} kb_rowmap_slot_t;

typedef struct {
    kb_rowmap_slot_t *slots; /* capacity */
    size_t capacity;         /* power of two, or 0 before the first insert */
    size_t count;
} kb_rowmap_t;

void kb_rowmap_init(kb_rowmap_t *map);
/* Frees the slot arrays (not the rows). */
void kb_rowmap_free(kb_rowmap_t *map);

/* Nonzero hash used by the map for key bytes. */
uint64_t kb_rowmap_hash(const void *key, size_t len);

/* The row with these key bytes, or NULL. hash must be kb_rowmap_hash(key, len). */
struct kb_row *kb_rowmap_find(const kb_rowmap_t *map, uint64_t hash, const void *key, size_t len);

/* Batch lookups hide memory latency by asking for the lines they will need a few keys ahead:
 * kb_rowmap_prefetch_slot fetches the home slot of hash; kb_rowmap_prefetch_row, once that slot is near,
 * fetches the first `bytes` bytes of the first row whose hash matches (no key is compared, nothing is
 * returned). */
void kb_rowmap_prefetch_slot(const kb_rowmap_t *map, uint64_t hash);
void kb_rowmap_prefetch_row(const kb_rowmap_t *map, uint64_t hash, size_t bytes);

/* Inserts a row whose key is not in the map yet (caller checked with find). Grows as needed. */
void kb_rowmap_insert(kb_rowmap_t *map, uint64_t hash, struct kb_row *row);

/* Removes the row with these key bytes; returns it, or NULL if absent. */
struct kb_row *kb_rowmap_remove(kb_rowmap_t *map, uint64_t hash, const void *key, size_t len);

#endif
