/* The cluster's state and the fan-out engine its files share (kb_cluster.c: errors, lifecycle, the engine,
 * tables; and the files of its operations). Private to the cluster: nothing outside client/kb_cluster*.c
 * includes it. */
#ifndef KB_CLUSTER_INTERNAL_H
#define KB_CLUSTER_INTERNAL_H

#include "kb_cluster.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the cluster remembers about one table. */
typedef struct {
    char *name;
    kb_cluster_table_t info;
} kb_cluster_cached_table_t;

/* A shard's read replicas (kb_cluster_set_read_replicas): a client of one member each, opened on first use. */
typedef struct {
    size_t n;
    char *endpoint[KB_CLIENT_MAX_MEMBERS];
    kb_client_t *client[KB_CLIENT_MAX_MEMBERS];
    size_t next;                        /* the shard client's member index the next read starts from */
} kb_cluster_readers_t;

struct kb_cluster {
    uint32_t n;                         /* shards */
    kb_client_t **clients;              /* (n) shard i's client */
    bool borrowed;                      /* kb_cluster_over: the one client is the caller's, not closed on destroy */
    char **endpoints;                   /* (n) shard i's endpoint */
    kb_cluster_cached_table_t *tables;  /* cache filled by list_tables */
    size_t n_tables;
    int failed_shard;                   /* shard the last error is about, or -1 */
    Carls__StatusCode last_status;      /* the status of the last KB_CLIENT_ESTATUS failure; OK otherwise */
    uint64_t requests;                  /* requests sent so far (kb_cluster_requests) */
    kb_client_options_t read_opts;      /* the cluster's options, for read replica clients (s_reader_of) */
    kb_client_curve_t curve;            /* read_opts.curve points here when the cluster uses CURVE */
    uint32_t read_staleness_ms;         /* kb_cluster_set_read_replicas; 0: reads go to the shard's client */
    kb_cluster_readers_t *readers;      /* (n) once read replicas were turned on */
    uint64_t replica_served, replica_fell_back; /* kb_cluster_replica_reads */
    char last_error[768];               /* "" after success */
};

/* Keys grouped by shard: shard s's keys are wire[start[s] .. start[s] + count[s]), and order[j] is the
 * caller's index of grouped key j. Within a shard the caller's order is kept. */
typedef struct {
    size_t *count;              /* (shards) */
    size_t *start;              /* (shards) */
    size_t *order;              /* (n) */
    ProtobufCBinaryData *wire;  /* (n) pointing at the caller's key bytes (valid until the requests are sent) */
} kb_cluster_split_t;

/* The operation one shard's request carries (the request's oneof points at it). */
typedef union {
    Carls__Lookup lookup;
    Carls__Put put;
    Carls__PushGradients push_gradients;
    Carls__FeatureGet feature_get;
    Carls__FeaturePut feature_put;
    Carls__Sample sample;
    Carls__Knn knn;
    Carls__ImportRows import_rows;
} kb_cluster_op_t;

/* One operation spread over the shards: at most one request per shard, all sent before any answer is
 * awaited, then the answers. Every operation of the cluster's files goes through it:
 *   kb_cluster_fan_init             one fan-out on a table, whose answers must carry result `want`
 *   kb_cluster_fan_keys, kb_cluster_fan_request, kb_cluster_to_all
 *                                   build the requests (keys split by shard, or one per shard)
 *   kb_cluster_fan_send, kb_cluster_fan_wait (or kb_cluster_fan_run)
 *                                   send them all, then collect every answer
 *   kb_cluster_fan_free             frees it, cancelling requests still in flight (abandoned)
 * A failure is reported for the first shard in shard order that failed (kb_cluster_failed_shard). */
typedef struct {
    char *table;                      /* a copy of the table name the requests point at */
    Carls__Response__ResultCase want; /* the result every answer must carry */
    kb_cluster_split_t sp;            /* the keys by shard (kb_cluster_fan_keys); empty for operations without keys */
    Carls__Request *reqs;             /* (shards) shard s's request; op_case NOT_SET: nothing for shard s */
    kb_cluster_op_t *ops;             /* (shards) shard s's own operation (kb_cluster_fan_request; the requests
                                       * of kb_cluster_to_all share the caller's instead) */
    float *rows;                      /* put, push_gradients: the caller's rows in shard order (several shards) */
    Carls__FeatureRecord **records;   /* feature_put: the caller's records in shard order */
    uint64_t *ids;                    /* (shards) request id of each request sent */
    kb_client_t **to;                 /* (shards) the client it was sent through: the shard's, or a read
                                       * replica's (kb_cluster_send_to) */
    bool *in_flight;                  /* (shards) sent and not waited for yet */
    Carls__Response **resps;          /* (shards) the answers after a successful kb_cluster_fan_wait; NULL where
                                       * none */
    int rc;                           /* the failure reported (0: none yet) */
    int failed;                       /* the shard it is about, or -1 */
} kb_cluster_fan_t;

/* A fan-out whose answers are collected later (the *_send / *_wait calls). */
struct kb_cluster_pending {
    kb_cluster_fan_t fan;        /* the requests; their answers once waited for */
    uint32_t dim;                /* lookup: the rows' dim */
    kb_sample_result_t *sample;  /* sample with several shards: the draws, made when it was sent */
};

/* ---- errors ---- */

void kb_cluster_set_error(kb_cluster_t *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kb_cluster_clear_error(kb_cluster_t *self);
/* An error the cluster answers itself with the status a single server would give. Returns KB_CLIENT_ESTATUS. */
int kb_cluster_status_error(kb_cluster_t *self, Carls__StatusCode status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records that shard s failed, with what as the text. */
void kb_cluster_shard_error(kb_cluster_t *self, uint32_t s, const char *what);
/* Shard s's client failed: its error text and its status become the cluster's. */
void kb_cluster_client_error(kb_cluster_t *self, uint32_t s);
/* kb_cluster_shard_error with a formatted reason. */
void kb_cluster_shard_errorf(kb_cluster_t *self, uint32_t s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- one request to one shard, through a read replica when it may ---- */

/* Sends req to shard s: a read (kb_cluster_set_read_replicas) to a follower first, with the staleness bound,
 * else (or when that send fails) through the shard's client. *to is the client it went through and *id its
 * request id. 0 or the send's failure (error not set). */
int kb_cluster_send_to(kb_cluster_t *self, uint32_t s, Carls__Request *req, kb_client_t **to, uint64_t *id);
/* Waits for the answer to *id from `to`; a read replica that fails it (any error, STALE above all, or an
 * answer without result want) sends req again through the shard's client, and that answer counts (*id is
 * then its id). As kb_client_wait: 0 with *resp, or the failure (*resp set on KB_CLIENT_ESTATUS; error not
 * set). */
int kb_cluster_wait_from(kb_cluster_t *self, uint32_t s, Carls__Request *req, kb_client_t *to, uint64_t *id,
                         Carls__Response__ResultCase want, Carls__Response **resp);
/* Closes the read replicas' clients (kb_cluster_destroy). */
void kb_cluster_readers_free(kb_cluster_t *self);

/* ---- the fan-out engine ---- */

void kb_cluster_split_free(kb_cluster_split_t *sp);
/* Checks keys and groups them by shard into *sp. 0, or KB_CLIENT_EINVAL (error set). */
int kb_cluster_split(kb_cluster_t *self, const char *what, const kb_key_t *keys, size_t n,
                     kb_cluster_split_t *sp);
void kb_cluster_fan_init(kb_cluster_t *self, kb_cluster_fan_t *fan, const char *table,
                         Carls__Response__ResultCase want);
void kb_cluster_fan_free(kb_cluster_t *self, kb_cluster_fan_t *fan);
/* Makes req carry operation op, its oneof member pointing at msg; returns the descriptor of op's message. */
const ProtobufCMessageDescriptor *kb_cluster_request_op(const kb_cluster_fan_t *fan, Carls__Request *req,
                                                        Carls__Request__OpCase op, void *msg);
/* Builds shard s's request for operation op carrying n_keys keys; returns the operation to fill in. */
kb_cluster_op_t *kb_cluster_fan_request(kb_cluster_fan_t *fan, uint32_t s, Carls__Request__OpCase op,
                                        ProtobufCBinaryData *keys, size_t n_keys);
/* Splits keys by shard and builds operation op for every shard holding keys. 0 or KB_CLIENT_EINVAL. */
int kb_cluster_fan_keys(kb_cluster_t *self, kb_cluster_fan_t *fan, const char *what, Carls__Request__OpCase op,
                        const kb_key_t *keys, size_t n);
/* Records rc as shard s's failure if it is the first in shard order so far; true when it is. */
bool kb_cluster_fan_failed(kb_cluster_fan_t *fan, uint32_t s, int rc);
int kb_cluster_fan_send(kb_cluster_t *self, kb_cluster_fan_t *fan);
int kb_cluster_fan_wait(kb_cluster_t *self, kb_cluster_fan_t *fan);
int kb_cluster_fan_run(kb_cluster_t *self, kb_cluster_fan_t *fan);
/* Sends p's requests: 0 with *out = p, or the failure (p freed). */
int kb_cluster_pending_send(kb_cluster_t *self, kb_cluster_pending_t *p, kb_cluster_pending_t **out);
kb_cluster_pending_t *kb_cluster_pending_new(kb_cluster_t *self, const char *table,
                                             Carls__Response__ResultCase want);
/* Sends operation op (message msg, shared by every shard) to every shard and waits for every answer. */
int kb_cluster_to_all(kb_cluster_t *self, kb_cluster_fan_t *fan, const char *table, Carls__Request__OpCase op,
                      void *msg, Carls__Response__ResultCase want);

#endif
