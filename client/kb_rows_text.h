/* Text rows for kbctl and scripts: "KEY<TAB>v1 v2 ... vdim", one row per line.
 *
 * Format (read):
 *   - A line is everything up to '\n'; a trailing '\r' is dropped (files written on Windows).
 *   - An empty line is skipped (so a stray blank line at the end of a file is harmless).
 *   - Row lines: the key is every byte before the first TAB; it must be non-empty and at most
 *     CARLS_DEFAULT_MAX_KEY_BYTES long. After the TAB come exactly `dim` numbers separated by one or more
 *     spaces or TABs (leading and trailing blanks allowed). Each number is a C float literal (strtof) that
 *     is finite after conversion: "nan", "inf" and values that overflow a float are refused; values that
 *     underflow to a subnormal or zero are accepted, so every float kb_rows_write_row prints reads back
 *     exactly.
 *   - Key lines (kb_rows_read with keys_only): the whole line is the key (it may contain spaces or TABs).
 *
 * Format (write): kb_rows_write_row prints the key, a TAB, then the values separated by single spaces (no
 * newline, so a caller may add columns). Each value is written with "%g" when that reads back to the same
 * float bit for bit ("0.1" rather than "0.100000001"), otherwise with "%.9g", which is exact for every
 * float. So writing then reading gives the same bits. Keys are written as they are: a key holding a TAB or
 * newline cannot be read back as a row line.
 *
 * kb_rows_t holds parsed rows: the keys back to back in one buffer and the values row-major. It is also the
 * client's plain in-memory row set (kb_export's import batches keep their rows in one). */
#ifndef KB_ROWS_TEXT_H
#define KB_ROWS_TEXT_H

#include "carls.pb-c.h"
#include "kb_client.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    uint32_t dim;     /* values per row; 0 for a list of keys only */
    size_t n;         /* rows held */
    size_t cap;       /* rows allocated in key_off / key_len / values */
    char *key_bytes;  /* every key back to back (not NUL-terminated) */
    size_t key_bytes_len, key_bytes_cap;
    size_t *key_off;  /* (n) where key i starts in key_bytes */
    size_t *key_len;  /* (n) its length */
    float *values;    /* (n, dim) row-major; NULL while dim == 0 */
} kb_rows_t;

/* A new, empty set of rows of dimension dim (0: keys only). Caller owns it; free with kb_rows_destroy. */
kb_rows_t *kb_rows_new(uint32_t dim);

/* Frees rows; accepts NULL and *rows_p == NULL; nulls *rows_p. */
void kb_rows_destroy(kb_rows_t **rows_p);

/* Appends one row (values: dim floats, ignored when dim == 0; NULL appends zeros). Copies key and values. */
void kb_rows_append(kb_rows_t *rows, const void *key, size_t key_len, const float *values);

/* Forgets every row (keeps the memory for reuse). */
void kb_rows_clear(kb_rows_t *rows);

/* Key i (0 <= i < n) as a kb_key_t pointing into rows; valid until the next append or destroy. */
kb_key_t kb_rows_key(const kb_rows_t *rows, size_t i);

/* Parses one row line (without its '\n'; a trailing '\r' is allowed) of len bytes and appends it to rows.
 * rows->dim must be > 0. Returns 0, or -1 with a one-line reason (no line number) in err and rows
 * unchanged. An empty line is an error here; kb_rows_read skips empty lines before calling this. */
int kb_rows_parse_line(kb_rows_t *rows, const char *line, size_t len, char *err, size_t errlen);

/* Parses one key line (the whole line is the key, trailing '\r' dropped) and appends it (rows->dim == 0).
 * Returns 0, or -1 with a reason in err (empty or over-long key). */
int kb_rows_parse_key_line(kb_rows_t *rows, const char *line, size_t len, char *err, size_t errlen);

/* Reads every line of in, appending valid rows to rows (row lines when rows->dim > 0, key lines when
 * rows->dim == 0). Every invalid line is reported to errs as "line N: reason" (N counts from 1, blank
 * lines included), at most max_reports of them, then one "... and K more invalid lines" line; errs may be
 * NULL. Returns 0 when every line was valid, -1 when some line was not or reading failed (reported too);
 * *bad_lines_out (may be NULL) gets the number of invalid lines. On -1 the caller should send nothing. */
int kb_rows_read(kb_rows_t *rows, FILE *in, FILE *errs, size_t max_reports, size_t *bad_lines_out);

/* Room for any float formatted by kb_rows_format_float, with its NUL ("-1.17549435e-38" is 15 chars). */
#define KB_ROWS_FLOAT_CHARS 32

/* Writes v into buf (cap >= KB_ROWS_FLOAT_CHARS) with "%g" if that reads back (strtof) to the same bits,
 * else with "%.9g". Returns the length written. */
int kb_rows_format_float(float v, char *buf, size_t cap);

/* Writes "KEY<TAB>v1 v2 ... vdim" (no newline), values by kb_rows_format_float. Returns 0, or -1 when the
 * stream reports an error. */
int kb_rows_write_row(FILE *out, const void *key, size_t key_len, const float *values, uint32_t dim);

/* ---- feature lines -------------------------------------------------------------------------------------
 *
 * One feature record per line, for kbctl put-feature / get-feature:
 *
 *     KEY<TAB>FIELD FIELD ...          e.g.   node%2F7<TAB>label=3 confidence=0.9 version=2 neighbors=a:0.5,b:0.25 data=00ff
 *
 * KEY and every neighbour key are percent-encoded: a byte outside printable ASCII (0x21..0x7e), and each of
 * '%' ',' ':' '=', is written as %XX (two uppercase hex digits; a space is %20). Reading decodes %XX (either
 * case) and takes every other byte as it is, so any key of 1..CARLS_DEFAULT_MAX_KEY_BYTES bytes (after
 * decoding) can be written and read back; a '%' not followed by two hex digits is an error.
 *
 * Fields are NAME=VALUE, separated by one or more spaces or TABs, in any order, each at most once:
 *     label=I            integer label (int64)
 *     flabel=X           float label (a finite float; label and flabel exclude each other)
 *     confidence=X       label confidence (finite float)
 *     version=N          unsigned 64-bit version (e.g. the checkpoint step)
 *     neighbors=K:W,...  neighbour keys with finite float weights, in order; "neighbors=" is none
 *     data=HEX           opaque bytes, two hex digits per byte (written lowercase, read in either case)
 *     updated_at_ms=N    written with kb_feature_write_line's meta; read and ignored (the server stamps
 *                        its own time on every put)
 *     found=false        written for a key that has no record; it stands alone on its line, and such a line
 *                        is counted in `skipped` by the reader, not turned into a record
 * Floats are written as kb_rows_format_float writes them (exact round trip). Fields at their default (no
 * label, confidence 0, version 0, no neighbours, no data) are left out when writing, so an empty record is
 * "KEY<TAB>". A trailing '\r' is dropped and blank lines are skipped, as for rows.
 *
 * kb_feature_rows_t holds parsed lines: keys (decoded, in a kb_rows_t of dim 0) and one record per key, each
 * owned by the set (every array in it allocated by the parser). */

typedef struct {
    kb_rows_t *keys;                  /* decoded keys, dim 0 */
    Carls__FeatureRecord **records;   /* (keys->n) record i belongs to key i */
    size_t cap;                       /* room in records */
    size_t skipped;                   /* found=false lines read */
} kb_feature_rows_t;

/* An empty set. Caller owns it; free with kb_feature_rows_destroy. */
kb_feature_rows_t *kb_feature_rows_new(void);

/* Frees the set and every record in it; accepts NULL and *rows_p == NULL; nulls *rows_p. */
void kb_feature_rows_destroy(kb_feature_rows_t **rows_p);

/* Parses one feature line (without its '\n') of len bytes and appends its key and record to rows, or counts
 * a found=false line in rows->skipped. Returns 0, or -1 with a one-line reason in err and rows unchanged. */
int kb_feature_parse_line(kb_feature_rows_t *rows, const char *line, size_t len, char *err, size_t errlen);

/* Reads every line of in as kb_rows_read does (blank lines skipped, invalid lines reported as "line N:
 * reason" to errs, at most max_reports of them). Returns 0 when every line was valid, else -1. */
int kb_feature_rows_read(kb_feature_rows_t *rows, FILE *in, FILE *errs, size_t max_reports,
                         size_t *bad_lines_out);

/* Writes key percent-encoded (as described above). Returns 0, or -1 on a stream error. */
int kb_key_write_encoded(FILE *out, const void *key, size_t key_len);

/* Writes "KEY<TAB>fields" for rec (no newline): "found=false" when rec is NULL or not found; with meta, a
 * found record also gets updated_at_ms=. Returns 0, or -1 on a stream error. */
int kb_feature_write_line(FILE *out, const void *key, size_t key_len, const Carls__FeatureRecord *rec, bool meta);

#endif
