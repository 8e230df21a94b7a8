/* Unit tests of the word2vec pieces that need no server: tokenization and KJV stripping, worker slices, the
 * batch word map, the SGNS op against a double-precision reference, vector files and the quality checks. */
#include "data_text.h"
#include "nn_sgns.h"
#include "trainer_w2v.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

static void s_expect_tokens(const data_text_t *t, size_t line, const char *expect)
{
    char buf[512];
    size_t o = 0;
    for (size_t k = t->line_start[line]; k < t->line_start[line + 1]; k++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%.*s", o ? " " : "", (int)t->tok_len[k],
                              data_text_token(t, k));
    buf[o] = '\0';
    assert_string_equal(buf, expect);
}

static void test_tokenize(void **state)
{
    (void)state;
    const char *raw = "In the Beginning, GOD's word--'tis true'.\n\n  \n...!\nA\xc3\xa9"
                      "b c\tD'\n'''\nlast";
    data_text_t *t = NULL;
    char err[128];
    assert_int_equal(data_text_from_buffer(raw, strlen(raw), &t, err, sizeof err), 0);
    assert_int_equal(t->n_lines, 3);
    s_expect_tokens(t, 0, "in the beginning god's word tis true");
    s_expect_tokens(t, 1, "a\xc3\xa9" "b c d");
    s_expect_tokens(t, 2, "last");
    assert_int_equal(t->line_start[3], t->n_tokens);
    data_text_destroy(&t);
    assert_null(t);
    data_text_destroy(&t);

    assert_int_equal(data_text_from_buffer(" ,.;\n\n", 6, &t, err, sizeof err), -1);
    assert_null(t);

    /* A run longer than the token limit is cut into pieces. */
    char longw[600];
    memset(longw, 'x', sizeof longw);
    assert_int_equal(data_text_from_buffer(longw, sizeof longw, &t, err, sizeof err), 0);
    assert_int_equal(t->n_tokens, 3);
    assert_int_equal(t->tok_len[0], DATA_TEXT_MAX_TOKEN);
    assert_int_equal(t->tok_len[2], 600 - 2 * DATA_TEXT_MAX_TOKEN);
    data_text_destroy(&t);
}

static void test_strip_bible(void **state)
{
    (void)state;
    const char *raw = "\nGenesis 1\n\n  1 In the beginning God created.\n  2 And the earth.\n"
                      "Psalms 119\n\n  176 I have gone astray\n12 no indentation\n";
    char out[256];
    size_t n = data_text_strip_bible(raw, strlen(raw), out);
    out[n] = '\0';
    assert_string_equal(out, "In the beginning God created.\nAnd the earth.\nI have gone astray\n");
}

static void test_slices(void **state)
{
    (void)state;
    const char *raw = "a b c\nd e\nf g h i\nj\nk l m\nn o\n";
    data_text_t *t = NULL;
    char err[64];
    assert_int_equal(data_text_from_buffer(raw, strlen(raw), &t, err, sizeof err), 0);
    for (uint32_t n = 1; n <= 4; n++) {
        size_t prev_end = 0;
        for (uint32_t i = 0; i < n; i++) {
            size_t a, b;
            data_text_slice(t, i, n, &a, &b);
            assert_int_equal(a, prev_end); /* contiguous, no line twice, none missing */
            assert_true(b >= a);
            prev_end = b;
        }
        assert_int_equal(prev_end, t->n_lines);
    }
    data_text_destroy(&t);
}

static void test_map(void **state)
{
    (void)state;
    w2v_map_t m;
    w2v_map_init(&m);
    char words[5000][8];
    for (int i = 0; i < 5000; i++) {
        snprintf(words[i], sizeof words[i], "w%d", i);
        assert_int_equal(w2v_map_put(&m, words[i], (uint8_t)strlen(words[i])), i);
    }
    for (int i = 0; i < 5000; i++) {
        assert_int_equal(w2v_map_put(&m, words[i], (uint8_t)strlen(words[i])), i);
        assert_int_equal(w2v_map_get(&m, words[i], (uint8_t)strlen(words[i])), i);
    }
    assert_int_equal(w2v_map_get(&m, "nope", 4), UINT32_MAX);
    w2v_map_clear(&m);
    assert_int_equal(m.n, 0);
    assert_int_equal(w2v_map_get(&m, "w1", 2), UINT32_MAX);
    assert_int_equal(w2v_map_put(&m, "w1", 2), 0);
    w2v_map_free(&m);
}

/* Reference: the same pairs as nn_sgns_cpu for window 1 and a one-entry pool, in double precision with the
 * exact sigmoid. */
static void s_reference(const uint32_t *tok, const uint32_t *ends, uint32_t ns, uint32_t neg_row, uint32_t K,
                        const float *in, const float *out, uint32_t dim, double *d_in, double *d_out, double *loss)
{
    uint32_t start = 0;
    for (uint32_t s = 0; s < ns; s++) {
        for (uint32_t i = start; i < ends[s]; i++) {
            for (uint32_t j = i > start ? i - 1 : start; j <= i + 1 && j < ends[s]; j++) {
                if (j == i)
                    continue;
                uint32_t c = tok[i], o = tok[j];
                for (uint32_t k = 0; k <= K; k++) {
                    uint32_t t = k == 0 ? o : neg_row;
                    if (k > 0 && t == o)
                        continue;
                    double label = k == 0 ? 1.0 : 0.0;
                    double sc = 0;
                    for (uint32_t d = 0; d < dim; d++)
                        sc += (double)in[c * dim + d] * out[t * dim + d];
                    double p = 1.0 / (1.0 + exp(-sc));
                    *loss += k == 0 ? -log(p) : -log(1.0 - p);
                    for (uint32_t d = 0; d < dim; d++) {
                        d_in[c * dim + d] += (p - label) * out[t * dim + d];
                        d_out[t * dim + d] += (p - label) * in[c * dim + d];
                    }
                }
            }
        }
        start = ends[s];
    }
}

static void test_sgns_reference(void **state)
{
    (void)state;
    enum { DIM = 19, NIN = 4, NOUT = 6 }; /* 19: exercises the vector loop and its tail */
    float in[NIN * DIM], out[NOUT * DIM];
    uint64_t st = 42;
    for (int i = 0; i < NIN * DIM; i++)
        in[i] = (float)((double)(st = st * 6364136223846793005ULL + 1442695040888963407ULL) / 1.8446744e19 - 0.5);
    for (int i = 0; i < NOUT * DIM; i++)
        out[i] = (float)((double)(st = st * 6364136223846793005ULL + 1442695040888963407ULL) / 1.8446744e19 - 0.5);
    uint32_t tok[] = {0, 1, 2, 1, 3, 0, 2, 3, 3};
    uint32_t ends[] = {5, 9};
    uint32_t pool[] = {5};
    nn_sgns_batch_t b = {.tokens = tok, .sent_end = ends, .n_sents = 2, .n_in = NIN, .n_out = NOUT, .pool = pool,
                         .n_pool = 1, .dim = DIM, .window = 1, .negatives = 3};
    float d_in[NIN * DIM], d_out[NOUT * DIM];
    memset(d_in, 0x7f, sizeof d_in); /* overwritten, not accumulated */
    memset(d_out, 0x7f, sizeof d_out);
    uint64_t rng = 7;
    double loss = 0;
    uint64_t pairs = 0;
    nn_sgns_cpu(&b, in, out, d_in, d_out, &rng, &loss, &pairs);
    assert_int_equal(pairs, 2 * (4 + 3)); /* each sentence of n words has 2(n-1) ordered neighbour pairs */
    double r_in[NIN * DIM] = {0}, r_out[NOUT * DIM] = {0}, r_loss = 0;
    s_reference(tok, ends, 2, 5, 3, in, out, DIM, r_in, r_out, &r_loss);
    /* The op reads sigmoid from a 2048-entry table (step 1/128): errors of a few 1e-3 per term. */
    for (int i = 0; i < NIN * DIM; i++)
        assert_true(fabs(d_in[i] - r_in[i]) < 2e-2 * (1 + fabs(r_in[i])));
    for (int i = 0; i < NOUT * DIM; i++)
        assert_true(fabs(d_out[i] - r_out[i]) < 2e-2 * (1 + fabs(r_out[i])));
    assert_true(fabs(loss - r_loss) < 1e-2 * r_loss);
    /* Row 4 of the output table was in no pair: zero gradient. */
    for (int d = 0; d < DIM; d++)
        assert_true(d_out[4 * DIM + d] == 0.0f);

    /* No pool: only positives. */
    b.n_pool = 0;
    nn_sgns_cpu(&b, in, out, d_in, d_out, &rng, &loss, &pairs);
    for (int d = 0; d < DIM; d++)
        assert_true(d_out[5 * DIM + d] == 0.0f);
}

static void test_vectors_and_quality(void **state)
{
    (void)state;
    char dir[] = "/tmp/w2v-unit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char vec_path[64], pairs_path[64], cats_path[64];
    snprintf(vec_path, sizeof vec_path, "%s/v.vec", dir);
    snprintf(pairs_path, sizeof pairs_path, "%s/pairs.txt", dir);
    snprintf(cats_path, sizeof cats_path, "%s/cats.txt", dir);
    /* Two clusters: a* along x, b* along y. */
    char *words[] = {"a1", "a2", "a3", "b1", "b2", "b3"};
    float vec[6 * 2] = {1, 0.1f, 1, 0.2f, 1, 0.3f, 0.1f, 1, 0.2f, 1, 0.3f, 1};
    char err[256];
    assert_int_equal(w2v_write_vectors(vec_path, 6, 2, words, vec, err, sizeof err), 0);
    FILE *f = fopen(pairs_path, "w");
    fprintf(f, "# comment\na1 a2 9\nb1 b3 8\na1 b1 1\na2 b2 2\nzz a1 5\n");
    fclose(f);
    f = fopen(cats_path, "w");
    fprintf(f, "# c\nA: a1 a2 a3 zz\nB: b1 b2 b3\n");
    fclose(f);
    w2v_vectors_t *v = NULL;
    assert_int_equal(w2v_vectors_read(vec_path, &v, err, sizeof err), 0);
    assert_int_equal(v->n, 6);
    assert_int_equal(v->dim, 2);
    assert_int_equal(w2v_vectors_find(v, "b2"), 4);
    assert_int_equal(w2v_vectors_find(v, "zz"), -1);
    assert_true(fabsf(v->vec[3] - 0.2f) < 1e-6f);
    w2v_vectors_normalize(v);
    w2v_quality_t q;
    assert_int_equal(w2v_quality(v, pairs_path, cats_path, &q, err, sizeof err), 0);
    assert_int_equal(q.pairs_total, 5);
    assert_int_equal(q.pairs_found, 4);
    assert_true(q.spearman > 0.7);
    assert_true(q.hit10 == 1.0);
    assert_int_equal(q.cat_words, 6);
    assert_true(q.purity10 > 0.35 && q.purity10 <= 1.0); /* 2 of the 5 others share the group */
    assert_true(q.cos_in > q.cos_out);
    uint32_t top[2];
    float sc[2];
    assert_int_equal(w2v_vectors_nearest(v, 0, 2, top, sc), 2);
    assert_int_equal(top[0], 1);
    assert_true(fabs(w2v_neighbour_overlap(v, v, 6, 2) - 1.0) < 1e-9);
    w2v_vectors_destroy(&v);

    /* Damaged files are refused. */
    f = fopen(vec_path, "w");
    fprintf(f, "3 2\na 1 2\nb 1\n");
    fclose(f);
    assert_int_equal(w2v_vectors_read(vec_path, &v, err, sizeof err), -1);
    assert_null(v);
    f = fopen(vec_path, "w");
    fprintf(f, "hello\n");
    fclose(f);
    assert_int_equal(w2v_vectors_read(vec_path, &v, err, sizeof err), -1);
    unlink(vec_path);
    unlink(pairs_path);
    unlink(cats_path);
    rmdir(dir);
}

static void test_names(void **state)
{
    (void)state;
    w2v_names_t n;
    assert_int_equal(w2v_names("words", &n), 0);
    assert_string_equal(n.out, "words.out");
    assert_string_equal(n.count, "words.count");
    assert_int_equal(w2v_names("bad name", &n), -1);
    char longname[130];
    memset(longname, 'a', 125);
    longname[125] = '\0';
    assert_int_equal(w2v_names(longname, &n), -1);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_tokenize),      cmocka_unit_test(test_strip_bible),
    cmocka_unit_test(test_slices),        cmocka_unit_test(test_map),
    cmocka_unit_test(test_sgns_reference), cmocka_unit_test(test_vectors_and_quality),
    cmocka_unit_test(test_names))
