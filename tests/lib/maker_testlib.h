/* Helpers shared by the maker tests: checks that print file:line, a kb-maker child process, temp dirs. */
#ifndef MAKER_TESTLIB_H
#define MAKER_TESTLIB_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

extern int mt_failures;

#define MT_CHECK(cond, ...)                                                                                 \
    do {                                                                                                    \
        if (!(cond)) {                                                                                      \
            fprintf(stderr, "%s:%d: CHECK FAILED: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                                   \
            fprintf(stderr, "\n");                                                                          \
            mt_failures++;                                                                                  \
        }                                                                                                   \
    } while (0)

/* 1 when dataset-fashion-mnist is installed. */
int mt_have_fmnist(void);

/* mkdtemp under /tmp; path (>= 64 bytes). */
void mt_tempdir(char *path, const char *tag);

/* Starts build/bin/<prog> with argv (NULL-terminated, argv[0] is ignored), output to log. Returns the pid. */
pid_t mt_spawn(const char *prog, char *const argv[], const char *log);
/* Waits up to timeout_ms for pid; returns its exit status, 128+signal, or -1 on timeout (the child is then
 * killed). */
int mt_wait(pid_t pid, int timeout_ms);
/* The exit status of a test program, for main to return: 1 when a check failed (dir, if given, is kept and
 * named: the logs are there), else 0 after removing dir (if given) and printing "<name>: OK". */
int mt_finish(const char *name, const char *dir);

/* Checks how a `carls run` ended: exit status st 0 and, as the last line of its log, the result line
 * "test_accuracy=A ..." with A in (0.4, 1]. line (len bytes) receives that line. */
void mt_check_run_result(int st, const char *log, char *line, size_t len);

/* 1 when file contains text. */
int mt_file_contains(const char *path, const char *text);

#endif
