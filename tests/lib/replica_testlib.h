/* Helpers of the replicated-shard tests (test_replication*, test_client_failover; docs/REPLICATION.md): the
 * replica op as the coordinator sends it, members' roles, and numbered rows "key-I" of a table "t" of
 * dimension REPL_DIM whose value and version say which put wrote them. Failures are cmocka assertions. */
#ifndef CARLS_REPLICA_TESTLIB_H
#define CARLS_REPLICA_TESTLIB_H

#include "kb_cluster.h"
#include "raw_client.h"
#include "server_harness.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REPL_DIM 4

/* The replica op (action, term, min_replicas for promote and set) over rc: the answer (caller frees), or NULL
 * when none came within 10 s. */
Carls__Response *repl_op(raw_client_t *rc, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas);

/* repl_op to endpoint over a plain connection of its own; asserts that an answer came. */
Carls__Response *repl_op_at(const char *endpoint, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas);

/* repl_op_at that must be answered OK (fail_msg with the server's error otherwise). */
void repl_op_ok(const char *endpoint, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas);

/* The member's status over a plain connection, asserting an OK answer (caller frees). */
Carls__Response *repl_status(const char *endpoint);

/* Asserts that the member at endpoint is a `role` ("primary", "follower", "standby", "deposed") of term. */
void repl_expect_role(const char *endpoint, const char *role, uint64_t term);

/* A cluster of the given endpoint(s) with timeout_ms per attempt and no retries. */
kb_cluster_t *repl_client(const char *endpoint, int timeout_ms);

/* Creates table "t" (REPL_DIM, zeros). */
void repl_create_table(kb_cluster_t *c);

/* Row i: its key "key-I" into name and its value into v (REPL_DIM floats). */
void repl_row(int i, char *name, size_t len, float *v);

/* Puts row i with version i + 1: kb_cluster_put's result. */
int repl_put(kb_cluster_t *c, int i);

/* 1 when row i is on the server with its value and version (looked up without creating it), 0 when not, -1
 * when the lookup failed. */
int repl_lookup_row(kb_cluster_t *c, int i);

/* repl_lookup_row that must not fail: whether row i is there. */
bool repl_has(kb_cluster_t *c, int i);

/* Waits up to 10 s for rows 0..n-1 to be on the server behind c. */
void repl_expect_rows(kb_cluster_t *c, int n);

/* Fresh data directories for p and f; p starts as a primary with --min-replicas K and f as its follower,
 * each with the extra arguments (NULL-terminated lists, or NULL). */
void repl_start_pair(test_server_t *p, test_server_t *f, const char *min_replicas, const char *const *primary_args,
                     const char *const *follower_args);

#endif
