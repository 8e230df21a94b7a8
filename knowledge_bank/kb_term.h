/* A shard member's replication term, kept in DATA/REPLICATION (docs/REPLICATION.md, section 4).
 *
 * A term is a number the run's coordinator gives each primary of a shard in turn; it only grows. The file
 * holds the member's current term, its role, its name, and the history of terms: for each term, the first
 * journal epoch written in it. Two members agree on an epoch's record when their histories give the epoch
 * the same term (the log-matching rule), which is how a member that comes back after a failover learns
 * whether its journal diverged from the new primary's.
 *
 * The file is text, written atomically (files.h: temporary file, fsync, rename, directory fsync) and checked
 * when read: a magic line with its format version, one key per line, and a CRC-32 of every byte before the
 * crc line. It is not in SQLite (a fence must be durable before it is answered, and the compactor writes
 * SQLite in its own time) nor in the journal (its record format has no room for it).
 *
 *   carls-replication 1
 *   term 3
 *   role follower
 *   member tcp://node2:7070
 *   lineage 5f0c2a9e41d7b803
 *   history 1 1
 *   history 3 4821
 *   crc 1a2b3c4d
 *
 * Return convention: 0, or a negative errno with a message in err naming the file and the line at fault. */
#ifndef KB_TERM_H
#define KB_TERM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_TERM_FILE "REPLICATION"      /* inside the data directory */
#define KB_TERM_VERSION 1u
#define KB_TERM_MAX_MEMBER 255u         /* bytes of a member's name (its endpoint) */
#define KB_TERM_MAX_HISTORY 4096u       /* terms a member can have seen */
#define KB_TERM_MAX_FILE_BYTES (256u << 10)

typedef enum {
    KB_TERM_PRIMARY = 0,  /* accepts writes in its term */
    KB_TERM_FOLLOWER = 1, /* applies the primary's epochs, serves reads */
    KB_TERM_STANDBY = 2,  /* restarted without a primary to follow: serves reads, refuses writes */
} kb_term_role_t;

/* One entry of the history: epochs from first_epoch on were written in term. */
typedef struct {
    uint64_t term;
    uint64_t first_epoch;
} kb_term_span_t;

typedef struct {
    uint64_t lineage;          /* the shard's history this member belongs to: drawn at random by the member that
                                * starts it (kb_term_init), taken over by every follower from its primary's
                                * rounds or snapshot. Two members with data and different lineages hold
                                * unrelated journals, whatever their terms and epochs say (a member started on
                                * an empty data directory starts a new one). 0: unknown (a file without it). */
    uint64_t term;             /* the highest term this member has seen (>= 1) */
    kb_term_role_t role;
    char member[KB_TERM_MAX_MEMBER + 1];
    size_t n_history;          /* >= 1; terms and first epochs both strictly ascending */
    kb_term_span_t history[KB_TERM_MAX_HISTORY];
} kb_term_state_t;

/* The state of a member that starts a shard: a new lineage, term 1, primary, history {1, first_epoch}. */
void kb_term_init(kb_term_state_t *st, const char *member, uint64_t first_epoch);

/* Reads DATA_DIR/REPLICATION into *st. -ENOENT when there is none (a member that never replicated), -EINVAL
 * when it is malformed (err names the file and line), -EIO when it cannot be read. */
int kb_term_load(const char *data_dir, kb_term_state_t *st, char *err, size_t errlen);

/* Writes *st to DATA_DIR/REPLICATION atomically. -EINVAL when *st breaks the rules above, -EIO on a failed
 * write (the old file stays). */
int kb_term_save(const char *data_dir, const kb_term_state_t *st, char *err, size_t errlen);

/* A new term whose epochs start at first_epoch: term must exceed st->term, first_epoch must exceed the last
 * span's first epoch (or equal it: the last term wrote nothing, and its span is replaced). 0 or -EINVAL; the
 * caller saves. */
int kb_term_begin(kb_term_state_t *st, uint64_t term, uint64_t first_epoch);

/* A follower applies a record of `term` at `epoch`: the history gets a span from epoch on when term is newer
 * than the last span's (and st->term follows it up; a fence may have raised st->term already). 0, or -EINVAL
 * for a term or epoch older than the last span's; the caller saves. */
int kb_term_record(kb_term_state_t *st, uint64_t term, uint64_t epoch);

/* The term epoch was written in by st's history, 0 for an epoch before the first span. */
uint64_t kb_term_of_epoch(const kb_term_state_t *st, uint64_t epoch);

/* Whether a member whose journal ends at last_epoch (its state mine) holds epochs the primary's history
 * gives another term: then its journal is not a prefix of the primary's and it must catch up from a
 * snapshot. A member that holds nothing (last_epoch 0) never diverged. */
bool kb_term_diverged(const kb_term_state_t *mine, uint64_t last_epoch, const kb_term_state_t *primary);

/* "primary", "follower" or "standby". */
const char *kb_term_role_name(kb_term_role_t role);

#endif
