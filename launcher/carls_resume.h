/* `carls run --resume RUN_DIR` (carls_run.h; docs/STATE.md "Resuming a run"): what the launcher needs besides
 * starting processes: the run's settings saved at its start (RUN/run.ini), the checkpoints it could resume
 * from, each paired with the bank snapshot the trainer took at the same step, and the checkpoint directory
 * rolled back to the chosen one. */
#ifndef CARLS_RESUME_H
#define CARLS_RESUME_H

#include "carls_ini.h"

#include <stdbool.h>
#include <stddef.h>

#define CARLS_RESUME_SETTINGS "run.ini" /* in the run's directory */
#define CARLS_RESUME_MAX 32             /* checkpoints considered, newest first */

typedef struct {
    char path[4400];          /* the checkpoint file */
    char snapshot[128];       /* the bank snapshot it names ("" when the run does not use the bank) */
    unsigned long long step;
} carls_resume_pair_t;

typedef struct {
    int n;
    carls_resume_pair_t pair[CARLS_RESUME_MAX]; /* newest first */
    char why[8192];                            /* the checkpoints passed over and why, one line each */
} carls_resume_candidates_t;

/* The checkpoints of ckpt_dir a run can resume from, newest first: each verified (carls_ckpt_read), holding a
 * trainer's state (train.config) and, when need_snapshot, naming a bank snapshot (bank.snapshot) that every
 * one of the n_shards data directories holds complete (DIR/snapshots/NAME/MANIFEST; kb-server --restore
 * checks the files themselves). The others are listed in out->why, naming the file and the problem. Returns
 * out->n, or -1 when ckpt_dir cannot be read (out->why says so). */
int carls_resume_candidates(const char *ckpt_dir, bool need_snapshot, const char *const *shard_dirs, int n_shards,
                            carls_resume_candidates_t *out);

/* How many checkpoint files (ckpt-<step>.ckpt, readable or not) ckpt_dir holds: 0 also when it does not exist
 * (a run stopped before the trainer's first checkpoint), or -1 when it cannot be read (errno says why). */
int carls_resume_count(const char *ckpt_dir);

/* Makes the checkpoint of step the newest of ckpt_dir: the later ones (and temporary files) go, and latest
 * names it (atomically), so makers and the trainer start from it. 0, or -1 with err. */
int carls_resume_rollback(const char *ckpt_dir, unsigned long long step, char *err, size_t errlen);

/* Writes path: the settings of the run (ini, with --set applied), read by --resume. 0, or -1 with err. */
int carls_resume_write_settings(const char *path, const char *config, const carls_ini_t *ini, char *err,
                                size_t errlen);

/* The bank snapshot prefix of run `name` (out, len >= 40 bytes): its characters outside [A-Za-z0-9_.-]
 * replaced by '-', at most 39, never beginning with '.' (trainer --bank-snapshot). */
void carls_resume_prefix(const char *name, char *out, size_t len);

#endif
