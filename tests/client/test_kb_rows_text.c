/* Tests of kb_rows_text (kbctl's stdin rows): valid lines, every kind of invalid line with its reason and
 * line number, key lines, the exact float format ("%g" when exact, else "%.9g"), and exact round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_rows_text.h"
#include "protocol.h"
#include "util.h"
#include "test_proto.h"

/* Parses a NUL-terminated line; returns the parser's result and leaves the reason in err. */
static int s_parse(kb_rows_t *rows, const char *line, char *err, size_t errlen)
{
    err[0] = '\0';
    return kb_rows_parse_line(rows, line, strlen(line), err, errlen);
}

static void s_assert_key(const kb_rows_t *rows, size_t i, const char *want)
{
    kb_key_t k = kb_rows_key(rows, i);
    assert_int_equal(k.len, strlen(want));
    assert_memory_equal(k.data, want, k.len);
}

static void test_valid_lines(void **state)
{
    (void)state;
    kb_rows_t *rows = kb_rows_new(3);
    char err[256];
    assert_int_equal(s_parse(rows, "alpha\t1 2 3", err, sizeof err), 0);
    /* TABs and runs of blanks between numbers, blanks at both ends, CRLF, exponents, signs, hex floats. */
    assert_int_equal(s_parse(rows, "b e t a\t  -1.5\t\t2e-3   +4  \r", err, sizeof err), 0);
    assert_int_equal(s_parse(rows, "x\t0x1p-2 -0 1e-45", err, sizeof err), 0);
    assert_int_equal(rows->n, 3);
    s_assert_key(rows, 0, "alpha");
    s_assert_key(rows, 1, "b e t a");
    s_assert_key(rows, 2, "x");
    const float want[9] = {1, 2, 3, -1.5f, 2e-3f, 4, 0.25f, -0.0f, 1e-45f};
    for (int i = 0; i < 9; i++)
        assert_true(rows->values[i] == want[i]);
    assert_true(signbit(rows->values[7]));
    assert_true(rows->values[8] > 0); /* the smallest subnormal survives */
    kb_rows_destroy(&rows);
    assert_null(rows);
    kb_rows_destroy(&rows);
    kb_rows_destroy(NULL);
}

/* Each invalid line is refused with its reason, and leaves the rows as they were. */
static void test_invalid_lines(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        const char *reason; /* a part of the error text */
    } cases[] = {
        {"key 1 2 3", "no TAB"},
        {"\t1 2 3", "empty key"},
        {"k\t1 2", "expected 3 numbers after the key, got 2"},
        {"k\t1 2 3 4", "expected 3 numbers after the key, got 4"},
        {"k\t", "got 0"},
        {"k\t1 nan 3", "value 2 \"nan\" is not finite"},
        {"k\t1 2 inf", "value 3 \"inf\" is not finite"},
        {"k\t-infinity 2 3", "not finite"},
        {"k\t1e39 2 3", "value 1 \"1e39\" is not finite (or overflows a float)"},
        {"k\t1.0x 2 3", "value 1 \"1.0x\" is not a number"},
        {"k\t1,5 2 3", "is not a number"},
        {"k\t1 2 three", "value 3 \"three\" is not a number"},
        {"k\t1 2 3\x01", "is not a number"},
        {"", "no TAB"},
    };
    kb_rows_t *rows = kb_rows_new(3);
    char err[256];
    assert_int_equal(s_parse(rows, "good\t1 2 3", err, sizeof err), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = s_parse(rows, cases[i].line, err, sizeof err);
        if (rc != -1 || !strstr(err, cases[i].reason)) {
            print_error("line \"%s\": rc %d, err \"%s\", want \"%s\"\n", cases[i].line, rc, err, cases[i].reason);
            fail();
        }
    }
    assert_int_equal(rows->n, 1);
    s_assert_key(rows, 0, "good");
    assert_true(rows->values[0] == 1 && rows->values[2] == 3);

    /* Keys up to the limit are fine, one byte more is not. */
    size_t max = CARLS_DEFAULT_MAX_KEY_BYTES;
    char *line = malloc(max + 16);
    memset(line, 'k', max + 1);
    strcpy(line + max, "\t1 2 3");
    assert_int_equal(s_parse(rows, line, err, sizeof err), 0);
    memset(line, 'k', max + 1);
    strcpy(line + max + 1, "\t1 2 3");
    assert_int_equal(s_parse(rows, line, err, sizeof err), -1);
    assert_non_null(strstr(err, "longer than the limit"));
    free(line);
    assert_int_equal(rows->n, 2);
    kb_rows_destroy(&rows);
}

/* A line given with its length is not read past that length (no NUL needed). */
static void test_length_bounded(void **state)
{
    (void)state;
    kb_rows_t *rows = kb_rows_new(2);
    char err[256];
    const char buf[] = "k\t1 2 3 4";
    assert_int_equal(kb_rows_parse_line(rows, buf, 5, err, sizeof err), 0); /* "k\t1 2" */
    assert_true(rows->values[0] == 1 && rows->values[1] == 2);
    /* A number that is cut by the length is the shorter number. */
    const char buf2[] = "z\t7 89";
    assert_int_equal(kb_rows_parse_line(rows, buf2, 5, err, sizeof err), 0);
    assert_true(rows->values[3] == 8);
    kb_rows_destroy(&rows);
}

static FILE *s_mem_in(const char *text)
{
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    assert_non_null(f);
    return f;
}

/* kb_rows_read of text into rows with at most max_reports lines reported; returns its result, the number of
 * invalid lines in *bad and, unless report is NULL, the report in *report (caller frees). */
static int s_read_rows(kb_rows_t *rows, const char *text, size_t max_reports, size_t *bad, char **report)
{
    FILE *in = s_mem_in(text);
    size_t report_len = 0;
    FILE *errs = report ? open_memstream(report, &report_len) : NULL;
    int rc = kb_rows_read(rows, in, errs, max_reports, bad);
    if (errs)
        fclose(errs);
    fclose(in);
    return rc;
}

/* kb_rows_read: every invalid line is reported with its number (blank lines counted, not rows), blank
 * lines are skipped, and valid rows still collect. */
static void test_read_reports_line_numbers(void **state)
{
    (void)state;
    const char *text = "a\t1 2\n"
                       "\n"
                       "b\t1\n"       /* line 3: too few */
                       "c\t3 4\r\n"   /* CRLF ok */
                       "nokey 5 6\n"  /* line 5: no TAB */
                       "\r\n"         /* blank (CR only) */
                       "d\t5 nan\n"   /* line 7: nan */
                       "e\t7 8";      /* no final newline */
    kb_rows_t *rows = kb_rows_new(2);
    size_t bad = 0;
    char *report = NULL;
    assert_int_equal(s_read_rows(rows, text, 20, &bad, &report), -1);
    assert_int_equal(bad, 3);
    assert_string_equal(report, "line 3: expected 2 numbers after the key, got 1\n"
                                "line 5: no TAB after the key (expected KEY<TAB>2 numbers)\n"
                                "line 7: value 2 \"nan\" is not finite (or overflows a float)\n");
    assert_int_equal(rows->n, 3);
    s_assert_key(rows, 0, "a");
    s_assert_key(rows, 1, "c");
    s_assert_key(rows, 2, "e");
    assert_true(rows->values[2] == 3 && rows->values[5] == 8);
    free(report);
    kb_rows_destroy(&rows);

    /* All valid: 0. */
    rows = kb_rows_new(2);
    assert_int_equal(s_read_rows(rows, "x\t1 2\ny\t3 4\n", 20, &bad, NULL), 0);
    assert_int_equal(bad, 0);
    assert_int_equal(rows->n, 2);
    kb_rows_destroy(&rows);
}

/* Past max_reports the rest are counted in one line. */
static void test_read_caps_reports(void **state)
{
    (void)state;
    char text[1024] = "";
    for (int i = 0; i < 10; i++)
        strcat(text, "bad line\n");
    kb_rows_t *rows = kb_rows_new(1);
    size_t bad = 0;
    char *report = NULL;
    assert_int_equal(s_read_rows(rows, text, 3, &bad, &report), -1);
    assert_int_equal(bad, 10);
    assert_non_null(strstr(report, "line 3: "));
    assert_null(strstr(report, "line 4: "));
    assert_non_null(strstr(report, "... and 7 more invalid lines\n"));
    free(report);
    kb_rows_destroy(&rows);
}

static void test_key_lines(void **state)
{
    (void)state;
    FILE *in = s_mem_in("plain\nwith space\tand tab\r\n\n\xc3\xa9t\xc3\xa9\n");
    kb_rows_t *rows = kb_rows_new(0);
    assert_int_equal(kb_rows_read(rows, in, NULL, 20, NULL), 0);
    fclose(in);
    assert_int_equal(rows->n, 3);
    s_assert_key(rows, 0, "plain");
    s_assert_key(rows, 1, "with space\tand tab");
    s_assert_key(rows, 2, "\xc3\xa9t\xc3\xa9");
    assert_null(rows->values);
    char err[128];
    assert_int_equal(kb_rows_parse_key_line(rows, "\r", 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "empty key"));
    assert_int_equal(rows->n, 3);
    kb_rows_destroy(&rows);
}

/* Many rows: storage grows and keeps every key and value in place. */
static void test_many_rows(void **state)
{
    (void)state;
    kb_rows_t *rows = kb_rows_new(2);
    char key[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        float v[2] = {(float)i, (float)-i};
        kb_rows_append(rows, key, strlen(key), v);
    }
    assert_int_equal(rows->n, 5000);
    for (int i = 0; i < 5000; i += 997) {
        snprintf(key, sizeof key, "key-%d", i);
        s_assert_key(rows, (size_t)i, key);
        assert_true(rows->values[2 * i] == (float)i && rows->values[2 * i + 1] == (float)-i);
    }
    kb_rows_destroy(&rows);
}

/* Floats print with "%g" when that reads back to the same bits, else with "%.9g". */
static void test_format_float(void **state)
{
    (void)state;
    static const struct {
        float v;
        const char *want;
    } cases[] = {
        {0.1f, "0.1"},
        {1.0f, "1"},
        {-0.5f, "-0.5"},
        {0.0f, "0"},
        {-0.0f, "-0"},
        {1e-30f, "1e-30"},
        {1.0f / 3.0f, "0.333333343"},
        {FLT_MAX, "3.40282347e+38"},
        {-FLT_MAX, "-3.40282347e+38"},
        {FLT_MIN, "1.17549435e-38"},
        {1e-45f, "1.4013e-45"},     /* the smallest subnormal */
        {16777217.0f, "16777216"},  /* 2^24 + 1 is not a float: it is 2^24, and "%g" says 1.67772e+07 */
        {123456.789f, "123456.789"},
        {0.3f, "0.3"},
    };
    char buf[KB_ROWS_FLOAT_CHARS];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int len = kb_rows_format_float(cases[i].v, buf, sizeof buf);
        assert_int_equal(len, (int)strlen(buf));
        if (strcmp(buf, cases[i].want) != 0) {
            print_error("case %zu: got \"%s\" want \"%s\"\n", i, buf, cases[i].want);
            fail();
        }
    }
    /* Every one of many random finite floats reads back exactly. */
    uint64_t rng = 7;
    for (int i = 0; i < 100000; i++) {
        uint32_t bits = (uint32_t)carls_splitmix64(&rng);
        float v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v))
            continue;
        kb_rows_format_float(v, buf, sizeof buf);
        float back = strtof(buf, NULL);
        assert_memory_equal(&back, &v, sizeof v);
    }
}

/* Writing rows and parsing them back gives the same bits for ordinary, tiny, huge and special-signed
 * floats and for many random bit patterns. */
static void test_round_trip(void **state)
{
    (void)state;
    enum { DIM = 8, RANDOM_ROWS = 2000 };
    float vals[DIM] = {0.1f, -1.0f / 3.0f, FLT_MAX, -FLT_MAX, FLT_MIN, 1e-45f, -0.0f, 16777217.0f};
    uint64_t rng = 42;
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    kb_rows_t *want = kb_rows_new(DIM);
    for (int r = 0; r <= RANDOM_ROWS; r++) {
        if (r > 0) {
            for (int j = 0; j < DIM; j++) {
                uint32_t bits;
                do {
                    bits = (uint32_t)carls_splitmix64(&rng);
                    memcpy(&vals[j], &bits, sizeof bits);
                } while (!isfinite(vals[j]));
            }
        }
        char key[32];
        snprintf(key, sizeof key, "row%d", r);
        kb_rows_append(want, key, strlen(key), vals);
        assert_int_equal(kb_rows_write_row(out, key, strlen(key), vals, DIM), 0);
        fputc('\n', out);
    }
    fclose(out);
    FILE *in = s_mem_in(text);
    kb_rows_t *got = kb_rows_new(DIM);
    assert_int_equal(kb_rows_read(got, in, stderr, 5, NULL), 0);
    fclose(in);
    assert_int_equal(got->n, want->n);
    assert_memory_equal(got->values, want->values, want->n * DIM * sizeof(float));
    assert_int_equal(got->key_bytes_len, want->key_bytes_len);
    assert_memory_equal(got->key_bytes, want->key_bytes, want->key_bytes_len);
    /* Single spaces between values, a TAB after the key. */
    const char *row0 = "row0\t0.1 -0.333333343 3.40282347e+38 -3.40282347e+38 1.17549435e-38 1.4013e-45 -0 16777216\n";
    assert_true(strncmp(text, row0, strlen(row0)) == 0);
    free(text);
    kb_rows_destroy(&want);
    kb_rows_destroy(&got);
}

/* ---- feature lines ---- */

/* Writes a feature line for (key, rec) into a string (caller frees). */
static char *s_feature_text(const void *key, size_t len, const Carls__FeatureRecord *rec, bool meta)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    assert_non_null(f);
    assert_int_equal(kb_feature_write_line(f, key, len, rec, meta), 0);
    fclose(f);
    return buf;
}

static int s_parse_feature(kb_feature_rows_t *rows, const char *line, char *err, size_t errlen)
{
    err[0] = '\0';
    return kb_feature_parse_line(rows, line, strlen(line), err, errlen);
}

static void test_feature_lines_parse(void **state)
{
    (void)state;
    kb_feature_rows_t *rows = kb_feature_rows_new();
    char err[256];
    assert_int_equal(s_parse_feature(rows, "n%201\tlabel=-3 confidence=0.9 version=2 neighbors=a:0.5,b%2Cx:-0.25 "
                                           "data=00fFa0", err, sizeof err), 0);
    assert_int_equal(s_parse_feature(rows, "n2\t\tflabel=1e-3\tupdated_at_ms=1700000000000 ", err, sizeof err), 0);
    assert_int_equal(s_parse_feature(rows, "n3\t", err, sizeof err), 0);
    assert_int_equal(s_parse_feature(rows, "n4\tfound=false", err, sizeof err), 0);
    assert_int_equal(s_parse_feature(rows, "n5\tneighbors= version=0\r", err, sizeof err), 0);
    assert_int_equal(rows->keys->n, 4);
    assert_int_equal(rows->skipped, 1);
    kb_key_t k = kb_rows_key(rows->keys, 0);
    assert_int_equal(k.len, 3);
    assert_memory_equal(k.data, "n 1", 3);
    const Carls__FeatureRecord *r = rows->records[0];
    assert_int_equal(r->label_case, CARLS__FEATURE_RECORD__LABEL_INT_LABEL);
    assert_int_equal(r->int_label, -3);
    assert_true(r->label_confidence == 0.9f);
    assert_int_equal(r->version, 2);
    assert_int_equal(r->n_neighbor_keys, 2);
    assert_int_equal(r->n_neighbor_weights, 2);
    assert_int_equal(r->neighbor_keys[1].len, 3);
    assert_memory_equal(r->neighbor_keys[1].data, "b,x", 3);
    assert_true(r->neighbor_weights[0] == 0.5f && r->neighbor_weights[1] == -0.25f);
    assert_int_equal(r->data.len, 3);
    assert_memory_equal(r->data.data, "\x00\xff\xa0", 3);
    r = rows->records[1];
    assert_int_equal(r->label_case, CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL);
    assert_true(r->float_label == 1e-3f);
    assert_int_equal(r->label_case == CARLS__FEATURE_RECORD__LABEL__NOT_SET, false);
    r = rows->records[2];
    assert_int_equal(r->label_case, CARLS__FEATURE_RECORD__LABEL__NOT_SET);
    assert_int_equal(r->n_neighbor_keys, 0);
    assert_int_equal(r->data.len, 0);
    k = kb_rows_key(rows->keys, 3);
    assert_memory_equal(k.data, "n5", 2);
    kb_feature_rows_destroy(&rows);
    assert_null(rows);
    kb_feature_rows_destroy(&rows);
}

static void test_feature_lines_invalid(void **state)
{
    (void)state;
    struct {
        const char *line, *reason;
    } bad[] = {
        {"no tab here label=1", "no TAB"},
        {"\tlabel=1", "key is empty"},
        {"k%2\tlabel=1", "two hex digits"},
        {"k%zz\tlabel=1", "two hex digits"},
        {"k\tlabel", "not NAME=VALUE"},
        {"k\tcolour=red", "unknown field"},
        {"k\tlabel=1 label=2", "appears twice"},
        {"k\tlabel=1 flabel=2", "exclude each other"},
        {"k\tlabel=1.5", "whole number"},
        {"k\tlabel=99999999999999999999", "whole number"},
        {"k\tflabel=nan", "not a finite number"},
        {"k\tconfidence=", "wants a number"},
        {"k\tversion=-1", "version= wants"},
        {"k\tneighbors=a", "no ':WEIGHT'"},
        {"k\tneighbors=a:inf", "not a finite number"},
        {"k\tneighbors=:1", "neighbour 1 is empty"},
        {"k\tneighbors=a:1,", "no ':WEIGHT'"},
        {"k\tdata=abc", "even number"},
        {"k\tdata=zz", "not a hex digit"},
        {"k\tfound=true", "can only be false"},
        {"k\tfound=false label=1", "stands alone"},
    };
    kb_feature_rows_t *rows = kb_feature_rows_new();
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (s_parse_feature(rows, bad[i].line, err, sizeof err) != -1 || !strstr(err, bad[i].reason))
            fail_msg("line \"%s\": got \"%s\", want a reason with \"%s\"", bad[i].line, err, bad[i].reason);
    }
    assert_int_equal(rows->keys->n, 0);
    assert_int_equal(rows->skipped, 0);
    /* An over-long key, before and after decoding. */
    char line[4 * CARLS_DEFAULT_MAX_KEY_BYTES];
    memset(line, 'a', CARLS_DEFAULT_MAX_KEY_BYTES + 1);
    strcpy(line + CARLS_DEFAULT_MAX_KEY_BYTES + 1, "\t");
    assert_int_equal(s_parse_feature(rows, line, err, sizeof err), -1);
    assert_non_null(strstr(err, "longer than"));
    /* 1024 bytes written as %XX (3072 characters) are fine. */
    for (size_t i = 0; i < CARLS_DEFAULT_MAX_KEY_BYTES; i++)
        memcpy(line + 3 * i, "%2C", 3);
    strcpy(line + 3 * CARLS_DEFAULT_MAX_KEY_BYTES, "\t");
    assert_int_equal(s_parse_feature(rows, line, err, sizeof err), 0);
    assert_int_equal(kb_rows_key(rows->keys, 0).len, CARLS_DEFAULT_MAX_KEY_BYTES);
    kb_feature_rows_destroy(&rows);
}

/* Whatever kb_feature_write_line prints reads back to the same record, for awkward keys and exact floats. */
static void test_feature_lines_round_trip(void **state)
{
    (void)state;
    static const char key[] = "a b\t%:,=\n\x01\xff/end";
    ProtobufCBinaryData nbrs[3] = {{3, (uint8_t *)"x=y"}, {2, (uint8_t *)"\x00\x7f"}, {1, (uint8_t *)"z"}};
    float w[3] = {0.1f, -3.40282347e+38f, 1e-45f};
    Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
    rec.found = true;
    test_record_neighbors(&rec, nbrs, w, 3);
    rec.label_case = CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL;
    rec.float_label = 0.3f;
    rec.label_confidence = -0.0f;
    rec.version = UINT64_MAX;
    rec.data = (ProtobufCBinaryData){4, (uint8_t *)"\xde\xad\x00\x01"};
    rec.updated_at_ms = 1234;
    char *text = s_feature_text(key, sizeof key - 1, &rec, true);
    /* Nothing in the line but printable ASCII, one TAB, and spaces between fields. */
    for (const char *p = text; *p; p++)
        assert_true((*p >= 0x20 && *p <= 0x7e) || *p == '\t');
    assert_non_null(strstr(text, "updated_at_ms=1234"));
    assert_non_null(strstr(text, "data=dead0001"));
    char n1[KB_ROWS_FLOAT_CHARS], n2[KB_ROWS_FLOAT_CHARS], want[160];
    kb_rows_format_float(w[1], n1, sizeof n1);
    kb_rows_format_float(w[2], n2, sizeof n2);
    snprintf(want, sizeof want, "neighbors=x%%3Dy:0.1,%%00%%7F:%s,z:%s ", n1, n2);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "a%20b%09%25%3A%2C%3D%0A%01%FF/end\t"));

    kb_feature_rows_t *rows = kb_feature_rows_new();
    char err[256];
    assert_int_equal(s_parse_feature(rows, text, err, sizeof err), 0);
    kb_key_t k = kb_rows_key(rows->keys, 0);
    assert_int_equal(k.len, sizeof key - 1);
    assert_memory_equal(k.data, key, k.len);
    const Carls__FeatureRecord *r = rows->records[0];
    assert_int_equal(r->n_neighbor_keys, 3);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(r->neighbor_keys[j].len, nbrs[j].len);
        assert_memory_equal(r->neighbor_keys[j].data, nbrs[j].data, nbrs[j].len);
        assert_memory_equal(&r->neighbor_weights[j], &w[j], sizeof(float));
    }
    assert_int_equal(r->label_case, CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL);
    assert_true(r->float_label == 0.3f);
    assert_true(signbit(r->label_confidence));
    assert_int_equal(r->version, UINT64_MAX);
    assert_int_equal(r->data.len, 4);
    assert_memory_equal(r->data.data, "\xde\xad\x00\x01", 4);
    free(text);

    /* Written again, the parsed record gives the same line (without meta). */
    char *a = s_feature_text(key, sizeof key - 1, &rec, false);
    Carls__FeatureRecord again = *r;
    again.found = true;
    char *b = s_feature_text(k.data, k.len, &again, false);
    assert_string_equal(a, b);
    free(a);
    free(b);

    /* Defaults are left out; a missing record is found=false; an int label. */
    Carls__FeatureRecord empty = CARLS__FEATURE_RECORD__INIT;
    empty.found = true;
    text = s_feature_text("e", 1, &empty, false);
    assert_string_equal(text, "e\t");
    free(text);
    empty.found = false;
    text = s_feature_text("e", 1, &empty, true);
    assert_string_equal(text, "e\tfound=false");
    free(text);
    text = s_feature_text("e", 1, NULL, false);
    assert_string_equal(text, "e\tfound=false");
    free(text);
    empty.found = true;
    empty.label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
    empty.int_label = INT64_MIN;
    text = s_feature_text("e", 1, &empty, false);
    assert_string_equal(text, "e\tlabel=-9223372036854775808");
    assert_int_equal(s_parse_feature(rows, text, err, sizeof err), 0);
    assert_int_equal(rows->records[1]->int_label, INT64_MIN);
    free(text);
    kb_feature_rows_destroy(&rows);
}

/* kb_feature_rows_read: line numbers and the cap on reports, as for rows. */
static void test_feature_rows_read(void **state)
{
    (void)state;
    const char *input = "a\tlabel=1\n\nb\tlabel=x\nc\tfound=false\nd\tbogus=1\n";
    FILE *in = s_mem_in(input);
    char *errs = NULL;
    size_t errs_len = 0;
    FILE *err = open_memstream(&errs, &errs_len);
    kb_feature_rows_t *rows = kb_feature_rows_new();
    size_t bad = 0;
    assert_int_equal(kb_feature_rows_read(rows, in, err, 20, &bad), -1);
    fclose(in);
    fclose(err);
    assert_int_equal(bad, 2);
    assert_non_null(strstr(errs, "line 3: label= wants a whole number"));
    assert_non_null(strstr(errs, "line 5: unknown field"));
    assert_int_equal(rows->keys->n, 1);
    assert_int_equal(rows->skipped, 1);
    free(errs);
    kb_feature_rows_destroy(&rows);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_valid_lines),
    cmocka_unit_test(test_invalid_lines),
    cmocka_unit_test(test_length_bounded),
    cmocka_unit_test(test_read_reports_line_numbers),
    cmocka_unit_test(test_read_caps_reports),
    cmocka_unit_test(test_key_lines),
    cmocka_unit_test(test_many_rows),
    cmocka_unit_test(test_format_float),
    cmocka_unit_test(test_round_trip),
    cmocka_unit_test(test_feature_lines_parse),
    cmocka_unit_test(test_feature_lines_invalid),
    cmocka_unit_test(test_feature_lines_round_trip),
    cmocka_unit_test(test_feature_rows_read))
