/* `carls run --resume` helpers (see carls_resume.h). */
#include "carls_resume.h"

#include "checkpoint.h"
#include "files.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Appends a line to out->why. */
static void s_why(carls_resume_candidates_t *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_why(carls_resume_candidates_t *out, const char *fmt, ...)
{
    size_t used = strlen(out->why);
    if (used + 2 >= sizeof out->why) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->why + used, sizeof out->why - used - 1, fmt, ap);
    va_end(ap);
    used = strlen(out->why);
    out->why[used] = '\n';
    out->why[used + 1] = '\0';
}

/* The step of a checkpoint file name ckpt-<12 digits>.ckpt, or -1. */
static long long s_step_of(const char *name)
{
    if (strlen(name) != 22 || strncmp(name, "ckpt-", 5) != 0 || strcmp(name + 17, ".ckpt") != 0) {
        return -1;
    }
    long long step = 0;
    for (int i = 5; i < 17; i++) {
        if (name[i] < '0' || name[i] > '9') {
            return -1;
        }
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

static int s_desc(const void *a, const void *b)
{
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of ckpt_dir's checkpoints, newest first, into steps (at most max); their number, or -1. */
static int s_steps(const char *ckpt_dir, long long *steps, int max)
{
    DIR *d = opendir(ckpt_dir);
    if (!d) {
        return -1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const long long s = s_step_of(e->d_name);
        if (s >= 0 && n < max) {
            steps[n++] = s;
        } else if (s >= 0) {
            /* more than max: keep the newest */
            qsort(steps, (size_t)n, sizeof *steps, s_desc);
            if (s > steps[n - 1]) {
                steps[n - 1] = s;
            }
        }
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, s_desc);
    return n;
}

int carls_resume_count(const char *ckpt_dir)
{
    long long steps[CARLS_RESUME_MAX];
    errno = 0;
    const int n = s_steps(ckpt_dir, steps, CARLS_RESUME_MAX);
    return n < 0 && errno == ENOENT ? 0 : n;
}

int carls_resume_candidates(const char *ckpt_dir, bool need_snapshot, const char *const *shard_dirs, int n_shards,
                            carls_resume_candidates_t *out)
{
    memset(out, 0, sizeof *out);
    long long steps[CARLS_RESUME_MAX];
    const int n = s_steps(ckpt_dir, steps, CARLS_RESUME_MAX);
    if (n < 0) {
        s_why(out, "cannot read the checkpoint directory %s: %s", ckpt_dir, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        carls_resume_pair_t *p = &out->pair[out->n];
        snprintf(p->path, sizeof p->path, "%s/ckpt-%012lld.ckpt", ckpt_dir, steps[i]);
        p->step = (unsigned long long)steps[i];
        carls_ckpt_t *c = NULL;
        char err[1024];
        if (carls_ckpt_read(p->path, &c, err, sizeof err) != 0) {
            s_why(out, "%s: damaged: %s", p->path, err);
            continue;
        }
        const char *snap = carls_ckpt_text(c, "bank.snapshot");
        bool ok = true;
        if (!carls_ckpt_text(c, "train.config")) {
            s_why(out, "%s: holds no trainer state (written by an older build?)", p->path);
            ok = false;
        } else if (need_snapshot && (!snap || strlen(snap) >= sizeof p->snapshot)) {
            s_why(out, "%s: names no bank snapshot (taking it failed: see logs/trainer.log)", p->path);
            ok = false;
        }
        for (int s = 0; ok && need_snapshot && s < n_shards; s++) {
            char manifest[4600];
            snprintf(manifest, sizeof manifest, "%s/snapshots/%s/MANIFEST", shard_dirs[s], snap);
            if (access(manifest, R_OK) != 0) {
                s_why(out, "%s: its bank snapshot %s is missing or incomplete: no %s", p->path, snap, manifest);
                ok = false;
            }
        }
        if (ok) {
            snprintf(p->snapshot, sizeof p->snapshot, "%s", need_snapshot ? snap : "");
            out->n++;
        }
        carls_ckpt_destroy(&c);
    }
    if (n == 0) {
        s_why(out, "%s holds no checkpoint", ckpt_dir);
    }
    return out->n;
}

int carls_resume_rollback(const char *ckpt_dir, unsigned long long step, char *err, size_t errlen)
{
    DIR *d = opendir(ckpt_dir);
    if (!d) {
        return carls_errorf(err, errlen, -1, "cannot read %s: %s", ckpt_dir, strerror(errno));
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL && rc == 0) {
        const long long s = s_step_of(e->d_name);
        if (s >= 0 && (unsigned long long)s > step) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", ckpt_dir, e->d_name);
            if (unlink(path) != 0) {
                rc = carls_errorf(err, errlen, -1, "cannot remove %s: %s", path, strerror(errno));
            }
        }
    }
    closedir(d);
    if (rc != 0) {
        return rc;
    }
    char latest[4400], line[64];
    snprintf(latest, sizeof latest, "%s/%s", ckpt_dir, CARLS_CKPT_LATEST);
    snprintf(line, sizeof line, "ckpt-%012llu.ckpt\n", step);
    return carls_write_file_atomic(latest, line, strlen(line), 0644, 0, err, errlen) == 0 ? 0 : -1;
}

int carls_resume_write_settings(const char *path, const char *config, const carls_ini_t *ini, char *err,
                                size_t errlen)
{
    carls_atomic_file_t *file = NULL;
    if (carls_atomic_open(path, 0644, 0, &file, err, errlen) != 0) {
        return -1;
    }
    FILE *f = carls_atomic_stream(file);
    fprintf(f, "# The settings of this run: %s with its --set overrides. carls run --resume reads them.\n", config);
    for (int i = 0; i < ini->n; i++) {
        fprintf(f, "%s = %s\n", ini->key[i], ini->value[i]);
    }
    return carls_atomic_commit(&file, err, errlen) == 0 ? 0 : -1;
}

void carls_resume_prefix(const char *name, char *out, size_t len)
{
    size_t n = 0;
    for (; name[n] && n + 1 < len && n < 39; n++) {
        const char ch = name[n];
        const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                        ch == '_' || ch == '-' || (ch == '.' && n > 0);
        out[n] = ok ? ch : (n == 0 && ch == '.' ? '_' : '-');
    }
    out[n] = '\0';
    if (n == 0 && len > 3) {
        snprintf(out, len, "run");
    }
}
