/* Integration (fault): a partitioned primary never acknowledges a write once its follower is promoted
 * (docs/REPLICATION.md sections 4 and 7, K = 1), with real kb-server processes on loopback.
 *
 * The follower reaches its primary only through TCP relays (tests/lib/tcp_relay.h): the replication stream
 * (the primary advertises the relay's port, --replication-advertise) and its question to the client
 * endpoint. The relays are cut, a partition and not a crash: connections go silent, nothing is closed. The
 * test, as the coordinator, fences the follower with term 2 and promotes it (the old primary cannot be
 * reached by a real coordinator on the other side, so it is not fenced). A client pinned to the old primary,
 * which still believes it is primary, writes for 7 s: no answer may be OK, only NOT_PRIMARY, UNAVAILABLE, a
 * commit timeout (INTERNAL "not committed") or no answer; and none of those writes may be on the new primary.
 * Twice: with --min-replicas 1 (nobody acks for it any more), and with --min-replicas 0 and --lease-ms 500
 * (its lease runs out 500 ms after the cut; the coordinator waits 1.1 times that after the fence before it
 * promotes, as docs/REPLICATION.md section 4 says). */
#include "protocol.h"
#include "raw_client.h"
#include "replica_testlib.h"
#include "server_harness.h"
#include "tcp_relay.h"
#include "test_proto.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

#define S_WRITE_MS 7000 /* past the 3 + 2 s after which a primary short of followers refuses */
#define S_FIRST_ROW 1000 /* the pinned client's rows: S_FIRST_ROW + i */

/* A port free on loopback a moment ago (the server that binds it is started again if another took it). */
static uint16_t s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &len), 0);
    close(fd);
    return ntohs(addr.sin_port);
}

static uint16_t s_port_of(const char *endpoint)
{
    return (uint16_t)atoi(strrchr(endpoint, ':') + 1);
}

/* Sends the pinned client's put of row S_FIRST_ROW + i (client 4242, sequence and request id i + 1). */
static void s_send_put(raw_client_t *rc, int i)
{
    char name[32];
    float v[REPL_DIM];
    repl_row(S_FIRST_ROW + i, name, sizeof name, v);
    ProtobufCBinaryData key = {strlen(name), (uint8_t *)name};
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Put put = CARLS__PUT__INIT;
    test_request_envelope(&req, "t", (uint64_t)i + 1, 4242, (uint64_t)i + 1);
    test_put_request(&req, &put, &key, 1, v, REPL_DIM);
    size_t len = carls__request__get_packed_size(&req);
    uint8_t buf[256];
    assert_true(len <= sizeof buf);
    carls__request__pack(&req, buf);
    assert_int_equal(raw_send(rc, buf, len), 0);
}

/* What the pinned client's writes got. */
typedef struct {
    int sent, ok, not_primary, unavailable, not_committed, other;
    char first_ok[256], first_other[256];
} s_tally_t;

/* Takes the answers that come within ms. */
static void s_drain(raw_client_t *rc, int ms, s_tally_t *t)
{
    for (int64_t until = carls_monotonic_ms() + ms; carls_monotonic_ms() < until;) {
        Carls__Response *r = raw_recv(rc, 50);
        if (!r)
            continue;
        switch (r->status) {
        case CARLS__STATUS_CODE__STATUS_OK:
            if (t->ok++ == 0)
                snprintf(t->first_ok, sizeof t->first_ok, "request %llu, epoch %llu, term %llu",
                         (unsigned long long)r->request_id, (unsigned long long)r->epoch,
                         (unsigned long long)r->term);
            break;
        case CARLS__STATUS_CODE__STATUS_NOT_PRIMARY:
            t->not_primary++;
            break;
        case CARLS__STATUS_CODE__STATUS_UNAVAILABLE:
            t->unavailable++;
            break;
        case CARLS__STATUS_CODE__STATUS_INTERNAL: /* the commit timeout: applied here, never acknowledged */
            if (strstr(r->error, "not committed") || strstr(r->error, "replicated")) {
                t->not_committed++;
                break;
            }
            /* fall through */
        default:
            if (t->other++ == 0)
                snprintf(t->first_other, sizeof t->first_other, "%s: %s", carls_status_name(r->status), r->error);
        }
        carls__response__free_unpacked(r, NULL);
    }
}

/* One partition: the primary runs with --min-replicas k and --lease-ms lease_ms (0: none). */
static void s_partition(int k, int lease_ms)
{
    test_server_t p, f;
    test_server_init(&p);
    test_server_init(&f);
    tcp_relay_t *stream = tcp_relay_new(0);
    assert_non_null(stream);
    char listen[64], advertise[64];
    snprintf(advertise, sizeof advertise, "tcp://127.0.0.1:%u", tcp_relay_port(stream));
    int started = -1;
    for (int attempt = 0; attempt < 5 && started != 0; attempt++) {
        snprintf(listen, sizeof listen, "tcp://127.0.0.1:%u", s_free_port());
        char k_text[16], lease_text[16];
        snprintf(k_text, sizeof k_text, "%d", k);
        snprintf(lease_text, sizeof lease_text, "%d", lease_ms);
        const char *pargs[] = {"--min-replicas", k_text, "--lease-ms", lease_text, "--replication-listen", listen,
                               "--replication-advertise", advertise, "--commit-timeout-ms", "1000", NULL};
        started = test_server_start(&p, pargs);
    }
    assert_int_equal(started, 0);
    tcp_relay_set_target(stream, s_port_of(listen));
    tcp_relay_t *question = tcp_relay_new(s_port_of(p.endpoint));
    assert_non_null(question);
    char via[64];
    snprintf(via, sizeof via, "tcp://127.0.0.1:%u", tcp_relay_port(question));
    const char *fargs[] = {"--replica-of", via, NULL};
    assert_int_equal(test_server_start(&f, fargs), 0);

    kb_cluster_t *cp = repl_client(p.endpoint, 10000), *cf = repl_client(f.endpoint, 10000);
    if (lease_ms) { /* a leased primary takes no write before its follower has answered (UNAVAILABLE) */
        Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
        cfg.dim = REPL_DIM;
        cfg.init = CARLS__INIT_KIND__INIT_ZEROS;
        int rc = -1;
        for (int64_t until = carls_monotonic_ms() + 10000; rc != 0 && carls_monotonic_ms() < until; usleep(50000))
            rc = kb_cluster_create_table(cp, "t", &cfg, true); /* an attempt that timed out may have made it */
        if (rc != 0)
            fail_msg("create table t on the leased primary: %s", kb_cluster_last_error(cp));
    } else {
        repl_create_table(cp);
    }
    for (int i = 0; i < 50; i++) /* acknowledged once the follower has them, through the relay */
        assert_int_equal(repl_put(cp, i), 0);
    for (int i = 0; i < 50; i++)
        assert_true(repl_has(cf, i));
    assert_true(tcp_relay_bytes(stream) > 0);
    kb_cluster_destroy(&cp);

    /* The partition; the coordinator fences the follower and promotes it with the same new term. */
    tcp_relay_cut(stream, true);
    tcp_relay_cut(question, true);
    repl_op_ok(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_FENCE, 2, 0);
    if (lease_ms) /* the coordinator cannot reach the old primary: it waits out its lease (section 4) */
        usleep((useconds_t)lease_ms * 1100);
    repl_op_ok(f.endpoint, CARLS__REPLICA_ACTION__REPLICA_PROMOTE, 2, 0);
    repl_expect_role(f.endpoint, "primary", 2);

    /* The pinned client writes to the old primary, which never heard of term 2. */
    raw_client_t rc;
    assert_int_equal(raw_open(&rc, p.endpoint), 0);
    s_tally_t t = {0};
    for (int64_t until = carls_monotonic_ms() + S_WRITE_MS; carls_monotonic_ms() < until; t.sent++) {
        s_send_put(&rc, t.sent);
        s_drain(&rc, 100, &t);
    }
    s_drain(&rc, 2000, &t);
    raw_close(&rc);
    int answered = t.ok + t.not_primary + t.unavailable + t.not_committed + t.other;
    print_message("%d writes to the partitioned primary: %d OK, %d NOT_PRIMARY, %d UNAVAILABLE, %d not committed "
                  "(commit timeout), %d other, %d unanswered\n", t.sent, t.ok, t.not_primary, t.unavailable,
                  t.not_committed, t.other, t.sent - answered);
    if (t.ok)
        fail_msg("the partitioned old primary acknowledged %d writes after the promotion (the first: %s)", t.ok,
                 t.first_ok);
    if (t.other)
        fail_msg("%d writes answered otherwise: %s", t.other, t.first_other);
    assert_true(t.sent > 10 && t.unavailable > 0); /* it noticed it is short of followers */

    /* None of them is on the new primary, which takes writes of its own. */
    for (int i = 0; i < t.sent; i++)
        if (repl_has(cf, S_FIRST_ROW + i))
            fail_msg("the pinned client's write %d is on the new primary", i);
    assert_int_equal(repl_put(cf, 60), 0);
    repl_expect_rows(cf, 50);
    kb_cluster_destroy(&cf);
    tcp_relay_destroy(&question);
    tcp_relay_destroy(&stream);
    assert_int_equal(test_server_cleanup(&f), 0);
    assert_int_equal(test_server_cleanup(&p), 0);
}

static void test_partitioned_primary_never_acknowledges(void **state)
{
    (void)state;
    s_partition(1, 0); /* K = 1: no follower of its term acknowledges */
}

static void test_partitioned_leased_primary_never_acknowledges(void **state)
{
    (void)state;
    s_partition(0, 500); /* K = 0: its lease runs out 500 ms after the cut */
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_partitioned_primary_never_acknowledges),
    cmocka_unit_test(test_partitioned_leased_primary_never_acknowledges))
