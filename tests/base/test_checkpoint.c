/* base/checkpoint: round trip through a checkpoint directory, the latest pointer, pruning, and refusal of
 * every kind of bad file (bad magic, unsupported version, truncation, trailing bytes, checksum mismatch,
 * absurd counts and shapes, bad dtype, duplicate names, a hostile latest pointer).
 *
 * The corrupt files are made from a known good one whose layout the test spells out (see s_make_good), and,
 * where the point is to get past the checksum, the test recomputes the CRC itself. */
#include "bytes.h"
#include "checkpoint.h"
#include "test_util.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>
#include "test_main.h"

static void s_spit(const char *path, const unsigned char *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len) {
        assert_int_equal(fwrite(buf, 1, len, f), len);
    }
    fclose(f);
}

/* Recomputes the trailing CRC so that a crafted file gets past the checksum. */
static void s_fix_crc(unsigned char *buf, size_t len)
{
    carls_put_le32(buf + len - 4, (uint32_t)crc32(0L, buf, (uInt)(len - 4)));
}

/* Writes the reference checkpoint: kind "test", step 77, tensor "a" (2, 3) = 0..5 and "b" (4) = 10..13.
 * Layout: header 34 bytes + kind 4 = 38; "a" at 38: name_len@38 name@40 dtype@41 ndim@42 dims@43 data@59..82;
 * "b" at 83: name_len@83 name@85 dtype@86 ndim@87 dims@88 data@96..111; CRC@112; 116 bytes in all. */
static void s_make_good(const char *path)
{
    carls_ckpt_t *c = carls_ckpt_new("test", 77);
    assert_non_null(c);
    float a[6] = {0, 1, 2, 3, 4, 5}, b[4] = {10, 11, 12, 13};
    int64_t da[2] = {2, 3}, db[1] = {4};
    assert_int_equal(carls_ckpt_add(c, "a", 2, da, a), 0);
    assert_int_equal(carls_ckpt_add(c, "b", 1, db, b), 0);
    char err[512];
    assert_int_equal(carls_ckpt_write(c, path, err, sizeof err), 0);
    carls_ckpt_destroy(&c);
    assert_null(c);
}

/* Reads path, expects rc, and that the message mentions `word`. */
static void s_expect_refused(const char *path, int rc, const char *word)
{
    carls_ckpt_t *c = (carls_ckpt_t *)0x1;
    char err[512] = "";
    int got = carls_ckpt_read(path, &c, err, sizeof err);
    printf("  %-22s -> %d (%s): %s\n", word, got, carls_ckpt_strerror(got), err);
    assert_int_equal(got, rc);
    assert_null(c);
    assert_non_null(strstr(err, word));
}

static void test_round_trip_and_latest(void **state)
{
    (void)state;
    char dir[512], path[1024], latest[1024], err[512];
    snprintf(dir, sizeof dir, "%s/run/ckpts", test_scratch_dir); /* parents created on demand */
    float big[3 * 4 * 5];
    for (int i = 0; i < 60; i++) {
        big[i] = (float)i * 0.25f - 3.0f;
    }
    float tiny[1] = {-0.0f};
    int64_t dbig[3] = {3, 4, 5}, dtiny[1] = {1};
    for (uint64_t step = 100; step <= 300; step += 100) {
        carls_ckpt_t *c = carls_ckpt_new("mlp_classifier", step);
        assert_non_null(c);
        big[0] = (float)step;
        assert_int_equal(carls_ckpt_add(c, "enc.0.weight", 3, dbig, big), 0);
        assert_int_equal(carls_ckpt_add(c, "x", 1, dtiny, tiny), 0);
        assert_int_equal(carls_ckpt_save_to_dir(c, dir, path, sizeof path, err, sizeof err), 0);
        carls_ckpt_destroy(&c);
    }
    assert_int_equal(carls_ckpt_latest_path(dir, latest, sizeof latest, err, sizeof err), 0);
    assert_string_equal(latest, path);
    assert_non_null(strstr(latest, "ckpt-000000000300.ckpt"));
    uint64_t peeked = 0;
    assert_int_equal(carls_ckpt_peek_step(latest, &peeked, err, sizeof err), 0); /* the header alone */
    assert_true(peeked == 300);
    assert_int_equal(carls_ckpt_peek_step(dir, &peeked, err, sizeof err), CARLS_CKPT_EIO); /* a directory */

    carls_ckpt_t *r = NULL;
    assert_int_equal(carls_ckpt_read(latest, &r, err, sizeof err), 0);
    assert_non_null(r);
    assert_string_equal(carls_ckpt_kind(r), "mlp_classifier");
    assert_int_equal(carls_ckpt_step(r), 300);
    assert_int_equal(carls_ckpt_count(r), 2);
    const carls_ckpt_tensor_t *t = carls_ckpt_find(r, "enc.0.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->dims[0], 3);
    assert_int_equal(t->dims[1], 4);
    assert_int_equal(t->dims[2], 5);
    assert_int_equal(t->numel, 60);
    big[0] = 300.0f;
    assert_memory_equal(t->data, big, sizeof big);
    assert_ptr_equal(carls_ckpt_tensor(r, 0), t);
    const carls_ckpt_tensor_t *x = carls_ckpt_find(r, "x");
    assert_non_null(x);
    assert_memory_equal(x->data, tiny, sizeof tiny); /* bit-exact, sign of zero included */
    assert_null(carls_ckpt_find(r, "nope"));
    struct stat st;
    assert_int_equal(stat(latest, &st), 0);
    assert_int_equal(carls_ckpt_file_bytes(r), (uint64_t)st.st_size);
    carls_ckpt_destroy(&r);

    /* No temporary files left behind; prune keeps the newest (and never the one latest names). */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    int tmp_count = -1;
    assert_int_equal(fscanf(p, "%d", &tmp_count), 1);
    pclose(p);
    assert_int_equal(tmp_count, 0);
    assert_int_equal(carls_ckpt_prune(dir, 1, err, sizeof err), 2);
    assert_int_equal(carls_ckpt_read(latest, &r, err, sizeof err), 0);
    carls_ckpt_destroy(&r);
    snprintf(path, sizeof path, "%s/ckpt-000000000100.ckpt", dir);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_add_rejects_bad_tensors(void **state)
{
    (void)state;
    assert_null(carls_ckpt_new("", 1));
    char long_kind[CARLS_CKPT_MAX_KIND + 2];
    memset(long_kind, 'k', sizeof long_kind - 1);
    long_kind[sizeof long_kind - 1] = '\0';
    assert_null(carls_ckpt_new(long_kind, 1));
    carls_ckpt_t *c = carls_ckpt_new("k", 1);
    float v[4] = {0};
    int64_t ok[1] = {4}, zero[2] = {2, 0}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, huge[2] = {1 << 20, 1 << 20};
    assert_int_equal(carls_ckpt_add(c, "w", 1, ok, v), 0);
    assert_int_equal(carls_ckpt_add(c, "w", 1, ok, v), CARLS_CKPT_EINVAL);    /* duplicate */
    assert_int_equal(carls_ckpt_add(c, "", 1, ok, v), CARLS_CKPT_EINVAL);     /* empty name */
    assert_int_equal(carls_ckpt_add(c, "z", 2, zero, v), CARLS_CKPT_EINVAL);  /* zero dimension */
    assert_int_equal(carls_ckpt_add(c, "n", 9, nine, v), CARLS_CKPT_EINVAL);  /* too many dims */
    assert_int_equal(carls_ckpt_add(c, "h", 2, huge, v), CARLS_CKPT_EINVAL);  /* 2^40 elements */
    assert_int_equal(carls_ckpt_count(c), 1);
    carls_ckpt_destroy(&c);
    carls_ckpt_destroy(&c); /* NULL is fine */
}

static void test_write_failure_leaves_nothing(void **state)
{
    (void)state;
    carls_ckpt_t *c = carls_ckpt_new("k", 1);
    float v[1] = {1};
    int64_t d[1] = {1};
    assert_int_equal(carls_ckpt_add(c, "w", 1, d, v), 0);
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/no/such/dir/x.ckpt", test_scratch_dir);
    assert_int_equal(carls_ckpt_write(c, path, err, sizeof err), CARLS_CKPT_EIO);
    printf("  write to a missing directory: %s\n", err);
    assert_int_equal(access(path, F_OK), -1);
    carls_ckpt_destroy(&c);
}

static void test_refuses_bad_files(void **state)
{
    (void)state;
    char good[512], bad[512];
    snprintf(good, sizeof good, "%s/good.ckpt", test_scratch_dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", test_scratch_dir);
    s_make_good(good);
    size_t len;
    unsigned char *ref = test_read_file(good, 16, &len);
    assert_non_null(ref);
    assert_int_equal(len, 116); /* the layout described at s_make_good */
    assert_int_equal(ref[41], 1); /* "a": dtype f32 */
    assert_int_equal(ref[42], 2); /* "a": ndim */
    assert_int_equal(ref[85], 'b');
    unsigned char *buf = malloc(len + 16);
    carls_ckpt_t *c = NULL;
    char err[512];
    assert_int_equal(carls_ckpt_read(good, &c, err, sizeof err), 0);
    assert_int_equal(carls_ckpt_find(c, "b")->data[3], 13.0f);
    carls_ckpt_destroy(&c);

#define RESET() memcpy(buf, ref, len)

    RESET();
    buf[0] = 'X';
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_EMAGIC, "magic");
    uint64_t peeked;
    assert_int_equal(carls_ckpt_peek_step(bad, &peeked, err, sizeof err), CARLS_CKPT_EMAGIC);

    s_spit(bad, (const unsigned char *)"hello world, not a checkpoint", 29);
    s_expect_refused(bad, CARLS_CKPT_EMAGIC, "magic");

    RESET();
    carls_put_le32(buf + 8, 3); /* 1 and 2 are read (2: with blobs) */
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_EVERSION, "version 3");
    assert_int_equal(carls_ckpt_peek_step(bad, &peeked, err, sizeof err), CARLS_CKPT_EVERSION);
    s_spit(bad, ref, 20); /* cut inside the header */
    assert_int_equal(carls_ckpt_peek_step(bad, &peeked, err, sizeof err), CARLS_CKPT_EIO);

    size_t cuts[] = {0, 5, 11, 20, 37, 60, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        s_spit(bad, ref, cuts[i]);
        s_expect_refused(bad, CARLS_CKPT_ETRUNCATED, "truncated");
    }

    RESET();
    buf[len] = 0;
    s_spit(bad, buf, len + 1);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "trailing");

    RESET();
    buf[70] ^= 0x01; /* one bit of "a"'s data */
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECHECKSUM, "checksum");

    RESET();
    buf[113] ^= 0xff; /* the stored CRC itself */
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECHECKSUM, "checksum");

    RESET();
    carls_put_le32(buf + 12, 1000000000u); /* absurd count: refused before anything is allocated for it */
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "tensors");

    RESET();
    carls_put_le64(buf + 16, 1ull << 50); /* absurd stated length */
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "states");

    /* From here the CRC is made valid, so the structural checks are what refuses. */
    RESET();
    carls_put_le64(buf + 43, 1ull << 40); /* "a" dim 0 */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "dimension 0");

    RESET();
    carls_put_le64(buf + 43, 1ull << 20); /* 2^20 x 3 floats: within the caps, far beyond the file */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "remain");

    RESET();
    carls_put_le64(buf + 43, 0);
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "dimension 0");

    RESET();
    buf[42] = 9; /* ndim */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "dimensions");

    RESET();
    buf[41] = 7; /* dtype */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "dtype");

    RESET();
    buf[85] = 'a'; /* second tensor renamed to the first's name */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "twice");

    RESET();
    carls_put_le32(buf + 12, 3); /* says 3 tensors, holds 2 */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "past the end");

    RESET();
    carls_put_le32(buf + 12, 1); /* says 1 tensor, holds 2 */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "left after");

    RESET();
    buf[38] = 0; /* name length 0 */
    s_fix_crc(buf, len);
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "name length");

    RESET();
    buf[32] = 200; /* kind length over the cap */
    s_spit(bad, buf, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "kind length");
#undef RESET

    c = (carls_ckpt_t *)0x1;
    char missing[512];
    snprintf(missing, sizeof missing, "%s/missing.ckpt", test_scratch_dir);
    assert_int_equal(carls_ckpt_read(missing, &c, err, sizeof err), CARLS_CKPT_EIO);
    assert_null(c);
    free(buf);
    free(ref);
}

static void test_hostile_latest_pointer(void **state)
{
    (void)state;
    char dir[512], latest[600], out[1024], err[512];
    snprintf(dir, sizeof dir, "%s/hostile", test_scratch_dir);
    mkdir(dir, 0755);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    const char *bad[] = {"../../etc/passwd\n", "/etc/passwd\n", "..\n", "\n", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s_spit(latest, (const unsigned char *)bad[i], strlen(bad[i]));
        assert_int_equal(carls_ckpt_latest_path(dir, out, sizeof out, err, sizeof err), CARLS_CKPT_ECORRUPT);
    }
    s_spit(latest, (const unsigned char *)"ckpt-000000000005.ckpt\n", 23);
    assert_int_equal(carls_ckpt_latest_path(dir, out, sizeof out, err, sizeof err), 0);
    char want[1024];
    snprintf(want, sizeof want, "%s/ckpt-000000000005.ckpt", dir);
    assert_string_equal(out, want);
}

/* Blobs: a round trip (format version 2), the version-1 bytes of a checkpoint without blobs unchanged, names
 * unique across tensors and blobs, and refusal of a blob before a tensor, a version-2 file without blobs and a
 * blob in a version-1 file. Layout of the file below: the reference's 112 bytes before its CRC, then blob
 * "s" at 112: name_len@112 name@114 dtype@115 ndim@116 length@117 data@125..127 ("abc"); CRC@128; 132 bytes. */
static void test_blobs(void **state)
{
    (void)state;
    char good[1024], bad[1024], err[512];
    snprintf(good, sizeof good, "%s/blobs.ckpt", test_scratch_dir);
    snprintf(bad, sizeof bad, "%s/blobs-bad.ckpt", test_scratch_dir);
    s_make_good(good);
    size_t v1_len = 0;
    unsigned char *v1 = test_read_file(good, 0, &v1_len);
    assert_int_equal(v1_len, 116);
    assert_int_equal(carls_get_le32(v1 + 8), CARLS_CKPT_VERSION); /* no blobs: version 1, as before */

    carls_ckpt_t *c = NULL;
    assert_int_equal(carls_ckpt_read(good, &c, err, sizeof err), 0);
    float one = 1.0f;
    int64_t d1[1] = {1};
    assert_int_equal(carls_ckpt_add_text(c, "s", "abc"), 0);
    assert_int_equal(carls_ckpt_add_blob(c, "a", "x", 1), CARLS_CKPT_EINVAL); /* a tensor's name */
    assert_int_equal(carls_ckpt_add(c, "s", 1, d1, &one), CARLS_CKPT_EINVAL);  /* a blob's name */
    assert_int_equal(carls_ckpt_add_blob(c, "empty", "", 0), CARLS_CKPT_EINVAL);
    assert_int_equal(carls_ckpt_add_text(c, "t", ""), CARLS_CKPT_EINVAL);
    assert_int_equal(carls_ckpt_write(c, good, err, sizeof err), 0);
    carls_ckpt_destroy(&c);
    size_t len = 0;
    unsigned char *buf = test_read_file(good, 16, &len);
    assert_int_equal(len, 132);
    assert_int_equal(carls_get_le32(buf + 8), CARLS_CKPT_VERSION_BLOBS);
    assert_int_equal(carls_get_le32(buf + 12), 3); /* entries: two tensors and the blob */
    assert_memory_equal(buf, v1, 8);
    assert_memory_equal(buf + 12 + 4 + 8, v1 + 12 + 4 + 8, 112 - 24); /* step, kind and tensors unchanged */
    assert_int_equal(buf[115], 2);
    assert_memory_equal(buf + 125, "abc", 3);

    carls_ckpt_t *r = NULL;
    assert_int_equal(carls_ckpt_read(good, &r, err, sizeof err), 0);
    assert_int_equal(carls_ckpt_count(r), 2); /* blobs are not tensors */
    assert_null(carls_ckpt_find(r, "s"));
    assert_int_equal(carls_ckpt_blob_count(r), 1);
    size_t blen = 0;
    assert_string_equal(carls_ckpt_blob_name(r, 0, &blen), "s");
    assert_int_equal(blen, 3);
    assert_null(carls_ckpt_blob_name(r, 1, NULL));
    assert_string_equal(carls_ckpt_text(r, "s"), "abc");
    assert_null(carls_ckpt_text(r, "nope"));
    uint64_t v = 0;
    assert_int_equal(carls_ckpt_get_u64(r, "s", &v, err, sizeof err), CARLS_CKPT_ECORRUPT); /* not 8 bytes */
    assert_non_null(strstr(err, "'s'"));
    assert_int_equal(carls_ckpt_get_u64(r, "gone", &v, err, sizeof err), CARLS_CKPT_ECORRUPT);
    assert_non_null(strstr(err, "missing"));
    assert_int_equal(carls_ckpt_add_u64(r, "u", 0x0123456789abcdefULL), 0);
    unsigned char bytes[3] = {0, 1, 0};
    assert_int_equal(carls_ckpt_add_blob(r, "bin", bytes, 3), 0);
    assert_null(carls_ckpt_text(r, "bin")); /* a NUL inside: not a text */
    assert_int_equal(carls_ckpt_write(r, bad, err, sizeof err), 0);
    carls_ckpt_destroy(&r);
    assert_int_equal(carls_ckpt_read(bad, &r, err, sizeof err), 0);
    assert_int_equal(carls_ckpt_get_u64(r, "u", &v, err, sizeof err), 0);
    assert_true(v == 0x0123456789abcdefULL);
    assert_memory_equal(carls_ckpt_blob(r, "bin", &blen), bytes, 3);
    assert_int_equal(blen, 3);
    uint64_t peeked = 0;
    assert_int_equal(carls_ckpt_peek_step(bad, &peeked, err, sizeof err), 0);
    assert_true(peeked == 77);
    carls_ckpt_destroy(&r);

    unsigned char *m = malloc(len + 32);
    assert_non_null(m);
    /* A blob in a version-1 file: dtype 2 is unknown there. */
    memcpy(m, buf, len);
    carls_put_le32(m + 8, CARLS_CKPT_VERSION);
    s_fix_crc(m, len);
    s_spit(bad, m, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "unknown dtype 2");
    /* Version 2 without a blob: the reference's tensors under a version-2 header. */
    memcpy(m, v1, v1_len);
    carls_put_le32(m + 8, CARLS_CKPT_VERSION_BLOBS);
    s_fix_crc(m, v1_len);
    s_spit(bad, m, v1_len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "without blobs");
    /* A blob before a tensor: move blob "s" (16 bytes at 112) in front of tensor "b" (29 bytes at 83). */
    memcpy(m, buf, len);
    memcpy(m + 83, buf + 112, 16);
    memcpy(m + 99, buf + 83, 29);
    s_fix_crc(m, len);
    s_spit(bad, m, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "after a blob");
    /* A blob with two dimensions, and one longer than the file. */
    memcpy(m, buf, len);
    m[116] = 2;
    s_fix_crc(m, len);
    s_spit(bad, m, len);
    s_expect_refused(bad, CARLS_CKPT_ELIMIT, "dimensions");
    memcpy(m, buf, len);
    carls_put_le64(m + 117, 4);
    s_fix_crc(m, len);
    s_spit(bad, m, len);
    s_expect_refused(bad, CARLS_CKPT_ECORRUPT, "declared");
    free(m);
    free(buf);
    free(v1);
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_round_trip_and_latest),  cmocka_unit_test(test_add_rejects_bad_tensors),
    cmocka_unit_test(test_write_failure_leaves_nothing), cmocka_unit_test(test_refuses_bad_files),
    cmocka_unit_test(test_hostile_latest_pointer), cmocka_unit_test(test_blobs))
