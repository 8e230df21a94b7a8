/* The bank's half of a follower's epochs (docs/REPLICATION.md): kb_commit_apply_replicated journals the
 * primary's record and has the bank apply it here, through kb_commit_tables_t: table creates and drops to the
 * registry (same ids as the primary's), rows and de-duplication records to the tables. The bank's state is
 * kb_bank_internal.h; the durable point, fencing and promotion are kb_commit.c's. */
#include "kb_bank.h"
#include "kb_bank_internal.h"

#include "kb_table_config.h"
#include "log.h"
#include "util.h"

#include <stdlib.h>

/* ---- a replica's epochs (kb_commit_apply_replicated) ---- */

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
