/* TF-IDF baseline for the GCIDE reverse dictionary: rank every headword for a definition by the cosine
 * between the definition and the headword's document.
 *
 * A headword's document is the concatenation of its training senses (held-out senses excluded, so a
 * held-out definition is never matched against itself). Term weights: sublinear term frequency times
 * inverse document frequency, (1 + ln tf) * ln(N / df), N the number of documents; each document and each
 * query is L2-normalised, so a score is a cosine in [0, 1]. Query words no training sense contains are
 * ignored. Scoring goes through an inverted index (term -> documents holding it), so a query costs the
 * lengths of its terms' posting lists, not a pass over every document.
 *
 * Words are told apart by their bytes through a hash table private to the baseline: it is an evaluation
 * yardstick, not the trained model (whose vocabulary lives in the knowledge bank). */
#ifndef TRAINER_TFIDF_H
#define TRAINER_TFIDF_H

#include "data_gcide.h"

#include <stddef.h>

typedef struct tfidf tfidf_t;

/* Builds the index from g's current training senses (build again after changing the hold-out). Caller owns
 * *out (tfidf_destroy). Returns 0 (it cannot fail but for out of memory, which aborts). */
int tfidf_build(const data_gcide_t *g, tfidf_t **out);

/* scores (g->n_words): the cosine of sense `sense` of g (any sense, usually a held-out one) against every
 * headword's document. g must be the data set t was built from. */
void tfidf_scores(const tfidf_t *t, const data_gcide_t *g, size_t sense, float *scores);

/* Distinct words in the training senses. */
size_t tfidf_n_terms(const tfidf_t *t);

/* Frees t; accepts NULL and *self_p == NULL; nulls *self_p. */
void tfidf_destroy(tfidf_t **self_p);

#endif
