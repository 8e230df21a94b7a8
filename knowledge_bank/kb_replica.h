/* Replicated shards (docs/REPLICATION.md): a shard's members are one primary and its followers, each a
 * kb-server with its own journal and SQLite file.
 *
 * The primary hands every persister round to a replicator thread (kb_commit_set_ship_hook), which keeps recent
 * rounds in memory and streams them over a ROUTER socket of its own (--replication-listen) to each follower's
 * DEALER; followers apply them (kb_commit_apply_replicated) and acknowledge. With --min-replicas K a write is
 * acknowledged once K followers applied its epoch too (kb_commit_set_replicated). A follower asks the primary's
 * client endpoint (--replica-of) for the replication endpoint with the replica op.
 *
 * Terms (kb_term.h) keep two primaries of a shard from both acknowledging writes: every round and reply carries
 * the member's term; a follower refuses rounds of an older term (which deposes the primary that sent them);
 * promotion takes a term above every member's. The coordinator (carls run, or an operator with kbctl) decides:
 * fence the followers with the new term, promote the most advanced one, restart the others as its followers.
 * A member that has replicated before (DATA/REPLICATION exists) and is started without --replica-of is a
 * standby: it serves reads and refuses writes until it is promoted, so terms only ever come from a promotion.
 *
 * A follower the primary's memory cannot bring up to date (it was away longer than --replication-buffer-bytes
 * of rounds, it is new to a primary that holds data, or it diverged: it holds rounds of an old term the new
 * primary never had) is sent a snapshot (kb_snapshot.h), which it checks, restores and continues from.
 *
 * CURVE (docs/SECURITY.md): with the server's key pair (--curve-secret) and allow-list (--curve-allow) the
 * replication socket is a CURVE server like the client socket, with a ZAP handler of its own in the
 * replicator's ZeroMQ context admitting the same keys. A follower connects, to the primary's client endpoint
 * (to ask for the replication endpoint) and to its replication socket, as a CURVE client with its own key
 * pair (--replica-curve-key), trusting the public key of its own --curve-secret: a shard's members share one
 * server key pair (their clients fail over between them with one --curve-server-key). */
#ifndef KB_REPLICA_H
#define KB_REPLICA_H

#include "kb_bank.h"
#include "kb_service.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *data_dir;
    const char *member;       /* this member's name (--member; default its client endpoint) */
    const char *replica_of;   /* the primary's client endpoint: this member follows it; NULL: primary or standby */
    const char *listen;       /* what a primary binds for its followers (NULL: tcp://<client endpoint's host>:*) */
    const char *client_endpoint; /* the endpoint this server bound for its clients */
    const char *advertise;    /* the replication endpoint followers are told (NULL: the bound one), for a
                               * primary reached through a relay, a NAT or a tunnel */
    uint32_t min_replicas;    /* --min-replicas (sync durability) */
    uint32_t lease_ms;        /* --lease-ms: a primary acknowledges writes only while max(K, 1) followers
                               * answered a message it sent less than this long ago (0: no lease) */
    uint32_t shard_index, shard_count;
    uint64_t buffer_bytes;    /* rounds kept for followers that fall behind (0: 256 MiB) */
    volatile sig_atomic_t *server_stop; /* set to 1 when a follower received a snapshot to restart on */
    const char *curve_secret;  /* --curve-secret: the replication socket's key pair too (NULL: no CURVE) */
    const char *curve_allow;   /* --curve-allow: the followers' (and clients') keys the socket admits */
    const char *curve_replica_key; /* --replica-curve-key: a follower's client key pair (with curve_secret) */
} kb_replica_options_t;

typedef struct kb_replica kb_replica_t;

/* Before the bank opens: whether it must open as a replica (a follower, or a standby because DATA/REPLICATION
 * exists). 0, or -1 with err when the REPLICATION file is unreadable. */
int kb_replica_bank_mode(const kb_replica_options_t *opts, bool *replica, char *err, size_t errlen);

/* Takes the member's role: a primary binds its replication socket and starts its replicator, a follower starts
 * following, a standby waits for a promotion. Sets the service's role and replica op. 0, or -1 with err (a
 * key file that does not load is named with its flag). */
int kb_replica_new(kb_bank_t *bank, kb_service_t *service, const kb_replica_options_t *opts, kb_replica_t **out,
                   char *err, size_t errlen);

/* Snapshot catch-up of a follower: after the server stopped because a snapshot was received, the snapshot
 * to restore (NULL when none; the caller frees it). With every part of the server closed, apply restores it
 * into the data directory (kb_snapshot_restore) and writes the primary's term history; the server then
 * starts again as the same follower and continues from the snapshot's cut. */
typedef struct kb_replica_catch_up kb_replica_catch_up_t;
kb_replica_catch_up_t *kb_replica_take_catch_up(kb_replica_t *self);
int kb_replica_catch_up_apply(const kb_replica_catch_up_t *cu, char *err, size_t errlen);
void kb_replica_catch_up_free(kb_replica_catch_up_t **cu_p);

/* Stops the threads and closes the sockets (before the bank closes). Accepts NULL; nulls *self_p. */
void kb_replica_destroy(kb_replica_t **self_p);

#endif
