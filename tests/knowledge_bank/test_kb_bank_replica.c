/* Unit tests for a bank's replication half (kb_bank.h, kb_commit.h, docs/REPLICATION.md): two real banks in
 * one process, the primary's ship hook applying every round to the follower with kb_commit_apply_replicated.
 * The follower ends with the same rows (row ids, values, optimizer state, pending gradients) and
 * de-duplication records, refuses an epoch it has, survives a restart with what it applied, and once promoted
 * takes writes in the epochs after the last one applied. With --min-replicas a write is durable only once a
 * follower applied it, and a fenced bank answers waiting writes at once. The transport and the server are in
 * tests/integration/test_replication.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bank_testlib.h"
#include "kb_bank.h"
#include "kb_table_config.h"
#include "test_util.h"
#include "util.h"

static kb_bank_t *s_open(const char *data, bool replica, uint32_t min_replicas)
{
    kb_bank_options_t opts = {.data_dir = data, .sync = true, .replica = replica, .min_replicas = min_replicas};
    return bt_open_bank(&opts);
}

/* What the primary's ship hook does here: applies the round to the follower at once. */
typedef struct {
    kb_bank_t *follower;
    int rounds, records, errors;
    uint64_t last_epoch;
    char err[512];
} s_link_t;

static void s_ship(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc, bool rejournal)
{
    (void)rejournal;
    s_link_t *link = ctx;
    if (epoch <= link->last_epoch)
        link->errors++; /* rounds come in epoch order */
    link->last_epoch = epoch;
    link->rounds++;
    link->records += len > 0;
    if (kb_commit_apply_replicated(kb_bank_commit(link->follower), epoch, payload, len, crc, link->err,
                                   sizeof link->err) != 0)
        link->errors++;
}

/* Puts keys first..first+n-1 of table t (value i + j/10), pushes one gradient to every third, as client
 * `client` write `seq`; returns the write's ticket. */
static uint64_t s_write(kb_bank_t *bank, int first, int n, uint64_t client, uint64_t seq)
{
    kb_table_t *t = kb_bank_acquire(bank, "t");
    assert_non_null(t);
    char names[64][16];
    ProtobufCBinaryData keys[64];
    float values[64 * 4];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "k%d", first + i);
        keys[i].data = (uint8_t *)names[i];
        keys[i].len = strlen(names[i]);
        for (int j = 0; j < 4; j++)
            values[i * 4 + j] = (float)(first + i) + (float)j / 10.0f;
    }
    kb_commit_t *commit = kb_bank_commit(bank);
    kb_commit_write_begin(commit);
    assert_false(kb_commit_seen_write(commit, client, seq));
    kb_table_put(t, keys, (size_t)n, values, 1);
    for (int i = 0; i < n; i += 3)
        kb_table_push(t, &keys[i], 1, &values[i * 4]);
    uint64_t ticket = kb_commit_write_end(commit);
    kb_bank_release(bank, t);
    return ticket;
}

/* Table t's rows, their whole state, as scan reads them. */
static size_t s_scan(kb_bank_t *bank, kb_store_row_t **rows)
{
    kb_table_t *t = kb_bank_acquire(bank, "t");
    assert_non_null(t);
    bool done = false;
    size_t n = kb_table_scan(t, 0, 100000, rows, &done);
    assert_true(done);
    kb_bank_release(bank, t);
    return n;
}

static void s_rows_free(kb_store_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kb_store_row_free(&rows[i]);
    free(rows);
}

static void s_expect_same_rows(kb_bank_t *a, kb_bank_t *b, size_t expect)
{
    kb_store_row_t *ra = NULL, *rb = NULL;
    size_t na = s_scan(a, &ra), nb = s_scan(b, &rb);
    assert_int_equal(na, expect);
    assert_int_equal(nb, expect);
    size_t pending = 0;
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(ra[i].row_id, rb[i].row_id);
        assert_int_equal(ra[i].key_len, rb[i].key_len);
        assert_memory_equal(ra[i].key, rb[i].key, ra[i].key_len);
        assert_memory_equal(ra[i].value, rb[i].value, 4 * sizeof(float));
        assert_int_equal(ra[i].version, rb[i].version);
        assert_int_equal(ra[i].pending_count, rb[i].pending_count);
        if (ra[i].pending_count)
            assert_memory_equal(ra[i].pending, rb[i].pending, ra[i].pending_count * 4 * sizeof(float));
        pending += ra[i].pending_count;
    }
    assert_true(pending > 0); /* the pending sets travelled too */
    s_rows_free(ra, na);
    s_rows_free(rb, nb);
}

static void test_follower_applies_every_round(void **state)
{
    (void)state;
    char pdir[300], fdir[300], err[512];
    snprintf(pdir, sizeof pdir, "%s/primary", test_scratch_dir);
    snprintf(fdir, sizeof fdir, "%s/follower", test_scratch_dir);
    kb_bank_t *follower = s_open(fdir, true, 0);
    assert_true(kb_commit_is_replica(kb_bank_commit(follower)));
    kb_bank_t *primary = s_open(pdir, false, 0);
    s_link_t link = {.follower = follower};
    kb_commit_set_ship_hook(kb_bank_commit(primary), s_ship, &link);
    bt_create_table(primary, "t", 4);
    uint64_t ticket = 0;
    for (int w = 0; w < 5; w++)
        ticket = s_write(primary, w * 40, 40, 7, (uint64_t)w + 1);
    assert_int_equal(kb_commit_wait_durable(kb_bank_commit(primary), ticket, 10000, err, sizeof err), 0);
    if (link.errors)
        fail_msg("%d rounds not applied: %s", link.errors, link.err);
    assert_true(link.records >= 2);
    assert_true(kb_commit_committed_epoch(kb_bank_commit(follower)) >= ticket);
    s_expect_same_rows(primary, follower, 200);

    /* An epoch the follower has is refused, and so is a record whose CRC does not match. */
    kb_commit_t *fc = kb_bank_commit(follower);
    uint64_t applied = kb_commit_committed_epoch(fc);
    assert_int_not_equal(kb_commit_apply_replicated(fc, applied, NULL, 0, 0, err, sizeof err), 0);
    assert_non_null(strstr(err, "applied already"));
    uint8_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_not_equal(kb_commit_apply_replicated(fc, applied + 1, junk, sizeof junk, 0, err, sizeof err), 0);
    assert_non_null(strstr(err, "CRC"));
    /* A follower takes no checkpoint: its commits are its primary's. */
    uint64_t epoch;
    assert_int_not_equal(kb_commit_checkpoint(kb_bank_commit(follower), &epoch, err, sizeof err), 0);
    assert_non_null(strstr(err, "follower"));

    kb_commit_set_ship_hook(kb_bank_commit(primary), NULL, NULL);
    kb_bank_close(&primary);
    /* Restarted, the follower holds what it applied (its journal and SQLite are its own). */
    kb_bank_close(&follower);
    follower = s_open(fdir, true, 0);
    /* Its newest record at least: empty rounds after it leave no record, and are sent again. */
    assert_true(kb_commit_committed_epoch(kb_bank_commit(follower)) <= applied);
    assert_true(kb_commit_committed_epoch(kb_bank_commit(follower)) >= ticket);
    primary = s_open(pdir, false, 0);
    s_expect_same_rows(primary, follower, 200);
    kb_bank_close(&primary);

    /* Promoted, it takes writes in the epochs after the last one applied, and knows the primary's clients. */
    assert_int_equal(kb_commit_promote(kb_bank_commit(follower), err, sizeof err), 0);
    assert_false(kb_commit_is_replica(kb_bank_commit(follower)));
    assert_int_not_equal(kb_commit_promote(kb_bank_commit(follower), err, sizeof err), 0);
    kb_commit_write_begin(kb_bank_commit(follower));
    assert_true(kb_commit_seen_write(kb_bank_commit(follower), 7, 3)); /* applied on the old primary: not again */
    kb_commit_write_end(kb_bank_commit(follower));
    ticket = s_write(follower, 200, 10, 7, 6);
    assert_true(ticket > applied);
    assert_int_equal(kb_commit_wait_durable(kb_bank_commit(follower), ticket, 10000, err, sizeof err), 0);
    kb_bank_close(&follower);
    follower = s_open(fdir, false, 0);
    kb_store_row_t *rows = NULL;
    size_t n = s_scan(follower, &rows);
    assert_int_equal(n, 210);
    s_rows_free(rows, n);
    kb_bank_close(&follower);
}

static void test_min_replicas_and_fence(void **state)
{
    (void)state;
    char dir[300], err[512];
    snprintf(dir, sizeof dir, "%s/k1", test_scratch_dir);
    kb_bank_t *bank = s_open(dir, false, 1);
    kb_commit_t *commit = kb_bank_commit(bank);
    assert_int_equal(kb_commit_min_replicas(commit), 1);
    kb_table_config_t cfg;
    Carls__TableConfig pc = CARLS__TABLE_CONFIG__INIT;
    pc.dim = 4;
    assert_int_equal(kb_table_config_from_proto(&pc, 4096, &cfg, err, sizeof err), 0);
    kb_commit_write_begin(commit);
    assert_int_equal(kb_bank_create_table(bank, "t", &cfg, false), KB_BANK_OK);
    uint64_t ticket = kb_commit_write_end(commit);
    /* Committed here, but no follower applied it: not durable. */
    assert_int_not_equal(kb_commit_wait_durable(commit, ticket, 300, err, sizeof err), 0);
    assert_non_null(strstr(err, "min-replicas"));
    assert_true(kb_commit_committed_epoch(commit) >= ticket);
    assert_true(kb_commit_durable_epoch(commit) < ticket);
    kb_commit_set_replicated(commit, ticket);
    assert_int_equal(kb_commit_wait_durable(commit, ticket, 300, err, sizeof err), 0);
    assert_true(kb_commit_durable_epoch(commit) >= ticket);

    /* Fenced: refused at once, not at the timeout. */
    ticket = s_write(bank, 0, 4, 9, 1);
    assert_false(kb_commit_broken(commit));
    kb_commit_fence(commit, "deposed by term 2");
    assert_true(kb_commit_fenced(commit));
    assert_true(kb_commit_broken(commit));
    int64_t t0 = carls_monotonic_ms();
    assert_int_not_equal(kb_commit_wait_durable(commit, ticket, 20000, err, sizeof err), 0);
    assert_true(carls_monotonic_ms() - t0 < 10000);
    assert_non_null(strstr(err, "deposed by term 2"));
    kb_bank_close(&bank);
}

CARLS_TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_follower_applies_every_round, test_scratch_setup, test_scratch_teardown),
    cmocka_unit_test_setup_teardown(test_min_replicas_and_fence, test_scratch_setup, test_scratch_teardown))
