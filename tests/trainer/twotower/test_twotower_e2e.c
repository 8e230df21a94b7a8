/* End to end: trainer twotower on a tiny dictionary in GCIDE's own format (an index with dictd base-64
 * numbers and an uncompressed .dict), through a real kb-server, with and without word-tower makers.
 *
 * The planted pattern: 40 made-up headwords, each with 4 senses; every sense of headword i holds one or two
 * of its two topic words (made up too, used by no other headword) among shared filler words. One sense of 20
 * headwords is held out. A model that learns anything maps a definition's topic words near its headword's
 * word-tower vector, so the held-out headwords must rank near the top (chance: R@1 = 0.025, R@10 = 0.25).
 *   - test_trainer_vectors: the trainer writes NAME.vec itself (--vectors trainer), linear heads (--hidden 0).
 *   - test_makers: two kb-maker --task words processes (worker 0/2 and 1/2) watch the trainer's checkpoint
 *     directory and write NAME.vec; the trainer draws --kb-negatives from it while it trains and evaluates on
 *     the makers' vectors of its final checkpoint (--vectors makers). The word tower also pools the headword's
 *     other definitions (--word-defs), so the makers must read the trainer's hold-out and leave it out. Both
 *     heads are MLPs (--hidden 8); the makers' vectors must equal the trainer's own word tower.
 *   - test_launcher: the same system started by `carls run experiments/twotower-quick.ini` (its own bank of
 *     two shards with CURVE keys, a fleet of two makers, the trainer), its result line, report and process
 *     table.
 *   - test_launcher_pairs: the same pattern as a user's TSV of query<TAB>document pairs and a candidates
 *     file (data = pairs:...), through the launcher with its makers: it must learn as well; a TSV with a bad
 *     line is refused naming the file and the line.
 *   - test_launcher_resume: a finished launcher run cut back to its second-newest checkpoint and continued
 *     with `carls run --resume`: the bank restored from that checkpoint's snapshot, trained to the end. */
#include "server_harness.h"

#include "util.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

#define TRAINER CARLS_BIN_DIR "/trainer"
#define MAKER CARLS_BIN_DIR "/kb-maker"
#define LAUNCHER CARLS_BIN_DIR "/carls"
#define N_HEAD 40
#define N_FILL 30

static void s_word(char *out, uint64_t *rng, int len)
{
    for (int i = 0; i < len; i++)
        out[i] = (char)('a' + carls_splitmix64(rng) % 26);
    out[len] = '\0';
}

/* dictd's base-64 digits. */
static void s_b64(char *out, uint64_t v)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = digits[v % 64];
        v /= 64;
    } while (v);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
}

/* Writes dir/tiny.index and dir/tiny.dict, and the same senses as pairs: dir/pairs.tsv (definition<TAB>
 * headword) with dir/candidates.txt (every headword, plus 10 that no query names). */
static void s_write_dictionary(const char *dir)
{
    char tsv[512];
    snprintf(tsv, sizeof tsv, "%s/pairs.tsv", dir);
    FILE *p = fopen(tsv, "w");
    snprintf(tsv, sizeof tsv, "%s/candidates.txt", dir);
    FILE *cand = fopen(tsv, "w");
    assert_non_null(p);
    assert_non_null(cand);
    char heads[N_HEAD][8], topics[N_HEAD][2][8], fill[N_FILL][8];
    uint64_t rng = 4242;
    for (int i = 0; i < N_HEAD; i++) {
        s_word(heads[i], &rng, 6);
        heads[i][0] = (char)('a' + i % 26); /* distinct first letters keep the index sorted-ish and unique */
        s_word(topics[i][0], &rng, 7);
        s_word(topics[i][1], &rng, 7);
    }
    for (int i = 0; i < N_FILL; i++)
        s_word(fill[i], &rng, 4);
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.dict", dir);
    FILE *d = fopen(path, "w");
    snprintf(path, sizeof path, "%s/tiny.index", dir);
    FILE *x = fopen(path, "w");
    assert_non_null(d);
    assert_non_null(x);
    for (int i = 0; i < N_HEAD; i++) {
        long start = ftell(d);
        char cap[8];
        strcpy(cap, heads[i]);
        cap[0] = (char)(cap[0] - 'a' + 'A');
        fprintf(d, "%s \\%s\\, n.\n", cap, heads[i]);
        fprintf(cand, "%s\n", heads[i]);
        for (int s = 0; s < 4; s++) {
            char def[256];
            int n = 0;
            for (int k = 0; k < 3; k++)
                n += snprintf(def + n, sizeof def - (size_t)n, "%s ", fill[carls_splitmix64(&rng) % N_FILL]);
            int which = (int)(carls_splitmix64(&rng) % 3); /* topic 0, topic 1 or both */
            if (which != 1)
                n += snprintf(def + n, sizeof def - (size_t)n, "%s ", topics[i][0]);
            if (which != 0)
                n += snprintf(def + n, sizeof def - (size_t)n, "%s ", topics[i][1]);
            snprintf(def + n, sizeof def - (size_t)n, "%s", fill[carls_splitmix64(&rng) % N_FILL]);
            fprintf(d, "   %d. %s.\n      [1913 Webster]\n\n", s + 1, def);
            fprintf(p, "%s\t%s\n", def, cap); /* documents are lowercased when read */
        }
        long end = ftell(d);
        char o[16], l[16];
        s_b64(o, (uint64_t)start);
        s_b64(l, (uint64_t)(end - start));
        fprintf(x, "%s\t%s\t%s\n", cap, o, l);
    }
    fclose(d);
    fclose(x);
    for (int i = 0; i < 10; i++) {
        char extra[8];
        s_word(extra, &rng, 6);
        fprintf(cand, "%sq\n", extra);
    }
    fclose(p);
    fclose(cand);
}

/* Runs argv with stdout to out_path; returns the pid. */
static pid_t s_spawn(const char *const *argv, const char *out_path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (out_path) {
            FILE *f = freopen(out_path, "w", stdout);
            (void)f;
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int s_wait(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The value of key in the last line of the file. */
static double s_result(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096], last[4096] = "";
    while (fgets(line, sizeof line, f))
        strcpy(last, line);
    fclose(f);
    char pat[64];
    snprintf(pat, sizeof pat, "%s=", key);
    const char *at = strstr(last, pat);
    while (at && at != last && at[-1] != ' ') /* "r1=" is not "fused_r1=" */
        at = strstr(at + 1, pat);
    if (!at) {
        print_error("no %s in the last line: %s\n", key, last);
        fail();
    }
    return atof(at + strlen(pat));
}

typedef struct {
    test_server_t srv;
    char dir[256];
    char index[300], dict[300], out[300], ckpt[300];
} s_env_t;

static void s_env(s_env_t *e)
{
    test_server_init(&e->srv);
    snprintf(e->dir, sizeof e->dir, "/tmp/carls-tt-XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    s_write_dictionary(e->dir);
    snprintf(e->index, sizeof e->index, "%s/tiny.index", e->dir);
    snprintf(e->dict, sizeof e->dict, "%s/tiny.dict", e->dir);
    snprintf(e->out, sizeof e->out, "%s/trainer.out", e->dir);
    snprintf(e->ckpt, sizeof e->ckpt, "%s/ckpt", e->dir);
    assert_int_equal(test_server_start(&e->srv, NULL), 0);
}

static void s_env_done(s_env_t *e)
{
    assert_int_equal(test_server_cleanup(&e->srv), 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    assert_int_equal(system(cmd), 0);
}

static void s_check_quality(const char *out)
{
    double r1 = s_result(out, "r1"), r10 = s_result(out, "r10"), n = s_result(out, "n");
    print_message("held out %.0f: r1=%.3f r10=%.3f knn_agree=%.3f\n", n, r1, r10, s_result(out, "knn_agree"));
    assert_true(n == 20);
    assert_true(r10 >= 0.7);  /* chance: 0.25 */
    assert_true(r1 >= 0.3);   /* chance: 0.025 */
    /* The bank's knn over NAME.vec (Flat, inner product) agrees with the exact ranking. */
    assert_true(s_result(out, "knn_agree") == 1.0);
}

static void test_trainer_vectors(void **state)
{
    (void)state;
    s_env_t e;
    s_env(&e);
    const char *argv[] = {TRAINER, "twotower", "--kb", e.srv.endpoint, "--index", e.index, "--dict", e.dict,
                          "--holdout-count", "20", "--holdout-seed", "3", "--dim", "16", "--out-dim", "16",
                          "--batch", "16", "--epochs", "40", "--emb-lr", "0.05", "--lr", "0.01",
                          "--token-dropout", "0.2", "--knn-check", "20", "--hidden", "0", "--kb-timeout-ms", "2000",
                          NULL};
    assert_int_equal(s_wait(s_spawn(argv, e.out)), 0);
    s_check_quality(e.out);
    s_env_done(&e);
}

static void test_makers(void **state)
{
    (void)state;
    s_env_t e;
    s_env(&e);
    char vectors[320], out2[320];
    snprintf(vectors, sizeof vectors, "%s/vectors.bin", e.dir);
    snprintf(out2, sizeof out2, "%s/eval.out", e.dir);
    pid_t makers[2];
    for (int w = 0; w < 2; w++) {
        char worker[16];
        snprintf(worker, sizeof worker, "%d/2", w);
        const char *margv[] = {MAKER, "--kb", e.srv.endpoint, "--task", "words", "--tables", "tt",
                               "--ckpt-dir", e.ckpt, "--worker", worker, "--gcide-index", e.index,
                               "--gcide-dict", e.dict, "--poll-ms", "50", NULL};
        makers[w] = s_spawn(margv, NULL);
    }
    const char *argv[] = {TRAINER, "twotower", "--kb", e.srv.endpoint, "--index", e.index, "--dict", e.dict,
                          "--holdout-count", "20", "--holdout-seed", "3", "--dim", "16", "--out-dim", "16",
                          "--batch", "16", "--epochs", "40", "--emb-lr", "0.05", "--lr", "0.01",
                          "--token-dropout", "0.2", "--kb-negatives", "16", "--ckpt-dir", e.ckpt,
                          "--ckpt-every", "20", "--vectors", "makers", "--word-defs", "2", "--wait-fresh-s", "60", "--knn-check", "20",
                          "--hard-queries", "4", "--hard-k", "4", "--save-vectors", vectors, "--hidden", "8",
                          "--kb-timeout-ms", "2000", "--stale-positives", "0.5", "--negatives-shift", "1", NULL};
    int rc = s_wait(s_spawn(argv, e.out));
    for (int w = 0; w < 2; w++) {
        kill(makers[w], SIGTERM);
        assert_int_equal(s_wait(makers[w]), 0);
    }
    assert_int_equal(rc, 0);
    s_check_quality(e.out);
    /* The makers read the MLP heads from the checkpoints: their vectors are the trainer's own word tower. */
    print_message("makers' vectors against the trainer's word tower: max difference %g\n",
                  s_result(e.out, "maker_max_diff"));
    assert_true(s_result(e.out, "maker_max_diff") >= 0);
    assert_true(s_result(e.out, "maker_max_diff") < 1e-4);
    /* Bank negatives were used: the makers wrote vectors while the trainer trained, so most steps had them,
     * and they came from checkpoints a bounded number of steps old. */
    double unavailable = s_result(e.out, "neg_unavailable"), steps = s_result(e.out, "train_steps");
    print_message("steps %.0f, steps without bank negatives %.0f, staleness %.1f steps\n", steps, unavailable,
                  s_result(e.out, "neg_staleness_steps"));
    assert_true(unavailable < steps / 2);
    assert_true(s_result(e.out, "neg_staleness_steps") > 0);
    /* What that staleness means, measured on a sample recomputed from current rows: the inputs have moved
     * (they are older), but they are the same words' inputs, not unrelated vectors. */
    double xcos = s_result(e.out, "neg_input_cos"), vcos = s_result(e.out, "neg_vector_cos");
    print_message("bank negatives against their current towers: input cosine %.3f, norm ratio %.3f, vector cosine "
                  "%.3f\n", xcos, s_result(e.out, "neg_input_norm_ratio"), vcos);
    assert_true(xcos > 0.0 && xcos <= 1.0 + 1e-6);
    assert_true(vcos > 0.0 && vcos <= 1.0 + 1e-6);
    assert_true(s_result(e.out, "neg_input_norm_ratio") > 0);
    /* The same with the common drift taken out (centred inputs; inputs moved by the difference of means). */
    double ccos = s_result(e.out, "neg_centred_input_cos"), scos = s_result(e.out, "neg_shifted_vector_cos");
    print_message("centred input cosine %.3f, shifted vector cosine %.3f\n", ccos, scos);
    assert_true(ccos > -1.0 - 1e-6 && ccos <= 1.0 + 1e-6);
    assert_true(scos > -1.0 - 1e-6 && scos <= 1.0 + 1e-6);
    /* --negatives-shift moved the negatives by a measured drift; --stale-positives 0.5 gave about half of the
     * batch's headwords (those the makers had written) their makers' inputs. */
    double shift = s_result(e.out, "neg_shift_ratio"), share = s_result(e.out, "stale_positives_share");
    print_message("negatives shifted by %.3f of an input's norm; stale positives share %.3f\n", shift, share);
    assert_true(shift > 0);
    assert_true(share > 0.35 && share < 0.65);
    /* Hard negatives: most steps had some, near the queries, from the makers' inputs. */
    print_message("hard negatives per step %.1f, staleness %.1f steps, steps without %.0f\n",
                  s_result(e.out, "hard_per_step"), s_result(e.out, "hard_staleness_steps"),
                  s_result(e.out, "hard_unavailable"));
    assert_true(s_result(e.out, "hard_per_step") > 1);
    assert_true(s_result(e.out, "hard_unavailable") < steps / 2);
    /* The saved vectors evaluate alone (no bank) to the same model ranking; BM25 fusion reported. */
    const char *eargv[] = {TRAINER, "twotower", "--index", e.index, "--dict", e.dict, "--holdout-count", "20",
                           "--holdout-seed", "3", "--out-dim", "16", "--eval-vectors", vectors, "--lexical", "bm25",
                           "--fuse-tfidf", "1", "--fuse-sweep", "0.5,2", NULL};
    assert_int_equal(s_wait(s_spawn(eargv, out2)), 0);
    assert_float_equal(s_result(out2, "r1"), s_result(e.out, "r1"), 0);
    assert_float_equal(s_result(out2, "r10"), s_result(e.out, "r10"), 0);
    assert_float_equal(s_result(out2, "mrr"), s_result(e.out, "mrr"), 0);
    assert_true(s_result(out2, "fused_r10") >= 0);
    /* Another hold-out does not match the file. */
    const char *bargv[] = {TRAINER, "twotower", "--index", e.index, "--dict", e.dict, "--holdout-count", "20",
                           "--holdout-seed", "4", "--out-dim", "16", "--eval-vectors", vectors, NULL};
    assert_int_equal(s_wait(s_spawn(bargv, NULL)), 1);
    /* The file is a checkpoint: one byte changed in its vectors fails its CRC-32, and the evaluation refuses it. */
    FILE *vf = fopen(vectors, "r+b");
    assert_non_null(vf);
    assert_int_equal(fseek(vf, -64, SEEK_END), 0);
    int byte = fgetc(vf);
    assert_true(byte != EOF);
    assert_int_equal(fseek(vf, -64, SEEK_END), 0);
    assert_true(fputc(byte ^ 0x5a, vf) != EOF);
    assert_int_equal(fclose(vf), 0);
    assert_int_equal(s_wait(s_spawn(eargv, NULL)), 1); /* the old raw file took the changed float as it was */
    s_env_done(&e);
}

/* Options that act on the makers' pooled inputs are refused, with a usage error (exit 2), where the negatives
 * are the makers' finished vectors: they would silently do nothing. */
static void test_inputs_only_options(void **state)
{
    (void)state;
    const char *const bad[][2] = {{"--stale-positives", "0.5"}, {"--negatives-shift", "1"}};
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {TRAINER, "twotower", "--negatives-from", "outputs", bad[i][0], bad[i][1], NULL};
        assert_int_equal(s_wait(s_spawn(argv, NULL)), 2);
    }
    const char *range[] = {TRAINER, "twotower", "--stale-positives", "1.5", NULL};
    assert_int_equal(s_wait(s_spawn(range, NULL)), 2);
}

#define S_MAX_SETS 24

/* argv of `carls run experiments/twotower-quick.ini --quiet` with --set kv[i] for each of the n settings,
 * each formatted with dir (%1$s); set keeps the strings. */
static void s_launcher_argv(const char *dir, const char *const *kv, int n, char (*set)[700], const char **argv)
{
    assert_true(n <= S_MAX_SETS);
    int a = 0;
    argv[a++] = LAUNCHER;
    argv[a++] = "run";
    argv[a++] = CARLS_SOURCE_DIR "/experiments/twotower-quick.ini";
    argv[a++] = "--quiet";
    for (int i = 0; i < n; i++) {
        snprintf(set[i], sizeof set[i], kv[i], dir);
        argv[a++] = "--set";
        argv[a++] = set[i];
    }
    argv[a] = NULL;
}

static void test_launcher(void **state)
{
    (void)state;
    s_env_t e;
    s_env(&e); /* its bank is not used: the launcher starts its own */
    char set[S_MAX_SETS][700];
    /* Bank negatives drawn as training pairs are (negatives_sampling = pairs), and hard ones computed by the
     * trainer from their current rows (hard_fresh). The bank has two shards and speaks CURVE only: the word
     * makers, the negatives, the hard negatives' knn and the evaluation all go through the sharded client with
     * the run's keys. */
    const char *kv[] = {"gcide_index=%1$s/tiny.index", "gcide_dict=%1$s/tiny.dict", "runs_dir=%1$s", "name=run",
                        "holdout_count=20", "holdout_seed=3", "dim=16", "out_dim=16", "batch=16", "epochs=40",
                        "emb_lr=0.05", "lr=0.01", "token_dropout=0.2", "kb_negatives=16", "ckpt_every=20",
                        "word_defs=2", "hard_queries=4", "hard_k=4", "hard_fresh=1", "negatives_sampling=pairs",
                        "shards=2", "curve=on"};
    const char *argv[8 + 2 * S_MAX_SETS];
    s_launcher_argv(e.dir, kv, 22, set, argv);
    assert_int_equal(s_wait(s_spawn(argv, e.out)), 0);
    s_check_quality(e.out);
    assert_true(s_result(e.out, "bank_restarts") == 0);
    print_message("launcher: hard negatives per step %.1f; bank negatives missing on %.0f of %.0f steps, %.1f steps "
                  "old\n", s_result(e.out, "hard_per_step"), s_result(e.out, "neg_unavailable"),
                  s_result(e.out, "train_steps"), s_result(e.out, "neg_staleness_steps"));
    assert_true(s_result(e.out, "neg_unavailable") < s_result(e.out, "train_steps") / 2);
    assert_true(s_result(e.out, "neg_staleness_steps") > 0);
    assert_true(s_result(e.out, "hard_per_step") > 1);
    char path[400];
    struct stat st;
    snprintf(path, sizeof path, "%s/run/report.md", e.dir);
    assert_int_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/run/processes.tsv", e.dir);
    assert_int_equal(stat(path, &st), 0);
    /* Every process it started: the bank's two shards, two makers and the trainer. */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(grep -c -E 'kb-server [01]/2|maker words|trainer' '%s') -ge 5", path);
    assert_int_equal(system(cmd), 0);
    assert_true(s_result(e.out, "shards") == 2 && s_result(e.out, "curve") == 1);
    s_env_done(&e);
}

static void test_launcher_pairs(void **state)
{
    (void)state;
    s_env_t e;
    s_env(&e); /* its bank is not used: the launcher starts its own */
    char set[S_MAX_SETS][700];
    const char *kv[] = {"data=pairs:%1$s/pairs.tsv,%1$s/candidates.txt", "runs_dir=%1$s", "name=pairs",
                        "holdout_count=20", "holdout_seed=3", "dim=16", "out_dim=16", "batch=16", "epochs=40",
                        "emb_lr=0.05", "lr=0.01", "token_dropout=0.2", "kb_negatives=16", "ckpt_every=20",
                        "word_defs=2", "makers=1"};
    const char *argv[8 + 2 * S_MAX_SETS];
    s_launcher_argv(e.dir, kv, 16, set, argv);
    assert_int_equal(s_wait(s_spawn(argv, e.out)), 0);
    s_check_quality(e.out);
    char path[400];
    snprintf(path, sizeof path, "%s/pairs/logs/trainer.log", e.dir);
    char cmd[900];
    /* 40 documents of the pairs and 10 more candidates: 50 ranked */
    snprintf(cmd, sizeof cmd, "grep -q 'pairs.tsv,.*candidates.txt: 50 headwords, 160 senses' '%s'", path);
    assert_int_equal(system(cmd), 0);
    /* a bad line: refused before training, naming the file and the line */
    snprintf(path, sizeof path, "%s/bad.tsv", e.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("a query\tdoc\nno tab on this line\n", f);
    fclose(f);
    snprintf(set[0], sizeof set[0], "data=pairs:%s", path);
    snprintf(set[2], sizeof set[2], "name=bad");
    char bad_out[400];
    snprintf(bad_out, sizeof bad_out, "%s/bad.out", e.dir);
    assert_int_not_equal(s_wait(s_spawn(argv, bad_out)), 0);
    snprintf(cmd, sizeof cmd, "grep -rq 'bad.tsv: line 2: expected QUERY<TAB>DOCUMENT' '%s/bad/logs'", e.dir);
    assert_int_equal(system(cmd), 0);
    s_env_done(&e);
}

/* `carls run --resume` of a twotower run: the finished run's directory as a kill after its second-newest
 * checkpoint leaves it (the newest checkpoint gone). The launcher must restore the bank from that checkpoint's
 * snapshot (the rows the trainer trains are there), restart the makers and resume the trainer from it to the
 * end, saying where it resumed. */
static void test_launcher_resume(void **state)
{
    (void)state;
    s_env_t e;
    s_env(&e); /* its bank is not used: the launcher starts its own */
    char set[S_MAX_SETS][700];
    /* 140 training pairs: 8 steps an epoch, 80 steps, checkpoints (and snapshots) at 20, 40, 60, 80; the
     * newest two pairs are kept. */
    const char *kv[] = {"data=pairs:%1$s/pairs.tsv,%1$s/candidates.txt", "runs_dir=%1$s", "name=res",
                        "holdout_count=20", "holdout_seed=3", "dim=16", "out_dim=16", "batch=16", "epochs=10",
                        "emb_lr=0.05", "lr=0.01", "kb_negatives=16", "ckpt_every=20", "word_defs=2", "makers=1"};
    const char *argv[8 + 2 * S_MAX_SETS];
    s_launcher_argv(e.dir, kv, 15, set, argv);
    assert_int_equal(s_wait(s_spawn(argv, e.out)), 0);
    assert_true(s_result(e.out, "train_steps") == 80);
    char path[600], run[400], out[400], cmd[2000];
    snprintf(run, sizeof run, "%s/res", e.dir);
    snprintf(path, sizeof path, "%s/kb/snapshots/res-step60/MANIFEST", run);
    assert_int_equal(access(path, R_OK), 0);
    snprintf(path, sizeof path, "%s/ckpt/ckpt-000000000080.ckpt", run);
    assert_int_equal(unlink(path), 0);
    snprintf(out, sizeof out, "%s/resumed.out", e.dir);
    const char *rargv[] = {LAUNCHER, "run", "--resume", run, "--quiet", NULL};
    assert_int_equal(s_wait(s_spawn(rargv, out)), 0);
    snprintf(cmd, sizeof cmd, "grep -q 'resumed from step 60 (checkpoint .*ckpt-000000000060.ckpt, snapshot res-step60)' "
                              "'%s' && grep -q 'resumed_from_step=60 ' '%s/trainer.out' && grep -q 'resumed from "
                              "step 60' '%s/report.md'", out, run, run);
    assert_int_equal(system(cmd), 0);
    assert_true(s_result(out, "train_steps") == 80);
    assert_true(s_result(out, "n") == 20);
    snprintf(path, sizeof path, "%s/ckpt/ckpt-000000000080.ckpt", run);
    assert_int_equal(access(path, R_OK), 0);
    s_env_done(&e);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_trainer_vectors),
    cmocka_unit_test(test_makers),
    cmocka_unit_test(test_inputs_only_options),
    cmocka_unit_test(test_launcher),
    cmocka_unit_test(test_launcher_pairs),
    cmocka_unit_test(test_launcher_resume))
