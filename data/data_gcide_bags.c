/* Definition bags of GCIDE headwords (see data_gcide_bags.h). */
#include "data_gcide_bags.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

/* Calls fn for every word the bag of headword w holds; returns how many. */
static size_t s_walk(const data_gcide_t *g, uint32_t w, size_t max_senses, size_t max_tokens,
                     data_gcide_bags_t *fill, size_t at, const data_idf_t *idf)
{
    const data_text_t *t = g->text;
    size_t count = 0, senses = 0;
    for (size_t s = g->word_first_sense[w]; s < g->word_first_sense[w + 1] && senses < max_senses; s++) {
        if (g->senses[s].held_out)
            continue;
        senses++;
        size_t end = t->line_start[s + 1];
        if (end - t->line_start[s] > max_tokens)
            end = t->line_start[s] + max_tokens;
        for (size_t k = t->line_start[s]; k < end; k++, count++) {
            if (!fill)
                continue;
            const char *word = t->text + t->tok_off[k];
            fill->tok[at + count] = word;
            fill->len[at + count] = t->tok_len[k];
            fill->weight[at + count] = data_idf_weight(idf, word, t->tok_len[k]);
        }
    }
    return count;
}

void data_gcide_bags_build(data_gcide_bags_t *out, const data_gcide_t *g, const data_idf_t *idf,
                           const uint32_t *words, size_t n, size_t max_senses, size_t max_tokens)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    out->off = carls_xmalloc((n + 1) * sizeof *out->off);
    out->off[0] = 0;
    for (size_t i = 0; i < n; i++)
        out->off[i + 1] = out->off[i] + s_walk(g, words[i], max_senses, max_tokens, NULL, 0, idf);
    size_t total = out->off[n] + 1;
    out->tok = carls_xmalloc(total * sizeof *out->tok);
    out->len = carls_xmalloc(total * sizeof *out->len);
    out->weight = carls_xmalloc(total * sizeof *out->weight);
    for (size_t i = 0; i < n; i++)
        s_walk(g, words[i], max_senses, max_tokens, out, out->off[i], idf);
}

void data_gcide_idf_build(data_idf_t *idf, const data_gcide_t *g)
{
    bool *skip = carls_xmalloc(g->n_senses * sizeof(bool) + 1);
    for (size_t s = 0; s < g->n_senses; s++)
        skip[s] = g->senses[s].held_out;
    data_idf_build(idf, g->text, skip);
    free(skip);
}

void data_gcide_bags_free(data_gcide_bags_t *b)
{
    free(b->tok);
    free(b->len);
    free(b->weight);
    free(b->off);
    memset(b, 0, sizeof *b);
}
