/* One entry form for every cmocka test binary: CARLS_TEST_MAIN(cmocka_unit_test(a), ...) is its whole main,
 * the listed tests run as one group; CARLS_TEST_MAIN_GROUP(setup, teardown, ...) adds a group fixture. */
#ifndef CARLS_TEST_MAIN_H
#define CARLS_TEST_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* The array keeps the name `tests`: cmocka prints it as the group's name. */
#define CARLS_TEST_MAIN_GROUP(group_setup, group_teardown, ...)                                            \
    int main(void)                                                                                         \
    {                                                                                                      \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                                   \
        return cmocka_run_group_tests(tests, group_setup, group_teardown);                                 \
    }

#define CARLS_TEST_MAIN(...) CARLS_TEST_MAIN_GROUP(NULL, NULL, __VA_ARGS__)

#endif
