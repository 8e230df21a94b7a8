/* kb-server's ZAP handler and the server socket's CURVE set-up. The contract is in kb_zap.h;
 * docs/SECURITY.md is the operator's guide.
 *
 * ZAP 1.0 (RFC 27) as libzmq speaks it: when a CURVE client has proved it holds the secret key of the
 * public key it presents, the server socket's session sends a request to "inproc://zeromq.zap.01" in its
 * context, as an envelope (empty delimiter) followed by
 *     version "1.0" | request id | domain | peer address | routing id | mechanism | credentials...
 * where CURVE has exactly one credentials frame, the client's 32-byte public key. The handler answers
 *     version "1.0" | request id | status code | status text | user id | metadata
 * and libzmq lets the connection deliver messages only on status "200". A REP socket strips and restores
 * the envelope for us. */
#include "kb_zap.h"

#include "log.h"
#include "util.h"

#include <zmq.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define S_ZAP_MAX_FRAMES 8      /* CURVE requests have 7; more is malformed, and extra frames are drained */
#define S_POLL_MS 100           /* how often the handler thread looks at its stop flag */
#define S_DENIED_LOG_FIRST 20   /* log every refusal up to this many, then one in S_DENIED_LOG_EVERY, so a */
#define S_DENIED_LOG_EVERY 1000 /* client hammering the port cannot flood the log */

/* ZMQ_ZAP_ENFORCE_DOMAIN is a draft option of libzmq 4.3 (hidden from zmq.h unless ZMQ_BUILD_DRAFT_API).
 * With it set, a CURVE server refuses clients when no ZAP handler answers instead of admitting all of them.
 * The number is fixed in libzmq; a library without the option answers EINVAL and we rely on the handler
 * being started first (kb_auth_setup_server insists on it). */
#ifdef ZMQ_ZAP_ENFORCE_DOMAIN
#define S_ZAP_ENFORCE_DOMAIN ZMQ_ZAP_ENFORCE_DOMAIN
#else
#define S_ZAP_ENFORCE_DOMAIN 93
#endif

/* ---- the ZAP handler --------------------------------------------------------------------------------- */

struct kb_auth {
    void *socket;                  /* REP bound to S_ZAP_ENDPOINT; only the thread touches it after start */
    kb_auth_allow_t *allow;        /* owned; read-only once the thread runs */
    pthread_t thread;
    atomic_bool stop;              /* set by kb_auth_destroy */
    atomic_uint_fast64_t allowed;  /* requests answered 200 */
    atomic_uint_fast64_t denied;   /* requests answered anything else */
};

/* True when msg holds exactly the bytes of the C string text. */
static bool s_frame_is(zmq_msg_t *msg, const char *text)
{
    size_t len = strlen(text);
    return zmq_msg_size(msg) == len && memcmp(zmq_msg_data(msg), text, len) == 0;
}

/* Copies a frame into buf as printable text (others as '?'), for log lines about a peer. */
static void s_frame_text(zmq_msg_t *msg, char *buf, size_t len)
{
    size_t n = zmq_msg_size(msg);
    if (n > len - 1)
        n = len - 1;
    const unsigned char *data = zmq_msg_data(msg);
    for (size_t i = 0; i < n; i++)
        buf[i] = (data[i] >= 0x20 && data[i] < 0x7f) ? (char)data[i] : '?';
    buf[n] = '\0';
}

/* Decides one request of `total` frames (the first `kept` of them in frames). Sets *code and *text to the
 * status to answer and fills user_id (empty unless 200) with the client key in Z85, which libzmq then
 * attaches to every message of the connection as the "User-Id" property. */
static void s_decide(kb_auth_t *self, zmq_msg_t *frames, int kept, int total, const char **code, const char **text,
                     char user_id[KB_AUTH_Z85_LEN + 1])
{
    user_id[0] = '\0';
    if (total < 6 || !s_frame_is(&frames[0], "1.0")) {
        *code = "500";
        *text = "malformed ZAP request";
        return;
    }
    if (!s_frame_is(&frames[2], KB_AUTH_DOMAIN)) {
        *code = "400";
        *text = "unknown ZAP domain";
        return;
    }
    if (!s_frame_is(&frames[5], "CURVE")) {
        *code = "400";
        *text = "only CURVE clients are accepted";
        return;
    }
    if (total != 7 || kept != 7 || zmq_msg_size(&frames[6]) != KB_AUTH_KEY_BYTES) {
        *code = "500";
        *text = "malformed CURVE credentials";
        return;
    }
    kb_auth_key_t key;
    memcpy(key.bytes, zmq_msg_data(&frames[6]), KB_AUTH_KEY_BYTES);
    if (kb_auth_allow_contains(self->allow, &key)) {
        *code = "200";
        *text = "OK";
        kb_auth_key_to_z85(&key, user_id);
        return;
    }
    *code = "400";
    *text = "client key not on the allow-list";
}

/* Sends the six reply frames. 0, or -1 when the socket failed (context terminating). */
static int s_reply(void *socket, zmq_msg_t *request_id, const char *code, const char *text, const char *user_id)
{
    struct {
        const void *data;
        size_t len;
    } parts[6] = {
        {"1.0", 3},
        {request_id ? zmq_msg_data(request_id) : "", request_id ? zmq_msg_size(request_id) : 0},
        {code, strlen(code)},
        {text, strlen(text)},
        {user_id, strlen(user_id)},
        {"", 0}, /* metadata: none */
    };
    for (int i = 0; i < 6; i++) {
        while (zmq_send(socket, parts[i].data, parts[i].len, i < 5 ? ZMQ_SNDMORE : 0) < 0) {
            if (errno != EINTR)
                return -1;
        }
    }
    return 0;
}

/* Receives one request, answers it and counts the answer. 0, or -1 when the socket failed (context
 * terminating), which ends the thread. */
static int s_handle_request(kb_auth_t *self)
{
    zmq_msg_t frames[S_ZAP_MAX_FRAMES];
    int kept = 0, total = 0, rc = 0;
    bool more = true;
    while (more) {
        /* Frames past S_ZAP_MAX_FRAMES are received into a scratch message and dropped: REP must read the
         * whole request before it may answer. */
        zmq_msg_t scratch;
        zmq_msg_t *msg = kept < S_ZAP_MAX_FRAMES ? &frames[kept] : &scratch;
        zmq_msg_init(msg);
        while (zmq_msg_recv(msg, self->socket, 0) < 0) {
            if (errno != EINTR) {
                zmq_msg_close(msg);
                rc = -1;
                goto cleanup;
            }
        }
        more = zmq_msg_more(msg);
        total++;
        if (msg == &scratch)
            zmq_msg_close(&scratch);
        else
            kept++;
    }

    const char *code, *text;
    char user_id[KB_AUTH_Z85_LEN + 1];
    s_decide(self, frames, kept, total, &code, &text, user_id);
    /* Counted before answering, so whoever has seen the outcome of a handshake also sees it counted. */
    if (strcmp(code, "200") == 0) {
        atomic_fetch_add(&self->allowed, 1);
        LOG_DEBUG("ZAP: accepted client %s", user_id);
    } else {
        uint64_t denied = atomic_fetch_add(&self->denied, 1) + 1;
        if (denied <= S_DENIED_LOG_FIRST || denied % S_DENIED_LOG_EVERY == 0) {
            char address[64] = "?", client[KB_AUTH_Z85_LEN + 1] = "?";
            if (kept >= 4)
                s_frame_text(&frames[3], address, sizeof address);
            if (kept >= 7 && zmq_msg_size(&frames[6]) == KB_AUTH_KEY_BYTES) {
                kb_auth_key_t key;
                memcpy(key.bytes, zmq_msg_data(&frames[6]), KB_AUTH_KEY_BYTES);
                kb_auth_key_to_z85(&key, client);
            }
            LOG_WARN("ZAP: refused client %s from %s: %s %s (%" PRIu64 " refused so far)", client, address, code,
                     text, denied);
        }
    }
    rc = s_reply(self->socket, kept >= 2 ? &frames[1] : NULL, code, text, user_id);
cleanup:
    for (int i = 0; i < kept; i++)
        zmq_msg_close(&frames[i]);
    return rc;
}

/* The handler thread: answers requests until the stop flag is set or the context terminates, then closes
 * the socket (a context cannot finish terminating while the socket is open). */
static void *s_thread(void *arg)
{
    kb_auth_t *self = arg;
    zmq_pollitem_t item = {.socket = self->socket, .events = ZMQ_POLLIN};
    while (!atomic_load(&self->stop)) {
        int n = zmq_poll(&item, 1, S_POLL_MS);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != ETERM)
                LOG_ERROR("ZAP handler: zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (n > 0 && (item.revents & ZMQ_POLLIN) && s_handle_request(self) != 0) {
            if (errno != ETERM)
                LOG_ERROR("ZAP handler: %s", zmq_strerror(errno));
            break;
        }
    }
    zmq_close(self->socket);
    self->socket = NULL;
    return NULL;
}

kb_auth_t *kb_auth_new(void *zmq_ctx, kb_auth_allow_t **allow_p, char *err, size_t errlen)
{
    assert(zmq_ctx && allow_p && *allow_p);
    kb_auth_t *self = carls_xcalloc(1, sizeof *self);
    self->allow = *allow_p;
    *allow_p = NULL;
    atomic_init(&self->stop, false);
    atomic_init(&self->allowed, 0);
    atomic_init(&self->denied, 0);

    if (kb_auth_require_curve(err, errlen) != KB_AUTH_OK)
        goto fail;
    self->socket = zmq_socket(zmq_ctx, ZMQ_REP);
    if (!self->socket) {
        carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot create the ZAP socket: %s", zmq_strerror(errno));
        goto fail;
    }
    int linger = 0;
    zmq_setsockopt(self->socket, ZMQ_LINGER, &linger, sizeof linger);
    /* Bound here, before the thread exists, so the handler is in place when this function returns. */
    if (zmq_bind(self->socket, S_ZAP_ENDPOINT) != 0) {
        carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot bind %s: %s%s", S_ZAP_ENDPOINT, zmq_strerror(errno),
               errno == EADDRINUSE ? " (another ZAP handler runs in this context)" : "");
        goto fail;
    }
    /* pthread_create is a full barrier, so handing the socket to the thread is safe. */
    int prc = pthread_create(&self->thread, NULL, s_thread, self);
    if (prc != 0) {
        carls_errorf(err, errlen, KB_AUTH_EIO, "cannot start the ZAP thread: %s", strerror(prc));
        goto fail;
    }
    pthread_setname_np(self->thread, "kb-zap");
    LOG_INFO("ZAP handler: %zu client key(s) allowed", kb_auth_allow_count(self->allow));
    return self;

fail:
    if (self->socket)
        zmq_close(self->socket);
    kb_auth_allow_destroy(&self->allow);
    free(self);
    return NULL;
}

void kb_auth_destroy(kb_auth_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_auth_t *self = *self_p;
    atomic_store(&self->stop, true);
    pthread_join(self->thread, NULL);
    kb_auth_allow_destroy(&self->allow);
    free(self);
    *self_p = NULL;
}

uint64_t kb_auth_allowed(const kb_auth_t *self)
{
    assert(self);
    return atomic_load(&self->allowed);
}

uint64_t kb_auth_denied(const kb_auth_t *self)
{
    assert(self);
    return atomic_load(&self->denied);
}

/* ---- socket set-up ----------------------------------------------------------------------------------- */

int kb_auth_setup_server(void *socket, const kb_auth_keypair_t *server, const kb_auth_t *auth, char *err,
                         size_t errlen)
{
    assert(socket && server);
    if (!auth)
        return carls_errorf(err, errlen, KB_AUTH_EINVAL,
                      "a CURVE server needs its ZAP handler running first (without one every client key would be "
                      "accepted)");
    int rc = kb_auth_require_curve(err, errlen);
    if (rc != KB_AUTH_OK)
        return rc;
    int one = 1;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, server->secret_key.bytes, KB_AUTH_KEY_BYTES) != 0 ||
        zmq_setsockopt(socket, ZMQ_ZAP_DOMAIN, KB_AUTH_DOMAIN, strlen(KB_AUTH_DOMAIN)) != 0)
        return carls_errorf(err, errlen, KB_AUTH_EZMQ, "cannot make the socket a CURVE server: %s", zmq_strerror(errno));
    /* Defence in depth: should the handler ever be gone, refuse clients rather than admit them all. */
    if (zmq_setsockopt(socket, S_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0)
        LOG_DEBUG("libzmq has no ZMQ_ZAP_ENFORCE_DOMAIN (%s); relying on the running ZAP handler",
                  zmq_strerror(errno));
    return KB_AUTH_OK;
}
