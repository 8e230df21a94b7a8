#include "kb_store.h"

#include "log.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KB_STORE_SCHEMA_VERSION 1

struct kb_store {
    sqlite3 *db;
    sqlite3_stmt *put_table, *drop_table, *drop_rows, *put_row, *delete_row, *put_frequency, *put_client, *get_meta, *put_meta;
    char error[512];
};

static const char *s_schema =
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v);"
    "CREATE TABLE IF NOT EXISTS tables(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, config BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS rows(table_id INTEGER NOT NULL, key BLOB NOT NULL, row_id INTEGER NOT NULL,"
    " value BLOB, opt_state BLOB, opt_steps INTEGER NOT NULL, pending BLOB,"
    " pending_count INTEGER NOT NULL, version INTEGER NOT NULL, updated_at INTEGER NOT NULL,"
    " frequency INTEGER NOT NULL, record BLOB, PRIMARY KEY(table_id, key)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS clients(client_id INTEGER PRIMARY KEY, max_seq INTEGER NOT NULL, window BLOB);";

void kb_store_row_free(kb_store_row_t *row)
{
    if (!row)
        return;
    free(row->key);
    free(row->value);
    free(row->opt_state);
    free(row->pending);
    free(row->record);
    memset(row, 0, sizeof *row);
}

static int s_fail(kb_store_t *self, const char *what)
{
    snprintf(self->error, sizeof self->error, "%s: %s", what, sqlite3_errmsg(self->db));
    LOG_ERROR("sqlite: %s", self->error);
    return -1;
}

static int s_exec(kb_store_t *self, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(self->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        /* The statement's start names it (the schema alone is longer than the buffer). */
        snprintf(self->error, sizeof self->error, "%.120s: %s", sql, msg ? msg : "?");
        LOG_ERROR("sqlite: %s", self->error);
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int s_prepare(kb_store_t *self, const char *sql, sqlite3_stmt **stmt)
{
    if (sqlite3_prepare_v2(self->db, sql, -1, stmt, NULL) != SQLITE_OK)
        return s_fail(self, sql);
    return 0;
}

const char *kb_store_last_error(const kb_store_t *self) { return self->error; }

int kb_store_open(const char *dir, bool sync, kb_store_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create data directory %s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "data directory %s is not a directory", dir);
        return -1;
    }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/bank.sqlite", dir) >= sizeof path) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    kb_store_t *self = carls_xcalloc(1, sizeof *self);
    /* The database holds everything the bank knows: only its owner may read it. */
    mode_t old_mask = umask(077);
    int rc = sqlite3_open_v2(path, &self->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    umask(old_mask);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "cannot open %s: %s", path, self->db ? sqlite3_errmsg(self->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(self->db, 5000);
    if (s_exec(self, "PRAGMA journal_mode=WAL;") != 0 ||
        s_exec(self, sync ? "PRAGMA synchronous=FULL;" : "PRAGMA synchronous=NORMAL;") != 0 ||

        s_exec(self, s_schema) != 0)
        goto fail_sql;

    sqlite3_stmt *version_stmt = NULL;
    if (s_prepare(self, "SELECT v FROM meta WHERE k='schema_version'", &version_stmt) != 0)
        goto fail_sql;
    int have_version = sqlite3_step(version_stmt) == SQLITE_ROW;
    int version = have_version ? sqlite3_column_int(version_stmt, 0) : 0;
    sqlite3_finalize(version_stmt);
    if (!have_version) {
        if (s_exec(self, "INSERT INTO meta(k, v) VALUES('schema_version', 1);") != 0)
            goto fail_sql;
    } else if (version != KB_STORE_SCHEMA_VERSION) {
        snprintf(err, errlen, "%s has schema version %d; this server reads version %d", path, version,
                 KB_STORE_SCHEMA_VERSION);
        goto fail;
    }

    if (s_prepare(self, "INSERT OR REPLACE INTO tables(id, name, config) VALUES(?1, ?2, ?3)", &self->put_table) ||
        s_prepare(self, "DELETE FROM tables WHERE id = ?1", &self->drop_table) ||
        s_prepare(self, "DELETE FROM rows WHERE table_id = ?1", &self->drop_rows) ||
        s_prepare(self,
                  "INSERT OR REPLACE INTO rows(table_id, key, row_id, value, opt_state, opt_steps, pending,"
                  " pending_count, version, updated_at, frequency, record)"
                  " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
                  &self->put_row) ||
        s_prepare(self, "DELETE FROM rows WHERE table_id = ?1 AND key = ?2", &self->delete_row) ||
        /* row_id: a count of a row since evicted must not land on a newer row of the same key */
        s_prepare(self, "UPDATE rows SET frequency = ?4 WHERE table_id = ?1 AND key = ?2 AND row_id = ?3",
                  &self->put_frequency) ||
        s_prepare(self, "INSERT OR REPLACE INTO clients(client_id, max_seq, window) VALUES(?1, ?2, ?3)",
                  &self->put_client) ||
        s_prepare(self, "SELECT v FROM meta WHERE k = ?1", &self->get_meta) ||
        s_prepare(self, "INSERT OR REPLACE INTO meta(k, v) VALUES(?1, ?2)", &self->put_meta))
        goto fail_sql;
    *out = self;
    return 0;

fail_sql:
    snprintf(err, errlen, "%s", self->error);
fail:
    kb_store_close(&self);
    return -1;
}

/* ---- read-only open (kb-server --read-only) ---- */

/* Size of path in *bytes: 0 when it exists, -1 (errno ENOENT or another) otherwise. */
static int s_file_size(const char *path, int64_t *bytes)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -1;
    *bytes = (int64_t)sb.st_size;
    return 0;
}

int kb_store_open_read_only(const char *dir, kb_store_t **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return carls_errorf(err, errlen, -1,
                            "read-only: data directory %s %s (a read-only server serves an existing bank and "
                            "creates nothing)",
                            dir, errno == ENOENT ? "does not exist" : "is not a readable directory");
    char path[4096], wal[4200], shm[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/bank.sqlite", dir) >= sizeof path)
        return carls_errorf(err, errlen, -1, "data directory path too long");
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(shm, sizeof shm, "%s-shm", path);
    int64_t db_bytes = 0, wal_bytes = 0, shm_bytes = 0;
    if (s_file_size(path, &db_bytes) != 0)
        return carls_errorf(err, errlen, -1,
                            "read-only: %s has no bank (%s: %s); start the server once without --read-only to "
                            "create one",
                            dir, path, strerror(errno));
    bool have_wal = s_file_size(wal, &wal_bytes) == 0 && wal_bytes > 0;
    if (have_wal && s_file_size(shm, &shm_bytes) != 0)
        return carls_errorf(err, errlen, -1,
                            "read-only: %s holds committed changes but %s is missing, and reading them without "
                            "it would mean creating it; start the server once without --read-only",
                            wal, shm);
    /* A URI: the path percent-encoded where SQLite's URI syntax needs it. */
    char uri[13000];
    size_t at = (size_t)snprintf(uri, sizeof uri, "file:");
    for (const char *p = path; *p && at + 4 < sizeof uri; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '%' || c == '?' || c == '#' || c < 0x21 || c > 0x7e)
            at += (size_t)snprintf(uri + at, sizeof uri - at, "%%%02X", c);
        else
            uri[at++] = (char)c;
    }
    snprintf(uri + at, sizeof uri - at, "%s", have_wal ? "?mode=ro&readonly_shm=1" : "?mode=ro&immutable=1");
    kb_store_t *self = carls_xcalloc(1, sizeof *self);
    int rc = sqlite3_open_v2(uri, &self->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "read-only: cannot open %s: %s", path,
                 self->db ? sqlite3_errmsg(self->db) : "out of memory");
        goto fail;
    }
    /* Belt and braces: even if something asked, a read-only connection must not checkpoint at close. */
    sqlite3_db_config(self->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    sqlite3_busy_timeout(self->db, 5000);
    sqlite3_stmt *version_stmt = NULL;
    if (s_prepare(self, "SELECT v FROM meta WHERE k='schema_version'", &version_stmt) != 0) {
        snprintf(err, errlen, "read-only: %s is not a bank: %s", path, self->error);
        goto fail;
    }
    int have_version = sqlite3_step(version_stmt) == SQLITE_ROW;
    int version = have_version ? sqlite3_column_int(version_stmt, 0) : 0;
    sqlite3_finalize(version_stmt);
    if (version != KB_STORE_SCHEMA_VERSION) {
        snprintf(err, errlen, "read-only: %s has schema version %d; this server reads version %d", path, version,
                 KB_STORE_SCHEMA_VERSION);
        goto fail;
    }
    if (s_prepare(self, "SELECT v FROM meta WHERE k = ?1", &self->get_meta) != 0) {
        snprintf(err, errlen, "read-only: %s", self->error);
        goto fail;
    }
    LOG_INFO("read-only: opened %s (%s)", path,
             have_wal ? "with its write-ahead log, shared-memory index kept in private memory" : "immutable");
    *out = self;
    return 0;
fail:
    kb_store_close(&self);
    return -1;
}

void kb_store_close(kb_store_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_store_t *self = *self_p;
    sqlite3_finalize(self->put_table);
    sqlite3_finalize(self->drop_table);
    sqlite3_finalize(self->drop_rows);
    sqlite3_finalize(self->put_row);
    sqlite3_finalize(self->delete_row);
    sqlite3_finalize(self->put_frequency);
    sqlite3_finalize(self->put_client);
    sqlite3_finalize(self->get_meta);
    sqlite3_finalize(self->put_meta);
    if (self->db)
        sqlite3_close(self->db);
    free(self);
    *self_p = NULL;
}

/* Reads a float blob of exactly `count` floats; NULL blob is allowed only for count 0. */
static int s_column_floats(sqlite3_stmt *stmt, int col, uint64_t count, const float **out)
{
    int bytes = sqlite3_column_bytes(stmt, col);
    const void *blob = sqlite3_column_blob(stmt, col);
    if ((uint64_t)bytes != count * sizeof(float))
        return -1;
    *out = blob;
    return 0;
}

/* What kb_store_load passes to the per-row readers below. */
typedef struct {
    kb_store_table_fn on_table;
    kb_store_row_fn on_row;
    kb_store_client_fn on_client;
    void *ctx;
    uint64_t malformed_rows;
} s_load_t;

/* Runs a query and hands each result row to read; stops at the first non-zero answer and returns it. */
static int s_each_result(kb_store_t *self, const char *sql, const char *what,
                         int (*read)(sqlite3_stmt *stmt, s_load_t *load), s_load_t *load)
{
    sqlite3_stmt *stmt = NULL;
    if (s_prepare(self, sql, &stmt) != 0)
        return -1;
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        int r = read(stmt, load);
        if (r != 0) {
            sqlite3_finalize(stmt);
            return r;
        }
    }
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE)
        return s_fail(self, what);
    return 0;
}

static int s_read_table(sqlite3_stmt *stmt, s_load_t *load)
{
    return load->on_table(load->ctx, sqlite3_column_int64(stmt, 0), (const char *)sqlite3_column_text(stmt, 1),
                          sqlite3_column_blob(stmt, 2), (size_t)sqlite3_column_bytes(stmt, 2));
}

/* A malformed row is counted and skipped. */
static int s_read_row(sqlite3_stmt *stmt, s_load_t *load)
{
    kb_store_row_t rec = {0};
    rec.table_id = sqlite3_column_int64(stmt, 0);
    rec.key = (uint8_t *)sqlite3_column_blob(stmt, 1);
    rec.key_len = (uint32_t)sqlite3_column_bytes(stmt, 1);
    rec.row_id = sqlite3_column_int64(stmt, 2);
    int value_bytes = sqlite3_column_bytes(stmt, 3);
    rec.value = (float *)sqlite3_column_blob(stmt, 3);
    rec.dim = (uint32_t)(value_bytes / (int)sizeof(float));
    int opt_bytes = sqlite3_column_bytes(stmt, 4);
    rec.opt_state = (float *)sqlite3_column_blob(stmt, 4);
    rec.opt_floats = (uint32_t)(opt_bytes / (int)sizeof(float));
    rec.opt_steps = (uint64_t)sqlite3_column_int64(stmt, 5);
    rec.pending_count = (uint32_t)sqlite3_column_int64(stmt, 7);
    const float *pending = NULL;
    rec.record = (uint8_t *)sqlite3_column_blob(stmt, 11);
    rec.record_len = (uint32_t)sqlite3_column_bytes(stmt, 11);
    /* Feature rows have no value (dim 0) and a record (possibly of zero bytes); embedding rows have a
     * value and no record. */
    bool has_record = sqlite3_column_type(stmt, 11) != SQLITE_NULL;
    if (value_bytes % (int)sizeof(float) != 0 || opt_bytes % (int)sizeof(float) != 0 ||
        (rec.dim == 0) != has_record ||
        s_column_floats(stmt, 6, (uint64_t)rec.pending_count * rec.dim, &pending) != 0) {
        load->malformed_rows++;
        return 0;
    }
    rec.pending = (float *)pending;
    rec.version = (uint64_t)sqlite3_column_int64(stmt, 8);
    rec.updated_at_ms = sqlite3_column_int64(stmt, 9);
    rec.frequency = (uint64_t)sqlite3_column_int64(stmt, 10);
    return load->on_row(load->ctx, &rec);
}

static int s_read_client(sqlite3_stmt *stmt, s_load_t *load)
{
    return load->on_client(load->ctx, (uint64_t)sqlite3_column_int64(stmt, 0), (uint64_t)sqlite3_column_int64(stmt, 1),
                           sqlite3_column_blob(stmt, 2), (size_t)sqlite3_column_bytes(stmt, 2));
}

int kb_store_load(kb_store_t *self, kb_store_table_fn on_table, kb_store_row_fn on_row,
                  kb_store_client_fn on_client, void *ctx)
{
    s_load_t load = {.on_table = on_table, .on_row = on_row, .on_client = on_client, .ctx = ctx};
    int rc = s_each_result(self, "SELECT id, name, config FROM tables ORDER BY id", "loading tables", s_read_table,
                           &load);
    if (rc != 0)
        return rc;
    rc = !on_row ? 0 : s_each_result(self,
                       "SELECT table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version,"
                       " updated_at, frequency, record FROM rows WHERE table_id IN (SELECT id FROM tables)",
                       "loading rows", s_read_row, &load);
    if (rc != 0)
        return rc;
    if (load.malformed_rows)
        LOG_WARN("skipped %llu malformed rows in the database", (unsigned long long)load.malformed_rows);
    return s_each_result(self, "SELECT client_id, max_seq, window FROM clients", "loading clients", s_read_client,
                         &load);
}

int kb_store_begin(kb_store_t *self) { return s_exec(self, "BEGIN IMMEDIATE;"); }

int kb_store_commit(kb_store_t *self) { return s_exec(self, "COMMIT;"); }

void kb_store_rollback(kb_store_t *self)
{
    if (!sqlite3_get_autocommit(self->db))
        s_exec(self, "ROLLBACK;");
}

/* Steps a write statement once and resets it. */
static int s_step_write(kb_store_t *self, sqlite3_stmt *stmt, const char *what)
{
    int rc = sqlite3_step(stmt);
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    if (rc != SQLITE_DONE)
        return s_fail(self, what);
    return 0;
}

int kb_store_put_table(kb_store_t *self, int64_t id, const char *name, const uint8_t *config, size_t len)
{
    sqlite3_bind_int64(self->put_table, 1, id);
    sqlite3_bind_text(self->put_table, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_blob(self->put_table, 3, config, (int)len, SQLITE_STATIC);
    return s_step_write(self, self->put_table, "storing table");
}

int kb_store_drop_table(kb_store_t *self, int64_t id)
{
    sqlite3_bind_int64(self->drop_rows, 1, id);
    if (s_step_write(self, self->drop_rows, "deleting rows") != 0)
        return -1;
    sqlite3_bind_int64(self->drop_table, 1, id);
    return s_step_write(self, self->drop_table, "deleting table");
}

int kb_store_put_row(kb_store_t *self, const kb_store_row_t *row)
{
    if (row->deleted) {
        sqlite3_bind_int64(self->delete_row, 1, row->table_id);
        sqlite3_bind_blob(self->delete_row, 2, row->key, (int)row->key_len, SQLITE_STATIC);
        return s_step_write(self, self->delete_row, "deleting row");
    }
    if (row->frequency_only) {
        sqlite3_bind_int64(self->put_frequency, 1, row->table_id);
        sqlite3_bind_blob(self->put_frequency, 2, row->key, (int)row->key_len, SQLITE_STATIC);
        sqlite3_bind_int64(self->put_frequency, 3, row->row_id);
        sqlite3_bind_int64(self->put_frequency, 4, (sqlite3_int64)row->frequency);
        return s_step_write(self, self->put_frequency, "storing frequency");
    }
    sqlite3_stmt *s = self->put_row;
    sqlite3_bind_int64(s, 1, row->table_id);
    sqlite3_bind_blob(s, 2, row->key, (int)row->key_len, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, row->row_id);
    if (row->dim)
        sqlite3_bind_blob(s, 4, row->value, (int)(row->dim * sizeof(float)), SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 4);
    if (row->opt_floats)
        sqlite3_bind_blob(s, 5, row->opt_state, (int)(row->opt_floats * sizeof(float)), SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 5);
    sqlite3_bind_int64(s, 6, (sqlite3_int64)row->opt_steps);
    if (row->pending_count)
        sqlite3_bind_blob(s, 7, row->pending, (int)((size_t)row->pending_count * row->dim * sizeof(float)),
                          SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 7);
    sqlite3_bind_int64(s, 8, row->pending_count);
    sqlite3_bind_int64(s, 9, (sqlite3_int64)row->version);
    sqlite3_bind_int64(s, 10, row->updated_at_ms);
    sqlite3_bind_int64(s, 11, (sqlite3_int64)row->frequency);
    if (row->dim == 0) /* feature row: a record, even an empty one */
        sqlite3_bind_blob(s, 12, row->record ? (const void *)row->record : (const void *)"", (int)row->record_len,
                          SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 12);
    return s_step_write(self, s, "storing row");
}

int kb_store_put_client(kb_store_t *self, uint64_t client_id, uint64_t max_seq, const uint8_t *window, size_t len)
{
    sqlite3_bind_int64(self->put_client, 1, (sqlite3_int64)client_id);
    sqlite3_bind_int64(self->put_client, 2, (sqlite3_int64)max_seq);
    sqlite3_bind_blob(self->put_client, 3, window, (int)len, SQLITE_STATIC);
    return s_step_write(self, self->put_client, "storing client");
}

int kb_store_set_cache(kb_store_t *self, uint32_t kib)
{
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA cache_size=-%u;", kib);
    return s_exec(self, sql);
}

uint64_t kb_store_get_meta(kb_store_t *self, const char *key)
{
    sqlite3_bind_text(self->get_meta, 1, key, -1, SQLITE_STATIC);
    uint64_t v = 0;
    if (sqlite3_step(self->get_meta) == SQLITE_ROW)
        v = (uint64_t)sqlite3_column_int64(self->get_meta, 0);
    sqlite3_reset(self->get_meta);
    return v;
}

int kb_store_put_meta(kb_store_t *self, const char *key, uint64_t value)
{
    sqlite3_bind_text(self->put_meta, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(self->put_meta, 2, (sqlite3_int64)value);
    return s_step_write(self, self->put_meta, "storing meta");
}

int kb_store_checkpoint(kb_store_t *self)
{
    int log_frames = 0, checkpointed = 0;
    if (sqlite3_wal_checkpoint_v2(self->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log_frames, &checkpointed) !=
        SQLITE_OK)
        return s_fail(self, "WAL checkpoint");
    return 0;
}

/* ---- tables larger than memory ---- */

/* The columns s_read_row reads, in its order. */
#define S_ROW_COLUMNS                                                                                          \
    "table_id, key, row_id, value, opt_state, opt_steps, pending, pending_count, version, updated_at, "      \
    "frequency, record"

int kb_store_load_table(kb_store_t *self, int64_t table_id, bool all, kb_store_row_fn on_row, void *ctx,
                        uint64_t *rows, int64_t *max_row_id)
{
    *rows = 0;
    *max_row_id = 0;
    sqlite3_stmt *stmt = NULL;
    if (s_prepare(self, "SELECT " S_ROW_COLUMNS " FROM rows WHERE table_id = ?1", &stmt) != 0)
        return -1;
    sqlite3_bind_int64(stmt, 1, table_id);
    s_load_t load = {.on_row = on_row, .ctx = ctx};
    int rc, r = 0;
    while (r == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        (*rows)++;
        int64_t id = sqlite3_column_int64(stmt, 2);
        if (id > *max_row_id)
            *max_row_id = id;
        if (all || sqlite3_column_int64(stmt, 7) > 0)
            r = s_read_row(stmt, &load);
    }
    sqlite3_finalize(stmt);
    if (r != 0)
        return r;
    if (rc != SQLITE_DONE)
        return s_fail(self, "loading a table's rows");
    if (load.malformed_rows)
        LOG_WARN("skipped %llu malformed rows of table %lld in the database",
                 (unsigned long long)load.malformed_rows, (long long)table_id);
    return 0;
}

struct kb_store_reader {
    sqlite3 *db;
    sqlite3_stmt *get_row, *get_after;
    pthread_mutex_t mutex;
};

int kb_store_reader_open(const char *dir, uint32_t cache_kib, kb_store_reader_t **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/bank.sqlite", dir) >= sizeof path)
        return carls_errorf(err, errlen, -1, "data directory path too long");
    kb_store_reader_t *self = carls_xcalloc(1, sizeof *self);
    pthread_mutex_init(&self->mutex, NULL);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA cache_size=-%u;", cache_kib);
    if (sqlite3_open_v2(path, &self->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(self->db, 5000) != SQLITE_OK ||
        sqlite3_exec(self->db, sql, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(self->db, "SELECT " S_ROW_COLUMNS " FROM rows WHERE table_id = ?1 AND key = ?2", -1,
                           &self->get_row, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(self->db,
                           "SELECT " S_ROW_COLUMNS " FROM rows WHERE table_id = ?1 AND row_id > ?2 ORDER BY row_id"
                           " LIMIT ?3",
                           -1, &self->get_after, NULL) != SQLITE_OK) {
        carls_errorf(err, errlen, -1, "cannot open %s for reading cold rows: %s", path,
                     self->db ? sqlite3_errmsg(self->db) : "out of memory");
        kb_store_reader_close(&self);
        return -1;
    }
    *out = self;
    return 0;
}

void kb_store_reader_close(kb_store_reader_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_store_reader_t *self = *self_p;
    sqlite3_finalize(self->get_row);
    sqlite3_finalize(self->get_after);
    if (self->db)
        sqlite3_close(self->db);
    pthread_mutex_destroy(&self->mutex);
    free(self);
    *self_p = NULL;
}

/* s_read_row's callback for kb_store_read_row: copies the borrowed row into ctx. */
static int s_copy_row(void *ctx, const kb_store_row_t *rec)
{
    kb_store_row_t *out = ctx;
    *out = *rec;
    out->key = carls_xmalloc(rec->key_len ? rec->key_len : 1);
    memcpy(out->key, rec->key, rec->key_len);
    out->value = rec->dim ? carls_xmalloc((size_t)rec->dim * sizeof(float)) : NULL;
    if (rec->dim)
        memcpy(out->value, rec->value, (size_t)rec->dim * sizeof(float));
    out->opt_state = rec->opt_floats ? carls_xmalloc((size_t)rec->opt_floats * sizeof(float)) : NULL;
    if (rec->opt_floats)
        memcpy(out->opt_state, rec->opt_state, (size_t)rec->opt_floats * sizeof(float));
    size_t pending = (size_t)rec->pending_count * rec->dim * sizeof(float);
    out->pending = pending ? carls_xmalloc(pending) : NULL;
    if (pending)
        memcpy(out->pending, rec->pending, pending);
    out->record = rec->dim == 0 ? carls_xmalloc(rec->record_len ? rec->record_len : 1) : NULL;
    if (out->record && rec->record_len)
        memcpy(out->record, rec->record, rec->record_len);
    return 1; /* found */
}

int kb_store_read_row(kb_store_reader_t *self, int64_t table_id, const uint8_t *key, uint32_t key_len,
                      kb_store_row_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&self->mutex);
    sqlite3_bind_int64(self->get_row, 1, table_id);
    sqlite3_bind_blob(self->get_row, 2, key, (int)key_len, SQLITE_STATIC);
    s_load_t load = {.on_row = s_copy_row, .ctx = out};
    int rc = sqlite3_step(self->get_row), found = 0;
    if (rc == SQLITE_ROW) {
        found = s_read_row(self->get_row, &load);
        if (found == 0)
            carls_errorf(err, errlen, -1, "the stored row of table %lld is malformed", (long long)table_id);
        found = found ? 1 : -1;
    } else if (rc != SQLITE_DONE) {
        found = carls_errorf(err, errlen, -1, "reading a row of table %lld: %s", (long long)table_id,
                             sqlite3_errmsg(self->db));
    }
    sqlite3_reset(self->get_row);
    sqlite3_clear_bindings(self->get_row);
    pthread_mutex_unlock(&self->mutex);
    return found;
}

int kb_store_read_rows_after(kb_store_reader_t *self, int64_t table_id, int64_t after_id, size_t limit,
                             kb_store_row_t **out, size_t *count, char *err, size_t errlen)
{
    size_t capacity = *count;
    pthread_mutex_lock(&self->mutex);
    sqlite3_bind_int64(self->get_after, 1, table_id);
    sqlite3_bind_int64(self->get_after, 2, after_id);
    sqlite3_bind_int64(self->get_after, 3, limit > INT64_MAX ? INT64_MAX : (sqlite3_int64)limit);
    int rc;
    while ((rc = sqlite3_step(self->get_after)) == SQLITE_ROW) {
        *out = carls_grow(*out, &capacity, *count + 1, sizeof **out);
        s_load_t load = {.on_row = s_copy_row, .ctx = &(*out)[*count]};
        if (s_read_row(self->get_after, &load) != 0)
            (*count)++;
    }
    int result = 0;
    if (rc != SQLITE_DONE)
        result = carls_errorf(err, errlen, -1, "reading rows of table %lld: %s", (long long)table_id,
                              sqlite3_errmsg(self->db));
    sqlite3_reset(self->get_after);
    sqlite3_clear_bindings(self->get_after);
    pthread_mutex_unlock(&self->mutex);
    return result;
}
