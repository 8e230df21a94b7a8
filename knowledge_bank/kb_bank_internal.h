/* The bank's state and the helpers its files share (kb_bank.c, kb_bank_replica.c). Private to the bank:
 * nothing outside knowledge_bank/kb_bank*.c includes it. The commit pipeline's state is kb_commit.c's own. */
#ifndef KB_BANK_INTERNAL_H
#define KB_BANK_INTERNAL_H

#include "kb_bank.h"
#include "kb_batch.h"
#include "kb_commit.h"
#include "kb_cache.h"
#include "kb_dedup.h"
#include "kb_journal.h"
#include "kb_memory.h"
#include "kb_store.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* A table in the registry. refs counts the registry itself (while not dropped) plus every acquire. */
typedef struct {
    kb_table_t *table;
    int refs;
    bool dropped;
} kb_bank_entry_t;

struct kb_bank {
    kb_bank_options_t opts;
    char *data_dir;
    kb_store_t *store;
    kb_dedup_t *dedup;

    pthread_mutex_t registry_mutex;
    kb_bank_entry_t *entries;
    size_t entry_count, entry_capacity;
    int64_t next_table_id;
    kb_table_op_t *ops; /* guarded by registry_mutex */
    size_t op_count, op_capacity;

    kb_memory_t *mem;    /* the memory estimate and --max-memory budget (kb_memory.h) */
    kb_cache_t *cache;   /* --cache-bytes (kb_cache.h), or NULL */
    kb_journal_t *journal; /* opened at start-up, until the commit pipeline takes it */
    kb_commit_t *commit; /* the commit pipeline (kb_commit.h), once the tables are loaded */
};

/* Registry mutex held: appends an entry holding the registry's reference. */
void kb_bank_add_entry(kb_bank_t *self, kb_table_t *table);
/* Registry mutex held: drops one reference; frees the table and its entry when it was the last (true). */
bool kb_bank_unref_entry(kb_bank_t *self, size_t index);
/* Hands freed heap pages back after a table was freed (without the registry mutex). */
void kb_bank_trim(void);
/* The commit pipeline's check_replicated and apply_replicated (kb_commit_tables_t) over the bank (ctx). */
int kb_bank_check_replicated(void *ctx, const kb_batch_t *b, char *err, size_t errlen);
int kb_bank_apply_replicated_batch(void *ctx, const kb_batch_t *b);

#endif
