/* Unit tests for kb_rowmap: insert/find across growth, keys that differ only in length or NUL bytes, and
 * backward-shift removal checked against a plain array over thousands of random operations. The map takes
 * the hash as an argument, so some tests pass crafted hashes to force full collisions and probe runs that
 * wrap around the end of the slot array. */
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

#include "kb_row.h"
#include "kb_rowmap.h"
#include "test_util.h"

/* A row as the map sees it: only key and key_len matter. The key gets its own allocation (at least one
 * byte, so an empty key still has a valid pointer). */
static kb_row_t *s_row_new(const void *key, size_t len)
{
    kb_row_t *row = calloc(1, sizeof *row);
    assert_non_null(row);
    row->key = malloc(len ? len : 1);
    assert_non_null(row->key);
    if (len)
        memcpy(row->key, key, len);
    row->key_len = (uint32_t)len;
    return row;
}

static void s_row_free(kb_row_t *row)
{
    if (!row)
        return;
    free(row->key);
    free(row);
}

/* Structural check of a linear-probing table, through the public fields: the capacity is a power of two,
 * count matches the occupied slots, the load stays below 1, and every entry is reachable from its home slot
 * without crossing an empty slot (the property that backward-shift deletion must preserve). */
static void s_check_invariants(const kb_rowmap_t *map)
{
    if (map->capacity == 0) {
        assert_int_equal(map->count, 0);
        return;
    }
    assert_int_equal(map->capacity & (map->capacity - 1), 0);
    assert_true(map->count < map->capacity);
    size_t mask = map->capacity - 1;
    size_t occupied = 0;
    for (size_t i = 0; i < map->capacity; i++) {
        if (map->slots[i].hash == 0) {
            assert_null(map->slots[i].row);
            continue;
        }
        occupied++;
        assert_non_null(map->slots[i].row);
        for (size_t j = map->slots[i].hash & mask; j != i; j = (j + 1) & mask)
            assert_true(map->slots[j].hash != 0);
    }
    assert_int_equal(occupied, map->count);
}

static void test_empty_map(void **st)
{
    (void)st;
    kb_rowmap_t map;
    kb_rowmap_init(&map);
    assert_int_equal(map.count, 0);
    uint64_t h = kb_rowmap_hash("x", 1);
    assert_null(kb_rowmap_find(&map, h, "x", 1));
    assert_null(kb_rowmap_remove(&map, h, "x", 1));
    assert_int_equal(map.count, 0);
    kb_rowmap_free(&map);
    kb_rowmap_free(&map); /* free leaves an empty map behind, so a second free is harmless */
}

/* The hash is nonzero (0 marks an empty slot), depends on every byte and on the length. */
static void test_hash(void **st)
{
    (void)st;
    assert_true(kb_rowmap_hash("", 0) != 0);
    assert_true(kb_rowmap_hash("a", 1) == kb_rowmap_hash("a", 1));
    assert_true(kb_rowmap_hash("a", 1) != kb_rowmap_hash("a\0", 2));
    assert_true(kb_rowmap_hash("ab", 2) != kb_rowmap_hash("ba", 2));
    char buf[16];
    for (int i = 0; i < 1000; i++) {
        int n = snprintf(buf, sizeof buf, "k%d", i);
        assert_true(kb_rowmap_hash(buf, (size_t)n) != 0);
    }
}

/* Thousands of rows: the map grows many times and every row is found at each stage. */
static void test_insert_find_many(void **st)
{
    (void)st;
    enum { N = 5000 };
    kb_row_t **rows = calloc(N, sizeof *rows);
    assert_non_null(rows);
    kb_rowmap_t map;
    kb_rowmap_init(&map);
    char buf[32];
    size_t resizes = 0, last_cap = 0;
    for (int i = 0; i < N; i++) {
        int n = snprintf(buf, sizeof buf, "key-%d", i);
        uint64_t h = kb_rowmap_hash(buf, (size_t)n);
        assert_null(kb_rowmap_find(&map, h, buf, (size_t)n));
        rows[i] = s_row_new(buf, (size_t)n);
        kb_rowmap_insert(&map, h, rows[i]);
        assert_int_equal(map.count, (size_t)i + 1);
        if (map.capacity != last_cap) {
            resizes++;
            last_cap = map.capacity;
            /* Right after a resize everything inserted so far must still be there. */
            for (int j = 0; j <= i; j++) {
                int m = snprintf(buf, sizeof buf, "key-%d", j);
                assert_ptr_equal(kb_rowmap_find(&map, kb_rowmap_hash(buf, (size_t)m), buf, (size_t)m), rows[j]);
            }
            s_check_invariants(&map);
        }
    }
    assert_true(resizes >= 5);
    s_check_invariants(&map);
    for (int i = 0; i < N; i++) {
        int n = snprintf(buf, sizeof buf, "key-%d", i);
        assert_ptr_equal(kb_rowmap_find(&map, kb_rowmap_hash(buf, (size_t)n), buf, (size_t)n), rows[i]);
    }
    for (int i = N; i < N + 1000; i++) {
        int n = snprintf(buf, sizeof buf, "key-%d", i);
        assert_null(kb_rowmap_find(&map, kb_rowmap_hash(buf, (size_t)n), buf, (size_t)n));
    }
    kb_rowmap_free(&map);
    for (int i = 0; i < N; i++)
        s_row_free(rows[i]);
    free(rows);
}

/* Keys that share prefixes, contain NUL bytes or are empty are all distinct keys. Run once with the real
 * hash and once with every key given the SAME hash, so only the key comparison (bytes and length) can tell
 * them apart. */
static void s_prefix_keys(bool same_hash)
{
    static const struct {
        const char *bytes;
        size_t len;
    } keys[] = {
        {"", 0},      {"\0", 1},       {"\0\0", 2},  {"a", 1},     {"a\0", 2},   {"a\0\0", 3},
        {"a\0b", 3},  {"ab", 2},       {"abc", 3},   {"abc\0", 4}, {"\0abc", 4}, {"abcd", 4},
        {"ab\0d", 4}, {"b", 1},        {"ba", 2},    {"\0a", 2},   {"aa", 2},    {"aaa", 3},
    };
    enum { K = sizeof keys / sizeof keys[0] };
    kb_row_t *rows[K];
    kb_rowmap_t map;
    kb_rowmap_init(&map);
    for (size_t i = 0; i < K; i++) {
        uint64_t h = same_hash ? 0x1234u : kb_rowmap_hash(keys[i].bytes, keys[i].len);
        assert_null(kb_rowmap_find(&map, h, keys[i].bytes, keys[i].len));
        rows[i] = s_row_new(keys[i].bytes, keys[i].len);
        kb_rowmap_insert(&map, h, rows[i]);
    }
    s_check_invariants(&map);
    for (size_t i = 0; i < K; i++) {
        uint64_t h = same_hash ? 0x1234u : kb_rowmap_hash(keys[i].bytes, keys[i].len);
        assert_ptr_equal(kb_rowmap_find(&map, h, keys[i].bytes, keys[i].len), rows[i]);
    }
    /* Remove every other key; the rest stay findable and the removed ones are gone. */
    for (size_t i = 0; i < K; i += 2) {
        uint64_t h = same_hash ? 0x1234u : kb_rowmap_hash(keys[i].bytes, keys[i].len);
        assert_ptr_equal(kb_rowmap_remove(&map, h, keys[i].bytes, keys[i].len), rows[i]);
        assert_null(kb_rowmap_remove(&map, h, keys[i].bytes, keys[i].len));
        s_check_invariants(&map);
    }
    assert_int_equal(map.count, K / 2);
    for (size_t i = 0; i < K; i++) {
        uint64_t h = same_hash ? 0x1234u : kb_rowmap_hash(keys[i].bytes, keys[i].len);
        kb_row_t *found = kb_rowmap_find(&map, h, keys[i].bytes, keys[i].len);
        if (i % 2 == 0)
            assert_null(found);
        else
            assert_ptr_equal(found, rows[i]);
    }
    kb_rowmap_free(&map);
    for (size_t i = 0; i < K; i++)
        s_row_free(rows[i]);
}

static void test_prefix_and_nul_keys(void **st)
{
    (void)st;
    s_prefix_keys(false);
    s_prefix_keys(true);
}

/* Crafted hashes whose home slot does not depend on the capacity (as long as it is at most 2^40): "end"
 * hashes have all low bits set except `back`, so they live in slot capacity-1-back; "start" hashes live in
 * slot `slot`. `tag` goes into high bits so different tags are different hashes with the same home. */
static uint64_t s_end_hash(unsigned back, unsigned tag) { return ~(uint64_t)back ^ ((uint64_t)tag << 44); }
static uint64_t s_start_hash(unsigned slot, unsigned tag) { return (uint64_t)slot | ((uint64_t)(tag + 1) << 44); }

/* A probe run that starts at the last slots and wraps to the front, mixed with entries whose home is at the
 * front. Every removal order (a few thousand random permutations) must keep the others findable. */
static void test_wraparound_removal_orders(void **st)
{
    (void)st;
    enum { K = 9 };
    uint64_t hashes[K] = {
        s_end_hash(0, 0),   /* home C-1 */
        s_end_hash(0, 1),   /* home C-1, different hash */
        s_end_hash(1, 0),   /* home C-2 */
        s_end_hash(0, 0),   /* same hash as the first, different key */
        s_start_hash(0, 0), /* home 0, displaced by the wrapped run */
        s_start_hash(1, 0), /* home 1 */
        s_end_hash(2, 0),   /* home C-3 */
        s_start_hash(0, 1), /* home 0 */
        s_start_hash(3, 0), /* home 3 */
    };
    kb_row_t *rows[K];
    char key[8];
    for (int i = 0; i < K; i++) {
        int n = snprintf(key, sizeof key, "w%d", i);
        rows[i] = s_row_new(key, (size_t)n);
    }
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (int trial = 0; trial < 3000; trial++) {
        kb_rowmap_t map;
        kb_rowmap_init(&map);
        /* Insert in a random order too: different layouts of the same run. */
        int order[K];
        for (int i = 0; i < K; i++)
            order[i] = i;
        for (int i = K - 1; i > 0; i--) {
            int j = (int)(test_xorshift64(&rng) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < K; i++)
            kb_rowmap_insert(&map, hashes[order[i]], rows[order[i]]);
        s_check_invariants(&map);
        /* The run really wraps: the last slot and the first slot are both in use. */
        assert_true(map.slots[map.capacity - 1].hash != 0);
        assert_true(map.slots[0].hash != 0);

        for (int i = K - 1; i > 0; i--) {
            int j = (int)(test_xorshift64(&rng) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        bool removed[K] = {false};
        for (int r = 0; r < K; r++) {
            int v = order[r];
            assert_ptr_equal(kb_rowmap_remove(&map, hashes[v], rows[v]->key, rows[v]->key_len), rows[v]);
            removed[v] = true;
            s_check_invariants(&map);
            for (int i = 0; i < K; i++) {
                kb_row_t *f = kb_rowmap_find(&map, hashes[i], rows[i]->key, rows[i]->key_len);
                if (removed[i])
                    assert_null(f);
                else
                    assert_ptr_equal(f, rows[i]);
            }
        }
        assert_int_equal(map.count, 0);
        kb_rowmap_free(&map);
    }
    for (int i = 0; i < K; i++)
        s_row_free(rows[i]);
}

/* Random insert/find/remove against a reference array. Keys are random short byte strings from a tiny
 * alphabet that includes NUL, so many share prefixes. With crafted hashes, most keys collide fully or share
 * a home slot at the end or the start of the table, so runs are long and wrap around. */
typedef enum { HASH_REAL, HASH_CRAFTED } s_hash_mode_t;

typedef struct {
    uint8_t bytes[12];
    size_t len;
    uint64_t hash;
    kb_row_t *row;
    bool present;
} s_ref_t;

/* The map's structure holds (s_check_invariants) and it finds exactly the n reference rows marked present. */
static void s_check_against_ref(const kb_rowmap_t *map, const s_ref_t *ref, size_t n)
{
    s_check_invariants(map);
    for (size_t i = 0; i < n; i++) {
        kb_row_t *f = kb_rowmap_find(map, ref[i].hash, ref[i].bytes, ref[i].len);
        if (ref[i].present)
            assert_ptr_equal(f, ref[i].row);
        else
            assert_null(f);
    }
}

static void s_random_ops(s_hash_mode_t mode, uint64_t seed)
{
    enum { K = 700, OPS = 30000 };
    static const uint8_t alphabet[] = {0, 'a', 'b', 0xff};
    s_ref_t *ref = calloc(K, sizeof *ref);
    assert_non_null(ref);
    uint64_t rng = seed;
    /* Distinct random keys. */
    for (size_t i = 0; i < K;) {
        s_ref_t *r = &ref[i];
        r->len = (size_t)(test_xorshift64(&rng) % 9);
        for (size_t b = 0; b < r->len; b++)
            r->bytes[b] = alphabet[test_xorshift64(&rng) % sizeof alphabet];
        bool dup = false;
        for (size_t j = 0; j < i && !dup; j++)
            dup = ref[j].len == r->len && memcmp(ref[j].bytes, r->bytes, r->len) == 0;
        if (dup)
            continue;
        if (mode == HASH_REAL) {
            r->hash = kb_rowmap_hash(r->bytes, r->len);
        } else {
            uint64_t pick = test_xorshift64(&rng) % 8;
            if (pick < 3)
                r->hash = s_end_hash((unsigned)(test_xorshift64(&rng) % 3), (unsigned)(test_xorshift64(&rng) % 4));
            else if (pick < 5)
                r->hash = s_start_hash((unsigned)(test_xorshift64(&rng) % 3), (unsigned)(test_xorshift64(&rng) % 4));
            else
                r->hash = kb_rowmap_hash(r->bytes, r->len);
        }
        r->row = s_row_new(r->bytes, r->len);
        i++;
    }

    kb_rowmap_t map;
    kb_rowmap_init(&map);
    size_t present = 0;
    for (int op = 0; op < OPS; op++) {
        s_ref_t *r = &ref[test_xorshift64(&rng) % K];
        uint64_t what = test_xorshift64(&rng) % 4;
        if (r->present) {
            if (what < 2) {
                assert_ptr_equal(kb_rowmap_remove(&map, r->hash, r->bytes, r->len), r->row);
                r->present = false;
                present--;
            } else {
                assert_ptr_equal(kb_rowmap_find(&map, r->hash, r->bytes, r->len), r->row);
            }
        } else {
            if (what < 3) {
                assert_null(kb_rowmap_find(&map, r->hash, r->bytes, r->len));
                kb_rowmap_insert(&map, r->hash, r->row);
                r->present = true;
                present++;
            } else {
                assert_null(kb_rowmap_remove(&map, r->hash, r->bytes, r->len));
            }
        }
        assert_int_equal(map.count, present);
        if (op % 1000 == 999) {
            s_check_against_ref(&map, ref, K);
        }
    }
    /* Drain: remove everything that is left, checking the others after each removal batch. */
    for (size_t i = 0; i < K; i++) {
        if (!ref[i].present)
            continue;
        assert_ptr_equal(kb_rowmap_remove(&map, ref[i].hash, ref[i].bytes, ref[i].len), ref[i].row);
        ref[i].present = false;
        if (i % 50 == 0) {
            s_check_against_ref(&map, ref, K);
        }
    }
    assert_int_equal(map.count, 0);
    for (size_t i = 0; i < map.capacity; i++)
        assert_true(map.slots[i].hash == 0);
    kb_rowmap_free(&map);
    for (size_t i = 0; i < K; i++)
        s_row_free(ref[i].row);
    free(ref);
}

static void test_random_ops_real_hash(void **st)
{
    (void)st;
    s_random_ops(HASH_REAL, 1);
    s_random_ops(HASH_REAL, 0xdeadbeefULL);
}

static void test_random_ops_crafted_hash(void **st)
{
    (void)st;
    s_random_ops(HASH_CRAFTED, 2);
    s_random_ops(HASH_CRAFTED, 0xc0ffeeULL);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_empty_map),
    cmocka_unit_test(test_hash),
    cmocka_unit_test(test_insert_find_many),
    cmocka_unit_test(test_prefix_and_nul_keys),
    cmocka_unit_test(test_wraparound_removal_orders),
    cmocka_unit_test(test_random_ops_real_hash),
    cmocka_unit_test(test_random_ops_crafted_hash))
