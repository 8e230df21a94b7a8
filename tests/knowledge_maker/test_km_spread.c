/* Unit test of label spreading (km_spread) and the item-key helpers (km_bank.h): two chains of items, one
 * labelled item in each, every item ends up with its chain's label; a bad index is refused. */
#include "maker_testlib.h"

#include "km_bank.h"
#include "km_spread.h"

#include <string.h>

int main(void)
{
    /* Items 0..4 form one chain, 5..9 another; each lists its successor (k = 1). */
    enum { N = 10, K = 1, C = 2 };
    uint32_t nbr[N * K];
    float w[N * K], prior[N * C], F[N * C], conf[N];
    int32_t lab[N];
    for (int i = 0; i < N; i++) {
        nbr[i] = (i % 5 == 4) ? UINT32_MAX : (uint32_t)(i + 1);
        w[i] = 1.0f;
    }
    memset(prior, 0, sizeof prior);
    prior[0 * C + 0] = 1.0f; /* item 0: class 0 */
    prior[9 * C + 1] = 1.0f; /* item 9: class 1 */
    for (int balance = 0; balance <= 1; balance++) {
        MT_CHECK(km_spread(nbr, w, N, K, prior, C, 0.9f, 50, balance, F) == 0, "spread");
        km_spread_labels(F, N, C, lab, conf);
        for (int i = 0; i < N; i++) {
            MT_CHECK(lab[i] == (i < 5 ? 0 : 1), "balance %d: item %d got label %d", balance, i, lab[i]);
            MT_CHECK(conf[i] > 0.5f && conf[i] <= 1.0f, "item %d confidence %g", i, (double)conf[i]);
        }
    }
    /* An isolated, unlabelled item gets no label. */
    float zero[C] = {0, 0};
    int32_t l1;
    float c1;
    km_spread_labels(zero, 1, C, &l1, &c1);
    MT_CHECK(l1 == -1 && c1 == 0.0f, "all-zero row: label %d", l1);
    /* Out-of-range neighbour. */
    nbr[3] = 99;
    MT_CHECK(km_spread(nbr, w, N, K, prior, C, 0.9f, 5, 0, F) == -1, "an index out of range was accepted");
    /* Keys. */
    char key[16];
    size_t len = km_item_key(4711, key);
    MT_CHECK(len == 4 && memcmp(key, "4711", 4) == 0, "key");
    MT_CHECK(km_key_item("4711", 4) == 4711, "parse");
    MT_CHECK(km_key_item("47a1", 4) == KM_NO_ITEM && km_key_item("", 0) == KM_NO_ITEM &&
                 km_key_item("99999999999", 11) == KM_NO_ITEM && km_key_item("4294967295", 10) == KM_NO_ITEM,
             "bad keys accepted");
    km_tables_t t;
    MT_CHECK(km_tables_init(&t, "x") == 0 && strcmp(t.graph, "x.graph") == 0 && strcmp(t.emb, "x.emb") == 0, "tables");
    return mt_finish("test_km_spread", NULL);
}
