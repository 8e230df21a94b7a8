/* The two-tower model's word tower over rows fetched by the caller (see nn_tower.h). */
#include "nn_tower.h"

#include "nn_ops.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define NN_TOWER_CHUNK 256 /* headwords per fetch */

/* A chunk's distinct keys: byte strings -> dense index (the keys point into the caller's memory). */
typedef struct {
    uint32_t *slots;      /* (cap) index + 1, 0 = empty */
    size_t cap;
    nn_key_t *keys;       /* (n) */
    size_t n, n_cap;
} s_keys_t;

static void s_keys_reset(s_keys_t *m, size_t expect)
{
    size_t cap = 64;
    while (cap < 2 * expect)
        cap <<= 1;
    if (cap > m->cap) {
        free(m->slots);
        m->slots = carls_xmalloc(cap * sizeof *m->slots);
        m->cap = cap;
    }
    memset(m->slots, 0, m->cap * sizeof *m->slots);
    if (expect > m->n_cap) {
        free(m->keys);
        m->keys = carls_xmalloc(expect * sizeof *m->keys);
        m->n_cap = expect;
    }
    m->n = 0;
}

/* Index of the key, added when new; at most `expect` keys per reset. */
static int32_t s_keys_put(s_keys_t *m, const void *data, size_t len)
{
    size_t mask = m->cap - 1, i = (size_t)carls_hash64(data, len, 7) & mask;
    for (; m->slots[i] != 0; i = (i + 1) & mask) {
        const nn_key_t *k = &m->keys[m->slots[i] - 1];
        if (k->len == len && memcmp(k->data, data, len) == 0)
            return (int32_t)(m->slots[i] - 1);
    }
    m->keys[m->n] = (nn_key_t){data, len};
    m->slots[i] = (uint32_t)++m->n;
    return (int32_t)(m->n - 1);
}

static void s_keys_free(s_keys_t *m)
{
    free(m->slots);
    free(m->keys);
}

int nn_tower_word_vectors(nn_row_fetch_fn fetch, void *ctx, const char *word_table, const char *gram_table,
                          const char *const *words, size_t n, const nn_tower_bags_t *bags,
                          const nn_tower_head_t *head, float *out, float *x_out)
{
    const int E = head->E, D = head->D;
    const bool use_bags = head->defs > 0 && bags;
    if (head->defs > 0 && !bags)
        return -1;
    const size_t G = (size_t)NN_TOWER_CHUNK * NN_TOWER_MAX_GRAMS;
    char (*grams)[3] = carls_xmalloc(G * sizeof *grams);
    int32_t *widx = carls_xmalloc(NN_TOWER_CHUNK * sizeof(int32_t));
    int32_t *gidx = carls_xmalloc(G * sizeof(int32_t));
    int32_t *goff = carls_xmalloc((NN_TOWER_CHUNK + 1) * sizeof(int32_t));
    int32_t *boff = carls_xmalloc((NN_TOWER_CHUNK + 1) * sizeof(int32_t));
    float *grows = carls_xmalloc(G * E * sizeof(float));
    float *x = carls_xmalloc((size_t)NN_TOWER_CHUNK * E * sizeof(float));
    float *xb = carls_xmalloc((size_t)NN_TOWER_CHUNK * E * sizeof(float));
    float *pre = carls_xmalloc((size_t)NN_TOWER_CHUNK * D * sizeof(float));
    float *norms = carls_xmalloc(NN_TOWER_CHUNK * sizeof(float));
    float *hid = head->H > 0 ? carls_xmalloc((size_t)NN_TOWER_CHUNK * head->H * sizeof(float)) : NULL;
    int32_t *bidx = NULL;
    float *bw = NULL, *wrows = NULL;
    size_t bidx_cap = 0, wrows_cap = 0;
    s_keys_t wk = {0}, gk = {0};
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += NN_TOWER_CHUNK) {
        int B = (int)(n - at < NN_TOWER_CHUNK ? n - at : NN_TOWER_CHUNK);
        size_t L = use_bags ? bags->off[at + (size_t)B] - bags->off[at] : 0;
        if (L > bidx_cap) {
            free(bidx);
            free(bw);
            bidx = carls_xmalloc(L * sizeof(int32_t));
            bw = carls_xmalloc(L * sizeof(float));
            bidx_cap = L;
        }
        s_keys_reset(&wk, (size_t)B + L);
        s_keys_reset(&gk, (size_t)B * NN_TOWER_MAX_GRAMS);
        int n_g = 0;
        goff[0] = 0;
        boff[0] = 0;
        for (int b = 0; b < B; b++) {
            const char *w = words[at + (size_t)b];
            size_t len = strlen(w);
            widx[b] = s_keys_put(&wk, w, len);
            int k = nn_tower_trigrams(w, len, grams + n_g, NN_TOWER_MAX_GRAMS);
            for (int i = 0; i < k; i++)
                gidx[n_g + i] = s_keys_put(&gk, grams[n_g + i], 3);
            n_g += k;
            goff[b + 1] = n_g;
            if (use_bags) {
                size_t from = bags->off[at + (size_t)b], to = bags->off[at + (size_t)b + 1];
                size_t base = bags->off[at];
                for (size_t t = from; t < to; t++) {
                    bidx[t - base] = s_keys_put(&wk, bags->tok[t], bags->len[t]);
                    bw[t - base] = bags->weight[t];
                }
                boff[b + 1] = (int32_t)(to - base);
            }
        }
        if (wk.n > wrows_cap) {
            free(wrows);
            wrows = carls_xmalloc(wk.n * E * sizeof(float));
            wrows_cap = wk.n;
        }
        rc = fetch(ctx, word_table, wk.keys, wk.n, E, wrows);
        if (rc == 0 && gk.n > 0)
            rc = fetch(ctx, gram_table, gk.keys, gk.n, E, grows);
        if (rc != 0)
            break;
        nn_tower_word_pool(x, wrows, widx, grows, gidx, goff, B, E);
        if (use_bags) {
            nn_embedding_bag_forward_cpu(xb, wrows, bidx, boff, bw, NN_BAG_MEAN, B, (int)wk.n, E);
            nn_add_cpu(x, xb, 1.0f, B * E);
        }
        if (x_out)
            memcpy(x_out + at * (size_t)E, x, (size_t)B * E * sizeof(float));
        nn_tower_head_forward(head, out + at * (size_t)D, pre, norms, hid, x, B);
    }
    s_keys_free(&wk);
    s_keys_free(&gk);
    void *p[] = {grams, widx, gidx, goff, boff, grows, x, xb, pre, norms, hid, bidx, bw, wrows};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    return rc;
}
