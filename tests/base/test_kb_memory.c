/* Unit tests for the memory accounting behind kb-server --max-memory: kb_memory (parsing, malloc sizes,
 * the reservation rule), a table's estimate (every allocation added and taken back, so a table's bytes
 * return to its empty size and the bank's total to zero), the growth a request is estimated to cause
 * (existing keys free, Bloom admission, eviction at its cap, pending buffers, feature records, index), and,
 * outside the sanitizers, the estimate against what glibc's malloc really holds (mallinfo2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_memory.h"
#include "kb_row.h"
#include "kb_table.h"
#include "kb_table_config.h"
#include "protocol.h"
#include "test_util.h"

/* ---- kb_memory ---- */

static void test_parse(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes; /* 0: no limit */
    } good[] = {
        {"0", 0},
        {"unlimited", 0},
        {"none", 0},
        {"1048576", 1048576},
        {"64M", 64ull << 20},
        {"64MiB", 64ull << 20},
        {"512k", 512ull << 10},
        {"2G", 2ull << 30},
        {"3gb", 3ull << 30},
        {"1T", 1ull << 40},
    };
    uint64_t v;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        v = UINT64_MAX; /* each case must set it */
        if (kb_memory_parse(good[i].text, &v) != 0 || v != good[i].bytes)
            fail_msg("'%s': got %llu, want %llu", good[i].text, (unsigned long long)v,
                     (unsigned long long)good[i].bytes);
    }
    const char *bad[] = {"", "M", "-1", "1.5G", "12Q", "4GiBs", "99999999999999999999", "20000000000G", " 1", NULL};
    for (int i = 0; bad[i]; i++)
        if (kb_memory_parse(bad[i], &v) == 0)
            fail_msg("'%s' was accepted", bad[i]);
}

static void test_chunk(void **state)
{
    (void)state;
    assert_int_equal(kb_memory_chunk(0), 32);
    assert_int_equal(kb_memory_chunk(1), 32);
    assert_int_equal(kb_memory_chunk(24), 32);
    assert_int_equal(kb_memory_chunk(25), 48);
    assert_int_equal(kb_memory_chunk(200), 208);
    /* Large blocks are mapped alone, whole pages. */
    size_t big = kb_memory_chunk(1u << 20);
    assert_true(big > (1u << 20) && big % 4096 == 0 && big <= (1u << 20) + 8192);
}

static void test_reserve_rule(void **state)
{
    (void)state;
    kb_memory_t *m = kb_memory_new(1000);
    assert_int_equal(kb_memory_reserve(m, 600), 0);
    assert_int_equal(kb_memory_reserve(m, 500), -1); /* 600 + 500 > 1000: refused whole */
    assert_true(kb_memory_reserved(m) == 600);
    kb_memory_add(m, 300);
    assert_int_equal(kb_memory_reserve(m, 100), 0); /* exactly the limit */
    assert_int_equal(kb_memory_reserve(m, 1), -1);
    assert_int_equal(kb_memory_reserve(m, 0), 0);   /* creating nothing always passes */
    kb_memory_release(m, 700);
    assert_true(kb_memory_reserved(m) == 0);
    kb_memory_add(m, 5000); /* over the limit (e.g. pending buffers of existing rows) */
    assert_true(kb_memory_used(m) == 5300);
    assert_int_equal(kb_memory_reserve(m, 1), -1);
    assert_int_equal(kb_memory_reserve(m, 0), 0);
    kb_memory_add(m, -5300);
    assert_true(kb_memory_used(m) == 0);
    assert_int_equal(kb_memory_reserve(m, 1000), 0);
    kb_memory_release(m, 1000);
    assert_true(kb_memory_limit(m) == 1000);
    kb_memory_destroy(&m);
    assert_null(m);

    /* Unlimited, and no accounting at all. */
    m = kb_memory_new(0);
    assert_int_equal(kb_memory_reserve(m, UINT64_MAX / 2), 0);
    kb_memory_release(m, UINT64_MAX / 2);
    kb_memory_destroy(&m);
    assert_int_equal(kb_memory_reserve(NULL, 12345), 0);
    kb_memory_add(NULL, 5);
    assert_true(kb_memory_used(NULL) == 0);
    assert_true(kb_memory_rss() > 0);
}

/* ---- tables ---- */

typedef struct {
    uint32_t dim;
    bool lazy_push; /* false: immediate updates */
    const char *knn;
    Carls__AdmissionKind admission;
    uint32_t min_frequency;
    Carls__EvictionKind eviction;
    uint64_t max_rows;
    bool feature;
} s_spec_t;

static kb_table_config_t s_config(const s_spec_t *spec)
{
    Carls__TableConfig tc;
    Carls__LazyUpdateConfig lc;
    Carls__KnnConfig kc;
    Carls__AdmissionConfig ac;
    Carls__EvictionConfig ec;
    carls__table_config__init(&tc);
    carls__lazy_update_config__init(&lc);
    carls__knn_config__init(&kc);
    carls__admission_config__init(&ac);
    carls__eviction_config__init(&ec);
    if (spec->feature) {
        tc.kind = CARLS__TABLE_KIND__TABLE_FEATURE;
    } else {
        tc.dim = spec->dim;
        lc.policy = spec->lazy_push ? CARLS__UPDATE_POLICY__UPDATE_LAZY : CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
        tc.lazy = &lc;
        if (spec->knn) {
            kc.spec = (char *)spec->knn;
            tc.knn = &kc;
        }
    }
    ac.kind = spec->admission;
    ac.min_frequency = spec->min_frequency;
    ac.bloom_bits_log2 = 12;
    tc.admission = &ac;
    ec.kind = spec->eviction;
    ec.max_rows = spec->max_rows;
    tc.eviction = &ec;
    kb_table_config_t cfg;
    char err[256] = "";
    if (kb_table_config_from_proto(&tc, CARLS_DEFAULT_MAX_DIM, &cfg, err, sizeof err) != 0)
        fail_msg("config rejected: %s", err);
    return cfg;
}

/* Destroys *t and checks that it gave back every byte it had counted in mem. */
static void s_destroy_counted(kb_table_t **t, kb_memory_t *mem)
{
    kb_table_destroy(t);
    assert_true(kb_memory_used(mem) == 0);
}

/* A table made from spec whose memory is counted in mem. */
static kb_table_t *s_table_in(kb_memory_t *mem, int64_t id, const char *name, const s_spec_t *spec)
{
    kb_table_config_t cfg = s_config(spec);
    kb_table_t *t = kb_table_new(id, name, &cfg);
    kb_table_set_memory(t, mem);
    return t;
}

/* n keys "<prefix><i>" in one buffer. */
typedef struct {
    ProtobufCBinaryData *keys;
    char *text;
} s_keys_t;

static s_keys_t s_keys(const char *prefix, size_t first, size_t n)
{
    s_keys_t k = {calloc(n ? n : 1, sizeof *k.keys), calloc(n ? n : 1, 32)};
    for (size_t i = 0; i < n; i++) {
        char *p = k.text + 32 * i;
        int len = snprintf(p, 32, "%s%zu", prefix, first + i);
        k.keys[i] = (ProtobufCBinaryData){.len = (size_t)len, .data = (uint8_t *)p};
    }
    return k;
}

static void s_keys_free(s_keys_t *k)
{
    free(k->keys);
    free(k->text);
}

static float *s_values(size_t n, uint32_t dim)
{
    float *v = calloc((n * dim) > 0 ? n * dim : 1, sizeof *v);
    for (size_t i = 0; i < n * dim; i++)
        v[i] = (float)(i % 7) * 0.25f;
    return v;
}

/* Takes the dirty rows (as the persister does), which frees evicted rows. */
static void s_persist(kb_table_t *t)
{
    kb_store_row_t *rows = NULL;
    size_t count = 0, cap = 0;
    kb_table_take_dirty(t, &rows, &count, &cap);
    for (size_t i = 0; i < count; i++)
        kb_store_row_free(&rows[i]);
    free(rows);
}

/* Creating rows adds what the growth estimate predicted (never less), updates of those rows add nothing,
 * and after everything is freed the bank's total is back to zero. */
static void test_table_estimate_and_growth(void **state)
{
    (void)state;
    kb_memory_t *mem = kb_memory_new(0);
    s_spec_t spec = {.dim = 8, .lazy_push = true};
    kb_table_config_t cfg = s_config(&spec);
    kb_table_t *t = kb_table_new(1, "emb", &cfg);
    uint64_t empty = kb_table_memory(t);
    assert_true(empty >= kb_table_base_bytes(&cfg));
    kb_table_set_memory(t, mem);
    assert_true(kb_memory_used(mem) == empty);

    size_t n = 5000;
    s_keys_t k = s_keys("key", 0, n);
    float *v = s_values(n, cfg.dim);
    uint64_t new_rows = 0;
    uint64_t predicted = kb_table_growth(t, KB_GROW_PUT, k.keys, n, NULL, &new_rows);
    assert_true(new_rows == n);
    kb_table_put(t, k.keys, n, v, 1);
    uint64_t after_put = kb_table_memory(t);
    uint64_t actual = after_put - empty;
    if (predicted < actual || predicted > actual + actual / 4)
        fail_msg("put of %zu rows: predicted %llu bytes, actual %llu", n, (unsigned long long)predicted,
                 (unsigned long long)actual);
    assert_true(kb_memory_used(mem) == after_put);
    /* Each row costs at least its block: struct, value, key. */
    assert_true(actual >= n * (sizeof(kb_row_t) + cfg.dim * sizeof(float)));

    /* Existing keys: nothing to grow, for every kind of operation. */
    assert_true(kb_table_growth(t, KB_GROW_PUT, k.keys, n, NULL, &new_rows) == 0 && new_rows == 0);
    assert_true(kb_table_growth(t, KB_GROW_LOOKUP, k.keys, n, NULL, &new_rows) == 0 && new_rows == 0);
    assert_true(kb_table_growth(t, KB_GROW_PUSH, k.keys, n, NULL, &new_rows) == 0 && new_rows == 0);
    kb_table_put(t, k.keys, n, v, 2);
    assert_true(kb_table_memory(t) == after_put);

    /* Pending gradients take a buffer each. Applied, a buffer goes back to its stripe's pool (up to 64 KiB a
     * stripe), still counted since the heap still holds it, and the next pending set takes it from there. */
    kb_table_push(t, k.keys, 10, v);
    uint64_t pending_bytes = kb_table_memory(t) - after_put;
    assert_true(pending_bytes == 10 * kb_memory_chunk((size_t)cfg.max_pending * cfg.dim * sizeof(float)));
    float *out = s_values(10, cfg.dim);
    uint64_t ver[10], freq[10];
    int64_t upd[10];
    kb_table_lookup(t, k.keys, 10, false, out, ver, upd, freq);
    assert_true(kb_table_memory(t) == after_put + pending_bytes);
    kb_table_push(t, k.keys, 10, v);
    assert_true(kb_table_memory(t) == after_put + pending_bytes);
    kb_table_lookup(t, k.keys, 10, false, out, ver, upd, freq);
    assert_true(kb_table_memory(t) == after_put + pending_bytes);

    /* A push of new keys to a lazy table predicts their pending buffers too. */
    s_keys_t fresh = s_keys("fresh", 0, 100);
    uint64_t p_put = kb_table_growth(t, KB_GROW_PUT, fresh.keys, 100, NULL, &new_rows);
    uint64_t p_push = kb_table_growth(t, KB_GROW_PUSH, fresh.keys, 100, NULL, &new_rows);
    assert_true(p_push >= p_put + 100 * kb_memory_chunk((size_t)cfg.max_pending * cfg.dim * sizeof(float)));
    uint64_t before = kb_table_memory(t);
    kb_table_push(t, fresh.keys, 100, v);
    assert_true(kb_table_memory(t) - before <= p_push);
    s_keys_free(&fresh);

    s_persist(t);
    s_destroy_counted(&t, mem);
    kb_memory_destroy(&mem);
    free(out);
    free(v);
    s_keys_free(&k);
}

/* Bloom admission: unseen keys below the admission count are not predicted as rows for lookups. Eviction at
 * its cap: new rows replace evicted ones, and the evicted ones are freed once persisted. */
static void test_admission_and_eviction(void **state)
{
    (void)state;
    kb_memory_t *mem = kb_memory_new(0);
    s_spec_t bloom = {.dim = 4, .admission = CARLS__ADMISSION_KIND__ADMIT_BLOOM, .min_frequency = 2};
    kb_table_t *t = s_table_in(mem, 1, "bloom", &bloom);
    s_keys_t k = s_keys("b", 0, 50);
    uint64_t new_rows = 9;
    assert_true(kb_table_growth(t, KB_GROW_LOOKUP, k.keys, 50, NULL, &new_rows) == 0 && new_rows == 0);
    /* A put is always admitted. */
    assert_true(kb_table_growth(t, KB_GROW_PUT, k.keys, 50, NULL, &new_rows) > 0 && new_rows == 50);
    float out[50 * 4];
    uint64_t ver[50], freq[50];
    int64_t upd[50];
    kb_table_lookup(t, k.keys, 50, false, out, ver, upd, freq); /* first sighting: no rows */
    assert_true(kb_table_row_count(t) == 0);
    /* The second sighting admits them: now they are predicted. */
    assert_true(kb_table_growth(t, KB_GROW_LOOKUP, k.keys, 50, NULL, &new_rows) > 0 && new_rows == 50);
    s_destroy_counted(&t, mem);
    s_keys_free(&k);

    s_spec_t lru = {.dim = 4, .lazy_push = true, .eviction = CARLS__EVICTION_KIND__EVICT_LRU, .max_rows = 100};
    t = s_table_in(mem, 2, "lru", &lru);
    k = s_keys("e", 0, 300);
    float *v = s_values(300, 4);
    assert_true(kb_table_growth(t, KB_GROW_PUT, k.keys, 100, NULL, &new_rows) > 0 && new_rows == 100);
    kb_table_put(t, k.keys, 100, v, 1);
    s_persist(t);
    uint64_t full = kb_table_memory(t);
    /* At the cap: 200 new keys are 200 new rows, but they add nothing once the evicted ones are freed. */
    assert_true(kb_table_growth(t, KB_GROW_PUT, k.keys + 100, 200, NULL, &new_rows) == 0 && new_rows == 200);
    kb_table_put(t, k.keys + 100, 200, v, 1);
    assert_true(kb_table_row_count(t) == 100);
    assert_true(kb_table_memory(t) > full); /* evicted rows wait for their deletion to be persisted */
    s_persist(t);
    uint64_t after = kb_table_memory(t);
    if (after > full + full / 10 || after + after / 10 < full)
        fail_msg("at the cap: %llu bytes before, %llu after", (unsigned long long)full, (unsigned long long)after);
    s_destroy_counted(&t, mem);
    kb_memory_destroy(&mem);
    free(v);
    s_keys_free(&k);
}

/* Feature records are counted by their size; an index's vectors by the index. */
static void test_records_and_index(void **state)
{
    (void)state;
    kb_memory_t *mem = kb_memory_new(0);
    kb_table_t *t = s_table_in(mem, 1, "feat", &(s_spec_t){.feature = true});
    s_keys_t k = s_keys("f", 0, 20);
    uint8_t *records[20];
    size_t lens[20];
    static uint8_t blob[4000];
    for (int i = 0; i < 20; i++) {
        records[i] = blob;
        lens[i] = 1000 + 100 * (size_t)i;
    }
    uint64_t new_rows = 0;
    uint64_t small = kb_table_growth(t, KB_GROW_FEATURE_PUT, k.keys, 20, NULL, &new_rows);
    uint64_t with = kb_table_growth(t, KB_GROW_FEATURE_PUT, k.keys, 20, lens, &new_rows);
    assert_true(with - small >= 20 * 1000 + 100 * 190);
    uint64_t before = kb_table_memory(t);
    kb_table_feature_put(t, k.keys, 20, records, lens);
    uint64_t grew = kb_table_memory(t) - before;
    assert_true(grew <= with && grew >= with - with / 4);
    /* Replacing a record by a bigger one counts the difference. */
    lens[0] = 4000;
    before = kb_table_memory(t);
    kb_table_feature_put(t, k.keys, 1, records, lens);
    assert_true(kb_table_memory(t) - before == kb_memory_chunk(4000) - kb_memory_chunk(1000));
    s_destroy_counted(&t, mem);
    s_keys_free(&k);

    t = s_table_in(mem, 2, "knn", &(s_spec_t){.dim = 16, .knn = "Flat"});
    size_t n = 2000;
    k = s_keys("v", 0, n);
    float *v = s_values(n, 16);
    uint64_t predicted = kb_table_growth(t, KB_GROW_PUT, k.keys, n, NULL, &new_rows);
    before = kb_table_memory(t);
    kb_table_put(t, k.keys, n, v, 1);
    assert_int_equal(kb_table_knn_flush(t), 0); /* the index takes the rows in: its growth is counted */
    uint64_t grew_knn = kb_table_memory(t) - before;
    /* The copy and the index each hold every vector. */
    assert_true(grew_knn >= n * (sizeof(kb_row_t) + 3 * 16 * sizeof(float)));
    if (grew_knn > predicted + predicted / 4 || predicted > grew_knn + grew_knn / 2)
        fail_msg("knn table: predicted %llu, grew %llu", (unsigned long long)predicted,
                 (unsigned long long)grew_knn);
    s_persist(t);
    s_destroy_counted(&t, mem);
    kb_memory_destroy(&mem);
    free(v);
    s_keys_free(&k);
}

/* Outside the sanitizers (whose allocator mallinfo does not see), the estimate follows the heap: what 50000
 * rows add to the table's estimate is within 10% of what they add to malloc's in-use bytes. */
static void test_estimate_against_malloc(void **state)
{
    (void)state;
#ifdef TEST_SANITIZED
    skip();
#else
    s_spec_t spec = {.dim = 4, .lazy_push = true};
    kb_table_config_t cfg = s_config(&spec);
    size_t n = 50000;
    s_keys_t k = s_keys("malloc-check-", 0, n);
    float *v = s_values(n, 4);
    kb_table_t *t = kb_table_new(1, "t", &cfg);
    struct mallinfo2 a = mallinfo2();
    uint64_t est0 = kb_table_memory(t);
    kb_table_put(t, k.keys, n, v, 1);
    s_persist(t); /* the snapshots are freed here; dirty marks cleared */
    struct mallinfo2 b = mallinfo2();
    double heap = (double)(b.uordblks + b.hblkhd) - (double)(a.uordblks + a.hblkhd);
    double est = (double)(kb_table_memory(t) - est0);
    print_message("50000 rows of dim 4: estimate %.0f bytes, malloc in use %.0f bytes (%.1f%%)\n", est, heap,
                  100.0 * est / heap);
    if (est < 0.9 * heap || est > 1.1 * heap)
        fail_msg("estimate %.0f, heap %.0f", est, heap);
    kb_table_destroy(&t);
    free(v);
    s_keys_free(&k);
#endif
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_parse),
    cmocka_unit_test(test_chunk),
    cmocka_unit_test(test_reserve_rule),
    cmocka_unit_test(test_table_estimate_and_growth),
    cmocka_unit_test(test_admission_and_eviction),
    cmocka_unit_test(test_records_and_index),
    cmocka_unit_test(test_estimate_against_malloc))
