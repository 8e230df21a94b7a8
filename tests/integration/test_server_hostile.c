/* Integration: every message is untrusted. Garbage, truncated and oversized frames, wrong versions,
 * unknown tables, wrong dimensions, NaN/Inf, empty and over-long keys, too many keys, bad configs and
 * thousands of random mutations of valid requests each get a clear error (or are dropped and counted when
 * no request can be read), and the server keeps answering a well-behaved client throughout. */
#include "kb_cluster.h"
#include "protocol.h"
#include "raw_client.h"
#include "server_fixture.h"
#include "test_proto.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

#define MAX_MESSAGE 65536
#define MAX_KEY 16
#define MAX_KEYS 100

static kb_client_options_t s_client_options = {.timeout_ms = 5000, .retries = 1};

/* Every test: a server with small limits, a client, a table "emb" of dim 4, and a raw client. */
static int s_setup(void **state)
{
    const char *args[] = {"--max-message-bytes", "65536", "--max-key-bytes", "16", "--max-keys-per-request", "100",
                          "--max-dim", "64", NULL};
    if (server_fixture_setup_server(state, args) != 0)
        return -1;
    server_fixture_t *f = *state;
    if (server_fixture_connect(f) != 0)
        return -1;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 4;
    if (kb_cluster_create_table(f->cluster, "emb", &cfg, false) != 0)
        return -1;
    return raw_open(&f->raw, f->srv.endpoint) == 0 ? 0 : -1;
}

/* The well-behaved client still gets right answers. */
static void s_assert_healthy(server_fixture_t *f)
{
    float v[4] = {1, 2, 3, 4}, out[4];
    kb_key_t k = {.data = "healthy", .len = 7};
    assert_int_equal(kb_cluster_put(f->cluster, "emb", &k, 1, 4, v, 7), 0);
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", &k, 1, 4, out, NULL), 0);
    assert_memory_equal(v, out, sizeof v);
}

/* Sends req raw and checks the reply's status and that the error text mentions `needle`. */
static void s_expect(server_fixture_t *f, Carls__Request *req, Carls__StatusCode status, const char *needle)
{
    Carls__Response *resp = raw_call(&f->raw, req, 5000);
    assert_non_null(resp);
    if (resp->status != status || (needle && !strstr(resp->error, needle)))
        fail_msg("expected %s containing '%s', got %s: '%s'", carls_status_name(status), needle ? needle : "",
                 carls_status_name(resp->status), resp->error);
    assert_int_equal(resp->request_id, req->request_id);
    carls__response__free_unpacked(resp, NULL);
}

static void s_request(Carls__Request *req, uint64_t id)
{
    carls__request__init(req);
    test_request_envelope(req, "emb", id, 77, id);
}

static void test_garbage_truncated_and_multipart(void **state)
{
    server_fixture_t *f = *state;
    /* Bytes that are no protobuf at all: wire type 7 does not exist. */
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x07, 0x42};
    assert_int_equal(raw_send(&f->raw, garbage, sizeof garbage), 0);
    Carls__Response *resp = raw_recv(&f->raw, 5000);
    assert_non_null(resp);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_MALFORMED);
    assert_int_equal(resp->request_id, 0);
    carls__response__free_unpacked(resp, NULL);

    /* A valid lookup cut in the middle of its key. */
    Carls__Request req;
    s_request(&req, 5);
    Carls__Lookup lk = CARLS__LOOKUP__INIT;
    ProtobufCBinaryData key = {.len = 12, .data = (uint8_t *)"abcdefghijkl"};
    lk.n_keys = 1;
    lk.keys = &key;
    req.op_case = CARLS__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    size_t len = carls__request__get_packed_size(&req);
    uint8_t *buf = malloc(len);
    carls__request__pack(&req, buf);
    assert_int_equal(raw_send(&f->raw, buf, len - 5), 0);
    resp = raw_recv(&f->raw, 5000);
    assert_non_null(resp);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_MALFORMED);
    carls__response__free_unpacked(resp, NULL);

    /* A multi-part message cannot be answered: dropped and counted. */
    const void *parts[2] = {buf, buf};
    size_t lens[2] = {len, len};
    assert_int_equal(raw_send_parts(&f->raw, parts, lens, 2), 0);
    assert_null(raw_recv(&f->raw, 300));
    free(buf);

    Carls__Response *stats;
    assert_int_equal(kb_cluster_stats(f->cluster, 0, NULL, &stats), 0);
    assert_true(stats->stats->malformed_frames >= 3);
    carls__response__free_unpacked(stats, NULL);
    s_assert_healthy(f);
}

static void test_envelope_errors(void **state)
{
    server_fixture_t *f = *state;
    Carls__Request req;
    Carls__ListTables lt = CARLS__LIST_TABLES__INIT;

    s_request(&req, 10);
    req.protocol_version = 99;
    req.op_case = CARLS__REQUEST__OP_LIST_TABLES;
    req.list_tables = &lt;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_UNSUPPORTED_VERSION, "version 99");

    s_request(&req, 11);
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED, "operation");

    Carls__Lookup lk = CARLS__LOOKUP__INIT;
    ProtobufCBinaryData key = {.len = 1, .data = (uint8_t *)"k"};
    lk.n_keys = 1;
    lk.keys = &key;
    s_request(&req, 12);
    req.op_case = CARLS__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    req.table = "nope";
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_NOT_FOUND, "nope");
    req.table = "bad name!";
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "table name");

    /* A write without client id / sequence cannot be de-duplicated: refused. */
    Carls__Put put = CARLS__PUT__INIT;
    float vals[4] = {0};
    s_request(&req, 13);
    req.client_id = 0;
    test_put_request(&req, &put, &key, 1, vals, 4);
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "client_id");
    s_assert_healthy(f);
}

static void test_payload_errors(void **state)
{
    server_fixture_t *f = *state;
    Carls__Request req;
    ProtobufCBinaryData key = {.len = 1, .data = (uint8_t *)"k"};
    float vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Carls__Put put = CARLS__PUT__INIT;
    put.n_keys = 1;
    put.keys = &key;
    put.values = vals;

    s_request(&req, 20);
    req.op_case = CARLS__REQUEST__OP_PUT;
    req.put = &put;
    put.n_values = 3; /* wrong dimension */
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "expected 4");
    put.n_values = 4;
    vals[2] = INFINITY;
    req.sequence = 21;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "NaN or Inf");
    vals[2] = 3;

    Carls__PushGradients push = CARLS__PUSH_GRADIENTS__INIT;
    float grads[4] = {0, NAN, 0, 0};
    push.n_keys = 1;
    push.keys = &key;
    push.n_gradients = 4;
    push.gradients = grads;
    s_request(&req, 22);
    req.op_case = CARLS__REQUEST__OP_PUSH_GRADIENTS;
    req.push_gradients = &push;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "NaN or Inf");

    /* Keys: empty, over-long, too many. */
    ProtobufCBinaryData empty = {.len = 0, .data = NULL};
    ProtobufCBinaryData longk = {.len = MAX_KEY + 1, .data = (uint8_t *)"0123456789abcdefXYZ"};
    Carls__Lookup lk = CARLS__LOOKUP__INIT;
    s_request(&req, 23);
    req.op_case = CARLS__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    lk.n_keys = 1;
    lk.keys = &empty;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "empty");
    lk.keys = &longk;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "limit");
    ProtobufCBinaryData many[MAX_KEYS + 1];
    for (int i = 0; i <= MAX_KEYS; i++)
        many[i] = key;
    lk.n_keys = MAX_KEYS + 1;
    lk.keys = many;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_TOO_LARGE, "keys");
    lk.n_keys = 0;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "no keys");

    /* Bad table configs. */
    Carls__CreateTable ct = CARLS__CREATE_TABLE__INIT;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__OptimizerConfig opt = CARLS__OPTIMIZER_CONFIG__INIT;
    Carls__LazyUpdateConfig lazy = CARLS__LAZY_UPDATE_CONFIG__INIT;
    ct.config = &cfg;
    s_request(&req, 30);
    req.table = "fresh";
    req.op_case = CARLS__REQUEST__OP_CREATE_TABLE;
    req.create_table = &ct;
    cfg.dim = 0;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "dim");
    cfg.dim = 65; /* above --max-dim 64 */
    req.sequence = 31;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "dim");
    cfg.dim = 4;
    cfg.lazy = &lazy;
    lazy.max_pending = CARLS_MAX_PENDING_LIMIT + 1;
    req.sequence = 32;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "max_pending");
    lazy.max_pending = 0;
    cfg.optimizer = &opt;
    opt.learning_rate = -1.0f;
    req.sequence = 33;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, NULL);
    ct.config = NULL;
    req.sequence = 34;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "config");
    /* None of the refused creates made a table. */
    req.table = "emb";
    ct.config = &cfg;
    opt.learning_rate = 0.1f;
    req.sequence = 35;
    s_expect(f, &req, CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS, "exists");
    s_assert_healthy(f);
}

static void test_oversized_frames(void **state)
{
    server_fixture_t *f = *state;
    /* Above the limit but under twice it: answered TOO_LARGE. */
    size_t len = MAX_MESSAGE + 100;
    uint8_t *big = calloc(1, len);
    assert_int_equal(raw_send(&f->raw, big, len), 0);
    Carls__Response *resp = raw_recv(&f->raw, 5000);
    assert_non_null(resp);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_TOO_LARGE);
    carls__response__free_unpacked(resp, NULL);
    free(big);

    /* Far above: ZeroMQ drops that connection before the server allocates anything; others go on. */
    raw_client_t huge;
    assert_int_equal(raw_open(&huge, f->srv.endpoint), 0);
    len = 4 * MAX_MESSAGE;
    big = calloc(1, len);
    assert_int_equal(raw_send(&huge, big, len), 0);
    assert_null(raw_recv(&huge, 500));
    raw_close(&huge);
    free(big);
    s_assert_healthy(f);
}

/* Thousands of random frames and random mutations of valid requests: the server answers or drops each,
 * never dies, and the well-behaved client keeps working. */
static void test_random_mutations(void **state)
{
    server_fixture_t *f = *state;
    Carls__Request req;
    s_request(&req, 40);
    ProtobufCBinaryData keys[3] = {{1, (uint8_t *)"a"}, {2, (uint8_t *)"bb"}, {3, (uint8_t *)"ccc"}};
    float grads[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    Carls__PushGradients push = CARLS__PUSH_GRADIENTS__INIT;
    push.n_keys = 3;
    push.keys = keys;
    push.n_gradients = 12;
    push.gradients = grads;
    req.op_case = CARLS__REQUEST__OP_PUSH_GRADIENTS;
    req.push_gradients = &push;
    size_t len = carls__request__get_packed_size(&req);
    uint8_t *valid = malloc(len);
    carls__request__pack(&req, valid);
    uint8_t *buf = malloc(len + 64);
    uint64_t rng = 12345;
    int answered = 0;
    for (int i = 0; i < 3000; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t n = len;
        memcpy(buf, valid, len);
        if (i % 3 == 0) { /* pure noise of random length */
            n = (rng >> 33) % (len + 64);
            for (size_t j = 0; j < n; j++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                buf[j] = (uint8_t)(rng >> 56);
            }
        } else { /* flip a few bytes, maybe truncate */
            for (int j = 0; j < 3; j++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                buf[(rng >> 33) % len] ^= (uint8_t)(rng >> 56);
            }
            if (i % 5 == 0)
                n = (rng >> 20) % len;
        }
        assert_int_equal(raw_send(&f->raw, buf, n), 0);
        Carls__Response *resp = raw_recv(&f->raw, 5000);
        if (resp) {
            answered++;
            carls__response__free_unpacked(resp, NULL);
        }
    }
    free(valid);
    free(buf);
    /* Every single-frame message within the size limit gets an answer. */
    assert_int_equal(answered, 3000);
    s_assert_healthy(f);
}

CARLS_TEST_MAIN(
    cmocka_unit_test_prestate_setup_teardown(test_garbage_truncated_and_multipart, s_setup, server_fixture_teardown,
                                             &s_client_options),
    cmocka_unit_test_prestate_setup_teardown(test_envelope_errors, s_setup, server_fixture_teardown,
                                             &s_client_options),
    cmocka_unit_test_prestate_setup_teardown(test_payload_errors, s_setup, server_fixture_teardown,
                                             &s_client_options),
    cmocka_unit_test_prestate_setup_teardown(test_oversized_frames, s_setup, server_fixture_teardown,
                                             &s_client_options),
    cmocka_unit_test_prestate_setup_teardown(test_random_mutations, s_setup, server_fixture_teardown,
                                             &s_client_options))
