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
 * The last stdout line is the result as key=value pairs, accuracy first. Exit status: 0, 1 when a process
 * failed, 2 on bad usage, 130 when interrupted. */
#ifndef CARLS_RUN_H
#define CARLS_RUN_H

int carls_run_main(int argc, char **argv);

#endif
