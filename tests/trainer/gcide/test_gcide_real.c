/* The GCIDE data set from the installed dictionary (Debian's dict-gcide): counts in a sane range, known
 * headwords with their first senses, the hold-out, and the TF-IDF baseline well above chance. Exits 77
 * (CTest: skipped) when the package is not installed. */
#include "data_gcide.h"
#include "trainer_rank.h"
#include "trainer_tfidf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static data_gcide_t *s_g;

static int s_setup(void **state)
{
    (void)state;
    char err[512];
    if (data_gcide_load(NULL, NULL, &s_g, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    data_gcide_destroy(&s_g);
    return 0;
}

/* Whether line `line` of the text starts with the words of prefix. */
static void s_expect_prefix(const data_gcide_t *g, const char *word, uint32_t number, const char *prefix)
{
    long w = data_gcide_find(g, word);
    if (w < 0)
        fail_msg("\"%s\" is not a headword", word);
    size_t s = g->word_first_sense[w] + number - 1;
    assert_true(s < g->word_first_sense[w + 1]);
    char buf[4096];
    size_t o = 0;
    for (size_t k = g->text->line_start[s]; k < g->text->line_start[s + 1] && o < 3000; k++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%.*s", o ? " " : "", (int)g->text->tok_len[k],
                              data_text_token(g->text, k));
    if (strncmp(buf, prefix, strlen(prefix)) != 0)
        fail_msg("%s sense %u is \"%s\", expected it to start with \"%s\"", word, number, buf, prefix);
}

static void test_counts(void **state)
{
    (void)state;
    const data_gcide_t *g = s_g;
    printf("headwords=%zu senses=%zu headword_in_definition=%.4f load_ms=%.0f\n", g->n_words, g->n_senses,
           (double)g->stats.senses_with_headword / (double)g->stats.senses_parsed, g->stats.load_ms);
    assert_in_range(g->n_words, 80000, 130000);
    assert_in_range(g->n_senses, 130000, 230000);
    assert_int_equal(g->text->n_lines, g->n_senses);
    assert_int_equal(g->word_first_sense[g->n_words], g->n_senses);
    for (size_t w = 0; w < g->n_words; w++) {
        assert_true(g->word_first_sense[w + 1] > g->word_first_sense[w]);
        assert_true(w == 0 || strcmp(g->words[w - 1], g->words[w]) < 0);
        for (const char *c = g->words[w]; *c; c++)
            assert_true(*c >= 'a' && *c <= 'z');
        for (size_t s = g->word_first_sense[w]; s < g->word_first_sense[w + 1]; s++) {
            assert_int_equal(g->senses[s].word, w);
            assert_int_equal(g->senses[s].number, s - g->word_first_sense[w] + 1);
        }
    }
    double share = (double)g->stats.senses_with_headword / (double)g->stats.senses_parsed;
    assert_true(share > 0.3 && share < 0.6);
}

static void test_known_words(void **state)
{
    (void)state;
    const data_gcide_t *g = s_g;
    s_expect_prefix(g, "abandon", 1, "to cast or drive out to banish to expel to reject");
    s_expect_prefix(g, "abandon", 2, "to give up absolutely to forsake entirely");
    s_expect_prefix(g, "bank", 1, "a mound pile or ridge of earth raised above the surrounding level");
    s_expect_prefix(g, "banc", 1, "a bench a high seat or seat of distinction");
    s_expect_prefix(g, "quixotic", 1, "like don romantic to extravagance"); /* "quixote" masked */
    s_expect_prefix(g, "dog", 1, "zool a quadruped of the genus canis esp the domestic canis familiaris");
    long bank = data_gcide_find(g, "bank");
    assert_true(g->word_first_sense[bank + 1] - g->word_first_sense[bank] >= 20);
    /* Inflections and variants pointing at another headword's article own no senses. */
    assert_int_equal(data_gcide_find(g, "banked"), -1);
    assert_int_equal(data_gcide_find(g, "bancus"), -1);
    assert_int_equal(data_gcide_find(g, "zzzzzz"), -1);
}

static void test_holdout_and_tfidf(void **state)
{
    (void)state;
    data_gcide_t *g = s_g;
    char err[256];
    assert_int_equal(data_gcide_holdout_seed(g, 0, 2000, err, sizeof err), 0);
    assert_int_equal(g->n_held_out, 2000);
    bool *first = calloc(g->n_senses, sizeof *first);
    for (size_t s = 0; s < g->n_senses; s++)
        first[s] = g->senses[s].held_out;
    assert_int_equal(data_gcide_holdout_seed(g, 0, 200, err, sizeof err), 0);
    assert_int_equal(g->n_held_out, 200);
    tfidf_t *t = NULL;
    tfidf_build(g, &t);
    float *scores = malloc(g->n_words * sizeof *scores);
    uint32_t ranks[200];
    size_t n = 0;
    for (size_t s = 0; s < g->n_senses; s++) {
        if (g->senses[s].held_out) {
            tfidf_scores(t, g, s, scores);
            ranks[n++] = rank_of_truth(scores, g->n_words, g->senses[s].word);
        }
    }
    rank_metrics_t m;
    rank_metrics(ranks, n, &m);
    rank_metrics_print(stdout, "tfidf_", &m);
    assert_int_equal(m.n, 200);
    assert_true(m.r100 > 0.1);                         /* chance: 100 / ~100k */
    assert_true(m.median_rank < (double)g->n_words / 4); /* chance: half of them */
    /* The same seed gives the same hold-out. */
    assert_int_equal(data_gcide_holdout_seed(g, 0, 2000, err, sizeof err), 0);
    for (size_t s = 0; s < g->n_senses; s++)
        assert_int_equal(first[s], g->senses[s].held_out);
    free(scores);
    free(first);
    tfidf_destroy(&t);
}

int main(void)
{
    if (access(DATA_GCIDE_INDEX, R_OK) != 0) {
        printf("SKIP: dict-gcide not installed\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_known_words),
        cmocka_unit_test(test_holdout_and_tfidf),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
