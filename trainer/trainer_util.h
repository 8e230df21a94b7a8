/* Helpers shared by the trainer's subcommands: option values, device and thread set-up. */
#ifndef TRAINER_UTIL_H
#define TRAINER_UTIL_H

#include "carls_args.h"
#include "nn_device.h"
#include "nn_mlp.h"
#include "prom.h"
#include "trainer_metrics.h"

#include "data_fmnist.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses "256" or "512,256" into widths (at most max), returning how many, or -1 if malformed. */
int trainer_parse_widths(const char *text, int *widths, int max);

/* The model and optimiser options the Fashion-MNIST trainers (graphreg, supervised) share, as a carls_args
 * group (carls_arg_group(g->rows)): --hidden, --conv, --dropout, --optimizer, --lr, --weight-decay, --schedule, --seed,
 * stored into model, opt, *cosine and *seed. Also sets their shared defaults: *opt Adam (momentum 0.9 for
 * SGD, betas 0.9 and 0.999, eps 1e-8, no weight decay; the learning rate left for trainer_mlp_default_lr),
 * *cosine true, *seed 1. The model's widths and dropout are each trainer's own. */
typedef struct {
    carls_arg_t rows[9];
} trainer_mlp_args_t;
void trainer_mlp_args(trainer_mlp_args_t *g, nn_mlp_config_t *model, nn_optim_config_t *opt, bool *cosine,
                      int *seed);
/* After parsing: an --lr not given becomes the optimizer's default, 0.001 for Adam, 0.05 for SGD. */
void trainer_mlp_default_lr(nn_optim_config_t *opt);

/* Custom values for carls_args_t option tables (carls_args.h), shared by the subcommands:
 * --hidden H[,H2..]: out is an nn_mlp_config_t, whose n_hidden and hidden[] are set. */
int trainer_arg_hidden(const char *prog, const char *name, const char *text, void *out);
/* --conv none|C:K:P[,C:K:P..]: out is an nn_mlp_config_t, whose n_conv and conv[] are set (C channels, an odd
 * K x K kernel, P x P max pooling per block). */
int trainer_arg_conv(const char *prog, const char *name, const char *text, void *out);
/* The --conv value of cfg ("none" or C:K:P,...) into buf, for logs and train.config. */
void trainer_conv_text(const nn_mlp_config_t *cfg, char *buf, size_t len);
/* --optimizer adam|sgd: out is an nn_opt_kind_t. */
int trainer_arg_optimizer(const char *prog, const char *name, const char *text, void *out);

/* Sets OpenBLAS threads: requested when > 0, else TRAINER_DEFAULT_THREADS. Logs and returns the number.
 *
 * Why 1 by default: the training loop's GEMMs are small (a batch of 128 rows), OpenBLAS splits them over
 * threads for little or no gain and makes the 10-column classifier GEMM slower, the element-wise half of a step runs on one
 * thread anyway, and in a CARLS run the other core is wanted by the knowledge bank and the makers. Idle
 * waiting OpenBLAS threads also spin in sched_yield, which shows up as system time. See docs/BENCHMARKS.md. */
#define TRAINER_DEFAULT_THREADS 1
int trainer_setup_threads(int requested);

/* Resolves --device (logging the choice); returns 0 and *out, or prints the reason and returns -1. */
int trainer_setup_device(const char *text, nn_device_t *out);

/* A classifier of the image (or feature) data sets: train's dim inputs (its rows x cols grey images when the
 * model has convolutions), model's convolutions, hidden layers and dropout, classes outputs, batches up to
 * max_batch, initialised from seed. Returns 0, or -1 after printing "trainer: model: ...". */
int trainer_fmnist_mlp_new(const nn_mlp_config_t *model, const carls_image_set_t *train, int classes,
                           nn_device_t device, int max_batch, int seed, nn_mlp_t **out);

/* Loss and accuracy of model m (in eval mode) on images which[0..n) of set, in chunks of m->max_batch through
 * xbuf (max_batch * dim) and ybuf (max_batch). */
void trainer_mlp_evaluate(nn_mlp_t *m, const carls_image_set_t *set, const uint32_t *which, int n, float *xbuf,
                          int32_t *ybuf, double *loss, double *acc);

/* A run's outputs: creates ckpt_dir, names the metrics file (metrics, or NULL: ckpt_dir/metrics.csv) into
 * path and opens it with header. resume_step >= 0 (a resumed run): the file's rows after that step go and
 * the new rows are appended. Returns 0, or -1 after printing "trainer: cannot ...". */
int trainer_open_outputs(const char *ckpt_dir, const char *metrics, const char *header, char *path, size_t pathlen,
                         int64_t resume_step, trainer_metrics_t *out);

/* The trainer's progress metrics (carls_trainer_*: `trainer --metrics-port P COMMAND ...` serves them on
 * /metrics), NULL when not served: experiments report to it unconditionally (carls_prom_progress_* accept
 * NULL). */
extern carls_prom_progress_t *trainer_prom;

#endif
