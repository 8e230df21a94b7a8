/* GCIDE reverse-dictionary data set (see data_gcide.h).
 *
 * An article as dictd stores it (the Bank noun, shortened):
 *
 *   Bank \Bank\ (b[a^][ng]k), n. [OE. banke; akin to E. bench, and      <- header: names, pronunciation,
 *      prob. of Scand. origin; cf. Icel. bakki. See {Bench}.]             part of speech, etymology
 *      1. A mound, pile, or ridge of earth, ...; as, a bank of clouds.   <- sense 1 (indent 3, "N. ")
 *         [1913 Webster]                                                  <- source tag
 *                                                                         <- blank line: new paragraph
 *               They cast up a bank against the city. --2 Sam. xx.      <- quotation (indent >= 8)
 *      5. (Mining)
 *         (a) The face of the coal at which miners are working.          <- sub-sense: part of sense 5
 *      {Bank swallow}, a small American and European swallow ...         <- sub-entry paragraph
 *      Syn: ...   Note: ...   Usage: ...                                 <- dropped paragraphs
 *
 * The loader reads the index, gives every article to one headword (below), splits each article into senses
 * (data_gcide_article_senses), tokenizes and masks them, and builds one data_text_t whose line s is sense s.
 *
 * One owner per article: many index lines point at an article that is not theirs to define: inflections
 * ("Banked" and "Banking" point at the verb Bank), variant spellings ("Bancus" shares Banc's article) and
 * names of sub-entries. Giving the article to each of them would make the same definition the right answer
 * for several headwords, and a held-out sense of "banked" would be answered by the training senses of
 * "bank". So each article belongs to the first of its index headwords that its header names (a name is the
 * word before a \pronunciation\), or to the first in index order when the header names none of them. */
#include "data_gcide.h"

#include "data_sample.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#define PACKAGE "dict-gcide"

static inline bool s_is_letter(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static inline char s_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static inline bool s_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* A growing byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} s_buf_t;

static void s_buf_reserve(s_buf_t *b, size_t extra)
{
    b->p = carls_grow(b->p, &b->cap, b->len + extra + 1, 1); /* + 1: room for a terminator */
}

static void s_buf_add(s_buf_t *b, const char *s, size_t n)
{
    s_buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* ---------------------------------------------------------------------------------------------------- */
/* dictd base-64 numbers                                                                                */

int64_t data_gcide_b64(const char *s, size_t len)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (len == 0)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        const char *d = s[i] ? strchr(digits, s[i]) : NULL;
        if (!d || v > (INT64_MAX >> 6))
            return -1;
        v = (v << 6) | (int64_t)(d - digits);
    }
    return v;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Markup inside a definition                                                                           */

/* Named character codes that stand for letters, and what they become. Diacritic codes ("[a^]", "['e]",
 * "[=oo]") are recognised by their shape instead (s_accent). */
static const struct {
    const char *code, *letters;
} s_named[] = {
    {"ae", "ae"},    {"AE", "ae"},   {"oe", "oe"},     {"OE", "oe"},   {"aum", "a"},   {"add", "a"},
    {"asl", "a"},    {"udd", "u"},   {"imac", "i"},    {"eth", "th"},  {"thorn", "th"}, {"th", "th"},
    {"ng", "ng"},    {"yogh", "y"},  {"dsdot", "d"},   {"lsdot", "l"}, {"tsdo", "t"},  {"zdot", "z"},
    {"mdot", "m"},   {"ncir", "n"},  {"mtil", "m"},    {"filig", "fi"}, {"ffllig", "ffl"},
};

/* Greek letters are written by name ("3[beta]-hydroxy"): they become that name as a word of its own. */
static const char *const s_greek[] = {
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "omicron", "pi", "rho", "sigma", "sigmat", "tau", "upsilon", "phi", "chi", "psi", "omega",
};

static bool s_is_mark(char c)
{
    return c && strchr("^'=.~-\"`,*", c) != NULL;
}

/* If code (n bytes, the text between '[' and ']') is a character code, appends what it stands for to out
 * and returns true. Diacritics: one mark before one or two letters ("[\"e]", "[=ae]", "[.a]") or a
 * circumflex after them ("[a^]", "[oo^]") become the letters. A period after a letter is not a mark:
 * "[R.]" (rare), "[F.]" are tags. */
static bool s_accent(const char *code, size_t n, s_buf_t *out)
{
    if (n == 2 || n == 3) {
        size_t first = s_is_mark(code[0]) ? 1 : 0;
        size_t last = code[n - 1] == '^' ? n - 1 : n;
        bool letters = first + (n - last) == 1;
        for (size_t i = first; letters && i < last; i++)
            letters = s_is_letter((unsigned char)code[i]);
        if (letters) {
            for (size_t i = first; i < last; i++)
                s_buf_add(out, &(char){s_lower(code[i])}, 1);
            return true;
        }
    }
    for (size_t i = 0; i < sizeof s_named / sizeof s_named[0]; i++) {
        if (strlen(s_named[i].code) == n && memcmp(s_named[i].code, code, n) == 0) {
            s_buf_add(out, s_named[i].letters, strlen(s_named[i].letters));
            return true;
        }
    }
    for (size_t i = 0; i < sizeof s_greek / sizeof s_greek[0]; i++) {
        if (strlen(s_greek[i]) == n && strncasecmp(s_greek[i], code, n) == 0) {
            s_buf_add(out, " ", 1);
            s_buf_add(out, s_greek[i], n);
            s_buf_add(out, " ", 1);
            return true;
        }
    }
    return false;
}

/* Where the bracket opened at in[i] closes (nested brackets counted), or len when it does not. */
static size_t s_bracket_end(const char *in, size_t len, size_t i)
{
    int depth = 0;
    for (size_t k = i; k < len; k++) {
        if (in[k] == '[')
            depth++;
        else if (in[k] == ']' && --depth == 0)
            return k;
    }
    return len;
}

/* A run-in derivative starts at in[i]: "-- {E`qui*dis\"tant*ly}, adv." ends a definition with another
 * word's entry. */
static bool s_is_run_in(const char *in, size_t len, size_t i)
{
    if (i + 2 >= len || in[i] != '-' || in[i + 1] != '-')
        return false;
    size_t k = i + 2;
    while (k < len && s_is_space(in[k]))
        k++;
    return k > i + 2 && k < len && in[k] == '{';
}

/* Pass 1: character codes become letters, every other [...] (source and usage tags "[1913 Webster]",
 * "[Obs.]", "[Local, U.S.]") becomes a space, braces vanish ("{Clivicola riparia}" keeps its words) and so
 * do the syllable and stress marks inside them ("{Gre*ga\"ri*ous}"); a run-in derivative ends the text.
 * Newlines are kept for pass 2. */
static void s_strip_brackets(const char *in, size_t len, s_buf_t *out)
{
    bool braced = false;
    for (size_t i = 0; i < len; i++) {
        if (in[i] == '{' || in[i] == '}') {
            braced = in[i] == '{';
            continue;
        }
        if (s_is_run_in(in, len, i))
            return;
        if (braced && (in[i] == '*' || in[i] == '`' || in[i] == '"'))
            continue;
        if (in[i] != '[') {
            s_buf_add(out, in + i, 1);
            continue;
        }
        size_t end = s_bracket_end(in, len, i);
        if (end == len) { /* unmatched: just a separator */
            s_buf_add(out, " ", 1);
            continue;
        }
        if (!s_accent(in + i + 1, end - i - 1, out))
            s_buf_add(out, " ", 1);
        i = end;
    }
}

/* A citation starts at in[i]: "--" then a capital or a digit ("--Shak.", "--2 Sam. xx."); "-- often in a
 * bad sense" (a dash and a space) is part of the definition. */
static bool s_is_citation(const char *in, size_t len, size_t i)
{
    if (i + 2 >= len || in[i] != '-' || in[i + 1] != '-')
        return false;
    char c = in[i + 2];
    return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Pass 2: drops citations (to the end of their line) with the quotation just before them ("Banked well
 * with earth." --Holland.), collapses white space to single spaces, trims. */
static void s_strip_citations(const char *in, size_t len, s_buf_t *out)
{
    for (size_t i = 0; i < len; i++) {
        if (s_is_citation(in, len, i)) {
            while (out->len && out->p[out->len - 1] == ' ')
                out->len--;
            if (out->len && out->p[out->len - 1] == '"') {
                char *open = out->len > 1 ? memrchr(out->p, '"', out->len - 1) : NULL;
                if (open)
                    out->len = (size_t)(open - out->p);
            }
            while (i < len && in[i] != '\n')
                i++;
            s_buf_add(out, " ", 1);
            continue;
        }
        if (s_is_space(in[i])) {
            if (out->len && out->p[out->len - 1] != ' ')
                s_buf_add(out, " ", 1);
            continue;
        }
        s_buf_add(out, in + i, 1);
    }
    while (out->len && out->p[out->len - 1] == ' ')
        out->len--;
    if (out->len == 0)
        return;
    /* Only the first byte can be a space (runs were collapsed). */
    if (out->p[0] == ' ') {
        memmove(out->p, out->p + 1, out->len - 1);
        out->len--;
    }
    out->p[out->len] = '\0';
}

/* ---------------------------------------------------------------------------------------------------- */
/* Article structure                                                                                    */

typedef struct {
    const char *p;   /* first byte after the indentation */
    size_t len;      /* bytes after the indentation, without the newline */
    size_t indent;   /* leading spaces */
    bool blank;
} s_line_t;

/* Reads the line starting at a[*pos] and advances *pos past its newline. */
static s_line_t s_next_line(const char *a, size_t len, size_t *pos)
{
    size_t s = *pos, e = s;
    while (e < len && a[e] != '\n')
        e++;
    *pos = e < len ? e + 1 : e;
    s_line_t l = {0};
    while (s + l.indent < e && a[s + l.indent] == ' ')
        l.indent++;
    l.p = a + s + l.indent;
    l.len = e - s - l.indent;
    while (l.len && (l.p[l.len - 1] == ' ' || l.p[l.len - 1] == '\r' || l.p[l.len - 1] == '\t'))
        l.len--;
    l.blank = l.len == 0;
    return l;
}

/* The number of a numbered sense's first line ("   2. To heap or pile up"), with *text after "N. ";
 * 0 when the line starts no numbered sense. Deeper-indented numbers belong to quotations and tables. */
static unsigned s_sense_number(const s_line_t *l, size_t *text)
{
    if (l->indent > 4)
        return 0;
    size_t i = 0;
    unsigned n = 0;
    while (i < l->len && i < 3 && l->p[i] >= '0' && l->p[i] <= '9')
        n = n * 10 + (unsigned)(l->p[i++] - '0');
    if (i == 0 || i + 1 > l->len || l->p[i] != '.' || (i + 1 < l->len && l->p[i + 1] != ' '))
        return 0;
    *text = i + 1 < l->len ? i + 2 : i + 1;
    return n;
}

static bool s_starts_with(const s_line_t *l, const char *prefix)
{
    size_t n = strlen(prefix);
    return l->len >= n && memcmp(l->p, prefix, n) == 0;
}

/* Whether a paragraph whose first line is l is not definition text: a quotation (indented deeper than
 * definitions: 9 under an unnumbered definition, 12 under a numbered one), a sub-entry "{Bank credit}, ...",
 * or a Note:/Syn:/Usage: paragraph. */
static bool s_dropped_paragraph(const s_line_t *l)
{
    return l->indent >= 8 || l->p[0] == '{' || s_starts_with(l, "Note:") || s_starts_with(l, "Syn:") ||
           s_starts_with(l, "Usage:") || s_starts_with(l, "Syn.:");
}

/* Where the header ends: its first line, every following line while an etymology or inflection bracket is
 * open ("[imp. & p. p.\n {Abandoned} ...]"), and lines that start in column 0 (a second name on its own
 * line). A blank line or a numbered sense always ends it, so a stray '[' cannot swallow the article. */
static size_t s_header_end(const char *a, size_t len)
{
    size_t pos = 0;
    int depth = 0;
    bool first = true;
    while (pos < len) {
        size_t next = pos;
        s_line_t l = s_next_line(a, len, &next);
        size_t text;
        if (!first && (l.blank || s_sense_number(&l, &text) || (depth <= 0 && l.indent > 0)))
            break;
        for (size_t i = 0; i < l.len; i++)
            depth += l.p[i] == '[' ? 1 : l.p[i] == ']' ? -1 : 0;
        if (depth < 0)
            depth = 0;
        first = false;
        pos = next;
    }
    return pos;
}

/* Cleans one sense's raw lines and hands it to fn when anything is left. */
static size_t s_emit(const s_buf_t *raw, s_buf_t *tmp, s_buf_t *clean,
                     void (*fn)(void *ctx, const char *text, size_t text_len), void *ctx)
{
    tmp->len = 0;
    clean->len = 0;
    s_strip_brackets(raw->p, raw->len, tmp);
    s_strip_citations(tmp->p, tmp->len, clean);
    if (clean->len == 0)
        return 0;
    if (fn)
        fn(ctx, clean->p, clean->len);
    return 1;
}

size_t data_gcide_article_senses(const char *article, size_t len,
                                 void (*fn)(void *ctx, const char *text, size_t text_len), void *ctx)
{
    s_buf_t cur = {0}, tmp = {0}, clean = {0};
    size_t pos = s_header_end(article, len), count = 0;
    bool numbered = false, para_start = true, dropping = false;
    while (pos < len) {
        s_line_t l = s_next_line(article, len, &pos);
        if (l.blank) {
            para_start = true;
            continue;
        }
        size_t text = 0;
        if (s_sense_number(&l, &text)) {
            /* Text before the first number (a field label such as "(Astrol.)") is not a sense. */
            if (numbered)
                count += s_emit(&cur, &tmp, &clean, fn, ctx);
            cur.len = 0;
            numbered = true;
            para_start = dropping = false;
            s_buf_add(&cur, l.p + text, l.len - text);
            continue;
        }
        if (para_start)
            dropping = s_dropped_paragraph(&l);
        para_start = false;
        if (dropping)
            continue;
        /* A tag line's text after the tag is debris of the conversion (the names of the next entry:
         * "[1913 Webster] Abruptly pinnate"). */
        if (l.p[0] == '[') {
            size_t close = s_bracket_end(l.p, l.len, 0);
            if (close < l.len)
                l.len = close + 1;
        }
        s_buf_add(&cur, "\n", 1);
        s_buf_add(&cur, l.p, l.len);
    }
    count += s_emit(&cur, &tmp, &clean, fn, ctx);
    free(cur.p);
    free(tmp.p);
    free(clean.p);
    return count;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Masking                                                                                              */

size_t data_gcide_mask(const char *headword, const char *def, char *out)
{
    size_t hlen = strlen(headword);
    size_t plen = hlen < 5 ? hlen : 5; /* the shared prefix that masks a word */
    size_t o = 0, removed = 0;
    const char *p = def;
    while (*p) {
        while (*p == ' ')
            p++;
        const char *w = p;
        while (*p && *p != ' ')
            p++;
        size_t wlen = (size_t)(p - w);
        if (wlen == 0)
            break;
        if (wlen >= plen && memcmp(w, headword, plen) == 0) {
            removed++;
            continue;
        }
        if (o)
            out[o++] = ' ';
        memcpy(out + o, w, wlen);
        o += wlen;
    }
    out[o] = '\0';
    return removed;
}

/* Tokenizes with data_text's word rule (data_text_word_at; ASCII lowercased) into space-separated words.
 * out holds at least len + 1 bytes. */
static size_t s_tokenize(const char *in, size_t len, char *out)
{
    size_t o = 0, i = 0;
    while (i < len) {
        size_t s, e;
        if (!data_text_word_at(in, len, &i, &s, &e)) {
            i++;
            continue;
        }
        if (s == e)
            continue;
        if (o)
            out[o++] = ' ';
        for (size_t k = s; k < e; k++)
            out[o++] = s_lower(in[k]);
    }
    out[o] = '\0';
    return o;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Files                                                                                                */

static int s_missing(const char *path, char *err, size_t errlen)
{
    return carls_errorf(err, errlen, -1, "cannot open %s: %s (install the Debian package %s: apt-get install %s)", path,
                  strerror(errno), PACKAGE, PACKAGE);
}

static int s_read_file(const char *path, s_buf_t *out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return s_missing(path, err, errlen);
    char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        s_buf_add(out, chunk, got);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return carls_errorf(err, errlen, -1, "reading %s: %s", path, strerror(errno));
    s_buf_reserve(out, 0);
    out->p[out->len] = '\0';
    return 0;
}

/* The whole .dict.dz (a gzip file; zlib also reads an uncompressed .dict as is). */
static int s_read_gz(const char *path, s_buf_t *out, char *err, size_t errlen)
{
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return errno ? s_missing(path, err, errlen) : carls_errorf(err, errlen, -1, "cannot open %s", path);
    gzbuffer(f, 1 << 18);
    for (;;) {
        s_buf_reserve(out, 1 << 22);
        int got = gzread(f, out->p + out->len, (unsigned)(out->cap - out->len - 1));
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            carls_errorf(err, errlen, -1, "%s: corrupt compressed data (%s)", path, msg);
            gzclose(f);
            return -1;
        }
        if (got == 0)
            break;
        out->len += (size_t)got;
    }
    gzclose(f);
    out->p[out->len] = '\0';
    return 0;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Index and article ownership                                                                          */

typedef struct {
    const char *word;  /* lowercase, NUL-terminated inside the index buffer */
    uint32_t order;    /* index line number (0-based) */
    uint64_t off, len; /* the article */
} s_entry_t;

static int s_entry_by_article(const void *a, const void *b)
{
    const s_entry_t *x = a, *y = b;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int s_entry_by_word(const void *a, const void *b)
{
    const s_entry_t *x = a, *y = b;
    int c = strcmp(x->word, y->word);
    if (c)
        return c;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Parses the index (modified in place: headwords lowercased and NUL-terminated) into the entries whose
 * headword is ASCII letters only. */
static int s_parse_index(char *idx, size_t idx_len, size_t dict_len, const char *path, s_entry_t **out,
                         size_t *n_out, data_gcide_stats_t *st, char *err, size_t errlen)
{
    size_t cap = 1 << 16, n = 0;
    s_entry_t *e = carls_xmalloc(cap * sizeof *e);
    uint32_t line = 0;
    for (char *p = idx, *end = idx + idx_len; p < end; line++) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        char *t1 = memchr(p, '\t', (size_t)(eol - p));
        char *t2 = t1 ? memchr(t1 + 1, '\t', (size_t)(eol - t1 - 1)) : NULL;
        if (eol == p) {
            p = eol + 1;
            continue;
        }
        int64_t off = t2 ? data_gcide_b64(t1 + 1, (size_t)(t2 - t1 - 1)) : -1;
        int64_t len = t2 ? data_gcide_b64(t2 + 1, (size_t)(eol - t2 - 1)) : -1;
        if (off < 0 || len < 0 || (uint64_t)off + (uint64_t)len > dict_len) {
            free(e);
            return carls_errorf(err, errlen, -1, "%s:%u: not \"headword<TAB>offset<TAB>length\" within the dictionary "
                          "(%zu bytes)", path, line + 1, dict_len);
        }
        st->index_lines++;
        bool letters = t1 > p && (size_t)(t1 - p) <= DATA_GCIDE_MAX_WORD;
        for (char *c = p; letters && c < t1; c++)
            letters = s_is_letter((unsigned char)*c);
        if (letters) {
            for (char *c = p; c < t1; c++)
                *c = s_lower(*c);
            *t1 = '\0';
            e = carls_grow(e, &cap, n + 1, sizeof *e);
            e[n++] = (s_entry_t){p, line, (uint64_t)off, (uint64_t)len};
        }
        p = eol + 1;
    }
    *out = e;
    *n_out = n;
    return 0;
}

/* Where word is named in the header (followed by optional spaces and the '\' of a pronunciation, not
 * preceded by a letter), or SIZE_MAX. */
static size_t s_named_at(const char *hdr, size_t len, const char *word)
{
    size_t wl = strlen(word);
    for (size_t i = 0; i + wl <= len; i++) {
        if ((i && s_is_letter((unsigned char)hdr[i - 1])) || strncasecmp(hdr + i, word, wl) != 0)
            continue;
        size_t k = i + wl;
        while (k < len && hdr[k] == ' ')
            k++;
        if (k < len && hdr[k] == '\\')
            return i;
    }
    return SIZE_MAX;
}

/* Keeps one entry per article (rule at the top of this file): entries (sorted by article) are compacted in
 * place; returns how many remain. */
static size_t s_choose_owners(s_entry_t *e, size_t n, const char *dict)
{
    size_t kept = 0;
    for (size_t g = 0; g < n;) {
        size_t h = g;
        while (h < n && e[h].off == e[g].off && e[h].len == e[g].len)
            h++;
        const char *art = dict + e[g].off;
        size_t hdr_len = s_header_end(art, (size_t)e[g].len);
        size_t best = g, best_at = SIZE_MAX;
        for (size_t k = g; k < h; k++) {
            size_t at = s_named_at(art, hdr_len, e[k].word);
            if (at < best_at) {
                best_at = at;
                best = k;
            }
        }
        e[kept++] = e[best];
        g = h;
    }
    return kept;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Loading                                                                                              */

/* What the sense callback appends to: the text of the kept senses and their count per word. */
typedef struct {
    const char *word;
    s_buf_t text;        /* one masked sense per line */
    s_buf_t tok, masked; /* scratch */
    size_t kept;         /* senses of the current word kept so far */
    data_gcide_stats_t *st;
} s_collect_t;

static void s_collect_sense(void *ctx, const char *text, size_t len)
{
    s_collect_t *c = ctx;
    s_buf_reserve(&c->tok, len + 1);
    s_buf_reserve(&c->masked, len + 1);
    if (s_tokenize(text, len, c->tok.p) == 0)
        return;
    c->st->senses_parsed++;
    size_t removed = data_gcide_mask(c->word, c->tok.p, c->masked.p);
    if (removed)
        c->st->senses_with_headword++;
    size_t ml = strlen(c->masked.p);
    if (ml == 0) {
        c->st->senses_masked_empty++;
        return;
    }
    s_buf_add(&c->text, c->masked.p, ml);
    s_buf_add(&c->text, "\n", 1);
    c->kept++;
}

/* Splits the owned articles (sorted by word, then index order) into senses and fills g. */
static int s_build(data_gcide_t *g, const s_entry_t *e, size_t n, const char *dict, char *err, size_t errlen)
{
    s_collect_t c = {.st = &g->stats};
    size_t words_cap = 1024, senses_cap = 4096;
    g->words = carls_xmalloc(words_cap * sizeof *g->words);
    g->senses = carls_xmalloc(senses_cap * sizeof *g->senses);
    for (size_t a = 0; a < n;) {
        size_t b = a;
        c.word = e[a].word;
        c.kept = 0;
        for (; b < n && strcmp(e[b].word, e[a].word) == 0; b++)
            data_gcide_article_senses(dict + e[b].off, (size_t)e[b].len, s_collect_sense, &c);
        if (c.kept) {
            g->words = carls_grow(g->words, &words_cap, g->n_words + 1, sizeof *g->words);
            g->senses = carls_grow(g->senses, &senses_cap, g->n_senses + c.kept, sizeof *g->senses);
            for (size_t k = 0; k < c.kept; k++)
                g->senses[g->n_senses++] = (data_gcide_sense_t){(uint32_t)g->n_words, (uint32_t)k + 1, false};
            g->words[g->n_words++] = strdup(c.word);
        }
        a = b;
    }
    free(c.tok.p);
    free(c.masked.p);
    int rc = 0;
    if (g->n_senses == 0) {
        rc = carls_errorf(err, errlen, -1, "the dictionary holds no definitions");
    } else {
        rc = data_text_from_buffer(c.text.p, c.text.len, &g->text, err, errlen);
        /* s_tokenize keeps only lines data_text also keeps: one text line per sense. */
        assert(rc != 0 || g->text->n_lines == g->n_senses);
    }
    free(c.text.p);
    g->word_first_sense = carls_xcalloc(g->n_words + 1, sizeof *g->word_first_sense);
    for (size_t s = 0; s < g->n_senses; s++)
        g->word_first_sense[g->senses[s].word + 1] = s + 1;
    return rc;
}

int data_gcide_load(const char *index_path, const char *dict_path, data_gcide_t **out, char *err, size_t errlen)
{
    *out = NULL;
    index_path = index_path ? index_path : DATA_GCIDE_INDEX;
    dict_path = dict_path ? dict_path : DATA_GCIDE_DICT;
    int64_t t0 = carls_monotonic_us();
    data_gcide_t *g = carls_xcalloc(1, sizeof *g);
    s_buf_t idx = {0}, dict = {0};
    s_entry_t *e = NULL;
    size_t n = 0;
    int rc = s_read_file(index_path, &idx, err, errlen);
    if (rc == 0)
        rc = s_read_gz(dict_path, &dict, err, errlen);
    if (rc == 0)
        rc = s_parse_index(idx.p, idx.len, dict.len, index_path, &e, &n, &g->stats, err, errlen);
    if (rc == 0) {
        qsort(e, n, sizeof *e, s_entry_by_article);
        n = s_choose_owners(e, n, dict.p);
        g->stats.articles = n;
        qsort(e, n, sizeof *e, s_entry_by_word);
        rc = s_build(g, e, n, dict.p, err, errlen);
    }
    free(e);
    free(idx.p);
    free(dict.p);
    if (rc) {
        data_gcide_destroy(&g);
        return rc;
    }
    g->stats.load_ms = (double)(carls_monotonic_us() - t0) / 1000.0;
    *out = g;
    return 0;
}

void data_gcide_destroy(data_gcide_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    data_gcide_t *g = *self_p;
    for (size_t w = 0; g->words && w < g->n_words; w++)
        free(g->words[w]);
    free(g->words);
    free(g->senses);
    free(g->word_first_sense);
    data_text_destroy(&g->text);
    free(g);
    *self_p = NULL;
}

long data_gcide_find(const data_gcide_t *g, const char *word)
{
    size_t lo = 0, hi = g->n_words;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->words[mid], word);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Hold-out                                                                                             */

static void s_clear_holdout(data_gcide_t *g)
{
    for (size_t s = 0; s < g->n_senses; s++)
        g->senses[s].held_out = false;
    g->n_held_out = 0;
}

static size_t s_sense_count(const data_gcide_t *g, size_t w)
{
    return g->word_first_sense[w + 1] - g->word_first_sense[w];
}

int data_gcide_holdout_seed(data_gcide_t *g, uint64_t seed, size_t count, char *err, size_t errlen)
{
    s_clear_holdout(g);
    uint32_t *eligible = carls_xmalloc((g->n_words + 1) * sizeof *eligible);
    size_t n = 0;
    for (size_t w = 0; w < g->n_words; w++)
        if (s_sense_count(g, w) >= 2)
            eligible[n++] = (uint32_t)w;
    if (n < count) {
        free(eligible);
        return carls_errorf(err, errlen, -1, "only %zu headwords have two or more senses; cannot hold out %zu", n, count);
    }
    uint64_t state = seed;
    carls_shuffle_u32(eligible, n, &state);
    for (size_t i = 0; i < count; i++) {
        size_t w = eligible[i];
        size_t k = (size_t)(carls_splitmix64(&state) % s_sense_count(g, w));
        g->senses[g->word_first_sense[w] + k].held_out = true;
    }
    g->n_held_out = count;
    free(eligible);
    return 0;
}

/* Marks one "headword<TAB>number" line's sense; -1 with the reason (without file:line) in err. */
static int s_holdout_line(data_gcide_t *g, char *line, char *err, size_t errlen)
{
    char *tab = strchr(line, '\t');
    if (!tab)
        return carls_errorf(err, errlen, -1, "expected \"headword<TAB>sense number\"");
    *tab = '\0';
    uint64_t number;
    if (carls_parse_u64(tab + 1, &number) != 0 || number == 0)
        return carls_errorf(err, errlen, -1, "bad sense number \"%s\"", tab + 1);
    long w = data_gcide_find(g, line);
    if (w < 0)
        return carls_errorf(err, errlen, -1, "unknown headword \"%s\"", line);
    if (number > s_sense_count(g, (size_t)w))
        return carls_errorf(err, errlen, -1, "\"%s\" has %zu senses, not %llu", line, s_sense_count(g, (size_t)w),
                      (unsigned long long)number);
    data_gcide_sense_t *s = &g->senses[g->word_first_sense[w] + number - 1];
    if (s->held_out)
        return carls_errorf(err, errlen, -1, "\"%s\" sense %llu is listed twice", line, (unsigned long long)number);
    s->held_out = true;
    g->n_held_out++;
    return 0;
}

/* The first headword left with no training sense, or -1. */
static long s_word_without_training(const data_gcide_t *g)
{
    for (size_t w = 0; w < g->n_words; w++) {
        size_t s = g->word_first_sense[w];
        while (s < g->word_first_sense[w + 1] && g->senses[s].held_out)
            s++;
        if (s == g->word_first_sense[w + 1] && s > g->word_first_sense[w]) /* a candidate without senses: fine */
            return (long)w;
    }
    return -1;
}

int data_gcide_holdout_file(data_gcide_t *g, const char *path, char *err, size_t errlen)
{
    s_clear_holdout(g);
    FILE *f = fopen(path, "r");
    if (!f)
        return carls_errorf(err, errlen, -1, "%s: %s", path, strerror(errno));
    char line[512], why[256];
    int rc = 0;
    for (unsigned no = 1; rc == 0 && fgets(line, sizeof line, f); no++) {
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            rc = carls_errorf(err, errlen, -1, "%s:%u: line too long", path, no);
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (s_holdout_line(g, line, why, sizeof why) != 0)
            rc = carls_errorf(err, errlen, -1, "%s:%u: %s", path, no, why);
    }
    if (rc == 0 && ferror(f))
        rc = carls_errorf(err, errlen, -1, "%s: %s", path, strerror(errno));
    fclose(f);
    long w = rc == 0 ? s_word_without_training(g) : -1;
    if (w >= 0)
        rc = carls_errorf(err, errlen, -1, "%s: every sense of \"%s\" is held out; it needs one for training", path,
                    g->words[w]);
    if (rc)
        s_clear_holdout(g);
    return rc;
}

int data_gcide_holdout_write(const data_gcide_t *g, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "# GCIDE held-out senses: headword<TAB>sense number (%zu)\n", g->n_held_out);
    for (size_t s = 0; s < g->n_senses; s++)
        if (g->senses[s].held_out)
            fprintf(f, "%s\t%u\n", g->words[g->senses[s].word], g->senses[s].number);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return -1;
    return 0;
}
