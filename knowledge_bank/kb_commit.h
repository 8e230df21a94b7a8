/* The commit pipeline: how a write's ticket becomes durable. One contract: a write request brackets its
 * changes (kb_commit_write_begin / kb_commit_write_end) and gets a ticket, the epoch its changes are in; the
 * ticket is durable once kb_commit_durable_epoch reaches it (kb_commit_wait_durable blocks until then, or the
 * transport parks the reply and hears of it through the commit hook).
 *
 * It owns the journal (kb_journal.h) and four threads:
 *  - persister: collects every row changed since its last round ("epoch", kb_batch.h) and commits it by
 *    appending it to the journal (one sequential write, and in sync durability one fdatasync). In sync
 *    durability a write's reply waits until the epoch holding its changes is durable, so any number of
 *    writers share one fdatasync (group commit). In interval durability it commits every interval_ms and
 *    nobody waits. Reads change only rows' use counts (frequency), which are not part of any epoch's promise:
 *    every frequency_period_ms (in a round no write waits on, when there is one), at a checkpoint and at close
 *    the persister takes the counts changed since in bulk, one frequency-only update per row, so a read-only
 *    load rewrites no row. A crash loses at most the counts of the last period.
 *  - syncer (sync durability): appends and fdatasyncs epoch N while the persister collects N+1.
 *  - compactor: writes the journaled epochs into SQLite in the background, many in one transaction (a row
 *    written in several keeps only its newest write), with the newest epoch recorded in the same
 *    transaction, then removes journal segments SQLite holds entirely. If SQLite falls more than a quarter
 *    of --max-memory (or 256 MiB) behind, the persister waits for it. A clean close compacts everything.
 *  - sweeper: applies pending gradient sets older than their table's max_age_ms.
 *
 * The bracket is a shared lock the persister takes exclusively while it collects, so all rows of one request
 * and its de-duplication record land in the same epoch: after a crash a write is either wholly there or
 * wholly absent. With replication (docs/REPLICATION.md) the durable point is the lesser of the local commit
 * and the epoch --min-replicas followers applied.
 *
 * The tables are its owner's (the bank's registry): it reaches them only through kb_commit_tables_t, so
 * nothing here calls up into the bank. */
#ifndef KB_COMMIT_H
#define KB_COMMIT_H

#include "kb_batch.h"
#include "kb_cache.h"
#include "kb_dedup.h"
#include "kb_journal.h"
#include "kb_memory.h"
#include "kb_store.h"
#include "kb_table.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_commit kb_commit_t;

enum {
    KB_COMMIT_OK = 0,
    KB_COMMIT_ESTORAGE = -3,  /* the store failed or did not commit in time; the error text says why */
    KB_COMMIT_ECONFLICT = -4, /* a replicated epoch refused (not a follower, out of order, malformed) */
};

/* What the pipeline needs of its owner's tables. Every function is called with ctx. */
typedef struct {
    /* Acquires every live table into a new array *out; returns the count. Each is released with release,
     * *out is freed with free. */
    size_t (*acquire_all)(void *ctx, kb_table_t ***out);
    void (*release)(void *ctx, kb_table_t *table);
    /* Moves the table creates and drops made since the last call onto b's ops. Called while the persister
     * holds the write bracket exclusively. */
    void (*take_ops)(void *ctx, kb_batch_t *b);
    /* A follower: whether a replicated batch can be applied (its table configs read), before it is
     * journaled; 0, or nonzero with err. */
    int (*check_replicated)(void *ctx, const kb_batch_t *b, char *err, size_t errlen);
    /* A follower: applies a checked batch's table ops, rows and de-duplication records (under the exclusive
     * bracket). 0, or nonzero when a table could not be created. */
    int (*apply_replicated)(void *ctx, const kb_batch_t *b);
    void *ctx;
} kb_commit_tables_t;

typedef struct {
    const char *data_dir;           /* where the journal lives (its files are removed after a clean close) */
    bool sync;                      /* true: a ticket is durable once committed; false: every interval_ms */
    uint32_t interval_ms;           /* interval durability's period (> 0 when !sync) */
    uint32_t frequency_period_ms;   /* use counts changed by reads are written this often (> 0) */
    uint32_t compact_delay_ms;      /* committed epochs wait this long before compaction (> 0) */
    uint64_t max_memory;            /* --max-memory: SQLite may lag the journal by a quarter of it (0: 256 MiB) */
    uint64_t cache_bytes;           /* --cache-bytes, with cache: and by a quarter of this */
    bool read_only;                 /* nothing is ever committed: kb_commit_start is not called */
    bool replica;                   /* a follower: epochs come through kb_commit_apply_replicated */
    uint32_t min_replicas;          /* a primary's --min-replicas */
    uint64_t compacted_epoch;       /* the newest epoch SQLite holds at start */
    uint64_t committed_epoch;       /* the newest epoch committed at start (new epochs follow it) */
    kb_store_t *store;              /* the compactor's target; not owned */
    kb_journal_t *journal;          /* owned from kb_commit_new on; NULL when read_only */
    kb_dedup_t *dedup;              /* the de-duplication records each epoch carries; not owned */
    kb_memory_t *mem;               /* the estimate the pipeline's batches count in; not owned */
    kb_cache_t *cache;              /* --cache-bytes, or NULL; not owned */
} kb_commit_options_t;

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
} kb_commit_stats_t;

/* A new pipeline over opts' store, journal (taken), dedup, memory and cache and tables' tables. Starts no
 * thread. Caller owns the return value. */
kb_commit_t *kb_commit_new(const kb_commit_options_t *opts, const kb_commit_tables_t *tables);

/* Starts the compactor and the sweeper, and (unless a follower) the persister and the syncer. */
void kb_commit_start(kb_commit_t *self);

/* Stops the threads after a last round that commits everything still in memory, compacts it, closes the
 * journal (removing its files when SQLite holds everything). Accepts NULL; nulls *self_p. */
void kb_commit_destroy(kb_commit_t **self_p);

/* Write bracket. kb_commit_write_end returns the ticket to pass to kb_commit_wait_durable. */
void kb_commit_write_begin(kb_commit_t *self);
uint64_t kb_commit_write_end(kb_commit_t *self);

/* Inside the write bracket: true if (client_id, seq) was applied before, else records it and returns false. */
bool kb_commit_seen_write(kb_commit_t *self, uint64_t client_id, uint64_t seq);

/* Inside the write bracket: forgets a record made by kb_commit_seen_write for a write that failed. */
void kb_commit_forget_write(kb_commit_t *self, uint64_t client_id, uint64_t seq);

/* Waits until ticket is durable (sync durability; immediate in interval mode). Returns 0, or
 * KB_COMMIT_ESTORAGE with a message in err if the store failed or timeout_ms passed. */
int kb_commit_wait_durable(kb_commit_t *self, uint64_t ticket, int timeout_ms, char *err, size_t errlen);

/* Pipelined sync durability: asks the persister for a round that makes ticket durable soon, without
 * waiting. The caller learns of it through the commit hook and kb_commit_durable_epoch. */
void kb_commit_request_durable(kb_commit_t *self, uint64_t ticket);

/* The last durable epoch (every write whose ticket is <= it is on disk, and on --min-replicas followers). */
uint64_t kb_commit_durable_epoch(kb_commit_t *self);

/* Whether a journal append failed, or the pipeline was fenced (kb_commit_fence): then no write commits until
 * the server restarts, writes waiting for a commit are answered at once (kb_commit_wait_durable,
 * kb_commit_not_committed) instead of at their timeout, and the service refuses new writes before applying
 * them. Cheap (atomic loads). */
bool kb_commit_broken(kb_commit_t *self);

/* opts->sync: whether a write's reply waits for its ticket. */
bool kb_commit_sync(const kb_commit_t *self);

/* The error text of a write not durable after timeout_ms, with the last storage error: what
 * kb_commit_wait_durable answers, for a caller that parked the reply instead of waiting. */
void kb_commit_not_committed(kb_commit_t *self, int timeout_ms, char *err, size_t errlen);

/* hook(ctx) is called after every round, committed or failed, and whenever the durable point moves (from the
 * pipeline's threads: it must only signal, e.g. write an eventfd). Set before serving; NULL removes it. */
void kb_commit_set_commit_hook(kb_commit_t *self, void (*hook)(void *ctx), void *ctx);

/* Commits everything now (use counts included), waits until SQLite holds it and checkpoints the SQLite WAL.
 * *committed_epoch: the newest committed epoch then. 0, or KB_COMMIT_ESTORAGE with err (also on a read-only
 * server, which commits nothing, and on a follower, whose commits are its primary's). */
int kb_commit_checkpoint(kb_commit_t *self, uint64_t *committed_epoch, char *err, size_t errlen);

/* The pipeline's figures; journal_bytes is 0 without a journal. */
void kb_commit_get_stats(kb_commit_t *self, kb_commit_stats_t *out);

/* ---- replication (docs/REPLICATION.md; the transport is kb_replica.h) ---- */

/* hook(ctx, epoch, payload, len, crc, rejournal) sees every round of a primary, in epoch order, before it is
 * appended to the local journal; an empty round has len 0. Called from the persister or syncer thread; it
 * must copy what it keeps. */
typedef void (*kb_commit_ship_fn)(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc,
                                  bool rejournal);
/* Sets the ship hook (NULL removes it, waiting for a call in progress). Returns the newest epoch with a record
 * that the hook may not see (a round collected before it was set): the hook sees every record after it, and
 * may see rounds up to it too (to be ignored). */
uint64_t kb_commit_set_ship_hook(kb_commit_t *self, kb_commit_ship_fn hook, void *ctx);

/* A follower applies its primary's round: checks the CRC, appends the record unchanged to its own journal
 * (fdatasync'ed in sync durability), has the tables apply it (kb_commit_tables_t) and publishes the epoch.
 * Epochs must increase. One thread calls it. KB_COMMIT_OK, or an error with err. */
int kb_commit_apply_replicated(kb_commit_t *self, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc,
                               char *err, size_t errlen);

/* A follower's hook(ctx, epoch), called by kb_commit_apply_replicated on its thread once the round is in the
 * journal and before it is applied: the moment it may be acknowledged. Set before the first apply. */
void kb_commit_set_journaled_hook(kb_commit_t *self, void (*hook)(void *ctx, uint64_t epoch), void *ctx);

/* A follower becomes a primary: its tables writable, persister started; new epochs follow the last applied.
 * KB_COMMIT_ECONFLICT with err when it is not a follower. */
int kb_commit_promote(kb_commit_t *self, char *err, size_t errlen);
bool kb_commit_is_replica(kb_commit_t *self);

/* Primary: K followers have applied every epoch <= epoch (the transport counts acks). */
void kb_commit_set_replicated(kb_commit_t *self, uint64_t epoch);
void kb_commit_set_min_replicas(kb_commit_t *self, uint32_t min_replicas);
uint32_t kb_commit_min_replicas(kb_commit_t *self);

/* A primary's lease (kb-server --lease-ms, docs/REPLICATION.md section 4): writes are taken and acknowledged
 * only before until_ms on this machine's monotonic clock (INT64_MAX, the default: no lease). */
void kb_commit_set_lease(kb_commit_t *self, int64_t until_ms);

/* Whether a write may be taken or acknowledged now (true without a lease, with no clock read); false with the
 * reason in why. The service asks before applying a write, the transport before acknowledging a parked one. */
bool kb_commit_leased(kb_commit_t *self, char *why, size_t whylen);

/* Too few followers have been connected for a while (reason), or enough again (NULL): while short, the
 * service refuses new writes with STATUS_UNAVAILABLE before applying them. */
void kb_commit_set_replicas_short(kb_commit_t *self, const char *reason);
bool kb_commit_replicas_short(kb_commit_t *self, char *why, size_t whylen);

/* Deposes the pipeline: from now on writes are refused (kb_commit_broken) and writes waiting for their
 * commit are answered with reason. For good: a deposed primary rejoins as a follower by restarting. */
void kb_commit_fence(kb_commit_t *self, const char *reason);
bool kb_commit_fenced(kb_commit_t *self);

/* The newest epoch committed here (applied, on a follower), whether or not replicated. */
uint64_t kb_commit_committed_epoch(kb_commit_t *self);

/* ---- snapshots (kb_snapshot.h) ---- */

/* Takes a snapshot's cut without stopping service: commits a round (with the use counts) so every write
 * acknowledged before the call is durable, pauses the compactor, and calls fn(ctx, C) while SQLite holds
 * exactly the epochs <= C (fn opens its read transaction there; a nonzero return fails the cut), then lets
 * compaction go on. *cut_epoch = E >= C: the snapshot is SQLite as fn saw it plus the journal records
 * C < epoch <= E (kb_commit_snapshot_copy_journal); every write is wholly in one epoch. From a successful
 * return until kb_commit_snapshot_end no journal segment is removed. Returns 0, or KB_COMMIT_ESTORAGE with err
 * (and then nothing is held). Worker threads only: it waits for a commit. */
typedef int (*kb_commit_cut_fn)(void *ctx, uint64_t compacted_epoch);
int kb_commit_snapshot_cut(kb_commit_t *self, kb_commit_cut_fn fn, void *ctx, uint64_t *cut_epoch,
                           uint64_t *compacted_epoch, char *err, size_t errlen);

/* Between a cut and its end: kb_journal_copy of the pipeline's journal (kb_journal.h). */
int kb_commit_snapshot_copy_journal(kb_commit_t *self, uint64_t after, uint64_t upto, const char *dest_dir,
                                    char *path_out, size_t path_len, uint64_t *records, char *err,
                                    size_t errlen);

/* Ends what a successful kb_commit_snapshot_cut holds (journal segments may be removed again). */
void kb_commit_snapshot_end(kb_commit_t *self);

#endif
