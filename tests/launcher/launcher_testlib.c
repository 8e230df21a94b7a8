/* What the `carls run` tests share (see launcher_testlib.h). */
#include "launcher_testlib.h"

#include "maker_testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int lt_scratch(lt_scratch_t *t, const char *name)
{
    if (!mt_have_fmnist()) {
        printf("SKIPPED: dataset-fashion-mnist is not installed\n");
        return 77;
    }
    memset(t, 0, sizeof *t);
    mt_tempdir(t->dir, name);
    snprintf(t->runs, sizeof t->runs, "%s/runs", t->dir);
    snprintf(t->run, sizeof t->run, "%s/%s", t->runs, name);
    snprintf(t->log, sizeof t->log, "%s/carls.log", t->dir);
    snprintf(t->set_runs, sizeof t->set_runs, "runs_dir=%s", t->runs);
    return 0;
}

long lt_latest_step(const char *run, long none)
{
    char path[512], text[128] = "";
    snprintf(path, sizeof path, "%s/ckpt/latest", run);
    FILE *f = fopen(path, "r");
    if (!f) {
        return none;
    }
    if (!fgets(text, sizeof text, f)) {
        text[0] = '\0';
    }
    fclose(f);
    const char *d = strpbrk(text, "0123456789");
    return d ? atol(d) : none;
}
