/* The bank: one server's named tables, their persistence and the background work that serves them.
 *
 * Owns the table registry (tables are reference counted so a drop never frees a table a request is using),
 * the SQLite store, the journal in front of it (kb_journal.h), the write de-duplication state, and three
 * threads:
 *  - persister: collects every row changed since its last round ("epoch", kb_batch.h) and commits it by
 *    appending it to the journal (one sequential write, and in sync durability one fdatasync). In sync
 *    durability a write's reply waits until the epoch holding its changes is durable: kb_bank_wait_durable
 *    blocks, or the transport parks the reply (kb_bank_request_durable, the commit hook,
 *    kb_bank_durable_epoch), so any number of writers share one fdatasync (group commit). In interval
 *    durability it commits every interval_ms and nobody waits.
 *    Reads change only rows' use counts (frequency), which are not part of any epoch's promise: every
 *    frequency_period_ms (in a round no write waits on, when there is one), at a checkpoint and at close
 *    the persister takes the counts changed since in bulk, one frequency-only update per row, so a
 *    read-only load rewrites no row. A crash loses at most the counts of the last period.
 *  - compactor: writes the journaled epochs into SQLite in the background, many in one transaction (a row
 *    written in several keeps only its newest write), with the newest epoch recorded in the same
 *    transaction, then removes journal segments SQLite holds entirely. If SQLite falls more than a quarter
 *    of --max-memory (or 256 MiB) behind, the persister waits for it. At start-up the journal's newer
 *    epochs are replayed into SQLite before anything is loaded; a clean close compacts everything.
 *  - sweeper: applies pending gradient sets older than their table's max_age_ms.
 *
 * Write requests bracket their changes with kb_bank_write_begin/kb_bank_write_end (a shared lock the
 * persister takes exclusively while it collects), so all rows of one request and its de-duplication record
 * land in the same epoch: after a crash a write is either wholly there or wholly absent. */
#ifndef KB_BANK_H
#define KB_BANK_H

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
                            * primary's, applied with kb_bank_apply_replicated; tables read-only until
                            * kb_bank_promote */
    uint32_t min_replicas; /* sync durability on a primary: a write is durable once this many followers applied
                            * its epoch too (kb_bank_set_replicated); 0 = the local commit alone */
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
 * is KB_BANK_ECONFLICT. Must be called between write_begin and write_end. */
int kb_bank_create_table(kb_bank_t *self, const char *name, const kb_table_config_t *cfg, bool if_not_exists);

/* Drops a table and (at the next commit) its rows. Must be called between write_begin and write_end. */
int kb_bank_drop_table(kb_bank_t *self, const char *name);

/* Write bracket. kb_bank_write_end returns the ticket to pass to kb_bank_wait_durable. */
void kb_bank_write_begin(kb_bank_t *self);
uint64_t kb_bank_write_end(kb_bank_t *self);

/* Inside the write bracket: true if (client_id, seq) was applied before, else records it and returns false. */
bool kb_bank_seen_write(kb_bank_t *self, uint64_t client_id, uint64_t seq);

/* Inside the write bracket: forgets a record made by kb_bank_seen_write for a write that failed. */
void kb_bank_forget_write(kb_bank_t *self, uint64_t client_id, uint64_t seq);

/* Waits until the epoch `ticket` has committed (sync durability; immediate in interval mode). Returns 0,
 * or KB_BANK_ESTORAGE with a message in err if the store failed or timeout_ms passed. */
int kb_bank_wait_durable(kb_bank_t *self, uint64_t ticket, int timeout_ms, char *err, size_t errlen);

/* Pipelined sync durability: asks the persister for a round that makes epoch `ticket` durable soon, without
 * waiting. The caller learns of it through the commit hook and kb_bank_durable_epoch. */
void kb_bank_request_durable(kb_bank_t *self, uint64_t ticket);

/* Whether a journal append failed, or the bank was fenced (kb_bank_fence): then no write commits until the
 * server restarts, writes waiting for a commit are answered at once (kb_bank_wait_durable,
 * kb_bank_not_committed) instead of at their timeout, and the service refuses new writes before applying
 * them. Cheap (atomic loads). */
bool kb_bank_commits_broken(kb_bank_t *self);

/* The last durable epoch (every write whose ticket is <= it is on disk). */
uint64_t kb_bank_durable_epoch(kb_bank_t *self);

/* The error text of a write not durable after timeout_ms, with the last storage error: what
 * kb_bank_wait_durable answers, for a caller that parked the reply instead of waiting. */
void kb_bank_not_committed(kb_bank_t *self, int timeout_ms, char *err, size_t errlen);

/* hook(ctx) is called by the persister after every round, committed or failed (from its thread: it must
 * only signal, e.g. write an eventfd). Set before serving; NULL removes it. */
void kb_bank_set_commit_hook(kb_bank_t *self, void (*hook)(void *ctx), void *ctx);

/* ---- replication (docs/REPLICATION.md; the transport is kb_replica.h) ---- */

/* hook(ctx, epoch, payload, len, crc, rejournal) sees every round of a primary, in epoch order, before it is
 * appended to the local journal; an empty round has len 0. Called from the persister or syncer thread; it
 * must copy what it keeps. NULL removes it. */
typedef void (*kb_bank_ship_fn)(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc,
                                bool rejournal);
/* Returns the newest epoch with a record that the hook may not see (a round collected before it was set):
 * the hook sees every record after it, and may see rounds up to it too (to be ignored). Removing the hook
 * (NULL) waits for a call in progress. */
uint64_t kb_bank_set_ship_hook(kb_bank_t *self, kb_bank_ship_fn hook, void *ctx);

/* A follower applies its primary's round: checks the CRC, appends the record unchanged to its own journal
 * (fdatasync'ed in sync durability), applies table ops, rows and de-duplication records to the tables, and
 * publishes the epoch. Epochs must increase. One thread calls it. KB_BANK_OK, or an error with err. */
int kb_bank_apply_replicated(kb_bank_t *self, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc,
                             char *err, size_t errlen);

/* A follower's hook(ctx, epoch), called by kb_bank_apply_replicated on its thread once the round is in the
 * journal (fdatasync'ed in sync durability) and before it is applied: the moment it may be acknowledged.
 * Set before the first apply. */
void kb_bank_set_journaled_hook(kb_bank_t *self, void (*hook)(void *ctx, uint64_t epoch), void *ctx);

/* A follower becomes a primary: tables writable, persister started; new epochs follow the last applied. */
int kb_bank_promote(kb_bank_t *self, char *err, size_t errlen);
bool kb_bank_is_replica(kb_bank_t *self);

/* Primary: K followers have applied every epoch <= epoch (the transport counts acks). */
void kb_bank_set_replicated(kb_bank_t *self, uint64_t epoch);
void kb_bank_set_min_replicas(kb_bank_t *self, uint32_t min_replicas);
uint32_t kb_bank_min_replicas(kb_bank_t *self);

/* The transport says too few followers have been connected for a while (reason), or enough again (NULL):
 * while short, the service refuses new writes with STATUS_UNAVAILABLE before applying them. */
void kb_bank_set_replicas_short(kb_bank_t *self, const char *reason);
bool kb_bank_replicas_short(kb_bank_t *self, char *why, size_t whylen);

/* Deposes the bank: from now on writes are refused (kb_bank_commits_broken) and writes waiting for their
 * commit are answered with reason. For good: a deposed primary rejoins as a follower by restarting. */
void kb_bank_fence(kb_bank_t *self, const char *reason);
bool kb_bank_fenced(kb_bank_t *self);

/* The newest epoch committed here (applied, on a follower), whether or not replicated. */
uint64_t kb_bank_committed_epoch(kb_bank_t *self);

/* Commits everything now and checkpoints the SQLite WAL. */
int kb_bank_checkpoint(kb_bank_t *self, uint64_t *committed_epoch, char *err, size_t errlen);

typedef struct {
    uint64_t commits;         /* transactions committed */
    uint64_t committed_epoch;
    uint64_t rows_written;         /* whole rows (value, metadata, state) written or deleted */
    uint64_t frequencies_written;  /* frequency-only updates: use counts changed by reads */
    uint64_t commit_failures;
    uint64_t journal_bytes;         /* in journal segments not yet removed */
    uint64_t compactions;           /* transactions that moved journaled epochs into SQLite */
    uint64_t compacted_epoch;       /* the newest epoch in SQLite */
    uint64_t compaction_queue_rows; /* rows journaled but not yet in SQLite */
    uint64_t compaction_queue_bytes; /* the memory those rows hold, pending sets included */
    uint64_t compaction_rows_skipped; /* journaled row writes superseded by a newer one before compaction */
    uint64_t compactions_without_pending; /* compactions that left pending gradients to the journal */
    bool compacting;                /* a compaction transaction is open now */
} kb_bank_stats_t;

void kb_bank_get_stats(kb_bank_t *self, kb_bank_stats_t *out);
bool kb_bank_sync(const kb_bank_t *self);

/* The bank's memory accounting: every table's estimate, the de-duplication records and the batch being
 * committed, against opts->max_memory. Owned by the bank. */
kb_memory_t *kb_bank_memory(kb_bank_t *self);

/* ---- snapshots (kb_snapshot.h) ---- */

/* The data directory the bank was opened on. */
const char *kb_bank_data_dir(const kb_bank_t *self);

/* Takes a snapshot's cut without stopping service: commits a round (with the use counts) so every write
 * acknowledged before the call is durable, pauses the compactor, and calls fn(ctx, C) while SQLite holds
 * exactly the epochs <= C (fn opens its read transaction there; a nonzero return fails the cut), then lets
 * compaction go on. *cut_epoch = E >= C: the snapshot is SQLite as fn saw it plus the journal records
 * C < epoch <= E (kb_bank_snapshot_copy_journal); every write is wholly in one epoch. From a successful
 * return until kb_bank_snapshot_end no journal segment is removed. Returns 0, or KB_BANK_ESTORAGE with err
 * (and then nothing is held). Worker threads only: it waits for a commit. */
typedef int (*kb_bank_cut_fn)(void *ctx, uint64_t compacted_epoch);
int kb_bank_snapshot_cut(kb_bank_t *self, kb_bank_cut_fn fn, void *ctx, uint64_t *cut_epoch,
                         uint64_t *compacted_epoch, char *err, size_t errlen);

/* Between a cut and its end: kb_journal_copy of the bank's journal (kb_journal.h). */
int kb_bank_snapshot_copy_journal(kb_bank_t *self, uint64_t after, uint64_t upto, const char *dest_dir,
                                  char *path_out, size_t path_len, uint64_t *records, char *err, size_t errlen);

/* Ends what a successful kb_bank_snapshot_cut holds (journal segments may be removed again). */
void kb_bank_snapshot_end(kb_bank_t *self);

/* --cache-bytes: the cache's figures; false (nothing written) when every row stays in memory. */
bool kb_bank_cache_stats(kb_bank_t *self, kb_cache_stats_t *out);

#endif
