/* What the launcher writes after a run into runs/<name>/: PNG plots of the trainer's metrics CSV (through
 * gnuplot, when it is installed) and report.md with the configuration, the result table and the stages'
 * timings (carls_stages.h). */
#ifndef CARLS_REPORT_H
#define CARLS_REPORT_H

#include "carls_ini.h"

#include <stddef.h>

#define CARLS_RESULT_MAX 64

/* key=value numbers parsed from the trainer's stdout, in order of appearance. */
typedef struct {
    int n;
    char key[CARLS_RESULT_MAX][64];
    double value[CARLS_RESULT_MAX];
} carls_result_t;

/* Reads every blank-separated "key=number" word of path into *r (a key seen twice keeps its last value).
 * Returns the number of keys, or -1 if the file cannot be read. */
int carls_result_read(carls_result_t *r, const char *path);
/* The value of key, or NULL when absent. */
const double *carls_result_get(const carls_result_t *r, const char *key);

/* Plots the trainer's metrics_csv with gnuplot: for experiment "graphreg" accuracy and neighbour staleness over
 * steps (dir/accuracy.png, dir/staleness.png), for "twotower" loss and speed and the bank negatives' staleness
 * (dir/loss.png, dir/staleness.png); when dir holds knowledge.csv (carls_knowledge.h) also dir/knowledge.png
 * (graph purity and pseudo-label accuracy per refresh). Returns 0, or -1 when gnuplot is missing or failed
 * (logged; the report says so). */
int carls_report_plots(const char *dir, const char *metrics_csv, const char *experiment);

/* Writes dir/report.md. phases: the rows of the stage table (carls_stages_table; may be NULL). faults: markdown
 * for the "Faults" section (restarts, deaths; may be NULL). plotted: whether the PNGs exist. With
 * dir/knowledge.csv, a "Knowledge per refresh" section shows its rows. */
int carls_report_write(const char *dir, const char *config_path, const carls_ini_t *ini, const carls_result_t *r,
                       const char *phases, const char *faults, int plotted);

#endif
