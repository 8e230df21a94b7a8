/* The two-tower model (nn/nn_tower.h): trigram keys, and finite-difference checks of the whole chain the
 * trainer differentiates: word/trigram rows -> pools -> L2-normalised heads -> InfoNCE with in-batch and
 * bank negatives and same-word masking. The loss is the function under test; every row and weight it reads
 * is perturbed in turn. */
#include "nn_ops.h"
#include "nn_testlib.h"
#include "nn_tower.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define EPS 2e-3f
#define ATOL 2e-4
#define RTOL 2e-2

static void test_trigrams(void **state)
{
    (void)state;
    char k[8][3];
    assert_int_equal(nn_tower_trigrams("cat", 3, k, 8), 3);
    assert_memory_equal(k[0], "<ca", 3);
    assert_memory_equal(k[1], "cat", 3);
    assert_memory_equal(k[2], "at>", 3);
    assert_int_equal(nn_tower_trigrams("a", 1, k, 8), 1);
    assert_memory_equal(k[0], "<a>", 3);
    assert_int_equal(nn_tower_trigrams("abcdefghij", 10, k, 4), 4); /* capped */
    assert_memory_equal(k[3], "cde", 3);
    assert_int_equal(nn_tower_trigrams("", 0, k, 8), 0);
}

/* A batch of 3 pairs, 2 bank negatives; pairs 0 and 2 share a headword (word 7), negative 1 equals pair 1's
 * headword (word 8): both must be masked. */
enum { B = 3, M = 2, N = B + M, E = 4, D = 3, R1 = 6, R2 = 5, L = 7, G = 6 };

typedef struct {
    float word_rows[R1 * E], gram_rows[R2 * E], Wq[D * E], bq[D], Ww[D * E], bw[D], neg[M * D];
    /* activations */
    float xq[B * E], preq[B * D], q[B * D], nq[B], xw[B * E], prew[B * D], v[B * D], nw[B];
    float cand[N * D], logits[B * N], probs[B * N], dq[B * D], dcand[N * D];
    float dxq[B * E], dxw[B * E], dpre[B * D];
    float dWq[D * E], dbq[D], dWw[D * E], dbw[D], dword[R1 * E], dgram[R2 * E];
} chain_t;

static const int32_t k_bag_idx[L] = {0, 1, 2, 2, 3, 4, 0};
static const int32_t k_bag_off[B + 1] = {0, 3, 5, 7};
static const float k_bag_w[L] = {1.0f, 2.0f, 0.5f, 1.5f, 1.0f, 3.0f, 0.7f};
static const int32_t k_hw_idx[B] = {5, 4, 5}; /* headword rows (row 4 is also a definition word: tied) */
static const int32_t k_gram_idx[G] = {0, 1, 2, 3, 4, 1};
static const int32_t k_gram_off[B + 1] = {0, 2, 4, 6};
static const uint32_t k_cand_word[N] = {7, 8, 7, 9, 8};
static const float k_inv_temp = 5.0f;

static double s_forward(chain_t *c)
{
    nn_embedding_bag_forward_cpu(c->xq, c->word_rows, k_bag_idx, k_bag_off, k_bag_w, NN_BAG_MEAN, B, R1, E);
    nn_tower_head_forward(c->q, c->preq, c->nq, c->xq, c->Wq, c->bq, B, E, D);
    nn_tower_word_pool(c->xw, c->word_rows, k_hw_idx, c->gram_rows, k_gram_idx, k_gram_off, B, E);
    nn_tower_head_forward(c->v, c->prew, c->nw, c->xw, c->Ww, c->bw, B, E, D);
    memcpy(c->cand, c->v, sizeof(float) * B * D);
    memcpy(c->cand + B * D, c->neg, sizeof(float) * M * D);
    return nn_tower_infonce(c->dq, c->dcand, c->logits, c->probs, c->q, c->cand, k_cand_word, k_inv_temp, B, N, D);
}

static double s_loss(void *p)
{
    return s_forward(p);
}

static void s_backward(chain_t *c)
{
    s_forward(c);
    memset(c->dWq, 0, sizeof c->dWq);
    memset(c->dbq, 0, sizeof c->dbq);
    memset(c->dWw, 0, sizeof c->dWw);
    memset(c->dbw, 0, sizeof c->dbw);
    nn_tower_head_backward(c->dxq, c->dWq, c->dbq, c->dpre, c->dq, c->q, c->nq, c->xq, c->Wq, B, E, D);
    nn_tower_head_backward(c->dxw, c->dWw, c->dbw, c->dpre, c->dcand, c->v, c->nw, c->xw, c->Ww, B, E, D);
    nn_embedding_bag_backward_cpu(c->dword, c->dxq, k_bag_idx, k_bag_off, k_bag_w, NN_BAG_MEAN, B, R1, E);
    memset(c->dgram, 0, sizeof c->dgram);
    nn_tower_word_pool_backward(c->dword, c->dgram, c->dxw, k_hw_idx, k_gram_idx, k_gram_off, B, E);
}

static void s_init(chain_t *c, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    uint64_t rng = seed;
    t_fill_uniform(c->word_rows, R1 * E, -1, 1, &rng);
    t_fill_uniform(c->gram_rows, R2 * E, -1, 1, &rng);
    t_fill_uniform(c->Wq, D * E, -1, 1, &rng);
    t_fill_uniform(c->bq, D, -0.3f, 0.3f, &rng);
    t_fill_uniform(c->Ww, D * E, -1, 1, &rng);
    t_fill_uniform(c->bw, D, -0.3f, 0.3f, &rng);
    t_fill_uniform(c->neg, M * D, -1, 1, &rng);
    for (int j = 0; j < M; j++) { /* bank negatives are unit rows, as makers write them */
        float n = 0;
        for (int d = 0; d < D; d++)
            n += c->neg[j * D + d] * c->neg[j * D + d];
        for (int d = 0; d < D; d++)
            c->neg[j * D + d] /= sqrtf(n);
    }
}

static void test_chain_gradients(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        chain_t c;
        s_init(&c, seed);
        s_backward(&c);
        float g_word[R1 * E], g_gram[R2 * E], g_Wq[D * E], g_bq[D], g_Ww[D * E], g_bw[D];
        memcpy(g_word, c.dword, sizeof g_word);
        memcpy(g_gram, c.dgram, sizeof g_gram);
        memcpy(g_Wq, c.dWq, sizeof g_Wq);
        memcpy(g_bq, c.dbq, sizeof g_bq);
        memcpy(g_Ww, c.dWw, sizeof g_Ww);
        memcpy(g_bw, c.dbw, sizeof g_bw);
        assert_int_equal(t_gradcheck("word rows", c.word_rows, R1 * E, g_word, s_loss, &c, EPS, ATOL, RTOL), 0);
        assert_int_equal(t_gradcheck("trigram rows", c.gram_rows, R2 * E, g_gram, s_loss, &c, EPS, ATOL, RTOL), 0);
        assert_int_equal(t_gradcheck("Wq", c.Wq, D * E, g_Wq, s_loss, &c, EPS, ATOL, RTOL), 0);
        assert_int_equal(t_gradcheck("bq", c.bq, D, g_bq, s_loss, &c, EPS, ATOL, RTOL), 0);
        assert_int_equal(t_gradcheck("Ww", c.Ww, D * E, g_Ww, s_loss, &c, EPS, ATOL, RTOL), 0);
        assert_int_equal(t_gradcheck("bw", c.bw, D, g_bw, s_loss, &c, EPS, ATOL, RTOL), 0);
        /* Row 1 of the word table feeds only query 0: its gradient cannot be zero. */
        double n1 = 0;
        for (int e = 0; e < E; e++)
            n1 += fabs(g_word[1 * E + e]);
        assert_true(n1 > 1e-6);
    }
}

/* The loss equals a direct computation: -log softmax over the unmasked logits, averaged. */
static void test_infonce_value_and_mask(void **state)
{
    (void)state;
    chain_t c;
    s_init(&c, 9);
    double loss = s_forward(&c);
    double want = 0;
    for (int b = 0; b < B; b++) {
        double mx = -1e30, z = 0, pos = 0;
        double lg[N];
        for (int j = 0; j < N; j++) {
            double dot = 0;
            for (int d = 0; d < D; d++)
                dot += (double)c.q[b * D + d] * c.cand[j * D + d];
            lg[j] = k_inv_temp * dot;
        }
        pos = lg[b];
        for (int j = 0; j < N; j++)
            if (j == b || k_cand_word[j] != k_cand_word[b])
                mx = fmax(mx, lg[j]);
        for (int j = 0; j < N; j++)
            if (j == b || k_cand_word[j] != k_cand_word[b])
                z += exp(lg[j] - mx);
        want += -(pos - mx - log(z));
    }
    want /= B;
    assert_true(fabs(loss - want) < 1e-4);
    /* Masked candidates get no gradient from the query they are masked for: pair 0's same-word candidate is
     * pair 2, so perturbing a candidate that only pair 0 would see as a negative changes nothing through it.
     * Checked through the logits' gradient row: column 2 of row 0 must be exactly zero. */
    s_forward(&c);
    assert_true(c.logits[0 * N + 2] == 0.0f);
    assert_true(c.logits[1 * N + 4] == 0.0f);
    assert_true(c.logits[1 * N + 3] != 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trigrams),
        cmocka_unit_test(test_chain_gradients),
        cmocka_unit_test(test_infonce_value_and_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
