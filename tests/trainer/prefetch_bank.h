/* The bank both prefetcher tests read, made the same way: a real kb-server holding a neighbour graph and
 * embedding rows written through km_bank, as the functions of a pt_bank_spec_t give them. */
#ifndef CARLS_TEST_PREFETCH_BANK_H
#define CARLS_TEST_PREFETCH_BANK_H

#include "km_bank.h"
#include "server_harness.h"

#include <stdint.h>

typedef struct {
    uint32_t n;     /* items 0..n-1, each with k neighbours in "t.graph" */
    uint32_t k;
    uint32_t e;     /* width of the rows of "t.emb" */
    uint32_t n_emb; /* items 0..n_emb-1 get a row (version 7); the others are missing */
    uint32_t (*neighbor)(uint32_t item, uint32_t j); /* item's j-th neighbour */
    float (*weight)(uint32_t item, uint32_t j);      /* and the edge's weight */
    float (*value)(uint32_t item, uint32_t c);       /* component c of item's row */
} pt_bank_spec_t;

/* Fills the bank at endpoints (one, or a sharded bank's in shard order) as spec says. Returns a km_bank client
 * of it for further writes (the caller destroys it); a failed fill is an MT_CHECK failure. */
km_bank_t *pt_fill_bank(const char *endpoints, const pt_bank_spec_t *spec);

/* Starts srv (with no extra arguments) and fills it as spec says. Returns a km_bank client of it for further
 * writes (the caller destroys it), or NULL when the server did not start; a failed fill is an MT_CHECK
 * failure. */
km_bank_t *pt_start_bank(test_server_t *srv, const pt_bank_spec_t *spec);

#endif
