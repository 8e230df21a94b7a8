/* Child processes of the launcher: started with their output in log files, stopped with SIGTERM (then
 * SIGKILL after a grace period), reaped. */
#ifndef CARLS_PROC_H
#define CARLS_PROC_H

#include <stdbool.h>
#include <sys/types.h>

#define CARLS_PROC_MAX 64

typedef struct {
    char name[64];   /* for messages, e.g. "maker embed 1/2" */
    pid_t pid;       /* 0 once reaped */
    int status;      /* exit status once reaped: the code, or 128 + signal */
    bool running;
} carls_proc_t;

/* Starts argv[0] (a path) with argv (NULL-terminated), stdout to out_path and stderr to err_path (the same
 * path may be given for both; NULL: /dev/null), in its own process group is NOT used, so a terminal's
 * Ctrl-C reaches it too. Returns 0, or -1 (logged). */
int carls_proc_start(carls_proc_t *p, const char *name, char *const argv[], const char *out_path,
                     const char *err_path);

/* Non-blocking: reaps p if it has exited. Returns true when it is no longer running. */
bool carls_proc_poll(carls_proc_t *p);

/* Waits for p to exit (up to timeout_ms; negative: forever). Returns true when it exited. */
bool carls_proc_wait(carls_proc_t *p, int timeout_ms);

/* SIGTERM, wait up to grace_ms, then SIGKILL and wait. Returns the exit status (128 + signal when killed). */
int carls_proc_stop(carls_proc_t *p, int grace_ms);

#endif
