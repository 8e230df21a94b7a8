/* The cluster's row operations (contract in kb_cluster.h): lookup, put and push_gradients, and feature
 * records, each with its keys split by shard through the fan-out engine (kb_cluster_internal.h) and the
 * answers scattered back to the caller's key order. */
#include "kb_cluster.h"
#include "kb_cluster_internal.h"

#include "util.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* ---- rows ------------------------------------------------------------------------------------------- */

/* Common argument checks of the row operations. 0 or KB_CLIENT_EINVAL (error set). */
static int s_row_args(kb_cluster_t *self, const char *what, const char *table, size_t n, uint32_t dim)
{
    if (!table || !*table) {
        kb_cluster_set_error(self, "%s: no table name", what);
        return KB_CLIENT_EINVAL;
    }
    if (dim == 0) {
        kb_cluster_set_error(self, "%s: dim is 0", what);
        return KB_CLIENT_EINVAL;
    }
    if (n > SIZE_MAX / sizeof(float) / dim) {
        kb_cluster_set_error(self, "%s: %zu rows of dim %u overflow", what, n, dim);
        return KB_CLIENT_EINVAL;
    }
    return 0;
}

/* put and push_gradients: gives each shard's operation its rows (n * dim floats in the caller's key order).
 * With several shards the rows are copied into shard order so each request points at one block; with one,
 * the order is the caller's and the rows are used as they are. */
static void s_fan_rows(kb_cluster_t *self, kb_cluster_fan_t *fan, const float *rows, uint32_t dim)
{
    const kb_cluster_split_t *sp = &fan->sp;
    const float *ordered = rows;
    if (self->n > 1) {
        size_t n = sp->start[self->n - 1] + sp->count[self->n - 1];
        fan->rows = carls_xmalloc(n * dim * sizeof *fan->rows);
        for (size_t j = 0; j < n; j++)
            memcpy(fan->rows + j * dim, rows + sp->order[j] * dim, dim * sizeof(float));
        ordered = fan->rows;
    }
    for (uint32_t s = 0; s < self->n; s++) {
        size_t c = sp->count[s];
        if (c == 0)
            continue;
        float *block = (float *)ordered + sp->start[s] * dim; /* packing only reads it */
        if (fan->reqs[s].op_case == CARLS__REQUEST__OP_PUT) {
            fan->ops[s].put.n_values = c * dim;
            fan->ops[s].put.values = block;
        } else {
            fan->ops[s].push_gradients.n_gradients = c * dim;
            fan->ops[s].push_gradients.gradients = block;
        }
    }
}

int kb_cluster_lookup_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                           bool no_create, kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    *pending_out = NULL;
    int rc = s_row_args(self, "lookup", table, n, dim);
    if (rc != 0)
        return rc;
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_LOOKUP);
    p->dim = dim;
    rc = kb_cluster_fan_keys(self, &p->fan, "lookup", CARLS__REQUEST__OP_LOOKUP, keys, n);
    if (rc != 0) {
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    for (uint32_t s = 0; s < self->n; s++)
        p->fan.ops[s].lookup.no_create = no_create; /* (unused where nothing is sent) */
    return kb_cluster_pending_send(self, p, pending_out);
}

/* Checks a lookup answer for n keys of table (dim dim) before anything is copied out of it: KB_CLIENT_EINVAL
 * when the table's dim differs, KB_CLIENT_EMALFORMED when it holds another number of values than n * dim or (when
 * with_meta) of metadata records than n; the reason in err. 0 when it fits. */
static int s_check_lookup(const Carls__LookupResult *res, const char *table, size_t n, uint32_t dim, bool with_meta,
                          char *err, size_t errlen)
{
    if (res->dim != dim)
        return carls_errorf(err, errlen, KB_CLIENT_EINVAL, "lookup in %s: the table has dim %u, the caller expected %u",
                            table, res->dim, dim);
    if (res->n_values != n * dim)
        return carls_errorf(err, errlen, KB_CLIENT_EMALFORMED,
                            "lookup in %s: the server sent %zu values for %zu keys of dim %u", table, res->n_values, n,
                            dim);
    if (with_meta && (res->n_versions != n || res->n_updated_at_ms != n || res->n_frequencies != n))
        return carls_errorf(err, errlen, KB_CLIENT_EMALFORMED,
                            "lookup in %s: the server sent metadata for %zu/%zu/%zu rows, not %zu", table,
                            res->n_versions, res->n_updated_at_ms, res->n_frequencies, n);
    return 0;
}

/* Checks every shard's lookup answer, then copies the rows (when values_out is not NULL) and the metadata
 * (when meta_out is not NULL) to the caller's key order. Nothing is copied when any answer fails its check. */
static int s_lookup_scatter(kb_cluster_t *self, const kb_cluster_fan_t *fan, uint32_t dim, float *values_out,
                            kb_row_meta_t *meta_out)
{
    const kb_cluster_split_t *sp = &fan->sp;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        char what[512];
        int rc = s_check_lookup(fan->resps[s]->lookup, fan->table, sp->count[s], dim, meta_out != NULL, what,
                                sizeof what);
        if (rc != 0) {
            kb_cluster_shard_error(self, s, what);
            return rc;
        }
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        const Carls__LookupResult *res = fan->resps[s]->lookup;
        for (size_t j = 0; j < sp->count[s]; j++) {
            size_t i = sp->order[sp->start[s] + j];
            if (values_out)
                memcpy(values_out + i * dim, res->values + j * dim, dim * sizeof(float));
            if (meta_out) {
                meta_out[i].version = res->versions[j];
                meta_out[i].updated_at_ms = res->updated_at_ms[j];
                meta_out[i].frequency = res->frequencies[j];
            }
        }
    }
    return 0;
}

int kb_cluster_lookup_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, float *values_out,
                           kb_row_meta_t *meta_out)
{
    assert(self && pending_p && *pending_p && (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_LOOKUP);
    kb_cluster_clear_error(self);
    kb_cluster_pending_t *p = *pending_p;
    int rc = kb_cluster_fan_wait(self, &p->fan);
    if (rc == 0)
        rc = s_lookup_scatter(self, &p->fan, p->dim, values_out, meta_out);
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_lookup(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                      float *values_out, kb_row_meta_t *meta_out)
{
    return kb_cluster_lookup_ex(self, table, keys, n, dim, false, values_out, meta_out);
}

int kb_cluster_lookup_ex(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                         bool no_create, float *values_out, kb_row_meta_t *meta_out)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!values_out) {
        kb_cluster_set_error(self, "lookup: no values");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_lookup_send(self, table, keys, n, dim, no_create, &p);
    return rc != 0 ? rc : kb_cluster_lookup_wait(self, &p, values_out, meta_out);
}

/* put and push_gradients: rows (n * dim floats) split by shard, sent without waiting. */
static int s_write_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                        const float *rows, Carls__Request__OpCase op, uint64_t version,
                        kb_cluster_pending_t **pending_out)
{
    const char *what = op == CARLS__REQUEST__OP_PUT ? "put" : "push_gradients";
    *pending_out = NULL;
    int rc = s_row_args(self, what, table, n, dim);
    if (rc == 0 && !rows) {
        kb_cluster_set_error(self, "%s: no values", what);
        rc = KB_CLIENT_EINVAL;
    }
    if (rc != 0)
        return rc;
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_WRITE);
    rc = kb_cluster_fan_keys(self, &p->fan, what, op, keys, n);
    if (rc != 0) {
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    s_fan_rows(self, &p->fan, rows, dim);
    for (uint32_t s = 0; op == CARLS__REQUEST__OP_PUT && s < self->n; s++)
        p->fan.ops[s].put.version = version;
    rc = kb_cluster_pending_send(self, p, pending_out);
    /* The requests are packed: the rows in shard order are not needed any more. */
    if (rc == 0) {
        free((*pending_out)->fan.rows);
        (*pending_out)->fan.rows = NULL;
    }
    return rc;
}

int kb_cluster_push_gradients_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                                   uint32_t dim, const float *gradients, kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    return s_write_send(self, table, keys, n, dim, gradients, CARLS__REQUEST__OP_PUSH_GRADIENTS, 0, pending_out);
}

/* Collects the acknowledgements of a put or push_gradients sent by s_write_send; frees *pending_p. */
static int s_write_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p)
{
    assert(self && pending_p && *pending_p && (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_WRITE);
    kb_cluster_clear_error(self);
    int rc = kb_cluster_fan_wait(self, &(*pending_p)->fan);
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_push_gradients_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p)
{
    return s_write_wait(self, pending_p);
}

int kb_cluster_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                   const float *values, uint64_t version)
{
    assert(self);
    kb_cluster_clear_error(self);
    kb_cluster_pending_t *p = NULL;
    int rc = s_write_send(self, table, keys, n, dim, values, CARLS__REQUEST__OP_PUT, version, &p);
    return rc != 0 ? rc : s_write_wait(self, &p);
}

int kb_cluster_push_gradients(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                              uint32_t dim, const float *gradients)
{
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_push_gradients_send(self, table, keys, n, dim, gradients, &p);
    return rc != 0 ? rc : kb_cluster_push_gradients_wait(self, &p);
}

/* ---- feature records -------------------------------------------------------------------------------- */

void kb_feature_result_destroy(kb_feature_result_t **result_p)
{
    if (!result_p || !*result_p)
        return;
    kb_feature_result_t *r = *result_p;
    for (size_t i = 0; i < r->n_responses; i++)
        if (r->responses[i])
            carls__response__free_unpacked(r->responses[i], NULL);
    free(r->responses);
    free(r->records);
    free(r);
    *result_p = NULL;
}

int kb_cluster_feature_get_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                                kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    *pending_out = NULL;
    if (!table || !*table) {
        kb_cluster_set_error(self, "feature_get: no table name");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_FEATURES);
    int rc = kb_cluster_fan_keys(self, &p->fan, "feature_get", CARLS__REQUEST__OP_FEATURE_GET, keys, n);
    if (rc != 0) {
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    return kb_cluster_pending_send(self, p, pending_out);
}

int kb_cluster_feature_get_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, kb_feature_result_t **out)
{
    assert(self && out && pending_p && *pending_p &&
           (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_FEATURES);
    kb_cluster_clear_error(self);
    *out = NULL;
    kb_cluster_fan_t *fan = &(*pending_p)->fan;
    int rc = kb_cluster_fan_wait(self, fan);
    if (rc != 0)
        goto cleanup;
    const kb_cluster_split_t *sp = &fan->sp;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        const Carls__FeatureResult *res = fan->resps[s]->features;
        bool ok = res->n_records == sp->count[s];
        for (size_t j = 0; ok && j < res->n_records; j++)
            ok = res->records[j] != NULL;
        if (!ok) {
            kb_cluster_shard_errorf(self, s, "feature_get: the server sent %zu records for %zu keys", res->n_records,
                                    sp->count[s]);
            rc = KB_CLIENT_EMALFORMED;
            goto cleanup;
        }
    }
    const size_t n = sp->start[self->n - 1] + sp->count[self->n - 1];
    kb_feature_result_t *r = carls_xcalloc(1, sizeof *r);
    r->n = n;
    r->records = carls_xcalloc(n, sizeof *r->records);
    r->responses = carls_xcalloc(self->n, sizeof *r->responses);
    r->n_responses = self->n;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        for (size_t j = 0; j < sp->count[s]; j++)
            r->records[sp->order[sp->start[s] + j]] = fan->resps[s]->features->records[j];
        r->responses[s] = fan->resps[s];
        fan->resps[s] = NULL;
    }
    *out = r;
cleanup:
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_feature_get(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           kb_feature_result_t **out)
{
    assert(self && out);
    *out = NULL;
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_feature_get_send(self, table, keys, n, &p);
    return rc != 0 ? rc : kb_cluster_feature_get_wait(self, &p, out);
}

int kb_cluster_feature_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           const Carls__FeatureRecord *const *records)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!table || !*table) {
        kb_cluster_set_error(self, "feature_put: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (!records) {
        kb_cluster_set_error(self, "feature_put: no records");
        return KB_CLIENT_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!records[i]) {
            kb_cluster_set_error(self, "feature_put: record %zu is missing", i);
            return KB_CLIENT_EINVAL;
        }
    }
    kb_cluster_fan_t fan;
    kb_cluster_fan_init(self, &fan, table, CARLS__RESPONSE__RESULT_WRITE);
    int rc = kb_cluster_fan_keys(self, &fan, "feature_put", CARLS__REQUEST__OP_FEATURE_PUT, keys, n);
    if (rc == 0) {
        const kb_cluster_split_t *sp = &fan.sp;
        fan.records = carls_xmalloc(n * sizeof *fan.records);
        for (size_t j = 0; j < n; j++)
            fan.records[j] = (Carls__FeatureRecord *)records[sp->order[j]]; /* packing only reads them */
        for (uint32_t s = 0; s < self->n; s++) {
            if (sp->count[s] == 0)
                continue;
            fan.ops[s].feature_put.n_records = sp->count[s];
            fan.ops[s].feature_put.records = fan.records + sp->start[s];
        }
        rc = kb_cluster_fan_run(self, &fan);
    }
    kb_cluster_fan_free(self, &fan);
    return rc;
}
