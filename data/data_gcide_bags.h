/* Definition bags of GCIDE headwords: the words of each headword's training definitions (held-out senses
 * excluded) with their IDF weights, as trainer twotower's word tower pools them (--word-defs) and its word
 * makers must pool them too. */
#ifndef CARLS_DATA_GCIDE_BAGS_H
#define CARLS_DATA_GCIDE_BAGS_H

#include "data_gcide.h"
#include "data_idf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char **tok;   /* (off[n]) pointers into g->text */
    uint8_t *len;       /* (off[n]) */
    float *weight;      /* (off[n]) IDF weights */
    size_t *off;        /* (n + 1) bag i is [off[i], off[i + 1]) */
    size_t n;
} data_gcide_bags_t;

/* The IDF of the training definitions: every sense that is not held out is one document. The trainer and
 * its word makers both build it this way, so their weights agree. Free with data_idf_free. */
void data_gcide_idf_build(data_idf_t *idf, const data_gcide_t *g);

/* Bags of the n headwords words[0..n-1] (indices into g->words): the first max_senses training senses of
 * each, at most max_tokens words of each sense. Caller frees with data_gcide_bags_free. */
void data_gcide_bags_build(data_gcide_bags_t *out, const data_gcide_t *g, const data_idf_t *idf,
                           const uint32_t *words, size_t n, size_t max_senses, size_t max_tokens);

void data_gcide_bags_free(data_gcide_bags_t *b);

#endif
