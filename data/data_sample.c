/* Seeded shuffles and label subsets (see data_sample.h). */
#include "data_sample.h"

#include "util.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void carls_iota_u32(uint32_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        idx[i] = (uint32_t)i;
    }
}

void carls_shuffle_u32(uint32_t *idx, size_t n, uint64_t *state)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(carls_splitmix64(state) % i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

int carls_label_subset(const uint8_t *labels, size_t n, int num_classes, int per_class, uint64_t seed,
                       uint32_t *labelled, uint32_t *unlabelled)
{
    if (per_class < 1 || num_classes < 1) {
        return -1;
    }
    uint32_t *order = carls_xmalloc(sizeof *order * (n ? n : 1));
    int *taken = carls_xcalloc((size_t)num_classes, sizeof *taken);
    bool *chosen = carls_xcalloc(n ? n : 1, sizeof *chosen);
    carls_iota_u32(order, n);
    uint64_t state = seed ^ 0x6c616265ULL; /* "labe": keeps this stream apart from other uses of the seed */
    carls_shuffle_u32(order, n, &state);
    for (size_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        int c = labels[i];
        if (c < num_classes && taken[c] < per_class) {
            labelled[(size_t)c * (size_t)per_class + (size_t)taken[c]] = i;
            taken[c]++;
            chosen[i] = true;
        }
    }
    int rc = 0;
    for (int c = 0; c < num_classes; c++) {
        if (taken[c] < per_class) {
            rc = -1;
        }
    }
    if (rc == 0 && unlabelled) {
        size_t u = 0;
        for (size_t i = 0; i < n; i++) {
            if (!chosen[i]) {
                unlabelled[u++] = (uint32_t)i;
            }
        }
    }
    free(order);
    free(taken);
    free(chosen);
    return rc;
}
