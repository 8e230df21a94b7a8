/* trainer twotower: word vectors, query vectors and the held-out evaluation (see trainer_tt.h).
 *
 * The evaluation ranks every held-out definition's headword among all headwords by the cosine of the two
 * towers' outputs. The word-tower outputs are the rows of NAME.vec: written by the makers from the final
 * checkpoint (waited for until every headword's row carries that step) or by this trainer. Ranks are exact
 * (every headword scored here); the bank's knn over the same table answers a sample of the queries too, and
 * the two must agree (reported as knn_agree). */
#include "trainer_rank.h"
#include "trainer_tfidf.h"
#include "trainer_tt.h"
#include "trainer_w2v.h"

#include "bytes.h"
#include "checkpoint.h"
#include "data_gcide_bags.h"

#include "log.h"
#include "nn_ops.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TT_EVAL_CHUNK 512  /* words or queries per bank request */
#define TT_EVAL_KNN_K 100
#define TT_EVAL_MAKER_CHECK 256 /* headwords whose maker-written vector is recomputed here */

/* Reads rows of keys (n) from table without creating any: rows (n, dim). */
static int s_read_rows(kb_cluster_t *kb, const char *table, const kb_key_t *keys, size_t n, int dim, float *rows,
                       kb_row_meta_t *meta)
{
    int rc = kb_cluster_lookup_ex(kb, table, keys, n, (uint32_t)dim, true, rows, meta);
    if (rc != 0)
        LOG_ERROR("trainer: reading %s failed: %s", table, kb_cluster_last_error(kb));
    return rc;
}

/* nn_tower_word_vectors' row fetcher over the bank (ctx: the kb_cluster_t). */
static int s_fetch_rows(void *kb, const char *table, const nn_key_t *keys, size_t n, int dim, float *rows)
{
    return kb_cluster_lookup_ex(kb, table, keys, n, (uint32_t)dim, true, rows, NULL);
}

int tt_query_vectors(kb_cluster_t *kb, const tt_names_t *names, const data_gcide_t *g, const data_idf_t *idf,
                     const nn_tower_head_t *head, const size_t *senses, size_t n, float *q_out)
{
    const int E = head->E, D = head->D;
    const data_text_t *t = g->text;
    size_t L = 0;
    for (size_t i = 0; i < n; i++)
        L += t->line_start[senses[i] + 1] - t->line_start[senses[i]];
    size_t Lc = L < 1 ? 1 : L;
    kb_key_t *keys = carls_xmalloc(Lc * sizeof *keys);
    int32_t *idx = carls_xmalloc(Lc * sizeof(int32_t));
    float *wts = carls_xmalloc(Lc * sizeof(float));
    int32_t *off = carls_xmalloc((TT_EVAL_CHUNK + 1) * sizeof(int32_t));
    float *rows = carls_xmalloc(Lc * E * sizeof(float));
    float *x = carls_xmalloc((size_t)TT_EVAL_CHUNK * E * sizeof(float));
    float *pre = carls_xmalloc((size_t)TT_EVAL_CHUNK * D * sizeof(float));
    float *norms = carls_xmalloc(TT_EVAL_CHUNK * sizeof(float));
    float *hid = head->H > 0 ? carls_xmalloc((size_t)TT_EVAL_CHUNK * head->H * sizeof(float)) : NULL;
    w2v_map_t wmap;
    w2v_map_init(&wmap);
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += TT_EVAL_CHUNK) {
        int B = (int)(n - at < TT_EVAL_CHUNK ? n - at : TT_EVAL_CHUNK);
        w2v_map_clear(&wmap);
        int l = 0;
        off[0] = 0;
        for (int b = 0; b < B; b++) {
            size_t s = senses[at + (size_t)b];
            for (size_t k = t->line_start[s]; k < t->line_start[s + 1]; k++) {
                const char *w = t->text + t->tok_off[k];
                idx[l] = (int32_t)w2v_map_put(&wmap, w, t->tok_len[k]);
                wts[l++] = data_idf_weight(idf, w, t->tok_len[k]);
            }
            off[b + 1] = l;
        }
        w2v_map_keys(&wmap, keys);
        rc = s_read_rows(kb, names->word, keys, wmap.n, E, rows, NULL);
        if (rc != 0)
            break;
        nn_embedding_bag_forward_cpu(x, rows, idx, off, wts, NN_BAG_MEAN, B, (int)wmap.n, E);
        nn_tower_head_forward(head, q_out + at * (size_t)D, pre, norms, hid, x, B);
    }
    w2v_map_free(&wmap);
    void *p[] = {keys, idx, wts, off, rows, x, pre, norms, hid};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    return rc;
}

int tt_word_towers(kb_cluster_t *kb, const tt_names_t *names, const data_gcide_t *g, const data_idf_t *idf,
                   const nn_tower_head_t *head, const uint32_t *idx, size_t n, float *out, float *x_out)
{
    const char **words = carls_xmalloc((n + 1) * sizeof(char *));
    for (size_t i = 0; i < n; i++)
        words[i] = g->words[idx[i]];
    data_gcide_bags_t bags = {0};
    if (head->defs > 0)
        data_gcide_bags_build(&bags, g, idf, idx, n, NN_TOWER_DEF_SENSES, NN_TOWER_DEF_TOKENS);
    nn_tower_bags_t view = {(const char *const *)bags.tok, bags.len, bags.weight, bags.off};
    int rc = nn_tower_word_vectors(s_fetch_rows, kb, names->word, names->gram, words, n,
                                   head->defs > 0 ? &view : NULL, head, out, x_out);
    data_gcide_bags_free(&bags);
    free(words);
    return rc;
}

/* The trainer writes NAME.vec itself from its final parameters. V (n_words, D) gets the vectors. */
static int s_vectors_from_trainer(const tt_eval_in_t *in, float *V)
{
    const data_gcide_t *g = in->g;
    uint32_t *all = carls_xmalloc(g->n_words * sizeof(uint32_t));
    for (size_t w = 0; w < g->n_words; w++)
        all[w] = (uint32_t)w;
    int rc = tt_word_towers(in->kb, in->names, g, in->idf, &in->word, all, g->n_words, V, NULL);
    free(all);
    kb_key_t *keys = carls_xmalloc(TT_EVAL_CHUNK * sizeof *keys);
    for (size_t at = 0; at < g->n_words && rc == 0; at += TT_EVAL_CHUNK) {
        size_t n = g->n_words - at < TT_EVAL_CHUNK ? g->n_words - at : TT_EVAL_CHUNK;
        for (size_t i = 0; i < n; i++)
            keys[i] = (kb_key_t){g->words[at + i], strlen(g->words[at + i])};
        rc = kb_cluster_put(in->kb, in->names->vec, keys, n, (uint32_t)in->word.D, V + at * (size_t)in->word.D,
                            in->step);
        if (rc != 0)
            LOG_ERROR("trainer: writing %s failed: %s", in->names->vec, kb_cluster_last_error(in->kb));
    }
    free(keys);
    return rc;
}

/* Reads every headword's row of NAME.vec; *fresh gets how many carry the step (or a later one). */
static int s_read_vectors(const tt_eval_in_t *in, float *V, size_t *fresh)
{
    const data_gcide_t *g = in->g;
    kb_key_t *keys = carls_xmalloc(TT_EVAL_CHUNK * sizeof *keys);
    kb_row_meta_t *meta = carls_xmalloc(TT_EVAL_CHUNK * sizeof *meta);
    int rc = 0;
    *fresh = 0;
    for (size_t at = 0; at < g->n_words && rc == 0; at += TT_EVAL_CHUNK) {
        size_t n = g->n_words - at < TT_EVAL_CHUNK ? g->n_words - at : TT_EVAL_CHUNK;
        for (size_t i = 0; i < n; i++)
            keys[i] = (kb_key_t){g->words[at + i], strlen(g->words[at + i])};
        rc = s_read_rows(in->kb, in->names->vec, keys, n, in->word.D, V + at * (size_t)in->word.D, meta);
        for (size_t i = 0; i < n && rc == 0; i++)
            *fresh += meta[i].version >= in->step;
    }
    free(keys);
    free(meta);
    return rc;
}

/* Waits until the makers have written every headword's vector from the final checkpoint. */
static int s_vectors_from_makers(const tt_eval_in_t *in, float *V)
{
    int64_t t0 = carls_monotonic_us(), last_log = t0;
    for (;;) {
        size_t fresh = 0;
        if (s_read_vectors(in, V, &fresh) != 0)
            return -1;
        double waited = (double)(carls_monotonic_us() - t0) / 1e6;
        if (fresh == in->g->n_words) {
            LOG_INFO("trainer: every word vector is from step %llu (waited %.1f s for the makers)",
                           (unsigned long long)in->step, waited);
            return 0;
        }
        if (waited > in->wait_fresh_s) {
            LOG_ERROR("trainer: after %.0f s only %zu of %zu word vectors in %s are from step %llu: are the "
                            "makers (kb-maker --task words) running?",
                            waited, fresh, in->g->n_words, in->names->vec, (unsigned long long)in->step);
            return -1;
        }
        if (carls_monotonic_us() - last_log > 10 * 1000000) {
            LOG_INFO("trainer: waiting for the makers: %zu of %zu word vectors from step %llu", fresh,
                           in->g->n_words, (unsigned long long)in->step);
            last_log = carls_monotonic_us();
        }
        struct timespec ts = {0, 500 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The makers' vectors (V) of TT_EVAL_MAKER_CHECK headwords spread over the list, recomputed here with this
 * trainer's final word head from the same (final) rows: the largest difference of any component, or -1 when the
 * rows cannot be read. A maker that read the checkpoint wrongly (an MLP head taken for a linear one, say)
 * shows here rather than only as a lower score. */
static double s_maker_check(const tt_eval_in_t *in, const float *V)
{
    const data_gcide_t *g = in->g;
    const int D = in->word.D;
    size_t n = g->n_words < TT_EVAL_MAKER_CHECK ? g->n_words : TT_EVAL_MAKER_CHECK;
    uint32_t *idx = carls_xmalloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)(i * g->n_words / n);
    float *mine = carls_xmalloc(n * (size_t)D * sizeof(float));
    double worst = -1;
    if (tt_word_towers(in->kb, in->names, g, in->idf, &in->word, idx, n, mine, NULL) == 0) {
        worst = 0;
        for (size_t i = 0; i < n; i++)
            for (int d = 0; d < D; d++)
                worst = fmax(worst, fabs((double)mine[i * (size_t)D + (size_t)d] -
                                         (double)V[(size_t)idx[i] * (size_t)D + (size_t)d]));
    } else {
        LOG_ERROR("trainer: reading rows to check the makers' vectors failed: %s", kb_cluster_last_error(in->kb));
    }
    free(idx);
    free(mine);
    return worst;
}

/* Asks the bank's knn for the top 100 of the first n queries; counts the queries where it and the exact
 * ranking agree on whether the headword is in the top 100. */
static int s_knn_check(const tt_eval_in_t *in, const float *Q, const size_t *senses, const uint32_t *ranks, size_t n,
                       size_t *agree, size_t *in_top)
{
    kb_knn_result_t *res = NULL;
    int rc = kb_cluster_knn(in->kb, in->names->vec, Q, n, (uint32_t)in->word.D, TT_EVAL_KNN_K, &res);
    if (rc != 0) {
        LOG_ERROR("trainer: knn on %s failed: %s", in->names->vec, kb_cluster_last_error(in->kb));
        return rc;
    }
    *agree = *in_top = 0;
    for (size_t i = 0; i < n; i++) {
        const char *truth = in->g->words[in->g->senses[senses[i]].word];
        size_t tl = strlen(truth);
        bool found = false;
        for (uint32_t k = 0; k < res->k && !found; k++) {
            const kb_key_t *key = &res->keys[i * res->k + k];
            found = key->len == tl && memcmp(key->data, truth, tl) == 0;
        }
        *in_top += found;
        *agree += found == (ranks[i] <= TT_EVAL_KNN_K);
    }
    kb_knn_result_destroy(&res);
    return 0;
}

/* The held-out senses, in sense order; returns their count. */
static size_t s_held(const data_gcide_t *g, size_t **out)
{
    size_t *held = carls_xmalloc((g->n_held_out + 1) * sizeof(size_t)), H = 0;
    for (size_t s = 0; s < g->n_senses; s++)
        if (g->senses[s].held_out)
            held[H++] = s;
    *out = held;
    return H;
}

/* The vectors file is a checkpoint (base/checkpoint.h: versioned, CRC-32, little-endian, written atomically)
 * of kind TT_VEC_KIND: tensors "queries" (H, D) and "words" (W, D), and the held-out sense indices as blob
 * "held" (H little-endian uint64), so a file written for another hold-out is refused. */
#define TT_VEC_KIND "twotower-vectors"

static int s_save_vectors(const char *path, const size_t *held, size_t H, size_t W, int D, uint64_t step,
                          const float *Q, const float *V)
{
    carls_ckpt_t *ck = carls_ckpt_new(TT_VEC_KIND, step);
    uint8_t *held_le = carls_xmalloc((H + 1) * 8);
    for (size_t i = 0; i < H; i++)
        carls_put_le64(held_le + i * 8, held[i]);
    int64_t qdims[2] = {(int64_t)H, D}, wdims[2] = {(int64_t)W, D};
    char err[512] = "";
    int rc = H > 0 ? carls_ckpt_add(ck, "queries", 2, qdims, Q) : 0;
    if (rc == 0)
        rc = carls_ckpt_add(ck, "words", 2, wdims, V);
    if (rc == 0 && H > 0)
        rc = carls_ckpt_add_blob(ck, "held", held_le, H * 8);
    if (rc == 0)
        rc = carls_ckpt_write(ck, path, err, sizeof err);
    else
        snprintf(err, sizeof err, "%s", carls_ckpt_strerror(rc));
    if (rc != 0)
        LOG_ERROR("trainer: writing the vectors file %s failed: %s", path, err);
    free(held_le);
    carls_ckpt_destroy(&ck);
    return rc == 0 ? 0 : -1;
}

/* Ranks the H held-out definitions (query vectors Q) against every headword (V), alone and fused with the
 * lexical score, and prints the results; the last line is the key=value result. */
static int s_rank_and_report(const tt_eval_in_t *in, const float *Q, const float *V, const size_t *held, size_t H,
                             int64_t t0, double maker_diff)
{
    const data_gcide_t *g = in->g;
    const size_t W = g->n_words;
    const int D = in->word.D;
    float *scores = carls_xmalloc((size_t)TT_EVAL_CHUNK * W * sizeof(float));
    const bool need_tf = in->fuse_tfidf > 0 || in->n_sweep > 0;
    float *tf = need_tf ? carls_xmalloc(W * sizeof(float)) : NULL;
    float *model = in->n_sweep > 0 ? carls_xmalloc(W * sizeof(float)) : NULL;
    uint32_t *swept = carls_xmalloc(((size_t)in->n_sweep * H + 1) * sizeof(uint32_t));
    uint32_t *ranks = carls_xmalloc((H + 1) * sizeof(uint32_t));
    uint32_t *fused = carls_xmalloc((H + 1) * sizeof(uint32_t));
    uint32_t *lex = carls_xmalloc((H + 1) * sizeof(uint32_t));
    tfidf_t *tfidf = NULL;
    int status = -1;
    if (tf && tfidf_build_ex(g, &in->lexical, &tfidf) != 0) {
        fprintf(stderr, "trainer: cannot build the lexical index\n");
        goto out;
    }
    for (size_t at = 0; at < H; at += TT_EVAL_CHUNK) {
        int n = (int)(H - at < TT_EVAL_CHUNK ? H - at : TT_EVAL_CHUNK);
        nn_linear_forward_cpu(scores, Q + at * (size_t)D, V, NULL, n, D, (int)W);
        for (int i = 0; i < n; i++) {
            float *row = scores + (size_t)i * W;
            size_t truth = g->senses[held[at + (size_t)i]].word;
            ranks[at + (size_t)i] = rank_of_truth(row, W, truth);
            if (tf) {
                tfidf_scores(tfidf, g, held[at + (size_t)i], tf);
                lex[at + (size_t)i] = rank_of_truth(tf, W, truth);
            }
            for (int k = 0; k < in->n_sweep; k++) {
                for (size_t w = 0; w < W; w++)
                    model[w] = row[w] + in->fuse_sweep[k] * tf[w];
                swept[(size_t)k * H + at + (size_t)i] = rank_of_truth(model, W, truth);
            }
            if (in->fuse_tfidf > 0) {
                for (size_t w = 0; w < W; w++)
                    row[w] += in->fuse_tfidf * tf[w];
                fused[at + (size_t)i] = rank_of_truth(row, W, truth);
            }
        }
    }
    rank_metrics_t m;
    rank_metrics(ranks, H, &m);
    size_t agree = 0, in_top = 0, n_check = in->knn_check < 0 || !in->kb ? 0 : (size_t)in->knn_check;
    if (n_check > H)
        n_check = H;
    /* The bank's knn knows only the cosine: compared with the model-only ranks. */
    if (n_check > 0 && s_knn_check(in, Q, held, ranks, n_check, &agree, &in_top) != 0)
        goto out;
    LOG_INFO("trainer: evaluated %zu held-out definitions against %zu headwords in %.1f s", H, W,
                   (double)(carls_monotonic_us() - t0) / 1e6);
    const char *lex_name = in->lexical.scheme == TFIDF_BM25 ? "bm25" : "tfidf";
    if (tf) {
        rank_metrics_t lm;
        rank_metrics(lex, H, &lm);
        printf("lexical: %s k1=%g b=%g r1=%.4f r10=%.4f r100=%.4f median_rank=%.1f mrr=%.4f\n", lex_name,
               (double)in->lexical.k1, (double)in->lexical.b, lm.r1, lm.r10, lm.r100, lm.median_rank, lm.mrr);
    }
    for (int k = 0; k < in->n_sweep; k++) {
        rank_metrics_t sm;
        rank_metrics(swept + (size_t)k * H, H, &sm);
        printf("fuse_sweep: lexical=%s lambda=%g r1=%.4f r10=%.4f r100=%.4f median_rank=%.1f mrr=%.4f\n", lex_name,
               (double)in->fuse_sweep[k], sm.r1, sm.r10, sm.r100, sm.median_rank, sm.mrr);
    }
    if (n_check > 0)
        printf("knn_check: the bank's knn top-%d holds the headword for %zu of %zu queries; agrees with the exact "
               "ranking on %zu\n",
               TT_EVAL_KNN_K, in_top, n_check, agree);
    printf("%s ", in->summary ? in->summary : "");
    if (n_check > 0)
        printf("knn_agree=%.4f ", (double)agree / (double)n_check);
    if (!isnan(maker_diff))
        printf("maker_max_diff=%.3g ", maker_diff);
    if (in->fuse_tfidf > 0) {
        rank_metrics_t fm;
        rank_metrics(fused, H, &fm);
        printf("fuse_tfidf=%g lexical=%s fused_r1=%.4f fused_r10=%.4f fused_r100=%.4f fused_median_rank=%.1f "
               "fused_mrr=%.4f ",
               (double)in->fuse_tfidf, lex_name, fm.r1, fm.r10, fm.r100, fm.median_rank, fm.mrr);
    }
    rank_metrics_print(stdout, NULL, &m);
    fflush(stdout);
    status = 0;
out:
    tfidf_destroy(&tfidf);
    free(scores);
    free(tf);
    free(ranks);
    free(fused);
    free(lex);
    free(model);
    free(swept);
    return status;
}

int tt_evaluate(const tt_eval_in_t *in)
{
    const data_gcide_t *g = in->g;
    const size_t W = g->n_words;
    const int D = in->word.D;
    int64_t t0 = carls_monotonic_us();
    float *V = carls_xmalloc(W * (size_t)D * sizeof(float));
    size_t *held = NULL;
    size_t H = s_held(g, &held);
    float *Q = carls_xmalloc((H + 1) * (size_t)D * sizeof(float));
    int status = -1;
    if (H == 0) {
        fprintf(stderr, "trainer: nothing is held out\n");
        goto out;
    }
    int rc = in->vectors_from_trainer ? s_vectors_from_trainer(in, V) : s_vectors_from_makers(in, V);
    if (rc != 0)
        goto out;
    double maker_diff = in->vectors_from_trainer ? NAN : s_maker_check(in, V);
    if (tt_query_vectors(in->kb, in->names, g, in->idf, &in->query, held, H, Q) != 0)
        goto out;
    if (in->save_vectors && s_save_vectors(in->save_vectors, held, H, W, D, in->step, Q, V) != 0)
        goto out;
    status = s_rank_and_report(in, Q, V, held, H, t0, maker_diff);
out:
    free(V);
    free(held);
    free(Q);
    return status;
}

int tt_evaluate_saved(const tt_eval_in_t *in, const char *path)
{
    const data_gcide_t *g = in->g;
    const size_t W = g->n_words;
    const int D = in->word.D;
    int64_t t0 = carls_monotonic_us();
    size_t *held = NULL;
    size_t H = s_held(g, &held);
    float *Q = NULL, *V = NULL;
    int status = -1;
    carls_ckpt_t *ck = NULL;
    char err[512];
    if (carls_ckpt_read(path, &ck, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s is not a vectors file (--save-vectors): %s\n", path, err);
        goto out;
    }
    const carls_ckpt_tensor_t *q = carls_ckpt_find(ck, "queries"), *w = carls_ckpt_find(ck, "words");
    size_t held_len = 0;
    const uint8_t *held_le = carls_ckpt_blob(ck, "held", &held_len);
    if (strcmp(carls_ckpt_kind(ck), TT_VEC_KIND) != 0 || !w || w->ndim != 2 || (q && q->ndim != 2)) {
        fprintf(stderr, "trainer: %s is a checkpoint of kind '%s', not a vectors file (--save-vectors)\n", path,
                carls_ckpt_kind(ck));
        goto out;
    }
    size_t fh = q ? (size_t)q->dims[0] : 0;
    if (fh != H || (size_t)w->dims[0] != W || w->dims[1] != D || (q && q->dims[1] != D)) {
        fprintf(stderr, "trainer: %s holds %zu queries, %lld words of dim %lld; this run has %zu, %zu, %d\n", path,
                fh, (long long)w->dims[0], (long long)w->dims[1], H, W, D);
        goto out;
    }
    if (held_len != H * 8 || (H > 0 && !held_le)) {
        fprintf(stderr, "trainer: %s has %zu bytes of held-out senses, expected %zu\n", path, held_len, H * 8);
        goto out;
    }
    for (size_t i = 0; i < H; i++) {
        if (carls_get_le64(held_le + i * 8) != held[i]) {
            fprintf(stderr, "trainer: %s was written for another hold-out (held-out sense %zu differs)\n", path, i);
            goto out;
        }
    }
    Q = carls_xmalloc((H + 1) * (size_t)D * sizeof(float));
    V = carls_xmalloc(W * (size_t)D * sizeof(float));
    if (H > 0)
        memcpy(Q, q->data, H * (size_t)D * sizeof(float));
    memcpy(V, w->data, W * (size_t)D * sizeof(float));
    status = s_rank_and_report(in, Q, V, held, H, t0, NAN);
out:
    carls_ckpt_destroy(&ck);
    free(held);
    free(Q);
    free(V);
    return status;
}
