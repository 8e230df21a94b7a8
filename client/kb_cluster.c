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
 * the caller's buffers: a shard is another process and may be broken or hostile.
 *
 * This file holds the errors, the lifecycle, the engine and the table operations; the other operations are
 * in kb_cluster_rows.c (lookup, put, push_gradients, feature records), kb_cluster_knn.c (knn, sample) and
 * kb_cluster_admin.c (per-shard calls, checkpoint, snapshots, import_rows), sharing kb_cluster_internal.h. */
#include "kb_cluster.h"
#include "kb_cluster_internal.h"

#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
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
    while (p) {
        char *ep = kb_client_list_item(&p, ',');
        if (!ep) {
            LOG_ERROR("kb_cluster: empty endpoint at position %u of \"%s\"", self->n + 1, list);
            return -1;
        }
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
    /* Kept for the read replicas' clients (s_reader_of): the cluster's options. */
    if (opts)
        self->read_opts = *opts;
    if (opts && opts->curve) {
        self->curve = *opts->curve;
        self->read_opts.curve = &self->curve;
    }
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
    kb_cluster_readers_free(self);
    explicit_bzero(&self->curve, sizeof self->curve);
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
    fan->to = carls_xcalloc(self->n, sizeof *fan->to);
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
            kb_client_cancel(fan->to[s], fan->ids[s]); /* set by kb_cluster_send_to before in_flight */
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
    free(fan->to);
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
        int rc = kb_cluster_send_to(self, s, &fan->reqs[s], &fan->to[s], &fan->ids[s]);
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
        int rc = kb_cluster_wait_from(self, s, &fan->reqs[s], fan->to[s], &fan->ids[s], fan->want, &resp);
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
    /* Pass 0: the cache. Pass 1: the list, which with read replicas a follower may answer (the configs a read
     * needs while the primary is away). Pass 2, read replicas only: a table the follower's list lacks may have
     * been created a moment ago, so the shards' own clients are asked. */
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < self->n_tables; i++) {
            if (strcmp(self->tables[i].name, table) == 0) {
                *out = self->tables[i].info;
                return 0;
            }
        }
        if (pass == 2 || (pass == 1 && !self->read_staleness_ms))
            break;
        const uint32_t bound = self->read_staleness_ms;
        if (pass == 1)
            self->read_staleness_ms = 0;
        Carls__Response *list = NULL;
        int rc = kb_cluster_list_tables(self, &list);
        self->read_staleness_ms = bound;
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
