/* Helpers of the trainers' resume tests (see resume_testlib.h). */
#include "resume_testlib.h"

#include "maker_testlib.h"

#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole of a small file (NULL when unreadable); *len its size. */
char *rt_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    char *buf = calloc(1, 1 << 24);
    *len = fread(buf, 1, (1 << 24) - 1, f);
    fclose(f);
    return buf;
}

int rt_same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = rt_slurp(a, &la), *y = rt_slurp(b, &lb);
    int same = x && y && la == lb && la > 0 && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

void rt_sh(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    MT_CHECK(system(cmd) == 0, "%s", cmd);
}

/* Points dir/latest at the checkpoint of step. */
void rt_point_latest(const char *dir, int step)
{
    char path[600], line[64];
    snprintf(path, sizeof path, "%s/latest", dir);
    snprintf(line, sizeof line, "ckpt-%012d.ckpt\n", step);
    FILE *f = fopen(path, "w");
    MT_CHECK(f && fputs(line, f) >= 0, "write %s", path);
    if (f) {
        fclose(f);
    }
}

/* Copies checkpoint in to out with blob `name` replaced by value (a u64), or left out when drop is set. */
void rt_rewrite(const char *in, const char *out, const char *name, uint64_t value, int drop)
{
    carls_ckpt_t *c = NULL, *d = NULL;
    char err[512];
    MT_CHECK(carls_ckpt_read(in, &c, err, sizeof err) == 0, "%s", err);
    if (!c) {
        return;
    }
    d = carls_ckpt_new(carls_ckpt_kind(c), carls_ckpt_step(c));
    for (int i = 0; i < carls_ckpt_count(c); i++) {
        const carls_ckpt_tensor_t *t = carls_ckpt_tensor(c, i);
        MT_CHECK(carls_ckpt_add(d, t->name, t->ndim, t->dims, t->data) == 0, "copy %s", t->name);
    }
    for (int i = 0; i < carls_ckpt_blob_count(c) && !drop; i++) {
        size_t len = 0;
        const char *bn = carls_ckpt_blob_name(c, i, &len);
        if (strcmp(bn, name) == 0) {
            MT_CHECK(carls_ckpt_add_u64(d, bn, value) == 0, "set %s", bn);
        } else {
            MT_CHECK(carls_ckpt_add_blob(d, bn, carls_ckpt_blob(c, bn, NULL), len) == 0, "copy %s", bn);
        }
    }
    MT_CHECK(carls_ckpt_write(d, out, err, sizeof err) == 0, "%s", err);
    carls_ckpt_destroy(&c);
    carls_ckpt_destroy(&d);
}

int rt_tensor_differs(const char *a, const char *b, const char *name)
{
    carls_ckpt_t *ca = NULL, *cb = NULL;
    char err[512];
    MT_CHECK(carls_ckpt_read(a, &ca, err, sizeof err) == 0 && carls_ckpt_read(b, &cb, err, sizeof err) == 0, "%s",
             err);
    const carls_ckpt_tensor_t *ta = ca ? carls_ckpt_find(ca, name) : NULL, *tb = cb ? carls_ckpt_find(cb, name) : NULL;
    const int differs = ta && tb && ta->numel == tb->numel &&
                        memcmp(ta->data, tb->data, sizeof(float) * (size_t)ta->numel) != 0;
    carls_ckpt_destroy(&ca);
    carls_ckpt_destroy(&cb);
    return differs;
}

int rt_trainer(const char *const *args, const char *const *extra, const char *log)
{
    const char *argv[128];
    int n = 0;
    for (int i = 0; args[i] && n < 100; i++) {
        argv[n++] = args[i];
    }
    for (int i = 0; extra && extra[i] && n < 127; i++) {
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    return mt_wait(mt_spawn("trainer", (char *const *)argv, log), 120000);
}
