/* One epoch's changes as the bank's persister collects them: table creates and drops, row snapshots and
 * clients' de-duplication records. The persister appends each batch, encoded, to the journal; the compactor
 * writes batches into the SQLite store. */
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

/* Writes a batch into the store's open transaction (kb_store_begin). 0 on success. Caller holds the store.
 * without_pending: rows are stored with no pending gradients (the caller has them journaled later). */
int kb_batch_write_into(const kb_batch_t *b, kb_store_t *store, bool without_pending);

/* Heap bytes of a batch (its row snapshots and arrays), for the memory estimate. */
int64_t kb_batch_bytes(const kb_batch_t *b);

/* Over batches[0..n) in epoch order: marks every whole-row write (a row, or a row's deletion) that a later
 * whole-row write of the same table and key supersedes, so kb_batch_write_into skips it; frequency-only
 * updates are kept. Returns how many were marked. */
size_t kb_batch_mark_superseded(kb_batch_t *batches, size_t n);

/* Frees everything, arrays included, and zeroes the batch. */
void kb_batch_free(kb_batch_t *b);

/* The batch as bytes (the journal's record payload; layout in kb_batch.c, integers little-endian, floats as
 * the host's float32 like the store's blobs). Returns a malloc'd buffer and its length. */
uint8_t *kb_batch_encode(const kb_batch_t *b, size_t *len);

/* Reads bytes made by kb_batch_encode into *b (which the caller frees with kb_batch_free). Untrusted input:
 * every count and length is checked against what is left. Returns 0, or -1 with the offset in err (and
 * *b empty). */
int kb_batch_decode(const uint8_t *data, size_t len, kb_batch_t *b, char *err, size_t errlen);

#endif
