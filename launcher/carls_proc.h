/* Child processes of the launcher: started with their output in log files, stopped with SIGTERM (then
 * SIGKILL after a grace period), reaped. */
#ifndef CARLS_PROC_H
#define CARLS_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <sys/types.h>

#define CARLS_PROC_MAX 64

typedef struct {
    char name[64];      /* for messages, e.g. "maker embed 1/2" */
    pid_t pid;          /* 0 once reaped */
    pid_t started_pid;  /* the pid it ran with (kept after reaping) */
    int64_t started_ms; /* wall-clock start (ms since the epoch) */
    int status;         /* exit status once reaped: the code, or 128 + signal */
    int signal;         /* the signal that ended it (0: it exited) */
    bool running;
} carls_proc_t;

/* Starts argv[0] (a path) with argv (NULL-terminated), stdout to out_path and stderr to err_path (the same
 * path may be given for both; NULL: /dev/null), in its own process group is NOT used, so a terminal's
 * Ctrl-C reaches it too. Returns 0, or -1 (logged). */
int carls_proc_start(carls_proc_t *p, const char *name, char *const argv[], const char *out_path,
                     const char *err_path);

/* Another way to run the processes carls_proc_start starts (carls_slurm.h: as Slurm job steps). When a runner
 * is set, the forked child calls run(ctx, name, argv) after its stdio is redirected instead of exec'ing
 * argv[0]; run must not return (it _exits with the status the process should be seen to end with, or dies by
 * the signal that ended it). The parent's view is unchanged: the pid is the runner's, SIGTERM to it must
 * stop the process politely, SIGKILL stop it for good. */
typedef struct {
    void (*run)(void *ctx, const char *name, char *const argv[]);
    void *ctx;
} carls_proc_runner_t;

/* What a runner's process must take as "kill the program now, wherever it runs" (a hung one): SIGKILL would
 * end only the runner's own process on this machine. */
#define CARLS_PROC_KILL_SIGNAL SIGUSR1

/* Sends SIGKILL to p's program: to the process itself, or CARLS_PROC_KILL_SIGNAL to a runner's process. */
void carls_proc_kill(const carls_proc_t *p);

/* Sets the runner for every later carls_proc_start (NULL: exec argv[0] directly, the default). The
 * structure is copied. */
void carls_proc_set_runner(const carls_proc_runner_t *runner);

/* Non-blocking: reaps p if it has exited. Returns true when it is no longer running. */
bool carls_proc_poll(carls_proc_t *p);

/* Non-blocking, and leaves the exit to be reaped by carls_proc_poll: whether p is no longer running or has
 * exited. For a look at another member of a group whose deaths one loop handles (it would not see one reaped
 * here). */
bool carls_proc_ended(const carls_proc_t *p);

/* Waits for p to exit (up to timeout_ms; negative: forever). Returns true when it exited. */
bool carls_proc_wait(carls_proc_t *p, int timeout_ms);

/* How a reaped process ended, for log lines: "exited with status 1", "exited on signal 9 (SIGKILL)". */
const char *carls_proc_describe(const carls_proc_t *p, char *buf, size_t len);

/* SIGTERM, wait up to grace_ms, then SIGKILL and wait. Returns the exit status (128 + signal when killed). */
int carls_proc_stop(carls_proc_t *p, int grace_ms);

/* Starts argv[0] (a path) on this machine, never through the runner, with stdin from /dev/null and stdout and
 * stderr to out_fd (-1: /dev/null), and returns its pid without waiting (-1 when fork failed). */
pid_t carls_proc_spawn_local(char *const argv[], int out_fd);

/* Runs argv[0] (a path) on this machine, never through the runner (the launcher's own short commands, such
 * as `kbctl replica`, which reach the servers over the network wherever they run), and waits up to timeout_ms
 * for it. Its stdout and stderr together go to out (len bytes, NUL-terminated; the rest is dropped). Returns
 * its exit status (128 + signal when a signal ended it), or -1 when it could not start or ran out of time
 * (then it is killed, and out says so). */
int carls_proc_capture(char *const argv[], char *out, size_t len, int timeout_ms);

#endif
