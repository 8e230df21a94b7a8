/* The run's trainer (see carls_train.h). */
#include "carls_train.h"

#include "carls_run_internal.h"

#include "log.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Follows a log file and prints its new lines that contain one of the needles. */
typedef struct {
    char path[4200];
    char tag[64];
    long offset;
} s_tail_t;

static void s_tail(s_tail_t *t, const char *const *needles, bool quiet)
{
    FILE *f = fopen(t->path, "r");
    if (!f) {
        return;
    }
    if (fseek(f, t->offset, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') {
            break; /* a partial line: read it next time */
        }
        t->offset += (long)len;
        bool show = false;
        for (int i = 0; needles[i]; i++) {
            show = show || strstr(line, needles[i]);
        }
        if (show && !quiet) {
            /* Drop the timestamp/level/location prefix of log lines. */
            const char *msg = line;
            const char *c = strstr(line, ".c:");
            if (c && (c = strchr(c, ' '))) {
                msg = c + 1;
            }
            printf("[%s] %.*s", t->tag, 230, msg);
            if (strlen(msg) > 230) {
                printf("...\n");
            }
            fflush(stdout);
        }
    }
    fclose(f);
}

/* trainer graphreg's arguments (experiment = graphreg). */
static void s_graphreg_args(carls_argv_t *a, const carls_run_t *r)
{
    const carls_config_t *c = r->c;
    carls_argv_add_list(a, (const char *const[]){"graphreg", "--data", *c->data ? c->data : "fashion-mnist", NULL});
    carls_argv_add_if_set(a, "--data-dir", c->data_dir);
    carls_argv_add_if_set(a, "--test-data", c->test_data);
    if (r->graph_needed) {
        carls_run_bank_client_args(a, r, "trainer");
    }
    const carls_argv_num_t nums[] = {
        {"--labels-per-class", c->labels_per_class, 1}, {"--label-seed", c->label_seed, 1},
        {"--train-items", c->items, 1},                 {"--validation", c->validation, 1},
        {"--steps", c->steps, 1},                       {"--batch-labelled", c->batch_labelled, 1},
        {"--batch-unlabelled", c->batch_unlabelled, 1}, {"--dropout", c->dropout, 0},
        {"--lr", c->lr, 0},                             {"--seed", c->seed, 1},
        {"--alpha", c->alpha, 0},                       {"--beta", c->beta, 0},
        {"--conf-threshold", c->conf_threshold, 0},     {"--rampup", c->rampup, 1},
        {"--neighbors", c->neighbors, 1},               {"--max-staleness", c->max_staleness, 1},
        {"--neighbor-refresh", c->neighbor_refresh, 1},
        {"--augment-shift", c->augment_shift, 1},       {"--augment-flip", c->augment_flip, 0},
        {"--ckpt-every", c->ckpt_every, 1},             {"--eval-every", c->eval_every, 1},
    };
    carls_argv_add_nums(a, nums, sizeof nums / sizeof nums[0]);
    carls_argv_add_list(a, (const char *const[]){"--hidden", c->hidden, "--conv", c->conv, "--neighbors-from", c->neighbors_from, "--tables",
                                        c->tables, "--ckpt-dir", r->ckpt, "--metrics", r->metrics, "--device",
                                        c->trainer_device, NULL});
    /* Each checkpoint with the bank's snapshot of the same step; the newest 2 pairs kept (--resume). */
    if (r->graph_needed) {
        carls_argv_add_list(a, (const char *const[]){"--bank-snapshot", r->snap_prefix, "--keep", "2", NULL});
    }
    if (r->resume_dir) {
        carls_argv_add(a, "--resume");
    }
}

/* trainer twotower's arguments (experiment = twotower): the word vectors come from the maker fleet. */
static void s_twotower_args(carls_argv_t *a, const carls_run_t *r, const char *vectors)
{
    const carls_config_t *c = r->c;
    carls_argv_add(a, "twotower");
    carls_run_bank_client_args(a, r, "trainer");
    const char *const fixed[] = {"--data", *c->data ? c->data : "gcide", "--table", c->tables, "--ckpt-dir", r->ckpt,
                                 "--metrics", r->metrics, "--vectors", "makers", "--negatives-from", c->negatives_from,
                                 "--negatives-sampling", c->negatives_sampling,
                                 "--lexical", c->lexical, "--save-vectors", vectors, NULL};
    carls_argv_add_list(a, fixed);
    carls_argv_add_if_set(a, "--index", c->gcide_index);
    carls_argv_add_if_set(a, "--dict", c->gcide_dict);
    const carls_argv_num_t nums[] = {
        {"--holdout-seed", c->holdout_seed, 1}, {"--holdout-count", c->holdout_count, 1},
        {"--dim", c->dim, 1},                   {"--out-dim", c->out_dim, 1},
        {"--batch", c->batch, 1},               {"--epochs", c->epochs, 1},
        {"--max-steps", c->max_steps, 1},       {"--kb-negatives", c->kb_negatives, 1},
        {"--negatives-every", c->negatives_every, 1}, {"--word-defs", c->word_defs, 1},
        {"--temperature", c->temperature, 0},   {"--lr", c->lr, 0},
        {"--emb-lr", c->emb_lr, 0},             {"--token-dropout", c->token_dropout, 0},
        {"--fuse-tfidf", c->fuse_tfidf, 0},     {"--ckpt-every", c->ckpt_every, 1},
        {"--seed", c->seed, 1},                 {"--bm25-k1", c->bm25_k1, 0},
        {"--bm25-b", c->bm25_b, 0},             {"--hard-queries", c->hard_queries, 1},
        {"--hard-k", c->hard_k, 1},             {"--hard-fresh", c->hard_fresh, 1},
        {"--hidden", c->tower_hidden, 1},       {"--logq", c->logq, 1},
        {"--negatives-shift", c->negatives_shift, 1}, {"--stale-positives", c->stale_positives, 0},
    };
    carls_argv_add_nums(a, nums, sizeof nums / sizeof nums[0]);
    /* Each checkpoint with the bank's snapshot of the same step (the rows it trains live there); the newest 2
     * pairs kept (--resume). */
    carls_argv_add_list(a, (const char *const[]){"--bank-snapshot", r->snap_prefix, "--keep", "2", NULL});
    if (r->resume_dir) {
        carls_argv_add(a, "--resume");
    }
}

int carls_train_run(carls_run_t *r)
{
    const carls_config_t *c = r->c;
    carls_argv_t a = {0};
    carls_argv_add(&a, "%s/trainer", c->bin);
    carls_config_metrics_arg(&a, c, CARLS_METRICS_TRAINER);
    if (r->tt) {
        char vectors[4400];
        carls_fmt(vectors, sizeof vectors, "%s/vectors.bin", r->dir);
        s_twotower_args(&a, r, vectors);
    } else {
        s_graphreg_args(&a, r);
    }
    char log[4400];
    carls_fmt(log, sizeof log, "%s/trainer.log", r->logs);
    if (carls_proc_start(&r->trainer, "trainer", a.ptr, r->out, log) != 0) {
        return -1;
    }
    r->trainer_row = carls_ptab_started(&r->ptab, "trainer", &r->trainer, NULL);
    s_tail_t tails[CARLS_PROC_MAX + 1];
    int n_tails = 0;
    carls_fmt(tails[n_tails].path, sizeof tails[0].path, "%s", log);
    carls_fmt(tails[n_tails].tag, sizeof tails[0].tag, "trainer");
    tails[n_tails++].offset = 0;
    for (int i = 0; i < r->n_fleet; i++) {
        carls_fmt(tails[n_tails].path, sizeof tails[0].path, "%s", r->fleet_log[i]);
        carls_fmt(tails[n_tails].tag, sizeof tails[0].tag, "%s", r->fleet[i].name);
        tails[n_tails++].offset = 0;
    }
    const char *const trainer_needles[] = {"step ", "ERROR", "WARN", "bank reachable", NULL};
    const char *const maker_needles[] = {"embed step", "label step", "graph from", "headwords in", "ERROR",
                                         "WARN", "bank reachable", NULL};
    const int64_t deadline = carls_monotonic_ms() + (int64_t)(c->timeout_s * 1000.0);
    int64_t last_maker_print = 0;
    while (!carls_proc_wait(&r->trainer, 500)) {
        s_tail(&tails[0], trainer_needles, r->quiet);
        /* Makers: at most one batch of their lines every 10 s, so the trainer's lines stay readable. */
        if (carls_monotonic_ms() - last_maker_print > 10000) {
            for (int i = 1; i < n_tails; i++) {
                s_tail(&tails[i], maker_needles, r->quiet);
            }
            last_maker_print = carls_monotonic_ms();
        }
        if (carls_run_supervise(r) != 0) {
            break;
        }
        if (carls_run_interrupted() || carls_monotonic_ms() > deadline) {
            if (!carls_run_interrupted()) {
                LOG_ERROR("the run took more than timeout_s = %g s: stopping it", c->timeout_s);
            }
            break;
        }
    }
    s_tail(&tails[0], trainer_needles, r->quiet);
    for (int i = 1; i < n_tails; i++) {
        s_tail(&tails[i], maker_needles, r->quiet);
    }
    if (!r->trainer.running) {
        carls_ptab_ended(&r->ptab, r->trainer_row, &r->trainer, r->trainer.status == 0 ? "finished" : "failed");
    }
    return 0;
}

void carls_train_stages(carls_run_t *r, double wall)
{
    if (r->trainer.running || r->trainer.status != 0) {
        carls_stages_add(&r->stages, "trainer", wall, "trainer (makers beside it): %s",
                         r->trainer.running ? "stopped by the launcher" : "failed");
        return;
    }
    carls_result_t *res = carls_xmalloc(sizeof *res);
    carls_result_read(res, r->out);
    char log[4400];
    carls_fmt(log, sizeof log, "%s/trainer.log", r->logs);
    carls_stages_trainer(&r->stages, wall, r->c->experiment, res, r->metrics, log);
    free(res);
}
