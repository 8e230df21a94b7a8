/* trainer twotower's hard bank negatives: which of the headwords the bank's knn answered become negatives
 * (tt_hard_select): each once, in slot order, never a positive of the batch, never an empty slot. */
#include "trainer_tt.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#define X UINT32_MAX

static void test_select(void **state)
{
    (void)state;
    /* Two queries, three slots each: query 0 (positive 7) got 7, 3, 5; query 1 (positive 9) got 3, X, 4. */
    const uint32_t knn[] = {7, 3, 5, 3, X, 4};
    const uint32_t pos[] = {7, 9};
    uint32_t out[6];
    size_t n = tt_hard_select(knn, 2, 3, pos, 2, out, 6);
    /* slot 0: 7 (a positive: out), 3; slot 1: 3 (again: out), empty; slot 2: 5, 4 */
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 5);
    assert_int_equal(out[2], 4);
    /* Another query's positive is left out too (it is an in-batch candidate already). */
    const uint32_t pos2[] = {7, 5};
    n = tt_hard_select(knn, 2, 3, pos2, 2, out, 6);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 4);
    /* max_out caps the list, nearest slots first. */
    n = tt_hard_select(knn, 2, 3, pos, 2, out, 2);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 5);
    /* Nothing found, or everything a positive. */
    const uint32_t empty[] = {X, X, X};
    assert_int_equal(tt_hard_select(empty, 1, 3, pos, 2, out, 6), 0);
    const uint32_t only_pos[] = {9, 7};
    assert_int_equal(tt_hard_select(only_pos, 2, 1, pos, 2, out, 6), 0);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_select))
