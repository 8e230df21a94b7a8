/* trainer twotower: a reverse dictionary (definition -> headword) on GCIDE with two towers whose rows live
 * in the knowledge bank and negatives whose word-tower embeddings come from the bank (CARLS §4.3). The model
 * is nn/nn_tower.h; the data set data/data_gcide.h.
 *
 * Internal interface between trainer_twotower.c (options, training loop) and trainer_tt_eval.c (word
 * vectors and the held-out evaluation). */
#ifndef TRAINER_TT_H
#define TRAINER_TT_H

#include "data_gcide.h"
#include "data_idf.h"
#include "kb_cluster.h"
#include "nn_tower.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The hold-out, written into the checkpoint directory for the word makers (kb-maker --task words). */
#define TT_HOLDOUT_FILE NN_TOWER_HOLDOUT_FILE

/* Table names for --table NAME. */
typedef struct {
    char word[160];  /* NAME.word: word rows (query words and headwords) */
    char gram[160];  /* NAME.gram: character-trigram rows */
    char vec[160];   /* NAME.vec: word-tower outputs, written by makers (or the trainer), FAISS index */
    char vecx[160];  /* NAME.vecx: word-tower pooled inputs, written by makers (bank negatives) */
} tt_names_t;

/* Fills the names; -1 when base is not a valid table name or too long. */
int tt_names(const char *base, tt_names_t *names);

/* Computes the query tower of n senses without token dropout, reading word rows without creating any.
 * q_out (n, D). Returns 0 or a KB_CLIENT_E* code. */
int tt_query_vectors(kb_cluster_t *kb, const tt_names_t *names, const data_gcide_t *g, const data_idf_t *idf,
                     const nn_tower_head_t *head, const size_t *senses, size_t n, float *q_out);

/* What the evaluation needs. */
typedef struct {
    kb_cluster_t *kb;
    const tt_names_t *names;
    const data_gcide_t *g;
    const data_idf_t *idf;
    nn_tower_head_t query, word;
    uint64_t step;          /* the checkpoint step the vectors must come from */
    bool vectors_from_trainer; /* compute and put NAME.vec here, else wait for makers */
    double wait_fresh_s;    /* how long to wait for makers */
    float fuse_tfidf;       /* > 0: also rank by cosine + fuse_tfidf * TF-IDF cosine (fused_* results) */
    const float *fuse_sweep; /* (n_sweep) more fusion weights, each reported on its own line (for tuning) */
    int n_sweep;
    int knn_check;          /* held-out queries also asked to the bank's knn (top 100), 0 = none */
    const char *summary;    /* key=value pairs about training, printed before the metrics on the last line */
} tt_eval_in_t;

/* Evaluates on the held-out senses and prints the metrics; the last line printed to stdout is the
 * key=value result. Returns 0, or -1 (reported). */
int tt_evaluate(const tt_eval_in_t *in);

#endif
