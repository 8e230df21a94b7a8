/* Request handling: one packed carls.Request in, one packed carls.Response out.
 *
 * Everything that arrives is untrusted. The handler checks the frame size, decodes (a NULL from protobuf-c
 * is MALFORMED), checks the protocol version, the operation, the table name, key counts and lengths,
 * dimensions and finiteness, all before anything is allocated from the request's declared sizes or any
 * table is touched, and answers every problem with a status and a message. Writes are de-duplicated by
 * (client_id, sequence) and, in sync durability, answered only after they have committed.
 *
 * kb_service_handle is thread-safe: the server's request thread and its workers call it concurrently. */
#ifndef KB_SERVICE_H
#define KB_SERVICE_H

#include "carls.pb-c.h"
#include "kb_bank.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits on what one request may ask; each is a kb-server flag (defaults in proto/protocol.h). */
typedef struct {
    uint32_t max_message_bytes;
    uint32_t max_key_bytes;
    uint32_t max_dim;
    uint32_t max_keys_per_request;
    int commit_timeout_ms; /* sync durability: answer INTERNAL if a commit takes longer */
    bool read_only;        /* refuse every write */
    uint32_t shard_index;  /* this server is shard shard_index of shard_count (--shard i/n) */
    uint32_t shard_count;  /* 0 or 1: unsharded; otherwise keys of other shards are refused */
    uint32_t knn_slice_us; /* a knn is split among idle workers in slices of about this much search; 0: never */
} kb_limits_t;

/* Fills the defaults. */
void kb_limits_defaults(kb_limits_t *limits);

typedef struct kb_service kb_service_t;

/* The service borrows bank (which must outlive it). durability is the text shown in stats. */
kb_service_t *kb_service_new(kb_bank_t *bank, const kb_limits_t *limits, uint32_t threads, const char *durability);
void kb_service_destroy(kb_service_t **self_p);

/* Handles one request frame. Always produces a reply (MALFORMED for undecodable frames, with request id
 * 0): *reply is a malloc'd packed Response the caller frees. */
void kb_service_handle(kb_service_t *self, const uint8_t *frame, size_t len, uint8_t **reply, size_t *reply_len);

/* What a deferred reply waits for before it may be sent. */
typedef struct {
    uint64_t durable_ticket; /* 0: send now; else once kb_commit_durable_epoch() >= durable_ticket */
    uint64_t request_id;     /* for kb_service_error_reply if the commit fails or takes too long */
} kb_service_deferred_t;

/* As kb_service_handle, but a sync write does not wait for its commit here: its reply is produced at once
 * and *deferred says which commit it must wait for (the caller parks it; nothing blocks on the commit). */
void kb_service_handle_deferred(kb_service_t *self, const uint8_t *frame, size_t len, uint8_t **reply,
                                size_t *reply_len, kb_service_deferred_t *deferred);

/* An INTERNAL reply to request_id with the text error (a parked reply whose commit failed), counted as an
 * error. *reply is malloc'd. */
void kb_service_error_reply(kb_service_t *self, uint64_t request_id, const char *error, uint8_t **reply,
                            size_t *reply_len);

/* The same with another status than INTERNAL. */
void kb_service_status_reply(kb_service_t *self, uint64_t request_id, Carls__StatusCode status, const char *error,
                             uint8_t **reply, size_t *reply_len);

/* Replication (kb_replica.h provides it): handle answers the replica op, filling res (what it points to is
 * the handler's until free_result(ctx, res) after the reply is packed) and returning a StatusCode with err. */
typedef struct {
    int (*handle)(void *ctx, const Carls__Replica *req, Carls__ReplicaResult *res, char *err, size_t errlen);
    void (*free_result)(void *ctx, Carls__ReplicaResult *res);
    /* A read with bounds on a member that is not the primary: 0 when it is within them (*applied: its
     * epoch), else -1 with why (how far behind). */
    int (*check_read)(void *ctx, uint32_t max_staleness_ms, uint64_t max_lag_epochs, uint64_t min_epoch,
                      uint64_t *applied, char *why, size_t whylen);
    void *ctx;
} kb_service_replication_t;
void kb_service_set_replication(kb_service_t *self, const kb_service_replication_t *replication);

/* The member's role as every reply shows it: its term (0: not replicated), whether writes are accepted (else
 * they get STATUS_NOT_PRIMARY naming primary, "" when unknown, and lookups create no rows). Any thread. */
void kb_service_set_role(kb_service_t *self, uint64_t term, bool writable, const char *primary);

/* The commit pipeline of the bank the service was made with (the transport parks replies on it). */
kb_commit_t *kb_service_commit(kb_service_t *self);

/* How long a parked reply may wait for its commit (--commit-timeout-ms). */
int kb_service_commit_timeout_ms(const kb_service_t *self);

/* True for operations that can take long (knn, sample, scan, stats, checkpoint, create and drop table):
 * the transport hands those to worker threads so that lookups and writes never queue behind them. Reads the
 * frame's field tags only. */
bool kb_service_request_may_block(const uint8_t *frame, size_t len);

/* Runs fn(arg, 0), ..., fn(arg, n - 1), several at once where threads are free, and returns when every
 * call has returned. The transport provides it (its idle workers help); without one, the calls run one
 * after another on the calling thread. */
typedef void (*kb_parallel_fn)(void *arg, size_t i);
typedef void (*kb_parallel_run_fn)(void *ctx, size_t n, kb_parallel_fn fn, void *arg);

/* Lets one long request (a knn of many queries) use threads that would otherwise wait: a lone trainer's
 * search is not limited to one core. Set before serving; run(ctx, ...) must be callable from any thread. */
void kb_service_set_parallel(kb_service_t *self, kb_parallel_run_fn run, void *ctx);

/* Counts a frame dropped by the transport before it could be handled (e.g. a multi-part message). */
void kb_service_count_dropped(kb_service_t *self);

/* The answer a `stats` request for every table would get now (for the Prometheus exporter, kb_metrics.h).
 * Thread-safe. Returns 0 and *out, which the caller owns and frees with
 * carls__stats_result__free_unpacked(*out, NULL); -1 (and *out NULL) on failure. The call is not counted as a
 * request. */
int kb_service_stats_snapshot(kb_service_t *self, Carls__StatsResult **out);

#endif
