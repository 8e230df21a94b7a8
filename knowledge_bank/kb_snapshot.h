/* Bank snapshots: a named, point-in-time, self-checking copy of one server's bank, taken while it serves,
 * and its restore (docs/STATE.md "Snapshots").
 *
 * Taking one (kb_snapshots_create, on a worker thread): kb_commit_snapshot_cut commits a round so that every
 * write acknowledged before the request is in an epoch <= E, and while the compactor is paused a read
 * transaction is opened on bank.sqlite, which then holds exactly the epochs <= C (meta 'journal_epoch',
 * checked). Compaction goes on; the snapshot is that read transaction's image (sqlite3_backup) plus the
 * journal records C < epoch <= E (kb_journal_copy; segments are not removed meanwhile). A write is wholly
 * in one epoch, so it is wholly in the snapshot or wholly after it. Rows carry their optimizer state,
 * pending gradients and use counts, and the epochs carry the write de-duplication records: all of it is
 * in. Lookups and writes go on throughout (only the compactor waits, for the moment it takes to begin the
 * read transaction).
 *
 * Layout: <data dir>/snapshots/NAME/
 *   bank.sqlite                     the store at epoch C
 *   journal/<C+1, 20 digits>.kbj    the journal records C < epoch <= E (absent when C == E)
 *   MANIFEST                        written last (temp + fsync + rename), so a snapshot without one is
 *                                   incomplete and is never restored. Text, one item per line:
 *     carls-snapshot 1
 *     name NAME
 *     created_ms MS
 *     shard I N                     (0 0: an unsharded server)
 *     cut_epoch E
 *     compacted_epoch C
 *     table NAME                    one per table, sorted
 *     file PATH BYTES CRC32         one per file (CRC-32 in 8 hex digits)
 *     manifest_crc CRC32            CRC-32 of every byte before this line
 *
 * Restore (kb_snapshot_restore, before the bank opens): checks the manifest and every file's size and
 * CRC-32, and the shard; then copies the files into <data dir>/restore.tmp (checking their CRC again), writes
 * <data dir>/RESTORING, removes bank.sqlite's WAL and the journal, moves the copies in, and removes
 * RESTORING. A crash before RESTORING leaves the old state (and restore.tmp, removed by the next restore);
 * after it, the server refuses to start (kb_snapshot_check_interrupted) until the restore is run again. */
#ifndef KB_SNAPSHOT_H
#define KB_SNAPSHOT_H

#include "kb_bank.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_SNAPSHOT_MAX_NAME 64

enum {
    KB_SNAPSHOT_OK = 0,
    KB_SNAPSHOT_EINVAL = -1,    /* a bad name */
    KB_SNAPSHOT_EEXISTS = -2,   /* create: the name is taken */
    KB_SNAPSHOT_ENOTFOUND = -3, /* delete, restore: no such snapshot */
    KB_SNAPSHOT_EIO = -4,       /* the copy, the store or the files failed; the text says which */
};

/* What a snapshot's manifest says, and whether the snapshot checks out. */
typedef struct {
    char name[KB_SNAPSHOT_MAX_NAME + 1];
    int64_t created_ms;
    uint64_t cut_epoch, compacted_epoch;
    uint32_t shard_index, shard_count; /* 0 0: unsharded */
    char **tables;                     /* (n_tables) sorted */
    size_t n_tables;
    uint64_t bytes;                    /* the files together */
    bool valid;
    char problem[512];                 /* when not valid: why, naming the file */
} kb_snapshot_info_t;

/* Frees what info holds (not info). */
void kb_snapshot_info_free(kb_snapshot_info_t *info);

/* Snapshot names: 1..KB_SNAPSHOT_MAX_NAME characters of [A-Za-z0-9_.-], not beginning with '.'. */
bool kb_snapshot_name_valid(const char *name);

/* One server's snapshots. Thread-safe. */
typedef struct kb_snapshots kb_snapshots_t;

/* The snapshots of bank (borrowed), taken by shard shard_index of shard_count (0 0 unsharded). Touches no
 * file (a read-only server lists its snapshots); what an interrupted delete left is removed by the next
 * create. */
kb_snapshots_t *kb_snapshots_new(kb_bank_t *bank, uint32_t shard_index, uint32_t shard_count);
void kb_snapshots_destroy(kb_snapshots_t **self_p);

/* Takes snapshot name (see the top of this file); *out describes it (caller frees it). While name is being
 * taken, a second create of it (a client's resend) waits and answers as the snapshot turned out. A resend that
 * comes after it finished is known by its (client_id, sequence), nonzero, the same as the first attempt's: the
 * last KB_SNAPSHOT_RECENT creates are remembered, and it too is answered as the snapshot turned out. Otherwise,
 * once name exists, KB_SNAPSHOT_EEXISTS. On failure nothing of it is left. Returns 0 or a KB_SNAPSHOT_E* code
 * with err. */
#define KB_SNAPSHOT_RECENT 32
int kb_snapshots_create(kb_snapshots_t *self, const char *name, uint64_t client_id, uint64_t sequence,
                        kb_snapshot_info_t *out, char *err, size_t errlen);

/* Every snapshot, sorted by name, checked (verify: every file's CRC-32 too, else sizes). *out is a malloc'd
 * array the caller frees with kb_snapshot_info_free on each. Returns 0, or KB_SNAPSHOT_EIO with err. */
int kb_snapshots_list(kb_snapshots_t *self, bool verify, kb_snapshot_info_t **out, size_t *n, char *err,
                      size_t errlen);

/* Removes snapshot name (valid or not); *out describes what it was. Waits for a create of it in progress.
 * Returns 0 or a KB_SNAPSHOT_E* code with err. */
int kb_snapshots_delete(kb_snapshots_t *self, const char *name, kb_snapshot_info_t *out, char *err, size_t errlen);

/* Checks <data_dir>/snapshots/<name> into *out (caller frees): out->valid, else out->problem. verify: CRCs
 * too. Returns 0, or KB_SNAPSHOT_ENOTFOUND / KB_SNAPSHOT_EINVAL (with out->problem). */
int kb_snapshot_check(const char *data_dir, const char *name, bool verify, kb_snapshot_info_t *out);

/* kb-server --restore: replaces data_dir's store and journal with snapshot name's, as described at the top,
 * after checking it fully and that it was taken by shard shard_index of shard_count. The bank must not be
 * open. Returns 0, or a KB_SNAPSHOT_E* code with err naming the file or the mismatch. */
int kb_snapshot_restore(const char *data_dir, const char *name, uint32_t shard_index, uint32_t shard_count,
                        char *err, size_t errlen);

/* -1 with err when a restore into data_dir was interrupted (<data_dir>/RESTORING exists), else 0. */
int kb_snapshot_check_interrupted(const char *data_dir, char *err, size_t errlen);

#endif
