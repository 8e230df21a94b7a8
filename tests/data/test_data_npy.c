/* data/: the .npy reader and writer on files crafted here (NumPy's own layout, every kind of bad header,
 * dtype, shape and size), and the user data-set loader (npy: and csv: specs) with its checks naming file and
 * row: NaN, labels out of range, row counts that differ. */
#include "npy.h"
#include "data_user.h"
#include "test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

/* test_scratch_dir/name, in a static buffer (two at a time). */
static const char *s_path(const char *name)
{
    static char paths[2][512];
    static int which;
    which ^= 1;
    snprintf(paths[which], sizeof paths[which], "%s/%s", test_scratch_dir, name);
    return paths[which];
}

static const char *s_write(const char *name, const void *bytes, size_t len)
{
    const char *path = s_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    fclose(f);
    return path;
}

/* A text file (strlen(text) bytes). */
static const char *s_write_text(const char *name, const char *text)
{
    return s_write(name, text, strlen(text));
}

/* A version `major`.0 .npy file (1: a 2-byte header length, 2: 4 bytes) with the given header dict text and
 * data bytes, as NumPy lays it out. */
static size_t s_make_v(unsigned char *buf, int major, const char *dict, const void *data, size_t data_len)
{
    size_t pre = major == 1 ? 10 : 12, hl = strlen(dict) + 1;
    size_t pad = (64 - (pre + hl) % 64) % 64;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    memset(buf + 8, 0, pre - 8);
    buf[8] = (unsigned char)((hl + pad) & 0xff);
    buf[9] = (unsigned char)((hl + pad) >> 8);
    memcpy(buf + pre, dict, hl - 1);
    memset(buf + pre + hl - 1, ' ', pad);
    buf[pre + hl - 1 + pad] = '\n';
    memcpy(buf + pre + hl + pad, data, data_len);
    return pre + hl + pad + data_len;
}

static size_t s_make(unsigned char *buf, const char *dict, const void *data, size_t data_len)
{
    return s_make_v(buf, 1, dict, data, data_len);
}

static void test_roundtrip(void **state)
{
    (void)state;
    float x[6] = {0.5f, -1.0f, 2.0f, 3.25f, 1e-3f, -7.0f};
    char err[512] = "";
    const char *path = s_path("x.npy");
    assert_int_equal(carls_npy_write_f32(path, x, 2, 3, err, sizeof err), 0);
    carls_npy_t a;
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), 0);
    assert_int_equal(a.kind, 'f');
    assert_int_equal(a.itemsize, 4);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.rows, 2);
    assert_int_equal(a.cols, 3);
    float *y;
    assert_int_equal(carls_npy_to_f32(&a, path, &y, err, sizeof err), 0);
    assert_memory_equal(x, y, sizeof x);
    free(y);
    carls_npy_free(&a);

    int64_t l[4] = {-1, 0, 5, 1LL << 40};
    path = s_path("l.npy");
    assert_int_equal(carls_npy_write_i64(path, l, 4, err, sizeof err), 0);
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), 0);
    assert_int_equal(a.ndim, 1);
    assert_int_equal(a.rows, 4);
    int64_t *m;
    assert_int_equal(carls_npy_to_i64(&a, path, &m, err, sizeof err), 0);
    assert_memory_equal(l, m, sizeof l);
    free(m);
    /* integers are not floats the other way round: i64 -> f32 converts */
    assert_int_equal(carls_npy_to_f32(&a, path, &y, err, sizeof err), 0);
    assert_true(y[0] == -1.0f && y[2] == 5.0f);
    free(y);
    carls_npy_free(&a);
}

/* Reads the .npy file at path and checks that its values, as int64, are want[0..n). */
static void s_check_i64(const char *path, const int64_t *want, size_t n)
{
    char err[512] = "";
    carls_npy_t a;
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), 0);
    int64_t *v;
    assert_int_equal(carls_npy_to_i64(&a, path, &v, err, sizeof err), 0);
    assert_memory_equal(v, want, n * sizeof *want);
    free(v);
    carls_npy_free(&a);
}

/* The dtypes NumPy writes for small integers, sign-extended right; version 2.0 headers. */
static void test_int_dtypes(void **state)
{
    (void)state;
    unsigned char buf[256];
    const int8_t i1[3] = {-1, 7, -128};
    const char *dict1 = "{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }";
    s_check_i64(s_write("i1.npy", buf, s_make(buf, dict1, i1, 3)), (const int64_t[]){-1, 7, -128}, 3);

    const unsigned char i2[4] = {0xfe, 0xff, 0x02, 0x00}; /* -2, 2 little-endian */
    const char *dict2 = "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }";
    s_check_i64(s_write("i2.npy", buf, s_make_v(buf, 2, dict2, i2, 4)), (const int64_t[]){-2, 2}, 2);
}

/* Every bad file is refused with a message naming the file and what is wrong. */
static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *dict;
        size_t data_len; /* bytes of data written */
        const char *want;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 15, "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 20, "bytes after the data"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", 16, "big-endian"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2, 2), }", 16, "not supported"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, "no 'descr' string"},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, "Fortran order"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 2), }", 16, "has 3 dimensions"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, "0-d array"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999, 9999999), }", 16, "over 2^40"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 16, "malformed 'shape'"},
        {"{'descr': '<f4', 'shape': (2, 2), }", 16, "fortran_order"},
        {"'descr': '<f4'", 16, "not a dict"},
    };
    unsigned char buf[512], data[32] = {0};
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = s_write("bad.npy", buf, s_make(buf, cases[i].dict, data, cases[i].data_len));
        carls_npy_t a;
        err[0] = '\0';
        assert_int_equal(carls_npy_read(path, &a, err, sizeof err), CARLS_NPY_EBAD);
        assert_null(a.data);
        if (!strstr(err, cases[i].want) || !strstr(err, path)) {
            fail_msg("case %zu: '%s' does not say '%s' and name the file", i, err, cases[i].want);
        }
    }
    /* no magic; a version from the future; a header length past the end */
    static const char nomagic[] = "PK\x03\x04 not numpy", v9[] = "\x93NUMPY\x09\x00\x10\x00{}",
                      shorthdr[] = "\x93NUMPY\x01\x00\xff\x00{'descr'";
    const char *path = s_write("nomagic.npy", nomagic, sizeof nomagic - 1);
    carls_npy_t a;
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), CARLS_NPY_EBAD);
    assert_non_null(strstr(err, "magic"));
    path = s_write("v9.npy", v9, sizeof v9 - 1);
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), CARLS_NPY_EBAD);
    assert_non_null(strstr(err, "version 9"));
    path = s_write("short.npy", shorthdr, sizeof shorthdr - 1);
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), CARLS_NPY_EBAD);
    assert_non_null(strstr(err, "truncated in the header"));
    assert_int_equal(carls_npy_read(s_path("absent.npy"), &a, err, sizeof err), CARLS_NPY_EIO);
    assert_non_null(strstr(err, "absent.npy"));
}

/* A NaN names the row and column; a float file is not labels. */
static void test_values(void **state)
{
    (void)state;
    float x[6] = {0, 1, 2, 3, 0, 5};
    x[4] = strtof("nan", NULL);
    char err[512];
    const char *path = s_path("nan.npy");
    assert_int_equal(carls_npy_write_f32(path, x, 3, 2, err, sizeof err), 0);
    carls_npy_t a;
    assert_int_equal(carls_npy_read(path, &a, err, sizeof err), 0);
    float *y;
    int64_t *l;
    assert_int_equal(carls_npy_to_f32(&a, path, &y, err, sizeof err), CARLS_NPY_EBAD);
    assert_non_null(strstr(err, "row 2, column 0: NaN"));
    assert_non_null(strstr(err, "nan.npy"));
    assert_int_equal(carls_npy_to_i64(&a, path, &l, err, sizeof err), CARLS_NPY_EBAD);
    assert_non_null(strstr(err, "floats"));
    carls_npy_free(&a);
}

/* The user data-set loader over npy: and csv: specs. */
static void test_user_data(void **state)
{
    (void)state;
    char err[1024], spec[1200], test_spec[1200];
    /* 4 training rows (one unlabelled), 2 test rows, 3 features; floats mapped by the training range */
    float x[12] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 4, 4, 4}, tx[6] = {-1, 0, 0, 8, 4, 2};
    int64_t y[4] = {0, 0, 1, -1}, ty[2] = {0, 1};
    char fx[512], fy[512], ftx[512], fty[512];
    snprintf(fx, sizeof fx, "%s", s_path("fx.npy"));
    snprintf(fy, sizeof fy, "%s", s_path("fy.npy"));
    snprintf(ftx, sizeof ftx, "%s", s_path("ftx.npy"));
    snprintf(fty, sizeof fty, "%s", s_path("fty.npy"));
    assert_int_equal(carls_npy_write_f32(fx, x, 4, 3, err, sizeof err), 0);
    assert_int_equal(carls_npy_write_i64(fy, y, 4, err, sizeof err), 0);
    assert_int_equal(carls_npy_write_f32(ftx, tx, 2, 3, err, sizeof err), 0);
    assert_int_equal(carls_npy_write_i64(fty, ty, 2, err, sizeof err), 0);
    snprintf(spec, sizeof spec, "npy:%s,%s", fx, fy);
    snprintf(test_spec, sizeof test_spec, "npy:%s,%s", ftx, fty);
    carls_fmnist_t ds;
    assert_int_equal(carls_dataset_load(spec, NULL, test_spec, &ds, err, sizeof err), 0);
    assert_int_equal(ds.classes, 2);
    assert_int_equal(ds.train.n, 4);
    assert_int_equal(ds.train.dim, 3);
    assert_int_equal(ds.test.n, 2);
    assert_int_equal(ds.train.pixels[0], 0);
    assert_int_equal(ds.train.pixels[11], 255);
    assert_true(ds.train.pixels[3] >= 63 && ds.train.pixels[3] <= 64); /* 1/4 of the range */
    assert_int_equal(ds.train.labels[3], CARLS_LABEL_NONE);
    assert_int_equal(ds.test.pixels[0], 0);   /* -1: clipped */
    assert_int_equal(ds.test.pixels[3], 255); /* 8: clipped */
    carls_fmnist_free(&ds);

    /* a label out of range names the file and row; nothing is returned */
    int64_t bad_y[4] = {0, 1, 300, 0};
    assert_int_equal(carls_npy_write_i64(fy, bad_y, 4, err, sizeof err), 0);
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "fy.npy: row 2: label 300 is out of range"));
    assert_null(ds.train.pixels);
    /* fewer labels than rows */
    assert_int_equal(carls_npy_write_i64(fy, y, 3, err, sizeof err), 0);
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "has 3 labels but the features have 4 rows"));
    /* features of the wrong shape */
    assert_int_equal(carls_npy_write_f32(fx, x, 12, 0, err, sizeof err), 0);
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "shape (N, D)"));
    /* an unlabelled test example */
    assert_int_equal(carls_npy_write_f32(fx, x, 4, 3, err, sizeof err), 0);
    assert_int_equal(carls_npy_write_i64(fy, y, 4, err, sizeof err), 0);
    int64_t bad_ty[2] = {1, -1};
    assert_int_equal(carls_npy_write_i64(fty, bad_ty, 2, err, sizeof err), 0);
    assert_int_equal(carls_dataset_load(spec, NULL, test_spec, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "example 1 has no label"));
    /* bad specs */
    assert_int_equal(carls_dataset_load("npy:only-one.npy", NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "two files"));
    assert_int_equal(carls_dataset_load("mnist", NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "expected fashion-mnist"));

    /* CSV: a header, blank lines, a bad value named by line and column */
    char cx[512], cy[512];
    snprintf(cx, sizeof cx, "%s", s_write_text("f.csv", "a,b\n1,2\n 3 , 4\n\n5,6\n"));
    snprintf(cy, sizeof cy, "%s", s_write_text("l.csv", "label\n0\n1\n-1\n"));
    snprintf(spec, sizeof spec, "csv:%s,%s", cx, cy);
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), 0);
    assert_int_equal(ds.train.n, 3);
    assert_int_equal(ds.train.dim, 2);
    assert_int_equal(ds.train.pixels[5], 255);
    assert_int_equal(ds.test.n, 0);
    carls_fmnist_free(&ds);
    s_write_text("f.csv", "1,2\n3,nan\n5,6\n");
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "f.csv: line 2, column 2: 'nan' is not a finite number"));
    s_write_text("f.csv", "1,2\n3\n5,6\n");
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "f.csv: line 2 has 1 values"));
    s_write_text("f.csv", "1,2\n3,4\n5,6\n");
    s_write_text("l.csv", "0\n1\nx\n");
    assert_int_equal(carls_dataset_load(spec, NULL, NULL, &ds, err, sizeof err), CARLS_USER_EBAD);
    assert_non_null(strstr(err, "l.csv: line 3: 'x' is not an integer label"));
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_roundtrip),
    cmocka_unit_test(test_int_dtypes),
    cmocka_unit_test(test_bad_files),
    cmocka_unit_test(test_values),
    cmocka_unit_test(test_user_data))
