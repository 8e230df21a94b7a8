#include "kb_service.h"
#include "kb_service_internal.h"

#include "kb_latency.h"
#include "kb_snapshot.h"
#include "kb_table_config.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *s_op_name(int index);

void kb_limits_defaults(kb_limits_t *limits)
{
    memset(limits, 0, sizeof *limits);
    limits->max_message_bytes = CARLS_DEFAULT_MAX_MESSAGE_BYTES;
    limits->max_key_bytes = CARLS_DEFAULT_MAX_KEY_BYTES;
    limits->max_dim = CARLS_DEFAULT_MAX_DIM;
    limits->max_keys_per_request = CARLS_DEFAULT_MAX_KEYS_PER_REQUEST;
    limits->commit_timeout_ms = 30000;
    limits->read_only = false;
    limits->knn_slice_us = 250;
}

kb_service_t *kb_service_new(kb_bank_t *bank, const kb_limits_t *limits, uint32_t threads, const char *durability)
{
    kb_service_t *self = carls_xcalloc(1, sizeof *self);
    self->bank = bank;
    self->commit = kb_bank_commit(bank);
    self->limits = *limits;
    self->threads = threads;
    self->durability = strdup(durability ? durability : "");
    if (!self->durability)
        CARLS_FATAL("out of memory");
    self->started_ms = carls_monotonic_ms();
    for (int i = 0; i < OP_COUNT; i++)
        kb_latency_init(&self->latency[i]);
    self->snapshots = kb_snapshots_new(bank, limits->shard_index, limits->shard_count);
    atomic_init(&self->writable, true);
    pthread_mutex_init(&self->primary_mutex, NULL);
    return self;
}

void kb_service_destroy(kb_service_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    for (size_t i = 0; i < S_TABLE_SLOTS; i++)
        free(atomic_load(&(*self_p)->table_counters[i]));
    kb_snapshots_destroy(&(*self_p)->snapshots);
    pthread_mutex_destroy(&(*self_p)->primary_mutex);
    free((*self_p)->durability);
    free(*self_p);
    *self_p = NULL;
}

void kb_service_count_dropped(kb_service_t *self) { atomic_fetch_add(&self->malformed, 1); }

/* The counters of table `name` (a valid table name), created when create is set; NULL when absent (or when
 * every slot is taken). */
static kb_service_table_counters_t *s_table_counters(kb_service_t *self, const char *name, bool create)
{
    size_t len = strlen(name);
    size_t slot = (size_t)carls_hash64(name, len, 0x6b62737461747321ULL) % S_TABLE_SLOTS;
    kb_service_table_counters_t *fresh = NULL;
    for (size_t probe = 0; probe < S_TABLE_SLOTS; probe++, slot = (slot + 1) % S_TABLE_SLOTS) {
        kb_service_table_counters_t *c = atomic_load(&self->table_counters[slot]);
        if (!c) {
            if (!create)
                return NULL;
            if (!fresh) {
                fresh = carls_xcalloc(1, sizeof *fresh);
                memcpy(fresh->name, name, len);
                for (int i = 0; i < OP_COUNT; i++)
                    kb_latency_init(&fresh->latency[i]);
            }
            if (atomic_compare_exchange_strong(&self->table_counters[slot], &c, fresh))
                return fresh;
            /* Another thread filled the slot first: c is its entry; check it like any other. */
        }
        if (strcmp(c->name, name) == 0) {
            free(fresh);
            return c;
        }
    }
    free(fresh);
    if (!atomic_exchange(&self->table_counters_full_logged, true))
        LOG_WARN("stats: more than %d table names seen; further tables are not counted per table", S_TABLE_SLOTS);
    return NULL;
}

/* ---- replies ---- */

/* Records a buffer to free once the reply is packed; returns it. */
void *kb_service_own(kb_service_reply_t *rp, void *ptr)
{
    if (rp->owned_count == rp->owned_capacity) {
        rp->owned_capacity = rp->owned_capacity ? rp->owned_capacity * 2 : 16;
        rp->owned = carls_xrealloc(rp->owned, rp->owned_capacity * sizeof *rp->owned);
    }
    rp->owned[rp->owned_count++] = ptr;
    return ptr;
}

/* Count, percentiles, maximum, sum and the power-of-two histogram of h (kb_latency_summarize), the histogram's
 * storage owned by the reply. */
static void s_fill_latency(kb_service_reply_t *rp, Carls__LatencySummary *l, kb_latency_t *h)
{
    kb_latency_summarize(h, l, kb_service_own(rp, carls_xcalloc(KB_LATENCY_LE_BUCKETS, sizeof(uint64_t))));
}

/* Releases the tables the reply held and frees it. */
static void s_reply_free(kb_service_t *self, kb_service_reply_t *rp)
{
    if (rp->resp.result_case == CARLS__RESPONSE__RESULT_REPLICA && self->replication.free_result)
        self->replication.free_result(self->replication.ctx, &rp->r.replica);
    for (size_t i = 0; i < rp->held_count; i++)
        kb_bank_release(self->bank, rp->held[i]);
    free(rp->held);
    for (size_t i = 0; i < rp->owned_count; i++)
        free(rp->owned[i]);
    free(rp->owned);
    for (size_t i = 0; i < rp->record_count; i++)
        if (rp->records[i])
            carls__feature_record__free_unpacked(rp->records[i], NULL);
    free(rp->records);
    free(rp);
}

int kb_service_fail(kb_service_reply_t *rp, Carls__StatusCode status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rp->error, sizeof rp->error, fmt, ap);
    va_end(ap);
    rp->resp.status = status;
    rp->resp.error = rp->error;
    rp->resp.result_case = CARLS__RESPONSE__RESULT__NOT_SET;
    return -1;
}

/* ---- validation ---- */

int kb_service_check_keys(kb_service_t *self, kb_service_reply_t *rp, size_t n, const ProtobufCBinaryData *keys)
{
    if (n == 0)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "no keys");
    if (n > self->limits.max_keys_per_request)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "%zu keys in one request; the limit is %u", n,
                               self->limits.max_keys_per_request);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].len == 0)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "key %zu is empty", i);
        if (keys[i].len > self->limits.max_key_bytes)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "key %zu is %zu bytes; the limit is %u", i, keys[i].len, self->limits.max_key_bytes);
        if (self->limits.shard_count > 1) {
            uint32_t shard = carls_shard_of(keys[i].data, keys[i].len, self->limits.shard_count);
            if (shard != self->limits.shard_index)
                return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                       "key %zu belongs to shard %u of %u; this server is shard %u (client routing "
                                       "disagrees with the server's --shard)",
                                       i, shard, self->limits.shard_count, self->limits.shard_index);
        }
    }
    return 0;
}

/* Checks that a values array holds exactly n rows of dim finite floats. */
static int s_check_rows(kb_service_reply_t *rp, const char *what, size_t n, uint32_t dim, size_t n_values,
                        const float *values)
{
    if (n_values != n * dim)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                               "%zu %s for %zu keys of dim %u: expected %zu", n_values, what, n, dim, n * (size_t)dim);
    size_t bad = carls_first_nonfinite(values, n_values);
    if (bad < n_values)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "%s row %zu holds NaN or Inf", what,
                               bad / dim);
    return 0;
}

/* ---- operations ---- */

/* Acquires the request's table or fails NOT_FOUND. */
kb_table_t *kb_service_table(kb_service_t *self, kb_service_reply_t *rp, const char *name)
{
    kb_table_t *t = kb_bank_acquire(self->bank, name);
    if (!t)
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_NOT_FOUND, "no table named '%s'", name);
    return t;
}

/* Acquires the request's table and checks it is of the kind its operation needs, or fails. */
static kb_table_t *s_table_of_kind(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp,
                                   kb_table_kind_t kind)
{
    kb_table_t *t = kb_service_table(self, rp, req->table);
    if (t && kb_table_config(t)->kind != kind) {
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "%s needs %s table; '%s' is %s",
                        carls_op_name(req->op_case), kind == KB_TABLE_EMBEDDING ? "an embedding" : "a feature",
                        req->table, kind == KB_TABLE_EMBEDDING ? "a feature table" : "an embedding table");
        kb_bank_release(self->bank, t);
        return NULL;
    }
    return t;
}

/* For an operation on n keys: checks them, then acquires the table as s_table_of_kind does, or fails. */
static kb_table_t *s_keyed_table(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp, size_t n,
                                 const ProtobufCBinaryData *keys, kb_table_kind_t kind)
{
    if (kb_service_check_keys(self, rp, n, keys) != 0)
        return NULL;
    return s_table_of_kind(self, req, rp, kind);
}

void kb_service_write_ok(kb_service_reply_t *rp, uint32_t rows, bool duplicate, uint64_t updates)
{
    carls__write_result__init(&rp->r.write);
    rp->r.write.rows = rows;
    rp->r.write.duplicate = duplicate;
    rp->r.write.updates_applied = updates;
    rp->resp.result_case = CARLS__RESPONSE__RESULT_WRITE;
    rp->resp.write = &rp->r.write;
}

/* ---- memory limit (--max-memory, kb_memory.h) ---- */

/* Counts one request refused for memory: server-wide and, for an existing table (name not NULL), per table. */
static void s_count_refusal(kb_service_t *self, const char *name, uint64_t new_rows)
{
    atomic_fetch_add(&self->mem_refusals, 1);
    atomic_fetch_add(&self->mem_refused_rows, new_rows);
    kb_service_table_counters_t *tc = name ? s_table_counters(self, name, true) : NULL;
    if (tc) {
        atomic_fetch_add(&tc->mem_refusals, 1);
        atomic_fetch_add(&tc->mem_refused_rows, new_rows);
    }
}

static int s_refuse_memory(kb_service_t *self, kb_service_reply_t *rp, const char *what, uint64_t bytes)
{
    kb_memory_t *mem = kb_bank_memory(self->bank);
    return kb_service_fail(
        rp, CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED,
        "memory limit: %s would take about %llu KiB more, and the server's estimate is %llu MiB of its "
        "--max-memory %llu MiB (%llu KiB reserved by requests in progress); nothing was changed. Rows "
        "that exist can still be read and updated",
        what, (unsigned long long)(bytes >> 10), (unsigned long long)(kb_memory_used(mem) >> 20),
        (unsigned long long)(kb_memory_limit(mem) >> 20), (unsigned long long)(kb_memory_reserved(mem) >> 10));
}

/* Before an operation that may create rows in table t: reserves what its new rows are estimated to take, or
 * refuses the whole request with RESOURCE_EXHAUSTED when that would take the estimate over --max-memory.
 * *reserved is what to kb_memory_release once the rows exist. Without a limit nothing is estimated. */
int kb_service_reserve_rows(kb_service_t *self, kb_service_reply_t *rp, kb_table_t *t, kb_table_growth_op_t op,
                            const ProtobufCBinaryData *keys, size_t n, const size_t *record_lens, uint64_t *reserved)
{
    *reserved = 0;
    kb_memory_t *mem = kb_bank_memory(self->bank);
    if (kb_memory_limit(mem) == 0)
        return 0;
    uint64_t new_rows = 0;
    uint64_t bytes = kb_table_growth(t, op, keys, n, record_lens, &new_rows);
    if (kb_memory_reserve(mem, bytes) == 0) {
        *reserved = bytes;
        return 0;
    }
    s_count_refusal(self, kb_table_name(t), new_rows);
    char what[96];
    snprintf(what, sizeof what, "the %llu new rows of this request", (unsigned long long)new_rows);
    return s_refuse_memory(self, rp, what, bytes);
}

/* In sync durability, the reply must wait for epoch `ticket` to commit (kb_service_handle waits for it; a
 * deferred caller parks the reply until kb_commit_durable_epoch reaches it). */
static void s_after_durable(kb_service_t *self, kb_service_reply_t *rp, uint64_t ticket)
{
    if (kb_commit_sync(self->commit) && ticket > rp->durable_ticket)
        rp->durable_ticket = ticket;
}

/* Runs a validated write inside the bank's write bracket, with de-duplication; in sync mode the reply
 * waits for the commit (s_after_durable). apply returns 0 (success) or -1 (rp holds the error). */
int kb_service_run_write(kb_service_t *self, const Carls__Request *req, kb_table_t *table, kb_service_reply_t *rp,
                         kb_service_apply_fn apply)
{
    /* After a failed journal append nothing commits until a restart: refuse before changing anything, so that
     * no write is applied in memory that the server could never save (in interval durability too). */
    if (kb_commit_broken(self->commit)) {
        char text[700];
        kb_commit_not_committed(self->commit, 0, text, sizeof text);
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INTERNAL, "%s", text);
    }
    kb_commit_write_begin(self->commit);
    if (kb_commit_seen_write(self->commit, req->client_id, req->sequence)) {
        uint64_t ticket = kb_commit_write_end(self->commit);
        atomic_fetch_add(&self->duplicates, 1);
        /* The first attempt may still be committing: answer once it is durable too. */
        s_after_durable(self, rp, ticket);
        kb_service_write_ok(rp, 0, true, 0);
        return 0;
    }
    int rc = apply(self, req, table, rp);
    if (rc != 0)
        kb_commit_forget_write(self->commit, req->client_id, req->sequence);
    uint64_t ticket = kb_commit_write_end(self->commit);
    if (rc != 0)
        return rc;
    rp->resp.epoch = ticket; /* a follower's read with min_epoch = this sees the write */
    s_after_durable(self, rp, ticket);
    return 0;
}

static int s_apply_create(kb_service_t *self, const Carls__Request *req, kb_table_t *unused, kb_service_reply_t *rp)
{
    (void)unused;
    kb_table_config_t cfg;
    char err[256];
    if (kb_table_config_from_proto(req->create_table->config, self->limits.max_dim, &cfg, err, sizeof err) != 0)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "table config: %s", err);
    /* A new table takes memory too (its stripes, an admission filter, an index): refused over the limit. An
     * existing name is answered as usual (ALREADY_EXISTS, or success with if_not_exists). */
    kb_memory_t *mem = kb_bank_memory(self->bank);
    uint64_t reserved = 0;
    kb_table_t *existing = kb_memory_limit(mem) ? kb_bank_acquire(self->bank, req->table) : NULL;
    if (existing) {
        kb_bank_release(self->bank, existing);
    } else if (kb_memory_limit(mem)) {
        uint64_t bytes = kb_table_base_bytes(&cfg);
        if (kb_memory_reserve(mem, bytes) != 0) {
            s_count_refusal(self, NULL, 0);
            return s_refuse_memory(self, rp, "a new table", bytes);
        }
        reserved = bytes;
    }
    int rc = kb_bank_create_table(self->bank, req->table, &cfg, req->create_table->if_not_exists);
    kb_memory_release(mem, reserved);
    if (rc == KB_BANK_EEXISTS)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS, "table '%s' exists", req->table);
    if (rc == KB_BANK_ECONFLICT)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS,
                               "table '%s' exists with a different config", req->table);
    kb_service_write_ok(rp, 0, false, 0);
    return 0;
}

static int s_apply_drop(kb_service_t *self, const Carls__Request *req, kb_table_t *unused, kb_service_reply_t *rp)
{
    (void)unused;
    if (kb_bank_drop_table(self->bank, req->table) != KB_BANK_OK && !req->drop_table->if_exists)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_NOT_FOUND, "no table named '%s'", req->table);
    kb_service_write_ok(rp, 0, false, 0);
    return 0;
}

/* The keys and float rows (values or gradients) of a put or push_gradients request. */
typedef struct {
    bool put;
    size_t n;
    const ProtobufCBinaryData *keys;
    size_t n_values;
    const float *values;
} s_rows_t;

static s_rows_t s_rows_of(const Carls__Request *req)
{
    if (req->op_case == CARLS__REQUEST__OP_PUT)
        return (s_rows_t){true, req->put->n_keys, req->put->keys, req->put->n_values, req->put->values};
    const Carls__PushGradients *push = req->push_gradients;
    return (s_rows_t){false, push->n_keys, push->keys, push->n_gradients, push->gradients};
}

static int s_apply_rows(kb_service_t *self, const Carls__Request *req, kb_table_t *table, kb_service_reply_t *rp)
{
    s_rows_t rows = s_rows_of(req);
    uint64_t reserved;
    if (kb_service_reserve_rows(self, rp, table, rows.put ? KB_GROW_PUT : KB_GROW_PUSH, rows.keys, rows.n, NULL,
                       &reserved) != 0)
        return -1;
    uint64_t steps = 0;
    if (rows.put)
        kb_table_put(table, rows.keys, rows.n, rows.values, req->put->version);
    else
        steps = kb_table_push(table, rows.keys, rows.n, rows.values);
    kb_memory_release(kb_bank_memory(self->bank), reserved);
    kb_service_write_ok(rp, (uint32_t)rows.n, false, steps);
    return 0;
}

static int s_op_lookup(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__Lookup *lk = req->lookup;
    kb_table_t *t = s_keyed_table(self, req, rp, lk->n_keys, lk->keys, KB_TABLE_EMBEDDING);
    if (!t)
        return -1;
    uint32_t dim = kb_table_config(t)->dim;
    size_t n = lk->n_keys;
    bool no_create = lk->no_create || self->limits.read_only || !atomic_load(&self->writable);
    uint64_t reserved = 0;
    if (!no_create && kb_service_reserve_rows(self, rp, t, KB_GROW_LOOKUP, lk->keys, n, NULL, &reserved) != 0) {
        kb_bank_release(self->bank, t);
        return -1;
    }
    Carls__LookupResult *res = &rp->r.lookup;
    carls__lookup_result__init(res);
    res->dim = dim;
    res->n_values = n * dim;
    res->values = kb_service_own(rp, carls_xmalloc(n * dim * sizeof(float)));
    res->n_versions = res->n_updated_at_ms = res->n_frequencies = n;
    res->versions = kb_service_own(rp, carls_xmalloc(n * sizeof(uint64_t)));
    res->updated_at_ms = kb_service_own(rp, carls_xmalloc(n * sizeof(int64_t)));
    res->frequencies = kb_service_own(rp, carls_xmalloc(n * sizeof(uint64_t)));
    /* A lookup that applies pending gradients produces a value its reader sees: in sync durability that
     * value must be committed before the answer, like any write (after a crash the pending set would
     * otherwise be re-applied together with later gradients, and the reader's value would be lost). */
    kb_commit_write_begin(self->commit);
    uint64_t steps = kb_table_lookup(t, lk->keys, n, no_create, res->values, res->versions, res->updated_at_ms,
                                     res->frequencies);
    uint64_t ticket = kb_commit_write_end(self->commit);
    kb_memory_release(kb_bank_memory(self->bank), reserved);
    kb_bank_release(self->bank, t);
    if (steps > 0)
        s_after_durable(self, rp, ticket);
    rp->resp.result_case = CARLS__RESPONSE__RESULT_LOOKUP;
    rp->resp.lookup = res;
    return 0;
}

static int s_op_table_write(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    s_rows_t rows = s_rows_of(req);
    kb_table_t *t = s_keyed_table(self, req, rp, rows.n, rows.keys, KB_TABLE_EMBEDDING);
    if (!t)
        return -1;
    int rc = s_check_rows(rp, rows.put ? "values" : "gradients", rows.n, kb_table_config(t)->dim, rows.n_values,
                          rows.values);
    if (rc == 0)
        rc = kb_service_run_write(self, req, t, rp, s_apply_rows);
    kb_bank_release(self->bank, t);
    return rc;
}

/* Lists every table; the references stay held (rp->held) until the reply is packed, since the reply points at
 * the tables' names. */
static int s_op_list(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    (void)req;
    kb_table_t **tables;
    size_t n = kb_bank_acquire_all(self->bank, &tables);
    rp->held = tables;
    rp->held_count = n;
    Carls__TableList *list = &rp->r.list;
    carls__table_list__init(list);
    Carls__TableInfo *infos = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *infos));
    kb_table_config_wire_t *wires = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *wires));
    list->tables = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *list->tables));
    list->n_tables = n;
    for (size_t i = 0; i < n; i++) {
        Carls__TableInfo *info = &infos[i];
        carls__table_info__init(info);
        kb_table_config_to_proto(kb_table_config(tables[i]), &wires[i]);
        info->name = (char *)kb_table_name(tables[i]);
        info->config = &wires[i].config;
        info->rows = kb_table_row_count(tables[i]);
        list->tables[i] = info;
    }
    rp->resp.result_case = CARLS__RESPONSE__RESULT_TABLE_LIST;
    rp->resp.table_list = list;
    return 0;
}

static int s_op_stats(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    kb_table_t **tables;
    size_t n;
    if (req->table && req->table[0]) {
        kb_table_t *t = kb_service_table(self, rp, req->table);
        if (!t)
            return -1;
        tables = carls_xcalloc(1, sizeof *tables);
        tables[0] = t;
        n = 1;
    } else {
        n = kb_bank_acquire_all(self->bank, &tables);
    }
    rp->held = tables;
    rp->held_count = n;
    Carls__StatsResult *st = &rp->r.stats;
    carls__stats_result__init(st);
    Carls__TableStats *ts = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *ts));
    st->tables = kb_service_own(rp, carls_xcalloc(n ? n : 1, sizeof *st->tables));
    st->n_tables = n;
    for (size_t i = 0; i < n; i++) {
        kb_table_stats_t s;
        kb_table_get_stats(tables[i], &s);
        carls__table_stats__init(&ts[i]);
        ts[i].name = (char *)kb_table_name(tables[i]);
        ts[i].dim = kb_table_config(tables[i])->dim;
        ts[i].rows = s.rows;
        ts[i].pending_keys = s.pending_keys;
        ts[i].pending_gradients = s.pending_gradients;
        ts[i].gradients_received = s.gradients_received;
        ts[i].gradients_applied = s.gradients_applied;
        ts[i].outliers_dropped = s.outliers_dropped;
        ts[i].updates_applied = s.updates_applied;
        ts[i].applied_on_lookup = s.applied_on_lookup;
        ts[i].applied_on_age = s.applied_on_age;
        ts[i].applied_on_count = s.applied_on_count;
        ts[i].lookups = s.lookups;
        ts[i].puts = s.puts;
        ts[i].not_admitted = s.not_admitted;
        ts[i].not_persisted = s.not_persisted;
        ts[i].evictions = s.evictions;
        ts[i].knn_count = s.knn.count;
        ts[i].knn_indexed = s.knn.indexed;
        ts[i].knn_pending = s.knn.pending;
        ts[i].knn_rebuilds = s.knn.rebuilds;
        ts[i].knn_ready = s.knn.ready;
        ts[i].kind = kb_table_config(tables[i])->kind == KB_TABLE_FEATURE ? CARLS__TABLE_KIND__TABLE_FEATURE
                                                                           : CARLS__TABLE_KIND__TABLE_EMBEDDING;
        ts[i].bytes = kb_table_memory(tables[i]);
        ts[i].knn_failed_builds = s.knn.failed_builds;
        ts[i].knn_building = s.knn.building;
        ts[i].knn_last_build_ms = s.knn.last_build_ms;
        kb_service_table_counters_t *tc = s_table_counters(self, ts[i].name, false);
        if (tc) {
            ts[i].request_errors = atomic_load(&tc->errors);
            ts[i].memory_refusals = atomic_load(&tc->mem_refusals);
            ts[i].memory_refused_rows = atomic_load(&tc->mem_refused_rows);
            Carls__LatencySummary *tl = kb_service_own(rp, carls_xcalloc(OP_COUNT, sizeof *tl));
            ts[i].requests = kb_service_own(rp, carls_xcalloc(OP_COUNT, sizeof *ts[i].requests));
            for (int op = 0; op < OP_COUNT; op++) {
                if (kb_latency_count(&tc->latency[op]) == 0)
                    continue;
                Carls__LatencySummary *l = &tl[ts[i].n_requests];
                carls__latency_summary__init(l);
                l->op = (char *)s_op_name(op);
                l->count = kb_latency_count(&tc->latency[op]);
                s_fill_latency(rp, l, &tc->latency[op]);
                ts[i].requests[ts[i].n_requests++] = l;
            }
        }
        st->tables[i] = &ts[i];
    }
    Carls__LatencySummary *lat = kb_service_own(rp, carls_xcalloc(OP_COUNT, sizeof *lat));
    st->latency = kb_service_own(rp, carls_xcalloc(OP_COUNT, sizeof *st->latency));
    for (int i = 0; i < OP_COUNT; i++) {
        if (kb_latency_count(&self->latency[i]) == 0)
            continue;
        Carls__LatencySummary *l = &lat[st->n_latency];
        carls__latency_summary__init(l);
        l->op = (char *)s_op_name(i);
        l->count = kb_latency_count(&self->latency[i]);
        s_fill_latency(rp, l, &self->latency[i]);
        st->latency[st->n_latency++] = l;
    }
    kb_commit_stats_t bs;
    kb_commit_get_stats(self->commit, &bs);
    st->requests = atomic_load(&self->requests);
    st->errors = atomic_load(&self->errors);
    st->malformed_frames = atomic_load(&self->malformed);
    st->duplicate_writes = atomic_load(&self->duplicates);
    st->uptime_ms = (uint64_t)(carls_monotonic_ms() - self->started_ms);
    st->commits = bs.commits;
    st->committed_epoch = bs.committed_epoch;
    st->rows_written = bs.rows_written;
    st->frequencies_written = bs.frequencies_written;
    st->commit_failures = bs.commit_failures;
    st->journal_bytes = bs.journal_bytes;
    st->compactions = bs.compactions;
    st->compacted_epoch = bs.compacted_epoch;
    st->compaction_queue_rows = bs.compaction_queue_rows;
    st->compaction_queue_bytes = bs.compaction_queue_bytes;
    st->compacting = bs.compacting;
    st->compaction_rows_skipped = bs.compaction_rows_skipped;
    st->compactions_without_pending = bs.compactions_without_pending;
    st->durability = self->durability;
    st->threads = self->threads;
    kb_memory_t *mem = kb_bank_memory(self->bank);
    st->memory_bytes = kb_memory_used(mem);
    st->memory_limit = kb_memory_limit(mem);
    st->memory_refusals = atomic_load(&self->mem_refusals);
    st->memory_refused_rows = atomic_load(&self->mem_refused_rows);
    st->rss_bytes = kb_memory_rss();
    kb_cache_stats_t cs; /* --cache-bytes */
    if (kb_bank_cache_stats(self->bank, &cs)) {
        st->cache_bytes = cs.budget;
        st->cache_resident_bytes = cs.resident;
        st->cache_reads = cs.reads;
        st->cache_loads = cs.loads;
        st->cache_evictions = cs.evictions;
    }
    rp->resp.result_case = CARLS__RESPONSE__RESULT_STATS;
    rp->resp.stats = st;
    return 0;
}

static int s_op_checkpoint(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    (void)req;
    if (self->limits.read_only) /* a read-only server commits nothing and changes no file */
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_READ_ONLY,
                               "this server is read-only; checkpoint refused");
    uint64_t epoch = 0;
    char err[512];
    if (kb_commit_checkpoint(self->commit, &epoch, err, sizeof err) != KB_COMMIT_OK)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INTERNAL, "checkpoint: %s", err);
    Carls__CheckpointResult *ck = &rp->r.checkpoint;
    carls__checkpoint_result__init(ck);
    ck->committed_epoch = epoch;
    kb_table_t **tables;
    size_t n = kb_bank_acquire_all(self->bank, &tables);
    for (size_t i = 0; i < n; i++) {
        ck->rows += kb_table_row_count(tables[i]);
        kb_bank_release(self->bank, tables[i]);
    }
    free(tables);
    rp->resp.result_case = CARLS__RESPONSE__RESULT_CHECKPOINT;
    rp->resp.checkpoint = ck;
    return 0;
}

/* ---- retrieval operations ---- */

_Static_assert(CARLS_MAX_KNN_K <= KB_KNN_MAX_K, "the protocol's k must be one the index answers");

void kb_service_set_parallel(kb_service_t *self, kb_parallel_run_fn run, void *ctx)
{
    self->parallel = run;
    self->parallel_ctx = ctx;
}

/* A knn's queries in slices that threads search at once: FAISS answers each query on its own, so the
 * slices' answers are the whole request's answer. */
typedef struct {
    kb_table_t *table;
    const float *queries;
    const int64_t *exclude;
    size_t nq, per_slice;
    uint32_t k, dim;
    ProtobufCBinaryData *keys;
    float *scores;
    int rc[]; /* per slice */
} s_knn_slices_t;

static void s_knn_slice(void *arg, size_t i)
{
    s_knn_slices_t *s = arg;
    size_t first = i * s->per_slice;
    size_t n = s->nq - first < s->per_slice ? s->nq - first : s->per_slice;
    s->rc[i] = kb_table_knn(s->table, s->queries + first * s->dim, n, s->k, s->exclude ? s->exclude + first : NULL,
                            s->keys + first * s->k, s->scores + first * s->k);
}

/* kb_table_knn over every query, in slices of about --knn-slice-us of search each (from the table's recent
 * time per query; KB_KNN_SLICE_FIRST queries before it has one) and never of fewer queries than keep the
 * request's per-query cost (kb_table_knn_batch_min: a Flat index scans fewer queries than FAISS's BLAS
 * batch one by one, and slices of one query made kb-maker's graph an order of magnitude slower). A slice
 * is short beside a request's round trip, so a worker that helps is soon free again when its own next
 * request comes (longer slices let helpers hold new requests back while the owners idled waiting for them),
 * and long beside a slice's own cost. Figures: docs/BENCHMARKS.md, "Figures behind the code's choices". */
#define KB_KNN_SLICE_FIRST 4u
static int s_knn_parallel(kb_service_t *self, kb_table_t *t, const float *queries, size_t nq, uint32_t k,
                          const int64_t *exclude, ProtobufCBinaryData *keys, float *scores)
{
    uint64_t query_ns = kb_table_knn_query_ns(t, nq), slice_ns = (uint64_t)self->limits.knn_slice_us * 1000u;
    size_t per_slice = query_ns ? (size_t)(slice_ns / query_ns) : KB_KNN_SLICE_FIRST;
    size_t batch_min = kb_table_knn_batch_min(t, nq);
    if (per_slice < batch_min)
        per_slice = batch_min;
    /* An index that gains from batching is cut in no more slices than workers, so that a request nobody
     * helps with is searched in a few large products rather than many small ones. */
    if (batch_min > 1 && self->threads > 0 && per_slice < (nq + self->threads - 1) / self->threads)
        per_slice = (nq + self->threads - 1) / self->threads;
    if (!self->parallel || self->threads < 2 || slice_ns == 0 || per_slice >= nq)
        return kb_table_knn(t, queries, nq, k, exclude, keys, scores);
    size_t slices = (nq + per_slice - 1) / per_slice;
    s_knn_slices_t *s = carls_xcalloc(1, sizeof *s + slices * sizeof s->rc[0]);
    *s = (s_knn_slices_t){.table = t, .queries = queries, .exclude = exclude, .nq = nq, .per_slice = per_slice,
                          .k = k, .dim = kb_table_config(t)->dim, .keys = keys, .scores = scores};
    self->parallel(self->parallel_ctx, slices, s_knn_slice, s);
    int rc = 0;
    for (size_t i = 0; i < slices && rc == 0; i++)
        rc = s->rc[i];
    free(s);
    return rc;
}

static int s_op_knn(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__Knn *q = req->knn;
    if (q->k == 0 || q->k > CARLS_MAX_KNN_K)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "k must be in 1..%u, got %u",
                               CARLS_MAX_KNN_K, q->k);
    if ((q->n_keys > 0) == (q->n_vectors > 0))
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                               "knn needs query keys or query vectors, not both");
    if (q->exclude_query && q->n_keys == 0)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "exclude_query needs query keys");
    if (q->n_keys > 0 && kb_service_check_keys(self, rp, q->n_keys, q->keys) != 0)
        return -1;
    kb_table_t *t = s_table_of_kind(self, req, rp, KB_TABLE_EMBEDDING);
    if (!t)
        return -1;
    uint32_t dim = kb_table_config(t)->dim;
    size_t nq = q->n_keys;
    const float *queries = q->vectors;
    int64_t *exclude = NULL;
    int rc = 0;
    if (q->n_vectors > 0) {
        if (q->n_vectors % dim != 0 || q->n_vectors / dim > self->limits.max_keys_per_request) {
            rc = kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                 "%zu query values: expected a multiple of dim %u, at most %u queries", q->n_vectors,
                                 dim, self->limits.max_keys_per_request);
            goto done;
        }
        nq = q->n_vectors / dim;
        if (s_check_rows(rp, "query vectors", nq, dim, q->n_vectors, q->vectors) != 0) {
            rc = -1;
            goto done;
        }
    } else {
        float *vecs = kb_service_own(rp, carls_xmalloc(nq * dim * sizeof(float)));
        exclude = kb_service_own(rp, carls_xmalloc(nq * sizeof *exclude));
        kb_table_peek(t, q->keys, nq, vecs, exclude);
        queries = vecs;
        if (!q->exclude_query)
            exclude = NULL;
    }
    if ((uint64_t)nq * q->k > CARLS_DEFAULT_MAX_KEYS_PER_REQUEST * 10ull) {
        rc = kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "%zu queries x k %u is too many answers", nq,
                             q->k);
        goto done;
    }
    Carls__KnnResult *res = &rp->r.knn;
    carls__knn_result__init(res);
    res->k = q->k;
    res->n_keys = res->n_scores = nq * q->k;
    res->keys = kb_service_own(rp, carls_xcalloc(nq * q->k, sizeof *res->keys));
    res->scores = kb_service_own(rp, carls_xmalloc(nq * q->k * sizeof(float)));
    int krc = s_knn_parallel(self, t, queries, nq, q->k, exclude, res->keys, res->scores);
    for (size_t i = 0; i < nq * q->k; i++)
        if (res->keys[i].data)
            kb_service_own(rp, res->keys[i].data);
    if (krc == -ENOTSUP) {
        rc = kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                             "table '%s' has no nearest-neighbour index (create it with a knn spec)", req->table);
        goto done;
    }
    if (krc != 0) {
        rc = kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INTERNAL, "nearest-neighbour search failed (%d)", krc);
        goto done;
    }
    rp->resp.result_case = CARLS__RESPONSE__RESULT_KNN;
    rp->resp.knn = res;
done:
    kb_bank_release(self->bank, t);
    return rc;
}

/* --cache-bytes: sampling draws from the rows in memory, so a table whose rows may be only in storage
 * refuses it (releasing t) rather than answer from part of it. */
static int s_refuse_cached(kb_service_t *self, kb_service_reply_t *rp, kb_table_t *t, const char *op)
{
    if (!kb_table_cached(t))
        return 0;
    kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED,
                    "%s of table '%s' is not supported while kb-server keeps rows only in storage (--cache-bytes); "
                    "restart it without --cache-bytes", op, kb_table_name(t));
    kb_bank_release(self->bank, t);
    return -1;
}

static int s_op_sample(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__Sample *sm = req->sample;
    if (sm->n > self->limits.max_keys_per_request || sm->n_positives > self->limits.max_keys_per_request)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "n and positives must each be at most %u",
                               self->limits.max_keys_per_request);
    if (sm->n_positives > 0 && kb_service_check_keys(self, rp, sm->n_positives, sm->positives) != 0)
        return -1;
    kb_sampler_strategy_t strategy;
    switch (sm->strategy) {
    case CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM: strategy = KB_SAMPLER_UNIFORM; break;
    case CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM: strategy = KB_SAMPLER_LOG_UNIFORM; break;
    case CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM: strategy = KB_SAMPLER_UNIGRAM; break;
    default:
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "unknown strategy %d",
                               (int)sm->strategy);
    }
    kb_table_t *t = kb_service_table(self, rp, req->table);
    if (!t)
        return -1;
    if (s_refuse_cached(self, rp, t, "sample") != 0)
        return -1;
    size_t total = sm->n_positives + sm->n;
    Carls__SampleResult *res = &rp->r.sample;
    carls__sample_result__init(res);
    res->keys = kb_service_own(rp, carls_xcalloc(total ? total : 1, sizeof *res->keys));
    res->probabilities = kb_service_own(rp, carls_xcalloc(total ? total : 1, sizeof *res->probabilities));
    res->is_positive = kb_service_own(rp, carls_xcalloc(total ? total : 1, sizeof *res->is_positive));
    uint64_t seed = sm->seed;
    if (seed == 0 && carls_random_bytes(&seed, sizeof seed) != 0)
        seed = (uint64_t)carls_monotonic_us();
    double mass = 0;
    uint64_t rows = 0;
    int rc = kb_table_sample(t, strategy, sm->positives, sm->n_positives, sm->n, seed, res->keys,
                             res->probabilities, res->is_positive, &mass, &rows);
    kb_bank_release(self->bank, t);
    for (size_t i = 0; i < total; i++)
        if (res->keys[i].data)
            kb_service_own(rp, res->keys[i].data);
    if (rc == -ENODATA && sm->n > 0)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_NOT_FOUND,
                               "table '%s' has no rows that strategy can draw", req->table);
    if (rc != 0 && rc != -ENODATA)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INTERNAL, "sampling failed (%d)", rc);
    res->n_keys = res->n_probabilities = res->n_is_positive = total;
    res->mass = mass;
    res->rows = rows;
    rp->resp.result_case = CARLS__RESPONSE__RESULT_SAMPLE;
    rp->resp.sample = res;
    return 0;
}

/* Checks a feature record from the wire. */
int kb_service_check_record(kb_service_t *self, kb_service_reply_t *rp, size_t i, const Carls__FeatureRecord *r)
{
    if (!r)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "record %zu is missing", i);
    /* protobuf-c keeps unknown fields and can re-pack some of them (a multi-byte tag of field 0) into bytes
     * it then refuses to decode: storing them would acknowledge a record that can never be read back. */
    if (r->base.n_unknown_fields != 0)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "record %zu has %u fields this server "
                               "does not know", i, r->base.n_unknown_fields);
    if (r->n_neighbor_keys != r->n_neighbor_weights)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                               "record %zu: %zu neighbour keys but %zu weights", i, r->n_neighbor_keys,
                               r->n_neighbor_weights);
    if (r->n_neighbor_keys > self->limits.max_keys_per_request)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "record %zu: %zu neighbours; the limit is %u",
                               i, r->n_neighbor_keys, self->limits.max_keys_per_request);
    for (size_t j = 0; j < r->n_neighbor_keys; j++) {
        if (r->neighbor_keys[j].len == 0 || r->neighbor_keys[j].len > self->limits.max_key_bytes)
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "record %zu: neighbour key %zu is empty or longer than %u bytes", i, j,
                                   self->limits.max_key_bytes);
        if (!isfinite(r->neighbor_weights[j]))
            return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                   "record %zu: weight %zu is NaN or Inf", i, j);
    }
    if (r->label_case == CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL && !isfinite(r->float_label))
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "record %zu: label is NaN or Inf", i);
    if (!isfinite(r->label_confidence))
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "record %zu: confidence is NaN or Inf",
                               i);
    return 0;
}

static int s_apply_feature_put(kb_service_t *self, const Carls__Request *req, kb_table_t *table, kb_service_reply_t *rp)
{
    const Carls__FeaturePut *fp = req->feature_put;
    size_t n = fp->n_keys;
    uint8_t **bufs = carls_xcalloc(n, sizeof *bufs);
    size_t *lens = carls_xcalloc(n, sizeof *lens);
    int64_t now = carls_wall_ms();
    for (size_t i = 0; i < n; i++) {
        /* Stored as given, with the server's timestamp; `found` is a reply-only field. */
        Carls__FeatureRecord r = *fp->records[i];
        r.found = false;
        r.updated_at_ms = now;
        lens[i] = carls__feature_record__get_packed_size(&r);
        bufs[i] = carls_xmalloc(lens[i]);
        carls__feature_record__pack(&r, bufs[i]);
    }
    uint64_t reserved;
    int rc = kb_service_reserve_rows(self, rp, table, KB_GROW_FEATURE_PUT, fp->keys, n, lens, &reserved);
    if (rc == 0) {
        kb_table_feature_put(table, fp->keys, n, bufs, lens);
        kb_memory_release(kb_bank_memory(self->bank), reserved);
        kb_service_write_ok(rp, (uint32_t)n, false, 0);
    }
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    return rc;
}

static int s_op_feature_put(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__FeaturePut *fp = req->feature_put;
    if (kb_service_check_keys(self, rp, fp->n_keys, fp->keys) != 0)
        return -1;
    if (fp->n_records != fp->n_keys)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "%zu records for %zu keys",
                               fp->n_records, fp->n_keys);
    for (size_t i = 0; i < fp->n_records; i++)
        if (kb_service_check_record(self, rp, i, fp->records[i]) != 0)
            return -1;
    kb_table_t *t = s_table_of_kind(self, req, rp, KB_TABLE_FEATURE);
    if (!t)
        return -1;
    int rc = kb_service_run_write(self, req, t, rp, s_apply_feature_put);
    kb_bank_release(self->bank, t);
    return rc;
}

/* Decodes a stored record for a reply (kept in rp until packed); an empty "not found" one for NULL. */
Carls__FeatureRecord *kb_service_reply_record(kb_service_reply_t *rp, const uint8_t *buf, size_t len, bool found)
{
    Carls__FeatureRecord *r = NULL;
    if (found)
        r = carls__feature_record__unpack(NULL, len, buf);
    if (!r) {
        /* Not found (or, never expected, an unreadable stored record): answer an empty record. */
        r = carls__feature_record__unpack(NULL, 0, (const uint8_t *)"");
        if (!r)
            CARLS_FATAL("cannot decode an empty feature record");
        found = false;
    }
    r->found = found;
    rp->records = carls_xrealloc(rp->records, (rp->record_count + 1) * sizeof *rp->records);
    rp->records[rp->record_count++] = r;
    return r;
}

static int s_op_feature_get(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    const Carls__FeatureGet *fg = req->feature_get;
    kb_table_t *t = s_keyed_table(self, req, rp, fg->n_keys, fg->keys, KB_TABLE_FEATURE);
    if (!t)
        return -1;
    size_t n = fg->n_keys;
    uint8_t **bufs = carls_xcalloc(n, sizeof *bufs);
    size_t *lens = carls_xcalloc(n, sizeof *lens);
    bool *found = carls_xcalloc(n, sizeof *found);
    kb_table_feature_get(t, fg->keys, n, bufs, lens, found);
    kb_bank_release(self->bank, t);
    Carls__FeatureResult *res = &rp->r.features;
    carls__feature_result__init(res);
    res->n_records = n;
    res->records = kb_service_own(rp, carls_xcalloc(n, sizeof *res->records));
    for (size_t i = 0; i < n; i++) {
        res->records[i] = kb_service_reply_record(rp, bufs[i], lens[i], found[i]);
        free(bufs[i]);
    }
    free(bufs);
    free(lens);
    free(found);
    rp->resp.result_case = CARLS__RESPONSE__RESULT_FEATURES;
    rp->resp.features = res;
    return 0;
}

/* ---- replication (kb_replica.h answers the op and sets the role) ---- */

void kb_service_set_replication(kb_service_t *self, const kb_service_replication_t *replication)
{
    self->replication = *replication;
}

void kb_service_set_role(kb_service_t *self, uint64_t term, bool writable, const char *primary)
{
    pthread_mutex_lock(&self->primary_mutex);
    snprintf(self->primary, sizeof self->primary, "%s", primary ? primary : "");
    pthread_mutex_unlock(&self->primary_mutex);
    atomic_store(&self->term, term);
    atomic_store(&self->writable, writable);
}

static int s_op_replica(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    if (!self->replication.handle)
        return kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED,
                               "this server does not replicate (start it with --replica-of, --replication-listen or "
                               "--min-replicas)");
    carls__replica_result__init(&rp->r.replica);
    char err[512] = "";
    int status = self->replication.handle(self->replication.ctx, req->replica, &rp->r.replica, err, sizeof err);
    int rc = status == CARLS__STATUS_CODE__STATUS_OK ? 0 : kb_service_fail(rp, (Carls__StatusCode)status, "%s", err);
    /* The member's status goes with a refusal too (kb_service_fail clears the result; s_reply_free frees it by
     * this). */
    rp->resp.result_case = CARLS__RESPONSE__RESULT_REPLICA;
    rp->resp.replica = &rp->r.replica;
    return rc;
}

static int s_op_create(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    return kb_service_run_write(self, req, NULL, rp, s_apply_create);
}

static int s_op_drop(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    return kb_service_run_write(self, req, NULL, rp, s_apply_drop);
}

/* Every operation: its request case, its handler (0, or -1 with the status in rp), and what the envelope
 * must satisfy before it runs. */
static const struct {
    Carls__Request__OpCase op;
    int (*run)(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp);
    bool names_table; /* the table name is checked */
    bool write;       /* refused by a read-only server; needs client_id and sequence */
} s_ops[OP_COUNT] = {
    [OP_CREATE] = {CARLS__REQUEST__OP_CREATE_TABLE, s_op_create, true, true},
    [OP_DROP] = {CARLS__REQUEST__OP_DROP_TABLE, s_op_drop, true, true},
    [OP_LIST] = {CARLS__REQUEST__OP_LIST_TABLES, s_op_list, false, false},
    [OP_LOOKUP] = {CARLS__REQUEST__OP_LOOKUP, s_op_lookup, true, false},
    [OP_PUT] = {CARLS__REQUEST__OP_PUT, s_op_table_write, true, true},
    [OP_PUSH] = {CARLS__REQUEST__OP_PUSH_GRADIENTS, s_op_table_write, true, true},
    [OP_STATS] = {CARLS__REQUEST__OP_STATS, s_op_stats, false, false},
    [OP_CHECKPOINT] = {CARLS__REQUEST__OP_CHECKPOINT, s_op_checkpoint, false, false},
    [OP_KNN] = {CARLS__REQUEST__OP_KNN, s_op_knn, true, false},
    [OP_SAMPLE] = {CARLS__REQUEST__OP_SAMPLE, s_op_sample, true, false},
    [OP_FEATURE_GET] = {CARLS__REQUEST__OP_FEATURE_GET, s_op_feature_get, true, false},
    [OP_FEATURE_PUT] = {CARLS__REQUEST__OP_FEATURE_PUT, s_op_feature_put, true, true},
    [OP_SCAN] = {CARLS__REQUEST__OP_SCAN, kb_service_op_scan, true, false},
    [OP_IMPORT_ROWS] = {CARLS__REQUEST__OP_IMPORT_ROWS, kb_service_op_import_rows, true, true},
    [OP_SNAPSHOT] = {CARLS__REQUEST__OP_SNAPSHOT, kb_service_op_snapshot, false, false},
    [OP_REPLICA] = {CARLS__REQUEST__OP_REPLICA, s_op_replica, false, false},
};

static const char *s_op_name(int index) { return carls_op_name(s_ops[index].op); }

/* Validates the envelope and runs the operation. Returns the op index for latency, or -1. */
static int s_dispatch(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp)
{
    if (req->protocol_version != CARLS_PROTOCOL_VERSION) {
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_UNSUPPORTED_VERSION,
                        "protocol version %u is not supported; this server speaks %u", req->protocol_version,
                        CARLS_PROTOCOL_VERSION);
        return -1;
    }
    int index = 0;
    while (index < OP_COUNT && s_ops[index].op != req->op_case)
        index++;
    if (index == OP_COUNT) {
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED, "missing or unknown operation");
        return -1;
    }
    if (s_ops[index].names_table && !carls_table_name_valid(req->table)) {
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                        "table name must be 1..%u characters of [A-Za-z0-9_.-]", CARLS_MAX_TABLE_NAME_BYTES);
        return -1;
    }
    /* A follower's snapshot or checkpoint would wait for a commit that only its primary makes: both go to the
     * primary, like writes. Listing and deleting snapshots works on this member's own files. */
    const bool creates_snapshot = index == OP_SNAPSHOT && req->snapshot &&
                                  req->snapshot->action == CARLS__SNAPSHOT_ACTION__SNAPSHOT_CREATE;
    const bool primary_only = s_ops[index].write || creates_snapshot || index == OP_CHECKPOINT;
    if (primary_only && !atomic_load(&self->writable)) {
        pthread_mutex_lock(&self->primary_mutex);
        rp->resp.primary = kb_service_own(rp, strdup(self->primary));
        pthread_mutex_unlock(&self->primary_mutex);
        if (!rp->resp.primary)
            CARLS_FATAL("out of memory");
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_NOT_PRIMARY,
                        "this member of the shard is not its primary%s%s; %s refused",
                        rp->resp.primary[0] ? ": the primary is " : "", rp->resp.primary, s_op_name(index));
        return -1;
    }
    if (s_ops[index].write) {
        char short_why[200];
        if (kb_commit_replicas_short(self->commit, short_why, sizeof short_why) ||
            !kb_commit_leased(self->commit, short_why, sizeof short_why)) {
            kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_UNAVAILABLE, "%s refused, nothing changed: %s (retry later)",
                            s_op_name(index), short_why);
            return -1;
        }
        if (self->limits.read_only) {
            kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_READ_ONLY, "this server is read-only; %s refused",
                            s_op_name(index));
            return -1;
        }
        if (req->client_id == 0 || req->sequence == 0) {
            kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "writes need a nonzero client_id and sequence (for exactly-once retries)");
            return -1;
        }
    }
    if (!s_ops[index].write && (req->max_staleness_ms || req->max_lag_epochs || req->min_epoch) &&
        !atomic_load(&self->writable) && self->replication.check_read) {
        char why[256];
        uint64_t applied = 0;
        if (self->replication.check_read(self->replication.ctx, req->max_staleness_ms, req->max_lag_epochs,
                                         req->min_epoch, &applied, why, sizeof why) != 0) {
            kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_STALE, "this follower is behind its bounds: %s", why);
            return -1;
        }
        rp->resp.epoch = applied;
    }
    s_ops[index].run(self, req, rp);
    return index;
}

/* Packs rp's response into a malloc'd buffer. */
static void s_pack(kb_service_reply_t *rp, uint8_t **reply, size_t *reply_len)
{
    *reply_len = carls__response__get_packed_size(&rp->resp);
    *reply = carls_xmalloc(*reply_len ? *reply_len : 1);
    carls__response__pack(&rp->resp, *reply);
}

/* A bump allocator for decoding one request: protobuf-c allocates every key of a request separately, and
 * a lookup of 256 keys spent more on malloc and free than on its keys. The buffer is the handler's stack;
 * what does not fit (a push's gradient array, say) comes from malloc as before. */
#define S_ARENA_BYTES (32 * 1024)

typedef struct {
    uint8_t *buf;
    size_t used;
} s_arena_t;

static void *s_arena_alloc(void *data, size_t size)
{
    s_arena_t *a = data;
    size_t at = (a->used + 15u) & ~(size_t)15u;
    if (size <= S_ARENA_BYTES && at <= S_ARENA_BYTES - size) {
        a->used = at + size;
        return a->buf + at;
    }
    return malloc(size);
}

static void s_arena_free(void *data, void *ptr)
{
    s_arena_t *a = data;
    if ((uint8_t *)ptr < a->buf || (uint8_t *)ptr >= a->buf + S_ARENA_BYTES)
        free(ptr);
}

/* Handles one frame. With deferred NULL, a sync write's reply waits here for its commit; otherwise the
 * commit it needs is returned in *deferred and the caller parks the reply. */
static void s_handle(kb_service_t *self, const uint8_t *frame, size_t len, uint8_t **reply, size_t *reply_len,
                     kb_service_deferred_t *deferred)
{
    int64_t t0 = carls_monotonic_us();
    kb_service_reply_t *rp = carls_xcalloc(1, sizeof *rp);
    carls__response__init(&rp->resp);
    rp->resp.protocol_version = CARLS_PROTOCOL_VERSION;
    int op_index = -1;
    Carls__Request *req = NULL;
    _Alignas(16) uint8_t arena_buf[S_ARENA_BYTES];
    s_arena_t arena = {arena_buf, 0};
    ProtobufCAllocator allocator = {s_arena_alloc, s_arena_free, &arena};

    atomic_fetch_add(&self->requests, 1);
    if (len > self->limits.max_message_bytes) {
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "message of %zu bytes; the limit is %u", len,
                        self->limits.max_message_bytes);
    } else if (!(req = carls__request__unpack(&allocator, len, frame))) {
        atomic_fetch_add(&self->malformed, 1);
        kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_MALFORMED, "request could not be decoded (%zu bytes)", len);
    } else {
        rp->resp.request_id = req->request_id;
        op_index = s_dispatch(self, req, rp);
    }
    rp->resp.term = atomic_load(&self->term);
    if (rp->durable_ticket && !deferred) {
        char err[512];
        if (kb_commit_wait_durable(self->commit, rp->durable_ticket, self->limits.commit_timeout_ms, err, sizeof err) != 0)
            kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_INTERNAL, "%s", err);
        else if (!kb_commit_leased(self->commit, err, sizeof err))
            kb_service_fail(rp, CARLS__STATUS_CODE__STATUS_UNAVAILABLE, "%s", err);
    }
    if (deferred) {
        deferred->durable_ticket = rp->durable_ticket;
        deferred->request_id = rp->resp.request_id;
    }
    if (rp->resp.status != CARLS__STATUS_CODE__STATUS_OK) {
        atomic_fetch_add(&self->errors, 1);
        LOG_DEBUG("request %llu: %s: %s", (unsigned long long)rp->resp.request_id,
                  carls_status_name(rp->resp.status), rp->error);
    }
    s_pack(rp, reply, reply_len);

    kb_service_table_counters_t *tc = NULL;
    bool ok = rp->resp.status == CARLS__STATUS_CODE__STATUS_OK;
    /* Per table: requests that named an existing table, or created one. The name was validated by
     * s_dispatch for every op that has one (op_index >= 0 means dispatch ran the operation). */
    if (op_index >= 0 && op_index != OP_LIST && op_index != OP_CHECKPOINT &&
        rp->resp.status != CARLS__STATUS_CODE__STATUS_NOT_FOUND && req->table && req->table[0] &&
        carls_table_name_valid(req->table) && (op_index != OP_CREATE || ok))
        tc = s_table_counters(self, req->table, true);
    if (tc && !ok)
        atomic_fetch_add(&tc->errors, 1);
    s_reply_free(self, rp);
    if (req)
        carls__request__free_unpacked(req, &allocator);
    if (op_index >= 0) {
        uint64_t us = (uint64_t)(carls_monotonic_us() - t0);
        kb_latency_record(&self->latency[op_index], us);
        if (tc)
            kb_latency_record(&tc->latency[op_index], us);
    }
}

void kb_service_handle(kb_service_t *self, const uint8_t *frame, size_t len, uint8_t **reply, size_t *reply_len)
{
    s_handle(self, frame, len, reply, reply_len, NULL);
}

void kb_service_handle_deferred(kb_service_t *self, const uint8_t *frame, size_t len, uint8_t **reply,
                                size_t *reply_len, kb_service_deferred_t *deferred)
{
    s_handle(self, frame, len, reply, reply_len, deferred);
}

void kb_service_error_reply(kb_service_t *self, uint64_t request_id, const char *error, uint8_t **reply,
                            size_t *reply_len)
{
    kb_service_status_reply(self, request_id, CARLS__STATUS_CODE__STATUS_INTERNAL, error, reply, reply_len);
}

void kb_service_status_reply(kb_service_t *self, uint64_t request_id, Carls__StatusCode status, const char *error,
                             uint8_t **reply, size_t *reply_len)
{
    kb_service_reply_t *rp = carls_xcalloc(1, sizeof *rp);
    carls__response__init(&rp->resp);
    rp->resp.protocol_version = CARLS_PROTOCOL_VERSION;
    rp->resp.request_id = request_id;
    kb_service_fail(rp, status, "%s", error);
    atomic_fetch_add(&self->errors, 1);
    s_pack(rp, reply, reply_len);
    s_reply_free(self, rp);
}

kb_commit_t *kb_service_commit(kb_service_t *self) { return self->commit; }

int kb_service_commit_timeout_ms(const kb_service_t *self) { return self->limits.commit_timeout_ms; }

bool kb_service_request_may_block(const uint8_t *frame, size_t len)
{
    switch (carls_request_peek_op(frame, len)) {
    case CARLS__REQUEST__OP_CREATE_TABLE:
    case CARLS__REQUEST__OP_DROP_TABLE:
    case CARLS__REQUEST__OP_STATS:
    case CARLS__REQUEST__OP_CHECKPOINT:
    case CARLS__REQUEST__OP_KNN:
    case CARLS__REQUEST__OP_SAMPLE:
    case CARLS__REQUEST__OP_SCAN:
    case CARLS__REQUEST__OP_SNAPSHOT:
    case CARLS__REQUEST__OP_REPLICA:
        return true;
    default:
        return false;
    }
}

int kb_service_stats_snapshot(kb_service_t *self, Carls__StatsResult **out)
{
    assert(self && out);
    *out = NULL;
    kb_service_reply_t *rp = carls_xcalloc(1, sizeof *rp);
    carls__response__init(&rp->resp);
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = "";
    int rc = s_op_stats(self, &req, rp);
    if (rc == 0) {
        /* Packed and unpacked again: the copy owns everything it points to, so the caller frees it with
         * protobuf-c's free_unpacked and no table is held past this call. */
        size_t len = carls__stats_result__get_packed_size(&rp->r.stats);
        uint8_t *buf = carls_xmalloc(len ? len : 1);
        carls__stats_result__pack(&rp->r.stats, buf);
        *out = carls__stats_result__unpack(NULL, len, buf);
        free(buf);
        rc = *out ? 0 : -1;
    }
    s_reply_free(self, rp);
    return rc;
}
