/* The table's state and the helpers its files share: kb_table.c (config, lifecycle, rows, operations, memory,
 * feature records), kb_table_knn.c (the nearest-neighbour index, candidate sampling) and kb_table_persist.c
 * (restore, dirty rows, scan, replay, apply_row, import, --cache-bytes). Private to the table: nothing outside
 * knowledge_bank/kb_table*.c includes it; the table's API is kb_table.h. */
#ifndef KB_TABLE_INTERNAL_H
#define KB_TABLE_INTERNAL_H

#include "kb_table.h"

#include "kb_bloom.h"
#include "kb_row.h"
#include "kb_rowmap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An intrusive list of rows, linked through the kb_row_link_t at a given offset in each row. */
typedef struct {
    kb_row_t *head, *tail;
} kb_table_row_list_t;

/* One of the table's KB_TABLE_STRIPES stripes: a lock and the rows whose hash falls in it. */
typedef struct {
    pthread_mutex_t mutex;
    kb_rowmap_t map;
    kb_table_row_list_t pending;           /* rows with pending gradients, oldest first */
    kb_row_t *dirty_head;                  /* rows changed since the last persist (and evicted rows) */
    kb_table_row_list_t frequency_dirty;   /* persisted rows whose use count alone changed (reads) */
    kb_table_row_list_t lru;               /* eviction order: head goes first */
    int64_t *knn_ids;                      /* rows whose index entry is stale (changed or evicted) */
    size_t knn_count, knn_capacity;
    size_t clock_pos;                      /* --cache-bytes: the eviction hand's slot in the map */
    float *pending_pool;                   /* applied pending buffers kept for reuse (kb_table_pending_take) */
    uint32_t pending_pooled;
    uint64_t cache_gen;                    /* --cache-bytes: rows that left memory (a read may be stale) */
} kb_stripe_t;

struct kb_table {
    int64_t id;
    char *name;
    kb_table_config_t cfg;
    uint32_t opt_floats;     /* optimizer state floats per row */
    atomic_int_fast64_t next_row_id;
    kb_stripe_t stripes[KB_TABLE_STRIPES];
    pthread_mutex_t id_mutex; /* guards by_id; taken inside a stripe lock, never the other way */
    kb_row_t **by_id;         /* row id -> row (ids are dense from 1), for answering knn with keys */
    size_t by_id_capacity;
    kb_knn_t *knn;            /* NULL without an index */
    pthread_mutex_t knn_mutex; /* one index flush at a time, so updates reach the index in order */
    kb_bloom_t *bloom;        /* ADMIT_BLOOM only */
    atomic_uint_fast64_t tick; /* use counter for eviction order */
    atomic_uint_fast64_t evict_rng; /* picks the stripes an eviction samples */
    pthread_mutex_t sample_mutex;   /* guards the sampling snapshots */
    struct kb_table_sample_cache *samplers[3]; /* per strategy */
    struct {
        atomic_uint_fast64_t rows, pending_keys, pending_gradients, gradients_received, gradients_applied,
            outliers_dropped, updates_applied, applied_on_lookup, applied_on_age, applied_on_count, lookups, puts,
            not_admitted, not_persisted, evictions;
    } stats;
    /* Memory estimate (kb_memory.h): every allocation the table makes is added here as malloc sizes it, and
     * passed on to the bank's accounting when one is attached. */
    atomic_int_fast64_t mem_bytes;
    kb_memory_t *mem;           /* the bank's accounting, or NULL; set once before the table is shared */
    int64_t knn_mem_counted;    /* the index's estimate as last added (under knn_mutex) */
    atomic_uint_fast64_t knn_query_ns[2]; /* kb_table_knn_query_ns: searches split to single queries, larger */
    atomic_bool read_only;      /* kb_table_set_read_only: pending gradients are never applied, reads count no
                                 * use (a follower's rows change only by its primary's records) */
    /* --cache-bytes (kb_cache.h): NULL when every row stays in memory. */
    kb_cache_t *cache;
    pthread_mutex_t cache_mutex; /* one eviction hand at a time; guards the fields below */
    int clock_stripe;            /* the stripe the hand visits next */
    bool cache_stuck;            /* the last shrink found nothing more to free ... */
    uint64_t stuck_compacted, stuck_loads; /* ... and nothing became clean since (compaction, loads) */
};

/* The rows' list links (kb_table_list_unlink, kb_table_list_append). */
#define PENDING_LINK offsetof(kb_row_t, pending_link)
#define LRU_LINK offsetof(kb_row_t, lru_link)
#define FREQUENCY_LINK offsetof(kb_row_t, frequency_link)

/* Adds delta bytes to the table's estimate and the bank's. */
void kb_table_mem(kb_table_t *self, int64_t delta);
/* A pending buffer for a row of stripe st (from the stripe's pool, or allocated and counted). */
float *kb_table_pending_take(kb_table_t *self, kb_stripe_t *st);
/* Frees a sampling snapshot (NULL: nothing). */
void kb_table_sample_cache_free(struct kb_table_sample_cache *c);
/* Frees a row block and its pending buffer, uncounting them. */
void kb_table_row_free(kb_table_t *self, kb_row_t *row);
/* Calls visit(row, ctx) for every row, each stripe locked while its rows are visited. */
void kb_table_each_row(kb_table_t *self, void (*visit)(kb_row_t *row, void *ctx), void *ctx);

/* Rows: kb_table_lock_key locks a key's stripe, kb_table_by_id_* take the id mutex, and the others run with
 * the row's stripe (st) locked. */
kb_stripe_t *kb_table_stripe(kb_table_t *self, uint64_t hash);
kb_stripe_t *kb_table_lock_key(kb_table_t *self, const ProtobufCBinaryData *key, uint64_t *hash);
void kb_table_map_insert(kb_table_t *self, kb_stripe_t *st, uint64_t hash, kb_row_t *row);
kb_row_t *kb_table_row_alloc(kb_table_t *self, const uint8_t *key, uint32_t key_len);
void kb_table_by_id_set(kb_table_t *self, int64_t id, kb_row_t *row);
kb_row_t *kb_table_by_id_get(kb_table_t *self, int64_t id);
kb_stripe_t *kb_table_by_id_stripe(kb_table_t *self, int64_t id);
void kb_table_knn_touch(kb_table_t *self, kb_stripe_t *st, kb_row_t *row);
void kb_table_list_unlink(kb_table_row_list_t *list, kb_row_t *row, size_t offset);
void kb_table_list_append(kb_table_row_list_t *list, kb_row_t *row, size_t offset);
void kb_table_mark_dirty(kb_stripe_t *st, kb_row_t *row);
void kb_table_row_changed(kb_table_t *self, kb_stripe_t *st, kb_row_t *row);
void kb_table_lru_touch(kb_table_t *self, kb_stripe_t *st, kb_row_t *row);
bool kb_table_persistable(const kb_table_t *self, const kb_row_t *row);
void kb_table_count_use(kb_table_t *self, kb_stripe_t *st, kb_row_t *row);
void kb_table_drop_pending(kb_table_t *self, kb_stripe_t *st, kb_row_t *row);
kb_row_t *kb_table_row_get(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key,
                           bool create);
kb_row_t *kb_table_row_new(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key,
                           bool create);
kb_row_t *kb_table_row_for_write(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key);

/* --cache-bytes: a key's stored row made resident with its stripe locked (NULL: none stored); or, for a
 * lookup's key found missing, read with no lock held, then its stripe locked (*locked) and its row returned. */
kb_row_t *kb_table_row_cold(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key);
kb_row_t *kb_table_row_fetch(kb_table_t *self, uint64_t hash, const ProtobufCBinaryData *key, bool create,
                             uint64_t gen, kb_stripe_t **locked);

#endif
