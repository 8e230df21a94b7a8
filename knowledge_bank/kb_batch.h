/* One epoch's changes as the bank's persister collects them: table creates and drops, row snapshots and
 * clients' de-duplication records, written to the store in one transaction. */
#ifndef KB_BATCH_H
#define KB_BATCH_H

#include "kb_dedup.h"
#include "kb_store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A create or drop waiting for the next commit, in the order they happened. */
typedef struct {
    bool drop;
    int64_t id;
    char *name;
    uint8_t *config;
    size_t config_len;
} kb_table_op_t;

void kb_table_ops_free(kb_table_op_t *ops, size_t n);

typedef struct {
    kb_table_op_t *ops;
    size_t op_count;
    kb_store_row_t *rows;
    size_t row_count, row_capacity;
    kb_dedup_record_t *clients;
    size_t client_count, client_capacity;
    uint64_t epoch;
} kb_batch_t;

/* Frees what the batch holds and empties it (its arrays stay allocated for reuse). */
void kb_batch_clear(kb_batch_t *b);

/* Writes a batch in one transaction. 0 on success. Caller holds the store. */
int kb_batch_write(const kb_batch_t *b, kb_store_t *store);

/* Heap bytes of a batch (its row snapshots and arrays), for the memory estimate. */
int64_t kb_batch_bytes(const kb_batch_t *b);

#endif
