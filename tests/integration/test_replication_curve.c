/* Integration: replicated shards with CURVE (docs/SECURITY.md, replicated shards), real kb-server processes on
 * loopback. The members share one server key pair; the primary's allow-list holds the allowed follower's key
 * and the test's own. A follower with an allowed --replica-curve-key replicates (acknowledged --min-replicas 1
 * writes are on it); one whose key is not on the list gets nothing, not even the replication endpoint, and the
 * primary goes on serving; the replication socket answers neither a plain peer nor an unlisted key. Promoted,
 * the follower's own replication socket is CURVE too: the old primary follows it with its key. */
#include "kb_zap.h"
#include "protocol.h"
#include "raw_client.h"
#include "replica_testlib.h"
#include "server_harness.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include <cmocka.h>
#include "test_main.h"

/* Key files under one directory: KEYS/NAME.key and .pub; the allow-list ALLOW/ holds the .pub of the allowed. */
typedef struct {
    char dir[300], allow[300];
    char server_key[400], server_pub[400];
} s_keys_t;

static void s_path(const s_keys_t *k, const char *name, const char *ext, char *out, size_t len)
{
    snprintf(out, len, "%s/%s.%s", k->dir, name, ext);
}

/* A key pair NAME; with allowed its public key goes on the allow-list. */
static void s_keygen(const s_keys_t *k, const char *name, bool allowed)
{
    kb_auth_keypair_t pair;
    char err[256], sec[400], pub[400];
    s_path(k, name, "key", sec, sizeof sec);
    s_path(k, name, "pub", pub, sizeof pub);
    assert_int_equal(kb_auth_keypair_generate(&pair, err, sizeof err), 0);
    assert_int_equal(kb_auth_keypair_write(&pair, sec, pub, false, err, sizeof err), 0);
    if (allowed) {
        char dst[400];
        snprintf(dst, sizeof dst, "%s/%s.pub", k->allow, name);
        assert_int_equal(kb_auth_keypair_write(&pair, sec, dst, true, err, sizeof err), 0);
    }
}

static void s_keys_init(s_keys_t *k, const char *under)
{
    snprintf(k->dir, sizeof k->dir, "%s/keys", under);
    snprintf(k->allow, sizeof k->allow, "%s/allow", under);
    assert_int_equal(mkdir(k->dir, 0700), 0);
    assert_int_equal(mkdir(k->allow, 0700), 0);
    s_keygen(k, "server", false);
    s_keygen(k, "op", true);        /* the test: its clients and replica ops */
    s_keygen(k, "follower", true);  /* the follower's --replica-curve-key */
    s_keygen(k, "primary", true);   /* the old primary's, once it follows the promoted member */
    s_keygen(k, "stranger", false); /* a follower whose key is not on the list */
    s_path(k, "server", "key", k->server_key, sizeof k->server_key);
    s_path(k, "server", "pub", k->server_pub, sizeof k->server_pub);
}

/* A kb-server of the shard: CURVE with the shared server pair and allow-list; a follower of `primary` with
 * the client key NAME when primary is not NULL. */
static int s_start(test_server_t *srv, const s_keys_t *k, const char *primary, const char *name)
{
    char key[400];
    s_path(k, name ? name : "op", "key", key, sizeof key);
    const char *args[] = {"--curve-secret", k->server_key, "--curve-allow", k->allow, "--replica-of", primary,
                          "--replica-curve-key", key, NULL};
    if (!primary)
        args[4] = NULL;
    return test_server_start(srv, args);
}

/* A cluster over CURVE with the test's key. */
static kb_cluster_t *s_client(const s_keys_t *k, const char *endpoint)
{
    char key[400], err[256];
    s_path(k, "op", "key", key, sizeof key);
    kb_client_curve_t curve;
    assert_int_equal(kb_client_curve_load(key, k->server_pub, &curve, err, sizeof err), 0);
    kb_client_options_t opts = {.timeout_ms = 10000, .curve = &curve};
    kb_cluster_t *c = kb_cluster_new(endpoint, &opts);
    assert_non_null(c);
    return c;
}

/* The replica op over CURVE with the test's key; asserts an OK answer (caller frees). */
static Carls__Response *s_op(const s_keys_t *k, const char *endpoint, Carls__ReplicaAction action, uint64_t term)
{
    char key[400];
    s_path(k, "op", "key", key, sizeof key);
    raw_client_t rc;
    assert_int_equal(raw_open_curve(&rc, endpoint, key, k->server_pub), 0);
    Carls__Response *r = repl_op(&rc, action, term, 0);
    raw_close(&rc);
    assert_non_null(r);
    if (r->status != CARLS__STATUS_CODE__STATUS_OK)
        fail_msg("replica op %d on %s: %s", (int)action, endpoint, r->error);
    return r;
}

/* A hello to the replication endpoint over rc: whether anything came back within 1.5 s. */
static bool s_hello_answered(raw_client_t *rc)
{
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplHello h = CARLS__REPL_HELLO__INIT;
    h.member = "intruder";
    msg.body_case = CARLS__REPL_MESSAGE__BODY_HELLO;
    msg.hello = &h;
    uint8_t buf[128];
    size_t n = carls__repl_message__pack(&msg, buf);
    assert_int_equal(raw_send(rc, buf, n), 0);
    zmq_pollitem_t item = {rc->socket, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&item, 1, 1500) > 0;
}

static void test_curve_follower_replicates_a_stranger_gets_nothing(void **state)
{
    (void)state;
    test_server_t p, f, s;
    test_server_init(&p);
    test_server_init(&f);
    test_server_init(&s);
    s_keys_t k;
    s_keys_init(&k, p.data_dir);
    const char *pargs[] = {"--curve-secret", k.server_key, "--curve-allow", k.allow, "--min-replicas", "1", NULL};
    assert_int_equal(test_server_start(&p, pargs), 0);
    assert_int_equal(s_start(&f, &k, p.endpoint, "follower"), 0);

    /* Acknowledged with --min-replicas 1: on the follower already. */
    kb_cluster_t *cp = s_client(&k, p.endpoint), *cf = s_client(&k, f.endpoint);
    repl_create_table(cp);
    for (int i = 0; i < 100; i++)
        assert_int_equal(repl_put(cp, i), 0);
    for (int i = 0; i < 100; i++)
        assert_true(repl_has(cf, i));
    Carls__Response *st = s_op(&k, p.endpoint, CARLS__REPLICA_ACTION__REPLICA_STATUS, 0);
    assert_int_equal(st->replica->n_followers, 1);
    assert_true(st->replica->followers[0]->live);
    char replication[256];
    snprintf(replication, sizeof replication, "%s", st->replica->replication_endpoint);
    carls__response__free_unpacked(st, NULL);

    /* The stranger: no answer from the client endpoint, so it never learns the replication endpoint; the
     * replication socket itself answers no plain peer and no unlisted key either. */
    assert_int_equal(s_start(&s, &k, p.endpoint, "stranger"), 0);
    raw_client_t plain, unlisted;
    char stranger[400];
    s_path(&k, "stranger", "key", stranger, sizeof stranger);
    assert_int_equal(raw_open(&plain, replication), 0);
    assert_false(s_hello_answered(&plain));
    assert_int_equal(raw_open_curve(&unlisted, replication, stranger, k.server_pub), 0);
    assert_false(s_hello_answered(&unlisted));
    raw_close(&plain);
    raw_close(&unlisted);
    for (int i = 100; i < 200; i++) /* the primary keeps serving (and the allowed follower keeps acking) */
        assert_int_equal(repl_put(cp, i), 0);
    st = s_op(&k, s.endpoint, CARLS__REPLICA_ACTION__REPLICA_STATUS, 0);
    assert_int_equal(st->replica->committed_epoch, 0);
    assert_int_equal(st->replica->term, 0);
    carls__response__free_unpacked(st, NULL);
    st = s_op(&k, p.endpoint, CARLS__REPLICA_ACTION__REPLICA_STATUS, 0);
    assert_int_equal(st->replica->n_followers, 1);
    carls__response__free_unpacked(st, NULL);
    assert_true(test_server_log_has(&s, "no answer from the primary"));
    assert_true(test_server_log_has(&s, "--replica-curve-key must be on the primary's --curve-allow"));
    assert_int_equal(test_server_cleanup(&s), 0);

    /* Promoted, the follower binds a CURVE replication socket: the old primary follows it with its key. */
    Carls__Response *r = s_op(&k, p.endpoint, CARLS__REPLICA_ACTION__REPLICA_FENCE, 2);
    carls__response__free_unpacked(r, NULL);
    r = s_op(&k, f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2);
    carls__response__free_unpacked(r, NULL);
    kb_cluster_destroy(&cp);
    assert_int_equal(test_server_stop(&p, SIGTERM), 0);
    assert_int_equal(s_start(&p, &k, f.endpoint, "primary"), 0);
    for (int i = 200; i < 250; i++)
        assert_int_equal(repl_put(cf, i), 0);
    cp = s_client(&k, p.endpoint);
    repl_expect_rows(cp, 250);
    kb_cluster_destroy(&cp);
    kb_cluster_destroy(&cf);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

/* The follower's key flags: needed with --replica-of and --curve-secret, refused without them. */
static void test_replica_curve_flags(void **state)
{
    (void)state;
    test_server_t srv;
    test_server_init(&srv);
    s_keys_t k;
    s_keys_init(&k, srv.data_dir);
    char key[400];
    s_path(&k, "follower", "key", key, sizeof key);
    const char *no_key[] = {"--curve-secret", k.server_key, "--curve-allow", k.allow, "--replica-of",
                            "tcp://127.0.0.1:1", NULL};
    assert_int_not_equal(test_server_start(&srv, no_key), 0);
    assert_true(test_server_log_has(&srv, "needs --replica-curve-key"));
    const char *no_follower[] = {"--curve-secret", k.server_key, "--curve-allow", k.allow, "--replica-curve-key",
                                 key, NULL};
    assert_int_not_equal(test_server_start(&srv, no_follower), 0);
    const char *no_curve[] = {"--replica-of", "tcp://127.0.0.1:1", "--replica-curve-key", key, NULL};
    assert_int_not_equal(test_server_start(&srv, no_curve), 0);
    const char *missing[] = {"--curve-secret", k.server_key, "--curve-allow", k.allow, "--replica-of",
                             "tcp://127.0.0.1:1", "--replica-curve-key", "/nonexistent.key", NULL};
    assert_int_not_equal(test_server_start(&srv, missing), 0);
    assert_true(test_server_log_has(&srv, "--replica-curve-key: "));
    test_server_cleanup(&srv);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_curve_follower_replicates_a_stranger_gets_nothing),
    cmocka_unit_test(test_replica_curve_flags))
