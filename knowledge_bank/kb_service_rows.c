/* The service's operations on rows with their whole state (scan, import_rows) and on snapshots, over the
 * service's state and helpers in kb_service_internal.h (the dispatch table is in kb_service.c). */
#include "kb_service.h"
#include "kb_service_internal.h"

#include "kb_snapshot.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- rows with their whole state: scan's state fields, import_rows (docs/STATE.md "Export and import") ---- */

/* Fills the scan answer's state fields from the n row snapshots (each taken under its row's lock). */
static void s_scan_state(kb_service_reply_t *rp, const kb_table_config_t *cfg, const kb_store_row_t *rows, size_t n,
                         Carls__ScanResult *res)
{
    uint32_t opt_floats =
        cfg->kind == KB_TABLE_EMBEDDING ? kb_optimizer_state_floats(cfg->optimizer.kind, cfg->dim) : 0;
    size_t pending_floats = 0;
    for (size_t i = 0; i < n; i++)
        pending_floats += (size_t)rows[i].pending_count * cfg->dim;
    res->opt_floats = opt_floats;
    res->n_opt_state = n * opt_floats;
    size_t opt_total = n * opt_floats;
    res->opt_state = kb_service_own(rp, carls_xmalloc((opt_total > 0 ? opt_total : 1) * sizeof(float)));
    res->n_opt_steps = res->n_updated_at_ms = res->n_pending_counts = n;
    res->opt_steps = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->opt_steps));
    res->updated_at_ms = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->updated_at_ms));
    res->pending_counts = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->pending_counts));
    res->n_pending = pending_floats;
    res->pending = kb_service_own(rp, carls_xmalloc((pending_floats ? pending_floats : 1) * sizeof(float)));
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const kb_store_row_t *r = &rows[i];
        if (opt_floats && r->opt_floats == opt_floats)
            memcpy(res->opt_state + i * opt_floats, r->opt_state, opt_floats * sizeof(float));
        else if (opt_floats)
            memset(res->opt_state + i * opt_floats, 0, opt_floats * sizeof(float));
        res->opt_steps[i] = r->opt_steps;
        res->updated_at_ms[i] = r->updated_at_ms;
        res->pending_counts[i] = r->pending_count;
        size_t floats = (size_t)r->pending_count * cfg->dim;
        if (floats)
            memcpy(res->pending + at, r->pending, floats * sizeof(float));
        at += floats;
    }
}

/* Rows per scan page: a page carries each row's whole state, up to dim + optimizer floats + max_pending * dim
 * floats for an embedding table, and a client refuses frames over the protocol's message cap, so a page's
 * floats are kept to 4 Mi (16 MiB) -- at least one row. */
#define S_SCAN_PAGE_FLOATS ((size_t)4 << 20)

static uint32_t s_scan_page_rows(const kb_table_config_t *cfg, uint32_t limit)
{
    if (cfg->kind != KB_TABLE_EMBEDDING)
        return limit;
    size_t per_row = (size_t)cfg->dim + kb_optimizer_state_floats(cfg->optimizer.kind, cfg->dim) +
                     (cfg->immediate ? 0 : (size_t)cfg->max_pending * cfg->dim);
    size_t rows = S_SCAN_PAGE_FLOATS / per_row;
    return rows < 1 ? 1 : rows < limit ? (uint32_t)rows : limit;
}

/* Fails rp for import row i, naming its index and key (printable bytes, others as '?'). */
static int s_import_fail(kb_service_reply_t *rp, Carls__StatusCode status, size_t i, const ProtobufCBinaryData *key,
                         const char *what)
{
    char shown[41];
    size_t len = key->len < sizeof shown - 1 ? key->len : sizeof shown - 1;
    for (size_t j = 0; j < len; j++)
        shown[j] = key->data[j] >= 0x20 && key->data[j] < 0x7f ? (char)key->data[j] : '?';
    shown[len] = '\0';
    return kb_service_fail(rp, status, "import_rows: row %zu (key '%s%s'): %s", i, shown, key->len > len ? "..." : "",
                           what);
}

/* Checks an import_rows request against table t's config: every per-key array has one entry per key, values
 * of dim finite floats, optimizer state of 0 or the table's floats per row (finite; AdaGrad's accumulators and
 * Adam's second moments not negative), pending gradients within max_pending (lazy embedding tables only) and
 * finite, feature records as feature_put checks them. 0, or -1 with the first bad row named. */
static int s_check_import(kb_service_t *self, kb_service_reply_t *rp, kb_table_t *t, const Carls__ImportRows *im)
{
    const kb_table_config_t *cfg = kb_table_config(t);
    bool feature = cfg->kind == KB_TABLE_FEATURE;
    size_t n = im->n_keys;
    uint32_t dim = cfg->dim;
    uint32_t opt_floats = feature ? 0 : kb_optimizer_state_floats(cfg->optimizer.kind, dim);
    if (im->n_versions != n || im->n_frequencies != n || im->n_opt_steps != n || im->n_updated_at_ms != n ||
        im->n_pending_counts != n)
        return kb_service_fail(
            rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
            "import_rows: %zu keys but %zu versions, %zu frequencies, %zu opt_steps, %zu updated_at_ms, "
            "%zu pending_counts (one each per key)",
            n, im->n_versions, im->n_frequencies, im->n_opt_steps, im->n_updated_at_ms, im->n_pending_counts);
    if (feature) {
        if (im->n_records != n || im->n_values || im->opt_floats || im->n_opt_state || im->n_pending)
            return kb_service_fail(
                rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                "import_rows: feature table '%s' takes one record per key (%zu records for %zu keys) and "
                "no values, optimizer state or pending gradients",
                kb_table_name(t), im->n_records, n);
        for (size_t i = 0; i < n; i++) {
            if (kb_service_check_record(self, rp, i, im->records[i]) != 0)
                return -1;
            if (im->pending_counts[i] || im->opt_steps[i])
                return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, i, &im->keys[i],
                                     "a feature row has no pending gradients or optimizer steps");
        }
    } else {
        if (im->n_records)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "import_rows: embedding table '%s' takes no feature records", kb_table_name(t));
        if (im->n_values != n * dim)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "import_rows: %zu values for %zu keys of dim %u: expected %zu", im->n_values, n, dim,
                                   n * (size_t)dim);
        size_t bad = carls_first_nonfinite(im->values, n * dim);
        if (bad < n * dim)
            return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, bad / dim, &im->keys[bad / dim],
                                 "its value holds NaN or Inf");
        if (im->opt_floats != 0 && im->opt_floats != opt_floats)
            return kb_service_fail(
                rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                "import_rows: %u optimizer floats per row, but table '%s' (%s, dim %u) keeps %u (or send "
                "0 to start the state fresh)",
                im->opt_floats, kb_table_name(t), kb_optimizer_name(cfg->optimizer.kind), dim, opt_floats);
        if (im->n_opt_state != n * im->opt_floats)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "import_rows: %zu optimizer floats for %zu rows of %u", im->n_opt_state, n,
                                   im->opt_floats);
        bool adagrad = cfg->optimizer.kind == KB_OPT_ADAGRAD, adam = cfg->optimizer.kind == KB_OPT_ADAM;
        for (size_t i = 0; i < n * im->opt_floats; i++) {
            size_t row = i / im->opt_floats, j = i % im->opt_floats;
            float x = im->opt_state[i];
            if (!isfinite(x))
                return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, row, &im->keys[row],
                                     "optimizer state holds NaN or Inf");
            if (x < 0 && (adagrad || (adam && j >= dim)))
                return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, row, &im->keys[row],
                                     adagrad ? "a negative AdaGrad accumulator" : "a negative Adam second moment");
        }
        uint64_t pending = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t c = im->pending_counts[i];
            if (c && (cfg->immediate || c > cfg->max_pending)) {
                char why[128];
                snprintf(why, sizeof why, "%u pending gradients; the table takes %u", c,
                         cfg->immediate ? 0 : cfg->max_pending);
                return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, i, &im->keys[i], why);
            }
            pending += c;
        }
        if (im->n_pending != pending * dim)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "import_rows: %zu pending floats; the pending counts need %llu", im->n_pending,
                                   (unsigned long long)(pending * dim));
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t floats = (size_t)im->pending_counts[i] * dim;
            if (carls_first_nonfinite(im->pending + at, floats) < floats)
                return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, i, &im->keys[i],
                                     "a pending gradient holds NaN or Inf");
            at += floats;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (im->updated_at_ms[i] < 0)
            return s_import_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, i, &im->keys[i],
                                 "a negative updated_at_ms");
    return 0;
}

static int s_apply_import(kb_service_t *self, const Carls__Request *req, kb_table_t *table, kb_service_reply_t *rp)
{
    const Carls__ImportRows *im = req->import_rows;
    const kb_table_config_t *cfg = kb_table_config(table);
    bool feature = cfg->kind == KB_TABLE_FEATURE;
    size_t n = im->n_keys;
    kb_store_row_t *recs = carls_xcalloc(n, sizeof *recs);
    size_t *lens = feature ? carls_xcalloc(n, sizeof *lens) : NULL;
    size_t pending_at = 0;
    for (size_t i = 0; i < n; i++) {
        kb_store_row_t *r = &recs[i];
        r->key = im->keys[i].data;
        r->key_len = (uint32_t)im->keys[i].len;
        r->dim = cfg->dim;
        r->value = feature ? NULL : im->values + i * cfg->dim;
        r->opt_floats = im->opt_floats;
        r->opt_state = im->opt_floats ? im->opt_state + i * im->opt_floats : NULL;
        r->opt_steps = im->opt_steps[i];
        r->version = im->versions[i];
        r->updated_at_ms = im->updated_at_ms[i];
        r->frequency = im->frequencies[i];
        r->pending_count = im->pending_counts[i];
        r->pending = r->pending_count ? im->pending + pending_at : NULL;
        pending_at += (size_t)r->pending_count * cfg->dim;
        if (feature) {
            /* Stored as given (its own version and timestamp); `found` is a reply-only field. */
            Carls__FeatureRecord rec = *im->records[i];
            rec.found = false;
            lens[i] = carls__feature_record__get_packed_size(&rec);
            r->record = carls_xmalloc(lens[i] ? lens[i] : 1);
            r->record_len = (uint32_t)lens[i];
            carls__feature_record__pack(&rec, r->record);
        }
    }
    uint64_t reserved;
    int rc = kb_service_reserve_rows(self, rp, table, feature ? KB_GROW_FEATURE_PUT : KB_GROW_PUT, im->keys, n, lens,
                                     &reserved);
    if (rc == 0) {
        kb_table_import(table, recs, n);
        kb_memory_release(kb_bank_memory(self->bank), reserved);
        kb_service_write_ok(rp, (uint32_t)n, false, 0);
    }
    for (size_t i = 0; feature && i < n; i++)
        free(recs[i].record);
    free(recs);
    free(lens);
    return rc;
}

int kb_service_op_import_rows(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__ImportRows *im = req->import_rows;
    if (kb_service_check_keys(self, rp, im->n_keys, im->keys) != 0)
        return -1;
    kb_table_t *t = kb_service_table(self, rp, req->table);
    if (!t)
        return -1;
    int rc = s_check_import(self, rp, t, im);
    if (rc == 0)
        rc = kb_service_run_write(self, req, t, rp, s_apply_import);
    kb_bank_release(self->bank, t);
    return rc;
}

int kb_service_op_scan(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__Scan *sc = req->scan;
    uint32_t limit = sc->limit ? sc->limit : 1000;
    if (limit > self->limits.max_keys_per_request)
        limit = self->limits.max_keys_per_request;
    kb_table_t *t = kb_service_table(self, rp, req->table);
    if (!t)
        return -1;
    const kb_table_config_t *cfg = kb_table_config(t);
    limit = s_scan_page_rows(cfg, limit);
    kb_store_row_t *rows = NULL;
    bool done = false;
    size_t n = kb_table_scan(t, sc->after_row_id, limit, &rows, &done);
    kb_bank_release(self->bank, t);
    Carls__ScanResult *res = &rp->r.scan;
    carls__scan_result__init(res);
    res->done = done;
    res->dim = cfg->dim;
    res->n_keys = res->n_row_ids = res->n_versions = res->n_frequencies = n;
    res->keys = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->keys));
    res->row_ids = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->row_ids));
    res->versions = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->versions));
    res->frequencies = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->frequencies));
    if (cfg->kind == KB_TABLE_EMBEDDING) {
        res->n_values = n * cfg->dim;
        res->values = kb_service_own(rp, carls_xmalloc((n ? n : 1) * cfg->dim * sizeof(float)));
    } else {
        res->n_records = n;
        res->records = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *res->records));
    }
    s_scan_state(rp, cfg, rows, n, res);
    for (size_t i = 0; i < n; i++) {
        kb_store_row_t *r = &rows[i];
        res->keys[i].data = kb_service_own(rp, r->key);
        res->keys[i].len = r->key_len;
        r->key = NULL;
        res->row_ids[i] = r->row_id;
        res->versions[i] = r->version;
        res->frequencies[i] = r->frequency;
        if (cfg->kind == KB_TABLE_EMBEDDING)
            memcpy(res->values + i * cfg->dim, r->value, cfg->dim * sizeof(float));
        else
            res->records[i] = kb_service_reply_record(rp, r->record, r->record_len, true);
        kb_store_row_free(r);
    }
    free(rows);
    rp->resp.result_case = CARLS__RESPONSE__RESULT_SCAN;
    rp->resp.scan = res;
    return 0;
}

/* ---- snapshots (kb_snapshot.h) ---- */

/* info as a SnapshotInfo owned by the reply (info's table names move into it). */
static Carls__SnapshotInfo *s_snapshot_info(kb_service_reply_t *rp, kb_snapshot_info_t *info)
{
    Carls__SnapshotInfo *si = kb_service_own(rp, carls_xmalloc(sizeof *si));
    carls__snapshot_info__init(si);
    si->name = kb_service_own(rp, strdup(info->name));
    si->problem = kb_service_own(rp, strdup(info->problem));
    if (!si->name || !si->problem)
        CARLS_FATAL("out of memory");
    si->created_ms = info->created_ms;
    si->cut_epoch = info->cut_epoch;
    si->bytes = info->bytes;
    si->valid = info->valid;
    si->shard_index = info->shard_index;
    si->shard_count = info->shard_count;
    si->n_tables = info->n_tables;
    si->tables = kb_service_own(rp, info->tables);
    for (size_t i = 0; i < info->n_tables; i++)
        kb_service_own(rp, info->tables[i]);
    info->tables = NULL;
    info->n_tables = 0;
    return si;
}

int kb_service_op_snapshot(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__Snapshot *q = req->snapshot;
    char err[1024] = "";
    kb_snapshot_info_t one, *list = NULL;
    size_t n = 0;
    int rc;
    if (q->action != CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST && self->limits.read_only)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_READ_ONLY,
                               "this server is read-only; snapshot %s refused",
                               q->action == CARLS__SNAPSHOT_ACTION__SNAPSHOT_CREATE ? "create" : "delete");
    switch (q->action) {
    case CARLS__SNAPSHOT_ACTION__SNAPSHOT_CREATE:
        rc = kb_snapshots_create(self->snapshots, q->name, req->client_id, req->sequence, &one, err, sizeof err);
        break;
    case CARLS__SNAPSHOT_ACTION__SNAPSHOT_DELETE:
        rc = kb_snapshots_delete(self->snapshots, q->name, &one, err, sizeof err);
        break;
    case CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST:
        rc = kb_snapshots_list(self->snapshots, q->verify, &list, &n, err, sizeof err);
        break;
    default:
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "unknown snapshot action %d",
                               (int)q->action);
    }
    if (rc != KB_SNAPSHOT_OK) {
        Carls__StatusCode status = rc == KB_SNAPSHOT_EINVAL      ? CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT
                                   : rc == KB_SNAPSHOT_EEXISTS   ? CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS
                                   : rc == KB_SNAPSHOT_ENOTFOUND ? CARLS__STATUS_CODE__STATUS_NOT_FOUND
                                                                 : CARLS__STATUS_CODE__STATUS_INTERNAL;
        return kb_service_fail(rp, status, "snapshot: %s", err);
    }
    Carls__SnapshotResult *res = &rp->r.snapshot;
    carls__snapshot_result__init(res);
    if (q->action == CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST) {
        res->snapshots = kb_service_own(rp, carls_xcalloc(n + 1, sizeof *res->snapshots));
        for (size_t i = 0; i < n; i++)
            res->snapshots[res->n_snapshots++] = s_snapshot_info(rp, &list[i]);
        free(list);
    } else {
        res->snapshots = kb_service_own(rp, carls_xmalloc(sizeof *res->snapshots));
        res->snapshots[res->n_snapshots++] = s_snapshot_info(rp, &one);
    }
    rp->resp.result_case = CARLS__RESPONSE__RESULT_SNAPSHOT;
    rp->resp.snapshot = res;
    return 0;
}
