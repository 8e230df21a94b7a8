/* A progress bar on stderr: redrawn in place (at most 10 times a second) when stderr is a terminal, one line
 * per finished phase otherwise, so logs stay readable. */
#ifndef CARLS_PROGRESS_H
#define CARLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char label[64];       /* e.g. "epoch 3/10" */
    int64_t total;        /* examples this phase */
    int64_t done;         /* examples so far */
    int64_t start_us;     /* when the phase started (monotonic) */
    int64_t last_draw_us; /* last redraw */
    double loss_sum;      /* sum of per-batch mean losses, for the running mean */
    int64_t batches;      /* batches so far */
    bool tty;             /* stderr is a terminal */
} carls_progress_t;

void carls_progress_start(carls_progress_t *p, const char *label, int64_t total);
/* n more examples done, with their batch's mean loss. */
void carls_progress_update(carls_progress_t *p, int64_t n, double loss);
/* Ends the phase: prints the final state (with extra text, may be NULL) and returns the examples per second. */
double carls_progress_finish(carls_progress_t *p, const char *extra);

#endif
