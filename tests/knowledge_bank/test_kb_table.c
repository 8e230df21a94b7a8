/* Unit tests for kb_table: config validation and defaults, lookup/put/push with the lazy and immediate
 * policies, the three triggers of a pending set (lookup, max_pending, max_age via expire), the dirty rows
 * handed to the persister, and restoring taken rows into a fresh table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kb_init.h"
#include "kb_rowmap.h"
#include "kb_table.h"
#include "kb_table_config.h"
#include "protocol.h"
#include "util.h"

/* ---- helpers ---- */

static ProtobufCBinaryData s_key(const char *text)
{
    ProtobufCBinaryData k = {.len = strlen(text), .data = (uint8_t *)text};
    return k;
}

static void s_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Wire configs with the given fields; zero means "default" as on the wire (the lazy policy, an embedding
 * table). */
typedef struct {
    Carls__TableKind kind;
    uint32_t dim;
    Carls__InitKind init;
    float init_scale;
    uint64_t init_seed;
    Carls__OptimizerKind opt;
    float lr;
    Carls__UpdatePolicy policy;
    uint32_t max_age_ms;
    uint32_t max_pending;
    Carls__OutlierRule outlier;
    float outlier_threshold;
} s_spec_t;

/* The wire messages of a spec (in kb_table_config_wire_t's storage; the table config points to the optimizer
 * and lazy-update messages, the others are left unset). */
static const Carls__TableConfig *s_wire(const s_spec_t *spec, kb_table_config_wire_t *w)
{
    carls__table_config__init(&w->config);
    carls__optimizer_config__init(&w->optimizer);
    carls__lazy_update_config__init(&w->lazy);
    w->config.kind = spec->kind;
    w->config.dim = spec->dim;
    w->config.init = spec->init;
    w->config.init_scale = spec->init_scale;
    w->config.init_seed = spec->init_seed;
    w->optimizer.kind = spec->opt;
    w->optimizer.learning_rate = spec->lr;
    w->lazy.policy = spec->policy;
    w->lazy.max_age_ms = spec->max_age_ms;
    w->lazy.max_pending = spec->max_pending;
    w->lazy.outlier_rule = spec->outlier;
    w->lazy.outlier_threshold = spec->outlier_threshold;
    w->config.optimizer = &w->optimizer;
    w->config.lazy = &w->lazy;
    return &w->config;
}

/* The config of spec, which must be accepted. */
static kb_table_config_t s_config(const s_spec_t *spec)
{
    kb_table_config_wire_t w;
    kb_table_config_t cfg;
    char err[256] = "";
    if (kb_table_config_from_proto(s_wire(spec, &w), CARLS_DEFAULT_MAX_DIM, &cfg, err, sizeof err) != 0)
        fail_msg("config rejected: %s", err);
    return cfg;
}

/* A table made from the wire config that spec describes. */
static kb_table_t *s_new_table(int64_t id, const char *name, const s_spec_t *spec)
{
    kb_table_config_t cfg = s_config(spec);
    return kb_table_new(id, name, &cfg);
}

static void s_stats(kb_table_t *t, kb_table_stats_t *s) { kb_table_get_stats(t, s); }

/* The lazy-update counters of a table's stats; s_expect_lazy checks all of them at once, so a field left out
 * of the wanted values is checked to be zero. */
typedef struct {
    uint64_t pending_keys, pending_gradients, gradients_received, gradients_applied, updates_applied,
        applied_on_lookup, applied_on_count, applied_on_age;
} s_lazy_counts_t;

static void s_expect_lazy(kb_table_t *t, s_lazy_counts_t want)
{
    kb_table_stats_t s;
    kb_table_get_stats(t, &s);
    assert_int_equal(s.pending_keys, want.pending_keys);
    assert_int_equal(s.pending_gradients, want.pending_gradients);
    assert_int_equal(s.gradients_received, want.gradients_received);
    assert_int_equal(s.gradients_applied, want.gradients_applied);
    assert_int_equal(s.updates_applied, want.updates_applied);
    assert_int_equal(s.applied_on_lookup, want.applied_on_lookup);
    assert_int_equal(s.applied_on_count, want.applied_on_count);
    assert_int_equal(s.applied_on_age, want.applied_on_age);
}

/* One lookup of one key; returns the value in out (dim floats) and metadata through the pointers. */
static void s_lookup1(kb_table_t *t, const char *key, bool no_create, float *out, uint64_t *version,
                      int64_t *updated, uint64_t *freq)
{
    ProtobufCBinaryData k = s_key(key);
    uint64_t v, f;
    int64_t u;
    kb_table_lookup(t, &k, 1, no_create, out, version ? version : &v, updated ? updated : &u, freq ? freq : &f);
}

static void s_free_records(kb_store_row_t *recs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kb_store_row_free(&recs[i]);
}

static const kb_store_row_t *s_find_record(const kb_store_row_t *recs, size_t n, const char *key)
{
    size_t len = strlen(key);
    const kb_store_row_t *hit = NULL;
    for (size_t i = 0; i < n; i++) {
        if (recs[i].key_len == len && memcmp(recs[i].key, key, len) == 0) {
            assert_null(hit); /* each row at most once */
            hit = &recs[i];
        }
    }
    return hit;
}

/* ---- config ---- */

static void test_config_defaults(void **st)
{
    (void)st;
    Carls__TableConfig tc;
    carls__table_config__init(&tc);
    tc.dim = 8;
    kb_table_config_t cfg;
    char err[256];
    assert_int_equal(kb_table_config_from_proto(&tc, CARLS_DEFAULT_MAX_DIM, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.dim, 8);
    assert_int_equal(cfg.init, KB_INIT_ZEROS);
    assert_float_equal(cfg.init_scale, 0.05f, 1e-9);
    assert_int_equal(cfg.optimizer.kind, KB_OPT_SGD);
    assert_float_equal(cfg.optimizer.learning_rate, 0.01f, 1e-9);
    assert_false(cfg.immediate);
    assert_int_equal(cfg.max_age_ms, 1000);
    assert_int_equal(cfg.max_pending, 16);
    assert_int_equal(cfg.outlier.rule, KB_OUTLIER_NORM_MEDIAN);
    assert_float_equal(cfg.outlier.threshold, 3.0f, 1e-9);
    assert_int_equal(cfg.outlier.min_count, 3);

    /* Nested messages present but all zero: the same defaults. */
    Carls__OptimizerConfig oc;
    Carls__LazyUpdateConfig lc;
    carls__optimizer_config__init(&oc);
    carls__lazy_update_config__init(&lc);
    tc.optimizer = &oc;
    tc.lazy = &lc;
    kb_table_config_t cfg2;
    assert_int_equal(kb_table_config_from_proto(&tc, CARLS_DEFAULT_MAX_DIM, &cfg2, err, sizeof err), 0);
    assert_float_equal(cfg2.optimizer.learning_rate, 0.01f, 1e-9);
    assert_int_equal(cfg2.max_age_ms, 1000);
    assert_int_equal(cfg2.max_pending, 16);
    assert_float_equal(cfg2.outlier.threshold, 3.0f, 1e-9);
    assert_int_equal(cfg2.outlier.min_count, 3);
    assert_int_equal(cfg2.outlier.rule, KB_OUTLIER_NORM_MEDIAN);
    assert_false(cfg2.immediate);

    /* The limits themselves are accepted. */
    tc.dim = 64;
    lc.max_pending = CARLS_MAX_PENDING_LIMIT;
    assert_int_equal(kb_table_config_from_proto(&tc, 64, &cfg2, err, sizeof err), 0);
    assert_int_equal(cfg2.dim, 64);
    assert_int_equal(cfg2.max_pending, CARLS_MAX_PENDING_LIMIT);
}

/* Every rejection returns -1 with a message. */
static void s_expect_reject(const Carls__TableConfig *tc, uint32_t max_dim)
{
    kb_table_config_t cfg;
    char err[256] = "";
    assert_int_equal(kb_table_config_from_proto(tc, max_dim, &cfg, err, sizeof err), -1);
    assert_true(strlen(err) > 0);
}

static void test_config_rejections(void **st)
{
    (void)st;
    s_expect_reject(NULL, 100);

    /* Each case is valid for max_dim 100 but for one field. */
    static const s_spec_t bad[] = {
        {.dim = 0}, /* dim is required */
        {.dim = 101},
        {.dim = 100, .max_pending = CARLS_MAX_PENDING_LIMIT + 1},
        {.dim = 100, .lr = -0.1f},
        {.dim = 100, .lr = NAN},
        {.dim = 100, .lr = INFINITY},
        {.dim = 100, .outlier_threshold = 0.5f},
        {.dim = 100, .outlier_threshold = NAN},
        /* Not an embedding table: a feature table takes no dim, and unknown kinds are refused. */
        {.dim = 100, .kind = CARLS__TABLE_KIND__TABLE_FEATURE},
        {.dim = 100, .kind = (Carls__TableKind)77},
        /* Out-of-range enum values from a hostile peer. */
        {.dim = 100, .init = (Carls__InitKind)77},
        {.dim = 100, .opt = (Carls__OptimizerKind)77},
        {.dim = 100, .policy = (Carls__UpdatePolicy)77},
    };
    kb_table_config_wire_t w;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        s_expect_reject(s_wire(&bad[i], &w), 100);

    /* The bounds themselves are accepted (so the rejections above were for the field under test). */
    static const s_spec_t good[] = {{.dim = 100}, {.dim = 100, .outlier_threshold = 1.0f}};
    kb_table_config_t cfg;
    char err[256];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(kb_table_config_from_proto(s_wire(&good[i], &w), 100, &cfg, err, sizeof err), 0);
}

static void test_config_round_trip(void **st)
{
    (void)st;
    Carls__TableConfig tc;
    Carls__OptimizerConfig oc;
    Carls__LazyUpdateConfig lc;
    carls__table_config__init(&tc);
    carls__optimizer_config__init(&oc);
    carls__lazy_update_config__init(&lc);
    tc.dim = 33;
    tc.init = CARLS__INIT_KIND__INIT_NORMAL;
    tc.init_scale = 0.2f;
    tc.init_seed = 42;
    oc.kind = CARLS__OPTIMIZER_KIND__OPT_ADAM;
    oc.learning_rate = 0.05f;
    oc.beta1 = 0.8f;
    oc.beta2 = 0.99f;
    oc.epsilon = 1e-6f;
    lc.policy = CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
    lc.max_age_ms = 250;
    lc.max_pending = 7;
    lc.outlier_rule = CARLS__OUTLIER_RULE__OUTLIER_NONE;
    lc.outlier_threshold = 4.5f;
    lc.outlier_min_count = 5;
    tc.optimizer = &oc;
    tc.lazy = &lc;
    kb_table_config_t a, b;
    char err[256];
    assert_int_equal(kb_table_config_from_proto(&tc, CARLS_DEFAULT_MAX_DIM, &a, err, sizeof err), 0);
    assert_int_equal(a.dim, 33);
    assert_int_equal(a.init, KB_INIT_NORMAL);
    assert_int_equal(a.optimizer.kind, KB_OPT_ADAM);
    assert_true(a.immediate);
    assert_int_equal(a.outlier.rule, KB_OUTLIER_NONE);

    /* to_proto, through the wire bytes, and back. */
    kb_table_config_wire_t wire;
    kb_table_config_to_proto(&a, &wire);
    size_t len = carls__table_config__get_packed_size(&wire.config);
    uint8_t *buf = malloc(len ? len : 1);
    assert_non_null(buf);
    assert_int_equal(carls__table_config__pack(&wire.config, buf), len);
    Carls__TableConfig *back = carls__table_config__unpack(NULL, len, buf);
    assert_non_null(back);
    assert_int_equal(kb_table_config_from_proto(back, CARLS_DEFAULT_MAX_DIM, &b, err, sizeof err), 0);
    carls__table_config__free_unpacked(back, NULL);
    free(buf);

    assert_int_equal(b.dim, a.dim);
    assert_int_equal(b.init, a.init);
    assert_true(b.init_scale == a.init_scale);
    assert_int_equal(b.init_seed, a.init_seed);
    assert_int_equal(b.optimizer.kind, a.optimizer.kind);
    assert_true(b.optimizer.learning_rate == a.optimizer.learning_rate);
    assert_true(b.optimizer.momentum == a.optimizer.momentum);
    assert_true(b.optimizer.beta1 == a.optimizer.beta1);
    assert_true(b.optimizer.beta2 == a.optimizer.beta2);
    assert_true(b.optimizer.epsilon == a.optimizer.epsilon);
    assert_true(b.optimizer.initial_accumulator == a.optimizer.initial_accumulator);
    assert_int_equal(b.immediate, a.immediate);
    assert_int_equal(b.max_age_ms, a.max_age_ms);
    assert_int_equal(b.max_pending, a.max_pending);
    assert_int_equal(b.outlier.rule, a.outlier.rule);
    assert_true(b.outlier.threshold == a.outlier.threshold);
    assert_int_equal(b.outlier.min_count, a.outlier.min_count);
    /* And the values asked for survived. */
    assert_true(b.init_scale == 0.2f);
    assert_true(b.optimizer.learning_rate == 0.05f);
    assert_true(b.optimizer.beta1 == 0.8f);
    assert_int_equal(b.max_age_ms, 250);
    assert_int_equal(b.max_pending, 7);
    assert_true(b.outlier.threshold == 4.5f);
    assert_int_equal(b.outlier.min_count, 5);

    /* The lazy policy and the median rule survive too (their wire values are the zero enums). */
    a.immediate = false;
    a.outlier.rule = KB_OUTLIER_NORM_MEDIAN;
    kb_table_config_to_proto(&a, &wire);
    assert_int_equal(kb_table_config_from_proto(&wire.config, CARLS_DEFAULT_MAX_DIM, &b, err, sizeof err), 0);
    assert_false(b.immediate);
    assert_int_equal(b.outlier.rule, KB_OUTLIER_NORM_MEDIAN);
}

/* The table's own config, made without the wire: kb_table_config_finish fills the same defaults, clears what
 * a policy does not use, refuses what the wire conversion refuses, and finishing twice changes nothing (the
 * bank compares configs with memcmp). */
static void test_config_plain(void **st)
{
    (void)st;
    kb_table_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dim = 8;
    cfg.bloom_hashes = 9; /* unused under ADMIT_ALL: cleared */
    char err[256] = "";
    assert_int_equal(kb_table_config_finish(&cfg, 100, err, sizeof err), 0);
    assert_float_equal(cfg.init_scale, 0.05f, 1e-9);
    assert_float_equal(cfg.optimizer.learning_rate, 0.01f, 1e-9);
    assert_int_equal(cfg.max_age_ms, 1000);
    assert_int_equal(cfg.max_pending, 16);
    assert_float_equal(cfg.outlier.threshold, 3.0f, 1e-9);
    assert_int_equal(cfg.outlier.min_count, 3);
    assert_int_equal(cfg.bloom_hashes, 0);

    /* Equal to the wire's config of the same table, and unchanged by a second finish. */
    Carls__TableConfig tc;
    carls__table_config__init(&tc);
    tc.dim = 8;
    kb_table_config_t wire;
    assert_int_equal(kb_table_config_from_proto(&tc, 100, &wire, err, sizeof err), 0);
    assert_memory_equal(&cfg, &wire, sizeof cfg);
    assert_int_equal(kb_table_config_finish(&wire, 100, err, sizeof err), 0);
    assert_memory_equal(&cfg, &wire, sizeof cfg);

    cfg.max_pending = KB_TABLE_MAX_PENDING + 1;
    assert_int_equal(kb_table_config_finish(&cfg, 100, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_pending"));

    kb_table_config_t feat;
    memset(&feat, 0, sizeof feat);
    feat.kind = KB_TABLE_FEATURE;
    feat.dim = 4;
    assert_int_equal(kb_table_config_finish(&feat, 100, err, sizeof err), -1);
    feat.dim = 0;
    feat.init_scale = 0.5f; /* an embedding field: cleared */
    feat.admission = KB_ADMIT_BLOOM;
    assert_int_equal(kb_table_config_finish(&feat, 100, err, sizeof err), 0);
    assert_true(feat.init_scale == 0.0f);
    assert_int_equal(feat.max_pending, 1);
    assert_int_equal(feat.min_frequency, 2);
    assert_int_equal(feat.bloom_bits_log2, 20);
    assert_int_equal(feat.bloom_hashes, 4);
}

/* ---- lookup / put ---- */

static void test_lookup_creates_with_initializer(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(3, "emb", &(s_spec_t){.dim = 5, .init = CARLS__INIT_KIND__INIT_UNIFORM,
                                                      .init_scale = 0.1f, .init_seed = 7});
    assert_int_equal(kb_table_id(t), 3);
    assert_string_equal(kb_table_name(t), "emb");
    assert_int_equal(kb_table_config(t)->dim, 5);

    const char *names[3] = {"alpha", "beta", "gamma"};
    ProtobufCBinaryData keys[3];
    for (int i = 0; i < 3; i++)
        keys[i] = s_key(names[i]);
    float want[3][5];
    for (int i = 0; i < 3; i++)
        kb_init_value(KB_INIT_UNIFORM, 0.1f, 7, keys[i].data, keys[i].len, want[i], 5);
    /* The keys really get different initial values (or the comparisons below would prove little). */
    assert_memory_not_equal(want[0], want[1], sizeof want[0]);

    float vals[3][5];
    uint64_t versions[3], freqs[3];
    int64_t updated[3];

    /* no_create: answered with the initial value, frequency 0, nothing created. */
    memset(vals, 0xff, sizeof vals);
    kb_table_lookup(t, keys, 3, true, &vals[0][0], versions, updated, freqs);
    assert_memory_equal(vals, want, sizeof want);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(versions[i], 0);
        assert_int_equal(updated[i], 0);
        assert_int_equal(freqs[i], 0);
    }
    assert_int_equal(kb_table_row_count(t), 0);
    kb_store_row_t *recs = NULL;
    size_t n = 0, cap = 0;
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 0);

    /* A plain lookup creates them with the same values. */
    memset(vals, 0xff, sizeof vals);
    kb_table_lookup(t, keys, 3, false, &vals[0][0], versions, updated, freqs);
    assert_memory_equal(vals, want, sizeof want);
    assert_int_equal(kb_table_row_count(t), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(versions[i], 0);
        assert_int_equal(updated[i], 0); /* never changed */
        assert_int_equal(freqs[i], 1);
    }
    /* A second lookup counts again; no_create on an existing key reads the stored row. */
    kb_table_lookup(t, keys, 3, false, &vals[0][0], versions, updated, freqs);
    for (int i = 0; i < 3; i++)
        assert_int_equal(freqs[i], 2);
    kb_table_lookup(t, keys, 3, true, &vals[0][0], versions, updated, freqs);
    assert_memory_equal(vals, want, sizeof want);
    for (int i = 0; i < 3; i++)
        assert_true(freqs[i] >= 2);
    assert_int_equal(kb_table_row_count(t), 3);

    /* The same key twice in one batch is one row. */
    ProtobufCBinaryData twice[2] = {s_key("delta"), s_key("delta")};
    float v2[2][5];
    kb_table_lookup(t, twice, 2, false, &v2[0][0], versions, updated, freqs);
    assert_int_equal(kb_table_row_count(t), 4);
    assert_int_equal(freqs[0], 1);
    assert_int_equal(freqs[1], 2);

    kb_table_stats_t s;
    s_stats(t, &s);
    assert_int_equal(s.rows, 4);
    assert_int_equal(s.lookups, 14);
    kb_table_destroy(&t);
    assert_null(t);
    kb_table_destroy(&t);
    free(recs);
}

static void test_put_then_lookup(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 3, .init = CARLS__INIT_KIND__INIT_NORMAL,
                                                    .init_scale = 1.0f});
    ProtobufCBinaryData keys[2] = {s_key("a"), s_key("b")};
    const float vals[2][3] = {{1.5f, -2.0f, 3.25f}, {0.0f, 7.0f, -0.5f}};
    int64_t before = carls_wall_ms();
    kb_table_put(t, keys, 2, &vals[0][0], 17);
    int64_t after = carls_wall_ms();
    assert_int_equal(kb_table_row_count(t), 2);

    float got[3];
    uint64_t version, freq;
    int64_t updated;
    s_lookup1(t, "a", false, got, &version, &updated, &freq);
    assert_memory_equal(got, vals[0], sizeof got);
    assert_int_equal(version, 17);
    assert_true(updated >= before && updated <= after);
    assert_int_equal(freq, 1);
    s_lookup1(t, "b", true, got, &version, &updated, &freq);
    assert_memory_equal(got, vals[1], sizeof got);
    assert_int_equal(version, 17);
    assert_true(updated != 0);

    /* A second put overwrites value and version. */
    const float again[3] = {9.0f, 8.0f, 7.0f};
    kb_table_put(t, keys, 1, again, 18);
    s_lookup1(t, "a", false, got, &version, NULL, &freq);
    assert_memory_equal(got, again, sizeof got);
    assert_int_equal(version, 18);
    assert_int_equal(freq, 2);
    kb_table_stats_t s;
    s_stats(t, &s);
    assert_int_equal(s.puts, 3);
    assert_int_equal(s.rows, 2);
    kb_table_destroy(&t);
}

/* ---- lazy updates ---- */

/* DESIGN.md's lazy update: gradients wait; the next lookup applies their average in ONE SGD step. */
static void test_lazy_push_applies_on_lookup(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 3, .lr = 0.5f});
    ProtobufCBinaryData k = s_key("k");
    const float start[3] = {1.0f, 2.0f, 3.0f};
    kb_table_put(t, &k, 1, start, 1);

    /* Three gradients of similar norm (none is an outlier): mean (3, 4, 5). */
    const float g[3][3] = {{1, 2, 3}, {3, 4, 5}, {5, 6, 7}};
    assert_int_equal(kb_table_push(t, &k, 1, g[0]), 0);
    ProtobufCBinaryData kk[2] = {k, k};
    assert_int_equal(kb_table_push(t, kk, 2, &g[1][0]), 0);

    s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 1, .pending_gradients = 3, .gradients_received = 3});

    /* The value has not moved yet: the persisted state shows the old value and the three waiting rows. */
    kb_store_row_t *recs = NULL;
    size_t n = 0, cap = 0;
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 1);
    assert_memory_equal(recs[0].value, start, sizeof start);
    assert_int_equal(recs[0].version, 1);
    assert_int_equal(recs[0].pending_count, 3);
    assert_memory_equal(recs[0].pending, g, sizeof g);
    s_free_records(recs, n);
    n = 0;

    /* Looking up another key leaves this one alone. */
    float other[3];
    s_lookup1(t, "other", false, other, NULL, NULL, NULL);
    s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 1, .pending_gradients = 3, .gradients_received = 3});

    float got[3];
    uint64_t version, freq;
    int64_t updated;
    int64_t before = carls_wall_ms();
    uint64_t steps = kb_table_lookup(t, &k, 1, false, got, &version, &updated, &freq);
    assert_int_equal(steps, 1);
    const float want[3] = {1.0f - 0.5f * 3.0f, 2.0f - 0.5f * 4.0f, 3.0f - 0.5f * 5.0f};
    for (int i = 0; i < 3; i++)
        assert_float_equal(got[i], want[i], 1e-6);
    assert_int_equal(version, 2); /* one applied update */
    assert_true(updated >= before);
    assert_int_equal(freq, 4); /* three gradient rows and this lookup */
    const s_lazy_counts_t applied = {
        .gradients_received = 3, .gradients_applied = 3, .updates_applied = 1, .applied_on_lookup = 1};
    s_expect_lazy(t, applied);

    /* Nothing pending any more: the next lookup takes no step and returns the same value. */
    float again[3];
    assert_int_equal(kb_table_lookup(t, &k, 1, false, again, &version, &updated, &freq), 0);
    assert_memory_equal(again, got, sizeof got);
    s_expect_lazy(t, applied);

    /* A gradient pushed for a key that was never seen creates it and waits too. */
    const float g1[3] = {2.0f, 2.0f, 2.0f};
    ProtobufCBinaryData fresh = s_key("fresh");
    assert_int_equal(kb_table_push(t, &fresh, 1, g1), 0);
    assert_int_equal(kb_table_row_count(t), 3);
    s_lookup1(t, "fresh", true, got, &version, NULL, NULL);
    for (int i = 0; i < 3; i++)
        assert_float_equal(got[i], 0.0f - 0.5f * 2.0f, 1e-6);
    assert_int_equal(version, 1);
    s_expect_lazy(t, (s_lazy_counts_t){.gradients_received = 4, .gradients_applied = 4, .updates_applied = 2,
                                       .applied_on_lookup = 2});
    free(recs);
    kb_table_destroy(&t);
}

/* A wide row (more floats than fit a small stack buffer) takes the same path: average, one step. */
static void test_lazy_wide_rows(void **st)
{
    (void)st;
    enum { DIM = 1000 };
    kb_table_t *t = s_new_table(1, "wide", &(s_spec_t){.dim = DIM, .lr = 0.25f,
                                                       .outlier = CARLS__OUTLIER_RULE__OUTLIER_NONE});
    static float g[2][DIM], got[DIM];
    for (int i = 0; i < DIM; i++) {
        g[0][i] = (float)(i % 17);
        g[1][i] = (float)(i % 5) - 2.0f;
    }
    ProtobufCBinaryData ks[2] = {s_key("w"), s_key("w")};
    assert_int_equal(kb_table_push(t, ks, 2, &g[0][0]), 0);
    uint64_t version;
    s_lookup1(t, "w", false, got, &version, NULL, NULL);
    for (int i = 0; i < DIM; i++)
        assert_float_equal(got[i], -0.25f * (g[0][i] + g[1][i]) / 2.0f, 1e-6);
    assert_int_equal(version, 1);
    kb_table_destroy(&t);
}

/* A put while gradients wait keeps them: they apply on top of the new value. */
static void test_put_keeps_pending(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 2, .lr = 1.0f});
    ProtobufCBinaryData k = s_key("k");
    const float g[2] = {0.25f, -0.5f};
    kb_table_push(t, &k, 1, g);
    const float v[2] = {10.0f, 20.0f};
    kb_table_put(t, &k, 1, v, 5);
    float got[2];
    uint64_t version;
    s_lookup1(t, "k", false, got, &version, NULL, NULL);
    assert_float_equal(got[0], 10.0f - 0.25f, 1e-6);
    assert_float_equal(got[1], 20.0f + 0.5f, 1e-6);
    assert_int_equal(version, 6);
    kb_table_destroy(&t);
}

/* The set is applied when exactly max_pending gradients have gathered, not before. */
static void test_max_pending_trigger(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 2, .lr = 1.0f, .max_pending = 4,
                                                    .outlier = CARLS__OUTLIER_RULE__OUTLIER_NONE});
    ProtobufCBinaryData k = s_key("k");
    const float g[4][2] = {{1, 0}, {2, 0}, {3, 0}, {6, 4}}; /* mean (3, 1) */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kb_table_push(t, &k, 1, g[i]), 0);
        uint64_t waiting = (uint64_t)i + 1;
        s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 1, .pending_gradients = waiting,
                                           .gradients_received = waiting});
    }
    assert_int_equal(kb_table_push(t, &k, 1, g[3]), 1);
    s_expect_lazy(t, (s_lazy_counts_t){.gradients_received = 4, .gradients_applied = 4, .updates_applied = 1,
                                       .applied_on_count = 1});
    float got[2];
    uint64_t version;
    /* no_create lookup: reads the applied value without another step. */
    assert_int_equal(kb_table_lookup(t, &k, 1, true, got, &version, &(int64_t){0}, &(uint64_t){0}), 0);
    assert_float_equal(got[0], -3.0f, 1e-6);
    assert_float_equal(got[1], -1.0f, 1e-6);
    assert_int_equal(version, 1);

    /* Six rows for the key in one call: the first four apply, two stay pending. */
    const float b[6][2] = {{1, 1}, {1, 1}, {1, 1}, {1, 1}, {2, 2}, {4, 4}};
    ProtobufCBinaryData ks[6] = {k, k, k, k, k, k};
    assert_int_equal(kb_table_push(t, ks, 6, &b[0][0]), 1);
    s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 1, .pending_gradients = 2, .gradients_received = 10,
                                       .gradients_applied = 8, .updates_applied = 2, .applied_on_count = 2});
    assert_int_equal(kb_table_lookup(t, &k, 1, false, got, &version, &(int64_t){0}, &(uint64_t){0}), 1);
    assert_float_equal(got[0], -3.0f - 1.0f - 3.0f, 1e-6);
    assert_float_equal(got[1], -1.0f - 1.0f - 3.0f, 1e-6);
    assert_int_equal(version, 3);
    kb_table_destroy(&t);
}

/* Finds n distinct keys "<prefix><i>" that fall into the same stripe, so expire() has to walk one pending
 * list (keys in other stripes would pass as well; this makes the order within a list matter). */
static void s_same_stripe_keys(const char *prefix, char out[][32], int n)
{
    uint64_t want = UINT64_MAX;
    int found = 0;
    for (int i = 0; found < n && i < 100000; i++) {
        char buf[32];
        int len = snprintf(buf, sizeof buf, "%s%d", prefix, i);
        uint64_t stripe = (kb_rowmap_hash(buf, (size_t)len) >> 58) % KB_TABLE_STRIPES;
        if (want == UINT64_MAX)
            want = stripe;
        if (stripe == want)
            memcpy(out[found++], buf, (size_t)len + 1);
    }
    assert_int_equal(found, n);
}

/* expire(now) applies exactly the sets that have waited max_age_ms, oldest first; younger ones stay. */
static void test_expire_by_age(void **st)
{
    (void)st;
    const uint32_t age = 100;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 1, .lr = 1.0f, .max_age_ms = age});
    char names[3][32];
    s_same_stripe_keys("age", names, 3);
    ProtobufCBinaryData ka = s_key(names[0]), kb = s_key(names[1]), kc = s_key(names[2]);
    const float ga = 1.0f, gb = 2.0f, gc = 4.0f, ga2 = 8.0f;

    int64_t t0 = carls_monotonic_ms();
    kb_table_push(t, &ka, 1, &ga);
    int64_t t1 = carls_monotonic_ms();
    s_sleep_ms(20);
    int64_t t2 = carls_monotonic_ms();
    kb_table_push(t, &kb, 1, &gb);
    kb_table_push(t, &kc, 1, &gc);
    int64_t t3 = carls_monotonic_ms();
    assert_true(t2 > t1);

    /* Nothing is old enough yet (times are passed in, no waiting). */
    assert_int_equal(kb_table_expire(t, t0 + age - 1), 0);
    assert_int_equal(kb_table_expire(t, t0), 0);
    s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 3, .pending_gradients = 3, .gradients_received = 3});

    /* At t1 + age only A has waited long enough (B and C arrived after t2 > t1). */
    assert_int_equal(kb_table_expire(t, t1 + age), 1);
    s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 2, .pending_gradients = 2, .gradients_received = 3,
                                       .gradients_applied = 1, .updates_applied = 1, .applied_on_age = 1});
    float v;
    uint64_t version;
    s_lookup1(t, names[0], true, &v, &version, NULL, NULL);
    assert_float_equal(v, -1.0f, 1e-6);
    assert_int_equal(version, 1);

    /* A gets a new gradient: its new set is the youngest, behind B and C. */
    s_sleep_ms(20);
    int64_t t4 = carls_monotonic_ms();
    kb_table_push(t, &ka, 1, &ga2);
    assert_true(t4 > t3);

    /* At t3 + age, B and C are due but A's new set is not. */
    assert_int_equal(kb_table_expire(t, t3 + age), 2);
    s_expect_lazy(t, (s_lazy_counts_t){.pending_keys = 1, .pending_gradients = 1, .gradients_received = 4,
                                       .gradients_applied = 3, .updates_applied = 3, .applied_on_age = 3});
    s_lookup1(t, names[1], true, &v, NULL, NULL, NULL);
    assert_float_equal(v, -2.0f, 1e-6);
    s_lookup1(t, names[2], true, &v, NULL, NULL, NULL);
    assert_float_equal(v, -4.0f, 1e-6);
    /* Calling again at the same time changes nothing. */
    assert_int_equal(kb_table_expire(t, t3 + age), 0);

    /* Much later: A's second set goes too; A has had two steps. */
    assert_int_equal(kb_table_expire(t, carls_monotonic_ms() + age), 1);
    s_expect_lazy(t, (s_lazy_counts_t){.gradients_received = 4, .gradients_applied = 4, .updates_applied = 4,
                                       .applied_on_age = 4});
    s_lookup1(t, names[0], true, &v, &version, NULL, NULL);
    assert_float_equal(v, -1.0f - 8.0f, 1e-6);
    assert_int_equal(version, 2);
    kb_table_destroy(&t);
}

/* Immediate policy: every gradient is its own step at once; nothing waits. */
static void test_immediate_policy(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 2, .lr = 0.5f,
                                                    .policy = CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE});
    ProtobufCBinaryData ks[3] = {s_key("k"), s_key("k"), s_key("j")};
    const float g[3][2] = {{1, 2}, {3, 4}, {2, 2}};
    assert_int_equal(kb_table_push(t, ks, 3, &g[0][0]), 3);
    const s_lazy_counts_t immediate = {.gradients_received = 3, .gradients_applied = 3, .updates_applied = 3};
    s_expect_lazy(t, immediate);
    assert_int_equal(kb_table_expire(t, carls_monotonic_ms() + 1000000), 0);

    float v[2];
    uint64_t version;
    assert_int_equal(kb_table_lookup(t, ks, 1, false, v, &version, &(int64_t){0}, &(uint64_t){0}), 0);
    assert_float_equal(v[0], -0.5f * 1 - 0.5f * 3, 1e-6);
    assert_float_equal(v[1], -0.5f * 2 - 0.5f * 4, 1e-6);
    assert_int_equal(version, 2);
    s_lookup1(t, "j", false, v, &version, NULL, NULL);
    assert_float_equal(v[0], -1.0f, 1e-6);
    assert_int_equal(version, 1);
    s_expect_lazy(t, immediate);
    kb_table_destroy(&t);
}

/* ---- persistence hooks ---- */

/* Reads only count uses: take_frequencies hands each read row over once as a frequency-only record (key,
 * row id, count; no value), take_dirty never; a row that is also changed goes whole, with its count, once. */
static void test_take_frequencies(void **st)
{
    (void)st;
    s_spec_t spec = {.dim = 2, .opt = CARLS__OPTIMIZER_KIND__OPT_SGD, .lr = 0.1f};
    kb_table_t *t = s_new_table(3, "t", &spec);
    kb_store_row_t *recs = NULL;
    size_t n = 0, cap = 0;
    float got[2];

    /* Creating lookups make the rows dirty: whole records, frequency 1, and no frequency record. */
    s_lookup1(t, "a", false, got, NULL, NULL, NULL);
    s_lookup1(t, "b", false, got, NULL, NULL, NULL);
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 0);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 2);
    assert_false(recs[0].frequency_only);
    assert_int_equal(recs[0].frequency, 1);
    int64_t id_a = s_find_record(recs, n, "a")->row_id;
    s_free_records(recs, n);
    n = 0;

    /* Three reads of a, one of b, and a no_create read of a (not counted). */
    for (int i = 0; i < 3; i++)
        s_lookup1(t, "a", false, got, NULL, NULL, NULL);
    s_lookup1(t, "b", false, got, NULL, NULL, NULL);
    s_lookup1(t, "a", true, got, NULL, NULL, NULL);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 0);
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 2);
    const kb_store_row_t *ra = s_find_record(recs, n, "a");
    const kb_store_row_t *rb = s_find_record(recs, n, "b");
    assert_non_null(ra);
    assert_non_null(rb);
    assert_true(ra->frequency_only && rb->frequency_only);
    assert_int_equal(ra->table_id, 3);
    assert_int_equal(ra->row_id, id_a);
    assert_int_equal(ra->frequency, 4);
    assert_int_equal(rb->frequency, 2);
    assert_null(ra->value);
    assert_null(ra->opt_state);
    s_free_records(recs, n);
    n = 0;
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 0);

    /* Read, then changed: one whole record carrying the count, no frequency record. */
    s_lookup1(t, "a", false, got, NULL, NULL, NULL);
    ProtobufCBinaryData ka = s_key("a");
    const float v[2] = {1.0f, 2.0f};
    kb_table_put(t, &ka, 1, v, 7);
    s_lookup1(t, "a", false, got, NULL, NULL, NULL); /* changed, then read: still one whole record */
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 0);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 1);
    assert_false(recs[0].frequency_only);
    assert_int_equal(recs[0].frequency, 6);
    assert_int_equal(recs[0].version, 7);
    s_free_records(recs, n);
    n = 0;

    /* A lookup that applies pending gradients changes the value: whole record. */
    const float g[2] = {0.5f, 0.5f};
    kb_table_push(t, &ka, 1, g);
    kb_table_take_dirty(t, &recs, &n, &cap); /* the push itself (pending gradients are persisted) */
    assert_int_equal(n, 1);
    s_free_records(recs, n);
    n = 0;
    s_lookup1(t, "a", false, got, NULL, NULL, NULL);
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 0);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 1);
    assert_int_equal(recs[0].version, 8);
    assert_int_equal(recs[0].pending_count, 0);
    s_free_records(recs, n);
    free(recs);
    kb_table_destroy(&t);
}

/* A row read (marked for its count) and then evicted leaves the frequency list: its deletion is the one
 * record, and take_frequencies after it is freed touches nothing (ASan checks). */
static void test_take_frequencies_evicted_row(void **st)
{
    (void)st;
    s_spec_t spec = {.dim = 2, .opt = CARLS__OPTIMIZER_KIND__OPT_SGD, .lr = 0.1f};
    kb_table_config_t cfg = s_config(&spec);
    cfg.eviction = KB_EVICT_OLDEST;
    cfg.max_rows = 4;
    kb_table_t *t = kb_table_new(4, "t", &cfg);
    kb_store_row_t *recs = NULL;
    size_t n = 0, cap = 0;
    float got[2];
    s_lookup1(t, "first", false, got, NULL, NULL, NULL);
    kb_table_take_dirty(t, &recs, &n, &cap);
    s_free_records(recs, n);
    n = 0;
    s_lookup1(t, "first", false, got, NULL, NULL, NULL); /* marked for its count only */
    /* New rows until "first", the oldest, is evicted (eviction samples stripes, so when is not fixed). */
    bool evicted = false;
    char buf[16];
    for (int i = 0; i < 100000 && !evicted; i++) {
        snprintf(buf, sizeof buf, "k%d", i);
        s_lookup1(t, buf, false, got, NULL, NULL, NULL);
        kb_table_take_dirty(t, &recs, &n, &cap); /* frees the evicted rows */
        const kb_store_row_t *gone = s_find_record(recs, n, "first");
        evicted = gone && gone->deleted;
        s_free_records(recs, n);
        n = 0;
    }
    assert_true(evicted);
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 0);
    free(recs);
    kb_table_destroy(&t);
}

/* take_dirty hands over each changed row once with its full state, then nothing until the next change. */
static void test_take_dirty(void **st)
{
    (void)st;
    s_spec_t spec = {.dim = 2, .opt = CARLS__OPTIMIZER_KIND__OPT_ADAM, .lr = 0.1f};
    kb_table_config_t cfg = s_config(&spec);
    kb_table_t *t = kb_table_new(9, "t", &cfg);
    const uint32_t opt_floats = 4; /* Adam: m and v, dim each */

    kb_store_row_t *recs = NULL;
    size_t n = 0, cap = 0;
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 0);

    ProtobufCBinaryData k1 = s_key("one"), k2 = s_key("two");
    const float v1[2] = {1.0f, -1.0f};
    kb_table_put(t, &k1, 1, v1, 4);
    const float g2[2] = {0.5f, -0.25f};
    kb_table_push(t, &k2, 1, g2);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 2);
    assert_true(cap >= n);
    const kb_store_row_t *r1 = s_find_record(recs, n, "one");
    const kb_store_row_t *r2 = s_find_record(recs, n, "two");
    assert_non_null(r1);
    assert_non_null(r2);
    assert_int_equal(r1->table_id, 9);
    assert_int_equal(r1->dim, 2);
    assert_memory_equal(r1->value, v1, sizeof v1);
    assert_int_equal(r1->version, 4);
    assert_int_equal(r1->pending_count, 0);
    assert_int_equal(r1->opt_floats, opt_floats);
    for (uint32_t i = 0; i < opt_floats; i++)
        assert_true(r1->opt_state[i] == 0.0f);
    assert_int_equal(r1->opt_steps, 0);
    assert_true(r1->updated_at_ms > 0);
    assert_int_equal(r2->pending_count, 1);
    assert_memory_equal(r2->pending, g2, sizeof g2);
    assert_int_equal(r2->frequency, 1);
    const float zeros[2] = {0.0f, 0.0f};
    assert_memory_equal(r2->value, zeros, sizeof zeros);
    assert_true(r1->row_id != r2->row_id);
    int64_t id2 = r2->row_id;
    s_free_records(recs, n);
    n = 0;

    /* Nothing changed since: nothing to take. */
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 0);

    /* The lookup applies two's pending gradient with one Adam step. */
    float got[2];
    s_lookup1(t, "two", false, got, NULL, NULL, NULL);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 1);
    assert_int_equal(recs[0].key_len, 3);
    assert_memory_equal(recs[0].key, "two", 3);
    assert_int_equal(recs[0].row_id, id2);
    assert_int_equal(recs[0].pending_count, 0);
    assert_null(recs[0].pending);
    assert_int_equal(recs[0].opt_steps, 1);
    assert_int_equal(recs[0].version, 1);
    assert_int_equal(recs[0].frequency, 2);
    assert_memory_equal(recs[0].value, got, sizeof got);
    /* After one step from zero state: m = (1-b1) g, v = (1-b2) g^2, and the step is about lr * sign(g). */
    const float b1 = cfg.optimizer.beta1, b2 = cfg.optimizer.beta2;
    for (int i = 0; i < 2; i++) {
        assert_float_equal(recs[0].opt_state[i], (1.0f - b1) * g2[i], 1e-6);
        assert_float_equal(recs[0].opt_state[2 + i], (1.0f - b2) * g2[i] * g2[i], 1e-7);
    }
    assert_float_equal(got[0], -0.1f, 1e-4);
    assert_float_equal(got[1], 0.1f, 1e-4);
    s_free_records(recs, n);
    n = 0;
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 0);

    /* A counted lookup changes only the use count: the row stays clean (reads never rewrite a row). */
    s_lookup1(t, "one", false, got, NULL, NULL, NULL);
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 0);
    kb_table_take_frequencies(t, &recs, &n, &cap);
    assert_int_equal(n, 1);
    assert_true(recs[0].frequency_only);
    assert_int_equal(recs[0].frequency, 1);
    s_free_records(recs, n);
    n = 0;

    /* Many rows changed at once: the output array grows; records are appended after existing ones. */
    char buf[32];
    for (int i = 0; i < 1000; i++) {
        int len = snprintf(buf, sizeof buf, "many%d", i);
        ProtobufCBinaryData k = {.len = (size_t)len, .data = (uint8_t *)buf};
        kb_table_put(t, &k, 1, v1, (uint64_t)i);
    }
    kb_table_take_dirty(t, &recs, &n, &cap);
    assert_int_equal(n, 1000);
    for (int i = 0; i < 1000; i++) {
        snprintf(buf, sizeof buf, "many%d", i);
        const kb_store_row_t *r = s_find_record(recs, n, buf);
        assert_non_null(r);
        assert_int_equal(r->version, (uint64_t)i);
    }
    s_free_records(recs, n);
    free(recs);
    kb_table_destroy(&t);
}

/* Taken records restored into a fresh table reproduce the rows: the same operation on both tables gives the
 * same result, and new rows get ids that do not collide with the restored ones. */
static void test_restore_round_trip(void **st)
{
    (void)st;
    s_spec_t spec = {.dim = 3, .init = CARLS__INIT_KIND__INIT_UNIFORM, .init_scale = 0.5f, .init_seed = 3,
                     .opt = CARLS__OPTIMIZER_KIND__OPT_ADAM, .lr = 0.05f, .max_pending = 5};
    kb_table_config_t cfg = s_config(&spec);
    kb_table_t *a = kb_table_new(2, "a", &cfg);
    uint64_t rng = 12345;
    enum { KEYS = 40 };
    char names[KEYS][16];
    for (int i = 0; i < KEYS; i++)
        snprintf(names[i], sizeof names[i], "r%d", i);
    for (int op = 0; op < 600; op++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int i = (int)((rng >> 33) % KEYS);
        ProtobufCBinaryData k = s_key(names[i]);
        float g[3] = {(float)((rng >> 20) % 7) - 3.0f, 0.5f, -0.25f * (float)(op % 5)};
        switch ((rng >> 40) % 4) {
        case 0: kb_table_put(a, &k, 1, g, (uint64_t)op); break;
        case 1: s_lookup1(a, names[i], false, g, NULL, NULL, NULL); break;
        default: kb_table_push(a, &k, 1, g); break;
        }
    }
    kb_table_stats_t sa;
    s_stats(a, &sa);
    assert_true(sa.pending_keys > 0); /* some rows carry pending gradients into the restore */

    kb_store_row_t *recs = NULL;
    size_t n = 0, cap = 0;
    kb_table_take_dirty(a, &recs, &n, &cap);
    assert_int_equal(n, kb_table_row_count(a));
    int64_t max_id = 0;
    for (size_t i = 0; i < n; i++)
        if (recs[i].row_id > max_id)
            max_id = recs[i].row_id;

    /* Restore in reverse order (the highest ids are not necessarily last). */
    kb_table_t *b = kb_table_new(2, "a", &cfg);
    for (size_t i = n; i-- > 0;)
        assert_int_equal(kb_table_restore_row(b, &recs[i]), 0);
    assert_int_equal(kb_table_row_count(b), n);
    kb_table_stats_t sb;
    s_stats(b, &sb);
    assert_int_equal(sb.pending_keys, sa.pending_keys);
    assert_int_equal(sb.pending_gradients, sa.pending_gradients);
    /* The same record again is refused: the key exists. */
    assert_int_equal(kb_table_restore_row(b, &recs[0]), -1);
    assert_int_equal(kb_table_row_count(b), n);

    /* One more gradient for every key in both tables, then compare the persisted state row by row. */
    for (int i = 0; i < KEYS; i++) {
        ProtobufCBinaryData k = s_key(names[i]);
        const float g[3] = {0.1f, 0.2f, 0.3f};
        kb_table_push(a, &k, 1, g);
        kb_table_push(b, &k, 1, g);
    }
    kb_store_row_t *ra = NULL, *rb = NULL;
    size_t na = 0, nb = 0, ca = 0, cb = 0;
    kb_table_take_dirty(a, &ra, &na, &ca);
    kb_table_take_dirty(b, &rb, &nb, &cb);
    assert_int_equal(na, KEYS);
    assert_int_equal(nb, KEYS);
    for (int i = 0; i < KEYS; i++) {
        const kb_store_row_t *x = s_find_record(ra, na, names[i]);
        const kb_store_row_t *y = s_find_record(rb, nb, names[i]);
        assert_non_null(x);
        assert_non_null(y);
        assert_int_equal(x->row_id, y->row_id);
        assert_int_equal(x->version, y->version);
        assert_int_equal(x->frequency, y->frequency);
        assert_int_equal(x->opt_steps, y->opt_steps);
        assert_int_equal(x->pending_count, y->pending_count);
        assert_memory_equal(x->value, y->value, 3 * sizeof(float));
        assert_memory_equal(x->opt_state, y->opt_state, x->opt_floats * sizeof(float));
        if (x->pending_count)
            assert_memory_equal(x->pending, y->pending, (size_t)x->pending_count * 3 * sizeof(float));
    }
    /* Applying everything gives the same values in both. */
    for (int i = 0; i < KEYS; i++) {
        float va[3], vb[3];
        uint64_t ver_a, ver_b;
        s_lookup1(a, names[i], false, va, &ver_a, NULL, NULL);
        s_lookup1(b, names[i], false, vb, &ver_b, NULL, NULL);
        assert_memory_equal(va, vb, sizeof va);
        assert_int_equal(ver_a, ver_b);
    }

    /* New rows in the restored table get ids above every restored one, all distinct. */
    s_free_records(ra, na);
    s_free_records(rb, nb);
    nb = 0;
    /* Clear the marks of the lookups: a row whose pending set they applied is dirty, the others only read. */
    kb_table_take_dirty(b, &rb, &nb, &cb);
    kb_table_take_frequencies(b, &rb, &nb, &cb);
    assert_int_equal(nb, KEYS);
    s_free_records(rb, nb);
    for (int i = 0; i < 20; i++) {
        char buf[16];
        snprintf(buf, sizeof buf, "new%d", i);
        float v[3];
        s_lookup1(b, buf, false, v, NULL, NULL, NULL);
    }
    nb = 0;
    kb_table_take_dirty(b, &rb, &nb, &cb);
    assert_int_equal(nb, 20);
    for (size_t i = 0; i < nb; i++) {
        assert_true(rb[i].row_id > max_id);
        for (size_t j = 0; j < i; j++)
            assert_true(rb[i].row_id != rb[j].row_id);
    }
    s_free_records(rb, nb);
    s_free_records(recs, n);
    free(recs);
    free(ra);
    free(rb);
    kb_table_destroy(&a);
    kb_table_destroy(&b);
}

/* Records that do not fit the table are refused and leave it unchanged. */
static void test_restore_rejects_mismatch(void **st)
{
    (void)st;
    kb_table_t *t = s_new_table(1, "t", &(s_spec_t){.dim = 4, .opt = CARLS__OPTIMIZER_KIND__OPT_MOMENTUM,
                                                    .max_pending = 2});
    float value[5] = {1, 2, 3, 4, 5};
    float opt[5] = {0};
    float pending[3 * 4] = {0};
    kb_store_row_t rec = {.table_id = 1, .key = (uint8_t *)"k", .key_len = 1, .row_id = 1, .value = value,
                          .dim = 5, .opt_state = opt, .opt_floats = 4};
    assert_int_equal(kb_table_restore_row(t, &rec), -1); /* dim 5 into a dim-4 table */
    rec.dim = 3;
    assert_int_equal(kb_table_restore_row(t, &rec), -1);
    rec.dim = 4;
    rec.opt_floats = 0; /* momentum keeps dim floats */
    assert_int_equal(kb_table_restore_row(t, &rec), -1);
    rec.opt_floats = 4;
    rec.pending = pending;
    rec.pending_count = 3; /* more than max_pending */
    assert_int_equal(kb_table_restore_row(t, &rec), -1);
    assert_int_equal(kb_table_row_count(t), 0);
    kb_table_stats_t s;
    s_stats(t, &s);
    assert_int_equal(s.pending_keys, 0);

    /* The fitting record is accepted. */
    rec.pending_count = 2;
    assert_int_equal(kb_table_restore_row(t, &rec), 0);
    assert_int_equal(kb_table_row_count(t), 1);
    s_stats(t, &s);
    assert_int_equal(s.pending_gradients, 2);
    kb_table_destroy(&t);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_config_defaults),
    cmocka_unit_test(test_config_rejections),
    cmocka_unit_test(test_config_round_trip),
    cmocka_unit_test(test_config_plain),
    cmocka_unit_test(test_lookup_creates_with_initializer),
    cmocka_unit_test(test_put_then_lookup),
    cmocka_unit_test(test_lazy_push_applies_on_lookup),
    cmocka_unit_test(test_lazy_wide_rows),
    cmocka_unit_test(test_put_keeps_pending),
    cmocka_unit_test(test_max_pending_trigger),
    cmocka_unit_test(test_expire_by_age),
    cmocka_unit_test(test_immediate_policy),
    cmocka_unit_test(test_take_dirty),
    cmocka_unit_test(test_take_frequencies),
    cmocka_unit_test(test_take_frequencies_evicted_row),
    cmocka_unit_test(test_restore_round_trip),
    cmocka_unit_test(test_restore_rejects_mismatch))
