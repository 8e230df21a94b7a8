/* Integration (labels integration, hostile): a kb-server with a small --max-memory under several hostile
 * clients at once, while a well-behaved client keeps reading:
 *  - a flood of distinct keys (CARLS_HOSTILE_KEYS, default 2 million, dim 4, in batches of 25000, by puts and
 *    by lookups that create rows) that runs into the memory limit and is refused from then on;
 *  - rounds of HOSTILE_CONNECTIONS DEALER sockets opened at once, each sending one request;
 *  - random bytes, truncated requests, huge declared lengths, NaN/Inf and wrong-dimension rows, too many
 *    keys, oversized and multi-part frames (the same kinds as test_server_hostile, here concurrently);
 *  - the well-behaved client looks up existing keys in a loop, each answer within 5 s and right.
 * Asserts: the well-behaved client never failed; every hostile single frame within the size limit was
 * answered; the refusals are in stats (server-wide and per table); the server's peak resident size (VmHWM
 * in /proc/PID/status, sampled VmRSS beside it) stays under its resident size before the load + --max-memory
 * + S_OVERHEAD_MIB (see there; more under ASan); and it exits 0 on SIGTERM (under the
 * sanitizers LeakSanitizer checks it then). Everything is on 127.0.0.1. Prints the figures. */
#include "kb_cluster.h"
#include "protocol.h"
#include "raw_client.h"
#include "kb_memory.h"
#include "server_fixture.h"
#include "util.h"
#include "test_util.h"
#include "test_proto.h"

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>
#include "test_main.h"

#define LIMIT_MIB 64
#define MAX_MESSAGE (4u << 20)
#define DIM 4
#define FLOOD_BATCH 25000
#define GOOD_KEYS 1000
#define GOOD_BATCH 100
#define HOSTILE_CONNECTIONS 300
#define CONNECTION_ROUNDS 3
#define REPLY_DEADLINE_MS 5000
/* Resident memory allowed: the idle server's + S_LIMIT_FACTOR x --max-memory + S_OVERHEAD_MIB. The overhead
 * is malloc's free lists and per-thread arenas, requests being decoded (FLOOD_BATCH keys at a time),
 * ZeroMQ's buffers for hundreds of connections and oversized frames, SQLite's page cache. Under
 * AddressSanitizer the estimate (malloc's sizes) undercounts: every block carries ASan's header and redzone (a
 * 208-byte row block takes about 256 and 32 of shadow), so the data counts twice, and its quarantine of
 * freed blocks (capped here at 32 MiB for the server) comes on top. docs/RELIABILITY.md has the figures. */
#ifdef TEST_SANITIZED
#define S_LIMIT_FACTOR 2
#define S_OVERHEAD_MIB 160
#else
#define S_LIMIT_FACTOR 1
#define S_OVERHEAD_MIB 48
#endif

static int s_setup(void **state)
{
    /* Hundreds of sockets here and in the server: raise the descriptor limit to the hard limit. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
#ifdef TEST_SANITIZED
    /* Keep ASan's quarantine of freed blocks (default 256 MiB) from dwarfing the limit under test. */
    test_asan_options_append("quarantine_size_mb=32");
#endif
    char limit[32], msg[32];
    snprintf(limit, sizeof limit, "%dM", LIMIT_MIB);
    snprintf(msg, sizeof msg, "%u", MAX_MESSAGE);
    const char *args[] = {"--max-memory", limit, "--max-message-bytes", msg, "--threads", "2", NULL};
    return server_fixture_setup_server(state, args);
}

typedef struct {
    const char *endpoint;
    pid_t server;
    atomic_bool stop;     /* set when the hostile clients are done */
    atomic_int hostile_running;
    /* flood */
    uint64_t flood_keys;
    uint64_t keys_sent, requests_ok, requests_refused, requests_other;
    char flood_error[256];
    /* connections */
    uint64_t connections_opened, connection_replies;
    /* garbage */
    uint64_t hostile_sent, hostile_expected, hostile_answered, hostile_status_ok;
    /* good client */
    uint64_t good_lookups, good_failures, good_wrong;
    int64_t good_max_us;
    char good_error[256];
    /* rss */
    uint64_t rss_max_kb, rss_samples;
} s_shared_t;

static void s_good_value(size_t i, float *v)
{
    for (int d = 0; d < DIM; d++)
        v[d] = (float)i + 0.25f * (float)d;
}

/* ---- the flood of distinct keys ---- */

static void *s_flood_main(void *arg)
{
    s_shared_t *sh = arg;
    kb_client_options_t opts = {.timeout_ms = 60000, .retries = 0};
    kb_cluster_t *c = kb_cluster_new(sh->endpoint, &opts);
    kb_key_t *keys = calloc(FLOOD_BATCH, sizeof *keys);
    char *text = calloc(FLOOD_BATCH, 16);
    float *values = calloc((size_t)FLOOD_BATCH * DIM, sizeof *values);
    float *out = calloc((size_t)FLOOD_BATCH * DIM, sizeof *out);
    for (size_t i = 0; i < (size_t)FLOOD_BATCH * DIM; i++)
        values[i] = 0.001f * (float)(i % 1000);
    for (uint64_t sent = 0, round = 0; c && sent < sh->flood_keys; round++) {
        size_t n = FLOOD_BATCH;
        if (sh->flood_keys - sent < n)
            n = (size_t)(sh->flood_keys - sent);
        for (size_t i = 0; i < n; i++) {
            int len = snprintf(text + 16 * i, 16, "f%llx", (unsigned long long)(sent + i));
            keys[i] = (kb_key_t){.data = text + 16 * i, .len = (size_t)len};
        }
        /* Alternate puts and lookups that create rows. */
        int rc = round % 2 == 0 ? kb_cluster_put(c, "flood", keys, n, DIM, values, 1)
                                : kb_cluster_lookup(c, "flood", keys, n, DIM, out, NULL);
        sent += n;
        sh->keys_sent = sent;
        if (rc == 0) {
            sh->requests_ok++;
        } else if (rc == KB_CLIENT_ESTATUS &&
                   kb_cluster_last_status(c) == CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED) {
            sh->requests_refused++;
        } else {
            sh->requests_other++;
            snprintf(sh->flood_error, sizeof sh->flood_error, "%s", kb_cluster_last_error(c));
        }
    }
    kb_cluster_destroy(&c);
    free(keys);
    free(text);
    free(values);
    free(out);
    atomic_fetch_sub(&sh->hostile_running, 1);
    return NULL;
}

/* ---- hundreds of connections at once ---- */

static void *s_connections_main(void *arg)
{
    s_shared_t *sh = arg;
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 4 * HOSTILE_CONNECTIONS);
    void **socks = calloc(HOSTILE_CONNECTIONS, sizeof *socks);
    zmq_pollitem_t *items = calloc(HOSTILE_CONNECTIONS, sizeof *items);
    for (int round = 0; round < CONNECTION_ROUNDS; round++) {
        int opened = 0;
        for (int i = 0; i < HOSTILE_CONNECTIONS; i++) {
            socks[i] = zmq_socket(ctx, ZMQ_DEALER);
            if (!socks[i])
                break;
            int linger = 0;
            zmq_setsockopt(socks[i], ZMQ_LINGER, &linger, sizeof linger);
            if (zmq_connect(socks[i], sh->endpoint) != 0) {
                zmq_close(socks[i]);
                socks[i] = NULL;
                break;
            }
            opened++;
        }
        /* Each sends one lookup (no_create) of a good key; every one must be answered. */
        for (int i = 0; i < opened; i++) {
            Carls__Request req = CARLS__REQUEST__INIT;
            Carls__Lookup lk = CARLS__LOOKUP__INIT;
            char key[16];
            int len = snprintf(key, sizeof key, "good%d", i % GOOD_KEYS);
            ProtobufCBinaryData k = {.len = (size_t)len, .data = (uint8_t *)key};
            lk.n_keys = 1;
            lk.keys = &k;
            lk.no_create = true;
            req.protocol_version = CARLS_PROTOCOL_VERSION;
            req.request_id = (uint64_t)i + 1;
            req.table = "good";
            req.op_case = CARLS__REQUEST__OP_LOOKUP;
            req.lookup = &lk;
            uint8_t buf[128];
            size_t n = carls__request__pack(&req, buf);
            zmq_send(socks[i], buf, n, 0);
            items[i] = (zmq_pollitem_t){.socket = socks[i], .events = ZMQ_POLLIN};
        }
        sh->connections_opened += (uint64_t)opened;
        int64_t deadline = carls_monotonic_ms() + 60000;
        int answered = 0;
        bool *done = calloc((size_t)opened + 1, sizeof *done);
        while (answered < opened && carls_monotonic_ms() < deadline) {
            if (zmq_poll(items, opened, 1000) <= 0)
                continue;
            for (int i = 0; i < opened; i++) {
                if (done[i] || !(items[i].revents & ZMQ_POLLIN))
                    continue;
                zmq_msg_t msg;
                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, socks[i], ZMQ_DONTWAIT) >= 0) {
                    Carls__Response *r = carls__response__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
                    if (r && r->status == CARLS__STATUS_CODE__STATUS_OK && r->request_id == (uint64_t)i + 1) {
                        done[i] = true;
                        answered++;
                    }
                    if (r)
                        carls__response__free_unpacked(r, NULL);
                }
                zmq_msg_close(&msg);
            }
        }
        free(done);
        sh->connection_replies += (uint64_t)answered;
        for (int i = 0; i < opened; i++)
            zmq_close(socks[i]);
    }
    free(socks);
    free(items);
    zmq_ctx_term(ctx);
    atomic_fetch_sub(&sh->hostile_running, 1);
    return NULL;
}

/* ---- malformed and malicious frames ---- */

static uint64_t s_rng(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return *state >> 17;
}

/* Appends a protobuf varint. */
static size_t s_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Sends one frame; when an answer is due, waits for it (counted if it comes). */
static void s_hostile_send(s_shared_t *sh, raw_client_t *rc, const void *buf, size_t len, bool answer_due)
{
    if (raw_send(rc, buf, len) != 0)
        return;
    sh->hostile_sent++;
    if (!answer_due)
        return;
    sh->hostile_expected++;
    Carls__Response *r = raw_recv(rc, 30000);
    if (r) {
        sh->hostile_answered++;
        if (r->status == CARLS__STATUS_CODE__STATUS_OK)
            sh->hostile_status_ok++;
        carls__response__free_unpacked(r, NULL);
    }
}

/* A packed request with the envelope filled. Caller frees. */
static uint8_t *s_pack(Carls__Request *req, uint64_t id, size_t *len)
{
    req->protocol_version = CARLS_PROTOCOL_VERSION;
    req->request_id = id;
    req->client_id = 0xbad;
    req->sequence = id;
    *len = carls__request__get_packed_size(req);
    uint8_t *buf = malloc(*len ? *len : 1);
    carls__request__pack(req, buf);
    return buf;
}

static void *s_garbage_main(void *arg)
{
    s_shared_t *sh = arg;
    raw_client_t rc;
    if (raw_open(&rc, sh->endpoint) != 0) {
        atomic_fetch_sub(&sh->hostile_running, 1);
        return NULL;
    }
    uint64_t rng = 0x5eed;
    uint8_t *buf = malloc(MAX_MESSAGE * 3);
    ProtobufCBinaryData key = {.len = 5, .data = (uint8_t *)"good1"};
    for (int round = 0; round < 40; round++) {
        /* Random bytes of random length. */
        for (int i = 0; i < 40; i++) {
            size_t n = 1 + s_rng(&rng) % 4096;
            for (size_t j = 0; j < n; j++)
                buf[j] = (uint8_t)s_rng(&rng);
            s_hostile_send(sh, &rc, buf, n, true);
        }
        /* Huge declared lengths: a lookup field claiming 4 GiB, a key claiming 2 GiB inside a lookup, a
         * packed float array claiming a billion values. */
        size_t n = 0;
        buf[n++] = 0x08; /* protocol_version = 1 */
        buf[n++] = 0x01;
        buf[n++] = (13 << 3) | 2; /* lookup */
        n += s_varint(buf + n, 0xffffffffull);
        memset(buf + n, 0x0a, 16);
        s_hostile_send(sh, &rc, buf, n + 16, true);
        n = 0;
        buf[n++] = 0x08;
        buf[n++] = 0x01;
        buf[n++] = (13 << 3) | 2;
        buf[n++] = 7;
        buf[n++] = (1 << 3) | 2; /* Lookup.keys */
        n += s_varint(buf + n, 0x7fffffffull);
        buf[n++] = 'x';
        s_hostile_send(sh, &rc, buf, n, true);
        n = 0;
        buf[n++] = 0x08;
        buf[n++] = 0x01;
        buf[n++] = (14 << 3) | 2; /* put */
        buf[n++] = 8;
        buf[n++] = (2 << 3) | 2; /* Put.values, packed */
        n += s_varint(buf + n, 4000000000ull);
        memset(buf + n, 0, 4);
        s_hostile_send(sh, &rc, buf, n + 4, true);
        /* A valid put truncated at a random point. */
        Carls__Request req = CARLS__REQUEST__INIT;
        Carls__Put put = CARLS__PUT__INIT;
        float vals[DIM] = {1, 2, 3, 4};
        req.table = "good";
        test_put_request(&req, &put, &key, 1, vals, DIM);
        size_t len;
        uint8_t *p = s_pack(&req, 1000000 + (uint64_t)round * 8, &len);
        s_hostile_send(sh, &rc, p, 1 + s_rng(&rng) % (len - 1), true);
        /* NaN, Inf, and a row of the wrong dimension: refused, the good row untouched. */
        vals[1] = NAN;
        free(p);
        p = s_pack(&req, 1000000 + (uint64_t)round * 8 + 1, &len);
        s_hostile_send(sh, &rc, p, len, true);
        vals[1] = INFINITY;
        free(p);
        p = s_pack(&req, 1000000 + (uint64_t)round * 8 + 2, &len);
        s_hostile_send(sh, &rc, p, len, true);
        vals[1] = 2;
        put.n_values = DIM - 1;
        free(p);
        p = s_pack(&req, 1000000 + (uint64_t)round * 8 + 3, &len);
        s_hostile_send(sh, &rc, p, len, true);
        free(p);
        /* Wrong protocol version. */
        Carls__ListTables lt = CARLS__LIST_TABLES__INIT;
        Carls__Request v = CARLS__REQUEST__INIT;
        v.op_case = CARLS__REQUEST__OP_LIST_TABLES;
        v.list_tables = &lt;
        p = s_pack(&v, 1000000 + (uint64_t)round * 8 + 4, &len);
        p[1] = 0x63; /* protocol_version 99 */
        s_hostile_send(sh, &rc, p, len, true);
        free(p);
        /* A multi-part message: dropped and counted, no answer. */
        const void *parts[2] = {buf, buf};
        size_t lens[2] = {8, 8};
        if (raw_send_parts(&rc, parts, lens, 2) == 0)
            sh->hostile_sent++;
        /* Every fourth round: a frame over the message limit (answered TOO_LARGE) and one over twice the
         * limit on its own connection (ZeroMQ drops that connection). */
        if (round % 4 == 0) {
            memset(buf, 0, MAX_MESSAGE + 1024);
            s_hostile_send(sh, &rc, buf, MAX_MESSAGE + 1024, true);
            raw_client_t huge;
            if (raw_open(&huge, sh->endpoint) == 0) {
                if (raw_send(&huge, buf, 2 * MAX_MESSAGE + 4096) == 0)
                    sh->hostile_sent++;
                Carls__Response *r = raw_recv(&huge, 200);
                if (r)
                    carls__response__free_unpacked(r, NULL);
                raw_close(&huge);
            }
        }
    }
    free(buf);
    raw_close(&rc);
    atomic_fetch_sub(&sh->hostile_running, 1);
    return NULL;
}

/* ---- the well-behaved client ---- */

static void *s_good_main(void *arg)
{
    s_shared_t *sh = arg;
    kb_client_options_t opts = {.timeout_ms = REPLY_DEADLINE_MS, .retries = 0};
    kb_cluster_t *c = kb_cluster_new(sh->endpoint, &opts);
    kb_key_t keys[GOOD_BATCH];
    char text[GOOD_BATCH][16];
    float out[GOOD_BATCH * DIM], want[DIM];
    uint64_t rng = 99;
    while (c && !atomic_load(&sh->stop)) {
        size_t first = s_rng(&rng) % (GOOD_KEYS - GOOD_BATCH);
        for (size_t i = 0; i < GOOD_BATCH; i++) {
            int len = snprintf(text[i], sizeof text[i], "good%zu", first + i);
            keys[i] = (kb_key_t){.data = text[i], .len = (size_t)len};
        }
        int64_t t0 = carls_monotonic_us();
        int rc = kb_cluster_lookup(c, "good", keys, GOOD_BATCH, DIM, out, NULL);
        int64_t us = carls_monotonic_us() - t0;
        sh->good_lookups++;
        if (us > sh->good_max_us)
            sh->good_max_us = us;
        if (rc != 0) {
            sh->good_failures++;
            snprintf(sh->good_error, sizeof sh->good_error, "%s", kb_cluster_last_error(c));
            continue;
        }
        for (size_t i = 0; i < GOOD_BATCH; i++) {
            s_good_value(first + i, want);
            if (memcmp(want, out + i * DIM, sizeof want) != 0)
                sh->good_wrong++;
        }
    }
    if (!c)
        sh->good_failures++;
    kb_cluster_destroy(&c);
    return NULL;
}

/* ---- resident size ---- */

static void *s_rss_main(void *arg)
{
    s_shared_t *sh = arg;
    while (!atomic_load(&sh->stop)) {
        uint64_t kb = kb_memory_proc_status_kb(sh->server, "VmRSS");
        if (kb > sh->rss_max_kb)
            sh->rss_max_kb = kb;
        sh->rss_samples++;
        usleep(100 * 1000);
    }
    return NULL;
}

static void test_hostile_load(void **state)
{
    server_fixture_t *f = *state;
    kb_client_options_t opts = {.timeout_ms = 30000, .retries = 0};
    kb_cluster_t *admin = kb_cluster_new(f->srv.endpoint, &opts);
    assert_non_null(admin);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = DIM;
    assert_int_equal(kb_cluster_create_table(admin, "good", &cfg, false), 0);
    assert_int_equal(kb_cluster_create_table(admin, "flood", &cfg, false), 0);
    kb_key_t keys[GOOD_KEYS];
    char text[GOOD_KEYS][16];
    float *vals = calloc(GOOD_KEYS * DIM, sizeof *vals);
    for (size_t i = 0; i < GOOD_KEYS; i++) {
        int len = snprintf(text[i], sizeof text[i], "good%zu", i);
        keys[i] = (kb_key_t){.data = text[i], .len = (size_t)len};
        s_good_value(i, vals + i * DIM);
    }
    assert_int_equal(kb_cluster_put(admin, "good", keys, GOOD_KEYS, DIM, vals, 1), 0);
    free(vals);
    /* The idle server's resident size: libraries, threads, SQLite. */
    uint64_t base_kb = kb_memory_proc_status_kb(f->srv.pid, "VmRSS");
    assert_true(base_kb > 0);

    s_shared_t sh;
    memset(&sh, 0, sizeof sh);
    sh.endpoint = f->srv.endpoint;
    sh.server = f->srv.pid;
    const char *env = getenv("CARLS_HOSTILE_KEYS");
    sh.flood_keys = env && atoll(env) > 0 ? (uint64_t)atoll(env) : 2000000;
    atomic_init(&sh.hostile_running, 3);
    int64_t t0 = carls_monotonic_ms();
    pthread_t good, rss, flood, conns, garbage;
    assert_int_equal(pthread_create(&good, NULL, s_good_main, &sh), 0);
    assert_int_equal(pthread_create(&rss, NULL, s_rss_main, &sh), 0);
    assert_int_equal(pthread_create(&flood, NULL, s_flood_main, &sh), 0);
    assert_int_equal(pthread_create(&conns, NULL, s_connections_main, &sh), 0);
    assert_int_equal(pthread_create(&garbage, NULL, s_garbage_main, &sh), 0);
    pthread_join(flood, NULL);
    pthread_join(conns, NULL);
    pthread_join(garbage, NULL);
    /* Let the well-behaved client read a little longer against the full server. */
    usleep(500 * 1000);
    atomic_store(&sh.stop, true);
    pthread_join(good, NULL);
    pthread_join(rss, NULL);
    int64_t elapsed = carls_monotonic_ms() - t0;

    Carls__Response *r = NULL;
    assert_int_equal(kb_cluster_stats(admin, 0, NULL, &r), 0);
    Carls__StatsResult *st = r->stats;
    uint64_t flood_refusals = 0, flood_rows = 0;
    for (size_t i = 0; i < st->n_tables; i++)
        if (strcmp(st->tables[i]->name, "flood") == 0) {
            flood_refusals = st->tables[i]->memory_refusals;
            flood_rows = st->tables[i]->rows;
        }
    uint64_t hwm_kb = kb_memory_proc_status_kb(f->srv.pid, "VmHWM");
    uint64_t end_kb = kb_memory_proc_status_kb(f->srv.pid, "VmRSS");
    uint64_t allowed_kb = ((uint64_t)S_LIMIT_FACTOR * LIMIT_MIB + S_OVERHEAD_MIB) * 1024 + base_kb;
    print_message("hostile load: %.1f s; flood: %llu keys sent in %llu ok + %llu refused requests (%llu rows "
                  "held); %llu connections opened, %llu answered; %llu hostile frames sent, %llu of %llu "
                  "answered; well-behaved: %llu lookups, %llu failed, %llu wrong, slowest %.1f ms\n",
                  (double)elapsed / 1000.0, (unsigned long long)sh.keys_sent,
                  (unsigned long long)sh.requests_ok, (unsigned long long)sh.requests_refused,
                  (unsigned long long)flood_rows, (unsigned long long)sh.connections_opened,
                  (unsigned long long)sh.connection_replies, (unsigned long long)sh.hostile_sent,
                  (unsigned long long)sh.hostile_answered, (unsigned long long)sh.hostile_expected,
                  (unsigned long long)sh.good_lookups, (unsigned long long)sh.good_failures,
                  (unsigned long long)sh.good_wrong, (double)sh.good_max_us / 1000.0);
    print_message("memory: --max-memory %d MiB, estimate %.1f MiB; server resident before the load %.1f MiB, "
                  "peak %.1f MiB (sampled %.1f MiB over %llu samples), at the end %.1f MiB, allowed %.1f MiB; "
                  "stats: %llu memory refusals (%llu on flood, %llu rows), %llu errors, %llu malformed frames\n",
                  LIMIT_MIB, (double)st->memory_bytes / 1048576.0, (double)base_kb / 1024.0,
                  (double)hwm_kb / 1024.0, (double)sh.rss_max_kb / 1024.0, (unsigned long long)sh.rss_samples,
                  (double)end_kb / 1024.0, (double)allowed_kb / 1024.0,
                  (unsigned long long)st->memory_refusals, (unsigned long long)flood_refusals,
                  (unsigned long long)st->memory_refused_rows, (unsigned long long)st->errors,
                  (unsigned long long)st->malformed_frames);

    /* The well-behaved client was never failed, and always got the right values in time. */
    if (sh.good_failures)
        fail_msg("the well-behaved client failed %llu times: %s", (unsigned long long)sh.good_failures,
                 sh.good_error);
    assert_true(sh.good_lookups > 0);
    assert_true(sh.good_wrong == 0);
    assert_true(sh.good_max_us < (int64_t)REPLY_DEADLINE_MS * 1000);
    /* The flood hit the limit and was refused, and nothing else went wrong with it. */
    if (sh.requests_other)
        fail_msg("flood requests failed otherwise: %s", sh.flood_error);
    assert_true(sh.keys_sent == sh.flood_keys);
    assert_true(sh.requests_ok > 0 && sh.requests_refused > 0);
    assert_true(st->memory_refusals >= sh.requests_refused && flood_refusals == sh.requests_refused);
    assert_true(st->memory_refused_rows >= sh.requests_refused);
    assert_true(st->memory_bytes <= ((uint64_t)LIMIT_MIB << 20) + (1u << 20));
    /* Every connection and every hostile single frame under the size limit got its answer. */
    assert_true(sh.connections_opened == (uint64_t)HOSTILE_CONNECTIONS * CONNECTION_ROUNDS);
    assert_true(sh.connection_replies == sh.connections_opened);
    assert_true(sh.hostile_answered == sh.hostile_expected);
    assert_true(sh.hostile_status_ok == 0);
    assert_true(st->malformed_frames > 0);
    /* Memory stayed within the limit plus the documented overhead. */
    if (hwm_kb > allowed_kb || sh.rss_max_kb > allowed_kb)
        fail_msg("resident size peaked at %llu kB; allowed %llu kB", (unsigned long long)hwm_kb,
                 (unsigned long long)allowed_kb);
    carls__response__free_unpacked(r, NULL);
    /* The good rows are intact. */
    float out[DIM], want[DIM];
    kb_key_t k = {.data = "good1", .len = 5};
    assert_int_equal(kb_cluster_lookup(admin, "good", &k, 1, DIM, out, NULL), 0);
    s_good_value(1, want);
    assert_memory_equal(out, want, sizeof want);
    kb_cluster_destroy(&admin);
    /* The teardown stops the server with SIGTERM and fails unless it exits 0. */
}

CARLS_TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_hostile_load, s_setup, server_fixture_teardown))
