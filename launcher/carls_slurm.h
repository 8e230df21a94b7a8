/* `carls run --slurm CONFIG.ini`: the same experiment as one Slurm job across nodes (docs/SLURM.md).
 *
 * Outside an allocation, `carls run --slurm` asks for one: it runs itself again under
 * `salloc --nodes=N --exclusive --job-name=carls-<config>` (--slurm-nodes, --slurm-opt add to that), so Ctrl-C
 * and the exit status go through salloc. Inside an allocation (salloc, or an sbatch script calling
 * `carls run --slurm`, SLURM_JOB_ID set) the launcher runs as on one machine (carls_run.h), except that every
 * process it starts becomes a job step: carls_slurm_begin installs a carls_proc runner, and each forked child
 * (a "step proxy", on the launcher's node) runs
 *
 *     srun --jobid=J --job-name=carls-<proxy pid> -N1 -n1 -c CPUS -w NODE [--gres=gpu:1] [--slurm-step-opt...]
 *          sh -c ... PROGRAM ARGS
 *
 * Placement, from the process's name: kb-server shard I on node I mod K, the trainer on node 0, makers
 * (worker i) on node 1 + i mod (K - 1) (node 0 when K = 1), K being the job's node count. CPUS: the server's
 * --threads, 1 otherwise. Maker i asks for one GPU when the job holds a GPU on its node for each of its fleet's
 * makers there up to i and its --device is not cpu.
 *
 * No shared file system is assumed. Every argument that names a path under the run's directory
 * (runs/<name>/...) is rewritten to the same path under a node-local scratch directory,
 * SCRATCH/carls-<job>-<name>/<node>/... (SCRATCH: --slurm-scratch, default /tmp); such a file or directory
 * that exists on the launcher's node when the process starts (a key, a directory of public keys) is copied
 * there first (not --data or --ckpt-dir, which the relays below handle). The proxies move what must
 * travel, all through srun's own stdin/stdout (no ssh, no shared path):
 *   - kb-server: its --listen host becomes the node's address (NodeAddr when it is an IP address, else *);
 *     the proxy reads the endpoint file the server writes on its node and writes it, with the node's
 *     address, to the local endpoint file the launcher waits for;
 *   - trainer: while it runs, every new checkpoint (its `latest` changed) is copied from its node to the
 *     launcher's node (runs/<name>/ckpt) and to the same directory on every other node of the job, `latest`
 *     last and renamed into place, so makers there see a complete checkpoint; when it ends, the files it
 *     wrote under the run's directory (metrics.csv, vectors.bin, checkpoints) are copied back to the
 *     launcher's node;
 *   - every step: its stdout and stderr come back through srun into the launcher's log files; its first
 *     stderr line is "carls-step JOB.STEP on NODE: PROGRAM", and runs/<name>/steps.tsv lists every step.
 *
 * Stopping: SIGTERM to a proxy (the launcher's stop) becomes `scancel --signal=TERM JOB.STEP`, so the program
 * gets SIGTERM as on one machine; SIGKILL to a proxy ends its srun (PR_SET_PDEATHSIG), which kills the step,
 * and a launcher that dies sends its proxies SIGTERM the same way.
 * A step that fails because the job itself ended (scancel, time limit) makes its proxy send SIGTERM to the
 * launcher, which then stops everything and exits 130 as after Ctrl-C. A proxy ends as its step did: the
 * same exit code, or the same signal when the program was killed by one, so restarts work as on one machine. */
#ifndef CARLS_SLURM_H
#define CARLS_SLURM_H

#include <stdbool.h>
#include <stdio.h>

/* Takes the Slurm options out of `carls run`'s arguments (argv[0] = "run"): --slurm, --slurm-nodes N,
 * --slurm-opt ARG and --slurm-step-opt ARG (repeatable), --slurm-scratch DIR (each also as --opt=value), shifting the others down and
 * updating *argc. Returns 0 without --slurm, 1 with it, 2 after printing a usage error (an option of Slurm
 * mode without --slurm, a bad value). */
int carls_slurm_take_args(int *argc, char **argv);

/* True inside a Slurm allocation (SLURM_JOB_ID set). */
bool carls_slurm_in_allocation(void);

/* Slurm mode outside an allocation: runs this program again with args (the original `carls run` arguments,
 * argv[0] = "run", NULL-terminated) under salloc. Returns only on failure (the exit status, 1). */
int carls_slurm_allocate(char **args);

/* After the run's directory (run_dir, runs/<name>) was made: with Slurm mode on, finds the job's nodes and
 * their addresses, prints the placement and installs the step runner; a no-op returning 0 otherwise.
 * Returns 0, or -1 after reporting (not in an allocation, a node without an address, ...). */
int carls_slurm_begin(const char *run_dir, const char *name);

/* Removes the runner (a no-op without Slurm mode). */
void carls_slurm_end(void);

/* The Slurm options, for `carls run --help`. */
void carls_slurm_print_help(FILE *out);

#endif
