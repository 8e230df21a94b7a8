/* Vector files in word2vec's text format and checks of embedding quality that need no outside data
 * (trainer w2v-eval; see trainer_w2v.h). The same code scores this project's vectors and fastText's .vec
 * files, so the two are compared on equal terms.
 *
 * File format (word2vec, fastText .vec): a header line "COUNT DIM", then COUNT lines "WORD V1 ... VDIM"
 * separated by single spaces (a trailing space is allowed). */
#include "trainer.h"
#include "trainer_util.h"
#include "trainer_w2v.h"

#include "carls_args.h"
#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void w2v_vectors_destroy(w2v_vectors_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    w2v_vectors_t *v = *self_p;
    for (uint32_t i = 0; i < v->n; i++)
        free(v->words[i]);
    free(v->words);
    free(v->vec);
    free(v->map_row);
    w2v_map_free(&v->map);
    free(v);
    *self_p = NULL;
}

int w2v_vectors_read(const char *path, w2v_vectors_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, -1, "cannot open %s: %s", path, strerror(errno));
    unsigned long n = 0, dim = 0;
    if (fscanf(f, "%lu %lu", &n, &dim) != 2 || dim == 0 || dim > 4096 || n > 100000000UL) {
        fclose(f);
        return carls_errorf(err, errlen, -1, "%s: the first line is not 'COUNT DIM'", path);
    }
    w2v_vectors_t *v = carls_xcalloc(1, sizeof *v);
    v->dim = (uint32_t)dim;
    v->words = carls_xcalloc(n ? n : 1, sizeof *v->words);
    v->vec = carls_xmalloc((n ? n : 1) * dim * sizeof(float));
    w2v_map_init(&v->map);
    char word[1024];
    for (unsigned long i = 0; i < n; i++) {
        if (fscanf(f, "%1023s", word) != 1) {
            fclose(f);
            w2v_vectors_destroy(&v);
            return carls_errorf(err, errlen, -1, "%s: %lu vectors announced, %lu found", path, n, i);
        }
        for (unsigned long d = 0; d < dim; d++) {
            if (fscanf(f, "%f", &v->vec[i * dim + d]) != 1) {
                fclose(f);
                w2v_vectors_destroy(&v);
                return carls_errorf(err, errlen, -1, "%s: vector %lu ('%s') is short", path, i, word);
            }
        }
        v->words[v->n] = strdup(word);
        size_t len = strlen(word);
        if (len <= 255) {
            uint32_t before = v->map.n;
            uint32_t idx = w2v_map_put(&v->map, v->words[v->n], (uint8_t)len);
            if (v->map.n > before) { /* a new word: the first row with it is the one found by name */
                v->map_row = carls_xrealloc(v->map_row, v->map.n * sizeof *v->map_row);
                v->map_row[idx] = v->n;
            }
        }
        v->n++;
    }
    fclose(f);
    *out = v;
    return 0;
}

int64_t w2v_vectors_find(const w2v_vectors_t *v, const char *word)
{
    size_t len = strlen(word);
    if (len > 255)
        return -1;
    uint32_t idx = w2v_map_get(&v->map, word, (uint8_t)len);
    return idx == UINT32_MAX ? -1 : (int64_t)v->map_row[idx];
}

void w2v_vectors_normalize(w2v_vectors_t *v)
{
    for (uint32_t i = 0; i < v->n; i++) {
        float *x = v->vec + (size_t)i * v->dim;
        double s = 0;
        for (uint32_t d = 0; d < v->dim; d++)
            s += (double)x[d] * x[d];
        if (s > 0) {
            float inv = (float)(1.0 / sqrt(s));
            for (uint32_t d = 0; d < v->dim; d++)
                x[d] *= inv;
        }
    }
}

int w2v_write_vectors(const char *path, uint32_t n, uint32_t dim, char *const *words, const float *vec, char *err,
                      size_t errlen)
{
    carls_atomic_file_t *file = NULL;
    if (carls_atomic_open(path, 0666, 0, &file, err, errlen) != 0)
        return -1;
    FILE *f = carls_atomic_stream(file);
    fprintf(f, "%u %u\n", n, dim);
    for (uint32_t i = 0; i < n; i++) {
        fputs(words[i], f);
        for (uint32_t d = 0; d < dim; d++)
            fprintf(f, " %.6g", vec[(size_t)i * dim + d]);
        fputc('\n', f);
    }
    return carls_atomic_commit(&file, err, errlen) == 0 ? 0 : -1; /* a failed write above fails the commit */
}

static float s_dot(const float *a, const float *b, uint32_t n)
{
    float s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Inserts (idx, score) into a best-first list of at most k. */
static void s_top_insert(uint32_t *top, float *score, uint32_t *have, uint32_t k, uint32_t idx, float s)
{
    if (*have == k && s <= score[k - 1])
        return;
    uint32_t p = *have < k ? (*have)++ : k - 1;
    while (p > 0 && score[p - 1] < s) {
        top[p] = top[p - 1];
        score[p] = score[p - 1];
        p--;
    }
    top[p] = idx;
    score[p] = s;
}

uint32_t w2v_vectors_nearest(const w2v_vectors_t *v, uint32_t r, uint32_t k, uint32_t *out, float *score)
{
    uint32_t have = 0;
    const float *q = v->vec + (size_t)r * v->dim;
    for (uint32_t i = 0; i < v->n; i++)
        if (i != r)
            s_top_insert(out, score, &have, k, i, s_dot(q, v->vec + (size_t)i * v->dim, v->dim));
    return have;
}

/* Average ranks (1-based, ties share their mean rank) of x (n). */
static void s_ranks(const double *x, uint32_t n, double *rank)
{
    uint32_t *idx = carls_xmalloc((n ? n : 1) * sizeof *idx);
    for (uint32_t i = 0; i < n; i++)
        idx[i] = i;
    for (uint32_t i = 1; i < n; i++) { /* insertion sort: the lists are small */
        uint32_t t = idx[i];
        uint32_t j = i;
        while (j > 0 && x[idx[j - 1]] > x[t]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = t;
    }
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        while (j + 1 < n && x[idx[j + 1]] == x[idx[i]])
            j++;
        double mean = (i + j) / 2.0 + 1.0;
        for (uint32_t t = i; t <= j; t++)
            rank[idx[t]] = mean;
        i = j + 1;
    }
    free(idx);
}

static double s_pearson(const double *a, const double *b, uint32_t n)
{
    double ma = 0, mb = 0;
    for (uint32_t i = 0; i < n; i++) {
        ma += a[i];
        mb += b[i];
    }
    ma /= n;
    mb /= n;
    double sab = 0, saa = 0, sbb = 0;
    for (uint32_t i = 0; i < n; i++) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    return saa > 0 && sbb > 0 ? sab / sqrt(saa * sbb) : 0;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Rank of row b among row a's neighbours by cosine (1 = nearest). */
static uint32_t s_rank_of(const w2v_vectors_t *v, uint32_t a, uint32_t b)
{
    const float *q = v->vec + (size_t)a * v->dim;
    float target = s_dot(q, v->vec + (size_t)b * v->dim, v->dim);
    uint32_t rank = 1;
    for (uint32_t i = 0; i < v->n; i++)
        if (i != a && i != b && s_dot(q, v->vec + (size_t)i * v->dim, v->dim) > target)
            rank++;
    return rank;
}

static int s_pairs(const w2v_vectors_t *v, const char *path, w2v_quality_t *q, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, -1, "cannot open %s: %s", path, strerror(errno));
    char line[512];
    double *human = NULL, *cosine = NULL, *ranks = NULL;
    uint32_t n = 0, cap = 0, nr = 0;
    while (fgets(line, sizeof line, f)) {
        char a[128], b[128];
        double score;
        if (line[0] == '#' || sscanf(line, "%127s %127s %lf", a, b, &score) != 3)
            continue;
        q->pairs_total++;
        int64_t ra = w2v_vectors_find(v, a), rb = w2v_vectors_find(v, b);
        if (ra < 0 || rb < 0)
            continue;
        if (n == cap) { /* human, cosine and ranks share the count */
            cap = (uint32_t)carls_grow_cap(cap, (size_t)n + 1, sizeof *human);
            human = carls_xrealloc(human, cap * sizeof *human);
            cosine = carls_xrealloc(cosine, cap * sizeof *cosine);
            ranks = carls_xrealloc(ranks, cap * sizeof *ranks);
        }
        human[n] = score;
        cosine[n] = s_dot(v->vec + (size_t)ra * v->dim, v->vec + (size_t)rb * v->dim, v->dim);
        n++;
        if (score >= 7)
            ranks[nr++] = s_rank_of(v, (uint32_t)ra, (uint32_t)rb);
    }
    fclose(f);
    q->pairs_found = n;
    if (n >= 2) {
        double *rh = carls_xmalloc(n * sizeof *rh), *rc = carls_xmalloc(n * sizeof *rc);
        s_ranks(human, n, rh);
        s_ranks(cosine, n, rc);
        q->spearman = s_pearson(rh, rc, n);
        free(rh);
        free(rc);
    }
    if (nr > 0) {
        uint32_t hit = 0;
        double rr = 0, below = 0;
        for (uint32_t i = 0; i < nr; i++) {
            hit += ranks[i] <= 10;
            rr += 1.0 / ranks[i];
            below += v->n > 2 ? 1.0 - (ranks[i] - 1) / (double)(v->n - 2) : 1.0;
        }
        q->hit10 = (double)hit / nr;
        q->mrr = rr / nr;
        q->auc = below / nr;
        qsort(ranks, nr, sizeof *ranks, s_cmp_double);
        q->median_rank = nr % 2 ? ranks[nr / 2] : (ranks[nr / 2 - 1] + ranks[nr / 2]) / 2;
    }
    free(human);
    free(cosine);
    free(ranks);
    return 0;
}

static int s_categories(const w2v_vectors_t *v, const char *path, w2v_quality_t *q, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, -1, "cannot open %s: %s", path, strerror(errno));
    uint32_t rows[1024], group[1024], n = 0, g = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (line[0] == '#' || !colon)
            continue;
        char *save = NULL;
        for (char *w = strtok_r(colon + 1, " \t\r\n", &save); w && n < 1024; w = strtok_r(NULL, " \t\r\n", &save)) {
            int64_t r = w2v_vectors_find(v, w);
            if (r >= 0) {
                rows[n] = (uint32_t)r;
                group[n++] = g;
            }
        }
        g++;
    }
    fclose(f);
    q->cat_words = n;
    double in_sum = 0, out_sum = 0, pur = 0;
    uint64_t in_n = 0, out_n = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t top[10];
        float sc[10];
        uint32_t have = 0;
        for (uint32_t j = 0; j < n; j++) {
            if (j == i)
                continue;
            float s = s_dot(v->vec + (size_t)rows[i] * v->dim, v->vec + (size_t)rows[j] * v->dim, v->dim);
            if (group[i] == group[j]) {
                in_sum += s;
                in_n++;
            } else {
                out_sum += s;
                out_n++;
            }
            s_top_insert(top, sc, &have, 10, j, s);
        }
        uint32_t same = 0;
        for (uint32_t t = 0; t < have; t++)
            same += group[top[t]] == group[i];
        pur += have ? (double)same / have : 0;
    }
    q->purity10 = n ? pur / n : 0;
    q->cos_in = in_n ? in_sum / in_n : 0;
    q->cos_out = out_n ? out_sum / out_n : 0;
    return 0;
}

int w2v_quality(const w2v_vectors_t *v, const char *pairs_path, const char *categories_path, w2v_quality_t *q,
                char *err, size_t errlen)
{
    memset(q, 0, sizeof *q);
    if (pairs_path && s_pairs(v, pairs_path, q, err, errlen) != 0)
        return -1;
    if (categories_path && s_categories(v, categories_path, q, err, errlen) != 0)
        return -1;
    return 0;
}

double w2v_neighbour_overlap(const w2v_vectors_t *a, const w2v_vectors_t *b, uint32_t first, uint32_t k)
{
    /* The shared vocabulary, as row pairs. */
    uint32_t *ra = carls_xmalloc((a->n ? a->n : 1) * sizeof *ra), *rb = carls_xmalloc((a->n ? a->n : 1) * sizeof *rb);
    uint32_t n = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        int64_t j = w2v_vectors_find(b, a->words[i]);
        if (j >= 0) {
            ra[n] = i;
            rb[n++] = (uint32_t)j;
        }
    }
    uint32_t *ta = carls_xmalloc(k * sizeof *ta), *tb = carls_xmalloc(k * sizeof *tb);
    float *sa = carls_xmalloc(k * sizeof *sa), *sb = carls_xmalloc(k * sizeof *sb);
    double sum = 0;
    uint32_t m = first < n ? first : n;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t ha = 0, hb = 0;
        for (uint32_t j = 0; j < n; j++) {
            if (j == i)
                continue;
            s_top_insert(ta, sa, &ha, k, j, s_dot(a->vec + (size_t)ra[i] * a->dim, a->vec + (size_t)ra[j] * a->dim, a->dim));
            s_top_insert(tb, sb, &hb, k, j, s_dot(b->vec + (size_t)rb[i] * b->dim, b->vec + (size_t)rb[j] * b->dim, b->dim));
        }
        uint32_t common = 0;
        for (uint32_t x = 0; x < ha; x++)
            for (uint32_t y = 0; y < hb; y++)
                common += ta[x] == tb[y];
        sum += k ? (double)common / k : 0;
    }
    free(ra);
    free(rb);
    free(ta);
    free(tb);
    free(sa);
    free(sb);
    return m ? sum / m : 0;
}

/* ---- trainer w2v-eval ---- */

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer w2v-eval --vectors FILE [options]\n"
            "Scores word vectors (word2vec text format: this trainer's export or fastText's .vec).\n"
            "  --vectors FILE       the vectors\n"
            "  --pairs FILE         'word1 word2 score' lines: Spearman of cosine vs score; for pairs scored\n"
            "                       >= 7, the rank of word2 among word1's neighbours (median, share <= 10,\n"
            "                       mean reciprocal rank, mean share of the other words ranked below)\n"
            "  --categories FILE    'name: words...' lines: share of each word's 10 nearest (among grouped\n"
            "                       words) in its own group; mean cosine inside vs between groups\n"
            "  --compare FILE       other vectors: mean share of common 10 nearest neighbours over the\n"
            "                       --first most frequent shared words (default 1000)\n"
            "  --first N\n"
            "  --neighbours W1,W2   print each word's --k nearest words (default k 10)\n"
            "  --k K\n");
}

int trainer_w2v_eval_main(int argc, char **argv)
{
    const char *vectors = NULL, *pairs = NULL, *cats = NULL, *compare = NULL, *neigh = NULL;
    int first = 1000, k = 10;
    const carls_arg_t args[] = {
        carls_arg_string("vectors", &vectors),
        carls_arg_string("pairs", &pairs),
        carls_arg_string("categories", &cats),
        carls_arg_string("compare", &compare),
        carls_arg_int("first", &first, 1, 1000000),
        carls_arg_string("neighbours", &neigh),
        carls_arg_int("k", &k, 1, 1000),
        {0},
    };
    int prc = carls_args_parse("trainer w2v-eval", argc, argv, args, s_usage);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    if (!vectors) {
        fprintf(stderr, "trainer w2v-eval: --vectors FILE is required\n");
        return 2;
    }
    char err[512];
    w2v_vectors_t *v = NULL, *other = NULL;
    int rc = 1;
    if (w2v_vectors_read(vectors, &v, err, sizeof err) != 0) {
        LOG_ERROR("w2v-eval: %s", err);
        return 1;
    }
    w2v_vectors_normalize(v);
    printf("vectors=%s words=%u dim=%u\n", vectors, v->n, v->dim);
    if (pairs || cats) {
        w2v_quality_t q;
        if (w2v_quality(v, pairs, cats, &q, err, sizeof err) != 0) {
            LOG_ERROR("w2v-eval: %s", err);
            goto cleanup;
        }
        if (pairs)
            printf("pairs found=%u/%u spearman=%.4f related_median_rank=%.1f related_hit@10=%.3f related_mrr=%.4f "
                   "related_auc=%.4f\n",
                   q.pairs_found, q.pairs_total, q.spearman, q.median_rank, q.hit10, q.mrr, q.auc);
        if (cats)
            printf("categories words=%u purity@10=%.4f cos_in=%.4f cos_between=%.4f\n", q.cat_words, q.purity10,
                   q.cos_in, q.cos_out);
    }
    if (compare) {
        if (w2v_vectors_read(compare, &other, err, sizeof err) != 0) {
            LOG_ERROR("w2v-eval: %s", err);
            goto cleanup;
        }
        w2v_vectors_normalize(other);
        printf("overlap@10 first=%d with=%s: %.4f\n", first, compare, w2v_neighbour_overlap(v, other, (uint32_t)first, 10));
    }
    if (neigh) {
        char *list = strdup(neigh);
        uint32_t *top = carls_xmalloc((size_t)k * sizeof *top);
        float *sc = carls_xmalloc((size_t)k * sizeof *sc);
        char *save = NULL;
        for (char *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
            int64_t r = w2v_vectors_find(v, w);
            printf("%s:", w);
            if (r < 0) {
                printf(" (no vector)\n");
                continue;
            }
            uint32_t h = w2v_vectors_nearest(v, (uint32_t)r, (uint32_t)k, top, sc);
            for (uint32_t i = 0; i < h; i++)
                printf(" %s(%.2f)", v->words[top[i]], sc[i]);
            printf("\n");
        }
        free(top);
        free(sc);
        free(list);
    }
    rc = 0;
cleanup:
    w2v_vectors_destroy(&v);
    w2v_vectors_destroy(&other);
    return rc;
}
