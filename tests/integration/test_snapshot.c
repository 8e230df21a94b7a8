/* Integration: bank snapshots (knowledge_bank/kb_snapshot.h) on real kb-servers over loopback.
 *
 * under write load: two shards; writer threads each put, one request at a time, the same increasing
 * version into 8 keys of their own spread over both shards (a multi-key put), recording when each put was
 * sent and when it was acknowledged. A snapshot is taken through kb_cluster_snapshot while they run (the
 * servers run with CARLS_KB_TEST_SNAPSHOT_DELAY_MS, which pauses before and after the cut so writes happen
 * during the snapshot). Both servers are restarted with --restore, and for every key the restored version
 * must be at least every put acknowledged before the snapshot began and below every put sent after it
 * ended, the value must be the version's (no torn row), and all keys of one writer on one shard must have
 * the same version (a put is all or nothing per shard). Puts must also be answered while the snapshot is
 * being taken (service does not stop).
 *
 * damaged and partial: a snapshot with a byte flipped in its store or in its manifest, and one without its
 * manifest, are
 * listed as not valid naming the file, and --restore refuses them naming the file, leaving the data as it
 * was; a snapshot of another shard is refused; bad names, existing names and deletes answer their status;
 * two creates of one name at once both succeed (the second waits for the first); a read-only server lists
 * but refuses create and delete.
 *
 * optimizer state: a lazy AdaGrad table with gradients still pending is snapshotted; the same further
 * pushes on the original and on the restored server give the same values, versions and use counts. A
 * snapshot one shard refuses is deleted again on the shards that took it. */
#include "kb_cluster.h"
#include "protocol.h"
#include "server_harness.h"
#include "test_proto.h"
#include "test_util.h"
#include "util.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

enum { SHARDS = 2, WRITERS = 3, KEYS = 8, DIM = 4 };

/* Every test's servers, stopped and removed by the teardown even when an assertion failed. */
static int s_setup(void **state)
{
    test_server_t *servers = calloc(SHARDS, sizeof *servers);
    for (int i = 0; i < SHARDS; i++)
        test_server_init(&servers[i]);
    *state = servers;
    return 0;
}

static int s_teardown(void **state)
{
    test_server_t *servers = *state;
    int bad = 0;
    for (int i = 0; i < SHARDS; i++)
        bad |= test_server_cleanup(&servers[i]) != 0;
    free(servers);
    unsetenv("CARLS_KB_TEST_SNAPSHOT_DELAY_MS");
    return bad ? -1 : 0;
}

static kb_cluster_t *s_cluster(const char *endpoints)
{
    kb_client_options_t opts = {.timeout_ms = 20000, .retries = 0}; /* loopback: an answer or a dead server */
    kb_cluster_t *c = kb_cluster_new(endpoints, &opts);
    assert_non_null(c);
    return c;
}

/* Starts servers[i] as shard i of n (n 1: unsharded) with extra args; endpoints gets the list. Shard 0 of
 * several runs with compaction held off, so its snapshots come from the journal; the others compact as usual. */
static void s_start(test_server_t *servers, int n, const char *extra1, const char *extra2, char *endpoints,
                    size_t len)
{
    endpoints[0] = '\0';
    for (int i = 0; i < n; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "%d/%d", i, n);
        const char *args[] = {"--shard", spec, i == 0 ? "--compact-delay-ms" : extra1, i == 0 ? "3600000" : extra2,
                              i == 0 ? extra1 : NULL, extra2, NULL};
        const char *plain[] = {extra1, extra2, NULL};
        if (test_server_start(&servers[i], n > 1 ? args : plain) != 0)
            fail_msg("server %d did not start; log in %s", i, servers[i].log_file);
        snprintf(endpoints + strlen(endpoints), len - strlen(endpoints), "%s%s", i ? "," : "", servers[i].endpoint);
    }
}

static void s_stop(test_server_t *servers, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(test_server_stop(&servers[i], SIGTERM), 0);
}

static void s_create_table(kb_cluster_t *c, const char *table, Carls__OptimizerKind opt, bool pending)
{
    test_table_config_t t;
    test_embedding_table_config(&t, DIM, CARLS__INIT_KIND__INIT_UNIFORM, 7, opt, 0.1f,
                                CARLS__UPDATE_POLICY__UPDATE_LAZY);
    if (pending) { /* gradients stay pending until a lookup applies them */
        t.lazy.max_age_ms = 3600000;
        t.lazy.max_pending = 1024;
    } else {
        t.cfg.lazy = NULL; /* no lazy-update part at all: the server's defaults */
    }
    if (kb_cluster_create_table(c, table, &t.cfg, false) != 0)
        fail_msg("create %s: %s", table, kb_cluster_last_error(c));
}

/* ---- under write load ---- */

typedef struct {
    const char *endpoints;
    int id;
    atomic_int *stop;
    char names[KEYS][16];
    kb_key_t keys[KEYS];
    int64_t *sent_us, *acked_us; /* (n) put i+1's times */
    size_t n, cap;
    char error[512];
} writer_t;

static void *s_writer(void *arg)
{
    writer_t *w = arg;
    kb_cluster_t *c = kb_cluster_new(w->endpoints, &(kb_client_options_t){.timeout_ms = 20000});
    float values[KEYS * DIM];
    while (c && !atomic_load(w->stop)) {
        uint64_t version = w->n + 1;
        for (size_t j = 0; j < KEYS * DIM; j++)
            values[j] = (float)version;
        if (w->n == w->cap) {
            w->cap = w->cap ? w->cap * 2 : 1024;
            w->sent_us = realloc(w->sent_us, w->cap * sizeof *w->sent_us);
            w->acked_us = realloc(w->acked_us, w->cap * sizeof *w->acked_us);
        }
        w->sent_us[w->n] = carls_monotonic_us();
        if (kb_cluster_put(c, "emb", w->keys, KEYS, DIM, values, version) != 0) {
            snprintf(w->error, sizeof w->error, "put %llu: %s", (unsigned long long)version, kb_cluster_last_error(c));
            break;
        }
        w->acked_us[w->n] = carls_monotonic_us();
        w->n++;
    }
    kb_cluster_destroy(&c);
    return NULL;
}

static void s_sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* A create of snapshot "dup" from a client of its own. */
typedef struct {
    const char *endpoints;
    int rc;
    char err[1024];
} dup_t;

static void *s_create_dup(void *arg)
{
    dup_t *d = arg;
    kb_cluster_t *c = kb_cluster_new(d->endpoints, &(kb_client_options_t){.timeout_ms = 20000});
    d->rc = c ? kb_cluster_snapshot(c, "dup", d->err, sizeof d->err) : -1;
    kb_cluster_destroy(&c);
    return NULL;
}

static void test_snapshot_under_write_load(void **state)
{
    test_server_t *servers = *state;
    setenv("CARLS_KB_TEST_SNAPSHOT_DELAY_MS", "300", 1);
    char endpoints[1024];
    s_start(servers, SHARDS, NULL, NULL, endpoints, sizeof endpoints);
    kb_cluster_t *c = s_cluster(endpoints);
    s_create_table(c, "emb", CARLS__OPTIMIZER_KIND__OPT_SGD, false);

    atomic_int stop = 0;
    writer_t *w = calloc(WRITERS, sizeof *w);
    pthread_t threads[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        w[i] = (writer_t){.endpoints = endpoints, .id = i, .stop = &stop};
        bool shard_seen[SHARDS] = {false};
        for (int j = 0; j < KEYS; j++) {
            snprintf(w[i].names[j], sizeof w[i].names[j], "w%dk%d", i, j);
            w[i].keys[j] = (kb_key_t){w[i].names[j], strlen(w[i].names[j])};
            shard_seen[kb_cluster_shard_of(c, w[i].keys[j].data, w[i].keys[j].len)] = true;
        }
        assert_true(shard_seen[0] && shard_seen[1]); /* every put spans both shards */
        assert_int_equal(pthread_create(&threads[i], NULL, s_writer, &w[i]), 0);
    }
    s_sleep_ms(300);
    int64_t begin_us = carls_monotonic_us();
    char err[1024];
    int rc = kb_cluster_snapshot(c, "snap1", err, sizeof err);
    int64_t end_us = carls_monotonic_us();
    s_sleep_ms(300);
    atomic_store(&stop, 1);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(threads[i], NULL);
    if (rc != 0)
        fail_msg("snapshot: %s", err);
    for (int i = 0; i < WRITERS; i++)
        if (w[i].error[0])
            fail_msg("writer %d: %s", i, w[i].error);

    /* The list: valid, with the table and a cut epoch, on both shards. */
    Carls__Response *list[SHARDS];
    assert_int_equal(kb_cluster_snapshot_each(c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, true, list), 0);
    for (int s = 0; s < SHARDS; s++) {
        const Carls__SnapshotResult *res = list[s]->snapshot;
        assert_int_equal(res->n_snapshots, 1);
        assert_string_equal(res->snapshots[0]->name, "snap1");
        assert_true(res->snapshots[0]->valid);
        assert_true(res->snapshots[0]->cut_epoch > 0);
        assert_int_equal(res->snapshots[0]->n_tables, 1);
        assert_string_equal(res->snapshots[0]->tables[0], "emb");
        assert_int_equal(res->snapshots[0]->shard_index, s);
        assert_int_equal(res->snapshots[0]->shard_count, SHARDS);
        carls__response__free_unpacked(list[s], NULL);
    }
    /* Two creates of one name at once (as a client's resend after a timeout would be): the second waits for
     * the first and answers as it did, instead of ALREADY_EXISTS. */
    pthread_t dup_thread;
    dup_t dup = {.endpoints = endpoints};
    assert_int_equal(pthread_create(&dup_thread, NULL, s_create_dup, &dup), 0);
    s_sleep_ms(100); /* inside the first create's 300 ms pause before its cut */
    if (kb_cluster_snapshot(c, "dup", err, sizeof err) != 0)
        fail_msg("the second create of dup: %s", err);
    pthread_join(dup_thread, NULL);
    if (dup.rc != 0)
        fail_msg("the first create of dup: %s", dup.err);
    assert_int_equal(kb_cluster_snapshot_delete(c, "dup", err, sizeof err), 0);

    /* The same name again: ALREADY_EXISTS, and the snapshot stays. */
    assert_int_equal(kb_cluster_snapshot(c, "snap1", err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS);
    kb_cluster_destroy(&c);

    s_stop(servers, SHARDS);
    unsetenv("CARLS_KB_TEST_SNAPSHOT_DELAY_MS");
    s_start(servers, SHARDS, "--restore", "snap1", endpoints, sizeof endpoints);
    c = s_cluster(endpoints);
    size_t in_between = 0;
    for (int i = 0; i < WRITERS; i++) {
        /* lo: the newest put acknowledged before the snapshot began; hi: the oldest sent after it ended. */
        uint64_t lo = 0, hi = UINT64_MAX;
        size_t during = 0; /* puts sent and acknowledged while the snapshot was being taken */
        for (size_t k = 0; k < w[i].n; k++) {
            if (w[i].acked_us[k] < begin_us)
                lo = k + 1;
            if (w[i].sent_us[k] > end_us && hi == UINT64_MAX)
                hi = k + 1;
            during += w[i].sent_us[k] > begin_us && w[i].acked_us[k] < end_us;
        }
        assert_true(lo > 0);          /* the load ran before the snapshot ... */
        assert_true(hi != UINT64_MAX); /* ... and after it */
        if (during == 0) /* the snapshot (over 600 ms with its pauses) did not stop service */
            fail_msg("writer %d: no put was answered while the snapshot was taken", i);
        float values[KEYS * DIM];
        kb_row_meta_t meta[KEYS];
        if (kb_cluster_lookup_ex(c, "emb", w[i].keys, KEYS, DIM, true, values, meta) != 0)
            fail_msg("lookup: %s", kb_cluster_last_error(c));
        uint64_t shard_version[SHARDS] = {0};
        bool shard_set[SHARDS] = {false};
        for (int j = 0; j < KEYS; j++) {
            uint64_t v = meta[j].version;
            if (v < lo || v >= hi)
                fail_msg("writer %d key %s: restored version %llu, but puts up to %llu were acknowledged before "
                         "the snapshot began and put %llu was sent after it ended",
                         i, w[i].names[j], (unsigned long long)v, (unsigned long long)lo, (unsigned long long)hi);
            for (int d = 0; d < DIM; d++)
                assert_true(values[j * DIM + d] == (float)v);
            uint32_t s = kb_cluster_shard_of(c, w[i].keys[j].data, w[i].keys[j].len);
            if (shard_set[s] && shard_version[s] != v)
                fail_msg("writer %d: shard %u holds versions %llu and %llu of one put", i, s,
                         (unsigned long long)shard_version[s], (unsigned long long)v);
            shard_set[s] = true;
            shard_version[s] = v;
            in_between += v > lo;
        }
        printf("writer %d: %zu puts; acknowledged before: %llu, sent after: %llu, answered during: %zu, restored: "
               "%llu/%llu\n", i, w[i].n, (unsigned long long)lo, (unsigned long long)hi, during,
               (unsigned long long)shard_version[0], (unsigned long long)shard_version[1]);
        free(w[i].sent_us);
        free(w[i].acked_us);
    }
    printf("keys holding a put made while the snapshot was taken: %zu\n", in_between);
    free(w);
    /* Restoring kept the snapshot; delete removes it on every shard, and a second delete finds none. */
    assert_int_equal(kb_cluster_snapshot_delete(c, "snap1", err, sizeof err), 0);
    assert_int_equal(kb_cluster_snapshot_delete(c, "snap1", err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_NOT_FOUND);
    kb_cluster_destroy(&c);
}

/* ---- damaged, partial, other shard, names ---- */

/* Puts version v into 16 keys of "emb". */
static void s_put_all(kb_cluster_t *c, uint64_t v)
{
    char names[16][8];
    kb_key_t keys[16];
    float values[16 * DIM];
    for (int j = 0; j < 16; j++) {
        snprintf(names[j], sizeof names[j], "k%d", j);
        keys[j] = (kb_key_t){names[j], strlen(names[j])};
    }
    for (size_t j = 0; j < 16 * DIM; j++)
        values[j] = (float)v;
    if (kb_cluster_put(c, "emb", keys, 16, DIM, values, v) != 0)
        fail_msg("put: %s", kb_cluster_last_error(c));
}

/* The version of key k0. */
static uint64_t s_version(kb_cluster_t *c)
{
    kb_key_t key = {"k0", 2};
    float value[DIM];
    kb_row_meta_t meta;
    if (kb_cluster_lookup_ex(c, "emb", &key, 1, DIM, true, value, &meta) != 0)
        fail_msg("lookup: %s", kb_cluster_last_error(c));
    return meta.version;
}

/* Starting with --restore name (and extra args) fails, and the log names `text`. */
static void s_restore_refused(test_server_t *srv, const char *name, const char *shard, const char *text)
{
    const char *args[] = {"--restore", name, shard ? "--shard" : NULL, shard, NULL};
    assert_int_not_equal(test_server_start(srv, args), 0);
    if (!test_server_log_has(srv, text))
        fail_msg("restoring %s was refused, but the log (%s) does not say '%s'", name, srv->log_file, text);
}

static void s_flip_byte(const char *path)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long at = ftell(f) / 2;
    fseek(f, at, SEEK_SET);
    int b = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(b ^ 0x5a, f);
    fclose(f);
}

static void test_snapshot_damaged_partial_names(void **state)
{
    test_server_t *srv = *state; /* unsharded: the first of the fixture's servers */
    char endpoints[512], err[1024], path[600];
    s_start(srv, 1, NULL, NULL, endpoints, sizeof endpoints);
    kb_cluster_t *c = s_cluster(endpoints);
    s_create_table(c, "emb", CARLS__OPTIMIZER_KIND__OPT_SGD, false);
    s_put_all(c, 1);
    const char *names[] = {"good", "bad", "partial", "badman"};
    for (int i = 0; i < 4; i++)
        if (kb_cluster_snapshot(c, names[i], err, sizeof err) != 0)
            fail_msg("snapshot %s: %s", names[i], err);
    s_put_all(c, 2);

    /* Names: refused before anything is made. */
    const char *bad_names[] = {"../x", "a/b", ".hidden", "x y", ""};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
        assert_int_equal(kb_cluster_snapshot(c, bad_names[i], err, sizeof err), -1);
        if (bad_names[i][0])
            assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    }
    char long_name[80];
    memset(long_name, 'a', 65);
    long_name[65] = '\0';
    assert_int_equal(kb_cluster_snapshot(c, long_name, err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT);
    assert_int_equal(kb_cluster_snapshot_delete(c, "nosuch", err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_NOT_FOUND);

    /* Damage one, cut the manifest of another: the list (verified) says so, naming the file. */
    snprintf(path, sizeof path, "%s/db/snapshots/bad/bank.sqlite", srv->data_dir);
    s_flip_byte(path);
    snprintf(path, sizeof path, "%s/db/snapshots/partial/MANIFEST", srv->data_dir);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/db/snapshots/badman/MANIFEST", srv->data_dir);
    s_flip_byte(path);
    Carls__Response *list;
    assert_int_equal(kb_cluster_snapshot_each(c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, true, &list), 0);
    const Carls__SnapshotResult *res = list->snapshot;
    assert_int_equal(res->n_snapshots, 4); /* sorted: bad, badman, good, partial */
    assert_string_equal(res->snapshots[0]->name, "bad");
    assert_false(res->snapshots[0]->valid);
    assert_non_null(strstr(res->snapshots[0]->problem, "snapshots/bad/bank.sqlite is damaged"));
    assert_string_equal(res->snapshots[1]->name, "badman");
    assert_false(res->snapshots[1]->valid);
    assert_non_null(strstr(res->snapshots[1]->problem, "snapshots/badman/MANIFEST"));
    assert_string_equal(res->snapshots[2]->name, "good");
    assert_true(res->snapshots[2]->valid);
    assert_string_equal(res->snapshots[3]->name, "partial");
    assert_false(res->snapshots[3]->valid);
    assert_non_null(strstr(res->snapshots[3]->problem, "snapshots/partial/MANIFEST"));
    carls__response__free_unpacked(list, NULL);
    kb_cluster_destroy(&c);
    assert_int_equal(test_server_stop(srv, SIGTERM), 0);

    /* Restores refused, naming the file or the shard; the data stays as it was (version 2). */
    s_restore_refused(srv, "bad", NULL, "snapshots/bad/bank.sqlite is damaged");
    s_restore_refused(srv, "partial", NULL, "snapshots/partial/MANIFEST");
    s_restore_refused(srv, "badman", NULL, "snapshots/badman/MANIFEST");
    s_restore_refused(srv, "nosuch", NULL, "no snapshot 'nosuch'");
    s_restore_refused(srv, "good", "0/2", "taken by shard 0/0");
    s_start(srv, 1, NULL, NULL, endpoints, sizeof endpoints);
    c = s_cluster(endpoints);
    assert_int_equal(s_version(c), 2);
    kb_cluster_destroy(&c);
    assert_int_equal(test_server_stop(srv, SIGTERM), 0);

    /* An interrupted restore (its marker left behind) stops a plain start until the restore is run again. */
    snprintf(path, sizeof path, "%s/db/RESTORING", srv->data_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("good\n", f);
    fclose(f);
    const char *none[] = {NULL};
    assert_int_not_equal(test_server_start(srv, none), 0);
    assert_true(test_server_log_has(srv, "run kb-server --restore good again"));

    /* The good one restores (version 1), and is kept. */
    s_start(srv, 1, "--restore", "good", endpoints, sizeof endpoints);
    c = s_cluster(endpoints);
    assert_int_equal(s_version(c), 1);
    assert_int_equal(kb_cluster_snapshot_each(c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, false, &list), 0);
    assert_int_equal(list->snapshot->n_snapshots, 4);
    assert_true(list->snapshot->snapshots[2]->valid);
    carls__response__free_unpacked(list, NULL);
    kb_cluster_destroy(&c);
    assert_int_equal(test_server_stop(srv, SIGTERM), 0);

    /* A read-only server lists its snapshots and refuses to take or delete one. */
    s_start(srv, 1, "--read-only", NULL, endpoints, sizeof endpoints);
    c = s_cluster(endpoints);
    assert_int_equal(kb_cluster_snapshot(c, "ro", err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_READ_ONLY);
    assert_int_equal(kb_cluster_snapshot_delete(c, "good", err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_READ_ONLY);
    assert_int_equal(kb_cluster_snapshot_each(c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, false, &list), 0);
    assert_int_equal(list->snapshot->n_snapshots, 4);
    carls__response__free_unpacked(list, NULL);
    kb_cluster_destroy(&c);
}

/* ---- optimizer state and pending gradients ---- */

enum { OPT_KEYS = 24 };

/* Pushes gradients (seeded) to every key, `times` times. */
static void s_push(kb_cluster_t *c, const kb_key_t *keys, uint64_t seed, int times)
{
    float grads[OPT_KEYS * DIM];
    for (int t = 0; t < times; t++) {
        for (size_t j = 0; j < OPT_KEYS * DIM; j++)
            grads[j] = test_uniform_pm1(&seed);
        if (kb_cluster_push_gradients(c, "ada", keys, OPT_KEYS, DIM, grads) != 0)
            fail_msg("push: %s", kb_cluster_last_error(c));
    }
}

static void test_snapshot_optimizer_state(void **state)
{
    test_server_t *servers = *state;
    char endpoints[1024], err[1024];
    s_start(servers, SHARDS, NULL, NULL, endpoints, sizeof endpoints);
    kb_cluster_t *c = s_cluster(endpoints);
    s_create_table(c, "ada", CARLS__OPTIMIZER_KIND__OPT_ADAGRAD, true);
    char names[OPT_KEYS][8];
    kb_key_t keys[OPT_KEYS];
    for (int j = 0; j < OPT_KEYS; j++) {
        snprintf(names[j], sizeof names[j], "a%d", j);
        keys[j] = (kb_key_t){names[j], strlen(names[j])};
    }
    float before[OPT_KEYS * DIM], a[OPT_KEYS * DIM], b[OPT_KEYS * DIM];
    kb_row_meta_t meta_a[OPT_KEYS], meta_b[OPT_KEYS];
    s_push(c, keys, 11, 3);
    assert_int_equal(kb_cluster_lookup(c, "ada", keys, OPT_KEYS, DIM, before, NULL), 0); /* applies them */
    s_push(c, keys, 12, 2); /* pending at the snapshot */
    if (kb_cluster_snapshot(c, "opt", err, sizeof err) != 0)
        fail_msg("snapshot: %s", err);
    s_push(c, keys, 13, 2);
    assert_int_equal(kb_cluster_lookup(c, "ada", keys, OPT_KEYS, DIM, a, meta_a), 0);
    kb_cluster_destroy(&c);
    s_stop(servers, SHARDS);

    s_start(servers, SHARDS, "--restore", "opt", endpoints, sizeof endpoints);
    c = s_cluster(endpoints);
    s_push(c, keys, 13, 2);
    assert_int_equal(kb_cluster_lookup(c, "ada", keys, OPT_KEYS, DIM, b, meta_b), 0);
    assert_memory_not_equal(before, a, sizeof a); /* the pushes after the first lookup did something */
    assert_memory_equal(a, b, sizeof a);
    for (int j = 0; j < OPT_KEYS; j++) {
        assert_int_equal(meta_a[j].version, meta_b[j].version);
        assert_int_equal(meta_a[j].frequency, meta_b[j].frequency);
    }

    /* A name only shard 1 has: the cluster's create fails there (ALREADY_EXISTS) and deletes the part shard 0
     * took, leaving shard 1's own. */
    kb_cluster_t *one = s_cluster(servers[1].endpoint);
    assert_int_equal(kb_cluster_snapshot(one, "x", err, sizeof err), 0);
    kb_cluster_destroy(&one);
    assert_int_equal(kb_cluster_snapshot(c, "x", err, sizeof err), -1);
    assert_int_equal(kb_cluster_last_status(c), CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS);
    assert_non_null(strstr(err, "shard 1"));
    assert_non_null(strstr(err, "deleted again"));
    Carls__Response *list[SHARDS];
    assert_int_equal(kb_cluster_snapshot_each(c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, false, list), 0);
    assert_int_equal(list[0]->snapshot->n_snapshots, 1); /* opt */
    assert_int_equal(list[1]->snapshot->n_snapshots, 2); /* opt, x */
    assert_string_equal(list[1]->snapshot->snapshots[1]->name, "x");
    for (int s = 0; s < SHARDS; s++)
        carls__response__free_unpacked(list[s], NULL);
    kb_cluster_destroy(&c);
}

CARLS_TEST_MAIN(
    cmocka_unit_test_setup_teardown(test_snapshot_under_write_load, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_snapshot_damaged_partial_names, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_snapshot_optimizer_state, s_setup, s_teardown))
