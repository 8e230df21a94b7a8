/* data/data_text: the word rule that data_text's corpus tokenizer and data_gcide's definition tokenizer
 * share (data_text_word_at): which bytes form words, outer apostrophes dropped, where the scan moves on. */
#include "data_text.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_word_rule),
        cmocka_unit_test(test_word_stops_at_len),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
