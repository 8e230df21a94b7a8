/* What the `carls run` tests share (see launcher_testlib.h). */
#include "launcher_testlib.h"

#include "maker_testlib.h"

#include "util.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

int lt_scratch(lt_scratch_t *t, const char *name)
{
    if (!mt_have_fmnist()) {
        printf("SKIPPED: dataset-fashion-mnist is not installed\n");
        return 77;
    }
    memset(t, 0, sizeof *t);
    mt_tempdir(t->dir, name);
    snprintf(t->runs, sizeof t->runs, "%s/runs", t->dir);
    snprintf(t->run, sizeof t->run, "%s/%s", t->runs, name);
    snprintf(t->log, sizeof t->log, "%s/carls.log", t->dir);
    snprintf(t->set_runs, sizeof t->set_runs, "runs_dir=%s", t->runs);
    return 0;
}

long lt_latest_step(const char *run, long none)
{
    char path[512], text[128] = "";
    snprintf(path, sizeof path, "%s/ckpt/latest", run);
    FILE *f = fopen(path, "r");
    if (!f) {
        return none;
    }
    if (!fgets(text, sizeof text, f)) {
        text[0] = '\0';
    }
    fclose(f);
    const char *d = strpbrk(text, "0123456789");
    return d ? atol(d) : none;
}

/* Reads run/processes.tsv into *t. Returns 1 when the header is the documented one. */
int lt_ptab_read(const char *run, lt_ptab_t *t)
{
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/processes.tsv", run);
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        return 0;
    }
    int header = fgets(line, sizeof line, f) && strcmp(line, "role\tname\tpid\tstarted\tended\texit\tnote\n") == 0;
    while (t->n < 64 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *save = NULL, *tok = strtok_r(line, "\t", &save);
        for (int k = 0; k < 7 && tok; k++, tok = strtok_r(NULL, "\t", &save)) {
            snprintf(t->field[t->n][k], sizeof t->field[0][0], "%s", tok);
        }
        t->n++;
    }
    fclose(f);
    return header;
}

/* The pid of the running process called name, 0 when there is none. */
pid_t lt_running_pid(const char *run, const char *name)
{
    lt_ptab_t *t = calloc(1, sizeof *t);
    pid_t pid = 0;
    lt_ptab_read(run, t);
    for (int i = 0; i < t->n; i++) {
        if (strcmp(t->field[i][1], name) == 0 && strcmp(t->field[i][5], "running") == 0) {
            pid = (pid_t)atoi(t->field[i][2]);
        }
    }
    free(t);
    return pid;
}

/* Waits up to ms for text to appear in path. */
int lt_wait_text(const char *path, const char *text, int ms)
{
    for (int64_t deadline = carls_monotonic_ms() + ms; carls_monotonic_ms() < deadline; usleep(100 * 1000)) {
        if (mt_file_contains(path, text)) {
            return 1;
        }
    }
    return mt_file_contains(path, text);
}

void lt_last_metrics(const char *run, double *col, int n)
{
    char path[512], line[8192];
    snprintf(path, sizeof path, "%s/metrics.csv", run);
    test_last_line(path, line, sizeof line);
    memset(col, 0, (size_t)n * sizeof *col);
    char *save = NULL, *tok = strtok_r(line, ",", &save);
    for (int k = 0; k < n && tok; k++, tok = strtok_r(NULL, ",", &save)) {
        col[k] = atof(tok);
    }
}

/* Starts build/bin/carls with argv (argv[0] ignored), output to log, in a process group of its own. */
pid_t lt_spawn_group(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(CARLS_BIN_DIR "/carls", argv);
        _exit(127);
    }
    setpgid(pid, pid); /* whichever of the two runs first */
    return pid;
}
