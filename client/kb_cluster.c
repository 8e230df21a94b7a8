/* Sharded client (contract in kb_cluster.h).
 *
 * Every multi-shard operation follows one pattern: build at most one request per shard, send them all
 * (kb_client_send never blocks), then wait for each in shard order (s_fanout). While we wait for shard 0 the
 * other shards work and their answers queue on their own sockets, so a fan-out costs about one round trip
 * to the slowest shard, not the sum. Keys are split with s_split (a counting sort by shard that remembers
 * each key's position in the caller's arrays) and answers are scattered back through the same map.
 *
 * Every answer is checked against what was asked (counts per key, dims) before anything is copied into
 * the caller's buffers: a shard is another process and may be broken or hostile. */
#include "kb_cluster.h"

#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_MAX_K 4096u /* the server's cap on k (docs/PROTOCOL.md) */

/* What the cluster remembers about one table. */
typedef struct {
    char *name;
    kb_cluster_table_t info;
} s_cached_table_t;

struct kb_cluster {
    uint32_t n;                /* shards */
    kb_client_t **clients;     /* (n) shard i's client */
    char **endpoints;          /* (n) shard i's endpoint */
    s_cached_table_t *tables;  /* cache filled by list_tables */
    size_t n_tables;
    int failed_shard;          /* shard the last error is about, or -1 */
    char last_error[768];      /* "" after success */
};

static void s_set_error(kb_cluster_t *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void s_set_error(kb_cluster_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->last_error, sizeof self->last_error, fmt, ap);
    va_end(ap);
    self->failed_shard = -1;
}

static void s_clear_error(kb_cluster_t *self)
{
    self->last_error[0] = '\0';
    self->failed_shard = -1;
}

/* Records that shard s failed, with the shard's client error as the text (replacing any earlier text: the
 * callers decide which failure of a call is reported, see s_fanout). With one shard the text is the client's
 * own (a single server needs no name). */
static void s_shard_error(kb_cluster_t *self, uint32_t s, const char *what)
{
    if (self->n == 1)
        snprintf(self->last_error, sizeof self->last_error, "%s", what);
    else
        snprintf(self->last_error, sizeof self->last_error, "shard %u (%s): %s", s, self->endpoints[s], what);
    self->failed_shard = (int)s;
}

/* s_shard_error with a formatted reason (for answers that fail our checks). */
static void s_shard_errorf(kb_cluster_t *self, uint32_t s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void s_shard_errorf(kb_cluster_t *self, uint32_t s, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    s_shard_error(self, s, what);
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
        if (self->clients)
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

kb_client_t *kb_cluster_client(kb_cluster_t *self, uint32_t shard)
{
    assert(self && shard < self->n);
    return self->clients[shard];
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

/* ---- fan-out ------------------------------------------------------------------------------------------ */

/* Sends reqs[s] to shard s for every s with reqs[s] != NULL, then waits for each answer in shard order.
 * On success resps[s] holds shard s's answer (NULL where nothing was sent), each carrying result `want`;
 * the caller frees them (s_free_responses). On failure every answer is freed, resps is all NULL, the error
 * names the first shard (in shard order) that failed, and its code is returned. After a failed send
 * nothing more is sent, but everything already sent is still waited for, so no request is left in flight
 * and no late answer is mistaken for a later request's. */
static int s_fanout(kb_cluster_t *self, Carls__Request **reqs, Carls__Response__ResultCase want,
                    Carls__Response **resps)
{
    uint64_t *ids = carls_xcalloc(self->n, sizeof *ids);
    bool *sent = carls_xcalloc(self->n, sizeof *sent);
    int rc = 0;
    int first_failed = -1; /* the shard whose failure the error text describes */
    for (uint32_t s = 0; s < self->n; s++) {
        resps[s] = NULL;
        if (!reqs[s] || rc != 0)
            continue;
        int r = kb_client_send(self->clients[s], reqs[s], &ids[s]);
        if (r != 0) {
            s_shard_error(self, s, kb_client_last_error(self->clients[s]));
            first_failed = (int)s;
            rc = r;
            continue;
        }
        sent[s] = true;
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!sent[s])
            continue;
        Carls__Response *resp = NULL;
        int r = kb_client_wait(self->clients[s], ids[s], &resp);
        /* Shards are waited for in order and a failed send stops further sends, so a failure here is on a
         * lower shard than any recorded send failure: it becomes the one reported. */
        bool first = first_failed < 0 || (int)s < first_failed;
        if (r == 0 && resp->result_case != want) {
            r = KB_CLIENT_EIO;
            if (first)
                s_shard_errorf(self, s, "the answer to %s carries the wrong result (case %d)",
                               carls_op_name(reqs[s]->op_case), (int)resp->result_case);
        } else if (r != 0 && first) {
            s_shard_error(self, s, kb_client_last_error(self->clients[s]));
        }
        if (r != 0) {
            if (first) {
                first_failed = (int)s;
                rc = r;
            }
            if (resp)
                carls__response__free_unpacked(resp, NULL);
            continue;
        }
        resps[s] = resp;
    }
    if (rc != 0) {
        for (uint32_t s = 0; s < self->n; s++) {
            if (resps[s])
                carls__response__free_unpacked(resps[s], NULL);
            resps[s] = NULL;
        }
    }
    free(ids);
    free(sent);
    return rc;
}

static void s_free_responses(kb_cluster_t *self, Carls__Response **resps)
{
    for (uint32_t s = 0; s < self->n; s++) {
        if (resps[s])
            carls__response__free_unpacked(resps[s], NULL);
        resps[s] = NULL;
    }
}

/* ---- splitting keys by shard ------------------------------------------------------------------------- */

/* Keys grouped by shard: shard s's keys are wire[start[s] .. start[s] + count[s]), and order[j] is the
 * caller's index of grouped key j. Within a shard the caller's order is kept. */
typedef struct {
    size_t *count;              /* (shards) */
    size_t *start;              /* (shards) */
    size_t *order;              /* (n) */
    ProtobufCBinaryData *wire;  /* (n) pointing at the caller's key bytes */
} s_split_t;

static void s_split_free(s_split_t *sp)
{
    free(sp->count);
    free(sp->start);
    free(sp->order);
    free(sp->wire);
    memset(sp, 0, sizeof *sp);
}

/* Checks keys (non-empty) and groups them by shard into *sp (caller frees with s_split_free, also on
 * failure). 0, or KB_CLIENT_EINVAL (error set). */
static int s_split(kb_cluster_t *self, const char *what, const kb_key_t *keys, size_t n, s_split_t *sp)
{
    memset(sp, 0, sizeof *sp);
    if (!keys || n == 0) {
        s_set_error(self, "%s: no keys", what);
        return KB_CLIENT_EINVAL;
    }
    sp->count = carls_xcalloc(self->n, sizeof *sp->count);
    sp->start = carls_xcalloc(self->n, sizeof *sp->start);
    sp->order = carls_xmalloc(n * sizeof *sp->order);
    sp->wire = carls_xmalloc(n * sizeof *sp->wire);
    uint32_t *shard = carls_xmalloc(n * sizeof *shard);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].len == 0 || !keys[i].data) {
            s_set_error(self, "%s: key %zu is empty", what, i);
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

/* Common argument checks of the row operations. 0 or KB_CLIENT_EINVAL (error set). */
static int s_row_args(kb_cluster_t *self, const char *what, const char *table, size_t n, uint32_t dim,
                      const void *values)
{
    if (!table || !*table) {
        s_set_error(self, "%s: no table name", what);
        return KB_CLIENT_EINVAL;
    }
    if (dim == 0) {
        s_set_error(self, "%s: dim is 0", what);
        return KB_CLIENT_EINVAL;
    }
    if (n > SIZE_MAX / sizeof(float) / dim) {
        s_set_error(self, "%s: %zu rows of dim %u overflow", what, n, dim);
        return KB_CLIENT_EINVAL;
    }
    if (!values) {
        s_set_error(self, "%s: no values", what);
        return KB_CLIENT_EINVAL;
    }
    return 0;
}

/* After a pass-through call on the single shard: copies its error. */
static int s_passed(kb_cluster_t *self, int rc)
{
    if (rc != 0)
        s_shard_error(self, 0, kb_client_last_error(self->clients[0]));
    return rc;
}

/* ---- tables ----------------------------------------------------------------------------------------- */

/* Builds a one-op request for every shard (all pointing at the same op) and fans it out. */
static int s_to_all(kb_cluster_t *self, Carls__Request *req, Carls__Response__ResultCase want,
                    Carls__Response **resps)
{
    /* Each shard's client fills in its own ids when sending, so every shard gets its own copy. */
    Carls__Request *copies = carls_xmalloc(self->n * sizeof *copies);
    Carls__Request **reqs = carls_xmalloc(self->n * sizeof *reqs);
    for (uint32_t s = 0; s < self->n; s++) {
        copies[s] = *req;
        reqs[s] = &copies[s];
    }
    int rc = s_fanout(self, reqs, want, resps);
    free(reqs);
    free(copies);
    return rc;
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
    s_clear_error(self);
    if (!table || !cfg) {
        s_set_error(self, "create_table: table name and config are required");
        return KB_CLIENT_EINVAL;
    }
    s_forget_table(self, table);
    Carls__CreateTable op = CARLS__CREATE_TABLE__INIT;
    op.config = (Carls__TableConfig *)cfg; /* packing only reads it */
    op.if_not_exists = if_not_exists;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_CREATE_TABLE;
    req.create_table = &op;
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    int rc = s_to_all(self, &req, CARLS__RESPONSE__RESULT_WRITE, resps);
    s_free_responses(self, resps);
    free(resps);
    return rc;
}

int kb_cluster_drop_table(kb_cluster_t *self, const char *table, bool if_exists)
{
    assert(self);
    s_clear_error(self);
    if (!table) {
        s_set_error(self, "drop_table: table name is required");
        return KB_CLIENT_EINVAL;
    }
    s_forget_table(self, table);
    Carls__DropTable op = CARLS__DROP_TABLE__INIT;
    op.if_exists = if_exists;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_DROP_TABLE;
    req.drop_table = &op;
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    int rc = s_to_all(self, &req, CARLS__RESPONSE__RESULT_WRITE, resps);
    s_free_responses(self, resps);
    free(resps);
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
        s_cached_table_t *c = &self->tables[self->n_tables++];
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
    s_clear_error(self);
    *list_out = NULL;
    Carls__ListTables op = CARLS__LIST_TABLES__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.op_case = CARLS__REQUEST__OP_LIST_TABLES;
    req.list_tables = &op;
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    int rc = s_to_all(self, &req, CARLS__RESPONSE__RESULT_TABLE_LIST, resps);
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
    s_free_responses(self, resps);
    free(resps);
    return rc;
}

int kb_cluster_table(kb_cluster_t *self, const char *table, kb_cluster_table_t *out)
{
    assert(self && out);
    s_clear_error(self);
    if (!table || !*table) {
        s_set_error(self, "no table name");
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
    s_set_error(self, "NOT_FOUND: no table named \"%s\"", table);
    return KB_CLIENT_ESTATUS;
}

int kb_cluster_table_config(kb_cluster_t *self, const char *table, Carls__TableConfig **cfg_out)
{
    assert(self && cfg_out);
    *cfg_out = NULL;
    Carls__Response *list = NULL;
    int rc = kb_cluster_list_tables(self, &list);
    if (rc != 0)
        return rc;
    rc = KB_CLIENT_ESTATUS;
    s_set_error(self, "NOT_FOUND: no table named \"%s\"", table);
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
        s_clear_error(self);
        rc = 0;
        break;
    }
    carls__response__free_unpacked(list, NULL);
    return rc;
}

/* ---- rows ------------------------------------------------------------------------------------------- */

int kb_cluster_lookup(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                      float *values_out, kb_row_meta_t *meta_out)
{
    return kb_cluster_lookup_ex(self, table, keys, n, dim, false, values_out, meta_out);
}

int kb_cluster_lookup_ex(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                         bool no_create, float *values_out, kb_row_meta_t *meta_out)
{
    assert(self);
    s_clear_error(self);
    if (self->n == 1)
        return s_passed(self, kb_client_lookup_ex(self->clients[0], table, keys, n, dim, no_create, values_out,
                                                  meta_out));
    int rc = s_row_args(self, "lookup", table, n, dim, values_out);
    if (rc != 0)
        return rc;
    s_split_t sp;
    Carls__Lookup *ops = carls_xcalloc(self->n, sizeof *ops);
    Carls__Request *reqs = carls_xcalloc(self->n, sizeof *reqs);
    Carls__Request **req_p = carls_xcalloc(self->n, sizeof *req_p);
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    rc = s_split(self, "lookup", keys, n, &sp);
    if (rc != 0)
        goto cleanup;
    for (uint32_t s = 0; s < self->n; s++) {
        if (sp.count[s] == 0)
            continue;
        carls__lookup__init(&ops[s]);
        ops[s].n_keys = sp.count[s];
        ops[s].keys = sp.wire + sp.start[s];
        ops[s].no_create = no_create;
        carls__request__init(&reqs[s]);
        reqs[s].table = (char *)table;
        reqs[s].op_case = CARLS__REQUEST__OP_LOOKUP;
        reqs[s].lookup = &ops[s];
        req_p[s] = &reqs[s];
    }
    rc = s_fanout(self, req_p, CARLS__RESPONSE__RESULT_LOOKUP, resps);
    if (rc != 0)
        goto cleanup;
    /* Check every answer before copying any, so a failure leaves the caller's buffers untouched. */
    for (uint32_t s = 0; s < self->n; s++) {
        if (!resps[s])
            continue;
        const Carls__LookupResult *res = resps[s]->lookup;
        size_t c = sp.count[s];
        if (res->dim != dim) {
            s_shard_errorf(self, s, "lookup in %s: the table has dim %u, the caller expected %u", table, res->dim,
                           dim);
            rc = KB_CLIENT_EINVAL;
            goto cleanup;
        }
        if (res->n_values != c * dim) {
            s_shard_errorf(self, s, "lookup in %s: the server sent %zu values for %zu keys of dim %u", table,
                           res->n_values, c, dim);
            rc = KB_CLIENT_EIO;
            goto cleanup;
        }
        if (meta_out && (res->n_versions != c || res->n_updated_at_ms != c || res->n_frequencies != c)) {
            s_shard_errorf(self, s, "lookup in %s: the server sent metadata for %zu/%zu/%zu rows, not %zu", table,
                           res->n_versions, res->n_updated_at_ms, res->n_frequencies, c);
            rc = KB_CLIENT_EIO;
            goto cleanup;
        }
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!resps[s])
            continue;
        const Carls__LookupResult *res = resps[s]->lookup;
        for (size_t j = 0; j < sp.count[s]; j++) {
            size_t i = sp.order[sp.start[s] + j];
            memcpy(values_out + i * dim, res->values + j * dim, dim * sizeof(float));
            if (meta_out) {
                meta_out[i].version = res->versions[j];
                meta_out[i].updated_at_ms = res->updated_at_ms[j];
                meta_out[i].frequency = res->frequencies[j];
            }
        }
    }
cleanup:
    s_free_responses(self, resps);
    free(resps);
    free(req_p);
    free(reqs);
    free(ops);
    s_split_free(&sp);
    return rc;
}

/* put and push_gradients: rows (n * dim floats) split by shard. */
static int s_write_rows(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                        const float *rows, bool gradients, uint64_t version)
{
    const char *what = gradients ? "push_gradients" : "put";
    int rc = s_row_args(self, what, table, n, dim, rows);
    if (rc != 0)
        return rc;
    s_split_t sp;
    float *grouped = NULL;
    Carls__Put *puts = carls_xcalloc(self->n, sizeof *puts);
    Carls__PushGradients *pushes = carls_xcalloc(self->n, sizeof *pushes);
    Carls__Request *reqs = carls_xcalloc(self->n, sizeof *reqs);
    Carls__Request **req_p = carls_xcalloc(self->n, sizeof *req_p);
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    rc = s_split(self, what, keys, n, &sp);
    if (rc != 0)
        goto cleanup;
    /* The rows in shard order, so each shard's request points at one contiguous block. */
    grouped = carls_xmalloc(n * dim * sizeof *grouped);
    for (size_t j = 0; j < n; j++)
        memcpy(grouped + j * dim, rows + sp.order[j] * dim, dim * sizeof(float));
    for (uint32_t s = 0; s < self->n; s++) {
        if (sp.count[s] == 0)
            continue;
        carls__request__init(&reqs[s]);
        reqs[s].table = (char *)table;
        float *block = grouped + sp.start[s] * dim;
        if (gradients) {
            carls__push_gradients__init(&pushes[s]);
            pushes[s].n_keys = sp.count[s];
            pushes[s].keys = sp.wire + sp.start[s];
            pushes[s].n_gradients = sp.count[s] * dim;
            pushes[s].gradients = block;
            reqs[s].op_case = CARLS__REQUEST__OP_PUSH_GRADIENTS;
            reqs[s].push_gradients = &pushes[s];
        } else {
            carls__put__init(&puts[s]);
            puts[s].n_keys = sp.count[s];
            puts[s].keys = sp.wire + sp.start[s];
            puts[s].n_values = sp.count[s] * dim;
            puts[s].values = block;
            puts[s].version = version;
            reqs[s].op_case = CARLS__REQUEST__OP_PUT;
            reqs[s].put = &puts[s];
        }
        req_p[s] = &reqs[s];
    }
    rc = s_fanout(self, req_p, CARLS__RESPONSE__RESULT_WRITE, resps);
cleanup:
    s_free_responses(self, resps);
    free(resps);
    free(req_p);
    free(reqs);
    free(pushes);
    free(puts);
    free(grouped);
    s_split_free(&sp);
    return rc;
}

int kb_cluster_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                   const float *values, uint64_t version)
{
    assert(self);
    s_clear_error(self);
    if (self->n == 1)
        return s_passed(self, kb_client_put(self->clients[0], table, keys, n, dim, values, version));
    return s_write_rows(self, table, keys, n, dim, values, false, version);
}

int kb_cluster_push_gradients(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                              uint32_t dim, const float *gradients)
{
    assert(self);
    s_clear_error(self);
    if (self->n == 1)
        return s_passed(self, kb_client_push_gradients(self->clients[0], table, keys, n, dim, gradients));
    return s_write_rows(self, table, keys, n, dim, gradients, true, 0);
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

/* Checks a knn answer of shard s: nq * k keys and scores, k as asked. 0 or KB_CLIENT_EIO (error set). */
static int s_check_knn(kb_cluster_t *self, uint32_t s, const Carls__KnnResult *res, size_t nq, uint32_t k)
{
    if (res->k != k || res->n_keys != nq * k || res->n_scores != nq * k) {
        s_shard_errorf(self, s, "knn: the server sent k %u with %zu keys and %zu scores for %zu queries of k %u",
                       res->k, res->n_keys, res->n_scores, nq, k);
        return KB_CLIENT_EIO;
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
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_KNN;
    req.knn = &op;
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    s_hit_t *cand = NULL, *chosen = NULL;
    int rc = s_to_all(self, &req, CARLS__RESPONSE__RESULT_KNN, resps);
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
    s_free_responses(self, resps);
    free(resps);
    return rc;
}

/* The single-shard pass-through: one knn request as given, its answer converted. */
static int s_knn_single(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                        const kb_key_t *keys, uint32_t k, bool exclude, kb_knn_result_t **out)
{
    Carls__Knn op = CARLS__KNN__INIT;
    ProtobufCBinaryData *wire = NULL;
    if (keys) {
        wire = carls_xmalloc(nq * sizeof *wire);
        for (size_t i = 0; i < nq; i++) {
            wire[i].data = (uint8_t *)keys[i].data;
            wire[i].len = keys[i].len;
        }
        op.keys = wire;
        op.n_keys = nq;
        op.exclude_query = exclude;
    } else {
        op.vectors = (float *)queries;
        op.n_vectors = nq * dim;
    }
    op.k = k;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_KNN;
    req.knn = &op;
    Carls__Response *resp = NULL;
    Carls__Request *req_p = &req;
    s_hit_t *hits = NULL;
    int rc = s_fanout(self, &req_p, CARLS__RESPONSE__RESULT_KNN, &resp);
    if (rc != 0)
        goto cleanup;
    rc = s_check_knn(self, 0, resp->knn, nq, k);
    if (rc != 0)
        goto cleanup;
    hits = carls_xcalloc(nq * k, sizeof *hits);
    for (size_t i = 0; i < nq * k; i++)
        if (resp->knn->keys[i].len > 0)
            hits[i] = (s_hit_t){&resp->knn->keys[i], resp->knn->scores[i], 0, 0};
    *out = s_knn_result(nq, k, hits);
cleanup:
    free(hits);
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    free(wire);
    return rc;
}

/* Checks k and the table (an embedding table with an index); *info gets its description. */
static int s_knn_args(kb_cluster_t *self, const char *table, size_t nq, uint32_t k, kb_cluster_table_t *info)
{
    if (!table || !*table) {
        s_set_error(self, "knn: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (nq == 0) {
        s_set_error(self, "knn: no queries");
        return KB_CLIENT_EINVAL;
    }
    if (k == 0 || k > S_MAX_K) {
        s_set_error(self, "knn: k must be in 1..%u, got %u", S_MAX_K, k);
        return KB_CLIENT_EINVAL;
    }
    if (nq > SIZE_MAX / S_MAX_K / self->n / sizeof(s_hit_t)) {
        s_set_error(self, "knn: %zu queries are too many", nq);
        return KB_CLIENT_EINVAL;
    }
    if (!info)
        return 0;
    int rc = kb_cluster_table(self, table, info);
    if (rc != 0)
        return rc;
    if (info->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING || !info->has_knn) {
        /* What every shard would answer, so it reads the same as the single-server error. */
        s_set_error(self, "INVALID_ARGUMENT: table '%s' has no nearest-neighbour index (create it with a knn spec)",
                    table);
        return KB_CLIENT_ESTATUS;
    }
    return 0;
}

static bool s_higher_first(Carls__KnnMetric metric) { return metric != CARLS__KNN_METRIC__METRIC_L2; }

int kb_cluster_knn(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                   uint32_t k, kb_knn_result_t **out)
{
    assert(self && out);
    s_clear_error(self);
    *out = NULL;
    if (!queries || dim == 0 || (nq > 0 && SIZE_MAX / dim / sizeof(float) < nq)) {
        s_set_error(self, "knn: no query vectors, or dim 0");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_table_t info;
    int rc = s_knn_args(self, table, nq, k, self->n == 1 ? NULL : &info);
    if (rc != 0)
        return rc;
    if (self->n == 1)
        return s_knn_single(self, table, queries, nq, dim, NULL, k, false, out);
    if (info.dim != dim) {
        s_set_error(self, "knn in %s: the table has dim %u, the caller's queries have %u", table, info.dim, dim);
        return KB_CLIENT_EINVAL;
    }
    return s_knn_merge(self, table, queries, nq, dim, k, k, s_higher_first(info.metric), NULL, out);
}

int kb_cluster_knn_by_key(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t nq, uint32_t k,
                          bool exclude_self, kb_knn_result_t **out)
{
    assert(self && out);
    s_clear_error(self);
    *out = NULL;
    if (!keys) {
        s_set_error(self, "knn: no query keys");
        return KB_CLIENT_EINVAL;
    }
    for (size_t i = 0; i < nq; i++) {
        if (keys[i].len == 0 || !keys[i].data) {
            s_set_error(self, "knn: query key %zu is empty", i);
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
        uint32_t k_ask = exclude_self && k < S_MAX_K ? k + 1 : k;
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
        s_shard_errorf(self, s, "sample: the server sent %zu keys, %zu probabilities and %zu flags for %zu "
                       "positives and %u candidates", res->n_keys, res->n_probabilities, res->n_is_positive,
                       n_pos, n);
        return KB_CLIENT_EIO;
    }
    if (!isfinite(res->mass) || res->mass < 0) {
        s_shard_errorf(self, s, "sample: the server sent mass %g", res->mass);
        return KB_CLIENT_EIO;
    }
    for (size_t i = 0; i < res->n_keys; i++) {
        float p = res->probabilities[i];
        if (res->is_positive[i] != (i < n_pos) || !(p >= 0.0f && p <= 1.0f) || (i >= n_pos && res->keys[i].len == 0)) {
            s_shard_errorf(self, s, "sample: entry %zu of the answer is malformed (probability %g, %s)", i,
                           (double)p, res->is_positive[i] ? "positive" : "candidate");
            return KB_CLIENT_EIO;
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

/* Sends one Sample request per shard: positives of that shard (grouped per sp; sp may be NULL for none),
 * counts[s] candidates (NULL: 0 each), shards with nothing to do skipped unless ask_all. Shard s draws with
 * s_shard_seed(seed, s), or with seed itself when raw_seed (the single-shard pass-through). */
static int s_sample_round(kb_cluster_t *self, const char *table, const s_split_t *sp, const uint32_t *counts,
                          bool ask_all, Carls__SampleStrategy strategy, uint64_t seed, bool raw_seed,
                          Carls__Response **resps)
{
    Carls__Sample *ops = carls_xcalloc(self->n, sizeof *ops);
    Carls__Request *reqs = carls_xcalloc(self->n, sizeof *reqs);
    Carls__Request **req_p = carls_xcalloc(self->n, sizeof *req_p);
    for (uint32_t s = 0; s < self->n; s++) {
        size_t np = sp ? sp->count[s] : 0;
        uint32_t nc = counts ? counts[s] : 0;
        if (!ask_all && np == 0 && nc == 0)
            continue;
        carls__sample__init(&ops[s]);
        ops[s].n_positives = np;
        ops[s].positives = np ? sp->wire + sp->start[s] : NULL;
        ops[s].n = nc;
        ops[s].strategy = strategy;
        ops[s].seed = raw_seed ? seed : s_shard_seed(seed, s);
        carls__request__init(&reqs[s]);
        reqs[s].table = (char *)table;
        reqs[s].op_case = CARLS__REQUEST__OP_SAMPLE;
        reqs[s].sample = &ops[s];
        req_p[s] = &reqs[s];
    }
    int rc = s_fanout(self, req_p, CARLS__RESPONSE__RESULT_SAMPLE, resps);
    for (uint32_t s = 0; rc == 0 && s < self->n; s++)
        if (resps[s])
            rc = s_check_sample(self, s, resps[s]->sample, ops[s].n_positives, ops[s].n);
    if (rc != 0)
        s_free_responses(self, resps);
    free(req_p);
    free(reqs);
    free(ops);
    return rc;
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

int kb_cluster_sample(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                      uint32_t n, Carls__SampleStrategy strategy, uint64_t seed, kb_sample_result_t **out)
{
    assert(self && out);
    s_clear_error(self);
    *out = NULL;
    if (!table || !*table) {
        s_set_error(self, "sample: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM && strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM &&
        strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM) {
        s_set_error(self, "sample: unknown strategy %d", (int)strategy);
        return KB_CLIENT_EINVAL;
    }
    if (n_positives > 0 && !positives) {
        s_set_error(self, "sample: no positive keys");
        return KB_CLIENT_EINVAL;
    }
    /* One shard: the server picks a seed for 0 itself. Several: the split needs one here. */
    while (seed == 0 && self->n > 1) {
        if (carls_random_bytes(&seed, sizeof seed) != 0) {
            s_set_error(self, "sample: cannot read random bytes for a seed");
            return KB_CLIENT_EIO;
        }
    }
    s_split_t sp;
    memset(&sp, 0, sizeof sp);
    Carls__Response **round1 = carls_xcalloc(self->n, sizeof *round1);
    Carls__Response **round2 = carls_xcalloc(self->n, sizeof *round2);
    uint32_t *counts = carls_xcalloc(self->n, sizeof *counts);
    size_t *next_pos = carls_xcalloc(self->n, sizeof *next_pos);
    kb_sample_result_t *r = NULL;
    int rc = 0;
    if (n_positives > 0) {
        rc = s_split(self, "sample", positives, n_positives, &sp);
        if (rc != 0)
            goto cleanup;
    }

    if (self->n == 1) {
        /* Pass-through: one request with everything, the answer as it is (scale 1). */
        counts[0] = n;
        rc = s_sample_round(self, table, n_positives ? &sp : NULL, counts, true, strategy, seed, true, round1);
        if (rc != 0)
            goto cleanup;
        const Carls__SampleResult *res = round1[0]->sample;
        size_t total = 0;
        for (size_t i = 0; i < res->n_keys; i++)
            total += res->keys[i].len;
        r = s_sample_alloc(res->n_keys, total);
        size_t off = 0;
        for (size_t i = 0; i < res->n_keys; i++)
            s_sample_add(r, &off, res->keys[i].data, res->keys[i].len, res->probabilities[i], res->is_positive[i]);
        r->n_positives = n_positives;
        r->mass = res->mass;
        r->rows = res->rows;
        *out = r;
        goto cleanup;
    }

    /* Round 1: every shard's mass, and the probabilities of the positives it owns. */
    rc = s_sample_round(self, table, n_positives ? &sp : NULL, NULL, true, strategy, seed, false, round1);
    if (rc != 0)
        goto cleanup;
    double total = 0;
    uint64_t rows = 0;
    for (uint32_t s = 0; s < self->n; s++) {
        total += round1[s]->sample->mass;
        rows += round1[s]->sample->rows;
    }
    if (n > 0 && !(total > 0)) {
        /* What a single server answers when it has nothing to draw from. */
        s_set_error(self, "NOT_FOUND: table '%s' has no rows that strategy can draw", table);
        rc = KB_CLIENT_ESTATUS;
        goto cleanup;
    }
    /* The multinomial split of n by mass (shards with no mass get no draws). */
    if (n > 0) {
        uint64_t st = seed;
        for (uint32_t d = 0; d < n; d++) {
            double u = carls_unit_double(&st) * total, acc = 0;
            uint32_t pick = self->n; /* rounding may leave u >= the last sum: the last shard with mass */
            for (uint32_t s = 0; s < self->n; s++) {
                acc += round1[s]->sample->mass;
                if (round1[s]->sample->mass > 0 && u < acc) {
                    pick = s;
                    break;
                }
            }
            if (pick == self->n)
                for (uint32_t s = 0; s < self->n; s++)
                    if (round1[s]->sample->mass > 0)
                        pick = s;
            counts[pick]++;
        }
        /* Round 2: each shard draws its share. */
        rc = s_sample_round(self, table, NULL, counts, false, strategy, seed, false, round2);
        if (rc != 0)
            goto cleanup;
    }

    size_t entries = n_positives, key_total = 0;
    for (size_t i = 0; i < n_positives; i++)
        key_total += positives[i].len;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!round2[s])
            continue;
        const Carls__SampleResult *res = round2[s]->sample;
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
        const Carls__SampleResult *res = round1[s]->sample;
        double p = total > 0 ? res->probabilities[next_pos[s]++] * (res->mass / total) : 0.0;
        s_sample_add(r, &off, positives[i].data, positives[i].len, p, true);
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!round2[s])
            continue;
        /* The shard's own mass in this answer: its probabilities are relative to it. */
        const Carls__SampleResult *res = round2[s]->sample;
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
    s_free_responses(self, round1);
    s_free_responses(self, round2);
    free(round1);
    free(round2);
    free(counts);
    free(next_pos);
    s_split_free(&sp);
    return rc;
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

int kb_cluster_feature_get(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           kb_feature_result_t **out)
{
    assert(self && out);
    s_clear_error(self);
    *out = NULL;
    if (!table || !*table) {
        s_set_error(self, "feature_get: no table name");
        return KB_CLIENT_EINVAL;
    }
    s_split_t sp;
    Carls__FeatureGet *ops = carls_xcalloc(self->n, sizeof *ops);
    Carls__Request *reqs = carls_xcalloc(self->n, sizeof *reqs);
    Carls__Request **req_p = carls_xcalloc(self->n, sizeof *req_p);
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    int rc = s_split(self, "feature_get", keys, n, &sp);
    if (rc != 0)
        goto cleanup;
    for (uint32_t s = 0; s < self->n; s++) {
        if (sp.count[s] == 0)
            continue;
        carls__feature_get__init(&ops[s]);
        ops[s].n_keys = sp.count[s];
        ops[s].keys = sp.wire + sp.start[s];
        carls__request__init(&reqs[s]);
        reqs[s].table = (char *)table;
        reqs[s].op_case = CARLS__REQUEST__OP_FEATURE_GET;
        reqs[s].feature_get = &ops[s];
        req_p[s] = &reqs[s];
    }
    rc = s_fanout(self, req_p, CARLS__RESPONSE__RESULT_FEATURES, resps);
    if (rc != 0)
        goto cleanup;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!resps[s])
            continue;
        const Carls__FeatureResult *res = resps[s]->features;
        bool ok = res->n_records == sp.count[s];
        for (size_t j = 0; ok && j < res->n_records; j++)
            ok = res->records[j] != NULL;
        if (!ok) {
            s_shard_errorf(self, s, "feature_get: the server sent %zu records for %zu keys", res->n_records,
                           sp.count[s]);
            rc = KB_CLIENT_EIO;
            goto cleanup;
        }
    }
    kb_feature_result_t *r = carls_xcalloc(1, sizeof *r);
    r->n = n;
    r->records = carls_xcalloc(n, sizeof *r->records);
    r->responses = carls_xcalloc(self->n, sizeof *r->responses);
    r->n_responses = self->n;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!resps[s])
            continue;
        for (size_t j = 0; j < sp.count[s]; j++)
            r->records[sp.order[sp.start[s] + j]] = resps[s]->features->records[j];
        r->responses[s] = resps[s];
        resps[s] = NULL;
    }
    *out = r;
cleanup:
    s_free_responses(self, resps);
    free(resps);
    free(req_p);
    free(reqs);
    free(ops);
    s_split_free(&sp);
    return rc;
}

int kb_cluster_feature_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           const Carls__FeatureRecord *const *records)
{
    assert(self);
    s_clear_error(self);
    if (!table || !*table) {
        s_set_error(self, "feature_put: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (!records) {
        s_set_error(self, "feature_put: no records");
        return KB_CLIENT_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!records[i]) {
            s_set_error(self, "feature_put: record %zu is missing", i);
            return KB_CLIENT_EINVAL;
        }
    }
    s_split_t sp;
    Carls__FeatureRecord **grouped = NULL;
    Carls__FeaturePut *ops = carls_xcalloc(self->n, sizeof *ops);
    Carls__Request *reqs = carls_xcalloc(self->n, sizeof *reqs);
    Carls__Request **req_p = carls_xcalloc(self->n, sizeof *req_p);
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    int rc = s_split(self, "feature_put", keys, n, &sp);
    if (rc != 0)
        goto cleanup;
    grouped = carls_xmalloc(n * sizeof *grouped);
    for (size_t j = 0; j < n; j++)
        grouped[j] = (Carls__FeatureRecord *)records[sp.order[j]]; /* packing only reads them */
    for (uint32_t s = 0; s < self->n; s++) {
        if (sp.count[s] == 0)
            continue;
        carls__feature_put__init(&ops[s]);
        ops[s].n_keys = sp.count[s];
        ops[s].keys = sp.wire + sp.start[s];
        ops[s].n_records = sp.count[s];
        ops[s].records = grouped + sp.start[s];
        carls__request__init(&reqs[s]);
        reqs[s].table = (char *)table;
        reqs[s].op_case = CARLS__REQUEST__OP_FEATURE_PUT;
        reqs[s].feature_put = &ops[s];
        req_p[s] = &reqs[s];
    }
    rc = s_fanout(self, req_p, CARLS__RESPONSE__RESULT_WRITE, resps);
cleanup:
    s_free_responses(self, resps);
    free(resps);
    free(req_p);
    free(reqs);
    free(ops);
    free(grouped);
    s_split_free(&sp);
    return rc;
}

/* ---- per shard -------------------------------------------------------------------------------------- */

int kb_cluster_stats(kb_cluster_t *self, uint32_t shard, const char *table, Carls__Response **stats_out)
{
    assert(self && stats_out && shard < self->n);
    s_clear_error(self);
    int rc = kb_client_stats(self->clients[shard], table, stats_out);
    if (rc != 0)
        s_shard_error(self, shard, kb_client_last_error(self->clients[shard]));
    return rc;
}

int kb_cluster_checkpoint(kb_cluster_t *self, Carls__CheckpointResult *per_shard_out)
{
    assert(self);
    s_clear_error(self);
    Carls__Checkpoint op = CARLS__CHECKPOINT__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.op_case = CARLS__REQUEST__OP_CHECKPOINT;
    req.checkpoint = &op;
    Carls__Response **resps = carls_xcalloc(self->n, sizeof *resps);
    int rc = s_to_all(self, &req, CARLS__RESPONSE__RESULT_CHECKPOINT, resps);
    if (rc == 0 && per_shard_out) {
        for (uint32_t s = 0; s < self->n; s++) {
            carls__checkpoint_result__init(&per_shard_out[s]);
            per_shard_out[s].committed_epoch = resps[s]->checkpoint->committed_epoch;
            per_shard_out[s].rows = resps[s]->checkpoint->rows;
        }
    }
    s_free_responses(self, resps);
    free(resps);
    return rc;
}

int kb_cluster_scan(kb_cluster_t *self, uint32_t shard, const char *table, int64_t after_row_id, uint32_t limit,
                    Carls__Response **page_out)
{
    assert(self && page_out && shard < self->n);
    s_clear_error(self);
    *page_out = NULL;
    if (!table || !*table) {
        s_set_error(self, "scan: no table name");
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
    int rc = kb_client_call(self->clients[shard], &req, &resp);
    if (rc == 0 && resp->result_case != CARLS__RESPONSE__RESULT_SCAN) {
        s_shard_errorf(self, shard, "the answer to scan carries the wrong result (case %d)", (int)resp->result_case);
        rc = KB_CLIENT_EIO;
    } else if (rc != 0) {
        s_shard_error(self, shard, kb_client_last_error(self->clients[shard]));
    }
    if (rc != 0)
        goto fail;
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
    if (!ok || (limit > 0 && n > limit)) {
        s_shard_errorf(self, shard, "scan of %s: inconsistent page (%zu keys, %zu row ids, %zu versions, %zu "
                       "frequencies, dim %u with %zu values, %zu records)", table, n, r->n_row_ids, r->n_versions,
                       r->n_frequencies, r->dim, r->n_values, r->n_records);
        rc = KB_CLIENT_EIO;
        goto fail;
    }
    *page_out = resp;
    return 0;
fail:
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    return rc;
}
