/* Integration: kb-server --read-only changes no file (docs/STATE.md "Read-only serving").
 *
 * A bank is left by two kill -9's with every kind of state a writer leaves behind: rows only in SQLite's
 * write-ahead log (compacted, never checkpointed), rows only in the journal (committed, never compacted), an
 * AdaGrad table's pending lazy gradients, use counts. Every file of the data directory is read into memory,
 * a --read-only server serves lookups, scan, stats and knn from it (answers include the journal-only rows, and
 * pending gradients stay pending: lookups answer the put values), is stopped, and every file must be
 * byte-identical, none added or removed. A writable server started afterwards still finds the gradients
 * pending. A data directory without a bank (none, empty, not a database, a WAL without its index) is
 * refused with a message saying so, and nothing in it is created. */
#include "kb_cluster.h"
#include "protocol.h"
#include "server_fixture.h"
#include "test_proto.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

enum { DIM = 4, ROWS = 20 };

/* ---- the files of a directory, recursively ---- */

typedef struct {
    char path[512]; /* relative to the directory */
    unsigned char *bytes;
    size_t len;
} s_file_t;

typedef struct {
    s_file_t *files;
    size_t n, cap;
} s_tree_t;

static void s_tree_add(s_tree_t *t, const char *root, const char *rel)
{
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", root, rel);
    struct stat sb;
    assert_int_equal(lstat(full, &sb), 0);
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(full);
        assert_non_null(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[512];
            snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
            s_tree_add(t, root, sub);
        }
        closedir(d);
        return;
    }
    assert_true(S_ISREG(sb.st_mode));
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16;
        t->files = realloc(t->files, t->cap * sizeof *t->files);
        assert_non_null(t->files);
    }
    s_file_t *f = &t->files[t->n++];
    snprintf(f->path, sizeof f->path, "%s", rel);
    f->bytes = test_read_file(full, 0, &f->len);
    assert_non_null(f->bytes);
}

static int s_by_path(const void *a, const void *b)
{
    return strcmp(((const s_file_t *)a)->path, ((const s_file_t *)b)->path);
}

static s_tree_t s_tree(const char *root)
{
    s_tree_t t = {0};
    s_tree_add(&t, root, "");
    if (t.n > 1) /* qsort needs a valid pointer even for no elements */
        qsort(t.files, t.n, sizeof *t.files, s_by_path);
    return t;
}

static void s_tree_free(s_tree_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->files[i].bytes);
    free(t->files);
    memset(t, 0, sizeof *t);
}

static const s_file_t *s_tree_find(const s_tree_t *t, const char *suffix)
{
    size_t sl = strlen(suffix);
    for (size_t i = 0; i < t->n; i++) {
        size_t pl = strlen(t->files[i].path);
        if (pl >= sl && strcmp(t->files[i].path + pl - sl, suffix) == 0)
            return &t->files[i];
    }
    return NULL;
}

/* Every file of before is in after with the same bytes, and after has no other. */
static void s_assert_same_tree(const s_tree_t *before, const s_tree_t *after)
{
    for (size_t i = 0; i < before->n || i < after->n; i++) {
        if (i >= before->n || i >= after->n || strcmp(before->files[i].path, after->files[i].path) != 0)
            fail_msg("file set changed at entry %zu: before %s, after %s", i,
                     i < before->n ? before->files[i].path : "(none)", i < after->n ? after->files[i].path : "(none)");
        const s_file_t *a = &before->files[i], *b = &after->files[i];
        if (a->len != b->len || memcmp(a->bytes, b->bytes, a->len) != 0)
            fail_msg("%s changed: %zu bytes before, %zu after", a->path, a->len, b->len);
    }
}

/* ---- the bank ---- */

static void s_key(char *buf, size_t n, char prefix, int i) { snprintf(buf, n, "%c-%d", prefix, i); }

static void s_row_value(char prefix, int i, float *v)
{
    for (int j = 0; j < DIM; j++)
        v[j] = (prefix == 'a' ? 1.0f : -1.0f) * (float)(i + 1) + 0.25f * (float)j;
}

/* Puts rows prefix-0 .. prefix-(ROWS-1) (version i+1), then pushes two gradients each to the first five
 * (they stay pending: max_age is an hour and max_pending 16). */
static void s_write_rows(kb_cluster_t *c, char prefix)
{
    char name[16];
    for (int i = 0; i < ROWS; i++) {
        s_key(name, sizeof name, prefix, i);
        kb_key_t k = {name, strlen(name)};
        float v[DIM];
        s_row_value(prefix, i, v);
        assert_int_equal(kb_cluster_put(c, "emb", &k, 1, DIM, v, (uint64_t)i + 1), 0);
    }
    for (int i = 0; i < 5; i++) {
        s_key(name, sizeof name, prefix, i);
        kb_key_t k[2] = {{name, strlen(name)}, {name, strlen(name)}};
        float g[2 * DIM] = {0.5f, -0.5f, 1.0f, 2.0f, 0.25f, 0.5f, -1.0f, 1.0f};
        assert_int_equal(kb_cluster_push_gradients(c, "emb", k, 2, DIM, g), 0);
    }
}

static Carls__StatsResult *s_stats(kb_cluster_t *c, Carls__Response **resp)
{
    assert_int_equal(kb_cluster_stats(c, 0, NULL, resp), 0);
    return (*resp)->stats;
}

/* Waits (without a deadline of its own: ctest's timeout bounds it) until SQLite holds every committed epoch. */
static void s_wait_compacted(kb_cluster_t *c)
{
    for (;;) {
        Carls__Response *resp = NULL;
        Carls__StatsResult *st = s_stats(c, &resp);
        bool done = st->compacted_epoch >= st->committed_epoch && st->compaction_queue_rows == 0 && !st->compacting;
        carls__response__free_unpacked(resp, NULL);
        if (done)
            return;
        usleep(20 * 1000);
    }
}

static void s_lookup(kb_cluster_t *c, char prefix, int i, float *v, kb_row_meta_t *meta)
{
    char name[16];
    s_key(name, sizeof name, prefix, i);
    kb_key_t k = {name, strlen(name)};
    assert_int_equal(kb_cluster_lookup(c, "emb", &k, 1, DIM, v, meta), 0);
}

/* Leaves the bank in f's data directory with rows 'a' only in SQLite's WAL and rows 'b' only in the
 * journal, both with pending gradients, after two kill -9's. */
static void s_make_bank(server_fixture_t *f)
{
    const char *fast[] = {"--compact-delay-ms", "1", NULL};
    server_fixture_start(f, fast);
    Carls__KnnConfig kc;
    Carls__TableConfig cfg = test_knn_table_config(&kc, DIM, "Flat", CARLS__KNN_METRIC__METRIC_L2);
    Carls__OptimizerConfig opt = CARLS__OPTIMIZER_CONFIG__INIT;
    Carls__LazyUpdateConfig lazy = CARLS__LAZY_UPDATE_CONFIG__INIT;
    opt.kind = CARLS__OPTIMIZER_KIND__OPT_ADAGRAD;
    opt.learning_rate = 0.5f;
    lazy.max_age_ms = 3600000;
    lazy.outlier_rule = CARLS__OUTLIER_RULE__OUTLIER_NONE;
    cfg.optimizer = &opt;
    cfg.lazy = &lazy;
    test_create_table(f->cluster, "emb", &cfg);
    s_write_rows(f->cluster, 'a');
    float v[DIM];
    for (int i = 5; i < 10; i++) /* use counts */
        s_lookup(f->cluster, 'a', i, v, NULL);
    s_wait_compacted(f->cluster);
    assert_int_equal(server_fixture_stop(f, SIGKILL), 128 + SIGKILL);

    /* Compaction waits an hour now: what this server commits stays in the journal. */
    const char *slow[] = {"--compact-delay-ms", "3600000", NULL};
    server_fixture_start(f, slow);
    s_write_rows(f->cluster, 'b');
    Carls__Response *resp = NULL;
    Carls__StatsResult *st = s_stats(f->cluster, &resp);
    assert_true(st->committed_epoch > st->compacted_epoch);
    assert_true(st->journal_bytes > 0);
    carls__response__free_unpacked(resp, NULL);
    assert_int_equal(server_fixture_stop(f, SIGKILL), 128 + SIGKILL);
}

static void test_read_only_changes_no_file(void **state)
{
    server_fixture_t *f = *state;
    s_make_bank(f);
    char data[400];
    snprintf(data, sizeof data, "%s/db", f->srv.data_dir);
    s_tree_t before = s_tree(data);
    /* The state this test is about is really there: a WAL with frames, its index, journal segments. */
    const s_file_t *wal = s_tree_find(&before, "bank.sqlite-wal");
    assert_non_null(wal);
    assert_true(wal->len > 0);
    assert_non_null(s_tree_find(&before, "bank.sqlite-shm"));
    assert_non_null(s_tree_find(&before, ".kbj"));

    const char *ro[] = {"--read-only", NULL};
    server_fixture_start(f, ro);
    /* Lookups: every row, the journal-only 'b' rows included, with its put value: the pending gradients
     * of rows 0..4 were not applied. */
    for (int p = 0; p < 2; p++) {
        char prefix = p ? 'b' : 'a';
        for (int i = 0; i < ROWS; i++) {
            float v[DIM], want[DIM];
            kb_row_meta_t meta;
            s_lookup(f->cluster, prefix, i, v, &meta);
            s_row_value(prefix, i, want);
            assert_memory_equal(v, want, sizeof v);
            assert_int_equal(meta.version, (uint64_t)i + 1);
        }
    }
    /* A lookup of a key without a row answers its initial value and creates nothing. */
    float v[DIM];
    kb_key_t unseen = {"zz", 2};
    assert_int_equal(kb_cluster_lookup(f->cluster, "emb", &unseen, 1, DIM, v, NULL), 0);

    Carls__TableStats ts = test_table_stats(f->cluster, "emb");
    assert_int_equal(ts.rows, 2 * ROWS);
    assert_int_equal(ts.pending_keys, 10);
    assert_int_equal(ts.pending_gradients, 20);
    assert_int_equal(ts.updates_applied, 0);

    /* Scan: every row once. */
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Scan sc = CARLS__SCAN__INIT;
    sc.limit = 1000;
    req.table = "emb";
    req.op_case = CARLS__REQUEST__OP_SCAN;
    req.scan = &sc;
    Carls__Response *resp = NULL;
    assert_int_equal(kb_client_call(f->client, &req, &resp), 0);
    assert_int_equal(resp->scan->n_keys, 2 * ROWS);
    assert_true(resp->scan->done);
    carls__response__free_unpacked(resp, NULL);

    /* knn: the nearest row to b-7's value is b-7. */
    float q[DIM];
    s_row_value('b', 7, q);
    resp = test_knn(f->client, "emb", q, DIM, NULL, 0, 1, false);
    assert_int_equal(resp->knn->n_keys, 1);
    assert_int_equal(resp->knn->keys[0].len, 3);
    assert_memory_equal(resp->knn->keys[0].data, "b-7", 3);
    carls__response__free_unpacked(resp, NULL);

    /* Writes and checkpoints are refused. */
    kb_key_t k = {"a-1", 3};
    assert_int_equal(kb_cluster_put(f->cluster, "emb", &k, 1, DIM, v, 9), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_READ_ONLY);
    assert_int_equal(kb_cluster_checkpoint(f->cluster, NULL), KB_CLIENT_ESTATUS);
    assert_int_equal(kb_cluster_last_status(f->cluster), CARLS__STATUS_CODE__STATUS_READ_ONLY);
    assert_int_equal(server_fixture_stop(f, SIGTERM), 0);

    s_tree_t after = s_tree(data);
    s_assert_same_tree(&before, &after);
    s_tree_free(&after);
    s_tree_free(&before);

    /* The gradients are still pending in the files: a writable server applies them on lookup. */
    server_fixture_start(f, NULL);
    for (int p = 0; p < 2; p++) {
        float got[DIM], put[DIM];
        s_lookup(f->cluster, p ? 'b' : 'a', 3, got, NULL);
        s_row_value(p ? 'b' : 'a', 3, put);
        assert_true(memcmp(got, put, sizeof got) != 0);
    }
}

static void test_read_only_refuses_a_missing_bank(void **state)
{
    server_fixture_t *f = *state;
    char data[400], line[512];
    snprintf(data, sizeof data, "%s/db", f->srv.data_dir);
    const char *ro[] = {"--read-only", NULL};
    /* No directory: refused, and not created. */
    assert_int_equal(test_server_start(&f->srv, ro), -1);
    struct stat sb;
    assert_int_equal(stat(data, &sb), -1);
    assert_int_equal(errno, ENOENT);
    test_last_line(f->srv.log_file, line, sizeof line);
    assert_non_null(strstr(line, "does not exist"));
    /* An empty directory: refused, and still empty. */
    assert_int_equal(mkdir(data, 0700), 0);
    assert_int_equal(test_server_start(&f->srv, ro), -1);
    s_tree_t t = s_tree(data);
    assert_int_equal(t.n, 0);
    s_tree_free(&t);
    test_last_line(f->srv.log_file, line, sizeof line);
    assert_non_null(strstr(line, "has no bank"));
    /* Not a database: refused, nothing added. A write-ahead log without its index: refused before SQLite
     * would have to create the index. */
    char path[512];
    snprintf(path, sizeof path, "%s/bank.sqlite", data);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fputs("this is not a database, but it is long enough to be read as a header by sqlite", fp) >= 0,
                     1);
    fclose(fp);
    assert_int_equal(test_server_start(&f->srv, ro), -1);
    test_last_line(f->srv.log_file, line, sizeof line);
    assert_non_null(strstr(line, "is not a bank"));
    snprintf(path, sizeof path, "%s/bank.sqlite-wal", data);
    fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fputs("frames", fp) >= 0, 1);
    fclose(fp);
    assert_int_equal(test_server_start(&f->srv, ro), -1);
    test_last_line(f->srv.log_file, line, sizeof line);
    assert_non_null(strstr(line, "bank.sqlite-shm is missing"));
    t = s_tree(data);
    assert_int_equal(t.n, 2);
    s_tree_free(&t);
}

CARLS_TEST_MAIN(
    SERVER_FIXTURE_TEST(test_read_only_changes_no_file, NULL),
    SERVER_FIXTURE_TEST(test_read_only_refuses_a_missing_bank, NULL))
