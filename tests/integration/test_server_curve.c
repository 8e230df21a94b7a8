/* Integration: kb-server with CURVE. A client with an allowed key is served; a client with another key, a
 * client without CURVE, and a client trusting the wrong server key get nothing, and the server keeps
 * serving the allowed one. */
#include "kb_zap.h"
#include "protocol.h"
#include "raw_client.h"
#include "server_harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include "test_main.h"

static void s_keygen(const char *dir, const char *name)
{
    kb_auth_keypair_t pair;
    char err[256], sec[512], pub[512];
    snprintf(sec, sizeof sec, "%s/%s.key", dir, name);
    snprintf(pub, sizeof pub, "%s/%s.pub", dir, name);
    assert_int_equal(kb_auth_keypair_generate(&pair, err, sizeof err), 0);
    assert_int_equal(kb_auth_keypair_write(&pair, sec, pub, false, err, sizeof err), 0);
}

static Carls__Response *s_list(raw_client_t *rc, int timeout_ms)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__ListTables lt = CARLS__LIST_TABLES__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 9;
    req.op_case = CARLS__REQUEST__OP_LIST_TABLES;
    req.list_tables = &lt;
    return raw_call(rc, &req, timeout_ms);
}

static void test_curve_admits_only_allowed_keys(void **state)
{
    (void)state;
    test_server_t srv;
    test_server_init(&srv);
    char keys[300], allow[300], path[3][1024];
    snprintf(keys, sizeof keys, "%s/keys", srv.data_dir);
    snprintf(allow, sizeof allow, "%s/allow", srv.data_dir);
    assert_int_equal(mkdir(keys, 0700), 0);
    assert_int_equal(mkdir(allow, 0700), 0);
    s_keygen(keys, "server");
    s_keygen(keys, "alice");
    s_keygen(keys, "mallory");
    s_keygen(keys, "impostor");
    /* Only alice's public key is on the allow-list. */
    snprintf(path[0], sizeof path[0], "cp '%s/alice.pub' '%s/'", keys, allow);
    assert_int_equal(system(path[0]), 0);
    snprintf(path[0], sizeof path[0], "%s/server.key", keys);
    const char *args[] = {"--curve-secret", path[0], "--curve-allow", allow, NULL};
    assert_int_equal(test_server_start(&srv, args), 0);

    char alice[1024], mallory[1024], server_pub[1024], impostor_pub[1024];
    snprintf(alice, sizeof alice, "%s/alice.key", keys);
    snprintf(mallory, sizeof mallory, "%s/mallory.key", keys);
    snprintf(server_pub, sizeof server_pub, "%s/server.pub", keys);
    snprintf(impostor_pub, sizeof impostor_pub, "%s/impostor.pub", keys);

    raw_client_t good, bad, plain, fooled;
    assert_int_equal(raw_open_curve(&good, srv.endpoint, alice, server_pub), 0);
    Carls__Response *resp = s_list(&good, 5000);
    assert_non_null(resp);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_OK);
    carls__response__free_unpacked(resp, NULL);

    assert_int_equal(raw_open_curve(&bad, srv.endpoint, mallory, server_pub), 0);
    assert_null(s_list(&bad, 700));
    assert_int_equal(raw_open(&plain, srv.endpoint), 0);
    assert_null(s_list(&plain, 700));
    /* A client that trusts another server key never completes the handshake. */
    assert_int_equal(raw_open_curve(&fooled, srv.endpoint, alice, impostor_pub), 0);
    assert_null(s_list(&fooled, 700));

    resp = s_list(&good, 5000);
    assert_non_null(resp);
    carls__response__free_unpacked(resp, NULL);
    raw_close(&good);
    raw_close(&bad);
    raw_close(&plain);
    raw_close(&fooled);
    assert_int_equal(test_server_cleanup(&srv), 0);
}

static void test_curve_flags_go_together(void **state)
{
    (void)state;
    test_server_t srv;
    test_server_init(&srv);
    const char *args[] = {"--curve-secret", "/nonexistent.key", NULL};
    assert_int_not_equal(test_server_start(&srv, args), 0);
    const char *args2[] = {"--curve-secret", "/nonexistent.key", "--curve-allow", "/nonexistent", NULL};
    assert_int_not_equal(test_server_start(&srv, args2), 0);
    test_server_cleanup(&srv);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_curve_admits_only_allowed_keys),
    cmocka_unit_test(test_curve_flags_go_together))
