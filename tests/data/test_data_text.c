/* data/data_text: the word rule that data_text's corpus tokenizer and data_gcide's definition tokenizer
 * share (data_text_word_at): which bytes form words, outer apostrophes dropped, where the scan moves on; a
 * directory as a corpus, and the UTF-8 check that names the file and the line. */
#include "data_text.h"
#include "test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

#include <sys/stat.h>

/* Every word of text, as data_text_word_at finds them, joined by '|' into out (empty words kept as ""). */
static void s_words(const char *text, char *out, size_t outlen)
{
    size_t len = strlen(text), i = 0, o = 0;
    out[0] = '\0';
    while (i < len) {
        size_t before = i, s = 99, e = 99;
        if (!data_text_word_at(text, len, &i, &s, &e)) {
            assert_int_equal(i, before); /* untouched when no word starts here */
            assert_int_equal(s, 99);
            i++;
            continue;
        }
        assert_true(i > before);
        assert_true(before <= s && s <= e && e <= i);
        o += (size_t)snprintf(out + o, outlen - o, "%s%.*s", o ? "|" : "", (int)(e - s), text + s);
    }
}

static void test_word_rule(void **state)
{
    (void)state;
    char got[256];
    s_words("In the Beginning, GOD's word--'tis true'.", got, sizeof got);
    assert_string_equal(got, "In|the|Beginning|GOD's|word|tis|true"); /* case is the caller's business */
    s_words("caf\xc3\xa9 na\xc3\xafve 42 x", got, sizeof got);
    assert_string_equal(got, "caf\xc3\xa9|na\xc3\xafve|x"); /* bytes >= 0x80 belong to words, digits do not */
    s_words("a '' b\n'c'", got, sizeof got);
    assert_string_equal(got, "a||b|c"); /* apostrophes alone: an empty word the callers skip */
    s_words(" ,.;\n", got, sizeof got);
    assert_string_equal(got, "");
}

static void test_word_stops_at_len(void **state)
{
    (void)state;
    const char *text = "abcdef";
    size_t i = 0, s, e;
    assert_int_equal(data_text_word_at(text, 3, &i, &s, &e), 1);
    assert_int_equal(i, 3);
    assert_int_equal(s, 0);
    assert_int_equal(e, 3);
}

/* A directory corpus: its files by path (subdirectories too, hidden names skipped), a file's last line not
 * joined to the next file's first; a file that is not UTF-8 is refused naming the file and the line. */
static void test_directory_and_utf8(void **state)
{
    (void)state;
    char dir[64], path[128];
    assert_int_equal(test_tmpdir(dir, sizeof dir, "text"), 0);
    snprintf(path, sizeof path, "%s/sub", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    static const struct {
        const char *name, *text;
    } files[] = {{"b.txt", "Second file\n"}, {"a.txt", "First line\nno newline at the end"},
                 {"sub/c.txt", "caf\xc3\xa9 na\xc3\xafve\n"}, {".hidden", "\xff\xfe\n"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(files[i].text, f);
        fclose(f);
    }
    data_text_t *t = NULL;
    char err[512];
    assert_int_equal(data_text_load(dir, &t, err, sizeof err), 0);
    assert_int_equal(t->n_lines, 4);
    assert_string_equal(t->text, "first line\nno newline at the end\nsecond file\ncaf\xc3\xa9 na\xc3\xafve\n");
    data_text_destroy(&t);
    snprintf(path, sizeof path, "%s/sub/d.txt", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("fine\nstill fine\nlatin-1 caf\xe9\n", f);
    fclose(f);
    assert_int_equal(data_text_load(dir, &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "sub/d.txt: line 3: not UTF-8 (byte 0xe9"));
    assert_int_equal(data_text_load(path, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "d.txt: line 3: not UTF-8"));
    assert_int_equal(data_text_check_utf8("x", "\xed\xa0\x80", 3, err, sizeof err), -1); /* a surrogate */
    assert_int_equal(data_text_check_utf8("x", "\xf0\x9f\x98\x80", 4, err, sizeof err), 0);
    test_rmrf(dir);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_word_rule),
    cmocka_unit_test(test_word_stops_at_len),
    cmocka_unit_test(test_directory_and_utf8))
