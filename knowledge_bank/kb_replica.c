#include "kb_replica.h"
#include "kb_replica_internal.h"

#include "kb_snapshot.h"
#include "kb_term.h"
#include "files.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>


char *kb_replica_dup(const char *s)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        CARLS_FATAL("out of memory");
    return d;
}

static void s_round_unref(void *data, void *hint)
{
    (void)data;
    s_round_t *r = hint;
    if (atomic_fetch_sub(&r->refs, 1) == 1)
        free(r);
}

/* ---- the member's term (kb_term.h) ---- */

/* Saves the state; a failure is logged (the member goes on with the state in memory). Mutex held. */
static int s_save(kb_replica_t *self)
{
    char err[512];
    if (kb_term_save(self->data_dir, self->state, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return -1;
    }
    self->have_state = true;
    return 0;
}

static const char *s_role_name(const kb_replica_t *self)
{
    if (self->primary_running)
        return self->fenced ? "deposed" : "primary";
    return self->replica_of ? "follower" : "standby";
}

/* The role every reply shows (mutex held). */
static void s_publish_role(kb_replica_t *self)
{
    bool writable = self->primary_running && !self->fenced;
    kb_service_set_role(self->service, self->have_state ? self->state->term : 0, writable,
                        self->replica_of ? self->replica_of : "");
}

/* A newer term was seen: a primary stops accepting and acknowledging writes for good. Mutex held. */
static void s_depose(kb_replica_t *self, uint64_t term, const char *why)
{
    if (self->have_state && term > self->state->term) {
        self->state->term = term;
        if (self->primary_running)
            self->state->role = KB_TERM_STANDBY;
        s_save(self);
    }
    if (self->primary_running && !self->fenced) {
        self->fenced = true;
        char reason[256];
        snprintf(reason, sizeof reason, "this member was deposed by term %" PRIu64 " (%s)", term, why);
        kb_commit_fence(self->commit, reason);
    }
    s_publish_role(self);
}

/* ---- messages ---- */

/* Sends msg, and for a record its payload frame (zero-copy from r), to the routing id (primary) or not
 * (follower). 0, or -1 with errno (EAGAIN: the pipe is full; EHOSTUNREACH: the peer is gone). */
static int s_send(void *socket, const uint8_t *id, size_t id_len, const Carls__ReplMessage *msg, s_round_t *r)
{
    uint8_t buf[512];
    size_t len = carls__repl_message__get_packed_size(msg);
    if (len > sizeof buf)
        return errno = EMSGSIZE, -1;
    carls__repl_message__pack(msg, buf);
    if (id && zmq_send(socket, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return -1;
    if (zmq_send(socket, buf, len, (r ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        return -1; /* a routed message's first frame is only queued with the last one */
    if (!r)
        return 0;
    if (r->len == 0)
        return zmq_send(socket, "", 0, ZMQ_DONTWAIT) < 0 ? -1 : 0; /* an empty round */
    zmq_msg_t body;
    atomic_fetch_add(&r->refs, 1);
    if (zmq_msg_init_data(&body, r->data, r->len, s_round_unref, r) != 0) {
        atomic_fetch_sub(&r->refs, 1);
        return -1;
    }
    if (zmq_msg_send(&body, socket, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        zmq_msg_close(&body);
        return errno = e, -1;
    }
    return 0;
}

/* Sends msg (any size) and, when payload is not NULL, a frame of its bytes (copied), to the routing id. */
static int s_send_big(void *socket, const uint8_t *id, size_t id_len, const Carls__ReplMessage *msg,
                      const void *payload, size_t len)
{
    size_t n = carls__repl_message__get_packed_size(msg);
    uint8_t *buf = carls_xmalloc(n ? n : 1);
    carls__repl_message__pack(msg, buf);
    int rc = -1;
    if ((!id || zmq_send(socket, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) &&
        zmq_send(socket, buf, n, (payload ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) >= 0 &&
        (!payload || zmq_send(socket, payload, len, ZMQ_DONTWAIT) >= 0))
        rc = 0;
    free(buf);
    return rc;
}

static void s_send_refuse(void *socket, const uint8_t *id, size_t id_len, uint64_t term, Carls__ReplRefusal reason,
                          const char *text)
{
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplRefuse refuse = CARLS__REPL_REFUSE__INIT;
    refuse.term = term;
    refuse.reason = reason;
    refuse.text = (char *)text;
    msg.body_case = CARLS__REPL_MESSAGE__BODY_REFUSE;
    msg.refuse = &refuse;
    s_send(socket, id, id_len, &msg, NULL);
}

/* Receives one multi-part message without waiting: its frames (at most 3) into parts. Returns the count, 0
 * when none is waiting. */
static int s_recv(void *socket, zmq_msg_t *parts, int max)
{
    int n = 0;
    for (;;) {
        zmq_msg_init(&parts[n]);
        if (zmq_msg_recv(&parts[n], socket, n ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&parts[n]);
            return n;
        }
        bool more = zmq_msg_more(&parts[n]);
        if (n + 1 < max)
            n++;
        else
            zmq_msg_close(&parts[n]); /* surplus frames are dropped */
        if (!more)
            return n;
    }
}

static void s_close_parts(zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

/* ---- primary: the ring and the replicator thread ---- */

/* The ship hook (persister or syncer thread): keeps the round and wakes the replicator. */
static void s_ship(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len, uint32_t crc, bool rejournal)
{
    (void)rejournal; /* a follower compacts whole batches (kb_bank.c) */
    kb_replica_t *self = ctx;
    s_round_t *r = carls_xmalloc(sizeof *r + len);
    atomic_init(&r->refs, 1);
    r->epoch = epoch;
    r->crc = crc;
    r->len = len;
    r->shipped_us = carls_monotonic_us();
    if (len)
        memcpy(r->data, payload, len);
    pthread_mutex_lock(&self->mutex);
    if (self->ring_ready && epoch <= self->ring_base) { /* collected before the hook was set */
        pthread_mutex_unlock(&self->mutex);
        s_round_unref(NULL, r);
        return;
    }
    if (self->ring_first > 0 && self->ring_first >= self->ring_count / 2) {
        memmove(self->ring, self->ring + self->ring_first, (self->ring_count - self->ring_first) * sizeof *self->ring);
        self->ring_count -= self->ring_first;
        self->ring_first = 0;
    }
    self->ring = carls_grow(self->ring, &self->ring_cap, self->ring_count + 1, sizeof *self->ring);
    self->ring[self->ring_count++] = r;
    self->ring_bytes += sizeof *r + len; /* empty rounds count too, or an idle primary would keep them all */
    self->shipped_epoch = epoch;
    /* Oldest rounds go once over the budget (never the newest): a follower that still needed one is told
     * it is too far behind. */
    while (self->ring_bytes > self->buffer_bytes && self->ring_count - self->ring_first > 1) {
        s_round_t *old = self->ring[self->ring_first++];
        self->ring_bytes -= sizeof *old + old->len;
        self->ring_base = old->epoch;
        s_round_unref(NULL, old);
    }
    pthread_mutex_unlock(&self->mutex);
    uint64_t one = 1;
    if (write(self->event_fd, &one, sizeof one) < 0)
        LOG_WARN("replicator wake-up failed: %s", strerror(errno));
}

static s_follower_t *s_follower_by_id(kb_replica_t *self, zmq_msg_t *id)
{
    for (size_t i = 0; i < self->n_followers; i++) {
        s_follower_t *f = &self->followers[i];
        if (f->id_len == zmq_msg_size(id) && memcmp(f->id, zmq_msg_data(id), f->id_len) == 0)
            return f;
    }
    return NULL;
}

/* ---- primary: snapshot catch-up ---- */

/* The snapshot thread: takes the snapshot (it waits for a commit) and lists its files. */
static void *s_snapshot_main(void *arg)
{
    kb_replica_t *self = arg;
    char name[KB_SNAPSHOT_MAX_NAME + 1], err[512];
    pthread_mutex_lock(&self->mutex);
    snprintf(name, sizeof name, "%s", self->transfer.name);
    pthread_mutex_unlock(&self->mutex);
    kb_snapshot_info_t info;
    memset(&info, 0, sizeof info);
    int rc = kb_snapshots_create(self->snapshots, name, 0, 0, &info, err, sizeof err);
    pthread_mutex_lock(&self->mutex);
    s_transfer_t *t = &self->transfer;
    t->taking = false;
    if (rc != KB_SNAPSHOT_OK) {
        LOG_ERROR("replication: snapshot %s for follower %s failed: %s", name, t->member, err);
        t->active = false;
    } else {
        t->cut_epoch = info.cut_epoch;
        t->bytes = info.bytes;
        t->n_files = 0;
        snprintf(t->files[t->n_files++], sizeof t->files[0], "bank.sqlite");
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/snapshots/%s/journal", self->data_dir, name);
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d)) && t->n_files < S_MAX_SNAPSHOT_FILES - 1;)
            if (e->d_name[0] != '.' && strlen(e->d_name) < 40)
                snprintf(t->files[t->n_files++], sizeof t->files[0], "journal/%s", e->d_name);
        if (d)
            closedir(d);
        snprintf(t->files[t->n_files++], sizeof t->files[0], "MANIFEST");
        t->ready = true;
        LOG_INFO("replication: snapshot %s (cut epoch %" PRIu64 ", %" PRIu64 " bytes) goes to follower %s", name,
                 t->cut_epoch, t->bytes, t->member);
    }
    pthread_mutex_unlock(&self->mutex);
    kb_snapshot_info_free(&info);
    uint64_t one = 1;
    if (write(self->event_fd, &one, sizeof one) < 0)
        LOG_WARN("replicator wake-up failed: %s", strerror(errno));
    return NULL;
}

/* A follower the ring cannot serve gets a snapshot (one follower at a time). Mutex held. */
static void s_transfer_start(kb_replica_t *self, const uint8_t *rid, size_t rid_len, const char *member,
                             const char *why)
{
    s_transfer_t *t = &self->transfer;
    if (t->taking && strcmp(t->member, member) != 0) {
        s_send_refuse(self->router, rid, rid_len, self->state->term, CARLS__REPL_REFUSAL__REPL_REFUSE_OTHER,
                      "another follower is receiving a snapshot; try again");
        return;
    }
    t->id_len = rid_len < sizeof t->id ? rid_len : sizeof t->id;
    memcpy(t->id, rid, t->id_len);
    if (t->active && strcmp(t->member, member) != 0) {
        s_send_refuse(self->router, rid, rid_len, self->state->term, CARLS__REPL_REFUSAL__REPL_REFUSE_OTHER,
                      "another follower is receiving a snapshot; try again");
        return;
    }
    if (t->active) { /* the follower started again: so does the transfer, once the snapshot is there */
        t->file_at = 0;
        t->offset = 0;
        t->next_chunk = t->acked_chunks = 0;
        t->begun = false;
        return;
    }
    if (t->thread_joinable) {
        pthread_join(t->thread, NULL);
        t->thread_joinable = false;
    }
    memset(t, 0, sizeof *t);
    t->active = t->taking = true;
    snprintf(t->member, sizeof t->member, "%s", member);
    t->id_len = rid_len < sizeof t->id ? rid_len : sizeof t->id;
    memcpy(t->id, rid, t->id_len);
    snprintf(t->name, sizeof t->name, "replica-%lld", (long long)carls_monotonic_us());
    LOG_WARN("follower %s: %s; sending it snapshot %s", member, why, t->name);
    if (pthread_create(&t->thread, NULL, s_snapshot_main, self) != 0)
        CARLS_FATAL("cannot start the snapshot thread");
    t->thread_joinable = true;
}

/* Sends the next chunks of a ready snapshot within the window, and End once all are acknowledged. Mutex held. */
static void s_transfer_step(kb_replica_t *self)
{
    s_transfer_t *t = &self->transfer;
    if (!t->active || !t->ready)
        return;
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    if (!t->begun) {
        Carls__ReplSnapshotBegin b = CARLS__REPL_SNAPSHOT_BEGIN__INIT;
        uint64_t terms[KB_TERM_MAX_HISTORY], epochs[KB_TERM_MAX_HISTORY];
        b.term = self->state->term;
        b.lineage = self->state->lineage;
        b.name = t->name;
        b.cut_epoch = t->cut_epoch;
        b.bytes = t->bytes;
        for (size_t i = 0; i < self->state->n_history && self->state->history[i].first_epoch <= t->cut_epoch; i++) {
            terms[i] = self->state->history[i].term;
            epochs[i] = self->state->history[i].first_epoch;
            b.n_history_terms = b.n_history_epochs = i + 1;
        }
        b.history_terms = terms;
        b.history_epochs = epochs;
        msg.body_case = CARLS__REPL_MESSAGE__BODY_SNAPSHOT_BEGIN;
        msg.snapshot_begin = &b;
        if (s_send_big(self->router, t->id, t->id_len, &msg, NULL, 0) != 0)
            return;
        t->begun = true;
    }
    uint8_t *buf = NULL;
    while (t->file_at < t->n_files && t->next_chunk - t->acked_chunks < S_CHUNK_WINDOW) {
        char path[1300];
        snprintf(path, sizeof path, "%s/snapshots/%s/%s", self->data_dir, t->name, t->files[t->file_at]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (!buf)
            buf = carls_xmalloc(S_CHUNK_BYTES);
        ssize_t n = fd >= 0 ? pread(fd, buf, S_CHUNK_BYTES, (off_t)t->offset) : -1;
        if (fd >= 0)
            close(fd);
        if (n < 0) {
            LOG_ERROR("replication: reading %s for follower %s: %s", path, t->member, strerror(errno));
            t->active = false;
            break;
        }
        Carls__ReplSnapshotChunk c = CARLS__REPL_SNAPSHOT_CHUNK__INIT;
        c.index = t->next_chunk;
        c.path = t->files[t->file_at];
        c.offset = t->offset;
        c.file_end = (size_t)n < S_CHUNK_BYTES;
        msg.body_case = CARLS__REPL_MESSAGE__BODY_SNAPSHOT_CHUNK;
        msg.snapshot_chunk = &c;
        if (s_send_big(self->router, t->id, t->id_len, &msg, buf, (size_t)n) != 0) {
            if (errno == EHOSTUNREACH) { /* it went away; its next hello starts again */
                LOG_WARN("replication: follower %s left during snapshot %s", t->member, t->name);
                t->active = false;
            }
            break;
        }
        t->next_chunk++;
        if (c.file_end) {
            t->file_at++;
            t->offset = 0;
        } else
            t->offset += (uint64_t)n;
    }
    free(buf);
    if (t->active && t->file_at == t->n_files && t->acked_chunks == t->next_chunk) {
        Carls__ReplSnapshotEnd e = CARLS__REPL_SNAPSHOT_END__INIT;
        e.chunks = t->next_chunk;
        msg.body_case = CARLS__REPL_MESSAGE__BODY_SNAPSHOT_END;
        msg.snapshot_end = &e;
        if (s_send_big(self->router, t->id, t->id_len, &msg, NULL, 0) != 0)
            return;
        LOG_INFO("replication: snapshot %s sent to follower %s (%u chunks)", t->name, t->member, t->next_chunk);
        t->active = false;
    }
    if (!t->active) {
        char err[512];
        kb_snapshot_info_t info;
        if (kb_snapshots_delete(self->snapshots, t->name, &info, err, sizeof err) == KB_SNAPSHOT_OK)
            kb_snapshot_info_free(&info);
    }
}

/* A follower says hello: check it may follow from its last epoch, then stream from there. Mutex held. */
static void s_on_hello(kb_replica_t *self, zmq_msg_t *id, const Carls__ReplHello *h)
{
    const uint8_t *rid = zmq_msg_data(id);
    size_t rid_len = zmq_msg_size(id);
    uint64_t term = self->state->term;
    char text[512];
    if (h->term > term) {
        s_depose(self, h->term, "a follower has a newer term");
        return;
    }
    if (self->fenced) {
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_STALE_TERM,
                      "this primary was deposed");
        return;
    }
    if (h->shard_count != self->shard_count || h->shard_index != self->shard_index) {
        snprintf(text, sizeof text, "the follower is shard %u/%u, this primary %u/%u", h->shard_index,
                 h->shard_count, self->shard_index, self->shard_count);
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_WRONG_SHARD, text);
        return;
    }
    uint64_t last = h->last_epoch;
    /* A follower holding rounds of another history of this shard did not get them from this primary or its
     * predecessors: one of the two was started on an empty data directory (a new history). A snapshot from
     * here would wipe what the follower holds, perhaps the shard's only copy: refuse, loudly. */
    if (last > 0 && h->lineage && self->state->lineage && h->lineage != self->state->lineage) {
        snprintf(text, sizeof text, "the follower holds epoch %" PRIu64 " of another history of this shard "
                 "(lineage %016" PRIx64 "; this primary's %016" PRIx64 "): not overwriting it (was one of them "
                 "started on an empty data directory?)", last, h->lineage, self->state->lineage);
        LOG_ERROR("replication: follower %s: %s", h->member, text);
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_OTHER, text);
        return;
    }
    if (last > self->shipped_epoch || (last > 0 && h->last_term != kb_term_of_epoch(self->state, last))) {
        snprintf(text, sizeof text, "diverged: it holds epoch %" PRIu64 " of term %" PRIu64 "; this primary's epoch "
                 "%" PRIu64 " is of term %" PRIu64 " and its newest is %" PRIu64,
                 last, h->last_term, last, kb_term_of_epoch(self->state, last), self->shipped_epoch);
        s_transfer_start(self, rid, rid_len, h->member, text);
        return;
    }
    if (last < self->ring_base) {
        snprintf(text, sizeof text, "too far behind: it needs the rounds after epoch %" PRIu64 "; this primary "
                 "keeps those after %" PRIu64 " (--replication-buffer-bytes)", last, self->ring_base);
        s_transfer_start(self, rid, rid_len, h->member, text);
        return;
    }
    s_follower_t *f = NULL;
    for (size_t i = 0; i < self->n_followers && !f; i++)
        if (strcmp(self->followers[i].member, h->member) == 0)
            f = &self->followers[i];
    for (size_t i = 0; i < self->n_followers && !f; i++)
        if (!self->followers[i].live) /* a member that left (a restarted one may have a new name) */
            f = &self->followers[i];
    if (!f && self->n_followers < S_MAX_FOLLOWERS)
        f = &self->followers[self->n_followers++];
    if (!f) {
        s_send_refuse(self->router, rid, rid_len, term, CARLS__REPL_REFUSAL__REPL_REFUSE_OTHER, "too many followers");
        return;
    }
    if (!f->live || strcmp(f->member, h->member) != 0)
        LOG_INFO("follower %s joined from epoch %" PRIu64 " (this primary is at %" PRIu64 ")", h->member, last,
                 self->shipped_epoch);
    snprintf(f->member, sizeof f->member, "%s", h->member);
    f->id_len = rid_len < sizeof f->id ? rid_len : sizeof f->id;
    memcpy(f->id, rid, f->id_len);
    f->sent_epoch = f->acked_epoch = last;
    f->heard_ms = carls_monotonic_ms();
    f->echo_us = 0; /* its answers from now on renew the lease */
    f->live = true;
    f->sync = h->sync;
    if (!h->sync && kb_commit_min_replicas(self->commit))
        LOG_WARN("follower %s runs interval durability: it does not count towards --min-replicas", h->member);
}

/* Sends every live follower the rounds it has not been sent. Mutex held. */
static void s_stream(kb_replica_t *self)
{
    for (size_t i = 0; self->ring_ready && !self->fenced && i < self->n_followers; i++) {
        s_follower_t *f = &self->followers[i];
        if (!f->live)
            continue;
        if (f->sent_epoch < self->ring_base) { /* rounds it was not sent have left the ring */
            f->live = false;
            char text[200];
            snprintf(text, sizeof text, "fell behind: sent up to epoch %" PRIu64 ", the ring starts after %" PRIu64,
                     f->sent_epoch, self->ring_base);
            s_transfer_start(self, f->id, f->id_len, f->member, text);
            continue;
        }
        size_t at = self->ring_first;
        while (at < self->ring_count && self->ring[at]->epoch <= f->sent_epoch)
            at++;
        for (; at < self->ring_count; at++) {
            s_round_t *r = self->ring[at];
            Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
            Carls__ReplRecord rec = CARLS__REPL_RECORD__INIT;
            rec.term = self->state->term;
            rec.lineage = self->state->lineage;
            rec.epoch = r->epoch;
            rec.prev_epoch = f->sent_epoch;
            rec.crc = r->crc;
            rec.sent_us = r->shipped_us;
            msg.body_case = CARLS__REPL_MESSAGE__BODY_RECORD;
            msg.record = &rec;
            if (s_send(self->router, f->id, f->id_len, &msg, r) != 0) {
                if (errno != EAGAIN) { /* gone: it says hello again when it comes back */
                    LOG_WARN("follower %s: lost (%s)", f->member, zmq_strerror(errno));
                    f->live = false;
                }
                break;
            }
            f->sent_epoch = r->epoch;
        }
    }
}

/* The k-th largest of v[0..n) (1 <= k <= n; v is reordered: sorted descending, n <= S_MAX_FOLLOWERS). */
static uint64_t s_kth_largest(uint64_t *v, size_t n, size_t k)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j] > v[j - 1]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[k - 1];
}

/* The end of a leased primary's lease (docs/REPLICATION.md section 4), on its monotonic clock in ms: the
 * q-th newest send time (q = max(K, 1)) its live followers acknowledged, plus --lease-ms; 0 with fewer than q
 * live followers. Mutex held. */
static int64_t s_lease_until(kb_replica_t *self, uint32_t k)
{
    const uint32_t q = k ? k : 1;
    uint64_t echo[S_MAX_FOLLOWERS];
    size_t n = 0;
    for (size_t i = 0; i < self->n_followers; i++)
        if (self->followers[i].live && self->followers[i].echo_us > 0)
            echo[n++] = (uint64_t)self->followers[i].echo_us;
    if (n < q)
        return 0;
    return (int64_t)(s_kth_largest(echo, n, q) / 1000) + self->lease_ms;
}

/* The K-th most advanced live follower's acknowledged epoch becomes the bank's replicated point. Mutex held. */
static void s_update_replicated(kb_replica_t *self)
{
    uint32_t k = kb_commit_min_replicas(self->commit);
    uint64_t acked[S_MAX_FOLLOWERS];
    size_t n = 0;
    for (size_t i = 0; i < self->n_followers; i++) /* only followers that fdatasync count (kb-server --help) */
        if (self->followers[i].live && self->followers[i].sync)
            acked[n++] = self->followers[i].acked_epoch;
    /* Fewer than K for a while: new writes are refused (UNAVAILABLE, clients retry) instead of each waiting
     * for its commit timeout. The lease is renewed here; the service and the transport check it themselves
     * (kb_commit_leased), at the moment a write is taken or acknowledged. */
    int64_t now = carls_monotonic_ms();
    char why[200] = "";
    if (k == 0 || n >= k) {
        self->short_since_ms = 0;
    } else if (!self->short_since_ms) {
        self->short_since_ms = now;
    } else if (now - self->short_since_ms >= S_REPLICA_WAIT_MS) {
        snprintf(why, sizeof why, "%zu of the %u followers --min-replicas needs (in --durability sync) are "
                 "connected", n, k);
    }
    if (self->lease_ms && self->primary_running)
        kb_commit_set_lease(self->commit, s_lease_until(self, k));
    kb_commit_set_replicas_short(self->commit, *why ? why : NULL);
    if (k == 0 || n < k)
        return;
    kb_commit_set_replicated(self->commit, s_kth_largest(acked, n, k));
}

static void s_on_primary_message(kb_replica_t *self, zmq_msg_t *parts, int n)
{
    Carls__ReplMessage *msg = n >= 2 ? carls__repl_message__unpack(NULL, zmq_msg_size(&parts[1]),
                                                                     zmq_msg_data(&parts[1])) : NULL;
    if (!msg) {
        LOG_WARN("replication: an undecodable message of %d frames dropped", n);
        return;
    }
    pthread_mutex_lock(&self->mutex);
    s_follower_t *f = s_follower_by_id(self, &parts[0]);
    switch (msg->body_case) {
    case CARLS__REPL_MESSAGE__BODY_HELLO:
        s_on_hello(self, &parts[0], msg->hello);
        break;
    case CARLS__REPL_MESSAGE__BODY_ACK:
        if (f && msg->ack->term > self->state->term) /* only a follower it streams to can depose it */
            s_depose(self, msg->ack->term, "a follower acknowledged in a newer term");
        else if (self->transfer.active && self->transfer.id_len == zmq_msg_size(&parts[0]) &&
                 memcmp(self->transfer.id, zmq_msg_data(&parts[0]), self->transfer.id_len) == 0) {
            if (msg->ack->chunks > self->transfer.acked_chunks && msg->ack->chunks <= self->transfer.next_chunk)
                self->transfer.acked_chunks = msg->ack->chunks;
        } else if (f && f->live && msg->ack->term == self->state->term) {
            /* Never beyond what it was sent: an ack is a claim from the network. */
            uint64_t applied = msg->ack->applied_epoch < f->sent_epoch ? msg->ack->applied_epoch : f->sent_epoch;
            if (applied > f->acked_epoch)
                f->acked_epoch = applied;
            f->heard_ms = carls_monotonic_ms();
            /* The lease runs from when this primary sent what was answered, on its own clock; never later
             * than now (an echo is a claim from the network). */
            int64_t echo = msg->ack->echo_sent_us, now_us = carls_monotonic_us();
            echo = echo < now_us ? echo : now_us;
            if (echo > f->echo_us)
                f->echo_us = echo;
        }
        break;
    case CARLS__REPL_MESSAGE__BODY_REFUSE:
        if (f && msg->refuse->term > self->state->term)
            s_depose(self, msg->refuse->term, msg->refuse->text ? msg->refuse->text : "refused");
        else if (f)
            LOG_WARN("follower %s refused a round: %s", f->member, msg->refuse->text);
        if (f)
            f->live = false;
        break;
    default:
        break;
    }
    s_update_replicated(self);
    pthread_mutex_unlock(&self->mutex);
    carls__repl_message__free_unpacked(msg, NULL);
}

static void s_heartbeat(kb_replica_t *self)
{
    int64_t now = carls_monotonic_ms();
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplHeartbeat hb = CARLS__REPL_HEARTBEAT__INIT;
    hb.term = self->state->term;
    hb.shipped_epoch = self->shipped_epoch;
    hb.sent_us = carls_monotonic_us();
    msg.body_case = CARLS__REPL_MESSAGE__BODY_HEARTBEAT;
    msg.heartbeat = &hb;
    for (size_t i = 0; i < self->n_followers; i++) {
        s_follower_t *f = &self->followers[i];
        if (!f->live)
            continue;
        if (now - f->heard_ms > S_FOLLOWER_SILENT_MS) {
            LOG_WARN("follower %s: silent for %d ms, no longer counted", f->member, S_FOLLOWER_SILENT_MS);
            f->live = false;
            continue;
        }
        if (s_send(self->router, f->id, f->id_len, &msg, NULL) != 0 && errno != EAGAIN)
            f->live = false;
    }
    if (self->transfer.active) /* so that it does not take the silence for a lost primary */
        s_send(self->router, self->transfer.id, self->transfer.id_len, &msg, NULL);
}

static void *s_primary_main(void *arg)
{
    kb_replica_t *self = arg;
    int64_t last_beat = 0;
    while (!atomic_load(&self->primary_stop)) {
        zmq_pollitem_t items[2] = {{self->router, 0, ZMQ_POLLIN, 0}, {NULL, self->event_fd, ZMQ_POLLIN, 0}};
        zmq_poll(items, 2, S_HEARTBEAT_MS / 2);
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t count;
            if (read(self->event_fd, &count, sizeof count) < 0 && errno != EAGAIN)
                LOG_WARN("replicator: %s", strerror(errno));
        }
        zmq_msg_t parts[3];
        int n;
        while ((n = s_recv(self->router, parts, 3)) > 0) {
            s_on_primary_message(self, parts, n);
            s_close_parts(parts, n);
        }
        pthread_mutex_lock(&self->mutex);
        s_stream(self);
        s_transfer_step(self);
        if (carls_monotonic_ms() - last_beat >= S_HEARTBEAT_MS) {
            s_heartbeat(self);
            s_update_replicated(self);
            last_beat = carls_monotonic_ms();
        }
        pthread_mutex_unlock(&self->mutex);
    }
    return NULL;
}

/* The host of a tcp://HOST:PORT endpoint into host (for the default replication endpoint). */
static void s_endpoint_host(const char *endpoint, char *host, size_t len)
{
    const char *p = strncmp(endpoint, "tcp://", 6) == 0 ? endpoint + 6 : endpoint;
    const char *colon = strrchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    snprintf(host, len, "%.*s", (int)n, p);
}

/* Becomes the primary: binds the replication socket and starts the replicator. Mutex not held. */
static int s_start_primary(kb_replica_t *self, char *err, size_t errlen)
{
    char listen[300];
    if (self->listen)
        snprintf(listen, sizeof listen, "%s", self->listen);
    else {
        char host[256];
        s_endpoint_host(self->client_endpoint ? self->client_endpoint : self->member, host, sizeof host);
        snprintf(listen, sizeof listen, "tcp://%s:*", host);
    }
    self->router = zmq_socket(self->zctx, ZMQ_ROUTER);
    int one = 1, linger = 0, hwm = 100000;
    zmq_setsockopt(self->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(self->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(self->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    /* Before the bind: no follower is ever admitted without the ZAP handler's word. */
    char why[512];
    if (self->curve && kb_auth_setup_server(self->router, &self->curve_server, self->auth, why, sizeof why) != 0)
        return carls_errorf(err, errlen, -1, "the replication socket's CURVE: %s", why);
    if (zmq_bind(self->router, listen) != 0)
        return carls_errorf(err, errlen, -1, "--replication-listen %s: %s", listen, zmq_strerror(errno));
    size_t len = sizeof self->endpoint;
    zmq_getsockopt(self->router, ZMQ_LAST_ENDPOINT, self->endpoint, &len);
    self->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->event_fd < 0)
        return carls_errorf(err, errlen, -1, "eventfd: %s", strerror(errno));
    kb_commit_set_min_replicas(self->commit, self->min_replicas);
    if (self->lease_ms)
        kb_commit_set_lease(self->commit, 0); /* no write is acknowledged before a follower has answered */
    pthread_mutex_lock(&self->mutex);
    self->ring_ready = false;
    pthread_mutex_unlock(&self->mutex);
    /* Every record after `before` reaches s_ship; rounds it saw up to it are dropped. */
    uint64_t before = kb_commit_set_ship_hook(self->commit, s_ship, self);
    pthread_mutex_lock(&self->mutex);
    self->ring_base = self->shipped_epoch = before;
    while (self->ring_first < self->ring_count && self->ring[self->ring_first]->epoch <= before) {
        s_round_t *old = self->ring[self->ring_first++];
        self->ring_bytes -= sizeof *old + old->len;
        s_round_unref(NULL, old);
    }
    if (self->ring_first < self->ring_count)
        self->shipped_epoch = self->ring[self->ring_count - 1]->epoch;
    self->ring_ready = true;
    pthread_mutex_unlock(&self->mutex);
    atomic_store(&self->primary_stop, false);
    if (pthread_create(&self->primary_thread, NULL, s_primary_main, self) != 0)
        CARLS_FATAL("cannot start the replicator");
    pthread_setname_np(self->primary_thread, "kb-replicator");
    pthread_mutex_lock(&self->mutex);
    self->primary_running = true;
    pthread_mutex_unlock(&self->mutex);
    LOG_INFO("primary of term %" PRIu64 ": followers connect to %s%s%s (min replicas %u)", self->state->term,
             self->endpoint, self->advertise ? ", told to connect to " : "", self->advertise ? self->advertise : "",
             self->min_replicas);
    return 0;
}

/* ---- follower ---- */

/* A follower's DEALER to endpoint (the primary's client or replication endpoint), a CURVE client with the
 * member's --replica-curve-key when the shard uses CURVE. The socket, or NULL with err naming flag. */
static void *s_connect(kb_replica_t *self, const char *endpoint, const char *flag, char *err, size_t errlen)
{
    void *s = zmq_socket(self->zctx, ZMQ_DEALER);
    int linger = 0, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    char why[512];
    if (self->curve_follow &&
        kb_auth_setup_client(s, &self->curve_client, &self->curve_server.public_key, why, sizeof why) != 0) {
        carls_errorf(err, errlen, -1, "--replica-curve-key: %s", why);
        zmq_close(s);
        return NULL;
    }
    if (zmq_connect(s, endpoint) != 0) {
        carls_errorf(err, errlen, -1, "%s %s: %s", flag, endpoint, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* Why a primary may not answer a CURVE follower, for its log lines. */
static const char *s_curve_hint(const kb_replica_t *self)
{
    return self->curve_follow ? " (CURVE: the public key of --replica-curve-key must be on the primary's "
                                "--curve-allow list, and the primary must hold this member's --curve-secret pair)"
                              : "";
}

/* Asks the primary's client endpoint for its replication endpoint (the replica op). 0, or -1 with err. */
static int s_ask_endpoint(kb_replica_t *self, char *out, size_t len, char *err, size_t errlen)
{
    void *s = s_connect(self, self->replica_of, "--replica-of", err, errlen);
    if (!s)
        return -1;
    int rc = -1;
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Replica op = CARLS__REPLICA__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 1;
    req.op_case = CARLS__REQUEST__OP_REPLICA;
    req.replica = &op;
    uint8_t buf[64];
    size_t n = carls__request__pack(&req, buf);
    zmq_send(s, buf, n, 0);
    zmq_pollitem_t item = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 1000) <= 0) {
        carls_errorf(err, errlen, -1, "no answer from the primary at %s%s", self->replica_of, s_curve_hint(self));
        goto done;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) >= 0) {
        Carls__Response *resp = carls__response__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        if (!resp)
            carls_errorf(err, errlen, -1, "the primary at %s sent an undecodable reply", self->replica_of);
        else if (resp->status != CARLS__STATUS_CODE__STATUS_OK || resp->result_case != CARLS__RESPONSE__RESULT_REPLICA)
            carls_errorf(err, errlen, -1, "the primary at %s answered %s: %s", self->replica_of,
                         carls_status_name(resp->status), resp->error);
        else if (!resp->replica->replication_endpoint[0])
            carls_errorf(err, errlen, -1, "%s is not a primary (it is a %s)", self->replica_of, resp->replica->role);
        else {
            /* A primary bound to every address (tcp://0.0.0.0:P) is reached on the host we reached it at. */
            const char *ep = resp->replica->replication_endpoint;
            char host[256];
            s_endpoint_host(ep, host, sizeof host);
            if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0) {
                char theirs[256];
                s_endpoint_host(self->replica_of, theirs, sizeof theirs);
                snprintf(out, len, "tcp://%s%s", theirs, strrchr(ep, ':'));
            } else
                snprintf(out, len, "%s", ep);
            rc = 0;
        }
        if (resp)
            carls__response__free_unpacked(resp, NULL);
    }
    zmq_msg_close(&m);
done:
    zmq_close(s);
    return rc;
}

static void s_hello(kb_replica_t *self, void *dealer)
{
    uint64_t last = kb_commit_committed_epoch(self->commit);
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplHello h = CARLS__REPL_HELLO__INIT;
    pthread_mutex_lock(&self->mutex);
    h.term = self->have_state ? self->state->term : 0;
    h.last_term = self->have_state ? kb_term_of_epoch(self->state, last) : 0;
    pthread_mutex_unlock(&self->mutex);
    h.last_epoch = last;
    h.member = self->member;
    h.shard_index = self->shard_index;
    h.shard_count = self->shard_count;
    h.sync = kb_commit_sync(self->commit);
    h.lineage = self->have_state ? self->state->lineage : 0;
    msg.body_case = CARLS__REPL_MESSAGE__BODY_HELLO;
    msg.hello = &h;
    s_send(dealer, NULL, 0, &msg, NULL);
}

/* A record of `term` at `epoch`, from a primary of shard history `lineage`, is to be applied: 0 when it may be
 * applied here (the history noted and saved when it is a new term, the lineage taken over by a member that
 * has none or holds no epoch yet, as the primary's hello check lets it), -1 when its term is older than this
 * member's, -2 when it belongs to another history than the epochs this member holds. */
static int s_accept_term(kb_replica_t *self, uint64_t term, uint64_t epoch, uint64_t lineage)
{
    int rc = 0;
    const bool holds_epochs = kb_commit_committed_epoch(self->commit) > 0;
    pthread_mutex_lock(&self->mutex);
    if (!self->have_state) {
        kb_term_init(self->state, self->member, epoch);
        self->state->term = self->state->history[0].term = term;
        self->state->lineage = lineage;
        self->state->role = KB_TERM_FOLLOWER;
        s_save(self);
        s_publish_role(self);
    } else if (lineage && self->state->lineage && lineage != self->state->lineage && holds_epochs) {
        LOG_ERROR("replication: the primary's rounds belong to another history of this shard (lineage %016" PRIx64
                  ", this member's %016" PRIx64 "): not applied", lineage, self->state->lineage);
        rc = -2;
    } else if (term < self->state->term) {
        rc = -1;
    } else {
        bool changed = false;
        if (lineage && self->state->lineage != lineage) { /* a file written before lineages, or no epoch held */
            self->state->lineage = lineage;
            changed = true;
        }
        if (term != kb_term_of_epoch(self->state, epoch)) {
            if (kb_term_record(self->state, term, epoch) != 0)
                rc = -1;
            else
                changed = true;
        }
        if (rc == 0 && changed) {
            s_save(self);
            s_publish_role(self);
        }
    }
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

/* This member's term (0 before it has one). */
static uint64_t s_term(kb_replica_t *self)
{
    pthread_mutex_lock(&self->mutex);
    uint64_t term = self->have_state ? self->state->term : 0;
    pthread_mutex_unlock(&self->mutex);
    return term;
}

/* A follower refuses what a primary of an older term sent: that deposes the primary (s_on_primary_message). */
static void s_refuse_stale(kb_replica_t *self, void *dealer, const char *what)
{
    char text[128];
    snprintf(text, sizeof text, "a %s of an older term than this follower's", what);
    s_send_refuse(dealer, NULL, 0, s_term(self), CARLS__REPL_REFUSAL__REPL_REFUSE_STALE_TERM, text);
}

/* A round s_accept_term did not take (rc -1: an older term, -2: another history) is refused, saying why. */
static void s_refuse_round(kb_replica_t *self, void *dealer, int rc)
{
    if (rc == -2)
        s_send_refuse(dealer, NULL, 0, s_term(self), CARLS__REPL_REFUSAL__REPL_REFUSE_OTHER,
                      "a round of another history of this shard than the epochs this follower holds");
    else
        s_refuse_stale(self, dealer, "round");
}

/* A follower's acknowledgement: every round up to epoch received (records in its journal), and the chunks of
 * a snapshot being received. */
static void s_send_ack(kb_replica_t *self, void *dealer, uint64_t epoch, int64_t echo, uint32_t chunks)
{
    Carls__ReplMessage msg = CARLS__REPL_MESSAGE__INIT;
    Carls__ReplAck ack = CARLS__REPL_ACK__INIT;
    ack.term = s_term(self);
    ack.applied_epoch = epoch;
    ack.echo_sent_us = echo;
    ack.chunks = chunks;
    msg.body_case = CARLS__REPL_MESSAGE__BODY_ACK;
    msg.ack = &ack;
    s_send(dealer, NULL, 0, &msg, NULL);
}

/* Applies one record (frames: message, payload). Returns 1 when applied, 0 when dropped, -1 when the stream
 * must start again (a gap, or the round did not apply). */
static int s_on_record(kb_replica_t *self, void *dealer, const Carls__ReplRecord *rec, zmq_msg_t *payload,
                       uint64_t *through)
{
    if (rec->epoch <= *through)
        return 0; /* sent again after a hello that crossed it */
    if (rec->prev_epoch != *through) {
        LOG_WARN("replication: round %" PRIu64 " follows %" PRIu64 " but %" PRIu64 " is the last received; asking "
                 "again", rec->epoch, rec->prev_epoch, *through);
        return -1;
    }
    if (zmq_msg_size(payload) == 0) {
        /* An empty round: nothing to keep (its epoch is not journaled here either), but the stream and the
         * acknowledgements move past it, so a write waiting on it is released. A new term is noted from the
         * epoch after the last record: every epoch from there on is of it. */
        const uint64_t next = kb_commit_committed_epoch(self->commit) + 1;
        const int accepted = s_accept_term(self, rec->term, next, rec->lineage);
        if (accepted != 0) {
            s_refuse_round(self, dealer, accepted);
            return 0;
        }
        *through = rec->epoch;
        return 1;
    }
    const int accepted = s_accept_term(self, rec->term, rec->epoch, rec->lineage);
    if (accepted != 0) {
        s_refuse_round(self, dealer, accepted);
        return 0;
    }
    char err[512];
    self->ack_dealer = dealer;
    self->ack_echo = rec->sent_us;
    int rc = kb_commit_apply_replicated(self->commit, rec->epoch, zmq_msg_data(payload), zmq_msg_size(payload),
                                        rec->crc, err, sizeof err);
    self->ack_dealer = NULL;
    if (rc != 0) {
        LOG_ERROR("replication: round %" PRIu64 " not applied: %s", rec->epoch, err);
        return -1;
    }
    *through = rec->epoch;
    return 1;
}

/* The bank's journaled hook (follower thread, inside kb_commit_apply_replicated): the round is durable here,
 * so it is acknowledged now, before it is applied. */
static void s_journaled(void *ctx, uint64_t epoch)
{
    kb_replica_t *self = ctx;
    if (self->ack_dealer)
        s_send_ack(self, self->ack_dealer, epoch, self->ack_echo, 0);
}

/* ---- follower: read bounds (REPLICATION.md section 5) ---- */

static void s_note_heartbeat(kb_replica_t *self, uint64_t shipped, uint64_t through, int64_t now)
{
    pthread_mutex_lock(&self->mutex);
    self->hb_shipped = shipped;
    self->hb_ms = now;
    self->through = through;
    if (through >= shipped)
        self->caught_up_ms = now;
    else if (!self->pending_ms) { /* the oldest unmet one: staleness is judged conservatively */
        self->pending_shipped = shipped;
        self->pending_ms = now;
    }
    pthread_mutex_unlock(&self->mutex);
}

static void s_note_through(kb_replica_t *self, uint64_t through)
{
    pthread_mutex_lock(&self->mutex);
    self->through = through;
    if (self->pending_ms && through >= self->pending_shipped) {
        self->caught_up_ms = self->pending_ms;
        self->pending_ms = 0;
    }
    pthread_mutex_unlock(&self->mutex);
}

/* The service's check of a bounded read (kb_service_replication_t.check_read). */
static int s_check_read(void *ctx, uint32_t max_staleness_ms, uint64_t max_lag_epochs, uint64_t min_epoch,
                        uint64_t *applied, char *why, size_t whylen)
{
    kb_replica_t *self = ctx;
    int64_t now = carls_monotonic_ms();
    int rc = 0;
    pthread_mutex_lock(&self->mutex);
    *applied = self->through;
    if (min_epoch && self->through < min_epoch)
        rc = carls_errorf(why, whylen, -1, "it has applied epoch %" PRIu64 ", the read needs %" PRIu64,
                          self->through, min_epoch);
    else if (max_staleness_ms && (!self->caught_up_ms || now - self->caught_up_ms > (int64_t)max_staleness_ms))
        rc = self->caught_up_ms
                 ? carls_errorf(why, whylen, -1, "it was last caught up with its primary %" PRId64 " ms ago (bound %u)",
                                now - self->caught_up_ms, max_staleness_ms)
                 : carls_errorf(why, whylen, -1, "it has not caught up with a primary yet");
    else if (max_lag_epochs && (!self->hb_ms || now - self->hb_ms > S_PRIMARY_SILENT_MS))
        rc = carls_errorf(why, whylen, -1, "no heartbeat from its primary for %" PRId64 " ms",
                          self->hb_ms ? now - self->hb_ms : now);
    else if (max_lag_epochs && self->hb_shipped > self->through && self->hb_shipped - self->through > max_lag_epochs)
        rc = carls_errorf(why, whylen, -1, "it is %" PRIu64 " rounds behind (bound %" PRIu64 ")",
                          self->hb_shipped - self->through, max_lag_epochs);
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

static void *s_follower_main(void *arg)
{
    kb_replica_t *self = arg;
    char endpoint[300] = "", err[512];
    int64_t logged = 0;
    void *dealer = NULL;
    int64_t heard = 0, hello_at = 0, wait_until = 0;
    int64_t echo = 0;
    kb_replica_receive_t *rx = carls_xcalloc(1, sizeof *rx);
    uint64_t through = 0; /* the stream's position: every round up to it received (records applied) */
    bool caught_up_by_snapshot = false;
    while (!atomic_load(&self->follower_stop) && !caught_up_by_snapshot) {
        int64_t now = carls_monotonic_ms();
        if (!dealer) {
            if (now < wait_until || s_ask_endpoint(self, endpoint, sizeof endpoint, err, sizeof err) != 0) {
                if (now >= wait_until && now - logged >= 5000) {
                    LOG_WARN("replication: %s; trying again", err);
                    logged = now;
                }
                struct timespec pause = {0, 200 * 1000 * 1000};
                nanosleep(&pause, NULL);
                continue;
            }
            dealer = s_connect(self, endpoint, "the primary's replication endpoint", err, sizeof err);
            if (!dealer) {
                LOG_ERROR("replication: %s", err);
                wait_until = now + 1000;
                continue;
            }
            LOG_INFO("following %s (replication endpoint %s) from epoch %" PRIu64, self->replica_of, endpoint,
                     kb_commit_committed_epoch(self->commit));
            s_hello(self, dealer);
            through = kb_commit_committed_epoch(self->commit); /* what the hello said */
            s_note_through(self, through);
            heard = hello_at = now;
        }
        zmq_pollitem_t item = {dealer, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 50);
        bool applied = false, restart = false, chunked = false;
        zmq_msg_t parts[3];
        int n;
        while (!restart && (n = s_recv(dealer, parts, 3)) > 0) {
            Carls__ReplMessage *msg = carls__repl_message__unpack(NULL, zmq_msg_size(&parts[0]), zmq_msg_data(&parts[0]));
            if (!msg) {
                LOG_WARN("replication: an undecodable message from the primary dropped");
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_RECORD && n == 2) {
                int rc = s_on_record(self, dealer, msg->record, &parts[1], &through);
                applied |= rc == 1;
                restart = rc < 0;
                if (rc == 1)
                    echo = msg->record->sent_us;
                heard = carls_monotonic_ms();
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_HEARTBEAT) {
                if (msg->heartbeat->term < s_term(self))
                    s_refuse_stale(self, dealer, "heartbeat");
                heard = carls_monotonic_ms();
                s_note_heartbeat(self, msg->heartbeat->shipped_epoch, through, heard);
                if (msg->heartbeat->term >= s_term(self)) /* renews a leased primary's lease while idle */
                    s_send_ack(self, dealer, through, msg->heartbeat->sent_us, 0);
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_SNAPSHOT_BEGIN) {
                restart = kb_replica_on_snapshot_begin(self, rx, msg->snapshot_begin) != 0;
                heard = carls_monotonic_ms();
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_SNAPSHOT_CHUNK && n == 2) {
                restart = kb_replica_on_snapshot_chunk(rx, msg->snapshot_chunk, &parts[1]) != 0;
                chunked = !restart;
                heard = carls_monotonic_ms();
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_SNAPSHOT_END) {
                int rc = kb_replica_on_snapshot_end(self, rx, msg->snapshot_end);
                restart = rc < 0;
                caught_up_by_snapshot = rc > 0;
            } else if (msg->body_case == CARLS__REPL_MESSAGE__BODY_REFUSE) {
                LOG_ERROR("replication: the primary refused this follower: %s", msg->refuse->text);
                wait_until = carls_monotonic_ms() + 5000;
                restart = true;
            }
            if (msg)
                carls__repl_message__free_unpacked(msg, NULL);
            s_close_parts(parts, n);
        }
        if (applied)
            s_note_through(self, through);
        if (applied || chunked)
            s_send_ack(self, dealer, through, echo, chunked ? rx->next_chunk : 0);
        now = carls_monotonic_ms();
        if (!restart && now - heard > S_PRIMARY_SILENT_MS && now - hello_at > S_PRIMARY_SILENT_MS) {
            LOG_WARN("replication: nothing from the primary for %d ms; connecting again", S_PRIMARY_SILENT_MS);
            restart = true;
        }
        if (restart) {
            /* A new connection: the primary answers its hello from the last epoch applied here. */
            zmq_close(dealer);
            dealer = NULL;
            rx->active = false;
        }
    }
    if (dealer)
        zmq_close(dealer);
    free(rx);
    return NULL;
}

static void s_start_follower(kb_replica_t *self)
{
    kb_commit_set_journaled_hook(self->commit, s_journaled, self);
    atomic_store(&self->follower_stop, false);
    if (pthread_create(&self->follower_thread, NULL, s_follower_main, self) != 0)
        CARLS_FATAL("cannot start the replica thread");
    pthread_setname_np(self->follower_thread, "kb-replica");
    self->follower_running = true;
}

static void s_stop_follower(kb_replica_t *self)
{
    if (!self->follower_running)
        return;
    atomic_store(&self->follower_stop, true);
    pthread_join(self->follower_thread, NULL);
    self->follower_running = false;
}

/* ---- the replica op (kbctl replica) ---- */

static void s_status(kb_replica_t *self, Carls__ReplicaResult *res)
{
    uint64_t committed = kb_commit_committed_epoch(self->commit);
    pthread_mutex_lock(&self->mutex);
    res->role = carls_xmalloc(16);
    snprintf(res->role, 16, "%s", s_role_name(self));
    res->term = self->have_state ? self->state->term : 0;
    res->last_term = self->have_state ? kb_term_of_epoch(self->state, committed) : 0;
    res->committed_epoch = committed;
    res->durable_epoch = kb_commit_durable_epoch(self->commit);
    /* What followers connect to: the advertised endpoint when there is one. */
    const char *replication = self->advertise ? self->advertise : self->endpoint;
    size_t rlen = strlen(replication) + 1;
    res->replication_endpoint = carls_xmalloc(rlen);
    snprintf(res->replication_endpoint, rlen, "%s", self->primary_running && !self->fenced ? replication : "");
    size_t plen = self->replica_of ? strlen(self->replica_of) + 1 : 1;
    res->primary = carls_xmalloc(plen);
    snprintf(res->primary, plen, "%s", self->replica_of ? self->replica_of : "");
    res->min_replicas = kb_commit_min_replicas(self->commit);
    res->fenced = self->fenced;
    int64_t now_us = carls_monotonic_us();
    res->n_followers = self->n_followers;
    res->followers = carls_xcalloc(self->n_followers + 1, sizeof *res->followers);
    for (size_t i = 0; i < self->n_followers; i++) {
        const s_follower_t *f = &self->followers[i];
        Carls__ReplicaFollower *out = carls_xmalloc(sizeof *out);
        carls__replica_follower__init(out);
        out->member = carls_xmalloc(sizeof f->member);
        snprintf(out->member, sizeof f->member, "%s", f->member);
        out->acked_epoch = f->acked_epoch;
        out->live = f->live;
        for (size_t at = self->ring_first; at < self->ring_count; at++) {
            if (self->ring[at]->epoch > f->acked_epoch) {
                out->lag_ms = (uint64_t)((now_us - self->ring[at]->shipped_us) / 1000);
                break;
            }
        }
        res->followers[i] = out;
    }
    pthread_mutex_unlock(&self->mutex);
}

static void s_free_result(void *ctx, Carls__ReplicaResult *res)
{
    (void)ctx;
    free(res->role);
    free(res->replication_endpoint);
    free(res->primary);
    for (size_t i = 0; i < res->n_followers; i++) {
        free(res->followers[i]->member);
        free(res->followers[i]);
    }
    free(res->followers);
}

static int s_promote(kb_replica_t *self, uint64_t term, uint32_t min_replicas, char *err, size_t errlen)
{
    pthread_mutex_lock(&self->mutex);
    bool primary = self->primary_running;
    uint64_t mine = self->have_state ? self->state->term : 0;
    /* The coordinator fences the followers with the new term, then promotes one of them with that same term
     * (REPLICATION.md section 4): a term this member was only fenced to, in which no epoch was written here
     * (not as a primary, nor received from one), may be taken. */
    uint64_t written = self->have_state ? self->state->history[self->state->n_history - 1].term : 0;
    pthread_mutex_unlock(&self->mutex);
    if (primary)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "this member is a primary already (term %" PRIu64 ")", mine);
    if (term < mine)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "promote needs this member's term %" PRIu64 " (if it was only fenced to it) or a newer "
                            "one (--term %" PRIu64 " given)", mine, term);
    if (term <= written)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "promote needs a term above this member's %" PRIu64 ", in which it holds epochs "
                            "(--term %" PRIu64 " given)", written, term);
    if (min_replicas && !kb_commit_sync(self->commit))
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "min replicas need --durability sync");
    self->min_replicas = min_replicas;
    s_stop_follower(self); /* nothing more of the old primary is applied */
    uint64_t committed = kb_commit_committed_epoch(self->commit);
    pthread_mutex_lock(&self->mutex);
    if (!self->have_state) {
        kb_term_init(self->state, self->member, committed + 1);
        self->state->term = self->state->history[0].term = term;
    } else if (kb_term_record(self->state, term, committed + 1) != 0) {
        pthread_mutex_unlock(&self->mutex);
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INTERNAL, "term %" PRIu64 " cannot follow "
                            "this member's history", term);
    }
    self->state->term = term;
    self->state->role = KB_TERM_PRIMARY;
    int saved = s_save(self);
    pthread_mutex_unlock(&self->mutex);
    char why[512];
    /* The replicator first, while the bank has no persister (every round it will make is shipped); writes
     * only once the term is saved and the bank promoted. A failure leaves a standby of the new term. */
    if (saved != 0 || s_start_primary(self, why, sizeof why) != 0) {
        pthread_mutex_lock(&self->mutex);
        self->state->role = KB_TERM_STANDBY;
        s_save(self);
        pthread_mutex_unlock(&self->mutex);
        if (self->replica_of)
            s_start_follower(self);
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INTERNAL, "promotion failed: %s",
                            saved != 0 ? "the new term could not be saved in " KB_TERM_FILE : why);
    }
    if (kb_commit_promote(self->commit, why, sizeof why) != 0)
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INTERNAL, "promotion failed: %s", why);
    pthread_mutex_lock(&self->mutex);
    free(self->replica_of);
    self->replica_of = NULL;
    s_publish_role(self);
    pthread_mutex_unlock(&self->mutex);
    LOG_INFO("promoted to primary of term %" PRIu64 " at epoch %" PRIu64, term, committed);
    return 0;
}

static int s_fence(kb_replica_t *self, uint64_t term, char *err, size_t errlen)
{
    pthread_mutex_lock(&self->mutex);
    uint64_t mine = self->have_state ? self->state->term : 0;
    int rc = 0;
    if (!self->have_state)
        rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                          "this member has applied nothing yet: there is no term to raise");
    else if (term < mine)
        rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                          "fence needs a term at or above this member's %" PRIu64 " (--term %" PRIu64 " given)", mine,
                          term);
    else if (term > mine || self->primary_running)
        s_depose(self, term, "fenced by the coordinator");
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

static int s_handle(void *ctx, const Carls__Replica *req, Carls__ReplicaResult *res, char *err, size_t errlen)
{
    kb_replica_t *self = ctx;
    int rc = 0;
    if (req->min_replicas > S_MAX_FOLLOWERS - 1) {
        s_status(self, res);
        return carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                            "min replicas %u: at most %d", req->min_replicas, S_MAX_FOLLOWERS - 1);
    }
    pthread_mutex_lock(&self->op_mutex); /* one promotion or fence at a time (workers run ops in parallel) */
    switch (req->action) {
    case CARLS__REPLICA_ACTION__REPLICA_STATUS:
        break;
    case CARLS__REPLICA_ACTION__REPLICA_PROMOTE:
        rc = s_promote(self, req->term, req->min_replicas, err, errlen);
        break;
    case CARLS__REPLICA_ACTION__REPLICA_FENCE:
        rc = s_fence(self, req->term, err, errlen);
        break;
    case CARLS__REPLICA_ACTION__REPLICA_SET_MIN_REPLICAS:
        if (!kb_commit_sync(self->commit) && req->min_replicas)
            rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                              "min replicas need --durability sync");
        else {
            self->min_replicas = req->min_replicas; /* kept by a later promotion's replicator */
            kb_commit_set_min_replicas(self->commit, req->min_replicas);
            pthread_mutex_lock(&self->mutex);
            s_update_replicated(self); /* a lower K may end a refusal of writes at once */
            pthread_mutex_unlock(&self->mutex);
        }
        break;
    default:
        rc = carls_errorf(err, errlen, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT, "unknown replica action %d",
                          (int)req->action);
    }
    pthread_mutex_unlock(&self->op_mutex);
    s_status(self, res);
    return rc;
}

/* ---- life ---- */

int kb_replica_bank_mode(const kb_replica_options_t *opts, bool *replica, char *err, size_t errlen)
{
    kb_term_state_t *st = carls_xmalloc(sizeof *st);
    int rc = kb_term_load(opts->data_dir, st, err, errlen);
    free(st);
    if (rc != 0 && rc != -ENOENT)
        return -1;
    *replica = opts->replica_of != NULL || rc == 0;
    return 0;
}

/* CURVE (kb_replica.h): loads the server's key pair and allow-list and starts the ZAP handler of the
 * replicator's context (a follower too: it may be promoted), and a follower's own key pair. 0, or -1 with err
 * naming the flag whose file did not load. */
static int s_curve_init(kb_replica_t *self, const kb_replica_options_t *opts, char *err, size_t errlen)
{
    char why[512];
    if (!opts->curve_secret != !opts->curve_allow || (opts->curve_replica_key && !opts->curve_secret) ||
        (opts->replica_of && opts->curve_secret && !opts->curve_replica_key))
        return carls_errorf(err, errlen, -1, "--replica-curve-key goes with --replica-of, --curve-secret and "
                                             "--curve-allow, and a follower with --curve-secret needs it");
    if (!opts->curve_secret)
        return 0;
    kb_auth_allow_t *allow = NULL;
    if (kb_auth_load_secret(opts->curve_secret, &self->curve_server, why, sizeof why) != 0)
        return carls_errorf(err, errlen, -1, "--curve-secret: %s", why);
    if (kb_auth_allow_load(opts->curve_allow, &allow, why, sizeof why) != 0)
        return carls_errorf(err, errlen, -1, "--curve-allow: %s", why);
    self->auth = kb_auth_new(self->zctx, &allow, why, sizeof why);
    if (!self->auth)
        return carls_errorf(err, errlen, -1, "the replication socket's ZAP handler: %s", why);
    self->curve = true;
    if (opts->curve_replica_key) {
        if (kb_auth_load_secret(opts->curve_replica_key, &self->curve_client, why, sizeof why) != 0)
            return carls_errorf(err, errlen, -1, "--replica-curve-key: %s", why);
        self->curve_follow = true;
    }
    return 0;
}

int kb_replica_new(kb_bank_t *bank, kb_service_t *service, const kb_replica_options_t *opts, kb_replica_t **out,
                   char *err, size_t errlen)
{
    *out = NULL;
    kb_replica_t *self = carls_xcalloc(1, sizeof *self);
    self->commit = kb_bank_commit(bank);
    self->service = service;
    self->data_dir = kb_replica_dup(opts->data_dir);
    self->member = kb_replica_dup(opts->member);
    self->replica_of = kb_replica_dup(opts->replica_of);
    self->listen = kb_replica_dup(opts->listen);
    self->client_endpoint = kb_replica_dup(opts->client_endpoint);
    self->advertise = kb_replica_dup(opts->advertise);
    self->min_replicas = opts->min_replicas;
    self->lease_ms = opts->lease_ms;
    self->shard_index = opts->shard_index;
    self->shard_count = opts->shard_count;
    self->buffer_bytes = opts->buffer_bytes ? opts->buffer_bytes : S_DEFAULT_BUFFER_BYTES;
    self->event_fd = -1;
    self->server_stop = opts->server_stop;
    self->snapshots = kb_snapshots_new(bank, opts->shard_index, opts->shard_count);
    pthread_mutex_init(&self->mutex, NULL);
    pthread_mutex_init(&self->op_mutex, NULL);
    self->state = carls_xcalloc(1, sizeof *self->state);
    self->zctx = zmq_ctx_new();
    if (!self->zctx)
        CARLS_FATAL("zmq_ctx_new failed");
    if (s_curve_init(self, opts, err, errlen) != 0)
        goto fail;
    int rc = kb_term_load(self->data_dir, self->state, err, errlen);
    if (rc != 0 && rc != -ENOENT)
        goto fail;
    self->have_state = rc == 0;
    if (kb_commit_is_replica(self->commit) != (self->replica_of || self->have_state)) {
        carls_errorf(err, errlen, -1, "the bank was opened in the wrong mode for this member (kb_replica_bank_mode)");
        goto fail;
    }
    kb_service_replication_t hooks = {s_handle, s_free_result, s_check_read, self};
    kb_service_set_replication(service, &hooks);
    if (self->replica_of) {
        if (self->have_state && self->state->role != KB_TERM_FOLLOWER) {
            self->state->role = KB_TERM_FOLLOWER;
            s_save(self);
        }
        pthread_mutex_lock(&self->mutex);
        s_publish_role(self);
        pthread_mutex_unlock(&self->mutex);
        s_start_follower(self);
        LOG_INFO("follower of %s%s", self->replica_of, self->have_state ? "" : " (a new member)");
    } else if (self->have_state) {
        if (self->state->role != KB_TERM_STANDBY) {
            self->state->role = KB_TERM_STANDBY;
            s_save(self);
        }
        pthread_mutex_lock(&self->mutex);
        s_publish_role(self);
        pthread_mutex_unlock(&self->mutex);
        LOG_WARN("standby (term %" PRIu64 "): this member has replicated before (%s/" KB_TERM_FILE ") and was "
                 "started without --replica-of, so it refuses writes until it is promoted (kbctl replica promote "
                 "--term %" PRIu64 ")", self->state->term, self->data_dir, self->state->term + 1);
    } else {
        kb_term_init(self->state, self->member, kb_commit_committed_epoch(self->commit) + 1);
        if (kb_term_save(self->data_dir, self->state, err, errlen) != 0)
            goto fail;
        self->have_state = true;
        if (s_start_primary(self, err, errlen) != 0)
            goto fail;
        pthread_mutex_lock(&self->mutex);
        s_publish_role(self);
        pthread_mutex_unlock(&self->mutex);
    }
    *out = self;
    return 0;
fail:
    kb_replica_destroy(&self);
    return -1;
}

void kb_replica_destroy(kb_replica_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_replica_t *self = *self_p;
    s_stop_follower(self);
    if (self->primary_running) {
        kb_commit_set_ship_hook(self->commit, NULL, NULL);
        atomic_store(&self->primary_stop, true);
        pthread_join(self->primary_thread, NULL);
    }
    if (self->transfer.thread_joinable)
        pthread_join(self->transfer.thread, NULL);
    kb_snapshots_destroy(&self->snapshots);
    kb_replica_catch_up_free(&self->catch_up);
    if (self->router)
        zmq_close(self->router);
    kb_auth_destroy(&self->auth);
    if (self->zctx)
        zmq_ctx_term(self->zctx);
    explicit_bzero(&self->curve_server, sizeof self->curve_server);
    explicit_bzero(&self->curve_client, sizeof self->curve_client);
    if (self->event_fd >= 0)
        close(self->event_fd);
    for (size_t i = self->ring_first; i < self->ring_count; i++)
        s_round_unref(NULL, self->ring[i]);
    free(self->ring);
    free(self->state);
    free(self->data_dir);
    free(self->member);
    free(self->client_endpoint);
    free(self->replica_of);
    free(self->listen);
    free(self->advertise);
    pthread_mutex_destroy(&self->mutex);
    pthread_mutex_destroy(&self->op_mutex);
    free(self);
    *self_p = NULL;
}
