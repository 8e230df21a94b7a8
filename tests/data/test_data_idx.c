/* data/: the IDX reader on small gzipped files crafted here (good ones and every kind of bad header, size and
 * stream), the Fashion-MNIST set loader's cross-checks, and the seeded shuffles and label subsets. */
#include "data_fmnist.h"
#include "data_idx.h"
#include "data_sample.h"
#include "test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>
#include "test_main.h"

/* Writes bytes to test_scratch_dir/name, gzipped when gz, and returns the path in a static buffer. */
static const char *s_write(const char *name, const void *bytes, size_t len, bool gz)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_scratch_dir, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (len) {
            assert_int_equal(gzwrite(f, bytes, (unsigned)len), (int)len);
        }
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (len) {
            assert_int_equal(fwrite(bytes, 1, len, f), len);
        }
        fclose(f);
    }
    return path;
}

/* An IDX image: header for (n, r, c) unsigned bytes plus n*r*c data bytes (value = index mod 251). */
static size_t s_make_idx(unsigned char *buf, int ndim, const uint32_t *dims, uint64_t data_bytes)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (unsigned char)ndim;
    size_t off = 4;
    for (int d = 0; d < ndim; d++) {
        buf[off++] = (unsigned char)(dims[d] >> 24);
        buf[off++] = (unsigned char)(dims[d] >> 16);
        buf[off++] = (unsigned char)(dims[d] >> 8);
        buf[off++] = (unsigned char)dims[d];
    }
    for (uint64_t i = 0; i < data_bytes; i++) {
        buf[off++] = (unsigned char)(i % 251);
    }
    return off;
}

static void s_expect_bad(const char *path, int expected_ndim, int rc, const char *word)
{
    carls_idx_t idx;
    char err[1024] = "";
    int got = carls_idx_read_gz(path, expected_ndim, &idx, err, sizeof err);
    printf("  %-16s -> %d: %s\n", word, got, err);
    assert_int_equal(got, rc);
    assert_null(idx.data);
    assert_non_null(strstr(err, word));
}

static void test_idx_good_files(void **state)
{
    (void)state;
    unsigned char buf[256];
    uint32_t dims[3] = {5, 2, 3};
    size_t len = s_make_idx(buf, 3, dims, 30);
    for (int gz = 0; gz <= 1; gz++) {
        const char *path = s_write(gz ? "good.gz" : "good.raw", buf, len, gz);
        carls_idx_t idx;
        char err[512];
        assert_int_equal(carls_idx_read_gz(path, 3, &idx, err, sizeof err), 0);
        assert_int_equal(idx.ndim, 3);
        assert_int_equal(idx.dims[0], 5);
        assert_int_equal(idx.dims[1], 2);
        assert_int_equal(idx.dims[2], 3);
        assert_int_equal(idx.count, 30);
        assert_memory_equal(idx.data, buf + 16, 30);
        carls_idx_free(&idx);
        assert_null(idx.data);
        assert_int_equal(carls_idx_read_gz(path, 0, &idx, err, sizeof err), 0); /* any ndim */
        carls_idx_free(&idx);
    }
    carls_idx_free(NULL);
}

static void test_idx_bad_files(void **state)
{
    (void)state;
    unsigned char buf[4096];
    uint32_t dims[3] = {4, 3, 3};
    size_t len = s_make_idx(buf, 3, dims, 36);

    char missing[512];
    snprintf(missing, sizeof missing, "%s/none.gz", test_scratch_dir);
    s_expect_bad(missing, 3, CARLS_IDX_ENOENT, "No such file");

    unsigned char b2[4096];
    memcpy(b2, buf, len);
    b2[0] = 1;
    s_expect_bad(s_write("magic.gz", b2, len, true), 3, CARLS_IDX_EFORMAT, "magic");

    memcpy(b2, buf, len);
    b2[2] = 0x0D; /* float elements */
    s_expect_bad(s_write("type.gz", b2, len, true), 3, CARLS_IDX_EFORMAT, "type 0x0d");

    s_expect_bad(s_write("ndim.gz", buf, len, true), 1, CARLS_IDX_EFORMAT, "dimensions");
    memcpy(b2, buf, len);
    b2[3] = 0;
    s_expect_bad(s_write("ndim0.gz", b2, len, true), 0, CARLS_IDX_EFORMAT, "dimensions");
    b2[3] = 9;
    s_expect_bad(s_write("ndim9.gz", b2, len, true), 0, CARLS_IDX_EFORMAT, "dimensions");

    uint32_t zero[3] = {4, 0, 3};
    size_t zl = s_make_idx(b2, 3, zero, 0);
    s_expect_bad(s_write("zero.gz", b2, zl, true), 3, CARLS_IDX_EFORMAT, "dimension 1 is 0");

    uint32_t huge[3] = {1u << 30, 28, 28};
    size_t hl = s_make_idx(b2, 3, huge, 0);
    s_expect_bad(s_write("huge.gz", b2, hl, true), 3, CARLS_IDX_EFORMAT, "dimension 0");

    uint32_t big[3] = {1u << 16, 1u << 16, 4}; /* each allowed, 2^34 bytes in all: over the cap */
    size_t bl = s_make_idx(b2, 3, big, 0);
    s_expect_bad(s_write("big.gz", b2, bl, true), 3, CARLS_IDX_EFORMAT, "exceed");

    s_expect_bad(s_write("short.gz", buf, len - 5, true), 3, CARLS_IDX_EFORMAT, "truncated");
    s_expect_bad(s_write("hdr.gz", buf, 2, true), 3, CARLS_IDX_EFORMAT, "truncated");
    s_expect_bad(s_write("dims.gz", buf, 9, true), 3, CARLS_IDX_EFORMAT, "truncated");
    s_expect_bad(s_write("empty.gz", buf, 0, true), 3, CARLS_IDX_EFORMAT, "truncated");

    memcpy(b2, buf, len);
    b2[len] = 7;
    s_expect_bad(s_write("trail.gz", b2, len + 1, true), 3, CARLS_IDX_EFORMAT, "trailing");

    /* A damaged gzip stream: a valid file cut in the middle of its compressed data, and one with its
     * compressed bytes overwritten. Either a stream error or a short read, never success. */
    uint32_t many[3] = {40, 10, 10};
    size_t ml = s_make_idx(b2, 3, many, 4000);
    const char *good = s_write("whole.gz", b2, ml, true);
    FILE *f = fopen(good, "rb");
    unsigned char gzbytes[8192];
    size_t gzlen = fread(gzbytes, 1, sizeof gzbytes, f);
    fclose(f);
    assert_true(gzlen > 40);
    const char *cut = s_write("cut.gz", gzbytes, gzlen / 2, false);
    carls_idx_t idx;
    char err[512];
    int rc = carls_idx_read_gz(cut, 3, &idx, err, sizeof err);
    printf("  cut gzip         -> %d: %s\n", rc, err);
    assert_true(rc == CARLS_IDX_EIO || rc == CARLS_IDX_EFORMAT);
    for (size_t i = 20; i < gzlen - 8; i++) {
        gzbytes[i] ^= 0x5a;
    }
    const char *garbled = s_write("garbled.gz", gzbytes, gzlen, false);
    rc = carls_idx_read_gz(garbled, 3, &idx, err, sizeof err);
    printf("  garbled gzip     -> %d: %s\n", rc, err);
    assert_true(rc == CARLS_IDX_EIO || rc == CARLS_IDX_EFORMAT);
}

static void s_write_set(const char *img_name, const char *lab_name, uint32_t n_img, uint32_t n_lab, int bad_label)
{
    unsigned char buf[2048];
    uint32_t dims[3] = {n_img, 4, 4};
    size_t len = s_make_idx(buf, 3, dims, (uint64_t)n_img * 16);
    s_write(img_name, buf, len, true);
    uint32_t ld[1] = {n_lab};
    len = s_make_idx(buf, 1, ld, 0);
    for (uint32_t i = 0; i < n_lab; i++) {
        buf[len++] = (unsigned char)(i % 10);
    }
    if (bad_label >= 0) {
        buf[len - 1] = (unsigned char)bad_label;
    }
    s_write(lab_name, buf, len, true);
}

static void test_image_sets(void **state)
{
    (void)state;
    char img[512], lab[512], err[1024];
    snprintf(img, sizeof img, "%s/i.gz", test_scratch_dir);
    snprintf(lab, sizeof lab, "%s/l.gz", test_scratch_dir);
    carls_image_set_t set;

    s_write_set("i.gz", "l.gz", 20, 20, -1);
    assert_int_equal(carls_image_set_load(img, lab, 10, &set, err, sizeof err), 0);
    assert_int_equal(set.n, 20);
    assert_int_equal(set.rows, 4);
    assert_int_equal(set.dim, 16);
    assert_int_equal(set.labels[13], 3);
    /* Batches: pixels / 255 and labels, in the order asked for. */
    uint32_t pick[2] = {7, 2};
    float x[32];
    int32_t y[2];
    carls_image_set_batch(&set, pick, 2, x, y);
    assert_int_equal(y[0], 7);
    assert_int_equal(y[1], 2);
    assert_float_equal(x[0], (float)((7 * 16) % 251) / 255.0f, 1e-7);
    assert_float_equal(x[16 + 5], (float)((2 * 16 + 5) % 251) / 255.0f, 1e-7);
    carls_image_set_free(&set);

    s_write_set("i.gz", "l.gz", 20, 19, -1);
    assert_int_equal(carls_image_set_load(img, lab, 10, &set, err, sizeof err), CARLS_FMNIST_EBAD);
    printf("  count mismatch: %s\n", err);
    assert_non_null(strstr(err, "19 labels"));
    assert_null(set.pixels);

    s_write_set("i.gz", "l.gz", 20, 20, 10);
    assert_int_equal(carls_image_set_load(img, lab, 10, &set, err, sizeof err), CARLS_FMNIST_EBAD);
    printf("  label range: %s\n", err);
    assert_non_null(strstr(err, "label 10"));

    /* A folder without the files: the message names the package. */
    carls_fmnist_t ds;
    assert_int_equal(carls_fmnist_load(test_scratch_dir, &ds, err, sizeof err), CARLS_FMNIST_EMISSING);
    printf("  missing: %s\n", err);
    assert_non_null(strstr(err, "dataset-fashion-mnist"));
    assert_null(ds.train.pixels);

    /* A folder with all four files (tiny): loads. */
    s_write_set("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 30, 30, -1);
    s_write_set("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10, 10, -1);
    assert_int_equal(carls_fmnist_load(test_scratch_dir, &ds, err, sizeof err), 0);
    assert_int_equal(ds.train.n, 30);
    assert_int_equal(ds.test.n, 10);
    carls_fmnist_free(&ds);
}

static void test_shuffle_and_subsets(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint32_t a[N], b[N];
    uint64_t s1 = 5, s2 = 5, s3 = 6;
    carls_iota_u32(a, N);
    carls_iota_u32(b, N);
    carls_shuffle_u32(a, N, &s1);
    carls_shuffle_u32(b, N, &s2);
    assert_memory_equal(a, b, sizeof a); /* same seed, same order */
    bool seen[N] = {false};
    for (int i = 0; i < N; i++) {
        assert_false(seen[a[i]]); /* a permutation */
        seen[a[i]] = true;
    }
    carls_iota_u32(b, N);
    carls_shuffle_u32(b, N, &s3);
    assert_memory_not_equal(a, b, sizeof a);

    uint8_t labels[N];
    for (int i = 0; i < N; i++) {
        labels[i] = (uint8_t)((i * 7) % 10);
    }
    uint32_t lab1[30], lab2[30], lab3[30], unl[N];
    assert_int_equal(carls_label_subset(labels, N, 10, 3, 0, lab1, unl), 0);
    assert_int_equal(carls_label_subset(labels, N, 10, 3, 0, lab2, NULL), 0);
    assert_int_equal(carls_label_subset(labels, N, 10, 3, 1, lab3, NULL), 0);
    assert_memory_equal(lab1, lab2, sizeof lab1);
    assert_memory_not_equal(lab1, lab3, sizeof lab1);
    bool chosen[N] = {false};
    for (int c = 0; c < 10; c++) {
        for (int k = 0; k < 3; k++) {
            uint32_t i = lab1[c * 3 + k];
            assert_int_equal(labels[i], c);
            assert_false(chosen[i]);
            chosen[i] = true;
        }
    }
    for (int u = 0; u < N - 30; u++) {
        assert_false(chosen[unl[u]]); /* disjoint ... */
        chosen[unl[u]] = true;
        if (u > 0) {
            assert_true(unl[u] > unl[u - 1]);
        }
    }
    for (int i = 0; i < N; i++) {
        assert_true(chosen[i]); /* ... and together everything */
    }
    uint32_t too_many[10 * 101];
    assert_int_equal(carls_label_subset(labels, N, 10, 101, 0, too_many, NULL), -1);
    assert_int_equal(carls_label_subset(labels, N, 10, 0, 0, too_many, NULL), -1);
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_idx_good_files),
    cmocka_unit_test(test_idx_bad_files),
    cmocka_unit_test(test_image_sets),
    cmocka_unit_test(test_shuffle_and_subsets))
