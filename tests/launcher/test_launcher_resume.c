/* `carls run --resume` after SIGKILL of the whole run (docs/STATE.md "Resuming a run"): the graph-regularized
 * experiment, shrunk with --set (1,000 items, 1 embed maker, 3,000 trainer steps, a checkpoint and a bank
 * snapshot every 100), runs in a process group of its own; once the trainer's checkpoint after step 0 is
 * there, the whole group gets SIGKILL (launcher, kb-server, makers, trainer). Then:
 *   - `carls run --resume RUN` exits 0 with the result line (test_accuracy above 0.4: chance is 0.1), says
 *     "resumed from step N (checkpoint ..., snapshot ...)" with 100 <= N <= the step of the kill (a resume that
 *     started again from step 0 fails here), and so do report.md and the trainer's output
 *     (resumed_from_step=N); metrics.csv holds each evaluation (500, 1,000, ..., 3,000) once; the newest two
 *     checkpoints and their snapshots are all that is left;
 *   - a damaged newest snapshot (a byte of its store flipped) is refused by kb-server --restore, and the run
 *     resumes from the pair before it, saying which snapshot was refused;
 *   - with no complete snapshot left, and for a missing or foreign directory, --resume fails with messages
 *     that name the file;
 *   - first of all, a run killed (the same way) while its initial makers embed the pixels, before the trainer's
 *     first checkpoint: --resume says in one line that it starts the run again from the beginning and runs it
 *     to the end (step 0 on, not "resumed from step").
 * Exits 77 (skipped) without dataset-fashion-mnist. */
#include "launcher_testlib.h"
#include "maker_testlib.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_STEPS 3000

/* `carls run --resume run [extra]` to the end; returns its exit status. */
static int s_resume(const char *run, const char *log)
{
    char *argv[] = {"carls", "run", "--resume", (char *)run, NULL};
    return mt_wait(mt_spawn("carls", argv, log), 450000);
}

/* The number of rows of metrics.csv whose step is `step`. */
static int s_metric_rows(const char *run, int step)
{
    char path[512], line[4096];
    snprintf(path, sizeof path, "%s/metrics.csv", run);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        n += line[0] >= '0' && line[0] <= '9' && atoi(line) == step;
    }
    if (f) {
        fclose(f);
    }
    return n;
}

/* A run killed before its first checkpoint (SIGKILL to its process group while the initial makers embed the
 * pixels), then `carls run --resume`: it must start again from the beginning, say so in one line, and finish. */
static void s_killed_before_first_checkpoint(const char *ini, const char *runs, const char *dir)
{
    char run[256], log[256], set_runs[300], path[512], line[8192];
    snprintf(run, sizeof run, "%s/early", runs);
    snprintf(set_runs, sizeof set_runs, "runs_dir=%s", runs);
    char *argv[] = {"carls", "run", (char *)ini, "--set", set_runs, "--set", "name=early", "--set", "items=1000",
                    "--set", "makers=1", "--set", "maker_device=cpu", "--set", "trainer_device=cpu", "--set",
                    "graph_k=5", "--set", "neighbors=5", "--set", "hidden=32,16", "--set", "steps=100", "--set",
                    "batch_unlabelled=64", "--set", "ckpt_every=50", "--set", "eval_every=50", "--set",
                    "timeout_s=120", NULL};
    snprintf(log, sizeof log, "%s/carls-early.log", dir);
    snprintf(path, sizeof path, "%s/logs/pixels-0.log", run);
    const pid_t launcher = lt_spawn_group(argv, log);
    const int64_t deadline = carls_monotonic_ms() + 60000;
    while (access(path, F_OK) != 0 && carls_monotonic_ms() < deadline && waitpid(launcher, NULL, WNOHANG) == 0) {
        usleep(5 * 1000);
    }
    MT_CHECK(kill(-launcher, SIGKILL) == 0, "kill the run's process group: %s", strerror(errno));
    waitpid(launcher, NULL, 0);
    for (int i = 0; i < 500 && kill(-launcher, 0) == 0; i++) {
        usleep(20 * 1000);
    }
    MT_CHECK(access(path, F_OK) == 0 && lt_latest_step(run, -1) < 0,
             "not killed while the pixels were embedded, before any checkpoint (see %s)", log);
    if (mt_failures) {
        return;
    }
    snprintf(log, sizeof log, "%s/carls-early-resumed.log", dir);
    mt_check_run_result(s_resume(run, log), log, line, sizeof line);
    snprintf(line, sizeof line, "carls: %s has no checkpoint yet (the run stopped before the trainer's first one, at "
             "step 0): starting it again from the beginning\n", run);
    MT_CHECK(mt_file_contains(log, line), "no line saying the run starts again (see %s)", log);
    MT_CHECK(!mt_file_contains(log, "resumed from step"), "a run without checkpoints 'resumed' (see %s)", log);
    MT_CHECK(!mt_file_contains(log, "cannot read the checkpoint directory"), "--resume refused it (see %s)", log);
    MT_CHECK(s_metric_rows(run, 50) == 1 && s_metric_rows(run, 100) == 1,
             "metrics.csv lacks the evaluations of steps 50 and 100 (see %s)", run);
    snprintf(path, sizeof path, "%s/trainer.out", run);
    MT_CHECK(!mt_file_contains(path, "resumed_from_step="), "the trainer resumed (see %s)", path);
    snprintf(path, sizeof path, "%s/run.ini", run);
    MT_CHECK(mt_file_contains(path, "name = early"), "run.ini lost its settings (see %s)", path);
    printf("a run killed before its first checkpoint started again from the beginning and finished\n");
}

/* Checks that run (whose log is log) resumed from some step in [lo, hi] and finished; returns that step. */
static long s_check_resumed(const char *run, const char *log, int st, long lo, long hi)
{
    char line[8192], want[256];
    mt_check_run_result(st, log, line, sizeof line);
    FILE *f = fopen(log, "r");
    long step = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "[carls] resumed from step ");
        if (p) {
            step = atol(p + strlen("[carls] resumed from step "));
            MT_CHECK(strstr(p, "(checkpoint ") && strstr(p, ", snapshot resume-step"), "unclear: %s", p);
        }
    }
    if (f) {
        fclose(f);
    }
    MT_CHECK(step >= lo && step <= hi, "resumed from step %ld, not one in %ld..%ld (see %s)", step, lo, hi, log);
    char path[512];
    snprintf(path, sizeof path, "%s/report.md", run);
    snprintf(want, sizeof want, "| resumed_from_step | %ld |", step);
    MT_CHECK(mt_file_contains(path, want), "report.md lacks '%s'", want);
    snprintf(want, sizeof want, "resumed from step %ld (checkpoint `", step);
    MT_CHECK(mt_file_contains(path, want), "report.md lacks '%s'", want);
    snprintf(path, sizeof path, "%s/trainer.out", run);
    snprintf(want, sizeof want, "resumed_from_step=%ld\n", step);
    MT_CHECK(mt_file_contains(path, want), "trainer.out lacks '%s'", want);
    return step;
}

int main(void)
{
    lt_scratch_t sc;
    if (lt_scratch(&sc, "resume") != 0) {
        return 77;
    }
    char ini[512], path[512], steps[32];
    snprintf(ini, sizeof ini, "%s/experiments/graphreg-quick.ini", CARLS_SOURCE_DIR);
    snprintf(steps, sizeof steps, "steps=%d", S_STEPS);
    char *argv[] = {"carls", "run", ini, "--set", sc.set_runs, "--set", "name=resume", "--set", "items=1000",
                    "--set", "makers=1", "--set", "maker_device=cpu", "--set", "trainer_device=cpu",
                    "--set", "graph_k=5", "--set", "neighbors=5", "--set", "hidden=64,32", "--set", steps,
                    "--set", "batch_unlabelled=64", "--set", "ckpt_every=100", "--set", "eval_every=500",
                    "--set", "timeout_s=500", NULL};

    /* 0. Killed before the first checkpoint: started again from the beginning. */
    s_killed_before_first_checkpoint(ini, sc.runs, sc.dir);
    if (mt_failures) {
        return mt_finish("test_launcher_resume", sc.dir);
    }

    /* 1. The run, killed as a whole (SIGKILL to its process group) once the checkpoint after step 0 is
     * written. */
    snprintf(sc.log, sizeof sc.log, "%s/carls-killed.log", sc.dir);
    const pid_t launcher = lt_spawn_group(argv, sc.log);
    const int64_t deadline = carls_monotonic_ms() + 300000;
    while (lt_latest_step(sc.run, -1) < 100 && carls_monotonic_ms() < deadline &&
           waitpid(launcher, NULL, WNOHANG) == 0) {
        usleep(20 * 1000);
    }
    MT_CHECK(kill(-launcher, SIGKILL) == 0, "kill the run's process group: %s", strerror(errno));
    const long killed_at = lt_latest_step(sc.run, -1);
    waitpid(launcher, NULL, 0);
    for (int i = 0; i < 500 && kill(-launcher, 0) == 0; i++) {
        usleep(20 * 1000); /* the group's other processes go */
    }
    printf("SIGKILL to the run's process group at trainer checkpoint step %ld\n", killed_at);
    MT_CHECK(killed_at >= 100 && killed_at < S_STEPS, "killed at step %ld: not between the first checkpoint and the "
             "end (see %s)", killed_at, sc.log);
    if (mt_failures) {
        return mt_finish("test_launcher_resume", sc.dir);
    }

    /* 2. Resumed: from a checkpoint written before the kill (not step 0), to the end. */
    snprintf(sc.log, sizeof sc.log, "%s/carls-resumed.log", sc.dir);
    const long resumed = s_check_resumed(sc.run, sc.log, s_resume(sc.run, sc.log), 100, killed_at);
    for (int step = 500; step <= S_STEPS; step += 500) {
        MT_CHECK(s_metric_rows(sc.run, step) == 1, "metrics.csv has %d rows of step %d, 1 expected", s_metric_rows(sc.run, step),
                 step);
    }
    const char *left[] = {"ckpt/ckpt-000000002900.ckpt", "ckpt/ckpt-000000003000.ckpt",
                          "kb/snapshots/resume-step2900/MANIFEST", "kb/snapshots/resume-step3000/MANIFEST"};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", sc.run, left[i]);
        MT_CHECK(access(path, R_OK) == 0, "%s is missing after the run", path);
    }
    snprintf(path, sizeof path, "ls '%s/kb/snapshots' | wc -l | grep -qx 2 && ls '%s/ckpt' | grep -c ckpt- | grep -qx 2",
             sc.run, sc.run);
    MT_CHECK(system(path) == 0, "more than the newest 2 checkpoints and snapshots are left in %s", sc.run);
    printf("resumed from step %ld and finished\n", resumed);

    /* 3. The newest snapshot damaged: refused, and the pair before it used. */
    snprintf(path, sizeof path, "%s/kb/snapshots/resume-step3000/bank.sqlite", sc.run);
    FILE *f = fopen(path, "r+b");
    MT_CHECK(f != NULL, "open %s", path);
    if (f) {
        fseek(f, 200, SEEK_SET);
        int byte = fgetc(f);
        fseek(f, 200, SEEK_SET);
        fputc(byte ^ 0x5a, f);
        fclose(f);
    }
    snprintf(sc.log, sizeof sc.log, "%s/carls-damaged.log", sc.dir);
    s_check_resumed(sc.run, sc.log, s_resume(sc.run, sc.log), 2900, 2900);
    MT_CHECK(mt_file_contains(sc.log, "refused snapshot resume-step3000"), "the damaged snapshot is not named (see %s)",
             sc.log);

    /* 4. No complete snapshot left; a missing directory; a directory that is not a run's. */
    snprintf(path, sizeof path, "rm '%s'/kb/snapshots/*/MANIFEST", sc.run);
    MT_CHECK(system(path) == 0, "%s", path);
    snprintf(sc.log, sizeof sc.log, "%s/carls-nosnapshot.log", sc.dir);
    MT_CHECK(s_resume(sc.run, sc.log) == 1, "a run without a complete snapshot resumed (see %s)", sc.log);
    MT_CHECK(mt_file_contains(sc.log, "no checkpoint with a usable bank snapshot to resume from") &&
                 mt_file_contains(sc.log, "is missing or incomplete: no ") &&
                 mt_file_contains(sc.log, "/kb/snapshots/resume-step3000/MANIFEST"),
             "the missing snapshot is not named (see %s)", sc.log);
    snprintf(sc.log, sizeof sc.log, "%s/carls-nodir.log", sc.dir);
    snprintf(path, sizeof path, "%s/no-such-run", sc.runs);
    MT_CHECK(s_resume(path, sc.log) == 2 && mt_file_contains(sc.log, "no-such-run: No such file or directory"),
             "a missing directory: unclear (see %s)", sc.log);
    snprintf(sc.log, sizeof sc.log, "%s/carls-notrun.log", sc.dir);
    MT_CHECK(s_resume(sc.dir, sc.log) == 2 && mt_file_contains(sc.log, "no run.ini in it"),
             "a directory that is not a run's: unclear (see %s)", sc.log);
    return mt_finish("test_launcher_resume", sc.dir);
}
