/* What the `carls run` integration tests (test_launcher_*.c) share: a run's scratch files and its newest
 * checkpoint. Over maker_testlib (mt_*). */
#ifndef LAUNCHER_TESTLIB_H
#define LAUNCHER_TESTLIB_H

#include <sys/types.h>

/* The files of one test's runs. */
typedef struct {
    char dir[64];       /* a fresh scratch directory (mt_tempdir) */
    char runs[128];     /* DIR/runs: runs_dir of the test's runs */
    char run[160];      /* DIR/runs/NAME: the run named NAME */
    char log[128];      /* DIR/carls.log: the launcher's output */
    char set_runs[160]; /* "runs_dir=DIR/runs", for --set */
} lt_scratch_t;

/* Names t's files for runs named name (their scratch directory tagged with it). Returns 0, or 77 (the test is
 * skipped) after saying so when dataset-fashion-mnist is not installed. */
int lt_scratch(lt_scratch_t *t, const char *name);

/* The trainer's newest checkpoint step in run (from RUN/ckpt/latest), or none when there is none. */
long lt_latest_step(const char *run, long none);

/* processes.tsv, split into fields. */
typedef struct {
    int n;
    char field[64][7][96]; /* role, name, pid, started, ended, exit, note */
} lt_ptab_t;

/* Reads run/processes.tsv into *t. Returns 1 when the header is the documented one. */
int lt_ptab_read(const char *run, lt_ptab_t *t);

/* The pid of the running process called name, 0 when there is none. */
pid_t lt_running_pid(const char *run, const char *name);

/* Waits up to ms for text to appear in path. */
int lt_wait_text(const char *path, const char *text, int ms);

/* The last row of RUN/metrics.csv as numbers into col (n columns; those missing stay 0). */
void lt_last_metrics(const char *run, double *col, int n);

/* Starts build/bin/carls with argv (argv[0] ignored), output to log, in a process group of its own. */
pid_t lt_spawn_group(char *const argv[], const char *log);

#endif
