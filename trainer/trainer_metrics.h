/* Metrics as CSV: a header line, then one row per evaluation, flushed as it is written so a run that dies
 * keeps what it measured. */
#ifndef TRAINER_METRICS_H
#define TRAINER_METRICS_H

#include <stdio.h>

typedef struct {
    FILE *f;     /* open CSV file */
    int columns; /* number of columns in the header */
} trainer_metrics_t;

/* Opens path for writing and writes the comma-separated header. Returns 0, or -1 (errno set). */
int trainer_metrics_open(trainer_metrics_t *m, const char *path, const char *header);
/* For a resumed run: opens path to append (writing the header only when the file is empty). Returns 0, or -1
 * (errno set). */
int trainer_metrics_append(trainer_metrics_t *m, const char *path, const char *header);
/* Writes one row of `columns` numbers (printed with %.6g). */
void trainer_metrics_row(trainer_metrics_t *m, const double *values);
void trainer_metrics_close(trainer_metrics_t *m);

#endif
