#include "kb_server.h"

#include "kb_commit.h"
#include "kb_zap.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

/* A request handed to a worker, or a reply waiting to be sent (from a worker, or parked for a commit). */
typedef struct s_item {
    zmq_msg_t identity;
    zmq_msg_t request;            /* jobs only */
    uint8_t *reply;               /* replies only: malloc'd, handed to ZeroMQ without a copy */
    size_t reply_len;
    kb_service_deferred_t wait;   /* parked replies: the commit they wait for */
    int64_t deadline_ms;          /* parked replies: answer INTERNAL if not durable by then */
    struct s_item *next;
} s_item_t;

typedef struct {
    s_item_t *head, *tail;
} s_fifo_t;

/* One request's work in n parts that idle workers help with (kb_service_set_parallel). It lives on the
 * stack of the thread that runs it; every field past fn and arg is guarded by the server's mutex. */
typedef struct s_share {
    kb_parallel_fn fn;
    void *arg;
    size_t n;
    size_t claimed;  /* parts begun */
    size_t finished; /* parts returned */
    pthread_cond_t all_finished;
    struct s_share *next; /* in the server's list while claimed < n */
} s_share_t;

struct kb_server {
    kb_service_t *service;
    kb_commit_t *commit; /* the bank's commit pipeline: parked replies wait for their ticket */
    kb_server_options_t opts;
    void *ctx;
    void *frontend; /* ROUTER, clients: only the request thread (kb_server_run) touches it */
    char endpoint[256];
    int wake_fd;    /* eventfd: a worker finished a reply, or the persister finished a round */

    pthread_mutex_t mutex; /* guards jobs, done, shares, stop_workers */
    pthread_cond_t job_cond;
    s_fifo_t jobs;  /* requests that may block, for the workers */
    s_fifo_t done;  /* the workers' replies, for the request thread to send */
    s_share_t *shares; /* requests' parts not begun yet, for idle workers */
    bool stop_workers;
    s_fifo_t parked; /* request thread only: sync writes' replies in ticket order, until their commit */

    pthread_t *workers;
    uint32_t worker_count;
    kb_auth_t *auth; /* CURVE only */
};

static void s_push(s_fifo_t *q, s_item_t *it)
{
    it->next = NULL;
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
}

static s_item_t *s_pop(s_fifo_t *q)
{
    s_item_t *it = q->head;
    if (it) {
        q->head = it->next;
        if (!q->head)
            q->tail = NULL;
    }
    return it;
}

static void s_wake(kb_server_t *self)
{
    uint64_t one = 1;
    while (write(self->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

static void s_wake_hook(void *ctx) { s_wake(ctx); }

static void s_free_reply(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* Sends [identity, reply] and frees the item. The reply buffer goes to ZeroMQ as it is (no copy). */
static void s_send(kb_server_t *self, s_item_t *it)
{
    zmq_msg_t body;
    if (zmq_msg_init_data(&body, it->reply, it->reply_len, s_free_reply, NULL) != 0) {
        free(it->reply);
        LOG_WARN("reply not sent: %s", zmq_strerror(errno));
    } else if (zmq_msg_send(&it->identity, self->frontend, ZMQ_SNDMORE) < 0 ||
               zmq_msg_send(&body, self->frontend, 0) < 0) {
        LOG_WARN("reply not sent: %s", zmq_strerror(errno));
        zmq_msg_close(&body);
    }
    zmq_msg_close(&it->identity);
    free(it);
}

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

/* Begins the next part of share: its index, or share->n when every part has begun. The share leaves the
 * list as its last part begins. Mutex held. */
static size_t s_share_claim(kb_server_t *self, s_share_t *share)
{
    if (share->claimed == share->n)
        return share->n;
    size_t i = share->claimed++;
    if (share->claimed == share->n) {
        s_share_t **p = &self->shares;
        while (*p != share)
            p = &(*p)->next;
        *p = share->next;
    }
    return i;
}

/* Runs part i of share, and marks it finished. Mutex held on entry and on return. */
static void s_share_run(kb_server_t *self, s_share_t *share, size_t i)
{
    pthread_mutex_unlock(&self->mutex);
    share->fn(share->arg, i);
    pthread_mutex_lock(&self->mutex);
    if (++share->finished == share->n)
        pthread_cond_signal(&share->all_finished); /* the owner may return (and free share) once we unlock */
}

/* kb_parallel_run_fn: the caller (a worker with a long request) offers the parts to idle workers, runs the
 * parts nobody has begun itself, and waits for the ones others are still running. Nobody waits for a part
 * that has not begun, so helpers can never deadlock. */
static void s_parallel_run(void *ctx, size_t n, kb_parallel_fn fn, void *arg)
{
    kb_server_t *self = ctx;
    if (n <= 1 || self->worker_count <= 1) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i);
        return;
    }
    s_share_t share = {.fn = fn, .arg = arg, .n = n};
    pthread_cond_init(&share.all_finished, NULL);
    pthread_mutex_lock(&self->mutex);
    s_share_t **tail = &self->shares;
    while (*tail)
        tail = &(*tail)->next;
    *tail = &share;
    pthread_cond_broadcast(&self->job_cond);
    size_t i;
    while ((i = s_share_claim(self, &share)) < n)
        s_share_run(self, &share, i);
    while (share.finished < n)
        pthread_cond_wait(&share.all_finished, &self->mutex);
    pthread_mutex_unlock(&self->mutex);
    pthread_cond_destroy(&share.all_finished);
}

/* Workers run the operations that may take long (kb_service_request_may_block), so that the request thread
 * keeps answering lookups and writes meanwhile. A worker with nothing of its own helps with the parts of
 * another worker's request (s_parallel_run); a new request comes first, as it needs no hand-back. */
static void *s_worker_main(void *arg)
{
    kb_server_t *self = arg;
    pthread_mutex_lock(&self->mutex);
    for (;;) {
        while (!self->jobs.head && !self->shares && !self->stop_workers)
            pthread_cond_wait(&self->job_cond, &self->mutex);
        s_item_t *job = s_pop(&self->jobs);
        if (!job && self->shares) {
            s_share_t *share = self->shares;
            s_share_run(self, share, s_share_claim(self, share));
            continue;
        }
        if (!job)
            break; /* stopping, and every job taken has been answered */
        pthread_mutex_unlock(&self->mutex);
        kb_service_handle(self->service, zmq_msg_data(&job->request), zmq_msg_size(&job->request), &job->reply,
                          &job->reply_len);
        zmq_msg_close(&job->request);
        zmq_msg_init(&job->request); /* empty, so that closing it again is harmless */
        pthread_mutex_lock(&self->mutex);
        s_push(&self->done, job);
        s_wake(self);
    }
    pthread_mutex_unlock(&self->mutex);
    return NULL;
}

int kb_server_new(kb_service_t *service, const kb_server_options_t *opts, kb_server_t **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    kb_server_t *self = carls_xcalloc(1, sizeof *self);
    self->service = service;
    self->commit = kb_service_commit(service);
    self->opts = *opts;
    if (self->opts.threads == 0)
        self->opts.threads = 1;
    pthread_mutex_init(&self->mutex, NULL);
    pthread_cond_init(&self->job_cond, NULL);
    self->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->wake_fd < 0)
        CARLS_FATAL("eventfd: %s", strerror(errno));
    self->ctx = zmq_ctx_new();
    if (!self->ctx)
        CARLS_FATAL("zmq_ctx_new failed");
    self->frontend = zmq_socket(self->ctx, ZMQ_ROUTER);
    if (!self->frontend)
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

    kb_commit_set_commit_hook(self->commit, s_wake_hook, self);
    kb_service_set_parallel(self->service, s_parallel_run, self);
    self->workers = carls_xcalloc(self->opts.threads, sizeof *self->workers);
    for (uint32_t i = 0; i < self->opts.threads; i++) {
        if (pthread_create(&self->workers[i], NULL, s_worker_main, self) != 0)
            CARLS_FATAL("cannot start worker thread");
        pthread_setname_np(self->workers[i], "kb-worker");
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

/* Sends the workers' finished replies. */
static void s_send_done(kb_server_t *self)
{
    pthread_mutex_lock(&self->mutex);
    s_item_t *list = self->done.head;
    self->done.head = self->done.tail = NULL;
    pthread_mutex_unlock(&self->mutex);
    while (list) {
        s_item_t *next = list->next;
        s_send(self, list);
        list = next;
    }
}

/* Sends every parked reply whose commit is durable, and an INTERNAL error for those past their deadline. */
static void s_send_durable(kb_server_t *self)
{
    if (!self->parked.head)
        return;
    uint64_t durable = kb_commit_durable_epoch(self->commit);
    int64_t now = carls_monotonic_ms();
    bool broken = kb_commit_broken(self->commit); /* then nothing parked can commit: answer now */
    char why_lease[300], text_lease[400];
    const bool leased = kb_commit_leased(self->commit, why_lease, sizeof why_lease);
    snprintf(text_lease, sizeof text_lease, "not acknowledged: %s; the write may be on this member's disk only",
             leased ? "" : why_lease);
    while (self->parked.head) {
        s_item_t *it = self->parked.head;
        if (it->wait.durable_ticket > durable) {
            if (it->deadline_ms > now && !broken)
                break;
            char text[700];
            kb_commit_not_committed(self->commit, kb_service_commit_timeout_ms(self->service), text, sizeof text);
            free(it->reply);
            kb_service_error_reply(self->service, it->wait.request_id, text, &it->reply, &it->reply_len);
        } else if (!leased) {
            free(it->reply);
            kb_service_status_reply(self->service, it->wait.request_id, CARLS__STATUS_CODE__STATUS_UNAVAILABLE,
                                    text_lease, &it->reply, &it->reply_len);
        }
        s_pop(&self->parked);
        s_send(self, it);
    }
}

/* Receives and answers up to `budget` requests that are waiting. Lookups and writes are handled here, on
 * this thread (no hand-off, no second ZeroMQ hop); a sync write's reply is parked until its commit; what may
 * block goes to a worker. */
static void s_serve_requests(kb_server_t *self, int budget)
{
    uint64_t wanted = 0;
    for (int i = 0; i < budget; i++) {
        s_item_t *it = carls_xcalloc(1, sizeof *it);
        zmq_msg_init(&it->identity);
        zmq_msg_init(&it->request);
        if (zmq_msg_recv(&it->identity, self->frontend, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&it->identity);
            zmq_msg_close(&it->request);
            free(it);
            break;
        }
        /* Exactly [identity, request] is a request; anything else cannot be answered reliably. */
        int ok = zmq_msg_more(&it->identity) && zmq_msg_recv(&it->request, self->frontend, 0) >= 0 &&
                 !zmq_msg_more(&it->request);
        if (!ok) {
            s_drain(self->frontend);
            kb_service_count_dropped(self->service);
            zmq_msg_close(&it->identity);
            zmq_msg_close(&it->request);
            free(it);
            continue;
        }
        const uint8_t *frame = zmq_msg_data(&it->request);
        size_t len = zmq_msg_size(&it->request);
        if (kb_service_request_may_block(frame, len)) {
            pthread_mutex_lock(&self->mutex);
            s_push(&self->jobs, it);
            pthread_cond_signal(&self->job_cond);
            pthread_mutex_unlock(&self->mutex);
            continue;
        }
        kb_service_handle_deferred(self->service, frame, len, &it->reply, &it->reply_len, &it->wait);
        zmq_msg_close(&it->request);
        zmq_msg_init(&it->request);
        if (it->wait.durable_ticket == 0) {
            s_send(self, it);
            continue;
        }
        it->deadline_ms = carls_monotonic_ms() + kb_service_commit_timeout_ms(self->service);
        s_push(&self->parked, it);
        if (it->wait.durable_ticket > wanted)
            wanted = it->wait.durable_ticket;
    }
    if (wanted)
        kb_commit_request_durable(self->commit, wanted);
}

/* Poll timeout: at most 100 ms, less when a parked reply reaches its deadline sooner. */
static int s_poll_timeout(const kb_server_t *self)
{
    if (!self->parked.head)
        return 100;
    int64_t left = self->parked.head->deadline_ms - carls_monotonic_ms();
    return left < 0 ? 0 : left > 100 ? 100 : (int)left;
}

static void s_clear_wake(kb_server_t *self)
{
    uint64_t count;
    while (read(self->wake_fd, &count, sizeof count) < 0 && errno == EINTR) {
    }
}

static bool s_workers_idle(kb_server_t *self)
{
    pthread_mutex_lock(&self->mutex);
    bool idle = !self->jobs.head && !self->done.head;
    pthread_mutex_unlock(&self->mutex);
    return idle;
}

void kb_server_run(kb_server_t *self, volatile sig_atomic_t *stop)
{
    LOG_INFO("listening on %s (%u worker threads for knn, sample, scan and admin requests)", self->endpoint,
             self->opts.threads);
    zmq_pollitem_t items[2] = {
        {.socket = NULL, .fd = self->wake_fd, .events = ZMQ_POLLIN},
        {.socket = self->frontend, .events = ZMQ_POLLIN},
    };
    while (!*stop) {
        int n = zmq_poll(items, 2, s_poll_timeout(self));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            LOG_ERROR("zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (items[0].revents & ZMQ_POLLIN)
            s_clear_wake(self);
        s_send_done(self);
        s_send_durable(self);
        if (items[1].revents & ZMQ_POLLIN)
            s_serve_requests(self, 64);
    }
    LOG_INFO("stopping: finishing requests in progress");
    /* Stop taking requests; answer every request already taken (the workers' and the parked ones). */
    pthread_mutex_lock(&self->mutex);
    self->stop_workers = true;
    pthread_cond_broadcast(&self->job_cond);
    pthread_mutex_unlock(&self->mutex);
    while (self->parked.head || !s_workers_idle(self)) {
        if (zmq_poll(items, 1, s_poll_timeout(self)) > 0)
            s_clear_wake(self);
        s_send_done(self);
        s_send_durable(self);
    }
}

void kb_server_destroy(kb_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_server_t *self = *self_p;
    pthread_mutex_lock(&self->mutex);
    self->stop_workers = true;
    pthread_cond_broadcast(&self->job_cond);
    pthread_mutex_unlock(&self->mutex);
    for (uint32_t i = 0; i < self->worker_count; i++)
        pthread_join(self->workers[i], NULL);
    free(self->workers);
    if (self->service)
        kb_service_set_parallel(self->service, NULL, NULL);
    if (self->commit)
        kb_commit_set_commit_hook(self->commit, NULL, NULL);
    /* Replies never sent (the server stopped before serving): free them. */
    s_fifo_t *queues[] = {&self->jobs, &self->done, &self->parked};
    for (size_t q = 0; q < sizeof queues / sizeof *queues; q++) {
        s_item_t *it;
        while ((it = s_pop(queues[q]))) {
            zmq_msg_close(&it->identity);
            zmq_msg_close(&it->request);
            free(it->reply);
            free(it);
        }
    }
    if (self->frontend)
        zmq_close(self->frontend);
    kb_auth_destroy(&self->auth);
    zmq_ctx_term(self->ctx);
    if (self->wake_fd >= 0)
        close(self->wake_fd);
    pthread_cond_destroy(&self->job_cond);
    pthread_mutex_destroy(&self->mutex);
    free(self);
    *self_p = NULL;
}
