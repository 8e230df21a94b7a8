/* kb-maker --task words: the word-tower maker of trainer twotower (issue 7, CARLS §4.3).
 *
 * On every new checkpoint of kind "twotower" that verifies, recomputes the word tower (nn/nn_tower.h) of its
 * share of the GCIDE headwords (worker i of n: headwords with index % n == i, in data_gcide's sorted order,
 * so a fleet covers every headword once per checkpoint) from the rows the trainer keeps in PREFIX.word and
 * PREFIX.gram, and puts them into PREFIX.vec with version = the checkpoint's step. The trainer samples its
 * bank negatives from PREFIX.vec and evaluates with the bank's knn over it. */
#ifndef KM_WORDS_H
#define KM_WORDS_H

#include "km_maker.h"

#include <signal.h>

/* Runs the words task until *stop (or once with --once). Returns the exit status: 0, or 1 on a failure. */
int km_words_run(const km_opts_t *o, volatile sig_atomic_t *stop);

#endif
