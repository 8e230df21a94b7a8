/* Client library for kb-server: used by kbctl, knowledge makers and trainers.
 *
 * One kb_client_t owns one ZeroMQ DEALER socket connected to one server endpoint, and must be used from one
 * thread at a time. It is the transport: it sends requests the caller built (kb_client_send, kb_client_call),
 * resends them, and receives their answers; many requests may be in flight (kb_client_send +
 * kb_client_wait). Requests are built by kb_cluster (kb_cluster.h), the one request API, also for one
 * server (kb_cluster_new with one endpoint, or kb_cluster_over a client).
 *
 * Timeouts and retries: each attempt waits timeout_ms; after a timeout the client closes and reopens its
 * socket (dropping anything queued for a dead peer) and resends the same request with the same request id,
 * client id and sequence number, up to `retries` more times. The server applies a write with a given
 * (client_id, sequence) once, so a retried write never applies twice.
 *
 * Replicated shards (docs/REPLICATION.md section 4): the endpoint may name the members of one shard separated
 * by '|' ("tcp://a:1|tcp://b:2"; ',' between shards is kb_cluster's). A client of several members talks to
 * one of them at a time (the first to begin with), keeps the highest term seen in answers, and moves to
 * another member, resending every request in flight byte for byte (same request id, client id and
 * sequence, so a write is still applied once), when:
 *   - the member is not connected failover_timeout_ms after the attempt began (a dead process or a lost
 *     node: ZeroMQ heartbeats drop a silent connection within about a second), or gave no answer in
 *     timeout_ms although connected;
 *   - it answers STATUS_NOT_PRIMARY: to the primary its answer names (added to the members when new), else
 *     to the next member after a 100 ms pause; STATUS_UNAVAILABLE (shutting down) likewise;
 *   - it answers with a term below the highest seen (a deposed primary): the answer is dropped.
 * Each move is logged (LOG_WARN) with its reason. A wait gives up after failover_wait_ms: with the last
 * NOT_PRIMARY/UNAVAILABLE answer to its request (KB_CLIENT_ESTATUS) if there was one, else
 * KB_CLIENT_ETIMEOUT. A client of one member does none of this: NOT_PRIMARY is an error status as any
 * other, and timeouts and retries are as above.
 *
 * Return convention: 0 on success, a negative KB_CLIENT_E* code on failure; kb_client_last_error() then
 * describes it (for KB_CLIENT_ESTATUS: the server's status name and error text) and, for KB_CLIENT_ESTATUS,
 * kb_client_last_status() is the server's status as the protobuf enum: callers test the enum, never the
 * text. */
#ifndef KB_CLIENT_H
#define KB_CLIENT_H

#include "carls.pb-c.h"
#include "kb_keys.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_client kb_client_t;

/* The most members one client keeps (given, and primaries named in answers). */
#define KB_CLIENT_MAX_MEMBERS 16

enum {
    KB_CLIENT_OK = 0,
    KB_CLIENT_ETIMEOUT = -1, /* no answer after every retry */
    KB_CLIENT_ESTATUS = -2,  /* the server answered with a non-OK status */
    KB_CLIENT_EINVAL = -3,   /* the call's arguments are wrong (caught before sending) */
    KB_CLIENT_EIO = -4,      /* ZeroMQ failure, or an answer in another protocol version */
    KB_CLIENT_EMALFORMED = -5, /* an answer that does not decode, or whose contents do not fit the request
                              * (another result kind, wrong counts): a broken or hostile server */
};

/* CURVE keys for an encrypted, authenticated connection (docs/SECURITY.md): this client's key pair and the
 * public key of the only server it will talk to. kb_client_curve_load reads them from key files. */
typedef struct {
    kb_auth_keypair_t client;
    kb_auth_key_t server_public;
} kb_client_curve_t;

typedef struct {
    int timeout_ms;     /* per attempt; 0 means 5000 */
    int retries;        /* extra attempts after a timeout; negative means 0; default (0 here) means 0 */
    uint64_t client_id; /* 0: a random nonzero id */
    /* NULL: plain TCP. Otherwise every DEALER socket the client opens (the first one and each one reopened
     * after a timeout) is a CURVE client with these keys; a server without the matching secret key, or one
     * that refuses this client's public key, never answers (the calls time out). Copied by kb_client_new,
     * so the caller may wipe its copy afterwards. kb_client_new fails when libzmq lacks CURVE. */
    const kb_client_curve_t *curve;
    /* Several members only (see above): how long an attempt waits for a connection to the member before
     * moving on; 0 means 1000 (and never above timeout_ms). */
    int failover_timeout_ms;
    /* Several members only: how long a wait keeps trying members (a promotion may take seconds); 0 means
     * the larger of 10000 and timeout_ms x (retries + 1). */
    int failover_wait_ms;
} kb_client_options_t;

/* A key: any byte string (not NUL-terminated). */
typedef carls_bytes_t kb_key_t;

/* Per-row metadata returned by lookups. */
typedef struct {
    uint64_t version;
    int64_t updated_at_ms;
    uint64_t frequency;
} kb_row_meta_t;

/* Loads *out from a client secret key file (kb-keygen's NAME.key) and a server public key file
 * (server.pub). 0, or a negative KB_AUTH_E* code with a message in err. */
int kb_client_curve_load(const char *key_file, const char *server_key_file, kb_client_curve_t *out, char *err,
                         size_t errlen);

/* The one rule for the items of an endpoint list, a shard's members separated by '|' (kb_client_new) or the
 * shards separated by ',' (kb_cluster_new): cut at sep, each item trimmed of spaces and tabs. Returns a copy
 * of the item that begins at *p (the caller frees it), or NULL when it is empty; moves *p past the item's
 * separator, to NULL after the last item. */
char *kb_client_list_item(const char **p, char sep);

/* Connects to endpoint ("tcp://127.0.0.1:7000", or the members of one replicated shard,
 * "tcp://a:1|tcp://b:2", spaces around each allowed). opts may be NULL for defaults. Caller owns the result;
 * NULL on failure (logged: also an empty or repeated member, or more than KB_CLIENT_MAX_MEMBERS). Connecting
 * never blocks: a server that is not up yet is waited for per call. */
kb_client_t *kb_client_new(const char *endpoint, const kb_client_options_t *opts);

/* Closes the socket and frees the client; accepts NULL and *self_p == NULL; nulls *self_p. */
void kb_client_destroy(kb_client_t **self_p);

/* Last error text for this client ("" after success). Valid until the next call on the client. */
const char *kb_client_last_error(const kb_client_t *self);

/* The status of the server's last non-OK answer to this client (after KB_CLIENT_ESTATUS), e.g.
 * CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED when the server is at its --max-memory and refused a request
 * that would create rows; STATUS_OK after a success or a failure without an answer. Valid until the next
 * call on the client. */
Carls__StatusCode kb_client_last_status(const kb_client_t *self);

uint64_t kb_client_id(const kb_client_t *self);

/* The endpoint this client connects to, as given to kb_client_new. */
const char *kb_client_endpoint(const kb_client_t *self);

/* The member in use (the endpoint itself for a client of one member). Valid until the next call. */
const char *kb_client_member(const kb_client_t *self);

/* Number of members: those given, and primaries that NOT_PRIMARY answers named since. */
size_t kb_client_members(const kb_client_t *self);

/* Member i (< kb_client_members) as given or named. Valid until the next call. */
const char *kb_client_member_at(const kb_client_t *self, size_t i);

/* The highest term seen in answers (0: none, or not a replicated shard). */
uint64_t kb_client_term(const kb_client_t *self);

/* The attempt one member gets before the next is tried: the options' failover_timeout_ms (default 1000 ms),
 * at most timeout_ms. */
int kb_client_failover_timeout_ms(const kb_client_t *self);

/* Low level. Fills req's protocol_version and request_id, and for writes (create/drop table, put, push
 * gradients) client_id and a fresh sequence number; packs and sends it. *request_id_out identifies it. */
int kb_client_send(kb_client_t *self, Carls__Request *req, uint64_t *request_id_out);

/* Waits for the answer to request_id (resending on timeout as described above). On success (status OK)
 * *response_out is the decoded answer; caller owns it and frees it with carls__response__free_unpacked(r,
 * NULL). On KB_CLIENT_ESTATUS *response_out is also set (caller frees) so the status can be inspected.
 * Answers to other requests in flight that arrive meanwhile are kept for their own wait; answers to ids not
 * in flight (late duplicates) are dropped. A frame that does not decode fails this wait with
 * KB_CLIENT_EMALFORMED.
 * Every return except KB_CLIENT_EINVAL (request_id not in flight) ends the request: it is no longer in
 * flight afterwards, and a late answer to it is dropped. */
int kb_client_wait(kb_client_t *self, uint64_t request_id, Carls__Response **response_out);

/* Ends request_id without waiting for it: an answer that comes later is dropped. For a caller that gives up
 * on requests it sent (an error elsewhere). KB_CLIENT_EINVAL when request_id is not in flight. */
int kb_client_cancel(kb_client_t *self, uint64_t request_id);

/* kb_client_send + kb_client_wait. */
int kb_client_call(kb_client_t *self, Carls__Request *req, Carls__Response **response_out);

#endif
