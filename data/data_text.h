/* Plain-text corpora for dictionary-free word embeddings (trainer word2vec).
 *
 * A corpus is held as one normalized text buffer plus two flat arrays: where each token starts (and how
 * long it is) and where each line's tokens start. Nothing maps a word to an id: two occurrences of a word
 * are two tokens that happen to spell the same bytes. That is the point of DynamicEmbedding (§3.1): the
 * vocabulary lives in the knowledge bank, keyed by the word itself, and the trainer never builds one.
 *
 * Tokenization (the same for every source, and what `trainer word2vec --tokenize-only` prints so another
 * tool, e.g. fastText, can be fed exactly the same words):
 *   - ASCII letters are lowercased; letters, apostrophes and every byte >= 0x80 (UTF-8 text passes through
 *     unchanged) form words; any other byte separates words. A newline ends a line.
 *   - Apostrophes at the start or end of a word are dropped ("'tis" -> "tis", "brethren'" -> "brethren");
 *     a word left empty is no word.
 *   - Lines are sentences: training windows never cross a line. Empty lines are dropped.
 *
 * Sources: a UTF-8 text file; a directory, whose regular files (recursively, sorted by path, names starting
 * with '.' skipped) are read one after the other as one corpus, a file's last line never joined to the next
 * file's first; or the name "kjv": the King James Bible as Debian's bible-kjv program prints it
 * (`bible -l100000 gen1:1-rev22:21`, package bible-kjv with bible-kjv-text). Its output has chapter
 * headings ("Genesis 1"), blank lines and verse lines ("  1 In the beginning ..."); only verse lines are
 * kept, without their numbers, one verse per line (31,102 verses, about 790k words).
 *
 * Limits: a token is at most DATA_TEXT_MAX_TOKEN bytes (longer runs are cut into pieces of that size), a
 * corpus at most 4 GiB of text. */
#ifndef CARLS_DATA_TEXT_H
#define CARLS_DATA_TEXT_H

#include <stddef.h>
#include <stdint.h>

#define DATA_TEXT_MAX_TOKEN 255u

/* The command that prints the KJV text (verse references included; data_text strips them). */
#define DATA_TEXT_KJV_COMMAND "bible -l100000 gen1:1-rev22:21"

typedef struct {
    char *text;           /* normalized text: tokens separated by single spaces/newlines; owned */
    size_t text_len;      /* bytes in text (NUL-terminated besides) */
    uint32_t *tok_off;    /* (n_tokens) offset of each token in text */
    uint8_t *tok_len;     /* (n_tokens) its length in bytes, 1..DATA_TEXT_MAX_TOKEN */
    size_t n_tokens;
    size_t *line_start;   /* (n_lines + 1) first token of each line; line_start[n_lines] == n_tokens */
    size_t n_lines;
} data_text_t;

/* Tokenizes len bytes of raw text (see the rules above) into a new corpus. Caller owns *out (free with
 * data_text_destroy). Returns 0, or -1 with a reason in err (text over 4 GiB). */
int data_text_from_buffer(const char *raw, size_t len, data_text_t **out, char *err, size_t errlen);

/* Checks that len bytes of buf (named name in messages) are UTF-8 without NUL bytes; 0, or -1 with
 * "NAME: line L: not UTF-8 (byte 0x.. at offset O)" in err. */
int data_text_check_utf8(const char *name, const char *buf, size_t len, char *err, size_t errlen);

/* Reads a file or a directory of files (source is a path; each file must be UTF-8, else the message names the
 * file and the line) or the KJV (source is "kjv": runs DATA_TEXT_KJV_COMMAND and keeps the verse
 * lines). Caller owns *out. Returns 0, or -1 with a reason in err (unreadable file, bible program missing
 * or failing, an empty corpus). */
int data_text_load(const char *source, data_text_t **out, char *err, size_t errlen);

/* Keeps only the verse text of `bible` output: lines "<spaces><number> <text>" become "<text>", every other
 * line (chapter headings, blank lines) is dropped. Writes into out (at least len bytes) and returns the
 * number of bytes written. Exposed for tests. */
size_t data_text_strip_bible(const char *raw, size_t len, char *out);

/* The word rule above, for other tokenizers that must split exactly like this one (data_gcide): when
 * text[*pos] (*pos < len) belongs to words, finds the run of word bytes starting there, sets [*start, *end)
 * to it without its outer apostrophes (empty for a run of apostrophes alone), moves *pos past the run and
 * returns 1; otherwise returns 0 and leaves everything as it was. Case is left to the caller. */
int data_text_word_at(const char *text, size_t len, size_t *pos, size_t *start, size_t *end);

/* Frees the corpus; accepts NULL and *self_p == NULL; nulls *self_p. */
void data_text_destroy(data_text_t **self_p);

/* The lines [*first, *end) that worker `worker` of `workers` trains on: contiguous slices with as nearly
 * equal token counts as whole lines allow. worker < workers. */
void data_text_slice(const data_text_t *self, uint32_t worker, uint32_t workers, size_t *first, size_t *end);

/* Token i's bytes (not NUL-terminated). */
static inline const char *data_text_token(const data_text_t *self, size_t i)
{
    return self->text + self->tok_off[i];
}

#endif
