/* A table's row as it lies in memory. Private to the table's files (kb_table*.c, through
 * kb_table_internal.h) and its row map (kb_rowmap.c, which reads the key); the table's API (kb_table.h) hands
 * out copies, never a row. */
#ifndef KB_ROW_H
#define KB_ROW_H

#include <stdbool.h>
#include <stdint.h>

/* Links of a row in one of its stripe's intrusive doubly-linked lists. */
typedef struct {
    struct kb_row *prev, *next;
} kb_row_link_t;

/* One row. key, value and opt_state point into the row's own allocation, in that order after the struct.
 * The fields a lookup reads come first, so that they share the struct's first cache line. */
typedef struct kb_row {
    uint32_t key_len;
    uint32_t pending_count;
    uint8_t *key;
    float *value;            /* (dim) */
    uint64_t version;        /* put version, incremented by each applied update */
    uint64_t frequency;      /* lookups + gradient rows seen */
    int64_t updated_at_ms;   /* wall clock of the last change; 0 = never changed */
    bool dirty;              /* value or metadata changed: the whole row is written */
    bool frequency_dirty;    /* only the use count changed (a read): written in bulk, see take_frequencies */
    bool knn_dirty;          /* value changed since the index last saw it */
    bool evicted;            /* removed from the table; freed once its deletion is persisted */
    uint16_t stripe;         /* index of the row's stripe */
    bool cache_ref;          /* --cache-bytes: used since the eviction hand last passed (kb_cache.h) */
    int64_t id;              /* unique in the table, stable across restarts (nearest-neighbour ids) */
    uint64_t opt_steps;      /* optimizer steps taken (Adam bias correction) */
    float *opt_state;        /* (kb_optimizer_state_floats) */
    float *pending;          /* (max_pending, dim) while pending_count > 0, else NULL */
    int64_t pending_since_ms; /* monotonic time of the first pending gradient */
    kb_row_link_t pending_link;                 /* stripe's pending list, oldest first */
    struct kb_row *dirty_next;                  /* stripe's dirty list */
    kb_row_link_t lru_link;                     /* stripe's recency (LRU) or creation (oldest) order */
    kb_row_link_t frequency_link;               /* stripe's list of rows whose use count alone changed */
    uint64_t last_used;      /* table tick of the last use (LRU) or of creation (oldest-first) */
    uint8_t *record;         /* feature tables: packed carls.FeatureRecord (malloc'd) */
    uint32_t record_len;
    uint64_t cache_epoch;    /* --cache-bytes: the epoch the persister last collected the row in */
} kb_row_t;

#endif
