/* Tests of kb_cluster against three fake servers: keys go to the shard carls_shard_of names and nowhere
 * else, answers come back in the caller's order, every shard's request is sent before any answer is
 * awaited, list_tables sums rows, and a failing or lying shard is named in the error while the caller's
 * buffers stay untouched. Real servers are in tests/integration/test_cluster.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_kb_server.h"
#include "kb_cluster.h"
#include "protocol.h"

enum { SHARDS = 3, N = 90, DIM = 3 };

typedef struct {
    fake_kb_server_t *fake[SHARDS];
    kb_cluster_t *cluster;
    char names[N][16];
    kb_key_t keys[N];
} fixture_t;

static int s_setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    char eps[1024] = "";
    for (int s = 0; s < SHARDS; s++) {
        f->fake[s] = fake_kb_server_new();
        fake_kb_server_add_table(f->fake[s], "emb", DIM, 10 * (uint64_t)(s + 1));
        snprintf(eps + strlen(eps), sizeof eps - strlen(eps), "%s%s", s ? " , " : "",
                 fake_kb_server_endpoint(f->fake[s]));
    }
    kb_client_options_t opts = {.timeout_ms = 2000};
    f->cluster = kb_cluster_new(eps, &opts);
    if (!f->cluster)
        return -1;
    for (int i = 0; i < N; i++) {
        snprintf(f->names[i], sizeof f->names[i], "key-%d", i);
        f->keys[i] = (kb_key_t){f->names[i], strlen(f->names[i])};
    }
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    fixture_t *f = *state;
    kb_cluster_destroy(&f->cluster);
    for (int s = 0; s < SHARDS; s++)
        fake_kb_server_destroy(&f->fake[s]);
    free(f);
    return 0;
}

/* The last request fake s received, decoded (caller frees). */
static Carls__Request *s_last(fixture_t *f, int s)
{
    size_t n = fake_kb_server_count(f->fake[s]);
    assert_true(n > 0);
    Carls__Request *q = fake_kb_server_request(f->fake[s], n - 1);
    assert_non_null(q);
    return q;
}

static void test_lookup_routes_and_scatters(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(kb_cluster_shards(f->cluster), SHARDS);
    static float v[N * DIM];
    static kb_row_meta_t meta[N];
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", f->keys, N, DIM, v, meta), 0);
    assert_string_equal(kb_cluster_last_error(f->cluster), "");
    for (int i = 0; i < N; i++)
        for (int j = 0; j < DIM; j++)
            assert_true(v[i * DIM + j] == fake_kb_value(f->keys[i].data, f->keys[i].len, (uint32_t)j));
    /* Each shard got one lookup with exactly its keys, in the caller's order. */
    size_t total = 0;
    for (int s = 0; s < SHARDS; s++) {
        Carls__Request *q = s_last(f, s);
        assert_int_equal(q->op_case, CARLS__REQUEST__OP_LOOKUP);
        size_t next = 0;
        for (int i = 0; i < N; i++) {
            if (carls_shard_of(f->keys[i].data, f->keys[i].len, SHARDS) != (uint32_t)s)
                continue;
            assert_true(next < q->lookup->n_keys);
            assert_int_equal(q->lookup->keys[next].len, f->keys[i].len);
            assert_memory_equal(q->lookup->keys[next].data, f->keys[i].data, f->keys[i].len);
            next++;
        }
        assert_int_equal(next, q->lookup->n_keys);
        assert_true(next > 0);
        total += next;
        carls__request__free_unpacked(q, NULL);
    }
    assert_int_equal(total, N);
}

static void test_put_sends_each_shard_its_rows(void **state)
{
    fixture_t *f = *state;
    static float v[N * DIM];
    for (int i = 0; i < N * DIM; i++)
        v[i] = (float)i;
    assert_int_equal(kb_cluster_put(f->cluster, "emb", f->keys, N, DIM, v, 42), 0);
    for (int s = 0; s < SHARDS; s++) {
        Carls__Request *q = s_last(f, s);
        assert_int_equal(q->op_case, CARLS__REQUEST__OP_PUT);
        assert_int_equal(q->put->version, 42);
        assert_int_equal(q->put->n_values, q->put->n_keys * DIM);
        assert_true(q->client_id != 0 && q->sequence != 0);
        for (size_t j = 0; j < q->put->n_keys; j++) {
            /* Keys in a decoded request are not NUL-terminated: parse within their length. */
            char name[32] = {0};
            assert_true(q->put->keys[j].len < sizeof name);
            memcpy(name, q->put->keys[j].data, q->put->keys[j].len);
            int i = atoi(name + 4);
            assert_int_equal(carls_shard_of(f->keys[i].data, f->keys[i].len, SHARDS), (uint32_t)s);
            assert_memory_equal(q->put->values + j * DIM, v + i * DIM, DIM * sizeof(float));
        }
        carls__request__free_unpacked(q, NULL);
    }
}

static void test_list_tables_sums_rows(void **state)
{
    fixture_t *f = *state;
    Carls__Response *list = NULL;
    assert_int_equal(kb_cluster_list_tables(f->cluster, &list), 0);
    assert_int_equal(list->table_list->n_tables, 1);
    assert_int_equal(list->table_list->tables[0]->rows, 10 + 20 + 30);
    carls__response__free_unpacked(list, NULL);
    kb_cluster_table_t info;
    assert_int_equal(kb_cluster_table(f->cluster, "emb", &info), 0);
    assert_int_equal(info.dim, DIM);
    assert_int_equal(kb_cluster_table(f->cluster, "nope", &info), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    assert_non_null(strstr(kb_cluster_last_error(f->cluster), "no table named \"nope\""));
}

/* A silent shard times out and is named; the shards after it had their requests all the same (they were
 * sent before any answer was awaited). */
static void test_silent_shard_named_and_others_sent(void **state)
{
    fixture_t *f = *state;
    kb_cluster_destroy(&f->cluster);
    char eps[1024];
    snprintf(eps, sizeof eps, "%s,%s,%s", fake_kb_server_endpoint(f->fake[0]), fake_kb_server_endpoint(f->fake[1]),
             fake_kb_server_endpoint(f->fake[2]));
    kb_client_options_t opts = {.timeout_ms = 300, .retries = 0};
    f->cluster = kb_cluster_new(eps, &opts);
    fake_kb_server_set_mode(f->fake[0], FAKE_SILENT);
    size_t before[SHARDS];
    for (int s = 0; s < SHARDS; s++)
        before[s] = fake_kb_server_count(f->fake[s]);
    static float v[N * DIM];
    for (int i = 0; i < N * DIM; i++)
        v[i] = -1.0f;
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", f->keys, N, DIM, v, NULL), KB_CLIENT_ETIMEOUT);
    assert_int_equal(kb_cluster_failed_shard(f->cluster), 0);
    char want[300];
    snprintf(want, sizeof want, "shard 0 (%s): no answer", fake_kb_server_endpoint(f->fake[0]));
    assert_non_null(strstr(kb_cluster_last_error(f->cluster), want));
    for (int s = 0; s < SHARDS; s++)
        assert_int_equal(fake_kb_server_wait_count(f->fake[s], before[s] + 1, 2000), before[s] + 1);
    for (int i = 0; i < N * DIM; i++)
        assert_true(v[i] == -1.0f); /* nothing copied */
    fake_kb_server_set_mode(f->fake[0], FAKE_ANSWER);
    /* The cluster is usable again: late answers of the failed call are not mistaken for new ones. */
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", f->keys, N, DIM, v, NULL), 0);
    assert_true(v[0] == fake_kb_value(f->keys[0].data, f->keys[0].len, 0));
}

/* A shard that answers with the wrong number of values, or an error status: named, buffers untouched. */
static void test_bad_answers_named(void **state)
{
    fixture_t *f = *state;
    static float v[N * DIM];
    for (int i = 0; i < N * DIM; i++)
        v[i] = -1.0f;
    fake_kb_server_set_mode(f->fake[2], FAKE_LOOKUP_SHORT);
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", f->keys, N, DIM, v, NULL), KB_CLIENT_EMALFORMED);
    assert_int_equal(kb_cluster_failed_shard(f->cluster), 2);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_OK);
    assert_non_null(strstr(kb_cluster_last_error(f->cluster), "shard 2 ("));
    for (int i = 0; i < N * DIM; i++)
        assert_true(v[i] == -1.0f);
    fake_kb_server_set_mode(f->fake[2], FAKE_LOOKUP_BAD_DIM);
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", f->keys, N, DIM, v, NULL), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_failed_shard(f->cluster), 2);
    fake_kb_server_set_mode(f->fake[2], FAKE_ANSWER);

    fake_kb_server_set_status(f->fake[1], CARLS__STATUS_CODE__STATUS_READ_ONLY, "this server is read-only");
    assert_int_equal(kb_cluster_put(f->cluster, "emb", f->keys, N, DIM, v, 1), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_failed_shard(f->cluster), 1);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_READ_ONLY);
    assert_non_null(strstr(kb_cluster_last_error(f->cluster), "READ_ONLY: this server is read-only"));
    assert_int_equal(kb_cluster_create_table(f->cluster, "t2", &(Carls__TableConfig)CARLS__TABLE_CONFIG__INIT, true),
                     KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_failed_shard(f->cluster), 1);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_READ_ONLY);
    fake_kb_server_set_mode(f->fake[1], FAKE_ANSWER);
    assert_int_equal(kb_cluster_put(f->cluster, "emb", f->keys, N, DIM, v, 1), 0);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_OK);
    /* Bad arguments are nobody's shard. */
    kb_key_t empty = {"", 0};
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", &empty, 1, DIM, v, NULL), KB_CLIENT_EINVAL);
    assert_int_equal(kb_cluster_failed_shard(f->cluster), -1);
}

/* One endpoint: calls pass straight through; errors carry the client's text without a shard prefix. */
static void test_single_endpoint_pass_through(void **state)
{
    fixture_t *f = *state;
    kb_cluster_t *one = kb_cluster_new(fake_kb_server_endpoint(f->fake[0]), NULL);
    assert_int_equal(kb_cluster_shards(one), 1);
    size_t before = fake_kb_server_count(f->fake[0]);
    static float v[N * DIM];
    assert_int_equal(kb_cluster_lookup(one, "emb", f->keys, N, DIM, v, NULL), 0);
    assert_int_equal(fake_kb_server_count(f->fake[0]), before + 1);
    Carls__Request *q = s_last(f, 0);
    assert_int_equal(q->lookup->n_keys, N); /* every key, shard or not */
    carls__request__free_unpacked(q, NULL);
    fake_kb_server_set_status(f->fake[0], CARLS__STATUS_CODE__STATUS_INTERNAL, "disk full");
    assert_int_equal(kb_cluster_lookup(one, "emb", f->keys, N, DIM, v, NULL), KB_CLIENT_ESTATUS);
    assert_string_equal(kb_cluster_last_error(one), "INTERNAL: disk full");
    assert_int_equal(kb_cluster_failed_shard(one), 0);
    assert_int_equal(kb_cluster_last_status(one), CARLS__STATUS_CODE__STATUS_INTERNAL);
    fake_kb_server_set_mode(f->fake[0], FAKE_ANSWER);
    kb_cluster_destroy(&one);
    assert_null(one);
    kb_cluster_destroy(&one);
    kb_cluster_destroy(NULL);
}

/* Requests in flight: two lookups and a push sent before any answer is awaited reach every shard at once;
 * their answers are collected in any order (the later lookup first), each in its caller's key order. */
static void test_requests_in_flight(void **state)
{
    fixture_t *f = *state;
    enum { HALF = N / 2 };
    static float a[HALF * DIM], b[HALF * DIM], g[N * DIM];
    size_t before[SHARDS];
    for (int s = 0; s < SHARDS; s++)
        before[s] = fake_kb_server_count(f->fake[s]);
    uint64_t sent0 = kb_cluster_requests(f->cluster);
    kb_cluster_pending_t *first = NULL, *second = NULL, *push = NULL;
    assert_int_equal(kb_cluster_lookup_send(f->cluster, "emb", f->keys, HALF, DIM, false, &first), 0);
    assert_int_equal(kb_cluster_lookup_send(f->cluster, "emb", f->keys + HALF, HALF, DIM, true, &second), 0);
    assert_int_equal(kb_cluster_push_gradients_send(f->cluster, "emb", f->keys, N, DIM, g, &push), 0);
    assert_int_equal(kb_cluster_requests(f->cluster) - sent0, 3 * SHARDS); /* each batch has keys on each shard */
    for (int s = 0; s < SHARDS; s++)
        assert_int_equal(fake_kb_server_wait_count(f->fake[s], before[s] + 3, 2000), before[s] + 3);
    assert_int_equal(kb_cluster_lookup_wait(f->cluster, &second, b, NULL), 0);
    assert_null(second);
    assert_int_equal(kb_cluster_lookup_wait(f->cluster, &first, a, NULL), 0);
    assert_int_equal(kb_cluster_push_gradients_wait(f->cluster, &push), 0);
    for (int i = 0; i < HALF; i++) {
        for (int j = 0; j < DIM; j++) {
            assert_true(a[i * DIM + j] == fake_kb_value(f->keys[i].data, f->keys[i].len, (uint32_t)j));
            assert_true(b[i * DIM + j] == fake_kb_value(f->keys[HALF + i].data, f->keys[HALF + i].len, (uint32_t)j));
        }
    }
    /* The second lookup's no_create reached the shards. */
    Carls__Request *q = fake_kb_server_request(f->fake[0], before[0] + 1);
    assert_non_null(q);
    assert_int_equal(q->op_case, CARLS__REQUEST__OP_LOOKUP);
    assert_true(q->lookup->no_create);
    carls__request__free_unpacked(q, NULL);
}

/* A pending given up on is cancelled: its answer, arriving late (shard 0 holds it back until the next request
 * and then sends it after that request's answer), is dropped, and the next call gets its own answers. */
static void test_abandoned_pending(void **state)
{
    fixture_t *f = *state;
    fake_kb_server_set_mode(f->fake[0], FAKE_REVERSE_PAIRS);
    kb_cluster_pending_t *p = NULL;
    assert_int_equal(kb_cluster_lookup_send(f->cluster, "emb", f->keys, N, DIM, false, &p), 0);
    kb_cluster_pending_destroy(f->cluster, &p);
    assert_null(p);
    kb_cluster_pending_destroy(f->cluster, &p);
    static float v[N * DIM];
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", f->keys + 1, N - 1, DIM, v, NULL), 0);
    for (int i = 0; i < N - 1; i++)
        assert_true(v[i * DIM] == fake_kb_value(f->keys[i + 1].data, f->keys[i + 1].len, 0));
    fake_kb_server_set_mode(f->fake[0], FAKE_ANSWER);
}

CARLS_TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_lookup_routes_and_scatters, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_put_sends_each_shard_its_rows, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_list_tables_sums_rows, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_silent_shard_named_and_others_sent, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_bad_answers_named, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_single_endpoint_pass_through, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_requests_in_flight, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_abandoned_pending, s_setup, s_teardown))
