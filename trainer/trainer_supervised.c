/* trainer supervised: an MLP encoder + softmax classifier trained on the labelled part of Fashion-MNIST's
 * training set, evaluated on its 10,000 test images. The supervised-only baseline for the semi-supervised
 * experiments: with --labels-per-class N it sees N labelled images per class and ignores the rest.
 *
 * Output: a progress bar on stderr; metrics.csv (one row per evaluation); checkpoints in --ckpt-dir (at each
 * evaluation, the latest pointer updated, the newest --keep kept); a summary on stdout whose last line is
 * test_accuracy=0.XXXX. */
#include "trainer.h"
#include "trainer_metrics.h"
#include "trainer_progress.h"
#include "trainer_util.h"

#include "data_fmnist.h"
#include "data_sample.h"
#include "nn_hash.h"
#include "nn_mlp.h"

#include "checkpoint.h"
#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *data;              /* only "fashion-mnist" */
    const char *data_dir;          /* NULL: the Debian package's folder */
    int labels_per_class;          /* 0: every training label */
    int label_seed;                /* picks the labelled subset */
    int epochs;                    /* passes over the labelled examples */
    int batch;                     /* examples per step */
    int n_hidden;                  /* encoder layers */
    int hidden[NN_MLP_MAX_HIDDEN]; /* their widths */
    float dropout;                 /* after each hidden ReLU */
    nn_optim_config_t opt;         /* optimiser */
    bool cosine;                   /* cosine learning-rate decay to 0 over the run, else constant */
    int seed;                      /* initialisation, shuffles, dropout */
    const char *ckpt_dir;          /* checkpoints (and metrics.csv unless --metrics) */
    const char *metrics;           /* CSV path, NULL: <ckpt_dir>/metrics.csv */
    const char *device;            /* auto | cpu | cuda */
    int threads;                   /* OpenBLAS threads, 0: TRAINER_DEFAULT_THREADS */
    int eval_every;                /* evaluate (and checkpoint) every this many epochs, and after the last */
    int keep;                      /* checkpoints kept in ckpt_dir */
} s_opts_t;

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer supervised --data fashion-mnist [options]\n"
            "  --data NAME              data set: fashion-mnist\n"
            "  --data-dir DIR           where its IDX files are (default %s)\n"
            "  --labels-per-class N     use N labelled training images per class (default 0: all 60000)\n"
            "  --label-seed S           seed choosing those images (default 0)\n"
            "  --epochs E               passes over the labelled images (default 15)\n"
            "  --batch B                examples per step (default 128)\n"
            "  --hidden H[,H2...]       encoder widths (default 512,256)\n"
            "  --dropout P              dropout after each hidden layer (default 0.2)\n"
            "  --optimizer adam|sgd     (default adam)\n"
            "  --lr LR                  learning rate (default 0.001 adam, 0.05 sgd)\n"
            "  --momentum M             SGD momentum (default 0.9)\n"
            "  --weight-decay WD        (default 0; AdamW-style for adam, L2 for sgd)\n"
            "  --schedule cosine|constant  learning-rate schedule (default cosine)\n"
            "  --seed N                 initialisation, shuffle and dropout seed (default 1)\n"
            "  --eval-every K           evaluate and checkpoint every K epochs and at the end (default 1)\n"
            "  --ckpt-dir DIR           checkpoints and metrics (default runs/supervised)\n"
            "  --keep N                 checkpoints kept (default 3)\n"
            "  --metrics FILE           metrics CSV (default DIR/metrics.csv)\n"
            "  --device auto|cpu|cuda   (default auto: a GPU when there is one)\n"
            "  --threads N              OpenBLAS threads (default 1, see docs/BENCHMARKS.md)\n"
            "  --log-level LEVEL        debug|info|warn|error\n",
            CARLS_FMNIST_DIR);
}

/* Parses the options into *o. Returns 0 to run, 1 when --help was answered, -1 on bad usage (reported). */
static int s_parse(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){
        .data = NULL,
        .epochs = 15,
        .batch = 128,
        .n_hidden = 2,
        .hidden = {512, 256},
        .dropout = 0.2f,
        .opt = {.kind = NN_OPT_ADAM, .lr = -1.0f, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
        .cosine = true,
        .seed = 1,
        .ckpt_dir = "runs/supervised",
        .device = "auto",
        .eval_every = 1,
        .keep = 3,
    };
    enum {
        O_DATA = 256, O_DATA_DIR, O_LPC, O_LSEED, O_EPOCHS, O_BATCH, O_HIDDEN, O_DROPOUT, O_OPT, O_LR, O_MOM, O_WD,
        O_SCHED, O_SEED, O_EVAL, O_CKPT, O_KEEP, O_METRICS, O_DEVICE, O_THREADS, O_LOG, O_HELP
    };
    static const struct option longopts[] = {
        {"data", required_argument, NULL, O_DATA},
        {"data-dir", required_argument, NULL, O_DATA_DIR},
        {"labels-per-class", required_argument, NULL, O_LPC},
        {"label-seed", required_argument, NULL, O_LSEED},
        {"epochs", required_argument, NULL, O_EPOCHS},
        {"batch", required_argument, NULL, O_BATCH},
        {"hidden", required_argument, NULL, O_HIDDEN},
        {"dropout", required_argument, NULL, O_DROPOUT},
        {"optimizer", required_argument, NULL, O_OPT},
        {"lr", required_argument, NULL, O_LR},
        {"momentum", required_argument, NULL, O_MOM},
        {"weight-decay", required_argument, NULL, O_WD},
        {"schedule", required_argument, NULL, O_SCHED},
        {"seed", required_argument, NULL, O_SEED},
        {"eval-every", required_argument, NULL, O_EVAL},
        {"ckpt-dir", required_argument, NULL, O_CKPT},
        {"keep", required_argument, NULL, O_KEEP},
        {"metrics", required_argument, NULL, O_METRICS},
        {"device", required_argument, NULL, O_DEVICE},
        {"threads", required_argument, NULL, O_THREADS},
        {"log-level", required_argument, NULL, O_LOG},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_DATA:
            o->data = optarg;
            break;
        case O_DATA_DIR:
            o->data_dir = optarg;
            break;
        case O_LPC:
            bad = trainer_parse_int("labels-per-class", optarg, 0, 6000, &o->labels_per_class);
            break;
        case O_LSEED:
            bad = trainer_parse_int("label-seed", optarg, 0, 2147483647, &o->label_seed);
            break;
        case O_EPOCHS:
            bad = trainer_parse_int("epochs", optarg, 1, 1000000, &o->epochs);
            break;
        case O_BATCH:
            bad = trainer_parse_int("batch", optarg, 1, 65536, &o->batch);
            break;
        case O_HIDDEN:
            o->n_hidden = trainer_parse_widths(optarg, o->hidden, NN_MLP_MAX_HIDDEN);
            if (o->n_hidden < 1) {
                fprintf(stderr, "trainer: --hidden: '%s' is not a list of 1..%d widths like 512,256\n", optarg,
                        NN_MLP_MAX_HIDDEN);
                bad = -1;
            }
            break;
        case O_DROPOUT:
            bad = trainer_parse_float("dropout", optarg, 0.0, 0.95, &o->dropout);
            break;
        case O_OPT: {
            bool adam = true;
            bad = trainer_parse_choice("optimizer", optarg, "adam", "sgd", &adam);
            o->opt.kind = adam ? NN_OPT_ADAM : NN_OPT_SGD;
            break;
        }
        case O_LR:
            bad = trainer_parse_float("lr", optarg, 1e-9, 100.0, &o->opt.lr);
            break;
        case O_MOM:
            bad = trainer_parse_float("momentum", optarg, 0.0, 0.999, &o->opt.momentum);
            break;
        case O_WD:
            bad = trainer_parse_float("weight-decay", optarg, 0.0, 10.0, &o->opt.weight_decay);
            break;
        case O_SCHED:
            bad = trainer_parse_choice("schedule", optarg, "cosine", "constant", &o->cosine);
            break;
        case O_SEED:
            bad = trainer_parse_int("seed", optarg, 0, 2147483647, &o->seed);
            break;
        case O_EVAL:
            bad = trainer_parse_int("eval-every", optarg, 1, 1000000, &o->eval_every);
            break;
        case O_CKPT:
            o->ckpt_dir = optarg;
            break;
        case O_KEEP:
            bad = trainer_parse_int("keep", optarg, 1, 1000000, &o->keep);
            break;
        case O_METRICS:
            o->metrics = optarg;
            break;
        case O_DEVICE:
            o->device = optarg;
            break;
        case O_THREADS:
            bad = trainer_parse_int("threads", optarg, 1, 1024, &o->threads);
            break;
        case O_LOG: bad = carls_log_level_option("trainer", optarg); break;
        case O_HELP:
            s_usage(stdout);
            return 1;
        default:
            s_usage(stderr);
            return -1;
        }
        if (bad) {
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "trainer supervised: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->data) {
        fprintf(stderr, "trainer supervised: --data is required (fashion-mnist)\n");
        return -1;
    }
    if (strcmp(o->data, "fashion-mnist") != 0) {
        fprintf(stderr, "trainer supervised: --data '%s' is not supported (fashion-mnist)\n", o->data);
        return -1;
    }
    if (o->opt.lr < 0.0f) {
        o->opt.lr = o->opt.kind == NN_OPT_ADAM ? 1e-3f : 0.05f;
    }
    return 0;
}

/* Loss and accuracy of the model on a whole image set, in eval mode. */
static void s_evaluate(nn_mlp_t *m, const carls_image_set_t *set, float *xbuf, int32_t *ybuf, uint32_t *idx,
                       double *loss, double *acc)
{
    double loss_sum = 0.0;
    int64_t correct = 0;
    for (int off = 0; off < set->n; off += m->max_batch) {
        int n = set->n - off < m->max_batch ? set->n - off : m->max_batch;
        for (int i = 0; i < n; i++) {
            idx[i] = (uint32_t)(off + i);
        }
        carls_image_set_batch(set, idx, n, xbuf, ybuf);
        nn_mlp_set_batch(m, xbuf, ybuf, n);
        loss_sum += (double)nn_mlp_forward(m, n, false, 0) * n;
        correct += nn_mlp_correct(m, n, NULL);
    }
    *loss = loss_sum / set->n;
    *acc = (double)correct / set->n;
}

static int s_checkpoint(nn_mlp_t *m, const s_opts_t *o, uint64_t step)
{
    carls_ckpt_t *c = NULL;
    char err[1024], path[4096];
    if (nn_mlp_to_ckpt(m, step, &c, err, sizeof err) != 0 ||
        carls_ckpt_save_to_dir(c, o->ckpt_dir, path, sizeof path, err, sizeof err) != 0) {
        LOG_ERROR("checkpoint at step %llu failed: %s", (unsigned long long)step, err);
        carls_ckpt_destroy(&c);
        return -1;
    }
    carls_ckpt_destroy(&c);
    LOG_DEBUG("checkpoint %s", path);
    if (carls_ckpt_prune(o->ckpt_dir, o->keep, err, sizeof err) < 0) {
        LOG_WARN("pruning %s: %s", o->ckpt_dir, err);
    }
    return 0;
}

int trainer_supervised_main(int argc, char **argv)
{
    s_opts_t o;
    int parsed = s_parse(argc, argv, &o);
    if (parsed != 0) {
        return parsed > 0 ? 0 : 2;
    }
    nn_device_t device;
    if (trainer_setup_device(o.device, &device) != 0) {
        return 2;
    }
    int threads = trainer_setup_threads(o.threads);

    int rc = 1;
    carls_fmnist_t ds = {0};
    nn_mlp_t *m = NULL;
    uint32_t *train_idx = NULL, *idx = NULL;
    float *xbuf = NULL;
    int32_t *ybuf = NULL;
    trainer_metrics_t metrics = {0};
    char err[2048];

    int64_t t_load = carls_monotonic_us();
    if (carls_fmnist_load(o.data_dir, &ds, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s\n", err);
        goto cleanup;
    }
    LOG_INFO("Fashion-MNIST: %d train, %d test images of %dx%d (%.2f s to load)", ds.train.n, ds.test.n,
             ds.train.rows, ds.train.cols, (double)(carls_monotonic_us() - t_load) / 1e6);

    /* The labelled examples this run trains on. */
    int n_train = ds.train.n;
    train_idx = carls_xmalloc(sizeof *train_idx * (size_t)ds.train.n);
    if (o.labels_per_class > 0) {
        n_train = o.labels_per_class * CARLS_FMNIST_CLASSES;
        if (carls_label_subset(ds.train.labels, (size_t)ds.train.n, CARLS_FMNIST_CLASSES, o.labels_per_class,
                               (uint64_t)o.label_seed, train_idx, NULL) != 0) {
            fprintf(stderr, "trainer: cannot pick %d labelled images per class\n", o.labels_per_class);
            goto cleanup;
        }
        LOG_INFO("labels: %d per class (label seed %d), %d labelled, %d unlabelled (unused here)",
                 o.labels_per_class, o.label_seed, n_train, ds.train.n - n_train);
    } else {
        carls_iota_u32(train_idx, (size_t)n_train);
    }

    nn_mlp_config_t cfg = {.in_dim = ds.train.dim, .n_hidden = o.n_hidden, .num_classes = CARLS_FMNIST_CLASSES,
                           .dropout = o.dropout};
    memcpy(cfg.hidden, o.hidden, sizeof cfg.hidden);
    int max_batch = o.batch > 500 ? o.batch : 500; /* evaluation runs in chunks of max_batch */
    if (nn_mlp_new(&cfg, device, max_batch, (uint64_t)o.seed, &m, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: model: %s\n", err);
        goto cleanup;
    }
    char arch[256];
    int len = snprintf(arch, sizeof arch, "%d", cfg.in_dim);
    for (int l = 0; l < cfg.n_hidden && len < (int)sizeof arch; l++) {
        len += snprintf(arch + len, sizeof arch - (size_t)len, "-%d", cfg.hidden[l]);
    }
    snprintf(arch + len, sizeof arch - (size_t)len, "-%d", cfg.num_classes);
    LOG_INFO("model: MLP %s, %zu parameters, dropout %.2f, %s lr %g (%s), batch %d, %d epochs", arch,
             m->num_params, (double)cfg.dropout, o.opt.kind == NN_OPT_ADAM ? "adam" : "sgd", (double)o.opt.lr,
             o.cosine ? "cosine" : "constant", o.batch, o.epochs);

    char metrics_path[4096];
    if (o.metrics) {
        snprintf(metrics_path, sizeof metrics_path, "%s", o.metrics);
    } else {
        snprintf(metrics_path, sizeof metrics_path, "%s/metrics.csv", o.ckpt_dir);
    }
    if (carls_mkdir_p(o.ckpt_dir, 0755, NULL, 0) != 0) {
        fprintf(stderr, "trainer: cannot create %s: %s\n", o.ckpt_dir, strerror(errno));
        goto cleanup;
    }
    if (trainer_metrics_open(&metrics, metrics_path,
                             "epoch,step,train_loss,train_accuracy,test_loss,test_accuracy,examples_per_s,"
                             "train_seconds,elapsed_seconds") != 0) {
        fprintf(stderr, "trainer: cannot write metrics to %s\n", metrics_path);
        goto cleanup;
    }

    xbuf = carls_xmalloc(sizeof(float) * (size_t)max_batch * (size_t)ds.train.dim);
    ybuf = carls_xmalloc(sizeof(int32_t) * (size_t)max_batch);
    idx = carls_xmalloc(sizeof(uint32_t) * (size_t)max_batch);
    const int steps_per_epoch = (n_train + o.batch - 1) / o.batch;
    const int64_t total_steps = (int64_t)steps_per_epoch * o.epochs;
    uint64_t shuffle_state = nn_hash_mix((uint64_t)o.seed, 0x73687566ULL); /* "shuf" */
    int64_t step = 0, examples = 0, t_start = carls_monotonic_us(), train_us = 0;
    double test_loss = 0, test_acc = 0;
    nn_optim_config_t opt = o.opt;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        carls_shuffle_u32(train_idx, (size_t)n_train, &shuffle_state);
        trainer_progress_t bar;
        char label[64];
        snprintf(label, sizeof label, "epoch %d/%d", epoch, o.epochs);
        trainer_progress_start(&bar, label, n_train);
        int64_t t_epoch = carls_monotonic_us();
        double loss_sum = 0;
        int64_t correct = 0;
        for (int off = 0; off < n_train; off += o.batch) {
            int n = n_train - off < o.batch ? n_train - off : o.batch;
            carls_image_set_batch(&ds.train, train_idx + off, n, xbuf, ybuf);
            nn_mlp_set_batch(m, xbuf, ybuf, n);
            float loss = nn_mlp_forward(m, n, true, nn_hash_mix((uint64_t)o.seed, (uint64_t)step));
            correct += nn_mlp_correct(m, n, NULL);
            nn_mlp_zero_grad(m);
            nn_mlp_backward(m, n, NULL);
            if (o.cosine) {
                opt.lr = o.opt.lr * 0.5f * (1.0f + cosf((float)M_PI * (float)step / (float)total_steps));
            }
            nn_mlp_step(m, &opt);
            step++;
            loss_sum += (double)loss * n;
            trainer_progress_update(&bar, n, loss);
        }
        m->ops->synchronize();
        train_us += carls_monotonic_us() - t_epoch;
        examples += n_train;
        double train_loss = loss_sum / n_train, train_acc = (double)correct / n_train;
        bool eval = epoch % o.eval_every == 0 || epoch == o.epochs;
        char extra[160] = "";
        if (eval) {
            s_evaluate(m, &ds.test, xbuf, ybuf, idx, &test_loss, &test_acc);
            snprintf(extra, sizeof extra, "train acc %.4f  test loss %.4f  test acc %.4f", train_acc, test_loss,
                     test_acc);
        } else {
            snprintf(extra, sizeof extra, "train acc %.4f", train_acc);
        }
        double rate = trainer_progress_finish(&bar, extra);
        if (eval) {
            double row[9] = {epoch, (double)step, train_loss, train_acc, test_loss, test_acc, rate,
                             (double)train_us / 1e6, (double)(carls_monotonic_us() - t_start) / 1e6};
            trainer_metrics_row(&metrics, row);
            if (s_checkpoint(m, &o, (uint64_t)step) != 0) {
                goto cleanup;
            }
        }
    }
    double train_s = (double)train_us / 1e6;
    double rate = train_s > 0 ? (double)examples / train_s : 0;
    double gflops = rate * nn_mlp_train_flops_per_example(m) / 1e9;
    printf("supervised: %d labelled images, %d epochs, %lld steps, device %s, %d OpenBLAS threads\n", n_train,
           o.epochs, (long long)step, nn_device_name(device), threads);
    printf("training: %.1f s, %.0f examples/s, %.2f GFLOP/s in the layers' GEMMs (%.3f MFLOP per example)\n",
           train_s, rate, gflops, nn_mlp_train_flops_per_example(m) / 1e6);
    printf("checkpoints: %s, metrics: %s\n", o.ckpt_dir, metrics_path);
    printf("test_loss=%.4f\n", test_loss);
    printf("test_accuracy=%.4f\n", test_acc);
    rc = 0;
cleanup:
    trainer_metrics_close(&metrics);
    nn_mlp_destroy(&m);
    carls_fmnist_free(&ds);
    free(train_idx);
    free(idx);
    free(xbuf);
    free(ybuf);
    return rc;
}
