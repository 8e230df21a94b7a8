/* The CURVE key options every client program shares (kb_curve_args.h), parsed as the trainer and kb-maker
 * parse them (a carls_args group): neither option is plain TCP; both load the keys into the options, the very
 * keys kb-keygen wrote; one alone is a usage error at parse time (kb_curve_args_check) and when connecting; a
 * missing file or a public key where the secret key belongs is refused with the option and the file named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "kb_curve_args.h"
#include "test_util.h"

static char s_dir[64], s_key[128], s_pub[128], s_server_pub[128], s_server_key[128];
static kb_auth_keypair_t s_client, s_server;

/* Parses argv (NULL-terminated, argv[0] the program) with the group alone into *g. */
static int s_parse(kb_curve_args_t *g, char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    kb_curve_args(g);
    const carls_arg_t rows[] = {carls_arg_group(g->rows), {0}};
    return carls_args_parse("prog", argc, argv, rows, NULL);
}

static void test_neither_is_plain(void **state)
{
    (void)state;
    kb_curve_args_t g;
    assert_int_equal(s_parse(&g, (char *[]){"prog", NULL}), 0);
    assert_int_equal(kb_curve_args_check(&g, "prog"), 0);
    kb_client_curve_t keys;
    kb_client_options_t opts = {.curve = &keys};
    assert_int_equal(kb_curve_args_options(&g, "prog", &keys, &opts), 0);
    assert_null(opts.curve);
}

static void test_both_load_the_keys(void **state)
{
    (void)state;
    kb_curve_args_t g;
    assert_int_equal(s_parse(&g, (char *[]){"prog", "--curve-key", s_key, "--curve-server-key", s_server_pub, NULL}),
                     0);
    assert_string_equal(g.key_file, s_key);
    kb_client_curve_t keys;
    kb_client_options_t opts = {0};
    assert_int_equal(kb_curve_args_options(&g, "prog", &keys, &opts), 0);
    assert_ptr_equal(opts.curve, &keys);
    assert_memory_equal(&keys.client, &s_client, sizeof s_client);
    assert_memory_equal(&keys.server_public, &s_server.public_key, sizeof s_server.public_key);
}

static void test_one_alone_is_refused(void **state)
{
    (void)state;
    kb_curve_args_t g;
    kb_client_curve_t keys;
    kb_client_options_t opts = {0};
    assert_int_equal(s_parse(&g, (char *[]){"prog", "--curve-key", s_key, NULL}), 0);
    assert_int_equal(kb_curve_args_check(&g, "prog"), -1);
    assert_int_equal(kb_curve_args_options(&g, "prog", &keys, &opts), -1);
    assert_int_equal(s_parse(&g, (char *[]){"prog", "--curve-server-key", s_server_pub, NULL}), 0);
    assert_int_equal(kb_curve_args_check(&g, "prog"), -1);
    assert_int_equal(kb_curve_args_options(&g, "prog", &keys, &opts), -1);
    assert_null(opts.curve);
}

static void test_bad_files_are_refused(void **state)
{
    (void)state;
    kb_curve_args_t g;
    kb_client_curve_t keys;
    kb_client_options_t opts = {0};
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.key", s_dir);
    assert_int_equal(s_parse(&g, (char *[]){"prog", "--curve-key", missing, "--curve-server-key", s_server_pub, NULL}),
                     0);
    assert_int_equal(kb_curve_args_options(&g, "prog", &keys, &opts), -1);
    /* A public key file given as the client's secret key. */
    assert_int_equal(s_parse(&g, (char *[]){"prog", "--curve-key", s_pub, "--curve-server-key", s_server_pub, NULL}),
                     0);
    assert_int_equal(kb_curve_args_options(&g, "prog", &keys, &opts), -1);
    assert_null(opts.curve);
}

int main(void)
{
    char err[256];
    if (test_tmpdir(s_dir, sizeof s_dir, "curveargs") != 0)
        return 1;
    snprintf(s_key, sizeof s_key, "%s/alice.key", s_dir);
    snprintf(s_pub, sizeof s_pub, "%s/alice.pub", s_dir);
    snprintf(s_server_key, sizeof s_server_key, "%s/server.key", s_dir);
    snprintf(s_server_pub, sizeof s_server_pub, "%s/server.pub", s_dir);
    if (kb_auth_keypair_generate(&s_client, err, sizeof err) != 0 ||
        kb_auth_keypair_generate(&s_server, err, sizeof err) != 0 ||
        kb_auth_keypair_write(&s_client, s_key, s_pub, false, err, sizeof err) != 0 ||
        kb_auth_keypair_write(&s_server, s_server_key, s_server_pub, false, err, sizeof err) != 0) {
        fprintf(stderr, "keys: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_neither_is_plain),
        cmocka_unit_test(test_both_load_the_keys),
        cmocka_unit_test(test_one_alone_is_refused),
        cmocka_unit_test(test_bad_files_are_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_rmrf(s_dir);
    return rc;
}
