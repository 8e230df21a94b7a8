/* Integration: replicated shards (docs/REPLICATION.md) with real kb-server processes on loopback.
 *
 * A follower applies every round of its primary (puts, gradient pushes, table creation) and serves them;
 * writes sent to it are refused with NOT_PRIMARY naming the primary; killed and restarted it catches up. With
 * --min-replicas 1 a write is acknowledged only once the follower applied it: kill -9 of the primary under a
 * stream of writes, promotion of the follower, the old primary back as its follower (by a snapshot when it
 * kept a round nobody acknowledged), ten times over, and every acknowledged write is on both. A follower new
 * to a primary that holds more than its memory of rounds catches up by a snapshot. A member restarted
 * without --replica-of is a standby until promoted; a promotion needs a newer term; a fenced primary
 * refuses writes. */
#include "kb_cluster.h"
#include "protocol.h"
#include "raw_client.h"
#include "replica_testlib.h"
#include "server_harness.h"
#include "test_proto.h"
#include "util.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

static void s_start_follower(test_server_t *f, const char *primary)
{
    const char *args[] = {"--replica-of", primary, NULL};
    assert_int_equal(test_server_start(f, args), 0);
}

static void test_follower_applies_serves_and_refuses_writes(void **state)
{
    (void)state;
    test_server_t p, f;
    repl_start_pair(&p, &f, "1", NULL, NULL);
    repl_expect_role(p.endpoint, "primary", 1);

    kb_cluster_t *cp = repl_client(p.endpoint, 10000), *cf = repl_client(f.endpoint, 10000);
    repl_create_table(cp);
    for (int i = 0; i < 300; i++)
        assert_int_equal(repl_put(cp, i), 0);
    /* Acknowledged with --min-replicas 1: the follower has applied each one already. */
    for (int i = 0; i < 300; i++)
        assert_true(repl_has(cf, i));
    repl_expect_role(f.endpoint, "follower", 1);
    Carls__Response *st = repl_status(p.endpoint);
    assert_int_equal(st->replica->n_followers, 1);
    assert_true(st->replica->followers[0]->live);
    assert_true(st->replica->followers[0]->acked_epoch >= st->replica->durable_epoch);
    assert_true(st->replica->replication_endpoint[0] != '\0');
    carls__response__free_unpacked(st, NULL);

    /* A write to the follower: NOT_PRIMARY naming the primary, and nothing changed. */
    assert_int_not_equal(repl_put(cf, 1000), 0);
    raw_client_t rc;
    assert_int_equal(raw_open(&rc, f.endpoint), 0);
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Put put = CARLS__PUT__INIT;
    test_request_envelope(&req, "t", 5, 77, 1);
    test_put_request(&req, &put, NULL, 0, NULL, 0);
    Carls__Response *r = raw_call(&rc, &req, 5000);
    assert_non_null(r);
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_NOT_PRIMARY);
    assert_string_equal(r->primary, p.endpoint);
    assert_int_equal(r->term, 1);
    carls__response__free_unpacked(r, NULL);
    raw_close(&rc);
    assert_false(repl_has(cp, 1000));
    /* Lookups on the follower create nothing. */
    assert_false(repl_has(cf, 2000));

    /* The follower killed: after 2 s without it a --min-replicas 1 primary refuses new writes at once
     * (UNAVAILABLE, nothing applied) rather than letting each wait for its commit timeout; with
     * --min-replicas 0 writes go on, and the restarted follower catches up from the primary's memory. */
    assert_int_equal(test_server_stop(&f, SIGKILL), 128 + SIGKILL);
    kb_cluster_destroy(&cf);
    usleep(5500 * 1000); /* 3 s until the follower counts as gone, 2 s more of too few */
    assert_int_equal(raw_open(&rc, p.endpoint), 0);
    req.sequence = 2;
    int64_t t0 = carls_monotonic_ms();
    r = raw_call(&rc, &req, 10000);
    assert_non_null(r);
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_UNAVAILABLE);
    assert_non_null(strstr(r->error, "min-replicas"));
    assert_true(carls_monotonic_ms() - t0 < 2000);
    carls__response__free_unpacked(r, NULL);
    raw_close(&rc);
    Carls__Response *k0 = repl_op_at(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_SET_MIN_REPLICAS, 0, 0);
    assert_int_equal(k0->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_int_equal(k0->replica->min_replicas, 0);
    carls__response__free_unpacked(k0, NULL);
    for (int i = 300; i < 400; i++)
        assert_int_equal(repl_put(cp, i), 0);
    s_start_follower(&f, p.endpoint);
    cf = repl_client(f.endpoint, 10000);
    repl_expect_rows(cf, 400);

    /* Stopped cleanly and started without --replica-of, a member that replicated is a standby. */
    kb_cluster_destroy(&cp);
    assert_int_equal(test_server_stop(&p, SIGTERM), 0);
    assert_int_equal(test_server_start(&p, NULL), 0);
    repl_expect_role(p.endpoint, "standby", 1);
    cp = repl_client(p.endpoint, 10000);
    assert_int_not_equal(repl_put(cp, 5000), 0);
    Carls__Response *bad = repl_op_at(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 1, 0);
    assert_int_equal(bad->status, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT); /* term 1 is not newer */
    carls__response__free_unpacked(bad, NULL);
    Carls__Response *ok = repl_op_at(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2, 0);
    assert_int_equal(ok->status, CARLS__STATUS_CODE__STATUS_OK);
    carls__response__free_unpacked(ok, NULL);
    repl_expect_role(p.endpoint, "primary", 2);
    assert_int_equal(repl_put(cp, 5000), 0);
    repl_expect_rows(cp, 400);
    /* Fenced with a newer term, it takes no more writes. */
    Carls__Response *fence = repl_op_at(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_FENCE, 3, 0);
    assert_int_equal(fence->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_true(fence->replica->fenced);
    carls__response__free_unpacked(fence, NULL);
    assert_int_not_equal(repl_put(cp, 5001), 0);
    assert_false(repl_has(cp, 5001));

    kb_cluster_destroy(&cp);
    kb_cluster_destroy(&cf);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

/* Kills the primary after a random 200..700 ms. */
typedef struct {
    test_server_t *victim;
    unsigned seed;
    atomic_bool killed;
} s_killer_t;

static void *s_killer_main(void *arg)
{
    s_killer_t *k = arg;
    usleep((useconds_t)(200 + rand_r(&k->seed) % 500) * 1000);
    test_server_stop(k->victim, SIGKILL);
    atomic_store(&k->killed, true);
    return NULL;
}

/* Again and again: writes stream to the primary (--min-replicas 1) until it is killed at a random moment;
 * the follower is promoted with the next term; the dead member comes back as its follower (from the new
 * primary's memory, or by a snapshot when it kept a round nobody acknowledged) and must have caught up
 * before the new primary acknowledges anything. Every acknowledged write is on the last primary and its
 * follower. CARLS_REPLICATION_CYCLES sets the count (10). */
static void test_kill9_failover_cycles_keep_every_acknowledged_write(void **state)
{
    (void)state;
    const char *env = getenv("CARLS_REPLICATION_CYCLES");
    int cycles = env ? atoi(env) : 10;
    test_server_t m[2];
    repl_start_pair(&m[0], &m[1], "1", NULL, NULL);
    kb_cluster_t *c = repl_client(m[0].endpoint, 10000);
    repl_create_table(c);
    kb_cluster_destroy(&c);
    int primary = 0, acked = 0;
    uint64_t term = 1;
    for (int cycle = 0; cycle < cycles; cycle++) {
        test_server_t *p = &m[primary], *f = &m[1 - primary];
        kb_cluster_t *cp = repl_client(p->endpoint, 2000);
        s_killer_t killer = {.victim = p, .seed = (unsigned)getpid() * 31u + (unsigned)cycle};
        pthread_t thread;
        assert_int_equal(pthread_create(&thread, NULL, s_killer_main, &killer), 0);
        int before = acked;
        while (repl_put(cp, acked) == 0)
            acked++;
        pthread_join(thread, NULL);
        assert_true(atomic_load(&killer.killed));
        kb_cluster_destroy(&cp);
        assert_true(acked > before);

        repl_op_ok(f->endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, ++term, 1);
        s_start_follower(p, f->endpoint);
        /* Acknowledged only once the old primary, now a follower, applied it. */
        kb_cluster_t *cf = repl_client(f->endpoint, 20000);
        if (repl_put(cf, acked) != 0)
            fail_msg("cycle %d: the new primary acknowledged nothing within 20 s", cycle);
        acked++;
        kb_cluster_destroy(&cf);
        repl_expect_role(f->endpoint, "primary", term);
        repl_expect_role(p->endpoint, "follower", term);
        primary = 1 - primary;
    }
    for (int side = 0; side < 2; side++) {
        kb_cluster_t *cm = repl_client(m[side].endpoint, 10000);
        for (int i = 0; i < acked; i++)
            if (!repl_has(cm, i))
                fail_msg("acknowledged write %d of %d is not on %s", i, acked, side == primary ? "the primary" :
                                                                                               "the follower");
        kb_cluster_destroy(&cm);
    }
    print_message("%d failovers, %d acknowledged writes, all on both members\n", cycles, acked);
    assert_int_equal(test_server_cleanup(&m[0]), 0);
    assert_int_equal(test_server_cleanup(&m[1]), 0);
}

/* A follower new to a primary whose memory no longer holds its first rounds catches up by a snapshot. */
static void test_new_follower_catches_up_by_snapshot(void **state)
{
    (void)state;
    test_server_t p, f;
    test_server_init(&p);
    test_server_init(&f);
    const char *args[] = {"--replication-listen", "tcp://127.0.0.1:*", "--replication-buffer-bytes", "1K", NULL};
    assert_int_equal(test_server_start(&p, args), 0);
    kb_cluster_t *cp = repl_client(p.endpoint, 10000);
    repl_create_table(cp);
    for (int i = 0; i < 200; i++)
        assert_int_equal(repl_put(cp, i), 0);
    s_start_follower(&f, p.endpoint);
    /* Short attempts: a request sent just before the follower restarts on the snapshot gets no answer. */
    kb_cluster_t *cf = repl_client(f.endpoint, 500);
    repl_expect_rows(cf, 200);
    for (int i = 200; i < 250; i++) /* and follows on from the snapshot's cut */
        assert_int_equal(repl_put(cp, i), 0);
    repl_expect_rows(cf, 250);
    assert_true(test_server_log_has(&f, "received and checked"));
    repl_expect_role(f.endpoint, "follower", 1);
    kb_cluster_destroy(&cp);
    kb_cluster_destroy(&cf);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

/* A bounded lookup of key-0 from the follower: the response (caller frees). */
static Carls__Response *s_bounded_lookup(raw_client_t *rc, uint32_t staleness_ms, uint64_t min_epoch)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Lookup lk = CARLS__LOOKUP__INIT;
    ProtobufCBinaryData key = {5, (uint8_t *)"key-0"};
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 9;
    req.table = "t";
    req.max_staleness_ms = staleness_ms;
    req.min_epoch = min_epoch;
    lk.n_keys = 1;
    lk.keys = &key;
    lk.no_create = true;
    req.op_case = CARLS__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    Carls__Response *r = raw_call(rc, &req, 5000);
    assert_non_null(r);
    return r;
}

/* Reads from a follower within bounds: a staleness bound holds while the primary's heartbeats come and fails
 * (STATUS_STALE) once the primary stops; a read without bounds is still answered; min_epoch = a write's
 * epoch reads that write. */
static void test_follower_reads_within_bounds(void **state)
{
    (void)state;
    test_server_t p, f;
    repl_start_pair(&p, &f, "1", NULL, NULL);
    kb_cluster_t *cp = repl_client(p.endpoint, 10000);
    repl_create_table(cp);
    raw_client_t wc;
    assert_int_equal(raw_open(&wc, p.endpoint), 0);
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Put put = CARLS__PUT__INIT;
    ProtobufCBinaryData key = {5, (uint8_t *)"key-0"};
    float v[REPL_DIM] = {1, 2, 3, 4};
    test_request_envelope(&req, "t", 8, 99, 1);
    test_put_request(&req, &put, &key, 1, v, REPL_DIM);
    Carls__Response *w = raw_call(&wc, &req, 5000);
    assert_non_null(w);
    assert_int_equal(w->status, CARLS__STATUS_CODE__STATUS_OK);
    uint64_t written = w->epoch;
    assert_true(written > 0);
    carls__response__free_unpacked(w, NULL);
    raw_close(&wc);

    raw_client_t rc;
    assert_int_equal(raw_open(&rc, f.endpoint), 0);
    /* Acknowledged once in the follower's journal, applied there a moment later: until then the read with
     * min_epoch is STALE, after it OK. */
    Carls__Response *r = NULL;
    for (int64_t until = carls_monotonic_ms() + 3000;;) {
        r = s_bounded_lookup(&rc, 1000, written);
        if (r->status == CARLS__STATUS_CODE__STATUS_OK || carls_monotonic_ms() > until)
            break;
        assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_STALE);
        carls__response__free_unpacked(r, NULL);
        usleep(10 * 1000);
    }
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_true(r->epoch >= written);
    assert_true(r->lookup->values[0] == 1.0f);
    carls__response__free_unpacked(r, NULL);
    r = s_bounded_lookup(&rc, 0, written + 1000000); /* an epoch nobody wrote yet */
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_STALE);
    carls__response__free_unpacked(r, NULL);

    assert_int_equal(kill(p.pid, SIGSTOP), 0);
    usleep(1500 * 1000);
    r = s_bounded_lookup(&rc, 1000, 0);
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_STALE);
    assert_non_null(strstr(r->error, "ms ago"));
    carls__response__free_unpacked(r, NULL);
    r = s_bounded_lookup(&rc, 0, 0); /* no bound: the sandbox read */
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_OK);
    carls__response__free_unpacked(r, NULL);
    assert_int_equal(kill(p.pid, SIGCONT), 0);
    int64_t deadline = carls_monotonic_ms() + 5000;
    bool fresh = false;
    while (!fresh && carls_monotonic_ms() < deadline) {
        r = s_bounded_lookup(&rc, 1000, 0);
        fresh = r->status == CARLS__STATUS_CODE__STATUS_OK;
        carls__response__free_unpacked(r, NULL);
        if (!fresh)
            usleep(50 * 1000);
    }
    assert_true(fresh);
    raw_close(&rc);
    kb_cluster_destroy(&cp);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_follower_applies_serves_and_refuses_writes),
    cmocka_unit_test(test_kill9_failover_cycles_keep_every_acknowledged_write),
    cmocka_unit_test(test_new_follower_catches_up_by_snapshot),
    cmocka_unit_test(test_follower_reads_within_bounds))
