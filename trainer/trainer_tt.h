/* trainer twotower: a reverse dictionary (definition -> headword) on GCIDE with two towers whose rows live
 * in the knowledge bank and negatives whose word-tower embeddings come from the bank (CARLS §4.3). The model
 * is nn/nn_tower.h; the data set data/data_gcide.h.
 *
 * Internal interface between trainer_twotower.c (the training loop; its options in trainer_tt_opts.c) and
 * trainer_tt_eval.c (word vectors and the held-out evaluation). */
#ifndef TRAINER_TT_H
#define TRAINER_TT_H

#include "data_gcide.h"
#include "data_idf.h"
#include "kb_cluster.h"
#include "nn_tower.h"
#include "trainer_tfidf.h"

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

/* The word tower of the n headwords idx over the bank's current rows (none created), pooled exactly as the
 * makers pool them (head->defs > 0: up to NN_TOWER_DEF_SENSES training definitions each): out (n, D), and the
 * pooled inputs x_out (n, E) unless NULL. Returns 0 or a KB_CLIENT_E* code. */
int tt_word_towers(kb_cluster_t *kb, const tt_names_t *names, const data_gcide_t *g, const data_idf_t *idf,
                   const nn_tower_head_t *head, const uint32_t *idx, size_t n, float *out, float *x_out);

/* Computes the query tower of n senses without token dropout, reading word rows without creating any.
 * q_out (n, D). Returns 0 or a KB_CLIENT_E* code. */
int tt_query_vectors(kb_cluster_t *kb, const tt_names_t *names, const data_gcide_t *g, const data_idf_t *idf,
                     const nn_tower_head_t *head, const size_t *senses, size_t n, float *q_out);

/* Hard bank negatives (--hard-queries): from the headwords the bank's knn answered for n_q queries, k slots
 * each (knn_words (n_q, k), best first; UINT32_MAX for an empty slot or an unknown word), keeps each distinct
 * headword once, in slot order, leaving out every positive of the batch (pos (n_pos): a query's own headword and
 * the other in-batch candidates, which are candidates already). Writes at most max_out to out; returns how many. */
size_t tt_hard_select(const uint32_t *knn_words, size_t n_q, size_t k, const uint32_t *pos, size_t n_pos,
                      uint32_t *out, size_t max_out);

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
    float fuse_tfidf;       /* > 0: also rank by cosine + fuse_tfidf * lexical score (fused_* results) */
    tfidf_opts_t lexical;   /* the lexical score: TF-IDF cosine or scaled BM25 (trainer_tfidf.h) */
    const char *save_vectors; /* when set, the held-out query vectors and every word vector are written here */
    const float *fuse_sweep; /* (n_sweep) more fusion weights, each reported on its own line (for tuning) */
    int n_sweep;
    int knn_check;          /* held-out queries also asked to the bank's knn (top 100), 0 = none */
    const char *summary;    /* key=value pairs about training, printed before the metrics on the last line */
} tt_eval_in_t;

/* Evaluates on the held-out senses and prints the metrics; the last line printed to stdout is the
 * key=value result. Returns 0, or -1 (reported). */
int tt_evaluate(const tt_eval_in_t *in);

/* As tt_evaluate, with the vectors read from a file written by --save-vectors (no bank, no training: for
 * sweeping the lexical side and the fusion on fixed vectors). The file must hold the same hold-out. */
int tt_evaluate_saved(const tt_eval_in_t *in, const char *path);

#endif
