/* Sharded client (contract in kb_cluster.h).
 *
 * Every operation that talks to more than one shard, and every row operation even with one shard, goes
 * through one fan-out engine (kb_cluster_fan_t): build at most one request per shard, send them all
 * (kb_client_send never blocks), then wait for each in shard order. While we wait for shard 0 the other shards
 * work and their answers queue on their own sockets, so a fan-out costs about one round trip to the slowest
 * shard, not the sum. Keys are split with kb_cluster_split (a counting sort by shard that remembers each key's
 * position in the caller's arrays) and answers are scattered back through the same map. A kb_cluster_pending_t is a
 * fan-out whose answers are collected later (the *_send / *_wait calls); the blocking calls are send + wait.
 *
 * Every answer is checked against what was asked (counts per key, dims) before anything is copied into
 * the caller's buffers: a shard is another process and may be broken or hostile. */
#include "kb_cluster.h"
#include "kb_cluster_internal.h"

#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kb_cluster_set_error(kb_cluster_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->last_error, sizeof self->last_error, fmt, ap);
    va_end(ap);
    self->failed_shard = -1;
    self->last_status = CARLS__STATUS_CODE__STATUS_OK;
}

void kb_cluster_clear_error(kb_cluster_t *self)
{
    self->last_error[0] = '\0';
    self->failed_shard = -1;
    self->last_status = CARLS__STATUS_CODE__STATUS_OK;
}

/* An error the cluster answers itself with the status a single server would give (the text starts with
 * the status's name, as a server's does). Returns KB_CLIENT_ESTATUS. */
int kb_cluster_status_error(kb_cluster_t *self, Carls__StatusCode status, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    kb_cluster_set_error(self, "%s: %s", carls_status_name(status), what);
    self->last_status = status;
    return KB_CLIENT_ESTATUS;
}

/* Records that shard s failed, with the shard's client error as the text (replacing any earlier text: the
 * callers decide which failure of a call is reported, see kb_cluster_fan_failed). With one shard the text is the
 * client's own (a single server needs no name). */
void kb_cluster_shard_error(kb_cluster_t *self, uint32_t s, const char *what)
{
    if (self->n == 1)
        snprintf(self->last_error, sizeof self->last_error, "%s", what);
    else
        snprintf(self->last_error, sizeof self->last_error, "shard %u (%s): %s", s, self->endpoints[s], what);
    self->failed_shard = (int)s;
    self->last_status = CARLS__STATUS_CODE__STATUS_OK;
}

/* Shard s's client failed: its error text and its status (for KB_CLIENT_ESTATUS) become the cluster's. */
void kb_cluster_client_error(kb_cluster_t *self, uint32_t s)
{
    kb_cluster_shard_error(self, s, kb_client_last_error(self->clients[s]));
    self->last_status = kb_client_last_status(self->clients[s]);
}

/* kb_cluster_shard_error with a formatted reason (for answers that fail our checks). */
void kb_cluster_shard_errorf(kb_cluster_t *self, uint32_t s, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    kb_cluster_shard_error(self, s, what);
}

/* ---- lifecycle ---------------------------------------------------------------------------------------- */

/* Splits the endpoint list into self->endpoints (trimmed, non-empty, distinct). 0 or -1 (logged). */
static int s_parse_endpoints(kb_cluster_t *self, const char *list)
{
    size_t cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    if (cap > KB_CLUSTER_MAX_SHARDS) {
        LOG_ERROR("kb_cluster: %zu endpoints; at most %u shards are supported", cap, KB_CLUSTER_MAX_SHARDS);
        return -1;
    }
    self->endpoints = carls_xcalloc(cap, sizeof *self->endpoints);
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a == b) {
            LOG_ERROR("kb_cluster: empty endpoint at position %u of \"%s\"", self->n + 1, list);
            return -1;
        }
        char *ep = carls_xmalloc((size_t)(b - a) + 1);
        memcpy(ep, a, (size_t)(b - a));
        ep[b - a] = '\0';
        for (uint32_t i = 0; i < self->n; i++) {
            if (strcmp(self->endpoints[i], ep) == 0) {
                /* Two shards on one server would send keys to a server that refuses them (or, unsharded,
                 * split one table's rows by accident): always a mistake. */
                LOG_ERROR("kb_cluster: endpoint %s is listed twice (shards %u and %u)", ep, i, self->n);
                free(ep);
                return -1;
            }
        }
        self->endpoints[self->n++] = ep;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    return 0;
}

kb_cluster_t *kb_cluster_new(const char *endpoints, const kb_client_options_t *opts)
{
    if (!endpoints || !*endpoints) {
        LOG_ERROR("kb_cluster_new: no endpoints");
        return NULL;
    }
    kb_cluster_t *self = carls_xcalloc(1, sizeof *self);
    self->failed_shard = -1;
    if (s_parse_endpoints(self, endpoints) != 0)
        goto fail;
    self->clients = carls_xcalloc(self->n, sizeof *self->clients);
    for (uint32_t i = 0; i < self->n; i++) {
        self->clients[i] = kb_client_new(self->endpoints[i], opts);
        if (!self->clients[i]) {
            LOG_ERROR("kb_cluster_new: cannot open a client for shard %u (%s)", i, self->endpoints[i]);
            goto fail;
        }
    }
    return self;
fail:
    kb_cluster_destroy(&self);
    return NULL;
}

kb_cluster_t *kb_cluster_over(kb_client_t *client)
{
    assert(client);
    kb_cluster_t *self = carls_xcalloc(1, sizeof *self);
    self->failed_shard = -1;
    const char *endpoint = kb_client_endpoint(client);
    self->endpoints = carls_xcalloc(1, sizeof *self->endpoints);
    self->endpoints[0] = carls_xmalloc(strlen(endpoint) + 1);
    strcpy(self->endpoints[0], endpoint);
    self->clients = carls_xcalloc(1, sizeof *self->clients);
    self->clients[0] = client;
    self->n = 1;
    self->borrowed = true;
    return self;
}

void kb_cluster_forget_tables(kb_cluster_t *self)
{
    assert(self);
    for (size_t i = 0; i < self->n_tables; i++)
        free(self->tables[i].name);
    free(self->tables);
    self->tables = NULL;
    self->n_tables = 0;
}

void kb_cluster_destroy(kb_cluster_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_cluster_t *self = *self_p;
    /* endpoints holds every parsed entry; clients may be shorter when kb_cluster_new failed midway. */
    for (uint32_t i = 0; i < self->n; i++) {
        if (self->clients && !self->borrowed)
            kb_client_destroy(&self->clients[i]);
        free(self->endpoints[i]);
    }
    free(self->clients);
    free(self->endpoints);
    kb_cluster_forget_tables(self);
    free(self);
    *self_p = NULL;
}

uint32_t kb_cluster_shards(const kb_cluster_t *self)
{
    assert(self);
    return self->n;
}

const char *kb_cluster_endpoint(const kb_cluster_t *self, uint32_t shard)
{
    assert(self && shard < self->n);
    return self->endpoints[shard];
}

uint64_t kb_cluster_requests(const kb_cluster_t *self)
{
    assert(self);
    return self->requests;
}

uint32_t kb_cluster_shard_of(const kb_cluster_t *self, const void *key, size_t len)
{
    assert(self);
    return carls_shard_of(key, len, self->n);
}

const char *kb_cluster_last_error(const kb_cluster_t *self)
{
    assert(self);
    return self->last_error;
}

int kb_cluster_failed_shard(const kb_cluster_t *self)
{
    assert(self);
    return self->failed_shard;
}

Carls__StatusCode kb_cluster_last_status(const kb_cluster_t *self)
{
    assert(self);
    return self->last_status;
}

/* ---- splitting keys by shard ------------------------------------------------------------------------- */

void kb_cluster_split_free(kb_cluster_split_t *sp)
{
    free(sp->count);
    free(sp->start);
    free(sp->order);
    free(sp->wire);
    memset(sp, 0, sizeof *sp);
}

/* Checks keys (non-empty) and groups them by shard into *sp (caller frees with kb_cluster_split_free, also on
 * failure). 0, or KB_CLIENT_EINVAL (error set). */
int kb_cluster_split(kb_cluster_t *self, const char *what, const kb_key_t *keys, size_t n, kb_cluster_split_t *sp)
{
    memset(sp, 0, sizeof *sp);
    if (!keys || n == 0) {
        kb_cluster_set_error(self, "%s: no keys", what);
        return KB_CLIENT_EINVAL;
    }
    sp->count = carls_xcalloc(self->n, sizeof *sp->count);
    sp->start = carls_xcalloc(self->n, sizeof *sp->start);
    sp->order = carls_xmalloc(n * sizeof *sp->order);
    sp->wire = carls_xmalloc(n * sizeof *sp->wire);
    uint32_t *shard = carls_xmalloc(n * sizeof *shard);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].len == 0 || !keys[i].data) {
            kb_cluster_set_error(self, "%s: key %zu is empty", what, i);
            free(shard);
            return KB_CLIENT_EINVAL;
        }
        shard[i] = carls_shard_of(keys[i].data, keys[i].len, self->n);
        sp->count[shard[i]]++;
    }
    size_t *next = carls_xmalloc(self->n * sizeof *next);
    for (uint32_t s = 0, acc = 0; s < self->n; s++) {
        sp->start[s] = acc;
        next[s] = acc;
        acc += sp->count[s];
    }
    for (size_t i = 0; i < n; i++) {
        size_t j = next[shard[i]]++;
        sp->order[j] = i;
        sp->wire[j].data = (uint8_t *)keys[i].data;
        sp->wire[j].len = keys[i].len;
    }
    free(next);
    free(shard);
    return 0;
}

/* ---- the fan-out engine ------------------------------------------------------------------------------ */

void kb_cluster_fan_init(kb_cluster_t *self, kb_cluster_fan_t *fan, const char *table, Carls__Response__ResultCase want)
{
    memset(fan, 0, sizeof *fan);
    if (table) {
        fan->table = carls_xmalloc(strlen(table) + 1);
        strcpy(fan->table, table);
    }
    fan->want = want;
    fan->reqs = carls_xcalloc(self->n, sizeof *fan->reqs);
    fan->ops = carls_xcalloc(self->n, sizeof *fan->ops);
    fan->ids = carls_xcalloc(self->n, sizeof *fan->ids);
    fan->in_flight = carls_xcalloc(self->n, sizeof *fan->in_flight);
    fan->resps = carls_xcalloc(self->n, sizeof *fan->resps);
    fan->failed = -1;
}

/* Frees everything; requests still in flight are cancelled (their answers, if they come, are dropped).
 * Accepts a fan that was never initialised (all zero). */
void kb_cluster_fan_free(kb_cluster_t *self, kb_cluster_fan_t *fan)
{
    for (uint32_t s = 0; fan->reqs && s < self->n; s++) {
        if (fan->in_flight[s])
            kb_client_cancel(self->clients[s], fan->ids[s]);
        if (fan->resps[s])
            carls__response__free_unpacked(fan->resps[s], NULL);
    }
    kb_cluster_split_free(&fan->sp);
    free(fan->table);
    free(fan->reqs);
    free(fan->ops);
    free(fan->rows);
    free(fan->records);
    free(fan->ids);
    free(fan->in_flight);
    free(fan->resps);
    memset(fan, 0, sizeof *fan);
}

/* Makes req (initialised, of fan's table) carry operation op, its oneof member pointing at msg, and returns
 * the descriptor of op's message. Every operation is set the same way, so this reads protobuf-c's descriptors
 * instead of naming each generated member: a oneof's case number is its member's field number in Request. */
const ProtobufCMessageDescriptor *kb_cluster_request_op(const kb_cluster_fan_t *fan, Carls__Request *req,
                                                        Carls__Request__OpCase op, void *msg)
{
    const ProtobufCFieldDescriptor *member =
        protobuf_c_message_descriptor_get_field(&carls__request__descriptor, (unsigned)op);
    assert(member && member->type == PROTOBUF_C_TYPE_MESSAGE);
    carls__request__init(req);
    req->table = fan->table;
    req->op_case = op;
    *(void **)((char *)req + member->offset) = msg;
    return member->descriptor;
}

/* Builds shard s's request for operation op (initialised, in fan->ops[s]) carrying the n_keys keys (a
 * sample's positives; none: NULL, 0): the operation's repeated bytes field "keys" ("positives" in Sample).
 * Returns the operation for the caller to fill in. */
kb_cluster_op_t *kb_cluster_fan_request(kb_cluster_fan_t *fan, uint32_t s, Carls__Request__OpCase op,
                                        ProtobufCBinaryData *keys, size_t n_keys)
{
    kb_cluster_op_t *o = &fan->ops[s];
    const ProtobufCMessageDescriptor *desc = kb_cluster_request_op(fan, &fan->reqs[s], op, o);
    assert(desc->sizeof_message <= sizeof *o); /* kb_cluster_op_t lists every operation built here */
    protobuf_c_message_init(desc, o);
    const ProtobufCFieldDescriptor *key_field =
        protobuf_c_message_descriptor_get_field_by_name(desc, op == CARLS__REQUEST__OP_SAMPLE ? "positives" : "keys");
    assert(key_field && key_field->type == PROTOBUF_C_TYPE_BYTES && key_field->label == PROTOBUF_C_LABEL_REPEATED);
    *(size_t *)((char *)o + key_field->quantifier_offset) = n_keys;
    *(ProtobufCBinaryData **)((char *)o + key_field->offset) = keys;
    return o;
}

/* Splits keys by shard (fan->sp) and builds operation op for every shard holding keys, with its keys.
 * 0, or KB_CLIENT_EINVAL (error set). */
int kb_cluster_fan_keys(kb_cluster_t *self, kb_cluster_fan_t *fan, const char *what, Carls__Request__OpCase op,
                        const kb_key_t *keys, size_t n)
{
    int rc = kb_cluster_split(self, what, keys, n, &fan->sp);
    if (rc != 0)
        return rc;
    for (uint32_t s = 0; s < self->n; s++)
        if (fan->sp.count[s] > 0)
            kb_cluster_fan_request(fan, s, op, fan->sp.wire + fan->sp.start[s], fan->sp.count[s]);
    return 0;
}

/* put and push_gradients: gives each shard's operation its rows (n * dim floats in the caller's key order).
 * With several shards the rows are copied into shard order so each request points at one block; with one,
 * the order is the caller's and the rows are used as they are. */
static void s_fan_rows(kb_cluster_t *self, kb_cluster_fan_t *fan, const float *rows, uint32_t dim)
{
    const kb_cluster_split_t *sp = &fan->sp;
    const float *ordered = rows;
    if (self->n > 1) {
        size_t n = sp->start[self->n - 1] + sp->count[self->n - 1];
        fan->rows = carls_xmalloc(n * dim * sizeof *fan->rows);
        for (size_t j = 0; j < n; j++)
            memcpy(fan->rows + j * dim, rows + sp->order[j] * dim, dim * sizeof(float));
        ordered = fan->rows;
    }
    for (uint32_t s = 0; s < self->n; s++) {
        size_t c = sp->count[s];
        if (c == 0)
            continue;
        float *block = (float *)ordered + sp->start[s] * dim; /* packing only reads it */
        if (fan->reqs[s].op_case == CARLS__REQUEST__OP_PUT) {
            fan->ops[s].put.n_values = c * dim;
            fan->ops[s].put.values = block;
        } else {
            fan->ops[s].push_gradients.n_gradients = c * dim;
            fan->ops[s].push_gradients.gradients = block;
        }
    }
}

/* Records rc as the failure of shard s if it is the first in shard order so far. True when it is (the
 * caller then sets the error text). */
bool kb_cluster_fan_failed(kb_cluster_fan_t *fan, uint32_t s, int rc)
{
    if (fan->failed >= 0 && (int)s > fan->failed)
        return false;
    fan->failed = (int)s;
    fan->rc = rc;
    return true;
}

/* Sends every shard's request without waiting (kb_client_send never blocks). After a failed send nothing
 * more is sent; the failure is returned and kept for kb_cluster_fan_wait, which still collects what was sent. */
int kb_cluster_fan_send(kb_cluster_t *self, kb_cluster_fan_t *fan)
{
    for (uint32_t s = 0; s < self->n; s++) {
        if (fan->reqs[s].op_case == CARLS__REQUEST__OP__NOT_SET)
            continue;
        int rc = kb_client_send(self->clients[s], &fan->reqs[s], &fan->ids[s]);
        if (rc != 0) {
            if (kb_cluster_fan_failed(fan, s, rc))
                kb_cluster_client_error(self, s);
            return rc;
        }
        fan->in_flight[s] = true;
        self->requests++;
    }
    return 0;
}

/* Waits for every request in flight, in shard order: while we wait for one shard the others work and their
 * answers queue on their own sockets. 0 with every answer in fan->resps (each carrying fan->want), or the
 * code of the first failure in shard order (a failed send included), the error naming that shard; the
 * answers are then freed. Everything sent is waited for even after a failure, so nothing stays in flight. */
int kb_cluster_fan_wait(kb_cluster_t *self, kb_cluster_fan_t *fan)
{
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->in_flight[s])
            continue;
        Carls__Response *resp = NULL;
        int rc = kb_client_wait(self->clients[s], fan->ids[s], &resp);
        fan->in_flight[s] = false;
        if (rc == 0 && resp->result_case != fan->want) {
            rc = KB_CLIENT_EMALFORMED;
            if (kb_cluster_fan_failed(fan, s, rc))
                kb_cluster_shard_errorf(self, s, "the answer to %s carries the wrong result (case %d)",
                                        carls_op_name(fan->reqs[s].op_case), (int)resp->result_case);
        } else if (rc != 0 && kb_cluster_fan_failed(fan, s, rc)) {
            kb_cluster_client_error(self, s);
        }
        if (rc != 0) {
            if (resp)
                carls__response__free_unpacked(resp, NULL);
            continue;
        }
        fan->resps[s] = resp;
    }
    if (fan->rc != 0) {
        for (uint32_t s = 0; s < self->n; s++) {
            if (fan->resps[s])
                carls__response__free_unpacked(fan->resps[s], NULL);
            fan->resps[s] = NULL;
        }
    }
    return fan->rc;
}

/* kb_cluster_fan_send, then kb_cluster_fan_wait. */
int kb_cluster_fan_run(kb_cluster_t *self, kb_cluster_fan_t *fan)
{
    kb_cluster_fan_send(self, fan);
    return kb_cluster_fan_wait(self, fan);
}

/* Common argument checks of the row operations. 0 or KB_CLIENT_EINVAL (error set). */
static int s_row_args(kb_cluster_t *self, const char *what, const char *table, size_t n, uint32_t dim)
{
    if (!table || !*table) {
        kb_cluster_set_error(self, "%s: no table name", what);
        return KB_CLIENT_EINVAL;
    }
    if (dim == 0) {
        kb_cluster_set_error(self, "%s: dim is 0", what);
        return KB_CLIENT_EINVAL;
    }
    if (n > SIZE_MAX / sizeof(float) / dim) {
        kb_cluster_set_error(self, "%s: %zu rows of dim %u overflow", what, n, dim);
        return KB_CLIENT_EINVAL;
    }
    return 0;
}

/* ---- requests in flight (kb_cluster_pending_t) ------------------------------------------------------- */

void kb_cluster_pending_destroy(kb_cluster_t *self, kb_cluster_pending_t **pending_p)
{
    assert(self);
    if (!pending_p || !*pending_p)
        return;
    kb_cluster_pending_t *p = *pending_p;
    kb_cluster_fan_free(self, &p->fan);
    kb_sample_result_destroy(&p->sample);
    free(p);
    *pending_p = NULL;
}

/* Sends p's requests. 0 with *out = p (the caller's now), or the failure: what was sent is collected, the
 * error names the first shard that failed, and p is freed. */
int kb_cluster_pending_send(kb_cluster_t *self, kb_cluster_pending_t *p, kb_cluster_pending_t **out)
{
    int rc = kb_cluster_fan_send(self, &p->fan);
    if (rc != 0) {
        rc = kb_cluster_fan_wait(self, &p->fan);
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    *out = p;
    return 0;
}

/* A new pending of table whose answers carry `want`. */
kb_cluster_pending_t *kb_cluster_pending_new(kb_cluster_t *self, const char *table, Carls__Response__ResultCase want)
{
    kb_cluster_pending_t *p = carls_xcalloc(1, sizeof *p);
    kb_cluster_fan_init(self, &p->fan, table, want);
    return p;
}

/* ---- tables ----------------------------------------------------------------------------------------- */

/* Sends operation op (its message msg, shared by every shard's request; each shard's client fills in its
 * own ids) on table (NULL: none) to every shard and waits for every answer, which must carry result want:
 * fan (the caller frees it with kb_cluster_fan_free) holds them on success. */
int kb_cluster_to_all(kb_cluster_t *self, kb_cluster_fan_t *fan, const char *table, Carls__Request__OpCase op,
                      void *msg, Carls__Response__ResultCase want)
{
    kb_cluster_fan_init(self, fan, table, want);
    for (uint32_t s = 0; s < self->n; s++)
        kb_cluster_request_op(fan, &fan->reqs[s], op, msg);
    return kb_cluster_fan_run(self, fan);
}

/* Drops table from the cache. */
static void s_forget_table(kb_cluster_t *self, const char *table)
{
    for (size_t i = 0; i < self->n_tables; i++) {
        if (strcmp(self->tables[i].name, table) == 0) {
            free(self->tables[i].name);
            self->tables[i] = self->tables[--self->n_tables];
            return;
        }
    }
}

int kb_cluster_create_table(kb_cluster_t *self, const char *table, const Carls__TableConfig *cfg,
                            bool if_not_exists)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!table || !cfg) {
        kb_cluster_set_error(self, "create_table: table name and config are required");
        return KB_CLIENT_EINVAL;
    }
    s_forget_table(self, table);
    Carls__CreateTable op = CARLS__CREATE_TABLE__INIT;
    op.config = (Carls__TableConfig *)cfg; /* packing only reads it */
    op.if_not_exists = if_not_exists;
    kb_cluster_fan_t fan;
    int rc = kb_cluster_to_all(self, &fan, table, CARLS__REQUEST__OP_CREATE_TABLE, &op, CARLS__RESPONSE__RESULT_WRITE);
    kb_cluster_fan_free(self, &fan);
    return rc;
}

int kb_cluster_drop_table(kb_cluster_t *self, const char *table, bool if_exists)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!table) {
        kb_cluster_set_error(self, "drop_table: table name is required");
        return KB_CLIENT_EINVAL;
    }
    s_forget_table(self, table);
    Carls__DropTable op = CARLS__DROP_TABLE__INIT;
    op.if_exists = if_exists;
    kb_cluster_fan_t fan;
    int rc = kb_cluster_to_all(self, &fan, table, CARLS__REQUEST__OP_DROP_TABLE, &op, CARLS__RESPONSE__RESULT_WRITE);
    kb_cluster_fan_free(self, &fan);
    return rc;
}

/* Replaces the cache with the tables of list (shard 0's answer). */
static void s_cache_tables(kb_cluster_t *self, const Carls__TableList *list)
{
    kb_cluster_forget_tables(self);
    if (list->n_tables == 0)
        return;
    self->tables = carls_xcalloc(list->n_tables, sizeof *self->tables);
    for (size_t i = 0; i < list->n_tables; i++) {
        const Carls__TableInfo *t = list->tables[i];
        if (!t || !t->name || !t->config)
            continue;
        kb_cluster_cached_table_t *c = &self->tables[self->n_tables++];
        c->name = carls_xmalloc(strlen(t->name) + 1);
        strcpy(c->name, t->name);
        c->info.kind = t->config->kind;
        c->info.dim = t->config->dim;
        c->info.has_knn = t->config->knn && t->config->knn->spec && t->config->knn->spec[0];
        c->info.metric = t->config->knn ? t->config->knn->metric : CARLS__KNN_METRIC__METRIC_IP;
    }
}

int kb_cluster_list_tables(kb_cluster_t *self, Carls__Response **list_out)
{
    assert(self && list_out);
    kb_cluster_clear_error(self);
    *list_out = NULL;
    Carls__ListTables op = CARLS__LIST_TABLES__INIT;
    kb_cluster_fan_t fan;
    int rc =
        kb_cluster_to_all(self, &fan, NULL, CARLS__REQUEST__OP_LIST_TABLES, &op, CARLS__RESPONSE__RESULT_TABLE_LIST);
    Carls__Response **resps = fan.resps;
    if (rc != 0)
        goto cleanup;
    Carls__TableList *list = resps[0]->table_list;
    for (uint32_t s = 1; s < self->n; s++) {
        const Carls__TableList *other = resps[s]->table_list;
        for (size_t i = 0; i < list->n_tables; i++) {
            Carls__TableInfo *t = list->tables[i];
            if (!t || !t->name)
                continue;
            for (size_t j = 0; j < other->n_tables; j++) {
                const Carls__TableInfo *o = other->tables[j];
                if (o && o->name && strcmp(o->name, t->name) == 0) {
                    t->rows += o->rows;
                    break;
                }
            }
        }
    }
    s_cache_tables(self, list);
    *list_out = resps[0];
    resps[0] = NULL;
cleanup:
    kb_cluster_fan_free(self, &fan);
    return rc;
}

int kb_cluster_table(kb_cluster_t *self, const char *table, kb_cluster_table_t *out)
{
    assert(self && out);
    kb_cluster_clear_error(self);
    if (!table || !*table) {
        kb_cluster_set_error(self, "no table name");
        return KB_CLIENT_EINVAL;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < self->n_tables; i++) {
            if (strcmp(self->tables[i].name, table) == 0) {
                *out = self->tables[i].info;
                return 0;
            }
        }
        if (pass == 1)
            break;
        Carls__Response *list = NULL;
        int rc = kb_cluster_list_tables(self, &list);
        if (rc != 0)
            return rc;
        carls__response__free_unpacked(list, NULL);
    }
    return kb_cluster_status_error(self, CARLS__STATUS_CODE__STATUS_NOT_FOUND, "no table named \"%s\"", table);
}

int kb_cluster_table_config(kb_cluster_t *self, const char *table, Carls__TableConfig **cfg_out)
{
    assert(self && cfg_out);
    *cfg_out = NULL;
    Carls__Response *list = NULL;
    int rc = kb_cluster_list_tables(self, &list);
    if (rc != 0)
        return rc;
    rc = kb_cluster_status_error(self, CARLS__STATUS_CODE__STATUS_NOT_FOUND, "no table named \"%s\"", table);
    for (size_t i = 0; i < list->table_list->n_tables; i++) {
        const Carls__TableInfo *t = list->table_list->tables[i];
        if (!t || !t->name || strcmp(t->name, table) != 0 || !t->config)
            continue;
        /* A deep copy that the caller frees on its own: pack and unpack. */
        size_t len = carls__table_config__get_packed_size(t->config);
        uint8_t *buf = carls_xmalloc(len ? len : 1);
        carls__table_config__pack(t->config, buf);
        *cfg_out = carls__table_config__unpack(NULL, len, buf);
        free(buf);
        if (!*cfg_out)
            CARLS_FATAL("cannot decode a table config we just packed");
        kb_cluster_clear_error(self);
        rc = 0;
        break;
    }
    carls__response__free_unpacked(list, NULL);
    return rc;
}

/* ---- rows ------------------------------------------------------------------------------------------- */

int kb_cluster_lookup_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                           bool no_create, kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    *pending_out = NULL;
    int rc = s_row_args(self, "lookup", table, n, dim);
    if (rc != 0)
        return rc;
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_LOOKUP);
    p->dim = dim;
    rc = kb_cluster_fan_keys(self, &p->fan, "lookup", CARLS__REQUEST__OP_LOOKUP, keys, n);
    if (rc != 0) {
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    for (uint32_t s = 0; s < self->n; s++)
        p->fan.ops[s].lookup.no_create = no_create; /* (unused where nothing is sent) */
    return kb_cluster_pending_send(self, p, pending_out);
}

/* Checks a lookup answer for n keys of table (dim dim) before anything is copied out of it: KB_CLIENT_EINVAL
 * when the table's dim differs, KB_CLIENT_EMALFORMED when it holds another number of values than n * dim or (when
 * with_meta) of metadata records than n; the reason in err. 0 when it fits. */
static int s_check_lookup(const Carls__LookupResult *res, const char *table, size_t n, uint32_t dim, bool with_meta,
                          char *err, size_t errlen)
{
    if (res->dim != dim)
        return carls_errorf(err, errlen, KB_CLIENT_EINVAL, "lookup in %s: the table has dim %u, the caller expected %u",
                            table, res->dim, dim);
    if (res->n_values != n * dim)
        return carls_errorf(err, errlen, KB_CLIENT_EMALFORMED,
                            "lookup in %s: the server sent %zu values for %zu keys of dim %u", table, res->n_values, n,
                            dim);
    if (with_meta && (res->n_versions != n || res->n_updated_at_ms != n || res->n_frequencies != n))
        return carls_errorf(err, errlen, KB_CLIENT_EMALFORMED,
                            "lookup in %s: the server sent metadata for %zu/%zu/%zu rows, not %zu", table,
                            res->n_versions, res->n_updated_at_ms, res->n_frequencies, n);
    return 0;
}

/* Checks every shard's lookup answer, then copies the rows (when values_out is not NULL) and the metadata
 * (when meta_out is not NULL) to the caller's key order. Nothing is copied when any answer fails its check. */
static int s_lookup_scatter(kb_cluster_t *self, const kb_cluster_fan_t *fan, uint32_t dim, float *values_out,
                            kb_row_meta_t *meta_out)
{
    const kb_cluster_split_t *sp = &fan->sp;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        char what[512];
        int rc = s_check_lookup(fan->resps[s]->lookup, fan->table, sp->count[s], dim, meta_out != NULL, what,
                                sizeof what);
        if (rc != 0) {
            kb_cluster_shard_error(self, s, what);
            return rc;
        }
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        const Carls__LookupResult *res = fan->resps[s]->lookup;
        for (size_t j = 0; j < sp->count[s]; j++) {
            size_t i = sp->order[sp->start[s] + j];
            if (values_out)
                memcpy(values_out + i * dim, res->values + j * dim, dim * sizeof(float));
            if (meta_out) {
                meta_out[i].version = res->versions[j];
                meta_out[i].updated_at_ms = res->updated_at_ms[j];
                meta_out[i].frequency = res->frequencies[j];
            }
        }
    }
    return 0;
}

int kb_cluster_lookup_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, float *values_out,
                           kb_row_meta_t *meta_out)
{
    assert(self && pending_p && *pending_p && (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_LOOKUP);
    kb_cluster_clear_error(self);
    kb_cluster_pending_t *p = *pending_p;
    int rc = kb_cluster_fan_wait(self, &p->fan);
    if (rc == 0)
        rc = s_lookup_scatter(self, &p->fan, p->dim, values_out, meta_out);
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_lookup(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                      float *values_out, kb_row_meta_t *meta_out)
{
    return kb_cluster_lookup_ex(self, table, keys, n, dim, false, values_out, meta_out);
}

int kb_cluster_lookup_ex(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                         bool no_create, float *values_out, kb_row_meta_t *meta_out)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!values_out) {
        kb_cluster_set_error(self, "lookup: no values");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_lookup_send(self, table, keys, n, dim, no_create, &p);
    return rc != 0 ? rc : kb_cluster_lookup_wait(self, &p, values_out, meta_out);
}

/* put and push_gradients: rows (n * dim floats) split by shard, sent without waiting. */
static int s_write_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                        const float *rows, Carls__Request__OpCase op, uint64_t version,
                        kb_cluster_pending_t **pending_out)
{
    const char *what = op == CARLS__REQUEST__OP_PUT ? "put" : "push_gradients";
    *pending_out = NULL;
    int rc = s_row_args(self, what, table, n, dim);
    if (rc == 0 && !rows) {
        kb_cluster_set_error(self, "%s: no values", what);
        rc = KB_CLIENT_EINVAL;
    }
    if (rc != 0)
        return rc;
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_WRITE);
    rc = kb_cluster_fan_keys(self, &p->fan, what, op, keys, n);
    if (rc != 0) {
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    s_fan_rows(self, &p->fan, rows, dim);
    for (uint32_t s = 0; op == CARLS__REQUEST__OP_PUT && s < self->n; s++)
        p->fan.ops[s].put.version = version;
    rc = kb_cluster_pending_send(self, p, pending_out);
    /* The requests are packed: the rows in shard order are not needed any more. */
    if (rc == 0) {
        free((*pending_out)->fan.rows);
        (*pending_out)->fan.rows = NULL;
    }
    return rc;
}

int kb_cluster_push_gradients_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                                   uint32_t dim, const float *gradients, kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    return s_write_send(self, table, keys, n, dim, gradients, CARLS__REQUEST__OP_PUSH_GRADIENTS, 0, pending_out);
}

/* Collects the acknowledgements of a put or push_gradients sent by s_write_send; frees *pending_p. */
static int s_write_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p)
{
    assert(self && pending_p && *pending_p && (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_WRITE);
    kb_cluster_clear_error(self);
    int rc = kb_cluster_fan_wait(self, &(*pending_p)->fan);
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_push_gradients_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p)
{
    return s_write_wait(self, pending_p);
}

int kb_cluster_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                   const float *values, uint64_t version)
{
    assert(self);
    kb_cluster_clear_error(self);
    kb_cluster_pending_t *p = NULL;
    int rc = s_write_send(self, table, keys, n, dim, values, CARLS__REQUEST__OP_PUT, version, &p);
    return rc != 0 ? rc : s_write_wait(self, &p);
}

int kb_cluster_push_gradients(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                              uint32_t dim, const float *gradients)
{
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_push_gradients_send(self, table, keys, n, dim, gradients, &p);
    return rc != 0 ? rc : kb_cluster_push_gradients_wait(self, &p);
}

/* ---- nearest neighbours ------------------------------------------------------------------------------ */

void kb_knn_result_destroy(kb_knn_result_t **result_p)
{
    if (!result_p || !*result_p)
        return;
    kb_knn_result_t *r = *result_p;
    free(r->keys);
    free(r->scores);
    free(r->key_bytes);
    free(r);
    *result_p = NULL;
}

/* One candidate answer while merging. */
typedef struct {
    const ProtobufCBinaryData *key;
    float score;
    uint32_t shard; /* tie-break: lower shard, then better rank within it */
    uint32_t rank;
} s_hit_t;

static int s_hit_higher_first(const void *a, const void *b)
{
    const s_hit_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int s_hit_lower_first(const void *a, const void *b)
{
    const s_hit_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? -1 : 1;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Checks a knn answer of shard s: nq * k keys and scores, k as asked. 0 or KB_CLIENT_EMALFORMED (error set). */
static int s_check_knn(kb_cluster_t *self, uint32_t s, const Carls__KnnResult *res, size_t nq, uint32_t k)
{
    if (res->k != k || res->n_keys != nq * k || res->n_scores != nq * k) {
        kb_cluster_shard_errorf(self, s,
                                "knn: the server sent k %u with %zu keys and %zu scores for %zu queries of k %u",
                                res->k, res->n_keys, res->n_scores, nq, k);
        return KB_CLIENT_EMALFORMED;
    }
    return 0;
}

/* Builds a result of nq * k slots from the chosen hits (hits[q * k + r], key NULL for an empty slot). */
static kb_knn_result_t *s_knn_result(size_t nq, uint32_t k, const s_hit_t *hits)
{
    kb_knn_result_t *r = carls_xcalloc(1, sizeof *r);
    r->nq = nq;
    r->k = k;
    size_t slots = nq * k, total = 0;
    r->keys = carls_xcalloc(slots ? slots : 1, sizeof *r->keys);
    r->scores = carls_xcalloc(slots ? slots : 1, sizeof *r->scores);
    for (size_t i = 0; i < slots; i++)
        if (hits[i].key)
            total += hits[i].key->len;
    r->key_bytes = carls_xmalloc(total ? total : 1);
    size_t off = 0;
    for (size_t i = 0; i < slots; i++) {
        if (!hits[i].key || hits[i].key->len == 0)
            continue;
        memcpy(r->key_bytes + off, hits[i].key->data, hits[i].key->len);
        r->keys[i].data = r->key_bytes + off;
        r->keys[i].len = hits[i].key->len;
        r->scores[i] = hits[i].score;
        off += hits[i].key->len;
    }
    return r;
}

/* Asks every shard for its top-k_ask of nq query vectors and merges them into the top k per query (k <=
 * k_ask). When exclude is not NULL, query q never answers exclude[q]. */
static int s_knn_merge(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                       uint32_t k, uint32_t k_ask, bool higher_first, const kb_key_t *exclude,
                       kb_knn_result_t **out)
{
    Carls__Knn op = CARLS__KNN__INIT;
    op.vectors = (float *)queries;
    op.n_vectors = nq * dim;
    op.k = k_ask;
    kb_cluster_fan_t fan;
    s_hit_t *cand = NULL, *chosen = NULL;
    int rc = kb_cluster_to_all(self, &fan, table, CARLS__REQUEST__OP_KNN, &op, CARLS__RESPONSE__RESULT_KNN);
    Carls__Response **resps = fan.resps;
    if (rc != 0)
        goto cleanup;
    for (uint32_t s = 0; s < self->n; s++) {
        rc = s_check_knn(self, s, resps[s]->knn, nq, k_ask);
        if (rc != 0)
            goto cleanup;
    }
    cand = carls_xmalloc((size_t)self->n * k_ask * sizeof *cand);
    chosen = carls_xcalloc(nq * k, sizeof *chosen);
    for (size_t q = 0; q < nq; q++) {
        size_t nc = 0;
        for (uint32_t s = 0; s < self->n; s++) {
            const Carls__KnnResult *res = resps[s]->knn;
            for (uint32_t r = 0; r < k_ask; r++) {
                const ProtobufCBinaryData *key = &res->keys[q * k_ask + r];
                if (key->len == 0)
                    continue; /* the shard has fewer rows than k */
                if (exclude && key->len == exclude[q].len && memcmp(key->data, exclude[q].data, key->len) == 0)
                    continue;
                cand[nc++] = (s_hit_t){key, res->scores[q * k_ask + r], s, r};
            }
        }
        qsort(cand, nc, sizeof *cand, higher_first ? s_hit_higher_first : s_hit_lower_first);
        for (size_t r = 0; r < k && r < nc; r++)
            chosen[q * k + r] = cand[r];
    }
    *out = s_knn_result(nq, k, chosen);
cleanup:
    free(cand);
    free(chosen);
    kb_cluster_fan_free(self, &fan);
    return rc;
}

/* The single-shard pass-through: one knn request as given, its answer converted. */
static int s_knn_single(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                        const kb_key_t *keys, uint32_t k, bool exclude, kb_knn_result_t **out)
{
    kb_cluster_fan_t fan;
    kb_cluster_fan_init(self, &fan, table, CARLS__RESPONSE__RESULT_KNN);
    ProtobufCBinaryData *wire = NULL;
    if (keys) {
        wire = carls_xmalloc(nq * sizeof *wire);
        for (size_t i = 0; i < nq; i++) {
            wire[i].data = (uint8_t *)keys[i].data;
            wire[i].len = keys[i].len;
        }
    }
    Carls__Knn *op = &kb_cluster_fan_request(&fan, 0, CARLS__REQUEST__OP_KNN, wire, keys ? nq : 0)->knn;
    if (keys) {
        op->exclude_query = exclude;
    } else {
        op->vectors = (float *)queries;
        op->n_vectors = nq * dim;
    }
    op->k = k;
    s_hit_t *hits = NULL;
    int rc = kb_cluster_fan_run(self, &fan);
    if (rc != 0)
        goto cleanup;
    const Carls__KnnResult *res = fan.resps[0]->knn;
    rc = s_check_knn(self, 0, res, nq, k);
    if (rc != 0)
        goto cleanup;
    hits = carls_xcalloc(nq * k, sizeof *hits);
    for (size_t i = 0; i < nq * k; i++)
        if (res->keys[i].len > 0)
            hits[i] = (s_hit_t){&res->keys[i], res->scores[i], 0, 0};
    *out = s_knn_result(nq, k, hits);
cleanup:
    free(hits);
    kb_cluster_fan_free(self, &fan);
    free(wire);
    return rc;
}

/* Checks k and the table (an embedding table with an index); *info gets its description. */
static int s_knn_args(kb_cluster_t *self, const char *table, size_t nq, uint32_t k, kb_cluster_table_t *info)
{
    if (!table || !*table) {
        kb_cluster_set_error(self, "knn: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (nq == 0) {
        kb_cluster_set_error(self, "knn: no queries");
        return KB_CLIENT_EINVAL;
    }
    if (k == 0 || k > CARLS_MAX_KNN_K) {
        kb_cluster_set_error(self, "knn: k must be in 1..%u, got %u", CARLS_MAX_KNN_K, k);
        return KB_CLIENT_EINVAL;
    }
    if (nq > SIZE_MAX / CARLS_MAX_KNN_K / self->n / sizeof(s_hit_t)) {
        kb_cluster_set_error(self, "knn: %zu queries are too many", nq);
        return KB_CLIENT_EINVAL;
    }
    if (!info)
        return 0;
    int rc = kb_cluster_table(self, table, info);
    if (rc != 0)
        return rc;
    if (info->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING || !info->has_knn) {
        /* What every shard would answer, so it reads the same as the single-server error. */
        return kb_cluster_status_error(self, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                       "table '%s' has no nearest-neighbour index (create it with a knn spec)", table);
    }
    return 0;
}

static bool s_higher_first(Carls__KnnMetric metric) { return metric != CARLS__KNN_METRIC__METRIC_L2; }

int kb_cluster_knn(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                   uint32_t k, kb_knn_result_t **out)
{
    assert(self && out);
    kb_cluster_clear_error(self);
    *out = NULL;
    if (!queries || dim == 0 || (nq > 0 && SIZE_MAX / dim / sizeof(float) < nq)) {
        kb_cluster_set_error(self, "knn: no query vectors, or dim 0");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_table_t info;
    int rc = s_knn_args(self, table, nq, k, self->n == 1 ? NULL : &info);
    if (rc != 0)
        return rc;
    if (self->n == 1)
        return s_knn_single(self, table, queries, nq, dim, NULL, k, false, out);
    if (info.dim != dim) {
        kb_cluster_set_error(self, "knn in %s: the table has dim %u, the caller's queries have %u", table, info.dim,
                             dim);
        return KB_CLIENT_EINVAL;
    }
    return s_knn_merge(self, table, queries, nq, dim, k, k, s_higher_first(info.metric), NULL, out);
}

int kb_cluster_knn_by_key(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t nq, uint32_t k,
                          bool exclude_self, kb_knn_result_t **out)
{
    assert(self && out);
    kb_cluster_clear_error(self);
    *out = NULL;
    if (!keys) {
        kb_cluster_set_error(self, "knn: no query keys");
        return KB_CLIENT_EINVAL;
    }
    for (size_t i = 0; i < nq; i++) {
        if (keys[i].len == 0 || !keys[i].data) {
            kb_cluster_set_error(self, "knn: query key %zu is empty", i);
            return KB_CLIENT_EINVAL;
        }
    }
    kb_cluster_table_t info;
    int rc = s_knn_args(self, table, nq, k, self->n == 1 ? NULL : &info);
    if (rc != 0)
        return rc;
    if (self->n == 1)
        return s_knn_single(self, table, NULL, nq, 0, keys, k, exclude_self, out);
    /* The owning shards give the keys' current values; then it is a query by vector. */
    float *vecs = carls_xmalloc(nq * info.dim * sizeof *vecs);
    rc = kb_cluster_lookup_ex(self, table, keys, nq, info.dim, true, vecs, NULL);
    if (rc == 0) {
        /* The query key itself may take one of a shard's k places: ask for one more so k remain. */
        uint32_t k_ask = exclude_self && k < CARLS_MAX_KNN_K ? k + 1 : k;
        rc = s_knn_merge(self, table, vecs, nq, info.dim, k, k_ask, s_higher_first(info.metric),
                         exclude_self ? keys : NULL, out);
    }
    free(vecs);
    return rc;
}

/* ---- candidate sampling ------------------------------------------------------------------------------ */

void kb_sample_result_destroy(kb_sample_result_t **result_p)
{
    if (!result_p || !*result_p)
        return;
    kb_sample_result_t *r = *result_p;
    free(r->keys);
    free(r->probabilities);
    free(r->is_positive);
    free(r->key_bytes);
    free(r);
    *result_p = NULL;
}

/* Checks a sample answer: n_pos positives then between 0 and n candidates, one probability and flag per
 * key, flags matching the positions, probabilities finite in [0, 1], mass finite and >= 0. */
static int s_check_sample(kb_cluster_t *self, uint32_t s, const Carls__SampleResult *res, size_t n_pos, uint32_t n)
{
    if (res->n_keys < n_pos || res->n_keys - n_pos > n || res->n_probabilities != res->n_keys ||
        res->n_is_positive != res->n_keys) {
        kb_cluster_shard_errorf(self, s, "sample: the server sent %zu keys, %zu probabilities and %zu flags for %zu "
                                "positives and %u candidates", res->n_keys, res->n_probabilities, res->n_is_positive,
                                n_pos, n);
        return KB_CLIENT_EMALFORMED;
    }
    if (!isfinite(res->mass) || res->mass < 0) {
        kb_cluster_shard_errorf(self, s, "sample: the server sent mass %g", res->mass);
        return KB_CLIENT_EMALFORMED;
    }
    for (size_t i = 0; i < res->n_keys; i++) {
        float p = res->probabilities[i];
        if (res->is_positive[i] != (i < n_pos) || !(p >= 0.0f && p <= 1.0f) || (i >= n_pos && res->keys[i].len == 0)) {
            kb_cluster_shard_errorf(self, s, "sample: entry %zu of the answer is malformed (probability %g, %s)", i,
                                    (double)p, res->is_positive[i] ? "positive" : "candidate");
            return KB_CLIENT_EMALFORMED;
        }
    }
    return 0;
}

/* The seed shard s draws with: a function of the caller's seed and s only, never 0 (0 asks the server to
 * pick one, which would make a seeded sample unrepeatable). */
static uint64_t s_shard_seed(uint64_t seed, uint32_t s)
{
    uint64_t st = seed ^ (0x9e3779b97f4a7c15ull * ((uint64_t)s + 1));
    uint64_t v = carls_splitmix64(&st);
    return v ? v : 1;
}

/* Builds one Sample request per shard in fan: positives of that shard (grouped per sp; sp may be NULL for
 * none), counts[s] candidates (NULL: 0 each), shards with nothing to do skipped unless ask_all. Shard s
 * draws with s_shard_seed(seed, s), or with seed itself when raw_seed (the single-shard pass-through). */
static void s_sample_build(kb_cluster_t *self, kb_cluster_fan_t *fan, const kb_cluster_split_t *sp,
                           const uint32_t *counts, bool ask_all, Carls__SampleStrategy strategy, uint64_t seed,
                           bool raw_seed)
{
    for (uint32_t s = 0; s < self->n; s++) {
        size_t np = sp ? sp->count[s] : 0;
        uint32_t nc = counts ? counts[s] : 0;
        if (!ask_all && np == 0 && nc == 0)
            continue;
        Carls__Sample *op =
            &kb_cluster_fan_request(fan, s, CARLS__REQUEST__OP_SAMPLE, np ? sp->wire + sp->start[s] : NULL, np)->sample;
        op->n = nc;
        op->strategy = strategy;
        op->seed = raw_seed ? seed : s_shard_seed(seed, s);
    }
}

/* Checks every answer of a sample fan-out against its request (s_check_sample). */
static int s_sample_check(kb_cluster_t *self, const kb_cluster_fan_t *fan)
{
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        const Carls__Sample *op = &fan->ops[s].sample;
        int rc = s_check_sample(self, s, fan->resps[s]->sample, op->n_positives, op->n);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* One round of the sharded sample on an initialised fan: s_sample_build, then every answer, checked. */
static int s_sample_round(kb_cluster_t *self, kb_cluster_fan_t *fan, const kb_cluster_split_t *sp,
                          const uint32_t *counts, bool ask_all, Carls__SampleStrategy strategy, uint64_t seed)
{
    s_sample_build(self, fan, sp, counts, ask_all, strategy, seed, false);
    int rc = kb_cluster_fan_run(self, fan);
    return rc != 0 ? rc : s_sample_check(self, fan);
}

/* Room for a result of n entries whose keys total key_total bytes. */
static kb_sample_result_t *s_sample_alloc(size_t n, size_t key_total)
{
    kb_sample_result_t *r = carls_xcalloc(1, sizeof *r);
    r->keys = carls_xcalloc(n ? n : 1, sizeof *r->keys);
    r->probabilities = carls_xcalloc(n ? n : 1, sizeof *r->probabilities);
    r->is_positive = carls_xcalloc(n ? n : 1, sizeof *r->is_positive);
    r->key_bytes = carls_xmalloc(key_total ? key_total : 1);
    return r;
}

/* Appends one entry to r (room was made by s_sample_alloc); *off is the next free key byte. */
static void s_sample_add(kb_sample_result_t *r, size_t *off, const void *key, size_t len, double p, bool positive)
{
    memcpy(r->key_bytes + *off, key, len);
    r->keys[r->n].data = r->key_bytes + *off;
    r->keys[r->n].len = len;
    r->probabilities[r->n] = (float)p;
    r->is_positive[r->n] = positive;
    r->n++;
    *off += len;
}

/* Checks sample's arguments. 0 or KB_CLIENT_EINVAL (error set). */
static int s_sample_args(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                         Carls__SampleStrategy strategy)
{
    if (!table || !*table) {
        kb_cluster_set_error(self, "sample: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM && strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM &&
        strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM) {
        kb_cluster_set_error(self, "sample: unknown strategy %d", (int)strategy);
        return KB_CLIENT_EINVAL;
    }
    if (n_positives > 0 && !positives) {
        kb_cluster_set_error(self, "sample: no positive keys");
        return KB_CLIENT_EINVAL;
    }
    return 0;
}

/* The single shard's answer as a result: the entries as they are (scale 1). */
static kb_sample_result_t *s_sample_single_result(const Carls__SampleResult *res, size_t n_positives)
{
    size_t total = 0;
    for (size_t i = 0; i < res->n_keys; i++)
        total += res->keys[i].len;
    kb_sample_result_t *r = s_sample_alloc(res->n_keys, total);
    size_t off = 0;
    for (size_t i = 0; i < res->n_keys; i++)
        s_sample_add(r, &off, res->keys[i].data, res->keys[i].len, res->probabilities[i], res->is_positive[i]);
    r->n_positives = n_positives;
    r->mass = res->mass;
    r->rows = res->rows;
    return r;
}

/* The sample over several shards (see kb_cluster_sample in kb_cluster.h): two rounds, then the merge. */
static int s_sample_sharded(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                            uint32_t n, Carls__SampleStrategy strategy, uint64_t seed, kb_sample_result_t **out)
{
    /* The split needs a seed here (one shard would pick its own for 0). */
    while (seed == 0) {
        if (carls_random_bytes(&seed, sizeof seed) != 0) {
            kb_cluster_set_error(self, "sample: cannot read random bytes for a seed");
            return KB_CLIENT_EIO;
        }
    }
    kb_cluster_split_t sp;
    kb_cluster_fan_t round1, round2; /* every shard's mass (and its positives'), then its draws */
    memset(&sp, 0, sizeof sp);
    kb_cluster_fan_init(self, &round1, table, CARLS__RESPONSE__RESULT_SAMPLE);
    kb_cluster_fan_init(self, &round2, table, CARLS__RESPONSE__RESULT_SAMPLE);
    uint32_t *counts = carls_xcalloc(self->n, sizeof *counts);
    size_t *next_pos = carls_xcalloc(self->n, sizeof *next_pos);
    kb_sample_result_t *r = NULL;
    int rc = 0;
    if (n_positives > 0) {
        rc = kb_cluster_split(self, "sample", positives, n_positives, &sp);
        if (rc != 0)
            goto cleanup;
    }

    /* Round 1: every shard's mass, and the probabilities of the positives it owns. */
    rc = s_sample_round(self, &round1, n_positives ? &sp : NULL, NULL, true, strategy, seed);
    if (rc != 0)
        goto cleanup;
    double total = 0;
    uint64_t rows = 0;
    for (uint32_t s = 0; s < self->n; s++) {
        total += round1.resps[s]->sample->mass;
        rows += round1.resps[s]->sample->rows;
    }
    if (n > 0 && !(total > 0)) {
        /* What a single server answers when it has nothing to draw from. */
        rc = kb_cluster_status_error(self, CARLS__STATUS_CODE__STATUS_NOT_FOUND,
                                     "table '%s' has no rows that strategy can draw", table);
        goto cleanup;
    }
    /* The multinomial split of n by mass (shards with no mass get no draws). */
    if (n > 0) {
        uint64_t st = seed;
        for (uint32_t d = 0; d < n; d++) {
            double u = carls_unit_double(&st) * total, acc = 0;
            uint32_t pick = self->n; /* rounding may leave u >= the last sum: the last shard with mass */
            for (uint32_t s = 0; s < self->n; s++) {
                acc += round1.resps[s]->sample->mass;
                if (round1.resps[s]->sample->mass > 0 && u < acc) {
                    pick = s;
                    break;
                }
            }
            if (pick == self->n)
                for (uint32_t s = 0; s < self->n; s++)
                    if (round1.resps[s]->sample->mass > 0)
                        pick = s;
            counts[pick]++;
        }
        /* Round 2: each shard draws its share. */
        rc = s_sample_round(self, &round2, NULL, counts, false, strategy, seed);
        if (rc != 0)
            goto cleanup;
    }

    size_t entries = n_positives, key_total = 0;
    for (size_t i = 0; i < n_positives; i++)
        key_total += positives[i].len;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!round2.resps[s])
            continue;
        const Carls__SampleResult *res = round2.resps[s]->sample;
        entries += res->n_keys;
        for (size_t i = 0; i < res->n_keys; i++)
            key_total += res->keys[i].len;
    }
    r = s_sample_alloc(entries, key_total);
    r->mass = total;
    r->rows = rows;
    r->n_positives = n_positives;
    size_t off = 0;
    /* Positives in the caller's order, each scaled by its owner's share of the total mass. */
    for (size_t i = 0; i < n_positives; i++) {
        uint32_t s = carls_shard_of(positives[i].data, positives[i].len, self->n);
        const Carls__SampleResult *res = round1.resps[s]->sample;
        double p = total > 0 ? res->probabilities[next_pos[s]++] * (res->mass / total) : 0.0;
        s_sample_add(r, &off, positives[i].data, positives[i].len, p, true);
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!round2.resps[s])
            continue;
        /* The shard's own mass in this answer: its probabilities are relative to it. */
        const Carls__SampleResult *res = round2.resps[s]->sample;
        for (size_t i = 0; i < res->n_keys; i++)
            s_sample_add(r, &off, res->keys[i].data, res->keys[i].len,
                         res->probabilities[i] * (res->mass / total), false);
    }
    /* Shuffle the candidates (Fisher-Yates, seeded): the draws are exchangeable, so a caller taking a prefix
     * must not get one shard's draws first. */
    uint64_t st = s_shard_seed(seed, self->n);
    for (size_t i = r->n; i > n_positives + 1; i--) {
        size_t j = n_positives + (size_t)(carls_unit_double(&st) * (double)(i - n_positives));
        if (j >= i)
            j = i - 1;
        kb_key_t tk = r->keys[i - 1];
        r->keys[i - 1] = r->keys[j];
        r->keys[j] = tk;
        float tp = r->probabilities[i - 1];
        r->probabilities[i - 1] = r->probabilities[j];
        r->probabilities[j] = tp;
    }
    *out = r;
cleanup:
    kb_cluster_fan_free(self, &round1);
    kb_cluster_fan_free(self, &round2);
    free(counts);
    free(next_pos);
    kb_cluster_split_free(&sp);
    return rc;
}

int kb_cluster_sample_send(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                           uint32_t n, Carls__SampleStrategy strategy, uint64_t seed,
                           kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    *pending_out = NULL;
    int rc = s_sample_args(self, table, positives, n_positives, strategy);
    if (rc != 0)
        return rc;
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_SAMPLE);
    if (self->n > 1) {
        /* Round 2 depends on round 1's answers: the draws are made now. */
        rc = s_sample_sharded(self, table, positives, n_positives, n, strategy, seed, &p->sample);
        if (rc != 0) {
            kb_cluster_pending_destroy(self, &p);
            return rc;
        }
        *pending_out = p;
        return 0;
    }
    /* One shard: one request with everything, as given (the server picks a seed for 0). */
    if (n_positives > 0) {
        rc = kb_cluster_split(self, "sample", positives, n_positives, &p->fan.sp);
        if (rc != 0) {
            kb_cluster_pending_destroy(self, &p);
            return rc;
        }
    }
    s_sample_build(self, &p->fan, n_positives ? &p->fan.sp : NULL, &n, true, strategy, seed, true);
    return kb_cluster_pending_send(self, p, pending_out);
}

int kb_cluster_sample_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, kb_sample_result_t **out)
{
    assert(self && out && pending_p && *pending_p && (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_SAMPLE);
    kb_cluster_clear_error(self);
    *out = NULL;
    kb_cluster_pending_t *p = *pending_p;
    int rc = 0;
    if (self->n > 1) {
        *out = p->sample;
        p->sample = NULL;
    } else {
        rc = kb_cluster_fan_wait(self, &p->fan);
        if (rc == 0)
            rc = s_sample_check(self, &p->fan);
        if (rc == 0)
            *out = s_sample_single_result(p->fan.resps[0]->sample, p->fan.ops[0].sample.n_positives);
    }
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_sample(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                      uint32_t n, Carls__SampleStrategy strategy, uint64_t seed, kb_sample_result_t **out)
{
    assert(self && out);
    *out = NULL;
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_sample_send(self, table, positives, n_positives, n, strategy, seed, &p);
    return rc != 0 ? rc : kb_cluster_sample_wait(self, &p, out);
}

/* ---- feature records -------------------------------------------------------------------------------- */

void kb_feature_result_destroy(kb_feature_result_t **result_p)
{
    if (!result_p || !*result_p)
        return;
    kb_feature_result_t *r = *result_p;
    for (size_t i = 0; i < r->n_responses; i++)
        if (r->responses[i])
            carls__response__free_unpacked(r->responses[i], NULL);
    free(r->responses);
    free(r->records);
    free(r);
    *result_p = NULL;
}

int kb_cluster_feature_get_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                                kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    *pending_out = NULL;
    if (!table || !*table) {
        kb_cluster_set_error(self, "feature_get: no table name");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_FEATURES);
    int rc = kb_cluster_fan_keys(self, &p->fan, "feature_get", CARLS__REQUEST__OP_FEATURE_GET, keys, n);
    if (rc != 0) {
        kb_cluster_pending_destroy(self, &p);
        return rc;
    }
    return kb_cluster_pending_send(self, p, pending_out);
}

int kb_cluster_feature_get_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, kb_feature_result_t **out)
{
    assert(self && out && pending_p && *pending_p &&
           (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_FEATURES);
    kb_cluster_clear_error(self);
    *out = NULL;
    kb_cluster_fan_t *fan = &(*pending_p)->fan;
    int rc = kb_cluster_fan_wait(self, fan);
    if (rc != 0)
        goto cleanup;
    const kb_cluster_split_t *sp = &fan->sp;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        const Carls__FeatureResult *res = fan->resps[s]->features;
        bool ok = res->n_records == sp->count[s];
        for (size_t j = 0; ok && j < res->n_records; j++)
            ok = res->records[j] != NULL;
        if (!ok) {
            kb_cluster_shard_errorf(self, s, "feature_get: the server sent %zu records for %zu keys", res->n_records,
                                    sp->count[s]);
            rc = KB_CLIENT_EMALFORMED;
            goto cleanup;
        }
    }
    const size_t n = sp->start[self->n - 1] + sp->count[self->n - 1];
    kb_feature_result_t *r = carls_xcalloc(1, sizeof *r);
    r->n = n;
    r->records = carls_xcalloc(n, sizeof *r->records);
    r->responses = carls_xcalloc(self->n, sizeof *r->responses);
    r->n_responses = self->n;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        for (size_t j = 0; j < sp->count[s]; j++)
            r->records[sp->order[sp->start[s] + j]] = fan->resps[s]->features->records[j];
        r->responses[s] = fan->resps[s];
        fan->resps[s] = NULL;
    }
    *out = r;
cleanup:
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_feature_get(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           kb_feature_result_t **out)
{
    assert(self && out);
    *out = NULL;
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_feature_get_send(self, table, keys, n, &p);
    return rc != 0 ? rc : kb_cluster_feature_get_wait(self, &p, out);
}

int kb_cluster_feature_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           const Carls__FeatureRecord *const *records)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (!table || !*table) {
        kb_cluster_set_error(self, "feature_put: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (!records) {
        kb_cluster_set_error(self, "feature_put: no records");
        return KB_CLIENT_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!records[i]) {
            kb_cluster_set_error(self, "feature_put: record %zu is missing", i);
            return KB_CLIENT_EINVAL;
        }
    }
    kb_cluster_fan_t fan;
    kb_cluster_fan_init(self, &fan, table, CARLS__RESPONSE__RESULT_WRITE);
    int rc = kb_cluster_fan_keys(self, &fan, "feature_put", CARLS__REQUEST__OP_FEATURE_PUT, keys, n);
    if (rc == 0) {
        const kb_cluster_split_t *sp = &fan.sp;
        fan.records = carls_xmalloc(n * sizeof *fan.records);
        for (size_t j = 0; j < n; j++)
            fan.records[j] = (Carls__FeatureRecord *)records[sp->order[j]]; /* packing only reads them */
        for (uint32_t s = 0; s < self->n; s++) {
            if (sp->count[s] == 0)
                continue;
            fan.ops[s].feature_put.n_records = sp->count[s];
            fan.ops[s].feature_put.records = fan.records + sp->start[s];
        }
        rc = kb_cluster_fan_run(self, &fan);
    }
    kb_cluster_fan_free(self, &fan);
    return rc;
}

/* ---- per shard -------------------------------------------------------------------------------------- */

/* Sends req to shard s and waits for its answer: 0 with *out (the caller's) carrying result want, or the
 * failure (error set, *out NULL). */
static int s_call_shard(kb_cluster_t *self, uint32_t s, Carls__Request *req, Carls__Response__ResultCase want,
                        Carls__Response **out)
{
    *out = NULL;
    Carls__Response *resp = NULL;
    self->requests++;
    int rc = kb_client_call(self->clients[s], req, &resp);
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
