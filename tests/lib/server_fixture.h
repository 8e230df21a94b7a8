/* cmocka fixtures over server_harness: one real kb-server and one client of it per test, cleaned up by the
 * teardown even when an assertion failed (a server left running would keep the test's output pipe open). */
#ifndef CARLS_SERVER_FIXTURE_H
#define CARLS_SERVER_FIXTURE_H

#include "kb_client.h"
#include "kb_cluster.h"
#include "raw_client.h"
#include "server_harness.h"

typedef struct {
    test_server_t srv;
    kb_client_t *client;                /* connected by server_fixture_start; NULL while stopped */
    kb_cluster_t *cluster;              /* the requests over client (kb_cluster_over), or a cluster of the
                                         * test's own (client NULL then); NULL while stopped */
    kb_client_options_t client_options; /* how server_fixture_start connects */
    raw_client_t raw;                   /* for the test to open when it sends raw frames; closed by the teardown */
} server_fixture_t;

/* cmocka setup: a fixture (*state) with a fresh data directory and no server yet. The client options are
 * the test's prestate (a kb_client_options_t *, cmocka_unit_test_prestate_setup_teardown) or, without
 * one, a 5 s timeout and 2 retries. */
int server_fixture_setup(void **state);

/* For a cmocka setup of tests that bring their own clients: server_fixture_setup, then a server started with
 * extra args (or NULL) and no client. Returns 0, or -1 when the server did not start. */
int server_fixture_setup_server(void **state, const char *const *args);

/* Connects f->client (with f->client_options) to the running server and makes f->cluster over it; for a cmocka
 * setup (nothing asserted). Returns 0, or -1 when the client could not be made. */
int server_fixture_connect(server_fixture_t *f);

/* server_fixture_setup, then a server started with no extra arguments and a client connected. */
int server_fixture_setup_started(void **state);

/* A cmocka test entry for test on a fixture: fresh (SERVER_FIXTURE_TEST) or with a server started and a client
 * connected (SERVER_FIXTURE_TEST_STARTED); opts is the client options' prestate, or NULL for the defaults. */
#define SERVER_FIXTURE_TEST(test, opts)                                                                       \
    cmocka_unit_test_prestate_setup_teardown(test, server_fixture_setup, server_fixture_teardown, opts)
#define SERVER_FIXTURE_TEST_STARTED(test, opts)                                                               \
    cmocka_unit_test_prestate_setup_teardown(test, server_fixture_setup_started, server_fixture_teardown, opts)

/* cmocka teardown: closes the raw client, destroys the client, stops the server with SIGTERM and removes the
 * data directory; fails unless the server exited with status 0 (under the sanitizers a leak fails it). */
int server_fixture_teardown(void **state);

/* Starts the server with extra args (NULL-terminated, or NULL) and connects f->client (and f->cluster over
 * it); asserts both. */
void server_fixture_start(server_fixture_t *f, const char *const *args);

/* Destroys the cluster and the client and stops the server with sig; returns the server's exit status (128+signal). */
int server_fixture_stop(server_fixture_t *f, int sig);

/* server_fixture_stop, then server_fixture_start with args; returns the stopped server's exit status. */
int server_fixture_restart(server_fixture_t *f, int sig, const char *const *args);

/* A client of endpoint (asserted non-NULL). */
kb_client_t *test_client_connect(const char *endpoint, const kb_client_options_t *opts);

/* Asks c for the k nearest neighbours in table of nvals/dim query vectors vecs, or of the rows of nkeys
 * keys (excluding each key itself when exclude); fails the test when the call fails. Caller frees the reply. */
Carls__Response *test_knn(kb_client_t *c, const char *table, const float *vecs, size_t nvals, const kb_key_t *keys,
                          size_t nkeys, uint32_t k, bool exclude);

/* The stats of table through c's shard 0 (failing the test when the call fails): its counters only, the name
 * and the latency list going with the reply. */
Carls__TableStats test_table_stats(kb_cluster_t *c, const char *table);

/* Creates table name with cfg through c, failing the test with the cluster's error otherwise. */
void test_create_table(kb_cluster_t *c, const char *name, const Carls__TableConfig *cfg);

#endif
