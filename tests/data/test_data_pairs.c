/* data/data_pairs: a two-tower data set from a TSV of query<TAB>document pairs and a candidates file: the
 * documents become sorted, unique headwords (trimmed, lowercased), each document's queries its senses in
 * file order, candidates headwords without senses (which a hold-out leaves alone); bad lines are refused
 * naming the file and the line. */
#include "data_pairs.h"
#include "test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

static const char *s_write(const char *name, const char *text)
{
    static char paths[2][512];
    static int which;
    which ^= 1;
    snprintf(paths[which], sizeof paths[which], "%s/%s", test_scratch_dir, name);
    FILE *f = fopen(paths[which], "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return paths[which];
}

static void test_load(void **state)
{
    (void)state;
    char spec[1200];
    const char *pairs =
        s_write("p.tsv", "A red fruit\tApple\n\nyellow and long\tbanana\r\nkeeps doctors away\t apple \n");
    const char *cands = s_write("c.txt", "cherry\nbanana\n\n");
    snprintf(spec, sizeof spec, "pairs:%s,%s", pairs, cands);
    data_gcide_t *g = NULL;
    char err[512];
    assert_int_equal(data_pairs_load(spec, &g, err, sizeof err), 0);
    assert_int_equal(g->n_words, 3);
    assert_string_equal(g->words[0], "apple");
    assert_string_equal(g->words[1], "banana");
    assert_string_equal(g->words[2], "cherry");
    assert_int_equal(g->n_senses, 3);
    assert_int_equal(g->word_first_sense[1], 2); /* apple: senses 0, 1 */
    assert_int_equal(g->word_first_sense[2], 3); /* banana: sense 2 */
    assert_int_equal(g->word_first_sense[3], 3); /* cherry: none */
    assert_int_equal(g->senses[1].number, 2);
    assert_int_equal(g->text->n_lines, 3);
    assert_non_null(strstr(g->text->text, "a red fruit\nkeeps doctors away\nyellow and long"));
    /* a hold-out of the one document with two senses; the candidate without any is not "all held out" */
    assert_int_equal(data_gcide_holdout_seed(g, 1, 1, err, sizeof err), 0);
    assert_int_equal(g->n_held_out, 1);
    char hold[600];
    snprintf(hold, sizeof hold, "%s/hold.tsv", test_scratch_dir);
    assert_int_equal(data_gcide_holdout_write(g, hold), 0);
    assert_int_equal(data_gcide_holdout_file(g, hold, err, sizeof err), 0);
    data_gcide_destroy(&g);
}

static void test_bad_lines(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"q\tapple\nno tab here\n", "p.tsv: line 2: expected QUERY<TAB>DOCUMENT"},
        {"q\ta\tb\n", "p.tsv: line 1: expected QUERY<TAB>DOCUMENT"},
        {"q\tapple\n123 456\tpear\n", "p.tsv: line 2: the query has no words"},
        {"q\t  \n", "p.tsv: line 1: empty document"},
        {"q\t#tag\n", "line 1: a document may not start with '#'"},
        {"q\tan extremely long document that goes on and on past sixty four bytes\n", "line 1: document of 68 bytes"},
        {"ok\tfine\nbad \xff byte\tx\n", "p.tsv: line 2: not UTF-8"},
        {"\n\n", "no pairs"},
    };
    char spec[600], err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(spec, sizeof spec, "pairs:%s", s_write("p.tsv", cases[i].text));
        data_gcide_t *g = NULL;
        err[0] = '\0';
        assert_int_equal(data_pairs_load(spec, &g, err, sizeof err), -1);
        assert_null(g);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].want);
    }
    data_gcide_t *g = NULL;
    snprintf(spec, sizeof spec, "pairs:%s,%s", s_write("p.tsv", "q\tx\n"), s_write("c.txt", "ok\n\t\n"));
    assert_int_equal(data_pairs_load(spec, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "c.txt: line 2: empty document"));
    assert_int_equal(data_pairs_load("gcide", &g, err, sizeof err), -1);
    assert_int_equal(data_pairs_load("pairs:", &g, err, sizeof err), -1);
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_load),
    cmocka_unit_test(test_bad_lines))
