/* The service's state and the helpers its files share: kb_service.c (requests, replies, validation, most
 * operations and their dispatch) and kb_service_rows.c (scan, import_rows, snapshots). Private to the service:
 * nothing outside knowledge_bank/kb_service*.c includes it. */
#ifndef KB_SERVICE_INTERNAL_H
#define KB_SERVICE_INTERNAL_H

#include "kb_service.h"

#include "kb_latency.h"
#include "kb_snapshot.h"
#include "protocol.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The operations, in the order of the dispatch table (s_ops in kb_service.c); latency is kept per operation at
 * these indexes. */
enum {
    OP_CREATE, OP_DROP, OP_LIST, OP_LOOKUP, OP_PUT, OP_PUSH, OP_STATS, OP_CHECKPOINT,
    OP_KNN, OP_SAMPLE, OP_FEATURE_GET, OP_FEATURE_PUT, OP_SCAN,
    OP_IMPORT_ROWS,
    OP_SNAPSHOT,
    OP_REPLICA,
    OP_COUNT
};

/* Per-table request counters (stats: requests by kind, errors, latency). Kept in an open-addressed table of
 * S_TABLE_SLOTS slots filled lock-free (compare-and-swap on an empty slot) and never emptied, so a reader
 * never sees a counter freed under it; a dropped table's counters stay (and continue if the name is created
 * again). Only requests naming an existing table (or creating one) are counted, so clients cannot fill the
 * slots with made-up names; past S_TABLE_SLOTS tables the rest go uncounted per table. */
#define S_TABLE_SLOTS 1024

typedef struct {
    char name[CARLS_MAX_TABLE_NAME_BYTES + 1];
    atomic_uint_fast64_t errors;    /* requests on the table answered with a non-OK status */
    atomic_uint_fast64_t mem_refusals, mem_refused_rows; /* RESOURCE_EXHAUSTED answers, rows they asked for */
    kb_latency_t latency[OP_COUNT]; /* per operation: count and latency */
} kb_service_table_counters_t;

struct kb_service {
    kb_bank_t *bank;
    kb_commit_t *commit; /* the bank's commit pipeline (kb_bank_commit): write bracket, tickets, stats */
    kb_limits_t limits;
    uint32_t threads;
    char *durability;
    int64_t started_ms;
    atomic_uint_fast64_t requests, errors, malformed, duplicates;
    atomic_uint_fast64_t mem_refusals, mem_refused_rows; /* RESOURCE_EXHAUSTED answers (create_table too) */
    kb_latency_t latency[OP_COUNT];
    _Atomic(kb_service_table_counters_t *) table_counters[S_TABLE_SLOTS];
    atomic_bool table_counters_full_logged;
    kb_snapshots_t *snapshots; /* this server's bank snapshots (kb_snapshot.h) */
    kb_parallel_run_fn parallel; /* NULL: no helpers (kb_service_set_parallel) */
    void *parallel_ctx;
    /* Replication (kb_service_set_replication, kb_service_set_role). */
    kb_service_replication_t replication;
    atomic_uint_fast64_t term;
    atomic_bool writable;
    pthread_mutex_t primary_mutex;
    char primary[256];
};

/* Per-request scratch: the response and what its fields point to, freed after packing. */
typedef struct {
    Carls__Response resp;
    char error[512];
    union {
        Carls__LookupResult lookup;
        Carls__WriteResult write;
        Carls__TableList list;
        Carls__StatsResult stats;
        Carls__CheckpointResult checkpoint;
        Carls__KnnResult knn;
        Carls__SampleResult sample;
        Carls__FeatureResult features;
        Carls__ScanResult scan;
        Carls__SnapshotResult snapshot;
        Carls__ReplicaResult replica;
    } r;
    void **owned; /* malloc'd buffers the response points into */
    size_t owned_count, owned_capacity;
    Carls__FeatureRecord **records; /* unpacked records the response points to */
    size_t record_count;
    kb_table_t **held; /* tables whose names the response points to: released once it is packed */
    size_t held_count;
    uint64_t durable_ticket; /* sync durability: the epoch that must commit before this reply may go out */
} kb_service_reply_t;

/* Records a buffer to free once the reply is packed; returns it. */
void *kb_service_own(kb_service_reply_t *rp, void *ptr);
/* Fails the request with status and a formatted error. Returns -1. */
int kb_service_fail(kb_service_reply_t *rp, Carls__StatusCode status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks a request's n keys (count, sizes, shard). 0, or -1 (rp holds the error). */
int kb_service_check_keys(kb_service_t *self, kb_service_reply_t *rp, size_t n, const ProtobufCBinaryData *keys);
/* Acquires the request's table or fails NOT_FOUND. */
kb_table_t *kb_service_table(kb_service_t *self, kb_service_reply_t *rp, const char *name);
/* Answers a write: its WriteResult (rows, whether it was a duplicate, updates applied). */
void kb_service_write_ok(kb_service_reply_t *rp, uint32_t rows, bool duplicate, uint64_t updates);
/* --max-memory: reserves what a write of n keys would add to table t, or fails RESOURCE_EXHAUSTED. */
int kb_service_reserve_rows(kb_service_t *self, kb_service_reply_t *rp, kb_table_t *t, kb_table_growth_op_t op,
                            const ProtobufCBinaryData *keys, size_t n, const size_t *record_lens, uint64_t *reserved);

/* A validated write, applied inside the bank's write bracket by kb_service_run_write: 0, or -1 (rp holds the
 * error). */
typedef int (*kb_service_apply_fn)(kb_service_t *self, const Carls__Request *req, kb_table_t *table,
                                   kb_service_reply_t *rp);
int kb_service_run_write(kb_service_t *self, const Carls__Request *req, kb_table_t *table, kb_service_reply_t *rp,
                         kb_service_apply_fn apply);
/* Checks a feature record from the wire. */
int kb_service_check_record(kb_service_t *self, kb_service_reply_t *rp, size_t i, const Carls__FeatureRecord *r);
/* Decodes a stored record for a reply; an empty "not found" one for NULL. */
Carls__FeatureRecord *kb_service_reply_record(kb_service_reply_t *rp, const uint8_t *buf, size_t len, bool found);

/* Operations (the dispatch table in kb_service.c): 0, or -1 (rp holds the error). */
int kb_service_op_import_rows(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp);
int kb_service_op_scan(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp);
int kb_service_op_snapshot(kb_service_t *self, const Carls__Request *req, kb_service_reply_t *rp);

#endif
