/* base/carls_args: every kind of row stores its value, defaults survive when an option is absent, --help and
 * bad usage give 1 and -1, a group's rows count as the table's, and each bad value is refused with the documented message (stderr is captured). */
#include "carls_args.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

typedef struct {
    const char *name;
    int count;
    float rate;
    uint64_t seed;
    uint32_t size;
    double seconds;
    bool fast, verbose, cosine;
    int mode;
    int custom_calls;
    int level; /* from a group */
} s_opts_t;

static int s_usage_calls;
static FILE *s_usage_out;

static void s_usage(FILE *out)
{
    s_usage_calls++;
    s_usage_out = out;
}

/* A custom value: "even" numbers only, counted. */
static int s_even(const char *prog, const char *name, const char *text, void *out)
{
    s_opts_t *o = out;
    int v = 0;
    if (carls_args_int_value(prog, name, text, 0, 100, &v) != 0 || v % 2 != 0) {
        fprintf(stderr, "%s: --%s: '%s' is not even\n", prog, name, text);
        return -1;
    }
    o->count = v;
    o->custom_calls++;
    return 0;
}

/* Sends stderr to fd until s_stderr_back(the returned descriptor). */
static int s_stderr_to(int fd)
{
    fflush(stderr);
    const int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    return saved;
}

static void s_stderr_back(int saved)
{
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
}

/* Parses the NULL-terminated words (after a program name) into *o, starting from the defaults; what the parser
 * wrote to stderr goes to err. Returns carls_args_parse's result. */
static int s_parse(s_opts_t *o, char *err, size_t errlen, ...)
{
    *o = (s_opts_t){.name = "default", .count = 7, .rate = 0.5f, .seed = 3, .size = 4096, .seconds = 1.0,
                     .cosine = true, .mode = 1};
    char *argv[32] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, errlen);
    for (const char *w = va_arg(ap, const char *); w && argc < 31; w = va_arg(ap, const char *)) {
        argv[argc++] = (char *)w;
    }
    va_end(ap);
    const carls_arg_t group[] = {
        carls_arg_int("level", &o->level, 0, 9),
        {0},
    };
    const carls_arg_t args[] = {
        carls_arg_string("name", &o->name),
        carls_arg_group(group),
        carls_arg_int("count", &o->count, 1, 10),
        carls_arg_float("rate", &o->rate, 0.0, 1.0),
        carls_arg_u64("seed", &o->seed),
        carls_arg_u32("size", &o->size, 1024, UINT32_MAX),
        carls_arg_double("seconds", &o->seconds, 0.05, 86400),
        carls_arg_bool01("fast", &o->fast),
        carls_arg_set("verbose", &o->verbose),
        carls_arg_either("schedule", &o->cosine, (const char *const[]){"cosine", "constant", NULL}),
        carls_arg_choice("mode", &o->mode, (const char *const[]){"a", "b", "c", NULL}),
        carls_arg_custom("even", o, s_even),
        carls_arg_log_level(),
        {0},
    };
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    const int saved = s_stderr_to(fileno(tmp));
    s_usage_calls = 0;
    s_usage_out = NULL;
    int rc = carls_args_parse("prog sub", argc, argv, args, s_usage);
    s_stderr_back(saved);
    rewind(tmp);
    size_t n = fread(err, 1, errlen - 1, tmp);
    err[n] = '\0';
    fclose(tmp);
    return rc;
}

static void test_values_and_defaults(void **state)
{
    (void)state;
    s_opts_t o;
    char err[1024];
    assert_int_equal(s_parse(&o, err, sizeof err, NULL), 0);
    assert_string_equal(o.name, "default");
    assert_int_equal(o.count, 7);
    assert_true(o.size == 4096 && o.seconds == 1.0);
    assert_true(o.rate == 0.5f && o.seed == 3 && !o.fast && !o.verbose && o.cosine && o.mode == 1);

    assert_int_equal(s_parse(&o, err, sizeof err, "--name", "x", "--count", "10", "--rate=0.25", "--seed",
                             "18446744073709551615", "--fast", "1", "--verbose", "--schedule", "constant", "--mode",
                             "c", "--log-level", "warn", NULL),
                     0);
    assert_string_equal(err, "");
    assert_string_equal(o.name, "x");
    assert_int_equal(o.count, 10);
    assert_true(o.rate == 0.25f);
    assert_true(o.seed == UINT64_MAX);
    assert_true(o.fast && o.verbose && !o.cosine);
    assert_int_equal(o.mode, 2);
    assert_int_equal(s_usage_calls, 0);

    /* 32-bit unsigned sizes up to UINT32_MAX, and doubles kept at full precision */
    assert_int_equal(s_parse(&o, err, sizeof err, "--size", "4294967295", "--seconds", "0.1", NULL), 0);
    assert_true(o.size == UINT32_MAX);
    assert_true(o.seconds == 0.1);

    /* an option from a group */
    assert_int_equal(s_parse(&o, err, sizeof err, "--level", "4", NULL), 0);
    assert_int_equal(o.level, 4);
    /* the last of a repeated option wins; a custom value goes through its parser */
    assert_int_equal(s_parse(&o, err, sizeof err, "--mode", "b", "--mode", "a", "--even", "42", NULL), 0);
    assert_int_equal(o.mode, 0);
    assert_int_equal(o.count, 42);
    assert_int_equal(o.custom_calls, 1);
}

static void test_part_value(void **state)
{
    (void)state;
    uint32_t i = 9, n = 9;
    assert_int_equal(carls_args_part_value("p", "worker", "0/1", 4, &i, &n), 0);
    assert_true(i == 0 && n == 1);
    assert_int_equal(carls_args_part_value("p", "worker", "3/4", 4, &i, &n), 0);
    assert_true(i == 3 && n == 4);
    const char *bad[] = {"4/4", "0/5", "0/0", "1", "1/2x", "-1/2", "a/b", ""};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const int null = open("/dev/null", O_WRONLY); /* only the refusal is checked here, not the message */
        const int saved = s_stderr_to(null);
        close(null);
        int rc = carls_args_part_value("p", "worker", bad[k], 4, &i, &n);
        s_stderr_back(saved);
        if (rc != -1) {
            fail_msg("'%s' was accepted as a part of at most 4", bad[k]);
        }
    }
    assert_true(i == 3 && n == 4); /* untouched by the refusals */
}

static void test_help(void **state)
{
    (void)state;
    s_opts_t o;
    char err[1024];
    assert_int_equal(s_parse(&o, err, sizeof err, "--count", "2", "--help", "--count", "zz", NULL), 1);
    assert_int_equal(s_usage_calls, 1);
    assert_ptr_equal(s_usage_out, stdout);
    assert_string_equal(err, "");
    /* -h is --help */
    assert_int_equal(s_parse(&o, err, sizeof err, "-h", NULL), 1);
    assert_int_equal(s_usage_calls, 1);
    assert_ptr_equal(s_usage_out, stdout);
}

/* One bad command line: refused (-1) with want in the message; usage printed to stderr or not at all. */
static void s_refused(const char *want, bool usage, const char *a1, const char *a2)
{
    s_opts_t o;
    char err[1024];
    assert_int_equal(s_parse(&o, err, sizeof err, a1, a2, NULL), -1);
    if (!strstr(err, want)) {
        fail_msg("'%s %s': expected '%s' in '%s'", a1, a2 ? a2 : "", want, err);
    }
    assert_int_equal(s_usage_calls, usage ? 1 : 0);
    if (usage) {
        assert_ptr_equal(s_usage_out, stderr);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *want; /* in the message */
        bool usage;       /* usage printed (to stderr) */
        const char *a1, *a2;
    } cases[] = {
        {"prog sub: --count: '0' is not an integer in 1..10\n", false, "--count", "0"},
        {"prog sub: --count: '11' is not an integer in 1..10\n", false, "--count", "11"},
        {"prog sub: --count: '3x' is not an integer in 1..10\n", false, "--count", "3x"},
        {"prog sub: --count: '' is not an integer in 1..10\n", false, "--count", ""},
        {"prog sub: --level: '10' is not an integer in 0..9\n", false, "--level", "10"},
        {"prog sub: --rate: '1.5' is not a number in [0, 1]\n", false, "--rate", "1.5"},
        {"prog sub: --rate: 'nan' is not a number in [0, 1]\n", false, "--rate", "nan"},
        {"prog sub: --seed: '-1x' is not a number\n", false, "--seed", "-1x"},
        {"prog sub: --size: '1023' is not an integer in 1024..4294967295\n", false, "--size", "1023"},
        {"prog sub: --size: '4294967296' is not an integer in 1024..4294967295\n", false, "--size", "4294967296"},
        {"prog sub: --seconds: '0.01' is not a number in [0.05, 86400]\n", false, "--seconds", "0.01"},
        {"invalid option -- 'x'", true, "-x", NULL},
        {"prog sub: --fast: '2' is not an integer in 0..1\n", false, "--fast", "2"},
        {"prog sub: --schedule: 'x' is not cosine or constant\n", false, "--schedule", "x"},
        {"prog sub: --mode: 'd' is not a, b or c\n", false, "--mode", "d"},
        {"prog sub: --even: '3' is not even\n", false, "--even", "3"},
        {"prog sub: --log-level: 'loud' is not debug, info, warn, error or off\n", false, "--log-level", "loud"},
        {"prog sub: unexpected argument 'stray'\n", false, "stray", NULL},
        {"unrecognized option '--nope'", true, "--nope", NULL},
        {"requires an argument", true, "--count", NULL},
        {"doesn't allow an argument", true, "--verbose=1", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s_refused(cases[i].want, cases[i].usage, cases[i].a1, cases[i].a2);
    }
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_values_and_defaults),
    cmocka_unit_test(test_help),
    cmocka_unit_test(test_part_value),
    cmocka_unit_test(test_refusals))
