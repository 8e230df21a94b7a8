/* carls_stages.h: the trainer's wall time split from what it reported (graphreg: train_seconds and
 * metrics.csv's elapsed_s; twotower: steps / steps per second and its log's wait and evaluation lines, the
 * evaluation's own clock including the wait), never more than its wall time, missing numbers counted as 0;
 * keys kept unique; report.md's rows and stages.json with every stage, the total and escaped names. */
#include "carls_stages.h"
#include "test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

/* Writes text as dir/name into path (len bytes). */
static void s_put(const char *name, const char *text, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", test_scratch_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The stage named key, or -1. */
static double s_seconds(const carls_stages_t *s, const char *key)
{
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->key[i], key) == 0) {
            return s->seconds[i];
        }
    }
    return -1;
}

static void test_graphreg_split(void **state)
{
    (void)state;
    char out[512], csv[512], log[512];
    s_put("trainer.out", "graphreg: ...\ntrain_seconds=6.50\nsteps_per_s=20\ntest_accuracy=0.7\n", out, sizeof out);
    s_put("metrics.csv", "step,loss,elapsed_s,bank_skipped\n50,1.2,4.0,0\n100,0.9,8.25,0\n", csv, sizeof csv);
    s_put("trainer.log", "", log, sizeof log);
    carls_result_t res;
    assert_true(carls_result_read(&res, out) > 0);
    carls_stages_t s = {0};
    carls_stages_trainer(&s, 10.0, "graphreg", &res, csv, log);
    assert_int_equal(s.n, 3);
    assert_float_equal(s_seconds(&s, "training"), 6.5, 1e-9);
    assert_float_equal(s_seconds(&s, "evaluation"), 8.25 - 6.5, 1e-9);
    assert_float_equal(s_seconds(&s, "trainer_startup"), 10.0 - 8.25, 1e-9);
    assert_float_equal(carls_stages_sum(&s), 10.0, 1e-9);

    /* A wall time shorter than what the trainer reported (the launcher polls): the parts are cut to it. */
    carls_stages_t cut = {0};
    carls_stages_trainer(&cut, 5.0, "graphreg", &res, csv, log);
    assert_true(carls_stages_sum(&cut) <= 5.0 + 1e-9);
    for (int i = 0; i < cut.n; i++) {
        assert_true(cut.seconds[i] >= 0);
    }

    /* Nothing reported (no metrics.csv, no train_seconds): all of it is start-up, nothing negative. */
    carls_result_t none = {0};
    carls_stages_t bare = {0};
    carls_stages_trainer(&bare, 3.0, "graphreg", &none, "/nonexistent/metrics.csv", log);
    assert_float_equal(s_seconds(&bare, "trainer_startup"), 3.0, 1e-9);
    assert_float_equal(s_seconds(&bare, "training"), 0.0, 1e-9);
    assert_float_equal(s_seconds(&bare, "evaluation"), 0.0, 1e-9);
}

static void test_twotower_split(void **state)
{
    (void)state;
    char out[512], log[512];
    s_put("tt.out", "r1=0 r10=0.1 train_steps=40 train_steps_per_s=4 kb_negatives=0\n", out, sizeof out);
    s_put("tt.log",
          "2026-11-29T02:26:30.532Z INFO  trainer_twotower.c:1616 trainer: trained 40 steps, 4.00 steps/s\n"
          "2026-11-29T02:26:37.369Z INFO  trainer_tt_eval.c:165 trainer: every word vector is from step 40 "
          "(waited 6.8 s for the makers)\n"
          "2026-11-29T02:26:38.171Z INFO  trainer_tt_eval.c:330 trainer: evaluated 50 held-out definitions against "
          "99454 headwords in 7.6 s\n",
          log, sizeof log);
    carls_result_t res;
    assert_true(carls_result_read(&res, out) > 0);
    carls_stages_t s = {0};
    carls_stages_trainer(&s, 19.0, "twotower", &res, "/nonexistent/metrics.csv", log);
    assert_int_equal(s.n, 4);
    assert_float_equal(s_seconds(&s, "training"), 10.0, 1e-9);
    assert_float_equal(s_seconds(&s, "final_vectors"), 6.8, 1e-9);
    assert_float_equal(s_seconds(&s, "evaluation"), 0.8, 1e-6);
    assert_float_equal(s_seconds(&s, "trainer_startup"), 19.0 - 10.0 - 6.8 - 0.8, 1e-6);
    assert_float_equal(carls_stages_sum(&s), 19.0, 1e-6);

    /* Resumed at step 30: only the 10 steps trained now count. */
    s_put("tt.out", "resumed_from_step=30 train_steps=40 train_steps_per_s=4\n", out, sizeof out);
    assert_true(carls_result_read(&res, out) > 0);
    carls_stages_t r = {0};
    carls_stages_trainer(&r, 19.0, "twotower", &res, "/nonexistent/metrics.csv", log);
    assert_float_equal(s_seconds(&r, "training"), 2.5, 1e-9);
}

static void test_table_and_json(void **state)
{
    (void)state;
    carls_stages_t s = {0};
    carls_stages_add(&s, "bank_startup", 0.25, "bank start-up: %d kb-server", 1);
    carls_stages_add(&s, "pixel_embeddings", -1.0, "initial makers: \"pixel\" embeddings");
    carls_stages_add(&s, "bank_startup", 0.5, "bank start-up again");
    assert_int_equal(s.n, 3);
    assert_string_equal(s.key[2], "bank_startup_2");
    assert_float_equal(s.seconds[1], 0.0, 0); /* negative counts as 0 */

    char table[1024];
    carls_stages_table(&s, 2.0, table, sizeof table);
    assert_string_equal(table, "| bank start-up: 1 kb-server | 0.2 |\n"
                               "| initial makers: \"pixel\" embeddings | 0.0 |\n"
                               "| bank start-up again | 0.5 |\n"
                               "| total (the whole run) | 2.0 |\n");
    char small[40];
    carls_stages_table(&s, 2.0, small, sizeof small); /* whole rows only */
    assert_string_equal(small, "| bank start-up: 1 kb-server | 0.2 |\n");

    char path[512], err[256];
    snprintf(path, sizeof path, "%s/" CARLS_STAGES_JSON, test_scratch_dir);
    assert_int_equal(carls_stages_write_json(path, &s, 2.0, "e2e", "graphreg", 0, err, sizeof err), 0);
    size_t len = 0;
    char *json = (char *)test_read_file(path, 1, &len);
    assert_non_null(json);
    json[len] = '\0';
    assert_non_null(
        strstr(json, "{\"run\": \"e2e\", \"experiment\": \"graphreg\", \"exit_status\": 0, \"total\": 2.000,"));
    assert_non_null(strstr(json, "\"stages\": {\n  \"bank_startup\": 0.250,\n  \"pixel_embeddings\": 0.000,\n"
                                 "  \"bank_startup_2\": 0.500},"));
    assert_non_null(strstr(json, "\"pixel_embeddings\": \"initial makers: \\\"pixel\\\" embeddings\""));
    free(json);
    assert_int_equal(carls_stages_write_json("/nonexistent/dir/stages.json", &s, 2.0, "e2e", "graphreg", 0, err,
                                             sizeof err),
                     -1);
    assert_non_null(strstr(err, "/nonexistent/dir"));
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_graphreg_split),
    cmocka_unit_test(test_twotower_split),
    cmocka_unit_test(test_table_and_json))
