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
#include "replica_testlib.h"
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
#include "test_main.h"

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
        if (repl_put(w->c, i) != 0) {
            if (w->errors++ == 0)
                snprintf(w->first_error, sizeof w->first_error, "%s", kb_cluster_last_error(w->c));
            if (repl_put(w->c, i) != 0) {
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
    repl_start_pair(&p, &f, "1", NULL, NULL);
    s_writer_t w = {.c = s_shard(p.endpoint, f.endpoint), .failed_again = -1};
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = REPL_DIM;
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
    repl_op_ok(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2, 0);
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
        if (!repl_has(cf, i))
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
    repl_start_pair(&p, &f, "1", NULL, NULL);
    kb_cluster_t *c = s_shard(p.endpoint, f.endpoint);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = REPL_DIM;
    cfg.init = CARLS__INIT_KIND__INIT_ZEROS;
    assert_int_equal(kb_cluster_create_table(c, "t", &cfg, false), 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(repl_put(c, i), 0);
    repl_op_ok(p.endpoint, CARLS__REPLICA_ACTION__REPLICA_FENCE, 2, 0);
    repl_op_ok(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2, 0);
    for (int i = 50; i < 100; i++)
        if (repl_put(c, i) != 0)
            fail_msg("put %d after the fence: %s", i, kb_cluster_last_error(c));
    kb_cluster_destroy(&c);
    kb_cluster_t *cf = kb_cluster_new(f.endpoint, NULL);
    assert_non_null(cf);
    for (int i = 0; i < 100; i++)
        assert_true(repl_has(cf, i));
    kb_cluster_destroy(&cf);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_kill9_of_the_primary_is_invisible_to_the_writer),
    cmocka_unit_test(test_fenced_primary_sends_the_client_on))
