#include "kb_batch.h"

#include "kb_memory.h"

#include <stdlib.h>

void kb_table_ops_free(kb_table_op_t *ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ops[i].name);
        free(ops[i].config);
    }
}

void kb_batch_clear(kb_batch_t *b)
{
    kb_table_ops_free(b->ops, b->op_count);
    free(b->ops);
    b->ops = NULL;
    b->op_count = 0;
    for (size_t i = 0; i < b->row_count; i++)
        kb_store_row_free(&b->rows[i]);
    b->row_count = 0;
    b->client_count = 0;
}

int kb_batch_write(const kb_batch_t *b, kb_store_t *store)
{
    if (b->op_count == 0 && b->row_count == 0 && b->client_count == 0)
        return 0;
    if (kb_store_begin(store) != 0)
        return -1;
    for (size_t i = 0; i < b->op_count; i++) {
        const kb_table_op_t *op = &b->ops[i];
        int rc = op->drop ? kb_store_drop_table(store, op->id)
                          : kb_store_put_table(store, op->id, op->name, op->config, op->config_len);
        if (rc != 0)
            goto fail;
    }
    for (size_t i = 0; i < b->row_count; i++) {
        if (kb_store_put_row(store, &b->rows[i]) != 0)
            goto fail;
    }
    for (size_t i = 0; i < b->client_count; i++) {
        const kb_dedup_record_t *c = &b->clients[i];
        if (kb_store_put_client(store, c->client_id, c->max_seq, c->window, KB_DEDUP_WINDOW_BYTES) != 0)
            goto fail;
    }
    if (kb_store_commit(store) != 0)
        goto fail;
    return 0;
fail:
    kb_store_rollback(store);
    return -1;
}

int64_t kb_batch_bytes(const kb_batch_t *b)
{
    int64_t bytes = 0;
    if (b->row_capacity)
        bytes += (int64_t)kb_memory_chunk(b->row_capacity * sizeof *b->rows);
    if (b->client_capacity)
        bytes += (int64_t)kb_memory_chunk(b->client_capacity * sizeof *b->clients);
    for (size_t i = 0; i < b->row_count; i++) {
        const kb_store_row_t *r = &b->rows[i];
        bytes += (int64_t)kb_memory_chunk(r->key_len);
        if (r->value)
            bytes += (int64_t)kb_memory_chunk((size_t)r->dim * sizeof(float));
        if (r->opt_state)
            bytes += (int64_t)kb_memory_chunk((size_t)r->opt_floats * sizeof(float));
        if (r->pending)
            bytes += (int64_t)kb_memory_chunk((size_t)r->pending_count * r->dim * sizeof(float));
        if (r->record)
            bytes += (int64_t)kb_memory_chunk(r->record_len);
    }
    return bytes;
}
