/* Item-indexed calls to the knowledge bank (see km_bank.h). */
#include "km_bank.h"

#include "kb_cluster.h"

#include "log.h"
#include "util.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct km_bank {
    kb_cluster_t *bank;  /* one endpoint, or a sharded bank's endpoints */
    char error[1024];    /* last error */
    bool unreachable;    /* the last failure was the bank's absence (see km_bank_unreachable) */
};

int km_tables_init(km_tables_t *t, const char *prefix)
{
    if (!prefix || !*prefix || strlen(prefix) + 8 >= KM_TABLE_NAME_MAX) {
        return -1;
    }
    snprintf(t->pixels, sizeof t->pixels, "%s.pixels", prefix);
    snprintf(t->emb, sizeof t->emb, "%s.emb", prefix);
    snprintf(t->graph, sizeof t->graph, "%s.graph", prefix);
    snprintf(t->labels, sizeof t->labels, "%s.labels", prefix);
    return 0;
}

size_t km_item_key(uint32_t item, char *buf) { return carls_item_key(item, buf); }

uint32_t km_key_item(const void *data, size_t len) { return carls_key_item(data, len); }

km_bank_t *km_bank_new(const char *endpoints, int timeout_ms, const kb_client_curve_t *curve)
{
    if (!endpoints || !*endpoints) {
        LOG_ERROR("no knowledge-bank endpoint");
        return NULL;
    }
    kb_client_options_t opts = {.timeout_ms = timeout_ms > 0 ? timeout_ms : 60000, .retries = 2, .curve = curve};
    kb_cluster_t *c = kb_cluster_new(endpoints, &opts);
    if (!c) {
        return NULL;
    }
    km_bank_t *b = carls_xcalloc(1, sizeof *b);
    b->bank = c;
    return b;
}

void km_bank_destroy(km_bank_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    kb_cluster_destroy(&(*self_p)->bank);
    free(*self_p);
    *self_p = NULL;
}

const char *km_bank_error(const km_bank_t *self)
{
    return self->error;
}

/* Records the client's error after a failed call and returns rc. */
static int s_fail(km_bank_t *self, int rc, const char *what, const char *table)
{
    const char *err = kb_cluster_last_error(self->bank);
    snprintf(self->error, sizeof self->error, "%s %s: %s", what, table, err);
    self->unreachable = rc == KB_CLIENT_ETIMEOUT || rc == KB_CLIENT_EIO ||
                        (rc == KB_CLIENT_ESTATUS &&
                         kb_cluster_last_status(self->bank) == CARLS__STATUS_CODE__STATUS_UNAVAILABLE);
    return rc;
}

bool km_bank_unreachable(const km_bank_t *self)
{
    return self->unreachable;
}

/* items[0..n) taken in chunks of at most `size` (one request each): the keys of one chunk at a time, in
 * buffers kept for the whole call. */
typedef struct {
    const uint32_t *items;
    size_t n, size;
    size_t off, m;  /* the current chunk: items[off .. off + m) */
    kb_key_t *keys; /* (size) the current chunk's keys, pointing into text */
    char *text;     /* (size * 11) */
} s_chunks_t;

static s_chunks_t s_chunks(const uint32_t *items, size_t n, size_t size)
{
    return (s_chunks_t){.items = items, .n = n, .size = size, .keys = carls_xmalloc(sizeof(kb_key_t) * size),
                        .text = carls_xmalloc(11 * size)};
}

/* Moves to the next chunk and makes its keys; false after the last one. */
static bool s_chunk_next(s_chunks_t *c)
{
    c->off += c->m;
    if (c->off >= c->n) {
        return false;
    }
    c->m = c->n - c->off < c->size ? c->n - c->off : c->size;
    for (size_t i = 0; i < c->m; i++) {
        char *k = c->text + i * 11;
        c->keys[i].len = km_item_key(c->items[c->off + i], k);
        c->keys[i].data = k;
    }
    return true;
}

static void s_chunks_free(s_chunks_t *c)
{
    free(c->keys);
    free(c->text);
}

int km_bank_create_embedding(km_bank_t *self, const char *table, uint32_t dim)
{
    Carls__KnnConfig knn = CARLS__KNN_CONFIG__INIT;
    knn.spec = "Flat";
    knn.metric = CARLS__KNN_METRIC__METRIC_COSINE;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
    cfg.dim = dim;
    cfg.knn = &knn;
    int rc = kb_cluster_create_table(self->bank, table, &cfg, true);
    return rc ? s_fail(self, rc, "create_table", table) : 0;
}

int km_bank_create_feature(km_bank_t *self, const char *table)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    int rc = kb_cluster_create_table(self->bank, table, &cfg, true);
    return rc ? s_fail(self, rc, "create_table", table) : 0;
}

int km_bank_put(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t dim,
                const float *values, uint64_t version)
{
    s_chunks_t ch = s_chunks(items, n, KM_BANK_CHUNK);
    int rc = 0;
    while (rc == 0 && s_chunk_next(&ch)) {
        rc = kb_cluster_put(self->bank, table, ch.keys, ch.m, dim, values + ch.off * dim, version);
        if (rc) {
            s_fail(self, rc, "put", table);
        }
    }
    s_chunks_free(&ch);
    return rc;
}

int km_bank_lookup(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t dim,
                   float *values, uint64_t *versions, int64_t *updated_at_ms)
{
    s_chunks_t ch = s_chunks(items, n, KM_BANK_CHUNK);
    kb_row_meta_t *meta = carls_xmalloc(sizeof *meta * KM_BANK_CHUNK);
    float *scratch = values ? NULL : carls_xmalloc(sizeof(float) * KM_BANK_CHUNK * dim);
    int rc = 0;
    while (rc == 0 && s_chunk_next(&ch)) {
        rc = kb_cluster_lookup_ex(self->bank, table, ch.keys, ch.m, dim, true,
                                  values ? values + ch.off * dim : scratch, meta);
        if (rc) {
            s_fail(self, rc, "lookup", table);
            break;
        }
        for (size_t i = 0; i < ch.m; i++) {
            if (versions) {
                versions[ch.off + i] = meta[i].version;
            }
            if (updated_at_ms) {
                updated_at_ms[ch.off + i] = meta[i].updated_at_ms;
            }
        }
    }
    s_chunks_free(&ch);
    free(meta);
    free(scratch);
    return rc;
}

int km_bank_knn(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t k, uint32_t *nbr,
                float *score)
{
    /* 1024 queries per request: keeps each answer (1024 * k keys) small */
    s_chunks_t ch = s_chunks(items, n, 1024);
    int rc = 0;
    while (rc == 0 && s_chunk_next(&ch)) {
        size_t off = ch.off, m = ch.m;
        kb_knn_result_t *res = NULL;
        rc = kb_cluster_knn_by_key(self->bank, table, ch.keys, m, k, true, &res);
        if (rc) {
            s_fail(self, rc, "knn", table);
            break;
        }
        /* k slots per query, best first; an empty slot (fewer rows) has no key and reads as KM_NO_ITEM. */
        for (size_t i = 0; i < m * k; i++) {
            uint32_t item = km_key_item(res->keys[i].data, res->keys[i].len);
            nbr[off * k + i] = item;
            score[off * k + i] = item == KM_NO_ITEM ? 0.0f : res->scores[i];
        }
        kb_knn_result_destroy(&res);
    }
    s_chunks_free(&ch);
    return rc;
}

/* Sends records (one per item) with feature_put, in chunks. */
static int s_feature_put(km_bank_t *self, const char *table, const uint32_t *items, size_t n,
                         Carls__FeatureRecord *records)
{
    s_chunks_t ch = s_chunks(items, n, KM_BANK_CHUNK);
    const Carls__FeatureRecord **ptrs = carls_xmalloc(sizeof *ptrs * KM_BANK_CHUNK);
    int rc = 0;
    while (rc == 0 && s_chunk_next(&ch)) {
        for (size_t i = 0; i < ch.m; i++) {
            ptrs[i] = &records[ch.off + i];
        }
        rc = kb_cluster_feature_put(self->bank, table, ch.keys, ch.m, ptrs);
        if (rc) {
            s_fail(self, rc, "feature_put", table);
        }
    }
    s_chunks_free(&ch);
    free(ptrs);
    return rc;
}

int km_bank_put_neighbors(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t k,
                          const uint32_t *nbr, const float *weight, uint64_t version)
{
    Carls__FeatureRecord *rec = carls_xcalloc(n ? n : 1, sizeof *rec);
    ProtobufCBinaryData *keys = carls_xcalloc(n * k + 1, sizeof *keys);
    float *w = carls_xcalloc(n * k + 1, sizeof *w);
    char *text = carls_xmalloc(11 * (n * k + 1));
    for (size_t i = 0; i < n; i++) {
        carls__feature_record__init(&rec[i]);
        rec[i].version = version;
        size_t c = 0;
        for (uint32_t j = 0; j < k; j++) {
            uint32_t it = nbr[i * k + j];
            if (it == KM_NO_ITEM) {
                continue;
            }
            char *s = text + (i * k + c) * 11;
            keys[i * k + c].len = km_item_key(it, s);
            keys[i * k + c].data = (uint8_t *)s;
            w[i * k + c] = weight[i * k + j];
            c++;
        }
        rec[i].n_neighbor_keys = c;
        rec[i].neighbor_keys = keys + i * k;
        rec[i].n_neighbor_weights = c;
        rec[i].neighbor_weights = w + i * k;
    }
    int rc = s_feature_put(self, table, items, n, rec);
    free(rec);
    free(keys);
    free(w);
    free(text);
    return rc;
}

int km_bank_put_labels(km_bank_t *self, const char *table, const uint32_t *items, size_t n, const int32_t *label,
                       const float *confidence, uint64_t version)
{
    Carls__FeatureRecord *rec = carls_xcalloc(n ? n : 1, sizeof *rec);
    for (size_t i = 0; i < n; i++) {
        carls__feature_record__init(&rec[i]);
        rec[i].version = version;
        rec[i].label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
        rec[i].int_label = label[i];
        rec[i].label_confidence = confidence[i];
    }
    int rc = s_feature_put(self, table, items, n, rec);
    free(rec);
    return rc;
}

/* feature_get of items[0..n) in chunks; calls fn(ctx, index, record) for each item in order and, when versions
 * is not NULL, sets versions[index] to the record's version (0 for an item without one). */
static int s_feature_get(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint64_t *versions,
                         void (*fn)(void *ctx, size_t i, const Carls__FeatureRecord *r), void *ctx)
{
    s_chunks_t ch = s_chunks(items, n, KM_BANK_CHUNK);
    int rc = 0;
    while (rc == 0 && s_chunk_next(&ch)) {
        kb_feature_result_t *res = NULL;
        rc = kb_cluster_feature_get(self->bank, table, ch.keys, ch.m, &res);
        if (rc) {
            s_fail(self, rc, "feature_get", table);
            break;
        }
        for (size_t i = 0; i < ch.m; i++) {
            const Carls__FeatureRecord *r = res->records[i];
            fn(ctx, ch.off + i, r);
            if (versions) {
                versions[ch.off + i] = r->found ? r->version : 0;
            }
        }
        kb_feature_result_destroy(&res);
    }
    s_chunks_free(&ch);
    return rc;
}

typedef struct {
    uint32_t k;
    uint32_t *nbr;
    float *weight;
} s_nbr_ctx_t;

static void s_take_neighbors(void *ctx, size_t i, const Carls__FeatureRecord *r)
{
    s_nbr_ctx_t *c = ctx;
    size_t have = r->found ? r->n_neighbor_keys : 0;
    if (have > r->n_neighbor_weights) {
        have = r->n_neighbor_weights;
    }
    for (uint32_t j = 0; j < c->k; j++) {
        uint32_t it = KM_NO_ITEM;
        if (j < have) {
            it = km_key_item(r->neighbor_keys[j].data, r->neighbor_keys[j].len);
        }
        c->nbr[i * c->k + j] = it;
        c->weight[i * c->k + j] = it == KM_NO_ITEM ? 0.0f : r->neighbor_weights[j];
    }
}

int km_bank_get_neighbors(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t k,
                          uint32_t *nbr, float *weight, uint64_t *versions)
{
    s_nbr_ctx_t ctx = {.k = k, .nbr = nbr, .weight = weight};
    return s_feature_get(self, table, items, n, versions, s_take_neighbors, &ctx);
}

typedef struct {
    int32_t *label;
    float *confidence;
} s_label_ctx_t;

static void s_take_label(void *ctx, size_t i, const Carls__FeatureRecord *r)
{
    s_label_ctx_t *c = ctx;
    bool has = r->found && r->label_case == CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
    c->label[i] = has ? (int32_t)r->int_label : -1;
    c->confidence[i] = has ? r->label_confidence : 0.0f;
}

int km_bank_get_labels(km_bank_t *self, const char *table, const uint32_t *items, size_t n, int32_t *label,
                       float *confidence, uint64_t *versions)
{
    s_label_ctx_t ctx = {.label = label, .confidence = confidence};
    return s_feature_get(self, table, items, n, versions, s_take_label, &ctx);
}
