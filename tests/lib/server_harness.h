/* Test harness: runs a real kb-server process on a free loopback port with its own data directory. */
#ifndef CARLS_SERVER_HARNESS_H
#define CARLS_SERVER_HARNESS_H

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    char data_dir[256];
    char endpoint[256];
    char endpoint_file[300];
    char log_file[300];
} test_server_t;

/* Makes a fresh temporary data directory for srv (call once per test). */
void test_server_init(test_server_t *srv);

/* Starts build/bin/kb-server on tcp://127.0.0.1:* with srv->data_dir plus extra (NULL-terminated) args and
 * waits until it listens; srv->endpoint then holds the endpoint. Returns 0, or -1 (and logs why). */
int test_server_start(test_server_t *srv, const char *const *extra_args);

/* Sends sig and waits for the process. Returns its exit status (or 128+signal). */
int test_server_stop(test_server_t *srv, int sig);

/* Whether the server's log (its stderr, all its starts) holds text so far. */
bool test_server_log_has(const test_server_t *srv, const char *text);

/* Stops the server if running with SIGTERM (a clean shutdown: under the sanitizers LeakSanitizer checks the
 * server then) and removes the data directory. Returns the server's exit status (0 when it was not
 * running): tests fail on anything else, so a leak or an unclean shutdown fails them. */
int test_server_cleanup(test_server_t *srv);

#endif
