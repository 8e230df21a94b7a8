/* trainer supervised: an MLP encoder + softmax classifier trained on the labelled part of Fashion-MNIST's
 * training set, evaluated on its 10,000 test images. The supervised-only baseline for the semi-supervised
 * experiments: with --labels-per-class N it sees N labelled images per class and ignores the rest.
 *
 * Output: a progress bar on stderr; metrics.csv (one row per evaluation); checkpoints in --ckpt-dir (at each
 * evaluation, the latest pointer updated, the newest --keep kept); a summary on stdout whose last line is
 * test_accuracy=0.XXXX.
 *
 * Each checkpoint also holds what an exact continuation needs (trainer_resume.h): the optimiser's moments and
 * step, the labelled images in their shuffled order, the shuffle's RNG state and the epoch (a checkpoint is
 * written at an epoch's end, so the position is the epoch's start); dropout masks are drawn from (seed, step)
 * and the learning rate is a function of the step. --resume continues from the checkpoint --ckpt-dir/latest
 * names and ends bit for bit where the uninterrupted run ends. This trainer uses no knowledge bank, so there
 * is no bank snapshot to take. */
#include "trainer.h"
#include "trainer_metrics.h"
#include "trainer_resume.h"
#include "trainer_run_args.h"
#include "progress.h"
#include "trainer_util.h"

#include "data_fmnist.h"
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

typedef struct {
    const char *data;              /* only "fashion-mnist" */
    const char *data_dir;          /* NULL: the Debian package's folder */
    int labels_per_class;          /* 0: every training label */
    int label_seed;                /* picks the labelled subset */
    int epochs;                    /* passes over the labelled examples */
    int batch;                     /* examples per step */
    nn_mlp_config_t model;         /* encoder widths (--hidden) and dropout after each hidden ReLU */
    nn_optim_config_t opt;         /* optimiser */
    bool cosine;                   /* cosine learning-rate decay to 0 over the run, else constant */
    int seed;                      /* initialisation, shuffles, dropout */
    const char *ckpt_dir;          /* checkpoints (and metrics.csv unless --metrics) */
    const char *metrics;           /* CSV path, NULL: <ckpt_dir>/metrics.csv */
    const char *device;            /* auto | cpu | cuda */
    int threads;                   /* OpenBLAS threads, 0: TRAINER_DEFAULT_THREADS */
    int eval_every;                /* evaluate (and checkpoint) every this many epochs, and after the last */
    int keep;                      /* checkpoints kept in ckpt_dir */
    bool resume;                   /* continue from ckpt_dir/latest */
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
            "  --conv C:K:P[,..]        convolution blocks before them (images only): C channels, a K x K kernel\n"
            "                           (odd, same padding), P x P max pooling each; default none\n"
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
            "  --resume                 continue from the checkpoint DIR/latest names (written by this trainer with\n"
            "                           the same settings): model, optimiser, the images' order and the shuffle's\n"
            "                           RNG state, from the epoch after it\n"
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
        .model = {.n_hidden = 2, .hidden = {512, 256}, .dropout = 0.2f},
        .ckpt_dir = "runs/supervised",
        .eval_every = 1,
    };
    trainer_mlp_args_t mlp;
    trainer_mlp_args(&mlp, &o->model, &o->opt, &o->cosine, &o->seed);
    carls_fmnist_args_t data; /* --labels-per-class 0: every training image */
    carls_fmnist_args(&data, &o->data, &o->data_dir, &o->labels_per_class, 0, &o->label_seed);
    trainer_run_args_t run;
    trainer_run_args(&run, &o->ckpt_dir, &o->keep, &o->resume, &o->metrics, &o->device, &o->threads);
    const carls_arg_t args[] = {
        carls_arg_group(mlp.rows),
        carls_arg_group(data.rows),
        carls_arg_group(run.rows),
        carls_arg_int("epochs", &o->epochs, 1, 1000000),
        carls_arg_int("batch", &o->batch, 1, 65536),
        carls_arg_float("momentum", &o->opt.momentum, 0.0, 0.999),
        carls_arg_int("eval-every", &o->eval_every, 1, 1000000),
        carls_arg_log_level(),
        {0},
    };
    const int rc = carls_args_parse("trainer supervised", argc, argv, args, s_usage);
    if (rc != 0) {
        return rc;
    }
    if (!o->data) {
        fprintf(stderr, "trainer supervised: --data is required (fashion-mnist)\n");
        return -1;
    }
    if (strcmp(o->data, "fashion-mnist") != 0) {
        fprintf(stderr, "trainer supervised: --data '%s' is not supported (fashion-mnist)\n", o->data);
        return -1;
    }
    trainer_mlp_default_lr(&o->opt);
    return 0;
}

/* A run: data, model, outputs and buffers (s_load, s_setup; freed by s_teardown) and the training counters. */
typedef struct {
    const s_opts_t *o;
    nn_device_t device;
    int threads;                   /* OpenBLAS threads in use */
    carls_fmnist_t ds;
    uint32_t *train_idx;           /* (train n) the labelled images trained on: the first n_train */
    int n_train;
    uint32_t *test_idx;            /* (test n) 0, 1, ... */
    nn_mlp_t *m;
    int max_batch;                 /* training batch or evaluation chunk */
    trainer_metrics_t metrics;
    char metrics_path[4096];
    float *xbuf;                   /* (max_batch, dim) */
    int32_t *ybuf;                 /* (max_batch) */
    nn_optim_config_t opt;         /* o->opt with the scheduled learning rate */
    int64_t step, total_steps, examples, train_us, t_start;
    double test_loss, test_acc;    /* the latest evaluation */
    uint64_t shuffle_state;        /* the RNG of the epochs' shuffles */
    int start_epoch;               /* epochs done before this process: 0, or the resumed checkpoint's */
    carls_ckpt_t *resume;          /* --resume: the checkpoint continued from */
    char resume_path[4200];
} s_run_t;

/* Loads Fashion-MNIST and picks the labelled images this run trains on. */
static int s_load(s_run_t *r)
{
    const s_opts_t *o = r->o;
    char err[2048];
    int64_t t_load = carls_monotonic_us();
    if (carls_fmnist_load(o->data_dir, &r->ds, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s\n", err);
        return -1;
    }
    const carls_fmnist_t *ds = &r->ds;
    LOG_INFO("Fashion-MNIST: %d train, %d test images of %dx%d (%.2f s to load)", ds->train.n, ds->test.n,
             ds->train.rows, ds->train.cols, (double)(carls_monotonic_us() - t_load) / 1e6);
    r->n_train = ds->train.n;
    r->train_idx = carls_xmalloc(sizeof *r->train_idx * (size_t)ds->train.n);
    if (o->labels_per_class > 0) {
        r->n_train = o->labels_per_class * CARLS_FMNIST_CLASSES;
        if (carls_label_subset(ds->train.labels, (size_t)ds->train.n, CARLS_FMNIST_CLASSES, o->labels_per_class,
                               (uint64_t)o->label_seed, r->train_idx, NULL) != 0) {
            fprintf(stderr, "trainer: cannot pick %d labelled images per class\n", o->labels_per_class);
            return -1;
        }
        LOG_INFO("labels: %d per class (label seed %d), %d labelled, %d unlabelled (unused here)",
                 o->labels_per_class, o->label_seed, r->n_train, ds->train.n - r->n_train);
    } else {
        carls_iota_u32(r->train_idx, (size_t)r->n_train);
    }
    r->test_idx = carls_xmalloc(sizeof *r->test_idx * (size_t)ds->test.n);
    carls_iota_u32(r->test_idx, (size_t)ds->test.n);
    return 0;
}

/* The model (logged), the checkpoint directory and metrics.csv, the batch buffers. */
static int s_setup(s_run_t *r)
{
    const s_opts_t *o = r->o;
    r->max_batch = o->batch > 500 ? o->batch : 500; /* evaluation runs in chunks of max_batch */
    if (trainer_fmnist_mlp_new(&o->model, &r->ds.train, r->ds.classes, r->device, r->max_batch, o->seed,
                               &r->m) != 0) {
        return -1;
    }
    const nn_mlp_config_t cfg = r->m->cfg;
    char arch[256];
    int len = snprintf(arch, sizeof arch, "%d", cfg.in_dim);
    for (int l = 0; l < cfg.n_hidden && len < (int)sizeof arch; l++) {
        len += snprintf(arch + len, sizeof arch - (size_t)len, "-%d", cfg.hidden[l]);
    }
    snprintf(arch + len, sizeof arch - (size_t)len, "-%d", cfg.num_classes);
    LOG_INFO("model: MLP %s, %zu parameters, dropout %.2f, %s lr %g (%s), batch %d, %d epochs", arch,
             r->m->num_params, (double)cfg.dropout, o->opt.kind == NN_OPT_ADAM ? "adam" : "sgd", (double)o->opt.lr,
             o->cosine ? "cosine" : "constant", o->batch, o->epochs);
    if (trainer_open_outputs(o->ckpt_dir, o->metrics,
                             "epoch,step,train_loss,train_accuracy,test_loss,test_accuracy,examples_per_s,"
                             "train_seconds,elapsed_seconds",
                             r->metrics_path, sizeof r->metrics_path, o->resume ? r->start_epoch : -1,
                             &r->metrics) != 0) {
        return -1;
    }
    r->xbuf = carls_xmalloc(sizeof(float) * (size_t)r->max_batch * (size_t)r->ds.train.dim);
    r->ybuf = carls_xmalloc(sizeof(int32_t) * (size_t)r->max_batch);
    r->opt = o->opt;
    r->shuffle_state = nn_hash_mix((uint64_t)o->seed, 0x73687566ULL); /* "shuf" */
    r->total_steps = (int64_t)((r->n_train + o->batch - 1) / o->batch) * o->epochs;
    return 0;
}

/* The settings a resumed run must share with the run it continues (train.config): those that decide the
 * images, their order, the model's shapes and the optimiser's schedule. */
static void s_config_text(const s_run_t *r, char *buf, size_t len)
{
    const s_opts_t *o = r->o;
    int n = snprintf(buf, len,
                     "supervised data=%s labels_per_class=%d label_seed=%d images=%d batch=%d epochs=%d seed=%d "
                     "optimizer=%s lr=%.9g momentum=%.9g weight_decay=%.9g schedule=%s dropout=%.9g hidden=",
                     o->data, o->labels_per_class, o->label_seed, r->n_train, o->batch, o->epochs, o->seed,
                     o->opt.kind == NN_OPT_ADAM ? "adam" : "sgd", (double)o->opt.lr, (double)o->opt.momentum,
                     (double)o->opt.weight_decay, o->cosine ? "cosine" : "constant", (double)o->model.dropout);
    for (int l = 0; l < o->model.n_hidden && n > 0 && (size_t)n < len; l++) {
        n += snprintf(buf + n, len - (size_t)n, "%s%d", l ? "," : "", o->model.hidden[l]);
    }
    if (o->model.n_conv > 0 && n > 0 && (size_t)n < len) { /* only then, so older runs' train.config still match */
        char conv[128];
        trainer_conv_text(&o->model, conv, sizeof conv);
        snprintf(buf + n, len - (size_t)n, " conv=%s", conv);
    }
}

/* The checkpoint after `epoch` epochs: the model and what continuing needs. Returns 0, or -1 (logged). */
static int s_checkpoint(s_run_t *r, int epoch)
{
    char err[1024] = "", config[1024];
    s_config_text(r, config, sizeof config);
    carls_ckpt_t *c = NULL;
    int rc = nn_mlp_to_ckpt(r->m, (uint64_t)r->step, &c, err, sizeof err);
    if (rc == 0 && (carls_ckpt_add_text(c, TRAINER_CKPT_CONFIG, config) != 0 ||
                    carls_ckpt_add_u64(c, "data.rng", r->shuffle_state) != 0 ||
                    carls_ckpt_add_u64(c, "data.epoch", (uint64_t)epoch) != 0)) {
        rc = carls_errorf(err, sizeof err, -1, "cannot add the trainer's state");
    }
    rc = rc ? rc : trainer_mlp_save_opt(r->m, c, err, sizeof err);
    rc = rc ? rc : trainer_ckpt_add_u32s(c, "data.order", r->train_idx, (size_t)r->n_train, err, sizeof err);
    if (rc != 0) {
        LOG_ERROR("checkpoint at step %lld failed: %s", (long long)r->step, err);
    } else {
        rc = trainer_ckpt_save(c, r->o->ckpt_dir, r->o->keep);
    }
    carls_ckpt_destroy(&c);
    return rc;
}

/* --resume, once the images are picked: reads the checkpoint --ckpt-dir/latest names, checks that it is this
 * run's and sets r->start_epoch. Returns 0, or -1 after printing why. */
static int s_resume_open(s_run_t *r)
{
    char config[1024], err[512];
    s_config_text(r, config, sizeof config);
    if (trainer_resume_open(r->o->ckpt_dir, NN_MLP_KIND_CLASSIFIER, config, &r->resume, r->resume_path,
                            sizeof r->resume_path) != 0) {
        return -1;
    }
    uint64_t epoch = 0;
    const int64_t per_epoch = (r->n_train + r->o->batch - 1) / r->o->batch;
    if (carls_ckpt_get_u64(r->resume, "data.epoch", &epoch, err, sizeof err) != 0 || epoch > (uint64_t)r->o->epochs ||
        carls_ckpt_step(r->resume) != epoch * (uint64_t)per_epoch) {
        fprintf(stderr, "trainer: --resume: %s: no usable epoch (blob data.epoch) for step %llu of this run's %d "
                        "epochs\n", r->resume_path, (unsigned long long)carls_ckpt_step(r->resume), r->o->epochs);
        return -1;
    }
    r->start_epoch = (int)epoch;
    return 0;
}

/* --resume, once the model exists: the model and optimiser, the images' order and the shuffle's RNG state.
 * Returns 0, or -1 after printing why. */
static int s_resume_apply(s_run_t *r)
{
    const carls_ckpt_t *c = r->resume;
    char err[1024] = "";
    int rc = trainer_mlp_load_state(r->m, c, err, sizeof err);
    rc = rc ? rc : carls_ckpt_get_u64(c, "data.rng", &r->shuffle_state, err, sizeof err) ? -1 : 0;
    rc = rc ? rc : trainer_ckpt_get_u32s(c, "data.order", r->train_idx, (size_t)r->n_train, err, sizeof err);
    for (int i = 0; rc == 0 && i < r->n_train; i++) {
        if (r->train_idx[i] >= (uint32_t)r->ds.train.n) {
            rc = carls_errorf(err, sizeof err, -1, "data.order[%d] = %u is not a training image", i, r->train_idx[i]);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "trainer: --resume: %s: %s\n", r->resume_path, err);
        return -1;
    }
    r->step = (int64_t)carls_ckpt_step(c);
    LOG_INFO("resumed from step %lld, epoch %d (checkpoint %s)", (long long)r->step, r->start_epoch, r->resume_path);
    return 0;
}

static void s_teardown(s_run_t *r)
{
    trainer_metrics_close(&r->metrics);
    carls_ckpt_destroy(&r->resume);
    nn_mlp_destroy(&r->m);
    carls_fmnist_free(&r->ds);
    free(r->train_idx);
    free(r->test_idx);
    free(r->xbuf);
    free(r->ybuf);
}

/* One pass over the (already shuffled) labelled images, with a progress bar; returns the mean training loss
 * and accuracy through *loss and *acc. */
static void s_epoch(s_run_t *r, carls_progress_t *bar, double *loss, double *acc)
{
    const s_opts_t *o = r->o;
    nn_mlp_t *m = r->m;
    double loss_sum = 0;
    int64_t correct = 0;
    for (int off = 0; off < r->n_train; off += o->batch) {
        int n = r->n_train - off < o->batch ? r->n_train - off : o->batch;
        carls_image_set_batch(&r->ds.train, r->train_idx + off, n, r->xbuf, r->ybuf);
        nn_mlp_set_batch(m, r->xbuf, r->ybuf, n);
        float step_loss = nn_mlp_forward(m, n, true, nn_hash_mix((uint64_t)o->seed, (uint64_t)r->step));
        correct += nn_mlp_correct(m, n, NULL);
        nn_mlp_zero_grad(m);
        nn_mlp_backward(m, n, NULL);
        if (o->cosine) {
            r->opt.lr = o->opt.lr * 0.5f * (1.0f + cosf((float)M_PI * (float)r->step / (float)r->total_steps));
        }
        nn_mlp_step(m, &r->opt);
        r->step++;
        loss_sum += (double)step_loss * n;
        carls_progress_update(bar, n, step_loss);
    }
    *loss = loss_sum / r->n_train;
    *acc = (double)correct / r->n_train;
}

/* Every epoch; every eval_every epochs and after the last: a test evaluation, a metrics row and a checkpoint.
 * Returns 0, or -1 when a checkpoint failed. */
static int s_train(s_run_t *r)
{
    const s_opts_t *o = r->o;
    const int steps_per_epoch = (r->n_train + o->batch - 1) / o->batch;
    r->t_start = carls_monotonic_us();
    for (int epoch = r->start_epoch + 1; epoch <= o->epochs; epoch++) {
        carls_shuffle_u32(r->train_idx, (size_t)r->n_train, &r->shuffle_state);
        carls_progress_t bar;
        char label[64];
        snprintf(label, sizeof label, "epoch %d/%d", epoch, o->epochs);
        carls_progress_start(&bar, label, r->n_train);
        int64_t t_epoch = carls_monotonic_us();
        double train_loss, train_acc;
        s_epoch(r, &bar, &train_loss, &train_acc);
        r->m->ops->synchronize();
        r->train_us += carls_monotonic_us() - t_epoch;
        r->examples += r->n_train;
        bool eval = epoch % o->eval_every == 0 || epoch == o->epochs;
        char extra[160] = "";
        if (eval) {
            trainer_mlp_evaluate(r->m, &r->ds.test, r->test_idx, r->ds.test.n, r->xbuf, r->ybuf, &r->test_loss,
                                 &r->test_acc);
            snprintf(extra, sizeof extra, "train acc %.4f  test loss %.4f  test acc %.4f", train_acc, r->test_loss,
                     r->test_acc);
        } else {
            snprintf(extra, sizeof extra, "train acc %.4f", train_acc);
        }
        double rate = carls_progress_finish(&bar, extra);
        carls_prom_progress_add(trainer_prom, (uint64_t)steps_per_epoch, (uint64_t)r->n_train,
                                (double)(carls_monotonic_us() - t_epoch) / 1e6, 0);
        carls_prom_progress_set_step(trainer_prom, r->step, r->total_steps);
        if (eval)
            carls_prom_progress_set_eval(trainer_prom, r->test_loss, r->test_acc);
        if (eval) {
            double row[9] = {epoch, (double)r->step, train_loss, train_acc, r->test_loss, r->test_acc, rate,
                             (double)r->train_us / 1e6, (double)(carls_monotonic_us() - r->t_start) / 1e6};
            trainer_metrics_row(&r->metrics, row);
            if (s_checkpoint(r, epoch) != 0) {
                return -1;
            }
        }
    }
    if (r->start_epoch >= o->epochs) { /* resumed after the last epoch: only the evaluation is left */
        trainer_mlp_evaluate(r->m, &r->ds.test, r->test_idx, r->ds.test.n, r->xbuf, r->ybuf, &r->test_loss,
                             &r->test_acc);
    }
    return 0;
}

/* The summary on stdout; its last line is test_accuracy=X. */
static void s_print_summary(const s_run_t *r)
{
    const s_opts_t *o = r->o;
    double train_s = (double)r->train_us / 1e6;
    double rate = train_s > 0 ? (double)r->examples / train_s : 0;
    double gflops = rate * nn_mlp_train_flops_per_example(r->m) / 1e9;
    printf("supervised: %d labelled images, %d epochs, %lld steps, device %s, %d OpenBLAS threads\n", r->n_train,
           o->epochs, (long long)r->step, nn_device_name(r->device), r->threads);
    printf("training: %.1f s, %.0f examples/s, %.2f GFLOP/s in the layers' GEMMs (%.3f MFLOP per example)\n",
           train_s, rate, gflops, nn_mlp_train_flops_per_example(r->m) / 1e6);
    printf("checkpoints: %s, metrics: %s\n", o->ckpt_dir, r->metrics_path);
    if (o->resume) {
        printf("resumed from step %lld (checkpoint %s)\nresumed_from_step=%lld\n", (long long)carls_ckpt_step(r->resume),
               r->resume_path, (long long)carls_ckpt_step(r->resume));
    }
    printf("test_loss=%.4f\n", r->test_loss);
    printf("test_accuracy=%.4f\n", r->test_acc);
}

int trainer_supervised_main(int argc, char **argv)
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
    r.threads = trainer_setup_threads(o.threads);
    int rc = 1;
    if (s_load(&r) == 0 && (!o.resume || s_resume_open(&r) == 0) && s_setup(&r) == 0 &&
        (!o.resume || s_resume_apply(&r) == 0) && s_train(&r) == 0) {
        s_print_summary(&r);
        rc = 0;
    }
    s_teardown(&r);
    return rc;
}
