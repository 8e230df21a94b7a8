/* Hash map from key bytes to row pointers, for one stripe of a table.
 *
 * Open addressing with linear probing; the map stores (hash, row) pairs and compares keys through the rows
 * themselves, so it owns no key memory. Not thread-safe: the stripe's mutex guards it. */
#ifndef KB_ROWMAP_H
#define KB_ROWMAP_H

#include <stddef.h>
#include <stdint.h>

struct kb_row;

typedef struct {
    uint64_t *hashes;      /* capacity; 0 marks an empty slot (real hashes are forced nonzero) */
    struct kb_row **rows;  /* capacity */
    size_t capacity;       /* power of two, or 0 before the first insert */
    size_t count;
} kb_rowmap_t;

void kb_rowmap_init(kb_rowmap_t *map);
/* Frees the slot arrays (not the rows). */
void kb_rowmap_free(kb_rowmap_t *map);

/* Nonzero hash used by the map for key bytes. */
uint64_t kb_rowmap_hash(const void *key, size_t len);

/* The row with these key bytes, or NULL. hash must be kb_rowmap_hash(key, len). */
struct kb_row *kb_rowmap_find(const kb_rowmap_t *map, uint64_t hash, const void *key, size_t len);

/* Inserts a row whose key is not in the map yet (caller checked with find). Grows as needed. */
void kb_rowmap_insert(kb_rowmap_t *map, uint64_t hash, struct kb_row *row);

/* Removes the row with these key bytes; returns it, or NULL if absent. */
struct kb_row *kb_rowmap_remove(kb_rowmap_t *map, uint64_t hash, const void *key, size_t len);

#endif
