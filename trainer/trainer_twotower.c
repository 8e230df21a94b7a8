/* trainer twotower: the training loop (see trainer_tt.h; its options: trainer_tt_opts.h).
 *
 * One step: B training (definition, headword) pairs; the batch's distinct word and trigram rows are looked
 * up in the bank; the query tower embeds the definitions (tokens dropped at random), the word tower the
 * headwords (each tower: pooled rows -> linear or MLP head -> L2); InfoNCE over the B in-batch candidates plus
 * M headwords from the bank (drawn by the bank's uniform sampler, or as the headwords of random training pairs),
 * written there by makers from an earlier checkpoint: their pooled word-tower inputs (NAME.vecx) put through
 * this trainer's current head (the default), or their finished vectors (NAME.vec, --negatives-from outputs);
 * plus (--hard-queries) hard negatives the bank's knn over NAME.vec finds near the step's queries, pooled from
 * NAME.vecx or (--hard-fresh 1) by this trainer from their current rows like the batch's headwords. --logq
 * corrects every logit by its candidate's sampling rate. The rows' gradients are pushed back to the bank, the
 * dense heads take an Adam step here.
 *
 * Checkpoints (--ckpt-dir, every --ckpt-every steps and after the last) hold the heads and what an exact
 * continuation needs (trainer_resume.h; s_add_state lists it); with --bank-snapshot PREFIX the bank, which
 * holds the rows this trainer trains, is snapshotted first and the checkpoint names the snapshot. --resume
 * continues from --ckpt-dir/latest on a bank restored from that snapshot (docs/STATE.md "Resuming a run"). */
#include "trainer.h"
#include "trainer_metrics.h"
#include "trainer_resume.h"
#include "trainer_run_args.h"
#include "trainer_tt.h"
#include "trainer_tt_opts.h"
#include "trainer_util.h"
#include "trainer_w2v.h"

#include "kb_curve_args.h"

#include "carls_args.h"
#include "checkpoint.h"
#include "data_gcide_bags.h"
#include "data_pairs.h"
#include "data_sample.h"
#include "files.h"
#include "log.h"
#include "progress.h"
#include "nn_ops.h"
#include "protocol.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TT_MAX_TOKENS 256 /* tokens of one definition used (the rest are cut) */

int tt_names(const char *base, tt_names_t *names)
{
    if (!carls_table_name_valid(base) || strlen(base) + 6 > 128)
        return -1;
    snprintf(names->word, sizeof names->word, "%s.word", base);
    snprintf(names->gram, sizeof names->gram, "%s.gram", base);
    snprintf(names->vec, sizeof names->vec, "%s.vec", base);
    snprintf(names->vecx, sizeof names->vecx, "%s.vecx", base);
    return 0;
}

/* ---- tables --------------------------------------------------------------------------------------- */

static int s_create_tables(kb_cluster_t *kb, const tt_names_t *names, const tt_opts_t *o)
{
    const int n_tables = (o->negatives > 0 || o->hard_queries > 0) && o->negatives_from_inputs ? 4 : 3;
    for (int t = 0; t < n_tables; t++) {
        Carls__TableConfig tc;
        Carls__OptimizerConfig opt;
        Carls__LazyUpdateConfig lazy;
        Carls__KnnConfig knn;
        carls__table_config__init(&tc);
        carls__optimizer_config__init(&opt);
        carls__lazy_update_config__init(&lazy);
        carls__knn_config__init(&knn);
        tc.kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
        tc.optimizer = &opt;
        tc.lazy = &lazy;
        /* One trainer pushes each row at most once per step: apply at once, nothing to average. */
        lazy.policy = CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
        if (t < 2) {
            tc.dim = (uint32_t)o->E;
            tc.init = CARLS__INIT_KIND__INIT_UNIFORM;
            tc.init_scale = o->init_scale;
            opt.kind = o->emb_opt;
            opt.learning_rate = o->emb_lr;
        } else if (t == 3) {
            /* Pooled word-tower inputs, written by put only (makers); read by id, never searched. */
            tc.dim = (uint32_t)o->E;
            tc.init = CARLS__INIT_KIND__INIT_ZEROS;
            opt.kind = CARLS__OPTIMIZER_KIND__OPT_SGD;
        } else {
            /* Written by put only (makers); unit rows, so inner product is cosine. */
            tc.dim = (uint32_t)o->D;
            tc.init = CARLS__INIT_KIND__INIT_ZEROS;
            opt.kind = CARLS__OPTIMIZER_KIND__OPT_SGD;
            knn.spec = "Flat";
            knn.metric = CARLS__KNN_METRIC__METRIC_IP;
            tc.knn = &knn;
        }
        const char *name = t == 0 ? names->word : t == 1 ? names->gram : t == 2 ? names->vec : names->vecx;
        int rc = kb_cluster_create_table(kb, name, &tc, true);
        if (rc != 0) {
            LOG_ERROR("trainer: cannot create table %s: %s", name, kb_cluster_last_error(kb));
            return rc;
        }
    }
    return 0;
}

/* ---- the training state ------------------------------------------------------------------------------ */

typedef struct {
    tt_opts_t o;
    tt_names_t names;
    data_gcide_t *g;
    data_idf_t idf;
    kb_cluster_t *kb;
    uint64_t rng;

    /* dense parameters: both heads (query, word) in one block, with gradients and Adam state */
    float *params, *grads, *adam_m, *adam_v;
    size_t n_params;
    nn_tower_head_t hq, hw;        /* views into params */
    nn_tower_head_grads_t gq, gw;  /* views into grads */
    int adam_t;

    /* the batch */
    uint32_t *train;        /* training sense indices, shuffled each epoch */
    size_t n_train;
    w2v_map_t wmap, gmap;   /* distinct word / trigram keys of the batch */
    char (*gram_keys)[3];   /* storage for the batch's trigram keys */
    int32_t *bag_idx, *bag_off;
    float *bag_w;
    int32_t *hw_idx, *gram_idx, *gram_off;
    int32_t *dbag_idx, *dbag_off;  /* --word-defs: the headwords' other definitions, into the word rows */
    float *dbag_w, *xd, *d_scratch;
    size_t dbag_cap, d_scratch_cap;
    uint32_t *hw_word;      /* (B) headword index of each pair */
    kb_key_t *keys;
    size_t keys_cap;
    float *word_rows, *gram_rows, *d_word_rows, *d_gram_rows;
    size_t word_rows_cap;   /* rows allocated in word_rows/d_word_rows (grown as batches need) */
    float *xq, *preq, *q, *nq, *xw, *prew, *v, *nw, *dq, *dxq, *dxw, *dpre;
    float *hidq, *hidw, *neg_hid, *dhid; /* MLP heads (H > 0): hidden activations and their gradient */
    float *cand, *dcand, *logits, *probs;
    uint32_t *cand_word;    /* (B + M) headword of each candidate */
    float *cand_logq;       /* (B + M) --logq: log of each candidate's expected count among a step's */
    float *pair_share;      /* --logq only: (headwords) each headword's share of the training pairs */
    /* bank negatives */
    float *neg;             /* (M, D) */
    float *negx, *neg_pre, *neg_norm, *neg_dpre; /* --negatives-from inputs: (M, E), (M, D), (M), (M, D) */
    float *negx_shifted;    /* --negatives-shift: (M, E) negx moved by the drift measured on the batch */
    /* --stale-positives, --negatives-shift: the batch's headwords' pooled inputs as makers wrote them */
    float *batch_vecx;      /* (B, E) */
    kb_key_t *batch_keys;   /* (B) */
    kb_row_meta_t *batch_meta; /* (B): version 0 where no maker has written one */
    double *shift;          /* (E) the drift */
    double shift_ratio_sum; /* sums of |shift| / mean |input|, over the steps shifted */
    uint64_t shift_n, shift_skipped;
    uint64_t stale_pos_n, stale_pos_of; /* --stale-positives: inputs replaced, of the batch items seen */
    uint32_t *neg_word;     /* (M) headword index, or UINT32_MAX when unknown */
    kb_key_t *neg_keys;     /* (M) --negatives-sampling pairs: the drawn headwords' keys */
    int n_neg;              /* negatives held now: n_uni uniform, then n_hard hard ones (0 until the table has rows) */
    int n_uni, n_hard;
    int n_fresh;            /* --hard-fresh: hard negatives held as extra word-tower items after the batch's B */
    uint32_t *hard_knn, *hard_sel; /* (hard_queries * hard_k) */
    kb_key_t *hard_keys;
    double hard_staleness, hard_staleness_sum, hard_n_sum; /* last, and sums over the fetches that had some */
    uint64_t hard_fetches, hard_unavailable;
    double neg_staleness;   /* mean (step - version) of the negatives held */
    uint64_t neg_fetches, neg_unavailable;
    /* How stale the bank negatives are, measured: a few of them recomputed from current rows now and then */
    double drift_x_cos, drift_x_norm, drift_v_cos;
    double drift_xc_cos, drift_vs_cos; /* the same with each side centred on its own mean / shifted to today's */
    uint64_t drift_n;
    double staleness_sum;
    uint64_t staleness_n;
    double loss_sum;        /* the metrics window: losses of the steps since the last row */
    int loss_n;
    /* checkpoints, bank snapshots and --resume */
    trainer_snapshots_t *snaps; /* --bank-snapshot; NULL: none */
    carls_ckpt_t *resume;       /* --resume: the checkpoint continued from */
    char resume_path[4200];
    uint64_t start;             /* the first step to train: 0, or the resumed checkpoint's step */
    uint64_t last_ckpt;         /* the step of the newest checkpoint written (or resumed from); UINT64_MAX: none */
} s_run_t;

/* The two heads' parameters, gradients and Adam moments in one allocation each, initialised. */
static void s_init_heads(s_run_t *r)
{
    const tt_opts_t *o = &r->o;
    const size_t E = (size_t)o->E, D = (size_t)o->D;
    size_t H = (size_t)o->H, per_head = D * E + D + H * E + H + D * H;
    r->n_params = 2 * per_head;
    r->params = carls_xcalloc(r->n_params, sizeof(float));
    r->grads = carls_xcalloc(r->n_params, sizeof(float));
    r->adam_m = carls_xcalloc(r->n_params, sizeof(float));
    r->adam_v = carls_xcalloc(r->n_params, sizeof(float));
    /* Each head: W (D, E), bias (D), U (H, E), c (H), V (D, H). PyTorch's Linear default for W and U:
     * uniform(+-1/sqrt(E)); biases zero; V zero, so the MLP starts as the linear head. */
    nn_tower_head_t *heads[2] = {&r->hq, &r->hw};
    nn_tower_head_grads_t *grads[2] = {&r->gq, &r->gw};
    float a = 1.0f / sqrtf((float)E);
    uint64_t st = o->seed ^ 0x70707070ull;
    for (int t = 0; t < 2; t++) {
        float *p = r->params + (size_t)t * per_head, *g = r->grads + (size_t)t * per_head;
        const float *W = p, *U = p + D * E + D;
        *heads[t] = (nn_tower_head_t){.E = (int)E, .D = (int)D, .H = (int)H, .W = W, .bias = W + D * E, .U = U,
                                      .c = U + H * E, .V = U + H * E + H, .defs = t == 1 ? o->word_defs : 0};
        *grads[t] = (nn_tower_head_grads_t){.W = g, .bias = g + D * E, .U = g + D * E + D,
                                            .c = g + D * E + D + H * E, .V = g + D * E + D + H * E + H};
    }
    /* Drawn in this order (the two W interleaved, then the two U) so a seed gives the linear model it gave
     * before the MLP existed. */
    float *Wq = (float *)r->hq.W, *Ww = (float *)r->hw.W, *Uq = (float *)r->hq.U, *Uw = (float *)r->hw.U;
    for (size_t i = 0; i < D * E; i++) {
        Wq[i] = a * (2.0f * (float)((carls_splitmix64(&st) >> 40) * 0x1p-24) - 1.0f);
        Ww[i] = a * (2.0f * (float)((carls_splitmix64(&st) >> 40) * 0x1p-24) - 1.0f);
    }
    for (size_t i = 0; i < H * E; i++)
        Uq[i] = a * (2.0f * (float)((carls_splitmix64(&st) >> 40) * 0x1p-24) - 1.0f);
    for (size_t i = 0; i < H * E; i++)
        Uw[i] = a * (2.0f * (float)((carls_splitmix64(&st) >> 40) * 0x1p-24) - 1.0f);
}

static void s_alloc(s_run_t *r)
{
    const tt_opts_t *o = &r->o;
    size_t E = (size_t)o->E, D = (size_t)o->D, B = (size_t)o->batch, H = (size_t)o->H;
    size_t Hmax = (size_t)o->hard_queries * (size_t)o->hard_k;
    size_t M = (size_t)o->negatives + Hmax; /* uniform then hard negatives */
    r->hard_knn = carls_xmalloc((Hmax + 1) * sizeof(uint32_t));
    r->hard_sel = carls_xmalloc((Hmax + 1) * sizeof(uint32_t));
    r->hard_keys = carls_xmalloc((Hmax + 1) * sizeof(kb_key_t));
    s_init_heads(r);
    const size_t Bq = B;
    B += o->hard_fresh ? Hmax : 0; /* word-tower items: the batch's headwords, then fresh hard negatives */
    size_t L = Bq * TT_MAX_TOKENS, G = B * NN_TOWER_MAX_GRAMS;
    r->gram_keys = carls_xmalloc(G * sizeof *r->gram_keys);
    r->bag_idx = carls_xmalloc(L * sizeof(int32_t));
    r->bag_w = carls_xmalloc(L * sizeof(float));
    r->bag_off = carls_xmalloc((B + 1) * sizeof(int32_t));
    r->hw_idx = carls_xmalloc(B * sizeof(int32_t));
    r->hw_word = carls_xmalloc(B * sizeof(uint32_t));
    r->gram_idx = carls_xmalloc(G * sizeof(int32_t));
    r->gram_off = carls_xmalloc((B + 1) * sizeof(int32_t));
    r->dbag_off = carls_xmalloc((B + 1) * sizeof(int32_t));
    r->xd = carls_xmalloc(B * E * sizeof(float));
    r->gram_rows = carls_xmalloc(G * E * sizeof(float));
    r->d_gram_rows = carls_xmalloc(G * E * sizeof(float));
    float **be[] = {&r->xq, &r->xw, &r->dxq, &r->dxw};
    for (size_t i = 0; i < sizeof be / sizeof be[0]; i++)
        *be[i] = carls_xmalloc(B * E * sizeof(float));
    float **bd[] = {&r->preq, &r->q, &r->prew, &r->v, &r->dq, &r->dpre};
    for (size_t i = 0; i < sizeof bd / sizeof bd[0]; i++)
        *bd[i] = carls_xmalloc(B * D * sizeof(float));
    r->nq = carls_xmalloc(B * sizeof(float));
    if (H > 0) {
        r->hidq = carls_xmalloc(B * H * sizeof(float));
        r->hidw = carls_xmalloc(B * H * sizeof(float));
        r->neg_hid = carls_xmalloc((M + 1) * H * sizeof(float));
        r->dhid = carls_xmalloc((B > M + 1 ? B : M + 1) * H * sizeof(float));
    }
    r->nw = carls_xmalloc(B * sizeof(float));
    r->cand = carls_xmalloc((B + M) * D * sizeof(float));
    r->dcand = carls_xmalloc((B + M) * D * sizeof(float));
    r->logits = carls_xmalloc(B * (B + M) * sizeof(float));
    r->probs = carls_xmalloc(B * (B + M) * sizeof(float));
    r->cand_word = carls_xmalloc((B + M) * sizeof(uint32_t));
    r->cand_logq = carls_xmalloc((B + M) * sizeof(float));
    if (o->logq) {
        r->pair_share = carls_xcalloc(r->g->n_words, sizeof(float));
        for (size_t i = 0; i < r->n_train; i++)
            r->pair_share[r->g->senses[r->train[i]].word] += 1.0f / (float)r->n_train;
    }
    r->neg = carls_xmalloc((M + 1) * D * sizeof(float));
    r->negx = carls_xmalloc((M + 1) * E * sizeof(float));
    r->neg_pre = carls_xmalloc((M + 1) * D * sizeof(float));
    r->neg_norm = carls_xmalloc((M + 1) * sizeof(float));
    r->neg_dpre = carls_xmalloc((M + 1) * D * sizeof(float));
    r->neg_word = carls_xmalloc((M + 1) * sizeof(uint32_t));
    r->neg_keys = carls_xmalloc((M + 1) * sizeof(kb_key_t));
    if (o->negatives_shift) {
        r->negx_shifted = carls_xmalloc((M + 1) * E * sizeof(float));
        r->shift = carls_xmalloc(E * sizeof(double));
    }
    if (o->negatives_shift || o->stale_positives > 0) {
        r->batch_vecx = carls_xmalloc(Bq * E * sizeof(float));
        r->batch_keys = carls_xmalloc(Bq * sizeof(kb_key_t));
        r->batch_meta = carls_xmalloc(Bq * sizeof(kb_row_meta_t));
    }
    w2v_map_init(&r->wmap);
    w2v_map_init(&r->gmap);
}

static void s_free(s_run_t *r)
{
    void *p[] = {r->dbag_idx, r->dbag_off, r->dbag_w, r->xd, r->d_scratch, r->params, r->grads, r->adam_m, r->adam_v, r->train, r->gram_keys, r->bag_idx, r->bag_w,
                 r->bag_off, r->hw_idx, r->hw_word, r->gram_idx, r->gram_off, r->keys, r->word_rows,
                 r->d_word_rows, r->gram_rows, r->d_gram_rows, r->xq, r->xw, r->dxq, r->dxw, r->preq, r->q,
                 r->prew, r->v, r->dq, r->dpre, r->nq, r->nw, r->cand, r->dcand, r->logits, r->probs, r->cand_word,
                 r->neg, r->neg_word, r->negx, r->neg_pre, r->neg_norm, r->neg_dpre, r->hard_knn, r->hard_sel,
                 r->hard_keys, r->hidq, r->hidw, r->neg_hid, r->dhid, r->cand_logq, r->pair_share, r->neg_keys,
                 r->negx_shifted, r->batch_vecx, r->batch_keys, r->batch_meta, r->shift};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    w2v_map_free(&r->wmap);
    w2v_map_free(&r->gmap);
    data_idf_free(&r->idf);
    trainer_snapshots_destroy(&r->snaps);
    carls_ckpt_destroy(&r->resume);
    kb_cluster_destroy(&r->kb);
    data_gcide_destroy(&r->g);
}

/* --word-defs: appends to the definition bag, from position at, the words of up to S other training senses
 * of word (not sense s, never a held-out one), chosen at random. Returns how many words. */
static size_t s_add_defs(s_run_t *r, size_t s, uint32_t word, size_t at)
{
    const data_gcide_t *g = r->g;
    const data_text_t *t = g->text;
    size_t pick[1024], n = 0;
    for (size_t o = g->word_first_sense[word]; o < g->word_first_sense[word + 1] && n < 1024; o++)
        if (o != s && !g->senses[o].held_out)
            pick[n++] = o;
    size_t S = (size_t)r->o.word_defs < n ? (size_t)r->o.word_defs : n;
    for (size_t i = 0; i < S; i++) { /* partial Fisher-Yates: the first S are a uniform draw */
        size_t j = i + (size_t)(carls_splitmix64(&r->rng) % (n - i));
        size_t tmp = pick[i];
        pick[i] = pick[j];
        pick[j] = tmp;
    }
    size_t count = 0;
    for (size_t i = 0; i < S; i++) {
        size_t first = t->line_start[pick[i]], end = t->line_start[pick[i] + 1];
        if (end - first > NN_TOWER_DEF_TOKENS)
            end = first + NN_TOWER_DEF_TOKENS;
        if (at + count + (end - first) > r->dbag_cap) {
            r->dbag_cap = 2 * (at + count + (end - first)) + 1024;
            r->dbag_idx = realloc(r->dbag_idx, r->dbag_cap * sizeof(int32_t));
            r->dbag_w = realloc(r->dbag_w, r->dbag_cap * sizeof(float));
            if (!r->dbag_idx || !r->dbag_w)
                CARLS_FATAL("out of memory (definition bags)");
        }
        for (size_t k = first; k < end; k++, count++) {
            const char *w = t->text + t->tok_off[k];
            r->dbag_idx[at + count] = (int32_t)w2v_map_put(&r->wmap, w, t->tok_len[k]);
            r->dbag_w[at + count] = data_idf_weight(&r->idf, w, t->tok_len[k]);
        }
    }
    return count;
}

/* The word-tower side of item b, headword `word`: its row, trigrams and (--word-defs) definitions, never
 * sense s (SIZE_MAX: none left out); the offsets go on from item b - 1's. */
static void s_word_item(s_run_t *r, int b, size_t s, uint32_t word)
{
    const char *hw = r->g->words[word];
    size_t hl = strlen(hw);
    r->hw_word[b] = word;
    r->hw_idx[b] = (int32_t)w2v_map_put(&r->wmap, hw, (uint8_t)hl);
    size_t D_ = (size_t)r->dbag_off[b];
    if (r->o.word_defs > 0)
        D_ += s_add_defs(r, s, word, D_);
    r->dbag_off[b + 1] = (int32_t)D_;
    int G = r->gram_off[b];
    int n = nn_tower_trigrams(hw, hl, r->gram_keys + G, NN_TOWER_MAX_GRAMS);
    for (int i = 0; i < n; i++)
        r->gram_idx[G + i] = (int32_t)w2v_map_put(&r->gmap, r->gram_keys[G + i], 3);
    r->gram_off[b + 1] = G + n;
}

/* Builds the batch of pairs train[from .. from+B-1]: bags of (kept) definition words, headwords, trigrams.
 * Returns the number of distinct word rows; *n_grams gets the trigram rows. */
static void s_build_batch(s_run_t *r, const uint32_t *senses, int B)
{
    const data_text_t *t = r->g->text;
    w2v_map_clear(&r->wmap);
    w2v_map_clear(&r->gmap);
    int L = 0;
    r->bag_off[0] = 0;
    r->dbag_off[0] = 0;
    r->gram_off[0] = 0;
    for (int b = 0; b < B; b++) {
        size_t s = senses[b];
        size_t first = t->line_start[s], end = t->line_start[s + 1];
        if (end - first > TT_MAX_TOKENS)
            end = first + TT_MAX_TOKENS;
        int kept = 0;
        for (size_t k = first; k < end; k++) {
            if (r->o.token_dropout > 0 && carls_unit_double(&r->rng) < r->o.token_dropout)
                continue;
            const char *w = t->text + t->tok_off[k];
            r->bag_idx[L] = (int32_t)w2v_map_put(&r->wmap, w, t->tok_len[k]);
            r->bag_w[L++] = data_idf_weight(&r->idf, w, t->tok_len[k]);
            kept++;
        }
        if (kept == 0) {  /* every word dropped: keep one at random */
            size_t k = first + (size_t)(carls_splitmix64(&r->rng) % (end - first));
            const char *w = t->text + t->tok_off[k];
            r->bag_idx[L] = (int32_t)w2v_map_put(&r->wmap, w, t->tok_len[k]);
            r->bag_w[L++] = data_idf_weight(&r->idf, w, t->tok_len[k]);
        }
        r->bag_off[b + 1] = L;
        s_word_item(r, b, s, r->g->senses[s].word);
    }
}

/* Grows the key array and the word-row buffers to hold n rows. */
static void s_reserve(s_run_t *r, size_t n)
{
    size_t E = (size_t)r->o.E;
    if (n > r->keys_cap) {
        free(r->keys);
        r->keys_cap = 2 * n;
        r->keys = carls_xmalloc(r->keys_cap * sizeof *r->keys);
    }
    if (n > r->word_rows_cap) { /* the rows looked up so far are kept */
        free(r->d_word_rows);
        free(r->d_scratch);
        r->word_rows_cap = 2 * n;
        r->word_rows = carls_xrealloc(r->word_rows, r->word_rows_cap * E * sizeof(float));
        r->d_word_rows = carls_xmalloc(r->word_rows_cap * E * sizeof(float));
        r->d_scratch = r->o.word_defs > 0 ? carls_xmalloc(r->word_rows_cap * E * sizeof(float)) : NULL;
    }
}

static int s_lookup_map(s_run_t *r, const char *table, const w2v_map_t *m, float *rows)
{
    w2v_map_keys(m, r->keys);
    int rc = kb_cluster_lookup(r->kb, table, r->keys, m->n, (uint32_t)r->o.E, rows, NULL);
    if (rc != 0)
        LOG_ERROR("trainer: lookup in %s failed: %s", table, kb_cluster_last_error(r->kb));
    return rc;
}

static int s_push_map(s_run_t *r, const char *table, const w2v_map_t *m, const float *grads)
{
    w2v_map_keys(m, r->keys);
    int rc = kb_cluster_push_gradients(r->kb, table, r->keys, m->n, (uint32_t)r->o.E, grads);
    if (rc != 0)
        LOG_ERROR("trainer: push to %s failed: %s", table, kb_cluster_last_error(r->kb));
    return rc;
}

#define TT_DRIFT_EVERY 50  /* bank fetches between two staleness measurements */
#define TT_DRIFT_SAMPLE 128 /* negatives recomputed per measurement */

/* Measures what the staleness of the negatives just fetched (pooled inputs, NAME.vecx) means: the first few are
 * pooled again from the rows as they are now, exactly as makers pool them, and compared with the makers'
 * (cosine and norm ratio of the inputs, cosine of the word vectors under the current head). Also whether the
 * drift is shared by all words: the inputs' cosine once each side is centred on its own mean (the makers' over
 * every negative held, today's over the sample), and the vectors' cosine once the makers' inputs are moved by
 * the difference of the two means. Diagnostics only: a failure to read the rows skips the measurement. */
static void s_measure_drift(s_run_t *r)
{
    const size_t E = (size_t)r->o.E, D = (size_t)r->o.D;
    size_t n = r->n_uni < TT_DRIFT_SAMPLE ? (size_t)r->n_uni : TT_DRIFT_SAMPLE;
    uint32_t idx[TT_DRIFT_SAMPLE];
    float *x_old = carls_xmalloc((n + 1) * E * sizeof(float));
    size_t m = 0;
    for (size_t j = 0; j < n; j++)
        if (r->neg_word[j] != UINT32_MAX) {
            memcpy(x_old + m * E, r->negx + j * E, E * sizeof(float));
            idx[m++] = r->neg_word[j];
        }
    if (m == 0) {
        free(x_old);
        return;
    }
    float *x_now = carls_xmalloc(m * E * sizeof(float)), *v_now = carls_xmalloc(m * D * sizeof(float));
    float *v_old = carls_xmalloc(m * D * sizeof(float)), *x_shift = carls_xmalloc(m * E * sizeof(float));
    float *pre = carls_xmalloc(m * D * sizeof(float)), *norms = carls_xmalloc(m * sizeof(float));
    float *hid = r->hw.H > 0 ? carls_xmalloc(m * (size_t)r->hw.H * sizeof(float)) : NULL;
    double *mean_old = carls_xcalloc(E, sizeof(double)), *mean_now = carls_xcalloc(E, sizeof(double));
    if (tt_word_towers(r->kb, &r->names, r->g, &r->idf, &r->hw, idx, m, v_now, x_now) == 0) {
        for (size_t j = 0; j < (size_t)r->n_uni; j++)
            for (size_t e = 0; e < E; e++)
                mean_old[e] += r->negx[j * E + e] / (double)r->n_uni;
        for (size_t k = 0; k < m; k++)
            for (size_t e = 0; e < E; e++)
                mean_now[e] += x_now[k * E + e] / (double)m;
        for (size_t k = 0; k < m; k++)
            for (size_t e = 0; e < E; e++)
                x_shift[k * E + e] = (float)(x_old[k * E + e] - mean_old[e] + mean_now[e]);
        nn_tower_head_forward(&r->hw, v_old, pre, norms, hid, x_shift, (int)m);
        for (size_t k = 0; k < m; k++) {
            double vdot = 0;
            for (size_t d = 0; d < D; d++)
                vdot += (double)v_old[k * D + d] * v_now[k * D + d];
            r->drift_vs_cos += vdot;
        }
        nn_tower_head_forward(&r->hw, v_old, pre, norms, hid, x_old, (int)m);
        for (size_t k = 0; k < m; k++) {
            double dot = 0, n_old = 0, n_now = 0, vdot = 0, cdot = 0, c_old = 0, c_now = 0;
            for (size_t e = 0; e < E; e++) {
                double a = x_old[k * E + e], b = x_now[k * E + e];
                double ac = a - mean_old[e], bc = b - mean_now[e];
                dot += a * b;
                n_old += a * a;
                n_now += b * b;
                cdot += ac * bc;
                c_old += ac * ac;
                c_now += bc * bc;
            }
            for (size_t d = 0; d < D; d++)
                vdot += (double)v_old[k * D + d] * v_now[k * D + d];
            r->drift_x_cos += dot / (sqrt(n_old * n_now) + 1e-12);
            r->drift_x_norm += sqrt(n_old / (n_now + 1e-12));
            r->drift_v_cos += vdot;
            r->drift_xc_cos += cdot / (sqrt(c_old * c_now) + 1e-12);
            r->drift_n++;
        }
    }
    void *p[] = {x_now, v_now, x_old, v_old, x_shift, pre, norms, hid, mean_old, mean_now};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

/* Fetches M bank negatives: the rows of M headwords in NAME.vecx (pooled inputs) or NAME.vec (outputs), as
 * makers wrote them from an earlier checkpoint. The headwords are drawn by the bank's uniform sampler over the
 * rows makers wrote, or (--negatives-sampling pairs) are those of M random training pairs, read by key; a
 * headword no maker has written yet is left out. Until makers have written any, there are none: the step uses
 * in-batch negatives only. */
static void s_fetch_negatives(s_run_t *r, uint64_t step)
{
    r->n_uni = 0;
    kb_sample_result_t *sr = NULL;
    uint32_t M = (uint32_t)r->o.negatives;
    const char *table = r->o.negatives_from_inputs ? r->names.vecx : r->names.vec;
    const kb_key_t *keys = r->neg_keys;
    r->neg_fetches++;
    if (r->o.negatives_by_pairs) {
        for (uint32_t j = 0; j < M; j++) {
            uint32_t w = r->g->senses[r->train[carls_splitmix64(&r->rng) % r->n_train]].word;
            r->neg_keys[j] = (kb_key_t){r->g->words[w], strlen(r->g->words[w])};
            r->neg_word[j] = w;
        }
    } else {
        int rc = kb_cluster_sample(r->kb, table, NULL, 0, M, CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM,
                                   carls_splitmix64(&r->rng) | 1, &sr);
        if (rc != 0 || sr->n < M) {
            r->neg_unavailable++;
            LOG_DEBUG("trainer: no bank negatives this step: %s", rc != 0 ? kb_cluster_last_error(r->kb) : "few");
            kb_sample_result_destroy(&sr);
            return;
        }
        keys = sr->keys;
        char word[DATA_GCIDE_MAX_WORD + 1];
        for (uint32_t j = 0; j < M; j++) {
            size_t len = keys[j].len < DATA_GCIDE_MAX_WORD ? keys[j].len : DATA_GCIDE_MAX_WORD;
            memcpy(word, keys[j].data, len);
            word[len] = '\0';
            long w = data_gcide_find(r->g, word);
            r->neg_word[j] = w < 0 ? UINT32_MAX : (uint32_t)w;
        }
    }
    const size_t dim = r->o.negatives_from_inputs ? (size_t)r->o.E : (size_t)r->o.D;
    float *rows = r->o.negatives_from_inputs ? r->negx : r->neg;
    kb_row_meta_t *meta = carls_xmalloc(M * sizeof *meta);
    int rc = kb_cluster_lookup_ex(r->kb, table, keys, M, (uint32_t)dim, true, rows, meta);
    if (rc != 0) {
        r->neg_unavailable++;
        LOG_WARN("trainer: reading bank negatives failed: %s", kb_cluster_last_error(r->kb));
    } else {
        double stale = 0;
        uint32_t n = 0;
        for (uint32_t j = 0; j < M; j++) {
            if (meta[j].version == 0) /* no maker has written it yet */
                continue;
            if (n != j) {
                memmove(rows + n * dim, rows + j * dim, dim * sizeof(float));
                r->neg_word[n] = r->neg_word[j];
            }
            stale += (double)step - (double)meta[j].version;
            n++;
        }
        if (n == 0)
            r->neg_unavailable++;
        r->neg_staleness = n ? stale / n : 0.0;
        r->n_uni = (int)n;
        if (n > 0 && r->o.negatives_from_inputs && r->neg_fetches % TT_DRIFT_EVERY == 1)
            s_measure_drift(r);
    }
    free(meta);
    kb_sample_result_destroy(&sr);
}

size_t tt_hard_select(const uint32_t *knn_words, size_t n_q, size_t k, const uint32_t *pos, size_t n_pos,
                      uint32_t *out, size_t max_out)
{
    size_t n = 0;
    for (size_t slot = 0; slot < k; slot++) /* slot order: every query's nearest first */
        for (size_t q = 0; q < n_q && n < max_out; q++) {
            uint32_t w = knn_words[q * k + slot];
            bool skip = w == UINT32_MAX;
            for (size_t i = 0; i < n_pos && !skip; i++)
                skip = pos[i] == w;
            for (size_t i = 0; i < n && !skip; i++)
                skip = out[i] == w;
            if (!skip)
                out[n++] = w;
        }
    return n;
}

/* Hard negatives: the first --hard-queries queries of the batch (their current vectors, q) ask the bank's knn
 * over NAME.vec (the makers' word vectors) for --hard-k headwords each; the distinct ones that are no positive
 * of the batch get their pooled inputs from NAME.vecx, after the uniform negatives. */
static void s_fetch_hard(s_run_t *r, int B, uint64_t step)
{
    r->n_hard = 0;
    r->n_fresh = 0;
    const size_t nq = (size_t)(r->o.hard_queries < B ? r->o.hard_queries : B), k = (size_t)r->o.hard_k;
    kb_knn_result_t *res = NULL;
    r->hard_fetches++;
    int rc = kb_cluster_knn(r->kb, r->names.vec, r->q, nq, (uint32_t)r->o.D, (uint32_t)k, &res);
    if (rc != 0) {
        r->hard_unavailable++;
        LOG_DEBUG("trainer: no hard negatives this step: %s", kb_cluster_last_error(r->kb));
        return;
    }
    char word[DATA_GCIDE_MAX_WORD + 1];
    for (size_t i = 0; i < nq * k; i++) {
        const kb_key_t *key = i % k < res->k ? &res->keys[(i / k) * res->k + i % k] : NULL;
        long w = -1;
        if (key && key->len > 0 && key->len <= DATA_GCIDE_MAX_WORD) {
            memcpy(word, key->data, key->len);
            word[key->len] = '\0';
            w = data_gcide_find(r->g, word);
        }
        r->hard_knn[i] = w < 0 ? UINT32_MAX : (uint32_t)w;
    }
    kb_knn_result_destroy(&res);
    size_t n = tt_hard_select(r->hard_knn, nq, k, r->hw_word, (size_t)B, r->hard_sel, nq * k);
    if (n == 0) {
        r->hard_unavailable++;
        return;
    }
    if (r->o.hard_fresh) { /* extra word-tower items after the batch's, from their current rows */
        size_t w0 = r->wmap.n, g0 = r->gmap.n, E = (size_t)r->o.E;
        for (size_t j = 0; j < n; j++)
            s_word_item(r, B + (int)j, SIZE_MAX, r->hard_sel[j]);
        s_reserve(r, r->wmap.n > r->gmap.n ? r->wmap.n : r->gmap.n);
        w2v_map_keys(&r->wmap, r->keys);
        rc = kb_cluster_lookup(r->kb, r->names.word, r->keys + w0, r->wmap.n - w0, (uint32_t)E, r->word_rows + w0 * E,
                               NULL);
        if (rc == 0) {
            w2v_map_keys(&r->gmap, r->keys);
            rc = kb_cluster_lookup(r->kb, r->names.gram, r->keys + g0, r->gmap.n - g0, (uint32_t)E,
                                   r->gram_rows + g0 * E, NULL);
        }
        if (rc != 0) { /* the step goes on without them (their keys stay in the maps, unused but pushed 0) */
            r->hard_unavailable++;
            LOG_WARN("trainer: reading the hard negatives' rows failed: %s", kb_cluster_last_error(r->kb));
            return;
        }
        r->n_fresh = (int)n;
        r->hard_n_sum += (double)n;
        return;
    }
    for (size_t j = 0; j < n; j++) {
        const char *w = r->g->words[r->hard_sel[j]];
        r->hard_keys[j] = (kb_key_t){w, strlen(w)};
    }
    const size_t at = (size_t)r->n_uni, E = (size_t)r->o.E;
    kb_row_meta_t *meta = carls_xmalloc(n * sizeof *meta);
    rc = kb_cluster_lookup_ex(r->kb, r->names.vecx, r->hard_keys, n, (uint32_t)E, true, r->negx + at * E, meta);
    if (rc != 0) {
        r->hard_unavailable++;
        LOG_WARN("trainer: reading hard negatives failed: %s", kb_cluster_last_error(r->kb));
    } else {
        double stale = 0;
        for (size_t j = 0; j < n; j++) {
            stale += (double)step - (double)meta[j].version;
            r->neg_word[at + j] = r->hard_sel[j];
        }
        r->hard_staleness = stale / (double)n;
        r->hard_staleness_sum += r->hard_staleness;
        r->hard_n_sum += (double)n;
        r->n_hard = (int)n;
    }
    free(meta);
}

/* --negatives-shift: the makers pooled the negatives' inputs from rows as they were some checkpoints ago, and
 * every row has drifted since, most of it in a direction all rows share, which the head turns into large
 * changes of the vectors (measured: neg_vector_cos against neg_shifted_vector_cos). The drift is measured on
 * the batch's own headwords, whose current inputs (xw) were just pooled: it is the mean of those minus the mean
 * of the same headwords' inputs in NAME.vecx; every negative's input is moved by it. Returns the inputs to use:
 * negx itself when there is nothing to measure against (no row of the batch's headwords written yet). */
static const float *s_shift_negatives(s_run_t *r, int B, bool have_rows)
{
    const size_t E = (size_t)r->o.E;
    if (!r->o.negatives_shift || r->n_neg == 0)
        return r->negx;
    if (!have_rows) {
        r->shift_skipped++;
        return r->negx;
    }
    double *delta = r->shift, norm_sum = 0;
    memset(delta, 0, E * sizeof(double));
    int n = 0;
    for (int b = 0; b < B; b++) {
        if (r->batch_meta[b].version == 0) /* no maker has written it yet */
            continue;
        double sq = 0;
        for (size_t e = 0; e < E; e++) {
            delta[e] += (double)r->xw[(size_t)b * E + e] - (double)r->batch_vecx[(size_t)b * E + e];
            sq += (double)r->xw[(size_t)b * E + e] * r->xw[(size_t)b * E + e];
        }
        norm_sum += sqrt(sq);
        n++;
    }
    if (n == 0) {
        r->shift_skipped++;
        return r->negx;
    }
    double dnorm = 0;
    for (size_t e = 0; e < E; e++) {
        delta[e] /= n;
        dnorm += delta[e] * delta[e];
    }
    r->shift_ratio_sum += sqrt(dnorm) / (norm_sum / n + 1e-12);
    r->shift_n++;
    for (size_t j = 0; j < (size_t)r->n_neg; j++)
        for (size_t e = 0; e < E; e++)
            r->negx_shifted[j * E + e] = r->negx[j * E + e] + (float)delta[e];
    return r->negx_shifted;
}

/* Reads the pooled inputs the makers wrote for the batch's B headwords (batch_vecx, batch_meta: version 0 where
 * none yet). Returns whether they could be read. */
static bool s_read_batch_inputs(s_run_t *r, int B)
{
    for (int b = 0; b < B; b++) {
        const char *w = r->g->words[r->hw_word[b]];
        r->batch_keys[b] = (kb_key_t){w, strlen(w)};
    }
    if (kb_cluster_lookup_ex(r->kb, r->names.vecx, r->batch_keys, (uint32_t)B, (uint32_t)r->o.E, true,
                             r->batch_vecx, r->batch_meta) != 0) {
        LOG_WARN("trainer: reading the batch's pooled inputs from %s failed: %s", r->names.vecx,
                 kb_cluster_last_error(r->kb));
        return false;
    }
    return true;
}

/* --stale-positives P: with probability P, a batch headword's word-tower input becomes the one the makers pooled
 * (when they have). The bag backward does not read the input's values, so the gradient still reaches the rows
 * the current input was pooled from: straight through. */
static void s_stale_positives(s_run_t *r, int B)
{
    const size_t E = (size_t)r->o.E;
    for (int b = 0; b < B; b++) {
        if (r->batch_meta[b].version == 0)
            continue;
        r->stale_pos_of++;
        if ((double)(carls_splitmix64(&r->rng) >> 11) * 0x1p-53 >= (double)r->o.stale_positives)
            continue;
        memcpy(r->xw + (size_t)b * E, r->batch_vecx + (size_t)b * E, E * sizeof(float));
        r->stale_pos_n++;
    }
}

/* One training step over B pairs. Returns the mean loss, or NAN when the bank failed. */
static double s_step(s_run_t *r, const uint32_t *senses, int B, uint64_t step)
{
    const int E = r->o.E, D = r->o.D;
    s_build_batch(r, senses, B);
    s_reserve(r, r->wmap.n > r->gmap.n ? r->wmap.n : r->gmap.n);
    if (s_lookup_map(r, r->names.word, &r->wmap, r->word_rows) != 0 ||
        s_lookup_map(r, r->names.gram, &r->gmap, r->gram_rows) != 0)
        return NAN;
    if (r->o.negatives > 0 && (step % (uint64_t)r->o.negatives_every == 0 || r->n_uni == 0))
        s_fetch_negatives(r, step);
    if (r->n_uni > 0) {
        r->staleness_sum += r->neg_staleness;
        r->staleness_n++;
    }
    /* forward */
    nn_embedding_bag_forward_cpu(r->xq, r->word_rows, r->bag_idx, r->bag_off, r->bag_w, NN_BAG_MEAN, B,
                                 (int)r->wmap.n, E);
    nn_tower_head_forward(&r->hq, r->q, r->preq, r->nq, r->hidq, r->xq, B);
    if (r->o.hard_queries > 0)
        s_fetch_hard(r, B, step); /* near this step's queries */
    r->n_neg = r->n_uni + r->n_hard;
    const int Bw = B + r->n_fresh; /* word-tower items: the positives, then fresh hard negatives */
    const int N = Bw + r->n_neg;
    nn_tower_word_pool(r->xw, r->word_rows, r->hw_idx, r->gram_rows, r->gram_idx, r->gram_off, Bw, E);
    if (r->o.word_defs > 0) {
        nn_embedding_bag_forward_cpu(r->xd, r->word_rows, r->dbag_idx, r->dbag_off, r->dbag_w, NN_BAG_MEAN, Bw,
                                     (int)r->wmap.n, E);
        nn_add_cpu(r->xw, r->xd, 1.0f, Bw * E);
    }
    const bool have_rows = r->batch_vecx != NULL && r->n_neg > 0 && s_read_batch_inputs(r, B);
    if (have_rows && r->o.stale_positives > 0)
        s_stale_positives(r, B);
    nn_tower_head_forward(&r->hw, r->v, r->prew, r->nw, r->hidw, r->xw, Bw);
    memcpy(r->cand, r->v, (size_t)Bw * D * sizeof(float));
    /* Inputs: the makers gathered the rows (the expensive part); the head is this trainer's, as of now. */
    const float *negx = r->negx;
    if (r->n_neg > 0 && r->o.negatives_from_inputs) {
        negx = s_shift_negatives(r, B, have_rows);
        nn_tower_head_forward(&r->hw, r->neg, r->neg_pre, r->neg_norm, r->neg_hid, negx, r->n_neg);
    }
    if (r->n_neg > 0)
        memcpy(r->cand + (size_t)Bw * D, r->neg, (size_t)r->n_neg * D * sizeof(float));
    for (int b = 0; b < Bw; b++)
        r->cand_word[b] = r->hw_word[b];
    for (int j = 0; j < r->n_neg; j++)
        r->cand_word[Bw + j] = r->neg_word[j];
    if (r->o.logq) {
        /* Expected count among this step's candidates: B draws of training pairs and n_uni bank negatives, drawn
         * uniformly over headwords or as pairs. Hard negatives are not drawn at random; they get the same rate as
         * any candidate of their word. */
        const bool pairs = r->o.negatives_by_pairs;
        const double uniform = pairs ? 0.0 : (double)r->n_uni / (double)r->g->n_words;
        const double pair_draws = (double)B + (pairs ? (double)r->n_uni : 0.0);
        for (int j = 0; j < N; j++) {
            uint32_t w = r->cand_word[j];
            double expect = uniform + (w == UINT32_MAX ? 0.0 : pair_draws * r->pair_share[w]);
            r->cand_logq[j] = (float)log(expect > 1e-6 ? expect : 1e-6);
        }
    }
    double loss = nn_tower_infonce(r->dq, r->dcand, r->logits, r->probs, r->q, r->cand, r->cand_word,
                                   r->o.logq ? r->cand_logq : NULL, 1.0f / r->o.temperature, B, N, D);
    memset(r->grads, 0, r->n_params * sizeof(float));
    nn_tower_head_backward(&r->hq, &r->gq, r->dxq, r->dpre, r->dhid, r->dq, r->q, r->nq, r->hidq, r->xq, B);
    nn_tower_head_backward(&r->hw, &r->gw, r->dxw, r->dpre, r->dhid, r->dcand, r->v, r->nw, r->hidw, r->xw, Bw);
    if (r->n_neg > 0 && r->o.negatives_from_inputs) /* the negatives' inputs are constants; the head learns */
        nn_tower_head_backward(&r->hw, &r->gw, NULL, r->neg_dpre, r->dhid, r->dcand + (size_t)Bw * D, r->neg,
                               r->neg_norm, r->neg_hid, negx, r->n_neg);
    nn_embedding_bag_backward_cpu(r->d_word_rows, r->dxq, r->bag_idx, r->bag_off, r->bag_w, NN_BAG_MEAN, B,
                                  (int)r->wmap.n, E);
    if (r->o.word_defs > 0) {
        nn_embedding_bag_backward_cpu(r->d_scratch, r->dxw, r->dbag_idx, r->dbag_off, r->dbag_w, NN_BAG_MEAN, Bw,
                                      (int)r->wmap.n, E);
        nn_add_cpu(r->d_word_rows, r->d_scratch, 1.0f, (int)r->wmap.n * E);
    }
    memset(r->d_gram_rows, 0, (size_t)r->gmap.n * E * sizeof(float));
    nn_tower_word_pool_backward(r->d_word_rows, r->d_gram_rows, r->dxw, r->hw_idx, r->gram_idx, r->gram_off, Bw, E);
    if (s_push_map(r, r->names.word, &r->wmap, r->d_word_rows) != 0 ||
        s_push_map(r, r->names.gram, &r->gmap, r->d_gram_rows) != 0)
        return NAN;
    r->adam_t++;
    nn_adam_update_cpu(r->params, r->grads, r->adam_m, r->adam_v, r->o.lr, 0.9f, 0.999f, 1e-8f, 0.0f, r->adam_t,
                       (int)r->n_params);
    return loss;
}

/* Adds one head's tensors as PREFIX.weight, PREFIX.bias [, PREFIX.hidden.weight, PREFIX.hidden.bias,
 * PREFIX.out.weight]. */
static int s_ckpt_add_head(carls_ckpt_t *ck, const char *prefix, const nn_tower_head_t *h)
{
    int64_t wd[2] = {h->D, h->E}, bd[1] = {h->D}, ud[2] = {h->H, h->E}, cd[1] = {h->H}, vd[2] = {h->D, h->H};
    char n[5][48];
    const char *suffix[5] = {"weight", "bias", "hidden.weight", "hidden.bias", "out.weight"};
    for (int i = 0; i < 5; i++)
        snprintf(n[i], sizeof n[i], "%s.%s", prefix, suffix[i]);
    int rc = carls_ckpt_add(ck, n[0], 2, wd, h->W) || carls_ckpt_add(ck, n[1], 1, bd, h->bias);
    if (rc == 0 && h->H > 0)
        rc = carls_ckpt_add(ck, n[2], 2, ud, h->U) || carls_ckpt_add(ck, n[3], 1, cd, h->c) ||
             carls_ckpt_add(ck, n[4], 2, vd, h->V);
    return rc;
}

/* The settings a resumed run must share with the run it continues (train.config): those that decide the
 * training pairs and their order, the model's shapes, the losses and the optimisers. --epochs and --max-steps
 * only say where to stop. */
static void s_config_text(const s_run_t *r, char *buf, size_t len)
{
    const tt_opts_t *o = &r->o;
    char holdout[1200];
    if (o->holdout_file) {
        snprintf(holdout, sizeof holdout, "file:%s", o->holdout_file);
    } else {
        snprintf(holdout, sizeof holdout, "seed:%llu/%d", (unsigned long long)o->holdout_seed, o->holdout_count);
    }
    snprintf(buf, len,
             "twotower data=%s holdout=%s pairs=%zu/%zu table=%s dim=%d out_dim=%d hidden=%d batch=%d seed=%llu "
             "lr=%.9g emb_lr=%.9g emb_optimizer=%d init_scale=%.9g temperature=%.9g logq=%d token_dropout=%.9g "
             "word_defs=%d kb_negatives=%d every=%d sampling=%s from=%s shift=%d stale_positives=%.9g "
             "hard=%d,%d,%d",
             o->pairs ? o->pairs : "gcide", holdout, r->n_train, r->g->n_senses, o->table, o->E, o->D, o->H, o->batch,
             (unsigned long long)o->seed, (double)o->lr, (double)o->emb_lr, (int)o->emb_opt, (double)o->init_scale,
             (double)o->temperature, o->logq, (double)o->token_dropout, o->word_defs, o->negatives,
             o->negatives_every, o->negatives_by_pairs ? "pairs" : "uniform",
             o->negatives_from_inputs ? "inputs" : "outputs", o->negatives_shift, (double)o->stale_positives,
             o->hard_queries, o->hard_k, o->hard_fresh);
}

static uint64_t s_bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double s_double(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The uniform bank negatives held between fetches (--negatives-every): rows of NAME.vecx or NAME.vec. */
static float *s_neg_rows(const s_run_t *r, size_t *dim)
{
    *dim = r->o.negatives_from_inputs ? (size_t)r->o.E : (size_t)r->o.D;
    return r->o.negatives_from_inputs ? r->negx : r->neg;
}

/* Adds what exact continuation needs besides the heads (trainer_resume.h): train.config, Adam's moments and
 * step, the shuffled training pairs (the position in them is the checkpoint's step), the RNG state, the
 * metrics window, the bank negatives held and the bank snapshot's name (snap, "" for none). 0, or -1 with
 * err. */
static int s_add_state(const s_run_t *r, carls_ckpt_t *c, const char *snap, char *err, size_t errlen)
{
    char config[2048];
    s_config_text(r, config, sizeof config);
    const struct {
        const char *name;
        uint64_t v;
    } nums[] = {{"opt.t", (uint64_t)r->adam_t},      {"data.rng", r->rng},
                {"metrics.loss_n", (uint64_t)r->loss_n}, {"metrics.loss_sum", s_bits(r->loss_sum)},
                {"neg.n", (uint64_t)r->n_uni},       {"neg.staleness", s_bits(r->neg_staleness)},
                {"neg.fetches", r->neg_fetches}};
    int rc = carls_ckpt_add_text(c, TRAINER_CKPT_CONFIG, config) != 0 ? -1 : 0;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0] && rc == 0; i++) {
        rc = carls_ckpt_add_u64(c, nums[i].name, nums[i].v) != 0 ? -1 : 0;
    }
    if (rc == 0 && *snap && carls_ckpt_add_text(c, TRAINER_CKPT_SNAPSHOT, snap) != 0) {
        rc = -1;
    }
    if (rc != 0) {
        return carls_errorf(err, errlen, -1, "cannot add the trainer's state to the checkpoint");
    }
    size_t dim;
    const float *neg = s_neg_rows(r, &dim);
    rc = trainer_ckpt_add_floats(c, "opt.m", r->adam_m, r->n_params, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_floats(c, "opt.v", r->adam_v, r->n_params, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_u32s(c, "data.order", r->train, r->n_train, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_floats(c, "neg.rows", neg, (size_t)r->n_uni * dim, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_u32s(c, "neg.words", r->neg_word, (size_t)r->n_uni, err, errlen);
    return rc;
}

/* The checkpoint of `step` (once per step): with --bank-snapshot the bank's snapshot first (every push of the
 * steps before has been answered, so it holds them all), then the checkpoint naming it, then the snapshot
 * --keep checkpoints back is deleted. Returns 0 or -1 (logged). */
static int s_save_ckpt(s_run_t *r, uint64_t step)
{
    if (step == r->last_ckpt) {
        return 0;
    }
    char err[1024] = "", snap[256] = "";
    if (r->snaps) {
        trainer_snapshot_take(r->snaps, step, snap, sizeof snap);
    }
    carls_ckpt_t *ck = carls_ckpt_new(NN_TOWER_KIND, step);
    int rc = ck ? 0 : -1;
    if (rc == 0)
        rc = s_ckpt_add_head(ck, "query", &r->hq) || s_ckpt_add_head(ck, "word", &r->hw);
    if (rc == 0 && r->o.word_defs > 0) {
        /* Tells makers the word tower pools definitions (they read the hold-out from DIR/holdout.tsv). */
        float defs = (float)r->o.word_defs;
        int64_t one[1] = {1};
        rc = carls_ckpt_add(ck, "word.defs", 1, one, &defs);
    }
    if (rc != 0) {
        snprintf(err, sizeof err, "cannot add the towers' tensors");
    }
    rc = rc ? rc : s_add_state(r, ck, snap, err, sizeof err);
    if (rc != 0) {
        LOG_ERROR("trainer: checkpoint at step %llu failed: %s", (unsigned long long)step, err);
    } else {
        rc = trainer_ckpt_save(ck, r->o.ckpt_dir, r->o.keep);
    }
    carls_ckpt_destroy(&ck);
    if (rc == 0) {
        r->last_ckpt = step;
        if (*snap) {
            trainer_snapshot_prune(r->snaps, step, trainer_ckpt_prev, &r->o.ckpt_every);
        }
    }
    return rc;
}

/* The steps this run trains in all: --epochs passes of whole batches, at most --max-steps. */
static uint64_t s_planned_steps(const s_run_t *r)
{
    uint64_t planned = (uint64_t)r->o.epochs * (uint64_t)(r->n_train / (size_t)r->o.batch);
    if (r->o.max_steps > 0 && (uint64_t)r->o.max_steps < planned)
        planned = (uint64_t)r->o.max_steps;
    return planned;
}

/* --resume, once the data is loaded: reads the checkpoint --ckpt-dir/latest names and checks that it is this
 * run's (train.config) and not beyond its last step; sets r->start. Returns 0, or -1 after printing why. */
static int s_resume_open(s_run_t *r)
{
    char config[2048];
    s_config_text(r, config, sizeof config);
    if (trainer_resume_open(r->o.ckpt_dir, NN_TOWER_KIND, config, &r->resume, r->resume_path,
                            sizeof r->resume_path) != 0) {
        return -1;
    }
    r->start = carls_ckpt_step(r->resume);
    if (r->start > s_planned_steps(r)) {
        fprintf(stderr, "trainer: --resume: %s is at step %llu, beyond this run's %llu steps\n", r->resume_path,
                (unsigned long long)r->start, (unsigned long long)s_planned_steps(r));
        return -1;
    }
    r->last_ckpt = r->start;
    return 0;
}

/* Copies head `which` of checkpoint c into h's parameters (views into r->params), which must have its shape. */
static int s_load_head(const carls_ckpt_t *c, const char *which, const nn_tower_head_t *h, char *err, size_t errlen)
{
    nn_tower_head_t saved;
    if (nn_tower_from_ckpt(c, which, &saved, err, errlen) != 0) {
        return -1;
    }
    if (saved.E != h->E || saved.D != h->D || saved.H != h->H) {
        return carls_errorf(err, errlen, -1, "the %s head is %d -> %d (hidden %d), this run's %d -> %d (hidden %d)",
                            which, saved.E, saved.D, saved.H, h->E, h->D, h->H);
    }
    const size_t E = (size_t)h->E, D = (size_t)h->D, H = (size_t)h->H;
    memcpy((float *)h->W, saved.W, sizeof(float) * D * E);
    memcpy((float *)h->bias, saved.bias, sizeof(float) * D);
    if (H > 0) {
        memcpy((float *)h->U, saved.U, sizeof(float) * H * E);
        memcpy((float *)h->c, saved.c, sizeof(float) * H);
        memcpy((float *)h->V, saved.V, sizeof(float) * D * H);
    }
    return 0;
}

/* --resume, once the buffers exist: the heads, Adam, the pairs' order, the RNG, the metrics window and the
 * bank negatives held. Everything is checked (a checkpoint is untrusted input). Returns 0, or -1 after printing
 * why. */
static int s_resume_apply(s_run_t *r)
{
    const carls_ckpt_t *c = r->resume;
    char err[1024] = "";
    const char *names[] = {"opt.t", "data.rng", "metrics.loss_n", "metrics.loss_sum", "neg.n", "neg.staleness",
                           "neg.fetches"};
    uint64_t v[7] = {0};
    int rc = s_load_head(c, "query", &r->hq, err, sizeof err) || s_load_head(c, "word", &r->hw, err, sizeof err)
                 ? -1
                 : 0;
    for (int i = 0; i < 7 && rc == 0; i++) {
        rc = carls_ckpt_get_u64(c, names[i], &v[i], err, sizeof err) ? -1 : 0;
    }
    if (rc == 0 && (v[0] > (uint64_t)INT32_MAX || v[2] > (uint64_t)INT32_MAX || v[4] > (uint64_t)r->o.negatives)) {
        rc = carls_errorf(err, sizeof err, -1, "out of range: opt.t %llu, metrics.loss_n %llu, neg.n %llu (of %d)",
                          (unsigned long long)v[0], (unsigned long long)v[2], (unsigned long long)v[4],
                          r->o.negatives);
    }
    size_t dim;
    float *neg = s_neg_rows(r, &dim);
    const size_t n_neg = rc == 0 ? (size_t)v[4] : 0;
    rc = rc ? rc : trainer_ckpt_get_floats(c, "opt.m", r->adam_m, r->n_params, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_get_floats(c, "opt.v", r->adam_v, r->n_params, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_get_u32s(c, "data.order", r->train, r->n_train, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_get_floats(c, "neg.rows", neg, n_neg * dim, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_get_u32s(c, "neg.words", r->neg_word, n_neg, err, sizeof err);
    for (size_t i = 0; rc == 0 && i < r->n_train; i++) {
        if (r->train[i] >= r->g->n_senses || r->g->senses[r->train[i]].held_out) {
            rc = carls_errorf(err, sizeof err, -1, "data.order[%zu] = %u is not a training pair of this run", i,
                              r->train[i]);
        }
    }
    for (size_t i = 0; rc == 0 && i < n_neg; i++) {
        if (r->neg_word[i] != UINT32_MAX && r->neg_word[i] >= r->g->n_words) {
            rc = carls_errorf(err, sizeof err, -1, "neg.words[%zu] = %u is not a headword", i, r->neg_word[i]);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "trainer: --resume: %s: %s\n", r->resume_path, err);
        return -1;
    }
    r->adam_t = (int)v[0];
    r->rng = v[1];
    r->loss_n = (int)v[2];
    r->loss_sum = s_double(v[3]);
    r->n_uni = (int)v[4];
    r->neg_staleness = s_double(v[5]);
    r->neg_fetches = v[6];
    const char *snap = carls_ckpt_text(c, TRAINER_CKPT_SNAPSHOT);
    LOG_INFO("trainer: resumed from step %llu (checkpoint %s, snapshot %s)", (unsigned long long)r->start,
             r->resume_path, snap ? snap : "none");
    printf("resumed from step %llu (checkpoint %s, snapshot %s)\n", (unsigned long long)r->start, r->resume_path,
           snap ? snap : "none");
    fflush(stdout);
    return 0;
}

static int s_load_data(s_run_t *r)
{
    char err[512] = "";
    int64_t t0 = carls_monotonic_us();
    if (r->o.pairs ? data_pairs_load(r->o.pairs, &r->g, err, sizeof err) != 0
                   : data_gcide_load(r->o.index_path, r->o.dict_path, &r->g, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s\n", err);
        return -1;
    }
    int rc = r->o.holdout_file ? data_gcide_holdout_file(r->g, r->o.holdout_file, err, sizeof err)
                               : data_gcide_holdout_seed(r->g, r->o.holdout_seed, (size_t)r->o.holdout_count, err,
                                                         sizeof err);
    if (rc != 0) {
        fprintf(stderr, "trainer: hold-out: %s\n", err);
        return -1;
    }
    if (r->o.write_holdout && data_gcide_holdout_write(r->g, r->o.write_holdout) != 0) {
        fprintf(stderr, "trainer: cannot write %s\n", r->o.write_holdout);
        return -1;
    }
    r->train = carls_xmalloc(r->g->n_senses * sizeof(uint32_t));
    for (size_t s = 0; s < r->g->n_senses; s++)
        if (!r->g->senses[s].held_out)
            r->train[r->n_train++] = (uint32_t)s;
    data_gcide_idf_build(&r->idf, r->g);
    LOG_INFO("trainer: %s: %zu headwords, %zu senses, %zu training pairs, %zu held out (%.1f s)",
                   r->o.pairs ? r->o.pairs : "GCIDE", r->g->n_words, r->g->n_senses, r->n_train, r->g->n_held_out,
                   (double)(carls_monotonic_us() - t0) / 1e6);
    return 0;
}

/* Trains; *steps_out gets the steps taken. Returns 0 or -1 (reported). */
static int s_train(s_run_t *r, uint64_t *steps_out, double *steps_per_s)
{
    trainer_metrics_t csv = {0};
    const char *header = "step,epoch,loss,steps_per_s,negatives,neg_staleness_steps";
    /* Resumed: the rows of the steps trained again go, the rest stay. */
    if (r->o.metrics && ((r->o.resume && trainer_metrics_trim(r->o.metrics, r->start) != 0) ||
                         (r->o.resume ? trainer_metrics_append : trainer_metrics_open)(&csv, r->o.metrics, header))) {
        fprintf(stderr, "trainer: cannot write %s\n", r->o.metrics);
        return -1;
    }
    uint64_t step = r->start;
    int64_t t0 = carls_monotonic_us(), tlast = t0;
    int rc = 0;
    /* On a terminal, a progress line over the run (steps/s, time left); the 50-step lines are the log. */
    const int64_t planned = (int64_t)s_planned_steps(r);
    bool done = step >= (uint64_t)planned;
    carls_progress_t bar;
    carls_progress_start_units(&bar, "twotower", planned - (int64_t)step, "steps");
    /* Where step `start` is: the pairs are shuffled at the start of each epoch, so a run resumed at an epoch's
     * first batch shuffles (the saved order of the epoch before) as an uninterrupted one does. */
    const uint64_t per_epoch = r->n_train / (size_t)r->o.batch;
    const int epoch0 = (int)(step / per_epoch);
    const size_t from0 = (size_t)(step % per_epoch) * (size_t)r->o.batch;
    for (int epoch = epoch0; epoch < r->o.epochs && !done; epoch++) {
        if (epoch != epoch0 || from0 == 0)
            carls_shuffle_u32(r->train, r->n_train, &r->rng);
        for (size_t from = epoch == epoch0 ? from0 : 0; from + (size_t)r->o.batch <= r->n_train && !done;
             from += (size_t)r->o.batch) {
            double loss = s_step(r, r->train + from, r->o.batch, step);
            if (isnan(loss)) {
                rc = -1;
                done = true;
                break;
            }
            step++;
            r->loss_sum += loss;
            r->loss_n++;
            if (bar.tty)
                carls_progress_add(&bar, 1);
            if (r->o.ckpt_dir && step % (uint64_t)r->o.ckpt_every == 0 && s_save_ckpt(r, step) != 0) {
                rc = -1;
                done = true;
            }
            if (step % 50 == 0) {
                carls_progress_clear(&bar);
                int64_t now = carls_monotonic_us();
                double sps = 50.0 / ((double)(now - tlast) / 1e6);
                /* bank waits are not measured apart here: they count as work */
                carls_prom_progress_add(trainer_prom, 50, 50 * (uint64_t)r->o.batch, (double)(now - tlast) / 1e6, 0);
                carls_prom_progress_set_step(trainer_prom, (int64_t)step, planned);
                tlast = now;
                double row[6] = {(double)step, (double)epoch + (double)from / (double)r->n_train,
                                 r->loss_sum / r->loss_n,
                                 sps, (double)(r->n_neg + r->n_fresh),
                                 r->n_neg ? (r->n_uni * r->neg_staleness + r->n_hard * r->hard_staleness) / r->n_neg
                                          : NAN};
                if (csv.f)
                    trainer_metrics_row(&csv, row);
                LOG_INFO("trainer: step %llu epoch %d loss %.4f  %.1f steps/s  negatives %d (stale %.0f steps), "
                         "hard %d", (unsigned long long)step, epoch, r->loss_sum / r->loss_n, sps, r->n_uni,
                         r->n_uni ? r->neg_staleness : 0.0, r->n_hard + r->n_fresh);
                r->loss_sum = 0;
                r->loss_n = 0;
            }
            if (r->o.max_steps > 0 && step >= (uint64_t)r->o.max_steps)
                done = true;
        }
    }
    if (bar.tty)
        carls_progress_finish(&bar, NULL);
    if (csv.f)
        trainer_metrics_close(&csv);
    *steps_out = step;
    *steps_per_s = (double)(step - r->start) / ((double)(carls_monotonic_us() - t0) / 1e6 + 1e-9);
    return rc;
}

/* --eval-vectors FILE: scores saved vectors on this hold-out, no training. Returns the exit status. */
static int s_eval_saved(const s_run_t *r)
{
    tt_eval_in_t ev = {
        .g = r->g,
        .word = {.E = r->o.E, .D = r->o.D},
        .fuse_tfidf = r->o.fuse_tfidf,
        .lexical = r->o.lexical,
        .fuse_sweep = r->o.fuse_sweep,
        .n_sweep = r->o.n_sweep,
        .summary = "eval_vectors=1",
    };
    return tt_evaluate_saved(&ev, r->o.eval_vectors) == 0 ? 0 : 1;
}

/* With --ckpt-dir: creates it and writes the hold-out there, since word makers pooling definitions must
 * leave out exactly the senses this trainer holds out. Returns 0 or -1 (reported). */
static int s_prepare_ckpt_dir(const s_run_t *r)
{
    if (!r->o.ckpt_dir) {
        return 0;
    }
    if (carls_mkdir_p(r->o.ckpt_dir, 0755, NULL, 0) != 0) {
        fprintf(stderr, "trainer: cannot create %s\n", r->o.ckpt_dir);
        return -1;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", r->o.ckpt_dir, TT_HOLDOUT_FILE);
    if (data_gcide_holdout_write(r->g, path) != 0) {
        fprintf(stderr, "trainer: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

/* The training half of the result line: steps, bank negatives (staleness, drift, shift), hard negatives. */
static void s_train_summary(const s_run_t *r, uint64_t steps, double sps, char *buf, size_t len)
{
    int n = 0;
    if (r->o.resume) {
        n = snprintf(buf, len, "resumed_from_step=%llu ", (unsigned long long)r->start);
    }
    snprintf(buf + n, len - (size_t)n,
             "train_steps=%llu train_steps_per_s=%.2f kb_negatives=%d neg_staleness_steps=%.1f neg_unavailable=%llu "
             "neg_input_cos=%.4f neg_input_norm_ratio=%.4f neg_vector_cos=%.4f neg_centred_input_cos=%.4f "
             "neg_shifted_vector_cos=%.4f neg_shift_ratio=%.4f neg_shift_skipped=%llu stale_positives_share=%.4f "
             "hard_queries=%d hard_k=%d hard_per_step=%.1f hard_staleness_steps=%.1f hard_unavailable=%llu",
             (unsigned long long)steps, sps, r->o.negatives, r->staleness_n ? r->staleness_sum / r->staleness_n : 0.0,
             (unsigned long long)r->neg_unavailable, r->drift_n ? r->drift_x_cos / (double)r->drift_n : NAN,
             r->drift_n ? r->drift_x_norm / (double)r->drift_n : NAN,
             r->drift_n ? r->drift_v_cos / (double)r->drift_n : NAN,
             r->drift_n ? r->drift_xc_cos / (double)r->drift_n : NAN,
             r->drift_n ? r->drift_vs_cos / (double)r->drift_n : NAN,
             r->shift_n ? r->shift_ratio_sum / (double)r->shift_n : 0.0, (unsigned long long)r->shift_skipped,
             r->stale_pos_of ? (double)r->stale_pos_n / (double)r->stale_pos_of : 0.0, r->o.hard_queries,
             r->o.hard_k, r->hard_fetches ? r->hard_n_sum / (double)r->hard_fetches : 0.0,
             r->hard_n_sum > 0 && r->hard_fetches > r->hard_unavailable
                 ? r->hard_staleness_sum / (double)(r->hard_fetches - r->hard_unavailable)
                 : 0.0,
             (unsigned long long)r->hard_unavailable);
}

/* Evaluates the trained towers on the hold-out (tt_evaluate) and prints the result line. Returns 0 or -1. */
static int s_evaluate_trained(s_run_t *r, uint64_t steps, double sps)
{
    char summary[2048];
    s_train_summary(r, steps, sps, summary, sizeof summary);
    tt_eval_in_t ev = {
        .kb = r->kb,
        .names = &r->names,
        .g = r->g,
        .idf = &r->idf,
        .query = r->hq,
        .word = r->hw,
        .step = steps,
        .vectors_from_trainer = r->o.vectors_from_trainer,
        .wait_fresh_s = r->o.wait_fresh_s,
        .fuse_tfidf = r->o.fuse_tfidf,
        .lexical = r->o.lexical,
        .save_vectors = r->o.save_vectors,
        .fuse_sweep = r->o.fuse_sweep,
        .n_sweep = r->o.n_sweep,
        .knn_check = r->o.knn_check,
        .summary = summary,
    };
    return tt_evaluate(&ev) == 0 ? 0 : -1;
}

/* Load, (evaluate saved vectors and stop, or) set up the bank's tables, train, checkpoint, evaluate. */
static int s_run(s_run_t *r)
{
    if (s_load_data(r) != 0)
        return 1;
    if (r->o.eval_vectors)
        return s_eval_saved(r);
    if (r->n_train < (size_t)r->o.batch) {
        fprintf(stderr, "trainer: %zu training pairs, fewer than one batch of %d\n", r->n_train, r->o.batch);
        return 1;
    }
    if (s_prepare_ckpt_dir(r) != 0)
        return 1;
    kb_client_curve_t keys;
    kb_client_options_t copts = {.timeout_ms = r->o.timeout_ms, .retries = r->o.retries};
    if (kb_curve_args_options(&r->o.curve, "trainer twotower", &keys, &copts) != 0)
        return 1;
    if (r->o.resume && s_resume_open(r) != 0) {
        explicit_bzero(&keys, sizeof keys);
        return 1;
    }
    r->kb = kb_cluster_new(r->o.kb, &copts);
    if (r->kb && r->o.bank_snapshot)
        r->snaps = trainer_snapshots_new(r->o.kb, copts.curve, r->o.bank_snapshot, r->o.keep);
    explicit_bzero(&keys, sizeof keys);
    if (!r->kb || (r->o.bank_snapshot && !r->snaps) || s_create_tables(r->kb, &r->names, &r->o) != 0)
        return 1;
    s_alloc(r);
    if (r->o.resume && s_resume_apply(r) != 0)
        return 1;
    uint64_t steps = 0;
    double sps = 0;
    if (s_train(r, &steps, &sps) != 0)
        return 1;
    LOG_INFO("trainer: trained %llu steps, %.2f steps/s", (unsigned long long)steps, sps);
    if (r->o.ckpt_dir && s_save_ckpt(r, steps) != 0)
        return 1;
    return s_evaluate_trained(r, steps, sps) == 0 ? 0 : 1;
}

int trainer_twotower_main(int argc, char **argv)
{
    s_run_t r = {0};
    int prc = tt_opts_parse(argc, argv, &r.o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    if (tt_names(r.o.table, &r.names) != 0) {
        fprintf(stderr, "trainer: --table: '%s' is not a valid table name\n", r.o.table);
        return 2;
    }
    trainer_setup_threads(0);
    r.rng = r.o.seed * 0x9E3779B97F4A7C15ull + 7;
    r.last_ckpt = UINT64_MAX;
    int status = s_run(&r);
    s_free(&r);
    return status;
}
