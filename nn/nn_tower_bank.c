/* The two-tower model's word tower over rows read from the knowledge bank (see nn_tower.h). */
#include "nn_tower.h"

#include "kb_cluster.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define NN_TOWER_CHUNK 512 /* headwords per bank request */

int nn_tower_word_vectors(struct kb_cluster *kb, const char *word_table, const char *gram_table,
                          const char *const *words, size_t n, const nn_tower_head_t *head, float *out)
{
    const int E = head->E, D = head->D;
    const size_t G = (size_t)NN_TOWER_CHUNK * NN_TOWER_MAX_GRAMS;
    kb_key_t *keys = carls_xmalloc(G * sizeof *keys);
    char (*grams)[3] = carls_xmalloc(G * sizeof *grams);
    int32_t *widx = carls_xmalloc(NN_TOWER_CHUNK * sizeof(int32_t));
    int32_t *gidx = carls_xmalloc(G * sizeof(int32_t));
    int32_t *goff = carls_xmalloc((NN_TOWER_CHUNK + 1) * sizeof(int32_t));
    float *wrows = carls_xmalloc((size_t)NN_TOWER_CHUNK * E * sizeof(float));
    float *grows = carls_xmalloc(G * E * sizeof(float));
    float *x = carls_xmalloc((size_t)NN_TOWER_CHUNK * E * sizeof(float));
    float *pre = carls_xmalloc((size_t)NN_TOWER_CHUNK * D * sizeof(float));
    float *norms = carls_xmalloc(NN_TOWER_CHUNK * sizeof(float));
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += NN_TOWER_CHUNK) {
        int B = (int)(n - at < NN_TOWER_CHUNK ? n - at : NN_TOWER_CHUNK);
        int n_g = 0;
        goff[0] = 0;
        for (int b = 0; b < B; b++) {
            const char *w = words[at + (size_t)b];
            size_t len = strlen(w);
            keys[b] = (kb_key_t){w, len};
            widx[b] = b;
            /* A trigram shared by several words is simply asked for several times: a lookup may repeat keys. */
            int k = nn_tower_trigrams(w, len, grams + n_g, NN_TOWER_MAX_GRAMS);
            for (int i = 0; i < k; i++)
                gidx[n_g + i] = n_g + i;
            n_g += k;
            goff[b + 1] = n_g;
        }
        rc = kb_cluster_lookup_ex(kb, word_table, keys, (size_t)B, (uint32_t)E, true, wrows, NULL);
        if (rc != 0)
            break;
        for (int i = 0; i < n_g; i++)
            keys[i] = (kb_key_t){grams[i], 3};
        if (n_g > 0)
            rc = kb_cluster_lookup_ex(kb, gram_table, keys, (size_t)n_g, (uint32_t)E, true, grows, NULL);
        if (rc != 0)
            break;
        nn_tower_word_pool(x, wrows, widx, grows, gidx, goff, B, E);
        nn_tower_head_forward(out + at * (size_t)D, pre, norms, x, head->W, head->bias, B, E, D);
    }
    void *p[] = {keys, grams, widx, gidx, goff, wrows, grows, x, pre, norms};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    return rc;
}
