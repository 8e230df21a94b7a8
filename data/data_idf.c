/* Inverse document frequencies by word hash (see data_idf.h). */
#include "data_idf.h"

#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t s_key(const char *word, size_t len)
{
    uint64_t h = carls_hash64(word, len, 0x1df);
    return h == UINT64_MAX ? h : h + 1; /* 0 marks an empty slot */
}

static size_t s_slot(const data_idf_t *idf, uint64_t key)
{
    size_t mask = idf->cap - 1, i = (size_t)(key * 0x9E3779B97F4A7C15ull) & mask;
    while (idf->keys[i] != 0 && idf->keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

/* True when an earlier token of the same line spells the word at k (a word counts once per document). */
static bool s_seen_in_line(const data_text_t *t, size_t first, size_t k)
{
    for (size_t j = first; j < k; j++)
        if (t->tok_len[j] == t->tok_len[k] && memcmp(t->text + t->tok_off[j], t->text + t->tok_off[k], t->tok_len[k]) == 0)
            return true;
    return false;
}

int data_idf_build(data_idf_t *idf, const data_text_t *t, const bool *skip)
{
    /* At most one slot per token: twice that keeps the table at most half full. */
    idf->cap = 1024;
    while (idf->cap < 2 * t->n_tokens)
        idf->cap <<= 1;
    idf->keys = carls_xcalloc(idf->cap, sizeof *idf->keys);
    idf->df = carls_xcalloc(idf->cap, sizeof *idf->df);
    idf->docs = 0;
    for (size_t s = 0; s < t->n_lines; s++) {
        if (skip && skip[s])
            continue;
        idf->docs++;
        for (size_t k = t->line_start[s]; k < t->line_start[s + 1]; k++) {
            if (s_seen_in_line(t, t->line_start[s], k))
                continue;
            size_t i = s_slot(idf, s_key(t->text + t->tok_off[k], t->tok_len[k]));
            idf->keys[i] = s_key(t->text + t->tok_off[k], t->tok_len[k]);
            idf->df[i]++;
        }
    }
    return 0;
}

float data_idf_weight(const data_idf_t *idf, const char *word, size_t len)
{
    size_t i = s_slot(idf, s_key(word, len));
    uint32_t df = idf->keys[i] == 0 ? 0 : idf->df[i];
    return (float)(log((double)(idf->docs + 1) / (double)(df + 1)) + 1.0);
}

void data_idf_free(data_idf_t *idf)
{
    free(idf->keys);
    free(idf->df);
    memset(idf, 0, sizeof *idf);
}
