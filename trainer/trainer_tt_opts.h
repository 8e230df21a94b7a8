/* trainer twotower's options: the values (tt_opts_t), their defaults, --help and the checks between them
 * (tt_opts_parse). The training loop is trainer_twotower.c. */
#ifndef TRAINER_TT_OPTS_H
#define TRAINER_TT_OPTS_H

#include "kb_curve_args.h"
#include "protocol.h"
#include "trainer_tfidf.h"

#include <stdbool.h>
#include <stdint.h>

#define TT_MAX_BATCH 4096
#define TT_MAX_NEGATIVES 100000

typedef struct {
    const char *kb, *table, *index_path, *dict_path, *holdout_file, *write_holdout, *ckpt_dir, *metrics;
    const char *pairs;      /* --data pairs:PAIRS.tsv[,CANDIDATES.txt] (data_pairs.h), NULL: GCIDE */
    const char *save_vectors, *eval_vectors;
    tfidf_opts_t lexical;
    uint64_t holdout_seed, seed;
    int hard_queries, hard_k;
    bool hard_fresh;        /* hard negatives pooled here from their current rows, not the makers' inputs */
    bool logq;              /* sampled-softmax correction of the logits by each candidate's sampling rate */
    int holdout_count, E, D, H, batch, epochs, negatives, negatives_every, ckpt_every, max_steps, knn_check, word_defs;
    float lr, emb_lr, temperature, token_dropout, fuse_tfidf, wait_fresh_s, init_scale;
    Carls__OptimizerKind emb_opt;
    float fuse_sweep[16];
    int n_sweep;
    bool vectors_from_trainer;
    bool negatives_from_inputs; /* bank negatives: pooled inputs + this trainer's head, else stored outputs */
    bool negatives_by_pairs;    /* bank negatives: headwords of random training pairs, not the bank's uniform draw */
    bool negatives_shift;       /* bank negatives' inputs moved by the drift the batch's own headwords show */
    float stale_positives;      /* share of the batch's word-tower inputs replaced by the makers' (straight-through) */
    int timeout_ms, retries;
    kb_curve_args_t curve; /* --curve-key, --curve-server-key */
    int keep;                  /* checkpoints (and bank snapshots) kept */
    bool resume;               /* continue from --ckpt-dir/latest */
    const char *bank_snapshot; /* snapshot the bank as PREFIX-step<N> at each checkpoint; NULL: no */
} tt_opts_t;

/* Parses the options into *o. Returns 0 to run, 1 when --help was answered, -1 on bad usage (reported). */
int tt_opts_parse(int argc, char **argv, tt_opts_t *o);

#endif
