/* Integration: replicated shards (docs/REPLICATION.md) with real kb-server processes on loopback.
 *
 * A follower applies every round of its primary (puts, gradient pushes, table creation) and serves them;
 * writes sent to it are refused with NOT_PRIMARY naming the primary; killed and restarted it catches up. With
 * --min-replicas 1 a write is acknowledged only once the follower applied it: kill -9 of the primary under a
 * stream of writes, promotion of the follower, and every acknowledged write is there; the old primary then
 * rejoins as a follower of the new one, or is refused as diverged when it kept a round nobody acknowledged. A
 * member restarted without --replica-of is a standby until promoted; a promotion needs a newer term; a
 * fenced primary refuses writes. */
#include "kb_cluster.h"
#include "protocol.h"
#include "raw_client.h"
#include "server_harness.h"
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
#include <unistd.h>

#include <cmocka.h>

#define S_DIM 4

/* The replica op against endpoint; the caller frees the response. */
static Carls__Response *s_replica(const char *endpoint, Carls__ReplicaAction action, uint64_t term)
{
    raw_client_t rc;
    assert_int_equal(raw_open(&rc, endpoint), 0);
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Replica op = CARLS__REPLICA__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 42;
    op.action = action;
    op.term = term;
    req.op_case = CARLS__REQUEST__OP_REPLICA;
    req.replica = &op;
    Carls__Response *resp = raw_call(&rc, &req, 10000);
    raw_close(&rc);
    assert_non_null(resp);
    return resp;
}

/* The member's status (asserting an OK answer). */
static Carls__Response *s_status(const char *endpoint)
{
    Carls__Response *r = s_replica(endpoint, CARLS__REPLICA_ACTION__REPLICA_STATUS, 0);
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_int_equal(r->result_case, CARLS__RESPONSE__RESULT_REPLICA);
    return r;
}

static void s_expect_role(const char *endpoint, const char *role, uint64_t term)
{
    Carls__Response *r = s_status(endpoint);
    if (strcmp(r->replica->role, role) != 0 || r->replica->term != term)
        fail_msg("%s is a %s of term %llu; expected a %s of term %llu", endpoint, r->replica->role,
                 (unsigned long long)r->replica->term, role, (unsigned long long)term);
    assert_int_equal(r->term, term); /* every reply carries it */
    carls__response__free_unpacked(r, NULL);
}

static kb_cluster_t *s_client(const char *endpoint, int timeout_ms)
{
    kb_client_options_t opts = {.timeout_ms = timeout_ms, .retries = 0};
    kb_cluster_t *c = kb_cluster_new(endpoint, &opts);
    assert_non_null(c);
    return c;
}

static void s_create_table(kb_cluster_t *c)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = S_DIM;
    cfg.init = CARLS__INIT_KIND__INIT_ZEROS;
    assert_int_equal(kb_cluster_create_table(c, "t", &cfg, false), 0);
}

static void s_row(int i, char *name, size_t len, float *v)
{
    snprintf(name, len, "key-%d", i);
    for (int j = 0; j < S_DIM; j++)
        v[j] = (float)i + (float)j / 8.0f;
}

static int s_put(kb_cluster_t *c, int i)
{
    char name[32];
    float v[S_DIM];
    s_row(i, name, sizeof name, v);
    kb_key_t k = {name, strlen(name)};
    return kb_cluster_put(c, "t", &k, 1, S_DIM, v, (uint64_t)i + 1);
}

/* Whether row i is on the server with its value and version (looked up without creating it). */
static bool s_has(kb_cluster_t *c, int i)
{
    char name[32];
    float want[S_DIM], got[S_DIM];
    s_row(i, name, sizeof name, want);
    kb_key_t k = {name, strlen(name)};
    kb_row_meta_t meta;
    assert_int_equal(kb_cluster_lookup_ex(c, "t", &k, 1, S_DIM, true, got, &meta), 0);
    return memcmp(got, want, sizeof want) == 0 && meta.version == (uint64_t)i + 1;
}

/* Waits up to 5 s for the follower to have rows 0..n-1. */
static void s_expect_rows(kb_cluster_t *c, int n)
{
    int64_t deadline = carls_monotonic_ms() + 5000;
    int missing = 0;
    do {
        missing = 0;
        for (int i = 0; i < n; i++)
            missing += !s_has(c, i);
        if (missing == 0)
            return;
        usleep(50 * 1000);
    } while (carls_monotonic_ms() < deadline);
    fail_msg("%d of %d rows missing or different after 5 s", missing, n);
}

static void s_start_primary(test_server_t *p, const char *min_replicas)
{
    const char *args[] = {"--min-replicas", min_replicas, NULL};
    assert_int_equal(test_server_start(p, args), 0);
}

static void s_start_follower(test_server_t *f, const char *primary)
{
    const char *args[] = {"--replica-of", primary, NULL};
    assert_int_equal(test_server_start(f, args), 0);
}

/* A primary with --min-replicas 1 and its follower, each with a fresh data directory. */
static void s_start_pair(test_server_t *p, test_server_t *f)
{
    test_server_init(p);
    test_server_init(f);
    s_start_primary(p, "1");
    s_start_follower(f, p->endpoint);
}

static void test_follower_applies_serves_and_refuses_writes(void **state)
{
    (void)state;
    test_server_t p, f;
    s_start_pair(&p, &f);
    s_expect_role(p.endpoint, "primary", 1);

    kb_cluster_t *cp = s_client(p.endpoint, 10000), *cf = s_client(f.endpoint, 10000);
    s_create_table(cp);
    for (int i = 0; i < 300; i++)
        assert_int_equal(s_put(cp, i), 0);
    /* Acknowledged with --min-replicas 1: the follower has applied each one already. */
    for (int i = 0; i < 300; i++)
        assert_true(s_has(cf, i));
    s_expect_role(f.endpoint, "follower", 1);
    Carls__Response *st = s_status(p.endpoint);
    assert_int_equal(st->replica->n_followers, 1);
    assert_true(st->replica->followers[0]->live);
    assert_true(st->replica->followers[0]->acked_epoch >= st->replica->durable_epoch);
    assert_true(st->replica->replication_endpoint[0] != '\0');
    carls__response__free_unpacked(st, NULL);

    /* A write to the follower: NOT_PRIMARY naming the primary, and nothing changed. */
    assert_int_not_equal(s_put(cf, 1000), 0);
    raw_client_t rc;
    assert_int_equal(raw_open(&rc, f.endpoint), 0);
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Put put = CARLS__PUT__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 5;
    req.client_id = 77;
    req.sequence = 1;
    req.table = "t";
    req.op_case = CARLS__REQUEST__OP_PUT;
    req.put = &put;
    Carls__Response *r = raw_call(&rc, &req, 5000);
    assert_non_null(r);
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_NOT_PRIMARY);
    assert_string_equal(r->primary, p.endpoint);
    assert_int_equal(r->term, 1);
    carls__response__free_unpacked(r, NULL);
    raw_close(&rc);
    assert_false(s_has(cp, 1000));
    /* Lookups on the follower create nothing. */
    assert_false(s_has(cf, 2000));

    /* The follower killed, writes go on (--min-replicas 1 makes them wait: a second follower-less write is not
     * acknowledged), and the restarted follower catches up from the primary's memory. */
    assert_int_equal(test_server_stop(&f, SIGKILL), 128 + SIGKILL);
    kb_cluster_destroy(&cf);
    Carls__Response *k0 = s_replica(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_SET_MIN_REPLICAS, 0);
    assert_int_equal(k0->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_int_equal(k0->replica->min_replicas, 0);
    carls__response__free_unpacked(k0, NULL);
    for (int i = 300; i < 400; i++)
        assert_int_equal(s_put(cp, i), 0);
    s_start_follower(&f, p.endpoint);
    cf = s_client(f.endpoint, 10000);
    s_expect_rows(cf, 400);

    /* Stopped cleanly and started without --replica-of, a member that replicated is a standby. */
    kb_cluster_destroy(&cp);
    assert_int_equal(test_server_stop(&p, SIGTERM), 0);
    assert_int_equal(test_server_start(&p, NULL), 0);
    s_expect_role(p.endpoint, "standby", 1);
    cp = s_client(p.endpoint, 10000);
    assert_int_not_equal(s_put(cp, 5000), 0);
    Carls__Response *bad = s_replica(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 1);
    assert_int_equal(bad->status, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT); /* term 1 is not newer */
    carls__response__free_unpacked(bad, NULL);
    Carls__Response *ok = s_replica(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2);
    assert_int_equal(ok->status, CARLS__STATUS_CODE__STATUS_OK);
    carls__response__free_unpacked(ok, NULL);
    s_expect_role(p.endpoint, "primary", 2);
    assert_int_equal(s_put(cp, 5000), 0);
    s_expect_rows(cp, 400);
    /* Fenced with a newer term, it takes no more writes. */
    Carls__Response *fence = s_replica(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_FENCE, 3);
    assert_int_equal(fence->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_true(fence->replica->fenced);
    carls__response__free_unpacked(fence, NULL);
    assert_int_not_equal(s_put(cp, 5001), 0);
    assert_false(s_has(cp, 5001));

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

static void test_kill9_primary_promote_follower_keeps_every_acknowledged_write(void **state)
{
    (void)state;
    test_server_t p, f;
    s_start_pair(&p, &f);
    kb_cluster_t *cp = s_client(p.endpoint, 2000);
    s_create_table(cp);

    s_killer_t killer = {.victim = &p, .seed = (unsigned)getpid()};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, s_killer_main, &killer), 0);
    int acked = 0;
    while (s_put(cp, acked) == 0)
        acked++;
    pthread_join(thread, NULL);
    assert_true(atomic_load(&killer.killed));
    kb_cluster_destroy(&cp);
    assert_true(acked > 10);

    /* The coordinator's part: the primary is known dead; promote the follower with a newer term. */
    Carls__Response *r = s_replica(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2);
    if (r->status != CARLS__STATUS_CODE__STATUS_OK)
        fail_msg("promote: %s", r->error);
    carls__response__free_unpacked(r, NULL);
    kb_cluster_t *cf = s_client(f.endpoint, 10000);
    for (int i = 0; i < acked; i++)
        if (!s_has(cf, i))
            fail_msg("acknowledged write %d of %d is not on the promoted follower", i, acked);
    assert_int_equal(s_put(cf, acked + 1), 0);

    /* The old primary comes back as a follower of the new one: it catches up, unless it kept a round the
     * follower never got (the write in flight when it died), which makes it diverged and refused. */
    s_start_follower(&p, f.endpoint);
    kb_cluster_t *cp2 = s_client(p.endpoint, 10000);
    int64_t deadline = carls_monotonic_ms() + 5000;
    bool caught_up = false;
    while (!caught_up && carls_monotonic_ms() < deadline) {
        caught_up = s_has(cp2, acked + 1);
        if (!caught_up)
            usleep(50 * 1000);
    }
    if (!caught_up) {
        char log[8192] = "";
        FILE *lf = fopen(p.log_file, "r");
        assert_non_null(lf);
        size_t n = fread(log, 1, sizeof log - 1, lf);
        log[n] = '\0';
        fclose(lf);
        if (!strstr(log, "refused this follower") || !strstr(log, "seed it from a snapshot"))
            fail_msg("the old primary neither caught up nor was refused as diverged:\n%s", log);
        s_expect_role(p.endpoint, "follower", 1);
    } else {
        for (int i = 0; i < acked; i++)
            assert_true(s_has(cp2, i));
        s_expect_role(p.endpoint, "follower", 2);
    }
    kb_cluster_destroy(&cp2);
    kb_cluster_destroy(&cf);
    assert_int_equal(test_server_cleanup(&p), 0);
    assert_int_equal(test_server_cleanup(&f), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follower_applies_serves_and_refuses_writes),
        cmocka_unit_test(test_kill9_primary_promote_follower_keeps_every_acknowledged_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
