/* CSV metrics (see trainer_metrics.h). */
#include "trainer_metrics.h"

#include <string.h>

/* Opens path in mode ("w" or "a") and writes the header when the file is empty. */
static int s_open(trainer_metrics_t *m, const char *path, const char *header, const char *mode)
{
    memset(m, 0, sizeof *m);
    m->f = fopen(path, mode);
    if (!m->f) {
        return -1;
    }
    m->columns = 1;
    for (const char *p = header; *p; p++) {
        m->columns += *p == ',';
    }
    if (ftell(m->f) == 0) {
        fprintf(m->f, "%s\n", header);
        fflush(m->f);
    }
    return 0;
}

int trainer_metrics_open(trainer_metrics_t *m, const char *path, const char *header)
{
    return s_open(m, path, header, "w");
}

int trainer_metrics_append(trainer_metrics_t *m, const char *path, const char *header)
{
    return s_open(m, path, header, "a");
}

void trainer_metrics_row(trainer_metrics_t *m, const double *values)
{
    if (!m->f) {
        return;
    }
    for (int i = 0; i < m->columns; i++) {
        fprintf(m->f, "%s%.6g", i ? "," : "", values[i]);
    }
    fputc('\n', m->f);
    fflush(m->f);
}

void trainer_metrics_close(trainer_metrics_t *m)
{
    if (m->f) {
        fclose(m->f);
    }
    m->f = NULL;
}
