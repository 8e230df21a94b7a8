/* A run's settings: the configuration file (carls_ini.h) with --set applied, read into carls_config_t with
 * defaults for the keys it leaves out, checked, and fitted to a user's own data; and the metrics ports every
 * long-running process of the run is given. */
#ifndef CARLS_CONFIG_H
#define CARLS_CONFIG_H

#include "carls_argv.h"
#include "carls_ini.h"

#include <stdbool.h>
#include <stddef.h>

#define CARLS_MAX_SHARDS 16 /* shards of one run's bank (the endpoint list must fit one argument) */
#define CARLS_MAX_REPLICAS 4 /* kb-servers of one shard (replicas = N: a primary and N - 1 followers) */
/* metrics_port's slots (carls_config_metrics_arg): the trainer's, the first maker's, and how many there are. */
#define CARLS_METRICS_TRAINER 64
#define CARLS_METRICS_MAKERS 65
#define CARLS_METRICS_SLOTS (CARLS_METRICS_MAKERS + 4 * 64)

/* The run's settings, read from the configuration. */
typedef struct {
    const char *name, *runs_dir, *data_dir, *tables, *hidden, *conv, *neighbors_from, *maker_device, *trainer_device;
    const char *kb_durability;
    const char *curve;                /* on | off: CURVE keys for the whole run */
    const char *pixel_features;       /* the initial graph's pixel features (kb-maker --pixel-features) */
    const char *data, *test_data;     /* graphreg: fashion-mnist or a user's npy:/csv: spec, its test split */
    const char *experiment;           /* graphreg | twotower */
    const char *gcide_index, *gcide_dict, *negatives_from, *negatives_sampling, *lexical;
    char bin[4096];
    double items, labels_per_class, label_seed, validation, kb_threads, makers, graph_k, graph_refresh;
    double label_maker, label_model_weight, label_balance, spread_alpha, spread_iters;
    double augment_shift, augment_flip;
    double alpha, beta, conf_threshold, rampup, neighbors, max_staleness, neighbor_refresh, steps, batch_labelled, batch_unlabelled;
    double dropout, lr, ckpt_every, eval_every, seed, timeout_s, shards;
    double max_bank_restarts, max_maker_restarts;
    double replicas;                  /* kb-servers per shard: a primary and replicas - 1 followers (1: none) */
    double min_replicas;              /* kb-server --min-replicas of a shard's primary (-1 in the file: the
                                       * default, 1 with replicas > 1 and kb_durability = sync, else 0) */
    double maker_bank_timeout_ms;     /* kb-maker --bank-timeout-ms (0: the maker's default) */
    double metrics_port;              /* > 0: Prometheus /metrics of every long-running process
                                       * (carls_config_metrics_arg) */
    /* twotower */
    double holdout_seed, holdout_count, dim, out_dim, batch, epochs, max_steps, kb_negatives, negatives_every;
    double word_defs, tower_hidden, logq, negatives_shift, stale_positives, temperature, emb_lr, token_dropout, fuse_tfidf, bm25_k1, bm25_b, hard_queries, hard_k, hard_fresh;
} carls_config_t;

/* metrics_port = P > 0: every long-running process serves Prometheus metrics on a port of its own, P + slot:
 * bank shard s at slot s (member m of a replicated shard at s + CARLS_MAX_SHARDS * m), the trainer at CARLS_METRICS_TRAINER, the resident makers from CARLS_METRICS_MAKERS on
 * (embed i, graph makers + i, words 2 makers + i, label 3 makers); RUN/prometheus-targets.json lists them for
 * Prometheus's file_sd_configs (docs/EXPERIMENTS.md). One-shot fleets serve none. */
void carls_config_metrics_arg(carls_argv_t *a, const carls_config_t *c, int slot);

/* RUN/prometheus-targets.json: the ports carls_config_metrics_arg gives, by job (bank, trainer, maker). */
void carls_config_write_metrics_targets(const carls_config_t *c, const char *dir, bool tt, bool embed, bool graph,
                                        bool label);

/* Reads CONFIG (argv[1]) into ini, applies --set key=value (or --set=key=value) and --quiet, and checks the
 * settings into *c. Returns 0, or the exit status (2) after reporting the problem. */
int carls_config_load(int argc, char **argv, carls_ini_t *ini, carls_config_t *c, bool *quiet, char *note,
                         size_t notelen);

#endif
