/* The progress of a long command on stderr: when stderr is a terminal, one line redrawn in place (at most 10
 * times a second) with a bar, the count, the rate and the time left; otherwise plain log lines, one every
 * 10 s while the phase runs and one when it ends, so logs stay readable. Used by the trainer's epochs and
 * kbctl's import and export. */
#ifndef CARLS_PROGRESS_H
#define CARLS_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CARLS_PROGRESS_LOG_EVERY_US 10000000 /* non-terminal: a line every 10 s */

typedef struct {
    char label[64];       /* e.g. "epoch 3/10", "import emb" */
    char unit[16];        /* what is counted: "ex", "rows", "tokens" */
    bool with_loss;       /* show the running mean loss (carls_progress_start) */
    int64_t total;        /* units this phase; 0: unknown (no bar, no time left) */
    int64_t done;         /* units so far */
    int64_t start_us;     /* when the phase started (monotonic) */
    int64_t last_draw_us; /* last redraw or log line */
    double loss_sum;      /* sum of per-batch mean losses, for the running mean */
    int64_t batches;      /* batches so far */
    bool tty;             /* stderr is a terminal */
} carls_progress_t;

/* A training phase of total examples: the line shows the running mean loss and examples per second. */
void carls_progress_start(carls_progress_t *p, const char *label, int64_t total);
/* A phase of total units (0: unknown) named unit ("rows"): count, rate and time left, no loss. */
void carls_progress_start_units(carls_progress_t *p, const char *label, int64_t total, const char *unit);
/* n more examples done, with their batch's mean loss. */
void carls_progress_update(carls_progress_t *p, int64_t n, double loss);
/* n more units done (carls_progress_start_units). */
void carls_progress_add(carls_progress_t *p, int64_t n);
/* On a terminal, erases the progress line so a log line can be printed in its place (the next update draws
 * it again); otherwise nothing. */
void carls_progress_clear(carls_progress_t *p);
/* Ends the phase: prints the final state (with extra text, may be NULL) and returns the units per second. */
double carls_progress_finish(carls_progress_t *p, const char *extra);

/* The progress text at time now_us (monotonic) into buf: label, bar and percentage (when the total is known),
 * count, [loss,] rate and time left. For the drawing above and for tests. */
void carls_progress_format(const carls_progress_t *p, int64_t now_us, char *buf, size_t len);

#endif
