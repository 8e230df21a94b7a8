/* carls_slurm.h without a cluster: the Slurm options are taken out of `carls run`'s arguments (both spellings),
 * bad values and Slurm options without --slurm are refused with status 2, and Slurm mode outside an
 * allocation refuses to begin, naming why. The cluster itself: test_slurm.sh. */
#include "carls_slurm.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

/* Runs carls_slurm_take_args on a copy of args (NULL-terminated); the remaining arguments joined by ' '. */
static int s_take(const char *const *args, char *rest, size_t len)
{
    char *argv[32];
    int argc = 0;
    for (; args[argc]; argc++) {
        argv[argc] = (char *)args[argc];
    }
    argv[argc] = NULL;
    int rc = carls_slurm_take_args(&argc, argv);
    rest[0] = '\0';
    for (int i = 0; i < argc; i++) {
        strncat(rest, argv[i], len - strlen(rest) - 2);
        if (i + 1 < argc) {
            strcat(rest, " ");
        }
    }
    assert_null(argv[argc]);
    return rc;
}

/* Runs first: Slurm mode, once on, stays on for the process. */
static void test_without_slurm(void **state)
{
    (void)state;
    char rest[512];
    assert_int_equal(s_take((const char *[]){"run", "x.ini", "--set", "steps=3", NULL}, rest, sizeof rest), 0);
    assert_string_equal(rest, "run x.ini --set steps=3");
    /* A Slurm option alone is a mistake, not something to ignore. */
    assert_int_equal(s_take((const char *[]){"run", "x.ini", "--slurm-nodes", "3", NULL}, rest, sizeof rest), 2);
    assert_int_equal(s_take((const char *[]){"run", "x.ini", "--slurm-scratch=/scratch", NULL}, rest, sizeof rest), 2);
    assert_int_equal(s_take((const char *[]){"run", "x.ini", "--slurm-step-opt=--mem=1G", NULL}, rest, sizeof rest), 2);
    /* Off: begin does nothing. */
    assert_int_equal(carls_slurm_begin("runs/x", "x"), 0);
}

static void test_bad_values(void **state)
{
    (void)state;
    char rest[512];
    const char *const bad[][6] = {
        {"run", "x.ini", "--slurm", "--slurm-nodes", "0", NULL},
        {"run", "x.ini", "--slurm", "--slurm-nodes=many", NULL},
        {"run", "x.ini", "--slurm", "--slurm-nodes=65", NULL},
        {"run", "x.ini", "--slurm", "--slurm-scratch", "relative/dir", NULL},
        {"run", "x.ini", "--slurm", "--slurm-scratch=/it's", NULL},
        {"run", "x.ini", "--slurm", "--slurm-opt", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(s_take(bad[i], rest, sizeof rest), 2);
    }
}

static void test_with_slurm(void **state)
{
    (void)state;
    char rest[512];
    const char *args[] = {"run", "--slurm", "x.ini", "--slurm-nodes", "3", "--set", "makers=4",
                          "--slurm-opt=--partition=gpu", "--slurm-opt", "--time=10", "--slurm-scratch=/scratch",
                          "--slurm-step-opt=--mem-per-cpu=1G", "--quiet", NULL};
    assert_int_equal(s_take(args, rest, sizeof rest), 1);
    assert_string_equal(rest, "run x.ini --set makers=4 --quiet");
    /* Outside an allocation, the run cannot begin, and says so. */
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_JOB_NODELIST");
    assert_false(carls_slurm_in_allocation());
    assert_int_equal(carls_slurm_begin("runs/x", "x"), -1);
    setenv("SLURM_JOB_ID", "12;rm", 1);
    setenv("SLURM_JOB_NODELIST", "n1", 1);
    assert_true(carls_slurm_in_allocation());
    assert_int_equal(carls_slurm_begin("runs/x", "x"), -1); /* a malformed job id is refused */
    carls_slurm_end();
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_without_slurm),
    cmocka_unit_test(test_bad_values),
    cmocka_unit_test(test_with_slurm))
