/* Fake kb-server for the client tests (see fake_kb_server.h). One thread owns the ROUTER socket; the test
 * thread talks to it only through the mutex-protected fields below. */
#include "fake_kb_server.h"

#include "protocol.h"
#include "test_proto.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define S_MAX_TABLES 16

typedef struct {
    char name[CARLS_MAX_TABLE_NAME_BYTES + 1];
    uint32_t dim;
    uint64_t rows;
} s_table_t;

typedef struct {
    uint8_t *data;
    size_t len;
} s_frame_t;

/* A reply held back (FAKE_REVERSE_PAIRS): the peer's routing id and the packed answer. */
typedef struct {
    s_frame_t peer;
    s_frame_t reply;
} s_held_t;

struct fake_kb_server {
    void *ctx;
    void *sock;                /* ROUTER, used by the thread only after start */
    char endpoint[128];
    pthread_t thread;
    atomic_bool stop;

    pthread_mutex_t mu;        /* guards everything below */
    fake_mode_t mode;
    Carls__StatusCode status;  /* FAKE_STATUS */
    char status_text[256];
    char primary[256];         /* FAKE_STATUS: Response.primary ("" for none) */
    uint64_t term;             /* Response.term of every answer */
    s_table_t tables[S_MAX_TABLES];
    size_t n_tables;
    s_frame_t *log;            /* every frame received */
    size_t n_log, cap_log;
    uint64_t *seen_ids;        /* request ids seen (FAKE_IGNORE_FIRST) */
    size_t n_seen, cap_seen;
    s_held_t held;             /* FAKE_REVERSE_PAIRS: the first of a pair; held.reply.data NULL if none */
    kb_auth_t *auth;           /* the ZAP handler of a CURVE fake; NULL otherwise */
};

float fake_kb_value(const void *key, size_t key_len, uint32_t j)
{
    uint64_t h = carls_hash64(key, key_len, 1234 + j);
    /* A value in (-8, 8) with 23 significant bits in use, so printing must keep every digit. */
    return (float)((double)(h >> 40) / (double)(1u << 20) - 8.0);
}

static s_frame_t s_frame_copy(const void *data, size_t len)
{
    s_frame_t f = {carls_xmalloc(len ? len : 1), len};
    if (len)
        memcpy(f.data, data, len);
    return f;
}

static s_table_t *s_find_table(fake_kb_server_t *self, const char *name)
{
    for (size_t i = 0; i < self->n_tables; i++)
        if (strcmp(self->tables[i].name, name) == 0)
            return &self->tables[i];
    return NULL;
}

static void s_add_table_locked(fake_kb_server_t *self, const char *name, uint32_t dim, uint64_t rows)
{
    s_table_t *t = s_find_table(self, name);
    if (!t) {
        if (self->n_tables == S_MAX_TABLES)
            abort();
        t = &self->tables[self->n_tables++];
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dim = dim;
    t->rows = rows;
}

/* Packs resp into a fresh frame. */
static s_frame_t s_pack(const Carls__Response *resp)
{
    s_frame_t f;
    f.len = protobuf_c_message_get_packed_size(&resp->base);
    f.data = carls_xmalloc(f.len ? f.len : 1);
    protobuf_c_message_pack(&resp->base, f.data);
    return f;
}

/* Builds the answer a server would give (with this mode's distortions) to req. */
static s_frame_t s_answer(fake_kb_server_t *self, const Carls__Request *req)
{
    Carls__Response resp = CARLS__RESPONSE__INIT;
    resp.protocol_version = self->mode == FAKE_WRONG_VERSION ? 99 : CARLS_PROTOCOL_VERSION;
    resp.request_id = req->request_id;
    resp.term = self->term;
    if (self->mode == FAKE_STATUS) {
        resp.status = self->status;
        resp.error = self->status_text;
        resp.primary = self->primary;
        return s_pack(&resp);
    }

    Carls__WriteResult write = CARLS__WRITE_RESULT__INIT;
    Carls__TableList list = CARLS__TABLE_LIST__INIT;
    Carls__TableInfo infos[S_MAX_TABLES], *info_ptrs[S_MAX_TABLES];
    test_table_config_t cfgs[S_MAX_TABLES];
    Carls__LookupResult look = CARLS__LOOKUP_RESULT__INIT;
    Carls__StatsResult stats = CARLS__STATS_RESULT__INIT;
    Carls__TableStats tstats[S_MAX_TABLES], *tstat_ptrs[S_MAX_TABLES];
    Carls__LatencySummary lat = CARLS__LATENCY_SUMMARY__INIT, *lat_ptr = &lat;
    Carls__CheckpointResult ckpt = CARLS__CHECKPOINT_RESULT__INIT;
    float *values = NULL;
    uint64_t *versions = NULL, *freqs = NULL;
    int64_t *updated = NULL;

    const s_table_t *table = req->table ? s_find_table(self, req->table) : NULL;
    switch (req->op_case) {
    case CARLS__REQUEST__OP_CREATE_TABLE:
        s_add_table_locked(self, req->table, req->create_table->config ? req->create_table->config->dim : 0, 0);
        resp.result_case = CARLS__RESPONSE__RESULT_WRITE;
        resp.write = &write;
        break;
    case CARLS__REQUEST__OP_DROP_TABLE:
        if (table) {
            size_t i = (size_t)(table - self->tables);
            self->tables[i] = self->tables[--self->n_tables];
        }
        resp.result_case = CARLS__RESPONSE__RESULT_WRITE;
        resp.write = &write;
        break;
    case CARLS__REQUEST__OP_PUT:
        write.rows = (uint32_t)req->put->n_keys;
        resp.result_case = CARLS__RESPONSE__RESULT_WRITE;
        resp.write = &write;
        break;
    case CARLS__REQUEST__OP_PUSH_GRADIENTS:
        write.rows = (uint32_t)req->push_gradients->n_keys;
        resp.result_case = CARLS__RESPONSE__RESULT_WRITE;
        resp.write = &write;
        break;
    case CARLS__REQUEST__OP_LIST_TABLES:
        for (size_t i = 0; i < self->n_tables; i++) {
            carls__table_info__init(&infos[i]);
            bool odd = i % 2; /* odd tables: Adam, immediate updates; even ones: SGD, lazy */
            infos[i].name = self->tables[i].name;
            infos[i].config = test_embedding_table_config(
                &cfgs[i], self->tables[i].dim, CARLS__INIT_KIND__INIT_ZEROS, 0,
                odd ? CARLS__OPTIMIZER_KIND__OPT_ADAM : CARLS__OPTIMIZER_KIND__OPT_SGD, 0.01f,
                odd ? CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE : CARLS__UPDATE_POLICY__UPDATE_LAZY);
            infos[i].rows = self->tables[i].rows;
            info_ptrs[i] = &infos[i];
        }
        list.n_tables = self->n_tables;
        list.tables = info_ptrs;
        resp.result_case = CARLS__RESPONSE__RESULT_TABLE_LIST;
        resp.table_list = &list;
        break;
    case CARLS__REQUEST__OP_LOOKUP: {
        if (!table) {
            resp.status = CARLS__STATUS_CODE__STATUS_NOT_FOUND;
            resp.error = "no such table";
            break;
        }
        size_t n = req->lookup->n_keys;
        uint32_t dim = table->dim + (self->mode == FAKE_LOOKUP_BAD_DIM ? 1 : 0);
        size_t nv = n * dim;
        if (self->mode == FAKE_LOOKUP_EXTRA)
            nv++;
        if (self->mode == FAKE_LOOKUP_SHORT)
            nv--;
        size_t nm = (self->mode == FAKE_LOOKUP_BAD_META) ? n - 1 : n;
        values = carls_xcalloc(nv + 1, sizeof *values);
        versions = carls_xcalloc(n, sizeof *versions);
        updated = carls_xcalloc(n, sizeof *updated);
        freqs = carls_xcalloc(n, sizeof *freqs);
        for (size_t i = 0; i < nv; i++)
            values[i] = fake_kb_value(req->lookup->keys[i / dim < n ? i / dim : n - 1].data,
                                      req->lookup->keys[i / dim < n ? i / dim : n - 1].len, (uint32_t)(i % dim));
        for (size_t i = 0; i < n; i++) {
            versions[i] = 7;
            updated[i] = 1000 + (int64_t)i;
            freqs[i] = i + 1;
        }
        look.dim = dim;
        look.n_values = nv;
        look.values = values;
        look.n_versions = look.n_updated_at_ms = look.n_frequencies = nm;
        look.versions = versions;
        look.updated_at_ms = updated;
        look.frequencies = freqs;
        resp.result_case = CARLS__RESPONSE__RESULT_LOOKUP;
        resp.lookup = &look;
        break;
    }
    case CARLS__REQUEST__OP_STATS: {
        size_t k = 0;
        for (size_t i = 0; i < self->n_tables; i++) {
            if (req->table && *req->table && strcmp(req->table, self->tables[i].name) != 0)
                continue;
            carls__table_stats__init(&tstats[k]);
            tstats[k].name = self->tables[i].name;
            tstats[k].dim = self->tables[i].dim;
            tstats[k].rows = self->tables[i].rows;
            tstats[k].outliers_dropped = 3;
            tstat_ptrs[k] = &tstats[k];
            k++;
        }
        stats.n_tables = k;
        stats.tables = tstat_ptrs;
        stats.requests = 77;
        stats.durability = "sync";
        lat.op = "lookup";
        lat.count = 5;
        lat.p50_us = 12.5;
        lat.p99_us = 99.25;
        lat.max_us = 120;
        stats.n_latency = 1;
        stats.latency = &lat_ptr;
        resp.result_case = CARLS__RESPONSE__RESULT_STATS;
        resp.stats = &stats;
        break;
    }
    case CARLS__REQUEST__OP_CHECKPOINT:
        ckpt.committed_epoch = 42;
        ckpt.rows = 5;
        resp.result_case = CARLS__RESPONSE__RESULT_CHECKPOINT;
        resp.checkpoint = &ckpt;
        break;
    default:
        resp.status = CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED;
        resp.error = "unknown operation";
        break;
    }
    s_frame_t f = s_pack(&resp);
    free(values);
    free(versions);
    free(updated);
    free(freqs);
    return f;
}

static void s_send(void *sock, const s_frame_t *peer, const s_frame_t *reply)
{
    zmq_send(sock, peer->data, peer->len, ZMQ_SNDMORE);
    zmq_send(sock, reply->data, reply->len, 0);
}

/* Handles one received [peer, payload] message. Called with the mutex held. */
static void s_handle(fake_kb_server_t *self, const s_frame_t *peer, const uint8_t *data, size_t len)
{
    if (self->n_log == self->cap_log) {
        self->cap_log = self->cap_log ? self->cap_log * 2 : 64;
        self->log = carls_xrealloc(self->log, self->cap_log * sizeof *self->log);
    }
    self->log[self->n_log++] = s_frame_copy(data, len);

    Carls__Request *req = carls__request__unpack(NULL, len, data);
    if (!req || self->mode == FAKE_SILENT)
        goto done;
    if (self->mode == FAKE_IGNORE_FIRST) {
        bool seen = false;
        for (size_t i = 0; i < self->n_seen; i++)
            seen = seen || self->seen_ids[i] == req->request_id;
        if (!seen) {
            if (self->n_seen == self->cap_seen) {
                self->cap_seen = self->cap_seen ? self->cap_seen * 2 : 64;
                self->seen_ids = carls_xrealloc(self->seen_ids, self->cap_seen * sizeof *self->seen_ids);
            }
            self->seen_ids[self->n_seen++] = req->request_id;
            goto done;
        }
    }
    if (self->mode == FAKE_GARBAGE) {
        /* Field 2 as a length-delimited field claiming 100 bytes that are not there: unpack must fail. */
        static const uint8_t garbage[] = {0x12, 0x64, 0x01, 0x02, 0x03};
        s_frame_t g = {(uint8_t *)garbage, sizeof garbage};
        s_send(self->sock, peer, &g);
        goto done;
    }
    s_frame_t reply = s_answer(self, req);
    if (self->mode == FAKE_REVERSE_PAIRS) {
        if (!self->held.reply.data) {
            self->held.peer = s_frame_copy(peer->data, peer->len);
            self->held.reply = reply;
            goto done;
        }
        s_send(self->sock, peer, &reply);
        s_send(self->sock, &self->held.peer, &self->held.reply);
        free(self->held.peer.data);
        free(self->held.reply.data);
        self->held.peer.data = self->held.reply.data = NULL;
        free(reply.data);
        goto done;
    }
    s_send(self->sock, peer, &reply);
    if (self->mode == FAKE_DUPLICATE)
        s_send(self->sock, peer, &reply);
    free(reply.data);
done:
    if (req)
        carls__request__free_unpacked(req, NULL);
}

static void *s_thread(void *arg)
{
    fake_kb_server_t *self = arg;
    while (!atomic_load(&self->stop)) {
        zmq_pollitem_t item = {.socket = self->sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 20) <= 0)
            continue;
        zmq_msg_t peer, payload;
        zmq_msg_init(&peer);
        zmq_msg_init(&payload);
        if (zmq_msg_recv(&peer, self->sock, 0) >= 0 && zmq_msg_more(&peer) &&
            zmq_msg_recv(&payload, self->sock, 0) >= 0) {
            /* Anything after the payload frame is not part of the protocol: drain it. */
            while (zmq_msg_more(&payload)) {
                zmq_msg_t extra;
                zmq_msg_init(&extra);
                zmq_msg_recv(&extra, self->sock, 0);
                bool more = zmq_msg_more(&extra);
                zmq_msg_close(&extra);
                if (!more)
                    break;
            }
            s_frame_t p = {zmq_msg_data(&peer), zmq_msg_size(&peer)};
            pthread_mutex_lock(&self->mu);
            s_handle(self, &p, zmq_msg_data(&payload), zmq_msg_size(&payload));
            pthread_mutex_unlock(&self->mu);
        }
        zmq_msg_close(&peer);
        zmq_msg_close(&payload);
    }
    return NULL;
}

/* A fake on tcp://127.0.0.1:*; with server keys, a CURVE server that admits only allowed_client. */
static fake_kb_server_t *s_new(const kb_auth_keypair_t *server, const kb_auth_key_t *allowed_client)
{
    fake_kb_server_t *self = carls_xcalloc(1, sizeof *self);
    pthread_mutex_init(&self->mu, NULL);
    self->mode = FAKE_ANSWER;
    self->ctx = zmq_ctx_new();
    self->sock = self->ctx ? zmq_socket(self->ctx, ZMQ_ROUTER) : NULL;
    int linger = 0;
    size_t len = sizeof self->endpoint;
    if (server) {
        /* The ZAP handler first, then the socket's CURVE server role, both before the bind. */
        char err[256];
        kb_auth_allow_t *allow = kb_auth_allow_new();
        kb_auth_allow_add(allow, allowed_client);
        self->auth = kb_auth_new(self->ctx, &allow, err, sizeof err);
        if (!self->auth || !self->sock || kb_auth_setup_server(self->sock, server, self->auth, err, sizeof err) != 0) {
            fprintf(stderr, "fake_kb_server: cannot set up CURVE: %s\n", err);
            abort();
        }
    }
    if (!self->sock || zmq_setsockopt(self->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(self->sock, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(self->sock, ZMQ_LAST_ENDPOINT, self->endpoint, &len) != 0) {
        fprintf(stderr, "fake_kb_server: cannot bind: %s\n", zmq_strerror(zmq_errno()));
        abort();
    }
    atomic_init(&self->stop, false);
    if (pthread_create(&self->thread, NULL, s_thread, self) != 0)
        abort();
    return self;
}

fake_kb_server_t *fake_kb_server_new(void) { return s_new(NULL, NULL); }

fake_kb_server_t *fake_kb_server_new_curve(const kb_auth_keypair_t *server, const kb_auth_key_t *allowed_client)
{
    return s_new(server, allowed_client);
}

void fake_kb_server_destroy(fake_kb_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    fake_kb_server_t *self = *self_p;
    atomic_store(&self->stop, true);
    pthread_join(self->thread, NULL);
    zmq_close(self->sock);
    kb_auth_destroy(&self->auth);
    zmq_ctx_term(self->ctx);
    for (size_t i = 0; i < self->n_log; i++)
        free(self->log[i].data);
    free(self->log);
    free(self->seen_ids);
    free(self->held.peer.data);
    free(self->held.reply.data);
    pthread_mutex_destroy(&self->mu);
    free(self);
    *self_p = NULL;
}

const char *fake_kb_server_endpoint(const fake_kb_server_t *self) { return self->endpoint; }

void fake_kb_server_set_mode(fake_kb_server_t *self, fake_mode_t mode)
{
    pthread_mutex_lock(&self->mu);
    self->mode = mode;
    pthread_mutex_unlock(&self->mu);
}

void fake_kb_server_set_status(fake_kb_server_t *self, Carls__StatusCode status, const char *text)
{
    pthread_mutex_lock(&self->mu);
    self->mode = FAKE_STATUS;
    self->status = status;
    snprintf(self->status_text, sizeof self->status_text, "%s", text);
    self->primary[0] = '\0';
    pthread_mutex_unlock(&self->mu);
}

void fake_kb_server_set_not_primary(fake_kb_server_t *self, const char *primary)
{
    fake_kb_server_set_status(self, CARLS__STATUS_CODE__STATUS_NOT_PRIMARY, "this member is not the primary");
    pthread_mutex_lock(&self->mu);
    snprintf(self->primary, sizeof self->primary, "%s", primary ? primary : "");
    pthread_mutex_unlock(&self->mu);
}

void fake_kb_server_set_term(fake_kb_server_t *self, uint64_t term)
{
    pthread_mutex_lock(&self->mu);
    self->term = term;
    pthread_mutex_unlock(&self->mu);
}

void fake_kb_server_add_table(fake_kb_server_t *self, const char *name, uint32_t dim, uint64_t rows)
{
    pthread_mutex_lock(&self->mu);
    s_add_table_locked(self, name, dim, rows);
    pthread_mutex_unlock(&self->mu);
}

size_t fake_kb_server_count(fake_kb_server_t *self)
{
    pthread_mutex_lock(&self->mu);
    size_t n = self->n_log;
    pthread_mutex_unlock(&self->mu);
    return n;
}

size_t fake_kb_server_wait_count(fake_kb_server_t *self, size_t n, int timeout_ms)
{
    int64_t deadline = carls_monotonic_ms() + timeout_ms;
    size_t got;
    while ((got = fake_kb_server_count(self)) < n && carls_monotonic_ms() < deadline) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return got;
}

Carls__Request *fake_kb_server_request(fake_kb_server_t *self, size_t i)
{
    pthread_mutex_lock(&self->mu);
    Carls__Request *req = i < self->n_log ? carls__request__unpack(NULL, self->log[i].len, self->log[i].data) : NULL;
    pthread_mutex_unlock(&self->mu);
    return req;
}

size_t fake_kb_server_request_bytes(fake_kb_server_t *self, size_t i, uint8_t *buf, size_t cap)
{
    pthread_mutex_lock(&self->mu);
    size_t len = 0;
    if (i < self->n_log) {
        len = self->log[i].len;
        memcpy(buf, self->log[i].data, len < cap ? len : cap);
    }
    pthread_mutex_unlock(&self->mu);
    return len;
}
