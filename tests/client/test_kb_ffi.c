/* The shared library's API (client/kb_ffi.h), linked from libcarls_client.so itself, against one real
 * kb-server on loopback: every call, both forms of key lists, the settings of create_table and their
 * errors, statuses by number and name, results as JSON (client/kb_json.h) and result keys. Runs under the
 * sanitizers too (the Python tests, which use the same library, cannot). */
#include "kb_ffi.h"
#include "kb_json.h"
#include "carls.pb-c.h"
#include "server_harness.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

typedef struct {
    test_server_t srv;
    kb_ffi_t *h;
} fixture_t;

static int s_setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    test_server_init(&f->srv);
    if (test_server_start(&f->srv, NULL) != 0)
        return -1;
    char err[256];
    /* Generous: a sync commit under the sanitizers on a loaded machine can take seconds; writes are retried
     * exactly once (kb_client.h), so resending is safe. */
    f->h = kb_ffi_open(f->srv.endpoint, 10000, 2, NULL, NULL, err, sizeof err);
    if (!f->h)
        return -1;
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    fixture_t *f = *state;
    kb_ffi_close(&f->h);
    kb_ffi_close(&f->h); /* accepts a nulled handle */
    int rc = test_server_cleanup(&f->srv);
    free(f);
    return rc == 0 ? 0 : -1;
}

static void test_open_errors(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(kb_ffi_open("", 0, 0, NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "no endpoint"));
    assert_null(kb_ffi_open("tcp://127.0.0.1:1", 0, 0, "/nonexistent/client.key", NULL, err, sizeof err));
    assert_non_null(strstr(err, "both"));
    assert_null(kb_ffi_open("tcp://127.0.0.1:1,tcp://127.0.0.1:1", 0, 0, NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "cannot open"));
    assert_string_equal(kb_ffi_status_name(4), "NOT_FOUND");
    assert_string_equal(kb_ffi_status_name(9999), "UNKNOWN");
    assert_int_equal(kb_ffi_log_level("loud"), KB_FFI_EINVAL);
    assert_int_equal(kb_ffi_log_level(NULL), KB_FFI_EINVAL);
    assert_int_equal(kb_ffi_log_level("info"), 0);
}

static void test_create_table_settings(void **state)
{
    fixture_t *f = *state;
    kb_ffi_t *h = f->h;
    const struct {
        const char *settings, *says;
    } bad[] = {
        {"dim=4\nbogus=1", "TableConfig has no field 'bogus'"},
        {"dim=4\noptimizer.kind=sgdx", "'sgdx' is none of sgd, momentum, adagrad, adam"},
        {"dim=-4", "is not an integer"},
        {"dim=99999999999", "is not an integer in 0..4294967295"},
        {"optimizer.learning_rate=fast", "is not a number"},
        {"optimizer=1", "a message; set one of its fields"},
        {"dim.x=1", "'dim' is not a message"},
        {"dim", "not PATH=VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kb_ffi_create_table(h, "t", bad[i].settings, false), KB_FFI_EINVAL);
        if (!strstr(kb_ffi_last_error(h), bad[i].says))
            fail_msg("settings '%s': error '%s' lacks '%s'", bad[i].settings, kb_ffi_last_error(h), bad[i].says);
        assert_int_equal(kb_ffi_last_status(h), 0);
    }
    /* none of them created the table */
    uint32_t dim = 0;
    int kind = -1;
    assert_int_equal(kb_ffi_table_info(h, "t", &dim, &kind), KB_FFI_ESTATUS);
    assert_int_equal(kb_ffi_last_status(h), CARLS__STATUS_CODE__STATUS_NOT_FOUND);

    assert_int_equal(kb_ffi_create_table(h, "t", "dim=4\noptimizer.kind=adam\noptimizer.learning_rate=0.5\n"
                                                 "lazy.policy=immediate\nknn.spec=Flat\nknn.metric=l2", false), 0);
    assert_string_equal(kb_ffi_last_error(h), "");
    assert_int_equal(kb_ffi_table_info(h, "t", &dim, &kind), 0);
    assert_int_equal(dim, 4);
    assert_int_equal(kind, 0);
    assert_int_equal(kb_ffi_create_table(h, "t", "dim=4", false), KB_FFI_ESTATUS);
    assert_int_equal(kb_ffi_last_status(h), CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS);
    const char *json = NULL;
    assert_int_equal(kb_ffi_list_tables_json(h, &json), 0);
    assert_non_null(strstr(json, "{\"tables\":[{\"name\":\"t\",\"config\":{\"kind\":\"embedding\",\"dim\":4,"));
    assert_non_null(strstr(json, "\"optimizer\":{\"kind\":\"adam\",\"learning_rate\":0.5,"));
    assert_non_null(strstr(json, "\"knn\":{\"spec\":\"Flat\",\"metric\":\"l2\""));
    assert_int_equal(kb_ffi_drop_table(h, "t", false), 0);
    assert_int_equal(kb_ffi_drop_table(h, "t", false), KB_FFI_ESTATUS);
    assert_int_equal(kb_ffi_drop_table(h, "t", true), 0);
    assert_int_equal(kb_ffi_create_table(h, "", "dim=4", false), KB_FFI_EINVAL);
}

static void test_rows_both_key_forms(void **state)
{
    fixture_t *f = *state;
    kb_ffi_t *h = f->h;
    assert_int_equal(kb_ffi_create_table(h, "r", "dim=2\nlazy.policy=immediate\noptimizer.learning_rate=0.5", false),
                     0);
    /* NUL-separated: "a", "bb", "c" */
    const char sep[] = "a\0bb\0c";
    const float vals[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(kb_ffi_put(h, "r", sep, sizeof sep - 1, NULL, 3, 2, vals, 9), 0);
    /* with ends: "c", "a\0x" (a key holding a NUL, not put: its initial value, zeros), "bb" */
    const char cat[] = "ca\0xbb";
    const uint64_t ends[] = {1, 4, 6};
    float got[6];
    uint64_t versions[3], freq[3];
    int64_t updated[3];
    assert_int_equal(kb_ffi_lookup(h, "r", cat, sizeof cat - 1, ends, 3, 2, false, got, versions, updated, freq), 0);
    const float want[6] = {5, 6, 0, 0, 3, 4};
    assert_memory_equal(got, want, sizeof want);
    assert_int_equal(versions[0], 9);
    assert_int_equal(versions[2], 9);
    assert_true(updated[0] > 0 && freq[0] >= 1);
    const float grad[2] = {2, -2};
    assert_int_equal(kb_ffi_push_gradients(h, "r", "a", 1, NULL, 1, 2, grad), 0);
    assert_int_equal(kb_ffi_lookup(h, "r", "a", 1, NULL, 1, 2, true, got, NULL, NULL, NULL), 0);
    assert_true(got[0] == 0.0f && got[1] == 3.0f); /* 1 - 0.5 * 2, 2 + 0.5 * 2 */

    /* malformed key lists, refused before sending */
    assert_int_equal(kb_ffi_lookup(h, "r", sep, sizeof sep - 1, NULL, 2, 2, false, got, NULL, NULL, NULL),
                     KB_FFI_EINVAL);
    assert_non_null(strstr(kb_ffi_last_error(h), "2 keys expected"));
    assert_int_equal(kb_ffi_lookup(h, "r", sep, sizeof sep - 1, NULL, 4, 2, false, got, NULL, NULL, NULL),
                     KB_FFI_EINVAL);
    const uint64_t bad_ends[] = {3, 1, 6};
    assert_int_equal(kb_ffi_lookup(h, "r", cat, sizeof cat - 1, bad_ends, 3, 2, false, got, NULL, NULL, NULL),
                     KB_FFI_EINVAL);
    assert_non_null(strstr(kb_ffi_last_error(h), "key 1 ends at byte 1"));
    const uint64_t short_ends[] = {1, 4, 5};
    assert_int_equal(kb_ffi_lookup(h, "r", cat, sizeof cat - 1, short_ends, 3, 2, false, got, NULL, NULL, NULL),
                     KB_FFI_EINVAL);
    /* the server's refusals come with their status */
    assert_int_equal(kb_ffi_lookup(h, "r", "a", 1, NULL, 1, 3, false, got, NULL, NULL, NULL), KB_FFI_EINVAL);
    const float nan_row[2] = {NAN, 0};
    assert_int_equal(kb_ffi_put(h, "r", "a", 1, NULL, 1, 2, nan_row, 0), KB_FFI_ESTATUS);
    assert_int_equal(kb_ffi_last_status(h), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    assert_string_equal(kb_ffi_status_name(kb_ffi_last_status(h)), "INVALID_ARGUMENT");

    /* pushes without waiting: at most KB_FFI_MAX_PUSHES in flight, collected by kb_ffi_wait_pushes */
    const float one[2] = {1, 1};
    for (int i = 0; i < KB_FFI_MAX_PUSHES + 6; i++)
        assert_int_equal(kb_ffi_push_gradients_send(h, "r", "bb", 2, NULL, 1, 2, one), 0);
    assert_int_equal(kb_ffi_pushes_in_flight(h), KB_FFI_MAX_PUSHES);
    assert_int_equal(kb_ffi_wait_pushes(h), 0);
    assert_int_equal(kb_ffi_pushes_in_flight(h), 0);
    assert_int_equal(kb_ffi_lookup(h, "r", "bb", 2, NULL, 1, 2, false, got, NULL, NULL, NULL), 0);
    assert_true(got[0] == 3.0f - 0.5f * (KB_FFI_MAX_PUSHES + 6) && got[1] == 4.0f - 0.5f * (KB_FFI_MAX_PUSHES + 6));
    assert_int_equal(kb_ffi_push_gradients_send(h, "r", "bb", 2, NULL, 1, 2, nan_row), 0);
    assert_int_equal(kb_ffi_push_gradients_send(h, "r", "bb", 2, NULL, 1, 2, one), 0);
    assert_int_equal(kb_ffi_wait_pushes(h), KB_FFI_ESTATUS); /* the first failure, after collecting both */
    assert_int_equal(kb_ffi_last_status(h), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    assert_true(strlen(kb_ffi_last_error(h)) > 0);
    assert_int_equal(kb_ffi_pushes_in_flight(h), 0);
    assert_int_equal(kb_ffi_wait_pushes(h), 0);
    assert_int_equal(kb_ffi_push_gradients_send(h, "r", "bb", 2, NULL, 1, 2, one), 0); /* dropped by close */

    const char *json = NULL;
    assert_int_equal(kb_ffi_stats_json(h, 0, "r", &json), 0);
    assert_non_null(strstr(json, "\"tables\":[{\"name\":\"r\",\"dim\":2,\"rows\":4,"));
    assert_int_equal(kb_ffi_stats_json(h, 1, "r", &json), KB_FFI_EINVAL);
    assert_int_equal(kb_ffi_checkpoint_json(h, &json), 0);
    assert_non_null(strstr(json, "[{\"committed_epoch\":"));
    assert_int_equal(kb_ffi_shards(h), 1);
}

static void test_knn_sample_keys(void **state)
{
    fixture_t *f = *state;
    kb_ffi_t *h = f->h;
    assert_int_equal(kb_ffi_create_table(h, "k", "dim=1\nknn.spec=Flat\nknn.metric=l2", false), 0);
    const float vals[3] = {0, 1, 10};
    assert_int_equal(kb_ffi_put(h, "k", "p\0q\0r", 5, NULL, 3, 1, vals, 0), 0);
    /* by key: the key's own row is read first, so the index answers it whatever its build state */
    float scores[2];
    const char *data;
    size_t len, n;
    const uint64_t *ends;
    bool has_nul;
    for (int tries = 0;; tries++) { /* the index is built in the background */
        assert_int_equal(kb_ffi_knn_by_key(h, "k", "p", 1, NULL, 1, 2, true, scores), 0);
        kb_ffi_result_keys(h, &data, &len, &ends, &n, &has_nul);
        if (n == 2 && ends[1] > ends[0] + 1)
            break;
        assert_true(tries < 400);
        usleep(25000);
    }
    assert_int_equal(len, 3);
    assert_memory_equal(data, "q\0r", 4);
    assert_int_equal(ends[0], 1);
    assert_int_equal(ends[1], 3);
    assert_false(has_nul);
    assert_true(scores[0] == 1.0f && scores[1] == 100.0f);
    const float query[1] = {9};
    assert_int_equal(kb_ffi_knn(h, "k", query, 1, 1, 1, scores), 0);
    kb_ffi_result_keys(h, &data, &len, &ends, &n, &has_nul);
    assert_int_equal(n, 1);
    assert_string_equal(data, "r");

    size_t count = 0;
    float probs[4];
    uint8_t pos[4];
    double mass = 0;
    uint64_t rows = 0;
    assert_int_equal(kb_ffi_sample(h, "k", "p", 1, NULL, 1, 3, "uniform", 5, 4, &count, probs, pos, &mass, &rows), 0);
    assert_int_equal(count, 4);
    assert_int_equal(pos[0], 1);
    assert_int_equal(pos[1] + pos[2] + pos[3], 0);
    assert_true(mass == 3.0 && rows == 3);
    kb_ffi_result_keys(h, &data, &len, &ends, &n, &has_nul);
    assert_int_equal(n, 4);
    assert_int_equal(ends[0], 1);
    assert_int_equal(kb_ffi_sample(h, "k", "p", 1, NULL, 1, 3, "uniform", 5, 3, &count, probs, pos, NULL, NULL),
                     KB_FFI_EINVAL); /* no room for 4 */
    assert_int_equal(kb_ffi_sample(h, "k", NULL, 0, NULL, 0, 3, "sideways", 5, 3, &count, probs, pos, NULL, NULL),
                     KB_FFI_EINVAL);
    assert_non_null(strstr(kb_ffi_last_error(h), "no strategy 'sideways'"));
}

static void test_features(void **state)
{
    fixture_t *f = *state;
    kb_ffi_t *h = f->h;
    assert_int_equal(kb_ffi_create_table(h, "feat", "kind=feature", false), 0);
    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    uint8_t bytes[3] = {0x00, 0xff, '"'};
    rec.data = (ProtobufCBinaryData){sizeof bytes, bytes};
    rec.label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
    rec.int_label = -7;
    Carls__FeatureRecord *recs[1] = {&rec};
    ProtobufCBinaryData key = {1, (uint8_t *)"a"};
    Carls__FeaturePut put = CARLS__FEATURE_PUT__INIT;
    put.n_keys = 1;
    put.keys = &key;
    put.n_records = 1;
    put.records = recs;
    uint8_t buf[256];
    size_t len = carls__feature_put__pack(&put, buf);
    assert_int_equal(kb_ffi_put_features(h, "feat", buf, len), 0);
    const char *json = NULL;
    assert_int_equal(kb_ffi_get_features_json(h, "feat", "a\0b", 3, NULL, 2, &json), 0);
    assert_non_null(strstr(json, "\"int_label\":-7,"));
    assert_non_null(strstr(json, "\"data\":\"\\u0000\\u00ff\\\"\""));
    assert_non_null(strstr(json, "\"found\":true"));
    assert_non_null(strstr(json, "},{\"neighbor_keys\":[],\"neighbor_weights\":[],\"label_confidence\":0,"));
    /* a message that does not decode, and one whose counts differ */
    assert_int_equal(kb_ffi_put_features(h, "feat", "\xff\xff\xff", 3), KB_FFI_EINVAL);
    put.n_records = 0;
    len = carls__feature_put__pack(&put, buf);
    assert_int_equal(kb_ffi_put_features(h, "feat", buf, len), KB_FFI_EINVAL);
    assert_non_null(strstr(kb_ffi_last_error(h), "1 keys but 0 records"));
}

/* kb_json alone: numbers, NaN, enums, absent messages, string and bytes escapes. */
static void test_json(void **state)
{
    (void)state;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    Carls__OptimizerConfig opt = CARLS__OPTIMIZER_CONFIG__INIT;
    cfg.dim = 3;
    cfg.init = CARLS__INIT_KIND__INIT_NORMAL;
    cfg.init_scale = NAN;
    cfg.init_seed = UINT64_MAX;
    opt.learning_rate = -INFINITY;
    cfg.optimizer = &opt;
    kb_json_t j = {0};
    kb_json_message(&j, &cfg.base);
    assert_string_equal(j.text, "{\"kind\":\"embedding\",\"dim\":3,\"init\":\"normal\",\"init_scale\":NaN,"
                                "\"init_seed\":18446744073709551615,\"optimizer\":{\"kind\":\"sgd\","
                                "\"learning_rate\":-Infinity,\"momentum\":0,\"beta1\":0,\"beta2\":0,\"epsilon\":0,"
                                "\"initial_accumulator\":0}}");
    j.len = 0;
    kb_json_string(&j, "a\"\\\n\xc3\xa9", 6, false);
    assert_string_equal(j.text, "\"a\\\"\\\\\\u000a\xc3\xa9\"");
    j.len = 0;
    kb_json_string(&j, "\xc3\xa9", 2, true);
    assert_string_equal(j.text, "\"\\u00c3\\u00a9\"");
    free(j.text);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_open_errors),
    cmocka_unit_test(test_json),
    cmocka_unit_test_setup_teardown(test_create_table_settings, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_rows_both_key_forms, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_knn_sample_keys, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_features, s_setup, s_teardown))
