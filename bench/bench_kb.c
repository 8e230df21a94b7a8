/* kb-bench: the kb-server workloads and how each is compared with its reference (see bench.h and
 * docs/BENCHMARKS.md, "Knowledge bank"). */
#include "bench.h"

#include "kb_cluster.h"
#include "kb_memory.h"
#include "protocol.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define S_MAX_SHARDS 8
#define S_LOAD_BATCH 5000u /* rows per put while loading a table */
#define S_TABLE "emb"
#define S_NORMAL_ROWS 4096 /* rows of normal draws each client thread picks its values from */
#define S_DRAIN_MAX_S 60 /* seconds to wait for pushed gradients to be applied (the note below says 60) */

/* ---- connections: the sharded client (kb_cluster) over the bench's servers ---- */

/* Copies an endpoint into a 256-byte slot (kb-server endpoints are far shorter). */
static void s_ep(char *dst, const char *src)
{
    size_t n = strnlen(src, 255);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* A client of the bank served by `shards` servers (endpoints in shard order); with one endpoint every call
 * is one request to it, with several kb_cluster splits the keys and asks the shards in parallel. NULL on
 * failure (logged). */
static kb_cluster_t *s_bank_open(char endpoints[][256], uint32_t shards)
{
    char list[S_MAX_SHARDS * 257] = "";
    for (uint32_t s = 0; s < shards; s++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", s ? "," : "", endpoints[s]);
    kb_client_options_t o = {.timeout_ms = 120000, .retries = 0};
    return kb_cluster_new(list, &o);
}

/* ---- tables ---- */

static int s_create(kb_cluster_t *bank, uint32_t dim, const char *knn_spec)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = dim;
    Carls__KnnConfig knn = CARLS__KNN_CONFIG__INIT;
    if (knn_spec) {
        knn.spec = (char *)knn_spec;
        knn.metric = CARLS__KNN_METRIC__METRIC_L2;
        cfg.knn = &knn;
    }
    if (kb_cluster_create_table(bank, S_TABLE, &cfg, true) != 0) {
        fprintf(stderr, "kb-bench: create table: %s\n", kb_cluster_last_error(bank));
        return -1;
    }
    return 0;
}

/* Puts rows [from, to) with their bench_value (or rows[] when given) in batches, then checkpoints every
 * shard (commits everything). */
static int s_load(kb_cluster_t *bank, uint32_t dim, uint32_t from, uint32_t to, const float *rows)
{
    kb_key_t *keys = carls_xmalloc(S_LOAD_BATCH * sizeof *keys);
    char *kbuf = carls_xmalloc((size_t)S_LOAD_BATCH * 16);
    float *vals = carls_xmalloc((size_t)S_LOAD_BATCH * dim * sizeof(float));
    char err[512] = "";
    int rc = 0;
    for (uint32_t s = from; s < to && rc == 0; s += S_LOAD_BATCH) {
        uint32_t m = to - s < S_LOAD_BATCH ? to - s : S_LOAD_BATCH;
        for (uint32_t i = 0; i < m; i++) {
            keys[i].len = bench_key(s + i, kbuf + (size_t)i * 16);
            keys[i].data = kbuf + (size_t)i * 16;
            if (rows)
                memcpy(vals + (size_t)i * dim, rows + (size_t)(s + i) * dim, dim * sizeof(float));
            else
                bench_value(s + i, dim, vals + (size_t)i * dim);
        }
        rc = kb_cluster_put(bank, S_TABLE, keys, m, dim, vals, 1);
        if (rc != 0)
            snprintf(err, sizeof err, "put: %s", kb_cluster_last_error(bank));
    }
    /* Everything committed before anything is measured: in interval durability the persister would
     * otherwise still be writing the load to SQLite during the measurement (and a 1M-row backlog makes the
     * server's shutdown slow). The server gives up waiting for one commit after --commit-timeout-ms (30 s);
     * a large load (1M rows, with an index being built on the same cores) can take longer to persist, so
     * ask again. */
    for (int attempt = 0; attempt < 40 && rc == 0; attempt++) {
        int ck = kb_cluster_checkpoint(bank, NULL);
        if (ck == 0)
            break;
        snprintf(err, sizeof err, "checkpoint: %s", kb_cluster_last_error(bank));
        if (attempt == 39)
            rc = ck;
    }
    if (rc != 0)
        fprintf(stderr, "kb-bench: loading rows: %s\n", err);
    free(keys);
    free(kbuf);
    free(vals);
    return rc;
}

/* The table's stats on the first (in these cases the only) server (a copy of the fields used here). */
typedef struct {
    uint64_t rows, pending_gradients, gradients_received, gradients_applied, outliers_dropped;
    uint64_t knn_count, knn_indexed, knn_pending;
    bool knn_ready, knn_building;
} s_tstats_t;

static int s_stats(kb_cluster_t *bank, s_tstats_t *out)
{
    Carls__Response *resp = NULL;
    if (kb_cluster_stats(bank, 0, S_TABLE, &resp) != 0) {
        fprintf(stderr, "kb-bench: stats: %s\n", kb_cluster_last_error(bank));
        if (resp)
            carls__response__free_unpacked(resp, NULL);
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (resp->stats->n_tables == 1) {
        const Carls__TableStats *t = resp->stats->tables[0];
        out->rows = t->rows;
        out->pending_gradients = t->pending_gradients;
        out->gradients_received = t->gradients_received;
        out->gradients_applied = t->gradients_applied;
        out->outliers_dropped = t->outliers_dropped;
        out->knn_count = t->knn_count;
        out->knn_indexed = t->knn_indexed;
        out->knn_pending = t->knn_pending;
        out->knn_ready = t->knn_ready;
        out->knn_building = t->knn_building;
    }
    carls__response__free_unpacked(resp, NULL);
    return 0;
}

/* A connection to one server for the server-wide stats below (60 s per attempt); NULL on failure (logged). */
static kb_cluster_t *s_stats_open(const char *endpoint)
{
    kb_client_options_t o = {.timeout_ms = 60000};
    return kb_cluster_new(endpoint, &o);
}

/* The server's stats of every table. 0 with *resp (caller frees), or -1. */
static int s_server_stats(kb_cluster_t *bank, Carls__Response **resp)
{
    return bank && kb_cluster_stats(bank, 0, "", resp) == 0 ? 0 : -1;
}

/* The server's commit counters (stats of every table). */
static int s_commits(const char *endpoint, uint64_t *commits, uint64_t *rows_written)
{
    kb_cluster_t *bank = s_stats_open(endpoint);
    Carls__Response *resp = NULL;
    int rc = s_server_stats(bank, &resp);
    if (rc == 0) {
        *commits = resp->stats->commits;
        *rows_written = resp->stats->rows_written;
        carls__response__free_unpacked(resp, NULL);
    }
    kb_cluster_destroy(&bank);
    return rc;
}

/* Waits (up to timeout_s) until the server has no compaction transaction open, so that a reference measured
 * next does not share the cores with the compaction of an earlier case's writes. 0 when it is quiet. */
static int s_wait_not_compacting(const char *endpoint, double timeout_s)
{
    kb_cluster_t *bank = s_stats_open(endpoint);
    double deadline = bench_now() + timeout_s;
    int rc = -1;
    while (bank && bench_now() < deadline) {
        Carls__Response *resp = NULL;
        if (s_server_stats(bank, &resp) != 0)
            break;
        bool compacting = resp->stats->compacting;
        carls__response__free_unpacked(resp, NULL);
        if (!compacting) {
            rc = 0;
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kb_cluster_destroy(&bank);
    return rc;
}

/* The server's own p50 for operation op (time inside kb_service_handle, from its histogram), or NAN. */
static double s_server_p50(const char *endpoint, const char *op)
{
    kb_cluster_t *bank = s_stats_open(endpoint);
    Carls__Response *resp = NULL;
    double p50 = NAN;
    if (s_server_stats(bank, &resp) == 0) {
        for (size_t i = 0; i < resp->stats->n_latency; i++)
            if (strcmp(resp->stats->latency[i]->op, op) == 0)
                p50 = resp->stats->latency[i]->p50_us;
        carls__response__free_unpacked(resp, NULL);
    }
    kb_cluster_destroy(&bank);
    return p50;
}

/* ---- workloads ---- */

typedef struct {
    const bench_opts_t *opts;
    char (*endpoints)[256];
    uint32_t shards;
    uint32_t keys; /* keys drawn from [0, keys) */
    uint32_t batch;
    const float *rows; /* knn: the table's rows, for queries */
    uint32_t n_rows;
} s_kb_arg_t;

typedef struct {
    s_kb_arg_t *a;
    kb_cluster_t *bank;
    char *kbuf;
    float *vals, *out;
    float *normals; /* S_NORMAL_ROWS rows of standard normal draws, made once (see s_draw_values) */
    kb_key_t *ckeys;
    uint64_t version;
    kb_cluster_pending_t *push; /* the pipelined trainer's push in flight */
} s_kb_thread_t;

static void s_kb_thread_free(void *state)
{
    s_kb_thread_t *t = state;
    if (t->push && kb_cluster_push_gradients_wait(t->bank, &t->push) != 0)
        fprintf(stderr, "kb-bench: the last pipelined push failed: %s\n", kb_cluster_last_error(t->bank));
    kb_cluster_destroy(&t->bank);
    free(t->kbuf);
    free(t->vals);
    free(t->out);
    free(t->normals);
    free(t->ckeys);
    free(t);
}

static void *s_kb_thread_new(void *arg, uint32_t index)
{
    s_kb_arg_t *a = arg;
    s_kb_thread_t *t = carls_xcalloc(1, sizeof *t);
    t->a = a;
    uint32_t dim = a->opts->dim;
    size_t cap = a->batch > a->opts->knn_batch ? a->batch : a->opts->knn_batch;
    t->ckeys = carls_xmalloc(cap * sizeof *t->ckeys);
    t->kbuf = carls_xmalloc(cap * 16);
    t->vals = carls_xmalloc(cap * dim * sizeof(float));
    t->out = carls_xmalloc(cap * dim * sizeof(float));
    t->normals = carls_xmalloc((size_t)S_NORMAL_ROWS * dim * sizeof(float));
    uint64_t rng = 0x9e3779b97f4a7c15ull * (index + 1);
    for (size_t i = 0; i < (size_t)S_NORMAL_ROWS * dim; i++)
        t->normals[i] = bench_normal(&rng);
    t->bank = s_bank_open(a->endpoints, a->shards);
    if (!t->bank) {
        s_kb_thread_free(t);
        return NULL;
    }
    return t;
}

/* Fills t->vals with n rows of scale * N(0, 1): each row a random row of the thread's pool of draws. Drawing
 * 16k normals per request would cost the client more than the server spends on the request, and that time
 * is the benchmark's, not the bank's (the echo reference sends bytes it never computes). */
static void s_draw_values(s_kb_thread_t *t, uint64_t *rng, uint32_t n, float scale)
{
    uint32_t dim = t->a->opts->dim;
    for (uint32_t i = 0; i < n; i++) {
        const float *src = t->normals + (size_t)bench_rand_below(rng, S_NORMAL_ROWS) * dim;
        float *dst = t->vals + (size_t)i * dim;
        for (uint32_t j = 0; j < dim; j++)
            dst[j] = scale * src[j];
    }
}

static void s_draw_keys(s_kb_thread_t *t, uint64_t *rng, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        char *k = t->kbuf + (size_t)i * 16;
        size_t len = bench_key(bench_rand_below(rng, t->a->keys), k);
        t->ckeys[i].data = k;
        t->ckeys[i].len = len;
    }
}

/* Lookup of batch random keys (one request when unsharded, routed to every shard in parallel otherwise). */
static int s_lookup(s_kb_thread_t *t, uint64_t *rng, bool no_create, uint64_t *units, char *err, size_t errlen)
{
    uint32_t b = t->a->batch, dim = t->a->opts->dim;
    s_draw_keys(t, rng, b);
    if (kb_cluster_lookup_ex(t->bank, S_TABLE, t->ckeys, b, dim, no_create, t->out, NULL) != 0)
        return carls_errorf(err, errlen, -1, "lookup: %s", kb_cluster_last_error(t->bank));
    *units = b;
    return 0;
}

/* A trainer's read: s_lookup, counting each key's use. */
static int s_op_lookup(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    return s_lookup(state, rng, false, units, err, errlen);
}

/* The same read with no_create: keys are not counted, so no use count is left to persist (the difference to
 * s_op_lookup is the cost of counting uses and writing the counts in bulk later). */
static int s_op_lookup_no_create(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    return s_lookup(state, rng, true, units, err, errlen);
}

/* Pushes gradients for t's current batch keys: small values (no outliers by design). */
static int s_push(s_kb_thread_t *t, uint64_t *rng, char *err, size_t errlen)
{
    uint32_t b = t->a->batch, dim = t->a->opts->dim;
    s_draw_values(t, rng, b, 0.01f);
    if (kb_cluster_push_gradients(t->bank, S_TABLE, t->ckeys, b, dim, t->vals) != 0)
        return carls_errorf(err, errlen, -1, "push: %s", kb_cluster_last_error(t->bank));
    return 0;
}

/* A trainer's gradient push: batch rows for random keys. */
static int s_op_push(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_kb_thread_t *t = state;
    s_draw_keys(t, rng, t->a->batch);
    if (s_push(t, rng, err, errlen) != 0)
        return -1;
    *units = t->a->batch;
    return 0;
}

/* A maker's write: batch rows of fresh values for random keys, tagged with a growing version. */
static int s_op_put(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_kb_thread_t *t = state;
    uint32_t b = t->a->batch, dim = t->a->opts->dim;
    s_draw_keys(t, rng, b);
    s_draw_values(t, rng, b, 0.1f);
    t->version++;
    if (kb_cluster_put(t->bank, S_TABLE, t->ckeys, b, dim, t->vals, t->version) != 0)
        return carls_errorf(err, errlen, -1, "put: %s", kb_cluster_last_error(t->bank));
    *units = b;
    return 0;
}

/* A trainer step in the mixed load: read a batch, push its gradients. Units: embeddings read. */
static int s_op_trainer(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    if (s_op_lookup(state, rng, units, err, errlen) != 0)
        return -1;
    return s_push(state, rng, err, errlen);
}

/* The same trainer step with the push pipelined, as trainer_word2vec and carls' push_gradients(wait=False)
 * do: the step's push is sent without waiting, and its acknowledgement is collected in the next step, after
 * that step's lookup (one push in flight per trainer). Units: embeddings read. */
static int s_op_trainer_pipelined(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_kb_thread_t *t = state;
    uint32_t b = t->a->batch, dim = t->a->opts->dim;
    if (s_op_lookup(state, rng, units, err, errlen) != 0)
        return -1;
    if (t->push && kb_cluster_push_gradients_wait(t->bank, &t->push) != 0)
        return carls_errorf(err, errlen, -1, "push: %s", kb_cluster_last_error(t->bank));
    s_draw_values(t, rng, b, 0.01f);
    if (kb_cluster_push_gradients_send(t->bank, S_TABLE, t->ckeys, b, dim, t->vals, &t->push) != 0)
        return carls_errorf(err, errlen, -1, "push: %s", kb_cluster_last_error(t->bank));
    return 0;
}

/* knn by vector: knn_batch queries near stored rows, k neighbours each. Units: queries. */
static int s_op_knn(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_kb_thread_t *t = state;
    const bench_opts_t *o = t->a->opts;
    bench_knn_queries(t->a->rows, t->a->n_rows, o->dim, o->knn_batch, rng, t->vals);
    kb_knn_result_t *res = NULL;
    if (kb_cluster_knn(t->bank, S_TABLE, t->vals, o->knn_batch, o->dim, o->knn_k, &res) != 0)
        return carls_errorf(err, errlen, -1, "knn: %s", kb_cluster_last_error(t->bank));
    kb_knn_result_destroy(&res);
    *units = o->knn_batch;
    return 0;
}

/* A trainer's neighbour query as kb-maker's graph sends it: knn_batch stored rows by key, each answered
 * without itself (exclude_query). Units: queries. */
static int s_op_knn_by_key(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_kb_thread_t *t = state;
    const bench_opts_t *o = t->a->opts;
    s_draw_keys(t, rng, o->knn_batch);
    kb_knn_result_t *res = NULL;
    if (kb_cluster_knn_by_key(t->bank, S_TABLE, t->ckeys, o->knn_batch, o->knn_k, true, &res) != 0)
        return carls_errorf(err, errlen, -1, "knn by key: %s", kb_cluster_last_error(t->bank));
    kb_knn_result_destroy(&res);
    *units = o->knn_batch;
    return 0;
}

/* Uniform candidate sampling of batch rows (two-tower negatives). Units: rows drawn. */
static int s_op_sample(void *state, uint64_t *rng, uint64_t *units, char *err, size_t errlen)
{
    s_kb_thread_t *t = state;
    kb_sample_result_t *res = NULL;
    if (kb_cluster_sample(t->bank, S_TABLE, NULL, 0, t->a->batch, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM,
                          bench_rand(rng) | 1, &res) != 0)
        return carls_errorf(err, errlen, -1, "sample: %s", kb_cluster_last_error(t->bank));
    *units = res->n;
    kb_sample_result_destroy(&res);
    return 0;
}

static int s_run_kb(const bench_opts_t *opts, bench_proc_t *servers, uint32_t shards, uint32_t keys,
                    uint32_t batch, bench_op_fn op, uint32_t clients, double seconds, bench_measure_t *m)
{
    char endpoints[S_MAX_SHARDS][256];
    for (uint32_t s = 0; s < shards; s++)
        s_ep(endpoints[s], servers[s].endpoint);
    s_kb_arg_t a = {.opts = opts, .endpoints = endpoints, .shards = shards, .keys = keys, .batch = batch};
    bench_workload_t w = {s_kb_thread_new, s_kb_thread_free, op, &a};
    return bench_run(&w, clients, opts->warmup, seconds, m);
}

/* ---- pieces for the workload cases (bench_workload.c) ---- */

static int s_wait_index(kb_cluster_t *bank, uint64_t n, double timeout_s);

int bench_kb_table(const bench_opts_t *opts, const char *endpoint, const char *knn_spec, uint32_t n,
                   const float *rows)
{
    char ep[1][256];
    s_ep(ep[0], endpoint);
    kb_cluster_t *bank = s_bank_open(ep, 1);
    int rc = bank ? s_create(bank, opts->dim, knn_spec) : -1;
    if (rc == 0)
        rc = s_load(bank, opts->dim, 0, n, rows);
    if (rc == 0 && knn_spec)
        rc = s_wait_index(bank, n, 1800.0);
    kb_cluster_destroy(&bank);
    return rc;
}

int bench_kb_measure(const bench_opts_t *opts, const char *endpoint, bench_kb_op_t op, uint32_t keys,
                     uint32_t batch, bench_measure_t *m)
{
    static const bench_op_fn fns[] = {
        [BENCH_KB_LOOKUP] = s_op_lookup_no_create, [BENCH_KB_PUSH] = s_op_push, [BENCH_KB_PUT] = s_op_put,
        [BENCH_KB_KNN_BY_KEY] = s_op_knn_by_key,   [BENCH_KB_SAMPLE] = s_op_sample,
    };
    char endpoints[1][256];
    s_ep(endpoints[0], endpoint);
    s_kb_arg_t a = {.opts = opts, .endpoints = endpoints, .shards = 1, .keys = keys, .batch = batch};
    bench_workload_t w = {s_kb_thread_new, s_kb_thread_free, fns[op], &a};
    return bench_run(&w, opts->clients, opts->warmup, opts->seconds, m);
}

double bench_kb_server_p50(const char *endpoint, const char *op) { return s_server_p50(endpoint, op); }

/* ---- reporting helpers ---- */

/* Reports a failed measurement (value n/a) with its error as the note, and counts it in *failures (when
 * failures is not NULL). */
static void s_report_failed(const bench_opts_t *opts, const char *name, const char *unit, const char *why,
                            int *failures)
{
    bench_result_t r = bench_result(opts, name, unit);
    r.note = why;
    bench_report(opts, &r);
    if (failures)
        (*failures)++;
}

/* Measures op alone on srv (opts' clients, batch and keys) and reports it as case `name` against reference
 * (reference_value: NAN when unavailable), with note. 0 with *m, or -1 (reported and counted in *failures). */
static int s_case_alone(const bench_opts_t *opts, bench_proc_t *srv, bench_op_fn op, const char *name,
                        const char *unit, const char *reference, double reference_value, const char *note,
                        bench_measure_t *m, int *failures)
{
    if (s_run_kb(opts, srv, 1, opts->keys, opts->batch, op, opts->clients, opts->seconds, m) != 0) {
        s_report_failed(opts, name, unit, m->error, failures);
        return -1;
    }
    bench_result_t r = bench_result_of(opts, name, unit, m, reference, reference_value);
    r.note = note;
    bench_report(opts, &r);
    return 0;
}

/* ---- the cases ---- */

typedef struct {
    /* measured alone, for later references (the mixed case's, sync against interval) */
    bench_measure_t lookup, lookup_int, push_int, put_int;
    bool have_lookup, have_lookup_int, have_push_int, have_put_int;
    bench_measure_t redis_mget, redis_set;
    bool have_redis;
    const char *redis_note;
    bench_measure_t redis_aof_set; /* pipelined SET with appendonly yes, appendfsync always */
    bool have_redis_aof;
    const char *redis_aof_note;
} s_state_t;

/* Packed sizes of one lookup request and its answer, measured on the real server. */
static int s_lookup_sizes(const bench_opts_t *opts, kb_client_t *c, size_t *req_bytes, size_t *rep_bytes)
{
    ProtobufCBinaryData *keys = carls_xmalloc(opts->batch * sizeof *keys);
    char *kbuf = carls_xmalloc((size_t)opts->batch * 16);
    for (uint32_t i = 0; i < opts->batch; i++) {
        keys[i].len = bench_key(i % opts->keys, kbuf + (size_t)i * 16);
        keys[i].data = (uint8_t *)kbuf + (size_t)i * 16;
    }
    Carls__Lookup op = CARLS__LOOKUP__INIT;
    op.keys = keys;
    op.n_keys = opts->batch;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = S_TABLE;
    req.op_case = CARLS__REQUEST__OP_LOOKUP;
    req.lookup = &op;
    Carls__Response *resp = NULL;
    int rc = kb_client_call(c, &req, &resp);
    if (rc == 0) {
        *req_bytes = carls__request__get_packed_size(&req);
        *rep_bytes = carls__response__get_packed_size(resp);
    }
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    free(keys);
    free(kbuf);
    return rc;
}

/* Packed size of a push of batch rows (the echo reference for pushes; answered with a small write result). */
static size_t s_push_request_bytes(const bench_opts_t *opts)
{
    ProtobufCBinaryData *keys = carls_xmalloc(opts->batch * sizeof *keys);
    char *kbuf = carls_xmalloc((size_t)opts->batch * 16);
    float *g = carls_xcalloc((size_t)opts->batch * opts->dim, sizeof(float));
    for (uint32_t i = 0; i < opts->batch; i++) {
        keys[i].len = bench_key(i, kbuf + (size_t)i * 16);
        keys[i].data = (uint8_t *)kbuf + (size_t)i * 16;
    }
    Carls__PushGradients op = CARLS__PUSH_GRADIENTS__INIT;
    op.keys = keys;
    op.n_keys = opts->batch;
    op.gradients = g;
    op.n_gradients = (size_t)opts->batch * opts->dim;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.protocol_version = 1;
    req.request_id = 1234567;
    req.client_id = UINT64_MAX / 3;
    req.sequence = 1234567;
    req.table = S_TABLE;
    req.op_case = CARLS__REQUEST__OP_PUSH_GRADIENTS;
    req.push_gradients = &op;
    size_t n = carls__request__get_packed_size(&req);
    free(keys);
    free(kbuf);
    free(g);
    return n;
}

static void s_case_lookup(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, int *failures)
{
    bench_progress(opts, "lookup: %u clients, batch %u, %u keys, dim %u", opts->clients, opts->batch, opts->keys,
                   opts->dim);
    size_t req_bytes = 0, rep_bytes = 0;
    kb_client_options_t o = {.timeout_ms = 60000};
    kb_client_t *c = kb_client_new(srv->endpoint, &o);
    int rc = c ? s_lookup_sizes(opts, c, &req_bytes, &rep_bytes) : -1;
    kb_client_destroy(&c);
    bench_measure_t kb, echo;
    memset(&kb, 0, sizeof kb);
    snprintf(kb.error, sizeof kb.error, "could not measure the request sizes");
    if (rc == 0)
        rc = s_run_kb(opts, srv, 1, opts->keys, opts->batch, s_op_lookup, opts->clients, opts->seconds, &kb);
    if (rc != 0) {
        s_report_failed(opts, "lookup.throughput", "emb/s", kb.error, failures);
        return;
    }
    st->lookup = kb;
    st->have_lookup = true;
    int erc = bench_zmq_echo(opts, req_bytes, rep_bytes, opts->batch, &echo);
    char note[160];
    snprintf(note, sizeof note, "request %zu B, reply %zu B; inside the server p50 %.0f us", req_bytes, rep_bytes,
             s_server_p50(srv->endpoint, "lookup"));

    /* Latency figures: the value is a percentile, not the rate. */
    bench_result_t r =
        bench_result_of(opts, "lookup.p50", "us", &kb, "zmq.echo.p50 (same bytes)", erc == 0 ? echo.p50_us : NAN);
    r.value = kb.p50_us;
    r.lower_is_better = true;
    r.target = "<= 1.5";
    r.target_ratio = 1.5;
    r.note = note;
    bench_report(opts, &r);

    r = bench_result_of(opts, "lookup.p99", "us", &kb, "zmq.echo.p99 (same bytes)", erc == 0 ? echo.p99_us : NAN);
    r.value = kb.p99_us;
    r.lower_is_better = true;
    bench_report(opts, &r);

    r = bench_result_of(opts, "lookup.throughput", "emb/s", &kb, "redis.mget",
                        st->have_redis ? st->redis_mget.rate : NAN);
    r.target = ">= 1.0";
    r.target_ratio = 1.0;
    r.note = st->have_redis ? NULL : st->redis_note;
    bench_report(opts, &r);

    r = bench_result_of(opts, "lookup.throughput.vs_zmq", "emb/s", &kb, "zmq.echo (same bytes)",
                        erc == 0 ? echo.rate : NAN);
    bench_report(opts, &r);

    bench_measure_t nc;
    s_case_alone(opts, srv, s_op_lookup_no_create, "lookup.no_create", "emb/s", "lookup.throughput", kb.rate,
                 "keys not counted (no use count to write later)", &nc, failures);
}

/* Pushes for the configured time, then waits until nothing is pending. *applied_rate: gradient rows
 * applied (or dropped as outliers) per second from the start until nothing was pending; *received_rate:
 * rows received per second of pushing (warm-up included, as the applied count includes it). */
static int s_measure_push(const bench_opts_t *opts, bench_proc_t *srv, bench_measure_t *kb, double *applied_rate,
                          double *received_rate)
{
    char ep[1][256];
    s_ep(ep[0], srv->endpoint);
    kb_cluster_t *bank = s_bank_open(ep, 1);
    s_tstats_t before, after;
    memset(kb, 0, sizeof *kb);
    memset(&after, 0, sizeof after);
    *applied_rate = *received_rate = NAN;
    int rc = bank ? s_stats(bank, &before) : -1;
    double t0 = bench_now();
    if (rc == 0)
        rc = s_run_kb(opts, srv, 1, opts->keys, opts->batch, s_op_push, opts->clients, opts->seconds, kb);
    double pushed_s = bench_now() - t0;
    if (rc == 0) {
        /* max_age_ms is 1000, so a second or two normally; a loaded machine may take much longer */
        for (int i = 0; i < S_DRAIN_MAX_S * 100; i++) {
            if (s_stats(bank, &after) != 0) {
                rc = -1;
                break;
            }
            if (after.pending_gradients == 0) {
                double drained_s = bench_now() - t0;
                uint64_t applied = (after.gradients_applied - before.gradients_applied) +
                                   (after.outliers_dropped - before.outliers_dropped);
                *applied_rate = (double)applied / drained_s;
                break;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        *received_rate = (double)(after.gradients_received - before.gradients_received) / pushed_s;
    }
    kb_cluster_destroy(&bank);
    if (rc != 0 && !kb->error[0])
        snprintf(kb->error, sizeof kb->error, "stats failed");
    return rc;
}

/* Gradient pushes on the interval-durability server (a training deployment): accepted against a raw
 * ZeroMQ echo of the same bytes, applied against received. */
static void s_case_push(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, const char *durability,
                        int *failures)
{
    bench_progress(opts, "push: %u clients, batch %u rows, lazy updates (max_age 1000 ms, max_pending 16), %s",
                   opts->clients, opts->batch, durability);
    bench_measure_t kb, echo;
    double applied, received;
    /* The floor first, with the server quiet: measured after the pushes it shared the cores with their
     * compaction, a load that moved with the server's own compaction policy between two builds of
     * kb-server. */
    s_wait_not_compacting(srv->endpoint, 30.0);
    int erc = bench_zmq_echo(opts, s_push_request_bytes(opts), 8, opts->batch, &echo);
    if (s_measure_push(opts, srv, &kb, &applied, &received) != 0) {
        s_report_failed(opts, "push.accepted", "rows/s", kb.error, failures);
        return;
    }
    st->push_int = kb;
    st->have_push_int = true;

    bench_result_t r = bench_result_of(opts, "push.accepted", "rows/s", &kb, "zmq.echo (same bytes)",
                                       erc == 0 ? echo.rate : NAN);
    r.target = ">= 0.5";
    r.target_ratio = 0.5;
    r.note = durability;
    bench_report(opts, &r);

    r = bench_result_vs(opts, "push.applied", "rows/s", applied, "push.received (same run)", received);
    r.note = isfinite(applied) ? "rows applied / time until nothing was pending" : "still pending after 60 s";
    bench_report(opts, &r);
}

/* The same pushes on the sync server: each push waits for the group commit holding it. */
static void s_case_push_sync(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, int *failures)
{
    bench_progress(opts, "push: %u clients, batch %u rows, sync durability", opts->clients, opts->batch);
    bench_measure_t kb;
    double applied, received;
    if (s_measure_push(opts, srv, &kb, &applied, &received) != 0) {
        s_report_failed(opts, "push.accepted.sync", "rows/s", kb.error, failures);
        return;
    }
    bench_result_t r = bench_result_of(opts, "push.accepted.sync", "rows/s", &kb, "push.accepted",
                                       st->have_push_int ? st->push_int.rate : NAN);
    r.note = "each push waits for its group commit";
    bench_report(opts, &r);
}

/* A maker's puts against the interval server; Redis's pipelined SET is the reference. */
static void s_case_put_interval(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, int *failures)
{
    bench_progress(opts, "put: %u writers, batch %u rows, %s", opts->clients, opts->batch, opts->interval);
    st->have_put_int = s_case_alone(opts, srv, s_op_put, "put.interval", "rows/s", "redis.set (pipelined)",
                                    st->have_redis ? st->redis_set.rate : NAN,
                                    st->have_redis ? opts->interval : st->redis_note, &st->put_int, failures) == 0;
}

/* Puts with `writers` writers on srv; the note says how many commits and rows per commit it took. */
static int s_measure_put(const bench_opts_t *opts, bench_proc_t *srv, uint32_t writers, bench_measure_t *m,
                         char *note, size_t notelen)
{
    uint64_t c0 = 0, w0 = 0, c1 = 0, w1 = 0;
    s_commits(srv->endpoint, &c0, &w0);
    double t0 = bench_now();
    int rc = s_run_kb(opts, srv, 1, opts->keys, opts->batch, s_op_put, writers, opts->seconds, m);
    double dt = bench_now() - t0;
    s_commits(srv->endpoint, &c1, &w1);
    snprintf(note, notelen, "%.0f commits/s, %.0f rows per commit", (double)(c1 - c0) / dt,
             c1 > c0 ? (double)(w1 - w0) / (double)(c1 - c0) : 0.0);
    return rc;
}

/* A maker's puts against the sync server, with the configured writers and with 8 times as many (group
 * commit: more writers share each commit; one fsync per commit limits it). */
static void s_case_put_sync(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, int *failures)
{
    uint32_t counts[2] = {opts->clients, opts->clients * 8};
    for (int i = 0; i < 2; i++) {
        char name[48], note[128];
        if (i == 0)
            snprintf(name, sizeof name, "put.sync");
        else
            snprintf(name, sizeof name, "put.sync.%uw", counts[i]);
        bench_progress(opts, "%s: %u writers, batch %u rows, sync durability", name, counts[i], opts->batch);
        bench_measure_t m;
        if (s_measure_put(opts, srv, counts[i], &m, note, sizeof note) != 0) {
            s_report_failed(opts, name, "rows/s", m.error, failures);
            if (i == 0)
                s_report_failed(opts, "put.sync.vs_redis", "rows/s", m.error, NULL);
            continue;
        }
        bench_result_t r =
            bench_result_of(opts, name, "rows/s", &m, "put.interval", st->have_put_int ? st->put_int.rate : NAN);
        if (i == 0) {
            r.target = ">= 0.5";
            r.target_ratio = 0.5;
        }
        r.clients = counts[i];
        r.note = note;
        bench_report(opts, &r);
        if (i == 0) {
            /* The same puts against Redis made as durable per reply: the same keys and bytes as pipelined
             * SETs, each acknowledged after Redis's fsync of its append-only file. */
            r.name = "put.sync.vs_redis";
            r.reference = "redis.set.appendfsync_always";
            r.reference_value = st->have_redis_aof ? st->redis_aof_set.rate : NAN;
            r.target = ">= 1.0";
            r.target_ratio = 1.0;
            r.note = st->have_redis_aof ? note : st->redis_aof_note;
            bench_report(opts, &r);
        }
    }
}

/* Lookups on the interval server, alone: the mixed load's reference, and how much the sync server's
 * 200 ms persistence of frequency counts costs. */
static void s_case_lookup_interval(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, int *failures)
{
    bench_progress(opts, "lookup: %u clients, batch %u, %s", opts->clients, opts->batch, opts->interval);
    st->have_lookup_int = s_case_alone(opts, srv, s_op_lookup, "lookup.throughput.interval", "emb/s",
                                       "lookup.throughput", st->have_lookup ? st->lookup.rate : NAN, opts->interval,
                                       &st->lookup_int, failures) == 0;
}

/* nlist for an IVF table of n rows: sqrt(n) rounded down to a power of two, 16..1024. */
static uint32_t s_nlist(uint32_t n)
{
    uint32_t target = (uint32_t)sqrt((double)n), nlist = 16;
    while (nlist * 2 <= target && nlist < 1024)
        nlist *= 2;
    return nlist;
}

/* Waits until the server's index holds all n rows and is up to date. */
static int s_wait_index(kb_cluster_t *bank, uint64_t n, double timeout_s)
{
    double deadline = bench_now() + timeout_s;
    while (bench_now() < deadline) {
        s_tstats_t s;
        if (s_stats(bank, &s) != 0)
            return -1;
        if (s.knn_count == n && s.knn_pending == 0 && s.knn_ready && !s.knn_building && s.knn_indexed >= n)
            return 0;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static void s_case_knn(const bench_opts_t *opts, int *failures)
{
    for (int ri = 0; ri < 4 && opts->knn_rows[ri]; ri++) {
        uint32_t n = opts->knn_rows[ri];
        float *rows = carls_xmalloc((size_t)n * opts->dim * sizeof(float));
        for (uint32_t i = 0; i < n; i++)
            bench_value(i, opts->dim, rows + (size_t)i * opts->dim);
        char ivf[32];
        snprintf(ivf, sizeof ivf, "IVF%u,Flat", s_nlist(n));
        const char *specs[3] = {"Flat", ivf, "HNSW32"};
        const char *short_names[3] = {"flat", "ivf", "hnsw"};
        for (int si = 0; si < 3; si++) {
            if (opts->knn_specs && !strstr(opts->knn_specs, short_names[si]))
                continue;
            char name[64], load_name[64], size[16];
            if (n >= 1000000 && n % 1000000 == 0)
                snprintf(size, sizeof size, "%um", n / 1000000);
            else if (n % 1000 == 0)
                snprintf(size, sizeof size, "%uk", n / 1000);
            else
                snprintf(size, sizeof size, "%u", n);
            snprintf(name, sizeof name, "knn.%s.%s", short_names[si], size);
            snprintf(load_name, sizeof load_name, "knn.%s.%s.load", short_names[si], size);
            bench_progress(opts, "%s: %s, %u rows, %u queries x k=%u per request, %u clients", name, specs[si], n,
                           opts->knn_batch, opts->knn_k, opts->clients);
            bench_proc_t srv;
            const char *extra[] = {"--durability", opts->interval, NULL};
            bench_measure_t kb, ref;
            double load_s = NAN, build_ref_s = NAN, server_p50 = NAN;
            char why[300] = "";
            int rc = bench_kb_start(opts, "kb-knn", extra, &srv);
            if (rc == 0) {
                char ep[1][256];
                s_ep(ep[0], srv.endpoint);
                kb_cluster_t *bank = s_bank_open(ep, 1);
                rc = bank ? s_create(bank, opts->dim, specs[si]) : -1;
                double t0 = bench_now();
                if (rc == 0)
                    rc = s_load(bank, opts->dim, 0, n, rows);
                if (rc == 0)
                    rc = s_wait_index(bank, n, 1800.0);
                load_s = bench_now() - t0;
                kb_cluster_destroy(&bank);
                if (rc != 0)
                    snprintf(why, sizeof why, "loading the server's table or index failed");
                if (rc == 0) {
                    char endpoints[1][256];
                    s_ep(endpoints[0], srv.endpoint);
                    s_kb_arg_t a = {.opts = opts, .endpoints = endpoints, .shards = 1, .keys = n, .batch = 1,
                                    .rows = rows, .n_rows = n};
                    bench_workload_t w = {s_kb_thread_new, s_kb_thread_free, s_op_knn, &a};
                    rc = bench_run(&w, opts->clients, opts->warmup, opts->seconds, &kb);
                    if (rc != 0)
                        snprintf(why, sizeof why, "%s", kb.error);
                    server_p50 = s_server_p50(srv.endpoint, "knn");
                }
                bench_proc_stop(opts, &srv);
            } else {
                snprintf(why, sizeof why, "kb-server did not start");
            }
            if (rc != 0) {
                s_report_failed(opts, name, "queries/s", why, failures);
                continue;
            }
            int frc = bench_faiss(opts, specs[si], rows, n, &ref, &build_ref_s);
            bench_result_t r = bench_result_of(opts, name, "queries/s", &kb, "faiss.inprocess",
                                               frc == 0 ? ref.rate : NAN);
            r.target = ">= 0.8";
            r.target_ratio = 0.8;
            r.batch = opts->knn_batch;
            r.rows = n;
            char note[200];
            snprintf(note, sizeof note, "%s; p50 per request: %.0f us here, %.0f us inside the server, %.0f us in process",
                     specs[si], kb.p50_us, server_p50, frc == 0 ? ref.p50_us : NAN);
            r.note = frc == 0 ? note : ref.error;
            bench_report(opts, &r);

            r = bench_result_vs(opts, load_name, "rows/s", (double)n / load_s,
                                "faiss.inprocess build", frc == 0 ? (double)n / build_ref_s : NAN);
            r.batch = S_LOAD_BATCH;
            r.clients = 1;
            r.rows = n;
            r.note = "put + index + SQLite, until the index is up to date";
            bench_report(opts, &r);
        }
        free(rows);
    }
}

/* Two workloads at once (trainers and makers), each for the same window. */
typedef struct {
    const bench_opts_t *opts;
    bench_proc_t *srv;
    bench_op_fn op;
    uint32_t clients;
    bench_measure_t m;
    int rc;
} s_concurrent_t;

static void *s_concurrent_main(void *arg)
{
    s_concurrent_t *c = arg;
    c->rc = s_run_kb(c->opts, c->srv, 1, c->opts->keys, c->opts->batch, c->op, c->clients, c->opts->mixed_seconds,
                     &c->m);
    return NULL;
}

/* The trainers (op) and the makers (puts, --mixed-makers) at once, for the mixed load's duration. Returns 0
 * when both ran; else reports name as failed. */
static int s_run_mixed(const bench_opts_t *opts, bench_proc_t *srv, bench_op_fn op, const char *name,
                       s_concurrent_t *tr, s_concurrent_t *mk, int *failures)
{
    *tr = (s_concurrent_t){.opts = opts, .srv = srv, .op = op, .clients = opts->clients};
    *mk = (s_concurrent_t){.opts = opts, .srv = srv, .op = s_op_put, .clients = opts->mixed_makers};
    pthread_t a, b;
    bool makers = opts->mixed_makers > 0;
    if (pthread_create(&a, NULL, s_concurrent_main, tr) != 0 ||
        (makers && pthread_create(&b, NULL, s_concurrent_main, mk) != 0))
        CARLS_FATAL("cannot start the mixed load");
    pthread_join(a, NULL);
    if (makers)
        pthread_join(b, NULL);
    if (tr->rc == 0 && mk->rc == 0)
        return 0;
    s_report_failed(opts, name, "emb/s", tr->rc != 0 ? tr->m.error : mk->m.error, failures);
    return -1;
}

static void s_case_mixed(const bench_opts_t *opts, bench_proc_t *srv, s_state_t *st, int *failures)
{
    uint32_t makers = opts->mixed_makers;
    bench_progress(opts, "mixed: %u trainers (lookup + push) and %u maker (put) for %.1f s, %s", opts->clients,
                   makers, opts->mixed_seconds, opts->connect ? opts->connect : opts->interval);
    s_concurrent_t tr, mk;
    if (s_run_mixed(opts, srv, s_op_trainer, "mixed.lookup", &tr, &mk, failures) != 0)
        return;
    bench_result_t r = bench_result_of(opts, "mixed.lookup", "emb/s", &tr.m, "lookup.throughput.interval (alone)",
                                       st->have_lookup_int ? st->lookup_int.rate : NAN);
    r.target = ">= 0.5";
    r.target_ratio = 0.5;
    r.note = makers == 1 ? "latency: one trainer step = lookup + push"
                         : makers ? "latency: one trainer step = lookup + push; not 1 maker (--mixed-makers)"
                                  : "latency: one trainer step = lookup + push; no maker (--mixed-makers 0)";
    bench_report(opts, &r);

    /* Every step pushes as many rows as it read: the trainers' rate (their latency is mixed.lookup's). */
    r = bench_result_vs(opts, "mixed.push", "rows/s", tr.m.rate,
                        "push.accepted (alone)", st->have_push_int ? st->push_int.rate : NAN);
    bench_report(opts, &r);

    if (makers) {
        r = bench_result_of(opts, "mixed.put", "rows/s", &mk.m, "put.interval (alone)",
                            st->have_put_int ? st->put_int.rate : NAN);
        r.clients = makers;
        bench_report(opts, &r);
    }

    /* The same load with each trainer's push pipelined behind its next lookup: how much of mixed.lookup's
     * gap is the push's own round trip rather than the maker's writes. */
    bench_progress(opts, "mixed: the same with pipelined pushes (one in flight per trainer) for %.1f s",
                   opts->mixed_seconds);
    s_concurrent_t tp, mp;
    if (s_run_mixed(opts, srv, s_op_trainer_pipelined, "mixed.lookup.pipelined", &tp, &mp, failures) != 0)
        return;
    r = bench_result_of(opts, "mixed.lookup.pipelined", "emb/s", &tp.m, "lookup.throughput.interval (alone)",
                        st->have_lookup_int ? st->lookup_int.rate : NAN);
    r.note = "trainers keep one push in flight, as trainer_word2vec does; no target";
    bench_report(opts, &r);
}

static void s_case_shards(const bench_opts_t *opts, int *failures)
{
    double base_lookup = NAN, base_put = NAN;
    for (int i = 0; i < 4 && opts->shard_counts[i]; i++) {
        uint32_t shards = opts->shard_counts[i];
        if (shards > S_MAX_SHARDS)
            continue;
        bench_progress(opts, "shards: %u kb-server processes, %u clients", shards, opts->clients);
        bench_proc_t srv[S_MAX_SHARDS];
        memset(srv, 0, sizeof srv);
        int rc = 0;
        for (uint32_t s = 0; s < shards && rc == 0; s++) {
            char shard[32];
            snprintf(shard, sizeof shard, "%u/%u", s, shards);
            const char *extra[] = {"--shard", shard, NULL};
            rc = bench_kb_start(opts, "kb-shard", extra, &srv[s]);
        }
        bench_measure_t lk, pt;
        if (rc == 0) {
            char eps[S_MAX_SHARDS][256];
            for (uint32_t s = 0; s < shards; s++)
                s_ep(eps[s], srv[s].endpoint);
            kb_cluster_t *bank = s_bank_open(eps, shards);
            rc = bank ? s_create(bank, opts->dim, NULL) : -1;
            if (rc == 0)
                rc = s_load(bank, opts->dim, 0, opts->keys, NULL);
            kb_cluster_destroy(&bank);
        }
        if (rc == 0)
            rc = s_run_kb(opts, srv, shards, opts->keys, opts->batch, s_op_lookup, opts->clients, opts->seconds, &lk);
        if (rc == 0)
            rc = s_run_kb(opts, srv, shards, opts->keys, opts->batch, s_op_put, opts->clients, opts->seconds, &pt);
        for (uint32_t s = 0; s < shards; s++)
            bench_proc_stop(opts, &srv[s]);
        char name[64];
        snprintf(name, sizeof name, "shards.%u.lookup", shards);
        if (rc != 0) {
            s_report_failed(opts, name, "emb/s", "a shard failed", failures);
            continue;
        }
        if (i == 0) {
            base_lookup = lk.rate;
            base_put = pt.rate;
        }
        char ref[64];
        snprintf(ref, sizeof ref, "shards.%u.lookup", opts->shard_counts[0]);
        bench_result_t r = bench_result_of(opts, name, "emb/s", &lk, ref, base_lookup);
        r.shards = shards;
        bench_report(opts, &r);

        char pname[64], pref[64];
        snprintf(pname, sizeof pname, "shards.%u.put.sync", shards);
        snprintf(pref, sizeof pref, "shards.%u.put.sync", opts->shard_counts[0]);
        r = bench_result_of(opts, pname, "rows/s", &pt, pref, base_put);
        r.shards = shards;
        bench_report(opts, &r);
    }
}

/* Starts one kb-server (`name`, extra flags) with the bench table created on it: 0, or -1 when the bank could
 * not be opened or the table created (the caller still closes *bank, possibly NULL, and stops *srv). When the
 * server does not start: reports case_name as failed with `why` and returns -2 (nothing to stop). */
static int s_start_with_table(const bench_opts_t *opts, const char *name, const char **extra, const char *case_name,
                              const char *why, bench_proc_t *srv, kb_cluster_t **bank, int *failures)
{
    *bank = NULL;
    if (bench_kb_start(opts, name, extra, srv) != 0) {
        s_report_failed(opts, case_name, "emb/s", why, failures);
        return -2;
    }
    char ep[1][256];
    s_ep(ep[0], srv->endpoint);
    *bank = s_bank_open(ep, 1);
    return *bank ? s_create(*bank, opts->dim, NULL) : -1;
}

static void s_case_rows(const bench_opts_t *opts, int *failures)
{
    bench_proc_t srv;
    const char *extra[] = {"--durability", opts->interval, NULL};
    kb_cluster_t *bank;
    int rc = s_start_with_table(opts, "kb-rows", extra, "rows.lookup", "kb-server did not start", &srv, &bank,
                                failures);
    if (rc == -2)
        return;
    uint64_t rss0 = kb_memory_proc_status_kb(srv.pid, "VmRSS") * 1024;
    uint32_t loaded = 0;
    double base = NAN, base_mem = NAN;
    char base_name[64] = "", base_mem_name[64] = "";
    for (int i = 0; i < 5 && opts->row_counts[i] && rc == 0; i++) {
        uint32_t n = opts->row_counts[i];
        bench_progress(opts, "rows: lookups over %u rows", n);
        rc = s_load(bank, opts->dim, loaded, n, NULL);
        if (rc != 0)
            break;
        loaded = n;
        bench_measure_t m;
        rc = s_run_kb(opts, &srv, 1, n, opts->batch, s_op_lookup, opts->clients, opts->seconds, &m);
        if (rc != 0)
            break;
        char name[64], mem_name[64];
        snprintf(name, sizeof name, "rows.%u.lookup", n);
        snprintf(mem_name, sizeof mem_name, "rows.%u.memory", n);
        double per_row = ((double)kb_memory_proc_status_kb(srv.pid, "VmRSS") * 1024 - (double)rss0) / n;
        if (i == 0) {
            base = m.rate;
            base_mem = per_row;
            snprintf(base_name, sizeof base_name, "%s", name);
            snprintf(base_mem_name, sizeof base_mem_name, "%s", mem_name);
        }
        bench_result_t r = bench_result_of(opts, name, "emb/s", &m, base_name, base);
        r.rows = n;
        bench_report(opts, &r);
        r = bench_result_vs(opts, mem_name, "B/row", per_row, base_mem_name, base_mem);
        r.rows = n;
        r.note = "server RSS growth / rows (dim floats + optimizer state + key + SQLite cache)";
        bench_report(opts, &r);
    }
    kb_cluster_destroy(&bank);
    bench_proc_stop(opts, &srv);
    if (rc != 0) {
        s_report_failed(opts, "rows.lookup", "emb/s", "loading or lookups failed", failures);
    }
}

/* ---- tables larger than memory (issue 20: kb-server --cache-bytes) ---- */

#define S_CACHE_HOT_ROWS 4096u /* the working set that fits in the cache */

/* Lookups on a server that keeps only part of its table in memory: over a working set that fits in the
 * cache (lookup.cached), and uniformly over a table several times the cache (lookup.cold: most keys are
 * read back from SQLite). Also the server's peak resident size against the table's in-memory size. Run
 * only when named (--cases cache): it loads a table five times --keys. */
static void s_case_cache(const bench_opts_t *opts, s_state_t *st, int *failures)
{
    uint64_t row_bytes = 256 + (uint64_t)opts->dim * 8; /* generous: row block, key, map slot */
    uint64_t cache = 4 * S_CACHE_HOT_ROWS * row_bytes;
    if (cache < ((uint64_t)8 << 20))
        cache = (uint64_t)8 << 20;
    uint64_t rows64 = (uint64_t)opts->keys * 5;
    if (rows64 * row_bytes < 4 * cache)
        rows64 = 4 * cache / row_bytes;
    uint32_t rows = rows64 > UINT32_MAX ? UINT32_MAX : (uint32_t)rows64;
    char cache_arg[32];
    snprintf(cache_arg, sizeof cache_arg, "%lluK", (unsigned long long)(cache >> 10));
    const char *extra[] = {"--cache-bytes", cache_arg, NULL};
    bench_proc_t srv;
    kb_cluster_t *bank;
    int rc = s_start_with_table(opts, "kb-cache", extra, "lookup.cached", "kb-server --cache-bytes did not start",
                                &srv, &bank, failures);
    if (rc == -2)
        return;
    bench_progress(opts, "cache: loading %u rows of dim %u into a server with --cache-bytes %s", rows, opts->dim,
                   cache_arg);
    if (rc == 0)
        rc = s_load(bank, opts->dim, 0, rows, NULL);
    kb_cluster_destroy(&bank);
    bench_measure_t hot, cold;
    memset(&hot, 0, sizeof hot);
    memset(&cold, 0, sizeof cold);
    if (rc == 0) {
        bench_progress(opts, "cache: lookups over %u rows (in the cache), then over all %u", S_CACHE_HOT_ROWS, rows);
        rc = s_run_kb(opts, &srv, 1, S_CACHE_HOT_ROWS, opts->batch, s_op_lookup, opts->clients, opts->seconds, &hot);
    }
    if (rc == 0)
        rc = s_run_kb(opts, &srv, 1, rows, opts->batch, s_op_lookup, opts->clients, opts->seconds, &cold);
    double hwm_mib = (double)kb_memory_proc_status_kb(srv.pid, "VmHWM") / 1024.0;
    bench_proc_stop(opts, &srv);
    if (rc != 0) {
        s_report_failed(opts, "lookup.cached", "emb/s", hot.error[0] ? hot.error : "loading or lookups failed",
                        failures);
        return;
    }
    char note[200];
    snprintf(note, sizeof note, "--cache-bytes %s, %u rows; keys drawn from the first %u (in memory)", cache_arg,
             rows, S_CACHE_HOT_ROWS);
    bench_result_t r = bench_result_of(opts, "lookup.cached", "emb/s", &hot, "lookup.throughput",
                                       st->have_lookup ? st->lookup.rate : NAN);
    r.rows = rows;
    r.note = note;
    bench_report(opts, &r);

    char cold_note[200];
    snprintf(cold_note, sizeof cold_note, "keys drawn from all %u rows, about %.0f%% of them in memory: the rest "
             "read from SQLite", rows, 100.0 * (double)cache / (double)row_bytes / rows);
    r = bench_result_of(opts, "lookup.cold", "emb/s", &cold, "lookup.cached", hot.rate);
    r.rows = rows;
    r.note = cold_note;
    bench_report(opts, &r);

    r = bench_result_vs(opts, "cache.peak_rss", "MiB", hwm_mib,
                        "whole table in memory (estimate)", (double)rows * (double)row_bytes / (1024.0 * 1024.0));
    r.lower_is_better = true;
    r.rows = rows;
    r.note = "server VmHWM over the load and both cases";
    bench_report(opts, &r);
}

/* The Redis references, first (each redis-server is its own process, stopped before the kb cases so it
 * takes no memory or CPU from them): MGET and pipelined SET without persistence for lookups and interval
 * puts, pipelined SET with appendfsync always for sync puts. Unavailable references keep a note saying why. */
static void s_measure_redis(const bench_opts_t *opts, s_state_t *st)
{
    st->redis_note = "redis-server unavailable";
    st->redis_aof_note = "redis-server unavailable";
    if (!opts->redis_server[0])
        return;
    bench_proc_t redis;
    if (bench_selected(opts, "lookup") || bench_selected(opts, "put")) {
        if (bench_redis_start(opts, BENCH_REDIS_NO_PERSISTENCE, &redis) == 0) {
            bench_progress(opts, "redis: MGET of %u keys and pipelined SET of %u rows, %u B values, %u clients",
                           opts->batch, opts->batch, opts->dim * 4, opts->clients);
            st->have_redis = bench_redis(opts, redis.port, &st->redis_mget, &st->redis_set) == 0;
            if (!st->have_redis)
                st->redis_note = "redis benchmark failed";
            bench_proc_stop(opts, &redis);
        } else {
            bench_progress(opts, "redis-server not available: Redis references reported as n/a");
        }
    }
    if (bench_selected(opts, "put") && !opts->connect) { /* --connect runs no put case */
        if (bench_redis_start(opts, BENCH_REDIS_AOF_ALWAYS, &redis) == 0) {
            bench_progress(opts, "redis (appendonly yes, appendfsync always): pipelined SET of %u rows, %u B "
                           "values, %u clients", opts->batch, opts->dim * 4, opts->clients);
            st->have_redis_aof = bench_redis(opts, redis.port, NULL, &st->redis_aof_set) == 0;
            if (!st->have_redis_aof)
                st->redis_aof_note = "redis (appendfsync always) benchmark failed";
            bench_proc_stop(opts, &redis);
        } else {
            bench_progress(opts, "redis-server (appendfsync always) not available: reported as n/a");
        }
    }
}

/* Creates the table and loads opts->keys rows. */
static int s_prepare(const bench_opts_t *opts, bench_proc_t *srv)
{
    char ep[1][256];
    s_ep(ep[0], srv->endpoint);
    kb_cluster_t *bank = s_bank_open(ep, 1);
    int rc = bank ? s_create(bank, opts->dim, NULL) : -1;
    if (rc == 0) {
        bench_progress(opts, "loading %u rows of dim %u into %s", opts->keys, opts->dim, srv->endpoint);
        rc = s_load(bank, opts->dim, 0, opts->keys, NULL);
    }
    kb_cluster_destroy(&bank);
    return rc;
}

int bench_kb_all(const bench_opts_t *opts)
{
    int failures = 0;
    s_state_t st;
    memset(&st, 0, sizeof st);
    s_measure_redis(opts, &st);

    /* Two servers with the same table and rows: default settings (sync durability) and interval
     * durability. With --connect, the given server stands for both and the sync/interval comparisons are
     * skipped. */
    bool need_sync = bench_selected(opts, "lookup") || bench_selected(opts, "push") || bench_selected(opts, "put");
    bool need_int = !opts->connect && (need_sync || bench_selected(opts, "mixed"));
    if (opts->connect)
        need_sync = need_sync || bench_selected(opts, "mixed");
    bench_proc_t sync_srv, int_srv;
    memset(&sync_srv, 0, sizeof sync_srv);
    memset(&int_srv, 0, sizeof int_srv);
    int rc = 0;
    if (need_sync) {
        if (opts->connect)
            s_ep(sync_srv.endpoint, opts->connect);
        else
            rc = bench_kb_start(opts, "kb-sync", NULL, &sync_srv);
        if (rc == 0)
            rc = s_prepare(opts, &sync_srv);
    }
    if (rc == 0 && need_int) {
        const char *extra[] = {"--durability", opts->interval, NULL};
        rc = bench_kb_start(opts, "kb-interval", extra, &int_srv);
        if (rc == 0)
            rc = s_prepare(opts, &int_srv);
    }
    if (rc != 0) {
        s_report_failed(opts, "setup", "", "a kb-server could not be started or loaded", NULL);
        bench_proc_stop(opts, &sync_srv);
        bench_proc_stop(opts, &int_srv);
        return -1;
    }
    bench_proc_t *train_srv = opts->connect ? &sync_srv : &int_srv; /* pushes and the mixed load */
    if (bench_selected(opts, "lookup")) {
        s_case_lookup(opts, &sync_srv, &st, &failures);
        if (!opts->connect)
            s_case_lookup_interval(opts, &int_srv, &st, &failures);
    }
    if (bench_selected(opts, "push")) {
        s_case_push(opts, train_srv, &st, opts->connect ? "the --connect server" : opts->interval, &failures);
        if (!opts->connect)
            s_case_push_sync(opts, &sync_srv, &st, &failures);
    }
    if (bench_selected(opts, "put")) {
        if (!opts->connect)
            s_case_put_interval(opts, &int_srv, &st, &failures);
        s_case_put_sync(opts, &sync_srv, &st, &failures); /* with --connect: puts at that server's durability */
    }
    if (bench_selected(opts, "mixed"))
        s_case_mixed(opts, train_srv, &st, &failures);
    bench_proc_stop(opts, &sync_srv);
    bench_proc_stop(opts, &int_srv);
    if (opts->connect) {
        if (bench_selected(opts, "knn") || bench_selected(opts, "shards") || bench_selected(opts, "rows"))
            bench_progress(opts, "--connect: put, knn, shards and rows need servers of their own; skipped");
        return failures ? -1 : 0;
    }
    if (bench_selected(opts, "knn"))
        s_case_knn(opts, &failures);
    if (bench_selected(opts, "shards"))
        s_case_shards(opts, &failures);
    if (bench_selected(opts, "rows"))
        s_case_rows(opts, &failures);
    if (opts->cases && bench_selected(opts, "cache")) /* only when named: see s_case_cache */
        s_case_cache(opts, &st, &failures);
    if (bench_workload_selected(opts))
        bench_workload_all(opts, &failures);
    return failures ? -1 : 0;
}
