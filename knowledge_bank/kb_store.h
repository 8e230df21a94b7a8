/* SQLite persistence of one kb-server: tables, rows (value, metadata, optimizer state, pending gradients)
 * and the write de-duplication state of clients, in <data dir>/bank.sqlite (WAL mode).
 *
 * Schema (version 1):
 *   meta(k TEXT PRIMARY KEY, v)                         -- 'schema_version' = 1; 'journal_epoch': the last
 *                                                          journal epoch compacted into this file (kb_journal.h)
 *   tables(id INTEGER PRIMARY KEY, name TEXT UNIQUE, config BLOB)   -- config: packed carls.TableConfig
 *   rows(table_id, key BLOB, row_id, value BLOB, opt_state BLOB, opt_steps, pending BLOB, pending_count,
 *        version, updated_at, frequency, record BLOB, PRIMARY KEY(table_id, key)) WITHOUT ROWID
 *                                                       -- record: packed carls.FeatureRecord (feature tables)
 *   clients(client_id INTEGER PRIMARY KEY, max_seq, window BLOB)
 * Float blobs are the host's little-endian float32 arrays; `kbctl export` is the portable format.
 *
 * Writes happen in transactions opened by kb_store_begin and ended by kb_store_commit; one thread (the
 * bank's persister) uses the store at a time. In `sync` durability the connection runs with
 * synchronous=FULL so a commit is on disk when kb_store_commit returns; otherwise synchronous=NORMAL (a
 * commit survives a process crash but not necessarily a power loss). */
#ifndef KB_STORE_H
#define KB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_store kb_store_t;

/* One row as stored. Buffers are owned by whoever filled the record (see kb_store_row_free). */
typedef struct {
    int64_t table_id;
    uint8_t *key;
    uint32_t key_len;
    int64_t row_id;
    float *value;          /* dim */
    uint32_t dim;
    float *opt_state;      /* opt_floats */
    uint32_t opt_floats;
    uint64_t opt_steps;
    float *pending;        /* pending_count * dim */
    uint32_t pending_count;
    uint64_t version;
    int64_t updated_at_ms;
    uint64_t frequency;
    uint8_t *record;       /* feature tables: packed carls.FeatureRecord */
    uint32_t record_len;
    bool deleted;          /* kb_store_put_row deletes the row instead (eviction) */
    bool frequency_only;   /* kb_store_put_row updates only the stored row's frequency (key, row_id, frequency
                            * set; no buffers but the key): the bulk write of use counts changed by reads */
    bool superseded;       /* a newer write of the same row follows in the same compaction: skipped
                            * (kb_batch_mark_superseded; never encoded) */
} kb_store_row_t;

/* Frees the record's buffers (not the record). */
void kb_store_row_free(kb_store_row_t *row);

/* Opens (creating if needed) the database in dir, which must exist or be creatable (mode 0700).
 * Returns 0 or -1 with a message in err. */
int kb_store_open(const char *dir, bool sync, kb_store_t **out, char *err, size_t errlen);

/* Opens the existing database in dir for reading only (kb-server --read-only): nothing in dir is created,
 * written or removed, so the files' bytes stay as they are (docs/STATE.md "Read-only serving"). dir and
 * dir/bank.sqlite must exist (else -1 with a message saying so). How SQLite is kept off the files:
 *  - no WAL file, or an empty one (a clean shutdown): URI `immutable=1` -- SQLite opens bank.sqlite alone,
 *    O_RDONLY, takes no locks and never looks for -wal/-shm;
 *  - a WAL with frames (the writer was killed): URI `mode=ro&readonly_shm=1` -- bank.sqlite and the -wal are
 *    only read, the -shm is opened O_RDONLY (it must exist) and, since no writer holds it, SQLite rebuilds
 *    its index of the WAL in private heap memory instead of in the file; a read-only connection never
 *    checkpoints, so the WAL is neither applied nor removed at close.
 * No other process may change the files while the store is open. Only kb_store_load, kb_store_get_meta,
 * kb_store_last_error and kb_store_close may be used on the result; writes fail. */
int kb_store_open_read_only(const char *dir, kb_store_t **out, char *err, size_t errlen);
void kb_store_close(kb_store_t **self_p);

/* Loading at start-up. The callbacks receive borrowed data valid only during the call; a nonzero return
 * stops the load and is returned. Rows of tables that no longer exist are skipped. on_row NULL: rows are
 * not loaded (tables larger than memory load them table by table, kb_store_load_table). */
typedef int (*kb_store_table_fn)(void *ctx, int64_t id, const char *name, const uint8_t *config, size_t len);
typedef int (*kb_store_row_fn)(void *ctx, const kb_store_row_t *row);
typedef int (*kb_store_client_fn)(void *ctx, uint64_t client_id, uint64_t max_seq, const uint8_t *window,
                                  size_t len);
int kb_store_load(kb_store_t *self, kb_store_table_fn on_table, kb_store_row_fn on_row,
                  kb_store_client_fn on_client, void *ctx);

int kb_store_begin(kb_store_t *self);
int kb_store_put_table(kb_store_t *self, int64_t id, const char *name, const uint8_t *config, size_t len);
/* Deletes the table and all its rows. */
int kb_store_drop_table(kb_store_t *self, int64_t id);
/* Inserts or replaces the row, deletes it when row->deleted, or sets only its frequency when
 * row->frequency_only (a stored row with that key and row_id; none: nothing happens). */
int kb_store_put_row(kb_store_t *self, const kb_store_row_t *row);
int kb_store_put_client(kb_store_t *self, uint64_t client_id, uint64_t max_seq, const uint8_t *window, size_t len);
int kb_store_commit(kb_store_t *self);
void kb_store_rollback(kb_store_t *self);

/* SQLite's page cache, in KiB (SQLite's default is 2 MiB). */
int kb_store_set_cache(kb_store_t *self, uint32_t kib);

/* An integer in the meta table (0 when absent), and setting one (inside a transaction). */
uint64_t kb_store_get_meta(kb_store_t *self, const char *key);
int kb_store_put_meta(kb_store_t *self, const char *key, uint64_t value);

/* Checkpoints the WAL into the main database file (TRUNCATE). */
int kb_store_checkpoint(kb_store_t *self);

/* ---- tables larger than memory (kb_cache.h) ---- */

/* Start-up of a table whose rows stay in storage: one pass over table_id's rows counts them (*rows) and
 * finds the largest row id (*max_row_id, 0 when none), and hands on_row the rows that must be in memory:
 * every row when all is set, else only those holding pending gradients. Returns 0, or on_row's nonzero
 * answer, or -1 (kb_store_last_error). */
int kb_store_load_table(kb_store_t *self, int64_t table_id, bool all, kb_store_row_fn on_row, void *ctx,
                        uint64_t *rows, int64_t *max_row_id);

/* A second, read-only connection to a store's database for reading rows back on demand while the persister
 * and compactor write through the first (WAL lets them run concurrently). One statement behind a mutex:
 * any thread may call kb_store_read_row. */
typedef struct kb_store_reader kb_store_reader_t;

/* Opens <dir>/bank.sqlite (which kb_store_open created) read-only, with a page cache of cache_kib KiB.
 * Returns 0, or -1 with a message in err. */
int kb_store_reader_open(const char *dir, uint32_t cache_kib, kb_store_reader_t **out, char *err, size_t errlen);
void kb_store_reader_close(kb_store_reader_t **self_p);

/* The stored row of (table_id, key) as of the last committed transaction: 1 and *out filled with malloc'd
 * copies (kb_store_row_free), 0 when there is none, -1 with a message in err (SQLite failed, or the stored
 * row is malformed). */
int kb_store_read_row(kb_store_reader_t *self, int64_t table_id, const uint8_t *key, uint32_t key_len,
                      kb_store_row_t *out, char *err, size_t errlen);

/* Up to limit stored rows of table_id with row id > after_id, in row-id order, appended to *out (growing it;
 * *count counts them; kb_store_row_free each). A pass over the table's rows (there is no index by id).
 * Malformed rows are skipped. Returns 0, or -1 with a message in err. */
int kb_store_read_rows_after(kb_store_reader_t *self, int64_t table_id, int64_t after_id, size_t limit,
                             kb_store_row_t **out, size_t *count, char *err, size_t errlen);

/* Text of the last SQLite error on this store. */
const char *kb_store_last_error(const kb_store_t *self);

#endif
