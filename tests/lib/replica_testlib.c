#include "replica_testlib.h"

#include "protocol.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

Carls__Response *repl_op(raw_client_t *rc, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Replica op = CARLS__REPLICA__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 42;
    op.action = action;
    op.term = term;
    op.min_replicas = min_replicas;
    req.op_case = CARLS__REQUEST__OP_REPLICA;
    req.replica = &op;
    return raw_call(rc, &req, 10000);
}

Carls__Response *repl_op_at(const char *endpoint, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas)
{
    raw_client_t rc;
    assert_int_equal(raw_open(&rc, endpoint), 0);
    Carls__Response *resp = repl_op(&rc, action, term, min_replicas);
    raw_close(&rc);
    if (!resp)
        fail_msg("replica op %d on %s: no answer in 10 s", (int)action, endpoint);
    return resp;
}

void repl_op_ok(const char *endpoint, Carls__ReplicaAction action, uint64_t term, uint32_t min_replicas)
{
    Carls__Response *r = repl_op_at(endpoint, action, term, min_replicas);
    if (r->status != CARLS__STATUS_CODE__STATUS_OK)
        fail_msg("replica op %d on %s (term %llu): %s", (int)action, endpoint, (unsigned long long)term, r->error);
    carls__response__free_unpacked(r, NULL);
}

Carls__Response *repl_status(const char *endpoint)
{
    Carls__Response *r = repl_op_at(endpoint, CARLS__REPLICA_ACTION__REPLICA_STATUS, 0, 0);
    assert_int_equal(r->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_int_equal(r->result_case, CARLS__RESPONSE__RESULT_REPLICA);
    return r;
}

void repl_expect_role(const char *endpoint, const char *role, uint64_t term)
{
    Carls__Response *r = repl_status(endpoint);
    if (strcmp(r->replica->role, role) != 0 || r->replica->term != term)
        fail_msg("%s is a %s of term %llu; expected a %s of term %llu", endpoint, r->replica->role,
                 (unsigned long long)r->replica->term, role, (unsigned long long)term);
    assert_int_equal(r->term, term); /* every reply carries it */
    carls__response__free_unpacked(r, NULL);
}

kb_cluster_t *repl_client(const char *endpoint, int timeout_ms)
{
    kb_client_options_t opts = {.timeout_ms = timeout_ms, .retries = 0};
    kb_cluster_t *c = kb_cluster_new(endpoint, &opts);
    assert_non_null(c);
    return c;
}

void repl_create_table(kb_cluster_t *c)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = REPL_DIM;
    cfg.init = CARLS__INIT_KIND__INIT_ZEROS;
    if (kb_cluster_create_table(c, "t", &cfg, false) != 0)
        fail_msg("create table t: %s", kb_cluster_last_error(c));
}

void repl_row(int i, char *name, size_t len, float *v)
{
    snprintf(name, len, "key-%d", i);
    for (int j = 0; j < REPL_DIM; j++)
        v[j] = (float)i + (float)j / 8.0f;
}

int repl_put(kb_cluster_t *c, int i)
{
    char name[32];
    float v[REPL_DIM];
    repl_row(i, name, sizeof name, v);
    kb_key_t k = {name, strlen(name)};
    return kb_cluster_put(c, "t", &k, 1, REPL_DIM, v, (uint64_t)i + 1);
}

int repl_lookup_row(kb_cluster_t *c, int i)
{
    char name[32];
    float want[REPL_DIM], got[REPL_DIM];
    repl_row(i, name, sizeof name, want);
    kb_key_t k = {name, strlen(name)};
    kb_row_meta_t meta;
    if (kb_cluster_lookup_ex(c, "t", &k, 1, REPL_DIM, true, got, &meta) != 0)
        return -1;
    return memcmp(got, want, sizeof want) == 0 && meta.version == (uint64_t)i + 1;
}

bool repl_has(kb_cluster_t *c, int i)
{
    int rc = repl_lookup_row(c, i);
    if (rc < 0)
        fail_msg("lookup of row %d: %s", i, kb_cluster_last_error(c));
    return rc == 1;
}

void repl_expect_rows(kb_cluster_t *c, int n)
{
    int64_t deadline = carls_monotonic_ms() + 10000;
    int missing = 0;
    do {
        missing = 0;
        for (int i = 0; i < n; i++) /* a follower restarting on a snapshot answers nothing for a moment */
            missing += repl_lookup_row(c, i) != 1;
        if (missing == 0)
            return;
        usleep(50 * 1000);
    } while (carls_monotonic_ms() < deadline);
    fail_msg("%d of %d rows missing or different after 10 s", missing, n);
}

/* args, then extra (both NULL-terminated, extra may be NULL) into out (max entries with the NULL). */
static void s_join(const char *const *args, const char *const *extra, const char **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; args[i] && n + 1 < max; i++)
        out[n++] = args[i];
    for (size_t i = 0; extra && extra[i] && n + 1 < max; i++)
        out[n++] = extra[i];
    out[n] = NULL;
}

void repl_start_pair(test_server_t *p, test_server_t *f, const char *min_replicas, const char *const *primary_args,
                     const char *const *follower_args)
{
    test_server_init(p);
    test_server_init(f);
    const char *argv[48];
    const char *pbase[] = {"--min-replicas", min_replicas, NULL};
    s_join(pbase, primary_args, argv, 48);
    assert_int_equal(test_server_start(p, argv), 0);
    const char *fbase[] = {"--replica-of", p->endpoint, NULL};
    s_join(fbase, follower_args, argv, 48);
    assert_int_equal(test_server_start(f, argv), 0);
}
