/* `carls run CONFIG [--set key=value]...`: one experiment from one configuration file (CARLS Figure 2):
 *
 *   1. kb-server (shard 0/1) on a free loopback port, data in runs/<name>/kb;
 *   2. the initial graph: a pixel-embedding fleet (--encoder pixels) and a graph fleet over the pixels;
 *      with a label maker, a first label-spreading pass (graph only);
 *   3. the maker fleet on the trainer's checkpoint directory: `makers` embed makers (neighbour embeddings),
 *      a label maker (graph + model predictions), and with graph_refresh the graph fleet on the embeddings;
 *   4. trainer graphreg; its evaluation lines and the makers' progress are shown as they come;
 *   5. when the trainer exits (or on Ctrl-C / SIGTERM): SIGTERM to every maker and the server, SIGKILL after
 *      a grace period; then runs/<name>/metrics.csv, accuracy.png, staleness.png and report.md.
 *
 * Supervision, all along: a kb-server that dies is restarted with the same flags, data directory and
 * endpoint (kb_durability = sync keeps every acknowledged write), at most max_bank_restarts times; makers and
 * trainer wait for it and reconnect (km_maker.h, trainer_prefetch.h). A maker that dies is restarted, at
 * most max_maker_restarts times in all; past that the other makers and the trainer carry on without it.
 * Each death and restart is logged ("kb-server exited on signal 9 (SIGKILL); restarting (1/3) ..."), listed
 * in report.md's Faults section and counted in the result line (bank_restarts, maker_deaths,
 * maker_restarts). runs/<name>/processes.tsv lists every process started, live (carls_ptab.h).
 *
 * The last stdout line is the result as key=value pairs, accuracy first. Exit status: 0, 1 when a process
 * failed (or the bank died more than max_bank_restarts times), 2 on bad usage, 130 when interrupted. */
#ifndef CARLS_RUN_H
#define CARLS_RUN_H

int carls_run_main(int argc, char **argv);

#endif
