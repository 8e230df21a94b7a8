/* Integration: a kb_cluster reading from followers (kb_cluster_set_read_replicas, docs/REPLICATION.md section
 * 5) with real kb-server processes on loopback: a primary (--min-replicas 1) and its follower, one cluster over
 * "P|F" with a staleness bound of 1 s.
 *   - a caught-up follower serves lookups (no_create) and scans, and the answers are the primary's rows;
 *   - the follower stopped (SIGSTOP): a read falls back to the primary after one short attempt;
 *   - the primary stopped: the follower, caught up moments ago, still serves at once; past the bound it says
 *     STALE, and with the primary silent the read fails with STALE rather than answer staler data;
 *   - the primary back: the follower serves again. */
#include "kb_cluster.h"
#include "replica_testlib.h"
#include "server_harness.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

#define S_ROWS 50
#define S_BOUND_MS 1000

/* Reads a follower served and reads that fell back since *served / *fell_back, which are updated. */
static void s_delta(kb_cluster_t *c, uint64_t *served, uint64_t *fell_back, uint64_t *d_served, uint64_t *d_fell)
{
    uint64_t s, f;
    kb_cluster_replica_reads(c, &s, &f);
    *d_served = s - *served;
    *d_fell = f - *fell_back;
    *served = s;
    *fell_back = f;
}

/* Waits up to 5 s for a read of row 0 that the follower serves. */
static void s_wait_follower_serves(kb_cluster_t *c, uint64_t *served, uint64_t *fell_back)
{
    uint64_t ds = 0, df = 0;
    for (int64_t until = carls_monotonic_ms() + 5000; carls_monotonic_ms() < until;) {
        int rc = repl_lookup_row(c, 0);
        s_delta(c, served, fell_back, &ds, &df);
        if (rc == 1 && ds == 1)
            return;
        usleep(50 * 1000);
    }
    fail_msg("the follower served no read in 5 s");
}

static void test_cluster_reads_from_followers(void **state)
{
    (void)state;
    test_server_t p, f;
    repl_start_pair(&p, &f, "1", NULL, NULL);
    char members[600];
    snprintf(members, sizeof members, "%s|%s", p.endpoint, f.endpoint);
    kb_cluster_t *c = repl_client(members, 3000);
    repl_create_table(c);
    for (int i = 0; i < S_ROWS; i++)
        assert_int_equal(repl_put(c, i), 0);
    assert_int_equal(kb_cluster_set_read_replicas(c, S_BOUND_MS), 0);
    uint64_t served = 0, fell_back = 0, ds = 0, df = 0;
    s_wait_follower_serves(c, &served, &fell_back);

    /* Caught up: the follower answers every read, with the primary's rows. */
    for (int i = 0; i < S_ROWS; i++)
        assert_true(repl_has(c, i));
    Carls__Response *page = NULL;
    assert_int_equal(kb_cluster_scan(c, 0, "t", 0, 1000, &page), 0);
    assert_int_equal(page->scan->n_keys, S_ROWS);
    carls__response__free_unpacked(page, NULL);
    s_delta(c, &served, &fell_back, &ds, &df);
    assert_int_equal(ds, S_ROWS + 1);
    assert_int_equal(df, 0);
    /* Writes still go to the primary (and lookups that may create rows). */
    assert_int_equal(repl_put(c, S_ROWS), 0);
    s_delta(c, &served, &fell_back, &ds, &df);
    assert_int_equal(ds + df, 0);

    /* The follower stopped: one short attempt, then the primary answers. */
    assert_int_equal(kill(f.pid, SIGSTOP), 0);
    assert_true(repl_has(c, 1));
    s_delta(c, &served, &fell_back, &ds, &df);
    assert_int_equal(df, 1);
    assert_int_equal(kill(f.pid, SIGCONT), 0);
    s_wait_follower_serves(c, &served, &fell_back);

    /* The primary stopped: within the bound the follower serves at once; past it, STALE. */
    assert_int_equal(kill(p.pid, SIGSTOP), 0);
    assert_true(repl_has(c, 2));
    s_delta(c, &served, &fell_back, &ds, &df);
    assert_int_equal(ds, 1);
    usleep((S_BOUND_MS + 500) * 1000);
    assert_int_equal(repl_lookup_row(c, 3), -1);
    if (kb_cluster_last_status(c) != CARLS__STATUS_CODE__STATUS_STALE)
        fail_msg("a read past the bound with the primary stopped: %s (expected STALE)", kb_cluster_last_error(c));
    s_delta(c, &served, &fell_back, &ds, &df);
    assert_int_equal(df, 1);
    assert_int_equal(kill(p.pid, SIGCONT), 0);
    /* The shard's client went to the follower meanwhile; a write brings it back to the primary (NOT_PRIMARY),
     * so reads go to the follower again. */
    assert_int_equal(repl_put(c, S_ROWS + 1), 0);
    s_wait_follower_serves(c, &served, &fell_back);
    print_message("%llu reads served by the follower, %llu fell back\n", (unsigned long long)served,
                  (unsigned long long)fell_back);

    /* Off again: every read to the shard's own client. */
    assert_int_equal(kb_cluster_set_read_replicas(c, 0), 0);
    assert_true(repl_has(c, 4));
    s_delta(c, &served, &fell_back, &ds, &df);
    assert_int_equal(ds + df, 0);
    kb_cluster_destroy(&c);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_cluster_reads_from_followers))
