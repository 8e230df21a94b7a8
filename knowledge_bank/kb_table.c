#include "kb_table.h"
#include "kb_table_internal.h"

#include "kb_bloom.h"
#include "kb_memory.h"
#include "kb_rowmap.h"
#include "log.h"
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Defaults of fields left zero (kb_table_config_finish; documented for the wire in proto/carls.proto and
 * docs/PROTOCOL.md). */
#define DEFAULT_INIT_SCALE 0.05f
#define DEFAULT_MAX_AGE_MS 1000u
#define DEFAULT_MAX_PENDING 16u
#define DEFAULT_OUTLIER_THRESHOLD 3.0f
#define DEFAULT_OUTLIER_MIN_COUNT 3u
#define DEFAULT_MIN_FREQUENCY 2u
#define DEFAULT_BLOOM_BITS_LOG2 20u
#define DEFAULT_BLOOM_HASHES 4u
/* A pending set holds max_pending * dim floats per key: keep it bounded (16 MiB). */
#define MAX_PENDING_FLOATS (4u << 20)

/* Whether the table is read-only now (a follower's tables are, until it is promoted). */
static inline bool s_read_only(const kb_table_t *self)
{
    return atomic_load_explicit(&self->read_only, memory_order_relaxed);
}

/* Adds delta bytes to the table's estimate and the bank's. */
void kb_table_mem(kb_table_t *self, int64_t delta)
{
    atomic_fetch_add(&self->mem_bytes, delta);
    kb_memory_add(self->mem, delta);
    if (self->cache)
        kb_cache_add(self->cache, delta);
}

/* Heap bytes of one row block (struct, value, optimizer state, key) and of one pending gradient buffer. */
static int64_t s_row_bytes(const kb_table_t *self, uint32_t key_len)
{
    return (int64_t)kb_memory_chunk(sizeof(kb_row_t) + (((size_t)key_len + 15u) & ~(size_t)15u) +
                                    ((size_t)self->cfg.dim + self->opt_floats) * sizeof(float));
}

/* A pending buffer's size: room for max_pending gradients, and for the pool's link (s_pending_give). */
static size_t s_pending_size(const kb_table_t *self)
{
    size_t bytes = (size_t)self->cfg.max_pending * self->cfg.dim * sizeof(float);
    return bytes < sizeof(float *) ? sizeof(float *) : bytes;
}

static int64_t s_pending_bytes(const kb_table_t *self) { return (int64_t)kb_memory_chunk(s_pending_size(self)); }

/* Each stripe keeps up to this many bytes of applied pending buffers for the next key that needs one. Under a
 * push load keys fill and empty their sets all the time; reusing a buffer that was just averaged spares
 * malloc's search and a buffer that is still in cache. Pooled buffers stay counted in the estimate. */
#define S_PENDING_POOL_BYTES (64u << 10)

/* Takes the stripe's most recently pooled buffer (NULL: none). Each pooled buffer holds the next one's
 * address in its first bytes. */
static float *s_pool_pop(kb_stripe_t *st)
{
    float *buf = st->pending_pool;
    if (buf) {
        memcpy(&st->pending_pool, buf, sizeof buf);
        st->pending_pooled--;
    }
    return buf;
}

float *kb_table_pending_take(kb_table_t *self, kb_stripe_t *st)
{
    float *buf = s_pool_pop(st);
    if (buf)
        return buf;
    kb_table_mem(self, s_pending_bytes(self));
    return carls_xmalloc(s_pending_size(self));
}

static void s_pending_give(kb_table_t *self, kb_stripe_t *st, float *buf)
{
    if ((size_t)(st->pending_pooled + 1) * s_pending_size(self) <= S_PENDING_POOL_BYTES) {
        memcpy(buf, &st->pending_pool, sizeof buf);
        st->pending_pool = buf;
        st->pending_pooled++;
        return;
    }
    free(buf);
    kb_table_mem(self, -s_pending_bytes(self));
}

/* The row map's two slot arrays at a capacity. */
static int64_t s_map_bytes(size_t capacity)
{
    return capacity ? (int64_t)kb_memory_chunk(capacity * sizeof(kb_rowmap_slot_t)) : 0;
}

/* ---- config ---- */

/* The kb_knn config (spec, metric, dim, search settings) of a table config; kc->spec points into cfg. */
static void s_knn_config(const kb_table_config_t *cfg, kb_knn_config_t *kc)
{
    kb_knn_config_default(kc);
    kc->spec = cfg->knn_spec;
    kc->metric = cfg->knn_metric;
    kc->dim = cfg->dim;
    kc->nprobe = cfg->knn_nprobe;
    kc->ef_search = cfg->knn_ef_search;
}

/* Admission and eviction, shared by both table kinds: defaults, ranges, and the fields of a policy not in
 * use cleared. */
static int s_config_memory_policies(kb_table_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->admission == KB_ADMIT_ALL) {
        cfg->min_frequency = 0;
    } else {
        if (!cfg->min_frequency)
            cfg->min_frequency = DEFAULT_MIN_FREQUENCY;
        if (cfg->min_frequency > 255) {
            snprintf(err, errlen, "admission min_frequency must be at most 255");
            return -1;
        }
    }
    if (cfg->admission == KB_ADMIT_BLOOM) {
        if (!cfg->bloom_bits_log2)
            cfg->bloom_bits_log2 = DEFAULT_BLOOM_BITS_LOG2;
        if (!cfg->bloom_hashes)
            cfg->bloom_hashes = DEFAULT_BLOOM_HASHES;
        if (cfg->bloom_bits_log2 < 4 || cfg->bloom_bits_log2 > 30 || cfg->bloom_hashes > 16) {
            snprintf(err, errlen, "bloom_bits_log2 must be in 4..30 and bloom_hashes in 1..16");
            return -1;
        }
    } else {
        cfg->bloom_bits_log2 = cfg->bloom_hashes = 0;
    }
    if (cfg->eviction == KB_EVICT_NONE) {
        cfg->max_rows = 0;
    } else if (cfg->max_rows == 0) {
        snprintf(err, errlen, "eviction needs max_rows > 0");
        return -1;
    }
    return 0;
}

/* A feature table keeps its memory policies; every embedding field takes its fixed value. */
static int s_config_finish_feature(kb_table_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->dim != 0 || cfg->knn) {
        snprintf(err, errlen, "feature tables take no dim and no knn index");
        return -1;
    }
    kb_table_config_t f;
    memset(&f, 0, sizeof f); /* padding too: configs are compared with memcmp */
    f.kind = KB_TABLE_FEATURE;
    f.max_pending = 1;
    f.max_age_ms = DEFAULT_MAX_AGE_MS;
    kb_optimizer_config_defaults(&f.optimizer);
    f.admission = cfg->admission;
    f.min_frequency = cfg->min_frequency;
    f.bloom_bits_log2 = cfg->bloom_bits_log2;
    f.bloom_hashes = cfg->bloom_hashes;
    f.eviction = cfg->eviction;
    f.max_rows = cfg->max_rows;
    *cfg = f;
    return s_config_memory_policies(cfg, err, errlen);
}

int kb_table_config_finish(kb_table_config_t *cfg, uint32_t max_dim, char *err, size_t errlen)
{
    if (cfg->kind == KB_TABLE_FEATURE)
        return s_config_finish_feature(cfg, err, errlen);
    if (cfg->dim == 0 || cfg->dim > max_dim) {
        snprintf(err, errlen, "dim must be in 1..%u, got %u", max_dim, cfg->dim);
        return -1;
    }
    if (cfg->init_scale == 0.0f)
        cfg->init_scale = DEFAULT_INIT_SCALE;
    if (!isfinite(cfg->init_scale) || cfg->init_scale < 0.0f) {
        snprintf(err, errlen, "init_scale must be finite and >= 0");
        return -1;
    }
    kb_optimizer_config_defaults(&cfg->optimizer);
    if (kb_optimizer_config_validate(&cfg->optimizer, err, errlen) != 0)
        return -1;
    if (!cfg->max_age_ms)
        cfg->max_age_ms = DEFAULT_MAX_AGE_MS;
    if (!cfg->max_pending)
        cfg->max_pending = DEFAULT_MAX_PENDING;
    if (cfg->max_pending > KB_TABLE_MAX_PENDING) {
        snprintf(err, errlen, "max_pending must be in 1..%u, got %u", KB_TABLE_MAX_PENDING, cfg->max_pending);
        return -1;
    }
    if (cfg->outlier.threshold == 0.0f)
        cfg->outlier.threshold = DEFAULT_OUTLIER_THRESHOLD;
    if (!isfinite(cfg->outlier.threshold) || cfg->outlier.threshold < 1.0f) {
        snprintf(err, errlen, "outlier_threshold must be finite and >= 1");
        return -1;
    }
    if (!cfg->outlier.min_count)
        cfg->outlier.min_count = DEFAULT_OUTLIER_MIN_COUNT;
    if ((uint64_t)cfg->max_pending * cfg->dim > MAX_PENDING_FLOATS) {
        snprintf(err, errlen, "max_pending * dim must be at most %u floats", MAX_PENDING_FLOATS);
        return -1;
    }
    if (!cfg->knn) {
        memset(cfg->knn_spec, 0, sizeof cfg->knn_spec);
        cfg->knn_metric = KB_KNN_METRIC_IP;
        cfg->knn_nprobe = cfg->knn_ef_search = 0;
    } else {
        if (!memchr(cfg->knn_spec, '\0', sizeof cfg->knn_spec)) {
            snprintf(err, errlen, "knn spec longer than %d characters", KB_KNN_SPEC_MAX - 1);
            return -1;
        }
        /* Let FAISS judge the spec now, so a bad one is refused at create time with its reason. */
        kb_knn_t *probe = NULL;
        kb_knn_config_t kc;
        s_knn_config(cfg, &kc);
        kc.background = false;
        char why[200] = "";
        if (kb_knn_new(&kc, &probe, why, sizeof why) != 0) {
            snprintf(err, errlen, "knn spec '%s': %s", cfg->knn_spec, why);
            return -1;
        }
        kb_knn_destroy(&probe);
    }
    return s_config_memory_policies(cfg, err, errlen);
}

/* ---- lifecycle ---- */

kb_table_t *kb_table_new(int64_t id, const char *name, const kb_table_config_t *cfg)
{
    kb_table_t *self = carls_xcalloc(1, sizeof *self);
    self->id = id;
    self->name = strdup(name);
    if (!self->name)
        CARLS_FATAL("out of memory");
    self->cfg = *cfg;
    self->opt_floats = cfg->kind == KB_TABLE_EMBEDDING ? kb_optimizer_state_floats(cfg->optimizer.kind, cfg->dim) : 0;
    atomic_init(&self->next_row_id, 1);
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        pthread_mutex_init(&self->stripes[i].mutex, NULL);
        kb_rowmap_init(&self->stripes[i].map);
    }
    pthread_mutex_init(&self->id_mutex, NULL);
    pthread_mutex_init(&self->knn_mutex, NULL);
    pthread_mutex_init(&self->sample_mutex, NULL);
    pthread_mutex_init(&self->cache_mutex, NULL);
    if (cfg->knn) {
        kb_knn_config_t kc;
        s_knn_config(cfg, &kc);
        char err[200] = "";
        /* The spec was accepted when the config was validated; a failure now leaves the table without an
         * index (knn answers ENOTSUP) rather than losing its rows. */
        if (kb_knn_new(&kc, &self->knn, err, sizeof err) != 0)
            LOG_ERROR("table %s: knn index '%s' not created: %s", name, cfg->knn_spec, err);
    }
    if (cfg->admission == KB_ADMIT_BLOOM)
        self->bloom = kb_bloom_new(cfg->bloom_bits_log2, cfg->bloom_hashes);
    atomic_init(&self->mem_bytes, (int64_t)kb_table_base_bytes(cfg) + (int64_t)kb_memory_chunk(strlen(name) + 1));
    if (self->knn) {
        /* The empty index (a FAISS object) is in the base estimate; its growth is counted by s_knn_account. */
        self->knn_mem_counted = (int64_t)kb_knn_memory(self->knn);
        atomic_fetch_add(&self->mem_bytes, self->knn_mem_counted);
    }
    return self;
}

uint64_t kb_table_base_bytes(const kb_table_config_t *cfg)
{
    uint64_t bytes = kb_memory_chunk(sizeof(kb_table_t));
    if (cfg->admission == KB_ADMIT_BLOOM)
        bytes += kb_memory_chunk((size_t)1 << cfg->bloom_bits_log2) + 64;
    return bytes;
}

void kb_table_set_memory(kb_table_t *self, kb_memory_t *mem)
{
    if (self->mem == mem)
        return;
    kb_memory_add(self->mem, -(int64_t)atomic_load(&self->mem_bytes));
    self->mem = mem;
    kb_memory_add(mem, atomic_load(&self->mem_bytes));
}

uint64_t kb_table_memory(kb_table_t *self)
{
    int64_t v = atomic_load(&self->mem_bytes);
    return v > 0 ? (uint64_t)v : 0;
}

void kb_table_row_free(kb_table_t *self, kb_row_t *row)
{
    if (!row)
        return;
    int64_t bytes = s_row_bytes(self, row->key_len);
    if (row->pending)
        bytes += s_pending_bytes(self);
    if (row->record)
        bytes += (int64_t)kb_memory_chunk(row->record_len);
    kb_table_mem(self, -bytes);
    free(row->pending);
    free(row->record);
    free(row);
}

void kb_table_destroy(kb_table_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_table_t *self = *self_p;
    kb_knn_destroy(&self->knn);
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        /* Evicted rows live only on the dirty list until their deletion is persisted. */
        for (kb_row_t *row = st->dirty_head; row;) {
            kb_row_t *next = row->dirty_next;
            if (row->evicted)
                kb_table_row_free(self, row);
            row = next;
        }
        for (size_t j = 0; j < st->map.capacity; j++)
            if (st->map.slots[j].hash)
                kb_table_row_free(self, st->map.slots[j].row);
        kb_rowmap_free(&st->map);
        for (float *buf; (buf = s_pool_pop(st)) != NULL;)
            free(buf);
        free(st->knn_ids);
        pthread_mutex_destroy(&st->mutex);
    }
    pthread_mutex_destroy(&self->id_mutex);
    pthread_mutex_destroy(&self->knn_mutex);
    pthread_mutex_destroy(&self->sample_mutex);
    pthread_mutex_destroy(&self->cache_mutex);
    for (int i = 0; i < 3; i++)
        kb_table_sample_cache_free(self->samplers[i]);
    kb_bloom_destroy(&self->bloom);
    free(self->by_id);
    free(self->name);
    /* What is left of the estimate (maps, index, snapshots, the struct) goes with the table. */
    kb_memory_add(self->mem, -(int64_t)atomic_load(&self->mem_bytes));
    if (self->cache)
        kb_cache_add(self->cache, -(int64_t)atomic_load(&self->mem_bytes));
    free(self);
    *self_p = NULL;
}

int64_t kb_table_id(const kb_table_t *self) { return self->id; }
const char *kb_table_name(const kb_table_t *self) { return self->name; }
const kb_table_config_t *kb_table_config(const kb_table_t *self) { return &self->cfg; }

size_t kb_table_row_count(kb_table_t *self) { return (size_t)atomic_load(&self->stats.rows); }

void kb_table_get_stats(kb_table_t *self, kb_table_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->rows = atomic_load(&self->stats.rows);
    out->pending_keys = atomic_load(&self->stats.pending_keys);
    out->pending_gradients = atomic_load(&self->stats.pending_gradients);
    out->gradients_received = atomic_load(&self->stats.gradients_received);
    out->gradients_applied = atomic_load(&self->stats.gradients_applied);
    out->outliers_dropped = atomic_load(&self->stats.outliers_dropped);
    out->updates_applied = atomic_load(&self->stats.updates_applied);
    out->applied_on_lookup = atomic_load(&self->stats.applied_on_lookup);
    out->applied_on_age = atomic_load(&self->stats.applied_on_age);
    out->applied_on_count = atomic_load(&self->stats.applied_on_count);
    out->lookups = atomic_load(&self->stats.lookups);
    out->puts = atomic_load(&self->stats.puts);
    out->not_admitted = atomic_load(&self->stats.not_admitted);
    out->not_persisted = atomic_load(&self->stats.not_persisted);
    out->evictions = atomic_load(&self->stats.evictions);
    if (self->knn)
        kb_knn_get_stats(self->knn, &out->knn);
}

/* ---- rows (all s_row_*, kb_table_row_* and list helpers run with the row's stripe locked) ---- */

/* The row map uses the low bits of the hash; pick the stripe from the high bits so both stay uniform. */
static uint32_t s_stripe_index(uint64_t hash) { return (uint32_t)((hash >> 58) % KB_TABLE_STRIPES); }

kb_stripe_t *kb_table_stripe(kb_table_t *self, uint64_t hash)
{
    return &self->stripes[s_stripe_index(hash)];
}

/* Locks the stripe that holds key (batch operations lock one key's stripe at a time) and returns it, with
 * the key's hash in *hash. */
kb_stripe_t *kb_table_lock_key(kb_table_t *self, const ProtobufCBinaryData *key, uint64_t *hash)
{
    *hash = kb_rowmap_hash(key->data, key->len);
    kb_stripe_t *st = kb_table_stripe(self, *hash);
    pthread_mutex_lock(&st->mutex);
    return st;
}

/* The keys of one batch request grouped by stripe, so that each stripe is locked once and, inside it, the
 * slots and rows of the group's keys are fetched from memory together instead of one miss after another
 * (a lookup of 256 random keys spent most of its time waiting on those misses). Keys keep their request
 * order within a stripe, so a key named twice is served in order as before. */
#define S_GROUP_INLINE 512

typedef struct {
    uint64_t *hashes; /* per key index */
    uint32_t *order;  /* key indexes, stripe by stripe */
    uint32_t starts[KB_TABLE_STRIPES + 1];
    uint64_t hash_buf[S_GROUP_INLINE];
    uint32_t order_buf[S_GROUP_INLINE];
} s_groups_t;

static void s_groups_make(s_groups_t *g, const ProtobufCBinaryData *keys, size_t n)
{
    g->hashes = n <= S_GROUP_INLINE ? g->hash_buf : carls_xmalloc(n * sizeof *g->hashes);
    g->order = n <= S_GROUP_INLINE ? g->order_buf : carls_xmalloc(n * sizeof *g->order);
    uint32_t next[KB_TABLE_STRIPES] = {0};
    for (size_t i = 0; i < n; i++) {
        g->hashes[i] = kb_rowmap_hash(keys[i].data, keys[i].len);
        next[s_stripe_index(g->hashes[i])]++;
    }
    uint32_t at = 0;
    for (int s = 0; s < KB_TABLE_STRIPES; s++) {
        g->starts[s] = at;
        at += next[s];
        next[s] = g->starts[s];
    }
    g->starts[KB_TABLE_STRIPES] = at;
    for (size_t i = 0; i < n; i++)
        g->order[next[s_stripe_index(g->hashes[i])]++] = (uint32_t)i;
}

static void s_groups_free(s_groups_t *g)
{
    if (g->hashes != g->hash_buf)
        free(g->hashes);
    if (g->order != g->order_buf)
        free(g->order);
}

/* The end of a batch write (put, push) of n keys: its groups freed, n added to its counter and, with
 * --cache-bytes, the rows it brought in trimmed back to the bound. */
static void s_write_done(kb_table_t *self, s_groups_t *g, atomic_uint_fast64_t *counter, size_t n)
{
    s_groups_free(g);
    atomic_fetch_add(counter, n);
    if (self->cache)
        kb_table_cache_shrink(self);
}

/* Locks stripe s and starts fetching what its keys need; NULL (nothing locked) when it has none. */
static kb_stripe_t *s_group_lock(kb_table_t *self, const s_groups_t *g, int s)
{
    uint32_t begin = g->starts[s], end = g->starts[s + 1];
    if (begin == end)
        return NULL;
    kb_stripe_t *st = &self->stripes[s];
    pthread_mutex_lock(&st->mutex);
    for (uint32_t j = begin; j < end; j++)
        kb_rowmap_prefetch_slot(&st->map, g->hashes[g->order[j]]);
    /* The struct, the key and the value: what a lookup reads (keys are mostly short; a longer one costs a
     * miss of its own). */
    size_t bytes = sizeof(kb_row_t) + 16 + (size_t)self->cfg.dim * sizeof(float);
    for (uint32_t j = begin; j < end; j++)
        kb_rowmap_prefetch_row(&st->map, g->hashes[g->order[j]], bytes);
    return st;
}

/* Inserts a row into its stripe's map, counting the map's growth. */
void kb_table_map_insert(kb_table_t *self, kb_stripe_t *st, uint64_t hash, kb_row_t *row)
{
    size_t before = st->map.capacity;
    kb_rowmap_insert(&st->map, hash, row);
    if (st->map.capacity != before)
        kb_table_mem(self, s_map_bytes(st->map.capacity) - s_map_bytes(before));
}

/* Allocates a row: one block holding the struct, value, optimizer state and key. */
kb_row_t *kb_table_row_alloc(kb_table_t *self, const uint8_t *key, uint32_t key_len)
{
    /* The key right after the struct and the value right after the key (16-byte aligned): a lookup's key
     * compare and the start of its value copy share a cache line. */
    size_t floats = (size_t)self->cfg.dim + self->opt_floats;
    size_t key_space = (key_len + 15u) & ~(size_t)15u;
    kb_row_t *row = carls_xcalloc(1, sizeof *row + key_space + floats * sizeof(float));
    kb_table_mem(self, s_row_bytes(self, key_len));
    row->key = (uint8_t *)(row + 1);
    row->value = (float *)(row->key + key_space);
    row->opt_state = row->value + self->cfg.dim;
    row->key_len = key_len;
    if (key_len)
        memcpy(row->key, key, key_len);
    return row;
}

void kb_table_by_id_set(kb_table_t *self, int64_t id, kb_row_t *row)
{
    pthread_mutex_lock(&self->id_mutex);
    if ((size_t)id >= self->by_id_capacity) {
        size_t cap = self->by_id_capacity ? self->by_id_capacity : 1024;
        while (cap <= (size_t)id)
            cap *= 2;
        self->by_id = carls_xrealloc(self->by_id, cap * sizeof *self->by_id);
        kb_table_mem(self, (int64_t)kb_memory_chunk(cap * sizeof *self->by_id) -
                               (self->by_id_capacity
                                    ? (int64_t)kb_memory_chunk(self->by_id_capacity * sizeof *self->by_id)
                                    : 0));
        memset(self->by_id + self->by_id_capacity, 0, (cap - self->by_id_capacity) * sizeof *self->by_id);
        self->by_id_capacity = cap;
    }
    self->by_id[id] = row;
    pthread_mutex_unlock(&self->id_mutex);
}

/* The row with this id or NULL. Only dereference it with the row's stripe locked. */
kb_row_t *kb_table_by_id_get(kb_table_t *self, int64_t id)
{
    pthread_mutex_lock(&self->id_mutex);
    kb_row_t *row = id >= 0 && (size_t)id < self->by_id_capacity ? self->by_id[id] : NULL;
    pthread_mutex_unlock(&self->id_mutex);
    return row;
}

/* The stripe of the row with this id, or NULL. A row is alive while it is in by_id (eviction takes it out
 * before the row can be freed), so reading its stripe under id_mutex is safe. */
kb_stripe_t *kb_table_by_id_stripe(kb_table_t *self, int64_t id)
{
    pthread_mutex_lock(&self->id_mutex);
    kb_row_t *row = id >= 0 && (size_t)id < self->by_id_capacity ? self->by_id[id] : NULL;
    kb_stripe_t *st = row ? &self->stripes[row->stripe] : NULL;
    pthread_mutex_unlock(&self->id_mutex);
    return st;
}

void kb_table_knn_touch(kb_table_t *self, kb_stripe_t *st, kb_row_t *row)
{
    if (!self->knn || row->knn_dirty)
        return;
    row->knn_dirty = true;
    if (st->knn_count == st->knn_capacity) {
        int64_t old = st->knn_capacity ? (int64_t)kb_memory_chunk(st->knn_capacity * sizeof *st->knn_ids) : 0;
        st->knn_capacity = st->knn_capacity ? st->knn_capacity * 2 : 64;
        st->knn_ids = carls_xrealloc(st->knn_ids, st->knn_capacity * sizeof *st->knn_ids);
        kb_table_mem(self, (int64_t)kb_memory_chunk(st->knn_capacity * sizeof *st->knn_ids) - old);
    }
    st->knn_ids[st->knn_count++] = row->id;
}

static kb_row_link_t *s_link(kb_row_t *row, size_t offset) { return (kb_row_link_t *)((char *)row + offset); }

void kb_table_list_unlink(kb_table_row_list_t *list, kb_row_t *row, size_t offset)
{
    kb_row_link_t *l = s_link(row, offset);
    if (l->prev)
        s_link(l->prev, offset)->next = l->next;
    else
        list->head = l->next;
    if (l->next)
        s_link(l->next, offset)->prev = l->prev;
    else
        list->tail = l->prev;
    l->prev = l->next = NULL;
}

void kb_table_list_append(kb_table_row_list_t *list, kb_row_t *row, size_t offset)
{
    kb_row_link_t *l = s_link(row, offset);
    l->next = NULL;
    l->prev = list->tail;
    if (list->tail)
        s_link(list->tail, offset)->next = row;
    else
        list->head = row;
    list->tail = row;
}

/* The whole row is written next round; that record carries the use count, so a frequency-only mark is
 * dropped. */
void kb_table_mark_dirty(kb_stripe_t *st, kb_row_t *row)
{
    if (row->dirty)
        return;
    row->dirty = true;
    row->dirty_next = st->dirty_head;
    st->dirty_head = row;
    if (row->frequency_dirty) {
        row->frequency_dirty = false;
        kb_table_list_unlink(&st->frequency_dirty, row, FREQUENCY_LINK);
    }
}

/* A row changed: persist it and (embedding tables) re-index it. */
void kb_table_row_changed(kb_table_t *self, kb_stripe_t *st, kb_row_t *row)
{
    kb_table_mark_dirty(st, row);
    kb_table_knn_touch(self, st, row);
}

/* A use of the row: with LRU eviction it becomes the most recent. */
void kb_table_lru_touch(kb_table_t *self, kb_stripe_t *st, kb_row_t *row)
{
    if (self->cache)
        row->cache_ref = true;
    if (self->cfg.eviction != KB_EVICT_LRU)
        return;
    row->last_used = atomic_fetch_add(&self->tick, 1);
    if (st->lru.tail != row) {
        kb_table_list_unlink(&st->lru, row, LRU_LINK);
        kb_table_list_append(&st->lru, row, LRU_LINK);
    }
}

bool kb_table_persistable(const kb_table_t *self, const kb_row_t *row)
{
    return self->cfg.admission != KB_ADMIT_FREQUENCY || row->frequency >= self->cfg.min_frequency;
}

/* Counts one sighting (lookup or gradient) of the row; with frequency admission a row becomes persistent
 * when it reaches min_frequency (then the whole row is written). Otherwise a count alone does not make the
 * row dirty: it is marked for the bank's bulk frequency write (kb_table_take_frequencies), so reads never
 * rewrite a row's value. */
void kb_table_count_use(kb_table_t *self, kb_stripe_t *st, kb_row_t *row)
{
    if (s_read_only(self))
        return;
    row->frequency++;
    if (self->cfg.admission == KB_ADMIT_FREQUENCY && row->frequency == self->cfg.min_frequency) {
        atomic_fetch_sub(&self->stats.not_persisted, 1);
        kb_table_mark_dirty(st, row);
        return;
    }
    if (row->dirty || row->frequency_dirty || !kb_table_persistable(self, row))
        return;
    row->frequency_dirty = true;
    kb_table_list_append(&st->frequency_dirty, row, FREQUENCY_LINK);
}

/* Drops the row's pending set, if any, without applying it (stats, pending list, memory). Stripe locked. */
void kb_table_drop_pending(kb_table_t *self, kb_stripe_t *st, kb_row_t *row)
{
    if (!row->pending_count)
        return;
    atomic_fetch_sub(&self->stats.pending_gradients, row->pending_count);
    atomic_fetch_sub(&self->stats.pending_keys, 1);
    kb_table_list_unlink(&st->pending, row, PENDING_LINK);
    s_pending_give(self, st, row->pending);
    row->pending = NULL;
    row->pending_count = 0;
}

/* Removes a row from the table. It stays on the dirty list, marked evicted, until the persister has
 * deleted it from storage and frees it. Its pending gradients go with it (eviction drops the row). */
static void s_evict(kb_table_t *self, kb_stripe_t *st, kb_row_t *row)
{
    kb_rowmap_remove(&st->map, kb_rowmap_hash(row->key, row->key_len), row->key, row->key_len);
    kb_table_drop_pending(self, st, row);
    kb_table_list_unlink(&st->lru, row, LRU_LINK);
    kb_table_by_id_set(self, row->id, NULL);
    if (!kb_table_persistable(self, row))
        atomic_fetch_sub(&self->stats.not_persisted, 1);
    kb_table_knn_touch(self, st, row); /* the flush finds no row for the id and removes it from the index */
    row->evicted = true;
    kb_table_mark_dirty(st, row);
    atomic_fetch_sub(&self->stats.rows, 1);
    atomic_fetch_add(&self->stats.evictions, 1);
}

/* Over the cap: evicts the least recently used (or oldest) row among the heads of this stripe and of a few
 * sampled others -- each stripe's list is in use order, so its head is its oldest row. Sampling, as Redis
 * does, approximates a table-wide LRU without a global lock; other stripes are only try-locked, so the
 * lock order (one stripe at a time) is never violated. `keep` (the row being created) is never chosen. */
#define EVICTION_SAMPLES 8
static void s_evict_one(kb_table_t *self, kb_stripe_t *st, kb_row_t *keep)
{
    kb_stripe_t *best_st = NULL;
    kb_row_t *best = st->lru.head != keep ? st->lru.head : (keep ? keep->lru_link.next : NULL);
    if (best)
        best_st = st;
    kb_stripe_t *locked[EVICTION_SAMPLES];
    int n_locked = 0;
    uint64_t rng = atomic_fetch_add(&self->evict_rng, 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < EVICTION_SAMPLES; i++) {
        kb_stripe_t *other = &self->stripes[carls_splitmix64(&rng) % KB_TABLE_STRIPES];
        bool seen = other == st;
        for (int j = 0; j < n_locked; j++)
            seen |= locked[j] == other;
        if (seen || pthread_mutex_trylock(&other->mutex) != 0)
            continue;
        locked[n_locked++] = other;
        if (other->lru.head && (!best || other->lru.head->last_used < best->last_used)) {
            best = other->lru.head;
            best_st = other;
        }
    }
    if (best)
        s_evict(self, best_st, best);
    for (int j = 0; j < n_locked; j++)
        pthread_mutex_unlock(&locked[j]->mutex);
}

static kb_row_t *s_row_create(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const uint8_t *key,
                              uint32_t key_len)
{
    kb_row_t *row = kb_table_row_alloc(self, key, key_len);
    row->id = atomic_fetch_add(&self->next_row_id, 1);
    row->stripe = (uint16_t)(st - self->stripes);
    if (self->cfg.kind == KB_TABLE_EMBEDDING) {
        kb_init_value(self->cfg.init, self->cfg.init_scale, self->cfg.init_seed, key, key_len, row->value,
                      self->cfg.dim);
        kb_optimizer_state_init(&self->cfg.optimizer, row->opt_state, self->cfg.dim);
    }
    kb_table_map_insert(self, st, hash, row);
    kb_table_by_id_set(self, row->id, row);
    row->last_used = atomic_fetch_add(&self->tick, 1);
    kb_table_list_append(&st->lru, row, LRU_LINK);
    atomic_fetch_add(&self->stats.rows, 1);
    if (!kb_table_persistable(self, row))
        atomic_fetch_add(&self->stats.not_persisted, 1);
    kb_table_row_changed(self, st, row);
    if (self->cfg.eviction != KB_EVICT_NONE && atomic_load(&self->stats.rows) > self->cfg.max_rows)
        s_evict_one(self, st, row);
    return row;
}

/* The key's row; created when create is set and admission allows it, else NULL. With a cache, a key
 * missing from memory is read from storage first (with the stripe locked: the paths that must not wait
 * on storage under a lock use s_row_lookup and kb_table_row_fetch). */
kb_row_t *kb_table_row_get(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key,
                           bool create)
{
    kb_row_t *row = kb_rowmap_find(&st->map, hash, key->data, key->len);
    if (row) {
        kb_table_lru_touch(self, st, row);
        return row;
    }
    if (self->cache && (row = kb_table_row_cold(self, st, hash, key)) != NULL)
        return row;
    return kb_table_row_new(self, st, hash, key, create);
}

/* kb_table_row_get of a lookup: a key missing from memory with a cache sets *cold and is served later by
 * kb_table_row_fetch, after the batch's stripes are unlocked. */
static inline kb_row_t *s_row_lookup(kb_table_t *self, kb_stripe_t *st, uint64_t hash,
                                     const ProtobufCBinaryData *key, bool create, bool *cold)
{
    kb_row_t *row = kb_rowmap_find(&st->map, hash, key->data, key->len);
    if (row) {
        kb_table_lru_touch(self, st, row);
        return row;
    }
    if (self->cache) {
        *cold = true;
        return NULL;
    }
    return kb_table_row_new(self, st, hash, key, create);
}

/* A key with no row in memory (nor in storage, with a cache): its new row when create is set and admission
 * allows it, else NULL. */
kb_row_t *kb_table_row_new(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key,
                           bool create)
{
    if (!create)
        return NULL;
    if (self->bloom && kb_bloom_add(self->bloom, key->data, key->len) < self->cfg.min_frequency) {
        atomic_fetch_add(&self->stats.not_admitted, 1);
        return NULL;
    }
    return s_row_create(self, st, hash, key->data, (uint32_t)key->len);
}

/* The row of a key an explicit write (put, feature put) replaces: found and touched, or created. Admission
 * filters do not apply to explicit writes. */
kb_row_t *kb_table_row_for_write(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const ProtobufCBinaryData *key)
{
    kb_row_t *row = kb_table_row_get(self, st, hash, key, false);
    return row ? row : s_row_create(self, st, hash, key->data, (uint32_t)key->len);
}

/* One optimizer step with gradient g; updates version and timestamp. */
static void s_row_step(kb_table_t *self, kb_stripe_t *st, kb_row_t *row, const float *g)
{
    kb_optimizer_step(&self->cfg.optimizer, row->value, row->opt_state, &row->opt_steps, g, self->cfg.dim);
    row->version++;
    row->updated_at_ms = carls_wall_ms();
    atomic_fetch_add(&self->stats.updates_applied, 1);
    kb_table_row_changed(self, st, row);
}

/* Applies the row's pending set (outliers dropped, average, one step) and empties it. */
static void s_row_apply_pending(kb_table_t *self, kb_stripe_t *st, kb_row_t *row, atomic_uint_fast64_t *reason)
{
    uint32_t dim = self->cfg.dim;
    uint32_t count = row->pending_count;
    if (count == 0)
        return;
    float avg_small[256];
    float *avg = dim <= 256 ? avg_small : carls_xmalloc(dim * sizeof(float));
    uint32_t dropped = 0;
    uint32_t kept = kb_lazy_average(&self->cfg.outlier, row->pending, count, dim, avg, &dropped);
    if (kept > 0)
        s_row_step(self, st, row, avg);
    if (avg != avg_small)
        free(avg);

    atomic_fetch_add(&self->stats.gradients_applied, kept);
    atomic_fetch_add(&self->stats.outliers_dropped, dropped);
    atomic_fetch_add(reason, 1);
    kb_table_drop_pending(self, st, row); /* applied now: the set goes as a dropped one does */
    kb_table_mark_dirty(st, row);
}

/* Calls visit(row, ctx) for every row of the table, each stripe locked while its rows are visited (so a row is
 * seen whole, but rows of different stripes at different moments). */
void kb_table_each_row(kb_table_t *self, void (*visit)(kb_row_t *row, void *ctx), void *ctx)
{
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        for (size_t j = 0; j < st->map.capacity; j++) {
            if (st->map.slots[j].hash)
                visit(st->map.slots[j].row, ctx);
        }
        pthread_mutex_unlock(&st->mutex);
    }
}

/* ---- operations ---- */

/* How many keys ahead a batch lookup fetches slots, and rows: far enough that a miss has landed by the time
 * the key is served, near enough that the lines are still in cache. */
#define S_AHEAD_SLOT 8
#define S_AHEAD_ROW 4
#define S_AHEAD_PENDING 2

/* Asks for the cache lines of [from, from + bytes), to be written or only read. */
static inline void s_prefetch(const void *from, size_t bytes, bool write)
{
    for (size_t at = 0; at < bytes; at += 64) {
        if (write)
            __builtin_prefetch((const char *)from + at, 1);
        else
            __builtin_prefetch((const char *)from + at, 0);
    }
}

/* Serves key i of a lookup from its row (NULL: none, the key's initial value); returns the optimizer steps
 * taken (the row's pending set applied). Stripe locked. */
static inline uint64_t s_lookup_serve(kb_table_t *self, kb_stripe_t *st, kb_row_t *row,
                                      const ProtobufCBinaryData *key, bool no_create, size_t i, float *values,
                                      uint64_t *versions, int64_t *updated_at_ms, uint64_t *frequencies)
{
    uint32_t dim = self->cfg.dim;
    uint64_t steps = 0;
    if (!row) {
        kb_init_value(self->cfg.init, self->cfg.init_scale, self->cfg.init_seed, key->data, key->len,
                      values + i * dim, dim);
        versions[i] = 0;
        updated_at_ms[i] = 0;
        frequencies[i] = 0;
        return 0;
    }
    if (row->pending_count > 0 && !s_read_only(self)) {
        s_row_apply_pending(self, st, row, &self->stats.applied_on_lookup);
        steps++;
    }
    if (!no_create)
        kb_table_count_use(self, st, row);
    memcpy(values + i * dim, row->value, dim * sizeof(float));
    versions[i] = row->version;
    updated_at_ms[i] = row->updated_at_ms;
    frequencies[i] = row->frequency;
    return steps;
}

/* The keys of a lookup not in memory (with a cache), served after the batch's stripes are unlocked: each
 * with its stripe's eviction count when it was found missing (kb_table_row_fetch). */
typedef struct {
    uint32_t *index;
    uint64_t *gen;
    size_t n;
} s_cold_keys_t;

uint64_t kb_table_lookup(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, bool no_create,
                         float *values, uint64_t *versions, int64_t *updated_at_ms, uint64_t *frequencies)
{
    uint32_t dim = self->cfg.dim;
    uint64_t steps = 0;
    s_cold_keys_t cold_keys = {0};
    s_groups_t g;
    s_groups_make(&g, keys, n);
    /* Every stripe the batch touches is locked at once (in index order, so two batches cannot deadlock;
     * nothing else holds two stripes), and the slots and rows of keys a few places ahead are fetched while
     * the current key is served: the misses of many keys overlap instead of following one another. */
    for (int s = 0; s < KB_TABLE_STRIPES; s++)
        if (g.starts[s] != g.starts[s + 1])
            pthread_mutex_lock(&self->stripes[s].mutex);
    size_t row_bytes = sizeof(kb_row_t) + 16 + (size_t)dim * sizeof(float);
    /* Under pushes, a lookup averages the pending sets of most keys it reads, and those buffers are colder
     * than the rows: fetch them a stage later still (without pending sets there is nothing to fetch, and
     * the stage is skipped rather than paying for a second search of the map). */
    bool prefetch_pending = atomic_load(&self->stats.pending_keys) > 0 && !s_read_only(self);
    for (size_t j = 0; j < n; j++) {
        if (prefetch_pending && j + S_AHEAD_PENDING < n) {
            size_t a = g.order[j + S_AHEAD_PENDING];
            const kb_row_t *ahead = kb_rowmap_find(&kb_table_stripe(self, g.hashes[a])->map, g.hashes[a], keys[a].data,
                                                   keys[a].len);
            if (ahead && ahead->pending_count)
                s_prefetch(ahead->pending, (size_t)ahead->pending_count * dim * sizeof(float), false);
        }
        if (j + S_AHEAD_SLOT < n) {
            uint64_t h = g.hashes[g.order[j + S_AHEAD_SLOT]];
            kb_rowmap_prefetch_slot(&kb_table_stripe(self, h)->map, h);
        }
        if (j + S_AHEAD_ROW < n) {
            uint64_t h = g.hashes[g.order[j + S_AHEAD_ROW]];
            kb_rowmap_prefetch_row(&kb_table_stripe(self, h)->map, h, row_bytes);
        }
        size_t i = g.order[j];
        kb_stripe_t *st = kb_table_stripe(self, g.hashes[i]);
        bool cold = false;
        kb_row_t *row = s_row_lookup(self, st, g.hashes[i], &keys[i], !no_create, &cold);
        if (cold) {
            if (!cold_keys.index) {
                cold_keys.index = carls_xmalloc(n * sizeof *cold_keys.index);
                cold_keys.gen = carls_xmalloc(n * sizeof *cold_keys.gen);
            }
            cold_keys.index[cold_keys.n] = (uint32_t)i;
            cold_keys.gen[cold_keys.n++] = st->cache_gen;
            continue;
        }
        steps += s_lookup_serve(self, st, row, &keys[i], no_create, i, values, versions, updated_at_ms, frequencies);
    }
    for (int s = 0; s < KB_TABLE_STRIPES; s++)
        if (g.starts[s] != g.starts[s + 1])
            pthread_mutex_unlock(&self->stripes[s].mutex);
    /* Keys only in storage: read without a lock held, then served one stripe at a time. */
    for (size_t c = 0; c < cold_keys.n; c++) {
        size_t i = cold_keys.index[c];
        kb_stripe_t *st;
        kb_row_t *row = kb_table_row_fetch(self, g.hashes[i], &keys[i], !no_create, cold_keys.gen[c], &st);
        steps += s_lookup_serve(self, st, row, &keys[i], no_create, i, values, versions, updated_at_ms, frequencies);
        pthread_mutex_unlock(&st->mutex);
    }
    free(cold_keys.index);
    free(cold_keys.gen);
    s_groups_free(&g);
    atomic_fetch_add(&self->stats.lookups, n);
    if (self->cache)
        kb_table_cache_shrink(self);
    return steps;
}

void kb_table_peek(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, float *values, int64_t *ids)
{
    uint32_t dim = self->cfg.dim;
    for (size_t i = 0; i < n; i++) {
        uint64_t hash;
        kb_stripe_t *st = kb_table_lock_key(self, &keys[i], &hash);
        kb_row_t *row = kb_rowmap_find(&st->map, hash, keys[i].data, keys[i].len);
        if (!row && self->cache)
            row = kb_table_row_cold(self, st, hash, &keys[i]);
        if (row) {
            if (row->pending_count > 0 && !s_read_only(self))
                s_row_apply_pending(self, st, row, &self->stats.applied_on_lookup);
            memcpy(values + i * dim, row->value, dim * sizeof(float));
            ids[i] = row->id;
        } else {
            kb_init_value(self->cfg.init, self->cfg.init_scale, self->cfg.init_seed, keys[i].data, keys[i].len,
                          values + i * dim, dim);
            ids[i] = -1;
        }
        pthread_mutex_unlock(&st->mutex);
    }
}

void kb_table_put(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, const float *values,
                  uint64_t version)
{
    uint32_t dim = self->cfg.dim;
    int64_t now = carls_wall_ms();
    s_groups_t g;
    s_groups_make(&g, keys, n);
    for (int s = 0; s < KB_TABLE_STRIPES; s++) {
        kb_stripe_t *st = s_group_lock(self, &g, s);
        for (uint32_t j = g.starts[s]; st && j < g.starts[s + 1]; j++) {
            size_t i = g.order[j];
            kb_row_t *row = kb_table_row_for_write(self, st, g.hashes[i], &keys[i]);
            memcpy(row->value, values + i * dim, dim * sizeof(float));
            row->version = version;
            row->updated_at_ms = now;
            kb_table_row_changed(self, st, row);
        }
        if (st)
            pthread_mutex_unlock(&st->mutex);
    }
    s_write_done(self, &g, &self->stats.puts, n);
}

/* Pending buffers are the coldest memory a push touches (max_pending gradients per key, all over the heap):
 * fetch the slot each key's gradient goes to, and the whole set where this gradient completes it and it is
 * averaged at once, before the first of the group's copies waits on a miss. Stripe locked. */
static void s_prefetch_pending(const kb_table_t *self, const kb_stripe_t *st, const s_groups_t *g, int s,
                               const ProtobufCBinaryData *keys)
{
    size_t row_bytes = (size_t)self->cfg.dim * sizeof(float);
    for (uint32_t j = g->starts[s]; j < g->starts[s + 1]; j++) {
        size_t i = g->order[j];
        const kb_row_t *row = kb_rowmap_find(&st->map, g->hashes[i], keys[i].data, keys[i].len);
        if (!row || !row->pending)
            continue;
        bool completes = row->pending_count + 1 >= self->cfg.max_pending;
        const char *from = (const char *)row->pending + (completes ? 0 : row->pending_count * row_bytes);
        s_prefetch(from, completes ? (row->pending_count + 1) * row_bytes : row_bytes, true);
    }
}

/* Adds *unpublished to stats.pending_gradients and zeroes it (kb_table_push). */
static void s_publish_pending(kb_table_t *self, uint64_t *unpublished)
{
    if (*unpublished)
        atomic_fetch_add(&self->stats.pending_gradients, *unpublished);
    *unpublished = 0;
}

uint64_t kb_table_push(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, const float *gradients)
{
    uint32_t dim = self->cfg.dim;
    uint64_t steps = 0;
    /* Gradients made pending, not yet in stats.pending_gradients: one atomic add per row fenced each row's
     * copy into its cold pending buffer (a locked add waits for the stores before it), and was a third of
     * the request thread's time in kb_table_push under a push load. Added before a set is applied or may be
     * evicted (either subtracts its count) and before each stripe is unlocked (then other threads may apply
     * or drop those sets), so the counter never goes below what is pending. */
    uint64_t unpublished = 0;
    s_groups_t g;
    s_groups_make(&g, keys, n);
    for (int s = 0; s < KB_TABLE_STRIPES; s++) {
        kb_stripe_t *st = s_group_lock(self, &g, s);
        if (st && !self->cfg.immediate)
            s_prefetch_pending(self, st, &g, s, keys);
        for (uint32_t j = g.starts[s]; st && j < g.starts[s + 1]; j++) {
            size_t i = g.order[j];
            const float *grad = gradients + i * dim;
            if (self->cfg.eviction != KB_EVICT_NONE) /* a new row may evict a pending set */
                s_publish_pending(self, &unpublished);
            kb_row_t *row = kb_table_row_get(self, st, g.hashes[i], &keys[i], true);
            if (!row) /* not admitted yet: the gradient of a key without a row is dropped (counted) */
                continue;
            kb_table_count_use(self, st, row);
            if (self->cfg.immediate) {
                s_row_step(self, st, row, grad);
                atomic_fetch_add(&self->stats.gradients_applied, 1);
                steps++;
            } else {
                if (row->pending_count == 0) {
                    row->pending = kb_table_pending_take(self, st);
                    row->pending_since_ms = carls_monotonic_ms();
                    kb_table_list_append(&st->pending, row, PENDING_LINK);
                    atomic_fetch_add(&self->stats.pending_keys, 1);
                }
                memcpy(row->pending + (size_t)row->pending_count * dim, grad, dim * sizeof(float));
                row->pending_count++;
                unpublished++;
                if (row->pending_count >= self->cfg.max_pending) {
                    s_publish_pending(self, &unpublished);
                    s_row_apply_pending(self, st, row, &self->stats.applied_on_count);
                    steps++;
                }
            }
            kb_table_mark_dirty(st, row);
        }
        s_publish_pending(self, &unpublished);
        if (st)
            pthread_mutex_unlock(&st->mutex);
    }
    s_write_done(self, &g, &self->stats.gradients_received, n);
    return steps;
}

uint64_t kb_table_expire(kb_table_t *self, int64_t now_ms)
{
    if (self->cfg.immediate || self->cfg.kind != KB_TABLE_EMBEDDING || s_read_only(self))
        return 0;
    uint64_t applied = 0;
    int64_t max_age = self->cfg.max_age_ms;
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        /* The list is in arrival order of each key's first pending gradient, so stop at the first young one. */
        while (st->pending.head && now_ms - st->pending.head->pending_since_ms >= max_age) {
            s_row_apply_pending(self, st, st->pending.head, &self->stats.applied_on_age);
            applied++;
        }
        pthread_mutex_unlock(&st->mutex);
    }
    return applied;
}

/* ---- memory ---- */

uint64_t kb_table_growth(kb_table_t *self, kb_table_growth_op_t op, const ProtobufCBinaryData *keys, size_t n,
                         const size_t *record_lens, uint64_t *new_rows_out)
{
    uint32_t per_stripe[KB_TABLE_STRIPES] = {0};
    uint64_t new_rows = 0, bytes = 0;
    int64_t extra = 0; /* bytes every new row brings besides its own block */
    if (op == KB_GROW_PUSH && !self->cfg.immediate && self->cfg.kind == KB_TABLE_EMBEDDING)
        extra += s_pending_bytes(self);
    if (self->knn)
        extra += (int64_t)kb_knn_vector_bytes(self->knn);
    bool filtered = self->bloom && (op == KB_GROW_LOOKUP || op == KB_GROW_PUSH);
    for (size_t i = 0; i < n; i++) {
        uint64_t hash;
        kb_stripe_t *st = kb_table_lock_key(self, &keys[i], &hash);
        bool found = kb_rowmap_find(&st->map, hash, keys[i].data, keys[i].len) != NULL;
        pthread_mutex_unlock(&st->mutex);
        /* Bloom admission: a key gets a row only at its min_frequency-th sighting. */
        if (found || (filtered && kb_bloom_count(self->bloom, keys[i].data, keys[i].len) + 1 < self->cfg.min_frequency))
            continue;
        new_rows++;
        per_stripe[st - self->stripes]++;
        bytes += (uint64_t)(s_row_bytes(self, (uint32_t)keys[i].len) + extra);
        if (record_lens)
            bytes += kb_memory_chunk(record_lens[i]);
    }
    *new_rows_out = new_rows;
    if (new_rows == 0)
        return 0;
    uint64_t charged = new_rows;
    if (self->cfg.eviction != KB_EVICT_NONE) {
        /* Past max_rows every new row evicts one (freed once its deletion is committed): only the rows below
         * the cap add to the table. */
        uint64_t rows = atomic_load(&self->stats.rows);
        uint64_t room = self->cfg.max_rows > rows ? self->cfg.max_rows - rows : 0;
        if (room < new_rows) {
            bytes = bytes / new_rows * room;
            charged = room;
        }
    }
    /* The row maps that must grow to take them (stripes count their own new rows). */
    for (int i = 0; i < KB_TABLE_STRIPES && charged == new_rows; i++) {
        if (!per_stripe[i])
            continue;
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        size_t cap = st->map.capacity, grown = cap, need = st->map.count + per_stripe[i];
        pthread_mutex_unlock(&st->mutex);
        while (need * 10 > grown * 7)
            grown = grown ? grown * 2 : 16;
        bytes += (uint64_t)(s_map_bytes(grown) - s_map_bytes(cap));
    }
    /* The id index, which doubles. */
    if (charged) {
        pthread_mutex_lock(&self->id_mutex);
        size_t cap = self->by_id_capacity;
        pthread_mutex_unlock(&self->id_mutex);
        uint64_t last = (uint64_t)atomic_load(&self->next_row_id) + charged;
        size_t grown = cap ? cap : 1024;
        while (grown <= last)
            grown *= 2;
        if (grown != cap)
            bytes += kb_memory_chunk(grown * sizeof(kb_row_t *)) - (cap ? kb_memory_chunk(cap * sizeof(kb_row_t *)) : 0);
    }
    return bytes;
}

/* ---- feature records ---- */

void kb_table_feature_get(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, uint8_t **records,
                          size_t *lens, bool *found)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t hash;
        kb_stripe_t *st = kb_table_lock_key(self, &keys[i], &hash);
        kb_row_t *row = kb_table_row_get(self, st, hash, &keys[i], false);
        records[i] = NULL;
        lens[i] = 0;
        found[i] = row != NULL;
        if (row) {
            kb_table_count_use(self, st, row);
            records[i] = carls_xmalloc(row->record_len);
            if (row->record_len)
                memcpy(records[i], row->record, row->record_len);
            lens[i] = row->record_len;
        }
        pthread_mutex_unlock(&st->mutex);
    }
    atomic_fetch_add(&self->stats.lookups, n);
    if (self->cache)
        kb_table_cache_shrink(self);
}

void kb_table_feature_put(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, uint8_t *const *records,
                          const size_t *lens)
{
    int64_t now = carls_wall_ms();
    for (size_t i = 0; i < n; i++) {
        uint64_t hash;
        kb_stripe_t *st = kb_table_lock_key(self, &keys[i], &hash);
        kb_row_t *row = kb_table_row_for_write(self, st, hash, &keys[i]);
        if (row->record)
            kb_table_mem(self, -(int64_t)kb_memory_chunk(row->record_len));
        free(row->record);
        row->record = carls_xmalloc(lens[i]);
        kb_table_mem(self, (int64_t)kb_memory_chunk(lens[i]));
        if (lens[i])
            memcpy(row->record, records[i], lens[i]);
        row->record_len = (uint32_t)lens[i];
        row->version++;
        row->updated_at_ms = now;
        kb_table_mark_dirty(st, row);
        pthread_mutex_unlock(&st->mutex);
    }
    atomic_fetch_add(&self->stats.puts, n);
    if (self->cache)
        kb_table_cache_shrink(self);
}
