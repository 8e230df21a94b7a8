/* trainer word2vec: skip-gram with negative sampling whose vocabulary lives in the knowledge bank
 * (DynamicEmbedding §3.1.4). Internal interface between trainer_word2vec.c (command line, training loop),
 * trainer_w2v_bank.c (the bank's tables), trainer_w2v_map.c (a batch's word map)
 * and trainer_w2v_eval.c (vector files and quality checks); the batch's forward/backward is nn_sgns_cpu
 * (nn/nn_sgns.h).
 *
 * Tables, for --table NAME (all keyed by the word itself, no dictionary anywhere):
 *   NAME        input vectors (the word embeddings): dim D, uniform init in [-0.5/D, 0.5/D], server-side
 *               optimizer, cosine FAISS index (kbctl knn NAME --key sheep).
 *   NAME.out    output (context) vectors: zero init, same optimizer, inner-product index (top-k prediction of
 *               context words, DynamicEmbedding §3.1.2).
 *   NAME.count  dim 1, never updated: its rows' frequencies are the word counts. Every token of the trainer's
 *               first pass is looked up here (each occurrence counts one), so the bank counts words exactly
 *               and its unigram^0.75 sampler draws the negatives. The admission policy (--admission) acts
 *               here: a word the count table has not admitted is not trained and never reaches NAME/NAME.out.
 */
#ifndef TRAINER_W2V_H
#define TRAINER_W2V_H

#include "kb_cluster.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define W2V_MAX_DIM 1024
#define W2V_MAX_WINDOW 64
#define W2V_MAX_NEGATIVES 64

typedef enum { W2V_ADMIT_BLOOM = 0, W2V_ADMIT_FREQUENCY = 1, W2V_ADMIT_NONE = 2 } w2v_admission_t;

/* Table settings shared by the trainer (creating tables) and the tests. */
typedef struct {
    uint32_t dim;
    bool adagrad;          /* AdaGrad, else SGD */
    float lr;              /* server learning rate */
    bool lazy;             /* lazy averaged updates, else immediate */
    uint32_t max_age_ms;   /* lazy */
    uint32_t max_pending;  /* lazy */
    w2v_admission_t admission;
    uint32_t min_count;    /* admission frequency (count table) */
    const char *knn_spec;  /* FAISS factory string, "" or "none" for no index */
} w2v_tables_t;

/* Table names for base NAME. */
typedef struct {
    char in[160];
    char out[160];
    char count[160];
} w2v_names_t;

/* Fills the three names; -1 when base is not a valid table name or too long for the suffixes. */
int w2v_names(const char *base, w2v_names_t *names);

/* Creates the three tables on every shard (if_not_exists: a trainer joining or resuming finds them with the
 * same config). 0, or a KB_CLIENT_E* code with kb_cluster_last_error(). */
int w2v_tables_create(kb_cluster_t *kb, const w2v_names_t *names, const w2v_tables_t *cfg);

/* ---- one batch's hash map: word bytes -> dense index, reset for every batch (never a dictionary) ---- */
typedef struct {
    uint32_t *slots;       /* (cap) index + 1, 0 = empty */
    uint32_t cap;          /* power of two */
    const char **key;      /* (n) bytes of entry i */
    uint8_t *len;          /* (n) */
    uint32_t n, n_cap;
} w2v_map_t;

void w2v_map_init(w2v_map_t *m);
void w2v_map_free(w2v_map_t *m);
void w2v_map_clear(w2v_map_t *m);
/* Index of the word, inserting it when new. */
uint32_t w2v_map_put(w2v_map_t *m, const char *key, uint8_t len);
/* Index of the word, or UINT32_MAX. */
uint32_t w2v_map_get(const w2v_map_t *m, const char *key, uint8_t len);
/* keys (m->n) = the map's words in index order, as bank keys (pointing at the words' bytes). */
void w2v_map_keys(const w2v_map_t *m, kb_key_t *keys);

/* ---- vector files (word2vec text format) and quality checks (trainer_w2v_eval.c) ---- */

typedef struct {
    uint32_t n, dim;
    char **words;   /* (n) */
    float *vec;     /* (n, dim), L2-normalized by w2v_vectors_normalize */
    w2v_map_t map;  /* word -> entry (the file's vocabulary, for evaluation only) */
    uint32_t *map_row; /* (map.n) row of each entry */
} w2v_vectors_t;

/* Reads "count dim" then "word v1 .. vdim" lines. 0, or -1 with err. */
int w2v_vectors_read(const char *path, w2v_vectors_t **out, char *err, size_t errlen);
void w2v_vectors_destroy(w2v_vectors_t **self_p);
/* Row of word or -1. */
int64_t w2v_vectors_find(const w2v_vectors_t *v, const char *word);
/* Scales every row to unit length (zero rows stay zero). */
void w2v_vectors_normalize(w2v_vectors_t *v);

/* Writes rows as a word2vec text file (temp + fsync + rename). 0 or -1 with err. */
int w2v_write_vectors(const char *path, uint32_t n, uint32_t dim, char *const *words, const float *vec,
                      char *err, size_t errlen);

/* Results of the checks on one vector set. */
typedef struct {
    double spearman;       /* pairs file: rank correlation of cosine with the hand scores */
    uint32_t pairs_found;  /* pairs whose both words have vectors */
    uint32_t pairs_total;
    double median_rank;    /* rank of word2 among word1's neighbours, over the pairs scored >= 7 */
    double hit10;          /* share of those with rank <= 10 */
    double mrr;            /* mean of 1 / rank over those pairs */
    double auc;            /* mean share of the other words ranked below word2: 1 - (rank - 1) / (words - 2) */
    double purity10;       /* categories: share of each member's 10 nearest (among grouped words) in its group */
    double cos_in, cos_out;/* mean cosine inside groups / between groups */
    uint32_t cat_words;
} w2v_quality_t;

/* Runs the checks whose files are given (NULL to skip). 0 or -1 with err (unreadable file). */
int w2v_quality(const w2v_vectors_t *v, const char *pairs_path, const char *categories_path, w2v_quality_t *q,
                char *err, size_t errlen);

/* Mean share of common top-k neighbours (among the words both sets have) over the first `first` words of a
 * that b also has. */
double w2v_neighbour_overlap(const w2v_vectors_t *a, const w2v_vectors_t *b, uint32_t first, uint32_t k);

/* Top-k neighbours of row r by cosine (v normalized), excluding r: rows into out (k). Returns how many. */
uint32_t w2v_vectors_nearest(const w2v_vectors_t *v, uint32_t r, uint32_t k, uint32_t *out, float *score);

/* trainer word2vec (trainer_word2vec.c) and trainer w2v-eval (trainer_w2v_eval.c). */
int trainer_word2vec_main(int argc, char **argv);
int trainer_w2v_eval_main(int argc, char **argv);

#endif
