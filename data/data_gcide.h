/* GCIDE, the GNU Collaborative International Dictionary of English (Debian's dict-gcide), as a reverse
 * dictionary data set: (definition -> headword) pairs for trainer twotower (issue 7).
 *
 * Source files: DATA_GCIDE_INDEX (lines "headword<TAB>offset<TAB>length", offset and length in dictd's
 * base-64 digits) and DATA_GCIDE_DICT (dictzip, read with zlib as plain gzip; an uncompressed .dict works
 * too). Each index line points at one article; several lines may share an article and one headword may have
 * several articles (noun, verb, ...). An article shared by several index lines (inflections such as "Banked"
 * point at the verb Bank; "Banc", "Bancus" and "Bank" share one article) belongs to one headword only: the
 * first of them its header names ("Name \pro*nun"ci*a`tion\"), else the first in index order. Otherwise one
 * definition would be the right answer for several headwords (data_gcide.c says more).
 *
 * What is kept: headwords made of ASCII letters only (lowercased; "Abandon" and "abandon" are one word).
 * Each article's senses are its numbered definitions ("1. ...", "2. ..."; lettered sub-senses "(a) ..." are
 * part of their numbered sense), or its single unnumbered definition. Markup is stripped: the header line(s)
 * (headword, pronunciation \...\ and (...), part of speech, etymology [...]), source tags "[1913 Webster]",
 * "[PJC]", usage tags "[Obs.]", accent codes ("[a^]", "[\"e]" become their letter), braces of {cross-refs}
 * (the words stay), quotations (indented paragraphs and "--Author" citations), and "Note:", "Syn:",
 * "Usage:" paragraphs and "{Phrase}, ..." sub-entry paragraphs. Senses are numbered 1.. per headword in index
 * order across its articles.
 *
 * Masking: in every definition (training and held-out alike) the headword itself and every word sharing its
 * first five letters (any word starting with the headword when it is shorter than five letters) are removed,
 * or the task is trivial. A sense left with no token is dropped.
 *
 * Definitions are tokenized with data_text's rules (data_text.h): line s of `text` is sense s. */
#ifndef CARLS_DATA_GCIDE_H
#define CARLS_DATA_GCIDE_H

#include "data_text.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DATA_GCIDE_INDEX "/usr/share/dictd/gcide.index"
#define DATA_GCIDE_DICT "/usr/share/dictd/gcide.dict.dz"
#define DATA_GCIDE_MAX_WORD 64u  /* longer headwords are skipped */

typedef struct {
    uint32_t word;      /* index into words[] */
    uint32_t number;    /* 1-based sense number within its headword */
    bool held_out;      /* set by data_gcide_holdout_* */
} data_gcide_sense_t;

/* What the loader saw (trainer gcide-tfidf --stats prints it). */
typedef struct {
    size_t index_lines;          /* lines in the index */
    size_t articles;             /* articles with a letters-only headword, each counted once */
    size_t senses_parsed;        /* senses with at least one word before masking */
    size_t senses_with_headword; /* of those, senses in which masking removed a word */
    size_t senses_masked_empty;  /* senses dropped because masking left no word */
    double load_ms;              /* wall time of data_gcide_load */
} data_gcide_stats_t;

typedef struct {
    char **words;                 /* (n_words) headwords, lowercase a-z, sorted, unique; each has >= 1 sense;
                                   * each string malloc'ed (data_gcide_destroy frees them) */
    size_t n_words;
    data_gcide_sense_t *senses;   /* (n_senses) grouped by word, in sense-number order */
    size_t n_senses;
    size_t *word_first_sense;     /* (n_words + 1) senses of word w are [first[w], first[w + 1]) */
    data_text_t *text;            /* line s = the masked, tokenized definition of sense s */
    size_t n_held_out;
    data_gcide_stats_t stats;     /* zero in a data set built by hand */
} data_gcide_t;

/* Parses the dictionary. index_path/dict_path NULL mean the Debian paths above. Caller owns *out.
 * Returns 0, or -1 with a reason in err (missing file: names the package dict-gcide; corrupt data). */
int data_gcide_load(const char *index_path, const char *dict_path, data_gcide_t **out, char *err,
                    size_t errlen);

/* Holds out one sense for each of `count` headwords drawn (seeded, uniformly, without replacement) from the
 * headwords with at least two senses; the held-out sense is drawn uniformly from that word's senses. Clears
 * any earlier hold-out. Returns 0, or -1 when fewer than count headwords qualify. */
int data_gcide_holdout_seed(data_gcide_t *g, uint64_t seed, size_t count, char *err, size_t errlen);

/* Holds out the senses listed in a file of "headword<TAB>sense number" lines ('#' comments and blank lines
 * allowed). Every listed sense must exist (once) and its headword must keep at least one training sense.
 * Returns 0, or -1 with file:line and the reason in err; after an error nothing is held out. */
int data_gcide_holdout_file(data_gcide_t *g, const char *path, char *err, size_t errlen);

/* Writes the current hold-out in the format holdout_file reads. 0 or -1 (errno set). */
int data_gcide_holdout_write(const data_gcide_t *g, const char *path);

/* Index of headword `word` (lowercase) or -1 (binary search). */
long data_gcide_find(const data_gcide_t *g, const char *word);

/* ---- pieces exposed for tests ---- */

/* Splits one article (len bytes, as stored in the .dict) into cleaned, unmasked definitions: calls
 * fn(ctx, text, text_len) once per sense in order (fn may be NULL). A cleaned definition is one line,
 * single-spaced and trimmed, with its original case and punctuation; senses left empty by the cleaning are
 * not reported. Returns the number of senses. */
size_t data_gcide_article_senses(const char *article, size_t len,
                                 void (*fn)(void *ctx, const char *text, size_t text_len), void *ctx);

/* Removes the headword and the words masked with it (rule above) from a definition already lowercased
 * and tokenized into space-separated words; writes the result into out (at least strlen(def) + 1 bytes)
 * and returns the number of words removed. */
size_t data_gcide_mask(const char *headword, const char *def, char *out);

/* Decodes a dictd base-64 number ("Jyg"); -1 on a bad digit or overflow. */
int64_t data_gcide_b64(const char *s, size_t len);

void data_gcide_destroy(data_gcide_t **self_p);

#endif
