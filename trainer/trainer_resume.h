/* Exact resumption of a training run (docs/STATE.md, "Resuming a run").
 *
 * A trainer that can resume writes into each checkpoint, beside the model's tensors, what continuing needs:
 * the optimiser's moments (tensors "opt.m", and "opt.v" for Adam) and step count (blob "opt.t"), and its own
 * state as blobs (data order, position, RNG states: each trainer names its own), a "train.config" text that
 * must match the resumed run's (the settings that decide the data order, the model's shapes and the schedule)
 * and, when the run snapshots its bank, "bank.snapshot": the name of the bank snapshot taken at the same step,
 * before the checkpoint was written. `--resume` reads the checkpoint DIR/latest names and continues from it.
 *
 * The bank side is trainer_snapshots_t: at each checkpoint the trainer snapshots the bank (every shard at one
 * cut, kb_cluster_snapshot) as PREFIX-step<N> and then writes the checkpoint naming it, so a checkpoint never
 * names a snapshot that does not exist; older snapshots are deleted once a newer pair is complete. */
#ifndef TRAINER_RESUME_H
#define TRAINER_RESUME_H

#include "checkpoint.h"
#include "kb_client.h"
#include "nn_mlp.h"

#include <stddef.h>
#include <stdint.h>

#define TRAINER_CKPT_CONFIG "train.config"    /* blob: the settings a resumed run must share (text) */
#define TRAINER_CKPT_SNAPSHOT "bank.snapshot" /* blob: the bank snapshot of the same step (text) */

/* Adds m's optimiser state to c: "opt.m" and "opt.v" (when allocated, i.e. after the first step) and "opt.t".
 * Returns 0, or -1 with err. */
int trainer_mlp_save_opt(const nn_mlp_t *m, carls_ckpt_t *c, char *err, size_t errlen);

/* Loads the parameters and the optimiser state of c into m, which must have the same layers (checked). Returns
 * 0, or -1 with err naming what does not match. */
int trainer_mlp_load_state(nn_mlp_t *m, const carls_ckpt_t *c, char *err, size_t errlen);

/* n uint32 values as a little-endian blob (nothing when n is 0), and back: exactly n of them (a missing
 * blob reads as n = 0). Return 0, or -1 (err says which blob and why). */
int trainer_ckpt_add_u32s(carls_ckpt_t *c, const char *name, const uint32_t *v, size_t n, char *err, size_t errlen);
int trainer_ckpt_get_u32s(const carls_ckpt_t *c, const char *name, uint32_t *v, size_t n, char *err, size_t errlen);

/* n floats of a host array as the 1-D tensor name (nothing when n is 0), and back: exactly n of them (a
 * missing tensor reads as n = 0). Return 0, or -1 (err says which tensor and why). */
int trainer_ckpt_add_floats(carls_ckpt_t *c, const char *name, const float *v, size_t n, char *err, size_t errlen);
int trainer_ckpt_get_floats(const carls_ckpt_t *c, const char *name, float *v, size_t n, char *err, size_t errlen);

/* Saves c into dir (the latest pointer updated) and prunes dir to the newest keep checkpoints. A failed save
 * is logged and returns -1; a failed prune is only logged. */
int trainer_ckpt_save(const carls_ckpt_t *c, const char *dir, int keep);

/* For --resume: reads and verifies the checkpoint dir/latest names (its path into path), and checks that it
 * holds a resumable state of this run: the kind, and a train.config equal to config. Returns 0 with *out
 * (caller owns), or -1 after printing "trainer: --resume: ..." (which file, what is wrong). */
int trainer_resume_open(const char *dir, const char *kind, const char *config, carls_ckpt_t **out, char *path,
                        size_t pathlen);

/* Keeps the rows of the metrics CSV at path whose first column (the step) is at most step, and its header;
 * the rows of steps a resumed run trains again go. Returns 0, or -1 (logged). */
int trainer_metrics_trim(const char *path, uint64_t step);

/* The run's bank snapshots, through a connection of their own (the prefetcher's is its thread's). */
typedef struct trainer_snapshots trainer_snapshots_t;

/* Snapshots named prefix-step<N> of the bank at endpoints (the shards in order); NULL (logged) when the
 * prefix is not a plain name or the connection cannot be made. keep: how many newest pairs stay. */
trainer_snapshots_t *trainer_snapshots_new(const char *endpoints, const kb_client_curve_t *curve, const char *prefix,
                                           int keep);
void trainer_snapshots_destroy(trainer_snapshots_t **self_p);

/* The bank snapshot of checkpoint `step` (its name into name): an older snapshot of that name (left by a run
 * that was killed after it) is deleted first. Returns 0, or -1 (logged: the checkpoint is then written
 * without a snapshot and cannot be resumed from). */
int trainer_snapshot_take(trainer_snapshots_t *self, uint64_t step, char *name, size_t len);

/* The checkpoint step before s in the schedule "0, every *(const int *)every steps, the last step" (a prev for
 * trainer_snapshot_prune), UINT64_MAX before 0. */
uint64_t trainer_ckpt_prev(uint64_t s, void *every);

/* After the checkpoint of `step` is written: deletes the snapshot of the checkpoint `keep` checkpoints
 * before it. prev(s) is the checkpoint step before s (the trainer's schedule). Failures are only logged. */
void trainer_snapshot_prune(trainer_snapshots_t *self, uint64_t step, uint64_t (*prev)(uint64_t s, void *ctx),
                            void *ctx);

#endif
