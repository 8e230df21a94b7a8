/* Client library for kb-server: the transport (contract in kb_client.h; requests are built by kb_cluster.c).
 *
 * State: one ZeroMQ context and one DEALER socket per client, plus a table of requests in flight. Each entry
 * keeps the packed bytes that were sent, so a resend after a timeout is byte-for-byte the same request
 * (same request id, client id and sequence: the server's duplicate filter depends on it), and a slot for an
 * answer that arrived while the caller was waiting for another request.
 *
 * Answers are matched by request_id only. An answer whose id is not in flight (a late duplicate after a
 * resend, or an answer to a request whose wait already gave up) is dropped. A frame that does not decode
 * cannot be attributed to any request, so it fails the wait that received it with KB_CLIENT_EMALFORMED.
 *
 * A kb_client_wait call always ends its request: whatever it returns (except KB_CLIENT_EINVAL for an id
 * that is not in flight), the id is no longer in flight afterwards. */
#include "kb_client.h"

#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define S_DEFAULT_TIMEOUT_MS 5000

/* One request in flight. */
typedef struct {
    uint64_t id;              /* request_id */
    uint8_t *packed;          /* the packed Request, resent as is */
    size_t packed_len;
    Carls__Response *answer;  /* decoded answer that arrived before anyone waited for it; NULL if none */
} s_inflight_t;

struct kb_client {
    char *endpoint;           /* what we connect to (again after a timeout) */
    void *ctx;                /* ZeroMQ context owned by this client */
    void *sock;               /* DEALER socket; replaced after each timeout */
    int timeout_ms;           /* per attempt */
    int retries;              /* extra attempts after a timeout */
    uint64_t client_id;       /* nonzero, sent with writes */
    uint64_t next_request_id; /* next request_id to hand out (starts at 1) */
    uint64_t next_sequence;   /* next write sequence number (starts at 1) */
    s_inflight_t *inflight;   /* requests sent and not yet waited for */
    size_t n_inflight, cap_inflight;
    bool use_curve;           /* apply `curve` to every socket opened */
    kb_client_curve_t curve;  /* copied from the options; wiped on destroy */
    char last_error[512];     /* "" after success */
    Carls__StatusCode last_status; /* the server's status in the last failed answer; OK otherwise */
};

static void s_set_error(kb_client_t *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void s_set_error(kb_client_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->last_error, sizeof self->last_error, fmt, ap);
    va_end(ap);
}

static void s_clear_error(kb_client_t *self)
{
    self->last_error[0] = '\0';
    self->last_status = CARLS__STATUS_CODE__STATUS_OK;
}

/* Opens a fresh DEALER socket connected to self->endpoint into self->sock. 0 or -1 (error set). */
static int s_open_socket(kb_client_t *self)
{
    assert(!self->sock);
    void *sock = zmq_socket(self->ctx, ZMQ_DEALER);
    if (!sock) {
        s_set_error(self, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    /* Linger 0: closing after a timeout must drop what is queued for a dead peer, not wait for it. */
    int linger = 0;
    /* Bound what a (possibly hostile) peer can make us allocate: ZeroMQ drops the connection instead. */
    int64_t max_msg = (int64_t)CARLS_DEFAULT_MAX_MESSAGE_BYTES;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg) != 0) {
        s_set_error(self, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return -1;
    }
    /* CURVE options must be set before connecting; a reopened socket needs them again (they belong to the
     * socket, not to the client). */
    char err[256];
    if (self->use_curve &&
        kb_auth_setup_client(sock, &self->curve.client, &self->curve.server_public, err, sizeof err) != 0) {
        s_set_error(self, "%s", err);
        zmq_close(sock);
        return -1;
    }
    if (zmq_connect(sock, self->endpoint) != 0) {
        s_set_error(self, "cannot connect to %s: %s", self->endpoint, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return -1;
    }
    self->sock = sock;
    return 0;
}

static void s_close_socket(kb_client_t *self)
{
    if (self->sock) {
        zmq_close(self->sock);
        self->sock = NULL;
    }
}

int kb_client_curve_load(const char *key_file, const char *server_key_file, kb_client_curve_t *out, char *err,
                         size_t errlen)
{
    assert(out);
    if (!key_file || !server_key_file) {
        snprintf(err, errlen, "CURVE needs both a client key file and the server's public key file");
        return KB_AUTH_EINVAL;
    }
    int rc = kb_auth_load_secret(key_file, &out->client, err, errlen);
    if (rc == 0)
        rc = kb_auth_load_public(server_key_file, &out->server_public, err, errlen);
    if (rc != 0)
        explicit_bzero(out, sizeof *out);
    return rc;
}

kb_client_t *kb_client_new(const char *endpoint, const kb_client_options_t *opts)
{
    if (!endpoint || !*endpoint) {
        LOG_ERROR("kb_client_new: no endpoint");
        return NULL;
    }
    kb_client_t *self = carls_xcalloc(1, sizeof *self);
    self->endpoint = carls_xmalloc(strlen(endpoint) + 1);
    strcpy(self->endpoint, endpoint);
    self->timeout_ms = (opts && opts->timeout_ms > 0) ? opts->timeout_ms : S_DEFAULT_TIMEOUT_MS;
    self->retries = (opts && opts->retries > 0) ? opts->retries : 0;
    self->client_id = opts ? opts->client_id : 0;
    /* A random id keeps two clients (or one client restarted) from sharing sequence numbers. */
    while (self->client_id == 0) {
        if (carls_random_bytes(&self->client_id, sizeof self->client_id) != 0) {
            LOG_ERROR("kb_client_new: cannot read random bytes for a client id");
            goto fail;
        }
    }
    if (opts && opts->curve) {
        if (!zmq_has("curve")) {
            LOG_ERROR("kb_client_new: CURVE keys were given but this libzmq has no CURVE support");
            goto fail;
        }
        self->use_curve = true;
        self->curve = *opts->curve;
    }
    self->next_request_id = 1;
    self->next_sequence = 1;
    self->ctx = zmq_ctx_new();
    if (!self->ctx) {
        LOG_ERROR("kb_client_new: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (s_open_socket(self) != 0) {
        LOG_ERROR("kb_client_new: %s", self->last_error);
        goto fail;
    }
    return self;
fail:
    kb_client_destroy(&self);
    return NULL;
}

/* Frees entry i and removes it from the table (order is not kept). */
static void s_inflight_remove(kb_client_t *self, size_t i)
{
    assert(i < self->n_inflight);
    free(self->inflight[i].packed);
    if (self->inflight[i].answer)
        carls__response__free_unpacked(self->inflight[i].answer, NULL);
    self->inflight[i] = self->inflight[self->n_inflight - 1];
    self->n_inflight--;
}

/* Index of request id in the table, or -1. */
static long s_inflight_find(const kb_client_t *self, uint64_t id)
{
    for (size_t i = 0; i < self->n_inflight; i++)
        if (self->inflight[i].id == id)
            return (long)i;
    return -1;
}

void kb_client_destroy(kb_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_client_t *self = *self_p;
    while (self->n_inflight > 0)
        s_inflight_remove(self, self->n_inflight - 1);
    free(self->inflight);
    s_close_socket(self);
    if (self->ctx)
        zmq_ctx_term(self->ctx);
    /* The secret key should not outlive the client in freed memory. */
    explicit_bzero(&self->curve, sizeof self->curve);
    free(self->endpoint);
    free(self);
    *self_p = NULL;
}

const char *kb_client_last_error(const kb_client_t *self)
{
    assert(self);
    return self->last_error;
}

Carls__StatusCode kb_client_last_status(const kb_client_t *self)
{
    assert(self);
    return self->last_status;
}

const char *kb_client_endpoint(const kb_client_t *self)
{
    assert(self);
    return self->endpoint;
}

uint64_t kb_client_id(const kb_client_t *self)
{
    assert(self);
    return self->client_id;
}

/* Operations that change the bank: they carry client_id and sequence so a resent one is applied once.
 * feature_put (added with the retrieval operations) changes rows like put does, so it is one too; so does a
 * snapshot create or delete (a create resent after it finished is known by them, kb_snapshot.h). */
static bool s_is_write(const Carls__Request *req)
{
    const Carls__Request__OpCase op = req->op_case;
    return op == CARLS__REQUEST__OP_CREATE_TABLE || op == CARLS__REQUEST__OP_DROP_TABLE ||
           op == CARLS__REQUEST__OP_PUT || op == CARLS__REQUEST__OP_PUSH_GRADIENTS ||
           op == CARLS__REQUEST__OP_FEATURE_PUT || op == CARLS__REQUEST__OP_IMPORT_ROWS ||
           (op == CARLS__REQUEST__OP_SNAPSHOT && req->snapshot &&
            req->snapshot->action != CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST);
}

/* Sends one packed request on the current socket without blocking. A full queue (EAGAIN) is not an
 * error: the request stays in flight and the timeout path resends it. 0, or KB_CLIENT_EIO (error set). */
static int s_send_bytes(kb_client_t *self, const uint8_t *bytes, size_t len, uint64_t id)
{
    if (zmq_send(self->sock, bytes, len, ZMQ_DONTWAIT) >= 0)
        return 0;
    int e = zmq_errno();
    if (e == EAGAIN) {
        LOG_DEBUG("kb_client: send queue to %s full; request %llu will be resent after a timeout",
                  self->endpoint, (unsigned long long)id);
        return 0;
    }
    s_set_error(self, "send to %s: %s", self->endpoint, zmq_strerror(e));
    return KB_CLIENT_EIO;
}

int kb_client_send(kb_client_t *self, Carls__Request *req, uint64_t *request_id_out)
{
    assert(self);
    s_clear_error(self);
    if (!req || req->op_case == CARLS__REQUEST__OP__NOT_SET) {
        s_set_error(self, "request carries no operation");
        return KB_CLIENT_EINVAL;
    }
    if (!req->table)
        req->table = (char *)protobuf_c_empty_string;
    bool write = s_is_write(req);
    req->protocol_version = CARLS_PROTOCOL_VERSION;
    req->request_id = self->next_request_id;
    req->client_id = write ? self->client_id : 0;
    req->sequence = write ? self->next_sequence : 0;

    size_t len = protobuf_c_message_get_packed_size(&req->base);
    if (len > CARLS_DEFAULT_MAX_MESSAGE_BYTES) {
        s_set_error(self, "%s request is %zu bytes, above the message limit of %u bytes; send smaller batches",
                    carls_op_name(req->op_case), len, CARLS_DEFAULT_MAX_MESSAGE_BYTES);
        return KB_CLIENT_EINVAL;
    }
    /* The ids are spent only once the request is accepted, so refused requests leave no gaps. */
    self->next_request_id++;
    if (write)
        self->next_sequence++;

    uint8_t *bytes = carls_xmalloc(len);
    size_t packed = protobuf_c_message_pack(&req->base, bytes);
    assert(packed == len);
    (void)packed;
    if (self->n_inflight == self->cap_inflight) {
        self->cap_inflight = self->cap_inflight ? self->cap_inflight * 2 : 8;
        self->inflight = carls_xrealloc(self->inflight, self->cap_inflight * sizeof *self->inflight);
    }
    s_inflight_t *slot = &self->inflight[self->n_inflight++];
    slot->id = req->request_id;
    slot->packed = bytes;
    slot->packed_len = len;
    slot->answer = NULL;

    int rc = s_send_bytes(self, bytes, len, req->request_id);
    if (rc != 0) {
        s_inflight_remove(self, self->n_inflight - 1);
        return rc;
    }
    if (request_id_out)
        *request_id_out = req->request_id;
    return KB_CLIENT_OK;
}

/* After a timeout: a new socket (the old one may hold a connection to a dead server, or queued frames),
 * and every request still in flight without an answer sent again on it, because answers to the old
 * socket can no longer reach us. 0, or KB_CLIENT_EIO (error set). */
static int s_reconnect_and_resend(kb_client_t *self)
{
    s_close_socket(self);
    if (s_open_socket(self) != 0)
        return KB_CLIENT_EIO;
    for (size_t i = 0; i < self->n_inflight; i++) {
        s_inflight_t *f = &self->inflight[i];
        if (f->answer)
            continue;
        int rc = s_send_bytes(self, f->packed, f->packed_len, f->id);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Receives every frame waiting on the socket and files each answer with its request. Returns 0, or
 * KB_CLIENT_EIO for a socket error or KB_CLIENT_EMALFORMED for a frame that is not a Response (error set). */
static int s_drain(kb_client_t *self)
{
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, self->sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&msg);
            if (e == EAGAIN || e == EINTR)
                return 0;
            s_set_error(self, "receive from %s: %s", self->endpoint, zmq_strerror(e));
            return KB_CLIENT_EIO;
        }
        bool more = zmq_msg_more(&msg);
        Carls__Response *resp =
            more ? NULL
                 : carls__response__unpack(NULL, zmq_msg_size(&msg), (const uint8_t *)zmq_msg_data(&msg));
        size_t size = zmq_msg_size(&msg);
        zmq_msg_close(&msg);
        if (more) {
            /* The protocol is one frame per message: swallow the rest so the socket stays usable. */
            while (more) {
                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, self->sock, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&msg);
                    break;
                }
                more = zmq_msg_more(&msg);
                zmq_msg_close(&msg);
            }
            s_set_error(self, "malformed answer from %s: a multi-frame message", self->endpoint);
            return KB_CLIENT_EMALFORMED;
        }
        if (!resp) {
            s_set_error(self, "malformed answer from %s: a %zu-byte frame that does not decode as a Response",
                        self->endpoint, size);
            return KB_CLIENT_EMALFORMED;
        }
        long i = s_inflight_find(self, resp->request_id);
        if (i < 0 || self->inflight[i].answer) {
            LOG_DEBUG("kb_client: dropping an answer for request %llu, which is not waiting (stale duplicate)",
                      (unsigned long long)resp->request_id);
            carls__response__free_unpacked(resp, NULL);
            continue;
        }
        self->inflight[i].answer = resp;
    }
}

int kb_client_wait(kb_client_t *self, uint64_t request_id, Carls__Response **response_out)
{
    assert(self && response_out);
    s_clear_error(self);
    *response_out = NULL;
    long idx = s_inflight_find(self, request_id);
    if (idx < 0) {
        s_set_error(self, "request %llu is not in flight", (unsigned long long)request_id);
        return KB_CLIENT_EINVAL;
    }
    int rc = KB_CLIENT_OK;
    int attempt = 1;
    int64_t deadline = carls_monotonic_ms() + self->timeout_ms;
    while (!self->inflight[idx].answer) {
        int64_t left = deadline - carls_monotonic_ms();
        if (left <= 0) {
            if (attempt > self->retries) {
                s_set_error(self, "no answer from %s after %d attempt%s of %d ms", self->endpoint, attempt,
                            attempt == 1 ? "" : "s", self->timeout_ms);
                rc = KB_CLIENT_ETIMEOUT;
                goto done;
            }
            LOG_WARN("kb_client: no answer from %s to request %llu in %d ms; reconnecting and resending "
                     "(attempt %d of %d)",
                     self->endpoint, (unsigned long long)request_id, self->timeout_ms, attempt + 1,
                     self->retries + 1);
            rc = s_reconnect_and_resend(self);
            if (rc != 0)
                goto done;
            attempt++;
            deadline = carls_monotonic_ms() + self->timeout_ms;
            continue;
        }
        zmq_pollitem_t item = {.socket = self->sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&item, 1, (long)left);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            s_set_error(self, "poll on %s: %s", self->endpoint, zmq_strerror(zmq_errno()));
            rc = KB_CLIENT_EIO;
            goto done;
        }
        if (n > 0) {
            /* Draining only adds answers; it never reorders the table, so idx stays valid. */
            rc = s_drain(self);
            if (rc != 0)
                goto done;
        }
    }

    Carls__Response *resp = self->inflight[idx].answer;
    self->inflight[idx].answer = NULL;
    if (resp->status != CARLS__STATUS_CODE__STATUS_OK) {
        self->last_status = resp->status;
        if (resp->status == CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED)
            s_set_error(self, "%s: %s [the server is at its memory limit; this request was not applied]",
                        carls_status_name(resp->status), resp->error ? resp->error : "");
        else
            s_set_error(self, "%s: %s", carls_status_name(resp->status), resp->error ? resp->error : "");
        *response_out = resp;
        rc = KB_CLIENT_ESTATUS;
    } else if (resp->protocol_version != CARLS_PROTOCOL_VERSION) {
        s_set_error(self, "answer from %s speaks protocol version %u, this client speaks %u", self->endpoint,
                    resp->protocol_version, CARLS_PROTOCOL_VERSION);
        carls__response__free_unpacked(resp, NULL);
        rc = KB_CLIENT_EIO;
    } else {
        *response_out = resp;
    }
done:
    s_inflight_remove(self, (size_t)idx);
    return rc;
}

int kb_client_cancel(kb_client_t *self, uint64_t request_id)
{
    assert(self);
    long idx = s_inflight_find(self, request_id);
    if (idx < 0)
        return KB_CLIENT_EINVAL;
    s_inflight_remove(self, (size_t)idx);
    return 0;
}

int kb_client_call(kb_client_t *self, Carls__Request *req, Carls__Response **response_out)
{
    assert(self && response_out);
    *response_out = NULL;
    uint64_t id;
    int rc = kb_client_send(self, req, &id);
    if (rc != 0)
        return rc;
    return kb_client_wait(self, id, response_out);
}
