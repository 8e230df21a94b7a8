/* The cluster's per-shard calls (call, stats, scan), checkpoints, snapshots and the import of rows with
 * their whole state (contract in kb_cluster.h), through the fan-out engine (kb_cluster_internal.h). */
#include "kb_cluster.h"
#include "kb_cluster_internal.h"

#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- per shard -------------------------------------------------------------------------------------- */

/* Sends req to shard s and waits for its answer: 0 with *out (the caller's) carrying result want, or the
 * failure (error set, *out NULL). */
static int s_call_shard(kb_cluster_t *self, uint32_t s, Carls__Request *req, Carls__Response__ResultCase want,
                        Carls__Response **out)
{
    *out = NULL;
    Carls__Response *resp = NULL;
    self->requests++;
    kb_client_t *to = NULL;
    uint64_t id = 0;
    int rc = kb_cluster_send_to(self, s, req, &to, &id);
    if (rc == 0)
        rc = kb_cluster_wait_from(self, s, req, to, &id, want, &resp);
    if (rc == 0 && resp->result_case != want) {
        kb_cluster_shard_errorf(self, s, "the answer to %s carries the wrong result (case %d)",
                                carls_op_name(req->op_case), (int)resp->result_case);
        rc = KB_CLIENT_EMALFORMED;
    } else if (rc != 0) {
        kb_cluster_client_error(self, s);
    }
    if (rc == 0)
        *out = resp;
    else if (resp)
        carls__response__free_unpacked(resp, NULL);
    return rc;
}

int kb_cluster_call(kb_cluster_t *self, uint32_t shard, Carls__Request *req, Carls__Response__ResultCase want,
                    Carls__Response **resp_out)
{
    assert(self && req && resp_out && shard < self->n);
    kb_cluster_clear_error(self);
    return s_call_shard(self, shard, req, want, resp_out);
}

int kb_cluster_stats(kb_cluster_t *self, uint32_t shard, const char *table, Carls__Response **stats_out)
{
    assert(self && stats_out && shard < self->n);
    kb_cluster_clear_error(self);
    Carls__Stats op = CARLS__STATS__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = table ? (char *)table : (char *)protobuf_c_empty_string;
    req.op_case = CARLS__REQUEST__OP_STATS;
    req.stats = &op;
    return s_call_shard(self, shard, &req, CARLS__RESPONSE__RESULT_STATS, stats_out);
}

int kb_cluster_checkpoint(kb_cluster_t *self, Carls__CheckpointResult *per_shard_out)
{
    assert(self);
    kb_cluster_clear_error(self);
    Carls__Checkpoint op = CARLS__CHECKPOINT__INIT;
    kb_cluster_fan_t fan;
    int rc =
        kb_cluster_to_all(self, &fan, NULL, CARLS__REQUEST__OP_CHECKPOINT, &op, CARLS__RESPONSE__RESULT_CHECKPOINT);
    if (rc == 0 && per_shard_out) {
        for (uint32_t s = 0; s < self->n; s++) {
            carls__checkpoint_result__init(&per_shard_out[s]);
            per_shard_out[s].committed_epoch = fan.resps[s]->checkpoint->committed_epoch;
            per_shard_out[s].rows = fan.resps[s]->checkpoint->rows;
        }
    }
    kb_cluster_fan_free(self, &fan);
    return rc;
}

int kb_cluster_scan(kb_cluster_t *self, uint32_t shard, const char *table, int64_t after_row_id, uint32_t limit,
                    Carls__Response **page_out)
{
    assert(self && page_out && shard < self->n);
    kb_cluster_clear_error(self);
    *page_out = NULL;
    if (!table || !*table) {
        kb_cluster_set_error(self, "scan: no table name");
        return KB_CLIENT_EINVAL;
    }
    Carls__Scan op = CARLS__SCAN__INIT;
    op.after_row_id = after_row_id;
    op.limit = limit;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_SCAN;
    req.scan = &op;
    Carls__Response *resp = NULL;
    int rc = s_call_shard(self, shard, &req, CARLS__RESPONSE__RESULT_SCAN, &resp);
    if (rc != 0)
        return rc;
    const Carls__ScanResult *r = resp->scan;
    size_t n = r->n_keys;
    bool ok = r->n_row_ids == n && r->n_versions == n && r->n_frequencies == n;
    if (ok && r->n_records == 0 && n > 0)
        ok = r->dim > 0 && r->dim <= CARLS_DEFAULT_MAX_DIM && r->n_values == n * r->dim;
    else if (ok && n > 0)
        ok = r->n_records == n && r->n_values == 0;
    for (size_t i = 0; ok && i < r->n_records; i++)
        ok = r->records[i] != NULL;
    int64_t last = after_row_id;
    for (size_t i = 0; ok && i < n; i++) {
        ok = r->row_ids[i] > last && r->keys[i].len > 0;
        last = r->row_ids[i];
    }
    /* The rows' whole state, when the server sends it (n_updated_at_ms == n): one entry of each per row,
     * opt_floats per row (at most 8 * dim), and the pending floats the pending counts need. */
    if (ok && n > 0 && r->n_updated_at_ms > 0) {
        ok = r->n_updated_at_ms == n && r->n_opt_steps == n && r->n_pending_counts == n &&
             r->opt_floats <= 8u * r->dim && r->n_opt_state == n * r->opt_floats;
        uint64_t pending = 0;
        for (size_t i = 0; ok && i < n; i++) {
            ok = r->pending_counts[i] <= CARLS_MAX_PENDING_LIMIT;
            pending += r->pending_counts[i];
        }
        ok = ok && r->n_pending == pending * r->dim;
    }
    if (!ok || (limit > 0 && n > limit)) {
        kb_cluster_shard_errorf(self, shard, "scan of %s: inconsistent page (%zu keys, %zu row ids, %zu versions, "
                                "%zu frequencies, dim %u with %zu values, %zu records)", table, n, r->n_row_ids,
                                r->n_versions, r->n_frequencies, r->dim, r->n_values, r->n_records);
        rc = KB_CLIENT_EMALFORMED;
        goto fail;
    }
    *page_out = resp;
    return 0;
fail:
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    return rc;
}

int kb_cluster_scan_all(kb_cluster_t *self, const char *table, uint32_t limit, kb_cluster_page_fn fn, void *ctx)
{
    assert(self && fn);
    for (uint32_t s = 0; s < self->n; s++) {
        int64_t after = 0;
        for (;;) {
            Carls__Response *resp = NULL;
            int rc = kb_cluster_scan(self, s, table, after, limit, &resp);
            if (rc != 0)
                return rc;
            const Carls__ScanResult *page = resp->scan;
            const bool go_on = page->n_keys == 0 || fn(ctx, s, page);
            const bool done = page->done || page->n_keys == 0;
            if (page->n_keys > 0)
                after = page->row_ids[page->n_keys - 1];
            carls__response__free_unpacked(resp, NULL);
            if (!go_on)
                return 0;
            if (done)
                break;
        }
    }
    return 0;
}

/* ---- snapshots (docs/STATE.md "Snapshots") ------------------------------------------------------------ */

/* Builds a Snapshot operation. 0, or KB_CLIENT_EINVAL (error set) for a create or delete without a name. */
static int s_snapshot_op(kb_cluster_t *self, Carls__Snapshot *op, Carls__SnapshotAction action, const char *name,
                         bool verify)
{
    carls__snapshot__init(op);
    if (action != CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST && (!name || !*name)) {
        kb_cluster_set_error(self, "snapshot: no snapshot name");
        return KB_CLIENT_EINVAL;
    }
    op->action = action;
    op->name = (char *)(name ? name : ""); /* packing only reads it */
    op->verify = verify;
    return 0;
}

int kb_cluster_snapshot_each(kb_cluster_t *self, Carls__SnapshotAction action, const char *name, bool verify,
                             Carls__Response **per_shard_out)
{
    assert(self);
    kb_cluster_clear_error(self);
    for (uint32_t s = 0; per_shard_out && s < self->n; s++)
        per_shard_out[s] = NULL;
    Carls__Snapshot op;
    int rc = s_snapshot_op(self, &op, action, name, verify);
    if (rc != 0)
        return rc;
    kb_cluster_fan_t fan;
    rc = kb_cluster_to_all(self, &fan, NULL, CARLS__REQUEST__OP_SNAPSHOT, &op, CARLS__RESPONSE__RESULT_SNAPSHOT);
    for (uint32_t s = 0; rc == 0 && s < self->n; s++) {
        const Carls__SnapshotResult *res = fan.resps[s]->snapshot;
        if (action != CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST && (res->n_snapshots != 1 || !res->snapshots[0])) {
            kb_cluster_shard_errorf(self, s, "the answer to snapshot holds %zu snapshots, not 1", res->n_snapshots);
            rc = KB_CLIENT_EMALFORMED;
        }
        for (size_t i = 0; rc == 0 && i < res->n_snapshots; i++) {
            if (!res->snapshots[i]) {
                kb_cluster_shard_errorf(self, s, "the answer to snapshot holds an empty entry");
                rc = KB_CLIENT_EMALFORMED;
            }
        }
    }
    for (uint32_t s = 0; rc == 0 && per_shard_out && s < self->n; s++) {
        per_shard_out[s] = fan.resps[s];
        fan.resps[s] = NULL;
    }
    kb_cluster_fan_free(self, &fan);
    return rc;
}

/* The cluster's error into err (when errlen). Returns -1. */
static int s_error_out(kb_cluster_t *self, char *err, size_t errlen)
{
    if (errlen)
        snprintf(err, errlen, "%s", self->last_error);
    return -1;
}

int kb_cluster_snapshot(kb_cluster_t *self, const char *name, char *err, size_t errlen)
{
    assert(self);
    kb_cluster_clear_error(self);
    Carls__Snapshot op;
    if (s_snapshot_op(self, &op, CARLS__SNAPSHOT_ACTION__SNAPSHOT_CREATE, name, false) != 0)
        return s_error_out(self, err, errlen);
    /* Each shard's answer is awaited on its own, so that when one fails the parts the others took are
     * known, and deleted again: a snapshot is on every shard or on none (as far as the shards answer). */
    kb_cluster_fan_t fan;
    kb_cluster_fan_init(self, &fan, NULL, CARLS__RESPONSE__RESULT_SNAPSHOT);
    for (uint32_t s = 0; s < self->n; s++)
        kb_cluster_request_op(&fan, &fan.reqs[s], CARLS__REQUEST__OP_SNAPSHOT, &op);
    kb_cluster_fan_send(self, &fan);
    bool *made = carls_xcalloc(self->n, sizeof *made);
    uint32_t n_made = 0;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan.in_flight[s])
            continue;
        Carls__Response *resp = NULL;
        int rc = kb_client_wait(self->clients[s], fan.ids[s], &resp);
        fan.in_flight[s] = false;
        if (rc == 0 && resp->result_case == CARLS__RESPONSE__RESULT_SNAPSHOT) {
            made[s] = true;
            n_made++;
        } else if (kb_cluster_fan_failed(&fan, s, rc ? rc : KB_CLIENT_EMALFORMED)) {
            if (rc)
                kb_cluster_client_error(self, s);
            else
                kb_cluster_shard_errorf(self, s, "the answer to snapshot carries the wrong result");
        }
        if (resp)
            carls__response__free_unpacked(resp, NULL);
    }
    int rc = fan.rc;
    if (rc == 0 && n_made < self->n) /* a send failed: kb_cluster_fan_send recorded it */
        rc = KB_CLIENT_EIO;
    kb_cluster_fan_free(self, &fan);
    if (rc != 0 && n_made > 0) {
        char first[sizeof self->last_error];
        snprintf(first, sizeof first, "%s", self->last_error);
        Carls__Snapshot del;
        s_snapshot_op(self, &del, CARLS__SNAPSHOT_ACTION__SNAPSHOT_DELETE, name, false);
        kb_cluster_fan_init(self, &fan, NULL, CARLS__RESPONSE__RESULT_SNAPSHOT);
        for (uint32_t s = 0; s < self->n; s++)
            if (made[s])
                kb_cluster_request_op(&fan, &fan.reqs[s], CARLS__REQUEST__OP_SNAPSHOT, &del);
        int drc = kb_cluster_fan_run(self, &fan);
        kb_cluster_fan_free(self, &fan);
        snprintf(self->last_error, sizeof self->last_error, "%.600s; the part %u other shard(s) took %s", first,
                 n_made, drc == 0 ? "was deleted again" : "could not be deleted (kbctl snapshot-delete)");
    }
    free(made);
    return rc == 0 ? 0 : s_error_out(self, err, errlen);
}

int kb_cluster_snapshot_delete(kb_cluster_t *self, const char *name, char *err, size_t errlen)
{
    int rc = kb_cluster_snapshot_each(self, CARLS__SNAPSHOT_ACTION__SNAPSHOT_DELETE, name, false, NULL);
    return rc == 0 ? 0 : s_error_out(self, err, errlen);
}

/* ---- import of rows with their whole state ----------------------------------------------------------- */

/* kb_cluster_import_rows' per-key fields in shard order (each shard's request points at its block). */
typedef struct {
    float *values, *opt_state, *pending;
    uint64_t *opt_steps, *versions, *frequencies;
    int64_t *updated_at_ms;
    uint32_t *pending_counts;
    Carls__FeatureRecord **records;
} s_import_arrays_t;

static void s_import_arrays_free(s_import_arrays_t *a)
{
    free(a->values);
    free(a->opt_state);
    free(a->pending);
    free(a->opt_steps);
    free(a->versions);
    free(a->frequencies);
    free(a->updated_at_ms);
    free(a->pending_counts);
    free(a->records);
}

int kb_cluster_import_rows(kb_cluster_t *self, const char *table, const kb_import_row_t *rows, size_t n,
                           uint32_t dim, uint32_t opt_floats)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!table || !*table || !rows || n == 0) {
        kb_cluster_set_error(self, "import_rows: a table name and rows are required");
        return KB_CLIENT_EINVAL;
    }
    bool feature = rows[0].record != NULL;
    size_t pending_floats = 0;
    for (size_t i = 0; i < n; i++) {
        const kb_import_row_t *r = &rows[i];
        if ((r->record != NULL) != feature || (!feature && !r->values) || (opt_floats && !feature && !r->opt_state) ||
            (r->pending_count && (feature || !r->pending))) {
            kb_cluster_set_error(self, "import_rows: row %zu: every row needs values (embedding tables, with %u "
                                 "optimizer floats) or a record (feature tables), and its pending gradients", i,
                                 opt_floats);
            return KB_CLIENT_EINVAL;
        }
        pending_floats += (size_t)r->pending_count * dim;
    }
    kb_key_t *keys = carls_xmalloc(n * sizeof *keys);
    for (size_t i = 0; i < n; i++)
        keys[i] = rows[i].key;
    kb_cluster_fan_t fan;
    kb_cluster_fan_init(self, &fan, table, CARLS__RESPONSE__RESULT_WRITE);
    s_import_arrays_t a = {0};
    int rc = kb_cluster_fan_keys(self, &fan, "import_rows", CARLS__REQUEST__OP_IMPORT_ROWS, keys, n);
    if (rc == 0) {
        const kb_cluster_split_t *sp = &fan.sp;
        a.values = carls_xmalloc((feature ? 1 : n * dim) * sizeof *a.values);
        a.opt_state = carls_xmalloc((opt_floats > 0 ? n * (size_t)opt_floats : 1) * sizeof *a.opt_state);
        a.pending = carls_xmalloc((pending_floats ? pending_floats : 1) * sizeof *a.pending);
        a.opt_steps = carls_xmalloc(n * sizeof *a.opt_steps);
        a.versions = carls_xmalloc(n * sizeof *a.versions);
        a.frequencies = carls_xmalloc(n * sizeof *a.frequencies);
        a.updated_at_ms = carls_xmalloc(n * sizeof *a.updated_at_ms);
        a.pending_counts = carls_xmalloc(n * sizeof *a.pending_counts);
        a.records = carls_xcalloc(n, sizeof *a.records);
        size_t pending_at = 0;
        for (uint32_t s = 0; s < self->n; s++) {
            size_t c = sp->count[s], start = sp->start[s], shard_pending = pending_at;
            if (c == 0)
                continue;
            for (size_t j = start; j < start + c; j++) {
                const kb_import_row_t *r = &rows[sp->order[j]];
                if (!feature)
                    memcpy(a.values + j * dim, r->values, dim * sizeof(float));
                if (!feature && opt_floats)
                    memcpy(a.opt_state + j * opt_floats, r->opt_state, opt_floats * sizeof(float));
                a.opt_steps[j] = r->opt_steps;
                a.versions[j] = r->version;
                a.frequencies[j] = r->frequency;
                a.updated_at_ms[j] = r->updated_at_ms;
                a.pending_counts[j] = r->pending_count;
                a.records[j] = (Carls__FeatureRecord *)r->record; /* packing only reads it */
                if (r->pending_count)
                    memcpy(a.pending + pending_at, r->pending, (size_t)r->pending_count * dim * sizeof(float));
                pending_at += (size_t)r->pending_count * dim;
            }
            Carls__ImportRows *im = &fan.ops[s].import_rows;
            if (!feature) {
                im->n_values = c * dim;
                im->values = a.values + start * dim;
                im->opt_floats = opt_floats;
                im->n_opt_state = c * opt_floats;
                im->opt_state = a.opt_state + start * opt_floats;
                im->n_pending = pending_at - shard_pending;
                im->pending = a.pending + shard_pending;
            } else {
                im->n_records = c;
                im->records = a.records + start;
            }
            im->n_opt_steps = im->n_versions = im->n_frequencies = im->n_updated_at_ms = im->n_pending_counts = c;
            im->opt_steps = a.opt_steps + start;
            im->versions = a.versions + start;
            im->frequencies = a.frequencies + start;
            im->updated_at_ms = a.updated_at_ms + start;
            im->pending_counts = a.pending_counts + start;
        }
        rc = kb_cluster_fan_run(self, &fan);
    }
    kb_cluster_fan_free(self, &fan);
    s_import_arrays_free(&a);
    free(keys);
    return rc;
}
