/* Fault test (CTest label `fault`): writers run against a kb-server while it is killed with SIGKILL at
 * random moments and restarted, 20 times in one run.
 *
 * sync durability: each writer pushes gradients, one request in flight, to a key of its own in two tables
 * with the immediate policy -- SGD (so the value is exactly -sum of the gradients) and AdaGrad (so the
 * optimizer state matters). A writer keeps its client across the crashes; a request that times out is
 * resent with the same client id and sequence number until it is acknowledged. So every push is
 * acknowledged exactly once, and the final values must equal the writer's own reference exactly (SGD) or
 * to rounding (AdaGrad): a lost write or a retried write applied twice would show.
 *
 * interval durability: writers put distinct keys and record when each was sent and acknowledged; the kills
 * come further apart than the interval (plus commit time), and every write acknowledged longer ago than
 * that before the kill that may have taken it must be there, as must every write the running server took.
 *
 * during compaction: the same exactly-once pushes in sync durability, but every kill lands while the
 * compactor has a transaction open, moving journaled epochs into SQLite (the server runs with
 * CARLS_KB_TEST_COMPACTION_DELAY_MS, which holds that transaction open, and the test kills only once stats
 * say `compacting`). The restart must replay the journal over the rolled-back transaction.
 *
 * while segments are reused: the same exactly-once pushes in sync durability, with 64 KiB journal segments
 * and 20 ms compaction delay, so that compacted segments become spares and new segments are written over
 * them all the time; every kill lands while a segment written over a spare (.kbr) is in the journal, so
 * replay must stop at its own records and skip the stale ones of the file's earlier life. */
#include "kb_cluster.h"
#include "log.h"
#include "server_fixture.h"
#include "test_proto.h"
#include "util.h"

#include <dirent.h>
#include <math.h>
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

enum { WRITERS = 3, KILLS = 20 };

typedef struct {
    const char *endpoint;
    int id;
    atomic_int *stop;
    int acked;            /* pushes acknowledged */
    double sgd_ref;       /* reference SGD value (lr 1): -sum of gradients */
    double ada_w, ada_a;  /* reference AdaGrad value and accumulator */
    int failed;           /* a push that was never acknowledged (should not happen) */
} grad_writer_t;

/* Short attempts, many of them: a restart takes well under the 20 s this allows. */
static kb_client_options_t s_patient = {.timeout_ms = 250, .retries = 80};

static kb_cluster_t *s_patient_cluster(const char *endpoint)
{
    return kb_cluster_new(endpoint, &s_patient);
}

static void *s_grad_writer(void *p)
{
    grad_writer_t *w = p;
    kb_cluster_t *c = s_patient_cluster(w->endpoint);
    if (!c) {
        w->failed++;
        return NULL;
    }
    char key[16];
    snprintf(key, sizeof key, "writer%d", w->id);
    kb_key_t k = {key, strlen(key)};
    w->ada_a = 0.1; /* AdaGrad's default initial accumulator */
    while (!atomic_load(w->stop)) {
        /* Small integers: sums stay exact in float. */
        float g = (float)(1 + (w->acked * 7 + w->id) % 5);
        if (kb_cluster_push_gradients(c, "sgd", &k, 1, 1, &g) != 0 ||
            kb_cluster_push_gradients(c, "ada", &k, 1, 1, &g) != 0) {
            w->failed++;
            break;
        }
        w->sgd_ref -= g;
        w->ada_a += (double)g * g;
        w->ada_w -= 0.1 * g / (sqrt(w->ada_a) + 1e-7);
        w->acked++;
    }
    kb_cluster_destroy(&c);
    return NULL;
}

/* Checks every writer's rows: each acknowledged push applied exactly once (SGD: exactly; AdaGrad: to
 * rounding; versions count the steps). Returns the pushes acknowledged. */
static int s_check_writers(kb_cluster_t *c, const grad_writer_t *w)
{
    int total = 0;
    for (int i = 0; i < WRITERS; i++) {
        assert_int_equal(w[i].failed, 0);
        total += w[i].acked;
        char key[16];
        snprintf(key, sizeof key, "writer%d", i);
        kb_key_t k = {key, strlen(key)};
        float v;
        kb_row_meta_t meta;
        assert_int_equal(kb_cluster_lookup(c, "sgd", &k, 1, 1, &v, &meta), 0);
        if ((double)v != w[i].sgd_ref)
            fail_msg("writer %d: SGD value %.1f, expected %.1f after %d acknowledged pushes", i, v, w[i].sgd_ref,
                     w[i].acked);
        assert_int_equal(meta.version, (uint64_t)w[i].acked); /* one optimizer step per push, none twice */
        assert_int_equal(kb_cluster_lookup(c, "ada", &k, 1, 1, &v, &meta), 0);
        assert_int_equal(meta.version, (uint64_t)w[i].acked);
        if (fabs(v - w[i].ada_w) > 1e-4 * (1 + fabs(w[i].ada_w)))
            fail_msg("writer %d: AdaGrad value %.7g, reference %.7g", i, v, w[i].ada_w);
    }
    return total;
}

static void s_create(kb_cluster_t *c, const char *name, Carls__OptimizerKind kind, float lr)
{
    test_table_config_t t;
    test_embedding_table_config(&t, 1, CARLS__INIT_KIND__INIT_ZEROS, 0, kind, lr,
                                CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE);
    assert_int_equal(kb_cluster_create_table(c, name, &t.cfg, true), 0);
}

/* The two tables the gradient writers push to: SGD (lr 1) and AdaGrad (lr 0.1), immediate updates. */
static void s_create_grad_tables(kb_cluster_t *c)
{
    s_create(c, "sgd", CARLS__OPTIMIZER_KIND__OPT_SGD, 1.0f);
    s_create(c, "ada", CARLS__OPTIMIZER_KIND__OPT_ADAGRAD, 0.1f);
}

/* Starts the WRITERS gradient writers on endpoint (a copy of its own: a restart rewrites the fixture's while
 * it waits); s_stop_grad_writers stops and joins them. */
static void s_start_grad_writers(grad_writer_t *w, pthread_t *th, const char *endpoint, atomic_int *stop)
{
    for (int i = 0; i < WRITERS; i++) {
        w[i] = (grad_writer_t){.endpoint = endpoint, .id = i, .stop = stop};
        assert_int_equal(pthread_create(&th[i], NULL, s_grad_writer, &w[i]), 0);
    }
}

static void s_stop_grad_writers(pthread_t *th, atomic_int *stop)
{
    atomic_store(stop, 1);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);
}

static unsigned s_rand(unsigned *state)
{
    *state = *state * 1103515245u + 12345u;
    return (*state >> 8) & 0xffffff;
}

static void test_sync_kill9_twenty_times(void **state)
{
    server_fixture_t *f = *state;
    const char *args[] = {"--durability", "sync", NULL};
    server_fixture_start(f, args);
    s_create_grad_tables(f->cluster);
    kb_cluster_destroy(&f->cluster);
    kb_client_destroy(&f->client);

    /* The server's port changes on every restart unless we keep it: restart on the same endpoint. The
     * writers get their own copy of it: a restart rewrites f->srv.endpoint while it waits. */
    char endpoint[sizeof f->srv.endpoint];
    snprintf(endpoint, sizeof endpoint, "%s", f->srv.endpoint);
    const char *fixed[] = {"--durability", "sync", "--listen", endpoint, NULL};
    atomic_int stop = 0;
    grad_writer_t w[WRITERS];
    pthread_t th[WRITERS];
    s_start_grad_writers(w, th, endpoint, &stop);
    unsigned rng = 20261122u;
    for (int kill_no = 0; kill_no < KILLS; kill_no++) {
        usleep((useconds_t)(50 + s_rand(&rng) % 250) * 1000);
        assert_int_equal(test_server_stop(&f->srv, SIGKILL), 128 + SIGKILL);
        assert_int_equal(test_server_start(&f->srv, fixed), 0);
    }
    usleep(300 * 1000);
    s_stop_grad_writers(th, &stop);

    f->cluster = s_patient_cluster(f->srv.endpoint);
    int total = s_check_writers(f->cluster, w);
    print_message("%d kills, %d acknowledged pushes, all present exactly once\n", KILLS, total);
    assert_true(total > KILLS);
}

typedef struct {
    const char *endpoint;
    int id;
    atomic_int *stop;
    atomic_int acked;
    int64_t *sent_at_ms;  /* when write j was first sent */
    int64_t *acked_at_ms; /* when its acknowledgement was read */
    int capacity;
} put_writer_t;

static void *s_put_writer(void *p)
{
    put_writer_t *w = p;
    kb_cluster_t *c = s_patient_cluster(w->endpoint);
    char name[32];
    while (!atomic_load(w->stop) && atomic_load(&w->acked) < w->capacity) {
        int n = atomic_load(&w->acked);
        snprintf(name, sizeof name, "p%d-%d", w->id, n);
        kb_key_t k = {name, strlen(name)};
        float v = (float)n;
        w->sent_at_ms[n] = carls_monotonic_ms();
        if (kb_cluster_put(c, "puts", &k, 1, 1, &v, 1) != 0)
            break;
        w->acked_at_ms[n] = carls_monotonic_ms();
        atomic_store(&w->acked, n + 1);
    }
    kb_cluster_destroy(&c);
    return NULL;
}

static void test_interval_kill9_loses_at_most_the_window(void **state)
{
    enum { INTERVAL_MS = 100, GRACE_MS = 1100, CAP = 200000, ROUNDS = 5 };
    server_fixture_t *f = *state;
    const char *args[] = {"--durability", "interval:100", NULL};
    server_fixture_start(f, args);
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = 1;
    assert_int_equal(kb_cluster_create_table(f->cluster, "puts", &cfg, false), 0);
    assert_int_equal(kb_cluster_checkpoint(f->cluster, NULL), 0);
    kb_cluster_destroy(&f->cluster);
    kb_client_destroy(&f->client);
    char endpoint[sizeof f->srv.endpoint]; /* the writers' own copy: a restart rewrites f->srv.endpoint */
    snprintf(endpoint, sizeof endpoint, "%s", f->srv.endpoint);
    const char *fixed[] = {"--durability", "interval:100", "--listen", endpoint, NULL};

    atomic_int stop = 0;
    put_writer_t w[WRITERS];
    pthread_t th[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        w[i].endpoint = endpoint;
        w[i].id = i;
        w[i].stop = &stop;
        atomic_init(&w[i].acked, 0);
        w[i].capacity = CAP;
        w[i].sent_at_ms = calloc(CAP, sizeof(int64_t));
        w[i].acked_at_ms = calloc(CAP, sizeof(int64_t));
        assert_int_equal(pthread_create(&th[i], NULL, s_put_writer, &w[i]), 0);
    }
    /* Each kill is kept as the moment SIGKILL was sent and the moment the server was seen dead. */
    int64_t killed_at[ROUNDS], dead_at[ROUNDS];
    unsigned rng = 7u;
    for (int round = 0; round < ROUNDS; round++) {
        /* Kills further apart than the window, so that writes from before each one are checked too. */
        usleep((useconds_t)(INTERVAL_MS + GRACE_MS + 200 + s_rand(&rng) % 800) * 1000);
        killed_at[round] = carls_monotonic_ms();
        assert_int_equal(test_server_stop(&f->srv, SIGKILL), 128 + SIGKILL);
        dead_at[round] = carls_monotonic_ms();
        assert_int_equal(test_server_start(&f->srv, fixed), 0);
    }
    usleep(300 * 1000);
    atomic_store(&stop, 1);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);

    /* A write must survive unless a kill may have taken it inside the window. The server that acknowledged
     * it was alive at some moment between its sending and the reading of its acknowledgement, so the kill
     * that may take it is the first one to end after it was sent; the write is required when it was
     * acknowledged more than the window before that kill began, or when no kill ends after it was sent (the
     * running server holds it). Sorting writes by the acknowledged count read at each kill instead raced: a
     * writer that had read its reply from the dying server but not yet counted it had that write judged as
     * the next server's, which must keep it, and a write acknowledged just before a kill was missing. */
    uint8_t *required[WRITERS];
    int counted[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        counted[i] = atomic_load(&w[i].acked);
        required[i] = calloc((size_t)counted[i] + 1, 1);
        for (int j = 0, k = 0; j < counted[i]; j++) {
            while (k < ROUNDS && dead_at[k] <= w[i].sent_at_ms[j])
                k++;
            required[i][j] = k == ROUNDS || w[i].acked_at_ms[j] <= killed_at[k] - (INTERVAL_MS + GRACE_MS);
        }
    }

    kb_cluster_t *c = f->cluster = s_patient_cluster(f->srv.endpoint);
    int checked = 0, survived_a_kill = 0, missing = 0;
    char name[32];
    for (int i = 0; i < WRITERS; i++) {
        for (int j = 0; j < counted[i]; j++) {
            if (!required[i][j])
                continue;
            survived_a_kill += w[i].acked_at_ms[j] < killed_at[ROUNDS - 1];
            snprintf(name, sizeof name, "p%d-%d", i, j);
            kb_key_t k = {name, strlen(name)};
            float v;
            kb_row_meta_t meta;
            assert_int_equal(kb_cluster_lookup_ex(c, "puts", &k, 1, 1, true, &v, &meta), 0);
            if (meta.version != 1 || v != (float)j) {
                if (missing < 5)
                    print_message("missing %s (sent at %lld ms, acknowledged at %lld ms): version %llu, value %g\n",
                                  name, (long long)w[i].sent_at_ms[j], (long long)w[i].acked_at_ms[j],
                                  (unsigned long long)meta.version, (double)v);
                missing++;
            }
            checked++;
        }
        free(w[i].sent_at_ms);
        free(w[i].acked_at_ms);
        free(required[i]);
    }
    print_message("interval: %d kills, %d writes outside the loss window checked (%d of them from before the "
                  "last kill), %d missing\n",
                  ROUNDS, checked, survived_a_kill, missing);
    assert_true(survived_a_kill > 0);
    assert_true(checked > survived_a_kill);
    assert_int_equal(missing, 0);
}


/* A moment a kill aims at: waits for it and says whether it came (false: gave up waiting). */
typedef bool (*s_moment_fn)(server_fixture_t *f);

/* Sync writers push (exactly-once, as in test_sync_kill9_twenty_times) while the server, started with args
 * (without --listen), is killed `rounds` times, each at the moment `moment` waits for; every kill must land
 * at that moment and every acknowledged push be present exactly once. `what` names the moment in the log. */
static void s_kill9_at(server_fixture_t *f, const char *const *args, int rounds, s_moment_fn moment,
                       const char *what)
{
    server_fixture_start(f, args);
    s_create_grad_tables(f->cluster);
    /* The writers get their own copy of the endpoint: a restart rewrites f->srv.endpoint while it waits. */
    char endpoint[sizeof f->srv.endpoint];
    snprintf(endpoint, sizeof endpoint, "%s", f->srv.endpoint);
    const char *fixed[16];
    int n = 0;
    while (args[n] && n < 13) {
        fixed[n] = args[n];
        n++;
    }
    assert_null(args[n]);
    fixed[n++] = "--listen";
    fixed[n++] = endpoint;
    fixed[n] = NULL;
    atomic_int stop = 0;
    grad_writer_t w[WRITERS];
    pthread_t th[WRITERS];
    s_start_grad_writers(w, th, endpoint, &stop);
    int during = 0;
    for (int round = 0; round < rounds; round++) {
        bool at_moment = moment(f);
        assert_int_equal(test_server_stop(&f->srv, SIGKILL), 128 + SIGKILL);
        during += at_moment;
        assert_int_equal(test_server_start(&f->srv, fixed), 0);
    }
    usleep(300 * 1000);
    s_stop_grad_writers(th, &stop);
    assert_int_equal(during, rounds);

    int total = s_check_writers(f->cluster, w);
    print_message("%d kills %s, %d acknowledged pushes, all present exactly once\n", during, what, total);
    assert_true(total > rounds);
}

/* Polls stats until the server says a compaction transaction is open (true), or gives up after 10 s. */
static bool s_compacting(server_fixture_t *f)
{
    for (int i = 0; i < 2000; i++) {
        Carls__Response *r = NULL;
        bool compacting = kb_cluster_stats(f->cluster, 0, NULL, &r) == 0 && r->stats->compacting;
        carls__response__free_unpacked(r, NULL);
        if (compacting)
            return true;
        usleep(5 * 1000);
    }
    return false;
}

static void test_sync_kill9_during_compaction(void **state)
{
    /* A compaction holds its transaction open 400 ms before it commits: the window the kills aim at. Each
     * kill comes once stats say `compacting`, within the few ms of one request. */
    setenv("CARLS_KB_TEST_COMPACTION_DELAY_MS", "400", 1);
    const char *args[] = {"--durability", "sync", "--compact-delay-ms", "100", NULL};
    s_kill9_at(*state, args, 6, s_compacting, "inside a compaction transaction");
    unsetenv("CARLS_KB_TEST_COMPACTION_DELAY_MS");
}

/* Whether the server's journal (<data dir>/db/journal) holds a segment written over a spare, waiting up to
 * 10 s for one; then 0-50 ms more, so kills land at different points of the segment's life. */
static bool s_reused_segment(server_fixture_t *f)
{
    static unsigned rng = 20261127u;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/db/journal", f->srv.data_dir);
    for (int i = 0; i < 1000; i++) {
        DIR *d = opendir(dir);
        bool found = false;
        struct dirent *e;
        while (d && (e = readdir(d)))
            found |= strstr(e->d_name, ".kbr") != NULL;
        if (d)
            closedir(d);
        if (found) {
            usleep((useconds_t)(s_rand(&rng) % 50) * 1000);
            return true;
        }
        usleep(10 * 1000);
    }
    return false;
}

static void test_sync_kill9_while_segments_are_reused(void **state)
{
    const char *args[] = {"--durability", "sync", "--journal-segment-bytes", "65536", "--compact-delay-ms", "20",
                          NULL};
    s_kill9_at(*state, args, 8, s_reused_segment, "with a reused journal segment in place");
}

int main(void)
{
    /* Every kill makes the clients log a reconnect; only errors are worth reading here. */
    carls_log_set_level(CARLS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        SERVER_FIXTURE_TEST(test_sync_kill9_twenty_times, &s_patient),
        SERVER_FIXTURE_TEST(test_interval_kill9_loses_at_most_the_window, &s_patient),
        SERVER_FIXTURE_TEST(test_sync_kill9_during_compaction, &s_patient),
        SERVER_FIXTURE_TEST(test_sync_kill9_while_segments_are_reused, &s_patient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
