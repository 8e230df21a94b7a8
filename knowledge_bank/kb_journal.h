/* The bank's journal: an append-only log of the persister's epochs, in front of the SQLite store.
 *
 * A commit used to be a SQLite transaction, which rewrites a 4 KiB page for every random row it touches;
 * now a commit is one sequential append of the epoch's encoded batch (kb_batch_encode) and, in sync
 * durability, one fdatasync. A compactor thread writes the batches into SQLite in the background and
 * records there, in the same transaction, the last epoch it holds (meta 'journal_epoch'); segments whose
 * every record is compacted are then removed. At start-up the bank replays the records newer than that
 * epoch into SQLite before it loads, so SQLite plus the journal always hold every acknowledged write.
 *
 * Files: <data dir>/journal/<first epoch, 20 digits>.kbj, each a sequence of records:
 *   u32 magic 'KBJ1' | u32 payload length | u64 epoch | u32 CRC-32 of (epoch bytes, payload) | payload
 * (little-endian). A segment is closed after segment_bytes and a new one begun. A crash can leave a torn
 * last record in the last segment: replay stops there (its write was never acknowledged). Anything
 * unreadable elsewhere is corruption, and the server refuses to start with the file and offset.
 *
 * Spares (sync mode): a released segment is renamed spare-<epoch>.kbs (at most two) and the next segment
 * is that file renamed <first epoch>.kbr, written over from its start. Overwriting allocated blocks makes
 * each commit's fdatasync cheaper (no size or block-map update to journal on ext4). The stale records of the file's earlier life that follow the log carry older
 * epochs than the name's, so replay tells them apart; a .kbr segment is cut to its records when it is
 * closed. Spares belong to one run: open and remove_all delete them.
 *
 * One thread appends (the persister); release may come from another (the compactor): a mutex orders them. */
#ifndef KB_JOURNAL_H
#define KB_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_journal kb_journal_t;

#define KB_JOURNAL_SEGMENT_BYTES (16u << 20)

/* Opens the journal of data_dir for appending (creating <data_dir>/journal). Existing segments must have
 * been replayed and removed first (kb_journal_replay, kb_journal_remove_all). With sync, every append is
 * fdatasync'ed before it returns, and released segments are reused (spares). segment_bytes: when a segment
 * is closed (0: KB_JOURNAL_SEGMENT_BYTES). Returns 0, or -1 with a message in err. */
int kb_journal_open(const char *data_dir, bool sync, uint64_t segment_bytes, kb_journal_t **out, char *err,
                    size_t errlen);

/* Whether an append failed: from then on every append fails with the same message (the file's state after a
 * failed write or fdatasync is unknown), until the journal is opened again. */
bool kb_journal_is_broken(kb_journal_t *self);

/* Closes the files (nothing is removed). Accepts NULL; nulls *self_p. */
void kb_journal_close(kb_journal_t **self_p);

/* Appends one record and, in sync mode, makes it durable. Epochs must increase. Returns 0, or -1 with a
 * message naming the file in err (the record may be partly written: a later append starts a new segment,
 * and replay stops at the torn record only in a last segment, so the failed segment is closed first). */
int kb_journal_append(kb_journal_t *self, uint64_t epoch, const void *payload, size_t len, char *err,
                      size_t errlen);

/* The same with the record's checksum computed beforehand by kb_journal_crc (the bank's persister does it
 * while the syncer writes the epoch before, which keeps the CRC off the serial append + fdatasync). */
int kb_journal_append_crc(kb_journal_t *self, uint64_t epoch, const void *payload, size_t len, uint32_t crc,
                          char *err, size_t errlen);

/* The checksum a record of this epoch and payload carries. */
uint32_t kb_journal_crc(uint64_t epoch, const void *payload, size_t len);

/* Removes the closed segments whose records all have epoch <= upto (they are compacted); in sync mode up to
 * two of them become spares instead. */
void kb_journal_release(kb_journal_t *self, uint64_t upto);

/* Bytes in the segments not yet removed. */
uint64_t kb_journal_bytes(kb_journal_t *self);

/* Calls fn for every record of data_dir's journal with epoch > after, oldest first (fn returning nonzero
 * stops the replay with that code). *last_epoch: the newest epoch seen (after, when none). Returns 0, or -1
 * with a message naming the file and offset of a corrupt record (or of fn's failure) in err. */
typedef int (*kb_journal_record_fn)(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len);
int kb_journal_replay(const char *data_dir, uint64_t after, kb_journal_record_fn fn, void *ctx,
                      uint64_t *last_epoch, char *err, size_t errlen);

/* Removes every segment and spare of data_dir's journal (after they have been compacted). Returns 0, or -1
 * with err. */
int kb_journal_remove_all(const char *data_dir, char *err, size_t errlen);

/* ---- snapshots (kb_snapshot.h) ---- */

/* While held (holds nest), kb_journal_release removes nothing, so a snapshot can copy segments the compactor
 * has already written into SQLite. Segments it would have removed go at the next release after the unhold. */
void kb_journal_hold(kb_journal_t *self);
void kb_journal_unhold(kb_journal_t *self);

/* Copies the records with after < epoch <= upto, unchanged (header, CRC and payload), into one new segment
 * <dest_dir>/journal/<after + 1, 20 digits>.kbj, fsynced with its directory; every record <= upto must be
 * committed (appended) already, and the journal held. Reads each segment only as far as its committed
 * length (never an append in progress) and checks each record's CRC. *records: how many were copied; when
 * any were, path_out gets the file's path relative to dest_dir ("" otherwise). Returns 0, or -1 with err
 * naming the file. */
int kb_journal_copy(kb_journal_t *self, uint64_t after, uint64_t upto, const char *dest_dir, char *path_out,
                    size_t path_len, uint64_t *records, char *err, size_t errlen);

#endif
