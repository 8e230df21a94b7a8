/* Unit tests for kb_dedup: exactly-once bookkeeping of (client_id, sequence) pairs, out-of-order arrival
 * inside the window, sequences that fall out of the window, forget() for failed writes, many clients, the
 * dirty set handed to the persister and the restore of persisted records. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kb_dedup.h"
#include "test_util.h"

static void s_shuffle(uint64_t *v, size_t n, uint64_t *rng)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(test_xorshift64(rng) % i);
        uint64_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

static void test_first_and_repeat(void **st)
{
    (void)st;
    kb_dedup_t *d = kb_dedup_new();
    assert_int_equal(kb_dedup_client_count(d), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 5), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 5), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 5), 1);
    /* Same sequence from another client is a different write. */
    assert_int_equal(kb_dedup_check_and_record(d, 2, 5), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 2, 5), 1);
    /* Neighbouring sequences are new. */
    assert_int_equal(kb_dedup_check_and_record(d, 1, 4), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 6), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 4), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 6), 1);
    assert_int_equal(kb_dedup_client_count(d), 2);
    kb_dedup_destroy(&d);
    assert_null(d);
    kb_dedup_destroy(&d); /* NULL is accepted */
}

/* Many writes in flight arrive in any order: each is applied exactly once. */
static void test_out_of_order_within_window(void **st)
{
    (void)st;
    enum { N = 1000 }; /* fewer than the window, so every one of them stays inside it */
    kb_dedup_t *d = kb_dedup_new();
    uint64_t seqs[N];
    for (size_t i = 0; i < N; i++)
        seqs[i] = 100 + i;
    uint64_t rng = 7;
    s_shuffle(seqs, N, &rng);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(kb_dedup_check_and_record(d, 9, seqs[i]), 0);
    s_shuffle(seqs, N, &rng);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(kb_dedup_check_and_record(d, 9, seqs[i]), 1);
    /* Gaps left inside the window are still new. */
    assert_int_equal(kb_dedup_check_and_record(d, 9, 99), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 9, 99), 1);
    kb_dedup_destroy(&d);
}

/* Records made before the maximum moved forward are still known after it moved (the window slides). */
static void test_window_slides(void **st)
{
    (void)st;
    kb_dedup_t *d = kb_dedup_new();
    assert_int_equal(kb_dedup_check_and_record(d, 3, 10), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 12), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 10), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 11), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 11), 1);
    /* Jump ahead, but keep 10..12 inside the window. */
    uint64_t max = 12 + KB_DEDUP_WINDOW - 100;
    assert_int_equal(kb_dedup_check_and_record(d, 3, max), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 10), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 11), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 12), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 13), 0); /* never seen, still in the window */
    assert_int_equal(kb_dedup_check_and_record(d, 3, max), 1);
    /* Several small steps forward: earlier records shift along. */
    for (uint64_t s = max + 1; s <= max + 20; s++)
        assert_int_equal(kb_dedup_check_and_record(d, 3, s), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 13), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 3, max + 7), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 14), 0);
    kb_dedup_destroy(&d);
}

/* A sequence more than KB_DEDUP_WINDOW below the maximum is treated as a duplicate, even if it was never
 * seen: a client never has that many writes in flight. */
static void test_older_than_window_is_duplicate(void **st)
{
    (void)st;
    kb_dedup_t *d = kb_dedup_new();
    uint64_t max = 5u * KB_DEDUP_WINDOW;
    assert_int_equal(kb_dedup_check_and_record(d, 4, max), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 4, max - KB_DEDUP_WINDOW - 1), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 4, max - 3u * KB_DEDUP_WINDOW), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 4, 1), 1);
    /* Just inside the window: new, once. */
    assert_int_equal(kb_dedup_check_and_record(d, 4, max - (KB_DEDUP_WINDOW - 1)), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 4, max - (KB_DEDUP_WINDOW - 1)), 1);
    /* A jump by more than the window forgets everything below: the old records are duplicates by age. */
    assert_int_equal(kb_dedup_check_and_record(d, 4, max + 10u * KB_DEDUP_WINDOW), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 4, max), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 4, max + 10u * KB_DEDUP_WINDOW - 1), 0);
    kb_dedup_destroy(&d);
}

/* forget() takes back a record so the retry is applied; only that sequence is affected. */
static void test_forget(void **st)
{
    (void)st;
    kb_dedup_t *d = kb_dedup_new();
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(kb_dedup_check_and_record(d, 8, s), 0);
    kb_dedup_forget(d, 8, 7);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 6), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 8), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 7), 0); /* the retry applies */
    assert_int_equal(kb_dedup_check_and_record(d, 8, 7), 1); /* and only once */
    /* Forgetting the current maximum. */
    kb_dedup_forget(d, 8, 10);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 9), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 10), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 10), 1);
    /* Forgetting a sequence never recorded (above the maximum) records nothing. */
    kb_dedup_forget(d, 8, 50);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 50), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 8, 50), 1);
    /* Other clients are untouched. */
    assert_int_equal(kb_dedup_check_and_record(d, 9, 7), 0);
    kb_dedup_forget(d, 8, 7);
    assert_int_equal(kb_dedup_check_and_record(d, 9, 7), 1);
    kb_dedup_destroy(&d);
}

/* Thousands of clients (the client table grows several times), each with its own state. */
static void test_many_clients(void **st)
{
    (void)st;
    enum { C = 5000 };
    kb_dedup_t *d = kb_dedup_new();
    uint64_t rng = 11;
    uint64_t *ids = calloc(C, sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < C; i++) {
        ids[i] = test_xorshift64(&rng) | 1u; /* random 64-bit ids, nonzero */
        assert_int_equal(kb_dedup_check_and_record(d, ids[i], i + 1), 0);
    }
    assert_int_equal(kb_dedup_client_count(d), C);
    for (size_t i = 0; i < C; i++) {
        assert_int_equal(kb_dedup_check_and_record(d, ids[i], i + 1), 1);
        assert_int_equal(kb_dedup_check_and_record(d, ids[i], i + 2), 0);
    }
    for (size_t i = 0; i < C; i++)
        assert_int_equal(kb_dedup_check_and_record(d, ids[i], i + 2), 1);
    /* Sequential ids as well (a different hash pattern). */
    for (uint64_t c = 1; c <= C; c++)
        assert_int_equal(kb_dedup_check_and_record(d, c, 1), 0);
    for (uint64_t c = 1; c <= C; c++)
        assert_int_equal(kb_dedup_check_and_record(d, c, 1), 1);
    assert_int_equal(kb_dedup_client_count(d), 2 * C);
    free(ids);
    kb_dedup_destroy(&d);
}

static int s_has_client(const kb_dedup_record_t *recs, size_t n, uint64_t client_id)
{
    int found = 0;
    for (size_t i = 0; i < n; i++)
        if (recs[i].client_id == client_id)
            found++;
    return found;
}

/* take_dirty returns exactly the clients changed since the last call, each once, then nothing. */
static void test_take_dirty(void **st)
{
    (void)st;
    kb_dedup_t *d = kb_dedup_new();
    kb_dedup_record_t *recs = NULL;
    size_t cap = 0;
    assert_int_equal(kb_dedup_take_dirty(d, &recs, &cap), 0);

    assert_int_equal(kb_dedup_check_and_record(d, 1, 10), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 2, 20), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 2, 21), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 3, 30), 0);
    size_t n = kb_dedup_take_dirty(d, &recs, &cap);
    assert_int_equal(n, 3);
    assert_true(cap >= n);
    for (uint64_t c = 1; c <= 3; c++)
        assert_int_equal(s_has_client(recs, n, c), 1);
    for (size_t i = 0; i < n; i++) {
        uint64_t want = recs[i].client_id == 1 ? 10 : recs[i].client_id == 2 ? 21 : 30;
        assert_int_equal(recs[i].max_seq, want);
    }
    assert_int_equal(kb_dedup_take_dirty(d, &recs, &cap), 0);

    /* A duplicate changes nothing. */
    assert_int_equal(kb_dedup_check_and_record(d, 1, 10), 1);
    assert_int_equal(kb_dedup_take_dirty(d, &recs, &cap), 0);

    /* An older sequence inside the window is a change though the maximum stays. */
    assert_int_equal(kb_dedup_check_and_record(d, 2, 15), 0);
    n = kb_dedup_take_dirty(d, &recs, &cap);
    assert_int_equal(n, 1);
    assert_int_equal(recs[0].client_id, 2);
    assert_int_equal(recs[0].max_seq, 21);

    /* forget is a change. */
    kb_dedup_forget(d, 3, 30);
    n = kb_dedup_take_dirty(d, &recs, &cap);
    assert_int_equal(n, 1);
    assert_int_equal(recs[0].client_id, 3);
    assert_int_equal(kb_dedup_take_dirty(d, &recs, &cap), 0);

    /* Many dirty clients at once: the output array grows. */
    for (uint64_t c = 100; c < 1100; c++)
        assert_int_equal(kb_dedup_check_and_record(d, c, 1), 0);
    assert_int_equal(kb_dedup_check_and_record(d, 1, 11), 0);
    n = kb_dedup_take_dirty(d, &recs, &cap);
    assert_int_equal(n, 1001);
    assert_int_equal(s_has_client(recs, n, 1), 1);
    for (uint64_t c = 100; c < 1100; c++)
        assert_int_equal(s_has_client(recs, n, c), 1);
    assert_int_equal(s_has_client(recs, n, 2), 0);
    assert_int_equal(kb_dedup_take_dirty(d, &recs, &cap), 0);
    free(recs);
    kb_dedup_destroy(&d);
}

/* A dedup restored from taken records answers every later query like the original. */
static void test_restore_round_trip(void **st)
{
    (void)st;
    enum { C = 40 };
    kb_dedup_t *a = kb_dedup_new();
    uint64_t rng = 99;
    uint64_t max[C + 1] = {0};
    for (int op = 0; op < 20000; op++) {
        uint64_t c = 1 + test_xorshift64(&rng) % C;
        /* Mostly near the current maximum, sometimes ahead of it, sometimes out of the window. */
        uint64_t base = max[c] + 1;
        uint64_t seq = base + test_xorshift64(&rng) % 8;
        if (test_xorshift64(&rng) % 3 == 0 && base > 2)
            seq = 1 + test_xorshift64(&rng) % (base - 1);
        (void)kb_dedup_check_and_record(a, c, seq);
        if (seq > max[c])
            max[c] = seq;
        if (test_xorshift64(&rng) % 50 == 0)
            kb_dedup_forget(a, c, seq);
    }
    kb_dedup_record_t *recs = NULL;
    size_t cap = 0;
    size_t n = kb_dedup_take_dirty(a, &recs, &cap);
    assert_int_equal(n, C);

    kb_dedup_t *b = kb_dedup_new();
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(max[recs[i].client_id], recs[i].max_seq);
        assert_int_equal(kb_dedup_restore(b, recs[i].client_id, recs[i].max_seq, recs[i].window,
                                          sizeof recs[i].window),
                         0);
    }
    assert_int_equal(kb_dedup_client_count(b), C);
    /* Query both with the same stream: every answer agrees (including the records each query makes). */
    for (int op = 0; op < 20000; op++) {
        uint64_t c = 1 + test_xorshift64(&rng) % C;
        uint64_t lo = max[c] > 2 * KB_DEDUP_WINDOW ? max[c] - 2 * KB_DEDUP_WINDOW : 1;
        uint64_t seq = lo + test_xorshift64(&rng) % (max[c] + 10 - lo);
        assert_int_equal(kb_dedup_check_and_record(b, c, seq), kb_dedup_check_and_record(a, c, seq));
    }
    free(recs);
    kb_dedup_destroy(&a);
    kb_dedup_destroy(&b);
}

/* A window of the wrong length is refused and creates no client. */
static void test_restore_wrong_length(void **st)
{
    (void)st;
    kb_dedup_t *d = kb_dedup_new();
    uint8_t window[KB_DEDUP_WINDOW_BYTES + 1];
    memset(window, 0xff, sizeof window);
    assert_int_equal(kb_dedup_restore(d, 5, 100, window, KB_DEDUP_WINDOW_BYTES - 1), -1);
    assert_int_equal(kb_dedup_restore(d, 5, 100, window, KB_DEDUP_WINDOW_BYTES + 1), -1);
    assert_int_equal(kb_dedup_restore(d, 5, 100, window, 0), -1);
    assert_int_equal(kb_dedup_client_count(d), 0);
    /* Nothing was restored: sequence 100 of client 5 is new. */
    assert_int_equal(kb_dedup_check_and_record(d, 5, 100), 0);

    /* The right length works: the restored maximum was seen, the next sequence is new. */
    assert_int_equal(kb_dedup_restore(d, 6, 100, window, KB_DEDUP_WINDOW_BYTES), 0);
    assert_int_equal(kb_dedup_client_count(d), 2);
    assert_int_equal(kb_dedup_check_and_record(d, 6, 100), 1);
    assert_int_equal(kb_dedup_check_and_record(d, 6, 101), 0);
    kb_dedup_destroy(&d);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_first_and_repeat),
    cmocka_unit_test(test_out_of_order_within_window),
    cmocka_unit_test(test_window_slides),
    cmocka_unit_test(test_older_than_window_is_duplicate),
    cmocka_unit_test(test_forget),
    cmocka_unit_test(test_many_clients),
    cmocka_unit_test(test_take_dirty),
    cmocka_unit_test(test_restore_round_trip),
    cmocka_unit_test(test_restore_wrong_length))
