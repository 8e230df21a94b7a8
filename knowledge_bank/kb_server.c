#include "kb_server.h"

#include "kb_zap.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

struct kb_server {
    kb_service_t *service;
    kb_server_options_t opts;
    void *ctx;
    void *frontend; /* ROUTER, clients */
    void *backend;  /* DEALER, workers */
    char backend_endpoint[64];
    char endpoint[256];
    pthread_t *workers;
    uint32_t worker_count;
    atomic_int stop_workers;
    atomic_int workers_alive;
    kb_auth_t *auth; /* CURVE only */
};

/* Receives the rest of a multi-part message and discards it. */
static void s_drain(void *socket)
{
    int more = 1;
    size_t more_size = sizeof more;
    while (zmq_getsockopt(socket, ZMQ_RCVMORE, &more, &more_size) == 0 && more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, socket, 0) < 0) {
            zmq_msg_close(&part);
            return;
        }
        zmq_msg_close(&part);
    }
}

static void *s_worker_main(void *arg)
{
    kb_server_t *self = arg;
    void *socket = zmq_socket(self->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
    if (!socket || zmq_connect(socket, self->backend_endpoint) != 0)
        CARLS_FATAL("worker cannot connect to %s: %s", self->backend_endpoint, zmq_strerror(errno));

    zmq_pollitem_t item = {.socket = socket, .events = ZMQ_POLLIN};
    while (!atomic_load(&self->stop_workers)) {
        int n = zmq_poll(&item, 1, 100);
        if (n < 0 && errno == ETERM)
            break;
        if (n <= 0)
            continue;
        zmq_msg_t identity, request;
        zmq_msg_init(&identity);
        zmq_msg_init(&request);
        if (zmq_msg_recv(&identity, socket, 0) < 0) {
            zmq_msg_close(&identity);
            zmq_msg_close(&request);
            continue;
        }
        /* Exactly [identity, request] is a request; anything else cannot be answered reliably. */
        int ok = zmq_msg_more(&identity) && zmq_msg_recv(&request, socket, 0) >= 0 && !zmq_msg_more(&request);
        if (!ok) {
            s_drain(socket);
            kb_service_count_dropped(self->service);
            zmq_msg_close(&identity);
            zmq_msg_close(&request);
            continue;
        }
        uint8_t *reply = NULL;
        size_t reply_len = 0;
        kb_service_handle(self->service, zmq_msg_data(&request), zmq_msg_size(&request), &reply, &reply_len);
        zmq_msg_close(&request);
        if (zmq_msg_send(&identity, socket, ZMQ_SNDMORE) < 0 || zmq_send(socket, reply, reply_len, 0) < 0)
            LOG_WARN("reply not sent: %s", zmq_strerror(errno));
        zmq_msg_close(&identity);
        free(reply);
    }
    zmq_close(socket);
    atomic_fetch_sub(&self->workers_alive, 1);
    return NULL;
}

int kb_server_new(kb_service_t *service, const kb_server_options_t *opts, kb_server_t **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    kb_server_t *self = carls_xcalloc(1, sizeof *self);
    self->service = service;
    self->opts = *opts;
    if (self->opts.threads == 0)
        self->opts.threads = 1;
    self->ctx = zmq_ctx_new();
    if (!self->ctx)
        CARLS_FATAL("zmq_ctx_new failed");
    self->frontend = zmq_socket(self->ctx, ZMQ_ROUTER);
    self->backend = zmq_socket(self->ctx, ZMQ_DEALER);
    if (!self->frontend || !self->backend)
        CARLS_FATAL("zmq_socket failed: %s", zmq_strerror(errno));

    int64_t max_size = (int64_t)opts->max_message_bytes * 2;
    int linger = 1000;
    /* Replies to clients that stopped reading must not pile up without bound. */
    int hwm = 10000;
    zmq_setsockopt(self->frontend, ZMQ_MAXMSGSIZE, &max_size, sizeof max_size);
    zmq_setsockopt(self->frontend, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(self->frontend, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(self->frontend, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (opts->curve_secret_file) {
        kb_auth_keypair_t pair;
        kb_auth_allow_t *allow = NULL;
        if (!opts->curve_allow_path) {
            snprintf(err, errlen, "CURVE needs an allow-list of client keys as well as the secret key");
            goto fail;
        }
        if (kb_auth_load_secret(opts->curve_secret_file, &pair, err, errlen) != 0 ||
            kb_auth_allow_load(opts->curve_allow_path, &allow, err, errlen) != 0)
            goto fail;
        size_t allowed = kb_auth_allow_count(allow);
        self->auth = kb_auth_new(self->ctx, &allow, err, errlen);
        if (!self->auth || kb_auth_setup_server(self->frontend, &pair, self->auth, err, errlen) != 0)
            goto fail;
        LOG_INFO("CURVE on: %zu allowed client keys from %s", allowed, opts->curve_allow_path);
    }
    if (zmq_bind(self->frontend, opts->endpoint) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", opts->endpoint, zmq_strerror(errno));
        goto fail;
    }
    size_t len = sizeof self->endpoint;
    zmq_getsockopt(self->frontend, ZMQ_LAST_ENDPOINT, self->endpoint, &len);

    snprintf(self->backend_endpoint, sizeof self->backend_endpoint, "inproc://kb-workers-%p", (void *)self);
    zmq_setsockopt(self->backend, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(self->backend, self->backend_endpoint) != 0)
        CARLS_FATAL("cannot bind %s: %s", self->backend_endpoint, zmq_strerror(errno));

    self->workers = carls_xcalloc(self->opts.threads, sizeof *self->workers);
    atomic_init(&self->stop_workers, 0);
    atomic_init(&self->workers_alive, (int)self->opts.threads);
    for (uint32_t i = 0; i < self->opts.threads; i++) {
        if (pthread_create(&self->workers[i], NULL, s_worker_main, self) != 0)
            CARLS_FATAL("cannot start worker thread");
        self->worker_count++;
    }
    *out = self;
    return 0;
fail:
    kb_server_destroy(&self);
    return -1;
}

void kb_server_auth_counts(const kb_server_t *self, uint64_t *allowed, uint64_t *denied)
{
    *allowed = self->auth ? kb_auth_allowed(self->auth) : 0;
    *denied = self->auth ? kb_auth_denied(self->auth) : 0;
}

const char *kb_server_endpoint(const kb_server_t *self) { return self->endpoint; }

/* Moves one whole multi-part message from one socket to another. */
static void s_forward(void *from, void *to)
{
    int more;
    do {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, from, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            return;
        }
        more = zmq_msg_more(&part);
        if (zmq_msg_send(&part, to, more ? ZMQ_SNDMORE : 0) < 0)
            zmq_msg_close(&part);
    } while (more);
}

void kb_server_run(kb_server_t *self, volatile sig_atomic_t *stop)
{
    LOG_INFO("listening on %s with %u worker threads", self->endpoint, self->opts.threads);
    zmq_pollitem_t items[2] = {
        {.socket = self->frontend, .events = ZMQ_POLLIN},
        {.socket = self->backend, .events = ZMQ_POLLIN},
    };
    while (!*stop) {
        int n = zmq_poll(items, 2, 100);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            LOG_ERROR("zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (items[0].revents & ZMQ_POLLIN)
            s_forward(self->frontend, self->backend);
        if (items[1].revents & ZMQ_POLLIN)
            s_forward(self->backend, self->frontend);
    }
    LOG_INFO("stopping: finishing requests in progress");
    /* Stop taking requests; keep delivering replies until every worker has finished its current one. */
    atomic_store(&self->stop_workers, 1);
    while (atomic_load(&self->workers_alive) > 0) {
        if (zmq_poll(&items[1], 1, 20) > 0 && (items[1].revents & ZMQ_POLLIN))
            s_forward(self->backend, self->frontend);
    }
    while (zmq_poll(&items[1], 1, 0) > 0 && (items[1].revents & ZMQ_POLLIN))
        s_forward(self->backend, self->frontend);
}

void kb_server_destroy(kb_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_server_t *self = *self_p;
    atomic_store(&self->stop_workers, 1);
    for (uint32_t i = 0; i < self->worker_count; i++)
        pthread_join(self->workers[i], NULL);
    free(self->workers);
    if (self->frontend)
        zmq_close(self->frontend);
    if (self->backend)
        zmq_close(self->backend);
    kb_auth_destroy(&self->auth);
    zmq_ctx_term(self->ctx);
    free(self);
    *self_p = NULL;
}
