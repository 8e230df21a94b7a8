/* Seeded, reproducible orderings and subsets of a data set: the same seed gives the same result on every
 * machine and every run (splitmix64 from base/util.h, nothing from the C library's rand). */
#ifndef CARLS_DATA_SAMPLE_H
#define CARLS_DATA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* idx (n) = 0, 1, ..., n-1. */
void carls_iota_u32(uint32_t *idx, size_t n);

/* Fisher-Yates shuffle of idx (n) driven by splitmix64 from *state (advanced). A draw r % (i+1) has a bias
 * below (i+1) / 2^64, negligible for any data set here. */
void carls_shuffle_u32(uint32_t *idx, size_t n, uint64_t *state);

/* Splits examples 0..n-1 (labels (n), classes 0..num_classes-1) into a labelled subset of per_class examples
 * of every class and the unlabelled rest. The choice comes from a shuffle seeded by seed: labelled (at least
 * num_classes * per_class entries) receives the chosen indices class by class in shuffled order, unlabelled
 * (at least n - num_classes * per_class entries; may be NULL) the others in increasing order. Returns 0, or -1
 * when a class has fewer than per_class examples or per_class < 1. */
int carls_label_subset(const uint8_t *labels, size_t n, int num_classes, int per_class, uint64_t seed,
                       uint32_t *labelled, uint32_t *unlabelled);

#endif
