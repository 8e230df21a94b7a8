/* The bank both prefetcher tests read (see prefetch_bank.h). */
#include "prefetch_bank.h"

#include "maker_testlib.h"

#include <stdlib.h>

km_bank_t *pt_start_bank(test_server_t *srv, const pt_bank_spec_t *spec)
{
    test_server_init(srv);
    if (test_server_start(srv, NULL) != 0)
        return NULL;
    return pt_fill_bank(srv->endpoint, spec);
}

km_bank_t *pt_fill_bank(const char *endpoints, const pt_bank_spec_t *spec)
{
    km_bank_t *bank = km_bank_new(endpoints, 5000, NULL);
    if (!bank)
        abort();
    uint32_t *items = calloc(spec->n, sizeof *items);
    uint32_t *nbr = calloc((size_t)spec->n * spec->k, sizeof *nbr);
    float *w = calloc((size_t)spec->n * spec->k, sizeof *w);
    float *emb = calloc((size_t)spec->n * spec->e, sizeof *emb);
    if (!items || !nbr || !w || !emb)
        abort();
    for (uint32_t i = 0; i < spec->n; i++) {
        items[i] = i;
        for (uint32_t j = 0; j < spec->k; j++) {
            nbr[(size_t)i * spec->k + j] = spec->neighbor(i, j);
            w[(size_t)i * spec->k + j] = spec->weight(i, j);
        }
        for (uint32_t c = 0; c < spec->e; c++)
            emb[(size_t)i * spec->e + c] = spec->value(i, c);
    }
    MT_CHECK(km_bank_create_feature(bank, "t.graph") == 0 &&
                 km_bank_put_neighbors(bank, "t.graph", items, spec->n, spec->k, nbr, w, 0) == 0 &&
                 km_bank_create_embedding(bank, "t.emb", spec->e) == 0 &&
                 km_bank_put(bank, "t.emb", items, spec->n_emb, spec->e, emb, 7) == 0,
             "fill the bank: %s", km_bank_error(bank));
    free(items);
    free(nbr);
    free(w);
    free(emb);
    return bank;
}
