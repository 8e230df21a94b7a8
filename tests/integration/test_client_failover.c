/* Integration: client failover between the members of a replicated shard (kb_client.h, docs/REPLICATION.md
 * section 4) with real kb-server processes on loopback.
 *
 * A primary (--min-replicas 1) and its follower; a writer puts rows through one kb_cluster over "P|F". The
 * primary is killed with SIGKILL and, a moment later, the follower promoted to term 2 (as the coordinator
 * would, with the replica op): the writer goes on without an error returned to it (at most the one write in
 * flight at the kill, which must then succeed when written again), and every acknowledged put is on the new
 * primary. Then a fenced primary that is still alive: its refusal moves the client to the member promoted
 * in its place. */
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

/* The replica op (action, term, min_replicas) to endpoint; fails the test unless it is answered OK. */
static void s_replica_ok(const char *endpoint, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas)
{
    raw_client_t rc;
    assert_int_equal(raw_open(&rc, endpoint), 0);
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Replica op = CARLS__REPLICA__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 42;
    op.action = action;
    op.term = term;
    op.min_replicas = min_replicas;
    req.op_case = CARLS__REQUEST__OP_REPLICA;
    req.replica = &op;
    Carls__Response *r = raw_call(&rc, &req, 10000);
    raw_close(&rc);
    assert_non_null(r);
    if (r->status != CARLS__STATUS_CODE__STATUS_OK)
        fail_msg("replica op %d on %s (term %llu): %s", (int)action, endpoint, (unsigned long long)term, r->error);
    carls__response__free_unpacked(r, NULL);
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

/* Row i is on the server behind c with its value and version (looked up without creating it). */
static bool s_has(kb_cluster_t *c, int i)
{
    char name[32];
    float want[S_DIM], got[S_DIM];
    s_row(i, name, sizeof name, want);
    kb_key_t k = {name, strlen(name)};
    kb_row_meta_t meta;
    if (kb_cluster_lookup_ex(c, "t", &k, 1, S_DIM, true, got, &meta) != 0)
        fail_msg("lookup of row %d: %s", i, kb_cluster_last_error(c));
    return memcmp(got, want, sizeof want) == 0 && meta.version == (uint64_t)i + 1;
}

/* A primary with --min-replicas 1 and its follower, each with a fresh data directory. */
static void s_start_pair(test_server_t *p, test_server_t *f)
{
    test_server_init(p);
    test_server_init(f);
    const char *pargs[] = {"--min-replicas", "1", NULL};
    assert_int_equal(test_server_start(p, pargs), 0);
    const char *fargs[] = {"--replica-of", p->endpoint, NULL};
    assert_int_equal(test_server_start(f, fargs), 0);
}

/* A cluster of one shard whose members are a and b, with the default options. */
static kb_cluster_t *s_shard(const char *a, const char *b)
{
    char list[600];
    snprintf(list, sizeof list, "%s|%s", a, b);
    kb_cluster_t *c = kb_cluster_new(list, NULL);
    assert_non_null(c);
    return c;
}

/* The writer: puts rows 0, 1, 2, ... until told to stop. A failed put is counted and written again once. */
typedef struct {
    kb_cluster_t *c;
    atomic_bool stop;
    atomic_int acked;      /* rows 0..acked-1 were acknowledged */
    int errors;
    char first_error[512];
    int failed_again;      /* a failed put whose second try failed too */
} s_writer_t;

static void *s_writer_main(void *arg)
{
    s_writer_t *w = arg;
    for (int i = 0; !atomic_load(&w->stop); i++) {
        if (s_put(w->c, i) != 0) {
            if (w->errors++ == 0)
                snprintf(w->first_error, sizeof w->first_error, "%s", kb_cluster_last_error(w->c));
            if (s_put(w->c, i) != 0) {
                w->failed_again = i;
                break;
            }
        }
        atomic_store(&w->acked, i + 1);
    }
    return NULL;
}

/* Waits up to 20 s until the writer has more than n rows acknowledged. */
static void s_wait_acked(s_writer_t *w, int n)
{
    int64_t deadline = carls_monotonic_ms() + 20000;
    while (atomic_load(&w->acked) <= n && carls_monotonic_ms() < deadline)
        usleep(10 * 1000);
    if (atomic_load(&w->acked) <= n)
        fail_msg("the writer acknowledged nothing past row %d in 20 s (errors %d: %s)", n, w->errors,
                 w->first_error);
}

static void test_kill9_of_the_primary_is_invisible_to_the_writer(void **state)
{
    (void)state;
    test_server_t p, f;
    s_start_pair(&p, &f);
    s_writer_t w = {.c = s_shard(p.endpoint, f.endpoint), .failed_again = -1};
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = S_DIM;
    cfg.init = CARLS__INIT_KIND__INIT_ZEROS;
    assert_int_equal(kb_cluster_create_table(w.c, "t", &cfg, false), 0);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, s_writer_main, &w), 0);

    s_wait_acked(&w, 200);
    assert_int_equal(test_server_stop(&p, SIGKILL), 128 + SIGKILL);
    int at_kill = atomic_load(&w.acked);
    /* The coordinator takes its time: the writer must wait through it. */
    usleep(1500 * 1000);
    int64_t promoted_ms = carls_monotonic_ms();
    s_replica_ok(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2, 0);
    int64_t promote_ms = carls_monotonic_ms() - promoted_ms;
    s_wait_acked(&w, at_kill + 1); /* at most the write in flight at the kill was acknowledged by then */
    int64_t resumed_ms = carls_monotonic_ms() - promoted_ms;
    s_wait_acked(&w, at_kill + 200);
    atomic_store(&w.stop, true);
    assert_int_equal(pthread_join(thread, NULL), 0);
    if (w.failed_again >= 0)
        fail_msg("put %d failed twice: %s", w.failed_again, kb_cluster_last_error(w.c));
    if (w.errors > 1)
        fail_msg("%d puts failed (the first: %s)", w.errors, w.first_error);
    int acked = atomic_load(&w.acked);
    kb_cluster_destroy(&w.c);

    /* Every acknowledged put is on the new primary. */
    kb_cluster_t *cf = kb_cluster_new(f.endpoint, NULL);
    assert_non_null(cf);
    for (int i = 0; i < acked; i++)
        if (!s_has(cf, i))
            fail_msg("acknowledged put %d of %d is not on the promoted follower", i, acked);
    kb_cluster_destroy(&cf);
    print_message("%d puts acknowledged (%d before the kill), %d failed once; promoted 1.5 s after the kill, "
                  "the writer went on within %lld ms of the promotion (of which the promote op took %lld ms)\n", acked,
                  at_kill, w.errors, (long long)resumed_ms, (long long)promote_ms);
    /* An attempt at a dead member lasts 1 s, so the writer sees the new primary within about that. */
    assert_true(resumed_ms < 3000);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

/* A primary that is alive but fenced refuses writes (NOT_PRIMARY); the client leaves it for the member
 * promoted in its place. */
static void test_fenced_primary_sends_the_client_on(void **state)
{
    (void)state;
    test_server_t p, f;
    s_start_pair(&p, &f);
    kb_cluster_t *c = s_shard(p.endpoint, f.endpoint);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = S_DIM;
    cfg.init = CARLS__INIT_KIND__INIT_ZEROS;
    assert_int_equal(kb_cluster_create_table(c, "t", &cfg, false), 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(s_put(c, i), 0);
    s_replica_ok(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_FENCE, 2, 0);
    s_replica_ok(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2, 0);
    for (int i = 50; i < 100; i++)
        if (s_put(c, i) != 0)
            fail_msg("put %d after the fence: %s", i, kb_cluster_last_error(c));
    kb_cluster_destroy(&c);
    kb_cluster_t *cf = kb_cluster_new(f.endpoint, NULL);
    assert_non_null(cf);
    for (int i = 0; i < 100; i++)
        assert_true(s_has(cf, i));
    kb_cluster_destroy(&cf);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_of_the_primary_is_invisible_to_the_writer),
        cmocka_unit_test(test_fenced_primary_sends_the_client_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
