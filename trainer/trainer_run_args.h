/* The options the checkpointing subcommands (supervised, graphreg, twotower) share, as one carls_args group
 * (carls_arg_group(g->rows)): where a run's files go and what it runs on.
 *
 *   --ckpt-dir DIR   checkpoints (and the metrics CSV unless --metrics); the default is the subcommand's
 *   --keep N         checkpoints kept in DIR, 1..1000000 (default 3)
 *   --resume         continue from the checkpoint DIR/latest names
 *   --metrics FILE   the metrics CSV (default: the subcommand's)
 *   --device TEXT    auto|cpu|cuda, checked by trainer_setup_device (default auto)  } only when device and
 *   --threads N      OpenBLAS threads, 1..1024 (0, not given: TRAINER_DEFAULT_THREADS) } threads are not NULL
 *
 * Each subcommand words these options in its own usage, for what its checkpoints hold. */
#ifndef TRAINER_RUN_ARGS_H
#define TRAINER_RUN_ARGS_H

#include "carls_args.h"

#include <stdbool.h>

typedef struct {
    carls_arg_t rows[7];
} trainer_run_args_t;

/* Fills g's rows over the caller's values and sets the defaults the group owns: *keep 3 and, when device is
 * not NULL, *device "auto". *ckpt_dir, *metrics, *resume and *threads keep what the caller set. device and
 * threads are both NULL (a subcommand that runs on the CPU alone: no --device, no --threads) or both not. The
 * rows point at the values: they must outlive the parsing. */
void trainer_run_args(trainer_run_args_t *g, const char **ckpt_dir, int *keep, bool *resume, const char **metrics,
                      const char **device, int *threads);

#endif
