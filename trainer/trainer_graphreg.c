/* trainer graphreg: semi-supervised classification of Fashion-MNIST with the CARLS knowledge bank
 * (CARLS §4.1-4.2, Neural Structured Learning's graph regulariser).
 *
 * Every step draws a batch of labelled and unlabelled training images and minimises
 *   (1/BL) sum_labelled CE(y_i)                                  the labels
 * + beta  (1/BU) sum_unlabelled c_i CE(pseudo_i)  [c_i >= thr]   pseudo-labels from the bank's label makers
 * + alpha (1/B)  sum_i sum_j w~_ij ||h_i - h_j||^2                the graph regulariser, over every batch item
 * where h is the encoder's last hidden layer, the neighbour lists j (with similarity weights w, normalised
 * to w~ per item) come from the bank's graph table, and the neighbour embeddings h_j come from the bank's
 * embedding table, written there by kb-maker fleets from this trainer's checkpoints (constants here).
 * --neighbors-from trainer computes h_j in the trainer instead (a forward pass over every neighbour, the
 * way CARLS replaces), for comparison. alpha and beta ramp up linearly over --rampup steps.
 *
 * The next batch's graph lists, pseudo-labels and neighbour embeddings are fetched by a prefetch thread
 * while this batch trains (trainer_prefetch.h). --max-staleness S skips neighbour embeddings whose version
 * (the checkpoint step they were computed from) is more than S steps behind (counted). In bank mode the
 * prefetch thread also reduces the neighbours to a weighted mean and mean square per item, so a step costs
 * the trainer the same at 50 neighbours as at 1, and it caches neighbour rows for --neighbor-refresh batches
 * instead of reading every one for every batch (trainer_prefetch.h says why that is safe).
 *
 * When the bank is unreachable (killed, restarting) the trainer does not wait for it: the batches it cannot
 * fetch train on their labels alone, are counted (bank_skipped in metrics.csv, bank_fetches_skipped at the
 * end) and the prefetcher reconnects when the bank answers again (trainer_prefetch.h).
 *
 * Checkpoints go to --ckpt-dir at step 0 and every --ckpt-every steps (the makers watch it). Each holds,
 * besides the model, what an exact continuation needs (trainer_resume.h): the optimiser's moments and step
 * count, the shuffled labelled and unlabelled orders with their positions, the batch-draw and augmentation
 * RNG states, and the batches already drawn ahead (and handed to the prefetcher) for the next steps; dropout
 * masks are drawn from (seed, step) and the learning rate is a function of the step. With --bank-snapshot
 * PREFIX the bank is snapshotted (PREFIX-step<N>) before each checkpoint is written, and the checkpoint names
 * it. --resume continues from the checkpoint --ckpt-dir/latest names: on a bank that does not change (no
 * makers) it reproduces an uninterrupted run bit for bit; with makers it differs only as much as their
 * timing does (and by the prefetcher's neighbour-row cache, which starts empty). Evaluation on
 * the 10,000 test images, or with --validation N on N images drawn from the unlabelled training images
 * (held out of training; for choosing hyperparameters without the test set). The last stdout line is
 * test_accuracy=X (or val_accuracy=X). */
#include "trainer_graphreg.h"
#include "trainer_metrics.h"
#include "trainer_prefetch.h"
#include "trainer_resume.h"
#include "trainer_run_args.h"
#include "trainer_util.h"

#include "kb_curve_args.h"

#include "data_fmnist.h"
#include "data_user.h"
#include "progress.h"
#include "data_sample.h"
#include "nn_hash.h"
#include "nn_mlp.h"

#include "carls_args.h"
#include "checkpoint.h"
#include "files.h"
#include "log.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { S_NBR_BANK = 0, S_NBR_TRAINER = 1, S_NBR_NONE = 2 } s_nbr_mode_t;

typedef struct {
    const char *data, *data_dir;
    const char *test_data;         /* a user data set's test split (data_user.h), NULL: none */
    int labels_per_class, label_seed;
    int train_items;               /* 0: all training images are items */
    int validation;                /* held-out validation images (0: evaluate on the test set) */
    int steps, batch_labelled, batch_unlabelled;
    nn_mlp_config_t model;         /* --hidden widths and --dropout (the data gives in_dim and classes) */
    nn_optim_config_t opt;
    bool cosine;  /* cosine learning-rate decay to 0 over the run, else constant */
    int seed;
    float alpha, beta, conf_threshold;
    int rampup;
    int augment_shift;             /* random translations of training images by up to this many pixels */
    float augment_flip;            /* probability of a horizontal flip of a training image */
    int K;                         /* neighbours used per item */
    int nbr_mode;                  /* s_nbr_mode_t */
    int max_staleness;             /* 0: no limit */
    int nbr_refresh;               /* bank mode: re-read a cached neighbour row after this many batches */
    const char *kb, *tables;
    kb_curve_args_t curve;         /* --curve-key, --curve-server-key */
    const char *ckpt_dir, *metrics;
    int ckpt_every, eval_every, keep;
    bool resume;                   /* continue from --ckpt-dir/latest */
    const char *bank_snapshot;     /* snapshot the bank as PREFIX-step<N> at each checkpoint; NULL: no */
    const char *device;
    int threads;
} s_opts_t;

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer graphreg --data fashion-mnist|npy:F.npy,L.npy|csv:F.csv,L.csv --kb ENDPOINTS [options]\n"
            "data (as trainer supervised):\n"
            "  --data NAME --data-dir DIR --labels-per-class N (default 10) --label-seed S (default 0)\n"
            "  --data npy:FEATURES.npy,LABELS.npy (or csv:...): your own data set: features float32 or uint8\n"
            "                           (N, D), labels int (N,) with -1 for unlabelled (docs/EXPERIMENTS.md)\n"
            "  --test-data npy:F,L      its test split (else --validation N is needed)\n"
            "  --train-items N          use the first N training images (default 0: all 60000)\n"
            "  --validation N           hold out N unlabelled training images and evaluate on them instead of\n"
            "                           the test set (for choosing hyperparameters; default 0)\n"
            "model and optimiser:\n"
            "  --hidden H[,H2..] (default 256,128; the last is the embedding) --dropout P (default 0.2)\n"
            "  --conv C:K:P[,..]        convolution blocks before the hidden layers (images only): C channels, a\n"
            "                           K x K kernel (odd, same padding), P x P max pooling each; default none\n"
            "  --optimizer adam|sgd --lr LR (default 0.001) --weight-decay WD --schedule cosine|constant\n"
            "  --steps N (default 3000) --batch-labelled BL (default 100) --batch-unlabelled BU (default 128)\n"
            "  --seed N (default 1)\n"
            "knowledge from the bank:\n"
            "  --kb ENDPOINTS           the knowledge bank (needed unless alpha = beta = 0): one kb-server, or the\n"
            "                           comma-separated endpoints of a sharded bank in shard order\n"
            KB_CURVE_ARGS_HELP
            "  --tables PREFIX          table prefix (default fmnist: .graph .labels .emb)\n"
            "  --alpha A                graph regulariser weight (default 0)\n"
            "  --neighbors K            neighbours per item from the graph lists (default 10)\n"
            "  --neighbors-from bank|trainer|none  who computes neighbour embeddings (default bank)\n"
            "  --max-staleness S        skip neighbour embeddings more than S steps old (default 0: keep all)\n"
            "  --neighbor-refresh N     bank mode: reuse a neighbour's embedding read from the bank for N batches\n"
            "                           before reading it again (default 20; 1: read every neighbour every batch)\n"
            "  --beta B                 pseudo-label weight (default 0)\n"
            "  --conf-threshold T       ignore pseudo-labels less confident than T (default 0)\n"
            "  --rampup R               alpha and beta grow linearly over the first R steps (default 0)\n"
            "augmentation (training images only; labelled and unlabelled rows alike):\n"
            "  --augment-shift S        translate each image by a random offset in [-S, S] pixels in each\n"
            "                           direction, zero fill (default 0: off)\n"
            "  --augment-flip P         flip each image left-right with probability P (default 0: off)\n"
            "output:\n"
            "  --ckpt-dir DIR (default runs/graphreg) --ckpt-every N (default 100) --keep N (default 3)\n"
            "  --eval-every N (default 500) --metrics FILE (default DIR/metrics.csv)\n"
            "  --bank-snapshot PREFIX   before each checkpoint, snapshot the bank (every shard at one cut) as\n"
            "                           PREFIX-step<N> and record the name in the checkpoint; the newest --keep\n"
            "                           pairs are kept, older snapshots deleted (needs --kb; PREFIX: 1..39 of\n"
            "                           [A-Za-z0-9_.-])\n"
            "  --resume                 continue from the checkpoint DIR/latest names (written by this trainer with\n"
            "                           the same settings): model, optimiser, data order and position, RNG states;\n"
            "                           the bank is what it serves now (carls run --resume restores the snapshot)\n"
            "  --device auto|cpu|cuda --threads N --log-level LEVEL\n");
}

/* Parses the options into *o. Returns 0 to run, 1 when --help was answered, -1 on bad usage (reported). */
static int s_parse(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){
        .labels_per_class = 10,
        .steps = 3000,
        .batch_labelled = 100,
        .batch_unlabelled = 128,
        .model = {.n_hidden = 2, .hidden = {256, 128}, .dropout = 0.2f},
        .K = 10,
        .nbr_refresh = 20,
        .tables = "fmnist",
        .ckpt_dir = "runs/graphreg",
        .ckpt_every = 100,
        .eval_every = 500,
    };
    trainer_mlp_args_t mlp;
    trainer_mlp_args(&mlp, &o->model, &o->opt, &o->cosine, &o->seed);
    carls_fmnist_args_t data;
    carls_fmnist_args(&data, &o->data, &o->data_dir, &o->labels_per_class, 1, &o->label_seed);
    kb_curve_args(&o->curve);
    trainer_run_args_t run;
    trainer_run_args(&run, &o->ckpt_dir, &o->keep, &o->resume, &o->metrics, &o->device, &o->threads);
    const carls_arg_t args[] = {
        carls_arg_group(mlp.rows),
        carls_arg_group(data.rows),
        carls_arg_group(o->curve.rows),
        carls_arg_group(run.rows),
        carls_arg_string("test-data", &o->test_data),
        carls_arg_int("train-items", &o->train_items, 0, 100000000),
        carls_arg_int("validation", &o->validation, 0, 100000000),
        carls_arg_int("steps", &o->steps, 1, 100000000),
        carls_arg_int("batch-labelled", &o->batch_labelled, 1, 65536),
        carls_arg_int("batch-unlabelled", &o->batch_unlabelled, 0, 65536),
        carls_arg_float("alpha", &o->alpha, 0.0, 1e6),
        carls_arg_float("beta", &o->beta, 0.0, 1e6),
        carls_arg_float("conf-threshold", &o->conf_threshold, 0.0, 1.0),
        carls_arg_int("rampup", &o->rampup, 0, 100000000),
        carls_arg_int("augment-shift", &o->augment_shift, 0, 8),
        carls_arg_float("augment-flip", &o->augment_flip, 0.0, 1.0),
        carls_arg_int("neighbors", &o->K, 1, 1024),
        carls_arg_choice("neighbors-from", &o->nbr_mode,
                         (const char *const[]){"bank", "trainer", "none", NULL}), /* s_nbr_mode_t's order */
        carls_arg_int("max-staleness", &o->max_staleness, 0, 2147483647),
        carls_arg_int("neighbor-refresh", &o->nbr_refresh, 1, 100000000),
        carls_arg_string("kb", &o->kb),
        carls_arg_string("tables", &o->tables),
        carls_arg_int("ckpt-every", &o->ckpt_every, 1, 100000000),
        carls_arg_int("eval-every", &o->eval_every, 1, 100000000),
        carls_arg_string("bank-snapshot", &o->bank_snapshot),
        carls_arg_log_level(),
        {0},
    };
    const int rc = carls_args_parse("trainer graphreg", argc, argv, args, s_usage);
    if (rc != 0) {
        return rc;
    }
    if (!o->data || (strcmp(o->data, "fashion-mnist") != 0 && !carls_user_data_is_spec(o->data))) {
        fprintf(stderr, "trainer graphreg: --data fashion-mnist, npy:FEATURES.npy,LABELS.npy or "
                        "csv:FEATURES.csv,LABELS.csv is required\n");
        return -1;
    }
    if (kb_curve_args_check(&o->curve, "trainer graphreg") != 0) {
        return -1;
    }
    if (o->alpha <= 0.0f) {
        o->nbr_mode = S_NBR_NONE;
    }
    if ((o->alpha > 0.0f || o->beta > 0.0f) && !o->kb) {
        fprintf(stderr, "trainer graphreg: --kb is required when alpha or beta is above 0\n");
        return -1;
    }
    if (o->bank_snapshot && !o->kb) {
        fprintf(stderr, "trainer graphreg: --bank-snapshot needs --kb (the bank to snapshot)\n");
        return -1;
    }
    trainer_mlp_default_lr(&o->opt);
    return 0;
}

/* Draws the next n indices from order (len), reshuffling it whenever it runs out. */
static void s_draw(uint32_t *order, int len, int *cursor, uint64_t *rng, int n, uint32_t *out)
{
    for (int i = 0; i < n; i++) {
        if (*cursor >= len) {
            carls_shuffle_u32(order, (size_t)len, rng);
            *cursor = 0;
        }
        out[i] = order[(*cursor)++];
    }
}

/* Augments n images (rows x cols floats each) in place: each is flipped left-right with probability flip and
 * translated by (dy, dx) drawn uniformly from [-shift, shift]^2, vacated pixels set to 0 (the background).
 * tmp holds one image. */
static void s_augment(float *x, int n, int rows, int cols, int shift, float flip, uint64_t *rng, float *tmp)
{
    const size_t dim = (size_t)rows * (size_t)cols;
    for (int i = 0; i < n; i++) {
        float *img = x + (size_t)i * dim;
        const uint64_t r = carls_splitmix64(rng);
        const int span = 2 * shift + 1;
        const int dy = shift > 0 ? (int)(r % (uint64_t)span) - shift : 0;
        const int dx = shift > 0 ? (int)((r >> 16) % (uint64_t)span) - shift : 0;
        const bool fl = flip > 0.0f && (double)(r >> 40) / (double)(1ULL << 24) < (double)flip;
        if (dx == 0 && dy == 0 && !fl) {
            continue;
        }
        memcpy(tmp, img, sizeof *tmp * dim);
        for (int y = 0; y < rows; y++) {
            const int sy = y - dy;
            for (int c = 0; c < cols; c++) {
                int sx = c - dx;
                if (fl) {
                    sx = cols - 1 - sx;
                }
                img[(size_t)y * cols + c] =
                    sy >= 0 && sy < rows && sx >= 0 && sx < cols ? tmp[(size_t)sy * cols + sx] : 0.0f;
            }
        }
    }
}

/* Window counters between two evaluations. */
typedef struct {
    double loss, ce, pl, graph;   /* sums of per-step values */
    int64_t steps;
    int64_t nbr_used, nbr_stale, nbr_missing; /* neighbour embeddings used / skipped as too old / not there */
    double staleness_sum;         /* sum over used neighbours of (step - version) */
    int64_t pl_rows, pl_used;     /* unlabelled rows, rows with an accepted pseudo-label */
    double wait_ms, fetch_ms;     /* waiting on the prefetcher, its fetch time */
    int64_t bank_skipped;         /* batches trained without the bank's knowledge (it was unreachable) */
    int64_t rows_read;            /* neighbour rows read from the bank (the rest came from the cache) */
    int64_t train_us;             /* training-loop time */
} s_window_t;

/* In-trainer mode's graph term from the neighbours' rows (emb row nbr_slot[s] for list slot s): adds the
 * gradient of coef * sum_j w~_ij ||h_i - h_j||^2 to dh and returns the term. */
static double s_graph_term_rows(const trainer_fetch_t *f, const float *h, const float *emb, const int *nbr_slot, int B,
                                int K, int E, float coef, float *dh)
{
    double graph = 0.0;
    for (int i = 0; i < B; i++) {
        double wsum = 0.0;
        for (int j = 0; j < K; j++) {
            const int s = i * K + j;
            if (f->nbr[s] != TRAINER_NO_ITEM && f->w[s] > 0.0f) {
                wsum += f->w[s];
            }
        }
        if (wsum <= 0.0) {
            continue;
        }
        const float *hi = h + (size_t)i * E;
        float *gi = dh + (size_t)i * E;
        for (int j = 0; j < K; j++) {
            const int s = i * K + j;
            if (f->nbr[s] == TRAINER_NO_ITEM || f->w[s] <= 0.0f) {
                continue;
            }
            const float *hj = emb + (size_t)nbr_slot[s] * E;
            const float wt = (float)(f->w[s] / wsum) * coef;
            double d2 = 0.0;
            for (int e = 0; e < E; e++) {
                float d = hi[e] - hj[e];
                d2 += (double)d * d;
                gi[e] += 2.0f * wt * d;
            }
            graph += wt * d2;
        }
    }
    return graph;
}

/* A run: its data split, model, knowledge fetcher and buffers (s_setup and s_alloc fill it, s_teardown frees
 * it), the training loop's state and the window and whole-run counters. */
typedef struct {
    const s_opts_t *o;
    nn_device_t device;
    carls_fmnist_t ds;
    int N, n_lab, n_unl, n_val;    /* items, labelled, unlabelled (training), held-out validation images */
    int BL, BU, B, K, E;           /* batch: labelled + unlabelled rows; neighbours per item; embedding width */
    int max_batch;                 /* model batch (training or evaluation) */
    uint32_t *labelled, *unlabelled, *val; /* (n_lab), (N: the first n_unl train), (n_val) image indices */
    nn_mlp_t *m;
    trainer_prefetch_t *pf;        /* NULL when neither the graph nor the pseudo-labels are used */
    trainer_snapshots_t *snaps;    /* --bank-snapshot: the bank's snapshots; NULL: none */
    carls_ckpt_t *resume;          /* --resume: the checkpoint continued from (s_resume_open) */
    char resume_path[4200];        /* its file */
    int start;                     /* the first step to train: 0, or the resumed checkpoint's step */
    trainer_metrics_t metrics;
    char metrics_path[4200];
    char t_graph[200], t_labels[200], t_emb[200]; /* the bank's tables */
    bool use_graph, use_pl;
    uint32_t *batch;               /* (TRAINER_PREFETCH_DEPTH, B) drawn batches */
    uint32_t *eval_idx;            /* (max(test, n_val)) */
    float *xbuf;                   /* (max_batch, dim) */
    int32_t *ybuf;                 /* (max_batch) targets; -1: no loss on the row */
    float *aug_tmp;                /* (dim) */
    float *row_w;                  /* (B) loss weight per row */
    float *h_host, *dh_host;       /* (B, E) the last hidden layer and the graph term's gradient */
    float *dh_dev;                 /* (B, E) the gradient on the model's device */
    uint32_t *nbr_items;           /* trainer mode: (B * K) neighbours to encode */
    int *nbr_slot;                 /* trainer mode: (B * K) row of each list slot in nbr_emb_local, -1: none */
    float *nbr_x, *nbr_emb_local;  /* trainer mode: (B * K, dim) their images, (B * K, E) their embeddings */
    uint64_t rng, aug_rng;         /* batch draws, augmentation */
    int lab_cursor, unl_cursor;    /* positions in the shuffled labelled and unlabelled orders */
    int drawn;                     /* batches drawn; batch t trains at step t from batch + (t % DEPTH) * B */
    nn_optim_config_t opt;         /* o->opt with the scheduled learning rate */
    int64_t t_start;
    s_window_t win, total;         /* since the last evaluation; the whole run */
    double last_loss, last_acc;    /* the latest evaluation */
} s_run_t;

static const char *s_nbr_mode_name(s_nbr_mode_t mode, const char *none)
{
    return mode == S_NBR_BANK ? "bank" : mode == S_NBR_TRAINER ? "trainer" : none;
}

/* Loads the data set (Fashion-MNIST or the user's) and splits the training images into labelled, unlabelled
 * and validation images. */
static int s_load_data(s_run_t *r)
{
    const s_opts_t *o = r->o;
    char err[2048];
    if (carls_dataset_load(o->data, o->data_dir, o->test_data, &r->ds, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s\n", err);
        return -1;
    }
    const int C = r->ds.classes;
    if (carls_user_data_is_spec(o->data)) {
        bool unlabelled = memchr(r->ds.train.labels, CARLS_LABEL_NONE, (size_t)r->ds.train.n) != NULL;
        if (r->ds.test.n == 0 && (o->validation == 0 || unlabelled)) {
            fprintf(stderr, "trainer: %s has no test split: give --test-data%s\n", o->data,
                    unlabelled ? " (--validation needs every training example labelled)" : " or --validation N");
            return -1;
        }
        if (o->validation > 0 && unlabelled) {
            fprintf(stderr, "trainer: --validation needs every training example labelled; %s has -1 labels\n",
                    o->data);
            return -1;
        }
        if (o->augment_shift > 0 || o->augment_flip > 0.0f) {
            fprintf(stderr, "trainer: --augment-shift and --augment-flip are for images, not %s\n", o->data);
            return -1;
        }
    }
    r->N = o->train_items > 0 && o->train_items < r->ds.train.n ? o->train_items : r->ds.train.n;
    r->n_lab = o->labels_per_class * C;
    r->labelled = carls_xmalloc(sizeof *r->labelled * (size_t)r->n_lab);
    r->unlabelled = carls_xmalloc(sizeof *r->unlabelled * (size_t)r->N);
    if (carls_label_subset(r->ds.train.labels, (size_t)r->N, C, o->labels_per_class, (uint64_t)o->label_seed,
                           r->labelled, r->unlabelled) != 0) {
        fprintf(stderr, "trainer: cannot pick %d labelled images per class among %d\n", o->labels_per_class, r->N);
        return -1;
    }
    r->n_unl = r->N - r->n_lab;
    /* Validation: a seeded draw from the unlabelled images, held out of training. */
    uint64_t vrng = nn_hash_mix((uint64_t)o->label_seed, 0x76616c69ULL); /* "vali" */
    r->n_val = o->validation < r->n_unl ? o->validation : 0;
    if (r->n_val > 0) {
        carls_shuffle_u32(r->unlabelled, (size_t)r->n_unl, &vrng);
        r->val = carls_xmalloc(sizeof *r->val * (size_t)r->n_val);
        memcpy(r->val, r->unlabelled + r->n_unl - r->n_val, sizeof *r->val * (size_t)r->n_val);
        r->n_unl -= r->n_val;
    }
    r->BL = o->batch_labelled < r->n_lab ? o->batch_labelled : r->n_lab;
    r->BU = o->batch_unlabelled < r->n_unl ? o->batch_unlabelled : r->n_unl;
    r->B = r->BL + r->BU;
    r->K = o->K;
    LOG_INFO("graphreg: %d items, %d labelled (%d per class, seed %d), %d unlabelled, %d validation; batch %d+%d; "
             "alpha %g beta %g K %d neighbours from %s",
             r->N, r->n_lab, o->labels_per_class, o->label_seed, r->n_unl, r->n_val, r->BL, r->BU, (double)o->alpha,
             (double)o->beta, r->K, s_nbr_mode_name(o->nbr_mode, "nowhere"));
    return 0;
}

/* The model, the checkpoint directory, metrics.csv and (when the bank is used) the prefetcher. */
static int s_setup(s_run_t *r)
{
    const s_opts_t *o = r->o;
    r->E = o->model.hidden[o->model.n_hidden - 1];
    r->max_batch = r->B > 500 ? r->B : 500;
    if (trainer_fmnist_mlp_new(&o->model, &r->ds.train, r->ds.classes, r->device, r->max_batch, o->seed,
                               &r->m) != 0) {
        return -1;
    }
    const char *header = r->n_val ? "step,loss,ce_loss,pl_loss,graph_loss,val_loss,val_accuracy,pl_coverage,"
                                    "nbr_used,nbr_stale,nbr_missing,mean_staleness,wait_ms,fetch_ms,steps_per_s,"
                                    "elapsed_s,bank_skipped"
                                  : "step,loss,ce_loss,pl_loss,graph_loss,test_loss,test_accuracy,pl_coverage,"
                                    "nbr_used,nbr_stale,nbr_missing,mean_staleness,wait_ms,fetch_ms,steps_per_s,"
                                    "elapsed_s,bank_skipped";
    /* Resumed: the rows up to the checkpoint's step stay; at the last step the evaluation is done again
     * (s_train), so its row goes too. */
    const int64_t keep_rows = !o->resume ? -1 : r->start >= o->steps ? (int64_t)r->start - 1 : (int64_t)r->start;
    if (trainer_open_outputs(o->ckpt_dir, o->metrics, header, r->metrics_path, sizeof r->metrics_path, keep_rows,
                             &r->metrics) != 0) {
        return -1;
    }
    r->use_graph = o->nbr_mode != S_NBR_NONE;
    r->use_pl = o->beta > 0.0f;
    snprintf(r->t_graph, sizeof r->t_graph, "%s.graph", o->tables);
    snprintf(r->t_labels, sizeof r->t_labels, "%s.labels", o->tables);
    snprintf(r->t_emb, sizeof r->t_emb, "%s.emb", o->tables);
    if (r->use_graph || r->use_pl || o->bank_snapshot) {
        kb_client_curve_t keys;
        kb_client_options_t copts = {0};
        if (kb_curve_args_options(&o->curve, "trainer graphreg", &keys, &copts) != 0) {
            return -1;
        }
        if (o->bank_snapshot) {
            r->snaps = trainer_snapshots_new(o->kb, copts.curve, o->bank_snapshot, o->keep);
            if (!r->snaps) {
                explicit_bzero(&keys, sizeof keys);
                return -1;
            }
        }
        if (!r->use_graph && !r->use_pl) {
            explicit_bzero(&keys, sizeof keys);
            return 0;
        }
        trainer_prefetch_config_t pc = {
            .endpoints = o->kb,
            .curve = copts.curve,
            .graph_table = r->use_graph ? r->t_graph : NULL,
            .labels_table = r->use_pl ? r->t_labels : NULL,
            .emb_table = o->nbr_mode == S_NBR_BANK ? r->t_emb : NULL,
            .K = r->K,
            .E = r->E,
            .max_batch = r->B,
            .n_items = r->N,
            .refresh_batches = o->nbr_refresh,
            .aggregate = o->nbr_mode == S_NBR_BANK,
            .max_staleness = o->max_staleness,
        };
        r->pf = trainer_prefetch_new(&pc);
        explicit_bzero(&keys, sizeof keys);
        if (!r->pf) {
            return -1;
        }
    }
    return 0;
}

/* The training loop's buffers and state. */
static void s_alloc(s_run_t *r)
{
    const size_t B = (size_t)r->B, K = (size_t)r->K, E = (size_t)r->E, dim = (size_t)r->ds.train.dim;
    r->xbuf = carls_xmalloc(sizeof(float) * (size_t)r->max_batch * dim);
    r->ybuf = carls_xmalloc(sizeof(int32_t) * (size_t)r->max_batch);
    r->aug_tmp = carls_xmalloc(sizeof(float) * dim);
    r->eval_idx = carls_xmalloc(sizeof(uint32_t) * (size_t)(r->ds.test.n > r->n_val ? r->ds.test.n : r->n_val));
    r->row_w = carls_xmalloc(sizeof(float) * B);
    r->h_host = carls_xmalloc(sizeof(float) * B * E);
    r->dh_host = carls_xmalloc(sizeof(float) * B * E);
    r->dh_dev = r->m->ops->alloc(sizeof(float) * B * E);
    r->batch = carls_xmalloc(sizeof(uint32_t) * B * TRAINER_PREFETCH_DEPTH);
    if (r->o->nbr_mode == S_NBR_TRAINER) {
        r->nbr_items = carls_xmalloc(sizeof(uint32_t) * B * K);
        r->nbr_slot = carls_xmalloc(sizeof(int) * B * K);
        r->nbr_x = carls_xmalloc(sizeof(float) * B * K * dim);
        r->nbr_emb_local = carls_xmalloc(sizeof(float) * B * K * E);
    }
    r->rng = nn_hash_mix((uint64_t)r->o->seed, 0x67726567ULL);     /* "greg" */
    r->aug_rng = nn_hash_mix((uint64_t)r->o->seed, 0x6175676dULL); /* "augm" */
    r->lab_cursor = r->n_lab;
    r->unl_cursor = r->n_unl;
    r->opt = r->o->opt;
}

static void s_teardown(s_run_t *r)
{
    trainer_prefetch_destroy(&r->pf);
    trainer_snapshots_destroy(&r->snaps);
    carls_ckpt_destroy(&r->resume);
    trainer_metrics_close(&r->metrics);
    if (r->m && r->dh_dev) {
        r->m->ops->free(r->dh_dev);
    }
    nn_mlp_destroy(&r->m);
    carls_fmnist_free(&r->ds);
    void *buffers[] = {r->labelled, r->unlabelled, r->val, r->batch, r->eval_idx, r->nbr_items, r->xbuf,
                       r->aug_tmp, r->row_w, r->h_host, r->dh_host, r->nbr_x, r->nbr_emb_local, r->ybuf,
                       r->nbr_slot};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) {
        free(buffers[i]);
    }
}

/* Draws batches (and, with the bank, submits them to the prefetcher) TRAINER_PREFETCH_DEPTH - 1 steps before
 * they train, so their knowledge is fetched while earlier batches train. */
static void s_draw_ahead(s_run_t *r, int step)
{
    for (; r->drawn < r->o->steps && r->drawn < step + TRAINER_PREFETCH_DEPTH; r->drawn++) {
        uint32_t *b = r->batch + (size_t)(r->drawn % TRAINER_PREFETCH_DEPTH) * (size_t)r->B;
        s_draw(r->labelled, r->n_lab, &r->lab_cursor, &r->rng, r->BL, b);
        s_draw(r->unlabelled, r->n_unl, &r->unl_cursor, &r->rng, r->BU, b + r->BL);
        if (r->pf) {
            trainer_prefetch_submit(r->pf, b, r->B, (uint64_t)r->drawn);
        }
    }
}

/* The batch's images (augmented), targets and row weights: labelled rows weigh 1/BL, unlabelled rows
 * beta * confidence / BU with an accepted pseudo-label, else 0. */
static void s_targets(s_run_t *r, const uint32_t *cur_batch, const trainer_fetch_t *f, float beta)
{
    const s_opts_t *o = r->o;
    carls_image_set_batch(&r->ds.train, cur_batch, r->B, r->xbuf, r->ybuf);
    if (o->augment_shift > 0 || o->augment_flip > 0.0f) {
        s_augment(r->xbuf, r->B, r->ds.train.rows, r->ds.train.cols, o->augment_shift, o->augment_flip, &r->aug_rng,
                  r->aug_tmp);
    }
    for (int i = 0; i < r->B; i++) {
        if (i < r->BL) {
            r->row_w[i] = 1.0f / (float)r->BL;
            continue;
        }
        r->win.pl_rows++;
        if (r->use_pl && f && f->plabel[i] >= 0 && f->pconf[i] >= o->conf_threshold &&
            f->plabel[i] < r->ds.classes) {
            r->ybuf[i] = f->plabel[i];
            r->row_w[i] = beta * f->pconf[i] / (float)r->BU;
            r->win.pl_used++;
        } else {
            r->ybuf[i] = -1;
            r->row_w[i] = 0.0f;
        }
    }
}

/* In-trainer mode: the neighbours' embeddings from the current weights, before the batch's forward pass
 * (nn_mlp_encode reuses the activation buffers). Returns U, the neighbours in the batch's lists. */
static int s_encode_neighbours(s_run_t *r, const trainer_fetch_t *f)
{
    int U = 0;
    for (int i = 0; i < r->B * r->K; i++) {
        r->nbr_slot[i] = -1;
        if (f->nbr[i] != TRAINER_NO_ITEM) {
            r->nbr_slot[i] = U;
            r->nbr_items[U++] = f->nbr[i];
        }
    }
    if (U > 0) {
        carls_image_set_batch(&r->ds.train, r->nbr_items, U, r->nbr_x, NULL);
        nn_mlp_encode(r->m, r->nbr_x, U, r->nbr_emb_local);
    }
    return U;
}

/* The graph term: d/dh_i of alpha/B sum_j w~_ij ||h_i - h_j||^2, neighbours as constants, into dh_dev.
 * Returns the term. */
static double s_graph_term(s_run_t *r, const trainer_fetch_t *f, int U, float alpha)
{
    nn_mlp_t *m = r->m;
    const size_t bytes = sizeof(float) * (size_t)r->B * (size_t)r->E;
    double graph;
    m->ops->to_host(r->h_host, m->h[m->cfg.n_hidden - 1], bytes);
    memset(r->dh_host, 0, bytes);
    if (r->o->nbr_mode == S_NBR_BANK) {
        graph = trainer_fetch_graph_term(f, r->h_host, r->E, alpha / (float)r->B, r->dh_host);
        r->win.nbr_used += f->nbr_used;
        r->win.nbr_stale += f->nbr_stale;
        r->win.nbr_missing += f->nbr_missing;
        r->win.staleness_sum += f->staleness_sum;
        r->win.rows_read += f->fetched;
    } else {
        r->win.nbr_used += U;
        graph = s_graph_term_rows(f, r->h_host, r->nbr_emb_local, r->nbr_slot, r->B, r->K, r->E, alpha / (float)r->B,
                                  r->dh_host);
    }
    m->ops->to_device(r->dh_dev, r->dh_host, bytes);
    return graph;
}

/* One training step on batch `step`. Returns 0, or -1 when the bank failed for good. */
static int s_train_step(s_run_t *r, int step)
{
    const s_opts_t *o = r->o;
    nn_mlp_t *m = r->m;
    const int64_t t_step = carls_monotonic_us();
    s_draw_ahead(r, step);
    const uint32_t *cur_batch = r->batch + (size_t)(step % TRAINER_PREFETCH_DEPTH) * (size_t)r->B;
    const trainer_fetch_t *f = NULL;
    double wait_ms = 0;
    if (r->pf) {
        f = trainer_prefetch_wait(r->pf, &wait_ms);
        if (f->rc < 0) {
            fprintf(stderr, "trainer: bank: %s\n", f->err);
            return -1;
        }
        if (f->rc == TRAINER_FETCH_SKIPPED) {
            r->win.bank_skipped++; /* the batch trains on its labels alone */
        }
    }
    const float ramp = o->rampup > 0 && step < o->rampup ? (float)(step + 1) / (float)o->rampup : 1.0f;
    const float alpha = o->alpha * ramp, beta = o->beta * ramp;
    s_targets(r, cur_batch, f, beta);
    const int U = r->use_graph && o->nbr_mode == S_NBR_TRAINER && f ? s_encode_neighbours(r, f) : 0;
    nn_mlp_set_batch(m, r->xbuf, r->ybuf, r->B);
    nn_mlp_forward(m, r->B, true, nn_hash_mix((uint64_t)o->seed, (uint64_t)step));
    /* Per-row CE for the loss report. */
    m->ops->to_host(m->h_losses, m->losses, sizeof(float) * (size_t)r->B);
    double ce = 0.0, pl = 0.0;
    for (int i = 0; i < r->B; i++) {
        if (r->ybuf[i] >= 0) {
            if (i < r->BL) {
                ce += m->h_losses[i] * r->row_w[i];
            } else {
                pl += m->h_losses[i] * r->row_w[i];
            }
        }
    }
    double graph = 0.0;
    const float *d_emb = NULL;
    if (r->use_graph && f && alpha > 0.0f) {
        graph = s_graph_term(r, f, U, alpha);
        d_emb = r->dh_dev;
    }
    nn_mlp_zero_grad(m);
    nn_mlp_backward_weighted(m, r->B, r->row_w, d_emb);
    if (o->cosine) {
        r->opt.lr = o->opt.lr * 0.5f * (1.0f + cosf((float)M_PI * (float)step / (float)o->steps));
    }
    nn_mlp_step(m, &r->opt);
    s_window_t *w = &r->win;
    w->train_us += carls_monotonic_us() - t_step;
    w->loss += ce + pl + graph;
    w->ce += ce;
    w->pl += pl;
    w->graph += graph;
    w->steps++;
    w->wait_ms += wait_ms;
    w->fetch_ms += f ? f->fetch_ms : 0.0;
    return 0;
}

/* Evaluates on the validation or test images, writes the window's metrics row and log line, and adds the
 * window to the run's totals. */
static void s_end_window(s_run_t *r, int done)
{
    const s_opts_t *o = r->o;
    r->m->ops->synchronize();
    if (r->n_val) {
        trainer_mlp_evaluate(r->m, &r->ds.train, r->val, r->n_val, r->xbuf, r->ybuf, &r->last_loss, &r->last_acc);
    } else {
        carls_iota_u32(r->eval_idx, (size_t)r->ds.test.n);
        trainer_mlp_evaluate(r->m, &r->ds.test, r->eval_idx, r->ds.test.n, r->xbuf, r->ybuf, &r->last_loss,
                             &r->last_acc);
    }
    s_window_t *w = &r->win;
    const double ws = w->steps ? (double)w->steps : 1.0; /* 0 only after resuming at the last step */
    const double sps = w->train_us > 0 ? ws / ((double)w->train_us / 1e6) : 0.0;
    double row[17] = {done,
                      w->loss / ws,
                      w->ce / ws,
                      w->pl / ws,
                      w->graph / ws,
                      r->last_loss,
                      r->last_acc,
                      w->pl_rows ? (double)w->pl_used / (double)w->pl_rows : 0.0,
                      (double)w->nbr_used / ws,
                      (double)w->nbr_stale,
                      (double)w->nbr_missing,
                      w->nbr_used ? w->staleness_sum / (double)w->nbr_used : 0.0,
                      w->wait_ms / ws,
                      w->fetch_ms / ws,
                      sps,
                      (double)(carls_monotonic_us() - r->t_start) / 1e6,
                      (double)w->bank_skipped};
    trainer_metrics_row(&r->metrics, row);
    char skipped_text[96] = "";
    if (w->bank_skipped) {
        snprintf(skipped_text, sizeof skipped_text, "; %lld batches without the bank (unreachable)",
                 (long long)w->bank_skipped);
    }
    LOG_INFO("step %d/%d: loss %.4f (ce %.4f pl %.4f graph %.4f), %s accuracy %.4f, pseudo-labels on %.0f%% "
             "of unlabelled rows, %.1f neighbours/step (stale %lld, missing %lld, mean age %.0f steps), "
             "wait %.2f ms/step, %.1f steps/s%s",
             done, o->steps, w->loss / ws, w->ce / ws, w->pl / ws, w->graph / ws, r->n_val ? "val" : "test",
             r->last_acc, 100.0 * row[7], row[8], (long long)w->nbr_stale, (long long)w->nbr_missing, row[11], row[12],
             sps, skipped_text);
    carls_prom_progress_add(trainer_prom, (uint64_t)w->steps, (uint64_t)w->steps * (uint64_t)r->B,
                            (double)w->train_us / 1e6 + w->wait_ms / 1e3, w->wait_ms / 1e3);
    carls_prom_progress_set_step(trainer_prom, done, o->steps);
    carls_prom_progress_set_eval(trainer_prom, r->last_loss, r->last_acc);
    s_window_t *t = &r->total;
    t->train_us += w->train_us;
    t->wait_ms += w->wait_ms;
    t->nbr_used += w->nbr_used;
    t->nbr_stale += w->nbr_stale;
    t->nbr_missing += w->nbr_missing;
    t->bank_skipped += w->bank_skipped;
    t->rows_read += w->rows_read;
    memset(w, 0, sizeof *w);
}

/* The settings a resumed run must share with the run it continues (train.config): those that decide the data
 * order, the model's shapes and the optimiser's schedule. */
static void s_config_text(const s_run_t *r, char *buf, size_t len)
{
    const s_opts_t *o = r->o;
    int n = snprintf(buf, len,
                     "graphreg data=%s items=%d labelled=%d unlabelled=%d validation=%d label_seed=%d batch=%d+%d "
                     "steps=%d seed=%d optimizer=%s lr=%.9g weight_decay=%.9g schedule=%s dropout=%.9g "
                     "augment=%d,%.9g hidden=",
                     o->data, r->N, r->n_lab, r->n_unl, r->n_val, o->label_seed, r->BL, r->BU, o->steps, o->seed,
                     o->opt.kind == NN_OPT_ADAM ? "adam" : "sgd", (double)o->opt.lr, (double)o->opt.weight_decay,
                     o->cosine ? "cosine" : "constant", (double)o->model.dropout, o->augment_shift,
                     (double)o->augment_flip);
    for (int l = 0; l < o->model.n_hidden && n > 0 && (size_t)n < len; l++) {
        n += snprintf(buf + n, len - (size_t)n, "%s%d", l ? "," : "", o->model.hidden[l]);
    }
    if (o->model.n_conv > 0 && n > 0 && (size_t)n < len) { /* only then, so older runs' train.config still match */
        char conv[128];
        trainer_conv_text(&o->model, conv, sizeof conv);
        snprintf(buf + n, len - (size_t)n, " conv=%s", conv);
    }
}

/* Adds the trainer's state at step `done` to c (trainer_resume.h): train.config, the optimiser, the data
 * orders, positions and RNG states, the batches drawn ahead for steps done..drawn-1 and the bank snapshot's
 * name (snap, "" for none). Returns 0, or -1 with err. */
static int s_add_state(const s_run_t *r, carls_ckpt_t *c, int done, const char *snap, char *err, size_t errlen)
{
    char config[1024];
    s_config_text(r, config, sizeof config);
    const int ahead = r->drawn - done;
    uint32_t *batches = carls_xmalloc(sizeof(uint32_t) * (size_t)(ahead > 0 ? ahead : 1) * (size_t)r->B);
    for (int t = done; t < r->drawn; t++) {
        memcpy(batches + (size_t)(t - done) * (size_t)r->B, r->batch + (size_t)(t % TRAINER_PREFETCH_DEPTH) * (size_t)r->B,
               sizeof(uint32_t) * (size_t)r->B);
    }
    const struct {
        const char *name;
        uint64_t v;
    } nums[] = {{"data.rng", r->rng},
                {"data.aug_rng", r->aug_rng},
                {"data.lab_cursor", (uint64_t)r->lab_cursor},
                {"data.unl_cursor", (uint64_t)r->unl_cursor},
                {"data.drawn", (uint64_t)r->drawn}};
    int rc = carls_ckpt_add_text(c, TRAINER_CKPT_CONFIG, config) != 0 ? -1 : 0;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0] && rc == 0; i++) {
        rc = carls_ckpt_add_u64(c, nums[i].name, nums[i].v) != 0 ? -1 : 0;
    }
    if (rc != 0) {
        rc = carls_errorf(err, errlen, -1, "cannot add the trainer's state to the checkpoint");
    }
    rc = rc ? rc : trainer_mlp_save_opt(r->m, c, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_u32s(c, "data.labelled", r->labelled, (size_t)r->n_lab, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_u32s(c, "data.unlabelled", r->unlabelled, (size_t)r->n_unl, err, errlen);
    rc = rc ? rc : trainer_ckpt_add_u32s(c, "data.ahead", batches, (size_t)(ahead > 0 ? ahead : 0) * (size_t)r->B,
                                         err, errlen);
    if (rc == 0 && *snap && carls_ckpt_add_text(c, TRAINER_CKPT_SNAPSHOT, snap) != 0) {
        rc = carls_errorf(err, errlen, -1, "cannot add the snapshot name %s", snap);
    }
    free(batches);
    return rc;
}

/* The checkpoint of step `done`: with --bank-snapshot the bank's snapshot first (the trainer writes nothing to
 * the bank, so the snapshot is of the bank as its makers left it by then), then the checkpoint naming it, then
 * the snapshot `keep` checkpoints back is deleted. Returns 0 or -1. */
static int s_checkpoint(s_run_t *r, int done)
{
    const s_opts_t *o = r->o;
    char err[1024], snap[256] = "";
    if (r->snaps) {
        trainer_snapshot_take(r->snaps, (uint64_t)done, snap, sizeof snap);
    }
    carls_ckpt_t *c = NULL;
    int rc = nn_mlp_to_ckpt(r->m, (uint64_t)done, &c, err, sizeof err);
    rc = rc ? rc : s_add_state(r, c, done, snap, err, sizeof err);
    if (rc != 0) {
        LOG_ERROR("checkpoint at step %d failed: %s", done, err);
    } else {
        rc = trainer_ckpt_save(c, o->ckpt_dir, o->keep);
    }
    carls_ckpt_destroy(&c);
    if (rc == 0 && *snap) {
        trainer_snapshot_prune(r->snaps, (uint64_t)done, trainer_ckpt_prev, (void *)&o->ckpt_every);
    }
    return rc;
}

/* --resume, before the model and the buffers exist: reads the checkpoint --ckpt-dir/latest names, checks that
 * it is this run's, and sets r->start. Returns 0, or -1 after printing why. */
static int s_resume_open(s_run_t *r)
{
    char config[1024];
    s_config_text(r, config, sizeof config);
    if (trainer_resume_open(r->o->ckpt_dir, NN_MLP_KIND_CLASSIFIER, config, &r->resume, r->resume_path,
                            sizeof r->resume_path) != 0) {
        return -1;
    }
    const uint64_t step = carls_ckpt_step(r->resume);
    if (step > (uint64_t)r->o->steps) {
        fprintf(stderr, "trainer: --resume: %s is at step %llu, beyond --steps %d\n", r->resume_path,
                (unsigned long long)step, r->o->steps);
        return -1;
    }
    r->start = (int)step;
    return 0;
}

/* Checks that the n indices of v are below limit (a checkpoint is untrusted input). */
static int s_check_items(const uint32_t *v, size_t n, int limit, const char *name, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i] >= (uint32_t)limit) {
            return carls_errorf(err, errlen, -1, "%s[%zu] = %u is not an item of this run (%d items)", name, i, v[i],
                                limit);
        }
    }
    return 0;
}

/* --resume, once the model, the prefetcher and the buffers exist: the model and optimiser, the data orders,
 * positions and RNG states, and the batches drawn ahead (handed to the prefetcher again, for the same steps).
 * Returns 0, or -1 after printing why. */
static int s_resume_apply(s_run_t *r)
{
    const carls_ckpt_t *c = r->resume;
    char err[1024] = "";
    uint64_t v[5] = {0};
    const char *names[5] = {"data.rng", "data.aug_rng", "data.lab_cursor", "data.unl_cursor", "data.drawn"};
    int rc = trainer_mlp_load_state(r->m, c, err, sizeof err);
    for (int i = 0; i < 5 && rc == 0; i++) {
        rc = carls_ckpt_get_u64(c, names[i], &v[i], err, sizeof err) ? -1 : 0;
    }
    const uint64_t last = (uint64_t)r->start + TRAINER_PREFETCH_DEPTH - 1;
    if (rc == 0 && (v[2] > (uint64_t)r->n_lab || v[3] > (uint64_t)r->n_unl || v[4] < (uint64_t)r->start ||
                    v[4] > (last < (uint64_t)r->o->steps ? last : (uint64_t)r->o->steps))) {
        rc = carls_errorf(err, sizeof err, -1, "positions out of range (labelled %llu of %d, unlabelled %llu of %d, "
                          "drawn %llu at step %d)", (unsigned long long)v[2], r->n_lab, (unsigned long long)v[3],
                          r->n_unl, (unsigned long long)v[4], r->start);
    }
    const size_t ahead = rc == 0 ? (size_t)(v[4] - (uint64_t)r->start) : 0;
    uint32_t *batches = carls_xmalloc(sizeof(uint32_t) * (ahead ? ahead : 1) * (size_t)r->B);
    rc = rc ? rc : trainer_ckpt_get_u32s(c, "data.labelled", r->labelled, (size_t)r->n_lab, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_get_u32s(c, "data.unlabelled", r->unlabelled, (size_t)r->n_unl, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_get_u32s(c, "data.ahead", batches, ahead * (size_t)r->B, err, sizeof err);
    rc = rc ? rc : s_check_items(r->labelled, (size_t)r->n_lab, r->N, "data.labelled", err, sizeof err);
    rc = rc ? rc : s_check_items(r->unlabelled, (size_t)r->n_unl, r->N, "data.unlabelled", err, sizeof err);
    rc = rc ? rc : s_check_items(batches, ahead * (size_t)r->B, r->N, "data.ahead", err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "trainer: --resume: %s: %s\n", r->resume_path, err);
        free(batches);
        return -1;
    }
    r->rng = v[0];
    r->aug_rng = v[1];
    r->lab_cursor = (int)v[2];
    r->unl_cursor = (int)v[3];
    r->drawn = (int)v[4];
    for (int t = r->start; t < r->drawn; t++) {
        uint32_t *b = r->batch + (size_t)(t % TRAINER_PREFETCH_DEPTH) * (size_t)r->B;
        memcpy(b, batches + (size_t)(t - r->start) * (size_t)r->B, sizeof(uint32_t) * (size_t)r->B);
        if (r->pf) {
            trainer_prefetch_submit(r->pf, b, r->B, (uint64_t)t);
        }
    }
    free(batches);
    const char *snap = carls_ckpt_text(c, TRAINER_CKPT_SNAPSHOT);
    LOG_INFO("resumed from step %d (checkpoint %s, snapshot %s)", r->start, r->resume_path, snap ? snap : "none");
    return 0;
}

/* Checkpoint at step 0 (unless resumed), then train, checkpointing and evaluating on schedule. Returns 0 or
 * -1. */
static int s_train(s_run_t *r)
{
    const s_opts_t *o = r->o;
    if (!o->resume && s_checkpoint(r, 0) != 0) {
        return -1;
    }
    r->t_start = carls_monotonic_us();
    /* On a terminal, a progress line over the whole run (rate, time left); the evaluation lines are the log. */
    carls_progress_t bar;
    carls_progress_start_units(&bar, "graphreg", o->steps - r->start, "steps");
    for (int step = r->start; step < o->steps; step++) {
        if (s_train_step(r, step) != 0) {
            carls_progress_clear(&bar);
            return -1;
        }
        const int done = step + 1;
        if (bar.tty)
            carls_progress_add(&bar, 1);
        if ((done % o->ckpt_every == 0 || done == o->steps) && s_checkpoint(r, done) != 0) {
            return -1;
        }
        if (done % o->eval_every == 0 || done == o->steps) {
            carls_progress_clear(&bar);
            s_end_window(r, done);
        }
    }
    if (bar.tty)
        carls_progress_finish(&bar, NULL);
    if (r->start >= o->steps) {
        s_end_window(r, o->steps); /* resumed at the last step: only the evaluation is left */
    }
    return 0;
}

/* The summary on stdout; its last line is test_accuracy=X (or val_accuracy=X). */
static void s_print_summary(const s_run_t *r)
{
    const s_opts_t *o = r->o;
    const s_window_t *t = &r->total;
    const double train_s = (double)t->train_us / 1e6;
    printf("graphreg: %d labelled, %d unlabelled, %d steps of %d+%d, alpha %g, beta %g, K %d from %s, device %s\n",
           r->n_lab, r->n_unl, o->steps, r->BL, r->BU, (double)o->alpha, (double)o->beta, r->K,
           s_nbr_mode_name(o->nbr_mode, "none"), nn_device_name(r->device));
    printf("checkpoints: %s, metrics: %s\n", o->ckpt_dir, r->metrics_path);
    printf("train_seconds=%.2f\n", train_s);
    const int trained = o->steps - r->start;
    if (o->resume) {
        const char *snap = carls_ckpt_text(r->resume, TRAINER_CKPT_SNAPSHOT);
        printf("resumed from step %d (checkpoint %s, snapshot %s)\n", r->start, r->resume_path, snap ? snap : "none");
        printf("resumed_from_step=%d\n", r->start);
    }
    printf("steps_per_s=%.2f\n", train_s > 0 ? trained / train_s : 0.0);
    printf("wait_ms_per_step=%.3f\n", trained > 0 ? t->wait_ms / trained : 0.0);
    printf("neighbors_used=%lld\nneighbors_stale=%lld\nneighbors_missing=%lld\n", (long long)t->nbr_used,
           (long long)t->nbr_stale, (long long)t->nbr_missing);
    if (r->pf) {
        printf("bank_fetches_skipped=%lld\n", (long long)t->bank_skipped);
    }
    if (r->pf && o->nbr_mode == S_NBR_BANK) {
        printf("neighbor_rows_read_per_step=%.1f\n", trained > 0 ? (double)t->rows_read / trained : 0.0);
    }
    printf("%s_loss=%.4f\n", r->n_val ? "val" : "test", r->last_loss);
    printf("%s_accuracy=%.4f\n", r->n_val ? "val" : "test", r->last_acc);
    fflush(stdout);
}

int trainer_graphreg_main(int argc, char **argv)
{
    s_opts_t o;
    int parsed = s_parse(argc, argv, &o);
    if (parsed != 0) {
        return parsed > 0 ? 0 : 2;
    }
    s_run_t r = {.o = &o};
    if (trainer_setup_device(o.device, &r.device) != 0) {
        return 2;
    }
    trainer_setup_threads(o.threads);
    int rc = 1;
    if (s_load_data(&r) == 0 && (!o.resume || s_resume_open(&r) == 0) && s_setup(&r) == 0) {
        s_alloc(&r);
        if ((!o.resume || s_resume_apply(&r) == 0) && s_train(&r) == 0) {
            s_print_summary(&r);
            rc = 0;
        }
    }
    s_teardown(&r);
    return rc;
}
