/* base/util and base/bytes: growable arrays (capacities, contents kept, several arrays sharing one count),
 * CRC-32 (the standard check value, pieces fed in turn, agreement with zlib's crc32) and little-endian
 * integers in byte buffers, strict integer parsing, the scan for NaN and Inf. */
#include "bytes.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>
#include "test_main.h"

static void test_grow_cap(void **state)
{
    (void)state;
    assert_int_equal(carls_grow_cap(0, 0, 4), 0);    /* nothing needed, nothing grown */
    assert_int_equal(carls_grow_cap(0, 1, 4), 16);   /* the first allocation */
    assert_int_equal(carls_grow_cap(16, 16, 4), 16); /* enough already */
    assert_int_equal(carls_grow_cap(16, 17, 4), 32); /* doubled */
    assert_int_equal(carls_grow_cap(16, 1000, 4), 1024);
    assert_int_equal(carls_grow_cap(3, 4, 8), 6); /* doubles whatever capacity it was given */
    /* Near the top of size_t: need itself rather than a doubling that would overflow. */
    size_t q = SIZE_MAX / 8; /* 4-byte elements: doubling past SIZE_MAX / 8 would overflow the byte count */
    assert_int_equal(carls_grow_cap(q - 10, q - 5, 4), 2 * (q - 10));
    assert_int_equal(carls_grow_cap(q + 10, q + 15, 4), q + 15);
}

static void test_grow_keeps_contents(void **state)
{
    (void)state;
    int *a = NULL;
    size_t cap = 0;
    for (int i = 0; i < 1000; i++) {
        a = carls_grow(a, &cap, (size_t)i + 1, sizeof *a);
        assert_true(cap >= (size_t)i + 1);
        a[i] = i * 3;
    }
    assert_int_equal(cap, 1024);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(a[i], i * 3);
    int *same = carls_grow(a, &cap, 10, sizeof *a); /* enough room: no reallocation */
    assert_ptr_equal(same, a);
    assert_int_equal(cap, 1024);
    free(a);

    /* Two arrays that share one count grow to the same capacity. */
    size_t n = 0, shared = 0;
    uint32_t *off = NULL;
    double *w = NULL;
    for (; n < 40; n++) {
        if (n == shared) {
            shared = carls_grow_cap(shared, n + 1, sizeof *w);
            off = carls_xrealloc(off, shared * sizeof *off);
            w = carls_xrealloc(w, shared * sizeof *w);
        }
        off[n] = (uint32_t)n;
        w[n] = 0.5 * (double)n;
    }
    assert_int_equal(shared, 64);
    assert_int_equal(off[39], 39);
    assert_true(w[39] == 19.5);
    free(off);
    free(w);
}

/* The first NaN or Inf is found wherever it is: in a full block, in the tail after the blocks, at either end
 * of a block, and the smaller index wins when there are two; all finite (the largest float and a subnormal
 * included) gives n. */
static void test_first_nonfinite(void **state)
{
    (void)state;
    enum { N = 256 * 3 + 37 };
    float *v = malloc(N * sizeof *v);
    for (size_t i = 0; i < N; i++)
        v[i] = (float)i * 0.5f - 100.0f;
    v[5] = 3.4028235e38f;
    v[6] = 1e-45f;
    assert_int_equal(carls_first_nonfinite(v, N), N);
    assert_int_equal(carls_first_nonfinite(v, 0), 0);
    const size_t at[] = {0, 255, 256, 511, 600, 767, 768, N - 1};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
        for (size_t b = 0; b < 3; b++) {
            float keep = v[at[a]];
            v[at[a]] = bad[b];
            assert_int_equal(carls_first_nonfinite(v, N), at[a]);
            assert_int_equal(carls_first_nonfinite(v, at[a]), at[a]); /* before it: all finite */
            v[at[a]] = keep;
        }
    }
    v[700] = NAN;
    v[300] = INFINITY;
    assert_int_equal(carls_first_nonfinite(v, N), 300);
    assert_int_equal(carls_first_nonfinite(v + 301, N - 301), 700 - 301);
    free(v);
}

static void test_crc32(void **state)
{
    (void)state;
    /* The CRC-32/IEEE check value of "123456789". */
    assert_int_equal(carls_crc32(0, "123456789", 9), 0xCBF43926u);
    assert_int_equal(carls_crc32(0, "", 0), 0);
    /* Pieces fed in turn give the CRC of the whole. */
    uint32_t crc = carls_crc32(0, "1234", 4);
    assert_int_equal(carls_crc32(crc, "56789", 5), 0xCBF43926u);
    /* The same as zlib's crc32 on a larger buffer. */
    size_t len = 1 << 20;
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    uint64_t seed = 7;
    for (size_t i = 0; i < len; i++)
        buf[i] = (unsigned char)carls_splitmix64(&seed);
    assert_int_equal(carls_crc32(0, buf, len), (uint32_t)crc32(crc32(0L, Z_NULL, 0), buf, (uInt)len));
    free(buf);
}

static void test_little_endian(void **state)
{
    (void)state;
    unsigned char b[8];
    carls_put_le16(b, 0x0102);
    assert_int_equal(b[0], 0x02);
    assert_int_equal(b[1], 0x01);
    assert_int_equal(carls_get_le16(b), 0x0102);
    carls_put_le32(b, 0x01020304u);
    const unsigned char want32[4] = {0x04, 0x03, 0x02, 0x01};
    assert_memory_equal(b, want32, 4);
    assert_int_equal(carls_get_le32(b), 0x01020304u);
    carls_put_le64(b, 0x0102030405060708ull);
    const unsigned char want64[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    assert_memory_equal(b, want64, 8);
    assert_true(carls_get_le64(b) == 0x0102030405060708ull);
    carls_put_le64(b, UINT64_MAX); /* the top bits survive the round trip */
    assert_true(carls_get_le64(b) == UINT64_MAX);
    carls_put_le32(b, 0xfffffffeu);
    assert_int_equal(carls_get_le32(b), 0xfffffffeu);
}

static void test_parse_integers(void **state)
{
    (void)state;
    uint64_t u = 7;
    assert_int_equal(carls_parse_u64("0", &u), 0);
    assert_true(u == 0);
    assert_int_equal(carls_parse_u64("18446744073709551615", &u), 0);
    assert_true(u == UINT64_MAX);
    const char *bad_u[] = {"", "-1", " -1", " 5", "+5", "5 ", "5x", "0x10", "18446744073709551616", NULL};
    for (int i = 0; bad_u[i]; i++) {
        u = 7;
        assert_int_equal(carls_parse_u64(bad_u[i], &u), -1);
        assert_true(u == 7); /* untouched */
    }
    assert_int_equal(carls_parse_u64(NULL, &u), -1);

    int64_t s = 7;
    assert_int_equal(carls_parse_i64("-42", &s), 0);
    assert_true(s == -42);
    assert_int_equal(carls_parse_i64("42", &s), 0);
    assert_true(s == 42);
    assert_int_equal(carls_parse_i64("-0", &s), 0);
    assert_true(s == 0);
    assert_int_equal(carls_parse_i64("9223372036854775807", &s), 0);
    assert_true(s == INT64_MAX);
    assert_int_equal(carls_parse_i64("-9223372036854775808", &s), 0);
    assert_true(s == INT64_MIN);
    const char *bad_s[] = {"", "-", "--1", "- 1", " 1", "+1", "1.5", "9223372036854775808",
                           "-9223372036854775809", NULL};
    for (int i = 0; bad_s[i]; i++) {
        s = 7;
        assert_int_equal(carls_parse_i64(bad_s[i], &s), -1);
        assert_true(s == 7);
    }
}

/* A name's index in a table, case-insensitively; -1 for another name, a prefix, an empty or a NULL name. */
static void test_name_index(void **state)
{
    (void)state;
    static const char *const names[] = {"sgd", "momentum", "adam"};
    assert_int_equal(carls_name_index("sgd", names, 3), 0);
    assert_int_equal(carls_name_index("Adam", names, 3), 2);
    assert_int_equal(carls_name_index("MOMENTUM", names, 3), 1);
    assert_int_equal(carls_name_index("adamw", names, 3), -1);
    assert_int_equal(carls_name_index("ada", names, 3), -1);
    assert_int_equal(carls_name_index("", names, 3), -1);
    assert_int_equal(carls_name_index(NULL, names, 3), -1);
    assert_int_equal(carls_name_index("adam", names, 2), -1); /* only the first n are looked at */
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_grow_cap),
    cmocka_unit_test(test_grow_keeps_contents),
    cmocka_unit_test(test_crc32),
    cmocka_unit_test(test_first_nonfinite),
    cmocka_unit_test(test_little_endian),
    cmocka_unit_test(test_parse_integers),
    cmocka_unit_test(test_name_index))
