/* `carls run CONFIG [--set key=value]...`: one experiment from one configuration file (CARLS Figure 2):
 *
 *   1. the bank: `shards` kb-servers (default 1; `--shard I/N` each when N > 1) on free loopback ports, data in
 *      runs/<name>/kb (one shard) or kb-I; every maker and the trainer get the endpoints in shard order and go
 *      through the sharded client. With curve = on, first a server key pair and one client key pair per
 *      process with kb-keygen (runs/<name>/keys, 0700; secret keys 0600): every server admits only the run's
 *      client keys, every client has its own key (no connection of the run is in clear);
 *   2. the initial graph: a pixel-embedding fleet (--encoder pixels) and a graph fleet over the pixels;
 *      with a label maker, a first label-spreading pass (graph only);
 *   3. the maker fleet on the trainer's checkpoint directory: `makers` embed makers (neighbour embeddings),
 *      a label maker (graph + model predictions), and with graph_refresh the graph fleet on the embeddings;
 *   4. trainer graphreg; its evaluation lines and the makers' progress are shown as they come;
 *   5. when the trainer exits (or on Ctrl-C / SIGTERM): SIGTERM to every maker and server, SIGKILL after
 *      a grace period; then runs/<name>/metrics.csv, accuracy.png, staleness.png and report.md.
 *
 * Supervision, all along: a kb-server (any shard) that dies is restarted with the same flags, data directory
 * and endpoint (kb_durability = sync keeps every acknowledged write), at most max_bank_restarts times per
 * shard; makers and trainer wait for it and reconnect (km_maker.h, trainer_prefetch.h). A maker that dies is restarted, at
 * most max_maker_restarts times in all; past that the other makers and the trainer carry on without it.
 * Each death and restart is logged ("kb-server exited on signal 9 (SIGKILL); restarting (1/3) ..."), listed
 * in report.md's Faults section and counted in the result line (bank_restarts, maker_deaths,
 * maker_restarts). runs/<name>/processes.tsv lists every process started, live (carls_ptab.h).
 *
 * The modules, one room each (the run in progress, carls_run_t, is shared through carls_run_internal.h):
 *   carls_run.c     the phases in order, the run's directory, CURVE keys, supervision rounds, report and result;
 *   carls_config.c  the settings (carls_config_t): defaults, checks, user data, metrics ports;
 *   carls_shards.c  the bank's kb-servers: start, restore (--resume), restart, stop;
 *   carls_fleet.c   the makers: one-shot fleets (the initial graph) and the resident fleet;
 *   carls_train.c   the trainer: its command line, start and the log lines followed;
 *   carls_argv.c    child command lines in fixed storage.
 * Each process's arguments are built by one function: s_server_args in carls_shards.c (a shard),
 * carls_run_bank_client_args (the bank and keys of any client), s_maker_args in carls_fleet.c, s_graphreg_args
 * and s_twotower_args in carls_train.c; s_each_client in carls_run.c lists the client processes of a run (their
 * keys are made before the servers start).
 *
 * Resuming (docs/STATE.md "Resuming a run"): every run writes its settings to runs/<name>/run.ini, and its
 * graphreg trainer snapshots the bank at each checkpoint (--bank-snapshot <name> --keep 2: the newest two pairs
 * of checkpoint and snapshot stay). `carls run --resume RUN_DIR` takes the newest checkpoint whose snapshot
 * every shard holds and accepts (kb-server --restore, once), rolls ckpt/ back to it, skips phase 2 (the graph
 * and pseudo-labels are in the snapshot), restarts the makers and starts the trainer with --resume; the
 * output, report.md and the result line (resumed_from_step) say where it resumed (carls_resume.h).
 *
 * The last stdout line is the result as key=value pairs, accuracy first (then shards=N curve=0|1 and the
 * fault counts). Exit status: 0, 1 when a process failed (or a shard died more than max_bank_restarts
 * times), 2 on bad usage, 130 when interrupted. */
#ifndef CARLS_RUN_H
#define CARLS_RUN_H

int carls_run_main(int argc, char **argv);

#endif
