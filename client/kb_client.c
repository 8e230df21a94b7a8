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
 * that is not in flight), the id is no longer in flight afterwards.
 *
 * Several members (a replicated shard, "tcp://a:1|tcp://b:2"): the socket is connected to one member at a
 * time, with ZeroMQ heartbeats and a monitor socket that tells whether the connection is up. s_drain files
 * OK and ordinary error answers as before, but an answer of a term below the highest seen is dropped and a
 * NOT_PRIMARY or UNAVAILABLE answer is kept aside as the request's refusal; either plans a move (self->plan)
 * that s_wait_members carries out: a new socket to the chosen member and every request without an answer
 * resent on it. A client of one member never reaches that code: kb_client_wait's loop is unchanged. */
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
#include <time.h>
#include <zmq.h>

#define S_DEFAULT_TIMEOUT_MS 5000
#define S_DEFAULT_FAILOVER_TIMEOUT_MS 1000
#define S_DEFAULT_FAILOVER_WAIT_MS 10000
#define S_NOT_PRIMARY_PAUSE_MS 100 /* before the next member when a refusal names no primary */
/* ZeroMQ heartbeats on a client of several members: a connection silent this long is dropped, so a lost
 * node is seen as not connected (a killed process is seen at once: its kernel closes the connection). */
#define S_SUSPECT_MS 3000 /* how long a member left for silence is passed over when named as the primary */
#define S_HEARTBEAT_IVL_MS 250
#define S_HEARTBEAT_TIMEOUT_MS 750

/* One request in flight. */
typedef struct {
    uint64_t id;              /* request_id */
    uint8_t *packed;          /* the packed Request, resent as is */
    size_t packed_len;
    Carls__Response *answer;  /* decoded answer that arrived before anyone waited for it; NULL if none */
    Carls__Response *refusal; /* several members: the last NOT_PRIMARY/UNAVAILABLE answer; NULL if none */
} s_inflight_t;

/* A move to another member, planned while draining answers and carried out by the wait. */
typedef struct {
    bool set;
    size_t to;                /* index in members */
    int pause_ms;             /* before connecting */
    char why[384];
} s_plan_t;

struct kb_client {
    char *endpoint;           /* as given to kb_client_new */
    char *members[KB_CLIENT_MAX_MEMBERS]; /* the endpoint split at '|'; primaries named in answers appended */
    size_t n_members;
    /* Until when each member is suspect: left because it was not connected or did not answer. A refusal
     * naming a suspect member as the primary (a follower that has not noticed its primary died) is answered
     * by trying the others again after a pause, not by another attempt at the dead one. */
    int64_t suspect_until[KB_CLIENT_MAX_MEMBERS];
    size_t current;           /* the member the socket connects to (again after a timeout) */
    bool failover;            /* several members were given: the rules of kb_client.h apply */
    uint64_t max_term;        /* the highest term seen in answers */
    int failover_timeout_ms;  /* several members: how long an attempt waits for a connection */
    int failover_wait_ms;     /* several members: how long a wait keeps trying */
    s_plan_t plan;            /* several members: a move decided by s_drain */
    void *monitor;            /* several members: PAIR receiving the socket's connection events */
    unsigned monitor_seq;     /* makes each monitor's inproc address unique */
    bool connected;           /* several members: the socket has a connection to its member */
    int64_t warned_ms;        /* when the last move was logged as a warning */
    unsigned quiet_moves;     /* moves since then (0: none ever) */
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

static const char *s_member(const kb_client_t *self) { return self->members[self->current]; }

/* Several members: heartbeats on sock and a monitor (self->monitor) of its connection events. 0 or -1
 * (error set). */
static int s_watch_socket(kb_client_t *self, void *sock)
{
    int ivl = S_HEARTBEAT_IVL_MS, hb_timeout = S_HEARTBEAT_TIMEOUT_MS;
    if (zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout) != 0) {
        s_set_error(self, "zmq_setsockopt (heartbeats): %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    char addr[96];
    snprintf(addr, sizeof addr, "inproc://kb-client-monitor-%p-%u", (void *)self, self->monitor_seq++);
    if (zmq_socket_monitor(sock, addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        s_set_error(self, "zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    void *mon = zmq_socket(self->ctx, ZMQ_PAIR);
    int linger = 0;
    if (!mon || zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(mon, addr) != 0) {
        s_set_error(self, "monitor socket: %s", zmq_strerror(zmq_errno()));
        if (mon)
            zmq_close(mon);
        zmq_socket_monitor(sock, NULL, 0);
        return -1;
    }
    self->monitor = mon;
    self->connected = false;
    return 0;
}

/* Reads and drops the rest of a message whose first frame was read (only what is queued: it does not wait),
 * so that the next read starts at a new message. */
static void s_drop_frames(void *sock)
{
    bool more = true;
    while (more) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            return;
        }
        more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
    }
}

/* Reads every connection event waiting on the monitor into self->connected. */
static void s_read_monitor(kb_client_t *self)
{
    if (!self->monitor)
        return;
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, self->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            return;
        }
        /* First frame: the event (16 bits) and its value (32 bits); then the endpoint's frame. */
        uint16_t event = 0;
        if (zmq_msg_size(&msg) >= sizeof event)
            memcpy(&event, zmq_msg_data(&msg), sizeof event);
        bool more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
        if (more)
            s_drop_frames(self->monitor);
        if (event == ZMQ_EVENT_CONNECTED)
            self->connected = true;
        else if (event == ZMQ_EVENT_DISCONNECTED)
            self->connected = false;
    }
}

/* Opens a fresh DEALER socket connected to the current member into self->sock. 0 or -1 (error set). */
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
    if (self->failover && s_watch_socket(self, sock) != 0) {
        zmq_close(sock);
        return -1;
    }
    if (zmq_connect(sock, s_member(self)) != 0) {
        s_set_error(self, "cannot connect to %s: %s", s_member(self), zmq_strerror(zmq_errno()));
        if (self->monitor) {
            zmq_socket_monitor(sock, NULL, 0);
            zmq_close(self->monitor);
            self->monitor = NULL;
        }
        zmq_close(sock);
        return -1;
    }
    self->sock = sock;
    return 0;
}

static void s_close_socket(kb_client_t *self)
{
    if (self->monitor) {
        zmq_socket_monitor(self->sock, NULL, 0);
        zmq_close(self->monitor);
        self->monitor = NULL;
    }
    if (self->sock) {
        zmq_close(self->sock);
        self->sock = NULL;
    }
    self->connected = false;
}

char *kb_client_list_item(const char **p, char sep)
{
    const char *a = *p, *end = strchr(a, sep);
    if (!end)
        end = a + strlen(a);
    *p = *end ? end + 1 : NULL;
    const char *b = end;
    while (a < b && (*a == ' ' || *a == '\t'))
        a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
        b--;
    if (a == b)
        return NULL;
    char *item = carls_xmalloc((size_t)(b - a) + 1);
    memcpy(item, a, (size_t)(b - a));
    item[b - a] = '\0';
    return item;
}

/* Index of member ep, or -1. */
static long s_member_find(const kb_client_t *self, const char *ep)
{
    for (size_t i = 0; i < self->n_members; i++)
        if (strcmp(self->members[i], ep) == 0)
            return (long)i;
    return -1;
}

/* Splits endpoint at '|' into self->members, each trimmed of spaces and tabs. 0, or -1 (logged) for an
 * empty or repeated member or too many. */
static int s_parse_members(kb_client_t *self, const char *endpoint)
{
    const char *p = endpoint;
    while (p) {
        char *ep = kb_client_list_item(&p, '|');
        if (!ep) {
            LOG_ERROR("kb_client_new: empty member at position %zu of \"%s\"", self->n_members + 1, endpoint);
            return -1;
        }
        if (self->n_members == KB_CLIENT_MAX_MEMBERS) {
            LOG_ERROR("kb_client_new: more than %d members in \"%s\"", KB_CLIENT_MAX_MEMBERS, endpoint);
            free(ep);
            return -1;
        }
        if (s_member_find(self, ep) >= 0) {
            LOG_ERROR("kb_client_new: member %s is listed twice in \"%s\"", ep, endpoint);
            free(ep);
            return -1;
        }
        self->members[self->n_members++] = ep;
    }
    return 0;
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
    if (strchr(endpoint, '|')) {
        if (s_parse_members(self, endpoint) != 0)
            goto fail;
    } else {
        /* One member: the endpoint exactly as given, as before member lists existed. */
        self->members[0] = carls_xmalloc(strlen(endpoint) + 1);
        strcpy(self->members[0], endpoint);
        self->n_members = 1;
    }
    self->failover = self->n_members > 1;
    self->timeout_ms = (opts && opts->timeout_ms > 0) ? opts->timeout_ms : S_DEFAULT_TIMEOUT_MS;
    self->retries = (opts && opts->retries > 0) ? opts->retries : 0;
    self->failover_timeout_ms =
        (opts && opts->failover_timeout_ms > 0) ? opts->failover_timeout_ms : S_DEFAULT_FAILOVER_TIMEOUT_MS;
    if (self->failover_timeout_ms > self->timeout_ms)
        self->failover_timeout_ms = self->timeout_ms;
    if (opts && opts->failover_wait_ms > 0) {
        self->failover_wait_ms = opts->failover_wait_ms;
    } else {
        int64_t all = (int64_t)self->timeout_ms * (self->retries + 1);
        self->failover_wait_ms = all > S_DEFAULT_FAILOVER_WAIT_MS ? (all > INT32_MAX ? INT32_MAX : (int)all)
                                                                  : S_DEFAULT_FAILOVER_WAIT_MS;
    }
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
    if (self->inflight[i].refusal)
        carls__response__free_unpacked(self->inflight[i].refusal, NULL);
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
    for (size_t i = 0; i < self->n_members; i++)
        free(self->members[i]);
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

const char *kb_client_member(const kb_client_t *self)
{
    assert(self);
    return s_member(self);
}

size_t kb_client_members(const kb_client_t *self)
{
    assert(self);
    return self->n_members;
}

const char *kb_client_member_at(const kb_client_t *self, size_t i)
{
    assert(self && i < self->n_members);
    return self->members[i];
}

int kb_client_failover_timeout_ms(const kb_client_t *self)
{
    assert(self);
    return self->failover_timeout_ms;
}

uint64_t kb_client_term(const kb_client_t *self)
{
    assert(self);
    return self->max_term;
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
                  s_member(self), (unsigned long long)id);
        return 0;
    }
    s_set_error(self, "send to %s: %s", s_member(self), zmq_strerror(e));
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
    slot->refusal = NULL;

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

/* Plans a move to member `to` (the first plan of a drain wins) after pause_ms, for the reason given. */
static void s_plan(kb_client_t *self, size_t to, int pause_ms, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void s_plan(kb_client_t *self, size_t to, int pause_ms, const char *fmt, ...)
{
    if (self->plan.set)
        return;
    self->plan.set = true;
    self->plan.to = to;
    self->plan.pause_ms = pause_ms;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->plan.why, sizeof self->plan.why, fmt, ap);
    va_end(ap);
}

static size_t s_next_member(const kb_client_t *self) { return (self->current + 1) % self->n_members; }

static bool s_suspect(const kb_client_t *self, size_t i) { return carls_monotonic_ms() < self->suspect_until[i]; }

/* The first member after the current one that is not suspect, or the current one when all others are. */
static size_t s_next_trusted(const kb_client_t *self)
{
    for (size_t k = 1; k < self->n_members; k++) {
        size_t i = (self->current + k) % self->n_members;
        if (!s_suspect(self, i))
            return i;
    }
    return self->current;
}

/* Several members: the rules for an answer resp to the request in slot f. True when resp is f's answer
 * (filed by the caller); false when it was kept as f's refusal or dropped, a move planned either way. */
static bool s_file_member_answer(kb_client_t *self, s_inflight_t *f, Carls__Response *resp)
{
    if (resp->term != 0 && resp->term < self->max_term) {
        s_plan(self, s_next_member(self), 0, "it answered in term %llu, below term %llu seen before (a deposed "
               "primary); its answer was dropped", (unsigned long long)resp->term,
               (unsigned long long)self->max_term);
        carls__response__free_unpacked(resp, NULL);
        return false;
    }
    if (resp->term > self->max_term)
        self->max_term = resp->term;
    if (resp->status == CARLS__STATUS_CODE__STATUS_UNAVAILABLE) {
        s_plan(self, s_next_member(self), S_NOT_PRIMARY_PAUSE_MS, "it answered UNAVAILABLE: %s",
               resp->error ? resp->error : "");
    } else if (resp->status == CARLS__STATUS_CODE__STATUS_NOT_PRIMARY) {
        const char *hint = resp->primary && *resp->primary ? resp->primary : NULL;
        long to = hint ? s_member_find(self, hint) : -1;
        if (hint && to < 0 && self->n_members < KB_CLIENT_MAX_MEMBERS) {
            /* A primary not in the list: a replacement on another node. */
            char *ep = carls_xmalloc(strlen(hint) + 1);
            strcpy(ep, hint);
            to = (long)self->n_members;
            self->members[self->n_members++] = ep;
            LOG_WARN("kb_client: %s names %s as the primary of the shard; added as member %zu of %s", s_member(self),
                     hint, self->n_members, self->endpoint);
        }
        if (to >= 0 && (size_t)to != self->current && !s_suspect(self, (size_t)to))
            s_plan(self, (size_t)to, 0, "it is not the primary (NOT_PRIMARY, term %llu), %s is",
                   (unsigned long long)resp->term, hint);
        else if (to >= 0 && (size_t)to != self->current)
            s_plan(self, s_next_trusted(self), S_NOT_PRIMARY_PAUSE_MS,
                   "it is not the primary (NOT_PRIMARY, term %llu) and names %s, which did not answer lately",
                   (unsigned long long)resp->term, hint);
        else
            s_plan(self, s_next_member(self), S_NOT_PRIMARY_PAUSE_MS,
                   "it is not the primary (NOT_PRIMARY, term %llu) and names no other", (unsigned long long)resp->term);
    } else {
        return true;
    }
    if (f->refusal)
        carls__response__free_unpacked(f->refusal, NULL);
    f->refusal = resp;
    return false;
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
            s_set_error(self, "receive from %s: %s", s_member(self), zmq_strerror(e));
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
            s_drop_frames(self->sock);
            s_set_error(self, "malformed answer from %s: a multi-frame message", s_member(self));
            return KB_CLIENT_EMALFORMED;
        }
        if (!resp) {
            s_set_error(self, "malformed answer from %s: a %zu-byte frame that does not decode as a Response",
                        s_member(self), size);
            return KB_CLIENT_EMALFORMED;
        }
        long i = s_inflight_find(self, resp->request_id);
        if (i < 0 || self->inflight[i].answer) {
            LOG_DEBUG("kb_client: dropping an answer for request %llu, which is not waiting (stale duplicate)",
                      (unsigned long long)resp->request_id);
            carls__response__free_unpacked(resp, NULL);
            continue;
        }
        if (self->failover && !s_file_member_answer(self, &self->inflight[i], resp))
            continue;
        self->inflight[i].answer = resp;
    }
}

/* Carries out self->plan: logs the move, pauses, connects to the chosen member and resends every request
 * without an answer. 0, or KB_CLIENT_EIO (error set). */
static int s_move(kb_client_t *self)
{
    assert(self->plan.set);
    size_t resend = 0;
    for (size_t i = 0; i < self->n_inflight; i++)
        resend += self->inflight[i].answer == NULL;
    /* One warning a second at most: a shard without a primary for seconds is tried every 100 ms. */
    char msg[768];
    if (self->plan.to == self->current)
        snprintf(msg, sizeof msg, "kb_client: trying %s again in %d ms (member %zu of %zu): %s; resending %zu "
                 "request%s", s_member(self), self->plan.pause_ms, self->current + 1, self->n_members,
                 self->plan.why, resend, resend == 1 ? "" : "s");
    else
        snprintf(msg, sizeof msg, "kb_client: leaving %s for %s (member %zu of %zu): %s; resending %zu request%s",
                 s_member(self), self->members[self->plan.to], self->plan.to + 1, self->n_members,
                 self->plan.why, resend, resend == 1 ? "" : "s");
    int64_t now = carls_monotonic_ms();
    if (self->quiet_moves == 0 || now - self->warned_ms >= 1000) {
        if (self->quiet_moves > 1)
            LOG_WARN("%s (and %u moves in the last %lld ms)", msg, self->quiet_moves - 1,
                     (long long)(now - self->warned_ms));
        else
            LOG_WARN("%s", msg);
        self->warned_ms = now;
        self->quiet_moves = 1;
    } else {
        LOG_DEBUG("%s", msg);
        self->quiet_moves++;
    }
    s_close_socket(self);
    if (self->plan.pause_ms > 0) {
        struct timespec ts = {self->plan.pause_ms / 1000, (long)(self->plan.pause_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    self->current = self->plan.to;
    self->plan.set = false;
    return s_reconnect_and_resend(self);
}

/* kb_client_wait's loop for a client of several members (kb_client.h): until slot idx has an answer, or
 * failover_wait_ms have passed. 0 when it has one (or its last refusal, put in its place), otherwise a
 * negative code (error set). */
static int s_wait_members(kb_client_t *self, long idx, uint64_t request_id)
{
    const int64_t start = carls_monotonic_ms();
    const int64_t give_up = start + self->failover_wait_ms;
    int64_t attempt = start; /* when the attempt at the current member began */
    unsigned moves = 0;
    s_inflight_t *f = &self->inflight[idx];
    while (!f->answer) {
        if (self->plan.set) {
            int rc = s_move(self);
            if (rc != 0)
                return rc;
            moves++;
            attempt = carls_monotonic_ms();
            continue;
        }
        int64_t now = carls_monotonic_ms();
        if (now >= give_up) {
            if (f->refusal) {
                f->answer = f->refusal; /* the members' last word: NOT_PRIMARY or UNAVAILABLE */
                f->refusal = NULL;
                return 0;
            }
            s_set_error(self, "no answer from the members of %s in %d ms (%u move%s between them; last tried %s)",
                        self->endpoint, self->failover_wait_ms, moves, moves == 1 ? "" : "s", s_member(self));
            return KB_CLIENT_ETIMEOUT;
        }
        s_read_monitor(self);
        int64_t waited = now - attempt;
        if (!self->connected && waited >= self->failover_timeout_ms) {
            self->suspect_until[self->current] = now + S_SUSPECT_MS;
            s_plan(self, s_next_member(self), 0, "not connected %lld ms after request %llu was sent",
                   (long long)waited, (unsigned long long)request_id);
            continue;
        }
        if (waited >= self->timeout_ms) {
            self->suspect_until[self->current] = now + S_SUSPECT_MS;
            s_plan(self, s_next_member(self), 0, "no answer to request %llu in %d ms", (unsigned long long)request_id,
                   self->timeout_ms);
            continue;
        }
        /* Sleep until an answer or a connection event, or the next deadline. */
        int64_t next = attempt + self->timeout_ms;
        if (!self->connected && attempt + self->failover_timeout_ms < next)
            next = attempt + self->failover_timeout_ms;
        if (give_up < next)
            next = give_up;
        zmq_pollitem_t items[2] = {{.socket = self->sock, .events = ZMQ_POLLIN},
                                   {.socket = self->monitor, .events = ZMQ_POLLIN}};
        int n = zmq_poll(items, 2, (long)(next - now));
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            s_set_error(self, "poll on %s: %s", s_member(self), zmq_strerror(zmq_errno()));
            return KB_CLIENT_EIO;
        }
        if (items[0].revents & ZMQ_POLLIN) {
            int rc = s_drain(self);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
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
    if (self->failover) {
        rc = s_wait_members(self, idx, request_id);
        if (rc != 0)
            goto done;
    }
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
        s_set_error(self, "answer from %s speaks protocol version %u, this client speaks %u", s_member(self),
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
