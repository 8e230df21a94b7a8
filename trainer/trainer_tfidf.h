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

/* Scoring schemes. TFIDF_COSINE: as above. TFIDF_BM25: Okapi BM25 over the same documents, term weight
 * idf * tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl)) with idf = ln(1 + (N - df + 0.5) / (df + 0.5)), dl the
 * document's length in tokens and avgdl the mean over all N documents; each distinct query term counts once;
 * a query's scores are divided by its best document's score, so the best scores 1 (as a cosine's scale for
 * fusing with the model). */
typedef enum { TFIDF_COSINE = 0, TFIDF_BM25 = 1 } tfidf_scheme_t;

typedef struct {
    tfidf_scheme_t scheme;
    float k1, b; /* BM25 only */
} tfidf_opts_t;

/* Builds the index from g's current training senses (build again after changing the hold-out). Caller owns
 * *out (tfidf_destroy). Returns 0 (it cannot fail but for out of memory, which aborts). */
int tfidf_build(const data_gcide_t *g, tfidf_t **out);

/* As tfidf_build, with a scheme (tfidf_build is TFIDF_COSINE). */
int tfidf_build_ex(const data_gcide_t *g, const tfidf_opts_t *opts, tfidf_t **out);

/* scores (g->n_words): the cosine (or scaled BM25 score) of sense `sense` of g (any sense, usually a held-out one) against every
 * headword's document. g must be the data set t was built from. */
void tfidf_scores(const tfidf_t *t, const data_gcide_t *g, size_t sense, float *scores);

/* Distinct words in the training senses. */
size_t tfidf_n_terms(const tfidf_t *t);

/* Frees t; accepts NULL and *self_p == NULL; nulls *self_p. */
void tfidf_destroy(tfidf_t **self_p);

#endif
