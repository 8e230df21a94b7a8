/* The two-tower reverse-dictionary model (trainer twotower, issue 7): the pieces the trainer and the
 * word-tower makers (kb-maker --task words) must compute identically.
 *
 * Rows live in the knowledge bank, keyed by strings, with no dictionary anywhere:
 *   NAME.word  (E)  one row per word: every word of a definition (query tower) and every headword (word
 *                   tower) use the same row, so a headword's row is tied to what definitions say with it;
 *   NAME.gram  (E)  one row per character trigram of "<" headword ">", so an unseen word still has a vector;
 *   NAME.vec   (D)  the word tower's output for every headword, written by makers from a checkpoint (tagged
 *                   with its step) and searched with the bank's FAISS index (inner product = cosine, the
 *                   rows being unit length);
 *   NAME.vecx  (E)  the word tower's pooled input for every headword (the makers' expensive part: hundreds of
 *                   rows gathered per word), so a trainer can apply its current head to bank negatives.
 *
 * Query tower: x = IDF-weighted mean of the definition's word rows;  q = l2norm(head_q(x)).
 * Word tower:  x = row(headword) + mean of its trigram rows           v = l2norm(head_w(x)).
 *                  [+ IDF-weighted mean of the word rows of the headword's other training definitions, when
 *                   the model was trained with --word-defs: the checkpoint's "word.defs" tensor says so]
 * A head is an MLP with a linear skip: head(x) = W x + b + V relu(U x + c), with H hidden units (H = 0: the
 * linear part alone). V starts at zero, so training starts from the linear model and the hidden layer grows
 * from there. Score: <q, v>. The checkpoint (kind NN_TOWER_KIND) holds "query.weight" (D, E), "query.bias"
 * (D), "word.weight" (D, E), "word.bias" (D), and with H > 0 "query.hidden.weight" (H, E), "query.hidden.bias"
 * (H), "query.out.weight" (D, H) and the same for "word."; the shapes carry E, D and H. */
#ifndef NN_TOWER_H
#define NN_TOWER_H

#include "checkpoint.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

#define NN_TOWER_KIND "twotower"
#define NN_TOWER_MAX_GRAMS 64  /* trigrams kept per word (the first ones) */
#define NN_TOWER_L2_EPS 1e-12f
#define NN_TOWER_DEF_TOKENS 64  /* words of each definition pooled in a word-tower definition bag */
#define NN_TOWER_DEF_SENSES 64  /* training senses pooled per headword by makers and the evaluation */
/* The trainer's hold-out, written into its checkpoint directory: makers pooling definitions leave these out. */
#define NN_TOWER_HOLDOUT_FILE "holdout.tsv"

/* The trigrams of "<" word ">": keys[i] gets 3 bytes (no NUL). A word of n bytes has n trigrams (a one-byte
 * word has "<a>"). Returns how many were written, at most max. */
int nn_tower_trigrams(const char *word, size_t len, char (*keys)[3], int max);

/* Word-tower input: x (B, E), x[b] = word_rows[word_idx[b]] + mean of gram_rows[gram_idx[g]] for g in
 * gram_off[b] .. gram_off[b+1]-1 (no trigram: just the word row). word_rows (R1, E), gram_rows (R2, E). */
void nn_tower_word_pool(float *x, const float *word_rows, const int32_t *word_idx, const float *gram_rows,
                        const int32_t *gram_idx, const int32_t *gram_off, int B, int E);
/* Its backward: d_word_rows (R1, E) and d_gram_rows (R2, E) ACCUMULATE (+=) the gradients from dx (B, E). */
void nn_tower_word_pool_backward(float *d_word_rows, float *d_gram_rows, const float *dx, const int32_t *word_idx,
                                 const int32_t *gram_idx, const int32_t *gram_off, int B, int E);

/* A tower's dense head (see above). Pointers into the trainer's parameters or a checkpoint. */
typedef struct {
    int E, D, H;        /* input, output and hidden sizes (H = 0: linear) */
    const float *W;     /* (D, E) */
    const float *bias;  /* (D) */
    const float *U;     /* (H, E), H > 0 only */
    const float *c;     /* (H) */
    const float *V;     /* (D, H) */
    int defs;           /* word tower only: > 0 when it pools the headword's definitions (tensor "word.defs") */
} nn_tower_head_t;

/* Gradients of a head's parameters, same shapes; they ACCUMULATE (+=). U, c, V are used only when H > 0. */
typedef struct {
    float *W, *bias, *U, *c, *V;
} nn_tower_head_grads_t;

/* Forward over B inputs x (B, E): pre (B, D) = head(x); out (B, D) = pre / norms, norms (B) = sqrt(|pre|^2 +
 * eps); hid (B, H) keeps relu(U x + c) for the backward (NULL when H = 0). */
void nn_tower_head_forward(const nn_tower_head_t *h, float *out, float *pre, float *norms, float *hid,
                           const float *x, int B);
/* Backward from dout (B, D): dx (B, E) overwritten (NULL skips it); g accumulates; dpre (B, D) and, when
 * H > 0, dhid (B, H) are scratch. out, norms and hid are the forward's. */
void nn_tower_head_backward(const nn_tower_head_t *h, const nn_tower_head_grads_t *g, float *dx, float *dpre,
                            float *dhid, const float *dout, const float *out, const float *norms, const float *hid,
                            const float *x, int B);

/* InfoNCE over B queries q (B, D) and N >= B candidates cand (N, D): candidate b is query b's positive;
 * every other candidate is a negative, except one with the same word (cand_word (N), so two senses of one
 * headword in a batch, or a bank negative equal to the positive, are not pushed apart): its logit is masked.
 * Logits are inv_temp * <q_b, cand_j> - logq[j]: logq (N) or NULL is the sampled-softmax correction, the log
 * of how many times candidate j is expected among the candidates, so that a sampled loss estimates the
 * softmax over every word (popular words, drawn often into a batch, are not pushed down for it). Returns the
 * mean loss over the batch; writes dq (B, D) and dcand (N, D) (overwritten: the gradients of the mean loss),
 * using logits and probs (B, N) as scratch. */
double nn_tower_infonce(float *dq, float *dcand, float *logits, float *probs, const float *q, const float *cand,
                        const uint32_t *cand_word, const float *logq, float inv_temp, int B, int N, int D);

/* A tower's head read from a checkpoint: pointers into ckpt (valid while it lives). Returns 0, or -1 with the
 * reason in err (wrong kind, missing tensor, inconsistent shapes). */
int nn_tower_from_ckpt(const carls_ckpt_t *ckpt, const char *which /* "query" or "word" */, nn_tower_head_t *out,
                       char *err, size_t errlen);

/* Definition bags of n headwords: the words of bag i are tok[off[i] .. off[i+1]-1] (len bytes each) with
 * their IDF weights. */
typedef struct {
    const char *const *tok;
    const uint8_t *len;
    const float *weight;
    const size_t *off;   /* (n + 1) */
} nn_tower_bags_t;

/* A row's key: len bytes at data (base/util.h; the bank's kb_key_t is the same type). */
typedef carls_bytes_t nn_key_t;

/* Fills rows (n, dim) with the rows of n distinct keys of table, creating none. Returns 0, or a negative code
 * of the caller's own (nn/ knows no bank: the trainer and the word makers pass a function over their bank
 * client, ctx being that client). */
typedef int (*nn_row_fetch_fn)(void *ctx, const char *table, const nn_key_t *keys, size_t n, int dim,
                               float *rows);

/* The word tower of n headwords over rows of word_table and gram_table (NAME.word, NAME.gram) that fetch reads:
 * out (n, D). The trainer's evaluation and the word makers (kb-maker --task words) both call this, so they
 * compute the same vectors. bags: required when head->defs > 0 (NULL otherwise). x_out (n, E), or NULL: the
 * pooled input of the head (what makers store in NAME.vecx so that a trainer can apply its current head to
 * it). Fetches rows for up to 256 headwords at a time. Returns 0, the first non-zero return of fetch, or -1
 * (nothing fetched) when head->defs > 0 and bags is NULL. Defined in nn_tower_words.c. */
int nn_tower_word_vectors(nn_row_fetch_fn fetch, void *ctx, const char *word_table, const char *gram_table,
                          const char *const *words, size_t n, const nn_tower_bags_t *bags,
                          const nn_tower_head_t *head, float *out, float *x_out);

#endif
