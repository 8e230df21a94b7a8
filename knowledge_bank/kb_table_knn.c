/* The table's nearest-neighbour index (flushes of changed rows, searches) and candidate sampling (sampling
 * snapshots of the rows), over the table's state in kb_table_internal.h; the API is kb_table.h. */
#include "kb_table.h"
#include "kb_table_internal.h"

#include "util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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

/* Anything that changes rows or frequencies moves this. */
static uint64_t s_activity(kb_table_t *self)
{
    return atomic_load(&self->stats.lookups) + atomic_load(&self->stats.gradients_received) +
           atomic_load(&self->stats.puts) + atomic_load(&self->stats.evictions) + atomic_load(&self->stats.rows);
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
