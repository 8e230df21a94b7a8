/* Inverse document frequencies of the words of a tokenized corpus (data_text.h), where each line is a
 * document, kept by 64-bit hash of the word: no word list, no dictionary, only counts.
 *
 * weight(word) = log((docs + 1) / (df + 1)) + 1, finite for a word never seen (which weighs the most).
 * Used by trainer twotower to pool a definition's word rows, and by its word makers, which must weigh
 * exactly as the trainer does: both build it from the same lines (the training senses). */
#ifndef CARLS_DATA_IDF_H
#define CARLS_DATA_IDF_H

#include "data_text.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *keys;   /* (cap) hash + 1, 0 = empty */
    uint32_t *df;     /* (cap) documents containing the word */
    size_t cap;       /* power of two */
    size_t docs;      /* documents counted */
} data_idf_t;

/* Counts the lines of t for which skip is NULL or skip[line] is false. Returns 0; caller frees with
 * data_idf_free. */
int data_idf_build(data_idf_t *idf, const data_text_t *t, const bool *skip);

/* The weight of a word (len bytes). */
float data_idf_weight(const data_idf_t *idf, const char *word, size_t len);

void data_idf_free(data_idf_t *idf);

#endif
