/* End to end: trainer word2vec on a tiny corpus with a planted pattern, through a real kb-server.
 *
 * The corpus has Zipf-distributed filler sentences plus planted ones: "alpha" and "omega" never meet, but
 * each appears only between the same context words (cxa..cxf); likewise "beta" and "gamma" (cya..cyf). Words
 * with the same contexts get similar input vectors, so after training alpha's nearest neighbour must be omega
 * (and the reverse, and beta/gamma), both in the exported file and through the bank's knn; the top-k
 * prediction of context words (knn over the output table) answers k words. "hapax" appears
 * twice: below --min-count 5 it must never reach the vector table (admission). Two trainers (--worker 0/2 and
 * 1/2) train at once; a second test kills the bank (SIGKILL) mid-training and restarts it on the same data
 * directory and endpoint, and the trainer must finish and still learn the pattern. */
#include "server_harness.h"
#include "trainer_w2v.h"

#include "files.h"
#include "kb_cluster.h"
#include "util.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define TRAINER CARLS_BIN_DIR "/trainer"

static void s_write_corpus(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    uint64_t rng = 12345;
    /* Zipf weights over 120 fillers. */
    double cum[120], total = 0;
    for (int i = 0; i < 120; i++) {
        total += 1.0 / (i + 1);
        cum[i] = total;
    }
    for (int s = 0; s < 1600; s++) {
        int len = 6 + (int)(carls_splitmix64(&rng) % 6);
        for (int k = 0; k < len; k++) {
            double u = (double)(carls_splitmix64(&rng) >> 11) * 0x1.0p-53 * total;
            int w = 0;
            while (w < 119 && cum[w] < u)
                w++;
            fprintf(f, "%sf%c%c", k ? " " : "", 'a' + w / 26, 'a' + w % 26);
        }
        fputc('\n', f);
        if (s % 4 == 0) {
            /* a planted sentence: two fillers, c? c? X c? c?, two fillers */
            static const char *const planted[4] = {"alpha", "omega", "beta", "gamma"};
            int which = (s / 4) % 4;
            char ctx = which < 2 ? 'x' : 'y';
            char c[4];
            for (int j = 0; j < 4; j++)
                c[j] = (char)('a' + carls_splitmix64(&rng) % 6);
            fprintf(f, "fa%c fb%c c%c%c c%c%c %s c%c%c c%c%c fc%c fd%c\n", 'a' + (int)(carls_splitmix64(&rng) % 26),
                    'a' + (int)(carls_splitmix64(&rng) % 26), ctx, c[0], ctx, c[1], planted[which], ctx, c[2], ctx,
                    c[3], 'a' + (int)(carls_splitmix64(&rng) % 20), 'a' + (int)(carls_splitmix64(&rng) % 20));
        }
    }
    fprintf(f, "fab fac hapax fad\nfae hapax faf\n");
    fclose(f);
}

/* Starts the trainer with the common options plus extra (NULL-terminated); stdout to out_path. */
static pid_t s_trainer(const char *endpoint, const char *corpus, const char *out_path, const char *const *extra)
{
    const char *argv[64];
    int n = 0;
    const char *common[] = {TRAINER, "word2vec", "--corpus", corpus, "--kb", endpoint, "--table", "w2vt",
                            "--dim", "24", "--window", "3", "--negatives", "5", "--epochs", "12",
                            "--subsample", "0", "--batch-tokens", "1024", "--pool", "512", "--lr", "0.3",
                            "--kb-timeout-ms", "1000", "--kb-retries", "60", NULL};
    for (int i = 0; common[i]; i++)
        argv[n++] = common[i];
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout))
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int s_wait_exit(pid_t pid)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The nearest key to `key` in `table` by the bank's knn (own row excluded; shards merged). */
static void s_knn_top(kb_cluster_t *kb, const char *table, const char *key, char *out, size_t outlen)
{
    kb_key_t k = {key, strlen(key)};
    kb_knn_result_t *res = NULL;
    assert_int_equal(kb_cluster_knn_by_key(kb, table, &k, 1, 1, true, &res), 0);
    assert_int_equal(res->nq, 1);
    snprintf(out, outlen, "%.*s", (int)res->keys[0].len, (const char *)res->keys[0].data);
    kb_knn_result_destroy(&res);
}

/* Checks the planted pattern in an exported file and through the bank. counts_kept: no crash happened, so
 * the bank's use counts are whole and the most frequent word comes first. After a kill -9 the counts of
 * reads since the last bulk write of counts are lost (docs/RELIABILITY.md, "Use counts"), so the order of
 * close counts may change and only the learned pattern is checked. */
static void s_check_learned(const char *endpoint, const char *vec_path, bool counts_kept)
{
    char err[256];
    w2v_vectors_t *v = NULL;
    assert_int_equal(w2v_vectors_read(vec_path, &v, err, sizeof err), 0);
    assert_int_equal(v->dim, 24);
    assert_true(v->n >= 120 && v->n <= 140);
    assert_int_equal(w2v_vectors_find(v, "hapax"), -1); /* admission kept it out */
    if (counts_kept)
        assert_string_equal(v->words[0], "faa"); /* most counted first */
    w2v_vectors_normalize(v);
    static const char *const pairs[4][2] = {{"alpha", "omega"}, {"omega", "alpha"}, {"beta", "gamma"},
                                            {"gamma", "beta"}};
    for (int i = 0; i < 4; i++) {
        int64_t r = w2v_vectors_find(v, pairs[i][0]);
        assert_true(r >= 0);
        uint32_t top[3];
        float sc[3];
        assert_int_equal(w2v_vectors_nearest(v, (uint32_t)r, 3, top, sc), 3);
        printf("  %s: %s(%.3f) %s(%.3f) %s(%.3f)\n", pairs[i][0], v->words[top[0]], sc[0], v->words[top[1]], sc[1],
               v->words[top[2]], sc[2]);
        assert_string_equal(v->words[top[0]], pairs[i][1]);
    }
    w2v_vectors_destroy(&v);

    kb_cluster_t *kb = kb_cluster_new(endpoint, NULL);
    assert_non_null(kb);
    char top[64];
    s_knn_top(kb, "w2vt", "alpha", top, sizeof top);
    assert_string_equal(top, "omega");
    s_knn_top(kb, "w2vt", "gamma", top, sizeof top);
    assert_string_equal(top, "beta");
    /* hapax has no vector row (admission). */
    kb_key_t hk = {"hapax", 5};
    float val[24];
    kb_row_meta_t meta;
    assert_int_equal(kb_cluster_lookup_ex(kb, "w2vt", &hk, 1, 24, true, val, &meta), 0);
    assert_int_equal(meta.frequency, 0);
    kb_cluster_destroy(&kb);
}

/* Per test: the server and the trainers started, stopped by the teardown even when an assertion failed. */
typedef struct {
    test_server_t srv;
    test_server_t srv2; /* second shard (test_sharded_bank) */
    pid_t trainers[8];
    int n_trainers;
} s_fixture_t;

static int s_setup(void **state)
{
    s_fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    test_server_init(&f->srv);
    test_server_init(&f->srv2);
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    s_fixture_t *f = *state;
    for (int i = 0; i < f->n_trainers; i++) {
        if (f->trainers[i] > 0 && kill(f->trainers[i], SIGKILL) == 0)
            waitpid(f->trainers[i], NULL, 0);
    }
    int rc = test_server_cleanup(&f->srv);
    if (test_server_cleanup(&f->srv2) != 0)
        rc = -1;
    free(f);
    return rc == 0 ? 0 : -1;
}

/* Waits for a trainer the fixture started; forgets it. */
static int s_join(s_fixture_t *f, pid_t pid)
{
    int rc = s_wait_exit(pid);
    for (int i = 0; i < f->n_trainers; i++)
        if (f->trainers[i] == pid)
            f->trainers[i] = 0;
    return rc;
}

static pid_t s_start(s_fixture_t *f, const char *endpoint, const char *corpus, const char *out_path,
                     const char *const *extra)
{
    pid_t pid = s_trainer(endpoint, corpus, out_path, extra);
    if (f->n_trainers < 8)
        f->trainers[f->n_trainers++] = pid;
    return pid;
}

/* The files of a test, in the first server's data directory. */
typedef struct {
    char corpus[400]; /* written by s_write_files */
    char corpus_dir[400]; /* the same corpus as a directory: its first half in a.txt, the rest in sub/b.txt */
    char vec[400];    /* an export */
    char out0[400];   /* trainer 0's output */
    char out1[400];   /* trainer 1's output */
} s_files_t;

/* Names the files of a test in srv's data directory and writes the corpus. */
static void s_write_files(const test_server_t *srv, s_files_t *files)
{
    snprintf(files->corpus, sizeof files->corpus, "%s/corpus.txt", srv->data_dir);
    snprintf(files->vec, sizeof files->vec, "%s/w2vt.vec", srv->data_dir);
    snprintf(files->out0, sizeof files->out0, "%s/trainer0.out", srv->data_dir);
    snprintf(files->out1, sizeof files->out1, "%s/trainer1.out", srv->data_dir);
    s_write_corpus(files->corpus);
    /* The directory form: two files whose lines together are the corpus's, and a hidden file that is no text
     * (skipped: names starting with '.' are not read). */
    snprintf(files->corpus_dir, sizeof files->corpus_dir, "%s/corpus.d", srv->data_dir);
    char path[500];
    snprintf(path, sizeof path, "%s/sub", files->corpus_dir);
    assert_int_equal(carls_mkdir_p(path, 0755, NULL, 0), 0);
    FILE *in = fopen(files->corpus, "r");
    assert_non_null(in);
    char line[4096];
    int n = 0;
    FILE *out = NULL;
    while (fgets(line, sizeof line, in)) {
        if (n == 0 || n == 800) {
            if (out)
                fclose(out);
            snprintf(path, sizeof path, n ? "%s/sub/b.txt" : "%s/a.txt", files->corpus_dir);
            out = fopen(path, "w");
            assert_non_null(out);
        }
        fputs(line, out);
        n++;
    }
    fclose(out);
    fclose(in);
    snprintf(path, sizeof path, "%s/.hidden", files->corpus_dir);
    out = fopen(path, "w");
    assert_non_null(out);
    fputs("\xff\xfe not text\n", out);
    fclose(out);
}

/* Starts the fixture's (first) server with the given durability and writes the test's files. */
static test_server_t *s_start_bank(s_fixture_t *fx, const char *durability, s_files_t *files)
{
    const char *args[] = {"--durability", durability, NULL};
    assert_int_equal(test_server_start(&fx->srv, args), 0);
    s_write_files(&fx->srv, files);
    return &fx->srv;
}

static void test_two_trainers_learn_planted_pairs(void **state)
{
    s_fixture_t *fx = *state;
    s_files_t files;
    test_server_t *srv = s_start_bank(fx, "interval:200", &files);

    int64_t t0 = carls_monotonic_ms();
    const char *w0[] = {"--worker", "0/2", NULL};
    const char *w1[] = {"--worker", "1/2", NULL};
    pid_t p0 = s_start(fx, srv->endpoint, files.corpus, files.out0, w0);
    pid_t p1 = s_start(fx, srv->endpoint, files.corpus, files.out1, w1);
    assert_int_equal(s_join(fx, p0), 0);
    assert_int_equal(s_join(fx, p1), 0);
    printf("  two trainers: %lld ms\n", (long long)(carls_monotonic_ms() - t0));

    /* Export and top-k prediction without training (--epochs 0), as a user would after the workers end. */
    const char *ex[] = {"--epochs", "0", "--export", files.vec, "--predict", "alpha,beta", "--predict-k", "6",
                        "--predict-eval", "400", NULL};
    pid_t pe = s_start(fx, srv->endpoint, files.corpus, files.out0, ex);
    assert_int_equal(s_join(fx, pe), 0);
    s_check_learned(srv->endpoint, files.vec, true);

    /* Top-k output (the bank's knn over the output table, then re-ranked with the counts' prior): k words
     * per query, and the context-prediction score line. */
    FILE *f = fopen(files.out0, "r");
    assert_non_null(f);
    char line[2048];
    int seen_predict = 0, seen_eval = 0;
    while (fgets(line, sizeof line, f)) {
        printf("  %s", line);
        if (strncmp(line, "predict alpha:", 14) == 0 || strncmp(line, "predict+prior alpha:", 20) == 0) {
            seen_predict++;
            int words = 0;
            for (const char *p = line; (p = strchr(p, '(')) != NULL; p++)
                words++;
            assert_int_equal(words, 6);
        }
        double hit, hitp, base;
        if (sscanf(line, "predict_eval pairs=%*u k=6 hit_ip=%lf hit_ip_prior=%lf most_frequent_baseline=%lf", &hit,
                   &hitp, &base) == 3) {
            seen_eval = 1;
            assert_true(hit >= 0 && hit <= 1 && hitp >= 0 && hitp <= 1 && base > 0 && base <= 1);
        }
    }
    fclose(f);
    assert_true(seen_predict == 2 && seen_eval);
}

static void test_bank_restart_mid_training(void **state)
{
    s_fixture_t *fx = *state;
    s_files_t files;
    test_server_t *srv = s_start_bank(fx, "interval:100", &files);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", srv->endpoint);

    /* Long enough (about 3 s without sanitizers) that the kill lands mid-training. */
    const char *more[] = {"--epochs", "60", NULL};
    pid_t p = s_start(fx, endpoint, files.corpus, files.out0, more);
    /* Once the trainer has pushed gradients, kill the bank without warning and bring it back on the same
     * address. */
    kb_client_options_t quick = {.timeout_ms = 500};
    kb_cluster_t *kb = kb_cluster_new(endpoint, &quick);
    assert_non_null(kb);
    uint64_t pushed = 0;
    for (int i = 0; i < 2000 && pushed == 0; i++) {
        Carls__Response *st = NULL;
        if (kb_cluster_stats(kb, 0, "w2vt", &st) == 0 && st->stats->n_tables == 1)
            pushed = st->stats->tables[0]->gradients_received;
        if (st)
            carls__response__free_unpacked(st, NULL);
        struct timespec poll = {0, 10000000};
        nanosleep(&poll, NULL);
    }
    kb_cluster_destroy(&kb);
    assert_true(pushed > 0);
    /* Three commit intervals more, so the tables themselves are on disk (a crash within the durability
     * interval may lose acknowledged writes, table creation included: docs/PROTOCOL.md). */
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    assert_int_equal(waitpid(p, NULL, WNOHANG), 0); /* still training */
    ts.tv_nsec = 500000000;
    int st = test_server_stop(srv, SIGKILL);
    assert_int_equal(st, 128 + SIGKILL);
    nanosleep(&ts, NULL);
    const char *again[] = {"--durability", "interval:100", "--listen", endpoint, NULL};
    assert_int_equal(test_server_start(srv, again), 0);
    assert_string_equal(srv->endpoint, endpoint);
    assert_int_equal(s_join(fx, p), 0);

    const char *ex[] = {"--epochs", "0", "--export", files.vec, NULL};
    assert_int_equal(s_join(fx, s_start(fx, endpoint, files.corpus, files.out1, ex)), 0);
    s_check_learned(endpoint, files.vec, false);
}

/* A bank of two shards (--shard 0/2, 1/2): --kb takes both endpoints, keys are routed by their hash,
 * negatives are sampled across both by mass, export and knn merge the shards. The corpus is given as a
 * directory of text files here. */
static void test_sharded_bank(void **state)
{
    s_fixture_t *fx = *state;
    const char *a0[] = {"--durability", "interval:200", "--shard", "0/2", NULL};
    const char *a1[] = {"--durability", "interval:200", "--shard", "1/2", NULL};
    assert_int_equal(test_server_start(&fx->srv, a0), 0);
    assert_int_equal(test_server_start(&fx->srv2, a1), 0);
    s_files_t files;
    s_write_files(&fx->srv, &files);
    char endpoints[600];
    snprintf(endpoints, sizeof endpoints, "%s,%s", fx->srv.endpoint, fx->srv2.endpoint);
    const char *w0[] = {"--worker", "0/2", NULL};
    const char *w1[] = {"--worker", "1/2", NULL};
    pid_t p0 = s_start(fx, endpoints, files.corpus_dir, files.out0, w0);
    pid_t p1 = s_start(fx, endpoints, files.corpus_dir, files.out1, w1);
    assert_int_equal(s_join(fx, p0), 0);
    assert_int_equal(s_join(fx, p1), 0);
    const char *ex[] = {"--epochs", "0", "--export", files.vec, NULL};
    assert_int_equal(s_join(fx, s_start(fx, endpoints, files.corpus_dir, files.out0, ex)), 0);
    s_check_learned(endpoints, files.vec, true);
    /* Both shards hold part of the vocabulary. */
    for (int i = 0; i < 2; i++) {
        kb_cluster_t *kb = kb_cluster_new(i ? fx->srv2.endpoint : fx->srv.endpoint, NULL);
        assert_non_null(kb);
        Carls__Response *st = NULL;
        assert_int_equal(kb_cluster_stats(kb, 0, "w2vt", &st), 0);
        assert_int_equal(st->stats->n_tables, 1);
        printf("  shard %d: %llu rows\n", i, (unsigned long long)st->stats->tables[0]->rows);
        assert_true(st->stats->tables[0]->rows > 30);
        carls__response__free_unpacked(st, NULL);
        kb_cluster_destroy(&kb);
    }
}

static void test_bad_usage(void **state)
{
    (void)state;
    char out[] = "/tmp/w2v-usage-XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    const char *bad[][4] = {{"--worker", "2/2", NULL}, {"--dim", "0", NULL}, {"--table", "a b", NULL},
                            {"--admission", "maybe", NULL}};
    for (int i = 0; i < 4; i++)
        assert_int_equal(s_wait_exit(s_trainer("tcp://127.0.0.1:1", "/nonexistent", out, bad[i])), 2);
    const char *missing[] = {NULL};
    assert_int_equal(s_wait_exit(s_trainer("tcp://127.0.0.1:1", "/nonexistent", out, missing)), 1);
    unlink(out);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test_setup_teardown(test_two_trainers_learn_planted_pairs, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bank_restart_mid_training, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sharded_bank, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
