/* The table's rows to and from storage (the API is kb_table.h): restore, the dirty rows and use counts each
 * round takes, scan, read-only serving and journal replay, apply_row, import_rows, and tables larger than
 * memory (--cache-bytes, kb_cache.h), over the table's state in kb_table_internal.h. */
#include "kb_table.h"
#include "kb_table_internal.h"

#include "log.h"
#include "util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- persistence ---- */

/* Gives a row without pending gradients the stored (or imported) set of count gradients. The monotonic clock
 * does not survive a restart: the set's age starts now. Stripe locked. */
static void s_pending_load(kb_table_t *self, kb_stripe_t *st, kb_row_t *row, const float *pending, uint32_t count)
{
    row->pending = kb_table_pending_take(self, st);
    memcpy(row->pending, pending, (size_t)count * self->cfg.dim * sizeof(float));
    row->pending_count = count;
    row->pending_since_ms = carls_monotonic_ms();
    kb_table_list_append(&st->pending, row, PENDING_LINK);
    atomic_fetch_add(&self->stats.pending_keys, 1);
    atomic_fetch_add(&self->stats.pending_gradients, count);
}

/* Whether a stored row fits the table's config. */
static bool s_record_fits(const kb_table_t *self, const kb_store_row_t *rec)
{
    bool feature = self->cfg.kind == KB_TABLE_FEATURE;
    return !(rec->dim != self->cfg.dim || rec->opt_floats != self->opt_floats ||
             rec->pending_count > self->cfg.max_pending || rec->key_len == 0 || rec->row_id <= 0 ||
             (feature && rec->pending_count));
}

/* A stored row (which fits) made resident in stripe st: the row, in the map and the stripe's lists. */
static kb_row_t *s_row_restore(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const kb_store_row_t *rec)
{
    bool feature = self->cfg.kind == KB_TABLE_FEATURE;
    kb_row_t *row = kb_table_row_alloc(self, rec->key, rec->key_len);
    row->id = rec->row_id;
    row->stripe = (uint16_t)(st - self->stripes);
    row->version = rec->version;
    row->frequency = rec->frequency;
    row->opt_steps = rec->opt_steps;
    row->updated_at_ms = rec->updated_at_ms;
    if (rec->dim)
        memcpy(row->value, rec->value, (size_t)rec->dim * sizeof(float));
    if (rec->opt_floats)
        memcpy(row->opt_state, rec->opt_state, (size_t)rec->opt_floats * sizeof(float));
    if (feature) {
        row->record = carls_xmalloc(rec->record_len);
        kb_table_mem(self, (int64_t)kb_memory_chunk(rec->record_len));
        if (rec->record_len)
            memcpy(row->record, rec->record, rec->record_len);
        row->record_len = rec->record_len;
    }
    if (rec->pending_count > 0)
        s_pending_load(self, st, row, rec->pending, rec->pending_count);
    kb_table_map_insert(self, st, hash, row);
    kb_table_by_id_set(self, row->id, row);
    /* Use order is not persisted: after a restart rows count as used in creation (row id) order. */
    row->last_used = (uint64_t)row->id;
    if (row->last_used >= atomic_load(&self->tick))
        atomic_store(&self->tick, row->last_used + 1);
    kb_table_list_append(&st->lru, row, LRU_LINK);
    kb_table_knn_touch(self, st, row);
    return row;
}

int kb_table_restore_row(kb_table_t *self, const kb_store_row_t *rec)
{
    if (!s_record_fits(self, rec))
        return -1;
    uint64_t hash = kb_rowmap_hash(rec->key, rec->key_len);
    kb_stripe_t *st = kb_table_stripe(self, hash);
    if (kb_rowmap_find(&st->map, hash, rec->key, rec->key_len))
        return -1;
    kb_row_t *row = s_row_restore(self, st, hash, rec);
    atomic_fetch_add(&self->stats.rows, 1);
    if (!kb_table_persistable(self, row))
        atomic_fetch_add(&self->stats.not_persisted, 1);
    if (rec->row_id >= atomic_load(&self->next_row_id))
        atomic_store(&self->next_row_id, rec->row_id + 1);
    return 0;
}

static void s_snapshot_row(const kb_table_t *self, const kb_row_t *row, kb_store_row_t *rec)
{
    uint32_t dim = self->cfg.dim;
    memset(rec, 0, sizeof *rec);
    rec->table_id = self->id;
    rec->key = carls_xmalloc(row->key_len);
    memcpy(rec->key, row->key, row->key_len);
    rec->key_len = row->key_len;
    rec->row_id = row->id;
    rec->deleted = row->evicted;
    if (row->evicted)
        return;
    rec->dim = dim;
    if (dim) {
        rec->value = carls_xmalloc(dim * sizeof(float));
        memcpy(rec->value, row->value, dim * sizeof(float));
    }
    rec->opt_floats = self->opt_floats;
    if (self->opt_floats) {
        rec->opt_state = carls_xmalloc(self->opt_floats * sizeof(float));
        memcpy(rec->opt_state, row->opt_state, self->opt_floats * sizeof(float));
    }
    rec->opt_steps = row->opt_steps;
    rec->pending_count = row->pending_count;
    if (row->pending_count) {
        size_t bytes = (size_t)row->pending_count * dim * sizeof(float);
        rec->pending = carls_xmalloc(bytes);
        memcpy(rec->pending, row->pending, bytes);
    }
    if (self->cfg.kind == KB_TABLE_FEATURE) {
        rec->record = carls_xmalloc(row->record_len);
        if (row->record_len)
            memcpy(rec->record, row->record, row->record_len);
        rec->record_len = row->record_len;
    }
    rec->version = row->version;
    rec->updated_at_ms = row->updated_at_ms;
    rec->frequency = row->frequency;
}

static kb_store_row_t *s_grow_records(kb_store_row_t **out, size_t count, size_t *capacity)
{
    if (count == *capacity) {
        *capacity = *capacity ? *capacity * 2 : 256;
        *out = carls_xrealloc(*out, *capacity * sizeof **out);
    }
    return &(*out)[count];
}

void kb_table_take_dirty(kb_table_t *self, kb_store_row_t **out, size_t *count, size_t *capacity)
{
    uint64_t epoch = self->cache ? kb_cache_collecting(self->cache) : 0;
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        for (kb_row_t *row = st->dirty_head; row;) {
            kb_row_t *next = row->dirty_next;
            row->cache_epoch = epoch;
            row->dirty = false;
            row->dirty_next = NULL;
            /* Rows below the admission frequency stay in memory only; they are marked dirty again when
             * they reach it. */
            if (row->evicted || kb_table_persistable(self, row)) {
                s_snapshot_row(self, row, s_grow_records(out, *count, capacity));
                (*count)++;
            }
            if (row->evicted)
                kb_table_row_free(self, row);
            row = next;
        }
        st->dirty_head = NULL;
        pthread_mutex_unlock(&st->mutex);
    }
}

void kb_table_mark_pending_dirty(kb_table_t *self)
{
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        for (kb_row_t *row = st->pending.head; row; row = row->pending_link.next)
            kb_table_mark_dirty(st, row);
        pthread_mutex_unlock(&st->mutex);
    }
}

void kb_table_take_frequencies(kb_table_t *self, kb_store_row_t **out, size_t *count, size_t *capacity)
{
    uint64_t epoch = self->cache ? kb_cache_collecting(self->cache) : 0;
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        for (kb_row_t *row = st->frequency_dirty.head; row;) {
            kb_row_t *next = row->frequency_link.next;
            row->cache_epoch = epoch;
            kb_store_row_t *rec = s_grow_records(out, *count, capacity);
            *rec = (kb_store_row_t){.table_id = self->id,
                                    .key = carls_xmalloc(row->key_len),
                                    .key_len = row->key_len,
                                    .row_id = row->id,
                                    .frequency = row->frequency,
                                    .frequency_only = true};
            memcpy(rec->key, row->key, row->key_len);
            (*count)++;
            row->frequency_dirty = false;
            row->frequency_link.prev = row->frequency_link.next = NULL;
            row = next;
        }
        st->frequency_dirty.head = st->frequency_dirty.tail = NULL;
        pthread_mutex_unlock(&st->mutex);
    }
}

/* ---- scan ---- */

static int s_compare_ids(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int s_compare_records(const void *a, const void *b)
{
    return s_compare_ids(&((const kb_store_row_t *)a)->row_id, &((const kb_store_row_t *)b)->row_id);
}

/* kb_table_scan's passes: the ids after the cursor, then the rows up to the last id kept. */
typedef struct {
    const kb_table_t *self;
    int64_t after_id, last;
    int64_t *ids;
    size_t n, cap;
    kb_store_row_t **out;
    size_t count, capacity;
} s_scan_t;

static void s_scan_id(kb_row_t *row, void *ctx)
{
    s_scan_t *scan = ctx;
    if (row->id <= scan->after_id)
        return;
    if (scan->n == scan->cap) {
        scan->cap = scan->cap ? scan->cap * 2 : 1024;
        scan->ids = carls_xrealloc(scan->ids, scan->cap * sizeof *scan->ids);
    }
    scan->ids[scan->n++] = row->id;
}

static void s_scan_row(kb_row_t *row, void *ctx)
{
    s_scan_t *scan = ctx;
    if (row->id <= scan->after_id || row->id > scan->last)
        return;
    s_snapshot_row(scan->self, row, s_grow_records(scan->out, scan->count, &scan->capacity));
    scan->count++;
}

static size_t s_scan_cached(kb_table_t *self, int64_t after_id, size_t limit, kb_store_row_t **out, bool *done);

size_t kb_table_scan(kb_table_t *self, int64_t after_id, size_t limit, kb_store_row_t **out, bool *done)
{
    if (self->cache)
        return s_scan_cached(self, after_id, limit, out, done);
    /* Pass 1: the ids after the cursor; keep the smallest `limit`. */
    s_scan_t scan = {.self = self, .after_id = after_id, .out = out};
    kb_table_each_row(self, s_scan_id, &scan);
    size_t n = scan.n;
    if (n > 0) /* qsort's pointer must be valid even for zero elements */
        qsort(scan.ids, n, sizeof *scan.ids, s_compare_ids);
    *done = n <= limit;
    if (n > limit)
        n = limit;
    scan.last = n ? scan.ids[n - 1] : after_id;
    free(scan.ids);

    /* Pass 2: snapshot the rows in (after_id, last]; rows created since pass 1 get higher ids. */
    *out = NULL;
    if (n)
        kb_table_each_row(self, s_scan_row, &scan);
    const size_t count = scan.count;
    if (count > 0)
        qsort(*out, count, sizeof **out, s_compare_records);
    return count;
}

/* ---- read-only serving and journal replay into memory (kb-server --read-only) ---- */

void kb_table_set_read_only(kb_table_t *self, bool read_only)
{
    atomic_store_explicit(&self->read_only, read_only, memory_order_relaxed);
}

/* Takes a row out of a table that is not shared yet (start-up) and frees it. */
static void s_unload_row(kb_table_t *self, kb_stripe_t *st, uint64_t hash, kb_row_t *row)
{
    kb_rowmap_remove(&st->map, hash, row->key, row->key_len);
    kb_table_drop_pending(self, st, row);
    kb_table_list_unlink(&st->lru, row, LRU_LINK);
    kb_table_by_id_set(self, row->id, NULL);
    if (!kb_table_persistable(self, row))
        atomic_fetch_sub(&self->stats.not_persisted, 1);
    kb_table_knn_touch(self, st, row); /* an index flush finds no row for the id (or the row replacing it) */
    atomic_fetch_sub(&self->stats.rows, 1);
    kb_table_row_free(self, row);
}

/* Keeps the not_persisted gauge right after row's frequency was replaced by a stored one (replay, import):
 * was_persistable is kb_table_persistable before the change. */
static void s_count_persistable_change(kb_table_t *self, bool was_persistable, const kb_row_t *row)
{
    bool now_persistable = kb_table_persistable(self, row);
    if (was_persistable && !now_persistable)
        atomic_fetch_add(&self->stats.not_persisted, 1);
    else if (!was_persistable && now_persistable)
        atomic_fetch_sub(&self->stats.not_persisted, 1);
}

int kb_table_replay_row(kb_table_t *self, const kb_store_row_t *rec)
{
    if (rec->key_len == 0)
        return -1;
    uint64_t hash = kb_rowmap_hash(rec->key, rec->key_len);
    kb_stripe_t *st = kb_table_stripe(self, hash);
    kb_row_t *row = kb_rowmap_find(&st->map, hash, rec->key, rec->key_len);
    if (rec->frequency_only) {
        /* As the store's update: only the row of that row id (a count of an evicted row is dropped). */
        if (row && row->id == rec->row_id) {
            bool was_persistable = kb_table_persistable(self, row);
            row->frequency = rec->frequency;
            s_count_persistable_change(self, was_persistable, row);
        }
        return 0;
    }
    if (row)
        s_unload_row(self, st, hash, row);
    if (rec->deleted)
        return 0;
    return kb_table_restore_row(self, rec);
}

/* Whether a whole row from the network carries every buffer its counts promise, and a row id the by-id
 * index can hold (a record's CRC proves only that the sender meant it). */
static bool s_record_complete(const kb_table_t *self, const kb_store_row_t *rec)
{
    return (rec->dim == 0 || rec->value) && (rec->opt_floats == 0 || rec->opt_state) &&
           (rec->pending_count == 0 || rec->pending) &&
           (self->cfg.kind != KB_TABLE_FEATURE || rec->record_len == 0 || rec->record) &&
           rec->row_id > 0 && rec->row_id <= KB_TABLE_MAX_ROW_ID;
}

int kb_table_apply_row(kb_table_t *self, const kb_store_row_t *rec)
{
    if (rec->key_len == 0 || !rec->key || rec->row_id <= 0 || rec->row_id > KB_TABLE_MAX_ROW_ID ||
        (!rec->frequency_only && !rec->deleted && (!s_record_fits(self, rec) || !s_record_complete(self, rec))))
        return -1;
    uint64_t hash = kb_rowmap_hash(rec->key, rec->key_len);
    kb_stripe_t *st = kb_table_stripe(self, hash);
    pthread_mutex_lock(&st->mutex);
    kb_row_t *row = kb_rowmap_find(&st->map, hash, rec->key, rec->key_len);
    if (rec->frequency_only) {
        if (row && row->id == rec->row_id)
            row->frequency = rec->frequency; /* admission filters do not apply on a follower */
        pthread_mutex_unlock(&st->mutex);
        return 0;
    }
    /* A read-only table's rows are never dirty nor on the use-count list (kb_table_count_use), so taking one out
     * leaves no list pointing at it; readers find rows only under this stripe's mutex or through by_id,
     * which s_unload_row clears before it frees. */
    if (row)
        s_unload_row(self, st, hash, row);
    if (!rec->deleted) {
        row = s_row_restore(self, st, hash, rec);
        atomic_fetch_add(&self->stats.rows, 1);
        if (!kb_table_persistable(self, row))
            atomic_fetch_add(&self->stats.not_persisted, 1);
        int_fast64_t next = atomic_load(&self->next_row_id);
        while (rec->row_id >= next && !atomic_compare_exchange_weak(&self->next_row_id, &next, rec->row_id + 1)) {
        }
    }
    pthread_mutex_unlock(&st->mutex);
    return 0;
}

/* ---- import of rows with their whole state (import_rows) ---- */

void kb_table_import(kb_table_t *self, const kb_store_row_t *recs, size_t n)
{
    uint32_t dim = self->cfg.dim;
    bool feature = self->cfg.kind == KB_TABLE_FEATURE;
    for (size_t i = 0; i < n; i++) {
        const kb_store_row_t *rec = &recs[i];
        ProtobufCBinaryData key = {rec->key_len, rec->key};
        uint64_t hash;
        kb_stripe_t *st = kb_table_lock_key(self, &key, &hash);
        kb_row_t *row = kb_table_row_for_write(self, st, hash, &key);
        bool was_persistable = kb_table_persistable(self, row);
        if (dim)
            memcpy(row->value, rec->value, (size_t)dim * sizeof(float));
        if (self->opt_floats && rec->opt_floats == self->opt_floats)
            memcpy(row->opt_state, rec->opt_state, (size_t)self->opt_floats * sizeof(float));
        else if (self->opt_floats)
            kb_optimizer_state_init(&self->cfg.optimizer, row->opt_state, dim);
        row->opt_steps = rec->opt_steps;
        row->version = rec->version;
        row->updated_at_ms = rec->updated_at_ms;
        row->frequency = rec->frequency;
        /* The row's pending set becomes the imported one. */
        kb_table_drop_pending(self, st, row);
        if (rec->pending_count && !feature)
            s_pending_load(self, st, row, rec->pending, rec->pending_count);
        if (feature) {
            kb_table_mem(self, (int64_t)kb_memory_chunk(rec->record_len) -
                                   (row->record ? (int64_t)kb_memory_chunk(row->record_len) : 0));
            free(row->record);
            row->record = carls_xmalloc(rec->record_len ? rec->record_len : 1);
            if (rec->record_len)
                memcpy(row->record, rec->record, rec->record_len);
            row->record_len = rec->record_len;
        }
        s_count_persistable_change(self, was_persistable, row);
        kb_table_row_changed(self, st, row);
        pthread_mutex_unlock(&st->mutex);
    }
    atomic_fetch_add(&self->stats.puts, n);
}

/* ---- tables larger than memory (kb_cache.h) ---- */

bool kb_table_cacheable(const kb_table_config_t *cfg) { return !cfg->knn && cfg->eviction == KB_EVICT_NONE; }

void kb_table_set_cache(kb_table_t *self, kb_cache_t *cache)
{
    if (self->cache || !cache || !kb_table_cacheable(&self->cfg))
        return;
    self->cache = cache;
    kb_cache_add(cache, atomic_load(&self->mem_bytes));
}

bool kb_table_cached(const kb_table_t *self) { return self->cache != NULL; }

void kb_table_set_stored(kb_table_t *self, uint64_t rows, int64_t max_row_id)
{
    atomic_store(&self->stats.rows, rows);
    if (max_row_id >= atomic_load(&self->next_row_id))
        atomic_store(&self->next_row_id, max_row_id + 1);
}

/* A stored row made resident (ids and values as stored); NULL when the key has no stored row. */
static kb_row_t *s_row_from_store(kb_table_t *self, kb_stripe_t *st, uint64_t hash, kb_store_row_t *rec)
{
    kb_row_t *row = NULL;
    if (!s_record_fits(self, rec))
        LOG_WARN("table %s: a stored row does not match the table's config; treated as absent", self->name);
    else
        row = s_row_restore(self, st, hash, rec);
    if (row && rec->row_id >= atomic_load(&self->next_row_id))
        atomic_store(&self->next_row_id, rec->row_id + 1);
    return row;
}

/* With the stripe locked: the key's stored row made resident, or NULL when it has none. */
kb_row_t *kb_table_row_cold(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key)
{
    kb_store_row_t rec = {0};
    if (kb_cache_read(self->cache, self->id, key->data, (uint32_t)key->len, &rec) != 1)
        return NULL;
    kb_row_t *row = s_row_from_store(self, st, hash, &rec);
    kb_store_row_free(&rec);
    return row;
}

/* A lookup's key found missing from memory while its stripe had evicted `gen` rows: reads the stored row
 * with no lock held, then locks the stripe (*locked) and returns the key's row. Another thread may have
 * made it resident meanwhile (then that row is it), or made it resident, changed it and evicted it again
 * (the stripe's count moved: the read may be stale and is made again under the lock). */
kb_row_t *kb_table_row_fetch(kb_table_t *self, uint64_t hash, const ProtobufCBinaryData *key, bool create,
                             uint64_t gen, kb_stripe_t **locked)
{
    kb_store_row_t rec = {0};
    int found = kb_cache_read(self->cache, self->id, key->data, (uint32_t)key->len, &rec);
    kb_stripe_t *st = *locked = kb_table_stripe(self, hash);
    pthread_mutex_lock(&st->mutex);
    kb_row_t *row = kb_rowmap_find(&st->map, hash, key->data, key->len);
    if (row)
        kb_table_lru_touch(self, st, row);
    else if (st->cache_gen != gen)
        row = kb_table_row_get(self, st, hash, key, create);
    else if (found)
        row = s_row_from_store(self, st, hash, &rec);
    else
        row = kb_table_row_new(self, st, hash, key, create);
    if (found)
        kb_store_row_free(&rec);
    return row;
}

/* Whether a row may leave memory: SQLite holds its newest state (kb_cache.h), but for a use count
 * changed by reads since the last bulk write of counts: that increment is dropped (counts are statistics;
 * pinning every row a read touches until the next write of counts would let reads fill memory). */
static bool s_row_clean(const kb_table_t *self, const kb_row_t *row, uint64_t compacted)
{
    return !row->dirty && row->pending_count == 0 && !row->knn_dirty && !row->evicted &&
           row->cache_epoch <= compacted && kb_table_persistable(self, row);
}

/* Frees a clean row; it lives on in storage. Stripe locked. */
static void s_cache_evict(kb_table_t *self, kb_stripe_t *st, kb_row_t *row, uint64_t hash)
{
    kb_rowmap_remove(&st->map, hash, row->key, row->key_len);
    kb_table_list_unlink(&st->lru, row, LRU_LINK);
    if (row->frequency_dirty)
        kb_table_list_unlink(&st->frequency_dirty, row, FREQUENCY_LINK);
    kb_table_by_id_set(self, row->id, NULL);
    st->cache_gen++;
    kb_table_row_free(self, row);
    kb_cache_count_eviction(self->cache);
}

void kb_table_cache_shrink(kb_table_t *self)
{
    if (!self->cache || !kb_cache_over(self->cache) || pthread_mutex_trylock(&self->cache_mutex) != 0)
        return;
    uint64_t compacted = kb_cache_compacted(self->cache);
    kb_cache_stats_t cs;
    kb_cache_get_stats(self->cache, &cs);
    /* Nothing became clean since a shrink found nothing to free: do not sweep every row again. */
    if (self->cache_stuck && self->stuck_compacted == compacted && self->stuck_loads == cs.loads) {
        pthread_mutex_unlock(&self->cache_mutex);
        return;
    }
    /* The hand visits each stripe in turn and sweeps it until the cache is under its target; after two
     * turns over every stripe (the first may only clear reference bits) whatever is left is not clean. */
    for (int visit = 0; visit <= 2 * KB_TABLE_STRIPES && kb_cache_over_target(self->cache); visit++) {
        kb_stripe_t *st = &self->stripes[self->clock_stripe];
        self->clock_stripe = (self->clock_stripe + 1) % KB_TABLE_STRIPES;
        pthread_mutex_lock(&st->mutex);
        size_t cap = st->map.capacity;
        for (size_t k = 0; k < cap && kb_cache_over_target(self->cache); k++) {
            size_t j = st->clock_pos & (cap - 1);
            kb_rowmap_slot_t *slot = &st->map.slots[j];
            if (slot->hash) {
                kb_row_t *row = slot->row;
                bool referenced = row->cache_ref;
                row->cache_ref = false;
                if (!referenced && s_row_clean(self, row, compacted)) {
                    /* The map moves a later row into this slot: look at the slot again. */
                    s_cache_evict(self, st, row, slot->hash);
                    continue;
                }
            }
            st->clock_pos = j + 1;
        }
        pthread_mutex_unlock(&st->mutex);
    }
    self->cache_stuck = kb_cache_over_target(self->cache);
    self->stuck_compacted = compacted;
    self->stuck_loads = cs.loads;
    pthread_mutex_unlock(&self->cache_mutex);
}

/* Whether the sorted records [0, n) hold one with this row id. */
static bool s_records_have(const kb_store_row_t *records, size_t n, int64_t id)
{
    kb_store_row_t probe = {.row_id = id};
    return n && bsearch(&probe, records, n, sizeof *records, s_compare_records) != NULL;
}

/* kb_table_scan of a cached table: the stored rows merged with the resident ones, which are newer where
 * both hold a row. The hand is held (no row leaves memory during the page), so every row after the cursor
 * is resident or stored throughout. The stored rows cost a pass over the table's rows in SQLite. */
static size_t s_scan_cached(kb_table_t *self, int64_t after_id, size_t limit, kb_store_row_t **out, bool *done)
{
    pthread_mutex_lock(&self->cache_mutex);
    s_scan_t scan = {.self = self, .after_id = after_id, .out = out};
    kb_table_each_row(self, s_scan_id, &scan);
    if (scan.n > 0)
        qsort(scan.ids, scan.n, sizeof *scan.ids, s_compare_ids);
    kb_store_row_t *stored = NULL;
    size_t ns = 0;
    kb_cache_read_after(self->cache, self->id, after_id, limit, &stored, &ns);
    /* The page ends at the limit-th id of the two sorted lists together (an id in both counts once). */
    size_t a = 0, b = 0, taken = 0;
    int64_t last = after_id;
    while (taken < limit && (a < scan.n || b < ns)) {
        if (b == ns || (a < scan.n && scan.ids[a] <= stored[b].row_id)) {
            last = scan.ids[a++];
            if (b < ns && stored[b].row_id == last)
                b++;
        } else {
            last = stored[b++].row_id;
        }
        taken++;
    }
    *done = a == scan.n && b == ns && ns < limit;
    free(scan.ids);
    /* The resident rows of the page, then the stored ones that are not resident. */
    *out = NULL;
    scan.last = last;
    if (taken)
        kb_table_each_row(self, s_scan_row, &scan);
    size_t resident = scan.count;
    if (resident > 0)
        qsort(*out, resident, sizeof **out, s_compare_records);
    for (size_t i = 0; i < ns; i++) {
        if (stored[i].row_id <= last && !s_records_have(*out, resident, stored[i].row_id)) {
            *s_grow_records(out, scan.count, &scan.capacity) = stored[i];
            scan.count++;
        } else {
            kb_store_row_free(&stored[i]);
        }
    }
    free(stored);
    if (scan.count > 0)
        qsort(*out, scan.count, sizeof **out, s_compare_records);
    pthread_mutex_unlock(&self->cache_mutex);
    return scan.count;
}
