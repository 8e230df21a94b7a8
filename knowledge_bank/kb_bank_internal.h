/* The bank's state and the commit pipeline's, and the helpers their files share (kb_bank.c,
 * kb_bank_replica.c). Private to the bank: nothing outside knowledge_bank/kb_bank*.c includes it. */
#ifndef KB_BANK_INTERNAL_H
#define KB_BANK_INTERNAL_H

#include "kb_bank.h"
#include "kb_batch.h"
#include "kb_commit.h"
#include "kb_cache.h"
#include "kb_dedup.h"
#include "kb_journal.h"
#include "kb_memory.h"
#include "kb_store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* A table in the registry. refs counts the registry itself (while not dropped) plus every acquire. */
typedef struct {
    kb_table_t *table;
    int refs;
    bool dropped;
} kb_bank_entry_t;

/* One round on its way to the journal: an epoch's batch, its encoding and the estimate's share of both. */
typedef struct {
    kb_batch_t batch;
    uint8_t *bytes; /* NULL for an empty round */
    size_t len;
    uint32_t crc;   /* the journal record's checksum, computed with the encoding */
    int64_t counted;
    bool rejournal; /* it holds every pending set (the compactor asked for them) */
    bool shipped;   /* the ship hook has seen it (a retried append does not ship it again) */
} kb_commit_round_t;

struct kb_commit {
    kb_commit_options_t opts;    /* its store, journal, dedup, mem and cache are the pointers below */
    kb_commit_tables_t tables;   /* the owner's tables */
    kb_store_t *store;
    pthread_mutex_t store_mutex; /* the compactor and checkpoints take turns on the store */
    kb_dedup_t *dedup;

    /* Held shared by write requests, exclusively by the persister while it collects an epoch. */
    pthread_rwlock_t gate;
    atomic_uint_fast64_t epoch; /* the epoch being filled; advanced only under the exclusive gate */

    pthread_mutex_t commit_mutex;
    pthread_cond_t commit_cond;   /* persister -> waiters: committed_epoch advanced or a failure */
    pthread_cond_t persist_cond;  /* waiters -> persister: someone waits */
    uint64_t committed_epoch;
    uint64_t wanted_epoch;        /* pipelined sync writes: the newest epoch a parked reply waits for */
    void (*commit_hook)(void *ctx);
    void *commit_hook_ctx;
    bool stopping;
    atomic_bool journal_broken; /* set under the commit mutex: an append failed, so no later write can commit
                                 * until a restart (writers read it without the mutex, kb_commit_broken) */
    char storage_error[512];      /* last commit failure, "" after a success */
    /* Replication (docs/REPLICATION.md). A replica's epochs are its primary's (kb_commit_apply_replicated); a
     * primary hands every round to the ship hook before its own append, and with min_replicas K > 0 a write
     * is durable once its epoch is committed here and replicated_epoch (K followers applied it) reaches it. */
    bool replica;                 /* commit mutex; changes only under the exclusive gate too (promotion) */
    uint64_t replicated_epoch;    /* commit mutex */
    uint32_t min_replicas;        /* commit mutex */
    pthread_mutex_t ship_mutex;   /* held while the ship hook runs, so removing it waits for a call in flight */
    kb_commit_ship_fn ship_hook;    /* ship mutex */
    void *ship_hook_ctx;
    void (*journaled_hook)(void *ctx, uint64_t epoch); /* a follower's: a round is in its journal */
    void *journaled_ctx;
    uint64_t record_epoch;        /* commit mutex: the newest collected epoch that holds a journal record */
    atomic_bool fenced;
    atomic_bool replicas_short;   /* fewer than min_replicas followers: new writes are refused */
    char short_reason[200];       /* commit mutex */           /* deposed: no write is accepted or acknowledged any more */
    char fence_reason[256];       /* commit mutex */

    pthread_t persister, sweeper;
    bool threads_started;         /* the persister (a replica starts it when promoted) */
    bool sweeper_started;
    uint64_t collected_epoch;     /* commit mutex: the newest epoch the persister has collected */

    /* Sync durability pipelines its rounds: while the syncer appends and fdatasyncs epoch N, the persister
     * collects and encodes N+1 (a round waits here, in the slot, for the syncer). */
    pthread_t syncer;
    bool syncer_started, syncer_stop, slot_full;
    pthread_mutex_t slot_mutex;
    pthread_cond_t slot_cond;
    kb_commit_round_t slot;
    pthread_mutex_t sweep_mutex;
    pthread_cond_t sweep_cond;

    kb_commit_stats_t stats; /* guarded by commit_mutex */

    /* The journal and its compactor (kb_journal.h): the persister appends each epoch's batch to the journal
     * (that is the commit) and queues it; the compactor writes queued batches into SQLite. */
    kb_journal_t *journal;
    pthread_t compactor;
    bool compactor_started;
    pthread_mutex_t compact_mutex;
    pthread_cond_t compact_cond;   /* persister -> compactor: batches queued, or stop */
    pthread_cond_t compacted_cond; /* compactor -> persister, checkpoints: the queue shrank */
    kb_batch_t *queue;             /* journaled batches not yet in SQLite, oldest first */
    size_t queue_count, queue_cap;
    int64_t queue_bytes;           /* their heap bytes (counted in mem) */
    int64_t queue_max_bytes;       /* the persister waits while the queue holds more */
    uint64_t queued_epoch;         /* the newest epoch ever queued */
    uint64_t compacted_epoch;      /* the newest epoch in SQLite (meta 'journal_epoch') */
    uint64_t compactions;
    int64_t queue_since_ms;        /* when the oldest queued epoch was queued */
    bool compact_now;              /* a checkpoint waits: compact without delay */
    bool compacting;               /* a compaction transaction is open */
    bool compactor_stop;
    int compact_delay_ms;          /* fault injection for the crash tests (CARLS_KB_TEST_COMPACTION_DELAY_MS) */
    int compaction_paused;         /* snapshots reading their cut (kb_commit_snapshot_cut): start no compaction */
    /* Pending sets (see "pending sets" below): background compactions store rows without their pending
     * gradients, which live on in the journal from a round that re-journaled every pending set. */
    bool pending_in_journal;       /* off with a cache (rows leave memory and come back from SQLite) */
    atomic_bool rejournal_due;     /* compactor -> persister: re-journal every pending set next round */
    uint64_t rejournal_epoch;      /* compact mutex: the newest committed epoch that did (0: none yet) */
    int64_t stripped_pending_bytes; /* compact mutex: pending sets freed from queued batches (s_strip_pending) */
    int64_t queue_pending_bytes;   /* compact mutex: the pending sets' share of queue_bytes */
    int64_t gradient_bytes_seen;   /* the thread finishing rounds (persister, or syncer in sync mode; rounds are
                                    * serial): gradient bytes the tables had received at the last round */

    kb_memory_t *mem;           /* the memory estimate and --max-memory budget (kb_memory.h) */
    int64_t dedup_mem_counted;  /* persister only: de-duplication records as last added to mem */
    int64_t batch_mem_counted;  /* persister only: the batch being committed as last added to mem */
    atomic_bool frequencies_due; /* a checkpoint or close wants the use counts in the next round */
    int64_t frequencies_taken_ms; /* persister only: monotonic time use counts were last collected */

    kb_cache_t *cache;          /* --cache-bytes (kb_cache.h), or NULL */
};

struct kb_bank {
    kb_bank_options_t opts;
    char *data_dir;
    kb_store_t *store;
    kb_dedup_t *dedup;

    pthread_mutex_t registry_mutex;
    kb_bank_entry_t *entries;
    size_t entry_count, entry_capacity;
    int64_t next_table_id;
    kb_table_op_t *ops; /* guarded by registry_mutex */
    size_t op_count, op_capacity;

    kb_memory_t *mem;    /* the memory estimate and --max-memory budget (kb_memory.h) */
    kb_cache_t *cache;   /* --cache-bytes (kb_cache.h), or NULL */
    kb_journal_t *journal; /* opened at start-up, until the commit pipeline takes it */
    kb_commit_t *commit; /* the commit pipeline (kb_commit.h), once the tables are loaded */
};

/* Registry mutex held: appends an entry holding the registry's reference. */
void kb_bank_add_entry(kb_bank_t *self, kb_table_t *table);
/* Registry mutex held: drops one reference; frees the table and its entry when it was the last (true). */
bool kb_bank_unref_entry(kb_bank_t *self, size_t index);
/* Hands freed heap pages back after a table was freed (without the registry mutex). */
void kb_bank_trim(void);
/* The commit pipeline's check_replicated and apply_replicated (kb_commit_tables_t) over the bank (ctx). */
int kb_bank_check_replicated(void *ctx, const kb_batch_t *b, char *err, size_t errlen);
int kb_bank_apply_replicated_batch(void *ctx, const kb_batch_t *b);
/* Hands a journaled batch to the compactor (its contents move; b is left empty). */
void kb_commit_queue_batch(kb_commit_t *self, kb_batch_t *b);
/* Waits while SQLite lags the journal by more than the queue's bound. */
void kb_commit_wait_for_compaction_room(kb_commit_t *self);
/* Starts the persister, and the syncer in sync durability. */
void kb_commit_start_writer_threads(kb_commit_t *self);

#endif
