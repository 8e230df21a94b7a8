#include "kb_replica.h"

#include "kb_term.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#define S_MAX_FOLLOWERS 16
#define S_HEARTBEAT_MS 100
#define S_FOLLOWER_SILENT_MS 3000 /* a follower not heard from this long is no longer counted live */
#define S_PRIMARY_SILENT_MS 1000  /* a follower that hears nothing this long says hello again */
#define S_DEFAULT_BUFFER_BYTES ((uint64_t)256 << 20)

/* One round kept for the followers: shared by the ring and every message that sends it (zero-copy). */
typedef struct {
    atomic_int refs;
    uint64_t epoch;
    uint32_t crc;
    int64_t shipped_us;
    size_t len;
    uint8_t data[];
} s_round_t;

typedef struct {
    char member[KB_TERM_MAX_MEMBER + 1];
    uint8_t id[256]; /* the ROUTER's routing id of its connection */
    size_t id_len;
    uint64_t sent_epoch, acked_epoch;
    int64_t heard_ms;
    bool live;
} s_follower_t;

struct kb_replica {
    kb_bank_t *bank;
    kb_service_t *service;
    char *data_dir, *member, *replica_of, *listen;
    uint32_t min_replicas, shard_index, shard_count;
    uint64_t buffer_bytes;

    pthread_mutex_t mutex; /* the state below, the ring and the followers */
    kb_term_state_t *state;
    bool have_state;        /* DATA/REPLICATION exists (a fresh follower has none before its first round) */
    bool fenced;
    void *zctx;

    /* primary */
    void *router;
    char endpoint[256];
    int event_fd;
    pthread_t primary_thread;
    bool primary_running;
    atomic_bool primary_stop;
    s_round_t **ring;       /* recent rounds, oldest first, from ring_first on */
    size_t ring_first, ring_count, ring_cap;
    uint64_t ring_bytes;
    uint64_t ring_base;     /* every round after this epoch is in the ring */
    uint64_t shipped_epoch;
    s_follower_t followers[S_MAX_FOLLOWERS];
    size_t n_followers;

    /* follower */
    pthread_t follower_thread;
    bool follower_running;
    atomic_bool follower_stop;
};

static void s_round_unref(void *data, void *hint)
{
    (void)data;
    s_round_t *r = hint;
    if (atomic_fetch_sub(&r->refs, 1) == 1)
        free(r);
}

/* ---- the member's term (kb_term.h) ---- */

/* Saves the state; a failure is logged (the member goes on with the state in memory). Mutex held. */
static int s_save(kb_replica_t *self)
{
    char err[512];
    if (kb_term_save(self->data_dir, self->state, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return -1;
    }
    self->have_state = true;
    return 0;
}

static const char *s_role_name(const kb_replica_t *self)
{
    if (self->primary_running)
        return self->fenced ? "deposed" : "primary";
    return self->replica_of ? "follower" : "standby";
}

/* The role every reply shows (mutex held). */
static void s_publish_role(kb_replica_t *self)
{
    bool writable = self->primary_running && !self->fenced;
    kb_service_set_role(self->service, self->have_state ? self->state->term : 0, writable,
                        self->replica_of ? self->replica_of : "");
}

/* A newer term was seen: a primary stops accepting and acknowledging writes for good. Mutex held. */
static void s_depose(kb_replica_t *self, uint64_t term, const char *why)
{
    if (self->have_state && term > self->state->term) {
        self->state->term = term;
        if (self->primary_running)
            self->state->role = KB_TERM_STANDBY;
        s_save(self);
    }
    if (self->primary_running && !self->fenced) {
        self->fenced = true;
        char reason[256];
        snprintf(reason, sizeof reason, "this member was deposed by term %" PRIu64 " (%s)", term, why);
        kb_bank_fence(self->bank, reason);
    }
    s_publish_role(self);
}

/* ---- messages ---- */

/* Sends msg, and for a record its payload frame (zero-copy from r), to the routing id (primary) or not
 * (follower). 0, or -1 with errno (EAGAIN: the pipe is full; EHOSTUNREACH: the peer is gone). */
static int s_send(void *socket, const uint8_t *id, size_t id_len, const Carls__ReplMessage *msg, s_round_t *r)
{
    uint8_t buf[512];
    size_t len = carls__repl_message__get_packed_size(msg);
    if (len > sizeof buf)
        return errno = EMSGSIZE, -1;
    carls__repl_message__pack(msg, buf);
    if (id && zmq_send(socket, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return -1;
    if (zmq_send(socket, buf, len, (r ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        return -1; /* a routed message's first frame is only queued with the last one */
    if (!r)
        return 0;
    if (r->len == 0)
        return zmq_send(socket, "", 0, ZMQ_DONTWAIT) < 0 ? -1 : 0; /* an empty round */
    zmq_msg_t body;
    atomic_fetch_add(&r->refs, 1);
    if (zmq_msg_init_data(&body, r->data, r->len, s_round_unref, r) != 0) {
        atomic_fetch_sub(&r->refs, 1);
        return -1;
    }
    if (zmq_msg_send(&body, socket, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        zmq_msg_close(&body);
        return errno = e, -1;
    }
    return 0;
}

static void s_send_refuse(void *socket, const uint8_t *id, size_t id_len, uint64_t term, Carls__ReplRefusal reason,
                          const char *text)
{
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplRefuse refuse = CARLS__REPL_REFUSE__INIT;
    refuse.term = term;
    refuse.reason = reason;
    refuse.text = (char *)text;
    msg.body_case = CARLS__REPL_MESSAGE__BODY_REFUSE;
    msg.refuse = &refuse;
    s_send(socket, id, id_len, &msg, NULL);
}

/* Receives one multi-part message without waiting: its frames (at most 3) into parts. Returns the count, 0
 * when none is waiting. */
static int s_recv(void *socket, zmq_msg_t *parts, int max)
{
    int n = 0;
    for (;;) {
        zmq_msg_init(&parts[n]);
        if (zmq_msg_recv(&parts[n], socket, n ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&parts[n]);
            return n;
        }
        bool more = zmq_msg_more(&parts[n]);
        if (n + 1 < max)
            n++;
        else
            zmq_msg_close(&parts[n]); /* surplus frames are dropped */
        if (!more)
            return n;
    }
}

static void s_close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

/* ---- primary: the ring and the replicator thread ---- */

/* The ship hook (persister or syncer thread): keeps the round and wakes the replicator. */
static void s_ship(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc, bool rejournal)
{
    (void)rejournal; /* a follower compacts whole batches (kb_bank.c) */
    kb_replica_t *self = ctx;
    s_round_t *r = carls_xmalloc(sizeof *r + len);
    atomic_init(&r->refs, 1);
    r->epoch = epoch;
    r->crc = crc;
    r->len = len;
    r->shipped_us = carls_monotonic_us();
    if (len)
        memcpy(r->data, payload, len);
    pthread_mutex_lock(&self->mutex);
    if (self->ring_first > 0 && self->ring_first >= self->ring_count / 2) {
        memmove(self->ring, self->ring + self->ring_first, (self->ring_count - self->ring_first) * sizeof *self->ring);
        self->ring_count -= self->ring_first;
        self->ring_first = 0;
    }
    self->ring = carls_grow(self->ring, &self->ring_cap, self->ring_count + 1, sizeof *self->ring);
    self->ring[self->ring_count++] = r;
    self->ring_bytes += len;
    self->shipped_epoch = epoch;
    /* Oldest rounds go once over the budget (never the newest): a follower that still needed one is told
     * it is too far behind. */
    while (self->ring_bytes > self->buffer_bytes && self->ring_count - self->ring_first > 1) {
        s_round_t *old = self->ring[self->ring_first++];
        self->ring_bytes -= old->len;
        self->ring_base = old->epoch;
        s_round_unref(NULL, old);
    }
    pthread_mutex_unlock(&self->mutex);
    uint64_t one = 1;
    if (write(self->event_fd, &one, sizeof one) < 0)
        LOG_WARN("replicator wake-up failed: %s", strerror(errno));
}

static s_follower_t *s_follower_by_id(kb_replica_t *self, zmq_msg_t *id)
{
    for (size_t i = 0; i < self->n_followers; i++) {
        s_follower_t *f = &self->followers[i];
        if (f->id_len == zmq_msg_size(id) && memcmp(f->id, zmq_msg_data(id), f->id_len) == 0)
            return f;
    }
    return NULL;
}

/* A follower says hello: check it may follow from its last epoch, then stream from there. Mutex held. */
static void s_on_hello(kb_replica_t *self, zmq_msg_t *id, const Carls__ReplHello *h)
{
    const uint8_t *rid = zmq_msg_data(id);
    size_t rid_len = zmq_msg_size(id);
    uint64_t term = self->state->term;
    char text[512];
    if (h->term > term) {
        s_depose(self, h->term, "a follower has a newer term");
        return;
    }
    if (self->fenced) {
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_STALE_TERM,
                      "this primary was deposed");
        return;
    }
    if (h->shard_count != self->shard_count || h->shard_index != self->shard_index) {
        snprintf(text, sizeof text, "the follower is shard %u/%u, this primary %u/%u", h->shard_index,
                 h->shard_count, self->shard_index, self->shard_count);
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_WRONG_SHARD, text);
        return;
    }
    uint64_t last = h->last_epoch;
    if (last > self->shipped_epoch || (last > 0 && h->last_term != kb_term_of_epoch(self->state, last))) {
        snprintf(text, sizeof text, "the follower holds epoch %" PRIu64 " of term %" PRIu64 "; this primary's epoch "
                 "%" PRIu64 " is of term %" PRIu64 " and its newest is %" PRIu64 ": move the follower's data "
                 "directory away and seed it from a snapshot of this primary",
                 last, h->last_term, last, kb_term_of_epoch(self->state, last), self->shipped_epoch);
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_DIVERGED, text);
        LOG_WARN("follower %s: diverged: %s", h->member, text);
        return;
    }
    if (last < self->ring_base) {
        snprintf(text, sizeof text, "the follower needs the rounds after epoch %" PRIu64 "; this primary keeps "
                 "those after %" PRIu64 " (--replication-buffer-bytes): seed the follower from a snapshot "
                 "(kbctl snapshot NAME, copy DATA/snapshots/NAME, kb-server --restore NAME)", last, self->ring_base);
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_TOO_FAR_BEHIND, text);
        LOG_WARN("follower %s: too far behind: %s", h->member, text);
        return;
    }
    s_follower_t *f = NULL;
    for (size_t i = 0; i < self->n_followers && !f; i++)
        if (strcmp(self->followers[i].member, h->member) == 0)
            f = &self->followers[i];
    if (!f && self->n_followers < S_MAX_FOLLOWERS)
        f = &self->followers[self->n_followers++];
    if (!f) {
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_OTHER, "too many followers");
        return;
    }
    if (!f->live || strcmp(f->member, h->member) != 0)
        LOG_INFO("follower %s joined from epoch %" PRIu64 " (this primary is at %" PRIu64 ")", h->member, last,
                 self->shipped_epoch);
    snprintf(f->member, sizeof f->member, "%s", h->member);
    f->id_len = rid_len < sizeof f->id ? rid_len : sizeof f->id;
    memcpy(f->id, rid, f->id_len);
    f->sent_epoch = f->acked_epoch = last;
    f->heard_ms = carls_monotonic_ms();
    f->live = true;
}

/* Sends every live follower the rounds it has not been sent. Mutex held. */
static void s_stream(kb_replica_t *self)
{
    for (size_t i = 0; i < self->n_followers; i++) {
        s_follower_t *f = &self->followers[i];
        if (!f->live)
            continue;
        size_t at = self->ring_first;
        while (at < self->ring_count && self->ring[at]->epoch <= f->sent_epoch)
            at++;
        for (; at < self->ring_count; at++) {
            s_round_t *r = self->ring[at];
            Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
            Carls__ReplRecord rec = CARLS__REPL_RECORD__INIT;
            rec.term = self->state->term;
            rec.epoch = r->epoch;
            rec.prev_epoch = f->sent_epoch;
            rec.crc = r->crc;
            rec.sent_us = r->shipped_us;
            msg.body_case = CARLS__REPL_MESSAGE__BODY_RECORD;
            msg.record = &rec;
            if (s_send(self->router, f->id, f->id_len, &msg, r) != 0) {
                if (errno != EAGAIN) { /* gone: it says hello again when it comes back */
                    LOG_WARN("follower %s: lost (%s)", f->member, zmq_strerror(errno));
                    f->live = false;
                }
                break;
            }
            f->sent_epoch = r->epoch;
        }
    }
}

/* The K-th most advanced live follower's acknowledged epoch becomes the bank's replicated point. Mutex held. */
static void s_update_replicated(kb_replica_t *self)
{
    uint32_t k = kb_bank_min_replicas(self->bank);
    if (k == 0)
        return;
    uint64_t acked[S_MAX_FOLLOWERS];
    size_t n = 0;
    for (size_t i = 0; i < self->n_followers; i++)
        if (self->followers[i].live)
            acked[n++] = self->followers[i].acked_epoch;
    if (n < k)
        return;
    /* The k-th largest: sort descending (n <= 16). */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && acked[j] > acked[j - 1]; j--) {
            uint64_t t = acked[j];
            acked[j] = acked[j - 1];
            acked[j - 1] = t;
        }
    kb_bank_set_replicated(self->bank, acked[k - 1]);
}

static void s_on_primary_message(kb_replica_t *self, zmq_msg_t *parts, int n)
{
    Carls__ReplMessage *msg = n >= 2 ? carls__repl_message__unpack(NULL, zmq_msg_size(&parts[1]),
                                                                     zmq_msg_data(&parts[1])) : NULL;
    if (!msg) {
        LOG_WARN("replication: an undecodable message of %d frames dropped", n);
        return;
    }
    pthread_mutex_lock(&self->mutex);
    s_follower_t *f = s_follower_by_id(self, &parts[0]);
    switch (msg->body_case) {
    case CARLS__REPL_MESSAGE__BODY_HELLO:
        s_on_hello(self, &parts[0], msg->hello);
        break;
    case CARLS__REPL_MESSAGE__BODY_ACK:
        if (msg->ack->term > self->state->term)
            s_depose(self, msg->ack->term, "a follower acknowledged in a newer term");
        else if (f && f->live && msg->ack->term == self->state->term) {
            if (msg->ack->applied_epoch > f->acked_epoch)
                f->acked_epoch = msg->ack->applied_epoch;
            f->heard_ms = carls_monotonic_ms();
        }
        break;
    case CARLS__REPL_MESSAGE__BODY_REFUSE:
        if (msg->refuse->term > self->state->term)
            s_depose(self, msg->refuse->term, msg->refuse->text ? msg->refuse->text : "refused");
        else if (f)
            LOG_WARN("follower %s refused a round: %s", f->member, msg->refuse->text);
        if (f)
            f->live = false;
        break;
    default:
        break;
    }
    s_update_replicated(self);
    pthread_mutex_unlock(&self->mutex);
    carls__repl_message__free_unpacked(msg, NULL);
}

static void s_heartbeat(kb_replica_t *self)
{
    int64_t now = carls_monotonic_ms();
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplHeartbeat hb = CARLS__REPL_HEARTBEAT__INIT;
    hb.term = self->state->term;
    hb.shipped_epoch = self->shipped_epoch;
    hb.sent_us = carls_monotonic_us();
    msg.body_case = CARLS__REPL_MESSAGE__BODY_HEARTBEAT;
    msg.heartbeat = &hb;
    for (size_t i = 0; i < self->n_followers; i++) {
        s_follower_t *f = &self->followers[i];
        if (!f->live)
            continue;
        if (now - f->heard_ms > S_FOLLOWER_SILENT_MS) {
            LOG_WARN("follower %s: silent for %d ms, no longer counted", f->member, S_FOLLOWER_SILENT_MS);
            f->live = false;
            continue;
        }
        if (s_send(self->router, f->id, f->id_len, &msg, NULL) != 0 && errno != EAGAIN)
            f->live = false;
    }
}

static void *s_primary_main(void *arg)
{
    kb_replica_t *self = arg;
    int64_t last_beat = 0;
    while (!atomic_load(&self->primary_stop)) {
        zmq_pollitem_t items[2] = {{self->router, 0, ZMQ_POLLIN, 0}, {NULL, self->event_fd, ZMQ_POLLIN, 0}};
        zmq_poll(items, 2, S_HEARTBEAT_MS / 2);
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t count;
            if (read(self->event_fd, &count, sizeof count) < 0 && errno != EAGAIN)
                LOG_WARN("replicator: %s", strerror(errno));
        }
        zmq_msg_t parts[3];
        int n;
        while ((n = s_recv(self->router, parts, 3)) > 0) {
            s_on_primary_message(self, parts, n);
            s_close_parts(parts, n);
        }
        pthread_mutex_lock(&self->mutex);
        s_stream(self);
        if (carls_monotonic_ms() - last_beat >= S_HEARTBEAT_MS) {
            s_heartbeat(self);
            s_update_replicated(self);
            last_beat = carls_monotonic_ms();
        }
        pthread_mutex_unlock(&self->mutex);
    }
    return NULL;
}

/* The host of a tcp://HOST:PORT endpoint into host (for the default replication endpoint). */
static void s_endpoint_host(const char *endpoint, char *host, size_t len)
{
    const char *p = strncmp(endpoint, "tcp://", 6) == 0 ? endpoint + 6 : endpoint;
    const char *colon = strrchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    snprintf(host, len, "%.*s", (int)n, p);
}

/* Becomes the primary: binds the replication socket and starts the replicator. Mutex not held. */
static int s_start_primary(kb_replica_t *self, char *err, size_t errlen)
{
    char listen[300];
    if (self->listen)
        snprintf(listen, sizeof listen, "%s", self->listen);
    else {
        char host[256];
        s_endpoint_host(self->member, host, sizeof host);
        snprintf(listen, sizeof listen, "tcp://%s:*", host);
    }
    self->router = zmq_socket(self->zctx, ZMQ_ROUTER);
    int one = 1, linger = 0, hwm = 100000;
    zmq_setsockopt(self->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(self->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(self->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (zmq_bind(self->router, listen) != 0)
        return carls_errorf(err, errlen, -1, "--replication-listen %s: %s", listen, zmq_strerror(errno));
    size_t len = sizeof self->endpoint;
    zmq_getsockopt(self->router, ZMQ_LAST_ENDPOINT, self->endpoint, &len);
    self->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->event_fd < 0)
        return carls_errorf(err, errlen, -1, "eventfd: %s", strerror(errno));
    uint64_t committed = kb_bank_committed_epoch(self->bank);
    pthread_mutex_lock(&self->mutex);
    self->ring_base = self->shipped_epoch = committed;
    pthread_mutex_unlock(&self->mutex);
    kb_bank_set_min_replicas(self->bank, self->min_replicas);
    kb_bank_set_ship_hook(self->bank, s_ship, self);
    atomic_store(&self->primary_stop, false);
    if (pthread_create(&self->primary_thread, NULL, s_primary_main, self) != 0)
        CARLS_FATAL("cannot start the replicator");
    pthread_setname_np(self->primary_thread, "kb-replicator");
    pthread_mutex_lock(&self->mutex);
    self->primary_running = true;
    s_publish_role(self);
    pthread_mutex_unlock(&self->mutex);
    LOG_INFO("primary of term %" PRIu64 ": followers connect to %s (min replicas %u)", self->state->term,
             self->endpoint, self->min_replicas);
    return 0;
}

/* ---- follower ---- */

/* Asks the primary's client endpoint for its replication endpoint (the replica op). 0, or -1 with err. */
static int s_ask_endpoint(kb_replica_t *self, char *out, size_t len, char *err, size_t errlen)
{
    void *s = zmq_socket(self->zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    int rc = -1;
    if (zmq_connect(s, self->replica_of) != 0) {
        carls_errorf(err, errlen, -1, "--replica-of %s: %s", self->replica_of, zmq_strerror(errno));
        goto done;
    }
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Replica op = CARLS__REPLICA__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 1;
    req.op_case = CARLS__REQUEST__OP_REPLICA;
    req.replica = &op;
    uint8_t buf[64];
    size_t n = carls__request__pack(&req, buf);
    zmq_send(s, buf, n, 0);
    zmq_pollitem_t item = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 1000) <= 0) {
        carls_errorf(err, errlen, -1, "no answer from the primary at %s", self->replica_of);
        goto done;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) >= 0) {
        Carls__Response *resp = carls__response__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        if (!resp)
            carls_errorf(err, errlen, -1, "the primary at %s sent an undecodable reply", self->replica_of);
        else if (resp->status != CARLS__STATUS_CODE__STATUS_OK || resp->result_case != CARLS__RESPONSE__RESULT_REPLICA)
            carls_errorf(err, errlen, -1, "the primary at %s answered %s: %s", self->replica_of,
                         carls_status_name(resp->status), resp->error);
        else if (!resp->replica->replication_endpoint[0])
            carls_errorf(err, errlen, -1, "%s is not a primary (it is a %s)", self->replica_of, resp->replica->role);
        else {
            /* A primary bound to every address (tcp://0.0.0.0:P) is reached on the host we reached it at. */
            const char *ep = resp->replica->replication_endpoint;
            char host[256];
            s_endpoint_host(ep, host, sizeof host);
            if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0) {
                char theirs[256];
                s_endpoint_host(self->replica_of, theirs, sizeof theirs);
                snprintf(out, len, "tcp://%s%s", theirs, strrchr(ep, ':'));
            } else
                snprintf(out, len, "%s", ep);
            rc = 0;
        }
        if (resp)
            carls__response__free_unpacked(resp, NULL);
    }
    zmq_msg_close(&m);
done:
    zmq_close(s);
    return rc;
}

static void s_hello(kb_replica_t *self, void *dealer)
{
    uint64_t last = kb_bank_committed_epoch(self->bank);
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplHello h = CARLS__REPL_HELLO__INIT;
    pthread_mutex_lock(&self->mutex);
    h.term = self->have_state ? self->state->term : 0;
    h.last_term = self->have_state ? kb_term_of_epoch(self->state, last) : 0;
    pthread_mutex_unlock(&self->mutex);
    h.last_epoch = last;
    h.member = self->member;
    h.shard_index = self->shard_index;
    h.shard_count = self->shard_count;
    msg.body_case = CARLS__REPL_MESSAGE__BODY_HELLO;
    msg.hello = &h;
    s_send(dealer, NULL, 0, &msg, NULL);
}

/* A record of `term` at `epoch` is to be applied: 0 when its term may be applied here (the history noted and
 * saved when it is a new term), -1 when it is older than this member's term. */
static int s_accept_term(kb_replica_t *self, uint64_t term, uint64_t epoch)
{
    int rc = 0;
    pthread_mutex_lock(&self->mutex);
    if (!self->have_state) {
        kb_term_init(self->state, self->member, epoch);
        self->state->term = self->state->history[0].term = term;
        self->state->role = KB_TERM_FOLLOWER;
        s_save(self);
        s_publish_role(self);
    } else if (term < self->state->term) {
        rc = -1;
    } else if (term != kb_term_of_epoch(self->state, epoch)) {
        if (kb_term_record(self->state, term, epoch) != 0)
            rc = -1;
        else {
            s_save(self);
            s_publish_role(self);
        }
    }
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

/* Applies one record (frames: message, payload). Returns 1 when applied, 0 when dropped, -1 when the stream
 * must start again (a gap, or the round did not apply). */
static int s_on_record(kb_replica_t *self, void *dealer, const Carls__ReplRecord *rec, zmq_msg_t *payload)
{
    uint64_t committed = kb_bank_committed_epoch(self->bank);
    if (rec->epoch <= committed)
        return 0; /* sent again after a hello that crossed it */
    if (rec->prev_epoch != committed) {
        LOG_WARN("replication: round %" PRIu64 " follows %" PRIu64 " but %" PRIu64 " is the last applied; asking "
                 "again", rec->epoch, rec->prev_epoch, committed);
        return -1;
    }
    if (s_accept_term(self, rec->term, rec->epoch) != 0) {
        pthread_mutex_lock(&self->mutex);
        uint64_t mine = self->state->term;
        pthread_mutex_unlock(&self->mutex);
        s_send_refuse(dealer, NULL, 0, mine, CARLS__REPL_REFUSAL__REPL_REFUSE_STALE_TERM,
                      "a round of an older term than this follower's");
        return 0;
    }
    char err[512];
    if (kb_bank_apply_replicated(self->bank, rec->epoch, zmq_msg_data(payload), zmq_msg_size(payload),
                                 rec->crc, err, sizeof err) != 0) {
        LOG_ERROR("replication: round %" PRIu64 " not applied: %s", rec->epoch, err);
        return -1;
    }
    return 1;
}

static void *s_follower_main(void *arg)
{
    kb_replica_t *self = arg;
    char endpoint[300] = "", err[512];
    int64_t logged = 0;
    void *dealer = NULL;
    int64_t heard = 0, hello_at = 0, wait_until = 0;
    int64_t echo = 0;
    while (!atomic_load(&self->follower_stop)) {
        int64_t now = carls_monotonic_ms();
        if (!dealer) {
            if (now < wait_until || s_ask_endpoint(self, endpoint, sizeof endpoint, err, sizeof err) != 0) {
                if (now >= wait_until && now - logged >= 5000) {
                    LOG_WARN("replication: %s; trying again", err);
                    logged = now;
                }
                struct timespec pause = {0, 200 * 1000 * 1000};
                nanosleep(&pause, NULL);
                continue;
            }
            dealer = zmq_socket(self->zctx, ZMQ_DEALER);
            int linger = 0, hwm = 100000;
            zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
            zmq_setsockopt(dealer, ZMQ_RCVHWM, &hwm, sizeof hwm);
            if (zmq_connect(dealer, endpoint) != 0) {
                LOG_ERROR("replication: cannot connect to %s: %s", endpoint, zmq_strerror(errno));
                zmq_close(dealer);
                dealer = NULL;
                wait_until = now + 1000;
                continue;
            }
            LOG_INFO("following %s (replication endpoint %s) from epoch %" PRIu64, self->replica_of, endpoint,
                     kb_bank_committed_epoch(self->bank));
            s_hello(self, dealer);
            heard = hello_at = now;
        }
        zmq_pollitem_t item = {dealer, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 50);
        bool applied = false, restart = false;
        zmq_msg_t parts[3];
        int n;
        while (!restart && (n = s_recv(dealer, parts, 3)) > 0) {
            Carls__ReplMessage *msg = carls__repl_message__unpack(NULL, zmq_msg_size(&parts[0]), zmq_msg_data(&parts[0]));
            if (!msg) {
                LOG_WARN("replication: an undecodable message from the primary dropped");
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_RECORD && n == 2) {
                int rc = s_on_record(self, dealer, msg->record, &parts[1]);
                applied |= rc == 1;
                restart = rc < 0;
                if (rc == 1)
                    echo = msg->record->sent_us;
                heard = carls_monotonic_ms();
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_HEARTBEAT) {
                pthread_mutex_lock(&self->mutex);
                uint64_t mine = self->have_state ? self->state->term : 0;
                pthread_mutex_unlock(&self->mutex);
                if (msg->heartbeat->term < mine)
                    s_send_refuse(dealer, NULL, 0, mine, CARLS__REPL_REFUSAL__REPL_REFUSE_STALE_TERM,
                                  "a heartbeat of an older term than this follower's");
                heard = carls_monotonic_ms();
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_REFUSE) {
                LOG_ERROR("replication: the primary refused this follower: %s", msg->refuse->text);
                wait_until = carls_monotonic_ms() + 5000;
                restart = true;
            }
            if (msg)
                carls__repl_message__free_unpacked(msg, NULL);
            s_close_parts(parts, n);
        }
        if (applied) {
            Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
            Carls__ReplAck ack = CARLS__REPL_ACK__INIT;
            pthread_mutex_lock(&self->mutex);
            ack.term = self->have_state ? self->state->term : 0;
            pthread_mutex_unlock(&self->mutex);
            ack.applied_epoch = kb_bank_committed_epoch(self->bank);
            ack.echo_sent_us = echo;
            msg.body_case = CARLS__REPL_MESSAGE__BODY_ACK;
            msg.ack = &ack;
            s_send(dealer, NULL, 0, &msg, NULL);
        }
        now = carls_monotonic_ms();
        if (!restart && now - heard > S_PRIMARY_SILENT_MS && now - hello_at > S_PRIMARY_SILENT_MS) {
            LOG_WARN("replication: nothing from the primary for %d ms; connecting again", S_PRIMARY_SILENT_MS);
            restart = true;
        }
        if (restart) {
            /* A new connection: the primary answers its hello from the last epoch applied here. */
            zmq_close(dealer);
            dealer = NULL;
        }
    }
    if (dealer)
        zmq_close(dealer);
    return NULL;
}

static void s_start_follower(kb_replica_t *self)
{
    atomic_store(&self->follower_stop, false);
    if (pthread_create(&self->follower_thread, NULL, s_follower_main, self) != 0)
        CARLS_FATAL("cannot start the replica thread");
    pthread_setname_np(self->follower_thread, "kb-replica");
    self->follower_running = true;
}

static void s_stop_follower(kb_replica_t *self)
{
    if (!self->follower_running)
        return;
    atomic_store(&self->follower_stop, true);
    pthread_join(self->follower_thread, NULL);
    self->follower_running = false;
}

/* ---- the replica op (kbctl replica) ---- */

static void s_status(kb_replica_t *self, Carls__ReplicaResult *res)
{
    uint64_t committed = kb_bank_committed_epoch(self->bank);
    pthread_mutex_lock(&self->mutex);
    res->role = carls_xmalloc(16);
    snprintf(res->role, 16, "%s", s_role_name(self));
    res->term = self->have_state ? self->state->term : 0;
    res->last_term = self->have_state ? kb_term_of_epoch(self->state, committed) : 0;
    res->committed_epoch = committed;
    res->durable_epoch = kb_bank_durable_epoch(self->bank);
    res->replication_endpoint = carls_xmalloc(sizeof self->endpoint);
    snprintf(res->replication_endpoint, sizeof self->endpoint, "%s", self->primary_running && !self->fenced ? self->endpoint : "");
    size_t plen = self->replica_of ? strlen(self->replica_of) + 1 : 1;
    res->primary = carls_xmalloc(plen);
    snprintf(res->primary, plen, "%s", self->replica_of ? self->replica_of : "");
    res->min_replicas = kb_bank_min_replicas(self->bank);
    res->fenced = self->fenced;
    int64_t now_us = carls_monotonic_us();
    res->n_followers = self->n_followers;
    res->followers = carls_xcalloc(self->n_followers + 1, sizeof *res->followers);
    for (size_t i = 0; i < self->n_followers; i++) {
        const s_follower_t *f = &self->followers[i];
        Carls__ReplicaFollower *out = carls_xmalloc(sizeof *out);
        carls__replica_follower__init(out);
        out->member = carls_xmalloc(sizeof f->member);
        snprintf(out->member, sizeof f->member, "%s", f->member);
        out->acked_epoch = f->acked_epoch;
        out->live = f->live;
        for (size_t at = self->ring_first; at < self->ring_count; at++) {
            if (self->ring[at]->epoch > f->acked_epoch) {
                out->lag_ms = (uint64_t)((now_us - self->ring[at]->shipped_us) / 1000);
                break;
            }
        }
        res->followers[i] = out;
    }
    pthread_mutex_unlock(&self->mutex);
}

static void s_free_result(void *ctx, Carls__ReplicaResult *res)
{
    (void)ctx;
    free(res->role);
    free(res->replication_endpoint);
    free(res->primary);
    for (size_t i = 0; i < res->n_followers; i++) {
        free(res->followers[i]->member);
        free(res->followers[i]);
    }
    free(res->followers);
}

static int s_promote(kb_replica_t *self, uint64_t term, char *err, size_t errlen)
{
    pthread_mutex_lock(&self->mutex);
    bool primary = self->primary_running;
    uint64_t mine = self->have_state ? self->state->term : 0;
    pthread_mutex_unlock(&self->mutex);
    if (primary)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "this member is a primary already (term %" PRIu64 ")", mine);
    if (term <= mine)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "promote needs a term above this member's %" PRIu64 " (--term %" PRIu64 " given)", mine,
                            term);
    s_stop_follower(self); /* nothing more of the old primary is applied */
    uint64_t committed = kb_bank_committed_epoch(self->bank);
    pthread_mutex_lock(&self->mutex);
    if (!self->have_state) {
        kb_term_init(self->state, self->member, committed + 1);
        self->state->term = self->state->history[0].term = term;
    } else if (kb_term_record(self->state, term, committed + 1) != 0) {
        pthread_mutex_unlock(&self->mutex);
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INTERNAL, "term %" PRIu64 " cannot follow "
                            "this member's history", term);
    }
    self->state->term = term;
    self->state->role = KB_TERM_PRIMARY;
    int saved = s_save(self);
    free(self->replica_of);
    self->replica_of = NULL;
    pthread_mutex_unlock(&self->mutex);
    if (saved != 0)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INTERNAL, "the new term could not be saved in "
                            "%s/" KB_TERM_FILE, self->data_dir);
    char why[512];
    if (kb_bank_promote(self->bank, why, sizeof why) != 0 || s_start_primary(self, why, sizeof why) != 0)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INTERNAL, "promotion failed: %s", why);
    LOG_INFO("promoted to primary of term %" PRIu64 " at epoch %" PRIu64, term, committed);
    return 0;
}

static int s_fence(kb_replica_t *self, uint64_t term, char *err, size_t errlen)
{
    pthread_mutex_lock(&self->mutex);
    uint64_t mine = self->have_state ? self->state->term : 0;
    int rc = 0;
    if (!self->have_state)
        rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                          "this member has applied nothing yet: there is no term to raise");
    else if (term < mine)
        rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                          "fence needs a term at or above this member's %" PRIu64 " (--term %" PRIu64 " given)", mine,
                          term);
    else if (term > mine || self->primary_running)
        s_depose(self, term, "fenced by the coordinator");
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

static int s_handle(void *ctx, const Carls__Replica *req, Carls__ReplicaResult *res, char *err, size_t errlen)
{
    kb_replica_t *self = ctx;
    int rc = 0;
    switch (req->action) {
    case CARLS__REPLICA_ACTION__REPLICA_STATUS:
        break;
    case CARLS__REPLICA_ACTION__REPLICA_PROMOTE:
        rc = s_promote(self, req->term, err, errlen);
        break;
    case CARLS__REPLICA_ACTION__REPLICA_FENCE:
        rc = s_fence(self, req->term, err, errlen);
        break;
    case CARLS__REPLICA_ACTION__REPLICA_SET_MIN_REPLICAS:
        if (!kb_bank_sync(self->bank) && req->min_replicas)
            rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                              "min replicas need --durability sync");
        else
            kb_bank_set_min_replicas(self->bank, req->min_replicas);
        break;
    default:
        rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "unknown replica action %d",
                          (int)req->action);
    }
    s_status(self, res);
    return rc;
}

/* ---- life ---- */

int kb_replica_bank_mode(const kb_replica_options_t *opts, bool *replica, char *err, size_t errlen)
{
    kb_term_state_t *st = carls_xmalloc(sizeof *st);
    int rc = kb_term_load(opts->data_dir, st, err, errlen);
    free(st);
    if (rc != 0 && rc != -ENOENT)
        return -1;
    *replica = opts->replica_of != NULL || rc == 0;
    return 0;
}

static char *s_dup(const char *s)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        CARLS_FATAL("out of memory");
    return d;
}

int kb_replica_new(kb_bank_t *bank, kb_service_t *service, const kb_replica_options_t *opts, kb_replica_t **out,
                   char *err, size_t errlen)
{
    *out = NULL;
    kb_replica_t *self = carls_xcalloc(1, sizeof *self);
    self->bank = bank;
    self->service = service;
    self->data_dir = s_dup(opts->data_dir);
    self->member = s_dup(opts->member);
    self->replica_of = s_dup(opts->replica_of);
    self->listen = s_dup(opts->listen);
    self->min_replicas = opts->min_replicas;
    self->shard_index = opts->shard_index;
    self->shard_count = opts->shard_count;
    self->buffer_bytes = opts->buffer_bytes ? opts->buffer_bytes : S_DEFAULT_BUFFER_BYTES;
    self->event_fd = -1;
    pthread_mutex_init(&self->mutex, NULL);
    self->state = carls_xcalloc(1, sizeof *self->state);
    self->zctx = zmq_ctx_new();
    if (!self->zctx)
        CARLS_FATAL("zmq_ctx_new failed");
    int rc = kb_term_load(self->data_dir, self->state, err, errlen);
    if (rc != 0 && rc != -ENOENT)
        goto fail;
    self->have_state = rc == 0;
    if (kb_bank_is_replica(bank) != (self->replica_of || self->have_state)) {
        carls_errorf(err, errlen, -1, "the bank was opened in the wrong mode for this member (kb_replica_bank_mode)");
        goto fail;
    }
    kb_service_replication_t hooks = {s_handle, s_free_result, self};
    kb_service_set_replication(service, &hooks);
    if (self->replica_of) {
        if (self->have_state && self->state->role != KB_TERM_FOLLOWER) {
            self->state->role = KB_TERM_FOLLOWER;
            s_save(self);
        }
        pthread_mutex_lock(&self->mutex);
        s_publish_role(self);
        pthread_mutex_unlock(&self->mutex);
        s_start_follower(self);
        LOG_INFO("follower of %s%s", self->replica_of, self->have_state ? "" : " (a new member)");
    } else if (self->have_state) {
        if (self->state->role != KB_TERM_STANDBY) {
            self->state->role = KB_TERM_STANDBY;
            s_save(self);
        }
        pthread_mutex_lock(&self->mutex);
        s_publish_role(self);
        pthread_mutex_unlock(&self->mutex);
        LOG_WARN("standby (term %" PRIu64 "): this member has replicated before (%s/" KB_TERM_FILE ") and was "
                 "started without --replica-of, so it refuses writes until it is promoted (kbctl replica promote "
                 "--term %" PRIu64 ")", self->state->term, self->data_dir, self->state->term + 1);
    } else {
        kb_term_init(self->state, self->member, kb_bank_committed_epoch(bank) + 1);
        if (kb_term_save(self->data_dir, self->state, err, errlen) != 0)
            goto fail;
        self->have_state = true;
        if (s_start_primary(self, err, errlen) != 0)
            goto fail;
    }
    *out = self;
    return 0;
fail:
    kb_replica_destroy(&self);
    return -1;
}

const char *kb_replica_endpoint(kb_replica_t *self) { return self->endpoint; }

void kb_replica_destroy(kb_replica_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_replica_t *self = *self_p;
    s_stop_follower(self);
    if (self->primary_running) {
        kb_bank_set_ship_hook(self->bank, NULL, NULL);
        atomic_store(&self->primary_stop, true);
        pthread_join(self->primary_thread, NULL);
    }
    if (self->router)
        zmq_close(self->router);
    if (self->zctx)
        zmq_ctx_term(self->zctx);
    if (self->event_fd >= 0)
        close(self->event_fd);
    for (size_t i = self->ring_first; i < self->ring_count; i++)
        s_round_unref(NULL, self->ring[i]);
    free(self->ring);
    free(self->state);
    free(self->data_dir);
    free(self->member);
    free(self->replica_of);
    free(self->listen);
    pthread_mutex_destroy(&self->mutex);
    free(self);
    *self_p = NULL;
}
