/* The two-tower model (nn/nn_tower.h): trigram keys, finite-difference checks of the whole chain the
 * trainer differentiates: word/trigram rows -> pools -> L2-normalised heads (linear, and MLP with a linear
 * skip) -> InfoNCE with in-batch and bank negatives and same-word masking; the bank negatives' pooled inputs
 * through the current word head (the trainer's --negatives-from inputs), and heads read from checkpoints. The
 * loss is the function under test; every row and weight it reads is perturbed in turn. */
#include "nn_ops.h"
#include "nn_testlib.h"
#include "nn_tower.h"

#include "checkpoint.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include "test_main.h"

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
enum { B = 3, M = 2, N = B + M, E = 4, D = 3, R1 = 6, R2 = 5, L = 7, G = 6, HMAX = 5 };

/* One head's parameters and gradients (the hidden layer used when H > 0). */
typedef struct {
    float W[D * E], bias[D], U[HMAX * E], c[HMAX], V[D * HMAX];
    float dW[D * E], dbias[D], dU[HMAX * E], dc[HMAX], dV[D * HMAX];
} head_params_t;

typedef struct {
    int H;
    bool logq_on;    /* the sampled-softmax correction k_logq is applied */
    bool neg_inputs; /* the bank negatives are pooled inputs negx put through the word head */
    float word_rows[R1 * E], gram_rows[R2 * E], neg[M * D], negx[M * E];
    head_params_t pq, pw;
    /* activations */
    float xq[B * E], preq[B * D], q[B * D], nq[B], xw[B * E], prew[B * D], v[B * D], nw[B];
    float hq[B * HMAX], hw[B * HMAX], hneg[M * HMAX], dhid[B * HMAX], neg_pre[M * D], neg_norm[M], neg_dpre[M * D];
    float cand[N * D], logits[B * N], probs[B * N], dq[B * D], dcand[N * D];
    float dxq[B * E], dxw[B * E], dpre[B * D];
    float dword[R1 * E], dgram[R2 * E];
} chain_t;

static nn_tower_head_t s_head(const chain_t *c, const head_params_t *p)
{
    return (nn_tower_head_t){.E = E, .D = D, .H = c->H, .W = p->W, .bias = p->bias, .U = p->U, .c = p->c, .V = p->V};
}

static nn_tower_head_grads_t s_grads(head_params_t *p)
{
    return (nn_tower_head_grads_t){.W = p->dW, .bias = p->dbias, .U = p->dU, .c = p->dc, .V = p->dV};
}

static const int32_t k_bag_idx[L] = {0, 1, 2, 2, 3, 4, 0};
static const int32_t k_bag_off[B + 1] = {0, 3, 5, 7};
static const float k_bag_w[L] = {1.0f, 2.0f, 0.5f, 1.5f, 1.0f, 3.0f, 0.7f};
static const int32_t k_hw_idx[B] = {5, 4, 5}; /* headword rows (row 4 is also a definition word: tied) */
static const int32_t k_gram_idx[G] = {0, 1, 2, 3, 4, 1};
static const int32_t k_gram_off[B + 1] = {0, 2, 4, 6};
static const uint32_t k_cand_word[N] = {7, 8, 7, 9, 8};
static const float k_inv_temp = 5.0f;
static const float k_logq[N] = {-1.5f, -0.2f, -1.5f, 0.7f, -3.0f};

static double s_forward(chain_t *c)
{
    nn_embedding_bag_forward_cpu(c->xq, c->word_rows, k_bag_idx, k_bag_off, k_bag_w, NN_BAG_MEAN, B, R1, E);
    nn_tower_head_t hq = s_head(c, &c->pq), hw = s_head(c, &c->pw);
    nn_tower_head_forward(&hq, c->q, c->preq, c->nq, c->hq, c->xq, B);
    nn_tower_word_pool(c->xw, c->word_rows, k_hw_idx, c->gram_rows, k_gram_idx, k_gram_off, B, E);
    nn_tower_head_forward(&hw, c->v, c->prew, c->nw, c->hw, c->xw, B);
    if (c->neg_inputs)
        nn_tower_head_forward(&hw, c->neg, c->neg_pre, c->neg_norm, c->hneg, c->negx, M);
    memcpy(c->cand, c->v, sizeof(float) * B * D);
    memcpy(c->cand + B * D, c->neg, sizeof(float) * M * D);
    return nn_tower_infonce(c->dq, c->dcand, c->logits, c->probs, c->q, c->cand, k_cand_word, c->logq_on ? k_logq : NULL,
                            k_inv_temp, B, N, D);
}

static double s_loss(void *p)
{
    return s_forward(p);
}

static void s_backward(chain_t *c)
{
    s_forward(c);
    head_params_t *ps[2] = {&c->pq, &c->pw};
    for (int t = 0; t < 2; t++) {
        memset(ps[t]->dW, 0, sizeof ps[t]->dW);
        memset(ps[t]->dbias, 0, sizeof ps[t]->dbias);
        memset(ps[t]->dU, 0, sizeof ps[t]->dU);
        memset(ps[t]->dc, 0, sizeof ps[t]->dc);
        memset(ps[t]->dV, 0, sizeof ps[t]->dV);
    }
    nn_tower_head_t hq = s_head(c, &c->pq), hw = s_head(c, &c->pw);
    nn_tower_head_grads_t gq = s_grads(&c->pq), gw = s_grads(&c->pw);
    nn_tower_head_backward(&hq, &gq, c->dxq, c->dpre, c->dhid, c->dq, c->q, c->nq, c->hq, c->xq, B);
    nn_tower_head_backward(&hw, &gw, c->dxw, c->dpre, c->dhid, c->dcand, c->v, c->nw, c->hw, c->xw, B);
    if (c->neg_inputs) /* the negatives' inputs are constants: only the head's parameters learn from them */
        nn_tower_head_backward(&hw, &gw, NULL, c->neg_dpre, c->dhid, c->dcand + B * D, c->neg, c->neg_norm, c->hneg,
                               c->negx, M);
    nn_embedding_bag_backward_cpu(c->dword, c->dxq, k_bag_idx, k_bag_off, k_bag_w, NN_BAG_MEAN, B, R1, E);
    memset(c->dgram, 0, sizeof c->dgram);
    nn_tower_word_pool_backward(c->dword, c->dgram, c->dxw, k_hw_idx, k_gram_idx, k_gram_off, B, E);
}

static void s_init(chain_t *c, uint64_t seed, int H, bool neg_inputs)
{
    memset(c, 0, sizeof *c);
    c->H = H;
    c->neg_inputs = neg_inputs;
    uint64_t rng = seed;
    t_fill_uniform(c->word_rows, R1 * E, -1, 1, &rng);
    t_fill_uniform(c->gram_rows, R2 * E, -1, 1, &rng);
    head_params_t *ps[2] = {&c->pq, &c->pw};
    for (int t = 0; t < 2; t++) {
        t_fill_uniform(ps[t]->W, D * E, -1, 1, &rng);
        t_fill_uniform(ps[t]->bias, D, -0.3f, 0.3f, &rng);
        t_fill_uniform(ps[t]->U, H * E, -1, 1, &rng);
        t_fill_uniform(ps[t]->c, H, -0.3f, 0.3f, &rng);
        t_fill_uniform(ps[t]->V, D * H, -1, 1, &rng); /* not zero as the trainer starts: every path is checked */
    }
    t_fill_uniform(c->negx, M * E, -1, 1, &rng);
    t_fill_uniform(c->neg, M * D, -1, 1, &rng);
    for (int j = 0; j < M; j++) { /* bank negatives are unit rows, as makers write them */
        float n = 0;
        for (int d = 0; d < D; d++)
            n += c->neg[j * D + d] * c->neg[j * D + d];
        for (int d = 0; d < D; d++)
            c->neg[j * D + d] /= sqrtf(n);
    }
}

/* The smallest |U x + c| over every hidden unit the chain computes: finite differences across a ReLU's kink
 * are meaningless, so the checks use draws that keep well away from it. */
static float s_hidden_margin(chain_t *c)
{
    if (c->H == 0)
        return INFINITY;
    s_forward(c);
    float z[M * HMAX > B * HMAX ? M * HMAX : B * HMAX], m = INFINITY;
    const float *xs[3] = {c->xq, c->xw, c->negx};
    const head_params_t *ps[3] = {&c->pq, &c->pw, &c->pw};
    for (int t = 0; t < (c->neg_inputs ? 3 : 2); t++) {
        int n = t == 2 ? M : B;
        nn_linear_forward_cpu(z, xs[t], ps[t]->U, ps[t]->c, n, E, c->H);
        for (int i = 0; i < n * c->H; i++)
            m = fminf(m, fabsf(z[i]));
    }
    return m;
}

static void s_check_chain(int H, bool neg_inputs, bool logq_on)
{
    int checked = 0;
    for (uint64_t seed = 1; checked < 3; seed++) {
        assert_true(seed < 1000);
        chain_t c;
        s_init(&c, seed, H, neg_inputs);
        c.logq_on = logq_on;
        if (s_hidden_margin(&c) < 0.05f)
            continue;
        checked++;
        s_backward(&c);
        float g_word[R1 * E], g_gram[R2 * E];
        head_params_t g[2] = {c.pq, c.pw}; /* copies: their d* fields hold the analytic gradients */
        memcpy(g_word, c.dword, sizeof g_word);
        memcpy(g_gram, c.dgram, sizeof g_gram);
        assert_int_equal(t_gradcheck("word rows", c.word_rows, R1 * E, g_word, s_loss, &c, EPS, ATOL, RTOL), 0);
        assert_int_equal(t_gradcheck("trigram rows", c.gram_rows, R2 * E, g_gram, s_loss, &c, EPS, ATOL, RTOL), 0);
        head_params_t *ps[2] = {&c.pq, &c.pw};
        const char *names[2][5] = {{"Wq", "bq", "Uq", "cq", "Vq"}, {"Ww", "bw", "Uw", "cw", "Vw"}};
        for (int t = 0; t < 2; t++) {
            assert_int_equal(t_gradcheck(names[t][0], ps[t]->W, D * E, g[t].dW, s_loss, &c, EPS, ATOL, RTOL), 0);
            assert_int_equal(t_gradcheck(names[t][1], ps[t]->bias, D, g[t].dbias, s_loss, &c, EPS, ATOL, RTOL), 0);
            if (H == 0)
                continue;
            assert_int_equal(t_gradcheck(names[t][2], ps[t]->U, H * E, g[t].dU, s_loss, &c, EPS, ATOL, RTOL), 0);
            assert_int_equal(t_gradcheck(names[t][3], ps[t]->c, H, g[t].dc, s_loss, &c, EPS, ATOL, RTOL), 0);
            assert_int_equal(t_gradcheck(names[t][4], ps[t]->V, D * H, g[t].dV, s_loss, &c, EPS, ATOL, RTOL), 0);
        }
        /* Row 1 of the word table feeds only query 0: its gradient cannot be zero. */
        double n1 = 0;
        for (int e = 0; e < E; e++)
            n1 += fabs(g_word[1 * E + e]);
        assert_true(n1 > 1e-6);
    }
}

static void test_chain_gradients(void **state)
{
    (void)state;
    s_check_chain(0, false, false);
    s_check_chain(0, false, true);
}

static void test_chain_gradients_mlp(void **state)
{
    (void)state;
    s_check_chain(HMAX, false, false);
}

/* Bank negatives as pooled inputs through the current word head: the head's gradient includes theirs. */
static void test_chain_gradients_negative_inputs(void **state)
{
    (void)state;
    s_check_chain(0, true, false);
    s_check_chain(HMAX, true, true);
}

/* With V = 0 the MLP head is the linear head: the same vectors from the same W and bias. */
static void test_mlp_starts_linear(void **state)
{
    (void)state;
    chain_t c;
    s_init(&c, 4, HMAX, false);
    memset(c.pq.V, 0, sizeof c.pq.V);
    nn_tower_head_t mlp = s_head(&c, &c.pq), lin = mlp;
    lin.H = 0;
    float out1[B * D], out2[B * D], pre[B * D], norms[B], hid[B * HMAX];
    nn_tower_head_forward(&mlp, out1, pre, norms, hid, c.word_rows, B);
    nn_tower_head_forward(&lin, out2, pre, norms, NULL, c.word_rows, B);
    for (int i = 0; i < B * D; i++)
        assert_float_equal(out1[i], out2[i], 1e-6);
}

/* Heads read back from a checkpoint, linear and MLP; bad shapes and missing tensors are refused. */
static void test_head_from_ckpt(void **state)
{
    (void)state;
    chain_t c;
    s_init(&c, 5, HMAX, false);
    int64_t wd[2] = {D, E}, bd[1] = {D}, ud[2] = {HMAX, E}, cd[1] = {HMAX}, vd[2] = {D, HMAX}, bad[2] = {D, E + 1};
    char err[256];
    nn_tower_head_t h;

    carls_ckpt_t *ck = carls_ckpt_new(NN_TOWER_KIND, 7);
    assert_int_equal(carls_ckpt_add(ck, "word.weight", 2, wd, c.pw.W), 0);
    assert_int_equal(carls_ckpt_add(ck, "word.bias", 1, bd, c.pw.bias), 0);
    assert_int_equal(nn_tower_from_ckpt(ck, "word", &h, err, sizeof err), 0);
    assert_int_equal(h.E, E);
    assert_int_equal(h.D, D);
    assert_int_equal(h.H, 0);
    assert_int_equal(h.defs, 0);
    assert_int_equal(nn_tower_from_ckpt(ck, "query", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "query.weight"));
    assert_int_equal(carls_ckpt_add(ck, "word.hidden.weight", 2, ud, c.pw.U), 0);
    assert_int_equal(nn_tower_from_ckpt(ck, "word", &h, err, sizeof err), -1); /* hidden.bias missing */
    assert_non_null(strstr(err, "word.hidden.bias"));
    assert_int_equal(carls_ckpt_add(ck, "word.hidden.bias", 1, cd, c.pw.c), 0);
    assert_int_equal(carls_ckpt_add(ck, "word.out.weight", 2, vd, c.pw.V), 0);
    float defs = 8;
    int64_t one[1] = {1};
    assert_int_equal(carls_ckpt_add(ck, "word.defs", 1, one, &defs), 0);
    assert_int_equal(nn_tower_from_ckpt(ck, "word", &h, err, sizeof err), 0);
    assert_int_equal(h.H, HMAX);
    assert_int_equal(h.defs, 8);
    assert_memory_equal(h.V, c.pw.V, sizeof c.pw.V);
    /* The same vectors as the parameters they were saved from. */
    nn_tower_head_t mine = s_head(&c, &c.pw);
    float out1[B * D], out2[B * D], pre[B * D], norms[B], hid[B * HMAX];
    nn_tower_head_forward(&mine, out1, pre, norms, hid, c.word_rows, B);
    nn_tower_head_forward(&h, out2, pre, norms, hid, c.word_rows, B);
    assert_memory_equal(out1, out2, sizeof out1);
    /* A query head whose hidden layer does not take E inputs is refused. */
    assert_int_equal(carls_ckpt_add(ck, "query.weight", 2, wd, c.pq.W), 0);
    assert_int_equal(carls_ckpt_add(ck, "query.bias", 1, bd, c.pq.bias), 0);
    float junk[D * (E + 1)] = {0};
    assert_int_equal(carls_ckpt_add(ck, "query.hidden.weight", 2, bad, junk), 0);
    assert_int_equal(nn_tower_from_ckpt(ck, "query", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "query.hidden.weight"));
    carls_ckpt_destroy(&ck);

    ck = carls_ckpt_new("mlp", 1);
    assert_int_equal(nn_tower_from_ckpt(ck, "word", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "kind"));
    carls_ckpt_destroy(&ck);
}

/* The loss equals a direct computation: -log softmax over the unmasked logits, averaged. */
static double s_check_infonce_value(bool logq_on)
{
    chain_t c;
    s_init(&c, 9, 0, false);
    c.logq_on = logq_on;
    double loss = s_forward(&c);
    double want = 0;
    for (int b = 0; b < B; b++) {
        double mx = -1e30, z = 0, pos = 0;
        double lg[N];
        for (int j = 0; j < N; j++) {
            double dot = 0;
            for (int d = 0; d < D; d++)
                dot += (double)c.q[b * D + d] * c.cand[j * D + d];
            lg[j] = k_inv_temp * dot - (logq_on ? k_logq[j] : 0.0);
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
    return loss;
}

static void test_infonce_value_and_mask(void **state)
{
    (void)state;
    double plain = s_check_infonce_value(false);
    double corrected = s_check_infonce_value(true);
    assert_true(fabs(plain - corrected) > 1e-3); /* the candidates' logq differ: the correction matters */
    chain_t c;
    s_init(&c, 9, 0, false);
    /* Masked candidates get no gradient from the query they are masked for: pair 0's same-word candidate is
     * pair 2, so perturbing a candidate that only pair 0 would see as a negative changes nothing through it.
     * Checked through the logits' gradient row: column 2 of row 0 must be exactly zero. */
    s_forward(&c);
    assert_true(c.logits[0 * N + 2] == 0.0f);
    assert_true(c.logits[1 * N + 4] == 0.0f);
    assert_true(c.logits[1 * N + 3] != 0.0f);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_trigrams),
    cmocka_unit_test(test_chain_gradients),
    cmocka_unit_test(test_chain_gradients_mlp),
    cmocka_unit_test(test_chain_gradients_negative_inputs),
    cmocka_unit_test(test_mlp_starts_linear),
    cmocka_unit_test(test_head_from_ckpt),
    cmocka_unit_test(test_infonce_value_and_mask))
