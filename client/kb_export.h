/* Portable snapshot files of one knowledge-bank table ("exports"), written by `kbctl export` and read by
 * `kbctl import`, so a table can move between banks, machines and shard counts.
 *
 * The byte layout is described at the top of kb_export.c. In short: a magic, a format version, the table's
 * name and config (a packed carls.TableConfig), the rows (key, version, frequency, then dim float32 values or
 * a packed carls.FeatureRecord), and a trailer with the row count and a CRC-32 of everything before it.
 * Every integer and float is little-endian, whatever the host.
 *
 * What a file carries (format 2): each row's key, its values (embedding tables) or feature record (feature
 * tables, with its version, label, neighbours and data as stored), its version, its frequency (lookups and
 * gradient rows seen), its updated_at_ms, its optimizer state (momentum, AdaGrad accumulators, Adam moments)
 * with the steps taken, and its pending (not yet applied) gradients, all read together under the row's lock
 * by the server's scan; and the table's config. Importing a format-2 file restores every one of them
 * (import_rows), into any shard count, so an imported table trains on exactly as the original would
 * (docs/STATE.md "Export and import"). Format-1 files (values, versions and frequencies only) are still read
 * and import as before: values through put, without optimizer state, pending gradients or frequencies.
 *
 * Writing: the file is created 0600 under a temporary name beside the target, written, fsynced, renamed
 * over the target, and the directory is fsynced, so a crash leaves either the old file or the whole new one.
 *
 * Reading: kb_export_reader_open reads the whole file once and verifies everything (magic, version, every
 * declared length against its cap and against the bytes that remain, the row structure, each feature record
 * decoding, the row count and the CRC-32) BEFORE it returns, so an importer can refuse a bad file before it
 * writes anything. Rows are then read by a second pass (kb_export_reader_next), which checks the same again;
 * if the file changed in between, that pass fails (at the latest at its end, on the checksum).
 *
 * Return convention: 0 on success, a negative KB_EXPORT_E* code on failure with a one-line message in err
 * (errlen bytes; err may be NULL when errlen is 0). */
#ifndef KB_EXPORT_H
#define KB_EXPORT_H

#include "carls.pb-c.h"
#include "kb_cluster.h"
#include "progress.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_EXPORT_MAGIC "CARLSKBX"     /* 8 bytes at offset 0, no terminator in the file */
#define KB_EXPORT_END_MAGIC "CARLSEND" /* 8 bytes starting the trailer */
#define KB_EXPORT_VERSION 2u         /* what the writer writes; the reader reads 1 and 2 */
#define KB_EXPORT_MIN_VERSION 1u
#define KB_EXPORT_MAX_OPT_FACTOR 8u  /* a row's optimizer floats are at most this times dim (Adam: 2) */
#define KB_EXPORT_MAX_CONFIG_BYTES (1u << 20)  /* a packed TableConfig is a few dozen bytes */
#define KB_EXPORT_MAX_RECORD_BYTES (64u << 20) /* a packed FeatureRecord: the protocol's message cap */

enum {
    KB_EXPORT_OK = 0,
    KB_EXPORT_EIO = -1,        /* open/read/write/fsync/rename failed (errno in the message) */
    KB_EXPORT_EMAGIC = -2,     /* not an export file */
    KB_EXPORT_EVERSION = -3,   /* a format version this build does not read */
    KB_EXPORT_ETRUNCATED = -4, /* shorter than its contents say (or a length runs past the end) */
    KB_EXPORT_ECHECKSUM = -5,  /* CRC-32 mismatch */
    KB_EXPORT_ECORRUPT = -6,   /* lengths over their caps, a config or record that does not decode, a row
                                  count that disagrees with the rows, bytes left between rows and trailer */
    KB_EXPORT_EINVAL = -7,     /* bad arguments from the caller */
    KB_EXPORT_EBANK = -8,      /* kb_export_table / kb_import_table: the bank failed or refused (the message
                                  holds kb_cluster_last_error) */
};

/* ---- writing -------------------------------------------------------------------------------------------- */

typedef struct kb_export_writer kb_export_writer_t;

/* Starts an export of table (name, 1..128 bytes) with config cfg (kind, and dim 1..CARLS_DEFAULT_MAX_DIM for
 * an embedding table) to path, through a temporary file created 0600 beside it. Caller owns *out. */
int kb_export_writer_open(const char *path, const char *table, const Carls__TableConfig *cfg,
                          kb_export_writer_t **out, char *err, size_t errlen);

/* Appends one row. Embedding tables: values holds dim finite floats and record is NULL. Feature tables:
 * record is the row's record (its `found` flag is not stored) and values is NULL. key is 1..
 * CARLS_DEFAULT_MAX_KEY_BYTES bytes. */
int kb_export_writer_add(kb_export_writer_t *self, const void *key, size_t key_len, uint64_t version,
                         uint64_t frequency, const float *values, const Carls__FeatureRecord *record, char *err,
                         size_t errlen);

/* A row's whole state besides its key and payload (format 2). */
typedef struct {
    uint64_t version;
    uint64_t frequency;
    int64_t updated_at_ms;     /* >= 0 */
    uint64_t opt_steps;
    uint32_t opt_floats;       /* 0..KB_EXPORT_MAX_OPT_FACTOR * dim; 0 for feature tables */
    const float *opt_state;    /* opt_floats finite floats */
    uint32_t pending_count;    /* 0..CARLS_MAX_PENDING_LIMIT; 0 for feature tables */
    const float *pending;      /* pending_count * dim finite floats, oldest first */
} kb_export_state_t;

/* Appends one row with its whole state (kb_export_writer_add is this with version and frequency only: no
 * optimizer state, none pending, updated_at 0). Every row of a file has the same opt_floats. */
int kb_export_writer_add_state(kb_export_writer_t *self, const void *key, size_t key_len, const float *values,
                               const Carls__FeatureRecord *record, const kb_export_state_t *state, char *err,
                               size_t errlen);

/* Rows appended so far. */
uint64_t kb_export_writer_rows(const kb_export_writer_t *self);

/* Writes the trailer, fsyncs, renames the temporary file to the path and fsyncs the directory. After
 * success or failure only kb_export_writer_destroy may be called. */
int kb_export_writer_finish(kb_export_writer_t *self, char *err, size_t errlen);

/* Frees the writer; an unfinished export's temporary file is removed (the target is untouched). Accepts
 * NULL and *self_p == NULL; nulls *self_p. */
void kb_export_writer_destroy(kb_export_writer_t **self_p);

/* ---- reading -------------------------------------------------------------------------------------------- */

typedef struct kb_export_reader kb_export_reader_t;

/* One row, valid until the next kb_export_reader_next or destroy. */
typedef struct {
    const uint8_t *key;
    size_t key_len;
    uint64_t version;
    uint64_t frequency;
    const float *values;   /* embedding tables: dim floats (host order); NULL for feature tables */
    const uint8_t *record; /* feature tables: the packed FeatureRecord (verified to decode); NULL otherwise */
    size_t record_len;
    /* Format 2 (zero in format-1 files): */
    int64_t updated_at_ms;
    uint64_t opt_steps;
    uint32_t opt_floats;     /* the same in every row of a file */
    const float *opt_state;  /* opt_floats floats (host order); NULL when 0 */
    uint32_t pending_count;
    const float *pending;    /* pending_count * dim floats (host order); NULL when 0 */
} kb_export_row_t;

/* Opens path and verifies the whole file (see the top of this file). Caller owns *out. */
int kb_export_reader_open(const char *path, kb_export_reader_t **out, char *err, size_t errlen);

/* The exported table's name and config (owned by the reader). */
const char *kb_export_reader_table(const kb_export_reader_t *self);
const Carls__TableConfig *kb_export_reader_config(const kb_export_reader_t *self);

/* The file's format version (1 or 2). */
uint32_t kb_export_reader_version(const kb_export_reader_t *self);

/* Rows in the file (from the verified trailer). */
uint64_t kb_export_reader_rows(const kb_export_reader_t *self);

/* Reads the next row into *row: returns 1 with a row, 0 at the end (after checking the trailer and the
 * checksum again), or a negative code. */
int kb_export_reader_next(kb_export_reader_t *self, kb_export_row_t *row, char *err, size_t errlen);

/* Frees the reader; accepts NULL and *self_p == NULL; nulls *self_p. */
void kb_export_reader_destroy(kb_export_reader_t **self_p);

/* ---- whole tables ----------------------------------------------------------------------------------- */

/* Exports table from bank (every shard, read with scan pages of `page` rows; 0 means 1000) to path, in
 * format 2: every row with its whole state (a server too old to send it gives rows without optimizer state
 * or pending gradients, which import with a fresh state). *rows_out (may be NULL) gets the rows written.
 * Each row is consistent in itself (read under its lock), but the table is not one point in time: rows
 * written meanwhile may or may not be included, at their state before or after the write (docs/STATE.md:
 * export from a --read-only server or a restored snapshot for one point in time). On failure path is
 * untouched (the temporary file is removed). */
int kb_export_table(kb_cluster_t *bank, const char *table, const char *path, uint32_t page, uint64_t *rows_out,
                    carls_progress_t *progress, char *err, size_t errlen);

/* Exports embedding table from bank as NumPy: npy_path gets the values, float32 (N, dim), and keys_path the N
 * keys, one a line in the same order (the keys file `kbctl put --npy --keys` and `kbctl import` read). Keys
 * holding a newline, or ending in a carriage return, cannot be written so: KB_EXPORT_EINVAL naming the key's
 * row, nothing written. Both files are written atomically, the values first; on failure neither is changed
 * (a failure between the two renames leaves the new values beside the old keys: the message says so).
 * Feature tables: KB_EXPORT_EINVAL. Scans as kb_export_table, with the same progress. */
int kb_export_table_npy(kb_cluster_t *bank, const char *table, const char *npy_path, const char *keys_path,
                        uint32_t page, uint64_t *rows_out, carls_progress_t *progress, char *err, size_t errlen);

/* Imports the file at path into table of bank: verifies the whole file first (nothing is sent for a bad
 * file), creates the table with the file's config unless it exists with that same config (another config:
 * KB_EXPORT_EBANK, nothing written), then writes the rows in batches of `batch` rows (0 means 1000;
 * fewer once a batch holds 4 Mi floats or 16 MiB of records) routed by the bank's current shard count. Format 2: every row with
 * its whole state through kb_cluster_import_rows (exactly once per shard). Format 1: embedding rows with
 * kb_cluster_put (one request per version within a batch, since a put carries one version), feature records
 * with kb_cluster_feature_put; frequencies are not restored. Rows of the table with keys not in the file
 * stay. *rows_out (may be NULL) gets the rows written, also on failure (how far it got).
 *
 * Both report to progress (may be NULL) as they go: they start it (rows; an import knows the total, an export
 * does not) and finish it (base/progress.h: a line redrawn on a terminal, log lines otherwise). */
int kb_import_table(kb_cluster_t *bank, const char *table, const char *path, size_t batch, uint64_t *rows_out,
                    carls_progress_t *progress, char *err, size_t errlen);

#endif
