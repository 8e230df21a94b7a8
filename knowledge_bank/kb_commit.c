/* The commit pipeline (kb_commit.h): write bracket, tickets, persister, syncer, compactor, sweeper and the
 * durable point. Its owner's tables are reached through kb_commit_tables_t only. */
#include "kb_commit.h"

#include "kb_batch.h"
#include "kb_cache.h"
#include "kb_dedup.h"
#include "kb_journal.h"
#include "kb_memory.h"
#include "kb_store.h"
#include "kb_table.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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
    kb_commit_ship_fn ship_hook;  /* ship mutex */
    void *ship_hook_ctx;
    void (*journaled_hook)(void *ctx, uint64_t epoch); /* a follower's: a round is in its journal */
    void *journaled_ctx;
    uint64_t record_epoch;        /* commit mutex: the newest collected epoch that holds a journal record */
    atomic_bool fenced;           /* deposed: no write is accepted or acknowledged any more */
    atomic_bool replicas_short;   /* fewer than min_replicas followers: new writes are refused */
    atomic_int_fast64_t lease_until_ms; /* a leased primary acknowledges writes only before it (monotonic);
                                         * INT64_MAX: no lease asked */
    char short_reason[200];       /* commit mutex */
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


/* ---- write bracket and durability ---- */

void kb_commit_write_begin(kb_commit_t *self) { pthread_rwlock_rdlock(&self->gate); }

uint64_t kb_commit_write_end(kb_commit_t *self)
{
    /* The persister advances the epoch only under the exclusive gate, so everything this request changed
     * is collected in the epoch read here, or (if it was read after a collection began) in a later one. */
    uint64_t ticket = atomic_load(&self->epoch);
    pthread_rwlock_unlock(&self->gate);
    return ticket;
}

bool kb_commit_seen_write(kb_commit_t *self, uint64_t client_id, uint64_t seq)
{
    return kb_dedup_check_and_record(self->dedup, client_id, seq);
}

void kb_commit_forget_write(kb_commit_t *self, uint64_t client_id, uint64_t seq)
{
    kb_dedup_forget(self->dedup, client_id, seq);
}

static void s_deadline(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* The newest epoch a write may be acknowledged at: committed here and, with min_replicas, applied by that
 * many followers. Commit mutex held. */
static uint64_t s_durable_locked(const kb_commit_t *self)
{
    if (self->min_replicas && self->replicated_epoch < self->committed_epoch)
        return self->replicated_epoch;
    return self->committed_epoch;
}

/* Whether waiting longer for a commit is pointless: the journal broke, or the bank was fenced. */
static bool s_commit_hopeless(kb_commit_t *self)
{
    return atomic_load(&self->journal_broken) || atomic_load(&self->fenced);
}

/* The error of a write still not durable after timeout_ms, with the last storage error. Commit mutex held. */
static void s_not_committed_locked(const kb_commit_t *self, int timeout_ms, char *err, size_t errlen)
{
    if (atomic_load(&self->fenced))
        snprintf(err, errlen, "write not acknowledged: %s", self->fence_reason);
    else if (atomic_load(&self->journal_broken))
        snprintf(err, errlen, "write not committed: %s", self->storage_error);
    else
        snprintf(err, errlen, "write not committed within %d ms%s%s%s", timeout_ms,
                 s_durable_locked(self) < self->committed_epoch ? " (not yet on --min-replicas followers)" : "",
                 self->storage_error[0] ? ": " : "", self->storage_error);
}

/* Waits until epoch `ticket` has committed (and, with `replicated`, reached min_replicas followers), waking
 * the persister. Any durability mode. */
static int s_wait_epoch(kb_commit_t *self, uint64_t ticket, bool replicated, int timeout_ms, char *err,
                        size_t errlen)
{
    struct timespec deadline;
    s_deadline(&deadline, timeout_ms);
    int rc = KB_COMMIT_OK;
    pthread_mutex_lock(&self->commit_mutex);
    if (ticket > self->wanted_epoch)
        self->wanted_epoch = ticket;
    pthread_cond_signal(&self->persist_cond);
    while ((replicated ? s_durable_locked(self) : self->committed_epoch) < ticket && !self->stopping &&
           !(replicated ? s_commit_hopeless(self) : atomic_load(&self->journal_broken))) {
        if (pthread_cond_timedwait(&self->commit_cond, &self->commit_mutex, &deadline) == ETIMEDOUT)
            break;
    }
    if ((replicated ? s_durable_locked(self) : self->committed_epoch) < ticket ||
        (replicated && atomic_load(&self->fenced))) {
        s_not_committed_locked(self, timeout_ms, err, errlen);
        rc = KB_COMMIT_ESTORAGE;
    }
    pthread_mutex_unlock(&self->commit_mutex);
    return rc;
}

int kb_commit_wait_durable(kb_commit_t *self, uint64_t ticket, int timeout_ms, char *err, size_t errlen)
{
    if (!self->opts.sync)
        return KB_COMMIT_OK;
    return s_wait_epoch(self, ticket, true, timeout_ms, err, errlen);
}

void kb_commit_request_durable(kb_commit_t *self, uint64_t ticket)
{
    pthread_mutex_lock(&self->commit_mutex);
    if (ticket > self->wanted_epoch) {
        self->wanted_epoch = ticket;
        pthread_cond_signal(&self->persist_cond);
    }
    pthread_mutex_unlock(&self->commit_mutex);
}

bool kb_commit_broken(kb_commit_t *self) { return s_commit_hopeless(self); }

bool kb_commit_sync(const kb_commit_t *self) { return self->opts.sync; }

bool kb_commit_fenced(kb_commit_t *self) { return atomic_load(&self->fenced); }

uint64_t kb_commit_durable_epoch(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    uint64_t epoch = s_durable_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
    return epoch;
}

void kb_commit_not_committed(kb_commit_t *self, int timeout_ms, char *err, size_t errlen)
{
    pthread_mutex_lock(&self->commit_mutex);
    s_not_committed_locked(self, timeout_ms, err, errlen);
    pthread_mutex_unlock(&self->commit_mutex);
}

void kb_commit_set_commit_hook(kb_commit_t *self, void (*hook)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&self->commit_mutex);
    self->commit_hook = hook;
    self->commit_hook_ctx = ctx;
    pthread_mutex_unlock(&self->commit_mutex);
}

/* ---- persister ---- */

/* Whether this round also collects the use counts reads changed: when asked (checkpoint, close), when a
 * period has passed and no write waits on the round, or when two have passed regardless -- so a sync
 * writer rarely pays for them but a steady write load cannot hold them back forever. Under the gate: a
 * checkpoint sets frequencies_due before it takes its ticket, so the round that collects the ticket's epoch
 * (or an earlier one) sees it. */
static bool s_frequencies_due(kb_commit_t *self, bool writer_waits)
{
    int64_t now = carls_monotonic_ms();
    int64_t since = now - self->frequencies_taken_ms;
    int64_t period = self->opts.frequency_period_ms;
    bool due = atomic_exchange(&self->frequencies_due, false) || (since >= period && !writer_waits) ||
               since >= 2 * period;
    if (due)
        self->frequencies_taken_ms = now;
    return due;
}

/* Collects one epoch's changes into b (empty: each round moves its batch out). Returns true when the
 * compactor had asked for the pending sets and this round took every one of them. */
static bool s_collect(kb_commit_t *self, kb_batch_t *b, bool writer_waits)
{
    pthread_rwlock_wrlock(&self->gate);
    b->epoch = atomic_fetch_add(&self->epoch, 1);
    kb_cache_note_epoch(self->cache, b->epoch); /* rows collected now are clean once b->epoch is compacted */
    bool frequencies = s_frequencies_due(self, writer_waits);

    self->tables.take_ops(self->tables.ctx, b);

    bool rejournal = atomic_exchange(&self->rejournal_due, false);
    kb_table_t **tables;
    size_t n = self->tables.acquire_all(self->tables.ctx, &tables);
    for (size_t i = 0; i < n; i++) {
        if (rejournal)
            kb_table_mark_pending_dirty(tables[i]);
        kb_table_take_dirty(tables[i], &b->rows, &b->row_count, &b->row_capacity);
    }

    kb_dedup_record_t *fresh = NULL;
    size_t fresh_cap = 0;
    size_t fresh_n = kb_dedup_take_dirty(self->dedup, &fresh, &fresh_cap);
    pthread_rwlock_unlock(&self->gate);

    /* Use counts belong to no epoch, so writers need not wait while they are gathered. They follow the
     * whole rows in the batch: a row changed after the gate opened is taken off the count list by that
     * change and written whole next round, with its count. */
    for (size_t i = 0; frequencies && i < n; i++)
        kb_table_take_frequencies(tables[i], &b->rows, &b->row_count, &b->row_capacity);
    for (size_t i = 0; i < n; i++)
        self->tables.release(self->tables.ctx, tables[i]);
    free(tables);
    if (fresh_n) {
        if (b->client_count + fresh_n > b->client_capacity) {
            b->client_capacity = b->client_count + fresh_n;
            b->clients = carls_xrealloc(b->clients, b->client_capacity * sizeof *b->clients);
        }
        memcpy(b->clients + b->client_count, fresh, fresh_n * sizeof *fresh);
        b->client_count += fresh_n;
    }
    free(fresh);
    return rejournal;
}

/* Brings the estimate's share of the persister's batch and of the de-duplication records up to date.
 * Persister thread only (or at close, after it stopped). */
static void s_account(kb_commit_t *self, const kb_batch_t *b)
{
    int64_t batch = kb_batch_bytes(b);
    int64_t dedup = (int64_t)kb_dedup_memory(self->dedup);
    kb_memory_add(self->mem, batch - self->batch_mem_counted + dedup - self->dedup_mem_counted);
    self->batch_mem_counted = batch;
    self->dedup_mem_counted = dedup;
}

static int64_t s_pending_heap_bytes(const kb_batch_t *b);
static void s_gradient_bytes(kb_commit_t *self, int64_t *pending, int64_t *received);

/* Hands a journaled batch to the compactor (its contents move; b is left empty). */
static void s_queue_batch(kb_commit_t *self, kb_batch_t *b)
{
    int64_t bytes = kb_batch_bytes(b);
    pthread_mutex_lock(&self->compact_mutex);
    self->queue = carls_grow(self->queue, &self->queue_cap, self->queue_count + 1, sizeof *self->queue);
    if (self->queue_count == 0)
        self->queue_since_ms = carls_monotonic_ms();
    self->queue[self->queue_count++] = *b;
    self->queue_bytes += bytes;
    self->queue_pending_bytes += s_pending_heap_bytes(b);
    self->queued_epoch = b->epoch;
    pthread_cond_signal(&self->compact_cond);
    pthread_mutex_unlock(&self->compact_mutex);
    kb_memory_add(self->mem, bytes);
    memset(b, 0, sizeof *b);
}

static int64_t s_batch_pending_bytes(const kb_batch_t *b);
static bool s_rejournal_pays_against(int64_t pending_bytes, int64_t live_bytes);

/* Heap bytes of a batch's pending sets (their share of kb_batch_bytes). */
static int64_t s_pending_heap_bytes(const kb_batch_t *b)
{
    int64_t bytes = 0;
    for (size_t i = 0; i < b->row_count; i++)
        if (b->rows[i].pending)
            bytes += (int64_t)kb_memory_chunk((size_t)b->rows[i].pending_count * b->rows[i].dim * sizeof(float));
    return bytes;
}

/* The queue's bytes that a compaction writes or frees. With pending sets kept in the journal, the queued
 * pending sets that belong to the newest re-journaling round (and the rounds after it, or the rounds before
 * one that is coming: they let go of theirs when it is queued, s_strip_pending) are not among them. Those
 * are as large as the tables' own pending sets however far SQLite lags, so up to that much the queue's
 * pending sets count in the memory estimate but not towards a compaction or the persister's backpressure;
 * beyond it (rounds that kept theirs because re-journaling did not pay) they count. Counting them all made
 * the first round of a push load, 220 MB at 100k keys, pass the half-bound and go into SQLite whole. Compact
 * mutex held. */
static int64_t s_compactable_bytes(kb_commit_t *self)
{
    if (!self->pending_in_journal || self->queue_pending_bytes == 0)
        return self->queue_bytes;
    int64_t live, received;
    s_gradient_bytes(self, &live, &received);
    return self->queue_bytes - (self->queue_pending_bytes < live ? self->queue_pending_bytes : live);
}

/* Over all tables: the bytes of the pending gradients they hold now (what a re-journaling round writes) and
 * of the gradients they have received since they were created. */
static void s_gradient_bytes(kb_commit_t *self, int64_t *pending, int64_t *received)
{
    *pending = *received = 0;
    kb_table_t **tables;
    size_t n = self->tables.acquire_all(self->tables.ctx, &tables);
    for (size_t i = 0; i < n; i++) {
        kb_table_stats_t st;
        kb_table_get_stats(tables[i], &st);
        int64_t row_bytes = kb_table_config(tables[i])->dim * (int64_t)sizeof(float);
        *pending += (int64_t)st.pending_gradients * row_bytes;
        *received += (int64_t)st.gradients_received * row_bytes;
        self->tables.release(self->tables.ctx, tables[i]);
    }
    free(tables);
}

/* Under a push load every round is a re-journaling round: when the gradients pushed since the last round
 * would make re-journaling every pending set pay (s_rejournal_pays_against), the next round takes them all.
 * Nearly every pending set is dirty in such a round anyway, and each such round lets the compactor store the
 * rounds before it without their pending sets (s_strip_pending). Asking only after a compaction left the
 * first rounds of a load without one: each held hundreds of MB of pending sets at 100k keys, the queue
 * passed its bound and compactions went whole, seconds each, with the persister waiting. Persister thread. */
static void s_ask_rejournal_under_pushes(kb_commit_t *self)
{
    if (!self->pending_in_journal)
        return;
    int64_t live, received;
    s_gradient_bytes(self, &live, &received);
    int64_t pushed = received > self->gradient_bytes_seen ? received - self->gradient_bytes_seen : 0;
    self->gradient_bytes_seen = received;
    if (pushed > 0 && s_rejournal_pays_against(pushed, live))
        atomic_store(&self->rejournal_due, true);
}

/* Frees the pending sets of the queued batches older than a re-journaling round just queued (epoch): no
 * compaction needs them any more. A background compaction stores those batches without them, and a whole one
 * (close, checkpoint) writes them in epoch order up to and past that round, which holds every pending set
 * there was; a set missing from it was applied or dropped by a change journaled in between (s_compactor_main).
 * Under a push load nearly every row has a pending set in every round, max_pending x dim floats: a queue that
 * kept them held 184 MB a round at 100k keys, passed its bound after one, and compactions went whole. Returns
 * the bytes freed. Compact mutex held. */
static int64_t s_strip_pending(kb_commit_t *self, uint64_t epoch)
{
    int64_t freed = 0;
    for (size_t i = 0; i < self->queue_count && self->queue[i].epoch < epoch; i++) {
        kb_batch_t *b = &self->queue[i];
        freed += s_pending_heap_bytes(b); /* the pending arrays' share of kb_batch_bytes: what goes */
        self->stripped_pending_bytes += s_batch_pending_bytes(b);
        for (size_t j = 0; j < b->row_count; j++) {
            free(b->rows[j].pending);
            b->rows[j].pending = NULL;
            b->rows[j].pending_count = 0;
        }
    }
    self->queue_pending_bytes -= freed;
    self->queue_bytes -= freed;
    return freed;
}

/* Backpressure: while SQLite lags too far behind the journal, the persister waits for the compactor (so
 * memory stays bounded; writers then wait at the speed of SQLite). */
static void s_wait_for_compaction_room(kb_commit_t *self)
{
    pthread_mutex_lock(&self->compact_mutex);
    while (s_compactable_bytes(self) > self->queue_max_bytes && !self->compactor_stop) {
        struct timespec deadline;
        s_deadline(&deadline, 100);
        pthread_cond_timedwait(&self->compacted_cond, &self->compact_mutex, &deadline);
    }
    pthread_mutex_unlock(&self->compact_mutex);
}

/* First half of a round: collect the epoch (moving it out of b, whose arrays the next round regrows) and
 * encode it. Persister thread only. */
static void s_prepare_round(kb_commit_t *self, kb_batch_t *b, bool writer_waits, kb_commit_round_t *r)
{
    s_wait_for_compaction_room(self);
    memset(r, 0, sizeof *r);
    r->rejournal = s_collect(self, b, writer_waits);
    bool record = b->op_count || b->row_count || b->client_count;
    pthread_mutex_lock(&self->commit_mutex);
    self->collected_epoch = b->epoch;
    if (record)
        self->record_epoch = b->epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    r->batch = *b;
    memset(b, 0, sizeof *b);
    s_account(self, b);
    r->counted = kb_batch_bytes(&r->batch);
    if (record) {
        r->bytes = kb_batch_encode(&r->batch, &r->len);
        r->crc = kb_journal_crc(r->batch.epoch, r->bytes, r->len);
        /* The encoded copy is as large as the batch for a while: the estimate counts it while it lives, so
         * a flood of new rows meets --max-memory before the resident size goes past it. */
        r->counted += (int64_t)kb_memory_chunk(r->len);
    }
    kb_memory_add(self->mem, r->counted);
}

/* Frees what a round still holds (its encoding, and its batch unless the queue took it) and its share of the
 * estimate; r is left empty. */
static void s_round_free(kb_commit_t *self, kb_commit_round_t *r)
{
    kb_memory_add(self->mem, -r->counted);
    free(r->bytes);
    kb_batch_free(&r->batch);
    memset(r, 0, sizeof *r);
}

/* Second half: append to the journal (the commit), publish, queue for compaction. Returns 0 on success;
 * on failure r is kept as it is, to be tried again. Rounds finish in the order they were prepared. */
static int s_finish_round(kb_commit_t *self, kb_commit_round_t *r)
{
    kb_batch_t *b = &r->batch;
    char why[512] = "";
    if (!r->shipped) {
        /* Followers get the round before the local append, so their fdatasync overlaps this one's. */
        pthread_mutex_lock(&self->ship_mutex);
        if (self->ship_hook)
            self->ship_hook(self->ship_hook_ctx, b->epoch, r->bytes, r->len, r->crc, r->rejournal);
        pthread_mutex_unlock(&self->ship_mutex);
        r->shipped = true;
    }
    int rc = r->bytes ? kb_journal_append_crc(self->journal, b->epoch, r->bytes, r->len, r->crc, why, sizeof why)
                      : 0;
    pthread_mutex_lock(&self->commit_mutex);
    if (rc == 0) {
        if (r->bytes)
            self->stats.commits++;
        size_t frequencies = 0;
        for (size_t i = 0; i < b->row_count; i++)
            frequencies += b->rows[i].frequency_only;
        self->stats.rows_written += b->row_count - frequencies;
        self->stats.frequencies_written += frequencies;
        self->committed_epoch = b->epoch;
        self->stats.committed_epoch = b->epoch;
        self->storage_error[0] = '\0';
    } else {
        self->stats.commit_failures++;
        snprintf(self->storage_error, sizeof self->storage_error, "%s", why);
        /* Waiting writers are answered now: their commit cannot come before a restart. */
        atomic_store(&self->journal_broken, kb_journal_is_broken(self->journal));
    }
    pthread_cond_broadcast(&self->commit_cond);
    if (self->commit_hook)
        self->commit_hook(self->commit_hook_ctx);
    pthread_mutex_unlock(&self->commit_mutex);
    if (rc != 0)
        return rc;
    uint64_t epoch = b->epoch;
    s_ask_rejournal_under_pushes(self);
    if (r->bytes)
        s_queue_batch(self, b); /* moves the batch (empties b), counted again, now in the queue */
    if (r->rejournal) {
        /* Even an empty round counts: then no row had a pending set, nor changed since the last round. */
        pthread_mutex_lock(&self->compact_mutex);
        self->rejournal_epoch = epoch;
        int64_t freed = s_strip_pending(self, epoch);
        pthread_cond_signal(&self->compact_cond);
        pthread_cond_broadcast(&self->compacted_cond); /* the queue shrank */
        pthread_mutex_unlock(&self->compact_mutex);
        kb_memory_add(self->mem, -freed);
    }
    s_round_free(self, r);
    return 0;
}

/* Whether a failing round is dropped: once the bank is closing and it failed three times. */
static bool s_give_up(kb_commit_t *self, int failures)
{
    pthread_mutex_lock(&self->commit_mutex);
    bool stopping = self->stopping;
    pthread_mutex_unlock(&self->commit_mutex);
    return stopping && failures >= 3;
}

/* Finishes r, trying again every 100 ms while it fails (a failed append breaks the journal for good in most
 * cases, and then nothing more is acknowledged: writers get the storage error). Gives up only once the bank
 * is closing and three tries failed, then drops the round and logs what was not saved. */
static void s_finish_retrying(kb_commit_t *self, kb_commit_round_t *r)
{
    for (int failures = 0; s_finish_round(self, r) != 0;) {
        failures++;
        if (failures % 50 == 1)
            LOG_ERROR("commit failed (%d in a row), will retry: %s", failures, self->storage_error);
        if (s_give_up(self, failures)) {
            LOG_ERROR("commit given up: %s; %zu rows not saved", self->storage_error, r->batch.row_count);
            s_round_free(self, r);
            return;
        }
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* After a compaction: every cached table frees rows while the cache is over its budget. */
static void s_cache_shrink_all(kb_commit_t *self)
{
    if (!self->cache || !kb_cache_over(self->cache))
        return;
    kb_table_t **tables;
    size_t n = self->tables.acquire_all(self->tables.ctx, &tables);
    for (size_t i = 0; i < n; i++) {
        kb_table_cache_shrink(tables[i]);
        self->tables.release(self->tables.ctx, tables[i]);
    }
    free(tables);
}


/* ---- compactor ---- */

/* Writes batches into SQLite in one transaction that also records the newest epoch they hold. Store
 * mutex taken here. 0 on success. */
static int s_compact(kb_commit_t *self, kb_batch_t *batches, size_t n, bool without_pending, char *why,
                     size_t whylen)
{
    uint64_t last = batches[n - 1].epoch;
    /* A hot row is in many of the queued epochs: only its newest whole-row write needs to reach SQLite. */
    size_t skipped = kb_batch_mark_superseded(batches, n);
    pthread_mutex_lock(&self->store_mutex);
    int rc = kb_store_begin(self->store);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = kb_batch_write_into(&batches[i], self->store, without_pending);
    if (rc == 0)
        rc = kb_store_put_meta(self->store, "journal_epoch", last);
    if (rc == 0 && self->compact_delay_ms > 0) { /* a crash test's window: the transaction is open */
        struct timespec pause = {self->compact_delay_ms / 1000, (long)(self->compact_delay_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (rc == 0)
        rc = kb_store_commit(self->store);
    if (rc != 0) {
        snprintf(why, whylen, "%s", kb_store_last_error(self->store));
        kb_store_rollback(self->store);
    }
    pthread_mutex_unlock(&self->store_mutex);
    if (rc == 0) {
        pthread_mutex_lock(&self->commit_mutex);
        self->stats.compaction_rows_skipped += skipped;
        self->stats.compactions_without_pending += without_pending;
        pthread_mutex_unlock(&self->commit_mutex);
    }
    return rc;
}

/* Whether the compactor should start now: at close, when a checkpoint waits, when the queue holds
 * COMPACT_BYTES (or a quarter of what it may, if less), or when its oldest epoch has waited
 * compact_delay_ms. Waiting lets a hot row's many epochs collapse into one SQLite write
 * (kb_batch_mark_superseded); the byte bound keeps the memory that waiting holds small. Compact mutex held. */
#define COMPACT_BYTES ((int64_t)32 << 20)

/* Whether the queue holds only the re-journaling round that the last compaction left. Compact mutex held. */
static bool s_only_rejournal_queued(const kb_commit_t *self)
{
    return self->queue_count == 1 && self->queue[0].epoch == self->rejournal_epoch;
}

static bool s_compaction_due(kb_commit_t *self, int64_t now)
{
    int64_t enough = self->queue_max_bytes / 4 < COMPACT_BYTES ? self->queue_max_bytes / 4 : COMPACT_BYTES;
    /* That round alone is not a reason by its size: it waits for the next epochs (to be compacted without
     * its pending sets then) or for the delay. */
    return self->compactor_stop || self->compact_now ||
           (s_compactable_bytes(self) >= enough && !s_only_rejournal_queued(self)) ||
           now - self->queue_since_ms >= self->opts.compact_delay_ms;
}

/* Bytes of pending gradients in a batch's rows. */
static int64_t s_batch_pending_bytes(const kb_batch_t *b)
{
    int64_t bytes = 0;
    for (size_t i = 0; i < b->row_count; i++)
        bytes += (int64_t)b->rows[i].pending_count * b->rows[i].dim * (int64_t)sizeof(float);
    return bytes;
}

/* A byte written into SQLite's B-tree costs the server about this many times a byte appended to the journal,
 * as measured under a push load (compactor against persister per pushed row: docs/BENCHMARKS.md, "Figures
 * behind the code's choices"). */
#define SQLITE_BYTE_COST 4

/* Whether re-journaling every pending set, live_bytes of them (what stripping them from a compaction costs),
 * is cheaper than writing epochs holding pending_bytes of pending sets into SQLite. */
static bool s_rejournal_pays_against(int64_t pending_bytes, int64_t live_bytes)
{
    return pending_bytes * SQLITE_BYTE_COST > live_bytes;
}

/* The same against the pending sets the tables hold now. */
static bool s_rejournal_pays_for(kb_commit_t *self, int64_t pending_bytes)
{
    int64_t live, received;
    s_gradient_bytes(self, &live, &received);
    return s_rejournal_pays_against(pending_bytes, live);
}

/* The same for the queued epochs: true under a push load, where each epoch holds nearly every pending set
 * again; false when a few writes trickle in beside many long-pending sets, or when the queue is the last
 * re-journaling round alone. Compact mutex held. */
static bool s_rejournal_pays(kb_commit_t *self)
{
    if (s_only_rejournal_queued(self))
        return false;
    int64_t queued = 0;
    for (size_t i = 0; i < self->queue_count; i++)
        queued += s_batch_pending_bytes(&self->queue[i]);
    return s_rejournal_pays_for(self, queued);
}

static void *s_compactor_main(void *arg)
{
    kb_commit_t *self = arg;
    int failures = 0;
    /* SQLite work is background work: on a machine with few cores the request thread goes first. */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
        LOG_DEBUG("compactor: cannot lower its priority: %s", strerror(errno));
    pthread_mutex_lock(&self->compact_mutex);
    for (;;) {
        while (self->queue_count == 0 && !self->compactor_stop)
            pthread_cond_wait(&self->compact_cond, &self->compact_mutex);
        if (self->queue_count == 0)
            break; /* stopping, and everything is in SQLite */
        if (self->compaction_paused && !self->compactor_stop) { /* a snapshot reads its cut */
            pthread_cond_wait(&self->compact_cond, &self->compact_mutex);
            continue;
        }
        int64_t now = carls_monotonic_ms();
        if (!s_compaction_due(self, now)) {
            struct timespec deadline;
            s_deadline(&deadline, (int)(self->opts.compact_delay_ms - (now - self->queue_since_ms)));
            pthread_cond_timedwait(&self->compact_cond, &self->compact_mutex, &deadline);
            continue;
        }
        /* Pending sets. Under a push load nearly every row holds pending gradients, and writing them into
         * SQLite at each compaction (max_pending x dim floats a row, on overflow pages) cost the server more
         * CPU than serving the pushes. A background compaction therefore stores rows without them, and only
         * compacts the epochs before a round that re-journaled every pending set (s_collect): whatever
         * pending set those epochs held is either in that round's records or was applied or dropped by a
         * change journaled after them, so SQLite plus the journal after it is still the whole state. At
         * close, for a checkpoint, with a cache, or when the queue is past half its bound and has no such
         * round to compact up to (waiting for one would let it grow on), rows go in whole. With such a round
         * queued, compacting up to it is the quicker way to free memory (several times quicker than a whole
         * compaction of the same rounds). */
        bool whole = !self->pending_in_journal || self->compactor_stop || self->compact_now;
        size_t n = self->queue_count;
        bool needs_round = self->rejournal_epoch <= self->queue[0].epoch; /* none after the oldest epoch */
        if (!whole && needs_round && (s_compactable_bytes(self) > self->queue_max_bytes / 2 || !s_rejournal_pays(self)))
            whole = true;
        if (!whole) {
            if (needs_round) { /* ask the persister's next round */
                atomic_store(&self->rejournal_due, true);
                struct timespec deadline;
                s_deadline(&deadline, 1000);
                pthread_cond_timedwait(&self->compact_cond, &self->compact_mutex, &deadline);
                continue;
            }
            n = 0;
            while (n < self->queue_count && self->queue[n].epoch < self->rejournal_epoch)
                n++;
        }
        self->compact_now = false;
        /* Every stripped batch is older than the newest re-journaling round, so it is in this compaction. */
        int64_t stripped = self->stripped_pending_bytes;
        self->stripped_pending_bytes = 0;
        kb_batch_t *batches = self->queue;
        if (n == self->queue_count) {
            self->queue = NULL;
            self->queue_count = self->queue_cap = 0;
        } else { /* the re-journaling round and what came after it wait for the next compaction */
            batches = carls_xmalloc(n * sizeof *batches);
            memcpy(batches, self->queue, n * sizeof *batches);
            memmove(self->queue, self->queue + n, (self->queue_count - n) * sizeof *batches);
            self->queue_count -= n;
            self->queue_since_ms = carls_monotonic_ms();
        }
        self->compacting = true;
        pthread_mutex_unlock(&self->compact_mutex);

        char why[512];
        int rc = s_compact(self, batches, n, !whole, why, sizeof why);
        int64_t bytes = 0, pending_heap = 0, compacted_pending = stripped;
        if (rc == 0) {
            for (size_t i = 0; i < n; i++) {
                bytes += kb_batch_bytes(&batches[i]);
                pending_heap += s_pending_heap_bytes(&batches[i]);
                compacted_pending += s_batch_pending_bytes(&batches[i]);
            }
            kb_journal_release(self->journal, batches[n - 1].epoch);
            /* Ask for the next re-journaling round now, when the epochs just compacted say it pays (a push
             * load), so that it is queued when the next compaction is due. Waiting to ask until then let
             * the queue grow past its half-bound meanwhile, and that compaction went whole, rows with their
             * pending sets. */
            if (self->pending_in_journal && s_rejournal_pays_for(self, compacted_pending))
                atomic_store(&self->rejournal_due, true);
        }

        pthread_mutex_lock(&self->compact_mutex);
        self->compacting = false;
        if (rc == 0) {
            failures = 0;
            self->compacted_epoch = batches[n - 1].epoch;
            kb_cache_set_compacted(self->cache, self->compacted_epoch);
            self->compactions++;
            self->queue_bytes -= bytes;
            self->queue_pending_bytes -= pending_heap;
            for (size_t i = 0; i < n; i++)
                kb_batch_free(&batches[i]);
            free(batches);
            kb_memory_add(self->mem, -bytes);
            pthread_cond_broadcast(&self->compacted_cond);
            /* The batches were many small blocks the persister's thread allocated: hand their free pages back
             * (glibc keeps them otherwise, and the resident size would stay above the estimate). */
            pthread_mutex_unlock(&self->compact_mutex);
            s_cache_shrink_all(self); /* the rows just compacted may leave memory */
            malloc_trim(0);
            pthread_mutex_lock(&self->compact_mutex);
            continue;
        }
        /* Keep them, in front of what arrived meanwhile; the journal still holds them all. */
        self->stripped_pending_bytes += stripped;
        failures++;
        if (failures % 20 == 1)
            LOG_ERROR("compaction into SQLite failed (%d in a row), will retry: %s", failures, why);
        batches = carls_xrealloc(batches, (n + self->queue_count) * sizeof *batches);
        if (self->queue_count)
            memcpy(batches + n, self->queue, self->queue_count * sizeof *batches);
        free(self->queue);
        self->queue = batches;
        self->queue_since_ms = carls_monotonic_ms();
        self->queue_count += n;
        self->queue_cap = self->queue_count;
        if (self->compactor_stop && failures >= 3)
            break; /* at close: the journal keeps them for the next start to replay */
        struct timespec deadline;
        s_deadline(&deadline, 1000);
        pthread_cond_timedwait(&self->compact_cond, &self->compact_mutex, &deadline);
    }
    pthread_mutex_unlock(&self->compact_mutex);
    return NULL;
}

/* Whether a writer waits on an epoch the persister has not collected yet. Commit mutex held. */
static bool s_writer_waits(const kb_commit_t *self) { return self->wanted_epoch > self->collected_epoch; }

/* Hands a prepared round on: to the syncer's slot in sync durability (waiting while it holds the round
 * before), else finishes it here. */
static void s_hand_over(kb_commit_t *self, kb_commit_round_t *r)
{
    if (!self->syncer_started) {
        s_finish_retrying(self, r);
        return;
    }
    pthread_mutex_lock(&self->slot_mutex);
    while (self->slot_full)
        pthread_cond_wait(&self->slot_cond, &self->slot_mutex);
    self->slot = *r;
    self->slot_full = true;
    pthread_cond_broadcast(&self->slot_cond);
    pthread_mutex_unlock(&self->slot_mutex);
}

static void *s_syncer_main(void *arg)
{
    kb_commit_t *self = arg;
    pthread_mutex_lock(&self->slot_mutex);
    for (;;) {
        while (!self->slot_full && !self->syncer_stop)
            pthread_cond_wait(&self->slot_cond, &self->slot_mutex);
        if (!self->slot_full)
            break; /* stopping, and the persister's last round is done */
        kb_commit_round_t r = self->slot; /* the syncer's until it is finished */
        pthread_mutex_unlock(&self->slot_mutex);
        s_finish_retrying(self, &r);
        pthread_mutex_lock(&self->slot_mutex);
        self->slot_full = false; /* only now: the persister's next round must not overtake this one */
        pthread_cond_broadcast(&self->slot_cond);
    }
    pthread_mutex_unlock(&self->slot_mutex);
    return NULL;
}

static void *s_persister_main(void *arg)
{
    kb_commit_t *self = arg;
    kb_batch_t batch = {0};
    /* Sync mode: idle rounds still come, so use counts (frequency_period_ms) and pending gradients reach
     * disk without a write to carry them. */
    int idle_ms = self->opts.sync ? 200 : (int)self->opts.interval_ms;
    pthread_mutex_lock(&self->commit_mutex);
    while (!self->stopping) {
        if (!s_writer_waits(self)) {
            struct timespec deadline;
            s_deadline(&deadline, idle_ms);
            pthread_cond_timedwait(&self->persist_cond, &self->commit_mutex, &deadline);
            if (self->stopping)
                break;
            /* Interval mode: only the timer (or a checkpoint, which waits) starts a round. */
        }
        bool writer_waits = s_writer_waits(self);
        pthread_mutex_unlock(&self->commit_mutex);
        kb_commit_round_t r;
        s_prepare_round(self, &batch, writer_waits, &r);
        s_hand_over(self, &r);
        pthread_mutex_lock(&self->commit_mutex);
    }
    pthread_mutex_unlock(&self->commit_mutex);
    /* Final round so that a clean shutdown loses nothing, use counts included. */
    atomic_store(&self->frequencies_due, true);
    kb_commit_round_t r;
    s_prepare_round(self, &batch, false, &r);
    s_hand_over(self, &r);
    kb_batch_free(&batch);
    return NULL;
}

/* ---- sweeper ---- */

static void *s_sweeper_main(void *arg)
{
    kb_commit_t *self = arg;
    pthread_mutex_lock(&self->sweep_mutex);
    while (!self->stopping) {
        pthread_mutex_unlock(&self->sweep_mutex);
        kb_table_t **tables;
        size_t n = self->tables.acquire_all(self->tables.ctx, &tables);
        int64_t now = carls_monotonic_ms();
        uint32_t tick_ms = 100;
        for (size_t i = 0; i < n; i++) {
            const kb_table_config_t *cfg = kb_table_config(tables[i]);
            /* Check four times per max_age so a pending set waits at most ~1.25x max_age_ms. */
            uint32_t t = cfg->max_age_ms / 4;
            if (t < tick_ms)
                tick_ms = t < 2 ? 2 : t;
            kb_table_expire(tables[i], now);
            /* Keep nearest-neighbour indexes within one tick of the table. */
            if (kb_table_knn_flush(tables[i]) != 0)
                LOG_WARN("table %s: nearest-neighbour index update failed", kb_table_name(tables[i]));
            self->tables.release(self->tables.ctx, tables[i]);
        }
        free(tables);
        pthread_mutex_lock(&self->sweep_mutex);
        if (self->stopping)
            break;
        struct timespec deadline;
        s_deadline(&deadline, (int)tick_ms);
        pthread_cond_timedwait(&self->sweep_cond, &self->sweep_mutex, &deadline);
    }
    pthread_mutex_unlock(&self->sweep_mutex);
    return NULL;
}

/* The persister, and in sync durability the syncer, which appends and fdatasyncs while the persister collects
 * the next epoch. */
static void s_start_writer_threads(kb_commit_t *self)
{
    if (self->opts.sync) {
        if (pthread_create(&self->syncer, NULL, s_syncer_main, self) != 0)
            CARLS_FATAL("cannot start bank threads");
        pthread_setname_np(self->syncer, "kb-syncer");
        self->syncer_started = true;
    }
    if (pthread_create(&self->persister, NULL, s_persister_main, self) != 0)
        CARLS_FATAL("cannot start bank threads");
    pthread_setname_np(self->persister, "kb-persister");
    self->threads_started = true;
}

kb_commit_t *kb_commit_new(const kb_commit_options_t *opts, const kb_commit_tables_t *tables)
{
    kb_commit_t *self = carls_xcalloc(1, sizeof *self);
    atomic_init(&self->lease_until_ms, INT64_MAX);
    self->opts = *opts;
    self->tables = *tables;
    self->store = opts->store;
    self->journal = opts->journal;
    self->dedup = opts->dedup;
    self->mem = opts->mem;
    self->cache = opts->cache;
    pthread_mutex_init(&self->store_mutex, NULL);
    /* Writer preference: glibc's default lets a steady stream of requests (readers of the gate) starve the
     * persister forever, and in interval durability nothing would ever be committed. No thread takes the
     * gate twice, so the non-recursive writer-preferring kind is safe. */
    pthread_rwlockattr_t gate_attr;
    pthread_rwlockattr_init(&gate_attr);
    pthread_rwlockattr_setkind_np(&gate_attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&self->gate, &gate_attr);
    pthread_rwlockattr_destroy(&gate_attr);
    pthread_mutex_init(&self->commit_mutex, NULL);
    pthread_mutex_init(&self->ship_mutex, NULL);
    pthread_cond_init(&self->commit_cond, NULL);
    pthread_cond_init(&self->persist_cond, NULL);
    pthread_mutex_init(&self->sweep_mutex, NULL);
    pthread_cond_init(&self->sweep_cond, NULL);
    pthread_mutex_init(&self->slot_mutex, NULL);
    pthread_cond_init(&self->slot_cond, NULL);
    atomic_init(&self->frequencies_due, false);
    self->frequencies_taken_ms = carls_monotonic_ms();

    pthread_mutex_init(&self->compact_mutex, NULL);
    pthread_cond_init(&self->compact_cond, NULL);
    pthread_cond_init(&self->compacted_cond, NULL);
    /* SQLite may lag the journal by this much before writers wait for it: a quarter of --max-memory, else
     * 256 MiB; with a cache, at most a quarter of --cache-bytes. */
    self->queue_max_bytes = opts->max_memory ? (int64_t)(opts->max_memory / 4) : (int64_t)256 << 20;
    if (opts->cache && self->queue_max_bytes > (int64_t)(opts->cache_bytes / 4))
        self->queue_max_bytes = (int64_t)(opts->cache_bytes / 4);
    const char *delay = getenv("CARLS_KB_TEST_COMPACTION_DELAY_MS");
    self->compact_delay_ms = delay ? atoi(delay) : 0;

    self->compacted_epoch = self->queued_epoch = opts->compacted_epoch;
    self->committed_epoch = self->stats.committed_epoch = self->collected_epoch = opts->committed_epoch;
    if (!opts->read_only)
        self->record_epoch = opts->committed_epoch;
    atomic_init(&self->epoch, opts->committed_epoch + 1);
    self->dedup_mem_counted = (int64_t)kb_dedup_memory(self->dedup);
    kb_memory_add(self->mem, self->dedup_mem_counted);
    /* A follower compacts every batch whole: its pending sets cannot wait for a re-journaling round, which
     * only its primary decides. */
    self->pending_in_journal = !opts->read_only && self->cache == NULL && !opts->replica;
    self->replica = opts->replica;
    self->min_replicas = opts->replica ? 0 : opts->min_replicas;
    return self;
}

void kb_commit_start(kb_commit_t *self)
{
    if (pthread_create(&self->compactor, NULL, s_compactor_main, self) != 0)
        CARLS_FATAL("cannot start bank threads");
    pthread_setname_np(self->compactor, "kb-compactor"); /* names for top -H, perf and gdb (15 chars at most) */
    self->compactor_started = true;
    if (pthread_create(&self->sweeper, NULL, s_sweeper_main, self) != 0)
        CARLS_FATAL("cannot start bank threads");
    pthread_setname_np(self->sweeper, "kb-sweeper");
    self->sweeper_started = true;
    if (!self->opts.replica) /* a follower's epochs are its primary's, until it is promoted */
        s_start_writer_threads(self);
}

void kb_commit_destroy(kb_commit_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_commit_t *self = *self_p;
    if (self->sweeper_started) {
        pthread_mutex_lock(&self->sweep_mutex);
        pthread_mutex_lock(&self->commit_mutex);
        self->stopping = true;
        pthread_cond_broadcast(&self->persist_cond);
        pthread_mutex_unlock(&self->commit_mutex);
        pthread_cond_broadcast(&self->sweep_cond);
        pthread_mutex_unlock(&self->sweep_mutex);
        pthread_join(self->sweeper, NULL);
    }
    if (self->threads_started)
        pthread_join(self->persister, NULL);
    if (self->syncer_started) { /* after the persister: its last round must be finished first */
        pthread_mutex_lock(&self->slot_mutex);
        self->syncer_stop = true;
        pthread_cond_broadcast(&self->slot_cond);
        pthread_mutex_unlock(&self->slot_mutex);
        pthread_join(self->syncer, NULL);
    }
    if (self->compactor_started) {
        /* The persister's last round is queued: let the compactor put everything into SQLite, then the
         * journal is no longer needed. */
        pthread_mutex_lock(&self->compact_mutex);
        self->compactor_stop = true;
        pthread_cond_broadcast(&self->compact_cond);
        pthread_cond_broadcast(&self->compacted_cond);
        pthread_mutex_unlock(&self->compact_mutex);
        pthread_join(self->compactor, NULL);
    }
    kb_journal_close(&self->journal);
    if (self->compactor_started) {
        char err[512];
        if (self->queue_count)
            LOG_ERROR("%zu journaled epochs could not be written into SQLite; the journal keeps them and the "
                      "next start replays them",
                      self->queue_count);
        else if (kb_journal_remove_all(self->opts.data_dir, err, sizeof err) != 0)
            LOG_WARN("%s", err);
    }
    for (size_t i = 0; i < self->queue_count; i++)
        kb_batch_free(&self->queue[i]);
    free(self->queue);
    pthread_mutex_destroy(&self->store_mutex);
    pthread_mutex_destroy(&self->compact_mutex);
    pthread_cond_destroy(&self->compact_cond);
    pthread_cond_destroy(&self->compacted_cond);
    pthread_rwlock_destroy(&self->gate);
    pthread_mutex_destroy(&self->commit_mutex);
    pthread_mutex_destroy(&self->ship_mutex);
    pthread_cond_destroy(&self->commit_cond);
    pthread_cond_destroy(&self->persist_cond);
    pthread_mutex_destroy(&self->sweep_mutex);
    pthread_cond_destroy(&self->sweep_cond);
    pthread_mutex_destroy(&self->slot_mutex);
    pthread_cond_destroy(&self->slot_cond);
    free(self);
    *self_p = NULL;
}

int kb_commit_checkpoint(kb_commit_t *self, uint64_t *committed_epoch, char *err, size_t errlen)
{
    if (self->opts.read_only) /* nothing to commit, and the files must not change */
        return carls_errorf(err, errlen, KB_COMMIT_ESTORAGE, "this server is read-only: it commits nothing");
    if (kb_commit_is_replica(self)) /* its commits are its primary's */
        return carls_errorf(err, errlen, KB_COMMIT_ESTORAGE, "this server is a follower: checkpoint its primary");
    /* Everything written before this call is in an epoch <= the one being filled now, and the round that
     * collects it (or an earlier one, collecting after this store) takes the use counts too. */
    atomic_store(&self->frequencies_due, true);
    kb_commit_write_begin(self);
    uint64_t ticket = kb_commit_write_end(self);
    if (s_wait_epoch(self, ticket, false, 30000, err, errlen) != 0)
        return KB_COMMIT_ESTORAGE;
    /* Then until SQLite holds everything journaled so far, so the file alone is complete. */
    struct timespec deadline;
    s_deadline(&deadline, 30000);
    pthread_mutex_lock(&self->compact_mutex);
    uint64_t target = self->queued_epoch;
    while (self->compacted_epoch < target) {
        self->compact_now = true;
        pthread_cond_signal(&self->compact_cond);
        if (pthread_cond_timedwait(&self->compacted_cond, &self->compact_mutex, &deadline) == ETIMEDOUT)
            break;
    }
    bool compacted = self->compacted_epoch >= target;
    pthread_mutex_unlock(&self->compact_mutex);
    if (!compacted)
        return carls_errorf(err, errlen, KB_COMMIT_ESTORAGE,
                            "checkpoint: the journal was not compacted into SQLite within 30 s");
    pthread_mutex_lock(&self->store_mutex);
    int rc = kb_store_checkpoint(self->store);
    if (rc != 0)
        snprintf(err, errlen, "WAL checkpoint failed: %s", kb_store_last_error(self->store));
    pthread_mutex_unlock(&self->store_mutex);
    pthread_mutex_lock(&self->commit_mutex);
    *committed_epoch = self->committed_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    return rc ? KB_COMMIT_ESTORAGE : KB_COMMIT_OK;
}

void kb_commit_get_stats(kb_commit_t *self, kb_commit_stats_t *out)
{
    pthread_mutex_lock(&self->commit_mutex);
    *out = self->stats;
    pthread_mutex_unlock(&self->commit_mutex);
    pthread_mutex_lock(&self->compact_mutex);
    out->compactions = self->compactions;
    out->compacted_epoch = self->compacted_epoch;
    out->compacting = self->compacting;
    for (size_t i = 0; i < self->queue_count; i++)
        out->compaction_queue_rows += self->queue[i].row_count;
    out->compaction_queue_bytes = (uint64_t)self->queue_bytes;
    pthread_mutex_unlock(&self->compact_mutex);
    out->journal_bytes = self->journal ? kb_journal_bytes(self->journal) : 0;
}

int kb_commit_snapshot_cut(kb_commit_t *self, kb_commit_cut_fn fn, void *ctx, uint64_t *cut_epoch,
                           uint64_t *compacted_epoch, char *err, size_t errlen)
{
    /* Every write acknowledged before this call is in an epoch <= ticket; the round that commits it takes
     * the use counts too. */
    atomic_store(&self->frequencies_due, true);
    kb_commit_write_begin(self);
    uint64_t ticket = kb_commit_write_end(self);
    if (s_wait_epoch(self, ticket, false, 30000, err, errlen) != 0)
        return KB_COMMIT_ESTORAGE;
    /* No compaction runs while fn reads SQLite's epoch, so the file it reads holds exactly the epochs <= C;
     * the journal keeps every segment from now until kb_commit_snapshot_end. */
    pthread_mutex_lock(&self->compact_mutex);
    self->compaction_paused++;
    while (self->compacting) {
        struct timespec deadline;
        s_deadline(&deadline, 100);
        pthread_cond_timedwait(&self->compacted_cond, &self->compact_mutex, &deadline);
    }
    uint64_t compacted = self->compacted_epoch;
    pthread_mutex_unlock(&self->compact_mutex);
    kb_journal_hold(self->journal);
    /* Any epoch from ticket up to what is committed now is a valid cut: everything acknowledged before the
     * call is in it, and nothing begun after the call returns can be. SQLite may already be past ticket. */
    *cut_epoch = compacted > ticket ? compacted : ticket;
    *compacted_epoch = compacted;
    int rc = fn(ctx, compacted);
    pthread_mutex_lock(&self->compact_mutex);
    self->compaction_paused--;
    pthread_cond_broadcast(&self->compact_cond);
    pthread_mutex_unlock(&self->compact_mutex);
    if (rc != 0) {
        kb_commit_snapshot_end(self);
        return carls_errorf(err, errlen, KB_COMMIT_ESTORAGE, "snapshot: reading the store at epoch %llu failed",
                            (unsigned long long)compacted);
    }
    return KB_COMMIT_OK;
}

int kb_commit_snapshot_copy_journal(kb_commit_t *self, uint64_t after, uint64_t upto, const char *dest_dir,
                                    char *path_out, size_t path_len, uint64_t *records, char *err,
                                    size_t errlen)
{
    return kb_journal_copy(self->journal, after, upto, dest_dir, path_out, path_len, records, err, errlen);
}

void kb_commit_snapshot_end(kb_commit_t *self)
{
    kb_journal_unhold(self->journal);
    pthread_mutex_lock(&self->compact_mutex);
    uint64_t compacted = self->compacted_epoch;
    pthread_mutex_unlock(&self->compact_mutex);
    kb_journal_release(self->journal, compacted); /* what compactions meanwhile would have removed */
}

/* ---- replication (docs/REPLICATION.md) ---- */

uint64_t kb_commit_set_ship_hook(kb_commit_t *self, kb_commit_ship_fn hook, void *ctx)
{
    pthread_mutex_lock(&self->ship_mutex);
    self->ship_hook = hook;
    self->ship_hook_ctx = ctx;
    /* Rounds are collected, then shipped in order: every record the hook will not see is of an epoch <= this. */
    pthread_mutex_lock(&self->commit_mutex);
    uint64_t shipped_before = self->record_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    pthread_mutex_unlock(&self->ship_mutex);
    return shipped_before;
}

/* Publishes a change of the durable point to waiters and to the transport (commit mutex held). */
static void s_publish_locked(kb_commit_t *self)
{
    pthread_cond_broadcast(&self->commit_cond);
    if (self->commit_hook)
        self->commit_hook(self->commit_hook_ctx);
}

void kb_commit_set_replicated(kb_commit_t *self, uint64_t epoch)
{
    pthread_mutex_lock(&self->commit_mutex);
    if (epoch > self->replicated_epoch) {
        self->replicated_epoch = epoch;
        s_publish_locked(self);
    }
    pthread_mutex_unlock(&self->commit_mutex);
}

void kb_commit_set_min_replicas(kb_commit_t *self, uint32_t min_replicas)
{
    pthread_mutex_lock(&self->commit_mutex);
    self->min_replicas = min_replicas;
    s_publish_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
}

uint32_t kb_commit_min_replicas(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    uint32_t k = self->min_replicas;
    pthread_mutex_unlock(&self->commit_mutex);
    return k;
}

void kb_commit_set_replicas_short(kb_commit_t *self, const char *reason)
{
    if (!reason && !atomic_load(&self->replicas_short))
        return;
    pthread_mutex_lock(&self->commit_mutex);
    if (reason && !atomic_load(&self->replicas_short))
        LOG_WARN("new writes are refused until enough followers are back: %s", reason);
    else if (!reason)
        LOG_INFO("enough followers again: writes are accepted");
    snprintf(self->short_reason, sizeof self->short_reason, "%s", reason ? reason : "");
    atomic_store(&self->replicas_short, reason != NULL);
    pthread_mutex_unlock(&self->commit_mutex);
}

bool kb_commit_replicas_short(kb_commit_t *self, char *why, size_t whylen)
{
    if (!atomic_load(&self->replicas_short))
        return false;
    pthread_mutex_lock(&self->commit_mutex);
    snprintf(why, whylen, "%s", self->short_reason);
    pthread_mutex_unlock(&self->commit_mutex);
    return true;
}

void kb_commit_set_lease(kb_commit_t *self, int64_t until_ms)
{
    atomic_store(&self->lease_until_ms, until_ms);
}

bool kb_commit_leased(kb_commit_t *self, char *why, size_t whylen)
{
    const int64_t until = atomic_load(&self->lease_until_ms);
    if (until == INT64_MAX)
        return true; /* no lease asked: no clock read on every acknowledged write */
    const int64_t now = carls_monotonic_ms();
    if (now < until)
        return true;
    if (until == 0)
        snprintf(why, whylen, "no follower has answered since this member became primary (--lease-ms)");
    else
        snprintf(why, whylen, "this primary's lease ran out %" PRId64 " ms ago (no follower has answered within "
                 "--lease-ms; another member may be primary now)", now - until);
    return false;
}

void kb_commit_fence(kb_commit_t *self, const char *reason)
{
    pthread_mutex_lock(&self->commit_mutex);
    if (!atomic_load(&self->fenced)) {
        snprintf(self->fence_reason, sizeof self->fence_reason, "%s", reason);
        atomic_store(&self->fenced, true);
        LOG_WARN("writes are refused from now on: %s", reason);
    }
    s_publish_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
}

bool kb_commit_is_replica(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    bool replica = self->replica;
    pthread_mutex_unlock(&self->commit_mutex);
    return replica;
}

uint64_t kb_commit_committed_epoch(kb_commit_t *self)
{
    pthread_mutex_lock(&self->commit_mutex);
    uint64_t epoch = self->committed_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    return epoch;
}

int kb_commit_apply_replicated(kb_commit_t *self, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc,
                               char *err, size_t errlen)
{
    pthread_mutex_lock(&self->commit_mutex);
    bool replica = self->replica;
    uint64_t committed = self->committed_epoch;
    pthread_mutex_unlock(&self->commit_mutex);
    if (!replica)
        return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu refused: this server is not a follower",
                            (unsigned long long)epoch);
    if (epoch <= committed)
        return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu refused: epoch %llu is applied already",
                            (unsigned long long)epoch, (unsigned long long)committed);
    kb_batch_t b = {0};
    if (len) {
        if (kb_journal_crc(epoch, payload, len) != crc)
            return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu: the record's CRC-32 does not match",
                                (unsigned long long)epoch);
        char why[256];
        if (kb_batch_decode(payload, len, &b, why, sizeof why) != 0)
            return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu: %s", (unsigned long long)epoch, why);
        if (b.epoch != epoch) {
            kb_batch_free(&b);
            return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "epoch %llu: the record holds epoch %llu's batch",
                                (unsigned long long)epoch, (unsigned long long)b.epoch);
        }
        if (self->tables.check_replicated(self->tables.ctx, &b, err, errlen) != 0) {
            /* refused before anything is written, so the epoch is never half applied */
            kb_batch_free(&b);
            return KB_COMMIT_ECONFLICT;
        }
        s_wait_for_compaction_room(self); /* a follower's SQLite may lag as a primary's may */
        /* The same record as the primary's journal holds, so this journal replays to the same state. */
        if (kb_journal_append_crc(self->journal, epoch, payload, len, crc, err, errlen) != 0) {
            pthread_mutex_lock(&self->commit_mutex);
            self->stats.commit_failures++;
            snprintf(self->storage_error, sizeof self->storage_error, "%s", err);
            atomic_store(&self->journal_broken, kb_journal_is_broken(self->journal));
            pthread_mutex_unlock(&self->commit_mutex);
            kb_batch_free(&b);
            return KB_COMMIT_ESTORAGE;
        }
        /* Durable here: it may be acknowledged before it is applied (a restart replays the journal), which
         * keeps the applying off the primary's wait. */
        if (self->journaled_hook)
            self->journaled_hook(self->journaled_ctx, epoch);
        /* Readers see whole epochs: rows change while no write bracket (none runs here) and no collection
         * is open, and the epoch is published after its last row. */
        pthread_rwlock_wrlock(&self->gate);
        int rc = self->tables.apply_replicated(self->tables.ctx, &b);
        pthread_rwlock_unlock(&self->gate);
        if (rc != 0) {
            kb_batch_free(&b);
            return carls_errorf(err, errlen, KB_COMMIT_ESTORAGE, "epoch %llu: a table could not be created",
                                (unsigned long long)epoch);
        }
    }
    atomic_store(&self->epoch, epoch + 1);
    pthread_mutex_lock(&self->commit_mutex);
    if (len) {
        self->stats.commits++;
        self->stats.rows_written += b.row_count;
    }
    self->committed_epoch = self->stats.committed_epoch = self->collected_epoch = epoch;
    if (len)
        self->record_epoch = epoch;
    s_publish_locked(self);
    pthread_mutex_unlock(&self->commit_mutex);
    if (len)
        s_queue_batch(self, &b); /* the compactor writes it into SQLite as the primary's does */
    return KB_COMMIT_OK;
}

void kb_commit_set_journaled_hook(kb_commit_t *self, void (*hook)(void *ctx, uint64_t epoch), void *ctx)
{
    self->journaled_hook = hook;
    self->journaled_ctx = ctx;
}

int kb_commit_promote(kb_commit_t *self, char *err, size_t errlen)
{
    pthread_rwlock_wrlock(&self->gate);
    pthread_mutex_lock(&self->commit_mutex);
    bool replica = self->replica;
    self->replica = false;
    pthread_mutex_unlock(&self->commit_mutex);
    if (!replica) {
        pthread_rwlock_unlock(&self->gate);
        return carls_errorf(err, errlen, KB_COMMIT_ECONFLICT, "this server is not a follower");
    }
    kb_table_t **tables;
    size_t n = self->tables.acquire_all(self->tables.ctx, &tables);
    for (size_t i = 0; i < n; i++) {
        kb_table_set_read_only(tables[i], false);
        self->tables.release(self->tables.ctx, tables[i]);
    }
    free(tables);
    pthread_rwlock_unlock(&self->gate);
    s_start_writer_threads(self);
    LOG_INFO("promoted: accepting writes from epoch %llu", (unsigned long long)atomic_load(&self->epoch));
    return KB_COMMIT_OK;
}
