/* Query-document pairs as a two-tower data set (see data_pairs.h). */
#include "data_pairs.h"

#include "data_text.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One pair: where its query and document are in the file's buffer. */
typedef struct {
    const char *query;
    size_t query_len;
    char *doc; /* normalized (owned by the docs list) */
    size_t line;
    uint32_t word; /* index into the sorted documents */
} s_pair_t;

bool data_pairs_is_spec(const char *data)
{
    return data && strncmp(data, "pairs:", 6) == 0;
}

static int s_read(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return carls_errorf(err, errlen, -1, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = carls_xmalloc(cap + 1);
    size_t got;
    while ((got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            b = carls_xrealloc(b, cap + 1);
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return carls_errorf(err, errlen, -1, "cannot read %s", path);
    }
    b[n] = '\0';
    if (data_text_check_utf8(path, b, n, err, errlen) != 0) {
        free(b);
        return -1;
    }
    *buf = b;
    *len = n;
    return 0;
}

/* The document text [p, p + len) normalized (trimmed, ASCII-lowercased) into a new string, or NULL with the
 * reason (no path or line) in why. */
static char *s_document(const char *p, size_t len, char *why, size_t whylen)
{
    while (len && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t' || p[len - 1] == '\r'))
        len--;
    if (len == 0) {
        snprintf(why, whylen, "empty document");
        return NULL;
    }
    if (len > DATA_GCIDE_MAX_WORD) {
        snprintf(why, whylen, "document of %zu bytes (at most %u)", len, DATA_GCIDE_MAX_WORD);
        return NULL;
    }
    if (*p == '#') {
        snprintf(why, whylen, "a document may not start with '#'");
        return NULL;
    }
    char *d = carls_xmalloc(len + 1);
    for (size_t i = 0; i < len; i++)
        d[i] = (char)tolower((unsigned char)p[i]);
    d[len] = '\0';
    return d;
}

/* Whether text [p, p + len) holds a word by data_text's rule. */
static bool s_has_word(const char *p, size_t len)
{
    for (size_t pos = 0; pos < len;) {
        size_t start, end;
        if (data_text_word_at(p, len, &pos, &start, &end)) {
            if (end > start)
                return true;
        } else {
            pos++;
        }
    }
    return false;
}

/* The next line of [*p, end): returns its start (NULL at the end) with its length, without "\n" or "\r\n", in
 * *len, and moves *p past it. */
static char *s_next_line(char **p, char *end, size_t *len)
{
    if (!*p || *p >= end)
        return NULL;
    char *line = *p, *nl = memchr(line, '\n', (size_t)(end - line));
    size_t l = (size_t)((nl ? nl : end) - line);
    if (l && line[l - 1] == '\r')
        l--;
    *len = l;
    *p = nl ? nl + 1 : end;
    return line;
}

static int s_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Pairs by document, then by line (so a document's senses keep the file's order). */
static int s_cmp_pair(const void *a, const void *b)
{
    const s_pair_t *x = a, *y = b;
    if (x->word != y->word)
        return x->word < y->word ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

int data_pairs_load(const char *spec, data_gcide_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!data_pairs_is_spec(spec))
        return carls_errorf(err, errlen, -1, "'%s': expected pairs:PAIRS.tsv[,CANDIDATES.txt]", spec ? spec : "");
    char pairs_path[4096] = "", cand_path[4096] = "";
    const char *files = spec + 6, *comma = strchr(files, ',');
    size_t plen = comma ? (size_t)(comma - files) : strlen(files);
    if (plen == 0 || plen >= sizeof pairs_path || (comma && (!comma[1] || strlen(comma + 1) >= sizeof cand_path)))
        return carls_errorf(err, errlen, -1, "'%s': expected pairs:PAIRS.tsv[,CANDIDATES.txt]", spec);
    memcpy(pairs_path, files, plen);
    if (comma)
        snprintf(cand_path, sizeof cand_path, "%s", comma + 1);

    char *buf = NULL, *cbuf = NULL, **docs = NULL, why[128];
    size_t len = 0, clen = 0, n_pairs = 0, pcap = 0, n_docs = 0, dcap = 0;
    s_pair_t *pairs = NULL;
    data_gcide_t *g = NULL;
    int rc = s_read(pairs_path, &buf, &len, err, errlen);
    if (rc == 0 && cand_path[0])
        rc = s_read(cand_path, &cbuf, &clen, err, errlen);
    /* the pairs */
    size_t line = 0, l;
    char *cursor = buf, *p;
    while (rc == 0 && (p = s_next_line(&cursor, buf + len, &l))) {
        line++;
        if (l > 0) {
            char *tab = memchr(p, '\t', l);
            char *doc = NULL;
            if (!tab || memchr(tab + 1, '\t', l - (size_t)(tab + 1 - p)))
                rc = carls_errorf(err, errlen, -1, "%s: line %zu: expected QUERY<TAB>DOCUMENT (one TAB)", pairs_path,
                                  line);
            else if (!s_has_word(p, (size_t)(tab - p)))
                rc = carls_errorf(err, errlen, -1, "%s: line %zu: the query has no words", pairs_path, line);
            else if (!(doc = s_document(tab + 1, l - (size_t)(tab + 1 - p), why, sizeof why)))
                rc = carls_errorf(err, errlen, -1, "%s: line %zu: %s", pairs_path, line, why);
            if (rc == 0) {
                pairs = carls_grow(pairs, &pcap, n_pairs + 1, sizeof *pairs);
                pairs[n_pairs++] = (s_pair_t){.query = p, .query_len = (size_t)(tab - p), .doc = doc, .line = line};
                docs = carls_grow(docs, &dcap, n_docs + 1, sizeof *docs);
                docs[n_docs++] = doc;
            }
        }
    }
    if (rc == 0 && n_pairs == 0)
        rc = carls_errorf(err, errlen, -1, "%s: no pairs", pairs_path);
    /* the candidates */
    line = 0;
    cursor = cbuf;
    while (rc == 0 && (p = s_next_line(&cursor, cbuf + clen, &l))) {
        line++;
        if (l > 0) {
            char *doc = s_document(p, l, why, sizeof why);
            if (!doc) {
                rc = carls_errorf(err, errlen, -1, "%s: line %zu: %s", cand_path, line, why);
            } else {
                docs = carls_grow(docs, &dcap, n_docs + 1, sizeof *docs);
                docs[n_docs++] = doc;
            }
        }
    }
    if (rc != 0)
        goto done;

    /* documents sorted and unique: the headwords */
    char **sorted = carls_xmalloc(n_docs * sizeof *sorted);
    memcpy(sorted, docs, n_docs * sizeof *sorted);
    qsort(sorted, n_docs, sizeof *sorted, s_cmp_str);
    g = carls_xcalloc(1, sizeof *g);
    g->words = carls_xmalloc(n_docs * sizeof *g->words);
    for (size_t i = 0; i < n_docs; i++) {
        if (g->n_words && strcmp(g->words[g->n_words - 1], sorted[i]) == 0)
            continue;
        g->words[g->n_words] = carls_xmalloc(strlen(sorted[i]) + 1);
        strcpy(g->words[g->n_words++], sorted[i]);
    }
    free(sorted);
    for (size_t i = 0; i < n_pairs; i++)
        pairs[i].word = (uint32_t)data_gcide_find(g, pairs[i].doc);
    qsort(pairs, n_pairs, sizeof *pairs, s_cmp_pair);
    /* senses grouped by document, and their queries as the text's lines in the same order */
    g->n_senses = n_pairs;
    g->senses = carls_xcalloc(n_pairs, sizeof *g->senses);
    g->word_first_sense = carls_xcalloc(g->n_words + 1, sizeof *g->word_first_sense);
    size_t text_len = 0;
    for (size_t i = 0; i < n_pairs; i++)
        text_len += pairs[i].query_len + 1;
    char *text = carls_xmalloc(text_len + 1), *t = text;
    for (size_t i = 0; i < n_pairs; i++) {
        g->senses[i].word = pairs[i].word;
        g->senses[i].number = i > 0 && pairs[i - 1].word == pairs[i].word ? g->senses[i - 1].number + 1 : 1;
        g->word_first_sense[pairs[i].word + 1] = i + 1;
        memcpy(t, pairs[i].query, pairs[i].query_len);
        t += pairs[i].query_len;
        *t++ = '\n';
    }
    for (size_t w = 0; w < g->n_words; w++) /* documents without pairs (candidates) have no senses */
        if (g->word_first_sense[w + 1] < g->word_first_sense[w])
            g->word_first_sense[w + 1] = g->word_first_sense[w];
    rc = data_text_from_buffer(text, text_len, &g->text, err, errlen);
    free(text);
    if (rc == 0 && g->text->n_lines != n_pairs)
        rc = carls_errorf(err, errlen, -1, "%s: %zu queries tokenized into %zu lines", pairs_path, n_pairs,
                          g->text->n_lines);
done:
    for (size_t i = 0; i < n_docs; i++)
        free(docs[i]);
    free(docs);
    free(pairs);
    free(buf);
    free(cbuf);
    if (rc != 0) {
        data_gcide_destroy(&g);
        return rc;
    }
    *out = g;
    return 0;
}
