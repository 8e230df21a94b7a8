/* Tests of the client library (client/kb_client.c, and kb_cluster's requests over one client) against the
 * fake server in fake_kb_server.c: the request envelope (protocol version, request ids, client id and
 * sequence numbers for writes only), resends after a timeout, timeouts, answers out of order, stale
 * duplicates, undecodable answers, lookups whose sizes do not match, error statuses, and requests refused
 * before anything is sent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_kb_server.h"
#include "kb_client.h"
#include "kb_cluster.h"
#include "protocol.h"
#include "util.h"

/* Answers from a live fake come back in milliseconds; this timeout only matters when something is broken. */
#define LONG_TIMEOUT_MS 5000

static kb_client_t *s_client(fake_kb_server_t *srv, int timeout_ms, int retries)
{
    kb_client_options_t opts = {.timeout_ms = timeout_ms, .retries = retries};
    kb_client_t *c = kb_client_new(fake_kb_server_endpoint(srv), &opts);
    assert_non_null(c);
    return c;
}

/* A fake server answering in mode, with table "emb" of dim (none when dim is 0), a client of it, and the
 * requests (kb_cluster) over the client. */
typedef struct {
    fake_kb_server_t *srv;
    kb_client_t *c;
    kb_cluster_t *cl;
} s_fake_t;

static s_fake_t s_fake(uint32_t dim, fake_mode_t mode, int timeout_ms, int retries)
{
    s_fake_t f = {fake_kb_server_new(), NULL, NULL};
    if (dim > 0)
        fake_kb_server_add_table(f.srv, "emb", dim, 0);
    fake_kb_server_set_mode(f.srv, mode);
    f.c = s_client(f.srv, timeout_ms, retries);
    f.cl = kb_cluster_over(f.c);
    return f;
}

static void s_fake_destroy(s_fake_t *f)
{
    kb_cluster_destroy(&f->cl);
    kb_client_destroy(&f->c);
    fake_kb_server_destroy(&f->srv);
}

static kb_key_t s_key(const char *s)
{
    kb_key_t k = {s, strlen(s)};
    return k;
}

/* Request i that the fake received has request id `id` and write sequence number `seq`. */
static void s_assert_ids(fake_kb_server_t *srv, size_t i, uint64_t id, uint64_t seq)
{
    Carls__Request *r = fake_kb_server_request(srv, i);
    assert_non_null(r);
    assert_int_equal(r->request_id, id);
    assert_int_equal(r->sequence, seq);
    carls__request__free_unpacked(r, NULL);
}

/* Request i that the fake received is operation op with client id cid and sequence number seq (0 and 0 for a
 * read). */
static void s_assert_sent(fake_kb_server_t *srv, size_t i, Carls__Request__OpCase op, uint64_t cid, uint64_t seq)
{
    Carls__Request *r = fake_kb_server_request(srv, i);
    assert_non_null(r);
    assert_int_equal(r->op_case, op);
    assert_int_equal(r->client_id, cid);
    assert_int_equal(r->sequence, seq);
    carls__request__free_unpacked(r, NULL);
}

/* Sends a one-key lookup with kb_client_send and returns its request id. */
static uint64_t s_send_lookup(kb_client_t *c, const char *table, const char *key)
{
    ProtobufCBinaryData k = {strlen(key), (uint8_t *)key};
    Carls__Lookup op = CARLS__LOOKUP__INIT;
    op.n_keys = 1;
    op.keys = &k;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_LOOKUP;
    req.lookup = &op;
    uint64_t id = 0;
    assert_int_equal(kb_client_send(c, &req, &id), KB_CLIENT_OK);
    assert_int_equal(req.request_id, id);
    return id;
}

/* Every request carries the protocol version and a fresh increasing request id; writes (and only writes)
 * carry the client id and sequence numbers 1, 2, 3, ... */
static void test_envelope(void **state)
{
    (void)state;
    fake_kb_server_t *srv = fake_kb_server_new();
    fake_kb_server_add_table(srv, "emb", 2, 10);
    kb_client_t *c = s_client(srv, LONG_TIMEOUT_MS, 0);
    kb_cluster_t *cl = kb_cluster_over(c);
    uint64_t cid = kb_client_id(c);
    assert_true(cid != 0);

    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_list_tables(cl, &resp), KB_CLIENT_OK);
    assert_int_equal(resp->result_case, CARLS__RESPONSE__RESULT_TABLE_LIST);
    assert_int_equal(resp->table_list->n_tables, 1);
    carls__response__free_unpacked(resp, NULL);

    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 3;
    assert_int_equal(kb_cluster_create_table(cl, "t2", &cfg, true), KB_CLIENT_OK);

    kb_key_t keys[2] = {s_key("alpha"), s_key("beta")};
    float vals[4] = {1.5f, -2.0f, 3.25f, 4.0f};
    assert_int_equal(kb_cluster_put(cl, "emb", keys, 2, 2, vals, 99), KB_CLIENT_OK);

    float got[4];
    kb_row_meta_t meta[2];
    assert_int_equal(kb_cluster_lookup(cl, "emb", keys, 2, 2, got, meta), KB_CLIENT_OK);
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == fake_kb_value(keys[i / 2].data, keys[i / 2].len, (uint32_t)(i % 2)));
    assert_int_equal(meta[0].version, 7);
    assert_int_equal(meta[1].updated_at_ms, 1001);
    assert_int_equal(meta[1].frequency, 2);

    assert_int_equal(kb_cluster_push_gradients(cl, "emb", keys, 2, 2, vals), KB_CLIENT_OK);
    assert_int_equal(kb_cluster_stats(cl, 0, NULL, &resp), KB_CLIENT_OK);
    assert_int_equal(resp->result_case, CARLS__RESPONSE__RESULT_STATS);
    carls__response__free_unpacked(resp, NULL);
    assert_int_equal(kb_cluster_checkpoint(cl, NULL), KB_CLIENT_OK);
    assert_int_equal(kb_cluster_drop_table(cl, "t2", true), KB_CLIENT_OK);
    assert_string_equal(kb_cluster_last_error(cl), "");

    static const Carls__Request__OpCase ops[] = {
        CARLS__REQUEST__OP_LIST_TABLES, CARLS__REQUEST__OP_CREATE_TABLE, CARLS__REQUEST__OP_PUT,
        CARLS__REQUEST__OP_LOOKUP,      CARLS__REQUEST__OP_PUSH_GRADIENTS, CARLS__REQUEST__OP_STATS,
        CARLS__REQUEST__OP_CHECKPOINT,  CARLS__REQUEST__OP_DROP_TABLE,
    };
    static const bool writes[] = {false, true, true, false, true, false, false, true};
    size_t n = sizeof ops / sizeof ops[0];
    assert_int_equal(fake_kb_server_count(srv), n);
    uint64_t want_seq = 1;
    for (size_t i = 0; i < n; i++) {
        Carls__Request *r = fake_kb_server_request(srv, i);
        assert_non_null(r);
        assert_int_equal(r->op_case, ops[i]);
        assert_int_equal(r->protocol_version, CARLS_PROTOCOL_VERSION);
        assert_int_equal(r->request_id, i + 1);
        if (writes[i]) {
            assert_int_equal(r->client_id, cid);
            assert_int_equal(r->sequence, want_seq);
            want_seq++;
        } else {
            assert_int_equal(r->client_id, 0);
            assert_int_equal(r->sequence, 0);
        }
        if (ops[i] == CARLS__REQUEST__OP_PUT) {
            assert_string_equal(r->table, "emb");
            assert_int_equal(r->put->n_keys, 2);
            assert_int_equal(r->put->keys[1].len, 4);
            assert_memory_equal(r->put->keys[1].data, "beta", 4);
            assert_int_equal(r->put->n_values, 4);
            assert_memory_equal(r->put->values, vals, sizeof vals);
            assert_int_equal(r->put->version, 99);
        }
        if (ops[i] == CARLS__REQUEST__OP_CREATE_TABLE) {
            assert_string_equal(r->table, "t2");
            assert_int_equal(r->create_table->config->dim, 3);
            assert_true(r->create_table->if_not_exists);
        }
        carls__request__free_unpacked(r, NULL);
    }

    /* Of the retrieval operations, feature_put is a write and knn a read. (The fake does not know them and
     * answers UNIMPLEMENTED; only what was sent matters here.) */
    Carls__FeaturePut fput = CARLS__FEATURE_PUT__INIT;
    Carls__Knn knn = CARLS__KNN__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = "emb";
    req.op_case = CARLS__REQUEST__OP_FEATURE_PUT;
    req.feature_put = &fput;
    assert_int_equal(kb_client_call(c, &req, &resp), KB_CLIENT_ESTATUS);
    carls__response__free_unpacked(resp, NULL);
    req.op_case = CARLS__REQUEST__OP_KNN; /* the same request made a knn: kb_client_send fills in its envelope */
    req.knn = &knn;
    assert_int_equal(kb_client_call(c, &req, &resp), KB_CLIENT_ESTATUS);
    carls__response__free_unpacked(resp, NULL);
    s_assert_sent(srv, n, CARLS__REQUEST__OP_FEATURE_PUT, cid, want_seq);
    s_assert_sent(srv, n + 1, CARLS__REQUEST__OP_KNN, 0, 0);

    kb_cluster_destroy(&cl);
    kb_client_destroy(&c);
    assert_null(c);
    fake_kb_server_destroy(&srv);
}

/* A client id given in the options is used as is; random ones are nonzero and differ. */
static void test_client_ids(void **state)
{
    (void)state;
    fake_kb_server_t *srv = fake_kb_server_new();
    fake_kb_server_add_table(srv, "emb", 1, 0);
    kb_client_options_t opts = {.timeout_ms = LONG_TIMEOUT_MS, .client_id = 0xabcdef12345ULL};
    kb_client_t *c = kb_client_new(fake_kb_server_endpoint(srv), &opts);
    assert_non_null(c);
    assert_int_equal(kb_client_id(c), 0xabcdef12345ULL);
    kb_cluster_t *cl = kb_cluster_over(c);
    kb_key_t k = s_key("x");
    float v = 1.0f;
    assert_int_equal(kb_cluster_put(cl, "emb", &k, 1, 1, &v, 0), KB_CLIENT_OK);
    Carls__Request *r = fake_kb_server_request(srv, 0);
    assert_non_null(r);
    assert_int_equal(r->client_id, 0xabcdef12345ULL);
    assert_int_equal(r->sequence, 1);
    carls__request__free_unpacked(r, NULL);

    kb_client_t *a = kb_client_new(fake_kb_server_endpoint(srv), NULL);
    kb_client_t *b = kb_client_new(fake_kb_server_endpoint(srv), NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(kb_client_id(a) != 0 && kb_client_id(b) != 0);
    assert_true(kb_client_id(a) != kb_client_id(b));
    kb_client_destroy(&a);
    kb_client_destroy(&b);
    kb_cluster_destroy(&cl);
    kb_client_destroy(&c);
    fake_kb_server_destroy(&srv);
}

/* The fake ignores the first attempt; the client times out, reconnects, resends the identical bytes (same
 * request id, client id and sequence) and the call succeeds. */
static void test_resend_after_ignored_attempt(void **state)
{
    (void)state;
    s_fake_t f = s_fake(2, FAKE_IGNORE_FIRST, 300, 3);
    kb_key_t k = s_key("row");
    float v[2] = {0.5f, 0.25f};
    assert_int_equal(kb_cluster_put(f.cl, "emb", &k, 1, 2, v, 3), KB_CLIENT_OK);

    size_t n = fake_kb_server_count(f.srv);
    assert_true(n >= 2);
    static uint8_t first[256], other[256];
    size_t len0 = fake_kb_server_request_bytes(f.srv, 0, first, sizeof first);
    assert_true(len0 > 0 && len0 <= sizeof first);
    for (size_t i = 1; i < n; i++) {
        size_t len = fake_kb_server_request_bytes(f.srv, i, other, sizeof other);
        assert_int_equal(len, len0);
        assert_memory_equal(first, other, len0);
    }
    Carls__Request *r = fake_kb_server_request(f.srv, 1);
    assert_int_equal(r->request_id, 1);
    assert_int_equal(r->client_id, kb_client_id(f.c));
    assert_int_equal(r->sequence, 1);
    carls__request__free_unpacked(r, NULL);

    /* The next write gets the next sequence number, not a reused one. */
    assert_int_equal(kb_cluster_put(f.cl, "emb", &k, 1, 2, v, 4), KB_CLIENT_OK);
    s_assert_ids(f.srv, fake_kb_server_count(f.srv) - 1, 2, 2);
    s_fake_destroy(&f);
}

/* A server that never answers: KB_CLIENT_ETIMEOUT after 1 + retries attempts, all the same request. */
static void test_timeout(void **state)
{
    (void)state;
    s_fake_t f = s_fake(0, FAKE_SILENT, 300, 2);
    Carls__Response *resp = (Carls__Response *)(uintptr_t)1; /* must be reset to NULL */
    Carls__ListTables op = CARLS__LIST_TABLES__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.op_case = CARLS__REQUEST__OP_LIST_TABLES;
    req.list_tables = &op;
    assert_int_equal(kb_client_call(f.c, &req, &resp), KB_CLIENT_ETIMEOUT);
    assert_null(resp);
    assert_non_null(strstr(kb_client_last_error(f.c), "no answer"));
    assert_int_equal(fake_kb_server_wait_count(f.srv, 3, 3000), 3);
    for (size_t i = 0; i < 3; i++) {
        Carls__Request *r = fake_kb_server_request(f.srv, i);
        assert_int_equal(r->request_id, 1);
        carls__request__free_unpacked(r, NULL);
    }
    /* The request is over: waiting for it again is an argument error, not another timeout. */
    assert_int_equal(kb_client_wait(f.c, 1, &resp), KB_CLIENT_EINVAL);
    s_fake_destroy(&f);
}

/* Two requests in flight, answered in reverse order: each wait gets its own answer, and the answer that
 * arrived early is kept (the fake is silenced before the second wait, so only the kept copy can satisfy
 * it). */
static void test_out_of_order(void **state)
{
    (void)state;
    s_fake_t f = s_fake(3, FAKE_REVERSE_PAIRS, 2000, 0);
    uint64_t a = s_send_lookup(f.c, "emb", "first");
    uint64_t b = s_send_lookup(f.c, "emb", "second");
    assert_true(a != b);

    Carls__Response *ra = NULL, *rb = NULL;
    assert_int_equal(kb_client_wait(f.c, a, &ra), KB_CLIENT_OK);
    fake_kb_server_set_mode(f.srv, FAKE_SILENT);
    assert_int_equal(kb_client_wait(f.c, b, &rb), KB_CLIENT_OK);
    assert_int_equal(ra->request_id, a);
    assert_int_equal(rb->request_id, b);
    assert_true(ra->lookup->values[0] == fake_kb_value("first", 5, 0));
    assert_true(rb->lookup->values[2] == fake_kb_value("second", 6, 2));
    carls__response__free_unpacked(ra, NULL);
    carls__response__free_unpacked(rb, NULL);
    assert_int_equal(fake_kb_server_count(f.srv), 2); /* nothing was resent */
    s_fake_destroy(&f);
}

/* After a timeout the client reconnects and resends every request in flight, not only the one it waits
 * for: the other one's answer then arrives long before its own timeout would have fired. */
static void test_reconnect_resends_all_in_flight(void **state)
{
    (void)state;
    const int timeout_ms = 1500;
    s_fake_t f = s_fake(1, FAKE_IGNORE_FIRST, timeout_ms, 1);
    uint64_t a = s_send_lookup(f.c, "emb", "a");
    uint64_t b = s_send_lookup(f.c, "emb", "b");
    Carls__Response *ra = NULL, *rb = NULL;
    assert_int_equal(kb_client_wait(f.c, a, &ra), KB_CLIENT_OK);
    int64_t t0 = carls_monotonic_ms();
    assert_int_equal(kb_client_wait(f.c, b, &rb), KB_CLIENT_OK);
    int64_t waited = carls_monotonic_ms() - t0;
    /* Without the resend, b's wait would first time out (timeout_ms) and only then resend. */
    assert_true(waited < timeout_ms / 2);
    assert_int_equal(rb->request_id, b);
    carls__response__free_unpacked(ra, NULL);
    carls__response__free_unpacked(rb, NULL);
    s_fake_destroy(&f);
}

/* Every answer arrives twice: the second copy is for an id no longer in flight and must not be taken as
 * the answer to the next request. */
static void test_stale_duplicates_ignored(void **state)
{
    (void)state;
    s_fake_t f = s_fake(1, FAKE_DUPLICATE, LONG_TIMEOUT_MS, 0);
    for (uint64_t i = 1; i <= 4; i++) {
        Carls__Response *resp = NULL;
        assert_int_equal(kb_cluster_list_tables(f.cl, &resp), KB_CLIENT_OK);
        assert_int_equal(resp->request_id, i);
        carls__response__free_unpacked(resp, NULL);
    }
    kb_key_t k = s_key("key");
    float v = 0;
    assert_int_equal(kb_cluster_lookup(f.cl, "emb", &k, 1, 1, &v, NULL), KB_CLIENT_OK);
    assert_true(v == fake_kb_value("key", 3, 0));
    s_fake_destroy(&f);
}

/* A frame that does not decode fails the call with KB_CLIENT_EMALFORMED; the client stays usable. */
static void test_garbage_answer(void **state)
{
    (void)state;
    s_fake_t f = s_fake(0, FAKE_GARBAGE, LONG_TIMEOUT_MS, 0);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_list_tables(f.cl, &resp), KB_CLIENT_EMALFORMED);
    assert_null(resp);
    assert_non_null(strstr(kb_cluster_last_error(f.cl), "does not decode"));
    assert_int_equal(kb_cluster_last_status(f.cl), CARLS__STATUS_CODE__STATUS_OK); /* no status: no answer */
    fake_kb_server_set_mode(f.srv, FAKE_ANSWER);
    assert_int_equal(kb_cluster_list_tables(f.cl, &resp), KB_CLIENT_OK);
    assert_int_equal(resp->request_id, 2);
    carls__response__free_unpacked(resp, NULL);
    s_fake_destroy(&f);
}

/* An OK answer in another protocol version is refused. */
static void test_wrong_version(void **state)
{
    (void)state;
    s_fake_t f = s_fake(0, FAKE_WRONG_VERSION, LONG_TIMEOUT_MS, 0);
    assert_int_equal(kb_cluster_checkpoint(f.cl, NULL), KB_CLIENT_EIO);
    assert_non_null(strstr(kb_cluster_last_error(f.cl), "protocol version 99"));
    s_fake_destroy(&f);
}

/* Lookup answers with the wrong dim, too many or too few values, or too few metadata rows: an error, and
 * nothing written to the caller's buffers (the guard floats after them stay put; ASan would also catch an
 * overrun). */
static void test_lookup_bad_sizes(void **state)
{
    (void)state;
    enum { N = 3, DIM = 4, GUARD = 8 };
    s_fake_t f = s_fake(DIM, FAKE_ANSWER, LONG_TIMEOUT_MS, 0);
    kb_key_t keys[N] = {s_key("k0"), s_key("k1"), s_key("k2")};
    static const struct {
        fake_mode_t mode;
        int want;
        bool meta;
    } cases[] = {
        {FAKE_LOOKUP_BAD_DIM, KB_CLIENT_EINVAL, false},
        {FAKE_LOOKUP_EXTRA, KB_CLIENT_EMALFORMED, false},
        {FAKE_LOOKUP_SHORT, KB_CLIENT_EMALFORMED, false},
        {FAKE_LOOKUP_BAD_META, KB_CLIENT_EMALFORMED, true},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        fake_kb_server_set_mode(f.srv, cases[t].mode);
        float *buf = malloc((N * DIM + GUARD) * sizeof *buf);
        for (size_t i = 0; i < N * DIM + GUARD; i++)
            buf[i] = -12345.0f;
        kb_row_meta_t meta[N + 1];
        memset(meta, 0xab, sizeof meta);
        int rc = kb_cluster_lookup(f.cl, "emb", keys, N, DIM, buf, cases[t].meta ? meta : NULL);
        assert_int_equal(rc, cases[t].want);
        assert_true(strlen(kb_cluster_last_error(f.cl)) > 0);
        for (size_t i = 0; i < N * DIM + GUARD; i++)
            assert_true(buf[i] == -12345.0f);
        for (size_t i = 0; i < sizeof meta; i++)
            assert_int_equal(((unsigned char *)meta)[i], 0xab);
        free(buf);
    }
    /* The sizes were the only problem: a correct answer goes through. */
    fake_kb_server_set_mode(f.srv, FAKE_ANSWER);
    float ok[N * DIM];
    kb_row_meta_t meta[N];
    assert_int_equal(kb_cluster_lookup(f.cl, "emb", keys, N, DIM, ok, meta), KB_CLIENT_OK);
    assert_true(ok[N * DIM - 1] == fake_kb_value("k2", 2, DIM - 1));
    assert_int_equal(meta[2].frequency, 3);
    s_fake_destroy(&f);
}

/* A non-OK status: KB_CLIENT_ESTATUS, the status as the enum (kb_cluster_last_status), "STATUS_NAME: server
 * text" in last_error, and from the low-level call the response itself. The next success clears it. */
static void test_status_error(void **state)
{
    (void)state;
    s_fake_t f = s_fake(0, FAKE_ANSWER, LONG_TIMEOUT_MS, 0);
    fake_kb_server_set_status(f.srv, CARLS__STATUS_CODE__STATUS_NOT_FOUND, "no table named 'ghost'");
    kb_key_t k = s_key("k");
    float v = 1;
    assert_int_equal(kb_cluster_put(f.cl, "ghost", &k, 1, 1, &v, 0), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f.cl), CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    assert_string_equal(kb_cluster_last_error(f.cl), "NOT_FOUND: no table named 'ghost'");

    Carls__Stats op = CARLS__STATS__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.table = "ghost";
    req.op_case = CARLS__REQUEST__OP_STATS;
    req.stats = &op;
    Carls__Response *resp = NULL;
    assert_int_equal(kb_client_call(f.c, &req, &resp), KB_CLIENT_ESTATUS);
    assert_non_null(resp);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    assert_string_equal(resp->error, "no table named 'ghost'");
    carls__response__free_unpacked(resp, NULL);

    fake_kb_server_set_status(f.srv, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "batch above 10 keys");
    Carls__Response *stats = NULL;
    assert_int_equal(kb_cluster_stats(f.cl, 0, NULL, &stats), KB_CLIENT_ESTATUS);
    assert_null(stats); /* the blocking calls hand back only OK answers */
    assert_int_equal(kb_cluster_last_status(f.cl), CARLS__STATUS_CODE__STATUS_TOO_LARGE);
    assert_string_equal(kb_cluster_last_error(f.cl), "TOO_LARGE: batch above 10 keys");
    fake_kb_server_set_status(f.srv, CARLS__STATUS_CODE__STATUS_UNAVAILABLE, "shutting down");
    assert_int_equal(kb_cluster_checkpoint(f.cl, NULL), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f.cl), CARLS__STATUS_CODE__STATUS_UNAVAILABLE);
    fake_kb_server_set_mode(f.srv, FAKE_ANSWER);
    assert_int_equal(kb_cluster_checkpoint(f.cl, NULL), KB_CLIENT_OK);
    assert_int_equal(kb_cluster_last_status(f.cl), CARLS__STATUS_CODE__STATUS_OK);
    s_fake_destroy(&f);
}

/* Arguments that cannot make a valid request are refused before anything is sent, and spend no request
 * id or sequence number. */
static void test_refused_before_sending(void **state)
{
    (void)state;
    s_fake_t f = s_fake(2, FAKE_ANSWER, LONG_TIMEOUT_MS, 0);
    kb_key_t keys[2] = {s_key("a"), s_key("b")};
    float v[4] = {0};

    assert_int_equal(kb_cluster_put(f.cl, "emb", keys, 0, 2, v, 0), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_put(f.cl, "emb", keys, 2, 0, v, 0), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_put(f.cl, "emb", NULL, 2, 2, v, 0), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_put(f.cl, "emb", keys, 2, 2, NULL, 0), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_push_gradients(f.cl, "emb", keys, 0, 2, v), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_lookup(f.cl, "emb", keys, 2, 0, v, NULL), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_lookup(f.cl, "emb", keys, 2, 2, NULL, NULL), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_lookup(f.cl, NULL, keys, 2, 2, v, NULL), KB_CLIENT_EINVAL);
    kb_key_t empty[2] = {s_key("a"), {"", 0}};
    assert_int_equal(kb_cluster_put(f.cl, "emb", empty, 2, 2, v, 0), KB_CLIENT_EINVAL);
    assert_non_null(strstr(kb_cluster_last_error(f.cl), "key 1 is empty"));
    assert_int_equal(kb_cluster_create_table(f.cl, "t", NULL, false), KB_CLIENT_EINVAL);

    Carls__Request noop = CARLS__REQUEST__INIT;
    uint64_t id;
    assert_int_equal(kb_client_send(f.c, &noop, &id), KB_CLIENT_EINVAL);

    /* One row just above the 64 MiB frame limit. */
    uint32_t big_dim = CARLS_DEFAULT_MAX_MESSAGE_BYTES / sizeof(float) + 16;
    float *big = calloc(big_dim, sizeof *big);
    assert_non_null(big);
    assert_int_equal(kb_cluster_put(f.cl, "emb", keys, 1, big_dim, big, 0), KB_CLIENT_EINVAL);
    assert_non_null(strstr(kb_cluster_last_error(f.cl), "message limit"));
    free(big);

    assert_int_equal(fake_kb_server_wait_count(f.srv, 1, 300), 0);
    /* Nothing was spent: the first request that goes out is request 1, sequence 1. */
    assert_int_equal(kb_cluster_put(f.cl, "emb", keys, 2, 2, v, 0), KB_CLIENT_OK);
    s_assert_ids(f.srv, 0, 1, 1);
    s_fake_destroy(&f);
}

/* Unknown ids, cancelled requests, and NULL handling of the lifecycle. */
static void test_misc(void **state)
{
    (void)state;
    assert_null(kb_client_new(NULL, NULL));
    assert_null(kb_client_new("", NULL));
    kb_client_destroy(NULL);
    kb_client_t *none = NULL;
    kb_client_destroy(&none);
    /* An endpoint ZeroMQ cannot parse fails at creation. */
    assert_null(kb_client_new("nonsense://x", NULL));

    fake_kb_server_t *srv = fake_kb_server_new();
    kb_client_t *c = s_client(srv, LONG_TIMEOUT_MS, 0);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_client_wait(c, 12345, &resp), KB_CLIENT_EINVAL);
    assert_null(resp);
    /* A cancelled request is no longer in flight; its answer, when it comes, is dropped, and the next
     * request gets its own. */
    fake_kb_server_add_table(srv, "emb", 1, 0);
    uint64_t gone = s_send_lookup(c, "emb", "cancelled");
    assert_int_equal(kb_client_cancel(c, gone), KB_CLIENT_OK);
    assert_int_equal(kb_client_cancel(c, gone), KB_CLIENT_EINVAL);
    assert_int_equal(kb_client_wait(c, gone, &resp), KB_CLIENT_EINVAL);
    assert_int_equal(fake_kb_server_wait_count(srv, 1, 2000), 1);
    uint64_t next = s_send_lookup(c, "emb", "next");
    assert_int_equal(kb_client_wait(c, next, &resp), KB_CLIENT_OK);
    assert_int_equal(resp->request_id, next);
    carls__response__free_unpacked(resp, NULL);
    /* A request sent and never waited for is freed by destroy (ASan checks for the leak). */
    s_send_lookup(c, "emb", "orphan");
    kb_client_destroy(&c);
    fake_kb_server_destroy(&srv);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_envelope),
    cmocka_unit_test(test_client_ids),
    cmocka_unit_test(test_resend_after_ignored_attempt),
    cmocka_unit_test(test_timeout),
    cmocka_unit_test(test_out_of_order),
    cmocka_unit_test(test_reconnect_resends_all_in_flight),
    cmocka_unit_test(test_stale_duplicates_ignored),
    cmocka_unit_test(test_garbage_answer),
    cmocka_unit_test(test_wrong_version),
    cmocka_unit_test(test_lookup_bad_sizes),
    cmocka_unit_test(test_status_error),
    cmocka_unit_test(test_refused_before_sending),
    cmocka_unit_test(test_misc))
