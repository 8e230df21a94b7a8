#include "kb_batch.h"

#include "bytes.h"
#include "kb_memory.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int kb_batch_write_into(const kb_batch_t *b, kb_store_t *store, bool without_pending)
{
    for (size_t i = 0; i < b->op_count; i++) {
        const kb_table_op_t *op = &b->ops[i];
        int rc = op->drop ? kb_store_drop_table(store, op->id)
                          : kb_store_put_table(store, op->id, op->name, op->config, op->config_len);
        if (rc != 0)
            return -1;
    }
    for (size_t i = 0; i < b->row_count; i++) {
        if (b->rows[i].superseded)
            continue;
        kb_store_row_t row = b->rows[i];
        if (without_pending) {
            row.pending = NULL;
            row.pending_count = 0;
        }
        if (kb_store_put_row(store, &row) != 0)
            return -1;
    }
    for (size_t i = 0; i < b->client_count; i++) {
        const kb_dedup_record_t *c = &b->clients[i];
        if (kb_store_put_client(store, c->client_id, c->max_seq, c->window, KB_DEDUP_WINDOW_BYTES) != 0)
            return -1;
    }
    return 0;
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

/* ---- encoding (the journal's record payload) ---- */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
} s_out_t;

static uint8_t *s_room(s_out_t *o, size_t n)
{
    o->buf = carls_grow(o->buf, &o->cap, o->len + n, 1);
    uint8_t *at = o->buf + o->len;
    o->len += n;
    return at;
}

static void s_u8(s_out_t *o, uint8_t v) { *s_room(o, 1) = v; }
static void s_u32(s_out_t *o, uint32_t v) { carls_put_le32(s_room(o, 4), v); }
static void s_u64(s_out_t *o, uint64_t v) { carls_put_le64(s_room(o, 8), v); }

static void s_raw(s_out_t *o, const void *p, size_t n)
{
    if (n)
        memcpy(s_room(o, n), p, n);
}

enum {
    ROW_VALUE = 1,
    ROW_OPT_STATE = 2,
    ROW_PENDING = 4,
    ROW_RECORD = 8,
    ROW_DELETED = 16,
    ROW_FREQUENCY_ONLY = 32,
};

/* The encoded size, so that the encoder allocates once. */
static size_t s_encoded_size(const kb_batch_t *b)
{
    size_t n = 8 + 4 + 4 + 4;
    for (size_t i = 0; i < b->op_count; i++)
        n += 1 + 8 + 4 + (b->ops[i].name ? strlen(b->ops[i].name) : 0) + 4 + b->ops[i].config_len;
    for (size_t i = 0; i < b->row_count; i++) {
        const kb_store_row_t *r = &b->rows[i];
        n += 69 + r->key_len;
        if (r->value)
            n += (size_t)r->dim * sizeof(float);
        if (r->opt_state)
            n += (size_t)r->opt_floats * sizeof(float);
        if (r->pending)
            n += (size_t)r->pending_count * r->dim * sizeof(float);
        if (r->record)
            n += r->record_len;
    }
    return n + b->client_count * (16 + KB_DEDUP_WINDOW_BYTES);
}

uint8_t *kb_batch_encode(const kb_batch_t *b, size_t *len)
{
    s_out_t o = {0};
    o.cap = s_encoded_size(b);
    o.buf = carls_xmalloc(o.cap);
    s_u64(&o, b->epoch);
    s_u32(&o, (uint32_t)b->op_count);
    for (size_t i = 0; i < b->op_count; i++) {
        const kb_table_op_t *op = &b->ops[i];
        size_t name_len = op->name ? strlen(op->name) : 0;
        s_u8(&o, op->drop);
        s_u64(&o, (uint64_t)op->id);
        s_u32(&o, (uint32_t)name_len);
        s_raw(&o, op->name, name_len);
        s_u32(&o, (uint32_t)op->config_len);
        s_raw(&o, op->config, op->config_len);
    }
    s_u32(&o, (uint32_t)b->row_count);
    for (size_t i = 0; i < b->row_count; i++) {
        const kb_store_row_t *r = &b->rows[i];
        uint8_t flags = (r->value ? ROW_VALUE : 0) | (r->opt_state ? ROW_OPT_STATE : 0) |
                        (r->pending ? ROW_PENDING : 0) | (r->record ? ROW_RECORD : 0) |
                        (r->deleted ? ROW_DELETED : 0) | (r->frequency_only ? ROW_FREQUENCY_ONLY : 0);
        s_u64(&o, (uint64_t)r->table_id);
        s_u32(&o, r->key_len);
        s_raw(&o, r->key, r->key_len);
        s_u64(&o, (uint64_t)r->row_id);
        s_u8(&o, flags);
        s_u32(&o, r->dim);
        s_u32(&o, r->opt_floats);
        s_u32(&o, r->pending_count);
        s_u32(&o, r->record_len);
        s_u64(&o, r->opt_steps);
        s_u64(&o, r->version);
        s_u64(&o, (uint64_t)r->updated_at_ms);
        s_u64(&o, r->frequency);
        /* Floats as the host stores them (little-endian float32), as the SQLite store's blobs. */
        if (r->value)
            s_raw(&o, r->value, (size_t)r->dim * sizeof(float));
        if (r->opt_state)
            s_raw(&o, r->opt_state, (size_t)r->opt_floats * sizeof(float));
        if (r->pending)
            s_raw(&o, r->pending, (size_t)r->pending_count * r->dim * sizeof(float));
        if (r->record)
            s_raw(&o, r->record, r->record_len);
    }
    s_u32(&o, (uint32_t)b->client_count);
    for (size_t i = 0; i < b->client_count; i++) {
        const kb_dedup_record_t *c = &b->clients[i];
        s_u64(&o, c->client_id);
        s_u64(&o, c->max_seq);
        s_raw(&o, c->window, KB_DEDUP_WINDOW_BYTES);
    }
    *len = o.len;
    return o.buf;
}

/* ---- decoding: the input is a file's bytes, so every length is checked against what is left ---- */

typedef struct {
    const uint8_t *p, *end;
    bool bad;
} s_in_t;

static const uint8_t *s_take(s_in_t *in, size_t n)
{
    if (in->bad || n > (size_t)(in->end - in->p)) {
        in->bad = true;
        return NULL;
    }
    const uint8_t *at = in->p;
    in->p += n;
    return at;
}

static uint8_t s_get_u8(s_in_t *in)
{
    const uint8_t *p = s_take(in, 1);
    return p ? *p : 0;
}

static uint32_t s_get_u32(s_in_t *in)
{
    const uint8_t *p = s_take(in, 4);
    return p ? carls_get_le32(p) : 0;
}

static uint64_t s_get_u64(s_in_t *in)
{
    const uint8_t *p = s_take(in, 8);
    return p ? carls_get_le64(p) : 0;
}

/* A malloc'd copy of the next n bytes (NULL when n is 0 or the input is short). */
static void *s_get_copy(s_in_t *in, size_t n)
{
    const uint8_t *p = n ? s_take(in, n) : NULL;
    if (!p)
        return NULL;
    void *copy = carls_xmalloc(n);
    memcpy(copy, p, n);
    return copy;
}

/* A count read from the input, refused when even its smallest items could not fit in what is left (so a
 * corrupt count cannot make the decoder allocate without bound). */
static uint32_t s_get_count(s_in_t *in, size_t min_item)
{
    uint32_t n = s_get_u32(in);
    if (!in->bad && (uint64_t)n * min_item > (uint64_t)(in->end - in->p))
        in->bad = true;
    return in->bad ? 0 : n;
}

static bool s_decode_row(s_in_t *in, kb_store_row_t *r)
{
    memset(r, 0, sizeof *r);
    r->table_id = (int64_t)s_get_u64(in);
    r->key_len = s_get_u32(in);
    r->key = s_get_copy(in, r->key_len);
    r->row_id = (int64_t)s_get_u64(in);
    uint8_t flags = s_get_u8(in);
    r->dim = s_get_u32(in);
    r->opt_floats = s_get_u32(in);
    r->pending_count = s_get_u32(in);
    r->record_len = s_get_u32(in);
    r->opt_steps = s_get_u64(in);
    r->version = s_get_u64(in);
    r->updated_at_ms = (int64_t)s_get_u64(in);
    r->frequency = s_get_u64(in);
    r->deleted = flags & ROW_DELETED;
    r->frequency_only = flags & ROW_FREQUENCY_ONLY;
    if (flags & ROW_VALUE)
        r->value = s_get_copy(in, (size_t)r->dim * sizeof(float));
    if (flags & ROW_OPT_STATE)
        r->opt_state = s_get_copy(in, (size_t)r->opt_floats * sizeof(float));
    if (flags & ROW_PENDING)
        r->pending = s_get_copy(in, (size_t)r->pending_count * r->dim * sizeof(float));
    if (flags & ROW_RECORD)
        r->record = s_get_copy(in, r->record_len);
    /* A flagged part must be there (a zero-length one is not flagged by the encoder). */
    if ((flags & ROW_VALUE && !r->value) || (flags & ROW_OPT_STATE && !r->opt_state) ||
        (flags & ROW_PENDING && !r->pending) || (flags & ROW_RECORD && !r->record) || (r->key_len && !r->key))
        in->bad = true;
    return !in->bad;
}

int kb_batch_decode(const uint8_t *data, size_t len, kb_batch_t *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    s_in_t in = {data, data + len, false};
    b->epoch = s_get_u64(&in);
    uint32_t ops = s_get_count(&in, 17);
    if (ops) {
        b->ops = carls_xcalloc(ops, sizeof *b->ops);
        for (; b->op_count < ops && !in.bad; b->op_count++) {
            kb_table_op_t *op = &b->ops[b->op_count];
            op->drop = s_get_u8(&in) != 0;
            op->id = (int64_t)s_get_u64(&in);
            uint32_t name_len = s_get_u32(&in);
            const uint8_t *name = s_take(&in, name_len);
            if (name && name_len) {
                op->name = carls_xmalloc((size_t)name_len + 1);
                memcpy(op->name, name, name_len);
                op->name[name_len] = '\0';
            }
            op->config_len = s_get_u32(&in);
            op->config = s_get_copy(&in, op->config_len);
            if (!op->drop && (!op->name || !op->config))
                in.bad = true;
        }
    }
    uint32_t rows = s_get_count(&in, 69); /* the fixed fields of a row */
    if (rows) {
        b->rows = carls_xcalloc(rows, sizeof *b->rows);
        b->row_capacity = rows;
        while (b->row_count < rows && !in.bad) {
            bool ok = s_decode_row(&in, &b->rows[b->row_count]);
            b->row_count++; /* counted either way, so kb_batch_clear frees what was read */
            if (!ok)
                break;
        }
    }
    uint32_t clients = s_get_count(&in, 16 + KB_DEDUP_WINDOW_BYTES);
    if (clients) {
        b->clients = carls_xcalloc(clients, sizeof *b->clients);
        b->client_capacity = clients;
        for (; b->client_count < clients && !in.bad; b->client_count++) {
            kb_dedup_record_t *c = &b->clients[b->client_count];
            c->client_id = s_get_u64(&in);
            c->max_seq = s_get_u64(&in);
            const uint8_t *w = s_take(&in, KB_DEDUP_WINDOW_BYTES);
            if (w)
                memcpy(c->window, w, KB_DEDUP_WINDOW_BYTES);
        }
    }
    if (!in.bad && in.p != in.end)
        in.bad = true;
    if (in.bad) {
        snprintf(err, errlen, "batch record malformed at byte %zu of %zu", (size_t)(in.p - data), len);
        kb_batch_free(b);
        return -1;
    }
    return 0;
}

void kb_batch_free(kb_batch_t *b)
{
    kb_batch_clear(b);
    free(b->rows);
    free(b->clients);
    memset(b, 0, sizeof *b);
}

/* ---- superseded rows ---- */

static uint64_t s_row_hash(const kb_store_row_t *r)
{
    uint64_t h = carls_hash64(r->key, r->key_len, (uint64_t)r->table_id);
    return h ? h : 1;
}

static bool s_same_row(const kb_store_row_t *a, const kb_store_row_t *b)
{
    return a->table_id == b->table_id && a->key_len == b->key_len &&
           (a->key_len == 0 || memcmp(a->key, b->key, a->key_len) == 0);
}

size_t kb_batch_mark_superseded(kb_batch_t *batches, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += batches[i].row_count;
    if (n < 2 || total == 0)
        return 0;
    /* Newest first: the first whole-row write seen of a (table, key) is the one that stays. */
    size_t cap = 16;
    while (cap < total * 2)
        cap *= 2;
    uint64_t *hashes = carls_xcalloc(cap, sizeof *hashes);
    const kb_store_row_t **rows = carls_xcalloc(cap, sizeof *rows);
    size_t marked = 0;
    for (size_t bi = n; bi-- > 0;) {
        kb_batch_t *b = &batches[bi];
        for (size_t ri = b->row_count; ri-- > 0;) {
            kb_store_row_t *r = &b->rows[ri];
            if (r->frequency_only)
                continue;
            uint64_t h = s_row_hash(r);
            size_t at = h & (cap - 1);
            while (hashes[at] && !(hashes[at] == h && s_same_row(rows[at], r)))
                at = (at + 1) & (cap - 1);
            if (hashes[at]) {
                r->superseded = true;
                marked++;
            } else {
                hashes[at] = h;
                rows[at] = r;
            }
        }
    }
    free(hashes);
    free(rows);
    return marked;
}
