/* Plain-text corpora (see data_text.h). */
#include "data_text.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "util.h"

/* A byte that belongs to words: letters, apostrophes and any non-ASCII byte. */
static inline bool s_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '\'' || c >= 0x80;
}

int data_text_word_at(const char *text, size_t len, size_t *pos, size_t *start, size_t *end)
{
    size_t i = *pos;
    if (!s_word_byte((unsigned char)text[i]))
        return 0;
    size_t s = i;
    while (i < len && s_word_byte((unsigned char)text[i]))
        i++;
    size_t e = i;
    while (s < e && text[s] == '\'')
        s++;
    while (e > s && text[e - 1] == '\'')
        e--;
    *pos = i;
    *start = s;
    *end = e;
    return 1;
}

size_t data_text_strip_bible(const char *raw, size_t len, char *out)
{
    size_t o = 0;
    size_t i = 0;
    while (i < len) {
        size_t end = i;
        while (end < len && raw[end] != '\n')
            end++;
        size_t p = i;
        while (p < end && (raw[p] == ' ' || raw[p] == '\t'))
            p++;
        size_t digits = p;
        while (p < end && raw[p] >= '0' && raw[p] <= '9')
            p++;
        /* A verse line: indentation, a verse number, one space, the text. Headings start with a letter. */
        if (p > digits && digits > i && p < end && raw[p] == ' ') {
            p++;
            memcpy(out + o, raw + p, end - p);
            o += end - p;
            out[o++] = '\n';
        }
        i = end + 1;
    }
    return o;
}

int data_text_from_buffer(const char *raw, size_t len, data_text_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (len >= UINT32_MAX)
        return carls_errorf(err, errlen, -1, "corpus of %zu bytes is over the 4 GiB limit", len);
    data_text_t *t = carls_xcalloc(1, sizeof *t);
    /* Every token is followed by one separator; the separators of most tokens replace a non-word byte of the
     * input, except after the pieces a long run is cut into (one per DATA_TEXT_MAX_TOKEN bytes). */
    t->text = carls_xmalloc(len + len / DATA_TEXT_MAX_TOKEN + 2);
    size_t tok_cap = 0, line_cap = 0;
    size_t o = 0;
    size_t line_first = 0; /* first token of the current line */
    size_t i = 0;
    while (i <= len) {
        if (i == len || raw[i] == '\n') {
            if (t->n_tokens > line_first) {
                t->line_start = carls_grow(t->line_start, &line_cap, t->n_lines + 2, sizeof *t->line_start);
                t->line_start[t->n_lines++] = line_first;
                t->text[o - 1] = '\n'; /* the separator after the line's last token */
                line_first = t->n_tokens;
            }
            i++;
            continue;
        }
        size_t s, e;
        if (!data_text_word_at(raw, len, &i, &s, &e)) {
            i++;
            continue;
        }
        while (s < e) {
            size_t piece = e - s > DATA_TEXT_MAX_TOKEN ? DATA_TEXT_MAX_TOKEN : e - s;
            if (t->n_tokens + 1 > tok_cap) {
                t->tok_off = carls_grow(t->tok_off, &tok_cap, t->n_tokens + 1, sizeof *t->tok_off);
                t->tok_len = carls_xrealloc(t->tok_len, tok_cap);
            }
            t->tok_off[t->n_tokens] = (uint32_t)o;
            t->tok_len[t->n_tokens] = (uint8_t)piece;
            t->n_tokens++;
            for (size_t k = 0; k < piece; k++) {
                unsigned char c = (unsigned char)raw[s + k];
                t->text[o++] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
            }
            t->text[o++] = ' ';
            s += piece;
        }
    }
    t->text_len = o;
    t->text[o] = '\0';
    if (t->n_tokens == 0) {
        data_text_destroy(&t);
        return carls_errorf(err, errlen, -1, "the corpus holds no words");
    }
    t->line_start = carls_grow(t->line_start, &line_cap, t->n_lines + 1, sizeof *t->line_start);
    t->line_start[t->n_lines] = t->n_tokens;
    *out = t;
    return 0;
}

static bool s_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Reads a whole stream into a malloc'ed buffer. Returns 0 or -1 (errno set by the read). */
static int s_read_all(FILE *f, char **buf_out, size_t *len_out)
{
    size_t cap = 1 << 20, len = 0;
    char *buf = carls_xmalloc(cap);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = carls_xrealloc(buf, cap);
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                free(buf);
                return -1;
            }
            break;
        }
    }
    *buf_out = buf;
    *len_out = len;
    return 0;
}

int data_text_check_utf8(const char *name, const char *buf, size_t len, char *err, size_t errlen)
{
    const unsigned char *p = (const unsigned char *)buf;
    size_t line = 1;
    for (size_t i = 0; i < len;) {
        unsigned char c = p[i];
        if (c == '\n')
            line++;
        if (c == 0)
            return carls_errorf(err, errlen, -1, "%s: line %zu: a NUL byte (not a text file?)", name, line);
        if (c < 0x80) {
            i++;
            continue;
        }
        /* lead byte: 2, 3 or 4 byte sequence; no overlongs, no surrogates, at most U+10FFFF */
        size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        bool ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++)
            ok = (p[i + k] & 0xc0) == 0x80;
        if (ok && n == 3)
            ok = !(c == 0xe0 && p[i + 1] < 0xa0) && !(c == 0xed && p[i + 1] >= 0xa0);
        if (ok && n == 4)
            ok = !(c == 0xf0 && p[i + 1] < 0x90) && !(c == 0xf4 && p[i + 1] >= 0x90);
        if (!ok)
            return carls_errorf(err, errlen, -1, "%s: line %zu: not UTF-8 (byte 0x%02x at offset %zu)", name, line,
                                c, i);
        i += n;
    }
    return 0;
}

/* Paths of the regular files under dir (recursively, hidden names skipped), appended to *paths. */
static int s_list_files(const char *dir, char ***paths, size_t *n, size_t *cap, char *err, size_t errlen)
{
    struct dirent **ents = NULL;
    int k = scandir(dir, &ents, NULL, alphasort);
    if (k < 0)
        return carls_errorf(err, errlen, -1, "cannot read directory %s: %s", dir, strerror(errno));
    int rc = 0;
    for (int i = 0; i < k; i++) {
        if (rc == 0 && ents[i]->d_name[0] != '.') {
            size_t len = strlen(dir) + strlen(ents[i]->d_name) + 2;
            char *path = carls_xmalloc(len);
            snprintf(path, len, "%s/%s", dir, ents[i]->d_name);
            struct stat st;
            if (stat(path, &st) != 0) {
                rc = carls_errorf(err, errlen, -1, "cannot stat %s: %s", path, strerror(errno));
                free(path);
            } else if (S_ISDIR(st.st_mode)) {
                rc = s_list_files(path, paths, n, cap, err, errlen);
                free(path);
            } else if (S_ISREG(st.st_mode)) {
                *paths = carls_grow(*paths, cap, *n + 1, sizeof **paths);
                (*paths)[(*n)++] = path;
            } else {
                free(path);
            }
        }
        free(ents[i]);
    }
    free(ents);
    return rc;
}

/* Reads every text file under dir (sorted by path), each checked as UTF-8, into one buffer with a newline
 * between files. */
static int s_read_dir(const char *dir, char **raw_out, size_t *len_out, char *err, size_t errlen)
{
    char **paths = NULL;
    size_t n = 0, cap = 0, len = 0;
    char *raw = NULL;
    int rc = s_list_files(dir, &paths, &n, &cap, err, errlen);
    if (rc == 0 && n == 0)
        rc = carls_errorf(err, errlen, -1, "%s: no files in the directory", dir);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        FILE *f = fopen(paths[i], "rb");
        char *buf = NULL;
        size_t got = 0;
        if (!f || s_read_all(f, &buf, &got) != 0) {
            rc = carls_errorf(err, errlen, -1, "cannot read %s: %s", paths[i], strerror(errno));
        } else if (data_text_check_utf8(paths[i], buf, got, err, errlen) != 0) {
            rc = -1;
        } else {
            raw = carls_xrealloc(raw, len + got + 2);
            memcpy(raw + len, buf, got);
            len += got;
            raw[len++] = '\n';
        }
        if (f)
            fclose(f);
        free(buf);
    }
    for (size_t i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
    if (rc != 0) {
        free(raw);
        return rc;
    }
    *raw_out = raw;
    *len_out = len;
    return 0;
}

int data_text_load(const char *source, data_text_t **out, char *err, size_t errlen)
{
    *out = NULL;
    char *raw = NULL;
    size_t len = 0;
    if (strcmp(source, "kjv") == 0) {
        FILE *p = popen(DATA_TEXT_KJV_COMMAND " 2>/dev/null", "r");
        if (!p)
            return carls_errorf(err, errlen, -1, "cannot run '%s': %s", DATA_TEXT_KJV_COMMAND, strerror(errno));
        int rrc = s_read_all(p, &raw, &len);
        int status = pclose(p);
        if (rrc != 0 || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || len == 0) {
            free(raw);
            return carls_errorf(err, errlen, -1,
                          "'%s' failed (status %d); install Debian's bible-kjv and bible-kjv-text "
                          "(scripts/setup.sh)",
                          DATA_TEXT_KJV_COMMAND, status);
        }
        char *verses = carls_xmalloc(len + 1);
        size_t n = data_text_strip_bible(raw, len, verses);
        free(raw);
        raw = verses;
        len = n;
    } else if (s_is_dir(source)) {
        if (s_read_dir(source, &raw, &len, err, errlen) != 0)
            return -1;
    } else {
        FILE *f = fopen(source, "rb");
        if (!f)
            return carls_errorf(err, errlen, -1, "cannot open %s: %s", source, strerror(errno));
        int rrc = s_read_all(f, &raw, &len);
        int saved = errno;
        fclose(f);
        if (rrc != 0)
            return carls_errorf(err, errlen, -1, "cannot read %s: %s", source, strerror(saved));
        if (data_text_check_utf8(source, raw, len, err, errlen) != 0) {
            free(raw);
            return -1;
        }
    }
    int rc = data_text_from_buffer(raw, len, out, err, errlen);
    free(raw);
    return rc;
}

void data_text_destroy(data_text_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    data_text_t *t = *self_p;
    free(t->text);
    free(t->tok_off);
    free(t->tok_len);
    free(t->line_start);
    free(t);
    *self_p = NULL;
}

void data_text_slice(const data_text_t *self, uint32_t worker, uint32_t workers, size_t *first, size_t *end)
{
    /* Line l goes to the worker whose share of the tokens holds the line's first token. */
    size_t lo = (size_t)((double)self->n_tokens * worker / workers);
    size_t hi = (size_t)((double)self->n_tokens * (worker + 1) / workers);
    size_t a = 0;
    while (a < self->n_lines && self->line_start[a] < lo)
        a++;
    size_t b = a;
    while (b < self->n_lines && self->line_start[b] < hi)
        b++;
    if (worker + 1 == workers)
        b = self->n_lines;
    *first = a;
    *end = b;
}
