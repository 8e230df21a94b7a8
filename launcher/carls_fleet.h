/* The run's makers: one-shot fleets run to completion (the initial graph, phase 2) and the resident fleet on
 * the trainer's checkpoints (phase 3): their command lines, starts and supervision (a maker that dies is
 * restarted within max_maker_restarts; past that the others carry on). */
#ifndef CARLS_FLEET_H
#define CARLS_FLEET_H

typedef struct carls_run carls_run_t;

/* 2. The initial graph over pixels, and with a label maker a first label-spreading pass. Returns 0 or -1. */
int carls_fleet_initial_graph(carls_run_t *r);

/* 3. The maker fleet on the checkpoint directory: embed makers, graph makers (graph_refresh), word-tower
 * makers (twotower), a label maker. Returns 0 or -1. */
int carls_fleet_start(carls_run_t *r);


/* One round of the resident makers' supervision (carls_run_supervise): a maker that died is counted, and
 * restarted unless max_maker_restarts are used up. */
void carls_fleet_supervise(carls_run_t *r);

/* 5. Stops the resident makers (after the trainer): SIGTERM to all, then each waited for; a maker found dead
 * first is counted and noted in the report. */
void carls_fleet_stop(carls_run_t *r);

#endif
