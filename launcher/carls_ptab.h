/* The launcher's process table: every process a run started (the bank and its restarts, every maker, the
 * trainer), written as runs/<name>/processes.tsv so people and tests can see what ran and how it ended.
 *
 * processes.tsv: a header line, then one tab-separated line per process in start order:
 *   role      kb-server | maker | trainer
 *   name      e.g. "kb-server 0/1", "maker embed 1/2", "pixels 0/2" (a one-shot fleet), "trainer"
 *   pid       its process id
 *   started   wall-clock start, UTC, ISO 8601 with milliseconds
 *   ended     wall-clock end, or "-" while it runs
 *   exit      "running", the exit code ("0", "1"), or "signal N" when a signal ended it
 *   note      what the launcher made of it: "finished", "stopped by the launcher", "died: restarted as pid
 *             N (1/3)", "died: not restarted", "restart 1/3 of kb-server 0/1", ...
 * The file is rewritten (temporary file + rename) whenever a process starts or ends, so it can be read while
 * the run goes on. */
#ifndef CARLS_PTAB_H
#define CARLS_PTAB_H

#include "carls_proc.h"

#define CARLS_PTAB_MAX 512

typedef struct {
    char role[16];
    char name[64];
    int pid;
    int64_t started_ms; /* wall clock */
    int64_t ended_ms;   /* 0 while running */
    int status, signal; /* as carls_proc_t */
    char note[128];
} carls_ptab_row_t;

typedef struct {
    char path[4200]; /* processes.tsv */
    int n;
    carls_ptab_row_t row[CARLS_PTAB_MAX];
} carls_ptab_t;

/* An empty table written to path. */
void carls_ptab_init(carls_ptab_t *t, const char *path);

/* Records a started process (role: kb-server, maker or trainer; note may be NULL) and rewrites the file.
 * Returns the row index, or -1 when the table is full (the process is then not listed; logged). */
int carls_ptab_started(carls_ptab_t *t, const char *role, const carls_proc_t *p, const char *note);

/* Records how the process of row ended (p reaped) with note, and rewrites the file. row < 0 is ignored. */
void carls_ptab_ended(carls_ptab_t *t, int row, const carls_proc_t *p, const char *note);

/* Replaces the note of row and rewrites the file. */
void carls_ptab_note(carls_ptab_t *t, int row, const char *note);

/* Writes the file. 0, or -1 (logged). */
int carls_ptab_write(const carls_ptab_t *t);

#endif
