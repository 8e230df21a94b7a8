#include "kb_bank.h"
#include "kb_bank_internal.h"

#include "kb_batch.h"
#include "kb_cache.h"
#include "kb_dedup.h"
#include "kb_journal.h"
#include "kb_memory.h"
#include "kb_store.h"
#include "kb_table_config.h"
#include "log.h"
#include "util.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- registry ---- */

static kb_bank_entry_t *s_find_entry(kb_bank_t *self, const char *name)
{
    for (size_t i = 0; i < self->entry_count; i++)
        if (!self->entries[i].dropped && strcmp(kb_table_name(self->entries[i].table), name) == 0)
            return &self->entries[i];
    return NULL;
}

void kb_bank_add_entry(kb_bank_t *self, kb_table_t *table)
{
    if (self->entry_count == self->entry_capacity) {
        self->entry_capacity = self->entry_capacity ? self->entry_capacity * 2 : 8;
        self->entries = carls_xrealloc(self->entries, self->entry_capacity * sizeof *self->entries);
    }
    self->entries[self->entry_count++] = (kb_bank_entry_t){.table = table, .refs = 1, .dropped = false};
}

/* Drops one reference; frees the table and its entry when it was the last (then returns true). Registry
 * mutex held. */
bool kb_bank_unref_entry(kb_bank_t *self, size_t index)
{
    kb_bank_entry_t *e = &self->entries[index];
    if (--e->refs > 0)
        return false;
    kb_table_destroy(&e->table);
    self->entries[index] = self->entries[--self->entry_count];
    return true;
}

/* After a dropped table was freed: its rows were many small blocks spread over the heap; hand the whole free
 * pages among them back to the system, so the resident size follows the estimate down (glibc keeps them
 * otherwise). Called without the registry mutex: on a large heap this takes a while. */
void kb_bank_trim(void) { malloc_trim(0); }

kb_table_t *kb_bank_acquire(kb_bank_t *self, const char *name)
{
    pthread_mutex_lock(&self->registry_mutex);
    kb_bank_entry_t *e = s_find_entry(self, name);
    kb_table_t *t = NULL;
    if (e) {
        e->refs++;
        t = e->table;
    }
    pthread_mutex_unlock(&self->registry_mutex);
    return t;
}

void kb_bank_release(kb_bank_t *self, kb_table_t *table)
{
    if (!table)
        return;
    bool freed = false;
    pthread_mutex_lock(&self->registry_mutex);
    for (size_t i = 0; i < self->entry_count; i++) {
        if (self->entries[i].table == table) {
            freed = kb_bank_unref_entry(self, i);
            break;
        }
    }
    pthread_mutex_unlock(&self->registry_mutex);
    if (freed)
        kb_bank_trim();
}

static int s_compare_tables(const void *a, const void *b)
{
    return strcmp(kb_table_name(*(kb_table_t *const *)a), kb_table_name(*(kb_table_t *const *)b));
}

size_t kb_bank_acquire_all(kb_bank_t *self, kb_table_t ***out)
{
    pthread_mutex_lock(&self->registry_mutex);
    kb_table_t **list = carls_xcalloc(self->entry_count + 1, sizeof *list);
    size_t n = 0;
    for (size_t i = 0; i < self->entry_count; i++) {
        if (self->entries[i].dropped)
            continue;
        self->entries[i].refs++;
        list[n++] = self->entries[i].table;
    }
    pthread_mutex_unlock(&self->registry_mutex);
    qsort(list, n, sizeof *list, s_compare_tables);
    *out = list;
    return n;
}

static void s_queue_op(kb_bank_t *self, kb_table_op_t op)
{
    if (self->op_count == self->op_capacity) {
        self->op_capacity = self->op_capacity ? self->op_capacity * 2 : 8;
        self->ops = carls_xrealloc(self->ops, self->op_capacity * sizeof *self->ops);
    }
    self->ops[self->op_count++] = op;
}

int kb_bank_create_table(kb_bank_t *self, const char *name, const kb_table_config_t *cfg, bool if_not_exists)
{
    pthread_mutex_lock(&self->registry_mutex);
    kb_bank_entry_t *e = s_find_entry(self, name);
    if (e) {
        int rc = KB_BANK_EEXISTS;
        if (if_not_exists)
            rc = memcmp(kb_table_config(e->table), cfg, sizeof *cfg) == 0 ? KB_BANK_OK : KB_BANK_ECONFLICT;
        pthread_mutex_unlock(&self->registry_mutex);
        return rc;
    }
    int64_t id = self->next_table_id++;
    kb_table_t *table = kb_table_new(id, name, cfg);
    kb_table_set_memory(table, self->mem);
    kb_table_set_cache(table, self->cache); /* --cache-bytes: ignored by tables that stay resident */
    kb_bank_add_entry(self, table);
    kb_table_op_t op = {.drop = false, .id = id, .name = strdup(name)};
    if (!op.name)
        CARLS_FATAL("out of memory");
    op.config = kb_table_config_pack(cfg, &op.config_len);
    s_queue_op(self, op);
    pthread_mutex_unlock(&self->registry_mutex);
    LOG_INFO("created table %s (dim %u)", name, cfg->dim);
    return KB_BANK_OK;
}

int kb_bank_drop_table(kb_bank_t *self, const char *name)
{
    pthread_mutex_lock(&self->registry_mutex);
    kb_bank_entry_t *e = s_find_entry(self, name);
    if (!e) {
        pthread_mutex_unlock(&self->registry_mutex);
        return KB_BANK_ENOTFOUND;
    }
    e->dropped = true;
    s_queue_op(self, (kb_table_op_t){.drop = true, .id = kb_table_id(e->table)});
    bool freed = kb_bank_unref_entry(self, (size_t)(e - self->entries));
    pthread_mutex_unlock(&self->registry_mutex);
    if (freed)
        kb_bank_trim();
    LOG_INFO("dropped table %s", name);
    return KB_BANK_OK;
}

/* The commit pipeline's view of the registry (kb_commit_tables_t). */
static size_t s_acquire_all_tables(void *ctx, kb_table_t ***out) { return kb_bank_acquire_all(ctx, out); }

static void s_release_table(void *ctx, kb_table_t *table) { kb_bank_release(ctx, table); }

/* Moves the table creates and drops queued since the last round onto b. */
static void s_take_ops(void *ctx, kb_batch_t *b)
{
    kb_bank_t *self = ctx;
    pthread_mutex_lock(&self->registry_mutex);
    if (self->op_count) {
        b->ops = carls_xrealloc(b->ops, (b->op_count + self->op_count) * sizeof *b->ops);
        memcpy(b->ops + b->op_count, self->ops, self->op_count * sizeof *self->ops);
        b->op_count += self->op_count;
        self->op_count = 0;
    }
    pthread_mutex_unlock(&self->registry_mutex);
}

/* ---- the commit pipeline (kb_commit.h) ---- */

kb_commit_t *kb_bank_commit(kb_bank_t *self) { return self->commit; }

/* ---- tables larger than memory (kb_cache.h) ---- */

static int s_load_cached_row(void *ctx, const kb_store_row_t *rec)
{
    kb_table_t *table = ctx;
    if (kb_table_restore_row(table, rec) != 0)
        LOG_WARN("row of table %s does not match its config; skipped", kb_table_name(table));
    return 0;
}

/* Start-up with --cache-bytes: the rows of cacheable tables stay in storage (only those holding pending
 * gradients are loaded, so max_age_ms still applies to them); other tables are loaded whole. */
static int s_load_cached(kb_bank_t *self)
{
    for (size_t i = 0; i < self->entry_count; i++) {
        kb_table_t *table = self->entries[i].table;
        bool cacheable = kb_table_cacheable(kb_table_config(table));
        if (cacheable)
            kb_table_set_cache(table, self->cache);
        uint64_t rows = 0;
        int64_t max_id = 0;
        if (kb_store_load_table(self->store, kb_table_id(table), !cacheable, s_load_cached_row, table, &rows,
                                &max_id) != 0)
            return -1;
        if (cacheable)
            kb_table_set_stored(table, rows, max_id);
        else
            LOG_INFO("table %s stays wholly in memory (%s)", kb_table_name(table),
                     kb_table_config(table)->knn ? "a nearest-neighbour index" : "an eviction policy");
    }
    return 0;
}

/* Opens the cache's read connection (what else takes memory from --cache-bytes, SQLite's lag behind the
 * journal, the commit pipeline bounds). */
static int s_open_cache(kb_bank_t *self, uint32_t page_cache_kib, char *err, size_t errlen)
{
    kb_store_reader_t *reader = NULL;
    if (kb_store_reader_open(self->data_dir, page_cache_kib, &reader, err, errlen) != 0)
        return -1;
    self->cache = kb_cache_new(self->opts.cache_bytes, reader);
    return 0;
}

bool kb_bank_cache_stats(kb_bank_t *self, kb_cache_stats_t *out)
{
    if (!self->cache)
        return false;
    kb_cache_get_stats(self->cache, out);
    return true;
}

/* ---- open / close ---- */

static int s_load_table(void *ctx, int64_t id, const char *name, const uint8_t *config, size_t len)
{
    kb_bank_t *self = ctx;
    kb_table_config_t cfg;
    char err[256];
    if (kb_table_config_unpack(config, len, &cfg, err, sizeof err) != 0) {
        LOG_ERROR("table %s in the database has an unreadable config (%s); refusing to start", name, err);
        return -1;
    }
    kb_table_t *table = kb_table_new(id, name, &cfg);
    kb_table_set_memory(table, self->mem);
    kb_bank_add_entry(self, table);
    if (id >= self->next_table_id)
        self->next_table_id = id + 1;
    return 0;
}

static int s_load_row(void *ctx, const kb_store_row_t *rec)
{
    kb_bank_t *self = ctx;
    for (size_t i = 0; i < self->entry_count; i++) {
        if (kb_table_id(self->entries[i].table) == rec->table_id) {
            if (kb_table_restore_row(self->entries[i].table, rec) != 0)
                LOG_WARN("row of table %s does not match its config; skipped",
                         kb_table_name(self->entries[i].table));
            return 0;
        }
    }
    return 0; /* rows of dropped tables are deleted with the drop; ignore leftovers */
}

static int s_load_client(void *ctx, uint64_t client_id, uint64_t max_seq, const uint8_t *window, size_t len)
{
    kb_bank_t *self = ctx;
    if (kb_dedup_restore(self->dedup, client_id, max_seq, window, len) != 0)
        LOG_WARN("client %llx: malformed de-duplication record skipped", (unsigned long long)client_id);
    return 0;
}

/* Decodes the journal record of `epoch` into *b. 0, or -1 (logged; *b holds nothing) when it does not decode
 * or holds another epoch's batch. */
static int s_decode_record(uint64_t epoch, const uint8_t *payload, size_t len, kb_batch_t *b)
{
    char err[256];
    if (kb_batch_decode(payload, len, b, err, sizeof err) != 0) {
        LOG_ERROR("journal record of epoch %llu: %s", (unsigned long long)epoch, err);
        return -1;
    }
    if (b->epoch != epoch) {
        LOG_ERROR("journal record of epoch %llu holds a batch of epoch %llu", (unsigned long long)epoch,
                  (unsigned long long)b->epoch);
        kb_batch_free(b);
        return -1;
    }
    return 0;
}

/* Replays one journal record into the store's open transaction. */
static int s_replay_record(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len)
{
    kb_bank_t *self = ctx;
    kb_batch_t b;
    if (s_decode_record(epoch, payload, len, &b) != 0)
        return -1;
    int rc = kb_batch_write_into(&b, self->store, false);
    kb_batch_free(&b);
    return rc;
}

/* Start-up: writes the journal's records newer than the store's last compacted epoch into SQLite (one
 * transaction), then removes the journal; *last_epoch: the newest one seen, which new epochs follow. */
static int s_replay_journal(kb_bank_t *self, uint64_t *last_epoch, char *err, size_t errlen)
{
    uint64_t compacted = kb_store_get_meta(self->store, "journal_epoch"), last = compacted;
    if (kb_store_begin(self->store) != 0)
        return carls_errorf(err, errlen, -1, "journal replay: %s", kb_store_last_error(self->store));
    int64_t t0 = carls_monotonic_ms();
    int rc = kb_journal_replay(self->data_dir, compacted, s_replay_record, self, &last, err, errlen);
    if (rc == 0 && last > compacted && kb_store_put_meta(self->store, "journal_epoch", last) != 0)
        rc = carls_errorf(err, errlen, -1, "journal replay: %s", kb_store_last_error(self->store));
    if (rc == 0 && kb_store_commit(self->store) != 0)
        rc = carls_errorf(err, errlen, -1, "journal replay: %s", kb_store_last_error(self->store));
    if (rc != 0) {
        kb_store_rollback(self->store);
        return -1;
    }
    if (last > compacted)
        LOG_INFO("replayed the journal's epochs after %llu, up to %llu, into the store in %lld ms",
                 (unsigned long long)compacted, (unsigned long long)last,
                 (long long)(carls_monotonic_ms() - t0));
    if (kb_journal_remove_all(self->data_dir, err, errlen) != 0)
        return -1;
    *last_epoch = last;
    return 0;
}

/* ---- read-only open (kb-server --read-only; docs/STATE.md "Read-only serving") ---- */

/* Drops the table with this id from the registry (start-up only, nothing shares it yet). */
static void s_unload_table(kb_bank_t *self, int64_t id)
{
    for (size_t i = 0; i < self->entry_count; i++) {
        if (kb_table_id(self->entries[i].table) == id) {
            kb_table_destroy(&self->entries[i].table);
            self->entries[i] = self->entries[--self->entry_count];
            return;
        }
    }
}

/* Applies one journal record to the tables in memory, as s_replay_record applies it to the store: table
 * creates and drops, then whole rows, deletions and use counts. De-duplication records are not needed by a
 * server that takes no writes. */
static int s_replay_record_in_memory(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len)
{
    kb_bank_t *self = ctx;
    kb_batch_t b;
    if (s_decode_record(epoch, payload, len, &b) != 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < b.op_count; i++) {
        const kb_table_op_t *op = &b.ops[i];
        bool exists = false;
        for (size_t j = 0; j < self->entry_count && !exists; j++)
            exists = kb_table_id(self->entries[j].table) == op->id;
        if (op->drop)
            s_unload_table(self, op->id);
        else if (!exists) /* a table id is created once; the store would keep an existing one's rows too */
            rc = s_load_table(self, op->id, op->name, op->config, op->config_len);
    }
    for (size_t i = 0; rc == 0 && i < b.row_count; i++) {
        kb_table_t *t = NULL;
        for (size_t j = 0; j < self->entry_count && !t; j++)
            if (kb_table_id(self->entries[j].table) == b.rows[i].table_id)
                t = self->entries[j].table;
        if (t && kb_table_replay_row(t, &b.rows[i]) != 0)
            LOG_WARN("journal: a row of table %s does not match its config; skipped", kb_table_name(t));
    }
    kb_batch_free(&b);
    return rc;
}

/* kb_bank_open for opts->read_only: loads the store read-only, replays the journal's newer epochs into the
 * tables in memory (the journal files stay as they are) and freezes every table's pending gradients; the
 * bank starts no thread: nothing is ever committed, compacted, swept or removed. *compacted_epoch: the
 * store's newest epoch; *last_epoch: the journal's. */
static int s_open_read_only(kb_bank_t *self, uint64_t *compacted_epoch, uint64_t *last_epoch, char *err,
                            size_t errlen)
{
    int64_t t0 = carls_monotonic_ms();
    if (kb_store_open_read_only(self->data_dir, &self->store, err, errlen) != 0)
        return -1;
    if (kb_store_load(self->store, s_load_table, s_load_row, s_load_client, self) != 0)
        return carls_errorf(err, errlen, -1, "loading %s failed: %s", self->data_dir,
                            kb_store_last_error(self->store));
    uint64_t compacted = kb_store_get_meta(self->store, "journal_epoch"), last = compacted;
    if (kb_journal_replay(self->data_dir, compacted, s_replay_record_in_memory, self, &last, err, errlen) != 0)
        return -1;
    size_t rows = 0;
    for (size_t i = 0; i < self->entry_count; i++) {
        kb_table_set_read_only(self->entries[i].table, true);
        rows += kb_table_row_count(self->entries[i].table);
    }
    *compacted_epoch = compacted;
    *last_epoch = last;
    LOG_INFO("read-only: loaded %zu tables, %zu rows from %s in %lld ms (store up to epoch %llu, journal in "
             "memory up to %llu); nothing will be written",
             self->entry_count, rows, self->data_dir, (long long)(carls_monotonic_ms() - t0),
             (unsigned long long)compacted, (unsigned long long)last);
    return 0;
}

/* Hands the loaded tables to a new commit pipeline (which takes the journal, when there is one). */
static void s_new_commit(kb_bank_t *self, uint64_t compacted_epoch, uint64_t committed_epoch)
{
    kb_commit_options_t copts = {
        .data_dir = self->data_dir,
        .sync = self->opts.sync,
        .interval_ms = self->opts.interval_ms,
        .frequency_period_ms = self->opts.frequency_period_ms,
        .compacted_epoch = compacted_epoch,
        .committed_epoch = committed_epoch,
        .compact_delay_ms = self->opts.compact_delay_ms,
        .max_memory = self->opts.max_memory,
        .cache_bytes = self->opts.cache_bytes,
        .read_only = self->opts.read_only,
        .replica = self->opts.replica && !self->opts.read_only,
        .min_replicas = self->opts.read_only ? 0 : self->opts.min_replicas,
        .store = self->store,
        .journal = self->journal,
        .dedup = self->dedup,
        .mem = self->mem,
        .cache = self->cache,
    };
    kb_commit_tables_t tables = {
        .acquire_all = s_acquire_all_tables,
        .release = s_release_table,
        .take_ops = s_take_ops,
        .check_replicated = kb_bank_check_replicated,
        .apply_replicated = kb_bank_apply_replicated_batch,
        .ctx = self,
    };
    self->commit = kb_commit_new(&copts, &tables);
    self->journal = NULL; /* the pipeline's now */
}

int kb_bank_open(const kb_bank_options_t *opts, kb_bank_t **out, char *err, size_t errlen)
{
    *out = NULL;
    kb_bank_t *self = carls_xcalloc(1, sizeof *self);
    self->opts = *opts;
    self->data_dir = strdup(opts->data_dir);
    if (!self->data_dir)
        CARLS_FATAL("out of memory");
    self->opts.data_dir = self->data_dir;
    if (!self->opts.sync && self->opts.interval_ms == 0)
        self->opts.interval_ms = 1000;
    if (self->opts.frequency_period_ms == 0)
        self->opts.frequency_period_ms = 10000;
    if (self->opts.compact_delay_ms == 0)
        self->opts.compact_delay_ms = 5000;
    self->next_table_id = 1;
    self->dedup = kb_dedup_new();
    self->mem = kb_memory_new(opts->max_memory);
    pthread_mutex_init(&self->registry_mutex, NULL);

    if (opts->read_only) {
        uint64_t compacted = 0, last = 0;
        if (s_open_read_only(self, &compacted, &last, err, errlen) != 0)
            goto fail;
        s_new_commit(self, compacted, last);
        *out = self;
        return 0;
    }

    if (kb_store_open(self->data_dir, opts->sync, &self->store, err, errlen) != 0)
        goto fail;
    /* A larger page cache than SQLite's 2 MiB: compaction writes rows all over the B-tree, and with the
     * default most of its time went to reading pages back (pread). 32 MiB, or a sixteenth of --max-memory
     * when that is less (at least the default): the cache is resident memory the estimate does not count. */
    uint64_t cache_kib = 32768;
    if (opts->max_memory && opts->max_memory / 16 / 1024 < cache_kib)
        cache_kib = opts->max_memory / 16 / 1024 > 2048 ? opts->max_memory / 16 / 1024 : 2048;
    /* --cache-bytes: the same share of it, for this connection and the cache's read connection each. */
    if (opts->cache_bytes && opts->cache_bytes / 16 / 1024 < cache_kib)
        cache_kib = opts->cache_bytes / 16 / 1024 > 2048 ? opts->cache_bytes / 16 / 1024 : 2048;
    if (kb_store_set_cache(self->store, (uint32_t)cache_kib) != 0)
        LOG_WARN("cannot set SQLite's page cache to %llu KiB: %s", (unsigned long long)cache_kib,
                 kb_store_last_error(self->store));
    int64_t t0 = carls_monotonic_ms();
    uint64_t last = 0;
    if (s_replay_journal(self, &last, err, errlen) != 0)
        goto fail;
    if (kb_journal_open(self->data_dir, opts->sync, opts->journal_segment_bytes, &self->journal, err, errlen) != 0)
        goto fail;
    if (opts->cache_bytes) {
        if (s_open_cache(self, (uint32_t)cache_kib, err, errlen) != 0)
            goto fail;
        kb_cache_set_compacted(self->cache, last);
    }
    if (kb_store_load(self->store, s_load_table, self->cache ? NULL : s_load_row, s_load_client, self) != 0 ||
        (self->cache && s_load_cached(self) != 0)) {
        snprintf(err, errlen, "loading %s failed: %s", self->data_dir, kb_store_last_error(self->store));
        goto fail;
    }
    size_t rows = 0;
    for (size_t i = 0; i < self->entry_count; i++)
        rows += kb_table_row_count(self->entries[i].table);
    s_new_commit(self, last, last); /* counts the de-duplication records in the estimate */
    LOG_INFO("loaded %zu tables, %zu rows, %zu clients from %s in %lld ms (estimated memory %llu MiB%s)",
             self->entry_count, rows, kb_dedup_client_count(self->dedup), self->data_dir,
             (long long)(carls_monotonic_ms() - t0), (unsigned long long)(kb_memory_used(self->mem) >> 20),
             kb_memory_limit(self->mem) && kb_memory_used(self->mem) > kb_memory_limit(self->mem)
                 ? ", over --max-memory: requests that create rows will be refused"
                 : "");

    if (opts->replica) {
        for (size_t i = 0; i < self->entry_count; i++)
            kb_table_set_read_only(self->entries[i].table, true);
    }
    kb_commit_start(self->commit);
    *out = self;
    return 0;
fail:
    kb_bank_close(&self);
    return -1;
}

void kb_bank_close(kb_bank_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_bank_t *self = *self_p;
    kb_commit_destroy(&self->commit); /* its last round commits and compacts the tables' changes */
    kb_journal_close(&self->journal); /* a start-up that failed before the pipeline took it */
    for (size_t i = 0; i < self->entry_count; i++)
        kb_table_destroy(&self->entries[i].table);
    free(self->entries);
    kb_cache_stats_t cs;
    if (kb_bank_cache_stats(self, &cs))
        LOG_INFO("cache of %llu MiB: %llu rows looked for in storage, %llu read back, %llu left memory",
                 (unsigned long long)(cs.budget >> 20), (unsigned long long)cs.reads, (unsigned long long)cs.loads,
                 (unsigned long long)cs.evictions);
    kb_cache_destroy(&self->cache); /* after the tables, which count their memory in it */
    kb_memory_destroy(&self->mem);
    kb_table_ops_free(self->ops, self->op_count);
    free(self->ops);
    kb_store_close(&self->store);
    kb_dedup_destroy(&self->dedup);
    pthread_mutex_destroy(&self->registry_mutex);
    free(self->data_dir);
    free(self);
    *self_p = NULL;
}

kb_memory_t *kb_bank_memory(kb_bank_t *self) { return self->mem; }

/* ---- snapshots (kb_snapshot.h) ---- */

const char *kb_bank_data_dir(const kb_bank_t *self) { return self->data_dir; }
