/* Bring your own data: a data set of Gaussian clusters as .npy files (made with NumPy by /usr/bin/python3 when
 * python3-numpy is installed, else written by base/npy's writer, which the output says) trains through
 * `carls run` with the graph-regularized experiment (data = npy:..., test_data = npy:..., pixel_features = raw;
 * makers embed, build the graph and spread labels as for Fashion-MNIST) and reaches the accuracy the clusters
 * allow (they are 6 standard deviations apart: above 0.95). Then a labels file with a label out of range is
 * refused before anything trains, with a message naming the file and the row. Last, a run with metrics_port
 * set is scraped while it trains: every target in its prometheus-targets.json (the bank, the trainer, the
 * embed maker) must serve a page that `promtool check metrics` accepts (skipped, saying so, without
 * promtool); then it is interrupted. The same clusters also go through the default experiments/graphreg.ini
 * (HOG features, a convolutional encoder and shifted images, all for images; here with small sizes): the
 * launcher turns those off for data whose items are rows of features, says so in one line and the run
 * finishes; asked for with --set pixel_features=hog, it refuses in one line naming the setting and the data's
 * shape. Needs no Debian data set. */
#include "maker_testlib.h"

#include "npy.h"
#include "test_util.h"
#include "util.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define S_CLASSES 4
#define S_DIM 16
#define S_TRAIN 600
#define S_TEST 200
#define S_LABELS_PER_CLASS 5

/* The clusters with NumPy: class c's mean is 3 * (+-1 in each coordinate, drawn once), unit variance; training
 * labels -1 except for every 9th example. Returns 0 when python3-numpy made the files. */
static int s_make_with_numpy(const char *dir)
{
    if (access("/usr/bin/python3", X_OK) != 0 || system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
        return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 - <<'EOF'\n"
             "import numpy as np\n"
             "rng = np.random.default_rng(7)\n"
             "means = 3.0 * rng.choice([-1.0, 1.0], size=(%d, %d))\n"
             "def split(n):\n"
             "    y = np.arange(n) %% %d\n"
             "    return (means[y] + rng.standard_normal((n, %d))).astype(np.float32), y.astype(np.int64)\n"
             "x, y = split(%d)\n"
             "y_train = np.where(np.arange(%d) %% 9 == 0, y, -1)\n"
             "tx, ty = split(%d)\n"
             "np.save('%s/x.npy', x); np.save('%s/y.npy', y_train)\n"
             "np.save('%s/tx.npy', tx); np.save('%s/ty.npy', ty)\n"
             "EOF",
             S_CLASSES, S_DIM, S_CLASSES, S_DIM, S_TRAIN, S_TRAIN, S_TEST, dir, dir, dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The same clusters written by base/npy (Box-Muller over the test stream). */
static void s_split_c(uint64_t *rng, const float *means, int n, float *x, int64_t *y, int label_every)
{
    for (int i = 0; i < n; i++) {
        int c = i % S_CLASSES;
        for (int d = 0; d < S_DIM; d++) {
            double u1 = (test_uniform_pm1(rng) + 1.0) / 2.0 + 1e-9, u2 = (test_uniform_pm1(rng) + 1.0) / 2.0;
            x[i * S_DIM + d] = means[c * S_DIM + d] + (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307 * u2));
        }
        y[i] = label_every && i % label_every != 0 ? -1 : c;
    }
}

static void s_make_with_c(const char *dir)
{
    uint64_t rng = 7;
    float means[S_CLASSES * S_DIM], *x = malloc(sizeof *x * S_TRAIN * S_DIM);
    int64_t *y = malloc(sizeof *y * S_TRAIN);
    for (int i = 0; i < S_CLASSES * S_DIM; i++)
        means[i] = test_uniform_pm1(&rng) < 0 ? -3.0f : 3.0f;
    char path[512], err[512];
    s_split_c(&rng, means, S_TRAIN, x, y, 9);
    snprintf(path, sizeof path, "%s/x.npy", dir);
    MT_CHECK(carls_npy_write_f32(path, x, S_TRAIN, S_DIM, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/y.npy", dir);
    MT_CHECK(carls_npy_write_i64(path, y, S_TRAIN, err, sizeof err) == 0, "%s", err);
    s_split_c(&rng, means, S_TEST, x, y, 0);
    snprintf(path, sizeof path, "%s/tx.npy", dir);
    MT_CHECK(carls_npy_write_f32(path, x, S_TEST, S_DIM, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/ty.npy", dir);
    MT_CHECK(carls_npy_write_i64(path, y, S_TEST, err, sizeof err) == 0, "%s", err);
    free(x);
    free(y);
}

/* Whether 127.0.0.1:port can be bound now. */
static int s_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int main(void)
{
    char dir[64], ini[128], log[128], path[256], line[4096];
    mt_tempdir(dir, "npy");
    if (s_make_with_numpy(dir) == 0) {
        printf("clusters made with NumPy\n");
    } else {
        printf("python3-numpy is not installed: clusters written by base/npy instead\n");
        s_make_with_c(dir);
    }
    snprintf(ini, sizeof ini, "%s/npy.ini", dir);
    snprintf(log, sizeof log, "%s/carls.log", dir);
    FILE *f = fopen(ini, "w");
    fprintf(f,
            "name = npy\nruns_dir = %s/runs\nmetrics_port = 0\ndata = npy:%s/x.npy,%s/y.npy\n"
            "test_data = npy:%s/tx.npy,%s/ty.npy\n"
            "pixel_features = raw\ntables = clusters\nlabels_per_class = %d\nmakers = 1\nmaker_device = cpu\n"
            "graph_k = 5\nlabel_maker = 1\nlabel_model_weight = 0\nhidden = 32,16\nsteps = 100\n"
            "batch_labelled = 20\nbatch_unlabelled = 32\nlr = 0.01\nalpha = 0.1\nneighbors = 5\n"
            "neighbors_from = bank\nbeta = 1\nckpt_every = 50\neval_every = 50\ntrainer_device = cpu\n"
            "timeout_s = 120\n",
            dir, dir, dir, dir, dir, S_LABELS_PER_CLASS);
    fclose(f);

    char *argv[] = {"carls", "run", ini, NULL};
    int64_t t0 = carls_monotonic_ms();
    mt_check_run_result(mt_wait(mt_spawn("carls", argv, log), 180000), log, line, sizeof line);
    double acc = atof(line + strlen("test_accuracy="));
    MT_CHECK(acc > 0.95, "test accuracy %.4f on clusters 6 sigma apart (see %s)", acc, log);
    snprintf(path, sizeof path, "%s/runs/npy/logs/labels0-0.log", dir);
    MT_CHECK(mt_file_contains(path, "label step 0 (graph only): 580 unlabelled items"),
             "the label maker did not spread labels over the 600 - 20 unlabelled items (see %s)", path);
    printf("clusters: %s (%.1f s)\n", line, (double)(carls_monotonic_ms() - t0) / 1000.0);

    /* A label out of range: refused, naming the file and the row, before the trainer starts. */
    char bad[256], err[512];
    int64_t y[S_TRAIN];
    for (int i = 0; i < S_TRAIN; i++)
        y[i] = i % 9 == 0 ? i % S_CLASSES : -1;
    y[123] = 300;
    snprintf(bad, sizeof bad, "%s/bad.npy", dir);
    MT_CHECK(carls_npy_write_i64(bad, y, S_TRAIN, err, sizeof err) == 0, "%s", err);
    char set_data[600];
    snprintf(set_data, sizeof set_data, "data=npy:%s/x.npy,%s", dir, bad);
    char *argv2[] = {"carls", "run", ini, "--set", set_data, "--set", "name=bad", NULL};
    snprintf(path, sizeof path, "%s/carls-bad.log", dir);
    int st = mt_wait(mt_spawn("carls", argv2, path), 60000);
    MT_CHECK(st != 0, "a run over a label out of range succeeded (see %s)", path);
    MT_CHECK(mt_file_contains(path, "pixels-0.log"), "the launcher does not point at the maker's log (%s)", path);
    snprintf(path, sizeof path, "%s/runs/bad/logs/pixels-0.log", dir);
    MT_CHECK(mt_file_contains(path, "bad.npy: row 123: label 300 is out of range"),
             "the error does not name the file and the row (see %s)", path);
    snprintf(path, sizeof path, "%s/carls-bad.log", dir);
    MT_CHECK(!mt_file_contains(path, "[trainer]"), "the trainer started on bad data (see %s)", path);

    /* The default experiments/graphreg.ini with these clusters: its image-only settings turned off, saying so. */
    char graphreg[512], set_test[600], set_runs[300], log4[160];
    snprintf(graphreg, sizeof graphreg, "%s/experiments/graphreg.ini", CARLS_SOURCE_DIR);
    snprintf(set_data, sizeof set_data, "data=npy:%s/x.npy,%s/y.npy", dir, dir);
    snprintf(set_test, sizeof set_test, "test_data=npy:%s/tx.npy,%s/ty.npy", dir, dir);
    snprintf(set_runs, sizeof set_runs, "runs_dir=%s/runs", dir);
    snprintf(log4, sizeof log4, "%s/carls-default.log", dir);
    char *argv4[] = {"carls", "run", graphreg, "--set", set_data, "--set", set_test, "--set", set_runs, "--set",
                     "name=default", "--set", "tables=clusters", "--set", "labels_per_class=5", "--set", "makers=1",
                     "--set", "maker_device=cpu", "--set", "graph_k=5", "--set", "neighbors=5", "--set",
                     "hidden=32,16", "--set", "steps=60", "--set", "batch_labelled=20", "--set",
                     "batch_unlabelled=32", "--set", "lr=0.01", "--set", "ckpt_every=30", "--set", "eval_every=30",
                     "--set", "timeout_s=120", NULL};
    mt_check_run_result(mt_wait(mt_spawn("carls", argv4, log4), 180000), log4, line, sizeof line);
    MT_CHECK(mt_file_contains(log4, "holds one row of features per item (600 x 16), not images: pixel_features = "
                                    "hog, conv = 16:5:2, augment_shift = 2 from ") &&
                 mt_file_contains(log4, "so this run uses pixel_features = centered, conv = none, augment_shift = 0 "
                                        "(other features: --set pixel_features=raw or sqrt)\n"),
             "the launcher did not say which settings it changed (see %s)", log4);
    snprintf(path, sizeof path, "%s/runs/default/logs/pixels-0.log", dir);
    MT_CHECK(mt_file_contains(path, "embed pixels: 600 items (centered, dim 16)"),
             "the pixel makers did not embed the centered features (see %s)", path);
    snprintf(path, sizeof path, "%s/runs/default/run.ini", dir);
    MT_CHECK(mt_file_contains(path, "pixel_features = centered\n") && mt_file_contains(path, "conv = none\n"),
             "run.ini does not hold the settings that ran (see %s)", path);
    printf("default graphreg.ini on rows of features: %s\n", line);
    /* Asked for explicitly: refused before anything starts, naming the setting and the data's shape. */
    char *argv5[] = {"carls", "run", graphreg, "--set", set_data, "--set", set_test, "--set", set_runs, "--set",
                     "name=hog", "--set", "pixel_features=hog", NULL};
    snprintf(log4, sizeof log4, "%s/carls-hog.log", dir);
    MT_CHECK(mt_wait(mt_spawn("carls", argv5, log4), 30000) == 2, "--set pixel_features=hog on rows of features was "
             "not refused (see %s)", log4);
    MT_CHECK(mt_file_contains(log4, "carls: --set pixel_features=hog needs images of 6x6 pixels or more (HOG), but "
                                    "data = npy:") &&
                 mt_file_contains(log4, "holds one row of features per item (600 x 16), not images: use "
                                        "pixel_features = centered, raw or sqrt\n"),
             "the refusal does not name the setting and the data's shape (see %s)", log4);
    snprintf(path, sizeof path, "%s/runs/hog", dir);
    MT_CHECK(access(path, F_OK) != 0, "the refused run made %s", path);

    /* Metrics of every program during a run. The base port is drawn from the pid, away from the ports the
     * kernel hands out for port 0 (32768 and up), and moved on while the three it will use are taken. */
    int base = 20000 + (int)(getpid() % 400) * 32;
    for (int tries = 0; tries < 50 && !(s_port_free(base) && s_port_free(base + 64) && s_port_free(base + 65));
         tries++)
        base = 20000 + (base - 20000 + 96) % 12800;
    char set_port[64], log3[160];
    snprintf(set_port, sizeof set_port, "metrics_port=%d", base);
    snprintf(log3, sizeof log3, "%s/carls-metrics.log", dir);
    char *argv3[] = {"carls", "run", ini, "--set", set_port, "--set", "steps=100000000", "--set", "name=metrics",
                     NULL};
    pid_t pid = mt_spawn("carls", argv3, log3);
    int64_t deadline = carls_monotonic_ms() + 120000; /* against a hang only */
    while (!mt_file_contains(log3, "[trainer] step 50/") && carls_monotonic_ms() < deadline)
        usleep(50 * 1000);
    MT_CHECK(mt_file_contains(log3, "[trainer] step 50/"), "the trainer never evaluated (see %s)", log3);
    snprintf(path, sizeof path, "%s/runs/metrics/prometheus-targets.json", dir);
    size_t len = 0;
    char *targets = (char *)test_read_file(path, 1, &len);
    MT_CHECK(targets != NULL, "no %s", path);
    if (targets)
        targets[len] = '\0';
    int scraped = 0;
    for (const char *t = targets ? strstr(targets, "127.0.0.1:") : NULL; t; t = strstr(t + 1, "127.0.0.1:")) {
        int port = atoi(t + strlen("127.0.0.1:"));
        char *answer = NULL;
        while (!(answer = test_http((uint16_t)port, "GET", "/metrics")) && carls_monotonic_ms() < deadline)
            usleep(50 * 1000);
        MT_CHECK(answer && strstr(answer, " 200 "), "port %d served no metrics", port);
        const char *body = answer ? strstr(answer, "\r\n\r\n") : NULL;
        if (body) {
            char problems[4096];
            int lint = test_promtool_check(body + 4, problems, sizeof problems);
            if (lint == 77)
                printf("SKIPPED promtool on port %d: %s\n", port, problems);
            MT_CHECK(lint == 0 || lint == 77, "promtool refused port %d's page:\n%s", port, problems);
            scraped++;
        }
        free(answer);
    }
    MT_CHECK(scraped == 3, "%d pages scraped; want the bank's, the trainer's and the embed maker's", scraped);
    MT_CHECK(strstr(targets ? targets : "", "carls-trainer") != NULL, "no trainer job in %s", path);
    free(targets);
    kill(pid, SIGINT);
    MT_CHECK(mt_wait(pid, 60000) == 130, "the interrupted run did not exit 130 (see %s)", log3);
    printf("metrics: %d pages scraped during a run\n", scraped);
    return mt_finish("test_launcher_npy", dir);
}
