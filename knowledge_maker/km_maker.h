/* kb-maker: a knowledge maker (CARLS §3.1). It watches the trainer's checkpoint directory, reloads the newest
 * checkpoint that verifies, computes knowledge for its share of the items and writes it to the bank tagged
 * with the checkpoint step.
 *
 * Items are the first --items training images of the data set (all 60,000 by default), named by index
 * (km_bank.h). Worker i of n owns the items with index % n == i, so a fleet of n makers with workers 0..n-1
 * covers every item exactly once per checkpoint.
 *
 * Tasks:
 *   embed   --encoder model: on every new checkpoint, the encoder's forward pass over the share (GPU or CPU,
 *           nn_mlp_encode_u8), put into <prefix>.emb with version = step.
 *           --encoder pixels: the images themselves (pixel / 255) into <prefix>.pixels, once, no checkpoint.
 *   graph   each item's top-k neighbours by the bank's knn over --source pixels|emb (self excluded), edge
 *           weight = cosine similarity (clipped at 0), into <prefix>.graph. With --source emb it runs on
 *           every new checkpoint, after the embed fleet has written that step for its items.
 *   label   label spreading (km_spread.h) over the bank's graph from the labelled items (--labels-per-class,
 *           --label-seed: the same subset the trainer uses), mixed with the classifier's predictions of the
 *           newest checkpoint when there is one (--model-weight); pseudo-label + confidence of the share's
 *           unlabelled items into <prefix>.labels with version = step (0 without a model).
 *   words   trainer twotower's word tower for its share of the GCIDE headwords, into <prefix>.vec with version
 *           = step (km_words.h; items are headwords there, not images).
 *
 * The bank going away (killed, restarting on the same endpoint) is waited out: a request is resent after
 * --bank-timeout-ms on a new connection (3 attempts), and work whose requests all went unanswered is done
 * again (backing off from 0.5 s to 5 s, moving on to a newer checkpoint if one arrives) for up to
 * --bank-wait-s before the maker gives up with exit status 1. Each retry is logged ("bank unreachable ...;
 * retrying step N") and counted in the final summary line.
 *
 * --once: do the task once (for a checkpoint task: on the current checkpoint, waiting for one to appear) and
 * exit. Otherwise loop until SIGTERM/SIGINT, which ends the maker cleanly between two batches (exit 0).
 * Logs: items/s, the checkpoint step, and how many steps the newest checkpoint is ahead of the one in hand. */
#ifndef KM_MAKER_H
#define KM_MAKER_H

#include "kb_curve_args.h"
#include "prom.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum {
    KM_TASK_EMBED = 0,
    KM_TASK_GRAPH = 1,
    KM_TASK_LABEL = 2,
    KM_TASK_WORDS = 3,  /* trainer twotower's word tower over GCIDE headwords (km_words.h) */
} km_task_t;

/* --pixel-features, in the order of its choices. Every one from KM_PIXELS_CENTERED on is centred (its mean row
 * over the items subtracted). */
typedef enum {
    KM_PIXELS_RAW = 0,
    KM_PIXELS_SQRT = 1,
    KM_PIXELS_CENTERED = 2,
    KM_PIXELS_SQRT_CENTERED = 3,
    KM_PIXELS_ROOT4_CENTERED = 4,
    KM_PIXELS_HOG = 5, /* km_hog.h */
} km_pixel_features_t;

typedef struct {
    const char *kb;            /* bank endpoint(s) */
    kb_curve_args_t curve;     /* --curve-key, --curve-server-key (kb_curve_args.h) */
    const char *ckpt_dir;      /* the trainer's checkpoint directory */
    km_task_t task;
    uint32_t worker, workers;  /* this maker is worker `worker` of `workers` */
    const char *device;        /* auto | cpu | cuda */
    const char *data;          /* fashion-mnist */
    const char *data_dir;      /* NULL: the Debian package's folder */
    int items;                 /* 0: every training image */
    const char *prefix;        /* table-name prefix */
    bool pixels;               /* embed: --encoder pixels */
    int pixel_features;        /* embed --encoder pixels: a km_pixel_features_t */
    bool source_emb;           /* graph: --source emb or emb+pixels, else pixels */
    bool source_union;         /* graph: --source emb+pixels (each row: k from the embeddings, then k from pixels) */
    int k;                     /* graph: neighbours per item */
    bool once;                 /* do the task once and exit */
    int poll_ms;               /* checkpoint polling period (fallback to inotify) */
    int labels_per_class;      /* label: the trainer's labelled subset */
    int label_seed;
    float spread_alpha;        /* label: spreading's alpha */
    int spread_iters;          /* label: iterations */
    float model_weight;        /* label: weight of the model's prediction in the prior (0: labels only) */
    int balance;               /* label: class-mass normalisation */
    int batch;                 /* embed: rows per forward chunk */
    int wait_embed_ms;         /* graph --source emb: how long to wait for the fleet's embeddings of a step */
    bool wait_graph;           /* label: wait (up to wait_embed_ms) for the graph of the checkpoint's step */
    int threads;               /* OpenBLAS threads */
    int bank_timeout_ms;       /* per request attempt; 0: embed 10000, graph/label 60000 */
    int bank_wait_s;           /* how long work is retried while the bank is unreachable */
    const char *gcide_index;   /* words: GCIDE files (NULL: Debian's dict-gcide) */
    const char *gcide_dict;
    int metrics_port;          /* serve carls_maker_* progress metrics on this port (-1: none, 0: a free one) */
    const char *metrics_address;
} km_opts_t;

/* This maker's progress metrics (main.c creates them with --metrics-port), NULL when not served; a pass that
 * completes reports to it (carls_prom_progress_* accept NULL). */
extern carls_prom_progress_t *km_prom;

/* Parses argv (argv[0] is the program). Returns 0 to run, 1 when --help was answered, -1 on bad usage
 * (reported on stderr). */
int km_opts_parse(int argc, char **argv, km_opts_t *o);

/* Runs the maker until its work is done (--once) or *stop becomes nonzero. Returns the exit status: 0, or
 * 1 on a failure (data, bank, device). */
int km_maker_run(const km_opts_t *o, volatile sig_atomic_t *stop);

#endif
