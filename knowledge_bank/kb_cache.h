/* Tables larger than memory (kb-server --cache-bytes): the state shared by the tables whose rows may leave
 * memory, and the rules that keep a row read back from storage correct.
 *
 * A row lives in its table's row map ("resident") or only in SQLite ("cold"). A lookup, put or push of a
 * key its table's map lacks reads the stored row (kb_store_read_row, on the cache's own read-only
 * connection) and makes it resident before serving it; a key with no stored row is new. That is correct
 * only if SQLite holds the newest state of every row that is not resident, so a row leaves memory only
 * when it is clean: not changed since the persister last collected it, no use count waiting to be written,
 * no pending gradients, persistable (admission), and the epoch it was last collected in is compacted into
 * SQLite (the journal alone is not read back). The bank reports both epochs here: the one being collected
 * (kb_cache_note_epoch) and the newest compacted one (kb_cache_set_compacted).
 *
 * Eviction is CLOCK (kb_table_cache_shrink): a use sets the row's reference bit, the hand clears it or, on
 * a clean row without it, frees the row. It runs when the tables' estimated memory goes over the budget,
 * after any operation that added rows and after every compaction (which makes rows clean), until the
 * estimate is back under 15/16 of the budget or nothing more is clean. Cache eviction never loses data;
 * it is not the EVICT_LRU admission policy, which deletes rows. */
#ifndef KB_CACHE_H
#define KB_CACHE_H

#include "kb_store.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_cache kb_cache_t;

typedef struct {
    uint64_t budget;        /* --cache-bytes */
    uint64_t resident;      /* estimated bytes of the cached tables (rows, maps, indexes) */
    uint64_t reads;         /* stored rows looked for (a key missing from memory) */
    uint64_t loads;         /* of those, rows found and made resident */
    uint64_t evictions;     /* rows that left memory */
} kb_cache_stats_t;

/* A cache of budget bytes reading cold rows through reader (owned by the cache from now on). */
kb_cache_t *kb_cache_new(uint64_t budget, kb_store_reader_t *reader);
void kb_cache_destroy(kb_cache_t **self_p);

/* The bank: the epoch its persister is collecting now, and the newest epoch compacted into SQLite. */
void kb_cache_note_epoch(kb_cache_t *self, uint64_t epoch);
void kb_cache_set_compacted(kb_cache_t *self, uint64_t epoch);
uint64_t kb_cache_collecting(const kb_cache_t *self);
uint64_t kb_cache_compacted(const kb_cache_t *self);

/* The tables: their estimate moved by delta bytes; whether it is over the budget, or over the level
 * eviction brings it down to. */
void kb_cache_add(kb_cache_t *self, int64_t delta);
bool kb_cache_over(const kb_cache_t *self);
bool kb_cache_over_target(const kb_cache_t *self);

/* Reads the stored row of (table_id, key): 1 with *out filled (kb_store_row_free), 0 when none. A read
 * that fails is retried; if it keeps failing the server stops (CARLS_FATAL) rather than answer a value it
 * could not read. */
int kb_cache_read(kb_cache_t *self, int64_t table_id, const uint8_t *key, uint32_t key_len, kb_store_row_t *out);

/* Up to limit stored rows of table_id after row id after_id, in id order, appended to *out (kb_store_row_free
 * each); failures as kb_cache_read. */
void kb_cache_read_after(kb_cache_t *self, int64_t table_id, int64_t after_id, size_t limit, kb_store_row_t **out,
                         size_t *count);

void kb_cache_count_eviction(kb_cache_t *self);
void kb_cache_get_stats(const kb_cache_t *self, kb_cache_stats_t *out);

#endif
