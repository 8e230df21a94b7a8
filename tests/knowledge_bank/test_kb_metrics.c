/* Observability: the stats answer's per-table fields (bytes, requests and latency by operation, errors) and
 * the Prometheus text that kb-server --metrics-port serves on /metrics. The rendering is checked on a
 * hand-made stats answer (escaping, grouping, latency histograms), then a real server is scraped over HTTP
 * after known traffic: every line must be valid exposition format, the numbers must match what was done, and
 * `promtool check metrics` must accept both pages with no problem (skipped, saying so, without promtool). */
#include "kb_cluster.h"
#include "kb_latency.h"
#include "kb_metrics.h"
#include "test_util.h"
#include "server_fixture.h"
#include "test_proto.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
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

/* ---- a small checker of Prometheus text (exposition format 0.0.4) ---- */

#define MAX_FAMILIES 256

typedef struct {
    char names[MAX_FAMILIES][128];
    size_t n;
} families_t;

static bool s_is_name_char(char c, bool first)
{
    return isalpha((unsigned char)c) || c == '_' || c == ':' || (!first && isdigit((unsigned char)c));
}

/* Checks every line of text; fails the test on the first bad one. Samples must follow a TYPE line of their
 * family (the name, or the name less _count/_sum/_bucket), and each family's TYPE appears once. */
static void s_check_exposition(const char *text)
{
    families_t fam = {.n = 0};
    const char *line = text;
    size_t lines = 0;
    while (*line) {
        const char *end = strchr(line, '\n');
        assert_non_null(end); /* every line ends with a newline, the last one too */
        char buf[1024];
        size_t len = (size_t)(end - line);
        assert_true(len < sizeof buf);
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = end + 1;
        lines++;
        if (strncmp(buf, "# HELP ", 7) == 0)
            continue;
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[128], type[32];
            assert_int_equal(sscanf(buf + 7, "%127s %31s", name, type), 2);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "summary") == 0 || strcmp(type, "histogram") == 0 ||
                        strcmp(type, "untyped") == 0);
            for (size_t i = 0; i < fam.n; i++)
                if (strcmp(fam.names[i], name) == 0)
                    fail_msg("TYPE of %s given twice", name);
            assert_true(fam.n < MAX_FAMILIES);
            strcpy(fam.names[fam.n++], name);
            continue;
        }
        assert_true(buf[0] != '#'); /* no other comments are written */
        /* name */
        size_t i = 0;
        assert_true(s_is_name_char(buf[0], true));
        while (s_is_name_char(buf[i], false))
            i++;
        char name[128];
        assert_true(i < sizeof name);
        memcpy(name, buf, i);
        name[i] = '\0';
        assert_true(fam.n > 0);
        /* the sample belongs to the family declared last */
        const char *family = fam.names[fam.n - 1];
        size_t flen = strlen(family);
        bool suffixed = strncmp(name, family, flen) == 0 &&
                        (strcmp(name + flen, "_bucket") == 0 || strcmp(name + flen, "_sum") == 0 ||
                         strcmp(name + flen, "_count") == 0);
        if (strcmp(name, family) != 0 && !suffixed)
            fail_msg("sample %s outside its family (last TYPE was %s)", name, family);
        /* labels */
        if (buf[i] == '{') {
            i++;
            while (buf[i] != '}') {
                assert_true(s_is_name_char(buf[i], true));
                while (s_is_name_char(buf[i], false))
                    i++;
                assert_int_equal(buf[i++], '=');
                assert_int_equal(buf[i++], '"');
                while (buf[i] != '"') {
                    assert_true(buf[i] != '\0');
                    if (buf[i] == '\\') {
                        i++;
                        assert_true(buf[i] == '\\' || buf[i] == '"' || buf[i] == 'n');
                    }
                    i++;
                }
                i++;
                if (buf[i] == ',')
                    i++;
                else
                    assert_int_equal(buf[i], '}');
            }
            i++;
        }
        assert_int_equal(buf[i++], ' ');
        char *vend;
        double v = strtod(buf + i, &vend);
        if (vend == buf + i || *vend != '\0')
            fail_msg("bad value in line '%s'", buf);
        assert_false(isnan(v));
    }
    assert_true(lines > 10);
}

/* The value of the sample whose line starts with "prefix " (name and labels exactly), or NAN. */
static double s_value(const char *text, const char *prefix)
{
    size_t plen = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, prefix, plen) == 0 && p[plen] == ' ')
            return strtod(p + plen + 1, NULL);
    }
    return NAN;
}

/* A sample the exposition must hold, with exactly this value. */
typedef struct {
    const char *sample;
    double value;
} s_sample_t;

static void s_expect_samples(const char *text, const s_sample_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double got = s_value(text, want[i].sample);
        if (got != want[i].value)
            fail_msg("%s is %g, want %g", want[i].sample, got, want[i].value);
    }
}

/* ---- rendering ---- */

static void test_render_escapes_and_groups(void **state)
{
    (void)state;
    Carls__StatsResult st = CARLS__STATS_RESULT__INIT;
    st.durability = "we\"ird\\mode\n";
    st.threads = 3;
    st.requests = 42;
    st.uptime_ms = 1500;
    Carls__TableStats t1 = CARLS__TABLE_STATS__INIT, t2 = CARLS__TABLE_STATS__INIT;
    t1.name = "alpha";
    t1.rows = 7;
    t1.knn_ready = true;
    t2.name = "beta.v2";
    t2.rows = 9;
    t2.pending_gradients = 4;
    Carls__LatencySummary l = CARLS__LATENCY_SUMMARY__INIT;
    l.op = "lookup";
    l.count = 5;
    l.p50_us = 120;
    l.p99_us = 900;
    l.max_us = 1000;
    uint64_t le[KB_LATENCY_LE_BUCKETS];
    for (int i = 0; i < KB_LATENCY_LE_BUCKETS; i++)
        le[i] = i < 7 ? 0 : i < 10 ? 4 : 5; /* 4 requests of at most 128 us (2^7), 1 of at most 1024 us */
    l.le_counts = le;
    l.n_le_counts = KB_LATENCY_LE_BUCKETS;
    l.sum_us = 1300;
    Carls__LatencySummary *lp = &l;
    t1.requests = &lp;
    t1.n_requests = 1;
    st.latency = &lp;
    st.n_latency = 1;
    Carls__TableStats *tables[2] = {&t1, &t2};
    st.tables = tables;
    st.n_tables = 2;

    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kb_metrics_render(&st, &text, &len), 0);
    assert_int_equal(strlen(text), len);
    s_check_exposition(text);
    assert_non_null(strstr(text, "carls_bank_info{durability=\"we\\\"ird\\\\mode\\n\",threads=\"3\"} 1\n"));
    static const s_sample_t rendered[] = {
        {"carls_bank_requests_total", 42},
        {"carls_bank_uptime_seconds", 1.5},
        {"carls_bank_table_rows{table=\"alpha\"}", 7},
        {"carls_bank_table_rows{table=\"beta.v2\"}", 9},
        {"carls_bank_table_pending_gradients{table=\"beta.v2\"}", 4},
        {"carls_bank_table_index_ready{table=\"alpha\"}", 1},
        {"carls_bank_table_requests_total{table=\"alpha\",op=\"lookup\"}", 5},
    };
    s_expect_samples(text, rendered, sizeof rendered / sizeof rendered[0]);
    static const s_sample_t histogram[] = {
        {"carls_bank_table_request_duration_seconds_bucket{table=\"alpha\",op=\"lookup\",le=\"6.4e-05\"}", 0},
        {"carls_bank_table_request_duration_seconds_bucket{table=\"alpha\",op=\"lookup\",le=\"0.000128\"}", 4},
        {"carls_bank_table_request_duration_seconds_bucket{table=\"alpha\",op=\"lookup\",le=\"0.001024\"}", 5},
        {"carls_bank_table_request_duration_seconds_bucket{table=\"alpha\",op=\"lookup\",le=\"+Inf\"}", 5},
        {"carls_bank_table_request_duration_seconds_count{table=\"alpha\",op=\"lookup\"}", 5},
        {"carls_bank_request_duration_seconds_bucket{op=\"lookup\",le=\"0.000128\"}", 4},
        {"carls_bank_request_duration_seconds_count{op=\"lookup\"}", 5},
        {"carls_bank_op_requests_total{op=\"lookup\"}", 5},
        {"carls_bank_request_duration_max_seconds{op=\"lookup\"}", 1000e-6},
    };
    s_expect_samples(text, histogram, sizeof histogram / sizeof histogram[0]);
    assert_true(fabs(s_value(text, "carls_bank_request_duration_seconds_sum{op=\"lookup\"}") - 1300e-6) < 1e-12);
    assert_null(strstr(text, "quantile="));
    char problems[4096];
    int rc = test_promtool_check(text, problems, sizeof problems);
    free(text);
    if (rc == 77)
        skip(); /* the rest was checked; only promtool's lint is missing */
    if (rc != 0)
        fail_msg("promtool check metrics refused the rendered page:\n%s", problems);
}

/* ---- a real server ---- */

/* test_http, which must answer. */
static char *s_http(uint16_t port, const char *method, const char *path)
{
    char *answer = test_http(port, method, path);
    assert_non_null(answer);
    return answer;
}

/* The metrics port the server logged ("metrics: http://127.0.0.1:PORT/metrics"). */
static uint16_t s_logged_port(const test_server_t *srv)
{
    uint16_t port = test_logged_metrics_port(srv->log_file);
    assert_true(port > 0);
    return port;
}

static void test_scrape_real_server(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--metrics-port", "0", "--durability", "interval:50", NULL};
    assert_int_equal(test_server_start(&f->srv, args), 0);
    uint16_t port = s_logged_port(&f->srv);

    kb_client_options_t opts = {.timeout_ms = 10000, .retries = 1};
    f->client = kb_client_new(f->srv.endpoint, &opts);
    assert_non_null(f->client);
    kb_cluster_t *c = f->cluster = kb_cluster_over(f->client);
    Carls__KnnConfig knn;
    Carls__TableConfig cfg = test_knn_table_config(&knn, 4, "Flat", CARLS__KNN_METRIC__METRIC_IP);
    assert_int_equal(kb_cluster_create_table(c, "emb", &cfg, false), 0);
    kb_key_t keys[3] = {{"a", 1}, {"b", 1}, {"c", 1}};
    float vals[12] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
    assert_int_equal(kb_cluster_put(c, "emb", keys, 3, 4, vals, 1), 0);
    float out[12];
    assert_int_equal(kb_cluster_lookup(c, "emb", keys, 3, 4, out, NULL), 0);
    assert_int_equal(kb_cluster_lookup(c, "emb", keys, 2, 4, out, NULL), 0);
    float grads[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    assert_int_equal(kb_cluster_push_gradients(c, "emb", keys, 2, 4, grads), 0);
    /* an error on the table: wrong dimension */
    assert_int_equal(kb_cluster_put(c, "emb", keys, 2, 4, vals, 1), 0);
    float bad[3] = {1, 2, 3};
    assert_int_equal(kb_cluster_push_gradients(c, "emb", keys, 1, 3, bad), KB_CLIENT_ESTATUS);
    /* a request naming a table that does not exist is not counted per table */
    assert_int_equal(kb_cluster_lookup(c, "nosuch", keys, 1, 4, out, NULL), KB_CLIENT_ESTATUS);
    /* a knn request brings the index up to date with every put */
    carls__response__free_unpacked(test_knn(f->client, "emb", NULL, 0, &keys[0], 1, 2, false), NULL);

    /* stats over the protocol carries the new per-table fields */
    Carls__Response *resp = NULL;
    assert_int_equal(kb_cluster_stats(c, 0, "", &resp), 0);
    Carls__StatsResult *st = resp->stats;
    assert_int_equal(st->n_tables, 1);
    Carls__TableStats *t = st->tables[0];
    assert_string_equal(t->name, "emb");
    assert_int_equal(t->rows, 3);
    assert_true(t->bytes >= 3 * 4 * sizeof(float) * 2); /* values plus the index copy at least */
    assert_int_equal(t->request_errors, 1);
    uint64_t lookups = 0, puts = 0, pushes = 0, creates = 0;
    for (size_t i = 0; i < t->n_requests; i++) {
        const Carls__LatencySummary *l = t->requests[i];
        assert_true(l->p50_us > 0 && l->p99_us >= l->p50_us);
        if (strcmp(l->op, "lookup") == 0)
            lookups = l->count;
        else if (strcmp(l->op, "put") == 0)
            puts = l->count;
        else if (strcmp(l->op, "push_gradients") == 0)
            pushes = l->count;
        else if (strcmp(l->op, "create_table") == 0)
            creates = l->count;
    }
    assert_int_equal(lookups, 2);
    assert_int_equal(puts, 2);
    assert_int_equal(pushes, 2);
    assert_int_equal(creates, 1);
    carls__response__free_unpacked(resp, NULL);

    char *answer = s_http(port, "GET", "/metrics");
    assert_true(strncmp(answer, "HTTP/1.", 7) == 0);
    assert_non_null(strstr(answer, " 200 "));
    assert_non_null(strstr(answer, "text/plain; version=0.0.4"));
    const char *body = strstr(answer, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    s_check_exposition(body);
    static const s_sample_t scraped[] = {
        {"carls_bank_table_rows{table=\"emb\"}", 3},
        {"carls_bank_table_dim{table=\"emb\"}", 4},
        {"carls_bank_table_requests_total{table=\"emb\",op=\"lookup\"}", 2},
        {"carls_bank_table_requests_total{table=\"emb\",op=\"push_gradients\"}", 2},
        {"carls_bank_table_request_errors_total{table=\"emb\"}", 1},
        {"carls_bank_table_keys_looked_up_total{table=\"emb\"}", 5},
        {"carls_bank_table_rows_put_total{table=\"emb\"}", 5},
        {"carls_bank_table_gradients_received_total{table=\"emb\"}", 2},
        {"carls_bank_table_index_vectors{table=\"emb\"}", 3},
    };
    s_expect_samples(body, scraped, sizeof scraped / sizeof scraped[0]);
    assert_true(s_value(body, "carls_bank_table_bytes{table=\"emb\"}") >= 96);
    static const char *const present[] = {
        "carls_bank_table_pending_gradients{table=\"emb\"}", "carls_bank_table_outliers_dropped_total{table=\"emb\"}",
        "carls_bank_table_evictions_total{table=\"emb\"}",   "carls_bank_table_not_admitted_total{table=\"emb\"}",
        "carls_bank_table_index_pending{table=\"emb\"}",
    };
    for (size_t i = 0; i < sizeof present / sizeof present[0]; i++)
        if (isnan(s_value(body, present[i])))
            fail_msg("no sample %s", present[i]);
    assert_true(s_value(body, "carls_bank_table_request_duration_max_seconds{table=\"emb\",op=\"lookup\"}") > 0);
    assert_true(s_value(body, "carls_bank_op_requests_total{op=\"stats\"}") == 1);
    assert_true(s_value(body, "carls_bank_request_errors_total") == 2);
    assert_true(isnan(s_value(body, "carls_bank_table_rows{table=\"nosuch\"}")));
    assert_null(strstr(body, "nosuch"));
    assert_non_null(strstr(body, "carls_bank_info{durability=\"interval:50\",threads=\"2\"} 1\n"));
    char problems[4096];
    int lint = test_promtool_check(body, problems, sizeof problems);
    if (lint == 77)
        print_message("SKIPPED promtool check metrics on the server's page: %s\n", problems);
    else if (lint != 0)
        fail_msg("promtool check metrics refused the server's page:\n%s", problems);
    free(answer);

    answer = s_http(port, "HEAD", "/metrics");
    assert_non_null(strstr(answer, " 200 "));
    free(answer);
    answer = s_http(port, "GET", "/");
    assert_non_null(strstr(answer, " 404 "));
    free(answer);
    answer = s_http(port, "POST", "/metrics");
    assert_non_null(strstr(answer, " 405 "));
    free(answer);
    /* the server still serves the protocol and scrapes */
    assert_int_equal(kb_cluster_lookup(c, "emb", keys, 1, 4, out, NULL), 0);
    answer = s_http(port, "GET", "/metrics");
    assert_non_null(strstr(answer, " 200 "));
    free(answer);
}

static void test_metrics_port_in_use_fails(void **state)
{
    server_fixture_t *f = *state;
    /* Hold a port, then ask a server for it: it must refuse to start rather than run without metrics. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t alen = sizeof addr;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &alen), 0);
    char port[16];
    snprintf(port, sizeof port, "%u", ntohs(addr.sin_port));
    const char *args[] = {"--metrics-port", port, NULL};
    int rc = test_server_start(&f->srv, args);
    close(fd);
    assert_int_not_equal(rc, 0);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_render_escapes_and_groups),
    SERVER_FIXTURE_TEST(test_scrape_real_server, NULL),
    SERVER_FIXTURE_TEST(test_metrics_port_in_use_fails, NULL))
