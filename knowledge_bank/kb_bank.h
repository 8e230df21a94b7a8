/* The bank: one server's named tables and the files they live in.
 *
 * Owns the table registry (tables are reference counted so a drop never frees a table a request is using),
 * the SQLite store, the write de-duplication state, the memory estimate and the cache; opens them (replaying
 * the journal's epochs newer than SQLite into it first, or into memory when read-only) and closes them. How a
 * write becomes durable is the commit pipeline's (kb_commit.h: write bracket, tickets, persister, syncer,
 * compactor, sweeper), which the bank starts over its tables; callers reach it through kb_bank_commit. */
#ifndef KB_BANK_H
#define KB_BANK_H

#include "kb_commit.h"
#include "kb_memory.h"
#include "kb_table.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *data_dir;
    bool sync;            /* true: commit before acknowledging; false: commit every interval_ms */
    uint32_t interval_ms; /* interval durability: at most this much acknowledged work can be lost */
    uint64_t max_memory;  /* --max-memory: the budget of the memory estimate (kb_memory.h); 0 = unlimited */
    uint32_t frequency_period_ms; /* use counts changed by reads are written this often (0: 10000) */
    uint32_t compact_delay_ms;    /* committed epochs wait this long before compaction (0: 5000) */
    uint32_t journal_segment_bytes; /* a journal segment is closed at this size (0: KB_JOURNAL_SEGMENT_BYTES) */
    bool read_only;               /* kb-server --read-only: the files are only read (kb_store_open_read_only),
                                   * the journal is replayed into memory only, no thread is started, nothing
                                   * is committed, pending gradients are never applied (docs/STATE.md) */
    uint64_t cache_bytes; /* --cache-bytes: tables keep about this much in memory, the rest only in storage
                           * (kb_cache.h; tables with a knn index or an eviction policy stay resident);
                           * 0 = every row in memory */
    bool replica;          /* a replication follower (docs/REPLICATION.md): no persister; its epochs are its
                            * primary's, applied with kb_commit_apply_replicated; tables read-only until
                            * kb_commit_promote */
    uint32_t min_replicas; /* sync durability on a primary: a write is durable once this many followers applied
                            * its epoch too (kb_commit_set_replicated); 0 = the local commit alone */
} kb_bank_options_t;

typedef struct kb_bank kb_bank_t;

enum {
    KB_BANK_OK = 0,
    KB_BANK_ENOTFOUND = -1,
    KB_BANK_EEXISTS = -2,
    KB_BANK_ESTORAGE = -3, /* the store failed or did not commit in time; the error text says why */
    KB_BANK_ECONFLICT = -4, /* the table exists with a different config */
};

/* Opens the store in opts->data_dir, loads every table and row, and starts the background threads. */
int kb_bank_open(const kb_bank_options_t *opts, kb_bank_t **out, char *err, size_t errlen);

/* Stops the threads, commits everything still in memory, closes the store. Accepts NULL; nulls *self_p. */
void kb_bank_close(kb_bank_t **self_p);

/* The named table with a reference held, or NULL. Every acquire is paired with a release. */
kb_table_t *kb_bank_acquire(kb_bank_t *self, const char *name);
void kb_bank_release(kb_bank_t *self, kb_table_t *table);

/* Acquires every table (sorted by name) into a new array *out; returns the count. Release each, free *out. */
size_t kb_bank_acquire_all(kb_bank_t *self, kb_table_t ***out);

/* Creates a table. With if_not_exists an existing table of the same config is success; a different config
 * is KB_BANK_ECONFLICT. Must be called inside the write bracket (kb_commit_write_begin/_end). */
int kb_bank_create_table(kb_bank_t *self, const char *name, const kb_table_config_t *cfg, bool if_not_exists);

/* Drops a table and (at the next commit) its rows. Must be called inside the write bracket. */
int kb_bank_drop_table(kb_bank_t *self, const char *name);

/* ---- the commit pipeline (kb_commit.h) ---- */

/* The bank's commit pipeline: the write bracket (a create or drop above goes inside it), tickets and their
 * waits, checkpoints, stats and snapshot cuts are kb_commit_* calls on it. Owned by the bank. */
kb_commit_t *kb_bank_commit(kb_bank_t *self);

/* The bank's memory accounting: every table's estimate, the de-duplication records and the batch being
 * committed, against opts->max_memory. Owned by the bank. */
kb_memory_t *kb_bank_memory(kb_bank_t *self);

/* ---- snapshots (kb_snapshot.h) ---- */

/* The data directory the bank was opened on. */
const char *kb_bank_data_dir(const kb_bank_t *self);

/* --cache-bytes: the cache's figures; false (nothing written) when every row stays in memory. */
bool kb_bank_cache_stats(kb_bank_t *self, kb_cache_stats_t *out);

#endif
