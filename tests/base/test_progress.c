/* base/progress: the progress text at chosen times (no clock is read by the checks): bar, percentage, count,
 * rate and time left for a phase of known size; count and rate only when the size is unknown; the running
 * loss of a training phase. */
#include "progress.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

static void test_known_total(void **state)
{
    (void)state;
    carls_progress_t p;
    carls_progress_start_units(&p, "import emb", 1000, "rows");
    p.done = 250;
    char line[256];
    carls_progress_format(&p, p.start_us + 5000000, line, sizeof line); /* 250 rows in 5 s: 50/s, 15 s left */
    assert_non_null(strstr(line, "import emb"));
    assert_non_null(strstr(line, "[#######.......................]  25%"));
    assert_non_null(strstr(line, "250 rows  50 rows/s  15s left"));
    p.done = 100;
    carls_progress_format(&p, p.start_us + 100000000, line, sizeof line); /* 1/s: 900 s = 15m00s left */
    assert_non_null(strstr(line, "15m00s left"));
    p.done = 1000;
    carls_progress_format(&p, p.start_us + 100000000, line, sizeof line);
    assert_non_null(strstr(line, "100%"));
    assert_null(strstr(line, "left"));
}

static void test_unknown_total_and_loss(void **state)
{
    (void)state;
    carls_progress_t p;
    carls_progress_start_units(&p, "export emb", 0, "rows");
    p.done = 7200;
    char line[256];
    carls_progress_format(&p, p.start_us + 2000000, line, sizeof line);
    assert_null(strstr(line, "["));
    assert_null(strstr(line, "left"));
    assert_non_null(strstr(line, "7200 rows  3600 rows/s"));

    carls_progress_start(&p, "epoch 1/3", 100);
    carls_progress_t q = p;
    q.done = 50;
    q.loss_sum = 3.0;
    q.batches = 2;
    carls_progress_format(&q, q.start_us + 10000000, line, sizeof line);
    assert_non_null(strstr(line, "loss 1.5000"));
    assert_non_null(strstr(line, "5 ex/s"));
    assert_non_null(strstr(line, "10s left"));
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_known_total),
    cmocka_unit_test(test_unknown_total_and_loss))
