/* A bank that takes its epochs from a primary (docs/REPLICATION.md): the ship hook a primary hands its rounds
 * to, a follower's replica mode (kb_bank_apply_replicated applies the primary's records), promotion, the
 * durable point with --min-replicas, and fencing. The bank's state is kb_bank_internal.h. */
#include "kb_bank.h"
#include "kb_bank_internal.h"

#include "kb_table_config.h"
#include "log.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- replication (docs/REPLICATION.md) ---- */

uint64_t kb_commit_set_ship_hook(kb_commit_t *self, kb_commit_ship_fn hook, void *ctx)
{
    pthread_mutex_lock(&self->ship_mutex);
    self->ship_hook = hook;
    self->ship_hook_ctx = ctx;
    /* Rounds are collected, then shipped in order: every record the hook will not see is of an epoch <= this. */
    pthread_mutex_lock(&self->commit_mutex);
    uint64_t shipped_before = self->record_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    pthread_mutex_unlock(&self->ship_mutex);
    return shipped_before;
}

/* Publishes a change of the durable point to waiters and to the transport (commit mutex held). */
static void s_publish_locked(kb_commit_t *self)
{
    pthread_cond_broadcast(&self->commit_cond);
    if (self->commit_hook)
        self->commit_hook(self->commit_hook_ctx);
}

void kb_commit_set_replicated(kb_commit_t *self, uint64_t epoch)
{
    pthread_mutex_lock(&self->commit_mutex);
    if (epoch > self->replicated_epoch) {
        self->replicated_epoch = epoch;
        s_publish_locked(self);
    }
    pthread_mutex_unlock(&self->commit_mutex);
}

void kb_commit_set_min_replicas(kb_commit_t *self, uint32_t min_replicas)
{
    pthread_mutex_lock(&self->commit_mutex);
    self->min_replicas = min_replicas;
    s_publish_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
}

uint32_t kb_commit_min_replicas(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    uint32_t k = self->min_replicas;
    pthread_mutex_unlock(&self->commit_mutex);
    return k;
}

void kb_commit_set_replicas_short(kb_commit_t *self, const char *reason)
{
    if (!reason && !atomic_load(&self->replicas_short))
        return;
    pthread_mutex_lock(&self->commit_mutex);
    if (reason && !atomic_load(&self->replicas_short))
        LOG_WARN("new writes are refused until enough followers are back: %s", reason);
    else if (!reason)
        LOG_INFO("enough followers again: writes are accepted");
    snprintf(self->short_reason, sizeof self->short_reason, "%s", reason ? reason : "");
    atomic_store(&self->replicas_short, reason != NULL);
    pthread_mutex_unlock(&self->commit_mutex);
}

bool kb_commit_replicas_short(kb_commit_t *self, char *why, size_t whylen)
{
    if (!atomic_load(&self->replicas_short))
        return false;
    pthread_mutex_lock(&self->commit_mutex);
    snprintf(why, whylen, "%s", self->short_reason);
    pthread_mutex_unlock(&self->commit_mutex);
    return true;
}

void kb_commit_fence(kb_commit_t *self, const char *reason)
{
    pthread_mutex_lock(&self->commit_mutex);
    if (!atomic_load(&self->fenced)) {
        snprintf(self->fence_reason, sizeof self->fence_reason, "%s", reason);
        atomic_store(&self->fenced, true);
        LOG_WARN("writes are refused from now on: %s", reason);
    }
    s_publish_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
}

bool kb_commit_is_replica(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    bool replica = self->replica;
    pthread_mutex_unlock(&self->commit_mutex);
    return replica;
}

uint64_t kb_commit_committed_epoch(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    uint64_t epoch = self->committed_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    return epoch;
}

/* ---- a replica's epochs (kb_bank_apply_replicated) ---- */

/* Drops the table with this id from the registry (a replicated drop; its rows go with the batch's op). */
static void s_drop_table_id(kb_bank_t *self, int64_t id)
{
    bool freed = false;
    pthread_mutex_lock(&self->registry_mutex);
    for (size_t i = 0; i < self->entry_count; i++) {
        if (!self->entries[i].dropped && kb_table_id(self->entries[i].table) == id) {
            LOG_INFO("dropped table %s as the primary did", kb_table_name(self->entries[i].table));
            self->entries[i].dropped = true;
            freed = kb_bank_unref_entry(self, i);
            break;
        }
    }
    pthread_mutex_unlock(&self->registry_mutex);
    if (freed)
        kb_bank_trim();
}

/* The live table with this id, acquired, or NULL. */
static kb_table_t *s_acquire_id(kb_bank_t *self, int64_t id)
{
    kb_table_t *t = NULL;
    pthread_mutex_lock(&self->registry_mutex);
    for (size_t i = 0; i < self->entry_count && !t; i++) {
        if (!self->entries[i].dropped && kb_table_id(self->entries[i].table) == id) {
            self->entries[i].refs++;
            t = self->entries[i].table;
        }
    }
    pthread_mutex_unlock(&self->registry_mutex);
    return t;
}

/* Applies a replicated batch's table creates and drops to the registry, as the primary made them (same ids). */
static int s_apply_ops(kb_bank_t *self, const kb_batch_t *b)
{
    for (size_t i = 0; i < b->op_count; i++) {
        const kb_table_op_t *op = &b->ops[i];
        kb_table_t *existing = s_acquire_id(self, op->id);
        if (existing)
            kb_bank_release(self, existing);
        if (op->drop) {
            if (existing)
                s_drop_table_id(self, op->id);
            continue;
        }
        if (existing)
            continue; /* a table id is created once */
        kb_table_config_t cfg;
        char why[256];
        if (kb_table_config_unpack(op->config, op->config_len, &cfg, why, sizeof why) != 0) {
            LOG_ERROR("replicated table %s has an unreadable config (%s)", op->name, why);
            return -1;
        }
        kb_table_t *table = kb_table_new(op->id, op->name, &cfg);
        kb_table_set_memory(table, self->mem);
        kb_table_set_read_only(table, true);
        pthread_mutex_lock(&self->registry_mutex);
        kb_bank_add_entry(self, table);
        if (op->id >= self->next_table_id)
            self->next_table_id = op->id + 1;
        pthread_mutex_unlock(&self->registry_mutex);
        LOG_INFO("created table %s (dim %u) from the primary", op->name, cfg.dim);
    }
    return 0;
}

/* Applies a replicated batch's rows and de-duplication records to the tables in memory. */
static void s_apply_rows(kb_bank_t *self, const kb_batch_t *b)
{
    kb_table_t *t = NULL;
    for (size_t i = 0; i < b->row_count; i++) {
        const kb_store_row_t *rec = &b->rows[i];
        if (!t || kb_table_id(t) != rec->table_id) {
            kb_bank_release(self, t);
            t = s_acquire_id(self, rec->table_id);
        }
        if (t && kb_table_apply_row(t, rec) != 0)
            LOG_WARN("replicated row of table %s does not match its config; skipped", kb_table_name(t));
    }
    kb_bank_release(self, t);
    for (size_t i = 0; i < b->client_count; i++) {
        const kb_dedup_record_t *c = &b->clients[i];
        if (kb_dedup_restore(self->dedup, c->client_id, c->max_seq, c->window, sizeof c->window) != 0)
            LOG_WARN("client %llx: malformed replicated de-duplication record skipped", (unsigned long long)c->client_id);
    }
}

int kb_bank_check_replicated(void *ctx, const kb_batch_t *b, char *err, size_t errlen)
{
    (void)ctx;
    for (size_t i = 0; i < b->op_count; i++) {
        kb_table_config_t cfg;
        char why[256];
        if (!b->ops[i].drop &&
            kb_table_config_unpack(b->ops[i].config, b->ops[i].config_len, &cfg, why, sizeof why) != 0)
            return carls_errorf(err, errlen, KB_BANK_ECONFLICT, "epoch %llu: table %s: %s",
                                (unsigned long long)b->epoch, b->ops[i].name ? b->ops[i].name : "?", why);
    }
    return 0;
}

int kb_bank_apply_replicated_batch(void *ctx, const kb_batch_t *b)
{
    kb_bank_t *self = ctx;
    int rc = s_apply_ops(self, b);
    if (rc == 0)
        s_apply_rows(self, b);
    return rc;
}

int kb_commit_apply_replicated(kb_commit_t *self, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc,
                               char *err, size_t errlen)
{
    pthread_mutex_lock(&self->commit_mutex);
    bool replica = self->replica;
    uint64_t committed = self->committed_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    if (!replica)
        return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu refused: this server is not a follower",
                            (unsigned long long)epoch);
    if (epoch <= committed)
        return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu refused: epoch %llu is applied already",
                            (unsigned long long)epoch, (unsigned long long)committed);
    kb_batch_t b = {0};
    if (len) {
        if (kb_journal_crc(epoch, payload, len) != crc)
            return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu: the record's CRC-32 does not match",
                                (unsigned long long)epoch);
        char why[256];
        if (kb_batch_decode(payload, len, &b, why, sizeof why) != 0)
            return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu: %s", (unsigned long long)epoch, why);
        if (b.epoch != epoch) {
            kb_batch_free(&b);
            return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu: the record holds epoch %llu's batch",
                                (unsigned long long)epoch, (unsigned long long)b.epoch);
        }
        if (self->tables.check_replicated(self->tables.ctx, &b, err, errlen) != 0) {
            /* refused before anything is written, so the epoch is never half applied */
            kb_batch_free(&b);
            return KB_COMMIT_ECONFLICT;
        }
        kb_commit_wait_for_compaction_room(self); /* a follower's SQLite may lag as a primary's may */
        /* The same record as the primary's journal holds, so this journal replays to the same state. */
        if (kb_journal_append_crc(self->journal, epoch, payload, len, crc, err, errlen) != 0) {
            pthread_mutex_lock(&self->commit_mutex);
            self->stats.commit_failures++;
            snprintf(self->storage_error, sizeof self->storage_error, "%s", err);
            atomic_store(&self->journal_broken, kb_journal_is_broken(self->journal));
            pthread_mutex_unlock(&self->commit_mutex);
            kb_batch_free(&b);
            return KB_COMMIT_ESTORAGE;
        }
        /* Durable here: it may be acknowledged before it is applied (a restart replays the journal), which
         * keeps the applying off the primary's wait. */
        if (self->journaled_hook)
            self->journaled_hook(self->journaled_ctx, epoch);
        /* Readers see whole epochs: rows change while no write bracket (none runs here) and no collection
         * is open, and the epoch is published after its last row. */
        pthread_rwlock_wrlock(&self->gate);
        int rc = self->tables.apply_replicated(self->tables.ctx, &b);
        pthread_rwlock_unlock(&self->gate);
        if (rc != 0) {
            kb_batch_free(&b);
            return carls_errorf(err, errlen, KB_COMMIT_ESTORAGE, "epoch %llu: a table could not be created",
                                (unsigned long long)epoch);
        }
    }
    atomic_store(&self->epoch, epoch + 1);
    pthread_mutex_lock(&self->commit_mutex);
    if (len) {
        self->stats.commits++;
        self->stats.rows_written += b.row_count;
    }
    self->committed_epoch = self->stats.committed_epoch = self->collected_epoch = epoch;
    if (len)
        self->record_epoch = epoch;
    s_publish_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
    if (len)
        kb_commit_queue_batch(self, &b); /* the compactor writes it into SQLite as the primary's does */
    return KB_COMMIT_OK;
}

void kb_commit_set_journaled_hook(kb_commit_t *self, void (*hook)(void *ctx, uint64_t epoch), void *ctx)
{
    self->journaled_hook = hook;
    self->journaled_ctx = ctx;
}

int kb_commit_promote(kb_commit_t *self, char *err, size_t errlen)
{
    pthread_rwlock_wrlock(&self->gate);
    pthread_mutex_lock(&self->commit_mutex);
    bool replica = self->replica;
    self->replica = false;
    pthread_mutex_unlock(&self->commit_mutex);
    if (!replica) {
        pthread_rwlock_unlock(&self->gate);
        return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "this server is not a follower");
    }
    kb_table_t **tables;
    size_t n = self->tables.acquire_all(self->tables.ctx, &tables);
    for (size_t i = 0; i < n; i++) {
        kb_table_set_read_only(tables[i], false);
        self->tables.release(self->tables.ctx, tables[i]);
    }
    free(tables);
    pthread_rwlock_unlock(&self->gate);
    kb_commit_start_writer_threads(self);
    LOG_INFO("promoted: accepting writes from epoch %llu", (unsigned long long)atomic_load(&self->epoch));
    return KB_COMMIT_OK;
}
