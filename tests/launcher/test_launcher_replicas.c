/* A replicated bank under `carls run` (issue 37, docs/REPLICATION.md section 6): experiments/graphreg-quick.ini
 * shrunk with --set (1,000 items, 2 embed makers, S_STEPS trainer steps) with replicas = 2 and kb_durability =
 * sync, so min_replicas defaults to 1.
 *   1. Bad settings are refused before anything starts: replicas = 0, 5 or 1.5, min_replicas = 2 with two
 *      members, min_replicas = 1 with interval durability (the file's) (exit 2, naming it).
 *   2. Once the trainer is 10% in, SIGKILL the primary (member 0). The launcher must promote member 1 (term 3:
 *      the fence took term 2) and restart member 0 as its follower, then raise min_replicas back to 1 once it
 *      caught up. Then SIGKILL member 1, now the primary: member 0 is promoted back (term 5).
 *   3. The run finishes with a result (test_accuracy above 0.4; chance is 0.1), the result line says
 *      replicas=2 bank_failovers=2 bank_restarts=2; replication.tsv records every term; processes.tsv lists four
 *      kb-server lives, the killed two ended by signal 9; report.md's Faults section counts both failovers; the
 *      trainer still read neighbours from the bank in its last window (its clients followed the primary).
 *   4. A second run, with curve = on: its primary stopped (SIGSTOP, a hang) is taken for hung by the launcher's probes, killed
 *      and replaced; the run, killed as a whole, resumes (`carls run --resume`) from a snapshot that member 1
 *      wrote after the failover and finishes (s_resume_after_failover).
 * Exits 77 (skipped) without dataset-fashion-mnist. */
#include "launcher_testlib.h"
#include "maker_testlib.h"

#include "util.h"
#include "test_util.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_STEPS 6000

/* Bad settings: each refused with exit 2 and a message naming it. */
static void s_bad_settings(const lt_scratch_t *sc, const char *ini)
{
    const char *bad[][3] = {{"replicas=0", "", "replicas = 0"},
                            {"replicas=5", "", "replicas = 5"},
                            {"replicas=1.5", "", "replicas = 1.5"},
                            {"replicas=2", "min_replicas=2", "min_replicas = 2"},
                            {"replicas=2", "min_replicas=1", "needs kb_durability = sync"}};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        char log[160];
        snprintf(log, sizeof log, "%s/bad-%d.log", sc->dir, i);
        char *argv[] = {"carls", "run", (char *)ini, "--set", (char *)sc->set_runs, "--set", (char *)bad[i][0],
                        *bad[i][1] ? "--set" : NULL, (char *)bad[i][1], NULL};
        MT_CHECK(mt_wait(mt_spawn("carls", argv, log), 10000) == 2, "--set %s %s was accepted", bad[i][0], bad[i][1]);
        MT_CHECK(mt_file_contains(log, bad[i][2]), "no message naming '%s' (see %s)", bad[i][2], log);
    }
}

/* The run's command line: the small configuration, replicated, named name. */
typedef struct {
    char name[64], steps[32];
    char *argv[50];
} s_args_t;

static void s_args(s_args_t *a, const lt_scratch_t *sc, const char *ini, const char *name, bool curve)
{
    snprintf(a->name, sizeof a->name, "name=%s", name);
    snprintf(a->steps, sizeof a->steps, "steps=%d", S_STEPS);
    char *const argv[] = {"carls", "run", (char *)ini, "--set", (char *)sc->set_runs, "--set", a->name,
                          "--set", "items=1000", "--set", "makers=2", "--set", "maker_device=cpu",
                          "--set", "trainer_device=cpu", "--set", "graph_k=5", "--set", "neighbors=5",
                          "--set", "hidden=64,32", "--set", a->steps, "--set", "batch_unlabelled=64",
                          "--set", "ckpt_every=100", "--set", "eval_every=1000", "--set", "kb_durability=sync",
                          "--set", "replicas=2", "--set", "timeout_s=500", "--set", "maker_bank_timeout_ms=1000",
                          "--set", curve ? "curve=on" : "curve=off", NULL};
    memcpy(a->argv, argv, sizeof argv);
}

/* Sends sig (SIGKILL, or SIGSTOP for a hang) to the running process called name once the trainer's checkpoint
 * is past step; returns its pid (0 after a failed check). */
static pid_t s_kill_at(const char *run, const char *log, const char *name, long step, int sig)
{
    const int64_t deadline = carls_monotonic_ms() + 300000;
    while (lt_latest_step(run, 0) < step && carls_monotonic_ms() < deadline) {
        usleep(20 * 1000);
    }
    const long at = lt_latest_step(run, 0);
    const pid_t pid = lt_running_pid(run, name), trainer = lt_running_pid(run, "trainer");
    MT_CHECK(at >= step && at < S_STEPS && pid > 0 && trainer > 0,
             "cannot kill %s (pid %d) mid-run: trainer pid %d at step %ld of %d (see %s)", name, (int)pid,
             (int)trainer, at, S_STEPS, log);
    if (mt_failures) {
        return 0;
    }
    MT_CHECK(kill(pid, sig) == 0, "kill %s (pid %d)", name, (int)pid);
    printf("%s %s (pid %d) at trainer checkpoint step %ld\n", sig == SIGSTOP ? "SIGSTOP" : "SIGKILL", name, (int)pid,
           at);
    fflush(stdout);
    return pid;
}

/* 4. With CURVE on (followers hold client keys of the run), a hung primary (SIGSTOP) is found by the
 * launcher's status probes, killed and replaced; then the run is killed as a whole (SIGKILL to its process group), so its newest snapshots were written by member 1, and
 * resumed: member 0 is restored from one of them (gathered from member 1's
 * directory), member 1 starts empty and catches up, and the run finishes from a step after the failover. */
static void s_resume_after_failover(const lt_scratch_t *sc, const char *ini)
{
    char run[300], log[300], path[600], line[8192];
    snprintf(run, sizeof run, "%s/replicas-resume", sc->runs);
    snprintf(log, sizeof log, "%s/carls-resume-killed.log", sc->dir);
    s_args_t a;
    s_args(&a, sc, ini, "replicas-resume", true);
    const pid_t launcher = lt_spawn_group(a.argv, log);
    const pid_t primary = s_kill_at(run, log, "kb-server 0/1 member 0", S_STEPS / 10, SIGSTOP);
    MT_CHECK(primary == 0 || lt_wait_text(log, "did not answer 5 status probes in a row: taking it for hung", 60000),
             "the stopped primary was not taken for hung (see %s)", log);
    MT_CHECK(primary == 0 || lt_wait_text(log, "kb-server 0/1 member 1 promoted to primary", 60000),
             "member 1 was not promoted (see %s)", log);
    const long failover_step = lt_latest_step(run, -1);
    const int64_t deadline = carls_monotonic_ms() + 300000;
    while (lt_latest_step(run, -1) < failover_step + 300 && carls_monotonic_ms() < deadline) {
        usleep(20 * 1000);
    }
    MT_CHECK(kill(-launcher, SIGKILL) == 0, "kill the run's process group");
    const long killed_at = lt_latest_step(run, -1);
    for (int i = 0; i < 500 && kill(-launcher, 0) == 0; i++) {
        usleep(10 * 1000);
    }
    mt_wait(launcher, 10000);
    MT_CHECK(killed_at >= failover_step + 300 && killed_at < S_STEPS,
             "the run was not killed 300 steps after its failover (step %ld, failover at %ld; see %s)", killed_at,
             failover_step, log);
    printf("killed the replicated run at step %ld (failover at %ld)\n", killed_at, failover_step);
    if (mt_failures) {
        return;
    }
    snprintf(log, sizeof log, "%s/carls-resumed.log", sc->dir);
    char *argv[] = {"carls", "run", "--resume", run, NULL};
    const int st = mt_wait(mt_spawn("carls", argv, log), 450000);
    mt_check_run_result(st, log, line, sizeof line);
    printf("resumed: %s", line);
    long resumed_from = -1;
    FILE *f = fopen(log, "r");
    while (f && fgets(path, sizeof path, f)) {
        const char *p = strstr(path, "[carls] resumed from step ");
        resumed_from = p ? atol(p + 26) : resumed_from;
    }
    if (f) {
        fclose(f);
    }
    MT_CHECK(resumed_from > failover_step && resumed_from <= killed_at,
             "resumed from step %ld, not from a snapshot member 1 wrote after the failover (%ld..%ld; see %s)",
             resumed_from, failover_step, killed_at, log);
    snprintf(path, sizeof path, "%s/replication.tsv", run);
    MT_CHECK(mt_file_contains(path, "\t0\t1\t0\ttcp://") && mt_file_contains(path, "\tresumed\n"),
             "%s lacks the resumed shard's term 1", path);
}

int main(void)
{
    lt_scratch_t sc;
    if (lt_scratch(&sc, "replicas") != 0) {
        return 77;
    }
    char ini[512], path[600], line[8192];
    snprintf(ini, sizeof ini, "%s/experiments/graphreg-quick.ini", CARLS_SOURCE_DIR);
    s_bad_settings(&sc, ini);

    s_args_t a;
    s_args(&a, &sc, ini, "replicas", false);
    const int64_t t0 = carls_monotonic_ms();
    pid_t launcher = mt_spawn("carls", a.argv, sc.log);

    /* 2. Kill the primary, wait until the shard has its follower back with K = 1, kill the new primary. */
    const pid_t first = s_kill_at(sc.run, sc.log, "kb-server 0/1 member 0", S_STEPS / 10, SIGKILL);
    MT_CHECK(first == 0 || lt_wait_text(sc.log, "kb-server 0/1 member 1 promoted to primary (term 3,", 60000),
             "member 1 was not promoted (see %s)", sc.log);
    MT_CHECK(first == 0 || lt_wait_text(sc.log, "shard 0: min_replicas back to 1", 120000),
             "min_replicas never went back to 1 after the first failover (see %s)", sc.log);
    const pid_t second = mt_failures ? 0 : s_kill_at(sc.run, sc.log, "kb-server 0/1 member 1", 0, SIGKILL);
    MT_CHECK(second == 0 || lt_wait_text(sc.log, "kb-server 0/1 member 0 promoted to primary (term 5,", 60000),
             "member 0 was not promoted back (see %s)", sc.log);
    if (mt_failures) {
        kill(launcher, SIGTERM);
        mt_wait(launcher, 60000);
        return mt_finish("test_launcher_replicas", sc.dir);
    }

    /* 3. The run's end, its result and its records. */
    const int st = mt_wait(launcher, 450000);
    const double secs = (double)(carls_monotonic_ms() - t0) / 1000.0;
    mt_check_run_result(st, sc.log, line, sizeof line);
    printf("result after %.1f s: %s", secs, line);
    MT_CHECK(strstr(line, " replicas=2 bank_failovers=2 ") != NULL, "not 2 failovers: %s", line);
    MT_CHECK(strstr(line, " bank_restarts=2 ") != NULL, "not 2 restarts: %s", line);
    MT_CHECK(mt_file_contains(sc.log, "restarting (1/3) on ") &&
                 mt_file_contains(sc.log, "as a follower of "),
             "no log line for a dead primary restarted as a follower (see %s)", sc.log);

    snprintf(path, sizeof path, "%s/replication.tsv", sc.run);
    MT_CHECK(mt_file_contains(path, "elapsed_s\tshard\tterm\tprimary\tendpoint\tmin_replicas\twhy\n"),
             "%s has no header", path);
    const char *terms[] = {"\t0\t1\t0\ttcp://", "\t0\t3\t1\ttcp://", "\t0\t5\t0\ttcp://", "min_replicas restored"};
    for (int i = 0; i < 4; i++) {
        MT_CHECK(mt_file_contains(path, terms[i]), "%s lacks '%s'", path, terms[i]);
    }

    lt_ptab_t *t = calloc(1, sizeof *t);
    MT_CHECK(lt_ptab_read(sc.run, t), "processes.tsv is missing or has another header");
    int servers = 0, killed = 0;
    for (int i = 0; i < t->n; i++) {
        const pid_t pid = (pid_t)atoi(t->field[i][2]);
        if (strncmp(t->field[i][1], "kb-server 0/1 member ", 21) != 0) {
            continue;
        }
        servers++;
        const int was_killed = pid == first || pid == second;
        killed += was_killed;
        MT_CHECK(strcmp(t->field[i][5], was_killed ? "signal 9" : "0") == 0, "%s (pid %d) exit '%s' (%s)",
                 t->field[i][1], (int)pid, t->field[i][5], t->field[i][6]);
    }
    free(t);
    MT_CHECK(servers == 4 && killed == 2, "processes.tsv lists %d kb-server lives (%d killed), expected 4 (2)",
             servers, killed);

    snprintf(path, sizeof path, "%s/report.md", sc.run);
    MT_CHECK(mt_file_contains(path, "failovers (a follower promoted): 2"), "report.md does not count the failovers");
    MT_CHECK(mt_file_contains(path, "kb-server 0/1 member 1 promoted (term 3"), "report.md lacks the first failover");

    /* The trainer read neighbours from the bank in its last window: its clients found the new primaries. */
    double col[20];
    lt_last_metrics(sc.run, col, 20);
    MT_CHECK(col[0] == S_STEPS && col[8] > 0, "last metrics row (step %g): %g neighbours/step from the bank", col[0],
             col[8]);
    if (!mt_failures) {
        s_resume_after_failover(&sc, ini);
    }
    return mt_finish("test_launcher_replicas", sc.dir);
}
