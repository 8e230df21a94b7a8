/* Tests of kb_client's failover between the members of a replicated shard ("tcp://a:1|tcp://b:2",
 * kb_client.h) against fake servers (fake_kb_server.c): each rule that moves the client to another member
 * (an attempt that times out, a member that is not connected, NOT_PRIMARY naming a member, naming a new
 * endpoint, naming none, an answer of a term below the highest seen), the request resent byte for byte
 * (same request id, client id and sequence), every request in flight resent, giving up after
 * failover_wait_ms, the parsing of member lists (also through kb_cluster), and a client of one member that
 * behaves as before (NOT_PRIMARY is an error, a lower term is no reason to drop an answer). */
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
#include "kb_client.h"
#include "kb_cluster.h"
#include "protocol.h"
#include "util.h"

#define S_MAX_FAKES 3

/* n fakes with table "emb" (dim 2) and a client of "F0|F1|..." over them, with its cluster. */
typedef struct {
    fake_kb_server_t *srv[S_MAX_FAKES];
    size_t n;
    char list[512];
    kb_client_t *c;
    kb_cluster_t *cl;
} s_shard_t;

static void s_open(s_shard_t *s, size_t n, int timeout_ms, int failover_timeout_ms, int failover_wait_ms)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        s->srv[i] = fake_kb_server_new();
        fake_kb_server_add_table(s->srv[i], "emb", 2, 0);
        size_t len = strlen(s->list);
        snprintf(s->list + len, sizeof s->list - len, "%s%s", i ? "|" : "", fake_kb_server_endpoint(s->srv[i]));
    }
    kb_client_options_t opts = {.timeout_ms = timeout_ms,
                                .failover_timeout_ms = failover_timeout_ms,
                                .failover_wait_ms = failover_wait_ms};
    s->c = kb_client_new(s->list, &opts);
    assert_non_null(s->c);
    s->cl = kb_cluster_over(s->c);
}

static void s_close(s_shard_t *s)
{
    kb_cluster_destroy(&s->cl);
    kb_client_destroy(&s->c);
    for (size_t i = 0; i < s->n; i++)
        fake_kb_server_destroy(&s->srv[i]);
}

static int s_put(kb_cluster_t *cl)
{
    kb_key_t k = {"alpha", 5};
    float v[2] = {1.5f, -2.0f};
    return kb_cluster_put(cl, "emb", &k, 1, 2, v, 1);
}

/* s_put through cl, which must give want: how many ms it took. */
static int64_t s_timed_put(kb_cluster_t *cl, int want)
{
    int64_t t0 = carls_monotonic_ms();
    assert_int_equal(s_put(cl), want);
    return carls_monotonic_ms() - t0;
}

/* Frame i of fake a and frame j of fake b are the same bytes: a write (client id and sequence nonzero). */
static void s_assert_same_write(fake_kb_server_t *a, size_t i, fake_kb_server_t *b, size_t j)
{
    uint8_t x[4096], y[4096];
    size_t nx = fake_kb_server_request_bytes(a, i, x, sizeof x);
    size_t ny = fake_kb_server_request_bytes(b, j, y, sizeof y);
    assert_true(nx > 0 && nx <= sizeof x);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, nx);
    Carls__Request *r = fake_kb_server_request(b, j);
    assert_non_null(r);
    assert_int_equal(r->op_case, CARLS__REQUEST__OP_PUT);
    assert_true(r->client_id != 0 && r->sequence != 0);
    carls__request__free_unpacked(r, NULL);
}

/* A put through s that its first member does not take: it succeeds on the second member, which gets the same
 * bytes, after min_ms and before max_ms. */
static void s_expect_moved_to_second(s_shard_t *s, int64_t min_ms, int64_t max_ms)
{
    int64_t took = s_timed_put(s->cl, KB_CLIENT_OK);
    assert_true(took >= min_ms && took < max_ms);
    assert_string_equal(kb_client_member(s->c), fake_kb_server_endpoint(s->srv[1]));
    s_assert_same_write(s->srv[0], 0, s->srv[1], 0);
}

/* NOT_PRIMARY naming another member: the client goes straight there (not to the member between them) and
 * resends the same bytes; it stays there for the next request. */
static void test_not_primary_goes_to_the_named_member(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 3, 5000, 0, 0);
    fake_kb_server_set_not_primary(s.srv[0], fake_kb_server_endpoint(s.srv[2]));
    fake_kb_server_set_mode(s.srv[1], FAKE_SILENT);
    assert_true(s_timed_put(s.cl, KB_CLIENT_OK) < 1000); /* no pause, no timeout */
    assert_string_equal(kb_client_member(s.c), fake_kb_server_endpoint(s.srv[2]));
    assert_int_equal(fake_kb_server_count(s.srv[0]), 1);
    assert_int_equal(fake_kb_server_count(s.srv[1]), 0);
    assert_int_equal(fake_kb_server_count(s.srv[2]), 1);
    s_assert_same_write(s.srv[0], 0, s.srv[2], 0);
    assert_int_equal(s_put(s.cl), KB_CLIENT_OK);
    assert_int_equal(fake_kb_server_count(s.srv[0]), 1);
    assert_int_equal(fake_kb_server_count(s.srv[2]), 2);
    assert_int_equal(kb_client_members(s.c), 3);
    s_close(&s);
}

/* NOT_PRIMARY naming an endpoint not in the list (a replacement on another node): it is added and used. */
static void test_not_primary_naming_a_new_endpoint_adds_it(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 2, 5000, 0, 0);
    fake_kb_server_t *elsewhere = fake_kb_server_new();
    fake_kb_server_add_table(elsewhere, "emb", 2, 0);
    fake_kb_server_set_not_primary(s.srv[0], fake_kb_server_endpoint(elsewhere));
    fake_kb_server_set_mode(s.srv[1], FAKE_SILENT);
    assert_int_equal(s_put(s.cl), KB_CLIENT_OK);
    assert_int_equal(kb_client_members(s.c), 3);
    assert_string_equal(kb_client_member(s.c), fake_kb_server_endpoint(elsewhere));
    assert_int_equal(fake_kb_server_count(s.srv[1]), 0);
    assert_int_equal(fake_kb_server_count(elsewhere), 1);
    s_assert_same_write(s.srv[0], 0, elsewhere, 0);
    s_close(&s);
    fake_kb_server_destroy(&elsewhere);
}

/* NOT_PRIMARY naming nobody: the next member, after a pause of 100 ms. */
static void test_not_primary_without_a_name_tries_the_next_member(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 2, 5000, 0, 0);
    fake_kb_server_set_not_primary(s.srv[0], NULL);
    s_expect_moved_to_second(&s, 100, 2000);
    s_close(&s);
}

/* A member that is connected but does not answer: after timeout_ms the next member gets the same bytes. */
static void test_attempt_timeout_moves_to_the_next_member(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 2, 300, 0, 0);
    fake_kb_server_set_mode(s.srv[0], FAKE_SILENT);
    s_expect_moved_to_second(&s, 300, 3000);
    s_close(&s);
}

/* A member nobody listens on (a killed primary) is left after failover_timeout_ms, well before timeout_ms. */
static void test_dead_member_is_left_within_the_failover_timeout(void **state)
{
    (void)state;
    fake_kb_server_t *gone = fake_kb_server_new();
    char dead[128];
    snprintf(dead, sizeof dead, "%s", fake_kb_server_endpoint(gone));
    fake_kb_server_destroy(&gone); /* its port now refuses connections */
    fake_kb_server_t *live = fake_kb_server_new();
    fake_kb_server_add_table(live, "emb", 2, 0);
    char list[300];
    snprintf(list, sizeof list, "%s|%s", dead, fake_kb_server_endpoint(live));
    kb_client_options_t opts = {.timeout_ms = 20000, .failover_timeout_ms = 300};
    kb_cluster_t *cl = kb_cluster_new(list, &opts);
    assert_non_null(cl);
    int64_t took = s_timed_put(cl, KB_CLIENT_OK);
    assert_true(took >= 300 && took < 3000);
    assert_int_equal(fake_kb_server_count(live), 1);
    kb_cluster_destroy(&cl);
    fake_kb_server_destroy(&live);
}

/* An answer of a term below one seen before comes from a deposed primary: dropped, and the request goes to
 * the next member. */
static void test_stale_term_answer_is_dropped(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 2, 5000, 0, 0);
    fake_kb_server_set_term(s.srv[0], 3);
    fake_kb_server_set_term(s.srv[1], 3);
    assert_int_equal(s_put(s.cl), KB_CLIENT_OK);
    assert_int_equal(kb_client_term(s.c), 3);
    assert_string_equal(kb_client_member(s.c), fake_kb_server_endpoint(s.srv[0]));
    fake_kb_server_set_term(s.srv[0], 2);
    assert_int_equal(s_put(s.cl), KB_CLIENT_OK);
    assert_string_equal(kb_client_member(s.c), fake_kb_server_endpoint(s.srv[1]));
    assert_int_equal(fake_kb_server_count(s.srv[0]), 2);
    assert_int_equal(fake_kb_server_count(s.srv[1]), 1);
    s_assert_same_write(s.srv[0], 1, s.srv[1], 0);
    /* A higher term is followed. */
    fake_kb_server_set_term(s.srv[1], 4);
    assert_int_equal(s_put(s.cl), KB_CLIENT_OK);
    assert_int_equal(kb_client_term(s.c), 4);
    s_close(&s);
}

/* Every request in flight is resent on a move, also those nobody is waiting for yet. */
static void test_every_request_in_flight_is_resent(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 2, 5000, 0, 0);
    fake_kb_server_set_not_primary(s.srv[0], fake_kb_server_endpoint(s.srv[1]));
    kb_key_t k = {"alpha", 5};
    float v[2] = {1.0f, 2.0f};
    kb_cluster_pending_t *p1 = NULL, *p2 = NULL;
    assert_int_equal(kb_cluster_push_gradients_send(s.cl, "emb", &k, 1, 2, v, &p1), KB_CLIENT_OK);
    assert_int_equal(kb_cluster_push_gradients_send(s.cl, "emb", &k, 1, 2, v, &p2), KB_CLIENT_OK);
    assert_int_equal(fake_kb_server_wait_count(s.srv[0], 2, 5000), 2);
    assert_int_equal(kb_cluster_push_gradients_wait(s.cl, &p1), KB_CLIENT_OK);
    assert_int_equal(kb_cluster_push_gradients_wait(s.cl, &p2), KB_CLIENT_OK);
    assert_int_equal(fake_kb_server_count(s.srv[1]), 2);
    /* The two arrive in either order; each is one of A's frames byte for byte. */
    for (size_t j = 0; j < 2; j++) {
        uint8_t x[1024], y[1024];
        size_t ny = fake_kb_server_request_bytes(s.srv[1], j, y, sizeof y);
        bool found = false;
        for (size_t i = 0; i < 2; i++) {
            size_t nx = fake_kb_server_request_bytes(s.srv[0], i, x, sizeof x);
            found = found || (nx == ny && memcmp(x, y, nx) == 0);
        }
        assert_true(found);
    }
    s_close(&s);
}

/* No member takes the request: after failover_wait_ms the last NOT_PRIMARY is the answer; with no answer at
 * all, a timeout. */
static void test_gives_up_after_the_failover_wait(void **state)
{
    (void)state;
    s_shard_t s;
    s_open(&s, 2, 5000, 0, 700);
    fake_kb_server_set_not_primary(s.srv[0], NULL);
    fake_kb_server_set_not_primary(s.srv[1], NULL);
    int64_t took = s_timed_put(s.cl, KB_CLIENT_ESTATUS);
    assert_true(took >= 700 && took < 3000);
    assert_int_equal(kb_cluster_last_status(s.cl), CARLS__STATUS_CODE__STATUS_NOT_PRIMARY);
    assert_true(fake_kb_server_count(s.srv[0]) + fake_kb_server_count(s.srv[1]) >= 3);
    s_close(&s);

    s_open(&s, 2, 200, 0, 700);
    fake_kb_server_set_mode(s.srv[0], FAKE_SILENT);
    fake_kb_server_set_mode(s.srv[1], FAKE_SILENT);
    took = s_timed_put(s.cl, KB_CLIENT_ETIMEOUT);
    assert_true(took >= 700 && took < 3000);
    assert_non_null(strstr(kb_cluster_last_error(s.cl), "no answer from the members"));
    s_close(&s);
}

/* One member: NOT_PRIMARY is returned at once (no resend, no pause), a lower term is accepted, and a
 * timeout is retried `retries` times on the same endpoint, as before member lists. */
static void test_single_member_behaves_as_before(void **state)
{
    (void)state;
    fake_kb_server_t *a = fake_kb_server_new(), *b = fake_kb_server_new();
    fake_kb_server_add_table(a, "emb", 2, 0);
    kb_client_options_t opts = {.timeout_ms = 200, .retries = 1};
    kb_client_t *c = kb_client_new(fake_kb_server_endpoint(a), &opts);
    assert_non_null(c);
    kb_cluster_t *cl = kb_cluster_over(c);
    assert_int_equal(kb_client_members(c), 1);

    fake_kb_server_set_not_primary(a, fake_kb_server_endpoint(b));
    assert_true(s_timed_put(cl, KB_CLIENT_ESTATUS) < 1000); /* at once: no pause of 100 ms, no timeout (one frame) */
    assert_int_equal(kb_cluster_last_status(cl), CARLS__STATUS_CODE__STATUS_NOT_PRIMARY);
    assert_int_equal(fake_kb_server_count(a), 1);
    assert_int_equal(fake_kb_server_count(b), 0);
    assert_string_equal(kb_client_member(c), fake_kb_server_endpoint(a));

    fake_kb_server_set_mode(a, FAKE_ANSWER);
    fake_kb_server_set_term(a, 5);
    assert_int_equal(s_put(cl), KB_CLIENT_OK);
    fake_kb_server_set_term(a, 3);
    assert_int_equal(s_put(cl), KB_CLIENT_OK);
    assert_int_equal(fake_kb_server_count(a), 3);

    fake_kb_server_set_mode(a, FAKE_SILENT);
    assert_int_equal(s_put(cl), KB_CLIENT_ETIMEOUT);
    assert_non_null(strstr(kb_cluster_last_error(cl), "after 2 attempts of 200 ms"));
    assert_int_equal(fake_kb_server_count(a), 5);
    kb_cluster_destroy(&cl);
    kb_client_destroy(&c);
    fake_kb_server_destroy(&a);
    fake_kb_server_destroy(&b);
}

/* Member lists: trimmed; empty or repeated members refused; kb_cluster passes a '|' entry whole (one shard)
 * and still refuses a repeated shard. */
static void test_member_lists(void **state)
{
    (void)state;
    fake_kb_server_t *a = fake_kb_server_new(), *b = fake_kb_server_new();
    const char *ea = fake_kb_server_endpoint(a), *eb = fake_kb_server_endpoint(b);
    char list[400];
    snprintf(list, sizeof list, " %s |\t%s ", ea, eb);
    kb_client_t *c = kb_client_new(list, NULL);
    assert_non_null(c);
    assert_int_equal(kb_client_members(c), 2);
    assert_string_equal(kb_client_member(c), ea);
    assert_string_equal(kb_client_endpoint(c), list);
    kb_client_destroy(&c);

    static const char *const bad[] = {"%s||%s", "|%s%.0s", "%s|%.0s", "%s|%s|%s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(list, sizeof list, bad[i], ea, eb, ea);
        assert_null(kb_client_new(list, NULL));
    }

    snprintf(list, sizeof list, "%s|%s,%s", ea, eb, "tcp://127.0.0.1:1");
    kb_cluster_t *cl = kb_cluster_new(list, NULL);
    assert_non_null(cl);
    assert_int_equal(kb_cluster_shards(cl), 2);
    kb_cluster_destroy(&cl);
    snprintf(list, sizeof list, "%s|%s,%s|%s", ea, eb, ea, eb);
    assert_null(kb_cluster_new(list, NULL));
    fake_kb_server_destroy(&a);
    fake_kb_server_destroy(&b);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_not_primary_goes_to_the_named_member),
    cmocka_unit_test(test_not_primary_naming_a_new_endpoint_adds_it),
    cmocka_unit_test(test_not_primary_without_a_name_tries_the_next_member),
    cmocka_unit_test(test_attempt_timeout_moves_to_the_next_member),
    cmocka_unit_test(test_dead_member_is_left_within_the_failover_timeout),
    cmocka_unit_test(test_stale_term_answer_is_dropped),
    cmocka_unit_test(test_every_request_in_flight_is_resent),
    cmocka_unit_test(test_gives_up_after_the_failover_wait),
    cmocka_unit_test(test_single_member_behaves_as_before),
    cmocka_unit_test(test_member_lists))
