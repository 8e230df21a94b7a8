/* cmocka fixtures over server_harness (see server_fixture.h). */
#include "server_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

int server_fixture_setup(void **state)
{
    const kb_client_options_t *prestate = *state;
    server_fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    test_server_init(&f->srv);
    f->client_options = prestate ? *prestate : (kb_client_options_t){.timeout_ms = 5000, .retries = 2};
    *state = f;
    return 0;
}

int server_fixture_setup_server(void **state, const char *const *args)
{
    if (server_fixture_setup(state) != 0)
        return -1;
    server_fixture_t *f = *state;
    return test_server_start(&f->srv, args) == 0 ? 0 : -1;
}

int server_fixture_connect(server_fixture_t *f)
{
    f->client = kb_client_new(f->srv.endpoint, &f->client_options);
    if (!f->client)
        return -1;
    f->cluster = kb_cluster_over(f->client);
    return 0;
}

int server_fixture_setup_started(void **state)
{
    if (server_fixture_setup_server(state, NULL) != 0)
        return -1;
    return server_fixture_connect(*state);
}

int server_fixture_teardown(void **state)
{
    server_fixture_t *f = *state;
    raw_close(&f->raw);
    kb_cluster_destroy(&f->cluster);
    kb_client_destroy(&f->client);
    int status = test_server_cleanup(&f->srv);
    free(f);
    return status == 0 ? 0 : -1;
}

void server_fixture_start(server_fixture_t *f, const char *const *args)
{
    assert_int_equal(test_server_start(&f->srv, args), 0);
    f->client = test_client_connect(f->srv.endpoint, &f->client_options);
    f->cluster = kb_cluster_over(f->client);
}

int server_fixture_stop(server_fixture_t *f, int sig)
{
    kb_cluster_destroy(&f->cluster);
    kb_client_destroy(&f->client);
    return test_server_stop(&f->srv, sig);
}

int server_fixture_restart(server_fixture_t *f, int sig, const char *const *args)
{
    int status = server_fixture_stop(f, sig);
    server_fixture_start(f, args);
    return status;
}

kb_client_t *test_client_connect(const char *endpoint, const kb_client_options_t *opts)
{
    kb_client_t *c = kb_client_new(endpoint, opts);
    assert_non_null(c);
    return c;
}

Carls__Response *test_knn(kb_client_t *c, const char *table, const float *vecs, size_t nvals, const kb_key_t *keys,
                          size_t nkeys, uint32_t k, bool exclude)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Knn q = CARLS__KNN__INIT;
    ProtobufCBinaryData *bk = calloc(nkeys ? nkeys : 1, sizeof *bk);
    for (size_t i = 0; i < nkeys; i++) {
        bk[i].data = (uint8_t *)keys[i].data;
        bk[i].len = keys[i].len;
    }
    q.vectors = (float *)vecs;
    q.n_vectors = nvals;
    q.keys = bk;
    q.n_keys = nkeys;
    q.k = k;
    q.exclude_query = exclude;
    req.table = (char *)table;
    req.op_case = CARLS__REQUEST__OP_KNN;
    req.knn = &q;
    Carls__Response *resp = NULL;
    int rc = kb_client_call(c, &req, &resp);
    free(bk);
    if (rc != 0)
        fail_msg("knn: %s", kb_client_last_error(c));
    return resp;
}

Carls__TableStats test_table_stats(kb_cluster_t *c, const char *table)
{
    Carls__Response *resp = NULL;
    if (kb_cluster_stats(c, 0, table, &resp) != 0)
        fail_msg("stats of %s: %s", table, kb_cluster_last_error(c));
    assert_int_equal(resp->stats->n_tables, 1);
    Carls__TableStats counters = *resp->stats->tables[0];
    counters.name = NULL;
    counters.n_requests = 0;
    counters.requests = NULL;
    carls__response__free_unpacked(resp, NULL);
    return counters;
}

void test_create_table(kb_cluster_t *c, const char *name, const Carls__TableConfig *cfg)
{
    if (kb_cluster_create_table(c, name, cfg, false) != 0)
        fail_msg("create %s: %s", name, kb_cluster_last_error(c));
}
