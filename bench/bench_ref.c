/* kb-bench reference points: raw ZeroMQ echo, Redis, in-process FAISS (see bench.h). */
#include "bench.h"

#include "kb_knn.h"
#include "log.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#ifdef BENCH_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

/* ---- raw ZeroMQ echo ---- */

typedef struct {
    void *ctx;
    void *router;
    char endpoint[256];
    size_t reply_bytes;
    atomic_int stop;
    pthread_t thread;
} s_echo_t;

/* The echo server: [identity, request] in, [identity, reply_bytes of payload] out, like kb-server's
 * ROUTER without the worker hop and without decoding. */
static void *s_echo_main(void *arg)
{
    s_echo_t *e = arg;
    uint8_t *reply = carls_xcalloc(1, e->reply_bytes ? e->reply_bytes : 1);
    zmq_pollitem_t item = {.socket = e->router, .events = ZMQ_POLLIN};
    while (!atomic_load(&e->stop)) {
        if (zmq_poll(&item, 1, 50) <= 0)
            continue;
        zmq_msg_t id, req;
        zmq_msg_init(&id);
        zmq_msg_init(&req);
        if (zmq_msg_recv(&id, e->router, 0) < 0 || zmq_msg_recv(&req, e->router, 0) < 0) {
            zmq_msg_close(&id);
            zmq_msg_close(&req);
            continue;
        }
        zmq_msg_close(&req);
        if (zmq_msg_send(&id, e->router, ZMQ_SNDMORE) < 0)
            zmq_msg_close(&id);
        else
            zmq_send(e->router, reply, e->reply_bytes, 0);
    }
    free(reply);
    return NULL;
}

typedef struct {
    s_echo_t *echo;
    size_t request_bytes;
    uint64_t units_per_op;
} s_echo_arg_t;

typedef struct {
    void *dealer;
    uint8_t *request;
    size_t request_bytes;
    uint64_t units_per_op;
    zmq_msg_t reply;
} s_echo_client_t;

static void *s_echo_client_new(void *arg, uint32_t index)
{
    (void)index;
    s_echo_arg_t *a = arg;
    s_echo_client_t *c = carls_xcalloc(1, sizeof *c);
    c->dealer = zmq_socket(a->echo->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(c->dealer, a->echo->endpoint) != 0) {
        zmq_close(c->dealer);
        free(c);
        return NULL;
    }
    c->request_bytes = a->request_bytes;
    c->request = carls_xcalloc(1, a->request_bytes ? a->request_bytes : 1);
    c->units_per_op = a->units_per_op;
    zmq_msg_init(&c->reply);
    return c;
}

static void s_echo_client_free(void *state)
{
    s_echo_client_t *c = state;
    zmq_msg_close(&c->reply);
    zmq_close(c->dealer);
    free(c->request);
    free(c);
}

static int s_echo_op(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_echo_client_t *c = state;
    /* A real client fills its request for every call; so does this one (the cost of a memset of the
     * bytes, small beside protobuf packing, keeps the floor honest). */
    memset(c->request, (int)(*rng & 0xff), c->request_bytes);
    if (zmq_send(c->dealer, c->request, c->request_bytes, 0) < 0 || zmq_msg_recv(&c->reply, c->dealer, 0) < 0) {
        snprintf(err, errlen, "zmq echo: %s", zmq_strerror(errno));
        return -1;
    }
    *units = c->units_per_op;
    return 0;
}

int bench_zmq_echo(const bench_opts_t *opts, size_t request_bytes, size_t reply_bytes, uint64_t units_per_op,
                   bench_measure_t *out)
{
    s_echo_t e = {.reply_bytes = reply_bytes};
    atomic_init(&e.stop, 0);
    e.ctx = zmq_ctx_new();
    e.router = zmq_socket(e.ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(e.router, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(e.router, "tcp://127.0.0.1:*") != 0) {
        snprintf(out->error, sizeof out->error, "echo bind: %s", zmq_strerror(errno));
        zmq_close(e.router);
        zmq_ctx_term(e.ctx);
        out->failed = true;
        return -1;
    }
    size_t len = sizeof e.endpoint;
    zmq_getsockopt(e.router, ZMQ_LAST_ENDPOINT, e.endpoint, &len);
    if (pthread_create(&e.thread, NULL, s_echo_main, &e) != 0)
        CARLS_FATAL("cannot start the echo thread");
    s_echo_arg_t arg = {.echo = &e, .request_bytes = request_bytes, .units_per_op = units_per_op};
    bench_workload_t w = {s_echo_client_new, s_echo_client_free, s_echo_op, &arg};
    int rc = bench_run(&w, opts->clients, opts->warmup, opts->seconds, out);
    atomic_store(&e.stop, 1);
    pthread_join(e.thread, NULL);
    zmq_close(e.router);
    zmq_ctx_term(e.ctx);
    return rc;
}

/* ---- Redis ---- */

#ifdef BENCH_HAVE_HIREDIS

/* A free loopback port (bound and released: another process could take it before Redis does, so callers
 * retry). */
static uint16_t s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof addr;
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 && getsockname(fd, (struct sockaddr *)&addr, &alen) == 0)
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}

static redisContext *s_redis_connect(uint16_t port)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, (struct timeval){30, 0});
    return c;
}

int bench_redis_start(const bench_opts_t *opts, bench_redis_persistence_t persistence, bench_proc_t *out)
{
    memset(out, 0, sizeof *out);
    if (!opts->redis_server || !opts->redis_server[0] || access(opts->redis_server, X_OK) != 0)
        return -1;
    bool aof = persistence == BENCH_REDIS_AOF_ALWAYS;
    for (int attempt = 0; attempt < 3; attempt++) {
        if (bench_make_dir(opts, aof ? "redis-aof" : "redis", out->dir, sizeof out->dir) != 0)
            return -1;
        snprintf(out->log, sizeof out->log, "%s/redis.log", out->dir);
        out->port = s_free_port();
        char port[16];
        snprintf(port, sizeof port, "%u", out->port);
        /* The append-only file lives in --dir, on the same disk as the kb-servers' data (opts->data_dir), so
         * both sides pay the same fsync. Everything else is Redis's default (AOF rewrites included). */
        const char *argv[] = {opts->redis_server, "--port", port, "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", aof ? "yes" : "no", "--appendfsync", aof ? "always" : "everysec",
                              "--daemonize", "no", "--protected-mode", "yes", "--dir", out->dir, "--logfile", "",
                              NULL};
        out->pid = bench_spawn(argv, out->log);
        if (out->pid < 0) {
            out->pid = 0;
            return -1;
        }
        for (int i = 0; i < 500; i++) { /* 5 s */
            redisContext *c = s_redis_connect(out->port);
            if (c) {
                redisReply *r = redisCommand(c, "PING");
                bool ok = r && r->type == REDIS_REPLY_STATUS;
                if (r)
                    freeReplyObject(r);
                redisFree(c);
                if (ok)
                    return 0;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        bench_proc_stop(opts, out);
    }
    return -1;
}

typedef struct {
    const bench_opts_t *opts;
    uint16_t port;
} s_redis_arg_t;

typedef struct {
    redisContext *c;
    const bench_opts_t *opts;
    char *keys;   /* batch keys of 16 bytes each */
    const char **argv;
    size_t *argvlen;
    float *values; /* batch * dim */
} s_redis_client_t;

static void *s_redis_client_new(void *arg, uint32_t index)
{
    (void)index;
    s_redis_arg_t *a = arg;
    s_redis_client_t *c = carls_xcalloc(1, sizeof *c);
    c->opts = a->opts;
    c->c = s_redis_connect(a->port);
    if (!c->c) {
        free(c);
        return NULL;
    }
    uint32_t b = a->opts->batch;
    c->keys = carls_xmalloc((size_t)b * 16);
    c->argv = carls_xmalloc(((size_t)b + 1) * sizeof *c->argv);
    c->argvlen = carls_xmalloc(((size_t)b + 1) * sizeof *c->argvlen);
    c->values = carls_xmalloc((size_t)b * a->opts->dim * sizeof(float));
    return c;
}

static void s_redis_client_free(void *state)
{
    s_redis_client_t *c = state;
    redisFree(c->c);
    free(c->keys);
    free(c->argv);
    free(c->argvlen);
    free(c->values);
    free(c);
}

/* MGET of batch random keys; the values are copied out as a kb client copies a lookup's. */
static int s_redis_mget(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_redis_client_t *c = state;
    uint32_t b = c->opts->batch, dim = c->opts->dim;
    c->argv[0] = "MGET";
    c->argvlen[0] = 4;
    for (uint32_t i = 0; i < b; i++) {
        char *k = c->keys + (size_t)i * 16;
        c->argvlen[i + 1] = bench_key(bench_rand_below(rng, c->opts->keys), k);
        c->argv[i + 1] = k;
    }
    redisReply *r = redisCommandArgv(c->c, (int)b + 1, c->argv, c->argvlen);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != b) {
        snprintf(err, errlen, "redis MGET: %s", r ? (r->type == REDIS_REPLY_ERROR ? r->str : "bad reply") : c->c->errstr);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    for (uint32_t i = 0; i < b; i++) {
        redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_STRING || e->len != dim * sizeof(float)) {
            snprintf(err, errlen, "redis MGET: key %u missing or of the wrong size", i);
            freeReplyObject(r);
            return -1;
        }
        memcpy(c->values + (size_t)i * dim, e->str, dim * sizeof(float));
    }
    freeReplyObject(r);
    *units = b;
    return 0;
}

/* Pipelined SET of batch random keys (a maker's write of batch rows). */
static int s_redis_set(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_redis_client_t *c = state;
    uint32_t b = c->opts->batch, dim = c->opts->dim;
    for (uint32_t i = 0; i < b; i++) {
        char *k = c->keys + (size_t)i * 16;
        uint32_t key = bench_rand_below(rng, c->opts->keys);
        size_t klen = bench_key(key, k);
        float *v = c->values + (size_t)i * dim;
        v[0] = (float)(*rng & 0xffff); /* a fresh value, as a maker writes */
        const char *argv[3] = {"SET", k, (const char *)v};
        size_t lens[3] = {3, klen, dim * sizeof(float)};
        if (redisAppendCommandArgv(c->c, 3, argv, lens) != REDIS_OK) {
            snprintf(err, errlen, "redis SET: %s", c->c->errstr);
            return -1;
        }
    }
    for (uint32_t i = 0; i < b; i++) {
        void *reply = NULL;
        if (redisGetReply(c->c, &reply) != REDIS_OK || !reply ||
            ((redisReply *)reply)->type != REDIS_REPLY_STATUS) {
            snprintf(err, errlen, "redis SET reply: %s", c->c->errstr[0] ? c->c->errstr : "bad reply");
            if (reply)
                freeReplyObject(reply);
            return -1;
        }
        freeReplyObject(reply);
    }
    *units = b;
    return 0;
}

int bench_redis(const bench_opts_t *opts, uint16_t port, bench_measure_t *mget, bench_measure_t *set)
{
    if (mget)
        memset(mget, 0, sizeof *mget);
    memset(set, 0, sizeof *set);
    redisContext *c = s_redis_connect(port);
    if (!c)
        return -1;
    /* Load every key, pipelined in chunks. */
    float *v = carls_xmalloc(opts->dim * sizeof(float));
    char key[16];
    int rc = 0;
    for (uint32_t start = 0; start < opts->keys && rc == 0; start += 1000) {
        uint32_t end = start + 1000 < opts->keys ? start + 1000 : opts->keys;
        for (uint32_t i = start; i < end; i++) {
            size_t klen = bench_key(i, key);
            bench_value(i, opts->dim, v);
            const char *argv[3] = {"SET", key, (const char *)v};
            size_t lens[3] = {3, klen, opts->dim * sizeof(float)};
            redisAppendCommandArgv(c, 3, argv, lens);
        }
        for (uint32_t i = start; i < end; i++) {
            void *reply = NULL;
            if (redisGetReply(c, &reply) != REDIS_OK)
                rc = -1;
            if (reply)
                freeReplyObject(reply);
        }
    }
    free(v);
    redisFree(c);
    if (rc != 0)
        return -1;
    s_redis_arg_t arg = {.opts = opts, .port = port};
    bench_workload_t wm = {s_redis_client_new, s_redis_client_free, s_redis_mget, &arg};
    bench_workload_t ws = {s_redis_client_new, s_redis_client_free, s_redis_set, &arg};
    int a = mget ? bench_run(&wm, opts->clients, opts->warmup, opts->seconds, mget) : 0;
    int b = bench_run(&ws, opts->clients, opts->warmup, opts->seconds, set);
    return a == 0 && b == 0 ? 0 : -1;
}

#else /* no hiredis: Redis is reported unavailable */

int bench_redis_start(const bench_opts_t *opts, bench_redis_persistence_t persistence, bench_proc_t *out)
{
    (void)opts;
    (void)persistence;
    memset(out, 0, sizeof *out);
    return -1;
}

int bench_redis(const bench_opts_t *opts, uint16_t port, bench_measure_t *mget, bench_measure_t *set)
{
    (void)opts;
    (void)port;
    (void)mget;
    (void)set;
    return -1;
}

#endif

/* ---- in-process FAISS ---- */

void bench_knn_queries(const float *rows, uint32_t n, uint32_t dim, uint32_t nq, uint64_t *rng, float *out)
{
    for (uint32_t q = 0; q < nq; q++) {
        const float *src = rows + (size_t)bench_rand_below(rng, n) * dim;
        for (uint32_t d = 0; d < dim; d++)
            out[(size_t)q * dim + d] = src[d] + 0.01f * bench_normal(rng);
    }
}

typedef struct {
    const bench_opts_t *opts;
    kb_knn_t *index;
    const float *rows;
    uint32_t n;
} s_faiss_arg_t;

typedef struct {
    s_faiss_arg_t *a;
    float *queries;
    int64_t *ids;
    float *scores;
} s_faiss_thread_t;

static void *s_faiss_thread_new(void *arg, uint32_t index)
{
    (void)index;
    s_faiss_arg_t *a = arg;
    s_faiss_thread_t *t = carls_xcalloc(1, sizeof *t);
    t->a = a;
    size_t nq = a->opts->knn_batch, k = a->opts->knn_k;
    t->queries = carls_xmalloc(nq * a->opts->dim * sizeof(float));
    t->ids = carls_xmalloc(nq * k * sizeof(int64_t));
    t->scores = carls_xmalloc(nq * k * sizeof(float));
    return t;
}

static void s_faiss_thread_free(void *state)
{
    s_faiss_thread_t *t = state;
    free(t->queries);
    free(t->ids);
    free(t->scores);
    free(t);
}

static int s_faiss_op(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_faiss_thread_t *t = state;
    const bench_opts_t *o = t->a->opts;
    bench_knn_queries(t->a->rows, t->a->n, o->dim, o->knn_batch, rng, t->queries);
    int rc = kb_knn_search(t->a->index, t->queries, o->knn_batch, o->knn_k, NULL, t->ids, t->scores);
    if (rc != 0) {
        snprintf(err, errlen, "kb_knn_search: %d", rc);
        return -1;
    }
    *units = o->knn_batch;
    return 0;
}

int bench_faiss(const bench_opts_t *opts, const char *spec, const float *rows, uint32_t n, bench_measure_t *out,
                double *build_s)
{
    memset(out, 0, sizeof *out);
    /* The server's settings: its --knn-threads OpenMP threads per search, one OpenBLAS thread, and the
     * same defaults for nprobe / efSearch / efConstruction (the table config leaves them 0). */
    kb_knn_set_threads((int)opts->knn_threads, 1);
    kb_knn_config_t cfg;
    kb_knn_config_default(&cfg);
    cfg.spec = spec;
    cfg.metric = KB_KNN_METRIC_L2;
    cfg.dim = opts->dim;
    cfg.background = false;
    kb_knn_t *index = NULL;
    char err[256];
    if (kb_knn_new(&cfg, &index, err, sizeof err) != 0) {
        snprintf(out->error, sizeof out->error, "kb_knn_new(%.40s): %.200s", spec, err);
        out->failed = true;
        return -1;
    }
    double t0 = bench_now();
    int64_t *ids = carls_xmalloc((size_t)n * sizeof *ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = i;
    int rc = 0;
    const uint32_t chunk = 10000; /* the same batches a server gets from puts */
    for (uint32_t s = 0; s < n && rc == 0; s += chunk) {
        uint32_t m = n - s < chunk ? n - s : chunk;
        rc = kb_knn_upsert_batch(index, m, ids + s, rows + (size_t)s * opts->dim);
    }
    free(ids);
    kb_knn_stats_t ks;
    kb_knn_get_stats(index, &ks);
    if (rc == 0 && !ks.ready) {
        /* Indexes that need training (IVF): train on every row and fill. Flat and HNSW took the rows in as
         * they came, as the server's index does. -EAGAIN: too few rows to train (exact search). */
        rc = kb_knn_rebuild(index);
        if (rc == -EAGAIN)
            rc = 0;
    }
    *build_s = bench_now() - t0;
    if (rc != 0) {
        snprintf(out->error, sizeof out->error, "building %s in process: %d", spec, rc);
        out->failed = true;
        kb_knn_destroy(&index);
        return -1;
    }
    s_faiss_arg_t arg = {.opts = opts, .index = index, .rows = rows, .n = n};
    bench_workload_t w = {s_faiss_thread_new, s_faiss_thread_free, s_faiss_op, &arg};
    rc = bench_run(&w, opts->clients, opts->warmup, opts->seconds, out);
    kb_knn_destroy(&index);
    return rc;
}
