/* Tests of the kbctl program: runs build/bin/kbctl against the fake server and checks its exit status,
 * stdout, stderr and the requests the server received (usage errors, input validation before sending,
 * batching, output formats, server errors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_kb_server.h"
#include "protocol.h"

extern char **environ;

#define KBCTL CARLS_BIN_DIR "/kbctl"

typedef struct {
    int status; /* exit status, or -1 if it did not exit normally */
    char *out;  /* everything it wrote to stdout */
    char *err;  /* ... and to stderr */
} s_run_t;

static char *s_read_file(int fd)
{
    off_t len = lseek(fd, 0, SEEK_END);
    assert_true(len >= 0);
    char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)len, 0), len);
    buf[len] = '\0';
    return buf;
}

static int s_temp_file(void)
{
    char path[] = "/tmp/test_kbctl_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    return fd;
}

/* Runs kbctl with args (NULL-terminated, without argv[0]) and stdin_text on stdin. The environment is this
 * process's without CARLS_KB and CARLS_LOG_LEVEL, plus CARLS_KB=env_kb when env_kb is not NULL. */
static s_run_t s_kbctl_run(const char *env_kb, const char *stdin_text, const char *const *args)
{
    const char *argv[64] = {"kbctl"};
    size_t argc = 1;
    for (; args[argc - 1]; argc++) {
        assert_true(argc < 63);
        argv[argc] = args[argc - 1];
    }
    argv[argc] = NULL;

    /* Built before fork: the child of a threaded process may only exec. */
    size_t n_env = 0;
    while (environ[n_env])
        n_env++;
    char **envp = calloc(n_env + 2, sizeof *envp);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "CARLS_KB=", 9) != 0 && strncmp(environ[i], "CARLS_LOG_LEVEL=", 16) != 0)
            envp[k++] = environ[i];
    char env_kb_buf[256];
    if (env_kb) {
        snprintf(env_kb_buf, sizeof env_kb_buf, "CARLS_KB=%s", env_kb);
        envp[k++] = env_kb_buf;
    }
    envp[k] = NULL;

    int in = s_temp_file(), out = s_temp_file(), err = s_temp_file();
    if (stdin_text) {
        size_t len = strlen(stdin_text);
        assert_int_equal(write(in, stdin_text, len), (ssize_t)len);
        lseek(in, 0, SEEK_SET);
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        execve(KBCTL, (char *const *)argv, envp);
        _exit(127);
    }
    int wstatus = 0;
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    s_run_t r = {WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1, s_read_file(out), s_read_file(err)};
    close(in);
    close(out);
    close(err);
    free(envp);
    return r;
}

static void s_run_free(s_run_t *r)
{
    free(r->out);
    free(r->err);
}

/* s_kbctl_run, failing with kbctl's output shown when its exit status is not want_status. */
static s_run_t s_kbctl(int want_status, const char *env_kb, const char *stdin_text, const char *const *args)
{
    s_run_t r = s_kbctl_run(env_kb, stdin_text, args);
    if (r.status != want_status) {
        print_error("kbctl exited %d, want %d; stdout:\n%s\nstderr:\n%s\n", r.status, want_status, r.out, r.err);
        fail();
    }
    return r;
}

/* The i-th request the fake received, asserted to be of kind op. Caller frees. */
static Carls__Request *s_request_of(fake_kb_server_t *srv, size_t i, Carls__Request__OpCase op)
{
    Carls__Request *q = fake_kb_server_request(srv, i);
    assert_int_equal(q->op_case, op);
    return q;
}

/* cmocka setup and teardown of the tests that talk to a fake server (*state) with tables emb and words; the
 * teardown stops it even when an assertion failed. */
static int s_server_setup(void **state)
{
    fake_kb_server_t *srv = fake_kb_server_new();
    fake_kb_server_add_table(srv, "emb", 3, 10);
    fake_kb_server_add_table(srv, "words", 2, 5);
    *state = srv;
    return 0;
}

static int s_server_teardown(void **state)
{
    fake_kb_server_t *srv = *state;
    fake_kb_server_destroy(&srv);
    return 0;
}

/* A test entry that runs against the fake server. */
#define S_SERVER_TEST(test) cmocka_unit_test_setup_teardown(test, s_server_setup, s_server_teardown)

static void test_usage_errors(void **state)
{
    (void)state;
    s_run_t r = s_kbctl(1, NULL, NULL, (const char *[]){NULL});
    assert_non_null(strstr(r.err, "usage: kbctl"));
    s_run_free(&r);

    r = s_kbctl(0, NULL, NULL, (const char *[]){"--help", NULL});
    assert_non_null(strstr(r.out, "kbctl list-tables"));
    assert_non_null(strstr(r.out, "Exit status"));
    s_run_free(&r);

    r = s_kbctl(0, NULL, NULL, (const char *[]){"put", "--help", NULL});
    assert_non_null(strstr(r.out, "usage: kbctl put TABLE"));
    s_run_free(&r);

    r = s_kbctl(0, NULL, NULL, (const char *[]){"list-tables", "--help", NULL});
    assert_non_null(strstr(r.out, "name, dim, rows, optimizer, update policy"));
    s_run_free(&r);

    r = s_kbctl(1, NULL, NULL, (const char *[]){"list-tables", NULL});
    assert_non_null(strstr(r.err, "CARLS_KB"));
    s_run_free(&r);

    r = s_kbctl(1, "tcp://127.0.0.1:1", NULL, (const char *[]){"frobnicate", NULL});
    assert_non_null(strstr(r.err, "unknown verb"));
    s_run_free(&r);

    r = s_kbctl(1, "tcp://127.0.0.1:1", NULL, (const char *[]){"get", "emb", "k", "--bogus", NULL});
    s_run_free(&r);

    r = s_kbctl(1, "tcp://127.0.0.1:1", NULL, (const char *[]){"get", "emb", "k", "--kb", "x", NULL});
    assert_non_null(strstr(r.err, "global option"));
    s_run_free(&r);

    r = s_kbctl(1, NULL, NULL, (const char *[]){"--timeout-ms", "soon", "list-tables", NULL});
    s_run_free(&r);
}

/* Endpoint from --kb or from CARLS_KB; list-tables prints name, dim, rows, optimizer, policy. */
static void test_list_tables(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    const char *want = "emb\t3\t10\tsgd\tlazy\nwords\t2\t5\tadam\timmediate\n";
    s_run_t r = s_kbctl(0, ep, NULL, (const char *[]){"list-tables", NULL});
    assert_string_equal(r.out, want);
    s_run_free(&r);
    /* --kb wins over CARLS_KB */
    r = s_kbctl(0, "tcp://127.0.0.1:1", NULL, (const char *[]){"--kb", ep, "list-tables", NULL});
    assert_string_equal(r.out, want);
    s_run_free(&r);
}

static void test_create_table(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    s_run_t r = s_kbctl(0, ep, NULL,
                        (const char *[]){"create-table", "vecs", "--dim", "16", "--optimizer", "adam", "--lr=0.5",
                                         "--beta1", "0.8", "--beta2", "0.99", "--epsilon", "1e-6", "--update",
                                         "immediate", "--max-age-ms", "250", "--max-pending", "64",
                                         "--outlier-threshold", "2.5", "--outlier-rule", "none", "--init",
                                         "normal", "--init-scale", "0.1", "--seed", "77", "--if-not-exists", NULL});
    assert_string_equal(r.out, "");
    assert_non_null(strstr(r.err, "vecs"));
    s_run_free(&r);
    assert_int_equal(fake_kb_server_count(srv), 1);
    Carls__Request *q = s_request_of(srv, 0, CARLS__REQUEST__OP_CREATE_TABLE);
    assert_string_equal(q->table, "vecs");
    assert_true(q->client_id != 0);
    assert_int_equal(q->sequence, 1);
    const Carls__CreateTable *ct = q->create_table;
    assert_true(ct->if_not_exists);
    const Carls__TableConfig *cfg = ct->config;
    assert_int_equal(cfg->kind, CARLS__TABLE_KIND__TABLE_EMBEDDING);
    assert_int_equal(cfg->dim, 16);
    assert_int_equal(cfg->init, CARLS__INIT_KIND__INIT_NORMAL);
    assert_true(cfg->init_scale == 0.1f);
    assert_int_equal(cfg->init_seed, 77);
    assert_int_equal(cfg->optimizer->kind, CARLS__OPTIMIZER_KIND__OPT_ADAM);
    assert_true(cfg->optimizer->learning_rate == 0.5f);
    assert_true(cfg->optimizer->beta1 == 0.8f && cfg->optimizer->beta2 == 0.99f);
    assert_true(cfg->optimizer->epsilon == 1e-6f);
    assert_int_equal(cfg->lazy->policy, CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE);
    assert_int_equal(cfg->lazy->max_age_ms, 250);
    assert_int_equal(cfg->lazy->max_pending, 64);
    assert_int_equal(cfg->lazy->outlier_rule, CARLS__OUTLIER_RULE__OUTLIER_NONE);
    assert_true(cfg->lazy->outlier_threshold == 2.5f);
    carls__request__free_unpacked(q, NULL);

    /* Bad command lines are refused before anything is sent. */
    static const char *const bad[][8] = {
        {"create-table", "vecs", NULL},                                     /* no --dim */
        {"create-table", "bad name", "--dim", "4", NULL},                   /* invalid name */
        {"create-table", "vecs", "--dim", "0", NULL},                       /* dim 0 */
        {"create-table", "vecs", "--dim", "4", "--optimizer", "rmsprop", NULL},
        {"create-table", "vecs", "--dim", "4", "--max-pending", "2000", NULL},
        {"create-table", "vecs", "--dim", "4", "--momentum", "1.5", NULL},
        {"create-table", "vecs", "--dim", "4", "--lr", "0", NULL},          /* 0 would mean "default" */
        {"create-table", "vecs", "--dim", "4", "--lr", "nan", NULL},
        {"create-table", "a", "b", "--dim", "4", NULL},                     /* two names */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = s_kbctl(1, ep, NULL, bad[i]);
        assert_true(strlen(r.err) > 0);
        s_run_free(&r);
    }
    assert_int_equal(fake_kb_server_count(srv), 1);

    r = s_kbctl(0, ep, NULL, (const char *[]){"drop-table", "vecs", "--if-exists", NULL});
    s_run_free(&r);
    q = s_request_of(srv, 1, CARLS__REQUEST__OP_DROP_TABLE);
    assert_string_equal(q->table, "vecs");
    assert_true(q->drop_table->if_exists);
    carls__request__free_unpacked(q, NULL);
}

/* put: rows on stdin, checked against the table's dim, sent in batches, summary on stderr. */
static void test_put(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    const char *rows = "a\t1 2 3\n"
                       "bb\t4\t5  6\n"
                       "c c\t-7 8.5 1e-3\n"
                       "d\t0 0 0\n"
                       "e\t9 9 9\n";
    s_run_t r = s_kbctl(0, ep, rows, (const char *[]){"put", "emb", "--version", "12", "--batch", "2", NULL});
    assert_string_equal(r.out, "");
    assert_non_null(strstr(r.err, "put 5 rows into emb"));
    s_run_free(&r);

    /* list_tables (for the dim), then puts of 2, 2 and 1 rows in input order. */
    assert_int_equal(fake_kb_server_count(srv), 4);
    Carls__Request *q = s_request_of(srv, 0, CARLS__REQUEST__OP_LIST_TABLES);
    carls__request__free_unpacked(q, NULL);
    static const char *keys[] = {"a", "bb", "c c", "d", "e"};
    static const float vals[] = {1, 2, 3, 4, 5, 6, -7, 8.5f, 1e-3f, 0, 0, 0, 9, 9, 9};
    size_t row = 0;
    uint64_t last_seq = 0;
    for (size_t i = 1; i < 4; i++) {
        q = s_request_of(srv, i, CARLS__REQUEST__OP_PUT);
        assert_string_equal(q->table, "emb");
        assert_int_equal(q->put->version, 12);
        assert_int_equal(q->put->n_keys, i < 3 ? 2 : 1);
        assert_true(q->sequence > last_seq);
        last_seq = q->sequence;
        for (size_t j = 0; j < q->put->n_keys; j++, row++) {
            assert_int_equal(q->put->keys[j].len, strlen(keys[row]));
            assert_memory_equal(q->put->keys[j].data, keys[row], strlen(keys[row]));
            assert_memory_equal(q->put->values + 3 * j, vals + 3 * row, 3 * sizeof(float));
        }
        carls__request__free_unpacked(q, NULL);
    }
    assert_int_equal(row, 5);
}

/* One bad line anywhere: every bad line reported with its number, exit 1, and no put sent. */
static void test_put_invalid_input(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    const char *rows = "a\t1 2 3\n"
                       "b\t1 2\n"
                       "c\t1 2 3\n"
                       "d\t1 nan 3\n"
                       "\t1 2 3\n";
    s_run_t r = s_kbctl(1, ep, rows, (const char *[]){"put", "emb", NULL});
    assert_non_null(strstr(r.err, "line 2: expected 3 numbers after the key, got 2"));
    assert_non_null(strstr(r.err, "line 4: value 2 \"nan\""));
    assert_non_null(strstr(r.err, "line 5: empty key"));
    assert_null(strstr(r.err, "line 1:"));
    assert_non_null(strstr(r.err, "nothing was sent"));
    s_run_free(&r);
    for (size_t i = 0; i < fake_kb_server_count(srv); i++) {
        Carls__Request *q = fake_kb_server_request(srv, i);
        assert_int_not_equal(q->op_case, CARLS__REQUEST__OP_PUT);
        carls__request__free_unpacked(q, NULL);
    }

    /* The same rows are fine for nothing else either: a table that does not exist is a server-side error. */
    r = s_kbctl(2, ep, "a\t1 2 3\n", (const char *[]){"put", "nosuch", NULL});
    assert_non_null(strstr(r.err, "no table named \"nosuch\""));
    s_run_free(&r);
}

static void test_push_grad(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    s_run_t r = s_kbctl(0, ep, "w1\t0.5 -0.5\nw1\t1 1\n", (const char *[]){"push-grad", "words", NULL});
    assert_non_null(strstr(r.err, "pushed 2 gradient rows to words"));
    s_run_free(&r);
    Carls__Request *q = s_request_of(srv, 1, CARLS__REQUEST__OP_PUSH_GRADIENTS);
    assert_int_equal(q->push_gradients->n_keys, 2);
    assert_int_equal(q->push_gradients->n_gradients, 4);
    assert_true(q->push_gradients->gradients[1] == -0.5f && q->push_gradients->gradients[3] == 1.0f);
    carls__request__free_unpacked(q, NULL);
    /* push-grad takes no --version. */
    r = s_kbctl(1, ep, "w1\t0.5 -0.5\n", (const char *[]){"push-grad", "words", "--version", "3", NULL});
    s_run_free(&r);
}

/* Checks that out holds exactly n lines, line i being keys[i], a TAB, three numbers separated by single
 * spaces that read back (strtof) to exactly the fake's floats for that key, then metas[i]. */
static void s_check_get_output(const char *out, size_t n, const char *const *keys, const char *const *metas)
{
    const char *p = out;
    for (size_t i = 0; i < n; i++) {
        size_t klen = strlen(keys[i]);
        if (strncmp(p, keys[i], klen) != 0 || p[klen] != '\t') {
            print_error("line %zu: want key \"%s\" then a TAB in:\n%s\n", i + 1, keys[i], out);
            fail();
        }
        p += klen + 1;
        for (uint32_t j = 0; j < 3; j++) {
            if (j > 0) {
                assert_int_equal(*p, ' ');
                p++;
            }
            char *end;
            float v = strtof(p, &end);
            assert_true(end > p && (*end == ' ' || *end == '\t' || *end == '\n'));
            float want = fake_kb_value(keys[i], klen, j);
            assert_memory_equal(&v, &want, sizeof v);
            p = end;
        }
        size_t mlen = strlen(metas[i]);
        if (strncmp(p, metas[i], mlen) != 0 || p[mlen] != '\n') {
            print_error("line %zu: want \"%s\" after the values in:\n%s\n", i + 1, metas[i], out);
            fail();
        }
        p += mlen + 1;
    }
    assert_string_equal(p, "");
}

static void test_get(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);

    s_run_t r = s_kbctl(0, ep, NULL, (const char *[]){"get", "emb", "alpha", "b b", NULL});
    s_check_get_output(r.out, 2, (const char *[]){"alpha", "b b"}, (const char *[]){"", ""});
    s_run_free(&r);
    Carls__Request *q = s_request_of(srv, 1, CARLS__REQUEST__OP_LOOKUP);
    assert_false(q->lookup->no_create);
    carls__request__free_unpacked(q, NULL);

    /* Keys from stdin, metadata columns, --no-create on the wire, several batches (the fake numbers its
     * metadata per request, so k3 starts again). */
    r = s_kbctl(0, ep, "k1\nk2\n\nk3\n", (const char *[]){"get", "emb", "--meta", "--no-create", "--batch", "2", NULL});
    s_check_get_output(r.out, 3, (const char *[]){"k1", "k2", "k3"},
                       (const char *[]){"\t7\t1000\t1", "\t7\t1001\t2", "\t7\t1000\t1"});
    s_run_free(&r);
    size_t n = fake_kb_server_count(srv);
    assert_int_equal(n, 2 + 3);
    q = fake_kb_server_request(srv, n - 1);
    assert_true(q->lookup->no_create);
    assert_int_equal(q->lookup->n_keys, 1);
    carls__request__free_unpacked(q, NULL);

    r = s_kbctl(1, ep, NULL, (const char *[]){"get", "emb", "", NULL});
    s_run_free(&r);
}

/* Connection and server errors exit with 2 and say why. */
static void test_server_errors(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    fake_kb_server_set_mode(srv, FAKE_SILENT);
    /* 500 ms per attempt: with 100 ms a loaded machine (CI under ASan) may not finish the reconnect's TCP
     * handshake before the resend times out and kbctl exits, and the resend never reaches the server. */
    s_run_t r = s_kbctl(2, ep, NULL, (const char *[]){"--timeout-ms", "500", "--retries", "1", "list-tables", NULL});
    assert_non_null(strstr(r.err, "no answer"));
    assert_string_equal(r.out, "");
    s_run_free(&r);
    assert_int_equal(fake_kb_server_wait_count(srv, 2, 5000), 2);

    fake_kb_server_set_status(srv, CARLS__STATUS_CODE__STATUS_READ_ONLY, "this server is read-only");
    r = s_kbctl(2, ep, NULL, (const char *[]){"drop-table", "emb", NULL});
    assert_non_null(strstr(r.err, "READ_ONLY: this server is read-only"));
    s_run_free(&r);

    fake_kb_server_set_mode(srv, FAKE_GARBAGE);
    r = s_kbctl(2, ep, NULL, (const char *[]){"checkpoint", NULL});
    s_run_free(&r);
}

static void test_stats_and_checkpoint(void **state)
{
    fake_kb_server_t *srv = *state;
    const char *ep = fake_kb_server_endpoint(srv);
    s_run_t r = s_kbctl(0, ep, NULL, (const char *[]){"stats", NULL});
    assert_non_null(strstr(r.out, "requests: 77\n"));
    assert_non_null(strstr(r.out, "durability: sync\n"));
    assert_non_null(strstr(r.out, "latency lookup: count 5, p50 12.5 us, p99 "));
    assert_non_null(strstr(r.out, "\ntable emb\ndim: 3\nrows: 10\n"));
    assert_non_null(strstr(r.out, "\ntable words\n"));
    assert_non_null(strstr(r.out, "outliers_dropped: 3\n"));
    s_run_free(&r);

    r = s_kbctl(0, ep, NULL, (const char *[]){"stats", "words", NULL});
    assert_null(strstr(r.out, "table emb"));
    assert_non_null(strstr(r.out, "table words"));
    s_run_free(&r);
    Carls__Request *q = fake_kb_server_request(srv, 1);
    assert_string_equal(q->table, "words");
    carls__request__free_unpacked(q, NULL);

    r = s_kbctl(0, ep, NULL, (const char *[]){"checkpoint", NULL});
    assert_string_equal(r.out, "committed_epoch: 42\nrows: 5\n");
    s_run_free(&r);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_usage_errors),
    S_SERVER_TEST(test_list_tables),
    S_SERVER_TEST(test_create_table),
    S_SERVER_TEST(test_put),
    S_SERVER_TEST(test_put_invalid_input),
    S_SERVER_TEST(test_push_grad),
    S_SERVER_TEST(test_get),
    S_SERVER_TEST(test_server_errors),
    S_SERVER_TEST(test_stats_and_checkpoint))
