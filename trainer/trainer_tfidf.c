/* TF-IDF baseline (see trainer_tfidf.h). */
#include "trainer_tfidf.h"

#include "util.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define NO_TERM UINT32_MAX

struct tfidf {
    tfidf_opts_t opts;
    size_t n_docs;        /* g->n_words */
    size_t n_terms;
    char *bytes;          /* term spellings, back to back */
    size_t bytes_len, bytes_cap;
    uint32_t *term_off;   /* (n_terms) where each term's bytes start in bytes */
    uint8_t *term_len;    /* (n_terms) */
    size_t terms_cap;
    uint32_t *slots;      /* (slot_mask + 1) open addressing: term id + 1, 0 = empty */
    size_t slot_mask;
    float *idf;           /* (n_terms) ln(N / df), or BM25's ln(1 + (N - df + 0.5) / (df + 0.5)) */
    size_t *post_start;   /* (n_terms + 1) postings of term t are [post_start[t], post_start[t + 1]) */
    uint32_t *post_doc;   /* (n_postings) document (headword) of each posting, increasing within a term */
    float *post_w;        /* (n_postings) its normalised weight */
};

/* ---- term table ---- */

static size_t s_slot(const tfidf_t *t, const char *w, size_t len)
{
    size_t i = (size_t)carls_hash64(w, len, 0) & t->slot_mask;
    for (;;) {
        uint32_t id = t->slots[i];
        if (id == 0 || (t->term_len[id - 1] == len && memcmp(t->bytes + t->term_off[id - 1], w, len) == 0))
            return i;
        i = (i + 1) & t->slot_mask;
    }
}

static uint32_t s_find(const tfidf_t *t, const char *w, size_t len)
{
    uint32_t id = t->slots[s_slot(t, w, len)];
    return id ? id - 1 : NO_TERM;
}

static void s_rehash(tfidf_t *t)
{
    free(t->slots);
    t->slot_mask = t->slot_mask ? t->slot_mask * 2 + 1 : 1023;
    t->slots = carls_xcalloc(t->slot_mask + 1, sizeof *t->slots);
    for (size_t id = 0; id < t->n_terms; id++)
        t->slots[s_slot(t, t->bytes + t->term_off[id], t->term_len[id])] = (uint32_t)id + 1;
}

static uint32_t s_intern(tfidf_t *t, const char *w, size_t len)
{
    if (2 * (t->n_terms + 1) > t->slot_mask + 1)
        s_rehash(t); /* keep the table at most half full */
    size_t slot = s_slot(t, w, len);
    if (t->slots[slot])
        return t->slots[slot] - 1;
    if (t->n_terms == t->terms_cap) { /* term_off and term_len share the count */
        t->terms_cap = carls_grow_cap(t->terms_cap, t->n_terms + 1, sizeof *t->term_off);
        t->term_off = carls_xrealloc(t->term_off, t->terms_cap * sizeof *t->term_off);
        t->term_len = carls_xrealloc(t->term_len, t->terms_cap * sizeof *t->term_len);
    }
    t->bytes = carls_grow(t->bytes, &t->bytes_cap, t->bytes_len + len, 1);
    memcpy(t->bytes + t->bytes_len, w, len);
    t->term_off[t->n_terms] = (uint32_t)t->bytes_len;
    t->term_len[t->n_terms] = (uint8_t)len;
    t->bytes_len += len;
    t->slots[slot] = (uint32_t)++t->n_terms;
    return (uint32_t)t->n_terms - 1;
}

static int s_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- building ---- */

/* (document, term, weight) triples, appended document by document. */
typedef struct {
    uint32_t *doc, *term;
    float *w; /* term frequency until the weights are computed */
    size_t n, cap;
} s_triples_t;

static void s_triple_add(s_triples_t *tr, uint32_t doc, uint32_t term, float tf)
{
    if (tr->n == tr->cap) { /* doc, term and w share the count */
        tr->cap = carls_grow_cap(tr->cap, tr->n + 1, sizeof *tr->doc);
        tr->doc = carls_xrealloc(tr->doc, tr->cap * sizeof *tr->doc);
        tr->term = carls_xrealloc(tr->term, tr->cap * sizeof *tr->term);
        tr->w = carls_xrealloc(tr->w, tr->cap * sizeof *tr->w);
    }
    tr->doc[tr->n] = doc;
    tr->term[tr->n] = term;
    tr->w[tr->n] = tf;
    tr->n++;
}

/* Interns the tokens of word w's training senses and appends one triple per distinct term. */
static void s_add_document(tfidf_t *t, const data_gcide_t *g, size_t w, s_triples_t *tr, uint32_t **ids,
                           size_t *ids_cap)
{
    size_t n = 0;
    for (size_t s = g->word_first_sense[w]; s < g->word_first_sense[w + 1]; s++) {
        if (g->senses[s].held_out)
            continue;
        for (size_t k = g->text->line_start[s]; k < g->text->line_start[s + 1]; k++) {
            *ids = carls_grow(*ids, ids_cap, n + 1, sizeof **ids);
            (*ids)[n++] = s_intern(t, data_text_token(g->text, k), g->text->tok_len[k]);
        }
    }
    if (n > 1) /* a document without a training sense (a pairs data set's candidate) has none */
        qsort(*ids, n, sizeof **ids, s_cmp_u32);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && (*ids)[j] == (*ids)[i])
            j++;
        s_triple_add(tr, (uint32_t)w, (*ids)[i], (float)(j - i));
        i = j;
    }
}

/* Turns the triples' term frequencies into weights (triples of a document are contiguous): cosine: the
 * L2-normalised (1 + ln tf) * idf; BM25: idf * tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl)). */
static void s_weigh(tfidf_t *t, s_triples_t *tr)
{
    const bool bm25 = t->opts.scheme == TFIDF_BM25;
    const double k1 = t->opts.k1, b = t->opts.b;
    size_t *df = carls_xcalloc(t->n_terms, sizeof *df);
    double total = 0;
    for (size_t i = 0; i < tr->n; i++) {
        df[tr->term[i]]++;
        total += tr->w[i];
    }
    const double N = (double)t->n_docs, avgdl = N > 0 && total > 0 ? total / N : 1;
    t->idf = carls_xmalloc((t->n_terms ? t->n_terms : 1) * sizeof *t->idf);
    for (size_t id = 0; id < t->n_terms; id++)
        t->idf[id] = bm25 ? (float)log(1.0 + (N - (double)df[id] + 0.5) / ((double)df[id] + 0.5))
                          : (float)log(N / (double)df[id]);
    free(df);
    for (size_t i = 0; i < tr->n;) {
        size_t j = i;
        double norm = 0, dl = 0;
        for (; j < tr->n && tr->doc[j] == tr->doc[i]; j++)
            dl += tr->w[j];
        for (size_t k = i; k < j; k++) {
            double tf = tr->w[k];
            tr->w[k] = bm25 ? (float)(t->idf[tr->term[k]] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)))
                            : (1.0f + logf((float)tf)) * t->idf[tr->term[k]];
            norm += (double)tr->w[k] * tr->w[k];
        }
        float inv = bm25 ? 1.0f : norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        for (size_t k = i; k < j; k++)
            tr->w[k] *= inv;
        i = j;
    }
}

/* Sorts the triples into posting lists by term (a counting sort keeps each list in document order). */
static void s_invert(tfidf_t *t, const s_triples_t *tr)
{
    t->post_start = carls_xcalloc(t->n_terms + 1, sizeof *t->post_start);
    for (size_t i = 0; i < tr->n; i++)
        t->post_start[tr->term[i] + 1]++;
    for (size_t id = 0; id < t->n_terms; id++)
        t->post_start[id + 1] += t->post_start[id];
    size_t *fill = carls_xmalloc((t->n_terms + 1) * sizeof *fill);
    memcpy(fill, t->post_start, (t->n_terms + 1) * sizeof *fill);
    t->post_doc = carls_xmalloc((tr->n ? tr->n : 1) * sizeof *t->post_doc);
    t->post_w = carls_xmalloc((tr->n ? tr->n : 1) * sizeof *t->post_w);
    for (size_t i = 0; i < tr->n; i++) {
        size_t p = fill[tr->term[i]]++;
        t->post_doc[p] = tr->doc[i];
        t->post_w[p] = tr->w[i];
    }
    free(fill);
}

int tfidf_build(const data_gcide_t *g, tfidf_t **out)
{
    const tfidf_opts_t cosine = {.scheme = TFIDF_COSINE};
    return tfidf_build_ex(g, &cosine, out);
}

int tfidf_build_ex(const data_gcide_t *g, const tfidf_opts_t *opts, tfidf_t **out)
{
    tfidf_t *t = carls_xcalloc(1, sizeof *t);
    t->opts = *opts;
    t->n_docs = g->n_words;
    s_rehash(t);
    s_triples_t tr = {0};
    uint32_t *ids = NULL;
    size_t ids_cap = 0;
    for (size_t w = 0; w < g->n_words; w++)
        s_add_document(t, g, w, &tr, &ids, &ids_cap);
    free(ids);
    s_weigh(t, &tr);
    s_invert(t, &tr);
    free(tr.doc);
    free(tr.term);
    free(tr.w);
    *out = t;
    return 0;
}

/* ---- scoring ---- */

void tfidf_scores(const tfidf_t *t, const data_gcide_t *g, size_t sense, float *scores)
{
    assert(t->n_docs == g->n_words && sense < g->n_senses);
    memset(scores, 0, g->n_words * sizeof *scores);
    size_t first = g->text->line_start[sense], n = g->text->line_start[sense + 1] - first, m = 0;
    uint32_t *ids = carls_xmalloc((n ? n : 1) * sizeof *ids);
    for (size_t k = 0; k < n; k++) {
        uint32_t id = s_find(t, data_text_token(g->text, first + k), g->text->tok_len[first + k]);
        if (id != NO_TERM)
            ids[m++] = id;
    }
    qsort(ids, m, sizeof *ids, s_cmp_u32);
    /* Query weights, one per distinct term (stored at the run's start), then their norm; BM25 counts each
     * distinct query term once. */
    const bool bm25 = t->opts.scheme == TFIDF_BM25;
    float *qw = carls_xmalloc((m ? m : 1) * sizeof *qw);
    double norm = 0;
    size_t d = 0;
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && ids[j] == ids[i])
            j++;
        ids[d] = ids[i];
        qw[d] = bm25 ? 1.0f : (1.0f + logf((float)(j - i))) * t->idf[ids[i]];
        norm += (double)qw[d] * qw[d];
        d++;
        i = j;
    }
    float inv = bm25 ? 1.0f : norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
    for (size_t i = 0; i < d && norm > 0; i++) {
        float q = qw[i] * inv;
        for (size_t p = t->post_start[ids[i]]; p < t->post_start[ids[i] + 1]; p++)
            scores[t->post_doc[p]] += q * t->post_w[p];
    }
    if (bm25) { /* scaled so the best document scores 1 */
        float best = 0;
        for (size_t w = 0; w < g->n_words; w++)
            best = scores[w] > best ? scores[w] : best;
        for (size_t w = 0; w < g->n_words && best > 0; w++)
            scores[w] /= best;
    }
    free(qw);
    free(ids);
}

size_t tfidf_n_terms(const tfidf_t *t)
{
    return t->n_terms;
}

void tfidf_destroy(tfidf_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tfidf_t *t = *self_p;
    free(t->bytes);
    free(t->term_off);
    free(t->term_len);
    free(t->slots);
    free(t->idf);
    free(t->post_start);
    free(t->post_doc);
    free(t->post_w);
    free(t);
    *self_p = NULL;
}
