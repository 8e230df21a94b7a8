/* The wall time of each stage of a `carls run`, in the order the stages ran: the bank's start-up, the initial
 * makers (pixel embeddings), the initial graph, the first label spreading, the trainer's share split into its
 * start-up, training and evaluation, the shutdown and the report. The launcher measures the stages it waits for
 * itself; the trainer's split comes from what the trainer reports (carls_stages_trainer). Stages do not
 * overlap, so their sum is at most the run's total.
 *
 * Two outputs: rows of report.md's "Stages" table (carls_stages_table) and RUN/stages.json
 * (carls_stages_write_json), for scripts:
 *
 *   {"run": "NAME", "experiment": "graphreg", "exit_status": 0, "total": 41.3,
 *    "stages": {"bank_startup": 0.2, "pixel_embeddings": 1.9, ...},
 *    "stage_names": {"bank_startup": "bank: 1 kb-server", ...}}
 *
 * seconds are wall-clock, rounded to milliseconds; "stages" keeps the order the stages ran. */
#ifndef CARLS_STAGES_H
#define CARLS_STAGES_H

#include "carls_report.h"

#include <stddef.h>

#define CARLS_STAGES_MAX 24
#define CARLS_STAGES_JSON "stages.json" /* in the run's directory */

typedef struct {
    int n;
    char key[CARLS_STAGES_MAX][40];   /* stages.json's key: snake_case, unique within the run */
    char name[CARLS_STAGES_MAX][200]; /* report.md's row: what happened, in words */
    double seconds[CARLS_STAGES_MAX]; /* wall time, >= 0 */
} carls_stages_t;

/* Appends stage key (a second stage of the same key gets "_2", "_3", ...) named by fmt, seconds long
 * (negative counts as 0). A stage past CARLS_STAGES_MAX is dropped. */
void carls_stages_add(carls_stages_t *s, const char *key, double seconds, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The sum of the stages' seconds. */
double carls_stages_sum(const carls_stages_t *s);

/* Splits the trainer's wall time (wall seconds, from its start to its exit) into stages, from what it reported:
 *   graphreg: training = train_seconds (trainer.out: its steps, bank waits included); evaluation = the rest of
 *             the time from its first step to its last evaluation (elapsed_s of metrics_csv's last row: the
 *             evaluations and checkpoints between steps); start-up = the rest (data, model, the step-0
 *             checkpoint; and the summary and exit).
 *   twotower: training = train_steps / train_steps_per_s (its loop, checkpoints included); the wait for the
 *             makers' word vectors of the final checkpoint and the evaluation from trainer_log's lines
 *             ("waited S s for the makers", "evaluated ... in S s", whose S includes that wait); start-up =
 *             the rest (data, lexical index, tables, the final checkpoint, exit).
 * Parts it cannot find count as 0; the parts never add up to more than wall. */
void carls_stages_trainer(carls_stages_t *s, double wall, const char *experiment, const carls_result_t *res,
                          const char *metrics_csv, const char *trainer_log);

/* Markdown rows ("| stage | seconds |" without the header), the stages then "| total (the whole run) | T |",
 * into out (len bytes; cut short when it does not fit). */
void carls_stages_table(const carls_stages_t *s, double total, char *out, size_t len);

/* Writes path (stages.json, above) atomically. 0, or -1 with err. */
int carls_stages_write_json(const char *path, const carls_stages_t *s, double total, const char *run,
                            const char *experiment, int exit_status, char *err, size_t errlen);

#endif
