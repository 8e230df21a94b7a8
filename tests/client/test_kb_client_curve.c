/* Tests of kb_client's CURVE option against a CURVE fake server: the right keys get answers, also after a
 * timeout makes the client reopen its socket (the keys must be applied to every new socket); no keys, an
 * unlisted client key or the wrong server key get nothing at all; key files load through
 * kb_client_curve_load. Skips (exit 77) when libzmq has no CURVE. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "fake_kb_server.h"
#include "kb_client.h"
#include "kb_cluster.h"

static kb_auth_keypair_t s_server, s_alice, s_mallory;

static kb_client_t *s_client(const char *endpoint, const kb_auth_keypair_t *me, const kb_auth_key_t *server_pub,
                             int timeout_ms, int retries)
{
    kb_client_curve_t curve = {0};
    kb_client_options_t opts = {.timeout_ms = timeout_ms, .retries = retries};
    if (me) {
        curve.client = *me;
        curve.server_public = *server_pub;
        opts.curve = &curve;
    }
    kb_client_t *c = kb_client_new(endpoint, &opts);
    assert_non_null(c);
    return c;
}

static void test_allowed_client_gets_answers(void **state)
{
    (void)state;
    fake_kb_server_t *srv = fake_kb_server_new_curve(&s_server, &s_alice.public_key);
    fake_kb_server_add_table(srv, "emb", 3, 10);
    kb_client_t *c = s_client(fake_kb_server_endpoint(srv), &s_alice, &s_server.public_key, 5000, 0);
    kb_cluster_t *cl = kb_cluster_over(c);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_list_tables(cl, &resp), 0);
    assert_int_equal(resp->table_list->n_tables, 1);
    carls__response__free_unpacked(resp, NULL);

    kb_cluster_destroy(&cl);
    kb_client_destroy(&c);

    /* The fake ignores each request's first attempt: the answer comes only to the resend, on a socket the
     * client reopened, which therefore must be a CURVE client too. */
    fake_kb_server_set_mode(srv, FAKE_IGNORE_FIRST);
    size_t before = fake_kb_server_count(srv);
    c = s_client(fake_kb_server_endpoint(srv), &s_alice, &s_server.public_key, 300, 2);
    cl = kb_cluster_over(c);
    kb_key_t key = {"k", 1};
    float v[3];
    assert_int_equal(kb_cluster_lookup(cl, "emb", &key, 1, 3, v, NULL), 0);
    assert_true(v[2] == fake_kb_value("k", 1, 2));
    assert_int_equal(fake_kb_server_count(srv) - before, 2); /* the ignored attempt and the resend */
    kb_cluster_destroy(&cl);
    kb_client_destroy(&c);
    fake_kb_server_destroy(&srv);
}

static void test_others_get_nothing(void **state)
{
    (void)state;
    fake_kb_server_t *srv = fake_kb_server_new_curve(&s_server, &s_alice.public_key);
    const char *ep = fake_kb_server_endpoint(srv);
    Carls__Response *resp = NULL;
    /* No CURVE, an unlisted key, a client that trusts another server key. */
    kb_client_t *clients[3] = {
        s_client(ep, NULL, NULL, 300, 0),
        s_client(ep, &s_mallory, &s_server.public_key, 300, 0),
        s_client(ep, &s_alice, &s_mallory.public_key, 300, 0),
    };
    for (int i = 0; i < 3; i++) {
        kb_cluster_t *cl = kb_cluster_over(clients[i]);
        assert_int_equal(kb_cluster_list_tables(cl, &resp), KB_CLIENT_ETIMEOUT);
        assert_null(resp);
        kb_cluster_destroy(&cl);
        kb_client_destroy(&clients[i]);
    }
    /* Not one of their frames reached the server. */
    assert_int_equal(fake_kb_server_count(srv), 0);
    fake_kb_server_destroy(&srv);
}

static void test_key_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_kb_client_curve_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char key[128], pub[128], spub[128], skey[128], err[256];
    snprintf(key, sizeof key, "%s/alice.key", dir);
    snprintf(pub, sizeof pub, "%s/alice.pub", dir);
    snprintf(skey, sizeof skey, "%s/server.key", dir);
    snprintf(spub, sizeof spub, "%s/server.pub", dir);
    assert_int_equal(kb_auth_keypair_write(&s_alice, key, pub, false, err, sizeof err), 0);
    assert_int_equal(kb_auth_keypair_write(&s_server, skey, spub, false, err, sizeof err), 0);
    kb_client_curve_t curve;
    assert_int_equal(kb_client_curve_load(key, spub, &curve, err, sizeof err), 0);
    assert_memory_equal(&curve.client, &s_alice, sizeof s_alice);
    assert_memory_equal(&curve.server_public, &s_server.public_key, sizeof s_server.public_key);
    /* The loaded keys work. */
    fake_kb_server_t *srv = fake_kb_server_new_curve(&s_server, &s_alice.public_key);
    kb_client_options_t opts = {.timeout_ms = 5000, .curve = &curve};
    kb_cluster_t *cl = kb_cluster_new(fake_kb_server_endpoint(srv), &opts);
    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_list_tables(cl, &resp), 0);
    carls__response__free_unpacked(resp, NULL);
    kb_cluster_destroy(&cl);
    fake_kb_server_destroy(&srv);
    /* A public file where the secret belongs, a missing file, a missing argument. */
    assert_true(kb_client_curve_load(pub, spub, &curve, err, sizeof err) < 0);
    assert_true(strlen(err) > 0);
    assert_true(kb_client_curve_load(key, "/nonexistent.pub", &curve, err, sizeof err) < 0);
    assert_true(kb_client_curve_load(NULL, spub, &curve, err, sizeof err) < 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    if (!zmq_has("curve")) {
        fprintf(stderr, "libzmq without CURVE: skipped\n");
        return 77;
    }
    char err[256];
    if (kb_auth_keypair_generate(&s_server, err, sizeof err) != 0 ||
        kb_auth_keypair_generate(&s_alice, err, sizeof err) != 0 ||
        kb_auth_keypair_generate(&s_mallory, err, sizeof err) != 0) {
        fprintf(stderr, "cannot generate keys: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed_client_gets_answers),
        cmocka_unit_test(test_others_get_nothing),
        cmocka_unit_test(test_key_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
