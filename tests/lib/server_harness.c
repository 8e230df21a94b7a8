#include "server_harness.h"

#include "files.h"
#include "test_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void test_server_init(test_server_t *srv)
{
    memset(srv, 0, sizeof *srv);
    snprintf(srv->data_dir, sizeof srv->data_dir, "/tmp/carls-test-XXXXXX");
    if (!mkdtemp(srv->data_dir)) {
        perror("mkdtemp");
        abort();
    }
    snprintf(srv->endpoint_file, sizeof srv->endpoint_file, "%s/endpoint", srv->data_dir);
    snprintf(srv->log_file, sizeof srv->log_file, "%s/server.log", srv->data_dir);
}

int test_server_start(test_server_t *srv, const char *const *extra_args)
{
    unlink(srv->endpoint_file);
    char data[300];
    snprintf(data, sizeof data, "%s/db", srv->data_dir);
    const char *argv[64];
    int argc = 0;
    argv[argc++] = CARLS_BIN_DIR "/kb-server";
    argv[argc++] = "--listen";
    argv[argc++] = "tcp://127.0.0.1:*";
    argv[argc++] = "--data";
    argv[argc++] = data;
    argv[argc++] = "--endpoint-file";
    argv[argc++] = srv->endpoint_file;
    for (int i = 0; extra_args && extra_args[i] && argc < 62; i++)
        argv[argc++] = extra_args[i];
    argv[argc] = NULL;

    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        FILE *log = freopen(srv->log_file, "a", stderr);
        (void)log;
        execv(argv[0], (char *const *)argv);
        perror("execv kb-server");
        _exit(127);
    }
    srv->pid = pid;
    /* Wait up to 20 s for the endpoint file (the server writes it once bound). */
    int status = 0;
    int waited = carls_wait_first_line(srv->endpoint_file, pid, 20000, srv->endpoint, sizeof srv->endpoint, &status);
    if (waited == 0)
        return 0;
    if (waited == -1) {
        fprintf(stderr, "kb-server exited early (status %d); log in %s\n", status, srv->log_file);
        srv->pid = 0;
        return -1;
    }
    fprintf(stderr, "kb-server did not start in time; log in %s\n", srv->log_file);
    return -1;
}

int test_server_stop(test_server_t *srv, int sig)
{
    if (srv->pid <= 0)
        return -1;
    kill(srv->pid, sig);
    int status = 0;
    while (waitpid(srv->pid, &status, 0) < 0 && errno == EINTR) {
    }
    srv->pid = 0;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

int test_server_cleanup(test_server_t *srv)
{
    int status = 0;
    if (srv->pid > 0) {
        status = test_server_stop(srv, SIGTERM);
        if (status != 0) {
            fprintf(stderr, "kb-server exited with status %d on SIGTERM; its log:\n", status);
            char cmd[400];
            snprintf(cmd, sizeof cmd, "tail -n 40 '%s' >&2", srv->log_file);
            if (system(cmd) != 0)
                fprintf(stderr, "(no log)\n");
        }
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", srv->data_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", srv->data_dir);
    return status;
}

bool test_server_log_has(const test_server_t *srv, const char *text)
{
    size_t len = 0;
    unsigned char *log = test_read_file(srv->log_file, 1, &len);
    if (!log)
        return false;
    log[len] = '\0';
    bool found = strstr((char *)log, text) != NULL;
    free(log);
    return found;
}
