/* Ranking metrics for retrieval evaluations (the GCIDE reverse dictionary: rank the right headword among
 * every headword for a definition). */
#ifndef TRAINER_RANK_H
#define TRAINER_RANK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The rank of candidate `truth` (< n) among n scored candidates, higher score better: 1 + the number of
 * candidates scored strictly higher + half of the other candidates tied with it, rounded down. Splitting
 * ties keeps a scorer that gives many candidates the same score (a TF-IDF query sharing no word with most
 * documents scores them all 0) from being credited with the best rank among them, or blamed with the worst.
 * A NaN score counts as lower than any number. */
uint32_t rank_of_truth(const float *scores, size_t n, size_t truth);

typedef struct {
    size_t n;            /* ranks measured */
    double r1, r10, r100; /* share of ranks <= 1, <= 10, <= 100 */
    double mrr;          /* mean of 1 / rank */
    double median_rank;  /* the middle rank (mean of the two middle ones when n is even) */
} rank_metrics_t;

/* Summarises n ranks (each >= 1); all zero when n is 0. */
void rank_metrics(const uint32_t *ranks, size_t n, rank_metrics_t *out);

/* Prints one line "PREFIXr1=... PREFIXr10=... PREFIXr100=... PREFIXmedian_rank=... PREFIXmrr=... PREFIXn=..."
 * (prefix NULL for none, e.g. "tfidf_"). */
void rank_metrics_print(FILE *f, const char *prefix, const rank_metrics_t *m);

#endif
