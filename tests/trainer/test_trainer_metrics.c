/* The trainer's Prometheus page: the real trainer (`trainer --metrics-port 0 graphreg` on a small .npy data set
 * of Gaussian clusters, no bank) is scraped over HTTP once it has evaluated; the page must show the steps and
 * examples it logged, its latest evaluation, and `promtool check metrics` must accept it with no problem. A
 * maker's page (the same renderer with task and worker labels, filled as a maker fills it) must pass promtool
 * too. Without promtool (Debian package prometheus) the promtool checks are skipped, saying so; the rest runs. */
#include "maker_testlib.h"

#include "npy.h"
#include "prom.h"
#include "test_util.h"
#include "util.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_N 400
#define S_D 8

/* The value of the sample line "name value" in text, or NAN. */
static double s_value(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return NAN;
}

static int s_lint(const char *what, const char *text)
{
    char problems[4096];
    int rc = test_promtool_check(text, problems, sizeof problems);
    if (rc == 77) {
        printf("SKIPPED promtool check metrics on %s: %s\n", what, problems);
        return 0;
    }
    MT_CHECK(rc == 0, "promtool check metrics refused %s:\n%s", what, problems);
    return rc;
}

/* Two clusters in S_D dimensions, every 4th training example labelled. */
static void s_write_data(const char *dir)
{
    uint64_t rng = 11;
    float *x = malloc(sizeof *x * S_N * S_D);
    int64_t y[S_N];
    for (int i = 0; i < S_N; i++) {
        for (int d = 0; d < S_D; d++)
            x[i * S_D + d] = (i % 2 ? 2.0f : -2.0f) + test_uniform_pm1(&rng);
        y[i] = i % 2;
    }
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/x.npy", dir);
    MT_CHECK(carls_npy_write_f32(path, x, S_N, S_D, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/y.npy", dir);
    MT_CHECK(carls_npy_write_i64(path, y, S_N, err, sizeof err) == 0, "%s", err);
    free(x);
}

int main(void)
{
    char dir[64], log[128], data[300], test_data[300], ckpt[128];
    mt_tempdir(dir, "trmetrics");
    s_write_data(dir);
    snprintf(log, sizeof log, "%s/trainer.log", dir);
    snprintf(data, sizeof data, "npy:%s/x.npy,%s/y.npy", dir, dir);
    snprintf(test_data, sizeof test_data, "npy:%s/x.npy,%s/y.npy", dir, dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    char *argv[] = {"trainer", "--metrics-port", "0", "graphreg", "--data", data, "--test-data", test_data,
                    "--labels-per-class", "20", "--hidden", "16,8", "--steps", "100000000", "--eval-every", "20",
                    "--ckpt-every", "100000", "--batch-labelled", "20", "--batch-unlabelled", "20", "--device",
                    "cpu", "--ckpt-dir", ckpt, "--log-level", "info", NULL};
    pid_t pid = mt_spawn("trainer", argv, log);
    /* wait (no time is asserted: only a generous deadline against a hang) for the second evaluation */
    int64_t deadline = carls_monotonic_ms() + 120000;
    while (!mt_file_contains(log, "step 40/") && carls_monotonic_ms() < deadline && waitpid(pid, NULL, WNOHANG) == 0)
        usleep(50 * 1000);
    MT_CHECK(mt_file_contains(log, "step 40/"), "the trainer did not evaluate twice (see %s)", log);
    uint16_t port = test_logged_metrics_port(log);
    MT_CHECK(port > 0, "the trainer did not log its metrics address (see %s)", log);
    char *answer = port ? test_http(port, "GET", "/metrics") : NULL;
    MT_CHECK(answer && strstr(answer, " 200 ") && strstr(answer, "text/plain; version=0.0.4"), "no metrics page");
    const char *body = answer ? strstr(answer, "\r\n\r\n") : NULL;
    if (body) {
        body += 4;
        double steps = s_value(body, "carls_trainer_steps_total");
        MT_CHECK(steps >= 40 && fmod(steps, 20) == 0, "steps_total %g: not the evaluated windows", steps);
        MT_CHECK(s_value(body, "carls_trainer_items_total") == steps * 40, "items_total is not steps x batch 40");
        MT_CHECK(s_value(body, "carls_trainer_steps_planned") == 100000000, "steps_planned");
        MT_CHECK(s_value(body, "carls_trainer_eval_score") > 0.9, "eval_score %g on two clusters 4 apart",
                 s_value(body, "carls_trainer_eval_score"));
        MT_CHECK(s_value(body, "carls_trainer_items_per_second") > 0, "no rate");
        MT_CHECK(s_value(body, "carls_trainer_bank_wait_ratio") == 0, "bank wait without a bank");
        s_lint("the trainer's page", body);
    }
    free(answer);
    kill(pid, SIGTERM);
    mt_wait(pid, 30000);

    /* a maker's page, as kb-maker --metrics-port fills it */
    carls_prom_progress_t *p = carls_prom_progress_new("maker", "task=\"embed\",worker=\"0/2\"");
    carls_prom_progress_add(p, 1, 30000, 1.5, 0.25);
    carls_prom_progress_set_step(p, 200, 0);
    char *text = NULL;
    size_t len = 0;
    MT_CHECK(carls_prom_progress_render(p, &text, &len) == 0, "render");
    MT_CHECK(s_value(text, "carls_maker_items_per_second") == 20000, "rate of the latest pass");
    MT_CHECK(fabs(s_value(text, "carls_maker_bank_wait_ratio") - 0.25 / 1.5) < 1e-9, "bank wait share");
    MT_CHECK(strstr(text, "carls_maker_info{task=\"embed\",worker=\"0/2\"} 1\n") != NULL, "info labels");
    s_lint("a maker's page", text);
    free(text);
    carls_prom_progress_destroy(&p);
    carls_prom_progress_add(p, 1, 1, 1, 1); /* NULL: nothing */
    return mt_finish("test_trainer_metrics", dir);
}
