/* Child processes (see carls_proc.h). */
#include "carls_proc.h"

#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static carls_proc_runner_t s_runner;

void carls_proc_set_runner(const carls_proc_runner_t *runner)
{
    memset(&s_runner, 0, sizeof s_runner);
    if (runner) {
        s_runner = *runner;
    }
}

static int s_open_out(const char *path)
{
    return open(path ? path : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

/* In a forked child: stdin from /dev/null, stdout to out and stderr to err (-1: /dev/null), the default
 * SIGINT and SIGTERM, then argv through the runner when one is given, else exec'd. Never returns. */
static void s_child(int out, int err, const char *name, char *const argv[], const carls_proc_runner_t *runner)
    __attribute__((noreturn));
static void s_child(int out, int err, const char *name, char *const argv[], const carls_proc_runner_t *runner)
{
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
    }
    dup2(out >= 0 ? out : null, 1);
    dup2(err >= 0 ? err : null, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (runner && runner->run) {
        runner->run(runner->ctx, name, argv);
        _exit(127); /* run must not return */
    }
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int carls_proc_start(carls_proc_t *p, const char *name, char *const argv[], const char *out_path,
                     const char *err_path)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    int out = s_open_out(out_path);
    int err = (err_path && out_path && strcmp(err_path, out_path) == 0) ? dup(out) : s_open_out(err_path);
    if (out < 0 || err < 0) {
        LOG_ERROR("%s: cannot open its log files: %s", name, strerror(errno));
        if (out >= 0) {
            close(out);
        }
        if (err >= 0) {
            close(err);
        }
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        LOG_ERROR("%s: fork: %s", name, strerror(errno));
        close(out);
        close(err);
        return -1;
    }
    if (pid == 0) {
        s_child(out, err, name, argv, &s_runner);
    }
    close(out);
    close(err);
    p->pid = pid;
    p->started_pid = pid;
    p->started_ms = carls_wall_ms();
    p->running = true;
    return 0;
}

static void s_reaped(carls_proc_t *p, int st)
{
    p->running = false;
    p->pid = 0;
    p->status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
    p->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

const char *carls_proc_describe(const carls_proc_t *p, char *buf, size_t len)
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {{SIGKILL, "SIGKILL"}, {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"}, {SIGSEGV, "SIGSEGV"},
                 {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"}, {SIGHUP, "SIGHUP"},
                 {SIGPIPE, "SIGPIPE"}, {SIGILL, "SIGILL"}};
    if (p->running) {
        snprintf(buf, len, "is running");
    } else if (p->signal) {
        const char *name = "?";
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            name = names[i].sig == p->signal ? names[i].name : name;
        }
        snprintf(buf, len, "exited on signal %d (%s)", p->signal, name);
    } else {
        snprintf(buf, len, "exited with status %d", p->status);
    }
    return buf;
}

void carls_proc_kill(const carls_proc_t *p)
{
    if (p->running) {
        kill(p->pid, s_runner.run ? CARLS_PROC_KILL_SIGNAL : SIGKILL);
    }
}

bool carls_proc_poll(carls_proc_t *p)
{
    if (!p->running) {
        return true;
    }
    int st = 0;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
        s_reaped(p, st);
        return true;
    }
    return false;
}

bool carls_proc_ended(const carls_proc_t *p)
{
    if (!p->running) {
        return true;
    }
    siginfo_t info = {0};
    return waitid(P_PID, (id_t)p->pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == p->pid;
}

bool carls_proc_wait(carls_proc_t *p, int timeout_ms)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int waited = 0; timeout_ms < 0 || waited <= timeout_ms; waited += 20) {
        if (carls_proc_poll(p)) {
            return true;
        }
        nanosleep(&ts, NULL);
    }
    return carls_proc_poll(p);
}

int carls_proc_stop(carls_proc_t *p, int grace_ms)
{
    if (!p->running) {
        return p->status;
    }
    kill(p->pid, SIGTERM);
    if (!carls_proc_wait(p, grace_ms)) {
        LOG_WARN("%s (pid %d) did not stop within %d ms of SIGTERM: SIGKILL", p->name, (int)p->pid, grace_ms);
        kill(p->pid, SIGKILL);
        carls_proc_wait(p, -1);
    }
    return p->status;
}

pid_t carls_proc_spawn_local(char *const argv[], int out_fd)
{
    const pid_t pid = fork();
    if (pid == 0) {
        s_child(out_fd, out_fd, argv[0], argv, NULL);
    }
    return pid;
}

int carls_proc_capture(char *const argv[], char *out, size_t len, int timeout_ms)
{
    size_t used = 0;
    out[0] = '\0';
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(out, len, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = carls_proc_spawn_local(argv, fds[1]);
    close(fds[1]);
    if (pid < 0) {
        snprintf(out, len, "fork: %s", strerror(errno));
        close(fds[0]);
        return -1;
    }
    const int64_t deadline = carls_monotonic_ms() + timeout_ms;
    bool timed_out = false;
    for (;;) {
        const int64_t left = deadline - carls_monotonic_ms();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        const int ready = poll(&pfd, 1, (int)left);
        if (ready < 0 && errno == EINTR) {
            continue;
        }
        if (ready <= 0) {
            timed_out = ready == 0;
            break;
        }
        char chunk[4096];
        const ssize_t n = read(fds[0], chunk, sizeof chunk);
        if (n <= 0) {
            break; /* end of its output: it exited (or closed both) */
        }
        const size_t take = used + 1 < len ? ((size_t)n < len - 1 - used ? (size_t)n : len - 1 - used) : 0;
        memcpy(out + used, chunk, take);
        used += take;
        out[used] = '\0';
    }
    close(fds[0]);
    if (timed_out) {
        kill(pid, SIGKILL);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (timed_out) {
        snprintf(out + used, len - used, "%s(no answer within %d ms: killed)", used ? " " : "", timeout_ms);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
}
