/* The run's trainer (phase 4): its command line (trainer graphreg or twotower), its start, and its log and the
 * makers' followed while the run is supervised; its share of the stage times. */
#ifndef CARLS_TRAIN_H
#define CARLS_TRAIN_H

typedef struct carls_run carls_run_t;

/* 4. The trainer: started, then followed (its evaluation lines at once, the makers' lines at most every 10 s)
 * while the bank and the makers are supervised, until it exits, the bank is lost, timeout_s passes or we are
 * interrupted. Returns 0, or -1 when it could not be started. */
int carls_train_run(carls_run_t *r);

/* The trainer's stages (wall seconds from its start until the launcher stopped waiting for it): split into
 * start-up, training and evaluation by what it reported when it finished (carls_stages_trainer); one stage
 * when it failed or was stopped. */
void carls_train_stages(carls_run_t *r, double wall);

#endif
