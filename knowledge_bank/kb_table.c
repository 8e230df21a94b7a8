#include "kb_table.h"
#include "kb_table_internal.h"

#include "kb_bloom.h"
#include "kb_memory.h"
#include "kb_rowmap.h"
#include "log.h"
#include "util.h"

#include <errno.h>
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

/* A sampling snapshot: the sampler and the keys of its entries (index order). */
struct kb_table_sample_cache {
    kb_sampler_t *sampler;
    uint8_t *key_bytes;  /* all keys, back to back */
    size_t *key_offset;  /* entries + 1 */
    int64_t built_ms;
    uint64_t signature;  /* table activity when built: rebuild only if it moved */
    int64_t bytes;       /* heap bytes held (the memory estimate) */
};

void kb_table_sample_cache_free(struct kb_table_sample_cache *c)
{
    if (!c)
        return;
    kb_sampler_destroy(&c->sampler);
    free(c->key_bytes);
    free(c->key_offset);
    free(c);
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
    s_groups_free(&g);
    atomic_fetch_add(&self->stats.puts, n);
    if (self->cache)
        kb_table_cache_shrink(self);
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
    s_groups_free(&g);
    atomic_fetch_add(&self->stats.gradients_received, n);
    if (self->cache)
        kb_table_cache_shrink(self);
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

/* ---- nearest neighbours ---- */

/* Brings the index up to date with every change made before the call. */
static int s_knn_flush(kb_table_t *self)
{
    uint32_t dim = self->cfg.dim;
    int rc = 0;
    pthread_mutex_lock(&self->knn_mutex);
    for (int i = 0; i < KB_TABLE_STRIPES && rc == 0; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        size_t n = st->knn_count;
        if (n == 0) {
            pthread_mutex_unlock(&st->mutex);
            continue;
        }
        int64_t *up_ids = carls_xmalloc(n * sizeof *up_ids);
        int64_t *gone = carls_xmalloc(n * sizeof *gone);
        float *vecs = carls_xmalloc(n * dim * sizeof *vecs);
        size_t n_up = 0, n_gone = 0;
        for (size_t j = 0; j < n; j++) {
            kb_row_t *row = kb_table_by_id_get(self, st->knn_ids[j]);
            if (row && row->knn_dirty) {
                memcpy(vecs + n_up * dim, row->value, dim * sizeof(float));
                up_ids[n_up++] = row->id;
                row->knn_dirty = false;
            } else if (!row) {
                gone[n_gone++] = st->knn_ids[j];
            }
        }
        st->knn_count = 0;
        pthread_mutex_unlock(&st->mutex);
        /* The stripe is unlocked while FAISS works; knn_mutex keeps flushes, and so updates, in order. */
        if (n_gone)
            rc = kb_knn_remove_batch(self->knn, n_gone, gone, NULL);
        if (rc == 0 && n_up)
            rc = kb_knn_upsert_batch(self->knn, n_up, up_ids, vecs);
        free(up_ids);
        free(gone);
        free(vecs);
        /* The index grew or shrank with the changes just fed to it (counted stripe by stripe: feeding a
         * large batch to a graph index takes a while). */
        int64_t knn_bytes = (int64_t)kb_knn_memory(self->knn);
        kb_table_mem(self, knn_bytes - self->knn_mem_counted);
        self->knn_mem_counted = knn_bytes;
    }
    pthread_mutex_unlock(&self->knn_mutex);
    return rc;
}

int kb_table_knn_flush(kb_table_t *self) { return self->knn ? s_knn_flush(self) : 0; }

size_t kb_table_knn_batch_min(const kb_table_t *self, size_t nq)
{
    return self->knn ? kb_knn_batch_min(self->knn, nq) : 1;
}

uint64_t kb_table_knn_query_ns(const kb_table_t *self, size_t nq)
{
    return atomic_load_explicit(&self->knn_query_ns[kb_table_knn_batch_min(self, nq) > 1], memory_order_relaxed);
}

int kb_table_knn(kb_table_t *self, const float *queries, size_t nq, uint32_t k, const int64_t *exclude,
                 ProtobufCBinaryData *keys_out, float *scores_out)
{
    if (!self->knn)
        return -ENOTSUP;
    int rc = s_knn_flush(self);
    if (rc != 0)
        return rc;
    int64_t *ids = carls_xmalloc(nq * k * sizeof *ids);
    int64_t t0 = carls_monotonic_us();
    rc = kb_knn_search(self->knn, queries, nq, k, exclude, ids, scores_out);
    size_t batch_min = kb_knn_batch_min(self->knn, nq);
    if (rc == 0 && nq > 0 && nq >= batch_min) {
        /* Two averages: searches that may be split to single queries, and those that keep batches of
         * batch_min or more (a Flat index's BLAS product), which cost several times less per query; a search
         * between the two is neither, and is not timed. Calls may race here: the average loses a sample
         * then, which an estimate can afford. A search under the clock's microsecond counts as 1 ns a
         * query, so that 0 keeps meaning "not measured". */
        atomic_uint_fast64_t *avg = &self->knn_query_ns[batch_min > 1];
        uint64_t sample = (uint64_t)(carls_monotonic_us() - t0) * 1000u / nq;
        if (sample == 0)
            sample = 1;
        uint64_t old = atomic_load_explicit(avg, memory_order_relaxed);
        atomic_store_explicit(avg, old ? (3 * old + sample) / 4 : sample, memory_order_relaxed);
    }
    for (size_t i = 0; i < nq * k; i++) {
        keys_out[i].data = NULL;
        keys_out[i].len = 0;
        if (rc != 0 || ids[i] < 0)
            continue;
        /* The id's row may be evicted between search and here: then it is answered as missing. */
        kb_stripe_t *st = kb_table_by_id_stripe(self, ids[i]);
        if (!st)
            continue;
        pthread_mutex_lock(&st->mutex);
        kb_row_t *row = kb_table_by_id_get(self, ids[i]);
        if (row) {
            keys_out[i].data = carls_xmalloc(row->key_len);
            memcpy(keys_out[i].data, row->key, row->key_len);
            keys_out[i].len = row->key_len;
        }
        pthread_mutex_unlock(&st->mutex);
    }
    free(ids);
    return rc;
}

/* ---- candidate sampling ---- */

/* Anything that changes rows or frequencies moves this. */
static uint64_t s_activity(kb_table_t *self)
{
    return atomic_load(&self->stats.lookups) + atomic_load(&self->stats.gradients_received) +
           atomic_load(&self->stats.puts) + atomic_load(&self->stats.evictions) + atomic_load(&self->stats.rows);
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

/* The sampler's entries and the keys being gathered for a sample cache. */
typedef struct {
    struct kb_table_sample_cache *cache;
    kb_sampler_entry_t *entries;
    size_t n, cap, bytes, bytes_cap;
} s_sample_rows_t;

static void s_sample_add_row(kb_row_t *row, void *ctx)
{
    s_sample_rows_t *r = ctx;
    struct kb_table_sample_cache *c = r->cache;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 1024;
        r->entries = carls_xrealloc(r->entries, r->cap * sizeof *r->entries);
        c->key_offset = carls_xrealloc(c->key_offset, (r->cap + 1) * sizeof *c->key_offset);
    }
    while (r->bytes + row->key_len > r->bytes_cap) {
        r->bytes_cap = r->bytes_cap ? r->bytes_cap * 2 : 16384;
        c->key_bytes = carls_xrealloc(c->key_bytes, r->bytes_cap);
    }
    r->entries[r->n] = (kb_sampler_entry_t){.row_id = row->id, .frequency = row->frequency};
    c->key_offset[r->n] = r->bytes;
    memcpy(c->key_bytes + r->bytes, row->key, row->key_len);
    r->bytes += row->key_len;
    r->n++;
}

/* Builds a snapshot of every row for one strategy. Returns NULL (with rc) when the sampler refuses. */
static struct kb_table_sample_cache *s_sample_build(kb_table_t *self, kb_sampler_strategy_t strategy, int *rc)
{
    struct kb_table_sample_cache *c = carls_xcalloc(1, sizeof *c);
    c->signature = s_activity(self);
    s_sample_rows_t r = {.cache = c};
    kb_table_each_row(self, s_sample_add_row, &r);
    c->key_offset = carls_xrealloc(c->key_offset, (r.n + 1) * sizeof *c->key_offset);
    c->key_offset[r.n] = r.bytes;
    *rc = kb_sampler_new(strategy, r.entries, r.n, &c->sampler);
    free(r.entries);
    if (*rc != 0) {
        kb_table_sample_cache_free(c);
        return NULL;
    }
    c->bytes = (int64_t)(kb_memory_chunk(sizeof *c) + kb_memory_chunk((r.n + 1) * sizeof *c->key_offset) +
                         (r.bytes_cap ? kb_memory_chunk(r.bytes_cap) : 0) + kb_sampler_memory(c->sampler));
    c->built_ms = carls_monotonic_ms();
    return c;
}

static void s_copy_key(const struct kb_table_sample_cache *c, size_t index, ProtobufCBinaryData *out)
{
    size_t len = c->key_offset[index + 1] - c->key_offset[index];
    out->data = carls_xmalloc(len ? len : 1);
    memcpy(out->data, c->key_bytes + c->key_offset[index], len);
    out->len = len;
}

int kb_table_sample(kb_table_t *self, kb_sampler_strategy_t strategy, const ProtobufCBinaryData *positives,
                    size_t n_pos, size_t n, uint64_t seed, ProtobufCBinaryData *out_keys, float *out_probs,
                    protobuf_c_boolean *out_positive, double *mass, uint64_t *rows)
{
    if ((int)strategy < 0 || (int)strategy > 2)
        return -EINVAL;
    int rc = 0;
    pthread_mutex_lock(&self->sample_mutex);
    struct kb_table_sample_cache *c = self->samplers[strategy];
    /* A snapshot serves for up to a second; after that it is rebuilt if the table has changed. It is rebuilt
     * at once when the table has changed and its size is off by a factor of two (e.g. a first snapshot
     * taken of an empty table). */
    bool stale = false;
    if (c && s_activity(self) != c->signature) {
        uint64_t now_rows = atomic_load(&self->stats.rows), had = kb_sampler_size(c->sampler);
        stale = carls_monotonic_ms() - c->built_ms >= 1000 || now_rows > 2 * had || had > 2 * now_rows;
    }
    if (!c || stale) {
        struct kb_table_sample_cache *fresh = s_sample_build(self, strategy, &rc);
        if (fresh) {
            kb_table_mem(self, fresh->bytes - (c ? c->bytes : 0));
            kb_table_sample_cache_free(c);
            c = self->samplers[strategy] = fresh;
        } else if (!c) {
            pthread_mutex_unlock(&self->sample_mutex);
            return rc;
        }
        rc = 0;
    }
    *mass = kb_sampler_mass(c->sampler);
    *rows = kb_sampler_size(c->sampler);
    for (size_t i = 0; i < n_pos; i++) {
        out_keys[i].data = carls_xmalloc(positives[i].len ? positives[i].len : 1);
        memcpy(out_keys[i].data, positives[i].data, positives[i].len);
        out_keys[i].len = positives[i].len;
        out_positive[i] = true;
        int64_t id = -1;
        uint64_t freq = 0;
        uint64_t hash;
        kb_stripe_t *st = kb_table_lock_key(self, &positives[i], &hash);
        kb_row_t *row = kb_rowmap_find(&st->map, hash, positives[i].data, positives[i].len);
        if (row) {
            id = row->id;
            freq = row->frequency;
        }
        pthread_mutex_unlock(&st->mutex);
        double p = 0.0;
        if (id < 0 || kb_sampler_prob_of(c->sampler, id, &p, NULL) != 0) {
            /* Not in the snapshot (new, or no row): what the strategy would give it. */
            if (strategy == KB_SAMPLER_UNIFORM && *rows)
                p = 1.0 / (double)*rows;
            else if (strategy == KB_SAMPLER_UNIGRAM && *mass > 0)
                p = pow((double)freq, 0.75) / *mass;
            else
                p = 0.0;
        }
        out_probs[i] = (float)p;
    }
    if (n > 0) {
        size_t *idx = carls_xmalloc(n * sizeof *idx);
        double *probs = carls_xmalloc(n * sizeof *probs);
        uint64_t rng = seed;
        rc = kb_sampler_draw(c->sampler, &rng, n, idx, NULL, probs);
        for (size_t j = 0; j < n && rc == 0; j++) {
            s_copy_key(c, idx[j], &out_keys[n_pos + j]);
            out_probs[n_pos + j] = (float)probs[j];
            out_positive[n_pos + j] = false;
        }
        if (rc != 0) /* nothing drawable: leave the candidate slots empty for the caller to free */
            for (size_t j = 0; j < n; j++)
                out_keys[n_pos + j] = (ProtobufCBinaryData){0, NULL};
        free(idx);
        free(probs);
    }
    pthread_mutex_unlock(&self->sample_mutex);
    return rc;
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
            bool was = kb_table_persistable(self, row);
            row->frequency = rec->frequency;
            bool now = kb_table_persistable(self, row);
            if (was && !now)
                atomic_fetch_add(&self->stats.not_persisted, 1);
            else if (!was && now)
                atomic_fetch_sub(&self->stats.not_persisted, 1);
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
        bool now_persistable = kb_table_persistable(self, row);
        if (was_persistable && !now_persistable)
            atomic_fetch_add(&self->stats.not_persisted, 1);
        else if (!was_persistable && now_persistable)
            atomic_fetch_sub(&self->stats.not_persisted, 1);
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
