/* End to end: `carls run` on a small configuration (1,000 items, a 2-maker fleet, 150 trainer steps with the
 * graph term and pseudo-labels from the bank) must finish, print `test_accuracy=...` as its last line and
 * write report.md, metrics.csv and knowledge.csv (the initial graph's purity and the first pseudo-labels'
 * accuracy); a run with a convolutional encoder and the dynamic graph (graph_refresh = 2) records refreshes
 * after step 0; a run interrupted with SIGINT while the trainer runs must stop every process and exit
 * 130. `--set` of an unknown key is refused. Every run leaves its stage times (launcher/carls_stages.h) in
 * stages.json, and a finished one in report.md's "Stages" table: the stages the launcher waits for and the
 * trainer's split, none negative, together no more than the run's total. Exits 77 (skipped) without dataset-fashion-mnist. */
#include "launcher_testlib.h"
#include "maker_testlib.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#include "test_util.h"

/* Checks RUN/stages.json: exit_status `status`, each key of want (NULL-terminated) among its stages, every
 * stage >= 0 and their sum at most "total" (each is rounded to 1 ms). Returns the number of stages. */
static int s_check_stages_json(const char *run, int status, const char *const *want)
{
    char path[512];
    snprintf(path, sizeof path, "%s/stages.json", run);
    size_t len = 0;
    char *json = (char *)test_read_file(path, 1, &len);
    MT_CHECK(json != NULL, "no %s", path);
    if (!json) {
        return 0;
    }
    json[len] = '\0';
    char st[64];
    snprintf(st, sizeof st, "\"exit_status\": %d,", status);
    MT_CHECK(strstr(json, st) != NULL, "%s lacks %s", path, st);
    const char *t = strstr(json, "\"total\": ");
    const double total = t ? atof(t + strlen("\"total\": ")) : -1;
    /* "stages": {"key": seconds, ...}: every number up to its closing brace. */
    const char *p = strstr(json, "\"stages\": {");
    const char *end = p ? strchr(p, '}') : NULL;
    int n = 0;
    double sum = 0;
    for (const char *q = p ? strstr(p + 11, "\": ") : NULL; q && q < end; q = strstr(q + 1, "\": ")) {
        const double v = atof(q + 3);
        MT_CHECK(v >= 0, "a negative stage in %s: %.40s", path, q - 20 > p ? q - 20 : p);
        sum += v;
        n++;
    }
    for (int i = 0; want[i]; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\": ", want[i]);
        MT_CHECK(p && strstr(p, key) && strstr(p, key) < end, "%s lacks stage %s", path, want[i]);
    }
    MT_CHECK(total > 0 && sum <= total + 0.001 * n, "%d stages of %.3f s in all, total %.3f s (%s)", n, sum, total,
             path);
    free(json);
    return n;
}

/* Checks report.md's "Stages" table: rows "| what | seconds |" up to the total's row, none negative, their sum at
 * most the total (each rounded to 0.1 s). Returns the number of rows. */
static int s_check_stages_table(const char *report)
{
    FILE *f = fopen(report, "r");
    char line[1024];
    int rows = 0, in_table = 0;
    double sum = 0, total = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "## ", 3) == 0) {
            in_table = strcmp(line, "## Stages\n") == 0;
            continue;
        }
        const char *cell = strrchr(line, '|');
        const char *prev = NULL;
        for (const char *c = line; c < cell; c++) {
            prev = *c == '|' ? c : prev;
        }
        if (!in_table || !cell || !prev || strncmp(line, "| stage |", 9) == 0 || strncmp(line, "| --- |", 7) == 0) {
            continue;
        }
        char *e = NULL;
        const double v = strtod(prev + 1, &e);
        MT_CHECK(e != prev + 1 && v >= 0, "a stage row without seconds >= 0 in %s: %s", report, line);
        if (strncmp(line, "| total (the whole run) |", 25) == 0) {
            total = v;
        } else {
            sum += v;
            rows++;
        }
    }
    if (f) {
        fclose(f);
    }
    MT_CHECK(rows >= 5 && total > 0 && sum <= total + 0.05 * rows, "report.md's Stages: %d rows of %.1f s, total %.1f "
             "(%s)", rows, sum, total, report);
    return rows;
}

static void s_write_ini(const char *path)
{
    FILE *f = fopen(path, "w");
    fprintf(f, "# small end-to-end configuration\n"
               "name = e2e\nruns_dir = unset\nitems = 1000\nlabels_per_class = 10\nlabel_seed = 0\n"
               "validation = 0\nmakers = 2\nmaker_device = cpu\ngraph_k = 5\nlabel_maker = 1\n"
               "label_model_weight = 0\nhidden = 64,32\nconv = none\ngraph_refresh = 0\nsteps = 150\nbatch_labelled = 100\n"
               "batch_unlabelled = 64\nalpha = 0.1\nneighbors = 5\nneighbors_from = bank\nbeta = 1\n"
               "ckpt_every = 25\neval_every = 50\ntrainer_device = cpu\ntimeout_s = 300\n");
    fclose(f);
}

int main(void)
{
    lt_scratch_t sc;
    if (lt_scratch(&sc, "e2e") != 0) {
        return 77;
    }
    char ini[128], path[256], line[4096];
    snprintf(ini, sizeof ini, "%s/e2e.ini", sc.dir);
    s_write_ini(ini);

    /* Unknown keys are refused before anything starts. */
    char *bad[] = {"carls", "run", ini, "--set", "no_such_key=1", NULL};
    MT_CHECK(mt_wait(mt_spawn("carls", bad, sc.log), 10000) == 2, "--set of an unknown key was accepted");

    char *argv[] = {"carls", "run", ini, "--set", sc.set_runs, NULL};
    int64_t t0 = carls_monotonic_ms();
    int st = mt_wait(mt_spawn("carls", argv, sc.log), 300000);
    mt_check_run_result(st, sc.log, line, sizeof line);
    MT_CHECK(strstr(line, "steps_per_s=") != NULL, "no steps_per_s in the result line: %s", line);
    snprintf(path, sizeof path, "%s/e2e/report.md", sc.runs);
    MT_CHECK(mt_file_contains(path, "test_accuracy"), "report.md lacks the result");
    snprintf(path, sizeof path, "%s/e2e/metrics.csv", sc.runs);
    MT_CHECK(mt_file_contains(path, "test_accuracy") && mt_file_contains(path, "150,"), "metrics.csv incomplete");
    /* The knowledge per refresh from the makers' logs: the initial graph's purity and the first label spreading's
     * accuracy at step 0, in knowledge.csv and report.md (issue 22). */
    snprintf(path, sizeof path, "%s/e2e/knowledge.csv", sc.runs);
    size_t klen = 0;
    char *knowledge = (char *)test_read_file(path, 1, &klen);
    const char kfirst[] = "step,graph_purity,pseudo_label_accuracy,confident_accuracy,confident_share\n0,0.";
    MT_CHECK(knowledge && klen >= sizeof kfirst - 1 && memcmp(knowledge, kfirst, sizeof kfirst - 1) == 0,
             "knowledge.csv lacks the step-0 row (see %s)", path);
    free(knowledge);
    snprintf(path, sizeof path, "%s/e2e/report.md", sc.runs);
    MT_CHECK(mt_file_contains(path, "## Knowledge per refresh") && mt_file_contains(path, "| 0 | 0."),
             "report.md lacks the knowledge per refresh");
    MT_CHECK(!mt_file_contains(sc.log, "ended with status"), "a process did not stop cleanly (see %s)", sc.log);
    /* Stage times: what the launcher waited for (the bank, the one-shot maker fleets) and the trainer's split. */
    snprintf(path, sizeof path, "%s/e2e", sc.runs);
    const char *const want[] = {"bank_startup", "pixel_embeddings", "initial_graph", "label_spreading",
                                "makers_start", "trainer_startup", "training", "evaluation", "shutdown", "report",
                                NULL};
    const int stages = s_check_stages_json(path, 0, want);
    snprintf(path, sizeof path, "%s/e2e/report.md", sc.runs);
    MT_CHECK(mt_file_contains(path, "| initial makers: pixel embeddings (") &&
                 mt_file_contains(path, "| training: the trainer's steps"),
             "report.md's Stages table lacks a stage (see %s)", path);
    MT_CHECK(s_check_stages_table(path) == stages, "report.md and stages.json differ in their stages (%s)", path);
    printf("end-to-end run: %s (%.1f s)\n", line, (double)(carls_monotonic_ms() - t0) / 1000.0);

    /* The dynamic graph with a convolutional encoder (graph_refresh = 2, alpha 0): the embed fleet runs without
     * the graph term, the graph is rebuilt from each checkpoint's embeddings and the pixels' lists, and the
     * resident label maker spreads again over each rebuilt graph: knowledge.csv has refreshes after step 0
     * with both a graph purity and a pseudo-label accuracy. */
    char log3[140];
    snprintf(log3, sizeof log3, "%s/carls-dyn.log", sc.dir);
    char *argv3[] = {"carls", "run", ini, "--set", sc.set_runs, "--set", "name=e2e-dyn", "--set", "conv=4:5:2", "--set",
                     "graph_refresh=2", "--set", "alpha=0", NULL};
    st = mt_wait(mt_spawn("carls", argv3, log3), 300000);
    mt_check_run_result(st, log3, line, sizeof line);
    snprintf(path, sizeof path, "%s/e2e-dyn/knowledge.csv", sc.runs);
    knowledge = (char *)test_read_file(path, 1, &klen);
    if (knowledge) {
        knowledge[klen] = '\0';
    }
    int refreshed = 0;
    for (char *row = knowledge ? strchr(knowledge, '\n') : NULL; row && row[1]; row = strchr(row + 1, '\n')) {
        long step = 0;
        double purity = 0.0, acc = 0.0;
        refreshed += sscanf(row + 1, "%ld,%lf,%lf", &step, &purity, &acc) == 3 && step > 0 && purity > 0.0 &&
                     acc > 0.0;
    }
    free(knowledge);
    MT_CHECK(refreshed >= 1, "knowledge.csv has no refresh after step 0 with graph and labels (see %s)", path);
    snprintf(path, sizeof path, "%s/e2e-dyn/logs/maker-graph-0.log", sc.runs);
    MT_CHECK(mt_file_contains(path, "graph from fmnist.emb + fmnist.pixels"), "no union graph was built (see %s)",
             path);
    printf("dynamic-graph run: %s, %d refreshes\n", line, refreshed);

    /* Ctrl-C while the trainer runs: every process stops, exit 130. */
    char log2[140];
    snprintf(log2, sizeof log2, "%s/carls-int.log", sc.dir);
    char *argv2[] = {"carls", "run", ini, "--set", sc.set_runs, "--set", "steps=100000", "--set", "name=e2e-int", NULL};
    pid_t pid = mt_spawn("carls", argv2, log2);
    int64_t deadline = carls_monotonic_ms() + 120000;
    while (!mt_file_contains(log2, "[trainer]") && carls_monotonic_ms() < deadline) {
        usleep(100 * 1000);
    }
    MT_CHECK(mt_file_contains(log2, "[trainer]"), "the trainer never reported (see %s)", log2);
    kill(pid, SIGINT);
    st = mt_wait(pid, 60000);
    MT_CHECK(st == 130, "interrupted run exited with %d (see %s)", st, log2);
    MT_CHECK(mt_file_contains(log2, "every process stopped"), "no clean stop reported (see %s)", log2);
    MT_CHECK(!mt_file_contains(log2, "SIGKILL"), "a process needed SIGKILL (see %s)", log2);
    /* An interrupted run has its stage times too: the trainer's as one stage, stopped. */
    snprintf(path, sizeof path, "%s/e2e-int", sc.runs);
    const char *const want2[] = {"bank_startup", "pixel_embeddings", "trainer", "shutdown", NULL};
    s_check_stages_json(path, 130, want2);
    return mt_finish("test_launcher_short", sc.dir);
}
