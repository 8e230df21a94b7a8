/* Helpers shared by the maker tests (see maker_testlib.h). */
#include "maker_testlib.h"
#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int mt_failures = 0;

int mt_have_fmnist(void)
{
    return access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0;
}

void mt_tempdir(char *path, const char *tag)
{
    if (test_tmpdir(path, 64, tag) != 0)
        abort();
}

int mt_finish(const char *name, const char *dir)
{
    if (mt_failures) {
        if (dir)
            fprintf(stderr, "%s: %d check(s) failed; files kept in %s\n", name, mt_failures, dir);
        return 1;
    }
    if (dir)
        test_rmrf(dir);
    printf("%s: OK\n", name);
    return 0;
}

pid_t mt_spawn(const char *prog, char *const argv[], const char *log)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CARLS_BIN_DIR, prog);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(path, argv);
        perror("execv");
        _exit(127);
    }
    return pid;
}

int mt_wait(pid_t pid, int timeout_ms)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

void mt_check_run_result(int st, const char *log, char *line, size_t len)
{
    MT_CHECK(st == 0, "carls run exited with %d (see %s)", st, log);
    test_last_line(log, line, len);
    MT_CHECK(strncmp(line, "test_accuracy=", 14) == 0, "last line is not the result: %s", line);
    double acc = atof(line + 14);
    MT_CHECK(acc > 0.4 && acc <= 1.0, "test accuracy %g", acc);
}

int mt_file_contains(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return 0;
    }
    char line[8192];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        found = strstr(line, text) != NULL;
    }
    fclose(f);
    return found;
}
