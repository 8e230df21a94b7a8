/* The launcher's process table and processes.tsv (see carls_ptab.h). */
#include "carls_ptab.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

void carls_ptab_init(carls_ptab_t *t, const char *path)
{
    t->n = 0;
    snprintf(t->path, sizeof t->path, "%s", path);
    carls_ptab_write(t);
}

int carls_ptab_started(carls_ptab_t *t, const char *role, const carls_proc_t *p, const char *note)
{
    if (t->n >= CARLS_PTAB_MAX) {
        LOG_WARN("processes.tsv is full (%d rows): %s (pid %d) is not listed", CARLS_PTAB_MAX, p->name,
                 (int)p->started_pid);
        return -1;
    }
    carls_ptab_row_t *r = &t->row[t->n];
    memset(r, 0, sizeof *r);
    snprintf(r->role, sizeof r->role, "%s", role);
    snprintf(r->name, sizeof r->name, "%s", p->name);
    snprintf(r->note, sizeof r->note, "%s", note ? note : "");
    r->pid = (int)p->started_pid;
    r->started_ms = p->started_ms;
    t->n++;
    carls_ptab_write(t);
    return t->n - 1;
}

void carls_ptab_ended(carls_ptab_t *t, int row, const carls_proc_t *p, const char *note)
{
    if (row < 0 || row >= t->n) {
        return;
    }
    carls_ptab_row_t *r = &t->row[row];
    r->ended_ms = carls_wall_ms();
    r->status = p->status;
    r->signal = p->signal;
    if (note) {
        snprintf(r->note, sizeof r->note, "%s", note);
    }
    carls_ptab_write(t);
}

void carls_ptab_note(carls_ptab_t *t, int row, const char *note)
{
    if (row < 0 || row >= t->n) {
        return;
    }
    snprintf(t->row[row].note, sizeof t->row[row].note, "%s", note);
    carls_ptab_write(t);
}

/* "2026-01-02T03:04:05.678Z" */
static void s_iso(int64_t ms, char *buf, size_t len)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03dZ", (int)(ms % 1000));
}

int carls_ptab_write(const carls_ptab_t *t)
{
    char err[512];
    carls_atomic_file_t *file = NULL;
    if (carls_atomic_open(t->path, 0666, 0, &file, err, sizeof err) != 0) {
        LOG_WARN("%s", err);
        return -1;
    }
    FILE *f = carls_atomic_stream(file);
    fprintf(f, "role\tname\tpid\tstarted\tended\texit\tnote\n");
    for (int i = 0; i < t->n; i++) {
        const carls_ptab_row_t *r = &t->row[i];
        char started[40], ended[40] = "-", exit[32] = "running";
        s_iso(r->started_ms, started, sizeof started);
        if (r->ended_ms) {
            s_iso(r->ended_ms, ended, sizeof ended);
            if (r->signal) {
                snprintf(exit, sizeof exit, "signal %d", r->signal);
            } else {
                snprintf(exit, sizeof exit, "%d", r->status);
            }
        }
        fprintf(f, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r->role, r->name, r->pid, started, ended, exit, r->note);
    }
    if (carls_atomic_commit(&file, err, sizeof err) != 0) { /* a failed write above fails the commit */
        LOG_WARN("%s", err);
        return -1;
    }
    return 0;
}
