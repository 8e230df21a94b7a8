#include "kb_table.h"

#include "kb_rowmap.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Defaults for fields left zero on the wire (documented in proto/carls.proto and docs/PROTOCOL.md). */
#define DEFAULT_INIT_SCALE 0.05f
#define DEFAULT_MAX_AGE_MS 1000u
#define DEFAULT_MAX_PENDING 16u
#define DEFAULT_OUTLIER_THRESHOLD 3.0f
#define DEFAULT_OUTLIER_MIN_COUNT 3u

typedef struct {
    pthread_mutex_t mutex;
    kb_rowmap_t map;
    kb_row_t *pending_head, *pending_tail; /* rows with pending gradients, oldest first */
    kb_row_t *dirty_head;                  /* rows changed since the last persist */
} kb_stripe_t;

struct kb_table {
    int64_t id;
    char *name;
    kb_table_config_t cfg;
    uint32_t opt_floats;     /* optimizer state floats per row */
    atomic_int_fast64_t next_row_id;
    kb_stripe_t stripes[KB_TABLE_STRIPES];
    struct {
        atomic_uint_fast64_t rows, pending_keys, pending_gradients, gradients_received, gradients_applied,
            outliers_dropped, updates_applied, applied_on_lookup, applied_on_age, applied_on_count, lookups, puts;
    } stats;
};

/* ---- config ---- */

int kb_table_config_from_proto(const Carls__TableConfig *in, uint32_t max_dim, kb_table_config_t *out, char *err,
                               size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!in) {
        snprintf(err, errlen, "missing table config");
        return -1;
    }
    if (in->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING) {
        snprintf(err, errlen, "table kind %d is not supported by this server (embedding only)", (int)in->kind);
        return -1;
    }
    if (in->dim == 0 || in->dim > max_dim) {
        snprintf(err, errlen, "dim must be in 1..%u, got %u", max_dim, in->dim);
        return -1;
    }
    out->dim = in->dim;
    switch (in->init) {
    case CARLS__INIT_KIND__INIT_ZEROS: out->init = KB_INIT_ZEROS; break;
    case CARLS__INIT_KIND__INIT_UNIFORM: out->init = KB_INIT_UNIFORM; break;
    case CARLS__INIT_KIND__INIT_NORMAL: out->init = KB_INIT_NORMAL; break;
    default: snprintf(err, errlen, "unknown initializer %d", (int)in->init); return -1;
    }
    out->init_scale = in->init_scale != 0.0f ? in->init_scale : DEFAULT_INIT_SCALE;
    if (!isfinite(out->init_scale) || out->init_scale < 0.0f) {
        snprintf(err, errlen, "init_scale must be finite and >= 0");
        return -1;
    }
    out->init_seed = in->init_seed;

    const Carls__OptimizerConfig *opt = in->optimizer;
    kb_optimizer_config_t oc = {0};
    if (opt) {
        switch (opt->kind) {
        case CARLS__OPTIMIZER_KIND__OPT_SGD: oc.kind = KB_OPT_SGD; break;
        case CARLS__OPTIMIZER_KIND__OPT_MOMENTUM: oc.kind = KB_OPT_MOMENTUM; break;
        case CARLS__OPTIMIZER_KIND__OPT_ADAGRAD: oc.kind = KB_OPT_ADAGRAD; break;
        case CARLS__OPTIMIZER_KIND__OPT_ADAM: oc.kind = KB_OPT_ADAM; break;
        default: snprintf(err, errlen, "unknown optimizer %d", (int)opt->kind); return -1;
        }
        oc.learning_rate = opt->learning_rate;
        oc.momentum = opt->momentum;
        oc.beta1 = opt->beta1;
        oc.beta2 = opt->beta2;
        oc.epsilon = opt->epsilon;
        oc.initial_accumulator = opt->initial_accumulator;
    }
    kb_optimizer_config_defaults(&oc);
    if (kb_optimizer_config_validate(&oc, err, (int)errlen) != 0)
        return -1;
    out->optimizer = oc;

    const Carls__LazyUpdateConfig *lazy = in->lazy;
    out->immediate = lazy && lazy->policy == CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
    if (lazy && lazy->policy != CARLS__UPDATE_POLICY__UPDATE_LAZY && !out->immediate) {
        snprintf(err, errlen, "unknown update policy %d", (int)lazy->policy);
        return -1;
    }
    out->max_age_ms = lazy && lazy->max_age_ms ? lazy->max_age_ms : DEFAULT_MAX_AGE_MS;
    out->max_pending = lazy && lazy->max_pending ? lazy->max_pending : DEFAULT_MAX_PENDING;
    if (out->max_pending > CARLS_MAX_PENDING_LIMIT) {
        snprintf(err, errlen, "max_pending must be in 1..%u, got %u", CARLS_MAX_PENDING_LIMIT, out->max_pending);
        return -1;
    }
    if (lazy && lazy->outlier_rule == CARLS__OUTLIER_RULE__OUTLIER_NONE)
        out->outlier.rule = KB_OUTLIER_NONE;
    else if (!lazy || lazy->outlier_rule == CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN)
        out->outlier.rule = KB_OUTLIER_NORM_MEDIAN;
    else {
        snprintf(err, errlen, "unknown outlier rule %d", (int)lazy->outlier_rule);
        return -1;
    }
    out->outlier.threshold = lazy && lazy->outlier_threshold != 0.0f ? lazy->outlier_threshold
                                                                     : DEFAULT_OUTLIER_THRESHOLD;
    if (!isfinite(out->outlier.threshold) || out->outlier.threshold < 1.0f) {
        snprintf(err, errlen, "outlier_threshold must be finite and >= 1");
        return -1;
    }
    out->outlier.min_count = lazy && lazy->outlier_min_count ? lazy->outlier_min_count : DEFAULT_OUTLIER_MIN_COUNT;
    return 0;
}

void kb_table_config_to_proto(const kb_table_config_t *in, Carls__TableConfig *out, Carls__OptimizerConfig *opt,
                              Carls__LazyUpdateConfig *lazy)
{
    carls__table_config__init(out);
    carls__optimizer_config__init(opt);
    carls__lazy_update_config__init(lazy);
    out->kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
    out->dim = in->dim;
    out->init = (Carls__InitKind)in->init;
    out->init_scale = in->init_scale;
    out->init_seed = in->init_seed;
    opt->kind = (Carls__OptimizerKind)in->optimizer.kind;
    opt->learning_rate = in->optimizer.learning_rate;
    opt->momentum = in->optimizer.momentum;
    opt->beta1 = in->optimizer.beta1;
    opt->beta2 = in->optimizer.beta2;
    opt->epsilon = in->optimizer.epsilon;
    opt->initial_accumulator = in->optimizer.initial_accumulator;
    lazy->policy = in->immediate ? CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE : CARLS__UPDATE_POLICY__UPDATE_LAZY;
    lazy->max_age_ms = in->max_age_ms;
    lazy->max_pending = in->max_pending;
    lazy->outlier_rule = in->outlier.rule == KB_OUTLIER_NONE ? CARLS__OUTLIER_RULE__OUTLIER_NONE
                                                             : CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN;
    lazy->outlier_threshold = in->outlier.threshold;
    lazy->outlier_min_count = in->outlier.min_count;
    out->optimizer = opt;
    out->lazy = lazy;
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
    self->opt_floats = kb_optimizer_state_floats(cfg->optimizer.kind, cfg->dim);
    atomic_init(&self->next_row_id, 1);
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        pthread_mutex_init(&self->stripes[i].mutex, NULL);
        kb_rowmap_init(&self->stripes[i].map);
    }
    return self;
}

static void s_row_free(kb_row_t *row)
{
    if (!row)
        return;
    free(row->pending);
    free(row);
}

void kb_table_destroy(kb_table_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_table_t *self = *self_p;
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        for (size_t j = 0; j < st->map.capacity; j++)
            if (st->map.hashes[j])
                s_row_free(st->map.rows[j]);
        kb_rowmap_free(&st->map);
        pthread_mutex_destroy(&st->mutex);
    }
    free(self->name);
    free(self);
    *self_p = NULL;
}

int64_t kb_table_id(const kb_table_t *self) { return self->id; }
const char *kb_table_name(const kb_table_t *self) { return self->name; }
const kb_table_config_t *kb_table_config(const kb_table_t *self) { return &self->cfg; }

size_t kb_table_row_count(kb_table_t *self) { return (size_t)atomic_load(&self->stats.rows); }

void kb_table_get_stats(kb_table_t *self, kb_table_stats_t *out)
{
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
}

/* ---- rows (all s_row_* helpers run with the row's stripe locked) ---- */

static kb_stripe_t *s_stripe(kb_table_t *self, uint64_t hash)
{
    /* The row map uses the low bits of the hash; pick the stripe from the high bits so both stay uniform. */
    return &self->stripes[(hash >> 58) % KB_TABLE_STRIPES];
}

/* Allocates a row: one block holding the struct, value, optimizer state and key. */
static kb_row_t *s_row_alloc(kb_table_t *self, const uint8_t *key, uint32_t key_len)
{
    size_t floats = (size_t)self->cfg.dim + self->opt_floats;
    kb_row_t *row = carls_xcalloc(1, sizeof *row + floats * sizeof(float) + key_len);
    row->value = (float *)(row + 1);
    row->opt_state = row->value + self->cfg.dim;
    row->key = (uint8_t *)(row->opt_state + self->opt_floats);
    row->key_len = key_len;
    if (key_len)
        memcpy(row->key, key, key_len);
    return row;
}

static kb_row_t *s_row_create(kb_table_t *self, kb_stripe_t *st, uint64_t hash, const uint8_t *key,
                              uint32_t key_len)
{
    kb_row_t *row = s_row_alloc(self, key, key_len);
    row->id = atomic_fetch_add(&self->next_row_id, 1);
    kb_init_value(self->cfg.init, self->cfg.init_scale, self->cfg.init_seed, key, key_len, row->value,
                  self->cfg.dim);
    kb_optimizer_state_init(&self->cfg.optimizer, row->opt_state, self->cfg.dim);
    kb_rowmap_insert(&st->map, hash, row);
    atomic_fetch_add(&self->stats.rows, 1);
    return row;
}

static void s_mark_dirty(kb_stripe_t *st, kb_row_t *row)
{
    if (row->dirty)
        return;
    row->dirty = true;
    row->dirty_next = st->dirty_head;
    st->dirty_head = row;
}

static void s_pending_unlink(kb_stripe_t *st, kb_row_t *row)
{
    if (row->pending_prev)
        row->pending_prev->pending_next = row->pending_next;
    else
        st->pending_head = row->pending_next;
    if (row->pending_next)
        row->pending_next->pending_prev = row->pending_prev;
    else
        st->pending_tail = row->pending_prev;
    row->pending_prev = row->pending_next = NULL;
}

static void s_pending_append(kb_stripe_t *st, kb_row_t *row)
{
    row->pending_next = NULL;
    row->pending_prev = st->pending_tail;
    if (st->pending_tail)
        st->pending_tail->pending_next = row;
    else
        st->pending_head = row;
    st->pending_tail = row;
}

/* One optimizer step with gradient g; updates version and timestamp. */
static void s_row_step(kb_table_t *self, kb_row_t *row, const float *g)
{
    kb_optimizer_step(&self->cfg.optimizer, row->value, row->opt_state, &row->opt_steps, g, self->cfg.dim);
    row->version++;
    row->updated_at_ms = carls_wall_ms();
    atomic_fetch_add(&self->stats.updates_applied, 1);
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
        s_row_step(self, row, avg);
    if (avg != avg_small)
        free(avg);

    atomic_fetch_add(&self->stats.gradients_applied, kept);
    atomic_fetch_add(&self->stats.outliers_dropped, dropped);
    atomic_fetch_sub(&self->stats.pending_gradients, count);
    atomic_fetch_sub(&self->stats.pending_keys, 1);
    atomic_fetch_add(reason, 1);
    free(row->pending);
    row->pending = NULL;
    row->pending_count = 0;
    s_pending_unlink(st, row);
    s_mark_dirty(st, row);
}

/* ---- operations ---- */

uint64_t kb_table_lookup(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, bool no_create,
                         float *values, uint64_t *versions, int64_t *updated_at_ms, uint64_t *frequencies)
{
    uint32_t dim = self->cfg.dim;
    uint64_t steps = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t hash = kb_rowmap_hash(keys[i].data, keys[i].len);
        kb_stripe_t *st = s_stripe(self, hash);
        pthread_mutex_lock(&st->mutex);
        kb_row_t *row = kb_rowmap_find(&st->map, hash, keys[i].data, keys[i].len);
        if (!row && no_create) {
            pthread_mutex_unlock(&st->mutex);
            kb_init_value(self->cfg.init, self->cfg.init_scale, self->cfg.init_seed, keys[i].data, keys[i].len,
                          values + i * dim, dim);
            versions[i] = 0;
            updated_at_ms[i] = 0;
            frequencies[i] = 0;
            continue;
        }
        if (!row)
            row = s_row_create(self, st, hash, keys[i].data, (uint32_t)keys[i].len);
        if (row->pending_count > 0) {
            s_row_apply_pending(self, st, row, &self->stats.applied_on_lookup);
            steps++;
        }
        if (!no_create) {
            row->frequency++;
            s_mark_dirty(st, row);
        }
        memcpy(values + i * dim, row->value, dim * sizeof(float));
        versions[i] = row->version;
        updated_at_ms[i] = row->updated_at_ms;
        frequencies[i] = row->frequency;
        pthread_mutex_unlock(&st->mutex);
    }
    atomic_fetch_add(&self->stats.lookups, n);
    return steps;
}

void kb_table_put(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, const float *values,
                  uint64_t version)
{
    uint32_t dim = self->cfg.dim;
    int64_t now = carls_wall_ms();
    for (size_t i = 0; i < n; i++) {
        uint64_t hash = kb_rowmap_hash(keys[i].data, keys[i].len);
        kb_stripe_t *st = s_stripe(self, hash);
        pthread_mutex_lock(&st->mutex);
        kb_row_t *row = kb_rowmap_find(&st->map, hash, keys[i].data, keys[i].len);
        if (!row)
            row = s_row_create(self, st, hash, keys[i].data, (uint32_t)keys[i].len);
        memcpy(row->value, values + i * dim, dim * sizeof(float));
        row->version = version;
        row->updated_at_ms = now;
        s_mark_dirty(st, row);
        pthread_mutex_unlock(&st->mutex);
    }
    atomic_fetch_add(&self->stats.puts, n);
}

uint64_t kb_table_push(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, const float *gradients)
{
    uint32_t dim = self->cfg.dim;
    uint64_t steps = 0;
    for (size_t i = 0; i < n; i++) {
        const float *g = gradients + i * dim;
        uint64_t hash = kb_rowmap_hash(keys[i].data, keys[i].len);
        kb_stripe_t *st = s_stripe(self, hash);
        pthread_mutex_lock(&st->mutex);
        kb_row_t *row = kb_rowmap_find(&st->map, hash, keys[i].data, keys[i].len);
        if (!row)
            row = s_row_create(self, st, hash, keys[i].data, (uint32_t)keys[i].len);
        row->frequency++;
        if (self->cfg.immediate) {
            s_row_step(self, row, g);
            atomic_fetch_add(&self->stats.gradients_applied, 1);
            steps++;
        } else {
            if (row->pending_count == 0) {
                row->pending = carls_xmalloc((size_t)self->cfg.max_pending * dim * sizeof(float));
                row->pending_since_ms = carls_monotonic_ms();
                s_pending_append(st, row);
                atomic_fetch_add(&self->stats.pending_keys, 1);
            }
            memcpy(row->pending + (size_t)row->pending_count * dim, g, dim * sizeof(float));
            row->pending_count++;
            atomic_fetch_add(&self->stats.pending_gradients, 1);
            if (row->pending_count >= self->cfg.max_pending) {
                s_row_apply_pending(self, st, row, &self->stats.applied_on_count);
                steps++;
            }
        }
        s_mark_dirty(st, row);
        pthread_mutex_unlock(&st->mutex);
    }
    atomic_fetch_add(&self->stats.gradients_received, n);
    return steps;
}

uint64_t kb_table_expire(kb_table_t *self, int64_t now_ms)
{
    if (self->cfg.immediate)
        return 0;
    uint64_t applied = 0;
    int64_t max_age = self->cfg.max_age_ms;
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        /* The list is in arrival order of each key's first pending gradient, so stop at the first young one. */
        while (st->pending_head && now_ms - st->pending_head->pending_since_ms >= max_age) {
            s_row_apply_pending(self, st, st->pending_head, &self->stats.applied_on_age);
            applied++;
        }
        pthread_mutex_unlock(&st->mutex);
    }
    return applied;
}

int kb_table_restore_row(kb_table_t *self, const kb_store_row_t *rec)
{
    if (rec->dim != self->cfg.dim || rec->opt_floats != self->opt_floats ||
        rec->pending_count > self->cfg.max_pending || rec->key_len == 0)
        return -1;
    uint64_t hash = kb_rowmap_hash(rec->key, rec->key_len);
    kb_stripe_t *st = s_stripe(self, hash);
    if (kb_rowmap_find(&st->map, hash, rec->key, rec->key_len))
        return -1;
    kb_row_t *row = s_row_alloc(self, rec->key, rec->key_len);
    row->id = rec->row_id;
    row->version = rec->version;
    row->frequency = rec->frequency;
    row->opt_steps = rec->opt_steps;
    row->updated_at_ms = rec->updated_at_ms;
    memcpy(row->value, rec->value, (size_t)rec->dim * sizeof(float));
    if (rec->opt_floats)
        memcpy(row->opt_state, rec->opt_state, (size_t)rec->opt_floats * sizeof(float));
    if (rec->pending_count > 0) {
        row->pending = carls_xmalloc((size_t)self->cfg.max_pending * rec->dim * sizeof(float));
        memcpy(row->pending, rec->pending, (size_t)rec->pending_count * rec->dim * sizeof(float));
        row->pending_count = rec->pending_count;
        /* The monotonic clock does not survive a restart: restored pending sets start their age now. */
        row->pending_since_ms = carls_monotonic_ms();
        s_pending_append(st, row);
        atomic_fetch_add(&self->stats.pending_keys, 1);
        atomic_fetch_add(&self->stats.pending_gradients, rec->pending_count);
    }
    kb_rowmap_insert(&st->map, hash, row);
    atomic_fetch_add(&self->stats.rows, 1);
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
    rec->dim = dim;
    rec->value = carls_xmalloc(dim * sizeof(float));
    memcpy(rec->value, row->value, dim * sizeof(float));
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
    rec->version = row->version;
    rec->updated_at_ms = row->updated_at_ms;
    rec->frequency = row->frequency;
}

void kb_table_take_dirty(kb_table_t *self, kb_store_row_t **out, size_t *count, size_t *capacity)
{
    for (int i = 0; i < KB_TABLE_STRIPES; i++) {
        kb_stripe_t *st = &self->stripes[i];
        pthread_mutex_lock(&st->mutex);
        for (kb_row_t *row = st->dirty_head; row;) {
            kb_row_t *next = row->dirty_next;
            if (*count == *capacity) {
                *capacity = *capacity ? *capacity * 2 : 256;
                *out = carls_xrealloc(*out, *capacity * sizeof **out);
            }
            s_snapshot_row(self, row, &(*out)[(*count)++]);
            row->dirty = false;
            row->dirty_next = NULL;
            row = next;
        }
        st->dirty_head = NULL;
        pthread_mutex_unlock(&st->mutex);
    }
}
